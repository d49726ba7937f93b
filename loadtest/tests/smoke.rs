//! The load tester against the real server, started in-process on an
//! ephemeral port: every delivery accounted for, the report consistent.

use std::net::SocketAddr;
use std::time::Duration;

use clap::Parser as _;
use loadtest::{Opts, Report};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::time::timeout;

/// Bound on any one run in these tests.
const RUN_TIMEOUT: Duration = Duration::from_secs(60);

/// The amble server on 127.0.0.1:0, stopped when dropped.
struct TestServer {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
}

impl TestServer {
    async fn start(args: &[&str]) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local addr");
        let config =
            amble::config::Config::parse_from(std::iter::once("amble").chain(args.iter().copied()));
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(amble::serve(listener, config, async {
            let _ = stopped.await;
        }));
        Self {
            addr,
            stop: Some(stop),
            task: Some(task),
        }
    }

    fn url(&self) -> String {
        format!("ws://{}/ws", self.addr)
    }

    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let result = timeout(Duration::from_secs(10), task).await;
            assert!(
                matches!(result, Ok(Ok(Ok(())))),
                "server did not stop cleanly: {result:?}"
            );
        }
    }
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_bots_get_every_update() {
    let server = TestServer::start(&["--tick-ms", "20", "--move-interval-ms", "100"]).await;
    let url = server.url();
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
    assert_eq!(r.delivery_rate, 1.0);
    assert_eq!(r.duplicates, 0);

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
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wander_and_chat() {
    let server = TestServer::start(&[
        "--tick-ms",
        "20",
        "--move-interval-ms",
        "100",
        "--chat-interval-ms",
        "100",
    ])
    .await;
    let url = server.url();
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
    let server = TestServer::start(&[]).await;
    let url = server.url();
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
    let server = TestServer::start(&["--tick-ms", "20", "--move-interval-ms", "100"]).await;
    let url = server.url();
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
        .downcast_ref::<loadtest::load::Unreachable>()
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
    let server = TestServer::start(&["--tick-ms", "20", "--move-interval-ms", "100"]).await;
    let url = server.url();
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
