//! Signed tokens on Join: refusals, room patterns, one avatar per user.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use amble::auth::{Claims, mint_hs256, unix_now};
use amble::protocol::LeaveReason;
use amble::protocol::pb::{self, ErrorCode, client_message::Body as C, server_message::Body as S};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::Command;

use crate::cluster_support::{Nats, Node, has_peers};
use crate::jwks_server::{
    JwksServer, Serve, ed25519_jwk, eddsa_token, key_set, rs256_token, rsa_jwk,
};
use crate::support::*;

const SECRET: &[u8] = b"integration-test-secret-of-more-than-32-bytes";

/// A directory of files for one test, removed when it ends.
pub(crate) struct Files {
    dir: tempfile::TempDir,
}

impl Files {
    pub(crate) fn new(test: &str) -> Self {
        let dir = tempfile::Builder::new()
            .prefix(&format!("amble-it-{test}-"))
            .tempdir()
            .expect("temp dir");
        Self { dir }
    }

    pub(crate) fn write(&self, name: &str, content: &[u8]) -> PathBuf {
        let path = self.dir.path().join(name);
        std::fs::write(&path, content).expect("write");
        path
    }
}

fn key(name: &str) -> Vec<u8> {
    std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/keys")
            .join(name),
    )
    .expect("test key")
}

/// A server that requires HS256 tokens signed with `SECRET`.
pub(crate) async fn hs256_server(files: &Files) -> TestServer {
    TestServer::with(config(|c| hs256(files, c))).await
}

/// Makes `c` require HS256 tokens signed with `SECRET`.
pub(crate) fn hs256(files: &Files, c: &mut amble::config::Config) {
    c.auth.auth_hs256_secret_file = Some(files.write("secret", SECRET));
}

pub(crate) fn claims(sub: &str) -> Claims {
    Claims {
        sub: sub.into(),
        exp: unix_now() + 600,
        name: None,
        rooms: None,
        start: None,
        data: None,
        share_sub: false,
    }
}

pub(crate) fn token(claims: &Claims) -> String {
    mint_hs256(SECRET, claims).expect("mint")
}

pub(crate) async fn send_join(c: &mut Client, room: &str, name: &str, token: &str) {
    c.send(C::Join(pb::Join {
        data: Vec::new(),
        start: None,
        room: room.into(),
        name: name.into(),
        token: token.into(),
        resume_token: String::new(),
    }))
    .await;
}

pub(crate) async fn join_with(c: &mut Client, room: &str, name: &str, token: &str) -> pb::Welcome {
    send_join(c, room, name, token).await;
    c.welcome().await
}

fn names(w: &pb::Welcome) -> Vec<String> {
    let snapshot = w.snapshot.as_ref().expect("snapshot");
    snapshot.members.iter().map(|m| m.name.clone()).collect()
}

async fn refused(server: &TestServer, reason: &str) -> f64 {
    server
        .metric(&format!("amble_auth_refused_total{{reason=\"{reason}\"}}"))
        .await
}

#[tokio::test]
async fn a_valid_token_joins_and_its_name_replaces_the_one_asked_for() {
    let files = Files::new("accepted");
    let server = hs256_server(&files).await;
    let mut c = server.client().await;
    let mut named = claims("user-1");
    named.name = Some("Ada (verified)".into());
    let w = join_with(&mut c, "lobby", "Anyone", &token(&named)).await;
    assert_eq!(names(&w), ["Ada (verified)"]);

    // Without a name claim, the name asked for stands.
    let mut d = server.client().await;
    let w = join_with(&mut d, "lobby", "Bo", &token(&claims("user-2"))).await;
    assert_eq!(names(&w), ["Ada (verified)", "Bo"]);

    // With one, the Join may leave its own name empty.
    let mut e = server.client().await;
    let mut only_token = claims("user-3");
    only_token.name = Some("Cy".into());
    let w = join_with(&mut e, "lobby", "", &token(&only_token)).await;
    assert_eq!(names(&w).last().map(String::as_str), Some("Cy"));
    assert_eq!(server.metric("amble_auth_admitted_total").await, 3.0);
}

#[tokio::test]
async fn every_bad_token_is_unauthenticated_counted_and_the_socket_stays() {
    let files = Files::new("refusals");
    let server = hs256_server(&files).await;
    let mut expired = claims("u");
    expired.exp = unix_now() - 3_600;
    let hs384 = jsonwebtoken::encode(
        &Header::new(Algorithm::HS384),
        &claims("u"),
        &EncodingKey::from_secret(SECRET),
    )
    .expect("sign");
    let cases = [
        ("missing", String::new()),
        ("malformed", "not.a.jwt".to_owned()),
        (
            "bad_signature",
            mint_hs256(b"some other secret, also 32 bytes long", &claims("u")).expect("mint"),
        ),
        ("expired", token(&expired)),
        ("algorithm", hs384),
    ];
    for (reason, bad) in &cases {
        let mut c = server.client().await;
        send_join(&mut c, "lobby", "Ada", bad).await;
        let text = c.expect_error(ErrorCode::Unauthenticated).await;
        assert!(!text.is_empty(), "{reason}");
        assert_eq!(refused(&server, reason).await, 1.0, "{reason}: {text}");
        // Refused, not closed: the same socket joins with a good token.
        join_with(&mut c, "lobby", "Ada", &token(&claims("u"))).await;
    }
    assert_eq!(
        server
            .metric("amble_rejected_total{reason=\"unauthenticated\"}")
            .await,
        cases.len() as f64
    );
}

