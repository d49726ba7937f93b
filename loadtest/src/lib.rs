//! `loadtest`: amble's bot load tester. It spawns thousands of bots that
//! join rooms and move the way people do, and measures what a person checks
//! before putting amble in front of users: bandwidth, delivery rate and
//! latency, and what the server spent (read from its `/metrics`).
//!
//! # Layout
//!
//! A run flows plan -> bots -> ledger -> report. Linked modules are public
//! (the binary and the tests use them); the rest are private.
//!
//! - `opts`: command-line options, presets, their resolution into a plan.
//! - [`plan`]: the resolved plan (shared with child processes as JSON), how
//!   bots move, the target URL, the schedule (ramp, warm-up, window, drain).
//! - `wire`: connecting from a chosen source address; frame byte counts.
//! - `bot/`: one bot's task: what a process's bots share, joining (in
//!   `mod.rs`), the joined bot's loop (`session`), its moves (`mover`).
//! - `ledger/`: delivery accounting, without I/O or clock: a receiver's
//!   view (in `mod.rs`), a sender's trail of recent moves (`trail`).
//! - `stats`: per-thread counters and histograms; the mergeable tally.
//! - `load`: the engine, and running it alone, as parent or as child.
//! - `rpc`, `sweep`: the other two scenarios.
//! - [`scrape`]: each node's `/metrics`; `varz`: the NATS server's
//!   `/varz`; `usage`: this process's CPU and memory.
//! - `limits`: open files, raised at start; [`stop`]: Ctrl-C, SIGTERM;
//!   `random`: the seedable generator each bot owns.
//! - `report`, `console`: what is printed at the end and meanwhile.
//!
//! No import cycle: `plan` imports only `limits` and `random`; `bot`
//! imports `plan`, `random`, `wire`, `ledger` and `stats`; `report` imports
//! `plan`, `stats`, `scrape` and `varz`, never a bot; `ledger`, `stats`,
//! `random`, `limits`, `usage` and `stop` import nothing of the crate; the
//! scenarios (`load`, `rpc`, `sweep`) and `console` sit on top.
//!
//! Measuring must not bend the result: one multi-threaded runtime, one task
//! per bot, histograms per thread merged when read, no lock shared by all
//! bots on the receive path, every network wait under a timeout and every
//! run bounded by its schedule.

mod bot;
mod console;
mod ledger;
mod limits;
mod load;
mod opts;
pub mod plan;
mod random;
mod report;
mod rpc;
pub mod scrape;
mod stats;
pub mod stop;
mod sweep;
mod usage;
mod varz;
mod wire;

use std::fmt;

use anyhow::Context as _;
use serde::Serialize;

pub use load::Unreachable;
pub use opts::Opts;
pub use report::LoadReport;
pub use rpc::RpcReport;
pub use stop::Stop;
pub use sweep::SweepReport;

/// The report of any scenario.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged)]
#[allow(clippy::large_enum_variant, reason = "one report per run")]
pub enum Report {
    Load(LoadReport),
    Rpc(RpcReport),
    Sweep(SweepReport),
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Report::Load(r) => r.fmt(f),
            Report::Rpc(r) => r.fmt(f),
            Report::Sweep(r) => r.fmt(f),
        }
    }
}

impl Report {
    /// Why the run failed (empty: it did not).
    pub fn failures(&self) -> &[String] {
        match self {
            Report::Load(r) => &r.failures,
            Report::Rpc(r) => &r.failures,
            Report::Sweep(r) => &r.failures,
        }
    }

    /// Why the run was interrupted, if it was.
    pub fn interrupted(&self) -> Option<&str> {
        match self {
            Report::Load(r) => r.interrupted.as_deref(),
            Report::Rpc(r) => r.interrupted.as_deref(),
            Report::Sweep(r) => r.interrupted.as_deref(),
        }
    }

