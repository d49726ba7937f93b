//! The HTTP surface: routes, shared state and the WebSocket upgrade.
//!
//! `/ws` upgrades to a [`connection`](crate::connection); `/healthz`,
//! `/api/rooms` and `/metrics` are read-only views; everything else is the
//! browser client embedded from `web/`.

use std::sync::Arc;

use axum::Router;
use std::net::SocketAddr;

use axum::extract::ws::WebSocketUpgrade;
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument as _;

use crate::clock::Clock;
use crate::config::Config;
use crate::connection;
use crate::metrics::Metrics;
use crate::protocol::{Rules, SUBPROTOCOL};
use crate::room::Rooms;
use crate::web;

/// State every connection and handler shares.
pub struct Shared {
    pub config: Arc<Config>,
    pub rules: Rules,
    pub clock: Clock,
    pub metrics: Arc<Metrics>,
    pub rooms: Arc<Rooms>,
    /// One permit per open connection.
    pub connection_slots: Arc<Semaphore>,
    /// Cancelled when the server shuts down.
    pub shutdown: CancellationToken,
    /// Every socket task, so shutdown can wait for them (axum does not
    /// track upgraded connections).
    pub sockets: TaskTracker,
}

/// The WebSocket read buffer: client frames are small.
const READ_BUFFER_BYTES: usize = 1024;

pub fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/ws", get(upgrade))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/api/rooms", get(rooms))
        .route("/metrics", get(metrics))
        .fallback(get(web::asset))
        .with_state(shared)
}

async fn upgrade(
    State(shared): State<Arc<Shared>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    ws: WebSocketUpgrade,
) -> Response {
    let max = shared.config.max_message_bytes as usize;
    // tungstenite's own cap is a backstop well above ours, so an oversized
    // frame is read and refused with a clear 1009 rather than a torn socket.
    let hard_cap = max.saturating_mul(4).max(16 * 1024);
    let permit = Arc::clone(&shared.connection_slots)
        .try_acquire_owned()
        .ok();
    // Counted by the tracker from now, not from when the upgrade completes,
    // so a socket upgraded during shutdown is still waited for.
    let tracked = shared.sockets.token();
    let largest = largest_frame(&shared.config);
    ws.protocols([SUBPROTOCOL])
        .read_buffer_size(READ_BUFFER_BYTES)
        .write_buffer_size(0)
        .max_write_buffer_size(largest)
        .max_message_size(hard_cap)
        .max_frame_size(hard_cap)
        .on_upgrade(move |socket| {
            let span = tracing::debug_span!(
                "conn",
                %peer,
                room = tracing::field::Empty,
                member = tracing::field::Empty
            );
            async move {
                match permit {
                    Some(permit) => connection::run(socket, shared, permit).await,
                    None => connection::refuse(socket, shared).await,
                }
                drop(tracked);
            }
            .instrument(span)
        })
}

/// The largest frame the server may have to write: a `Welcome` or `Resync`
/// snapshot of a full room whose names use 4-byte characters throughout.
fn largest_frame(config: &Config) -> usize {
    let per_member = 4 * config.max_name_chars as usize + 64;
    config.room_capacity as usize * per_member + 4 * 1024
}

#[derive(serde::Serialize)]
struct RoomList {
    rooms: Vec<crate::room::RoomInfo>,
}

async fn rooms(State(shared): State<Arc<Shared>>) -> axum::Json<RoomList> {
    axum::Json(RoomList {
        rooms: shared.rooms.list(),
    })
}

async fn metrics(State(shared): State<Arc<Shared>>) -> impl IntoResponse {
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        )],
        shared.metrics.render(),
    )
}