#[tokio::test]
async fn rooms_limit_where_a_token_may_join_with_wildcards() {
    let files = Files::new("rooms");
    let server = hs256_server(&files).await;
    let mut limited = claims("u");
    limited.rooms = Some(vec!["team-*".into(), "lobby".into()]);
    let limited = token(&limited);
    for room in ["team-blue", "team-", "lobby"] {
        let mut c = server.client().await;
        join_with(&mut c, room, "Ada", &limited).await;
    }
    for room in ["lobby2", "team", "other"] {
        let mut c = server.client().await;
        send_join(&mut c, room, "Ada", &limited).await;
        let text = c.expect_error(ErrorCode::Forbidden).await;
        assert!(text.contains(room), "{text}");
    }
    assert_eq!(refused(&server, "forbidden").await, 3.0);
    assert_eq!(
        server
            .metric("amble_rejected_total{reason=\"forbidden\"}")
            .await,
        3.0
    );
}

#[tokio::test]
async fn a_tokens_name_still_keeps_the_name_rule() {
    let files = Files::new("name-rule");
    let server = hs256_server(&files).await;
    for bad in ["   ", "a\u{7}b", &"n".repeat(33)] {
        let mut c = server.client().await;
        let mut named = claims("u");
        named.name = Some(bad.into());
        send_join(&mut c, "lobby", "Fine", &token(&named)).await;
        let text = c.expect_error(ErrorCode::InvalidName).await;
        assert!(text.contains("token"), "{text}");
    }
    // No name anywhere.
    let mut c = server.client().await;
    send_join(&mut c, "lobby", "", &token(&claims("u"))).await;
    c.expect_error(ErrorCode::InvalidName).await;
}

#[tokio::test]
async fn the_same_user_joining_again_replaces_the_older_connection() {
    let files = Files::new("replace");
    let server = hs256_server(&files).await;
    let mut bystander = server.client().await;
    join_with(&mut bystander, "lobby", "Bystander", &token(&claims("b"))).await;
    let mut old = server.client().await;
    let first = join_with(&mut old, "lobby", "Ada", &token(&claims("ada"))).await;
    bystander
        .until(|m| matches!(&m.body, Some(S::Joined(_))).then_some(()))
        .await;

    let mut new = server.client().await;
    let second = join_with(&mut new, "lobby", "Ada again", &token(&claims("ada"))).await;
    assert_eq!(names(&second), ["Bystander", "Ada again"]);

    // The older connection is told why, then closed with 4000.
    old.expect_error(ErrorCode::Replaced).await;
    assert_eq!(old.expect_close().await, 4000);

    // The room sees the old member leave, then the new one join.
    match bystander.recv().await.body {
        Some(S::Left(l)) => {
            assert_eq!(l.member_id, first.member_id);
            assert_eq!(l.reason, LeaveReason::Replaced as i32);
        }
        other => panic!("expected Left, got {other:?}"),
    }
    match bystander.recv().await.body {
        Some(S::Joined(j)) => {
            let m = j.member.expect("member");
            assert_eq!((m.id, m.name.as_str()), (second.member_id, "Ada again"));
        }
        other => panic!("expected Joined, got {other:?}"),
    }
    new.ping().await;
    assert_eq!(server.metric("amble_auth_replaced_total").await, 1.0);
    assert_eq!(server.metric("amble_members").await, 2.0);

    // Another room is another avatar: nothing is replaced.
    let mut elsewhere = server.client().await;
    join_with(&mut elsewhere, "garden", "Ada", &token(&claims("ada"))).await;
    new.ping().await;
    assert_eq!(server.metric("amble_auth_replaced_total").await, 1.0);
}

#[tokio::test]
async fn without_a_key_amble_stays_open_and_ignores_tokens() {
    let server = TestServer::start().await;
    let (_a, w) = server.joined("lobby", "Ada").await;
    assert_eq!(names(&w), ["Ada"]);
    let mut c = server.client().await;
    let w = join_with(&mut c, "lobby", "Bo", "whatever.this.is").await;
    assert_eq!(names(&w), ["Ada", "Bo"]);
    // Two joins as "one user" are two members: there are no users here.
    assert_eq!(server.metric("amble_members").await, 2.0);
    assert_eq!(refused(&server, "missing").await, 0.0);
}

#[tokio::test]
async fn an_ed25519_public_key_accepts_eddsa_tokens_only() {
    let files = Files::new("eddsa");
    let path = files.write("public.pem", &key("ed25519-public.pem"));
    let server = TestServer::with(config(|c| c.auth.auth_public_key_file = Some(path))).await;
    let signing = EncodingKey::from_ed_pem(&key("ed25519-private.pem")).expect("key");
    let eddsa =
        jsonwebtoken::encode(&Header::new(Algorithm::EdDSA), &claims("u"), &signing).expect("sign");
    let mut c = server.client().await;
    join_with(&mut c, "lobby", "Ada", &eddsa).await;
    // An HS256 token (here keyed with the public key's own bytes) is refused.
    let confused = mint_hs256(&key("ed25519-public.pem"), &claims("u")).expect("mint");
    let mut d = server.client().await;
    send_join(&mut d, "lobby", "Eve", &confused).await;
    d.expect_error(ErrorCode::Unauthenticated).await;
    assert_eq!(refused(&server, "algorithm").await, 1.0);
}

#[tokio::test]
async fn a_short_secret_stops_the_server_naming_the_flag() {
    let files = Files::new("short");
    let path = files.write("secret", b"too short\n");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let config = config(|c| c.auth.auth_hs256_secret_file = Some(path));
    let err = within("serve to fail", amble::serve(listener, config, async {}))
        .await
        .expect_err("refused");
    let text = err.to_string();
    assert!(text.starts_with("--auth-hs256-secret-file "), "{text}");
    assert!(text.contains("at least 32"), "{text}");
}

// ------------------------------------------------------------ the binary

