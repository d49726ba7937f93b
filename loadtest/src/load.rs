//! The load scenario: the engine that runs one process's bots to the
//! schedule, and the three ways to drive it: alone, as a child of
//! `--processes`, and as the parent that spawns the children.
//!
//! The parent re-executes this binary with the resolved plan (whole rooms
//! each, one wall-clock start for all), reads their status and tally lines
//! from their stdout, reads the server's metrics once for the whole window
//! and merges the tallies (counters summed, histograms merged).

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context as _, bail};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::task::JoinSet;
use tokio::time::{sleep_until, timeout};

use crate::bot::{self, Run};
use crate::console::{Console, Status};
use crate::plan::{Plan, Schedule, Target, unix_ms};
use crate::report::LoadReport;
use crate::scrape::{self, Sample, ServerUsage};
use crate::stats::{HistogramBuckets, Tally};
use crate::usage;

/// How often the engine reports its status.
const STATUS_EVERY: Duration = Duration::from_millis(250);
/// Bound on the bots' closing after the drain.
const CLOSE_GRACE: Duration = Duration::from_secs(5);
/// Time the parent gives its children to start before the schedule begins.
const CHILD_START: Duration = Duration::from_millis(1_500);

/// The server could not be reached: nothing to measure.
#[derive(Debug)]
pub struct Unreachable {
    pub url: String,
    pub cause: String,
}

impl std::fmt::Display for Unreachable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "cannot reach the amble server at {} ({}).\n\
             Start it first: `cargo run --release` in the repo (it listens on 127.0.0.1:3000), \
             or pass --url.",
            self.url, self.cause
        )
    }
}

impl std::error::Error for Unreachable {}

/// Checks the server answers, and reads its metrics before any bot
/// connects (`None` if /metrics cannot be read: the run goes on).
pub async fn probe(target: &Target, console: &Console) -> anyhow::Result<Option<Sample>> {
    let addr = target.resolve().await?;
    let unreachable = |cause: String| Unreachable {
        url: target.url.clone(),
        cause,
    };
    match timeout(Duration::from_secs(3), tokio::net::TcpStream::connect(addr)).await {
        Err(_) => return Err(unreachable("connect timed out".into()).into()),
        Ok(Err(e)) => return Err(unreachable(e.to_string()).into()),
        Ok(Ok(_)) => {}
    }
    match scrape::scrape(target).await {
        Ok(sample) => Ok(Some(sample)),
        Err(e) => {
            console.note(&format!(
                "warning: server metrics not available ({e:#}); no server figures"
            ));
            Ok(None)
        }
    }
}

