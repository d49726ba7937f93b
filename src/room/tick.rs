//! The rooms' tick: every `tick`, each room's pending moves go out as one
//! motion batch.
//!
//! A tick shares the rooms out over `tick_workers` tasks, which the runtime
//! runs on its worker threads, so a node writes its batches from every core
//! rather than from the ticker's alone. Each room is handled by exactly one
//! task per tick, and a tick ends when every task has, so ticks never
//! overlap and a room's frames stay in order.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::sync::{Arc, MutexGuard};

use tokio::task::JoinSet;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use super::grid::TickGrid;
use super::{Member, Room, Rooms, State, fan_out};
use crate::metrics::Metrics;
use bytes::Bytes;

use super::interest::Grid;
use super::spatial::Frames;
use crate::protocol::pb::server_message::Body;
use crate::protocol::{MemberId, MotionRecord, encode_motion, encode_server, motion_time, pb};

impl Rooms {
    /// Runs one tick at server time `now_ms`: applies every room's pending
    /// moves and publishes one batch per room that had any, the rooms shared
    /// out over the configured tick workers
    /// ([`RoomSettings::tick_workers`](super::RoomSettings::tick_workers)).
    /// Returns when every batch is written. The ticker of
    /// [`run_ticker`](Self::run_ticker) calls it; call it directly to drive
    /// rooms without a ticker (benchmarks).
    pub async fn tick(self: &Arc<Self>, now_ms: u64) {
        self.tick_sharded(self.tick_workers(), now_ms).await;
    }

    async fn tick_sharded(self: &Arc<Self>, workers: usize, now_ms: u64) {
        // One scratch buffer and one tally per task, reused across its rooms.
        let mut records = Vec::new();
        let mut tally = Tally::new(Arc::clone(&self.metrics));
        self.each_room_sharded(workers, move |rooms, room| {
            rooms.flush(room, now_ms, &mut records, &mut tally);
        })
        .await;
    }

    /// Calls `f` once for every room, the rooms cut into `workers` balanced
    /// shards, each run by a task of its own (a clone of `f` each), outside
    /// the cooperative budget ([`fan_out`]). Returns when every shard is
    /// done; with one worker, or at most one room, it runs them in order
    /// in the calling task and spawns nothing. `f` takes room locks (never
    /// the map's) and must not block.
    pub(super) async fn each_room_sharded<F>(self: &Arc<Self>, workers: usize, mut f: F)
    where
        F: FnMut(&Self, &Room) + Clone + Send + 'static,
    {
        // Collect first: a room lock is never taken under a map guard.
        let rooms: Vec<Arc<Room>> = self.map.iter().map(|r| Arc::clone(r.value())).collect();
        let shards = workers.min(rooms.len());
        if shards <= 1 {
            fan_out(|| {
                for room in &rooms {
                    f(self, room);
                }
            })
            .await;
            return;
        }
        let rooms: Arc<[Arc<Room>]> = rooms.into();
        // Every shard is spawned, the ticker's share included, and the
        // ticker only waits: a task spawned from a worker thread goes into
        // that worker's LIFO slot, which other workers cannot steal from, so
        // the last task spawned runs where the ticker runs, after it yields.
        let mut tasks = JoinSet::new();
        for i in 0..shards {
            let (this, rooms, mut f) = (Arc::clone(self), Arc::clone(&rooms), f.clone());
            let range = shard(rooms.len(), shards, i);
            tasks.spawn(fan_out(move || {
                for room in &rooms[range] {
                    f(&this, room);
                }
            }));
        }
        let mut panic = None;
        while let Some(done) = tasks.join_next().await {
            if let Err(err) = done
                && err.is_panic()
            {
                panic.get_or_insert(err.into_panic());
            }
        }
        // As if it had happened in the ticker's own loop.
        if let Some(panic) = panic {
            std::panic::resume_unwind(panic);
        }
    }

    /// The number of tasks a tick uses: the setting, or the runtime's
    /// worker threads when it is 0 (one outside a runtime).
    pub(super) fn tick_workers(&self) -> usize {
        match self.settings.tick_workers {
            0 => tokio::runtime::Handle::try_current().map_or(1, |h| h.metrics().num_workers()),
            n => n,
        }
        .max(1)
    }

    fn flush(&self, room: &Room, now_ms: u64, records: &mut Vec<MotionRecord>, tally: &mut Tally) {
        let mut st = room.state();
        if st.remote.is_some() {
            return self.flush_clustered(room, st, now_ms, records, tally);
        }
        if st.dirty.is_empty() && st.spatial.is_none() {
            return;
        }
        records.clear();
        let State { members, dirty, .. } = &mut *st;
        for id in dirty.drain(..) {
            if let Some(m) = members.get_mut(&id)
                && let Some(motion) = m.pending.take()
            {
                m.motion = motion;
                m.moved_at_ms = now_ms;
                records.push(MotionRecord { member: id, motion });
            }
        }
        if st.spatial.is_some() {
            return self.flush_spatial(room, st, now_ms, records, tally);
        }
        if records.is_empty() {
            return;
        }
        let time = motion_time(now_ms, self.settings.motion_time_unit_ms);
        room.publish_counted(st, &encode_motion(time, records), tally);
        tally.moves += records.len() as u64;
        tally.batches += 1;
    }

