//! Rooms and their members: the shared state of the server.
//!
//! [`Rooms`] holds every room in a `DashMap`; a room is created by its
//! first join and removed when its last member leaves. Each [`Room`] owns
//! its members behind a short-lived `std` mutex (never held across an
//! `.await`) and every member's [`Sink`], into which it writes each frame,
//! encoded once, itself. Moves are queued per
//! member (newest wins) and applied on the room's tick as one motion batch,
//! so a member receives at most one movement frame per tick however many
//! members moved. Joined, Left and chat frames go out at once.
//!
//! In cluster mode (`--nats`) a room also holds the members of other
//! nodes, as replicas kept by [`remote`]; they live in the same `State` as
//! local members (their `origin` says whose they are), so snapshots, ids,
//! capacity and batches see one room. Sinks stay local.
//!
//! A member may belong to an app's user (a token's `sub`): a room holds at
//! most one member per user, and a second join of the same user replaces
//! the first, whose connection is told through its sink
//! ([`Sink::removed`]). The app's backend can also take members out, list
//! them and speak to them (`admin`).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use dashmap::DashMap;

use crate::clock::Clock;
use crate::hooks::Hooks;
use crate::metrics::Metrics;
use crate::protocol::pb::server_message::Body;
use crate::protocol::{
    Changes, Data, DataError, LeaveReason, MemberId, Motion, MotionRecord, Position, Rules,
    encode_motion, encode_server, motion_time, pb,
};
use crate::room::resume::{Places, ResumeToken};
use crate::room::sink::{Frame, Removal, Sink};
pub use membership::Membership;

/// How rooms behave; taken from the server config.
#[derive(Clone, Debug)]
pub struct RoomSettings {
    /// Batch period; zero sends each move at once.
    pub tick: Duration,
    /// Tasks each tick shares the rooms out over; 0 means one per worker
    /// thread of the runtime the tick runs on.
    pub tick_workers: usize,
    /// Unit of truncated motion times, milliseconds.
    pub motion_time_unit_ms: u32,
    pub capacity: usize,
    /// The centre of the spot new members appear around.
    pub spawn: Position,
    /// World size in centimetres (spawn points stay inside).
    pub world: Position,
    /// Sent to every member in `Welcome`.
    pub limits: pb::Limits,
    /// How long the place of a member whose connection dropped is held
    /// for a resume (`--resume-grace-ms`); zero holds none.
    pub resume_grace: Duration,
    /// Places held at most on this node at once; a drop past it leaves at
    /// once.
    pub max_held: usize,
    /// Spatial rooms (area of interest), when any are configured.
    pub spatial: Option<spatial::SpatialSettings>,
}

/// Why a join failed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum JoinError {
    /// The room has `capacity` members already.
    #[error("room {room} is full ({capacity} members)")]
    RoomFull { room: String, capacity: usize },
    /// The server is shutting down.
    #[error("the server is shutting down")]
    ShuttingDown,
}

/// Every room of this server.
pub struct Rooms {
    map: DashMap<Arc<str>, Arc<Room>>,
    /// This, for tasks that outlive a call (a room's linger).
    this: std::sync::Weak<Rooms>,
    /// Cluster mode: set once at start; `None` costs one check.
    cluster: std::sync::OnceLock<Arc<crate::cluster::Cluster>>,
    /// Webhooks (`--webhook-url`): set once at start; events of this
    /// node's members are pushed into it, never waiting.
    hooks: std::sync::OnceLock<Arc<Hooks>>,
    /// The next member's seat: ids are reused, seats never are, so a
    /// replaced member's connection cannot act on whoever got its id.
    seats: AtomicU64,
    /// Cluster mode: the last opening of a room on this node (each opening
    /// takes the next, so a reopened room is told from the earlier one).
    openings: AtomicU64,
    settings: RoomSettings,
    clock: Clock,
    metrics: Arc<Metrics>,
    shutting_down: AtomicBool,
    /// Places held on this node now, in every room (under
    /// `settings.max_held`).
    held: AtomicUsize,
}

