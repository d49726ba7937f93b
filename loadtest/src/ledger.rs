//! Delivery accounting: which move a motion record delivers, how many
//! deliveries each move should have had, and what is a duplicate. Plain
//! data, no I/O and no clock (callers pass `now`), so it is tested exactly.
//!
//! Motion batches carry no sequence numbers, so a delivery is identified by
//! (room, member id, motion): every bot makes each move distinct from its
//! last few and keeps them in its [`Trail`], which receivers in the same
//! room find through the room's [`Board`] (filled when a bot gets its
//! Welcome). Each trail has its own lock: there is no lock shared by a
//! whole run on the receive path.
//!
//! Expected deliveries are counted by the sender: every room message (Joined,
//! Left, motion) reaches every member in one order, and the batch carrying a
//! move also comes back to its sender. So when a sender sees its own move,
//! the other members in its view of the room at that point are exactly the
//! members the server fanned the batch out to. A move the server coalesced
//! away (a newer one replaced it) never comes back and is expected nowhere.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use amble::protocol::{MemberId, Motion, MotionRecord};

/// Sent moves a trail remembers. Bots send at most one move per interval,
/// and a batch arrives within a tick or two, so a few suffice.
pub const TRAIL_LEN: usize = 8;

/// Member ids above this are ignored (the server hands out the lowest free
/// id, so real ids stay far below).
const MAX_MEMBER_ID: u32 = 1 << 16;

/// A move as its sender sent it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sent {
    pub motion: Motion,
    pub seq: u32,
    pub at: Instant,
    /// Sent inside the measured window: its deliveries are counted.
    pub in_window: bool,
}

/// The recent moves of one bot, newest last.
#[derive(Debug, Default)]
pub struct Trail {
    ring: Mutex<Ring>,
}

#[derive(Debug, Default)]
struct Ring {
    entries: [Option<(Sent, bool)>; TRAIL_LEN],
    next: usize,
}

impl Ring {
    fn newest_first(&self) -> impl Iterator<Item = usize> + '_ {
        (1..=TRAIL_LEN).map(move |back| (self.next + TRAIL_LEN - back) % TRAIL_LEN)
    }

    fn find(&self, motion: &Motion) -> Option<usize> {
        self.newest_first()
            .find(|&i| matches!(&self.entries[i], Some((s, _)) if s.motion == *motion))
    }
}

impl Trail {
    fn ring(&self) -> MutexGuard<'_, Ring> {
        // A panic while holding this lock leaves plain data behind: go on.
        self.ring.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Remembers a move just before it is sent.
    pub fn push(&self, sent: Sent) {
        let mut ring = self.ring();
        let i = ring.next;
        ring.entries[i] = Some((sent, false));
        ring.next = (i + 1) % TRAIL_LEN;
    }

    /// Whether `motion` is among the remembered moves (a new move must not be).
    pub fn contains(&self, motion: &Motion) -> bool {
        self.ring().find(motion).is_some()
    }

    /// The newest remembered move with this motion.
    pub fn find(&self, motion: &Motion) -> Option<Sent> {
        let ring = self.ring();
        ring.find(motion)
            .and_then(|i| ring.entries[i].map(|(s, _)| s))
    }

    /// Marks the move with this motion as echoed; returns it the first time.
    fn echo(&self, motion: &Motion) -> Result<Option<Sent>, ()> {
        let mut ring = self.ring();
        let i = ring.find(motion).ok_or(())?;
        match &mut ring.entries[i] {
            Some((sent, echoed)) if !*echoed => {
                *echoed = true;
                Ok(Some(*sent))
            }
            _ => Ok(None),
        }
    }
}

/// A room's members as this process knows them: member id → trail.
#[derive(Debug, Default)]
pub struct Board {
    trails: Mutex<Vec<Option<Arc<Trail>>>>,
}

impl Board {
    fn trails(&self) -> MutexGuard<'_, Vec<Option<Arc<Trail>>>> {
        self.trails.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A bot got its Welcome with `id`.
    pub fn register(&self, id: MemberId, trail: Arc<Trail>) {
        if id.0 > MAX_MEMBER_ID {
            return;
        }
        let mut trails = self.trails();
        let i = id.0 as usize;
        if trails.len() <= i {
            trails.resize(i + 1, None);
        }
        trails[i] = Some(trail);
    }

    /// A bot left; a later bot with the same id registers anew.
    pub fn unregister(&self, id: MemberId, trail: &Arc<Trail>) {
        let mut trails = self.trails();
        if let Some(slot) = trails.get_mut(id.0 as usize)
            && slot.as_ref().is_some_and(|t| Arc::ptr_eq(t, trail))
        {
            *slot = None;
        }
    }