    /// A spatial room's tick, its moves applied: members whose home
    /// changed (by a move, or along a walk) come into and go out of view
    /// (`Disappeared`, `Appeared`, before the batch), the count goes out
    /// when it changed (at most once a second), and each member gets the
    /// moves of the cells in its view: one frame per viewing cell, built
    /// from chunks encoded once per cell, shared by everyone living there.
    fn flush_spatial(
        &self,
        room: &Room,
        mut st: MutexGuard<'_, State>,
        now_ms: u64,
        records: &[MotionRecord],
        tally: &mut Tally,
    ) {
        let State {
            members, spatial, ..
        } = &mut *st;
        let Some(sp) = spatial.as_deref_mut() else {
            return;
        };
        let moved = sp.rehome(members, now_ms);
        let mut before: HashMap<MemberId, Vec<Bytes>> = HashMap::new();
        // Who came into each viewer's view this tick: their Appeared shows
        // this tick's move already, so the batch leaves it out for them.
        let mut came_into: HashMap<MemberId, Vec<MemberId>> = HashMap::new();
        if !moved.is_empty() {
            for (viewer, (came, went)) in sp.view_changes(&moved) {
                let frames = before.entry(viewer).or_default();
                if !went.is_empty() {
                    frames.push(super::spatial::disappeared(&went));
                }
                if !came.is_empty() {
                    frames.push(super::spatial::appeared(members, &came));
                    came_into.insert(viewer, came);
                }
            }
        }
        let population = (members.len() != sp.population_sent
            && now_ms >= sp.population_at_ms.saturating_add(1_000))
        .then(|| {
            sp.population_sent = members.len();
            sp.population_at_ms = now_ms;
            encode_server(Body::Population(pb::Population {
                members: u32::try_from(members.len()).unwrap_or(u32::MAX),
            }))
        });
        if records.is_empty() && before.is_empty() && population.is_none() {
            return;
        }
        let time = motion_time(now_ms, self.settings.motion_time_unit_ms);
        let mut frames = (!records.is_empty()).then(|| Frames::new(sp, time, records));
        let out = room.out();
        let plan: Vec<(Vec<Bytes>, Option<Bytes>)> = out
            .sinks
            .iter()
            .map(|(id, _)| {
                let home = sp.home(*id);
                let batch = match (came_into.get(id), home) {
                    // Rare: its own batch, without those just shown.
                    (Some(came), Some(home)) => {
                        let own: Vec<MotionRecord> = records
                            .iter()
                            .filter(|r| !came.contains(&r.member))
                            .filter(|r| sp.home(r.member).is_some_and(|c| Grid::sees(home, c)))
                            .copied()
                            .collect();
                        (!own.is_empty()).then(|| encode_motion(time, &own))
                    }
                    _ => frames
                        .as_mut()
                        .zip(home)
                        .and_then(|(f, home)| f.for_home(&sp.grid, home)),
                };
                (before.remove(id).unwrap_or_default(), batch)
            })
            .collect();
        drop(st);
        let mut batches = 0_u64;
        for ((_, sink), (first, batch)) in out.sinks.iter().zip(plan) {
            for frame in first.iter().chain(&population).chain(&batch) {
                sink.send(frame);
                tally.frames += 1;
                tally.bytes += frame.len() as u64;
            }
            batches += u64::from(batch.is_some());
        }
        tally.moves += records.len() as u64;
        tally.batches += u64::from(batches > 0);
    }

    /// A tick in cluster mode: the local moves cut before the tick (already
    /// published to the other nodes) and the remote moves received since
    /// the last tick, in one batch. Local moves that came after the cut
    /// stay pending for the next cut, so a move reaches every node's
    /// members in the same tick.
    fn flush_clustered(
        &self,
        room: &Room,
        mut st: MutexGuard<'_, State>,
        now_ms: u64,
        records: &mut Vec<MotionRecord>,
        tally: &mut Tally,
    ) {
        records.clear();
        let State {
            members,
            dirty,
            remote,
            ..
        } = &mut *st;
        let Some(r) = remote.as_deref_mut() else {
            return;
        };
        if r.last_flush_ms >= now_ms {
            // Written already, ahead of a remote member's chat or leave that
            // had to follow its moves (`remote::apply::Apply::follow_moves`).
            return;
        }
        r.last_flush_ms = now_ms;
        collect_batch(members, dirty, &mut r.cut, now_ms, records);
        // A spatial room: each member its own cells' moves, local and
        // remote alike, and the view changes they bring.
        if st.spatial.is_some() {
            return self.flush_spatial(room, st, now_ms, records, tally);
        }
        if records.is_empty() {
            return;
        }
        let time = motion_time(now_ms, self.settings.motion_time_unit_ms);
        room.publish_counted(st, &encode_motion(time, records), tally);
        tally.moves += records.len() as u64;
        tally.batches += 1;
    }

