//! Command-line options (clap derive, the doc comments are the `--help`) and
//! their resolution, presets included, into a [`Plan`].
//!
//! Options that a preset may set are `Option`s here; [`Opts::plan`] applies
//! the preset first and the tool's defaults last, so the value a user typed
//! always wins.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use clap::{Parser, ValueEnum};
use serde::{Deserialize, Serialize};

use crate::limits::{self, OpenFiles};
use crate::plan::{Movement, Plan, RoomNames, Tolerance, parse_targets};

/// amble's bot load tester: spawns bots that join rooms and move the way
/// people do, and measures bandwidth, delivery rate, latency and what the
/// server spent.
///
/// Start the server first (`cargo run --release` in the repo), then for
/// example `cargo loadtest --bots 1000`. The status goes to stderr (a line
/// every --status-every); the report goes to stdout at the end (and to
/// --json PATH). Use a freshly started server for figures: the report warns
/// when the server was already busy or had served connections before.
///
/// A cluster: list every node in --url (`--url
/// ws://127.0.0.1:3000/ws,ws://127.0.0.1:3001/ws`) and, to count
/// nats-server too, `--nats-monitor http://127.0.0.1:8222`.
///
/// Exit status: 0 done; 1 a threshold (--min-delivery, --max-p99-ms) was
/// missed; 2 the run failed or could not be made (server unreachable, bad
/// options, bots disconnected or unable to connect, fewer bots than asked
/// connected during the measured window, the server's ping budget stopped
/// the rpc scenario); 130 or 143 interrupted by Ctrl-C or SIGTERM (the
/// report of what was measured so far is printed first).
#[derive(Parser, Debug, Clone)]
#[command(name = "loadtest", version, about, long_about)]
pub struct Opts {
    /// WebSocket URL of the amble server, or of each node of a cluster
    /// separated by commas (`ws://127.0.0.1:3000/ws,ws://127.0.0.1:3001/ws`):
    /// bot i connects to node i mod n, so every room of at least n bots
    /// spans every node, and the report gives each node's /metrics and
    /// their sum. Only loopback hosts (127.0.0.0/8, localhost, ::1) are
    /// accepted unless --allow-remote is given.
    #[arg(long, default_value = "ws://127.0.0.1:3000/ws")]
    pub url: String,

    /// The NATS server's monitoring endpoint (`nats-server -m 8222`), e.g.
    /// `http://127.0.0.1:8222`: its /varz is read every second of the
    /// measured window, and the report adds its CPU, memory and message
    /// counts, and the CPU per delivered update of the whole cluster (the
    /// nodes plus nats-server). Loopback only unless --allow-remote.
    #[arg(long, value_name = "URL")]
    pub nats_monitor: Option<String>,

    /// Accept a --url (or --nats-monitor) host that is not a loopback address.
    #[arg(long)]
    pub allow_remote: bool,

    /// What to measure: `load` runs bots in rooms; `rpc` measures
    /// request/reply throughput with Ping/Pong (start the server with
    /// --pings-per-sec 0: its ping budget stops a flood of pings); `sweep`
    /// measures latency against room size.
    #[arg(long, value_enum, default_value_t = Scenario::Load)]
    pub scenario: Scenario,

    /// A named workload. `xmpp-1500`: 1,500 bots in 50 rooms of 30, a move
    /// every 8 s; `xmpp-1000`: 1,000 bots in 50 rooms, a move every 8 s (both
    /// use --movement wander, as the XMPP comparison bots sent a plain
    /// position each time); `rush`: --bots bots (default 15,000) in rooms of
    /// 30, a move every second. Options given explicitly override the preset.
    #[arg(long, value_enum)]
    pub preset: Option<Preset>,

    /// Number of bots [default: 100; presets: see --preset].
    #[arg(long)]
    pub bots: Option<u32>,

    /// Bots per room; the last room may hold fewer [default: 30].
    #[arg(long, conflicts_with = "rooms")]
    pub room_size: Option<u32>,

