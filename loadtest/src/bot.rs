//! One bot: a task that connects at its slot in the ramp, joins its room,
//! moves the way people do, reads everything the room sends, and closes
//! when the schedule says so.
//!
//! One `select!` over the socket and two timers (next move, end of run);
//! no second task, no channel. The receive path decodes into a reused
//! `ServerMessage`, accounts through the [`Ledger`] and adds the frame's
//! counts to this thread's shard.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use amble::protocol::{self, MemberId, Motion, Position, Walk, pb};
use futures_util::{SinkExt as _, StreamExt as _};
use prost::Message as _;
use tokio::time::{sleep_until, timeout};
use tokio_tungstenite::tungstenite::Message;

use crate::ledger::{FrameTally, Ledger, Seen, Sent, Trail};
use crate::plan::{Movement, Plan, Schedule, unix_ms};
use crate::random::SplitMix;
use crate::stats::{AtomicCounts, ErrorKind, Shard, Stats};
use crate::wire::{self, Socket, frame_bytes};

/// Bound on waiting for Welcome after Join.
const JOIN_TIMEOUT: Duration = Duration::from_secs(10);
/// Bound on one write (a full socket buffer means the server stopped reading).
const SEND_TIMEOUT: Duration = Duration::from_secs(5);
/// Bound on the close handshake at the end.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(2);
/// Walking speed, cm/s (capped by the server's max_speed).
const WALK_SPEED: u32 = 150;
/// Largest step of a wandering bot per move, cm.
const WANDER_STEP: i64 = 100;

/// What every bot of a process shares.
#[derive(Debug)]
pub struct Run {
    pub plan: Plan,
    pub schedule: Schedule,
    /// Each node's address, in `--url` order.
    pub addrs: Vec<SocketAddr>,
    pub stats: Stats,
    /// One per local bot, indexed from `plan.local_bot_range().start`: the
    /// other bots of its room find it by its name.
    trails: Vec<Arc<Trail>>,
    /// Sessions whose expected deliveries are not yet counted: the tally is
    /// read once they are.
    unsettled: tokio::sync::watch::Sender<u64>,
    /// Set when the run ends before its schedule does (interrupted, or
    /// every bot gone): the bots close now.
    halt: tokio::sync::watch::Sender<bool>,
}

impl Run {
    /// `addrs`: each node's address, in `--url` order.
    pub fn new(plan: Plan, schedule: Schedule, addrs: Vec<SocketAddr>) -> Self {
        let trails = plan.local_bot_range().map(|_| Arc::default()).collect();
        Self {
            plan,
            schedule,
            addrs,
            stats: Stats::default(),
            trails,
            unsettled: tokio::sync::watch::channel(0).0,
            halt: tokio::sync::watch::channel(false).0,
        }
    }

    /// The trail of bot `index` (global), if this process runs it.
    fn trail_of(&self, index: u32) -> Option<&Arc<Trail>> {
        let first = self.plan.local_bot_range().start;
        self.trails
            .get(usize::try_from(index.checked_sub(first)?).ok()?)
    }

    /// Resolves once every session that began has counted its expected
    /// deliveries (they do when they end), or after `limit`.
    pub async fn settled(&self, limit: std::time::Duration) {
        let mut rx = self.unsettled.subscribe();
        let _ = tokio::time::timeout(limit, rx.wait_for(|n| *n == 0)).await;
    }

    /// Tells every bot to close now.
    pub fn halt(&self) {
        self.halt.send_replace(true);
    }

    /// Resolves once [`Run::halt`] was called.
    async fn halted(&self) {
        let mut rx = self.halt.subscribe();
        // The sender lives in `self`, which outlives this wait.
        if rx.wait_for(|h| *h).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// How a bot's session ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ended {
    /// At the schedule's end, or halted: the bot closes.
    AsPlanned,
    /// The server closed the connection, or it failed.
    Lost,
}

/// The world a bot moves in, from the Welcome's limits.
#[derive(Clone, Copy, Debug)]
struct World {
    width: u32,
    height: u32,
    max_speed: u32,
}

impl World {
    fn clamp(&self, x: i64, y: i64) -> Position {
        Position {
            x: x.clamp(0, i64::from(self.width)) as u32,
            y: y.clamp(0, i64::from(self.height)) as u32,
        }
    }

