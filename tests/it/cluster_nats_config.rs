//! docs/cluster.md's NATS configuration, run as documented (issue #19):
//! its `nats.conf` block (users and permissions per node, TLS with client
//! certificates, the monitor on loopback), its openssl block for the TLS
//! files and its `amble` command, each taken from the page itself. The test
//! changes only addresses, ports and paths (into a temp dir), then checks
//! that two nodes share a room through that server, and that NATS refuses a
//! client without a password and a node's user outside its subjects.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use amble::protocol::pb::server_message::Body as S;
use amble::protocol::{MemberId, Motion, Position};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

use crate::cluster_support::*;
use crate::support::Client;

/// The page the blocks come from.
fn cluster_md() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/cluster.md");
    std::fs::read_to_string(&path).unwrap_or_else(|err| panic!("{}: {err}", path.display()))
}

/// The fenced block of `page` whose first line starts with `first_line`
/// (its text, without the fences).
fn block(page: &str, first_line: &str) -> String {
    let mut found = None;
    let mut lines = page.lines();
    while let Some(line) = lines.next() {
        if !line.trim_start().starts_with("```") {
            continue;
        }
        let body: Vec<&str> = lines
            .by_ref()
            .take_while(|l| !l.trim_start().starts_with("```"))
            .collect();
        if body.first().is_some_and(|l| l.starts_with(first_line)) {
            assert!(found.is_none(), "two blocks start with {first_line:?}");
            found = Some(body.join("\n") + "\n");
        }
    }
    found.unwrap_or_else(|| panic!("docs/cluster.md has no block starting with {first_line:?}"))
}

