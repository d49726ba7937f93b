//! Reading the server's `GET /metrics` (Prometheus or OpenMetrics text) at
//! the edges of the measured window, and what the server spent in between.
//!
//! A plain HTTP/1.0 request on a fresh connection, bounded in time and size:
//! no HTTP client is needed for one small GET on loopback.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use crate::plan::{Schedule, Target};

/// Bound on a whole scrape: connect, request, response.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(5);
/// Bound on a response's size.
const MAX_RESPONSE_BYTES: u64 = 8 << 20;

/// One reading of the server's metrics: each metric name summed over its
/// label sets.
#[derive(Clone, Debug, Default)]
pub struct Sample {
    pub at: Option<Instant>,
    values: HashMap<String, f64>,
}

impl Sample {
    /// Parses exposition text: `name value`, `name{labels} value`, an
    /// optional timestamp after; `#` lines (and `# EOF`) skipped.
    pub fn parse(text: &str) -> Self {
        let mut values: HashMap<String, f64> = HashMap::new();
        for line in text.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (name, rest) = match line.find(['{', ' ', '\t']) {
                Some(i) if line.as_bytes()[i] == b'{' => match closing_brace(&line[i..]) {
                    Some(end) => (&line[..i], &line[i + end + 1..]),
                    None => continue,
                },
                Some(i) => (&line[..i], &line[i..]),
                None => continue,
            };
            let Some(value) = rest.split_whitespace().next() else {
                continue;
            };
            let value = match value {
                "+Inf" => f64::INFINITY,
                "-Inf" => f64::NEG_INFINITY,
                v => match v.parse::<f64>() {
                    Ok(v) => v,
                    Err(_) => continue,
                },
            };
            *values.entry(name.to_string()).or_default() += value;
        }
        Self { at: None, values }
    }

    /// A metric by name, with or without the `_total` suffix of counters.
    pub fn get(&self, name: &str) -> Option<f64> {
        let bare = name.strip_suffix("_total").unwrap_or(name);
        [name.to_string(), format!("{bare}_total"), bare.to_string()]
            .iter()
            .find_map(|n| self.values.get(n).copied())
    }
}

/// Index of the `}` closing the label set that `s` starts with, skipping
/// quoted label values.
fn closing_brace(s: &str) -> Option<usize> {
    let mut quoted = false;
    let mut escaped = false;
    for (i, c) in s.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            '}' if !quoted => return Some(i),
            _ => {}
        }
    }
    None
}

/// Fetches and parses `GET /metrics` from the server behind `target`.
pub async fn scrape(target: &Target) -> anyhow::Result<Sample> {
    let addr = target.resolve().await?;
    let body = tokio::time::timeout(SCRAPE_TIMEOUT, get(addr, &target.authority(), "/metrics"))
        .await
        .context("GET /metrics timed out")??;
    let mut sample = Sample::parse(&body);
    sample.at = Some(Instant::now());
    Ok(sample)
}

/// `GET path` over HTTP/1.0 on a fresh connection; the body of a 200.
pub(crate) async fn get(
    addr: std::net::SocketAddr,
    host: &str,
    path: &str,
) -> anyhow::Result<String> {
    let mut stream = TcpStream::connect(addr).await?;
    let request = format!("GET {path} HTTP/1.0\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut response = Vec::new();
    (&mut stream)
        .take(MAX_RESPONSE_BYTES)
        .read_to_end(&mut response)
        .await?;
    let text = String::from_utf8_lossy(&response);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .context("malformed HTTP response")?;
    let status = head.split_whitespace().nth(1).unwrap_or("");
    ensure!(status == "200", "GET {path} answered {status}");
    let chunked = head.lines().any(|l| {
        l.to_ascii_lowercase()
            .replace(' ', "")
            .starts_with("transfer-encoding:chunked")
    });
    if chunked {
        dechunk(body)
    } else {
        Ok(body.to_string())
    }
}

fn dechunk(mut body: &str) -> anyhow::Result<String> {
    let mut out = String::new();
    loop {
        let (size, rest) = body.split_once("\r\n").context("truncated chunk")?;
        let size = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16)
            .context("bad chunk size")?;
        if size == 0 {
            return Ok(out);
        }
        if rest.len() < size {
            bail!("truncated chunk");
        }
        out.push_str(&rest[..size]);
        body = rest[size..].strip_prefix("\r\n").unwrap_or(&rest[size..]);
    }
}

