//! One avatar per session and per user across nodes (`takeover.rs`): two or
//! three nodes whose updates the test carries from one to the others, as
//! NATS would, in the orders NATS may deliver them.

use super::*;
use crate::protocol::LeaveReason;
use crate::room::Arrival;
use crate::room::resume::ResumeToken;

const GRACE: Duration = Duration::from_secs(10);

fn node(name: &str, slot: u32) -> Node {
    Node::holding(Cluster::test_settings(name, slot), GRACE)
}

/// `name` of app user `user` joins `lobby` on `node`, with `resume` if any.
async fn arrive(
    node: &Node,
    name: &str,
    user: &str,
    resume: Option<ResumeToken>,
) -> (Membership, Arc<Frames>) {
    let frames = Arc::new(Frames::default());
    let arrival = Arrival {
        name: name.into(),
        user: Some(Arc::from(user)),
        resume,
        ..Arrival::default()
    };
    let m = node
        .rooms
        .arrive("lobby", arrival, frames.clone())
        .await
        .expect("joins");
    (m, frames)
}

fn welcome(frames: &Frames) -> pb::Welcome {
    bodies(frames.take())
        .into_iter()
        .find_map(|b| match b {
            Body::Welcome(w) => Some(w),
            _ => None,
        })
        .expect("a Welcome")
}

/// Everything `from` published so far, decoded as its peers decode it.
fn updates(from: &mut Node) -> Vec<Update> {
    from.sent().into_iter().map(|(_, u)| u).collect()
}

fn deliver(to: &Node, updates: &[Update]) {
    for u in updates {
        to.apply("lobby", u.clone());
    }
}

fn renumbered(old: MemberId, new: MemberId) -> Body {
    Body::Renumbered(pb::Renumbered {
        old_id: old.0,
        new_id: new.0,
    })
}

fn left(id: MemberId, reason: LeaveReason) -> Body {
    Body::Left(pb::Left {
        member_id: id.0,
        reason: reason as i32,
    })
}

fn joined_id(body: &Body) -> Option<u32> {
    match body {
        Body::Joined(j) => j.member.as_ref().map(|m| m.id),
        _ => None,
    }
}

/// Two nodes with a watcher each, who know each other's watcher.
async fn pair() -> (Node, Node, Membership, Arc<Frames>, Membership, Arc<Frames>) {
    let mut a = node("n1", 1);
    let mut b = node("n2", 2);
    let (wa, wa_frames) = a.join("lobby", "Wa").await;
    let (wb, wb_frames) = b.join("lobby", "Wb").await;
    let from_a = updates(&mut a);
    let from_b = updates(&mut b);
    deliver(&b, &from_a);
    deliver(&a, &from_b);
    wa_frames.take();
    wb_frames.take();
    (a, b, wa, wa_frames, wb, wb_frames)
}

#[tokio::test(start_paused = true)]
async fn a_session_that_resumes_through_another_node_is_renumbered_for_everyone() {
    let (mut a, mut b, _wa, wa, _wb, wb) = pair().await;
    let (ada, ada_frames) = arrive(&a, "Ada", "u-ada", None).await;
    let token = ResumeToken::parse(&welcome(&ada_frames).resume_token).expect("a token");
    let old = ada.id();
    deliver(&b, &updates(&mut a));
    wa.take();
    wb.take();
    // Ada's connection to n1 drops: n1 holds her place.
    ada.hold(LeaveReason::Disconnected).await;
    assert_eq!(a.metrics().resume_held.get(), 1);
    // She comes back through n2 with her token.
    let (_ada2, ada2_frames) = arrive(&b, "Ada", "u-ada", Some(token)).await;
    let w = welcome(&ada2_frames);
    assert!(w.resumed);
    let new = MemberId(w.member_id);
    assert_eq!(new.0 % 16, 2, "an id of n2's slot");
    let snapshot = w.snapshot.expect("a snapshot");
    let mut seen: Vec<(String, u32)> = snapshot
        .members
        .iter()
        .map(|m| (m.name.clone(), m.id))
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        [("Ada".into(), new.0), ("Wa".into(), 1), ("Wb".into(), 2)],
        "Ada once, under her new id"
    );
    assert_eq!(bodies(wb.take()), [renumbered(old, new)]);
    // n1 hears n2's Joined: its member goes quietly, its others see one
    // Renumbered, and it tells the others it handed her over.
    deliver(&a, &updates(&mut b));
    assert_eq!(bodies(wa.take()), [renumbered(old, new)]);
    assert_eq!(a.metrics().resume_held.get(), 0);
    assert_eq!(a.names("lobby"), ["Ada", "Wa", "Wb"]);
    let handed = updates(&mut a);
    assert!(
        handed.iter().any(|u| u.ops.iter().any(|op| matches!(
            op,
            Op::Left { id, handed_over: true, .. } if *id == old
        ))),
        "{handed:?}"
    );
    deliver(&b, &handed);
    assert!(bodies(wb.take()).is_empty(), "n2 knew already");
    assert_eq!(b.names("lobby"), ["Ada", "Wa", "Wb"]);
}

