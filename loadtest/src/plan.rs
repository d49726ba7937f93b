//! The resolved plan of a run (what every process needs to take part), the
//! server it targets, and the schedule: when each bot connects, when the
//! measured window opens and closes.
//!
//! A plan is plain data (serde), so the parent of `--processes` hands it to
//! its children as JSON together with a wall-clock start; every process
//! derives the same schedule from it.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::ops::Range;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, bail, ensure};
use clap::ValueEnum;
use serde::{Deserialize, Serialize};

/// Time after the window closes during which bots still receive (but no
/// longer send), so deliveries in flight are counted: 1 s plus two ticks of
/// up to 250 ms.
pub const DEFAULT_DRAIN_MS: u64 = 1_500;

/// Everything a process needs to run its share of the bots.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// The first (or only) node of `--url`.
    pub target: Target,
    /// The other nodes of `--url`, in order: bot `i` connects to node
    /// `i mod n` (see [`Plan::node_of`]).
    #[serde(default)]
    pub more_targets: Vec<Target>,
    /// All bots of the run, over all processes.
    pub bots: u32,
    /// All rooms of the run.
    pub rooms: u32,
    /// Bots per room (the last room may hold fewer).
    pub room_size: u32,
    /// Requested; a bot uses the larger of this and the server's limit.
    pub move_interval_ms: u64,
    pub movement: Movement,
    pub chat_interval_ms: Option<u64>,
    pub duration_ms: u64,
    pub ramp_per_s: u32,
    pub warmup_ms: u64,
    pub drain_ms: u64,
    /// Empty: the kernel picks the source address.
    pub source_addrs: Vec<Ipv4Addr>,
    pub processes: u32,
    /// Part of every room name, so two runs never share a room.
    pub run_tag: String,
    /// Wall-clock time of the schedule's origin, ms since the Unix epoch
    /// (0: now, for a process that runs alone).
    pub start_unix_ms: u64,
    /// The rooms this process runs (all of them unless a child).
    pub room_range: Range<u32>,
    /// How the rooms are named.
    #[serde(default)]
    pub room_names: RoomNames,
    /// Bots start in crowds, not where the server puts them (`--preset
    /// plaza`).
    #[serde(default)]
    pub crowds: bool,
    /// What does not fail the run.
    #[serde(default)]
    pub tolerate: Tolerance,
    /// The share of the bots that drop their connection each second (on
    /// average: each bot at random times) and join again at once with their
    /// resume token; 0: none.
    #[serde(default)]
    pub drops_per_sec: f64,
}

/// How bots move.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Movement {
    /// Click-to-move: one message per walk, a target and a speed.
    Walk,
    /// Free movement: a plain position each interval.
    Wander,
}

/// How a run's rooms are named.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum RoomNames {
    /// `lt-<run tag>-<n>`: rooms of this run alone.
    #[default]
    Run,
    /// Every bot in this one room (`--room`).
    One(String),
    /// `PREFIX-1` ... `PREFIX-N` (`--room-prefix`).
    Prefix(String),
}

/// What does not fail a run (see `--tolerate-*`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tolerance {
    /// Bots the server disconnects during the run.
    pub disconnects: bool,
    /// Bots that cannot connect or join.
    pub connect_failures: bool,
}

impl Plan {
    /// Name of room `index` (at most 32 characters of `[A-Za-z0-9_.-]`).
    pub fn room_name(&self, index: u32) -> String {
        match &self.room_names {
            RoomNames::Run => format!("lt-{}-{index}", self.run_tag),
            RoomNames::One(name) => name.clone(),
            RoomNames::Prefix(prefix) => format!("{prefix}-{}", index + 1),
        }
    }

    /// Name of bot `index` (global): it carries the run tag, so a bot
    /// knows the other bots of its run from people (and from another run's
    /// bots) sharing a named room.
    pub fn bot_name(&self, index: u32) -> String {
        format!("bot{index}-{}", self.run_tag)
    }

