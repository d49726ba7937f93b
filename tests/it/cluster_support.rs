//! Processes for the cluster tests: a real `nats-server` on ephemeral ports
//! and `amble` nodes as child processes of the test.
//!
//! - [`Nats::start`] runs `nats-server -a 127.0.0.1 -p -1 -m -1` and reads
//!   its client and monitoring ports from its log; [`Nats::stop`] and
//!   [`Nats::restart`] take it away and bring it back on the same ports.
//! - [`Node::start`] runs the `amble` binary on `127.0.0.1:0` with
//!   `--nats`, `--node-name NAME --node-slot SLOT` (or without `--nats`), and
//!   reads its address from the `addr=` field of its start line. A node can
//!   be killed (`SIGKILL`), frozen (`SIGSTOP`) and thawed (`SIGCONT`), stopped
//!   gracefully (`SIGTERM`) and started again under the same name.
//! - Every process is killed when its value is dropped (also when a test
//!   panics), every wait is bounded, and each process's stderr is kept: when
//!   a test fails, the logs of every process it started are printed.
//!
//! This file depends on nothing else in `tests/it`, so the browser test
//! includes it too (`#[path]`).

use std::net::SocketAddr;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt as _, AsyncRead, AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};
use tokio::sync::watch;
use tokio::time::Instant;

/// How long a process may take to start and say where it listens (slow
/// when the machine is busy with other tests).
pub const START: Duration = Duration::from_secs(20);
/// How long a single condition in a cluster test may take to come true.
pub const SETTLE: Duration = Duration::from_secs(15);
/// How often a polled condition (an HTTP figure) is read again.
const POLL: Duration = Duration::from_millis(50);
/// Most log lines kept per process (the rest are counted, not kept).
const LOG_LINES: usize = 20_000;

/// What to do when nats-server is missing.
const INSTALL_NATS: &str = "the cluster tests need a nats-server: `scripts/test` installs \
    Debian's (`apt-get install nats-server`, which puts it in /usr/sbin); these tests never skip";

/// Resolves with `fut`'s value, or panics after `limit` saying what did not
/// happen.
pub async fn bounded<T>(limit: Duration, what: &str, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(limit, fut).await {
        Ok(v) => v,
        Err(_) => panic!("timed out after {limit:?} waiting for {what}"),
    }
}

