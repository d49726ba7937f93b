//! The demo with two people: two pages join one room; a click-to-walk in
//! one arrives in the other; free movement with the keys; chat both ways
//! (panel and bubble); the HUD; a third visitor refused from a full room;
//! a server restart; leaving drops the member on the other page. Saves
//! target/browser-artifacts/two_browsers_in_one_room/room.png.

use std::time::Duration;

use amble::config::Config;
use fantoccini::key::Key;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::driver::{Browser, Page, Server, Viewport, WAIT, get_json, within};

/// Room capacity for the test server: two, so a third visitor is refused.
const CAPACITY: u32 = 2;
const ROOM: &str = "browser-test";

fn config() -> Config {
    let mut config = Config::default();
    config.room.room_capacity = CAPACITY;
    config
}

/// A member as the page renders it (`window.ambleDemo.members()`).
#[derive(Clone, Debug, Deserialize)]
struct Member {
    name: String,
    x: f64,
    y: f64,
    bubble: Option<String>,
}

#[derive(Clone, Copy, Debug, Deserialize)]
struct Point {
    x: f64,
    y: f64,
}

async fn members(page: &Page) -> Vec<Member> {
    page.eval("() => window.ambleDemo.members()", &[]).await
}

async fn find(page: &Page, name: &str) -> Member {
    members(page)
        .await
        .into_iter()
        .find(|m| m.name == name)
        .unwrap_or_else(|| panic!("{}: no member {name}", page.label()))
}

async fn stat(page: &Page, name: &str) -> f64 {
    page.eval("(k) => window.ambleDemo.stats()[k]", &[json!(name)])
        .await
}

/// Waits until `page` shows `name` standing within `tolerance` cm of `at`.
async fn wait_at(page: &Page, name: &str, at: Point, tolerance: f64) {
    page.wait_for(
        &format!("{name} at ({}, {})", at.x, at.y),
        "(name, x, y, tol) => { const m = window.ambleDemo.members().find((m) => m.name === name); \
         return !!m && Math.abs(m.x - x) < tol && Math.abs(m.y - y) < tol; }",
        &[json!(name), json!(at.x), json!(at.y), json!(tolerance)],
    )
    .await;
}

async fn open(browser: &Browser, server: &Server, label: &str) -> Page {
    let page = browser.open(label, Viewport::DESKTOP).await;
    page.goto(&server.url("/")).await;
    page
}

