//! The SDK under Node (issue #19): `web/test/node/join.mjs` joins a room
//! through `web/amble.js` with Node's own WebSocket, next to a Rust client,
//! and hears its chat; and against a port where nothing listens it ends
//! `closed` instead of staying `connecting`. The same script joins through
//! the package (`web/` packed by npm, installed as `@amble/client`), whose
//! TypeScript declarations are checked with tsc.

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
    converse(&mut child, &mut ada, "Nodey", "hello node").await;
    server.stop().await;
}

/// `child` (join.mjs, joined as `name`) prints its Welcome with Ada in the
/// room, Ada sees it join, Ada's chat `text` reaches it, and it exits well.
async fn converse(child: &mut tokio::process::Child, ada: &mut Client, name: &str, text: &str) {
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let welcome = within("the script's Welcome", lines.next_line())
        .await
        .expect("read")
        .expect("a line");
    assert_eq!(
        welcome,
        format!(r#"{{"welcome":{{"me":"{name}","members":["Ada","{name}"]}}}}"#)
    );
    ada.until(|m| match &m.body {
        Some(S::Joined(j)) => j.member.as_ref().filter(|m| m.name == name).map(drop),
        _ => None,
    })
    .await;
    ada.send(C::Chat(pb::SendChat { text: text.into() })).await;
    let chat = within("the script's chat line", lines.next_line())
        .await
        .expect("read")
        .expect("a line");
    assert_eq!(
        chat,
        format!(r#"{{"chat":{{"from":"Ada","text":"{text}"}}}}"#)
    );
    let status = within("the script to exit", child.wait())
        .await
        .expect("wait");
    assert!(status.success(), "{status}");
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

/// `web/` packed and installed as `@amble/client` in a fresh directory that
/// is an ES module app (`"type": "module"`).
fn installed_app() -> (tempfile::TempDir, testkit::package::Installed) {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("package.json"),
        r#"{ "name": "an-app", "private": true, "type": "module" }"#,
    )
    .expect("the app's package.json");
    let installed = testkit::package::install(dir.path());
    (dir, installed)
}

/// The package holds the SDK, its declarations and the bundle, and nothing
/// of the demo app or the tests; its TypeScript declarations take
/// web/test/types/usage.ts under `tsc --strict` (Debian's node-typescript),
/// imported by the package's name and its subpaths, and refuse the misuses
/// it marks with @ts-expect-error.
#[test]
fn the_packed_package_holds_the_sdk_and_its_types_check() {
    let (dir, installed) = installed_app();
    let version = env!("CARGO_PKG_VERSION");
    let mut want = vec![
        "LICENSE-APACHE".to_owned(),
        "LICENSE-MIT".into(),
        "README.md".into(),
        "amble.d.ts".into(),
        "amble.js".into(),
        "codec.d.ts".into(),
        "codec.js".into(),
        format!("dist/amble-{version}.d.ts"),
        format!("dist/amble-{version}.js"),
        "member.d.ts".into(),
        "member.js".into(),
        "package.json".into(),
    ];
    want.sort();
    assert_eq!(installed.files, want);
    let usage = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("web/test/types/usage.ts");
    std::fs::copy(&usage, dir.path().join("usage.ts")).expect("copy usage.ts");
    let out = std::process::Command::new("tsc")
        .args([
            "--noEmit",
            "--strict",
            "--module",
            "nodenext",
            "--moduleResolution",
            "nodenext",
            "--target",
            "es2022",
            "--lib",
            "es2022,dom",
            "usage.ts",
        ])
        .current_dir(dir.path())
        .output()
        .expect("tsc: scripts/test installs Debian's node-typescript; run `apt-get install node-typescript`");
    assert!(
        out.status.success(),
        "tsc --strict over web/test/types/usage.ts:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The installed package by name: join.mjs, its import changed from the
/// plain file to `@amble/client`, joins a room on a real server beside a
/// Rust client and hears its chat; the bundle imported by its subpath
/// names its version and revision, the server's.
#[tokio::test]
async fn the_installed_package_joins_by_name() {
    let (dir, _installed) = installed_app();
    let script = std::fs::read_to_string(script()).expect("join.mjs");
    let plain = "from '../../amble.js';";
    assert!(script.contains(plain), "join.mjs imports {plain}");
    let by_name = dir.path().join("join.mjs");
    std::fs::write(&by_name, script.replace(plain, "from '@amble/client';")).expect("write");
    std::fs::write(
        dir.path().join("versions.mjs"),
        "import { VERSION, PROTOCOL_REVISION } from '@amble/client/bundle';\n\
         import { SUBPROTOCOL } from '@amble/client/codec';\n\
         console.log(JSON.stringify({ VERSION, PROTOCOL_REVISION, SUBPROTOCOL }));\n",
    )
    .expect("write");
    let out = Command::new("node")
        .arg("versions.mjs")
        .current_dir(dir.path())
        .output()
        .await
        .expect("node");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!(
            r#"{{"VERSION":"{}","PROTOCOL_REVISION":{},"SUBPROTOCOL":"amble.v1"}}"#,
            amble::protocol::SERVER_VERSION,
            amble::protocol::PROTOCOL_REVISION
        )
    );

    let server = TestServer::start().await;
    let mut ada = server.client().await;
    // Every Welcome names the server's release and protocol revision.
    let welcome = ada.join("pkg-room", "Ada").await;
    assert_eq!(
        (welcome.server_version.as_str(), welcome.protocol_revision),
        (
            env!("CARGO_PKG_VERSION"),
            amble::protocol::PROTOCOL_REVISION
        )
    );
    let mut child = Command::new("node")
        .arg("--experimental-websocket")
        .arg(&by_name)
        .args([
            &server.url("/ws").replacen("http", "ws", 1),
            "pkg-room",
            "Packed",
        ])
        .current_dir(dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("node");
    converse(&mut child, &mut ada, "Packed", "hello package").await;
    server.stop().await;
}
