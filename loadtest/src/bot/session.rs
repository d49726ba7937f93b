//! A joined bot: it moves (and chats) on its timers, reads everything the
//! room sends, and counts it.
//!
//! One `select!` over the socket, the move and chat timers, the end of the
//! schedule and a halt; no second task, no channel. The receive path
//! decodes into a reused `ServerMessage`, accounts through the [`Ledger`]
//! and adds the frame's counts to this thread's shard.

use std::time::{Duration, Instant, SystemTime};

use amble::protocol::{self, MemberId, Motion, Position, Walk, pb};
use futures_util::{SinkExt as _, StreamExt as _};
use prost::Message as _;
use tokio::time::{sleep_until, timeout};
use tokio_tungstenite::tungstenite::Message;

use crate::ledger::{FrameTally, Ledger, Seen, Sent};
use crate::plan::unix_ms;
use crate::random::SplitMix;
use crate::stats::{AtomicCounts, ErrorKind, Shard};
use crate::wire::{Socket, frame_bytes};

use super::mover::{Mover, World};
use super::{Ended, Run, SEND_TIMEOUT};

/// Bound on the close handshake at the end.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(2);

/// A member as this run sees it: one of its bots (with its trail), or a
/// stranger; and where it is shown.
fn seen(run: &Run, member: &pb::Member) -> Seen {
    Seen {
        id: MemberId(member.id),
        bot: run
            .plan
            .bot_index(&member.name)
            .and_then(|i| run.trail_of(i))
            .cloned(),
        motion: motion_of(member),
    }
}

/// A member's motion as a snapshot lists it.
fn motion_of(member: &pb::Member) -> Option<Motion> {
    let p = member.position?;
    let position = Position { x: p.x, y: p.y };
    let walk = match member.walk {
        None => None,
        Some(w) => {
            let t = w.target?;
            Some(Walk {
                target: Position { x: t.x, y: t.y },
                speed: w.speed,
            })
        }
    };
    Some(Motion { position, walk })
}

/// A joined bot.
pub(super) struct Session<'a> {
    run: &'a Run,
    index: u32,
    ws: Socket,
    ledger: Ledger,
    mover: Mover,
    rng: SplitMix,
    seq: u32,
    move_interval: Duration,
    /// Chat interval and budget, if chatting.
    chat_interval: Option<Duration>,
    chats: u32,
    /// A spatial room: how far another member may be and still be sent
    /// to this bot (`None` in a plain room).
    band: Option<Band>,
    /// Reused for every frame: decoding allocates nothing once warm.
    msg: pb::ServerMessage,
    tally: FrameTally,
    /// The place's resume token (`Welcome.resume_token`), for a rejoin.
    resume_token: String,
}

/// The edge of a spatial room's interest rule, from the Welcome's limits:
/// a member further than two cells and two margins on either axis is
/// never in view (`room::interest::Grid::may_see`), plus a slack for the
/// ticks between the server's positions and this bot's own.
#[derive(Clone, Copy, Debug)]
struct Band {
    reach_cm: u64,
}

/// Slack for positions seen a few ticks apart: two seconds of walking.
const BAND_SLACK_CM: u64 = 2 * 150 * 2;

impl Band {
    fn of(limits: &pb::Limits) -> Self {
        Self {
            reach_cm: 2 * u64::from(limits.interest_cell)
                + 2 * u64::from(limits.interest_margin)
                + BAND_SLACK_CM,
        }
    }

    fn leaks(&self, me: amble::protocol::Position, them: amble::protocol::Position) -> bool {
        u64::from(me.x.abs_diff(them.x)) >= self.reach_cm
            || u64::from(me.y.abs_diff(them.y)) >= self.reach_cm
    }
}

/// Which timer fired.
enum Due {
    Move,
    Chat,
}

