//! Server configuration: every limit a named default, each settable by a
//! command-line flag or an `AMBLE_*` environment variable.

use std::ffi::OsString;
use std::fmt;
use std::net::IpAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use clap::Parser;
use clap::error::{ContextKind, ContextValue, ErrorKind};

use crate::edge::origin::OriginPattern;
use crate::protocol::{Rules, pb};

/// amble: a lightweight-presence server.
///
/// Clients join rooms over WebSocket (`/ws`, subprotocol `amble.v1`), send a
/// position at most once a second, and see everyone else in the room move.
#[derive(Clone, Debug, Parser)]
#[command(version, about, long_about = None)]
pub struct Config {
    /// Address to listen on: HOST:PORT, where HOST is an IP address or a
    /// host name (`localhost:3000`, `[::1]:3000`), or :PORT alone for every
    /// interface (as 0.0.0.0:PORT).
    #[arg(long, env = "AMBLE_LISTEN", default_value = "127.0.0.1:3000")]
    pub listen: ListenAddr,

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

    /// A client sending moves, chat or pings this many times faster than its
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

    /// Most open WebSocket connections; more are refused with 1013. Each
    /// takes one open file: when the process's open-file limit cannot hold
    /// this many plus --max-http-connections, the server serves fewer and
    /// says so at start (`amble_connection_cap` in /metrics).
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
    /// A client has this many milliseconds from connecting (or from the
    /// first byte of its next request) to send a whole request head; then
    /// it gets 408 and is closed.
    #[arg(long, env = "AMBLE_HTTP_HEADER_TIMEOUT_MS", default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub http_header_timeout_ms: u64,

