//! Cluster mode in a room: the other nodes' members, and what this node
//! tells them.
//!
//! Each node is the single writer of its own members. A room's [`State`]
//! holds them all; [`Remote`] keeps, per other node, the ids it owns here
//! and the sequence number of its updates, so a gap, an unknown node or a
//! new epoch is repaired by a full state of that node's part (asked with a
//! `SyncRequest`). Remote joins, leaves and chat are written to the local
//! sinks at once, like local ones; remote moves become pending moves, so the
//! next tick's one frame per member carries local and remote moves alike.
//!
//! This node publishes its own joins, leaves and chat at once, and its
//! members' moves once per tick, cut `--cluster-lead-ms` before the tick
//! ([`Rooms::run_cutter`]). Every publication is a non-blocking push into
//! the cluster's bounded queue, made under the room's `state` lock so that
//! sequence numbers follow the state changes; NATS is never awaited here.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, MutexGuard};

use async_nats::Subject;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use super::grid::TickGrid;
use super::{Member, Room, Rooms, State, fan_out, member_pb};
use crate::cluster::wire::{self, Op, RemoteMember, Update, UpdateParts};
use crate::cluster::{Cluster, RoomSide};
use crate::metrics::Metrics;
use crate::protocol::pb::server_message::Body;
use crate::protocol::{
    LeaveReason, MemberId, MotionRecord, encode_motion, encode_server, motion_time, pb,
};
use crate::room::sink::Frame;

/// Updates held per node and room while waiting for its full state...
const MAX_BUFFERED: usize = 64;
/// ...and their size at most (see [`held_size`]); past either, the oldest
/// go (the full state, asked when the first was held, most likely covers
/// them; the newest are what must follow it).
const MAX_BUFFERED_BYTES: usize = 256 * 1024;
/// A node is asked for a full state of a room at most this often; parts
/// still waiting for one are swept (asked again) this often too.
const ASK_EVERY: std::time::Duration = std::time::Duration::from_secs(1);
/// Sweeps (one a second) without an update from this node in a room with
/// local members before it publishes a beacon there.
const BEACON_AFTER_SWEEPS: u32 = 5;

/// A room's cluster state on this node.
pub(super) struct Remote {
    /// `P.r.<room>`.
    subject: Subject,
    /// This opening of the room on this node (`RoomUpdate.incarnation`).
    incarnation: u64,
    /// This node's last sequence number in this room (in this opening).
    seq: u64,
    /// Members connected to this node.
    local: usize,
    /// Whether the opening snapshot has been applied.
    opened: bool,
    /// Other nodes' parts, by node name.
    parts: HashMap<Arc<str>, Part>,
    /// Local moves cut for the coming tick: applied, published, and written
    /// in that tick's batch.
    pub(super) cut: Vec<MotionRecord>,
    /// The last tick whose batch this room wrote (late remote moves are
    /// those cut for it or before; a tick written early is not written
    /// again).
    pub(super) last_flush_ms: u64,
    /// Bumped each time the last local member leaves: a linger that finds
    /// it changed does nothing.
    linger: u64,
    /// Whether this node published here since the last sweep.
    published: bool,
    /// Sweeps since this node last published here.
    quiet_sweeps: u32,
}

/// One other node's part of a room.
struct Part {
    epoch: u64,
    /// The node's opening of the room this part follows.
    incarnation: u64,
    /// The last sequence number applied.
    seq: u64,
    /// False until a full state arrived (and again after a gap).
    synced: bool,
    ids: BTreeSet<MemberId>,
    /// Updates that came while waiting for a full state.
    buffered: Vec<Update>,
    /// Their size, by [`held_size`].
    buffered_bytes: usize,
    asked: Option<Instant>,
}

impl Part {
    fn new(epoch: u64, incarnation: u64) -> Self {
        Self {
            epoch,
            incarnation,
            seq: 0,
            synced: false,
            ids: BTreeSet::new(),
            buffered: Vec::new(),
            buffered_bytes: 0,
            asked: None,
        }
    }

    /// Holds `u` until the full state, dropping the oldest held past the
    /// bounds.
    fn hold(&mut self, u: Update) {
        self.buffered_bytes += held_size(&u);
        self.buffered.push(u);
        while self.buffered.len() > MAX_BUFFERED || self.buffered_bytes > MAX_BUFFERED_BYTES {
            let old = self.buffered.remove(0);
            self.buffered_bytes = self.buffered_bytes.saturating_sub(held_size(&old));
        }
    }