async fn amble(args: &[&str]) -> std::process::Output {
    let child = Command::new(env!("CARGO_BIN_EXE_amble"))
        .args(args)
        .env_remove("AMBLE_AUTH_HS256_SECRET_FILE")
        .env_remove("AMBLE_AUTH_PUBLIC_KEY_FILE")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn amble");
    within("amble to exit", child.wait_with_output())
        .await
        .expect("output")
}

#[tokio::test]
async fn amble_token_prints_a_token_the_server_accepts() {
    let files = Files::new("cli");
    let secret = files.write("secret", SECRET);
    let secret = secret.to_str().expect("utf-8 path");
    let out = amble(&[
        "token",
        "--sub",
        "cli-user",
        "--name",
        "From the CLI",
        "--rooms",
        "team-*,lobby",
        "--ttl",
        "1h",
        "--secret-file",
        secret,
    ])
    .await;
    assert!(out.status.success(), "{out:?}");
    let printed = String::from_utf8(out.stdout).expect("utf-8");
    let token = printed.trim();
    assert_eq!(printed, format!("{token}\n"));

    let server = hs256_server(&files).await;
    let mut c = server.client().await;
    let w = join_with(&mut c, "team-blue", "ignored", token).await;
    assert_eq!(names(&w), ["From the CLI"]);
    let mut d = server.client().await;
    send_join(&mut d, "garden", "x", token).await;
    d.expect_error(ErrorCode::Forbidden).await;
}

/// Issue #19: `amble token --data KEY=VALUE --share-sub` mints the `data`
/// and `share_sub` claims.
#[tokio::test]
async fn amble_token_sets_data_and_shares_the_sub() {
    let files = Files::new("cli-data");
    let secret = files.write("secret", SECRET);
    let secret = secret.to_str().expect("utf-8 path");
    let out = amble(&[
        "token",
        "--sub",
        "cli-user",
        "--data",
        "role=host",
        "--data",
        "team=blue",
        "--share-sub",
        "--secret-file",
        secret,
    ])
    .await;
    assert!(out.status.success(), "{out:?}");
    let token = String::from_utf8(out.stdout).expect("utf-8");
    let server = hs256_server(&files).await;
    let mut c = server.client().await;
    let w = join_with(&mut c, "lobby", "Ada", token.trim()).await;
    let me = &w.snapshot.as_ref().expect("snapshot").members[0];
    assert_eq!(me.user, "cli-user");
    let data: Vec<(&str, &str)> = me
        .data
        .iter()
        .map(|e| (e.key.as_str(), e.value.as_str()))
        .collect();
    assert_eq!(data, [("role", "host"), ("team", "blue")]);
}