    fn get(&self, id: MemberId) -> Option<Arc<Trail>> {
        self.trails().get(id.0 as usize).cloned().flatten()
    }
}

/// What one frame added to a bot's counts. The bot keeps one and reuses it,
/// so reading a frame allocates nothing here.
#[derive(Debug, Default)]
pub struct FrameTally {
    /// Records of other members, counted or not.
    pub updates: u64,
    /// Own in-window moves that came back (the server applied them).
    pub applied: u64,
    /// Deliveries those moves should have had.
    pub expected: u64,
    /// Deliveries of in-window moves.
    pub received: u64,
    /// In-window moves delivered again to the same receiver.
    pub duplicates: u64,
    /// Records matching no remembered move (a member never seen, or an
    /// unknown motion).
    pub unmatched: u64,
    /// Records of members that are not bots of this run (not counted).
    pub strangers: u64,
    /// Own moves that came back with a motion this bot never sent.
    pub unmatched_echoes: u64,
    /// Move sent → delivered to another member, µs, and whether in window.
    pub latencies_us: Vec<(u64, bool)>,
    /// Move sent → back at its sender, µs, in window only.
    pub echo_latencies_us: Vec<u64>,
}

impl FrameTally {
    pub fn clear(&mut self) {
        let FrameTally {
            updates,
            applied,
            expected,
            received,
            duplicates,
            unmatched,
            strangers,
            unmatched_echoes,
            latencies_us,
            echo_latencies_us,
        } = self;
        for n in [
            updates,
            applied,
            expected,
            received,
            duplicates,
            unmatched,
            strangers,
            unmatched_echoes,
        ] {
            *n = 0;
        }
        latencies_us.clear();
        echo_latencies_us.clear();
    }
}

#[derive(Debug)]
struct Peer {
    trail: Arc<Trail>,
    last_seq: Option<u32>,
}

/// Who holds a member id in a bot's view of its room.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Seat {
    Empty,
    /// A bot of this run.
    Bot,
    /// Anyone else: a person, another run's bot.
    Stranger,
}

/// A member of a room as a Welcome, Joined or Resync names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seen {
    pub id: MemberId,
    /// A bot of this run (see `Plan::is_bot_name`).
    pub bot: bool,
}

impl Seen {
    pub fn bot(id: MemberId) -> Self {
        Self { id, bot: true }
    }

    pub fn stranger(id: MemberId) -> Self {
        Self { id, bot: false }
    }
}

/// One bot's view of its room, kept in step with the room's messages.
#[derive(Debug)]
pub struct Ledger {
    me: MemberId,
    own: Arc<Trail>,
    seats: Vec<Seat>,
    /// Bots of this run in view, this bot included.
    count: u32,
    /// Trails of the members seen so far, found through the board once.
    peers: Vec<Option<Peer>>,
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

impl Ledger {
    /// The view in a Welcome: `members` includes `me`.
    pub fn new(me: MemberId, own: Arc<Trail>, members: impl IntoIterator<Item = Seen>) -> Self {
        let mut ledger = Self {
            me,
            own,
            seats: Vec::new(),
            count: 0,
            peers: Vec::new(),
        };
        ledger.reset(members);
        ledger
    }

    pub fn me(&self) -> MemberId {
        self.me
    }

    pub fn trail(&self) -> &Arc<Trail> {
        &self.own
    }

    /// Bots of this run in view, this bot included.
    pub fn members(&self) -> u32 {
        self.count
    }

    /// A resync: the room as it is now.
    pub fn reset(&mut self, members: impl IntoIterator<Item = Seen>) {
        self.seats.iter_mut().for_each(|p| *p = Seat::Empty);
        self.count = 0;
        self.peers.clear();
        for seen in members {
            if seen.id != self.me {
                self.joined(seen);
            }
        }
        // A view always holds its owner, whatever the snapshot said.
        self.joined(Seen::bot(self.me));
    }

    /// A resync after this bot missed frames: the room as it is now, and
    /// this bot's motion in it. If that is an in-window move not yet seen
    /// back, the server applied it in a batch this bot missed: it counts as
    /// applied, expected at the members now in view (the best estimate
    /// left; its echo latency is unknown).
    pub fn resync(
        &mut self,
        members: impl IntoIterator<Item = Seen>,
        mine: Option<Motion>,
        out: &mut FrameTally,
    ) {
        self.reset(members);
        if let Some(motion) = mine
            && let Ok(Some(sent)) = self.own.echo(&motion)
            && sent.in_window
        {
            out.applied += 1;
            out.expected += u64::from(self.count.saturating_sub(1));
        }
    }

