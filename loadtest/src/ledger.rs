//! Delivery accounting: which move a motion record delivers, how many
//! deliveries each move should have had, and what is a duplicate. Plain
//! data, no I/O and no clock (callers pass `now`), so it is tested exactly.
//!
//! Motion batches carry no sequence numbers, so a delivery is identified by
//! (room, member, motion): every bot makes each move distinct from its last
//! few and keeps them in its [`Trail`], which the other bots of the run
//! find by its name (see `Plan::is_bot_name`). Each trail has its own lock:
//! there is no lock shared by a whole run on the receive path.
//!
//! Expected deliveries are counted by each receiver, from its own stream
//! alone, because that is all a cluster orders: every receiver gets each
//! sender's messages (Joined, moves, Left) in the order they happened, but
//! there is no order between senders on different nodes (a receiver may
//! see a remote member join after that member's node already fanned it a
//! move, and the sender's node may learn of a receiver a tick after the
//! receiver's node did), and a remote move may arrive a tick after a local
//! one. So a receiver R expects, from each sender S in its view, every
//! in-window move S made that the server applied, after the motion R first
//! saw S at (its Welcome's or S's Joined's: nothing before it can reach R)
//! and up to S leaving R's view (S's Left, or R's end). On one node this is
//! exactly the set the server fans out to R, as before.
//!
//! A move is known to be applied when anyone sees it: its echo at its
//! sender, its delivery to any receiver, a snapshot showing it. A move the
//! server coalesced away (a newer one replaced it within a tick) is seen by
//! nobody and expected nowhere. The count is settled when R's session ends
//! ([`Ledger::finish`]), after the drain, when every echo has arrived; R
//! received what it received meanwhile, and the difference is what was lost.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use amble::protocol::{MemberId, Motion, MotionRecord};

/// Sent moves a trail remembers. Bots send at most one move per interval,
/// and a batch arrives within a tick or two, so a few suffice.
pub const TRAIL_LEN: usize = 8;

/// Member ids above this are ignored (a node hands out the lowest free
/// local index, times the cluster's slots plus its slot: real ids stay far
/// below).
const MAX_MEMBER_ID: u32 = 1 << 16;

/// Moves per bot whose application a trail records (one bit each): a bot
/// sending ten moves a second for 4.8 days. Later moves count as not
/// applied, so they are expected nowhere.
const MAX_TRACKED_SEQ: u32 = 1 << 22;

/// Closed views (a sender left, or its id changed hands) a ledger keeps
/// until its end; past this it settles them at once.
const MAX_CLOSED: usize = 1_024;

/// A move as its sender sent it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sent {
    pub motion: Motion,
    /// 1, 2, ... per bot; 0 is where the bot stood when it joined.
    pub seq: u32,
    pub at: Instant,
    /// Sent inside the measured window: its deliveries are counted.
    pub in_window: bool,
}

/// The recent moves of one bot, newest last, and which of its in-window
/// moves the server is known to have applied.
#[derive(Debug, Default)]
pub struct Trail {
    ring: Mutex<Ring>,
}

#[derive(Debug, Default)]
struct Ring {
    entries: [Option<(Sent, bool)>; TRAIL_LEN],
    next: usize,
    newest_seq: u32,
    /// Bit `seq`: an in-window move known to be applied.
    applied: Vec<u64>,
}

impl Ring {
    fn newest_first(&self) -> impl Iterator<Item = usize> + '_ {
        (1..=TRAIL_LEN).map(move |back| (self.next + TRAIL_LEN - back) % TRAIL_LEN)
    }

    fn find(&self, motion: &Motion) -> Option<usize> {
        self.newest_first()
            .find(|&i| matches!(&self.entries[i], Some((s, _)) if s.motion == *motion))
    }

    fn mark_applied(&mut self, sent: &Sent) {
        if !sent.in_window || sent.seq >= MAX_TRACKED_SEQ {
            return;
        }
        let (word, bit) = ((sent.seq / 64) as usize, sent.seq % 64);
        if self.applied.len() <= word {
            self.applied.resize(word + 1, 0);
        }
        self.applied[word] |= 1 << bit;
    }

    /// Applied in-window moves with `after < seq <= upto`.
    fn applied_between(&self, after: u32, upto: u32) -> u64 {
        let mut n = 0;
        for (w, &word) in self.applied.iter().enumerate() {
            let first = w as u64 * 64;
            let (lo, hi) = (u64::from(after) + 1, u64::from(upto));
            if first + 63 < lo || first > hi {
                continue;
            }
            let mut mask = u64::MAX;
            if lo > first {
                mask &= u64::MAX << (lo - first);
            }
            if hi < first + 63 {
                mask &= u64::MAX >> (63 - (hi - first));
            }
            n += u64::from((word & mask).count_ones());
        }
        n
    }
}

