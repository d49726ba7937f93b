use super::*;
use pb::client_message::Body as C;
use pb::server_message::Body as S;
use proptest::prelude::*;

fn rules() -> Rules {
    Rules::default()
}

fn join(room: &str, name: &str) -> Vec<u8> {
    encode_client(C::Join(pb::Join {
        data: Vec::new(),
        start: None,
        room: room.into(),
        name: name.into(),
        token: String::new(),
        resume_token: String::new(),
    }))
}

fn mv(x: u32, y: u32, walk: Option<(u32, u32, u32)>) -> Vec<u8> {
    encode_client(C::Move(pb::Move {
        position: Some(pb::Position { x, y }),
        walk: walk.map(|(tx, ty, speed)| pb::Walk {
            target: Some(pb::Position { x: tx, y: ty }),
            speed,
        }),
        seq: 7,
        client_time_ms: 1,
    }))
}

fn code(frame: &[u8]) -> ErrorCode {
    decode_client(frame, &rules()).map_or_else(|e| e.code(), |c| panic!("accepted: {c:?}"))
}

#[test]
fn decodes_a_join() {
    assert_eq!(
        decode_client(&join("lobby", "Ada"), &rules()),
        Ok(Command::Join {
            resume_token: String::new(),
            room: "lobby".into(),
            name: "Ada".into(),
            token: String::new(),
            start: None,
            data: Data::default(),
        })
    );
}

/// Issue #19: a Join may carry where to appear, within the world.
#[test]
fn a_join_may_carry_a_start_within_the_world() {
    let at = |x, y| {
        encode_client(C::Join(pb::Join {
            data: Vec::new(),
            start: Some(pb::Position { x, y }),
            room: "lobby".into(),
            name: "Ada".into(),
            token: String::new(),
            resume_token: String::new(),
        }))
    };
    assert_eq!(
        decode_client(&at(120, 4_999), &rules()),
        Ok(Command::Join {
            resume_token: String::new(),
            room: "lobby".into(),
            name: "Ada".into(),
            token: String::new(),
            start: Some(Position { x: 120, y: 4_999 }),
            data: Data::default(),
        })
    );
    assert_eq!(code(&at(5_001, 10)), ErrorCode::InvalidPosition);
    assert_eq!(code(&at(10, 5_001)), ErrorCode::InvalidPosition);
}

#[test]
fn a_join_with_a_token_may_leave_the_name_to_it() {
    let with_token = |name: &str| {
        encode_client(C::Join(pb::Join {
            data: Vec::new(),
            start: None,
            room: "lobby".into(),
            name: name.into(),
            token: "a.b.c".into(),
            resume_token: String::new(),
        }))
    };
    assert_eq!(
        decode_client(&with_token(""), &rules()),
        Ok(Command::Join {
            resume_token: String::new(),
            room: "lobby".into(),
            name: String::new(),
            token: "a.b.c".into(),
            start: None,
            data: Data::default(),
        })
    );
    // A name that is sent is still checked.
    assert_eq!(code(&with_token("   ")), ErrorCode::InvalidName);
    // Without a token, an empty name is refused as before.
    assert_eq!(code(&join("lobby", "")), ErrorCode::InvalidName);
}

#[test]
fn rejects_bad_names_and_rooms() {
    assert_eq!(code(&join("lobby", "")), ErrorCode::InvalidName);
    assert_eq!(code(&join("lobby", "   ")), ErrorCode::InvalidName);
    assert_eq!(
        code(&join("lobby", &"n".repeat(33))),
        ErrorCode::InvalidName
    );
    assert_eq!(code(&join("lobby", "a\u{7}b")), ErrorCode::InvalidName);
    assert_eq!(code(&join("", "Ada")), ErrorCode::InvalidRoom);
    assert_eq!(code(&join(&"r".repeat(33), "Ada")), ErrorCode::InvalidRoom);
    assert_eq!(code(&join("a b", "Ada")), ErrorCode::InvalidRoom);
    assert_eq!(code(&join("lob\nby", "Ada")), ErrorCode::InvalidRoom);
    // 32 characters of a multi-byte script are fine for a display name.
    assert!(decode_client(&join("lobby", &"é".repeat(32)), &rules()).is_ok());
}

