//! Everything before a WebSocket exists: the accept loop ([`listener`]),
//! one HTTP/1.1 connection with its pool ([`http`]) and deadlines ([`watch`]), the
//! routes ([`routes`]), the upgrade ([`upgrade`]) and what is refused at the
//! door: a `Host` this server does not answer for ([`host`]), a bad opening
//! handshake ([`handshake`]), a foreign page ([`origin`]), a scraper without
//! the token ([`bearer`]). [`web`]
//! serves the browser client embedded from `web/`, readable from other
//! origins ([`cors`]).
//!
//! The edge hands an upgraded socket to [`session`](crate::session) and
//! keeps nothing of it.

use axum::http::StatusCode;
use axum::response::{IntoResponse as _, Response};

mod api;
pub mod bearer;
mod cors;
pub mod handshake;
pub mod host;
pub mod http;
pub mod listener;
pub mod origin;
mod routes;
mod upgrade;
mod watch;
mod web;

/// A refusal as the edge writes every one: `status` and the JSON body
/// `{"error": {"code", "message"}}`.
fn json_error(status: StatusCode, code: &str, message: &str) -> Response {
    let body = serde_json::json!({ "error": { "code": code, "message": message } });
    (status, axum::Json(body)).into_response()
}