/// Polls `check` until it returns `Some`, for at most `limit`; panics with
/// `what` and the last thing `check` said.
pub async fn poll<T, F>(limit: Duration, what: &str, mut check: impl FnMut() -> F) -> T
where
    F: Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + limit;
    loop {
        let last = match tokio::time::timeout_at(deadline, check()).await {
            Ok(Ok(v)) => return v,
            Ok(Err(last)) => last,
            Err(_) => "no answer in time".to_owned(),
        };
        if Instant::now() + POLL >= deadline {
            panic!("timed out after {limit:?} waiting for {what}; last: {last}");
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Waits until `series` in `node`'s `/metrics` reads `want` (figures that
/// follow another node's messages settle a moment after a client sees them).
pub async fn metric_is(node: &Node, series: &str, want: f64) {
    poll(
        SETTLE,
        &format!("{} {series} to be {want}", node.name),
        || async {
            match node.metric(series).await {
                Some(v) if v == want => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
}

/// Waits until `node` counts `n` peers.
pub async fn has_peers(node: &Node, n: usize) {
    metric_is(node, "amble_cluster_peers", n as f64).await;
}

// ---------------------------------------------------------------------- logs

/// The stderr of one process, line by line, as it arrives.
#[derive(Clone)]
pub struct Log(Arc<LogInner>);

struct LogInner {
    label: String,
    lines: Mutex<Lines>,
    /// Lines read so far, and whether the stream has ended.
    grew: watch::Sender<(usize, bool)>,
}

#[derive(Default)]
struct Lines {
    kept: Vec<String>,
    dropped: usize,
}

impl Log {
    fn new(label: String) -> Self {
        Self(Arc::new(LogInner {
            label,
            lines: Mutex::new(Lines::default()),
            grew: watch::Sender::new((0, false)),
        }))
    }

    /// Reads `stream` into this log until it ends.
    fn follow(&self, stream: impl AsyncRead + Unpin + Send + 'static) {
        let log = self.clone();
        tokio::spawn(async move {
            let mut reader = tokio::io::BufReader::new(stream);
            let mut buf = Vec::new();
            loop {
                buf.clear();
                match reader.read_until(b'\n', &mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        let line = String::from_utf8_lossy(&buf).trim_end().to_owned();
                        log.push(line);
                    }
                }
            }
            log.0.grew.send_modify(|(_, ended)| *ended = true);
        });
    }

    fn push(&self, line: String) {
        let mut lines = self.0.lines.lock().expect("log lock");
        if lines.kept.len() < LOG_LINES {
            lines.kept.push(line);
        } else {
            lines.dropped += 1;
        }
        let n = lines.kept.len() + lines.dropped;
        drop(lines);
        self.0.grew.send_modify(|(count, _)| *count = n);
    }

    /// Every line kept so far.
    pub fn lines(&self) -> Vec<String> {
        self.0.lines.lock().expect("log lock").kept.clone()
    }

    /// The lines that contain `needle`.
    pub fn matching(&self, needle: &str) -> Vec<String> {
        self.lines()
            .into_iter()
            .filter(|l| l.contains(needle))
            .collect()
    }

    /// Waits for a line for which `pick` returns something, and returns
    /// that; panics, with the log, if the process ends first or after
    /// `limit`.
    pub async fn wait_for<T>(
        &self,
        limit: Duration,
        what: &str,
        mut pick: impl FnMut(&str) -> Option<T>,
    ) -> T {
        let mut grew = self.0.grew.subscribe();
        let mut next = 0;
        let deadline = Instant::now() + limit;
        loop {
            let (_, ended) = *grew.borrow_and_update();
            {
                let lines = self.0.lines.lock().expect("log lock");
                for line in &lines.kept[next.min(lines.kept.len())..] {
                    if let Some(found) = pick(line) {
                        return found;
                    }
                }
                next = lines.kept.len();
            }
            if ended {
                panic!(
                    "{} ended before {what}; its log:\n{}",
                    self.0.label,
                    self.text()
                );
            }
            if tokio::time::timeout_at(deadline, grew.changed())
                .await
                .is_err()
            {
                panic!(
                    "{}: timed out after {limit:?} waiting for {what} (its log is printed below)",
                    self.0.label
                );
            }
        }
    }

    /// Waits until the stream has ended (the process closed its stderr).
    pub async fn ended(&self, limit: Duration) {
        let mut grew = self.0.grew.subscribe();
        bounded(
            limit,
            &format!("the end of {}'s stderr", self.0.label),
            grew.wait_for(|(_, ended)| *ended),
        )
        .await
        .expect("the log's sender lives with the log");
    }

    /// The whole log as one string, for failure messages.
    pub fn text(&self) -> String {
        let lines = self.0.lines.lock().expect("log lock");
        let mut text = lines.kept.join("\n");
        if lines.dropped > 0 {
            text.push_str(&format!("\n({} more lines not kept)", lines.dropped));
        }
        text
    }

    /// Prints the log to the test's output (shown when the test fails).
    fn dump(&self) {
        eprintln!(
            "------- stderr of {} -------\n{}\n------- end of {} -------",
            self.0.label,
            self.text(),
            self.0.label
        );
    }
}

// ----------------------------------------------------------------- processes

/// One child process with its stderr in a [`Log`]; killed on drop.
struct Proc {
    child: Child,
    pid: rustix::process::Pid,
    log: Log,
}

impl Proc {
    fn spawn(command: &mut Command, label: String) -> std::io::Result<Self> {
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let pid = child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .and_then(rustix::process::Pid::from_raw)
            .expect("a running child has a pid");
        let log = Log::new(label);
        log.follow(child.stderr.take().expect("piped stderr"));
        Ok(Self { child, pid, log })
    }

    fn signal(&self, signal: rustix::process::Signal) {
        rustix::process::kill_process(self.pid, signal)
            .unwrap_or_else(|err| panic!("signal {signal:?} to {:?}: {err}", self.pid));
    }

    /// SIGKILL (a stopped process dies too), then reaps it.
    async fn kill(&mut self) {
        let _ = self.child.start_kill();
        bounded(START, "a killed process to be reaped", self.child.wait())
            .await
            .expect("wait for a killed process");
    }

    async fn exited(&mut self, limit: Duration, what: &str) -> ExitStatus {
        bounded(limit, what, self.child.wait())
            .await
            .expect("wait for the process")
    }
}

// ---------------------------------------------------------------------- http

/// `GET path` from `addr` over HTTP/1.0 (the body ends with the connection):
/// the status line and the body.
pub async fn http_get(addr: SocketAddr, path: &str) -> (String, String) {
    let fetch = async {
        let mut tcp = TcpStream::connect(addr)
            .await
            .unwrap_or_else(|err| panic!("connect to {addr} for GET {path}: {err}"));
        let req = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n");
        tcp.write_all(req.as_bytes()).await.expect("write request");
        let mut raw = Vec::new();
        tcp.read_to_end(&mut raw).await.expect("read response");
        raw
    };
    let raw = bounded(SETTLE, &format!("GET {path} from {addr}"), fetch).await;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("GET {path} from {addr}: not an HTTP response: {text:?}"));
    (
        head.lines().next().unwrap_or_default().to_owned(),
        body.to_owned(),
    )
}

// ---------------------------------------------------------------------- nats

/// A `nats-server` on 127.0.0.1, on ports it picked itself.
pub struct Nats {
    proc: Option<Proc>,
    /// Where clients connect.
    pub client: SocketAddr,
    /// The HTTP monitoring endpoint (`/connz`, `/subsz`, ...).
    pub monitor: SocketAddr,
    /// One log per run (a restart starts a new one).
    logs: Vec<Log>,
    /// More nats-server arguments (authentication), kept for restarts.
    extra: Vec<String>,
}

/// The nats-server binary: on the PATH, or Debian's /usr/sbin.
fn nats_server() -> std::path::PathBuf {
    program("nats-server", INSTALL_NATS)
}

/// A program on the PATH or in /usr/sbin, or a panic saying what to install.
pub fn program(name: &str, install: &str) -> std::path::PathBuf {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .chain(["/usr/sbin".into(), "/usr/local/sbin".into()])
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("no `{name}` on the PATH or in /usr/sbin: {install}"))
}

impl Nats {
    /// Starts nats-server on free ports (`-p -1 -m -1`).
    pub async fn start() -> Self {
        Self::start_with(&[]).await
    }

    /// Starts nats-server on free ports with `extra` arguments (for
    /// example `--user U --pass P`: then clients must authenticate).
    pub async fn start_with(extra: &[&str]) -> Self {
        let extra: Vec<String> = extra.iter().map(|a| (*a).to_owned()).collect();
        let (proc, client, monitor) = Self::run("-1", "-1", 1, &extra).await;
        let logs = vec![proc.log.clone()];
        Self {
            proc: Some(proc),
            client,
            monitor,
            logs,
            extra,
        }
    }

    /// `nats://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("nats://{}", self.client)
    }

    async fn run(
        port: &str,
        monitor: &str,
        run: usize,
        extra: &[String],
    ) -> (Proc, SocketAddr, SocketAddr) {
        let mut proc = Proc::spawn(
            Command::new(nats_server())
                .args(["-a", "127.0.0.1", "-p", port, "-m", monitor])
                .args(extra),
            format!("nats-server (run {run})"),
        )
        .unwrap_or_else(|err| panic!("cannot start nats-server: {err}; {INSTALL_NATS}"));
        fn addr_after(line: &str, marker: &str) -> Option<SocketAddr> {
            line.split_once(marker)?.1.trim().parse().ok()
        }
        let monitor = proc
            .log
            .wait_for(START, "nats-server's monitoring port", |l| {
                addr_after(l, "Starting http monitor on ")
            })
            .await;
        let client = proc
            .log
            .wait_for(START, "nats-server's client port", |l| {
                addr_after(l, "Listening for client connections on ")
            })
            .await;
        proc.log
            .wait_for(START, "nats-server to be ready", |l| {
                l.contains("Server is ready").then_some(())
            })
            .await;
        if let Ok(Some(status)) = proc.child.try_wait() {
            panic!("nats-server exited ({status}):\n{}", proc.log.text());
        }
        (proc, client, monitor)
    }

    /// Kills nats-server (SIGKILL): every client loses its connection.
    pub async fn stop(&mut self) {
        if let Some(mut proc) = self.proc.take() {
            proc.kill().await;
        }
    }

    /// Starts nats-server again on the same client and monitoring ports.
    /// Retries for a few seconds if the port is not free yet.
    pub async fn restart(&mut self) {
        assert!(self.proc.is_none(), "restart after stop");
        let port = self.client.port().to_string();
        let monitor = self.monitor.port().to_string();
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let run = self.logs.len() + 1;
            let attempt = tokio::spawn({
                let (port, monitor, extra) = (port.clone(), monitor.clone(), self.extra.clone());
                async move { Self::run(&port, &monitor, run, &extra).await }
            })
            .await;
            match attempt {
                Ok((proc, client, mon)) => {
                    assert_eq!((client, mon), (self.client, self.monitor), "same ports");
                    self.logs.push(proc.log.clone());
                    self.proc = Some(proc);
                    return;
                }
                Err(panicked) if Instant::now() < deadline => {
                    let _ = panicked;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(panicked) => std::panic::resume_unwind(panicked.into_panic()),
            }
        }
    }

    /// `GET path` from the monitoring endpoint, as JSON.
    pub async fn monitor_json(&self, path: &str) -> serde_json::Value {
        let (status, body) = http_get(self.monitor, path).await;
        assert!(status.contains(" 200"), "nats {path}: {status}");
        serde_json::from_str(&body).unwrap_or_else(|err| panic!("nats {path}: {err}: {body}"))
    }

    /// Publishes `payload` on `subject` as a plain NATS client (the text
    /// protocol over TCP) and waits for the server to have taken it.
    pub async fn publish(&self, subject: &str, payload: &[u8]) {
        let client = self.client;
        bounded(SETTLE, &format!("a publish on {subject}"), async {
            let mut tcp = TcpStream::connect(client).await.expect("connect to NATS");
            let mut out = Vec::new();
            out.extend_from_slice(b"CONNECT {\"verbose\":false,\"pedantic\":false}\r\n");
            out.extend_from_slice(format!("PUB {subject} {}\r\n", payload.len()).as_bytes());
            out.extend_from_slice(payload);
            out.extend_from_slice(b"\r\nPING\r\n");
            tcp.write_all(&out).await.expect("write to NATS");
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            while !got.windows(6).any(|w| w == b"PONG\r\n") {
                let n = tcp.read(&mut buf).await.expect("read from NATS");
                assert!(n > 0, "NATS closed: {}", String::from_utf8_lossy(&got));
                got.extend_from_slice(&buf[..n]);
                assert!(
                    !got.windows(4).any(|w| w == b"-ERR"),
                    "{}",
                    String::from_utf8_lossy(&got)
                );
            }
        })
        .await;
    }

    /// Each client connection's subscriptions (`/connz?subs=1`), keyed by
    /// the node that holds it: the connection subscribed to
    /// `{prefix}.v2.n.{node}` (a node's own control subject) is that node's.
    pub async fn subscriptions_by_node(
        &self,
        prefix: &str,
    ) -> std::collections::BTreeMap<String, Vec<String>> {
        let connz = self.monitor_json("/connz?subs=1&limit=1024").await;
        let own = format!("{prefix}.v2.n.");
        let mut by_node = std::collections::BTreeMap::new();
        for conn in connz["connections"].as_array().into_iter().flatten() {
            let subs: Vec<String> = conn["subscriptions_list"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|s| s.as_str().map(str::to_owned))
                .collect();
            if let Some(node) = subs.iter().find_map(|s| s.strip_prefix(&own)) {
                by_node.insert(node.to_owned(), subs.clone());
            }
        }
        by_node
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for log in &self.logs {
                log.dump();
            }
        }
    }
}

