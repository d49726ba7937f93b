//! Issue #18, webhooks: a real HTTP receiver (hyper, on 127.0.0.1:0) that
//! the test switches between accepting, failing with a status, and
//! stalling past `--webhook-timeout-ms`; amble started with the flags;
//! members joining and leaving over real WebSockets. Deliveries arrive in
//! batches, signed, with ids; after failures and stalls every event
//! arrives, in order; a full queue drops and counts; docs/api.md's Node
//! and Python examples verify a real delivery.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use amble::hooks::sign;
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::watch;

use amble::protocol::pb::{self, client_message::Body as C};

use crate::support::*;

/// How the receiver answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// 200.
    Accept,
    /// This status.
    Status(u16),
    /// Reads the request and never answers.
    Stall,
}

/// One POST the receiver read.
#[derive(Clone, Debug)]
pub struct Post {
    pub signature: String,
    pub content_type: String,
    pub body: Bytes,
    /// What it was answered (`None`: stalled).
    pub answer: Answer,
}

impl Post {
    /// The events of its body.
    pub fn events(&self) -> Vec<Value> {
        let v: Value = serde_json::from_slice(&self.body).expect("a JSON body");
        v["events"].as_array().expect("an events array").clone()
    }
}

/// The webhook receiver, until dropped.
pub struct Receiver {
    pub addr: SocketAddr,
    answer: Arc<Mutex<Answer>>,
    posts: watch::Receiver<Vec<Post>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Receiver {
    pub async fn start(answer: Answer) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let answer = Arc::new(Mutex::new(answer));
        let (record, posts) = watch::channel(Vec::new());
        let record = Arc::new(record);
        let shared = Arc::clone(&answer);
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let answer = Arc::clone(&shared);
                let record = Arc::clone(&record);
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                        let answer = Arc::clone(&answer);
                        let record = Arc::clone(&record);
                        async move {
                            let header = |name: &str| {
                                req.headers()
                                    .get(name)
                                    .and_then(|v| v.to_str().ok())
                                    .unwrap_or_default()
                                    .to_owned()
                            };
                            let signature = header(sign::HEADER);
                            let content_type = header("content-type");
                            let body = req.into_body().collect().await.map(|b| b.to_bytes());
                            let body = body.unwrap_or_default();
                            let now = *answer.lock().unwrap_or_else(PoisonError::into_inner);
                            record.send_modify(|posts| {
                                posts.push(Post {
                                    signature,
                                    content_type,
                                    body,
                                    answer: now,
                                });
                            });
                            let status = match now {
                                Answer::Accept => 200,
                                Answer::Status(code) => code,
                                Answer::Stall => std::future::pending().await,
                            };
                            let response = Response::builder()
                                .status(status)
                                .body(Full::new(Bytes::from_static(b"ok")))
                                .expect("a response");
                            Ok::<_, Infallible>(response)
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self {
            addr,
            answer,
            posts,
            task,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}/hooks/amble", self.addr)
    }

    /// Answers every later POST so.
    pub fn set(&self, answer: Answer) {
        *self.answer.lock().unwrap_or_else(PoisonError::into_inner) = answer;
    }

    /// Every POST so far.
    pub fn posts(&self) -> Vec<Post> {
        self.posts.borrow().clone()
    }

    /// Waits (within [`WAIT`]) until the POSTs so far satisfy `done`.
    pub async fn until(&self, what: &str, done: impl Fn(&[Post]) -> bool) -> Vec<Post> {
        let mut posts = self.posts.clone();
        within(what, async {
            let seen = posts
                .wait_for(|p| done(p))
                .await
                .expect("the receiver runs");
            seen.clone()
        })
        .await
    }
}

/// The events of the accepted POSTs, in the order received, each once
/// (a batch sent again after a lost answer is counted once).
fn accepted(posts: &[Post]) -> Vec<Value> {
    let mut seen = std::collections::HashSet::new();
    posts
        .iter()
        .filter(|p| p.answer == Answer::Accept)
        .flat_map(Post::events)
        .filter(|e| seen.insert(e["id"].as_str().expect("an id").to_owned()))
        .collect()
}

/// `type member_id` (or `type` alone) of each event.
fn summary(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .map(|e| {
            let kind = e["type"].as_str().expect("a type");
            match e.get("member_id") {
                Some(id) => format!("{kind} {id}"),
                None => kind.to_owned(),
            }
        })
        .collect()
}

/// The counter at the end of an event's id.
fn seq(event: &Value) -> u64 {
    let id = event["id"].as_str().expect("an id");
    id.rsplit('-')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{id}: no counter"))
}

/// Sends Leave (the member leaves with reason `left`), then closes.
async fn leave(mut client: Client) {
    client.send(C::Leave(pb::Leave {})).await;
}

const SECRET: &[u8] = b"\x00\xffwebhook secret\x80 with binary bytes";

/// A secret file (with the trailing line break editors add) in `dir`.
fn secret_file(dir: &Path) -> PathBuf {
    let path = dir.join("webhook-secret");
    let mut bytes = SECRET.to_vec();
    bytes.push(b'\n');
    std::fs::write(&path, bytes).expect("write the secret");
    path
}

fn now_ms() -> u64 {
    amble::auth::unix_now() * 1_000
}

#[tokio::test]
async fn deliveries_are_signed_batched_and_survive_failures_and_stalls() {
    let receiver = Receiver::start(Answer::Accept).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let secret = secret_file(dir.path());
    let server = TestServer::with(config(|c| {
        c.hooks.webhook_url = Some(receiver.url());
        c.hooks.webhook_secret_file = Some(secret);
        c.hooks.webhook_batch = 2;
        c.hooks.webhook_timeout_ms = 300;
        // The drops below leave (member.left) after this short resume grace.
        c.room.resume_grace_ms = 200;
    }))
    .await;

    // Accepting: the room fills, in order, in batches of at most 2.
    let (ada, _) = server.joined("hooks", "Ada").await;
    let (bo, _) = server.joined("hooks", "Bo").await;
    let posts = receiver
        .until("the first three events", |p| accepted(p).len() >= 3)
        .await;
    assert_eq!(
        summary(&accepted(&posts)),
        ["room.occupied", "member.joined 0", "member.joined 1"]
    );
    for post in &posts {
        assert_eq!(post.content_type, "application/json");
        assert!(
            post.events().len() <= 2,
            "batches of at most --webhook-batch"
        );
        assert!(
            sign::verify(SECRET, &post.signature, &post.body, now_ms(), 60_000),
            "{} does not verify",
            post.signature
        );
        assert!(!sign::verify(
            b"another secret",
            &post.signature,
            &post.body,
            now_ms(),
            60_000
        ));
    }
    let first = &accepted(&posts)[1];
    assert_eq!(first["room"], "hooks");
    assert_eq!(first["name"], "Ada");
    assert_eq!(first["user"], Value::Null);

    // Failing with 500: the next batch is tried again...
    receiver.set(Answer::Status(500));
    let (cy, _) = server.joined("hooks", "Cy").await;
    receiver
        .until("a POST answered 500", |p| {
            p.iter().any(|p| p.answer == Answer::Status(500))
        })
        .await;
    // ...then stalls past the timeout...
    receiver.set(Answer::Stall);
    receiver
        .until("a stalled POST", |p| {
            p.iter().any(|p| p.answer == Answer::Stall)
        })
        .await;
    drop(cy);
    leave(bo).await;
    drop(ada);
    // ...and recovers: everything arrives, once each, in order.
    receiver.set(Answer::Accept);
    let posts = receiver
        .until("every event after the failures", |p| {
            accepted(p).iter().any(|e| e["type"] == "room.vacated")
        })
        .await;
    let events = accepted(&posts);
    let kinds = summary(&events);
    assert_eq!(
        &kinds[..4],
        [
            "room.occupied",
            "member.joined 0",
            "member.joined 1",
            "member.joined 2"
        ]
    );
    let mut lefts: Vec<&str> = kinds[4..7].iter().map(String::as_str).collect();
    lefts.sort_unstable();
    assert_eq!(lefts, ["member.left 0", "member.left 1", "member.left 2"]);
    assert_eq!(kinds[7], "room.vacated");
    assert_eq!(kinds.len(), 8);
    let seqs: Vec<u64> = events.iter().map(seq).collect();
    assert!(
        seqs.windows(2).all(|w| w[1] == w[0] + 1),
        "in order, none missing: {seqs:?}"
    );
    for e in &events[4..7] {
        assert!(e["duration_ms"].as_u64().is_some(), "{e}");
        assert!(
            ["left", "disconnected"].contains(&e["reason"].as_str().expect("a reason")),
            "{e}"
        );
    }
    // Retries resend the same body (the same ids), signed anew.
    let posts = receiver.posts();
    let retried: Vec<&Post> = posts
        .iter()
        .filter(|p| {
            p.body
                == posts
                    .iter()
                    .find(|q| q.answer == Answer::Status(500))
                    .expect("a 500")
                    .body
        })
        .collect();
    assert!(
        retried.len() >= 3,
        "sent, failed, stalled, then accepted: {}",
        retried.len()
    );
    assert!(retried.iter().any(|p| p.answer == Answer::Accept));
    assert!(
        server
            .metric("amble_webhook_deliveries_total{outcome=\"status\"}")
            .await
            >= 1.0
    );
    assert!(
        server
            .metric("amble_webhook_deliveries_total{outcome=\"timeout\"}")
            .await
            >= 1.0
    );
    assert!(server.metric("amble_webhook_retries_total").await >= 2.0);
    assert_eq!(
        server
            .metric("amble_webhook_events_total{event=\"member.joined\"}")
            .await,
        3.0
    );
    server
        .until_metric("amble_webhook_queue_depth", |d| d == 0.0)
        .await;
    server.stop().await;
}

#[tokio::test]
async fn a_full_queue_drops_the_oldest_and_a_refused_batch_is_dropped() {
    let receiver = Receiver::start(Answer::Status(503)).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let secret = secret_file(dir.path());
    let server = TestServer::with(config(|c| {
        c.hooks.webhook_url = Some(receiver.url());
        c.hooks.webhook_secret_file = Some(secret);
        c.hooks.webhook_batch = 1;
        c.hooks.webhook_queue = 3;
    }))
    .await;
    // One batch (the occupied) stuck in flight, then 2 places: 6 events more.
    for name in ["A", "B", "C"] {
        let (c, _) = server.joined(&format!("full-{name}"), name).await;
        if name == "A" {
            receiver.until("the first attempt", |p| !p.is_empty()).await;
        }
        leave(c).await;
    }
    // Every event queued (or dropped) before the receiver recovers.
    server
        .until_metric("amble_webhook_events_total{event=\"room.vacated\"}", |n| {
            n == 3.0
        })
        .await;
    receiver.set(Answer::Accept);
    let posts = receiver
        .until("the queue to drain", |p| accepted(p).len() >= 3)
        .await;
    let events = accepted(&posts);
    assert_eq!(events[0]["type"], "room.occupied");
    assert_eq!(events[0]["room"], "full-A");
    // The newest events survived, and the jump in the ids shows the gap.
    let seqs: Vec<u64> = events.iter().map(seq).collect();
    assert_eq!(seqs[0], 1);
    assert!(seqs[1] > 2, "the oldest waiting were dropped: {seqs:?}");
    assert_eq!(events.last().expect("events")["type"], "room.vacated");
    assert_eq!(events.last().expect("events")["room"], "full-C");
    let dropped = server
        .metric("amble_webhook_dropped_total{reason=\"queue_full\"}")
        .await;
    // 3 rooms of 4 events: the one in flight and the 2 newest delivered.
    assert_eq!(events.len(), 3, "{seqs:?}");
    assert_eq!(dropped, 9.0, "{seqs:?}");

    // A 4xx (not 408 or 429) refuses the batch: dropped, counted, next.
    receiver.set(Answer::Status(422));
    let (d, _) = server.joined("refused", "D").await;
    server
        .until_metric("amble_webhook_dropped_total{reason=\"refused\"}", |n| {
            n >= 1.0
        })
        .await;
    receiver.set(Answer::Accept);
    leave(d).await;
    receiver
        .until("the events after the refusal", |p| {
            accepted(p)
                .iter()
                .any(|e| e["room"] == "refused" && e["type"] == "room.vacated")
        })
        .await;
    server.stop().await;
}

/// The ```LANG block of docs/api.md's "## Webhooks" section.
fn verify_example(lang: &str) -> String {
    let doc = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/api.md"))
        .expect("docs/api.md");
    let section = &doc[doc.find("## Webhooks").expect("the section")..];
    let open = format!("```{lang}\n");
    let rest = &section[section
        .find(&open)
        .unwrap_or_else(|| panic!("a {lang} block"))
        + open.len()..];
    rest[..rest.find("```").expect("the block's end")].to_owned()
}

#[tokio::test]
async fn the_docs_verification_examples_accept_a_real_delivery_and_nothing_else() {
    let receiver = Receiver::start(Answer::Accept).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let secret = secret_file(dir.path());
    let server = TestServer::with(config(|c| {
        c.hooks.webhook_url = Some(receiver.url());
        c.hooks.webhook_secret_file = Some(secret);
    }))
    .await;
    let (_ada, _) = server.joined("docs", "Ada").await;
    let posts = receiver.until("a delivery", |p| !p.is_empty()).await;
    let post = &posts[0];
    let write = |name: &str, bytes: &[u8]| {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).expect("write");
        path.to_str().expect("utf-8").to_owned()
    };
    let secret = write("secret.bin", SECRET);
    let body = write("body.json", &post.body);
    let mut tampered = post.body.to_vec();
    tampered[0] = b' ';
    let tampered = write("tampered.json", &tampered);

