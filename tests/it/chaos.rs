//! Chaos (issue #15, "Tests"): three nodes on a real nats-server, nine to
//! twelve clients in three shared rooms (each room spans all three nodes),
//! joining, leaving, moving and chatting, then one fault at a time:
//!
//! 1. `kill -9` of a node (its clients reconnect to the others, and later
//!    come back to it once it is started again);
//! 2. SIGSTOP of a node past the node timeout, then SIGCONT;
//! 3. a restart under the same name (its clients reconnect to it);
//! 4. NATS down for 5 s;
//! 5. two NATS blips of 1 to 2 s, during each of which one room's last
//!    members on one node leave (so the room closes there while NATS is
//!    away);
//! 6. a node stalled 100 to 300 ms once a second for four seconds, under
//!    moves and chat;
//! 7. garbage and forged messages on the cluster's subjects, among them a
//!    heartbeat under a live node's name with another epoch.
//!
//! After each (and after each round of joins, leaves, moves and chat), every
//! connected client's view of its room (ids and names, from `Welcome`,
//! `Joined`, `Left` and `Resync`) must equal the truth within 5 s: the
//! clients the test knows are in that room, each under its own id and name,
//! nobody twice, each at the position it last moved to. Meanwhile every
//! message each client receives is checked as it arrives: a move or chat is
//! shown under the mover's own name; the moves (every one at a distinct x)
//! and chat each client receives from each member come once and in the
//! order sent; no `Joined` for an id already there, no `Left` for one not
//! there. While a node is frozen, its clients are not checked and the
//! others' truth leaves its members out; while NATS is down, each node's
//! truth is its own members.
//!
//! The workload is drawn from a seeded RNG: the seed is printed, and
//! `AMBLE_CHAOS_SEED=N` runs the same choices again (`AMBLE_CHAOS_TRACE=1`
//! also prints every view that differs from the truth while converging).
//!
//! The nodes run with a 500 ms heartbeat, a 3.5 s node timeout and a 200 ms
//! room linger (a room closes within a blip). A blip must stay under the
//! node timeout, and a node hears its peers again only after its own
//! reconnect, whose backoff (50 ms doubling to 1 s) ends up to 0.55 s after
//! a 2 s blip: with a last heartbeat up to one period before the blip, the
//! silence is up to 3.05 s. Under a shorter timeout the nodes drop each
//! other just after NATS is back and take each other back a moment later
//! (a `Left` and a `Joined` for every remote member), which this test
//! counts as a failure: the views must stay equal to the truth once equal.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use amble::cluster::wire::{self, UpdateParts, cpb};
use amble::protocol::pb::{self, client_message::Body as C, server_message::Body as S};
use amble::protocol::{Motion, Position, decode_motion, encode_client, move_body};
use futures_util::stream::SplitSink;
use futures_util::{SinkExt as _, StreamExt as _};
use prost::Message as _;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;

use crate::cluster_support::*;
use crate::support::{Client, Ws};

/// Every view must equal the truth this long after a fault.
const BOUND: Duration = Duration::from_secs(5);
/// Bumped by every connection's reader each time its view changes, so the
/// test awaits a change instead of looking again after a sleep.
type Changes = Arc<tokio::sync::watch::Sender<u64>>;
const ROOMS: [&str; 3] = ["atrium", "bazaar", "cellar"];
const NAMES: [&str; 12] = [
    "Ann", "Ben", "Cat", "Dan", "Eve", "Fay", "Gus", "Hal", "Ivy", "Jon", "Kim", "Lou",
];
/// Every position a client moves to has `y = TAG_Y + its index` (spawn
/// points stay well below), and an x drawn from one counter: so each move
/// names its mover, and each is distinct and later than the one before.
const TAG_Y: u32 = 4_900;
/// Nodes' flags: faster failure detection (the NATS blips stay under the
/// timeout), a short linger, and budgets the workload never hits.
const NODE_ARGS: &[&str] = &[
    // The clients here reconnect as fresh joins, without resume tokens: a
    // held place would show each of them twice for the grace.
    "--resume-grace-ms",
    "0",
    "--cluster-heartbeat-ms",
    "500",
    "--cluster-node-timeout-ms",
    "3500",
    "--cluster-room-linger-ms",
    "200",
    "--move-interval-ms",
    "50",
    "--move-burst",
    "4",
    "--chat-interval-ms",
    "100",
    "--chat-burst",
    "10",
];
/// A freeze that outlasts the node timeout above.
const FREEZE: Duration = Duration::from_millis(4_500);

// --------------------------------------------------------------------- views

/// A member as one client sees it.
#[derive(Clone, Debug, PartialEq)]
struct Shown {
    name: String,
    position: Option<(u32, u32)>,
}

