//! The link against a real `nats-server` (Debian's 2.9 works): the
//! behaviour that only shows with NATS itself, such as an outage.

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use async_nats::Subject;
use bytes::Bytes;
use futures_util::StreamExt as _;
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc::{self, UnboundedReceiver, UnboundedSender, unbounded_channel};
use tokio::sync::watch;
use tokio::time::Instant;

use super::heartbeat::to_rooms;
use super::launch;
use super::repair::{SYNC_CHUNK, full_soon, publish_fulls, resync_all};
use super::subscribe::subscribe_room;
use crate::clock::Clock;
use crate::cluster::wire::{self, Origin, Update};
use crate::cluster::{Cluster, ClusterSettings, Inbound, RoomSide, lock, run_inbound, shard_of};
use crate::metrics::Metrics;
use crate::protocol::Rules;

/// Every wait in these tests is bounded by this.
const LIMIT: Duration = Duration::from_secs(10);

async fn within<T>(what: &str, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(LIMIT, fut)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

/// A `nats-server` on a free port of 127.0.0.1, killed when dropped.
struct NatsServer {
    child: Child,
    port: u16,
}

impl NatsServer {
    async fn start() -> Self {
        Self::on("-1").await
    }

    async fn on(port: &str) -> Self {
        let mut child = Command::new("nats-server")
            .args(["-a", "127.0.0.1", "-p", port])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("nats-server runs (apt install nats-server)");
        let stderr = child.stderr.take().expect("piped stderr");
        let mut lines = BufReader::new(stderr).lines();
        let port = within("nats-server to listen", async {
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some((_, addr)) = line.split_once("Listening for client connections on ")
                    && let Some((_, port)) = addr.trim().rsplit_once(':')
                {
                    return port.parse().expect("a port");
                }
            }
            panic!("nats-server ended before listening");
        })
        .await;
        // Keep reading, so the server never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Self { child, port }
    }

    fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    async fn stop(&mut self) {
        let _ = self.child.kill().await;
    }
}

/// What the link asked of the rooms.
#[derive(Debug, PartialEq, Eq)]
enum Call {
    Full(String),
    Drop(String),
    Apply(String),
}

/// A room side that records the calls and has `open` rooms (any room
/// asked for has a full state).
struct FakeRooms {
    calls: UnboundedSender<Call>,
    open: Vec<String>,
}

impl RoomSide for FakeRooms {
    fn publish_full(&self, room: &str, _to: Option<Subject>) -> bool {
        let _ = self.calls.send(Call::Full(room.to_owned()));
        true
    }
    fn open_rooms(&self) -> Vec<String> {
        self.open.clone()
    }
    fn local_counts(&self) -> Vec<(String, u32)> {
        Vec::new()
    }
    fn apply(&self, room: &str, _update: Update) {
        let _ = self.calls.send(Call::Apply(room.to_owned()));
    }
    fn drop_node(&self, node: &str, _epoch: u64) {
        let _ = self.calls.send(Call::Drop(node.to_owned()));
    }
}

struct Node {
    cluster: Arc<Cluster>,
    /// Whether the link is connected to NATS, as it changes.
    connected: watch::Receiver<bool>,
    calls: UnboundedReceiver<Call>,
    _rooms: Arc<dyn RoomSide>,
}

impl Node {
    async fn start(name: &str, slot: u32, nats: &NatsServer, open: &[&str]) -> Self {
        let mut s = Cluster::test_settings(name, slot);
        s.urls = vec![nats.url()];
        s.heartbeat = Duration::from_millis(100);
        s.node_timeout = Duration::from_millis(400);
        Self::with(s, open).await
    }

