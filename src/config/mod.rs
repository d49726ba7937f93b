//! Server configuration: every limit a named default, each settable by a
//! command-line flag or an `AMBLE_*` environment variable.
//!
//! [`Config`] gathers the groups its components own, flattened into one
//! command line: [`EdgeConfig`] (listening, HTTP before the upgrade),
//! [`SessionConfig`] (what one WebSocket may send, its deadlines),
//! [`RoomConfig`] (the tick and the world), [`AddressConfig`] and
//! [`AuthConfig`] (in `access`), [`ClusterConfig`] (in `cluster`),
//! [`HookConfig`] (in `hooks`), and the
//! process's own flags. Each flag keeps its place in `--help` through its
//! `display_order`, the order it had before the groups.

mod edge;
mod room;
mod session;

use std::ffi::OsString;
use std::time::Duration;

use clap::Parser;
use clap::error::{ContextKind, ContextValue, ErrorKind};

pub use crate::access::addresses::{AddressConfig, ForwardedHeader};
pub use crate::access::auth::AuthConfig;
pub use crate::api::ApiConfig;
pub use crate::cluster::settings::ClusterConfig;
pub use crate::hooks::HookConfig;
use crate::protocol::{Rules, pb};
pub use edge::{EdgeConfig, ListenAddr};
pub use room::RoomConfig;
pub use session::SessionConfig;

/// amble: a lightweight-presence server.
///
/// Clients join rooms over WebSocket (`/ws`, subprotocol `amble.v1`), send a
/// position at most once a second, and see everyone else in the room move.
#[derive(Clone, Debug, Parser)]
#[command(version, about, long_about = None)]
pub struct Config {
    // Where to listen, and connections before the WebSocket.
    #[command(flatten)]
    pub edge: EdgeConfig,

    // One WebSocket: what its client may send, and its deadlines.
    #[command(flatten)]
    pub session: SessionConfig,

    // Rooms: the tick, the world, a room's size.
    #[command(flatten)]
    pub room: RoomConfig,

    // Per client address: caps, join budgets, trusted proxies.
    #[command(flatten)]
    pub addresses: AddressConfig,

    // Who may join: signed tokens.
    #[command(flatten)]
    pub auth: AuthConfig,

    // Cluster (NATS).
    #[command(flatten)]
    pub cluster: ClusterConfig,

    // Webhooks: events POSTed to the app.
    #[command(flatten)]
    pub hooks: HookConfig,

    // The server API for the app's backend.
    #[command(flatten)]
    pub api: ApiConfig,

    // The process: connection cap, shutdown, runtime, logging.
    /// Most open WebSocket connections; more are refused with 1013. Each
    /// takes one open file: when the process's open-file limit cannot hold
    /// this many plus --max-http-connections, the server serves fewer and
    /// says so at start (`amble_connection_cap` in /metrics).
    #[arg(long, display_order = 12, env = "AMBLE_MAX_CONNECTIONS", default_value_t = 19_000,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: u32,

    /// How long shutdown waits for connections to close, milliseconds.
    #[arg(
        long,
        display_order = 21,
        env = "AMBLE_SHUTDOWN_TIMEOUT_MS",
        default_value_t = 5_000
    )]
    pub shutdown_timeout_ms: u64,

    /// Runtime worker threads; 0 means one per CPU. A single worker costs
    /// 7-10% less CPU per update on a small machine (docs/benchmarks.md)
    /// but caps the server at one core.
    #[arg(long, display_order = 22, env = "AMBLE_WORKERS", default_value_t = 0,
          value_parser = clap::value_parser!(u16).range(0..=1024))]
    pub workers: u16,

    /// Log as JSON lines (for containers) instead of text. A switch: alone
    /// it is on; a value may be 1/0, yes/no, true/false, on/off.
    #[arg(long, display_order = 58, env = "AMBLE_LOG_JSON",
          value_parser = clap::builder::BoolishValueParser::new(), value_name = "BOOL",
          hide_possible_values = true,
          action = clap::ArgAction::Set, num_args = 0..=1, default_value_t = false,
          default_missing_value = "true")]
    pub log_json: bool,
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

    /// Member data the token sets (`data` claim), `KEY=VALUE`; repeat it
    /// for more entries. A Join's and SetData's entries cannot change them.
    #[arg(long = "data", value_name = "KEY=VALUE", value_parser = parse_data_entry)]
    pub data: Vec<(String, String)>,

    /// Show the user id to the room, as `Member.user` (`share_sub`
    /// claim), so apps can key their state on it. A switch: alone it is
    /// on; a value may be 1/0, yes/no, true/false, on/off.
    #[arg(long, value_parser = clap::builder::BoolishValueParser::new(), value_name = "BOOL",
          hide_possible_values = true,
          action = clap::ArgAction::Set, num_args = 0..=1, default_value_t = false,
          default_missing_value = "true")]
    pub share_sub: bool,

    /// How long the token is valid: a number with a unit, s, m, h or d
    /// (`90s`, `15m`, `1h`, `7d`).
    #[arg(long, default_value = "1h", value_parser = parse_ttl)]
    pub ttl: Duration,

    /// File holding the HS256 secret (the server's
    /// `--auth-hs256-secret-file`).
    #[arg(long, env = "AMBLE_AUTH_HS256_SECRET_FILE", value_name = "PATH")]
    pub secret_file: std::path::PathBuf,
}

