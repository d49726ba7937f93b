//! amble behind a reverse proxy (nginx): upgrade headers, forwarded client addresses.
//!
//! The proxy configuration under test is the one in docs/security.md: its
//! fenced `nginx` block's `upstream` block (pointed at the test server) and
//! every `location` block, as written, in a server on plain HTTP. A real
//! nginx runs as a child process in front of a real amble. nginx must be
//! installed (Debian: `apt-get install -y nginx`); without it these tests
//! fail rather than skip.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;

use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::{Child, Command};
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
use tokio_tungstenite::{MaybeTlsStream, tungstenite};

use crate::support::*;

/// Where docs/security.md's upstream points, replaced by the test server.
const DOC_UPSTREAM: &str = "server 127.0.0.1:3000;";

/// The nginx binary: on `PATH`, or in /usr/sbin where Debian puts it (not
/// on a normal user's `PATH`).
fn nginx_binary() -> PathBuf {
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>());
    on_path
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/local/sbin")])
        .map(|dir| dir.join("nginx"))
        .find(|path| path.is_file())
        .unwrap_or_else(|| {
            panic!(
                "nginx is not installed, and the reverse-proxy tests run the nginx \
                 configuration of docs/security.md: install it (Debian: apt-get install -y nginx)"
            )
        })
}

/// The fenced `nginx` block of docs/security.md.
fn documented_config() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/security.md");
    let doc = std::fs::read_to_string(path).expect("read docs/security.md");
    let start = doc
        .find("```nginx\n")
        .expect("docs/security.md has an ```nginx block")
        + "```nginx\n".len();
    let len = doc[start..].find("```").expect("the nginx block ends");
    doc[start..start + len].to_owned()
}

/// Every block of `config` whose first word is `directive`, with its
/// braces (blocks nested in others included). Braces in comments and
/// quoted strings are not counted.
fn blocks(config: &str, directive: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut lines = config.lines();
    while let Some(line) = lines.next() {
        if line.split_whitespace().next() != Some(directive) {
            continue;
        }
        let mut block = vec![line];
        let mut depth = braces(line);
        while depth > 0 {
            let Some(next) = lines.next() else {
                panic!("unterminated `{directive}` block in docs/security.md")
            };
            depth += braces(next);
            block.push(next);
        }
        found.push(block.join("\n"));
    }
    found
}

/// Opening minus closing braces in one line of nginx configuration.
fn braces(line: &str) -> i32 {
    let mut quoted = false;
    let mut depth = 0;
    for c in line.chars() {
        match c {
            '"' => quoted = !quoted,
            '#' if !quoted => break,
            '{' if !quoted => depth += 1,
            '}' if !quoted => depth -= 1,
            _ => {}
        }
    }
    depth
}

/// A real nginx with docs/security.md's configuration in front of `amble`.
/// Killed when dropped.
struct Nginx {
    addr: SocketAddr,
    _child: Child,
    _dir: tempfile::TempDir,
}

impl Nginx {
    async fn before(amble: SocketAddr) -> Self {
        let doc = documented_config();
        let upstreams = blocks(&doc, "upstream");
        assert_eq!(upstreams.len(), 1, "one upstream block in docs/security.md");
        assert!(
            upstreams[0].contains(DOC_UPSTREAM),
            "docs/security.md's upstream must name `{DOC_UPSTREAM}` (the test points it at the test server)"
        );
        let upstream = upstreams[0].replace(DOC_UPSTREAM, &format!("server {amble};"));
        let locations = blocks(&doc, "location").join("\n");
        assert!(locations.contains("location = /ws"), "{locations}");

        // The port is picked by binding port 0; another process could take
        // it before nginx binds it, so a failed bind is tried again.
        let mut failures = Vec::new();
        for _ in 0..3 {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .expect("an ephemeral port")
                .port();
            let addr = SocketAddr::from(([127, 0, 0, 1], port));
            let dir = tempfile::tempdir().expect("temp dir");
            let d = dir.path().display();
            let config = format!(
                "daemon off;\nmaster_process off;\npid {d}/nginx.pid;\n\
                 error_log stderr notice;\n\
                 events {{ worker_connections 256; }}\n\
                 http {{\n\
                 access_log off;\n\
                 client_body_temp_path {d}/client_body;\nproxy_temp_path {d}/proxy;\n\
                 fastcgi_temp_path {d}/fastcgi;\nuwsgi_temp_path {d}/uwsgi;\n\
                 scgi_temp_path {d}/scgi;\n\
                 {upstream}\n\
                 server {{\nlisten {addr};\n{locations}\n}}\n}}\n"
            );
            let conf = dir.path().join("nginx.conf");
            std::fs::write(&conf, config).expect("write nginx.conf");
            let mut child = Command::new(nginx_binary())
                .arg("-p")
                .arg(dir.path())
                .args(["-e", "stderr", "-c"])
                .arg(&conf)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .expect("start nginx");
            let stderr = child.stderr.take().expect("stderr");
            let mut lines = BufReader::new(stderr).lines();
            // nginx prints its version once its listening sockets are open.
            let mut log = Vec::new();
            let ready = within("nginx to start", async {
                while let Some(line) = lines.next_line().await.expect("nginx's stderr") {
                    let up = line.contains("[notice]") && line.contains(": nginx/");
                    log.push(line);
                    if up {
                        return true;
                    }
                }
                false
            })
            .await;
            if ready {
                // Keep reading, so nginx never blocks on a full pipe; its
                // errors show in the test's output.
                tokio::spawn(async move {
                    while let Ok(Some(line)) = lines.next_line().await {
                        eprintln!("nginx: {line}");
                    }
                });
                return Self {
                    addr,
                    _child: child,
                    _dir: dir,
                };
            }
            let log = log.join("\n");
            assert!(
                log.contains("Address already in use"),
                "nginx did not start:\n{log}"
            );
            failures.push(log);
        }
        panic!("nginx could not bind a port:\n{}", failures.join("\n"));
    }