/// What a sample taken before the first bot connected says about the
/// figures to come: warnings when the server was not fresh.
pub fn freshness(before: &Sample) -> Vec<String> {
    let open = before.get("amble_connections").unwrap_or(0.0).max(0.0) as u64;
    let members = before.get("amble_members").unwrap_or(0.0).max(0.0) as u64;
    let accepted = before
        .get("amble_connections_accepted_total")
        .unwrap_or(0.0)
        .max(0.0) as u64;
    let mut warnings = Vec::new();
    if open > 0 || members > 0 {
        warnings.push(format!(
            "the server was busy: {open} connections open and {members} members in rooms before \
             the first bot connected; its CPU, memory per connection, latency and delivery \
             figures include their load. Use a fresh server for figures."
        ));
    }
    if accepted > open {
        warnings.push(format!(
            "the server was reused: it had accepted {accepted} connections before this run; its \
             memory per connection is understated (its allocator reuses what earlier \
             connections freed) and its CPU figures may include their leftovers. Restart it \
             for figures."
        ));
    }
    warnings
}

/// Time between readings of `/metrics` during a run, to notice when it
/// stops answering.
const CHECK_EVERY: Duration = Duration::from_secs(5);

/// The server's metrics over a run: read at the window's start and end, and
/// every few seconds in between to say when `/metrics` stops answering.
pub struct Watch {
    end: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<Window>,
}

/// What a [`Watch`] read.
#[derive(Debug, Default)]
pub struct Window {
    pub start: Option<Sample>,
    pub end: Option<Sample>,
    /// When and why `/metrics` first failed to answer, if it did.
    pub lost: Option<String>,
}

/// Whether `/metrics` answers, and saying so when that changes.
struct Health {
    origin: Instant,
    failing: bool,
    /// `the server`, or `node URL` when there are several.
    who: String,
}

impl Health {
    fn observe(&mut self, result: anyhow::Result<Sample>, window: &mut Window) -> Option<Sample> {
        let at = self.origin.elapsed().as_secs_f64();
        match result {
            Ok(sample) => {
                if self.failing {
                    self.failing = false;
                    eprintln!(
                        "{}'s /metrics answers again ({at:.1} s into the run)",
                        self.who
                    );
                }
                Some(sample)
            }
            Err(err) => {
                if !self.failing {
                    self.failing = true;
                    let what = format!(
                        "{}'s /metrics stopped answering {at:.1} s into the run ({err:#})",
                        self.who
                    );
                    eprintln!("warning: {what}");
                    window.lost.get_or_insert(what);
                }
                None
            }
        }
    }
}

impl Watch {
    /// Starts reading; warnings go to stderr as they happen, naming the
    /// server as `who` (`the server`, `node URL`).
    pub fn start(target: Target, schedule: Schedule, who: String) -> Self {
        let (end, mut ended) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(async move {
            let mut window = Window::default();
            let mut health = Health {
                origin: schedule.origin,
                failing: false,
                who,
            };
            let mut started = false;
            let mut next_check = Instant::now() + CHECK_EVERY;
            loop {
                let stop = tokio::select! {
                    biased;
                    () = async { drop(ended.wait_for(|e| *e).await) } => true,
                    () = tokio::time::sleep_until(schedule.window_start.into()), if !started => {
                        started = true;
                        let sample = health.observe(scrape(&target).await, &mut window);
                        window.start = sample;
                        continue;
                    }
                    () = tokio::time::sleep_until(schedule.window_end.into()), if started => true,
                    () = tokio::time::sleep_until(next_check.into()) => {
                        next_check = Instant::now() + CHECK_EVERY;
                        let _ = health.observe(scrape(&target).await, &mut window);
                        continue;
                    }
                };
                if stop {
                    if started {
                        let sample = health.observe(scrape(&target).await, &mut window);
                        window.end = sample;
                    }
                    return window;
                }
            }
        });
        Self { end, task }
    }

    /// Ends the window now: the run ended early.
    pub fn end_now(&self) {
        self.end.send_replace(true);
    }

    /// Ends the window now (if the run ended early) and returns what was
    /// read.
    pub async fn finish(self) -> Window {
        self.end.send_replace(true);
        self.task.await.unwrap_or_default()
    }
}

/// What the server spent over a window, from two samples.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ServerUsage {
    /// CPU time over wall time; 100 is one core.
    pub cpu_percent: Option<f64>,
    /// Server CPU time per update delivered to a bot, µs.
    pub cpu_us_per_update: Option<f64>,
    /// Resident memory at the end of the window.
    pub rss_bytes: Option<u64>,
    /// Resident memory the connections added (end of window less before the
    /// first bot connected), per open connection: meaningful on a freshly
    /// started server (its allocator keeps what earlier runs freed).
    pub rss_bytes_per_connection: Option<f64>,
    /// The server's own gauge of open connections at the end of the window.
    pub connections: Option<u64>,
    /// Counter deltas over the window.
    pub moves_received: Option<u64>,
    pub moves_applied: Option<u64>,
    pub frames_sent: Option<u64>,
    pub bytes_sent: Option<u64>,
    pub resyncs: Option<u64>,
    /// CPU time over the window, seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_seconds: Option<f64>,
    /// Cluster mode only (`amble_cluster_*`), deltas over the window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterUsage>,
}