// ---------------------------------------------------------------------- node

/// An `amble` process.
pub struct Node {
    /// `--node-name` (also the label in failure output).
    pub name: String,
    /// `--node-slot`.
    pub slot: u32,
    /// Where it serves HTTP and WebSockets (changes on restart).
    pub addr: SocketAddr,
    args: Vec<String>,
    proc: Option<Proc>,
    /// One log per run.
    logs: Vec<Log>,
}

/// Node names and slots, as the tests use them: `n1` has slot 1, ...
pub fn node_name(i: u32) -> String {
    format!("n{i}")
}

impl Node {
    /// Starts `amble --listen 127.0.0.1:0 --nats URL --node-name nI
    /// --node-slot I` plus `extra`, and waits for its address.
    pub async fn start(nats: &Nats, i: u32, extra: &[&str]) -> Self {
        Self::start_as(nats, &node_name(i), i, extra).await
    }

    /// [`Node::start`] under any name and slot.
    pub async fn start_as(nats: &Nats, name: &str, slot: u32, extra: &[&str]) -> Self {
        let mut args: Vec<String> = vec![
            "--nats".into(),
            nats.url(),
            "--node-name".into(),
            name.to_owned(),
            "--node-slot".into(),
            slot.to_string(),
        ];
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        Self::start_with(name.to_owned(), slot, args).await
    }