    /// Whether to ask the node for a full state now (not while the room is
    /// opening: its snapshot is on the way).
    fn ask_due(&mut self, opened: bool) -> bool {
        if !opened || self.asked.is_some_and(|at| at.elapsed() < ASK_EVERY) {
            return false;
        }
        self.asked = Some(Instant::now());
        true
    }
}

impl Remote {
    pub(super) fn new(subject: Subject, incarnation: u64) -> Self {
        Self {
            subject,
            incarnation,
            seq: 0,
            local: 0,
            opened: false,
            parts: HashMap::new(),
            cut: Vec::new(),
            last_flush_ms: 0,
            linger: 0,
            published: false,
            quiet_sweeps: 0,
        }
    }

    /// Publishes the next update of this node's part.
    fn publish(&mut self, cluster: &Cluster, mut parts: UpdateParts<'_>) {
        self.seq += 1;
        parts.seq = self.seq;
        parts.incarnation = self.incarnation;
        self.published = true;
        cluster.publish(
            self.subject.clone(),
            wire::encode_update(cluster.origin_pb(), parts),
        );
    }

    fn publish_ops(&mut self, cluster: &Cluster, ops: Vec<wire::cpb::Op>) {
        self.publish(
            cluster,
            UpdateParts {
                ops,
                ..Default::default()
            },
        );
    }

    /// Forgets a cut move of local member `id`, who left or was replaced:
    /// its move must not reach local members after its `Left`, nor land on
    /// whoever gets its id next. (Other nodes had the move before the
    /// `Left`, so they see them in order.)
    fn uncut(&mut self, id: MemberId) {
        self.cut.retain(|c| c.member != id);
    }
}

/// About how much memory a held update takes.
fn held_size(u: &Update) -> usize {
    let ops: usize = u
        .ops
        .iter()
        .map(|op| match op {
            Op::Joined(m) => m.name.len(),
            Op::Chat { text, .. } => text.len(),
            Op::Left { .. } => 0,
        })
        .sum();
    std::mem::size_of::<Update>()
        + ops
        + u.ops.len() * std::mem::size_of::<Op>()
        + u.motion.len() * std::mem::size_of::<MotionRecord>()
}

/// The lowest id `index * slots + slot` not in `members`.
pub(super) fn lowest_free_in_slot(
    members: &BTreeMap<MemberId, Member>,
    slot: u32,
    slots: u32,
) -> MemberId {
    // Members are bounded by the room capacity, far below u32::MAX / slots.
    (0..u32::MAX)
        .map_while(|i| i.checked_mul(slots).and_then(|v| v.checked_add(slot)))
        .map(MemberId)
        .find(|id| !members.contains_key(id))
        .unwrap_or(MemberId(u32::MAX))
}

/// A local member joined (replacing `replaced`, the same user's older
/// member): tell the other nodes.
pub(super) fn published_join(
    cluster: &Cluster,
    st: &mut State,
    replaced: Option<MemberId>,
    joined: pb::Member,
) {
    let Some(r) = st.remote.as_deref_mut() else {
        return;
    };
    let mut ops = Vec::with_capacity(2);
    match replaced {
        Some(old) => {
            r.uncut(old);
            ops.push(wire::left_op(old, LeaveReason::Replaced));
        }
        None => r.local += 1,
    }
    ops.push(wire::joined_op(joined));
    r.publish_ops(cluster, ops);
}

/// A local member left: tell the other nodes. Returns the linger
/// generation when it was the last local member.
pub(super) fn published_leave(
    cluster: &Cluster,
    st: &mut State,
    id: MemberId,
    reason: LeaveReason,
    shutting_down: bool,
) -> Option<u64> {
    let r = st.remote.as_deref_mut()?;
    r.local = r.local.saturating_sub(1);
    r.uncut(id);
    // At shutdown the goodbye heartbeat removes every member at once.
    if shutting_down {
        return None;
    }
    r.publish_ops(cluster, vec![wire::left_op(id, reason)]);
    (r.local == 0).then(|| {
        r.linger += 1;
        r.linger
    })
}

/// With a zero tick, a local move goes out at once.
pub(super) fn published_moves_now(
    cluster: &Cluster,
    r: &mut Remote,
    now_ms: u64,
    record: MotionRecord,
) {
    r.publish(
        cluster,
        UpdateParts {
            tick_ms: now_ms,
            motion: &[record],
            ..Default::default()
        },
    );
}

/// A local member chatted: tell the other nodes.
pub(super) fn published_chat(cluster: &Cluster, st: &mut State, chat: pb::ChatMessage) {
    if let Some(r) = st.remote.as_deref_mut() {
        r.publish_ops(cluster, vec![wire::chat_op(chat)]);
    }
}

