//! Move fan-out, tick batching, the throttle, flooding, slow receivers.

use std::time::Duration;

use amble::protocol::pb::{
    self, LeaveReason, client_message::Body as C, server_message::Body as S,
};
use amble::protocol::{MemberId, Motion, Position, Walk, move_body};

use crate::support::*;

#[tokio::test]
async fn a_move_reaches_every_other_member_and_echoes_once() {
    let server = TestServer::start().await;
    let (mut mover, w) = server.joined("lobby", "mover").await;
    let me = MemberId(w.member_id);
    let mut others = Vec::new();
    for i in 0..5 {
        others.push(server.joined("lobby", &format!("o{i}")).await.0);
    }
    let walk = Motion {
        position: Position { x: 10, y: 20 },
        walk: Some(Walk {
            target: Position { x: 3_000, y: 40 },
            speed: 140,
        }),
    };
    mover.send(move_body(walk, 1, 0)).await;
    for o in &mut others {
        let records = o.next_motion().await;
        assert_eq!(records.len(), 1);
        assert_eq!((records[0].member, records[0].motion), (me, walk));
    }
    // The sender sees its applied move once: the confirmation.
    let echo = mover.next_motion().await;
    assert_eq!(echo.iter().filter(|r| r.member == me).count(), 1);
    // And nothing more: the next thing it sees is the Pong.
    mover.send(C::Ping(pb::Ping { client_time_ms: 1 })).await;
    assert!(matches!(mover.recv().await.body, Some(S::Pong(_))));
}

#[tokio::test(start_paused = true)]
async fn many_movers_in_one_tick_make_one_frame() {
    let server = TestServer::start().await;
    let (mut watcher, _) = server.joined("lobby", "watcher").await;
    let mut movers = Vec::new();
    for i in 0..20 {
        movers.push(server.joined("lobby", &format!("m{i}")).await);
    }
    for _ in 0..20 {
        watcher
            .until(|m| matches!(m.body, Some(S::Joined(_))).then_some(()))
            .await;
    }
    // Paused time: the clock stands still while the moves are sent, so all
    // of them land in the same tick.
    for (i, (m, _)) in movers.iter_mut().enumerate() {
        m.send_move(100 + i as u32, 100, 1).await;
    }
    let frame = watcher.recv().await;
    let records = amble::protocol::decode_motion(&frame.motion)
        .expect("a motion batch")
        .1;
    assert_eq!(
        records.len(),
        20,
        "one frame carries every move of the tick"
    );
    assert_eq!(server.metric("amble_motion_batches_total").await, 1.0);
}

#[tokio::test(start_paused = true)]
async fn a_tick_shared_out_over_several_tasks_sends_each_member_one_frame() {
    let server = TestServer::with(config(|c| c.room.tick_workers = 3)).await;
    let mut rooms = Vec::new();
    for r in 0..4 {
        let mut members = Vec::new();
        for m in 0..3 {
            let (client, w) = server.joined(&format!("r{r}"), &format!("m{m}")).await;
            members.push((client, MemberId(w.member_id)));
        }
        rooms.push(members);
    }
    for members in &mut rooms {
        // Each member but the last sees the later ones join.
        for m in 0..members.len() {
            for _ in m + 1..members.len() {
                members[m]
                    .0
                    .until(|msg| matches!(msg.body, Some(S::Joined(_))).then_some(()))
                    .await;
            }
        }
    }
    // Paused time: every move lands in the same tick.
    for (r, members) in rooms.iter_mut().enumerate() {
        for (m, (client, _)) in members.iter_mut().enumerate() {
            client.send_move(100 * r as u32 + m as u32, 7, 1).await;
        }
    }
    for (r, members) in rooms.iter_mut().enumerate() {
        let ids: Vec<_> = members.iter().map(|(_, id)| *id).collect();
        for (client, _) in members.iter_mut() {
            let records = client.next_motion().await;
            let got: Vec<_> = records
                .iter()
                .map(|rec| (rec.member, rec.motion.position.x))
                .collect();
            let want: Vec<_> = (0..ids.len())
                .map(|m| (ids[m], 100 * r as u32 + m as u32))
                .collect();
            assert_eq!(got, want, "room r{r}: one frame with every move");
        }
    }
    assert_eq!(server.metric("amble_motion_batches_total").await, 4.0);
}

#[tokio::test(start_paused = true)]
async fn the_throttle_keeps_the_newest_move() {
    let server = TestServer::with(config(|c| {
        c.session.move_interval_ms = 1_000;
        c.session.move_burst = 1;
    }))
    .await;
    let (mut watcher, _) = server.joined("lobby", "watcher").await;
    let (mut mover, _) = server.joined("lobby", "mover").await;
    watcher
        .until(|m| matches!(m.body, Some(S::Joined(_))).then_some(()))
        .await;
    let t0 = tokio::time::Instant::now();
    mover.send_move(1, 1, 1).await; // applied at the next tick
    mover.send_move(2, 2, 2).await; // over budget: held...
    mover.send_move(3, 3, 3).await; // ...and replaced by this one
    let first = watcher.next_motion().await;
    assert_eq!(first[0].motion.position, Position { x: 1, y: 1 });
    let second = watcher.next_motion().await;
    assert_eq!(
        second[0].motion.position,
        Position { x: 3, y: 3 },
        "newest wins, (2, 2) never sent"
    );
    assert!(
        t0.elapsed() >= Duration::from_millis(1_000),
        "applied when the budget allowed"
    );
    assert_eq!(server.metric("amble_moves_received_total").await, 3.0);
    assert_eq!(server.metric("amble_moves_applied_total").await, 2.0);
    assert_eq!(server.metric("amble_moves_coalesced_total").await, 1.0);
}

