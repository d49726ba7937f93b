//! Issue 18, the back/forward cache: a page that navigates away closes its
//! socket without a Leave (`pagehide`, persisted), and the server holds its
//! place for the resume grace; back from the cache within it (`pageshow`)
//! the SDK resumes the place with its token: one member, never two, and
//! the others see no Left and no Joined. Away longer than the grace, the
//! others see it leave, and it comes back as a fresh join, once.

use std::time::Duration;

use amble::config::Config;
use serde_json::{Value, json};

use crate::driver::{Browser, Page, Server, Viewport, get_json, within};

const ROOM: &str = "bfcache-test";

/// The resume grace of the second test: a page away longer than this is
/// seen to leave.
const SHORT_GRACE_MS: u32 = 2_000;

async fn open_and_join(browser: &Browser, server: &Server, label: &str, name: &str) -> Page {
    let page = browser.open(label, Viewport::DESKTOP).await;
    crate::driver::join(&page, server, ROOM, name).await;
    page
}

/// How many times `name` is in the page's members and in its People list.
const COUNT: &str = "(name) => [\
    window.ambleDemo.members().filter((m) => m.name === name).length, \
    [...document.querySelectorAll('#people li .who')].filter((w) => w.textContent === name).length]";

async fn count(page: &Page, name: &str) -> (u64, u64) {
    page.eval(COUNT, &[json!(name)]).await
}

async fn members_on_server(server: &Server) -> Value {
    let rooms = get_json(server, "/api/rooms").await;
    rooms["rooms"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|r| r["name"] == ROOM)
        .map_or(json!(0), |r| r["members"].clone())
}

/// How many times `page`'s messages say `text`.
async fn says(page: &Page, text: &str) -> u64 {
    page.eval(
        "(text) => document.querySelector('#messages').textContent.split(text).length - 1",
        &[json!(text)],
    )
    .await
}

