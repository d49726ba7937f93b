//! The SDK in an app's own page (issue #19): a page served from another
//! origin (another port of 127.0.0.1) imports `/amble.js` from amble, reads
//! `/api/rooms`, and joins a room through the SDK. Without CORS headers on
//! the client's files Chromium refuses the import ("blocked by CORS
//! policy"). Another page gets the SDK each of the three ways an app ships
//! it (docs/client.md, "Getting the SDK"): amble's `/amble.js`, amble's
//! versioned bundle, and the npm package served from the app's own origin
//! through an import map.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use amble::config::Config;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpListener;

use crate::driver::{Browser, Server, Viewport, join, within};

/// The app's page: imports the SDK from `amble` (an `http://host:port`
/// origin), reads the room list, joins `room` as `name`.
fn app_page(amble: &str, room: &str, name: &str) -> String {
    format!(
        r#"<!doctype html>
<meta charset="utf-8">
<title>an app's own page</title>
<script type="module">
  window.appLog = [];
  try {{
    const {{ AmbleClient }} = await import('{amble}/amble.js');
    const rooms = await (await fetch('{amble}/api/rooms')).json();
    window.appRooms = rooms.rooms;
    const client = new AmbleClient({{ url: '{ws}/ws' }});
    client.on('welcome', ({{ me, members }}) => {{
      window.appWelcome = {{ me: me.name, members: [...members.values()].map((m) => m.name) }};
    }});
    client.on('error', ({{ text }}) => window.appLog.push(text));
    client.join('{room}', '{name}');
  }} catch (err) {{
    window.appLog.push(String(err));
  }}
</script>"#,
        ws = amble.replacen("http", "ws", 1),
    )
}

/// Serves `page` at every path on 127.0.0.1:0, until dropped: the app's
/// own origin.
async fn app_origin(page: String) -> (String, tokio::task::JoinHandle<()>) {
    app_origin_with(page, HashMap::new()).await
}

/// As [`app_origin`], and `files` (path → JavaScript) at their own paths.
async fn app_origin_with(
    page: String,
    files: HashMap<String, String>,
) -> (String, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let files = Arc::new(files);
    let task = tokio::spawn(async move {
        loop {
            let Ok((mut tcp, _)) = listener.accept().await else {
                return;
            };
            let page = page.clone();
            let files = Arc::clone(&files);
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16_384 {
                    match tcp.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                // "GET /path HTTP/1.1"
                let head = String::from_utf8_lossy(&head);
                let path = head.split(' ').nth(1).unwrap_or("/");
                let (kind, body) = match files.get(path) {
                    Some(js) => ("text/javascript", js.as_str()),
                    None => ("text/html", page.as_str()),
                };
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: {kind}; charset=utf-8\r\n\
                     content-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = tcp.write_all(answer.as_bytes()).await;
            });
        }
    });
    (format!("http://{addr}"), task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_on_another_origin_imports_the_sdk_and_joins() {
    let browser = Browser::start("a_page_on_another_origin_imports_the_sdk_and_joins").await;
    within(Duration::from_secs(120), "the whole test", async {
        let server = Server::with(Config::default()).await;
        let amble = format!("http://{}", server.addr);
        // Someone is in the room already, so the room list has it.
        let host = browser.open("host", Viewport::DESKTOP).await;
        join(&host, &server, "xorigin", "Host").await;

        let (app, app_task) = app_origin(app_page(&amble, "xorigin", "Ada")).await;
        assert_ne!(app, amble, "two origins");
        let page = browser.open("app", Viewport::DESKTOP).await;
        page.goto(&format!("{app}/")).await;
        let welcome = page
            .wait_for(
                "the SDK's welcome on the app's page",
                "() => window.appWelcome || (window.appLog && window.appLog.length ? { log: window.appLog } : null)",
                &[],
            )
            .await;
        let mut members: Vec<String> = serde_json::from_value(welcome["members"].clone())
            .unwrap_or_else(|_| panic!("no welcome: {welcome}"));
        members.sort();
        assert_eq!(welcome["me"], json!("Ada"), "{welcome}");
        assert_eq!(members, ["Ada", "Host"], "{welcome}");
        let rooms: Value = page.eval("() => window.appRooms", &[]).await;
        let xorigin = rooms
            .as_array()
            .and_then(|r| r.iter().find(|r| r["name"] == "xorigin"))
            .unwrap_or_else(|| panic!("no xorigin in {rooms}"));
        assert!(xorigin["members"].as_u64() >= Some(1), "{rooms}");
        page.screenshot("joined-from-another-origin").await;
        let errors = page.close().await;
        assert!(errors.is_empty(), "console errors: {errors:?}");
        host.close().await;
        app_task.abort();
    })
    .await;
}

/// The first ```html block after "## A minimal page" in docs/client.md.
fn minimal_page() -> String {
    let doc = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/client.md"),
    )
    .expect("docs/client.md");
    let section = &doc[doc.find("## A minimal page").expect("the section")..];
    let block = &section[section.find("```html\n").expect("an html block") + 8..];
    block[..block.find("```").expect("the block's end")].to_owned()
}

