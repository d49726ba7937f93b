//! A spatial room's state beside its members: each member's home cell and
//! the members of each cell ([`interest`](super::interest) decides the
//! rule), the view changes a tick brings, and the tick's motion frames
//! assembled per viewing cell from chunks encoded once per cell.
//!
//! Lives in the room's `State` (`State::spatial`), under its lock.

use std::collections::{BTreeMap, HashMap};

use bytes::{BufMut as _, Bytes, BytesMut};
use prost::Message as _;

use crate::protocol::pb::server_message::Body;
use crate::protocol::{MemberId, MotionRecord, Position, encode_server, pb, push_records};

use super::interest::{Cell, Grid};
use super::{Member, member_pb};

/// How a spatial room is set up (`--spatial-*`, `--interest-radius`).
#[derive(Clone, Debug)]
pub struct SpatialSettings {
    /// Room names (or prefixes ending in `*`) that are spatial.
    pub patterns: Vec<String>,
    pub world: Position,
    pub capacity: usize,
    pub radius_cm: u32,
    /// Sent in a spatial room's `Welcome` (world, capacity, interest).
    pub limits: pb::Limits,
}

impl SpatialSettings {
    pub fn matches(&self, room: &str) -> bool {
        self.patterns.iter().any(|p| match p.strip_suffix('*') {
            Some(prefix) => room.starts_with(prefix),
            None => p == room,
        })
    }

    pub fn grid(&self) -> Grid {
        Grid::new(self.world, self.radius_cm)
    }
}

/// The members by cell, and each member's home.
pub(super) struct Spatial {
    pub(super) grid: Grid,
    homes: HashMap<MemberId, Cell>,
    cells: HashMap<Cell, Vec<MemberId>>,
    /// The count last sent in a `Population`, and when (ms).
    pub(super) population_sent: usize,
    pub(super) population_at_ms: u64,
}

/// A member's home changed: from, to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Moved {
    pub id: MemberId,
    pub from: Cell,
    pub to: Cell,
}

impl Spatial {
    pub(super) fn new(grid: Grid) -> Self {
        Self {
            grid,
            homes: HashMap::new(),
            cells: HashMap::new(),
            population_sent: 0,
            population_at_ms: 0,
        }
    }

    /// Gives `id` its first home, where `p` falls.
    pub(super) fn place(&mut self, id: MemberId, p: Position) -> Cell {
        let cell = self.grid.cell_of(p);
        if let Some(old) = self.homes.insert(id, cell) {
            self.unlist(id, old);
        }
        self.cells.entry(cell).or_default().push(id);
        cell
    }

    /// Takes `id` out; its home, if it had one.
    pub(super) fn forget(&mut self, id: MemberId) -> Option<Cell> {
        let cell = self.homes.remove(&id)?;
        self.unlist(id, cell);
        Some(cell)
    }

    fn unlist(&mut self, id: MemberId, cell: Cell) {
        if let Some(list) = self.cells.get_mut(&cell) {
            list.retain(|m| *m != id);
            if list.is_empty() {
                self.cells.remove(&cell);
            }
        }
    }

    pub(super) fn home(&self, id: MemberId) -> Option<Cell> {
        self.homes.get(&id).copied()
    }

    /// Whether `viewer` sees `subject` (both in the room).
    #[cfg(test)]
    pub(super) fn sees(&self, viewer: MemberId, subject: MemberId) -> bool {
        match (self.home(viewer), self.home(subject)) {
            (Some(a), Some(b)) => Grid::sees(a, b),
            _ => false,
        }
    }