/// Removes `ids` (members of `node`) with `Left{reason}` frames.
fn remove_ids(
    members: &mut BTreeMap<MemberId, Member>,
    node: &str,
    ids: &BTreeSet<MemberId>,
    reason: LeaveReason,
    frames: &mut Vec<Frame>,
    metrics: &Metrics,
) {
    for id in ids {
        if members
            .get(id)
            .is_some_and(|m| m.origin.as_deref() == Some(node))
        {
            members.remove(id);
            metrics.cluster_remote_members.dec();
            frames.push(encode_server(Body::Left(pb::Left {
                member_id: id.0,
                reason: reason as i32,
            })));
        }
    }
}

/// What applying an update needs besides the room's state.
struct Apply<'a> {
    metrics: &'a Metrics,
    /// A node's part holds at most the room capacity.
    capacity: usize,
    node: &'a Arc<str>,
    frames: &'a mut Vec<Frame>,
    /// The room's local moves cut for the coming tick.
    cut: &'a mut Vec<MotionRecord>,
    /// The last tick whose batch the room wrote.
    last_flush_ms: &'a mut u64,
    /// Server time now, the tick and the motion time unit, for a batch
    /// written ahead of its tick ([`Apply::follow_moves`]).
    now_ms: u64,
    tick_ms: u64,
    unit: u32,
    /// Moves go out at once (a zero tick), at this server time.
    at_once: Option<(u64, u32)>,
}

