//! Client addresses: who is behind a socket, and what one address may hold.
//!
//! [`resolve`] names the client of a request: the TCP peer, or, when the
//! peer is a trusted reverse proxy, the first hop of the forwarding header,
//! read from the right, that is not a trusted proxy; a hop that cannot be
//! read there is an unknown client, limited like any other. It is a pure
//! function. [`Addresses`] keeps, per client address, its open
//! sockets (capped) and one join budget shared by all of them, in one
//! bounded table: an entry lives while its address has a socket open or
//! its join budget is still refilling.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::HeaderMap;
use ipnet::IpNet;
use tokio::time::Instant;

use crate::access::throttle::{Admit, Gcra};
use crate::metrics::Metrics;

/// What one client address may hold (`--max-connections-per-ip`, the join
/// budget), and whose forwarding headers name the client.
#[derive(Clone, Debug, clap::Args)]
pub struct AddressConfig {
    /// Most open connections (HTTP and WebSocket) from one client address
    /// (IPv6: one /64 network); more are refused with 429.
    #[arg(long, display_order = 27, env = "AMBLE_MAX_CONNECTIONS_PER_IP", default_value_t = 256,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections_per_ip: u32,

    /// Joins one client address may make across all its sockets: one per
    /// this many milliseconds...
    #[arg(long, display_order = 28, env = "AMBLE_IP_JOIN_INTERVAL_MS", default_value_t = 250,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub ip_join_interval_ms: u32,

    /// ...after a burst of this many.
    #[arg(long, display_order = 29, env = "AMBLE_IP_JOIN_BURST", default_value_t = 30,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub ip_join_burst: u32,

    /// Reverse proxies (CIDR list, e.g. `10.0.0.0/8,::1/128`) whose
    /// forwarding header names the client. Other peers are the client.
    #[arg(
        long,
        display_order = 30,
        env = "AMBLE_TRUSTED_PROXIES",
        value_delimiter = ','
    )]
    pub trusted_proxies: Vec<ipnet::IpNet>,

    /// The header the trusted proxies append the client address to (the
    /// other one is ignored, since a client could have written it).
    #[arg(long, display_order = 31, env = "AMBLE_FORWARDED_HEADER", value_enum,
          default_value_t = ForwardedHeader::XForwardedFor)]
    pub forwarded_header: ForwardedHeader,

    /// Exempt loopback clients (127.0.0.0/8, ::1) from the per-address
    /// limits, so a local load test or proxy is not throttled. A switch:
    /// alone it is on; a value may be 1/0, yes/no, true/false, on/off.
    #[arg(long, display_order = 32, env = "AMBLE_EXEMPT_LOOPBACK", default_value_t = true,
          value_parser = clap::builder::BoolishValueParser::new(), value_name = "BOOL",
          hide_possible_values = true,
          action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub exempt_loopback: bool,
}

/// Where a trusted proxy writes the client address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ForwardedHeader {
    /// `X-Forwarded-For: client, proxy1, ...` (nginx, Caddy, HAProxy, cloud load balancers).
    XForwardedFor,
    /// `Forwarded: for=client, for=proxy1` (RFC 7239).
    Forwarded,
}

/// Who a request's client is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ClientId {
    /// A client known by its address: the peer, or the hop a trusted
    /// proxy forwarded.
    Address(IpAddr),
    /// A client behind the trusted proxy `behind` whose hop could not be
    /// read (garbage, `unknown`, an obfuscated name, too many hops). Every
    /// such client of one proxy shares one place in the table: never
    /// exempt, always limited.
    UnknownBehind(IpAddr),
}

impl std::fmt::Display for ClientId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Address(ip) => write!(f, "{ip}"),
            Self::UnknownBehind(proxy) => write!(f, "unknown behind {proxy}"),
        }
    }
}

/// Why a hop of a forwarding header could not be read: the label of
/// `amble_forwarded_unreadable_total{reason="..."}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unreadable {
    /// Not an address, not `unknown`, not an obfuscated name (also an
    /// empty element, a header line that is not text, a `Forwarded`
    /// element without `for=`).
    Garbage,
    /// `unknown` (RFC 7239 section 6.2; some proxies write it in
    /// `X-Forwarded-For` too).
    Unknown,
    /// An obfuscated identifier such as `_hidden` (RFC 7239 section 6.3).
    Obfuscated,
    /// More than [`MAX_HOPS`] trusted proxies in a row.
    TooManyHops,
}

impl Unreadable {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Self::Garbage => "garbage",
            Self::Unknown => "unknown",
            Self::Obfuscated => "obfuscated",
            Self::TooManyHops => "too_many_hops",
        }
    }
}