    let node = verify_example("js")
        + r#"
import { readFileSync } from "node:fs";
const [secret, header, body] = process.argv.slice(2);
console.log(verifyAmble(readFileSync(secret), header, readFileSync(body)));
"#;
    let python = verify_example("python")
        + r#"
import sys
secret, header, body = sys.argv[1:4]
print(verify_amble(open(secret, "rb").read(), header, open(body, "rb").read()))
"#;
    let node = write("verify.mjs", node.as_bytes());
    let python = write("verify.py", python.as_bytes());
    for (program, script, yes) in [
        ("node", &node, "true"),
        ("/usr/bin/python3", &python, "True"),
    ] {
        let no = if yes == "true" { "false" } else { "False" };
        let stale = post.signature.replacen("t=", "t=1", 1);
        for (header, body, want) in [
            (post.signature.as_str(), &body, yes),
            (post.signature.as_str(), &tampered, no),
            (stale.as_str(), &body, no),
            ("v1=00", &body, no),
        ] {
            let out = tokio::process::Command::new(program)
                .args([script.as_str(), &secret, header, body])
                .output()
                .await
                .unwrap_or_else(|err| panic!("{program}: {err}"));
            assert!(
                out.status.success(),
                "{program}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert_eq!(
                String::from_utf8_lossy(&out.stdout).trim(),
                want,
                "{program} {header}"
            );
        }
    }
    server.stop().await;
}