/// Runs this process's bots to the schedule; calls `on_status` a few times
/// a second; returns the tally read when the drain ends.
pub async fn engine(run: Arc<Run>, mut on_status: impl FnMut(&Status)) -> Tally {
    let schedule = run.schedule;
    let mut bots = JoinSet::new();
    for room in run.plan.room_range.clone() {
        for index in run.plan.bots_in_room(room) {
            bots.spawn(bot::run(run.clone(), index, room));
        }
    }
    let mut ticker = tokio::time::interval(STATUS_EVERY);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let (mut cpu_start, mut cpu_end, mut rss) = (None, None, 0);
    let (mut connected_at_start, mut connected) = (0, 0);
    let connected_now = || {
        run.stats
            .gauges
            .connected
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    let drain = sleep_until(schedule.drain_end.into());
    tokio::pin!(drain);
    loop {
        tokio::select! {
            biased;
            () = &mut drain => break,
            () = sleep_until(schedule.window_start.into()), if cpu_start.is_none() => {
                cpu_start = usage::cpu_seconds().or(Some(0.0));
                connected_at_start = connected_now();
            }
            () = sleep_until(schedule.window_end.into()), if cpu_end.is_none() => {
                cpu_end = usage::cpu_seconds().or(Some(0.0));
                rss = usage::rss_bytes().unwrap_or(0);
                connected = connected_now();
            }
            _ = ticker.tick() => on_status(&Status::of(&run)),
        }
    }
    on_status(&Status::of(&run));
    let tally = Tally {
        bots: u64::from(run.plan.local_bots()),
        connected_at_start,
        connected,
        counts: run.stats.counts(),
        errors: run.stats.errors(),
        latency: HistogramBuckets::of(&run.stats.merged(|l| &l.window)),
        echo_latency: HistogramBuckets::of(&run.stats.merged(|l| &l.echo)),
        cpu_seconds: match (cpu_start, cpu_end) {
            (Some(a), Some(b)) => (b - a).max(0.0),
            _ => 0.0,
        },
        rss_bytes: rss,
    };
    // Bots close on their own at the drain's end; bound the wait.
    if timeout(CLOSE_GRACE, async {
        while bots.join_next().await.is_some() {}
    })
    .await
    .is_err()
    {
        bots.abort_all();
    }
    tally
}

/// Reads the server's metrics at the window's start and end.
async fn scrape_window(target: &Target, schedule: Schedule) -> Option<(Sample, Sample)> {
    sleep_until(schedule.window_start.into()).await;
    let start = scrape::scrape(target).await.ok()?;
    sleep_until(schedule.window_end.into()).await;
    let end = scrape::scrape(target).await.ok()?;
    Some((start, end))
}

/// Runs the whole plan in this process.
pub async fn alone(plan: Plan, quiet: bool) -> anyhow::Result<LoadReport> {
    check_open_files(&plan)?;
    let console = Console::new(quiet, None, 0);
    let before = probe(&plan.target, &console).await?;
    let addr = plan.target.resolve().await?;
    let schedule = plan.schedule();
    let mut console = Console::new(quiet, Some(schedule), u64::from(plan.local_bots()));
    let run = Arc::new(Run::new(plan.clone(), schedule, addr));
    let (tally, window) = tokio::join!(engine(run, |s| console.show(s)), async {
        match before {
            Some(_) => scrape_window(&plan.target, schedule).await,
            None => None,
        }
    });
    let server = window.map(|(start, end)| {
        ServerUsage::between(before.as_ref(), &start, &end, tally.counts.updates_received)
    });
    Ok(LoadReport::new(&plan, &tally, server, 1))
}

fn check_open_files(plan: &Plan) -> anyhow::Result<()> {
    let needed = u64::from(plan.local_bots()) + 64;
    if let Some(limit) = usage::open_files_limit() {
        if needed > limit {
            bail!(
                "{} bots in one process need about {needed} open files, the limit is {limit}: \
                 pass --processes {}",
                plan.local_bots(),
                u64::from(plan.local_bots()).div_ceil(limit.saturating_sub(64).max(1))
            );
        }
    }
    Ok(())
}

/// What a child prints on stdout, one JSON object a line.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ChildLine {
    Status(Status),
    Tally(Box<Tally>),
}

/// Child mode: runs the rooms of `plan.room_range`, prints status lines
/// and, at the end, its tally.
pub async fn child(plan: Plan) -> anyhow::Result<()> {
    check_open_files(&plan)?;
    let addr = plan.target.resolve().await?;
    let schedule = plan.schedule();
    let run = Arc::new(Run::new(plan, schedule, addr));
    let mut last = None::<Instant>;
    let tally = engine(run, |s| {
        if last.is_some_and(|at| at.elapsed() < Duration::from_millis(950)) {
            return;
        }
        last = Some(Instant::now());
        print_line(&ChildLine::Status(*s));
    })
    .await;
    print_line(&ChildLine::Tally(Box::new(tally)));
    Ok(())
}

fn print_line(line: &ChildLine) {
    let mut out = std::io::stdout().lock();
    if let Ok(json) = serde_json::to_string(line) {
        // A parent that went away is not this child's problem.
        let _ = writeln!(out, "{json}");
        let _ = out.flush();
    }
}

