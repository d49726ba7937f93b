//! One room tick, shared out over 1 and 2 tasks, writing into in-memory
//! sinks: 600 rooms of 30 members, every member with a pending move, in a
//! multi-thread runtime of 2 worker threads.
//!
//! `cargo bench --bench tick`. Each iteration queues the moves in its setup
//! (not measured), then measures one tick: every room's moves applied,
//! encoded once, and its batch handed to each of its 30 sinks.
//!
//! `spatial_tick` (issue #17): one spatial room of 10,000 members in
//! crowds, a tenth of them moving each tick (a move a second at 10 ticks a
//! second): the moves applied, homes updated, each cell's moves encoded
//! once and every member's frame assembled from the cells it sees.

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use amble::clock::Clock;
use amble::metrics::Metrics;
use amble::protocol::{Motion, Position, pb};
use amble::room::sink::{Frame, Sink};
use amble::room::{Membership, RoomSettings, Rooms};
use criterion::{BatchSize, BenchmarkId, Criterion, SamplingMode, criterion_group, criterion_main};
use tokio::runtime::Runtime;

const ROOMS: usize = 600;
const MEMBERS: usize = 30;
const THREADS: usize = 2;
const TICK_MS: u64 = 100;

/// A member's socket stand-in: counts what it is handed, as a socket write
/// would take it, without a system call.
#[derive(Default)]
struct Counting {
    frames: AtomicU64,
    bytes: AtomicU64,
}

impl Sink for Counting {
    fn send(&self, frame: &Frame) {
        self.frames.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(frame.len() as u64, Ordering::Relaxed);
    }

    fn send_snapshot(&self, frame: Frame) {
        self.send(&frame);
    }
}

struct World {
    rooms: Arc<Rooms>,
    metrics: Arc<Metrics>,
    members: Vec<Membership>,
    sinks: Vec<Arc<Counting>>,
    now_ms: u64,
}

impl World {
    async fn build(tick_workers: usize) -> Self {
        let metrics = Arc::new(Metrics::default());
        let rooms = Rooms::new(
            RoomSettings {
                tick: Duration::from_millis(TICK_MS),
                tick_workers,
                motion_time_unit_ms: 100,
                capacity: MEMBERS,
                spawn: Position { x: 2_500, y: 2_500 },
                world: Position { x: 5_000, y: 5_000 },
                limits: pb::Limits::default(),
                resume_grace: Duration::ZERO,
                max_held: 0,
                spatial: None,
            },
            Clock::start(),
            Arc::clone(&metrics),
        );
        let mut members = Vec::with_capacity(ROOMS * MEMBERS);
        let mut sinks = Vec::with_capacity(ROOMS * MEMBERS);
        for r in 0..ROOMS {
            let room = format!("room-{r}");
            for m in 0..MEMBERS {
                let sink = Arc::new(Counting::default());
                let member = rooms
                    .join(&room, format!("m{m}"), Arc::clone(&sink) as Arc<dyn Sink>)
                    .await
                    .expect("a room of MEMBERS takes MEMBERS");
                members.push(member);
                sinks.push(sink);
            }
        }
        Self {
            rooms,
            metrics,
            members,
            sinks,
            now_ms: 1_000_000,
        }
    }

    /// Gives every member a pending move (a different one each tick).
    async fn queue_moves(&mut self) {
        self.now_ms += TICK_MS;
        let step = (self.now_ms / TICK_MS % 1_000) as u32;
        for (i, member) in self.members.iter().enumerate() {
            let x = (i % 4_000) as u32 + step;
            let motion = Motion::standing(Position { x, y: 2_000 + step });
            member.submit(motion).await;
        }
    }

    fn frames(&self) -> u64 {
        self.sinks
            .iter()
            .map(|s| s.frames.load(Ordering::Relaxed))
            .sum()
    }
}

/// Runs one tick at `now_ms` in a task of the runtime, as the ticker would.
fn tick(rt: &Runtime, rooms: &Arc<Rooms>, now_ms: u64) {
    let rooms = Arc::clone(rooms);
    rt.block_on(async move { tokio::spawn(async move { rooms.tick(now_ms).await }).await })
        .expect("the tick does not panic");
}

fn bench_tick(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(THREADS)
        .build()
        .expect("a runtime");
    let mut group = c.benchmark_group("tick");
    group
        .sampling_mode(SamplingMode::Flat)
        .sample_size(40)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4));
    for workers in [1, 2] {
        let mut world = rt.block_on(World::build(workers));
        // The work is real: one tick gives every member exactly one frame
        // carrying its room's 30 moves.
        let (frames, batches) = (world.frames(), world.metrics.batches.get());
        rt.block_on(world.queue_moves());
        tick(&rt, &world.rooms, world.now_ms);
        assert_eq!(world.frames() - frames, (ROOMS * MEMBERS) as u64);
        assert_eq!(world.metrics.batches.get() - batches, ROOMS as u64);

        let id = BenchmarkId::new(format!("{ROOMS}x{MEMBERS}/workers"), workers);
        group.bench_function(id, |b| {
            b.iter_batched(
                || {
                    rt.block_on(world.queue_moves());
                    (Arc::clone(&world.rooms), world.now_ms)
                },
                |(rooms, now_ms)| tick(&rt, black_box(&rooms), now_ms),
                BatchSize::PerIteration,
            );
        });
        let moved = world.metrics.moves_applied.get();
        assert_eq!(moved % (ROOMS * MEMBERS) as u64, 0, "every move applied");
    }
    group.finish();
}

