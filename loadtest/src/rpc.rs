//! The rpc scenario: request/reply throughput. N clients each make M
//! sequential Ping → Pong round trips as fast as the server answers; the
//! report gives the total time, round trips per second and latency.
//!
//! The server's ping budget (`--pings-per-sec`, on by default) stops such
//! a flood by design: when it does (an `Error` RATE_LIMITED or FLOOD, or
//! close 1008), the run fails and says to start the server with
//! `--pings-per-sec 0` for this benchmark.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use amble::protocol::{self, ErrorCode, pb};
use futures_util::{SinkExt as _, StreamExt as _};
use prost::Message as _;
use serde::{Deserialize, Serialize};
use tokio::task::JoinSet;
use tokio::time::timeout;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

use crate::console::{Console, Status};
use crate::load::{Control, probe};
use crate::plan::{Plan, unix_ms};
use crate::report::{Percentiles, SelfUsage, bytes, errors_line, verdict};
use crate::scrape::{self, ServerUsage};
use crate::stats::{AtomicCounts, ErrorKind, Stats};
use crate::{usage, wire};

/// Bound on one round trip.
const PONG_TIMEOUT: Duration = Duration::from_secs(5);

/// What the report says when the server's ping budget stopped the run.
pub const PING_BUDGET: &str = "the server's ping budget stopped the rpc scenario: start the \
     server with --pings-per-sec 0 (or AMBLE_PINGS_PER_SEC=0) for this benchmark";

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RpcReport {
    /// Why the run failed (empty: it did not).
    pub failures: Vec<String>,
    /// Why the run was interrupted, if it was.
    pub interrupted: Option<String>,
    pub warnings: Vec<String>,
    pub url: String,
    pub clients: u32,
    pub connected: u32,
    pub round_trips_per_client: u32,
    /// Round trips completed, all clients.
    pub round_trips: u64,
    pub total_s: f64,
    pub round_trips_per_s: f64,
    pub latency_ms: Percentiles,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub server: Option<ServerUsage>,
    pub loadtest: SelfUsage,
    pub errors: BTreeMap<String, u64>,
}

struct Client {
    bytes_in: u64,
    bytes_out: u64,
}

