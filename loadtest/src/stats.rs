//! Counters and latency histograms, kept per thread and merged when read.
//!
//! Each runtime worker thread that touches a run's [`Stats`] gets its own
//! [`Shard`] (found through a thread-local, registered with the run once), so
//! the receive path writes only to memory its own thread owns: relaxed
//! atomics and a mutex nobody else takes except the once-a-second reader.
//! [`Tally`] is the merged, serialisable result that a child process sends
//! its parent; histograms travel as (value, count) pairs.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, PoisonError};

use amble::protocol::ErrorCode;
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// Latencies are recorded in µs, from 1 µs to this (60 s), 3 significant
/// digits.
const MAX_LATENCY_US: u64 = 60_000_000;

/// A new, empty latency histogram.
pub fn histogram() -> Histogram<u64> {
    // The bounds are constants that hdrhistogram accepts.
    #[allow(clippy::unwrap_used)]
    Histogram::new_with_bounds(1, MAX_LATENCY_US, 3).unwrap()
}

macro_rules! counters {
    ($(#[doc = $doc:literal] $name:ident,)*) => {
        /// Counter totals.
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
        pub struct Counts {
            $(#[doc = $doc] pub $name: u64,)*
        }

        impl Counts {
            /// Adds `other` into `self`.
            pub fn add(&mut self, other: &Counts) {
                $(self.$name += other.$name;)*
            }
        }

        /// The same counters, written by one thread and read by the reporter.
        #[derive(Debug, Default)]
        pub struct AtomicCounts {
            $(pub $name: AtomicU64,)*
        }

        impl AtomicCounts {
            fn load(&self) -> Counts {
                Counts { $($name: self.$name.load(Relaxed),)* }
            }
        }
    };
}

counters! {
    /// In-window moves sent.
    moves_sent,
    /// In-window moves that came back to their sender (the server applied them).
    moves_applied,
    /// Deliveries the applied in-window moves should have had.
    updates_expected,
    /// Deliveries of in-window moves.
    updates_received,
    /// In-window moves delivered twice to the same receiver.
    duplicates,
    /// Bytes received inside the window, WebSocket frames with their headers.
    bytes_in,
    /// Bytes sent inside the window, WebSocket frames with their headers.
    bytes_out,
    /// Frames received inside the window.
    frames_in,
    /// Frames sent inside the window.
    frames_out,
    /// In-window chat messages sent.
    chats_sent,
    /// Chat messages received inside the window.
    chats_received,
    /// Moves sent, any time (for the status line).
    live_moves_sent,
    /// Motion records of other members received, any time.
    live_updates,
    /// Bytes received, any time.
    live_bytes_in,
    /// Ping/Pong round trips completed (rpc scenario).
    round_trips,
    /// Bots whose connection the server closed (or that failed) before the run's end.
    disconnected,
    /// Connections dropped on purpose (--drops-per-sec).
    drops,
    /// Rejoins after a drop that got the held place back (`Welcome.resumed`).
    resumed,
    /// Rejoins after a drop that joined afresh (the place was not held).
    fresh_rejoins,
    /// Spatial rooms: in-window records of members outside the receiver's band (must stay 0).
    interest_leaked,
    /// Spatial rooms: members that came into a bot's view, inside the window.
    interest_appeared,
    /// Spatial rooms: members that went out of a bot's view, inside the window.
    interest_disappeared,
    /// Members in a bot's view, summed over the samples (one per move sent).
    in_view_sum,
    /// Samples of `in_view_sum`.
    in_view_samples,
}

impl AtomicCounts {
    /// Adds `n` to a counter; the owning thread is the only writer.
    pub fn bump(counter: &AtomicU64, n: u64) {
        if n != 0 {
            counter.fetch_add(n, Relaxed);
        }
    }
}

/// Ways a bot's work can go wrong, each counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// Nothing listens at the URL.
    ConnectRefused,
    /// The TCP connect took longer than its timeout.
    ConnectTimeout,
    /// Any other socket error while connecting (e.g. out of ports or files).
    ConnectOther,
    /// The WebSocket upgrade failed.
    Handshake,
    /// The WebSocket upgrade took longer than its timeout.
    HandshakeTimeout,
    /// No Welcome within its timeout after Join.
    JoinTimeout,
    /// The server answered Join with an Error or closed.
    JoinRefused,
    /// The server closed a joined bot's connection.
    Closed,
    /// Reading from the socket failed.
    ReadFailed,
    /// Writing to the socket failed.
    SendFailed,
    /// A write did not finish within its timeout.
    SendTimeout,
    /// A frame from the server could not be decoded.
    Decode,
    /// The server sent a text frame.
    TextFrame,
    /// The server sent a resync (a receiver fell behind and missed frames).
    Resync,
    /// A motion record matched no move of any bot.
    UnmatchedUpdate,
    /// A bot's own move came back with a motion it never sent.
    UnmatchedEcho,
    /// A close handshake at the end did not finish in time.
    CloseTimeout,
}

impl ErrorKind {
    const ALL: [ErrorKind; 17] = [
        Self::ConnectRefused,
        Self::ConnectTimeout,
        Self::ConnectOther,
        Self::Handshake,
        Self::HandshakeTimeout,
        Self::JoinTimeout,
        Self::JoinRefused,
        Self::Closed,
        Self::ReadFailed,
        Self::SendFailed,
        Self::SendTimeout,
        Self::Decode,
        Self::TextFrame,
        Self::Resync,
        Self::UnmatchedUpdate,
        Self::UnmatchedEcho,
        Self::CloseTimeout,
    ];

    /// The key in the report's `errors`.
    pub fn name(self) -> &'static str {
        match self {
            Self::ConnectRefused => "connect_refused",
            Self::ConnectTimeout => "connect_timeout",
            Self::ConnectOther => "connect_other",
            Self::Handshake => "handshake",
            Self::HandshakeTimeout => "handshake_timeout",
            Self::JoinTimeout => "join_timeout",
            Self::JoinRefused => "join_refused",
            Self::Closed => "closed_by_server",
            Self::ReadFailed => "read_failed",
            Self::SendFailed => "send_failed",
            Self::SendTimeout => "send_timeout",
            Self::Decode => "decode",
            Self::TextFrame => "text_frame",
            Self::Resync => "resync",
            Self::UnmatchedUpdate => "unmatched_update",
            Self::UnmatchedEcho => "unmatched_echo",
            Self::CloseTimeout => "close_timeout",
        }
    }

    /// Whether this kind ends a joined bot's session before the run's end.
    pub fn is_session_end(name: &str) -> bool {
        [
            Self::Closed,
            Self::ReadFailed,
            Self::SendFailed,
            Self::SendTimeout,
        ]
        .iter()
        .any(|k| k.name() == name)
    }

    /// Whether this kind means a bot never got into its room.
    pub fn is_connect_failure(name: &str) -> bool {
        [
            Self::ConnectRefused,
            Self::ConnectTimeout,
            Self::ConnectOther,
            Self::Handshake,
            Self::HandshakeTimeout,
            Self::JoinTimeout,
            Self::JoinRefused,
        ]
        .iter()
        .any(|k| k.name() == name)
    }
}

