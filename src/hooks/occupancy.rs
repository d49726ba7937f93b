//! Which rooms have members anywhere in the cluster, pure: the map behind
//! `room.occupied` and `room.vacated` in cluster mode.
//!
//! Every node tells the others (`P.v2.o.all`, `cluster::wire::Occupancy`)
//! when its first member of a room arrives and its last one leaves, and
//! its whole list when a peer appears and every [`ANNOUNCE`]. Every node
//! keeps the same [`Occupancy`]: room -> the nodes with members there. A
//! room's transition (no node -> some node, and back) is a [`Change`];
//! exactly one node sends it, the live node [`chosen`] for the room by
//! rendezvous hashing, so the cluster sends each transition once. A lost
//! node's rooms go with it ([`Occupancy::drop_node`]).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

/// How often a node repeats its whole list (a lost message heals).
pub const ANNOUNCE: Duration = Duration::from_secs(5);

/// A room's transition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// The room's first member arrived (it had none anywhere).
    Occupied(Arc<str>),
    /// The room's last member left.
    Vacated(Arc<str>),
}

/// What one node said it has.
struct Node {
    epoch: u64,
    rooms: HashSet<Arc<str>>,
}

/// Room -> nodes with members there, as every node keeps it.
#[derive(Default)]
pub struct Occupancy {
    rooms: HashMap<Arc<str>, BTreeSet<Arc<str>>>,
    nodes: HashMap<Arc<str>, Node>,
}

impl Occupancy {
    /// Whether any node has members in `room`.
    pub fn occupied(&self, room: &str) -> bool {
        self.rooms.contains_key(room)
    }

    /// The rooms `node` has members in, sorted.
    pub fn rooms_of(&self, node: &str) -> Vec<Arc<str>> {
        let mut rooms: Vec<Arc<str>> = self
            .nodes
            .get(node)
            .map(|n| n.rooms.iter().cloned().collect())
            .unwrap_or_default();
        rooms.sort();
        rooms
    }

    /// The entry of `node` in `epoch`: a newer epoch replaces an older one
    /// (its rooms leave, into `changes`); `None` for an older epoch.
    fn node(&mut self, node: &Arc<str>, epoch: u64, changes: &mut Vec<Change>) -> Option<()> {
        match self.nodes.get(node).map(|n| n.epoch) {
            Some(known) if known > epoch => return None,
            Some(known) if known < epoch => {
                changes.extend(self.drop_node(node, known));
            }
            _ => {}
        }
        self.nodes.entry(Arc::clone(node)).or_insert_with(|| Node {
            epoch,
            rooms: HashSet::new(),
        });
        Some(())
    }

    /// `node` (in `epoch`) has members in `room` now, or has none
    /// (`occupied` false). Returns the room's transition, if any, after
    /// those of a replaced epoch.
    pub fn set(
        &mut self,
        node: &Arc<str>,
        epoch: u64,
        room: &Arc<str>,
        occupied: bool,
    ) -> Vec<Change> {
        let mut changes = Vec::new();
        if self.node(node, epoch, &mut changes).is_none() {
            return changes;
        }
        let Some(entry) = self.nodes.get_mut(node) else {
            return changes;
        };
        if occupied {
            if entry.rooms.insert(Arc::clone(room)) {
                let nodes = self.rooms.entry(Arc::clone(room)).or_default();
                nodes.insert(Arc::clone(node));
                if nodes.len() == 1 {
                    changes.push(Change::Occupied(Arc::clone(room)));
                }
            }
        } else if entry.rooms.remove(room) {
            changes.extend(self.leave(node, room));
        }
        changes
    }

    /// `node`'s whole list: its rooms are exactly `rooms` now.
    pub fn replace(&mut self, node: &Arc<str>, epoch: u64, rooms: &[Arc<str>]) -> Vec<Change> {
        let mut changes = Vec::new();
        if self.node(node, epoch, &mut changes).is_none() {
            return changes;
        }
        let now: HashSet<&Arc<str>> = rooms.iter().collect();
        let gone: Vec<Arc<str>> = self
            .nodes
            .get(node)
            .map(|n| {
                n.rooms
                    .iter()
                    .filter(|r| !now.contains(r))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        let mut gone = gone;
        gone.sort();
        for room in gone {
            changes.extend(self.set(node, epoch, &room, false));
        }
        for room in rooms {
            changes.extend(self.set(node, epoch, room, true));
        }
        changes
    }

    /// `node` in `epoch` is gone (stopped, lost, restarted): its rooms
    /// leave with it. A newer epoch's entry stays.
    pub fn drop_node(&mut self, node: &str, epoch: u64) -> Vec<Change> {
        if self.nodes.get(node).is_none_or(|n| n.epoch > epoch) {
            return Vec::new();
        }
        let Some((name, gone)) = self.nodes.remove_entry(node) else {
            return Vec::new();
        };
        let mut rooms: Vec<Arc<str>> = gone.rooms.into_iter().collect();
        rooms.sort();
        rooms
            .iter()
            .flat_map(|room| self.leave(&name, room))
            .collect()
    }

    /// Takes `node` out of `room`'s set: the room's vacating, if it was
    /// the last.
    fn leave(&mut self, node: &str, room: &Arc<str>) -> Option<Change> {
        let nodes = self.rooms.get_mut(room)?;
        nodes.remove(node);
        if nodes.is_empty() {
            self.rooms.remove(room);
            return Some(Change::Vacated(Arc::clone(room)));
        }
        None
    }
}

/// The node that sends `room`'s transitions: of `live` (every live node,
/// this one included), the one whose name hashed with the room's is the
/// highest (rendezvous hashing: every node that sees the same live nodes
/// picks the same one, and a node's loss moves only its own rooms).
pub fn chosen<'a>(room: &str, live: &'a [Arc<str>]) -> Option<&'a Arc<str>> {
    live.iter()
        .max_by_key(|node| (weight(room, node), Arc::clone(node)))
}

