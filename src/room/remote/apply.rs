//! Applying another node's updates to a room, under the room's `state`
//! lock: [`Rooms::apply_locked`] asks the part's [`Sequence`] where an
//! update goes and what it does ([`place`], [`Sequence::receive`]), and
//! [`Apply`] makes the members, frames and pending moves follow.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, MutexGuard};

use tokio::time::Instant;

use super::sequence::{Decision, Sequence, Target, place};
use super::takeover::{self, Evicted, HANDOVER_MS, Handover, Place};
use super::{Addressed, Part, Remote, audience};
use crate::cluster::wire::{Op, RemoteMember, ResumeHash, Update};
use crate::metrics::Metrics;
use crate::protocol::pb::server_message::Body;
use crate::protocol::{
    LeaveReason, MemberId, MotionRecord, encode_motion, encode_server, motion_time, pb,
};
use crate::room::spatial::Spatial;
use crate::room::{Member, Rooms, State, member_pb, wire_seat};

/// What applying an update leaves to do once the room's lock is let go.
#[derive(Debug, Default)]
pub(super) struct Applied {
    /// The node to ask for a full state, if any.
    pub(super) ask: Option<Arc<str>>,
    /// Local members taken out: their connections are told.
    pub(super) evicted: Vec<Evicted>,
    /// The linger generation, when the last local member was taken out.
    pub(super) linger: Option<u64>,
}

/// Removes `ids` (members of `node`) with `Left{reason}` frames (in a
/// spatial room, to those who saw each).
pub(super) fn remove_ids(
    members: &mut BTreeMap<MemberId, Member>,
    mut spatial: Option<&mut Spatial>,
    node: &str,
    ids: &BTreeSet<MemberId>,
    reason: LeaveReason,
    frames: &mut Vec<Addressed>,
    metrics: &Metrics,
) {
    for id in ids {
        if members
            .get(id)
            .is_some_and(|m| m.origin.as_deref() == Some(node))
        {
            let to = audience(spatial.as_deref(), *id);
            if let Some(sp) = spatial.as_deref_mut() {
                sp.forget(*id);
            }
            members.remove(id);
            metrics.cluster_remote_members.dec();
            let left = encode_server(Body::Left(pb::Left {
                member_id: id.0,
                reason: reason as i32,
            }));
            frames.push((left, to));
        }
    }
}

/// What applying an update needs besides the room's state.
struct Apply<'a> {
    metrics: &'a Metrics,
    /// A node's part holds at most the room capacity.
    capacity: usize,
    node: &'a Arc<str>,
    frames: &'a mut Vec<Addressed>,
    /// A spatial room's cells: who sees what happens to a member.
    spatial: Option<&'a mut Spatial>,
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
    /// This node's name.
    me: &'a str,
    /// This node's members by app user.
    users: &'a HashMap<Arc<str>, MemberId>,
    /// Members other nodes handed over, in sight until taken.
    handovers: &'a mut Vec<Handover>,
    /// Local members taken out by this update.
    evicted: &'a mut Vec<Evicted>,
    /// Members of other nodes' parts whose place this update gave to
    /// another (out of their part once the update is applied).
    unparted: &'a mut Vec<Place>,
}