/// A node's cluster figures over the window (`amble_cluster_*` counter
/// deltas); absent on a node without `--nats`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ClusterUsage {
    pub messages_published: u64,
    pub bytes_published: u64,
    pub messages_received: u64,
    pub bytes_received: u64,
    /// Moves of other nodes' members this node fanned out.
    pub remote_moves: u64,
    /// Those that missed the tick they were cut for.
    pub remote_moves_late: u64,
    /// `remote_moves_late` over `remote_moves`, percent (`None`: no remote
    /// move).
    pub remote_moves_late_percent: Option<f64>,
    /// Full states applied to repair a room.
    pub resyncs: u64,
    /// Messages dropped because the outgoing queue was full.
    pub dropped: u64,
}

impl ClusterUsage {
    fn between(start: &Sample, end: &Sample) -> Option<Self> {
        let counter = |name: &str| -> Option<u64> {
            Some((end.get(name)? - start.get(name)?).max(0.0).round() as u64)
        };
        // Cluster mode renders these; a single process renders none.
        counter("amble_cluster_messages_published_total")?;
        let c = |name: &str| counter(name).unwrap_or(0);
        let mut usage = Self {
            messages_published: c("amble_cluster_messages_published_total"),
            bytes_published: c("amble_cluster_bytes_published_total"),
            messages_received: c("amble_cluster_messages_received_total"),
            bytes_received: c("amble_cluster_bytes_received_total"),
            remote_moves: c("amble_cluster_remote_moves_total"),
            remote_moves_late: c("amble_cluster_remote_moves_late_total"),
            remote_moves_late_percent: None,
            resyncs: c("amble_cluster_resyncs_total"),
            dropped: c("amble_cluster_dropped_total"),
        };
        usage.derive();
        Some(usage)
    }

    fn derive(&mut self) {
        self.remote_moves_late_percent = (self.remote_moves > 0)
            .then(|| 100.0 * self.remote_moves_late as f64 / self.remote_moves as f64);
    }

    /// The sum over nodes (`None` if no node is in cluster mode).
    pub fn sum<'a>(parts: impl IntoIterator<Item = &'a ClusterUsage>) -> Option<Self> {
        let mut total: Option<Self> = None;
        for p in parts {
            let t = total.get_or_insert_with(Self::default);
            t.messages_published += p.messages_published;
            t.bytes_published += p.bytes_published;
            t.messages_received += p.messages_received;
            t.bytes_received += p.bytes_received;
            t.remote_moves += p.remote_moves;
            t.remote_moves_late += p.remote_moves_late;
            t.resyncs += p.resyncs;
            t.dropped += p.dropped;
        }
        if let Some(t) = &mut total {
            t.derive();
        }
        total
    }
}

impl ServerUsage {
    /// `before` is from before the first bot connected; `start` and `end`
    /// bracket the window; `updates` is the updates delivered in it.
    pub fn between(before: Option<&Sample>, start: &Sample, end: &Sample, updates: u64) -> Self {
        let delta = |name: &str| Some(end.get(name)? - start.get(name)?);
        let counter = |name: &str| delta(name).map(|d| d.max(0.0).round() as u64);
        let wall = match (start.at, end.at) {
            (Some(a), Some(b)) => b.duration_since(a).as_secs_f64(),
            _ => 0.0,
        };
        let cpu = delta("amble_process_cpu_seconds_total");
        let rss = end.get("amble_process_resident_memory_bytes");
        let connections = end.get("amble_connections");
        let rss_before = before.and_then(|b| b.get("amble_process_resident_memory_bytes"));
        Self {
            cpu_percent: cpu.filter(|_| wall > 0.0).map(|c| 100.0 * c / wall),
            cpu_us_per_update: cpu
                .filter(|_| updates > 0)
                .map(|c| c * 1e6 / updates as f64),
            rss_bytes: rss.map(|r| r as u64),
            rss_bytes_per_connection: match (rss, connections) {
                // An allocator keeps what earlier runs freed: no growth says nothing.
                (Some(rss), Some(n)) if n > 0.0 && rss > rss_before.unwrap_or(0.0) => {
                    Some((rss - rss_before.unwrap_or(0.0)) / n)
                }
                _ => None,
            },
            connections: connections.map(|n| n as u64),
            moves_received: counter("amble_moves_received_total"),
            moves_applied: counter("amble_moves_applied_total"),
            frames_sent: counter("amble_frames_sent_total"),
            bytes_sent: counter("amble_bytes_sent_total"),
            resyncs: counter("amble_resyncs_total"),
            cpu_seconds: cpu,
            cluster: ClusterUsage::between(start, end),
        }
    }

