//! The HTTP routes: `/ws` upgrades to a WebSocket (see [`upgrade`]);
//! `/healthz`, `/api/rooms` and `/metrics` are read-only views; everything
//! else is the browser client embedded from `web/`.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};

use crate::server::shared::Shared;

use super::upgrade::upgrade;
use super::web;

pub fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/ws", any(upgrade))
        .route("/healthz", get(healthz))
        .route("/api/rooms", get(rooms))
        .route("/metrics", get(metrics))
        .fallback(get(web::asset))
        .with_state(shared)
}

#[derive(serde::Serialize)]
struct RoomList {
    rooms: Vec<crate::room::RoomInfo>,
}

/// `ok` while the process serves; in cluster mode a second line says
/// whether the node has its cluster.
async fn healthz(State(shared): State<Arc<Shared>>) -> String {
    match shared.cluster.get() {
        Some(cluster) => format!("ok\n{}\n", cluster.health_line()),
        None => "ok\n".to_owned(),
    }
}

/// Rooms with their member counts: this node's, or in cluster mode every
/// node's (gathered over NATS, cached for a second).
async fn rooms(State(shared): State<Arc<Shared>>) -> axum::Json<RoomList> {
    let rooms = match shared.cluster.get() {
        Some(cluster) => cluster
            .room_counts()
            .await
            .into_iter()
            .map(|(name, members)| crate::room::RoomInfo {
                name,
                members: members as usize,
                capacity: shared.config.room.room_capacity as usize,
            })
            .collect(),
        None => shared.rooms.list(),
    };
    axum::Json(RoomList { rooms })
}

async fn metrics(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    if let Some(token) = &shared.metrics_token
        && let Err(denied) = token.admits(&headers)
    {
        shared.metrics.refuse_metrics(denied.label());
        return denied.into_response();
    }
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        )],
        shared.metrics.render(),
    )
        .into_response()
}
