//! One WebSocket connection: with its [`Outbox`], the only code that
//! touches a socket.
//!
//! A connection is one task running one `select!` loop over the socket,
//! its outbox, a deferred-move timer, its member's token expiry,
//! keepalive and shutdown. Incoming
//! frames are decoded and validated by `protocol`, paced by `throttle` and
//! handed to `room`. Room frames do not pass through this task: the room
//! writes them into the socket's [`Outbox`] itself, and this task only
//! finishes writes the socket could not take at once, and resyncs its
//! member when frames had to be dropped. Every way the loop ends maps to
//! one close code and one leave reason.
//!
//! Here: the loop, its commands, pings and every ending; `join.rs`: a
//! Join's token and claims settled, then the room; `token.rs`: the
//! member's token after its Join (the notice, the end, a refresh).

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::{FutureExt as _, SinkExt as _, StreamExt as _};
use tokio::time::{Instant, MissedTickBehavior, Sleep, sleep_until, timeout};
use tokio_tungstenite::WebSocketStream;
use tracing::{debug, trace};
use tungstenite::Message;
use tungstenite::protocol::CloseFrame;

use crate::access::addresses::Client;
use crate::access::sanctions::muted_text;
use crate::access::throttle::{Admit, Budget, Gcra, Verdict};
use crate::protocol::pb::server_message::Body;
use crate::protocol::{
    Command, DecodeError, ErrorCode, LeaveReason, Motion, decode_client, encode_error,
    encode_server, pb,
};
use crate::room::Membership;
use crate::room::sink::{Frame, Removal};
use crate::server::shared::Shared;
use crate::session::outbox::{Event, Outbox, WsIo};

mod join;
mod token;

use join::Asked;
use token::TokenClock;

/// WebSocket close codes (RFC 6455 section 7.4.1).
pub mod close {
    pub const NORMAL: u16 = 1000;
    pub const GOING_AWAY: u16 = 1001;
    pub const PROTOCOL_ERROR: u16 = 1002;
    pub const UNSUPPORTED: u16 = 1003;
    pub const INVALID_PAYLOAD: u16 = 1007;
    pub const POLICY: u16 = 1008;
    pub const TOO_BIG: u16 = 1009;
    pub const TRY_AGAIN_LATER: u16 = 1013;
    /// Private use (4000-4999): the same user joined the room from a newer
    /// connection, which replaced this one. Reconnecting would replace it
    /// back.
    pub const REPLACED: u16 = 4000;
    /// Private use: the member's token expired and was not refreshed.
    /// Joining again takes a fresh token.
    pub const TOKEN_EXPIRED: u16 = 4003;
    /// Private use: the member's place was taken back by a resume from a
    /// newer connection (the client gave this one up). Nothing to do: the
    /// newer connection has the place.
    pub const RESUMED: u16 = 4001;
    /// Private use: the app removed the member (server API).
    pub const KICKED: u16 = 4004;
    /// Private use: the app banned the member's user (server API).
    pub const BANNED: u16 = 4005;
    /// Private use: the app closed the room (server API).
    pub const ROOM_CLOSED: u16 = 4006;
}

/// The upgraded connection under a WebSocket.
pub use crate::session::io::Io;
/// A client's WebSocket, reading from the socket and writing through its
/// outbox.
pub type Socket = WebSocketStream<WsIo<Io>>;

/// Join budget: a burst of `JOIN_BURST`, then one per `JOIN_INTERVAL`.
const JOIN_INTERVAL: Duration = Duration::from_secs(1);
const JOIN_BURST: u32 = 5;

/// Messages read, at most, while waiting for the client's close reply:
/// many more than a client has in flight when it reads, so it sees its
/// close; a flooder that does not read costs no more than this.
const CLOSE_DRAIN_MESSAGES: usize = 4_096;

/// Find budget: a burst of `FIND_BURST`, then one per `FIND_INTERVAL`
/// (each reads the room's names; the room has a budget of its own too).
const FIND_INTERVAL: Duration = Duration::from_secs(2);
const FIND_BURST: u32 = 3;

/// Pings over budget get at most one `RATE_LIMITED` notice per interval.
const PING_NOTICE_INTERVAL: Duration = Duration::from_secs(1);

