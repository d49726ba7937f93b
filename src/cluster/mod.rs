//! Cluster mode: rooms shared by several amble nodes through NATS.
//!
//! Each node is the single writer of its own members. A room on a node
//! holds its local members and a replica of every other node's part, kept
//! by `room::remote` from the [`wire::Update`]s this module hands it. This
//! module is the transport and the membership of nodes; it never touches a
//! socket or a member:
//!
//! - [`wire`]: the `amble.cluster.v1` messages, encoded and checked. Pure.
//! - [`directory`]: which peers are alive, by (name, epoch). Pure.
//! - [`link`]: the NATS client on a runtime of its own (one OS thread):
//!   connection, subscriptions, heartbeats, the outgoing queue, requests.
//! - [`settings`]: the cluster's flags ([`ClusterConfig`]) and what a
//!   node runs with ([`ClusterSettings`]: name and slot resolved).
//!
//! [`Cluster`] is the handle the rest of the server holds. Rooms never await
//! NATS under a lock or in the tick: they push encoded messages into a
//! bounded queue ([`Cluster::publish`], drops counted), and remote updates
//! come back through bounded channels to the inbound tasks on the server's
//! runtime (one per core; a room always goes to the same one, so its
//! updates keep the order NATS delivered them in). Node drops and part
//! resets take a small control queue that those tasks handle first.

pub mod directory;
pub mod link;
pub mod settings;
pub mod subjects;
pub mod wire;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, Weak};
use std::time::Duration;

use async_nats::Subject;
use bytes::Bytes;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::metrics::Metrics;
use crate::protocol::Rules;
use directory::Directory;
pub use settings::{ClusterConfig, ClusterSettings, SettingsError};
use subjects::Subjects;
use wire::{Origin, Update, cpb};

/// What the rooms give the cluster, and take from it. `room::Rooms`
/// implements it; the cluster holds it weakly (rooms own the cluster
/// handle, not the other way round).
pub trait RoomSide: Send + Sync {
    /// Queues this node's full part of `room` to `to` (the room's subject
    /// when `None`); a room not open here is answered as a `closed` full
    /// state (nobody here). False only outside cluster mode.
    fn publish_full(&self, room: &str, to: Option<Subject>) -> bool;
    /// Rooms open (subscribed) on this node.
    fn open_rooms(&self) -> Vec<String>;
    /// Local members per room, for `/api/rooms` across the cluster.
    fn local_counts(&self) -> Vec<(String, u32)>;
    /// Applies another node's update to `room` (on the server runtime, in
    /// NATS order).
    fn apply(&self, room: &str, update: Update);
    /// Removes every member of `node` in epoch `epoch` from every room, with
    /// `Left{SERVER_LOST}`.
    fn drop_node(&self, node: &str, epoch: u64);
    /// Another node's rooms with members (`P.v2.o.all`), for webhooks;
    /// called on the link's thread, in the order NATS delivered them: it
    /// must not wait.
    fn occupancy(&self, update: wire::Occupancy) {
        let _ = update;
    }
}

/// What the server API gives the cluster: a peer's call run on this
/// node's members. The cluster holds it weakly, as it holds the rooms.
pub trait ApiSide: Send + Sync {
    /// Runs `call` here and answers (without the origin, which the cluster
    /// adds).
    fn answer(&self, call: cpb::ApiCall) -> futures_util::future::BoxFuture<'_, cpb::ApiAnswer>;
}

/// Members per room name.
pub type RoomCounts = Vec<(String, u32)>;

/// What the link hands the server runtime, in order.
pub enum Inbound {
    Update(Arc<str>, Update),
    DropNode(Arc<str>, u64),
}

/// Drops of nodes (expired, `bye`, replaced) and resets of a part, from
/// the link's control and heartbeat tasks to the rooms. Pushing never
/// waits, so a lagging server runtime cannot stop this node's heartbeats;
/// [`run_inbound`] handles these before the queued room updates.
pub(crate) struct ControlQueue {
    queue: Mutex<std::collections::VecDeque<Inbound>>,
    bound: usize,
    wake: tokio::sync::Notify,
}

impl ControlQueue {
    pub(crate) fn new(bound: usize) -> Self {
        Self {
            queue: Mutex::new(std::collections::VecDeque::new()),
            bound,
            wake: tokio::sync::Notify::new(),
        }
    }

