use super::*;
use crate::protocol::{decode_motion, pb::ServerMessage};
use prost::Message as _;

fn rooms(capacity: usize, tick_ms: u64) -> Arc<Rooms> {
    Rooms::new(
        RoomSettings {
            tick: Duration::from_millis(tick_ms),
            motion_time_unit_ms: 100,
            capacity,
            buffer: 16,
            spawn: Position { x: 10, y: 10 },
            world: Position { x: 5_000, y: 5_000 },
            limits: pb::Limits::default(),
        },
        Clock::start(),
        Arc::new(Metrics::default()),
    )
}

fn decode(frame: &Frame) -> ServerMessage {
    ServerMessage::decode(frame.clone()).expect("valid frame")
}

async fn next(m: &mut Membership) -> ServerMessage {
    match tokio::time::timeout(Duration::from_secs(1), m.recv()).await {
        Ok(Delivery::Frame(f)) => decode(&f),
        other => panic!("expected a frame, got {other:?}"),
    }
}

fn at(x: u32) -> Motion {
    Motion::standing(Position { x, y: 0 })
}

#[tokio::test]
async fn join_welcomes_with_a_snapshot_and_tells_the_others() {
    let rooms = rooms(10, 100);
    let mut ada = rooms.join("lobby", "Ada".into()).expect("joins");
    let welcome = decode(&ada.take_welcome().expect("welcome"));
    let Some(Body::Welcome(w)) = welcome.body else {
        panic!("not a welcome")
    };
    assert_eq!((w.member_id, w.room.as_str()), (0, "lobby"));
    assert_eq!(w.snapshot.expect("snapshot").members.len(), 1);

    let mut bo = rooms.join("lobby", "Bo".into()).expect("joins");
    assert_eq!(bo.id(), MemberId(1));
    let Some(Body::Welcome(w)) = decode(&bo.take_welcome().expect("welcome")).body else {
        panic!("not a welcome")
    };
    let names: Vec<_> = w
        .snapshot
        .expect("snapshot")
        .members
        .into_iter()
        .map(|m| m.name)
        .collect();
    assert_eq!(names, ["Ada", "Bo"]);
    match next(&mut ada).await.body {
        Some(Body::Joined(j)) => assert_eq!(j.member.expect("member").name, "Bo"),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        rooms.list(),
        [RoomInfo {
            name: "lobby".into(),
            members: 2
        }]
    );

    bo.leave(LeaveReason::Left);
    match next(&mut ada).await.body {
        Some(Body::Left(l)) => assert_eq!((l.member_id, l.reason), (1, LeaveReason::Left as i32)),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn ids_are_reused_and_empty_rooms_disappear() {
    let rooms = rooms(10, 100);
    let a = rooms.join("r", "a".into()).expect("joins");
    let b = rooms.join("r", "b".into()).expect("joins");
    drop(a);
    let c = rooms.join("r", "c".into()).expect("joins");
    assert_eq!(c.id(), MemberId(0));
    drop((b, c));
    assert!(rooms.list().is_empty());
    assert_eq!(rooms.metrics.rooms.get(), 0);
    assert_eq!(rooms.metrics.members.get(), 0);
}

#[tokio::test]
async fn a_full_room_refuses() {
    let rooms = rooms(2, 100);
    let _a = rooms.join("r", "a".into()).expect("joins");
    let _b = rooms.join("r", "b".into()).expect("joins");
    assert_eq!(
        rooms.join("r", "c".into()).err(),
        Some(JoinError::RoomFull {
            room: "r".into(),
            capacity: 2
        })
    );
    assert!(rooms.join("other", "c".into()).is_ok());
}

#[tokio::test]
async fn one_batch_per_tick_with_the_newest_move_of_each_member() {
    let rooms = rooms(10, 100);
    let mut watcher = rooms.join("r", "w".into()).expect("joins");
    let a = rooms.join("r", "a".into()).expect("joins");
    let b = rooms.join("r", "b".into()).expect("joins");
    next(&mut watcher).await; // Joined a
    next(&mut watcher).await; // Joined b
    a.submit(at(1));
    b.submit(at(2));
    a.submit(at(3));
    rooms.flush_all(1_000_000);
    let batch = next(&mut watcher).await;
    let (time, records) = decode_motion(&batch.motion).expect("batch");
    assert_eq!(time, (1_000_000 / 100 % 128) as u32);
    assert_eq!(
        records,
        [
            MotionRecord {
                member: a.id(),
                motion: at(3)
            },
            MotionRecord {
                member: b.id(),
                motion: at(2)
            },
        ]
    );
    assert_eq!(rooms.metrics.moves_coalesced.get(), 1);
    assert_eq!(rooms.metrics.moves_applied.get(), 2);
    // Nothing pending: no frame on the next tick.
    rooms.flush_all(1_000_100);
    assert!(
        tokio::time::timeout(Duration::from_millis(20), watcher.recv())
            .await
            .is_err()
    );
}

#[tokio::test]
async fn a_zero_tick_sends_each_move_at_once() {
    let rooms = rooms(10, 0);
    let mut watcher = rooms.join("r", "w".into()).expect("joins");
    let a = rooms.join("r", "a".into()).expect("joins");
    next(&mut watcher).await;
    a.submit(at(7));
    let (_, records) = decode_motion(&next(&mut watcher).await.motion).expect("batch");
    assert_eq!(
        records,
        [MotionRecord {
            member: a.id(),
            motion: at(7)
        }]
    );
}

#[tokio::test]
async fn a_lagging_member_resyncs_from_a_fresh_snapshot() {
    let rooms = rooms(10, 100);
    let mut slow = rooms.join("r", "slow".into()).expect("joins");
    let a = rooms.join("r", "a".into()).expect("joins");
    for i in 0..40 {
        a.submit(at(i));
        rooms.flush_all(1_000 + u64::from(i) * 100);
    }
    assert!(matches!(slow.recv().await, Delivery::Lagged(_)));
    let Some(Body::Resync(s)) = decode(&slow.resync()).body else {
        panic!("not a resync")
    };
    let a_now = s
        .members
        .iter()
        .find(|m| m.id == a.id().0)
        .expect("a in snapshot");
    assert_eq!(a_now.position, Some(pb::Position { x: 39, y: 0 }));
    // The new subscription starts after the snapshot.
    a.submit(at(99));
    rooms.flush_all(10_000);
    let (_, records) = decode_motion(&next(&mut slow).await.motion).expect("batch");
    assert_eq!(records[0].motion, at(99));
}

#[tokio::test(start_paused = true)]
async fn the_ticker_flushes_on_the_tick_grid() {
    let rooms = rooms(10, 100);
    let token = CancellationToken::new();
    let ticker = tokio::spawn(Arc::clone(&rooms).run_ticker(token.clone()));
    let mut watcher = rooms.join("r", "w".into()).expect("joins");
    let a = rooms.join("r", "a".into()).expect("joins");
    next(&mut watcher).await;
    a.submit(at(5));
    let batch = next(&mut watcher).await;
    let (time, _) = decode_motion(&batch.motion).expect("batch");
    let now = rooms.clock.now_ms();
    assert_eq!(now % 100, 0, "flushed on the grid");
    assert_eq!(time, (now / 100 % 128) as u32);
    token.cancel();
    ticker.await.expect("ticker ends");
}

#[test]
fn spawn_points_are_spread_and_inside_the_world() {
    let settings = RoomSettings {
        tick: Duration::from_millis(100),
        motion_time_unit_ms: 100,
        capacity: 500,
        buffer: 16,
        spawn: Position { x: 2_500, y: 2_500 },
        world: Position { x: 5_000, y: 5_000 },
        limits: pb::Limits::default(),
    };
    let points: Vec<_> = (0..500)
        .map(|i| spawn_point(&settings, MemberId(i)))
        .collect();
    assert_eq!(points[0], Position { x: 2_500, y: 2_500 });
    for (i, p) in points.iter().enumerate() {
        assert!(p.x <= 5_000 && p.y <= 5_000);
        for q in &points[..i] {
            let d = (f64::from(p.x) - f64::from(q.x)).hypot(f64::from(p.y) - f64::from(q.y));
            assert!(d > 30.0, "members {i} and another {d} cm apart");
        }
    }
}