/// Parent mode: runs the plan in `plan.processes` children of `exe`.
pub async fn parent(mut plan: Plan, exe: PathBuf, quiet: bool) -> anyhow::Result<LoadReport> {
    let console = Console::new(quiet, None, 0);
    let before = probe(&plan.target, &console).await?;
    plan.start_unix_ms = unix_ms(SystemTime::now()) + CHILD_START.as_millis() as u64;
    let schedule = plan.schedule();
    let ranges = plan.split();
    let processes = ranges.len() as u32;
    let mut console = Console::new(quiet, Some(schedule), u64::from(plan.bots));

    let (lines_tx, mut lines) = tokio::sync::mpsc::channel::<(usize, ChildLine)>(1024);
    let mut children = Vec::new();
    for (k, range) in ranges.into_iter().enumerate() {
        let child_plan = Plan {
            room_range: range,
            ..plan.clone()
        };
        let json = serde_json::to_string(&child_plan)?;
        let mut child = tokio::process::Command::new(&exe)
            .arg("--child")
            .arg(json)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting child process {}", exe.display()))?;
        let stdout = child.stdout.take().context("child stdout")?;
        let tx = lines_tx.clone();
        tokio::spawn(async move {
            let mut reader = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                if let Ok(parsed) = serde_json::from_str::<ChildLine>(&line) {
                    if tx.send((k, parsed)).await.is_err() {
                        break;
                    }
                }
            }
        });
        children.push(child);
    }
    drop(lines_tx);

    let window = async {
        match before {
            Some(_) => scrape_window(&plan.target, schedule).await,
            None => None,
        }
    };
    let cpu = async {
        sleep_until(schedule.window_start.into()).await;
        let a = usage::cpu_seconds().unwrap_or(0.0);
        sleep_until(schedule.window_end.into()).await;
        usage::cpu_seconds().unwrap_or(0.0) - a
    };
    let deadline = schedule.drain_end + CLOSE_GRACE + Duration::from_secs(10);
    let collect = async {
        let mut statuses: BTreeMap<usize, Status> = BTreeMap::new();
        let mut tallies: BTreeMap<usize, Tally> = BTreeMap::new();
        let mut ticker = tokio::time::interval(STATUS_EVERY);
        loop {
            tokio::select! {
                line = lines.recv() => match line {
                    Some((k, ChildLine::Status(s))) => { statuses.insert(k, s); }
                    Some((k, ChildLine::Tally(t))) => { tallies.insert(k, *t); }
                    None => break,
                },
                _ = ticker.tick() => {
                    let mut total = Status::default();
                    statuses.values().for_each(|s| total.add(s));
                    if !statuses.is_empty() {
                        console.show(&total);
                    }
                }
                () = sleep_until(deadline.into()) => break,
            }
        }
        tallies
    };
    let (tallies, window, parent_cpu) = tokio::join!(collect, window, cpu);

    for (k, child) in children.iter_mut().enumerate() {
        match timeout(Duration::from_secs(5), child.wait()).await {
            Ok(Ok(status)) if status.success() => {}
            Ok(Ok(status)) => bail!("child process {k} failed ({status})"),
            Ok(Err(e)) => bail!("child process {k}: {e}"),
            Err(_) => {
                let _ = child.kill().await;
                bail!("child process {k} did not finish in time");
            }
        }
    }
    if tallies.len() != children.len() {
        bail!(
            "only {} of {} child processes reported",
            tallies.len(),
            children.len()
        );
    }
    let mut tally = Tally::default();
    for t in tallies.values() {
        tally.merge(t);
    }
    tally.cpu_seconds += parent_cpu.max(0.0);
    let server = window.map(|(start, end)| {
        ServerUsage::between(before.as_ref(), &start, &end, tally.counts.updates_received)
    });
    Ok(LoadReport::new(&plan, &tally, server, processes))
}