/// Navigates `page` to another page of `server`, then back, and waits for
/// it to be restored from the back/forward cache and joined again.
async fn away_and_back(page: &Page, server: &Server, away: Option<Duration>, wait: &Page) {
    // A mark in the page says, on the way back, whether it came from the cache.
    let _: Value = page.eval("() => { window.bfcacheMark = 1; }", &[]).await;
    page.goto(&server.url("/healthz")).await;
    if let Some(away) = away {
        // Away for a while: the others' pages keep drawing meanwhile.
        let until = tokio::time::Instant::now() + away;
        while tokio::time::Instant::now() < until {
            let _: Value = wait
                .eval("() => window.ambleDemo.members().length", &[])
                .await;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    within(Duration::from_secs(15), "back", page.client().back())
        .await
        .expect("history back");
    let restored: Value = page
        .wait_for(
            "the page back",
            "() => document.readyState === 'complete' && window.ambleDemo !== undefined \
             && { mark: window.bfcacheMark ?? null, \
             reasons: JSON.stringify(performance.getEntriesByType('navigation')[0]?.notRestoredReasons ?? null) }",
            &[],
        )
        .await;
    assert_eq!(
        restored["mark"],
        json!(1),
        "the page was not restored from the back/forward cache: {restored}"
    );
    page.wait_for(
        "rejoined",
        "() => window.ambleDemo.state() === 'joined' && window.ambleDemo.members().length === 2",
        &[],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_back_from_the_cache_resumes_its_place_unseen() {
    let browser = Browser::start("bfcache").await;
    within(Duration::from_secs(180), "the whole test", async {
        let server = Server::with(Config::default()).await;
        let ada = open_and_join(&browser, &server, "ada", "Ada").await;
        let bo = open_and_join(&browser, &server, "bo", "Bo").await;
        ada.wait_for(
            "Bo in the room",
            "() => window.ambleDemo.members().length === 2",
            &[],
        )
        .await;
        let bo_id: u64 = bo
            .eval(
                "() => window.ambleDemo.members().find((m) => m.self).id",
                &[],
            )
            .await;
        // Bo's arrival is announced (batched for 0.4 s): once, and only once.
        ada.wait_for(
            "Bo's arrival told",
            "() => document.querySelector('#messages').textContent.includes('Bo joined')",
            &[],
        )
        .await;

        // Bo goes to another page of the server and comes back: its place
        // was held meanwhile, and the others never saw it go.
        away_and_back(&bo, &server, Some(Duration::from_secs(2)), &ada).await;
        assert_eq!(
            server
                .metric("amble_resumed_total{node=\"same_node\"}")
                .await,
            1.0,
            "Bo's place was resumed"
        );
        assert_eq!(members_on_server(&server).await, json!(2));
        ada.wait_for(
            "Bo in Ada's People list",
            &format!("() => {{ const [m, p] = ({COUNT})('Bo'); return m === 1 && p === 1; }}"),
            &[],
        )
        .await;
        assert_eq!(count(&ada, "Bo").await, (1, 1), "Ada sees Bo once");
        let seen_id: u64 = ada
            .eval(
                "() => window.ambleDemo.members().find((m) => m.name === 'Bo').id",
                &[],
            )
            .await;
        assert_eq!(seen_id, bo_id, "the same member all along");
        // The notices go out in one batch: once the join shows, a leave
        // would have shown with it or before.
        ada.wait_for(
            "Bo's join notice",
            "() => document.querySelector('#messages').textContent.includes('Bo joined')",
            &[],
        )
        .await;
        assert_eq!(says(&ada, "Bo left").await, 0, "Ada saw Bo leave");
        assert_eq!(says(&ada, "Bo joined").await, 1, "Ada saw Bo join again");
        bo.wait_for(
            "Bo's People list drawn",
            "() => document.querySelectorAll('#people li').length === 2",
            &[],
        )
        .await;
        assert_eq!(count(&bo, "Bo").await, (1, 1), "Bo sees itself once");
        assert_eq!(count(&bo, "Ada").await, (1, 1), "Bo sees Ada once");

        let mut errors = ada.close().await;
        errors.extend(bo.close().await);
        assert_eq!(errors, Vec::<String>::new(), "no errors in the pages");
        server.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_away_past_the_grace_is_seen_to_leave_and_comes_back_once() {
    let browser = Browser::start("bfcache-grace").await;
    within(Duration::from_secs(180), "the whole test", async {
        let mut config = Config::default();
        config.room.resume_grace_ms = SHORT_GRACE_MS;
        let server = Server::with(config).await;
        let ada = open_and_join(&browser, &server, "ada", "Ada").await;
        let bo = open_and_join(&browser, &server, "bo", "Bo").await;
        ada.wait_for(
            "Bo in the room",
            "() => window.ambleDemo.members().length === 2",
            &[],
        )
        .await;
        let grace = Duration::from_millis(u64::from(SHORT_GRACE_MS));
        away_and_back(&bo, &server, Some(grace * 3), &ada).await;
        assert_eq!(
            says(&ada, "Bo left").await,
            1,
            "Ada saw Bo leave after the grace"
        );
        assert_eq!(server.metric("amble_resume_expired_total").await, 1.0);
        ada.wait_for(
            "Bo back in Ada's People list, once",
            &format!("() => {{ const [m, p] = ({COUNT})('Bo'); return m === 1 && p === 1; }}"),
            &[],
        )
        .await;
        bo.wait_for(
            "Bo's People list drawn",
            "() => document.querySelectorAll('#people li').length === 2",
            &[],
        )
        .await;
        assert_eq!(count(&bo, "Bo").await, (1, 1), "Bo sees itself once");
        assert_eq!(members_on_server(&server).await, json!(2));

        let mut errors = ada.close().await;
        errors.extend(bo.close().await);
        assert_eq!(errors, Vec::<String>::new(), "no errors in the pages");
        server.stop().await;
    })
    .await;
}

/// Issue 18: a page the browser freezes (a background tab) for two minutes
/// keeps its place, or resumes it unseen: when it thaws, it is in the room
/// once, and the others never saw it leave or join.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_frozen_for_two_minutes_keeps_its_place() {
    const FROZEN: Duration = Duration::from_secs(120);
    let browser = Browser::start("bfcache-frozen").await;
    within(FROZEN + Duration::from_secs(120), "the whole test", async {
        let server = Server::with(Config::default()).await;
        let ada = open_and_join(&browser, &server, "ada", "Ada").await;
        let bo = open_and_join(&browser, &server, "bo", "Bo").await;
        ada.wait_for(
            "Bo's arrival told",
            "() => document.querySelector('#messages').textContent.includes('Bo joined')",
            &[],
        )
        .await;
        let bo_id: u64 = bo
            .eval("() => window.ambleDemo.members().find((m) => m.self).id", &[])
            .await;

        let _: Value = bo
            .cdp("Page.setWebLifecycleState", json!({ "state": "frozen" }))
            .await;
        // Frozen: its timers and its socket's events wait. Ada moves now and
        // then, so frames keep going to the frozen page.
        let floor = ada.rect("#floor").await;
        let until = tokio::time::Instant::now() + FROZEN;
        let mut step = 0u32;
        while tokio::time::Instant::now() < until {
            step += 1;
            // A click on Ada's floor near the middle: a walk, a frame to Bo.
            let dx = f64::from(step % 5) * 20.0 - 40.0;
            ada.click_at(floor.x + floor.width / 2.0 + dx, floor.y + floor.height / 2.0 + 30.0)
                .await;
            assert_eq!(count(&ada, "Bo").await.0, 1, "Ada sees Bo all along");
            tokio::time::sleep(Duration::from_secs(5)).await;
        }
        let _: Value = bo
            .cdp("Page.setWebLifecycleState", json!({ "state": "active" }))
            .await;
        bo.wait_for(
            "Bo in the room again",
            "() => window.ambleDemo.state() === 'joined' && window.ambleDemo.members().length === 2",
            &[],
        )
        .await;
        // Give a reconnect, if the thawed page makes one, time to settle.
        tokio::time::sleep(Duration::from_secs(3)).await;
        bo.wait_for(
            "Bo joined and drawn",
            "() => window.ambleDemo.state() === 'joined' \
             && document.querySelectorAll('#people li').length === 2",
            &[],
        )
        .await;
        assert_eq!(count(&bo, "Bo").await, (1, 1), "Bo sees itself once");
        assert_eq!(count(&bo, "Ada").await, (1, 1), "Bo sees Ada once");
        assert_eq!(count(&ada, "Bo").await, (1, 1), "Ada sees Bo once");
        let seen_id: u64 = ada
            .eval("() => window.ambleDemo.members().find((m) => m.name === 'Bo').id", &[])
            .await;
        assert_eq!(seen_id, bo_id, "the same member all along");
        assert_eq!(says(&ada, "Bo left").await, 0, "Ada saw Bo leave");
        assert_eq!(says(&ada, "Bo joined").await, 1, "Ada saw Bo join again");
        assert_eq!(members_on_server(&server).await, json!(2));

        let mut errors = ada.close().await;
        errors.extend(bo.close().await);
        assert_eq!(errors, Vec::<String>::new(), "no errors in the pages");
        server.stop().await;
    })
    .await;
}
