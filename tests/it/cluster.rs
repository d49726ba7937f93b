//! Cluster mode (issue 9) over real processes: a real `nats-server` on
//! ephemeral ports, two or three `amble` nodes (`n1`, `n2`, `n3` with slots
//! 1, 2, 3), and real WebSocket clients. See `cluster_support` for the
//! processes.
//!
//! Every client keeps its own view of the room (from its `Welcome`, then
//! `Joined`, `Left`, motion and `Resync`) and checks each message against
//! it as it arrives: a `Joined` for an id or name already there (a
//! duplicate), a `Left`, chat or move for a member that is not there (a
//! ghost or a reordering), or two motion frames in one tick fail the test
//! at once.
//!
//! The node timeouts are the defaults (1 s heartbeats, 3 s until a silent
//! node is down), so the 5 s bounds of the contract are what is measured,
//! from the moment of the kill, stop or restart. Where a test sets a timing
//! flag, it says why.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use amble::protocol::pb::{self, client_message::Body as C, server_message::Body as S};
use amble::protocol::{MemberId, Motion, MotionRecord, Position, Walk, decode_motion, move_body};
use tokio::time::Instant;

use crate::cluster_support::*;
use crate::support::{Client, Event};

/// `--cluster-slots`' default: a wire id is `local_index * 16 + slot`.
const SLOTS: u32 = 16;
/// The member's server went away.
const SERVER_LOST: i32 = pb::LeaveReason::ServerLost as i32;
const LEFT: i32 = pb::LeaveReason::Left as i32;
const DISCONNECTED: i32 = pb::LeaveReason::Disconnected as i32;
const SHUTDOWN: i32 = pb::LeaveReason::Shutdown as i32;
/// The contract's bound for removing a dead node's members, and for
/// rebuilding the shared rooms after NATS comes back.
const FIVE_S: Duration = Duration::from_secs(5);

// ------------------------------------------------------------------ cluster

/// nats-server and nodes `n1..=nN`.
struct Cluster {
    nats: Nats,
    nodes: Vec<Node>,
}

impl Cluster {
    /// nats-server and `n` nodes with the default settings, each of which
    /// has heard from all the others.
    async fn start(n: u32) -> Self {
        let extras = vec![&[][..]; n as usize];
        Self::start_with(&extras).await
    }

    /// One node per entry of `extras` (its extra arguments).
    async fn start_with(extras: &[&[&str]]) -> Self {
        let nats = Nats::start().await;
        let mut nodes = Vec::new();
        for (i, extra) in (1..).zip(extras) {
            nodes.push(Node::start(&nats, i, extra).await);
        }
        let cluster = Self { nats, nodes };
        cluster.settled(&cluster.all()).await;
        cluster
    }

    fn all(&self) -> Vec<u32> {
        (1..=self.nodes.len() as u32).collect()
    }

    /// Node `nI`.
    fn n(&self, i: u32) -> &Node {
        &self.nodes[i as usize - 1]
    }

    fn n_mut(&mut self, i: u32) -> &mut Node {
        &mut self.nodes[i as usize - 1]
    }

    /// Waits until each of `nodes` counts the others as its peers.
    async fn settled(&self, nodes: &[u32]) {
        for &i in nodes {
            has_peers(self.n(i), nodes.len() - 1).await;
        }
    }
}

/// Waits until the second line of `node`'s `/healthz` reads `want`.
async fn healthz_says(node: &Node, want: &str) {
    poll(
        SETTLE,
        &format!("{} /healthz to say {want:?}", node.name),
        || async {
            let (status, lines) = node.healthz().await;
            let ok = status.contains(" 200")
                && lines.first().map(String::as_str) == Some("ok")
                && lines.get(1).map(String::as_str) == Some(want)
                && lines.len() == 2;
            if ok {
                Ok(())
            } else {
                Err(format!("{status}: {lines:?}"))
            }
        },
    )
    .await;
}