/// Error codes the server can send (0..=16 today; room for more).
const SERVER_CODES: usize = 32;

/// Latencies recorded on one thread.
#[derive(Debug)]
pub struct Latencies {
    /// Every delivery, any time (for the status line before the window).
    pub live: Histogram<u64>,
    /// Deliveries of in-window moves.
    pub window: Histogram<u64>,
    /// In-window moves back at their sender.
    pub echo: Histogram<u64>,
    /// Ping → Pong (rpc scenario).
    pub rpc: Histogram<u64>,
}

impl Default for Latencies {
    fn default() -> Self {
        Self {
            live: histogram(),
            window: histogram(),
            echo: histogram(),
            rpc: histogram(),
        }
    }
}

/// One thread's counters and histograms.
#[derive(Debug, Default)]
pub struct Shard {
    pub counts: AtomicCounts,
    errors: [AtomicU64; ErrorKind::ALL.len()],
    server_errors: [AtomicU64; SERVER_CODES],
    latencies: Mutex<Latencies>,
}

impl Shard {
    pub fn error(&self, kind: ErrorKind, n: u64) {
        AtomicCounts::bump(&self.errors[kind as usize], n);
    }

    pub fn server_error(&self, code: i32) {
        let i = usize::try_from(code).unwrap_or(0).min(SERVER_CODES - 1);
        self.server_errors[i].fetch_add(1, Relaxed);
    }

    /// The histograms, locked; only this shard's thread and the reporter
    /// take this lock.
    pub fn latencies(&self) -> std::sync::MutexGuard<'_, Latencies> {
        self.latencies
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// Connection progress, written once per bot (not per frame).
#[derive(Debug, Default)]
pub struct Gauges {
    /// Bots whose connect attempt has finished, either way.
    pub attempted: AtomicU64,
    /// Bots in their room now.
    pub connected: AtomicU64,
    /// Bots that ever got in.
    pub ever_connected: AtomicU64,
}

/// A run's statistics: the shards of every thread that took part.
#[derive(Debug)]
pub struct Stats {
    id: u64,
    shards: Mutex<Vec<Arc<Shard>>>,
    pub gauges: Gauges,
}

static NEXT_STATS_ID: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// This thread's shard and the id of the run it belongs to.
    static LOCAL: RefCell<Option<(u64, Arc<Shard>)>> = const { RefCell::new(None) };
}