/// How a connection ended.
#[derive(Debug)]
enum End {
    /// The client closed, or the socket failed.
    Gone,
    /// The server is shutting down.
    Shutdown,
    /// Nothing arrived within the idle timeout.
    Idle,
    /// A send could not complete in time: the peer stopped reading.
    Stalled,
    /// The server closes with this code and reason after a bad input.
    Refused { code: u16, reason: &'static str },
    /// The room took the member out: a newer connection of the same user
    /// joined it, or the app removed the member or closed the room.
    Removed(Removal),
    /// A resume from a newer connection took the member's place.
    Superseded,
    /// The member's token expired (past the leeway) without a refresh.
    TokenExpired,
}

impl End {
    fn leave_reason(&self) -> LeaveReason {
        match self {
            Self::Gone | Self::Stalled => LeaveReason::Disconnected,
            Self::Shutdown => LeaveReason::Shutdown,
            // A session whose time ran out, like an idle one: not a breach.
            Self::Idle | Self::TokenExpired => LeaveReason::TimedOut,
            Self::Refused { .. } => LeaveReason::Kicked,
            Self::Removed(removal) => removal.leave_reason(),
            // The place is another connection's: no one leaves.
            Self::Superseded => LeaveReason::Disconnected,
        }
    }

    /// Whether the member's place is held for a resume: the client
    /// vanished (the socket closed or failed without a Leave, went quiet
    /// past the idle timeout, or stopped reading). Not after a refusal, a
    /// replacement, a token's expiry or a shutdown.
    fn holds_place(&self) -> bool {
        matches!(self, Self::Gone | Self::Idle | Self::Stalled)
    }

    fn close_frame(&self) -> Option<(u16, &'static str)> {
        match self {
            Self::Gone | Self::Stalled => None,
            Self::Shutdown => Some((close::GOING_AWAY, "server shutting down")),
            Self::Idle => Some((close::NORMAL, "idle timeout")),
            Self::Refused { code, reason } => Some((*code, reason)),
            Self::Removed(Removal::Replaced) => {
                Some((close::REPLACED, "replaced by a newer connection"))
            }
            Self::Removed(Removal::Kicked { .. }) => Some((close::KICKED, "kicked")),
            Self::Removed(Removal::Banned { .. }) => Some((close::BANNED, "banned")),
            Self::Removed(Removal::RoomClosed) => Some((close::ROOM_CLOSED, "room closed")),
            Self::Superseded => Some((close::RESUMED, "resumed by a newer connection")),
            Self::TokenExpired => Some((close::TOKEN_EXPIRED, "token expired")),
        }
    }
}

/// An input refused with this code and message.
type Refused = (ErrorCode, String);

/// The kinds of client ping. They share one budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PingKind {
    /// A protocol `Ping`: answered with a `Pong` only within the budget.
    Protocol,
    /// A WebSocket ping frame: the WebSocket layer answers it whatever the
    /// budget (RFC 6455 section 5.5.2), so only a flood is refused.
    WebSocket,
    /// A WebSocket pong, answering the keepalive or unsolicited: nothing to
    /// withhold, only a flood is refused.
    Pong,
}

/// A move held back by the throttle until `at`.
struct Deferred {
    motion: Motion,
    at: Instant,
}

struct Connection {
    socket: Socket,
    outbox: Arc<Outbox<Io>>,
    shared: Arc<Shared>,
    membership: Option<Membership>,
    moves: Budget,
    chats: Budget,
    /// SetData: each one is a frame to the whole room. Made at the first
    /// one: most connections never send one, and every byte here is paid
    /// per connection.
    data: Option<Box<Budget>>,
    /// Joins: each one snapshots a room and tells all its members.
    joins: Budget,
    /// RefreshTokens: each one verifies a signature. Made at the first.
    refreshes: Option<Box<Budget>>,
    /// Finds: each one reads the room's names. Made at the first.
    finds: Option<Box<Budget>>,
    /// The member's token expiry; `None` without a member or a token.
    token: Option<Box<TokenClock>>,
    /// The member's user (its token's `sub`): a refresh must carry it.
    user: Option<Arc<str>>,
    /// Refused inputs; a client that keeps sending bad ones is closed.
    strikes: Gcra,
    /// Client pings of every kind; `None` when `--pings-per-sec` is 0.
    pings: Option<Budget>,
    /// At most one notice a second for pings over budget, so that refusing
    /// them does not become an amplifier itself.
    ping_notices: Gcra,
    deferred: Option<Deferred>,
    last_inbound: Instant,
    /// The client's address: its joins count against that address's budget.
    client: Client,
}

