//! The demo on a cluster (issue 9): a real nats-server and two amble nodes
//! as processes (from tests/it/cluster_support.rs), a page on node 1 and a
//! page on node 2 in one room; each sees the other walk. Saves
//! target/browser-artifacts/pages_on_two_nodes/node-1.png and node-2.png.

use std::time::Duration;

use serde::Deserialize;
use serde_json::json;

use crate::driver::{Browser, Page, Viewport, within};

#[path = "../it/cluster_support.rs"]
#[allow(dead_code)] // the integration tests use the rest
mod cluster_support;

use cluster_support::{Nats, Node, SETTLE, poll};

const ROOM: &str = "cluster-browser-test";

#[derive(Clone, Copy, Debug, Deserialize)]
struct Point {
    x: f64,
    y: f64,
}

/// Opens the demo served by `node` and joins the room as `name`.
async fn join(browser: &Browser, node: &Node, label: &str, name: &str) -> Page {
    let page = browser.open(label, Viewport::DESKTOP).await;
    page.goto(&format!("http://{}/", node.addr)).await;
    page.fill("#name", name).await;
    page.fill("#room", ROOM).await;
    page.click("#join").await;
    page.wait_for("joined", "() => window.ambleDemo.state() === 'joined'", &[])
        .await;
    page
}

/// `walker` clicks a point of the floor 3 m away from where it stands;
/// `watcher` (on the other node) sees it walk there, then arrive.
async fn walks_and_is_seen(walker: &Page, name: &str, watcher: &Page) {
    let me: Point = walker
        .eval(
            "() => { const m = window.ambleDemo.members().find((m) => m.self); \
             return { x: m.x, y: m.y }; }",
            &[],
        )
        .await;
    let width: f64 = walker
        .eval("() => window.ambleDemo.limits().worldWidth", &[])
        .await;
    let goal = Point {
        x: if me.x + 300.0 < width - 100.0 {
            me.x + 300.0
        } else {
            me.x - 300.0
        },
        y: 100f64.max(me.y - 150.0),
    };
    let on_canvas: Point = walker
        .eval(
            "(x, y) => window.ambleDemo.worldToCanvas(x, y)",
            &[json!(goal.x), json!(goal.y)],
        )
        .await;
    let floor = walker.rect("#floor").await;
    walker
        .click_at(floor.x + on_canvas.x, floor.y + on_canvas.y)
        .await;
    let target = walker
        .wait_for(
            &format!("{name} walking"),
            "() => window.ambleDemo.members().find((m) => m.self && m.walking)?.target",
            &[],
        )
        .await;
    let target: Point = serde_json::from_value(target).expect("a point");
    watcher
        .wait_for(
            &format!("{name} walking to the target on the other node"),
            "(name, x, y) => { const a = window.ambleDemo.members().find((m) => m.name === name); \
             return !!a && a.walking && !!a.target && a.target.x === x && a.target.y === y; }",
            &[json!(name), json!(target.x), json!(target.y)],
        )
        .await;
    watcher
        .wait_for(
            &format!("{name} arrived on the other node"),
            "(name, x, y) => { const a = window.ambleDemo.members().find((m) => m.name === name); \
             return !!a && !a.walking && Math.abs(a.x - x) < 0.5 && Math.abs(a.y - y) < 0.5; }",
            &[json!(name), json!(target.x), json!(target.y)],
        )
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_on_two_nodes_see_each_other_walk() {
    let browser = Browser::start("pages_on_two_nodes").await;
    within(Duration::from_secs(180), "the whole test", async {
        let nats = Nats::start().await;
        let n1 = Node::start(&nats, 1, &[]).await;
        let n2 = Node::start(&nats, 2, &[]).await;
        for node in [&n1, &n2] {
            poll(
                SETTLE,
                &format!("{} to hear its peer", node.name),
                || async {
                    match node.metric("amble_cluster_peers").await {
                        Some(1.0) => Ok(()),
                        other => Err(format!("amble_cluster_peers {other:?}")),
                    }
                },
            )
            .await;
        }

        let ada = join(&browser, &n1, "ada-on-node-1", "Ada").await;
        let bo = join(&browser, &n2, "bo-on-node-2", "Bo").await;
        for page in [&ada, &bo] {
            page.wait_for(
                "both members",
                "() => window.ambleDemo.members().map((m) => m.name).sort().join() === 'Ada,Bo'",
                &[],
            )
            .await;
            page.wait_for(
                "everyone standing",
                "() => window.ambleDemo.members().every((m) => !m.walking)",
                &[],
            )
            .await;
        }

        walks_and_is_seen(&ada, "Ada", &bo).await;
        walks_and_is_seen(&bo, "Bo", &ada).await;
        ada.screenshot("node-1").await;
        bo.screenshot("node-2").await;

        let mut errors = ada.close().await;
        errors.extend(bo.close().await);
        assert_eq!(errors, Vec::<String>::new(), "no errors in the pages");
    })
    .await;
}