#[test]
fn decodes_moves_and_checks_bounds() {
    let ok = decode_client(&mv(5_000, 0, Some((10, 20, 140))), &rules());
    assert_eq!(
        ok,
        Ok(Command::Move {
            motion: Motion {
                position: Position { x: 5_000, y: 0 },
                walk: Some(Walk {
                    target: Position { x: 10, y: 20 },
                    speed: 140
                })
            },
            seq: 7
        })
    );
    assert_eq!(code(&mv(5_001, 0, None)), ErrorCode::InvalidPosition);
    assert_eq!(code(&mv(0, u32::MAX, None)), ErrorCode::InvalidPosition);
    assert_eq!(
        code(&mv(0, 0, Some((9_999, 0, 1)))),
        ErrorCode::InvalidPosition
    );
    assert_eq!(code(&mv(0, 0, Some((1, 1, 0)))), ErrorCode::InvalidSpeed);
    assert_eq!(
        code(&mv(0, 0, Some((1, 1, 1_001)))),
        ErrorCode::InvalidSpeed
    );
    let no_position = encode_client(C::Move(pb::Move::default()));
    assert_eq!(code(&no_position), ErrorCode::InvalidPosition);
}

#[test]
fn rejects_garbage_truncation_and_unknown_types() {
    assert_eq!(code(&[0xff, 0xff, 0xff]), ErrorCode::Malformed);
    let whole = join("lobby", "Ada");
    assert_eq!(code(&whole[..whole.len() - 2]), ErrorCode::Malformed);
    // Field 9 is no message this server knows: the body is empty.
    assert_eq!(code(&[0x4a, 0x00]), ErrorCode::UnknownMessage);
    assert_eq!(code(&[]), ErrorCode::UnknownMessage);
}

#[test]
fn checks_chat() {
    let chat = |t: &str| encode_client(C::Chat(pb::SendChat { text: t.into() }));
    assert!(decode_client(&chat("hello"), &rules()).is_ok());
    assert_eq!(code(&chat("")), ErrorCode::InvalidChat);
    assert_eq!(code(&chat(&"x".repeat(281))), ErrorCode::InvalidChat);
    assert_eq!(code(&chat("line\nbreak")), ErrorCode::InvalidChat);
}

#[test]
fn a_one_move_batch_is_eight_bytes() {
    let rec = MotionRecord {
        member: MemberId(3),
        motion: Motion::standing(Position { x: 2_500, y: 130 }),
    };
    let frame = encode_motion(motion_time(1_234_500, 100), &[rec]);
    // tag, length, time, head, x (2 bytes), y (2 bytes)
    assert_eq!(frame.len(), 8, "{frame:02x?}");
    let msg = pb::ServerMessage::decode(frame).expect("decodes");
    assert_eq!(msg.body, None);
    assert_eq!(
        decode_motion(&msg.motion),
        Ok((1_234_500 / 100 % 128, vec![rec]))
    );
}

#[test]
fn motion_decoding_rejects_truncated_records() {
    assert_eq!(decode_motion(&[]), Err(MotionError::Empty));
    assert_eq!(decode_motion(&[1, 4, 10]), Err(MotionError::Truncated));
    assert_eq!(
        decode_motion(&[1, 5, 10, 10, 1]),
        Err(MotionError::Truncated)
    );
    assert_eq!(decode_motion(&[1]), Ok((1, vec![])));
}

#[test]
fn resolves_truncated_times_across_the_wrap() {
    let unit = 100;
    // Tick 12_799 (mod 128 = 127) seen when the receiver thinks it is 12_801.
    let t = 12_799 * 100;
    assert_eq!(
        resolve_motion_time(motion_time(t, unit), unit, 12_801 * 100),
        t
    );
    // And the other way round: tick 12_801 seen at an estimate of 12_799.
    let t = 12_801 * 100;
    assert_eq!(
        resolve_motion_time(motion_time(t, unit), unit, 12_799 * 100),
        t
    );
    assert_eq!(resolve_motion_time(5, unit, 0), 500);
}

fn arb_position() -> impl Strategy<Value = Position> {
    (0u32..=5_000, 0u32..=5_000).prop_map(|(x, y)| Position { x, y })
}

fn arb_motion() -> impl Strategy<Value = Motion> {
    (
        arb_position(),
        proptest::option::of((arb_position(), 1u32..=1_000)),
    )
        .prop_map(|(position, walk)| Motion {
            position,
            walk: walk.map(|(target, speed)| Walk { target, speed }),
        })
}

proptest! {
    #[test]
    fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = decode_client(&bytes, &rules());
    }

    #[test]
    fn moves_round_trip(motion in arb_motion(), seq in any::<u32>()) {
        let frame = encode_client(move_body(motion, seq, 9));
        prop_assert_eq!(decode_client(&frame, &rules()), Ok(Command::Move { motion, seq }));
    }

    #[test]
    fn motion_batches_round_trip(
        time in 0u32..128,
        moves in proptest::collection::vec((0u32..500, arb_motion()), 0..40),
    ) {
        let records: Vec<_> = moves
            .into_iter()
            .map(|(id, motion)| MotionRecord { member: MemberId(id), motion })
            .collect();
        let frame = encode_motion(time, &records);
        let msg = pb::ServerMessage::decode(frame).expect("decodes");
        prop_assert_eq!(decode_motion(&msg.motion), Ok((time, records)));
    }

    #[test]
    fn resolution_recovers_any_time_within_half_a_window(
        tick in 1_000u64..10_000_000,
        skew in -63i64..=63,
        unit in 1u32..1_000,
    ) {
        let t = tick * u64::from(unit);
        let estimate = t.saturating_add_signed(skew * i64::from(unit));
        prop_assert_eq!(resolve_motion_time(motion_time(t, unit), unit, estimate), t);
    }
}