/// One connection's view of its room, kept by its reader task, and what
/// broke the rules as it arrived.
#[derive(Default)]
struct View {
    /// A Welcome came since the last Join was sent (before it, and after a
    /// Leave, room messages are of no room and are not applied).
    joined: bool,
    id: Option<u32>,
    members: BTreeMap<u32, Shown>,
    /// Per mover (by name): the last x received, from a move or a state.
    last_x: HashMap<String, u32>,
    /// Per speaker (by name): the last chat number received.
    last_chat: HashMap<String, u32>,
    pongs: Vec<u64>,
    errors: Vec<String>,
    /// Rule violations seen, each with the view at the time.
    faults: Vec<String>,
    closed: bool,
}

impl View {
    fn fault(&mut self, what: String) {
        let view = self.describe();
        self.faults.push(format!("{what}; view then: {view}"));
    }

    fn describe(&self) -> String {
        let mut out = String::from("[");
        for (id, m) in &self.members {
            let at = m
                .position
                .map_or(String::new(), |(x, y)| format!("@{x},{y}"));
            let _ = write!(out, " {id}:{}{at}", m.name);
        }
        out.push_str(" ]");
        out
    }

    fn apply(&mut self, m: pb::ServerMessage, names: &[&str]) {
        if !m.motion.is_empty() {
            if !self.joined {
                return;
            }
            let records = match decode_motion(&m.motion) {
                Ok((_, records)) => records,
                Err(err) => return self.fault(format!("a bad motion batch: {err:?}")),
            };
            let mut ids = Vec::new();
            for r in records {
                if ids.contains(&r.member.0) {
                    self.fault(format!("id {} twice in one frame", r.member.0));
                }
                ids.push(r.member.0);
                self.place(r.member.0, r.motion.position, true, names);
            }
            return;
        }
        match m.body {
            Some(S::Welcome(w)) => {
                self.joined = true;
                self.id = Some(w.member_id);
                self.members.clear();
                self.last_x.clear();
                self.last_chat.clear();
                self.snapshot(w.snapshot.unwrap_or_default(), names);
            }
            Some(S::Resync(s)) if self.joined => {
                self.members.clear();
                self.snapshot(s, names);
            }
            Some(S::Joined(j)) if self.joined => {
                let member = j.member.unwrap_or_default();
                self.add(member, names);
            }
            Some(S::Left(l)) if self.joined => self.left(l.member_id, l.reason),
            Some(S::Chat(c)) if self.joined => self.chat(c.member_id, &c.text),
            Some(S::Pong(p)) => self.pongs.push(p.client_time_ms),
            Some(S::Error(e)) => self.errors.push(format!("{e:?}")),
            _ => {}
        }
    }

    fn left(&mut self, id: u32, reason: i32) {
        if self.members.remove(&id).is_none() {
            self.fault(format!(
                "Left for id {id} (reason {reason}), who is not in the view"
            ));
        }
    }

    fn snapshot(&mut self, snapshot: pb::Snapshot, names: &[&str]) {
        for m in snapshot.members {
            self.add(m, names);
        }
    }

    fn add(&mut self, m: pb::Member, names: &[&str]) {
        if let Some(there) = self.members.get(&m.id) {
            let there = there.name.clone();
            return self.fault(format!(
                "Joined {} as id {}, which is already in the view as {there}: a duplicate",
                m.name, m.id
            ));
        }
        self.members.insert(
            m.id,
            Shown {
                name: m.name,
                position: None,
            },
        );
        if let Some(p) = m.position {
            self.place(m.id, Position { x: p.x, y: p.y }, false, names);
        }
    }

    /// A member at `at`: from a move (`moved`), or from a state (a Welcome,
    /// a Joined, a Resync), which may repeat the last move but not go back.
    fn place(&mut self, id: u32, at: Position, moved: bool, names: &[&str]) {
        let Some(shown) = self.members.get_mut(&id) else {
            return self.fault(format!(
                "a move of id {id} to {at:?}, who is not in the view"
            ));
        };
        shown.position = Some((at.x, at.y));
        let shown = shown.name.clone();
        if at.y < TAG_Y {
            return; // a spawn point
        }
        let Some(&mover) = names.get((at.y - TAG_Y) as usize) else {
            return self.fault(format!("id {id} at {at:?}, a position nobody moved to"));
        };
        if mover != shown {
            return self.fault(format!(
                "{mover}'s move to x={} shown as id {id}'s, named {shown}: a wrong name",
                at.x
            ));
        }
        if let Some(&last) = self.last_x.get(mover)
            && ((moved && at.x <= last) || at.x < last)
        {
            let kind = if moved { "move" } else { "state" };
            self.fault(format!(
                "{mover}'s {kind} x={} after x={last}: a move repeated or out of order",
                at.x
            ));
        }
        self.last_x.insert(mover.to_owned(), at.x);
    }