#[tokio::test]
async fn amble_token_refuses_bad_arguments_clearly() {
    let files = Files::new("cli-bad");
    let good = files.write("secret", SECRET);
    let good = good.to_str().expect("utf-8 path");
    let short = files.write("short", b"short");
    let short = short.to_str().expect("utf-8 path");
    for (args, says) in [
        (vec!["--ttl", "1w", "--secret-file", good], "s, m, h or d"),
        (vec!["--ttl", "10", "--secret-file", good], "needs a unit"),
        (vec!["--secret-file", short], "--secret-file"),
        (vec!["--rooms", "a b", "--secret-file", good], "--rooms"),
        (vec!["--name", " ", "--secret-file", good], "--name"),
        (vec!["--data", "role", "--secret-file", good], "KEY=VALUE"),
        (
            vec!["--data", "Role=x", "--secret-file", good],
            "--data: key \"Role\"",
        ),
        (
            vec!["--data", "k=", "--secret-file", good],
            "--data: key \"k\"",
        ),
    ] {
        let out = amble(&[&["token", "--sub", "u"][..], &args[..]].concat()).await;
        assert!(!out.status.success(), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
}

/// Starts the server binary and returns the log lines up to the one that
/// reports its address.
async fn start_up_lines(args: &[&str]) -> Vec<String> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_amble"))
        .args(["--listen", "127.0.0.1:0"])
        .args(args)
        .env("RUST_LOG", "info")
        .env_remove("AMBLE_AUTH_HS256_SECRET_FILE")
        .env_remove("AMBLE_AUTH_PUBLIC_KEY_FILE")
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn amble");
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let mut seen = Vec::new();
    within("the start-up lines", async {
        while let Some(line) = lines.next_line().await.expect("read stderr") {
            seen.push(line);
            let said = |what: &str| seen.iter().any(|l| l.contains(what));
            if said("addr=") && (said("open mode") || said("tokens required")) {
                break;
            }
        }
    })
    .await;
    seen
}

#[tokio::test]
async fn the_server_says_once_at_start_whether_joins_need_tokens() {
    let open = start_up_lines(&[]).await;
    let open_lines: Vec<_> = open.iter().filter(|l| l.contains("open mode")).collect();
    assert_eq!(open_lines.len(), 1, "{open:?}");

    let files = Files::new("start-up");
    let secret = files.write("secret", SECRET);
    let closed =
        start_up_lines(&["--auth-hs256-secret-file", secret.to_str().expect("utf-8")]).await;
    assert!(
        closed.iter().any(|l| l.contains("tokens required")),
        "{closed:?}"
    );
    assert!(
        !closed.iter().any(|l| l.contains("open mode")),
        "{closed:?}"
    );
}

/// Issue #19: an identity provider's token names an audience and an
/// issuer; with `--auth-audience` and `--auth-issuer` such a token joins,
/// and one for another audience or from another issuer is refused, counted
/// under its reason, on a socket that stays.
#[tokio::test]
async fn an_identity_providers_token_joins_with_its_audience_and_issuer() {
    let files = Files::new("audience");
    let path = files.write("secret", SECRET);
    let server = TestServer::with(config(|c| {
        c.auth.auth_hs256_secret_file = Some(path);
        c.auth.auth_audience = vec!["amble".into()];
        c.auth.auth_issuer = vec!["https://id.example.com/".into()];
    }))
    .await;
    let sign = |aud: &str, iss: &str| {
        let claims = serde_json::json!({
            "sub": "u1", "exp": unix_now() + 600, "name": "Ida", "aud": aud, "iss": iss,
        });
        jsonwebtoken::encode(
            &Header::new(Algorithm::HS256),
            &claims,
            &EncodingKey::from_secret(SECRET),
        )
        .expect("sign")
    };
    let mut c = server.client().await;
    for (reason, bad) in [
        ("audience", sign("someone-else", "https://id.example.com/")),
        ("issuer", sign("amble", "https://evil.example/")),
    ] {
        send_join(&mut c, "lobby", "x", &bad).await;
        let text = c.expect_error(ErrorCode::Unauthenticated).await;
        assert!(
            text.contains(if reason == "audience" { "aud" } else { "iss" }),
            "{text}"
        );
        assert_eq!(refused(&server, reason).await, 1.0, "{reason}");
    }
    let welcome = join_with(
        &mut c,
        "lobby",
        "x",
        &sign("amble", "https://id.example.com/"),
    )
    .await;
    assert_eq!(names(&welcome), ["Ida"]);
    server.stop().await;
}

/// Issue #19: keys by `kid` from a JWKS file (`--auth-jwks-file`): a token
/// naming a key of the set joins; one naming no key of it is refused as
/// `unknown_key` on a socket that stays.
#[tokio::test]
async fn a_token_signed_with_a_key_of_the_key_set_joins() {
    let files = Files::new("jwks");
    let rsa = EncodingKey::from_rsa_pem(&key("rsa-private.pem")).expect("rsa");
    let mut jwk = jsonwebtoken::jwk::Jwk::from_encoding_key(&rsa, Algorithm::RS256).expect("jwk");
    jwk.common.key_id = Some("2026-12".into());
    let set = serde_json::json!({ "keys": [jwk] }).to_string();
    let path = files.write("jwks.json", set.as_bytes());
    let server = TestServer::with(config(|c| c.auth.auth_jwks_file = Some(path))).await;
    let sign = |kid: &str| {
        let mut header = Header::new(Algorithm::RS256);
        header.kid = Some(kid.into());
        jsonwebtoken::encode(&header, &claims("u1"), &rsa).expect("sign")
    };
    let mut c = server.client().await;
    send_join(&mut c, "lobby", "Ada", &sign("2025-01")).await;
    let text = c.expect_error(ErrorCode::Unauthenticated).await;
    assert!(text.contains("kid"), "{text}");
    assert_eq!(refused(&server, "unknown_key").await, 1.0);
    let welcome = join_with(&mut c, "lobby", "Ada", &sign("2026-12")).await;
    assert_eq!(names(&welcome), ["Ada"]);
    server.stop().await;
}

/// Issue #19: keys from an identity provider's URL (`--auth-jwks-url`)
/// rotate without a restart. The provider swaps key A (RS256) for key B
/// (EdDSA): a token by B joins at once, through the fetch its unknown
/// `kid` asks for; a token by A is then refused, without another fetch
/// (one per 30 s at most).
#[tokio::test]
async fn a_key_set_url_rotates_keys_through_an_unknown_kid() {
    let provider = JwksServer::start(Serve::Keys(key_set(&[rsa_jwk("key-a")]))).await;
    let url = provider.url();
    let server = TestServer::with(config(|c| c.auth.auth_jwks_url = Some(url))).await;
    assert_eq!(server.metric("amble_auth_jwks_fetches_total").await, 1.0);
    assert_eq!(server.metric("amble_auth_jwks_keys").await, 1.0);
    let mut a = server.client().await;
    let welcome = join_with(&mut a, "lobby", "", &rs256_token("key-a", "Ana")).await;
    assert_eq!(names(&welcome), ["Ana"]);

    provider.serve(Serve::Keys(key_set(&[ed25519_jwk("key-b")])));
    let mut b = server.client().await;
    let welcome = join_with(&mut b, "lobby", "", &eddsa_token("key-b", "Bo")).await;
    assert_eq!(names(&welcome), ["Ana", "Bo"]);
    assert_eq!(provider.requests(), 2);
    assert_eq!(server.metric("amble_auth_jwks_fetches_total").await, 2.0);

    let mut c = server.client().await;
    send_join(&mut c, "lobby", "", &rs256_token("key-a", "Cy")).await;
    let text = c.expect_error(ErrorCode::Unauthenticated).await;
    assert!(text.contains("kid"), "{text}");
    assert_eq!(refused(&server, "unknown_key").await, 1.0);
    assert_eq!(provider.requests(), 2, "no second fetch within 30 s");
    // The member admitted with key A stays: tokens are checked on Join.
    a.ping().await;
    server.stop().await;
}

/// Issue #19: the key set is fetched again every refresh interval; a
/// provider that fails (a 500, garbage, too much, a stall) leaves the last good set
/// in use, and each failure is counted by reason in /metrics.
#[tokio::test]
async fn a_failing_key_set_url_keeps_the_last_good_set() {
    let provider = JwksServer::start(Serve::Keys(key_set(&[rsa_jwk("key-a")]))).await;
    let url = provider.url();
    // One second (the flag takes 10 at least): every fetch in this test
    // comes from the refresh, none from a token.
    let server = TestServer::with(config(|c| {
        c.auth.auth_jwks_url = Some(url);
        c.auth.auth_jwks_refresh_secs = 1;
    }))
    .await;
    // A rotation picked up by the refresh alone.
    provider.serve(Serve::Keys(key_set(&[ed25519_jwk("key-b")])));
    let n = provider.requests();
    provider.until_requests(n + 2, WAIT).await;
    assert!(server.metric("amble_auth_jwks_fetches_total").await >= 2.0);

    let failures = [
        (Serve::Status(500), "status", WAIT),
        (Serve::Garbage, "json", WAIT),
        (Serve::Huge, "too_large", WAIT),
        // A stall ends at amble's 10 s fetch timeout.
        (Serve::Stall, "timeout", WAIT * 3),
    ];
    for (i, (serve, reason, limit)) in failures.into_iter().enumerate() {
        provider.serve(serve);
        let n = provider.requests();
        // The failing request, then the retry amble makes after counting it.
        provider.until_requests(n + 2, limit).await;
        let series = format!("amble_auth_jwks_fetch_failures_total{{reason=\"{reason}\"}}");
        assert!(server.metric(&series).await >= 1.0, "{series}");
        let mut c = server.client().await;
        let user = format!("user-{i}");
        let welcome = join_with(
            &mut c,
            &format!("room-{i}"),
            "",
            &eddsa_token("key-b", &user),
        )
        .await;
        assert_eq!(names(&welcome), [user]);
    }
    assert_eq!(server.metric("amble_auth_jwks_keys").await, 1.0);
    server.stop().await;
}

/// Issue #19: both nodes of a cluster, pointed at the same provider, take
/// its new key once it rotates, and both refuse the old one.
#[tokio::test]
async fn both_nodes_of_a_cluster_take_a_rotated_key() {
    let provider = JwksServer::start(Serve::Keys(key_set(&[rsa_jwk("key-a")]))).await;
    let url = provider.url();
    let nats = Nats::start().await;
    let args = ["--auth-jwks-url", url.as_str()];
    let n1 = Node::start(&nats, 1, &args).await;
    let n2 = Node::start(&nats, 2, &args).await;
    has_peers(&n1, 1).await;
    has_peers(&n2, 1).await;
    let mut ada = Client::connect(&n1.ws_url()).await;
    join_with(&mut ada, "plaza", "", &rs256_token("key-a", "Ada")).await;

    provider.serve(Serve::Keys(key_set(&[ed25519_jwk("key-b")])));
    let mut bo = Client::connect(&n2.ws_url()).await;
    let welcome = join_with(&mut bo, "plaza", "", &eddsa_token("key-b", "Bo")).await;
    assert_eq!(names(&welcome), ["Ada", "Bo"], "Bo on n2 sees Ada on n1");
    let mut cy = Client::connect(&n1.ws_url()).await;
    let welcome = join_with(&mut cy, "plaza", "", &eddsa_token("key-b", "Cy")).await;
    assert!(names(&welcome).contains(&"Cy".to_owned()));

    for node in [&n1, &n2] {
        let mut eve = Client::connect(&node.ws_url()).await;
        send_join(&mut eve, "plaza", "", &rs256_token("key-a", "Eve")).await;
        eve.expect_error(ErrorCode::Unauthenticated).await;
        let fetches = node.metric("amble_auth_jwks_fetches_total").await;
        assert_eq!(fetches, Some(2.0), "{}: at start and for key-b", node.name);
        let refused = node
            .metric("amble_auth_refused_total{reason=\"unknown_key\"}")
            .await;
        assert_eq!(refused, Some(1.0), "{}", node.name);
    }
    assert_eq!(provider.requests(), 4);
}

/// Issue #19: a provider's key set over https, checked against the
/// system's CA roots: amble started with the test CA as its roots
/// (`SSL_CERT_FILE`) fetches it and admits a token; without it, the
/// certificate is refused and amble does not start.
#[tokio::test]
async fn a_key_set_url_over_https_is_checked_against_the_ca_roots() {
    let provider = JwksServer::start_tls(Serve::Keys(key_set(&[ed25519_jwk("key-b")]))).await;
    let url = provider.url();
    assert!(url.starts_with("https://127.0.0.1:"), "{url}");
    let out = amble(&["--listen", "127.0.0.1:0", "--auth-jwks-url", &url]).await;
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("--auth-jwks-url {url}: TLS: ")),
        "(Debian's ca-certificates gives the system's roots) {stderr}"
    );

    let ca = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/keys/jwks-ca.pem");
    let mut child = Command::new(env!("CARGO_BIN_EXE_amble"))
        .args(["--listen", "127.0.0.1:0", "--auth-jwks-url", &url])
        .env("SSL_CERT_FILE", &ca)
        .env("RUST_LOG", "info")
        .env_remove("AMBLE_AUTH_JWKS_URL")
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn amble");
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let addr = within("amble to serve", async {
        let mut seen = Vec::new();
        loop {
            let Some(line) = lines.next_line().await.expect("read stderr") else {
                panic!("amble exited: {seen:#?}");
            };
            if let Some(addr) = line
                .split("addr=")
                .nth(1)
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|a| a.parse::<std::net::SocketAddr>().ok())
            {
                return addr;
            }
            seen.push(line);
        }
    })
    .await;
    let mut c = Client::connect(&format!("ws://{addr}/ws")).await;
    let welcome = join_with(&mut c, "lobby", "", &eddsa_token("key-b", "Tess")).await;
    assert_eq!(names(&welcome), ["Tess"]);
    assert_eq!(provider.requests(), 1);
}