impl Apply<'_> {
    /// Adds remote member `m`, or updates it if known.
    fn add(
        &mut self,
        members: &mut BTreeMap<MemberId, Member>,
        dirty: &mut Vec<MemberId>,
        ids: &mut BTreeSet<MemberId>,
        m: RemoteMember,
    ) {
        match members.get_mut(&m.id) {
            Some(known) if known.origin.as_deref() == Some(&**self.node) => {
                if known.motion != m.motion && known.pending.replace(m.motion).is_none() {
                    dirty.push(m.id);
                }
            }
            Some(_) => {
                // Two live nodes share a slot, and their joins raced.
                self.metrics.cluster_id_conflicts.inc();
            }
            None if ids.len() >= self.capacity => {
                // More than a room holds from one node: not trusted.
                self.metrics.cluster_bad_messages.inc();
            }
            None => {
                let member = Member {
                    seat: u64::MAX,
                    user: None,
                    name: m.name,
                    motion: m.motion,
                    moved_at_ms: m.moved_at_ms,
                    pending: None,
                    origin: Some(Arc::clone(self.node)),
                };
                self.frames.push(encode_server(Body::Joined(pb::Joined {
                    member: Some(member_pb(m.id, &member)),
                })));
                members.insert(m.id, member);
                ids.insert(m.id);
                self.metrics.cluster_remote_members.inc();
            }
        }
    }

    /// Before a remote member's chat or leave is written: if the member has
    /// a move waiting for this node's tick, writes that tick's batch now
    /// (the same batch the tick would write, and the tick then writes
    /// nothing), so the chat or leave follows the member's moves here as it
    /// did on its own node. Without this, a chat sent right after a move
    /// could reach this node's members before the move, whenever this
    /// node's tick runs a little after the origin's.
    fn follow_moves(
        &mut self,
        members: &mut BTreeMap<MemberId, Member>,
        dirty: &mut Vec<MemberId>,
        id: MemberId,
    ) {
        if self.at_once.is_some()
            || self.tick_ms == 0
            || members.get(&id).is_none_or(|m| m.pending.is_none())
        {
            return;
        }
        // The tick the move waits for: the current one unless written.
        let tick = self.now_ms / self.tick_ms * self.tick_ms;
        let at_ms = tick.max(*self.last_flush_ms + self.tick_ms);
        *self.last_flush_ms = at_ms;
        let mut records = Vec::new();
        super::tick::collect_batch(members, dirty, self.cut, at_ms, &mut records);
        if records.is_empty() {
            return;
        }
        self.frames
            .push(encode_motion(motion_time(at_ms, self.unit), &records));
        self.metrics.moves_applied.inc_by(records.len() as u64);
        self.metrics.batches.inc();
    }

    fn owns(&self, members: &BTreeMap<MemberId, Member>, id: MemberId) -> bool {
        members
            .get(&id)
            .is_some_and(|m| m.origin.as_deref() == Some(&**self.node))
    }

    /// Applies a delta: ops in order, then moves.
    fn delta(
        &mut self,
        members: &mut BTreeMap<MemberId, Member>,
        dirty: &mut Vec<MemberId>,
        ids: &mut BTreeSet<MemberId>,
        u: Update,
    ) {
        for op in u.ops {
            match op {
                Op::Joined(m) => self.add(members, dirty, ids, m),
                Op::Left { id, reason } => {
                    if self.owns(members, id) {
                        self.follow_moves(members, dirty, id);
                        members.remove(&id);
                        ids.remove(&id);
                        self.metrics.cluster_remote_members.dec();
                        self.frames.push(encode_server(Body::Left(pb::Left {
                            member_id: id.0,
                            reason: reason as i32,
                        })));
                    }
                }
                Op::Chat {
                    id,
                    text,
                    server_time_ms,
                } => {
                    if self.owns(members, id) {
                        self.follow_moves(members, dirty, id);
                        self.frames.push(encode_server(Body::Chat(pb::ChatMessage {
                            member_id: id.0,
                            text,
                            server_time_ms,
                        })));
                    }
                }
            }
        }
        self.moves(members, dirty, u.tick_ms, &u.motion);
    }

    fn moves(
        &mut self,
        members: &mut BTreeMap<MemberId, Member>,
        dirty: &mut Vec<MemberId>,
        tick_ms: u64,
        records: &[MotionRecord],
    ) {
        let mut now = Vec::new();
        for r in records {
            let Some(m) = members
                .get_mut(&r.member)
                .filter(|m| m.origin.as_deref() == Some(&**self.node))
            else {
                continue;
            };
            self.metrics.cluster_remote_moves.inc();
            if let Some((now_ms, _)) = self.at_once {
                m.motion = r.motion;
                m.moved_at_ms = now_ms;
                now.push(*r);
                continue;
            }
            if tick_ms <= *self.last_flush_ms {
                self.metrics.cluster_remote_moves_late.inc();
            }
            if m.pending.replace(r.motion).is_none() {
                dirty.push(r.member);
            }
        }
        if let (Some((now_ms, unit)), false) = (self.at_once, now.is_empty()) {
            self.frames
                .push(encode_motion(motion_time(now_ms, unit), &now));
            self.metrics.moves_applied.inc_by(now.len() as u64);
            self.metrics.batches.inc();
        }
    }

    /// Replaces the node's part with full state `u`.
    fn full(
        &mut self,
        members: &mut BTreeMap<MemberId, Member>,
        dirty: &mut Vec<MemberId>,
        ids: &mut BTreeSet<MemberId>,
        u: Update,
    ) {
        let mut joined = Vec::with_capacity(u.ops.len());
        for op in u.ops {
            if let Op::Joined(m) = op {
                joined.push(m);
            }
        }
        let keep: BTreeSet<MemberId> = joined.iter().map(|m| m.id).collect();
        let gone: BTreeSet<MemberId> = ids.difference(&keep).copied().collect();
        remove_ids(
            members,
            self.node,
            &gone,
            LeaveReason::Left,
            self.frames,
            self.metrics,
        );
        ids.retain(|id| keep.contains(id));
        for m in joined {
            self.add(members, dirty, ids, m);
        }
        self.moves(members, dirty, u.tick_ms, &u.motion);
    }
}

impl Rooms {
    /// The cluster, in cluster mode.
    pub(super) fn cluster(&self) -> Option<&Arc<Cluster>> {
        self.cluster.get()
    }

    /// Turns cluster mode on: call once, before the first join.
    pub fn attach_cluster(self: &Arc<Self>, cluster: Arc<Cluster>) {
        let side: Arc<dyn RoomSide> = Arc::clone(self) as Arc<dyn RoomSide>;
        cluster.attach(Arc::downgrade(&side));
        let _ = self.cluster.set(cluster);
    }