    fn chat(&mut self, id: u32, text: &str) {
        let Some(shown) = self.members.get(&id) else {
            return self.fault(format!(
                "chat {text:?} from id {id}, who is not in the view"
            ));
        };
        let shown = shown.name.clone();
        let Some((n, from)) = text
            .split_once(' ')
            .and_then(|(n, from)| Some((n.parse::<u32>().ok()?, from)))
        else {
            return self.fault(format!("chat {text:?}: not one the test sent"));
        };
        if from != shown {
            return self.fault(format!(
                "{from}'s chat {text:?} shown as id {id}'s, named {shown}: a wrong name"
            ));
        }
        if let Some(&last) = self.last_chat.get(from)
            && n <= last
        {
            self.fault(format!(
                "{from}'s chat {n} after {last}: repeated or out of order"
            ));
        }
        self.last_chat.insert(from.to_owned(), n);
    }
}

/// One WebSocket: the test writes on it, a task reads it into a [`View`].
struct Conn {
    sink: SplitSink<Ws, Message>,
    view: Arc<Mutex<View>>,
    reader: tokio::task::JoinHandle<()>,
    seq: u32,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl Conn {
    async fn open(node: &Node, changes: &Changes) -> Self {
        let client = Client::connect(&node.ws_url()).await;
        let (sink, mut stream) = client.ws.split();
        let view = Arc::new(Mutex::new(View::default()));
        let reader = tokio::spawn({
            let view = Arc::clone(&view);
            let changes = Arc::clone(changes);
            async move {
                while let Some(frame) = stream.next().await {
                    match frame {
                        Ok(Message::Binary(b)) => {
                            let mut v = view.lock().expect("view lock");
                            match pb::ServerMessage::decode(b) {
                                Ok(m) => v.apply(m, &NAMES),
                                Err(err) => v.fault(format!("an undecodable frame: {err}")),
                            }
                        }
                        Ok(Message::Close(_)) | Err(_) => break,
                        Ok(_) => continue,
                    }
                    changes.send_modify(|n| *n += 1);
                }
                view.lock().expect("view lock").closed = true;
                changes.send_modify(|n| *n += 1);
            }
        });
        Self {
            sink,
            view,
            reader,
            seq: 0,
        }
    }

    async fn send(&mut self, body: C) {
        let bytes = encode_client(body);
        bounded(
            SETTLE,
            "a send",
            self.sink.send(Message::Binary(bytes.into())),
        )
        .await
        .expect("send");
    }

    fn view(&self) -> std::sync::MutexGuard<'_, View> {
        self.view.lock().expect("view lock")
    }
}

/// Checks `check` each time a view changes, until it holds (its value) or
/// `deadline` (a panic naming `what` and the last answer).
async fn until_views<T>(
    changes: &Changes,
    what: &str,
    deadline: Instant,
    mut check: impl FnMut() -> Result<T, String>,
) -> T {
    let mut changed = changes.subscribe();
    loop {
        changed.borrow_and_update();
        let last = match check() {
            Ok(value) => return value,
            Err(last) => last,
        };
        if tokio::time::timeout_at(deadline, changed.changed())
            .await
            .is_err()
        {
            panic!("timed out waiting for {what}; last: {last}");
        }
    }
}

// --------------------------------------------------------------------- truth

/// One client, as the test knows it: the truth.
struct Walker {
    idx: usize,
    name: &'static str,
    /// The node it is (or was last) connected to.
    node: usize,
    conn: Option<Conn>,
    /// Its room, when it is in one.
    room: Option<usize>,
    /// Its id there (from its Welcome).
    id: u32,
    /// The x it last moved to since it joined.
    x: Option<u32>,
}

impl Walker {
    /// In a room, connected: seen by the others, and a viewer.
    fn present(&self) -> bool {
        self.conn.is_some() && self.room.is_some()
    }
}

/// Who sees whom while a fault lasts.
#[derive(Clone, Copy, Debug)]
enum Reach {
    All,
    /// Node `k` is frozen: its clients are not checked, and the others do
    /// not see them.
    Without(usize),
    /// NATS is down: each node's clients see that node's members only.
    Local,
}

impl Reach {
    fn checks(self, viewer_node: usize) -> bool {
        !matches!(self, Self::Without(k) if k == viewer_node)
    }

    fn sees(self, viewer_node: usize, member_node: usize) -> bool {
        match self {
            Self::All => true,
            Self::Without(k) => member_node != k,
            Self::Local => viewer_node == member_node,
        }
    }
}

struct Chaos {
    seed: u64,
    rng: fastrand::Rng,
    nats: Nats,
    nodes: Vec<Node>,
    walkers: Vec<Walker>,
    next_x: u32,
    next_chat: u32,
    times: Vec<(String, Duration)>,
    changes: Changes,
}

impl Chaos {
    fn node_label(&self, k: usize) -> String {
        self.nodes[k].name.clone()
    }

    /// Opens a connection for walker `w` on node `k` and joins `room`.
    async fn connect(&mut self, w: usize, k: usize, room: usize) {
        let conn = Conn::open(&self.nodes[k], &self.changes).await;
        let walker = &mut self.walkers[w];
        walker.conn = Some(conn);
        walker.node = k;
        self.join(w, room).await;
    }

