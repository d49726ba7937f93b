//! Server configuration: every limit a named default, each settable by a
//! command-line flag or an `AMBLE_*` environment variable.

use std::net::SocketAddr;
use std::time::Duration;

use clap::Parser;

use crate::protocol::{Rules, pb};

/// amble: a lightweight-presence server.
///
/// Clients join rooms over WebSocket (`/ws`, subprotocol `amble.v1`), send a
/// position at most once a second, and see everyone else in the room move.
#[derive(Clone, Debug, Parser)]
#[command(version, about, long_about = None)]
pub struct Config {
    /// Address to listen on.
    #[arg(long, env = "AMBLE_LISTEN", default_value = "127.0.0.1:3000")]
    pub listen: SocketAddr,

    /// Room batch period in milliseconds: a room's moves of one tick go out
    /// as one frame. 0 sends each move at once.
    #[arg(long, env = "AMBLE_TICK_MS", default_value_t = 100)]
    pub tick_ms: u32,

    /// Sustained applied moves per member: one per this many milliseconds.
    #[arg(long, env = "AMBLE_MOVE_INTERVAL_MS", default_value_t = 1_000,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub move_interval_ms: u32,

    /// Moves a member may have applied back to back before the interval
    /// applies (absorbs network jitter).
    #[arg(long, env = "AMBLE_MOVE_BURST", default_value_t = 2,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub move_burst: u32,

    /// A client sending moves or chat this many times faster than its
    /// budget, sustained, is closed (1008).
    #[arg(long, env = "AMBLE_FLOOD_FACTOR", default_value_t = 20,
          value_parser = clap::value_parser!(u32).range(2..))]
    pub flood_factor: u32,

    /// Chat budget: one message per this many milliseconds...
    #[arg(long, env = "AMBLE_CHAT_INTERVAL_MS", default_value_t = 2_000,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub chat_interval_ms: u32,

    /// ...with a burst of this many.
    #[arg(long, env = "AMBLE_CHAT_BURST", default_value_t = 5,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub chat_burst: u32,

    /// World width in centimetres.
    #[arg(long, env = "AMBLE_WORLD_WIDTH", default_value_t = 5_000,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub world_width: u32,

    /// World height in centimetres.
    #[arg(long, env = "AMBLE_WORLD_HEIGHT", default_value_t = 5_000,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub world_height: u32,

    /// Fastest walk, centimetres per second.
    #[arg(long, env = "AMBLE_MAX_SPEED", default_value_t = 1_000,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_speed: u32,

    /// Most members in one room.
    #[arg(long, env = "AMBLE_ROOM_CAPACITY", default_value_t = 500,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub room_capacity: u32,

    /// Most open WebSocket connections; more are refused with 1013.
    /// (A process here may hold at most 20,000 open files.)
    #[arg(long, env = "AMBLE_MAX_CONNECTIONS", default_value_t = 19_000,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: u32,

    /// Largest client frame in bytes; larger ones are refused with 1009.
    #[arg(long, env = "AMBLE_MAX_MESSAGE_BYTES", default_value_t = 4_096,
          value_parser = clap::value_parser!(u32).range(64..=1_048_576))]
    pub max_message_bytes: u32,

    /// Longest display name, in characters.
    #[arg(long, env = "AMBLE_MAX_NAME_CHARS", default_value_t = 32)]
    pub max_name_chars: u32,

    /// Longest chat message, in characters.
    #[arg(long, env = "AMBLE_MAX_CHAT_CHARS", default_value_t = 280)]
    pub max_chat_chars: u32,

    /// Bytes of room frames a connection may have waiting, beyond its
    /// socket's own buffer, before it misses frames and is resynced with a
    /// fresh snapshot once it reads again.
    #[arg(long, env = "AMBLE_SEND_QUEUE_BYTES", default_value_t = 65_536,
          value_parser = clap::value_parser!(u32).range(1_024..=16_777_216))]
    pub send_queue_bytes: u32,

    /// WebSocket ping period in milliseconds.
    #[arg(long, env = "AMBLE_PING_INTERVAL_MS", default_value_t = 15_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub ping_interval_ms: u64,

    /// A connection that sends nothing (not even a pong) for this long is
    /// closed and its member leaves with reason TIMED_OUT.
    #[arg(long, env = "AMBLE_IDLE_TIMEOUT_MS", default_value_t = 45_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub idle_timeout_ms: u64,

    /// A send that cannot complete within this many milliseconds (the peer
    /// stopped reading and its buffers are full) closes the connection.
    #[arg(long, env = "AMBLE_SEND_TIMEOUT_MS", default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub send_timeout_ms: u64,

    /// Kernel send buffer per connection, bytes (bounds what a slow reader
    /// can pin in the kernel). 0 leaves the system default.
    #[arg(long, env = "AMBLE_SOCKET_SEND_BUFFER", default_value_t = 65_536)]
    pub socket_send_buffer: u32,

    /// How long shutdown waits for connections to close, milliseconds.
    #[arg(long, env = "AMBLE_SHUTDOWN_TIMEOUT_MS", default_value_t = 5_000)]
    pub shutdown_timeout_ms: u64,

    /// Runtime worker threads; 0 means one per CPU. A single worker costs
    /// 7-10% less CPU per update on a small machine (docs/benchmarks.md)
    /// but caps the server at one core.
    #[arg(long, env = "AMBLE_WORKERS", default_value_t = 0,
          value_parser = clap::value_parser!(u16).range(0..=1024))]
    pub workers: u16,

    // ---- Connections before the WebSocket: HTTP deadlines, caps, origins, proxies ----

    // ---- What a client may send: pings, fragments, text ----

    // ---- Who may join: signed tokens ----

    // ---- Logging ----

    /// Log as JSON lines (for containers) instead of text.
    #[arg(long, env = "AMBLE_LOG_JSON")]
    pub log_json: bool,
}