/// Serves one upgraded socket until it ends. `permit` is the connection's
/// slot under the connection limit.
pub async fn run(
    socket: Socket,
    outbox: Arc<Outbox<Io>>,
    shared: Arc<Shared>,
    permit: tokio::sync::OwnedSemaphorePermit,
    client: Client,
) {
    let config = &shared.config.session;
    let mut conn = Connection {
        socket,
        outbox,
        moves: Budget::new(
            config.move_interval(),
            config.move_burst,
            config.flood_factor,
        ),
        chats: Budget::new(
            config.chat_interval(),
            config.chat_burst,
            config.flood_factor,
        ),
        data: None,
        joins: Budget::new(JOIN_INTERVAL, JOIN_BURST, config.flood_factor),
        refreshes: None,
        finds: None,
        token: None,
        user: None,
        strikes: Gcra::new(Duration::from_secs(1), 20),
        pings: config
            .ping_interval()
            .map(|every| Budget::new(every, config.ping_burst, config.flood_factor)),
        ping_notices: Gcra::new(PING_NOTICE_INTERVAL, 1),
        membership: None,
        deferred: None,
        last_inbound: Instant::now(),
        client,
        shared: Arc::clone(&shared),
    };
    shared.metrics.connections.inc();
    shared.metrics.connections_accepted.inc();
    let end = conn.serve().await;
    // Once per connection, and boxed so that its futures do not add to the
    // size of every connection's task.
    Box::pin(conn.finish(end)).await;
    // The slot frees before the gauge drops: a reader that sees the gauge
    // fall can connect again.
    drop(permit);
    shared.metrics.connections.dec();
}

/// Refuses a socket over the connection limit: an `Error` and close 1013.
pub async fn refuse(mut socket: Socket, shared: Arc<Shared>) {
    shared.metrics.reject(ErrorCode::ServerFull);
    let reason = "server full: too many connections, try again later";
    let error = encode_error(ErrorCode::ServerFull, reason);
    let bounded = Duration::from_secs(1);
    let _ = timeout(bounded, socket.send(Message::Binary(error))).await;
    let close = Message::Close(Some(CloseFrame {
        code: close::TRY_AGAIN_LATER.into(),
        reason: reason.into(),
    }));
    let _ = timeout(bounded, socket.send(close)).await;
}

/// Why `motion` does not fit in a room's `world` (every room checks its
/// own: the decoder checks only the largest world any room has).
fn outside(motion: &Motion, world: crate::protocol::Position) -> Option<String> {
    let fits = |p: crate::protocol::Position| p.x <= world.x && p.y <= world.y;
    let ok = fits(motion.position) && motion.walk.is_none_or(|w| fits(w.target));
    (!ok).then(|| {
        crate::protocol::DecodeError::InvalidPosition {
            width: world.x,
            height: world.y,
        }
        .to_string()
    })
}

/// When a connection's first keepalive check falls: one `period` from now,
/// rounded up to a whole second of server time (or to a whole `period`,
/// when shorter). Connections then share their checks' instants, and a
/// quiet server wakes once a second for the connections due, rather than
/// once for each of them.
fn keepalive_start(shared: &Shared, period: Duration) -> Instant {
    let unit = u64::try_from(period.as_millis())
        .unwrap_or(u64::MAX)
        .clamp(1, 1000);
    let due = shared
        .clock
        .now_ms()
        .saturating_add(u64::try_from(period.as_millis()).unwrap_or(u64::MAX));
    shared
        .clock
        .instant_at(due.div_ceil(unit).saturating_mul(unit))
}