    /// Joins in cluster mode: the first join of a room on this node opens
    /// it (subscribe, gather the other nodes' parts); the others wait for
    /// that and then join from the replica.
    pub(super) async fn join_clustered(
        self: &Arc<Self>,
        cluster: &Arc<Cluster>,
        room: &str,
        name: String,
        user: Option<Arc<str>>,
        sink: Arc<dyn crate::room::sink::Sink>,
    ) -> Result<super::Membership, super::JoinError> {
        let mut args = Some((name, user, sink));
        loop {
            if self
                .shutting_down
                .load(std::sync::atomic::Ordering::Relaxed)
            {
                return Err(super::JoinError::ShuttingDown);
            }
            let handle = self.handle(room);
            // Until the member is in: a join given up (its future dropped
            // during the opening) or refused leaves the room to linger.
            let mut abandoned = Abandoned {
                rooms: self,
                room: Some(Arc::clone(&handle)),
            };
            handle
                .opened
                .get_or_init(|| async {
                    let fulls = cluster.open(room).await;
                    fan_out(|| self.apply_opening(&handle, fulls)).await;
                })
                .await;
            let joined = fan_out(|| {
                let st = handle.state();
                if !st.open {
                    drop(st);
                    self.forget(&handle);
                    return None;
                }
                let (name, user, sink) = args.take()?;
                Some(self.join_locked(&handle, st, name, user, sink))
            })
            .await;
            match joined {
                Some(Err(refused)) => return Err(refused),
                Some(result) => {
                    abandoned.room = None;
                    return result;
                }
                // Closed meanwhile: nothing to linger for.
                None => abandoned.room = None,
            }
        }
    }

    /// A join that did not happen (refused as the room is full of other
    /// nodes' members, or given up during the opening): if this node has
    /// nobody there, the room lingers and closes like after a leave, rather
    /// than staying subscribed for ever.
    fn abandoned_join(&self, room: &Arc<Room>) {
        let generation = {
            let mut st = room.state();
            let Some(r) = st.remote.as_deref_mut() else {
                return;
            };
            if r.local > 0 {
                return;
            }
            r.linger += 1;
            r.linger
        };
        self.linger(room, generation);
    }

    /// Applies the full states gathered when this node opened `room`, then
    /// asks the nodes whose part is still missing.
    fn apply_opening(&self, room: &Arc<Room>, fulls: Vec<Update>) {
        let Some(cluster) = self.cluster() else {
            return;
        };
        let mut frames = Vec::new();
        let mut st = room.state();
        for u in fulls {
            self.apply_locked(&mut st, u, &mut frames);
        }
        let mut ask = Vec::new();
        if let Some(r) = st.remote.as_deref_mut() {
            r.opened = true;
            for (node, part) in &mut r.parts {
                if !part.synced && part.ask_due(true) {
                    ask.push(Arc::clone(node));
                }
            }
        }
        publish_all(room, st, &frames, &self.metrics);
        for node in ask {
            cluster.request_sync(&node, vec![room.name().to_owned()]);
        }
    }

