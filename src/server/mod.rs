//! The server: its shared state ([`shared::Shared`]), the socket budget fitted to
//! the open-file limit ([`capacity`]), and [`serve`], which runs the whole
//! server on a listener until a shutdown future completes; `main` and every
//! test start amble through it.

pub mod capacity;
pub mod shared;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tracing::{info, warn};

use crate::access::auth::{self, Gate};
use crate::cluster;
use crate::config::Config;
use crate::edge::bearer::{BearerToken, TokenFileError};
use crate::edge::http::Http;
use crate::edge::listener::accept_loop;
use crate::hooks::{self, Hooks};
use crate::metrics::Metrics;

use capacity::{Capacity, RESERVED_FILES};

/// Why the server could not start. Each message names the flag, address or
/// file to fix; `main` prints it and exits with status 2.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The token key or secret (`--auth-*`) cannot be used.
    #[error(transparent)]
    Auth(#[from] auth::SetupError),
    /// `--metrics-token-file` cannot be used.
    #[error(transparent)]
    BearerToken(#[from] TokenFileError),
    /// The listener's own address cannot be read.
    #[error("cannot read the listening address: {0}")]
    Listener(std::io::Error),
    /// The cluster flags (`--node-slot`, `--cluster-lead-ms`, ...) do not fit together.
    #[error(transparent)]
    Cluster(#[from] cluster::SettingsError),
    /// The cluster link (`--nats` and its files) cannot start.
    #[error(transparent)]
    ClusterStart(#[from] cluster::link::StartError),
    /// Webhooks (`--webhook-url`, `--webhook-secret-file`) cannot start.
    #[error(transparent)]
    Hooks(#[from] hooks::SetupError),
}

/// Serves amble on `listener` until `shutdown` completes, then closes every
/// WebSocket with 1001 and returns once they are closed (or after
/// `config.shutdown_timeout_ms`).
pub async fn serve(
    listener: TcpListener,
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), StartError> {
    serve_started(listener, config, shutdown, |_| {}).await
}

/// What a caller in the same process (a test) may await of a server it
/// started with [`serve_started`].
pub struct Started {
    /// The cluster's live peer count (`None` outside cluster mode).
    peers: Option<watch::Receiver<usize>>,
}

impl Started {
    /// Waits until this node sees `n` live peers (other cluster nodes), the
    /// count `amble_cluster_peers` shows. False when that cannot happen:
    /// outside cluster mode (unless `n` is 0), or once the link has stopped.
    pub async fn peers(&mut self, n: usize) -> bool {
        match &mut self.peers {
            Some(peers) => peers.wait_for(|&live| live == n).await.is_ok(),
            None => n == 0,
        }
    }
}

/// [`serve`], handing `started` a [`Started`] once the server accepts
/// connections (in cluster mode, once it has joined NATS).
pub async fn serve_started(
    listener: TcpListener,
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
    started: impl FnOnce(Started) + Send,
) -> Result<(), StartError> {
    let metrics = Arc::new(Metrics::default());
    let jwks_counters = auth::jwks::remote::Counters {
        failures: metrics.auth_jwks_fetch_failures.clone(),
        fetches: metrics.auth_jwks_fetches.clone(),
        keys: metrics.auth_jwks_keys.clone(),
    };
    let gate = Gate::start(
        &config.auth,
        metrics.auth_jwks_reload_failures.clone(),
        jwks_counters,
    )
    .await?;
    match &gate {
        Gate::Open => warn!(
            "no key (--auth-hs256-secret-file, --auth-public-key-file, --auth-jwks-file or \
             --auth-jwks-url): anyone may join any room with any name (open mode)"
        ),
        Gate::Tokens(verifier) => info!(
            algorithm = ?verifier.algorithm(),
            "tokens required: every Join must carry a token signed with the configured key"
        ),
        Gate::Jwks(verifier) => info!(
            source = %verifier.source(),
            "tokens required: every Join must carry a token signed with a key of the key set, by kid"
        ),
    }
    let metrics_token = match &config.edge.metrics_token_file {
        Some(path) => Some(BearerToken::read(path, "--metrics-token-file")?),
        None => {
            info!(
                "/metrics is open to anyone who can reach this server: --metrics-token-file guards it"
            );
            None
        }
    };
    let api_key = match &config.api.api_key_file {
        Some(path) => {
            info!("the server API is on: /api/v1 answers callers with the key");
            Some(BearerToken::read(path, "--api-key-file")?)
        }
        None => None,
    };
    let open_files = capacity::open_files_limit();
    let capacity = Capacity::fit(
        open_files,
        config.max_connections,
        config.edge.max_http_connections,
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
            http = config.edge.max_http_connections,
            ews = capacity.websockets,
            ehttp = capacity.http,
        );
    }
    let local = listener.local_addr().map_err(StartError::Listener)?;
    let port = local.port();
    let cluster_settings =
        cluster::ClusterSettings::from_config(&config.cluster, config.room.tick_ms, port)?;
    let shared = shared::state(
        local.ip(),
        config,
        metrics,
        gate,
        shared::Keys {
            metrics: metrics_token,
            api: api_key,
        },
        capacity,
        open_files,
    );
    let http = Http::new(Arc::clone(&shared), capacity.http as usize);
    let node = cluster_settings
        .as_ref()
        .map(|settings| Arc::<str>::from(settings.node.as_str()));
    let hooks = Hooks::start(
        &shared.config.hooks,
        node,
        shared.clock,
        Arc::clone(&shared.metrics),
    )?
    .map(|(hooks, running)| {
        shared.rooms.attach_hooks(hooks);
        running
    });
    if let Some(settings) = cluster_settings {
        let cluster = cluster::link::start(
            settings,
            Arc::clone(&shared.metrics),
            shared.rules.clone(),
            shared.clock,
        )
        .await?;
        shared.rooms.attach_cluster(Arc::clone(&cluster));
        if let Some(hooks) = shared.rooms.hooks() {
            hooks.attach_cluster(Arc::clone(&cluster));
        }
        shared.api.set_node(Arc::clone(&cluster.me().node));
        let api: Arc<dyn cluster::ApiSide> = Arc::clone(&shared.api) as _;
        cluster.attach_api(Arc::downgrade(&api));
        tokio::spawn(learn_sanctions(Arc::clone(&shared), cluster.peers()));
        let _ = shared.cluster.set(cluster);
    }
    let config = Arc::clone(&shared.config);
    let token = shared.shutdown.clone();
    let ticker = tokio::spawn(Arc::clone(&shared.rooms).run_ticker(token.clone()));
    let cutter = tokio::spawn(Arc::clone(&shared.rooms).run_cutter(token.clone()));
    let accept = tokio::spawn(accept_loop(
        listener,
        Arc::clone(&http),
        Arc::clone(&shared.addresses),
        Arc::new(Semaphore::new(capacity.sockets())),
        Arc::clone(&shared.metrics),
        config.edge.socket_send_buffer as usize,
        token.clone(),
    ));
    started(Started {
        peers: shared.cluster.get().map(|cluster| cluster.peers()),
    });

    shutdown.await;
    let stop_by = tokio::time::Instant::now() + Duration::from_millis(config.shutdown_timeout_ms);
    if let Some(hooks) = shared.rooms.hooks() {
        hooks.begin_shutdown();
    }
    let rooms = u32::try_from(shared.metrics.rooms.get()).unwrap_or(0);
    let members = u32::try_from(shared.metrics.members.get()).unwrap_or(0);
    // With held places, the goodbye waits for the drain: the other nodes
    // keep this node's members in sight while their clients fail over and
    // take their places back there (`Renumbered`, no leave). Without, it
    // goes first, so the other nodes remove this node's members at once.
    let drain = shared
        .cluster
        .get()
        .map(|c| c.settings.drain)
        .filter(|d| !d.is_zero() && config.room.resume_grace_ms > 0)
        // From the stop, while the connections close.
        .map(|d| (d, tokio::time::Instant::now() + d));
    if let (Some(cluster), None) = (shared.cluster.get(), drain) {
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
    if let (Some(cluster), Some((drain, until))) = (shared.cluster.get(), drain) {
        info!(
            drain_ms = drain.as_millis() as u64,
            "draining: the other nodes keep this node's members in sight while they fail over"
        );
        tokio::time::sleep_until(stop_by.min(until)).await;
        cluster.stop(rooms, members).await;
    }
    let _ = ticker.await;
    let _ = cutter.await;
    // After the connections: their members' `member.left` are queued.
    if let Some(hooks) = hooks {
        hooks.flush_and_stop().await;
    }
    info!("stopped");
    Ok(())
}

/// A node that starts in a cluster learns the bans and mutes in force from
/// its peers (once the first is seen, or after 5 s alone), so a ban
/// outlives the restart of any one node.
async fn learn_sanctions(
    shared: Arc<shared::Shared>,
    mut peers: tokio::sync::watch::Receiver<usize>,
) {
    let _ = tokio::time::timeout(Duration::from_secs(5), peers.wait_for(|n| *n > 0)).await;
    let answer = shared.api_run(crate::api::Op::Sanctions).await;
    let learnt = answer.sanctions.len();
    let dropped = shared
        .sanctions
        .merge(answer.sanctions, shared.clock.now_ms());
    if learnt > 0 {
        info!(
            learnt,
            dropped, "learnt the bans and mutes in force from the cluster"
        );
    }
}