impl Connection {
    async fn serve(&mut self) -> End {
        let config = Arc::clone(&self.shared.config);
        let idle_timeout = Duration::from_millis(config.session.idle_timeout_ms);
        let ping_every = Duration::from_millis(config.session.ping_interval_ms);
        let period = ping_every.min(idle_timeout);
        let mut keepalive = tokio::time::interval_at(keepalive_start(&self.shared, period), period);
        keepalive.set_missed_tick_behavior(MissedTickBehavior::Delay);
        // Futures that live across iterations are made once: re-creating
        // them every turn would register and drop waiters each time.
        let shutdown = self.shared.shutdown.clone();
        let cancelled = shutdown.cancelled();
        tokio::pin!(cancelled);
        let mut armed: Option<Instant> = None;
        let deferral = sleep_until(Instant::now());
        tokio::pin!(deferral);
        // Armed while the socket has a backlog: the peer must read it by then.
        let send_timeout = Duration::from_millis(config.session.send_timeout_ms);
        let mut stall_armed = false;
        let stall = sleep_until(Instant::now());
        tokio::pin!(stall);
        // The member's token: its notice, then its end (re-armed when a
        // refresh moves it).
        // Made for the first token with an expiry (a timer is as large as
        // the rest of this task's state).
        let mut token_armed: Option<Instant> = None;
        let mut token_timer: Option<Pin<Box<Sleep>>> = None;
        let outbox = Arc::clone(&self.outbox);
        loop {
            let due = self.deferred.as_ref().map(|d| d.at);
            if due != armed {
                if let Some(at) = due {
                    deferral.as_mut().reset(at);
                }
                armed = due;
            }
            let token_due = self.token.as_ref().map(|t| t.due);
            if token_due != token_armed {
                if let Some(at) = token_due {
                    match &mut token_timer {
                        Some(timer) => timer.as_mut().reset(at),
                        None => token_timer = Some(Box::pin(sleep_until(at))),
                    }
                }
                token_armed = token_due;
            }
            // The socket comes last: every branch before it is rare and
            // one-shot, and a client that keeps its socket busy must not
            // starve its own stall or idle checks.
            let step = tokio::select! {
                biased;
                () = &mut cancelled => Err(End::Shutdown),
                () = &mut stall, if stall_armed => Err(End::Stalled),
                event = outbox.event() => match event {
                    Event::Backlog(since) => {
                        stall.as_mut().reset(since + send_timeout);
                        stall_armed = true;
                        Ok(())
                    }
                    Event::Drained => {
                        stall_armed = false;
                        Ok(())
                    }
                    Event::Lagged => {
                        self.resync().await;
                        Ok(())
                    }
                    Event::Overflowed => Err(End::Stalled),
                    Event::Failed => Err(End::Gone),
                    Event::Removed(removal) => Err(End::Removed(removal)),
                    Event::Superseded => Err(End::Superseded),
                },
                () = &mut deferral, if armed.is_some() => {
                    armed = None;
                    self.apply_deferred().await;
                    Ok(())
                }
                () = async {
                    match token_timer.as_mut() {
                        Some(timer) => timer.as_mut().await,
                        None => std::future::pending().await,
                    }
                }, if token_armed.is_some() => {
                    token_armed = None;
                    Box::pin(self.on_token_due()).await
                }
                _ = keepalive.tick() => {
                    let quiet = self.last_inbound.elapsed();
                    if quiet >= idle_timeout {
                        Err(End::Idle)
                    } else if quiet >= ping_every.min(idle_timeout / 2) {
                        self.send(Message::Ping(Default::default())).await
                    } else {
                        Ok(())
                    }
                }
                msg = self.socket.next() => match msg {
                    Some(Ok(msg)) => {
                        self.last_inbound = Instant::now();
                        self.on_message(msg).await
                    }
                    Some(Err(err)) => Box::pin(self.on_socket_error(err)).await,
                    None => Err(End::Gone),
                },
            };
            if let Err(end) = step {
                return end;
            }
        }
    }

