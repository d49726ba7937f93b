//! What a connected client may send: ping budget, fragments, text frames, per-address joins.
//! Every bad input gets a clear Error or close code, is counted, and
//! leaves the rest of the room undisturbed.

use std::time::Duration;

use amble::protocol::encode_client;
use amble::protocol::pb::server_message::Body as S;
use amble::protocol::pb::{self, ErrorCode, LeaveReason, client_message::Body as C};
use futures_util::{SinkExt as _, StreamExt as _};
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::frame::coding::{Control, Data, OpCode};
use tokio_tungstenite::tungstenite::protocol::frame::{Frame, FrameHeader};

use crate::support::*;

/// A `Left`: who left, and why.
fn left(m: &pb::ServerMessage) -> Option<(u32, i32)> {
    match &m.body {
        Some(S::Left(l)) => Some((l.member_id, l.reason)),
        _ => None,
    }
}

/// What a flooding client saw before it was closed.
#[derive(Debug, Default)]
struct Seen {
    pongs: u32,
    rate_limited: u32,
    flood: u32,
    close: u16,
}

/// Sends up to `count` copies of `msg` as fast as the socket takes them,
/// then reads what came back until the server closes.
async fn flood_with(client: &mut Client, msg: Message, count: u32) -> Seen {
    for _ in 0..count {
        // The server may close mid-flood: stop at the first failed send.
        if within("send", client.ws.send(msg.clone())).await.is_err() {
            break;
        }
    }
    let mut seen = Seen::default();
    loop {
        match client.event().await {
            Event::Message(m) => match m.body {
                Some(S::Pong(_)) => seen.pongs += 1,
                Some(S::Error(e)) if e.code == ErrorCode::RateLimited as i32 => {
                    seen.rate_limited += 1;
                }
                Some(S::Error(e)) if e.code == ErrorCode::Flood as i32 => seen.flood += 1,
                other => panic!("unexpected {other:?}"),
            },
            Event::Closed(frame) => {
                seen.close = frame.map_or(1006, |f| f.code.into());
                return seen;
            }
        }
    }
}

/// A member floods with `msg`: it is closed with 1008, its room is told it
/// was kicked, the flood is counted, and the room goes on. Returns what it
/// saw and the whole seconds the flood lasted.
async fn a_ping_flood_is_closed(msg: Message) -> (Seen, u32) {
    let server = TestServer::start().await;
    let (mut watcher, _) = server.joined("lobby", "watcher").await;
    let (mut flooder, w) = server.joined("lobby", "flooder").await;
    let start = Instant::now();
    let seen = flood_with(&mut flooder, msg, 2_000).await;
    let secs = start.elapsed().as_secs_f64().ceil() as u32;
    assert_eq!((seen.flood, seen.close), (1, 1008), "{seen:?}");
    // At most one notice a second: refusing is no amplifier itself.
    assert!(
        (1..=secs + 1).contains(&seen.rate_limited),
        "{seen:?} in {secs} s"
    );
    let gone = watcher.until(left).await;
    assert_eq!(gone, (w.member_id, LeaveReason::Kicked as i32));
    assert_eq!(
        server
            .metric("amble_rejected_total{reason=\"flood\"}")
            .await,
        1.0
    );
    assert_eq!(
        server
            .metric("amble_rejected_total{reason=\"rate_limited\"}")
            .await,
        f64::from(seen.rate_limited)
    );
    // The flood limit (20 x the burst of 10) passed before the close, all
    // but the budget of them unanswered.
    assert!(server.metric("amble_pings_over_budget_total").await >= 150.0);
    watcher.ping().await;
    (seen, secs)
}

#[tokio::test]
async fn a_protocol_ping_flood_is_closed_with_1008_and_counted() {
    let ping = Message::Binary(encode_client(C::Ping(pb::Ping { client_time_ms: 1 })).into());
    let (seen, secs) = a_ping_flood_is_closed(ping).await;
    // Only the pings within the budget (a burst of 10, then 5 a second)
    // were answered.
    assert!((10..=10 + 5 * secs).contains(&seen.pongs), "{seen:?}");
}

#[tokio::test]
async fn a_websocket_ping_flood_is_closed_with_1008_and_counted() {
    a_ping_flood_is_closed(Message::Ping(vec![7; 8].into())).await;
}