    async fn with(s: ClusterSettings, open: &[&str]) -> Self {
        let (cluster, connected) = launch(
            s,
            Arc::new(Metrics::default()),
            Rules::default(),
            Clock::start(),
        )
        .await
        .expect("the link starts");
        let (tx, calls) = unbounded_channel();
        let rooms: Arc<dyn RoomSide> = Arc::new(FakeRooms {
            calls: tx,
            open: open.iter().map(|r| (*r).to_owned()).collect(),
        });
        cluster.attach(Arc::downgrade(&rooms));
        Self {
            cluster,
            connected,
            calls,
            _rooms: rooms,
        }
    }

    /// Waits until the health line contains `text`, looking again each
    /// time what it says changes: the connection or the live peer count.
    async fn health(&mut self, text: &str) {
        let what = format!("the health line to say {text:?}");
        let cluster = &self.cluster;
        let connected = &mut self.connected;
        let mut peers = cluster.peers();
        within(&what, async {
            loop {
                connected.borrow_and_update();
                peers.borrow_and_update();
                if cluster.health_line().contains(text) {
                    return;
                }
                tokio::select! {
                    changed = connected.changed() => changed.expect("the link runs"),
                    changed = peers.changed() => changed.expect("the cluster is alive"),
                }
            }
        })
        .await;
    }

    /// Waits for `call`, skipping others.
    async fn called(&mut self, call: Call) {
        let what = format!("{call:?}");
        within(&what, async {
            loop {
                match self.calls.recv().await {
                    Some(c) if c == call => return,
                    Some(_) => {}
                    None => panic!("the rooms are gone"),
                }
            }
        })
        .await;
    }
}

/// NATS stopped while this node has traffic to publish: the client's
/// command queue fills (it is not drained while reconnecting), yet the
/// peer still expires and its members are dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_nats_gone_under_traffic_peers_still_expire() {
    let mut nats = NatsServer::start().await;
    let mut a = Node::start("a", 1, &nats, &[]).await;
    let b = Node::start("b", 2, &nats, &[]).await;
    a.health("connected, 1 peer").await;
    nats.stop().await;
    a.health("NATS unreachable").await;
    let subject = a.cluster.room_subject("busy");
    for _ in 0..8_000 {
        a.cluster
            .publish(subject.clone(), Bytes::from_static(b"traffic"));
    }
    let stopped = Instant::now();
    a.called(Call::Drop("b".into())).await;
    assert!(
        stopped.elapsed() < Duration::from_secs(2),
        "dropped after {:?}",
        stopped.elapsed()
    );
    drop(b);
}

fn origin(node: &str, epoch: u64, slot: u32) -> Origin {
    Origin {
        node: Arc::from(node),
        epoch,
        slot,
        slots: 16,
    }
}

fn delta(from: &Origin, seq: u64) -> Update {
    Update {
        origin: from.clone().into(),
        seq,
        full: false,
        tick_ms: 0,
        ops: Vec::new(),
        motion: Vec::new(),
        closed: false,
    }
}

/// The rooms' update channel is full (the server runtime lags): a node's
/// drop is still handed over at once, applied before the queued updates,
/// and the dropped node's queued update is not applied after its drop.
#[tokio::test]
async fn drops_never_wait_for_the_room_updates_and_go_first() {
    let (c, _out) = Cluster::detached(
        Cluster::test_settings("me", 0),
        Arc::new(Metrics::default()),
    );
    let (tx, mut calls) = unbounded_channel();
    let rooms: Arc<dyn RoomSide> = Arc::new(FakeRooms {
        calls: tx,
        open: Vec::new(),
    });
    c.attach(Arc::downgrade(&rooms));
    let (a, b) = (origin("a", 7, 1), origin("b", 8, 2));
    let t0 = Instant::now();
    lock(&c.directory).seen(&a, t0);
    lock(&c.directory).seen(&b, t0);
    let (updates, rx) = mpsc::channel(2);
    updates
        .try_send(Inbound::Update(Arc::from("r1"), delta(&b, 1)))
        .expect("room");
    updates
        .try_send(Inbound::Update(Arc::from("r2"), delta(&a, 1)))
        .expect("room");
    assert!(
        updates
            .try_send(Inbound::Update(Arc::from("r3"), delta(&a, 2)))
            .is_err(),
        "full"
    );
    // b expires: what the heartbeats task does, without waiting.
    lock(&c.directory).expire(t0 + Duration::from_secs(10));
    lock(&c.directory).seen(&a, t0 + Duration::from_secs(10));
    to_rooms(&c, Inbound::DropNode(Arc::clone(&b.node), b.epoch));
    tokio::spawn(run_inbound(Arc::downgrade(&c), Arc::clone(&c.control), rx));
    let mut got = Vec::new();
    for _ in 0..2 {
        got.push(
            within("the rooms' calls", calls.recv())
                .await
                .expect("a call"),
        );
    }
    assert_eq!(got, [Call::Drop("b".into()), Call::Apply("r2".into())]);
    drop(rooms);
}

