//! A spatial room across nodes: another node's members are placed in the
//! room's cells like local ones, so this node's members hear only of those
//! in their view: joins, chat, data, leaves and moves (with Appeared and
//! Disappeared as they walk in and out).

use super::*;
use crate::protocol::LeaveReason;
use crate::room::Arrival;
use crate::room::spatial::SpatialSettings;

/// Node `name` whose `plaza*` rooms are 500 m square with a 15 m radius.
fn node(name: &str, slot: u32) -> Node {
    let spatial = SpatialSettings {
        patterns: vec!["plaza*".into()],
        world: Position {
            x: 50_000,
            y: 50_000,
        },
        capacity: 100,
        radius_cm: 1_500,
        limits: pb::Limits::default(),
    };
    Node::build(
        Cluster::test_settings(name, slot),
        Duration::ZERO,
        Some(spatial),
    )
}

fn at(id: u32, name: &str, x: u32, y: u32) -> RemoteMember {
    RemoteMember {
        motion: Motion::standing(Position { x, y }),
        ..member(id, name, x)
    }
}

async fn stand(node: &Node, name: &str, x: u32, y: u32) -> (Membership, Arc<Frames>) {
    let frames = Arc::new(Frames::default());
    let arrival = Arrival {
        name: name.into(),
        start: Some(Position { x, y }),
        ..Arrival::default()
    };
    let m = node
        .rooms
        .arrive("plaza", arrival, frames.clone())
        .await
        .expect("joins");
    (m, frames)
}

fn names_joined(bodies: &[Body]) -> Vec<String> {
    bodies
        .iter()
        .filter_map(|b| match b {
            Body::Joined(j) => j.member.as_ref().map(|m| m.name.clone()),
            Body::Appeared(a) => Some(format!("appeared {}", a.members.len())),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn another_nodes_members_are_heard_of_only_within_view() {
    let node = node("n1", 1);
    let (_ada, ada) = stand(&node, "Ada", 10_000, 10_000).await;
    let welcome = bodies(ada.take());
    assert!(matches!(&welcome[..], [Body::Welcome(_)]), "{welcome:?}");
    let n2 = origin("n2", 7, 2);
    // Cy stands beside Ada, Dee far away.
    node.apply(
        "plaza",
        full(
            &n2,
            1,
            vec![at(2, "Cy", 10_500, 10_000), at(18, "Dee", 40_000, 40_000)],
        ),
    );
    assert_eq!(names_joined(&bodies(ada.take())), ["Cy"]);
    // Dee's chat and data do not reach Ada; Cy's do.
    let chat = |id: u32, text: &str| Op::Chat {
        id: MemberId(id),
        text: text.into(),
        server_time_ms: 1,
    };
    node.apply(
        "plaza",
        update(&n2, 2, vec![chat(18, "far"), chat(2, "near")]),
    );
    let seen = bodies(ada.take());
    assert!(
        matches!(&seen[..], [Body::Chat(c)] if c.text == "near"),
        "{seen:?}"
    );
    // Dee walks up to Ada: at the tick she appears, with her name.
    node.apply(
        "plaza",
        Update {
            tick_ms: 1_000,
            motion: vec![MotionRecord {
                member: MemberId(18),
                motion: Motion::standing(Position {
                    x: 10_200,
                    y: 10_300,
                }),
            }],
            ..update(&n2, 3, Vec::new())
        },
    );
    node.rooms.tick(1_000).await;
    let seen = bodies(ada.take());
    let appeared: Vec<&pb::Member> = seen
        .iter()
        .filter_map(|b| match b {
            Body::Appeared(a) => Some(&a.members),
            _ => None,
        })
        .flatten()
        .collect();
    assert_eq!(appeared.len(), 1, "{seen:?}");
    assert_eq!(appeared[0].name, "Dee");
    assert_eq!(
        appeared[0].position,
        Some(pb::Position {
            x: 10_200,
            y: 10_300
        })
    );
    // Now in view: her leave reaches Ada.
    node.apply(
        "plaza",
        update(
            &n2,
            4,
            vec![Op::Left {
                id: MemberId(18),
                reason: LeaveReason::Left,
                handed_over: false,
            }],
        ),
    );
    let seen = bodies(ada.take());
    assert!(
        seen.iter()
            .any(|b| matches!(b, Body::Left(l) if l.member_id == 18)),
        "{seen:?}"
    );
    assert_eq!(node.names("plaza"), ["Ada", "Cy"]);
}

#[tokio::test]
async fn a_far_remote_members_leave_and_moves_are_not_heard() {
    let node = node("n1", 1);
    let (_ada, ada) = stand(&node, "Ada", 10_000, 10_000).await;
    ada.take();
    let n2 = origin("n2", 7, 2);
    node.apply("plaza", full(&n2, 1, vec![at(18, "Dee", 40_000, 40_000)]));
    node.apply(
        "plaza",
        Update {
            tick_ms: 1_000,
            motion: vec![MotionRecord {
                member: MemberId(18),
                motion: Motion::standing(Position {
                    x: 41_000,
                    y: 40_000,
                }),
            }],
            ..update(&n2, 2, Vec::new())
        },
    );
    node.rooms.tick(1_000).await;
    node.apply(
        "plaza",
        update(
            &n2,
            3,
            vec![Op::Left {
                id: MemberId(18),
                reason: LeaveReason::Left,
                handed_over: false,
            }],
        ),
    );
    let seen: Vec<Body> = bodies(ada.take())
        .into_iter()
        .filter(|b| !matches!(b, Body::Population(_)))
        .collect();
    assert!(
        seen.is_empty(),
        "Ada heard of someone out of view: {seen:?}"
    );
}