impl Apply<'_> {
    /// Adds remote member `m`, or updates it if known.
    fn add(
        &mut self,
        members: &mut BTreeMap<MemberId, Member>,
        dirty: &mut Vec<MemberId>,
        ids: &mut BTreeSet<MemberId>,
        hashes: &mut HashMap<MemberId, ResumeHash>,
        m: RemoteMember,
    ) {
        // Its id was a member this node handed over and nobody took: that
        // one leaves now (its node reused the id).
        if let Some(at) = self
            .handovers
            .iter()
            .position(|h| h.node == *self.node && h.id == m.id)
        {
            let h = self.handovers.swap_remove(at);
            self.end_handover(members, &h);
        }
        match hashes.entry(m.id) {
            std::collections::hash_map::Entry::Occupied(mut e) => match m.resume_hash {
                Some(hash) => {
                    e.insert(hash);
                }
                None => {
                    e.remove();
                }
            },
            std::collections::hash_map::Entry::Vacant(e) => {
                if let Some(hash) = m.resume_hash {
                    e.insert(hash);
                }
            }
        }
        match members.get_mut(&m.id) {
            Some(known)
                if known.origin.as_deref() == Some(&**self.node) && known.seat == m.seat =>
            {
                if known.motion != m.motion && known.pending.replace(m.motion).is_none() {
                    dirty.push(m.id);
                }
                // A full state after a missed data change.
                if known.data != m.data {
                    known.data = m.data;
                    let frame = encode_server(Body::MemberData(pb::MemberData {
                        member_id: m.id.0,
                        data: known.data.to_pb(),
                    }));
                    let to = self.audience(m.id);
                    self.frames.push((frame, to));
                }
            }
            Some(known) if known.origin.as_deref() == Some(&**self.node) => {
                // The same id in another seat: a new member whose
                // predecessor's Left was missed. `full` removes those
                // first; in a delta it cannot happen (a Left comes first).
                self.metrics.cluster_bad_messages.inc();
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
                // Whose place it takes: the one its node named, or (two
                // joins of one user on two nodes at once) this node's
                // member of the same user, if the other node's wins.
                let renumbered = match &m.replaces {
                    Some(r) => {
                        let place = Place {
                            node: Arc::clone(&r.node),
                            id: r.id,
                            seat: r.seat,
                        };
                        let taken = self.take_place(members, &place, r.resumed.then_some(m.id));
                        match taken {
                            Some(old) if r.resumed => {
                                self.unplace(old);
                                Some(old)
                            }
                            Some(old) => {
                                self.left(old, LeaveReason::Replaced);
                                None
                            }
                            None => None,
                        }
                    }
                    None => {
                        let local = m.sub.as_ref().and_then(|s| self.users.get(s)).copied();
                        if let Some(local) = local
                            && takeover::remote_wins(self.node, self.me)
                            && let Some(old) = members.remove(&local)
                        {
                            self.evicted.push(Evicted {
                                id: local,
                                seat: old.seat,
                                resumed_as: None,
                                name: old.name,
                                user: old.user,
                            });
                            self.left(local, LeaveReason::Replaced);
                        }
                        None
                    }
                };
                let member = Member {
                    seat: m.seat,
                    share_user: m.user.is_some(),
                    user: m.sub.or(m.user),
                    name: m.name.into_boxed_str(),
                    data: m.data,
                    motion: m.motion,
                    moved_at_ms: m.moved_at_ms,
                    pending: None,
                    origin: Some(Arc::clone(self.node)),
                    joined_at_s: super::super::unix_secs(self.now_ms),
                };
                if let Some(sp) = self.spatial.as_deref_mut() {
                    sp.place(m.id, member.motion.position);
                }
                // Everyone hears of a renumbering (a client that does not
                // know the old id ignores it); a join, those who see it.
                let addressed = match renumbered {
                    Some(old) => (
                        encode_server(Body::Renumbered(pb::Renumbered {
                            old_id: old.0,
                            new_id: m.id.0,
                        })),
                        None,
                    ),
                    None => (
                        encode_server(Body::Joined(pb::Joined {
                            member: Some(member_pb(m.id, &member)),
                        })),
                        self.audience(m.id),
                    ),
                };
                self.frames.push(addressed);
                members.insert(m.id, member);
                ids.insert(m.id);
                self.metrics.cluster_remote_members.inc();
            }
        }
    }

    /// Takes the member at `place` out for a joined member (resumed as
    /// `resumed_as`, or replaced): a local member is evicted, another
    /// node's leaves its part. Returns its id if it was here.
    fn take_place(
        &mut self,
        members: &mut BTreeMap<MemberId, Member>,
        place: &Place,
        resumed_as: Option<MemberId>,
    ) -> Option<MemberId> {
        let known = members.get(&place.id)?;
        if *place.node == *self.me {
            if known.origin.is_some() || wire_seat(known.seat) != place.seat {
                return None;
            }
            let old = members.remove(&place.id)?;
            self.evicted.push(Evicted {
                id: place.id,
                seat: old.seat,
                resumed_as,
                name: old.name,
                user: old.user,
            });
        } else {
            if known.origin.as_ref() != Some(&place.node) || known.seat != place.seat {
                return None;
            }
            members.remove(&place.id);
            self.metrics.cluster_remote_members.dec();
            self.handovers
                .retain(|h| !(h.node == place.node && h.id == place.id));
            self.unparted.push(place.clone());
        }
        Some(place.id)
    }

    /// A handover nobody took (or whose id its node reused): the member
    /// leaves.
    fn end_handover(&mut self, members: &mut BTreeMap<MemberId, Member>, h: &Handover) {
        if members
            .get(&h.id)
            .is_some_and(|m| m.origin.as_ref() == Some(&h.node) && m.seat == h.seat)
        {
            members.remove(&h.id);
            self.metrics.cluster_remote_members.dec();
            self.left(h.id, LeaveReason::Disconnected);
        }
    }

    /// A `Left` frame for `id`, gone from the room's members: to those
    /// who saw it in a spatial room, where it is then forgotten.
    fn left(&mut self, id: MemberId, reason: LeaveReason) {
        let frame = encode_server(Body::Left(pb::Left {
            member_id: id.0,
            reason: reason as i32,
        }));
        let to = self.unplace(id);
        self.frames.push((frame, to));
    }

    /// Who sees what happens to member `id` ([`audience`]).
    fn audience(&self, id: MemberId) -> Option<HashSet<MemberId>> {
        audience(self.spatial.as_deref(), id)
    }

    /// Forgets `id`'s cell in a spatial room; returns who saw it there.
    fn unplace(&mut self, id: MemberId) -> Option<HashSet<MemberId>> {
        let to = self.audience(id);
        if let Some(sp) = self.spatial.as_deref_mut() {
            sp.forget(id);
        }
        to
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
        // A spatial room's tick writes each member its own cells' moves:
        // never one batch for everyone ahead of it.
        if self.at_once.is_some()
            || self.spatial.is_some()
            || self.tick_ms == 0
            || members.get(&id).is_none_or(|m| m.pending.is_none())
        {
            return;
        }
        let frame = crate::room::tick::batch_ahead(
            members,
            dirty,
            self.cut,
            self.last_flush_ms,
            self.now_ms,
            self.tick_ms,
            self.unit,
            self.metrics,
        );
        self.frames.extend(frame.map(|f| (f, None)));
    }

    /// Writes `records` (if any) as one batch at server time `at_ms`, and
    /// counts it.
    fn batch(&mut self, at_ms: u64, unit: u32, records: &[MotionRecord]) {
        if records.is_empty() {
            return;
        }
        let batch = encode_motion(motion_time(at_ms, unit), records);
        self.frames.push((batch, None));
        self.metrics.moves_applied.inc_by(records.len() as u64);
        self.metrics.batches.inc();
    }

    /// Whether member `id` is one of this node's here.
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
        part: &mut Part,
        u: Update,
    ) {
        let Part { ids, hashes, .. } = part;
        for op in u.ops {
            match op {
                Op::Joined(m) => self.add(members, dirty, ids, hashes, m),
                Op::Left {
                    id,
                    reason,
                    handed_over,
                } => {
                    if !self.owns(members, id) || !ids.contains(&id) {
                        continue;
                    }
                    self.follow_moves(members, dirty, id);
                    ids.remove(&id);
                    hashes.remove(&id);
                    let seat = members.get(&id).map_or(0, |m| m.seat);
                    if handed_over && self.handovers.len() < self.capacity {
                        // It goes on through another node: in sight until
                        // that node's Joined takes its place.
                        self.handovers.push(Handover {
                            node: Arc::clone(self.node),
                            id,
                            seat,
                            until_ms: self.now_ms.saturating_add(HANDOVER_MS),
                        });
                        continue;
                    }
                    members.remove(&id);
                    self.metrics.cluster_remote_members.dec();
                    self.left(id, reason);
                }
                Op::ResumeHash { id, hash } => {
                    if ids.contains(&id) {
                        hashes.insert(id, hash);
                    }
                }
                Op::Chat {
                    id,
                    text,
                    server_time_ms,
                } => {
                    if self.owns(members, id) {
                        self.follow_moves(members, dirty, id);
                        let chat = encode_server(Body::Chat(pb::ChatMessage {
                            member_id: id.0,
                            text,
                            server_time_ms,
                        }));
                        let to = self.audience(id);
                        self.frames.push((chat, to));
                    }
                }
                Op::Data { id, data } => {
                    if self.owns(members, id) {
                        self.follow_moves(members, dirty, id);
                        let msg = pb::MemberData {
                            member_id: id.0,
                            data: data.to_pb(),
                        };
                        if let Some(m) = members.get_mut(&id) {
                            m.data = data;
                        }
                        let to = self.audience(id);
                        self.frames.push((encode_server(Body::MemberData(msg)), to));
                    }
                }
            }
        }
        self.moves(members, dirty, u.tick_ms, &u.motion);
    }

    /// Applies moves `records` of the update for tick `tick_ms`: pending
    /// for this node's tick (counted late if that tick's batch is written),
    /// or written at once with a zero tick.
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
        if let Some((now_ms, unit)) = self.at_once {
            self.batch(now_ms, unit, &now);
        }
    }

    /// Replaces the node's part with full state `u`.
    fn full(
        &mut self,
        members: &mut BTreeMap<MemberId, Member>,
        dirty: &mut Vec<MemberId>,
        part: &mut Part,
        u: Update,
    ) {
        let Part { ids, hashes, .. } = part;
        let mut joined = Vec::with_capacity(u.ops.len());
        for op in u.ops {
            if let Op::Joined(m) = op {
                joined.push(m);
            }
        }
        // Who is gone: every id the full state does not name, and every id
        // it names in another seat (the id was reused: its member left
        // and another joined while this node heard neither).
        let keep: BTreeSet<MemberId> = joined
            .iter()
            .filter(|m| members.get(&m.id).is_none_or(|known| known.seat == m.seat))
            .map(|m| m.id)
            .collect();
        let gone: BTreeSet<MemberId> = ids.difference(&keep).copied().collect();
        remove_ids(
            members,
            self.spatial.as_deref_mut(),
            self.node,
            &gone,
            LeaveReason::Left,
            self.frames,
            self.metrics,
        );
        ids.retain(|id| keep.contains(id));
        hashes.retain(|id, _| keep.contains(id));
        for m in joined {
            self.add(members, dirty, ids, hashes, m);
        }
        self.moves(members, dirty, u.tick_ms, &u.motion);
    }
}