    /// Number of rooms, the bots spread evenly over them (instead of
    /// --room-size).
    #[arg(long)]
    pub rooms: Option<u32>,

    /// Put every bot in the room NAME (1-32 of `A-Za-z0-9_.-`), e.g.
    /// `lobby` to walk where people join from the browser demo. The room
    /// must hold them all: more bots than the server's room capacity is
    /// refused before any bot connects.
    #[arg(long, value_name = "NAME", conflicts_with_all = ["rooms", "room_size", "room_prefix"])]
    pub room: Option<String>,

    /// Name the rooms PREFIX-1, PREFIX-2, ... PREFIX-N (with --rooms N or
    /// --room-size) [default: `lt-<run tag>-<n>`, rooms unique to the run].
    #[arg(long, value_name = "PREFIX")]
    pub room_prefix: Option<String>,

    /// Time between a bot's moves, e.g. `1s`, `250ms`, `8s` [default: 1s;
    /// xmpp presets: 8s]. Never below the server's advertised move interval;
    /// each bot starts at a random phase and adds a jitter of up to 5%.
    #[arg(long, value_parser = parse_duration)]
    pub move_interval: Option<Duration>,

    /// How bots move. `walk`: click-to-move, one message per walk (a target
    /// and a speed); `wander`: free movement, a plain position each interval
    /// [default: walk; xmpp presets: wander].
    #[arg(long, value_enum)]
    pub movement: Option<Movement>,

    /// Time between a bot's chat messages (off unless given); never below
    /// the server's advertised chat interval.
    #[arg(long, value_parser = parse_duration)]
    pub chat_interval: Option<Duration>,

    /// Length of the measured window [default: 10s; xmpp presets: 60s;
    /// rush: 20s].
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,

    /// New connections per second during ramp-up [default: 1000].
    #[arg(long)]
    pub ramp: Option<u32>,

    /// Time between the end of ramp-up and the start of the measured window,
    /// so every bot is moving when counting starts [default: one move
    /// interval, at least 1s and at most 10s, so that an idle run with
    /// `--move-interval 3600s` starts measuring after 10s].
    #[arg(long, value_parser = parse_duration)]
    pub warmup: Option<Duration>,

    /// Also write the report as JSON to PATH (`-`: stdout, the readable
    /// report then goes to stderr).
    #[arg(long, value_name = "PATH")]
    pub json: Option<PathBuf>,

    /// Source addresses the bots connect from, round-robin, so that tens of
    /// thousands of bots are not limited by one address's ephemeral ports: a
    /// list and/or ranges of 127.x.y.z, e.g. `127.0.0.1-127.0.0.8` or
    /// `127.0.0.2,127.0.1.1-127.0.1.4` [default: chosen by the kernel].
    #[arg(long, value_parser = SourceAddrs::from_str)]
    pub source_addrs: Option<SourceAddrs>,

    /// load: run the bots in N processes, each holding whole rooms. Each bot
    /// holds one open file (its socket); the load tester raises its soft
    /// limit on open files to the hard limit at start [default: as few
    /// processes as that limit allows].
    #[arg(long, value_name = "N")]
    pub processes: Option<u32>,

    /// Do not fail the run when the server disconnects bots during it (their
    /// figures stop there; the report still counts them).
    #[arg(long)]
    pub tolerate_disconnects: bool,

    /// Do not fail the run when bots cannot connect or join (for example
    /// the server's connection limit or a full room).
    #[arg(long)]
    pub tolerate_connect_failures: bool,

    /// Drops and resumes: this share of the bots (0 to 1) closes its socket
    /// abruptly each second, on average, and joins again at once with its
    /// resume token (`Welcome.resume_token`), as a browser whose network
    /// blinked. Delivery is still counted exactly: a dropped session
    /// expects from each sender what came before its last delivery, the
    /// resumed one what follows its snapshot.
    #[arg(long, value_name = "FRACTION", default_value_t = 0.0)]
    pub drops_per_sec: f64,

    /// Fail (exit status 1) if the delivery rate is below this, e.g. 0.999.
    #[arg(long, value_name = "RATE")]
    pub min_delivery: Option<f64>,