#[tokio::test]
async fn with_the_budget_off_pings_are_all_answered() {
    let server = TestServer::with(config(|c| c.session.pings_per_sec = 0)).await;
    let mut c = server.client().await;
    for i in 0..500 {
        c.send(C::Ping(pb::Ping { client_time_ms: i })).await;
    }
    for i in 0..500 {
        match c.recv().await.body {
            Some(S::Pong(p)) => assert_eq!(p.client_time_ms, i),
            other => panic!("expected Pong {i}, got {other:?}"),
        }
    }
    assert_eq!(server.metric("amble_pings_over_budget_total").await, 0.0);
}

/// Waits for the WebSocket pong that answers `payload`.
async fn websocket_pong(c: &mut Client, payload: &[u8]) {
    loop {
        match within("a WebSocket pong", c.ws.next()).await {
            Some(Ok(Message::Pong(p))) if p.as_ref() == payload => return,
            Some(Ok(Message::Binary(b))) => {
                let m = <pb::ServerMessage as prost::Message>::decode(b).expect("frame");
                assert!(!matches!(m.body, Some(S::Error(_))), "{m:?}");
            }
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
            other => panic!("expected a pong, got {other:?}"),
        }
    }
}

/// The browser SDK (web/amble.js) sends a Ping when it connects and one
/// every 2 s for its clock; WebSocket libraries ping every few seconds to
/// keep a connection alive, and answer the server's keepalive pings. Under
/// the default budget none of it is ever refused. Paused time: two virtual
/// minutes.
#[tokio::test(start_paused = true)]
async fn keepalive_and_clock_sync_pings_are_never_refused() {
    let server = TestServer::with(config(|c| {
        // Keepalive pings to quiet clients every 1-2 s: more pongs than
        // the 15 s default would bring.
        c.session.ping_interval_ms = 1_000;
        c.session.idle_timeout_ms = 3_000;
    }))
    .await;
    // A member that only reads, answering the server's keepalive pings.
    let (mut quiet, _) = server.joined("lobby", "quiet").await;
    let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
    let quiet = tokio::spawn(async move {
        let mut keepalives = 0u32;
        loop {
            tokio::select! {
                _ = &mut stopped => return keepalives,
                msg = quiet.ws.next() => match msg {
                    Some(Ok(Message::Ping(_))) => keepalives += 1,
                    Some(Ok(Message::Binary(b))) => {
                        let m = <pb::ServerMessage as prost::Message>::decode(b).expect("frame");
                        assert!(!matches!(m.body, Some(S::Error(_))), "{m:?}");
                    }
                    other => panic!("quiet member: {other:?}"),
                },
            }
        }
    });

    // The SDK: a Ping as the socket opens, then Join.
    let mut sdk = server.client().await;
    sdk.ping().await;
    sdk.join("lobby", "sdk").await;
    // A library that syncs its clock with a quick burst of Pings.
    let mut library = server.client().await;
    for i in 0..5 {
        library.send(C::Ping(pb::Ping { client_time_ms: i })).await;
    }
    for i in 0..5 {
        match library.recv().await.body {
            Some(S::Pong(p)) => assert_eq!(p.client_time_ms, i),
            other => panic!("expected Pong {i}, got {other:?}"),
        }
    }
    library.join("lobby", "library").await;

    let mut pongs = 0;
    for second in 1..=120u64 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        // A WebSocket keepalive ping every second.
        let payload = second.to_be_bytes();
        library
            .send_raw(Message::Ping(payload.to_vec().into()))
            .await;
        websocket_pong(&mut library, &payload).await;
        // The SDK's clock-sync Ping every 2 s.
        if second % 2 == 0 {
            sdk.send(C::Ping(pb::Ping {
                client_time_ms: second,
            }))
            .await;
            sdk.until(|m| match &m.body {
                Some(S::Pong(p)) if p.client_time_ms == second => Some(()),
                Some(S::Error(e)) => panic!("refused: {e:?}"),
                _ => None,
            })
            .await;
            pongs += 1;
        }
    }
    assert_eq!(pongs, 60);
    // All three still in the room (the quiet one did not time out).
    assert_eq!(server.metric("amble_members").await, 3.0);
    let _ = stop.send(());
    let keepalives = within("the quiet member", quiet).await.expect("quiet task");
    assert!(keepalives >= 40, "{keepalives} keepalive pings answered");
    for series in [
        "amble_pings_over_budget_total",
        "amble_rejected_total{reason=\"rate_limited\"}",
        "amble_rejected_total{reason=\"flood\"}",
        "amble_idle_timeouts_total",
    ] {
        assert_eq!(server.metric(series).await, 0.0, "{series}");
    }
}

