//! The demo's first ten minutes (issue 10, "The browser demo"): Enter and
//! Space press a focused button; someone off screen has an edge marker and
//! "Go to" in the People list brings them into view; the lobby says when
//! the server cannot be reached and recovers when it is back; remote
//! avatars never step back under a loaded main thread; the phone layout.
//! Each state is saved as target/browser-artifacts/<test>/<state>.png.

use std::time::Duration;

use amble::config::Config;
use fantoccini::key::Key;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::driver::{Browser, Page, Server, Viewport, join, within};

#[derive(Clone, Debug, Deserialize)]
struct Member {
    id: u32,
    name: String,
    #[serde(rename = "onScreen")]
    on_screen: bool,
}

async fn find(page: &Page, name: &str) -> Member {
    let all: Vec<Member> = page.eval("() => window.ambleDemo.members()", &[]).await;
    all.into_iter()
        .find(|m| m.name == name)
        .unwrap_or_else(|| panic!("{}: no member {name}", page.label()))
}

/// Focuses `selector` as the Tab key would.
async fn focus(page: &Page, selector: &str) {
    let focused: bool = page
        .eval(
            "(s) => { const el = document.querySelector(s); el.focus(); return document.activeElement === el; }",
            &[json!(selector)],
        )
        .await;
    assert!(focused, "{}: {selector} takes focus", page.label());
}

