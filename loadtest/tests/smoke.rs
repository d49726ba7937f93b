//! The load tester against the real server, started in-process on an
//! ephemeral port: every delivery accounted for, the report consistent, and
//! the truth told when the run goes wrong (the server gone, a signal, a
//! busy server, a full room, the server's ping budget).

use std::process::Stdio;
use std::time::Duration;

use amble::protocol::{self, pb};
use clap::Parser as _;
use futures_util::{SinkExt as _, StreamExt as _};
use loadtest::{Opts, Report};
use prost::Message as _;
use testkit::TestServer;
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::timeout;
use tokio_tungstenite::tungstenite::Message;

/// Bound on any one run in these tests.
const RUN_TIMEOUT: Duration = Duration::from_secs(60);

/// The amble server in-process on 127.0.0.1:0 (the shared harness), with
/// its settings given as the binary's flags.
async fn start(args: &[&str]) -> TestServer {
    let config =
        amble::config::Config::parse_from(std::iter::once("amble").chain(args.iter().copied()));
    TestServer::with(config).await
}

/// A server whose ping budget is off (`--pings-per-sec 0`), as the
/// rpc scenario needs.
async fn without_ping_budget() -> TestServer {
    start(&["--pings-per-sec", "0"]).await
}

fn opts(args: &[&str]) -> Opts {
    Opts::try_parse_from(std::iter::once("loadtest").chain(args.iter().copied())).expect("options")
}

/// Runs the load tester in-process, bounded by `RUN_TIMEOUT`.
async fn run(opts: Opts) -> Report {
    timeout(RUN_TIMEOUT, loadtest::run(opts))
        .await
        .expect("run ends")
        .expect("run")
}

