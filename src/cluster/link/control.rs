//! The control subjects every node subscribes to: heartbeats, snapshot
//! requests (a peer opening a room), sync requests (a peer repairing a
//! gap) and room-count requests (`/api/rooms`).

use std::sync::Arc;

use async_nats::Subscriber;
use futures_util::StreamExt as _;
use tracing::{error, info, warn};

use super::heartbeat::{observe, to_rooms};
use super::outbound::{bad, received, send_within};
use super::repair::full_soon;
use super::subscribe::{RETRY_FIRST, RETRY_MAX};
use crate::cluster::wire::{self, cpb};
use crate::cluster::{Cluster, Inbound, lock};

#[derive(Clone, Copy)]
pub(super) enum Control {
    Heartbeat,
    Snapshot,
    Sync,
    Counts,
    Occupancy,
    Api,
}

/// Reads one of the control subjects every node subscribes to, for as long
/// as the link runs: a subscription that fails, or whose stream ends, is
/// made again after a back-off (a node deaf to heartbeats or snapshot
/// requests would never heal).
pub(super) async fn control(cluster: Arc<Cluster>, kind: Control) {
    let subject = match kind {
        Control::Heartbeat => cluster.subjects().heartbeats(),
        Control::Snapshot => cluster.subjects().snapshots(),
        Control::Sync => cluster.subjects().node(&cluster.me.node),
        Control::Counts => cluster.subjects().counts(),
        Control::Occupancy => cluster.subjects().occupancy(),
        Control::Api => cluster.subjects().api(),
    };
    let Some(nats) = &cluster.nats else { return };
    let mut retry = RETRY_FIRST;
    loop {
        match nats.client.subscribe(subject.clone()).await {
            Ok(mut sub) => {
                retry = RETRY_FIRST;
                while let Some(msg) = sub.next().await {
                    received(&cluster, msg.payload.len());
                    match kind {
                        Control::Heartbeat => on_heartbeat(&cluster, &msg.payload),
                        Control::Snapshot => on_snapshot_request(&cluster, &msg).await,
                        Control::Sync => on_sync_request(&cluster, &msg.payload),
                        Control::Counts => on_counts_request(&cluster, &msg).await,
                        Control::Occupancy => on_occupancy(&cluster, &msg.payload),
                        Control::Api => on_api_call(&cluster, &msg).await,
                    }
                }
                warn!(%subject, "cluster: a control subscription ended; subscribing again");
            }
            Err(err) => {
                error!(%err, %subject, retry_ms = retry.as_millis() as u64, "cluster: cannot subscribe; trying again");
            }
        }
        cluster.metrics.cluster_subscribe_retries.inc();
        // The link's stop ends this task (`until_stopped`), also here.
        tokio::time::sleep(retry).await;
        retry = (retry * 2).min(RETRY_MAX);
    }
}

fn on_heartbeat(cluster: &Cluster, payload: &[u8]) {
    let beat = match wire::decode_heartbeat(payload, cluster.me.slots) {
        Ok(beat) => beat,
        Err(err) => return bad(cluster, &err),
    };
    if beat.bye {
        let was_live = lock(&cluster.directory).bye(&beat.origin);
        if was_live {
            info!(node = %beat.origin.node, "cluster: node stopped, removing its members");
            cluster.count_peers();
            to_rooms(
                cluster,
                Inbound::DropNode(beat.origin.node, beat.origin.epoch),
            );
        }
        return;
    }
    observe(cluster, &beat.origin);
}

/// The room named by a subject's last token, checked.
fn room_of(cluster: &Cluster, subject: &str) -> Option<String> {
    let token = subject.rsplit('.').next()?;
    crate::protocol::validate_room(wire::room_from_token(token), &cluster.rules).ok()
}

async fn on_snapshot_request(cluster: &Cluster, msg: &async_nats::Message) {
    let Some(reply) = msg.reply.clone() else {
        return;
    };
    let from = match wire::decode_snapshot_request(&msg.payload, cluster.me.slots) {
        Ok(from) => from,
        Err(err) => return bad(cluster, &err),
    };
    let Some(room) = room_of(cluster, &msg.subject) else {
        cluster.metrics.cluster_bad_messages.inc();
        return;
    };
    if !observe(cluster, &from) {
        return;
    }
    // No reset of the asker's part here: its opening's first update
    // carries a higher opening number, which replaces any part of an
    // earlier opening (its `closed` lost), and a new epoch is dropped by
    // `observe` above. (A reset sent here had opening number 0, below any,
    // so the rooms ignored it, but it took a place in the control queue
    // that carries node drops: issue #15, finding 9.)
    let sent = cluster
        .room_side()
        .is_some_and(|rooms| rooms.publish_full(&room, Some(reply.clone())));
    if !sent {
        // Nobody here: an empty full state, so the asker need not wait.
        let empty = wire::encode_update(
            &cluster.me_pb,
            wire::UpdateParts {
                full: true,
                ..Default::default()
            },
        );
        send_within(cluster, cluster.settings.snapshot_timeout, reply, empty).await;
    }
}

