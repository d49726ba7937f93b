//! The door over real sockets: the strict WebSocket handshake, foreign
//! origins, and the bearer token on /metrics. Refused requests here never
//! ask for `Connection: close`: each response read to its end proves the
//! server closed the connection itself.

use std::io::Write as _;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use amble::origin::OriginPattern;
use tokio_tungstenite::tungstenite;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
use tokio_tungstenite::tungstenite::http::HeaderValue;

use crate::support::*;

/// The RFC 6455 sample key.
const KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";

/// An upgrade request to `/ws` with `method`, complete but for `extra`
/// headers, which does not ask the server to close.
fn upgrade(method: &str, host: Option<&str>, extra: &str) -> String {
    let host = host.map(|h| format!("Host: {h}\r\n")).unwrap_or_default();
    format!(
        "{method} /ws HTTP/1.1\r\n{host}Connection: Upgrade\r\nUpgrade: websocket\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: {KEY}\r\n{extra}\r\n"
    )
}

/// The head of a response, lower-cased, and its body.
fn split(response: &str) -> (String, &str) {
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((response, ""));
    (head.to_ascii_lowercase(), body)
}

/// Asserts that `response` is one refusal with `status`, closing the
/// connection, whose body says `why` (HEAD responses have no body).
fn assert_refused(response: &str, status: &str, why: &str) {
    let (head, body) = split(response);
    assert!(
        head.starts_with(&format!("http/1.1 {status}")),
        "{response}"
    );
    assert!(
        head.lines()
            .any(|l| l.starts_with("connection:") && l.trim_end().ends_with("close")),
        "{response}"
    );
    assert!(body.contains(why), "{response}");
    assert_eq!(
        response.matches("HTTP/1.1 ").count(),
        1,
        "one response only: {response}"
    );
}

async fn refused(server: &TestServer, reason: &str) -> f64 {
    server
        .metric(&format!(
            "amble_upgrades_refused_total{{reason=\"{reason}\"}}"
        ))
        .await
}

#[tokio::test]
async fn head_and_other_methods_get_405_allow_get_and_a_closed_connection() {
    let server = TestServer::start().await;
    let host = server.addr.to_string();
    // HEAD used to get 101 (axum routes HEAD to GET handlers).
    let head = server.request(&upgrade("HEAD", Some(&host), "")).await;
    assert_refused(&head, "405", "");
    assert!(split(&head).0.contains("\r\nallow: get"), "{head}");
    for method in ["POST", "PUT", "DELETE", "OPTIONS"] {
        let response = server
            .request(&upgrade(method, Some(&host), "Content-Length: 0\r\n"))
            .await;
        assert_refused(&response, "405", "a WebSocket handshake is a GET request");
        assert!(split(&response).0.contains("\r\nallow: get"), "{response}");
    }
    assert_eq!(refused(&server, "method").await, 5.0);
    let (mut a, _) = server.joined("lobby", "a").await;
    a.ping().await;
}

#[tokio::test]
async fn repeated_handshake_headers_and_a_missing_host_get_400() {
    let server = TestServer::start().await;
    let host = server.addr.to_string();
    let host = Some(host.as_str());
    for (request, why) in [
        (
            upgrade("GET", host, &format!("Sec-WebSocket-Key: {KEY}\r\n")),
            "repeated Sec-WebSocket-Key header",
        ),
        (
            upgrade("GET", host, "Sec-WebSocket-Version: 13\r\n"),
            "repeated Sec-WebSocket-Version header",
        ),
        (
            upgrade("GET", host, "Host: localhost\r\n"),
            "repeated Host header",
        ),
        (
            upgrade(
                "GET",
                host,
                "Origin: http://localhost:1\r\nOrigin: http://localhost:1\r\n",
            ),
            "repeated Origin header",
        ),
    ] {
        assert_refused(&server.request(&request).await, "400", why);
    }
    let hostless = server.request(&upgrade("GET", None, "")).await;
    assert_refused(&hostless, "400", "missing Host header");
    assert_eq!(refused(&server, "duplicate_header").await, 4.0);
    assert_eq!(refused(&server, "host").await, 1.0);
}