    fn anywhere(&self, rng: &mut SplitMix) -> Position {
        Position {
            x: rng.below(u64::from(self.width) + 1) as u32,
            y: rng.below(u64::from(self.height) + 1) as u32,
        }
    }
}

/// Where a bot is and how it picks its next move.
#[derive(Clone, Debug)]
pub struct Mover {
    movement: Movement,
    world: World,
    /// Wander: where it stands. Walk: where its last walk started.
    from: Position,
    walk: Option<(Walk, Instant)>,
    interval: Duration,
}

impl Mover {
    fn new(movement: Movement, world: World, start: Position, interval: Duration) -> Self {
        Self {
            movement,
            world,
            from: start,
            walk: None,
            interval,
        }
    }

    /// Where the bot is at `now`.
    fn position(&self, now: Instant) -> Position {
        let Some((walk, started)) = self.walk else {
            return self.from;
        };
        let (x0, y0) = (f64::from(self.from.x), f64::from(self.from.y));
        let (x1, y1) = (f64::from(walk.target.x), f64::from(walk.target.y));
        let length = (x1 - x0).hypot(y1 - y0);
        let walked = now.saturating_duration_since(started).as_secs_f64() * f64::from(walk.speed);
        let f = if length <= 0.0 {
            1.0
        } else {
            (walked / length).min(1.0)
        };
        self.world.clamp(
            (x0 + (x1 - x0) * f).round() as i64,
            (y0 + (y1 - y0) * f).round() as i64,
        )
    }