    /// The sum over every node's usage: CPU and memory add up, per-update
    /// and per-connection figures are recomputed from the sums. A figure
    /// any node lacks is `None` (the sum would understate it).
    pub fn sum(parts: &[ServerUsage], updates: u64) -> Self {
        fn all<T: Copy + std::iter::Sum<T>>(
            parts: &[ServerUsage],
            f: impl Fn(&ServerUsage) -> Option<T>,
        ) -> Option<T> {
            parts.iter().map(f).sum()
        }
        let cpu = all(parts, |p| p.cpu_seconds);
        let connections = all(parts, |p| p.connections);
        // What each node's connections added, from its per-connection figure.
        let grown = all(parts, |p| {
            Some(p.rss_bytes_per_connection? * p.connections? as f64)
        });
        Self {
            cpu_percent: all(parts, |p| p.cpu_percent),
            cpu_us_per_update: cpu
                .filter(|_| updates > 0)
                .map(|c| c * 1e6 / updates as f64),
            rss_bytes: all(parts, |p| p.rss_bytes),
            rss_bytes_per_connection: match (grown, connections) {
                (Some(g), Some(n)) if n > 0 => Some(g / n as f64),
                _ => None,
            },
            connections,
            moves_received: all(parts, |p| p.moves_received),
            moves_applied: all(parts, |p| p.moves_applied),
            frames_sent: all(parts, |p| p.frames_sent),
            bytes_sent: all(parts, |p| p.bytes_sent),
            resyncs: all(parts, |p| p.resyncs),
            cpu_seconds: cpu,
            cluster: ClusterUsage::sum(parts.iter().filter_map(|p| p.cluster.as_ref())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "\
# HELP amble_process_cpu_seconds Total CPU.
# TYPE amble_process_cpu_seconds counter
amble_process_cpu_seconds_total 12.5
amble_process_resident_memory_bytes 1.5e7
amble_connections 100
amble_frames_sent_total{kind=\"motion\"} 900
amble_frames_sent_total{kind=\"body\",note=\"a } b\"} 100 1700000000000
amble_bytes_sent_total{} 5000
garbage line
# EOF
";

    #[test]
    fn parses_openmetrics_and_labels() {
        let s = Sample::parse(TEXT);
        assert_eq!(s.get("amble_process_cpu_seconds_total"), Some(12.5));
        assert_eq!(s.get("amble_process_cpu_seconds"), Some(12.5));
        assert_eq!(s.get("amble_process_resident_memory_bytes"), Some(15e6));
        assert_eq!(s.get("amble_frames_sent_total"), Some(1000.0));
        assert_eq!(s.get("amble_frames_sent"), Some(1000.0));
        assert_eq!(s.get("amble_bytes_sent_total"), Some(5000.0));
        assert_eq!(s.get("amble_connections"), Some(100.0));
        assert_eq!(s.get("garbage"), None);
    }

    #[test]
    fn usage_over_a_window() {
        let t0 = Instant::now();
        let mut start =
            Sample::parse("amble_process_cpu_seconds_total 10\namble_frames_sent_total 5\n");
        start.at = Some(t0);
        let mut end = Sample::parse(
            "amble_process_cpu_seconds_total 12\namble_frames_sent_total 105\n\
             amble_process_resident_memory_bytes 3000000\namble_connections 1000\n",
        );
        end.at = Some(t0 + Duration::from_secs(4));
        let before = Sample::parse("amble_process_resident_memory_bytes 1000000\n");
        let u = ServerUsage::between(Some(&before), &start, &end, 1_000_000);
        assert_eq!(u.cpu_percent, Some(50.0));
        assert_eq!(u.cpu_us_per_update, Some(2.0));
        assert_eq!(u.rss_bytes_per_connection, Some(2000.0));
        assert_eq!(u.frames_sent, Some(100));
        assert_eq!(u.moves_applied, None);
    }

    /// The `amble_cluster_*` counters a node renders in cluster mode
    /// (docs: /work/wt/brief/CLUSTER.md).
    const CLUSTER_END: &str = "\
amble_process_cpu_seconds_total 14
amble_process_resident_memory_bytes 4000000
amble_connections 500
amble_cluster_connected 1
amble_cluster_peers 1
amble_cluster_messages_published_total 1100
amble_cluster_bytes_published_total 90000
amble_cluster_messages_received_total 1300
amble_cluster_bytes_received_total 110000
amble_cluster_remote_moves_total 2000
amble_cluster_remote_moves_late_total 30
amble_cluster_resyncs_total 2
amble_cluster_dropped_total 0
";

    #[test]
    fn cluster_figures_per_node_and_summed() {
        let t0 = Instant::now();
        let mut start = Sample::parse(
            "amble_process_cpu_seconds_total 10\namble_cluster_messages_published_total 100\n\
             amble_cluster_bytes_published_total 10000\namble_cluster_messages_received_total 300\n\
             amble_cluster_bytes_received_total 10000\namble_cluster_remote_moves_total 1000\n\
             amble_cluster_remote_moves_late_total 10\namble_cluster_resyncs_total 1\n\
             amble_cluster_dropped_total 0\n",
        );
        start.at = Some(t0);
        let mut end = Sample::parse(CLUSTER_END);
        end.at = Some(t0 + Duration::from_secs(2));
        let before = Sample::parse("amble_process_resident_memory_bytes 1500000\n");
        let a = ServerUsage::between(Some(&before), &start, &end, 4_000);
        let c = a.cluster.clone().unwrap();
        assert_eq!((c.messages_published, c.bytes_published), (1_000, 80_000));
        assert_eq!((c.messages_received, c.bytes_received), (1_000, 100_000));
        assert_eq!((c.remote_moves, c.remote_moves_late), (1_000, 20));
        assert_eq!(c.remote_moves_late_percent, Some(2.0));
        assert_eq!((c.resyncs, c.dropped), (1, 0));
        assert_eq!(a.cpu_seconds, Some(4.0));

        // A second node: half the CPU, no late move.
        let mut b = a.clone();
        b.cpu_seconds = Some(2.0);
        b.cpu_percent = Some(100.0);
        b.rss_bytes_per_connection = Some(1_000.0);
        b.connections = Some(1_500);
        b.cluster = Some(ClusterUsage {
            remote_moves_late: 0,
            ..c.clone()
        });
        let sum = ServerUsage::sum(&[a.clone(), b], 4_000);
        assert_eq!(sum.cpu_seconds, Some(6.0));
        assert_eq!(sum.cpu_percent, Some(300.0));
        assert_eq!(sum.cpu_us_per_update, Some(1_500.0));
        assert_eq!(sum.rss_bytes, Some(8_000_000));
        assert_eq!(sum.connections, Some(2_000));
        // (2.5 MB over 500) + (1 kB x 1,500), over 2,000 connections.
        assert_eq!(sum.rss_bytes_per_connection, Some(2_000.0));
        let sc = sum.cluster.unwrap();
        assert_eq!((sc.remote_moves, sc.remote_moves_late), (2_000, 20));
        assert_eq!(sc.remote_moves_late_percent, Some(1.0));

        // Without cluster metrics (one process), no cluster figures, and a
        // figure one node lacks is not summed.
        let plain = ServerUsage::between(None, &start, &Sample::parse("x 1\n"), 1);
        assert_eq!(plain.cluster, None);
        let partial = ServerUsage::sum(&[a, plain], 4_000);
        assert_eq!(partial.cpu_seconds, None);
        assert_eq!(partial.cluster.unwrap().messages_published, 1_000);
    }

    #[test]
    fn a_busy_or_reused_server_is_named() {
        let fresh = Sample::parse("amble_connections 0\namble_connections_accepted_total 0\n");
        assert!(freshness(&fresh).is_empty());
        assert!(freshness(&Sample::default()).is_empty());
        let busy = Sample::parse(
            "amble_connections 3\namble_members 2\namble_connections_accepted_total 3\n",
        );
        let w = freshness(&busy);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].contains("busy: 3 connections open and 2 members"),
            "{w:?}"
        );
        assert!(w[0].contains("memory per connection"), "{w:?}");
        let reused = Sample::parse("amble_connections 0\namble_connections_accepted_total 1500\n");
        let w = freshness(&reused);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].contains("reused: it had accepted 1500 connections"),
            "{w:?}"
        );
        assert!(
            w[0].contains("memory per connection is understated"),
            "{w:?}"
        );
    }

    #[test]
    fn chunked_bodies() {
        assert_eq!(
            dechunk("5\r\nhello\r\n6;x=1\r\n world\r\n0\r\n\r\n").unwrap(),
            "hello world"
        );
        assert!(dechunk("5\r\nhel").is_err());
    }
}