// ------------------------------------------------------------ test vectors

/// The shared vectors: every message type, as bytes and as JSON. The
/// JavaScript codec (web/test/codec.test.js) decodes each and re-encodes it
/// byte for byte.
fn entry(key: &str, value: &str) -> pb::DataEntry {
    pb::DataEntry {
        key: key.into(),
        value: value.into(),
    }
}

fn vectors() -> Vec<(&'static str, &'static str, Vec<u8>, serde_json::Value)> {
    fn client(
        name: &'static str,
        body: C,
    ) -> (&'static str, &'static str, Vec<u8>, serde_json::Value) {
        let msg = pb::ClientMessage { body: Some(body) };
        let json = serde_json::to_value(&msg).expect("serialisable");
        (name, "ClientMessage", msg.encode_to_vec(), json)
    }
    fn server(
        name: &'static str,
        msg: pb::ServerMessage,
    ) -> (&'static str, &'static str, Vec<u8>, serde_json::Value) {
        let json = serde_json::to_value(&msg).expect("serialisable");
        (name, "ServerMessage", msg.encode_to_vec(), json)
    }
    fn body(b: S) -> pb::ServerMessage {
        pb::ServerMessage {
            body: Some(b),
            motion: vec![],
        }
    }
    let walker = pb::Member {
        id: 2,
        name: "Bó".into(),
        position: Some(pb::Position { x: 100, y: 4_900 }),
        walk: Some(pb::Walk {
            target: Some(pb::Position { x: 2_500, y: 2_500 }),
            speed: 140,
        }),
        moved_at_ms: 1_764_600_000_100,
        ..Default::default()
    };
    let stander = pb::Member {
        id: 0,
        name: "Ada".into(),
        position: Some(pb::Position { x: 0, y: 0 }),
        walk: None,
        moved_at_ms: 1_764_600_000_000,
        ..Default::default()
    };
    let snapshot = pb::Snapshot {
        server_time_ms: 1_764_600_000_250,
        members: vec![stander.clone(), walker.clone()],
    };
    let limits = pb::Limits {
        move_interval_ms: 1_000,
        move_burst: 2,
        tick_ms: 100,
        motion_time_unit_ms: 100,
        world_width: 5_000,
        world_height: 5_000,
        max_speed: 1_000,
        max_message_bytes: 4_096,
        max_name_chars: 32,
        max_chat_chars: 280,
        room_capacity: 500,
        chat_interval_ms: 2_000,
        chat_burst: 5,
        max_data_entries: 8,
        max_data_bytes: 512,
        max_data_value_chars: 200,
        data_interval_ms: 1_000,
        data_burst: 3,
        resume_grace_ms: 0,
        interest_radius: 0,
        interest_cell: 0,
        interest_margin: 0,
    };
    let batch = |records: &[MotionRecord]| {
        let frame = encode_motion(motion_time(1_764_600_000_300, 100), records);
        pb::ServerMessage::decode(frame).expect("decodes")
    };
    vec![
        client(
            "join",
            C::Join(pb::Join {
                data: Vec::new(),
                start: None,
                room: "lobby".into(),
                name: "Ada Lovelace".into(),
                token: String::new(),
                resume_token: String::new(),
            }),
        ),
        client(
            "join_start",
            C::Join(pb::Join {
                data: Vec::new(),
                start: Some(pb::Position { x: 2_500, y: 130 }),
                room: "lobby".into(),
                name: "Ada".into(),
                token: String::new(),
                resume_token: String::new(),
            }),
        ),
        client(
            "join_unicode",
            C::Join(pb::Join {
                data: Vec::new(),
                start: None,
                room: "café-2".replace('é', "e"),
                name: "Zoë 🌿".into(),
                token: String::new(),
                resume_token: String::new(),
            }),
        ),
        client(
            "join_token",
            C::Join(pb::Join {
                data: Vec::new(),
                start: None,
                room: "team-blue".into(),
                name: String::new(),
                // The shape of a JWT; the codec carries it as an opaque string.
                token: "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ1LTEiLCJleHAiOjE3NjQ2MDM2MDB9.c2lnbmF0dXJl"
                    .into(),
                resume_token: String::new(),
            }),
        ),
        client(
            "move_standing",
            C::Move(pb::Move {
                position: Some(pb::Position { x: 1_234, y: 4_321 }),
                walk: None,
                seq: 1,
                client_time_ms: 1_764_600_000_000,
            }),
        ),
        client(
            "move_walk",
            C::Move(pb::Move {
                position: Some(pb::Position { x: 0, y: 5_000 }),
                walk: Some(pb::Walk {
                    target: Some(pb::Position { x: 5_000, y: 0 }),
                    speed: 1_000,
                }),
                seq: 300,
                client_time_ms: 1_764_600_000_500,
            }),
        ),
        client(
            "move_at_origin",
            C::Move(pb::Move {
                position: Some(pb::Position { x: 0, y: 0 }),
                walk: None,
                seq: 0,
                client_time_ms: 0,
            }),
        ),
        client(
            "chat",
            C::Chat(pb::SendChat {
                text: "hello, room 👋".into(),
            }),
        ),
        client(
            "ping",
            C::Ping(pb::Ping {
                client_time_ms: 1_764_600_000_000,
            }),
        ),
        client("leave", C::Leave(pb::Leave {})),
        client(
            "join_data",
            C::Join(pb::Join {
                data: vec![entry("colour", "#e4572e"), entry("status", "busy 🎧")],
                start: None,
                room: "lobby".into(),
                name: "Ada".into(),
                token: String::new(),
                resume_token: String::new(),
            }),
        ),
        client(
            "set_data",
            C::SetData(pb::SetData {
                data: vec![entry("status", "presenting"), entry("colour", "")],
            }),
        ),
        server(
            "member_data",
            body(S::MemberData(pb::MemberData {
                member_id: 3,
                data: vec![entry("colour", "#2e86ab"), entry("status", "available")],
            })),
        ),
        server(
            "joined_data_user",
            body(S::Joined(pb::Joined {
                member: Some(pb::Member {
                    id: 5,
                    name: "Grace".into(),
                    position: Some(pb::Position { x: 700, y: 800 }),
                    walk: None,
                    moved_at_ms: 1_764_600_000_200,
                    data: vec![entry("role", "host"), entry("status", "busy")],
                    user: "user-42".into(),
                }),
            })),
        ),
        server(
            "error_invalid_data",
            body(S::Error(pb::Error {
                code: ErrorCode::InvalidData as i32,
                message: "invalid data: key \"Colour\": keys take only a-z, 0-9, '_', '.' and '-'"
                    .into(),
            })),
        ),
        server(
            "welcome",
            body(S::Welcome(pb::Welcome {
                member_id: 2,
                room: "lobby".into(),
                limits: Some(limits),
                snapshot: Some(snapshot.clone()),
                server_version: "0.1.0".into(),
                protocol_revision: 2,
                token_expires_at_ms: 0,
                resume_token: String::new(),
                resumed: false,
                population: 0,
            })),
        ),
        server(
            "welcome_token",
            body(S::Welcome(pb::Welcome {
                member_id: 4,
                room: "lobby".into(),
                limits: Some(limits),
                snapshot: Some(snapshot.clone()),
                server_version: "0.1.0".into(),
                protocol_revision: 3,
                token_expires_at_ms: 1_764_600_600_000,
                resume_token: String::new(),
                resumed: false,
                population: 0,
            })),
        ),
        client(
            "refresh_token",
            C::Refresh(pb::RefreshToken {
                token: "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ1LTEiLCJleHAiOjE3NjQ2MDEyMDB9.c2ln".into(),
            }),
        ),
        server(
            "token_expiring",
            body(S::TokenExpiring(pb::TokenExpiring {
                expires_at_ms: 1_764_600_600_000,
            })),
        ),
        server(
            "token_refreshed",
            body(S::TokenRefreshed(pb::TokenRefreshed {
                expires_at_ms: 1_764_601_200_000,
            })),
        ),
        server(
            "token_refreshed_open",
            body(S::TokenRefreshed(pb::TokenRefreshed { expires_at_ms: 0 })),
        ),
        server(
            "error_token_expired",
            body(S::Error(pb::Error {
                code: ErrorCode::TokenExpired as i32,
                message: "your token expired and was not refreshed: join again with a fresh one"
                    .into(),
            })),
        ),
        client(
            "join_resume",
            C::Join(pb::Join {
                start: None,
                data: vec![],
                room: "lobby".into(),
                name: "Ada".into(),
                token: String::new(),
                resume_token: "q2Vx0bTf3kYc8mWnL5pA7g".into(),
            }),
        ),
        server(
            "welcome_resumed",
            body(S::Welcome(pb::Welcome {
                member_id: 4,
                room: "lobby".into(),
                limits: Some(pb::Limits {
                    resume_grace_ms: 10_000,
                    ..limits
                }),
                snapshot: Some(snapshot.clone()),
                server_version: "0.1.0".into(),
                protocol_revision: 4,
                token_expires_at_ms: 0,
                resume_token: "Zk3m9QpR2sT7vW1xY5aB0c".into(),
                resumed: true,
                population: 0,
            })),
        ),
        server(
            "welcome_spatial",
            body(S::Welcome(pb::Welcome {
                member_id: 17,
                room: "plaza".into(),
                limits: Some(pb::Limits {
                    world_width: 50_000,
                    world_height: 50_000,
                    room_capacity: 20_000,
                    interest_radius: 1_500,
                    interest_cell: 1_874,
                    interest_margin: 187,
                    ..limits
                }),
                snapshot: Some(snapshot.clone()),
                server_version: "0.1.0".into(),
                protocol_revision: 5,
                token_expires_at_ms: 0,
                resume_token: String::new(),
                resumed: false,
                population: 9_412,
            })),
        ),
        server(
            "appeared",
            body(S::Appeared(pb::Appeared {
                members: snapshot.members.clone(),
            })),
        ),
        server(
            "disappeared",
            body(S::Disappeared(pb::Disappeared {
                member_ids: vec![3, 300, 70_001],
            })),
        ),
        client(
            "find",
            C::Find(pb::Find {
                prefix: "ad".into(),
                cursor: 41,
            }),
        ),
        server(
            "found",
            body(S::Found(pb::Found {
                prefix: "ad".into(),
                members: snapshot.members.clone(),
                next_cursor: 57,
                total: 212,
            })),
        ),
        server(
            "population",
            body(S::Population(pb::Population { members: 9_413 })),
        ),
        server(
            "renumbered",
            body(S::Renumbered(pb::Renumbered {
                old_id: 4,
                new_id: 70_001,
            })),
        ),
        server(
            "system",
            body(S::System(pb::SystemMessage {
                text: "The doors close in 5 minutes.".into(),
                server_time_ms: 1_764_600_000_500,
                direct: false,
            })),
        ),
        server(
            "system_direct",
            body(S::System(pb::SystemMessage {
                text: "Your session is being recorded.".into(),
                server_time_ms: 1_764_600_000_600,
                direct: true,
            })),
        ),
        server(
            "error_kicked",
            body(S::Error(pb::Error {
                code: ErrorCode::Kicked as i32,
                message: "removed by the app: spamming".into(),
            })),
        ),
        server(
            "error_banned",
            body(S::Error(pb::Error {
                code: ErrorCode::Banned as i32,
                message: "banned for 3600 s: harassment".into(),
            })),
        ),
        server(
            "error_muted",
            body(S::Error(pb::Error {
                code: ErrorCode::Muted as i32,
                message: "muted for 60 s: chat refused".into(),
            })),
        ),
        server(
            "error_room_closed",
            body(S::Error(pb::Error {
                code: ErrorCode::RoomClosed as i32,
                message: "the app closed the room".into(),
            })),
        ),
        server(
            "left_room_closed",
            body(S::Left(pb::Left {
                member_id: 3,
                reason: LeaveReason::RoomClosed as i32,
            })),
        ),
        server(
            "joined",
            body(S::Joined(pb::Joined {
                member: Some(walker),
            })),
        ),
        server(
            "left",
            body(S::Left(pb::Left {
                member_id: 3,
                reason: LeaveReason::TimedOut as i32,
            })),
        ),
        server(
            "chat",
            body(S::Chat(pb::ChatMessage {
                member_id: 0,
                text: "hi 👋".into(),
                server_time_ms: 1_764_600_000_400,
            })),
        ),
        server(
            "pong",
            body(S::Pong(pb::Pong {
                client_time_ms: 17,
                server_time_ms: 1_764_600_000_450,
            })),
        ),
        server(
            "left_replaced",
            body(S::Left(pb::Left {
                member_id: 4,
                reason: LeaveReason::Replaced as i32,
            })),
        ),
        server(
            "left_server_lost",
            body(S::Left(pb::Left {
                member_id: 129,
                reason: LeaveReason::ServerLost as i32,
            })),
        ),
        server(
            "error",
            body(S::Error(pb::Error {
                code: ErrorCode::RoomFull as i32,
                message: "room lobby is full (500 members)".into(),
            })),
        ),
        server(
            "error_unauthenticated",
            body(S::Error(pb::Error {
                code: ErrorCode::Unauthenticated as i32,
                message: "token expired".into(),
            })),
        ),
        server(
            "error_forbidden",
            body(S::Error(pb::Error {
                code: ErrorCode::Forbidden as i32,
                message: "the token does not allow room lobby".into(),
            })),
        ),
        server(
            "error_replaced",
            body(S::Error(pb::Error {
                code: ErrorCode::Replaced as i32,
                message: "you joined lobby from another connection".into(),
            })),
        ),
        server("resync", body(S::Resync(snapshot))),
        server(
            "motion_one",
            batch(&[MotionRecord {
                member: MemberId(3),
                motion: Motion::standing(Position { x: 2_500, y: 130 }),
            }]),
        ),
        server(
            "motion_mixed",
            batch(&[
                MotionRecord {
                    member: MemberId(0),
                    motion: Motion::standing(Position { x: 5_000, y: 5_000 }),
                },
                MotionRecord {
                    member: MemberId(70),
                    motion: Motion {
                        position: Position { x: 1, y: 2 },
                        walk: Some(Walk {
                            target: Position { x: 4_000, y: 3_000 },
                            speed: 140,
                        }),
                    },
                },
                MotionRecord {
                    member: MemberId(499),
                    motion: Motion::standing(Position { x: 127, y: 128 }),
                },
            ]),
        ),
    ]
}