    /// Walker `w` joins `room` on its connection and moves at once.
    async fn join(&mut self, w: usize, room: usize) {
        let walker = &mut self.walkers[w];
        let conn = walker.conn.as_mut().expect("connected");
        {
            let mut v = conn.view();
            v.joined = false;
            v.id = None;
            v.errors.clear();
        }
        conn.send(C::Join(pb::Join {
            data: Vec::new(),
            start: None,
            room: ROOMS[room].into(),
            name: walker.name.into(),
            token: String::new(),
            resume_token: String::new(),
        }))
        .await;
        let what = format!("{}'s Welcome in {}", walker.name, ROOMS[room]);
        let view = Arc::clone(&conn.view);
        let id = until_views(&self.changes, &what, Instant::now() + SETTLE, || {
            let v = view.lock().expect("view lock");
            assert!(v.errors.is_empty(), "join refused: {:?}", v.errors);
            assert!(!v.closed, "closed before its Welcome");
            v.id.filter(|_| v.joined)
                .ok_or_else(|| "no Welcome yet".to_owned())
        })
        .await;
        walker.id = id;
        walker.room = Some(room);
        walker.x = None;
        self.step(w).await;
    }

    /// Walker `w` moves to a new x.
    async fn step(&mut self, w: usize) {
        self.next_x += 1;
        let x = self.next_x;
        assert!(x < 5_000, "more moves than the world is wide");
        let walker = &mut self.walkers[w];
        let y = TAG_Y + walker.idx as u32;
        let conn = walker.conn.as_mut().expect("connected");
        conn.seq += 1;
        let seq = conn.seq;
        conn.send(move_body(Motion::standing(Position { x, y }), seq, 0))
            .await;
        walker.x = Some(x);
    }

    async fn say(&mut self, w: usize) {
        self.next_chat += 1;
        let text = format!("{} {}", self.next_chat, self.walkers[w].name);
        let conn = self.walkers[w].conn.as_mut().expect("connected");
        conn.send(C::Chat(pb::SendChat { text })).await;
    }

    async fn leave(&mut self, w: usize) {
        let walker = &mut self.walkers[w];
        let conn = walker.conn.as_mut().expect("connected");
        conn.view().joined = false;
        conn.send(C::Leave(pb::Leave {})).await;
        walker.room = None;
        walker.x = None;
    }

    /// The walkers for whom `pick` holds, in order.
    fn who(&self, pick: impl Fn(&Walker) -> bool) -> Vec<usize> {
        self.walkers
            .iter()
            .filter(|w| pick(w))
            .map(|w| w.idx)
            .collect()
    }

    /// A round of the workload among the walkers on nodes `on` says: most
    /// move, some chat, one leaves, one who is out joins a room again.
    async fn churn(&mut self, on: impl Fn(usize) -> bool) {
        self.chatter(&on).await;
        let out = self.who(|w| w.conn.is_some() && w.room.is_none() && on(w.node));
        let present = self.who(|w| w.present() && on(w.node));
        if present.len() > 3 && self.rng.bool() {
            let w = present[self.rng.usize(..present.len())];
            self.leave(w).await;
        }
        if !out.is_empty() {
            let w = out[self.rng.usize(..out.len())];
            let room = self.rng.usize(..ROOMS.len());
            self.join(w, room).await;
        }
    }

    /// Moves and chat only (nothing that waits for an answer, so a stalled
    /// node's clients may take part): most move, some chat.
    async fn chatter(&mut self, on: impl Fn(usize) -> bool) {
        let active = self.who(|w| w.present() && on(w.node));
        for w in active {
            if self.rng.u8(..10) < 7 {
                self.step(w).await;
            }
            if self.rng.u8(..10) < 3 {
                self.say(w).await;
            }
        }
    }

    /// Each checked view against the truth: `Ok` when all are equal.
    fn compare(&self, reach: Reach) -> Result<(), String> {
        let mut out = String::new();
        for v in self.walkers.iter().filter(|w| w.present()) {
            if !reach.checks(v.node) {
                continue;
            }
            let view = v.conn.as_ref().expect("present").view();
            let mut want = BTreeMap::new();
            for w in &self.walkers {
                if w.present() && w.room == v.room && reach.sees(v.node, w.node) {
                    let at = w.x.map(|x| (x, TAG_Y + w.idx as u32));
                    want.insert(w.id, (w.name.to_owned(), at));
                }
            }
            let got: Members = view
                .members
                .iter()
                .map(|(&id, m)| {
                    let at = want.get(&id).and_then(|(_, at)| *at).and(m.position);
                    (id, (m.name.clone(), at))
                })
                .collect();
            if got != want || view.closed {
                let room = ROOMS[v.room.expect("present")];
                let _ = writeln!(
                    out,
                    "  {} (on {}, in {room}{}): view {}\n      truth {}",
                    v.name,
                    self.nodes[v.node].name,
                    if view.closed { ", closed" } else { "" },
                    view.describe(),
                    describe(&want)
                );
            }
        }
        if out.is_empty() { Ok(()) } else { Err(out) }
    }

