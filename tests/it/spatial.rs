//! Spatial rooms (issue #17) over real sockets: members far apart never
//! receive each other's moves, chat or joins; walking into view brings an
//! `Appeared` with the member's name and position, and out of view a
//! `Disappeared`, never a `Left`; the Welcome holds the view and the
//! room's count.

use amble::protocol::pb::{self, client_message::Body as C, server_message::Body as S};
use amble::protocol::{Motion, Position, move_body};

use crate::support::*;

/// Joins the spatial room `plaza` (the default `--spatial-rooms plaza*`)
/// at `x, y`.
async fn at(server: &TestServer, name: &str, x: u32, y: u32) -> (Client, pb::Welcome) {
    let mut c = server.client().await;
    c.send(C::Join(pb::Join {
        room: "plaza".into(),
        name: name.into(),
        token: String::new(),
        start: Some(pb::Position { x, y }),
        resume_token: String::new(),
        data: Vec::new(),
    }))
    .await;
    let w = c.welcome().await;
    (c, w)
}

fn names(w: &pb::Welcome) -> Vec<String> {
    let snapshot = w.snapshot.as_ref().expect("snapshot");
    snapshot.members.iter().map(|m| m.name.clone()).collect()
}

async fn stand(c: &mut Client, x: u32, y: u32, seq: u32) {
    c.send(move_body(Motion::standing(Position { x, y }), seq, 0))
        .await;
}

/// Everything `c` receives up to the answer to a ping (which follows all
/// that the room sent it before).
async fn drain(c: &mut Client) -> Vec<pb::ServerMessage> {
    c.send(C::Ping(pb::Ping { client_time_ms: 99 })).await;
    let mut seen = Vec::new();
    loop {
        let m = c.recv().await;
        if matches!(&m.body, Some(S::Pong(p)) if p.client_time_ms == 99) {
            return seen;
        }
        seen.push(m);
    }
}

#[tokio::test]
async fn members_far_apart_never_hear_each_other() {
    // A short resume grace: Ada's drop below is a Left after it.
    let server = TestServer::with(config(|c| c.room.resume_grace_ms = 200)).await;
    let (mut ada, wa) = at(&server, "Ada", 100, 100).await;
    let limits = wa.limits.expect("limits");
    assert_eq!(
        (
            limits.interest_radius,
            limits.world_width,
            limits.room_capacity
        ),
        (1_500, 50_000, 20_000)
    );
    let (mut bo, wb) = at(&server, "Bo", 40_000, 40_000).await;
    assert_eq!(names(&wb), ["Bo"], "Ada is out of view");
    assert_eq!(wb.population, 2);
    // Cy arrives near Ada: Ada hears it, Bo does not.
    let (mut cy, wc) = at(&server, "Cy", 600, 600).await;
    assert_eq!(names(&wc), ["Ada", "Cy"]);
    ada.until(|m| {
        matches!(&m.body, Some(S::Joined(j)) if j.member.as_ref().is_some_and(|m| m.name == "Cy"))
            .then_some(())
    })
    .await;
    // Ada moves and chats.
    stand(&mut ada, 200, 200, 1).await;
    ada.send(C::Chat(pb::SendChat {
        text: "near".into(),
    }))
    .await;
    // The chat goes out at once, the move on the next tick: either first.
    let (mut heard, mut moved) = (None, false);
    cy.until(|m| {
        if let Some(S::Chat(c)) = &m.body {
            heard = Some(c.text.clone());
        }
        moved |= !m.motion.is_empty();
        (heard.is_some() && moved).then_some(())
    })
    .await;
    assert_eq!(heard.as_deref(), Some("near"));
    // Bo got none of it: no Joined, no chat, no move of anyone but itself.
    for m in drain(&mut bo).await {
        assert!(
            !matches!(m.body, Some(S::Joined(_) | S::Chat(_))),
            "Bo heard {m:?}"
        );
        assert!(m.motion.is_empty(), "Bo got moves: {m:?}");
    }
    // Ada leaves: Cy sees the Left, Bo nothing.
    drop(ada);
    cy.until(|m| matches!(m.body, Some(S::Left(_))).then_some(()))
        .await;
    for m in drain(&mut bo).await {
        assert!(!matches!(m.body, Some(S::Left(_))), "Bo heard {m:?}");
    }
    server.stop().await;
}

