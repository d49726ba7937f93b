//! The server's shared state: what every connection, handler and task sees.
//!
//! [`Shared`] is built once by [`state`] (from [`serve`](super::serve), or
//! by tests that serve connections over in-memory pipes) and handed out as an
//! `Arc`. It holds handles, never a lock of its own: rooms, addresses and
//! the cluster each guard their own state.

use std::sync::Arc;

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::access::addresses::Addresses;
use crate::access::auth::Gate;
use crate::clock::Clock;
use crate::config::Config;
use crate::edge::host::AllowedHosts;
use crate::edge::metrics_token::MetricsToken;
use crate::metrics::Metrics;
use crate::protocol::{Position, Rules};
use crate::room::{RoomSettings, Rooms};

use super::capacity::Capacity;

/// State every connection and handler shares.
pub struct Shared {
    pub config: Arc<Config>,
    pub rules: Rules,
    /// Who may join: everyone, or holders of a signed token.
    pub gate: Gate,
    pub clock: Clock,
    pub metrics: Arc<Metrics>,
    pub rooms: Arc<Rooms>,
    /// Client addresses: per-address caps and join budgets.
    pub addresses: Arc<Addresses>,
    /// One permit per open connection.
    pub connection_slots: Arc<Semaphore>,
    /// Cancelled when the server shuts down.
    pub shutdown: CancellationToken,
    /// Every socket task, so shutdown can wait for them (axum does not
    /// track upgraded connections).
    pub sockets: TaskTracker,
    /// The bearer token `/metrics` requires, if one is configured.
    pub metrics_token: Option<MetricsToken>,
    /// Which `Host` a request may name (`--allowed-hosts`, or the default
    /// for the address the server listens on).
    pub hosts: AllowedHosts,
    /// This node's cluster membership (`--nats`), set once at start.
    pub cluster: std::sync::OnceLock<Arc<crate::cluster::Cluster>>,
}

/// The shared state of a server, with no listener: [`serve`](super::serve)
/// builds it, and tests serve connections over in-memory pipes with it.
/// `local` is the address the server listens on (it decides the default
/// of `--allowed-hosts`).
pub(crate) fn state(
    local: std::net::IpAddr,
    config: Config,
    metrics: Arc<Metrics>,
    gate: Gate,
    metrics_token: Option<MetricsToken>,
    capacity: Capacity,
    open_files: Option<u64>,
) -> Arc<Shared> {
    let config = Arc::new(config);
    let clock = Clock::start();
    metrics.connection_cap.set(i64::from(capacity.websockets));
    metrics.http_connection_cap.set(i64::from(capacity.http));
    metrics
        .open_files_limit
        .set(open_files.map_or(-1, |l| i64::try_from(l).unwrap_or(i64::MAX)));
    let rooms = Rooms::new(
        RoomSettings {
            tick: config.room.tick(),
            tick_workers: usize::from(config.room.tick_workers),
            motion_time_unit_ms: config.room.motion_time_unit_ms(),
            capacity: config.room.room_capacity as usize,
            spawn: Position {
                x: config.room.world_width / 2,
                y: config.room.world_height / 2,
            },
            world: Position {
                x: config.room.world_width,
                y: config.room.world_height,
            },
            limits: config.limits(),
            resume_grace: config.room.resume_grace(),
            max_held: config.max_connections as usize,
        },
        clock,
        Arc::clone(&metrics),
    );
    Arc::new(Shared {
        rules: config.rules(),
        gate,
        clock,
        addresses: Addresses::new(&config.addresses, capacity.sockets(), Arc::clone(&metrics)),
        metrics,
        rooms,
        connection_slots: Arc::new(Semaphore::new(capacity.websockets as usize)),
        shutdown: CancellationToken::new(),
        sockets: TaskTracker::new(),
        metrics_token,
        hosts: AllowedHosts::new(&config.edge.allowed_hosts, local),
        cluster: std::sync::OnceLock::new(),
        config,
    })
}
