//! The key set behind `--auth-jwks-url`: fetched at start, then again in a
//! task of its own every `--auth-jwks-refresh-secs` (sooner when the
//! response's `Cache-Control: max-age` says so) and, at most once per
//! [`REFETCH_GAP`], at once when a token names a `kid` the set lacks, so a
//! provider's rotation is picked up without a restart.
//!
//! A failed fetch keeps the last good set: counted by reason, logged at
//! WARN once per streak of failures, retried sooner ([`after_failure`]).
//! Joins read the current set without waiting; only a token with an
//! unknown `kid` waits, at most [`JOIN_WAIT`], for the fetch it asked for
//! ([`JwksUrl::await_kid`]).
//!
//! The decisions (when to fetch next, whether an unknown `kid` may ask for
//! a fetch) are pure functions of `now`, tested at exact instants.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};
use tracing::{debug, info, warn};

use super::KeySet;
use super::fetch::{FetchError, Fetched, Fetcher, Target};
use crate::metrics::AuthLabels;

/// The default of `--auth-jwks-refresh-secs`.
pub const REFRESH_SECS: u64 = 300;
/// The shortest wait between two fetches a provider's `max-age` can ask
/// for.
pub const MIN_REFRESH: Duration = Duration::from_secs(10);
/// The first retry after a failed fetch; each further failure doubles it,
/// up to the refresh interval.
pub const FIRST_RETRY: Duration = Duration::from_secs(5);
/// The shortest time between two fetches asked for by unknown `kid`s:
/// tokens naming made-up keys cannot make amble hammer the provider.
pub const REFETCH_GAP: Duration = Duration::from_secs(30);
/// The longest a Join with an unknown `kid` waits for the fetch it asked
/// for.
pub const JOIN_WAIT: Duration = Duration::from_secs(2);
/// The longest start-up tries to fetch the first set.
pub const START_WITHIN: Duration = Duration::from_secs(15);

/// The wait after a good fetch: the refresh interval, or the response's
/// `max-age` when shorter (but not under [`MIN_REFRESH`]).
pub fn after_success(interval: Duration, max_age: Option<Duration>) -> Duration {
    match max_age {
        Some(age) => age.max(MIN_REFRESH).min(interval),
        None => interval,
    }
}

/// The wait after the `streak`th failed fetch in a row (1 for the first):
/// [`FIRST_RETRY`], doubled each time, never more than the interval.
pub fn after_failure(interval: Duration, streak: u32) -> Duration {
    let doublings = streak.saturating_sub(1).min(16);
    FIRST_RETRY.saturating_mul(1u32 << doublings).min(interval)
}

/// What a token with an unknown `kid` may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ask {
    /// Start a fetch and wait for it.
    Fetch,
    /// A fetch asked for by another token is under way: wait for it.
    Wait,
    /// A fetch was asked for less than [`REFETCH_GAP`] ago: refused now.
    No,
}

/// The rate limit on fetches asked for by unknown `kid`s.
#[derive(Debug, Default)]
pub struct Refetch {
    last: Option<Instant>,
    pending: bool,
}

impl Refetch {
    /// Whether a token with an unknown `kid`, at `now`, may start a fetch.
    pub fn ask(&mut self, now: Instant) -> Ask {
        if self.pending {
            return Ask::Wait;
        }
        if self
            .last
            .is_some_and(|last| now.saturating_duration_since(last) < REFETCH_GAP)
        {
            return Ask::No;
        }
        self.last = Some(now);
        self.pending = true;
        Ask::Fetch
    }

    /// A fetch ended (any fetch: it read the set as it is now).
    pub fn done(&mut self) {
        self.pending = false;
    }
}

/// The metrics the fetches feed.
#[derive(Clone, Debug, Default)]
pub struct Counters {
    /// `amble_auth_jwks_fetch_failures_total{reason}`.
    pub failures: Family<AuthLabels, Counter>,
    /// `amble_auth_jwks_fetches_total`: good fetches.
    pub fetches: Counter,
    /// `amble_auth_jwks_keys`: keys in the set in use.
    pub keys: Gauge,
}

/// The key set fetched from `--auth-jwks-url`, kept fresh by a task that
/// ends when this is dropped.
#[derive(Debug)]
pub struct JwksUrl {
    target: Target,
    keys: watch::Receiver<Arc<KeySet>>,
    /// Fetches ended (good or not), for joins waiting on one.
    ended: watch::Receiver<u64>,
    refetch: Arc<Mutex<Refetch>>,
    wake: Arc<Notify>,
    _stop: DropGuard,
}

