//! Which `Host` a request may name (`--allowed-hosts`), against DNS
//! rebinding: a page on `evil.example` whose name is made to resolve to
//! this server's address would otherwise pass the same-host `Origin` rule
//! (its `Origin` and `Host` agree) and read amble like a local page.
//!
//! [`HostPattern`] is one entry of the flag; [`AllowedHosts`] is the rule a
//! server applies, built once from the flag and the address it listens on,
//! and [`AllowedHosts::admits`] is the pure decision. [`refusal`] is the
//! answer to a request it refuses.

use std::fmt;
use std::net::{IpAddr, Ipv6Addr};
use std::str::FromStr;

use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::response::Response;

/// One `--allowed-hosts` entry: `*`, or a host (a name, an IPv4 address,
/// an IPv6 address in brackets) with or without a port. Without a port it
/// allows the host on any port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HostPattern {
    /// `*`: any host.
    Any,
    /// A host, lowercased (IPv6 in its canonical form, in brackets), and
    /// the one port it may name, if any.
    Host { host: String, port: Option<u16> },
}

impl fmt::Display for HostPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Any => f.write_str("*"),
            Self::Host { host, port: None } => f.write_str(host),
            Self::Host {
                host,
                port: Some(port),
            } => write!(f, "{host}:{port}"),
        }
    }
}

impl FromStr for HostPattern {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        const FORM: &str = "expected HOST or HOST:PORT (amble.example.com, localhost:3000, \
                            [::1]:3000), or * for any host";
        let s = s.trim();
        if s == "*" {
            return Ok(Self::Any);
        }
        let (host, port) = split_authority(s).ok_or_else(|| format!("{s:?}: {FORM}"))?;
        if host.contains('*') {
            return Err(format!(
                "{s:?}: wildcards in a host are not supported, list each host: {FORM}"
            ));
        }
        Ok(Self::Host { host, port })
    }
}

/// `host[:port]` as a `Host` header or an entry writes it: the host
/// lowercased (an IPv6 address canonical, in brackets) and the port, or
/// `None` when it is not one.
fn split_authority(s: &str) -> Option<(String, Option<u16>)> {
    let parse_port = |p: &str| -> Option<u16> {
        (!p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
            .then(|| p.parse().ok())
            .flatten()
    };
    if let Some(rest) = s.strip_prefix('[') {
        let (ip, after) = rest.split_once(']')?;
        let ip: Ipv6Addr = ip.parse().ok()?;
        let port = match after {
            "" => None,
            _ => Some(parse_port(after.strip_prefix(':')?)?),
        };
        return Some((format!("[{ip}]"), port));
    }
    let (host, port) = match s.rsplit_once(':') {
        Some((host, port)) => (host, Some(parse_port(port)?)),
        None => (s, None),
    };
    let name_ok = !host.is_empty()
        && host.len() <= 253
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'*'));
    name_ok.then(|| (host.to_ascii_lowercase(), port))
}

/// The names a loopback server answers to by default.
const LOOPBACK_NAMES: [&str; 3] = ["localhost", "127.0.0.1", "[::1]"];

/// The `Host` rule a server applies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AllowedHosts {
    /// Any host: `*`, or no flag on a server that listens on an address
    /// other than loopback.
    Any,
    /// Only these.
    Only(Vec<HostPattern>),
}

impl AllowedHosts {
    /// The rule for `--allowed-hosts` (empty when not given) on a server
    /// listening on `local`: the flag's list; without it, on a loopback
    /// address, `localhost`, `127.0.0.1` and `[::1]` on any port (the only
    /// names a local page has; a rebinding page names its own), and any
    /// host otherwise.
    pub fn new(flag: &[HostPattern], local: IpAddr) -> Self {
        if flag.contains(&HostPattern::Any) {
            return Self::Any;
        }
        if !flag.is_empty() {
            return Self::Only(flag.to_vec());
        }
        if local.to_canonical().is_loopback() {
            return Self::Only(
                LOOPBACK_NAMES
                    .iter()
                    .map(|host| HostPattern::Host {
                        host: (*host).to_owned(),
                        port: None,
                    })
                    .collect(),
            );
        }
        Self::Any
    }

    /// Whether a request to `uri` with `headers` names an allowed host: the
    /// authority of an absolute-form target (RFC 9112 section 3.2.2), else
    /// every `Host` header. A request that names none (HTTP/1.0) is not a
    /// browser's and is let through; one that is not readable is refused.
    pub fn admits(&self, uri: &Uri, headers: &HeaderMap) -> bool {
        let Self::Only(list) = self else {
            return true;
        };
        let allowed = |value: &str| {
            split_authority(value).is_some_and(|(host, port)| {
                list.iter().any(|pattern| match pattern {
                    HostPattern::Any => true,
                    HostPattern::Host { host: h, port: p } => {
                        *h == host && (p.is_none() || *p == port)
                    }
                })
            })
        };
        if let Some(authority) = uri.authority() {
            return allowed(authority.as_str());
        }
        headers
            .get_all(header::HOST)
            .iter()
            .all(|value| value.to_str().is_ok_and(allowed))
    }

    /// The rule as `--allowed-hosts` would write it, for the refusal.
    fn describe(&self) -> String {
        match self {
            Self::Any => "*".to_owned(),
            Self::Only(list) => list
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(","),
        }
    }
}

