//! The NATS connection: its options (name, no echo, backoff, credentials,
//! token, user and password, TLS), why a start fails, and the connection's
//! events (connected, lost, back).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use async_nats::connection::State;
use async_nats::{ConnectOptions, Event};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::heartbeat::heartbeat;
use super::repair::{publish_fulls, resync_all};
use crate::cluster::{Cluster, ClusterSettings, lock};

/// Why the cluster could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A credentials, token or password file could not be read.
    #[error("{flag}: cannot read {path}: {err}")]
    File {
        flag: &'static str,
        path: String,
        err: std::io::Error,
    },
    /// The NATS thread or its runtime could not start.
    #[error("cannot start the NATS thread: {0}")]
    Thread(std::io::Error),
    /// A NATS URL is not valid.
    #[error("--nats: {0}")]
    Url(String),
    /// A live node answered the slot claim under this node's name.
    #[error(
        "--node-name {node}: a live node already runs under this name (it answered this \
         process's start-up claim); stop it first, or give this process another --node-name"
    )]
    NameTaken { node: String },
    /// The explicit `--node-slot` is held by a live node.
    #[error(
        "--node-slot {slot}: live node {holder} holds this slot; give this node a free \
         --node-slot, or leave --node-slot out to claim a free one"
    )]
    SlotTaken { slot: u32, holder: String },
    /// Every slot is held by a live node.
    #[error(
        "no free slot: the {live} live nodes that answered hold all --cluster-slots {slots}; \
         raise --cluster-slots on every node"
    )]
    NoFreeSlot { slots: u32, live: usize },
    /// NATS failed during the claim.
    #[error("cannot claim a slot through NATS: {0}")]
    Claim(String),
}

/// Reconnect delays: 50 ms doubling to at most 1 s, so a node is back
/// within about a second of NATS returning.
fn backoff(attempts: usize) -> Duration {
    let exp = u32::try_from(attempts.min(5)).unwrap_or(5);
    Duration::from_millis(50 * 2u64.pow(exp)).min(Duration::from_secs(1))
}

fn read_secret(flag: &'static str, path: &std::path::Path) -> Result<String, StartError> {
    std::fs::read_to_string(path)
        .map(|s| s.trim_end_matches(['\r', '\n']).to_owned())
        .map_err(|err| StartError::File {
            flag,
            path: path.display().to_string(),
            err,
        })
}

pub(super) async fn options(
    s: &ClusterSettings,
    epoch: u64,
    events: mpsc::Sender<Event>,
) -> Result<ConnectOptions, StartError> {
    let mut o = ConnectOptions::new();
    if let Some(path) = &s.creds_file {
        o = o
            .credentials_file(path)
            .await
            .map_err(|err| StartError::File {
                flag: "--nats-creds-file",
                path: path.display().to_string(),
                err,
            })?;
    }
    if let Some(path) = &s.token_file {
        o = o.token(read_secret("--nats-token-file", path)?);
    }
    if let (Some(user), Some(path)) = (&s.user, &s.password_file) {
        o = o.user_and_password(user.clone(), read_secret("--nats-password-file", path)?);
    }
    if let Some(path) = &s.tls_ca_file {
        o = o.add_root_certificates(path.clone());
    }
    if let (Some(cert), Some(key)) = (&s.tls_cert_file, &s.tls_key_file) {
        o = o.add_client_certificate(cert.clone(), key.clone());
    }
    if s.require_tls {
        o = o.require_tls(true);
    }
    Ok(o.no_echo()
        .name(format!("amble/{}/{epoch}", s.node))
        .retry_on_initial_connect()
        .max_reconnects(None)
        .reconnect_delay_callback(backoff)
        .connection_timeout(Duration::from_secs(2))
        .ping_interval(Duration::from_secs(2))
        .event_callback(move |event| {
            let events = events.clone();
            async move {
                // Bounded: a burst of events past it is only logged less.
                let _ = events.try_send(event);
            }
        }))
}