impl Trail {
    fn ring(&self) -> MutexGuard<'_, Ring> {
        // A panic while holding this lock leaves plain data behind: go on.
        self.ring.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Remembers a move just before it is sent (or, as seq 0, where the bot
    /// stood when it joined).
    pub fn push(&self, sent: Sent) {
        let mut ring = self.ring();
        let i = ring.next;
        ring.entries[i] = Some((sent, false));
        ring.next = (i + 1) % TRAIL_LEN;
        ring.newest_seq = ring.newest_seq.max(sent.seq);
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

    /// The newest seq sent so far.
    pub fn newest_seq(&self) -> u32 {
        self.ring().newest_seq
    }

    /// The move with this motion, seen delivered (so applied).
    fn delivered(&self, motion: &Motion) -> Option<Sent> {
        let mut ring = self.ring();
        let sent = ring.find(motion).and_then(|i| ring.entries[i])?.0;
        ring.mark_applied(&sent);
        Some(sent)
    }

    /// The seq of the move a snapshot shows this bot at (it was applied);
    /// 0 if none of the remembered ones: the bot had not moved there yet.
    fn shown_at(&self, motion: Option<&Motion>) -> u32 {
        motion.and_then(|m| self.delivered(m)).map_or(0, |s| s.seq)
    }

    /// Marks the move with this motion as echoed (so applied); returns it
    /// the first time.
    fn echo(&self, motion: &Motion) -> Result<Option<Sent>, ()> {
        let mut ring = self.ring();
        let i = ring.find(motion).ok_or(())?;
        let Some((sent, echoed)) = ring.entries[i] else {
            return Err(());
        };
        ring.mark_applied(&sent);
        if echoed {
            return Ok(None);
        }
        ring.entries[i] = Some((sent, true));
        Ok(Some(sent))
    }

    /// Applied in-window moves with `after < seq <= upto`.
    pub fn applied_between(&self, after: u32, upto: u32) -> u64 {
        self.ring().applied_between(after, upto)
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
    /// Deliveries this bot should have had (set by [`Ledger::finish`]).
    pub expected: u64,
    /// Deliveries of in-window moves.
    pub received: u64,
    /// In-window moves delivered again to the same receiver (or delivered
    /// after a snapshot that already showed them).
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

/// A sender in a receiver's view.
#[derive(Debug)]
struct Peer {
    trail: Arc<Trail>,
    /// The seq the receiver first saw it at: later moves are expected.
    from: u32,
    /// The newest seq delivered (or `from`).
    last: u32,
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
#[derive(Clone, Debug)]
pub struct Seen {
    pub id: MemberId,
    /// A bot of this run: its trail (see `Plan::is_bot_name`).
    pub bot: Option<Arc<Trail>>,
    /// Where the message shows it.
    pub motion: Option<Motion>,
}

impl Seen {
    pub fn bot(id: MemberId, trail: Arc<Trail>, motion: Option<Motion>) -> Self {
        Self {
            id,
            bot: Some(trail),
            motion,
        }
    }

    pub fn stranger(id: MemberId) -> Self {
        Self {
            id,
            bot: None,
            motion: None,
        }
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
    /// The senders in view, by member id.
    peers: Vec<Option<Peer>>,
    /// Views closed before the end: (trail, from, up to), settled at the end.
    closed: Vec<(Arc<Trail>, u32, u32)>,
    /// Expected deliveries of views settled early.
    settled: u64,
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
            closed: Vec::new(),
            settled: 0,
        };
        for seen in members {
            if seen.id != me {
                ledger.joined(seen);
            }
        }
        ledger.seat(me, Seat::Bot);
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

    fn seat(&mut self, id: MemberId, seat: Seat) {
        let i = id.0 as usize;
        if self.seats.len() <= i {
            self.seats.resize(i + 1, Seat::Empty);
        }
        match (self.seats[i], seat) {
            (Seat::Bot, Seat::Empty | Seat::Stranger) => self.count -= 1,
            (Seat::Empty | Seat::Stranger, Seat::Bot) => self.count += 1,
            _ => {}
        }
        self.seats[i] = seat;
    }

    /// The view of the sender at `id` ends: it expected what that sender
    /// sent up to now.
    fn close(&mut self, id: MemberId) {
        let Some(peer) = self.peers.get_mut(id.0 as usize).and_then(Option::take) else {
            return;
        };
        let upto = peer.trail.newest_seq();
        if self.closed.len() >= MAX_CLOSED {
            // Bounded: settle what was closed so far now.
            for (trail, from, upto) in self.closed.drain(..) {
                self.settled += trail.applied_between(from, upto);
            }
        }
        self.closed.push((peer.trail, peer.from, upto));
    }

    /// A resync: the room as it is now. Senders still there keep their
    /// view (what this bot missed of theirs was lost); senders gone are
    /// closed; senders new to this bot joined while it missed frames, so
    /// every move of theirs was due to it.
    pub fn reset(&mut self, members: impl IntoIterator<Item = Seen>) {
        let mut present = vec![false; self.seats.len()];
        for seen in members {
            let i = seen.id.0 as usize;
            if seen.id == self.me || seen.id.0 > MAX_MEMBER_ID {
                continue;
            }
            if present.len() <= i {
                present.resize(i + 1, false);
            }
            present[i] = true;
            let same = match (&seen.bot, self.peers.get(i).and_then(Option::as_ref)) {
                (Some(trail), Some(peer)) => Arc::ptr_eq(trail, &peer.trail),
                _ => false,
            };
            if same {
                // Still there; what it shows was applied (and, if this bot
                // never got it, lost).
                if let Some(trail) = &seen.bot {
                    trail.shown_at(seen.motion.as_ref());
                }
                continue;
            }
            self.joined(Seen {
                motion: None,
                ..seen
            });
        }
        for i in 0..self.seats.len() {
            if !present.get(i).copied().unwrap_or(false) && i != self.me.0 as usize {
                self.left(MemberId(i as u32));
            }
        }
        // A view always holds its owner, whatever the snapshot said.
        self.seat(self.me, Seat::Bot);
    }

    /// A resync after this bot missed frames: the room as it is now, and
    /// this bot's motion in it. If that is an in-window move not yet seen
    /// back, the server applied it in a batch this bot missed: it counts as
    /// applied (its echo latency is unknown).
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
        }
    }

    pub fn joined(&mut self, seen: Seen) {
        let id = seen.id;
        if id.0 > MAX_MEMBER_ID || id == self.me {
            return;
        }
        // Whoever had this id before is gone.
        self.close(id);
        match seen.bot {
            Some(trail) => {
                let from = trail.shown_at(seen.motion.as_ref());
                self.seat(id, Seat::Bot);
                let i = id.0 as usize;
                if self.peers.len() <= i {
                    self.peers.resize_with(i + 1, || None);
                }
                self.peers[i] = Some(Peer {
                    trail,
                    from,
                    last: from,
                });
            }
            None => self.seat(id, Seat::Stranger),
        }
    }

    pub fn left(&mut self, id: MemberId) {
        if id == self.me || id.0 > MAX_MEMBER_ID {
            return;
        }
        self.close(id);
        if self.seats.len() > id.0 as usize {
            self.seat(id, Seat::Empty);
        }
    }

    /// The end of this bot's session (after the drain, or when it was
    /// lost): every view it held is settled into `out.expected`.
    pub fn finish(&mut self, out: &mut FrameTally) {
        for i in 0..self.peers.len() {
            self.close(MemberId(i as u32));
        }
        out.expected += std::mem::take(&mut self.settled);
        for (trail, from, upto) in self.closed.drain(..) {
            out.expected += trail.applied_between(from, upto);
        }
    }

    /// A motion batch arrived at `now`.
    pub fn motion(&mut self, records: &[MotionRecord], now: Instant, out: &mut FrameTally) {
        for record in records {
            if record.member == self.me {
                self.echo(&record.motion, now, out);
            } else {
                self.delivery(record, now, out);
            }
        }
    }

    fn echo(&mut self, motion: &Motion, now: Instant, out: &mut FrameTally) {
        match self.own.echo(motion) {
            Err(()) => out.unmatched_echoes += 1,
            Ok(Some(sent)) if sent.in_window => {
                out.applied += 1;
                out.echo_latencies_us
                    .push(micros(now.saturating_duration_since(sent.at)));
            }
            Ok(_) => {}
        }
    }

    fn delivery(&mut self, record: &MotionRecord, now: Instant, out: &mut FrameTally) {
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
        let Some(peer) = self.peers.get_mut(i).and_then(Option::as_mut) else {
            out.unmatched += 1;
            return;
        };
        let Some(sent) = peer.trail.delivered(&record.motion) else {
            out.unmatched += 1;
            return;
        };
        if sent.seq <= peer.last {
            if sent.in_window {
                out.duplicates += 1;
            }
            return;
        }
        peer.last = sent.seq;
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

    fn rec(member: u32, motion: Motion) -> MotionRecord {
        MotionRecord {
            member: MemberId(member),
            motion,
        }
    }

    fn sent(trail: &Trail, motion: Motion, seq: u32, at: Instant, in_window: bool) {
        trail.push(Sent {
            motion,
            seq,
            at,
            in_window,
        });
    }

    /// A room on one node, as the server runs it: one ordered stream of
    /// messages that every member present receives, batches built from the
    /// moves applied.
    struct FakeRoom {
        bots: Vec<Option<(Ledger, Motion)>>,
        pending: Vec<MotionRecord>,
        totals: FrameTally,
        now: Instant,
    }

    impl FakeRoom {
        fn new() -> Self {
            Self {
                bots: Vec::new(),
                pending: Vec::new(),
                totals: FrameTally::default(),
                now: Instant::now(),
            }
        }

        fn add(&mut self, out: FrameTally) {
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

        fn seen(&self, id: usize) -> Seen {
            let (ledger, motion) = self.bots[id].as_ref().unwrap();
            Seen::bot(MemberId(id as u32), ledger.trail().clone(), Some(*motion))
        }

        /// The lowest free id, as the server hands them out; the bot stands
        /// somewhere of its own.
        fn join(&mut self) -> MemberId {
            let i = (0..)
                .find(|&i| self.bots.get(i).is_none_or(|b| b.is_none()))
                .unwrap();
            let id = MemberId(i as u32);
            let spawn = at(10_000 + i as u32);
            let trail = Arc::new(Trail::default());
            sent(&trail, spawn, 0, self.now, false);
            if self.bots.len() <= i {
                self.bots.resize_with(i + 1, || None);
            }
            let joined = Seen::bot(id, trail.clone(), Some(spawn));
            for bot in self.bots.iter_mut().flatten() {
                bot.0.joined(joined.clone());
            }
            let members: Vec<Seen> = (0..self.bots.len())
                .filter(|&k| self.bots[k].is_some())
                .map(|k| self.seen(k))
                .chain([joined])
                .collect();
            self.bots[i] = Some((Ledger::new(id, trail, members), spawn));
            id
        }

        fn leave(&mut self, id: MemberId) {
            let (mut ledger, _) = self.bots[id.0 as usize].take().unwrap();
            let mut out = FrameTally::default();
            ledger.finish(&mut out);
            self.add(out);
            for bot in self.bots.iter_mut().flatten() {
                bot.0.left(id);
            }
        }

        fn send(&mut self, id: MemberId, motion: Motion, seq: u32, in_window: bool) {
            let (ledger, _) = self.bots[id.0 as usize].as_ref().unwrap();
            sent(ledger.trail(), motion, seq, self.now, in_window);
            // Coalescing: newest move of a member wins within a tick.
            self.pending.retain(|r| r.member != id);
            self.pending.push(MotionRecord { member: id, motion });
        }

        fn tick(&mut self) {
            self.now += Duration::from_millis(100);
            let batch = std::mem::take(&mut self.pending);
            for r in &batch {
                if let Some(bot) = &mut self.bots[r.member.0 as usize] {
                    bot.1 = r.motion;
                }
            }
            let mut out = FrameTally::default();
            for bot in self.bots.iter_mut().flatten() {
                bot.0.motion(&batch, self.now, &mut out);
            }
            self.add(out);
        }

        /// The end of the run: every bot settles.
        fn end(&mut self) {
            let mut out = FrameTally::default();
            for bot in self.bots.iter_mut().flatten() {
                bot.0.finish(&mut out);
            }
            self.add(out);
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
        room.end();
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
        room.end();
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
        room.end();
        assert_eq!((room.totals.expected, room.totals.received), (0, 0));
        assert_eq!(room.totals.updates, 1, "the status line still sees it");
        assert_eq!(room.totals.latencies_us, vec![(100_000, false)]);
    }

    /// A receiver and a sender in one room, fed by hand: the sender's own
    /// ledger sees its echoes.
    struct Pair {
        now: Instant,
        sender: Ledger,
        receiver: Ledger,
        out: FrameTally,
    }

    impl Pair {
        /// Sender 1, receiver 2; the receiver's Welcome shows the sender
        /// where `shown` says (`None`: where it joined).
        fn new(shown: Option<Motion>, sends: &[(Motion, u32)]) -> Self {
            let now = Instant::now();
            let trail = Arc::new(Trail::default());
            sent(&trail, at(9_999), 0, now, false);
            let mut sender = Ledger::new(
                MemberId(1),
                trail.clone(),
                [Seen::bot(MemberId(1), trail.clone(), Some(at(9_999)))],
            );
            let mut out = FrameTally::default();
            for &(motion, seq) in sends {
                sent(&trail, motion, seq, now, true);
                sender.motion(&[rec(1, motion)], now, &mut out);
            }
            let receiver = Ledger::new(
                MemberId(2),
                Arc::default(),
                [
                    Seen::bot(MemberId(1), trail, Some(shown.unwrap_or(at(9_999)))),
                    Seen::bot(MemberId(2), Arc::default(), None),
                ],
            );
            Self {
                now,
                sender,
                receiver,
                out,
            }
        }

        /// The sender moves; its node applies it (the echo).
        fn moves(&mut self, motion: Motion, seq: u32) {
            sent(self.sender.trail(), motion, seq, self.now, true);
            self.echo(motion);
        }

        fn echo(&mut self, motion: Motion) {
            self.sender
                .motion(&[rec(1, motion)], self.now, &mut self.out);
        }

        fn deliver(&mut self, motion: Motion) {
            self.now += Duration::from_millis(100);
            self.receiver
                .motion(&[rec(1, motion)], self.now, &mut self.out);
        }

        fn end(mut self) -> FrameTally {
            self.receiver.finish(&mut self.out);
            self.sender.finish(&mut self.out);
            self.out
        }
    }

    /// Node B fans out a remote move to a member who joined B before the
    /// sender's node A heard of that member: due to it, and counted.
    #[test]
    fn a_remote_joiner_is_due_what_its_node_fans_out() {
        let mut p = Pair::new(None, &[]);
        p.moves(at(1), 1); // A applies it; A does not know the receiver yet
        p.deliver(at(1)); // B does, and the receiver is there
        let out = p.end();
        assert_eq!((out.applied, out.expected, out.received), (1, 1, 1));
    }

    /// Node A knew the receiver when it applied the move, but node B had
    /// applied it before the receiver joined B: its Welcome shows the
    /// sender there already, so nothing more is due.
    #[test]
    fn a_move_in_the_welcome_is_not_due_again() {
        let mut p = Pair::new(Some(at(1)), &[(at(1), 1)]);
        p.moves(at(2), 2);
        p.deliver(at(2));
        let out = p.end();
        assert_eq!((out.applied, out.expected, out.received), (2, 1, 1));
        assert_eq!(out.duplicates, 0);
    }

    /// A remote move a tick late (the sender's echo long before), and the
    /// receiver's echo-less view of a node that answers late: one delivery
    /// each, with their own latency.
    #[test]
    fn a_remote_move_a_tick_late_counts_once() {
        let mut p = Pair::new(None, &[]);
        p.moves(at(1), 1);
        p.moves(at(2), 2);
        p.deliver(at(1));
        p.deliver(at(1)); // again: a duplicate
        p.deliver(at(2));
        assert_eq!(
            p.out.latencies_us,
            vec![(100_000, true), (300_000, true)],
            "the late one shows in the latency"
        );
        let out = p.end();
        assert_eq!((out.expected, out.received, out.duplicates), (2, 2, 1));
    }

    /// A receiver may get a remote move before the sender got its own echo
    /// (node B ticks between A's cut and A's tick): the delivery itself
    /// shows the move was applied.
    #[test]
    fn a_delivery_before_the_senders_echo() {
        let mut p = Pair::new(None, &[]);
        sent(p.sender.trail(), at(1), 1, p.now, true);
        p.deliver(at(1));
        p.echo(at(1));
        let out = p.end();
        assert_eq!((out.applied, out.expected, out.received), (1, 1, 1));
    }

    /// Single node or not, a lost update is lost: a move the receiver
    /// never got, though due to it, counts as expected and not received.
    #[test]
    fn a_lost_update_is_counted_lost() {
        let mut p = Pair::new(None, &[]);
        p.moves(at(1), 1);
        p.deliver(at(1));
        p.moves(at(2), 2); // applied (echoed), never delivered
        p.moves(at(3), 3);
        p.deliver(at(3));
        p.moves(at(4), 4); // applied, lost at the end
        let out = p.end();
        assert_eq!((out.applied, out.expected, out.received), (4, 4, 2));
    }

    /// Senders on different nodes arrive in any order relative to each
    /// other: each is accounted on its own (per-sender order is all that
    /// holds), and a frame may hold local and remote moves together.
    #[test]
    fn senders_on_other_nodes_interleave_freely() {
        let now = Instant::now();
        let (s1, s2) = (Arc::new(Trail::default()), Arc::new(Trail::default()));
        // s1 (node A, id 17) joined before s2 (node B, id 2), but the
        // receiver (node C, id 3) hears of s2 and its moves first.
        let mut r = Ledger::new(
            MemberId(3),
            Arc::default(),
            [Seen::bot(MemberId(3), Arc::default(), None)],
        );
        let mut out = FrameTally::default();
        sent(&s1, at(1), 1, now, true);
        sent(&s2, at(2), 1, now, true);
        r.joined(Seen::bot(MemberId(2), s2.clone(), Some(at(500))));
        r.motion(&[rec(2, at(2))], now, &mut out);
        r.joined(Seen::bot(MemberId(17), s1.clone(), Some(at(600))));
        sent(&s2, at(4), 2, now, true);
        r.motion(&[rec(17, at(1)), rec(2, at(4))], now, &mut out);
        // s1's echo comes after all that.
        s1.echo(&at(1)).unwrap();
        r.finish(&mut out);
        assert_eq!((out.expected, out.received), (3, 3));
        assert_eq!((out.unmatched, out.duplicates), (0, 0));
        assert_eq!(r.members(), 3);
    }

    /// A node declared lost (its members Left with SERVER_LOST) and taken
    /// back (Joined again, at where they are now): what the sender sent
    /// before its receiver's node gave up on it was due and lost; what it
    /// sent while out of view was not due.
    #[test]
    fn a_node_lost_and_taken_back() {
        let mut p = Pair::new(None, &[]);
        p.moves(at(1), 1);
        p.deliver(at(1));
        p.moves(at(2), 2); // A froze: never reaches B
        p.receiver.left(MemberId(1));
        p.moves(at(3), 3);
        let trail = p.sender.trail().clone();
        p.receiver
            .joined(Seen::bot(MemberId(1), trail, Some(at(3))));
        p.moves(at(4), 4);
        p.deliver(at(4));
        let out = p.end();
        assert_eq!((out.expected, out.received), (3, 2));
    }

    #[test]
    fn repeated_delivery_is_a_duplicate() {
        let sender = Arc::new(Trail::default());
        let mut receiver = Ledger::new(
            MemberId(0),
            Arc::default(),
            [
                Seen::bot(MemberId(0), Arc::default(), None),
                Seen::bot(MemberId(1), sender.clone(), None),
            ],
        );
        let now = Instant::now();
        sent(&sender, at(7), 4, now, true);
        let batch = [rec(1, at(7))];
        let mut out = FrameTally::default();
        receiver.motion(&batch, now, &mut out);
        receiver.motion(&batch, now, &mut out);
        assert_eq!((out.received, out.duplicates), (1, 1));
        // A motion nobody sent, and a member nobody knows.
        receiver.motion(&[rec(1, at(8)), rec(9, at(7))], now, &mut out);
        assert_eq!(out.unmatched, 2);
        receiver.finish(&mut out);
        assert_eq!(out.expected, 1);
    }

    #[test]
    fn trail_forgets_the_oldest() {
        let trail = Trail::default();
        let now = Instant::now();
        for x in 0..(TRAIL_LEN as u32 + 2) {
            sent(&trail, at(x), x, now, true);
        }
        assert!(!trail.contains(&at(0)) && !trail.contains(&at(1)));
        assert!(trail.contains(&at(2)));
        assert_eq!(
            trail.find(&at(TRAIL_LEN as u32 + 1)).unwrap().seq,
            TRAIL_LEN as u32 + 1
        );
        assert_eq!(trail.newest_seq(), TRAIL_LEN as u32 + 1);
    }

    #[test]
    fn applied_moves_are_counted_by_range() {
        let trail = Trail::default();
        let now = Instant::now();
        for seq in 1..200 {
            sent(&trail, at(seq), seq, now, seq % 3 != 0);
            // Every in-window move but seq 100 is seen applied.
            if seq != 100 {
                trail.delivered(&at(seq));
            }
        }
        let applied = |after: u32, upto: u32| {
            (after + 1..=upto)
                .filter(|s| s % 3 != 0 && *s != 100 && *s < 200)
                .count() as u64
        };
        for (after, upto) in [
            (0, 199),
            (0, 63),
            (63, 64),
            (60, 130),
            (99, 100),
            (5, 5),
            (150, 400),
        ] {
            assert_eq!(
                trail.applied_between(after, upto),
                applied(after, upto),
                "({after}, {upto}]"
            );
        }
        assert_eq!(trail.applied_between(10, 3), 0);
        // Past the bound, nothing is recorded (and nothing panics).
        sent(&trail, at(1), MAX_TRACKED_SEQ, now, true);
        assert!(trail.delivered(&at(1)).is_some());
        assert_eq!(trail.applied_between(199, u32::MAX), 0);
    }

    #[test]
    fn a_move_applied_in_a_missed_batch_counts_on_resync() {
        let own = Arc::new(Trail::default());
        let peer = Arc::new(Trail::default());
        let mut l = Ledger::new(
            MemberId(0),
            own.clone(),
            [
                Seen::bot(MemberId(0), own.clone(), None),
                Seen::bot(MemberId(1), peer.clone(), None),
            ],
        );
        sent(&own, at(3), 1, Instant::now(), true);
        let mut out = FrameTally::default();
        l.resync(
            [
                Seen::bot(MemberId(0), own.clone(), Some(at(3))),
                Seen::bot(MemberId(1), peer.clone(), None),
            ],
            Some(at(3)),
            &mut out,
        );
        assert_eq!(out.applied, 1);
        // Seen once: neither a later echo nor another resync counts it again.
        l.resync(
            [Seen::bot(MemberId(1), peer.clone(), None)],
            Some(at(3)),
            &mut out,
        );
        l.motion(&[rec(0, at(3))], Instant::now(), &mut out);
        assert_eq!(out.applied, 1);
        // The peer's own view of this bot expects the move it never got.
        let mut theirs = Ledger::new(
            MemberId(1),
            peer,
            [Seen::bot(MemberId(0), own, Some(at(500)))],
        );
        theirs.finish(&mut out);
        assert_eq!((out.expected, out.received), (1, 0));
    }

    /// A resync after missed frames: what the bot missed of senders still
    /// there is lost; a sender gone is closed; a sender that joined while it
    /// missed frames was due every move since.
    #[test]
    fn resync_keeps_losses_lost() {
        let now = Instant::now();
        let (s, t, gone) = (
            Arc::new(Trail::default()),
            Arc::new(Trail::default()),
            Arc::new(Trail::default()),
        );
        let mut r = Ledger::new(
            MemberId(0),
            Arc::default(),
            [
                Seen::bot(MemberId(1), s.clone(), None),
                Seen::bot(MemberId(2), gone.clone(), None),
            ],
        );
        let mut out = FrameTally::default();
        for seq in 1..=3 {
            sent(&s, at(seq), seq, now, true);
            s.echo(&at(seq)).unwrap();
        }
        sent(&gone, at(50), 1, now, true);
        gone.echo(&at(50)).unwrap();
        sent(&t, at(70), 1, now, true);
        t.echo(&at(70)).unwrap();
        sent(&t, at(71), 2, now, true);
        r.motion(&[rec(1, at(1))], now, &mut out);
        // Missed: s's 2 and 3, gone's 50 (then it left), t's join and 70.
        r.resync(
            [
                Seen::bot(MemberId(1), s.clone(), Some(at(3))),
                Seen::bot(MemberId(3), t.clone(), Some(at(70))),
            ],
            None,
            &mut out,
        );
        assert_eq!(r.members(), 3);
        r.motion(&[rec(3, at(71))], now, &mut out);
        r.finish(&mut out);
        // s: 1, 2, 3; gone: 50; t: 70, 71.
        assert_eq!((out.expected, out.received), (6, 2));
    }

    #[test]
    fn resync_rebuilds_the_view() {
        let bot = |id: u32| Seen::bot(MemberId(id), Arc::default(), None);
        let mut l = Ledger::new(MemberId(3), Arc::default(), [bot(1), bot(3)]);
        assert_eq!(l.members(), 2);
        l.joined(bot(5));
        l.joined(bot(5));
        assert_eq!(l.members(), 3);
        l.left(MemberId(1));
        l.left(MemberId(1));
        assert_eq!(l.members(), 2);
        l.reset([bot(0), bot(2)]);
        assert_eq!(l.members(), 3, "the owner stays in its view");
        l.joined(Seen::stranger(MemberId(7)));
        assert_eq!(l.members(), 3, "a stranger is not a bot of the run");
        l.joined(Seen::stranger(MemberId(2)));
        assert_eq!(l.members(), 2, "an id taken over by a stranger");
    }

    #[test]
    fn strangers_are_neither_expected_nor_unmatched() {
        let own = Arc::new(Trail::default());
        let peer = Arc::new(Trail::default());
        // Me (0), a bot of the run (1), and a person (2).
        let members = [
            Seen::bot(MemberId(0), own.clone(), None),
            Seen::bot(MemberId(1), peer.clone(), None),
            Seen::stranger(MemberId(2)),
        ];
        let mut me = Ledger::new(MemberId(0), own.clone(), members);
        let now = Instant::now();
        sent(&own, at(1), 1, now, true);
        sent(&peer, at(5), 1, now, true);
        let batch = [rec(0, at(1)), rec(1, at(5)), rec(2, at(9))];
        let mut out = FrameTally::default();
        me.motion(&batch, now, &mut out);
        assert_eq!((out.received, out.updates), (1, 1));
        assert_eq!((out.strangers, out.unmatched), (1, 0));
        // A person joining later is a stranger too.
        me.joined(Seen::stranger(MemberId(3)));
        assert_eq!(me.members(), 2);
        me.finish(&mut out);
        assert_eq!(out.expected, 1, "only the other bot's move is due here");
    }

    #[test]
    fn closed_views_stay_bounded() {
        let now = Instant::now();
        let s = Arc::new(Trail::default());
        let mut r = Ledger::new(MemberId(0), Arc::default(), []);
        let mut out = FrameTally::default();
        for seq in 1..=(MAX_CLOSED as u32 * 3) {
            r.joined(Seen::bot(MemberId(1), s.clone(), None));
            sent(&s, at(seq), seq, now, true);
            s.echo(&at(seq)).unwrap();
            r.left(MemberId(1));
            assert!(r.closed.len() <= MAX_CLOSED);
        }
        r.finish(&mut out);
        // Every view started at 0 and ended at its move: n(n+1)/2 due.
        let n = u64::from(MAX_CLOSED as u32 * 3);
        assert_eq!(out.expected, n * (n + 1) / 2);
    }
}