    pub fn joined(&mut self, seen: Seen) {
        let id = seen.id;
        if id.0 > MAX_MEMBER_ID {
            return;
        }
        let i = id.0 as usize;
        if self.seats.len() <= i {
            self.seats.resize(i + 1, Seat::Empty);
        }
        let seat = if seen.bot { Seat::Bot } else { Seat::Stranger };
        match (self.seats[i], seat) {
            (Seat::Bot, Seat::Stranger) => self.count -= 1,
            (Seat::Empty | Seat::Stranger, Seat::Bot) => self.count += 1,
            _ => {}
        }
        self.seats[i] = seat;
        // Whoever had this id before is gone.
        if let Some(peer) = self.peers.get_mut(i) {
            *peer = None;
        }
    }

    pub fn left(&mut self, id: MemberId) {
        if id == self.me {
            return;
        }
        let i = id.0 as usize;
        if let Some(seat) = self.seats.get_mut(i) {
            if *seat == Seat::Bot {
                self.count -= 1;
            }
            *seat = Seat::Empty;
        }
        if let Some(peer) = self.peers.get_mut(i) {
            *peer = None;
        }
    }

    /// A motion batch arrived at `now`.
    pub fn motion(
        &mut self,
        records: &[MotionRecord],
        now: Instant,
        board: &Board,
        out: &mut FrameTally,
    ) {
        for record in records {
            if record.member == self.me {
                self.echo(&record.motion, now, out);
            } else {
                self.delivery(record, now, board, out);
            }
        }
    }

    fn echo(&mut self, motion: &Motion, now: Instant, out: &mut FrameTally) {
        match self.own.echo(motion) {
            Err(()) => out.unmatched_echoes += 1,
            Ok(Some(sent)) if sent.in_window => {
                out.applied += 1;
                out.expected += u64::from(self.count.saturating_sub(1));
                out.echo_latencies_us
                    .push(micros(now.saturating_duration_since(sent.at)));
            }
            Ok(_) => {}
        }
    }