async fn join(page: &Page, name: &str) {
    page.fill("#name", name).await;
    page.fill("#room", ROOM).await;
    page.click("#join").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_browsers_in_one_room_walk_keys_chat_full_reconnect_leave() {
    let browser = Browser::start("two_browsers_in_one_room").await;
    within(Duration::from_secs(240), "the whole test", async {
        let mut server = Server::with(config()).await;
        let ada = open(&browser, &server, "ada").await;
        let bo = open(&browser, &server, "bo").await;

        both_join_the_same_room_from_the_lobby(&server, &ada, &bo).await;
        a_click_to_walk_in_one_page_arrives_in_the_other(&ada, &bo).await;
        free_movement_with_the_keys_shows_up_on_the_other_page(&ada, &bo).await;
        chat_goes_both_ways_in_the_panel_and_as_a_bubble(&ada, &bo).await;
        the_hud_shows_measured_figures(&ada).await;
        let refused =
            a_third_visitor_is_refused_because_the_room_is_full(&browser, &server, &ada).await;
        server =
            after_a_restart_both_pages_reconnect_and_keep_their_places(server, &ada, &bo).await;
        leaving_drops_the_member_on_the_other_page(&ada, &bo).await;

        let mut errors = refused;
        errors.extend(ada.close().await);
        errors.extend(bo.close().await);
        assert_eq!(errors, Vec::<String>::new(), "no errors in the pages");
        server.stop().await;
    })
    .await;
}

async fn both_join_the_same_room_from_the_lobby(server: &Server, ada: &Page, bo: &Page) {
    for (page, name) in [(ada, "Ada"), (bo, "Bo")] {
        join(page, name).await;
        page.wait_for("joined", "() => window.ambleDemo.state() === 'joined'", &[])
            .await;
    }
    for page in [ada, bo] {
        page.wait_for(
            "two members",
            "() => window.ambleDemo.members().length === 2",
            &[],
        )
        .await;
        assert!(page.is_visible("#room-view").await);
        assert_eq!(page.text("#room-name").await, ROOM);
    }
    // Let any step off the shared arrival point finish, as both pages see it.
    for page in [ada, bo] {
        page.wait_for(
            "everyone standing",
            "() => window.ambleDemo.members().every((m) => !m.walking)",
            &[],
        )
        .await;
    }
    // The lobby of a third visitor lists the room with its two members.
    let rooms = get_json(server, "/api/rooms").await;
    let room = rooms["rooms"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|r| r["name"] == ROOM)
        .unwrap_or_else(|| panic!("{ROOM} not in {rooms}"));
    assert_eq!(room["members"], 2, "{room}");
}

async fn a_click_to_walk_in_one_page_arrives_in_the_other(ada: &Page, bo: &Page) {
    let me = find(ada, "Ada").await;
    let limits: Value = ada.eval("() => window.ambleDemo.limits()", &[]).await;
    let width = limits["worldWidth"].as_f64().expect("worldWidth");
    let goal = Point {
        x: (width - 100.0).min(me.x + 350.0),
        y: 100f64.max(me.y - 200.0),
    };
    let point: Point = ada
        .eval(
            "(x, y) => window.ambleDemo.worldToCanvas(x, y)",
            &[json!(goal.x), json!(goal.y)],
        )
        .await;
    let floor = ada.rect("#floor").await;
    ada.click_at(floor.x + point.x, floor.y + point.y).await;
    let target = ada
        .wait_for(
            "Ada walking",
            "() => window.ambleDemo.members().find((m) => m.self && m.walking)?.target",
            &[],
        )
        .await;
    let target: Point = serde_json::from_value(target).expect("a point");
    assert!(
        (target.x - goal.x).abs() < 10.0 && (target.y - goal.y).abs() < 10.0,
        "walk to {target:?}, clicked {goal:?}"
    );
    // The other page animates the walk (seen under way), then shows the arrival.
    bo.wait_for(
        "Ada walking to the target",
        "(x, y) => { const a = window.ambleDemo.members().find((m) => m.name === 'Ada'); \
         return !!a && a.walking && !!a.target && a.target.x === x && a.target.y === y; }",
        &[json!(target.x), json!(target.y)],
    )
    .await;
    let midway = find(bo, "Ada").await;
    assert!(
        (midway.x - target.x).hypot(midway.y - target.y) > 1.0,
        "seen before arriving"
    );
    bo.wait_for(
        "Ada arrived",
        "(x, y) => { const a = window.ambleDemo.members().find((m) => m.name === 'Ada'); \
         return !!a && !a.walking && Math.abs(a.x - x) < 0.5 && Math.abs(a.y - y) < 0.5; }",
        &[json!(target.x), json!(target.y)],
    )
    .await;
    // The walk was one message.
    let moves = stat(ada, "movesOut").await;
    assert!((1.0..=3.0).contains(&moves), "moves sent: {moves}");
}

async fn free_movement_with_the_keys_shows_up_on_the_other_page(ada: &Page, bo: &Page) {
    let start = find(bo, "Bo").await;
    let before = stat(bo, "movesOut").await;
    bo.key_down('d').await;
    bo.key_down('s').await;
    bo.wait_for(
        "Bo 2 m to the right",
        "(x0) => window.ambleDemo.members().find((m) => m.self).x >= x0 + 200",
        &[json!(start.x)],
    )
    .await;
    bo.key_up('d').await;
    bo.key_up('s').await;
    let end = find(bo, "Bo").await;
    assert!(
        end.y > start.y + 100.0,
        "moved down-right: {start:?} to {end:?}"
    );
    let sent = stat(bo, "movesOut").await - before;
    assert!(sent >= 1.0, "free movement sent moves");
    wait_at(ada, "Bo", Point { x: end.x, y: end.y }, 1.5).await;
    let seen = find(ada, "Bo").await;
    assert!((seen.x - start.x).hypot(seen.y - start.y) > 200.0);
    // At most one move per interval (plus the burst) for the whole run.
    let after = stat(bo, "movesOut").await - before;
    let burst: f64 = bo
        .eval("() => window.ambleDemo.limits().moveBurst", &[])
        .await;
    assert!(after <= 2.0 + burst + 2.0, "moves sent: {after}");
}

async fn chat_goes_both_ways_in_the_panel_and_as_a_bubble(ada: &Page, bo: &Page) {
    async fn say(page: &Page, text: &str) {
        page.fill("#chat-input", text).await;
        page.press("#chat-input", Key::Enter).await;
    }
    say(ada, "hello from Ada").await;
    bo.wait_for(
        "Ada's message in the panel",
        "(text) => document.querySelector('#messages').textContent.includes(text)",
        &[json!("hello from Ada")],
    )
    .await;
    assert_eq!(
        find(bo, "Ada").await.bubble.as_deref(),
        Some("hello from Ada")
    );
    say(bo, "hi Ada, Bo here").await;
    ada.wait_for(
        "Bo's bubble",
        "(text) => window.ambleDemo.members().find((m) => m.name === 'Bo')?.bubble === text",
        &[json!("hi Ada, Bo here")],
    )
    .await;
    let in_panel: bool = ada
        .eval(
            "() => /Bo\\s*hi Ada, Bo here/.test(document.querySelector('#messages').textContent)",
            &[],
        )
        .await;
    assert!(
        in_panel,
        "Bo's message in Ada's panel: {}",
        ada.text("#messages").await
    );
    assert_eq!(
        ada.value("#chat-input").await,
        "",
        "the input is cleared after sending"
    );
}

async fn the_hud_shows_measured_figures(ada: &Page) {
    ada.wait_for(
        "a round-trip time",
        "() => /\\d/.test(document.querySelector('#hud-rtt').textContent)",
        &[],
    )
    .await;
    assert_eq!(ada.text("#hud-members").await, "2");
    assert_eq!(ada.text("#hud-state").await, "Connected");
    let bytes_in = stat(ada, "bytesIn").await;
    let wire_bytes_in = stat(ada, "wireBytesIn").await;
    assert!(
        bytes_in > 0.0 && wire_bytes_in > bytes_in,
        "{bytes_in} {wire_bytes_in}"
    );
    ada.screenshot("room").await;
}

/// Returns the third page's errors.
async fn a_third_visitor_is_refused_because_the_room_is_full(
    browser: &Browser,
    server: &Server,
    ada: &Page,
) -> Vec<String> {
    let cy = open(browser, server, "cy").await;
    join(&cy, "Cy").await;
    cy.wait_visible("#lobby-error").await;
    let error = cy.text("#lobby-error").await;
    assert!(error.contains("room is full"), "{error}");
    assert!(cy.is_visible("#lobby").await);
    let state: String = cy.eval("() => window.ambleDemo.state()", &[]).await;
    assert_eq!(state, "open", "the socket stays open");
    assert_eq!(members(ada).await.len(), 2);
    cy.close().await
}

async fn after_a_restart_both_pages_reconnect_and_keep_their_places(
    server: Server,
    ada: &Page,
    bo: &Page,
) -> Server {
    let ada_before = find(ada, "Ada").await;
    let bo_before = find(bo, "Bo").await;
    let addr = server.addr;
    server.stop().await;
    ada.wait_for(
        "the reconnecting banner",
        "() => /Reconnecting/.test(document.querySelector('#banner').textContent)",
        &[],
    )
    .await;
    assert!(
        ada.is_visible("#room-view").await,
        "the room stays on screen meanwhile"
    );
    // The same port again, so the pages' URL still holds.
    let server = Server::at(addr, config()).await;
    for page in [ada, bo] {
        page.wait_for_within(
            WAIT + Duration::from_secs(5),
            "rejoined with two members",
            "() => window.ambleDemo.state() === 'joined' && window.ambleDemo.members().length === 2",
            &[],
        )
        .await;
    }
    // The new server put everyone at its arrival point; each page sent its own place back.
    wait_at(
        bo,
        "Ada",
        Point {
            x: ada_before.x,
            y: ada_before.y,
        },
        1.5,
    )
    .await;
    wait_at(
        ada,
        "Bo",
        Point {
            x: bo_before.x,
            y: bo_before.y,
        },
        1.5,
    )
    .await;
    ada.wait_for(
        "the banner gone",
        "() => document.querySelector('#banner').hidden",
        &[],
    )
    .await;
    let said: bool = ada
        .eval(
            "() => /Reconnected\\./.test(document.querySelector('#messages').textContent)",
            &[],
        )
        .await;
    assert!(
        said,
        "Reconnected. in the chat: {}",
        ada.text("#messages").await
    );
    server
}

async fn leaving_drops_the_member_on_the_other_page(ada: &Page, bo: &Page) {
    bo.click("#leave").await;
    bo.wait_visible("#lobby").await;
    ada.wait_for(
        "Bo gone",
        "() => !window.ambleDemo.members().some((m) => m.name === 'Bo')",
        &[],
    )
    .await;
    ada.wait_for(
        "Bo gone from the people list",
        "() => !document.querySelector('#people').textContent.includes('Bo')",
        &[],
    )
    .await;
    ada.wait_for(
        "Bo left. in the chat",
        "() => document.querySelector('#messages').textContent.includes('Bo left.')",
        &[],
    )
    .await;
}