fn fnv1a64(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Fails when `web/test/vectors.json` differs from what this schema and
/// codec produce. `AMBLE_UPDATE_VECTORS=1 cargo test vectors` rewrites it.
#[test]
fn shared_vectors_match_the_schema() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let schema = std::fs::read(root.join("proto/amble/v1/amble.proto")).expect("schema");
    let vectors: Vec<_> = vectors()
        .into_iter()
        .map(|(name, ty, bytes, json)| {
            serde_json::json!({ "name": name, "type": ty, "hex": hex(&bytes), "json": json })
        })
        .collect();
    let doc = serde_json::json!({
        "schema": "proto/amble/v1/amble.proto",
        "schema_fnv1a64": format!("{:016x}", fnv1a64(&schema)),
        // The revision this server speaks; web/test/codec.test.js checks
        // that web/codec.js speaks the same.
        "protocol_revision": super::PROTOCOL_REVISION,
        "note": "Generated by src/protocol/tests.rs; AMBLE_UPDATE_VECTORS=1 cargo test vectors rewrites it.",
        "vectors": vectors,
    });
    let text = serde_json::to_string_pretty(&doc).expect("json") + "\n";
    let path = root.join("web/test/vectors.json");
    if std::env::var_os("AMBLE_UPDATE_VECTORS").is_some() {
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(&path, &text).expect("write vectors");
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == text,
        "web/test/vectors.json is out of date with the schema or codec; \
         run `AMBLE_UPDATE_VECTORS=1 cargo test vectors` and update web/amble.js to match"
    );
}

