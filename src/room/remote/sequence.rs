//! One other node's part of a room as a sequence of updates: which update
//! goes where, which apply and in what order, which wait for a full state,
//! and when to ask the node for one.
//!
//! Pure: no I/O, no locks, no clock (the caller passes `now`), no metrics.
//! `Rooms::apply_locked` (`apply.rs`) asks it for a [`Placement`] and a
//! [`Decision`], then applies them to the room under its lock.

use std::time::{Duration, Instant};

use crate::cluster::wire::{Op, Update};
use crate::protocol::{LeaveReason, MotionRecord};

/// Updates held per node and room while waiting for its full state...
pub(super) const MAX_BUFFERED: usize = 64;
/// ...and their size at most (see [`held_size`]); past either, the oldest
/// go (the full state, asked when the first was held, most likely covers
/// them; the newest are what must follow it).
pub(super) const MAX_BUFFERED_BYTES: usize = 256 * 1024;
/// A node is asked for a full state of a room at most this often; parts
/// still waiting for one are swept (asked again) this often too.
pub(super) const ASK_EVERY: Duration = Duration::from_secs(1);

/// Where an update goes, decided by [`place`] from the node's epoch, its
/// opening of the room and whether the update closes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Placement {
    /// The part held so far goes first, its members leaving with this
    /// reason.
    pub(super) drop: Option<LeaveReason>,
    /// Then the update goes to...
    pub(super) to: Target,
}

/// ...nowhere, a new part, or the part held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Target {
    /// Stale (an earlier opening), or a `closed`: nothing more to do.
    Nowhere,
    /// A new part, made only if the node is a live peer.
    NewPart,
    /// The part held ([`Sequence::receive`]).
    Part,
}

/// Decides where an update of the node's run `epoch` and opening
/// `incarnation` goes, given the node's part held here (`part`, if any).
/// A new epoch replaces the part (its members are lost with the node's
/// previous run); an earlier opening is stale; a later opening replaces the
/// part (the earlier opening's members are gone, and the `closed` that said
/// so may have been lost); `closed` drops the part. `live`: the node's run
/// `epoch` is a live peer; an update of another run that is not (a message
/// of a previous run, delayed past the new run's first) changes nothing.
pub(super) fn place(
    part: Option<&Sequence>,
    epoch: u64,
    incarnation: u64,
    closed: bool,
    live: bool,
) -> Placement {
    let (drop, known) = match part {
        None => (None, false),
        Some(p) if p.epoch != epoch && !live => {
            return Placement {
                drop: None,
                to: Target::Nowhere,
            };
        }
        Some(p) if p.epoch != epoch => (Some(LeaveReason::ServerLost), false),
        Some(p) if incarnation < p.incarnation => {
            return Placement {
                drop: None,
                to: Target::Nowhere,
            };
        }
        Some(p) if incarnation > p.incarnation || closed => (Some(LeaveReason::Left), false),
        Some(_) => (None, true),
    };
    let to = match (closed, known) {
        (true, _) => Target::Nowhere,
        (false, true) => Target::Part,
        (false, false) => Target::NewPart,
    };
    Placement { drop, to }
}

/// What to do with an update that reached the part ([`Sequence::receive`]).
/// `ask`: ask the node for a full state of the room now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Decision {
    /// A full state older than what is applied (a delayed answer): it
    /// would rewind, so it is ignored.
    OlderFull { ask: bool },
    /// Replace the part with full state `full`, then apply the held deltas
    /// `then` in order.
    Replace {
        full: Update,
        then: Vec<Update>,
        ask: bool,
    },
    /// The part is unknown or the update leaves a gap: held (unless a
    /// beacon) until a full state.
    Wait { ask: bool },
    /// Applied already.
    Duplicate,
    /// A beacon one ahead: the node's last update was lost.
    Missed { ask: bool },
    /// The next delta: apply it.
    Apply(Update),
}

