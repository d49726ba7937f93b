//! One bot: a task that connects at its slot in the ramp, joins its room,
//! moves the way people do, reads everything the room sends, and closes
//! when the schedule says so.
//!
//! Here: what the bots of a process share ([`Run`]), a bot's life from its
//! slot in the ramp to its close, and joining (up to the Welcome).
//! [`session`] is the joined bot: one `select!` over its socket and timers;
//! [`mover`] picks its moves, without I/O.

mod mover;
mod session;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use amble::protocol::{self, pb};
use futures_util::{SinkExt as _, StreamExt as _};
use prost::Message as _;
use tokio::time::{sleep_until, timeout};
use tokio_tungstenite::tungstenite::Message;

use crate::ledger::Trail;
use crate::plan::{Plan, Schedule};
use crate::stats::{AtomicCounts, ErrorKind, Stats};
use crate::wire::{self, Socket, frame_bytes};

use self::session::Session;

/// Bound on waiting for Welcome after Join.
const JOIN_TIMEOUT: Duration = Duration::from_secs(10);
/// Bound on one write (a full socket buffer means the server stopped reading).
const SEND_TIMEOUT: Duration = Duration::from_secs(5);

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
    /// The bot drops its connection on purpose (`--drops-per-sec`), to
    /// join again with its resume token.
    Dropped,
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
        joined = join(&run, index, room, "") => joined,
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
    let mut generation = 0;
    let mut session = Session::new(&run, index, generation, ws, welcome);
    loop {
        let ended = session.run().await;
        if ended != Ended::Dropped {
            session.settle();
            gauges
                .connected
                .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
            if ended == Ended::Lost {
                run.stats
                    .with(|s| AtomicCounts::bump(&s.counts.disconnected, 1));
            }
            session.close().await;
            return;
        }
        session.settle_cut();
        let token = session.resume_token().to_owned();
        session.abort();
        run.stats.with(|s| AtomicCounts::bump(&s.counts.drops, 1));
        match join(&run, index, room, &token).await {
            Ok((ws, welcome)) => {
                let resumed = welcome.resumed;
                run.stats.with(|s| {
                    let counter = if resumed {
                        &s.counts.resumed
                    } else {
                        &s.counts.fresh_rejoins
                    };
                    AtomicCounts::bump(counter, 1);
                });
                generation += 1;
                session = Session::new(&run, index, generation, ws, welcome);
            }
            Err((kind, code)) => {
                gauges
                    .connected
                    .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
                run.stats.with(|s| {
                    s.error(kind, 1);
                    if let Some(code) = code {
                        s.server_error(code);
                    }
                    AtomicCounts::bump(&s.counts.disconnected, 1);
                });
                return;
            }
        }
    }
}

type JoinError = (ErrorKind, Option<i32>);

/// Connects and joins (asking for the place `resume_token` names, if not
/// empty); returns the socket and the Welcome.
async fn join(
    run: &Run,
    index: u32,
    room: u32,
    resume_token: &str,
) -> Result<(Socket, pb::Welcome), JoinError> {
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
        data: Vec::new(),
        start: None,
        room: plan.room_name(room),
        name: plan.bot_name(index),
        token: String::new(),
        resume_token: resume_token.to_owned(),
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