/// docs/client.md's minimal page runs as written (only its `server` line
/// pointed at the test's server), from another origin: it joins `lobby`,
/// and a click on its canvas walks its member there, seen by the demo.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_docs_minimal_page_runs_as_written() {
    let browser = Browser::start("the_docs_minimal_page_runs_as_written").await;
    within(Duration::from_secs(150), "the whole test", async {
        let server = Server::with(Config::default()).await;
        let page = minimal_page();
        let written = "const server = 'http://127.0.0.1:3000';";
        assert!(page.contains(written), "the page's server line: {page}");
        let page = page.replace(
            written,
            &format!("const server = 'http://{}';", server.addr),
        );

        let host = browser.open("host", Viewport::DESKTOP).await;
        join(&host, &server, "lobby", "Host").await;

        let (app, app_task) = app_origin(page).await;
        let ada = browser.open("minimal", Viewport::DESKTOP).await;
        ada.goto(&format!("{app}/")).await;
        ada.wait_for(
            "the minimal page in lobby",
            "() => window.client && window.client.state === 'joined'",
            &[],
        )
        .await;
        host.wait_for(
            "Ada on the host's page",
            "() => window.ambleDemo.members().some((m) => m.name === 'Ada')",
            &[],
        )
        .await;
        // Members spawn around the middle; the canvas is 500 px for 5,000
        // cm, so (300, 200) px is (3000, 2000) cm, 5 to 6 m away.
        let far: Value = host
            .eval(
                "() => window.ambleDemo.members().find((m) => m.name === 'Ada')",
                &[],
            )
            .await;
        let (x, y) = (far["x"].as_f64().expect("x"), far["y"].as_f64().expect("y"));
        assert!(
            (x - 3000.0).hypot(y - 2000.0) > 300.0,
            "Ada spawned at the target: {far}"
        );
        let canvas = ada.rect("#world").await;
        ada.click_at(canvas.x + 300.0, canvas.y + 200.0).await;
        host.wait_for_within(
            Duration::from_secs(60),
            "Ada walking to (3000, 2000)",
            "() => { const a = window.ambleDemo.members().find((m) => m.name === 'Ada'); \
             return a && Math.abs(a.x - 3000) < 30 && Math.abs(a.y - 2000) < 30; }",
            &[],
        )
        .await;
        ada.screenshot("walked").await;
        let errors = ada.close().await;
        assert!(errors.is_empty(), "console errors: {errors:?}");
        host.close().await;
        app_task.abort();
    })
    .await;
}

