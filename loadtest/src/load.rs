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
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context as _, bail};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::task::JoinSet;
use tokio::time::{sleep_until, timeout};

use amble::protocol::{self, pb};
use futures_util::{SinkExt as _, StreamExt as _};
use prost::Message as _;
use tokio_tungstenite::tungstenite::Message;

use crate::bot::{self, Run};
use crate::console::{Console, Status};
use crate::plan::{Plan, RoomNames, Schedule, Target, unix_ms};
use crate::report::{LoadReport, NodeUsage};
use crate::scrape::{self, Sample, ServerUsage, Watch};
use crate::stats::{HistogramBuckets, Tally};
use crate::stop::Stop;
use crate::varz::{self, Monitor, NatsUsage};
use crate::{usage, wire};

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

/// What a run learns about the server before any bot connects.
#[derive(Debug, Default)]
pub struct Probe {
    /// Its metrics (`None` if /metrics cannot be read: the run goes on).
    pub before: Option<Sample>,
    /// What the report must say about the figures to come.
    pub warnings: Vec<String>,
}

/// Checks the server answers, and reads its metrics before any bot
/// connects; with `check_fresh`, warns when the server was busy or reused.
pub async fn probe(target: &Target, check_fresh: bool) -> anyhow::Result<Probe> {
    probe_node(target, check_fresh, false).await
}

/// [`probe`] for one node of several (`named`: its warnings name it).
async fn probe_node(target: &Target, check_fresh: bool, named: bool) -> anyhow::Result<Probe> {
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
    let mut probe = Probe::default();
    match scrape::scrape(target).await {
        Ok(sample) => {
            if check_fresh {
                probe.warnings = scrape::freshness(&sample);
            }
            probe.before = Some(sample);
        }
        Err(e) => {
            let what = format!("server metrics not available ({e:#}); no server figures");
            probe.warnings.push(what);
        }
    }
    if named {
        for w in &mut probe.warnings {
            *w = format!("node {}: {w}", target.url);
        }
    }
    for w in &probe.warnings {
        eprintln!("warning: {w}");
    }
    Ok(probe)
}

/// The server's limits as its Welcome gives them: a probe joins a room of
/// its own (unique to the run, empty, gone when the probe leaves), leaves
/// and closes.
pub async fn server_limits(plan: &Plan, addr: SocketAddr) -> anyhow::Result<pb::Limits> {
    room_limits(plan, addr, &format!("lt-{}-probe", plan.run_tag)).await
}

/// The limits of `room` (a spatial room has its own capacity and world),
/// read as [`server_limits`] does, by joining it for a moment.
pub async fn room_limits(plan: &Plan, addr: SocketAddr, room: &str) -> anyhow::Result<pb::Limits> {
    let mut ws = wire::connect(&plan.target, addr, None)
        .await
        .map_err(|(_, e)| e)?;
    let join = protocol::encode_client(pb::client_message::Body::Join(pb::Join {
        data: Vec::new(),
        start: None,
        room: room.to_owned(),
        name: format!("probe-{}", plan.run_tag),
        token: String::new(),
        resume_token: String::new(),
    }));
    let limits = timeout(Duration::from_secs(5), async {
        ws.send(Message::Binary(join.into())).await?;
        while let Some(frame) = ws.next().await {
            let Message::Binary(bytes) = frame? else {
                continue;
            };
            match pb::ServerMessage::decode(&bytes[..])?.body {
                Some(pb::server_message::Body::Welcome(w)) => {
                    return Ok(w.limits.unwrap_or_default());
                }
                Some(pb::server_message::Body::Error(e)) => {
                    bail!("the server refused a Join: {}", e.message)
                }
                _ => {}
            }
        }
        bail!("the server closed the connection before its Welcome")
    })
    .await
    .context("no Welcome within 5 s")?;
    // Leave, and wait for the server's close so the probe is gone before
    // the window's figures are read.
    let _ = timeout(Duration::from_secs(2), async {
        // A Leave first: a close alone would leave a place held for the
        // resume grace (a member in the run's room).
        let leave = protocol::encode_client(pb::client_message::Body::Leave(pb::Leave {}));
        let _ = ws.send(Message::Binary(leave.into())).await;
        let _ = ws.close(None).await;
        while let Some(Ok(_)) = ws.next().await {}
    })
    .await;
    limits
}

