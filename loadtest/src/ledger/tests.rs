//! The ledger at exact counts: a room on one node as the server runs it
//! (`FakeRoom`), a sender and a receiver fed by hand as nodes of a cluster
//! may order them (`Pair`), resyncs, strangers, and the bound on closed
//! views.

use super::*;
use amble::protocol::Position;

/// Test-only constructors: the bot reads members from the server's
/// messages instead (`bot::session`).
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

/// A receiver that drops its connection on purpose (and resumes) expects
/// each sender's moves up to the last one it received: a gap before it is
/// still a loss, the moves after it were on their way when the socket went.
#[test]
fn a_dropped_session_expects_up_to_its_last_delivery() {
    let mut p = Pair::new(None, &[]);
    p.moves(at(1), 1);
    p.deliver(at(1));
    p.moves(at(2), 2); // applied, never delivered: lost
    p.moves(at(3), 3);
    p.deliver(at(3));
    p.moves(at(4), 4); // on its way when the receiver dropped
    p.receiver.cut(&mut p.out);
    p.sender.finish(&mut p.out);
    assert_eq!((p.out.applied, p.out.expected, p.out.received), (4, 3, 2));
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

/// A spatial room: a sender whose move took it out of a receiver's view
/// owes that receiver nothing it sent at the edge (that move), and
/// everything before; a plain `Left` at the same moment owes it all.
#[test]
fn a_sender_out_of_view_owes_nothing_it_sent_at_the_edge() {
    for (out_of_view, owed) in [(true, 2), (false, 3)] {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let sender = Arc::new(Trail::default());
        let mut r = Ledger::new(
            MemberId(0),
            Arc::new(Trail::default()),
            [Seen::bot(MemberId(1), Arc::clone(&sender), None)],
        );
        let mut out = FrameTally::default();
        sent(&sender, at(1), 1, t0, true);
        r.motion(&[rec(1, at(1))], t0 + ms(100), &mut out);
        sent(&sender, at(2), 2, t0 + ms(1_000), true);
        r.motion(&[rec(1, at(2))], t0 + ms(1_100), &mut out);
        // The move that takes it out of view: applied (seen elsewhere), not
        // sent here, and the Disappeared arrives a tick later.
        sent(&sender, at(3), 3, t0 + ms(2_000), true);
        let _ = sender.delivered(&at(3));
        let when = t0 + ms(2_100);
        if out_of_view {
            r.out_of_view(MemberId(1), when);
        } else {
            r.left(MemberId(1));
        }
        r.finish(&mut out);
        assert_eq!(
            (out.expected, out.received),
            (owed, 2),
            "out of view: {out_of_view}"
        );
    }
}