/// One room: its members' state, and the sinks its frames go to.
///
/// Two locks, taken in this order: `state` for what the room knows, and
/// `out` while frames are written. A publisher takes `out` before it lets
/// go of `state`, so frames go out in the order of the state changes that
/// made them, and moves arriving meanwhile only wait for the short `state`
/// sections, never for the sockets.
pub struct Room {
    name: Arc<str>,
    /// Its world, cm: a spatial room's, or the plain one.
    world: Position,
    /// Cluster mode: done once this node opened the room (subscribed and
    /// gathered the other nodes' parts).
    opened: tokio::sync::OnceCell<()>,
    state: Mutex<State>,
    out: Mutex<Out>,
}

/// Every member's sink, in join order.
struct Out {
    sinks: Vec<(MemberId, Arc<dyn Sink>)>,
}

impl Out {
    /// Hands `frame` to every member.
    fn publish(&self, frame: &Frame, metrics: &Metrics) {
        metrics.sent_to(self.write(frame), frame.len());
    }

    /// Hands `frame` to every member; returns how many (the caller counts).
    fn write(&self, frame: &Frame) -> usize {
        for (_, sink) in &self.sinks {
            sink.send(frame);
        }
        self.sinks.len()
    }

    /// Hands `frame` to the members in `to`; returns how many.
    fn write_to(&self, frame: &Frame, to: &std::collections::HashSet<MemberId>) -> usize {
        let mut n = 0;
        for (id, sink) in &self.sinks {
            if to.contains(id) {
                sink.send(frame);
                n += 1;
            }
        }
        n
    }

    fn sink(&self, id: MemberId) -> Option<&Arc<dyn Sink>> {
        self.sinks.iter().find(|(m, _)| *m == id).map(|(_, s)| s)
    }
}

struct State {
    members: BTreeMap<MemberId, Member>,
    /// Members that belong to an app user, by user id (one entry per such
    /// member, so bounded by the room's capacity).
    users: HashMap<Arc<str>, MemberId>,
    /// Members with a pending move, in arrival order (may repeat an id).
    dirty: Vec<MemberId>,
    /// When each of this node's members here joined, server time in ms
    /// (`Member` keeps seconds, to stay small): `member.left`'s
    /// `duration_ms`, and the webhooks hear when the count leaves and comes
    /// back to 0 (`Hooks::local_occupied`, `Hooks::local_vacated`).
    /// Bounded by the capacity, like `users`.
    local_since_ms: HashMap<MemberId, u64>,
    /// False once the last member left and the room left the map.
    open: bool,
    /// Cluster mode: the other nodes' parts and this node's publishing.
    remote: Option<Box<remote::Remote>>,
    /// Local members' resume tokens and held places.
    places: Places,
    /// A spatial room: who lives in which cell (`None`: a plain room,
    /// where everyone sees everyone).
    spatial: Option<Box<spatial::Spatial>>,
    /// Finds the whole room may make (each reads every name); made at the
    /// first.
    finds: Option<Box<crate::access::throttle::Gcra>>,
}

struct Member {
    /// Unique for the server's lifetime (see [`Rooms::seats`]) in its low
    /// 48 bits, which other nodes know ([`wire_seat`]); the high 16 bits
    /// count the resumes of the place ([`next_lease`]), so the connection
    /// a resume took it from can act on nothing.
    seat: u64,
    /// The app's user (a token's `sub`), if the server knows users. For
    /// another node's member: the user it shows (`share_user` is then set).
    user: Option<Arc<str>>,
    /// Whether `user` is shown to the room (`Member.user`): the token
    /// allowed it (claim `share_sub`).
    share_user: bool,
    /// Boxed: the tick walks members, so each is kept small.
    name: Box<str>,
    /// The app's data (a colour, a status), sorted by key. The tick never
    /// reads it.
    data: Data,
    motion: Motion,
    moved_at_ms: u64,
    /// The newest move not yet applied.
    pending: Option<Motion>,
    /// The node this member is connected to; `None`: this one.
    origin: Option<Arc<str>>,
    /// When it joined, seconds since the Unix epoch (for the server API;
    /// seconds, so that it fits beside `share_user` and the member stays
    /// within 128 bytes); for another node's member, when this node learnt
    /// of it.
    joined_at_s: u32,
}