/// The NATS connection's events: the connected gauge, `/healthz`, and on
/// every (re)connection a heartbeat and this node's full states at once;
/// after a lost connection, also a request to every live peer for its full
/// states (what it published meanwhile did not reach this node).
/// `connected` follows the connected flag, set after it, for a caller that
/// awaits the connection instead of polling `/healthz`.
pub(super) async fn events(
    cluster: Arc<Cluster>,
    mut rx: mpsc::Receiver<Event>,
    connected: watch::Sender<bool>,
) {
    // The events arrive through a bounded queue that drops a burst past
    // it, so once a heartbeat period the client's own state is compared
    // with the flag: a Connected or Disconnected that was dropped is acted
    // on late rather than never (issue #15, finding 9).
    // A disagreement is acted on when two checks in a row see it: an
    // event still in the queue is not a missed one.
    let mut check = tokio::time::interval(cluster.settings.heartbeat);
    check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut suspect = None;
    loop {
        let event = tokio::select! {
            event = rx.recv() => match event {
                Some(event) => event,
                None => return,
            },
            _ = check.tick() => {
                let Some(nats) = &cluster.nats else { continue };
                let flag = cluster.connected.load(Ordering::Relaxed);
                let seen = missed(&nats.client.connection_state(), flag);
                match std::mem::replace(&mut suspect, seen.clone()) {
                    Some(event) if seen.as_ref() == Some(&event) => {
                        warn!(event = %event, "cluster: a NATS connection event was missed; acting on it now");
                        suspect = None;
                        event
                    }
                    _ => continue,
                }
            }
        };
        match event {
            Event::Connected => on_connected(&cluster, &connected).await,
            Event::Disconnected => {
                cluster.connected.store(false, Ordering::Relaxed);
                lock(&cluster.down_since).get_or_insert_with(Instant::now);
                cluster.metrics.cluster_connected.set(0);
                connected.send_replace(false);
                warn!(
                    "cluster: NATS connection lost; serving local members, reconnecting with backoff"
                );
            }
            Event::SlowConsumer(sid) => {
                debug!(
                    sid,
                    "cluster: a subscription overflowed (gaps are repaired)"
                );
            }
            other => debug!(event = %other, "cluster: NATS event"),
        }
    }
}

/// The event that was missed, when the client's `state` and this node's
/// `connected` flag disagree.
fn missed(state: &State, connected: bool) -> Option<Event> {
    match (state, connected) {
        (State::Connected, false) => Some(Event::Connected),
        (State::Disconnected | State::Pending, true) => Some(Event::Disconnected),
        _ => None,
    }
}

/// On every (re)connection: the flag and the gauge, a heartbeat, this
/// node's full states; after an outage, every live peer asked for theirs.
async fn on_connected(cluster: &Arc<Cluster>, connected: &watch::Sender<bool>) {
    cluster.connected.store(true, Ordering::Relaxed);
    let was_down = lock(&cluster.down_since).take();
    cluster.metrics.cluster_connected.set(1);
    connected.send_replace(true);
    match was_down {
        Some(at) => info!(
            after_ms = at.elapsed().as_millis() as u64,
            "cluster: NATS connection back"
        ),
        None => info!("cluster: connected to NATS"),
    }
    heartbeat(cluster, 0, false).await;
    tokio::spawn(publish_fulls(Arc::clone(cluster)));
    // Once more a heartbeat later: a peer that reconnected after us was
    // not subscribed yet, and a leave lost in the outage would otherwise
    // stay a ghost there until our next update (and here, until its next
    // update).
    if was_down.is_some() {
        resync_all(cluster);
        let again = Arc::clone(cluster);
        tokio::spawn(async move {
            tokio::time::sleep(again.settings.heartbeat).await;
            resync_all(&again);
            publish_fulls(again).await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missed_connection_event_is_found_from_the_clients_state() {
        assert_eq!(missed(&State::Connected, false), Some(Event::Connected));
        assert_eq!(
            missed(&State::Disconnected, true),
            Some(Event::Disconnected)
        );
        assert_eq!(missed(&State::Pending, true), Some(Event::Disconnected));
        assert_eq!(missed(&State::Connected, true), None);
        assert_eq!(missed(&State::Disconnected, false), None);
        assert_eq!(missed(&State::Pending, false), None);
    }

    #[test]
    fn backoff_doubles_to_a_second() {
        assert_eq!(backoff(0), Duration::from_millis(50));
        assert_eq!(backoff(1), Duration::from_millis(100));
        assert_eq!(backoff(4), Duration::from_millis(800));
        assert_eq!(backoff(5), Duration::from_secs(1));
        assert_eq!(backoff(1_000), Duration::from_secs(1));
    }
}
