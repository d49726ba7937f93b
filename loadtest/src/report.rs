//! The reports: what a person reads at the end (Display) and the same as
//! JSON (`--json`). Built from a merged [`Tally`], the server's usage and
//! the plan; every derived figure is computed here, once.

use std::collections::BTreeMap;
use std::fmt;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use crate::plan::{Movement, Plan};
use crate::scrape::{ClusterUsage, ServerUsage};
use crate::stats::{ErrorKind, Tally};
use crate::varz::NatsUsage;

/// Latency percentiles, milliseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Percentiles {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
}

impl Percentiles {
    /// From a histogram of µs.
    pub fn of(h: &Histogram<u64>) -> Self {
        let ms = |us: u64| us as f64 / 1_000.0;
        if h.is_empty() {
            return Self::default();
        }
        Self {
            p50: ms(h.value_at_quantile(0.50)),
            p90: ms(h.value_at_quantile(0.90)),
            p99: ms(h.value_at_quantile(0.99)),
            p999: ms(h.value_at_quantile(0.999)),
            max: ms(h.max()),
        }
    }
}

/// What the load tester itself spent (it shares the machine).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SelfUsage {
    /// CPU time over the window's wall time, all processes; 100 is one core.
    pub cpu_percent: f64,
    /// CPU µs per update received.
    pub cpu_us_per_update: Option<f64>,
    pub rss_bytes: u64,
    pub processes: u32,
}

/// What the area of interest did in a spatial room (`--preset plaza`).
/// `due` is what the bots' views (as the server told them) owed them, and
/// `delivered` what came; `leaked` counts records of members outside the
/// interest rule's band (with a slack for ticks), which must be 0.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Interest {
    pub due: u64,
    pub delivered: u64,
    pub leaked: u64,
    pub appeared: u64,
    pub disappeared: u64,
    /// Members in a bot's view (itself included), averaged over its moves.
    pub in_view_mean: f64,
    /// Bytes received per connected bot per second.
    pub bytes_per_member_per_s: f64,
}

/// The load scenario's report.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LoadReport {
    /// Why the run failed (empty: it did not). A failed run exits non-zero.
    pub failures: Vec<String>,
    /// Why the run was interrupted (`SIGINT`, `SIGTERM`), if it was: the
    /// figures cover what was measured until then.
    pub interrupted: Option<String>,
    /// What the figures must be read with (a busy or reused server,
    /// `/metrics` not answering).
    pub warnings: Vec<String>,
    pub url: String,
    pub bots: u64,
    /// Bots in their room at the end of the window.
    pub connected: u64,
    /// Bots in their room when the window opened.
    pub connected_at_start: u64,
    /// The fewest bots in their rooms during the window (`None`: it never
    /// opened).
    pub connected_min: Option<u64>,
    pub connect_failures: u64,
    /// Bots the server disconnected (or whose connection failed) during the
    /// run.
    pub disconnected: u64,
    /// Connections the bots dropped on purpose (`--drops-per-sec`), and of
    /// their rejoins, those that got the held place back and those that
    /// joined afresh.
    pub drops: u64,
    pub resumed: u64,
    pub fresh_rejoins: u64,
    pub rooms: u32,
    pub room_size: u32,
    pub movement: Movement,
    pub move_interval_ms: u64,
    pub chat_interval_ms: Option<u64>,
    pub warmup_s: f64,
    /// The planned window.
    pub duration_s: f64,
    /// The window as measured: shorter when the run ended early. Rates are
    /// per second of this.
    pub measured_s: f64,
    pub moves_sent: u64,
    /// In-window moves the server applied (they came back to their sender).
    pub moves_applied: u64,
    pub moves_per_s: f64,
    pub updates_expected: u64,
    pub updates_received: u64,
    pub updates_per_s: f64,
    /// received / expected (`None` when nothing was expected).
    pub delivery_rate: Option<f64>,
    pub duplicates: u64,
    /// Move sent to update received by another bot, same clock.
    pub latency_ms: Percentiles,
    /// Move sent to the same move back at its sender (server apply + tick).
    pub echo_latency_ms: Percentiles,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub bytes_in_per_s: f64,
    pub bytes_out_per_s: f64,
    /// bytes_in / updates_received.
    pub bytes_per_update: f64,
    pub frames_in: u64,
    pub frames_out: u64,
    pub chats_sent: u64,
    pub chats_received: u64,
    /// A spatial room (`--preset plaza`): what the area of interest did;
    /// absent in plain rooms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interest: Option<Interest>,
    /// Read from the server's /metrics at the start and end of the window;
    /// absent when it could not be read. With several nodes in `--url`, the
    /// sum over `nodes` (absent unless every node's could be read).
    pub server: Option<ServerUsage>,
    /// Each node's figures, in `--url` order (only with several nodes).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<NodeUsage>,
    /// The NATS server's figures (`--nats-monitor`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nats: Option<NatsUsage>,
    /// CPU of the whole cluster (every node plus nats-server) per update
    /// delivered to a bot, µs (with `--nats-monitor`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_cpu_us_per_update: Option<f64>,
    pub loadtest: SelfUsage,
    pub errors: BTreeMap<String, u64>,
}

