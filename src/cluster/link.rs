//! The NATS side of a node, on a runtime of its own (one OS thread), so a
//! long fan-out on the server's runtime cannot starve heartbeats.
//!
//! It connects (no echo, named `amble/<node>/<epoch>`, retrying the first
//! connection and reconnecting with backoff), drains the outgoing queue,
//! publishes heartbeats and declares silent peers down, answers snapshot,
//! sync and room-count requests, and reads one subscription per open room,
//! handing decoded updates to the server runtime in order.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use async_nats::{ConnectOptions, Event, Subject, Subscriber};
use bytes::Bytes;
use futures_util::StreamExt as _;
use tokio::sync::mpsc;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use super::directory::{Directory, Seen};
use super::wire::{self, Origin, cpb};
use super::{Cluster, ClusterSettings, ControlQueue, Inbound, RoomSide, lock, run_inbound};
use crate::clock::Clock;
use crate::metrics::Metrics;
use crate::protocol::Rules;

/// Why the cluster could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A credentials, token or password file could not be read.
    #[error("{flag}: cannot read {path}: {err}")]
    File {
        flag: &'static str,
        path: String,
        err: std::io::Error,
    },
    /// The NATS thread or its runtime could not start.
    #[error("cannot start the NATS thread: {0}")]
    Thread(std::io::Error),
    /// A NATS URL is not valid.
    #[error("--nats: {0}")]
    Url(String),
}

/// Reconnect delays: 50 ms doubling to at most 1 s, so a node is back
/// within about a second of NATS returning.
fn backoff(attempts: usize) -> Duration {
    let exp = u32::try_from(attempts.min(5)).unwrap_or(5);
    Duration::from_millis(50 * 2u64.pow(exp)).min(Duration::from_secs(1))
}

fn read_secret(flag: &'static str, path: &std::path::Path) -> Result<String, StartError> {
    std::fs::read_to_string(path)
        .map(|s| s.trim_end_matches(['\r', '\n']).to_owned())
        .map_err(|err| StartError::File {
            flag,
            path: path.display().to_string(),
            err,
        })
}

async fn options(
    s: &ClusterSettings,
    epoch: u64,
    events: mpsc::Sender<Event>,
) -> Result<ConnectOptions, StartError> {
    let mut o = ConnectOptions::new();
    if let Some(path) = &s.creds_file {
        o = o
            .credentials_file(path)
            .await
            .map_err(|err| StartError::File {
                flag: "--nats-creds-file",
                path: path.display().to_string(),
                err,
            })?;
    }
    if let Some(path) = &s.token_file {
        o = o.token(read_secret("--nats-token-file", path)?);
    }
    if let (Some(user), Some(path)) = (&s.user, &s.password_file) {
        o = o.user_and_password(user.clone(), read_secret("--nats-password-file", path)?);
    }
    if let Some(path) = &s.tls_ca_file {
        o = o.add_root_certificates(path.clone());
    }
    if let (Some(cert), Some(key)) = (&s.tls_cert_file, &s.tls_key_file) {
        o = o.add_client_certificate(cert.clone(), key.clone());
    }
    if s.require_tls {
        o = o.require_tls(true);
    }
    Ok(o.no_echo()
        .name(format!("amble/{}/{epoch}", s.node))
        .retry_on_initial_connect()
        .max_reconnects(None)
        .reconnect_delay_callback(backoff)
        .connection_timeout(Duration::from_secs(2))
        .ping_interval(Duration::from_secs(2))
        .event_callback(move |event| {
            let events = events.clone();
            async move {
                // Bounded: a burst of events past it is only logged less.
                let _ = events.try_send(event);
            }
        }))
}

