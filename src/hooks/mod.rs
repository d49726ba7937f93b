//! Webhooks (`--webhook-url`): room and member events POSTed to the app.
//!
//! [`Hooks`] is the handle the rest of the server emits through: rooms
//! call [`Hooks::joined`] and [`Hooks::left`] for their own members, and
//! [`Hooks::occupied`] / [`Hooks::vacated`] on a room's transitions; the
//! server API calls [`Hooks::kicked`]. Emitting never waits: the event is
//! pushed under a short `std` mutex into the bounded [`queue`] (pure: the
//! batch in flight, retries, drops) and the [`sender`] task is woken.
//! The sender POSTs one batch at a time, signed ([`sign`]), and on
//! shutdown tries to flush what is left for [`FLUSH`].
//!
//! It owns its flags ([`HookConfig`], flattened into `config::Config`),
//! the secret read at start, and the `amble_webhook_*` metrics' updates.

pub mod event;
pub mod occupancy;
pub mod queue;
pub mod sender;
pub mod sign;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::clock::Clock;
use crate::cluster::{Cluster, wire};
use crate::metrics::Metrics;
use crate::outbound::{Connector, PlainHttp, Target};

use event::{Source, What};
use occupancy::{Change, Occupancy, chosen};
use queue::{Limits, Pushed, Queue};

/// The longest shutdown waits for the queue to empty.
pub const FLUSH: Duration = Duration::from_secs(2);
/// The wait after a batch's first failed attempt.
pub const FIRST_RETRY: Duration = Duration::from_millis(500);
/// The longest wait between two attempts of a batch.
pub const MAX_RETRY: Duration = Duration::from_secs(30);

/// Webhooks: where events are POSTed, the secret they are signed with,
/// and the queue's bounds (`--webhook-*`).
#[derive(Clone, Debug, clap::Args)]
pub struct HookConfig {
    /// URL that room and member events are POSTed to, in batches of JSON,
    /// signed (see docs/api.md, "Webhooks"). https with the system's CA
    /// roots, or plain http (a warning at start unless the host is
    /// loopback). Needs --webhook-secret-file.
    #[arg(
        long,
        display_order = 100,
        env = "AMBLE_WEBHOOK_URL",
        value_name = "URL"
    )]
    pub webhook_url: Option<String>,

    /// File holding the secret each delivery is signed with
    /// (`Amble-Signature`, HMAC-SHA256; trailing line breaks are not part
    /// of it). Read once at start.
    #[arg(
        long,
        display_order = 101,
        env = "AMBLE_WEBHOOK_SECRET_FILE",
        value_name = "PATH"
    )]
    pub webhook_secret_file: Option<PathBuf>,

    /// Most events waiting for delivery; past it the oldest waiting event
    /// is dropped and counted (`amble_webhook_dropped_total`).
    #[arg(long, display_order = 102, env = "AMBLE_WEBHOOK_QUEUE", default_value_t = 10_000,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub webhook_queue: u32,

    /// Most events in one POST.
    #[arg(long, display_order = 103, env = "AMBLE_WEBHOOK_BATCH", default_value_t = 100,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub webhook_batch: u32,

    /// How long one POST may take, connection included, milliseconds; a
    /// slower receiver's batch is tried again.
    #[arg(long, display_order = 104, env = "AMBLE_WEBHOOK_TIMEOUT_MS", default_value_t = 5_000,
          value_parser = clap::value_parser!(u64).range(100..=60_000))]
    pub webhook_timeout_ms: u64,
}

impl Default for HookConfig {
    fn default() -> Self {
        Self {
            webhook_url: None,
            webhook_secret_file: None,
            webhook_queue: 10_000,
            webhook_batch: 100,
            webhook_timeout_ms: 5_000,
        }
    }
}

/// Why webhooks cannot start; the server does not start either.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// `--webhook-url` is not a URL amble can POST to.
    #[error("--webhook-url {url}: {why}")]
    Url { url: String, why: String },
    /// One of the two flags without the other.
    #[error("--webhook-url and --webhook-secret-file go together: {0} is missing")]
    Missing(&'static str),
    /// The secret file cannot be read.
    #[error("--webhook-secret-file {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The secret file is empty (after trailing line breaks).
    #[error("--webhook-secret-file {}: the file is empty; put a random secret in it (e.g. `openssl rand -hex 32`)", path.display())]
    EmptySecret { path: PathBuf },
}

