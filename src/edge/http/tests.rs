//! Arbitrary bytes through the real HTTP handshake and the real connection
//! loop, over in-memory pipes, in paused time: no panic, and every
//! connection ends with an HTTP response or a WebSocket close, while a
//! fresh connection is still served.
//!
//! More cases: `PROPTEST_CASES=100000 cargo test --lib http::tests`.

use std::net::SocketAddr;

use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, Version};
use proptest::prelude::*;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _, DuplexStream};

use super::*;
use crate::config::Config;
use crate::server::capacity::Capacity;

/// Virtual time a connection may take to end: past the WebSocket idle
/// timeout (45 s), the close handshake and the HTTP deadlines.
const ENDS_WITHIN: Duration = Duration::from_secs(120);

const UPGRADE: &[u8] = b"GET /ws HTTP/1.1\r\nHost: amble\r\nUpgrade: websocket\r\n\
Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n\
Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Protocol: amble.v1\r\n\r\n";

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(48)
}

fn server() -> (Arc<Shared>, Arc<Http>) {
    let config = Config::default();
    let capacity = Capacity::fit(None, 16, 16);
    let shared = crate::server::shared::state(
        // Not loopback: any Host, as these tests send.
        std::net::Ipv4Addr::UNSPECIFIED.into(),
        config,
        Arc::new(crate::metrics::Metrics::default()),
        crate::access::auth::Gate::Open,
        crate::server::shared::Keys::default(),
        capacity,
        None,
    );
    let http = Http::new(Arc::clone(&shared), capacity.http as usize);
    (shared, http)
}

fn peer() -> SocketAddr {
    SocketAddr::from(([192, 0, 2, 1], 40_000))
}

fn connect(http: &Arc<Http>) -> DuplexStream {
    let (client, server) = tokio::io::duplex(64 * 1024);
    tokio::spawn(Arc::clone(http).serve_connection(server, peer(), Admission::default()));
    client
}

/// Sends `input` (never closing the write side, as a stalled client would)
/// and returns all the server wrote, once it has closed.
async fn exchange(http: &Arc<Http>, input: &[u8]) -> Vec<u8> {
    let client = connect(http);
    let (mut rd, mut wr) = tokio::io::split(client);
    let input = input.to_vec();
    let writer = tokio::spawn(async move {
        let _ = wr.write_all(&input).await;
        // Held open until the server is done.
        std::future::pending::<()>().await;
        drop(wr);
    });
    let mut out = Vec::new();
    let read = tokio::time::timeout(ENDS_WITHIN, rd.read_to_end(&mut out)).await;
    writer.abort();
    assert!(
        read.is_ok(),
        "the connection did not end; it sent {:?}",
        String::from_utf8_lossy(&out)
    );
    out
}

/// `GET /healthz` on a fresh connection answers 200.
async fn still_served(http: &Arc<Http>) {
    let out = exchange(
        http,
        b"GET /healthz HTTP/1.1\r\nHost: amble\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(out.starts_with(b"HTTP/1.1 200 "), "{out:?}");
}

/// The length of the response head at the start of `out`.
fn head_len(out: &[u8]) -> Option<usize> {
    out.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4)
}

/// One whole frame at the start of `frames`: its opcode, whether it was
/// masked, its payload (unmasked) and what follows it.
fn split_frame(frames: &[u8]) -> Option<(u8, bool, Vec<u8>, &[u8])> {
    let opcode = frames.first()? & 0x0f;
    let masked = frames.get(1)? & 0x80 != 0;
    let (len, mut start): (usize, usize) = match frames[1] & 0x7f {
        126 => (
            usize::from(u16::from_be_bytes([*frames.get(2)?, *frames.get(3)?])),
            4,
        ),
        127 => {
            let mut b = [0u8; 8];
            b.copy_from_slice(frames.get(2..10)?);
            (usize::try_from(u64::from_be_bytes(b)).ok()?, 10)
        }
        n => (usize::from(n), 2),
    };
    let mut mask = [0u8; 4];
    if masked {
        mask.copy_from_slice(frames.get(start..start.checked_add(4)?)?);
        start += 4;
    }
    let end = start.checked_add(len)?;
    let payload = frames.get(start..end)?;
    let payload = payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]);
    Some((opcode, masked, payload.collect(), &frames[end..]))
}

