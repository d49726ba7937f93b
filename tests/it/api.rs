//! The server API (docs/api.md) over real sockets: its gate (off, key,
//! budget), every operation's effect on WebSocket clients, and the OpenAPI
//! document checked operation by operation (tests/api/openapi_check.py).

use std::path::Path;
use std::time::Duration;

use amble::protocol::pb::{self, client_message::Body as C, server_message::Body as S};
use serde_json::{Value, json};

use crate::auth::{Files, claims, hs256, join_with, send_join, token};
use crate::cluster_support::{Nats, Node, has_peers};
use crate::support::*;

const KEY: &str = "api-key-for-tests-0123456789abcdef";

/// A server with HS256 tokens and the API key.
async fn api_server(files: &Files) -> TestServer {
    let key = files.write("api.key", format!("{KEY}\n").as_bytes());
    TestServer::with(config(|c| {
        hs256(files, c);
        c.api.api_key_file = Some(key);
    }))
    .await
}

/// One API call: the status and the JSON body.
async fn api(server: &TestServer, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    api_with(server, method, path, body, Some(KEY)).await
}

async fn api_with(
    server: &TestServer,
    method: &str,
    path: &str,
    body: Option<Value>,
    key: Option<&str>,
) -> (u16, Value) {
    api_at(server.addr, method, path, body, key).await
}

/// One API call to the server at `addr`.
async fn api_at(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    body: Option<Value>,
    key: Option<&str>,
) -> (u16, Value) {
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let auth = key.map_or(String::new(), |k| format!("Authorization: Bearer {k}\r\n"));
    let raw = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Content-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let text = request_at(addr, &raw).await;
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP response");
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status");
    let json = serde_json::from_str(body).unwrap_or_else(|_| panic!("a JSON body: {body:?}"));
    (status, json)
}

/// A client of user `sub` joined to `room` as `name`.
async fn member(server: &TestServer, room: &str, name: &str, sub: &str) -> (Client, pb::Welcome) {
    let mut c = server.client().await;
    let w = join_with(&mut c, room, name, &token(&claims(sub))).await;
    (c, w)
}

fn code(body: &Value) -> &str {
    body["error"]["code"].as_str().unwrap_or_default()
}

/// Reads until a `Left` for `id`; returns its reason.
async fn left_reason(c: &mut Client, id: u32) -> i32 {
    c.until(|m| match &m.body {
        Some(S::Left(l)) if l.member_id == id => Some(l.reason),
        _ => None,
    })
    .await
}

#[tokio::test]
async fn without_a_key_file_the_api_is_not_there() {
    let server = TestServer::start().await;
    let (status, body) = api(&server, "GET", "/api/v1/rooms", None).await;
    assert_eq!((status, code(&body)), (404, "not_found"));
    assert_eq!(
        server
            .metric("amble_api_calls_total{op=\"rooms\",status=\"404\"}")
            .await,
        1.0
    );
    server.stop().await;
}

#[tokio::test]
async fn the_key_is_required_and_checked() {
    let files = Files::new("api-key");
    let server = api_server(&files).await;
    let (status, body) = api_with(&server, "GET", "/api/v1/rooms", None, None).await;
    assert_eq!((status, code(&body)), (401, "unauthorized"));
    let (status, _) = api_with(
        &server,
        "GET",
        "/api/v1/rooms",
        None,
        Some("wrong-key-0123456789"),
    )
    .await;
    assert_eq!(status, 401);
    let (status, body) = api(&server, "GET", "/api/v1/rooms", None).await;
    assert_eq!((status, body), (200, json!({ "rooms": [] })));
    let (status, body) = api(&server, "GET", "/api/v1/no-such-thing", None).await;
    assert_eq!((status, code(&body)), (404, "not_found"));
    assert_eq!(
        server
            .metric("amble_api_calls_total{op=\"rooms\",status=\"401\"}")
            .await,
        2.0
    );
    server.stop().await;
}

