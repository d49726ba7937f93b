//! Connections before the WebSocket: one HTTP/1.1 connection served over
//! any byte stream, with a deadline and a size for every request head, an
//! idle deadline between kept-alive requests, and a pool that caps how many
//! such connections are open.
//!
//! [`Http::serve_connection`] serves one connection over anything that
//! reads and writes (the accept loop in [`listener`](crate::edge::listener) hands
//! it TCP sockets; the tests hand it in-memory pipes). hyper parses the
//! requests (its `max_header_size` answers 431) and the axum router answers
//! them; this module adds what hyper lacks: a head deadline that runs from
//! connect or from the first byte of the next request, a separate idle
//! deadline, a response the client does not read counted as idle, and the
//! pool. When the pool is full, a newcomer is served and the connection
//! that has waited longest for a request head is closed, so a slowloris
//! cannot lock anyone out. After a `101`, the socket leaves the pool for
//! the WebSocket's own cap.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use axum::http::{Request, StatusCode};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::sync::oneshot;
use tokio::time::{Instant, sleep_until, timeout};
use tokio_util::task::TaskTracker;
use tower_service::Service as _;
use tracing::debug;

use crate::server::shared::Shared;
use crate::session::io::Admission;

use super::routes;
use super::watch::{Expired, Phase, Watch, Watched};
use crate::metrics::Metrics;

/// Shutdown gives a response still being written this long (at most the
/// shutdown timeout) before its connection is dropped.
const DRAIN: Duration = Duration::from_secs(1);

/// How long a status written to a connection being closed may take.
const LAST_WORDS: Duration = Duration::from_millis(100);

/// After refusing a request, how long and how much more of it is read
/// (and dropped) before closing, so the refusal is not lost to a reset.
const LINGER: Duration = Duration::from_millis(500);
const LINGER_BYTES: usize = 64 * 1024;

/// The HTTP side of the server: the router, hyper's settings, the pool.
pub struct Http {
    shared: Arc<Shared>,
    router: Router,
    builder: http1::Builder,
    pool: Pool,
    header_timeout: Duration,
    idle_timeout: Duration,
    drain: Duration,
    next_id: AtomicU64,
    /// Every connection task, so shutdown can wait for them.
    pub(crate) tasks: TaskTracker,
}

impl std::fmt::Debug for Http {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Http").finish_non_exhaustive()
    }
}

impl Http {
    /// `cap` is the most connections in the pool at once.
    pub fn new(shared: Arc<Shared>, cap: usize) -> Arc<Self> {
        let config = &shared.config;
        let max_head = config.edge.http_max_header_bytes as usize;
        let mut builder = http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            // Our own deadlines run instead: hyper's starts only when it
            // polls for a head and has one length for idle and head alike.
            .header_read_timeout(None)
            .max_header_size(max_head)
            // hyper's floor for its buffer; heads are capped above anyway.
            .max_buf_size(max_head.max(8_192));
        Arc::new(Self {
            router: routes::router(Arc::clone(&shared)),
            builder,
            pool: Pool::new(cap, Arc::clone(&shared.metrics)),
            header_timeout: config.edge.http_header_timeout(),
            idle_timeout: config.edge.http_idle_timeout(),
            drain: DRAIN.min(Duration::from_millis(config.shutdown_timeout_ms)),
            next_id: AtomicU64::new(0),
            tasks: TaskTracker::new(),
            shared,
        })
    }

    /// Closes the pool connection that has waited longest for a request
    /// head, to make room; false when the pool is empty.
    pub fn evict_oldest(&self) -> bool {
        self.pool.evict_oldest()
    }