/// Issue #19: amble does not start without a first key set, and refuses a
/// plain-http URL to another machine; both errors name the flag and say
/// why.
#[tokio::test]
async fn a_key_set_url_that_cannot_be_used_stops_the_start() {
    let provider = JwksServer::start(Serve::Status(404)).await;
    let cases = [
        (provider.url(), "HTTP status 404"),
        (
            "http://id.example.com/jwks.json".to_owned(),
            "plain http is accepted only for a loopback host",
        ),
    ];
    for (url, says) in cases {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let config = config(|c| c.auth.auth_jwks_url = Some(url.clone()));
        let err = within("serve to fail", amble::serve(listener, config, async {}))
            .await
            .expect_err("refused");
        let text = err.to_string();
        assert!(
            text.starts_with(&format!("--auth-jwks-url {url}: ")),
            "{text}"
        );
        assert!(text.contains(says), "{text}");
    }
    // With another key source: clap refuses the pair.
    let out = amble(&[
        "--auth-jwks-url",
        &provider.url(),
        "--auth-public-key-file",
        "/nonexistent.pem",
    ])
    .await;
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("cannot be used with"), "{stderr}");
}

/// The ```LANG block of docs/client.md's "## Tokens" section that contains
/// `marker`.
fn token_example(lang: &str, marker: &str) -> String {
    let doc = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/client.md"))
        .expect("docs/client.md");
    let section = &doc[doc.find("## Tokens").expect("the section")..];
    let open = format!("```{lang}\n");
    section
        .split(open.as_str())
        .skip(1)
        .map(|rest| &rest[..rest.find("```").expect("a block's end")])
        .find(|block| block.contains(marker))
        .unwrap_or_else(|| panic!("no {lang} block with {marker}"))
        .to_owned()
}

