use super::*;

fn rules() -> Rules {
    Rules::default()
}

fn me(node: &str, slot: u32) -> cpb::Origin {
    cpb::Origin {
        node: node.into(),
        epoch: 42,
        slot,
        slots: 16,
    }
}

fn member(id: u32, x: u32) -> pb::Member {
    pb::Member {
        id,
        name: "Ada".into(),
        position: Some(pb::Position { x, y: 10 }),
        walk: None,
        moved_at_ms: 5,
        ..Default::default()
    }
}

fn walk(id: u32) -> MotionRecord {
    MotionRecord {
        member: MemberId(id),
        motion: Motion {
            position: Position { x: 1, y: 2 },
            walk: Some(Walk {
                target: Position { x: 3, y: 4 },
                speed: 140,
            }),
        },
    }
}

#[test]
fn an_update_round_trips() {
    let records = [walk(17), walk(33)];
    let bytes = encode_update(
        &me("n1", 1),
        UpdateParts {
            incarnation: 3,
            seq: 9,
            tick_ms: 1_000,
            ops: vec![
                joined_op(member(1, 100), 5),
                chat_op(pb::ChatMessage {
                    member_id: 1,
                    text: "hi".into(),
                    server_time_ms: 7,
                }),
                left_op(MemberId(17), LeaveReason::Left),
            ],
            motion: &records,
            ..Default::default()
        },
    );
    let u = decode_update(&bytes, 16, &rules()).expect("valid");
    assert_eq!(u.origin.node.as_ref(), "n1");
    assert_eq!(u.origin.incarnation, 3);
    assert_eq!(
        (u.seq, u.full, u.tick_ms, u.closed),
        (9, false, 1_000, false)
    );
    assert_eq!(u.motion, records);
    assert_eq!(u.ops.len(), 3);
    assert!(
        matches!(&u.ops[0], Op::Joined(m) if m.id == MemberId(1) && m.seat == 5 && m.name == "Ada")
    );
    assert!(matches!(&u.ops[1], Op::Chat { id, text, .. } if *id == MemberId(1) && text == "hi"));
    assert_eq!(
        u.ops[2],
        Op::Left {
            id: MemberId(17),
            reason: LeaveReason::Left,
            handed_over: false,
        }
    );
}

fn one(op: cpb::Op) -> Bytes {
    encode_update(
        &me("n1", 1),
        UpdateParts {
            seq: 1,
            ops: vec![op],
            ..Default::default()
        },
    )
}

#[test]
fn ids_outside_the_senders_slot_are_refused() {
    let err = decode_update(&one(joined_op(member(2, 1), 0)), 16, &rules()).unwrap_err();
    assert!(matches!(err, WireError::Member(_)), "{err}");
    let err = decode_update(&one(left_op(MemberId(0), LeaveReason::Left)), 16, &rules());
    assert!(err.is_err());
    let records = [walk(2)];
    let bytes = encode_update(
        &me("n1", 1),
        UpdateParts {
            motion: &records,
            ..Default::default()
        },
    );
    assert!(decode_update(&bytes, 16, &rules()).is_err());
}

#[test]
fn member_data_is_range_checked_like_client_input() {
    let outside = member(1, 5_001);
    assert!(decode_update(&one(joined_op(outside, 0)), 16, &rules()).is_err());
    let mut fast = member(1, 1);
    fast.walk = Some(pb::Walk {
        target: Some(pb::Position { x: 1, y: 1 }),
        speed: 1_001,
    });
    assert!(decode_update(&one(joined_op(fast, 0)), 16, &rules()).is_err());
    let mut blank = member(1, 1);
    blank.name = "   ".into();
    assert!(decode_update(&one(joined_op(blank, 0)), 16, &rules()).is_err());
    let chat = chat_op(pb::ChatMessage {
        member_id: 1,
        text: "x".repeat(281),
        server_time_ms: 0,
    });
    assert!(decode_update(&one(chat), 16, &rules()).is_err());
    let bad_reason = cpb::Op {
        op: Some(cpb::op::Op::Left(pb::Left {
            member_id: 1,
            reason: 99,
        })),
        ..Default::default()
    };
    assert!(decode_update(&one(bad_reason), 16, &rules()).is_err());
    let truncated = seal(Body::Update(cpb::RoomUpdate {
        origin: Some(me("n1", 1)),
        motion: vec![3, 1],
        ..Default::default()
    }));
    assert_eq!(
        decode_update(&truncated, 16, &rules()).unwrap_err(),
        WireError::Member("bad motion")
    );
}