    /// The next move at `now`: one distinct from every move in `trail`.
    fn next(&mut self, now: Instant, trail: &Trail, rng: &mut SplitMix) -> Motion {
        let here = self.position(now);
        for attempt in 0.. {
            let motion = match self.movement {
                Movement::Wander => {
                    let step = if attempt < 16 {
                        WANDER_STEP
                    } else {
                        i64::from(self.world.width)
                    };
                    let to = self.world.clamp(
                        i64::from(here.x) + rng.between(-step, step),
                        i64::from(here.y) + rng.between(-step, step),
                    );
                    Motion::standing(to)
                }
                Movement::Walk => {
                    let speed = WALK_SPEED.min(self.world.max_speed).max(1);
                    // A walk that ends before the next click: one message per walk.
                    let reach = f64::from(speed) * self.interval.as_secs_f64();
                    let distance = reach * (0.3 + 0.6 * rng.unit());
                    let angle = rng.unit() * std::f64::consts::TAU;
                    let target = if attempt < 16 {
                        self.world.clamp(
                            i64::from(here.x) + (distance * angle.cos()).round() as i64,
                            i64::from(here.y) + (distance * angle.sin()).round() as i64,
                        )
                    } else {
                        self.world.anywhere(rng)
                    };
                    Motion {
                        position: here,
                        walk: Some(Walk { target, speed }),
                    }
                }
            };
            let moved = motion
                .walk
                .map_or(motion.position != here, |w| w.target != here);
            if moved && !trail.contains(&motion) {
                match motion.walk {
                    None => self.from = motion.position,
                    Some(walk) => {
                        self.from = here;
                        self.walk = Some((walk, now));
                    }
                }
                return motion;
            }
        }
        unreachable!("the loop returns once a distinct move is found")
    }
}

/// Runs bot number `index` (global) of room `room` until the schedule ends.
pub async fn run(run: Arc<Run>, index: u32, room: u32) {
    let schedule = run.schedule;
    let start = schedule.connect_at(index);
    tokio::select! {
        () = sleep_until(start.into()) => {}
        () = run.halted() => return,
    }
    if Instant::now() >= schedule.window_end {
        // Too late to take part: the ramp fell behind.
        return;
    }
    let gauges = &run.stats.gauges;
    let joined = tokio::select! {
        joined = join(&run, index, room) => joined,
        () = run.halted() => return,
    };
    gauges
        .attempted
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let (ws, welcome) = match joined {
        Ok(ok) => ok,
        Err((kind, code)) => {
            run.stats.with(|s| {
                s.error(kind, 1);
                if let Some(code) = code {
                    s.server_error(code);
                }
            });
            return;
        }
    };
    gauges
        .connected
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    gauges
        .ever_connected
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut session = Session::new(&run, index, ws, welcome);
    let ended = session.run().await;
    session.settle();
    gauges
        .connected
        .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    if ended == Ended::Lost {
        run.stats
            .with(|s| AtomicCounts::bump(&s.counts.disconnected, 1));
    }
    session.close().await;
}

type JoinError = (ErrorKind, Option<i32>);

/// Connects and joins; returns the socket and the Welcome.
async fn join(run: &Run, index: u32, room: u32) -> Result<(Socket, pb::Welcome), JoinError> {
    let plan = &run.plan;
    let source = (!plan.source_addrs.is_empty())
        .then(|| IpAddr::V4(plan.source_addrs[index as usize % plan.source_addrs.len()]));
    let node = plan.node_of(index);
    let (Some(target), Some(&addr)) = (plan.targets().nth(node), run.addrs.get(node)) else {
        return Err((ErrorKind::ConnectOther, None));
    };
    let mut ws = wire::connect(target, addr, source)
        .await
        .map_err(|(kind, _)| (kind, None))?;
    let join = protocol::encode_client(pb::client_message::Body::Join(pb::Join {
        room: plan.room_name(room),
        name: plan.bot_name(index),
        token: String::new(),
    }));
    count_out(run, join.len());
    match timeout(SEND_TIMEOUT, ws.send(Message::Binary(join.into()))).await {
        Err(_) => return Err((ErrorKind::SendTimeout, None)),
        Ok(Err(_)) => return Err((ErrorKind::SendFailed, None)),
        Ok(Ok(())) => {}
    }
    let deadline = tokio::time::Instant::now() + JOIN_TIMEOUT;
    loop {
        let frame = match tokio::time::timeout_at(deadline, ws.next()).await {
            Err(_) => return Err((ErrorKind::JoinTimeout, None)),
            Ok(None | Some(Err(_))) => return Err((ErrorKind::JoinRefused, None)),
            Ok(Some(Ok(frame))) => frame,
        };
        let Message::Binary(bytes) = frame else {
            continue;
        };
        count_in(run, bytes.len());
        let Ok(msg) = pb::ServerMessage::decode(&bytes[..]) else {
            return Err((ErrorKind::Decode, None));
        };
        match msg.body {
            Some(pb::server_message::Body::Welcome(welcome)) => return Ok((ws, welcome)),
            Some(pb::server_message::Body::Error(error)) => {
                return Err((ErrorKind::JoinRefused, Some(error.code)));
            }
            _ => {}
        }
    }
}

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

/// Counts a frame received outside a session (join, close).
fn count_in(run: &Run, payload: usize) {
    let now = Instant::now();
    run.stats.with(|s| {
        AtomicCounts::bump(&s.counts.live_bytes_in, frame_bytes(payload, false));
        if run.schedule.in_window(now) {
            AtomicCounts::bump(&s.counts.bytes_in, frame_bytes(payload, false));
            AtomicCounts::bump(&s.counts.frames_in, 1);
        }
    });
}

fn count_out(run: &Run, payload: usize) {
    if run.schedule.in_window(Instant::now()) {
        run.stats.with(|s| {
            AtomicCounts::bump(&s.counts.bytes_out, frame_bytes(payload, true));
            AtomicCounts::bump(&s.counts.frames_out, 1);
        });
    }
}

/// A joined bot.
struct Session<'a> {
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
    /// Reused for every frame: decoding allocates nothing once warm.
    msg: pb::ServerMessage,
    tally: FrameTally,
}

/// Which timer fired.
enum Due {
    Move,
    Chat,
}