/// What a request's client was resolved to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Resolved {
    pub client: ClientId,
    /// Why the client is unknown, when it is.
    pub unreadable: Option<Unreadable>,
}

impl Resolved {
    fn known(ip: IpAddr) -> Self {
        Self {
            client: ClientId::Address(ip),
            unreadable: None,
        }
    }

    fn unknown(behind: IpAddr, why: Unreadable) -> Self {
        Self {
            client: ClientId::UnknownBehind(behind),
            unreadable: Some(why),
        }
    }
}

/// The most trusted hops read from the right before the client is given
/// up as unknown: real chains have one to three.
pub const MAX_HOPS: usize = 16;

/// One element of a forwarding header, read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Hop {
    Address(IpAddr),
    Unreadable(Unreadable),
}

/// Names the client of a request from `peer`. Only when `peer` is in
/// `trusted` is `header` read; all its lines are one list. The list is read
/// from the right (the hop nearest to us), only as far as trusted proxies
/// go: a hop that is a trusted proxy is skipped, the first that is not is
/// the client. A hop that cannot be read there (garbage, `unknown`, an
/// obfuscated name), or more than [`MAX_HOPS`] trusted hops, makes the
/// client [`ClientId::UnknownBehind`] the last trusted hop read (the peer
/// when it is the rightmost): limited, never exempt. A list of trusted
/// hops only names its leftmost as the client; no header names the peer.
pub fn resolve(
    peer: IpAddr,
    headers: &HeaderMap,
    trusted: &[IpNet],
    header: ForwardedHeader,
) -> Resolved {
    let peer = peer.to_canonical();
    let is_trusted = |ip: &IpAddr| trusted.iter().any(|net| net.contains(ip));
    if !is_trusted(&peer) {
        return Resolved::known(peer);
    }
    let name = match header {
        ForwardedHeader::XForwardedFor => "x-forwarded-for",
        ForwardedHeader::Forwarded => "forwarded",
    };
    // The lines from the last, each line's elements from its last: the
    // whole list from the right, lazily.
    let hops =
        headers
            .get_all(name)
            .iter()
            .rev()
            .flat_map(|line| -> Box<dyn Iterator<Item = Hop> + '_> {
                match line.to_str() {
                    Err(_) => Box::new(std::iter::once(Hop::Unreadable(Unreadable::Garbage))),
                    Ok(line) => match header {
                        ForwardedHeader::XForwardedFor => {
                            Box::new(line.rsplit(',').map(|e| read_node(e.trim())))
                        }
                        ForwardedHeader::Forwarded => {
                            Box::new(split_quoted(line, ',').into_iter().rev().map(forwarded_for))
                        }
                    },
                }
            });
    let mut nearest = peer;
    for (read, hop) in hops.enumerate() {
        if read == MAX_HOPS {
            return Resolved::unknown(nearest, Unreadable::TooManyHops);
        }
        match hop {
            Hop::Unreadable(why) => return Resolved::unknown(nearest, why),
            Hop::Address(ip) => {
                let ip = ip.to_canonical();
                if !is_trusted(&ip) {
                    return Resolved::known(ip);
                }
                nearest = ip;
            }
        }
    }
    // Every hop (if any) a proxy of ours: the leftmost is the client.
    Resolved::known(nearest)
}

/// Splits `s` at every `sep` outside a quoted string (RFC 9110 section
/// 5.6.4: `"..."` with `\` escapes).
fn split_quoted(s: &str, sep: char) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut start, mut quoted, mut escaped) = (0, false, false);
    for (i, c) in s.char_indices() {
        if escaped {
            escaped = false;
        } else if quoted && c == '\\' {
            escaped = true;
        } else if c == '"' {
            quoted = !quoted;
        } else if c == sep && !quoted {
            parts.push(&s[start..i]);
            start = i + c.len_utf8();
        }
    }
    parts.push(&s[start..]);
    parts
}

/// The `for=` node of one `Forwarded` element (RFC 7239 section 4).
fn forwarded_for(element: &str) -> Hop {
    let value = split_quoted(element, ';').into_iter().find_map(|pair| {
        let (name, value) = pair.split_once('=')?;
        name.trim()
            .eq_ignore_ascii_case("for")
            .then(|| value.trim())
    });
    let Some(value) = value else {
        return Hop::Unreadable(Unreadable::Garbage);
    };
    let value = match value.strip_prefix('"') {
        Some(quoted) => match quoted.strip_suffix('"') {
            Some(inner) if !inner.contains(['"', '\\']) => inner,
            _ => return Hop::Unreadable(Unreadable::Garbage),
        },
        None => value,
    };
    read_node(value)
}

