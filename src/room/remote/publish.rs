//! What this node tells the other nodes about a room: its members' joins,
//! leaves, chat and data changes at once, its moves at once with a zero tick (the cut
//! publishes the others), each as the next update of its part; and the
//! frames an applied update made, written to the local sinks.

use std::collections::BTreeMap;
use std::sync::MutexGuard;

use super::Remote;
use crate::cluster::Cluster;
use crate::cluster::wire::{self, UpdateParts};
use crate::metrics::Metrics;
use crate::protocol::{LeaveReason, MemberId, MotionRecord, pb};
use crate::room::sink::{Frame, Removal};
use crate::room::tick::batch_ahead;
use crate::room::{Member, Room, Rooms, State};

impl Remote {
    /// Publishes the next update of this node's part.
    pub(super) fn publish(&mut self, cluster: &Cluster, mut parts: UpdateParts<'_>) {
        self.seq += 1;
        parts.seq = self.seq;
        parts.incarnation = self.incarnation;
        self.published = true;
        cluster.publish(
            self.subject.clone(),
            wire::encode_update(cluster.origin_pb(), parts),
        );
    }

    /// Publishes the next update of this node's part with `ops` only.
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

/// The lowest id `index * slots + slot` not in `members`.
pub(in crate::room) fn lowest_free_in_slot(
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
pub(in crate::room) fn published_join(
    cluster: &Cluster,
    st: &mut State,
    replaced: Option<MemberId>,
    joined: pb::Member,
    seat: u64,
    extra: wire::JoinedExtra,
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
    ops.push(wire::joined_op_with(
        joined,
        crate::room::wire_seat(seat),
        extra,
    ));
    r.publish_ops(cluster, ops);
}

/// A local member left: tell the other nodes. Returns the linger
/// generation when it was the last local member.
pub(in crate::room) fn published_leave(
    cluster: &Cluster,
    st: &mut State,
    id: MemberId,
    reason: LeaveReason,
    shutting_down: bool,
) -> Option<u64> {
    // At shutdown the goodbye heartbeat removes every member at once.
    let op = (!shutting_down).then(|| wire::left_op(id, reason));
    gone_local(cluster, st, id, op)
}

/// Local member `id` is gone from this node: publishes `op` (if any) and
/// returns the linger generation when it was the last local member (none
/// without `op`: at shutdown nothing lingers).
fn gone_local(
    cluster: &Cluster,
    st: &mut State,
    id: MemberId,
    op: Option<wire::cpb::Op>,
) -> Option<u64> {
    let r = st.remote.as_deref_mut()?;
    r.local = r.local.saturating_sub(1);
    r.uncut(id);
    r.publish_ops(cluster, vec![op?]);
    (r.local == 0).then(|| {
        r.linger += 1;
        r.linger
    })
}

/// A local member went on through another node (its session resumed
/// there): tell the other nodes, who keep it in sight until that node's
/// `Joined` takes its place. Returns the linger generation when it was the
/// last local member.
pub(in crate::room) fn published_handover(
    cluster: &Cluster,
    st: &mut State,
    id: MemberId,
) -> Option<u64> {
    gone_local(cluster, st, id, Some(wire::handed_over_op(id)))
}

/// A local member's place has a new resume token (it resumed here): tell
/// the other nodes its hash.
pub(in crate::room) fn published_resume_hash(
    cluster: &Cluster,
    st: &mut State,
    id: MemberId,
    hash: wire::ResumeHash,
) {
    if let Some(r) = st.remote.as_deref_mut() {
        r.publish_ops(cluster, vec![wire::resume_hash_op(id, hash)]);
    }
}

/// With a zero tick, a local move goes out at once.
pub(in crate::room) fn published_moves_now(
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
pub(in crate::room) fn published_chat(cluster: &Cluster, st: &mut State, chat: pb::ChatMessage) {
    if let Some(r) = st.remote.as_deref_mut() {
        r.publish_ops(cluster, vec![wire::chat_op(chat)]);
    }
}

/// A local member's data changed: tell the other nodes.
pub(in crate::room) fn published_data(cluster: &Cluster, st: &mut State, data: pb::MemberData) {
    if let Some(r) = st.remote.as_deref_mut() {
        r.publish_ops(cluster, vec![wire::data_op(data)]);
    }
}

/// Writes `frames` to the room's sinks in order, after the state change
/// under `st` (the publisher's lock order: `state`, then `out`).
pub(super) fn publish_all(
    room: &Room,
    st: MutexGuard<'_, State>,
    frames: &[super::Addressed],
    metrics: &Metrics,
) {
    if frames.is_empty() {
        return;
    }
    let out = room.out();
    drop(st);
    write_all(&out, frames, metrics);
}

/// Writes each frame to everyone, or to those it is addressed to.
fn write_all(out: &crate::room::Out, frames: &[super::Addressed], metrics: &Metrics) {
    for (frame, to) in frames {
        match to {
            None => out.publish(frame, metrics),
            Some(to) => metrics.sent_to(out.write_to(frame, to), frame.len()),
        }
    }
}

impl Rooms {
    /// Writes `frames` after an update that took local members out
    /// (`evicted`): their sinks go first (they get nothing more), then the
    /// frames, then each of those connections is told: superseded when its
    /// session went on through another node, removed as REPLACED otherwise.
    pub(super) fn publish_evicting(
        &self,
        room: &Room,
        st: MutexGuard<'_, State>,
        frames: &[super::Addressed],
        evicted: &[super::takeover::Evicted],
    ) {
        let mut out = room.out();
        drop(st);
        let mut told = Vec::with_capacity(evicted.len());
        for e in evicted {
            if let Some(at) = out.sinks.iter().position(|(m, _)| *m == e.id) {
                told.push((out.sinks.remove(at).1, e.resumed_as.is_some()));
            }
        }
        write_all(&out, frames, &self.metrics);
        drop(out);
        for (sink, resumed) in told {
            if resumed {
                sink.superseded();
            } else {
                sink.removed(Removal::Replaced);
            }
        }
    }

    /// Before a join is snapshotted: when this node cut moves for a tick
    /// that has not run yet, the cut moves are applied already, so the
    /// joiner's snapshot shows them, and that tick's batch would bring them
    /// again. So the batch is taken now (the tick then writes nothing), to
    /// be written to the members already here before the joiner's `Joined`
    /// (issue #15, finding 6). `None` when nothing is cut.
    pub(in crate::room) fn batch_before_join(&self, st: &mut State) -> Option<Frame> {
        let tick_ms = u64::try_from(self.settings.tick.as_millis()).ok()?;
        let State {
            members,
            dirty,
            remote,
            spatial,
            ..
        } = st;
        let r = remote.as_deref_mut()?;
        // A spatial room's batch is per viewing cell: its tick writes it.
        if tick_ms == 0 || r.cut.is_empty() || spatial.is_some() {
            return None;
        }
        batch_ahead(
            members,
            dirty,
            &mut r.cut,
            &mut r.last_flush_ms,
            self.clock.now_ms(),
            tick_ms,
            self.settings.motion_time_unit_ms,
            &self.metrics,
        )
    }
}