/// NATS lost for less than the node timeout and back: each node asks its
/// live peers for their full states of its open rooms (their updates in
/// the outage were lost). Here b has no room open, so a full state of
/// `shared` from b can only answer a's request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_lost_connection_a_node_asks_its_live_peers_for_full_states() {
    let mut nats = NatsServer::start().await;
    let slow = |name: &str, slot| {
        let mut s = Cluster::test_settings(name, slot);
        s.urls = vec![nats.url()];
        // A second, so that a busy test machine does not make a beat late
        // enough to count as a stall (which asks the peers too).
        s.heartbeat = Duration::from_secs(1);
        // Nobody expires in this test.
        s.node_timeout = Duration::from_secs(60);
        s
    };
    let mut a = Node::with(slow("a", 1), &["shared"]).await;
    let mut b = Node::with(slow("b", 2), &[]).await;
    a.health("connected, 1 peer").await;
    b.health("connected, 1 peer").await;
    nats.stop().await;
    a.health("NATS unreachable").await;
    while b.calls.try_recv().is_ok() {}
    let port = nats.port.to_string();
    let _nats = NatsServer::on(&port).await;
    b.called(Call::Full("shared".into())).await;
    assert!(a.cluster.is_live("b", b.cluster.me().epoch));
}

/// A peer is asked for many rooms in requests of at most `SYNC_CHUNK`
/// rooms each (one request naming every room could pass NATS's
/// `max_payload`, and then repair would never happen).
#[tokio::test]
async fn a_resync_asks_every_live_peer_for_every_open_room_in_chunks() {
    let (c, mut out) = Cluster::detached(
        Cluster::test_settings("me", 0),
        Arc::new(Metrics::default()),
    );
    let open: Vec<String> = (0..600).map(|i| format!("room{i}")).collect();
    let (tx, _calls) = unbounded_channel();
    let rooms: Arc<dyn RoomSide> = Arc::new(FakeRooms {
        calls: tx,
        open: open.clone(),
    });
    c.attach(Arc::downgrade(&rooms));
    let t0 = Instant::now();
    for (name, slot) in [("a", 1), ("b", 2), ("gone", 3)] {
        lock(&c.directory).seen(&origin(name, 5, slot), t0);
    }
    lock(&c.directory).expire(t0 + Duration::from_secs(10));
    lock(&c.directory).seen(&origin("a", 5, 1), t0 + Duration::from_secs(10));
    lock(&c.directory).seen(&origin("b", 5, 2), t0 + Duration::from_secs(10));
    resync_all(&c);
    let mut asked: HashMap<String, Vec<String>> = HashMap::new();
    while let Ok((subject, payload)) = out.try_recv() {
        let (_, rooms) =
            wire::decode_sync_request(&payload, 16, &Rules::default()).expect("a sync request");
        assert!(
            rooms.len() <= SYNC_CHUNK,
            "{} rooms in one request",
            rooms.len()
        );
        let node = subject
            .as_str()
            .rsplit('.')
            .next()
            .unwrap_or_default()
            .to_owned();
        asked.entry(node).or_default().extend(rooms);
    }
    assert_eq!(asked.len(), 2, "the live peers only: {:?}", asked.keys());
    for node in ["a", "b"] {
        assert_eq!(asked[node], open, "{node}");
    }
    drop(rooms);
}

