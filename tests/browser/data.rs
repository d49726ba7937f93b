//! Member data in the demo (issue #19): in one page Ada picks a colour and
//! a status in the side panel; the other page shows the colour on her
//! avatar and the status under her name and in the People list, and sees
//! each change. Saves target/browser-artifacts/member_data/room.png.

use std::time::Duration;

use amble::config::Config;
use serde::Deserialize;
use serde_json::json;

use crate::driver::{Browser, Page, Server, Viewport, within};

const ROOM: &str = "data-test";

/// A member as the page renders it (`window.ambleDemo.members()`).
#[derive(Clone, Debug, Deserialize)]
struct Member {
    name: String,
    colour: String,
    status: String,
}

async fn member(page: &Page, name: &str) -> Member {
    let all: Vec<Member> = page.eval("() => window.ambleDemo.members()", &[]).await;
    all.into_iter()
        .find(|m| m.name == name)
        .unwrap_or_else(|| panic!("{}: no member {name}", page.label()))
}

async fn join(browser: &Browser, server: &Server, label: &str, name: &str) -> Page {
    let page = browser.open(label, Viewport::DESKTOP).await;
    crate::driver::join(&page, server, ROOM, name).await;
    page
}

/// Waits until `page` shows `name` with `colour` and `status`.
async fn shows(page: &Page, name: &str, colour: &str, status: &str) {
    page.wait_for(
        &format!("{name} in {colour}, status {status:?}"),
        "(name, colour, status) => { const m = window.ambleDemo.members().find((m) => m.name === name); \
         return !!m && m.colour === colour && m.status === status; }",
        &[json!(name), json!(colour), json!(status)],
    )
    .await;
}

/// Picks `value` in the side panel's control `selector`, as a person does
/// (a colour picker or a select only say `change` when the choice is made).
async fn pick(page: &Page, selector: &str, value: &str) {
    let _: bool = page
        .eval(
            "(sel, value) => { const el = document.querySelector(sel); el.value = value; \
             el.dispatchEvent(new Event('change', { bubbles: true })); return true; }",
            &[json!(selector), json!(value)],
        )
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_colour_and_a_status_picked_in_one_page_show_in_the_other() {
    let browser = Browser::start("member_data").await;
    within(Duration::from_secs(120), "the whole test", async {
        let server = Server::with(Config::default()).await;
        let ada = join(&browser, &server, "ada", "Ada").await;
        let bo = join(&browser, &server, "bo", "Bo").await;
        ada.wait_for(
            "two members",
            "() => window.ambleDemo.members().length === 2",
            &[],
        )
        .await;
        let before = member(&bo, "Ada").await;
        assert_eq!(before.status, "", "no status yet");

        pick(&ada, "#my-colour", "#e4572e").await;
        pick(&ada, "#my-status", "busy").await;
        shows(&bo, "Ada", "#e4572e", "busy").await;
        shows(&ada, "Ada", "#e4572e", "busy").await;
        bo.wait_for(
            "Ada's status in the People list",
            "() => [...document.querySelectorAll('#people .status')].some((s) => s.textContent === 'busy')",
            &[],
        )
        .await;
        bo.screenshot("room").await;

        // A change, in free text this time.
        pick(&ada, "#my-status", "other").await;
        assert!(ada.is_visible("#my-status-text").await);
        ada.fill("#my-status-text", "at lunch").await;
        pick(&ada, "#my-status-text", "at lunch").await;
        shows(&bo, "Ada", "#e4572e", "at lunch").await;
        // Bo's own avatar kept its colour.
        assert_eq!(member(&bo, "Bo").await.colour, member(&ada, "Bo").await.colour);

        // No status at all: nothing under the name.
        pick(&ada, "#my-status", "").await;
        shows(&bo, "Ada", "#e4572e", "").await;

        let mut errors = ada.close().await;
        errors.extend(bo.close().await);
        assert_eq!(errors, Vec::<String>::new(), "no errors in the pages");
        server.stop().await;
    })
    .await;
}