impl Default for Stats {
    fn default() -> Self {
        Self {
            id: NEXT_STATS_ID.fetch_add(1, Relaxed),
            shards: Mutex::new(Vec::new()),
            gauges: Gauges::default(),
        }
    }
}

impl Stats {
    /// Runs `f` with this thread's shard (registering one on first use).
    /// `f` must not call `with` again.
    pub fn with<R>(&self, f: impl FnOnce(&Shard) -> R) -> R {
        LOCAL.with(|local| {
            let mut local = local.borrow_mut();
            if local.as_ref().is_none_or(|(id, _)| *id != self.id) {
                let shard = Arc::new(Shard::default());
                self.shards
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(shard.clone());
                *local = Some((self.id, shard));
            }
            match &*local {
                Some((_, shard)) => f(shard),
                // Filled just above.
                None => f(&Shard::default()),
            }
        })
    }

    fn shards(&self) -> Vec<Arc<Shard>> {
        self.shards
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Sums of all counters so far.
    pub fn counts(&self) -> Counts {
        let mut total = Counts::default();
        for shard in self.shards() {
            total.add(&shard.counts.load());
        }
        total
    }

    /// Errors so far, by kind (only kinds that occurred).
    pub fn errors(&self) -> BTreeMap<String, u64> {
        let mut errors = BTreeMap::new();
        for shard in self.shards() {
            for (kind, n) in ErrorKind::ALL.iter().zip(&shard.errors) {
                let n = n.load(Relaxed);
                if n > 0 {
                    *errors.entry(kind.name().to_string()).or_default() += n;
                }
            }
            for (code, n) in shard.server_errors.iter().enumerate() {
                let n = n.load(Relaxed);
                if n > 0 {
                    *errors.entry(server_error_name(code)).or_default() += n;
                }
            }
        }
        errors
    }

    /// Merges one histogram of every shard.
    pub fn merged(&self, pick: impl Fn(&Latencies) -> &Histogram<u64>) -> Histogram<u64> {
        let mut merged = histogram();
        for shard in self.shards() {
            // Same bounds everywhere: adding cannot fail.
            let _ = merged.add(pick(&shard.latencies()));
        }
        merged
    }
}

/// `server_rate_limited` for ERROR_CODE_RATE_LIMITED, and so on.
fn server_error_name(code: usize) -> String {
    let name = i32::try_from(code)
        .ok()
        .and_then(|c| ErrorCode::try_from(c).ok())
        .map(|c| {
            c.as_str_name()
                .trim_start_matches("ERROR_CODE_")
                .to_ascii_lowercase()
        });
    match name {
        Some(name) => format!("server_{name}"),
        None => format!("server_error_{code}"),
    }
}

/// A histogram as (value, count) pairs of its recorded buckets: compact,
/// exact for a histogram of the same bounds, and plain JSON.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct HistogramBuckets(pub Vec<[u64; 2]>);

impl HistogramBuckets {
    pub fn of(h: &Histogram<u64>) -> Self {
        Self(
            h.iter_recorded()
                .map(|v| [v.value_iterated_to(), v.count_at_value()])
                .collect(),
        )
    }

    /// Adds these buckets into `h`.
    pub fn add_to(&self, h: &mut Histogram<u64>) {
        for &[value, count] in &self.0 {
            h.saturating_record_n(value, count);
        }
    }
}

/// What one process measured: a child sends this to its parent as JSON.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Tally {
    pub bots: u64,
    /// Bots in their room when the window opened.
    pub connected_at_start: u64,
    /// Bots in their room when the window closed.
    pub connected: u64,
    /// The fewest bots in their rooms at any reading during the window
    /// (`None`: the window never opened).
    pub connected_min: Option<u64>,
    /// Time measured in the window, ms (its length unless the run ended
    /// early).
    pub measured_ms: u64,
    /// Why the run was interrupted, if it was.
    pub interrupted: Option<String>,
    /// Time from the schedule's start at which every bot was gone, if the
    /// run stopped early for that.
    pub all_gone_ms: Option<u64>,
    pub counts: Counts,
    pub errors: BTreeMap<String, u64>,
    pub latency: HistogramBuckets,
    pub echo_latency: HistogramBuckets,
    /// This process's CPU time over the window, seconds.
    pub cpu_seconds: f64,
    /// This process's resident memory at the end of the window.
    pub rss_bytes: u64,
}