impl LoadReport {
    pub fn new(
        plan: &Plan,
        tally: &Tally,
        server: Option<ServerUsage>,
        processes: u32,
        warnings: Vec<String>,
    ) -> Self {
        let c = &tally.counts;
        let duration_s = plan.duration_ms as f64 / 1_000.0;
        let measured_s = tally.measured_ms as f64 / 1_000.0;
        let per_s = |n: u64| {
            if measured_s > 0.0 {
                n as f64 / measured_s
            } else {
                0.0
            }
        };
        Self {
            failures: failures(plan, tally),
            interrupted: tally.interrupted.clone(),
            warnings,
            url: plan.url(),
            bots: u64::from(plan.bots),
            connected: tally.connected,
            connected_at_start: tally.connected_at_start,
            connected_min: tally.connected_min,
            connect_failures: tally.connect_failures(),
            disconnected: c.disconnected,
            drops: c.drops,
            resumed: c.resumed,
            fresh_rejoins: c.fresh_rejoins,
            rooms: plan.rooms,
            room_size: plan.room_size,
            movement: plan.movement,
            move_interval_ms: plan.move_interval_ms,
            chat_interval_ms: plan.chat_interval_ms,
            warmup_s: plan.warmup_ms as f64 / 1_000.0,
            duration_s,
            measured_s,
            moves_sent: c.moves_sent,
            moves_applied: c.moves_applied,
            moves_per_s: per_s(c.moves_sent),
            updates_expected: c.updates_expected,
            updates_received: c.updates_received,
            updates_per_s: per_s(c.updates_received),
            delivery_rate: (c.updates_expected > 0)
                .then(|| c.updates_received as f64 / c.updates_expected as f64),
            duplicates: c.duplicates,
            latency_ms: Percentiles::of(&tally.latency_histogram()),
            echo_latency_ms: Percentiles::of(&tally.echo_histogram()),
            bytes_in: c.bytes_in,
            bytes_out: c.bytes_out,
            bytes_in_per_s: per_s(c.bytes_in),
            bytes_out_per_s: per_s(c.bytes_out),
            bytes_per_update: if c.updates_received == 0 {
                0.0
            } else {
                c.bytes_in as f64 / c.updates_received as f64
            },
            frames_in: c.frames_in,
            frames_out: c.frames_out,
            chats_sent: c.chats_sent,
            chats_received: c.chats_received,
            interest: (c.in_view_samples > 0 || c.interest_appeared > 0).then(|| Interest {
                due: c.updates_expected,
                delivered: c.updates_received,
                leaked: c.interest_leaked,
                appeared: c.interest_appeared,
                disappeared: c.interest_disappeared,
                in_view_mean: if c.in_view_samples == 0 {
                    0.0
                } else {
                    c.in_view_sum as f64 / c.in_view_samples as f64
                },
                bytes_per_member_per_s: if tally.connected == 0 {
                    0.0
                } else {
                    per_s(c.bytes_in) / tally.connected as f64
                },
            }),
            server,
            nodes: Vec::new(),
            nats: None,
            cluster_cpu_us_per_update: None,
            loadtest: SelfUsage {
                cpu_percent: if measured_s > 0.0 {
                    100.0 * tally.cpu_seconds / measured_s
                } else {
                    0.0
                },
                cpu_us_per_update: (c.updates_received > 0)
                    .then(|| tally.cpu_seconds * 1e6 / c.updates_received as f64),
                rss_bytes: tally.rss_bytes,
                processes,
            },
            errors: tally.errors.clone(),
        }
    }
}