/// Parses `amble token --data KEY=VALUE` (the key and value are checked
/// with the rest of the claim).
pub fn parse_data_entry(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) => Ok((key.to_owned(), value.to_owned())),
        None => Err(format!("{text:?}: expected KEY=VALUE (e.g. role=host)")),
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
        // The largest world any room has: each room checks its own
        // (`room::Rooms::world_of`).
        let spatial = !self.room.spatial_rooms.is_empty();
        let widest = |plain: u32, spatial_side: u32| {
            if spatial {
                plain.max(spatial_side)
            } else {
                plain
            }
        };
        Rules {
            world_width: widest(self.room.world_width, self.room.spatial_world_width),
            world_height: widest(self.room.world_height, self.room.spatial_world_height),
            max_speed: self.room.max_speed,
            max_name_chars: self.session.max_name_chars as usize,
            max_room_chars: Rules::default().max_room_chars,
            max_chat_chars: self.session.max_chat_chars as usize,
            max_data_entries: self.session.max_data_entries as usize,
            max_data_bytes: self.session.max_data_bytes as usize,
            max_data_value_chars: self.session.max_data_value_chars as usize,
        }
    }

    /// The limits advertised to clients in `Welcome`.
    pub fn limits(&self) -> pb::Limits {
        let (room, session) = (&self.room, &self.session);
        pb::Limits {
            move_interval_ms: session.move_interval_ms,
            move_burst: session.move_burst,
            tick_ms: room.tick_ms,
            motion_time_unit_ms: room.motion_time_unit_ms(),
            world_width: room.world_width,
            world_height: room.world_height,
            max_speed: room.max_speed,
            max_message_bytes: session.max_message_bytes,
            max_name_chars: session.max_name_chars,
            max_chat_chars: session.max_chat_chars,
            room_capacity: room.room_capacity,
            chat_interval_ms: session.chat_interval_ms,
            chat_burst: session.chat_burst,
            max_data_entries: session.max_data_entries,
            max_data_bytes: session.max_data_bytes,
            max_data_value_chars: session.max_data_value_chars,
            data_interval_ms: session.data_interval_ms,
            data_burst: session.data_burst,
            resume_grace_ms: room.resume_grace_ms,
            interest_radius: 0,
            interest_cell: 0,
            interest_margin: 0,
        }
    }
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
        assert_eq!(c.edge.listen.to_bind(), "127.0.0.1:3000");
        assert_eq!(
            (
                c.room.tick_ms,
                c.session.move_interval_ms,
                c.session.move_burst
            ),
            (100, 1_000, 2)
        );
        assert_eq!(c.room.motion_time_unit_ms(), 100);
        let immediate = Config::parse_from(["amble", "--tick-ms", "0"]);
        assert_eq!(immediate.room.motion_time_unit_ms(), 10);
    }

    #[test]
    fn no_subcommand_runs_the_server_with_every_flag() {
        let cli = Cli::try_parse_from(["amble", "--tick-ms", "50", "--log-json"]).expect("parse");
        assert!(cli.command.is_none());
        assert_eq!(cli.config.room.tick_ms, 50);
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
    fn every_flag_keeps_its_variable_and_its_place_in_help() {
        // The groups are flattened in another order than `--help` shows:
        // each flag's `display_order` keeps the order it had before them.
        let command = Cli::command();
        let mut args: Vec<&clap::Arg> = command
            .get_arguments()
            .filter(|arg| arg.get_env().is_some())
            .collect();
        args.sort_by_key(|arg| arg.get_display_order());
        let shown: Vec<&str> = args.iter().filter_map(|arg| arg.get_long()).collect();
        assert_eq!(
            shown,
            [
                "listen",
                "tick-ms",
                "move-interval-ms",
                "move-burst",
                "flood-factor",
                "chat-interval-ms",
                "chat-burst",
                "world-width",
                "world-height",
                "max-speed",
                "room-capacity",
                "max-connections",
                "max-message-bytes",
                "max-name-chars",
                "max-chat-chars",
                "send-queue-bytes",
                "ping-interval-ms",
                "idle-timeout-ms",
                "send-timeout-ms",
                "socket-send-buffer",
                "shutdown-timeout-ms",
                "workers",
                "http-header-timeout-ms",
                "http-max-header-bytes",
                "http-idle-timeout-ms",
                "max-http-connections",
                "max-connections-per-ip",
                "ip-join-interval-ms",
                "ip-join-burst",
                "trusted-proxies",
                "forwarded-header",
                "exempt-loopback",
                "allowed-origins",
                "metrics-token-file",
                "pings-per-sec",
                "ping-burst",
                "auth-hs256-secret-file",
                "auth-public-key-file",
                "nats",
                "nats-creds-file",
                "nats-token-file",
                "nats-user",
                "nats-password-file",
                "nats-tls-ca-file",
                "nats-tls-cert-file",
                "nats-tls-key-file",
                "nats-require-tls",
                "node-name",
                "node-slot",
                "cluster-slots",
                "cluster-prefix",
                "cluster-heartbeat-ms",
                "cluster-node-timeout-ms",
                "cluster-lead-ms",
                "cluster-snapshot-timeout-ms",
                "cluster-queue",
                "cluster-room-linger-ms",
                "log-json",
                "tick-workers",
                "auth-audience",
                "auth-issuer",
                "auth-leeway-secs",
                "auth-jwks-file",
                "allowed-hosts",
                "max-data-entries",
                "max-data-bytes",
                "max-data-value-chars",
                "data-interval-ms",
                "data-burst",
                "auth-jwks-url",
                "auth-jwks-refresh-secs",
                "auth-expiry-notice-secs",
                "webhook-url",
                "webhook-secret-file",
                "webhook-queue",
                "webhook-batch",
                "webhook-timeout-ms",
                "api-key-file",
                "api-calls-per-sec",
                "resume-grace-ms",
                "spatial-rooms",
                "spatial-world-width",
                "spatial-world-height",
                "spatial-capacity",
                "interest-radius",
                "cluster-drain-ms",
            ]
        );
        let mut orders: Vec<usize> = args.iter().map(|arg| arg.get_display_order()).collect();
        orders.dedup();
        assert_eq!(orders.len(), shown.len(), "two flags share a display_order");
        for (arg, long) in args.iter().zip(&shown) {
            let var = format!("AMBLE_{}", long.to_ascii_uppercase().replace('-', "_"));
            assert_eq!(arg.get_env(), Some(std::ffi::OsStr::new(&var)), "--{long}");
        }
        // Every flag has its variable (--help and --version, which have
        // none, are added when the command is built).
        assert_eq!(command.get_arguments().count(), shown.len());
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

    /// Issue #19: one rule for every on/off flag: alone it is on, and a
    /// value may be 1/0, yes/no, true/false or on/off, given after `=` or
    /// as the next word.
    #[test]
    fn every_switch_follows_one_rule() {
        let switches = |args: &[&str]| {
            let c = Config::from_args(std::iter::once("amble").chain(args.iter().copied()))
                .unwrap_or_else(|err| panic!("{args:?}: {err}"));
            (
                c.addresses.exempt_loopback,
                c.log_json,
                c.cluster.nats_require_tls,
            )
        };
        assert_eq!(switches(&[]), (true, false, false));
        assert_eq!(
            switches(&["--exempt-loopback", "--log-json", "--nats-require-tls"]),
            (true, true, true)
        );
        for off in ["0", "no", "false", "off"] {
            let eq = |flag: &str| format!("--{flag}={off}");
            assert_eq!(
                switches(&[
                    &eq("exempt-loopback"),
                    &eq("log-json"),
                    &eq("nats-require-tls")
                ]),
                (false, false, false),
                "{off}"
            );
            assert_eq!(
                switches(&["--exempt-loopback", off]),
                (false, false, false),
                "{off}"
            );
        }
        for on in ["1", "yes", "true", "on"] {
            assert_eq!(switches(&["--log-json", on]), (true, true, false), "{on}");
        }
        let help = Config::command().render_long_help().to_string();
        assert!(!help.contains("[possible values: true, false]"), "{help}");
        for flag in ["exempt-loopback", "log-json", "nats-require-tls"] {
            assert!(
                help.contains(&format!("--{flag} [<BOOL>]")),
                "{flag}: {help}"
            );
        }
    }

    #[test]
    fn ping_budget_defaults_and_off() {
        let c = Config::default();
        assert_eq!((c.session.pings_per_sec, c.session.ping_burst), (5, 10));
        assert_eq!(c.session.ping_interval(), Some(Duration::from_millis(200)));
        let off = Config::parse_from(["amble", "--pings-per-sec", "0"]);
        assert_eq!(off.session.ping_interval(), None);
        assert!(Config::try_parse_from(["amble", "--ping-burst", "0"]).is_err());
    }

    #[test]
    fn allowed_origins_default_to_local_development() {
        let shown: Vec<String> = Config::default()
            .edge
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
        assert_eq!(listed.edge.allowed_origins.len(), 2);
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
