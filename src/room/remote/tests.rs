//! Remote members in a room, without NATS: a detached cluster handle whose
//! outgoing queue the test reads, updates applied as the link would, and
//! in-memory sinks.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use prost::Message as _;
use tokio::sync::mpsc;

use super::sequence::{MAX_BUFFERED, MAX_BUFFERED_BYTES};
use super::*;
use crate::clock::Clock;
use crate::cluster::wire::{Op, Origin, RemoteMember, RoomOrigin, cpb};
use crate::metrics::Metrics;
use crate::protocol::pb::server_message::Body;
use crate::protocol::pb::{self, ServerMessage};
use crate::protocol::{Data, Motion, Position, decode_motion};
use crate::room::sink::{Frame, Sink};
use crate::room::{Member, Membership, RoomSettings};

#[derive(Default)]
struct Frames(Mutex<Vec<Frame>>, Mutex<Vec<&'static str>>);

impl Frames {
    fn take(&self) -> Vec<ServerMessage> {
        std::mem::take(&mut *self.0.lock().expect("frames"))
            .into_iter()
            .map(|f| ServerMessage::decode(f).expect("a valid frame"))
            .collect()
    }
}

impl Frames {
    /// How the room ended this sink's membership, if it did.
    fn ends(&self) -> Vec<&'static str> {
        self.1.lock().expect("ends").clone()
    }
}

impl Sink for Frames {
    fn send(&self, frame: &Frame) {
        self.0.lock().expect("frames").push(frame.clone());
    }
    fn send_snapshot(&self, frame: Frame) {
        self.0.lock().expect("frames").push(frame);
    }
    fn removed(&self, removal: crate::room::sink::Removal) {
        let how = match removal {
            crate::room::sink::Removal::Replaced => "replaced",
            _ => "removed",
        };
        self.1.lock().expect("ends").push(how);
    }
    fn superseded(&self) {
        self.1.lock().expect("ends").push("superseded");
    }
}

struct Node {
    rooms: Arc<Rooms>,
    out: mpsc::Receiver<(Subject, Bytes)>,
}

impl Node {
    /// Node `name` in `slot` of 16, tick 100 ms.
    fn new(name: &str, slot: u32) -> Self {
        Self::with(Cluster::test_settings(name, slot))
    }

    fn with(settings: crate::cluster::ClusterSettings) -> Self {
        Self::holding(settings, Duration::ZERO)
    }

    /// A node that holds a dropped member's place for `grace`.
    fn holding(settings: crate::cluster::ClusterSettings, grace: Duration) -> Self {
        Self::build(settings, grace, None)
    }

    fn build(
        settings: crate::cluster::ClusterSettings,
        grace: Duration,
        spatial: Option<crate::room::spatial::SpatialSettings>,
    ) -> Self {
        let metrics = Arc::new(Metrics::default());
        metrics.enable_cluster();
        let rooms = Rooms::new(
            RoomSettings {
                tick: Duration::from_millis(100),
                tick_workers: 1,
                motion_time_unit_ms: 100,
                capacity: 4,
                spawn: Position { x: 10, y: 10 },
                world: Position { x: 5_000, y: 5_000 },
                limits: pb::Limits::default(),
                resume_grace: grace,
                max_held: 100,
                spatial,
            },
            Clock::start(),
            Arc::clone(&metrics),
        );
        let (cluster, out) = Cluster::detached(settings, metrics);
        rooms.attach_cluster(cluster);
        Self { rooms, out }
    }

    async fn join(&self, room: &str, name: &str) -> (Membership, Arc<Frames>) {
        let frames = Arc::new(Frames::default());
        let sink: Arc<dyn Sink> = frames.clone();
        let m = self
            .rooms
            .join(room, name.into(), sink)
            .await
            .expect("joins");
        (m, frames)
    }

    /// What this node published, decoded as room updates (subject, update).
    fn published(&mut self) -> Vec<(String, cpb::RoomUpdate)> {
        let mut all = Vec::new();
        while let Ok((subject, bytes)) = self.out.try_recv() {
            if let Ok(cpb::ClusterMessage {
                body: Some(cpb::cluster_message::Body::Update(u)),
            }) = cpb::ClusterMessage::decode(bytes)
            {
                all.push((subject.to_string(), u));
            }
        }
        all
    }

    /// What this node published, decoded as the link decodes what it
    /// receives (subject, update).
    fn sent(&mut self) -> Vec<(String, Update)> {
        let mut all = Vec::new();
        while let Ok((subject, bytes)) = self.out.try_recv() {
            let rules = crate::protocol::Rules::default();
            let u = wire::decode_update(&bytes, 16, &rules).expect("a valid update");
            all.push((subject.to_string(), u));
        }
        all
    }

    /// The names in `room`, in id order.
    fn names(&self, room: &str) -> Vec<String> {
        let handle = self.rooms.map.get(room).map(|r| Arc::clone(r.value()));
        let handle = handle.expect("the room is open");
        let st = handle.state();
        let mut names: Vec<String> = st.members.values().map(|m| m.name.to_string()).collect();
        names.sort();
        names
    }

    /// Subjects published to.
    fn subjects(&mut self) -> Vec<String> {
        let mut all = Vec::new();
        while let Ok((subject, _)) = self.out.try_recv() {
            all.push(subject.to_string());
        }
        all
    }

    /// Applies `u` as the link would: its origin heard first.
    fn apply(&self, room: &str, u: Update) {
        if let Some(cluster) = self.rooms.cluster() {
            cluster.hear(&u.origin);
        }
        RoomSide::apply(&*self.rooms, room, u);
    }

    fn metrics(&self) -> &Metrics {
        &self.rooms.metrics
    }
}

fn origin(node: &str, epoch: u64, slot: u32) -> Origin {
    Origin {
        node: Arc::from(node),
        epoch,
        slot,
        slots: 16,
    }
}

/// Member `id`, in seat `id` on its node (the same id, the same member).
fn member(id: u32, name: &str, x: u32) -> RemoteMember {
    RemoteMember {
        id: MemberId(id),
        seat: u64::from(id),
        name: name.into(),
        motion: Motion::standing(Position { x, y: 0 }),
        moved_at_ms: 1,
        data: Data::default(),
        user: None,
        sub: None,
        resume_hash: None,
        replaces: None,
    }
}

/// An update of `from`'s first opening of the room.
fn update(from: &Origin, seq: u64, ops: Vec<Op>) -> Update {
    Update {
        origin: RoomOrigin {
            origin: from.clone(),
            incarnation: 1,
        },
        seq,
        full: false,
        tick_ms: 0,
        ops,
        motion: Vec::new(),
        closed: false,
    }
}

fn full(from: &Origin, seq: u64, members: Vec<RemoteMember>) -> Update {
    Update {
        full: true,
        ops: members.into_iter().map(Op::Joined).collect(),
        ..update(from, seq, Vec::new())
    }
}

fn moves(from: &Origin, seq: u64, tick_ms: u64, records: &[(u32, u32)]) -> Update {
    Update {
        tick_ms,
        motion: records
            .iter()
            .map(|&(id, x)| MotionRecord {
                member: MemberId(id),
                motion: Motion::standing(Position { x, y: 0 }),
            })
            .collect(),
        ..update(from, seq, Vec::new())
    }
}