/// Issue #18: in a cluster each member's `member.joined` and `member.left`
/// come once, from its own node, and a room's `room.occupied` and
/// `room.vacated` once for the whole cluster, whichever node its first
/// and last members are on.
#[tokio::test]
async fn a_cluster_sends_each_room_transition_once() {
    use crate::cluster_support::{Nats, Node, START, has_peers};
    let receiver = Receiver::start(Answer::Accept).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let secret = secret_file(dir.path());
    let url = receiver.url();
    let secret = secret.to_str().expect("utf-8 path");
    let args = [
        "--webhook-url",
        url.as_str(),
        "--webhook-secret-file",
        secret,
        "--cluster-heartbeat-ms",
        "200",
    ];
    let nats = Nats::start().await;
    let n1 = Node::start(&nats, 1, &args).await;
    let n2 = Node::start(&nats, 2, &args).await;
    for node in [&n1, &n2] {
        has_peers(node, 1).await;
        node.log()
            .wait_for(START, "room transitions decided with the cluster", |line| {
                line.contains("now sent by the node chosen for each room")
                    .then_some(())
            })
            .await;
    }
    // The first member on n1, the second on n2; the first to leave is the
    // first to arrive, so the room empties on n2.
    let mut ada = Client::connect(&n1.ws_url()).await;
    ada.join("both", "Ada").await;
    receiver
        .until("room.occupied", |p| {
            accepted(p).iter().any(|e| e["type"] == "room.occupied")
        })
        .await;
    let mut bo = Client::connect(&n2.ws_url()).await;
    bo.join("both", "Bo").await;
    receiver
        .until("Bo's member.joined", |p| {
            accepted(p).iter().any(|e| e["name"] == "Bo")
        })
        .await;
    leave(ada).await;
    receiver
        .until("Ada's member.left", |p| {
            accepted(p)
                .iter()
                .any(|e| e["type"] == "member.left" && e["node"] == "n1")
        })
        .await;
    leave(bo).await;
    receiver
        .until("room.vacated", |p| {
            accepted(p).iter().any(|e| e["type"] == "room.vacated")
        })
        .await;
    // A last event from each node: each node's queue is in order, so what
    // either queued for "both" before it has arrived by then.
    let mut last1 = Client::connect(&n1.ws_url()).await;
    last1.join("last-n1", "L1").await;
    let mut last2 = Client::connect(&n2.ws_url()).await;
    last2.join("last-n2", "L2").await;
    let posts = receiver
        .until("the last events of both nodes", |p| {
            let events = accepted(p);
            ["last-n1", "last-n2"].iter().all(|room| {
                events
                    .iter()
                    .any(|e| e["room"] == *room && e["type"] == "member.joined")
            })
        })
        .await;
    let both: Vec<Value> = accepted(&posts)
        .into_iter()
        .filter(|e| e["room"] == "both")
        .collect();
    let kinds = |kind: &str| both.iter().filter(|e| e["type"] == kind).count();
    assert_eq!(kinds("room.occupied"), 1, "{both:#?}");
    assert_eq!(kinds("room.vacated"), 1, "{both:#?}");
    let per_node = |kind: &str, node: &str| {
        both.iter()
            .filter(|e| e["type"] == kind && e["node"] == node)
            .count()
    };
    assert_eq!(per_node("member.joined", "n1"), 1, "{both:#?}");
    assert_eq!(per_node("member.joined", "n2"), 1, "{both:#?}");
    assert_eq!(per_node("member.left", "n1"), 1, "{both:#?}");
    assert_eq!(per_node("member.left", "n2"), 1, "{both:#?}");
    assert_eq!(both.len(), 6, "{both:#?}");
    // Every delivery, from either node, verifies.
    for post in &posts {
        assert!(sign::verify(
            SECRET,
            &post.signature,
            &post.body,
            now_ms(),
            60_000
        ));
    }
}

