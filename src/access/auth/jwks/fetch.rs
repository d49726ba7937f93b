//! One bounded GET of a key set (`--auth-jwks-url`): https with the
//! system's CA roots, or plain http to a loopback host only.
//!
//! [`Target::parse`] (which URLs are accepted) and [`max_age`] (a
//! response's `Cache-Control`) are pure; [`Fetcher::get`] is the one
//! request: hyper's HTTP/1 client on one connection (opened by
//! `outbound`, shared with the webhook sender), no pool, no redirect
//! followed, under [`CONNECT_TIMEOUT`] and [`FETCH_TIMEOUT`], at most
//! [`MAX_RESPONSE_BYTES`] read. Every way it fails is a [`FetchError`]
//! with a `reason` for `amble_auth_jwks_fetch_failures_total`.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Empty, LengthLimitError, Limited};
use hyper::Request;
use hyper::body::Incoming;
use hyper::header::{ACCEPT, CACHE_CONTROL, CONTENT_LENGTH, HOST, USER_AGENT};
use hyper_util::rt::TokioIo;

use super::{KeySet, Secrets, SetError};
use crate::outbound::{self, ConnectError, Connector, PlainHttp};

/// The longest wait for a TCP connection to the key set's host.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest one fetch takes, connection, TLS and body included.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest response body read, bytes. Providers' sets are a few KiB.
pub const MAX_RESPONSE_BYTES: usize = 256 * 1024;

/// Where the key set is fetched from: a checked `--auth-jwks-url`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target(outbound::Target);

impl Target {
    /// Accepts `https://HOST[:PORT]/PATH`, and `http://` only for a
    /// loopback host (`127.0.0.0/8`, `[::1]`, `localhost`): a key set read
    /// in the clear from elsewhere could be replaced by anyone on the path.
    pub fn parse(url: &str) -> Result<Self, String> {
        outbound::Target::parse(url, PlainHttp::LoopbackOnly).map(Self)
    }

    /// Whether it is fetched over TLS.
    pub fn tls(&self) -> bool {
        self.0.tls()
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// How long a response says it may be kept: `Cache-Control: max-age=N`,
/// unless it also says `no-store` or `no-cache` (then `Some(0)`).
pub fn max_age(cache_control: &str) -> Option<Duration> {
    let mut age = None;
    for directive in cache_control.split(',').map(str::trim) {
        let lower = directive.to_ascii_lowercase();
        if lower == "no-store" || lower == "no-cache" {
            return Some(Duration::ZERO);
        }
        if let Some(n) = lower.strip_prefix("max-age=") {
            age = n
                .trim_matches('"')
                .parse::<u64>()
                .ok()
                .map(Duration::from_secs);
        }
    }
    age
}

/// Why a fetch failed. Each is counted under its
/// [`reason`](FetchError::reason).
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// No TCP connection (DNS, refused, unreachable, [`CONNECT_TIMEOUT`]).
    #[error("cannot connect to {host}:{port}: {why}")]
    Connect {
        host: String,
        port: u16,
        why: String,
    },
    /// The TLS handshake failed (an unknown CA, a wrong name, ...).
    #[error("TLS: {0}")]
    Tls(String),
    /// The whole fetch took longer than [`FETCH_TIMEOUT`].
    #[error("no answer within {} s", FETCH_TIMEOUT.as_secs())]
    Timeout,
    /// The HTTP exchange failed (a broken or closed connection).
    #[error("HTTP: {0}")]
    Http(String),
    /// A status other than 200 (redirects are not followed).
    #[error("HTTP status {0}: expected 200 with the key set")]
    Status(u16),
    /// A body larger than [`MAX_RESPONSE_BYTES`].
    #[error("the response is larger than {MAX_RESPONSE_BYTES} bytes")]
    TooLarge,
    /// The body is not a usable key set.
    #[error("{0}")]
    Set(#[from] SetError),
}

impl FetchError {
    /// The `reason` label: `connect`, `tls`, `timeout`, `http`, `status`,
    /// `too_large`, `json` or `keys`.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Connect { .. } => "connect",
            Self::Tls(_) => "tls",
            Self::Timeout => "timeout",
            Self::Http(_) => "http",
            Self::Status(_) => "status",
            Self::TooLarge => "too_large",
            Self::Set(err) => err.reason(),
        }
    }