/// Refuses a plan whose rooms hold more bots than the server's rooms hold
/// members, before any bot connects.
pub fn check_capacity(plan: &Plan, capacity: u32) -> anyhow::Result<()> {
    if capacity == 0 || plan.room_size <= capacity {
        return Ok(());
    }
    let rooms = plan.bots.div_ceil(capacity);
    let (what, prefix) = match &plan.room_names {
        RoomNames::One(name) => (
            format!("--room {name} puts all {} bots in one room", plan.bots),
            name.as_str(),
        ),
        RoomNames::Prefix(prefix) => (format!("rooms of {} bots", plan.room_size), prefix.as_str()),
        RoomNames::Run => (format!("rooms of {} bots", plan.room_size), "NAME"),
    };
    bail!(
        "{what}, but the server's rooms hold at most {capacity} members (room_capacity in its \
         Welcome). Use --rooms {rooms} --room-prefix {prefix} (or --room-size {capacity}), fewer \
         bots, or start the server with --room-capacity {}.",
        plan.room_size
    )
}

/// How a run is driven: what it shows and what stops it.
#[derive(Clone, Debug)]
pub struct Control {
    pub quiet: bool,
    pub status_every: Duration,
    pub stop: Stop,
    /// Warn when the server was busy or reused before the run (the sweep
    /// checks before its first room size only).
    pub check_fresh: bool,
    /// The NATS server's monitoring endpoint (`--nats-monitor`).
    pub nats_monitor: Option<Monitor>,
}

impl Default for Control {
    fn default() -> Self {
        Self {
            quiet: true,
            status_every: Duration::from_secs(1),
            stop: Stop::new(),
            check_fresh: true,
            nats_monitor: None,
        }
    }
}