#[test]
fn every_vector_decodes_with_prost() {
    for (name, ty, bytes, _) in vectors() {
        match ty {
            "ClientMessage" => {
                let cmd = decode_client(&bytes, &rules());
                assert!(cmd.is_ok(), "{name}: {cmd:?}");
            }
            _ => {
                let msg = pb::ServerMessage::decode(bytes.as_slice());
                assert!(msg.is_ok(), "{name}");
            }
        }
    }
}

// ------------------------------------------------------------ member data

fn join_with(data: Vec<pb::DataEntry>) -> Vec<u8> {
    encode_client(C::Join(pb::Join {
        data,
        start: None,
        room: "lobby".into(),
        name: "Ada".into(),
        token: String::new(),
        resume_token: String::new(),
    }))
}

fn set(data: Vec<pb::DataEntry>) -> Vec<u8> {
    encode_client(C::SetData(pb::SetData { data }))
}

fn data_error(frame: &[u8]) -> String {
    match decode_client(frame, &rules()) {
        Err(err @ DecodeError::InvalidData(_)) => err.to_string(),
        other => panic!("expected InvalidData, got {other:?}"),
    }
}

/// Issue #19: a Join's data is checked, and kept sorted by key.
#[test]
fn a_join_carries_its_data_sorted_by_key() {
    let got = decode_client(
        &join_with(vec![entry("status", "busy"), entry("colour", "#e4572e")]),
        &rules(),
    );
    let Ok(Command::Join { data, .. }) = got else {
        panic!("expected a Join, got {got:?}");
    };
    assert_eq!(
        data.entries(),
        [
            ("colour".to_owned(), "#e4572e".to_owned()),
            ("status".to_owned(), "busy".to_owned())
        ]
    );
    assert_eq!(data.get("status"), Some("busy"));
    assert_eq!(data.bytes(), 6 + 7 + 6 + 4);
}