    /// Applies update `u` to the locked room; returns the node to ask for a
    /// full state, if any.
    fn apply_locked(
        &self,
        st: &mut MutexGuard<'_, State>,
        u: Update,
        frames: &mut Vec<Frame>,
    ) -> Option<Arc<str>> {
        let State {
            members,
            dirty,
            remote,
            ..
        } = &mut **st;
        let Remote {
            parts,
            cut,
            last_flush_ms,
            opened,
            ..
        } = remote.as_deref_mut()?;
        let node = Arc::clone(&u.origin.node);
        let now_ms = self.clock.now_ms();
        let mut apply = Apply {
            metrics: &self.metrics,
            capacity: self.settings.capacity,
            node: &node,
            frames,
            cut,
            last_flush_ms,
            now_ms,
            tick_ms: u64::try_from(self.settings.tick.as_millis()).unwrap_or(u64::MAX),
            unit: self.settings.motion_time_unit_ms,
            at_once: self.settings.tick.is_zero().then(|| {
                let unit = self.settings.motion_time_unit_ms;
                let step = u64::from(unit.max(1));
                (now_ms / step * step, unit)
            }),
        };
        // A new epoch of a known node: its previous run's members go now.
        if parts.get(&node).is_some_and(|p| p.epoch != u.origin.epoch)
            && let Some(old) = parts.remove(&node)
        {
            remove_ids(
                members,
                &node,
                &old.ids,
                LeaveReason::ServerLost,
                apply.frames,
                apply.metrics,
            );
        }
        // Another opening of the room on that node: an earlier one is stale;
        // a later one replaces the part (the earlier opening's members are
        // gone, and the `closed` that said so may have been lost).
        let later_opening = match parts.get(&node).map(|p| p.incarnation) {
            Some(held) if u.origin.incarnation < held => return None,
            Some(held) => u.origin.incarnation > held,
            None => false,
        };
        if (later_opening || u.closed)
            && let Some(old) = parts.remove(&node)
        {
            remove_ids(
                members,
                &node,
                &old.ids,
                LeaveReason::Left,
                apply.frames,
                apply.metrics,
            );
        }
        if u.closed {
            return None;
        }
        let opened = *opened;
        // A part only for a live peer (a message that raced the node's
        // expiry, or a name flood, makes none).
        if !parts.contains_key(&node)
            && (parts.len() >= crate::cluster::directory::MAX_PEERS
                || !self
                    .cluster()
                    .is_some_and(|c| c.is_live(&node, u.origin.epoch)))
        {
            apply.metrics.cluster_bad_messages.inc();
            return None;
        }
        let part = parts
            .entry(Arc::clone(&node))
            .or_insert_with(|| Part::new(u.origin.epoch, u.origin.incarnation));
        if u.full && u.seq < part.seq {
            // Older than what is applied (a delayed answer): it would rewind.
            return (!part.synced && part.ask_due(opened)).then_some(node);
        }
        if u.full {
            tracing::debug!(target: "amble::cluster", %node, seq = u.seq, opened, "cluster: full state");
            if opened {
                apply.metrics.cluster_resyncs.inc();
            }
            part.seq = u.seq;
            part.synced = true;
            part.asked = None;
            apply.full(members, dirty, &mut part.ids, u);
            // What came meanwhile, in order: after the full state, until a gap.
            let mut buffered = std::mem::take(&mut part.buffered);
            part.buffered_bytes = 0;
            buffered.sort_by_key(|b| b.seq);
            let mut rest = buffered.into_iter();
            for b in rest.by_ref() {
                if b.seq <= part.seq {
                    continue;
                }
                if b.seq == part.seq + 1 {
                    part.seq = b.seq;
                    apply.delta(members, dirty, &mut part.ids, b);
                } else {
                    part.synced = false;
                    part.hold(b);
                    break;
                }
            }
            for b in rest {
                part.hold(b);
            }
            if !part.synced && part.ask_due(opened) {
                return Some(node);
            }
            return None;
        }
        let beacon = u.is_beacon();
        if !part.synced
            && !beacon
            && part.seq == 0
            && u.seq == 1
            && u.origin.incarnation > 0
            && part.ids.is_empty()
            && part.buffered.is_empty()
        {
            // The first update of an opening: before it the node had nobody
            // here, so the part is known (empty) without a full state.
            part.synced = true;
            part.asked = None;
        }
        if !part.synced || u.seq > part.seq + 1 {
            // Unknown part, or a gap: wait for a full state.
            tracing::debug!(
                target: "amble::cluster",
                %node,
                seq = u.seq,
                have = part.seq,
                synced = part.synced,
                "cluster: waiting for a full state of a node's part"
            );
            part.synced = false;
            if beacon {
                // Nothing to hold: it only said what was missed.
            } else {
                part.hold(u);
            }
            return part.ask_due(opened).then_some(node);
        }
        if u.seq <= part.seq {
            return None;
        }
        if beacon {
            // The node's last update (seq part.seq + 1) was lost.
            part.synced = false;
            return part.ask_due(opened).then_some(node);
        }
        part.seq = u.seq;
        apply.delta(members, dirty, &mut part.ids, u);
        None
    }

    /// Cuts room `room`'s local moves for the tick at `tick_ms`: applies
    /// them, keeps them for that tick's batch, and publishes them.
    pub(super) fn cut(&self, room: &Room, tick_ms: u64) {
        let Some(cluster) = self.cluster() else {
            return;
        };
        let mut st = room.state();
        let State {
            members,
            dirty,
            remote,
            ..
        } = &mut *st;
        let Some(r) = remote.as_deref_mut() else {
            return;
        };
        if dirty.is_empty() {
            return;
        }
        let cut = &mut r.cut;
        // Moves cut before a tick that has not come yet (a skipped tick),
        // by member: a newer move replaces the older. Usually none (no
        // allocation); looked up in O(1) either way.
        let earlier: HashMap<MemberId, usize> =
            cut.iter().enumerate().map(|(i, c)| (c.member, i)).collect();
        let mut changed = false;
        dirty.retain(|id| match members.get_mut(id) {
            Some(m) if m.origin.is_none() => {
                if let Some(motion) = m.pending.take() {
                    m.motion = motion;
                    m.moved_at_ms = tick_ms;
                    changed = true;
                    match earlier.get(id) {
                        Some(&i) => cut[i].motion = motion,
                        None => cut.push(MotionRecord {
                            member: *id,
                            motion,
                        }),
                    }
                }
                false
            }
            Some(_) => true,
            None => false,
        });
        if !changed {
            return;
        }
        let records = std::mem::take(&mut r.cut);
        r.publish(
            cluster,
            UpdateParts {
                tick_ms,
                motion: &records,
                ..Default::default()
            },
        );
        r.cut = records;
    }