const PLAZA: usize = 10_000;
const PLAZA_WORLD: u32 = 50_000;

/// Where plaza member `i` stands: four in five around one of eight spots,
/// within about 15 m, the rest spread over the world (deterministic).
fn crowd(i: usize) -> Position {
    let h = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let (a, b) = (
        (h >> 32) as f64 / f64::from(u32::MAX),
        (h & 0xFFFF_FFFF) as f64 / f64::from(u32::MAX),
    );
    if i % 5 == 4 {
        return Position {
            x: (a * f64::from(PLAZA_WORLD)) as u32,
            y: (b * f64::from(PLAZA_WORLD)) as u32,
        };
    }
    let spot = (i % 8) as f64 * std::f64::consts::TAU / 8.0;
    let (w, r) = (f64::from(PLAZA_WORLD), 1_500.0 * a);
    let angle = b * std::f64::consts::TAU;
    Position {
        x: (w / 2.0 + w / 4.0 * spot.cos() + r * angle.cos()) as u32,
        y: (w / 2.0 + w / 4.0 * spot.sin() + r * angle.sin()) as u32,
    }
}

fn bench_spatial_tick(c: &mut Criterion) {
    use amble::room::Arrival;
    use amble::room::spatial::SpatialSettings;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(THREADS)
        .build()
        .expect("a runtime");
    let world = Position {
        x: PLAZA_WORLD,
        y: PLAZA_WORLD,
    };
    let metrics = Arc::new(Metrics::default());
    let rooms = Rooms::new(
        RoomSettings {
            tick: Duration::from_millis(TICK_MS),
            tick_workers: 1,
            motion_time_unit_ms: 100,
            capacity: MEMBERS,
            spawn: Position { x: 2_500, y: 2_500 },
            world: Position { x: 5_000, y: 5_000 },
            limits: pb::Limits::default(),
            resume_grace: Duration::ZERO,
            max_held: 0,
            spatial: Some(SpatialSettings {
                patterns: vec!["plaza".into()],
                world,
                capacity: PLAZA,
                radius_cm: 1_500,
                limits: pb::Limits::default(),
            }),
        },
        Clock::start(),
        Arc::clone(&metrics),
    );
    let (members, sinks) = rt.block_on(async {
        let mut members = Vec::with_capacity(PLAZA);
        let mut sinks = Vec::with_capacity(PLAZA);
        for i in 0..PLAZA {
            let sink = Arc::new(Counting::default());
            let arrival = Arrival {
                name: format!("m{i}"),
                start: Some(crowd(i)),
                ..Arrival::default()
            };
            let member = rooms
                .arrive("plaza", arrival, Arc::clone(&sink) as Arc<dyn Sink>)
                .await
                .expect("the plaza takes PLAZA");
            members.push(member);
            sinks.push(sink);
        }
        (members, sinks)
    });
    let mut now_ms = 1_000_000_u64;
    let mut round = 0_usize;
    let mut queue = |now_ms: u64| {
        round += 1;
        let step = (round % 50) as u32;
        let members = &members;
        rt.block_on(async move {
            // A tenth of the plaza moves: a step of up to half a metre.
            for (i, m) in members.iter().enumerate().skip(round % 10).step_by(10) {
                let p = crowd(i);
                let x = (p.x + step * 10).min(PLAZA_WORLD);
                m.submit(Motion::standing(Position { x, y: p.y })).await;
            }
        });
        now_ms
    };
    let frames = |sinks: &[Arc<Counting>]| -> u64 {
        sinks.iter().map(|s| s.frames.load(Ordering::Relaxed)).sum()
    };
    // The work is real: a tick hands a frame to members who see a move.
    now_ms += TICK_MS;
    let before = frames(&sinks);
    tick(&rt, &rooms, queue(now_ms));
    assert!(
        frames(&sinks) - before > (PLAZA / 10) as u64,
        "frames went out"
    );
    let mut group = c.benchmark_group("spatial_tick");
    group
        .sampling_mode(SamplingMode::Flat)
        .sample_size(40)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4));
    group.bench_function(format!("{PLAZA}/moving-tenth"), |b| {
        b.iter_batched(
            || {
                now_ms += TICK_MS;
                (Arc::clone(&rooms), queue(now_ms))
            },
            |(rooms, now_ms)| tick(&rt, black_box(&rooms), now_ms),
            BatchSize::PerIteration,
        );
    });
    group.finish();
    let bytes: u64 = sinks.iter().map(|s| s.bytes.load(Ordering::Relaxed)).sum();
    black_box((bytes, metrics.moves_applied.get()));
}

criterion_group!(benches, bench_tick, bench_spatial_tick);
criterion_main!(benches);