    /// After the loop: the member leaves, the client is told why (when
    /// there is something to tell), and the socket is closed.
    async fn finish(&mut self, end: End) {
        debug!(?end, "connection ends");
        if let Some(m) = self.membership.take() {
            if end.holds_place() {
                m.hold(end.leave_reason()).await;
            } else {
                m.leave(end.leave_reason()).await;
            }
        }
        if matches!(end, End::Idle) {
            self.shared.metrics.timeouts.inc();
        }
        if matches!(end, End::TokenExpired) {
            self.shared.metrics.auth_expired.inc();
        }
        let notice = match &end {
            End::Shutdown => Some(encode_error(
                ErrorCode::ShuttingDown,
                "the server is shutting down: reconnect later",
            )),
            End::Removed(Removal::Replaced) => Some(encode_error(
                ErrorCode::Replaced,
                "you joined this room again from another connection, which replaced this one",
            )),
            End::Removed(Removal::Kicked { reason }) => Some(encode_error(
                ErrorCode::Kicked,
                format!("removed from the room by the app: {reason}"),
            )),
            End::Removed(Removal::Banned { until_ms, reason }) => Some(encode_error(
                ErrorCode::Banned,
                crate::access::sanctions::banned_text(
                    until_ms.saturating_sub(self.shared.clock.now_ms()),
                    reason,
                ),
            )),
            End::Removed(Removal::RoomClosed) => Some(encode_error(
                ErrorCode::RoomClosed,
                "the app closed this room",
            )),
            End::TokenExpired => Some(encode_error(
                ErrorCode::TokenExpired,
                "your token expired and was not refreshed (RefreshToken): join again with a \
                 fresh one",
            )),
            _ => None,
        };
        if let Some(notice) = notice {
            let _ = timeout(
                Duration::from_secs(1),
                self.socket.send(Message::Binary(notice)),
            )
            .await;
        }
        if let Some((code, reason)) = end.close_frame() {
            self.close(code, reason).await;
        }
    }

    /// A read failed. A frame past the WebSocket layer's hard cap is
    /// refused with 1009 like any other oversized frame; anything else
    /// means the peer is gone.
    async fn on_socket_error(&mut self, err: tungstenite::Error) -> Result<(), End> {
        use tungstenite::Error as WsError;
        use tungstenite::error::{CapacityError, ProtocolError};
        match err {
            // A frame, or a fragmented message as it is assembled, past
            // `max_message_bytes`: refused at the first frame over it.
            WsError::Capacity(cap) => {
                let limit = self.shared.config.session.max_message_bytes;
                let text = match cap {
                    CapacityError::MessageTooLong { size, .. } => {
                        format!("a message of {size} bytes or more: the limit is {limit} bytes")
                    }
                    cap => format!("{cap}: the limit is {limit} bytes"),
                };
                self.refuse(ErrorCode::TooBig, text).await?;
                Err(End::Refused {
                    code: close::TOO_BIG,
                    reason: "message too big",
                })
            }
            // Text that is not valid UTF-8 (RFC 6455 section 8.1: close
            // 1007): a text message, or the reason of a Close frame, which
            // tungstenite reports alike, so the answer names both.
            WsError::Utf8(err) => {
                debug!(%err, "text not valid UTF-8");
                self.refuse(
                    ErrorCode::TextFrame,
                    "a frame carried text that is not valid UTF-8 (a text message, or the \
                     reason of a Close): amble takes binary amble.v1 frames, and Close \
                     reasons in UTF-8",
                )
                .await?;
                Err(End::Refused {
                    code: close::INVALID_PAYLOAD,
                    reason: "text not valid UTF-8",
                })
            }
            // The peer went away without a close handshake: a crashed tab,
            // a lost network. An ordinary disconnect, not a violation.
            err @ (WsError::ConnectionClosed
            | WsError::AlreadyClosed
            | WsError::Io(_)
            | WsError::Protocol(ProtocolError::ResetWithoutClosingHandshake)) => {
                debug!(%err, "peer gone");
                Err(End::Gone)
            }
            WsError::Protocol(violation) => {
                // Broken WebSocket framing (an unmasked frame, a bad opcode...):
                // no Error message can be trusted to arrive, just the close.
                debug!(%violation, "WebSocket protocol violation");
                self.shared.metrics.reject(ErrorCode::Malformed);
                Err(End::Refused {
                    code: close::PROTOCOL_ERROR,
                    reason: "WebSocket protocol violation",
                })
            }
            err => {
                debug!(%err, "socket error");
                Err(End::Gone)
            }
        }
    }