/// `u` from `from`'s opening `incarnation` of the room.
fn opening(incarnation: u64, mut u: Update) -> Update {
    u.origin.incarnation = incarnation;
    u
}

fn bodies(frames: Vec<ServerMessage>) -> Vec<Body> {
    frames.into_iter().filter_map(|f| f.body).collect()
}

#[tokio::test]
async fn local_ids_take_the_nodes_slot_and_joins_leaves_and_chat_are_published_in_order() {
    let mut node = Node::new("n1", 1);
    let (ada, _) = node.join("lobby", "Ada").await;
    let (bo, _) = node.join("lobby", "Bo").await;
    assert_eq!((ada.id(), bo.id()), (MemberId(1), MemberId(17)));
    ada.chat("hi".into()).await;
    ada.leave(LeaveReason::Left).await;
    let published = node.published();
    let subjects: Vec<&str> = published.iter().map(|(s, _)| s.as_str()).collect();
    assert_eq!(subjects, ["amble.v2.r.lobby"; 4]);
    let seqs: Vec<u64> = published.iter().map(|(_, u)| u.seq).collect();
    assert_eq!(seqs, [1, 2, 3, 4]);
    let kinds: Vec<&str> = published
        .iter()
        .map(|(_, u)| match u.ops[0].op {
            Some(cpb::op::Op::Joined(_)) => "joined",
            Some(cpb::op::Op::Left(_)) => "left",
            Some(cpb::op::Op::Chat(_)) => "chat",
            Some(cpb::op::Op::Data(_)) => "data",
            Some(cpb::op::Op::NewToken(_)) => "new token",
            None => "none",
        })
        .collect();
    assert_eq!(kinds, ["joined", "joined", "chat", "left"]);
    assert!(
        published
            .iter()
            .all(|(_, u)| u.origin.as_ref().is_some_and(|o| o.node == "n1"))
    );
}