#[test]
fn keys_are_1_to_32_characters_of_lowercase_digits_and_three_marks() {
    let ok = "a".repeat(32);
    for key in ["a", "z9", "x_y.z-0", ok.as_str()] {
        assert!(
            decode_client(&join_with(vec![entry(key, "v")]), &rules()).is_ok(),
            "{key}"
        );
    }
    assert_eq!(
        data_error(&join_with(vec![entry("", "v")])),
        "invalid data: key \"\": empty key"
    );
    assert_eq!(
        data_error(&join_with(vec![entry(&"a".repeat(33), "v")])),
        format!(
            "invalid data: key {:?}: key longer than 32 characters",
            "a".repeat(32)
        )
    );
    for bad in ["Colour", "a b", "ключ", "a/b", "a:b"] {
        assert_eq!(
            data_error(&join_with(vec![entry(bad, "v")])),
            format!("invalid data: key {bad:?}: keys take only a-z, 0-9, '_', '.' and '-'"),
        );
    }
    assert_eq!(
        code(&join_with(vec![entry("Colour", "v")])),
        ErrorCode::InvalidData
    );
}

#[test]
fn values_follow_the_text_rule_up_to_max_data_value_chars() {
    let at_limit = "é".repeat(200);
    assert!(decode_client(&join_with(vec![entry("k", &at_limit)]), &rules()).is_ok());
    assert_eq!(
        data_error(&join_with(vec![entry("k", &"é".repeat(201))])),
        "invalid data: key \"k\": the value is refused: too long (values are 1 to 200 \
         characters of text)"
    );
    // A Join's value is never empty (SetData's empty value removes).
    assert_eq!(
        data_error(&join_with(vec![entry("k", "")])),
        "invalid data: key \"k\": the value is refused: empty (values are 1 to 200 \
         characters of text)"
    );
    for bad in ["a\u{0}b", "x\u{202E}y", "\u{3000}"] {
        assert_eq!(
            code(&join_with(vec![entry("k", bad)])),
            ErrorCode::InvalidData,
            "{bad:?}"
        );
    }
    // Normalised like names: NFC.
    let got = decode_client(&join_with(vec![entry("k", "e\u{301}")]), &rules());
    let Ok(Command::Join { data, .. }) = got else {
        panic!("{got:?}");
    };
    assert_eq!(data.get("k"), Some("\u{e9}"));
}

