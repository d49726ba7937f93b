//! Cross-origin reads (CORS), so a page on an app's own origin can load
//! the SDK and read `/api/rooms` from amble.
//!
//! Two rules, both without credentials (amble sets no cookies, and tokens
//! travel in the WebSocket URL, never in a cookie):
//! - the embedded client's files are public code: any page may load them
//!   (`Access-Control-Allow-Origin: *`);
//! - `/api/rooms` is read by the pages that may open a WebSocket here (the
//!   same `Origin` rule as the handshake, `--allowed-origins`): their origin
//!   is named back, with `Vary: Origin`; other pages get no CORS header, so
//!   the browser keeps the answer from them.
//!
//! A preflight (`OPTIONS` with `Access-Control-Request-Method`) is answered
//! 204 for `GET` and `HEAD` under the same rules, or refused with a JSON
//! error. docs/security.md says why these headers and not others.

use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::json_error as error;
use super::origin::{self, OriginPattern};
use crate::metrics::Metrics;

/// How long a browser may cache a preflight's answer.
const PREFLIGHT_MAX_AGE: HeaderValue = HeaderValue::from_static("600");
/// The methods a cross-origin page may use.
const METHODS: HeaderValue = HeaderValue::from_static("GET, HEAD, OPTIONS");
/// The longest `Access-Control-Request-Headers` echoed back.
const MAX_REQUEST_HEADERS: usize = 512;

/// Who may read a resource from another origin.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Readers {
    /// Any page (public files).
    Anyone,
    /// The pages that may open a WebSocket here.
    AllowedOrigins,
}

/// The CORS headers for a request with `headers` to a resource read by
/// `readers`: what to add to the answer, or nothing.
pub fn allow(
    readers: Readers,
    headers: &HeaderMap,
    allowed: &[OriginPattern],
) -> Vec<(HeaderName, HeaderValue)> {
    match readers {
        Readers::Anyone => vec![(
            header::ACCESS_CONTROL_ALLOW_ORIGIN,
            HeaderValue::from_static("*"),
        )],
        Readers::AllowedOrigins => {
            let mut out = vec![(header::VARY, HeaderValue::from_static("Origin"))];
            if let Some(origin) = admitted_origin(headers, allowed) {
                out.push((header::ACCESS_CONTROL_ALLOW_ORIGIN, origin));
            }
            out
        }
    }
}

/// The request's `Origin`, when it is one page (not `null`) that the
/// handshake would admit.
fn admitted_origin(headers: &HeaderMap, allowed: &[OriginPattern]) -> Option<HeaderValue> {
    let mut origins = headers.get_all(header::ORIGIN).iter();
    let origin = origins.next()?;
    if origins.next().is_some() {
        return None;
    }
    let text = origin.to_str().ok()?;
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or_default();
    origin::admits(Some(text), host, allowed).then(|| origin.clone())
}

/// The answer to an `OPTIONS` request for a resource read by `readers`:
/// 204 with the CORS headers for a preflight of `GET` or `HEAD` it allows,
/// else 403 (a page it does not admit) or 405 (another method), each with
/// a JSON error.
pub fn preflight(
    readers: Readers,
    headers: &HeaderMap,
    allowed: &[OriginPattern],
    metrics: &Metrics,
) -> Response {
    let asked = headers
        .get(header::ACCESS_CONTROL_REQUEST_METHOD)
        .and_then(|m| m.to_str().ok())
        .and_then(|m| m.parse::<Method>().ok());
    if !matches!(asked, None | Some(Method::GET | Method::HEAD)) {
        metrics.refuse_cors("method");
        return not_allowed("only GET and HEAD may be used from another origin");
    }
    let cors = allow(readers, headers, allowed);
    let named = cors
        .iter()
        .any(|(name, _)| name == header::ACCESS_CONTROL_ALLOW_ORIGIN);
    if !named {
        metrics.refuse_cors("origin");
        return error(
            StatusCode::FORBIDDEN,
            "origin_not_allowed",
            "pages from this origin may not read this (the operator lists the allowed ones in --allowed-origins)",
        );
    }
    let mut response = StatusCode::NO_CONTENT.into_response();
    let out = response.headers_mut();
    for (name, value) in cors {
        out.insert(name, value);
    }
    out.insert(header::ACCESS_CONTROL_ALLOW_METHODS, METHODS);
    out.insert(header::ACCESS_CONTROL_MAX_AGE, PREFLIGHT_MAX_AGE);
    if let Some(asked) = headers
        .get(header::ACCESS_CONTROL_REQUEST_HEADERS)
        .filter(|h| h.len() <= MAX_REQUEST_HEADERS)
    {
        out.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, asked.clone());
    }
    response
}

/// 405 for a method other than `GET`, `HEAD` and `OPTIONS`.
pub fn method_not_allowed() -> Response {
    not_allowed("only GET, HEAD and OPTIONS are served here")
}