/// The answer to a request whose `Host` is not allowed: 421 Misdirected
/// Request (RFC 9110 section 15.5.20: this server will not answer for that
/// name), a JSON error like the edge's other refusals, and the connection
/// closed.
pub fn refusal(rule: &AllowedHosts) -> Response {
    let message = format!(
        "this server does not answer for that Host (allowed: {}); \
         an operator can add it with --allowed-hosts",
        rule.describe()
    );
    let mut response = super::json_error(
        StatusCode::MISDIRECTED_REQUEST,
        "host_not_allowed",
        &message,
    );
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(entries: &[&str]) -> Vec<HostPattern> {
        entries.iter().map(|e| e.parse().expect(e)).collect()
    }

    fn with_host(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(header::HOST, HeaderValue::from_str(v).expect("value"));
        }
        h
    }

    fn admits(rule: &AllowedHosts, hosts: &[&str]) -> bool {
        rule.admits(&Uri::from_static("/ws"), &with_host(hosts))
    }

    const LOOPBACK: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

    #[test]
    fn entries_parse_or_say_why_not() {
        assert_eq!(list(&["*"]), [HostPattern::Any]);
        assert_eq!(
            list(&[
                "Amble.Example.com",
                "localhost:3000",
                "[0:0::1]:80",
                "10.0.0.1"
            ]),
            [
                HostPattern::Host {
                    host: "amble.example.com".into(),
                    port: None
                },
                HostPattern::Host {
                    host: "localhost".into(),
                    port: Some(3000)
                },
                HostPattern::Host {
                    host: "[::1]".into(),
                    port: Some(80)
                },
                HostPattern::Host {
                    host: "10.0.0.1".into(),
                    port: None
                },
            ]
        );
        for bad in [
            "",
            "a b",
            "host:",
            "host:99999",
            "[zz]",
            "[::1",
            "*.example.com",
            "::1",
        ] {
            let err = bad.parse::<HostPattern>().expect_err(bad);
            assert!(err.contains("HOST"), "{bad}: {err}");
        }
    }

    #[test]
    fn a_loopback_server_answers_to_local_names_only_by_default() {
        let rule = AllowedHosts::new(&[], LOOPBACK);
        for ok in [
            "localhost",
            "localhost:3000",
            "LOCALHOST:8080",
            "127.0.0.1",
            "127.0.0.1:3000",
            "[::1]",
            "[::1]:3000",
            "[0::1]:3000",
        ] {
            assert!(admits(&rule, &[ok]), "{ok}");
        }
        for refused in [
            "evil.example",
            "evil.example:3000",
            "localhost.",
            "127.0.0.2:3000",
            "localhost.evil.example",
            "localhost:",
            "",
            "[::1]x",
        ] {
            assert!(!admits(&rule, &[refused]), "{refused}");
        }
        // Every Host line counts; none at all is not a browser's request.
        assert!(!admits(&rule, &["localhost", "evil.example"]));
        assert!(admits(&rule, &[]));
        // An absolute-form target's authority is the host named.
        let absolute = Uri::from_static("http://evil.example/ws");
        assert!(!rule.admits(&absolute, &with_host(&["localhost"])));
        let mut bytes = HeaderMap::new();
        bytes.insert(
            header::HOST,
            HeaderValue::from_bytes(b"localhost\xff").expect("value"),
        );
        assert!(!rule.admits(&Uri::from_static("/"), &bytes));
        let v6 = AllowedHosts::new(&[], "::1".parse().expect("ip"));
        assert_eq!(v6, rule);
    }

    #[test]
    fn elsewhere_any_host_unless_listed() {
        let anywhere: IpAddr = "0.0.0.0".parse().expect("ip");
        assert_eq!(AllowedHosts::new(&[], anywhere), AllowedHosts::Any);
        assert!(admits(&AllowedHosts::new(&[], anywhere), &["evil.example"]));
        let listed = AllowedHosts::new(&list(&["amble.example.com", "localhost:3001"]), anywhere);
        assert!(admits(&listed, &["amble.example.com"]));
        assert!(admits(&listed, &["AMBLE.example.com:443"]));
        assert!(admits(&listed, &["localhost:3001"]));
        assert!(!admits(&listed, &["localhost:3000"]));
        assert!(!admits(&listed, &["127.0.0.1:3001"]));
        // A list replaces the loopback default; `*` allows any.
        let on_loopback = AllowedHosts::new(&list(&["amble.example.com"]), LOOPBACK);
        assert!(!admits(&on_loopback, &["localhost"]));
        let star = AllowedHosts::new(&list(&["localhost", "*"]), LOOPBACK);
        assert_eq!(star, AllowedHosts::Any);
        assert!(admits(&star, &["evil.example"]));
    }

    #[test]
    fn the_refusal_is_421_json_and_closes() {
        let rule = AllowedHosts::new(&[], LOOPBACK);
        let response = refusal(&rule);
        assert_eq!(response.status(), StatusCode::MISDIRECTED_REQUEST);
        assert_eq!(response.headers()[header::CONNECTION], "close");
        assert!(rule.describe().contains("localhost,127.0.0.1,[::1]"));
    }
}