/// Reads the signing secret: the file's bytes, less trailing line breaks.
pub fn read_secret(path: &Path) -> Result<Vec<u8>, SetupError> {
    let mut secret = std::fs::read(path).map_err(|source| SetupError::Read {
        path: path.to_owned(),
        source,
    })?;
    while secret.last().is_some_and(|b| matches!(b, b'\n' | b'\r')) {
        secret.pop();
    }
    if secret.is_empty() {
        return Err(SetupError::EmptySecret {
            path: path.to_owned(),
        });
    }
    Ok(secret)
}

/// The queue and the next event number, under one lock so ids follow the
/// queue's order.
struct Inner {
    queue: Queue,
    seq: u64,
}

/// The handle events are emitted through; shared by rooms, the API and
/// the sender task.
pub struct Hooks {
    inner: Mutex<Inner>,
    /// Wakes the sender when an event is queued.
    wake: Notify,
    source: Source,
    clock: Clock,
    metrics: Arc<Metrics>,
    /// Cluster mode: which rooms have members on which node. Taken after a
    /// room's `state` and before the queue; events of a transition are
    /// queued under it, so they keep the map's order.
    occupancy: Mutex<Occupancy>,
    /// Cluster mode: set once at start.
    cluster: OnceLock<Arc<Cluster>>,
    /// Shutting down: in a cluster the other nodes send this node's rooms'
    /// `room.vacated` once its goodbye reached them.
    stopping: AtomicBool,
    /// Stops the sender (after its flush) and the announcements.
    stop: CancellationToken,
}

impl std::fmt::Debug for Hooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hooks").finish_non_exhaustive()
    }
}

/// A running sender: stop it with [`Running::flush_and_stop`].
pub struct Running {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Running {
    /// Tells the sender to deliver what is queued within [`FLUSH`], then
    /// waits for it (it logs how many events were left).
    pub async fn flush_and_stop(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}

impl Hooks {
    /// A handle with no sender (events only queue): for tests, and for
    /// [`start`](Self::start).
    pub fn new(
        limits: Limits,
        node: Option<Arc<str>>,
        clock: Clock,
        metrics: Arc<Metrics>,
    ) -> Arc<Self> {
        metrics.enable_webhooks();
        Arc::new(Self {
            inner: Mutex::new(Inner {
                queue: Queue::new(limits),
                seq: 0,
            }),
            wake: Notify::new(),
            source: Source::new(node, clock.now_ms()),
            clock,
            metrics,
            occupancy: Mutex::new(Occupancy::default()),
            cluster: OnceLock::new(),
            stopping: AtomicBool::new(false),
            stop: CancellationToken::new(),
        })
    }

    /// Webhooks as `config` says: `None` without `--webhook-url`. Reads
    /// the secret, checks the URL, and spawns the sender on the current
    /// runtime. `node` is this node's name in a cluster.
    pub fn start(
        config: &HookConfig,
        node: Option<Arc<str>>,
        clock: Clock,
        metrics: Arc<Metrics>,
    ) -> Result<Option<(Arc<Self>, Running)>, SetupError> {
        let (url, secret_file) = match (&config.webhook_url, &config.webhook_secret_file) {
            (None, None) => return Ok(None),
            (Some(_), None) => return Err(SetupError::Missing("--webhook-secret-file")),
            (None, Some(_)) => return Err(SetupError::Missing("--webhook-url")),
            (Some(url), Some(file)) => (url, file),
        };
        let bad = |why: String| SetupError::Url {
            url: url.clone(),
            why,
        };
        let target = Target::parse(url, PlainHttp::Anywhere).map_err(bad)?;
        let secret = read_secret(secret_file)?;
        if !target.tls() && !target.is_loopback() {
            warn!(
                url = %target,
                "webhooks go over plain http to a host that is not this machine: anyone on the \
                 path can read them (their signature stops changes, not reading); use https \
                 unless the network is private"
            );
        }
        let connector = Connector::new(target.clone()).map_err(bad)?;
        let limits = Limits {
            capacity: config.webhook_queue as usize,
            batch: config.webhook_batch as usize,
            first_retry: FIRST_RETRY,
            max_retry: MAX_RETRY,
        };
        let hooks = Self::new(limits, node, clock, metrics);
        let stop = hooks.stop.clone();
        let task = tokio::spawn(sender::run(
            Arc::clone(&hooks),
            sender::Post {
                connector,
                secret,
                timeout: Duration::from_millis(config.webhook_timeout_ms),
            },
            stop.clone(),
        ));
        info!(url = %target, "webhooks: events are POSTed to the receiver");
        Ok(Some((hooks, Running { stop, task })))
    }

