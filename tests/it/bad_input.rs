//! Every bad input gets a clear Error or close code, is counted, and
//! leaves the rest of the room undisturbed.

use amble::protocol::pb::{self, ErrorCode, client_message::Body as C, server_message::Body as S};
use amble::protocol::{Motion, Position, Walk, encode_client, move_body};
use tokio_tungstenite::tungstenite::Message;

use crate::support::*;

/// A room with a bystander that keeps moving and must keep seeing moves.
struct Room {
    server: TestServer,
    bystander: Client,
    mover: Client,
    seq: u32,
}

impl Room {
    async fn new(server: TestServer) -> Self {
        let (bystander, _) = server.joined("lobby", "bystander").await;
        let (mut mover, _) = server.joined("lobby", "mover").await;
        mover.ping().await;
        Self {
            server,
            bystander,
            mover,
            seq: 0,
        }
    }

    /// The room still works: a move gets through to the bystander.
    async fn still_serves(&mut self) {
        self.seq += 1;
        let x = self.seq;
        self.mover.send_move(x, x, x).await;
        let records = self
            .bystander
            .until(|m| {
                let (_, records) = amble::protocol::decode_motion(&m.motion).ok()?;
                records.into_iter().find(|r| r.motion.position.x == x)
            })
            .await;
        assert_eq!(records.motion.position, Position { x, y: x });
    }

    async fn rejected(&self, reason: &str) -> f64 {
        self.server
            .metric(&format!("amble_rejected_total{{reason=\"{reason}\"}}"))
            .await
    }
}

fn fast_moves() -> amble::config::Config {
    // Moves every 1 ms so still_serves never waits on the throttle.
    config(|c| {
        c.session.move_interval_ms = 1;
        c.room.tick_ms = 10;
    })
}

#[tokio::test]
async fn garbage_and_truncated_frames_close_with_1007() {
    let mut room = Room::new(TestServer::with(fast_moves()).await).await;
    for bytes in [vec![0xff, 0xff, 0xff, 0xff], {
        let whole = encode_client(C::Join(pb::Join {
            data: Vec::new(),
            start: None,
            room: "lobby".into(),
            name: "x".into(),
            token: String::new(),
            resume_token: String::new(),
        }));
        whole[..whole.len() - 3].to_vec()
    }] {
        let mut c = room.server.client().await;
        c.send_raw(Message::Binary(bytes.into())).await;
        let text = c.expect_error(ErrorCode::Malformed).await;
        assert!(text.contains("not a valid"), "{text}");
        assert_eq!(c.expect_close().await, 1007);
        room.still_serves().await;
    }
    assert_eq!(room.rejected("malformed").await, 2.0);
}

#[tokio::test]
async fn unknown_types_are_refused_but_the_connection_stays() {
    let mut room = Room::new(TestServer::with(fast_moves()).await).await;
    let mut c = room.server.client().await;
    // Field 9 of ClientMessage: a message type from the future.
    c.send_raw(Message::Binary(vec![0x4a, 0x02, 0x08, 0x01].into()))
        .await;
    c.expect_error(ErrorCode::UnknownMessage).await;
    c.send_raw(Message::Binary(Vec::new().into())).await;
    c.expect_error(ErrorCode::UnknownMessage).await;
    c.ping().await;
    room.still_serves().await;
    assert_eq!(room.rejected("unknown_message").await, 2.0);
}

#[tokio::test]
async fn text_frames_close_with_1003() {
    let mut room = Room::new(TestServer::with(fast_moves()).await).await;
    let mut c = room.server.client().await;
    c.send_raw(Message::Text("{\"join\":{}}".into())).await;
    c.expect_error(ErrorCode::TextFrame).await;
    assert_eq!(c.expect_close().await, 1003);
    room.still_serves().await;
    assert_eq!(room.rejected("text_frame").await, 1.0);
}