#[tokio::test]
async fn walking_into_view_is_an_appear_and_out_of_it_a_disappear() {
    let server = TestServer::start().await;
    let (mut ada, _) = at(&server, "Ada", 100, 100).await;
    let (mut bo, wb) = at(&server, "Bo", 20_000, 100).await;
    assert_eq!(names(&wb), ["Bo"]);
    stand(&mut bo, 1_000, 100, 1).await;
    let appeared = ada
        .until(|m| match &m.body {
            Some(S::Appeared(a)) => Some(a.members.clone()),
            _ => None,
        })
        .await;
    assert_eq!(appeared.len(), 1);
    assert_eq!(appeared[0].name, "Bo");
    assert_eq!(appeared[0].id, wb.member_id);
    assert_eq!(
        appeared[0].position,
        Some(pb::Position { x: 1_000, y: 100 })
    );
    let seen = bo
        .until(|m| match &m.body {
            Some(S::Appeared(a)) => {
                Some(a.members.iter().map(|m| m.name.clone()).collect::<Vec<_>>())
            }
            _ => None,
        })
        .await;
    assert_eq!(seen, ["Ada"]);
    // Now in view: Bo's next move reaches Ada, and the move that brought
    // Bo into view never comes twice (the Appeared showed it).
    stand(&mut bo, 1_100, 100, 2).await;
    let moved = ada
        .until(|m| {
            let records = amble::protocol::decode_motion(&m.motion).ok()?.1;
            let bo_moves: Vec<u32> = records
                .iter()
                .filter(|r| r.member.0 == wb.member_id)
                .map(|r| r.motion.position.x)
                .collect();
            (!bo_moves.is_empty()).then_some(bo_moves)
        })
        .await;
    assert_eq!(moved, [1_100]);
    // Out of view again: a Disappeared, not a Left.
    stand(&mut bo, 30_000, 100, 3).await;
    let gone = ada
        .until(|m| match &m.body {
            Some(S::Disappeared(d)) => Some(d.member_ids.clone()),
            Some(S::Left(l)) => panic!("a Left for {}", l.member_id),
            _ => None,
        })
        .await;
    assert_eq!(gone, [wb.member_id]);
    server.stop().await;
}

#[tokio::test]
async fn a_plain_room_keeps_its_world_and_a_spatial_one_has_its_own() {
    let server = TestServer::start().await;
    let (mut ada, _) = server.joined("lobby", "Ada").await;
    stand(&mut ada, 40_000, 100, 1).await;
    let text = ada.expect_error(pb::ErrorCode::InvalidPosition).await;
    assert!(text.contains("5000"), "{text}");
    let (mut bo, _) = at(&server, "Bo", 40_000, 100).await;
    stand(&mut bo, 49_000, 49_000, 1).await;
    bo.ping().await;
    stand(&mut bo, 60_000, 100, 2).await;
    bo.expect_error(pb::ErrorCode::InvalidPosition).await;
    server.stop().await;
}

#[tokio::test]
async fn find_names_members_out_of_view_with_their_positions_a_page_at_a_time() {
    let server = TestServer::start().await;
    let (mut ada, _) = at(&server, "Ada", 100, 100).await;
    let (_bo, wb) = at(&server, "Bob Far", 40_000, 40_000).await;
    let (_bea, _) = at(&server, "bea", 20_000, 100).await;
    let (_cy, _) = at(&server, "Cy", 30_000, 30_000).await;
    let find = |prefix: &str, cursor: u32| {
        C::Find(pb::Find {
            prefix: prefix.into(),
            cursor,
        })
    };
    let found = |m: &pb::ServerMessage| match &m.body {
        Some(S::Found(f)) => Some(f.clone()),
        _ => None,
    };
    ada.send(find("b", 0)).await;
    let f = ada.until(found).await;
    assert_eq!(f.total, 2, "Bob Far and bea, ignoring case");
    let names: Vec<&str> = f.members.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(names, ["Bob Far", "bea"]);
    assert_eq!(f.members[0].id, wb.member_id);
    assert_eq!(
        f.members[0].position,
        Some(pb::Position {
            x: 40_000,
            y: 40_000
        })
    );
    assert_eq!(f.next_cursor, 0);
    // Everyone, after Bob's id.
    ada.send(find("", wb.member_id)).await;
    let f = ada.until(found).await;
    assert_eq!(f.total, 4);
    assert!(f.members.iter().all(|m| m.id > wb.member_id));
    // Over the budget (a burst of 3): refused, the session goes on.
    ada.send(find("c", 0)).await;
    ada.until(found).await;
    ada.send(find("c", 0)).await;
    ada.expect_error(pb::ErrorCode::RateLimited).await;
    ada.ping().await;
    server.stop().await;
}