#[tokio::test(start_paused = true)]
async fn a_node_that_hears_the_handover_before_the_new_join_still_shows_one_renumbered() {
    let (mut a, mut b, _wa, _wa_frames, _wb, _wb_frames) = pair().await;
    let mut c = node("n3", 3);
    let (_wc, wc) = c.join("lobby", "Wc").await;
    let (ada, ada_frames) = arrive(&a, "Ada", "u-ada", None).await;
    let token = ResumeToken::parse(&welcome(&ada_frames).resume_token).expect("a token");
    let old = ada.id();
    let from_a = updates(&mut a);
    deliver(&b, &from_a);
    // n3 opened the room after the others: it learns their parts in full.
    drop(updates(&mut c));
    c.apply("lobby", full_of(&a, 1));
    c.apply("lobby", full_of(&b, 1));
    wc.take();
    ada.hold(LeaveReason::Disconnected).await;
    let (_ada2, ada2_frames) = arrive(&b, "Ada", "u-ada", Some(token)).await;
    let new = MemberId(welcome(&ada2_frames).member_id);
    let from_b = updates(&mut b);
    deliver(&a, &from_b);
    // n1's handed-over Left reaches n3 first: Ada stays in sight.
    deliver(&c, &updates(&mut a));
    assert!(bodies(wc.take()).is_empty());
    assert_eq!(c.names("lobby"), ["Ada", "Wa", "Wb", "Wc"]);
    // Then n2's Joined: one Renumbered.
    deliver(&c, &from_b);
    assert_eq!(bodies(wc.take()), [renumbered(old, new)]);
    assert_eq!(c.names("lobby"), ["Ada", "Wa", "Wb", "Wc"]);
}

/// `node`'s part of `lobby` as the full state it would send, sequence `seq`.
fn full_of(node: &Node, seq: u64) -> Update {
    let cluster = node.rooms.cluster().expect("clustered");
    let me = cluster.me().clone();
    let handle = node.rooms.map.get("lobby").map(|r| Arc::clone(r.value()));
    let handle = handle.expect("open");
    let st = handle.state();
    let members = st
        .members
        .iter()
        .filter(|(_, m)| m.origin.is_none())
        .map(|(id, m)| RemoteMember {
            seat: crate::room::wire_seat(m.seat),
            user: None,
            sub: m.user.clone(),
            resume_hash: st.places.token_of(*id).map(|t| t.hash()),
            ..member(id.0, &m.name, m.motion.position.x)
        })
        .collect();
    let incarnation = st.remote.as_deref().map_or(1, |r| r.incarnation);
    Update {
        origin: RoomOrigin {
            origin: me,
            incarnation,
        },
        ..full(&origin("unused", 0, 0), seq, members)
    }
}

#[tokio::test(start_paused = true)]
async fn a_handover_nobody_takes_leaves_after_five_seconds() {
    let node = Node::new("n1", 1);
    let (_ada, frames) = node.join("lobby", "Ada").await;
    let room = node.rooms.handle("lobby");
    let n2 = origin("n2", 7, 2);
    node.apply("lobby", full(&n2, 1, vec![member(2, "Cy", 40)]));
    frames.take();
    node.apply(
        "lobby",
        update(
            &n2,
            2,
            vec![Op::Left {
                id: MemberId(2),
                reason: LeaveReason::Disconnected,
                handed_over: true,
            }],
        ),
    );
    assert!(bodies(frames.take()).is_empty());
    tokio::time::advance(Duration::from_millis(4_900)).await;
    node.rooms.sweep(&room);
    assert!(bodies(frames.take()).is_empty(), "still in sight");
    assert_eq!(node.names("lobby"), ["Ada", "Cy"]);
    tokio::time::advance(Duration::from_millis(200)).await;
    node.rooms.sweep(&room);
    assert_eq!(
        bodies(frames.take()),
        [left(MemberId(2), LeaveReason::Disconnected)]
    );
    assert_eq!(node.names("lobby"), ["Ada"]);
}