#[tokio::test]
async fn over_its_budget_the_api_answers_429_with_retry_after() {
    let files = Files::new("api-budget");
    let key = files.write("api.key", KEY.as_bytes());
    let server = TestServer::with(config(|c| {
        c.api.api_key_file = Some(key);
        c.api.api_calls_per_sec = 1;
    }))
    .await;
    // A burst of two, then one a second.
    for _ in 0..2 {
        assert_eq!(api(&server, "GET", "/api/v1/rooms", None).await.0, 200);
    }
    let raw = format!(
        "GET /api/v1/rooms HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {KEY}\r\n\
         Connection: close\r\n\r\n",
        server.addr
    );
    let text = server.request(&raw).await;
    assert!(text.starts_with("HTTP/1.1 429"), "{text}");
    assert!(
        text.to_ascii_lowercase().contains("retry-after: 1"),
        "{text}"
    );
    assert!(text.contains("\"rate_limited\""), "{text}");
    server.stop().await;
}

#[tokio::test]
async fn listing_rooms_members_and_users() {
    let files = Files::new("api-list");
    let server = api_server(&files).await;
    let (_ada, wa) = member(&server, "lobby", "Ada", "u-ada").await;
    let (_bob, wb) = member(&server, "lobby", "Bob", "u-bob").await;
    let (_cy, _) = member(&server, "cafe", "Cy", "u-ada2").await;
    let (status, body) = api(&server, "GET", "/api/v1/rooms", None).await;
    assert_eq!(status, 200);
    assert_eq!(
        body["rooms"],
        json!([
            { "name": "cafe", "members": 1, "capacity": 500, "spatial": false },
            { "name": "lobby", "members": 2, "capacity": 500, "spatial": false },
        ])
    );
    // Pages of one, by id.
    let (status, page) = api(&server, "GET", "/api/v1/rooms/lobby/members?limit=1", None).await;
    assert_eq!(status, 200);
    assert_eq!(page["total"], 2);
    assert_eq!(page["members"][0]["id"], wa.member_id);
    assert_eq!(page["members"][0]["name"], "Ada");
    assert_eq!(page["members"][0]["sub"], "u-ada");
    assert_eq!(page["members"][0]["node"], "local");
    let cursor = page["next_cursor"].as_str().expect("a next page");
    let (_, page) = api(
        &server,
        "GET",
        &format!("/api/v1/rooms/lobby/members?limit=1&cursor={cursor}"),
        None,
    )
    .await;
    assert_eq!(page["members"][0]["id"], wb.member_id);
    assert_eq!(page["next_cursor"], Value::Null);
    for bad in ["limit=0", "limit=1001", "cursor=x", "page=2"] {
        let (status, body) = api(
            &server,
            "GET",
            &format!("/api/v1/rooms/lobby/members?{bad}"),
            None,
        )
        .await;
        assert_eq!((status, code(&body)), (400, "invalid_query"), "{bad}");
    }
    let (status, body) = api(&server, "GET", "/api/v1/users/u-bob", None).await;
    assert_eq!(status, 200);
    assert_eq!(body["members"][0]["room"], "lobby");
    assert_eq!(body["members"][0]["name"], "Bob");
    assert_eq!(body["banned_until_ms"], Value::Null);
    server.stop().await;
}

