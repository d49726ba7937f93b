//! Join, snapshot, Joined/Left, chat, ping, idle timeout, shutdown, HTTP.

use amble::protocol::pb::{
    self, LeaveReason, client_message::Body as C, server_message::Body as S,
};

use crate::support::*;

fn left(m: &pb::ServerMessage) -> Option<(u32, i32)> {
    match &m.body {
        Some(S::Left(l)) => Some((l.member_id, l.reason)),
        _ => None,
    }
}

#[tokio::test]
async fn join_snapshot_joined_and_left() {
    // A short resume grace: the silent drop below is told after it.
    let server = TestServer::with(config(|c| c.room.resume_grace_ms = 300)).await;
    let (mut ada, w) = server.joined("lobby", "Ada").await;
    assert_eq!((w.member_id, w.room.as_str()), (0, "lobby"));
    let limits = w.limits.expect("limits");
    assert_eq!(
        (limits.tick_ms, limits.move_interval_ms, limits.world_width),
        (100, 1_000, 5_000)
    );
    assert!(limits.max_message_bytes >= 1_024);
    let snapshot = w.snapshot.expect("snapshot");
    assert!(
        snapshot.server_time_ms > 1_700_000_000_000,
        "server time is epoch ms"
    );

    ada.send_move(100, 200, 1).await;
    ada.next_motion().await; // Ada's own move applied

    let (mut bo, w) = server.joined("lobby", "Bo").await;
    assert_eq!(w.member_id, 1);
    let members = w.snapshot.expect("snapshot").members;
    assert_eq!(members.len(), 2);
    let ada_seen = members
        .iter()
        .find(|m| m.name == "Ada")
        .expect("Ada in snapshot");
    assert_eq!(
        ada_seen.position,
        Some(pb::Position { x: 100, y: 200 }),
        "last known position"
    );

    let joined = ada
        .until(|m| match &m.body {
            Some(S::Joined(j)) => j.member.clone(),
            _ => None,
        })
        .await;
    assert_eq!((joined.id, joined.name.as_str()), (1, "Bo"));

    // Leave: the connection stays open and may join again.
    bo.send(C::Leave(pb::Leave {})).await;
    assert_eq!(ada.until(left).await, (1, LeaveReason::Left as i32));
    let w = bo.join("lobby", "Bo again").await;
    assert_eq!(w.member_id, 1);
    ada.until(|m| matches!(m.body, Some(S::Joined(_))).then_some(()))
        .await;

    // Disconnect without a word: its place is held for the resume grace
    // (tests/it/resume.rs), then the others see DISCONNECTED.
    drop(bo);
    assert_eq!(ada.until(left).await, (1, LeaveReason::Disconnected as i32));
}

#[tokio::test]
async fn rooms_are_separate_and_listed() {
    let server = TestServer::with(config(|c| c.room.room_capacity = 7)).await;
    let (_a, _) = server.joined("alpha", "a").await;
    let (_b, _) = server.joined("alpha", "b").await;
    let (c, _) = server.joined("beta", "c").await;
    let (status, body) = server.get("/api/rooms").await;
    assert!(status.contains("200"), "{status}");
    let json: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert_eq!(
        json,
        serde_json::json!({"rooms": [
            {"name": "alpha", "members": 2, "capacity": 7},
            {"name": "beta", "members": 1, "capacity": 7},
        ]})
    );
    // Leave, then Ping: the connection handles them in order, so the
    // Pong proves the Leave was applied.
    let mut c = c;
    c.send(C::Leave(pb::Leave {})).await;
    c.ping().await;
    let (_, body) = server.get("/api/rooms").await;
    assert!(!body.contains("beta"), "an empty room is removed: {body}");
    server.stop().await; // asserts a clean exit
}

#[tokio::test]
async fn chat_is_relayed_with_sender_and_time() {
    let server = TestServer::start().await;
    let (mut ada, _) = server.joined("lobby", "Ada").await;
    let (mut bo, w) = server.joined("lobby", "Bo").await;
    bo.send(C::Chat(pb::SendChat {
        text: "hello 👋".into(),
    }))
    .await;
    for client in [&mut ada, &mut bo] {
        let chat = client
            .until(|m| match &m.body {
                Some(S::Chat(c)) => Some(c.clone()),
                _ => None,
            })
            .await;
        assert_eq!(
            (chat.member_id, chat.text.as_str()),
            (w.member_id, "hello 👋")
        );
        assert!(chat.server_time_ms > 0);
    }
}

