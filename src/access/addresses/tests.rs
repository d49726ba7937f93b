use super::*;
use axum::http::HeaderValue;
use proptest::prelude::*;

fn nets(list: &[&str]) -> Vec<IpNet> {
    list.iter().map(|n| n.parse().expect("cidr")).collect()
}

fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (name, value) in pairs {
        h.append(*name, HeaderValue::from_static(value));
    }
    h
}

fn ip(s: &str) -> IpAddr {
    s.parse().expect("ip")
}

const XFF: ForwardedHeader = ForwardedHeader::XForwardedFor;
const FWD: ForwardedHeader = ForwardedHeader::Forwarded;

#[test]
fn an_untrusted_peer_is_the_client_whatever_it_says() {
    let h = headers(&[("x-forwarded-for", "1.2.3.4")]);
    let r = resolve(ip("198.51.100.7"), &h, &nets(&["10.0.0.0/8"]), XFF);
    assert_eq!(
        r,
        Resolved {
            ip: ip("198.51.100.7"),
            malformed: false
        }
    );
}

#[test]
fn the_rightmost_address_that_is_not_a_proxy_is_the_client() {
    let trusted = nets(&["10.0.0.0/8"]);
    // The client wrote a fake first hop; our proxies appended the rest.
    let h = headers(&[("x-forwarded-for", "6.6.6.6, 203.0.113.9, 10.0.0.2")]);
    let r = resolve(ip("10.0.0.1"), &h, &trusted, XFF);
    assert_eq!(r.ip, ip("203.0.113.9"));
    // Several header lines are one list, in order.
    let h = headers(&[
        ("x-forwarded-for", "6.6.6.6"),
        ("x-forwarded-for", "203.0.113.9:5555"),
    ]);
    assert_eq!(
        resolve(ip("10.0.0.1"), &h, &trusted, XFF).ip,
        ip("203.0.113.9")
    );
    // Every hop a proxy of ours: the first is the client.
    let h = headers(&[("x-forwarded-for", "10.1.1.1, 10.0.0.2")]);
    assert_eq!(
        resolve(ip("10.0.0.1"), &h, &trusted, XFF).ip,
        ip("10.1.1.1")
    );
    // No header: the proxy itself asked.
    let r = resolve(ip("10.0.0.1"), &HeaderMap::new(), &trusted, XFF);
    assert_eq!(
        r,
        Resolved {
            ip: ip("10.0.0.1"),
            malformed: false
        }
    );
}

#[test]
fn forwarded_follows_rfc_7239() {
    let trusted = nets(&["127.0.0.1/32"]);
    let h = headers(&[(
        "forwarded",
        "for=192.0.2.43;proto=https, For=\"[2001:db8:cafe::17]:4711\";by=127.0.0.1",
    )]);
    let r = resolve(ip("127.0.0.1"), &h, &trusted, FWD);
    assert_eq!(r.ip, ip("2001:db8:cafe::17"));
    // With X-Forwarded-For chosen, a Forwarded header (which a client could
    // have written) is ignored, and the other way round.
    let h = headers(&[("forwarded", "for=192.0.2.43")]);
    assert_eq!(
        resolve(ip("127.0.0.1"), &h, &trusted, XFF).ip,
        ip("127.0.0.1")
    );
    let h = headers(&[("x-forwarded-for", "192.0.2.43")]);
    assert_eq!(
        resolve(ip("127.0.0.1"), &h, &trusted, FWD).ip,
        ip("127.0.0.1")
    );
}

#[test]
fn unreadable_headers_fall_back_to_the_peer() {
    let trusted = nets(&["127.0.0.0/8", "::1/128"]);
    for (header, value) in [
        (XFF, "not an address"),
        (XFF, "1.2.3.4, , 5.6.7.8"),
        (XFF, "1.2.3.4:99999999"),
        (XFF, "[::1"),
        (FWD, "for=unknown"),
        (FWD, "for=_hidden"),
        (FWD, "proto=https"),
        (FWD, "for=\"[2001:db8::1]"),
    ] {
        let name = match header {
            XFF => "x-forwarded-for",
            FWD => "forwarded",
        };
        let mut h = HeaderMap::new();
        h.insert(name, HeaderValue::from_str(value).expect("value"));
        let r = resolve(ip("::1"), &h, &trusted, header);
        assert_eq!(
            r,
            Resolved {
                ip: ip("::1"),
                malformed: true
            },
            "{value}"
        );
    }
    let mut h = HeaderMap::new();
    h.insert(
        "x-forwarded-for",
        HeaderValue::from_bytes(b"1.2.3.4\xff").expect("value"),
    );
    assert!(resolve(ip("127.0.0.1"), &h, &trusted, XFF).malformed);
}

#[test]
fn mapped_addresses_are_their_ipv4_selves() {
    let trusted = nets(&["10.0.0.0/8"]);
    let h = headers(&[("x-forwarded-for", "::ffff:203.0.113.9")]);
    let r = resolve(ip("::ffff:10.0.0.1"), &h, &trusted, XFF);
    assert_eq!(r.ip, ip("203.0.113.9"));
}