#[test]
fn a_join_keeps_to_the_entry_and_byte_limits() {
    let n = |count: usize| -> Vec<pb::DataEntry> {
        (0..count).map(|i| entry(&format!("k{i}"), "v")).collect()
    };
    assert!(decode_client(&join_with(n(8)), &rules()).is_ok());
    assert_eq!(
        data_error(&join_with(n(9))),
        "invalid data: 9 entries: at most 8 are allowed"
    );
    // 512 bytes together: "a" + 200 and "b" + 200 and "c" + 109 = 512.
    let full = vec![
        entry("a", &"x".repeat(200)),
        entry("b", &"x".repeat(200)),
        entry("c", &"x".repeat(109)),
    ];
    assert!(decode_client(&join_with(full.clone()), &rules()).is_ok());
    let mut over = full;
    over[2].value.push('x');
    assert_eq!(
        data_error(&join_with(over)),
        "invalid data: 513 bytes of keys and values: at most 512 are allowed"
    );
    assert_eq!(
        data_error(&join_with(vec![entry("k", "1"), entry("k", "2")])),
        "invalid data: key \"k\" appears twice"
    );
}

#[test]
fn set_data_decodes_sets_and_removals_sorted_by_key() {
    assert_eq!(
        decode_client(
            &set(vec![entry("status", "busy"), entry("colour", "")]),
            &rules()
        ),
        Ok(Command::SetData {
            changes: vec![
                ("colour".into(), None),
                ("status".into(), Some("busy".into()))
            ],
        })
    );
    assert_eq!(
        decode_client(&set(vec![]), &rules()),
        Ok(Command::SetData { changes: vec![] })
    );
    assert_eq!(
        data_error(&set(vec![entry("a", "1"), entry("a", "")])),
        "invalid data: key \"a\" appears twice"
    );
    assert_eq!(code(&set(vec![entry("A", "1")])), ErrorCode::InvalidData);
    assert_eq!(code(&set(vec![entry("a", " ")])), ErrorCode::InvalidData);
    // At most twice max_data_entries changes: 16 pass, 17 do not.
    let n = |count: usize| -> Vec<pb::DataEntry> {
        (0..count).map(|i| entry(&format!("k{i}"), "")).collect()
    };
    assert!(decode_client(&set(n(16)), &rules()).is_ok());
    assert_eq!(
        data_error(&set(n(17))),
        "invalid data: 17 entries: at most 16 are allowed"
    );
}

fn data(entries: &[(&str, &str)]) -> Data {
    Data::check(entries.iter().map(|(k, v)| entry(k, v)).collect(), &rules()).expect("valid data")
}