/// `--drops-per-sec`: bots drop their connection and resume their place
/// with their token; nobody misses an update that was not on its way when
/// a socket went, and every rejoin gets its place back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bots_that_drop_and_resume_still_get_every_update() {
    let server = start(&["--tick-ms", "20", "--move-interval-ms", "100"]).await;
    let url = server.ws_url();
    let opts = opts(&[
        "--url",
        &url,
        "--bots",
        "40",
        "--room-size",
        "10",
        "--move-interval",
        "200ms",
        "--duration",
        "3s",
        "--warmup",
        "500ms",
        "--drops-per-sec",
        "0.2",
        "--quiet",
    ]);
    let report = run(opts).await;
    let Report::Load(r) = report else {
        panic!("a load report")
    };
    // 40 bots, a fifth of them a second, for about 3.5 s: about 28 drops.
    assert!(r.drops >= 5, "{r:#?}");
    assert_eq!(r.resumed, r.drops, "every rejoin resumed: {r:#?}");
    assert_eq!(r.fresh_rejoins, 0);
    assert_eq!(r.disconnected, 0);
    assert!(r.errors.is_empty(), "errors: {:?}", r.errors);
    assert_eq!(r.updates_received, r.updates_expected, "{r:#?}");
    assert_eq!(r.duplicates, 0);
    assert!(r.updates_expected > 0);
    assert_eq!(r.connected, 40);
    assert_eq!(
        server
            .metric("amble_resumed_total{node=\"same_node\"}")
            .await,
        r.drops as f64
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_bots_get_every_update() {
    let server = start(&["--tick-ms", "20", "--move-interval-ms", "100"]).await;
    let url = server.ws_url();
    let opts = opts(&[
        "--url",
        &url,
        "--bots",
        "50",
        "--room-size",
        "10",
        "--move-interval",
        "200ms",
        "--duration",
        "2s",
        "--warmup",
        "500ms",
        "--quiet",
    ]);
    let report = run(opts).await;
    let Report::Load(r) = report else {
        panic!("a load report")
    };

    assert_eq!(r.bots, 50);
    assert_eq!(r.connected, 50, "{r:#?}");
    assert_eq!(r.connected_at_start, 50);
    assert_eq!(r.connect_failures, 0);
    assert_eq!(r.rooms, 5);
    assert!(r.errors.is_empty(), "errors: {:?}", r.errors);

    // 50 bots at one move per ~200 ms for 2 s.
    assert!(
        (300..=520).contains(&r.moves_sent),
        "moves sent {}",
        r.moves_sent
    );
    assert_eq!(
        r.moves_applied, r.moves_sent,
        "nothing coalesced at this rate"
    );
    // Everyone else in a room of 10 receives each move.
    assert_eq!(r.updates_expected, r.moves_applied * 9);
    assert_eq!(r.updates_received, r.updates_expected);
    assert_eq!(r.delivery_rate, Some(1.0));
    assert_eq!(r.duplicates, 0);
    assert!(r.failures.is_empty() && r.interrupted.is_none(), "{r:#?}");
    assert!(r.warnings.is_empty(), "a fresh server: {:?}", r.warnings);
    assert_eq!((r.connected_min, r.disconnected), (Some(50), 0));
    assert!((r.measured_s - 2.0).abs() < 1e-9, "{}", r.measured_s);

    let l = r.latency_ms;
    assert!(
        l.p50 > 0.0 && l.p50 <= l.p90 && l.p90 <= l.p99 && l.p99 <= l.p999 && l.p999 <= l.max,
        "{l:?}"
    );
    assert!(l.max < 1_000.0, "a 20 ms tick on loopback: {l:?}");

    assert!(r.bytes_in > 0 && r.bytes_out > 0);
    assert_eq!(
        r.bytes_per_update,
        r.bytes_in as f64 / r.updates_received as f64
    );
    // Every move is one masked frame of a few bytes: 6-byte header included.
    assert!(r.bytes_out >= r.moves_sent * 8, "bytes out {}", r.bytes_out);

    let s = r.server.as_ref().expect("server metrics read");
    assert!(s.cpu_percent.is_some() && s.rss_bytes.is_some());
    assert_eq!(s.connections, Some(50));
    assert!(r.loadtest.rss_bytes > 0);

    // The JSON holds the fields a person checks.
    let json = serde_json::to_value(Report::Load(r)).unwrap();
    for key in [
        "bots",
        "connected",
        "connect_failures",
        "rooms",
        "duration_s",
        "moves_sent",
        "updates_expected",
        "updates_received",
        "delivery_rate",
        "duplicates",
        "latency_ms",
        "bytes_in",
        "bytes_out",
        "bytes_per_update",
        "server",
        "errors",
        "loadtest",
    ] {
        assert!(json.get(key).is_some(), "JSON lacks {key}");
    }
    for key in ["p50", "p90", "p99", "p999", "max"] {
        assert!(
            json["latency_ms"].get(key).is_some(),
            "latency_ms lacks {key}"
        );
    }
    for key in [
        "cpu_percent",
        "cpu_us_per_update",
        "rss_bytes",
        "rss_bytes_per_connection",
    ] {
        assert!(json["server"].get(key).is_some(), "server lacks {key}");
    }
    // One node, no NATS: none of the cluster fields.
    for key in ["nodes", "nats", "cluster_cpu_us_per_update"] {
        assert!(json.get(key).is_none(), "JSON has {key} for one server");
    }
    assert!(json["server"].get("cluster").is_none());
    server.stop().await;
}

/// nats-server on ephemeral ports (`-p -1 -m -1`), killed when dropped:
/// its client URL and its monitoring URL.
struct NatsServer {
    _child: tokio::process::Child,
    client: String,
    monitor: String,
}

impl NatsServer {
    async fn start() -> Self {
        let mut child = tokio::process::Command::new("nats-server")
            .args(["-a", "127.0.0.1", "-p", "-1", "-m", "-1"])
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("nats-server is installed (Debian package nats-server)");
        let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
        let (mut client, mut monitor) = (None, None);
        timeout(Duration::from_secs(10), async {
            while let Some(line) = lines.next_line().await.expect("nats-server stderr") {
                if let Some((_, addr)) = line.split_once("Listening for client connections on ") {
                    client = Some(format!("nats://{}", addr.trim()));
                }
                if let Some((_, addr)) = line.split_once("Starting http monitor on ") {
                    monitor = Some(format!("http://{}", addr.trim()));
                }
                if client.is_some() && monitor.is_some() {
                    return;
                }
            }
            panic!("nats-server ended before it listened")
        })
        .await
        .expect("nats-server listens within 10 s");
        // Keep reading its log, so it never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Self {
            _child: child,
            client: client.expect("a client port"),
            monitor: monitor.expect("a monitor port"),
        }
    }
}