    /// Fail (exit status 1) if the p99 latency in milliseconds is above this.
    #[arg(long, value_name = "MS")]
    pub max_p99_ms: Option<f64>,

    /// rpc: number of clients making round trips in parallel.
    #[arg(long, default_value_t = 20)]
    pub clients: u32,

    /// rpc: sequential Ping/Pong round trips per client.
    #[arg(long, default_value_t = 20_000)]
    pub round_trips: u32,

    /// sweep: room sizes to measure, one room at a time. Size 0 runs a lone
    /// bot, whose only measure is its own move's echo.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "0,10,20,30,40,50,60,70,80,90,100,110,120,130,140,150,160,170,180,190,200"
    )]
    pub sweep_sizes: Vec<u32>,

    /// sweep: measured time per room size (after a warm-up of one move
    /// interval).
    #[arg(long, value_parser = parse_duration, default_value = "3s")]
    pub sweep_duration: Duration,

    /// Print no status lines while running (warnings and the report still
    /// print).
    #[arg(long, short)]
    pub quiet: bool,

    /// Time between status lines, e.g. `1s`, `1m` for runs of hours.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "1s")]
    pub status_every: Duration,

    /// Child mode (set by --processes): the resolved plan as JSON, this
    /// child's index; the child prints status lines and its tally as JSON
    /// lines on stdout.
    #[arg(long, hide = true, value_name = "PLAN_JSON")]
    pub child: Option<String>,
}

/// What to measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
pub enum Scenario {
    /// Bots in rooms, moving.
    Load,
    /// Request/reply round trips (Ping/Pong).
    Rpc,
    /// Latency against room size.
    Sweep,
}

/// A named workload; see `--preset`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Preset {
    /// 1,500 bots, 50 rooms of 30, a move every 8 s, wander.
    #[value(name = "xmpp-1500")]
    Xmpp1500,
    /// 1,000 bots in 50 rooms, a move every 8 s, wander.
    #[value(name = "xmpp-1000")]
    Xmpp1000,
    /// --bots bots (default 15,000), rooms of 30, a move every second.
    Rush,
    /// --bots bots (default 2,000) in one spatial room, `plaza` (the
    /// server's default `--spatial-rooms plaza*`), spread as crowds are:
    /// most around a few dense spots, the rest anywhere, walking a move a
    /// second. The report adds what the area of interest did (`interest`).
    Plaza,
}

/// Source addresses to bind before connecting, all in 127.0.0.0/8.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceAddrs(pub Vec<Ipv4Addr>);

/// More source addresses than this is a typo, not a plan.
const MAX_SOURCE_ADDRS: u32 = 65_536;

/// The default warm-up is one move interval, within these bounds.
const MIN_WARMUP: Duration = Duration::from_secs(1);
const MAX_WARMUP: Duration = Duration::from_secs(10);

impl FromStr for SourceAddrs {
    type Err = anyhow::Error;

    /// `127.0.0.1`, `127.0.0.1-127.0.0.8`, or a comma-separated mix.
    fn from_str(s: &str) -> anyhow::Result<Self> {
        let mut addrs = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (first, last) = match part.split_once('-') {
                Some((a, b)) => (parse_loopback(a)?, parse_loopback(b)?),
                None => {
                    let a = parse_loopback(part)?;
                    (a, a)
                }
            };
            let (first, last) = (u32::from(first), u32::from(last));
            ensure!(first <= last, "source address range {part} is reversed");
            ensure!(
                addrs.len() as u64 + u64::from(last - first) < u64::from(MAX_SOURCE_ADDRS),
                "more than {MAX_SOURCE_ADDRS} source addresses"
            );
            addrs.extend((first..=last).map(Ipv4Addr::from));
        }
        ensure!(!addrs.is_empty(), "no source address given");
        Ok(Self(addrs))
    }
}