    /// Serves one connection from `peer` over `io` until it closes or is
    /// upgraded to a WebSocket (which then runs on its own task).
    pub async fn serve_connection<I>(self: Arc<Self>, io: I, peer: SocketAddr, admission: Admission)
    where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let id = self.next_id.fetch_add(1, Relaxed);
        let start = Instant::now();
        let watch = Arc::new(Watch::new(start));
        let mut evicted = self.pool.join(id, start);
        let member = Member {
            pool: &self.pool,
            id,
        };
        let io = Watched {
            io,
            watch: Arc::clone(&watch),
            _admission: admission,
        };
        let service = {
            let http = Arc::clone(&self);
            let watch = Arc::clone(&watch);
            hyper::service::service_fn(move |mut request: Request<Incoming>| {
                let now = Instant::now();
                watch.enter(Phase::Serving, now);
                http.pool.rekey(id, Class::Serving, now);
                request.extensions_mut().insert(ConnectInfo(peer));
                let mut router = http.router.clone();
                let http = Arc::clone(&http);
                let watch = Arc::clone(&watch);
                async move {
                    let response = router.call(request).await;
                    if let Ok(r) = &response {
                        if r.status() == StatusCode::SWITCHING_PROTOCOLS {
                            watch.enter(Phase::Upgraded, Instant::now());
                        } else {
                            let now = Instant::now();
                            watch.enter(Phase::Idle, now);
                            http.pool.rekey(id, Class::Waiting, now);
                        }
                    }
                    response
                }
            })
        };
        let mut conn = self
            .builder
            .serve_connection(TokioIo::new(io), service)
            .with_upgrades();

        let stopping = self.shared.shutdown.clone();
        let stopping = stopping.cancelled();
        tokio::pin!(stopping);
        let mut drain_by: Option<Instant> = None;
        let timer = sleep_until(watch.deadline(self.header_timeout, self.idle_timeout));
        tokio::pin!(timer);
        let end = loop {
            tokio::select! {
                result = &mut conn => break End::Served(result),
                _ = &mut evicted => break End::Evicted,
                () = &mut stopping, if drain_by.is_none() => {
                    Pin::new(&mut conn).graceful_shutdown();
                    let by = Instant::now() + self.drain;
                    drain_by = Some(by);
                    if by < timer.deadline() {
                        timer.as_mut().reset(by);
                    }
                }
                () = &mut timer => {
                    let now = Instant::now();
                    if drain_by.is_some_and(|by| now >= by) {
                        break End::Drained;
                    }
                    match watch.check(now, self.header_timeout, self.idle_timeout) {
                        Ok(next) => timer.as_mut().reset(drain_by.map_or(next, |by| by.min(next))),
                        Err(expired) => break End::Expired(expired),
                    }
                }
            }
        };
        let metrics = &self.shared.metrics;
        // Refused requests: the client may still be sending.
        let lingers = matches!(&end, End::Served(Err(err)) if err.is_parse())
            || matches!(end, End::Expired(Expired::Head));
        let last_words = match end {
            End::Served(Ok(())) => None,
            End::Served(Err(err)) => {
                debug!(%peer, %err, "HTTP connection failed");
                if err.is_parse_too_large() {
                    metrics.http_heads_too_large.inc();
                    None
                } else if err.is_parse_version_h2() {
                    metrics.http_bad_requests.inc();
                    Some((
                        StatusCode::HTTP_VERSION_NOT_SUPPORTED,
                        "HTTP/2 is not served here: speak HTTP/1.1".to_owned(),
                    ))
                } else {
                    if err.is_parse() {
                        metrics.http_bad_requests.inc();
                    }
                    None
                }
            }
            End::Evicted => {
                debug!(%peer, "HTTP connection evicted");
                (watch.phase() != Phase::Serving).then(|| {
                    (
                        StatusCode::SERVICE_UNAVAILABLE,
                        "server busy: this connection waited longest for a request and was \
                         closed to make room"
                            .to_owned(),
                    )
                })
            }
            End::Drained => None,
            End::Expired(Expired::Head) => {
                debug!(%peer, "request head timeout");
                metrics.http_header_timeouts.inc();
                Some((
                    StatusCode::REQUEST_TIMEOUT,
                    format!(
                        "the request head did not arrive within {} ms",
                        self.header_timeout.as_millis()
                    ),
                ))
            }
            End::Expired(Expired::Idle) => {
                debug!(%peer, "HTTP idle timeout");
                metrics.http_idle_timeouts.inc();
                None
            }
        };
        // Out of the pool before any last words: they are not service.
        drop(member);
        let Some(parts) = conn.into_parts() else {
            return;
        };
        let mut io = parts.io.into_inner().io;
        if let Some((status, reason)) = last_words {
            let _ = timeout(LAST_WORDS, async {
                io.write_all(status_response(status, &reason).as_bytes())
                    .await?;
                io.shutdown().await
            })
            .await;
        }
        // Closing with unread bytes would reset the connection and could
        // destroy the answer before the client reads it: read (and drop) a
        // little of what is left first.
        if lingers {
            let _ = timeout(LINGER, async {
                let mut left = LINGER_BYTES;
                let mut sink = [0u8; 4_096];
                while left > 0 {
                    match io.read(&mut sink).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => left = left.saturating_sub(n),
                    }
                }
            })
            .await;
        }
    }
}