/// Two cluster nodes (in-process, one nats-server) and every room spanning
/// both (bot i on node i mod 2): each bot expects every other bot of its
/// room wherever it is connected, and gets every update; the report has
/// each node's cluster figures and nats-server's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rooms_spanning_two_cluster_nodes_get_every_update() {
    let nats = NatsServer::start().await;
    let node = |name: &'static str, slot: &'static str| {
        let nats = nats.client.clone();
        async move {
            start(&[
                // A tick above --cluster-lead-ms (20 ms by default).
                "--tick-ms",
                "50",
                "--move-interval-ms",
                "100",
                "--nats",
                &nats,
                "--node-name",
                name,
                "--node-slot",
                slot,
            ])
            .await
        }
    };
    let (mut a, mut b) = (node("n1", "1").await, node("n2", "2").await);
    // In-process: each node's peer directory is awaited, not polled.
    a.until_peers(1).await;
    b.until_peers(1).await;
    let urls = format!("{},{}", a.ws_url(), b.ws_url());
    let report = run(opts(&[
        "--url",
        &urls,
        "--nats-monitor",
        &nats.monitor,
        "--bots",
        "40",
        "--room-size",
        "10",
        "--move-interval",
        "200ms",
        "--duration",
        "3s",
        "--warmup",
        "1s",
        "--quiet",
    ]))
    .await;
    let Report::Load(r) = report else {
        panic!("a load report")
    };
    assert_eq!((r.connected, r.connect_failures), (40, 0), "{r:#?}");
    assert!(r.errors.is_empty(), "errors: {:?}", r.errors);
    // Rooms of 10 over two nodes: each bot receives the 9 others.
    assert!(r.moves_applied > 0);
    assert_eq!(r.updates_expected, r.moves_applied * 9, "{r:#?}");
    assert_eq!(r.delivery_rate, Some(1.0), "{r:#?}");
    assert_eq!(r.duplicates, 0);
    for node in &r.nodes {
        let c = node
            .server
            .as_ref()
            .unwrap()
            .cluster
            .as_ref()
            .expect("cluster figures");
        assert!(c.messages_published > 0 && c.remote_moves > 0, "{node:?}");
    }
    let n = r.nats.as_ref().expect("nats-server's figures");
    assert!(n.in_msgs > 0 && n.out_msgs > 0, "{n:?}");
    a.stop().await;
    b.stop().await;
}

