use super::*;

fn hooks(capacity: usize) -> (Arc<Hooks>, Arc<Metrics>) {
    let metrics = Arc::new(Metrics::default());
    let limits = Limits {
        capacity,
        batch: 10,
        first_retry: FIRST_RETRY,
        max_retry: MAX_RETRY,
    };
    let hooks = Hooks::new(
        limits,
        Some(Arc::from("n1")),
        Clock::start(),
        Arc::clone(&metrics),
    );
    (hooks, metrics)
}

#[tokio::test]
async fn kicked_is_queued_with_its_fields_and_counted() {
    let (hooks, metrics) = hooks(10);
    let room: Arc<str> = Arc::from("lobby");
    hooks.kicked(&room, 4, Some(Arc::from("u-9")), "kick", "spamming");
    hooks.kicked(&room, 5, None, "close", "");
    let events = hooks.drain_json();
    assert_eq!(events.len(), 2);
    let e = &events[0];
    assert_eq!(e["type"], "member.kicked");
    assert_eq!(e["room"], "lobby");
    assert_eq!(e["member_id"], 4);
    assert_eq!(e["user"], "u-9");
    assert_eq!(e["reason"], "spamming");
    assert_eq!(e["action"], "kick");
    assert_eq!(events[1]["action"], "close");
    assert_eq!(e["by"], "api");
    assert_eq!(e["node"], "n1");
    assert!(
        e["id"]
            .as_str()
            .is_some_and(|id| id.starts_with("n1-") && id.ends_with("-1"))
    );
    assert!(
        events[1]["id"]
            .as_str()
            .is_some_and(|id| id.ends_with("-2"))
    );
    assert_eq!(events[1]["user"], serde_json::Value::Null);
    let text = metrics.render();
    assert!(
        text.contains("amble_webhook_events_total{event=\"member.kicked\"} 2\n"),
        "{text}"
    );
}

#[tokio::test]
async fn a_full_queue_drops_the_oldest_and_counts_it() {
    let (hooks, metrics) = hooks(2);
    let room: Arc<str> = Arc::from("r");
    hooks.local_occupied(&room);
    hooks.joined(&room, 0, "Ada", None);
    hooks.left(
        &room,
        0,
        "Ada",
        None,
        crate::protocol::LeaveReason::TimedOut,
        5,
    );
    assert_eq!(hooks.queued(), 2);
    let text = metrics.render();
    assert!(
        text.contains("amble_webhook_dropped_total{reason=\"queue_full\"} 1\n"),
        "{text}"
    );
    assert!(text.contains("amble_webhook_queue_depth 2\n"), "{text}");
    let events = hooks.drain_json();
    let kinds: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
    assert_eq!(kinds, ["member.joined", "member.left"]);
    assert_eq!(events[1]["reason"], "timed_out");
    assert_eq!(events[1]["duration_ms"], 5);
}

#[test]
fn start_refuses_bad_flags_with_the_fix() {
    let metrics = || Arc::new(Metrics::default());
    let dir = tempfile::tempdir().expect("tempdir");
    let empty = dir.path().join("empty");
    std::fs::write(&empty, "\n").expect("write");
    let good = dir.path().join("secret");
    std::fs::write(&good, "s3cret\n").expect("write");
    let start = |url: Option<&str>, file: Option<&Path>| {
        let config = HookConfig {
            webhook_url: url.map(str::to_owned),
            webhook_secret_file: file.map(Path::to_owned),
            ..HookConfig::default()
        };
        Hooks::start(&config, None, Clock::start(), metrics()).map(|started| started.is_some())
    };
    assert!(matches!(start(None, None), Ok(false)));
    let err = |r: Result<bool, SetupError>| r.expect_err("refused").to_string();
    assert!(
        err(start(Some("http://127.0.0.1:9/h"), None)).contains("--webhook-secret-file is missing")
    );
    assert!(err(start(None, Some(&good))).contains("--webhook-url is missing"));
    assert!(err(start(Some("ftp://x/h"), Some(&good))).contains("https:// or http://"));
    assert!(err(start(Some("http://127.0.0.1:9/h"), Some(&empty))).contains("the file is empty"));
    let missing = dir.path().join("missing");
    assert!(err(start(Some("http://127.0.0.1:9/h"), Some(&missing))).contains("missing"));
    assert_eq!(read_secret(&good).expect("secret"), b"s3cret");
}

#[test]
fn leave_reasons_are_named_in_lower_snake_case() {
    use crate::protocol::LeaveReason;
    assert_eq!(leave_reason_name(LeaveReason::TimedOut), "timed_out");
    assert_eq!(leave_reason_name(LeaveReason::Replaced), "replaced");
    assert_eq!(leave_reason_name(LeaveReason::ServerLost), "server_lost");
}