/// Waits until `series` in `node`'s `/metrics` reads `want` or more.
async fn metric_is_at_least(node: &Node, series: &str, want: f64) {
    poll(
        SETTLE,
        &format!("{} {series} to reach {want}", node.name),
        || async {
            match node.metric(series).await {
                Some(v) if v >= want => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
}

// ------------------------------------------------------------------- people

/// What a client received, in order.
#[derive(Clone, Debug, PartialEq)]
enum Seen {
    Joined(u32, String),
    Left(u32, i32),
    Chat(u32, String),
    /// A member's whole data after a change (`MemberData`).
    Data(u32, Vec<pb::DataEntry>),
    /// The batch's time word and its records.
    Motion(u32, Vec<MotionRecord>),
    Resync(Vec<u32>),
    Pong(u64),
    /// A member's id changed (it resumed through another node): old, new.
    Renumbered(u32, u32),
    Other(String),
    /// The server closed the connection (code).
    Closed(u16),
}

/// A WebSocket client in a room, with its own view of the room.
struct Person {
    name: String,
    id: u32,
    client: Client,
    /// The room as this client knows it: id -> member.
    view: BTreeMap<u32, pb::Member>,
    /// Everything received since the Welcome, with when it was read.
    seen: Vec<(Instant, Seen)>,
    /// Entries of `seen` a wait has taken.
    taken: BTreeSet<usize>,
    /// The previous motion frame's time word, and when it came.
    last_frame: Option<(u32, Instant)>,
    seq: u32,
    closed: bool,
    /// The member data its Joins carry.
    data: Vec<pb::DataEntry>,
}

fn standing(x: u32, y: u32) -> Motion {
    Motion::standing(Position { x, y })
}

fn walking(from: (u32, u32), to: (u32, u32), speed: u32) -> Motion {
    Motion {
        position: Position {
            x: from.0,
            y: from.1,
        },
        walk: Some(Walk {
            target: Position { x: to.0, y: to.1 },
            speed,
        }),
    }
}

impl Person {
    /// Connects to `node` and joins `room` as `name`.
    async fn join(node: &Node, room: &str, name: &str) -> Self {
        Self::join_with_data(node, room, name, &[]).await
    }

    /// As [`Person::join`], with member data in the Join.
    async fn join_with_data(node: &Node, room: &str, name: &str, data: &[(&str, &str)]) -> Self {
        let client = Client::connect(&node.ws_url()).await;
        let mut person = Self {
            name: name.to_owned(),
            id: u32::MAX,
            client,
            view: BTreeMap::new(),
            seen: Vec::new(),
            taken: BTreeSet::new(),
            last_frame: None,
            seq: 0,
            closed: false,
            data: entries(data),
        };
        person.join_again(room).await;
        person
    }

    /// Joins `room` (again) on the same connection.
    async fn join_again(&mut self, room: &str) {
        self.client
            .send(C::Join(pb::Join {
                data: self.data.clone(),
                start: None,
                room: room.into(),
                name: self.name.clone(),
                token: String::new(),
                resume_token: String::new(),
            }))
            .await;
        let welcome = loop {
            match self.next(Instant::now() + SETTLE, "its Welcome").await {
                (_, Some(S::Welcome(w))) => break w,
                (_, Some(S::Error(e))) => panic!("{}: join refused: {e:?}", self.name),
                _ => {}
            }
        };
        self.id = welcome.member_id;
        let snapshot = welcome.snapshot.expect("a Welcome has a snapshot");
        self.view = self.members_of(snapshot);
        assert!(
            self.view.contains_key(&self.id),
            "{}: own id {} not in the Welcome",
            self.name,
            self.id
        );
        self.last_frame = None;
    }

    /// A snapshot's members by id, refusing duplicate ids and names.
    fn members_of(&self, snapshot: pb::Snapshot) -> BTreeMap<u32, pb::Member> {
        let mut view = BTreeMap::new();
        let mut names = BTreeSet::new();
        for m in snapshot.members {
            assert!(
                names.insert(m.name.clone()),
                "{}: two members named {} in a snapshot",
                self.name,
                m.name
            );
            let id = m.id;
            assert!(
                view.insert(id, m).is_none(),
                "{}: id {id} twice in a snapshot",
                self.name
            );
        }
        view
    }

    /// The names in this client's view, sorted.
    fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.view.values().map(|m| m.name.clone()).collect();
        names.sort();
        names
    }

    /// The id this client knows `name` by.
    fn id_of(&self, name: &str) -> u32 {
        self.view
            .values()
            .find(|m| m.name == name)
            .map(|m| m.id)
            .unwrap_or_else(|| panic!("{}: no {name} in {:?}", self.name, self.names()))
    }

    /// Reads one message (before `deadline`), checks it against the view
    /// and applies it. Returns when it was read and its body (`None` for a
    /// motion batch or a close).
    async fn next(&mut self, deadline: Instant, what: &str) -> (Instant, Option<S>) {
        assert!(!self.closed, "{}: closed, waiting for {what}", self.name);
        let event = match tokio::time::timeout_at(deadline, self.client.next_event()).await {
            Ok(e) => e,
            Err(_) => panic!(
                "{}: timed out waiting for {what}; view {:?}; last seen {:?}",
                self.name,
                self.names(),
                self.seen.iter().rev().take(12).collect::<Vec<_>>()
            ),
        };
        let now = Instant::now();
        let m = match event {
            Event::Message(m) => m,
            Event::Closed(frame) => {
                self.closed = true;
                let code = frame.map_or(1006, |f| f.code.into());
                self.seen.push((now, Seen::Closed(code)));
                return (now, None);
            }
        };
        if !m.motion.is_empty() {
            let (time, records) = decode_motion(&m.motion).expect("a valid motion batch");
            self.check_frame(time, now, &records);
            self.seen.push((now, Seen::Motion(time, records)));
            return (now, None);
        }
        let seen = match &m.body {
            Some(S::Joined(j)) => {
                let member = j.member.clone().expect("Joined has a member");
                assert!(
                    !self.view.contains_key(&member.id),
                    "{}: Joined {} as id {}, which is already in the view {:?}: a duplicate",
                    self.name,
                    member.name,
                    member.id,
                    self.view.get(&member.id).map(|m| &m.name)
                );
                assert!(
                    !self.view.values().any(|m| m.name == member.name),
                    "{}: Joined {} (id {}) while {} is already in the view: a ghost or a duplicate",
                    self.name,
                    member.name,
                    member.id,
                    member.name
                );
                let seen = Seen::Joined(member.id, member.name.clone());
                self.view.insert(member.id, member);
                seen
            }
            Some(S::Left(l)) => {
                assert!(
                    self.view.remove(&l.member_id).is_some(),
                    "{}: Left for id {} (reason {}), which is not in the view {:?}",
                    self.name,
                    l.member_id,
                    l.reason,
                    self.names()
                );
                Seen::Left(l.member_id, l.reason)
            }
            Some(S::Chat(c)) => {
                assert!(
                    self.view.contains_key(&c.member_id),
                    "{}: chat {:?} from id {}, who is not in the view {:?}",
                    self.name,
                    c.text,
                    c.member_id,
                    self.names()
                );
                Seen::Chat(c.member_id, c.text.clone())
            }
            Some(S::Pong(p)) => Seen::Pong(p.client_time_ms),
            Some(S::MemberData(d)) => {
                let member = self.view.get_mut(&d.member_id).unwrap_or_else(|| {
                    panic!("data of id {}, who is not in the view", d.member_id)
                });
                member.data = d.data.clone();
                Seen::Data(d.member_id, d.data.clone())
            }
            Some(S::Resync(r)) => {
                self.view = self.members_of(r.clone());
                Seen::Resync(self.view.keys().copied().collect())
            }
            Some(S::Renumbered(r)) => {
                let mut member = self.view.remove(&r.old_id).unwrap_or_else(|| {
                    panic!(
                        "{}: Renumbered {} -> {}, who is not in the view {:?}",
                        self.name,
                        r.old_id,
                        r.new_id,
                        self.names()
                    )
                });
                assert!(
                    !self.view.contains_key(&r.new_id),
                    "{}: Renumbered to id {}, which is already in the view",
                    self.name,
                    r.new_id
                );
                member.id = r.new_id;
                self.view.insert(r.new_id, member);
                Seen::Renumbered(r.old_id, r.new_id)
            }
            other => Seen::Other(format!("{other:?}")),
        };
        self.seen.push((now, seen));
        (now, m.body)
    }

    /// A motion frame: at most one per tick, every record of a member in
    /// the view, each member once.
    fn check_frame(&mut self, time: u32, now: Instant, records: &[MotionRecord]) {
        // Time words repeat every 128 ticks (12.8 s at 100 ms): the same
        // word within half of that is the same tick.
        if let Some((last, at)) = self.last_frame {
            assert!(
                !(last == time && now - at < Duration::from_millis(6_400)),
                "{}: two motion frames in the tick with time word {time}",
                self.name
            );
        }
        self.last_frame = Some((time, now));
        let mut ids = BTreeSet::new();
        for r in records {
            let id = r.member.0;
            assert!(ids.insert(id), "{}: id {id} twice in one frame", self.name);
            let member = self.view.get_mut(&id).unwrap_or_else(|| {
                panic!(
                    "{}: a move of id {id}, who is not in the view (ids {:?})",
                    self.name, ids
                )
            });
            member.position = Some(r.motion.position.into());
            member.walk = r.motion.walk.map(Into::into);
        }
    }

    /// The first entry not yet taken for which `pick` returns something,
    /// among those already read and then those arriving (each checked
    /// against the view as it comes); the entry is taken, so a later wait
    /// does not find it again. Entries may be taken out of order: a chat
    /// that overtook a move is still found after the move is.
    async fn take<T>(
        &mut self,
        limit: Duration,
        what: &str,
        pick: impl FnMut(&Seen) -> Option<T>,
    ) -> (T, Instant) {
        self.find(limit, what, true, pick).await
    }

    /// [`Person::take`], leaving the entry for later waits when `take` is
    /// false (a motion frame holds several members' moves).
    async fn find<T>(
        &mut self,
        limit: Duration,
        what: &str,
        take: bool,
        mut pick: impl FnMut(&Seen) -> Option<T>,
    ) -> (T, Instant) {
        let deadline = Instant::now() + limit;
        let mut next = 0;
        loop {
            while next < self.seen.len() {
                let i = next;
                next += 1;
                if self.taken.contains(&i) {
                    continue;
                }
                let (at, seen) = &self.seen[i];
                if let Some(t) = pick(seen) {
                    let at = *at;
                    if take {
                        self.taken.insert(i);
                    }
                    return (t, at);
                }
            }
            assert!(
                !self.closed,
                "{}: closed while waiting for {what}",
                self.name
            );
            self.next(deadline, what).await;
        }
    }

    /// Reads until this client's view holds exactly `names`; returns when.
    async fn sees(&mut self, limit: Duration, names: &[&str]) -> Instant {
        let mut want: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        want.sort();
        let deadline = Instant::now() + limit;
        let what = format!("the room to be {want:?}");
        while self.names() != want {
            assert!(
                !self.closed,
                "{}: closed while waiting for {what}",
                self.name
            );
            self.next(deadline, &what).await;
        }
        Instant::now()
    }

    /// A `Joined` for `name`: its id.
    async fn sees_join(&mut self, name: &str) -> u32 {
        self.take(SETTLE, &format!("{name} to join"), |s| match s {
            Seen::Joined(id, n) if n == name => Some(*id),
            _ => None,
        })
        .await
        .0
    }

    /// A `Left` for `id`: the reason, and when it was read.
    async fn sees_left(&mut self, id: u32) -> (i32, Instant) {
        self.take(SETTLE, &format!("id {id} to leave"), |s| match s {
            Seen::Left(left, reason) if *left == id => Some(*reason),
            _ => None,
        })
        .await
    }

    /// A motion frame that puts `id` at `motion`: the frame's records.
    async fn sees_move(&mut self, id: u32, motion: Motion) -> Vec<MotionRecord> {
        let what = format!("id {id} to move to {motion:?}");
        self.find(SETTLE, &what, false, |s| match s {
            Seen::Motion(_, records)
                if records
                    .iter()
                    .any(|r| r.member == MemberId(id) && r.motion == motion) =>
            {
                Some(records.clone())
            }
            _ => None,
        })
        .await
        .0
    }

    /// The chat `text` from `id`.
    async fn sees_chat(&mut self, id: u32, text: &str) {
        let what = format!("chat {text:?} from id {id}");
        self.take(SETTLE, &what, |s| {
            matches!(s, Seen::Chat(from, t) if *from == id && t == text).then_some(())
        })
        .await;
    }

    /// A `MemberData` that gives `id` exactly `data`.
    async fn sees_data(&mut self, id: u32, data: &[(&str, &str)]) {
        let want = entries(data);
        let what = format!("id {id}'s data to be {data:?}");
        self.take(SETTLE, &what, |s| {
            matches!(s, Seen::Data(from, d) if *from == id && *d == want).then_some(())
        })
        .await;
    }

    async fn set_data(&mut self, data: &[(&str, &str)]) {
        self.client
            .send(C::SetData(pb::SetData {
                data: entries(data),
            }))
            .await;
    }

    /// Reads until the server closes the connection; returns the code.
    async fn sees_close(&mut self) -> u16 {
        let deadline = Instant::now() + SETTLE;
        while !self.closed {
            self.next(deadline, "the connection to close").await;
        }
        match self.seen.last() {
            Some((_, Seen::Closed(code))) => *code,
            other => panic!("{}: closed after {other:?}", self.name),
        }
    }

    /// A Ping answered: everything the server sent before the Pong has
    /// been read (and checked).
    async fn ping(&mut self) {
        let stamp = u64::from(fastrand::u32(..));
        self.client
            .send(C::Ping(pb::Ping {
                client_time_ms: stamp,
            }))
            .await;
        self.take(SETTLE, "a Pong", |s| {
            (*s == Seen::Pong(stamp)).then_some(())
        })
        .await;
    }

    async fn send_move(&mut self, motion: Motion) {
        self.seq += 1;
        self.client.send(move_body(motion, self.seq, 0)).await;
    }

    async fn say(&mut self, text: &str) {
        self.client
            .send(C::Chat(pb::SendChat { text: text.into() }))
            .await;
    }

    async fn leave(&mut self) {
        self.client.send(C::Leave(pb::Leave {})).await;
    }

    /// The events concerning `id`, in the order they were read.
    fn about(&self, id: u32) -> Vec<Seen> {
        self.seen
            .iter()
            .filter_map(|(_, s)| match s {
                Seen::Joined(i, _) | Seen::Left(i, _) | Seen::Chat(i, _) if *i == id => {
                    Some(s.clone())
                }
                Seen::Motion(t, records) => {
                    let mine: Vec<MotionRecord> = records
                        .iter()
                        .filter(|r| r.member == MemberId(id))
                        .copied()
                        .collect();
                    (!mine.is_empty()).then_some(Seen::Motion(*t, mine))
                }
                _ => None,
            })
            .collect()
    }
}

fn entries(pairs: &[(&str, &str)]) -> Vec<pb::DataEntry> {
    pairs
        .iter()
        .map(|(k, v)| pb::DataEntry {
            key: (*k).into(),
            value: (*v).into(),
        })
        .collect()
}

/// Joins each `(node, name)` to `room` in turn, then waits until every one
/// of them sees all of them.
async fn gather<const N: usize>(c: &Cluster, room: &str, who: [(u32, &str); N]) -> [Person; N] {
    let mut people = Vec::new();
    for (node, name) in who {
        people.push(Person::join(c.n(node), room, name).await);
    }
    let names = who.map(|(_, name)| name);
    for p in &mut people {
        p.sees(SETTLE, &names).await;
    }
    people
        .try_into()
        .unwrap_or_else(|_| unreachable!("N people"))
}

/// A fresh client's Welcome on `node`: the room's full member list (names,
/// sorted), without the fresh client itself. It leaves again at once.
async fn welcome_names(node: &Node, room: &str) -> Vec<String> {
    let probe = format!("probe-{}", fastrand::u32(..));
    let mut p = Person::join(node, room, &probe).await;
    let names = p
        .names()
        .into_iter()
        .filter(|n| *n != probe)
        .collect::<Vec<_>>();
    p.leave().await;
    names
}

/// Waits until a fresh joiner's Welcome on `node` lists exactly `names`.
async fn welcome_lists(node: &Node, room: &str, names: &[&str], limit: Duration) {
    let mut want: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
    want.sort();
    poll(
        limit,
        &format!("a Welcome on {} to list {want:?}", node.name),
        || async {
            let got = welcome_names(node, room).await;
            if got == want {
                Ok(())
            } else {
                Err(format!("{got:?}"))
            }
        },
    )
    .await;
}

fn assert_within(bound: Duration, from: Instant, at: Instant, what: &str) {
    let took = at - from;
    assert!(took <= bound, "{what} took {took:?}, over {bound:?}");
}

/// Each of `watchers` (read side by side) sees each of `ids` leave with
/// `SERVER_LOST` within 5 s of `from`.
async fn lost_within_5_s(watchers: [&mut Person; 2], ids: [u32; 2], from: Instant) {
    async fn see(p: &mut Person, ids: [u32; 2]) -> Vec<(String, u32, (i32, Instant))> {
        let mut lefts = Vec::new();
        for id in ids {
            lefts.push((p.name.clone(), id, p.sees_left(id).await));
        }
        lefts
    }
    let [a, b] = watchers;
    let (x, y) = tokio::join!(see(a, ids), see(b, ids));
    for (who, id, (reason, at)) in x.into_iter().chain(y) {
        assert_eq!(reason, SERVER_LOST, "{who}: id {id}'s reason");
        assert_within(FIVE_S, from, at, &format!("{who} seeing id {id} leave"));
    }
}

// -------------------------------------------------------------------- tests

#[tokio::test]
async fn members_on_two_nodes_see_each_others_join_moves_chat_and_leave() {
    let c = Cluster::start(2).await;
    let mut ada = Person::join(c.n(1), "square", "Ada").await;
    assert_eq!(ada.id % SLOTS, c.n(1).slot, "an id from n1's slot");
    ada.send_move(standing(1111, 2222)).await;
    ada.sees_move(ada.id, standing(1111, 2222)).await;

    let mut bo = Person::join(c.n(2), "square", "Bo").await;
    assert_eq!(bo.id % SLOTS, c.n(2).slot, "an id from n2's slot");
    assert_eq!(bo.names(), ["Ada", "Bo"], "Bo's Welcome lists Ada on n1");
    assert_eq!(bo.id_of("Ada"), ada.id);
    assert_eq!(
        bo.view[&ada.id].position,
        Some(pb::Position { x: 1111, y: 2222 }),
        "with her last position"
    );
    assert_eq!(ada.sees_join("Bo").await, bo.id);

    // A walk from n1 reaches n2 whole; a step from n2 reaches n1.
    let walk = walking((1111, 2222), (3000, 2500), 500);
    ada.send_move(walk).await;
    bo.sees_move(ada.id, walk).await;
    bo.send_move(standing(400, 300)).await;
    ada.sees_move(bo.id, standing(400, 300)).await;

    // Chat both ways; the sender gets its own too.
    ada.say("hello from n1").await;
    bo.sees_chat(ada.id, "hello from n1").await;
    ada.sees_chat(ada.id, "hello from n1").await;
    bo.say("hi from n2").await;
    ada.sees_chat(bo.id, "hi from n2").await;

    // A Leave, then a dropped connection, each seen on the other node.
    let mut cy = Person::join(c.n(2), "square", "Cy").await;
    assert_eq!(cy.names(), ["Ada", "Bo", "Cy"]);
    ada.sees_join("Cy").await;
    ada.leave().await;
    assert_eq!(cy.sees_left(ada.id).await.0, LEFT);
    assert_eq!(bo.sees_left(ada.id).await.0, LEFT);
    let mut dee = Person::join(c.n(1), "square", "Dee").await;
    assert_eq!(dee.names(), ["Bo", "Cy", "Dee"]);
    drop(bo);
    assert_eq!(dee.sees_left(cy.id_of("Bo")).await.0, DISCONNECTED);
    cy.sees(SETTLE, &["Cy", "Dee"]).await;
}

/// Dee on n1 moves, chats, moves, chats, and leaves, each step after her
/// own node applied the one before; what a member on n2 sees of her, with
/// the time words set aside.
async fn dee_seen_from_the_other_node() -> (u32, Vec<Seen>, String) {
    let c = Cluster::start(2).await;
    let mut watcher = Person::join(c.n(2), "order", "Watcher").await;
    let mut dee = Person::join(c.n(1), "order", "Dee").await;
    dee.send_move(standing(100, 100)).await;
    dee.sees_move(dee.id, standing(100, 100)).await;
    dee.say("after the first move").await;
    dee.sees_chat(dee.id, "after the first move").await;
    dee.send_move(standing(200, 200)).await;
    dee.sees_move(dee.id, standing(200, 200)).await;
    dee.say("after the second move").await;
    dee.sees_chat(dee.id, "after the second move").await;
    // A move and a leave at once: the move may be dropped with the member,
    // but never come after the Left (the view check fails on that).
    dee.send_move(standing(300, 300)).await;
    dee.leave().await;
    watcher.sees_left(dee.id).await;
    let seen = watcher
        .about(dee.id)
        .into_iter()
        .map(|s| match s {
            Seen::Motion(_, r) => Seen::Motion(0, r),
            s => s,
        })
        .collect();
    let text = c.n(2).metrics().await;
    let figure = |s| metric_in(&text, s).unwrap_or(f64::NAN);
    let figures = format!(
        "n2: amble_cluster_remote_moves_total {}, amble_cluster_remote_moves_late_total {}",
        figure("amble_cluster_remote_moves_total"),
        figure("amble_cluster_remote_moves_late_total")
    );
    (dee.id, seen, figures)
}

/// A `Motion` entry of one record, as [`dee_seen_from_the_other_node`]
/// gives them.
fn moved(id: u32, m: Motion) -> Seen {
    Seen::Motion(
        0,
        vec![MotionRecord {
            member: MemberId(id),
            motion: m,
        }],
    )
}

/// One member's events reach a member on another node in order within
/// each kind: the join first, the moves in the order made (an earlier one
/// may be coalesced away, as in one process, but the newest arrives), the
/// chat in order, the leave last, and nothing after it.
#[tokio::test]
async fn one_members_events_keep_their_order_across_nodes() {
    let (id, seen, _) = dee_seen_from_the_other_node().await;
    assert_eq!(
        seen.first(),
        Some(&Seen::Joined(id, "Dee".into())),
        "{seen:?}"
    );
    assert_eq!(seen.last(), Some(&Seen::Left(id, LEFT)), "{seen:?}");
    let chats: Vec<&Seen> = seen
        .iter()
        .filter(|s| matches!(s, Seen::Chat(..)))
        .collect();
    assert_eq!(
        chats,
        [
            &Seen::Chat(id, "after the first move".into()),
            &Seen::Chat(id, "after the second move".into())
        ]
    );
    let moves: Vec<&Seen> = seen
        .iter()
        .filter(|s| matches!(s, Seen::Motion(..)))
        .filter(|s| **s != moved(id, standing(300, 300)))
        .collect();
    let both = [
        &moved(id, standing(100, 100)),
        &moved(id, standing(200, 200)),
    ];
    assert!(
        moves == both || moves == both[1..],
        "the moves in order, the last one there: {seen:?}"
    );
}

/// A chat Dee sends once her move is applied reaches a member on another
/// node after that move, not before it: per member, moves and chat keep
/// the order they happened in (issue 9, "Per member, order is preserved").
#[tokio::test]
async fn a_chat_sent_after_a_move_arrives_after_it_on_another_node() {
    let (id, seen, figures) = dee_seen_from_the_other_node().await;
    let seen: Vec<Seen> = seen
        .into_iter()
        .filter(|s| *s != moved(id, standing(300, 300)))
        .collect();
    assert_eq!(
        seen,
        [
            Seen::Joined(id, "Dee".into()),
            moved(id, standing(100, 100)),
            Seen::Chat(id, "after the first move".into()),
            moved(id, standing(200, 200)),
            Seen::Chat(id, "after the second move".into()),
            Seen::Left(id, LEFT),
        ],
        "{figures}"
    );
}

/// Each member gets at most one motion frame per tick (the view check), and
/// a local and a remote move made at the same moment normally share it.
#[tokio::test]
async fn local_and_remote_moves_share_one_frame_per_tick() {
    let c = Cluster::start(2).await;
    let [mut ada, mut bo, mut on1, mut on2] =
        gather(&c, "tick", [(1, "Ada"), (2, "Bo"), (1, "On1"), (2, "On2")]).await;
    let (ada_id, bo_id) = (ada.id, bo.id);
    let mut shared = [false, false];
    // Moves past the burst are held by the throttle and applied about a
    // second apart; eight rounds leave room for a few that miss.
    for round in 0..8 {
        if shared == [true, true] {
            break;
        }
        let (a, b) = (standing(1000 + round, 1000), standing(2000 + round, 2000));
        tokio::join!(ada.send_move(a), bo.send_move(b));
        for (i, watcher) in [&mut on1, &mut on2].into_iter().enumerate() {
            let mut got = (false, false);
            while got != (true, true) {
                let (records, _) = watcher
                    .take(SETTLE, &format!("round {round}'s moves"), |s| match s {
                        Seen::Motion(_, r) => Some(r.clone()),
                        _ => None,
                    })
                    .await;
                let has = |id, m| {
                    records
                        .iter()
                        .any(|r| r.member == MemberId(id) && r.motion == m)
                };
                if has(ada_id, a) && has(bo_id, b) {
                    shared[i] = true;
                }
                got = (got.0 || has(ada_id, a), got.1 || has(bo_id, b));
            }
        }
    }
    assert_eq!(
        shared,
        [true, true],
        "a frame on n1 and a frame on n2 holding both moves of a round"
    );
}

#[tokio::test]
async fn a_late_joiner_on_an_empty_node_gets_every_member_in_its_welcome() {
    let c = Cluster::start(3).await;
    let mut ada = Person::join(c.n(1), "late", "Ada").await;
    let mut al = Person::join(c.n(1), "late", "Al").await;
    let mut bo = Person::join(c.n(2), "late", "Bo").await;
    ada.send_move(walking((10, 20), (4000, 4000), 300)).await;
    bo.send_move(standing(321, 654)).await;
    al.sees_move(ada.id, walking((10, 20), (4000, 4000), 300))
        .await;
    al.sees_move(bo.id, standing(321, 654)).await;

    let cy = Person::join(c.n(3), "late", "Cy").await;
    assert_eq!(cy.names(), ["Ada", "Al", "Bo", "Cy"]);
    assert_eq!(cy.id % SLOTS, 3);
    for p in [&ada, &al, &bo] {
        assert_eq!(cy.id_of(&p.name), p.id, "{}'s id", p.name);
    }
    let ada_seen = &cy.view[&ada.id];
    assert_eq!(ada_seen.position, Some(pb::Position { x: 10, y: 20 }));
    assert_eq!(
        ada_seen.walk.as_ref().and_then(|w| w.target),
        Some(pb::Position { x: 4000, y: 4000 }),
        "a walk under way is in the snapshot"
    );
    assert_eq!(
        cy.view[&bo.id].position,
        Some(pb::Position { x: 321, y: 654 })
    );
    // The next joiner there is served from n3's replica.
    let dee = Person::join(c.n(3), "late", "Dee").await;
    assert_eq!(dee.names(), ["Ada", "Al", "Bo", "Cy", "Dee"]);
}

/// Issue #19: member data travels with the member: in its Joined on the
/// other node, as a change (once, sender included), and in a late
/// joiner's snapshot taken from the replica.
#[tokio::test]
async fn member_data_is_seen_on_the_other_node_at_join_on_change_and_in_snapshots() {
    let c = Cluster::start(2).await;
    let mut bo = Person::join(c.n(2), "data", "Bo").await;
    let mut ada = Person::join_with_data(
        c.n(1),
        "data",
        "Ada",
        &[("status", "busy"), ("colour", "red")],
    )
    .await;
    let sorted = entries(&[("colour", "red"), ("status", "busy")]);
    assert_eq!(ada.view[&ada.id].data, sorted);
    bo.sees_join("Ada").await;
    assert_eq!(bo.view[&ada.id].data, sorted, "in the Joined on n2");

    ada.set_data(&[("status", "presenting"), ("colour", "")])
        .await;
    ada.sees_data(ada.id, &[("status", "presenting")]).await;
    bo.sees_data(ada.id, &[("status", "presenting")]).await;
    // And from n2 to n1.
    bo.set_data(&[("colour", "blue")]).await;
    ada.sees_data(bo.id, &[("colour", "blue")]).await;

    // A late joiner on n2 is served from n2's replica of n1's part.
    let cy = Person::join(c.n(2), "data", "Cy").await;
    assert_eq!(cy.view[&ada.id].data, entries(&[("status", "presenting")]));
    assert_eq!(cy.view[&bo.id].data, entries(&[("colour", "blue")]));
    // Each change reached each member once.
    bo.ping().await;
    let changes = bo
        .seen
        .iter()
        .filter(|(_, s)| matches!(s, Seen::Data(id, _) if *id == ada.id))
        .count();
    assert_eq!(changes, 1);
}

/// Issue #19: where a member appears travels with it: a Join's start on
/// one node is where the other node's members see it, in its Joined and in
/// a late joiner's snapshot there.
#[tokio::test]
async fn a_start_position_is_seen_on_the_other_node() {
    let c = Cluster::start(2).await;
    let mut bo = Person::join(c.n(2), "start", "Bo").await;
    let at = || pb::Position { x: 1_234, y: 4_321 };
    let mut ada = Client::connect(&c.n(1).ws_url()).await;
    ada.send(C::Join(pb::Join {
        data: Vec::new(),
        start: Some(at()),
        room: "start".into(),
        name: "Ada".into(),
        token: String::new(),
        resume_token: String::new(),
    }))
    .await;
    let id = ada.welcome().await.member_id;
    bo.sees_join("Ada").await;
    assert_eq!(bo.view[&id].position, Some(at()), "in the Joined on n2");
    let cy = Person::join(c.n(2), "start", "Cy").await;
    assert_eq!(cy.view[&id].position, Some(at()), "in a snapshot on n2");
}

/// A node that has just started (no heartbeat heard yet) still gives a
/// complete Welcome: a restarted node's first joiners are the usual case.
#[tokio::test]
async fn a_join_on_a_node_just_started_gets_every_member_in_its_welcome() {
    let nats = Nats::start().await;
    let n1 = Node::start(&nats, 1, &[]).await;
    let _ada = Person::join(&n1, "fresh", "Ada").await;
    let n2 = Node::start(&nats, 2, &[]).await;
    let bo = Person::join(&n2, "fresh", "Bo").await;
    assert_eq!(bo.names(), ["Ada", "Bo"]);
}

#[tokio::test]
async fn ids_stay_unique_across_three_nodes_under_concurrent_joins() {
    let c = Cluster::start(3).await;
    let names: Vec<String> = (0..36).map(|i| format!("p{i:02}")).collect();
    let joins = names.iter().enumerate().map(|(i, name)| {
        let node = c.n(1 + i as u32 % 3);
        async move { Person::join(node, "crowd", name).await }
    });
    let people = futures_util::future::join_all(joins).await;
    let mut ids = BTreeSet::new();
    for (i, p) in people.iter().enumerate() {
        assert!(ids.insert(p.id), "id {} given twice ({})", p.id, p.name);
        assert_eq!(
            p.id % SLOTS,
            1 + i as u32 % 3,
            "{}: its node's slot",
            p.name
        );
    }
    let everyone: Vec<&str> = names.iter().map(String::as_str).collect();
    for i in 1..=3 {
        welcome_lists(c.n(i), "crowd", &everyone, SETTLE).await;
    }
    // And every member's own view came to hold everyone, with the same ids.
    for mut p in people {
        p.sees(SETTLE, &everyone).await;
        let view: BTreeSet<u32> = p.view.keys().copied().collect();
        assert_eq!(view, ids, "{}'s view", p.name);
    }
}

/// Three nodes, 100 rooms, each held by one node: each node subscribes to
/// its own rooms only, so the others' traffic never reaches it; after a
/// room's last member leaves (and the linger), the node unsubscribes.
#[tokio::test]
async fn a_node_gets_no_traffic_for_rooms_it_does_not_hold() {
    let c = Cluster::start(3).await;
    let room = |i: u32| format!("room-{i:03}");
    let holder = |i: u32| 1 + i % 3;
    let joins = (0..100).map(|i| {
        let node = c.n(holder(i));
        async move { Person::join(node, &room(i), &format!("m{i}")).await }
    });
    let mut people = futures_util::future::join_all(joins).await;

    let subjects = |node: u32| -> BTreeSet<String> {
        (0..100)
            .filter(|&i| holder(i) == node)
            .map(|i| format!("amble.v2.r.{}", room(i)))
            .collect()
    };
    let room_subs = |subs: &[String]| -> BTreeSet<String> {
        subs.iter()
            .filter(|s| s.starts_with("amble.v2.r."))
            .cloned()
            .collect()
    };
    let by_node = c.nats.subscriptions_by_node("amble").await;
    for i in 1..=3 {
        let subs = by_node
            .get(&node_name(i))
            .unwrap_or_else(|| panic!("no NATS connection of n{i} in {by_node:?}"));
        assert_eq!(room_subs(subs), subjects(i), "n{i}'s room subscriptions");
        let gauge = c.n(i).metric("amble_cluster_rooms_subscribed").await;
        assert_eq!(gauge, Some(subjects(i).len() as f64), "n{i}");
    }

    // Traffic in every room: a move and a chat each.
    let before = received_and_published(&c).await;
    let started = Instant::now();
    for p in &mut people {
        p.send_move(standing(500, 500)).await;
        p.say("traffic").await;
    }
    for p in &mut people {
        let id = p.id;
        p.sees_move(id, standing(500, 500)).await;
        p.sees_chat(id, "traffic").await;
    }
    let after = received_and_published(&c).await;
    let seconds = started.elapsed().as_secs_f64();
    let published: f64 = (0..3).map(|i| after[i].1 - before[i].1).sum();
    assert!(
        published >= 200.0,
        "a move and a chat in 100 rooms published only {published} messages"
    );
    // What a node may still receive meanwhile: the two peers' heartbeats.
    let allowance = 2.0 * (seconds + 2.0);
    for i in 0..3 {
        let got = after[i].0 - before[i].0;
        assert!(
            got <= allowance,
            "n{} received {got} messages in {seconds:.1} s while every room it holds \
             is its own (heartbeats allow {allowance}); nodes published {published}",
            i + 1
        );
    }

    // Room 0's member leaves; room 3's disconnects: n1 unsubscribes both
    // after the linger, and keeps the rest.
    people[0].leave().await;
    people[0].ping().await;
    let gone = people.remove(3);
    drop(gone);
    let mut left = subjects(1);
    left.remove(&format!("amble.v2.r.{}", room(0)));
    left.remove(&format!("amble.v2.r.{}", room(3)));
    poll(
        SETTLE,
        "n1 to unsubscribe from room-000 and room-003",
        || async {
            let by_node = c.nats.subscriptions_by_node("amble").await;
            let subs = room_subs(by_node.get("n1").map_or(&[][..], Vec::as_slice));
            if subs == left {
                Ok(())
            } else {
                Err(format!("{subs:?}"))
            }
        },
    )
    .await;
    metric_is(c.n(1), "amble_cluster_rooms_subscribed", left.len() as f64).await;
}

/// Per node: (messages received, messages published).
async fn received_and_published(c: &Cluster) -> Vec<(f64, f64)> {
    let mut out = Vec::new();
    for node in &c.nodes {
        let text = node.metrics().await;
        let get = |s| metric_in(&text, s).unwrap_or_else(|| panic!("{}: no {s}", node.name));
        out.push((
            get("amble_cluster_messages_received_total"),
            get("amble_cluster_messages_published_total"),
        ));
    }
    out
}

#[tokio::test]
async fn a_killed_nodes_members_leave_everywhere_within_5_s_and_rejoin_elsewhere() {
    let mut c = Cluster::start(3).await;
    let all = ["Ada", "Bea", "Bo", "Cy"];
    let [mut ada, mut bo, mut bea, mut cy] =
        gather(&c, "kill", [(1, "Ada"), (2, "Bo"), (2, "Bea"), (3, "Cy")]).await;
    let (bo_id, bea_id) = (bo.id, bea.id);

    let killed = Instant::now();
    c.n_mut(2).kill().await;
    lost_within_5_s([&mut ada, &mut cy], [bo_id, bea_id], killed).await;
    assert_eq!(ada.names(), ["Ada", "Cy"]);

    // Bo's and Bea's connections broke; they come back through n1 and n3.
    assert_eq!(
        bo.sees_close().await,
        1006,
        "no close frame from a dead node"
    );
    assert_eq!(bea.sees_close().await, 1006);
    let mut bo = Person::join(c.n(1), "kill", "Bo").await;
    let mut bea = Person::join(c.n(3), "kill", "Bea").await;
    for p in [&mut ada, &mut cy, &mut bo, &mut bea] {
        p.sees(SETTLE, &all).await;
    }
    assert_eq!(bo.id % SLOTS, 1);
    assert_eq!(bea.id % SLOTS, 3);
    welcome_lists(c.n(1), "kill", &all, SETTLE).await;
    welcome_lists(c.n(3), "kill", &all, SETTLE).await;

    for i in [1, 3] {
        let node = c.n(i);
        let text = node.metrics().await;
        assert_eq!(metric_in(&text, "amble_cluster_peers"), Some(1.0), "n{i}");
        assert_eq!(
            metric_in(&text, "amble_cluster_nodes_lost_total"),
            Some(1.0),
            "n{i}"
        );
        healthz_says(node, &format!("cluster n{i}: connected, 1 peer")).await;
    }
}

/// SIGTERM: the node closes its connections, and after the drain
/// (`--cluster-drain-ms`, 2 s, in which clients may fail over) says goodbye,
/// so the others drop its members then. n1 waits 30 s for a silent node
/// here, so only the goodbye can remove them within the test.
#[tokio::test]
async fn a_graceful_stop_removes_its_members_after_the_drain() {
    let mut c = Cluster::start_with(&[&["--cluster-node-timeout-ms", "30000"], &[]]).await;
    let mut ada = Person::join(c.n(1), "bye", "Ada").await;
    let mut bo = Person::join(c.n(2), "bye", "Bo").await;
    ada.sees(SETTLE, &["Ada", "Bo"]).await;

    let stopped = Instant::now();
    c.n(2).terminate();
    let (reason, at) = ada.sees_left(bo.id).await;
    assert!(
        [SHUTDOWN, SERVER_LOST].contains(&reason),
        "a reason that says the server went away, got {reason}"
    );
    assert_within(
        Duration::from_secs(3),
        stopped,
        at,
        "the Left after SIGTERM (a 2 s drain)",
    );
    assert!(
        at - stopped >= Duration::from_millis(1_900),
        "the Left came before the drain ended: {:?}",
        at - stopped
    );
    assert_eq!(bo.sees_close().await, 1001);
    let exit = c.n_mut(2).exited().await;
    assert!(exit.success(), "n2 exit status {exit}");
    metric_is(c.n(1), "amble_cluster_remote_members", 0.0).await;
}

/// SIGSTOP n2 past the node timeout: n1 and n3 drop its members; SIGCONT:
/// they take them back under the same ids, and every view (the clients'
/// own, a fresh joiner's on each node, the remote member counts) ends
/// exactly right.
#[tokio::test]
async fn a_frozen_node_is_dropped_then_taken_back_without_ghosts_or_duplicates() {
    let c = Cluster::start(3).await;
    let all = ["Ada", "Bea", "Bo", "Cy"];
    let [mut ada, mut bo, mut bea, mut cy] =
        gather(&c, "freeze", [(1, "Ada"), (2, "Bo"), (2, "Bea"), (3, "Cy")]).await;
    let (bo_id, bea_id) = (bo.id, bea.id);

    let frozen = Instant::now();
    c.n(2).freeze();
    lost_within_5_s([&mut ada, &mut cy], [bo_id, bea_id], frozen).await;

    let thawed = Instant::now();
    c.n(2).thaw();
    let (a, b) = tokio::join!(ada.sees(SETTLE, &all), cy.sees(SETTLE, &all));
    assert_within(FIVE_S, thawed, a.max(b), "taking n2's members back");
    assert_eq!(
        (ada.id_of("Bo"), ada.id_of("Bea")),
        (bo_id, bea_id),
        "same ids"
    );
    for p in [&mut bo, &mut bea] {
        p.sees(SETTLE, &all).await;
    }
    // n2 serves again: Bo's move reaches n1 and n3.
    bo.send_move(standing(777, 888)).await;
    ada.sees_move(bo_id, standing(777, 888)).await;
    cy.sees_move(bo_id, standing(777, 888)).await;

    for i in 1..=3 {
        welcome_lists(c.n(i), "freeze", &all, SETTLE).await;
    }
    for (i, remote) in [(1, 3.0), (2, 2.0), (3, 3.0)] {
        metric_is(c.n(i), "amble_cluster_remote_members", remote).await;
    }
    // Nothing more trickles in: a ping round trip on each, views unchanged.
    for p in [&mut ada, &mut bo, &mut bea, &mut cy] {
        p.ping().await;
        p.sees(SETTLE, &all).await;
    }
}

/// NATS killed: each node goes on serving its own members (moves, chat,
/// even a new join), the shared room shrinks to what is local, /healthz
/// and /metrics say so; NATS back on the same port: the room is whole again
/// on both nodes within 5 s.
#[tokio::test]
async fn without_nats_each_node_serves_its_own_and_the_room_heals_within_5_s() {
    let mut c = Cluster::start(2).await;
    let [mut ada, mut al, mut bo, mut bea] =
        gather(&c, "outage", [(1, "Ada"), (1, "Al"), (2, "Bo"), (2, "Bea")]).await;

    let lost = Instant::now();
    c.nats.stop().await;
    let (ada_at, bo_at) = tokio::join!(
        ada.sees(SETTLE, &["Ada", "Al"]),
        bo.sees(SETTLE, &["Bea", "Bo"])
    );
    assert_within(FIVE_S, lost, ada_at.max(bo_at), "the rooms shrinking");
    for p in [&ada, &bo] {
        let reasons: Vec<i32> = p
            .seen
            .iter()
            .filter_map(|(_, s)| match s {
                Seen::Left(_, r) => Some(*r),
                _ => None,
            })
            .collect();
        assert_eq!(reasons, [SERVER_LOST, SERVER_LOST], "{}", p.name);
    }

    // Local service goes on: moves, chat, a new join answered promptly.
    al.send_move(standing(42, 43)).await;
    ada.sees_move(al.id, standing(42, 43)).await;
    bea.say("still here on n2").await;
    bo.sees_chat(bea.id, "still here on n2").await;
    let asked = Instant::now();
    let mut dan = Person::join(c.n(1), "outage", "Dan").await;
    assert_within(
        Duration::from_secs(2),
        asked,
        Instant::now(),
        "a join on n1 without NATS",
    );
    assert_eq!(dan.names(), ["Ada", "Al", "Dan"]);

    for i in 1..=2 {
        let node = c.n(i);
        assert_eq!(node.metric("amble_cluster_connected").await, Some(0.0));
        let (status, lines) = node.healthz().await;
        assert!(status.contains(" 200"), "{status}");
        assert_eq!(lines.first().map(String::as_str), Some("ok"));
        let second = lines.get(1).cloned().unwrap_or_default();
        let prefix = format!("cluster n{i}: NATS unreachable for ");
        let seconds = second
            .strip_prefix(&prefix)
            .and_then(|rest| rest.strip_suffix("s; serving local members only"))
            .unwrap_or_else(|| panic!("n{i} /healthz second line: {second:?}"));
        let seconds: u64 = seconds.parse().unwrap_or_else(|_| panic!("{second:?}"));
        assert!(seconds <= lost.elapsed().as_secs() + 1, "{second:?}");
    }

    let back = Instant::now();
    c.nats.restart().await;
    let everyone = ["Ada", "Al", "Bea", "Bo", "Dan"];
    let (a, b) = tokio::join!(ada.sees(SETTLE, &everyone), bo.sees(SETTLE, &everyone));
    assert_within(FIVE_S, back, a.max(b), "the shared room whole again");
    for p in [&mut al, &mut bea, &mut dan] {
        p.sees(SETTLE, &everyone).await;
    }
    for i in 1..=2 {
        welcome_lists(c.n(i), "outage", &everyone, SETTLE).await;
        let node = c.n(i);
        metric_is(node, "amble_cluster_connected", 1.0).await;
        healthz_says(node, &format!("cluster n{i}: connected, 1 peer")).await;
    }
}

/// n1 killed and started again under its name: its old members are gone
/// from n2 as soon as the new incarnation is heard (n2 waits 30 s for a
/// silent node here, so only the new epoch can remove them), and nothing of
/// them comes back.
#[tokio::test]
async fn a_node_restarted_under_its_name_leaves_no_ghosts() {
    let mut c = Cluster::start_with(&[&[], &["--cluster-node-timeout-ms", "30000"]]).await;
    let mut ada = Person::join(c.n(1), "again", "Ada").await;
    let mut al = Person::join(c.n(1), "again", "Al").await;
    let mut bo = Person::join(c.n(2), "again", "Bo").await;
    bo.sees(SETTLE, &["Ada", "Al", "Bo"]).await;
    let (ada_id, al_id) = (ada.id, al.id);

    c.n_mut(1).kill().await;
    c.n_mut(1).restart().await;
    ada.sees_close().await;
    al.sees_close().await;
    let (a, _) = bo.sees_left(ada_id).await;
    let (b, _) = bo.sees_left(al_id).await;
    assert_eq!([a, b], [SERVER_LOST, SERVER_LOST]);
    c.settled(&[1, 2]).await;

    // Ada comes back on the new n1 (likely under her old id).
    let ada = Person::join(c.n(1), "again", "Ada").await;
    assert_eq!(ada.names(), ["Ada", "Bo"], "no ghost of Al on the new n1");
    assert_eq!(bo.sees_join("Ada").await, ada.id);
    assert_eq!(bo.names(), ["Ada", "Bo"]);
    welcome_lists(c.n(2), "again", &["Ada", "Bo"], SETTLE).await;
    welcome_lists(c.n(1), "again", &["Ada", "Bo"], SETTLE).await;
    metric_is(c.n(2), "amble_cluster_remote_members", 1.0).await;
}

/// The start-up line, /healthz, every cluster metric, and /api/rooms with
/// counts over the whole cluster.
#[tokio::test]
async fn healthz_metrics_and_api_rooms_show_the_cluster() {
    let c = Cluster::start(2).await;
    for i in 1..=2 {
        let lines = c.n(i).log().matching("joined cluster via");
        let want = format!(
            "joined cluster via {}: node n{i} (slot {i} of 16), prefix amble",
            c.nats.url()
        );
        assert!(
            lines.len() == 1 && lines[0].contains(&want),
            "n{i}: one start-up line saying {want:?}, got {lines:?}"
        );
    }

    let _a = Person::join(c.n(1), "shared", "A").await;
    let _b = Person::join(c.n(1), "shared", "B").await;
    let mut x = Person::join(c.n(2), "shared", "X").await;
    let _y = Person::join(c.n(2), "n2-only", "Y").await;
    x.sees(SETTLE, &["A", "B", "X"]).await;

    for i in 1..=2 {
        let node = c.n(i);
        healthz_says(node, &format!("cluster n{i}: connected, 1 peer")).await;
        let text = node.metrics().await;
        for name in [
            "amble_cluster_connected",
            "amble_cluster_peers",
            "amble_cluster_remote_members",
            "amble_cluster_rooms_subscribed",
            "amble_cluster_messages_published_total",
            "amble_cluster_bytes_published_total",
            "amble_cluster_messages_received_total",
            "amble_cluster_bytes_received_total",
            "amble_cluster_resyncs_total",
            "amble_cluster_remote_moves_total",
            "amble_cluster_remote_moves_late_total",
            "amble_cluster_dropped_total",
            "amble_cluster_bad_messages_total",
            "amble_cluster_nodes_lost_total",
            "amble_cluster_id_conflicts_total",
        ] {
            assert!(metric_in(&text, name).is_some(), "n{i}: no {name}");
        }
        let m = |s| metric_in(&text, s).expect("present");
        assert_eq!(m("amble_cluster_connected"), 1.0, "n{i}");
        assert_eq!(m("amble_cluster_peers"), 1.0, "n{i}");
        assert!(m("amble_cluster_messages_published_total") > 0.0, "n{i}");
        assert!(m("amble_cluster_bytes_published_total") > 0.0, "n{i}");
        assert!(m("amble_cluster_messages_received_total") > 0.0, "n{i}");
        assert!(m("amble_cluster_bytes_received_total") > 0.0, "n{i}");
        for zero in [
            "amble_cluster_dropped_total",
            "amble_cluster_bad_messages_total",
            "amble_cluster_nodes_lost_total",
            "amble_cluster_id_conflicts_total",
        ] {
            assert_eq!(m(zero), 0.0, "n{i}: {zero}");
        }
    }
    metric_is(c.n(1), "amble_cluster_remote_members", 1.0).await;
    metric_is(c.n(2), "amble_cluster_remote_members", 2.0).await;
    metric_is(c.n(1), "amble_cluster_rooms_subscribed", 1.0).await;
    metric_is(c.n(2), "amble_cluster_rooms_subscribed", 2.0).await;

    for i in 1..=2 {
        let node = c.n(i);
        poll(SETTLE, &format!("cluster-wide counts on n{i}"), || async {
            let (status, body) = node.get("/api/rooms").await;
            assert!(status.contains(" 200"), "{status}");
            let json: serde_json::Value = serde_json::from_str(&body).expect("json");
            let count = |name: &str| {
                json["rooms"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|r| r["name"] == name)
                    .and_then(|r| r["members"].as_u64())
            };
            if count("shared") == Some(3) && count("n2-only") == Some(1) {
                Ok(())
            } else {
                Err(body)
            }
        })
        .await;
    }
}

/// Without --nats amble is the single process it was: no cluster line in
/// /metrics, /healthz is `ok` alone, ids from 0.
#[tokio::test]
async fn without_nats_there_is_no_cluster_anywhere() {
    let node = Node::single(&[]).await;
    let (status, body) = node.get("/healthz").await;
    assert!(status.contains(" 200"), "{status}");
    assert_eq!(body, "ok\n");
    let text = node.metrics().await;
    let cluster: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("amble_cluster"))
        .collect();
    assert_eq!(cluster, Vec::<&str>::new(), "no cluster lines in /metrics");
    assert!(
        text.contains("amble_members"),
        "the usual metrics are there"
    );
    let a = Person::join(&node, "solo", "A").await;
    let b = Person::join(&node, "solo", "B").await;
    assert_eq!((a.id, b.id), (0, 1), "ids as before clusters");
    assert!(
        node.log().matching("cluster").is_empty(),
        "{:?}",
        node.log().lines()
    );
}

/// Two deployments on one NATS under different `--cluster-prefix`es never
/// meet, even in rooms of the same name.
#[tokio::test]
async fn deployments_with_different_prefixes_share_a_nats_without_meeting() {
    let nats = Nats::start().await;
    let blue = ["--cluster-prefix", "blue"];
    let n1 = Node::start(&nats, 1, &blue).await;
    let n2 = Node::start(&nats, 2, &blue).await;
    let n3 = Node::start(&nats, 3, &["--cluster-prefix", "green"]).await;
    has_peers(&n1, 1).await;
    has_peers(&n2, 1).await;
    let mut ada = Person::join(&n1, "lobby", "Ada").await;
    let bo = Person::join(&n2, "lobby", "Bo").await;
    let cy = Person::join(&n3, "lobby", "Cy").await;
    ada.sees(SETTLE, &["Ada", "Bo"]).await;
    assert_eq!(cy.names(), ["Cy"]);
    assert_eq!(bo.names(), ["Ada", "Bo"]);
    let by_node = nats.subscriptions_by_node("green").await;
    let green = by_node.get("n3").expect("n3 under the green prefix");
    assert!(
        green
            .iter()
            .all(|s| s.starts_with("green.") || s.starts_with("_INBOX")),
        "{green:?}"
    );
    assert_eq!(n3.metric("amble_cluster_peers").await, Some(0.0));
    assert_eq!(n3.metric("amble_cluster_remote_members").await, Some(0.0));
}

/// Issue #19: a cluster on a NATS server that requires credentials
/// (`--nats-user` and `--nats-password-file`): the nodes find each other and
/// share a room, and nats-server saw only authenticated clients.
#[tokio::test]
async fn a_cluster_runs_on_a_nats_server_that_requires_credentials() {
    let nats = Nats::start_with(&["--user", "amble", "--pass", "s3cret-for-the-test"]).await;
    let dir = tempfile::tempdir().expect("a temp dir");
    let password = dir.path().join("nats-password");
    std::fs::write(&password, "s3cret-for-the-test\n").expect("write");
    let password = password.to_str().expect("utf-8 path");
    let creds = ["--nats-user", "amble", "--nats-password-file", password];
    let n1 = Node::start(&nats, 1, &creds).await;
    let n2 = Node::start(&nats, 2, &creds).await;
    has_peers(&n1, 1).await;
    has_peers(&n2, 1).await;
    let mut ada = Person::join(&n1, "locked", "Ada").await;
    let _bo = Person::join(&n2, "locked", "Bo").await;
    ada.sees(SETTLE, &["Ada", "Bo"]).await;
    // Both connections are the authenticated user's.
    let connz = nats.monitor_json("/connz?auth=1").await;
    let users: Vec<&str> = connz["connections"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["authorized_user"].as_str())
        .collect();
    assert_eq!(users, ["amble", "amble"], "{connz}");
}

/// Issue #15, finding 8: prefixes that nest (`nest` and `nest.r`) stay
/// apart. In the first wire format a client in room `hb` under `nest` had
/// its moves published on `nest.r.hb`, the heartbeat subject of `nest.r`,
/// whose nodes then adopted the `nest` node as a peer.
#[tokio::test]
async fn nested_prefixes_stay_apart() {
    let nats = Nats::start().await;
    let n1 = Node::start(&nats, 1, &["--cluster-prefix", "nest"]).await;
    let inner = ["--cluster-prefix", "nest.r"];
    let n2 = Node::start(&nats, 2, &inner).await;
    let n3 = Node::start(&nats, 3, &inner).await;
    has_peers(&n2, 1).await;
    has_peers(&n3, 1).await;

    let mut ada = Person::join(&n1, "hb", "Ada").await;
    ada.send_move(standing(5, 5)).await;
    ada.sees_move(ada.id, standing(5, 5)).await;
    let mut bo = Person::join(&n2, "hb", "Bo").await;
    bo.send_move(standing(6, 6)).await;
    bo.sees_move(bo.id, standing(6, 6)).await;
    // Two more heartbeats from n3 reach n2 after both moves were published.
    let received = "amble_cluster_messages_received_total";
    let before = n2.metric(received).await.expect("n2 counts messages");
    metric_is_at_least(&n2, received, before + 2.0).await;

    for node in [&n2, &n3] {
        assert_eq!(
            node.metric("amble_cluster_peers").await,
            Some(1.0),
            "{}",
            node.name
        );
        assert_eq!(
            node.metric("amble_cluster_bad_messages_total").await,
            Some(0.0),
            "{}",
            node.name
        );
    }
    assert_eq!(n1.metric("amble_cluster_peers").await, Some(0.0));
    assert_eq!(ada.names(), ["Ada"]);
    assert_eq!(bo.names(), ["Bo"]);
}

/// Garbage on the subjects a node listens to is dropped and counted, and
/// the node serves on as before.
#[tokio::test]
async fn garbage_from_nats_is_dropped_and_counted() {
    let c = Cluster::start(1).await;
    let mut ada = Person::join(c.n(1), "junk", "Ada").await;
    let junk: &[u8] = &[0xff, 0xff, 0xff, 0xff, 0x0f, 0x00, 0x01];
    for subject in ["amble.v2.hb.all", "amble.v2.r.junk", "amble.v2.n.n1"] {
        c.nats.publish(subject, junk).await;
    }
    let node = c.n(1);
    metric_is(node, "amble_cluster_bad_messages_total", 3.0).await;
    ada.ping().await;
    ada.send_move(standing(5, 5)).await;
    ada.sees_move(ada.id, standing(5, 5)).await;
    assert_eq!(ada.names(), ["Ada"]);
    assert_eq!(welcome_names(node, "junk").await, ["Ada"]);
    assert_eq!(node.metric("amble_cluster_peers").await, Some(0.0));
}

/// Room capacity counts the members on every node: with room for two, a
/// third member is refused on either node.
#[tokio::test]
async fn room_capacity_counts_members_on_every_node() {
    let two = ["--room-capacity", "2"];
    let c = Cluster::start_with(&[&two, &two]).await;
    let mut ada = Person::join(c.n(1), "small", "Ada").await;
    let mut bo = Person::join(c.n(2), "small", "Bo").await;
    assert_eq!(bo.names(), ["Ada", "Bo"]);
    // Soft across nodes: n1 counts Bo once it has heard of him.
    ada.sees(SETTLE, &["Ada", "Bo"]).await;
    for i in 1..=2 {
        let mut cy = Client::connect(&c.n(i).ws_url()).await;
        cy.send(C::Join(pb::Join {
            data: Vec::new(),
            start: None,
            room: "small".into(),
            name: "Cy".into(),
            token: String::new(),
            resume_token: String::new(),
        }))
        .await;
        let text = cy.expect_error(pb::ErrorCode::RoomFull).await;
        assert!(text.contains("full"), "n{i}: {text}");
    }
    bo.ping().await;
    assert_eq!(bo.names(), ["Ada", "Bo"]);
}

/// Two live nodes on the same slot (the second claimed it while the first
/// was frozen, so it could not answer): each logs one error naming the
/// other and counts it once, however many heartbeats follow, and /healthz
/// says so.
#[tokio::test]
async fn two_live_nodes_on_one_slot_each_say_so_once() {
    let nats = Nats::start().await;
    let a = Node::start(&nats, 1, &[]).await;
    a.joined().await;
    a.freeze();
    let b = Node::start_as(&nats, "other-one", 1, &[]).await;
    assert_eq!(b.joined().await, 1, "nobody answered the claim of slot 1");
    a.thaw();
    for node in [&a, &b] {
        has_peers(node, 1).await;
        let from = node
            .metric("amble_cluster_messages_received_total")
            .await
            .unwrap_or_default();
        // Three more heartbeats heard: a second report would be there by now.
        metric_is_at_least(node, "amble_cluster_messages_received_total", from + 3.0).await;
    }
    for (node, other) in [(&a, "other-one"), (&b, "n1")] {
        let (_, lines) = node.healthz().await;
        let want = format!(
            "cluster {}: connected, 1 peer; SLOT CLASH: slot 1 is also held by {other}",
            node.name
        );
        assert_eq!(lines.get(1), Some(&want), "{}", node.name);
        assert_eq!(
            node.metric("amble_cluster_id_conflicts_total").await,
            Some(1.0),
            "{}",
            node.name
        );
        let said: Vec<String> = node
            .log()
            .matching("ERROR")
            .into_iter()
            .filter(|l| l.contains("slot") && l.contains(other))
            .collect();
        assert_eq!(said.len(), 1, "{}: {said:?}", node.name);
    }
}

/// Issue #15, finding 3: the default slot came from the name's trailing
/// number (every node on :3000 got slot 8), so two such nodes gave their
/// first joiners in a room the same id, and each hid the other's member.
/// Now the slot is claimed: two nodes started at once whose names derive
/// the same slot take different ones, and simultaneous first joins on both
/// give two members that both nodes see.
#[tokio::test]
async fn nodes_whose_names_derive_one_slot_claim_different_slots() {
    let nats = Nats::start().await;
    let (a, b) = tokio::join!(
        Node::start_unslotted(&nats, "alpha-3000", &[]),
        Node::start_unslotted(&nats, "beta-3000", &[])
    );
    assert_ne!(a.slot, b.slot, "both derive slot 3000 % 16 = 8");
    assert!(a.slot == 8 || b.slot == 8, "one keeps the derived slot");
    has_peers(&a, 1).await;
    has_peers(&b, 1).await;
    let (mut ada, mut bo) = tokio::join!(
        Person::join(&a, "split", "Ada"),
        Person::join(&b, "split", "Bo")
    );
    assert_ne!(ada.id, bo.id);
    ada.sees(SETTLE, &["Ada", "Bo"]).await;
    bo.sees(SETTLE, &["Ada", "Bo"]).await;
    for node in [&a, &b] {
        welcome_lists(node, "split", &["Ada", "Bo"], SETTLE).await;
        assert_eq!(
            node.metric("amble_cluster_id_conflicts_total").await,
            Some(0.0)
        );
    }
}

/// Issue #15, finding 3: an explicit --node-slot held by a live node was
/// used as given. Now the second process refuses to start, naming the flag
/// and the node that holds the slot.
#[tokio::test]
async fn an_explicit_node_slot_held_by_a_live_node_refuses_the_start() {
    let nats = Nats::start().await;
    let n1 = Node::start(&nats, 1, &[]).await;
    n1.joined().await;
    let url = nats.url();
    let (status, log) = Node::refused(
        "other (slot 1)",
        &["--nats", &url, "--node-name", "other", "--node-slot", "1"],
    )
    .await;
    assert!(!status.success(), "{status}: {log}");
    assert!(
        log.contains("--node-slot 1: live node n1 holds this slot"),
        "{log}"
    );
    has_peers(&n1, 0).await;
}

/// Issue #15, finding 4: a second process under a live node's name took
/// its place at every peer. Now it refuses to start, and the live node
/// says so (counted, logged, on /healthz).
#[tokio::test]
async fn a_second_process_under_a_live_nodes_name_is_refused() {
    let nats = Nats::start().await;
    let n1 = Node::start(&nats, 1, &[]).await;
    n1.joined().await;
    let url = nats.url();
    let (status, log) = Node::refused(
        "n1 again",
        &["--nats", &url, "--node-name", "n1", "--node-slot", "5"],
    )
    .await;
    assert!(!status.success(), "{status}: {log}");
    assert!(
        log.contains("--node-name n1: a live node already runs under this name"),
        "{log}"
    );
    metric_is(&n1, "amble_cluster_name_clashes_total", 1.0).await;
    let (_, lines) = n1.healthz().await;
    assert_eq!(
        lines.get(1).map(String::as_str),
        Some("cluster n1: connected, 0 peers; NAME CLASH: another process runs as n1")
    );
    assert_eq!(
        n1.log()
            .matching("ERROR")
            .iter()
            .filter(|l| l.contains("another process runs under this node's name"))
            .count(),
        1
    );
}

/// Issue #15, finding 4: one heartbeat from any NATS client, with a live
/// node's name and another epoch, made every peer retire that node for
/// good while it kept serving its clients. Now the peer ignores the forger
/// (it never claimed a slot) while the real node talks: the real node's
/// members never leave, and both sides count the clash.
#[tokio::test]
async fn a_forged_heartbeat_does_not_evict_a_live_node() {
    use amble::cluster::wire::{cpb, encode_heartbeat};
    let c = Cluster::start(2).await;
    let mut ada = Person::join(c.n(1), "forged", "Ada").await;
    let mut bo = Person::join(c.n(2), "forged", "Bo").await;
    ada.sees(SETTLE, &["Ada", "Bo"]).await;
    bo.sees(SETTLE, &["Ada", "Bo"]).await;

    let forged = encode_heartbeat(
        &cpb::Origin {
            node: "n1".into(),
            epoch: 0x00f0_0d00,
            slot: 1,
            slots: SLOTS,
        },
        cpb::Heartbeat::default(),
    );
    c.nats.publish("amble.v2.hb.all", &forged).await;

    // The forger never claimed a slot, so it is no restart of n1: n2
    // ignores it while n1 talks, and reports the clash at n1's next beat.
    metric_is(c.n(2), "amble_cluster_name_clashes_total", 1.0).await;
    metric_is(c.n(1), "amble_cluster_name_clashes_total", 1.0).await;
    bo.ping().await;
    assert!(
        !bo.about(ada.id).iter().any(|s| matches!(s, Seen::Left(..))),
        "Ada never left n2's view: {:?}",
        bo.about(ada.id)
    );
    assert_eq!(bo.names(), ["Ada", "Bo"]);
    welcome_lists(c.n(2), "forged", &["Ada", "Bo"], SETTLE).await;
    welcome_lists(c.n(1), "forged", &["Ada", "Bo"], SETTLE).await;
    // The real n1 still talks to n2: a chat gets through.
    ada.say("still n1").await;
    bo.sees_chat(ada.id, "still n1").await;
    for i in 1..=2 {
        assert_eq!(
            c.n(i)
                .log()
                .matching("ERROR")
                .iter()
                .filter(|l| l.contains("n1") && l.contains("name"))
                .count(),
            1,
            "n{i}"
        );
    }
}

// ------------------------------------------------------ one avatar, any node

/// Joins `room` as `name` on `node` through a bare client, with a resume
/// token if given; returns the client and its Welcome.
async fn join_raw(node: &Node, room: &str, name: &str, resume: &str) -> (Client, pb::Welcome) {
    let mut client = Client::connect(&node.ws_url()).await;
    client
        .send(C::Join(pb::Join {
            room: room.into(),
            name: name.into(),
            resume_token: resume.into(),
            ..Default::default()
        }))
        .await;
    let welcome = client.welcome().await;
    (client, welcome)
}

#[tokio::test]
async fn a_client_dropped_by_one_node_resumes_through_another_unseen() {
    let cluster = Cluster::start(2).await;
    let mut wa = Person::join(cluster.n(1), "lobby", "Wa").await;
    let mut wb = Person::join(cluster.n(2), "lobby", "Wb").await;
    wa.sees(FIVE_S, &["Wa", "Wb"]).await;
    wb.sees(FIVE_S, &["Wa", "Wb"]).await;
    let (ada, w) = join_raw(cluster.n(1), "lobby", "Ada", "").await;
    assert_eq!(w.resume_token.len(), 32);
    let old = w.member_id;
    wa.sees(FIVE_S, &["Ada", "Wa", "Wb"]).await;
    wb.sees(FIVE_S, &["Ada", "Wa", "Wb"]).await;

    // Her socket to n1 goes without a word; she comes back through n2.
    drop(ada);
    metric_is_at_least(cluster.n(1), "amble_resume_held", 1.0).await;
    let (_again, w2) = join_raw(cluster.n(2), "lobby", "Ada", &w.resume_token).await;
    assert!(w2.resumed, "the place is taken back through n2");
    let new = w2.member_id;
    assert_eq!(new % SLOTS, 2, "an id of n2's slot");
    let snapshot = w2.snapshot.expect("a snapshot");
    let mut names: Vec<(String, u32)> = snapshot
        .members
        .iter()
        .map(|m| (m.name.clone(), m.id))
        .collect();
    names.sort();
    assert_eq!(names.len(), 3, "{names:?}");
    assert_eq!(names[0], ("Ada".to_owned(), new), "herself once: {names:?}");

    // Both others see one Renumbered, and no Left or Joined.
    for person in [&mut wa, &mut wb] {
        person
            .take(FIVE_S, "Ada renumbered", |s| {
                (*s == Seen::Renumbered(old, new)).then_some(())
            })
            .await;
        person.ping().await;
        let churn: Vec<&Seen> = person
            .seen
            .iter()
            .map(|(_, s)| s)
            .filter(|s| {
                matches!(s, Seen::Left(id, _) if *id == old || *id == new)
                    || matches!(s, Seen::Joined(id, _) if *id == new)
            })
            .collect();
        assert!(churn.is_empty(), "{}: {churn:?}", person.name);
        assert_eq!(person.names(), ["Ada", "Wa", "Wb"]);
    }
    metric_is(
        cluster.n(2),
        "amble_resumed_total{node=\"from_other_node\"}",
        1.0,
    )
    .await;
    metric_is(
        cluster.n(1),
        "amble_resumed_total{node=\"handed_over\"}",
        1.0,
    )
    .await;
    metric_is(cluster.n(1), "amble_resume_held", 0.0).await;
    metric_is(cluster.n(1), "amble_members", 1.0).await;
}

/// SIGTERM with held places: the node closes its connections (1001), the
/// others keep its members in sight for the drain, and a client that comes
/// back through another node meanwhile takes its place (`Renumbered`, no
/// `Left`); one that does not come back leaves at the goodbye.
#[tokio::test]
async fn a_graceful_stop_lets_its_clients_fail_over_without_a_leave() {
    let c = Cluster::start_with(&[&["--cluster-node-timeout-ms", "30000"], &[]]).await;
    let mut wa = Person::join(c.n(1), "drain", "Wa").await;
    let (mut ada, w) = join_raw(c.n(2), "drain", "Ada", "").await;
    let (_cy, _) = join_raw(c.n(2), "drain", "Cy", "").await;
    wa.sees(SETTLE, &["Ada", "Cy", "Wa"]).await;
    let cy = wa.id_of("Cy");

    let stopped = Instant::now();
    c.n(2).terminate();
    assert_eq!(ada.expect_close().await, 1001);
    let (_again, w2) = join_raw(c.n(1), "drain", "Ada", &w.resume_token).await;
    assert!(w2.resumed, "Ada's place taken back through n1");
    wa.take(FIVE_S, "Ada renumbered", |s| {
        (*s == Seen::Renumbered(w.member_id, w2.member_id)).then_some(())
    })
    .await;
    let (reason, at) = wa.sees_left(cy).await;
    assert_eq!(reason, SERVER_LOST);
    assert_within(
        Duration::from_secs(3),
        stopped,
        at,
        "Cy's Left after SIGTERM",
    );
    wa.ping().await;
    assert!(
        !wa.seen.iter().any(
            |(_, s)| matches!(s, Seen::Left(id, _) if *id == w.member_id || *id == w2.member_id)
        ),
        "Ada never left: {:?}",
        wa.seen
    );
    assert_eq!(wa.names(), ["Ada", "Wa"]);
}

// ------------------------------------------------------------ spatial rooms

/// Joins `plaza` on `node` standing at `x, y`.
async fn in_plaza(node: &Node, name: &str, x: u32, y: u32) -> (Client, pb::Welcome) {
    let mut c = Client::connect(&node.ws_url()).await;
    c.send(C::Join(pb::Join {
        room: "plaza".into(),
        name: name.into(),
        start: Some(pb::Position { x, y }),
        ..Default::default()
    }))
    .await;
    let w = c.welcome().await;
    (c, w)
}

/// A spatial room (issue 17) spans nodes like any room: a member on n1
/// hears of n2's members only within its view (the Welcome's snapshot,
/// chat), while the room's count is everyone's; a member of n2 walking into
/// its view appears, with its name and where it stands.
#[tokio::test]
async fn a_spatial_room_spans_nodes_and_each_member_hears_its_view() {
    let c = Cluster::start(2).await;
    let (mut cy, _) = in_plaza(c.n(2), "Cy", 10_500, 10_000).await;
    let (mut dee, wd) = in_plaza(c.n(2), "Dee", 40_000, 40_000).await;
    let (mut ada, wa) = in_plaza(c.n(1), "Ada", 10_000, 10_000).await;
    let mut seen: Vec<String> = wa
        .snapshot
        .expect("a snapshot")
        .members
        .iter()
        .map(|m| m.name.clone())
        .collect();
    seen.sort();
    assert_eq!(seen, ["Ada", "Cy"], "the view only");
    assert_eq!(wa.population, 3, "the whole room's count");

    // Dee (far) speaks first, then Cy (near): Ada hears Cy only.
    dee.send(C::Chat(pb::SendChat { text: "far".into() })).await;
    cy.send(C::Chat(pb::SendChat {
        text: "near".into(),
    }))
    .await;
    let heard = ada
        .until(|m| match &m.body {
            Some(S::Chat(chat)) => Some(chat.text.clone()),
            _ => None,
        })
        .await;
    assert_eq!(heard, "near");

    // Dee walks up to Ada: she appears there, named.
    dee.send(move_body(
        Motion::standing(Position {
            x: 10_200,
            y: 10_300,
        }),
        1,
        0,
    ))
    .await;
    let appeared = ada
        .until(|m| match &m.body {
            Some(S::Appeared(a)) => a.members.iter().find(|m| m.id == wd.member_id).cloned(),
            _ => None,
        })
        .await;
    assert_eq!(appeared.name, "Dee");
    assert_eq!(
        appeared.position,
        Some(pb::Position {
            x: 10_200,
            y: 10_300
        })
    );
}