/// Who joins: a display name, the app's user (a token's `sub`) if known,
/// and where to appear (`None`: the spawn rule).
#[derive(Clone, Debug, Default)]
pub struct Arrival {
    pub name: String,
    pub user: Option<Arc<str>>,
    pub start: Option<Position>,
    /// The member's data, the token's claims included.
    pub data: Data,
    /// The entries the token's `data` claim set: SetData cannot change them.
    pub claimed: Data,
    /// Whether the room may see `user` (the token's `share_sub` claim).
    pub share_user: bool,
    /// When the member's token expires (`Welcome.token_expires_at_ms`), ms
    /// since the Unix epoch; 0 without a token.
    pub token_expires_at_ms: u64,
    /// The Join's resume token: take back the place it names, if it is
    /// still held for this user (else the Join joins afresh).
    pub resume: Option<ResumeToken>,
}

/// A room name, how many members it has and how many it takes, for
/// `GET /api/rooms`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct RoomInfo {
    pub name: String,
    pub members: usize,
    pub capacity: usize,
}

impl Room {
    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves the state consistent: every
        // critical section writes whole values. So poisoning is ignored.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The sinks, to write to. Taken while holding `state` (see [`Room`]).
    fn out(&self) -> MutexGuard<'_, Out> {
        // A panic while writing leaves the list whole.
        self.out.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Writes `frame` to every member, after the state change under `st`.
    fn publish(&self, st: MutexGuard<'_, State>, frame: &Frame, metrics: &Metrics) {
        let out = self.out();
        drop(st);
        out.publish(frame, metrics);
    }

    /// Writes `frame`, about `subject`, to the members that see it (every
    /// member in a plain room), after the state change under `st`.
    fn publish_about(
        &self,
        st: MutexGuard<'_, State>,
        subject: MemberId,
        frame: &Frame,
        metrics: &Metrics,
    ) {
        let audience = st.audience(subject);
        let out = self.out();
        drop(st);
        match audience {
            None => out.publish(frame, metrics),
            Some(to) => metrics.sent_to(out.write_to(frame, &to), frame.len()),
        }
    }

    /// As [`publish`](Self::publish), counting into a tick's `tally`.
    fn publish_counted(&self, st: MutexGuard<'_, State>, frame: &Frame, tally: &mut tick::Tally) {
        let out = self.out();
        drop(st);
        tally.frames += out.write(frame) as u64;
        tally.bytes += (out.sinks.len() * frame.len()) as u64;
    }

    pub fn name(&self) -> &str {
        &self.name
    }
}

impl State {
    fn snapshot(&self, now_ms: u64) -> pb::Snapshot {
        pb::Snapshot {
            server_time_ms: now_ms,
            members: self
                .members
                .iter()
                .map(|(id, m)| member_pb(*id, m))
                .collect(),
        }
    }

    /// What `viewer` sees: in a spatial room the members in its view, by
    /// id; in a plain room everyone.
    fn snapshot_for(&self, viewer: MemberId, now_ms: u64) -> pb::Snapshot {
        let Some(home) = self.spatial.as_ref().and_then(|s| s.home(viewer)) else {
            return self.snapshot(now_ms);
        };
        let mut ids: Vec<MemberId> = self.spatial.iter().flat_map(|s| s.in_view(home)).collect();
        ids.sort_unstable();
        pb::Snapshot {
            server_time_ms: now_ms,
            members: ids
                .iter()
                .filter_map(|id| self.members.get(id).map(|m| member_pb(*id, m)))
                .collect(),
        }
    }

    /// Who is sent what happens to `subject`: `None` for everyone (a plain
    /// room), else the members that see it.
    fn audience(&self, subject: MemberId) -> Option<std::collections::HashSet<MemberId>> {
        let spatial = self.spatial.as_ref()?;
        let home = spatial.home(subject)?;
        Some(spatial.in_view(home).collect())
    }

