//! What goes out to NATS: the outgoing queue drained by one task, sends
//! bounded in time (heartbeats, replies), and requests whose answers are
//! gathered; and the count of what comes in.

use std::sync::Arc;
use std::time::Duration;

use async_nats::Subject;
use bytes::Bytes;
use futures_util::StreamExt as _;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::{debug, error, warn};

use crate::cluster::Cluster;
use crate::cluster::wire::{self, Origin};

/// Drains the outgoing queue into NATS. Only this task waits on NATS.
pub(super) async fn publisher(cluster: Arc<Cluster>, mut rx: mpsc::Receiver<(Subject, Bytes)>) {
    while let Some((subject, payload)) = rx.recv().await {
        send(&cluster, subject, payload).await;
    }
}

/// Publishes now (on the link runtime), counted.
async fn send(cluster: &Cluster, subject: Subject, payload: Bytes) {
    let Some(nats) = &cluster.nats else { return };
    let len = payload.len() as u64;
    match nats.client.publish(subject, payload).await {
        Ok(()) => {
            cluster.metrics.cluster_messages_published.inc();
            cluster.metrics.cluster_bytes_published.inc_by(len);
        }
        Err(err) => debug!(%err, "cluster publish failed"),
    }
}

/// Publishes now, waiting `limit` at most: while NATS is away the client's
/// command queue fills and is not drained until it reconnects, and a
/// heartbeat or a reply must not hang on it (false when it did not go out).
pub(super) async fn send_within(
    cluster: &Cluster,
    limit: Duration,
    subject: Subject,
    payload: Bytes,
) -> bool {
    let sent = tokio::time::timeout(limit, send(cluster, subject, payload))
        .await
        .is_ok();
    if !sent {
        debug!("cluster: NATS did not take a message in time; dropped");
    }
    sent
}

pub(super) fn received(cluster: &Cluster, bytes: usize) {
    cluster.metrics.cluster_messages_received.inc();
    cluster.metrics.cluster_bytes_received.inc_by(bytes as u64);
}

/// Counts a message from NATS that is not what its subject carries.
pub(super) fn bad(cluster: &Cluster, err: &wire::WireError) {
    cluster.metrics.cluster_bad_messages.inc();
    if let wire::WireError::Slots { ours, theirs } = err {
        error!(
            ours,
            theirs, "cluster: a node uses another --cluster-slots; its messages are dropped"
        );
    } else {
        debug!(%err, "cluster message dropped");
    }
}

/// Publishes a request and hands each answer to `accept`, until every
/// peer live when it was sent answered, or `deadline`. `accept` decodes an
/// answer and returns who sent it when it is a good one. Only the first
/// answer of each of those peers counts towards "every peer answered": a
/// second one, one from a node not live at the start, or a bad one does
/// not end the wait early. A node too new to know its peers waits for the
/// deadline.
pub(in crate::cluster) async fn gather(
    cluster: &Cluster,
    subject: Subject,
    payload: Bytes,
    deadline: Instant,
    mut accept: impl FnMut(Bytes) -> Option<Origin>,
) {
    let (mut awaited, young) = cluster.expected_answers();
    let Some(nats) = &cluster.nats else {
        return;
    };
    if awaited.is_empty() && !young {
        return;
    }
    let inbox = nats.client.new_inbox();
    // Bounded like the answers: with NATS away the client's command queue
    // can be full.
    let mut sub =
        match tokio::time::timeout_at(deadline, nats.client.subscribe(inbox.clone())).await {
            Ok(Ok(sub)) => sub,
            Ok(Err(err)) => {
                warn!(%err, "cluster: cannot subscribe to a reply inbox");
                return;
            }
            Err(_) => return,
        };
    let len = payload.len() as u64;
    let request = nats.client.publish_with_reply(subject, inbox, payload);
    if let Ok(Ok(())) = tokio::time::timeout_at(deadline, request).await {
        cluster.metrics.cluster_messages_published.inc();
        cluster.metrics.cluster_bytes_published.inc_by(len);
        while let Ok(Some(msg)) = tokio::time::timeout_at(deadline, sub.next()).await {
            // NATS itself answers "no responders" (status 503, no payload)
            // when no other node listens: not an answer from a node.
            if msg.status.is_some() {
                continue;
            }
            received(cluster, msg.payload.len());
            if let Some(from) = accept(msg.payload) {
                awaited.remove(&(from.node, from.epoch));
            }
            if !young && awaited.is_empty() {
                break;
            }
        }
    }
    // Dropping unsubscribes without waiting on NATS.
    drop(sub);
}