/// The words of a shell command block (continuation lines joined; no
/// quoting is used in the documented command).
fn words(command: &str) -> Vec<String> {
    command
        .replace("\\\n", " ")
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

/// nats-server run with the documented configuration, killed on drop.
struct Server {
    _child: Child,
    log: PathBuf,
    client: String,
    monitor: String,
}

impl Server {
    /// `nats-server -c conf` on free loopback ports (the flags override the
    /// file's `listen` and `http`), with the passwords in its environment.
    async fn start(conf: &Path, dir: &Path, passwords: &[(&str, &str)]) -> Self {
        let log = dir.join("nats.log");
        let out = std::fs::File::create(&log).expect("create nats.log");
        let child = Command::new(program(
            "nats-server",
            "apt-get install nats-server (scripts/test does)",
        ))
        .arg("-c")
        .arg(conf)
        .args(["-a", "127.0.0.1", "-p", "-1", "-m", "-1"])
        .envs(passwords.iter().copied())
        .stdin(Stdio::null())
        .stdout(out.try_clone().expect("dup"))
        .stderr(out)
        .kill_on_drop(true)
        .spawn()
        .expect("spawn nats-server");
        let text = poll(START, "nats-server to be ready", || async {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if text.contains("Server is ready") {
                Ok(text)
            } else {
                Err(text)
            }
        })
        .await;
        let after = |marker: &str| {
            text.lines()
                .find_map(|l| l.split_once(marker).map(|(_, a)| a.trim().to_owned()))
                .unwrap_or_else(|| panic!("no {marker:?} in nats-server's log:\n{text}"))
        };
        Self {
            _child: child,
            client: after("Listening for client connections on "),
            monitor: after("Starting http monitor on "),
            log,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// A NATS client of the test's own: TLS with `node`'s client certificate,
/// `user` and `password` if given; the server's errors arrive on the
/// receiver.
async fn nats_client(
    server: &Server,
    tls: &Path,
    node: &str,
    auth: Option<(&str, &str)>,
) -> Result<(async_nats::Client, mpsc::Receiver<String>), async_nats::ConnectError> {
    let (tx, rx) = mpsc::channel(16);
    let mut options = async_nats::ConnectOptions::new()
        .add_root_certificates(tls.join("ca.pem"))
        .add_client_certificate(
            tls.join(format!("{node}-cert.pem")),
            tls.join(format!("{node}-key.pem")),
        )
        .require_tls(true)
        .connection_timeout(Duration::from_secs(5))
        .event_callback(move |event| {
            let tx = tx.clone();
            async move {
                if let async_nats::Event::ServerError(err) = event {
                    let _ = tx.try_send(err.to_string());
                }
            }
        });
    if let Some((user, password)) = auth {
        options = options.user_and_password(user.into(), password.into());
    }
    let url = format!("tls://{}", server.client);
    bounded(SETTLE, "a NATS connect", options.connect(url.as_str()))
        .await
        .map(|client| (client, rx))
}

/// The next server error containing `want`.
async fn server_error(errors: &mut mpsc::Receiver<String>, want: &str) {
    bounded(SETTLE, want, async {
        loop {
            let err = errors.recv().await.expect("the client is alive");
            if err.contains(want) {
                return;
            }
        }
    })
    .await;
}

/// The documented set-up, end to end; see the module's comment.
#[tokio::test]
async fn the_documented_nats_configuration_runs_a_cluster_and_refuses_the_rest() {
    let page = cluster_md();
    let dir = tempfile::tempdir().expect("a temp dir");
    let root = dir.path();
    let nats_dir = root.join("nats");
    std::fs::create_dir_all(nats_dir.join("tls")).expect("mkdir");

    // The TLS files, by the documented openssl commands, for 127.0.0.1.
    let made = root.join("made");
    std::fs::create_dir_all(&made).expect("mkdir");
    let tls_block = block(&page, "# TLS files for NATS and the amble nodes");
    let openssl = std::process::Command::new("sh")
        .args(["-euc", &tls_block])
        .env("NATS_SAN", "IP:127.0.0.1")
        .env("PATH", {
            let openssl = program("openssl", "apt-get install openssl");
            let dir = openssl.parent().expect("a directory").to_owned();
            std::env::join_paths(std::iter::once(dir).chain(std::env::split_paths(
                &std::env::var_os("PATH").unwrap_or_default(),
            )))
            .expect("a PATH")
        })
        .current_dir(&made)
        .output()
        .expect("run sh");
    assert!(
        openssl.status.success(),
        "the documented openssl block failed: {}",
        String::from_utf8_lossy(&openssl.stderr)
    );
    for file in ["ca.pem", "server-cert.pem", "server-key.pem"] {
        std::fs::copy(made.join(file), nats_dir.join("tls").join(file)).expect("copy");
    }

    // nats.conf as documented, its paths moved into the temp dir.
    let conf_text = block(&page, "# nats.conf: amble nodes amble-1 and amble-2");
    assert!(conf_text.contains("http: 127.0.0.1:8222"), "{conf_text}");
    let conf = nats_dir.join("nats.conf");
    let nats_root = format!("{}/", nats_dir.display());
    std::fs::write(&conf, conf_text.replace("/etc/nats/", &nats_root)).expect("write");
    let passwords = [
        ("AMBLE_1_NATS_PASSWORD", "first-node-password-for-the-test"),
        ("AMBLE_2_NATS_PASSWORD", "second-node-password-for-the-test"),
    ];
    let nats = Server::start(&conf, root, &passwords).await;
    assert!(nats.monitor.starts_with("127.0.0.1:"), "{}", nats.monitor);

    // The documented amble command, for each node: its files under its own
    // /etc/amble, the NATS URL at the test's server, any listen address.
    let command = words(&block(&page, "amble --listen 10.0.0.11:3000"));
    assert_eq!(command.first().map(String::as_str), Some("amble"));
    let mut nodes = Vec::new();
    for (n, (_, password)) in (1..).zip(passwords) {
        let node = format!("amble-{n}");
        let etc = root.join(&node);
        let tls = etc.join("tls");
        std::fs::create_dir_all(&tls).expect("mkdir");
        std::fs::copy(made.join("ca.pem"), tls.join("ca.pem")).expect("copy");
        for end in ["cert.pem", "key.pem"] {
            let file = format!("{node}-{end}");
            std::fs::copy(made.join(&file), tls.join(&file)).expect("copy");
        }
        std::fs::write(etc.join("nats-password"), format!("{password}\n")).expect("write");
        std::fs::write(etc.join("metrics-token"), "a-metrics-token-for-the-test\n").expect("write");
        let etc = format!("{}/", etc.display());
        let mut args = Vec::new();
        let mut rest = command[1..].iter();
        while let Some(arg) = rest.next() {
            if arg == "--listen" {
                rest.next(); // Node::single listens on 127.0.0.1:0
                continue;
            }
            args.push(
                arg.replace("amble-1", &node)
                    .replace("/etc/amble/", &etc)
                    .replace("nats.example.internal:4222", &nats.client),
            );
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        nodes.push(Node::single(&args).await);
    }
    // /metrics wants the documented token, so /healthz says when they met.
    for (n, node) in (1..).zip(&nodes) {
        let want = format!("cluster amble-{n}: connected, 1 peer");
        poll(SETTLE, &want, || async {
            let (_, lines) = node.healthz().await;
            if lines.contains(&want) {
                Ok(())
            } else {
                Err(format!("{lines:?}"))
            }
        })
        .await;
    }

    // A join and a move on amble-1, seen from amble-2.
    let mut bo = Client::connect(&nodes[1].ws_url()).await;
    bo.join("vault", "Bo").await;
    let mut ada = Client::connect(&nodes[0].ws_url()).await;
    let ada_id = ada.join("vault", "Ada").await.member_id;
    let joined = bo
        .until(|m| match &m.body {
            Some(S::Joined(j)) => j.member.clone(),
            _ => None,
        })
        .await;
    assert_eq!((joined.id, joined.name.as_str()), (ada_id, "Ada"));
    ada.send_move(7, 9, 1).await;
    let here = Motion::standing(Position { x: 7, y: 9 });
    bo.until(|m| {
        let records = amble::protocol::decode_motion(&m.motion).ok()?.1;
        records
            .iter()
            .any(|r| r.member == MemberId(ada_id) && r.motion == here)
            .then_some(())
    })
    .await;

    // Each node counts the other's member: the room counts are a request
    // answered on the asker's inbox (allow_responses).
    for node in &nodes {
        poll(SETTLE, "/api/rooms to count both members", || async {
            let (_, body) = node.get("/api/rooms").await;
            let json: serde_json::Value = serde_json::from_str(&body).map_err(|e| e.to_string())?;
            let vault = json["rooms"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|r| r["name"] == "vault")
                .and_then(|r| r["members"].as_u64());
            if vault == Some(2) { Ok(()) } else { Err(body) }
        })
        .await;
    }

    // Nothing the nodes did was refused (a second answer to one request
    // would be, under allow_responses).
    for node in &nodes {
        let refused = node.log().matching("Violation");
        assert!(refused.is_empty(), "{refused:#?}");
    }

    // Both nodes are their own users.
    let (status, body) = http_get(nats.monitor.parse().expect("an address"), "/connz?auth=1").await;
    assert!(status.contains(" 200"), "{status}");
    let mut users: Vec<String> =
        serde_json::from_str::<serde_json::Value>(&body).expect("json")["connections"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c["authorized_user"].as_str().map(str::to_owned))
            .collect();
    users.sort();
    assert_eq!(users, ["amble-1", "amble-2"], "{body}");

    // A client without a password (TLS and its certificate in order).
    let tls = root.join("amble-1/tls");
    let refused = nats_client(&nats, &tls, "amble-1", None).await;
    let err = refused.expect_err("a client without a password is refused");
    assert_eq!(
        err.kind(),
        async_nats::ConnectErrorKind::AuthorizationViolation,
        "{err}"
    );

    // amble-1's user outside amble.>: NATS refuses the subscription and the
    // publish (and says so in its log).
    let (client, mut errors) =
        nats_client(&nats, &tls, "amble-1", Some(("amble-1", passwords[0].1)))
            .await
            .expect("amble-1's user connects");
    let _everything = client.subscribe(">").await.expect("queued");
    server_error(
        &mut errors,
        "Permissions Violation for Subscription to \">\"",
    )
    .await;
    client
        .publish("other.app", "hello".into())
        .await
        .expect("queued");
    server_error(
        &mut errors,
        "Permissions Violation for Publish to \"other.app\"",
    )
    .await;
    let log = nats.log();
    assert!(
        log.contains(r#"Subscription Violation - User "amble-1", Subject ">""#),
        "{log}"
    );
}