/// Runs this process's bots to the schedule; calls `on_status` a few times
/// a second; returns the tally read when the drain ends, or earlier when
/// `stop` fires or every bot is gone (then `on_early_end` is called first,
/// and the bots are told to close).
pub async fn engine(
    run: Arc<Run>,
    stop: &Stop,
    mut on_status: impl FnMut(&Status),
    on_early_end: impl FnOnce(),
) -> Tally {
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
    let mut connected_min: Option<u64> = None;
    let mut measured_ms = 0;
    let (mut interrupted, mut all_gone_ms) = (None, None);
    let connected_now = || {
        run.stats
            .gauges
            .connected
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    let drain = sleep_until(schedule.drain_end.into());
    let stopped = stop.stopped();
    tokio::pin!(drain, stopped);
    loop {
        tokio::select! {
            biased;
            () = &mut drain => break,
            why = &mut stopped => {
                interrupted = Some(why.to_string());
                break;
            }
            _ = bots.join_next(), if !bots.is_empty() => {
                // Bots end at the drain's end; before the window's end, the
                // last one ending means the server took every one.
                if bots.is_empty() && Instant::now() < schedule.window_end {
                    all_gone_ms = Some(millis(schedule.origin.elapsed()));
                    break;
                }
            }
            () = sleep_until(schedule.window_start.into()), if cpu_start.is_none() => {
                cpu_start = usage::cpu_seconds().or(Some(0.0));
                connected_at_start = connected_now();
                connected_min = Some(connected_at_start);
            }
            () = sleep_until(schedule.window_end.into()), if cpu_start.is_some() && cpu_end.is_none() => {
                cpu_end = usage::cpu_seconds().or(Some(0.0));
                rss = usage::rss_bytes().unwrap_or(0);
                connected = connected_now();
                connected_min = connected_min.map(|m| m.min(connected));
                measured_ms = run.plan.duration_ms;
            }
            _ = ticker.tick() => {
                if cpu_start.is_some() && cpu_end.is_none() {
                    connected_min = connected_min.map(|m| m.min(connected_now()));
                }
                on_status(&Status::of(&run));
            }
        }
    }
    if interrupted.is_some() || all_gone_ms.is_some() {
        // Read before the bots are told to close: closing is not a loss.
        if cpu_start.is_some() && cpu_end.is_none() {
            cpu_end = usage::cpu_seconds().or(Some(0.0));
            rss = usage::rss_bytes().unwrap_or(0);
            connected = connected_now();
            connected_min = connected_min.map(|m| m.min(connected));
            measured_ms = millis(schedule.window_start.elapsed());
        }
        on_early_end();
        run.halt();
    }
    // Each bot counts the deliveries it should have had when its session
    // ends (now): the tally is read once they all have.
    run.settled(CLOSE_GRACE).await;
    on_status(&Status::of(&run));
    let tally = Tally {
        bots: u64::from(run.plan.local_bots()),
        connected_at_start,
        connected,
        connected_min,
        measured_ms,
        interrupted,
        all_gone_ms,
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
    // Bots close on their own at the drain's end (or now, if halted); bound
    // the wait.
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

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Probes every node and checks the plan against the first; returns the
/// probes and the addresses to connect to, in `--url` order.
async fn prepare(plan: &Plan, ctl: &Control) -> anyhow::Result<(Vec<Probe>, Vec<SocketAddr>)> {
    let named = plan.nodes() > 1;
    let mut probes = Vec::with_capacity(plan.nodes());
    for target in plan.targets() {
        probes.push(probe_node(target, ctl.check_fresh, named).await?);
    }
    let addrs = resolve_all(plan).await?;
    match server_limits(plan, addrs[0]).await {
        // Too many for a plain room: the run's one room may be a spatial
        // room, which holds more (asked only then: the probe shows in it).
        Ok(limits) => match (check_capacity(plan, limits.room_capacity), &plan.room_names) {
            (Err(_), RoomNames::One(room)) => {
                let limits = room_limits(plan, addrs[0], room).await?;
                check_capacity(plan, limits.room_capacity)?;
            }
            (checked, _) => checked?,
        },
        Err(err) => eprintln!("warning: could not read the server's limits ({err:#})"),
    }
    Ok((probes, addrs))
}

/// Every node's address, in `--url` order.
async fn resolve_all(plan: &Plan) -> anyhow::Result<Vec<SocketAddr>> {
    let mut addrs = Vec::with_capacity(plan.nodes());
    for target in plan.targets() {
        addrs.push(target.resolve().await?);
    }
    Ok(addrs)
}

/// What reads the servers' figures over the window: each node's
/// /metrics (a node whose /metrics did not answer before the run is not
/// read), and nats-server's /varz.
struct Watches {
    nodes: Vec<Option<Watch>>,
    nats: Option<varz::Watch>,
}

impl Watches {
    fn start(plan: &Plan, probes: &[Probe], schedule: Schedule, ctl: &Control) -> Self {
        let named = plan.nodes() > 1;
        let nodes = plan
            .targets()
            .zip(probes)
            .map(|(target, probe)| {
                probe.before.is_some().then(|| {
                    let who = if named {
                        format!("node {}", target.url)
                    } else {
                        "the server".into()
                    };
                    Watch::start(target.clone(), schedule, who)
                })
            })
            .collect();
        let nats = ctl
            .nats_monitor
            .clone()
            .map(|m| varz::Watch::start(m, schedule));
        Self { nodes, nats }
    }

    fn end_now(&self) {
        self.nodes.iter().flatten().for_each(Watch::end_now);
        if let Some(n) = &self.nats {
            n.end_now();
        }
    }

    async fn finish(self, monitor: Option<&Monitor>) -> (Vec<Option<scrape::Window>>, Nats) {
        let mut windows = Vec::with_capacity(self.nodes.len());
        for w in self.nodes {
            windows.push(match w {
                Some(w) => Some(w.finish().await),
                None => None,
            });
        }
        let nats = match (self.nats, monitor) {
            (Some(w), Some(m)) => {
                let (readings, failed) = w.finish().await;
                Nats {
                    usage: NatsUsage::of(m.url(), &readings),
                    warning: failed.or_else(|| {
                        (readings.len() < 2).then(|| {
                            format!(
                                "the NATS monitor {} was not read at both ends of the window: \
                                 no nats-server figures",
                                m.url()
                            )
                        })
                    }),
                }
            }
            _ => Nats::default(),
        };
        (windows, nats)
    }
}

/// nats-server's figures over the window, and what to warn about them.
#[derive(Debug, Default)]
struct Nats {
    usage: Option<NatsUsage>,
    warning: Option<String>,
}

/// Runs the whole plan in this process.
pub async fn alone(plan: Plan, ctl: &Control) -> anyhow::Result<LoadReport> {
    if let Some(files) = crate::limits::current() {
        plan.check_open_files(files)?;
    }
    let (probes, addrs) = prepare(&plan, ctl).await?;
    let schedule = plan.schedule();
    let mut console = Console::new(
        ctl.quiet,
        Some(schedule),
        u64::from(plan.local_bots()),
        ctl.status_every,
    );
    let run = Arc::new(Run::new(plan.clone(), schedule, addrs));
    let watches = Watches::start(&plan, &probes, schedule, ctl);
    let tally = engine(run, &ctl.stop, |s| console.show(s), || watches.end_now()).await;
    let (windows, nats) = watches.finish(ctl.nats_monitor.as_ref()).await;
    Ok(report(&plan, &tally, probes, windows, nats, 1))
}

/// The report of a load run from its merged tally and the servers'
/// windows (one per node, in `--url` order).
fn report(
    plan: &Plan,
    tally: &Tally,
    probes: Vec<Probe>,
    windows: Vec<Option<scrape::Window>>,
    nats: Nats,
    processes: u32,
) -> LoadReport {
    let mut warnings = Vec::new();
    let mut nodes = Vec::with_capacity(probes.len());
    for ((probe, window), target) in probes.into_iter().zip(windows).zip(plan.targets()) {
        warnings.extend(probe.warnings);
        let server = window.and_then(|w| {
            warnings.extend(w.lost);
            Some(ServerUsage::between(
                probe.before.as_ref(),
                w.start.as_ref()?,
                w.end.as_ref()?,
                tally.counts.updates_received,
            ))
        });
        nodes.push(NodeUsage {
            url: target.url.clone(),
            server,
        });
    }
    warnings.extend(nats.warning);
    let first = nodes.first().and_then(|n| n.server.clone());
    LoadReport::new(plan, tally, first, processes, warnings).with_cluster(nodes, nats.usage)
}

/// What a child prints on stdout, one JSON object a line.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ChildLine {
    Status(Status),
    Tally(Box<Tally>),
}

/// Child mode: runs the rooms of `plan.room_range`, prints status lines
/// and, at the end, its tally. Stops early on `stop` (its parent closing
/// its stdin, or a signal).
pub async fn child(plan: Plan, stop: &Stop) -> anyhow::Result<()> {
    if let Some(files) = crate::limits::current() {
        plan.check_open_files(files)?;
    }
    let addrs = resolve_all(&plan).await?;
    let schedule = plan.schedule();
    let run = Arc::new(Run::new(plan, schedule, addrs));
    let mut last = None::<Instant>;
    let tally = engine(
        run,
        stop,
        |s| {
            if last.is_some_and(|at| at.elapsed() < Duration::from_millis(950)) {
                return;
            }
            last = Some(Instant::now());
            print_line(&ChildLine::Status(*s));
        },
        || {},
    )
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
pub async fn parent(mut plan: Plan, exe: PathBuf, ctl: &Control) -> anyhow::Result<LoadReport> {
    let (probes, _addrs) = prepare(&plan, ctl).await?;
    plan.start_unix_ms = unix_ms(SystemTime::now()) + CHILD_START.as_millis() as u64;
    let schedule = plan.schedule();
    let ranges = plan.split();
    let processes = ranges.len() as u32;
    let mut console = Console::new(
        ctl.quiet,
        Some(schedule),
        u64::from(plan.bots),
        ctl.status_every,
    );

    let (lines_tx, mut lines) = tokio::sync::mpsc::channel::<(usize, ChildLine)>(1024);
    let mut children = Vec::new();
    // Closing a child's stdin stops it (and so does this process's end).
    let mut stdins = Vec::new();
    for (k, range) in ranges.into_iter().enumerate() {
        let child_plan = Plan {
            room_range: range,
            ..plan.clone()
        };
        let json = serde_json::to_string(&child_plan)?;
        let mut child = tokio::process::Command::new(&exe)
            .arg("--child")
            .arg(json)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting child process {}", exe.display()))?;
        let stdout = child.stdout.take().context("child stdout")?;
        stdins.push(child.stdin.take());
        let tx = lines_tx.clone();
        tokio::spawn(async move {
            let mut reader = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                if let Ok(parsed) = serde_json::from_str::<ChildLine>(&line)
                    && tx.send((k, parsed)).await.is_err()
                {
                    break;
                }
            }
        });
        children.push(child);
    }
    drop(lines_tx);

    let watches = Watches::start(&plan, &probes, schedule, ctl);
    let mut deadline = schedule.drain_end + CLOSE_GRACE + Duration::from_secs(10);
    let mut statuses: BTreeMap<usize, Status> = BTreeMap::new();
    let mut tallies: BTreeMap<usize, Tally> = BTreeMap::new();
    let mut ticker = tokio::time::interval(STATUS_EVERY);
    let (mut cpu_start, mut cpu_end) = (None, None);
    let mut interrupted = None;
    let stopped = ctl.stop.stopped();
    tokio::pin!(stopped);
    loop {
        tokio::select! {
            line = lines.recv() => match line {
                Some((k, ChildLine::Status(s))) => { statuses.insert(k, s); }
                Some((k, ChildLine::Tally(t))) => {
                    tallies.insert(k, *t);
                    if tallies.len() == children.len() {
                        break;
                    }
                }
                None => break,
            },
            why = &mut stopped, if interrupted.is_none() => {
                interrupted = Some(why.to_string());
                stdins.clear();
                watches.end_now();
                deadline = Instant::now() + CLOSE_GRACE + Duration::from_secs(5);
            }
            _ = ticker.tick() => {
                let now = Instant::now();
                if now >= schedule.window_start && cpu_start.is_none() {
                    cpu_start = usage::cpu_seconds();
                }
                if now >= schedule.window_end && cpu_end.is_none() {
                    cpu_end = usage::cpu_seconds();
                }
                let mut total = Status::default();
                statuses.values().for_each(|s| total.add(s));
                if !statuses.is_empty() {
                    console.show(&total);
                }
            }
            () = sleep_until(deadline.into()) => break,
        }
    }
    let cpu_end = cpu_end.or_else(usage::cpu_seconds);
    // Children that are done read the end of their stdin and exit.
    stdins.clear();
    let (windows, nats) = watches.finish(ctl.nats_monitor.as_ref()).await;

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
    if !tallies.values().all(|t| t.all_gone_ms.is_some()) {
        tally.all_gone_ms = None;
    }
    if interrupted.is_some() {
        tally.interrupted = interrupted;
    }
    if let (Some(a), Some(b)) = (cpu_start, cpu_end) {
        tally.cpu_seconds += (b - a).max(0.0);
    }
    Ok(report(&plan, &tally, probes, windows, nats, processes))
}