#[tokio::test]
async fn frames_over_the_limit_close_with_1009() {
    let mut room = Room::new(TestServer::with(fast_moves()).await).await;
    for size in [4_097, 100_000] {
        let mut c = room.server.client().await;
        c.send_raw(Message::Binary(vec![0u8; size].into())).await;
        let code = c.expect_close().await;
        assert_eq!(code, 1009, "frame of {size} bytes");
        room.still_serves().await;
    }
    assert_eq!(room.rejected("too_big").await, 2.0);
}

#[tokio::test]
async fn commands_out_of_order() {
    let mut room = Room::new(TestServer::with(fast_moves()).await).await;
    let mut c = room.server.client().await;
    c.send_move(1, 1, 1).await;
    c.expect_error(ErrorCode::NotJoined).await;
    c.send(C::Chat(pb::SendChat { text: "hi".into() })).await;
    c.expect_error(ErrorCode::NotJoined).await;
    c.send(C::Leave(pb::Leave {})).await;
    c.expect_error(ErrorCode::NotJoined).await;
    c.join("lobby", "late").await;
    c.send(C::Join(pb::Join {
        data: Vec::new(),
        start: None,
        room: "other".into(),
        name: "again".into(),
        token: String::new(),
        resume_token: String::new(),
    }))
    .await;
    let text = c.expect_error(ErrorCode::AlreadyJoined).await;
    assert!(text.contains("lobby"), "{text}");
    c.ping().await;
    room.still_serves().await;
    assert_eq!(room.rejected("not_joined").await, 3.0);
    assert_eq!(room.rejected("already_joined").await, 1.0);
}

#[tokio::test]
async fn bad_positions_and_speeds() {
    let mut room = Room::new(TestServer::with(fast_moves()).await).await;
    let (mut c, _) = room.server.joined("lobby", "sloppy").await;
    let walk = |tx, speed| Motion {
        position: Position { x: 0, y: 0 },
        walk: Some(Walk {
            target: Position { x: tx, y: 0 },
            speed,
        }),
    };
    let cases = [
        (
            Motion::standing(Position { x: 5_001, y: 0 }),
            ErrorCode::InvalidPosition,
        ),
        (
            Motion::standing(Position { x: 0, y: u32::MAX }),
            ErrorCode::InvalidPosition,
        ),
        (walk(6_000, 100), ErrorCode::InvalidPosition),
        (walk(10, 0), ErrorCode::InvalidSpeed),
        (walk(10, 1_001), ErrorCode::InvalidSpeed),
    ];
    for (motion, code) in cases {
        c.send(move_body(motion, 1, 0)).await;
        c.expect_error(code).await;
    }
    // A Move with no position at all.
    c.send(C::Move(pb::Move::default())).await;
    c.expect_error(ErrorCode::InvalidPosition).await;
    room.still_serves().await;
    assert_eq!(room.rejected("invalid_position").await, 4.0);
    assert_eq!(room.rejected("invalid_speed").await, 2.0);
    assert_eq!(
        room.server.metric("amble_moves_received_total").await,
        room.seq as f64
    );
}

#[tokio::test]
async fn bad_names_rooms_and_chat() {
    let mut room = Room::new(TestServer::with(fast_moves()).await).await;
    let mut c = room.server.client().await;
    let long = "n".repeat(33);
    for (r, n, code) in [
        ("lobby", "", ErrorCode::InvalidName),
        ("lobby", long.as_str(), ErrorCode::InvalidName),
        ("lobby", "bell\u{7}", ErrorCode::InvalidName),
        ("", "ok", ErrorCode::InvalidRoom),
        (long.as_str(), "ok", ErrorCode::InvalidRoom),
        ("two words", "ok", ErrorCode::InvalidRoom),
    ] {
        c.send(C::Join(pb::Join {
            data: Vec::new(),
            start: None,
            room: r.into(),
            name: n.into(),
            token: String::new(),
            resume_token: String::new(),
        }))
        .await;
        c.expect_error(code).await;
    }
    c.join("lobby", "chatty").await;
    for text in [String::new(), "x".repeat(281), "new\nline".into()] {
        c.send(C::Chat(pb::SendChat { text })).await;
        c.until(|m| match &m.body {
            Some(S::Error(e)) if e.code == ErrorCode::InvalidChat as i32 => Some(()),
            _ => None,
        })
        .await;
    }
    room.still_serves().await;
    assert_eq!(room.rejected("invalid_name").await, 3.0);
    assert_eq!(room.rejected("invalid_room").await, 3.0);
    assert_eq!(room.rejected("invalid_chat").await, 3.0);
}

