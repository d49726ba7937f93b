//! Cluster mode in a room: the other nodes' members, and what this node
//! tells them.
//!
//! Each node is the single writer of its own members. A room's [`State`]
//! holds them all; [`Remote`] keeps, per other node, the ids it owns here
//! and the sequence of its updates ([`Sequence`], a pure state machine), so
//! a gap, an unknown node or a new epoch is repaired by a full state of
//! that node's part (asked with a `SyncRequest`). Remote joins, leaves and
//! chat are written to the local sinks at once, like local ones; remote
//! moves become pending moves, so the next tick's one frame per member
//! carries local and remote moves alike.
//!
//! This node publishes its own joins, leaves and chat at once, and its
//! members' moves once per tick, cut `--cluster-lead-ms` before the tick
//! ([`Rooms::run_cutter`]). Every publication is a non-blocking push into
//! the cluster's bounded queue, made under the room's `state` lock so that
//! sequence numbers follow the state changes; NATS is never awaited here.
//!
//! By job: `sequence.rs` decides (pure), `apply.rs` applies its decisions
//! under the room lock, `publish.rs` tells the other nodes, `cutter.rs`
//! cuts and sweeps on the clock, `open.rs` opens, lingers and closes; this
//! file holds the state and the entry points the cluster calls
//! ([`RoomSide`]).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use async_nats::Subject;

use self::apply::remove_ids;
use self::publish::publish_all;
use self::sequence::Sequence;
use crate::cluster::wire::{self, Update, UpdateParts};
use crate::cluster::{Cluster, RoomSide};
use crate::protocol::{LeaveReason, MemberId, MotionRecord};
use crate::room::sink::Frame;
use crate::room::spatial::Spatial;
use crate::room::{Rooms, State, member_pb, wire_seat};

mod apply;
mod cutter;
mod open;
mod publish;
mod sequence;
pub(super) mod takeover;

// What `room` calls: a free id in this node's slot, and the publishing of
// a local member's join, leave, move or chat.
pub(super) use self::publish::{
    lowest_free_in_slot, published_chat, published_data, published_join, published_leave,
    published_moves_now, published_resume_hash,
};

/// A frame for this node's members, and which of them get it: `None`, all;
/// in a spatial room, those who see the member it is about.
pub(super) type Addressed = (Frame, Option<HashSet<MemberId>>);

/// Who of this node's members hear of what happens to member `id`: all
/// (`None`) in a plain room; in a spatial room those whose view holds its
/// cell (nobody, if it has none).
pub(super) fn audience(spatial: Option<&Spatial>, id: MemberId) -> Option<HashSet<MemberId>> {
    let sp = spatial?;
    Some(
        sp.home(id)
            .map(|home| sp.in_view(home).collect())
            .unwrap_or_default(),
    )
}

/// A room's cluster state on this node.
pub(super) struct Remote {
    /// `P.v2.r.<room>`.
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
    /// Members other nodes handed over, still in sight until the node they
    /// went to says so (at most the room's capacity).
    handovers: Vec<takeover::Handover>,
}

/// One other node's part of a room: the sequence of its updates, and the
/// ids of its members here.
struct Part {
    sequence: Sequence,
    ids: BTreeSet<MemberId>,
    /// The resume hashes of those of its members that have one.
    hashes: HashMap<MemberId, wire::ResumeHash>,
}

impl Remote {
    /// The cluster state of this node's opening `incarnation` of the room
    /// whose subject is `subject`.
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
            handovers: Vec::new(),
        }
    }
}

/// Answers a request for this node's part of a room it does not hold:
/// nobody here, said as a full state that is `closed`, numbered as the last
/// opening of any room here. The asker's part of this node (from an opening
/// whose `closed` it missed, say in a NATS outage) is at or below that
/// number, so it goes; a later opening here is numbered above it, so a
/// late answer never removes it (issue #15, finding 1).
fn publish_nobody_here(
    cluster: &Cluster,
    room: &str,
    to: Option<Subject>,
    last_opening: u64,
    now_ms: u64,
) -> bool {
    let bytes = wire::encode_update(
        cluster.origin_pb(),
        UpdateParts {
            incarnation: last_opening,
            full: true,
            closed: true,
            tick_ms: now_ms,
            ..Default::default()
        },
    );
    cluster.publish(to.unwrap_or_else(|| cluster.room_subject(room)), bytes);
    true
}

impl Rooms {
    /// The cluster, in cluster mode.
    pub(in crate::room) fn cluster(&self) -> Option<&Arc<Cluster>> {
        self.cluster.get()
    }
}

impl RoomSide for Rooms {
    fn publish_full(&self, room: &str, to: Option<Subject>) -> bool {
        let Some(cluster) = self.cluster() else {
            return false;
        };
        // Read before the room is looked up: an opening that the look-up
        // does not see is numbered above it.
        let last_opening = self.openings.load(Ordering::Relaxed);
        let handle = self.map.get(room).map(|r| Arc::clone(r.value()));
        let Some(handle) = handle else {
            return publish_nobody_here(cluster, room, to, last_opening, self.clock.now_ms());
        };
        let st = handle.state();
        let Some(r) = st.remote.as_deref().filter(|_| st.open) else {
            // Closing: its `closed` is published, or was.
            drop(st);
            return publish_nobody_here(cluster, room, to, last_opening, self.clock.now_ms());
        };
        let ops = st
            .members
            .iter()
            .filter(|(_, m)| m.origin.is_none())
            .map(|(id, m)| {
                let extra = wire::JoinedExtra {
                    sub: m.user.clone(),
                    resume_hash: st.places.token_of(*id).map(|t| t.hash()),
                    replaces: None,
                };
                wire::joined_op_with(member_pb(*id, m), wire_seat(m.seat), extra)
            })
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
        let applied = self.apply_locked(&handle.name, &mut st, update, &mut frames);
        if applied.evicted.is_empty() {
            publish_all(&handle, st, &frames, &self.metrics);
        } else {
            self.publish_evicting(&handle, st, &frames, &applied.evicted);
        }
        if let Some(generation) = applied.linger {
            self.linger(&handle, generation);
        }
        if let Some(node) = applied.ask {
            cluster.request_sync(&node, vec![room.to_owned()]);
        }
    }

    fn occupancy(&self, update: crate::cluster::wire::Occupancy) {
        if let Some(hooks) = self.hooks() {
            hooks.remote_occupancy(update);
        }
    }

    fn drop_node(&self, node: &str, epoch: u64) {
        if let Some(hooks) = self.hooks() {
            hooks.node_lost(node, epoch);
        }
        for handle in self.open_handles() {
            let mut frames = Vec::new();
            let mut st = handle.state();
            let State {
                members,
                remote,
                spatial,
                ..
            } = &mut *st;
            let Some(r) = remote.as_deref_mut() else {
                continue;
            };
            if r.parts
                .get(node)
                .is_some_and(|p| p.sequence.epoch() == epoch)
                && let Some(part) = r.parts.remove(node)
            {
                remove_ids(
                    members,
                    spatial.as_deref_mut(),
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
