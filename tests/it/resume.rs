//! Resuming a dropped connection's place (`--resume-grace-ms`) over real
//! sockets: the others see nothing, the resumer gets its id and a fresh
//! snapshot; without a resume, `Left` after the grace; a bad or spent
//! token joins afresh.

use std::time::{Duration, Instant};

use amble::protocol::pb::{
    self, LeaveReason, client_message::Body as C, server_message::Body as S,
};

use crate::support::*;

/// Joins `room` as `name`, asking for the place `resume_token` names.
async fn join_resuming(client: &mut Client, room: &str, name: &str, token: &str) -> pb::Welcome {
    client
        .send(C::Join(pb::Join {
            room: room.into(),
            name: name.into(),
            resume_token: token.into(),
            ..Default::default()
        }))
        .await;
    client.welcome().await
}

/// Round-trips a Ping and returns every room message that came before the
/// Pong: what the client saw happen meanwhile.
async fn seen_until_pong(client: &mut Client) -> Vec<pb::ServerMessage> {
    client.send(C::Ping(pb::Ping { client_time_ms: 7 })).await;
    let mut seen = Vec::new();
    for _ in 0..1_000 {
        let m = client.recv().await;
        if matches!(&m.body, Some(S::Pong(p)) if p.client_time_ms == 7) {
            return seen;
        }
        seen.push(m);
    }
    panic!("no Pong after 1,000 messages");
}

fn joined_or_left(m: &pb::ServerMessage) -> bool {
    matches!(m.body, Some(S::Joined(_) | S::Left(_)))
}

fn left(m: &pb::ServerMessage) -> Option<(u32, i32)> {
    match &m.body {
        Some(S::Left(l)) => Some((l.member_id, l.reason)),
        _ => None,
    }
}

const RESUMED: &str = "amble_resumed_total{node=\"same_node\"}";

#[tokio::test]
async fn a_dropped_client_resumes_its_place_unseen() {
    let server = TestServer::start().await;
    let (mut ada, _) = server.joined("lobby", "Ada").await;
    let (mut bo, w) = server.joined("lobby", "Bo").await;
    assert_eq!(w.limits.expect("limits").resume_grace_ms, 10_000);
    assert_eq!(w.resume_token.len(), 32);
    assert!(!w.resumed);
    bo.send_move(321, 123, 1).await;
    ada.until(|m| (!m.motion.is_empty()).then_some(())).await;
    seen_until_pong(&mut ada).await;

    // The socket goes without a word; the server holds the place.
    drop(bo);
    server.until_metric("amble_resume_held", |v| v == 1.0).await;
    assert_eq!(server.metric("amble_members").await, 2.0);

    let mut again = server.client().await;
    let w2 = join_resuming(&mut again, "lobby", "Bo", &w.resume_token).await;
    assert!(w2.resumed);
    assert_eq!(w2.member_id, w.member_id);
    assert_ne!(w2.resume_token, w.resume_token);
    let snapshot = w2.snapshot.expect("snapshot");
    let me = snapshot
        .members
        .iter()
        .find(|m| m.id == w2.member_id)
        .expect("itself in the snapshot");
    assert_eq!(me.position, Some(pb::Position { x: 321, y: 123 }));
    assert_eq!(snapshot.members.len(), 2);
    assert_eq!(server.metric(RESUMED).await, 1.0);
    assert_eq!(server.metric("amble_resume_held").await, 0.0);

    // Ada saw no Left and no Joined, and sees the resumed Bo move.
    let seen = seen_until_pong(&mut ada).await;
    assert!(!seen.iter().any(joined_or_left), "{seen:?}");
    again.send_move(400, 100, 2).await;
    let records = ada.next_motion().await;
    assert_eq!(records[0].member.0, w.member_id);
    assert_eq!(server.metric("amble_members").await, 2.0);
}