impl<'a> Session<'a> {
    /// `generation`: how many sessions this bot had before (drops), so
    /// that each draws other random numbers.
    pub(super) fn new(
        run: &'a Run,
        index: u32,
        generation: u32,
        ws: Socket,
        mut welcome: pb::Welcome,
    ) -> Self {
        let plan = &run.plan;
        let limits = welcome.limits.unwrap_or_default();
        let me = MemberId(welcome.member_id);
        let members: Vec<&pb::Member> = welcome
            .snapshot
            .as_ref()
            .map(|s| s.members.iter().collect())
            .unwrap_or_default();
        let world = World::from_limits(&limits);
        let mut rng = SplitMix::new(
            (u64::from(index) << 20 | u64::from(generation) << 52)
                ^ u64::from_str_radix(&plan.run_tag, 16).unwrap_or(0),
        );
        let spatial = limits.interest_radius > 0;
        let start = members
            .iter()
            .find(|m| m.id == me.0)
            .and_then(|m| m.position)
            .map(|p| world.clamp(i64::from(p.x), i64::from(p.y)))
            .filter(|_| !(plan.crowds && spatial))
            // In crowds: the first move starts from the bot's spot (the
            // server takes a move's position as it is: a jump there).
            .unwrap_or_else(|| world.in_crowd(index, &mut rng));
        let move_interval = Duration::from_millis(
            plan.move_interval_ms
                .max(u64::from(limits.move_interval_ms)),
        );
        let chat_interval = plan
            .chat_interval_ms
            .map(|ms| Duration::from_millis(ms.max(u64::from(limits.chat_interval_ms))));
        let trail = run.trail_of(index).cloned().unwrap_or_default();
        // A resumed session goes on from the last seq of the one before.
        let seq = trail.newest_seq();
        // Where it stands before its first move: seq 0, so that no move of
        // its first few returns there, and a snapshot showing it there is
        // read right. (A session after a drop stands where its moves led.)
        if let Some(motion) = members
            .iter()
            .find(|m| m.id == me.0)
            .and_then(|m| motion_of(m))
            .filter(|_| seq == 0)
        {
            trail.push(Sent {
                motion,
                seq: 0,
                at: Instant::now(),
                in_window: false,
            });
        }
        let ledger = Ledger::new(me, trail, members.iter().map(|m| seen(run, m)));
        run.unsettled.send_modify(|n| *n += 1);
        Self {
            run,
            index,
            ws,
            ledger,
            mover: Mover::new(plan.movement, world, start, move_interval),
            band: spatial.then(|| Band::of(&limits)),
            rng,
            seq,
            move_interval,
            chat_interval,
            chats: 0,
            msg: pb::ServerMessage::default(),
            tally: FrameTally::default(),
            resume_token: std::mem::take(&mut welcome.resume_token),
        }
    }

    /// The token that takes this session's place back after a drop.
    pub(super) fn resume_token(&self) -> &str {
        &self.resume_token
    }

    /// When this session drops its connection on purpose: each bot drops
    /// at random times, `drops_per_sec` of the bots a second on average.
    fn next_drop(&mut self, now: Instant) -> Option<Instant> {
        let rate = self.run.plan.drops_per_sec;
        if rate <= 0.0 {
            return None;
        }
        // An exponential wait: -ln(u) / rate seconds, u in (0, 1].
        let u = (self.rng.below(1 << 30) as f64 + 1.0) / f64::from(1u32 << 30);
        Some(now + Duration::from_secs_f64((-u.ln() / rate).min(3_600.0)))
    }

    /// Up to 5% more than `interval`, never less.
    fn jittered(&mut self, interval: Duration) -> Duration {
        let jitter_us = u64::try_from(interval.as_micros() / 20).unwrap_or(0);
        interval + Duration::from_micros(self.rng.below(jitter_us + 1))
    }