/// The payload of the first close frame among the whole frames at the
/// start of `frames`.
fn first_close(mut frames: &[u8]) -> Option<Vec<u8>> {
    while let Some((opcode, _, payload, rest)) = split_frame(frames) {
        if opcode == 0x8 {
            return Some(payload);
        }
        frames = rest;
    }
    None
}

/// What every connection must end with: HTTP responses, or a `101` and
/// then unmasked WebSocket frames ending in a close with one of our codes.
/// A close without a code is allowed only as the echo of the client's own
/// first close, when that had no code either (RFC 6455, 5.5.1 and 7.4.1).
fn assert_ends_well(input: &[u8], out: &[u8]) {
    assert!(
        out.starts_with(b"HTTP/1.1 ") || out.starts_with(b"HTTP/1.0 "),
        "no HTTP response: {:?}",
        String::from_utf8_lossy(out)
    );
    if out.starts_with(b"HTTP/1.1 101 ") {
        let head = head_len(out).expect("a whole 101 head");
        let mut frames = &out[head..];
        while let Some((_, masked, _, rest)) = split_frame(frames) {
            assert!(!masked, "server frames are not masked");
            frames = rest;
        }
        let code = first_close(&out[head..]).map(|payload| {
            payload
                .get(..2)
                .map_or(1005, |c| u16::from_be_bytes([c[0], c[1]]))
        });
        let client_closed_without_code = head_len(input)
            .and_then(|h| first_close(&input[h..]))
            .is_some_and(|payload| payload.is_empty());
        assert!(
            matches!(code, Some(1000..=1003 | 1007..=1009 | 1013))
                || (code == Some(1005) && client_closed_without_code),
            "WebSocket ended with {code:?}"
        );
    }
}

fn run(f: impl std::future::Future<Output = ()>) {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("runtime")
        .block_on(f);
}

/// A valid upgrade, then `tail`: a close ends it, and the server still serves.
async fn after_an_upgrade(tail: Vec<u8>) {
    let (_shared, http) = server();
    let input = [UPGRADE, &tail].concat();
    let out = exchange(&http, &input).await;
    assert!(out.starts_with(b"HTTP/1.1 101 "));
    assert_ends_well(&input, &out);
    still_served(&http).await;
}

/// One masked client frame.
fn frame(fin: bool, opcode: u8, payload: &[u8], mask: [u8; 4]) -> Vec<u8> {
    let mut f = vec![(u8::from(fin) << 7) | (opcode & 0x0f)];
    match payload.len() {
        n @ 0..=125 => f.push(0x80 | n as u8),
        n => {
            f.push(0x80 | 126);
            f.extend_from_slice(&(n as u16).to_be_bytes());
        }
    }
    f.extend_from_slice(&mask);
    f.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    f
}

fn frames() -> impl Strategy<Value = Vec<u8>> {
    let one = (
        any::<bool>(),
        prop_oneof![
            Just(0u8),
            Just(1),
            Just(2),
            Just(8),
            Just(9),
            Just(10),
            0u8..16
        ],
        proptest::collection::vec(any::<u8>(), 0..300),
        any::<[u8; 4]>(),
    )
        .prop_map(|(fin, op, payload, mask)| frame(fin, op, &payload, mask));
    proptest::collection::vec(one, 0..6).prop_map(|fs| fs.concat())
}

