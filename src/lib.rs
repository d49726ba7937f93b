//! amble: a lightweight-presence server.
//!
//! Clients join rooms over WebSocket, send their position at most about
//! once a second (or one walk for a whole click-to-move path), and see
//! everyone else in the room move, interpolating locally. No physics runs
//! here: the server validates, throttles, batches and fans out.
//!
//! # Layout
//!
//! - [`protocol`]: the `amble.v1` wire types, validation, encoding. No I/O.
//! - [`throttle`]: rate limits with the clock passed in.
//! - [`room`]: rooms, members, the tick that batches moves.
//! - [`fanout`]: the seam between a room and its receivers; [`outbox`]: a
//!   socket's write side, which rooms write into directly.
//! - [`connection`]: one task per socket.
//! - [`auth`]: who may join: signed tokens (JWT) on `Join`.
//! - [`app`]: routes and shared state; [`web`]: the embedded browser client.
//! - [`metrics`], [`config`], [`clock`].
//!
//! [`serve`] runs the whole server on a listener until a shutdown future
//! completes, which is how both `main` and the tests start it.

pub mod app;
pub mod auth;
pub mod clock;
pub mod config;
pub mod connection;
pub mod fanout;
pub mod metrics;
pub mod outbox;
pub mod protocol;
pub mod room;
pub mod throttle;
pub mod web;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::serve::ListenerExt;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn};

use crate::app::Shared;
use crate::clock::Clock;
use crate::config::Config;
use crate::metrics::Metrics;
use crate::protocol::Position;
use crate::room::{RoomSettings, Rooms};

/// Serves amble on `listener` until `shutdown` completes, then closes every
/// WebSocket with 1001 and returns once they are closed (or after
/// `config.shutdown_timeout_ms`).
pub async fn serve(
    listener: TcpListener,
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let gate = auth::Gate::from_config(&config)
        .map_err(|err| std::io::Error::new(std::io::ErrorKind::InvalidInput, err))?;
    match &gate {
        auth::Gate::Open => warn!(
            "no --auth-hs256-secret-file or --auth-public-key-file: \
             anyone may join any room with any name (open mode)"
        ),
        auth::Gate::Tokens(verifier) => info!(
            algorithm = ?verifier.algorithm(),
            "tokens required: every Join must carry a token signed with the configured key"
        ),
    }
    let config = Arc::new(config);
    let clock = Clock::start();
    let metrics = Arc::new(Metrics::default());
    let rooms = Rooms::new(
        RoomSettings {
            tick: config.tick(),
            motion_time_unit_ms: config.motion_time_unit_ms(),
            capacity: config.room_capacity as usize,
            spawn: Position {
                x: config.world_width / 2,
                y: config.world_height / 2,
            },
            world: Position {
                x: config.world_width,
                y: config.world_height,
            },
            limits: config.limits(),
        },
        clock,
        Arc::clone(&metrics),
    );
    let token = CancellationToken::new();
    let shared = Arc::new(Shared {
        rules: config.rules(),
        gate,
        clock,
        metrics,
        rooms: Arc::clone(&rooms),
        connection_slots: Arc::new(Semaphore::new(config.max_connections as usize)),
        shutdown: token.clone(),
        sockets: TaskTracker::new(),
        config: Arc::clone(&config),
    });
    let ticker = tokio::spawn(Arc::clone(&rooms).run_ticker(token.clone()));

    let send_buffer = config.socket_send_buffer as usize;
    let listener = listener.tap_io(move |tcp| {
        // Small frames must not wait for Nagle's algorithm.
        if let Err(err) = tcp.set_nodelay(true) {
            warn!(%err, "TCP_NODELAY");
        }
        if send_buffer > 0
            && let Err(err) = socket2::SockRef::from(&*tcp).set_send_buffer_size(send_buffer)
        {
            warn!(%err, "SO_SNDBUF");
        }
    });
    let stop = token.clone();
    let rooms_at_stop = Arc::clone(&rooms);
    let app = app::router(Arc::clone(&shared))
        .into_make_service_with_connect_info::<std::net::SocketAddr>();
    let limit = Duration::from_millis(config.shutdown_timeout_ms);
    let signalled = Arc::new(std::sync::OnceLock::new());
    let signalled_at = Arc::clone(&signalled);
    let server = axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            shutdown.await;
            let _ = signalled_at.set(tokio::time::Instant::now());
            info!("shutting down: closing every connection with 1001");
            rooms_at_stop.begin_shutdown();
            stop.cancel();
        })
        .into_future();
    // axum's graceful shutdown waits for every plain HTTP connection with no
    // limit of its own, so the whole of shutdown runs under one deadline:
    // the signal plus `shutdown_timeout_ms`.
    let out_of_time = async {
        token.cancelled().await;
        tokio::time::sleep(limit).await;
    };
    tokio::select! {
        served = server => served?,
        () = out_of_time => warn!("shutdown timeout: HTTP connections still open, stopping anyway"),
    }
    let stop_by = signalled
        .get()
        .copied()
        .unwrap_or_else(tokio::time::Instant::now)
        + limit;

    // axum has stopped accepting; the socket tasks are closing.
    token.cancel();
    shared.sockets.close();
    if tokio::time::timeout_at(stop_by, shared.sockets.wait())
        .await
        .is_err()
    {
        warn!(
            open = shared.sockets.len(),
            "shutdown timeout: some connections did not close in time"
        );
    }
    let _ = ticker.await;
    info!("stopped");
    Ok(())
}