#[tokio::test]
async fn without_a_resume_the_others_see_left_after_the_grace() {
    let server = TestServer::with(config(|c| c.room.resume_grace_ms = 400)).await;
    let (mut ada, _) = server.joined("lobby", "Ada").await;
    let (bo, w) = server.joined("lobby", "Bo").await;
    ada.until(|m| matches!(m.body, Some(S::Joined(_))).then_some(()))
        .await;
    let dropped = Instant::now();
    drop(bo);
    assert_eq!(
        ada.until(left).await,
        (w.member_id, LeaveReason::Disconnected as i32)
    );
    assert!(
        dropped.elapsed() >= Duration::from_millis(400),
        "Left before the grace: {:?}",
        dropped.elapsed()
    );
    assert_eq!(server.metric("amble_resume_expired_total").await, 1.0);
    assert_eq!(server.metric("amble_members").await, 1.0);

    // Too late: the token joins afresh, and Ada sees a new member.
    let mut late = server.client().await;
    let w2 = join_resuming(&mut late, "lobby", "Bo", &w.resume_token).await;
    assert!(!w2.resumed);
    assert!(
        ada.until(|m| match &m.body {
            Some(S::Joined(j)) => j.member.clone(),
            _ => None,
        })
        .await
        .name
            == "Bo"
    );
    assert_eq!(
        server
            .metric("amble_resume_refused_total{reason=\"unknown\"}")
            .await,
        1.0
    );
}

#[tokio::test]
async fn a_bad_or_spent_token_joins_afresh() {
    let server = TestServer::start().await;
    let (mut ada, _) = server.joined("lobby", "Ada").await;

    let mut bad = server.client().await;
    let w = join_resuming(&mut bad, "lobby", "Bad", "not a token").await;
    assert!(!w.resumed);
    assert_eq!(
        server
            .metric("amble_resume_refused_total{reason=\"malformed\"}")
            .await,
        1.0
    );
    let joined = ada
        .until(|m| match &m.body {
            Some(S::Joined(j)) => j.member.clone(),
            _ => None,
        })
        .await;
    assert_eq!(joined.id, w.member_id);

    // Bad drops, resumes once (spending its token), and the spent token
    // then joins afresh.
    drop(bad);
    server.until_metric("amble_resume_held", |v| v == 1.0).await;
    let mut back = server.client().await;
    let w2 = join_resuming(&mut back, "lobby", "Bad", &w.resume_token).await;
    assert!(w2.resumed);
    let mut thief = server.client().await;
    let w3 = join_resuming(&mut thief, "lobby", "Bad", &w.resume_token).await;
    assert!(!w3.resumed);
    assert_ne!(w3.member_id, w2.member_id);
    assert_eq!(
        server
            .metric("amble_resume_refused_total{reason=\"unknown\"}")
            .await,
        1.0
    );

    // After a Leave the place is gone: its token joins afresh.
    back.send(C::Leave(pb::Leave {})).await;
    assert_eq!(
        ada.until(left).await,
        (w2.member_id, LeaveReason::Left as i32)
    );
    let mut after = server.client().await;
    let w4 = join_resuming(&mut after, "lobby", "Bad", &w2.resume_token).await;
    assert!(!w4.resumed);
}

#[tokio::test]
async fn a_resume_closes_the_old_connection_quietly() {
    let server = TestServer::start().await;
    let (mut ada, _) = server.joined("lobby", "Ada").await;
    let (mut old, w) = server.joined("lobby", "Bo").await;
    ada.until(|m| matches!(m.body, Some(S::Joined(_))).then_some(()))
        .await;
    // The client thinks its connection is gone; the server does not know.
    let mut new = server.client().await;
    let w2 = join_resuming(&mut new, "lobby", "Bo", &w.resume_token).await;
    assert!(w2.resumed);
    assert_eq!(w2.member_id, w.member_id);
    assert_eq!(old.expect_close().await, 4001);
    let seen = seen_until_pong(&mut ada).await;
    assert!(!seen.iter().any(joined_or_left), "{seen:?}");
    assert_eq!(server.metric("amble_members").await, 2.0);
    new.ping().await;
}

#[tokio::test]
async fn with_no_grace_a_drop_leaves_at_once_and_there_is_no_token() {
    let server = TestServer::with(config(|c| c.room.resume_grace_ms = 0)).await;
    let (mut ada, _) = server.joined("lobby", "Ada").await;
    let (bo, w) = server.joined("lobby", "Bo").await;
    assert!(w.resume_token.is_empty());
    drop(bo);
    assert_eq!(
        ada.until(left).await,
        (w.member_id, LeaveReason::Disconnected as i32)
    );
}