    /// Sends `raw` through nginx and returns the whole response.
    async fn request(&self, raw: &str) -> String {
        request_at(self.addr, raw).await
    }
}

#[test]
fn the_documented_config_has_the_blocks_the_tests_run() {
    let doc = documented_config();
    assert_eq!(blocks(&doc, "upstream").len(), 1);
    let locations = blocks(&doc, "location");
    assert_eq!(locations.len(), 3, "{locations:#?}");
    assert!(locations.iter().all(|l| l.trim_end().ends_with('}')));
    assert!(locations[0].contains("proxy_set_header Upgrade $http_upgrade;"));
}

#[tokio::test]
async fn a_websocket_client_joins_and_moves_through_nginx() {
    // As docs/security.md runs it: answering for the public name (and for
    // 127.0.0.1, the name this test reaches nginx by).
    let server = TestServer::with(config(|c| {
        c.room.tick_ms = 10;
        c.edge.allowed_hosts = vec![
            "amble.test".parse().expect("host"),
            "127.0.0.1".parse().expect("host"),
        ];
    }))
    .await;
    let nginx = Nginx::before(server.addr).await;
    let url = format!("ws://{}/ws", nginx.addr);
    let mut watcher = Client::connect(&url).await;
    watcher.join("lobby", "watcher").await;
    let mut walker = Client::connect(&url).await;
    walker.join("lobby", "walker").await;
    walker.send_move(1_234, 2_345, 1).await;
    let seen = watcher
        .until(|m| {
            let (_, records) = amble::protocol::decode_motion(&m.motion).ok()?;
            records.into_iter().find(|r| r.motion.position.x == 1_234)
        })
        .await;
    assert_eq!(seen.motion.position.y, 2_345);
    walker.ping().await;

    let health = nginx
        .request("GET /healthz HTTP/1.1\r\nHost: amble.test\r\nConnection: close\r\n\r\n")
        .await;
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    assert!(health.ends_with("\r\n\r\nok\n"), "{health}");
    let metrics = nginx
        .request("GET /metrics HTTP/1.1\r\nHost: amble.test\r\nConnection: close\r\n\r\n")
        .await;
    assert!(metrics.starts_with("HTTP/1.1 403"), "{metrics}");
    assert_eq!(server.metric("amble_connections").await, 2.0);
    // nginx passes any Host on; amble answers only for its own.
    let rebound = nginx
        .request("GET /api/rooms HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n")
        .await;
    assert!(rebound.starts_with("HTTP/1.1 421"), "{rebound}");
    assert!(rebound.contains("\"host_not_allowed\""), "{rebound}");
    assert_eq!(server.metric("amble_host_refused_total").await, 1.0);
}

#[tokio::test]
async fn origins_are_judged_through_nginx() {
    // No development default: only the proxy's own host is admitted.
    let app = "https://app.example.com".parse().expect("origin");
    let server = TestServer::with(config(|c| c.edge.allowed_origins = vec![app])).await;
    let nginx = Nginx::before(server.addr).await;
    let handshake = |origin: &str| {
        format!(
            "GET /ws HTTP/1.1\r\nHost: {}\r\nConnection: Upgrade, close\r\nUpgrade: websocket\r\n\
             Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
             Origin: {origin}\r\n\r\n",
            nginx.addr
        )
    };
    let foreign = nginx.request(&handshake("https://evil.example")).await;
    assert!(foreign.starts_with("HTTP/1.1 403"), "{foreign}");
    assert!(foreign.contains("--allowed-origins"), "{foreign}");
    assert_eq!(
        server
            .metric("amble_upgrades_refused_total{reason=\"origin\"}")
            .await,
        1.0
    );

    // A page served through the proxy is on the proxy's host: nginx passes
    // the Host the browser sent, so amble admits it.
    let mut request = format!("ws://{}/ws", nginx.addr)
        .into_client_request()
        .expect("request");
    let own = format!("http://{}", nginx.addr);
    request
        .headers_mut()
        .insert("Origin", own.parse().expect("origin"));
    let (ws, response) = within("handshake", tokio_tungstenite::connect_async(request))
        .await
        .expect("a page on the proxy's host is admitted");
    assert_eq!(response.status(), 101);
    let mut page = Client::from_stream(ws);
    page.join("lobby", "page").await;
    page.ping().await;
}