impl Rooms {
    /// Applies update `u` to the locked room; returns the node to ask for a
    /// full state, if any.
    pub(super) fn apply_locked(
        &self,
        room: &Arc<str>,
        st: &mut MutexGuard<'_, State>,
        u: Update,
        frames: &mut Vec<Addressed>,
    ) -> Applied {
        let mut evicted = Vec::new();
        let mut unparted = Vec::new();
        let capacity = self.capacity_of(room);
        let ask = self.apply_part(st, u, capacity, frames, &mut evicted, &mut unparted);
        let mut linger = None;
        if let Some(r) = st.remote.as_deref_mut() {
            for place in &unparted {
                takeover::forget_in_part(r, place);
            }
        }
        for e in &evicted {
            linger = self.evicted_locked(room, st, e).or(linger);
        }
        Applied {
            ask,
            evicted,
            linger,
        }
    }

    /// The bookkeeping of local member `e`, which an applied update took
    /// out of the room's members: its user, token and place go, and the
    /// other nodes are told (a `Left` marked `handed_over` when it resumed
    /// elsewhere, REPLACED otherwise). Returns the linger generation when
    /// it was the last local member.
    fn evicted_locked(&self, room: &Arc<str>, st: &mut State, e: &Evicted) -> Option<u64> {
        st.users.retain(|_, id| *id != e.id);
        let since = st.local_since_ms.remove(&e.id);
        if st.places.forget(e.id) {
            self.unheld();
        }
        self.metrics.members.dec();
        let cluster = self.cluster()?;
        match e.resumed_as {
            Some(_) => {
                self.metrics.resumed("handed_over");
                super::publish::published_handover(cluster, st, e.id)
            }
            None => {
                self.metrics.auth_replaced.inc();
                if let Some(hooks) = self.hooks() {
                    let now_ms = self.clock.now_ms();
                    hooks.left(
                        room,
                        e.id.0,
                        &e.name,
                        e.user.clone(),
                        LeaveReason::Replaced,
                        since.map_or(0, |t| now_ms.saturating_sub(t)),
                    );
                }
                let shutting_down = self
                    .shutting_down
                    .load(std::sync::atomic::Ordering::Relaxed);
                super::publish::published_leave(
                    cluster,
                    st,
                    e.id,
                    LeaveReason::Replaced,
                    shutting_down,
                )
            }
        }
    }