    /// The thresholds given on the command line that this report misses.
    pub fn missed(&self, opts: &Opts) -> Vec<String> {
        let mut missed = Vec::new();
        // `delivery`: `None` when the scenario has none, `Some(None)` when
        // nothing was expected.
        let mut check = |what: &str, delivery: Option<Option<f64>>, p99: Option<f64>| {
            match (opts.min_delivery, delivery) {
                (Some(min), Some(Some(rate))) if rate < min => missed.push(format!(
                    "{what}delivery rate {rate:.6} is below --min-delivery {min}"
                )),
                (Some(min), Some(None)) => missed.push(format!(
                    "{what}no update was expected, so --min-delivery {min} cannot be met"
                )),
                _ => {}
            }
            if let (Some(max), Some(p99)) = (opts.max_p99_ms, p99)
                && p99 > max
            {
                missed.push(format!(
                    "{what}p99 latency {p99:.2} ms is above --max-p99-ms {max}"
                ));
            }
        };
        match self {
            Report::Load(r) => check("", Some(r.delivery_rate), Some(r.latency_ms.p99)),
            Report::Rpc(r) => check("", None, Some(r.latency_ms.p99)),
            Report::Sweep(r) => {
                for row in &r.rows {
                    let p99 = (row.updates_received > 0).then_some(row.latency_ms.p99);
                    // A lone bot (size 0) expects nothing: no delivery rate.
                    let delivery = (row.room_size > 0).then_some(row.delivery_rate);
                    check(&format!("room size {}: ", row.room_size), delivery, p99);
                }
            }
        }
        missed
    }
}

/// Runs the scenario `opts` asks for until its end or `stop`. Child mode
/// (`--child`) is [`run_child`]; `--processes` above 1 re-executes
/// `child_exe` (this binary when `None`). Raises this process's soft limit
/// on open files to the hard limit first.
pub async fn run_with(
    opts: &Opts,
    child_exe: Option<std::path::PathBuf>,
    stop: Stop,
) -> anyhow::Result<Report> {
    let files = limits::raise();
    let plan = opts.plan_with(files)?;
    let ctl = load::Control {
        quiet: opts.quiet,
        status_every: opts.status_every,
        stop,
        check_fresh: true,
        nats_monitor: opts
            .nats_monitor
            .as_deref()
            .map(|url| varz::Monitor::parse(url, opts.allow_remote))
            .transpose()?,
    };
    match opts.scenario {
        opts::Scenario::Load if plan.processes > 1 => {
            let exe = match child_exe {
                Some(exe) => exe,
                None => std::env::current_exe().context("locating this binary to re-execute")?,
            };
            if opts.processes.is_none()
                && let Some(files) = files
            {
                eprintln!(
                    "note: {} bots run in {} processes: one may open {} files (`ulimit -n`)",
                    plan.bots, plan.processes, files.soft
                );
            }
            Ok(Report::Load(load::parent(plan, exe, &ctl).await?))
        }
        opts::Scenario::Load => Ok(Report::Load(load::alone(plan, &ctl).await?)),
        opts::Scenario::Rpc => Ok(Report::Rpc(
            rpc::run(&plan, opts.clients, opts.round_trips, &ctl).await?,
        )),
        opts::Scenario::Sweep => Ok(Report::Sweep(
            sweep::run(&plan, &opts.sweep_sizes, opts.sweep_duration, &ctl).await?,
        )),
    }
}

/// Runs the scenario `opts` asks for, in this process (children of
/// `--processes` are this binary), to its end.
pub async fn run(opts: Opts) -> anyhow::Result<Report> {
    run_with(&opts, None, Stop::new()).await
}

/// Child mode: `plan_json` is the plan the parent resolved; `stop` fires
/// when the parent closes this process's stdin (or on a signal).
pub async fn run_child(plan_json: &str, stop: &Stop) -> anyhow::Result<()> {
    let plan: plan::Plan = serde_json::from_str(plan_json).context("reading the parent's plan")?;
    load::child(plan, stop).await
}