    /// Largest request head (request line and headers), bytes; a larger
    /// one gets 431 and is closed.
    #[arg(long, env = "AMBLE_HTTP_MAX_HEADER_BYTES", default_value_t = 16_384,
          value_parser = clap::value_parser!(u32).range(1_024..=1_048_576))]
    pub http_max_header_bytes: u32,

    /// A kept-alive HTTP connection that starts no new request for this
    /// many milliseconds is closed (also a response the client does not
    /// read for this long).
    #[arg(long, env = "AMBLE_HTTP_IDLE_TIMEOUT_MS", default_value_t = 30_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub http_idle_timeout_ms: u64,

    /// Most connections that are not (yet) WebSockets: plain HTTP and
    /// upgrades in progress. When full, a newcomer is served and the
    /// connection that has waited longest for a request head is closed.
    #[arg(long, env = "AMBLE_MAX_HTTP_CONNECTIONS", default_value_t = 1_024,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_http_connections: u32,

    /// Most open connections (HTTP and WebSocket) from one client address
    /// (IPv6: one /64 network); more are refused with 429.
    #[arg(long, env = "AMBLE_MAX_CONNECTIONS_PER_IP", default_value_t = 256,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections_per_ip: u32,

    /// Joins one client address may make across all its sockets: one per
    /// this many milliseconds...
    #[arg(long, env = "AMBLE_IP_JOIN_INTERVAL_MS", default_value_t = 250,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub ip_join_interval_ms: u32,

    /// ...after a burst of this many.
    #[arg(long, env = "AMBLE_IP_JOIN_BURST", default_value_t = 30,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub ip_join_burst: u32,

    /// Reverse proxies (CIDR list, e.g. `10.0.0.0/8,::1/128`) whose
    /// forwarding header names the client. Other peers are the client.
    #[arg(long, env = "AMBLE_TRUSTED_PROXIES", value_delimiter = ',')]
    pub trusted_proxies: Vec<ipnet::IpNet>,

    /// The header the trusted proxies append the client address to (the
    /// other one is ignored, since a client could have written it).
    #[arg(long, env = "AMBLE_FORWARDED_HEADER", value_enum,
          default_value_t = ForwardedHeader::XForwardedFor)]
    pub forwarded_header: ForwardedHeader,

    /// Exempt loopback clients (127.0.0.0/8, ::1) from the per-address
    /// limits, so a local load test or proxy is not throttled.
    #[arg(long, env = "AMBLE_EXEMPT_LOOPBACK", default_value_t = true,
          value_parser = clap::builder::BoolishValueParser::new(),
          action = clap::ArgAction::Set)]
    pub exempt_loopback: bool,

    /// Web pages (origins) that may open a WebSocket, besides a page on the
    /// server's own host (an `Origin` naming the `Host` the request was sent
    /// to) and clients that send no `Origin` (not browsers), which are always
    /// admitted. Each entry is an exact origin (`https://app.example.com`), an
    /// origin on any port (`http://localhost:*`), or `*` for every page;
    /// setting the list replaces the default, which is for local development.
    /// Other pages are refused with 403.
    #[arg(
        long,
        env = "AMBLE_ALLOWED_ORIGINS",
        value_delimiter = ',',
        default_value = "http://localhost:*,http://127.0.0.1:*"
    )]
    pub allowed_origins: Vec<OriginPattern>,

    /// A file holding a bearer token (16 or more visible ASCII characters)
    /// that `GET /metrics` then requires as `Authorization: Bearer <token>`.
    /// Without it /metrics is open to anyone who can reach the server.
    #[arg(long, env = "AMBLE_METRICS_TOKEN_FILE")]
    pub metrics_token_file: Option<PathBuf>,

    // ---- What a client may send: pings, fragments, text ----
    /// Client pings a connection may send per second, sustained: protocol
    /// `Ping` messages, WebSocket ping frames and unsolicited pongs share
    /// this budget. A `Ping` over it gets no `Pong` (and at most one
    /// RATE_LIMITED notice a second); `--flood-factor` times over it,
    /// sustained, closes the connection (1008). 0 turns the budget off, as
    /// the request/reply benchmark (`loadtest --scenario rpc`) needs.
    #[arg(long, env = "AMBLE_PINGS_PER_SEC", default_value_t = 5)]
    pub pings_per_sec: u32,

    /// Pings that may arrive back to back before `--pings-per-sec` applies.
    #[arg(long, env = "AMBLE_PING_BURST", default_value_t = 10,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub ping_burst: u32,

    // ---- Who may join: signed tokens ----
    /// File holding an HS256 secret (at least 32 bytes; trailing line breaks
    /// are not part of it). When set, every Join must carry a token signed
    /// with it (see docs/protocol.md, "Tokens"). Read once at start.
    #[arg(
        long,
        env = "AMBLE_AUTH_HS256_SECRET_FILE",
        value_name = "PATH",
        conflicts_with = "auth_public_key_file"
    )]
    pub auth_hs256_secret_file: Option<std::path::PathBuf>,

    /// File holding a PEM public key (RSA for RS256, or Ed25519 for EdDSA;
    /// the algorithm follows the key). When set, every Join must carry a
    /// token signed with the matching private key. Read once at start.
    #[arg(long, env = "AMBLE_AUTH_PUBLIC_KEY_FILE", value_name = "PATH")]
    pub auth_public_key_file: Option<std::path::PathBuf>,

    // ---- Cluster (NATS) ----
    /// NATS server URL(s), comma-separated (`nats://host:4222`, `tls://...`).
    /// When set, this node joins a cluster of amble nodes sharing rooms
    /// through NATS (see docs/cluster.md); when absent, amble runs alone.
    #[arg(long, env = "AMBLE_NATS", value_delimiter = ',', value_name = "URL")]
    pub nats: Vec<String>,

    /// NATS credentials file (JWT and NKey seed, `.creds`).
    #[arg(long, env = "AMBLE_NATS_CREDS_FILE", value_name = "PATH")]
    pub nats_creds_file: Option<PathBuf>,

    /// File holding a NATS token (trailing line breaks are not part of it).
    #[arg(long, env = "AMBLE_NATS_TOKEN_FILE", value_name = "PATH")]
    pub nats_token_file: Option<PathBuf>,

    /// NATS user name; the password comes from --nats-password-file.
    #[arg(long, env = "AMBLE_NATS_USER", requires = "nats_password_file")]
    pub nats_user: Option<String>,

    /// File holding the NATS password of --nats-user.
    #[arg(
        long,
        env = "AMBLE_NATS_PASSWORD_FILE",
        value_name = "PATH",
        requires = "nats_user"
    )]
    pub nats_password_file: Option<PathBuf>,

    /// PEM file of certificate authorities to trust for the NATS server.
    #[arg(long, env = "AMBLE_NATS_TLS_CA_FILE", value_name = "PATH")]
    pub nats_tls_ca_file: Option<PathBuf>,

    /// PEM client certificate for NATS (mutual TLS); needs --nats-tls-key-file.
    #[arg(
        long,
        env = "AMBLE_NATS_TLS_CERT_FILE",
        value_name = "PATH",
        requires = "nats_tls_key_file"
    )]
    pub nats_tls_cert_file: Option<PathBuf>,

    /// PEM private key of --nats-tls-cert-file.
    #[arg(
        long,
        env = "AMBLE_NATS_TLS_KEY_FILE",
        value_name = "PATH",
        requires = "nats_tls_cert_file"
    )]
    pub nats_tls_key_file: Option<PathBuf>,

    /// Refuse to talk to NATS without TLS. Takes 1/0, yes/no, true/false, on/off.
    #[arg(long, env = "AMBLE_NATS_REQUIRE_TLS", value_parser = clap::builder::BoolishValueParser::new(),
          action = clap::ArgAction::Set, num_args = 0..=1, default_value_t = false,
          default_missing_value = "true")]
    pub nats_require_tls: bool,

    /// This node's name in the cluster, `[A-Za-z0-9_-]{1,64}`. Default: the
    /// host name's first label, then `-PORT` (the port bound), e.g.
    /// `box-3000`. A node started again under the same name is the same
    /// node in a new incarnation: its previous run's members are removed.
    #[arg(long, env = "AMBLE_NODE_NAME", value_parser = parse_node_name)]
    pub node_name: Option<String>,

    /// This node's slot, below --cluster-slots: its member ids are
    /// `index * slots + slot`, so nodes never hand out the same id. Default:
    /// the node name's trailing number mod the slot count, else a hash of
    /// the name. Give live nodes different slots.
    #[arg(long, env = "AMBLE_NODE_SLOT")]
    pub node_slot: Option<u32>,

    /// Number of node slots; every node of a cluster must use the same.
    #[arg(long, env = "AMBLE_CLUSTER_SLOTS", default_value_t = 16,
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub cluster_slots: u32,

    /// NATS subject prefix, so several deployments can share one NATS.
    #[arg(long, env = "AMBLE_CLUSTER_PREFIX", default_value = "amble",
          value_parser = parse_cluster_prefix)]
    pub cluster_prefix: String,

    /// Period of this node's heartbeat to the other nodes, milliseconds.
    #[arg(long, env = "AMBLE_CLUSTER_HEARTBEAT_MS", default_value_t = 1_000,
          value_parser = clap::value_parser!(u64).range(10..))]
    pub cluster_heartbeat_ms: u64,

    /// A node not heard from for this long (milliseconds) is down: its
    /// members leave every room with reason SERVER_LOST.
    #[arg(long, env = "AMBLE_CLUSTER_NODE_TIMEOUT_MS", default_value_t = 3_000,
          value_parser = clap::value_parser!(u64).range(20..))]
    pub cluster_node_timeout_ms: u64,

    /// How long before each tick (milliseconds) this node publishes its
    /// members' moves, so other nodes can send them in the same tick.
    #[arg(long, env = "AMBLE_CLUSTER_LEAD_MS", default_value_t = 20)]
    pub cluster_lead_ms: u32,

    /// How long (milliseconds) a node opening a room waits for the other
    /// nodes' parts of it before it welcomes the joiner.
    #[arg(long, env = "AMBLE_CLUSTER_SNAPSHOT_TIMEOUT_MS", default_value_t = 250,
          value_parser = clap::value_parser!(u64).range(1..=60_000))]
    pub cluster_snapshot_timeout_ms: u64,

    /// Messages waiting to be published to NATS, at most; past it they are
    /// dropped and counted (the other nodes repair through full states).
    #[arg(long, env = "AMBLE_CLUSTER_QUEUE", default_value_t = 16_384,
          value_parser = clap::value_parser!(u32).range(16..))]
    pub cluster_queue: u32,

    /// How long (milliseconds) a node stays subscribed to a room after its
    /// last local member there left, so a page reload does not reopen it.
    #[arg(long, env = "AMBLE_CLUSTER_ROOM_LINGER_MS", default_value_t = 1_000)]
    pub cluster_room_linger_ms: u64,

    // ---- Logging ----
    /// Log as JSON lines (for containers) instead of text. Takes an
    /// optional value: 1/0, yes/no, true/false, on/off.
    #[arg(long, env = "AMBLE_LOG_JSON", value_parser = clap::builder::BoolishValueParser::new(),
          action = clap::ArgAction::Set, num_args = 0..=1, default_value_t = false,
          default_missing_value = "true")]
    pub log_json: bool,

    // ---- Tick ----
    /// Tasks each room tick is shared out over: every room's batch is
    /// written by one of them, so a node sends from every core, and a
    /// room's frames stay in order. 0 means one per runtime worker thread
    /// (see `--workers`); 1 writes every room from the ticker task alone.
    #[arg(long, env = "AMBLE_TICK_WORKERS", default_value_t = 0,
          value_parser = clap::value_parser!(u16).range(0..=1024))]
    pub tick_workers: u16,
}