#[test]
fn origins_are_checked() {
    assert_eq!(
        decode_update(&one(joined_op(member(1, 1), 0)), 8, &rules()).unwrap_err(),
        WireError::Slots {
            ours: 8,
            theirs: 16
        }
    );
    for node in ["", "a.b", "a b", &"x".repeat(65)] {
        let bytes = encode_update(&me(node, 1), UpdateParts::default());
        assert_eq!(
            decode_update(&bytes, 16, &rules()).unwrap_err(),
            WireError::Origin,
            "{node:?}"
        );
    }
    let bytes = encode_update(&me("n", 16), UpdateParts::default());
    assert_eq!(
        decode_update(&bytes, 16, &rules()).unwrap_err(),
        WireError::Origin
    );
    let no_origin = seal(Body::Update(cpb::RoomUpdate::default()));
    assert_eq!(
        decode_update(&no_origin, 16, &rules()).unwrap_err(),
        WireError::Origin
    );
    assert!(matches!(
        decode_update(b"\xff\xff\xff", 16, &rules()).unwrap_err(),
        WireError::Malformed(_)
    ));
}

#[test]
fn control_messages_round_trip_and_check_room_names() {
    let o = me("n2", 2);
    let hb = encode_heartbeat(
        &o,
        cpb::Heartbeat {
            server_time_ms: 9,
            rooms: 3,
            members: 4,
            bye: true,
            ..Default::default()
        },
    );
    let hb = decode_heartbeat(&hb, 16).expect("valid");
    assert_eq!(
        (hb.server_time_ms, hb.rooms, hb.members, hb.bye),
        (9, 3, 4, true)
    );
    let asker = decode_snapshot_request(&encode_snapshot_request(&o), 16).expect("valid");
    // Opening the room: no opening of it yet, older than any.
    assert_eq!((asker.node.as_ref(), asker.incarnation), ("n2", 0));
    let sync = encode_sync_request(&o, vec!["lobby".into(), "a.b".into()]);
    assert_eq!(
        decode_sync_request(&sync, 16, &rules()).expect("valid").1,
        vec!["lobby".to_owned(), "a.b".to_owned()]
    );
    let bad = encode_sync_request(&o, vec!["no spaces".into()]);
    assert_eq!(
        decode_sync_request(&bad, 16, &rules()).unwrap_err(),
        WireError::Room
    );
    let counts = encode_room_counts(&o, vec![("lobby".into(), 3)]);
    assert_eq!(
        decode_room_counts(&counts, 16, &rules()).expect("valid").1,
        vec![("lobby".to_owned(), 3)]
    );
}

/// Issue #15, finding 8: protobuf alone reads one message type as another
/// (a move-only `RoomUpdate` is a valid `Heartbeat`), so a message on the
/// wrong subject adopted nodes. Every payload now says its type.
#[test]
fn a_message_of_another_type_is_refused() {
    let o = me("n2", 2);
    let beat = encode_heartbeat(&o, cpb::Heartbeat::default());
    assert_eq!(
        decode_update(&beat, 16, &rules()).unwrap_err(),
        WireError::WrongType {
            expected: "RoomUpdate",
            got: "Heartbeat"
        }
    );
    let records = [walk(18)];
    let moved = encode_update(
        &o,
        UpdateParts {
            seq: 7,
            motion: &records,
            ..Default::default()
        },
    );
    assert_eq!(
        decode_heartbeat(&moved, 16).unwrap_err(),
        WireError::WrongType {
            expected: "Heartbeat",
            got: "RoomUpdate"
        }
    );
    let asked = encode_snapshot_request(&o);
    for wrong in [
        decode_sync_request(&asked, 16, &rules()).map(drop),
        decode_room_counts(&asked, 16, &rules()).map(drop),
    ] {
        assert!(matches!(
            wrong,
            Err(WireError::WrongType {
                got: "SnapshotRequest",
                ..
            })
        ));
    }
    let counts = encode_room_counts(&o, Vec::new());
    assert!(matches!(
        decode_snapshot_request(&counts, 16),
        Err(WireError::WrongType {
            got: "RoomCounts",
            ..
        })
    ));
    // The first wire format's bare messages: a move-only update was a
    // valid heartbeat; now neither reads as anything.
    let bare_update = cpb::RoomUpdate {
        origin: Some(o.clone()),
        seq: 7,
        motion: vec![36, 1, 1],
        ..Default::default()
    }
    .encode_to_vec();
    assert!(decode_heartbeat(&bare_update, 16).is_err());
    assert!(decode_update(&bare_update, 16, &rules()).is_err());
    let bare_beat = cpb::Heartbeat {
        origin: Some(o),
        server_time_ms: 1_764_600_000_000,
        rooms: 1,
        members: 3,
        bye: false,
        claiming: false,
    }
    .encode_to_vec();
    assert!(decode_update(&bare_beat, 16, &rules()).is_err());
    assert!(decode_heartbeat(&bare_beat, 16).is_err());
    let empty = decode_heartbeat(&[], 16).unwrap_err();
    assert_eq!(
        empty,
        WireError::WrongType {
            expected: "Heartbeat",
            got: "message of no type"
        }
    );
}