    fn delivery(
        &mut self,
        record: &MotionRecord,
        now: Instant,
        board: &Board,
        out: &mut FrameTally,
    ) {
        let i = record.member.0 as usize;
        match self.seats.get(i).copied().unwrap_or(Seat::Empty) {
            Seat::Bot => out.updates += 1,
            Seat::Stranger => {
                out.strangers += 1;
                return;
            }
            Seat::Empty => {
                out.updates += 1;
                out.unmatched += 1;
                return;
            }
        }
        if self.peers.len() <= i {
            self.peers.resize_with(i + 1, || None);
        }
        let peer = match &mut self.peers[i] {
            Some(peer) => peer,
            slot @ None => match board.get(record.member) {
                Some(trail) => slot.insert(Peer {
                    trail,
                    last_seq: None,
                }),
                None => {
                    out.unmatched += 1;
                    return;
                }
            },
        };
        let Some(sent) = peer.trail.find(&record.motion) else {
            out.unmatched += 1;
            return;
        };
        if peer.last_seq.is_some_and(|last| sent.seq <= last) {
            if sent.in_window {
                out.duplicates += 1;
            }
            return;
        }
        peer.last_seq = Some(sent.seq);
        let latency = micros(now.saturating_duration_since(sent.at));
        out.latencies_us.push((latency, sent.in_window));
        if sent.in_window {
            out.received += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use amble::protocol::Position;

    fn at(x: u32) -> Motion {
        Motion::standing(Position { x, y: x })
    }

    /// A room as the server runs it: one ordered stream of messages that
    /// every member present receives, batches built from the moves applied.
    struct FakeRoom {
        board: Board,
        bots: Vec<Option<Ledger>>,
        pending: Vec<MotionRecord>,
        totals: FrameTally,
        now: Instant,
    }

    impl FakeRoom {
        fn new() -> Self {
            Self {
                board: Board::default(),
                bots: Vec::new(),
                pending: Vec::new(),
                totals: FrameTally::default(),
                now: Instant::now(),
            }
        }

        fn live(&self) -> impl Iterator<Item = MemberId> + '_ {
            self.bots
                .iter()
                .enumerate()
                .filter(|(_, b)| b.is_some())
                .map(|(i, _)| MemberId(i as u32))
        }

        /// The lowest free id, as the server hands them out.
        fn join(&mut self) -> MemberId {
            let id = (0..)
                .find(|&i| self.bots.get(i).is_none_or(|b| b.is_none()))
                .unwrap();
            let id = MemberId(id as u32);
            for bot in self.bots.iter_mut().flatten() {
                bot.joined(Seen::bot(id));
            }
            let trail = Arc::new(Trail::default());
            self.board.register(id, trail.clone());
            let members: Vec<_> = self.live().chain([id]).map(Seen::bot).collect();
            if self.bots.len() <= id.0 as usize {
                self.bots.resize_with(id.0 as usize + 1, || None);
            }
            self.bots[id.0 as usize] = Some(Ledger::new(id, trail, members));
            id
        }

        fn leave(&mut self, id: MemberId) {
            let bot = self.bots[id.0 as usize].take().unwrap();
            self.board.unregister(id, bot.trail());
            for bot in self.bots.iter_mut().flatten() {
                bot.left(id);
            }
        }

        fn send(&mut self, id: MemberId, motion: Motion, seq: u32, in_window: bool) {
            let bot = self.bots[id.0 as usize].as_ref().unwrap();
            bot.trail().push(Sent {
                motion,
                seq,
                at: self.now,
                in_window,
            });
            // Coalescing: newest move of a member wins within a tick.
            self.pending.retain(|r| r.member != id);
            self.pending.push(MotionRecord { member: id, motion });
        }

        fn tick(&mut self) {
            self.now += Duration::from_millis(100);
            let batch = std::mem::take(&mut self.pending);
            let mut out = FrameTally::default();
            for bot in self.bots.iter_mut().flatten() {
                bot.motion(&batch, self.now, &self.board, &mut out);
            }
            let t = &mut self.totals;
            t.expected += out.expected;
            t.received += out.received;
            t.applied += out.applied;
            t.duplicates += out.duplicates;
            t.unmatched += out.unmatched;
            t.updates += out.updates;
            t.unmatched_echoes += out.unmatched_echoes;
            t.latencies_us.extend(out.latencies_us);
        }
    }

    #[test]
    fn expected_matches_received_with_joins_and_leaves() {
        let mut room = FakeRoom::new();
        let a = room.join();
        let b = room.join();
        room.send(a, at(1), 1, true);
        room.tick(); // b gets it: 1 expected
        let c = room.join();
        room.send(a, at(2), 2, true);
        room.send(b, at(3), 1, true);
        room.tick(); // b, c get a's; a, c get b's: 4
        room.send(c, at(4), 1, true);
        room.leave(b); // b leaves after the move, before the tick: not counted
        room.tick(); // a gets c's: 1
        let d = room.join(); // takes b's id
        assert_eq!(d, b);
        room.send(d, at(5), 1, true);
        room.send(a, at(6), 3, true);
        room.tick(); // a, c get d's; d, c get a's: 4
        assert_eq!(room.totals.expected, 10);
        assert_eq!(room.totals.received, 10);
        assert_eq!(room.totals.applied, 6);
        assert_eq!(room.totals.duplicates, 0);
        assert_eq!(room.totals.unmatched, 0);
        assert_eq!(room.totals.unmatched_echoes, 0);
        assert!(
            room.totals
                .latencies_us
                .iter()
                .all(|&(us, w)| us == 100_000 && w)
        );
    }

    #[test]
    fn coalesced_moves_count_once() {
        let mut room = FakeRoom::new();
        let a = room.join();
        let _b = room.join();
        let _c = room.join();
        room.send(a, at(1), 1, true);
        room.send(a, at(2), 2, true); // replaces the first before the tick
        room.tick();
        assert_eq!(room.totals.applied, 1);
        assert_eq!((room.totals.expected, room.totals.received), (2, 2));
    }

    #[test]
    fn moves_outside_the_window_are_not_counted() {
        let mut room = FakeRoom::new();
        let a = room.join();
        let _b = room.join();
        room.send(a, at(1), 1, false);
        room.tick();
        assert_eq!((room.totals.expected, room.totals.received), (0, 0));
        assert_eq!(room.totals.updates, 1, "the status line still sees it");
        assert_eq!(room.totals.latencies_us, vec![(100_000, false)]);
    }

    #[test]
    fn repeated_delivery_is_a_duplicate() {
        let board = Board::default();
        let sender = Arc::new(Trail::default());
        board.register(MemberId(1), sender.clone());
        let mut receiver = Ledger::new(
            MemberId(0),
            Arc::default(),
            [MemberId(0), MemberId(1)].map(Seen::bot),
        );
        let now = Instant::now();
        sender.push(Sent {
            motion: at(7),
            seq: 4,
            at: now,
            in_window: true,
        });
        let batch = [MotionRecord {
            member: MemberId(1),
            motion: at(7),
        }];
        let mut out = FrameTally::default();
        receiver.motion(&batch, now, &board, &mut out);
        receiver.motion(&batch, now, &board, &mut out);
        assert_eq!((out.received, out.duplicates), (1, 1));
        // A motion nobody sent, and a member nobody knows.
        let odd = [
            MotionRecord {
                member: MemberId(1),
                motion: at(8),
            },
            MotionRecord {
                member: MemberId(9),
                motion: at(7),
            },
        ];
        receiver.motion(&odd, now, &board, &mut out);
        assert_eq!(out.unmatched, 2);
    }

    #[test]
    fn trail_forgets_the_oldest() {
        let trail = Trail::default();
        let now = Instant::now();
        for x in 0..(TRAIL_LEN as u32 + 2) {
            trail.push(Sent {
                motion: at(x),
                seq: x,
                at: now,
                in_window: true,
            });
        }
        assert!(!trail.contains(&at(0)) && !trail.contains(&at(1)));
        assert!(trail.contains(&at(2)));
        assert_eq!(
            trail.find(&at(TRAIL_LEN as u32 + 1)).unwrap().seq,
            TRAIL_LEN as u32 + 1
        );
    }

    #[test]
    fn a_move_applied_in_a_missed_batch_counts_on_resync() {
        let own = Arc::new(Trail::default());
        let mut l = Ledger::new(
            MemberId(0),
            own.clone(),
            [MemberId(0), MemberId(1)].map(Seen::bot),
        );
        own.push(Sent {
            motion: at(3),
            seq: 1,
            at: Instant::now(),
            in_window: true,
        });
        let mut out = FrameTally::default();
        l.resync(
            [MemberId(0), MemberId(1), MemberId(2)].map(Seen::bot),
            Some(at(3)),
            &mut out,
        );
        assert_eq!((out.applied, out.expected), (1, 2));
        // Seen once: neither a later echo nor another resync counts it again.
        l.resync(
            [MemberId(0), MemberId(1)].map(Seen::bot),
            Some(at(3)),
            &mut out,
        );
        l.motion(
            &[MotionRecord {
                member: MemberId(0),
                motion: at(3),
            }],
            Instant::now(),
            &Board::default(),
            &mut out,
        );
        assert_eq!((out.applied, out.expected), (1, 2));
    }

    #[test]
    fn resync_rebuilds_the_view() {
        let mut l = Ledger::new(
            MemberId(3),
            Arc::default(),
            [MemberId(1), MemberId(3)].map(Seen::bot),
        );
        assert_eq!(l.members(), 2);
        l.joined(Seen::bot(MemberId(5)));
        l.joined(Seen::bot(MemberId(5)));
        assert_eq!(l.members(), 3);
        l.left(MemberId(1));
        l.left(MemberId(1));
        assert_eq!(l.members(), 2);
        l.reset([MemberId(0), MemberId(2)].map(Seen::bot));
        assert_eq!(l.members(), 3, "the owner stays in its view");
        l.joined(Seen::stranger(MemberId(7)));
        assert_eq!(l.members(), 3, "a stranger is not a bot of the run");
        l.joined(Seen::stranger(MemberId(2)));
        assert_eq!(l.members(), 2, "an id taken over by a stranger");
    }

    #[test]
    fn strangers_are_neither_expected_nor_unmatched() {
        let board = Board::default();
        let own = Arc::new(Trail::default());
        let peer = Arc::new(Trail::default());
        board.register(MemberId(0), own.clone());
        board.register(MemberId(1), peer.clone());
        // Me (0), a bot of the run (1), and a person (2).
        let members = [
            Seen::bot(MemberId(0)),
            Seen::bot(MemberId(1)),
            Seen::stranger(MemberId(2)),
        ];
        let mut me = Ledger::new(MemberId(0), own.clone(), members);
        let now = Instant::now();
        own.push(Sent {
            motion: at(1),
            seq: 1,
            at: now,
            in_window: true,
        });
        peer.push(Sent {
            motion: at(5),
            seq: 1,
            at: now,
            in_window: true,
        });
        let batch = [
            MotionRecord {
                member: MemberId(0),
                motion: at(1),
            },
            MotionRecord {
                member: MemberId(1),
                motion: at(5),
            },
            MotionRecord {
                member: MemberId(2),
                motion: at(9),
            },
        ];
        let mut out = FrameTally::default();
        me.motion(&batch, now, &board, &mut out);
        assert_eq!(out.expected, 1, "only the other bot is expected to receive");
        assert_eq!((out.received, out.updates), (1, 1));
        assert_eq!((out.strangers, out.unmatched), (1, 0));
        // A person joining later is a stranger too.
        me.joined(Seen::stranger(MemberId(3)));
        assert_eq!(me.members(), 2);
    }
}