/// Issue #19: docs/client.md's Node and Python examples mint tokens that
/// amble accepts, with a binary secret (it failed in Node: the secret was
/// read as UTF-8 text).
#[tokio::test]
async fn the_docs_token_examples_mint_tokens_amble_accepts_for_a_binary_secret() {
    let files = Files::new("examples");
    let secret: Vec<u8> = (0u8..48)
        .map(|i| i.wrapping_mul(151).wrapping_add(0x80))
        .collect();
    assert!(std::str::from_utf8(&secret).is_err(), "a binary secret");
    let mut file = secret.clone();
    file.push(b'\n');
    let path = files.write("secret", &file);
    let server = TestServer::with(config(|c| {
        c.auth.auth_hs256_secret_file = Some(path.clone())
    }))
    .await;
    let path = path.to_str().expect("utf-8 path");

    let node = token_example("js", "createHmac").replace("/run/secrets/amble", path)
        + "\nconsole.log(ambleToken('u-node', 'Nora', ['team-*']));\n";
    let node_file = files.write("mint.mjs", node.as_bytes());
    let python = token_example("python", "hmac.new").replace("/run/secrets/amble", path)
        + "\nprint(amble_token('u-py', 'Pia', ['team-*']))\n";
    let python_file = files.write("mint.py", python.as_bytes());
    for (program, script, name, room) in [
        ("node", node_file, "Nora", "team-node"),
        ("/usr/bin/python3", python_file, "Pia", "team-python"),
    ] {
        let token = run_example(
            program,
            &script,
            program,
            "scripts/test installs nodejs; python3 is Debian's",
        )
        .await
        .trim()
        .to_owned();
        let mut c = server.client().await;
        let welcome = join_with(&mut c, room, "", &token).await;
        assert_eq!(names(&welcome)[..], [name], "{program}");
    }
    server.stop().await;
}