    /// The members living in `home`'s view (the 3 × 3 block), itself
    /// included.
    pub(super) fn in_view(&self, home: Cell) -> impl Iterator<Item = MemberId> + '_ {
        self.grid
            .view(home)
            .filter_map(|c| self.cells.get(&c))
            .flatten()
            .copied()
    }

    /// Moves every member whose position (along its walk, at `now_ms`) has
    /// left its home past the margin to its new home; returns the moves.
    pub(super) fn rehome(
        &mut self,
        members: &BTreeMap<MemberId, Member>,
        now_ms: u64,
    ) -> Vec<Moved> {
        let mut moved = Vec::new();
        for (id, m) in members {
            let Some(&from) = self.homes.get(id) else {
                continue;
            };
            let at = m.motion.at(now_ms.saturating_sub(m.moved_at_ms));
            let to = self.grid.rehome(from, at);
            if to != from {
                moved.push(Moved { id: *id, from, to });
            }
        }
        for m in &moved {
            self.unlist(m.id, m.from);
            self.homes.insert(m.id, m.to);
            self.cells.entry(m.to).or_default().push(m.id);
        }
        moved
    }

    /// What `moved` changes for each member: who came into its view and who
    /// went out of it, net over the whole set (a pair that both moved is
    /// judged on both old homes against both new ones).
    pub(super) fn view_changes(
        &self,
        moved: &[Moved],
    ) -> HashMap<MemberId, (Vec<MemberId>, Vec<MemberId>)> {
        let old: HashMap<MemberId, Cell> = moved.iter().map(|m| (m.id, m.from)).collect();
        let before = |id: MemberId| old.get(&id).copied().or_else(|| self.home(id));
        let mut changes: HashMap<MemberId, (Vec<MemberId>, Vec<MemberId>)> = HashMap::new();
        for m in moved {
            // Everyone who may have seen m before or may see it now: those
            // living now around either home, and the movers who lived there.
            let mut others: Vec<MemberId> =
                self.in_view(m.from).chain(self.in_view(m.to)).collect();
            others.extend(
                moved
                    .iter()
                    .filter(|o| Grid::sees(o.from, m.from))
                    .map(|o| o.id),
            );
            others.sort_unstable();
            others.dedup();
            for other in others {
                if other == m.id || (old.contains_key(&other) && other < m.id) {
                    // Itself, or a pair already judged from the other side.
                    continue;
                }
                let (Some(was), Some(now)) = (before(other), self.home(other)) else {
                    continue;
                };
                let saw = Grid::sees(m.from, was);
                let sees = Grid::sees(m.to, now);
                if saw == sees {
                    continue;
                }
                for (viewer, subject) in [(other, m.id), (m.id, other)] {
                    let entry = changes.entry(viewer).or_default();
                    if sees {
                        entry.0.push(subject);
                    } else {
                        entry.1.push(subject);
                    }
                }
            }
        }
        changes
    }
}

/// One tick's motion frames of a spatial room: each cell's records encoded
/// once as a chunk of the packed motion field, and a viewing cell's frame
/// the time chunk and the chunks of the cells it sees, concatenated (a
/// packed field may arrive in several pieces: readers join them).
pub(super) struct Frames {
    head: Bytes,
    chunks: HashMap<Cell, Bytes>,
    by_view: HashMap<Cell, Option<Bytes>>,
}

/// `motion` as one length-delimited piece of `ServerMessage.motion`.
fn chunk(motion: &[u32]) -> Bytes {
    let msg = pb::ServerMessage {
        body: None,
        motion: motion.to_vec(),
    };
    Bytes::from(msg.encode_to_vec())
}

impl Frames {
    /// The frames for `records` (each under its member's home) at `time`.
    pub(super) fn new(spatial: &Spatial, time: u32, records: &[MotionRecord]) -> Self {
        let mut by_cell: HashMap<Cell, Vec<u32>> = HashMap::new();
        for r in records {
            if let Some(cell) = spatial.home(r.member) {
                push_records(by_cell.entry(cell).or_default(), std::slice::from_ref(r));
            }
        }
        Self {
            head: chunk(&[time]),
            chunks: by_cell.into_iter().map(|(c, m)| (c, chunk(&m))).collect(),
            by_view: HashMap::new(),
        }
    }

    /// The frame for a member living in `home`, if anything moved in its
    /// view; built once per viewing cell.
    pub(super) fn for_home(&mut self, grid: &Grid, home: Cell) -> Option<Bytes> {
        let Self {
            head,
            chunks,
            by_view,
        } = self;
        by_view
            .entry(home)
            .or_insert_with(|| {
                let parts: Vec<&Bytes> = grid.view(home).filter_map(|c| chunks.get(&c)).collect();
                if parts.is_empty() {
                    return None;
                }
                let len = head.len() + parts.iter().map(|p| p.len()).sum::<usize>();
                let mut frame = BytesMut::with_capacity(len);
                frame.put_slice(head);
                for p in parts {
                    frame.put_slice(p);
                }
                Some(frame.freeze())
            })
            .clone()
    }
}

/// `Appeared` with `ids`' whole state.
pub(super) fn appeared(members: &BTreeMap<MemberId, Member>, ids: &[MemberId]) -> Bytes {
    encode_server(Body::Appeared(pb::Appeared {
        members: ids
            .iter()
            .filter_map(|id| members.get(id).map(|m| member_pb(*id, m)))
            .collect(),
    }))
}

