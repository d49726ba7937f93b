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

/// Waits until `node` counts `n` peers.
async fn peers_are(node: &Node, n: f64) {
    poll(
        SETTLE,
        &format!("{} to count {n} peers", node.name),
        || async {
            match node.metric("amble_cluster_peers").await {
                Some(v) if v == n => Ok(()),
                other => Err(format!("amble_cluster_peers {other:?}")),
            }
        },
    )
    .await;
}

/// Waits until each of `nodes` hears all the others.
async fn hear_each_other(nodes: &[&Node]) {
    for node in nodes {
        peers_are(node, (nodes.len() - 1) as f64).await;
    }
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
        hear_each_other(&[&n1, &n2]).await;

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

/// Samples, every 10 ms, how many members named `name` the page shows: the
/// most and the fewest ever seen (`window.__seen`).
const WATCH: &str = "(name) => { window.__seen = { most: 0, fewest: 99 }; setInterval(() => { \
     const n = window.ambleDemo.members().filter((m) => m.name === name).length; \
     window.__seen.most = Math.max(window.__seen.most, n); \
     window.__seen.fewest = Math.min(window.__seen.fewest, n); }, 10); return true; }";

#[derive(Debug, Deserialize, PartialEq)]
struct Seen {
    most: u32,
    fewest: u32,
}

/// A failover (issue 18): Ada's page is on n2 with `?nodes=` naming n2 and
/// n1; n2 is killed (`kill -9`). Her page comes back through n1 with its
/// resume token: her own People list never shows her twice, and Bo's page
/// on n1 never loses her (no leave, no join: one renumber) and shows no
/// notice that she left. Saves failover/ada.png and failover/bo.png.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_fails_over_to_another_node_without_a_duplicate_or_a_leave() {
    let browser = Browser::start("failover").await;
    within(Duration::from_secs(180), "the whole test", async {
        let nats = Nats::start().await;
        let n1 = Node::start(&nats, 1, &[]).await;
        let mut n2 = Node::start(&nats, 2, &[]).await;
        hear_each_other(&[&n1, &n2]).await;
        let bo = join(&browser, &n1, "bo", "Bo").await;
        let ada = browser.open("ada", Viewport::DESKTOP).await;
        ada.goto(&format!(
            "http://{}/?nodes={},{}",
            n2.addr,
            n2.addr.port(),
            n1.addr.port()
        ))
        .await;
        ada.fill("#name", "Ada").await;
        ada.fill("#room", ROOM).await;
        ada.click("#join").await;
        for page in [&ada, &bo] {
            page.wait_for(
                "both members",
                "() => window.ambleDemo.state() === 'joined' && \
                 window.ambleDemo.members().map((m) => m.name).sort().join() === 'Ada,Bo'",
                &[],
            )
            .await;
        }
        let old_id: u32 = bo
            .eval(
                "() => window.ambleDemo.members().find((m) => m.name === 'Ada').id",
                &[],
            )
            .await;
        let _: bool = ada.eval(WATCH, &[json!("Ada")]).await;
        let _: bool = bo.eval(WATCH, &[json!("Ada")]).await;

        // Notices are grouped and shown a moment later: Ada's arrival is
        // told before the kill, so that what follows it is the failover's.
        bo.wait_for(
            "the notice of Ada's arrival",
            "() => document.getElementById('messages').textContent.includes('Ada joined')",
            &[],
        )
        .await;
        let before = bo.text("#messages").await;
        n2.kill().await;
        // Ada's page is back, through n1, under a new id; Bo's sees the
        // new id on the same member.
        ada.wait_for(
            "Ada back in the room through n1",
            "(old) => window.ambleDemo.state() === 'joined' && \
             window.ambleDemo.members().some((m) => m.self && m.id !== old)",
            &[json!(old_id)],
        )
        .await;
        bo.wait_for(
            "Bo to see Ada renumbered",
            "(old) => window.ambleDemo.members().some((m) => m.name === 'Ada' && m.id !== old)",
            &[json!(old_id)],
        )
        .await;
        // Past n2's node timeout (3 s): nothing more happens to Ada.
        poll(SETTLE, "n1 to drop n2", || async {
            match n1.metric("amble_cluster_peers").await {
                Some(0.0) => Ok(()),
                other => Err(format!("amble_cluster_peers {other:?}")),
            }
        })
        .await;
        for page in [&ada, &bo] {
            let seen: Seen = page.eval("() => window.__seen", &[]).await;
            assert_eq!(
                seen,
                Seen { most: 1, fewest: 1 },
                "{}: Ada shown once throughout",
                page.label()
            );
            let names: String = page
                .eval(
                    "() => window.ambleDemo.members().map((m) => m.name).sort().join()",
                    &[],
                )
                .await;
            assert_eq!(names, "Ada,Bo", "{}", page.label());
        }
        let all = bo.text("#messages").await;
        let notices = all.strip_prefix(before.as_str()).unwrap_or(&all);
        assert!(
            !["Ada left", "Ada joined", "Ada lost", "Ada timed"]
                .iter()
                .any(|n| notices.contains(n)),
            "Bo's page told of a leave or a join: {notices:?}"
        );
        ada.screenshot("ada").await;
        bo.screenshot("bo").await;
        let mut errors = ada.close().await;
        errors.extend(bo.close().await);
        // Ada's page logs its lost connection to n2; nothing else.
        errors.retain(|e| !e.contains("WebSocket"));
        assert_eq!(errors, Vec::<String>::new(), "no errors in the pages");
    })
    .await;
}