/// amble: a lightweight-presence server.
///
/// Clients join rooms over WebSocket (`/ws`, subprotocol `amble.v1`), send a
/// position at most once a second, and see everyone else in the room move.
/// With no subcommand, `amble` runs the server.
#[derive(Clone, Debug, Parser)]
#[command(version, about, long_about = None, args_conflicts_with_subcommands = true)]
pub struct Cli {
    #[command(flatten)]
    pub config: Config,
    #[command(subcommand)]
    pub command: Option<Tool>,
}

/// Subcommands; with none, `amble` runs the server.
#[derive(Clone, Debug, clap::Subcommand)]
pub enum Tool {
    /// Print a signed token (HS256) for a Join, for testing and operators.
    Token(TokenArgs),
}

/// `amble token`: the claims of the token and the secret to sign it with.
#[derive(Clone, Debug, clap::Args)]
pub struct TokenArgs {
    /// The user id (`sub` claim): one user is one avatar per room.
    #[arg(long)]
    pub sub: String,

    /// Display name (`name` claim), replacing the one a Join asks for.
    #[arg(long)]
    pub name: Option<String>,

    /// Rooms the token allows (`rooms` claim), comma-separated; a trailing
    /// `*` allows every room starting with what comes before it. Without
    /// it the token allows every room.
    #[arg(long, value_delimiter = ',')]
    pub rooms: Option<Vec<String>>,