    fn inner(&self) -> MutexGuard<'_, Inner> {
        // Every critical section writes whole values: poisoning is ignored.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues an event of `room`, now; never waits.
    pub fn emit(&self, room: &Arc<str>, what: What) {
        let kind = what.kind();
        let now_ms = self.clock.now_ms();
        let (pushed, depth) = {
            let mut inner = self.inner();
            inner.seq += 1;
            let event = self.source.event(inner.seq, now_ms, Arc::clone(room), what);
            let pushed = inner.queue.push(event);
            (pushed, inner.queue.len())
        };
        self.metrics.webhook_emitted(kind);
        self.metrics.webhook_queue_depth.set(depth as i64);
        if pushed != Pushed::Queued {
            self.metrics.webhook_dropped("queue_full", 1);
        }
        self.wake.notify_one();
    }

    /// `member.joined`: member `member_id` of this node joined `room`.
    pub fn joined(&self, room: &Arc<str>, member_id: u32, name: &str, user: Option<Arc<str>>) {
        self.emit(
            room,
            What::Joined {
                member_id,
                name: name.to_owned(),
                user,
            },
        );
    }

    /// `member.left`: member `member_id` of this node left `room` for
    /// `reason` after `duration_ms` in it.
    pub fn left(
        &self,
        room: &Arc<str>,
        member_id: u32,
        name: &str,
        user: Option<Arc<str>>,
        reason: crate::protocol::LeaveReason,
        duration_ms: u64,
    ) {
        self.emit(
            room,
            What::Left {
                member_id,
                name: name.to_owned(),
                user,
                reason: leave_reason_name(reason),
                duration_ms,
            },
        );
    }

    /// `member.kicked`: the server API removed this node's member
    /// `member_id` (of user `user`, if known) from `room` by `action`
    /// (`kick`, `ban` or `close`, the room closed), saying `reason`. Its
    /// `member.left` follows.
    pub fn kicked(
        &self,
        room: &Arc<str>,
        member_id: u32,
        user: Option<Arc<str>>,
        action: &'static str,
        reason: &str,
    ) {
        self.emit(
            room,
            What::Kicked {
                member_id,
                user,
                action,
                reason: reason.to_owned(),
                by: "api",
            },
        );
    }

    /// This node's first member of `room` arrived: on a single server
    /// `room.occupied`; in a cluster, told to the others, and sent by the
    /// node chosen for the room if the room had nobody anywhere.
    pub fn local_occupied(&self, room: &Arc<str>) {
        self.local(room, true);
    }

    /// This node's last member of `room` left: on a single server
    /// `room.vacated`; in a cluster, as [`local_occupied`](Self::local_occupied).
    pub fn local_vacated(&self, room: &Arc<str>) {
        self.local(room, false);
    }

    fn local(&self, room: &Arc<str>, occupied: bool) {
        let Some(cluster) = self.cluster.get() else {
            self.emit(
                room,
                if occupied {
                    What::Occupied
                } else {
                    What::Vacated
                },
            );
            return;
        };
        let me = cluster.me();
        let mut map = self.occupancy();
        let changes = map.set(&me.node, me.epoch, room, occupied);
        // Under the lock: this node's messages go out in the order of its
        // changes (`publish` never waits).
        let (on, off) = if occupied {
            (vec![room.to_string()], Vec::new())
        } else {
            (Vec::new(), vec![room.to_string()])
        };
        cluster.publish(
            cluster.subjects().occupancy(),
            wire::encode_occupancy(cluster.origin_pb(), on, off, false),
        );
        self.send_changes(cluster, changes);
    }

    /// Another node's rooms (`P.v2.o.all`): its transitions, sent here if
    /// this node is the one chosen for the room.
    pub fn remote_occupancy(&self, update: wire::Occupancy) {
        let Some(cluster) = self.cluster.get() else {
            return;
        };
        let node = &update.origin.node;
        let epoch = update.origin.epoch;
        let arcs = |rooms: Vec<String>| rooms.into_iter().map(Arc::<str>::from).collect::<Vec<_>>();
        let mut map = self.occupancy();
        let changes = if update.full {
            map.replace(node, epoch, &arcs(update.occupied))
        } else {
            let mut changes = Vec::new();
            for room in arcs(update.occupied) {
                changes.extend(map.set(node, epoch, &room, true));
            }
            for room in arcs(update.vacated) {
                changes.extend(map.set(node, epoch, &room, false));
            }
            changes
        };
        self.send_changes(cluster, changes);
    }