    /// The lowest free id of `slot` among `slots` (one slot: ids 0, 1, 2...).
    fn lowest_free_id(&self, slot: u32, slots: u32) -> MemberId {
        if slots > 1 {
            return remote::lowest_free_in_slot(&self.members, slot, slots);
        }
        let mut next = 0;
        for id in self.members.keys() {
            if id.0 != next {
                break;
            }
            next += 1;
        }
        MemberId(next)
    }
}

/// Members a `Found` lists at most.
pub const FIND_PAGE: usize = 20;
/// Matches a `Found` counts at most (its `total` says "at least" past it).
pub const FIND_COUNT_CAP: u32 = 1_000;
/// Finds one room answers: one per interval, in bursts.
const ROOM_FIND_INTERVAL: Duration = Duration::from_millis(20);
const ROOM_FIND_BURST: u32 = 50;

/// A page of `members` whose name starts with `prefix` (ignoring case),
/// by id, after `cursor`; `total` counts every match, up to
/// [`FIND_COUNT_CAP`].
fn find_page(members: &BTreeMap<MemberId, Member>, prefix: &str, cursor: u32) -> pb::Found {
    let wanted = prefix.to_lowercase();
    let matches = |m: &Member| m.name.to_lowercase().starts_with(&wanted);
    let mut found = pb::Found {
        prefix: prefix.to_owned(),
        ..pb::Found::default()
    };
    for (id, m) in members {
        if !matches(m) {
            continue;
        }
        if found.total < FIND_COUNT_CAP {
            found.total += 1;
        }
        if id.0 <= cursor && cursor > 0 {
            continue;
        }
        if found.members.len() < FIND_PAGE {
            found.members.push(member_pb(*id, m));
        } else if found.next_cursor == 0 {
            found.next_cursor = found.members.last().map_or(0, |m| m.id);
        }
        if found.total >= FIND_COUNT_CAP && found.next_cursor != 0 {
            break;
        }
    }
    found
}

/// Bits of a member's seat below its lease: its seat as other nodes know it.
const LEASE_SHIFT: u32 = 48;

/// A member's seat as other nodes know it: without its lease (the count
/// of its resumes, which only this node's connections need to tell apart).
fn wire_seat(seat: u64) -> u64 {
    seat & ((1 << LEASE_SHIFT) - 1)
}

/// `seat` with the next lease: the same seat to other nodes, another to
/// this node's connections (wraps after 65,536 resumes of one place).
fn next_lease(seat: u64) -> u64 {
    seat.wrapping_add(1 << LEASE_SHIFT)
}

/// `ms` since the Unix epoch in whole seconds (a u32 holds them until 2106).
fn unix_secs(ms: u64) -> u32 {
    u32::try_from(ms / 1000).unwrap_or(u32::MAX)
}

/// Where member `id` appears: on a golden-angle spiral around the spawn
/// centre, so new arrivals do not stand on top of each other.
fn spawn_point(settings: &RoomSettings, id: MemberId) -> Position {
    spawn_around(settings.spawn, settings.world, id)
}

/// The spawn rule around `centre`, within `world`.
fn spawn_around(centre: Position, world: Position, id: MemberId) -> Position {
    const GOLDEN_ANGLE: f64 = 2.399_963_229_728_653;
    const SPACING_CM: f64 = 80.0;
    let n = f64::from(id.0);
    let (r, a) = (SPACING_CM * n.sqrt(), n * GOLDEN_ANGLE);
    let place = |centre: u32, offset: f64, max: u32| {
        // Clamped into the world, so the cast back cannot overflow.
        (f64::from(centre) + offset)
            .clamp(0.0, f64::from(max))
            .round() as u32
    };
    Position {
        x: place(centre.x, r * a.cos(), world.x),
        y: place(centre.y, r * a.sin(), world.y),
    }
}