/// A request head from pieces that parsers trip on.
fn heads() -> impl Strategy<Value = Vec<u8>> {
    let method = prop_oneof![
        Just("GET"),
        Just("HEAD"),
        Just("POST"),
        Just("PRI"),
        Just("G\0T")
    ];
    let path = prop_oneof![
        Just("/ws"),
        Just("/healthz"),
        Just("/metrics"),
        Just("*"),
        Just("/%zz")
    ];
    let version = prop_oneof![
        Just("HTTP/1.1"),
        Just("HTTP/1.0"),
        Just("HTTP/2.0"),
        Just("HTTP/1.")
    ];
    let pick =
        |words: &'static [&'static str]| proptest::sample::select(words).prop_map(str::to_owned);
    let name = prop_oneof![
        pick(&[
            "Host",
            "Upgrade",
            "Connection",
            "Sec-WebSocket-Key",
            "Sec-WebSocket-Version",
            "Sec-WebSocket-Protocol",
            "Content-Length",
            "Transfer-Encoding",
            "X-Forwarded-For",
            "Forwarded",
        ]),
        "[ -~]{0,12}",
    ];
    let value = prop_oneof![
        pick(&[
            "websocket",
            "Upgrade",
            "13",
            "dGhlIHNhbXBsZSBub25jZQ==",
            "chunked",
            "5"
        ]),
        "[ -~]{0,40}",
        proptest::collection::vec(any::<u8>(), 0..40)
            .prop_map(|b| String::from_utf8_lossy(&b).into_owned()),
    ];
    let headers = proptest::collection::vec((name, value), 0..10);
    let ending = prop_oneof![Just("\r\n"), Just(""), Just("\n"), Just("\r\n0\r\n\r\n")];
    (
        method,
        path,
        version,
        headers,
        ending,
        proptest::collection::vec(any::<u8>(), 0..64),
    )
        .prop_map(|(m, p, v, hs, end, tail)| {
            let mut head = format!("{m} {p} {v}\r\n");
            for (n, val) in hs {
                head.push_str(&format!("{n}: {val}\r\n"));
            }
            head.push_str(end);
            let mut bytes = head.into_bytes();
            bytes.extend(tail);
            bytes
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    #[test]
    fn arbitrary_bytes_from_the_start(input in proptest::collection::vec(any::<u8>(), 0..2_048)) {
        run(async {
            let (_shared, http) = server();
            assert_ends_well(&input, &exchange(&http, &input).await);
            still_served(&http).await;
        });
    }

    #[test]
    fn arbitrary_request_heads(input in heads()) {
        run(async {
            let (_shared, http) = server();
            assert_ends_well(&input, &exchange(&http, &input).await);
            still_served(&http).await;
        });
    }

    #[test]
    fn arbitrary_bytes_after_an_upgrade(tail in proptest::collection::vec(any::<u8>(), 0..2_048)) {
        run(after_an_upgrade(tail));
    }

    #[test]
    fn arbitrary_frames_after_an_upgrade(tail in frames()) {
        run(after_an_upgrade(tail));
    }

    /// The handshake check alone, on any headers: an accept key only for
    /// a well-formed request, otherwise a 4xx/505 with a reason.
    #[test]
    fn the_handshake_check_never_panics(
        headers in proptest::collection::vec(
            (prop_oneof![
                Just("upgrade"), Just("connection"), Just("sec-websocket-key"),
                Just("sec-websocket-version"), Just("host"), Just("origin"),
            ], proptest::collection::vec(any::<u8>(), 0..40)),
            0..8,
        ),
        http11 in any::<bool>(),
        method in prop_oneof![Just(Method::GET), Just(Method::HEAD), Just(Method::POST)],
    ) {
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            if let Ok(v) = HeaderValue::from_bytes(&value) {
                map.append(HeaderName::from_static(name), v);
            }
        }
        let version = if http11 { Version::HTTP_11 } else { Version::HTTP_10 };
        let allowed = Config::default().edge.allowed_origins;
        match crate::edge::handshake::check(&method, version, &map, &allowed) {
            Ok(accept) => prop_assert_eq!(accept.len(), 28),
            Err(refusal) => {
                let status = refusal.status;
                prop_assert!(status.is_client_error() || status == StatusCode::HTTP_VERSION_NOT_SUPPORTED);
                prop_assert!(!refusal.text.is_empty());
            }
        }
    }
}

#[test]
fn an_http2_preface_gets_505() {
    run(async {
        let (_shared, http) = server();
        let out = exchange(&http, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await;
        assert!(out.starts_with(b"HTTP/1.1 505 "), "{out:?}");
        still_served(&http).await;
    });
}

#[test]
fn a_full_pool_evicts_the_connection_waiting_longest() {
    run(async {
        let (shared, http) = server();
        // 16 connections stall in their heads, one after the other.
        let mut stalled = Vec::new();
        for _ in 0..16 {
            let mut c = connect(&http);
            c.write_all(b"GET / HTTP/1.1\r\n").await.expect("write");
            stalled.push(c);
            tokio::time::advance(Duration::from_millis(10)).await;
        }
        // A newcomer is served; the first of them is told why it goes.
        still_served(&http).await;
        let mut out = Vec::new();
        stalled[0].read_to_end(&mut out).await.expect("read");
        assert!(out.starts_with(b"HTTP/1.1 503 "), "{out:?}");
        assert_eq!(shared.metrics.http_evictions.get(), 1);
    });
}
