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
//! - [`listener`]: the accept loop and the open-file budget; [`http`]: one
//!   HTTP connection before it is a WebSocket (deadlines, sizes, the pool);
//!   [`addresses`]: client addresses behind proxies, per-address limits.
//! - [`app`]: routes and shared state; [`web`]: the embedded browser client.
//! - [`handshake`], [`origin`], [`metrics_token`]: what is refused at the
//!   door (a bad WebSocket handshake, a foreign page, a scraper without the
//!   token).
//! - [`cluster`]: cluster mode (`--nats`): rooms shared by several nodes
//!   through NATS; the transport, the peer directory and the wire format.
//! - [`metrics`], [`config`], [`clock`].
//!
//! [`serve`] runs the whole server on a listener until a shutdown future
//! completes, which is how both `main` and the tests start it.

pub mod addresses;
pub mod app;
pub mod auth;
pub mod clock;
pub mod cluster;
pub mod config;
pub mod connection;
pub mod fanout;
pub mod handshake;
pub mod http;
pub mod listener;
pub mod metrics;
pub mod metrics_token;
pub mod origin;
pub mod outbox;
pub mod protocol;
pub mod room;
pub mod throttle;
pub mod web;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn};

use crate::addresses::Addresses;
use crate::app::Shared;
use crate::clock::Clock;
use crate::config::Config;
use crate::http::Http;
use crate::listener::{Capacity, RESERVED_FILES};
use crate::metrics::Metrics;
use crate::metrics_token::MetricsToken;
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
    let metrics_token = match &config.metrics_token_file {
        Some(path) => Some(
            MetricsToken::read(path)
                .map_err(|err| std::io::Error::new(std::io::ErrorKind::InvalidInput, err))?,
        ),
        None => {
            info!(
                "/metrics is open to anyone who can reach this server: --metrics-token-file guards it"
            );
            None
        }
    };
    let open_files = listener::open_files_limit();
    let capacity = Capacity::fit(
        open_files,
        config.max_connections,
        config.max_http_connections,
    );
    if capacity.lowered {
        warn!(
            open_files = open_files.unwrap_or_default(),
            websockets = capacity.websockets,
            http = capacity.http,
            "the open-file limit ({limit}) cannot hold --max-connections {ws} + \
             --max-http-connections {http} + {RESERVED_FILES} for the server itself: serving at \
             most {ews} WebSocket and {ehttp} HTTP connections. Raise the limit (`ulimit -n`, \
             systemd LimitNOFILE=, docker --ulimit nofile=) or lower those flags",
            limit = open_files.unwrap_or_default(),
            ws = config.max_connections,
            http = config.max_http_connections,
            ews = capacity.websockets,
            ehttp = capacity.http,
        );
    }
    let port = listener.local_addr()?.port();
    let cluster_settings = cluster::ClusterSettings::from_config(&config, port)
        .map_err(|err| std::io::Error::new(std::io::ErrorKind::InvalidInput, err))?;
    let (shared, http) = state(config, gate, metrics_token, capacity, open_files);
    if let Some(settings) = cluster_settings {
        let cluster = cluster::link::start(
            settings,
            Arc::clone(&shared.metrics),
            shared.rules.clone(),
            shared.clock,
        )
        .await
        .map_err(|err| std::io::Error::new(std::io::ErrorKind::InvalidInput, err))?;
        shared.rooms.attach_cluster(Arc::clone(&cluster));
        let _ = shared.cluster.set(cluster);
    }
    let config = Arc::clone(&shared.config);
    let token = shared.shutdown.clone();
    let ticker = tokio::spawn(Arc::clone(&shared.rooms).run_ticker(token.clone()));
    let cutter = tokio::spawn(Arc::clone(&shared.rooms).run_cutter(token.clone()));
    let accept = tokio::spawn(listener::accept_loop(
        listener,
        Arc::clone(&http),
        Arc::clone(&shared.addresses),
        Arc::new(Semaphore::new(capacity.sockets())),
        Arc::clone(&shared.metrics),
        config.socket_send_buffer as usize,
        token.clone(),
    ));

    shutdown.await;
    let stop_by = tokio::time::Instant::now() + Duration::from_millis(config.shutdown_timeout_ms);
    if let Some(cluster) = shared.cluster.get() {
        // First, so the other nodes remove this node's members at once.
        let rooms = u32::try_from(shared.metrics.rooms.get()).unwrap_or(0);
        let members = u32::try_from(shared.metrics.members.get()).unwrap_or(0);
        cluster.stop(rooms, members).await;
    }
    info!("shutting down: closing every connection with 1001");
    shared.rooms.begin_shutdown();
    token.cancel();
    // The loop stops at once; it owns the listener, which closes with it.
    let _ = accept.await;
    // HTTP connections finish what they are answering (each within a short
    // drain of its own); socket tasks close with 1001.
    http.tasks.close();
    shared.sockets.close();
    let closed = async {
        http.tasks.wait().await;
        shared.sockets.wait().await;
    };
    if tokio::time::timeout_at(stop_by, closed).await.is_err() {
        warn!(
            websockets = shared.sockets.len(),
            http = http.tasks.len(),
            "shutdown timeout: some connections did not close in time"
        );
    }
    let _ = ticker.await;
    let _ = cutter.await;
    info!("stopped");
    Ok(())
}

/// The shared state and HTTP side of a server, with no listener: [`serve`]
/// builds it, and tests serve connections over in-memory pipes with it.
pub(crate) fn state(
    config: Config,
    gate: auth::Gate,
    metrics_token: Option<MetricsToken>,
    capacity: Capacity,
    open_files: Option<u64>,
) -> (Arc<Shared>, Arc<Http>) {
    let config = Arc::new(config);
    let clock = Clock::start();
    let metrics = Arc::new(Metrics::default());
    metrics.connection_cap.set(i64::from(capacity.websockets));
    metrics.http_connection_cap.set(i64::from(capacity.http));
    metrics
        .open_files_limit
        .set(open_files.map_or(-1, |l| i64::try_from(l).unwrap_or(i64::MAX)));
    let rooms = Rooms::new(
        RoomSettings {
            tick: config.tick(),
            tick_workers: usize::from(config.tick_workers),
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
    let shared = Arc::new(Shared {
        rules: config.rules(),
        gate,
        clock,
        addresses: Addresses::new(&config, capacity.sockets(), Arc::clone(&metrics)),
        metrics,
        rooms,
        connection_slots: Arc::new(Semaphore::new(capacity.websockets as usize)),
        shutdown: CancellationToken::new(),
        sockets: TaskTracker::new(),
        metrics_token,
        cluster: std::sync::OnceLock::new(),
        config,
    });
    let http = Http::new(Arc::clone(&shared), capacity.http as usize);
    (shared, http)
}