fn member_pb(id: MemberId, m: &Member) -> pb::Member {
    pb::Member {
        id: id.0,
        name: m.name.to_string(),
        position: Some(m.motion.position.into()),
        walk: m.motion.walk.map(Into::into),
        moved_at_ms: m.moved_at_ms,
        data: m.data.to_pb(),
        user: match (&m.user, m.share_user) {
            (Some(user), true) => user.to_string(),
            _ => String::new(),
        },
    }
}

impl Rooms {
    pub fn new(settings: RoomSettings, clock: Clock, metrics: Arc<Metrics>) -> Arc<Self> {
        Arc::new_cyclic(|this| Self {
            map: DashMap::new(),
            this: this.clone(),
            cluster: std::sync::OnceLock::new(),
            hooks: std::sync::OnceLock::new(),
            seats: AtomicU64::new(0),
            openings: AtomicU64::new(0),
            settings,
            clock,
            metrics,
            shutting_down: AtomicBool::new(false),
            held: AtomicUsize::new(0),
        })
    }

    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// Sends this node's room and member events to `hooks` from now on
    /// (once, at start).
    pub fn attach_hooks(&self, hooks: Arc<Hooks>) {
        let _ = self.hooks.set(hooks);
    }

    /// The webhooks, if `--webhook-url` is set: the server API emits
    /// `member.kicked` through them.
    pub fn hooks(&self) -> Option<&Arc<Hooks>> {
        self.hooks.get()
    }

    /// Removes member `id` (in `seat`) from `room`; the others see
    /// `Left{reason}`.
    fn remove(&self, room: &Arc<Room>, id: MemberId, seat: u64, reason: LeaveReason) {
        let (now_empty, linger) = {
            let mut st = room.state();
            // Gone already (replaced), the id is someone else's now, or a
            // resume took the place to another connection.
            if st.members.get(&id).is_none_or(|m| m.seat != seat) {
                return;
            }
            let audience = st.audience(id);
            if let Some(sp) = st.spatial.as_deref_mut() {
                sp.forget(id);
            }
            if let Some(gone) = st.members.remove(&id) {
                if let Some(user) = &gone.user {
                    st.users.remove(user);
                }
                let since = st.local_since_ms.remove(&id);
                if let Some(hooks) = self.hooks.get() {
                    let now_ms = self.clock.now_ms();
                    hooks.left(
                        &room.name,
                        id.0,
                        &gone.name,
                        gone.user,
                        reason,
                        since.map_or(0, |t| now_ms.saturating_sub(t)),
                    );
                    if st.local_since_ms.is_empty() {
                        hooks.local_vacated(&room.name);
                    }
                }
            }
            if st.places.forget(id) {
                self.unheld();
            }
            let shutting_down = self.shutting_down.load(Ordering::Relaxed);
            let (now_empty, linger) = match self.cluster.get() {
                // The room stays while other nodes' members are in it, or
                // for the linger; `remote` decides.
                Some(cluster) => (
                    false,
                    remote::published_leave(cluster, &mut st, id, reason, shutting_down),
                ),
                None => {
                    let now_empty = st.members.is_empty();
                    if now_empty {
                        st.open = false;
                    }
                    (now_empty, None)
                }
            };
            let mut out = room.out();
            drop(st);
            out.sinks.retain(|(m, _)| *m != id);
            // At shutdown everyone is leaving: spare the n² Left frames.
            if !now_empty && !shutting_down {
                let left = encode_server(Body::Left(pb::Left {
                    member_id: id.0,
                    reason: reason as i32,
                }));
                match &audience {
                    None => out.publish(&left, &self.metrics),
                    Some(to) => self.metrics.sent_to(out.write_to(&left, to), left.len()),
                }
            }
            (now_empty, linger)
        };
        self.metrics.members.dec();
        if now_empty {
            // The room lock is released: the map lock is never taken under it.
            self.forget(room);
        }
        if let Some(generation) = linger {
            self.linger(room, generation);
        }
    }

    /// Takes a closed room out of the map, if it is still there.
    fn forget(&self, room: &Arc<Room>) {
        if self
            .map
            .remove_if(&room.name, |_, r| Arc::ptr_eq(r, room))
            .is_some()
        {
            self.metrics.rooms.dec();
        }
    }