#[tokio::test]
async fn ping_returns_server_time() {
    let server = TestServer::start().await;
    let mut c = server.client().await;
    c.send(C::Ping(pb::Ping { client_time_ms: 7 })).await;
    match c.recv().await.body {
        Some(S::Pong(p)) => {
            assert_eq!(p.client_time_ms, 7);
            assert!(p.server_time_ms > 1_700_000_000_000);
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn an_idle_connection_times_out_and_the_room_is_told() {
    let server = TestServer::with(config(|c| {
        c.session.idle_timeout_ms = 3_000;
        c.session.ping_interval_ms = 1_000;
        // The place is held this long after the timeout, then TIMED_OUT.
        c.room.resume_grace_ms = 2_000;
    }))
    .await;
    let (mut watcher, _) = server.joined("lobby", "watcher").await;
    let (silent, w) = server.joined("lobby", "silent").await;
    // `silent` never reads again, so it never answers the server's pings.
    // `watcher` keeps answering (its reads reply to pings).
    let (id, reason) = watcher.until(left).await;
    assert_eq!((id, reason), (w.member_id, LeaveReason::TimedOut as i32));
    assert_eq!(server.metric("amble_idle_timeouts_total").await, 1.0);
    drop(silent);
}

#[tokio::test]
async fn shutdown_closes_every_socket_with_1001() {
    let mut server = TestServer::start().await;
    let (mut a, _) = server.joined("lobby", "a").await;
    let (mut b, _) = server.joined("lobby", "b").await;
    let mut idle = server.client().await;
    server.trigger_stop();
    for c in [&mut a, &mut b, &mut idle] {
        c.until(|m| match &m.body {
            Some(S::Error(e)) if e.code == pb::ErrorCode::ShuttingDown as i32 => Some(()),
            _ => None,
        })
        .await;
        assert_eq!(c.expect_close().await, 1001);
    }
    server.stopped().await; // asserts a clean exit
}

#[tokio::test]
async fn health_metrics_and_not_found() {
    let server = TestServer::start().await;
    let (status, body) = server.get("/healthz").await;
    assert!(status.contains("200") && body.contains("ok"));
    let (status, _) = server.get("/no/such/page").await;
    assert!(status.contains("404"), "{status}");

    let (mut a, _) = server.joined("lobby", "a").await;
    let (_b, _) = server.joined("lobby", "b").await;
    a.send_move(1, 2, 1).await;
    a.next_motion().await;
    assert_eq!(server.metric("amble_connections").await, 2.0);
    assert_eq!(server.metric("amble_rooms").await, 1.0);
    assert_eq!(server.metric("amble_members").await, 2.0);
    assert_eq!(server.metric("amble_moves_received_total").await, 1.0);
    assert_eq!(server.metric("amble_moves_applied_total").await, 1.0);
    assert!(server.metric("amble_frames_sent_total").await >= 4.0);
    assert!(server.metric("amble_bytes_sent_total").await > 0.0);
    assert!(server.metric("amble_process_cpu_seconds_total").await > 0.0);
    assert!(server.metric("amble_process_resident_memory_bytes").await > 1e6);
}

#[tokio::test]
async fn a_client_close_is_answered_cleanly() {
    use futures_util::StreamExt as _;
    let server = TestServer::start().await;
    let (mut c, _) = server.joined("lobby", "leaving").await;
    within("close", c.ws.close(None)).await.expect("close sent");
    match within("the close reply", c.ws.next()).await {
        Some(Ok(tokio_tungstenite::tungstenite::Message::Close(_))) | None => {}
        other => panic!("expected a clean close, got {other:?}"),
    }
}

/// A client that pipelines requests and never reads the answers holds up
/// shutdown no longer than the HTTP drain (1 s), not the whole shutdown
/// timeout (5 s).
#[tokio::test]
async fn shutdown_is_bounded_even_with_a_stuck_http_client() {
    use tokio::io::AsyncWriteExt as _;
    let mut server = TestServer::start().await;
    // A client that pipelines requests and never reads the answers.
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(4_096).expect("SO_RCVBUF");
    let mut stuck = within("connect", socket.connect(server.addr))
        .await
        .expect("connect");
    let request = "GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n".repeat(200);
    let _ = tokio::time::timeout(
        std::time::Duration::from_secs(2),
        stuck.write_all(request.as_bytes()),
    )
    .await;
    let (mut ws, _) = server.joined("lobby", "someone").await;
    let started = tokio::time::Instant::now();
    server.trigger_stop();
    assert_eq!(ws.expect_close().await, 1001);
    server.stopped().await; // asserts a clean exit
    assert!(
        started.elapsed() < std::time::Duration::from_millis(2_500),
        "shutdown took {:?}",
        started.elapsed()
    );
    drop(stuck);
}

#[tokio::test]
async fn a_full_room_of_long_names_still_gets_its_welcome() {
    // 500 members whose names are 32 four-byte characters: the Welcome of the
    // last one is over 64 KiB.
    let server = TestServer::start().await;
    let name = "😀".repeat(32);
    let mut members = Vec::new();
    for _ in 0..499 {
        members.push(server.joined("big", &name).await.0);
    }
    let (_last, w) = server.joined("big", &name).await;
    assert_eq!(w.snapshot.expect("snapshot").members.len(), 500);
}

#[tokio::test]
async fn joining_too_often_is_rate_limited() {
    let server = TestServer::start().await;
    let mut c = server.client().await;
    for i in 0..5 {
        c.join("lobby", &format!("hopper{i}")).await;
        c.send(C::Leave(pb::Leave {})).await;
    }
    c.send(C::Join(pb::Join {
        data: Vec::new(),
        start: None,
        room: "lobby".into(),
        name: "again".into(),
        token: String::new(),
        resume_token: String::new(),
    }))
    .await;
    let text = c.expect_error(pb::ErrorCode::RateLimited).await;
    assert!(text.contains("joining too often"), "{text}");
    assert_eq!(
        server
            .metric("amble_rejected_total{reason=\"rate_limited\"}")
            .await,
        1.0
    );
}