/// One node: an address (`192.0.2.1`, `192.0.2.1:4711`, `2001:db8::1`,
/// `[2001:db8::1]`, `[2001:db8::1]:4711`), `unknown`, or an obfuscated
/// name (`_hidden`, `_hidden:_port`).
fn read_node(node: &str) -> Hop {
    if let Some(ip) = parse_node(node) {
        return Hop::Address(ip);
    }
    let name = node.split_once(':').map_or(node, |(name, _)| name);
    if name.eq_ignore_ascii_case("unknown") {
        return Hop::Unreadable(Unreadable::Unknown);
    }
    let obfuscated = name.len() > 1
        && name.starts_with('_')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    Hop::Unreadable(if obfuscated {
        Unreadable::Obfuscated
    } else {
        Unreadable::Garbage
    })
}

/// `192.0.2.1`, `192.0.2.1:4711`, `2001:db8::1`, `[2001:db8::1]` or
/// `[2001:db8::1]:4711`.
fn parse_node(node: &str) -> Option<IpAddr> {
    if let Ok(ip) = node.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Some(rest) = node.strip_prefix('[') {
        let (ip, after) = rest.split_once(']')?;
        let port_ok = after.is_empty() || after.strip_prefix(':').is_some_and(is_port);
        return port_ok.then(|| ip.parse::<Ipv6Addr>().ok().map(IpAddr::V6))?;
    }
    let (ip, port) = node.split_once(':')?;
    if !is_port(port) {
        return None;
    }
    ip.parse::<std::net::Ipv4Addr>().ok().map(IpAddr::V4)
}

fn is_port(port: &str) -> bool {
    !port.is_empty() && port.len() <= 5 && port.bytes().all(|b| b.is_ascii_digit())
}

/// Under what a client is counted: an IPv4 address as is, an IPv6
/// address by its /64 network (what one subscriber is usually given), and
/// every unknown client behind one proxy together.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AddressKey {
    Address(IpAddr),
    UnknownBehind(IpAddr),
}

impl AddressKey {
    pub fn of(ip: IpAddr) -> Self {
        match ip.to_canonical() {
            IpAddr::V4(v4) => Self::Address(IpAddr::V4(v4)),
            IpAddr::V6(v6) => {
                let network = u128::from(v6) & !((1u128 << 64) - 1);
                Self::Address(IpAddr::V6(Ipv6Addr::from(network)))
            }
        }
    }

    pub fn of_client(client: ClientId) -> Self {
        match client {
            ClientId::Address(ip) => Self::of(ip),
            ClientId::UnknownBehind(proxy) => Self::UnknownBehind(proxy.to_canonical()),
        }
    }
}

/// Why an address was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The address has `--max-connections-per-ip` sockets open.
    #[error("too many connections from your address (the limit is {0})")]
    TooManyConnections(u32),
}

/// One client's standing: its address, and (unless it is exempt) its
/// place in the table, held for as long as this value lives.
#[derive(Debug)]
pub struct Client {
    pub who: ClientId,
    _lease: Option<Lease>,
}

/// One socket's place under its address's cap; dropping it frees it.
#[derive(Debug)]
pub struct Lease {
    addresses: Arc<Addresses>,
    key: AddressKey,
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.addresses.release(self.key);
    }
}

struct Entry {
    open: u32,
    joins: Gcra,
}

struct Table {
    entries: HashMap<AddressKey, Entry>,
    /// Sweep resting entries when the table reaches this size.
    sweep_at: usize,
}

/// Per-address sockets and join budgets.
pub struct Addresses {
    trusted: Vec<IpNet>,
    header: ForwardedHeader,
    exempt_loopback: bool,
    max_open: u32,
    join_interval: Duration,
    join_burst: u32,
    /// The table never holds more entries than this.
    bound: usize,
    table: Mutex<Table>,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for Addresses {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Addresses").finish_non_exhaustive()
    }
}

/// The table is swept of resting entries no more often than this size.
const SWEEP_FLOOR: usize = 1_024;

impl Addresses {
    /// `sockets` is the most sockets the server may hold at once; the
    /// table holds at most twice as many addresses.
    pub fn new(config: &AddressConfig, sockets: usize, metrics: Arc<Metrics>) -> Arc<Self> {
        Arc::new(Self {
            trusted: config.trusted_proxies.clone(),
            header: config.forwarded_header,
            exempt_loopback: config.exempt_loopback,
            max_open: config.max_connections_per_ip,
            join_interval: Duration::from_millis(u64::from(config.ip_join_interval_ms)),
            join_burst: config.ip_join_burst,
            bound: sockets.saturating_mul(2).max(SWEEP_FLOOR),
            table: Mutex::new(Table {
                entries: HashMap::new(),
                sweep_at: SWEEP_FLOOR,
            }),
            metrics,
        })
    }

