//! Everything before a WebSocket exists: the accept loop ([`listener`]),
//! one HTTP/1.1 connection with its pool ([`http`]) and deadlines ([`watch`]), the
//! routes ([`routes`]), the upgrade ([`upgrade`]) and what is refused at the
//! door: a `Host` this server does not answer for ([`host`]), a bad opening
//! handshake ([`handshake`]), a foreign page ([`origin`]), a scraper without
//! the token ([`metrics_token`]). [`web`]
//! serves the browser client embedded from `web/`, readable from other
//! origins ([`cors`]).
//!
//! The edge hands an upgraded socket to [`session`](crate::session) and
//! keeps nothing of it.

mod cors;
pub mod handshake;
pub mod host;
pub mod http;
pub mod listener;
pub mod metrics_token;
pub mod origin;
mod routes;
mod upgrade;
mod watch;
mod web;