/// A 405 naming the methods served (`Allow`).
fn not_allowed(message: &str) -> Response {
    let mut response = error(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        message,
    );
    response.headers_mut().insert(header::ALLOW, METHODS);
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (name, value) in pairs {
            h.append(
                HeaderName::from_bytes(name.as_bytes()).expect("a name"),
                HeaderValue::from_str(value).expect("a value"),
            );
        }
        h
    }

    fn defaults() -> Vec<OriginPattern> {
        vec![
            "http://localhost:*".parse().expect("a pattern"),
            "https://app.example.com".parse().expect("a pattern"),
        ]
    }

    fn allow_origin(cors: &[(HeaderName, HeaderValue)]) -> Option<&str> {
        cors.iter()
            .find(|(n, _)| n == header::ACCESS_CONTROL_ALLOW_ORIGIN)
            .map(|(_, v)| v.to_str().expect("ascii"))
    }

    #[test]
    fn public_files_are_readable_from_any_page() {
        for h in [
            request(&[]),
            request(&[("origin", "https://evil.example")]),
            request(&[("origin", "null")]),
        ] {
            assert_eq!(allow_origin(&allow(Readers::Anyone, &h, &[])), Some("*"));
        }
    }

    #[test]
    fn the_room_list_names_back_only_an_admitted_page() {
        let cases = [
            (
                vec![("origin", "http://localhost:5173"), ("host", "amble:3000")],
                Some("http://localhost:5173"),
            ),
            (
                vec![
                    ("origin", "https://app.example.com"),
                    ("host", "amble:3000"),
                ],
                Some("https://app.example.com"),
            ),
            // A page on the server's own host and port.
            (
                vec![("origin", "http://amble:3000"), ("host", "amble:3000")],
                Some("http://amble:3000"),
            ),
            (
                vec![("origin", "https://evil.example"), ("host", "amble:3000")],
                None,
            ),
            (vec![("origin", "null"), ("host", "amble:3000")], None),
            (
                vec![
                    ("origin", "https://app.example.com"),
                    ("origin", "https://evil.example"),
                ],
                None,
            ),
            // No Origin: not a cross-origin read; nothing to name.
            (vec![("host", "amble:3000")], None),
        ];
        for (headers, want) in cases {
            let cors = allow(Readers::AllowedOrigins, &request(&headers), &defaults());
            assert_eq!(allow_origin(&cors), want, "{headers:?}");
            assert!(
                cors.iter().any(|(n, v)| n == header::VARY && v == "Origin"),
                "{headers:?}"
            );
        }
    }

    #[test]
    fn preflights_allow_get_and_head_for_admitted_pages() {
        let page = [
            ("origin", "http://localhost:5173"),
            ("host", "amble:3000"),
            ("access-control-request-method", "GET"),
            ("access-control-request-headers", "x-app-trace"),
        ];
        let metrics = Metrics::default();
        let ok = preflight(
            Readers::AllowedOrigins,
            &request(&page),
            &defaults(),
            &metrics,
        );
        assert_eq!(ok.status(), StatusCode::NO_CONTENT);
        let h = ok.headers();
        assert_eq!(
            h[header::ACCESS_CONTROL_ALLOW_ORIGIN],
            "http://localhost:5173"
        );
        assert_eq!(
            h[header::ACCESS_CONTROL_ALLOW_METHODS],
            "GET, HEAD, OPTIONS"
        );
        assert_eq!(h[header::ACCESS_CONTROL_ALLOW_HEADERS], "x-app-trace");
        assert_eq!(h[header::ACCESS_CONTROL_MAX_AGE], "600");

        let evil = request(&[
            ("origin", "https://evil.example"),
            ("host", "amble:3000"),
            ("access-control-request-method", "GET"),
        ]);
        let refused = preflight(Readers::AllowedOrigins, &evil, &defaults(), &metrics);
        assert_eq!(refused.status(), StatusCode::FORBIDDEN);
        assert!(
            refused
                .headers()
                .get(header::ACCESS_CONTROL_ALLOW_ORIGIN)
                .is_none()
        );
        // Public files: any page.
        let anyone = preflight(Readers::Anyone, &evil, &defaults(), &metrics);
        assert_eq!(anyone.status(), StatusCode::NO_CONTENT);
        assert_eq!(anyone.headers()[header::ACCESS_CONTROL_ALLOW_ORIGIN], "*");

        let post = request(&[
            ("origin", "http://localhost:5173"),
            ("access-control-request-method", "POST"),
        ]);
        let refused = preflight(Readers::Anyone, &post, &defaults(), &metrics);
        assert_eq!(refused.status(), StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(refused.headers()[header::ALLOW], "GET, HEAD, OPTIONS");
        let count = |reason: &str| {
            let labels = crate::metrics::RejectLabels {
                reason: reason.to_owned(),
            };
            metrics.cors_refused.get_or_create(&labels).get()
        };
        assert_eq!((count("origin"), count("method")), (1, 1));
    }
}
