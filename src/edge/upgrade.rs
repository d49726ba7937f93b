//! The WebSocket upgrade of `GET /ws` (RFC 6455 section 4.2), by hand: the
//! handshake check, the address's WebSocket cap, the connection slot, and
//! the hand-over of the raw upgraded stream to a [`session`](crate::session)
//! task with its WebSocket settings.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use tokio_tungstenite::WebSocketStream;
use tracing::Instrument as _;
use tracing::debug;
use tungstenite::protocol::{Role, WebSocketConfig};

use crate::config::Config;
use crate::protocol::SUBPROTOCOL;
use crate::server::shared::Shared;
use crate::session::connection;
use crate::session::outbox::{Outbox, WsIo};

use super::handshake::{self, Refusal};
use super::watch::unwrap_upgraded;

/// The WebSocket read buffer: client frames are small.
const READ_BUFFER_BYTES: usize = 1024;

/// Upgrades `GET /ws` to a WebSocket (RFC 6455 section 4.2) by hand rather
/// than through axum's extractor: the connection needs the raw upgraded
/// stream, so that rooms can write into it directly (see `outbox`).
pub(super) async fn upgrade(
    State(shared): State<Arc<Shared>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    mut request: Request,
) -> Response {
    let accept = match handshake::check(
        request.method(),
        request.version(),
        request.headers(),
        &shared.config.edge.allowed_origins,
    ) {
        Ok(accept) => accept,
        Err(refusal) => return refuse(&shared, peer, request.headers(), refusal),
    };
    let client = match shared.addresses.admit_upgrade(peer.ip(), request.headers()) {
        Ok(client) => client,
        Err(refusal) => {
            debug!(%peer, %refusal, "WebSocket upgrade refused");
            // Closed like every refused upgrade (see `handshake`).
            return (
                StatusCode::TOO_MANY_REQUESTS,
                [(header::CONNECTION, HeaderValue::from_static("close"))],
                format!("{refusal}\n"),
            )
                .into_response();
        }
    };
    let offers_ours = request
        .headers()
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|p| p.trim() == SUBPROTOCOL);
    let on_upgrade = hyper::upgrade::on(&mut request);

    // The limit holds for one frame and for a fragmented message while it
    // is assembled: the first frame past it is refused (1009), before its
    // payload is read.
    let max = shared.config.session.max_message_bytes as usize;
    let largest = largest_frame(&shared.config);
    let ws_config = WebSocketConfig::default()
        .read_buffer_size(READ_BUFFER_BYTES)
        .write_buffer_size(0)
        .max_write_buffer_size(largest)
        .max_message_size(Some(max))
        .max_frame_size(Some(max));
    let permit = Arc::clone(&shared.connection_slots)
        .try_acquire_owned()
        .ok();
    // Counted by the tracker from now, not from when the upgrade completes,
    // so a socket upgraded during shutdown is still waited for.
    let tracked = shared.sockets.token();
    let span = tracing::debug_span!(
        "conn",
        %peer,
        client = %client.who,
        room = tracing::field::Empty,
        member = tracing::field::Empty
    );
    tokio::spawn(
        async move {
            let upgraded = match on_upgrade.await {
                Ok(upgraded) => upgraded,
                Err(err) => {
                    debug!(%err, "upgrade did not complete");
                    return;
                }
            };
            let queue = shared.config.session.send_queue_bytes as usize;
            let outbox = Outbox::new(
                unwrap_upgraded(upgraded),
                Arc::clone(&shared.metrics),
                queue,
                largest,
            );
            let io = WsIo(Arc::clone(&outbox));
            let socket = WebSocketStream::from_raw_socket(io, Role::Server, Some(ws_config)).await;
            match permit {
                Some(permit) => connection::run(socket, outbox, shared, permit, client).await,
                // Rare: boxed, so it does not add to every connection's task.
                None => Box::pin(connection::refuse(socket, shared)).await,
            }
            drop(tracked);
        }
        .instrument(span),
    );

    let mut response = StatusCode::SWITCHING_PROTOCOLS.into_response();
    let headers = response.headers_mut();
    headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    headers.insert(header::SEC_WEBSOCKET_ACCEPT, accept);
    if offers_ours {
        headers.insert(
            header::SEC_WEBSOCKET_PROTOCOL,
            HeaderValue::from_static(SUBPROTOCOL),
        );
    }
    response
}

/// Answers a refused handshake: counted by reason, logged at debug with the
/// request's origin, and the connection closed after the response.
fn refuse(shared: &Shared, peer: SocketAddr, headers: &HeaderMap, refusal: Refusal) -> Response {
    shared.metrics.refuse_upgrade(refusal.reason.label());
    let origin = headers
        .get(header::ORIGIN)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    debug!(%peer, ?origin, why = refusal.text, "WebSocket upgrade refused");
    refusal.into_response()
}

/// The largest frame the server may have to write: a `Welcome` or `Resync`
/// snapshot of a full room whose names use 4-byte characters throughout,
/// each member with its whole data (each entry with its field overhead)
/// and a shown `sub`.
fn largest_frame(config: &Config) -> usize {
    let session = &config.session;
    let per_member = 4 * session.max_name_chars as usize
        + session.max_data_bytes as usize
        + 8 * session.max_data_entries as usize
        + crate::access::auth::MAX_SUB_BYTES
        + 64;
    config.room.room_capacity as usize * per_member + 4 * 1024
}