    /// Once a second per room: asks again the nodes whose full state is
    /// still missing (a lost request or answer), and publishes a beacon when
    /// this node has members here and published nothing for a while.
    pub(super) fn sweep(&self, room: &Room) {
        let Some(cluster) = self.cluster() else {
            return;
        };
        let mut ask = Vec::new();
        {
            let mut st = room.state();
            if !st.open {
                return;
            }
            let Some(r) = st.remote.as_deref_mut().filter(|r| r.opened) else {
                return;
            };
            for (node, part) in &mut r.parts {
                if !part.synced && part.ask_due(true) {
                    ask.push(Arc::clone(node));
                }
            }
            if std::mem::take(&mut r.published) || r.local == 0 {
                r.quiet_sweeps = 0;
            } else {
                r.quiet_sweeps += 1;
            }
            if r.quiet_sweeps >= BEACON_AFTER_SWEEPS {
                // The current seq again, not a new one: a node that missed
                // this node's last update in a quiet room sees the gap.
                r.quiet_sweeps = 0;
                cluster.publish(
                    r.subject.clone(),
                    wire::encode_update(
                        cluster.origin_pb(),
                        UpdateParts {
                            incarnation: r.incarnation,
                            seq: r.seq,
                            ..Default::default()
                        },
                    ),
                );
            }
        }
        for node in ask {
            cluster.request_sync(&node, vec![room.name().to_owned()]);
        }
    }

    /// Cuts every room's local moves `--cluster-lead-ms` before each tick,
    /// until `shutdown`, so other nodes get them in time for the same tick;
    /// and sweeps every room once a second ([`sweep`](Self::sweep)).
    pub async fn run_cutter(self: Arc<Self>, shutdown: CancellationToken) {
        let Some(cluster) = self.cluster().cloned() else {
            return;
        };
        let Ok(tick_ms) = u64::try_from(self.settings.tick.as_millis()) else {
            return;
        };
        let workers = match self.settings.tick_workers {
            0 => tokio::runtime::Handle::try_current().map_or(1, |h| h.metrics().num_workers()),
            n => n,
        }
        .max(1);
        if tick_ms == 0 {
            // Moves go out at once: only the sweeps.
            let mut interval = tokio::time::interval(ASK_EVERY);
            interval.set_missed_tick_behavior(MissedTickBehavior::Skip);
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    _ = interval.tick() => {
                        self.each_room_sharded(workers, |rooms, room| rooms.sweep(room)).await;
                    }
                }
            }
        }
        let sweep_every = (1_000 / tick_ms).max(1);
        let mut cuts: u64 = 0;
        let lead_ms = u64::try_from(cluster.settings.lead.as_millis()).unwrap_or(0);
        let Some(grid) = TickGrid::new(tick_ms, lead_ms) else {
            return;
        };
        let first = self
            .clock
            .instant_at(grid.cut_before(grid.next_tick(self.clock.now_ms())));
        let mut interval = tokio::time::interval_at(first, self.settings.tick);
        interval.set_missed_tick_behavior(MissedTickBehavior::Skip);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                at = interval.tick() => {
                    let tick = grid.tick_after_cut(self.clock.ms_at(at));
                    cuts += 1;
                    let sweep = cuts.is_multiple_of(sweep_every);
                    self.each_room_sharded(workers, move |rooms, room| {
                        rooms.cut(room, tick);
                        if sweep {
                            rooms.sweep(room);
                        }
                    })
                    .await;
                }
            }
        }
    }

    /// After the linger, closes `room` on this node if it still has no
    /// local member: tells the others, unsubscribes, forgets the replica.
    pub(super) fn linger(&self, room: &Arc<Room>, generation: u64) {
        let Some(cluster) = self.cluster() else {
            return;
        };
        let delay = cluster.settings.linger;
        match tokio::runtime::Handle::try_current() {
            Ok(rt) if !delay.is_zero() => {
                let (rooms, room) = (self.this.clone(), Arc::clone(room));
                rt.spawn(async move {
                    tokio::time::sleep(delay).await;
                    if let Some(rooms) = rooms.upgrade() {
                        fan_out(|| rooms.close_idle(&room, generation)).await;
                    }
                });
            }
            _ => self.close_idle(room, generation),
        }
    }

    fn close_idle(&self, room: &Arc<Room>, generation: u64) {
        let Some(cluster) = self.cluster() else {
            return;
        };
        let mut st = room.state();
        let State {
            members,
            remote,
            open,
            dirty,
            ..
        } = &mut *st;
        let Some(r) = remote.as_deref_mut() else {
            return;
        };
        if !*open || r.local > 0 || r.linger != generation {
            return;
        }
        r.publish(
            cluster,
            UpdateParts {
                closed: true,
                ..Default::default()
            },
        );
        // Nobody local is left, so every member is remote.
        self.metrics
            .cluster_remote_members
            .dec_by(members.len() as i64);
        members.clear();
        dirty.clear();
        r.parts.clear();
        // Unsubscribed before the room is marked closed, so a join that
        // reopens it subscribes afresh.
        cluster.close(room.name());
        *open = false;
        drop(st);
        self.forget(room);
    }

    /// The open rooms' handles (map guards dropped before any room lock).
    fn open_handles(&self) -> Vec<Arc<Room>> {
        self.map.iter().map(|r| Arc::clone(r.value())).collect()
    }
}

