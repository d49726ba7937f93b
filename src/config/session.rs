//! One WebSocket's settings: what a client may send and how often, and
//! how long the server waits on it.

use std::time::Duration;

/// What a session allows its client: message sizes, the move, chat and
/// ping budgets, the send queue, and the ping, idle and send deadlines.
#[derive(Clone, Debug, clap::Args)]
pub struct SessionConfig {
    /// Sustained applied moves per member: one per this many milliseconds.
    #[arg(long, display_order = 3, env = "AMBLE_MOVE_INTERVAL_MS", default_value_t = 1_000,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub move_interval_ms: u32,

    /// Moves a member may have applied back to back before the interval
    /// applies (absorbs network jitter).
    #[arg(long, display_order = 4, env = "AMBLE_MOVE_BURST", default_value_t = 2,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub move_burst: u32,

    /// A client sending moves, chat or pings this many times faster than its
    /// budget, sustained, is closed (1008).
    #[arg(long, display_order = 5, env = "AMBLE_FLOOD_FACTOR", default_value_t = 20,
          value_parser = clap::value_parser!(u32).range(2..))]
    pub flood_factor: u32,

    /// Chat budget: one message per this many milliseconds...
    #[arg(long, display_order = 6, env = "AMBLE_CHAT_INTERVAL_MS", default_value_t = 2_000,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub chat_interval_ms: u32,

    /// ...with a burst of this many.
    #[arg(long, display_order = 7, env = "AMBLE_CHAT_BURST", default_value_t = 5,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub chat_burst: u32,

    /// Largest client frame in bytes; larger ones are refused with 1009.
    #[arg(long, display_order = 13, env = "AMBLE_MAX_MESSAGE_BYTES", default_value_t = 4_096,
          value_parser = clap::value_parser!(u32).range(64..=1_048_576))]
    pub max_message_bytes: u32,

    /// Longest display name, in characters.
    #[arg(
        long,
        display_order = 14,
        env = "AMBLE_MAX_NAME_CHARS",
        default_value_t = 32
    )]
    pub max_name_chars: u32,

    /// Longest chat message, in characters.
    #[arg(
        long,
        display_order = 15,
        env = "AMBLE_MAX_CHAT_CHARS",
        default_value_t = 280
    )]
    pub max_chat_chars: u32,

    /// Bytes of room frames a connection may have waiting, beyond its
    /// socket's own buffer, before it misses frames and is resynced with a
    /// fresh snapshot once it reads again.
    #[arg(long, display_order = 16, env = "AMBLE_SEND_QUEUE_BYTES", default_value_t = 65_536,
          value_parser = clap::value_parser!(u32).range(1_024..=16_777_216))]
    pub send_queue_bytes: u32,

    /// WebSocket ping period in milliseconds.
    #[arg(long, display_order = 17, env = "AMBLE_PING_INTERVAL_MS", default_value_t = 15_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub ping_interval_ms: u64,

    /// A connection that sends nothing (not even a pong) for this long is
    /// closed and its member leaves with reason TIMED_OUT.
    #[arg(long, display_order = 18, env = "AMBLE_IDLE_TIMEOUT_MS", default_value_t = 45_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub idle_timeout_ms: u64,

    /// A send that cannot complete within this many milliseconds (the peer
    /// stopped reading and its buffers are full) closes the connection.
    #[arg(long, display_order = 19, env = "AMBLE_SEND_TIMEOUT_MS", default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub send_timeout_ms: u64,

    /// Client pings a connection may send per second, sustained: protocol
    /// `Ping` messages, WebSocket ping frames and unsolicited pongs share
    /// this budget. A `Ping` over it gets no `Pong` (and at most one
    /// RATE_LIMITED notice a second); `--flood-factor` times over it,
    /// sustained, closes the connection (1008). 0 turns the budget off, as
    /// the request/reply benchmark (`loadtest --scenario rpc`) needs.
    #[arg(
        long,
        display_order = 35,
        env = "AMBLE_PINGS_PER_SEC",
        default_value_t = 5
    )]
    pub pings_per_sec: u32,

    /// Pings that may arrive back to back before `--pings-per-sec` applies.
    #[arg(long, display_order = 36, env = "AMBLE_PING_BURST", default_value_t = 10,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub ping_burst: u32,

    /// Member data: the most entries a member may hold (its Join's, its
    /// token's and its SetData's together).
    #[arg(long, display_order = 70, env = "AMBLE_MAX_DATA_ENTRIES", default_value_t = 8,
          value_parser = clap::value_parser!(u32).range(0..=64))]
    pub max_data_entries: u32,

    /// Member data: the most bytes of keys and values together (UTF-8)
    /// a member may hold.
    #[arg(long, display_order = 71, env = "AMBLE_MAX_DATA_BYTES", default_value_t = 512,
          value_parser = clap::value_parser!(u32).range(0..=16_384))]
    pub max_data_bytes: u32,

    /// Member data: the longest value, in characters.
    #[arg(long, display_order = 72, env = "AMBLE_MAX_DATA_VALUE_CHARS", default_value_t = 200,
          value_parser = clap::value_parser!(u32).range(1..=4_096))]
    pub max_data_value_chars: u32,

    /// SetData budget: one message per this many milliseconds...
    #[arg(long, display_order = 73, env = "AMBLE_DATA_INTERVAL_MS", default_value_t = 1_000,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub data_interval_ms: u32,

    /// ...with a burst of this many. Over it a SetData is dropped with
    /// RATE_LIMITED; `--flood-factor` times over it closes the connection.
    #[arg(long, display_order = 74, env = "AMBLE_DATA_BURST", default_value_t = 3,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub data_burst: u32,
}

impl SessionConfig {
    pub fn move_interval(&self) -> Duration {
        Duration::from_millis(u64::from(self.move_interval_ms))
    }

    pub fn chat_interval(&self) -> Duration {
        Duration::from_millis(u64::from(self.chat_interval_ms))
    }

    pub fn data_interval(&self) -> Duration {
        Duration::from_millis(u64::from(self.data_interval_ms))
    }

    /// One ping per this long, sustained; `None` when pings have no budget.
    pub fn ping_interval(&self) -> Option<Duration> {
        (self.pings_per_sec > 0).then(|| Duration::from_secs(1) / self.pings_per_sec)
    }
}