#[tokio::test]
async fn remote_members_join_chat_move_and_leave_like_local_ones() {
    let node = Node::new("n1", 1);
    let (_ada, ada) = node.join("lobby", "Ada").await;
    ada.take();
    let n2 = origin("n2", 7, 2);
    node.apply("lobby", full(&n2, 0, vec![]));
    node.apply(
        "lobby",
        update(&n2, 1, vec![Op::Joined(member(2, "Cy", 40))]),
    );
    node.apply(
        "lobby",
        update(
            &n2,
            2,
            vec![Op::Chat {
                id: MemberId(2),
                text: "yo".into(),
                server_time_ms: 5,
            }],
        ),
    );
    match &bodies(ada.take())[..] {
        [Body::Joined(j), Body::Chat(c)] => {
            let m = j.member.as_ref().expect("member");
            assert_eq!((m.id, m.name.as_str()), (2, "Cy"));
            assert_eq!((c.member_id, c.text.as_str()), (2, "yo"));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(node.metrics().cluster_remote_members.get(), 1);

    // A late joiner's Welcome lists the remote member.
    let (_bo, bo) = node.join("lobby", "Bo").await;
    match &bodies(bo.take())[..] {
        [Body::Welcome(w)] => {
            let ids: Vec<u32> = w
                .snapshot
                .as_ref()
                .expect("snapshot")
                .members
                .iter()
                .map(|m| m.id)
                .collect();
            assert_eq!(ids, [1, 2, 17]);
        }
        other => panic!("{other:?}"),
    }
    ada.take();

    node.apply(
        "lobby",
        update(
            &n2,
            3,
            vec![Op::Left {
                id: MemberId(2),
                reason: LeaveReason::Left,
                handed_over: false,
            }],
        ),
    );
    match &bodies(ada.take())[..] {
        [Body::Left(l)] => assert_eq!((l.member_id, l.reason), (2, LeaveReason::Left as i32)),
        other => panic!("{other:?}"),
    }
    assert_eq!(node.metrics().cluster_remote_members.get(), 0);
}

#[tokio::test]
async fn one_frame_per_tick_carries_the_cut_local_moves_and_the_remote_ones() {
    let mut node = Node::new("n1", 1);
    let (ada, ada_frames) = node.join("lobby", "Ada").await;
    let n2 = origin("n2", 7, 2);
    node.apply("lobby", full(&n2, 3, vec![member(2, "Cy", 40)]));
    node.published();
    ada_frames.take();

    ada.submit(Motion::standing(Position { x: 100, y: 0 }))
        .await;
    let room = node.rooms.handle("lobby");
    // Cut before the tick at 1_000: published at once, held for the batch.
    node.rooms.cut(&room, 1_000);
    let published = node.published();
    assert_eq!(published.len(), 1);
    let (_, u) = &published[0];
    assert_eq!(
        (u.tick_ms, u.motion.as_slice()),
        (1_000, [2, 100, 0].as_slice())
    );
    // A remote move for the same tick arrives before it.
    node.apply("lobby", moves(&n2, 4, 1_000, &[(2, 300)]));
    // A local move after the cut waits for the next cut.
    ada.submit(Motion::standing(Position { x: 200, y: 0 }))
        .await;
    node.rooms.tick(1_000).await;
    let frames = ada_frames.take();
    assert_eq!(frames.len(), 1, "one frame for the tick");
    let (_, records) = decode_motion(&frames[0].motion).expect("a batch");
    let got: Vec<(u32, u32)> = records
        .iter()
        .map(|r| (r.member.0, r.motion.position.x))
        .collect();
    assert_eq!(got, [(1, 100), (2, 300)]);
    assert_eq!(node.metrics().cluster_remote_moves.get(), 1);
    assert_eq!(node.metrics().cluster_remote_moves_late.get(), 0);

    // A remote move cut for a tick this node already wrote is late.
    node.apply("lobby", moves(&n2, 5, 1_000, &[(2, 350)]));
    assert_eq!(node.metrics().cluster_remote_moves_late.get(), 1);
    node.rooms.cut(&room, 1_100);
    node.rooms.tick(1_100).await;
    let frames = ada_frames.take();
    let (_, records) = decode_motion(&frames[0].motion).expect("a batch");
    let got: Vec<(u32, u32)> = records
        .iter()
        .map(|r| (r.member.0, r.motion.position.x))
        .collect();
    assert_eq!(got, [(1, 200), (2, 350)]);
}

#[tokio::test]
async fn a_gap_asks_the_origin_for_a_full_state_and_the_full_state_repairs() {
    let mut node = Node::new("n1", 1);
    let (_ada, ada) = node.join("lobby", "Ada").await;
    let n2 = origin("n2", 7, 2);
    node.apply("lobby", full(&n2, 1, vec![member(2, "Cy", 40)]));
    node.subjects();
    ada.take();
    let resyncs = node.metrics().cluster_resyncs.get();
    // Seq 2 (Dee joined) is lost; seq 3 is held and a full state asked for.
    node.apply(
        "lobby",
        update(
            &n2,
            3,
            vec![Op::Left {
                id: MemberId(2),
                reason: LeaveReason::Left,
                handed_over: false,
            }],
        ),
    );
    assert!(bodies(ada.take()).is_empty());
    assert_eq!(node.subjects(), ["amble.v2.n.n2"]);
    // Asked once a second at most.
    node.apply("lobby", moves(&n2, 4, 0, &[(18, 5)]));
    assert!(node.subjects().is_empty());
    // The full state (as of seq 3): Dee only. Cy leaves, Dee joins.
    node.apply("lobby", full(&n2, 3, vec![member(18, "Dee", 1)]));
    let got = bodies(ada.take());
    assert!(
        matches!(&got[..], [Body::Left(l), Body::Joined(j)]
        if l.member_id == 2 && j.member.as_ref().is_some_and(|m| m.id == 18)),
        "{got:?}"
    );
    assert_eq!(node.metrics().cluster_resyncs.get(), resyncs + 1);
    // The held seq 4 was applied after it: seq 5 follows without a gap.
    node.apply(
        "lobby",
        update(
            &n2,
            5,
            vec![Op::Left {
                id: MemberId(18),
                reason: LeaveReason::Left,
                handed_over: false,
            }],
        ),
    );
    assert!(matches!(&bodies(ada.take())[..], [Body::Left(l)] if l.member_id == 18));
    assert!(node.subjects().is_empty());
    // Old duplicates are ignored.
    node.apply(
        "lobby",
        update(&n2, 5, vec![Op::Joined(member(34, "Eve", 1))]),
    );
    assert!(bodies(ada.take()).is_empty());
}

#[tokio::test]
async fn a_new_epoch_or_a_lost_node_removes_its_members_with_server_lost() {
    let node = Node::new("n1", 1);
    let (_ada, ada) = node.join("lobby", "Ada").await;
    let old = origin("n2", 7, 2);
    node.apply(
        "lobby",
        full(&old, 1, vec![member(2, "Cy", 40), member(18, "Dee", 1)]),
    );
    ada.take();
    // n2 restarted: its first message removes the previous run's members.
    let new = origin("n2", 8, 2);
    node.apply(
        "lobby",
        update(&new, 1, vec![Op::Joined(member(2, "Cy2", 40))]),
    );
    let got = bodies(ada.take());
    let lost: Vec<u32> = got
        .iter()
        .filter_map(|b| match b {
            Body::Left(l) if l.reason == LeaveReason::ServerLost as i32 => Some(l.member_id),
            _ => None,
        })
        .collect();
    assert_eq!(lost, [2, 18]);
    assert_eq!(node.metrics().cluster_remote_members.get(), 1, "Cy2");
    // Its first update of a new opening is applied as it is (the part
    // was empty before it); then the node is lost.
    assert!(got.iter().any(
        |b| matches!(b, Body::Joined(j) if j.member.as_ref().is_some_and(|m| m.name == "Cy2"))
    ));
    RoomSide::drop_node(&*node.rooms, "n2", 7);
    assert!(
        bodies(ada.take()).is_empty(),
        "an old epoch's loss removes nothing now"
    );
    RoomSide::drop_node(&*node.rooms, "n2", 8);
    assert!(matches!(&bodies(ada.take())[..], [Body::Left(l)]
        if l.member_id == 2 && l.reason == LeaveReason::ServerLost as i32));
    assert_eq!(node.metrics().cluster_remote_members.get(), 0);
}

#[tokio::test]
async fn a_remote_join_on_a_taken_id_is_dropped_and_counted() {
    let node = Node::new("n1", 1);
    let (_ada, ada) = node.join("lobby", "Ada").await;
    // n3 wrongly shares n1's slot: its member 1 clashes with Ada.
    let n3 = origin("n3", 5, 1);
    node.apply("lobby", full(&n3, 1, vec![member(1, "Imp", 1)]));
    ada.take();
    assert_eq!(node.metrics().cluster_id_conflicts.get(), 1);
    assert_eq!(node.rooms.handle("lobby").state().members.len(), 1);
}

#[tokio::test]
async fn capacity_counts_remote_members() {
    let node = Node::new("n1", 1);
    let n2 = origin("n2", 7, 2);
    let (_ada, _) = node.join("lobby", "Ada").await;
    node.apply(
        "lobby",
        full(
            &n2,
            1,
            vec![member(2, "a", 1), member(18, "b", 1), member(34, "c", 1)],
        ),
    );
    let sink: Arc<dyn Sink> = Arc::new(Frames::default());
    let err = node.rooms.join("lobby", "Bo".into(), sink).await.err();
    assert!(
        matches!(err, Some(crate::room::JoinError::RoomFull { .. })),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_room_refused_as_full_does_not_stay_open_on_a_node_with_nobody_there() {
    let mut node = Node::new("n1", 1);
    // The room opened here and filled with other nodes' members only.
    let room = node.rooms.handle("lobby");
    room.opened.set(()).expect("not opened yet");
    let n2 = origin("n2", 7, 2);
    let four = (0..4).map(|i| member(2 + 16 * i, "x", 1)).collect();
    node.apply("lobby", full(&n2, 1, four));
    let sink: Arc<dyn Sink> = Arc::new(Frames::default());
    let err = node.rooms.join("lobby", "Bo".into(), sink).await.err();
    assert!(
        matches!(err, Some(crate::room::JoinError::RoomFull { .. })),
        "{err:?}"
    );
    // The test settings linger 0 ms: closed at once.
    assert!(node.published().last().is_some_and(|(_, u)| u.closed));
    assert_eq!(node.metrics().rooms.get(), 0);
    assert_eq!(node.metrics().cluster_remote_members.get(), 0);
}

#[tokio::test]
async fn the_last_local_member_leaving_closes_the_room_after_the_linger() {
    let mut node = Node::new("n1", 1);
    let n2 = origin("n2", 7, 2);
    let (ada, _) = node.join("lobby", "Ada").await;
    node.apply("lobby", full(&n2, 1, vec![member(2, "Cy", 40)]));
    assert_eq!(
        RoomSide::local_counts(&*node.rooms),
        [("lobby".to_owned(), 1)]
    );
    node.published();
    ada.leave(LeaveReason::Left).await;
    // The test settings linger 0 ms: closed at once.
    let published = node.published();
    assert!(
        published.last().is_some_and(|(_, u)| u.closed),
        "{published:?}"
    );
    assert!(node.rooms.list().is_empty());
    assert!(RoomSide::open_rooms(&*node.rooms).is_empty());
    assert_eq!(node.metrics().cluster_remote_members.get(), 0);
    assert_eq!(node.metrics().rooms.get(), 0);
    // Updates for a room no longer open here are ignored.
    node.apply(
        "lobby",
        update(&n2, 2, vec![Op::Joined(member(18, "Dee", 1))]),
    );
    assert!(node.rooms.list().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_room_lingers_and_a_join_meanwhile_keeps_it() {
    let mut settings = Cluster::test_settings("n1", 1);
    settings.linger = Duration::from_millis(1_000);
    let mut node = Node::with(settings);
    let (ada, _) = node.join("lobby", "Ada").await;
    ada.leave(LeaveReason::Left).await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    // Back within the linger: the same room, no reopening.
    let (bo, _) = node.join("lobby", "Bo").await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(node.rooms.list().len(), 1, "the first linger did nothing");
    assert!(!node.published().iter().any(|(_, u)| u.closed));
    bo.leave(LeaveReason::Left).await;
    tokio::time::sleep(Duration::from_millis(999)).await;
    assert_eq!(node.metrics().rooms.get(), 1, "still lingering");
    tokio::time::sleep(Duration::from_millis(2)).await;
    assert_eq!(node.metrics().rooms.get(), 0);
    assert!(node.published().last().is_some_and(|(_, u)| u.closed));
}

/// Issue #15, finding 1: a node asked for its part of a room it no longer
/// holds answered nothing, so a peer that missed the room's `closed` (a
/// NATS outage shorter than the node timeout) kept its members for good.
/// It now answers "nobody here", and the peer's view converges.
#[tokio::test]
async fn a_node_asked_for_a_room_it_does_not_hold_answers_nobody_here() {
    let mut n1 = Node::new("n1", 1);
    let mut n2 = Node::new("n2", 2);
    let (_bo, bo_frames) = n2.join("lobby", "Bo").await;
    n2.published();
    // A room n1 never held: closed, as n1's last opening (none yet: 0).
    assert!(RoomSide::publish_full(&*n1.rooms, "elsewhere", None));
    let sent = n1.sent();
    let [(subject, u)] = &sent[..] else {
        panic!("{sent:?}")
    };
    assert_eq!(subject, "amble.v2.r.elsewhere");
    assert_eq!(
        (u.full, u.closed, u.origin.incarnation, u.ops.len()),
        (true, true, 0, 0)
    );

    // Ada joins lobby on n1; n2 hears it.
    let (ada, _) = n1.join("lobby", "Ada").await;
    for (_, u) in n1.sent() {
        n2.apply("lobby", u);
    }
    assert_eq!(n2.names("lobby"), ["Ada", "Bo"]);
    bo_frames.take();
    // She leaves and the room closes on n1 (linger 0), but n2 never hears
    // of it: the updates are lost.
    ada.leave(LeaveReason::Left).await;
    let lost = n1.sent();
    assert!(lost.last().is_some_and(|(_, u)| u.closed), "{lost:?}");
    assert_eq!(n2.names("lobby"), ["Ada", "Bo"], "the ghost");

    // n2 asks n1 for its part (a SyncRequest after the reconnect).
    assert!(RoomSide::publish_full(&*n1.rooms, "lobby", None));
    let answer = n1.sent();
    let [(subject, u)] = &answer[..] else {
        panic!("{answer:?}")
    };
    assert_eq!(subject, "amble.v2.r.lobby");
    assert_eq!((u.full, u.closed, u.origin.incarnation), (true, true, 1));
    n2.apply("lobby", u.clone());
    assert_eq!(n2.names("lobby"), ["Bo"]);
    let left: Vec<_> = bodies(bo_frames.take())
        .into_iter()
        .filter(|b| matches!(b, Body::Left(_)))
        .collect();
    assert_eq!(left.len(), 1, "Ada's Left, once: {left:?}");

    // n1 opens lobby again: the new opening is numbered above the answer,
    // so the answer arriving late removes nobody.
    let (_cy, _) = n1.join("lobby", "Cy").await;
    for (_, u) in n1.sent() {
        n2.apply("lobby", u);
    }
    assert_eq!(n2.names("lobby"), ["Bo", "Cy"]);
    n2.apply("lobby", u.clone());
    assert_eq!(
        n2.names("lobby"),
        ["Bo", "Cy"],
        "a late answer changes nothing"
    );
}

/// Issue #15, finding 2: a full state reconciled by id only, so a reused
/// id kept the old member's name, and its new member's chat showed under
/// it. A member is its id and its seat: another seat is a Left and a
/// Joined for every client.
#[tokio::test]
async fn a_reused_id_in_a_full_state_is_a_left_and_a_joined() {
    let node = Node::new("n1", 1);
    let n2 = origin("n2", 7, 2);
    let (_ada, frames) = node.join("lobby", "Ada").await;
    node.apply("lobby", full(&n2, 1, vec![member(2, "Cy", 40)]));
    frames.take();
    // Cy left and Dee joined with Cy's id while this node heard neither
    // (a gap, then a full state).
    let dee = RemoteMember {
        seat: 99,
        ..member(2, "Dee", 40)
    };
    node.apply("lobby", full(&n2, 5, vec![dee]));
    let seen = bodies(frames.take());
    assert!(
        matches!(
            &seen[..],
            [Body::Left(l), Body::Joined(j)]
                if l.member_id == 2
                    && j.member.as_ref().is_some_and(|m| m.id == 2 && m.name == "Dee")
        ),
        "{seen:?}"
    );
    // Dee's chat shows as Dee's.
    node.apply(
        "lobby",
        update(
            &n2,
            6,
            vec![Op::Chat {
                id: MemberId(2),
                text: "hi".into(),
                server_time_ms: 1,
            }],
        ),
    );
    let handle = node.rooms.map.get("lobby").map(|r| Arc::clone(r.value()));
    let handle = handle.expect("open");
    assert_eq!(&*handle.state().members[&MemberId(2)].name, "Dee");
    // The same seat again: the same member, nothing to tell.
    node.apply(
        "lobby",
        full(
            &n2,
            7,
            vec![RemoteMember {
                seat: 99,
                ..member(2, "Dee", 40)
            }],
        ),
    );
    assert!(
        bodies(frames.take())
            .iter()
            .all(|b| matches!(b, Body::Chat(_)))
    );
}

#[tokio::test]
async fn a_full_state_answers_with_the_local_members_only() {
    let mut node = Node::new("n1", 1);
    let n2 = origin("n2", 7, 2);
    let (_ada, _) = node.join("lobby", "Ada").await;
    node.apply("lobby", full(&n2, 1, vec![member(2, "Cy", 40)]));
    node.published();
    assert!(RoomSide::publish_full(&*node.rooms, "lobby", None));
    let published = node.published();
    let [(subject, u)] = &published[..] else {
        panic!("{published:?}")
    };
    assert_eq!(subject, "amble.v2.r.lobby");
    assert!(u.full);
    assert_eq!(u.seq, 1, "the seq of the last delta (Ada's join)");
    let ids: Vec<u32> = u
        .ops
        .iter()
        .filter_map(|o| match &o.op {
            Some(cpb::op::Op::Joined(m)) => Some(m.id),
            _ => None,
        })
        .collect();
    assert_eq!(ids, [1]);
}

#[test]
fn ids_in_a_slot_are_lowest_free_first() {
    let mut members = BTreeMap::new();
    let m = || Member {
        seat: 0,
        user: None,
        share_user: false,
        name: "".into(),
        data: Data::default(),
        motion: Motion::standing(Position { x: 0, y: 0 }),
        moved_at_ms: 0,
        pending: None,
        origin: None,
        joined_at_s: 0,
    };
    assert_eq!(lowest_free_in_slot(&members, 3, 16), MemberId(3));
    members.insert(MemberId(3), m());
    members.insert(MemberId(19), m());
    // Another node's member on an id of this slot (a clash) is skipped too.
    members.insert(MemberId(35), m());
    assert_eq!(lowest_free_in_slot(&members, 3, 16), MemberId(51));
    members.remove(&MemberId(19));
    assert_eq!(lowest_free_in_slot(&members, 3, 16), MemberId(19));
}

#[tokio::test]
async fn a_node_cannot_put_more_than_a_room_holds_into_it() {
    let node = Node::new("n1", 1);
    let (_ada, _) = node.join("lobby", "Ada").await;
    let n2 = origin("n2", 7, 2);
    let five = (0..5).map(|i| member(2 + 16 * i, "x", 1)).collect();
    node.apply("lobby", full(&n2, 1, five));
    // Capacity 4: four of n2's members are taken, the fifth is refused.
    assert_eq!(node.metrics().cluster_remote_members.get(), 4);
    assert_eq!(node.metrics().cluster_bad_messages.get(), 1);
}

/// The motion records of the frames (batches only).
fn motion_records(frames: Vec<ServerMessage>) -> Vec<(u32, u32)> {
    frames
        .iter()
        .filter(|f| !f.motion.is_empty())
        .flat_map(|f| decode_motion(&f.motion).expect("a batch").1)
        .map(|r| (r.member.0, r.motion.position.x))
        .collect()
}

#[tokio::test]
async fn a_cut_move_does_not_outlive_its_members_leave_or_replacement() {
    let node = Node::new("n1", 1);
    let (_viewer, viewer) = node.join("lobby", "Viewer").await;
    let room = node.rooms.handle("lobby");
    let moved = Motion::standing(Position { x: 900, y: 0 });

    // Ada (id 17) moves, the move is cut, then she leaves before the tick;
    // Bo joins and reuses her id.
    let (ada, _) = node.join("lobby", "Ada").await;
    assert_eq!(ada.id(), MemberId(17));
    ada.submit(moved).await;
    node.rooms.cut(&room, 1_000);
    ada.leave(LeaveReason::Left).await;
    let (bo, _) = node.join("lobby", "Bo").await;
    assert_eq!(bo.id(), MemberId(17));
    viewer.take();
    node.rooms.tick(1_000).await;
    assert!(motion_records(viewer.take()).is_empty());
    let spawn = room.state().members[&MemberId(17)].motion;
    assert_ne!(spawn, moved, "Bo stands where he joined");

    // A user's member moves, is cut, and is replaced by the same user's
    // new connection (same id) before the tick.
    let user: Option<Arc<str>> = Some(Arc::from("u"));
    let join_as = |name: &str| {
        let sink: Arc<dyn Sink> = Arc::new(Frames::default());
        node.rooms.join_as("lobby", name.into(), user.clone(), sink)
    };
    let first = join_as("Cy").await.expect("joins");
    first.submit(moved).await;
    node.rooms.cut(&room, 1_100);
    let second = join_as("Cy again").await.expect("joins");
    assert_eq!(second.id(), first.id());
    viewer.take();
    node.rooms.tick(1_100).await;
    assert!(motion_records(viewer.take()).is_empty());
    assert_ne!(room.state().members[&second.id()].motion, moved);
}

#[tokio::test]
async fn a_reopened_room_replaces_the_part_without_a_round_trip() {
    let mut node = Node::new("n1", 1);
    let (_ada, ada) = node.join("lobby", "Ada").await;
    let n2 = origin("n2", 7, 2);
    node.apply("lobby", full(&n2, 2, vec![member(2, "Cy", 40)]));
    node.subjects();
    ada.take();
    // n2 closed the room (its `closed` was lost) and opened it again: the
    // new opening's first update replaces the part, with no full state.
    node.apply(
        "lobby",
        opening(2, update(&n2, 1, vec![Op::Joined(member(18, "Dee", 1))])),
    );
    let got = bodies(ada.take());
    assert!(
        matches!(&got[..], [Body::Left(l), Body::Joined(j)]
        if l.member_id == 2 && j.member.as_ref().is_some_and(|m| m.id == 18)),
        "{got:?}"
    );
    assert!(node.subjects().is_empty(), "no SyncRequest");
    node.apply(
        "lobby",
        opening(2, update(&n2, 2, vec![Op::Joined(member(34, "Eve", 1))])),
    );
    assert!(matches!(&bodies(ada.take())[..], [Body::Joined(_)]));
    // The earlier opening's messages are stale now, fulls and closed too.
    node.apply(
        "lobby",
        update(&n2, 3, vec![Op::Joined(member(50, "Old", 1))]),
    );
    node.apply("lobby", full(&n2, 3, vec![member(2, "Cy", 40)]));
    node.apply(
        "lobby",
        Update {
            closed: true,
            ..update(&n2, 4, vec![])
        },
    );
    assert!(bodies(ada.take()).is_empty());
    assert!(node.subjects().is_empty());
    assert_eq!(node.metrics().cluster_remote_members.get(), 2);
}

#[tokio::test]
async fn a_new_opening_whose_first_update_was_lost_asks_for_a_full_state() {
    let mut node = Node::new("n1", 1);
    let (_ada, ada) = node.join("lobby", "Ada").await;
    let n2 = origin("n2", 7, 2);
    node.apply("lobby", full(&n2, 2, vec![member(2, "Cy", 40)]));
    node.subjects();
    ada.take();
    // Seq 1 of the new opening is lost: seq 2 cannot be applied on an
    // empty part, so the node is asked.
    node.apply(
        "lobby",
        opening(2, update(&n2, 2, vec![Op::Joined(member(34, "Eve", 1))])),
    );
    assert!(matches!(&bodies(ada.take())[..], [Body::Left(l)] if l.member_id == 2));
    assert_eq!(node.subjects(), ["amble.v2.n.n2"]);
    node.apply(
        "lobby",
        opening(
            2,
            full(&n2, 2, vec![member(18, "Dee", 1), member(34, "Eve", 1)]),
        ),
    );
    assert_eq!(bodies(ada.take()).len(), 2, "Dee and Eve join");
}

#[tokio::test]
async fn an_older_full_state_does_not_rewind_the_part() {
    let mut node = Node::new("n1", 1);
    let (_ada, ada) = node.join("lobby", "Ada").await;
    let n2 = origin("n2", 7, 2);
    node.apply("lobby", full(&n2, 1, vec![member(2, "Cy", 40)]));
    node.apply(
        "lobby",
        update(
            &n2,
            2,
            vec![Op::Left {
                id: MemberId(2),
                reason: LeaveReason::Left,
                handed_over: false,
            }],
        ),
    );
    node.subjects();
    ada.take();
    // A full state as of seq 1 arrives late (an answer overtaken by the
    // room's own traffic): Cy must not come back.
    node.apply("lobby", full(&n2, 1, vec![member(2, "Cy", 40)]));
    assert!(bodies(ada.take()).is_empty());
    assert_eq!(node.metrics().cluster_remote_members.get(), 0);
    // The next delta still follows on.
    node.apply(
        "lobby",
        update(&n2, 3, vec![Op::Joined(member(18, "Dee", 1))]),
    );
    assert!(matches!(&bodies(ada.take())[..], [Body::Joined(_)]));
    assert!(node.subjects().is_empty());
}

#[tokio::test]
async fn a_nodes_openings_of_rooms_are_numbered_and_published() {
    let mut node = Node::new("n1", 1);
    let (ada, _) = node.join("lobby", "Ada").await;
    ada.leave(LeaveReason::Left).await;
    // The test settings linger 0 ms: closed at once; then opened again.
    let (_bo, _) = node.join("lobby", "Bo").await;
    let published = node.published();
    let seen: Vec<(u64, u64, bool)> = published
        .iter()
        .map(|(_, u)| (u.incarnation, u.seq, u.closed))
        .collect();
    assert_eq!(
        seen,
        [(1, 1, false), (1, 2, false), (1, 3, true), (2, 1, false)]
    );
    assert!(RoomSide::publish_full(&*node.rooms, "lobby", None));
    let published = node.published();
    assert_eq!((published[0].1.incarnation, published[0].1.seq), (2, 1));
}

/// A beacon of `from`: its current `seq`, nothing else.
fn beacon(from: &Origin, seq: u64) -> Update {
    update(from, seq, Vec::new())
}

#[tokio::test(start_paused = true)]
async fn a_part_still_waiting_for_its_full_state_is_asked_again_by_the_sweep() {
    let mut node = Node::new("n1", 1);
    let (_ada, _) = node.join("lobby", "Ada").await;
    let room = node.rooms.handle("lobby");
    node.subjects();
    let n2 = origin("n2", 7, 2);
    node.apply("lobby", full(&n2, 1, vec![member(2, "Cy", 40)]));
    node.apply(
        "lobby",
        update(&n2, 3, vec![Op::Joined(member(18, "Dee", 1))]),
    );
    assert_eq!(node.subjects(), ["amble.v2.n.n2"]);
    // The request or its answer is lost, and n2 says nothing more.
    node.rooms.sweep(&room);
    assert!(node.subjects().is_empty(), "asked less than a second ago");
    tokio::time::advance(Duration::from_millis(1_001)).await;
    node.rooms.sweep(&room);
    assert_eq!(node.subjects(), ["amble.v2.n.n2"]);
    // Once the full state is in, the sweep asks nobody.
    node.apply("lobby", full(&n2, 3, vec![]));
    tokio::time::advance(Duration::from_millis(1_001)).await;
    node.rooms.sweep(&room);
    assert!(node.subjects().is_empty());
}

#[tokio::test]
async fn a_quiet_room_with_local_members_publishes_a_beacon_of_its_seq() {
    let mut node = Node::new("n1", 1);
    let (ada, _) = node.join("lobby", "Ada").await;
    let room = node.rooms.handle("lobby");
    ada.chat("hi".into()).await;
    assert_eq!(node.published().len(), 2);
    // The sweep after the chat sees it published; then five quiet sweeps.
    node.rooms.sweep(&room);
    for _ in 0..4 {
        node.rooms.sweep(&room);
    }
    assert!(node.published().is_empty());
    node.rooms.sweep(&room);
    let published = node.published();
    let [(subject, u)] = &published[..] else {
        panic!("{published:?}")
    };
    assert_eq!(subject, "amble.v2.r.lobby");
    assert_eq!(
        (u.incarnation, u.seq),
        (1, 2),
        "the current seq, not a new one"
    );
    assert!(u.ops.is_empty() && u.motion.is_empty() && !u.full && !u.closed);
    // Not a new seq: the next update is seq 3.
    ada.chat("again".into()).await;
    assert_eq!(node.published()[0].1.seq, 3);
}

#[tokio::test]
async fn a_beacon_ahead_of_the_part_reveals_a_lost_last_update() {
    let mut node = Node::new("n1", 1);
    let (_ada, ada) = node.join("lobby", "Ada").await;
    let n2 = origin("n2", 7, 2);
    node.apply("lobby", full(&n2, 1, vec![member(2, "Cy", 40)]));
    node.subjects();
    ada.take();
    // A beacon at the applied seq: nothing missed.
    node.apply("lobby", beacon(&n2, 1));
    assert!(node.subjects().is_empty());
    // Cy's Left (seq 2) was lost; the room is quiet; n2's beacon says 2.
    node.apply("lobby", beacon(&n2, 2));
    assert_eq!(node.subjects(), ["amble.v2.n.n2"]);
    assert!(bodies(ada.take()).is_empty(), "a beacon changes nothing");
    node.apply("lobby", full(&n2, 2, vec![]));
    assert!(matches!(&bodies(ada.take())[..], [Body::Left(l)] if l.member_id == 2));
    // A beacon from a node with no part here (it missed the snapshot
    // deadline) makes this node ask for its part, even at seq 1.
    let n3 = origin("n3", 9, 3);
    node.apply("lobby", beacon(&n3, 1));
    assert_eq!(node.subjects(), ["amble.v2.n.n3"]);
}

#[tokio::test]
async fn parts_are_made_only_for_live_peers() {
    let node = Node::new("n1", 1);
    let (_ada, ada) = node.join("lobby", "Ada").await;
    let n2 = origin("n2", 7, 2);
    // Not heard (declared down meanwhile, or forgotten): no part.
    RoomSide::apply(
        &*node.rooms,
        "lobby",
        full(&n2, 1, vec![member(2, "Cy", 40)]),
    );
    ada.take();
    assert_eq!(node.metrics().cluster_remote_members.get(), 0);
    assert_eq!(node.metrics().cluster_bad_messages.get(), 1);
    assert!(
        node.rooms
            .handle("lobby")
            .state()
            .remote
            .as_ref()
            .is_some_and(|r| r.parts.is_empty())
    );
    node.apply("lobby", full(&n2, 1, vec![member(2, "Cy", 40)]));
    assert_eq!(node.metrics().cluster_remote_members.get(), 1);
}

#[tokio::test]
async fn held_updates_are_bounded_by_count_and_bytes_keeping_the_newest() {
    let node = Node::new("n1", 1);
    let (_ada, ada) = node.join("lobby", "Ada").await;
    let n2 = origin("n2", 7, 2);
    node.apply("lobby", full(&n2, 1, vec![]));
    ada.take();
    // A gap: seq 3.. are held while the full state is on its way.
    let chat = |seq: u64, text: String| {
        update(
            &n2,
            seq,
            vec![Op::Chat {
                id: MemberId(2),
                text,
                server_time_ms: seq,
            }],
        )
    };
    for seq in 3..3 + 100 {
        node.apply("lobby", chat(seq, "x".into()));
    }
    let held = |node: &Node| {
        let room = node.rooms.handle("lobby");
        let st = room.state();
        let part = &st.remote.as_ref().expect("remote").parts["n2"];
        (
            part.sequence.held().len(),
            part.sequence.held().first().map(|u| u.seq),
            part.sequence.held_bytes(),
        )
    };
    let (count, oldest, _) = held(&node);
    assert_eq!(
        (count, oldest),
        (MAX_BUFFERED, Some(103 - MAX_BUFFERED as u64))
    );
    // The full state as of seq 60 is followed by the held 61..=102.
    node.apply("lobby", full(&n2, 60, vec![member(2, "Cy", 40)]));
    let st_seq = node
        .rooms
        .handle("lobby")
        .state()
        .remote
        .as_ref()
        .expect("remote")
        .parts["n2"]
        .sequence
        .seq();
    assert_eq!(st_seq, 102);
    assert_eq!(bodies(ada.take()).len(), 1 + 42, "Cy joins, then 42 chats");
    // Big updates: the byte bound holds them to fewer.
    node.apply("lobby", chat(104, "y".repeat(200)));
    for seq in 105..105 + 40 {
        node.apply("lobby", chat(seq, "z".repeat(20_000)));
    }
    let (count, oldest, bytes) = held(&node);
    assert!(bytes <= MAX_BUFFERED_BYTES, "{bytes}");
    assert!(count < 40, "{count}");
    assert_eq!(oldest, Some(145 - count as u64), "the newest are kept");
}

/// Polls `fut` exactly once.
async fn poll_once<F: std::future::Future>(
    fut: std::pin::Pin<&mut F>,
) -> std::task::Poll<F::Output> {
    let mut fut = Some(fut);
    std::future::poll_fn(|cx| {
        let fut = fut.take().expect("polled once");
        std::task::Poll::Ready(fut.poll(cx))
    })
    .await
}

#[tokio::test]
async fn a_join_given_up_during_the_opening_leaves_the_room_to_close() {
    let mut node = Node::new("n1", 1);
    // An opening in progress that never ends (NATS slow), polled once so
    // it holds the room's opening...
    let room = node.rooms.handle("lobby");
    let mut opening = std::pin::pin!(room.opened.get_or_init(std::future::pending));
    assert!(poll_once(opening.as_mut()).await.is_pending());
    // ...and a join polled once, so it waits for that opening; then its
    // connection goes away (the join future is dropped).
    let sink: Arc<dyn Sink> = Arc::new(Frames::default());
    let mut join = Box::pin(node.rooms.join("lobby", "Ada".into(), sink));
    assert!(poll_once(join.as_mut()).await.is_pending());
    assert_eq!(node.metrics().rooms.get(), 1);
    drop(join);
    // The test settings linger 0 ms: closed at once.
    assert_eq!(node.metrics().rooms.get(), 0);
    assert!(node.published().last().is_some_and(|(_, u)| u.closed));
    assert!(RoomSide::open_rooms(&*node.rooms).is_empty());
}

#[tokio::test]
async fn moves_cut_twice_before_a_tick_go_out_once_each_the_newest() {
    let node = Node::new("n1", 1);
    let (_viewer, viewer) = node.join("lobby", "Viewer").await;
    let (ada, _) = node.join("lobby", "Ada").await;
    let (bo, _) = node.join("lobby", "Bo").await;
    let room = node.rooms.handle("lobby");
    let at = |x| Motion::standing(Position { x, y: 0 });
    ada.submit(at(100)).await;
    bo.submit(at(200)).await;
    node.rooms.cut(&room, 1_000);
    // The tick at 1_000 was skipped: the next cut finds the earlier moves.
    bo.submit(at(250)).await;
    node.rooms.cut(&room, 1_100);
    viewer.take();
    node.rooms.tick(1_100).await;
    let mut got = motion_records(viewer.take());
    got.sort_unstable();
    assert_eq!(got, [(17, 100), (33, 250)]);
}

/// Issue #15, finding 5: a cut published the whole carried-over cut when
/// the tick had not consumed the previous one (a late or skipped tick), so
/// every other node received those moves twice. A cut publishes only what
/// is new in it.
#[tokio::test]
async fn a_cut_after_a_skipped_tick_publishes_only_its_new_moves() {
    let mut node = Node::new("n1", 1);
    let (ada, _) = node.join("lobby", "Ada").await;
    let (bo, _) = node.join("lobby", "Bo").await;
    let room = node.rooms.handle("lobby");
    node.published();
    let at = |x| Motion::standing(Position { x, y: 0 });
    let records = |published: Vec<(String, cpb::RoomUpdate)>| -> Vec<(u64, Vec<u32>)> {
        published
            .into_iter()
            .map(|(_, u)| (u.tick_ms, u.motion))
            .collect()
    };
    ada.submit(at(100)).await;
    bo.submit(at(200)).await;
    node.rooms.cut(&room, 1_000);
    // Heads are `id * 2` (standing): Ada is 1, Bo 17.
    assert_eq!(
        records(node.published()),
        [(1_000, vec![2, 100, 0, 34, 200, 0])]
    );
    // The tick at 1_000 was skipped: Bo moves again, Ada does not.
    bo.submit(at(250)).await;
    node.rooms.cut(&room, 1_100);
    assert_eq!(records(node.published()), [(1_100, vec![34, 250, 0])]);
    // Nothing new: nothing published.
    node.rooms.cut(&room, 1_200);
    assert!(node.published().is_empty());
}

/// Issue #15, finding 6: a Welcome taken between a cut and its tick showed
/// the cut's moves, and the tick's batch then brought them to the joiner
/// again. The members already there get the cut's batch before the
/// joiner's Joined; the joiner only the snapshot.
#[tokio::test]
async fn a_joiner_between_a_cut_and_its_tick_gets_each_move_once() {
    let node = Node::new("n1", 1);
    let (_viewer, viewer) = node.join("lobby", "Viewer").await;
    let (ada, _) = node.join("lobby", "Ada").await;
    let room = node.rooms.handle("lobby");
    let tick = node.rooms.clock.now_ms() / 100 * 100 + 100;
    ada.submit(Motion::standing(Position { x: 321, y: 0 }))
        .await;
    node.rooms.cut(&room, tick);
    viewer.take();
    let (_bo, bo) = node.join("lobby", "Bo").await;
    node.rooms.tick(tick).await;

    let bo_got = bo.take();
    let snapshot = match bo_got.first().and_then(|f| f.body.as_ref()) {
        Some(Body::Welcome(w)) => w.snapshot.clone().expect("a snapshot"),
        other => panic!("{other:?}"),
    };
    let ada_pb = snapshot
        .members
        .iter()
        .find(|m| m.name == "Ada")
        .expect("Ada");
    assert_eq!(ada_pb.position.as_ref().map(|p| p.x), Some(321));
    assert_eq!(
        motion_records(bo_got[1..].to_vec()),
        [],
        "the move again after the snapshot"
    );
    // The viewer: Ada's move once, before Bo's Joined.
    let seen = viewer.take();
    assert_eq!(motion_records(seen.clone()), [(17, 321)]);
    let joined_at = seen
        .iter()
        .position(|f| matches!(f.body, Some(Body::Joined(_))))
        .expect("Bo's Joined");
    let batch_at = seen
        .iter()
        .position(|f| !f.motion.is_empty())
        .expect("the batch");
    assert!(batch_at < joined_at, "{seen:?}");
}

/// Issue #15, finding 9: parts were bounded only by the directory's 4,096
/// peers, each holding up to `MAX_BUFFERED_BYTES` while it waits: about
/// 1 GiB per room from forged node names. A room takes parts from at most
/// one node per other slot.
#[tokio::test]
async fn a_room_takes_parts_from_at_most_one_node_per_other_slot() {
    let node = Node::new("n1", 1);
    let (_ada, _) = node.join("lobby", "Ada").await;
    let bad = || node.metrics().cluster_bad_messages.get();
    let others: Vec<u32> = (0..16).filter(|&s| s != 1).collect();
    for &slot in &others {
        let from = origin(&format!("x{slot}"), 7, slot);
        node.apply("lobby", full(&from, 1, vec![member(slot + 16, "m", 1)]));
    }
    assert_eq!(bad(), 0);
    let handle = node.rooms.map.get("lobby").map(|r| Arc::clone(r.value()));
    let handle = handle.expect("open");
    let parts = || handle.state().remote.as_deref().map(|r| r.parts.len());
    assert_eq!(parts(), Some(15));
    // A sixteenth name (whatever its slot) makes no part.
    node.apply("lobby", full(&origin("forged", 9, 2), 1, Vec::new()));
    assert_eq!(parts(), Some(15));
    assert_eq!(bad(), 1);
    assert_eq!(handle.state().members.len(), 16);
}

/// A remote member's chat or leave that arrives while its move still waits
/// for this node's tick follows that move: the tick's batch is written first
/// (once: the tick then writes nothing more), as on the member's own node.
#[tokio::test]
async fn a_remote_chat_or_leave_follows_the_members_waiting_move() {
    let mut node = Node::new("n1", 1);
    let (_ada, ada_frames) = node.join("lobby", "Ada").await;
    let n2 = origin("n2", 7, 2);
    node.apply("lobby", full(&n2, 3, vec![member(2, "Cy", 40)]));
    node.published();
    ada_frames.take();
    let tick = node.rooms.clock.now_ms() / 100 * 100;
    let xs = |frame: &ServerMessage| -> Vec<(u32, u32)> {
        let (_, records) = decode_motion(&frame.motion).expect("a batch");
        records
            .iter()
            .map(|r| (r.member.0, r.motion.position.x))
            .collect()
    };

    // Cy moved at n2's tick, then chatted; this node's tick has not run yet.
    node.apply("lobby", moves(&n2, 4, tick, &[(2, 300)]));
    node.apply(
        "lobby",
        update(
            &n2,
            5,
            vec![Op::Chat {
                id: MemberId(2),
                text: "after my move".into(),
                server_time_ms: tick,
            }],
        ),
    );
    let frames = ada_frames.take();
    assert_eq!(frames.len(), 2, "the batch, then the chat: {frames:?}");
    assert_eq!(xs(&frames[0]), [(2, 300)]);
    assert!(matches!(&frames[1].body, Some(Body::Chat(c)) if c.member_id == 2));
    node.rooms.tick(tick).await;
    assert!(
        ada_frames.take().is_empty(),
        "the tick's batch went already"
    );

    // The same for a leave, with a move waiting for the next tick.
    node.apply("lobby", moves(&n2, 6, tick + 100, &[(2, 400)]));
    node.apply(
        "lobby",
        update(
            &n2,
            7,
            vec![Op::Left {
                id: MemberId(2),
                reason: LeaveReason::Left,
                handed_over: false,
            }],
        ),
    );
    let frames = ada_frames.take();
    assert_eq!(frames.len(), 2, "the batch, then the leave: {frames:?}");
    assert_eq!(xs(&frames[0]), [(2, 400)]);
    assert!(matches!(&frames[1].body, Some(Body::Left(l)) if l.member_id == 2));
    node.rooms.tick(tick + 100).await;
    assert!(ada_frames.take().is_empty());

    // A chat from a member with no waiting move is written at once, alone.
    node.apply(
        "lobby",
        update(&n2, 8, vec![Op::Joined(member(18, "Bo", 50))]),
    );
    ada_frames.take();
    node.apply(
        "lobby",
        update(
            &n2,
            9,
            vec![Op::Chat {
                id: MemberId(18),
                text: "standing".into(),
                server_time_ms: tick,
            }],
        ),
    );
    let frames = ada_frames.take();
    assert_eq!(frames.len(), 1);
    assert!(matches!(&frames[0].body, Some(Body::Chat(_))));
}

fn data(pairs: &[(&str, &str)]) -> Data {
    Data::check(
        pairs
            .iter()
            .map(|(k, v)| pb::DataEntry {
                key: (*k).into(),
                value: (*v).into(),
            })
            .collect(),
        &crate::protocol::Rules::default(),
    )
    .expect("valid data")
}

/// Issue #19: a remote member's data arrives with it, a data op becomes a
/// `MemberData`, and a full state after a missed change repairs it (one
/// `MemberData`, no Left and Joined).
#[tokio::test]
async fn remote_member_data_arrives_changes_and_is_repaired_by_a_full_state() {
    let node = Node::new("n1", 1);
    let (_ada, ada) = node.join("lobby", "Ada").await;
    ada.take();
    let n2 = origin("n2", 7, 2);
    let mut cy = member(2, "Cy", 40);
    cy.data = data(&[("status", "busy")]);
    cy.user = Some("user-9".into());
    node.apply("lobby", full(&n2, 0, vec![]));
    node.apply("lobby", update(&n2, 1, vec![Op::Joined(cy.clone())]));
    node.apply(
        "lobby",
        update(
            &n2,
            2,
            vec![Op::Data {
                id: MemberId(2),
                data: data(&[("status", "free")]),
            }],
        ),
    );
    match &bodies(ada.take())[..] {
        [Body::Joined(j), Body::MemberData(d)] => {
            let m = j.member.as_ref().expect("member");
            assert_eq!(m.data, data(&[("status", "busy")]).to_pb());
            assert_eq!(m.user, "user-9");
            assert_eq!(d.member_id, 2);
            assert_eq!(d.data, data(&[("status", "free")]).to_pb());
        }
        other => panic!("{other:?}"),
    }
    // A full state (the change to "away" was missed): only the data moves.
    cy.data = data(&[("status", "away")]);
    node.apply("lobby", full(&n2, 4, vec![cy.clone()]));
    match &bodies(ada.take())[..] {
        [Body::MemberData(d)] => assert_eq!(d.data, data(&[("status", "away")]).to_pb()),
        other => panic!("{other:?}"),
    }
    // Unchanged data in a full state says nothing.
    node.apply("lobby", full(&n2, 5, vec![cy]));
    assert!(bodies(ada.take()).is_empty());
    let (_bo, bo) = node.join("lobby", "Bo").await;
    match &bodies(bo.take())[..] {
        [Body::Welcome(w)] => {
            let members = &w.snapshot.as_ref().expect("snapshot").members;
            let cy = members.iter().find(|m| m.id == 2).expect("Cy");
            assert_eq!(cy.data, data(&[("status", "away")]).to_pb());
        }
        other => panic!("{other:?}"),
    }
}

mod spatial;
mod takeover;
