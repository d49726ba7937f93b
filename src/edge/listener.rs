//! The accept loop.
//!
//! Every accepted socket takes a slot under one budget sized to fit the
//! process's open-file limit (WebSocket cap + HTTP pool cap, see
//! `server::capacity`), and a place
//! under its address's cap. When the budget is spent, the pool connection
//! waiting longest for a request head makes room; when only WebSockets
//! hold it, the newcomer gets 503. When `accept` itself fails for lack of
//! descriptors, the loop counts it and backs off instead of spinning,
//! while the connected sockets are served as before.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::access::addresses::Addresses;
use crate::edge::http::{Http, status_response};
use crate::metrics::Metrics;
use crate::session::io::Admission;

/// How long a newcomer waits for the socket an eviction frees.
const EVICTION_WAIT: Duration = Duration::from_secs(1);

/// Accepts connections until `stop` is cancelled.
pub async fn accept_loop(
    listener: TcpListener,
    http: Arc<Http>,
    addresses: Arc<Addresses>,
    sockets: Arc<Semaphore>,
    metrics: Arc<Metrics>,
    send_buffer: usize,
    stop: CancellationToken,
) {
    let mut backoff = Backoff::default();
    loop {
        let accepted = tokio::select! {
            biased;
            () = stop.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let (tcp, peer) = match accepted {
            Ok(accepted) => {
                backoff.recovered();
                accepted
            }
            Err(err) => {
                let Some(pause) = backoff.failed(&err, &metrics) else {
                    continue;
                };
                // A descriptor is what is missing: free the one held by the
                // connection waiting longest for a request head.
                if is_out_of_files(&err) {
                    http.evict_oldest();
                }
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(pause) => continue,
                }
            }
        };
        tune(&tcp, send_buffer);
        let socket = match sockets.clone().try_acquire_owned() {
            Ok(permit) => Some(permit),
            Err(_) if http.evict_oldest() => {
                tokio::time::timeout(EVICTION_WAIT, sockets.clone().acquire_owned())
                    .await
                    .ok()
                    .and_then(Result::ok)
            }
            Err(_) => None,
        };
        let Some(socket) = socket else {
            metrics.http_refused_full.inc();
            refuse(
                &tcp,
                StatusCode::SERVICE_UNAVAILABLE,
                "server full: too many connections, try again later",
            );
            continue;
        };
        let address = match addresses.admit_peer(peer.ip()) {
            Ok(lease) => lease,
            Err(refusal) => {
                refuse(&tcp, StatusCode::TOO_MANY_REQUESTS, &refusal.to_string());
                continue;
            }
        };
        let admission = Admission {
            socket: Some(socket),
            address,
        };
        http.tasks
            .spawn(Arc::clone(&http).serve_connection(tcp, peer, admission));
    }
}

/// Answers a socket refused at accept and closes it, without waiting.
fn refuse(tcp: &TcpStream, status: StatusCode, reason: &str) {
    let _ = tcp.try_write(status_response(status, reason).as_bytes());
}

fn tune(tcp: &TcpStream, send_buffer: usize) {
    // Small frames must not wait for Nagle's algorithm.
    if let Err(err) = tcp.set_nodelay(true) {
        warn!(%err, "TCP_NODELAY");
    }
    if send_buffer > 0
        && let Err(err) = socket2::SockRef::from(tcp).set_send_buffer_size(send_buffer)
    {
        warn!(%err, "SO_SNDBUF");
    }
}

/// EMFILE (the process) or ENFILE (the system) is out of descriptors.
fn is_out_of_files(err: &io::Error) -> bool {
    const ENFILE: i32 = 23;
    const EMFILE: i32 = 24;
    matches!(err.raw_os_error(), Some(EMFILE | ENFILE))
}

/// Errors that concern one connection only: accept the next at once.
fn is_connection_error(err: &io::Error) -> bool {
    matches!(
        err.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
    )
}

/// Pauses between failed accepts, doubling from 10 ms to 1 s; one log line
/// when failures start and one when they end.
#[derive(Debug, Default)]
struct Backoff {
    failures: u64,
    pause: Duration,
}

impl Backoff {
    const FIRST: Duration = Duration::from_millis(10);
    const MOST: Duration = Duration::from_secs(1);

    /// Counts a failed accept; the pause before the next, or `None` to go on.
    fn failed(&mut self, err: &io::Error, metrics: &Metrics) -> Option<Duration> {
        if is_connection_error(err) {
            metrics.accept_failed("connection");
            return None;
        }
        let out_of_files = is_out_of_files(err);
        metrics.accept_failed(if out_of_files {
            "out_of_files"
        } else {
            "other"
        });
        if self.failures == 0 {
            if out_of_files {
                warn!(
                    %err,
                    "accept failed: out of file descriptors; backing off (counted in \
                     amble_accept_errors_total). Raise the open-file limit (`ulimit -n`) or \
                     lower --max-connections / --max-http-connections"
                );
            } else {
                warn!(%err, "accept failed; backing off");
            }
        }
        self.failures += 1;
        self.pause = (self.pause * 2).clamp(Self::FIRST, Self::MOST);
        Some(self.pause)
    }

    fn recovered(&mut self) {
        if self.failures > 0 {
            info!(failures = self.failures, "accepting again");
        }
        self.failures = 0;
        self.pause = Duration::ZERO;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_a_ceiling_and_resets() {
        let metrics = Metrics::default();
        let mut b = Backoff::default();
        let emfile = io::Error::from_raw_os_error(24);
        let pauses: Vec<_> = (0..10)
            .filter_map(|_| b.failed(&emfile, &metrics))
            .collect();
        assert_eq!(pauses[0], Duration::from_millis(10));
        assert_eq!(pauses[1], Duration::from_millis(20));
        assert_eq!(*pauses.last().expect("pauses"), Duration::from_secs(1));
        let aborted = io::Error::from(io::ErrorKind::ConnectionAborted);
        assert_eq!(b.failed(&aborted, &metrics), None);
        b.recovered();
        assert_eq!(b.failed(&emfile, &metrics), Some(Duration::from_millis(10)));
        assert!(
            metrics
                .render()
                .contains("amble_accept_errors_total{reason=\"out_of_files\"} 11")
        );
    }
}
