//! The WebSocket opening handshake (RFC 6455 section 4.2), checked strictly:
//! what is accepted, and for everything else the status, the plain-text
//! reason and the metric label it is refused with.
//!
//! Every refusal closes the HTTP connection (`Connection: close`), so a
//! proxy that forwarded the request cannot go on treating the connection as
//! a tunnel after a response that is not `101`.

use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Version, header};
use axum::response::{IntoResponse, Response};

use crate::edge::origin::{self, OriginPattern};

/// Why a handshake was refused: the label of
/// `amble_upgrades_refused_total{reason="..."}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RefusalReason {
    /// A method other than `GET` (`HEAD` included): 405.
    Method,
    /// An HTTP version other than 1.1: 505.
    HttpVersion,
    /// No `Host` header: 400.
    Host,
    /// A plain request, without `Upgrade: websocket` and
    /// `Connection: upgrade`: 426.
    NotWebSocket,
    /// `Sec-WebSocket-Version` other than 13: 426.
    WebSocketVersion,
    /// `Host`, `Origin`, `Sec-WebSocket-Key` or `Sec-WebSocket-Version`
    /// more than once: 400.
    DuplicateHeader,
    /// `Sec-WebSocket-Key` missing or not 16 bytes in base64: 400.
    Key,
    /// An `Origin` that `--allowed-origins` does not admit: 403.
    Origin,
}

impl RefusalReason {
    #[cfg(test)]
    pub const ALL: [Self; 8] = [
        Self::Method,
        Self::HttpVersion,
        Self::Host,
        Self::NotWebSocket,
        Self::WebSocketVersion,
        Self::DuplicateHeader,
        Self::Key,
        Self::Origin,
    ];

    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Self::Method => "method",
            Self::HttpVersion => "http_version",
            Self::Host => "host",
            Self::NotWebSocket => "not_websocket",
            Self::WebSocketVersion => "websocket_version",
            Self::DuplicateHeader => "duplicate_header",
            Self::Key => "key",
            Self::Origin => "origin",
        }
    }
}

/// A refused handshake: the status, the reason for the metric, and the
/// text sent back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub status: StatusCode,
    pub reason: RefusalReason,
    pub text: &'static str,
}

impl Refusal {
    fn new(status: StatusCode, reason: RefusalReason, text: &'static str) -> Self {
        Self {
            status,
            reason,
            text,
        }
    }
}

