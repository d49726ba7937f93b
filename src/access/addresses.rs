//! Client addresses: who is behind a socket, and what one address may hold.
//!
//! [`resolve`] names the client of a request: the TCP peer, or, when the
//! peer is a trusted reverse proxy, the address that proxy forwarded. It is
//! a pure function. [`Addresses`] keeps, per client address, its open
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

/// What a request's client address was resolved to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Resolved {
    /// The client: the peer, or the address a trusted proxy forwarded.
    pub ip: IpAddr,
    /// A trusted proxy sent a forwarding header that could not be read
    /// (`ip` is then the peer).
    pub malformed: bool,
}

/// Names the client of a request from `peer`. Only when `peer` is in
/// `trusted` is `header` read: its addresses are walked from the right
/// (the hop nearest to us) and the first that is not itself a trusted
/// proxy is the client. A header that cannot be read, in whole, falls back
/// to the peer, marked `malformed`.
pub fn resolve(
    peer: IpAddr,
    headers: &HeaderMap,
    trusted: &[IpNet],
    header: ForwardedHeader,
) -> Resolved {
    let peer = peer.to_canonical();
    let is_trusted = |ip: &IpAddr| trusted.iter().any(|net| net.contains(ip));
    let as_peer = |malformed| Resolved {
        ip: peer,
        malformed,
    };
    if !is_trusted(&peer) {
        return as_peer(false);
    }
    let name = match header {
        ForwardedHeader::XForwardedFor => "x-forwarded-for",
        ForwardedHeader::Forwarded => "forwarded",
    };
    let mut hops = Vec::new();
    for value in headers.get_all(name) {
        let Ok(value) = value.to_str() else {
            return as_peer(true);
        };
        for element in value.split(',') {
            let hop = match header {
                ForwardedHeader::XForwardedFor => parse_node(element.trim()),
                ForwardedHeader::Forwarded => forwarded_for(element),
            };
            match hop {
                Some(ip) => hops.push(ip.to_canonical()),
                None => return as_peer(true),
            }
        }
    }
    match hops.iter().rev().find(|ip| !is_trusted(ip)) {
        Some(&ip) => Resolved {
            ip,
            malformed: false,
        },
        // Every hop is a proxy of ours: the first one is the client.
        None => hops.first().map_or(as_peer(false), |&ip| Resolved {
            ip,
            malformed: false,
        }),
    }
}

/// The `for=` node of one `Forwarded` element (RFC 7239 section 4), when
/// it is an address (not `unknown` or an obfuscated name).
fn forwarded_for(element: &str) -> Option<IpAddr> {
    let value = element.split(';').find_map(|pair| {
        let (name, value) = pair.split_once('=')?;
        name.trim()
            .eq_ignore_ascii_case("for")
            .then(|| value.trim())
    })?;
    let value = match value.strip_prefix('"') {
        Some(quoted) => quoted.strip_suffix('"')?,
        None => value,
    };
    parse_node(value)
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

/// Under what an address is counted: an IPv4 address as is, an IPv6
/// address by its /64 network (what one subscriber is usually given).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AddressKey(IpAddr);

impl AddressKey {
    pub fn of(ip: IpAddr) -> Self {
        match ip.to_canonical() {
            IpAddr::V4(v4) => Self(IpAddr::V4(v4)),
            IpAddr::V6(v6) => {
                let network = u128::from(v6) & !((1u128 << 64) - 1);
                Self(IpAddr::V6(Ipv6Addr::from(network)))
            }
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
    pub ip: IpAddr,
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

    fn is_exempt(&self, ip: IpAddr) -> bool {
        self.exempt_loopback && ip.to_canonical().is_loopback()
    }

    /// Admits a socket from `peer` at accept. A trusted proxy is not
    /// counted here (its clients are, at the upgrade); any other peer is
    /// the client and takes a place under its address's cap.
    pub fn admit_peer(self: &Arc<Self>, peer: IpAddr) -> Result<Option<Lease>, Refusal> {
        if self.is_trusted(peer) {
            return Ok(None);
        }
        self.lease(peer)
    }

    /// The client of a WebSocket upgrade from `peer`. Behind a trusted
    /// proxy the forwarded address takes its own place under the cap (the
    /// socket's own peer was not counted); otherwise the socket's lease
    /// from accept already counts it.
    pub fn admit_upgrade(
        self: &Arc<Self>,
        peer: IpAddr,
        headers: &HeaderMap,
    ) -> Result<Client, Refusal> {
        let resolved = resolve(peer, headers, &self.trusted, self.header);
        if resolved.malformed {
            self.metrics.forwarded_malformed.inc();
        }
        if !self.is_trusted(peer) {
            return Ok(Client {
                ip: resolved.ip,
                _lease: None,
            });
        }
        let lease = self.lease(resolved.ip)?;
        Ok(Client {
            ip: resolved.ip,
            _lease: lease,
        })
    }

    /// A place under `ip`'s cap, or `None` when `ip` is exempt.
    fn lease(self: &Arc<Self>, ip: IpAddr) -> Result<Option<Lease>, Refusal> {
        if self.is_exempt(ip) {
            return Ok(None);
        }
        let key = AddressKey::of(ip);
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
        if self.is_exempt(client.ip) {
            return Ok(());
        }
        let key = AddressKey::of(client.ip);
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