#[tokio::test]
async fn a_refused_upgrade_ends_the_connection_before_a_smuggled_request() {
    let server = TestServer::start().await;
    let host = server.addr.to_string();
    // What a proxy that took the refusal for a tunnel would pass on next.
    let smuggled = format!("GET /healthz HTTP/1.1\r\nHost: {host}\r\n\r\n");
    for refusal in [
        upgrade("HEAD", Some(&host), ""),
        upgrade("GET", Some(&host), "Origin: https://evil.example\r\n"),
        format!("GET /ws HTTP/1.1\r\nHost: {host}\r\n\r\n"),
    ] {
        let response = server.request(&format!("{refusal}{smuggled}")).await;
        assert_eq!(response.matches("HTTP/1.1 ").count(), 1, "{response}");
        assert!(!response.contains("\r\n\r\nok"), "{response}");
    }
}

/// A WebSocket handshake with `origin`, as a browser would send it.
async fn connect_from(
    server: &TestServer,
    origin: Option<&str>,
) -> Result<Client, tungstenite::Error> {
    let mut request = format!("ws://{}/ws", server.addr)
        .into_client_request()
        .expect("request");
    request.headers_mut().insert(
        "Sec-WebSocket-Protocol",
        HeaderValue::from_static(amble::protocol::SUBPROTOCOL),
    );
    if let Some(origin) = origin {
        request
            .headers_mut()
            .insert("Origin", HeaderValue::from_str(origin).expect("origin"));
    }
    let (ws, _) = within("handshake", tokio_tungstenite::connect_async(request)).await?;
    Ok(Client::from_stream(ws))
}

/// The page at `origin` joins and is served.
async fn joins_from(server: &TestServer, origin: Option<&str>) {
    let mut c = connect_from(server, origin)
        .await
        .unwrap_or_else(|err| panic!("{origin:?} refused: {err}"));
    c.join("lobby", "visitor").await;
    c.ping().await;
}

/// The page at `origin` gets 403 with a reason and a closed connection.
async fn is_refused_from(server: &TestServer, origin: &str) {
    match connect_from(server, Some(origin)).await {
        Err(tungstenite::Error::Http(response)) => assert_eq!(response.status(), 403, "{origin}"),
        Err(other) => panic!("{origin}: expected 403, got {other}"),
        Ok(_) => panic!("{origin} was admitted"),
    }
    let raw = server
        .request(&upgrade(
            "GET",
            Some(&server.addr.to_string()),
            &format!("Origin: {origin}\r\n"),
        ))
        .await;
    assert_refused(&raw, "403", "--allowed-origins");
}

#[tokio::test]
async fn by_default_only_local_pages_and_non_browsers_are_admitted() {
    let server = TestServer::start().await;
    let own = format!("http://{}", server.addr);
    for origin in [
        None,
        Some(own.as_str()),
        Some("http://localhost:5173"),
        Some("http://127.0.0.1:8080"),
    ] {
        joins_from(&server, origin).await;
    }
    for origin in [
        "https://evil.example",
        "null",
        "https://localhost:5173",
        "http://localhost.evil.example",
        &format!("http://{}", server.addr).replace("127.0.0.1", "127.0.0.2"),
    ] {
        is_refused_from(&server, origin).await;
    }
    assert_eq!(refused(&server, "origin").await, 10.0);
}

#[tokio::test]
async fn allowed_origins_replaces_the_development_default() {
    let app: OriginPattern = "https://app.example.com".parse().expect("origin");
    let server = TestServer::with(config(|c| c.edge.allowed_origins = vec![app])).await;
    joins_from(&server, Some("https://app.example.com")).await;
    joins_from(&server, Some(&format!("http://{}", server.addr))).await;
    joins_from(&server, None).await;
    is_refused_from(&server, "http://localhost:5173").await;
    is_refused_from(&server, "https://app.example.com.evil.example").await;

    let any = TestServer::with(config(|c| {
        c.edge.allowed_origins = vec![OriginPattern::Any]
    }))
    .await;
    joins_from(&any, Some("https://evil.example")).await;
    assert_eq!(refused(&any, "origin").await, 0.0);
}

fn token_file(token: &str) -> tempfile::NamedTempFile {
    let mut file = tempfile::NamedTempFile::new().expect("temp file");
    writeln!(file, "{token}").expect("write token");
    file
}

