//! What a person watches while a run goes: a progress bar during ramp-up
//! (on a terminal), then a status line every `--status-every`, all on
//! stderr (stdout is for reports). The units are the report's.

use std::io::IsTerminal as _;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};

use crate::bot::Run;
use crate::plan::Schedule;
use crate::report::bytes;

/// A moment of a run, cumulative; summed over processes by the parent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Status {
    pub bots: u64,
    /// Connect attempts finished, either way.
    pub attempted: u64,
    pub connected: u64,
    pub moves_sent: u64,
    pub updates: u64,
    pub bytes_in: u64,
    pub round_trips: u64,
    /// p99 so far: of in-window moves once the window is open, of every
    /// delivery before.
    pub p99_ms: Option<f64>,
    pub errors: u64,
}

impl Status {
    /// Reads a run's stats now.
    pub fn of(run: &Run) -> Self {
        use std::sync::atomic::Ordering::Relaxed;
        let counts = run.stats.counts();
        let now = Instant::now();
        let window_open = now >= run.schedule.window_start;
        let h = run
            .stats
            .merged(|l| if window_open { &l.window } else { &l.live });
        let g = &run.stats.gauges;
        Self {
            bots: u64::from(run.plan.local_bots()),
            attempted: g.attempted.load(Relaxed),
            connected: g.connected.load(Relaxed),
            moves_sent: counts.live_moves_sent,
            updates: counts.live_updates,
            bytes_in: counts.live_bytes_in,
            round_trips: counts.round_trips,
            p99_ms: (!h.is_empty()).then(|| h.value_at_quantile(0.99) as f64 / 1_000.0),
            errors: run.stats.errors().values().sum(),
        }
    }

    /// Sums another process's status into this one (p99: the worst).
    pub fn add(&mut self, other: &Status) {
        self.bots += other.bots;
        self.attempted += other.attempted;
        self.connected += other.connected;
        self.moves_sent += other.moves_sent;
        self.updates += other.updates;
        self.bytes_in += other.bytes_in;
        self.round_trips += other.round_trips;
        self.errors += other.errors;
        self.p99_ms = match (self.p99_ms, other.p99_ms) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
    }
}

/// The stderr display of one run.
pub struct Console {
    quiet: bool,
    every: Duration,
    schedule: Option<Schedule>,
    started: Instant,
    bar: Option<ProgressBar>,
    last: Option<(Instant, Status)>,
}

impl Console {
    /// `schedule` is `None` for scenarios without ramp and window (rpc);
    /// a status line goes out every `every`.
    pub fn new(quiet: bool, schedule: Option<Schedule>, bots: u64, every: Duration) -> Self {
        let bar = (!quiet && schedule.is_some() && std::io::stderr().is_terminal()).then(|| {
            let bar = ProgressBar::new(bots);
            let style = ProgressStyle::with_template("connecting {bar:30} {pos}/{len} {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar());
            bar.set_style(style);
            bar
        });
        Self {
            quiet,
            every,
            schedule,
            started: Instant::now(),
            bar,
            last: None,
        }
    }

    fn phase(&self, now: Instant) -> &'static str {
        match self.schedule {
            None => "run",
            Some(s) if now < s.ramp_end => "ramp",
            Some(s) if now < s.window_start => "warmup",
            Some(s) if now < s.window_end => "window",
            Some(_) => "drain",
        }
    }

    /// Shows `status`; called a few times a second, prints a line every
    /// `every`.
    pub fn show(&mut self, status: &Status) {
        if self.quiet {
            return;
        }
        let now = Instant::now();
        if let Some(bar) = &self.bar {
            let ramping =
                self.schedule.is_some_and(|s| now < s.ramp_end) || status.attempted < status.bots;
            if ramping && !bar.is_finished() {
                bar.set_message(format!(
                    "({} in, {} failed)",
                    status.connected,
                    status.attempted.saturating_sub(status.connected)
                ));
                bar.set_position(status.attempted);
                if status.attempted < status.bots {
                    return;
                }
            }
            if !bar.is_finished() {
                bar.finish_and_clear();
                eprintln!(
                    "connected {} of {} bots ({} failed) in {:.1} s",
                    status.connected,
                    status.bots,
                    status.attempted.saturating_sub(status.connected),
                    now.duration_since(self.started).as_secs_f64()
                );
            }
        }
        let (since, prev) = match self.last {
            // A little early rather than a tick late.
            Some((at, _)) if now.duration_since(at) + Duration::from_millis(50) < self.every => {
                return;
            }
            Some((at, prev)) => (now.duration_since(at).as_secs_f64(), prev),
            None if now.duration_since(self.started) + Duration::from_millis(50) < self.every => {
                return;
            }
            None => (
                now.duration_since(self.started).as_secs_f64().max(1e-3),
                Status::default(),
            ),
        };
        let rate = |a: u64, b: u64| a.saturating_sub(b) as f64 / since;
        let line = if status.round_trips > 0 {
            format!(
                "{:>6.1}s {:<6} connected {:>6}  round trips/s {:>8.0}  p99 {}  errors {}",
                now.duration_since(self.started).as_secs_f64(),
                self.phase(now),
                status.connected,
                rate(status.round_trips, prev.round_trips),
                status.p99_ms.map_or("-".into(), |p| format!("{p:.2} ms")),
                status.errors,
            )
        } else {
            format!(
                "{:>6.1}s {:<6} connected {:>6}  moves/s {:>7.0}  updates/s {:>8.0}  in {:>9}/s  p99 {}  errors {}",
                now.duration_since(self.started).as_secs_f64(),
                self.phase(now),
                status.connected,
                rate(status.moves_sent, prev.moves_sent),
                rate(status.updates, prev.updates),
                bytes(rate(status.bytes_in, prev.bytes_in)),
                status.p99_ms.map_or("-".into(), |p| format!("{p:.2} ms")),
                status.errors,
            )
        };
        eprintln!("{line}");
        self.last = Some((now, *status));
    }
}