    pub(super) async fn run(&mut self) -> Ended {
        let schedule = self.run.schedule;
        let now = Instant::now();
        // A random phase within the first interval.
        let phase = |rng: &mut SplitMix, every: Duration| {
            Duration::from_micros(rng.below(u64::try_from(every.as_micros()).unwrap_or(1).max(1)))
        };
        let mut next_move = now + phase(&mut self.rng, self.move_interval);
        let mut next_chat = self
            .chat_interval
            .map(|every| now + phase(&mut self.rng, every));
        let move_timer = sleep_until(next_move.into());
        let chat_timer = sleep_until(next_chat.unwrap_or(schedule.drain_end).into());
        let end = sleep_until(schedule.drain_end.into());
        // Drops only inside the window, so the figures see them (and the
        // ramp is not slowed by them).
        let drop_at = self
            .next_drop(now.max(schedule.window_start))
            .filter(|t| *t < schedule.window_end);
        let drop_timer = sleep_until(drop_at.unwrap_or(schedule.drain_end).into());
        let run = self.run;
        let halted = run.halted();
        tokio::pin!(move_timer, chat_timer, end, halted, drop_timer);
        loop {
            let sending = next_move < schedule.window_end;
            let chatting = next_chat.is_some_and(|t| t < schedule.window_end);
            let due = tokio::select! {
                biased;
                () = &mut end => return Ended::AsPlanned,
                () = &mut halted => return Ended::AsPlanned,
                frame = self.ws.next() => {
                    if !self.on_frame(frame) {
                        return Ended::Lost;
                    }
                    continue;
                }
                () = &mut drop_timer, if drop_at.is_some() => return Ended::Dropped,
                () = &mut move_timer, if sending => Due::Move,
                () = &mut chat_timer, if chatting => Due::Chat,
            };
            let ok = match due {
                Due::Move => {
                    let ok = self.send_move().await;
                    next_move = Instant::now() + self.jittered(self.move_interval);
                    move_timer.as_mut().reset(next_move.into());
                    ok
                }
                Due::Chat => {
                    let ok = self.send_chat().await;
                    let every = self.chat_interval.unwrap_or(self.move_interval);
                    let next = Instant::now() + self.jittered(every);
                    next_chat = Some(next);
                    chat_timer.as_mut().reset(next.into());
                    ok
                }
            };
            if !ok {
                return Ended::Lost;
            }
        }
    }

    /// Sends one frame, counting it; false if the socket is done.
    async fn send(
        &mut self,
        payload: Vec<u8>,
        in_window: bool,
        stats: impl FnOnce(&Shard),
    ) -> bool {
        let wire = frame_bytes(payload.len(), true);
        let result = timeout(SEND_TIMEOUT, self.ws.send(Message::Binary(payload.into()))).await;
        self.run.stats.with(|s| {
            if matches!(result, Ok(Ok(()))) {
                stats(s);
            }
            if in_window {
                AtomicCounts::bump(&s.counts.bytes_out, wire);
                AtomicCounts::bump(&s.counts.frames_out, 1);
            }
            match result {
                Err(_) => s.error(ErrorKind::SendTimeout, 1),
                Ok(Err(_)) => s.error(ErrorKind::SendFailed, 1),
                Ok(Ok(())) => {}
            }
        });
        matches!(result, Ok(Ok(())))
    }

    async fn send_move(&mut self) -> bool {
        let now = Instant::now();
        let in_window = self.run.schedule.in_window(now);
        let motion = self.mover.next(now, self.ledger.trail(), &mut self.rng);
        if self.band.is_some() && in_window {
            let in_view = u64::from(self.ledger.members());
            self.run.stats.with(|s| {
                AtomicCounts::bump(&s.counts.in_view_sum, in_view);
                AtomicCounts::bump(&s.counts.in_view_samples, 1);
            });
        }
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        self.ledger.trail().push(Sent {
            motion,
            seq,
            at: now,
            in_window,
        });
        let payload =
            protocol::encode_client(protocol::move_body(motion, seq, unix_ms(SystemTime::now())));
        self.send(payload, in_window, |s| {
            AtomicCounts::bump(&s.counts.live_moves_sent, 1);
            if in_window {
                AtomicCounts::bump(&s.counts.moves_sent, 1);
            }
        })
        .await
    }

    async fn send_chat(&mut self) -> bool {
        self.chats += 1;
        let in_window = self.run.schedule.in_window(Instant::now());
        let text = format!("hello from bot {} ({})", self.index, self.chats);
        let payload =
            protocol::encode_client(pb::client_message::Body::Chat(pb::SendChat { text }));
        self.send(payload, in_window, |s| {
            if in_window {
                AtomicCounts::bump(&s.counts.chats_sent, 1);
            }
        })
        .await
    }

