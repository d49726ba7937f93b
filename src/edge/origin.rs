//! Which web pages may open a WebSocket: the `Origin` check.
//!
//! A browser sends `Origin` with every WebSocket handshake and a page cannot
//! change it, so refusing foreign origins stops a page on another site from
//! using a visitor's browser to join rooms and read them. It is not
//! authentication: a client that is not a browser sends whatever it likes
//! (or nothing), which is why a request without `Origin` is let through.
//!
//! Pure functions over strings: no I/O, no configuration lookups.

use std::fmt;
use std::str::FromStr;

/// One entry of `--allowed-origins`: `*`, an exact origin such as
/// `https://app.example.com`, or an origin with any port, such as
/// `http://localhost:*`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OriginPattern {
    /// `*`: every page.
    Any,
    /// Exactly this origin.
    Exact(Origin),
    /// This scheme and host on any port.
    AnyPort { scheme: String, host: String },
}

/// A serialised origin (RFC 6454 section 6.2): scheme, host and port, with
/// the scheme and host in lower case and the port filled in for http (80)
/// and https (443) when it is left out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Origin {
    pub scheme: String,
    pub host: String,
    pub port: Option<u16>,
}

/// Why an `--allowed-origins` entry (or an `Origin` header) is not an origin.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OriginError {
    /// No `scheme://` in front.
    #[error("an origin starts with a scheme, as in https://app.example.com")]
    NoScheme,
    /// The scheme has characters RFC 3986 does not allow.
    #[error("the scheme must be letters, digits, '+', '-' or '.', starting with a letter")]
    BadScheme,
    /// A path, query or fragment after the host.
    #[error(
        "an origin has no path, query or fragment (not even a trailing '/'): write scheme://host[:port]"
    )]
    HasPath,
    /// `user@` before the host.
    #[error("an origin has no user name or password")]
    HasUserInfo,
    /// Nothing between `://` and the port.
    #[error("the host is missing")]
    NoHost,
    /// Characters that no host name has, or a wildcard in the host.
    #[error(
        "the host must be a DNS name, an IPv4 address or a bracketed IPv6 address; a host wildcard such as *.example.com is not supported, list each origin"
    )]
    BadHost,
    /// A port that is not a number from 0 to 65535 (or `*` in a pattern).
    #[error("the port must be a number from 0 to 65535, or '*' for any port")]
    BadPort,
}

/// The schemes whose default port an origin may leave out.
fn default_port(scheme: &str) -> Option<u16> {
    match scheme {
        "http" | "ws" => Some(80),
        "https" | "wss" => Some(443),
        _ => None,
    }
}

/// The port part of `scheme://host[:port]`, before it is a number.
enum PortText<'a> {
    Absent,
    Wildcard,
    Number(&'a str),
}

/// Splits and checks `scheme://host[:port]`, lower-casing scheme and host.
fn split(text: &str) -> Result<(String, String, PortText<'_>), OriginError> {
    let (scheme, authority) = text.split_once("://").ok_or(OriginError::NoScheme)?;
    let mut chars = scheme.chars();
    if !chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        || !chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
    {
        return Err(OriginError::BadScheme);
    }
    if authority.contains(['/', '?', '#']) {
        return Err(OriginError::HasPath);
    }
    if authority.contains('@') {
        return Err(OriginError::HasUserInfo);
    }
    let (host, port) = split_host_port(authority)?;
    if host.is_empty() {
        return Err(OriginError::NoHost);
    }
    if !is_host(host) {
        return Err(OriginError::BadHost);
    }
    Ok((scheme.to_ascii_lowercase(), host.to_ascii_lowercase(), port))
}

/// `host[:port]`, where host may be a bracketed IPv6 address.
fn split_host_port(authority: &str) -> Result<(&str, PortText<'_>), OriginError> {
    let (host, rest) = if authority.starts_with('[') {
        let end = authority.find(']').ok_or(OriginError::BadHost)?;
        authority.split_at(end + 1)
    } else {
        match authority.find(':') {
            Some(i) => authority.split_at(i),
            None => (authority, ""),
        }
    };
    let port = match rest {
        "" => PortText::Absent,
        ":*" => PortText::Wildcard,
        _ => match rest.strip_prefix(':') {
            Some(digits) if !digits.is_empty() && digits.len() <= 5 => PortText::Number(digits),
            _ => return Err(OriginError::BadPort),
        },
    };
    Ok((host, port))
}

fn is_host(host: &str) -> bool {
    if let Some(inner) = host.strip_prefix('[') {
        let Some(inner) = inner.strip_suffix(']') else {
            return false;
        };
        return inner.parse::<std::net::Ipv6Addr>().is_ok();
    }
    host.bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
}

fn port_number(digits: &str) -> Result<u16, OriginError> {
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(OriginError::BadPort);
    }
    digits.parse().map_err(|_| OriginError::BadPort)
}

impl FromStr for Origin {
    type Err = OriginError;