fn changes(entries: &[(&str, Option<&str>)]) -> Changes {
    entries
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.map(str::to_owned)))
        .collect()
}

#[test]
fn merging_sets_replaces_and_removes() {
    let now = data(&[("colour", "red"), ("status", "busy")]);
    let none = Data::default();
    let next = now
        .merged(
            &changes(&[
                ("colour", None),
                ("mood", Some("ok")),
                ("status", Some("free")),
            ]),
            &none,
            &rules(),
        )
        .expect("merges");
    assert_eq!(next, data(&[("mood", "ok"), ("status", "free")]));
    // Removing a key that is not there changes nothing.
    assert_eq!(
        now.merged(&changes(&[("gone", None)]), &none, &rules()),
        Ok(now.clone())
    );
}

#[test]
fn merging_keeps_to_the_limits() {
    let eight = Data::check(
        (0..8).map(|i| entry(&format!("k{i}"), "v")).collect(),
        &rules(),
    )
    .expect("eight");
    let none = Data::default();
    assert_eq!(
        eight.merged(&changes(&[("k9", Some("v"))]), &none, &rules()),
        Err(DataError::TooMany { count: 9, max: 8 })
    );
    // Replacing or removing is fine at the limit.
    assert!(
        eight
            .merged(
                &changes(&[("k0", Some("w")), ("k1", None)]),
                &none,
                &rules()
            )
            .is_ok()
    );
    let big = data(&[("a", &"x".repeat(200)), ("b", &"x".repeat(200))]);
    assert_eq!(
        big.merged(&changes(&[("c", Some(&"x".repeat(110)))]), &none, &rules()),
        Err(DataError::TooBig {
            bytes: 513,
            max: 512
        })
    );
    assert!(
        big.merged(&changes(&[("c", Some(&"x".repeat(109)))]), &none, &rules())
            .is_ok()
    );
}

#[test]
fn keys_the_token_set_cannot_change() {
    let claimed = data(&[("role", "host")]);
    let now = data(&[("role", "host"), ("status", "busy")]);
    let refused = now.merged(&changes(&[("role", Some("guest"))]), &claimed, &rules());
    assert_eq!(refused, Err(DataError::Claimed { key: "role".into() }));
    assert_eq!(
        refused.unwrap_err().to_string(),
        "key \"role\": set by the token, it cannot change"
    );
    assert!(
        now.merged(&changes(&[("role", None)]), &claimed, &rules())
            .is_err()
    );
    assert!(
        now.merged(&changes(&[("status", None)]), &claimed, &rules())
            .is_ok()
    );
}

#[test]
fn a_token_claim_wins_over_the_join_key_by_key() {
    let claimed = data(&[("role", "host")]);
    let asked = data(&[("colour", "red"), ("role", "guest")]);
    assert_eq!(
        Data::with_claims(asked, &claimed, &rules()),
        Ok(data(&[("colour", "red"), ("role", "host")]))
    );
    // Together they must keep to the limits.
    let asked = Data::check(
        (0..8).map(|i| entry(&format!("k{i}"), "v")).collect(),
        &rules(),
    )
    .expect("eight");
    assert_eq!(
        Data::with_claims(asked, &claimed, &rules()),
        Err(DataError::TooMany { count: 9, max: 8 })
    );
}

#[test]
fn member_data_encodes_in_key_order() {
    let d = data(&[("b", "2"), ("a", "1")]);
    assert_eq!(d.to_pb(), vec![entry("a", "1"), entry("b", "2")]);
}

#[test]
fn decodes_a_refresh_token_as_sent_even_when_empty() {
    for token in ["a.b.c", ""] {
        let frame = encode_client(C::Refresh(pb::RefreshToken {
            token: token.into(),
        }));
        assert_eq!(
            decode_client(&frame, &rules()),
            Ok(Command::RefreshToken {
                token: token.into()
            })
        );
    }
}

#[test]
fn a_walk_is_where_its_speed_took_it_and_stops_at_its_target() {
    let m = Motion {
        position: Position { x: 100, y: 100 },
        walk: Some(Walk {
            target: Position { x: 400, y: 500 },
            speed: 100,
        }),
    };
    assert_eq!(m.at(0), Position { x: 100, y: 100 });
    // 500 cm long: after 2.5 s, 250 cm along (3/5 in x, 4/5 in y).
    assert_eq!(m.at(2_500), Position { x: 250, y: 300 });
    assert_eq!(m.at(5_000), Position { x: 400, y: 500 });
    assert_eq!(m.at(60_000), Position { x: 400, y: 500 });
    let standing = Motion::standing(Position { x: 7, y: 9 });
    assert_eq!(standing.at(10_000), Position { x: 7, y: 9 });
}
