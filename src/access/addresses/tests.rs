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

fn known(s: &str) -> Resolved {
    Resolved {
        client: ClientId::Address(ip(s)),
        unreadable: None,
    }
}

fn unknown(behind: &str, why: Unreadable) -> Resolved {
    Resolved {
        client: ClientId::UnknownBehind(ip(behind)),
        unreadable: Some(why),
    }
}

fn name_of(header: ForwardedHeader) -> &'static str {
    match header {
        XFF => "x-forwarded-for",
        FWD => "forwarded",
    }
}

/// `resolve` with `lines` as the lines of `header`, in order.
fn from(peer: &str, trusted: &[&str], header: ForwardedHeader, lines: &[&str]) -> Resolved {
    let mut h = HeaderMap::new();
    for line in lines {
        h.append(name_of(header), HeaderValue::from_str(line).expect("value"));
    }
    resolve(ip(peer), &h, &nets(trusted), header)
}

#[test]
fn an_untrusted_peer_is_the_client_whatever_it_says() {
    for lines in [&["1.2.3.4"][..], &["garbage"], &["unknown"], &[]] {
        assert_eq!(
            from("198.51.100.7", &["10.0.0.0/8"], XFF, lines),
            known("198.51.100.7"),
            "{lines:?}"
        );
    }
}

#[test]
fn the_rightmost_address_that_is_not_a_proxy_is_the_client() {
    let t = &["10.0.0.0/8"];
    // The client wrote a fake first hop; our proxies appended the rest.
    assert_eq!(
        from("10.0.0.1", t, XFF, &["6.6.6.6, 203.0.113.9, 10.0.0.2"]),
        known("203.0.113.9")
    );
    // Several header lines are one list, in order.
    assert_eq!(
        from("10.0.0.1", t, XFF, &["6.6.6.6", "203.0.113.9:5555"]),
        known("203.0.113.9")
    );
    assert_eq!(
        from("10.0.0.1", t, XFF, &["203.0.113.9, 10.0.0.3", "10.0.0.2"]),
        known("203.0.113.9")
    );
    // Every hop a proxy of ours: the leftmost is the client.
    assert_eq!(
        from("10.0.0.1", t, XFF, &["10.1.1.1, 10.0.0.2"]),
        known("10.1.1.1")
    );
    // No header: the proxy itself asked.
    assert_eq!(from("10.0.0.1", t, XFF, &[]), known("10.0.0.1"));
}

#[test]
fn only_the_hops_past_our_proxies_are_read() {
    let t = &["127.0.0.0/8", "::1/128"];
    // Garbage left of the client is never read: the client wrote it.
    assert_eq!(
        from("127.0.0.1", t, XFF, &["garbage, unknown, 203.0.113.9"]),
        known("203.0.113.9")
    );
    assert_eq!(
        from(
            "::1",
            t,
            FWD,
            &["for=_hidden, for=unknown, for=198.51.100.2"]
        ),
        known("198.51.100.2")
    );
}

#[test]
fn an_unreadable_client_hop_is_an_unknown_client_behind_the_nearest_proxy() {
    let t = &["127.0.0.0/8", "::1/128", "10.0.0.0/8"];
    for (header, line, why) in [
        (XFF, "not an address", Unreadable::Garbage),
        (XFF, "1.2.3.4:99999999", Unreadable::Garbage),
        (XFF, "[::1", Unreadable::Garbage),
        (XFF, "1.2.3.4 5.6.7.8", Unreadable::Garbage),
        (XFF, "", Unreadable::Garbage),
        (XFF, "unknown", Unreadable::Unknown),
        (XFF, "UNKNOWN", Unreadable::Unknown),
        (XFF, "_hidden", Unreadable::Obfuscated),
        (FWD, "for=unknown", Unreadable::Unknown),
        (FWD, "for=\"unknown:4711\"", Unreadable::Unknown),
        (FWD, "for=_hidden", Unreadable::Obfuscated),
        (FWD, "for=\"_hidden:_port\"", Unreadable::Obfuscated),
        (FWD, "for=_SEVKISEK", Unreadable::Obfuscated),
        (FWD, "proto=https", Unreadable::Garbage),
        (FWD, "for=\"[2001:db8::1]", Unreadable::Garbage),
        (FWD, "for=\"a\\\"b\"", Unreadable::Garbage),
        (FWD, "for=_", Unreadable::Garbage),
        (FWD, "for=", Unreadable::Garbage),
    ] {
        assert_eq!(
            from("::1", t, header, &[line]),
            unknown("::1", why),
            "{line:?}"
        );
    }
    // Behind a chain of our proxies: the one that forwarded the bad hop.
    assert_eq!(
        from(
            "127.0.0.1",
            t,
            XFF,
            &["6.6.6.6, garbage, 10.0.0.7, 10.0.0.8"]
        ),
        unknown("10.0.0.7", Unreadable::Garbage)
    );
    // An empty element between ours, and a second line of garbage.
    assert_eq!(
        from("127.0.0.1", t, XFF, &["1.2.3.4, , 10.0.0.8"]),
        unknown("10.0.0.8", Unreadable::Garbage)
    );
    assert_eq!(
        from("127.0.0.1", t, XFF, &["203.0.113.9", "unknown"]),
        unknown("127.0.0.1", Unreadable::Unknown)
    );
    // A line that is not text.
    let mut h = HeaderMap::new();
    h.insert(
        "x-forwarded-for",
        HeaderValue::from_bytes(b"1.2.3.4\xff").expect("value"),
    );
    assert_eq!(
        resolve(ip("127.0.0.1"), &h, &nets(t), XFF),
        unknown("127.0.0.1", Unreadable::Garbage)
    );
}