fn parse_loopback(s: &str) -> anyhow::Result<Ipv4Addr> {
    let addr: Ipv4Addr = s
        .trim()
        .parse()
        .with_context(|| format!("{s:?} is not an IPv4 address"))?;
    ensure!(
        addr.is_loopback(),
        "source address {addr} is not a loopback address (127.x.y.z)"
    );
    Ok(addr)
}

/// Parses `1s`, `250ms`, `1.5s`, `2m`, `1h` or a plain number of seconds.
pub fn parse_duration(s: &str) -> anyhow::Result<Duration> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let number: f64 = number
        .parse()
        .with_context(|| format!("{s:?} is not a duration (e.g. 1s, 250ms, 2m)"))?;
    let seconds = match unit.trim() {
        "" | "s" => number,
        "ms" => number / 1_000.0,
        "m" | "min" => number * 60.0,
        "h" => number * 3_600.0,
        other => bail!("unknown duration unit {other:?} (use ms, s, m or h)"),
    };
    ensure!(
        seconds.is_finite() && (0.0..=86_400.0).contains(&seconds),
        "duration {s:?} out of range"
    );
    Ok(Duration::from_secs_f64(seconds))
}

impl Opts {
    /// Resolves presets and defaults into a plan for the load scenario (the
    /// sweep derives one per room size from it), sized against this
    /// process's open-file limits as they are now.
    pub fn plan(&self) -> anyhow::Result<Plan> {
        self.plan_with(limits::current())
    }

    /// [`Opts::plan`] for a process that may open files as `files` says
    /// (`None`: unknown, not checked).
    pub fn plan_with(&self, files: Option<OpenFiles>) -> anyhow::Result<Plan> {
        let mut targets = parse_targets(&self.url, self.allow_remote)?;
        ensure!(
            targets.len() == 1 || self.scenario != Scenario::Rpc,
            "--scenario rpc measures one server: give --url a single URL"
        );
        let target = targets.remove(0);
        if let Some(url) = &self.nats_monitor {
            crate::varz::Monitor::parse(url, self.allow_remote)?;
        }
        let preset = self.preset.map(PresetValues::of).unwrap_or_default();

        let bots = self.bots.or(preset.bots).unwrap_or(100);
        ensure!(bots >= 1, "--bots must be at least 1");
        ensure!(
            bots <= 200_000,
            "--bots {bots} is more than this tool allows (200000)"
        );
        let one_room = self.room.clone().or(preset
            .room
            .filter(|_| self.rooms.is_none() && self.room_size.is_none())
            .map(str::to_owned));
        let (rooms, room_size) = match (self.rooms, self.room_size) {
            _ if one_room.is_some() => (1, bots),
            (Some(rooms), _) => {
                ensure!(rooms >= 1, "--rooms must be at least 1");
                let rooms = rooms.min(bots);
                (rooms, bots.div_ceil(rooms))
            }
            (None, Some(size)) => {
                ensure!(size >= 1, "--room-size must be at least 1");
                (bots.div_ceil(size), size)
            }
            (None, None) => match (preset.rooms, preset.room_size) {
                (Some(rooms), _) => {
                    let rooms = rooms.min(bots);
                    (rooms, bots.div_ceil(rooms))
                }
                (None, size) => {
                    let size = size.unwrap_or(30);
                    (bots.div_ceil(size), size)
                }
            },
        };

        let move_interval = self
            .move_interval
            .or(preset.move_interval)
            .unwrap_or(Duration::from_secs(1));
        ensure!(
            move_interval >= Duration::from_millis(10),
            "--move-interval must be at least 10ms"
        );
        let movement = self.movement.or(preset.movement).unwrap_or(Movement::Walk);
        if let Some(chat) = self.chat_interval {
            ensure!(
                chat >= Duration::from_millis(100),
                "--chat-interval must be at least 100ms"
            );
        }
        let duration = self
            .duration
            .or(preset.duration)
            .unwrap_or(Duration::from_secs(10));
        ensure!(
            duration >= Duration::from_millis(100),
            "--duration must be at least 100ms"
        );
        let ramp = self.ramp.unwrap_or(1_000);
        ensure!(ramp >= 1, "--ramp must be at least 1 connection per second");
        let warmup = self
            .warmup
            .unwrap_or_else(|| move_interval.clamp(MIN_WARMUP, MAX_WARMUP));

        let room_names = match (&one_room, &self.room_prefix) {
            (Some(name), _) => {
                check_room_name(name, "--room")?;
                RoomNames::One(name.clone())
            }
            (None, Some(prefix)) => {
                check_room_name(&format!("{prefix}-{rooms}"), "--room-prefix")?;
                RoomNames::Prefix(prefix.clone())
            }
            (None, None) => RoomNames::Run,
        };

        let per_process = files.map(|f| f.bots()).filter(|&n| n > 0);
        let processes = match self.processes {
            Some(n) => {
                ensure!(n >= 1, "--processes must be at least 1");
                n.min(rooms)
            }
            None => match per_process {
                Some(per) => u32::try_from(u64::from(bots).div_ceil(per))
                    .unwrap_or(u32::MAX)
                    .clamp(1, rooms),
                None => 1,
            },
        };

        ensure!(
            (0.0..=1.0).contains(&self.drops_per_sec),
            "--drops-per-sec is a share of the bots, from 0 to 1"
        );
        let plan = Plan {
            target,
            more_targets: targets,
            bots,
            rooms,
            room_size,
            move_interval_ms: millis(move_interval),
            movement,
            chat_interval_ms: self.chat_interval.map(millis),
            duration_ms: millis(duration),
            ramp_per_s: ramp,
            warmup_ms: millis(warmup),
            drain_ms: crate::plan::DEFAULT_DRAIN_MS,
            source_addrs: self.source_addrs.clone().map(|a| a.0).unwrap_or_default(),
            processes,
            run_tag: crate::plan::run_tag(),
            start_unix_ms: 0,
            room_range: 0..rooms,
            room_names,
            crowds: preset.crowds,
            tolerate: Tolerance {
                disconnects: self.tolerate_disconnects,
                connect_failures: self.tolerate_connect_failures,
            },
            drops_per_sec: self.drops_per_sec,
        };
        if let Some(files) = files {
            plan.check_open_files(files)?;
        }
        Ok(plan)
    }
}