    /// [`apply_locked`](Self::apply_locked) up to the local members an
    /// update evicts, and the other parts' members whose place it gave.
    fn apply_part(
        &self,
        st: &mut MutexGuard<'_, State>,
        u: Update,
        capacity: usize,
        frames: &mut Vec<Addressed>,
        evicted: &mut Vec<Evicted>,
        unparted: &mut Vec<Place>,
    ) -> Option<Arc<str>> {
        let State {
            members,
            dirty,
            remote,
            users,
            spatial,
            ..
        } = &mut **st;
        let Remote {
            parts,
            cut,
            last_flush_ms,
            opened,
            handovers,
            ..
        } = remote.as_deref_mut()?;
        let node = Arc::clone(&u.origin.node);
        let cluster = self.cluster()?;
        let now = Instant::now();
        let now_ms = self.clock.ms_at(now);
        let mut apply = Apply {
            metrics: &self.metrics,
            capacity,
            node: &node,
            frames,
            spatial: spatial.as_deref_mut(),
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
            me: &cluster.me().node,
            users,
            handovers,
            evicted,
            unparted,
        };
        let live = cluster.is_live(&node, u.origin.epoch);
        let placement = place(
            parts.get(&node).map(|p| &p.sequence),
            u.origin.epoch,
            u.origin.incarnation,
            u.closed,
            live,
        );
        if let Some(reason) = placement.drop
            && let Some(old) = parts.remove(&node)
        {
            remove_ids(
                members,
                apply.spatial.as_deref_mut(),
                &node,
                &old.ids,
                reason,
                apply.frames,
                apply.metrics,
            );
        }
        match placement.to {
            Target::Nowhere => return None,
            Target::Part => {}
            Target::NewPart => {
                // A part only for a live peer (a message that raced the
                // node's expiry, or a name flood, makes none), and at most
                // one per other slot: more nodes than slots cannot hold
                // members without id clashes, so a room's held updates stay
                // bounded at `(slots - 1) * MAX_BUFFERED_BYTES` whatever names
                // are heard (issue #15, finding 9).
                let max_parts = cluster.slots().saturating_sub(1).max(1) as usize;
                if parts.len() >= max_parts || !live {
                    apply.metrics.cluster_bad_messages.inc();
                    return None;
                }
            }
        }
        let opened = *opened;
        let part = parts.entry(Arc::clone(&node)).or_insert_with(|| Part {
            sequence: Sequence::new(u.origin.epoch, u.origin.incarnation),
            ids: BTreeSet::new(),
            hashes: HashMap::new(),
        });
        let (seq, have, synced) = (u.seq, part.sequence.seq(), part.sequence.synced());
        let ask = match part
            .sequence
            .receive(u, !part.ids.is_empty(), opened, now.into_std())
        {
            Decision::OlderFull { ask } | Decision::Missed { ask } => ask,
            Decision::Duplicate => false,
            Decision::Replace { full, then, ask } => {
                tracing::debug!(target: "amble::cluster", %node, seq, opened, "cluster: full state");
                if opened {
                    apply.metrics.cluster_resyncs.inc();
                }
                apply.full(members, dirty, part, full);
                for b in then {
                    apply.delta(members, dirty, part, b);
                }
                ask
            }
            Decision::Wait { ask } => {
                tracing::debug!(
                    target: "amble::cluster",
                    %node,
                    seq,
                    have,
                    synced,
                    "cluster: waiting for a full state of a node's part"
                );
                ask
            }
            Decision::Apply(u) => {
                apply.delta(members, dirty, part, u);
                false
            }
        };
        ask.then_some(node)
    }
}