    async fn on_message(&mut self, msg: Message) -> Result<(), End> {
        let metrics = &self.shared.metrics;
        let data = match msg {
            Message::Binary(data) => data,
            Message::Text(_) => {
                self.refuse(
                    ErrorCode::TextFrame,
                    "text frames are not accepted: send binary amble.v1 frames",
                )
                .await?;
                return Err(End::Refused {
                    code: close::UNSUPPORTED,
                    reason: "binary frames only",
                });
            }
            Message::Close(_) => {
                // tungstenite queued the close reply; flush it so the
                // client sees a clean close.
                let bounded = Duration::from_secs(1);
                let _ = timeout(bounded, futures_util::SinkExt::flush(&mut self.socket)).await;
                return Err(End::Gone);
            }
            // The WebSocket layer has already queued the pong; a ping
            // only counts against the budget.
            Message::Ping(_) => return self.admit_ping(PingKind::WebSocket).await.map(drop),
            Message::Pong(_) => return self.admit_ping(PingKind::Pong).await.map(drop),
            // Raw frames are never yielded by a read.
            Message::Frame(_) => return Ok(()),
        };
        // No larger than `max_message_bytes`: the WebSocket layer refuses
        // anything larger (see `on_socket_error`).
        metrics.frames_received.inc();
        metrics.bytes_received.inc_by(data.len() as u64);
        match decode_client(&data, &self.shared.rules) {
            Ok(cmd) => self.on_command(cmd).await,
            Err(err @ DecodeError::Malformed(_)) => {
                self.refuse(err.code(), err.to_string()).await?;
                Err(End::Refused {
                    code: close::INVALID_PAYLOAD,
                    reason: "not a valid amble.v1 message",
                })
            }
            Err(err) => self.refuse(err.code(), err.to_string()).await,
        }
    }