/// A room subscription that NATS confirms after the opening's deadline:
/// the live peers are asked for their full state of that room (here the
/// deadline is already past when the subscription starts).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_room_subscribed_after_its_opening_asks_the_peers_for_full_states() {
    let nats = NatsServer::start().await;
    let mut a = Node::start("a", 1, &nats, &[]).await;
    let mut b = Node::start("b", 2, &nats, &[]).await;
    a.health("connected, 1 peer").await;
    b.health("connected, 1 peer").await;
    subscribe_room(&a.cluster, "late", Instant::now()).await;
    b.called(Call::Full("late".into())).await;
}

fn detached_with(open: &[&str]) -> (Arc<Cluster>, UnboundedReceiver<Call>, Arc<dyn RoomSide>) {
    let (c, _out) = Cluster::detached(
        Cluster::test_settings("me", 0),
        Arc::new(Metrics::default()),
    );
    let (tx, calls) = unbounded_channel();
    let rooms: Arc<dyn RoomSide> = Arc::new(FakeRooms {
        calls: tx,
        open: open.iter().map(|r| (*r).to_owned()).collect(),
    });
    c.attach(Arc::downgrade(&rooms));
    (c, calls, rooms)
}

fn fulls_so_far(calls: &mut UnboundedReceiver<Call>) -> usize {
    std::iter::from_fn(|| calls.try_recv().ok())
        .filter(|c| matches!(c, Call::Full(_)))
        .count()
}

/// Requests for a room's full state within 100 ms of the last one are
/// served by one more at the end of those 100 ms, not one each.
#[tokio::test(start_paused = true)]
async fn full_states_of_a_room_are_coalesced_to_one_per_100_ms() {
    let (c, mut calls, rooms) = detached_with(&["r"]);
    for _ in 0..5 {
        full_soon(&c, rooms.as_ref(), "r");
    }
    full_soon(&c, rooms.as_ref(), "other");
    assert_eq!(fulls_so_far(&mut calls), 2, "r and other at once");
    tokio::time::sleep(Duration::from_millis(99)).await;
    assert_eq!(fulls_so_far(&mut calls), 0);
    tokio::time::sleep(Duration::from_millis(2)).await;
    assert_eq!(fulls_so_far(&mut calls), 1, "the pending one of r");
    // 100 ms after that, a request goes out at once again.
    tokio::time::sleep(Duration::from_millis(100)).await;
    full_soon(&c, rooms.as_ref(), "r");
    assert_eq!(fulls_so_far(&mut calls), 1);
}

/// A room side whose full states go into the cluster's outgoing queue.
struct QueueRooms {
    cluster: OnceLock<Weak<Cluster>>,
    open: Vec<String>,
}

impl RoomSide for QueueRooms {
    fn publish_full(&self, room: &str, _to: Option<Subject>) -> bool {
        if let Some(c) = self.cluster.get().and_then(Weak::upgrade) {
            c.publish(c.room_subject(room), Bytes::from_static(b"full"));
        }
        true
    }
    fn open_rooms(&self) -> Vec<String> {
        self.open.clone()
    }
    fn local_counts(&self) -> Vec<(String, u32)> {
        Vec::new()
    }
    fn apply(&self, _room: &str, _update: Update) {}
    fn drop_node(&self, _node: &str, _epoch: u64) {}
}

