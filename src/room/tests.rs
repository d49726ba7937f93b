use std::collections::VecDeque;

mod resume;

use super::*;
use crate::protocol::{decode_motion, pb::ServerMessage};
use prost::Message as _;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// A member's sink without a socket: it holds `capacity` frames, then drops
/// room frames until the next snapshot, as a full socket would.
struct Inbox {
    frames: Mutex<VecDeque<Frame>>,
    lagged: AtomicBool,
    /// Told by the room that it took this member out, and why.
    removed: Mutex<Option<Removal>>,
    /// Told by the room that a resume took this member's place.
    superseded: AtomicBool,
    capacity: usize,
    arrived: Notify,
}

impl Inbox {
    fn new(capacity: usize) -> Arc<Self> {
        Arc::new(Self {
            frames: Mutex::new(VecDeque::new()),
            lagged: AtomicBool::new(false),
            removed: Mutex::new(None),
            superseded: AtomicBool::new(false),
            capacity,
            arrived: Notify::new(),
        })
    }

    fn frames(&self) -> MutexGuard<'_, VecDeque<Frame>> {
        self.frames.lock().expect("inbox lock")
    }

    fn removed(&self) -> Option<Removal> {
        self.removed.lock().expect("inbox lock").clone()
    }

    fn is_empty(&self) -> bool {
        self.frames().is_empty()
    }

    fn push(&self, frame: Frame) {
        self.frames().push_back(frame);
        self.arrived.notify_one();
    }
}

impl Sink for Inbox {
    fn send(&self, frame: &Frame) {
        if self.lagged.load(Ordering::Relaxed) {
            return;
        }
        if self.frames().len() >= self.capacity {
            self.lagged.store(true, Ordering::Relaxed);
            return;
        }
        self.push(frame.clone());
    }

    fn send_snapshot(&self, frame: Frame) {
        self.lagged.store(false, Ordering::Relaxed);
        self.push(frame);
    }

    fn removed(&self, removal: Removal) {
        *self.removed.lock().expect("inbox lock") = Some(removal);
    }

    fn superseded(&self) {
        self.superseded.store(true, Ordering::Relaxed);
    }
}

fn rooms(capacity: usize, tick_ms: u64) -> Arc<Rooms> {
    Rooms::new(
        RoomSettings {
            tick: Duration::from_millis(tick_ms),
            tick_workers: 0,
            motion_time_unit_ms: 100,
            capacity,
            spawn: Position { x: 10, y: 10 },
            world: Position { x: 5_000, y: 5_000 },
            limits: pb::Limits::default(),
            resume_grace: Duration::ZERO,
            max_held: 0,
            spatial: None,
        },
        Clock::start(),
        Arc::new(Metrics::default()),
    )
}

fn decode(frame: &Frame) -> ServerMessage {
    ServerMessage::decode(frame.clone()).expect("valid frame")
}

/// Joins `room` with an inbox of 16 frames.
async fn join(rooms: &Arc<Rooms>, room: &str, name: &str) -> (Membership, Arc<Inbox>) {
    join_with(rooms, room, name, 16).await.expect("joins")
}

async fn join_with(
    rooms: &Arc<Rooms>,
    room: &str,
    name: &str,
    capacity: usize,
) -> Result<(Membership, Arc<Inbox>), JoinError> {
    let inbox = Inbox::new(capacity);
    let sink: Arc<dyn Sink> = inbox.clone();
    rooms
        .join(room, name.into(), sink)
        .await
        .map(|m| (m, Arc::clone(&inbox)))
}

/// The next frame in `inbox`, waiting (bounded) for it.
async fn next(inbox: &Inbox) -> ServerMessage {
    let wait = async {
        loop {
            let arrived = inbox.arrived.notified();
            if let Some(frame) = inbox.frames().pop_front() {
                return decode(&frame);
            }
            arrived.await;
        }
    };
    tokio::time::timeout(Duration::from_secs(1), wait)
        .await
        .expect("a frame within a second")
}

fn at(x: u32) -> Motion {
    Motion::standing(Position { x, y: 0 })
}

