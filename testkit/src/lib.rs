//! amble's test harness: [`TestServer`] runs `amble::serve` in the test's
//! runtime on `127.0.0.1:0` (no fixed ports), gives its address and URLs,
//! and stops it within a bound: on [`TestServer::stop`], or (without
//! waiting) when dropped. Every wait here goes through [`within`].
//!
//! The integration tests (`tests/it`), the browser tests (`tests/browser`,
//! and the `crowd` example that shares their driver) and the load tester's
//! smoke (`loadtest/tests/smoke.rs`) all start amble through it; each adds
//! its own clients (they use different WebSocket crates) on top.
//!
//! It is a crate of its own, not a file included with `#[path]`, so that it
//! compiles once, needs no `#[allow(dead_code)]` in the tests that use part
//! of it, and depends on nothing but amble and tokio.

pub mod package;

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use amble::config::Config;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// How long one wait of the harness may take (a start, a stop, a request,
/// the cluster forming).
pub const WAIT: Duration = Duration::from_secs(10);

/// Resolves with `fut`'s value, or panics after `limit` saying what did not
/// happen.
pub async fn within<T>(limit: Duration, what: &str, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(limit, fut).await {
        Ok(v) => v,
        Err(_) => panic!("timed out after {limit:?} waiting for {what}"),
    }
}

/// Sends `raw` as the whole request to `addr` and returns the whole
/// response, read (within [`WAIT`]) until the server closes the connection.
///
/// Connecting and writing to loopback complete at once; only the reads are
/// bounded, so tests on paused time (`start_paused`) see the same waits as
/// on real time.
pub async fn request_at(addr: SocketAddr, raw: &str) -> String {
    let mut tcp = TcpStream::connect(addr).await.expect("connect");
    tcp.write_all(raw.as_bytes()).await.expect("write");
    let mut out = Vec::new();
    within(WAIT, "an HTTP response", tcp.read_to_end(&mut out))
        .await
        .expect("read");
    String::from_utf8_lossy(&out).into_owned()
}

/// The amble server in-process, until [`TestServer::stop`] or drop.
pub struct TestServer {
    /// Where it listens (127.0.0.1 and the port the system gave).
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), amble::StartError>>>,
    /// What `serve_started` hands over once the server accepts connections;
    /// taken on the first wait for it.
    started: Option<oneshot::Receiver<amble::Started>>,
    running: Option<amble::Started>,
}

impl TestServer {
    /// The default config on a free port.
    pub async fn start() -> Self {
        Self::with(Config::default()).await
    }

    /// `config` on a free port of 127.0.0.1.
    pub async fn with(config: Config) -> Self {
        Self::at(SocketAddr::from(([127, 0, 0, 1], 0)), config).await
    }

    /// `config` on `addr`: a restart on the address clients already know
    /// (the port an earlier [`TestServer`] was given).
    pub async fn at(addr: SocketAddr, config: Config) -> Self {
        let listener = TcpListener::bind(addr)
            .await
            .unwrap_or_else(|err| panic!("bind {addr}: {err}"));
        let addr = listener.local_addr().expect("local address");
        let (stop, stopped) = oneshot::channel();
        let (report, started) = oneshot::channel();
        let shutdown = async {
            let _ = stopped.await;
        };
        let task = tokio::spawn(amble::serve_started(listener, config, shutdown, |s| {
            let _ = report.send(s);
        }));
        Self {
            addr,
            stop: Some(stop),
            task: Some(task),
            started: Some(started),
            running: None,
        }
    }

    /// `http://<addr><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// `ws://<addr>/ws`, where clients connect.
    pub fn ws_url(&self) -> String {
        format!("ws://{}/ws", self.addr)
    }

    /// Waits (within [`WAIT`]) until this node sees `n` other cluster nodes,
    /// the count `amble_cluster_peers` shows: awaited in-process, not polled.
    pub async fn until_peers(&mut self, n: usize) {
        let started = match &mut self.running {
            Some(started) => started,
            None => {
                let receiver = self.started.take().expect("the server is running");
                let started = within(WAIT, "the server to start", receiver)
                    .await
                    .expect("the server started (did serve fail? stop() says why)");
                self.running.insert(started)
            }
        };
        let what = format!("this node to see {n} peers");
        assert!(
            within(WAIT, &what, started.peers(n)).await,
            "a node out of cluster mode, or its link stopped, never sees {n} peers"
        );
    }

    /// `GET path`, returning the status line and body.
    pub async fn get(&self, path: &str) -> (String, String) {
        // The Host a client of this address sends (a server on loopback
        // answers only for local names, see `--allowed-hosts`).
        let req = format!(
            "GET {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            self.addr
        );
        let text = self.request(&req).await;
        let (head, body) = text.split_once("\r\n\r\n").expect("http response");
        (
            head.lines().next().unwrap_or_default().to_owned(),
            body.to_owned(),
        )
    }

    /// Sends `raw` as the whole request and returns the whole response (the
    /// request should ask for `Connection: close`).
    pub async fn request(&self, raw: &str) -> String {
        request_at(self.addr, raw).await
    }

    /// Sends `raw` and returns the response head (status line and headers),
    /// leaving the connection open, as for an upgrade.
    pub async fn request_head(&self, raw: &str) -> String {
        let mut tcp = TcpStream::connect(self.addr).await.expect("connect");
        tcp.write_all(raw.as_bytes()).await.expect("write");
        let mut out = Vec::new();
        let mut buf = [0u8; 1024];
        while !out.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = within(WAIT, "a response head", tcp.read(&mut buf))
                .await
                .expect("read");
            assert!(n > 0, "closed before the head ended");
            assert!(out.len() < 16 * 1024, "head too long");
            out.extend_from_slice(&buf[..n]);
        }
        String::from_utf8_lossy(&out).into_owned()
    }

    /// The value of one metric line (exact name and labels) in `/metrics`
    /// (0 when the line is absent).
    pub async fn metric(&self, series: &str) -> f64 {
        let (_, body) = self.get("/metrics").await;
        body.lines()
            .find_map(|l| l.strip_prefix(series).and_then(|v| v.strip_prefix(' ')))
            .map_or(0.0, |v| v.trim().parse().expect("a number"))
    }

    /// Reads `/metrics` until `series` satisfies `done`, each read awaiting
    /// the server's answer (nothing spins between them), within [`WAIT`];
    /// returns the value. For what a client cannot see happen: a gauge
    /// that falls just after a connection's task ends.
    pub async fn until_metric(&self, series: &str, done: impl Fn(f64) -> bool) -> f64 {
        within(WAIT, &format!("{series} to settle"), async {
            loop {
                let value = self.metric(series).await;
                if done(value) {
                    return value;
                }
            }
        })
        .await
    }

    /// Triggers shutdown and waits (within [`WAIT`]) for `serve` to return,
    /// which must be a clean stop.
    pub async fn stop(mut self) {
        self.trigger_stop();
        self.stopped().await;
    }

    /// Triggers shutdown without waiting; [`TestServer::stopped`] waits.
    pub fn trigger_stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }

    /// Waits (within [`WAIT`]) for `serve` to return, and asserts it
    /// returned `Ok`.
    pub async fn stopped(mut self) {
        let task = self.task.take().expect("running");
        let result = within(WAIT, "the server to shut down", task)
            .await
            .expect("the server task");
        if let Err(err) = result {
            panic!("the server did not stop cleanly: {err}");
        }
    }
}

impl Drop for TestServer {
    /// Triggers shutdown; the server finishes in the background, or with
    /// the test's runtime.
    fn drop(&mut self) {
        self.trigger_stop();
    }
}