#[tokio::test(start_paused = true)]
async fn a_token_of_another_user_takes_no_place_on_another_node() {
    let (mut a, b, _wa, _wa_frames, _wb, _wb_frames) = pair().await;
    let (ada, ada_frames) = arrive(&a, "Ada", "u-ada", None).await;
    let token = ResumeToken::parse(&welcome(&ada_frames).resume_token).expect("a token");
    deliver(&b, &updates(&mut a));
    ada.hold(LeaveReason::Disconnected).await;
    let (_eve, eve_frames) = arrive(&b, "Eve", "u-eve", Some(token)).await;
    let w = welcome(&eve_frames);
    assert!(!w.resumed, "joined afresh");
    assert_eq!(b.names("lobby"), ["Ada", "Eve", "Wa", "Wb"]);
}

#[tokio::test(start_paused = true)]
async fn the_same_user_joining_on_another_node_replaces_the_first_everywhere() {
    let (mut a, mut b, _wa, wa, _wb, wb) = pair().await;
    let (ada, ada_frames) = arrive(&a, "Ada", "u-ada", None).await;
    let old = ada.id();
    deliver(&b, &updates(&mut a));
    wa.take();
    wb.take();
    ada_frames.take();
    let (ada2, _) = arrive(&b, "Ada", "u-ada", None).await;
    let new = ada2.id();
    let seen = bodies(wb.take());
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(seen[0], left(old, LeaveReason::Replaced));
    assert_eq!(joined_id(&seen[1]), Some(new.0));
    // n1 closes the older connection, and its others see the same.
    deliver(&a, &updates(&mut b));
    assert_eq!(ada_frames.ends(), ["replaced"]);
    let seen = bodies(wa.take());
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(seen[0], left(old, LeaveReason::Replaced));
    assert_eq!(joined_id(&seen[1]), Some(new.0));
    assert_eq!(a.names("lobby"), ["Ada", "Wa", "Wb"]);
    // n1's own Left for it changes nothing on n2.
    deliver(&b, &updates(&mut a));
    assert!(bodies(wb.take()).is_empty());
    assert_eq!(b.names("lobby"), ["Ada", "Wa", "Wb"]);
}

#[tokio::test(start_paused = true)]
async fn two_joins_of_one_user_at_once_keep_the_member_of_the_greater_node_name() {
    let (mut a, mut b, _wa, wa, _wb, wb) = pair().await;
    // Neither node has heard of the other's join.
    let (ada1, ada1_frames) = arrive(&a, "Ada", "u-ada", None).await;
    let (ada2, ada2_frames) = arrive(&b, "Ada", "u-ada", None).await;
    let from_a = updates(&mut a);
    let from_b = updates(&mut b);
    deliver(&b, &from_a);
    deliver(&a, &from_b);
    // n1 gives way to n2 ("n2" > "n1"); n2 keeps its own.
    assert_eq!(ada1_frames.ends(), ["replaced"]);
    assert!(ada2_frames.ends().is_empty());
    deliver(&b, &updates(&mut a));
    assert_eq!(a.names("lobby"), ["Ada", "Wa", "Wb"]);
    assert_eq!(b.names("lobby"), ["Ada", "Wa", "Wb"]);
    let on_a = bodies(wa.take());
    assert!(
        on_a.contains(&left(ada1.id(), LeaveReason::Replaced)),
        "{on_a:?}"
    );
    let on_b = bodies(wb.take());
    assert!(
        on_b.contains(&left(ada1.id(), LeaveReason::Replaced)),
        "{on_b:?}"
    );
    assert!(
        on_b.iter()
            .all(|b| *b != left(ada2.id(), LeaveReason::Replaced))
    );
}