    async fn on_command(&mut self, cmd: Command) -> Result<(), End> {
        let now = Instant::now();
        match cmd {
            Command::Ping { client_time_ms } => {
                if !self.admit_ping(PingKind::Protocol).await? {
                    return Ok(());
                }
                let pong = encode_server(Body::Pong(pb::Pong {
                    client_time_ms,
                    server_time_ms: self.shared.clock.now_ms(),
                }));
                self.send_frame(pong).await
            }
            Command::Join {
                room,
                name,
                token,
                start,
                data,
                resume_token,
            } => {
                let asked = Asked {
                    name,
                    start,
                    data,
                    resume_token,
                };
                Box::pin(self.join(room, asked, token, now)).await
            }
            Command::Move { motion, seq } => {
                let Some(m) = &self.membership else {
                    return self.refuse(ErrorCode::NotJoined, "Move before Join").await;
                };
                // Outside this room's world: refused like any bad move, so
                // not counted as received (the decoder checked only the
                // largest world any room has).
                if let Some(refused) = outside(&motion, m.world()) {
                    return self.refuse(ErrorCode::InvalidPosition, refused).await;
                }
                self.shared.metrics.moves_received.inc();
                trace!(seq, "move");
                match self.moves.arrive(now) {
                    Verdict::Apply => {
                        if self.deferred.take().is_some() {
                            self.shared.metrics.moves_coalesced.inc();
                        }
                        m.submit(motion).await;
                        Ok(())
                    }
                    Verdict::Defer(at) => {
                        if self.deferred.replace(Deferred { motion, at }).is_some() {
                            self.shared.metrics.moves_coalesced.inc();
                        }
                        Ok(())
                    }
                    Verdict::Flood => self.flood("moves").await,
                }
            }
            Command::Chat { text } => {
                let Some(m) = &self.membership else {
                    return self.refuse(ErrorCode::NotJoined, "Chat before Join").await;
                };
                let muted = self.user.as_deref().and_then(|user| {
                    let now_ms = self.shared.clock.now_ms();
                    let until_ms = self.shared.sanctions.muted(user, now_ms)?;
                    Some(muted_text(until_ms.saturating_sub(now_ms)))
                });
                if let Some(text) = muted {
                    return self.refuse(ErrorCode::Muted, text).await;
                }
                match self.chats.arrive(now) {
                    Verdict::Apply => {
                        m.chat(text).await;
                        self.shared.metrics.chats_relayed.inc();
                        Ok(())
                    }
                    Verdict::Defer(at) => {
                        let wait = at.saturating_duration_since(now).as_millis();
                        let text = format!(
                            "chat budget spent: message dropped, next allowed in {wait} ms"
                        );
                        self.refuse(ErrorCode::RateLimited, text).await
                    }
                    Verdict::Flood => self.flood("chat").await,
                }
            }
            Command::SetData { changes } => {
                let Some(m) = &self.membership else {
                    return self
                        .refuse(ErrorCode::NotJoined, "SetData before Join")
                        .await;
                };
                let session = &self.shared.config.session;
                let budget = self.data.get_or_insert_with(|| {
                    Box::new(Budget::new(
                        session.data_interval(),
                        session.data_burst,
                        session.flood_factor,
                    ))
                });
                match budget.arrive(now) {
                    Verdict::Apply => match m.set_data(&changes, &self.shared.rules).await {
                        Ok(()) => Ok(()),
                        Err(err) => {
                            let text = format!("invalid data: {err}");
                            self.refuse(ErrorCode::InvalidData, text).await
                        }
                    },
                    Verdict::Defer(at) => {
                        let wait = at.saturating_duration_since(now).as_millis();
                        let text = format!(
                            "data budget spent: SetData dropped, next allowed in {wait} ms"
                        );
                        self.refuse(ErrorCode::RateLimited, text).await
                    }
                    Verdict::Flood => self.flood("SetData").await,
                }
            }
            Command::Find { prefix, cursor } => {
                let Some(m) = &self.membership else {
                    return self.refuse(ErrorCode::NotJoined, "Find before Join").await;
                };
                let flood = self.shared.config.session.flood_factor;
                let budget = self
                    .finds
                    .get_or_insert_with(|| Box::new(Budget::new(FIND_INTERVAL, FIND_BURST, flood)));
                match budget.arrive(now) {
                    Verdict::Apply => {
                        if m.find(&prefix, cursor).await {
                            Ok(())
                        } else {
                            self.refuse(
                                ErrorCode::RateLimited,
                                "the room is searched too often: Find dropped, try again in a second",
                            )
                            .await
                        }
                    }
                    Verdict::Defer(at) => {
                        let wait = at.saturating_duration_since(now).as_millis();
                        let text =
                            format!("find budget spent: Find dropped, next allowed in {wait} ms");
                        self.refuse(ErrorCode::RateLimited, text).await
                    }
                    Verdict::Flood => self.flood("Find").await,
                }
            }
            Command::RefreshToken { token } => Box::pin(self.refresh(token, now)).await,
            Command::Leave => match self.membership.take() {
                Some(m) => {
                    self.deferred = None;
                    // The token was the member's: out of the room, it ends nothing.
                    self.token = None;
                    self.user = None;
                    m.leave(LeaveReason::Left).await;
                    // Out of the room, no snapshot is owed for what it missed.
                    self.outbox.clear_lag();
                    Ok(())
                }
                None => self.refuse(ErrorCode::NotJoined, "Leave before Join").await,
            },
        }
    }

    /// Room frames were dropped while the socket was full: send the room
    /// as it is now.
    async fn resync(&mut self) {
        match &self.membership {
            Some(m) => {
                debug!("receiver lagged: resync");
                self.shared.metrics.resyncs.inc();
                m.resync().await;
            }
            None => self.outbox.clear_lag(),
        }
    }

    async fn apply_deferred(&mut self) {
        let Some(d) = self.deferred.take() else {
            return;
        };
        match self.moves.take_deferred(Instant::now()) {
            Admit::Now => {
                if let Some(m) = &self.membership {
                    m.submit(d.motion).await;
                }
            }
            Admit::At(at) => self.deferred = Some(Deferred { at, ..d }),
        }
    }