    /// Starts `amble --nats URL --node-name NAME` plus `extra`, without
    /// `--node-slot` (the slot is claimed), and waits until it joined the
    /// cluster: `slot` is the slot it claimed.
    pub async fn start_unslotted(nats: &Nats, name: &str, extra: &[&str]) -> Self {
        let mut args: Vec<String> = vec![
            "--nats".into(),
            nats.url(),
            "--node-name".into(),
            name.to_owned(),
        ];
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        let mut node = Self::start_with(name.to_owned(), u32::MAX, args).await;
        node.slot = node.joined().await;
        node
    }

    /// Waits for this run's `joined cluster ... (slot S of N)` line: S.
    pub async fn joined(&self) -> u32 {
        self.log()
            .wait_for(START, "the joined-cluster line", |line| {
                line.split_once("joined cluster")?
                    .1
                    .split_once("(slot ")?
                    .1
                    .split_whitespace()
                    .next()?
                    .parse()
                    .ok()
            })
            .await
    }

    /// Runs `amble --listen 127.0.0.1:0` with `args`, which must make it
    /// exit: its exit status and its log.
    pub async fn refused(label: &str, args: &[&str]) -> (ExitStatus, String) {
        let mut command = Command::new(env!("CARGO_BIN_EXE_amble"));
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("AMBLE_") {
                command.env_remove(key);
            }
        }
        command
            .env("RUST_LOG", "info,amble::cluster=debug")
            .args(["--listen", "127.0.0.1:0"])
            .args(args);
        let mut proc = Proc::spawn(&mut command, format!("amble {label}")).expect("spawn amble");
        let status = proc.exited(START, &format!("{label} to exit")).await;
        proc.log.ended(START).await;
        (status, proc.log.text())
    }

    /// Starts amble without `--nats`: a single process, as before clusters.
    pub async fn single(extra: &[&str]) -> Self {
        let args = extra.iter().map(|a| (*a).to_owned()).collect();
        Self::start_with("single".into(), 0, args).await
    }

    async fn start_with(name: String, slot: u32, args: Vec<String>) -> Self {
        let mut node = Self {
            name,
            slot,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            args,
            proc: None,
            logs: Vec::new(),
        };
        node.run().await;
        node
    }

    async fn run(&mut self) {
        assert!(self.proc.is_none(), "{} is already running", self.name);
        let mut command = Command::new(env!("CARGO_BIN_EXE_amble"));
        // Nothing from the environment the test runs in.
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("AMBLE_") {
                command.env_remove(key);
            }
        }
        command
            .env("RUST_LOG", "info,amble::cluster=debug")
            .args(["--listen", "127.0.0.1:0"])
            .args(&self.args);
        let label = format!("amble {} (run {})", self.name, self.logs.len() + 1);
        let proc = Proc::spawn(&mut command, label).expect("spawn amble");
        self.logs.push(proc.log.clone());
        let addr = proc
            .log
            .wait_for(START, "amble's addr= start line", |line| {
                line.split("addr=")
                    .nth(1)?
                    .split_whitespace()
                    .next()?
                    .parse::<SocketAddr>()
                    .ok()
            })
            .await;
        self.addr = addr;
        self.proc = Some(proc);
    }

    /// This run's log.
    pub fn log(&self) -> &Log {
        self.logs.last().expect("started once")
    }

    /// `ws://ADDR/ws`.
    pub fn ws_url(&self) -> String {
        format!("ws://{}/ws", self.addr)
    }

    /// `GET path`: the status line and the body.
    pub async fn get(&self, path: &str) -> (String, String) {
        http_get(self.addr, path).await
    }

    /// The whole `/metrics` text.
    pub async fn metrics(&self) -> String {
        let (status, body) = self.get("/metrics").await;
        assert!(status.contains(" 200"), "{}: /metrics: {status}", self.name);
        body
    }

    /// The value of one series (exact name and labels) in `/metrics`, if
    /// it is there.
    pub async fn metric(&self, series: &str) -> Option<f64> {
        metric_in(&self.metrics().await, series)
    }

    /// `/healthz`: the status line and the body's lines.
    pub async fn healthz(&self) -> (String, Vec<String>) {
        let (status, body) = self.get("/healthz").await;
        (status, body.lines().map(str::to_owned).collect())
    }

    fn proc(&self) -> &Proc {
        self.proc
            .as_ref()
            .unwrap_or_else(|| panic!("{} is not running", self.name))
    }

    /// `kill -9`: gone at once, without a word to anyone.
    pub async fn kill(&mut self) {
        let mut proc = self
            .proc
            .take()
            .unwrap_or_else(|| panic!("{} is not running", self.name));
        proc.kill().await;
    }

    /// SIGSTOP: the process stays, but does nothing until [`Node::thaw`].
    pub fn freeze(&self) {
        self.proc().signal(rustix::process::Signal::STOP);
    }

    /// SIGCONT.
    pub fn thaw(&self) {
        self.proc().signal(rustix::process::Signal::CONT);
    }

    /// Sends SIGTERM (a graceful stop) without waiting for the exit.
    pub fn terminate(&self) {
        self.proc().signal(rustix::process::Signal::TERM);
    }

    /// Waits for the process to exit (after [`Node::terminate`]).
    pub async fn exited(&mut self) -> ExitStatus {
        let mut proc = self
            .proc
            .take()
            .unwrap_or_else(|| panic!("{} is not running", self.name));
        let what = format!("{} to exit", self.name);
        proc.exited(START, &what).await
    }

    /// Starts the node again with the same arguments (same name and slot,
    /// a new port): a new incarnation. It must have been killed or stopped.
    pub async fn restart(&mut self) {
        self.run().await;
    }
}

/// The value of `series` (exact name and labels) in a `/metrics` text.
pub fn metric_in(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.strip_prefix(' ')))
        .map(|v| {
            v.trim()
                .parse()
                .unwrap_or_else(|_| panic!("{series}: not a number: {v}"))
        })
}

impl Drop for Node {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for log in &self.logs {
                log.dump();
            }
        }
        // If frozen, SIGKILL still ends it; kill_on_drop sends it.
    }
}