/// The sequencing state of one other node's part of a room.
#[derive(Debug)]
pub(super) struct Sequence {
    /// The node's run.
    epoch: u64,
    /// The node's opening of the room this part follows.
    incarnation: u64,
    /// The last sequence number applied.
    seq: u64,
    /// False until a full state arrived (and again after a gap).
    synced: bool,
    /// Updates that came while waiting for a full state.
    held: Vec<Update>,
    /// Their size, by [`held_size`].
    held_bytes: usize,
    /// When the node was last asked for a full state (while waiting).
    asked_at: Option<Instant>,
}

impl Sequence {
    /// A part of the node's run `epoch` and opening `incarnation`, with
    /// nothing applied yet.
    pub(super) fn new(epoch: u64, incarnation: u64) -> Self {
        Self {
            epoch,
            incarnation,
            seq: 0,
            synced: false,
            held: Vec::new(),
            held_bytes: 0,
            asked_at: None,
        }
    }

    /// The node's run this part follows.
    pub(super) fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The last sequence number applied.
    pub(super) fn seq(&self) -> u64 {
        self.seq
    }

    /// Whether the part is known (a full state or its opening's first
    /// update applied, and no gap since).
    pub(super) fn synced(&self) -> bool {
        self.synced
    }

    /// The updates held for after the full state, oldest first.
    #[cfg(test)]
    pub(super) fn held(&self) -> &[Update] {
        &self.held
    }

    /// Their size, by [`held_size`].
    #[cfg(test)]
    pub(super) fn held_bytes(&self) -> usize {
        self.held_bytes
    }

    /// Decides what update `u` (not `closed`, placed here by [`place`])
    /// does to the part at `now`. `holds_members`: the part has members;
    /// `opened`: the room's opening snapshot is applied (until then no
    /// full state is asked: it is on the way).
    pub(super) fn receive(
        &mut self,
        u: Update,
        holds_members: bool,
        opened: bool,
        now: Instant,
    ) -> Decision {
        if u.full && u.seq < self.seq {
            return Decision::OlderFull {
                ask: !self.synced && self.ask_due(opened, now),
            };
        }
        if u.full {
            self.seq = u.seq;
            self.synced = true;
            self.asked_at = None;
            // What came meanwhile, in order: after the full state, until a gap.
            let mut held = std::mem::take(&mut self.held);
            self.held_bytes = 0;
            held.sort_by_key(|b| b.seq);
            let mut then = Vec::new();
            let mut rest = held.into_iter();
            for b in rest.by_ref() {
                if b.seq <= self.seq {
                    continue;
                }
                if b.seq == self.seq + 1 {
                    self.seq = b.seq;
                    then.push(b);
                } else {
                    self.synced = false;
                    self.hold(b);
                    break;
                }
            }
            for b in rest {
                self.hold(b);
            }
            let ask = !self.synced && self.ask_due(opened, now);
            return Decision::Replace { full: u, then, ask };
        }
        let beacon = u.is_beacon();
        if !self.synced
            && !beacon
            && self.seq == 0
            && u.seq == 1
            && u.origin.incarnation > 0
            && !holds_members
            && self.held.is_empty()
        {
            // The first update of an opening: before it the node had nobody
            // here, so the part is known (empty) without a full state.
            self.synced = true;
            self.asked_at = None;
        }
        if !self.synced || u.seq > self.seq + 1 {
            // Unknown part, or a gap: wait for a full state.
            self.synced = false;
            // A beacon holds nothing: it only said what was missed; nor
            // does an update applied already (a repeat while waiting).
            if !beacon && u.seq > self.seq {
                self.hold(u);
            }
            return Decision::Wait {
                ask: self.ask_due(opened, now),
            };
        }
        if u.seq <= self.seq {
            return Decision::Duplicate;
        }
        if beacon {
            // The node's last update (seq self.seq + 1) was lost.
            self.synced = false;
            return Decision::Missed {
                ask: self.ask_due(opened, now),
            };
        }
        self.seq = u.seq;
        Decision::Apply(u)
    }