/// Two servers behind one `--url` (two single processes, not a cluster:
/// each node's half of a room sees only itself): bot i goes to node i mod 2,
/// the report gives each node's /metrics and their sum, and nats-server's
/// /varz beside them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bots_spread_over_the_nodes_of_a_url_list() {
    let args = ["--tick-ms", "20", "--move-interval-ms", "100"];
    let (a, b) = (start(&args).await, start(&args).await);
    let nats = NatsServer::start().await;
    let urls = format!("{},{}", a.ws_url(), b.ws_url());
    let report = run(opts(&[
        "--url",
        &urls,
        "--nats-monitor",
        &nats.monitor,
        "--bots",
        "40",
        "--room-size",
        "10",
        "--move-interval",
        "200ms",
        "--duration",
        "2s",
        "--warmup",
        "500ms",
        "--quiet",
    ]))
    .await;
    let text = report.to_string();
    let Report::Load(r) = report else {
        panic!("a load report")
    };
    assert_eq!(r.url, urls);
    assert_eq!((r.connected, r.connect_failures), (40, 0), "{r:#?}");
    assert!(r.errors.is_empty(), "errors: {:?}", r.errors);
    assert!(r.warnings.is_empty(), "fresh servers: {:?}", r.warnings);
    // Half of each room on each node; each bot receives the 4 others of
    // its half.
    assert_eq!(r.nodes.len(), 2);
    for (node, url) in r.nodes.iter().zip([a.ws_url(), b.ws_url()]) {
        assert_eq!(node.url, url);
        let s = node.server.as_ref().expect("each node's /metrics read");
        assert_eq!(s.connections, Some(20), "{node:?}");
        assert!(s.moves_applied.unwrap() > 0);
        assert_eq!(s.cluster, None, "not in cluster mode");
    }
    assert!(r.moves_applied > 0);
    assert_eq!(r.updates_expected, r.moves_applied * 4);
    assert_eq!(r.delivery_rate, Some(1.0));
    let sum = r.server.as_ref().expect("the nodes' sum");
    assert_eq!(sum.connections, Some(40));
    let node_cpu: f64 = r
        .nodes
        .iter()
        .map(|n| n.server.as_ref().unwrap().cpu_seconds.unwrap())
        .sum();
    assert_eq!(sum.cpu_seconds, Some(node_cpu));
    assert_eq!(
        sum.moves_applied,
        Some(
            r.nodes
                .iter()
                .map(|n| n.server.as_ref().unwrap().moves_applied.unwrap())
                .sum()
        )
    );

    let n = r.nats.as_ref().expect("nats-server's figures");
    assert_eq!(n.url, nats.monitor);
    assert!(n.readings >= 3, "one a second over 2 s: {n:?}");
    assert!(n.mem_bytes > 0 && n.mem_peak_bytes >= n.mem_bytes, "{n:?}");
    assert_eq!(n.in_msgs, 0, "nobody publishes");
    let whole = r.cluster_cpu_us_per_update.expect("whole-cluster CPU");
    let nodes_only = sum.cpu_us_per_update.unwrap();
    assert!(whole >= nodes_only, "{whole} < {nodes_only}");

    for line in [
        "server        2 nodes together: cpu ",
        &format!("node 1        {}: 20 connections, cpu ", a.ws_url()),
        &format!("node 2        {}: 20 connections, cpu ", b.ws_url()),
        "nats-server   cpu ",
        "whole cluster cpu ",
    ] {
        assert!(text.contains(line), "the report lacks {line:?}:\n{text}");
    }
    let json = serde_json::to_value(Report::Load(r)).unwrap();
    assert_eq!(json["nodes"].as_array().map(Vec::len), Some(2));
    assert!(json["nodes"][1]["server"]["cpu_percent"].is_number());
    assert!(json["nats"]["cpu_seconds"].is_number());
    assert!(json["cluster_cpu_us_per_update"].is_number());
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wander_and_chat() {
    let server = start(&[
        "--tick-ms",
        "20",
        "--move-interval-ms",
        "100",
        "--chat-interval-ms",
        "100",
    ])
    .await;
    let url = server.ws_url();
    let opts = opts(&[
        "--url",
        &url,
        "--bots",
        "12",
        "--rooms",
        "2",
        "--movement",
        "wander",
        "--move-interval",
        "150ms",
        "--chat-interval",
        "300ms",
        "--duration",
        "1s",
        "--warmup",
        "300ms",
        "--quiet",
    ]);
    let report = run(opts).await;
    let Report::Load(r) = report else {
        panic!("a load report")
    };
    assert_eq!((r.connected, r.room_size), (12, 6));
    assert!(r.moves_sent > 0);
    assert_eq!(r.updates_received, r.updates_expected);
    assert_eq!(r.updates_expected, r.moves_applied * 5);
    assert!(
        r.chats_sent > 0 && r.chats_received >= r.chats_sent,
        "{r:#?}"
    );
    assert!(r.errors.is_empty(), "errors: {:?}", r.errors);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rpc_round_trips() {
    let server = without_ping_budget().await;
    let url = server.ws_url();
    let opts = opts(&[
        "--url",
        &url,
        "--scenario",
        "rpc",
        "--clients",
        "4",
        "--round-trips",
        "500",
        "--quiet",
    ]);
    let report = run(opts).await;
    let Report::Rpc(r) = report else {
        panic!("an rpc report")
    };
    assert_eq!(r.round_trips, 2_000);
    assert!(r.round_trips_per_s > 0.0);
    assert!(r.latency_ms.p50 <= r.latency_ms.p99 && r.latency_ms.p99 <= r.latency_ms.max);
    assert!(r.errors.is_empty(), "errors: {:?}", r.errors);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweep_table() {
    let server = start(&["--tick-ms", "20", "--move-interval-ms", "100"]).await;
    let url = server.ws_url();
    let opts = opts(&[
        "--url",
        &url,
        "--scenario",
        "sweep",
        "--sweep-sizes",
        "0,5",
        "--sweep-duration",
        "500ms",
        "--move-interval",
        "200ms",
        "--quiet",
    ]);
    let report = run(opts).await;
    let Report::Sweep(r) = report else {
        panic!("a sweep report")
    };
    assert_eq!(r.rows.len(), 2);
    assert_eq!(r.rows[0].room_size, 0);
    assert_eq!(
        r.rows[0].updates_expected, 0,
        "a lone bot has nobody to tell"
    );
    assert!(r.rows[0].echo_latency_ms.p50 > 0.0);
    assert_eq!(r.rows[1].updates_received, r.rows[1].updates_expected);
    assert!(r.rows[1].updates_expected > 0);
    assert!(r.to_string().contains("room size"));
    server.stop().await;
}

#[tokio::test]
async fn unreachable_server_says_how_to_start_it() {
    // A port nobody listens on: bind, note it, close.
    let addr = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap();
    let url = format!("ws://{addr}/ws");
    let err = loadtest::run(opts(&["--url", &url, "--bots", "1", "--quiet"]))
        .await
        .expect_err("nothing listens there");
    let unreachable = err
        .downcast_ref::<loadtest::Unreachable>()
        .expect("Unreachable");
    assert!(
        unreachable.to_string().contains("cargo run --release"),
        "{unreachable}"
    );
}

/// The binary: `--processes 2` re-executes itself, the parent merges the
/// children's tallies; thresholds decide the exit status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_merge_and_thresholds_decide_exit_status() {
    let server = start(&["--tick-ms", "20", "--move-interval-ms", "100"]).await;
    let url = server.ws_url();
    let exe = env!("CARGO_BIN_EXE_loadtest");
    let run = |extra: &'static [&'static str]| {
        let url = url.clone();
        async move {
            let mut cmd = tokio::process::Command::new(exe);
            cmd.args([
                "--url",
                &url,
                "--bots",
                "40",
                "--room-size",
                "10",
                "--move-interval",
                "200ms",
                "--duration",
                "1s",
                "--warmup",
                "300ms",
                "--processes",
                "2",
                "--json",
                "-",
                "--quiet",
            ])
            .args(extra)
            .kill_on_drop(true);
            timeout(RUN_TIMEOUT, cmd.output())
                .await
                .expect("binary ends")
                .expect("binary runs")
        }
    };
    let out = run(&["--min-delivery", "1.0"]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exit {:?}: {stderr}", out.status);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let json: serde_json::Value = serde_json::from_str(&stdout).expect("JSON report");
    assert_eq!(json["failures"], serde_json::json!([]), "{json:#}");
    assert_eq!(json["bots"], 40);
    assert_eq!(json["connected"], 40, "{json:#}");
    assert_eq!(json["loadtest"]["processes"], 2);
    assert_eq!(json["delivery_rate"], 1.0);
    assert_eq!(json["updates_received"], json["updates_expected"]);
    assert!(json["updates_received"].as_u64().unwrap() > 0);
    assert!(json["latency_ms"]["p99"].as_f64().unwrap() > 0.0);

    // A threshold nobody can meet: exit status 1, and why.
    let out = run(&["--max-p99-ms", "0.001"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--max-p99-ms"));
    server.stop().await;
}

/// The load tester binary, running; its stderr read line by line as it
/// goes, its stdout collected.
struct Bin {
    child: tokio::process::Child,
    stderr: tokio::io::Lines<BufReader<tokio::process::ChildStderr>>,
    stdout: tokio::task::JoinHandle<String>,
    seen: String,
}

/// How a run of the binary ended.
struct Ended {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Bin {
    fn start(args: &[&str]) -> Self {
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_loadtest"))
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("the binary starts");
        let mut out = child.stdout.take().expect("stdout");
        let stdout = tokio::spawn(async move {
            let mut text = String::new();
            let _ = out.read_to_string(&mut text).await;
            text
        });
        let stderr = BufReader::new(child.stderr.take().expect("stderr")).lines();
        Self {
            child,
            stderr,
            stdout,
            seen: String::new(),
        }
    }

    fn pid(&self) -> u32 {
        self.child.id().expect("running")
    }

    /// Reads stderr until a line satisfies `pred`.
    async fn until(&mut self, what: &str, pred: impl Fn(&str) -> bool) {
        let found = timeout(RUN_TIMEOUT, async {
            while let Ok(Some(line)) = self.stderr.next_line().await {
                self.seen.push_str(&line);
                self.seen.push('\n');
                if pred(&line) {
                    return true;
                }
            }
            false
        })
        .await;
        assert!(
            matches!(found, Ok(true)),
            "no {what} on stderr: {}",
            self.seen
        );
    }

    /// Waits for the end, bounded.
    async fn finish(mut self) -> Ended {
        timeout(RUN_TIMEOUT, async {
            while let Ok(Some(line)) = self.stderr.next_line().await {
                self.seen.push_str(&line);
                self.seen.push('\n');
            }
            let status = self.child.wait().await.expect("wait");
            Ended {
                code: status.code(),
                stdout: self.stdout.await.expect("stdout read"),
                stderr: self.seen,
            }
        })
        .await
        .expect("the binary ends")
    }
}

/// A status line of the measured window with `n` bots connected:
/// `  1.2s window connected     20  moves/s ...`.
fn window_with(n: u64) -> impl Fn(&str) -> bool {
    move |line| {
        let words: Vec<&str> = line.split_whitespace().collect();
        words.get(1) == Some(&"window")
            && words.get(2) == Some(&"connected")
            && words.get(3).and_then(|w| w.parse::<u64>().ok()) == Some(n)
    }
}

/// The binary running 20 bots in rooms of 10 with a 30 s window, once
/// every bot is in the window.
async fn twenty_bots_in_a_long_window(url: &str, extra: &[&str]) -> Bin {
    let mut args = vec![
        "--url",
        url,
        "--bots",
        "20",
        "--room-size",
        "10",
        "--move-interval",
        "200ms",
        "--warmup",
        "300ms",
        "--duration",
        "30s",
        "--status-every",
        "250ms",
    ];
    args.extend_from_slice(extra);
    let mut bin = Bin::start(&args);
    bin.until("status line with every bot in the window", window_with(20))
        .await;
    bin
}

/// The server goes away mid-run: every bot is disconnected, the run stops
/// early, exits non-zero, and its first report line says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_the_server_mid_run_fails_early_and_says_why() {
    let server = start(&["--tick-ms", "20", "--move-interval-ms", "100"]).await;
    let url = server.ws_url();
    let bin = twenty_bots_in_a_long_window(&url, &[]).await;
    server.stop().await;
    let out = bin.finish().await;
    assert_eq!(out.code, Some(2), "{}\n{}", out.stdout, out.stderr);
    let first = out.stdout.lines().next().unwrap_or_default();
    assert!(
        first.starts_with("FAILED: every bot was gone") && first.contains("stopped early"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout
            .contains("FAILED: the server disconnected 20 of 20 bots during the run"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout
            .contains("warning: the server's /metrics stopped answering"),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains(" of 30 s measured"), "{}", out.stdout);
    assert!(
        out.stderr
            .contains("loadtest: the run failed: every bot was gone"),
        "{}",
        out.stderr
    );
}

/// SIGTERM (what `docker compose down` sends) stops the bots of every
/// process and prints the report of what was measured, marked as
/// interrupted; the exit status is 143.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_prints_the_interrupted_report() {
    let server = start(&["--tick-ms", "20", "--move-interval-ms", "100"]).await;
    let url = server.ws_url();
    let bin = twenty_bots_in_a_long_window(&url, &["--processes", "2"]).await;
    let killed = tokio::process::Command::new("kill")
        .args(["-TERM", &bin.pid().to_string()])
        .status()
        .await
        .expect("kill runs");
    assert!(killed.success());
    let out = bin.finish().await;
    assert_eq!(out.code, Some(143), "{}\n{}", out.stdout, out.stderr);
    let first = out.stdout.lines().next().unwrap_or_default();
    assert!(
        first.starts_with("INTERRUPTED by SIGTERM"),
        "{}",
        out.stdout
    );
    assert!(!out.stdout.contains("FAILED"), "{}", out.stdout);
    assert!(out.stdout.contains(" of 30 s measured"), "{}", out.stdout);
    assert!(
        out.stdout.contains("connected     20 of 20 at the end"),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("2 processes"), "{}", out.stdout);
    // The bots closed: the server holds no connection of theirs.
    let target = loadtest::plan::Target::parse(&url, false).unwrap();
    let sample = timeout(RUN_TIMEOUT, loadtest::scrape::scrape(&target))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(sample.get("amble_connections"), Some(0.0));
    // Their places are held for the resume grace (they closed without a
    // Leave), and only those.
    assert_eq!(sample.get("amble_members"), sample.get("amble_resume_held"));
    server.stop().await;
}

/// A WebSocket client of the test server.
async fn person(url: &str) -> tokio_tungstenite::WebSocketStream<TcpStream> {
    let target = loadtest::plan::Target::parse(url, false).expect("a loopback URL");
    let addr = target.resolve().await.expect("an address");
    timeout(RUN_TIMEOUT, async {
        let stream = TcpStream::connect(addr).await.expect("connects");
        let (ws, _) = tokio_tungstenite::client_async(url, stream)
            .await
            .expect("WebSocket opens");
        ws
    })
    .await
    .expect("connects in time")
}

/// The next message the server sends `ws`.
async fn next_body(
    ws: &mut tokio_tungstenite::WebSocketStream<TcpStream>,
) -> Option<pb::server_message::Body> {
    loop {
        let frame = timeout(RUN_TIMEOUT, ws.next())
            .await
            .expect("a frame in time")?
            .ok()?;
        if let Message::Binary(bytes) = frame {
            let msg = pb::ServerMessage::decode(&bytes[..]).expect("decodes");
            if msg.body.is_some() {
                return msg.body;
            }
        }
    }
}

/// `--room lobby` puts every bot in the room a person is in: the person
/// sees them arrive; the person is not counted as a bot; the report warns
/// that the server was busy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bots_walk_in_a_named_room_beside_a_person() {
    let server = start(&["--tick-ms", "20", "--move-interval-ms", "100"]).await;
    let url = server.ws_url();
    let mut ada = person(&url).await;
    let join = protocol::encode_client(pb::client_message::Body::Join(pb::Join {
        data: Vec::new(),
        start: None,
        room: "lobby".into(),
        name: "Ada".into(),
        token: String::new(),
        resume_token: String::new(),
    }));
    ada.send(Message::Binary(join.into())).await.unwrap();
    assert!(matches!(
        next_body(&mut ada).await,
        Some(pb::server_message::Body::Welcome(_))
    ));

    let report = run(opts(&[
        "--url",
        &url,
        "--room",
        "lobby",
        "--bots",
        "6",
        "--move-interval",
        "200ms",
        "--duration",
        "1s",
        "--warmup",
        "300ms",
        "--quiet",
    ]))
    .await;
    let Report::Load(r) = report else {
        panic!("a load report")
    };
    assert_eq!((r.rooms, r.room_size, r.connected), (1, 6, 6), "{r:#?}");
    assert!(r.failures.is_empty(), "{:?}", r.failures);
    assert!(r.errors.is_empty(), "Ada is no bot: {:?}", r.errors);
    assert_eq!(
        r.updates_expected,
        r.moves_applied * 5,
        "Ada is not expected"
    );
    assert_eq!(r.delivery_rate, Some(1.0));
    assert_eq!(r.warnings.len(), 1, "{:?}", r.warnings);
    assert!(
        r.warnings[0].contains("busy: 1 connections open and 1 members"),
        "{:?}",
        r.warnings
    );
    assert!(r.to_string().contains("warning: the server was busy"));

    // Ada saw six bots join her room.
    let mut bots = 0;
    while bots < 6 {
        match next_body(&mut ada).await {
            Some(pb::server_message::Body::Joined(j)) => {
                let name = j.member.map(|m| m.name).unwrap_or_default();
                assert!(name.starts_with("bot"), "{name}");
                bots += 1;
            }
            Some(_) => {}
            None => panic!("Ada's connection ended after {bots} bots"),
        }
    }
    server.stop().await;
}

/// More bots in one `--room` than the server's rooms hold is refused
/// before any bot connects, with what to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_room_too_small_for_the_bots_is_refused_up_front() {
    let server = start(&["--room-capacity", "5"]).await;
    let url = server.ws_url();
    let err = timeout(
        RUN_TIMEOUT,
        loadtest::run(opts(&[
            "--url", &url, "--room", "lobby", "--bots", "6", "--quiet",
        ])),
    )
    .await
    .expect("ends")
    .expect_err("refused")
    .to_string();
    for part in [
        "--room lobby puts all 6 bots in one room",
        "hold at most 5 members",
        "--rooms 2 --room-prefix lobby",
        "--room-capacity 6",
    ] {
        assert!(err.contains(part), "{part}: {err}");
    }
    // Only the probes that read the limits connected: one in a room of
    // its own, then (too many bots for it) one in lobby itself, which could
    // have been a spatial room with a capacity of its own.
    let target = loadtest::plan::Target::parse(&url, false).unwrap();
    let sample = loadtest::scrape::scrape(&target).await.unwrap();
    assert_eq!(sample.get("amble_connections_accepted_total"), Some(2.0));
    server.stop().await;
}

/// The rpc scenario stopped by the server's ping budget says, first, how to
/// turn the budget off for the benchmark, and exits non-zero.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rpc_stopped_by_the_ping_budget_says_how_to_turn_it_off() {
    // amble's default budget: 5 pings a second.
    let server = start(&[]).await;
    let url = server.ws_url();
    let out = Bin::start(&[
        "--url",
        &url,
        "--scenario",
        "rpc",
        "--clients",
        "2",
        "--round-trips",
        "100",
        "--quiet",
    ])
    .finish()
    .await;
    assert_eq!(out.code, Some(2), "{}\n{}", out.stdout, out.stderr);
    let first = out.stdout.lines().next().unwrap_or_default();
    assert!(
        first.starts_with("FAILED: the server's ping budget stopped the rpc scenario")
            && first.contains("--pings-per-sec 0")
            && first.contains("AMBLE_PINGS_PER_SEC=0"),
        "{}",
        out.stdout
    );
    server.stop().await;
}

/// The load tester raises its soft limit on open files to the hard limit,
/// sizes itself against it, and when even that is too small says what to
/// do.
#[tokio::test]
async fn open_file_limits_are_raised_and_explained() {
    // A port nobody listens on: the run gets past its open-file checks to
    // the server, and stops there.
    let addr = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap();
    let url = format!("ws://{addr}/ws");
    let exe = env!("CARGO_BIN_EXE_loadtest");
    let shell = |limits: &str, args: &str| {
        let script = format!("{limits} && exec {exe} --url {url} --quiet {args}");
        async move {
            timeout(
                RUN_TIMEOUT,
                tokio::process::Command::new("sh")
                    .args(["-c", &script])
                    .kill_on_drop(true)
                    .output(),
            )
            .await
            .expect("ends")
            .expect("runs")
        }
    };
    // A soft limit of 256 under a higher hard limit: 300 bots in one
    // process, after raising it.
    let out = shell("ulimit -Sn 256", "--bots 300 --processes 1").await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("cannot reach the amble server"), "{stderr}");
    assert!(!stderr.contains("open files"), "{stderr}");

    // A hard limit of 256: one process cannot hold 300 bots.
    let out = shell("ulimit -n 256", "--bots 300 --processes 1").await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    for part in [
        "300 bots in one process need about 364 open files",
        "at most 256 (hard limit 256)",
        "`ulimit -n 364`",
        "--processes 2",
    ] {
        assert!(stderr.contains(part), "{part}: {stderr}");
    }

    // Without --processes, the load tester spreads the rooms itself.
    let out = shell("ulimit -n 256", "--bots 300").await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("300 bots run in 2 processes: one may open 256 files"),
        "{stderr}"
    );
    assert!(stderr.contains("cannot reach the amble server"), "{stderr}");
}