/// Starts the cluster link: a NATS thread with its runtime, the tasks on
/// it, and the task on the server runtime that applies what arrives.
pub async fn start(
    settings: ClusterSettings,
    metrics: Arc<Metrics>,
    rules: Rules,
    clock: Clock,
) -> Result<Arc<Cluster>, StartError> {
    let epoch = loop {
        // Zero is the directory's "retired" mark; draw again.
        let e = random_u64();
        if e != 0 {
            break e;
        }
    };
    let me = Origin {
        node: Arc::from(settings.node.as_str()),
        epoch,
        slot: settings.slot,
        slots: settings.slots,
    };
    let urls: Vec<async_nats::ServerAddr> = settings
        .urls
        .iter()
        .map(|u| u.trim().parse())
        .collect::<Result<_, _>>()
        .map_err(|err: std::io::Error| StartError::Url(err.to_string()))?;
    let (event_tx, event_rx) = mpsc::channel(64);
    let opts = options(&settings, epoch, event_tx).await?;
    let stop = CancellationToken::new();
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let thread_stop = stop.clone();
    std::thread::Builder::new()
        .name("amble-nats".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(err) => {
                    let _ = ready_tx.send(Err(err));
                    return;
                }
            };
            runtime.block_on(async move {
                // With retry_on_initial_connect this returns at once and
                // connects in the background.
                match opts.connect(urls).await {
                    Ok(client) => {
                        let _ = ready_tx.send(Ok((client, tokio::runtime::Handle::current())));
                        thread_stop.cancelled().await;
                    }
                    Err(err) => {
                        let _ = ready_tx.send(Err(std::io::Error::other(err)));
                    }
                }
            });
        })
        .map_err(StartError::Thread)?;
    let (client, link) = ready_rx
        .await
        .map_err(|_| StartError::Thread(std::io::Error::other("the NATS thread ended")))?
        .map_err(StartError::Thread)?;

    metrics.enable_cluster();
    let (out_tx, out_rx) = mpsc::channel(settings.queue);
    // Room updates are applied by several tasks, each room always by the
    // same one (its order kept), so one busy core does not hold them all.
    let shards = std::thread::available_parallelism().map_or(1, |n| n.get().clamp(1, 16));
    let per_shard = (settings.queue / shards).max(256);
    let (in_txs, in_rxs): (Vec<_>, Vec<_>) = (0..shards).map(|_| mpsc::channel(per_shard)).unzip();
    let directory = Directory::new(me.clone(), settings.node_timeout);
    let drops = Arc::new(ControlQueue::new(settings.queue));
    let cluster = Arc::new(Cluster {
        me_pb: me.to_pb(),
        me,
        rules,
        metrics,
        nats: Some(super::Nats {
            client,
            link: link.clone(),
        }),
        out: out_tx,
        inbound: in_txs,
        control: Arc::clone(&drops),
        fulls: Mutex::default(),
        directory: Mutex::new(directory),
        peers: tokio::sync::watch::Sender::new(0),
        connected: false.into(),
        down_since: Mutex::new(None),
        started: Instant::now(),
        subs: Mutex::new(Default::default()),
        counts: tokio::sync::Mutex::new(None),
        rooms: OnceLock::new(),
        stop,
        settings,
    });
    for rx in in_rxs {
        tokio::spawn(run_inbound(
            Arc::downgrade(&cluster),
            Arc::clone(&drops),
            rx,
        ));
    }
    let c = &cluster;
    let stop = || c.stop.clone();
    link.spawn(until_stopped(stop(), publisher(Arc::clone(c), out_rx)));
    link.spawn(until_stopped(stop(), events(Arc::clone(c), event_rx)));
    link.spawn(until_stopped(stop(), heartbeats(Arc::clone(c), clock)));
    for kind in [
        Control::Heartbeat,
        Control::Snapshot,
        Control::Sync,
        Control::Counts,
    ] {
        link.spawn(until_stopped(stop(), control(Arc::clone(c), kind)));
    }
    let s = &cluster.settings;
    info!(
        "joined cluster via {}: node {} (slot {} of {}), prefix {}",
        s.urls.join(","),
        s.node,
        s.slot,
        s.slots,
        s.prefix
    );
    Ok(cluster)
}