#[tokio::test]
async fn chat_over_budget_is_dropped_with_an_error() {
    let mut room = Room::new(
        TestServer::with(config(|c| {
            c.session.move_interval_ms = 1;
            c.session.chat_burst = 2;
            c.session.chat_interval_ms = 60_000;
        }))
        .await,
    )
    .await;
    for i in 0..3 {
        room.mover
            .send(C::Chat(pb::SendChat {
                text: format!("m{i}"),
            }))
            .await;
    }
    let text = room
        .mover
        .until(|m| match &m.body {
            Some(S::Error(e)) if e.code == ErrorCode::RateLimited as i32 => Some(e.message.clone()),
            _ => None,
        })
        .await;
    assert!(text.contains("dropped"), "{text}");
    // The bystander saw the two within budget, not the third. The marker
    // is a move sent after the refusal: a relayed third chat would reach
    // the bystander before it (chats go out at once, moves at the next
    // tick, both in order on one stream), so every chat before it counts.
    room.seq += 1;
    let marker = room.seq;
    room.mover.send_move(marker, marker, marker).await;
    let mut seen = Vec::new();
    loop {
        let m = room.bystander.recv().await;
        if let Some(S::Chat(c)) = m.body {
            seen.push(c.text);
        } else if amble::protocol::decode_motion(&m.motion)
            .is_ok_and(|(_, records)| records.iter().any(|r| r.motion.position.x == marker))
        {
            break;
        }
    }
    assert_eq!(seen, ["m0", "m1"]);
    room.still_serves().await;
    assert_eq!(room.rejected("rate_limited").await, 1.0);
}

#[tokio::test]
async fn a_full_room_refuses_and_the_socket_stays() {
    let mut room = Room::new(
        TestServer::with(config(|c| {
            c.session.move_interval_ms = 1;
            c.room.room_capacity = 2;
        }))
        .await,
    )
    .await;
    let mut c = room.server.client().await;
    c.send(C::Join(pb::Join {
        data: Vec::new(),
        start: None,
        room: "lobby".into(),
        name: "third".into(),
        token: String::new(),
        resume_token: String::new(),
    }))
    .await;
    let text = c.expect_error(ErrorCode::RoomFull).await;
    assert!(text.contains("full"), "{text}");
    c.join("overflow", "third").await;
    room.still_serves().await;
    assert_eq!(room.rejected("room_full").await, 1.0);
}

#[tokio::test]
async fn the_connection_limit_refuses_with_1013_and_serves_the_rest() {
    let mut room = Room::new(
        TestServer::with(config(|c| {
            c.session.move_interval_ms = 1;
            c.max_connections = 2;
        }))
        .await,
    )
    .await;
    let mut extra = room.server.client().await;
    let text = extra.expect_error(ErrorCode::ServerFull).await;
    assert!(text.contains("try again"), "{text}");
    assert_eq!(extra.expect_close().await, 1013);
    room.still_serves().await;
    assert_eq!(room.rejected("server_full").await, 1.0);
    // A slot frees when a client leaves (the gauge falls after the slot is
    // released, so once it shows one connection a new one is served).
    drop(room.bystander);
    room.server
        .until_metric("amble_connections", |open| open <= 1.0)
        .await;
    let mut again = room.server.client().await;
    again.ping().await;
}