/// A graceful stop queues every member's `member.left` (reason
/// `shutdown`) and the rooms' `room.vacated`, delivers them, and says so;
/// with the receiver failing, it gives up after its flush and says how
/// many were left.
#[tokio::test]
async fn a_graceful_stop_flushes_the_queue_and_says_what_was_left() {
    use crate::cluster_support::{Node, START};
    let receiver = Receiver::start(Answer::Accept).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let secret = secret_file(dir.path());
    let url = receiver.url();
    let args = [
        "--webhook-url",
        url.as_str(),
        "--webhook-secret-file",
        secret.to_str().expect("utf-8 path"),
    ];
    let mut node = Node::single(&args).await;
    let mut ada = Client::connect(&node.ws_url()).await;
    ada.join("stop", "Ada").await;
    receiver
        .until("Ada's member.joined", |p| accepted(p).len() >= 2)
        .await;
    node.terminate();
    let posts = receiver
        .until("the events of the stop", |p| {
            accepted(p).iter().any(|e| e["type"] == "room.vacated")
        })
        .await;
    let events = accepted(&posts);
    let left = events
        .iter()
        .find(|e| e["type"] == "member.left")
        .expect("Ada's member.left");
    assert_eq!(left["reason"], "shutdown");
    assert!(node.exited().await.success());
    assert!(
        node.log()
            .text()
            .contains("every queued event was delivered"),
        "{}",
        node.log().text()
    );

    receiver.set(Answer::Status(503));
    let mut node = Node::single(&args).await;
    let mut bo = Client::connect(&node.ws_url()).await;
    bo.join("stop", "Bo").await;
    receiver
        .until("a failed attempt", |p| {
            p.iter().any(|p| p.answer == Answer::Status(503))
        })
        .await;
    node.terminate();
    assert!(node.exited().await.success());
    let line = node
        .log()
        .wait_for(START, "the count of events left", |line| {
            line.contains("were not delivered before shutdown")
                .then(|| line.to_owned())
        })
        .await;
    // occupied, joined, left, vacated: none taken.
    assert!(line.contains("events=4"), "{line}");
}