    /// Parses `scheme://host[:port]`; `*` is not a port here.
    fn from_str(text: &str) -> Result<Self, OriginError> {
        let (scheme, host, port) = split(text)?;
        let port = match port {
            PortText::Absent => default_port(&scheme),
            PortText::Wildcard => return Err(OriginError::BadPort),
            PortText::Number(digits) => Some(port_number(digits)?),
        };
        Ok(Self { scheme, host, port })
    }
}

impl FromStr for OriginPattern {
    type Err = OriginError;

    fn from_str(text: &str) -> Result<Self, OriginError> {
        let text = text.trim();
        if text == "*" {
            return Ok(Self::Any);
        }
        let (scheme, host, port) = split(text)?;
        Ok(match port {
            PortText::Wildcard => Self::AnyPort { scheme, host },
            PortText::Absent => Self::Exact(Origin {
                port: default_port(&scheme),
                scheme,
                host,
            }),
            PortText::Number(digits) => Self::Exact(Origin {
                port: Some(port_number(digits)?),
                scheme,
                host,
            }),
        })
    }
}

impl fmt::Display for OriginPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Any => f.write_str("*"),
            Self::AnyPort { scheme, host } => write!(f, "{scheme}://{host}:*"),
            Self::Exact(o) => match o.port {
                Some(port) if Some(port) != default_port(&o.scheme) => {
                    write!(f, "{}://{}:{port}", o.scheme, o.host)
                }
                _ => write!(f, "{}://{}", o.scheme, o.host),
            },
        }
    }
}

impl OriginPattern {
    fn matches(&self, origin: &Origin) -> bool {
        match self {
            Self::Any => true,
            Self::Exact(allowed) => allowed == origin,
            Self::AnyPort { scheme, host } => *scheme == origin.scheme && *host == origin.host,
        }
    }
}

/// Whether a handshake may go ahead, given its `Origin` header (`None`
/// when there is none), its `Host` header and the allowed patterns.
///
/// Admitted: no `Origin` at all (not a browser); an http or https origin
/// on the request's own host and port (a page amble serves itself, or one
/// served through the same proxy); an origin one of `allowed` matches.
/// Everything else is refused, including `null` (sandboxed frames, files)
/// and anything that does not parse.
pub fn admits(origin: Option<&str>, host: &str, allowed: &[OriginPattern]) -> bool {
    let Some(origin) = origin else {
        return true;
    };
    if allowed.contains(&OriginPattern::Any) {
        return true;
    }
    let Ok(origin) = origin.parse::<Origin>() else {
        return false;
    };
    is_same_host(&origin, host) || allowed.iter().any(|p| p.matches(&origin))
}