#[test]
fn ipv6_is_counted_by_its_slash_64() {
    assert_eq!(
        AddressKey::of(ip("2001:db8:1:2:aaaa::1")),
        AddressKey::of(ip("2001:db8:1:2:bbbb::2"))
    );
    assert_ne!(
        AddressKey::of(ip("2001:db8:1:2::1")),
        AddressKey::of(ip("2001:db8:1:3::1"))
    );
    assert_eq!(
        AddressKey::of(ip("::ffff:1.2.3.4")),
        AddressKey::of(ip("1.2.3.4"))
    );
}

/// The defaults of the address flags, as `amble` with no flag has them.
fn defaults() -> AddressConfig {
    crate::config::Config::default().addresses
}

fn table(f: impl FnOnce(&mut AddressConfig)) -> Arc<Addresses> {
    let mut config = AddressConfig {
        exempt_loopback: false,
        ..defaults()
    };
    f(&mut config);
    Addresses::new(&config, 4, Arc::new(Metrics::default()))
}

#[tokio::test(start_paused = true)]
async fn a_cap_per_address_and_entries_go_when_rested() {
    let t = table(|c| {
        c.max_connections_per_ip = 2;
        c.ip_join_burst = 1;
        c.ip_join_interval_ms = 1_000;
    });
    let a = t.admit_peer(ip("192.0.2.1")).expect("first");
    let b = t.admit_peer(ip("192.0.2.1")).expect("second");
    assert_eq!(
        t.admit_peer(ip("192.0.2.1")).err(),
        Some(Refusal::TooManyConnections(2))
    );
    let other = t.admit_peer(ip("192.0.2.2")).expect("another address");
    assert_eq!(t.len(), 2);
    drop(other);
    assert_eq!(t.len(), 1, "no socket and a full budget: gone");

    let client = t
        .admit_upgrade(ip("192.0.2.1"), &HeaderMap::new())
        .expect("client");
    let now = Instant::now();
    assert_eq!(t.admit_join(&client, now), Ok(()));
    assert_eq!(
        t.admit_join(&client, now),
        Err(now + Duration::from_secs(1))
    );
    drop((a, b, client));
    assert_eq!(t.len(), 1, "kept while its budget refills");
    tokio::time::advance(Duration::from_secs(2)).await;
    // Swept when the table next grows to its sweep size.
    let held: Vec<_> = (0..SWEEP_FLOOR as u32 - 1)
        .map(|i| t.admit_peer(IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + i))))
        .collect();
    assert_eq!(t.len(), SWEEP_FLOOR);
    let _newcomer = t.admit_peer(ip("198.51.100.1")).expect("room");
    assert_eq!(t.len(), SWEEP_FLOOR, "the rested entry made room");
    drop(held);
}

#[tokio::test(start_paused = true)]
async fn at_its_bound_the_table_forgets_budgets_of_addresses_with_no_socket() {
    let t = table(|c| c.ip_join_burst = 1);
    // Addresses that joined and left: no socket, a budget still refilling.
    for i in 0..SWEEP_FLOOR as u32 {
        let addr = IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + i));
        let client = t.admit_upgrade(addr, &HeaderMap::new()).expect("client");
        let lease = t.admit_peer(addr).expect("lease");
        assert_eq!(t.admit_join(&client, Instant::now()), Ok(()));
        drop((client, lease));
    }
    assert_eq!(t.len(), SWEEP_FLOOR);
    let _newcomer = t.admit_peer(ip("198.51.100.1")).expect("room");
    assert_eq!(t.len(), 1, "bounded: only addresses with sockets stay");
}

#[test]
fn loopback_is_exempt_unless_told_otherwise() {
    let config = AddressConfig {
        max_connections_per_ip: 1,
        ..defaults()
    };
    let t = Addresses::new(&config, 4, Arc::new(Metrics::default()));
    let held: Vec<_> = (0..5)
        .map(|_| t.admit_peer(ip("127.0.0.1")).expect("exempt"))
        .collect();
    assert!(held.iter().all(Option::is_none));
    assert!(t.is_empty());
}

proptest! {
    /// Any header bytes: no panic, and the answer is the peer or an
    /// address the header named.
    #[test]
    fn resolution_never_panics(value in proptest::collection::vec(any::<u8>(), 0..200), forwarded in any::<bool>()) {
        let header = if forwarded { FWD } else { XFF };
        let name = if forwarded { "forwarded" } else { "x-forwarded-for" };
        let mut h = HeaderMap::new();
        if let Ok(v) = HeaderValue::from_bytes(&value) {
            h.insert(name, v);
        }
        let peer = ip("127.0.0.1");
        let r = resolve(peer, &h, &nets(&["127.0.0.0/8"]), header);
        if r.malformed {
            prop_assert_eq!(r.ip, peer);
        }
    }
}