    /// Whether a member named `name` is a bot of this run.
    pub fn is_bot_name(&self, name: &str) -> bool {
        name.strip_prefix("bot")
            .and_then(|rest| rest.split_once('-'))
            .is_some_and(|(n, tag)| {
                tag == self.run_tag && !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())
            })
    }

    /// Every node of `--url`, in order.
    pub fn targets(&self) -> impl Iterator<Item = &Target> {
        std::iter::once(&self.target).chain(&self.more_targets)
    }

    /// Number of nodes in `--url`.
    pub fn nodes(&self) -> usize {
        1 + self.more_targets.len()
    }

    /// The node bot `index` (global) connects to: one by one over the
    /// nodes, so a room of at least as many bots as nodes spans every node.
    pub fn node_of(&self, index: u32) -> usize {
        index as usize % self.nodes()
    }

    /// `--url` as given: the node URLs joined by commas.
    pub fn url(&self) -> String {
        self.targets()
            .map(|t| t.url.as_str())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Bots in the largest of this plan's processes.
    pub fn largest_process(&self) -> u32 {
        self.split()
            .into_iter()
            .map(|range| {
                range
                    .map(|room| self.bots_in_room(room).len() as u32)
                    .sum::<u32>()
            })
            .max()
            .unwrap_or(0)
    }

    /// Refuses a plan whose processes need more open files than `files`
    /// allows, saying what to do.
    pub fn check_open_files(&self, files: crate::limits::OpenFiles) -> anyhow::Result<()> {
        let largest = if self.room_range == (0..self.rooms) {
            self.largest_process()
        } else {
            self.local_bots()
        };
        if u64::from(largest) <= files.bots() {
            return Ok(());
        }
        // The fewest processes that fit, if spreading whole rooms can.
        let fits = (self.processes.max(1)..=self.rooms).find(|&n| {
            u64::from(
                Plan {
                    processes: n,
                    room_range: 0..self.rooms,
                    ..self.clone()
                }
                .largest_process(),
            ) <= files.bots()
        });
        bail!(
            "{}",
            crate::limits::advice(u64::from(largest), files, fits, self.room_size)
        )
    }

    /// The global indices of the bots in room `index`.
    pub fn bots_in_room(&self, index: u32) -> Range<u32> {
        let first = index.saturating_mul(self.room_size).min(self.bots);
        let end = first.saturating_add(self.room_size).min(self.bots);
        first..end
    }

    /// The global indices of the bots this process runs (whole rooms, so
    /// contiguous).
    pub fn local_bot_range(&self) -> Range<u32> {
        let first = self.bots_in_room(self.room_range.start).start;
        let end = match self.room_range.end.checked_sub(1) {
            Some(last) if !self.room_range.is_empty() => self.bots_in_room(last).end,
            _ => first,
        };
        first..end.max(first)
    }

    /// The index of a bot of this run from its name (see [`Plan::bot_name`]).
    pub fn bot_index(&self, name: &str) -> Option<u32> {
        if !self.is_bot_name(name) {
            return None;
        }
        name.strip_prefix("bot")?.split_once('-')?.0.parse().ok()
    }

    /// Bots this process runs.
    pub fn local_bots(&self) -> u32 {
        self.room_range
            .clone()
            .map(|r| self.bots_in_room(r).len() as u32)
            .sum()
    }

    /// Splits the rooms into `processes` contiguous ranges holding about the
    /// same number of bots (whole rooms each, so a move's receivers are in
    /// its sender's process).
    pub fn split(&self) -> Vec<Range<u32>> {
        let n = self.processes.clamp(1, self.rooms.max(1));
        let mut ranges = Vec::with_capacity(n as usize);
        let mut first = 0;
        for k in 1..=n {
            // Rooms before the k-th cut: a whole number near k/n of them.
            let end = (u64::from(self.rooms) * u64::from(k) / u64::from(n)) as u32;
            ranges.push(first..end);
            first = end;
        }
        ranges
    }

    /// The schedule, anchored at `start_unix_ms` (or now).
    pub fn schedule(&self) -> Schedule {
        let now = Instant::now();
        let origin = if self.start_unix_ms == 0 {
            now
        } else {
            let now_ms = unix_ms(SystemTime::now());
            if self.start_unix_ms >= now_ms {
                now + Duration::from_millis(self.start_unix_ms - now_ms)
            } else {
                now.checked_sub(Duration::from_millis(now_ms - self.start_unix_ms))
                    .unwrap_or(now)
            }
        };
        let ramp =
            Duration::from_secs_f64(f64::from(self.bots) / f64::from(self.ramp_per_s.max(1)));
        let window_start = origin + ramp + Duration::from_millis(self.warmup_ms);
        let window_end = window_start + Duration::from_millis(self.duration_ms);
        Schedule {
            origin,
            ramp_per_s: self.ramp_per_s.max(1),
            ramp_end: origin + ramp,
            window_start,
            window_end,
            drain_end: window_end + Duration::from_millis(self.drain_ms),
        }
    }
}