/// A reconnect's full states of many rooms are spread so that they never
/// fill the outgoing queue (which would drop live updates queued beside
/// them): 1,000 rooms through a queue of 128 drained as NATS would.
#[tokio::test(start_paused = true)]
async fn a_reconnects_full_states_never_fill_the_outgoing_queue() {
    let mut s = Cluster::test_settings("me", 0);
    s.queue = 128;
    let (c, mut out) = Cluster::detached(s, Arc::new(Metrics::default()));
    let rooms = Arc::new(QueueRooms {
        cluster: OnceLock::new(),
        open: (0..1_000).map(|i| format!("room{i}")).collect(),
    });
    let _ = rooms.cluster.set(Arc::downgrade(&c));
    let side: Arc<dyn RoomSide> = rooms;
    c.attach(Arc::downgrade(&side));
    let drain = tokio::spawn(async move {
        let mut n = 0;
        while n < 1_000 {
            within("a full state", out.recv()).await.expect("queued");
            n += 1;
            if n % 16 == 0 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    });
    publish_fulls(Arc::clone(&c)).await;
    within("the queue drained", drain).await.expect("drained");
    assert_eq!(c.metrics.cluster_dropped.get(), 0);
}

/// A room side whose `apply` of room "slow" blocks its task until released.
struct SlowRooms {
    applied: UnboundedSender<String>,
    release: std::sync::Mutex<std::sync::mpsc::Receiver<()>>,
}

impl RoomSide for SlowRooms {
    fn publish_full(&self, _room: &str, _to: Option<Subject>) -> bool {
        false
    }
    fn open_rooms(&self) -> Vec<String> {
        Vec::new()
    }
    fn local_counts(&self) -> Vec<(String, u32)> {
        Vec::new()
    }
    fn apply(&self, room: &str, _update: Update) {
        if room == "slow" {
            let release = self.release.lock().unwrap_or_else(|e| e.into_inner());
            let _ = release.recv_timeout(LIMIT);
        }
        let _ = self.applied.send(room.to_owned());
    }
    fn drop_node(&self, _node: &str, _epoch: u64) {}
}

/// Rooms are applied by several tasks, each room by one: while a room's
/// update is slow to apply, a room of another shard is still served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_room_does_not_hold_up_the_rooms_of_another_shard() {
    let (c, _out) = Cluster::detached(
        Cluster::test_settings("me", 0),
        Arc::new(Metrics::default()),
    );
    let (tx, mut applied) = unbounded_channel();
    let (release, released) = std::sync::mpsc::channel();
    let rooms: Arc<dyn RoomSide> = Arc::new(SlowRooms {
        applied: tx,
        release: std::sync::Mutex::new(released),
    });
    c.attach(Arc::downgrade(&rooms));
    let a = origin("a", 7, 1);
    lock(&c.directory).seen(&a, Instant::now());
    let shards = 2;
    let fast = (0..100)
        .map(|i| format!("fast{i}"))
        .find(|r| shard_of(r, shards) != shard_of("slow", shards))
        .expect("a room in the other shard");
    let mut txs = Vec::new();
    for _ in 0..shards {
        let (tx, rx) = mpsc::channel(16);
        tokio::spawn(run_inbound(Arc::downgrade(&c), Arc::clone(&c.control), rx));
        txs.push(tx);
    }
    let send = |room: &str, seq| {
        txs[shard_of(room, shards)]
            .try_send(Inbound::Update(Arc::from(room), delta(&a, seq)))
            .expect("room in the channel");
    };
    send("slow", 1);
    send(&fast, 1);
    send("slow", 2);
    assert_eq!(
        within("the fast room", applied.recv()).await,
        Some(fast.clone())
    );
    release.send(()).expect("released");
    release.send(()).expect("released");
    assert_eq!(
        within("slow", applied.recv()).await.as_deref(),
        Some("slow")
    );
    assert_eq!(
        within("slow", applied.recv()).await.as_deref(),
        Some("slow")
    );
    drop(rooms);
}