/// A random u64 from the standard library's randomly seeded hasher (no
/// extra dependency for one number per process).
fn random_u64() -> u64 {
    use std::hash::{BuildHasher as _, Hasher as _};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.write_u32(std::process::id());
    h.finish()
}

async fn until_stopped(stop: CancellationToken, task: impl Future<Output = ()>) {
    tokio::select! {
        () = stop.cancelled() => {}
        () = task => {}
    }
}

/// Drains the outgoing queue into NATS. Only this task waits on NATS.
async fn publisher(cluster: Arc<Cluster>, mut rx: mpsc::Receiver<(Subject, Bytes)>) {
    while let Some((subject, payload)) = rx.recv().await {
        send(&cluster, subject, payload).await;
    }
}

/// Publishes now (on the link runtime), counted.
async fn send(cluster: &Cluster, subject: Subject, payload: Bytes) {
    let Some(nats) = &cluster.nats else { return };
    let len = payload.len() as u64;
    match nats.client.publish(subject, payload).await {
        Ok(()) => {
            cluster.metrics.cluster_messages_published.inc();
            cluster.metrics.cluster_bytes_published.inc_by(len);
        }
        Err(err) => debug!(%err, "cluster publish failed"),
    }
}

/// Publishes now, waiting `limit` at most: while NATS is away the client's
/// command queue fills and is not drained until it reconnects, and a
/// heartbeat or a reply must not hang on it (false when it did not go out).
async fn send_within(cluster: &Cluster, limit: Duration, subject: Subject, payload: Bytes) -> bool {
    let sent = tokio::time::timeout(limit, send(cluster, subject, payload))
        .await
        .is_ok();
    if !sent {
        debug!("cluster: NATS did not take a message in time; dropped");
    }
    sent
}

fn received(cluster: &Cluster, bytes: usize) {
    cluster.metrics.cluster_messages_received.inc();
    cluster.metrics.cluster_bytes_received.inc_by(bytes as u64);
}

/// The NATS connection's events: the connected gauge, `/healthz`, and on
/// every (re)connection a heartbeat and this node's full states at once;
/// after a lost connection, also a request to every live peer for its full
/// states (what it published meanwhile did not reach this node).
async fn events(cluster: Arc<Cluster>, mut rx: mpsc::Receiver<Event>) {
    while let Some(event) = rx.recv().await {
        match event {
            Event::Connected => {
                cluster.connected.store(true, Ordering::Relaxed);
                let was_down = lock(&cluster.down_since).take();
                cluster.metrics.cluster_connected.set(1);
                match was_down {
                    Some(at) => info!(
                        after_ms = at.elapsed().as_millis() as u64,
                        "cluster: NATS connection back"
                    ),
                    None => info!("cluster: connected to NATS"),
                }
                heartbeat(&cluster, 0, false).await;
                tokio::spawn(publish_fulls(Arc::clone(&cluster)));
                // Once more a heartbeat later: a peer that reconnected after
                // us was not subscribed yet, and a leave lost in the outage
                // would otherwise stay a ghost there until our next update
                // (and here, until its next update).
                if was_down.is_some() {
                    resync_all(&cluster);
                    let again = Arc::clone(&cluster);
                    tokio::spawn(async move {
                        tokio::time::sleep(again.settings.heartbeat).await;
                        resync_all(&again);
                        publish_fulls(again).await;
                    });
                }
            }
            Event::Disconnected => {
                cluster.connected.store(false, Ordering::Relaxed);
                lock(&cluster.down_since).get_or_insert_with(Instant::now);
                cluster.metrics.cluster_connected.set(0);
                warn!(
                    "cluster: NATS connection lost; serving local members, reconnecting with backoff"
                );
            }
            Event::SlowConsumer(sid) => {
                debug!(
                    sid,
                    "cluster: a subscription overflowed (gaps are repaired)"
                );
            }
            other => debug!(event = %other, "cluster: NATS event"),
        }
    }
}

