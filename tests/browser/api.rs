//! The server API seen in the demo (issue #18): the app's system message
//! shows in the chat as the server's, not a member's, and a kick through
//! the API takes the page back to the lobby saying why, without a
//! reconnect. Saves target/browser-artifacts/api/*.png.

use std::time::Duration;

use amble::config::Config;
use serde_json::{Value, json};

use crate::driver::{Browser, Server, Viewport, within};

const ROOM: &str = "api-test";
const KEY: &str = "browser-test-api-key-0123456789";

async fn api(server: &Server, method: &str, path: &str, body: Value) -> Value {
    let body = body.to_string();
    let raw = format!(
        "{method} {path} HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {KEY}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        server.addr,
        body.len()
    );
    let text = server.request(&raw).await;
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(
        head.starts_with("HTTP/1.1 200"),
        "{method} {path}: {head}\n{body}"
    );
    serde_json::from_str(body).expect("JSON")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_system_message_shows_as_the_servers_and_a_kick_ends_in_the_lobby() {
    let browser = Browser::start("api").await;
    let dir = tempfile::tempdir().expect("tempdir");
    let key = dir.path().join("api.key");
    std::fs::write(&key, KEY).expect("key file");
    within(Duration::from_secs(120), "the whole test", async {
        let mut config = Config::default();
        config.api.api_key_file = Some(key);
        let server = Server::with(config).await;
        let page = browser.open("ada", Viewport::DESKTOP).await;
        crate::driver::join(&page, &server, ROOM, "Ada").await;

        let sent = api(
            &server,
            "POST",
            &format!("/api/v1/rooms/{ROOM}/messages"),
            json!({ "text": "The talk starts in five minutes." }),
        )
        .await;
        assert_eq!(sent, json!({ "delivered": 1 }));
        page.wait_for(
            "the system message as the server's",
            "() => [...document.querySelectorAll('.chat-line')].some((li) => \
             li.querySelector('.from').textContent === 'Server' && \
             li.querySelector('.text').textContent === 'The talk starts in five minutes.')",
            &[],
        )
        .await;
        page.screenshot("system-message").await;

        let members = api(
            &server,
            "GET",
            &format!("/api/v1/rooms/{ROOM}/members"),
            json!({}),
        )
        .await;
        let id = members["members"][0]["id"].as_u64().expect("Ada's id");
        api(
            &server,
            "POST",
            &format!("/api/v1/rooms/{ROOM}/kick"),
            json!({ "member_id": id, "reason": "testing" }),
        )
        .await;
        let said = page
            .wait_for(
                "the lobby, saying why",
                "() => { const e = document.getElementById('lobby-error'); \
                 return !document.getElementById('lobby').hidden && !e.hidden && e.textContent; }",
                &[],
            )
            .await;
        assert_eq!(said, json!("You were removed from this room: testing."));
        page.screenshot("kicked").await;
        // No reconnect: the room stays empty.
        let rooms = api(&server, "GET", "/api/v1/rooms", json!({})).await;
        assert_eq!(rooms, json!({ "rooms": [] }));
        let errors = page.close().await;
        assert!(errors.is_empty(), "page errors: {errors:?}");
        server.stop().await;
    })
    .await;
}
