//! One avatar per session and per user across the cluster: a member that
//! takes the place of another node's member.
//!
//! Two ways, both told to the other nodes by the new member's `Joined`
//! naming the older one in `replaces` (node, id, seat):
//!
//! - **Resumed** (`resumed`): a client whose connection to node A dropped
//!   reconnects to node B with its resume token. B knows the place from the
//!   token's hash, which A's `Joined` carried, so no question to A is needed
//!   (A may be gone). B's member gets a new id (ids belong to a node's
//!   slot), and every client sees one `Renumbered`, never a `Left` and a
//!   `Joined`. A, if alive, lets its member go quietly (its connection, if
//!   still open, is superseded) and publishes a `Left` marked `handed_over`;
//!   a node that hears that `Left` before B's `Joined` keeps the member in
//!   sight as a [`Handover`] for [`HANDOVER_MS`] at most, then lets it leave.
//! - **Replaced**: the same app user (token `sub`) joins on B while its
//!   member is on A. Everyone sees `Left` with REPLACED, then `Joined`, as on
//!   one node; A closes the older connection (close 4000). Two joins of one
//!   user on two nodes at once (neither knew the other's) are settled the
//!   same way everywhere: the member on the node with the greater name stays.
//!
//! The lookups here scan a room's members (at most its capacity) and run
//! only on a join with a user or a token; nothing here is on the tick's path.

use std::sync::Arc;

use crate::cluster::wire::ResumeHash;
use crate::metrics::Metrics;
use crate::protocol::pb::server_message::Body;
use crate::protocol::{LeaveReason, MemberId, encode_server, pb};
use crate::room::resume::{Refusal, ResumeToken};
use crate::room::{Member, State};

/// How long a member another node handed over stays in sight here, waiting
/// for the `Joined` of the node it went to (ms).
pub(in crate::room) const HANDOVER_MS: u64 = 5_000;

/// Another node's member whose place a local join takes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(in crate::room) struct Place {
    pub(in crate::room) node: Arc<str>,
    pub(in crate::room) id: MemberId,
    /// Its seat as other nodes know it.
    pub(in crate::room) seat: u64,
}

/// A member another node handed over (`Left` with `handed_over`) before
/// this node heard the `Joined` that takes its place: still in the room's
/// members (nobody was told it left), out of its node's part.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(in crate::room) struct Handover {
    pub(in crate::room) node: Arc<str>,
    pub(in crate::room) id: MemberId,
    pub(in crate::room) seat: u64,
    /// Server time when it leaves if nobody took its place.
    pub(in crate::room) until_ms: u64,
}

/// The other node's member whose resume token is `token`, if `user` may
/// take it (the same app user, or none on both sides).
pub(in crate::room) fn place_of_token(
    st: &State,
    token: &ResumeToken,
    user: Option<&Arc<str>>,
) -> Result<Place, Refusal> {
    let hash: ResumeHash = token.hash();
    let r = st.remote.as_deref().ok_or(Refusal::Unknown)?;
    let (node, id) = r
        .parts
        .iter()
        .find_map(|(node, part)| {
            part.hashes
                .iter()
                .find(|(_, h)| **h == hash)
                .map(|(id, _)| (node, *id))
        })
        .ok_or(Refusal::Unknown)?;
    let member = st
        .members
        .get(&id)
        .filter(|m| m.origin.as_ref() == Some(node))
        .ok_or(Refusal::Unknown)?;
    if member.user.as_deref() != user.map(|u| &**u) {
        return Err(Refusal::OtherUser);
    }
    Ok(Place {
        node: Arc::clone(node),
        id,
        seat: member.seat,
    })
}

/// Another node's member of app user `user` in the room, if any.
pub(in crate::room) fn place_of_user(st: &State, user: &str) -> Option<Place> {
    st.members.iter().find_map(|(id, m)| {
        let node = m.origin.as_ref()?;
        (m.user.as_deref() == Some(user)).then(|| Place {
            node: Arc::clone(node),
            id: *id,
            seat: m.seat,
        })
    })
}

/// Takes another node's member at `place` out of the room's state (its
/// node's part, or the handovers) without telling anyone; returns it.
pub(in crate::room) fn take(st: &mut State, place: &Place, metrics: &Metrics) -> Option<Member> {
    let State {
        members,
        remote,
        spatial,
        ..
    } = st;
    let r = remote.as_deref_mut()?;
    let known = members.get(&place.id)?;
    if known.origin.as_ref() != Some(&place.node) || known.seat != place.seat {
        return None;
    }
    let member = members.remove(&place.id)?;
    if let Some(sp) = spatial.as_deref_mut() {
        sp.forget(place.id);
    }
    forget_in_part(r, place);
    metrics.cluster_remote_members.dec();
    Some(member)
}

/// `place` is no longer its node's part here, nor a handover.
pub(super) fn forget_in_part(r: &mut super::Remote, place: &Place) {
    if let Some(part) = r.parts.get_mut(&place.node) {
        part.ids.remove(&place.id);
        part.hashes.remove(&place.id);
    }
    r.handovers
        .retain(|h| !(h.node == place.node && h.id == place.id));
}

/// A local member an applied update took out: another node's `Joined`
/// took its place.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(in crate::room) struct Evicted {
    pub(in crate::room) id: MemberId,
    /// Its seat here (with its lease).
    pub(in crate::room) seat: u64,
    /// The id it goes on with on the other node, when its session resumed
    /// there; `None`: its user joined again there (REPLACED).
    pub(in crate::room) resumed_as: Option<MemberId>,
    pub(in crate::room) name: Box<str>,
    pub(in crate::room) user: Option<Arc<str>>,
}

/// Members handed over whose time ran out at `now_ms` (nobody took their
/// place): they leave; returns the `Left` frames for this node's members.
pub(super) fn expire(st: &mut State, now_ms: u64, metrics: &Metrics) -> Vec<super::Addressed> {
    let State {
        members,
        remote,
        spatial,
        ..
    } = st;
    let Some(r) = remote.as_deref_mut() else {
        return Vec::new();
    };
    if r.handovers.iter().all(|h| h.until_ms > now_ms) {
        return Vec::new();
    }
    let mut frames = Vec::new();
    r.handovers.retain(|h| {
        if h.until_ms > now_ms {
            return true;
        }
        if members
            .get(&h.id)
            .is_some_and(|m| m.origin.as_ref() == Some(&h.node) && m.seat == h.seat)
        {
            members.remove(&h.id);
            metrics.cluster_remote_members.dec();
            let to = super::audience(spatial.as_deref(), h.id);
            if let Some(sp) = spatial.as_deref_mut() {
                sp.forget(h.id);
            }
            let left = encode_server(Body::Left(pb::Left {
                member_id: h.id.0,
                reason: LeaveReason::Disconnected as i32,
            }));
            frames.push((left, to));
        }
        false
    });
    frames
}

/// Which of two joins of one user on two nodes, neither knowing the other,
/// stays: the one on the node with the greater name. Every node decides the
/// same.
pub(in crate::room) fn remote_wins(remote_node: &str, this_node: &str) -> bool {
    remote_node > this_node
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn of_two_simultaneous_joins_the_greater_node_name_stays() {
        assert!(remote_wins("node-b", "node-a"));
        assert!(!remote_wins("node-a", "node-b"));
        // Exactly one side gives way, whatever the names.
        for (a, b) in [("x", "y"), ("n1", "n10"), ("amble-2", "amble-1")] {
            assert_ne!(remote_wins(a, b), remote_wins(b, a));
        }
    }
}
