//! Member data (issue #19) over real sockets on one node: a Join's data in
//! the snapshots, SetData seen by everyone, limits refused with
//! INVALID_DATA, the budget, token claims that win, and `share_sub`.

use amble::auth::Claims;
use amble::protocol::pb::{self, ErrorCode, client_message::Body as C, server_message::Body as S};

use crate::auth;
use crate::support::*;

fn entry(key: &str, value: &str) -> pb::DataEntry {
    pb::DataEntry {
        key: key.into(),
        value: value.into(),
    }
}

fn entries(pairs: &[(&str, &str)]) -> Vec<pb::DataEntry> {
    pairs.iter().map(|(k, v)| entry(k, v)).collect()
}

async fn send_join(c: &mut Client, room: &str, name: &str, token: &str, data: Vec<pb::DataEntry>) {
    c.send(C::Join(pb::Join {
        data,
        start: None,
        room: room.into(),
        name: name.into(),
        token: token.into(),
        resume_token: String::new(),
    }))
    .await;
}

async fn set_data(c: &mut Client, pairs: &[(&str, &str)]) {
    c.send(C::SetData(pb::SetData {
        data: entries(pairs),
    }))
    .await;
}

/// The next `MemberData`, skipping motion and others' frames.
async fn member_data(c: &mut Client) -> pb::MemberData {
    c.until(|m| match &m.body {
        Some(S::MemberData(d)) => Some(d.clone()),
        _ => None,
    })
    .await
}

fn member_in(w: &pb::Welcome, id: u32) -> pb::Member {
    w.snapshot
        .as_ref()
        .expect("snapshot")
        .members
        .iter()
        .find(|m| m.id == id)
        .cloned()
        .expect("member in the snapshot")
}

#[tokio::test]
async fn a_joins_data_is_in_its_snapshot_and_in_the_others_joined() {
    let server = TestServer::start().await;
    let (mut a, _) = server.joined("lobby", "Ada").await;
    let mut b = server.client().await;
    send_join(
        &mut b,
        "lobby",
        "Bo",
        "",
        entries(&[("status", "busy"), ("colour", "#e4572e")]),
    )
    .await;
    let w = b.welcome().await;
    let me = member_in(&w, w.member_id);
    // Sorted by key, whatever order the Join had.
    assert_eq!(
        me.data,
        entries(&[("colour", "#e4572e"), ("status", "busy")])
    );
    assert_eq!(me.user, "", "no token: no user shown");
    let joined = a
        .until(|m| match &m.body {
            Some(S::Joined(j)) => j.member.clone(),
            _ => None,
        })
        .await;
    assert_eq!(joined.data, me.data);
    let limits = w.limits.expect("limits");
    assert_eq!(
        (
            limits.max_data_entries,
            limits.max_data_bytes,
            limits.max_data_value_chars,
            limits.data_interval_ms,
            limits.data_burst
        ),
        (8, 512, 200, 1_000, 3)
    );
}

#[tokio::test]
async fn set_data_reaches_everyone_and_later_snapshots() {
    let server = TestServer::start().await;
    let (mut a, wa) = server.joined("lobby", "Ada").await;
    let (mut b, _) = server.joined("lobby", "Bo").await;
    set_data(&mut a, &[("status", "presenting"), ("colour", "#2e86ab")]).await;
    let want = pb::MemberData {
        member_id: wa.member_id,
        data: entries(&[("colour", "#2e86ab"), ("status", "presenting")]),
    };
    assert_eq!(member_data(&mut a).await, want, "the sender too");
    assert_eq!(member_data(&mut b).await, want);

    // An empty value removes the key; the whole data comes again.
    set_data(&mut a, &[("colour", "")]).await;
    let want = pb::MemberData {
        member_id: wa.member_id,
        data: entries(&[("status", "presenting")]),
    };
    assert_eq!(member_data(&mut b).await, want);

    // A late joiner's snapshot has it.
    let (_c, wc) = server.joined("lobby", "Cy").await;
    assert_eq!(member_in(&wc, wa.member_id).data, want.data);
    assert_eq!(server.metric("amble_data_changes_total").await, 2.0);
}

#[tokio::test]
async fn bad_data_is_invalid_data_naming_the_key_and_the_socket_stays() {
    // A budget that this test does not reach.
    let server = TestServer::with(config(|c| c.session.data_burst = 100)).await;
    // A Join with a bad key joins nobody.
    let mut c = server.client().await;
    send_join(&mut c, "lobby", "Ada", "", entries(&[("Colour", "red")])).await;
    let text = c.expect_error(ErrorCode::InvalidData).await;
    assert!(text.contains("\"Colour\""), "{text}");
    let w = c.join("lobby", "Ada").await;

    // Nine entries where eight are allowed.
    let nine: Vec<(String, String)> = (0..9).map(|i| (format!("k{i}"), "v".into())).collect();
    let nine: Vec<(&str, &str)> = nine.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    set_data(&mut c, &nine[..8]).await;
    assert_eq!(member_data(&mut c).await.data.len(), 8);
    set_data(&mut c, &nine[8..]).await;
    let text = c.expect_error(ErrorCode::InvalidData).await;
    assert_eq!(text, "invalid data: 9 entries: at most 8 are allowed");

    // A value over max_data_value_chars.
    set_data(&mut c, &[("k0", &"x".repeat(201))]).await;
    let text = c.expect_error(ErrorCode::InvalidData).await;
    assert!(
        text.starts_with("invalid data: key \"k0\": the value is refused: too long"),
        "{text}"
    );
    // Still joined, data unchanged.
    c.ping().await;
    let (_d, wd) = server.joined("lobby", "Bo").await;
    assert_eq!(member_in(&wd, w.member_id).data.len(), 8);
    assert!(
        server
            .metric("amble_rejected_total{reason=\"invalid_data\"}")
            .await
            >= 3.0
    );
}