fn on_sync_request(cluster: &Arc<Cluster>, payload: &[u8]) {
    let (from, rooms) = match wire::decode_sync_request(payload, cluster.me.slots, &cluster.rules) {
        Ok(req) => req,
        Err(err) => return bad(cluster, &err),
    };
    if !observe(cluster, &from) {
        return;
    }
    if let Some(side) = cluster.room_side() {
        for room in rooms {
            full_soon(cluster, side.as_ref(), &room);
        }
    }
}

/// Another node's rooms with members, for the webhooks (this node's own
/// messages come back from NATS and are skipped).
fn on_occupancy(cluster: &Cluster, payload: &[u8]) {
    let update = match wire::decode_occupancy(payload, cluster.me.slots, &cluster.rules) {
        Ok(update) => update,
        Err(err) => return bad(cluster, &err),
    };
    if update.origin.node == cluster.me.node && update.origin.epoch == cluster.me.epoch {
        return;
    }
    if !observe(cluster, &update.origin) {
        return;
    }
    if let Some(rooms) = cluster.room_side() {
        rooms.occupancy(update);
    }
}

async fn on_counts_request(cluster: &Cluster, msg: &async_nats::Message) {
    let Some(reply) = msg.reply.clone() else {
        return;
    };
    match wire::decode_room_counts(&msg.payload, cluster.me.slots, &cluster.rules) {
        Ok((from, _)) => {
            if !observe(cluster, &from) {
                return;
            }
        }
        Err(err) => return bad(cluster, &err),
    }
    let counts = cluster
        .room_side()
        .map(|rooms| rooms.local_counts())
        .unwrap_or_default();
    // The asker waits the snapshot timeout at most: no use waiting longer.
    send_within(
        cluster,
        cluster.settings.snapshot_timeout,
        reply,
        wire::encode_room_counts(&cluster.me_pb, counts),
    )
    .await;
}

/// Runs a peer's server API call on this node's members and answers. The
/// asker waits [`API_ANSWER_TIMEOUT`] at most: no use answering later.
async fn on_api_call(cluster: &Cluster, msg: &async_nats::Message) {
    let Some(reply) = msg.reply.clone() else {
        return;
    };
    let call = match wire::decode_api_call(&msg.payload, cluster.me.slots) {
        Ok((from, call)) => {
            if !observe(cluster, &from) {
                return;
            }
            call
        }
        Err(err) => return bad(cluster, &err),
    };
    let Some(api) = cluster.api_side() else {
        return;
    };
    let answer = api.answer(call).await;
    send_within(
        cluster,
        API_ANSWER_TIMEOUT,
        reply,
        wire::encode_api_answer(&cluster.me_pb, answer),
    )
    .await;
}

/// The longest a server API answer waits to be sent.
const API_ANSWER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// Answers the slot claims of nodes starting later (`P.v2.q.nodes`, on
/// the subscription the claim of this node opened) with this node's
/// origin. A claim under this node's own name is a name clash (counted,
/// logged, on `/healthz`); one that cannot find a free slot is counted in
/// `amble_cluster_slots_exhausted_total` (the claimer refuses to start).
pub(super) async fn answer_claims(cluster: Arc<Cluster>, mut sub: Subscriber) {
    while let Some(msg) = sub.next().await {
        received(&cluster, msg.payload.len());
        let beat = match wire::decode_heartbeat(&msg.payload, cluster.me.slots) {
            Ok(beat) if beat.claiming => beat,
            Ok(_) => {
                cluster.metrics.cluster_bad_messages.inc();
                continue;
            }
            Err(err) => {
                bad(&cluster, &err);
                continue;
            }
        };
        let from = &beat.origin;
        if from.node == cluster.me.node {
            // Not a peer: the directory counts it as a clash of our name.
            observe(&cluster, from);
        } else {
            let held = {
                let mut directory = lock(&cluster.directory);
                // A new epoch of a known node: its restart, now announced.
                directory.announce(from);
                directory.held_slots(&from.node)
            };
            if held.len() >= cluster.me.slots as usize {
                cluster.metrics.cluster_slots_exhausted.inc();
                warn!(
                    node = %from.node,
                    slots = cluster.me.slots,
                    "cluster: a node asked for a slot and every slot is held: raise --cluster-slots on every node"
                );
            }
        }
        let Some(reply) = msg.reply else { continue };
        let answer = wire::encode_heartbeat(&cluster.me_pb, cpb::Heartbeat::default());
        send_within(&cluster, cluster.settings.snapshot_timeout, reply, answer).await;
    }
}