/// A clustered join in progress; dropped with `room` set, the join did not
/// happen (see [`Rooms::abandoned_join`]).
struct Abandoned<'a> {
    rooms: &'a Rooms,
    room: Option<Arc<Room>>,
}

impl Drop for Abandoned<'_> {
    fn drop(&mut self) {
        if let Some(room) = self.room.take() {
            self.rooms.abandoned_join(&room);
        }
    }
}

/// Writes `frames` to the room's sinks in order, after the state change
/// under `st` (the publisher's lock order: `state`, then `out`).
fn publish_all(room: &Room, st: MutexGuard<'_, State>, frames: &[Frame], metrics: &Metrics) {
    if frames.is_empty() {
        return;
    }
    let out = room.out();
    drop(st);
    for frame in frames {
        out.publish(frame, metrics);
    }
}

impl RoomSide for Rooms {
    fn publish_full(&self, room: &str, to: Option<Subject>) -> bool {
        let Some(cluster) = self.cluster() else {
            return false;
        };
        let Some(handle) = self.map.get(room).map(|r| Arc::clone(r.value())) else {
            return false;
        };
        let st = handle.state();
        let Some(r) = st.remote.as_deref().filter(|_| st.open) else {
            return false;
        };
        let ops = st
            .members
            .iter()
            .filter(|(_, m)| m.origin.is_none())
            .map(|(id, m)| wire::joined_op(member_pb(*id, m)))
            .collect();
        let bytes = wire::encode_update(
            cluster.origin_pb(),
            UpdateParts {
                incarnation: r.incarnation,
                seq: r.seq,
                full: true,
                tick_ms: self.clock.now_ms(),
                ops,
                ..Default::default()
            },
        );
        cluster.publish(to.unwrap_or_else(|| r.subject.clone()), bytes);
        true
    }

    fn open_rooms(&self) -> Vec<String> {
        self.open_handles()
            .into_iter()
            .filter(|h| {
                let st = h.state();
                st.open && st.remote.is_some()
            })
            .map(|h| h.name().to_owned())
            .collect()
    }

    fn local_counts(&self) -> Vec<(String, u32)> {
        self.open_handles()
            .into_iter()
            .filter_map(|h| {
                let st = h.state();
                let local = st.remote.as_deref().filter(|_| st.open)?.local;
                (local > 0).then(|| {
                    (
                        h.name().to_owned(),
                        u32::try_from(local).unwrap_or(u32::MAX),
                    )
                })
            })
            .collect()
    }

    fn apply(&self, room: &str, update: Update) {
        let Some(cluster) = self.cluster() else {
            return;
        };
        let Some(handle) = self.map.get(room).map(|r| Arc::clone(r.value())) else {
            return;
        };
        let mut frames = Vec::new();
        let mut st = handle.state();
        if !st.open {
            return;
        }
        let ask = self.apply_locked(&mut st, update, &mut frames);
        publish_all(&handle, st, &frames, &self.metrics);
        if let Some(node) = ask {
            cluster.request_sync(&node, vec![room.to_owned()]);
        }
    }

    fn drop_node(&self, node: &str, epoch: u64) {
        for handle in self.open_handles() {
            let mut frames = Vec::new();
            let mut st = handle.state();
            let State {
                members, remote, ..
            } = &mut *st;
            let Some(r) = remote.as_deref_mut() else {
                continue;
            };
            if r.parts.get(node).is_some_and(|p| p.epoch == epoch)
                && let Some(part) = r.parts.remove(node)
            {
                remove_ids(
                    members,
                    node,
                    &part.ids,
                    LeaveReason::ServerLost,
                    &mut frames,
                    &self.metrics,
                );
            }
            publish_all(&handle, st, &frames, &self.metrics);
        }
    }
}

#[cfg(test)]
mod tests;
