//! The `amble` binary itself: it reports its address and stops cleanly on
//! SIGTERM (what Docker sends) and SIGINT.

use std::process::Stdio;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::Command;

use crate::support::*;

/// A running amble binary: its address, and every line it has logged.
pub struct Running {
    pub child: tokio::process::Child,
    pub addr: String,
    pub log: Arc<Mutex<Vec<String>>>,
}

/// Starts `command` (amble, or a shell that execs it) with its log on a
/// pipe, and waits for the line that gives its address.
pub async fn start(mut command: Command) -> Running {
    let mut child = command
        .env("RUST_LOG", "info")
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn amble");
    let stderr = child.stderr.take().expect("stderr");
    let mut lines = BufReader::new(stderr).lines();
    let log = Arc::new(Mutex::new(Vec::new()));
    let addr = within("the listening line", async {
        while let Some(line) = lines.next_line().await.expect("read stderr") {
            log.lock().expect("log").push(line.clone());
            if let Some(rest) = line.split("addr=").nth(1) {
                return rest
                    .split_whitespace()
                    .next()
                    .unwrap_or_default()
                    .to_owned();
            }
        }
        panic!("amble exited without reporting its address");
    })
    .await;
    let keep = Arc::clone(&log);
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            keep.lock().expect("log").push(line);
        }
    });
    Running { child, addr, log }
}

impl Running {
    /// Sends `signal` (`-TERM`, `-INT`) to the process.
    pub async fn signal(&self, signal: &str) {
        let pid = self.child.id().expect("pid").to_string();
        let status = Command::new("kill")
            .args([signal, &pid])
            .status()
            .await
            .expect("kill");
        assert!(status.success());
    }
}

async fn stops_on(signal: &str, extra: &[&str]) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_amble"));
    command.args(["--listen", "127.0.0.1:0"]).args(extra);
    let mut amble = start(command).await;
    let mut client = Client::connect(&format!("ws://{}/ws", amble.addr)).await;
    client.join("lobby", "someone").await;

    amble.signal(signal).await;
    assert_eq!(client.expect_close().await, 1001);
    let exit = within("amble to exit", amble.child.wait())
        .await
        .expect("wait");
    assert!(exit.success(), "exit status {exit}");
}

#[tokio::test]
async fn sigterm_closes_clients_with_1001_and_exits_0() {
    stops_on("-TERM", &[]).await;
}

#[tokio::test]
async fn sigint_does_too_on_a_single_worker() {
    stops_on("-INT", &["--workers", "1"]).await;
}

#[tokio::test]
async fn a_bad_variable_is_named_and_exits_2() {
    let out = within(
        "amble to refuse its address",
        Command::new(env!("CARGO_BIN_EXE_amble"))
            .env("AMBLE_LISTEN", "garbage")
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("run amble");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("AMBLE_LISTEN") && stderr.contains("HOST:PORT"),
        "{stderr}"
    );
}

/// Listening on every interface, the start-up hint gives addresses a user
/// can open, and they work.
#[tokio::test]
async fn every_interface_hints_usable_addresses() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_amble"))
        .env("AMBLE_LISTEN", ":0")
        .env("RUST_LOG", "info")
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn amble");
    let stderr = child.stderr.take().expect("stderr");
    let mut lines = BufReader::new(stderr).lines();
    let line = within("the listening line", async {
        while let Some(line) = lines.next_line().await.expect("read stderr") {
            if line.contains("addr=") {
                return line;
            }
        }
        panic!("amble exited without reporting its address");
    })
    .await;
    assert!(line.contains("addr=0.0.0.0:"), "{line}");
    let urls: Vec<&str> = line
        .split(['`', ' '])
        .filter(|w| w.starts_with("http://") || w.starts_with("ws://"))
        .collect();
    assert_eq!(urls.len(), 2, "{line}");
    for url in &urls {
        assert!(!url.contains("0.0.0.0"), "{line}");
    }
    let mut client = Client::connect(urls[1]).await;
    client.join("lobby", "someone").await;
}