#[tokio::test]
async fn set_data_over_its_budget_is_rate_limited_and_dropped() {
    let server = TestServer::with(config(|c| {
        c.session.data_burst = 2;
        c.session.data_interval_ms = 60_000;
    }))
    .await;
    let (mut a, _) = server.joined("lobby", "Ada").await;
    for status in ["one", "two"] {
        set_data(&mut a, &[("status", status)]).await;
        assert_eq!(
            member_data(&mut a).await.data,
            entries(&[("status", status)])
        );
    }
    set_data(&mut a, &[("status", "three")]).await;
    let text = a.expect_error(ErrorCode::RateLimited).await;
    assert!(
        text.starts_with("data budget spent: SetData dropped"),
        "{text}"
    );
    let (_b, wb) = server.joined("lobby", "Bo").await;
    let ada = &wb.snapshot.expect("snapshot").members[0];
    assert_eq!(ada.data, entries(&[("status", "two")]));
}

#[tokio::test]
async fn set_data_before_join_is_not_joined() {
    let server = TestServer::start().await;
    let mut c = server.client().await;
    set_data(&mut c, &[("status", "busy")]).await;
    c.expect_error(ErrorCode::NotJoined).await;
}

// ------------------------------------------------------------ tokens

/// An HS256 token for `sub` with the `data` and `share_sub` claims.
fn token(sub: &str, data: Option<serde_json::Value>, share_sub: bool) -> String {
    auth::token(&Claims {
        data,
        share_sub,
        ..auth::claims(sub)
    })
}

#[tokio::test]
async fn token_data_claims_win_and_set_data_cannot_change_them() {
    let files = auth::Files::new("data");
    let server = auth::hs256_server(&files).await;
    let mut a = server.client().await;
    let claim = serde_json::json!({"role": "host"});
    send_join(
        &mut a,
        "lobby",
        "Ada",
        &token("user-1", Some(claim), false),
        entries(&[("role", "guest"), ("status", "busy")]),
    )
    .await;
    let w = a.welcome().await;
    assert_eq!(
        member_in(&w, w.member_id).data,
        entries(&[("role", "host"), ("status", "busy")])
    );
    set_data(&mut a, &[("role", "guest")]).await;
    let text = a.expect_error(ErrorCode::InvalidData).await;
    assert_eq!(
        text,
        "invalid data: key \"role\": set by the token, it cannot change"
    );
    set_data(&mut a, &[("role", "")]).await;
    a.expect_error(ErrorCode::InvalidData).await;
    // Other keys change freely.
    set_data(&mut a, &[("status", "")]).await;
    assert_eq!(member_data(&mut a).await.data, entries(&[("role", "host")]));

    // A bad claim refuses the Join, naming the claim.
    let mut b = server.client().await;
    let bad = serde_json::json!({"Role": "host"});
    send_join(
        &mut b,
        "lobby",
        "Bo",
        &token("user-2", Some(bad), false),
        vec![],
    )
    .await;
    let text = b.expect_error(ErrorCode::InvalidData).await;
    assert!(
        text.starts_with("the token's data claim: key \"Role\""),
        "{text}"
    );
    // The claim and the Join's own entries must keep to the limits together.
    let eight: Vec<(String, String)> = (0..8).map(|i| (format!("k{i}"), "v".into())).collect();
    let eight: Vec<(&str, &str)> = eight
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let one = serde_json::json!({"role": "host"});
    send_join(
        &mut b,
        "lobby",
        "Bo",
        &token("user-2", Some(one), false),
        entries(&eight),
    )
    .await;
    let text = b.expect_error(ErrorCode::InvalidData).await;
    assert_eq!(
        text,
        "invalid data: the Join's data and the token's data claim together: 9 entries: at most 8 are allowed"
    );
    let not_text = serde_json::json!({"level": 3});
    send_join(
        &mut b,
        "lobby",
        "Bo",
        &token("user-2", Some(not_text), false),
        vec![],
    )
    .await;
    let text = b.expect_error(ErrorCode::InvalidData).await;
    assert_eq!(
        text,
        "the token's data claim: key \"level\": the value is not a string"
    );
}

#[tokio::test]
async fn sub_is_shown_only_when_the_token_shares_it() {
    let files = auth::Files::new("data");
    let server = auth::hs256_server(&files).await;
    let mut a = server.client().await;
    send_join(&mut a, "lobby", "Ada", &token("user-1", None, true), vec![]).await;
    let wa = a.welcome().await;
    assert_eq!(member_in(&wa, wa.member_id).user, "user-1");
    let mut b = server.client().await;
    send_join(&mut b, "lobby", "Bo", &token("user-2", None, false), vec![]).await;
    let wb = b.welcome().await;
    assert_eq!(member_in(&wb, wa.member_id).user, "user-1");
    assert_eq!(member_in(&wb, wb.member_id).user, "", "never by default");
    let joined = a
        .until(|m| match &m.body {
            Some(S::Joined(j)) => j.member.clone(),
            _ => None,
        })
        .await;
    assert_eq!(joined.user, "");
}