    /// Handles what the socket gave; false when the session is over.
    fn on_frame(
        &mut self,
        frame: Option<Result<Message, tokio_tungstenite::tungstenite::Error>>,
    ) -> bool {
        let now = Instant::now();
        let in_window = self.run.schedule.in_window(now);
        let bytes = match frame {
            Some(Ok(Message::Binary(bytes))) => bytes,
            Some(Ok(Message::Ping(payload))) => {
                // tungstenite answers with a Pong of the same payload.
                let (wire_in, wire_out) = (
                    frame_bytes(payload.len(), false),
                    frame_bytes(payload.len(), true),
                );
                self.run.stats.with(|s| {
                    AtomicCounts::bump(&s.counts.live_bytes_in, wire_in);
                    if in_window {
                        AtomicCounts::bump(&s.counts.bytes_in, wire_in);
                        AtomicCounts::bump(&s.counts.frames_in, 1);
                        AtomicCounts::bump(&s.counts.bytes_out, wire_out);
                        AtomicCounts::bump(&s.counts.frames_out, 1);
                    }
                });
                return true;
            }
            Some(Ok(Message::Pong(_) | Message::Frame(_))) => return true,
            Some(Ok(Message::Text(_))) => {
                self.run.stats.with(|s| s.error(ErrorKind::TextFrame, 1));
                return true;
            }
            Some(Ok(Message::Close(_))) | None => {
                self.run.stats.with(|s| s.error(ErrorKind::Closed, 1));
                return false;
            }
            Some(Err(_)) => {
                self.run.stats.with(|s| s.error(ErrorKind::ReadFailed, 1));
                return false;
            }
        };
        let wire = frame_bytes(bytes.len(), false);
        self.tally.clear();
        let mut chat = 0;
        let mut resync = false;
        let mut server_error = None;
        let (mut leaked, mut appeared, mut disappeared) = (0_u64, 0_u64, 0_u64);
        self.msg.clear();
        let decoded = self.msg.merge(&bytes[..]).is_ok();
        if decoded && !self.msg.motion.is_empty() {
            match protocol::decode_motion(&self.msg.motion) {
                Ok((_time, records)) => {
                    if let Some(band) = self.band {
                        let here = self.mover.position(now);
                        let me = self.ledger.me();
                        leaked = records
                            .iter()
                            .filter(|r| r.member != me && band.leaks(here, r.motion.position))
                            .count() as u64;
                    }
                    self.ledger.motion(&records, now, &mut self.tally)
                }
                Err(_) => server_error = Some(None),
            }
        } else if decoded {
            use pb::server_message::Body;
            match self.msg.body.take() {
                Some(Body::Joined(joined)) => {
                    if let Some(m) = joined.member {
                        self.ledger.joined(seen(self.run, &m));
                    }
                }
                Some(Body::Left(left)) => self.ledger.left(MemberId(left.member_id)),
                // A spatial room: members coming into view are owed
                // updates from now on, as joiners are; those going out of
                // view are owed nothing more, as leavers.
                Some(Body::Appeared(came)) => {
                    appeared = came.members.len() as u64;
                    for m in &came.members {
                        self.ledger.joined(seen(self.run, m));
                    }
                }
                Some(Body::Disappeared(gone)) => {
                    disappeared = gone.member_ids.len() as u64;
                    for id in gone.member_ids {
                        self.ledger.out_of_view(MemberId(id), now);
                    }
                }
                Some(Body::Chat(_)) => chat = 1,
                Some(Body::Resync(snapshot)) => {
                    resync = true;
                    let me = self.ledger.me().0;
                    let mine = snapshot
                        .members
                        .iter()
                        .find(|m| m.id == me)
                        .and_then(motion_of);
                    let run = self.run;
                    self.ledger.resync(
                        snapshot.members.iter().map(|m| seen(run, m)),
                        mine,
                        &mut self.tally,
                    );
                }
                Some(Body::Error(error)) => server_error = Some(Some(error.code)),
                // Bots join without a token: nothing of theirs expires.
                // Bots do not resume, so no member of theirs is renumbered;
                // a system message is not movement.
                Some(
                    Body::Welcome(_)
                    | Body::Pong(_)
                    | Body::MemberData(_)
                    | Body::TokenExpiring(_)
                    | Body::TokenRefreshed(_)
                    | Body::System(_)
                    | Body::Renumbered(_)
                    | Body::Population(_)
                    | Body::Found(_),
                )
                | None => {}
            }
        } else {
            server_error = Some(None);
        }
        let t = &self.tally;
        self.run.stats.with(|s| {
            let c = &s.counts;
            AtomicCounts::bump(&c.live_bytes_in, wire);
            AtomicCounts::bump(&c.live_updates, t.updates);
            if in_window {
                AtomicCounts::bump(&c.bytes_in, wire);
                AtomicCounts::bump(&c.frames_in, 1);
                AtomicCounts::bump(&c.chats_received, chat);
                AtomicCounts::bump(&c.interest_leaked, leaked);
                AtomicCounts::bump(&c.interest_appeared, appeared);
                AtomicCounts::bump(&c.interest_disappeared, disappeared);
            }
            AtomicCounts::bump(&c.moves_applied, t.applied);
            AtomicCounts::bump(&c.updates_expected, t.expected);
            AtomicCounts::bump(&c.updates_received, t.received);
            AtomicCounts::bump(&c.duplicates, t.duplicates);
            s.error(ErrorKind::UnmatchedUpdate, t.unmatched);
            s.error(ErrorKind::UnmatchedEcho, t.unmatched_echoes);
            if resync {
                s.error(ErrorKind::Resync, 1);
            }
            match server_error {
                Some(Some(code)) => s.server_error(code),
                Some(None) => s.error(ErrorKind::Decode, 1),
                None => {}
            }
            if !t.latencies_us.is_empty() || !t.echo_latencies_us.is_empty() {
                let mut l = s.latencies();
                for &(us, counted) in &t.latencies_us {
                    l.live.saturating_record(us.max(1));
                    if counted {
                        l.window.saturating_record(us.max(1));
                    }
                }
                for &us in &t.echo_latencies_us {
                    l.echo.saturating_record(us.max(1));
                }
            }
        });
        true
    }

