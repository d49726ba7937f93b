//! The SDK under Node (issue #19): `web/test/node/join.mjs` joins a room
//! through `web/amble.js` with Node's own WebSocket, next to a Rust client,
//! and hears its chat; and against a port where nothing listens it ends
//! `closed` instead of staying `connecting`.

use std::process::Stdio;
use std::time::Duration;

use amble::protocol::pb::{self, client_message::Body as C, server_message::Body as S};
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::Command;

use crate::support::*;

fn script() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("web/test/node/join.mjs")
}

/// `node --experimental-websocket join.mjs URL ROOM NAME`, its stdout piped.
fn node(url: &str, room: &str, name: &str) -> tokio::process::Child {
    Command::new("node")
        .arg("--experimental-websocket")
        .arg(script())
        .args([url, room, name])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("node (scripts/test installs Debian's nodejs): run `apt-get install nodejs`")
}

#[tokio::test]
async fn a_node_script_joins_with_the_sdk_and_hears_chat() {
    let server = TestServer::start().await;
    let mut ada = server.client().await;
    ada.join("node-room", "Ada").await;
    let mut child = node(
        &server.url("/ws").replacen("http", "ws", 1),
        "node-room",
        "Nodey",
    );
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let welcome = within("the script's Welcome", lines.next_line())
        .await
        .expect("read")
        .expect("a line");
    assert_eq!(
        welcome,
        r#"{"welcome":{"me":"Nodey","members":["Ada","Nodey"]}}"#
    );
    ada.until(|m| match &m.body {
        Some(S::Joined(j)) => j.member.as_ref().filter(|m| m.name == "Nodey").map(drop),
        _ => None,
    })
    .await;
    ada.send(C::Chat(pb::SendChat {
        text: "hello node".into(),
    }))
    .await;
    let chat = within("the script's chat line", lines.next_line())
        .await
        .expect("read")
        .expect("a line");
    assert_eq!(chat, r#"{"chat":{"from":"Ada","text":"hello node"}}"#);
    let status = within("the script to exit", child.wait())
        .await
        .expect("wait");
    assert!(status.success(), "{status}");
    server.stop().await;
}

#[tokio::test]
async fn an_unreachable_server_ends_closed_under_node() {
    // A port that was just free: nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let mut child = node(&format!("ws://127.0.0.1:{port}/ws"), "x", "Nodey");
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .expect("the script ends instead of waiting in `connecting`")
        .expect("wait");
    // join.mjs exits 2 when the socket closed without ever opening.
    assert_eq!(status.code(), Some(2), "{status}");
    let mut stderr = String::new();
    tokio::io::AsyncReadExt::read_to_string(&mut child.stderr.take().expect("stderr"), &mut stderr)
        .await
        .expect("stderr");
    assert!(
        stderr.contains("closed: Can't reach the server."),
        "{stderr}"
    );
}