/// Milliseconds since the Unix epoch.
pub fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// A short tag unique enough to keep concurrent runs apart.
pub fn run_tag() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let mut rng = crate::random::SplitMix::new(nanos ^ (u64::from(std::process::id()) << 32));
    format!("{:06x}", rng.next_u64() & 0xff_ffff)
}

/// When things happen, on this process's monotonic clock.
#[derive(Clone, Copy, Debug)]
pub struct Schedule {
    pub origin: Instant,
    ramp_per_s: u32,
    pub ramp_end: Instant,
    /// Moves sent from here on are counted...
    pub window_start: Instant,
    /// ...up to here; bots stop sending here.
    pub window_end: Instant,
    /// Bots stop receiving here; the tallies are read.
    pub drain_end: Instant,
}

impl Schedule {
    /// When bot number `index` (global) opens its connection.
    pub fn connect_at(&self, index: u32) -> Instant {
        self.origin + Duration::from_secs_f64(f64::from(index) / f64::from(self.ramp_per_s))
    }

    /// Whether a move sent at `at` is counted.
    pub fn in_window(&self, at: Instant) -> bool {
        self.window_start <= at && at < self.window_end
    }

    /// Length of the measured window.
    pub fn window(&self) -> Duration {
        self.window_end - self.window_start
    }
}

/// Most nodes one `--url` may list.
pub const MAX_NODES: usize = 64;

/// Parses `--url`: one `ws://` URL, or several separated by commas (the
/// nodes of a cluster), each as [`Target::parse`] takes it.
pub fn parse_targets(urls: &str, allow_remote: bool) -> anyhow::Result<Vec<Target>> {
    let example = "e.g. --url ws://127.0.0.1:3000/ws,ws://127.0.0.1:3001/ws";
    let parts: Vec<&str> = urls.split(',').map(str::trim).collect();
    ensure!(
        parts.iter().all(|p| !p.is_empty()),
        "--url {urls:?}: an empty entry in the list; give one ws:// URL per node, separated by \
         commas, with no trailing comma ({example})"
    );
    ensure!(
        parts.len() <= MAX_NODES,
        "--url lists {} nodes; at most {MAX_NODES} are supported",
        parts.len()
    );
    let mut targets: Vec<Target> = Vec::with_capacity(parts.len());
    for part in parts {
        let target = Target::parse(part, allow_remote)?;
        if let Some(same) = targets
            .iter()
            .find(|t| (t.host.as_str(), t.port) == (target.host.as_str(), target.port))
        {
            bail!(
                "--url lists the node {} twice ({} and {part}); list each node once ({example})",
                target.authority(),
                same.url
            );
        }
        targets.push(target);
    }
    Ok(targets)
}

/// The server a run targets: a `ws://` URL on a loopback host (unless
/// allowed otherwise).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Target {
    pub url: String,
    pub host: String,
    pub port: u16,
    pub path: String,
    pub allow_remote: bool,
}