#[tokio::test]
async fn repeated_bad_input_is_a_flood() {
    let mut room = Room::new(TestServer::with(fast_moves()).await).await;
    let mut c = room.server.client().await;
    for _ in 0..40 {
        c.send_move(1, 1, 1).await; // NOT_JOINED, again and again
    }
    c.until(|m| match &m.body {
        Some(S::Error(e)) if e.code == ErrorCode::Flood as i32 => Some(()),
        _ => None,
    })
    .await;
    assert_eq!(c.expect_close().await, 1008);
    room.still_serves().await;
}

#[tokio::test]
async fn broken_websocket_framing_closes_with_1002() {
    use tokio::io::AsyncWriteExt as _;
    let mut room = Room::new(TestServer::with(fast_moves()).await).await;
    let mut c = room.server.client().await;
    // A client frame must be masked: this one is not.
    let tokio_tungstenite::MaybeTlsStream::Plain(tcp) = c.ws.get_mut() else {
        panic!("plain TCP expected")
    };
    tcp.write_all(&[0x82, 0x02, 0x22, 0x00])
        .await
        .expect("raw write");
    assert_eq!(c.expect_close().await, 1002);
    room.still_serves().await;
    assert_eq!(room.rejected("malformed").await, 1.0);
}

#[tokio::test]
async fn a_bad_websocket_handshake_is_refused_with_a_reason() {
    let server = TestServer::start().await;
    // A plain GET, as from a browser's address bar.
    let (status, body) = server.get("/ws").await;
    assert!(status.contains("426"), "{status}");
    assert!(body.contains("connect with a WebSocket client"), "{body}");

    let key = "dGhlIHNhbXBsZSBub25jZQ==";
    let upgrade = |extra: &str| {
        format!(
            "GET /ws HTTP/1.1\r\nHost: localhost\r\nConnection: Upgrade, close\r\n\
             Upgrade: websocket\r\n{extra}\r\n"
        )
    };
    let old = server
        .request(&upgrade(&format!(
            "Sec-WebSocket-Version: 8\r\nSec-WebSocket-Key: {key}\r\n"
        )))
        .await;
    assert!(old.starts_with("HTTP/1.1 426"), "{old}");
    assert!(old.contains("send Sec-WebSocket-Version: 13"), "{old}");
    assert!(
        old.to_ascii_lowercase()
            .contains("sec-websocket-version: 13\r\n"),
        "{old}"
    );
    let bad_key = server
        .request(&upgrade(
            "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: short\r\n",
        ))
        .await;
    assert!(bad_key.starts_with("HTTP/1.1 400"), "{bad_key}");
    assert!(bad_key.contains("16 random bytes"), "{bad_key}");
    let keyless = server
        .request(&upgrade("Sec-WebSocket-Version: 13\r\n"))
        .await;
    assert!(keyless.starts_with("HTTP/1.1 400"), "{keyless}");
    assert!(keyless.contains("missing Sec-WebSocket-Key"), "{keyless}");
    for (reason, count) in [
        ("not_websocket", 1.0),
        ("websocket_version", 1.0),
        ("key", 2.0),
    ] {
        let series = format!("amble_upgrades_refused_total{{reason=\"{reason}\"}}");
        assert_eq!(server.metric(&series).await, count, "{series}");
    }

    // The RFC 6455 sample key; no subprotocol offered, none chosen.
    let head = server
        .request_head(&format!(
            "GET /ws HTTP/1.1\r\nHost: localhost\r\nConnection: keep-alive, Upgrade\r\n\
             Upgrade: WebSocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: {key}\r\n\r\n"
        ))
        .await
        .to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 101"), "{head}");
    assert!(
        head.contains("sec-websocket-accept: s3pplmbitxaq9kygzzhzrbk+xoo="),
        "{head}"
    );
    assert!(!head.contains("sec-websocket-protocol"), "{head}");

    // And the server goes on serving.
    let (mut a, _) = server.joined("lobby", "a").await;
    a.ping().await;
}