    /// Whether trying again soon may help (the network, a server error), as
    /// opposed to an answer that is wrong (404, not a key set).
    pub fn transient(&self) -> bool {
        match self {
            Self::Connect { .. } | Self::Timeout | Self::Http(_) => true,
            Self::Status(code) => *code >= 500 || *code == 429,
            Self::Tls(_) | Self::TooLarge | Self::Set(_) => false,
        }
    }
}

/// A fetched key set and how long the provider said it may be kept.
#[derive(Debug)]
pub struct Fetched {
    pub set: KeySet,
    pub max_age: Option<Duration>,
}

/// Fetches one target's key set; holds its connector.
#[derive(Clone, Debug)]
pub struct Fetcher {
    target: Target,
    connector: Connector,
}

impl Fetcher {
    /// A fetcher for `target`; for https, with the system's CA roots
    /// (an error when it has none).
    pub fn new(target: Target) -> Result<Self, String> {
        let connector = Connector::new(target.0.clone())?;
        Ok(Self { target, connector })
    }

    /// The target.
    pub fn target(&self) -> &Target {
        &self.target
    }

    /// One GET of the key set, within [`FETCH_TIMEOUT`].
    pub async fn get(&self) -> Result<Fetched, FetchError> {
        tokio::time::timeout(FETCH_TIMEOUT, self.get_unbounded())
            .await
            .unwrap_or(Err(FetchError::Timeout))
    }

    async fn get_unbounded(&self) -> Result<Fetched, FetchError> {
        let io = self
            .connector
            .connect(CONNECT_TIMEOUT)
            .await
            .map_err(|err| match err {
                ConnectError::Connect { host, port, why } => {
                    FetchError::Connect { host, port, why }
                }
                ConnectError::Tls(why) => FetchError::Tls(why),
            })?;
        self.request(io).await
    }

    async fn request(&self, io: Box<dyn outbound::Io>) -> Result<Fetched, FetchError> {
        let http = |err: hyper::Error| FetchError::Http(err.to_string());
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
            .await
            .map_err(http)?;
        let t = &self.target.0;
        let request = Request::get(t.path_and_query())
            .header(HOST, t.authority())
            .header(ACCEPT, "application/json, application/jwk-set+json")
            .header(USER_AGENT, concat!("amble/", env!("CARGO_PKG_VERSION")))
            .body(Empty::<Bytes>::new())
            .map_err(|err| FetchError::Http(err.to_string()))?;
        let exchange = async {
            let response = sender.send_request(request).await.map_err(http)?;
            read(response).await
        };
        // The connection is driven here, not in a task of its own, so
        // that a timeout or a stalled server drops all of it.
        tokio::pin!(conn, exchange);
        tokio::select! {
            out = &mut exchange => out,
            done = &mut conn => {
                done.map_err(http)?;
                exchange.await
            }
        }
    }
}

async fn read(response: hyper::Response<Incoming>) -> Result<Fetched, FetchError> {
    let status = response.status();
    if status != hyper::StatusCode::OK {
        return Err(FetchError::Status(status.as_u16()));
    }
    let headers = response.headers();
    let declared = headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_RESPONSE_BYTES as u64) {
        return Err(FetchError::TooLarge);
    }
    let max_age = headers
        .get(CACHE_CONTROL)
        .and_then(|v| v.to_str().ok())
        .and_then(max_age);
    let body = Limited::new(response.into_body(), MAX_RESPONSE_BYTES)
        .collect()
        .await
        .map_err(|err| {
            if err.downcast_ref::<LengthLimitError>().is_some() {
                FetchError::TooLarge
            } else {
                FetchError::Http(err.to_string())
            }
        })?
        .to_bytes();
    let set = KeySet::parse_with(&body, Secrets::Skipped)?;
    Ok(Fetched { set, max_age })
}