/// Whether an http(s) `origin` names the host and port in `host` (a `Host`
/// header). A `Host` without a port means the default port of whichever of
/// http and https the origin uses: behind a TLS proxy amble cannot tell.
fn is_same_host(origin: &Origin, host: &str) -> bool {
    if origin.scheme != "http" && origin.scheme != "https" {
        return false;
    }
    let Ok((name, port)) = split_host_port(host) else {
        return false;
    };
    let port = match port {
        PortText::Absent => default_port(&origin.scheme),
        PortText::Number(digits) => port_number(digits).ok(),
        PortText::Wildcard => None,
    };
    port.is_some() && port == origin.port && name.eq_ignore_ascii_case(&origin.host)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn patterns(list: &[&str]) -> Vec<OriginPattern> {
        list.iter()
            .map(|p| p.parse().expect("a valid pattern"))
            .collect()
    }

    fn defaults() -> Vec<OriginPattern> {
        patterns(&["http://localhost:*", "http://127.0.0.1:*"])
    }

    #[test]
    fn no_origin_is_not_a_browser_and_is_admitted() {
        assert!(admits(None, "amble.example.com", &[]));
        assert!(admits(None, "", &[]));
    }

    #[test]
    fn a_page_on_the_same_host_is_admitted() {
        let none = [];
        for (origin, host) in [
            ("https://amble.example.com", "amble.example.com"),
            ("http://amble.example.com", "amble.example.com"),
            ("https://amble.example.com", "amble.example.com:443"),
            ("https://amble.example.com:443", "amble.example.com"),
            ("http://10.0.0.5:3000", "10.0.0.5:3000"),
            ("http://AMBLE.example.com:3000", "amble.EXAMPLE.com:3000"),
            ("http://[::1]:3000", "[::1]:3000"),
        ] {
            assert!(admits(Some(origin), host, &none), "{origin} on {host}");
        }
        for (origin, host) in [
            ("http://amble.example.com:3001", "amble.example.com:3000"),
            ("https://amble.example.com", "amble.example.com:3000"),
            ("http://amble.example.com", "amble.example.com:443"),
            ("https://amble.example.com.evil.net", "amble.example.com"),
            ("https://example.com", "amble.example.com"),
            ("ftp://amble.example.com", "amble.example.com"),
            ("http://amble.example.com", "amble.example.com:x"),
            ("http://amble.example.com", ""),
        ] {
            assert!(!admits(Some(origin), host, &none), "{origin} on {host}");
        }
    }

    #[test]
    fn the_default_list_admits_local_development_on_any_port() {
        let allowed = defaults();
        for origin in [
            "http://localhost:5173",
            "http://localhost",
            "http://127.0.0.1:8080",
            "http://LOCALHOST:1",
        ] {
            assert!(
                admits(Some(origin), "amble.example.com", &allowed),
                "{origin}"
            );
        }
        for origin in [
            "https://localhost:5173",
            "http://localhost.evil.net",
            "http://127.0.0.2:80",
            "https://evil.example",
            "null",
            "",
            "localhost:3000",
            "http://localhost:3000/",
        ] {
            assert!(
                !admits(Some(origin), "amble.example.com", &allowed),
                "{origin}"
            );
        }
    }

    #[test]
    fn exact_entries_match_the_origin_and_its_default_port_only() {
        let allowed = patterns(&["https://app.example.com", "http://app.example.com:8080"]);
        let host = "amble.example.com";
        for origin in [
            "https://app.example.com",
            "https://app.example.com:443",
            "http://app.example.com:8080",
        ] {
            assert!(admits(Some(origin), host, &allowed), "{origin}");
        }
        for origin in [
            "http://app.example.com",
            "https://app.example.com:8443",
            "https://www.app.example.com",
            "http://localhost:3000",
        ] {
            assert!(!admits(Some(origin), host, &allowed), "{origin}");
        }
    }

    #[test]
    fn a_star_admits_every_page() {
        let allowed = patterns(&["*"]);
        for origin in ["https://evil.example", "null", "garbage"] {
            assert!(admits(Some(origin), "amble.example.com", &allowed));
        }
    }

    #[test]
    fn malformed_entries_are_refused_with_a_reason() {
        for (entry, why) in [
            ("app.example.com", OriginError::NoScheme),
            ("1http://app.example.com", OriginError::BadScheme),
            ("https://app.example.com/", OriginError::HasPath),
            ("https://app.example.com/path", OriginError::HasPath),
            ("https://user@app.example.com", OriginError::HasUserInfo),
            ("https://", OriginError::NoHost),
            ("https://:8080", OriginError::NoHost),
            ("https://*.example.com", OriginError::BadHost),
            ("https://app example.com", OriginError::BadHost),
            ("http://[::1", OriginError::BadHost),
            ("http://[nonsense]:80", OriginError::BadHost),
            ("http://localhost:", OriginError::BadPort),
            ("http://localhost:65536", OriginError::BadPort),
            ("http://localhost:+80", OriginError::BadPort),
            ("http://localhost:8*", OriginError::BadPort),
        ] {
            assert_eq!(entry.parse::<OriginPattern>(), Err(why), "{entry}");
        }
        assert!(
            OriginError::HasPath.to_string().contains("trailing '/'"),
            "the message says what to fix"
        );
    }

    #[test]
    fn patterns_print_as_written() {
        for entry in [
            "*",
            "https://app.example.com",
            "http://localhost:*",
            "http://app.example.com:8080",
            "http://[::1]:*",
            "capacitor://localhost",
        ] {
            let parsed: OriginPattern = entry.parse().expect("valid");
            assert_eq!(parsed.to_string(), entry);
        }
        let https: OriginPattern = "HTTPS://App.Example.com:443".parse().expect("valid");
        assert_eq!(https.to_string(), "https://app.example.com");
    }

    use proptest::prelude::*;

    proptest! {
        #[test]
        fn never_panics_on_arbitrary_headers(origin in ".{0,64}", host in ".{0,64}") {
            let _ = admits(Some(&origin), &host, &defaults());
            let _ = origin.parse::<OriginPattern>();
        }

        #[test]
        fn a_page_on_the_host_it_names_is_admitted(
            host in "[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?(\\.[a-z0-9]{1,10}){0,3}",
            port in 1u16..u16::MAX,
            https in any::<bool>(),
        ) {
            let scheme = if https { "https" } else { "http" };
            let origin = format!("{scheme}://{host}:{port}");
            let host_header = format!("{host}:{port}");
            prop_assert!(admits(Some(&origin), &host_header, &[]));
            let other_port = format!("{host}:{}", port + 1);
            prop_assert!(!admits(Some(&origin), &other_port, &[]));
        }

        #[test]
        fn a_pattern_reads_back_as_it_prints(
            host in "[a-z][a-z0-9.-]{0,20}",
            port in proptest::option::of(0u16..),
            any_port in any::<bool>(),
        ) {
            let text = match (any_port, port) {
                (true, _) => format!("http://{host}:*"),
                (false, Some(port)) => format!("https://{host}:{port}"),
                (false, None) => format!("https://{host}"),
            };
            let pattern: OriginPattern = text.parse().expect("valid");
            let again: OriginPattern = pattern.to_string().parse().expect("valid");
            prop_assert_eq!(again, pattern);
        }
    }

    #[test]
    fn other_schemes_compare_exactly() {
        let allowed = patterns(&["capacitor://localhost"]);
        assert!(admits(Some("capacitor://localhost"), "h", &allowed));
        assert!(!admits(Some("capacitor://localhost:1"), "h", &allowed));
        assert!(!admits(Some("http://localhost"), "h", &allowed));
    }
}
