//! The sweep scenario: latency against room size. One room at a time, every
//! member moving at the plan's interval; for each size the deliveries and
//! their latency, as a table.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::load::{self, Control};
use crate::plan::{Plan, run_tag};
use crate::report::{LoadReport, Percentiles, verdict};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SweepRow {
    pub room_size: u32,
    pub bots: u64,
    pub connected: u64,
    pub moves_sent: u64,
    pub updates_expected: u64,
    pub updates_received: u64,
    /// `None` when nothing was expected (a lone bot).
    pub delivery_rate: Option<f64>,
    pub duplicates: u64,
    pub latency_ms: Percentiles,
    pub echo_latency_ms: Percentiles,
    pub bytes_per_update: f64,
    pub server_cpu_percent: Option<f64>,
    pub errors: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SweepReport {
    /// Why the sweep failed, room size by room size (empty: it did not).
    pub failures: Vec<String>,
    /// Why the sweep was interrupted, if it was (the rows measured so far
    /// follow).
    pub interrupted: Option<String>,
    pub warnings: Vec<String>,
    pub url: String,
    pub move_interval_ms: u64,
    pub duration_s_per_size: f64,
    pub rows: Vec<SweepRow>,
}

impl SweepRow {
    fn of(size: u32, r: &LoadReport) -> Self {
        Self {
            room_size: size,
            bots: r.bots,
            connected: r.connected,
            moves_sent: r.moves_sent,
            updates_expected: r.updates_expected,
            updates_received: r.updates_received,
            delivery_rate: r.delivery_rate,
            duplicates: r.duplicates,
            latency_ms: r.latency_ms,
            echo_latency_ms: r.echo_latency_ms,
            bytes_per_update: r.bytes_per_update,
            server_cpu_percent: r.server.as_ref().and_then(|s| s.cpu_percent),
            errors: r.errors.values().sum(),
        }
    }
}

const HEADER: &str = "room size    moves  delivered   expected  delivery   p50 ms   p99 ms  echo p50  echo p99  server cpu  errors";

impl fmt::Display for SweepRow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let na = |v: f64, empty: bool| {
            if empty {
                "-".to_string()
            } else {
                format!("{v:.2}")
            }
        };
        let none = self.updates_received == 0;
        let no_echo = self.moves_sent == 0;
        write!(
            f,
            "{:>9} {:>8} {:>10} {:>10} {:>9} {:>8} {:>8} {:>9} {:>9} {:>11} {:>7}",
            self.room_size,
            self.moves_sent,
            self.updates_received,
            self.updates_expected,
            self.delivery_rate
                .map_or("-".into(), |r| format!("{:.3}%", r * 100.0)),
            na(self.latency_ms.p50, none),
            na(self.latency_ms.p99, none),
            na(self.echo_latency_ms.p50, no_echo),
            na(self.echo_latency_ms.p99, no_echo),
            self.server_cpu_percent
                .map_or("n/a".into(), |p| format!("{p:.1}%")),
            self.errors,
        )
    }
}

/// Runs one room per size in `sizes`, each for `per_size`.
pub async fn run(
    base: &Plan,
    sizes: &[u32],
    per_size: Duration,
    ctl: &Control,
) -> anyhow::Result<SweepReport> {
    anyhow::ensure!(!sizes.is_empty(), "--sweep-sizes is empty");
    anyhow::ensure!(
        sizes.iter().all(|&s| s <= 10_000),
        "sweep room sizes stop at 10000"
    );
    if !ctl.quiet {
        eprintln!("{HEADER}");
    }
    let mut rows = Vec::with_capacity(sizes.len());
    let (mut failures, mut warnings, mut interrupted) = (Vec::new(), Vec::new(), None);
    for (i, &size) in sizes.iter().enumerate() {
        if let Some(why) = ctl.stop.reason() {
            interrupted = Some(why.to_string());
            break;
        }
        // Size 0 runs a lone bot: no receivers, only its echo.
        let bots = size.max(1);
        let plan = Plan {
            bots,
            rooms: 1,
            room_size: bots,
            duration_ms: u64::try_from(per_size.as_millis()).unwrap_or(u64::MAX),
            warmup_ms: base.move_interval_ms.max(1_000),
            ramp_per_s: base.ramp_per_s.max(1_000),
            processes: 1,
            run_tag: run_tag(),
            start_unix_ms: 0,
            room_range: 0..1,
            ..base.clone()
        };
        // The server was fresh (or not) before the first size; the
        // sizes after it find the connections of the sizes before.
        let size_ctl = Control {
            quiet: true,
            check_fresh: i == 0,
            ..ctl.clone()
        };
        let report = load::alone(plan, &size_ctl).await?;
        let row = SweepRow::of(size, &report);
        if !ctl.quiet {
            eprintln!("{row}");
        }
        rows.push(row);
        failures.extend(
            report
                .failures
                .iter()
                .map(|f| format!("room size {size}: {f}")),
        );
        warnings.extend(report.warnings);
        if let Some(why) = report.interrupted {
            interrupted = Some(why);
            break;
        }
    }
    Ok(SweepReport {
        failures,
        interrupted,
        warnings,
        url: base.url(),
        move_interval_ms: base.move_interval_ms,
        duration_s_per_size: per_size.as_secs_f64(),
        rows,
    })
}

impl fmt::Display for SweepReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        verdict(
            f,
            self.interrupted.as_deref(),
            &self.failures,
            &self.warnings,
        )?;
        writeln!(
            f,
            "amble sweep: one room at a time, every member moving every {:.1} s, {:.0} s per size ({})",
            self.move_interval_ms as f64 / 1e3,
            self.duration_s_per_size,
            self.url
        )?;
        write!(f, "{HEADER}")?;
        for row in &self.rows {
            write!(f, "\n{row}")?;
        }
        Ok(())
    }
}