    /// How long the token is valid: a number with a unit, s, m, h or d
    /// (`90s`, `15m`, `1h`, `7d`).
    #[arg(long, default_value = "1h", value_parser = parse_ttl)]
    pub ttl: Duration,

    /// File holding the HS256 secret (the server's
    /// `--auth-hs256-secret-file`).
    #[arg(long, env = "AMBLE_AUTH_HS256_SECRET_FILE", value_name = "PATH")]
    pub secret_file: std::path::PathBuf,
}

/// Checks a `--node-name`: `[A-Za-z0-9_-]{1,64}`.
pub fn parse_node_name(text: &str) -> Result<String, String> {
    if crate::cluster::wire::valid_node_name(text) {
        Ok(text.to_owned())
    } else {
        Err(format!(
            "{text:?}: 1 to 64 characters from A-Z, a-z, 0-9, '_' and '-'"
        ))
    }
}

/// Checks a `--cluster-prefix`: one or more NATS tokens of
/// `[A-Za-z0-9_-]`, separated by single dots.
pub fn parse_cluster_prefix(text: &str) -> Result<String, String> {
    let ok = !text.is_empty()
        && text.len() <= 64
        && text.split('.').all(|t| {
            !t.is_empty()
                && t.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-'))
        });
    if ok {
        Ok(text.to_owned())
    } else {
        Err(format!(
            "{text:?}: tokens of A-Z, a-z, 0-9, '_' and '-' separated by single dots, at most 64 characters"
        ))
    }
}

/// The longest `--ttl` accepted.
pub const MAX_TTL: Duration = Duration::from_secs(366 * 86_400);

/// Parses a duration such as `90s`, `15m`, `1h` or `7d`.
pub fn parse_ttl(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("{text:?} needs a unit: s, m, h or d (e.g. 1h)"))?;
    let (number, unit) = text.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{text:?}: expected a whole number then s, m, h or d"))?;
    let unit_secs = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3_600,
        "d" => 86_400,
        _ => return Err(format!("{text:?}: the unit must be s, m, h or d")),
    };
    let ttl = Duration::from_secs(n.saturating_mul(unit_secs));
    if ttl.is_zero() {
        return Err("the ttl must be more than 0".into());
    }
    if ttl > MAX_TTL {
        return Err("the ttl must be at most 366d".into());
    }
    Ok(ttl)
}