impl Tally {
    /// Adds another process's tally into this one.
    pub fn merge(&mut self, other: &Tally) {
        self.bots += other.bots;
        self.connected_at_start += other.connected_at_start;
        self.connected += other.connected;
        self.connected_min = match (self.connected_min, other.connected_min) {
            (Some(a), Some(b)) => Some(a + b),
            (a, b) => a.or(b),
        };
        self.measured_ms = self.measured_ms.max(other.measured_ms);
        if self.interrupted.is_none() {
            self.interrupted.clone_from(&other.interrupted);
        }
        // The parent keeps this only if every process's bots were gone.
        self.all_gone_ms = self.all_gone_ms.max(other.all_gone_ms);
        self.counts.add(&other.counts);
        for (k, v) in &other.errors {
            *self.errors.entry(k.clone()).or_default() += v;
        }
        let mut latency = self.latency_histogram();
        other.latency.add_to(&mut latency);
        self.latency = HistogramBuckets::of(&latency);
        let mut echo = self.echo_histogram();
        other.echo_latency.add_to(&mut echo);
        self.echo_latency = HistogramBuckets::of(&echo);
        self.cpu_seconds += other.cpu_seconds;
        self.rss_bytes += other.rss_bytes;
    }

    pub fn latency_histogram(&self) -> Histogram<u64> {
        let mut h = histogram();
        self.latency.add_to(&mut h);
        h
    }

    pub fn echo_histogram(&self) -> Histogram<u64> {
        let mut h = histogram();
        self.echo_latency.add_to(&mut h);
        h
    }

    /// Bots that never got into their room.
    pub fn connect_failures(&self) -> u64 {
        self.errors
            .iter()
            .filter(|(k, _)| ErrorKind::is_connect_failure(k))
            .map(|(_, v)| v)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_round_trip_and_merge() {
        let mut a = histogram();
        let mut b = histogram();
        for us in [150, 900, 1_000, 1_001, 12_345, 250_000] {
            a.record(us).unwrap();
        }
        for us in [2, 900, 59_000_000] {
            b.record(us).unwrap();
        }
        let mut direct = a.clone();
        direct.add(&b).unwrap();

        let json = serde_json::to_string(&HistogramBuckets::of(&a)).unwrap();
        let back: HistogramBuckets = serde_json::from_str(&json).unwrap();
        let mut ta = Tally {
            latency: back,
            ..Tally::default()
        };
        let tb = Tally {
            latency: HistogramBuckets::of(&b),
            ..Tally::default()
        };
        ta.merge(&tb);
        let merged = ta.latency_histogram();
        assert_eq!(merged.len(), 9);
        for q in [0.0, 0.5, 0.9, 0.99, 0.999, 1.0] {
            assert_eq!(
                merged.value_at_quantile(q),
                direct.value_at_quantile(q),
                "q {q}"
            );
        }
        assert_eq!(merged.max(), direct.max());
    }

    #[test]
    fn tallies_sum_counters_and_errors() {
        let mut a = Tally {
            bots: 3,
            connected: 3,
            ..Tally::default()
        };
        a.counts.updates_received = 10;
        a.errors.insert("connect_refused".into(), 1);
        let mut b = Tally {
            bots: 2,
            connected: 1,
            ..Tally::default()
        };
        b.counts.updates_received = 5;
        b.errors.insert("connect_refused".into(), 1);
        b.errors.insert("resync".into(), 4);
        a.merge(&b);
        assert_eq!((a.bots, a.connected, a.counts.updates_received), (5, 4, 15));
        assert_eq!(a.errors["connect_refused"], 2);
        assert_eq!(a.connect_failures(), 2);
    }

    #[test]
    fn shards_per_thread_are_merged() {
        let stats = Arc::new(Stats::default());
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let stats = stats.clone();
                std::thread::spawn(move || {
                    for _ in 0..1_000 {
                        stats.with(|s| {
                            AtomicCounts::bump(&s.counts.updates_received, 1);
                            s.latencies().window.saturating_record(500);
                            s.error(ErrorKind::Resync, 1);
                        });
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(stats.counts().updates_received, 4_000);
        assert_eq!(stats.merged(|l| &l.window).len(), 4_000);
        assert_eq!(stats.errors()["resync"], 4_000);
        assert_eq!(stats.shards().len(), 4);
        // A second run on the same thread gets a shard of its own.
        let other = Stats::default();
        other.with(|s| AtomicCounts::bump(&s.counts.updates_received, 1));
        stats.with(|s| AtomicCounts::bump(&s.counts.updates_received, 1));
        assert_eq!(other.counts().updates_received, 1);
        assert_eq!(stats.counts().updates_received, 4_001);
    }

    #[test]
    fn server_error_names() {
        assert_eq!(server_error_name(10), "server_rate_limited");
        assert_eq!(server_error_name(31), "server_error_31");
    }
}