/// One node's server figures.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeUsage {
    pub url: String,
    /// Absent when its /metrics was not read at both ends of the window.
    pub server: Option<ServerUsage>,
}

impl LoadReport {
    /// Adds each node's figures (several nodes: `server` becomes their
    /// sum) and nats-server's, and the whole cluster's CPU per update.
    pub fn with_cluster(mut self, nodes: Vec<NodeUsage>, nats: Option<NatsUsage>) -> Self {
        if nodes.len() > 1 {
            let parts: Option<Vec<ServerUsage>> = nodes.iter().map(|n| n.server.clone()).collect();
            self.server = parts.map(|p| ServerUsage::sum(&p, self.updates_received));
            self.nodes = nodes;
        }
        let nodes_cpu = self.server.as_ref().and_then(|s| s.cpu_seconds);
        self.cluster_cpu_us_per_update = match (&nats, nodes_cpu) {
            (Some(n), Some(cpu)) if self.updates_received > 0 => {
                Some((cpu + n.cpu_seconds) * 1e6 / self.updates_received as f64)
            }
            _ => None,
        };
        self.nats = nats;
        self
    }
}

/// Why a load run failed, from its tally and what its plan tolerates.
fn failures(plan: &Plan, tally: &Tally) -> Vec<String> {
    let bots = tally.bots;
    let tolerate = plan.tolerate;
    let disconnected = tally.counts.disconnected;
    let connect_failures = tally.connect_failures();
    let mut failures = Vec::new();
    if let Some(ms) = tally.all_gone_ms {
        failures.push(format!(
            "every bot was gone {:.1} s into the run, so it stopped early",
            ms as f64 / 1e3
        ));
    }
    if disconnected > 0 && !tolerate.disconnects {
        failures.push(format!(
            "the server disconnected {disconnected} of {bots} bots during the run ({}); \
             --tolerate-disconnects accepts this",
            errors_where(&tally.errors, ErrorKind::is_session_end)
        ));
    }
    if connect_failures > 0 && !tolerate.connect_failures {
        failures.push(format!(
            "{connect_failures} of {bots} bots could not connect or join ({}); \
             --tolerate-connect-failures accepts this",
            errors_where(&tally.errors, |k| {
                ErrorKind::is_connect_failure(k) || k.starts_with("server_")
            })
        ));
    }
    if let Some(min) = tally.connected_min {
        let short = bots.saturating_sub(min);
        let tolerated = if tolerate.disconnects {
            disconnected
        } else {
            0
        } + if tolerate.connect_failures {
            connect_failures
        } else {
            0
        };
        let unexplained = short > disconnected + connect_failures;
        if short > tolerated && (failures.is_empty() || unexplained) {
            failures.push(format!(
                "only {min} of {bots} bots were connected at times during the measured window"
            ));
        }
    }
    failures
}

/// `kind n, kind n` for the errors whose kind `keep` accepts.
fn errors_where(errors: &BTreeMap<String, u64>, keep: impl Fn(&str) -> bool) -> String {
    let kept: BTreeMap<String, u64> = errors
        .iter()
        .filter(|(k, _)| keep(k))
        .map(|(k, v)| (k.clone(), *v))
        .collect();
    errors_line(&kept)
}

/// The lines a report starts with when the run was interrupted, failed or
/// must be read with care: `INTERRUPTED`, then `FAILED`, then `warning`.
pub fn verdict(
    f: &mut fmt::Formatter<'_>,
    interrupted: Option<&str>,
    failures: &[String],
    warnings: &[String],
) -> fmt::Result {
    if let Some(why) = interrupted {
        writeln!(
            f,
            "INTERRUPTED by {why}: the figures below cover what was measured until then"
        )?;
    }
    for failure in failures {
        writeln!(f, "FAILED: {failure}")?;
    }
    for warning in warnings {
        writeln!(f, "warning: {warning}")?;
    }
    Ok(())
}