    /// Queues `msg`; false (nothing queued) past the bound.
    pub(crate) fn push(&self, msg: Inbound) -> bool {
        {
            let mut q = lock(&self.queue);
            if q.len() >= self.bound {
                return false;
            }
            q.push_back(msg);
        }
        self.wake.notify_one();
        true
    }

    fn pop(&self) -> Option<Inbound> {
        lock(&self.queue).pop_front()
    }
}

/// The handle to this node's cluster membership.
pub struct Cluster {
    pub settings: ClusterSettings,
    subjects: Subjects,
    me: Origin,
    me_pb: cpb::Origin,
    rules: Rules,
    metrics: Arc<Metrics>,
    /// The NATS client and runtime (`None` only in unit tests, where the
    /// outgoing queue is read by the test).
    nats: Option<Nats>,
    out: mpsc::Sender<(Subject, Bytes)>,
    /// Room updates to the rooms, one channel per [`run_inbound`] task
    /// ([`Cluster::inbound_for`] picks a room's).
    inbound: Vec<mpsc::Sender<Inbound>>,
    control: Arc<ControlQueue>,
    /// This node's full states per room, paced.
    fulls: link::Fulls,
    directory: Mutex<Directory>,
    /// The directory's live peer count, as `amble_cluster_peers` shows it,
    /// for in-process callers that await a count ([`Cluster::peers`]).
    peers: watch::Sender<usize>,
    connected: AtomicBool,
    /// When the NATS connection was lost (None while connected).
    down_since: Mutex<Option<Instant>>,
    started: Instant,
    /// One token per room subscription; cancelling it unsubscribes.
    subs: Mutex<HashMap<Arc<str>, CancellationToken>>,
    /// `/api/rooms` across the cluster, cached for a second.
    counts: tokio::sync::Mutex<Option<(Instant, RoomCounts)>>,
    rooms: OnceLock<Weak<dyn RoomSide>>,
    /// The server API's side: runs peers' calls on this node's members.
    api: OnceLock<Weak<dyn ApiSide>>,
    stop: CancellationToken,
}