/// A data frame, or a continuation of one.
fn fragment(opcode: Data, payload: &[u8], last: bool) -> Message {
    Message::Frame(Frame::message(payload.to_vec(), OpCode::Data(opcode), last))
}

#[tokio::test]
async fn a_fragmented_message_is_refused_at_the_first_fragment_past_the_limit() {
    let server = TestServer::start().await;
    let (mut watcher, _) = server.joined("lobby", "watcher").await;
    // Fragments within the limit make one message, as usual.
    let join = encode_client(C::Join(pb::Join {
        data: Vec::new(),
        start: None,
        room: "lobby".into(),
        name: "pieces".into(),
        token: String::new(),
        resume_token: String::new(),
    }));
    let (head, tail) = join.split_at(3);
    let mut c = server.client().await;
    c.send_raw(fragment(Data::Binary, head, false)).await;
    c.send_raw(fragment(Data::Continue, &tail[..1], false))
        .await;
    c.send_raw(fragment(Data::Continue, &tail[1..], true)).await;
    c.until(|m| matches!(m.body, Some(S::Welcome(_))).then_some(()))
        .await;

    // 4,097 one-byte fragments: the last of them takes the message past
    // the 4,096-byte limit, and is the one refused.
    let mut c = server.client().await;
    c.send_raw(fragment(Data::Binary, &[0], false)).await;
    for _ in 1..4_097 {
        c.send_raw(fragment(Data::Continue, &[0], false)).await;
    }
    let text = c.expect_error(ErrorCode::TooBig).await;
    assert!(text.contains("4097 bytes"), "{text}");
    assert_eq!(c.expect_close().await, 1009);
    assert_eq!(
        server
            .metric("amble_rejected_total{reason=\"too_big\"}")
            .await,
        1.0
    );
    watcher.ping().await;
}

#[tokio::test]
async fn every_text_frame_is_refused_and_counted() {
    let server = TestServer::start().await;
    let (mut watcher, _) = server.joined("lobby", "watcher").await;
    // (frames, close code): valid UTF-8 is 1003, invalid 1007 (RFC 6455 8.1).
    let close_reason = [0x03, 0xe8, b'b', 0xff, b'y', b'e'];
    let cases: [(Vec<Message>, u16); 5] = [
        (vec![Message::Text("{\"join\":{}}".into())], 1003),
        (vec![fragment(Data::Text, &[b'o', 0xff, b'k'], true)], 1007),
        (
            vec![
                fragment(Data::Text, b"frag", false),
                fragment(Data::Continue, b"mented", true),
            ],
            1003,
        ),
        (
            vec![
                fragment(Data::Text, b"ok so far", false),
                fragment(Data::Continue, &[0xc3, 0x28], true),
            ],
            1007,
        ),
        // A Close whose reason is not UTF-8 is answered the same way.
        (
            vec![Message::Frame(Frame::from_payload(
                FrameHeader {
                    opcode: OpCode::Control(Control::Close),
                    ..FrameHeader::default()
                },
                close_reason.to_vec().into(),
            ))],
            1007,
        ),
    ];
    for (i, (frames, code)) in cases.into_iter().enumerate() {
        let (mut c, w) = server.joined("lobby", &format!("texter{i}")).await;
        for frame in frames {
            c.send_raw(frame).await;
        }
        let text = c
            .until(|m| match &m.body {
                Some(S::Error(e)) if e.code == ErrorCode::TextFrame as i32 => {
                    Some(e.message.clone())
                }
                _ => None,
            })
            .await;
        assert!(text.contains("binary"), "{text}");
        if code == 1007 {
            // Said so that it fits a Close's reason as well as a text message.
            assert!(
                text.contains("not valid UTF-8") && text.contains("Close"),
                "{text}"
            );
        }
        assert_eq!(c.expect_close().await, code, "case {i}");
        // The room is told the member was kicked, not that it vanished.
        let gone = watcher.until(left).await;
        assert_eq!(gone, (w.member_id, LeaveReason::Kicked as i32), "case {i}");
    }
    assert_eq!(
        server
            .metric("amble_rejected_total{reason=\"text_frame\"}")
            .await,
        5.0
    );
    watcher.ping().await;
}