/// Runs `clients` clients of `round_trips` round trips each.
pub async fn run(
    plan: &Plan,
    clients: u32,
    round_trips: u32,
    ctl: &Control,
) -> anyhow::Result<RpcReport> {
    anyhow::ensure!(
        (1..=10_000).contains(&clients),
        "--clients must be 1..=10000"
    );
    let probe = probe(&plan.target, ctl.check_fresh).await?;
    let before = probe.before;
    let addr = plan.target.resolve().await?;
    let stats = Arc::new(Stats::default());
    // Set when the server's ping budget refuses a ping, or when the run is
    // stopped: every client stops at its next round trip.
    let budget = Arc::new(AtomicBool::new(false));
    let halt = Arc::new(AtomicBool::new(false));

    // Connect everyone first, so the timed part is round trips only.
    let mut sockets = Vec::new();
    for i in 0..clients {
        let source = (!plan.source_addrs.is_empty())
            .then(|| std::net::IpAddr::V4(plan.source_addrs[i as usize % plan.source_addrs.len()]));
        match wire::connect(&plan.target, addr, source).await {
            Ok(ws) => sockets.push(ws),
            Err((kind, _)) => stats.with(|s| s.error(kind, 1)),
        }
    }
    let connected = sockets.len() as u32;
    let start_sample = match before {
        Some(_) => scrape::scrape(&plan.target).await.ok(),
        None => None,
    };
    let cpu_start = usage::cpu_seconds().unwrap_or(0.0);
    let started = Instant::now();

    let mut tasks = JoinSet::new();
    for mut ws in sockets {
        let stats = stats.clone();
        let (budget, halt) = (budget.clone(), halt.clone());
        tasks.spawn(async move {
            let mut client = Client {
                bytes_in: 0,
                bytes_out: 0,
            };
            let mut msg = pb::ServerMessage::default();
            'trips: for _ in 0..round_trips {
                if budget.load(Ordering::Relaxed) || halt.load(Ordering::Relaxed) {
                    break;
                }
                let ping = protocol::encode_client(pb::client_message::Body::Ping(pb::Ping {
                    client_time_ms: unix_ms(SystemTime::now()),
                }));
                client.bytes_out += wire::frame_bytes(ping.len(), true);
                let sent = Instant::now();
                if timeout(PONG_TIMEOUT, ws.send(Message::Binary(ping.into())))
                    .await
                    .map_or(true, |r| r.is_err())
                {
                    stats.with(|s| s.error(ErrorKind::SendFailed, 1));
                    break;
                }
                let deadline = tokio::time::Instant::from_std(sent + PONG_TIMEOUT);
                loop {
                    let frame = match tokio::time::timeout_at(deadline, ws.next()).await {
                        Err(_) => {
                            stats.with(|s| s.error(ErrorKind::ReadFailed, 1));
                            break 'trips;
                        }
                        Ok(Some(Ok(Message::Binary(b)))) => b,
                        Ok(Some(Ok(Message::Ping(p)))) => {
                            client.bytes_in += wire::frame_bytes(p.len(), false);
                            client.bytes_out += wire::frame_bytes(p.len(), true);
                            continue;
                        }
                        Ok(Some(Ok(Message::Close(Some(close)))))
                            if close.code == CloseCode::Policy =>
                        {
                            budget.store(true, Ordering::Relaxed);
                            stats.with(|s| s.error(ErrorKind::Closed, 1));
                            break 'trips;
                        }
                        Ok(Some(Ok(_))) => continue,
                        Ok(None | Some(Err(_))) => {
                            stats.with(|s| s.error(ErrorKind::Closed, 1));
                            break 'trips;
                        }
                    };
                    client.bytes_in += wire::frame_bytes(frame.len(), false);
                    msg.clear();
                    if msg.merge(&frame[..]).is_err() {
                        stats.with(|s| s.error(ErrorKind::Decode, 1));
                        continue;
                    }
                    match msg.body.take() {
                        Some(pb::server_message::Body::Pong(_)) => break,
                        Some(pb::server_message::Body::Error(e)) => {
                            stats.with(|s| s.server_error(e.code));
                            if is_budget(e.code) {
                                budget.store(true, Ordering::Relaxed);
                                break 'trips;
                            }
                        }
                        _ => {}
                    }
                }
                let rtt = u64::try_from(sent.elapsed().as_micros())
                    .unwrap_or(u64::MAX)
                    .max(1);
                stats.with(|s| {
                    AtomicCounts::bump(&s.counts.round_trips, 1);
                    s.latencies().rpc.saturating_record(rtt);
                });
            }
            let _ = timeout(Duration::from_secs(2), ws.close(None)).await;
            client
        });
    }

    // Status while the round trips run; bounded by the per-trip timeouts.
    let mut console = Console::new(ctl.quiet, None, u64::from(clients), ctl.status_every);
    let stopped = ctl.stop.stopped();
    tokio::pin!(stopped);
    let mut interrupted = None;
    let mut ticker = tokio::time::interval(Duration::from_millis(250));
    let mut totals = Client {
        bytes_in: 0,
        bytes_out: 0,
    };
    let mut finished = None;
    loop {
        tokio::select! {
            done = tasks.join_next() => match done {
                Some(Ok(c)) => {
                    totals.bytes_in += c.bytes_in;
                    totals.bytes_out += c.bytes_out;
                }
                Some(Err(_)) => {}
                None => break,
            },
            why = &mut stopped, if interrupted.is_none() => {
                interrupted = Some(why.to_string());
                halt.store(true, Ordering::Relaxed);
            }
            _ = ticker.tick() => {
                let counts = stats.counts();
                let h = stats.merged(|l| &l.rpc);
                console.show(&Status {
                    bots: u64::from(clients),
                    attempted: u64::from(clients),
                    connected: u64::from(connected),
                    round_trips: counts.round_trips.max(1),
                    p99_ms: (!h.is_empty()).then(|| h.value_at_quantile(0.99) as f64 / 1e3),
                    errors: stats.errors().values().sum(),
                    ..Status::default()
                });
            }
        }
        if tasks.is_empty() && finished.is_none() {
            finished = Some(started.elapsed());
        }
    }
    let total = finished.unwrap_or_else(|| started.elapsed());
    let cpu = usage::cpu_seconds().unwrap_or(0.0) - cpu_start;
    let end_sample = match start_sample {
        Some(_) => scrape::scrape(&plan.target).await.ok(),
        None => None,
    };
    let counts = stats.counts();
    let total_s = total.as_secs_f64();
    let mut failures = Vec::new();
    if budget.load(Ordering::Relaxed) {
        failures.push(PING_BUDGET.to_string());
    }
    if connected < clients {
        failures.push(format!(
            "{} of {clients} clients could not connect",
            clients - connected
        ));
    }
    let mut warnings = probe.warnings;
    if start_sample.is_some() && end_sample.is_none() {
        warnings.push("the server's /metrics stopped answering during the run".into());
    }
    let server = match (&start_sample, &end_sample) {
        (Some(a), Some(b)) => Some(ServerUsage::between(
            before.as_ref(),
            a,
            b,
            counts.round_trips,
        )),
        _ => None,
    };
    Ok(RpcReport {
        failures,
        interrupted,
        warnings,
        url: plan.target.url.clone(),
        clients,
        connected,
        round_trips_per_client: round_trips,
        round_trips: counts.round_trips,
        total_s,
        round_trips_per_s: if total_s > 0.0 {
            counts.round_trips as f64 / total_s
        } else {
            0.0
        },
        latency_ms: Percentiles::of(&stats.merged(|l| &l.rpc)),
        bytes_in: totals.bytes_in,
        bytes_out: totals.bytes_out,
        server,
        loadtest: SelfUsage {
            cpu_percent: if total_s > 0.0 {
                100.0 * cpu / total_s
            } else {
                0.0
            },
            cpu_us_per_update: (counts.round_trips > 0)
                .then(|| cpu * 1e6 / counts.round_trips as f64),
            rss_bytes: usage::rss_bytes().unwrap_or(0),
            processes: 1,
        },
        errors: stats.errors(),
    })
}

