//! A spatial room in the demo (issue #17): one page walks out of the
//! other's view (the other page loses it from the floor and the People
//! list, which says "1 of 2"), then back into it. A small interest radius
//! (1 m) keeps the walks short. Saves target/browser-artifacts/spatial/*.png.

use std::time::Duration;

use amble::config::Config;
use serde::Deserialize;
use serde_json::json;

use crate::driver::{Browser, Page, Server, Viewport, within};

const ROOM: &str = "plaza-browser";

#[derive(Debug, Deserialize)]
struct Point {
    x: f64,
    y: f64,
}

async fn me(page: &Page) -> Point {
    page.eval(
        "() => { const m = window.ambleDemo.members().find((m) => m.self); return { x: m.x, y: m.y }; }",
        &[],
    )
    .await
}

/// Clicks the floor of `page` at the world point `x, y` (cm).
async fn walk_to(page: &Page, x: f64, y: f64) {
    let point: Point = page
        .eval(
            "(x, y) => window.ambleDemo.worldToCanvas(x, y)",
            &[json!(x), json!(y)],
        )
        .await;
    let floor = page.rect("#floor").await;
    page.click_at(floor.x + point.x, floor.y + point.y).await;
}

async fn sees(page: &Page, what: &str, count: usize, people: &str) {
    page.wait_for(
        what,
        "(n, text) => window.ambleDemo.members().length === n && \
         document.getElementById('room-count').textContent === text",
        &[json!(count), json!(people)],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_walks_out_of_the_others_view_and_back() {
    let browser = Browser::start("spatial").await;
    within(Duration::from_secs(120), "the whole test", async {
        let mut config = Config::default();
        config.room.interest_radius = 100;
        let server = Server::with(config).await;
        let ada = browser.open("ada", Viewport::DESKTOP).await;
        crate::driver::join(&ada, &server, ROOM, "Ada").await;
        let bo = browser.open("bo", Viewport::DESKTOP).await;
        crate::driver::join(&bo, &server, ROOM, "Bo").await;
        let radius: u64 = ada
            .eval("() => window.ambleDemo.limits().interestRadius", &[])
            .await;
        assert_eq!(radius, 100);
        sees(&ada, "Bo in view", 2, "2 of 2").await;
        let start = me(&bo).await;
        // Six metres east: more than two cells and two margins away.
        walk_to(&bo, start.x + 600.0, start.y).await;
        sees(&ada, "Bo out of view", 1, "1 of 2").await;
        ada.screenshot("out-of-view").await;
        walk_to(&bo, start.x, start.y).await;
        sees(&ada, "Bo back in view", 2, "2 of 2").await;
        ada.screenshot("back-in-view").await;
        for page in [ada, bo] {
            let errors = page.close().await;
            assert!(errors.is_empty(), "page errors: {errors:?}");
        }
        server.stop().await;
    })
    .await;
}