/// Runs a docs example `script` with `program` and returns what it printed;
/// a failure names `label` and shows the example's stderr, a missing
/// program what installs it.
async fn run_example(program: &str, script: &Path, label: &str, install: &str) -> String {
    let out = Command::new(program)
        .arg(script)
        .output()
        .await
        .unwrap_or_else(|err| panic!("{program}: {err} ({install})"));
    assert!(
        out.status.success(),
        "{label}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

/// Issue #19: docs/client.md's RS256 and EdDSA examples, in Node and in
/// Python, run as written with an RSA and an Ed25519 key: the key sets they
/// print, served at a `--auth-jwks-url`, admit the tokens they mint.
#[tokio::test]
async fn the_docs_key_pair_examples_mint_tokens_their_key_sets_admit() {
    let files = Files::new("key-pairs");
    let node = token_example("js", "createPrivateKey");
    let python = token_example("python", "load_pem_private_key");
    let mut keys = Vec::new();
    let mut tokens = Vec::new();
    for (key, short) in [("rsa-private.pem", "rsa"), ("ed25519-private.pem", "ed")] {
        let pem = files.write(key, &self::key(key));
        let pem = pem.to_str().expect("utf-8 path");
        for (program, script, ext) in [
            (
                "node",
                node.clone()
                    + "\nconsole.log(JSON.stringify(ambleJwks()));\n\
                       console.log(ambleSignedToken('USER', 'USER', ['team-*']));\n",
                "mjs",
            ),
            (
                "/usr/bin/python3",
                python.clone()
                    + "\nprint(json.dumps(amble_jwks()))\n\
                       print(amble_signed_token('USER', 'USER', ['team-*']))\n",
                "py",
            ),
        ] {
            let user = format!("{}-{short}", if ext == "py" { "py" } else { "node" });
            let script = script
                .replace("/run/secrets/amble-signing.pem", pem)
                .replace("amble-2026-12", &user)
                .replace("USER", &user);
            let path = files.write(&format!("{user}.{ext}"), script.as_bytes());
            let stdout = run_example(
                program,
                &path,
                &format!("{program} {user}"),
                "scripts/test installs nodejs, python3-jwt and python3-cryptography",
            )
            .await;
            let mut lines = stdout.lines();
            let set: serde_json::Value =
                serde_json::from_str(lines.next().expect("the key set")).expect("json");
            keys.extend(set["keys"].as_array().expect("keys").iter().cloned());
            tokens.push((user, lines.next().expect("a token").to_owned()));
        }
    }
    let provider = JwksServer::start(Serve::Keys(key_set(&keys))).await;
    let url = provider.url();
    let server = TestServer::with(config(|c| c.auth.auth_jwks_url = Some(url))).await;
    assert_eq!(server.metric("amble_auth_jwks_keys").await, 4.0);
    for (user, token) in &tokens {
        let mut c = server.client().await;
        let welcome = join_with(&mut c, &format!("team-{user}"), "", token).await;
        assert_eq!(names(&welcome)[..], [user.as_str()]);
    }
    server.stop().await;
}

/// Issue #19: a token's `start` claim places the member, winning over the
/// Join's own; one outside the world is refused with INVALID_POSITION.
#[tokio::test]
async fn a_tokens_start_claim_places_the_member() {
    let files = Files::new("start");
    let server = hs256_server(&files).await;
    let with_start = |x, y| {
        let mut c = claims("u-start");
        c.start = Some(amble::auth::StartClaim { x, y });
        token(&c)
    };
    let mut c = server.client().await;
    c.send(C::Join(pb::Join {
        data: Vec::new(),
        start: None,
        room: "placed".into(),
        name: "Ada".into(),
        token: with_start(9_999, 1),
        resume_token: String::new(),
    }))
    .await;
    let text = c.expect_error(ErrorCode::InvalidPosition).await;
    assert!(text.contains("start claim"), "{text}");
    c.send(C::Join(pb::Join {
        data: Vec::new(),
        start: Some(pb::Position { x: 10, y: 10 }),
        room: "placed".into(),
        name: "Ada".into(),
        token: with_start(1_234, 2_345),
        resume_token: String::new(),
    }))
    .await;
    let welcome = c.welcome().await;
    assert_eq!(
        own_position(&welcome),
        Some(pb::Position { x: 1_234, y: 2_345 }),
        "the claim wins"
    );
    server.stop().await;
}

// ------------------------------------------------ issue #18: expiry, refresh

/// A server that requires HS256 tokens and tolerates no clock skew, so a
/// token's session ends at its `exp`.
async fn strict_server(files: &Files) -> TestServer {
    let path = files.write("secret", SECRET);
    TestServer::with(config(|c| {
        c.auth.auth_hs256_secret_file = Some(path);
        c.auth.auth_leeway_secs = 0;
    }))
    .await
}

/// Claims of `sub` expiring `secs` seconds from now.
fn expiring(sub: &str, secs: u64) -> Claims {
    Claims {
        exp: unix_now() + secs,
        ..claims(sub)
    }
}

async fn send_refresh(c: &mut Client, token: &str) {
    c.send(C::Refresh(pb::RefreshToken {
        token: token.into(),
    }))
    .await;
}

/// The next `TokenExpiring`'s time.
async fn expect_expiring(c: &mut Client) -> u64 {
    match c.recv().await.body {
        Some(S::TokenExpiring(t)) => t.expires_at_ms,
        other => panic!("expected TokenExpiring, got {other:?}"),
    }
}

/// The next `TokenRefreshed`'s time.
async fn expect_refreshed(c: &mut Client) -> u64 {
    match c.recv().await.body {
        Some(S::TokenRefreshed(t)) => t.expires_at_ms,
        other => panic!("expected TokenRefreshed, got {other:?}"),
    }
}

/// The session of a member whose token expired ends: TOKEN_EXPIRED, 4003.
async fn expect_expired(c: &mut Client) {
    let text = c.expect_error(ErrorCode::TokenExpired).await;
    assert!(text.contains("expired"), "{text}");
    assert_eq!(c.expect_close().await, 4003);
}

#[tokio::test]
async fn a_token_near_its_expiry_is_noticed_at_once_and_ends_the_session_at_it() {
    let files = Files::new("expiry");
    let server = strict_server(&files).await;
    let mut bystander = server.client().await;
    join_with(&mut bystander, "lobby", "B", &token(&claims("b"))).await;
    let mut c = server.client().await;
    let short = expiring("ada", 3);
    let w = join_with(&mut c, "lobby", "Ada", &token(&short)).await;
    assert_eq!(w.token_expires_at_ms, short.exp * 1000);
    assert_eq!(w.protocol_revision, amble::protocol::PROTOCOL_REVISION);
    // Less than a minute left: told at once.
    assert_eq!(expect_expiring(&mut c).await, short.exp * 1000);
    // No refresh: at `exp` (no leeway here) the session ends.
    expect_expired(&mut c).await;
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis();
    // Not before `exp` (give or take the server clock's rounding).
    assert!(now_ms + 100 >= u128::from(short.exp) * 1000, "ended early");
    let left = bystander
        .until(|m| match &m.body {
            Some(S::Left(l)) => Some(l.reason),
            _ => None,
        })
        .await;
    assert_eq!(
        left,
        LeaveReason::TimedOut as i32,
        "its time ran out: not KICKED"
    );
    assert_eq!(server.metric("amble_auth_expired_total").await, 1.0);
    bystander.ping().await;
}

#[tokio::test]
async fn a_refreshed_token_moves_the_end_and_the_session_outlives_the_old_one() {
    let files = Files::new("refresh");
    let server = strict_server(&files).await;
    let mut c = server.client().await;
    let short = expiring("ada", 2);
    join_with(&mut c, "lobby", "Ada", &token(&short)).await;
    expect_expiring(&mut c).await;
    // A witness whose token ends a second after Ada's old one.
    let mut witness = server.client().await;
    join_with(&mut witness, "elsewhere", "W", &token(&expiring("w", 3))).await;
    expect_expiring(&mut witness).await;

    let fresh = claims("ada");
    send_refresh(&mut c, &token(&fresh)).await;
    assert_eq!(expect_refreshed(&mut c).await, fresh.exp * 1000);
    assert_eq!(server.metric("amble_auth_refreshed_total").await, 1.0);

    // Once the witness's later expiry has ended it, Ada's old one has
    // passed too: her session goes on.
    expect_expired(&mut witness).await;
    c.ping().await;
    assert_eq!(server.metric("amble_auth_expired_total").await, 1.0);
}

#[tokio::test]
async fn a_refused_refresh_changes_nothing_and_says_why() {
    let files = Files::new("refresh-refused");
    let server = strict_server(&files).await;
    let mut c = server.client().await;
    let short = expiring("ada", 3);
    join_with(&mut c, "lobby", "Ada", &token(&short)).await;
    expect_expiring(&mut c).await;

    // Another user's token: FORBIDDEN, and the message says so.
    send_refresh(&mut c, &token(&claims("bob"))).await;
    let text = c.expect_error(ErrorCode::Forbidden).await;
    assert!(text.contains("same sub"), "{text}");
    // A token that does not allow the member's room: FORBIDDEN.
    let mut elsewhere = claims("ada");
    elsewhere.rooms = Some(vec!["team-*".into()]);
    send_refresh(&mut c, &token(&elsewhere)).await;
    let text = c.expect_error(ErrorCode::Forbidden).await;
    assert!(text.contains("room lobby"), "{text}");
    // A bad signature: UNAUTHENTICATED.
    let forged =
        mint_hs256(b"some other secret, also 32 bytes long", &claims("ada")).expect("mint");
    send_refresh(&mut c, &forged).await;
    let text = c.expect_error(ErrorCode::Unauthenticated).await;
    assert!(text.contains("signature"), "{text}");

    // The old deadline holds.
    expect_expired(&mut c).await;
    let refused = |reason: &str| format!("amble_auth_refresh_refused_total{{reason=\"{reason}\"}}");
    assert_eq!(server.metric(&refused("other_user")).await, 1.0);
    assert_eq!(server.metric(&refused("forbidden")).await, 1.0);
    assert_eq!(server.metric(&refused("bad_signature")).await, 1.0);
    assert_eq!(server.metric("amble_auth_refreshed_total").await, 0.0);
}

#[tokio::test]
async fn a_refresh_before_join_is_not_joined_and_an_open_server_takes_any() {
    let files = Files::new("refresh-early");
    let server = hs256_server(&files).await;
    let mut c = server.client().await;
    send_refresh(&mut c, &token(&claims("ada"))).await;
    c.expect_error(ErrorCode::NotJoined).await;
    // A long token: no notice at Join, its expiry in the Welcome.
    let long = claims("ada");
    let w = join_with(&mut c, "lobby", "Ada", &token(&long)).await;
    assert_eq!(w.token_expires_at_ms, long.exp * 1000);
    c.ping().await;

    // Without keys: no expiry, and a refresh is a no-op answered with 0.
    let open = TestServer::start().await;
    let mut d = open.client().await;
    let w = d.join("lobby", "Bo").await;
    assert_eq!(w.token_expires_at_ms, 0);
    send_refresh(&mut d, "anything").await;
    assert_eq!(expect_refreshed(&mut d).await, 0);
}

#[tokio::test]
async fn refreshes_have_a_budget_and_a_flood_closes_the_connection() {
    let files = Files::new("refresh-flood");
    let server = hs256_server(&files).await;
    let mut c = server.client().await;
    join_with(&mut c, "lobby", "Ada", &token(&claims("ada"))).await;
    let fresh = token(&claims("ada"));
    for _ in 0..200 {
        send_refresh(&mut c, &fresh).await;
    }
    let (mut refreshed, mut limited) = (0, 0);
    loop {
        match c.recv().await.body {
            Some(S::TokenRefreshed(_)) => refreshed += 1,
            Some(S::Error(e)) if e.code == ErrorCode::RateLimited as i32 => {
                assert!(e.message.contains("refreshing too often"), "{}", e.message);
                limited += 1;
            }
            Some(S::Error(e)) if e.code == ErrorCode::Flood as i32 => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    // The burst (5) is taken, then refused, then the flood ends it.
    assert!((5..=6).contains(&refreshed), "{refreshed} refreshed");
    assert!(limited > 0);
    assert_eq!(c.expect_close().await, 1008);
}

#[tokio::test]
async fn a_token_expiring_at_the_end_of_time_is_served_and_refreshed() {
    let files = Files::new("far-exp");
    let server = strict_server(&files).await;
    let mut c = server.client().await;
    let far = Claims {
        // Half a billion years ahead: the timer neither overflows nor
        // fires, and the time sent is capped where JavaScript still counts
        // exactly (2^53 - 1 ms).
        exp: u64::MAX / 1000,
        ..claims("ada")
    };
    const MAX_SAFE: u64 = (1 << 53) - 1;
    let w = join_with(&mut c, "lobby", "Ada", &token(&far)).await;
    assert_eq!(w.token_expires_at_ms, MAX_SAFE);
    c.ping().await;
    send_refresh(&mut c, &token(&far)).await;
    assert_eq!(expect_refreshed(&mut c).await, MAX_SAFE);
    c.ping().await;
}

#[tokio::test]
async fn the_notice_comes_its_lead_before_exp_not_at_once() {
    let files = Files::new("notice-lead");
    let path = files.write("secret", SECRET);
    let server = TestServer::with(config(|c| {
        c.auth.auth_hs256_secret_file = Some(path);
        c.auth.auth_leeway_secs = 0;
        c.auth.auth_expiry_notice_secs = 2;
    }))
    .await;
    let mut c = server.client().await;
    let short = expiring("ada", 4);
    join_with(&mut c, "lobby", "Ada", &token(&short)).await;
    // More than the lead is left: the Pong comes first, no notice yet.
    c.send(C::Ping(pb::Ping { client_time_ms: 7 })).await;
    match c.recv().await.body {
        Some(S::Pong(p)) => assert_eq!(p.client_time_ms, 7),
        other => panic!("expected Pong, got {other:?}"),
    }
    assert_eq!(expect_expiring(&mut c).await, short.exp * 1000);
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis();
    assert!(
        now_ms + 100 >= u128::from(short.exp) * 1000 - 2_000,
        "the notice came more than 2 s early"
    );
    expect_expired(&mut c).await;
}