/// A webhook flag without the other, or a secret file that is missing or
/// empty, stops the start with a message that names the flag.
#[tokio::test]
async fn bad_webhook_flags_stop_the_start() {
    use crate::cluster_support::Node;
    let dir = tempfile::tempdir().expect("tempdir");
    let empty = dir.path().join("empty");
    std::fs::write(&empty, "\n").expect("write");
    let empty = empty.to_str().expect("utf-8 path");
    let missing = dir.path().join("missing");
    let missing = missing.to_str().expect("utf-8 path");
    let url = "http://127.0.0.1:9/hooks";
    for (args, says) in [
        (
            vec!["--webhook-url", url],
            "--webhook-secret-file is missing",
        ),
        (
            vec!["--webhook-url", url, "--webhook-secret-file", empty],
            "the file is empty",
        ),
        (
            vec!["--webhook-url", url, "--webhook-secret-file", missing],
            missing,
        ),
        (
            vec!["--webhook-url", "ftp://x/h", "--webhook-secret-file", empty],
            "--webhook-url ftp://x/h",
        ),
    ] {
        let (status, log) = Node::refused("bad webhook flags", &args).await;
        assert!(!status.success(), "{args:?}");
        assert!(log.contains(says), "{args:?}: {log}");
    }
}

/// A kick through the server API sends `member.kicked` (the action, the
/// caller's reason, `by: api`), then the member's `member.left` (reason
/// `kicked`).
#[tokio::test]
async fn a_kick_through_the_api_sends_member_kicked_then_member_left() {
    const KEY: &str = "api-key-for-webhook-tests-0123456789";
    let receiver = Receiver::start(Answer::Accept).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let secret = secret_file(dir.path());
    let key = dir.path().join("api.key");
    std::fs::write(&key, format!("{KEY}\n")).expect("write the key");
    let server = TestServer::with(config(|c| {
        c.hooks.webhook_url = Some(receiver.url());
        c.hooks.webhook_secret_file = Some(secret);
        c.api.api_key_file = Some(key);
    }))
    .await;
    let (_ada, _) = server.joined("kicks", "Ada").await;
    let (_bo, bo) = server.joined("kicks", "Bo").await;
    let body = format!(r#"{{"member_id": {}, "reason": "spamming"}}"#, bo.member_id);
    let raw = format!(
        "POST /api/v1/rooms/kicks/kick HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {KEY}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len(),
        addr = server.addr,
    );
    let answer = request_at(server.addr, &raw).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let posts = receiver
        .until("Bo's member.left", |p| {
            accepted(p)
                .iter()
                .any(|e| e["type"] == "member.left" && e["name"] == "Bo")
        })
        .await;
    let events = accepted(&posts);
    let at = |kind: &str| {
        events
            .iter()
            .position(|e| e["type"] == kind && e["member_id"] == bo.member_id)
            .unwrap_or_else(|| panic!("no {kind}: {events:#?}"))
    };
    assert!(at("member.kicked") < at("member.left"), "{events:#?}");
    let kicked = &events[at("member.kicked")];
    assert_eq!(kicked["action"], "kick");
    assert_eq!(kicked["reason"], "spamming");
    assert_eq!(kicked["by"], "api");
    assert_eq!(kicked["room"], "kicks");
    assert_eq!(events[at("member.left")]["reason"], "kicked");

    // Closing the room takes Ada out the same way, then the room empties.
    let raw = format!(
        "DELETE /api/v1/rooms/kicks HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {KEY}\r\n\
         Content-Length: 0\r\nConnection: close\r\n\r\n",
        addr = server.addr,
    );
    let answer = request_at(server.addr, &raw).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let posts = receiver
        .until("room.vacated", |p| {
            accepted(p).iter().any(|e| e["type"] == "room.vacated")
        })
        .await;
    let tail: Vec<String> = accepted(&posts)
        .iter()
        .skip_while(|e| e["type"] != "member.left" || e["name"] != "Bo")
        .skip(1)
        .map(|e| format!("{} {} {}", e["type"], e["action"], e["reason"]))
        .collect();
    assert_eq!(
        tail,
        [
            r#""member.kicked" "close" """#,
            r#""member.left" null "room_closed""#,
            r#""room.vacated" null null"#,
        ]
    );
    server.stop().await;
}

/// A node killed with the last members of a room: the node left standing
/// sends the room's `room.vacated`, once, when it declares the other lost
/// (the killed node's own queue, and its members' `member.left`, die with
/// it).
#[tokio::test]
async fn a_lost_node_s_rooms_are_vacated_by_the_node_left() {
    use crate::cluster_support::{Nats, Node, START, has_peers};
    let receiver = Receiver::start(Answer::Accept).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let secret = secret_file(dir.path());
    let url = receiver.url();
    let args = [
        "--webhook-url",
        url.as_str(),
        "--webhook-secret-file",
        secret.to_str().expect("utf-8 path"),
        "--cluster-heartbeat-ms",
        "200",
        "--cluster-node-timeout-ms",
        "1000",
    ];
    let nats = Nats::start().await;
    let n1 = Node::start(&nats, 1, &args).await;
    let mut n2 = Node::start(&nats, 2, &args).await;
    for node in [&n1, &n2] {
        has_peers(node, 1).await;
        node.log()
            .wait_for(START, "room transitions decided with the cluster", |line| {
                line.contains("now sent by the node chosen for each room")
                    .then_some(())
            })
            .await;
    }
    let mut cy = Client::connect(&n2.ws_url()).await;
    cy.join("lost", "Cy").await;
    receiver
        .until("room.occupied and Cy's member.joined", |p| {
            let events = accepted(p);
            events.iter().any(|e| e["type"] == "room.occupied")
                && events.iter().any(|e| e["name"] == "Cy")
        })
        .await;
    n2.kill().await;
    receiver
        .until("room.vacated after n2's loss", |p| {
            accepted(p).iter().any(|e| e["type"] == "room.vacated")
        })
        .await;
    // A last event from n1: whatever it queued before has arrived by then.
    let mut last = Client::connect(&n1.ws_url()).await;
    last.join("last-n1", "L1").await;
    let posts = receiver
        .until("n1's last event", |p| {
            accepted(p).iter().any(|e| e["room"] == "last-n1")
        })
        .await;
    let events = accepted(&posts);
    let vacated: Vec<&Value> = events
        .iter()
        .filter(|e| e["room"] == "lost" && e["type"] == "room.vacated")
        .collect();
    assert_eq!(vacated.len(), 1, "{events:#?}");
    assert_eq!(vacated[0]["node"], "n1");
}