    /// Every violation any connection saw so far.
    fn faults(&self) -> Vec<String> {
        let mut all = Vec::new();
        for w in &self.walkers {
            if let Some(conn) = &w.conn {
                for f in &conn.view().faults {
                    all.push(format!(
                        "  {} (on {}): {f}",
                        w.name, self.nodes[w.node].name
                    ));
                }
            }
        }
        all
    }

    fn assert_no_faults(&self, what: &str) {
        let faults = self.faults();
        assert!(
            faults.is_empty(),
            "seed {}: {what}: a client received what it must not:\n{}",
            self.seed,
            faults.join("\n")
        );
    }

    /// Waits until every checked view equals the truth, within 5 s of
    /// `from`; prints and keeps the time it took. Then each checked client
    /// pings, and once every Pong is back (everything sent before it was
    /// read) the views must still be equal.
    async fn converge(&mut self, what: &str, from: Instant, reach: Reach) {
        let this = &*self;
        let goal = format!(
            "seed {}: {what}: the views to be the truth (reach {reach:?})",
            this.seed
        );
        until_views(&this.changes, &goal, from + BOUND, || {
            this.assert_no_faults(what);
            this.compare(reach).inspect_err(|diff| {
                if std::env::var_os("AMBLE_CHAOS_TRACE").is_some() {
                    eprintln!("{what}, {:.2?}: not yet\n{diff}", from.elapsed());
                }
            })
        })
        .await;
        let took = from.elapsed();
        eprintln!("chaos seed {}: {what}: converged in {took:.2?}", self.seed);
        self.times.push((what.to_owned(), took));
        let viewers = self.who(|w| w.present() && reach.checks(w.node));
        let stamp = u64::from(self.rng.u32(..));
        for &w in &viewers {
            let conn = self.walkers[w].conn.as_mut().expect("present");
            conn.send(C::Ping(pb::Ping {
                client_time_ms: stamp,
            }))
            .await;
        }
        for &w in &viewers {
            let view = Arc::clone(&self.walkers[w].conn.as_ref().expect("present").view);
            let who = format!("{}'s Pong after {what}", self.walkers[w].name);
            until_views(&self.changes, &who, Instant::now() + SETTLE, || {
                let v = view.lock().expect("view lock");
                if v.pongs.contains(&stamp) {
                    Ok(())
                } else {
                    Err(format!("closed: {}", v.closed))
                }
            })
            .await;
        }
        self.assert_no_faults(what);
        if let Err(diff) = self.compare(reach) {
            panic!(
                "seed {}: {what}: the views changed after converging (a late ghost?):\n{diff}",
                self.seed
            );
        }
    }

    /// A round of the workload, then the check.
    async fn round(&mut self, what: &str) {
        self.churn(|_| true).await;
        self.converge(what, Instant::now(), Reach::All).await;
    }

    /// Waits until every node counts the other two as peers.
    async fn whole(&self) {
        for node in &self.nodes {
            has_peers(node, self.nodes.len() - 1).await;
        }
    }

    /// Drops the connections of the walkers on node `k` (gone with it).
    fn lost(&mut self, k: usize) -> Vec<usize> {
        let gone = self.who(|w| w.conn.is_some() && w.node == k);
        for &w in &gone {
            self.walkers[w].conn = None;
        }
        gone
    }
}

/// Members by id: name and position (the latter only where the truth has one).
type Members = BTreeMap<u32, (String, Option<(u32, u32)>)>;

fn describe(members: &Members) -> String {
    let mut out = String::from("[");
    for (id, (name, at)) in members {
        let at = at.map_or(String::new(), |(x, y)| format!("@{x},{y}"));
        let _ = write!(out, " {id}:{name}{at}");
    }
    out.push_str(" ]");
    out
}

// -------------------------------------------------------------------- forged

fn origin(node: &str, epoch: u64, slot: u32, slots: u32) -> cpb::Origin {
    cpb::Origin {
        node: node.into(),
        epoch,
        slot,
        slots,
    }
}

/// A member as a node describes it.
fn member(id: u32, name: &str) -> pb::Member {
    pb::Member {
        id,
        name: name.into(),
        position: Some(pb::Position { x: 100, y: 100 }),
        ..Default::default()
    }
}

/// A full state of `room` from `from` with one member.
fn forged_update(from: &cpb::Origin, seq: u64, m: pb::Member) -> Vec<u8> {
    wire::encode_update(
        from,
        UpdateParts {
            incarnation: 1,
            seq,
            full: true,
            tick_ms: 0,
            ops: vec![wire::joined_op(m, 1)],
            motion: &[],
            closed: false,
        },
    )
    .to_vec()
}