#[tokio::test]
async fn names_and_chat_are_normalised_and_blank_or_bidi_text_refused() {
    let server = TestServer::start().await;
    let (mut watcher, _) = server.joined("lobby", "watcher").await;
    let mut c = server.client().await;
    for name in [
        "\u{3164}",
        "\u{200B}\u{FEFF}",
        "\u{115F}\u{1160}\u{FFA0}",
        "\u{2800} ",
        "admin\u{202E}gpj.exe",
        "a\u{2066}b",
        "two\u{2028}lines",
    ] {
        c.send(C::Join(pb::Join {
            data: Vec::new(),
            start: None,
            room: "lobby".into(),
            name: name.into(),
            token: String::new(),
            resume_token: String::new(),
        }))
        .await;
        c.expect_error(ErrorCode::InvalidName).await;
    }
    // A decomposed "Zoë" joins as the composed one, and others see that.
    let w = c.join("lobby", "Zoe\u{308}").await;
    let me = w.member_id;
    let snapshot = w.snapshot.expect("snapshot");
    let mine = snapshot.members.iter().find(|m| m.id == me).expect("me");
    assert_eq!(mine.name, "Zoë");
    let joined = watcher
        .until(|m| match &m.body {
            Some(S::Joined(j)) => j.member.clone(),
            _ => None,
        })
        .await;
    assert_eq!(joined.name, "Zoë");

    for text in ["\u{2800}\u{2800}", "\u{200D}", "rtl\u{202B}", "a\u{2029}b"] {
        c.send(C::Chat(pb::SendChat { text: text.into() })).await;
        c.until(|m| match &m.body {
            Some(S::Error(e)) if e.code == ErrorCode::InvalidChat as i32 => Some(()),
            _ => None,
        })
        .await;
    }
    c.send(C::Chat(pb::SendChat {
        text: "cafe\u{301}".into(),
    }))
    .await;
    let said = watcher
        .until(|m| match &m.body {
            Some(S::Chat(chat)) => Some(chat.text.clone()),
            _ => None,
        })
        .await;
    assert_eq!(said, "café");
    assert_eq!(
        server
            .metric("amble_rejected_total{reason=\"invalid_name\"}")
            .await,
        7.0
    );
    assert_eq!(
        server
            .metric("amble_rejected_total{reason=\"invalid_chat\"}")
            .await,
        4.0
    );
}

/// Issue #19: a Join may say where the member appears; a point outside the
/// world is refused with INVALID_POSITION on a socket that stays, and
/// without one the spawn rule places the member.
#[tokio::test]
async fn a_join_may_say_where_to_appear_within_the_world() {
    let server = TestServer::start().await;
    let join = |x: u32, y: u32| {
        C::Join(pb::Join {
            data: Vec::new(),
            start: Some(pb::Position { x, y }),
            room: "placed".into(),
            name: "Ada".into(),
            token: String::new(),
            resume_token: String::new(),
        })
    };
    let mut c = server.client().await;
    c.send(join(5_001, 10)).await;
    let text = c.expect_error(ErrorCode::InvalidPosition).await;
    assert!(text.contains("5000"), "{text}");
    c.send(join(4_321, 123)).await;
    let welcome = c.welcome().await;
    assert_eq!(
        own_position(&welcome),
        Some(pb::Position { x: 4_321, y: 123 })
    );
    // The others see it there too.
    let (_bo, w) = server.joined("placed", "Bo").await;
    let ada = w
        .snapshot
        .as_ref()
        .and_then(|s| s.members.iter().find(|m| m.name == "Ada"))
        .expect("Ada in Bo's snapshot");
    assert_eq!(ada.position, Some(pb::Position { x: 4_321, y: 123 }));
    server.stop().await;
}