    fn is_trusted(&self, ip: IpAddr) -> bool {
        self.trusted
            .iter()
            .any(|net| net.contains(&ip.to_canonical()))
    }

    /// Only a known loopback client is exempt, never an unknown one
    /// behind a loopback proxy.
    fn is_exempt(&self, client: ClientId) -> bool {
        match client {
            ClientId::Address(ip) => self.exempt_loopback && ip.to_canonical().is_loopback(),
            ClientId::UnknownBehind(_) => false,
        }
    }

    /// Admits a socket from `peer` at accept. A trusted proxy is not
    /// counted here (its clients are, at the upgrade); any other peer is
    /// the client and takes a place under its address's cap.
    pub fn admit_peer(self: &Arc<Self>, peer: IpAddr) -> Result<Option<Lease>, Refusal> {
        if self.is_trusted(peer) {
            return Ok(None);
        }
        self.lease(ClientId::Address(peer))
    }

    /// The client of a WebSocket upgrade from `peer`. Behind a trusted
    /// proxy the forwarded address takes its own place under the cap (the
    /// socket's own peer was not counted); otherwise the socket's lease
    /// from accept already counts it.
    /// Who sent a request from `peer` (for logs): the forwarded client
    /// when `peer` is a trusted proxy, else the peer.
    pub fn client_of(&self, peer: IpAddr, headers: &HeaderMap) -> ClientId {
        resolve(peer, headers, &self.trusted, self.header).client
    }

    pub fn admit_upgrade(
        self: &Arc<Self>,
        peer: IpAddr,
        headers: &HeaderMap,
    ) -> Result<Client, Refusal> {
        let resolved = resolve(peer, headers, &self.trusted, self.header);
        if let Some(why) = resolved.unreadable {
            self.metrics.forwarded_unreadable(why.label());
        }
        if !self.is_trusted(peer) {
            return Ok(Client {
                who: resolved.client,
                _lease: None,
            });
        }
        let lease = self.lease(resolved.client)?;
        Ok(Client {
            who: resolved.client,
            _lease: lease,
        })
    }

    /// A place under `client`'s cap, or `None` when it is exempt.
    fn lease(self: &Arc<Self>, client: ClientId) -> Result<Option<Lease>, Refusal> {
        if self.is_exempt(client) {
            return Ok(None);
        }
        let key = AddressKey::of_client(client);
        let now = Instant::now();
        let mut table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        if !table.entries.contains_key(&key) {
            self.make_room(&mut table, now);
        }
        let entry = table.entries.entry(key).or_insert_with(|| Entry {
            open: 0,
            joins: Gcra::new(self.join_interval, self.join_burst),
        });
        if entry.open >= self.max_open {
            self.metrics.address_refused("connections");
            return Err(Refusal::TooManyConnections(self.max_open));
        }
        entry.open += 1;
        Ok(Some(Lease {
            addresses: Arc::clone(self),
            key,
        }))
    }

    /// Before a new entry: sweep entries that hold nothing (no socket, a
    /// rested budget) once the table has grown; at the bound, forget the
    /// budgets of addresses with no socket open too.
    fn make_room(&self, table: &mut Table, now: Instant) {
        if table.entries.len() < table.sweep_at {
            return;
        }
        table
            .entries
            .retain(|_, e| e.open > 0 || !e.joins.is_rested(now));
        if table.entries.len() >= self.bound {
            table.entries.retain(|_, e| e.open > 0);
        }
        table.sweep_at = (table.entries.len() * 2).clamp(SWEEP_FLOOR, self.bound);
    }

    fn release(&self, key: AddressKey) {
        let now = Instant::now();
        let mut table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(entry) = table.entries.get_mut(&key) {
            entry.open = entry.open.saturating_sub(1);
            if entry.open == 0 && entry.joins.is_rested(now) {
                table.entries.remove(&key);
            }
        }
    }

    /// Takes one join from `client`'s address budget, or says when the
    /// next one is allowed. Exempt clients always may.
    pub fn admit_join(&self, client: &Client, now: Instant) -> Result<(), Instant> {
        if self.is_exempt(client.who) {
            return Ok(());
        }
        let key = AddressKey::of_client(client.who);
        let mut table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        // A client's socket holds a lease, so its entry is there; should it
        // not be, the join is let through rather than growing the table.
        let Some(entry) = table.entries.get_mut(&key) else {
            return Ok(());
        };
        match entry.joins.admit(now) {
            Admit::Now => Ok(()),
            Admit::At(at) => {
                self.metrics.address_refused("joins");
                Err(at)
            }
        }
    }

    /// How many addresses the table holds (for tests).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.table
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entries
            .len()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests;
