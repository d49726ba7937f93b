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
//!
//! The sender's side, its [`Trail`], is `trail`; the receiver's, its
//! [`Ledger`], is here.

mod trail;

use std::sync::Arc;
use std::time::{Duration, Instant};

use amble::protocol::{MemberId, Motion, MotionRecord};

pub use self::trail::{Sent, Trail};

/// Member ids above this are ignored (a node hands out the lowest free
/// local index, times the cluster's slots plus its slot: real ids stay far
/// below).
const MAX_MEMBER_ID: u32 = 1 << 16;

/// A spatial room's boundary: a sender's moves this long before it went
/// out of view are not owed (the one that took it out, and a tick of
/// latency either side).
pub const VIEW_EDGE: Duration = Duration::from_millis(400);

/// Closed views (a sender left, or its id changed hands) a ledger keeps
/// until its end; past this it settles them at once.
const MAX_CLOSED: usize = 1_024;

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
        self.close_before(id, None);
    }

    /// As [`close`](Self::close); with `edge`, only what the sender sent
    /// up to that instant: a spatial room's boundary, where the move that
    /// took the sender out of view (sent just before) is owed to nobody.
    fn close_before(&mut self, id: MemberId, edge: Option<Instant>) {
        let Some(peer) = self.peers.get_mut(id.0 as usize).and_then(Option::take) else {
            return;
        };
        let upto = match edge {
            None => peer.trail.newest_seq(),
            // Never before what this view already got.
            Some(at) => peer.trail.newest_seq_before(at).max(peer.last),
        };
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
        self.left_at(id, None);
    }

    /// A spatial room: the sender at `id` went out of view at `now`. What
    /// it sent within [`VIEW_EDGE`] before is in the band at the rule's
    /// edge, where a delivery is allowed but not owed.
    pub fn out_of_view(&mut self, id: MemberId, now: Instant) {
        self.left_at(id, now.checked_sub(VIEW_EDGE));
    }

    fn left_at(&mut self, id: MemberId, edge: Option<Instant>) {
        if id == self.me || id.0 > MAX_MEMBER_ID {
            return;
        }
        self.close_before(id, edge);
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

    /// This bot drops its connection on purpose (and will resume): every
    /// view is settled up to the last move it received of that sender.
    /// What came after it was on its way when the socket went: not lost,
    /// the resumed session's snapshot shows where it led.
    pub fn cut(&mut self, out: &mut FrameTally) {
        for i in 0..self.peers.len() {
            let Some(peer) = self.peers.get_mut(i).and_then(Option::take) else {
                continue;
            };
            self.closed.push((peer.trail, peer.from, peer.last));
        }
        self.finish(out);
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
mod tests;