    /// Queues `motion` as `id`'s newest move; with a zero tick it is applied
    /// and sent at once.
    fn submit(&self, room: &Room, id: MemberId, seat: u64, motion: Motion) {
        let mut st = room.state();
        let State {
            members,
            dirty,
            remote,
            ..
        } = &mut *st;
        let Some(member) = members.get_mut(&id).filter(|m| m.seat == seat) else {
            return;
        };
        if self.settings.tick.is_zero() {
            // On the motion time unit, so `moved_at_ms` equals the batch time.
            let unit = u64::from(self.settings.motion_time_unit_ms.max(1));
            let now_ms = self.clock.now_ms() / unit * unit;
            member.motion = motion;
            member.moved_at_ms = now_ms;
            if let (Some(cluster), Some(r)) = (self.cluster.get(), remote.as_deref_mut()) {
                remote::published_moves_now(
                    cluster,
                    r,
                    now_ms,
                    MotionRecord { member: id, motion },
                );
            }
            let time = motion_time(now_ms, self.settings.motion_time_unit_ms);
            let frame = encode_motion(time, &[MotionRecord { member: id, motion }]);
            room.publish(st, &frame, &self.metrics);
            self.metrics.moves_applied.inc();
            self.metrics.batches.inc();
            return;
        }
        if member.pending.replace(motion).is_some() {
            self.metrics.moves_coalesced.inc();
        } else {
            dirty.push(id);
        }
    }

    /// Stops new joins and quiets leave notices; connections then close.
    pub fn begin_shutdown(&self) {
        self.shutting_down.store(true, Ordering::Relaxed);
    }

    /// The spatial settings `room` has, if it is a spatial room.
    fn spatial_settings(&self, room: &str) -> Option<&spatial::SpatialSettings> {
        self.settings.spatial.as_ref().filter(|s| s.matches(room))
    }

    /// Whether `room` is a spatial room (area of interest).
    pub fn is_spatial(&self, room: &str) -> bool {
        self.spatial_settings(room).is_some()
    }

    /// How many members `room` holds at most.
    pub fn capacity_of(&self, room: &str) -> usize {
        self.spatial_settings(room)
            .map_or(self.settings.capacity, |s| s.capacity)
    }

    /// The world of `room` (a spatial room's, or the plain one), cm.
    pub fn world_of(&self, room: &str) -> Position {
        self.spatial_settings(room)
            .map_or(self.settings.world, |s| s.world)
    }

    /// Rooms by name with their member counts.
    pub fn list(&self) -> Vec<RoomInfo> {
        let rooms: Vec<Arc<Room>> = self.map.iter().map(|r| Arc::clone(r.value())).collect();
        let mut list: Vec<RoomInfo> = rooms
            .iter()
            .map(|r| RoomInfo {
                name: r.name.to_string(),
                members: r.state().members.len(),
                capacity: self.capacity_of(&r.name),
            })
            .filter(|r| r.members > 0)
            .collect();
        list.sort_by(|a, b| a.name.cmp(&b.name));
        list
    }
}

/// Runs `publish`, which writes room frames into members' sockets, outside
/// tokio's cooperative budget. Within the budget only the first 128 socket
/// operations of a task's turn go through and every later write is refused
/// as if the socket were full, so a tick's frames would queue and wake every
/// member's task, the very cost writing directly avoids. The work is
/// bounded anyway: one write per member per frame. This is why every public
/// way into a room that may write (join, submit, chat, resync, leave) is
/// async; only a `Membership` dropped without `leave` writes its `Left`
/// within the dropping task's budget.
async fn fan_out<T>(publish: impl FnOnce() -> T) -> T {
    tokio::task::unconstrained(async move { publish() }).await
}

pub mod admin;
mod grid;
mod hold;
pub mod interest;
mod join;
mod membership;
mod remote;
pub mod resume;
pub mod sink;
pub mod spatial;
mod tick;

#[cfg(test)]
mod tests;
