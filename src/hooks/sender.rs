//! The task that POSTs the queue's batches to `--webhook-url`.
//!
//! One batch at a time, in order: it asks the pure [`Queue`] what to do,
//! makes the attempt (a new connection from [`Connector`], hyper's HTTP/1
//! client, the whole attempt under `--webhook-timeout-ms`), and reports the
//! [`Outcome`]. It sleeps while the queue is empty (woken by
//! [`Hooks::emit`]) and while a failed batch waits for its retry. When
//! told to stop it delivers what it can within [`FLUSH`] and logs what is
//! left.
//!
//! [`Queue`]: super::queue::Queue

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::Request;
use hyper::header::{CONTENT_TYPE, HOST, USER_AGENT};
use hyper_util::rt::TokioIo;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::queue::{Delivery, Done, Next, Outcome};
use super::{FLUSH, Hooks, sign};
use crate::outbound::{ConnectError, Connector};

/// How the sender reaches the receiver.
pub struct Post {
    pub connector: Connector,
    pub secret: Vec<u8>,
    /// The longest one attempt takes, connection included.
    pub timeout: Duration,
}

/// Why an attempt got no status.
#[derive(Debug, thiserror::Error)]
pub enum PostError {
    /// No connection, or no TLS session.
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// No answer within `--webhook-timeout-ms`.
    #[error("no answer within {0} ms")]
    Timeout(u128),
    /// The exchange broke (the receiver closed the connection, ...).
    #[error("HTTP: {0}")]
    Http(String),
}

impl PostError {
    /// The `outcome` label of `amble_webhook_deliveries_total`.
    fn label(&self) -> &'static str {
        match self {
            Self::Connect(_) => "connect",
            Self::Timeout(_) => "timeout",
            Self::Http(_) => "http",
        }
    }
}

/// Runs until `stop` is cancelled, then flushes for at most [`FLUSH`].
pub async fn run(hooks: Arc<Hooks>, post: Post, stop: CancellationToken) {
    loop {
        let next = hooks.inner().queue.next(Instant::now().into_std());
        match next {
            Next::Send(delivery) => attempt(&hooks, &post, delivery, post.timeout).await,
            Next::RetryAt(at) => {
                tokio::select! {
                    () = tokio::time::sleep_until(at.into()) => {}
                    () = stop.cancelled() => break,
                }
            }
            Next::Idle | Next::Busy => {
                tokio::select! {
                    () = hooks.wake.notified() => {}
                    () = stop.cancelled() => break,
                }
            }
        }
    }
    let deadline = Instant::now() + FLUSH;
    loop {
        let next = hooks.inner().queue.next(Instant::now().into_std());
        match next {
            Next::Send(delivery) => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    hooks
                        .inner()
                        .queue
                        .done(Instant::now().into_std(), Outcome::Failed);
                    break;
                }
                attempt(&hooks, &post, delivery, post.timeout.min(left)).await;
            }
            Next::RetryAt(at) if Instant::from_std(at) < deadline => {
                tokio::time::sleep_until(at.into()).await;
            }
            Next::RetryAt(_) | Next::Idle | Next::Busy => break,
        }
    }
    let left = hooks.queued();
    if left == 0 {
        info!("webhooks: every queued event was delivered");
    } else {
        warn!(
            events = left,
            "webhooks: {left} events were not delivered before shutdown (the app can \
             reconcile from the rooms it reads at start)"
        );
    }
}

/// One attempt of `delivery`, its outcome reported to the queue and the
/// metrics.
async fn attempt(hooks: &Hooks, post: &Post, delivery: Delivery, timeout: Duration) {
    let t_ms = hooks.clock.now_ms();
    let signature = sign::sign(&post.secret, t_ms, &delivery.body);
    let result = tokio::time::timeout(timeout, send(post, delivery.body.clone(), signature))
        .await
        .unwrap_or(Err(PostError::Timeout(timeout.as_millis())));
    let (outcome, label) = match &result {
        Ok(status) => match Outcome::of_status(*status) {
            Outcome::Delivered => (Outcome::Delivered, "ok"),
            other => (other, "status"),
        },
        Err(err) => (Outcome::Failed, err.label()),
    };
    let m = &hooks.metrics;
    m.webhook_delivery(label);
    if delivery.attempt > 1 {
        m.webhook_retries.inc();
    }
    let (done, depth) = {
        let mut inner = hooks.inner();
        let done = inner.queue.done(Instant::now().into_std(), outcome);
        (done, inner.queue.len())
    };
    m.webhook_queue_depth.set(depth as i64);
    let events = delivery.events;
    let attempt = delivery.attempt;
    match (done, &result) {
        (Done::Delivered(_), Ok(status)) => {
            debug!(status, events, attempt, "webhooks: batch delivered");
        }
        (Done::Dropped(n), Ok(status)) => {
            m.webhook_dropped("refused", n as u64);
            warn!(
                status,
                events = n,
                "webhooks: the receiver refused a batch (4xx): its events are dropped"
            );
        }
        (Done::RetryIn(wait), Ok(status)) => warn!(
            status,
            events,
            attempt,
            retry_in_ms = wait.as_millis() as u64,
            "webhooks: the receiver answered with an error; the batch will be sent again"
        ),
        (Done::RetryIn(wait), Err(err)) => warn!(
            %err,
            events,
            attempt,
            retry_in_ms = wait.as_millis() as u64,
            "webhooks: no answer from the receiver; the batch will be sent again"
        ),
        (_, Err(err)) => warn!(%err, events, "webhooks: attempt failed"),
    }
}

/// POSTs `body` with its signature: the receiver's status.
async fn send(post: &Post, body: Bytes, signature: String) -> Result<u16, PostError> {
    let http = |err: hyper::Error| PostError::Http(err.to_string());
    let io = post.connector.connect(post.timeout).await?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(http)?;
    let target = post.connector.target();
    let request = Request::post(target.path_and_query())
        .header(HOST, target.authority())
        .header(CONTENT_TYPE, "application/json")
        .header(USER_AGENT, concat!("amble/", env!("CARGO_PKG_VERSION")))
        .header(sign::HEADER, signature)
        .body(Full::new(body))
        .map_err(|err| PostError::Http(err.to_string()))?;
    let exchange = async {
        let response = sender.send_request(request).await.map_err(http)?;
        Ok(response.status().as_u16())
    };
    // The connection is driven here, not in a task of its own, so a
    // timeout drops all of it; the response's body is not read.
    tokio::pin!(conn, exchange);
    tokio::select! {
        out = &mut exchange => out,
        done = &mut conn => {
            done.map_err(http)?;
            exchange.await
        }
    }
}