/// Whether a server error code is its budget refusing a ping.
fn is_budget(code: i32) -> bool {
    [ErrorCode::RateLimited, ErrorCode::Flood]
        .iter()
        .any(|&c| c as i32 == code)
}

impl fmt::Display for RpcReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        verdict(
            f,
            self.interrupted.as_deref(),
            &self.failures,
            &self.warnings,
        )?;
        writeln!(
            f,
            "amble rpc: {} clients x {} sequential Ping/Pong round trips ({})",
            self.clients, self.round_trips_per_client, self.url
        )?;
        writeln!(f, "  connected     {} of {}", self.connected, self.clients)?;
        writeln!(
            f,
            "  round trips   {} in {:.2} s: {:.0} per second",
            self.round_trips, self.total_s, self.round_trips_per_s
        )?;
        writeln!(f, "  latency ms    {}", self.latency_ms)?;
        writeln!(
            f,
            "  bandwidth     in {}, out {}",
            bytes(self.bytes_in as f64),
            bytes(self.bytes_out as f64)
        )?;
        if let Some(s) = &self.server {
            writeln!(
                f,
                "  server        cpu {} of a core ({} µs per round trip)",
                s.cpu_percent.map_or("n/a".into(), |p| format!("{p:.1}%")),
                s.cpu_us_per_update
                    .map_or("n/a".into(), |u| format!("{u:.2}")),
            )?;
        }
        writeln!(
            f,
            "  loadtest      cpu {:.1}% of a core",
            self.loadtest.cpu_percent
        )?;
        write!(f, "  errors        {}", errors_line(&self.errors))
    }
}