impl IntoResponse for Refusal {
    /// The reason as plain text, `Connection: close`, and the headers the
    /// status asks for: `Allow` with 405, `Upgrade` and the version with 426.
    fn into_response(self) -> Response {
        let mut response = (self.status, format!("{}\n", self.text)).into_response();
        let headers = response.headers_mut();
        if self.status == StatusCode::UPGRADE_REQUIRED {
            // RFC 9110 section 15.5.22: a 426 names the protocol to switch to.
            headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
            headers.insert(
                header::CONNECTION,
                HeaderValue::from_static("upgrade, close"),
            );
            headers.insert(
                header::SEC_WEBSOCKET_VERSION,
                HeaderValue::from_static("13"),
            );
        } else {
            headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        if self.status == StatusCode::METHOD_NOT_ALLOWED {
            headers.insert(header::ALLOW, HeaderValue::from_static("GET"));
        }
        response
    }
}

/// Checks an opening handshake and returns its `Sec-WebSocket-Accept`, or
/// why it is refused. `allowed` is `--allowed-origins`.
pub fn check(
    method: &Method,
    version: Version,
    headers: &HeaderMap,
    allowed: &[OriginPattern],
) -> Result<HeaderValue, Refusal> {
    use RefusalReason as R;
    if method != Method::GET {
        return Err(Refusal::new(
            StatusCode::METHOD_NOT_ALLOWED,
            R::Method,
            "a WebSocket handshake is a GET request",
        ));
    }
    if version != Version::HTTP_11 {
        return Err(Refusal::new(
            StatusCode::HTTP_VERSION_NOT_SUPPORTED,
            R::HttpVersion,
            "WebSocket connections need HTTP/1.1",
        ));
    }
    let host = single(headers, header::HOST, "repeated Host header")?;
    let Some(host) = host else {
        return Err(Refusal::new(
            StatusCode::BAD_REQUEST,
            R::Host,
            "missing Host header",
        ));
    };
    let has_token = |name: header::HeaderName, token: &str| {
        headers
            .get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case(token))
    };
    if !has_token(header::UPGRADE, "websocket") || !has_token(header::CONNECTION, "upgrade") {
        return Err(Refusal::new(
            StatusCode::UPGRADE_REQUIRED,
            R::NotWebSocket,
            "this is amble's WebSocket endpoint: connect with a WebSocket client \
             (Upgrade: websocket, Connection: upgrade)",
        ));
    }
    let ws_version = single(
        headers,
        header::SEC_WEBSOCKET_VERSION,
        "repeated Sec-WebSocket-Version header",
    )?;
    if ws_version.is_none_or(|v| v.as_bytes() != b"13") {
        // RFC 6455 section 4.4: 426, naming the version we speak.
        return Err(Refusal::new(
            StatusCode::UPGRADE_REQUIRED,
            R::WebSocketVersion,
            "unsupported WebSocket version: send Sec-WebSocket-Version: 13",
        ));
    }
    let key = single(
        headers,
        header::SEC_WEBSOCKET_KEY,
        "repeated Sec-WebSocket-Key header",
    )?;
    let Some(key) = key else {
        return Err(Refusal::new(
            StatusCode::BAD_REQUEST,
            R::Key,
            "missing Sec-WebSocket-Key",
        ));
    };
    if !is_nonce(key.as_bytes()) {
        return Err(Refusal::new(
            StatusCode::BAD_REQUEST,
            R::Key,
            "Sec-WebSocket-Key must be 16 random bytes in base64",
        ));
    }
    let origin = single(headers, header::ORIGIN, "repeated Origin header")?;
    let origin_text = match origin.map(HeaderValue::to_str) {
        None => None,
        Some(Ok(text)) => Some(text),
        Some(Err(_)) => Some(""), // not ASCII: no origin looks like that
    };
    let host_text = host.to_str().unwrap_or_default();
    if !origin::admits(origin_text, host_text, allowed) {
        return Err(Refusal::new(
            StatusCode::FORBIDDEN,
            R::Origin,
            "pages from this origin may not connect to this server \
             (the operator lists the allowed ones in --allowed-origins)",
        ));
    }
    let accept = tungstenite::handshake::derive_accept_key(key.as_bytes());
    // A base64 string is always a valid header value; should that ever
    // change, refuse rather than panic.
    HeaderValue::from_str(&accept).map_err(|_| {
        Refusal::new(
            StatusCode::BAD_REQUEST,
            R::Key,
            "Sec-WebSocket-Key cannot be answered",
        )
    })
}

/// The one value of header `name`, `None` when it is absent, or a 400 when
/// it is repeated.
fn single<'h>(
    headers: &'h HeaderMap,
    name: header::HeaderName,
    repeated: &'static str,
) -> Result<Option<&'h HeaderValue>, Refusal> {
    let mut values = headers.get_all(name).iter();
    let first = values.next();
    if values.next().is_some() {
        return Err(Refusal::new(
            StatusCode::BAD_REQUEST,
            RefusalReason::DuplicateHeader,
            repeated,
        ));
    }
    Ok(first)
}