/// A whole HTTP/1.1 response with a plain-text reason, closing the
/// connection.
pub(crate) fn status_response(status: StatusCode, reason: &str) -> String {
    format!(
        "HTTP/1.1 {} {}\r\ncontent-type: text/plain; charset=utf-8\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{reason}\n",
        status.as_str(),
        status.canonical_reason().unwrap_or(""),
        reason.len() + 1,
    )
}

/// How a connection's serving ended.
enum End {
    Served(hyper::Result<()>),
    Evicted,
    Drained,
    Expired(Expired),
}

/// Eviction order: connections waiting for a head go before those being
/// answered; within each, the one waiting longest goes first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Class {
    Waiting,
    Serving,
}

type Key = (Class, Instant, u64);

/// The connections that are not WebSockets, capped; each can be told to
/// close.
struct Pool {
    cap: usize,
    inner: Mutex<PoolInner>,
    metrics: Arc<Metrics>,
}

#[derive(Default)]
struct PoolInner {
    order: BTreeMap<Key, oneshot::Sender<()>>,
    keys: HashMap<u64, Key>,
}

impl Pool {
    fn new(cap: usize, metrics: Arc<Metrics>) -> Self {
        Self {
            cap: cap.max(1),
            inner: Mutex::default(),
            metrics,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PoolInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds connection `id`, making room if the pool is full; the receiver
    /// completes when it is evicted.
    fn join(&self, id: u64, now: Instant) -> oneshot::Receiver<()> {
        let (tx, rx) = oneshot::channel();
        let mut inner = self.lock();
        while inner.keys.len() >= self.cap {
            if !self.evict_locked(&mut inner) {
                break;
            }
        }
        let key = (Class::Waiting, now, id);
        inner.order.insert(key, tx);
        inner.keys.insert(id, key);
        self.metrics.http_connections.set(inner.keys.len() as i64);
        rx
    }

    fn rekey(&self, id: u64, class: Class, now: Instant) {
        let mut inner = self.lock();
        let Some(old) = inner.keys.get(&id).copied() else {
            return;
        };
        if let Some(tx) = inner.order.remove(&old) {
            let key = (class, now, id);
            inner.order.insert(key, tx);
            inner.keys.insert(id, key);
        }
    }

    fn leave(&self, id: u64) {
        let mut inner = self.lock();
        if let Some(key) = inner.keys.remove(&id) {
            inner.order.remove(&key);
        }
        self.metrics.http_connections.set(inner.keys.len() as i64);
    }

    fn evict_oldest(&self) -> bool {
        let mut inner = self.lock();
        let evicted = self.evict_locked(&mut inner);
        self.metrics.http_connections.set(inner.keys.len() as i64);
        evicted
    }

    fn evict_locked(&self, inner: &mut PoolInner) -> bool {
        let Some(((_, _, id), tx)) = inner.order.pop_first() else {
            return false;
        };
        inner.keys.remove(&id);
        let _ = tx.send(());
        self.metrics.http_evictions.inc();
        true
    }
}

/// Leaves the pool when the connection's task ends.
struct Member<'a> {
    pool: &'a Pool,
    id: u64,
}

impl Drop for Member<'_> {
    fn drop(&mut self) {
        self.pool.leave(self.id);
    }
}

#[cfg(test)]
mod tests;
