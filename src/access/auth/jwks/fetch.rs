//! One bounded GET of a key set (`--auth-jwks-url`): https with the
//! system's CA roots, or plain http to a loopback host only.
//!
//! [`Target::parse`] (which URLs are accepted) and [`max_age`] (a
//! response's `Cache-Control`) are pure; [`Fetcher::get`] is the one
//! request: hyper's HTTP/1 client on one connection, no pool, no redirect
//! followed, under [`CONNECT_TIMEOUT`] and [`FETCH_TIMEOUT`], at most
//! [`MAX_RESPONSE_BYTES`] read. Every way it fails is a [`FetchError`]
//! with a `reason` for `amble_auth_jwks_fetch_failures_total`.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Empty, LengthLimitError, Limited};
use hyper::Request;
use hyper::body::Incoming;
use hyper::header::{ACCEPT, CACHE_CONTROL, CONTENT_LENGTH, HOST, USER_AGENT};
use hyper::http::uri::{Scheme, Uri};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls::pki_types::ServerName;
use tokio_rustls::rustls::{self, ClientConfig, RootCertStore};

use super::{KeySet, Secrets, SetError};

/// The longest wait for a TCP connection to the key set's host.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest one fetch takes, connection, TLS and body included.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest response body read, bytes. Providers' sets are a few KiB.
pub const MAX_RESPONSE_BYTES: usize = 256 * 1024;

/// Where the key set is fetched from: a checked `--auth-jwks-url`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    uri: Uri,
    host: String,
    port: u16,
    tls: bool,
}

impl Target {
    /// Accepts `https://HOST[:PORT]/PATH`, and `http://` only for a
    /// loopback host (`127.0.0.0/8`, `[::1]`, `localhost`): a key set read
    /// in the clear from elsewhere could be replaced by anyone on the path.
    pub fn parse(url: &str) -> Result<Self, String> {
        let uri: Uri = url
            .parse()
            .map_err(|err| format!("not a URL ({err}): give https://HOST/PATH"))?;
        let authority = uri.authority().ok_or("no host: give https://HOST/PATH")?;
        if authority.as_str().contains('@') {
            return Err("a URL with credentials (user@) is not accepted".into());
        }
        let host = authority.host().trim_matches(['[', ']']).to_owned();
        let tls = match uri.scheme() {
            Some(s) if *s == Scheme::HTTPS => true,
            Some(s) if *s == Scheme::HTTP => {
                if !is_loopback(&host) {
                    return Err(format!(
                        "plain http is accepted only for a loopback host (127.0.0.1, [::1], \
                         localhost: a test or a sidecar); use https://{}{}",
                        authority.as_str(),
                        uri.path()
                    ));
                }
                false
            }
            _ => {
                return Err(
                    "the URL must start with https:// (or http:// for a loopback host)".into(),
                );
            }
        };
        let port = authority.port_u16().unwrap_or(if tls { 443 } else { 80 });
        Ok(Self {
            uri,
            host,
            port,
            tls,
        })
    }

    /// Whether it is fetched over TLS.
    pub fn tls(&self) -> bool {
        self.tls
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.uri)
    }
}

/// Whether `host` (an IP literal without brackets, or a name) is this
/// machine.
fn is_loopback(host: &str) -> bool {
    host.eq_ignore_ascii_case("localhost")
        || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
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

/// Fetches one target's key set; holds its TLS settings.
#[derive(Clone)]
pub struct Fetcher {
    target: Target,
    tls: Option<TlsConnector>,
}

impl std::fmt::Debug for Fetcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fetcher")
            .field("target", &self.target)
            .finish_non_exhaustive()
    }
}

impl Fetcher {
    /// A fetcher for `target`; for https, with the system's CA roots
    /// (an error when it has none).
    pub fn new(target: Target) -> Result<Self, String> {
        let tls = if target.tls {
            Some(TlsConnector::from(Arc::new(client_config()?)))
        } else {
            None
        };
        Ok(Self { target, tls })
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
        let t = &self.target;
        let connect = |why: String| FetchError::Connect {
            host: t.host.clone(),
            port: t.port,
            why,
        };
        let tcp = tokio::time::timeout(
            CONNECT_TIMEOUT,
            TcpStream::connect((t.host.as_str(), t.port)),
        )
        .await
        .map_err(|_| {
            connect(format!(
                "no connection within {} s",
                CONNECT_TIMEOUT.as_secs()
            ))
        })?
        .map_err(|err| connect(err.to_string()))?;
        let _ = tcp.set_nodelay(true);
        match &self.tls {
            Some(tls) => {
                let name = ServerName::try_from(t.host.clone())
                    .map_err(|err| FetchError::Tls(format!("{}: {err}", t.host)))?;
                let stream = tls
                    .connect(name, tcp)
                    .await
                    .map_err(|err| FetchError::Tls(err.to_string()))?;
                self.request(stream).await
            }
            None => self.request(tcp).await,
        }
    }

    async fn request<S>(&self, io: S) -> Result<Fetched, FetchError>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let http = |err: hyper::Error| FetchError::Http(err.to_string());
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
            .await
            .map_err(http)?;
        let t = &self.target;
        let path = t.uri.path_and_query().map_or("/", |p| p.as_str());
        let authority = t.uri.authority().map_or(t.host.as_str(), |a| a.as_str());
        let request = Request::get(path)
            .header(HOST, authority)
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

/// TLS for https targets: the system's CA roots (`ca-certificates` on
/// Debian), TLS 1.2 and 1.3, HTTP/1.1 by ALPN.
fn client_config() -> Result<ClientConfig, String> {
    let found = rustls_native_certs::load_native_certs();
    let mut roots = RootCertStore::empty();
    let (added, _ignored) = roots.add_parsable_certificates(found.certs);
    if added == 0 {
        let errors: Vec<String> = found.errors.iter().map(ToString::to_string).collect();
        return Err(format!(
            "no CA certificates found on this system to check https with (install \
             ca-certificates, or set SSL_CERT_FILE){}",
            if errors.is_empty() {
                String::new()
            } else {
                format!(": {}", errors.join("; "))
            }
        ));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|err| format!("TLS: {err}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}