/// Issue #15, finding 9: an id at or above 2^31 in the sender's slot
/// wrapped (or, in a debug build, overflowed) a motion record's head.
#[test]
fn ids_past_a_records_head_are_refused() {
    let past = MAX_MEMBER_ID.0 + 2; // 2^31 + 1: slot 1 of 16
    assert_eq!(past % 16, 1);
    assert!(me_origin().owns(MemberId(MAX_MEMBER_ID.0 - 14)));
    assert!(!me_origin().owns(MemberId(past)));
    for op in [
        joined_op(member(past, 1), 0),
        left_op(MemberId(past), LeaveReason::Left),
        chat_op(pb::ChatMessage {
            member_id: past,
            text: "hi".into(),
            server_time_ms: 0,
        }),
    ] {
        assert_eq!(
            decode_update(&one(op), 16, &rules()).unwrap_err(),
            WireError::Member("id outside the sender's slot")
        );
    }
}

fn me_origin() -> Origin {
    Origin {
        node: Arc::from("n1"),
        epoch: 1,
        slot: 1,
        slots: 16,
    }
}

/// Issue #15, finding 9: a forged full state with `seq = u64::MAX` made
/// the next expected `seq` wrap to 0 and stuck the sender's part.
#[test]
fn a_seq_at_the_end_of_its_range_is_refused() {
    let at = |seq| {
        encode_update(
            &me("n1", 1),
            UpdateParts {
                seq,
                full: true,
                ..Default::default()
            },
        )
    };
    assert_eq!(
        decode_update(&at(u64::MAX), 16, &rules()).unwrap_err(),
        WireError::Seq(u64::MAX)
    );
    assert_eq!(
        decode_update(&at(u64::MAX - 1), 16, &rules())
            .expect("the last seq that has a next")
            .seq,
        u64::MAX - 1
    );
}

#[test]
fn room_tokens_map_one_to_one() {
    assert_eq!(room_token("a..b.c"), "a~~b~c");
    assert_eq!(room_from_token(&room_token(".x.")), ".x.");
    assert_eq!(room_token("lobby"), "lobby");
}

proptest::proptest! {
    #[test]
    fn decoding_never_panics(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256)) {
        let _ = decode_update(&bytes, 16, &rules());
        let _ = decode_heartbeat(&bytes, 16);
        let _ = decode_sync_request(&bytes, 16, &rules());
        let _ = decode_room_counts(&bytes, 16, &rules());
    }
}

#[test]
fn a_one_move_update_is_small() {
    // The figures docs/cluster.md quotes: a node named like `amble-1` with
    // a random epoch (a 10-byte varint), a tick time in 2026, the node's
    // twelfth opening of a room.
    let origin = cpb::Origin {
        node: "amble-1".into(),
        epoch: u64::MAX / 3,
        slot: 1,
        slots: 16,
    };
    let stand = [MotionRecord {
        member: MemberId(17),
        motion: Motion::standing(Position { x: 2_500, y: 130 }),
    }];
    let one = encode_update(
        &origin,
        UpdateParts {
            incarnation: 12,
            seq: 1_000,
            tick_ms: 1_764_600_000_300,
            motion: &stand,
            ..Default::default()
        },
    );
    let walking = |id| MotionRecord {
        member: MemberId(id),
        motion: Motion {
            position: Position { x: 1_200, y: 3_400 },
            walk: Some(Walk {
                target: Position { x: 2_500, y: 2_500 },
                speed: 140,
            }),
        },
    };
    let walk = [walking(17), walking(33), walking(49)];
    let three = encode_update(
        &origin,
        UpdateParts {
            incarnation: 12,
            seq: 1_000,
            tick_ms: 1_764_600_000_300,
            motion: &walk,
            ..Default::default()
        },
    );
    assert_eq!((one.len(), three.len()), (46, 74));
}