/// Garbage and forged messages for every subject kind: (subject, payload).
fn forgeries(rng: &mut fastrand::Rng) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let garbage = |rng: &mut fastrand::Rng| -> Vec<u8> {
        let n = rng.usize(1..64);
        std::iter::repeat_with(|| rng.u8(..)).take(n).collect()
    };
    let mut subjects = vec!["amble.v2.hb.all".to_owned(), "amble.v2.q.rooms".to_owned()];
    for room in ROOMS {
        subjects.push(format!("amble.v2.r.{room}"));
        subjects.push(format!("amble.v2.s.{room}"));
    }
    for i in 1..=3 {
        subjects.push(format!("amble.v2.n.{}", node_name(i)));
    }
    for s in &subjects {
        out.push((s.clone(), garbage(rng)));
        out.push((s.clone(), vec![0xff, 0xff, 0xff, 0xff, 0x0f, 0x00, 0x01]));
    }
    // A node that never beat ("mallory", slot 9) claims members in every
    // room: with a good full state, an id outside its slot, an id past a
    // motion head, a seq with no next, and another slot count.
    let mallory = origin("mallory", 0xdead_beef, 9, 16);
    let heartbeat = wire::encode_heartbeat(&mallory, cpb::Heartbeat::default()).to_vec();
    for room in ROOMS {
        let subject = format!("amble.v2.r.{room}");
        out.push((
            subject.clone(),
            forged_update(&mallory, 1, member(16 + 9, "Mallory")),
        ));
        out.push((
            subject.clone(),
            forged_update(&mallory, 2, member(16 + 1, "Mallet")),
        ));
        out.push((
            subject.clone(),
            forged_update(&mallory, 3, member((1 << 31) + 9, "Huge")),
        ));
        out.push((
            subject.clone(),
            forged_update(&mallory, u64::MAX, member(32 + 9, "Wrap")),
        ));
        out.push((
            subject.clone(),
            forged_update(&origin("mallory", 7, 9, 8), 1, member(9, "Eight")),
        ));
        // A heartbeat where a room update belongs.
        out.push((subject, heartbeat.clone()));
        // A room update where a snapshot request belongs.
        out.push((
            format!("amble.v2.s.{room}"),
            forged_update(&mallory, 1, member(9, "Snap")),
        ));
    }
    // A heartbeat under a live node's name with another epoch, never
    // announced by a slot claim (finding 4): it must not retire n2.
    let impostor = origin(&node_name(2), 0x1234_5678, 2, 16);
    out.push((
        "amble.v2.hb.all".into(),
        wire::encode_heartbeat(&impostor, cpb::Heartbeat::default()).to_vec(),
    ));
    // A room update where heartbeats belong; a sync request that names
    // every room (each node then publishes its full states again).
    out.push((
        "amble.v2.hb.all".into(),
        forged_update(&mallory, 1, member(9, "Beat")),
    ));
    let rooms: Vec<String> = ROOMS.iter().map(|r| (*r).to_owned()).collect();
    for i in 1..=3 {
        out.push((
            format!("amble.v2.n.{}", node_name(i)),
            wire::encode_sync_request(&mallory, rooms.clone()).to_vec(),
        ));
    }
    rng.shuffle(&mut out);
    out
}

// ---------------------------------------------------------------------- test