impl JwksUrl {
    /// Checks `url`, fetches the first set (trying again after transient
    /// failures for up to [`START_WITHIN`]), then starts the refresh task.
    /// An error says why no set could be had.
    pub async fn start(url: &str, interval: Duration, counters: Counters) -> Result<Self, String> {
        // The flag allows 10 s at least; a config built in code (tests) may
        // go lower, but never to a loop without a pause.
        let interval = interval.max(Duration::from_secs(1));
        let fetcher = Fetcher::new(Target::parse(url)?)?;
        let deadline = Instant::now() + START_WITHIN;
        let mut streak = 0;
        let first = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let err = match tokio::time::timeout(left, fetcher.get()).await {
                Ok(Ok(fetched)) => break fetched,
                Ok(Err(err)) => err,
                Err(_) => FetchError::Timeout,
            };
            counters.failures.get_or_create(&reason(&err)).inc();
            streak += 1;
            let pause = after_failure(interval, streak).min(Duration::from_secs(2));
            if !err.transient() || Instant::now() + pause >= deadline {
                return Err(err.to_string());
            }
            warn!(url = %fetcher.target(), %err, "auth: cannot fetch the key set yet; trying again");
            tokio::time::sleep(pause).await;
        };
        counters.fetches.inc();
        counters.keys.set(first.set.len() as i64);
        info!(url = %fetcher.target(), kids = ?first.set.kids(), skipped = ?first.set.skipped(),
              "auth: fetched the key set");
        let next = Instant::now() + after_success(interval, first.max_age);
        let (keys_tx, keys) = watch::channel(Arc::new(first.set));
        let (ended_tx, ended) = watch::channel(0);
        let refetch = Arc::new(Mutex::new(Refetch::default()));
        let wake = Arc::new(Notify::new());
        let stop = CancellationToken::new();
        let task = Refresh {
            fetcher: fetcher.clone(),
            interval,
            counters,
            keys: keys_tx,
            ended: ended_tx,
            refetch: Arc::clone(&refetch),
            wake: Arc::clone(&wake),
        };
        tokio::spawn(task.run(next, stop.clone()));
        Ok(Self {
            target: fetcher.target().clone(),
            keys,
            ended,
            refetch,
            wake,
            _stop: stop.drop_guard(),
        })
    }

    /// The URL.
    pub fn target(&self) -> &Target {
        &self.target
    }

    /// The set in use.
    pub fn current(&self) -> Arc<KeySet> {
        Arc::clone(&self.keys.borrow())
    }

    /// When the set lacks `kid`: asks for a fetch (unless one was asked
    /// for less than [`REFETCH_GAP`] ago) and waits for it, at most
    /// [`JOIN_WAIT`]. Returns at once when the set has `kid`.
    pub async fn await_kid(&self, kid: &str) {
        if self.keys.borrow().get(kid).is_some() {
            return;
        }
        let mut ended = self.ended.clone();
        let seen = *ended.borrow_and_update();
        let ask = self
            .refetch
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .ask(Instant::now());
        match ask {
            Ask::No => return,
            Ask::Fetch => {
                debug!(
                    kid,
                    "auth: a token names a kid the key set lacks; fetching it again"
                );
                self.wake.notify_one();
            }
            Ask::Wait => {}
        }
        let _ = tokio::time::timeout(JOIN_WAIT, ended.wait_for(|n| *n > seen)).await;
    }
}

fn reason(err: &FetchError) -> AuthLabels {
    AuthLabels {
        reason: err.reason(),
    }
}

/// The refresh task's state.
struct Refresh {
    fetcher: Fetcher,
    interval: Duration,
    counters: Counters,
    keys: watch::Sender<Arc<KeySet>>,
    ended: watch::Sender<u64>,
    refetch: Arc<Mutex<Refetch>>,
    wake: Arc<Notify>,
}

impl Refresh {
    async fn run(self, mut next: Instant, stop: CancellationToken) {
        let mut streak = 0u32;
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep_until(next) => {}
                () = self.wake.notified() => {}
            }
            let outcome = tokio::select! {
                () = stop.cancelled() => return,
                outcome = self.fetcher.get() => outcome,
            };
            next = Instant::now()
                + match outcome {
                    Ok(fetched) => {
                        let wait = after_success(self.interval, fetched.max_age);
                        self.accept(fetched, streak);
                        streak = 0;
                        wait
                    }
                    Err(err) => {
                        streak = streak.saturating_add(1);
                        self.counters.failures.get_or_create(&reason(&err)).inc();
                        let wait = after_failure(self.interval, streak);
                        if streak == 1 {
                            warn!(url = %self.fetcher.target(), %err, retry_secs = wait.as_secs(),
                                  "auth: cannot fetch the key set; keeping the last good one");
                        } else {
                            debug!(url = %self.fetcher.target(), %err, streak,
                                   "auth: still cannot fetch the key set");
                        }
                        wait
                    }
                };
            self.refetch
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .done();
            self.ended.send_modify(|n| *n += 1);
        }
    }

    fn accept(&self, fetched: Fetched, streak: u32) {
        let set = fetched.set;
        self.counters.fetches.inc();
        self.counters.keys.set(set.len() as i64);
        let changed = self.keys.borrow().kids() != set.kids();
        if changed || streak > 0 {
            info!(url = %self.fetcher.target(), kids = ?set.kids(), skipped = ?set.skipped(),
                  failed_before = streak, "auth: fetched the key set");
        } else {
            debug!(url = %self.fetcher.target(), "auth: the key set is unchanged");
        }
        self.keys.send_replace(Arc::new(set));
    }
}
