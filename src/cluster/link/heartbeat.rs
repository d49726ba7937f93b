//! Heartbeats and the directory of live peers: this node's beats, its own
//! stalls, silent peers declared down, and what every message from a peer
//! means for the directory (joined, returned, restarted).

use std::sync::Arc;

use tokio::time::{Instant, MissedTickBehavior};
use tracing::{error, info, warn};

use super::outbound::send_within;
use super::repair::{ask_fulls, publish_fulls, resync_all};
use crate::clock::Clock;
use crate::cluster::directory::Seen;
use crate::cluster::wire::{self, Origin, cpb};
use crate::cluster::{Cluster, Inbound, lock};

/// Publishes a heartbeat, waiting half a period at most.
pub(super) async fn heartbeat(cluster: &Cluster, server_time_ms: u64, bye: bool) {
    let beat = wire::encode_heartbeat(
        &cluster.me_pb,
        cpb::Heartbeat {
            origin: None,
            server_time_ms,
            rooms: u32::try_from(cluster.metrics.rooms.get()).unwrap_or(0),
            members: u32::try_from(cluster.metrics.members.get()).unwrap_or(0),
            bye,
            claiming: false,
        },
    );
    let limit = cluster.settings.heartbeat / 2;
    send_within(cluster, limit, cluster.subjects().heartbeats(), beat).await;
}

/// Every heartbeat period: publish ours, and declare down the peers silent
/// for the node timeout (their members leave every room). A beat more
/// than half a period late means this node was stalled, not its peers.
pub(super) async fn heartbeats(cluster: Arc<Cluster>, clock: Clock) {
    let period = cluster.settings.heartbeat;
    let mut interval = tokio::time::interval(period);
    interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        let due = interval.tick().await;
        let now = Instant::now();
        let stalled = lock(&cluster.directory).beat(due, now, period);
        if let Some(late) = stalled {
            warn!(
                stalled_ms = late.as_millis() as u64,
                "cluster: this node was stalled; the stall does not count against its peers"
            );
            // What was published meanwhile may be lost (a slow consumer cut
            // off by NATS): both ways, full states.
            tokio::spawn(publish_fulls(Arc::clone(&cluster)));
            resync_all(&cluster);
        }
        // Expiry first, and never behind NATS: with NATS away the peers
        // must still expire, so rooms shrink to the local members.
        let lost = lock(&cluster.directory).expire(now);
        for (node, epoch) in lost {
            cluster.metrics.cluster_nodes_lost.inc();
            warn!(%node, "cluster: node silent for the node timeout, its members are removed");
            to_rooms(&cluster, Inbound::DropNode(node, epoch));
        }
        cluster.count_peers();
        heartbeat(&cluster, clock.now_ms(), false).await;
    }
}

/// Hands a drop or a reset to the rooms without waiting (the control
/// queue, handled before the room updates). Past its bound (the server
/// runtime far behind) it is dropped, counted and logged.
pub(super) fn to_rooms(cluster: &Cluster, msg: Inbound) {
    if !cluster.control.push(msg) {
        cluster.metrics.cluster_dropped.inc();
        warn!("cluster: the rooms are far behind; a node drop or reset was lost");
    }
}

/// Records a message from `from` in the directory and acts on what it
/// means; false when the message is stale and must be dropped.
pub(in crate::cluster) fn observe(cluster: &Cluster, from: &Origin) -> bool {
    let seen = lock(&cluster.directory).seen(from, Instant::now());
    let node = &from.node;
    let clash = |clash: bool| {
        if clash {
            cluster.metrics.cluster_id_conflicts.inc();
            error!(
                %node,
                slot = from.slot,
                "cluster: another live node uses this slot; member ids may collide: give every node its own --node-slot"
            );
        }
    };
    match seen {
        Seen::Stale | Seen::Clashing => return false,
        Seen::OwnName { first } => {
            if first {
                cluster.metrics.cluster_name_clashes.inc();
                error!(
                    %node,
                    epoch = from.epoch,
                    "cluster: another process runs under this node's name (or forges it); \
                     its messages are ignored: give every node its own --node-name, and \
                     restrict who may publish on the cluster's subjects (docs/cluster.md)"
                );
            }
            return false;
        }
        Seen::Clash { newcomer } => {
            cluster.metrics.cluster_name_clashes.inc();
            error!(
                %node,
                epoch = from.epoch,
                newcomer,
                "cluster: another process (or a forger) uses this node name without having \
                 claimed it; it is ignored while this node is alive"
            );
        }
        Seen::NameClash {
            reinstated,
            dropped,
        } => {
            cluster.metrics.cluster_name_clashes.inc();
            error!(
                %node,
                reinstated,
                dropped,
                "cluster: two live processes use this node name; keeping the one heard first \
                 and ignoring the other while the first is alive"
            );
            cluster.count_peers();
            to_rooms(cluster, Inbound::DropNode(Arc::clone(node), dropped));
            if let Some(rooms) = cluster.room_side() {
                ask_fulls(cluster, node, &rooms.open_rooms());
            }
        }
        Seen::Known => {}
        Seen::New { slot_clash } => {
            info!(%node, slot = from.slot, "cluster: node joined");
            clash(slot_clash);
            cluster.count_peers();
        }
        Seen::Returned => {
            info!(%node, "cluster: node heard again, taking its members back");
            cluster.count_peers();
            if let Some(rooms) = cluster.room_side() {
                ask_fulls(cluster, node, &rooms.open_rooms());
            }
        }
        Seen::Replaced {
            old_epoch,
            slot_clash,
        } => {
            info!(%node, "cluster: node restarted, removing its previous run's members");
            clash(slot_clash);
            cluster.count_peers();
            to_rooms(cluster, Inbound::DropNode(Arc::clone(node), old_epoch));
        }
    }
    true
}