fn entry(key: &str, value: &str) -> pb::DataEntry {
    pb::DataEntry {
        key: key.into(),
        value: value.into(),
    }
}

/// Issue #19: a member's data and shared user ride in its joined op, and a
/// data change is its own op, both checked like a Join's data.
#[test]
fn member_data_rides_along_and_is_checked() {
    let mut m = member(1, 1);
    m.data = vec![entry("status", "busy"), entry("colour", "red")];
    m.user = "user-7".into();
    let u = decode_update(&one(joined_op(m, 3)), 16, &rules()).expect("decodes");
    let Op::Joined(j) = &u.ops[0] else {
        panic!("{:?}", u.ops);
    };
    assert_eq!(j.data.get("colour"), Some("red"));
    assert_eq!(j.data.entries()[0].0, "colour", "sorted by key");
    assert_eq!(j.user.as_deref(), Some("user-7"));
    let plain = decode_update(&one(joined_op(member(1, 1), 3)), 16, &rules()).expect("decodes");
    let Op::Joined(j) = &plain.ops[0] else {
        panic!("{:?}", plain.ops);
    };
    assert_eq!(j.user, None);

    let change = |member_id, data| one(data_op(pb::MemberData { member_id, data }));
    let u =
        decode_update(&change(1, vec![entry("status", "free")]), 16, &rules()).expect("decodes");
    assert!(
        matches!(&u.ops[0], Op::Data { id: MemberId(1), data } if data.get("status") == Some("free"))
    );
    // Another slot's member, a bad key, too many entries, too many bytes,
    // a duplicate key, a user too long: dropped.
    assert!(decode_update(&change(2, vec![]), 16, &rules()).is_err());
    assert!(decode_update(&change(1, vec![entry("Bad", "v")]), 16, &rules()).is_err());
    let nine = (0..9).map(|i| entry(&format!("k{i}"), "v")).collect();
    assert!(decode_update(&change(1, nine), 16, &rules()).is_err());
    let big = vec![
        entry("a", &"x".repeat(200)),
        entry("b", &"x".repeat(200)),
        entry("c", &"x".repeat(110)),
    ];
    assert!(decode_update(&change(1, big), 16, &rules()).is_err());
    let twice = vec![entry("a", "1"), entry("a", "2")];
    assert!(decode_update(&change(1, twice), 16, &rules()).is_err());
    let mut long_user = member(1, 1);
    long_user.user = "u".repeat(257);
    assert!(decode_update(&one(joined_op(long_user, 3)), 16, &rules()).is_err());
    let mut bad_data = member(1, 1);
    bad_data.data = vec![entry("k", "")];
    assert!(decode_update(&one(joined_op(bad_data, 3)), 16, &rules()).is_err());
}

#[test]
fn occupancy_round_trips_and_checks_room_names() {
    let o = me("n2", 2);
    let bytes = encode_occupancy(&o, vec!["lobby".into()], vec!["hall".into()], false);
    let got = decode_occupancy(&bytes, 16, &rules()).expect("valid");
    assert_eq!(&*got.origin.node, "n2");
    assert_eq!(
        (got.occupied, got.vacated, got.full),
        (vec!["lobby".to_owned()], vec!["hall".to_owned()], false)
    );
    let full = encode_occupancy(&o, vec!["a".into(), "b".into()], Vec::new(), true);
    assert!(decode_occupancy(&full, 16, &rules()).expect("valid").full);
    let bad = encode_occupancy(&o, vec![String::new()], Vec::new(), false);
    assert!(matches!(
        decode_occupancy(&bad, 16, &rules()),
        Err(WireError::Room)
    ));
    let counts = encode_room_counts(&o, Vec::new());
    assert!(matches!(
        decode_occupancy(&counts, 16, &rules()),
        Err(WireError::WrongType {
            expected: "Occupancy",
            got: "RoomCounts"
        })
    ));
}