#[tokio::test]
async fn a_kicked_member_is_told_and_closed_and_the_room_sees_it_leave() {
    let files = Files::new("api-kick");
    let server = api_server(&files).await;
    let (mut ada, _) = member(&server, "lobby", "Ada", "u-ada").await;
    let (mut bob, wb) = member(&server, "lobby", "Bob", "u-bob").await;
    let (status, body) = api(
        &server,
        "POST",
        "/api/v1/rooms/lobby/kick",
        Some(json!({ "sub": "u-bob", "reason": "spamming" })),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(body["kicked"][0]["id"], wb.member_id);
    let message = bob.expect_error(pb::ErrorCode::Kicked).await;
    assert!(message.contains("spamming"), "{message}");
    assert_eq!(bob.expect_close().await, 4004);
    assert_eq!(
        left_reason(&mut ada, wb.member_id).await,
        pb::LeaveReason::Kicked as i32
    );
    // Nobody left to kick by that id now.
    let (status, body) = api(
        &server,
        "POST",
        "/api/v1/rooms/lobby/kick",
        Some(json!({ "member_id": wb.member_id })),
    )
    .await;
    assert_eq!((status, code(&body)), (404, "member_not_found"));
    for (bad, why) in [
        (json!({}), "invalid_body"),
        (json!({ "sub": "a", "member_id": 1 }), "invalid_body"),
        (json!({ "sub": "" }), "invalid_user"),
    ] {
        let (status, body) = api(
            &server,
            "POST",
            "/api/v1/rooms/lobby/kick",
            Some(bad.clone()),
        )
        .await;
        assert_eq!((status, code(&body)), (400, why), "{bad}");
    }
    ada.ping().await;
    server.stop().await;
}

#[tokio::test]
async fn a_ban_removes_everywhere_and_refuses_joins_until_lifted() {
    let files = Files::new("api-ban");
    let server = api_server(&files).await;
    let (mut ada, _) = member(&server, "lobby", "Ada", "u-ada").await;
    let (mut bob, wb) = member(&server, "lobby", "Bob", "u-bob").await;
    let (mut bob2, _) = member(&server, "cafe", "Bob", "u-bob").await;
    let (status, body) = api(
        &server,
        "POST",
        "/api/v1/users/u-bob/ban",
        Some(json!({ "seconds": 600, "reason": "harassment" })),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(body["kicked"].as_array().map(Vec::len), Some(2));
    for c in [&mut bob, &mut bob2] {
        let text = c.expect_error(pb::ErrorCode::Banned).await;
        assert!(text.contains("harassment"), "{text}");
        assert_eq!(c.expect_close().await, 4005);
    }
    assert_eq!(
        left_reason(&mut ada, wb.member_id).await,
        pb::LeaveReason::Kicked as i32
    );
    // A new connection of the user is refused at Join, and stays open.
    let mut again = server.client().await;
    send_join(&mut again, "lobby", "Bob", &token(&claims("u-bob"))).await;
    let text = again.expect_error(pb::ErrorCode::Banned).await;
    assert!(text.contains("600 s"), "{text}");
    again.ping().await;
    let (_, user) = api(&server, "GET", "/api/v1/users/u-bob", None).await;
    assert_eq!(user["ban_reason"], "harassment");
    // Lifted: the join goes through.
    let (status, _) = api(&server, "DELETE", "/api/v1/users/u-bob/ban", None).await;
    assert_eq!(status, 200);
    join_with(&mut again, "lobby", "Bob", &token(&claims("u-bob"))).await;
    for bad in [
        json!({ "seconds": 0 }),
        json!({ "seconds": 40_000_000 }),
        json!({ "reason": "x" }),
    ] {
        let (status, _) = api(
            &server,
            "POST",
            "/api/v1/users/u-bob/ban",
            Some(bad.clone()),
        )
        .await;
        assert_eq!(status, 400, "{bad}");
    }
    server.stop().await;
}

#[tokio::test]
async fn a_muted_user_cannot_chat_and_the_others_hear_nothing() {
    let files = Files::new("api-mute");
    let server = api_server(&files).await;
    let (mut ada, _) = member(&server, "lobby", "Ada", "u-ada").await;
    let (mut bob, _) = member(&server, "lobby", "Bob", "u-bob").await;
    let (status, body) = api(
        &server,
        "POST",
        "/api/v1/users/u-bob/mute",
        Some(json!({ "seconds": 60 })),
    )
    .await;
    assert_eq!(status, 200);
    assert!(body["muted_until_ms"].as_u64().is_some());
    bob.send(C::Chat(pb::SendChat {
        text: "hello?".into(),
    }))
    .await;
    let text = bob.expect_error(pb::ErrorCode::Muted).await;
    assert!(text.contains("60 s"), "{text}");
    // Ada's chat still goes through, and is the first chat Ada sees.
    ada.send(C::Chat(pb::SendChat { text: "hi".into() })).await;
    let first = ada
        .until(|m| match &m.body {
            Some(S::Chat(c)) => Some(c.text.clone()),
            _ => None,
        })
        .await;
    assert_eq!(first, "hi");
    let (status, _) = api(&server, "DELETE", "/api/v1/users/u-bob/mute", None).await;
    assert_eq!(status, 200);
    bob.send(C::Chat(pb::SendChat {
        text: "back".into(),
    }))
    .await;
    let back = ada
        .until(|m| match &m.body {
            Some(S::Chat(c)) => Some(c.text.clone()),
            _ => None,
        })
        .await;
    assert_eq!(back, "back");
    server.stop().await;
}

#[tokio::test]
async fn system_messages_reach_a_room_or_one_user() {
    let files = Files::new("api-tell");
    let server = api_server(&files).await;
    let (mut ada, _) = member(&server, "lobby", "Ada", "u-ada").await;
    let (mut bob, _) = member(&server, "lobby", "Bob", "u-bob").await;
    let system = |m: &pb::ServerMessage| match &m.body {
        Some(S::System(s)) => Some((s.text.clone(), s.direct)),
        _ => None,
    };
    let (status, body) = api(
        &server,
        "POST",
        "/api/v1/rooms/lobby/messages",
        Some(json!({ "text": "Doors close in 5 minutes." })),
    )
    .await;
    assert_eq!((status, body), (200, json!({ "delivered": 2 })));
    for c in [&mut ada, &mut bob] {
        assert_eq!(
            c.until(system).await,
            ("Doors close in 5 minutes.".into(), false)
        );
    }
    let (status, body) = api(
        &server,
        "POST",
        "/api/v1/users/u-bob/messages",
        Some(json!({ "text": "Only for you." })),
    )
    .await;
    assert_eq!((status, body), (200, json!({ "delivered": 1 })));
    assert_eq!(bob.until(system).await, ("Only for you.".into(), true));
    // Ada got nothing more: her next message is the pong.
    ada.send(C::Ping(pb::Ping { client_time_ms: 7 })).await;
    assert!(matches!(ada.recv().await.body, Some(S::Pong(_))));
    let (status, body) = api(
        &server,
        "POST",
        "/api/v1/users/u-nobody/messages",
        Some(json!({ "text": "x" })),
    )
    .await;
    assert_eq!((status, code(&body)), (404, "user_not_found"));
    for bad in [
        json!({ "text": "" }),
        json!({ "text": "a\u{0007}b" }),
        json!({ "text": "x".repeat(1_001) }),
    ] {
        let (status, _) = api(&server, "POST", "/api/v1/rooms/lobby/messages", Some(bad)).await;
        assert_eq!(status, 400);
    }
    // Not JSON.
    let raw = format!(
        "POST /api/v1/rooms/lobby/messages HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {KEY}\r\n\
         Content-Type: text/plain\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi",
        server.addr
    );
    assert!(server.request(&raw).await.starts_with("HTTP/1.1 415"));
    server.stop().await;
}

#[tokio::test]
async fn closing_a_room_takes_everyone_out() {
    let files = Files::new("api-close");
    let server = api_server(&files).await;
    let (mut ada, _) = member(&server, "lobby", "Ada", "u-ada").await;
    let (mut bob, _) = member(&server, "lobby", "Bob", "u-bob").await;
    let (status, body) = api(&server, "DELETE", "/api/v1/rooms/lobby", None).await;
    assert_eq!(status, 200);
    assert_eq!(body["closed"].as_array().map(Vec::len), Some(2));
    for c in [&mut ada, &mut bob] {
        c.until(|m| match &m.body {
            Some(S::Error(e)) if e.code == pb::ErrorCode::RoomClosed as i32 => Some(()),
            _ => None,
        })
        .await;
        assert_eq!(c.expect_close().await, 4006);
    }
    let (status, body) = api(&server, "DELETE", "/api/v1/rooms/lobby", None).await;
    assert_eq!((status, code(&body)), (404, "room_not_found"));
    assert_eq!(
        api(&server, "GET", "/api/v1/rooms", None).await.1,
        json!({ "rooms": [] })
    );
    server.stop().await;
}

#[tokio::test]
async fn every_operation_answers_as_the_openapi_document_says() {
    let files = Files::new("api-openapi");
    let server = api_server(&files).await;
    let (_ada, _) = member(&server, "lobby", "Ada", "u-ada").await;
    let (_bob, _) = member(&server, "lobby", "Bob", "u-bob").await;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/api/openapi_check.py");
    let document = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/api/openapi.json");
    let out = tokio::process::Command::new("/usr/bin/python3")
        .arg(&script)
        .arg(format!("http://{}", server.addr))
        .args([KEY, "lobby", "u-bob"])
        .arg(&document)
        .output();
    let out = within("the OpenAPI check", out)
        .await
        .expect("/usr/bin/python3 runs (apt install python3 python3-jsonschema)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the OpenAPI check failed (apt install python3-jsonschema if it is missing):\n{stdout}\n{stderr}"
    );
    assert!(
        stdout.contains("every operation answers as the document says"),
        "{stdout}"
    );
    server.stop().await;
}

/// A node of a two-node cluster with tokens and the API key.
async fn api_node(nats: &Nats, i: u32, files: &Files) -> Node {
    let secret = files.write("secret", b"integration-test-secret-of-more-than-32-bytes");
    let key = files.write("api.key", KEY.as_bytes());
    let (secret, key) = (secret.display().to_string(), key.display().to_string());
    Node::start(
        nats,
        i,
        &["--auth-hs256-secret-file", &secret, "--api-key-file", &key],
    )
    .await
}

async fn member_on(node: &Node, room: &str, name: &str, sub: &str) -> (Client, pb::Welcome) {
    let mut c = Client::connect(&node.ws_url()).await;
    let w = join_with(&mut c, room, name, &token(&claims(sub))).await;
    (c, w)
}

#[tokio::test]
async fn in_a_cluster_every_call_works_on_any_node_and_acts_where_the_member_is() {
    let files = Files::new("api-cluster");
    let nats = Nats::start().await;
    let mut n1 = api_node(&nats, 1, &files).await;
    let n2 = api_node(&nats, 2, &files).await;
    has_peers(&n1, 1).await;
    has_peers(&n2, 1).await;
    let (mut ada, wa) = member_on(&n1, "lobby", "Ada", "u-ada").await;
    let (mut bob, wb) = member_on(&n2, "lobby", "Bob", "u-bob").await;
    ada.until(|m| match &m.body {
        Some(S::Joined(j)) if j.member.as_ref().is_some_and(|m| m.id == wb.member_id) => Some(()),
        _ => None,
    })
    .await;
    // Listed through either node, each member with its node.
    for node in [&n1, &n2] {
        let (status, page) = api_at(
            node.addr,
            "GET",
            "/api/v1/rooms/lobby/members",
            None,
            Some(KEY),
        )
        .await;
        assert_eq!(status, 200);
        let seen: Vec<(u64, String)> = page["members"]
            .as_array()
            .expect("members")
            .iter()
            .map(|m| {
                (
                    m["id"].as_u64().unwrap_or(u64::MAX),
                    m["node"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect();
        let mut want = vec![
            (u64::from(wa.member_id), "n1".to_owned()),
            (u64::from(wb.member_id), "n2".to_owned()),
        ];
        want.sort();
        assert_eq!(seen, want);
    }
    let (_, user) = api_at(n1.addr, "GET", "/api/v1/users/u-bob", None, Some(KEY)).await;
    assert_eq!(user["members"][0]["node"], "n2");
    // A room message through n2 reaches both nodes' members.
    let (status, body) = api_at(
        n2.addr,
        "POST",
        "/api/v1/rooms/lobby/messages",
        Some(json!({ "text": "hello all" })),
        Some(KEY),
    )
    .await;
    assert_eq!((status, body), (200, json!({ "delivered": 2 })));
    for c in [&mut ada, &mut bob] {
        c.until(|m| matches!(&m.body, Some(S::System(s)) if s.text == "hello all").then_some(()))
            .await;
    }
    // Bob is on n2; the kick goes through n1.
    let (status, body) = api_at(
        n1.addr,
        "POST",
        "/api/v1/rooms/lobby/kick",
        Some(json!({ "member_id": wb.member_id, "reason": "off topic" })),
        Some(KEY),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["kicked"][0]["node"], "n2");
    bob.expect_error(pb::ErrorCode::Kicked).await;
    assert_eq!(bob.expect_close().await, 4004);
    assert_eq!(
        left_reason(&mut ada, wb.member_id).await,
        pb::LeaveReason::Kicked as i32
    );
    // A ban made through n1 outlives n1: the restarted n1 learns it from n2.
    let (status, _) = api_at(
        n1.addr,
        "POST",
        "/api/v1/users/u-carl/ban",
        Some(json!({ "seconds": 600, "reason": "spam" })),
        Some(KEY),
    )
    .await;
    assert_eq!(status, 200);
    n1.kill().await;
    n1.restart().await;
    has_peers(&n1, 1).await;
    n1.log()
        .wait_for(Duration::from_secs(10), "the bans learnt", |line| {
            line.contains("learnt the bans and mutes").then_some(())
        })
        .await;
    let mut carl = Client::connect(&n1.ws_url()).await;
    send_join(&mut carl, "lobby", "Carl", &token(&claims("u-carl"))).await;
    carl.expect_error(pb::ErrorCode::Banned).await;
    // Closing the room through n2 takes out Ada's new self on n1.
    let (mut ada, _) = member_on(&n1, "lobby", "Ada", "u-ada").await;
    let (status, body) = api_at(n2.addr, "DELETE", "/api/v1/rooms/lobby", None, Some(KEY)).await;
    assert_eq!(status, 200, "{body}");
    ada.until(|m| match &m.body {
        Some(S::Error(e)) if e.code == pb::ErrorCode::RoomClosed as i32 => Some(()),
        _ => None,
    })
    .await;
    assert_eq!(ada.expect_close().await, 4006);
}

/// A member's `Joined` (by id), or its `Left` (id and reason), as a watcher
/// reads them.
fn join_or_leave(m: &pb::ServerMessage) -> Option<(char, u32, i32)> {
    match &m.body {
        Some(S::Joined(j)) => j.member.as_ref().map(|m| ('j', m.id, 0)),
        Some(S::Left(l)) => Some(('l', l.member_id, l.reason)),
        _ => None,
    }
}

/// One avatar per user across nodes (issue 18): the same `sub` joining on
/// n2 while its member is on n1 replaces it everywhere, as on one node
/// (`Left{REPLACED}` then `Joined` for watchers on both nodes, close 4000
/// for the older connection); another user's token cannot take a place
/// through another node with a stolen resume token.
#[tokio::test]
async fn in_a_cluster_one_user_is_one_avatar_on_any_node() {
    let files = Files::new("api-one-avatar");
    let nats = Nats::start().await;
    let n1 = api_node(&nats, 1, &files).await;
    let n2 = api_node(&nats, 2, &files).await;
    has_peers(&n1, 1).await;
    has_peers(&n2, 1).await;
    let (mut w1, _) = member_on(&n1, "lobby", "W1", "u-w1").await;
    let (mut w2, ww2) = member_on(&n2, "lobby", "W2", "u-w2").await;
    w1.until(|m| join_or_leave(m).filter(|j| j.1 == ww2.member_id))
        .await;
    let (mut ada, wa) = member_on(&n1, "lobby", "Ada", "u-ada").await;
    w2.until(|m| join_or_leave(m).filter(|j| j.1 == wa.member_id))
        .await;

    // A stolen resume token, shown by another user through n2, takes nothing.
    let mut eve = Client::connect(&n2.ws_url()).await;
    eve.send(C::Join(pb::Join {
        room: "lobby".into(),
        name: "Eve".into(),
        token: token(&claims("u-eve")),
        resume_token: wa.resume_token.clone(),
        ..Default::default()
    }))
    .await;
    let we = eve.welcome().await;
    assert!(!we.resumed);
    w1.until(|m| join_or_leave(m).filter(|j| j.1 == we.member_id))
        .await;

    // Ada again, through n2: the one on n1 is replaced.
    let (_ada2, wa2) = member_on(&n2, "lobby", "Ada", "u-ada").await;
    assert!(!wa2.resumed);
    assert_eq!(ada.expect_close().await, 4000);
    for watcher in [&mut w1, &mut w2] {
        let left = watcher
            .until(|m| join_or_leave(m).filter(|j| j.1 == wa.member_id))
            .await;
        assert_eq!(
            left,
            ('l', wa.member_id, pb::LeaveReason::Replaced as i32),
            "the older Ada leaves, REPLACED"
        );
        let joined = watcher
            .until(|m| join_or_leave(m).filter(|j| j.1 == wa2.member_id))
            .await;
        assert_eq!(joined.0, 'j');
    }
    // Nobody else came or went: one Ada, on n2.
    let (_, page) = api_at(n1.addr, "GET", "/api/v1/users/u-ada", None, Some(KEY)).await;
    assert_eq!(page["members"].as_array().map(Vec::len), Some(1), "{page}");
}