/// `/healthz` names every clash the directory knows of, after the
/// connection's state, and each name clash is counted once: another
/// process under this node's name, a peer's name used by two processes (a
/// newcomer that never claimed, then the incumbent), a peer on this slot.
#[tokio::test]
async fn healthz_names_every_clash_and_each_name_clash_is_counted_once() {
    let metrics = Arc::new(Metrics::default());
    let (c, _out) = Cluster::detached(Cluster::test_settings("me", 1), Arc::clone(&metrics));
    assert_eq!(c.health_line(), "cluster me: connected, 0 peers");
    assert!(
        super::observe(&c, &origin("n2", 5, 1)),
        "a peer on our slot"
    );
    assert!(super::observe(&c, &origin("n3", 7, 3)));
    for _ in 0..3 {
        assert!(!super::observe(&c, &origin("me", 9, 4)), "our name");
        assert!(!super::observe(&c, &origin("n3", 8, 3)), "never claimed");
    }
    assert!(super::observe(&c, &origin("n3", 7, 3)), "the incumbent");
    assert!(super::observe(&c, &origin("n3", 7, 3)));
    assert_eq!(metrics.cluster_name_clashes.get(), 2);
    assert_eq!(metrics.cluster_id_conflicts.get(), 1);
    assert_eq!(
        c.health_line(),
        "cluster me: connected, 2 peers; NAME CLASH: another process runs as me; \
         NAME CLASH: two processes run as n3; SLOT CLASH: slot 1 is also held by n2"
    );
}

/// A room's opening gathers the live peers' full states until each of them
/// answered: an answer from a node that was not live when the request went
/// out (a newcomer, or a forger) does not stand in for a live peer's, so a
/// joiner's snapshot still holds that peer's members.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_opening_waits_for_every_live_peer_not_for_any_answer() {
    let nats = NatsServer::start().await;
    let settings = |name: &str, slot| {
        let mut s = Cluster::test_settings(name, slot);
        s.urls = vec![nats.url()];
        s.heartbeat = Duration::from_millis(100);
        s.node_timeout = Duration::from_secs(60);
        s.snapshot_timeout = Duration::from_secs(6);
        s
    };
    let mut a = Node::with(settings("a", 1), &[]).await;
    let mut b = Node::with(settings("b", 2), &[]).await;
    a.health("connected, 1 peer").await;
    b.health("connected, 1 peer").await;
    // b's rooms are fakes that do not answer: the test answers for it on
    // b's connection, after a stranger "x" has answered first.
    let forger = b.cluster.nats.as_ref().expect("on NATS").client.clone();
    let mut requests = forger
        .subscribe(a.cluster.subjects.snapshot("shared"))
        .await
        .expect("subscribes");
    forger.flush().await.expect("flushed");
    let b_origin = b.cluster.me().to_pb();
    let answer = tokio::spawn(async move {
        let request = requests.next().await.expect("a snapshot request");
        let inbox = request.reply.expect("a request has an inbox");
        let full = |origin: &wire::cpb::Origin| {
            wire::encode_update(
                origin,
                wire::UpdateParts {
                    seq: 1,
                    full: true,
                    closed: true,
                    ..Default::default()
                },
            )
        };
        let stranger = origin("x", 7, 9).to_pb();
        forger
            .publish(inbox.clone(), full(&stranger))
            .await
            .expect("published");
        // NATS keeps one publisher's order: x's answer arrives first.
        forger
            .publish(inbox, full(&b_origin))
            .await
            .expect("published");
        forger.flush().await.expect("flushed");
    });
    let started = Instant::now();
    let fulls = within("the opening", a.cluster.open("shared")).await;
    within("the answers", answer).await.expect("answered");
    let from: Vec<&str> = fulls.iter().map(|u| &*u.origin.node).collect();
    assert_eq!(from, ["x", "b"], "both answers, b's awaited");
    // Ended by b's answer, not by the deadline (6 s: a generous one, as the
    // answers go through a test task and NATS on a busy machine).
    assert!(started.elapsed() < Duration::from_secs(5));
    a.cluster.close("shared");
}