    /// Counts the deliveries this bot should have had, now that its session
    /// is over (see [`Ledger::finish`]).
    pub(super) fn settle(&mut self) {
        self.settle_with(Ledger::finish);
    }

    /// As [`settle`](Self::settle), for a connection dropped on purpose:
    /// each sender's moves count up to the last one received.
    pub(super) fn settle_cut(&mut self) {
        self.settle_with(Ledger::cut);
    }

    fn settle_with(&mut self, settle: fn(&mut Ledger, &mut FrameTally)) {
        self.tally.clear();
        settle(&mut self.ledger, &mut self.tally);
        let expected = self.tally.expected;
        self.run
            .stats
            .with(|s| AtomicCounts::bump(&s.counts.updates_expected, expected));
        self.run.unsettled.send_modify(|n| *n = n.saturating_sub(1));
    }

    /// Drops the connection without a close handshake (a network that
    /// blinked): the server sees the socket end.
    pub(super) fn abort(self) {
        drop(self.ws);
    }

    /// Closes the socket, bounded.
    pub(super) async fn close(mut self) {
        let closed = timeout(CLOSE_TIMEOUT, async {
            let _ = self.ws.close(None).await;
            // Read until the server's close (or the end of the stream).
            while let Some(Ok(_)) = self.ws.next().await {}
        })
        .await;
        if closed.is_err() {
            self.run.stats.with(|s| s.error(ErrorKind::CloseTimeout, 1));
        }
    }
}

#[cfg(test)]
mod band_tests {
    use super::*;
    use amble::protocol::Position;

    #[test]
    fn the_band_is_two_cells_two_margins_and_the_slack_on_either_axis() {
        let band = Band::of(&pb::Limits {
            interest_cell: 1_874,
            interest_margin: 187,
            ..pb::Limits::default()
        });
        let me = Position {
            x: 10_000,
            y: 10_000,
        };
        let reach = 2 * 1_874 + 2 * 187 + 600;
        assert!(!band.leaks(
            me,
            Position {
                x: 10_000 + reach - 1,
                y: 10_000
            }
        ));
        assert!(band.leaks(
            me,
            Position {
                x: 10_000 + reach,
                y: 10_000
            }
        ));
        assert!(band.leaks(
            me,
            Position {
                x: 10_000,
                y: 10_000 - reach
            }
        ));
    }
}