impl Target {
    /// Parses `ws://host[:port][/path]`; refuses hosts that are not loopback
    /// unless `allow_remote`.
    pub fn parse(url: &str, allow_remote: bool) -> anyhow::Result<Self> {
        let rest = match url.split_once("://") {
            Some(("ws", rest)) => rest,
            Some((scheme, _)) => bail!("--url {url}: scheme {scheme:?} not supported, use ws://"),
            None => bail!("--url {url}: expected ws://host:port/path"),
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => rest.split_at(i),
            None => (rest, "/"),
        };
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (host, after) = v6
                .split_once(']')
                .with_context(|| format!("--url {url}: unterminated [ipv6] host"))?;
            let port = match after.strip_prefix(':') {
                Some(p) => p
                    .parse()
                    .with_context(|| format!("--url {url}: bad port"))?,
                None => 80,
            };
            (host.to_string(), port)
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (
                    h.to_string(),
                    p.parse()
                        .with_context(|| format!("--url {url}: bad port"))?,
                ),
                None => (authority.to_string(), 80),
            }
        };
        ensure!(!host.is_empty(), "--url {url}: no host");
        let target = Self {
            url: url.to_string(),
            host,
            port,
            path: path.to_string(),
            allow_remote,
        };
        if !allow_remote {
            ensure!(
                target.loopback_ip().is_some(),
                "--url {url}: {} is not a loopback address; this tool only targets this machine \
                 (pass --allow-remote to override)",
                target.host
            );
        }
        Ok(target)
    }

    pub(crate) fn loopback_ip(&self) -> Option<IpAddr> {
        if self.host.eq_ignore_ascii_case("localhost") {
            return Some(IpAddr::V4(Ipv4Addr::LOCALHOST));
        }
        let ip: IpAddr = self.host.parse().ok()?;
        ip.is_loopback().then_some(ip)
    }

    /// The socket address to connect to.
    pub async fn resolve(&self) -> anyhow::Result<SocketAddr> {
        if let Some(ip) = self.loopback_ip() {
            return Ok(SocketAddr::new(ip, self.port));
        }
        ensure!(self.allow_remote, "{} is not a loopback address", self.host);
        let mut addrs = tokio::time::timeout(
            Duration::from_secs(5),
            tokio::net::lookup_host((self.host.as_str(), self.port)),
        )
        .await
        .with_context(|| format!("resolving {} timed out", self.host))?
        .with_context(|| format!("resolving {}", self.host))?;
        addrs
            .next()
            .with_context(|| format!("{} has no address", self.host))
    }

    /// `host:port` as written in an HTTP `Host` header.
    pub fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(bots: u32, room_size: u32, processes: u32) -> Plan {
        let rooms = bots.div_ceil(room_size);
        Plan {
            target: Target::parse("ws://127.0.0.1:3000/ws", false).unwrap(),
            more_targets: vec![],
            bots,
            rooms,
            room_size,
            move_interval_ms: 1000,
            movement: Movement::Walk,
            chat_interval_ms: None,
            duration_ms: 1000,
            ramp_per_s: 1000,
            warmup_ms: 0,
            drain_ms: 0,
            source_addrs: vec![],
            processes,
            run_tag: "t".into(),
            start_unix_ms: 0,
            room_range: 0..rooms,
            room_names: RoomNames::Run,
            crowds: false,
            tolerate: Tolerance::default(),
            drops_per_sec: 0.0,
        }
    }

    #[test]
    fn bots_know_each_other_by_name() {
        let p = plan(10, 5, 1);
        assert_eq!(p.bot_name(7), "bot7-t");
        assert!(p.is_bot_name("bot7-t"));
        for other in ["bot7-u", "bot-t", "botx-t", "Alice", "bot7", "bot7-t-x"] {
            assert!(!p.is_bot_name(other), "{other}");
        }
        assert!(p.bot_name(199_999).len() <= 32);
        assert_eq!(p.bot_index("bot7-t"), Some(7));
        assert_eq!(p.bot_index("bot7-u"), None);
        assert_eq!(p.bot_index("Alice"), None);
        assert_eq!(p.local_bot_range(), 0..10);
        let child = Plan {
            room_range: 1..2,
            ..p.clone()
        };
        assert_eq!(child.local_bot_range(), 5..10);
    }

    #[test]
    fn split_keeps_rooms_whole_and_covers_all() {
        let p = plan(1_000, 30, 3);
        let ranges = p.split();
        assert_eq!(ranges.len(), 3);
        assert_eq!(ranges[0].start, 0);
        assert_eq!(ranges[2].end, p.rooms);
        for w in ranges.windows(2) {
            assert_eq!(w[0].end, w[1].start);
        }
        let total: u32 = ranges
            .iter()
            .map(|r| {
                Plan {
                    room_range: r.clone(),
                    ..p.clone()
                }
                .local_bots()
            })
            .sum();
        assert_eq!(total, 1_000);
        assert_eq!(p.bots_in_room(33), 990..1_000, "last room holds the rest");
    }

    #[test]
    fn schedule_is_shared_through_wall_clock() {
        let mut p = plan(100, 10, 1);
        p.start_unix_ms = unix_ms(SystemTime::now()) + 500;
        let s = p.schedule();
        let ahead = s.origin - Instant::now();
        assert!(ahead <= Duration::from_millis(500) && ahead >= Duration::from_millis(400));
        assert_eq!(s.ramp_end - s.origin, Duration::from_millis(100));
        assert!(s.in_window(s.window_start));
        assert!(!s.in_window(s.window_end));
        assert_eq!(s.connect_at(50) - s.origin, Duration::from_millis(50));
    }

    #[test]
    fn url_lists() {
        let one = parse_targets("ws://127.0.0.1:3000/ws", false).unwrap();
        assert_eq!(one.len(), 1);
        let two = parse_targets("ws://127.0.0.1:3000/ws,ws://localhost:3001/ws", false).unwrap();
        assert_eq!(
            two.iter().map(|t| t.port).collect::<Vec<_>>(),
            vec![3000, 3001]
        );
        for (bad, says) in [
            ("ws://127.0.0.1:3000/ws,", "an empty entry"),
            (",ws://127.0.0.1:3000/ws", "an empty entry"),
            (
                "ws://127.0.0.1:3000/ws,,ws://127.0.0.1:3001/ws",
                "an empty entry",
            ),
            (
                "ws://127.0.0.1:3000/ws,ws://127.0.0.1:3000/other",
                "lists the node 127.0.0.1:3000 twice",
            ),
            ("ws://127.0.0.1:3000/ws,http://127.0.0.1:3001/", "use ws://"),
            (
                "ws://127.0.0.1:3000/ws,ws://10.0.0.2:3001/ws",
                "--allow-remote",
            ),
        ] {
            let err = parse_targets(bad, false).unwrap_err().to_string();
            assert!(err.contains(says), "{bad}: {err}");
        }
        let many = (0..=MAX_NODES)
            .map(|i| format!("ws://127.0.0.1:{}/ws", 3000 + i))
            .collect::<Vec<_>>()
            .join(",");
        assert!(parse_targets(&many, false).is_err());
    }

    #[test]
    fn bots_go_round_robin_over_the_nodes() {
        let mut p = plan(90, 30, 1);
        let nodes = parse_targets(
            "ws://127.0.0.1:3000/ws,ws://127.0.0.1:3001/ws,ws://127.0.0.1:3002/ws",
            false,
        )
        .unwrap();
        p.target = nodes[0].clone();
        p.more_targets = nodes[1..].to_vec();
        assert_eq!(p.nodes(), 3);
        assert_eq!(
            p.url(),
            "ws://127.0.0.1:3000/ws,ws://127.0.0.1:3001/ws,ws://127.0.0.1:3002/ws"
        );
        assert_eq!(
            (0..7).map(|i| p.node_of(i)).collect::<Vec<_>>(),
            vec![0, 1, 2, 0, 1, 2, 0]
        );
        // Every room spans every node, with the same share on each.
        for room in 0..p.rooms {
            let mut per_node = [0; 3];
            for bot in p.bots_in_room(room) {
                per_node[p.node_of(bot)] += 1;
            }
            assert_eq!(per_node, [10, 10, 10], "room {room}");
        }
        // One node: everyone on it.
        let single = plan(10, 5, 1);
        assert!((0..10).all(|i| single.node_of(i) == 0));
        assert_eq!(single.url(), "ws://127.0.0.1:3000/ws");
    }

    #[test]
    fn urls() {
        let t = Target::parse("ws://[::1]:4000/x/ws", false).unwrap();
        assert_eq!(
            (t.host.as_str(), t.port, t.path.as_str()),
            ("::1", 4000, "/x/ws")
        );
        assert_eq!(t.authority(), "[::1]:4000");
        let t = Target::parse("ws://localhost", false).unwrap();
        assert_eq!((t.port, t.path.as_str()), (80, "/"));
        assert!(Target::parse("ws://192.168.1.2:3000/ws", false).is_err());
        assert!(Target::parse("ws://192.168.1.2:3000/ws", true).is_ok());
    }
}