/// `GET /metrics` with an `Authorization` header, if any: the whole response.
async fn scrape(server: &TestServer, authorization: Option<&str>) -> String {
    let auth = authorization
        .map(|a| format!("Authorization: {a}\r\n"))
        .unwrap_or_default();
    server
        .request(&format!(
            "GET /metrics HTTP/1.1\r\nHost: localhost\r\n{auth}Connection: close\r\n\r\n"
        ))
        .await
}

#[tokio::test]
async fn metrics_needs_the_bearer_token_when_one_is_set() {
    let token = "3f9c1d0a6b7e4c2d8a5f0e1b9c7d6a4e";
    let file = token_file(token);
    let path = file.path().to_owned();
    let server = TestServer::with(config(|c| c.edge.metrics_token_file = Some(path))).await;

    let none = scrape(&server, None).await;
    let (head, body) = split(&none);
    assert!(head.starts_with("http/1.1 401"), "{none}");
    assert!(head.contains("www-authenticate: bearer"), "{none}");
    assert!(body.contains("Authorization: Bearer"), "{none}");
    assert!(!body.contains("amble_"), "{none}");
    for wrong in [
        "Bearer 3f9c1d0a6b7e4c2d8a5f0e1b9c7d6a4f",
        "Bearer 3f9c1d0a6b7e4c2d",
        &format!("Basic {token}"),
    ] {
        let response = scrape(&server, Some(wrong)).await;
        assert!(response.starts_with("HTTP/1.1 401"), "{response}");
        assert!(response.contains("invalid_token"), "{response}");
    }

    let ok = scrape(&server, Some(&format!("Bearer {token}"))).await;
    assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
    assert!(
        ok.contains("amble_metrics_refused_total{reason=\"missing_token\"} 1\n"),
        "{ok}"
    );
    assert!(
        ok.contains("amble_metrics_refused_total{reason=\"wrong_token\"} 3\n"),
        "{ok}"
    );
    // The other read-only endpoints stay open.
    assert!(server.get("/healthz").await.0.contains("200"));
    assert!(server.get("/api/rooms").await.0.contains("200"));
}

#[tokio::test]
async fn an_unusable_token_file_stops_the_server_at_start() {
    let short = token_file("secret");
    for (path, why) in [
        (short.path().to_owned(), "at least 16"),
        (
            std::path::PathBuf::from("/nonexistent/amble-metrics-token"),
            "cannot read",
        ),
    ] {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let err = within(
            "serve to fail",
            amble::serve(
                listener,
                config(|c| c.edge.metrics_token_file = Some(path.clone())),
                std::future::pending(),
            ),
        )
        .await
        .expect_err("an unusable token file");
        let text = err.to_string();
        assert!(text.contains(why), "{text}");
        assert!(text.contains(&path.display().to_string()), "{text}");
    }
}

#[tokio::test]
async fn the_binary_refuses_a_malformed_origin_at_start() {
    let out = within(
        "amble to exit",
        tokio::process::Command::new(env!("CARGO_BIN_EXE_amble"))
            .args([
                "--listen",
                "127.0.0.1:0",
                "--allowed-origins",
                "https://app.example.com/",
            ])
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("run amble");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--allowed-origins"), "{stderr}");
    assert!(stderr.contains("trailing '/'"), "{stderr}");
}

/// Behind a trusted proxy, a client address over its cap is refused at the
/// upgrade (429); that refusal closes the connection too.
#[tokio::test]
async fn a_client_over_its_address_cap_behind_a_proxy_gets_429_and_a_closed_connection() {
    let server = TestServer::with(config(|c| {
        c.addresses.exempt_loopback = false;
        c.addresses.max_connections_per_ip = 1;
        c.addresses.trusted_proxies = vec!["127.0.0.1/32".parse().expect("cidr")];
    }))
    .await;
    let host = server.addr.to_string();
    let from = "X-Forwarded-For: 203.0.113.5\r\n";
    // The first stays open, upgraded.
    let mut first = tokio::net::TcpStream::connect(server.addr)
        .await
        .expect("connect");
    first
        .write_all(upgrade("GET", Some(&host), from).as_bytes())
        .await
        .expect("write");
    let mut head = [0u8; 12];
    within("101", first.read_exact(&mut head))
        .await
        .expect("read");
    assert_eq!(&head, b"HTTP/1.1 101");
    let second = server.request(&upgrade("GET", Some(&host), from)).await;
    assert_refused(&second, "429", "");
}