impl<'a> Session<'a> {
    fn new(run: &'a Run, index: u32, ws: Socket, welcome: pb::Welcome) -> Self {
        let plan = &run.plan;
        let limits = welcome.limits.unwrap_or_default();
        let me = MemberId(welcome.member_id);
        let members: Vec<&pb::Member> = welcome
            .snapshot
            .as_ref()
            .map(|s| s.members.iter().collect())
            .unwrap_or_default();
        let world = World {
            width: if limits.world_width > 0 {
                limits.world_width
            } else {
                5_000
            },
            height: if limits.world_height > 0 {
                limits.world_height
            } else {
                5_000
            },
            max_speed: if limits.max_speed > 0 {
                limits.max_speed
            } else {
                WALK_SPEED
            },
        };
        let mut rng = SplitMix::new(
            u64::from(index) << 20 ^ u64::from_str_radix(&plan.run_tag, 16).unwrap_or(0),
        );
        let start = members
            .iter()
            .find(|m| m.id == me.0)
            .and_then(|m| m.position)
            .map(|p| world.clamp(i64::from(p.x), i64::from(p.y)))
            .unwrap_or_else(|| world.anywhere(&mut rng));
        let move_interval = Duration::from_millis(
            plan.move_interval_ms
                .max(u64::from(limits.move_interval_ms)),
        );
        let chat_interval = plan
            .chat_interval_ms
            .map(|ms| Duration::from_millis(ms.max(u64::from(limits.chat_interval_ms))));
        let trail = run.trail_of(index).cloned().unwrap_or_default();
        // Where it stands before its first move: seq 0, so that no move of
        // its first few returns there, and a snapshot showing it there is
        // read right.
        if let Some(motion) = members
            .iter()
            .find(|m| m.id == me.0)
            .and_then(|m| motion_of(m))
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
            rng,
            seq: 0,
            move_interval,
            chat_interval,
            chats: 0,
            msg: pb::ServerMessage::default(),
            tally: FrameTally::default(),
        }
    }

    /// Up to 5% more than `interval`, never less.
    fn jittered(&mut self, interval: Duration) -> Duration {
        let jitter_us = u64::try_from(interval.as_micros() / 20).unwrap_or(0);
        interval + Duration::from_micros(self.rng.below(jitter_us + 1))
    }

    async fn run(&mut self) -> Ended {
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
        let run = self.run;
        let halted = run.halted();
        tokio::pin!(move_timer, chat_timer, end, halted);
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
        self.msg.clear();
        let decoded = self.msg.merge(&bytes[..]).is_ok();
        if decoded && !self.msg.motion.is_empty() {
            match protocol::decode_motion(&self.msg.motion) {
                Ok((_time, records)) => self.ledger.motion(&records, now, &mut self.tally),
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
                Some(Body::Welcome(_) | Body::Pong(_)) | None => {}
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
    fn settle(&mut self) {
        self.tally.clear();
        self.ledger.finish(&mut self.tally);
        let expected = self.tally.expected;
        self.run
            .stats
            .with(|s| AtomicCounts::bump(&s.counts.updates_expected, expected));
        self.run.unsettled.send_modify(|n| *n = n.saturating_sub(1));
    }

    /// Closes the socket, bounded.
    async fn close(mut self) {
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
mod tests {
    use super::*;

    fn world() -> World {
        World {
            width: 5_000,
            height: 5_000,
            max_speed: 1_000,
        }
    }

    #[test]
    fn moves_are_distinct_and_in_bounds() {
        for movement in [Movement::Walk, Movement::Wander] {
            let trail = Trail::default();
            let mut rng = SplitMix::new(7);
            // A corner, to exercise clamping.
            let mut mover = Mover::new(
                movement,
                world(),
                Position { x: 0, y: 5_000 },
                Duration::from_secs(1),
            );
            let mut now = Instant::now();
            let mut seen = Vec::new();
            for seq in 0..1_000 {
                let m = mover.next(now, &trail, &mut rng);
                assert!(m.position.x <= 5_000 && m.position.y <= 5_000);
                if let Some(w) = m.walk {
                    assert!(w.target.x <= 5_000 && w.target.y <= 5_000);
                    assert!(w.speed >= 1 && w.speed <= 1_000);
                }
                assert!(!trail.contains(&m), "{movement:?} repeated a recent move");
                trail.push(Sent {
                    motion: m,
                    seq,
                    at: now,
                    in_window: true,
                });
                seen.push(m);
                now += Duration::from_secs(1);
            }
        }
    }

    #[test]
    fn walking_follows_the_last_walk() {
        let mut rng = SplitMix::new(1);
        let trail = Trail::default();
        let start = Position { x: 2_500, y: 2_500 };
        let mut mover = Mover::new(Movement::Walk, world(), start, Duration::from_secs(2));
        let t0 = Instant::now();
        let first = mover.next(t0, &trail, &mut rng);
        assert_eq!(first.position, start);
        let walk = first.walk.unwrap();
        // Long after, the bot stands at the target: the next walk starts there.
        let second = mover.next(t0 + Duration::from_secs(60), &trail, &mut rng);
        assert_eq!(second.position, walk.target);
        // The walk fits in one interval: one message per walk.
        let dx = f64::from(walk.target.x) - 2_500.0;
        let dy = f64::from(walk.target.y) - 2_500.0;
        assert!(dx.hypot(dy) <= f64::from(walk.speed) * 2.0 + 1.0);
    }
}
