//! The HTTP routes: `/ws` upgrades to a WebSocket (see [`upgrade`]);
//! `/healthz`, `/api/rooms` and `/metrics` are read-only views; everything
//! else is the browser client embedded from `web/`. The client's files and
//! `/api/rooms` may be read from other origins ([`cors`]).

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use tracing::debug;

use crate::server::shared::Shared;

use super::cors::{self, Readers};
use super::host;
use super::upgrade::upgrade;
use super::web;

pub fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/ws", any(upgrade))
        .route("/healthz", get(healthz))
        .route("/api/rooms", get(rooms).options(rooms_preflight))
        .route("/metrics", get(metrics))
        .merge(super::api::router())
        .fallback(any(client))
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&shared),
            allowed_host,
        ))
        .with_state(shared)
}

/// Refuses, before any route, a request whose `Host` this server does not
/// answer for (`--allowed-hosts`; see [`host`]).
async fn allowed_host(
    State(shared): State<Arc<Shared>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if shared.hosts.admits(request.uri(), request.headers()) {
        return next.run(request).await;
    }
    shared.metrics.host_refused.inc();
    let host = request
        .headers()
        .get(header::HOST)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    debug!(
        ?host,
        path = request.uri().path(),
        "request refused: Host not allowed"
    );
    host::refusal(&shared.hosts)
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
async fn rooms(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    let cors = cors::allow(
        Readers::AllowedOrigins,
        &headers,
        &shared.config.edge.allowed_origins,
    );
    let mut response = room_list(&shared).await.into_response();
    response.headers_mut().extend(cors);
    response
}

async fn rooms_preflight(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    cors::preflight(
        Readers::AllowedOrigins,
        &headers,
        &shared.config.edge.allowed_origins,
        &shared.metrics,
    )
}

/// The embedded client's files, readable from any page; a preflight for
/// them; 405 for any other method.
async fn client(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    let allowed = &shared.config.edge.allowed_origins;
    match method {
        Method::GET | Method::HEAD => {
            let mut response = web::asset(uri).await;
            response
                .headers_mut()
                .extend(cors::allow(Readers::Anyone, &headers, allowed));
            response
        }
        Method::OPTIONS => cors::preflight(Readers::Anyone, &headers, allowed, &shared.metrics),
        _ => cors::method_not_allowed(),
    }
}

async fn room_list(shared: &Shared) -> axum::Json<RoomList> {
    let rooms = shared
        .room_counts()
        .await
        .into_iter()
        .map(|(name, members)| crate::room::RoomInfo {
            capacity: shared.rooms.capacity_of(&name),
            name,
            members: members as usize,
        })
        .collect();
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
            // What prometheus-client writes: OpenMetrics text (`# EOF`,
            // counters as `_total`), so it says so.
            HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
        )],
        shared.metrics.render(),
    )
        .into_response()
}