/// This node's full state of every room open here, on the rooms' subjects,
/// spread out: every [`FULLS_BATCH`] rooms it waits (a second at most)
/// until the outgoing queue is at most half full, so the live updates
/// queued meanwhile are not dropped behind them.
async fn publish_fulls(cluster: Arc<Cluster>) {
    let Some(rooms) = cluster.room_side() else {
        return;
    };
    for (i, room) in rooms.open_rooms().iter().enumerate() {
        if i % FULLS_BATCH == FULLS_BATCH - 1 {
            let give_up = Instant::now() + Duration::from_secs(1);
            while cluster.out.capacity() < cluster.out.max_capacity() / 2
                && Instant::now() < give_up
            {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        full_soon(&cluster, rooms.as_ref(), room);
    }
}

/// Rooms whose full states go out between two looks at the outgoing queue.
const FULLS_BATCH: usize = 64;
/// At most one full state per room in this time; the requests meanwhile
/// are served by one more at its end.
const FULL_EVERY: Duration = Duration::from_millis(100);
/// Rooms remembered for [`FULL_EVERY`] at most (names come from requests).
const FULLS_KNOWN: usize = 65_536;

/// When each room's last full state went out, and whether another one is
/// due at [`FULL_EVERY`] after it.
pub(super) type Fulls = Mutex<HashMap<Arc<str>, FullSent>>;

#[derive(Clone, Copy, Debug)]
pub(super) struct FullSent {
    at: Instant,
    again: bool,
}

/// Publishes this node's full state of `room` on its subject, at most once
/// per [`FULL_EVERY`]: a request within that time of the last one is
/// served by one more full state at its end, and any further request
/// meanwhile by that same one. (One lost message in a room spanning n
/// nodes brings n - 1 requests; a reconnect brings a request from every
/// peer.)
fn full_soon(cluster: &Arc<Cluster>, rooms: &dyn RoomSide, room: &str) {
    let now = Instant::now();
    let later = {
        let mut fulls = lock(&cluster.fulls);
        match fulls.get_mut(room) {
            Some(sent) if sent.again => return,
            Some(sent) if now < sent.at + FULL_EVERY => {
                sent.again = true;
                Some(sent.at + FULL_EVERY)
            }
            _ => {
                if fulls.len() >= FULLS_KNOWN {
                    fulls.retain(|_, s| s.again || now < s.at + FULL_EVERY);
                }
                if fulls.len() < FULLS_KNOWN {
                    let sent = FullSent {
                        at: now,
                        again: false,
                    };
                    fulls.insert(Arc::from(room), sent);
                }
                None
            }
        }
    };
    let Some(at) = later else {
        if !rooms.publish_full(room, None) {
            lock(&cluster.fulls).remove(room);
        }
        return;
    };
    let (c, room) = (Arc::clone(cluster), Arc::<str>::from(room));
    tokio::spawn(async move {
        tokio::time::sleep_until(at).await;
        if let Some(sent) = lock(&c.fulls).get_mut(&room) {
            *sent = FullSent {
                at: Instant::now(),
                again: false,
            };
        }
        if let Some(rooms) = c.room_side() {
            rooms.publish_full(&room, None);
        }
    });
}

/// The most rooms named in one `SyncRequest`: room names are at most 32
/// bytes, so a request stays near 10 KB, far under NATS's `max_payload`
/// (1 MB by default), past which a publish fails.
const SYNC_CHUNK: usize = 256;

/// Asks `node` for its full state of `rooms`, in requests of
/// [`SYNC_CHUNK`] rooms.
fn ask_fulls(cluster: &Cluster, node: &str, rooms: &[String]) {
    for chunk in rooms.chunks(SYNC_CHUNK) {
        cluster.request_sync(node, chunk.to_vec());
    }
}

/// Asks every live peer for its full state of every room open here: this
/// node may have missed updates (its NATS connection was lost, or it was
/// stalled), and a missed update is otherwise only noticed at the next one
/// in the same room, which may never come (a leave in a room gone quiet).
fn resync_all(cluster: &Cluster) {
    let Some(rooms) = cluster.room_side() else {
        return;
    };
    let open = rooms.open_rooms();
    if open.is_empty() {
        return;
    }
    let peers = lock(&cluster.directory).live_nodes();
    for node in peers {
        ask_fulls(cluster, &node, &open);
    }
}

/// Publishes a heartbeat, waiting half a period at most.
async fn heartbeat(cluster: &Cluster, server_time_ms: u64, bye: bool) {
    let beat = wire::encode_heartbeat(
        &cluster.me_pb,
        cpb::Heartbeat {
            origin: None,
            server_time_ms,
            rooms: u32::try_from(cluster.metrics.rooms.get()).unwrap_or(0),
            members: u32::try_from(cluster.metrics.members.get()).unwrap_or(0),
            bye,
        },
    );
    let limit = cluster.settings.heartbeat / 2;
    send_within(cluster, limit, cluster.subject("hb"), beat).await;
}

/// Every heartbeat period: publish ours, and declare down the peers silent
/// for the node timeout (their members leave every room). A beat more
/// than half a period late means this node was stalled, not its peers.
async fn heartbeats(cluster: Arc<Cluster>, clock: Clock) {
    let period = cluster.settings.heartbeat;
    let mut interval = tokio::time::interval(period);
    interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        let due = interval.tick().await;
        let now = Instant::now();
        let stalled = lock(&cluster.directory).beat(due, now, period);
        if let Some(late) = stalled {
            warn!(
                stalled_ms = late.as_millis() as u64,
                "cluster: this node was stalled; the stall does not count against its peers"
            );
            // What was published meanwhile may be lost (a slow consumer cut
            // off by NATS): both ways, full states.
            tokio::spawn(publish_fulls(Arc::clone(&cluster)));
            resync_all(&cluster);
        }
        // Expiry first, and never behind NATS: with NATS away the peers
        // must still expire, so rooms shrink to the local members.
        let lost = lock(&cluster.directory).expire(now);
        for (node, epoch) in lost {
            cluster.metrics.cluster_nodes_lost.inc();
            warn!(%node, "cluster: node silent for the node timeout, its members are removed");
            to_rooms(&cluster, Inbound::DropNode(node, epoch));
        }
        cluster.count_peers();
        heartbeat(&cluster, clock.now_ms(), false).await;
    }
}

/// Hands a drop or a reset to the rooms without waiting (the control
/// queue, handled before the room updates). Past its bound (the server
/// runtime far behind) it is dropped, counted and logged.
fn to_rooms(cluster: &Cluster, msg: Inbound) {
    if !cluster.control.push(msg) {
        cluster.metrics.cluster_dropped.inc();
        warn!("cluster: the rooms are far behind; a node drop or reset was lost");
    }
}

/// Records a message from `from` in the directory and acts on what it
/// means; false when the message is stale and must be dropped.
pub(super) fn observe(cluster: &Cluster, from: &Origin) -> bool {
    let seen = lock(&cluster.directory).seen(from, Instant::now());
    let node = &from.node;
    let clash = |clash: bool| {
        if clash {
            cluster.metrics.cluster_id_conflicts.inc();
            error!(
                %node,
                slot = from.slot,
                "cluster: another live node uses this slot; member ids may collide: give every node its own --node-slot"
            );
        }
    };
    match seen {
        Seen::Stale => return false,
        Seen::Known => {}
        Seen::New { slot_clash } => {
            info!(%node, slot = from.slot, "cluster: node joined");
            clash(slot_clash);
            cluster.count_peers();
        }
        Seen::Returned => {
            info!(%node, "cluster: node heard again, taking its members back");
            cluster.count_peers();
            if let Some(rooms) = cluster.room_side() {
                ask_fulls(cluster, node, &rooms.open_rooms());
            }
        }
        Seen::Replaced {
            old_epoch,
            slot_clash,
        } => {
            info!(%node, "cluster: node restarted, removing its previous run's members");
            clash(slot_clash);
            cluster.count_peers();
            to_rooms(cluster, Inbound::DropNode(Arc::clone(node), old_epoch));
        }
    }
    true
}

#[derive(Clone, Copy)]
enum Control {
    Heartbeat,
    Snapshot,
    Sync,
    Counts,
}

/// Reads one of the control subjects every node subscribes to.
async fn control(cluster: Arc<Cluster>, kind: Control) {
    let subject = match kind {
        Control::Heartbeat => cluster.subject("hb"),
        Control::Snapshot => cluster.subject("s.*"),
        Control::Sync => cluster.subject(&format!("n.{}", cluster.me.node)),
        Control::Counts => cluster.subject("q.rooms"),
    };
    let Some(nats) = &cluster.nats else { return };
    let mut sub = match nats.client.subscribe(subject.clone()).await {
        Ok(sub) => sub,
        Err(err) => {
            error!(%err, %subject, "cluster: cannot subscribe");
            return;
        }
    };
    while let Some(msg) = sub.next().await {
        received(&cluster, msg.payload.len());
        match kind {
            Control::Heartbeat => on_heartbeat(&cluster, &msg.payload),
            Control::Snapshot => on_snapshot_request(&cluster, &msg).await,
            Control::Sync => on_sync_request(&cluster, &msg.payload),
            Control::Counts => on_counts_request(&cluster, &msg).await,
        }
    }
}

fn on_heartbeat(cluster: &Cluster, payload: &[u8]) {
    let beat = match wire::decode_heartbeat(payload, cluster.me.slots) {
        Ok(beat) => beat,
        Err(err) => return bad(cluster, &err),
    };
    if beat.bye {
        let was_live = lock(&cluster.directory).bye(&beat.origin);
        if was_live {
            info!(node = %beat.origin.node, "cluster: node stopped, removing its members");
            cluster.count_peers();
            to_rooms(
                cluster,
                Inbound::DropNode(beat.origin.node, beat.origin.epoch),
            );
        }
        return;
    }
    observe(cluster, &beat.origin);
}

fn bad(cluster: &Cluster, err: &wire::WireError) {
    cluster.metrics.cluster_bad_messages.inc();
    if let wire::WireError::Slots { ours, theirs } = err {
        error!(
            ours,
            theirs, "cluster: a node uses another --cluster-slots; its messages are dropped"
        );
    } else {
        debug!(%err, "cluster message dropped");
    }
}

/// The room named by a subject's last token, checked.
fn room_of(cluster: &Cluster, subject: &str) -> Option<String> {
    let token = subject.rsplit('.').next()?;
    crate::protocol::validate_room(wire::room_from_token(token), &cluster.rules).ok()
}

async fn on_snapshot_request(cluster: &Cluster, msg: &async_nats::Message) {
    let Some(reply) = msg.reply.clone() else {
        return;
    };
    let from = match wire::decode_snapshot_request(&msg.payload, cluster.me.slots) {
        Ok(from) => from,
        Err(err) => return bad(cluster, &err),
    };
    let Some(room) = room_of(cluster, &msg.subject) else {
        cluster.metrics.cluster_bad_messages.inc();
        return;
    };
    if !observe(cluster, &from) {
        return;
    }
    // The asker is opening the room, so it has nobody there: forget any
    // part of it we still hold (its `closed` may have been lost, and its
    // new sequence starts again from 1).
    let reset = super::wire::Update {
        origin: from,
        seq: 0,
        full: false,
        tick_ms: 0,
        ops: Vec::new(),
        motion: Vec::new(),
        closed: true,
    };
    to_rooms(cluster, Inbound::Update(Arc::from(room.as_str()), reset));
    let sent = cluster
        .room_side()
        .is_some_and(|rooms| rooms.publish_full(&room, Some(reply.clone())));
    if !sent {
        // Nobody here: an empty full state, so the asker need not wait.
        let empty = wire::encode_update(
            &cluster.me_pb,
            wire::UpdateParts {
                full: true,
                ..Default::default()
            },
        );
        send_within(cluster, cluster.settings.snapshot_timeout, reply, empty).await;
    }
}

fn on_sync_request(cluster: &Arc<Cluster>, payload: &[u8]) {
    let (from, rooms) = match wire::decode_sync_request(payload, cluster.me.slots, &cluster.rules) {
        Ok(req) => req,
        Err(err) => return bad(cluster, &err),
    };
    if !observe(cluster, &from) {
        return;
    }
    if let Some(side) = cluster.room_side() {
        for room in rooms {
            full_soon(cluster, side.as_ref(), &room);
        }
    }
}

async fn on_counts_request(cluster: &Cluster, msg: &async_nats::Message) {
    let Some(reply) = msg.reply.clone() else {
        return;
    };
    match wire::decode_room_counts(&msg.payload, cluster.me.slots, &cluster.rules) {
        Ok((from, _)) => {
            if !observe(cluster, &from) {
                return;
            }
        }
        Err(err) => return bad(cluster, &err),
    }
    let counts = cluster
        .room_side()
        .map(|rooms| rooms.local_counts())
        .unwrap_or_default();
    // The asker waits the snapshot timeout at most: no use waiting longer.
    send_within(
        cluster,
        cluster.settings.snapshot_timeout,
        reply,
        wire::encode_room_counts(&cluster.me_pb, counts),
    )
    .await;
}

/// Subscribes to `room`'s subject (once), and reads it on the link runtime
/// until [`Cluster::close`]. Waits for the subscription until `deadline`
/// at most: with NATS away the client's command queue can be full, and a
/// join must not hang on it (the subscription then completes later, and
/// the live peers are then asked for their full states of the room: the
/// updates published before it were not received).
pub(super) async fn subscribe_room(cluster: &Arc<Cluster>, room: &str, deadline: Instant) {
    let token = CancellationToken::new();
    {
        let mut subs = lock(&cluster.subs);
        if subs.contains_key(room) {
            return;
        }
        subs.insert(Arc::from(room), token.clone());
    }
    cluster.metrics.cluster_rooms_subscribed.inc();
    let Some(nats) = &cluster.nats else { return };
    let (done, subscribed) = tokio::sync::oneshot::channel();
    let (c, room) = (Arc::clone(cluster), Arc::<str>::from(room));
    nats.link.spawn(async move {
        let Some(nats) = &c.nats else { return };
        let sub = tokio::select! {
            () = token.cancelled() => return,
            () = c.stop.cancelled() => return,
            sub = nats.client.subscribe(c.room_subject(&room)) => sub,
        };
        let _ = done.send(());
        match sub {
            Ok(sub) => {
                if Instant::now() > deadline {
                    debug!(%room, "cluster: the room subscription came after the opening; asking for full states");
                    subscribed_late(&c, &room);
                }
                read_room(Arc::clone(&c), room, sub, token).await;
            }
            Err(err) => {
                error!(%err, %room, "cluster: cannot subscribe to the room");
                subscribe_failed(&c, &room, &token);
            }
        }
    });
    let _ = tokio::time::timeout_at(deadline, subscribed).await;
}

/// The subscription to `room` came after its opening gave up waiting:
/// every live peer is asked for its full state of the room.
fn subscribed_late(cluster: &Cluster, room: &str) {
    let peers = lock(&cluster.directory).live_nodes();
    for node in peers {
        cluster.request_sync(&node, vec![room.to_owned()]);
    }
}

/// The subscription under `token` failed: forgets it, unless the room was
/// closed meanwhile (its token cancelled), and maybe opened again under a
/// newer subscription, which must stay.
fn subscribe_failed(cluster: &Cluster, room: &str, token: &CancellationToken) {
    let mut subs = lock(&cluster.subs);
    // `close` cancels a token as it removes it, so an uncancelled token is
    // still the one in the map.
    if !token.is_cancelled() && subs.remove(room).is_some() {
        token.cancel();
        cluster.metrics.cluster_rooms_subscribed.dec();
    }
}

async fn read_room(
    cluster: Arc<Cluster>,
    room: Arc<str>,
    mut sub: Subscriber,
    token: CancellationToken,
) {
    loop {
        let msg = tokio::select! {
            () = token.cancelled() => break,
            () = cluster.stop.cancelled() => break,
            msg = sub.next() => msg,
        };
        let Some(msg) = msg else { break };
        received(&cluster, msg.payload.len());
        match wire::decode_update(&msg.payload, cluster.me.slots, &cluster.rules) {
            Ok(update) => {
                if observe(&cluster, &update.origin) {
                    // Waits when the server runtime lags: the subscription
                    // then buffers, and past its capacity NATS drops (gaps,
                    // repaired by full states).
                    let _ = cluster
                        .inbound_for(&room)
                        .send(Inbound::Update(Arc::clone(&room), update))
                        .await;
                }
            }
            Err(err) => bad(&cluster, &err),
        }
    }
    let _ = sub.unsubscribe().await;
}

/// Publishes a request and gathers the answers until every live peer
/// answered or `deadline`. A node too new to know its peers waits for the
/// deadline.
pub(super) async fn gather(
    cluster: &Cluster,
    subject: Subject,
    payload: Bytes,
    deadline: Instant,
) -> Vec<Bytes> {
    let (expected, young) = cluster.expected_answers();
    let mut answers = Vec::new();
    let Some(nats) = &cluster.nats else {
        return answers;
    };
    if expected == 0 && !young {
        return answers;
    }
    let inbox = nats.client.new_inbox();
    // Bounded like the answers: with NATS away the client's command queue
    // can be full.
    let mut sub =
        match tokio::time::timeout_at(deadline, nats.client.subscribe(inbox.clone())).await {
            Ok(Ok(sub)) => sub,
            Ok(Err(err)) => {
                warn!(%err, "cluster: cannot subscribe to a reply inbox");
                return answers;
            }
            Err(_) => return answers,
        };
    let len = payload.len() as u64;
    let request = nats.client.publish_with_reply(subject, inbox, payload);
    if let Ok(Ok(())) = tokio::time::timeout_at(deadline, request).await {
        cluster.metrics.cluster_messages_published.inc();
        cluster.metrics.cluster_bytes_published.inc_by(len);
        while let Ok(Some(msg)) = tokio::time::timeout_at(deadline, sub.next()).await {
            // NATS itself answers "no responders" (status 503, no payload)
            // when no other node listens: not an answer from a node.
            if msg.status.is_some() {
                continue;
            }
            received(cluster, msg.payload.len());
            answers.push(msg.payload);
            if !young && answers.len() >= expected {
                break;
            }
        }
    }
    // Dropping unsubscribes without waiting on NATS.
    drop(sub);
    answers
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn backoff_doubles_to_a_second() {
        assert_eq!(backoff(0), Duration::from_millis(50));
        assert_eq!(backoff(1), Duration::from_millis(100));
        assert_eq!(backoff(4), Duration::from_millis(800));
        assert_eq!(backoff(5), Duration::from_secs(1));
        assert_eq!(backoff(1_000), Duration::from_secs(1));
    }
}
