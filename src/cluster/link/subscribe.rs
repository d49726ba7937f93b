//! One subscription per room open on this node, read on the link runtime
//! until the room closes; its decoded updates go to the room's inbound task.

use std::sync::Arc;
use std::time::Duration;

use async_nats::Subscriber;
use futures_util::StreamExt as _;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, warn};

use super::heartbeat::observe;
use super::outbound::{bad, received};
use crate::cluster::wire;
use crate::cluster::{Cluster, Inbound, lock};

/// Subscribes to `room`'s subject (once), and reads it on the link runtime
/// until [`Cluster::close`]. Waits for the subscription until `deadline`
/// at most: with NATS away the client's command queue can be full, and a
/// join must not hang on it (the subscription then completes later, and
/// the live peers are then asked for their full states of the room: the
/// updates published before it were not received).
pub(in crate::cluster) async fn subscribe_room(
    cluster: &Arc<Cluster>,
    room: &str,
    deadline: Instant,
) {
    let token = CancellationToken::new();
    {
        let mut subs = lock(&cluster.subs);
        if subs.contains_key(room) {
            return;
        }
        subs.insert(Arc::from(room), token.clone());
    }
    cluster.metrics.cluster_rooms_subscribed.inc();
    let Some(nats) = &cluster.nats else { return };
    let (done, subscribed) = tokio::sync::oneshot::channel();
    let (c, room) = (Arc::clone(cluster), Arc::<str>::from(room));
    nats.link.spawn(async move {
        let Some(nats) = &c.nats else { return };
        let mut done = Some(done);
        let mut retry = RETRY_FIRST;
        let mut late = false;
        // Until the room closes: a failed subscription, or one whose stream
        // ended, is made again (issue #15, finding 9: it was forgotten,
        // and the room heard nothing more from the other nodes).
        loop {
            let sub = tokio::select! {
                () = token.cancelled() => return,
                () = c.stop.cancelled() => return,
                sub = nats.client.subscribe(c.room_subject(&room)) => sub,
            };
            if let Some(done) = done.take() {
                let _ = done.send(());
            }
            match sub {
                Ok(sub) => {
                    if late || Instant::now() > deadline {
                        debug!(%room, "cluster: the room subscription came after the opening; asking for full states");
                        subscribed_late(&c, &room);
                    }
                    retry = RETRY_FIRST;
                    read_room(Arc::clone(&c), Arc::clone(&room), sub, token.clone()).await;
                    if token.is_cancelled() || c.stop.is_cancelled() {
                        return;
                    }
                    warn!(%room, "cluster: the room subscription ended; subscribing again");
                }
                Err(err) => {
                    error!(%err, %room, retry_ms = retry.as_millis() as u64, "cluster: cannot subscribe to the room; trying again");
                }
            }
            c.metrics.cluster_subscribe_retries.inc();
            late = true;
            tokio::select! {
                () = token.cancelled() => return,
                () = c.stop.cancelled() => return,
                () = tokio::time::sleep(retry) => {}
            }
            retry = (retry * 2).min(RETRY_MAX);
        }
    });
    let _ = tokio::time::timeout_at(deadline, subscribed).await;
}

/// The first wait before a room's subscription is made again, doubled
/// after each failure up to [`RETRY_MAX`].
pub(super) const RETRY_FIRST: Duration = Duration::from_millis(100);
pub(super) const RETRY_MAX: Duration = Duration::from_secs(5);

/// The subscription to `room` came after its opening gave up waiting:
/// every live peer is asked for its full state of the room.
fn subscribed_late(cluster: &Cluster, room: &str) {
    let peers = lock(&cluster.directory).live_nodes();
    for node in peers {
        cluster.request_sync(&node, vec![room.to_owned()]);
    }
}

async fn read_room(
    cluster: Arc<Cluster>,
    room: Arc<str>,
    mut sub: Subscriber,
    token: CancellationToken,
) {
    loop {
        let msg = tokio::select! {
            () = token.cancelled() => break,
            () = cluster.stop.cancelled() => break,
            msg = sub.next() => msg,
        };
        let Some(msg) = msg else { break };
        received(&cluster, msg.payload.len());
        match wire::decode_update(&msg.payload, cluster.me.slots, &cluster.rules) {
            Ok(update) => {
                if observe(&cluster, &update.origin) {
                    // Waits when the server runtime lags: the subscription
                    // then buffers, and past its capacity NATS drops (gaps,
                    // repaired by full states).
                    let _ = cluster
                        .inbound_for(&room)
                        .send(Inbound::Update(Arc::clone(&room), update))
                        .await;
                }
            }
            Err(err) => bad(&cluster, &err),
        }
    }
    let _ = sub.unsubscribe().await;
}