#[tokio::test]
async fn a_flood_is_closed_with_1008_and_the_room_told() {
    let server = TestServer::start().await;
    let (mut watcher, _) = server.joined("lobby", "watcher").await;
    let (mut flooder, w) = server.joined("lobby", "flooder").await;
    for i in 0..200 {
        flooder.send_move(i, i, i).await;
    }
    flooder
        .until(|m| match &m.body {
            Some(S::Error(e)) if e.code == pb::ErrorCode::Flood as i32 => Some(()),
            _ => None,
        })
        .await;
    assert_eq!(flooder.expect_close().await, 1008);
    let gone = watcher
        .until(|m| match &m.body {
            Some(S::Left(l)) => Some((l.member_id, l.reason)),
            _ => None,
        })
        .await;
    assert_eq!(gone, (w.member_id, LeaveReason::Kicked as i32));
    assert_eq!(
        server
            .metric("amble_rejected_total{reason=\"flood\"}")
            .await,
        1.0
    );
    watcher.ping().await;
}

#[tokio::test]
async fn a_slow_receiver_resyncs_and_the_others_are_unaffected() {
    let server = TestServer::with(config(|c| {
        c.session.send_queue_bytes = 1_024;
        c.edge.socket_send_buffer = 4_096;
        c.session.chat_interval_ms = 1;
        c.session.chat_burst = 10_000;
    }))
    .await;
    // The slow client asks for a tiny receive window and then stops reading.
    let mut slow = server.narrow_client().await;
    let slow_welcome = slow.join("lobby", "slow").await;

    let (mut talker, _) = server.joined("lobby", "talker").await;
    let (mut fast, _) = server.joined("lobby", "fast").await;
    let text = "x".repeat(270);
    let total = 400;
    for i in 0..total {
        talker
            .send(C::Chat(pb::SendChat {
                text: format!("{i} {text}"),
            }))
            .await;
        // The fast reader keeps up, in order, whatever the slow one does.
        let got = fast
            .until(|m| match &m.body {
                Some(S::Chat(c)) => Some(c.text.clone()),
                _ => None,
            })
            .await;
        assert!(
            got.starts_with(&format!("{i} ")),
            "fast reader saw {got:.10} for {i}"
        );
    }
    // The slow reader reads again: it gets a Resync, then live frames.
    let resync = slow
        .until(|m| match &m.body {
            Some(S::Resync(s)) => Some(s.clone()),
            _ => None,
        })
        .await;
    assert_eq!(resync.members.len(), 3);
    assert!(
        resync
            .members
            .iter()
            .any(|m| m.id == slow_welcome.member_id)
    );
    talker.send_move(77, 77, 1).await;
    let records = slow.next_motion().await;
    assert_eq!(records[0].motion.position, Position { x: 77, y: 77 });
    assert!(server.metric("amble_resyncs_total").await >= 1.0);
}

#[tokio::test]
async fn a_room_writes_straight_into_every_socket_however_many() {
    // More members than tokio's per-turn I/O budget (128): their frames must
    // still go straight into the sockets, none queued behind a wakeup.
    let server = TestServer::start().await;
    let mut members = Vec::new();
    for i in 0..150 {
        members.push(server.joined("crowd", &format!("m{i}")).await.0);
    }
    members[0].send_move(42, 42, 1).await;
    for m in members.iter_mut().rev() {
        let records = m.next_motion().await;
        assert_eq!(records[0].motion.position, Position { x: 42, y: 42 });
    }
    assert_eq!(server.metric("amble_send_backlogs_total").await, 0.0);
    assert_eq!(server.metric("amble_frames_dropped_total").await, 0.0);
}

#[tokio::test]
async fn a_reader_that_stops_reading_is_closed_after_the_send_timeout() {
    let server = TestServer::with(config(|c| {
        c.session.send_timeout_ms = 300;
        c.session.send_queue_bytes = 1_024;
        c.edge.socket_send_buffer = 4_096;
        c.session.chat_interval_ms = 1;
        c.session.chat_burst = 10_000;
        // Its place is held this long after the close, then DISCONNECTED.
        c.room.resume_grace_ms = 300;
    }))
    .await;
    // A tiny receive window, then never a read; it keeps sending pings,
    // which must not keep it alive.
    let mut stuck = server.narrow_client().await;
    let stuck_id = stuck.join("lobby", "stuck").await.member_id;
    let (mut talker, _) = server.joined("lobby", "talker").await;
    let text = "x".repeat(270);
    // Chat until the stuck socket is full and its frames queue.
    for i in 0..2_000 {
        use futures_util::SinkExt as _;
        let ping = tokio_tungstenite::tungstenite::Message::Ping(Default::default());
        let _ = tokio::time::timeout(Duration::from_secs(1), stuck.ws.send(ping)).await;
        talker
            .send(C::Chat(pb::SendChat {
                text: format!("{i} {text}"),
            }))
            .await;
        talker
            .until(|m| matches!(m.body, Some(S::Chat(_))).then_some(()))
            .await;
        if i % 50 == 49 && server.metric("amble_send_backlogs_total").await >= 1.0 {
            break;
        }
    }
    assert!(server.metric("amble_send_backlogs_total").await >= 1.0);
    // Within the send timeout (plus the wait's own bound, and the resume
    // grace) it is closed.
    let gone = talker
        .until(|m| match &m.body {
            Some(S::Left(l)) => Some(Some((l.member_id, l.reason))),
            _ => None,
        })
        .await;
    assert_eq!(
        gone,
        Some((stuck_id, LeaveReason::Disconnected as i32)),
        "the stuck reader was closed"
    );
    assert_eq!(server.metric("amble_connections").await, 1.0);
    talker.ping().await;
}