    /// Runs the room ticks until `shutdown`: every `tick`, aligned to
    /// multiples of the tick in server time so batch times are exact. A
    /// tick in progress finishes (its tasks included) before it returns.
    pub async fn run_ticker(self: Arc<Self>, shutdown: CancellationToken) {
        let tick = self.settings.tick;
        let Ok(tick_ms) = u64::try_from(tick.as_millis()) else {
            return;
        };
        let Some(grid) = TickGrid::new(tick_ms, 0) else {
            return;
        };
        let workers = self.tick_workers();
        let first = self.clock.instant_at(grid.next_tick(self.clock.now_ms()));
        let mut interval = tokio::time::interval_at(first, tick);
        interval.set_missed_tick_behavior(MissedTickBehavior::Skip);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                at = interval.tick() => {
                    let now_ms = grid.nearest_tick(self.clock.ms_at(at));
                    self.tick_sharded(workers, now_ms).await;
                }
            }
        }
    }
}

/// Shard `i` of `len` items cut into `shards` parts whose sizes differ by
/// at most one.
pub(super) fn shard(len: usize, shards: usize, i: usize) -> Range<usize> {
    len * i / shards..len * (i + 1) / shards
}

/// The batch of a clustered room's coming tick, written ahead of it: for
/// a remote member's chat or leave that must follow its waiting move
/// (`Apply::follow_moves`), and for a joiner whose snapshot already shows
/// the cut moves (`Rooms::batch_before_join`). The tick is the current one
/// unless it was written (then the next); `last_flush_ms` is moved to it,
/// so the tick itself writes nothing more. `None` when nothing waits.
#[allow(clippy::too_many_arguments)] // a room's locked parts, taken apart by the caller
pub(super) fn batch_ahead(
    members: &mut BTreeMap<MemberId, Member>,
    dirty: &mut Vec<MemberId>,
    cut: &mut Vec<MotionRecord>,
    last_flush_ms: &mut u64,
    now_ms: u64,
    tick_ms: u64,
    unit_ms: u32,
    metrics: &Metrics,
) -> Option<crate::room::sink::Frame> {
    let at_ms = (now_ms / tick_ms * tick_ms).max(*last_flush_ms + tick_ms);
    *last_flush_ms = at_ms;
    let mut records = Vec::new();
    collect_batch(members, dirty, cut, at_ms, &mut records);
    if records.is_empty() {
        return None;
    }
    metrics.moves_applied.inc_by(records.len() as u64);
    metrics.batches.inc();
    Some(encode_motion(motion_time(at_ms, unit_ms), &records))
}

/// A clustered room's batch for the tick at `at_ms`: the local moves cut for
/// it (`cut`, already applied and published) and the remote moves pending,
/// which are applied here. Local moves that came after the cut stay pending.
pub(super) fn collect_batch(
    members: &mut BTreeMap<MemberId, Member>,
    dirty: &mut Vec<MemberId>,
    cut: &mut Vec<MotionRecord>,
    at_ms: u64,
    records: &mut Vec<MotionRecord>,
) {
    records.append(cut);
    if dirty.is_empty() {
        return;
    }
    dirty.retain(|id| match members.get_mut(id) {
        Some(m) if m.origin.is_some() => {
            if let Some(motion) = m.pending.take() {
                m.motion = motion;
                m.moved_at_ms = at_ms;
                records.push(MotionRecord {
                    member: *id,
                    motion,
                });
            }
            false
        }
        Some(m) => m.pending.is_some(),
        None => false,
    });
}

/// What a tick task wrote, added to the shared counters once, when the task
/// is done (dropped), rather than once per room: tasks on every core
/// updating the same few counters for every room would contend on them.
pub(super) struct Tally {
    metrics: Arc<Metrics>,
    pub(super) frames: u64,
    pub(super) bytes: u64,
    moves: u64,
    batches: u64,
}

impl Tally {
    fn new(metrics: Arc<Metrics>) -> Self {
        Self {
            metrics,
            frames: 0,
            bytes: 0,
            moves: 0,
            batches: 0,
        }
    }
}

impl Clone for Tally {
    /// A fresh tally for another task (each shard gets a clone of the
    /// closure that holds it).
    fn clone(&self) -> Self {
        Self::new(Arc::clone(&self.metrics))
    }
}

impl Drop for Tally {
    fn drop(&mut self) {
        if self.batches == 0 {
            return;
        }
        self.metrics.frames_sent.inc_by(self.frames);
        self.metrics.bytes_sent.inc_by(self.bytes);
        self.metrics.moves_applied.inc_by(self.moves);
        self.metrics.batches.inc_by(self.batches);
    }
}
