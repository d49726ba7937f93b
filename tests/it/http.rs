//! HTTP before the WebSocket: deadlines, sizes, caps, origins, the strict handshake.

use std::time::Duration;

use amble::protocol::pb::{self, client_message::Body as C};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::support::*;

/// Writes `bytes` on a new connection and reads until the server closes.
async fn exchange(server: &TestServer, bytes: &[u8]) -> String {
    let mut tcp = within("connect", TcpStream::connect(server.addr))
        .await
        .expect("connect");
    tcp.write_all(bytes).await.expect("write");
    read_to_close(&mut tcp).await
}

/// Everything the server sends until it closes (a reset ends it too).
async fn read_to_close(tcp: &mut TcpStream) -> String {
    let mut out = Vec::new();
    let mut buf = [0u8; 4_096];
    within("the server to close", async {
        loop {
            match tcp.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    String::from_utf8_lossy(&out).into_owned()
}

/// A connection that has sent part of a request head and stalls there.
async fn slowloris(server: &TestServer) -> TcpStream {
    let mut tcp = within("connect", TcpStream::connect(server.addr))
        .await
        .expect("connect");
    tcp.write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\nX-a: ")
        .await
        .expect("write");
    tcp
}

#[tokio::test(start_paused = true)]
async fn a_head_that_never_ends_gets_408_at_the_header_deadline() {
    let server = TestServer::with(config(|c| c.edge.http_header_timeout_ms = 2_000)).await;
    let mut tcp = slowloris(&server).await;
    let started = Instant::now();
    let response = read_to_close(&mut tcp).await;
    assert!(response.starts_with("HTTP/1.1 408 "), "{response}");
    assert!(response.contains("within 2000 ms"), "{response}");
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(1_900) && waited < Duration::from_secs(3),
        "closed after {waited:?}"
    );
    assert_eq!(server.metric("amble_http_header_timeouts_total").await, 1.0);
}

#[tokio::test(start_paused = true)]
async fn a_silent_connection_gets_the_header_deadline_too() {
    let server = TestServer::with(config(|c| c.edge.http_header_timeout_ms = 2_000)).await;
    let mut tcp = TcpStream::connect(server.addr).await.expect("connect");
    let response = read_to_close(&mut tcp).await;
    assert!(response.starts_with("HTTP/1.1 408 "), "{response}");
}

#[tokio::test]
async fn a_head_over_the_size_limit_gets_431() {
    let server = TestServer::with(config(|c| c.edge.http_max_header_bytes = 4_096)).await;
    let big = format!(
        "GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-big: {}\r\n\r\n",
        "a".repeat(8_000)
    );
    let response = exchange(&server, big.as_bytes()).await;
    assert!(response.starts_with("HTTP/1.1 431 "), "{response}");
    // Just under the limit is served.
    let fits = format!(
        "GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nX-fits: {}\r\n\r\n",
        "a".repeat(3_900)
    );
    let response = exchange(&server, fits.as_bytes()).await;
    assert!(response.starts_with("HTTP/1.1 200 "), "{response}");
    assert_eq!(server.metric("amble_http_heads_too_large_total").await, 1.0);
}

/// Today 200 sockets each parking 384 KiB of unfinished header cost 80 MiB:
/// now each is refused once its head passes the default 16 KiB.
#[tokio::test]
async fn two_hundred_oversized_heads_are_each_refused_at_16_kib() {
    let server = TestServer::start().await;
    let head = format!(
        "GET / HTTP/1.1\r\nHost: localhost\r\nX-big: {}",
        "a".repeat(20_000)
    );
    let mut sockets = Vec::new();
    for _ in 0..200 {
        let mut tcp = TcpStream::connect(server.addr).await.expect("connect");
        tcp.write_all(head.as_bytes()).await.expect("write");
        sockets.push(tcp);
    }
    for tcp in &mut sockets {
        let response = read_to_close(tcp).await;
        assert!(response.starts_with("HTTP/1.1 431 "), "{response}");
    }
    assert_eq!(
        server.metric("amble_http_heads_too_large_total").await,
        200.0
    );
    settles(&server, "amble_http_connections", 1.0).await;
}

/// Waits until a gauge reads `value` (connection tasks end just after their
/// sockets say so).
async fn settles(server: &TestServer, series: &str, value: f64) {
    server.until_metric(series, |v| v == value).await;
}

#[tokio::test(start_paused = true)]
async fn a_kept_alive_connection_is_closed_after_the_idle_deadline() {
    let server = TestServer::with(config(|c| {
        c.edge.http_header_timeout_ms = 1_000;
        c.edge.http_idle_timeout_ms = 5_000;
    }))
    .await;
    let mut tcp = TcpStream::connect(server.addr).await.expect("connect");
    tcp.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .expect("write");
    let mut buf = [0u8; 1_024];
    let n = within("the response", tcp.read(&mut buf))
        .await
        .expect("read");
    assert!(buf[..n].starts_with(b"HTTP/1.1 200 "));
    let answered = Instant::now();
    // Idle past the head deadline but within the idle one: still served.
    tokio::time::sleep(Duration::from_millis(3_000)).await;
    tcp.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .expect("write");
    let n = within("the second response", tcp.read(&mut buf))
        .await
        .expect("read");
    assert!(buf[..n].starts_with(b"HTTP/1.1 200 "));
    let answered_again = Instant::now();
    assert!(answered_again - answered >= Duration::from_millis(3_000));
    let rest = read_to_close(&mut tcp).await;
    assert_eq!(rest, "", "an idle connection closes without a word");
    let idle = answered_again.elapsed();
    assert!(
        idle >= Duration::from_millis(4_900) && idle < Duration::from_secs(6),
        "closed after {idle:?}"
    );
    assert_eq!(server.metric("amble_http_idle_timeouts_total").await, 1.0);
}

/// A slowloris fills the pool of connections that are not WebSockets; the
/// server keeps answering /healthz and /metrics and upgrading WebSockets,
/// each newcomer taking the place of the connection that has waited
/// longest for its head.
#[tokio::test]
async fn a_slowloris_cannot_lock_out_health_metrics_or_websockets() {
    let server = TestServer::with(config(|c| c.edge.max_http_connections = 50)).await;
    let mut attackers = Vec::new();
    for _ in 0..300 {
        attackers.push(slowloris(&server).await);
    }
    let mut joined = Vec::new();
    for i in 0..5 {
        let started = std::time::Instant::now();
        let (status, body) = server.get("/healthz").await;
        assert!(status.contains("200") && body.contains("ok"), "{status}");
        let health = started.elapsed();
        let started = std::time::Instant::now();
        joined.push(server.joined("lobby", &format!("late{i}")).await.0);
        let websocket = started.elapsed();
        println!("under slowloris: /healthz {health:?}, WebSocket join {websocket:?}");
    }
    assert!(server.metric("amble_http_evictions_total").await >= 250.0);
    assert!(server.metric("amble_http_connections").await <= 50.0);
    assert_eq!(server.metric("amble_connections").await, 5.0);
    drop(attackers);
}

#[tokio::test]
async fn an_address_over_its_cap_is_refused_with_429() {
    let server = TestServer::with(config(|c| {
        c.addresses.exempt_loopback = false;
        c.addresses.max_connections_per_ip = 3;
    }))
    .await;
    // Two WebSockets and one idle HTTP connection: the address's three.
    let (_a, _) = server.joined("lobby", "a").await;
    let (_b, _) = server.joined("lobby", "b").await;
    let held = slowloris(&server).await;
    let response = exchange(&server, b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n").await;
    assert!(response.starts_with("HTTP/1.1 429 "), "{response}");
    assert!(response.contains("too many connections from your address"));
    drop(held);
    // A place frees when a socket closes.
    let (status, _) = within("a place under the cap", async {
        loop {
            let response = server
                .request("GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
                .await;
            if response.starts_with("HTTP/1.1 200 ") {
                break (response, ());
            }
        }
    })
    .await;
    assert!(status.contains("ok"));
}

#[tokio::test]
async fn loopback_is_exempt_by_default() {
    let server = TestServer::with(config(|c| c.addresses.max_connections_per_ip = 2)).await;
    let mut clients = Vec::new();
    for i in 0..4 {
        clients.push(server.joined("lobby", &format!("local{i}")).await.0);
    }
    let (status, _) = server.get("/healthz").await;
    assert!(status.contains("200"), "{status}");
}

/// Behind a trusted proxy every WebSocket is counted under the address the
/// proxy forwarded, not the proxy's.
#[tokio::test]
async fn the_cap_applies_to_the_forwarded_address_behind_a_trusted_proxy() {
    let server = TestServer::with(config(|c| {
        c.addresses.exempt_loopback = false;
        c.addresses.max_connections_per_ip = 2;
        c.addresses.trusted_proxies = vec!["127.0.0.1/32".parse().expect("cidr")];
    }))
    .await;
    let upgrade = |forwarded: &str| {
        format!(
            "GET /ws HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
             X-Forwarded-For: {forwarded}\r\n\r\n"
        )
    };
    let mut open = Vec::new();
    for _ in 0..2 {
        let mut tcp = TcpStream::connect(server.addr).await.expect("connect");
        tcp.write_all(upgrade("203.0.113.5, 127.0.0.1").as_bytes())
            .await
            .expect("write");
        let mut buf = [0u8; 512];
        let n = within("101", tcp.read(&mut buf)).await.expect("read");
        assert!(buf[..n].starts_with(b"HTTP/1.1 101 "));
        open.push(tcp);
    }
    let third = server
        .request_head(&upgrade("198.51.100.1, 203.0.113.5"))
        .await;
    assert!(third.starts_with("HTTP/1.1 429 "), "{third}");
    let other = server.request_head(&upgrade("198.51.100.1")).await;
    assert!(other.starts_with("HTTP/1.1 101 "), "{other}");
    // A client hop that cannot be read is an unknown client behind the
    // proxy, with a place of its own under the cap, and is counted.
    let garbled = server.request_head(&upgrade("not-an-address")).await;
    assert!(garbled.starts_with("HTTP/1.1 101 "), "{garbled}");
    assert_eq!(
        server
            .metric("amble_forwarded_unreadable_total{reason=\"garbage\"}")
            .await,
        1.0
    );
    assert_eq!(
        server
            .metric("amble_address_refusals_total{limit=\"connections\"}")
            .await,
        1.0
    );
}

/// Join and leave churn from many sockets of one address is bounded by
/// the address's join budget.
#[tokio::test]
async fn joins_from_one_address_share_a_budget() {
    let server = TestServer::with(config(|c| {
        c.addresses.exempt_loopback = false;
        c.addresses.ip_join_burst = 3;
        c.addresses.ip_join_interval_ms = 60_000;
    }))
    .await;
    let mut joined = Vec::new();
    for i in 0..3 {
        joined.push(server.joined("lobby", &format!("ok{i}")).await.0);
    }
    let mut late = server.client().await;
    late.send(C::Join(pb::Join {
        data: Vec::new(),
        start: None,
        room: "lobby".into(),
        name: "one too many".into(),
        ..Default::default()
    }))
    .await;
    let text = late.expect_error(pb::ErrorCode::RateLimited).await;
    assert!(text.contains("too many joins from your address"), "{text}");
    assert_eq!(
        server
            .metric("amble_address_refusals_total{limit=\"joins\"}")
            .await,
        1.0
    );
}

#[tokio::test]
async fn the_effective_caps_are_in_metrics() {
    let server = TestServer::with(config(|c| {
        c.max_connections = 100;
        c.edge.max_http_connections = 10;
    }))
    .await;
    assert_eq!(server.metric("amble_connection_cap").await, 100.0);
    assert_eq!(server.metric("amble_http_connection_cap").await, 10.0);
    assert!(server.metric("amble_open_files_limit").await >= 110.0);
}

/// The real binary under a 256-file limit (as on a stock machine, smaller):
/// it lowers its caps to fit, says so once, and a slowloris of 300 sockets
/// neither locks out /healthz or a WebSocket client nor floods the log.
#[tokio::test]
async fn under_a_256_file_limit_300_slowloris_sockets_lock_nobody_out() {
    let mut command = tokio::process::Command::new("sh");
    command.args([
        "-c",
        "ulimit -n 256 && exec \"$0\" \"$@\"",
        env!("CARGO_BIN_EXE_amble"),
        "--listen",
        "127.0.0.1:0",
    ]);
    let mut amble = crate::binary::start(command).await;
    let addr: std::net::SocketAddr = amble.addr.parse().expect("address");

    let mut attackers = Vec::new();
    for _ in 0..300 {
        let mut tcp = TcpStream::connect(addr).await.expect("connect");
        let _ = tcp
            .write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\nX-a: ")
            .await;
        attackers.push(tcp);
    }
    let server = Remote { addr };
    let (status, body) = server.get("/healthz").await;
    assert!(status.contains("200") && body.contains("ok"), "{status}");
    let mut client = Client::connect(&format!("ws://{addr}/ws")).await;
    client.join("lobby", "still here").await;
    assert_eq!(server.metric("amble_open_files_limit").await, 256.0);
    assert_eq!(server.metric("amble_connection_cap").await, 168.0);
    assert_eq!(server.metric("amble_http_connection_cap").await, 56.0);
    assert!(server.metric("amble_http_evictions_total").await >= 240.0);

    amble.signal("-TERM").await;
    assert_eq!(client.expect_close().await, 1001);
    let exit = within("amble to exit", amble.child.wait())
        .await
        .expect("wait");
    assert!(exit.success(), "exit status {exit}");
    drop(attackers);

    let log = amble.log.lock().expect("log").join("\n");
    let lowered = log.matches("cannot hold --max-connections").count();
    assert_eq!(lowered, 1, "one line about the lowered caps:\n{log}");
    assert!(
        log.contains("serving at most 168 WebSocket and 56 HTTP connections"),
        "{log}"
    );
    let exhausted = log.matches("Too many open files").count();
    assert!(exhausted <= 1, "{exhausted} lines about open files:\n{log}");
}

/// A server this test did not start in-process.
struct Remote {
    addr: std::net::SocketAddr,
}

impl Remote {
    async fn get(&self, path: &str) -> (String, String) {
        let mut tcp = TcpStream::connect(self.addr).await.expect("connect");
        let req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
        tcp.write_all(req.as_bytes()).await.expect("write");
        let text = read_to_close(&mut tcp).await;
        let (head, body) = text.split_once("\r\n\r\n").expect("http response");
        (
            head.lines().next().unwrap_or_default().to_owned(),
            body.to_owned(),
        )
    }

    async fn metric(&self, series: &str) -> f64 {
        let (_, body) = self.get("/metrics").await;
        body.lines()
            .find_map(|l| l.strip_prefix(series).and_then(|v| v.strip_prefix(' ')))
            .map_or(0.0, |v| v.trim().parse().expect("a number"))
    }
}

/// Issue #19: the client's files are readable from any page, `/api/rooms`
/// from the pages that may connect (`--allowed-origins`), with preflights
/// answered; another page gets no CORS header, and its preflight a 403
/// with a JSON error.
#[tokio::test]
async fn other_origins_may_read_the_sdk_and_allowed_ones_the_room_list() {
    let server = TestServer::start().await;
    let request = |method: &str, path: &str, origin: &str, extra: &str| {
        format!(
            "{method} {path} HTTP/1.1\r\nhost: {}\r\norigin: {origin}\r\n{extra}connection: close\r\n\r\n",
            server.addr
        )
    };
    let sdk = exchange(
        &server,
        request("GET", "/amble.js", "https://evil.example", "").as_bytes(),
    )
    .await;
    assert!(sdk.starts_with("HTTP/1.1 200"), "{sdk:.200}");
    assert!(
        sdk.contains("access-control-allow-origin: *\r\n"),
        "{sdk:.300}"
    );

    let ask = "access-control-request-method: GET\r\n";
    let preflight = exchange(
        &server,
        request("OPTIONS", "/codec.js", "https://evil.example", ask).as_bytes(),
    )
    .await;
    assert!(preflight.starts_with("HTTP/1.1 204"), "{preflight}");
    assert!(
        preflight.contains("access-control-allow-methods: GET, HEAD, OPTIONS\r\n"),
        "{preflight}"
    );

    let page = "http://localhost:5173"; // the default --allowed-origins
    let rooms = exchange(&server, request("GET", "/api/rooms", page, "").as_bytes()).await;
    assert!(
        rooms.contains(&format!("access-control-allow-origin: {page}\r\n")),
        "{rooms}"
    );
    assert!(rooms.contains("vary: Origin\r\n"), "{rooms}");
    let evil = exchange(
        &server,
        request("GET", "/api/rooms", "https://evil.example", "").as_bytes(),
    )
    .await;
    assert!(evil.starts_with("HTTP/1.1 200"), "{evil}");
    assert!(!evil.contains("access-control-allow-origin"), "{evil}");

    let refused = exchange(
        &server,
        request("OPTIONS", "/api/rooms", "https://evil.example", ask).as_bytes(),
    )
    .await;
    assert!(refused.starts_with("HTTP/1.1 403"), "{refused}");
    assert!(
        refused.contains(r#"{"error":{"code":"origin_not_allowed""#),
        "{refused}"
    );
    let allowed = exchange(
        &server,
        request("OPTIONS", "/api/rooms", page, ask).as_bytes(),
    )
    .await;
    assert!(allowed.starts_with("HTTP/1.1 204"), "{allowed}");

    let post = exchange(
        &server,
        request("POST", "/amble.js", page, "content-length: 0\r\n").as_bytes(),
    )
    .await;
    assert!(post.starts_with("HTTP/1.1 405"), "{post}");
    assert!(post.contains("allow: GET, HEAD, OPTIONS\r\n"), "{post}");
    assert!(post.contains(r#""code":"method_not_allowed""#), "{post}");
    server.stop().await;
}

/// Issue #19: `/metrics` says what it is (OpenMetrics text, as
/// prometheus-client writes it), and the Prometheus project's own parser
/// reads all of it.
#[tokio::test]
async fn metrics_are_openmetrics_and_a_prometheus_parser_reads_them() {
    let server = TestServer::start().await;
    let (mut c, _) = server.joined("lobby", "Ada").await;
    c.ping().await;
    let head = format!(
        "GET /metrics HTTP/1.1\r\nhost: {}\r\nconnection: close\r\n\r\n",
        server.addr
    );
    let response = exchange(&server, head.as_bytes()).await;
    assert!(
        response.contains(
            "content-type: application/openmetrics-text; version=1.0.0; charset=utf-8\r\n"
        ),
        "{response:.300}"
    );
    let body = response
        .split_once("\r\n\r\n")
        .expect("a body")
        .1
        .to_owned();
    let parser = r#"
import sys
from prometheus_client.openmetrics.parser import text_string_to_metric_families
names = [f.name for f in text_string_to_metric_families(sys.stdin.read())]
print(len(names), " ".join(sorted(names)))
"#;
    let mut python = tokio::process::Command::new("/usr/bin/python3")
        .args(["-c", parser])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("Debian's python3 (/usr/bin/python3): `apt-get install python3 python3-prometheus-client`");
    let mut stdin = python.stdin.take().expect("stdin");
    stdin.write_all(body.as_bytes()).await.expect("write");
    drop(stdin);
    let out = within("the parser", python.wait_with_output())
        .await
        .expect("python3");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the OpenMetrics parser refused /metrics (python3-prometheus-client missing? \
         `apt-get install python3-prometheus-client`): {stderr}"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let families: usize = stdout
        .split(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .expect("a count");
    assert!(families >= 30, "{stdout}");
    for name in [
        "amble_connections",
        "amble_members",
        "amble_frames_sent",
        "amble_process_cpu_seconds",
    ] {
        assert!(
            stdout.split_whitespace().any(|n| n == name),
            "{name} in {stdout}"
        );
    }
    server.stop().await;
}

/// Issue #18, DNS rebinding: a server on loopback answers only for local
/// names. `Host: evil.example` gets 421 and a JSON error, on an HTTP route
/// and on the WebSocket upgrade, counted; localhost still works, and
/// `--allowed-hosts` names others.
#[tokio::test]
async fn a_foreign_host_is_refused_with_421_and_local_ones_served() {
    let server = TestServer::start().await;
    let get = |host: &str, path: &str| {
        format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n")
    };
    let upgrade = |host: &str, origin: &str| {
        format!(
            "GET /ws HTTP/1.1\r\nHost: {host}\r\nOrigin: {origin}\r\nUpgrade: websocket\r\n\
             Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
        )
    };
    for request in [
        get("evil.example", "/api/rooms"),
        get(&format!("evil.example:{}", server.addr.port()), "/"),
        // The rebinding page: its Origin and Host agree.
        upgrade("evil.example", "http://evil.example"),
    ] {
        let response = exchange(&server, request.as_bytes()).await;
        assert!(response.starts_with("HTTP/1.1 421 "), "{response}");
        assert!(
            response
                .to_ascii_lowercase()
                .contains("\r\nconnection: close"),
            "{response}"
        );
        let body = response.split_once("\r\n\r\n").expect("a body").1;
        let json: serde_json::Value = serde_json::from_str(body).expect("JSON");
        assert_eq!(json["error"]["code"], "host_not_allowed", "{body}");
        assert!(
            json["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("--allowed-hosts")),
            "{body}"
        );
    }
    assert_eq!(server.metric("amble_host_refused_total").await, 3.0);

    // Local names, with the port or without, are served; so is a client.
    for host in [
        server.addr.to_string(),
        "localhost".to_owned(),
        format!("localhost:{}", server.addr.port()),
        "[::1]:1".to_owned(),
    ] {
        let response = exchange(&server, get(&host, "/healthz").as_bytes()).await;
        assert!(response.starts_with("HTTP/1.1 200 "), "{host}: {response}");
    }
    let (mut a, _) = server.joined("lobby", "a").await;
    a.ping().await;

    // Listed hosts replace the default; `*` allows any.
    let listed = TestServer::with(config(|c| {
        c.edge.allowed_hosts = vec!["amble.example.com".parse().expect("host")];
    }))
    .await;
    let ok = exchange(&listed, get("AMBLE.example.com:443", "/healthz").as_bytes()).await;
    assert!(ok.starts_with("HTTP/1.1 200 "), "{ok}");
    let local = exchange(&listed, get("localhost", "/healthz").as_bytes()).await;
    assert!(local.starts_with("HTTP/1.1 421 "), "{local}");
    let any = TestServer::with(config(|c| {
        c.edge.allowed_hosts = vec!["*".parse().expect("*")]
    }))
    .await;
    let evil = exchange(&any, get("evil.example", "/healthz").as_bytes()).await;
    assert!(evil.starts_with("HTTP/1.1 200 "), "{evil}");
}