impl Nginx {
    /// A WebSocket client through nginx whose socket is bound to `local`
    /// (another loopback address), so nginx forwards that address.
    async fn client_from(&self, local: [u8; 4]) -> Result<Client, tungstenite::Error> {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket
            .bind(SocketAddr::from((local, 0)))
            .expect("bind a loopback address");
        let tcp = within("connect", socket.connect(self.addr))
            .await
            .expect("connect");
        let mut request = format!("ws://{}/ws", self.addr)
            .into_client_request()
            .expect("request");
        request.headers_mut().insert(
            "Sec-WebSocket-Protocol",
            amble::protocol::SUBPROTOCOL.parse().expect("header"),
        );
        let (ws, _) = within(
            "handshake",
            tokio_tungstenite::client_async(request, MaybeTlsStream::Plain(tcp)),
        )
        .await?;
        Ok(Client::from_stream(ws))
    }
}

/// Behind nginx (a trusted proxy) amble counts each client under the
/// address nginx forwards in `X-Forwarded-For`, not under nginx's own.
#[tokio::test]
async fn amble_sees_the_client_address_nginx_forwards() {
    let server = TestServer::with(config(|c| {
        c.addresses.exempt_loopback = false;
        c.addresses.max_connections_per_ip = 1;
        c.addresses.trusted_proxies = vec!["127.0.0.1/32".parse().expect("cidr")];
    }))
    .await;
    let nginx = Nginx::before(server.addr).await;
    let mut two = nginx.client_from([127, 0, 0, 2]).await.expect("127.0.0.2");
    two.join("lobby", "two").await;
    // Another address has a place of its own, though both come from nginx.
    let mut three = nginx.client_from([127, 0, 0, 3]).await.expect("127.0.0.3");
    three.join("lobby", "three").await;
    // 127.0.0.2's second connection is over its cap of one.
    match nginx.client_from([127, 0, 0, 2]).await {
        Err(tungstenite::Error::Http(response)) => assert_eq!(response.status(), 429),
        Err(other) => panic!("expected 429, got {other}"),
        Ok(_) => panic!("a second connection from 127.0.0.2 was admitted"),
    }
    two.ping().await;
    three.ping().await;
    assert_eq!(
        server
            .metric("amble_address_refusals_total{limit=\"connections\"}")
            .await,
        1.0
    );
}

/// A forwarding header amble cannot read does not make the client the
/// proxy (exempt on loopback): each unreadable client hop is an unknown
/// client behind nginx, and all of them share one place under the cap.
#[tokio::test]
async fn unreadable_forwarded_addresses_through_nginx_stay_under_the_cap() {
    let server = TestServer::with(config(|c| {
        c.addresses.max_connections_per_ip = 3;
        c.addresses.trusted_proxies = vec!["127.0.0.1/32".parse().expect("cidr")];
    }))
    .await;
    let nginx = Nginx::before(server.addr).await;
    let mut admitted = Vec::new();
    let mut refused = 0;
    for (i, forwarded) in ["garbage", "unknown", "_hidden", "1.2.3.4:99999, nonsense"]
        .iter()
        .cycle()
        .take(10)
        .enumerate()
    {
        // From 127.0.0.1, a trusted address: nginx appends it, amble skips
        // it and reaches what the client wrote.
        let mut request = format!("ws://{}/ws", nginx.addr)
            .into_client_request()
            .expect("request");
        let headers = request.headers_mut();
        headers.insert("X-Forwarded-For", forwarded.parse().expect("header"));
        headers.insert(
            "Sec-WebSocket-Protocol",
            amble::protocol::SUBPROTOCOL.parse().expect("header"),
        );
        match within("handshake", tokio_tungstenite::connect_async(request)).await {
            Ok((ws, response)) => {
                assert_eq!(response.status(), 101);
                let mut client = Client::from_stream(ws);
                client.join("lobby", &format!("u{i}")).await;
                admitted.push(client);
            }
            Err(tungstenite::Error::Http(response)) => {
                assert_eq!(response.status(), 429, "upgrade {i}");
                refused += 1;
            }
            Err(other) => panic!("upgrade {i}: {other}"),
        }
    }
    assert_eq!(admitted.len(), 3, "at most the cap of 3 of 10");
    assert_eq!(refused, 7);
    for client in &mut admitted {
        client.ping().await;
    }
    assert_eq!(
        server
            .metric("amble_address_refusals_total{limit=\"connections\"}")
            .await,
        7.0
    );
    let unreadable = |reason: &'static str| {
        let series = format!("amble_forwarded_unreadable_total{{reason=\"{reason}\"}}");
        let server = &server;
        async move { server.metric(&series).await }
    };
    assert_eq!(unreadable("garbage").await, 5.0);
    assert_eq!(unreadable("unknown").await, 3.0);
    assert_eq!(unreadable("obfuscated").await, 2.0);
    // A client nginx names by its address is still counted as itself.
    let mut named = nginx.client_from([127, 0, 0, 9]).await.expect("127.0.0.9");
    named.join("lobby", "named").await;
    named.ping().await;
}