    /// Counts one client ping of any kind against the ping budget: `true`
    /// when it may be answered, `false` when it is over budget (counted, and
    /// noticed at most once a second), `End` for a flood.
    async fn admit_ping(&mut self, kind: PingKind) -> Result<bool, End> {
        let Some(budget) = &mut self.pings else {
            return Ok(true);
        };
        let now = Instant::now();
        let at = match budget.arrive(now) {
            Verdict::Apply => return Ok(true),
            Verdict::Defer(at) => at,
            Verdict::Flood => return self.flood("pings").await.map(|()| false),
        };
        self.shared.metrics.pings_over_budget.inc();
        if kind == PingKind::Pong || self.ping_notices.admit(now) != Admit::Now {
            return Ok(false);
        }
        let config = &self.shared.config.session;
        let budget = format!(
            "{} a second, bursts of {}",
            config.pings_per_sec, config.ping_burst
        );
        let wait = at.saturating_duration_since(now).as_millis();
        let text = if kind == PingKind::Protocol {
            format!(
                "pings over budget ({budget}): Pings get no Pong until {wait} ms \
                 from now; this notice comes at most once a second"
            )
        } else {
            format!(
                "WebSocket pings over budget ({budget}): keep under it or the \
                 connection is closed as flooding"
            )
        };
        self.notify(ErrorCode::RateLimited, text).await?;
        Ok(false)
    }

    /// Sends an `Error` for a refused input and counts it. Too many refusals
    /// in a row close the connection as a flood.
    ///
    /// Refusals, floods, socket errors and joins are boxed: they are rare,
    /// and inline they would make every connection's task larger by the
    /// deepest of them (see docs/benchmarks.md, "Hardening").
    fn refuse(
        &mut self,
        code: ErrorCode,
        text: impl Into<String>,
    ) -> BoxFuture<'_, Result<(), End>> {
        let text = text.into();
        async move {
            self.notify(code, text).await?;
            if let Admit::At(_) = self.strikes.admit(Instant::now()) {
                return self.flood("refused inputs").await;
            }
            Ok(())
        }
        .boxed()
    }

    /// Sends an `Error` and counts it, with no strike.
    fn notify(
        &mut self,
        code: ErrorCode,
        text: impl Into<String>,
    ) -> BoxFuture<'_, Result<(), End>> {
        let text = text.into();
        async move {
            self.shared.metrics.reject(code);
            debug!(?code, %text, "refused input");
            self.send_frame(encode_error(code, text)).await
        }
        .boxed()
    }

    fn flood(&mut self, what: &'static str) -> BoxFuture<'_, Result<(), End>> {
        async move {
            self.shared.metrics.reject(ErrorCode::Flood);
            let text = format!("flooding: {what} far over budget");
            self.send_frame(encode_error(ErrorCode::Flood, text))
                .await?;
            Err(End::Refused {
                code: close::POLICY,
                reason: "flooding",
            })
        }
        .boxed()
    }

    async fn send_frame(&mut self, frame: Frame) -> Result<(), End> {
        let len = frame.len();
        self.send(Message::Binary(frame)).await?;
        self.shared.metrics.sent(len);
        Ok(())
    }

    async fn send(&mut self, msg: Message) -> Result<(), End> {
        let limit = Duration::from_millis(self.shared.config.session.send_timeout_ms);
        match timeout(limit, self.socket.send(msg)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(err)) => {
                debug!(%err, "send failed");
                Err(End::Gone)
            }
            Err(_) => Err(End::Stalled),
        }
    }

    async fn close(&mut self, code: u16, reason: &'static str) {
        let frame = Message::Close(Some(CloseFrame {
            code: code.into(),
            reason: reason.into(),
        }));
        let bounded = Duration::from_secs(1);
        if timeout(bounded, self.socket.send(frame)).await.is_err() {
            return;
        }
        // Wait (briefly) for the client's close reply so it sees a clean
        // close. A few messages may still be on their way; a client still
        // flooding is not read for the whole second.
        let _ = timeout(bounded, async {
            for _ in 0..CLOSE_DRAIN_MESSAGES {
                match self.socket.next().await {
                    Some(Ok(Message::Close(_))) | Some(Err(_)) | None => break,
                    Some(Ok(_)) => {}
                }
            }
        })
        .await;
    }
}