#[tokio::test]
async fn join_welcomes_with_a_snapshot_and_tells_the_others() {
    let rooms = rooms(10, 100);
    let (_ada, ada) = join(&rooms, "lobby", "Ada").await;
    let Some(Body::Welcome(w)) = next(&ada).await.body else {
        panic!("not a welcome")
    };
    assert_eq!((w.member_id, w.room.as_str()), (0, "lobby"));
    assert_eq!(w.snapshot.expect("snapshot").members.len(), 1);

    let (bo, bo_inbox) = join(&rooms, "lobby", "Bo").await;
    assert_eq!(bo.id(), MemberId(1));
    let Some(Body::Welcome(w)) = next(&bo_inbox).await.body else {
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
    match next(&ada).await.body {
        Some(Body::Joined(j)) => assert_eq!(j.member.expect("member").name, "Bo"),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        rooms.list(),
        [RoomInfo {
            name: "lobby".into(),
            members: 2,
            capacity: 10,
        }]
    );

    bo.leave(LeaveReason::Left).await;
    match next(&ada).await.body {
        Some(Body::Left(l)) => assert_eq!((l.member_id, l.reason), (1, LeaveReason::Left as i32)),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn ids_are_reused_and_empty_rooms_disappear() {
    let rooms = rooms(10, 100);
    let a = join(&rooms, "r", "a").await;
    let b = join(&rooms, "r", "b").await;
    drop(a);
    let (c, _) = join(&rooms, "r", "c").await;
    assert_eq!(c.id(), MemberId(0));
    drop((b, c));
    assert!(rooms.list().is_empty());
    assert_eq!(rooms.metrics.rooms.get(), 0);
    assert_eq!(rooms.metrics.members.get(), 0);
}

/// Joins `room` as app user `user` (also its name).
async fn join_user(rooms: &Arc<Rooms>, room: &str, user: &str) -> (Membership, Arc<Inbox>) {
    let inbox = Inbox::new(16);
    let sink: Arc<dyn Sink> = inbox.clone();
    let m = rooms
        .join_as(room, user.into(), Some(Arc::from(user)), sink)
        .await
        .expect("joins");
    (m, inbox)
}

fn was_replaced(inbox: &Inbox) -> bool {
    inbox.removed() == Some(Removal::Replaced)
}

#[tokio::test]
async fn a_users_second_join_replaces_the_first_in_order() {
    let rooms = rooms(2, 0);
    let (_ada, ada) = join_user(&rooms, "r", "ada").await;
    let (old, old_inbox) = join_user(&rooms, "r", "bo").await;
    assert_eq!(old.id(), MemberId(1));
    next(&ada).await; // Welcome
    next(&ada).await; // Joined bo
    next(&old_inbox).await; // Welcome

    // A full room still takes the user back: the old member makes room.
    let (new, new_inbox) = join_user(&rooms, "r", "bo").await;
    assert!(was_replaced(&old_inbox));
    assert!(!was_replaced(&new_inbox) && !was_replaced(&ada));
    // The freed id is reused at once.
    assert_eq!(new.id(), MemberId(1));
    match next(&ada).await.body {
        Some(Body::Left(l)) => {
            assert_eq!((l.member_id, l.reason), (1, LeaveReason::Replaced as i32))
        }
        other => panic!("{other:?}"),
    }
    match next(&ada).await.body {
        Some(Body::Joined(j)) => assert_eq!(j.member.expect("member").id, 1),
        other => panic!("{other:?}"),
    }
    let Some(Body::Welcome(w)) = next(&new_inbox).await.body else {
        panic!("not a welcome")
    };
    assert_eq!(w.snapshot.expect("snapshot").members.len(), 2);
    // The replaced member hears nothing more.
    assert!(old_inbox.is_empty());
    assert_eq!(rooms.metrics.members.get(), 2);
    assert_eq!(rooms.metrics.auth_replaced.get(), 1);

    // The old connection's late moves, chat and leave touch nobody, though
    // its id is the new member's now.
    old.submit(at(77)).await;
    old.chat("ghost".into()).await;
    old.resync().await;
    old.leave(LeaveReason::Disconnected).await;
    assert!(ada.is_empty());
    assert!(new_inbox.is_empty());
    assert_eq!(rooms.metrics.members.get(), 2);
    new.submit(at(5)).await;
    let records = decode_motion(&next(&ada).await.motion).expect("batch").1;
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].motion, at(5));

    // Leaving frees the user: the next join replaces nobody.
    new.leave(LeaveReason::Left).await;
    let (_again, again) = join_user(&rooms, "r", "bo").await;
    assert!(!was_replaced(&again));
    assert_eq!(rooms.metrics.auth_replaced.get(), 1);
}

#[tokio::test]
async fn the_same_user_in_two_rooms_is_two_members() {
    let rooms = rooms(10, 100);
    let (_a, first) = join_user(&rooms, "one", "ada").await;
    let (_b, second) = join_user(&rooms, "two", "ada").await;
    assert!(!was_replaced(&first) && !was_replaced(&second));
    assert_eq!(rooms.metrics.members.get(), 2);
}

#[tokio::test]
async fn a_full_room_refuses() {
    let rooms = rooms(2, 100);
    let _a = join(&rooms, "r", "a").await;
    let _b = join(&rooms, "r", "b").await;
    assert_eq!(
        join_with(&rooms, "r", "c", 16).await.err(),
        Some(JoinError::RoomFull {
            room: "r".into(),
            capacity: 2
        })
    );
    assert!(join_with(&rooms, "other", "c", 16).await.is_ok());
}

#[tokio::test]
async fn one_batch_per_tick_with_the_newest_move_of_each_member() {
    let rooms = rooms(10, 100);
    let (_w, watcher) = join(&rooms, "r", "w").await;
    let (a, _) = join(&rooms, "r", "a").await;
    let (b, _) = join(&rooms, "r", "b").await;
    next(&watcher).await; // Welcome
    next(&watcher).await; // Joined a
    next(&watcher).await; // Joined b
    a.submit(at(1)).await;
    b.submit(at(2)).await;
    a.submit(at(3)).await;
    rooms.tick(1_000_000).await;
    let batch = next(&watcher).await;
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
    rooms.tick(1_000_100).await;
    assert!(watcher.is_empty());
}

#[tokio::test]
async fn a_zero_tick_sends_each_move_at_once() {
    let rooms = rooms(10, 0);
    let (_w, watcher) = join(&rooms, "r", "w").await;
    let (a, _) = join(&rooms, "r", "a").await;
    next(&watcher).await; // Welcome
    next(&watcher).await; // Joined a
    a.submit(at(7)).await;
    let (_, records) = decode_motion(&next(&watcher).await.motion).expect("batch");
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
    let (slow, inbox) = join(&rooms, "r", "slow").await;
    let (a, _) = join(&rooms, "r", "a").await;
    for i in 0..40 {
        a.submit(at(i)).await;
        rooms.tick(1_000 + u64::from(i) * 100).await;
    }
    assert!(inbox.lagged.load(Ordering::Relaxed));
    slow.resync().await;
    let held: Vec<_> = inbox.frames().drain(..).collect();
    assert_eq!(held.len(), 17, "16 frames kept, then the snapshot");
    let Some(Body::Resync(s)) = decode(&held[16]).body else {
        panic!("not a resync")
    };
    let a_now = s
        .members
        .iter()
        .find(|m| m.id == a.id().0)
        .expect("a in snapshot");
    assert_eq!(a_now.position, Some(pb::Position { x: 39, y: 0 }));
    // Room frames flow again after the snapshot.
    a.submit(at(99)).await;
    rooms.tick(10_000).await;
    let (_, records) = decode_motion(&next(&inbox).await.motion).expect("batch");
    assert_eq!(records[0].motion, at(99));
}

#[tokio::test(start_paused = true)]
async fn the_ticker_flushes_on_the_tick_grid() {
    let rooms = rooms(10, 100);
    let token = CancellationToken::new();
    let ticker = tokio::spawn(Arc::clone(&rooms).run_ticker(token.clone()));
    let (_w, watcher) = join(&rooms, "r", "w").await;
    let (a, _) = join(&rooms, "r", "a").await;
    next(&watcher).await; // Welcome
    next(&watcher).await; // Joined a
    a.submit(at(5)).await;
    let batch = next(&watcher).await;
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
        tick_workers: 0,
        motion_time_unit_ms: 100,
        capacity: 500,
        spawn: Position { x: 2_500, y: 2_500 },
        world: Position { x: 5_000, y: 5_000 },
        limits: pb::Limits::default(),
        resume_grace: Duration::ZERO,
        max_held: 0,
        spatial: None,
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

/// Rooms whose tick is shared out over `tick_workers` tasks.
fn sharded_rooms(tick_workers: usize) -> Arc<Rooms> {
    Rooms::new(
        RoomSettings {
            tick_workers,
            ..rooms(10, 100).settings.clone()
        },
        Clock::start(),
        Arc::new(Metrics::default()),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sharded_tick_sends_each_member_one_batch_with_every_move_of_its_room() {
    // More tasks than threads and rooms that do not divide evenly.
    let rooms = sharded_rooms(3);
    let mut members = Vec::new();
    for r in 0..7 {
        let room = format!("room-{r}");
        let mut inboxes = Vec::new();
        for m in 0..4 {
            inboxes.push(join(&rooms, &room, &format!("m{m}")).await);
        }
        members.push(inboxes);
    }
    // Welcome and the later Joined frames.
    for room in &members {
        for (m, (_, inbox)) in room.iter().enumerate() {
            for _ in 0..room.len() - m {
                next(inbox).await;
            }
            assert!(inbox.is_empty());
        }
    }
    for tick in 1..=3u32 {
        for (r, room) in members.iter().enumerate() {
            for (m, (member, _)) in room.iter().enumerate() {
                member
                    .submit(at(tick * 1_000 + 10 * r as u32 + m as u32))
                    .await;
            }
        }
        rooms.tick(u64::from(tick) * 100).await;
        for (r, room) in members.iter().enumerate() {
            let expected: Vec<_> = room
                .iter()
                .enumerate()
                .map(|(m, (member, _))| MotionRecord {
                    member: member.id(),
                    motion: at(tick * 1_000 + 10 * r as u32 + m as u32),
                })
                .collect();
            for (_, inbox) in room {
                let (time, records) = decode_motion(&next(inbox).await.motion).expect("batch");
                assert_eq!(time, tick);
                assert_eq!(records, expected, "room {r}, tick {tick}");
                assert!(inbox.is_empty(), "one frame per member per tick");
            }
        }
        assert_eq!(rooms.metrics.batches.get(), u64::from(tick) * 7);
    }
    assert_eq!(rooms.metrics.moves_applied.get(), 3 * 7 * 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_room_sharded_visits_every_room_once_whatever_the_worker_count() {
    let rooms = sharded_rooms(1);
    let mut held = Vec::new();
    for r in 0..5 {
        held.push(join(&rooms, &format!("room-{r}"), "m").await);
    }
    for workers in 1..=8 {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let visits = Arc::clone(&seen);
        rooms
            .each_room_sharded(workers, move |_, room| {
                visits.lock().expect("visits").push(room.name().to_owned());
            })
            .await;
        let mut seen = seen.lock().expect("visits").clone();
        seen.sort();
        let all: Vec<_> = (0..5).map(|r| format!("room-{r}")).collect();
        assert_eq!(seen, all, "{workers} workers");
    }
}

#[test]
fn shards_cover_every_room_once_and_differ_by_at_most_one() {
    for len in 0..20 {
        for shards in 1..8 {
            let cut: Vec<_> = (0..shards).map(|i| tick::shard(len, shards, i)).collect();
            assert_eq!(cut[0].start, 0);
            assert_eq!(cut[shards - 1].end, len);
            for pair in cut.windows(2) {
                assert_eq!(pair[0].end, pair[1].start);
            }
            let (min, max) = (len / shards, len.div_ceil(shards));
            assert!(cut.iter().all(|r| (min..=max).contains(&r.len())));
        }
    }
}

/// Issue #19: member data and the shared user must not make the members
/// the tick walks any larger than they were before them (128 bytes).
#[test]
fn a_member_stays_within_128_bytes() {
    assert!(
        std::mem::size_of::<super::Member>() <= 128,
        "{} bytes",
        std::mem::size_of::<super::Member>()
    );
}

/// Webhooks: a room emits its transitions and its members' stays, in
/// order, and a replaced member leaves as `replaced`.
#[tokio::test]
async fn a_room_emits_its_webhook_events_in_order() {
    let rooms = rooms(10, 50);
    let limits = crate::hooks::queue::Limits {
        capacity: 100,
        batch: 100,
        first_retry: Duration::from_millis(500),
        max_retry: Duration::from_secs(30),
    };
    let hooks = Hooks::new(limits, None, *rooms.clock(), Arc::new(Metrics::default()));
    rooms.attach_hooks(Arc::clone(&hooks));
    let (ada, _a) = join_user(&rooms, "lobby", "ada").await;
    let (bo, _b) = join(&rooms, "lobby", "Bo").await;
    let (ada2, _a2) = join_user(&rooms, "lobby", "ada").await;
    bo.leave(LeaveReason::Left).await;
    drop(ada);
    ada2.leave(LeaveReason::TimedOut).await;
    let events = hooks.drain_json();
    let seen: Vec<String> = events
        .iter()
        .map(|e| {
            let kind = e["type"].as_str().unwrap_or_default();
            match e["reason"].as_str() {
                Some(reason) => format!("{kind} {} {reason}", e["member_id"]),
                None if kind.starts_with("member") => format!("{kind} {}", e["member_id"]),
                None => kind.to_owned(),
            }
        })
        .collect();
    assert_eq!(
        seen,
        [
            "room.occupied",
            "member.joined 0",
            "member.joined 1",
            "member.left 0 replaced",
            "member.joined 0",
            "member.left 1 left",
            "member.left 0 timed_out",
            "room.vacated",
        ]
    );
    assert!(events.iter().all(|e| e["room"] == "lobby"));
    assert_eq!(events[1]["user"], "ada");
    assert_eq!(events[2]["user"], serde_json::Value::Null);
    assert_eq!(events[2]["name"], "Bo");
    assert!(events[6]["duration_ms"].as_u64().is_some());
}