/// The NATS client, and the runtime where subscriptions are read.
pub(crate) struct Nats {
    client: async_nats::Client,
    link: tokio::runtime::Handle,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section writes whole values.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Cluster {
    pub fn me(&self) -> &Origin {
        &self.me
    }

    pub fn origin_pb(&self) -> &cpb::Origin {
        &self.me_pb
    }

    pub fn slot(&self) -> u32 {
        self.me.slot
    }

    pub fn slots(&self) -> u32 {
        self.me.slots
    }

    pub fn rules(&self) -> &Rules {
        &self.rules
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The number of live peers (other nodes), as it changes: what
    /// `amble_cluster_peers` shows, for a caller in the same process that
    /// awaits the cluster forming instead of polling `/metrics`.
    pub fn peers(&self) -> watch::Receiver<usize> {
        self.peers.subscribe()
    }

    /// Publishes the directory's live peer count to `amble_cluster_peers`
    /// and to [`Cluster::peers`].
    pub(crate) fn count_peers(&self) {
        let live = lock(&self.directory).live();
        self.metrics.cluster_peers.set(live as i64);
        self.peers
            .send_if_modified(|peers| std::mem::replace(peers, live) != live);
    }

    /// Gives the cluster its rooms.
    pub fn attach(&self, rooms: Weak<dyn RoomSide>) {
        let _ = self.rooms.set(rooms);
    }

    /// Gives the cluster the server API's side.
    pub fn attach_api(&self, api: Weak<dyn ApiSide>) {
        let _ = self.api.set(api);
    }

    fn api_side(&self) -> Option<Arc<dyn ApiSide>> {
        self.api.get().and_then(Weak::upgrade)
    }

    /// Asks every live peer to run a server API `call` on its members, and
    /// gathers their answers until each has answered or `timeout` passes
    /// (a peer that does not answer in time is left out).
    pub async fn api_gather(&self, call: cpb::ApiCall, timeout: Duration) -> Vec<cpb::ApiAnswer> {
        let deadline = Instant::now() + timeout;
        let mut answers = Vec::new();
        let mut counted: HashSet<(Arc<str>, u64)> = HashSet::new();
        link::gather(
            self,
            self.subjects.api(),
            wire::encode_api_call(&self.me_pb, call),
            deadline,
            |bytes| {
                match wire::decode_api_answer(&bytes, self.me.slots) {
                    Ok((from, answer)) => {
                        if self.observe(&from)
                            && counted.insert((Arc::clone(&from.node), from.epoch))
                        {
                            answers.push(answer);
                            return Some(from);
                        }
                    }
                    Err(err) => self.bad(&err.to_string()),
                }
                None
            },
        )
        .await;
        answers
    }

    fn room_side(&self) -> Option<Arc<dyn RoomSide>> {
        self.rooms.get().and_then(Weak::upgrade)
    }

    /// Where this deployment's nodes publish `room`'s updates.
    pub fn room_subject(&self, room: &str) -> Subject {
        self.subjects.room(room)
    }

    /// This deployment's subjects.
    pub(crate) fn subjects(&self) -> &Subjects {
        &self.subjects
    }

    /// Queues `payload` for `subject` without waiting: never blocks, so a
    /// room may call it under its lock. A full queue drops it (counted);
    /// the receivers see a gap and ask for a full state.
    pub fn publish(&self, subject: Subject, payload: Bytes) {
        if self.out.try_send((subject, payload)).is_err() {
            self.metrics.cluster_dropped.inc();
        }
    }

    /// Asks `node` to publish its full state of `room` (a gap, an unknown
    /// part). Never blocks.
    pub fn request_sync(&self, node: &str, rooms: Vec<String>) {
        let subject = self.subjects.node(node);
        self.publish(subject, wire::encode_sync_request(&self.me_pb, rooms));
    }

    /// The names of the live nodes, this one included.
    pub fn live_nodes(&self) -> Vec<Arc<str>> {
        let mut nodes: Vec<Arc<str>> = lock(&self.directory)
            .live_peers()
            .map(|(name, _)| name)
            .collect();
        nodes.push(Arc::clone(&self.me.node));
        nodes
    }

    /// Whether this node has run long enough to know its peers (a
    /// heartbeat and a half).
    pub fn settled(&self) -> bool {
        self.until_settled().is_zero()
    }

    /// How long until [`settled`](Self::settled).
    pub fn until_settled(&self) -> Duration {
        (self.settings.heartbeat + self.settings.heartbeat / 2)
            .saturating_sub(self.started.elapsed())
    }

    /// Whether `(node, epoch)` is a live peer.
    pub fn is_live(&self, node: &str, epoch: u64) -> bool {
        lock(&self.directory).is_live(node, epoch)
    }

    /// Opens `room` on this node: subscribes to its subject, waits until
    /// NATS has the subscription, then asks every node for its part and
    /// gathers the answers until every live peer answered or the snapshot
    /// timeout. Returns their full states (a node with nobody there answers
    /// with an empty one).
    pub async fn open(self: &Arc<Self>, room: &str) -> Vec<Update> {
        let deadline = Instant::now() + self.settings.snapshot_timeout;
        link::subscribe_room(self, room, deadline).await;
        if let Some(nats) = &self.nats {
            let _ = tokio::time::timeout_at(deadline, nats.client.flush()).await;
        }
        let request = wire::encode_snapshot_request(&self.me_pb);
        let subject = self.subjects.snapshot(room);
        let mut fulls = Vec::new();
        link::gather(self, subject, request, deadline, |bytes| {
            match wire::decode_update(&bytes, self.me.slots, &self.rules) {
                Ok(update) if update.full => {
                    if self.observe(&update.origin) {
                        let from = update.origin.origin.clone();
                        fulls.push(update);
                        return Some(from);
                    }
                }
                Ok(_) => self.bad("snapshot answer is not a full state"),
                Err(err) => self.bad(&err.to_string()),
            }
            None
        })
        .await;
        fulls
    }

    /// Stops the subscription to `room` (its last local member left and the
    /// linger passed).
    pub fn close(&self, room: &str) {
        if let Some(token) = lock(&self.subs).remove(room) {
            token.cancel();
            self.metrics.cluster_rooms_subscribed.dec();
        }
    }

    /// How many peers answer a request now, and whether this node is too
    /// new to know them all (then a request waits for its deadline).
    fn expected_answers(&self) -> (HashSet<(Arc<str>, u64)>, bool) {
        let young = self.started.elapsed() < self.settings.heartbeat + self.settings.heartbeat / 2;
        (lock(&self.directory).live_peers().collect(), young)
    }

    /// Records a message from `from`; false if it is stale (a retired
    /// epoch, or our own name): drop it.
    fn observe(&self, from: &Origin) -> bool {
        link::observe(self, from)
    }

    fn bad(&self, why: &str) {
        self.metrics.cluster_bad_messages.inc();
        debug!(why, "cluster message dropped");
    }

    /// Local member counts per room across the cluster, for `/api/rooms`:
    /// this node's plus every live peer's answer, cached for a second.
    pub async fn room_counts(self: &Arc<Self>) -> Vec<(String, u32)> {
        let mut cache = self.counts.lock().await;
        if let Some((at, counts)) = cache.as_ref()
            && at.elapsed() < Duration::from_secs(1)
        {
            return counts.clone();
        }
        let mut total: HashMap<String, u32> = HashMap::new();
        if let Some(rooms) = self.room_side() {
            for (name, n) in rooms.local_counts() {
                *total.entry(name).or_default() += n;
            }
        }
        let deadline = Instant::now() + self.settings.snapshot_timeout;
        // Each node counted once, though a node may answer twice.
        let mut counted: HashSet<(Arc<str>, u64)> = HashSet::new();
        link::gather(
            self,
            self.subjects.counts(),
            wire::encode_room_counts(&self.me_pb, Vec::new()),
            deadline,
            |bytes| {
                match wire::decode_room_counts(&bytes, self.me.slots, &self.rules) {
                    Ok((from, rooms)) => {
                        if self.observe(&from)
                            && counted.insert((Arc::clone(&from.node), from.epoch))
                        {
                            for (name, n) in rooms {
                                let entry = total.entry(name).or_default();
                                *entry = entry.saturating_add(n);
                            }
                            return Some(from);
                        }
                    }
                    Err(err) => self.bad(&err.to_string()),
                }
                None
            },
        )
        .await;
        let mut counts: Vec<(String, u32)> = total.into_iter().filter(|(_, n)| *n > 0).collect();
        counts.sort();
        *cache = Some((Instant::now(), counts.clone()));
        counts
    }

    /// The second line of `/healthz`. A name clash or a slot clash is
    /// added after the connection's state: `; NAME CLASH: ...`,
    /// `; SLOT CLASH: ...`.
    pub fn health_line(&self) -> String {
        let node = &self.me.node;
        let mut line = if self.connected.load(Ordering::Relaxed) {
            let peers = lock(&self.directory).live();
            let noun = if peers == 1 { "peer" } else { "peers" };
            format!("cluster {node}: connected, {peers} {noun}")
        } else {
            let secs = lock(&self.down_since)
                .map_or(self.started.elapsed(), |at| at.elapsed())
                .as_secs();
            format!("cluster {node}: NATS unreachable for {secs}s; serving local members only")
        };
        line.push_str(&self.clashes(Instant::now()));
        line
    }

    /// What `/healthz` adds for the clashes the directory knows of at
    /// `now` (empty when there are none).
    fn clashes(&self, now: Instant) -> String {
        let directory = lock(&self.directory);
        let mut text = String::new();
        if directory.own_name_clash(now) {
            text.push_str(&format!(
                "; NAME CLASH: another process runs as {}",
                self.me.node
            ));
        }
        let names = directory.name_clashes(now);
        if !names.is_empty() {
            text.push_str(&format!(
                "; NAME CLASH: two processes run as {}",
                names.join(", ")
            ));
        }
        let slots = directory.slot_clashes();
        if !slots.is_empty() {
            text.push_str(&format!(
                "; SLOT CLASH: slot {} is also held by {}",
                self.me.slot,
                slots.join(", ")
            ));
        }
        text
    }

    /// Graceful stop: tells the other nodes (`bye`) so they remove this
    /// node's members at once, then closes the link.
    pub async fn stop(&self, rooms: u32, members: u32) {
        let bye = wire::encode_heartbeat(
            &self.me_pb,
            cpb::Heartbeat {
                origin: None,
                server_time_ms: 0,
                rooms,
                members,
                bye: true,
                claiming: false,
            },
        );
        let subject = self.subjects.heartbeats();
        let send = async {
            if let Some(nats) = &self.nats {
                let _ = nats.client.publish(subject, bye).await;
                let _ = nats.client.flush().await;
            }
        };
        if tokio::time::timeout(Duration::from_millis(500), send)
            .await
            .is_err()
        {
            warn!("cluster: the goodbye to the other nodes did not go out in time");
        }
        self.stop.cancel();
    }
}

impl Cluster {
    /// A cluster handle with no NATS behind it, for unit tests: what the
    /// rooms publish lands in the returned receiver.
    #[cfg(test)]
    pub(crate) fn detached(
        settings: ClusterSettings,
        metrics: Arc<Metrics>,
    ) -> (Arc<Self>, mpsc::Receiver<(Subject, Bytes)>) {
        let me = Origin {
            node: Arc::from(settings.node.as_str()),
            epoch: 1,
            slot: settings.slot,
            slots: settings.slots,
        };
        let (out, rx) = mpsc::channel(settings.queue);
        let (inbound, _) = mpsc::channel(1);
        let cluster = Arc::new(Self {
            subjects: Subjects::new(&settings.prefix),
            me_pb: me.to_pb(),
            directory: Mutex::new(Directory::new(
                me.clone(),
                settings.node_timeout,
                settings.heartbeat,
            )),
            peers: watch::Sender::new(0),
            me,
            rules: Rules::default(),
            metrics,
            nats: None,
            out,
            inbound: vec![inbound],
            control: Arc::new(ControlQueue::new(settings.queue)),
            fulls: Mutex::default(),
            connected: AtomicBool::new(true),
            down_since: Mutex::new(None),
            started: Instant::now(),
            subs: Mutex::new(HashMap::new()),
            counts: tokio::sync::Mutex::new(None),
            rooms: OnceLock::new(),
            api: OnceLock::new(),
            stop: CancellationToken::new(),
            settings,
        });
        (cluster, rx)
    }

    /// Records a message from `from`, as the link does before it hands an
    /// update to the rooms; a new epoch of a known node is a restart, whose
    /// slot claim (`P.v2.q.nodes`) came first.
    #[cfg(test)]
    pub(crate) fn hear(&self, from: &Origin) {
        let mut directory = lock(&self.directory);
        directory.announce(from);
        directory.seen(from, Instant::now());
    }

    /// Test settings: node `name` in `slot` of 16.
    #[cfg(test)]
    pub(crate) fn test_settings(name: &str, slot: u32) -> ClusterSettings {
        let config = ClusterConfig {
            nats: vec!["nats://127.0.0.1:1".into()],
            node_name: Some(name.into()),
            node_slot: Some(slot),
            cluster_room_linger_ms: 0,
            ..ClusterConfig::default()
        };
        ClusterSettings::from_config(&config, 100, 1)
            .ok()
            .flatten()
            .expect("valid test settings")
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Cluster {
    /// The channel to the task that applies `room`'s updates: always the
    /// same one for a room, so its updates keep their order.
    fn inbound_for(&self, room: &str) -> &mpsc::Sender<Inbound> {
        &self.inbound[shard_of(room, self.inbound.len())]
    }
}

/// The shard, of `shards`, that applies `room`'s updates (FNV-1a).
fn shard_of(room: &str, shards: usize) -> usize {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in room.bytes() {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    (hash % shards.max(1) as u64) as usize
}

/// Hands what the link received to the rooms on the server runtime (one
/// task per shard of the rooms; the control queue is shared and drained by
/// whichever task gets to it first; a node's drop covers every room, and
/// the is-live check below keeps any shard from applying that node's
/// queued updates after it): the
/// control queue first, then the room updates in the order NATS delivered
/// them (writes to sockets run outside tokio's cooperative budget, as every
/// room write does). An update from a node declared down since it was read
/// is dropped: the node's drop went first, and the node is asked for its
/// full states when heard again.
async fn run_inbound(
    cluster: Weak<Cluster>,
    control: Arc<ControlQueue>,
    mut rx: mpsc::Receiver<Inbound>,
) {
    loop {
        let msg = match control.pop() {
            Some(msg) => msg,
            None => tokio::select! {
                biased;
                () = control.wake.notified() => continue,
                msg = rx.recv() => match msg {
                    Some(msg) => msg,
                    None => return,
                },
            },
        };
        let Some(cluster) = cluster.upgrade() else {
            return;
        };
        if let Inbound::Update(_, u) = &msg
            && !cluster.is_live(&u.origin.node, u.origin.epoch)
        {
            continue;
        }
        let Some(rooms) = cluster.room_side() else {
            continue;
        };
        drop(cluster);
        tokio::task::unconstrained(async move {
            match msg {
                Inbound::Update(room, update) => rooms.apply(&room, update),
                Inbound::DropNode(node, epoch) => rooms.drop_node(&node, epoch),
            }
        })
        .await;
    }
}