#[tokio::test]
async fn chaos_every_view_converges_to_the_truth_after_each_fault() {
    let seed = std::env::var("AMBLE_CHAOS_SEED")
        .ok()
        .map(|s| s.parse().expect("AMBLE_CHAOS_SEED: a number"))
        .unwrap_or_else(|| fastrand::u64(..));
    eprintln!("chaos seed {seed} (AMBLE_CHAOS_SEED={seed} runs it again)");
    let began = Instant::now();
    let mut rng = fastrand::Rng::with_seed(seed);

    let nats = Nats::start().await;
    let mut nodes = Vec::new();
    for i in 1..=3 {
        nodes.push(Node::start(&nats, i, NODE_ARGS).await);
    }
    // Nine to twelve clients: the first nine put one member of each room on
    // each node; the rest go anywhere.
    let count = rng.usize(9..=12);
    let mut places: Vec<(usize, usize)> = (0..9).map(|i| (i % 3, i / 3)).collect();
    for _ in 9..count {
        places.push((rng.usize(..3), rng.usize(..3)));
    }
    rng.shuffle(&mut places);
    let walkers = (0..count)
        .map(|idx| Walker {
            idx,
            name: NAMES[idx],
            node: places[idx].0,
            conn: None,
            room: None,
            id: u32::MAX,
            x: None,
        })
        .collect();
    let mut c = Chaos {
        seed,
        rng,
        nats,
        nodes,
        walkers,
        next_x: 0,
        next_chat: 0,
        times: Vec::new(),
        changes: Arc::new(tokio::sync::watch::Sender::new(0)),
    };
    c.whole().await;
    for (w, &(k, room)) in places.iter().enumerate() {
        c.connect(w, k, room).await;
    }
    c.converge("everyone joined", Instant::now(), Reach::All)
        .await;
    c.round("a first round").await;

    // 1. kill -9: its clients reconnect to the other nodes at once; the
    // old members go after the node timeout.
    let k = c.rng.usize(..3);
    let label = c.node_label(k);
    let killed = Instant::now();
    c.nodes[k].kill().await;
    let gone = c.lost(k);
    for &w in &gone {
        let to = (k + 1 + c.rng.usize(..2)) % 3;
        let room = c.walkers[w].room.unwrap_or_else(|| c.rng.usize(..3));
        c.connect(w, to, room).await;
    }
    c.converge(&format!("kill -9 {label}"), killed, Reach::All)
        .await;
    c.round("a round after the kill").await;
    // Started again (a new incarnation), and its clients come back to it.
    c.nodes[k].restart().await;
    c.whole().await;
    let back = Instant::now();
    for &w in &gone {
        let room = c.walkers[w].room.unwrap_or_else(|| c.rng.usize(..3));
        c.walkers[w].conn = None;
        c.connect(w, k, room).await;
    }
    c.converge(&format!("{label}'s clients back on it"), back, Reach::All)
        .await;

    // 2. SIGSTOP past the node timeout, a round on the others meanwhile,
    // then SIGCONT.
    let k = c.rng.usize(..3);
    let label = c.node_label(k);
    let frozen = Instant::now();
    c.nodes[k].freeze();
    c.converge(
        &format!("{label} frozen: its members gone"),
        frozen,
        Reach::Without(k),
    )
    .await;
    c.churn(|node| node != k).await;
    c.converge(
        &format!("a round while {label} is frozen"),
        Instant::now(),
        Reach::Without(k),
    )
    .await;
    tokio::time::sleep_until(frozen + FREEZE).await;
    let thawed = Instant::now();
    c.nodes[k].thaw();
    c.converge(&format!("{label} thawed"), thawed, Reach::All)
        .await;
    c.whole().await;
    c.round("a round after the thaw").await;

    // 3. A restart under the same name: its clients reconnect to it.
    let k = c.rng.usize(..3);
    let label = c.node_label(k);
    let restarted = Instant::now();
    c.nodes[k].kill().await;
    let gone = c.lost(k);
    c.nodes[k].restart().await;
    for &w in &gone {
        let room = c.walkers[w].room.unwrap_or_else(|| c.rng.usize(..3));
        c.connect(w, k, room).await;
    }
    c.converge(
        &format!("{label} restarted under its name"),
        restarted,
        Reach::All,
    )
    .await;
    c.whole().await;
    c.round("a round after the restart").await;

    // 4. NATS down 5 s: each node's rooms shrink to its own members, and
    // serve on (a round meanwhile); NATS back: whole again.
    let down = Instant::now();
    c.nats.stop().await;
    c.converge("NATS down: each node on its own", down, Reach::Local)
        .await;
    c.churn(|_| true).await;
    c.converge("a round without NATS", Instant::now(), Reach::Local)
        .await;
    tokio::time::sleep_until(down + Duration::from_secs(5)).await;
    let up = Instant::now();
    c.nats.restart().await;
    c.converge("NATS back after 5 s", up, Reach::All).await;
    c.whole().await;
    c.round("a round after NATS came back").await;

    // 5. NATS blips of 1 to 2 s, under the node timeout: during each, the
    // last members of one room on one node leave (the room closes there
    // while NATS is away).
    for blip in 1..=2 {
        let (k, room) = loop {
            let (k, room) = (c.rng.usize(..3), c.rng.usize(..3));
            let here = c.who(|w| w.present() && w.node == k && w.room == Some(room));
            if !here.is_empty() {
                break (k, room);
            }
        };
        let length = Duration::from_millis(c.rng.u64(1_000..=2_000));
        let label = c.node_label(k);
        let away = Instant::now();
        c.nats.stop().await;
        for w in c.who(|w| w.present() && w.node == k && w.room == Some(room)) {
            c.leave(w).await;
        }
        tokio::time::sleep_until(away + length).await;
        let up = Instant::now();
        c.nats.restart().await;
        c.converge(
            &format!(
                "NATS blip {blip} ({length:?}; {} closed on {label} meanwhile)",
                ROOMS[room]
            ),
            up,
            Reach::All,
        )
        .await;
        c.whole().await;
        c.round(&format!("a round after blip {blip}")).await;
    }

    // 6. A node stalled 100 to 300 ms once a second for four seconds,
    // under moves and chat everywhere.
    let k = c.rng.usize(..3);
    let label = c.node_label(k);
    let mut stalls = Vec::new();
    let mut thawed = Instant::now();
    for n in 1..=4 {
        let second = Instant::now();
        let stall = Duration::from_millis(c.rng.u64(100..=300));
        stalls.push(stall.as_millis());
        c.nodes[k].freeze();
        c.chatter(|_| true).await;
        tokio::time::sleep_until(second + stall).await;
        c.nodes[k].thaw();
        thawed = Instant::now();
        c.churn(|_| true).await;
        if n < 4 {
            tokio::time::sleep_until(second + Duration::from_secs(1)).await;
        }
    }
    c.converge(
        &format!("{label} stalled {stalls:?} ms, once a second"),
        thawed,
        Reach::All,
    )
    .await;
    c.whole().await;

    // 7. Garbage and forged messages on every subject kind.
    let forged = forgeries(&mut c.rng);
    let sent = Instant::now();
    for (subject, payload) in &forged {
        c.nats.publish(subject, payload).await;
    }
    c.converge(
        &format!("{} garbage and forged messages", forged.len()),
        sent,
        Reach::All,
    )
    .await;
    for node in &c.nodes {
        let bad = node
            .metric("amble_cluster_bad_messages_total")
            .await
            .unwrap_or_default();
        assert!(bad > 0.0, "{}: no bad message counted", node.name);
    }
    c.whole().await;
    c.round("a last round").await;

    let total = began.elapsed();
    let mut summary = format!("chaos seed {seed}: passed in {total:.1?}; converged in");
    for (what, took) in &c.times {
        let _ = write!(summary, "\n  {took:>8.2?}  {what}");
    }
    eprintln!("{summary}");
}