    /// Whether to ask the node again at `now` for the full state the part
    /// still waits for (a lost request or answer); the room is open.
    pub(super) fn ask_again(&mut self, now: Instant) -> bool {
        !self.synced && self.ask_due(true, now)
    }

    /// Holds `u` until the full state, dropping the oldest held past the
    /// bounds.
    fn hold(&mut self, u: Update) {
        self.held_bytes += held_size(&u);
        self.held.push(u);
        while self.held.len() > MAX_BUFFERED || self.held_bytes > MAX_BUFFERED_BYTES {
            let old = self.held.remove(0);
            self.held_bytes = self.held_bytes.saturating_sub(held_size(&old));
        }
    }

    /// Whether to ask the node for a full state at `now`: at most once per
    /// [`ASK_EVERY`], and not while the room is opening (its snapshot is on
    /// the way).
    fn ask_due(&mut self, opened: bool, now: Instant) -> bool {
        if !opened
            || self
                .asked_at
                .is_some_and(|at| now.saturating_duration_since(at) < ASK_EVERY)
        {
            return false;
        }
        self.asked_at = Some(now);
        true
    }
}

/// About how much memory a held update takes.
pub(super) fn held_size(u: &Update) -> usize {
    let ops: usize = u
        .ops
        .iter()
        .map(|op| match op {
            Op::Joined(m) => {
                m.name.len()
                    + m.data.bytes()
                    + m.user.as_ref().map_or(0, |u| u.len())
                    + m.sub.as_ref().map_or(0, |u| u.len())
                    + m.replaces.as_ref().map_or(0, |r| r.node.len())
            }
            Op::Chat { text, .. } => text.len(),
            Op::Data { data, .. } => data.bytes(),
            Op::Left { .. } | Op::ResumeHash { .. } => 0,
        })
        .sum();
    std::mem::size_of::<Update>()
        + ops
        + u.ops.len() * std::mem::size_of::<Op>()
        + u.motion.len() * std::mem::size_of::<MotionRecord>()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::cluster::wire::{Origin, RoomOrigin};
    use crate::protocol::MemberId;

    const MS: Duration = Duration::from_millis(1);

    /// Update `seq` of node n2 (epoch 7), opening 1: a chat of `text`.
    fn chat(seq: u64, text: &str) -> Update {
        Update {
            origin: RoomOrigin {
                origin: Origin {
                    node: Arc::from("n2"),
                    epoch: 7,
                    slot: 2,
                    slots: 16,
                },
                incarnation: 1,
            },
            seq,
            full: false,
            tick_ms: 0,
            ops: vec![Op::Chat {
                id: MemberId(2),
                text: text.into(),
                server_time_ms: seq,
            }],
            motion: Vec::new(),
            closed: false,
        }
    }

    fn delta(seq: u64) -> Update {
        chat(seq, "x")
    }

    fn full(seq: u64) -> Update {
        Update {
            full: true,
            ops: Vec::new(),
            ..delta(seq)
        }
    }

    fn beacon(seq: u64) -> Update {
        Update {
            ops: Vec::new(),
            ..delta(seq)
        }
    }

    /// A part synced at `seq` by a full state at `now`.
    fn synced_at(seq: u64, now: Instant) -> Sequence {
        let mut s = Sequence::new(7, 1);
        let got = s.receive(full(seq), false, true, now);
        assert_eq!(
            got,
            Decision::Replace {
                full: full(seq),
                then: vec![],
                ask: false
            }
        );
        s
    }

    fn held_seqs(s: &Sequence) -> Vec<u64> {
        s.held().iter().map(|u| u.seq).collect()
    }

    #[test]
    fn placement_by_epoch_opening_and_closed() {
        use LeaveReason::{Left, ServerLost};
        use Target::{NewPart, Nowhere, Part};
        let part = Sequence::new(7, 2);
        // (part held, epoch, incarnation, closed, live) -> (drop, to)
        let cases = [
            (None, 7, 2, false, true, None, NewPart),
            (None, 7, 2, true, true, None, Nowhere),
            (Some(&part), 7, 2, false, true, None, Part),
            (Some(&part), 7, 2, true, true, Some(Left), Nowhere),
            (Some(&part), 7, 1, false, true, None, Nowhere),
            (Some(&part), 7, 1, true, true, None, Nowhere),
            (Some(&part), 7, 3, false, true, Some(Left), NewPart),
            (Some(&part), 7, 3, true, true, Some(Left), Nowhere),
            (Some(&part), 8, 2, false, true, Some(ServerLost), NewPart),
            (Some(&part), 8, 1, false, true, Some(ServerLost), NewPart),
            (Some(&part), 6, 3, false, true, Some(ServerLost), NewPart),
            (Some(&part), 8, 2, true, true, Some(ServerLost), Nowhere),
            // A run that is not live (a delayed message of the previous
            // run) leaves the current run's part alone.
            (Some(&part), 6, 3, false, false, None, Nowhere),
            (Some(&part), 6, 3, true, false, None, Nowhere),
            (Some(&part), 8, 2, false, false, None, Nowhere),
        ];
        for (i, (part, epoch, incarnation, closed, live, drop, to)) in cases.into_iter().enumerate()
        {
            assert_eq!(
                place(part, epoch, incarnation, closed, live),
                Placement { drop, to },
                "case {i}"
            );
        }
    }

    #[test]
    fn in_order_deltas_apply_and_repeats_are_duplicates() {
        let t0 = Instant::now();
        let mut s = synced_at(3, t0);
        let cases = [
            (4, Decision::Apply(delta(4)), 4),
            (4, Decision::Duplicate, 4),
            (2, Decision::Duplicate, 4),
            (5, Decision::Apply(delta(5)), 5),
        ];
        for (seq, decision, after) in cases {
            assert_eq!(s.receive(delta(seq), true, true, t0), decision, "seq {seq}");
            assert_eq!((s.seq(), s.synced()), (after, true), "seq {seq}");
        }
        assert!(s.held().is_empty());
    }

    #[test]
    fn a_gap_holds_and_asks_at_most_once_per_ask_every() {
        let t0 = Instant::now();
        let mut s = synced_at(1, t0);
        let cases = [
            (3, t0, true),
            (4, t0 + 999 * MS, false),
            (5, t0 + 1_000 * MS, true),
            (6, t0 + 1_999 * MS, false),
            (7, t0 + 2_000 * MS, true),
        ];
        for (seq, now, ask) in cases {
            assert_eq!(
                s.receive(delta(seq), true, true, now),
                Decision::Wait { ask },
                "seq {seq}"
            );
        }
        assert_eq!(held_seqs(&s), [3, 4, 5, 6, 7]);
        assert_eq!((s.seq(), s.synced()), (1, false));
        // Waiting, even the next seq is held.
        assert_eq!(
            s.receive(delta(2), true, true, t0 + 2_001 * MS),
            Decision::Wait { ask: false }
        );
        assert_eq!(held_seqs(&s), [3, 4, 5, 6, 7, 2]);
    }

    #[test]
    fn a_full_state_replays_the_held_in_order_until_a_gap() {
        let t0 = Instant::now();
        let mut s = synced_at(1, t0);
        for seq in [5, 3, 9, 4, 2] {
            s.receive(delta(seq), true, true, t0);
        }
        assert_eq!(held_seqs(&s), [5, 3, 9, 4, 2]);
        // As of seq 3: 2 and 3 are in it, 4 and 5 follow, 9 waits (gap at
        // 6), and the node is asked at once (a full state resets the rate).
        assert_eq!(
            s.receive(full(3), true, true, t0 + MS),
            Decision::Replace {
                full: full(3),
                then: vec![delta(4), delta(5)],
                ask: true
            }
        );
        assert_eq!((s.seq(), s.synced(), held_seqs(&s)), (5, false, vec![9]));
        assert_eq!(s.held_bytes(), held_size(&delta(9)));
        // The next full state covers it; nothing is left to ask.
        assert_eq!(
            s.receive(full(8), true, true, t0 + 2 * MS),
            Decision::Replace {
                full: full(8),
                then: vec![delta(9)],
                ask: false
            }
        );
        assert_eq!((s.seq(), s.synced(), s.held_bytes()), (9, true, 0));
        assert!(s.held().is_empty());
    }

    #[test]
    fn held_updates_are_bounded_by_count_keeping_the_newest() {
        let t0 = Instant::now();
        let mut s = synced_at(1, t0);
        for seq in 3..3 + 100 {
            s.receive(delta(seq), true, true, t0);
        }
        assert_eq!(s.held().len(), MAX_BUFFERED);
        assert_eq!(s.held().first().map(|u| u.seq), Some(39));
        assert_eq!(s.held().last().map(|u| u.seq), Some(102));
        assert_eq!(s.held_bytes(), MAX_BUFFERED * held_size(&delta(3)));
    }

    #[test]
    fn held_updates_are_bounded_by_bytes_keeping_the_newest() {
        let t0 = Instant::now();
        let mut s = synced_at(1, t0);
        let text = "z".repeat(20_000);
        let size = held_size(&chat(3, &text));
        assert_eq!(
            size,
            std::mem::size_of::<Update>() + 20_000 + std::mem::size_of::<Op>()
        );
        for seq in 3..3 + 40 {
            s.receive(chat(seq, &text), true, true, t0);
        }
        let fit = MAX_BUFFERED_BYTES / size;
        assert_eq!(s.held().len(), fit);
        assert_eq!(s.held().first().map(|u| u.seq), Some(43 - fit as u64));
        assert_eq!(s.held_bytes(), fit * size);
    }

    #[test]
    fn an_older_full_state_is_ignored_and_asks_only_when_waiting() {
        let t0 = Instant::now();
        let mut s = synced_at(5, t0);
        assert_eq!(
            s.receive(full(3), true, true, t0),
            Decision::OlderFull { ask: false }
        );
        assert_eq!((s.seq(), s.synced()), (5, true));
        // Waiting (asked at t0 + 10 ms for the gap at 6).
        assert_eq!(
            s.receive(delta(7), true, true, t0 + 10 * MS),
            Decision::Wait { ask: true }
        );
        let cases = [(t0 + 500 * MS, false), (t0 + 1_010 * MS, true)];
        for (now, ask) in cases {
            assert_eq!(
                s.receive(full(4), true, true, now),
                Decision::OlderFull { ask }
            );
        }
        assert_eq!((s.seq(), held_seqs(&s)), (5, vec![7]));
        // A full state at the applied seq is not older: it replaces.
        assert_eq!(
            s.receive(full(5), true, true, t0 + 1_011 * MS),
            Decision::Replace {
                full: full(5),
                then: vec![],
                ask: true
            }
        );
    }

    #[test]
    fn an_unknown_part_waits_unless_it_is_an_openings_first_update() {
        let t0 = Instant::now();
        let opening = |incarnation, u: Update| Update {
            origin: RoomOrigin {
                incarnation,
                ..u.origin.clone()
            },
            ..u
        };
        // (update, holds members) -> decision, then held seqs
        let cases = [
            (
                opening(2, delta(1)),
                false,
                Decision::Apply(opening(2, delta(1))),
                vec![],
            ),
            (
                opening(2, delta(1)),
                true,
                Decision::Wait { ask: true },
                vec![1],
            ),
            (
                opening(0, delta(1)),
                false,
                Decision::Wait { ask: true },
                vec![1],
            ),
            (
                opening(2, delta(2)),
                false,
                Decision::Wait { ask: true },
                vec![2],
            ),
            (
                opening(2, beacon(1)),
                false,
                Decision::Wait { ask: true },
                vec![],
            ),
        ];
        for (i, (u, holds_members, decision, held)) in cases.into_iter().enumerate() {
            let mut s = Sequence::new(7, 2);
            assert_eq!(s.receive(u, holds_members, true, t0), decision, "case {i}");
            assert_eq!(held_seqs(&s), held, "case {i}");
            assert_eq!(
                s.synced(),
                matches!(decision, Decision::Apply(_)),
                "case {i}"
            );
        }
    }

    #[test]
    fn a_beacon_at_the_seq_is_a_duplicate_and_one_ahead_reveals_a_loss() {
        let t0 = Instant::now();
        let mut s = synced_at(2, t0);
        assert_eq!(s.receive(beacon(2), true, true, t0), Decision::Duplicate);
        assert_eq!(
            s.receive(beacon(3), true, true, t0),
            Decision::Missed { ask: true }
        );
        assert_eq!((s.seq(), s.synced()), (2, false));
        assert!(s.held().is_empty(), "a beacon is not held");
        // Now waiting: even seq 3 is held, and not asked again so soon.
        assert_eq!(
            s.receive(delta(3), true, true, t0 + 999 * MS),
            Decision::Wait { ask: false }
        );
        // A beacon ahead by more is a gap: nothing held.
        assert_eq!(
            s.receive(beacon(9), true, true, t0 + 1_000 * MS),
            Decision::Wait { ask: true }
        );
        assert_eq!(held_seqs(&s), [3]);
    }

    #[test]
    fn nothing_is_asked_before_the_room_is_opened() {
        let t0 = Instant::now();
        let mut s = Sequence::new(7, 1);
        assert_eq!(
            s.receive(delta(4), false, false, t0),
            Decision::Wait { ask: false }
        );
        // Not asked then, so asked at once when opened.
        assert_eq!(
            s.receive(delta(5), false, true, t0 + MS),
            Decision::Wait { ask: true }
        );
        assert!(!s.ask_again(t0 + 2 * MS));
    }

    #[test]
    fn ask_again_only_while_waiting_and_once_per_ask_every() {
        let t0 = Instant::now();
        let mut s = synced_at(1, t0);
        assert!(!s.ask_again(t0 + 5_000 * MS), "synced");
        assert_eq!(
            s.receive(delta(3), true, true, t0),
            Decision::Wait { ask: true }
        );
        let cases = [
            (t0 + 999 * MS, false),
            (t0 + 1_000 * MS, true),
            (t0 + 1_500 * MS, false),
            (t0 + 2_000 * MS, true),
        ];
        for (now, ask) in cases {
            assert_eq!(s.ask_again(now), ask, "{:?}", now - t0);
        }
    }

    /// While waiting after a gap, a repeat of an update applied already is
    /// not held: it would take the room of the ones the full state needs.
    #[test]
    fn a_repeat_while_waiting_is_not_held() {
        let t0 = Instant::now();
        let mut s = synced_at(3, t0);
        assert_eq!(
            s.receive(delta(5), true, true, t0),
            Decision::Wait { ask: true }
        );
        assert_eq!(
            s.receive(delta(3), true, true, t0),
            Decision::Wait { ask: false }
        );
        assert_eq!(
            s.receive(delta(2), true, true, t0),
            Decision::Wait { ask: false }
        );
        let held: Vec<u64> = s.held().iter().map(|u| u.seq).collect();
        assert_eq!(held, [5]);
    }

    #[test]
    fn a_new_epoch_starts_a_new_part_from_nothing() {
        let t0 = Instant::now();
        let old = synced_at(9, t0);
        let placed = place(Some(&old), 8, 1, false, true);
        assert_eq!(
            placed,
            Placement {
                drop: Some(LeaveReason::ServerLost),
                to: Target::NewPart
            }
        );
        let mut new = Sequence::new(8, 1);
        assert_eq!((new.epoch(), new.seq(), new.synced()), (8, 0, false));
        // Its first update of an opening, on an empty part, applies as it is.
        assert_eq!(
            new.receive(delta(1), false, true, t0),
            Decision::Apply(delta(1))
        );
        assert_eq!(place(Some(&new), 8, 1, false, true).to, Target::Part);
    }
}
