//! Issue 18, the back/forward cache: a page that navigates away leaves its
//! room at once (the SDK sends Leave and closes its socket on `pagehide`),
//! instead of staying until the socket times out; back from the cache it
//! rejoins (on `pageshow`), and everyone sees it once.

use std::time::Duration;

use amble::config::Config;
use serde_json::{Value, json};

use crate::driver::{Browser, Page, Server, Viewport, get_json, within};

const ROOM: &str = "bfcache-test";

/// How soon the others must see a page that went away leave: well under
/// any idle timeout, so it is the Leave and not a timeout.
const PROMPTLY: Duration = Duration::from_secs(3);

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_that_navigates_away_leaves_at_once_and_comes_back_once() {
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

        // Bo goes to another page of the server. A mark in Bo's page says,
        // on the way back, whether the page came from the cache.
        let _: Value = bo.eval("() => { window.bfcacheMark = 1; }", &[]).await;
        bo.goto(&server.url("/healthz")).await;
        ada.wait_for_within(
            PROMPTLY,
            "Bo gone at once",
            "() => !window.ambleDemo.members().some((m) => m.name === 'Bo') \
             && document.querySelector('#messages').textContent.includes('Bo left.')",
            &[],
        )
        .await;
        assert_eq!(members_on_server(&server).await, json!(1));

        // Back: from the back/forward cache, Bo rejoins by itself.
        within(Duration::from_secs(15), "bo: back", bo.client().back())
            .await
            .expect("history back");
        let restored: Value = bo
            .wait_for(
                "Bo's page back",
                "() => document.readyState === 'complete' && window.ambleDemo !== undefined \
                 && { mark: window.bfcacheMark ?? null, \
                 reasons: JSON.stringify(performance.getEntriesByType('navigation')[0]?.notRestoredReasons ?? null) }",
                &[],
            )
            .await;
        assert_eq!(
            restored["mark"],
            json!(1),
            "Bo's page was not restored from the back/forward cache: {restored}"
        );
        bo.wait_for(
            "Bo rejoined",
            "() => window.ambleDemo.state() === 'joined' && window.ambleDemo.members().length === 2",
            &[],
        )
        .await;
        ada.wait_for(
            "Bo back",
            "() => window.ambleDemo.members().some((m) => m.name === 'Bo')",
            &[],
        )
        .await;
        ada.wait_for(
            "Bo in Ada's People list",
            &format!("() => {{ const [m, p] = ({COUNT})('Bo'); return m === 1 && p === 1; }}"),
            &[],
        )
        .await;
        assert_eq!(count(&ada, "Bo").await, (1, 1), "Ada sees Bo once");
        bo.wait_for(
            "Bo's People list drawn",
            "() => document.querySelectorAll('#people li').length === 2",
            &[],
        )
        .await;
        assert_eq!(count(&bo, "Bo").await, (1, 1), "Bo sees itself once");
        assert_eq!(count(&bo, "Ada").await, (1, 1), "Bo sees Ada once");
        assert_eq!(members_on_server(&server).await, json!(2));

        let mut errors = ada.close().await;
        errors.extend(bo.close().await);
        assert_eq!(errors, Vec::<String>::new(), "no errors in the pages");
        server.stop().await;
    })
    .await;
}