/// Presses and releases `key` in whatever has focus.
async fn tap_key(page: &Page, key: char) {
    page.key_down(key).await;
    page.key_up(key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enter_and_space_press_a_focused_button() {
    let browser = Browser::start("enter_and_space_press_a_focused_button").await;
    within(Duration::from_secs(120), "the whole test", async {
        let server = Server::with(Config::default()).await;
        let page = browser.open("kay", Viewport::DESKTOP).await;
        join(&page, &server, "keys", "Kay").await;

        // Enter on the zoom button zooms; the chat box does not take it.
        let before: f64 = page.eval("() => window.ambleDemo.camera().zoom", &[]).await;
        focus(&page, "#zoom-in").await;
        tap_key(&page, char::from(Key::Enter)).await;
        page.wait_for(
            "Enter to zoom in",
            "(z) => window.ambleDemo.camera().zoom > z",
            &[json!(before)],
        )
        .await;
        let active: String = page.eval("() => document.activeElement.id", &[]).await;
        assert_eq!(
            active, "zoom-in",
            "focus stays on the button, not the chat box"
        );
        page.screenshot("zoomed-with-enter").await;

        // Space on the Stats button hides the stats panel.
        assert!(page.is_visible("#hud").await, "stats shown on a desktop");
        focus(&page, "#stats-toggle").await;
        tap_key(&page, ' ').await;
        page.wait_for(
            "Space to hide the stats",
            "() => document.getElementById('hud').hidden",
            &[],
        )
        .await;
        assert_eq!(
            page.eval::<String>(
                "() => document.getElementById('stats-toggle').getAttribute('aria-pressed')",
                &[]
            )
            .await,
            "false"
        );
        page.screenshot("stats-hidden-with-space").await;

        // Enter on the floor still opens the chat, and Esc walks again.
        page.eval::<Value>("() => document.activeElement.blur()", &[])
            .await;
        tap_key(&page, char::from(Key::Enter)).await;
        page.wait_for(
            "Enter to chat",
            "() => document.activeElement.id === 'chat-input'",
            &[],
        )
        .await;
        assert!(
            page.is_visible("#chat-keys").await,
            "the hint says Esc walks again"
        );
        page.screenshot("typing-with-esc-hint").await;
        tap_key(&page, char::from(Key::Escape)).await;
        page.wait_for(
            "Esc to leave the chat box",
            "() => document.activeElement.id !== 'chat-input'",
            &[],
        )
        .await;

        // Enter on Leave leaves.
        focus(&page, "#leave").await;
        tap_key(&page, char::from(Key::Enter)).await;
        page.wait_visible("#lobby").await;
        assert_eq!(
            page.eval::<String>("() => document.title", &[]).await,
            "amble"
        );
        page.screenshot("left-with-enter").await;

        assert_eq!(
            page.close().await,
            Vec::<String>::new(),
            "no errors in the page"
        );
        server.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn someone_off_screen_is_marked_and_go_to_finds_them() {
    let browser = Browser::start("someone_off_screen_is_marked_and_go_to_finds_them").await;
    within(Duration::from_secs(150), "the whole test", async {
        let server = Server::with(Config::default()).await;
        let ada = browser.open("ada", Viewport::DESKTOP).await;
        let bo = browser.open("bo", Viewport::DESKTOP).await;
        join(&ada, &server, "far", "Ada").await;
        join(&bo, &server, "far", "Bo").await;
        ada.wait_for("Bo", "() => window.ambleDemo.members().length === 2", &[])
            .await;

        // Bo walks to the world's top left corner by clicking the minimap.
        let map = bo.rect("#minimap").await;
        bo.click_at(map.x + 10.0, map.y + 10.0).await;
        ada.wait_for(
            "Bo far off, standing",
            "() => { const b = window.ambleDemo.members().find((m) => m.name === 'Bo'); \
             return b && !b.walking && b.x < 1000 && b.y < 1000; }",
            &[],
        )
        .await;
        let seen = find(&ada, "Bo").await;
        assert!(!seen.on_screen, "Bo is off Ada's screen: {seen:?}");
        // An edge marker points at Bo, and Bo is on the minimap.
        let markers: Vec<Value> = ada.eval("() => window.ambleDemo.markers()", &[]).await;
        assert!(
            markers.iter().any(|m| m["id"] == seen.id),
            "a marker for Bo: {markers:?}"
        );
        assert!(ada.is_visible("#minimap").await);
        // Bo talks: the bubble is not drawn at the edge with no avatar under it.
        bo.fill("#chat-input", "over here!").await;
        bo.press("#chat-input", Key::Enter).await;
        ada.wait_for(
            "Bo's message",
            "() => document.getElementById('messages').textContent.includes('over here!')",
            &[],
        )
        .await;
        ada.screenshot("bo-off-screen-marked").await;

        // "Go to" in the People list walks Ada beside Bo.
        ada.click(&format!("#people button[data-id='{}']", seen.id)).await;
        ada.wait_for(
            "Bo on Ada's screen",
            "() => window.ambleDemo.members().find((m) => m.name === 'Bo').onScreen",
            &[],
        )
        .await;
        ada.wait_for(
            "Ada beside Bo",
            "() => { const [a, b] = ['Ada', 'Bo'].map((n) => window.ambleDemo.members().find((m) => m.name === n)); \
             return !a.walking && Math.hypot(a.x - b.x, a.y - b.y) < 200; }",
            &[],
        )
        .await;
        ada.screenshot("went-to-bo").await;

        let mut errors = ada.close().await;
        errors.extend(bo.close().await);
        assert_eq!(errors, Vec::<String>::new(), "no errors in the pages");
        server.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lobby_says_when_the_server_is_down_and_recovers() {
    let browser = Browser::start("the_lobby_says_when_the_server_is_down_and_recovers").await;
    within(Duration::from_secs(150), "the whole test", async {
        let server = Server::with(Config::default()).await;
        let addr = server.addr;
        let cy = browser.open("cy", Viewport::DESKTOP).await;
        let dee = browser.open("dee", Viewport::DESKTOP).await;
        join(&dee, &server, "open", "Dee").await;
        cy.goto(&server.url("/")).await;
        cy.wait_for(
            "the room listed",
            "() => document.querySelector('#rooms button[data-room=\"open\"]')",
            &[],
        )
        .await;
        cy.screenshot("lobby-up").await;

        server.stop().await;
        // No stale Join buttons: the list says the server is out of reach.
        cy.wait_for(
            "the lobby offline",
            "() => document.getElementById('lobby').classList.contains('offline') \
             && document.querySelectorAll('#rooms button').length === 0",
            &[],
        )
        .await;
        assert!(cy.text("#rooms").await.contains("Can't reach the server"));
        // A Join stops with a message instead of hanging on "Joining…".
        cy.fill("#name", "Cy").await;
        cy.click("#join").await;
        cy.wait_for(
            "why the Join failed",
            "() => /Can't reach the server/.test(document.getElementById('lobby-error').textContent)",
            &[],
        )
        .await;
        assert_eq!(cy.text("#join").await, "Join room");
        assert!(!cy.eval::<bool>("() => document.getElementById('join').disabled", &[]).await);
        cy.screenshot("lobby-server-down").await;
        // Dee, in the room, sees why and when it retries, in one line.
        let banner = dee.text("#banner").await;
        assert!(banner.contains("Reconnecting"), "{banner}");
        assert!(!banner.contains("in 0 s"), "{banner}");
        dee.fill("#chat-input", "anyone?").await;
        dee.press("#chat-input", Key::Enter).await;
        dee.wait_visible("#chat-status").await;
        assert!(dee.text("#chat-status").await.starts_with("Reconnecting"));
        assert_eq!(dee.value("#chat-input").await, "anyone?", "kept in the box");
        dee.screenshot("chat-while-reconnecting").await;

        // Back on the same address: the list returns, the message goes.
        let server = Server::at(addr, Config::default()).await;
        cy.wait_for(
            "the lobby online",
            "() => !document.getElementById('lobby').classList.contains('offline') \
             && document.getElementById('lobby-error').hidden",
            &[],
        )
        .await;
        dee.wait_for_within(
            Duration::from_secs(30),
            "Dee back in the room",
            "() => window.ambleDemo.state() === 'joined'",
            &[],
        )
        .await;
        dee.wait_for("the chat status gone", "() => document.getElementById('chat-status').hidden", &[])
            .await;
        cy.wait_for(
            "the room listed again",
            "() => document.querySelector('#rooms button[data-room=\"open\"]')",
            &[],
        )
        .await;
        cy.screenshot("lobby-back").await;

        let mut errors = cy.close().await;
        errors.extend(dee.close().await);
        assert_eq!(errors, Vec::<String>::new(), "no errors in the pages");
        server.stop().await;
    })
    .await;
}

/// Issue 18, "Demo faults a user met": one stop says one thing; after a long
/// outage "Reconnect now" does not wait out the backoff; the name field says
/// when it stops taking letters; an error in the lobby does not move the card.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnect_now_one_message_per_stop_and_the_name_limit() {
    let browser = Browser::start("reconnect_now_one_message_per_stop_and_the_name_limit").await;
    within(Duration::from_secs(150), "the whole test", async {
        let server = Server::with(Config::default()).await;
        let addr = server.addr;
        let eve = browser.open("eve", Viewport::DESKTOP).await;

        // The name field: 40 letters typed, 32 taken, and it says so.
        eve.goto(&server.url("/")).await;
        let card = eve.rect(".lobby-card").await;
        assert_eq!(eve.text("#name-hint").await, "", "no hint before the limit");
        eve.fill("#name", &"n".repeat(40)).await;
        assert_eq!(eve.value("#name").await.len(), 32);
        eve.wait_for(
            "the name limit said",
            "() => /At most 32 characters/.test(document.getElementById('name-hint').textContent)",
            &[],
        )
        .await;
        eve.wait_visible("#name-hint").await;
        // An error in the lobby keeps the card where it was.
        eve.fill("#room", "bad room").await;
        eve.click("#join").await;
        eve.wait_visible("#lobby-error").await;
        let with_error = eve.rect(".lobby-card").await;
        assert_eq!(
            (with_error.y, with_error.height),
            (card.y, card.height),
            "the card does not jump when an error shows"
        );
        eve.screenshot("name-limit-and-error").await;
        join(&eve, &server, "stops", "Eve").await;

        // One stop: the restart, said once, in the banner; nothing in the chat.
        server.stop().await;
        eve.wait_for(
            "the reconnecting banner",
            "() => /Reconnecting/.test(document.getElementById('banner-text').textContent)",
            &[],
        )
        .await;
        // Long enough down that the backoff is seconds.
        eve.wait_for_within(
            Duration::from_secs(40),
            "a backoff of 3 s or more",
            "() => window.ambleDemo.reconnectDueInMs() > 3000",
            &[],
        )
        .await;
        let banner = eve.text("#banner-text").await;
        assert!(banner.starts_with("The server went away. Reconnecting in") || banner.starts_with("The server is restarting. Reconnecting in"), "{banner}");
        assert!(!banner.contains("Can't reach"), "one reason for one stop: {banner}");
        let notices: Vec<String> = eve
            .eval(
                "() => [...document.querySelectorAll('#messages .notice')].map((n) => n.textContent)",
                &[],
            )
            .await;
        assert!(
            notices.iter().all(|n| !n.contains("restarting") && !n.contains("reach")),
            "the stop is not said again in the chat: {notices:?}"
        );
        eve.wait_visible("#reconnect-now").await;
        eve.screenshot("reconnect-now").await;

        // Back up: "Reconnect now" rejoins before the backoff is over.
        let server = Server::at(addr, Config::default()).await;
        let due: f64 = eve
            .eval(
                "() => { const due = window.ambleDemo.reconnectDueInMs(); window.dueAt = performance.now() + due; return due; }",
                &[],
            )
            .await;
        assert!(due > 1000.0, "the backoff still has {due} ms to go");
        eve.click("#reconnect-now").await;
        eve.wait_for(
            "Eve back in the room",
            "() => window.ambleDemo.state() === 'joined'",
            &[],
        )
        .await;
        let early: bool = eve.eval("() => performance.now() < window.dueAt", &[]).await;
        assert!(early, "rejoined before the backoff would have retried");
        eve.wait_for("the banner gone", "() => document.getElementById('banner').hidden", &[])
            .await;
        assert!(!eve.is_visible("#reconnect-now").await);

        let errors = eve.close().await;
        assert_eq!(errors, Vec::<String>::new(), "no errors in the page");
        server.stop().await;
    })
    .await;
}

/// Records, for `ms`, every frame's render time for others and where the
/// walker is drawn, while the page's main thread is kept busy in bursts
/// (messages and Pongs handled late, as under CPU load). Returns
/// `[[frameTimestamp, renderTime, x, y], ...]`.
const RECORD_UNDER_LOAD: &str = "(name, ms) => new Promise((done) => {
    const rows = [];
    const busy = setInterval(() => { const end = performance.now() + 120 + Math.random() * 180; while (performance.now() < end); }, 400);
    const start = performance.now();
    const frame = (t) => {
        const m = window.ambleDemo.members().find((m) => m.name === name);
        rows.push([t, window.ambleDemo.renderTimes().others, m.x, m.y]);
        if (t - start < ms) requestAnimationFrame(frame);
        else { clearInterval(busy); done(rows); }
    };
    requestAnimationFrame(frame);
})";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn avatars_never_step_back_under_load() {
    let browser = Browser::start("avatars_never_step_back_under_load").await;
    within(Duration::from_secs(150), "the whole test", async {
        let server = Server::with(Config::default()).await;
        let ada = browser.open("ada", Viewport::DESKTOP).await;
        let bo = browser.open("bo", Viewport::DESKTOP).await;
        join(&ada, &server, "load", "Ada").await;
        join(&bo, &server, "load", "Bo").await;
        ada.wait_for("Bo", "() => window.ambleDemo.members().length === 2", &[])
            .await;

        // Bo turns every 700 ms, mid-walk (so updates arrive while the
        // last walk is under way), while Ada's page is busy in bursts.
        let args = [json!("Bo"), json!(9000)];
        let record = ada.eval::<Vec<[f64; 4]>>(RECORD_UNDER_LOAD, &args);
        let turns = async {
            let floor = bo.rect("#floor").await;
            for i in 0..12 {
                let (dx, dy) = [(160.0, 0.0), (0.0, 120.0), (-160.0, 0.0), (0.0, -120.0)][i % 4];
                bo.click_at(
                    floor.x + floor.width / 2.0 + dx,
                    floor.y + floor.height / 2.0 + dy,
                )
                .await;
                tokio::time::sleep(Duration::from_millis(700)).await;
            }
        };
        let (rows, ()) = tokio::join!(record, turns);
        ada.screenshot("after-the-loaded-run").await;
        assert!(rows.len() > 100, "{} frames recorded", rows.len());
        // Bo walks at the demo's 300 cm/s.
        for pair in rows.windows(2) {
            let [t0, r0, x0, y0] = pair[0];
            let [t1, r1, x1, y1] = pair[1];
            assert!(
                r1 >= r0,
                "render time stepped back {} ms at frame {t1}",
                r0 - r1
            );
            // At most the walking speed, with room for a late update's ease:
            // never a jump back along the walk (128 cm in one frame, as seen).
            let step = (x1 - x0).hypot(y1 - y0);
            let allowed = 300.0 * (r1 - r0) / 1000.0 * 2.0 + 3.0;
            assert!(
                step <= allowed,
                "Bo moved {step:.1} cm in one frame ({:.1} ms render, {:.1} ms frame)",
                r1 - r0,
                t1 - t0
            );
        }
        let mut errors = ada.close().await;
        errors.extend(bo.close().await);
        assert_eq!(errors, Vec::<String>::new(), "no errors in the pages");
        server.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_phone_layout() {
    let browser = Browser::start("the_phone_layout").await;
    within(Duration::from_secs(150), "the whole test", async {
        let server = Server::with(Config::default()).await;
        let phone = browser.open("phone", Viewport::PHONE).await;
        phone.goto(&server.url("/")).await;
        phone.wait_visible("#name").await;
        // Inputs at 16 px in the text colour: no zoom on focus, no placeholder look.
        let style: Value = phone
            .eval(
                "() => { const s = getComputedStyle(document.getElementById('name')); \
                 return { size: s.fontSize, colour: s.color }; }",
                &[],
            )
            .await;
        assert_eq!(style["size"], "16px", "{style}");
        assert_eq!(style["colour"], "rgb(230, 237, 243)", "{style}");
        phone.screenshot("lobby").await;

        join(&phone, &server, "pocket", "🇫🇷 Marie").await;
        // The walk hint is there; the stats panel starts hidden, the toggle shows it.
        assert!(
            phone.is_visible("#hint").await,
            "the tap-to-walk hint on a phone"
        );
        assert!(phone.text("#hint").await.starts_with("Tap to walk"));
        assert!(
            !phone.is_visible("#hud").await,
            "stats hidden on a phone by default"
        );
        assert!(phone.is_visible("#minimap").await);
        assert_eq!(
            phone.eval::<String>("() => document.title", &[]).await,
            "pocket · amble"
        );
        phone.screenshot("room").await;
        phone.click("#stats-toggle").await;
        phone.wait_visible("#hud").await;
        let hud = phone.rect("#hud").await;
        let hint = phone.rect("#hint").await;
        assert!(
            hud.y + hud.height <= hint.y || hint.y + hint.height <= hud.y,
            "stats {hud:?} clear of the hint {hint:?}"
        );
        phone.screenshot("room-with-stats").await;
        // A long message: a bubble well under half the floor.
        let long = "a rather long message that goes on and on ".repeat(5);
        phone.fill("#chat-input", long.trim_end()).await;
        phone.press("#chat-input", Key::Enter).await;
        phone
            .wait_for(
                "the bubble",
                "() => window.ambleDemo.members()[0].bubble",
                &[],
            )
            .await;
        phone.screenshot("room-with-bubble").await;
        phone.click("#tab-people").await;
        phone.wait_visible("#people").await;
        phone.screenshot("people-tab").await;

        assert_eq!(
            phone.close().await,
            Vec::<String>::new(),
            "no errors in the page"
        );
        server.stop().await;
    })
    .await;
}