/// The checker itself: a ghost, a duplicate, a wrong name, a repeated or
/// reordered move or chat each leave a fault; the ordinary traffic none.
#[test]
fn the_view_checker_catches_what_it_must() {
    use amble::protocol::{MemberId, MotionRecord, push_records};
    let names = &NAMES[..];
    let msg = |body: S| pb::ServerMessage {
        body: Some(body),
        ..Default::default()
    };
    let moves = |records: &[(u32, u32, u32)]| {
        let records: Vec<MotionRecord> = records
            .iter()
            .map(|&(id, x, y)| MotionRecord {
                member: MemberId(id),
                motion: Motion::standing(Position { x, y }),
            })
            .collect();
        let mut motion = vec![7];
        push_records(&mut motion, &records);
        pb::ServerMessage {
            motion,
            ..Default::default()
        }
    };
    let welcome = || {
        msg(S::Welcome(pb::Welcome {
            member_id: 1,
            snapshot: Some(pb::Snapshot {
                members: vec![member(1, "Ann"), member(2, "Ben")],
                ..Default::default()
            }),
            ..Default::default()
        }))
    };
    let chat = |id: u32, text: &str| {
        msg(S::Chat(pb::ChatMessage {
            member_id: id,
            text: text.into(),
            ..Default::default()
        }))
    };
    let joined = |id: u32, name: &str| {
        msg(S::Joined(pb::Joined {
            member: Some(member(id, name)),
        }))
    };
    let left = |id: u32| {
        msg(S::Left(pb::Left {
            member_id: id,
            reason: 0,
        }))
    };
    let faults = |script: Vec<pb::ServerMessage>| {
        let mut v = View::default();
        for m in script {
            v.apply(m, names);
        }
        v.faults
    };
    let ok = faults(vec![
        welcome(),
        moves(&[(1, 10, TAG_Y), (2, 11, TAG_Y + 1)]),
        chat(2, "1 Ben"),
        moves(&[(2, 12, TAG_Y + 1)]),
        joined(17, "Cat"),
        chat(17, "2 Cat"),
        left(2),
        joined(18, "Ben"),
        moves(&[(18, 13, TAG_Y + 1)]),
    ]);
    assert_eq!(ok, Vec::<String>::new());
    for (what, script) in [
        (
            "a repeated move",
            vec![moves(&[(2, 11, TAG_Y + 1)]), moves(&[(2, 11, TAG_Y + 1)])],
        ),
        (
            "a reordered move",
            vec![moves(&[(2, 12, TAG_Y + 1)]), moves(&[(2, 11, TAG_Y + 1)])],
        ),
        ("a move shown as another's", vec![moves(&[(2, 13, TAG_Y)])]),
        ("a ghost's move", vec![moves(&[(3, 14, TAG_Y + 2)])]),
        ("a duplicate Joined", vec![joined(2, "Ben")]),
        ("a Left of nobody", vec![left(5)]),
        ("a ghost's chat", vec![chat(5, "3 Cat")]),
        ("a chat under another name", vec![chat(2, "3 Ann")]),
        ("a repeated chat", vec![chat(2, "4 Ben"), chat(2, "4 Ben")]),
        (
            "a state older than a move",
            vec![moves(&[(2, 20, TAG_Y + 1)]), left(2), {
                let mut m = member(2, "Ben");
                m.position = Some(pb::Position {
                    x: 19,
                    y: TAG_Y + 1,
                });
                msg(S::Joined(pb::Joined { member: Some(m) }))
            }],
        ),
    ] {
        let mut all = vec![welcome()];
        all.extend(script);
        assert!(!faults(all).is_empty(), "{what}: not caught");
    }
}