#[test]
fn forwarded_follows_rfc_7239() {
    let t = &["127.0.0.1/32"];
    // Section 4's examples.
    assert_eq!(
        from("127.0.0.1", t, FWD, &["for=\"_gazonk\""]),
        unknown("127.0.0.1", Unreadable::Obfuscated)
    );
    assert_eq!(
        from("127.0.0.1", t, FWD, &["For=\"[2001:db8:cafe::17]:4711\""]),
        known("2001:db8:cafe::17")
    );
    assert_eq!(
        from(
            "127.0.0.1",
            t,
            FWD,
            &["for=192.0.2.60;proto=http;by=203.0.113.43"]
        ),
        known("192.0.2.60")
    );
    assert_eq!(
        from("127.0.0.1", t, FWD, &["for=192.0.2.43, for=198.51.100.17"]),
        known("198.51.100.17")
    );
    // Section 7.1: several lines are one list.
    assert_eq!(
        from(
            "127.0.0.1",
            t,
            FWD,
            &[
                "for=192.0.2.43",
                "for=\"[2001:db8:cafe::17]\", for=127.0.0.1"
            ]
        ),
        known("2001:db8:cafe::17")
    );
    // A quoted comma or semicolon in another parameter splits nothing.
    assert_eq!(
        from(
            "127.0.0.1",
            t,
            FWD,
            &["for=192.0.2.1, by=\"a,b;c\";for=198.51.100.9"]
        ),
        known("198.51.100.9")
    );
    // IPv6 in brackets with a port, unquoted IPv4 with a port.
    assert_eq!(
        from(
            "127.0.0.1",
            t,
            FWD,
            &["for=\"[2001:db8::1]:80\";proto=https"]
        ),
        known("2001:db8::1")
    );
    assert_eq!(
        from("127.0.0.1", t, FWD, &["for=192.0.2.8:4711"]),
        known("192.0.2.8")
    );
    assert_eq!(
        from("127.0.0.1", t, XFF, &["[2001:db8::2]:4711"]),
        known("2001:db8::2")
    );
    // With X-Forwarded-For chosen, a Forwarded header (which a client could
    // have written) is ignored, and the other way round.
    let h = headers(&[("forwarded", "for=192.0.2.43")]);
    assert_eq!(
        resolve(ip("127.0.0.1"), &h, &nets(t), XFF),
        known("127.0.0.1")
    );
    let h = headers(&[("x-forwarded-for", "192.0.2.43")]);
    assert_eq!(
        resolve(ip("127.0.0.1"), &h, &nets(t), FWD),
        known("127.0.0.1")
    );
}

#[test]
fn too_many_trusted_hops_are_an_unknown_client() {
    let t = &["10.0.0.0/8"];
    let chain = |n: u32| {
        (0..n)
            .map(|i| std::net::Ipv4Addr::from(0x0a00_0100 + i).to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    // MAX_HOPS trusted hops and then nothing: the leftmost is the client.
    let line = chain(MAX_HOPS as u32);
    assert_eq!(from("10.0.0.1", t, XFF, &[&line]), known("10.0.1.0"));
    // One more, and the walk stops at the bound.
    let line = format!("203.0.113.9, {}", chain(MAX_HOPS as u32));
    assert_eq!(
        from("10.0.0.1", t, XFF, &[&line]),
        unknown("10.0.1.0", Unreadable::TooManyHops)
    );
}

#[test]
fn mapped_addresses_are_their_ipv4_selves() {
    assert_eq!(
        from(
            "::ffff:10.0.0.1",
            &["10.0.0.0/8"],
            XFF,
            &["::ffff:203.0.113.9"]
        ),
        known("203.0.113.9")
    );
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

#[tokio::test(start_paused = true)]
async fn unknown_clients_behind_a_loopback_proxy_share_one_limited_place() {
    let config = AddressConfig {
        max_connections_per_ip: 2,
        ip_join_burst: 1,
        trusted_proxies: nets(&["127.0.0.0/8"]),
        ..defaults()
    };
    let t = Addresses::new(&config, 4, Arc::new(Metrics::default()));
    let garbage = headers(&[("x-forwarded-for", "garbage")]);
    let unknown = headers(&[("x-forwarded-for", "unknown")]);
    let a = t.admit_upgrade(ip("127.0.0.1"), &garbage).expect("first");
    assert_eq!(a.who, ClientId::UnknownBehind(ip("127.0.0.1")));
    let b = t.admit_upgrade(ip("127.0.0.1"), &unknown).expect("second");
    assert_eq!(
        t.admit_upgrade(ip("127.0.0.1"), &garbage).err(),
        Some(Refusal::TooManyConnections(2)),
        "the loopback exemption does not lift an unknown client's cap"
    );
    let now = Instant::now();
    assert_eq!(t.admit_join(&a, now), Ok(()));
    assert!(t.admit_join(&b, now).is_err(), "one join budget for both");
    // A loopback client the proxy names is still exempt.
    let local = headers(&[("x-forwarded-for", "127.0.0.5")]);
    let c = t.admit_upgrade(ip("127.0.0.1"), &local).expect("exempt");
    assert_eq!(t.admit_join(&c, now), Ok(()));
    assert_eq!(t.len(), 1);
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
        // Unknown exactly when a hop could not be read, and then behind
        // one of ours (the peer or a loopback hop).
        match r.client {
            ClientId::UnknownBehind(proxy) => {
                prop_assert!(r.unreadable.is_some());
                prop_assert!(proxy.is_loopback());
            }
            ClientId::Address(_) => prop_assert!(r.unreadable.is_none()),
        }
    }
}