impl Default for Config {
    fn default() -> Self {
        Self::parse_from(["amble"])
    }
}

impl Config {
    /// Validation ranges for client messages.
    pub fn rules(&self) -> Rules {
        Rules {
            world_width: self.world_width,
            world_height: self.world_height,
            max_speed: self.max_speed,
            max_name_chars: self.max_name_chars as usize,
            max_room_chars: Rules::default().max_room_chars,
            max_chat_chars: self.max_chat_chars as usize,
        }
    }

    /// The unit of truncated motion times: the tick, or 10 ms when moves
    /// are sent at once.
    pub fn motion_time_unit_ms(&self) -> u32 {
        if self.tick_ms == 0 { 10 } else { self.tick_ms }
    }

    /// The limits advertised to clients in `Welcome`.
    pub fn limits(&self) -> pb::Limits {
        pb::Limits {
            move_interval_ms: self.move_interval_ms,
            move_burst: self.move_burst,
            tick_ms: self.tick_ms,
            motion_time_unit_ms: self.motion_time_unit_ms(),
            world_width: self.world_width,
            world_height: self.world_height,
            max_speed: self.max_speed,
            max_message_bytes: self.max_message_bytes,
            max_name_chars: self.max_name_chars,
            max_chat_chars: self.max_chat_chars,
            room_capacity: self.room_capacity,
            chat_interval_ms: self.chat_interval_ms,
            chat_burst: self.chat_burst,
        }
    }

    pub fn tick(&self) -> Duration {
        Duration::from_millis(u64::from(self.tick_ms))
    }

    pub fn move_interval(&self) -> Duration {
        Duration::from_millis(u64::from(self.move_interval_ms))
    }

    pub fn chat_interval(&self) -> Duration {
        Duration::from_millis(u64::from(self.chat_interval_ms))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_the_documented_limits() {
        let c = Config::default();
        assert_eq!(c.listen.to_string(), "127.0.0.1:3000");
        assert_eq!(
            (c.tick_ms, c.move_interval_ms, c.move_burst),
            (100, 1_000, 2)
        );
        assert_eq!(c.motion_time_unit_ms(), 100);
        let immediate = Config::parse_from(["amble", "--tick-ms", "0"]);
        assert_eq!(immediate.motion_time_unit_ms(), 10);
    }

    #[test]
    fn refuses_nonsense() {
        assert!(Config::try_parse_from(["amble", "--move-interval-ms", "0"]).is_err());
        assert!(Config::try_parse_from(["amble", "--listen", "nowhere"]).is_err());
    }
}
