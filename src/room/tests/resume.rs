//! Held places and resumes, without sockets: the grace on tokio's paused
//! clock.

use super::*;
use crate::room::resume::ResumeToken;

const GRACE: Duration = Duration::from_secs(10);

/// Rooms that hold a dropped member's place for [`GRACE`], at most
/// `max_held` places on the node.
fn holding_rooms(capacity: usize, max_held: usize) -> Arc<Rooms> {
    Rooms::new(
        RoomSettings {
            resume_grace: GRACE,
            max_held,
            ..rooms(capacity, 100).settings.clone()
        },
        Clock::start(),
        Arc::new(Metrics::default()),
    )
}

/// Arrives in `room` as `name` (app user `user`, if any), with `resume`.
async fn arrive(
    rooms: &Arc<Rooms>,
    room: &str,
    name: &str,
    user: Option<&str>,
    resume: Option<ResumeToken>,
) -> (Membership, Arc<Inbox>, pb::Welcome) {
    let inbox = Inbox::new(16);
    let sink: Arc<dyn Sink> = inbox.clone();
    let arrival = Arrival {
        name: name.into(),
        user: user.map(Arc::from),
        resume,
        ..Arrival::default()
    };
    let m = rooms.arrive(room, arrival, sink).await.expect("joins");
    let Some(Body::Welcome(w)) = next(&inbox).await.body else {
        panic!("not a welcome")
    };
    (m, inbox, w)
}

fn token(w: &pb::Welcome) -> ResumeToken {
    ResumeToken::parse(&w.resume_token).expect("a resume token")
}

fn resumed(rooms: &Rooms) -> u64 {
    rooms
        .metrics
        .resumed
        .get_or_create(&crate::metrics::ResumeLabels { node: "same_node" })
        .get()
}

fn refused(rooms: &Rooms, reason: &'static str) -> u64 {
    rooms
        .metrics
        .resume_refused
        .get_or_create(&crate::metrics::AuthLabels { reason })
        .get()
}

