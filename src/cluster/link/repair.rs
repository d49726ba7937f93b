//! Repair by full states: this node's full states of its open rooms, paced
//! and coalesced per room, and requests to the live peers for theirs.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::cluster::{Cluster, RoomSide, lock};

/// This node's full state of every room open here, on the rooms' subjects,
/// spread out: every [`FULLS_BATCH`] rooms it waits (a second at most)
/// until the outgoing queue is at most half full, so the live updates
/// queued meanwhile are not dropped behind them.
pub(super) async fn publish_fulls(cluster: Arc<Cluster>) {
    let Some(rooms) = cluster.room_side() else {
        return;
    };
    for (i, room) in rooms.open_rooms().iter().enumerate() {
        if i % FULLS_BATCH == FULLS_BATCH - 1 {
            let give_up = Instant::now() + Duration::from_secs(1);
            while cluster.out.capacity() < cluster.out.max_capacity() / 2
                && Instant::now() < give_up
            {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        full_soon(&cluster, rooms.as_ref(), room);
    }
}

/// Rooms whose full states go out between two looks at the outgoing queue.
const FULLS_BATCH: usize = 64;
/// At most one full state per room in this time; the requests meanwhile
/// are served by one more at its end.
const FULL_EVERY: Duration = Duration::from_millis(100);
/// Rooms remembered for [`FULL_EVERY`] at most (names come from requests).
const FULLS_KNOWN: usize = 65_536;

/// When each room's last full state went out, and whether another one is
/// due at [`FULL_EVERY`] after it.
pub(in crate::cluster) type Fulls = Mutex<HashMap<Arc<str>, FullSent>>;

#[derive(Clone, Copy, Debug)]
pub(in crate::cluster) struct FullSent {
    at: Instant,
    again: bool,
}

/// Publishes this node's full state of `room` on its subject, at most once
/// per [`FULL_EVERY`]: a request within that time of the last one is
/// served by one more full state at its end, and any further request
/// meanwhile by that same one. (One lost message in a room spanning n
/// nodes brings n - 1 requests; a reconnect brings a request from every
/// peer.)
pub(super) fn full_soon(cluster: &Arc<Cluster>, rooms: &dyn RoomSide, room: &str) {
    let now = Instant::now();
    let later = {
        let mut fulls = lock(&cluster.fulls);
        match fulls.get_mut(room) {
            Some(sent) if sent.again => return,
            Some(sent) if now < sent.at + FULL_EVERY => {
                sent.again = true;
                Some(sent.at + FULL_EVERY)
            }
            _ => {
                if fulls.len() >= FULLS_KNOWN {
                    fulls.retain(|_, s| s.again || now < s.at + FULL_EVERY);
                }
                if fulls.len() < FULLS_KNOWN {
                    let sent = FullSent {
                        at: now,
                        again: false,
                    };
                    fulls.insert(Arc::from(room), sent);
                }
                None
            }
        }
    };
    let Some(at) = later else {
        if !rooms.publish_full(room, None) {
            lock(&cluster.fulls).remove(room);
        }
        return;
    };
    let (c, room) = (Arc::clone(cluster), Arc::<str>::from(room));
    tokio::spawn(async move {
        tokio::time::sleep_until(at).await;
        if let Some(sent) = lock(&c.fulls).get_mut(&room) {
            *sent = FullSent {
                at: Instant::now(),
                again: false,
            };
        }
        if let Some(rooms) = c.room_side() {
            rooms.publish_full(&room, None);
        }
    });
}

/// The most rooms named in one `SyncRequest`: room names are at most 32
/// bytes, so a request stays near 10 KB, far under NATS's `max_payload`
/// (1 MB by default), past which a publish fails.
pub(super) const SYNC_CHUNK: usize = 256;

/// Asks `node` for its full state of `rooms`, in requests of
/// [`SYNC_CHUNK`] rooms.
pub(super) fn ask_fulls(cluster: &Cluster, node: &str, rooms: &[String]) {
    for chunk in rooms.chunks(SYNC_CHUNK) {
        cluster.request_sync(node, chunk.to_vec());
    }
}

/// Asks every live peer for its full state of every room open here: this
/// node may have missed updates (its NATS connection was lost, or it was
/// stalled), and a missed update is otherwise only noticed at the next one
/// in the same room, which may never come (a leave in a room gone quiet).
pub(super) fn resync_all(cluster: &Cluster) {
    let Some(rooms) = cluster.room_side() else {
        return;
    };
    let open = rooms.open_rooms();
    if open.is_empty() {
        return;
    }
    let peers = lock(&cluster.directory).live_nodes();
    for node in peers {
        ask_fulls(cluster, &node, &open);
    }
}