/// Where a trusted proxy writes the client address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ForwardedHeader {
    /// `X-Forwarded-For: client, proxy1, ...` (nginx, Caddy, HAProxy, cloud load balancers).
    XForwardedFor,
    /// `Forwarded: for=client, for=proxy1` (RFC 7239).
    Forwarded,
}

/// The defaults of every flag, hermetic: no `AMBLE_*` variable is read and
/// the process never exits (only `main`, through [`parse_or_exit`], reads
/// the environment).
impl Default for Config {
    fn default() -> Self {
        Self::from_args(["amble"]).expect("every default value is valid")
    }
}

impl Config {
    /// Parses `args` (the program name first) as the command line alone:
    /// no `AMBLE_*` variable is read and the process never exits. For tests
    /// and tools; the binary parses with [`parse_or_exit`].
    pub fn from_args<I, T>(args: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        use clap::{CommandFactory as _, FromArgMatches as _};
        let command = Self::command().mut_args(|arg| arg.env(None::<&str>));
        Self::from_arg_matches(&command.try_get_matches_from(args)?)
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

    pub fn http_header_timeout(&self) -> Duration {
        Duration::from_millis(self.http_header_timeout_ms)
    }

    pub fn http_idle_timeout(&self) -> Duration {
        Duration::from_millis(self.http_idle_timeout_ms)
    }

    /// One ping per this long, sustained; `None` when pings have no budget.
    pub fn ping_interval(&self) -> Option<Duration> {
        (self.pings_per_sec > 0).then(|| Duration::from_secs(1) / self.pings_per_sec)
    }
}

/// Where the server listens: a host (an IP address or a name, resolved
/// when binding) and a port. `:PORT` alone means every interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListenAddr {
    host: String,
    port: u16,
}

impl ListenAddr {
    /// The address in the form `TcpListener::bind` takes (`[::1]:3000`).
    pub fn to_bind(&self) -> String {
        self.to_string()
    }
}

impl fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.host.parse::<IpAddr>() {
            Ok(IpAddr::V6(ip)) => write!(f, "[{ip}]:{}", self.port),
            _ => write!(f, "{}:{}", self.host, self.port),
        }
    }
}

impl FromStr for ListenAddr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        const FORM: &str = "expected HOST:PORT (127.0.0.1:3000, localhost:3000, [::1]:3000) \
                            or :PORT for every interface";
        let Some((host, port)) = s.rsplit_once(':') else {
            return Err(format!("no port: {FORM}"));
        };
        let port: u16 = port
            .parse()
            .map_err(|_| format!("{port:?} is not a port number (0-65535): {FORM}"))?;
        let host = if host.is_empty() {
            "0.0.0.0".to_owned()
        } else if let Some(v6) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
            v6.parse::<std::net::Ipv6Addr>()
                .map_err(|_| format!("{v6:?} is not an IPv6 address: {FORM}"))?
                .to_string()
        } else if host.parse::<IpAddr>().is_ok() {
            host.to_owned()
        } else if is_host_name(host) {
            host.to_ascii_lowercase()
        } else {
            return Err(format!(
                "{host:?} is neither an IP address nor a host name: {FORM}"
            ));
        };
        Ok(Self { host, port })
    }
}