/// `1.2 MB`, `640 B` (decimal units: 1 kB is 1,000 bytes), in the status
/// lines and the reports alike.
pub fn bytes(n: f64) -> String {
    match n {
        n if n >= 1e9 => format!("{:.2} GB", n / 1e9),
        n if n >= 1e6 => format!("{:.2} MB", n / 1e6),
        n if n >= 1e3 => format!("{:.1} kB", n / 1e3),
        n => format!("{n:.0} B"),
    }
}

fn opt<T>(v: Option<T>, f: impl FnOnce(T) -> String) -> String {
    v.map(f).unwrap_or_else(|| "n/a".into())
}

impl fmt::Display for Percentiles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "p50 {:.2}  p90 {:.2}  p99 {:.2}  p99.9 {:.2}  max {:.2}",
            self.p50, self.p90, self.p99, self.p999, self.max
        )
    }
}

/// Errors as `kind n, kind n` or `none`.
pub fn errors_line(errors: &BTreeMap<String, u64>) -> String {
    if errors.is_empty() {
        return "none".into();
    }
    errors
        .iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `cpu 45.0% of a core (1.20 µs per update), rss 20 MB (5.5 kB per connection)`.
fn server_figures(s: &ServerUsage) -> String {
    format!(
        "cpu {} of a core ({} µs per update), rss {} ({} per connection)",
        opt(s.cpu_percent, |p| format!("{p:.1}%")),
        opt(s.cpu_us_per_update, |u| format!("{u:.2}")),
        opt(s.rss_bytes, |b| bytes(b as f64)),
        opt(s.rss_bytes_per_connection, bytes),
    )
}

/// A node's (or the nodes' summed) NATS traffic and remote moves.
fn cluster_figures(c: &ClusterUsage) -> String {
    format!(
        "NATS published {} messages ({}), received {} ({}); remote moves {}, slipped a tick: {}; \
         resyncs {}, drops {}",
        c.messages_published,
        bytes(c.bytes_published as f64),
        c.messages_received,
        bytes(c.bytes_received as f64),
        c.remote_moves,
        opt(c.remote_moves_late_percent, |p| format!("{p:.2}%")),
        c.resyncs,
        c.dropped,
    )
}

impl fmt::Display for LoadReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let movement = match self.movement {
            Movement::Walk => "walk",
            Movement::Wander => "wander",
        };
        verdict(
            f,
            self.interrupted.as_deref(),
            &self.failures,
            &self.warnings,
        )?;
        let measured = if self.measured_s + 0.05 < self.duration_s {
            format!("{:.1} s of {:.0} s", self.measured_s, self.duration_s)
        } else {
            format!("{:.0} s", self.duration_s)
        };
        writeln!(
            f,
            "amble load test: {} bots in {} rooms of up to {}, {movement}, a move every {:.1} s{}, \
             {measured} measured after {:.0} s warm-up ({})",
            self.bots,
            self.rooms,
            self.room_size,
            self.move_interval_ms as f64 / 1_000.0,
            opt(self.chat_interval_ms, |ms| format!(
                ", a chat every {:.1} s",
                ms as f64 / 1e3
            ))
            .replace("n/a", ""),
            self.warmup_s,
            self.url,
        )?;
        writeln!(
            f,
            "  connected     {} of {} at the end ({} at window start, {} at the fewest), \
             {} failed to connect, {} disconnected",
            self.connected,
            self.bots,
            self.connected_at_start,
            opt(self.connected_min, |n| n.to_string()),
            self.connect_failures,
            self.disconnected
        )?;
        if self.drops > 0 {
            writeln!(
                f,
                "  drops         {} dropped on purpose ({:.1}/s), {} resumed their place, {} joined afresh",
                self.drops,
                self.drops as f64 / self.measured_s.max(f64::MIN_POSITIVE),
                self.resumed,
                self.fresh_rejoins
            )?;
        }
        writeln!(
            f,
            "  moves         {} sent ({:.0}/s), {} applied by the server",
            self.moves_sent, self.moves_per_s, self.moves_applied
        )?;
        match self.delivery_rate {
            Some(rate) => writeln!(
                f,
                "  delivery      {:.4}%: {} of {} updates received ({:.0}/s), {} duplicates",
                rate * 100.0,
                self.updates_received,
                self.updates_expected,
                self.updates_per_s,
                self.duplicates
            )?,
            None => writeln!(
                f,
                "  delivery      n/a: no update was expected ({} received, {} duplicates)",
                self.updates_received, self.duplicates
            )?,
        }
        writeln!(f, "  latency ms    {}", self.latency_ms)?;
        writeln!(
            f,
            "  echo ms       {}  (own move back at its sender)",
            self.echo_latency_ms
        )?;
        writeln!(
            f,
            "  bandwidth     in {} ({}/s, {:.1} B per update), out {} ({}/s)",
            bytes(self.bytes_in as f64),
            bytes(self.bytes_in_per_s),
            self.bytes_per_update,
            bytes(self.bytes_out as f64),
            bytes(self.bytes_out_per_s)
        )?;
        if self.chats_sent > 0 || self.chats_received > 0 {
            writeln!(
                f,
                "  chat          {} sent, {} received",
                self.chats_sent, self.chats_received
            )?;
        }
        if let Some(i) = &self.interest {
            writeln!(
                f,
                "  interest      {:.1} members in view on average, {} per member per second; \
                 {} leaked, {} appeared, {} disappeared",
                i.in_view_mean,
                bytes(i.bytes_per_member_per_s),
                i.leaked,
                i.appeared,
                i.disappeared
            )?;
        }
        let together = if self.nodes.is_empty() {
            String::new()
        } else {
            format!("{} nodes together: ", self.nodes.len())
        };
        match &self.server {
            Some(s) => writeln!(f, "  server        {together}{}", server_figures(s))?,
            None if self.nodes.is_empty() => writeln!(
                f,
                "  server        n/a: /metrics was not read at both ends of the window"
            )?,
            None => writeln!(
                f,
                "  server        n/a: the /metrics of every node was not read at both ends of \
                 the window"
            )?,
        }
        for (k, node) in self.nodes.iter().enumerate() {
            let label = format!("node {}", k + 1);
            match &node.server {
                Some(s) => {
                    writeln!(
                        f,
                        "  {label:<14}{}: {} connections, {}, sent {} in {} frames",
                        node.url,
                        opt(s.connections, |n| n.to_string()),
                        server_figures(s),
                        opt(s.bytes_sent, |b| bytes(b as f64)),
                        opt(s.frames_sent, |n| n.to_string()),
                    )?;
                    if let Some(c) = &s.cluster {
                        writeln!(f, "  {:<14}{}", "", cluster_figures(c))?;
                    }
                }
                None => writeln!(
                    f,
                    "  {label:<14}{}: n/a: /metrics was not read at both ends of the window",
                    node.url
                )?,
            }
        }
        if let Some(c) = self.server.as_ref().and_then(|s| s.cluster.as_ref()) {
            writeln!(f, "  cluster       {}", cluster_figures(c))?;
        }
        if let Some(n) = &self.nats {
            writeln!(
                f,
                "  nats-server   cpu {:.1}% of a core ({:.2} s), mem {} (peak {}), in {} messages \
                 ({}), out {} messages ({})",
                n.cpu_percent,
                n.cpu_seconds,
                bytes(n.mem_bytes as f64),
                bytes(n.mem_peak_bytes as f64),
                n.in_msgs,
                bytes(n.in_bytes as f64),
                n.out_msgs,
                bytes(n.out_bytes as f64),
            )?;
        }
        if let Some(us) = self.cluster_cpu_us_per_update {
            let part = |cpu: Option<f64>| {
                opt(cpu.filter(|_| self.updates_received > 0), |c| {
                    format!("{:.2}", c * 1e6 / self.updates_received as f64)
                })
            };
            writeln!(
                f,
                "  whole cluster cpu {us:.2} µs per delivered update (nodes {} + nats-server {})",
                part(self.server.as_ref().and_then(|s| s.cpu_seconds)),
                part(self.nats.as_ref().map(|n| n.cpu_seconds)),
            )?;
        }
        writeln!(
            f,
            "  loadtest      cpu {:.1}% of a core ({} µs per update), rss {}, {} process{}",
            self.loadtest.cpu_percent,
            opt(self.loadtest.cpu_us_per_update, |u| format!("{u:.2}")),
            bytes(self.loadtest.rss_bytes as f64),
            self.loadtest.processes,
            if self.loadtest.processes == 1 {
                ""
            } else {
                "es"
            }
        )?;
        write!(f, "  errors        {}", errors_line(&self.errors))
    }
}
