//! The NATS side of a node, on a runtime of its own (one OS thread), so a
//! long fan-out on the server's runtime cannot starve heartbeats.
//!
//! It connects (no echo, named `amble/<node>/<epoch>`, retrying the first
//! connection and reconnecting with backoff), drains the outgoing queue,
//! publishes heartbeats and declares silent peers down, answers snapshot,
//! sync and room-count requests, and reads one subscription per open room,
//! handing decoded updates to the server runtime in order.
//!
//! - [`start`] (here): the thread, its runtime, and the tasks on it.
//! - `connection`: the connect options and the connection's events.
//! - `outbound`: the outgoing queue, bounded sends, gathered requests.
//! - `heartbeat`: heartbeats, stalls, expiry, and the directory's view of
//!   every message (`observe`).
//! - `control`: the control subjects (heartbeats, snapshot, sync and
//!   room-count requests).
//! - `subscribe`: one subscription per open room.
//! - `repair`: full states, paced, and requests for the peers' ones.

mod claim;
mod connection;
mod control;
mod heartbeat;
mod outbound;
mod repair;
mod subscribe;

use std::sync::{Arc, Mutex, OnceLock};

use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::clock::Clock;
use crate::cluster::directory::Directory;
use crate::cluster::subjects::Subjects;
use crate::cluster::wire::Origin;
use crate::cluster::{Cluster, ClusterSettings, ControlQueue, Nats, run_inbound};
use crate::metrics::Metrics;
use crate::protocol::Rules;
pub use connection::StartError;
use connection::{events, options};
use control::{Control, answer_claims, control};
use heartbeat::heartbeats;
pub(super) use heartbeat::observe;
pub(super) use outbound::gather;
use outbound::publisher;
pub(super) use repair::Fulls;
pub(super) use subscribe::subscribe_room;

/// Starts the cluster link: a NATS thread with its runtime, the tasks on
/// it, and the task on the server runtime that applies what arrives.
pub async fn start(
    settings: ClusterSettings,
    metrics: Arc<Metrics>,
    rules: Rules,
    clock: Clock,
) -> Result<Arc<Cluster>, StartError> {
    let (cluster, _connected) = launch(settings, metrics, rules, clock).await?;
    Ok(cluster)
}