/// A DNS host name (RFC 1123): dot-separated labels of letters, digits and
/// inner hyphens, at most 253 characters.
fn is_host_name(host: &str) -> bool {
    host.len() <= 253
        && host.split('.').all(|label| {
            (1..=63).contains(&label.len())
                && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
        // All digits and dots would be a mistyped IPv4 address, not a name.
        && !host.bytes().all(|b| b.is_ascii_digit() || b == b'.')
}

/// Parses `T` from the command line and the environment, as `T::parse()`
/// does, except that a bad value which came from an `AMBLE_*` variable is
/// reported under the variable's name, not the flag's.
pub fn parse_or_exit<T: Parser>() -> T {
    let args: Vec<OsString> = std::env::args_os().collect();
    match T::try_parse_from(&args) {
        Ok(parsed) => parsed,
        Err(err) => {
            name_the_variable(err, &T::command(), &args, |var| std::env::var_os(var)).exit()
        }
    }
}

/// Rewrites a value error for an argument that was not on the command
/// line but set in its environment variable, so the message names the
/// variable the user has to fix.
fn name_the_variable(
    err: clap::Error,
    command: &clap::Command,
    args: &[OsString],
    env: impl Fn(&str) -> Option<OsString>,
) -> clap::Error {
    if !matches!(
        err.kind(),
        ErrorKind::ValueValidation | ErrorKind::InvalidValue
    ) {
        return err;
    }
    let Some(ContextValue::String(shown)) = err.get(ContextKind::InvalidArg) else {
        return err;
    };
    let Some(arg) = command.get_arguments().find(|a| {
        a.get_long()
            .is_some_and(|long| shown.split_whitespace().next() == Some(&format!("--{long}")))
    }) else {
        return err;
    };
    let (Some(long), Some(var)) = (arg.get_long(), arg.get_env()) else {
        return err;
    };
    let flag = format!("--{long}");
    let on_command_line = args.iter().skip(1).any(|a| {
        a.to_str()
            .is_some_and(|a| a == flag || a.starts_with(&format!("{flag}=")))
    });
    let var = var.to_string_lossy();
    let Some(value) = env(&var) else {
        return err;
    };
    if on_command_line {
        return err;
    }
    let why = std::error::Error::source(&err)
        .map(|source| format!(": {source}"))
        .unwrap_or_default();
    let mut command = command.clone();
    command.error(
        ErrorKind::ValueValidation,
        format!(
            "invalid value {:?} in the environment variable {var} (the variable for {flag}){why}",
            value.to_string_lossy()
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory as _;

    #[test]
    fn defaults_match_the_documented_limits() {
        let c = Config::default();
        assert_eq!(c.listen.to_bind(), "127.0.0.1:3000");
        assert_eq!(
            (c.tick_ms, c.move_interval_ms, c.move_burst),
            (100, 1_000, 2)
        );
        assert_eq!(c.motion_time_unit_ms(), 100);
        let immediate = Config::parse_from(["amble", "--tick-ms", "0"]);
        assert_eq!(immediate.motion_time_unit_ms(), 10);
    }

    #[test]
    fn no_subcommand_runs_the_server_with_every_flag() {
        let cli = Cli::try_parse_from(["amble", "--tick-ms", "50", "--log-json"]).expect("parse");
        assert!(cli.command.is_none());
        assert_eq!(cli.config.tick_ms, 50);
        assert!(cli.config.log_json);
        // Server flags do not mix with a subcommand.
        assert!(Cli::try_parse_from(["amble", "--tick-ms", "50", "token", "--sub", "u"]).is_err());
        // One key at a time.
        assert!(
            Config::try_parse_from([
                "amble",
                "--auth-hs256-secret-file",
                "a",
                "--auth-public-key-file",
                "b"
            ])
            .is_err()
        );
    }

    #[test]
    fn token_subcommand_takes_its_claims() {
        let cli = Cli::try_parse_from([
            "amble",
            "token",
            "--sub",
            "u-1",
            "--name",
            "Ada",
            "--rooms",
            "team-*,lobby",
            "--ttl",
            "15m",
            "--secret-file",
            "/s",
        ])
        .expect("parse");
        let Some(Tool::Token(t)) = cli.command else {
            panic!("no token subcommand");
        };
        assert_eq!(t.sub, "u-1");
        assert_eq!(t.name.as_deref(), Some("Ada"));
        assert_eq!(
            t.rooms,
            Some(vec!["team-*".to_string(), "lobby".to_string()])
        );
        assert_eq!(t.ttl, Duration::from_secs(900));
    }

    #[test]
    fn ttl_takes_units() {
        assert_eq!(parse_ttl("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_ttl("15m"), Ok(Duration::from_secs(900)));
        assert_eq!(parse_ttl("1h"), Ok(Duration::from_secs(3_600)));
        assert_eq!(parse_ttl("7d"), Ok(Duration::from_secs(7 * 86_400)));
        for bad in ["", "1", "h", "1w", "1.5h", "-1h", "0s", "367d", "1 h"] {
            assert!(parse_ttl(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn ping_budget_defaults_and_off() {
        let c = Config::default();
        assert_eq!((c.pings_per_sec, c.ping_burst), (5, 10));
        assert_eq!(c.ping_interval(), Some(Duration::from_millis(200)));
        let off = Config::parse_from(["amble", "--pings-per-sec", "0"]);
        assert_eq!(off.ping_interval(), None);
        assert!(Config::try_parse_from(["amble", "--ping-burst", "0"]).is_err());
    }

    #[test]
    fn allowed_origins_default_to_local_development() {
        let shown: Vec<String> = Config::default()
            .allowed_origins
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(shown, ["http://localhost:*", "http://127.0.0.1:*"]);
        let listed = Config::parse_from([
            "amble",
            "--allowed-origins",
            "https://app.example.com, http://localhost:*",
        ]);
        assert_eq!(listed.allowed_origins.len(), 2);
    }

    #[test]
    fn malformed_origins_are_refused_with_the_entry_and_the_fix() {
        let err = Config::try_parse_from([
            "amble",
            "--allowed-origins",
            "https://app.example.com,https://other.example.com/",
        ])
        .expect_err("a path is not an origin");
        let text = err.to_string();
        assert!(text.contains("https://other.example.com/"), "{text}");
        assert!(text.contains("no path"), "{text}");
    }

    #[test]
    fn refuses_nonsense() {
        assert!(Config::try_parse_from(["amble", "--move-interval-ms", "0"]).is_err());
        assert!(Config::try_parse_from(["amble", "--listen", "nowhere"]).is_err());
    }

    #[test]
    fn listen_takes_host_names_and_a_bare_port() {
        let parse = |s: &str| s.parse::<ListenAddr>().map(|a| a.to_bind());
        assert_eq!(parse("127.0.0.1:3000").as_deref(), Ok("127.0.0.1:3000"));
        assert_eq!(parse("localhost:3001").as_deref(), Ok("localhost:3001"));
        assert_eq!(parse(":3001").as_deref(), Ok("0.0.0.0:3001"));
        assert_eq!(parse("[::1]:3000").as_deref(), Ok("[::1]:3000"));
        assert_eq!(
            parse("Amble-1.example.org:80").as_deref(),
            Ok("amble-1.example.org:80")
        );
        for bad in [
            "garbage",
            "nowhere:",
            "host:99999",
            "1.2.3:80",
            "-bad-:1",
            "a b:1",
            "[zz]:1",
        ] {
            let err = parse(bad).expect_err(bad);
            assert!(err.contains("HOST:PORT"), "{bad}: {err}");
        }
    }

    #[test]
    fn a_bad_variable_is_named_instead_of_the_flag() {
        let args: Vec<OsString> = vec!["amble".into()];
        let env = |var: &str| (var == "AMBLE_LISTEN").then(|| OsString::from("garbage"));
        let err = Config::command()
            .try_get_matches_from(["amble", "--listen", "garbage"])
            .expect_err("garbage is refused");
        let message = name_the_variable(err, &Config::command(), &args, env).to_string();
        assert!(message.contains("AMBLE_LISTEN"), "{message}");
        assert!(message.contains("\"garbage\""), "{message}");
        assert!(message.contains("HOST:PORT"), "{message}");

        // Given on the command line, the flag is what the user typed.
        let typed: Vec<OsString> = vec!["amble".into(), "--listen".into(), "garbage".into()];
        let err = Config::command()
            .try_get_matches_from(["amble", "--listen", "garbage"])
            .expect_err("garbage is refused");
        let message = name_the_variable(err, &Config::command(), &typed, env).to_string();
        assert!(!message.contains("AMBLE_LISTEN"), "{message}");
    }

    #[test]
    fn booleans_take_the_usual_spellings() {
        for (given, want) in [
            ("1", true),
            ("yes", true),
            ("true", true),
            ("on", true),
            ("0", false),
            ("no", false),
            ("false", false),
            ("off", false),
        ] {
            let c = Config::try_parse_from(["amble", &format!("--log-json={given}")]).expect(given);
            assert_eq!(c.log_json, want, "{given}");
        }
        assert!(
            Config::try_parse_from(["amble", "--log-json"])
                .expect("bare flag")
                .log_json
        );
        assert!(!Config::default().log_json);
    }
}