/// A room name the server accepts: 1-32 of `[A-Za-z0-9_.-]`.
fn check_room_name(name: &str, flag: &str) -> anyhow::Result<()> {
    ensure!(
        (1..=32).contains(&name.len())
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b)),
        "{flag}: room name {name:?} must be 1-32 of A-Z a-z 0-9 _ . -"
    );
    Ok(())
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// What a preset sets; `None` leaves the option to the user or the default.
#[derive(Default)]
struct PresetValues {
    bots: Option<u32>,
    rooms: Option<u32>,
    room_size: Option<u32>,
    move_interval: Option<Duration>,
    movement: Option<Movement>,
    duration: Option<Duration>,
    /// One room of this name (as --room).
    room: Option<&'static str>,
    /// Bots start in crowds (a spatial room).
    crowds: bool,
}

impl PresetValues {
    fn of(preset: Preset) -> Self {
        match preset {
            Preset::Xmpp1500 => Self {
                bots: Some(1_500),
                rooms: Some(50),
                move_interval: Some(Duration::from_secs(8)),
                movement: Some(Movement::Wander),
                duration: Some(Duration::from_secs(60)),
                ..Self::default()
            },
            Preset::Xmpp1000 => Self {
                bots: Some(1_000),
                rooms: Some(50),
                move_interval: Some(Duration::from_secs(8)),
                movement: Some(Movement::Wander),
                duration: Some(Duration::from_secs(60)),
                ..Self::default()
            },
            Preset::Rush => Self {
                bots: Some(15_000),
                room_size: Some(30),
                move_interval: Some(Duration::from_secs(1)),
                duration: Some(Duration::from_secs(20)),
                ..Self::default()
            },
            Preset::Plaza => Self {
                bots: Some(2_000),
                move_interval: Some(Duration::from_secs(1)),
                movement: Some(Movement::Walk),
                duration: Some(Duration::from_secs(20)),
                room: Some("plaza"),
                crowds: true,
                ..Self::default()
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(args: &[&str]) -> Opts {
        Opts::try_parse_from(std::iter::once("loadtest").chain(args.iter().copied()))
            .expect("options parse")
    }

    /// Limits of a process that may open `soft` files (hard limit `hard`).
    fn files(soft: u64, hard: u64) -> Option<OpenFiles> {
        Some(OpenFiles { soft, hard })
    }

    /// Plans as on a machine with plenty of open files.
    trait PlanHere {
        fn plan_here(&self) -> anyhow::Result<Plan>;
    }

    impl PlanHere for Opts {
        fn plan_here(&self) -> anyhow::Result<Plan> {
            self.plan_with(files(1 << 20, 1 << 20))
        }
    }

    #[test]
    fn the_plaza_preset_is_one_spatial_room_in_crowds() {
        let plan = opts(&["--preset", "plaza"]).plan_here().unwrap();
        assert_eq!((plan.bots, plan.rooms, plan.room_size), (2_000, 1, 2_000));
        assert_eq!(plan.room_name(0), "plaza");
        assert!(plan.crowds);
        assert_eq!(plan.movement, Movement::Walk);
        // --rooms still splits them, into rooms of the run's own names.
        let plan = opts(&["--preset", "plaza", "--rooms", "4"])
            .plan_here()
            .unwrap();
        assert_eq!(plan.rooms, 4);
        let plan = opts(&["--preset", "plaza", "--room", "plaza-b"])
            .plan_here()
            .unwrap();
        assert_eq!(plan.room_name(0), "plaza-b");
    }

    #[test]
    fn defaults() {
        let plan = opts(&[]).plan_here().unwrap();
        assert_eq!(plan.bots, 100);
        assert_eq!(plan.room_size, 30);
        assert_eq!(plan.rooms, 4);
        assert_eq!(plan.move_interval_ms, 1_000);
        assert_eq!(plan.movement, Movement::Walk);
        assert_eq!(plan.chat_interval_ms, None);
        assert_eq!(plan.processes, 1);
        assert_eq!(plan.target.port, 3000);
        assert_eq!(plan.target.path, "/ws");
    }

    #[test]
    fn warmup_defaults_to_one_move_interval_within_1s_to_10s() {
        let warmup = |args: &[&str]| opts(args).plan_here().unwrap().warmup_ms;
        assert_eq!(warmup(&[]), 1_000);
        assert_eq!(warmup(&["--move-interval", "250ms"]), 1_000);
        assert_eq!(warmup(&["--preset", "xmpp-1500"]), 8_000);
        assert_eq!(warmup(&["--move-interval", "3600s"]), 10_000);
        assert_eq!(
            warmup(&["--move-interval", "3600s", "--warmup", "1h"]),
            3_600_000
        );
    }

    #[test]
    fn presets() {
        let p = opts(&["--preset", "xmpp-1500"]).plan_here().unwrap();
        assert_eq!((p.bots, p.rooms, p.room_size), (1_500, 50, 30));
        assert_eq!(p.move_interval_ms, 8_000);
        assert_eq!(p.movement, Movement::Wander);

        let p = opts(&["--preset", "xmpp-1000"]).plan_here().unwrap();
        assert_eq!((p.bots, p.rooms, p.room_size), (1_000, 50, 20));
        assert_eq!(p.movement, Movement::Wander);

        let p = opts(&["--preset", "rush", "--bots", "5000"])
            .plan_here()
            .unwrap();
        assert_eq!((p.bots, p.room_size, p.rooms), (5_000, 30, 167));
        assert_eq!(p.move_interval_ms, 1_000);

        let p = opts(&["--preset", "rush"]).plan_here().unwrap();
        assert_eq!(p.bots, 15_000);
        assert_eq!(p.processes, 1);

        // Explicit options win over the preset.
        let p = opts(&[
            "--preset",
            "xmpp-1500",
            "--movement",
            "walk",
            "--duration",
            "30s",
        ])
        .plan_here()
        .unwrap();
        assert_eq!(p.movement, Movement::Walk);
        assert_eq!(p.duration_ms, 30_000);
    }

    #[test]
    fn rooms_or_room_size() {
        let p = opts(&["--bots", "95", "--rooms", "10"])
            .plan_here()
            .unwrap();
        assert_eq!((p.rooms, p.room_size), (10, 10));
        let p = opts(&["--bots", "95", "--room-size", "10"])
            .plan_here()
            .unwrap();
        assert_eq!((p.rooms, p.room_size), (10, 10));
        assert!(Opts::try_parse_from(["loadtest", "--rooms", "2", "--room-size", "3"]).is_err());
    }

    #[test]
    fn processes_split_by_open_file_limit() {
        let p = opts(&["--bots", "40000"]).plan_with(files(20_000, 20_000));
        assert_eq!(p.unwrap().processes, 3);
        let p = opts(&["--bots", "40000"]).plan_here().unwrap();
        assert_eq!(p.processes, 1, "one process when the limit allows");
        let p = opts(&["--bots", "10", "--processes", "4", "--room-size", "5"])
            .plan_here()
            .unwrap();
        assert_eq!(p.processes, 2, "never more processes than rooms");
    }

    #[test]
    fn the_first_readme_test_fits_a_raised_limit() {
        // Soft limit 1024 raised to a hard limit of 4096: one process.
        let p = opts(&["--bots", "1000"]).plan_with(files(4_096, 4_096));
        assert_eq!(p.unwrap().processes, 1);
        // A hard limit of 1024: the rooms are spread over two processes.
        let p = opts(&["--bots", "1000"]).plan_with(files(1_024, 1_024));
        assert_eq!(p.unwrap().processes, 2);
    }

    #[test]
    fn too_few_open_files_says_what_to_do() {
        let err = opts(&["--bots", "1000", "--processes", "1"])
            .plan_with(files(1_024, 1_024))
            .unwrap_err()
            .to_string();
        assert!(err.contains("need about 1064 open files"), "{err}");
        assert!(err.contains("`ulimit -n 1064`"), "{err}");
        assert!(err.contains("--processes 2"), "{err}");
        // One room cannot be split: only the limit or smaller rooms help.
        let err = opts(&["--bots", "1000", "--room", "lobby"])
            .plan_with(files(1_024, 1_024))
            .unwrap_err()
            .to_string();
        assert!(err.contains("`ulimit -n 1064`"), "{err}");
        assert!(
            err.contains("smaller rooms") && !err.contains("--processes"),
            "{err}"
        );
    }

    #[test]
    fn named_rooms() {
        let p = opts(&["--bots", "45", "--room", "lobby"])
            .plan_here()
            .unwrap();
        assert_eq!((p.rooms, p.room_size), (1, 45));
        assert_eq!(p.room_name(0), "lobby");
        let p = opts(&["--bots", "45", "--rooms", "3", "--room-prefix", "demo"])
            .plan_here()
            .unwrap();
        assert_eq!((p.rooms, p.room_size), (3, 15));
        let names: Vec<_> = (0..3).map(|r| p.room_name(r)).collect();
        assert_eq!(names, ["demo-1", "demo-2", "demo-3"]);
        // A preset's rooms give way to --room.
        let p = opts(&["--preset", "xmpp-1000", "--room", "hall"])
            .plan_here()
            .unwrap();
        assert_eq!((p.bots, p.rooms, p.room_size), (1_000, 1, 1_000));
        // Without a name, rooms are unique to the run.
        let p = opts(&["--bots", "5"]).plan_here().unwrap();
        assert!(p.room_name(0).starts_with("lt-") && p.room_name(0).ends_with("-0"));

        assert!(opts(&["--room", "no spaces"]).plan_here().is_err());
        assert!(opts(&["--room", &"x".repeat(33)]).plan_here().is_err());
        assert!(
            opts(&["--rooms", "100", "--room-prefix", &"x".repeat(29)])
                .plan_here()
                .is_err()
        );
        assert!(Opts::try_parse_from(["loadtest", "--room", "a", "--rooms", "2"]).is_err());
        assert!(Opts::try_parse_from(["loadtest", "--room", "a", "--room-size", "2"]).is_err());
    }

    #[test]
    fn source_addr_ranges() {
        let a: SourceAddrs = "127.0.0.1-127.0.0.3".parse().unwrap();
        assert_eq!(
            a.0,
            vec![
                Ipv4Addr::new(127, 0, 0, 1),
                Ipv4Addr::new(127, 0, 0, 2),
                Ipv4Addr::new(127, 0, 0, 3)
            ]
        );
        let a: SourceAddrs = "127.0.0.9, 127.0.0.255-127.0.1.1".parse().unwrap();
        assert_eq!(a.0.len(), 4);
        assert_eq!(a.0[3], Ipv4Addr::new(127, 0, 1, 1));
        assert!("10.0.0.1".parse::<SourceAddrs>().is_err());
        assert!("127.0.0.5-127.0.0.1".parse::<SourceAddrs>().is_err());
        assert!("127.0.0.1-127.255.255.255".parse::<SourceAddrs>().is_err());
        assert!("".parse::<SourceAddrs>().is_err());
        let p = opts(&["--source-addrs", "127.0.0.1-127.0.0.8"])
            .plan_here()
            .unwrap();
        assert_eq!(p.source_addrs.len(), 8);
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("1s").unwrap(), Duration::from_secs(1));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("1.5").unwrap(), Duration::from_millis(1_500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert!(parse_duration("1 fortnight").is_err());
        assert!(parse_duration("-1s").is_err());
    }

    #[test]
    fn refuses_remote_targets() {
        assert!(
            opts(&["--url", "ws://example.com:3000/ws"])
                .plan_here()
                .is_err()
        );
        assert!(
            opts(&["--url", "ws://10.0.0.1:3000/ws"])
                .plan_here()
                .is_err()
        );
        assert!(
            opts(&["--url", "ws://localhost:3000/ws"])
                .plan_here()
                .is_ok()
        );
        assert!(opts(&["--url", "ws://[::1]:3000/ws"]).plan_here().is_ok());
        assert!(opts(&["--url", "ws://127.1.2.3:9/ws"]).plan_here().is_ok());
        assert!(
            opts(&["--url", "wss://127.0.0.1/ws"]).plan_here().is_err(),
            "no TLS support"
        );
    }

    #[test]
    fn several_urls_make_a_cluster_plan() {
        let plan = opts(&["--url", "ws://127.0.0.1:3000/ws,ws://127.0.0.1:3001/ws"])
            .plan_here()
            .unwrap();
        assert_eq!(plan.nodes(), 2);
        assert_eq!(plan.target.port, 3000);
        assert_eq!(plan.more_targets[0].port, 3001);
        let err = opts(&["--url", "ws://127.0.0.1:3000/ws, "])
            .plan_here()
            .unwrap_err()
            .to_string();
        assert!(err.contains("separated by commas"), "{err}");
        let err = opts(&[
            "--scenario",
            "rpc",
            "--url",
            "ws://127.0.0.1:3000/ws,ws://127.0.0.1:3001/ws",
        ])
        .plan_here()
        .unwrap_err()
        .to_string();
        assert!(err.contains("a single URL"), "{err}");
        assert!(
            opts(&["--nats-monitor", "http://127.0.0.1:8222"])
                .plan_here()
                .is_ok()
        );
        let err = opts(&["--nats-monitor", "127.0.0.1:8222"])
            .plan_here()
            .unwrap_err()
            .to_string();
        assert!(err.contains("http://HOST:PORT"), "{err}");
    }

    #[test]
    fn help_documents_every_option() {
        use clap::CommandFactory as _;
        let cmd = Opts::command();
        for arg in cmd.get_arguments() {
            if arg.is_hide_set() || ["help", "version"].contains(&arg.get_id().as_str()) {
                continue;
            }
            assert!(arg.get_help().is_some(), "--{} has no help", arg.get_id());
        }
        cmd.debug_assert();
    }
}
