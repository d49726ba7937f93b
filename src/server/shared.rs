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
use crate::access::sanctions::Sanctions;
use crate::access::throttle::Gcra;
use crate::api::Api;
use crate::clock::Clock;
use crate::config::Config;
use crate::edge::bearer::BearerToken;
use crate::edge::host::AllowedHosts;
use crate::metrics::Metrics;
use crate::protocol::{Position, Rules, pb};
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
    pub metrics_token: Option<BearerToken>,
    /// Which `Host` a request may name (`--allowed-hosts`, or the default
    /// for the address the server listens on).
    pub hosts: AllowedHosts,
    /// This node's cluster membership (`--nats`), set once at start.
    pub cluster: std::sync::OnceLock<Arc<crate::cluster::Cluster>>,
    /// The app's bans and mutes (server API), checked at Join and chat.
    pub sanctions: Arc<Sanctions>,
    /// The server API's operations on this node's members.
    pub api: Arc<Api>,
    /// The server API's key (`--api-key-file`); without one it answers 404.
    pub api_key: Option<BearerToken>,
    /// The server API's budget, all callers together.
    pub api_budget: std::sync::Mutex<Gcra>,
}

/// The bearer tokens read at start: `/metrics`'s and the server API's.
#[derive(Default)]
pub(crate) struct Keys {
    pub(crate) metrics: Option<BearerToken>,
    pub(crate) api: Option<BearerToken>,
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
    keys: Keys,
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
            spatial: (!config.room.spatial_rooms.is_empty()).then(|| {
                let world = Position {
                    x: config.room.spatial_world_width,
                    y: config.room.spatial_world_height,
                };
                let grid = crate::room::interest::Grid::new(world, config.room.interest_radius);
                crate::room::spatial::SpatialSettings {
                    patterns: config.room.spatial_rooms.clone(),
                    world,
                    capacity: config.room.spatial_capacity as usize,
                    radius_cm: config.room.interest_radius,
                    limits: pb::Limits {
                        world_width: world.x,
                        world_height: world.y,
                        room_capacity: config.room.spatial_capacity,
                        interest_radius: grid.radius_cm(),
                        interest_cell: grid.cell_cm,
                        interest_margin: grid.margin_cm,
                        ..config.limits()
                    },
                }
            }),
        },
        clock,
        Arc::clone(&metrics),
    );
    let sanctions = Arc::new(Sanctions::default());
    let api = Arc::new(Api::new(
        Arc::clone(&rooms),
        Arc::clone(&sanctions),
        clock,
        Arc::clone(&metrics),
        config.rules(),
    ));
    let calls = config.api.api_calls_per_sec;
    let api_budget = std::sync::Mutex::new(Gcra::new(
        std::time::Duration::from_secs(1) / calls.max(1),
        calls.saturating_mul(2),
    ));
    Arc::new(Shared {
        sanctions,
        api,
        api_key: keys.api,
        api_budget,
        rules: config.rules(),
        gate,
        clock,
        addresses: Addresses::new(&config.addresses, capacity.sockets(), Arc::clone(&metrics)),
        metrics,
        rooms,
        connection_slots: Arc::new(Semaphore::new(capacity.websockets as usize)),
        shutdown: CancellationToken::new(),
        sockets: TaskTracker::new(),
        metrics_token: keys.metrics,
        hosts: AllowedHosts::new(&config.edge.allowed_hosts, local),
        cluster: std::sync::OnceLock::new(),
        config,
    })
}

impl Shared {
    /// Members per room: this node's, or in cluster mode every node's
    /// (gathered over NATS, cached for a second).
    pub async fn room_counts(&self) -> Vec<(String, u32)> {
        match self.cluster.get() {
            Some(cluster) => cluster.room_counts().await,
            None => self
                .rooms
                .list()
                .into_iter()
                .map(|r| (r.name, u32::try_from(r.members).unwrap_or(u32::MAX)))
                .collect(),
        }
    }

    /// Runs a server API operation on this node's members and, in cluster
    /// mode, on every live peer's; the answers merged.
    pub async fn api_run(&self, op: crate::api::Op) -> crate::api::Answer {
        let mut answer = self.api.local(&op).await;
        if let Some(cluster) = self.cluster.get() {
            let call = crate::api::remote::call_of(&op);
            for theirs in cluster.api_gather(call, crate::api::GATHER_TIMEOUT).await {
                let node: Arc<str> = theirs
                    .origin
                    .as_ref()
                    .map_or_else(|| "".into(), |o| o.node.as_str().into());
                answer.merge(crate::api::remote::answer_of(theirs, &node, &self.rules));
            }
        }
        self.metrics
            .api_sanctioned
            .set(i64::try_from(self.sanctions.len(self.clock.now_ms())).unwrap_or(i64::MAX));
        answer
    }
}