/// Whether `key` is what RFC 6455 section 4.1 asks for: 16 bytes in
/// base64, which is 22 characters and `==`.
fn is_nonce(key: &[u8]) -> bool {
    key.len() == 24
        && key.ends_with(b"==")
        && key[..22]
            .iter()
            .all(|c| c.is_ascii_alphanumeric() || *c == b'+' || *c == b'/')
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";

    fn request(extra: &[(&'static str, &str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in [
            ("host", "amble.example.com"),
            ("upgrade", "websocket"),
            ("connection", "Upgrade"),
            ("sec-websocket-version", "13"),
            ("sec-websocket-key", KEY),
        ] {
            headers.insert(name, HeaderValue::from_static(value));
        }
        for (name, value) in extra {
            headers.append(*name, HeaderValue::from_str(value).expect("value"));
        }
        headers
    }

    fn defaults() -> Vec<OriginPattern> {
        crate::config::Config::default().edge.allowed_origins
    }

    fn refusal(method: Method, headers: &HeaderMap) -> (StatusCode, RefusalReason) {
        let refused =
            check(&method, Version::HTTP_11, headers, &defaults()).expect_err("should be refused");
        (refused.status, refused.reason)
    }

    #[test]
    fn a_good_handshake_gets_the_rfc_sample_answer() {
        let accept =
            check(&Method::GET, Version::HTTP_11, &request(&[]), &defaults()).expect("accepted");
        assert_eq!(accept, "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
    }

    #[test]
    fn only_get_is_a_handshake() {
        for method in [Method::HEAD, Method::POST, Method::OPTIONS, Method::CONNECT] {
            assert_eq!(
                refusal(method, &request(&[])),
                (StatusCode::METHOD_NOT_ALLOWED, RefusalReason::Method)
            );
        }
    }

    #[test]
    fn repeated_headers_are_refused() {
        for name in [
            "host",
            "sec-websocket-key",
            "sec-websocket-version",
            "origin",
        ] {
            let mut headers = request(&[]);
            headers.append(name, HeaderValue::from_static("http://localhost:1"));
            if name == "origin" {
                headers.append(name, HeaderValue::from_static("http://localhost:1"));
            }
            assert_eq!(
                refusal(Method::GET, &headers),
                (StatusCode::BAD_REQUEST, RefusalReason::DuplicateHeader),
                "{name}"
            );
        }
    }

    #[test]
    fn host_is_required() {
        let mut headers = request(&[]);
        headers.remove(header::HOST);
        assert_eq!(
            refusal(Method::GET, &headers),
            (StatusCode::BAD_REQUEST, RefusalReason::Host)
        );
    }

    #[test]
    fn origins_are_checked_last() {
        let foreign = request(&[("origin", "https://evil.example")]);
        assert_eq!(
            refusal(Method::GET, &foreign),
            (StatusCode::FORBIDDEN, RefusalReason::Origin)
        );
        let local = request(&[("origin", "http://localhost:5173")]);
        assert!(check(&Method::GET, Version::HTTP_11, &local, &defaults()).is_ok());
        let own = request(&[("origin", "https://amble.example.com")]);
        assert!(check(&Method::GET, Version::HTTP_11, &own, &defaults()).is_ok());
        let mut binary = request(&[]);
        binary.insert(
            header::ORIGIN,
            HeaderValue::from_bytes(b"http://\xfflocalhost").expect("opaque bytes"),
        );
        assert_eq!(
            refusal(Method::GET, &binary),
            (StatusCode::FORBIDDEN, RefusalReason::Origin)
        );
    }

    #[test]
    fn refusals_close_the_connection_and_say_why() {
        for (status, reason) in [
            (StatusCode::METHOD_NOT_ALLOWED, RefusalReason::Method),
            (StatusCode::UPGRADE_REQUIRED, RefusalReason::NotWebSocket),
            (StatusCode::FORBIDDEN, RefusalReason::Origin),
        ] {
            let response = Refusal::new(status, reason, "because").into_response();
            assert_eq!(response.status(), status);
            let connection = response.headers()[header::CONNECTION]
                .to_str()
                .expect("ascii");
            assert!(connection.ends_with("close"), "{connection}");
            assert_eq!(
                response.headers().get(header::ALLOW).is_some(),
                status == StatusCode::METHOD_NOT_ALLOWED
            );
        }
    }

    #[test]
    fn labels_are_distinct() {
        let mut labels: Vec<_> = RefusalReason::ALL.iter().map(|r| r.label()).collect();
        labels.sort_unstable();
        labels.dedup();
        assert_eq!(labels.len(), RefusalReason::ALL.len());
    }
}
