//! The edge's settings: where to listen, and what a connection may do
//! before it is a WebSocket (HTTP deadlines and sizes, the HTTP connection
//! cap, allowed origins and hosts, the `/metrics` token).

use std::fmt;
use std::net::IpAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use crate::edge::host::HostPattern;
use crate::edge::origin::OriginPattern;

/// Where amble listens and how it treats connections before the upgrade.
#[derive(Clone, Debug, clap::Args)]
pub struct EdgeConfig {
    /// Address to listen on: HOST:PORT, where HOST is an IP address or a
    /// host name (`localhost:3000`, `[::1]:3000`), or :PORT alone for every
    /// interface (as 0.0.0.0:PORT).
    #[arg(
        long,
        display_order = 1,
        env = "AMBLE_LISTEN",
        default_value = "127.0.0.1:3000"
    )]
    pub listen: ListenAddr,

    /// Kernel send buffer per connection, bytes (bounds what a slow reader
    /// can pin in the kernel). 0 leaves the system default.
    #[arg(
        long,
        display_order = 20,
        env = "AMBLE_SOCKET_SEND_BUFFER",
        default_value_t = 65_536
    )]
    pub socket_send_buffer: u32,

    /// A client has this many milliseconds from connecting (or from the
    /// first byte of its next request) to send a whole request head; then
    /// it gets 408 and is closed.
    #[arg(long, display_order = 23, env = "AMBLE_HTTP_HEADER_TIMEOUT_MS", default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub http_header_timeout_ms: u64,

    /// Largest request head (request line and headers), bytes; a larger
    /// one gets 431 and is closed.
    #[arg(long, display_order = 24, env = "AMBLE_HTTP_MAX_HEADER_BYTES", default_value_t = 16_384,
          value_parser = clap::value_parser!(u32).range(1_024..=1_048_576))]
    pub http_max_header_bytes: u32,

    /// A kept-alive HTTP connection that starts no new request for this
    /// many milliseconds is closed (also a response the client does not
    /// read for this long).
    #[arg(long, display_order = 25, env = "AMBLE_HTTP_IDLE_TIMEOUT_MS", default_value_t = 30_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub http_idle_timeout_ms: u64,

    /// Most connections that are not (yet) WebSockets: plain HTTP and
    /// upgrades in progress. When full, a newcomer is served and the
    /// connection that has waited longest for a request head is closed.
    #[arg(long, display_order = 26, env = "AMBLE_MAX_HTTP_CONNECTIONS", default_value_t = 1_024,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_http_connections: u32,

    /// Web pages (origins) that may open a WebSocket, besides a page on the
    /// server's own host (an `Origin` naming the `Host` the request was sent
    /// to) and clients that send no `Origin` (not browsers), which are always
    /// admitted. Each entry is an exact origin (`https://app.example.com`), an
    /// origin on any port (`http://localhost:*`), or `*` for every page;
    /// setting the list replaces the default, which is for local development.
    /// Other pages are refused with 403.
    #[arg(
        long,
        display_order = 33,
        env = "AMBLE_ALLOWED_ORIGINS",
        value_delimiter = ',',
        default_value = "http://localhost:*,http://127.0.0.1:*"
    )]
    pub allowed_origins: Vec<OriginPattern>,

    /// A file holding a bearer token (16 or more visible ASCII characters)
    /// that `GET /metrics` then requires as `Authorization: Bearer <token>`.
    /// Without it /metrics is open to anyone who can reach the server.
    #[arg(long, display_order = 34, env = "AMBLE_METRICS_TOKEN_FILE")]
    pub metrics_token_file: Option<PathBuf>,

    /// The hosts this server answers for (against DNS rebinding): every
    /// request (HTTP or WebSocket) whose `Host` is not one gets 421. Each
    /// entry is HOST (any port) or HOST:PORT; `*` allows any. Without the
    /// flag: on a loopback address, localhost, 127.0.0.1 and [::1]; on any
    /// other address, any host. Behind a proxy that passes the browser's
    /// `Host`, list the public name.
    #[arg(
        long,
        display_order = 64,
        env = "AMBLE_ALLOWED_HOSTS",
        value_delimiter = ',',
        value_name = "HOST"
    )]
    pub allowed_hosts: Vec<HostPattern>,
}

impl EdgeConfig {
    pub fn http_header_timeout(&self) -> Duration {
        Duration::from_millis(self.http_header_timeout_ms)
    }

    pub fn http_idle_timeout(&self) -> Duration {
        Duration::from_millis(self.http_idle_timeout_ms)
    }
}

/// Where the server listens: a host (an IP address or a name, resolved
/// when binding) and a port. `:PORT` alone means every interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListenAddr {
    host: String,
    port: u16,
}

impl ListenAddr {
    /// The address in the form `TcpListener::bind` takes (`[::1]:3000`).
    pub fn to_bind(&self) -> String {
        self.to_string()
    }
}

impl fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.host.parse::<IpAddr>() {
            Ok(IpAddr::V6(ip)) => write!(f, "[{ip}]:{}", self.port),
            _ => write!(f, "{}:{}", self.host, self.port),
        }
    }
}

impl FromStr for ListenAddr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        const FORM: &str = "expected HOST:PORT (127.0.0.1:3000, localhost:3000, [::1]:3000) \
                            or :PORT for every interface";
        let Some((host, port)) = s.rsplit_once(':') else {
            return Err(format!("no port: {FORM}"));
        };
        let port: u16 = port
            .parse()
            .map_err(|_| format!("{port:?} is not a port number (0-65535): {FORM}"))?;
        let host = if host.is_empty() {
            "0.0.0.0".to_owned()
        } else if let Some(v6) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
            v6.parse::<std::net::Ipv6Addr>()
                .map_err(|_| format!("{v6:?} is not an IPv6 address: {FORM}"))?
                .to_string()
        } else if host.parse::<IpAddr>().is_ok() {
            host.to_owned()
        } else if is_host_name(host) {
            host.to_ascii_lowercase()
        } else {
            return Err(format!(
                "{host:?} is neither an IP address nor a host name: {FORM}"
            ));
        };
        Ok(Self { host, port })
    }
}

/// A DNS host name (RFC 1123): dot-separated labels of letters, digits and
/// inner hyphens, at most 253 characters.
fn is_host_name(host: &str) -> bool {
    host.len() <= 253
        && host.split('.').all(|label| {
            (1..=63).contains(&label.len())
                && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
        // All digits and dots would be a mistyped IPv4 address, not a name.
        && !host.bytes().all(|b| b.is_ascii_digit() || b == b'.')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_takes_host_names_and_a_bare_port() {
        let parse = |s: &str| s.parse::<ListenAddr>().map(|a| a.to_bind());
        assert_eq!(parse("127.0.0.1:3000").as_deref(), Ok("127.0.0.1:3000"));
        assert_eq!(parse("localhost:3001").as_deref(), Ok("localhost:3001"));
        assert_eq!(parse(":3001").as_deref(), Ok("0.0.0.0:3001"));
        assert_eq!(parse("[::1]:3000").as_deref(), Ok("[::1]:3000"));
        assert_eq!(
            parse("Amble-1.example.org:80").as_deref(),
            Ok("amble-1.example.org:80")
        );
        for bad in [
            "garbage",
            "nowhere:",
            "host:99999",
            "1.2.3:80",
            "-bad-:1",
            "a b:1",
            "[zz]:1",
        ] {
            let err = parse(bad).expect_err(bad);
            assert!(err.contains("HOST:PORT"), "{bad}: {err}");
        }
    }
}