/// The page of the three ways: an import map names the package's files on
/// the app's own origin (as a site serving its `node_modules`, or a
/// bundler's copy, would); each way's SDK joins `room` as its way's name.
fn three_ways_page(amble: &str, version: &str, room: &str) -> String {
    format!(
        r#"<!doctype html>
<meta charset="utf-8">
<title>the SDK three ways</title>
<script type="importmap">
{{ "imports": {{ "@amble/client": "/node_modules/@amble/client/amble.js" }} }}
</script>
<script type="module">
  window.appLog = [];
  window.ways = {{}};
  window.clients = {{}};
  const ways = {{
    served: () => import('{amble}/amble.js'),
    bundle: () => import('{amble}/dist/amble-{version}.js'),
    package: () => import('@amble/client'),
  }};
  for (const [way, load] of Object.entries(ways)) {{
    try {{
      const sdk = await load();
      const client = new sdk.AmbleClient({{ url: '{ws}/ws', warn: (text) => window.appLog.push(text) }});
      window.clients[way] = client;
      client.on('welcome', ({{ me }}) => {{
        window.ways[way] = {{
          me: me.name,
          sdk: [sdk.VERSION, sdk.PROTOCOL_REVISION],
          server: [client.serverVersion, client.serverRevision],
        }};
      }});
      client.on('error', ({{ text }}) => window.appLog.push(`${{way}}: ${{text}}`));
      client.join('{room}', way);
    }} catch (err) {{
      window.appLog.push(`${{way}}: ${{err}}`);
    }}
  }}
</script>"#,
        ws = amble.replacen("http", "ws", 1),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_gets_the_sdk_three_ways_and_each_joins() {
    let browser = Browser::start("a_page_gets_the_sdk_three_ways_and_each_joins").await;
    within(Duration::from_secs(120), "the whole test", async {
        let server = Server::with(Config::default()).await;
        let amble = format!("http://{}", server.addr);
        let version = env!("CARGO_PKG_VERSION");
        // The package as npm packs it, its files served by the app.
        let dir = tempfile::tempdir().expect("tempdir");
        let installed = testkit::package::install(dir.path());
        let mut files = HashMap::new();
        for rel in installed.files.iter().filter(|f| f.ends_with(".js")) {
            let text = std::fs::read_to_string(installed.root.join(rel)).expect("a package file");
            files.insert(format!("/node_modules/@amble/client/{rel}"), text);
        }
        let (app, app_task) =
            app_origin_with(three_ways_page(&amble, version, "ways"), files).await;
        assert_ne!(app, amble, "two origins");
        let page = browser.open("ways", Viewport::DESKTOP).await;
        page.goto(&format!("{app}/")).await;
        let ways = page
            .wait_for(
                "a Welcome for each way",
                "() => Object.keys(window.ways || {}).length === 3 ? window.ways \
                 : (window.appLog && window.appLog.length ? { log: window.appLog } : null)",
                &[],
            )
            .await;
        let revision = amble::protocol::PROTOCOL_REVISION;
        for way in ["served", "bundle", "package"] {
            assert_eq!(ways[way]["me"], json!(way), "{ways}");
            assert_eq!(
                ways[way]["sdk"],
                json!([version, revision]),
                "{way}: {ways}"
            );
            assert_eq!(
                ways[way]["server"],
                json!([version, revision]),
                "{way}: {ways}"
            );
        }
        // One room: each way's client sees the other two come in.
        page.wait_for(
            "each way's client with the three in its room",
            "() => Object.values(window.clients).every((c) => \
             [...c.members.values()].map((m) => m.name).sort().join() === 'bundle,package,served')",
            &[],
        )
        .await;
        let log: Value = page.eval("() => window.appLog", &[]).await;
        assert_eq!(
            log,
            json!([]),
            "no warning from a server of the SDK's revision"
        );
        page.screenshot("three-ways").await;
        let errors = page.close().await;
        assert!(errors.is_empty(), "console errors: {errors:?}");
        app_task.abort();
    })
    .await;
}
