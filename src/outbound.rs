//! Connections amble opens to other servers over HTTP/1: the key set of
//! `--auth-jwks-url` (`access::auth::jwks::fetch`) and the webhook
//! receiver of `--webhook-url` (`hooks::sender`).
//!
//! This owns the part they share: which URLs are accepted
//! ([`Target::parse`], pure), and one connection to a target
//! ([`Connector::connect`]): TCP under a deadline, then TLS by rustls with
//! the system's CA roots for https. What is sent over it, and how long the
//! whole exchange may take, is the caller's.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::http::uri::{Scheme, Uri};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls::pki_types::ServerName;
use tokio_rustls::rustls::{self, ClientConfig, RootCertStore};

/// Where plain `http://` is accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlainHttp {
    /// Only to a loopback host (a test, a sidecar): what is read in the
    /// clear from elsewhere could be replaced by anyone on the path.
    LoopbackOnly,
    /// To any host; the caller warns about a non-loopback one.
    Anywhere,
}

/// A checked URL of a server to reach.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    uri: Uri,
    host: String,
    port: u16,
    tls: bool,
}

impl Target {
    /// Accepts `https://HOST[:PORT]/PATH`, and `http://` where `plain`
    /// allows it. A URL with credentials (`user@`) is refused.
    pub fn parse(url: &str, plain: PlainHttp) -> Result<Self, String> {
        let uri: Uri = url
            .parse()
            .map_err(|err| format!("not a URL ({err}): give https://HOST/PATH"))?;
        let authority = uri.authority().ok_or("no host: give https://HOST/PATH")?;
        if authority.as_str().contains('@') {
            return Err("a URL with credentials (user@) is not accepted".into());
        }
        let host = authority.host().trim_matches(['[', ']']).to_owned();
        if host.is_empty() {
            return Err("no host: give https://HOST/PATH".into());
        }
        let tls = match uri.scheme() {
            Some(s) if *s == Scheme::HTTPS => true,
            Some(s) if *s == Scheme::HTTP => {
                if plain == PlainHttp::LoopbackOnly && !is_loopback(&host) {
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
                return Err(match plain {
                    PlainHttp::LoopbackOnly => {
                        "the URL must start with https:// (or http:// for a loopback host)"
                    }
                    PlainHttp::Anywhere => "the URL must start with https:// or http://",
                }
                .into());
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

    /// Whether it is reached over TLS.
    pub fn tls(&self) -> bool {
        self.tls
    }

    /// Whether its host is this machine (`127.0.0.0/8`, `[::1]`,
    /// `localhost`).
    pub fn is_loopback(&self) -> bool {
        is_loopback(&self.host)
    }

    /// The host, an IP literal without brackets or a name.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The request target: the path and query (`/` when empty).
    pub fn path_and_query(&self) -> &str {
        self.uri.path_and_query().map_or("/", |p| p.as_str())
    }

    /// The `Host` header's value: the URL's authority.
    pub fn authority(&self) -> &str {
        self.uri
            .authority()
            .map_or(self.host.as_str(), |a| a.as_str())
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

/// A byte stream to a target, plain or TLS.
pub trait Io: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}

/// Why no connection was made.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// No TCP connection (DNS, refused, unreachable, the deadline).
    #[error("cannot connect to {host}:{port}: {why}")]
    Connect {
        host: String,
        port: u16,
        why: String,
    },
    /// The TLS handshake failed (an unknown CA, a wrong name, ...).
    #[error("TLS: {0}")]
    Tls(String),
}

/// Opens connections to one target; holds its TLS settings.
#[derive(Clone)]
pub struct Connector {
    target: Target,
    tls: Option<TlsConnector>,
}

impl std::fmt::Debug for Connector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connector")
            .field("target", &self.target)
            .finish_non_exhaustive()
    }
}

impl Connector {
    /// A connector for `target`; for https, with the system's CA roots (an
    /// error when it has none).
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

    /// One connection: TCP within `connect_timeout` (no delay), then TLS
    /// for https. The caller bounds the TLS handshake with the whole
    /// exchange.
    pub async fn connect(&self, connect_timeout: Duration) -> Result<Box<dyn Io>, ConnectError> {
        let t = &self.target;
        let connect = |why: String| ConnectError::Connect {
            host: t.host.clone(),
            port: t.port,
            why,
        };
        let tcp = tokio::time::timeout(
            connect_timeout,
            TcpStream::connect((t.host.as_str(), t.port)),
        )
        .await
        .map_err(|_| {
            connect(format!(
                "no connection within {} ms",
                connect_timeout.as_millis()
            ))
        })?
        .map_err(|err| connect(err.to_string()))?;
        let _ = tcp.set_nodelay(true);
        match &self.tls {
            Some(tls) => {
                let name = ServerName::try_from(t.host.clone())
                    .map_err(|err| ConnectError::Tls(format!("{}: {err}", t.host)))?;
                let stream = tls
                    .connect(name, tcp)
                    .await
                    .map_err(|err| ConnectError::Tls(err.to_string()))?;
                Ok(Box::new(stream))
            }
            None => Ok(Box::new(tcp)),
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn https_anywhere_http_by_policy() {
        let t = Target::parse("https://idp.example/keys", PlainHttp::LoopbackOnly).expect("https");
        assert!(t.tls());
        assert_eq!(t.authority(), "idp.example");
        assert_eq!(t.path_and_query(), "/keys");
        let local = Target::parse("http://127.0.0.1:9/h?x=1", PlainHttp::LoopbackOnly)
            .expect("loopback http");
        assert!(!local.tls() && local.is_loopback());
        assert_eq!(local.path_and_query(), "/h?x=1");
        assert!(Target::parse("http://app.internal/h", PlainHttp::LoopbackOnly).is_err());
        let lan = Target::parse("http://app.internal:8080/h", PlainHttp::Anywhere).expect("http");
        assert!(!lan.tls() && !lan.is_loopback());
        assert_eq!(lan.authority(), "app.internal:8080");
        assert!(Target::parse("ftp://app.internal/h", PlainHttp::Anywhere).is_err());
        assert!(Target::parse("https://u:p@app.internal/h", PlainHttp::Anywhere).is_err());
        assert!(Target::parse("not a url", PlainHttp::Anywhere).is_err());
    }
}