/// `Disappeared` for `ids`.
pub(super) fn disappeared(ids: &[MemberId]) -> Bytes {
    encode_server(Body::Disappeared(pb::Disappeared {
        member_ids: ids.iter().map(|id| id.0).collect(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Motion, decode_motion};

    fn p(x: u32, y: u32) -> Position {
        Position { x, y }
    }

    fn spatial() -> Spatial {
        Spatial::new(Grid::new(p(50_000, 50_000), 1_500))
    }

    #[test]
    fn a_cells_members_are_listed_and_forgotten() {
        let mut s = spatial();
        let a = s.place(MemberId(1), p(100, 100));
        s.place(MemberId(2), p(2_000, 100));
        s.place(MemberId(3), p(20_000, 20_000));
        assert_eq!(s.in_view(a).collect::<Vec<_>>(), [MemberId(1), MemberId(2)]);
        assert!(s.sees(MemberId(1), MemberId(2)) && !s.sees(MemberId(1), MemberId(3)));
        assert_eq!(s.forget(MemberId(2)), Some(s.grid.cell_of(p(2_000, 100))));
        assert_eq!(s.in_view(a).collect::<Vec<_>>(), [MemberId(1)]);
        assert_eq!(s.forget(MemberId(2)), None);
    }

    #[test]
    fn a_frame_is_the_time_and_the_chunks_of_the_cells_in_view() {
        let mut s = spatial();
        s.place(MemberId(1), p(100, 100));
        s.place(MemberId(2), p(2_000, 100));
        s.place(MemberId(3), p(20_000, 20_000));
        let rec = |id: u32, x: u32| MotionRecord {
            member: MemberId(id),
            motion: Motion::standing(p(x, 100)),
        };
        let records = [rec(1, 150), rec(2, 2_050), rec(3, 20_050)];
        let mut frames = Frames::new(&s, 42, &records);
        let home1 = s.home(MemberId(1)).expect("placed");
        let frame = frames.for_home(&s.grid, home1).expect("moves in view");
        let msg = pb::ServerMessage::decode(frame).expect("one valid message");
        let (time, got) = decode_motion(&msg.motion).expect("a batch");
        assert_eq!(time, 42);
        let mut ids: Vec<u32> = got.iter().map(|r| r.member.0).collect();
        ids.sort_unstable();
        assert_eq!(ids, [1, 2], "member 3 is out of view");
        // Far from anyone who moved: nothing.
        assert_eq!(
            frames.for_home(&s.grid, s.grid.cell_of(p(40_000, 40_000))),
            None
        );
    }

    fn standing(x: u32, y: u32) -> Member {
        Member {
            seat: 0,
            user: None,
            share_user: false,
            joined_at_s: 0,
            name: "".into(),
            data: crate::protocol::Data::default(),
            motion: Motion::standing(p(x, y)),
            moved_at_ms: 0,
            pending: None,
            origin: None,
        }
    }

    #[test]
    fn walking_out_of_view_and_back_is_a_disappear_then_an_appear_both_ways() {
        let mut s = spatial();
        let mut members = BTreeMap::new();
        members.insert(MemberId(1), standing(100, 100));
        members.insert(MemberId(2), standing(1_000, 100));
        for (id, m) in &members {
            s.place(*id, m.motion.position);
        }
        // 2 walks far east.
        members.insert(MemberId(2), standing(10_000, 100));
        let moved = s.rehome(&members, 0);
        assert_eq!(moved.len(), 1);
        let changes = s.view_changes(&moved);
        assert_eq!(changes[&MemberId(1)], (vec![], vec![MemberId(2)]));
        assert_eq!(changes[&MemberId(2)], (vec![], vec![MemberId(1)]));
        // And back.
        members.insert(MemberId(2), standing(1_000, 100));
        let moved = s.rehome(&members, 0);
        let changes = s.view_changes(&moved);
        assert_eq!(changes[&MemberId(1)], (vec![MemberId(2)], vec![]));
        assert_eq!(changes[&MemberId(2)], (vec![MemberId(1)], vec![]));
    }

    #[test]
    fn two_movers_are_judged_once_on_both_ends() {
        let mut s = spatial();
        let mut members = BTreeMap::new();
        members.insert(MemberId(1), standing(100, 100));
        members.insert(MemberId(2), standing(1_000, 100));
        for (id, m) in &members {
            s.place(*id, m.motion.position);
        }
        // Both walk east together: they stay in view of each other.
        members.insert(MemberId(1), standing(10_000, 100));
        members.insert(MemberId(2), standing(10_900, 100));
        let moved = s.rehome(&members, 0);
        assert_eq!(moved.len(), 2);
        assert!(s.view_changes(&moved).is_empty());
        // Both walk apart: each sees the other go, once.
        members.insert(MemberId(1), standing(100, 100));
        members.insert(MemberId(2), standing(30_000, 100));
        let moved = s.rehome(&members, 0);
        let changes = s.view_changes(&moved);
        assert_eq!(changes[&MemberId(1)], (vec![], vec![MemberId(2)]));
        assert_eq!(changes[&MemberId(2)], (vec![], vec![MemberId(1)]));
    }

    #[test]
    fn a_walk_takes_its_walker_along_without_a_new_move() {
        let mut s = spatial();
        let mut members = BTreeMap::new();
        let mut walker = standing(100, 100);
        walker.motion.walk = Some(crate::protocol::Walk {
            target: p(10_100, 100),
            speed: 1_000,
        });
        members.insert(MemberId(1), walker);
        s.place(MemberId(1), p(100, 100));
        assert!(
            s.rehome(&members, 1_000).is_empty(),
            "10 m along: still home"
        );
        let moved = s.rehome(&members, 5_000);
        assert_eq!(moved.len(), 1);
        assert_eq!(s.home(MemberId(1)), Some(s.grid.cell_of(p(5_100, 100))));
    }
}