/// FNV-1a 64 of the room, a separator and the node, then a finalizer
/// (splitmix64's) so that close names spread.
fn weight(room: &str, node: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in room.bytes().chain([0xff]).chain(node.bytes()) {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash ^= hash >> 30;
    hash = hash.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    hash ^= hash >> 27;
    hash = hash.wrapping_mul(0x94d0_49bb_1331_11eb);
    hash ^ (hash >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(s: &str) -> Arc<str> {
        Arc::from(s)
    }

    #[test]
    fn transitions_happen_once_whichever_node_comes_and_goes() {
        let (n1, n2, lobby) = (a("n1"), a("n2"), a("lobby"));
        let mut o = Occupancy::default();
        assert_eq!(
            o.set(&n1, 1, &lobby, true),
            [Change::Occupied(lobby.clone())]
        );
        assert!(o.set(&n2, 7, &lobby, true).is_empty());
        assert!(o.set(&n1, 1, &lobby, true).is_empty(), "repeated");
        assert!(o.set(&n1, 1, &lobby, false).is_empty());
        assert!(o.set(&n1, 1, &lobby, false).is_empty(), "repeated");
        assert!(o.occupied("lobby"));
        assert_eq!(
            o.set(&n2, 7, &lobby, false),
            [Change::Vacated(lobby.clone())]
        );
        assert!(!o.occupied("lobby"));
        assert!(o.set(&n2, 7, &a("other"), false).is_empty(), "unknown room");
    }

    #[test]
    fn a_lost_node_takes_its_rooms_and_a_stale_epoch_is_ignored() {
        let (n1, n2) = (a("n1"), a("n2"));
        let mut o = Occupancy::default();
        o.set(&n1, 1, &a("a"), true);
        o.set(&n1, 1, &a("b"), true);
        o.set(&n2, 1, &a("b"), true);
        assert!(o.drop_node("n1", 0).is_empty(), "an older epoch's drop");
        assert_eq!(o.drop_node("n1", 1), [Change::Vacated(a("a"))]);
        assert!(o.drop_node("n1", 1).is_empty(), "twice");
        assert!(o.occupied("b"));
        // A restart (a newer epoch) replaces the old one's rooms.
        o.set(&n2, 1, &a("c"), true);
        assert_eq!(
            o.set(&n2, 2, &a("d"), true),
            [
                Change::Vacated(a("b")),
                Change::Vacated(a("c")),
                Change::Occupied(a("d"))
            ]
        );
        assert!(o.set(&n2, 1, &a("e"), true).is_empty(), "the old epoch");
        assert!(!o.occupied("e"));
        assert!(o.drop_node("n2", 1).is_empty(), "the old epoch's loss");
        assert_eq!(o.rooms_of("n2"), [a("d")]);
    }

    #[test]
    fn a_whole_list_replaces_what_was_known() {
        let (n1, n2) = (a("n1"), a("n2"));
        let mut o = Occupancy::default();
        o.set(&n1, 1, &a("a"), true);
        o.set(&n1, 1, &a("b"), true);
        o.set(&n2, 1, &a("b"), true);
        assert_eq!(
            o.replace(&n1, 1, &[a("b"), a("c")]),
            [Change::Vacated(a("a")), Change::Occupied(a("c"))]
        );
        assert_eq!(o.rooms_of("n1"), [a("b"), a("c")]);
        assert!(o.replace(&n1, 1, &[a("b"), a("c")]).is_empty(), "no news");
    }

    #[test]
    fn one_node_is_chosen_per_room_the_same_everywhere() {
        let live = [a("n1"), a("n2"), a("n3")];
        let mut reversed = live.clone();
        reversed.reverse();
        let mut per_node: HashMap<Arc<str>, usize> = HashMap::new();
        for i in 0..300 {
            let room = format!("room-{i}");
            let one = chosen(&room, &live).expect("a node");
            assert_eq!(Some(one), chosen(&room, &reversed), "order does not matter");
            *per_node.entry(Arc::clone(one)).or_default() += 1;
            // Without n3, rooms chosen elsewhere stay where they were.
            let without = [a("n1"), a("n2")];
            if **one != *"n3" {
                assert_eq!(chosen(&room, &without), Some(one));
            }
        }
        assert!(per_node.values().all(|&n| n > 60), "spread: {per_node:?}");
        assert_eq!(chosen("r", &[]), None);
        // Fixed values: every node must compute the same.
        assert_eq!(weight("lobby", "n1"), weight("lobby", "n1"));
        assert_ne!(weight("lobby", "n1"), weight("lobby", "n2"));
    }
}