    /// Node `node` in `epoch` is gone (stopped, lost, restarted): the rooms
    /// only it had are vacated.
    pub fn node_lost(&self, node: &str, epoch: u64) {
        let Some(cluster) = self.cluster.get() else {
            return;
        };
        let mut map = self.occupancy();
        let changes = map.drop_node(node, epoch);
        self.send_changes(cluster, changes);
    }

    /// Queues the transitions this node is chosen for; called with the
    /// map's lock held, so they are queued in the map's order.
    fn send_changes(&self, cluster: &Cluster, changes: Vec<Change>) {
        if changes.is_empty() {
            return;
        }
        if !cluster.settled() {
            // Too young to know every node's rooms: a transition seen now
            // may be one the others saw long ago.
            debug!(
                changes = changes.len(),
                "webhooks: room transitions before this node knew the cluster; not sent"
            );
            return;
        }
        let live = cluster.live_nodes();
        let me = &cluster.me().node;
        // Stopping with peers: they send this node's rooms' vacating once
        // its goodbye reaches them.
        if self.stopping.load(Ordering::Relaxed) && live.len() > 1 {
            return;
        }
        for change in changes {
            let (room, what) = match change {
                Change::Occupied(room) => (room, What::Occupied),
                Change::Vacated(room) => (room, What::Vacated),
            };
            if chosen(&room, &live) == Some(me) {
                self.emit(&room, what);
            }
        }
    }

    fn occupancy(&self) -> MutexGuard<'_, Occupancy> {
        // Every critical section writes whole values: poisoning is ignored.
        self.occupancy
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Cluster mode: room transitions are decided with the other nodes
    /// from now on. Announces this node's rooms when a peer appears and
    /// every [`occupancy::ANNOUNCE`].
    pub fn attach_cluster(self: &Arc<Self>, cluster: Arc<Cluster>) {
        if self.cluster.set(Arc::clone(&cluster)).is_err() {
            return;
        }
        tokio::spawn(announce(Arc::downgrade(self), cluster, self.stop.clone()));
    }

    /// Shutdown began: in a cluster with peers, this node no longer sends
    /// room transitions.
    pub fn begin_shutdown(&self) {
        self.stopping.store(true, Ordering::Relaxed);
    }

    /// Publishes this node's whole list of rooms with members.
    fn announce(&self, cluster: &Cluster) {
        let map = self.occupancy();
        let rooms = map
            .rooms_of(&cluster.me().node)
            .iter()
            .map(ToString::to_string)
            .collect();
        cluster.publish(
            cluster.subjects().occupancy(),
            wire::encode_occupancy(cluster.origin_pb(), rooms, Vec::new(), true),
        );
    }

    /// Events held (waiting and in flight).
    pub fn queued(&self) -> usize {
        self.inner().queue.len()
    }

    /// Takes every queued event out, as JSON, oldest first: for tests
    /// (the sender is not running).
    #[cfg(test)]
    pub(crate) fn drain_json(&self) -> Vec<serde_json::Value> {
        let mut inner = self.inner();
        let mut out = Vec::new();
        let now = std::time::Instant::now();
        while let queue::Next::Send(d) = inner.queue.next(now) {
            let v: serde_json::Value = serde_json::from_slice(&d.body).unwrap_or_default();
            out.extend(v["events"].as_array().into_iter().flatten().cloned());
            inner.queue.done(now, queue::Outcome::Delivered);
        }
        out
    }
}

/// Announces `hooks`' rooms to the cluster when the live peers change and
/// every [`occupancy::ANNOUNCE`], until `stop`.
async fn announce(hooks: Weak<Hooks>, cluster: Arc<Cluster>, stop: CancellationToken) {
    let mut peers = cluster.peers();
    tokio::select! {
        () = tokio::time::sleep(cluster.until_settled()) => {}
        () = stop.cancelled() => return,
    }
    match hooks.upgrade() {
        Some(hooks) => hooks.announce(&cluster),
        None => return,
    }
    info!(
        nodes = cluster.live_nodes().len(),
        "webhooks: room.occupied and room.vacated are now sent by the node chosen for each room"
    );
    loop {
        tokio::select! {
            changed = peers.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            () = tokio::time::sleep(occupancy::ANNOUNCE) => {}
            () = stop.cancelled() => return,
        }
        let Some(hooks) = hooks.upgrade() else { return };
        hooks.announce(&cluster);
    }
}

/// `LEAVE_REASON_TIMED_OUT` is `timed_out`.
pub fn leave_reason_name(reason: crate::protocol::LeaveReason) -> String {
    reason
        .as_str_name()
        .trim_start_matches("LEAVE_REASON_")
        .to_ascii_lowercase()
}

#[cfg(test)]
mod tests;