#[tokio::test(start_paused = true)]
async fn a_dropped_member_is_held_unseen_and_resumed_with_its_id() {
    let rooms = holding_rooms(10, 100);
    let (_ada, ada, _) = arrive(&rooms, "r", "Ada", None, None).await;
    let (bo, _bo_inbox, w) = arrive(&rooms, "r", "Bo", None, None).await;
    assert_eq!(w.resume_token.len(), 32);
    assert!(!w.resumed);
    assert_eq!(bo.id(), MemberId(1));
    next(&ada).await; // Joined Bo
    bo.submit(at(40)).await;
    rooms.tick(rooms.clock.now_ms()).await;
    next(&ada).await; // Bo's move

    bo.hold(LeaveReason::Disconnected).await;
    assert_eq!(rooms.metrics.resume_held.get(), 1);
    tokio::time::advance(GRACE / 2).await;
    assert!(ada.is_empty(), "nobody sees a held member leave");
    assert_eq!(rooms.list()[0].members, 2, "it keeps its place");

    let (again, again_inbox, w2) = arrive(&rooms, "r", "Bo", None, Some(token(&w))).await;
    assert_eq!(again.id(), MemberId(1));
    assert!(w2.resumed && again.resumed());
    assert_eq!(w2.member_id, 1);
    assert_ne!(w2.resume_token, w.resume_token, "rotated");
    let snapshot = w2.snapshot.expect("snapshot");
    let me = snapshot.members.iter().find(|m| m.id == 1).expect("itself");
    assert_eq!(
        (me.name.as_str(), me.position.map(|p| p.x)),
        ("Bo", Some(40))
    );
    assert_eq!(snapshot.members.len(), 2);
    assert_eq!((resumed(&rooms), rooms.metrics.resume_held.get()), (1, 0));
    assert_eq!(rooms.metrics.members.get(), 2);

    // The place is the new connection's: its moves reach the room, and the
    // grace timer of the old hold ends nothing.
    again.submit(at(90)).await;
    rooms.tick(rooms.clock.now_ms()).await;
    let records = decode_motion(&next(&ada).await.motion).expect("batch").1;
    assert_eq!(
        (records[0].member, records[0].motion),
        (MemberId(1), at(90))
    );
    next(&again_inbox).await; // its own move, as everyone's
    tokio::time::advance(GRACE).await;
    tokio::task::yield_now().await;
    assert!(ada.is_empty());
    assert!(again_inbox.is_empty());
    assert_eq!(rooms.metrics.resume_expired.get(), 0);

    // The spent token joins afresh: a new member, and the room sees it.
    let (fresh, _, w3) = arrive(&rooms, "r", "Bo", None, Some(token(&w))).await;
    assert!(!w3.resumed);
    assert_eq!(fresh.id(), MemberId(2));
    assert_eq!(refused(&rooms, "unknown"), 1);
    match next(&ada).await.body {
        Some(Body::Joined(j)) => assert_eq!(j.member.expect("member").id, 2),
        other => panic!("{other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_held_place_leaves_at_the_end_of_the_grace_with_its_reason() {
    let rooms = holding_rooms(10, 100);
    let (_ada, ada, _) = arrive(&rooms, "r", "Ada", None, None).await;
    let (bo, _, w) = arrive(&rooms, "r", "Bo", None, None).await;
    next(&ada).await; // Joined Bo
    bo.hold(LeaveReason::TimedOut).await;
    tokio::time::advance(GRACE - Duration::from_millis(1)).await;
    tokio::task::yield_now().await;
    assert!(ada.is_empty());
    tokio::time::advance(Duration::from_millis(1)).await;
    match next(&ada).await.body {
        Some(Body::Left(l)) => {
            assert_eq!((l.member_id, l.reason), (1, LeaveReason::TimedOut as i32))
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(rooms.metrics.resume_expired.get(), 1);
    assert_eq!(rooms.metrics.resume_held.get(), 0);
    assert_eq!(rooms.metrics.members.get(), 1);
    // Too late: a fresh join.
    let (late, _, w2) = arrive(&rooms, "r", "Bo", None, Some(token(&w))).await;
    assert!(!w2.resumed);
    assert_eq!(late.id(), MemberId(1), "the freed id, as a new member");
    assert_eq!(refused(&rooms, "unknown"), 1);
}

#[tokio::test(start_paused = true)]
async fn a_resume_takes_the_place_from_a_connection_still_open() {
    let rooms = holding_rooms(10, 100);
    let (_ada, ada, _) = arrive(&rooms, "r", "Ada", None, None).await;
    let (old, old_inbox, w) = arrive(&rooms, "r", "Bo", None, None).await;
    next(&ada).await; // Joined Bo
    let (new, new_inbox, w2) = arrive(&rooms, "r", "Bo", None, Some(token(&w))).await;
    assert!(w2.resumed);
    assert_eq!(new.id(), old.id());
    assert!(old_inbox.superseded.load(Ordering::Relaxed));
    // The old connection can act on nothing, and its leave is no one's.
    old.submit(at(66)).await;
    old.chat("ghost".into()).await;
    old.leave(LeaveReason::Disconnected).await;
    rooms.tick(rooms.clock.now_ms()).await;
    assert!(ada.is_empty());
    assert!(new_inbox.is_empty());
    assert_eq!(rooms.metrics.members.get(), 2);
    new.chat("still here".into()).await;
    match next(&ada).await.body {
        Some(Body::Chat(c)) => assert_eq!((c.member_id, c.text.as_str()), (1, "still here")),
        other => panic!("{other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_token_of_another_user_joins_afresh_and_the_user_replaces_a_held_place() {
    let rooms = holding_rooms(10, 100);
    let (_ada, ada, _) = arrive(&rooms, "r", "Ada", Some("ada"), None).await;
    let (bo, _, w) = arrive(&rooms, "r", "Bo", Some("bo"), None).await;
    next(&ada).await; // Joined Bo
    bo.hold(LeaveReason::Disconnected).await;
    // Carol holds Bo's token: refused, a fresh join of her own.
    let (carol, _, wc) = arrive(&rooms, "r", "Carol", Some("carol"), Some(token(&w))).await;
    assert!(!wc.resumed);
    assert_eq!(carol.id(), MemberId(2));
    assert_eq!(refused(&rooms, "other_user"), 1);
    next(&ada).await; // Joined Carol
    // Bo's token still holds for Bo... but Bo joins afresh (no token) from
    // another device: the held place is replaced, and the room sees it.
    let (_bo2, _, wb) = arrive(&rooms, "r", "Bo", Some("bo"), None).await;
    assert!(!wb.resumed);
    match next(&ada).await.body {
        Some(Body::Left(l)) => {
            assert_eq!((l.member_id, l.reason), (1, LeaveReason::Replaced as i32))
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(next(&ada).await.body, Some(Body::Joined(_))));
    assert_eq!(rooms.metrics.resume_held.get(), 0);
}

#[tokio::test(start_paused = true)]
async fn past_the_nodes_cap_a_drop_leaves_at_once() {
    let rooms = holding_rooms(10, 1);
    let (_ada, ada, _) = arrive(&rooms, "r", "Ada", None, None).await;
    let (bo, _, _) = arrive(&rooms, "r", "Bo", None, None).await;
    let (cy, _, _) = arrive(&rooms, "r", "Cy", None, None).await;
    next(&ada).await;
    next(&ada).await;
    bo.hold(LeaveReason::Disconnected).await;
    cy.hold(LeaveReason::Disconnected).await;
    match next(&ada).await.body {
        Some(Body::Left(l)) => assert_eq!(l.member_id, 2),
        other => panic!("{other:?}"),
    }
    assert_eq!(rooms.metrics.resume_hold_refused.get(), 1);
    assert_eq!(rooms.metrics.resume_held.get(), 1);
}

#[tokio::test(start_paused = true)]
async fn without_a_grace_there_is_no_token_and_a_drop_leaves() {
    let rooms = rooms(10, 100);
    let (_ada, ada) = join(&rooms, "r", "Ada").await;
    let (bo, _, w) = arrive(&rooms, "r", "Bo", None, None).await;
    assert!(w.resume_token.is_empty());
    next(&ada).await; // Welcome
    next(&ada).await; // Joined Bo
    bo.hold(LeaveReason::Disconnected).await;
    match next(&ada).await.body {
        Some(Body::Left(l)) => assert_eq!(l.member_id, 1),
        other => panic!("{other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_held_member_keeps_its_room_open() {
    let rooms = holding_rooms(10, 100);
    let (bo, _, w) = arrive(&rooms, "r", "Bo", None, None).await;
    bo.hold(LeaveReason::Disconnected).await;
    assert_eq!(rooms.list().len(), 1);
    let (again, _, w2) = arrive(&rooms, "r", "Bo", None, Some(token(&w))).await;
    assert!(w2.resumed);
    again.hold(LeaveReason::Disconnected).await;
    tokio::time::advance(GRACE).await;
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert!(rooms.list().is_empty());
    assert_eq!(rooms.metrics.rooms.get(), 0);
    assert_eq!(rooms.metrics.members.get(), 0);
}