/// [`start`], and whether the link is connected to NATS, as it changes
/// (set after the flag `/healthz` reads).
async fn launch(
    mut settings: ClusterSettings,
    metrics: Arc<Metrics>,
    rules: Rules,
    clock: Clock,
) -> Result<(Arc<Cluster>, watch::Receiver<bool>), StartError> {
    let epoch = loop {
        // Zero is the directory's "retired" mark; draw again.
        let e = random_u64();
        if e != 0 {
            break e;
        }
    };
    let mut me = Origin {
        node: Arc::from(settings.node.as_str()),
        epoch,
        slot: settings.slot,
        slots: settings.slots,
    };
    let urls: Vec<async_nats::ServerAddr> = settings
        .urls
        .iter()
        .map(|u| u.trim().parse())
        .collect::<Result<_, _>>()
        .map_err(|err: std::io::Error| StartError::Url(err.to_string()))?;
    let (event_tx, event_rx) = mpsc::channel(64);
    let opts = options(&settings, epoch, event_tx).await?;
    let stop = CancellationToken::new();
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let thread_stop = stop.clone();
    std::thread::Builder::new()
        .name("amble-nats".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(err) => {
                    let _ = ready_tx.send(Err(err));
                    return;
                }
            };
            runtime.block_on(async move {
                // With retry_on_initial_connect this returns at once and
                // connects in the background.
                match opts.connect(urls).await {
                    Ok(client) => {
                        let _ = ready_tx.send(Ok((client, tokio::runtime::Handle::current())));
                        thread_stop.cancelled().await;
                    }
                    Err(err) => {
                        let _ = ready_tx.send(Err(std::io::Error::other(err)));
                    }
                }
            });
        })
        .map_err(StartError::Thread)?;
    let (client, link) = ready_rx
        .await
        .map_err(|_| StartError::Thread(std::io::Error::other("the NATS thread ended")))?
        .map_err(StartError::Thread)?;

    let subjects = Subjects::new(&settings.prefix);
    let claimed = claim::claim(&client, &subjects, &settings, &me).await;
    if claimed.is_err() {
        // The NATS thread ends, and the client with it.
        stop.cancel();
    }
    let (slot, claims) = claimed?;
    if slot != settings.slot {
        warn!(
            wanted = settings.slot,
            slot,
            "cluster: the slot derived from the node name is held by a live node; took the lowest free one"
        );
    }
    settings.slot = slot;
    me.slot = slot;

    metrics.enable_cluster();
    let (out_tx, out_rx) = mpsc::channel(settings.queue);
    // Room updates are applied by several tasks, each room always by the
    // same one (its order kept), so one busy core does not hold them all.
    let shards = std::thread::available_parallelism().map_or(1, |n| n.get().clamp(1, 16));
    let per_shard = (settings.queue / shards).max(256);
    let (in_txs, in_rxs): (Vec<_>, Vec<_>) = (0..shards).map(|_| mpsc::channel(per_shard)).unzip();
    let directory = Directory::new(me.clone(), settings.node_timeout, settings.heartbeat);
    let drops = Arc::new(ControlQueue::new(settings.queue));
    let cluster = Arc::new(Cluster {
        subjects,
        me_pb: me.to_pb(),
        me,
        rules,
        metrics,
        nats: Some(Nats {
            client,
            link: link.clone(),
        }),
        out: out_tx,
        inbound: in_txs,
        control: Arc::clone(&drops),
        fulls: Mutex::default(),
        directory: Mutex::new(directory),
        peers: tokio::sync::watch::Sender::new(0),
        connected: false.into(),
        down_since: Mutex::new(None),
        started: Instant::now(),
        subs: Mutex::new(Default::default()),
        counts: tokio::sync::Mutex::new(None),
        rooms: OnceLock::new(),
        api: OnceLock::new(),
        stop,
        settings,
    });
    for rx in in_rxs {
        tokio::spawn(run_inbound(
            Arc::downgrade(&cluster),
            Arc::clone(&drops),
            rx,
        ));
    }
    let c = &cluster;
    let stop = || c.stop.clone();
    link.spawn(until_stopped(stop(), publisher(Arc::clone(c), out_rx)));
    let (connected, connected_rx) = watch::channel(false);
    link.spawn(until_stopped(
        stop(),
        events(Arc::clone(c), event_rx, connected),
    ));
    link.spawn(until_stopped(stop(), heartbeats(Arc::clone(c), clock)));
    for kind in [
        Control::Heartbeat,
        Control::Snapshot,
        Control::Sync,
        Control::Counts,
        Control::Occupancy,
        Control::Api,
    ] {
        link.spawn(until_stopped(stop(), control(Arc::clone(c), kind)));
    }
    link.spawn(until_stopped(stop(), answer_claims(Arc::clone(c), claims)));
    let s = &cluster.settings;
    info!(
        "joined cluster via {}: node {} (slot {} of {}), prefix {}",
        s.urls.join(","),
        s.node,
        s.slot,
        s.slots,
        s.prefix
    );
    Ok((cluster, connected_rx))
}

/// A random u64 from the standard library's randomly seeded hasher (no
/// extra dependency for one number per process).
fn random_u64() -> u64 {
    use std::hash::{BuildHasher as _, Hasher as _};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.write_u32(std::process::id());
    h.finish()
}

async fn until_stopped(stop: CancellationToken, task: impl Future<Output = ()>) {
    tokio::select! {
        () = stop.cancelled() => {}
        () = task => {}
    }
}

#[cfg(test)]
mod tests;
