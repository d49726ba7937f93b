use super::*;

const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef-test-only";

fn keys(name: &str) -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/keys")
        .join(name);
    std::fs::read(path).expect("test key")
}

fn claims(sub: &str) -> Claims {
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

fn hs256() -> Verifier {
    Verifier::new(DecodingKey::from_secret(SECRET), Algorithm::HS256)
}

fn sign(alg: Algorithm, claims: &impl Serialize, key: &EncodingKey) -> String {
    jsonwebtoken::encode(&Header::new(alg), claims, key).expect("sign")
}

fn reason(r: Result<Admission, Refusal>) -> &'static str {
    r.map_or_else(|e| e.reason(), |a| panic!("admitted: {a:?}"))
}

#[test]
fn rooms_match_exactly_or_by_prefix() {
    let p = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert!(room_allowed(None, "anything"));
    assert!(room_allowed(Some(&p(&["lobby"])), "lobby"));
    assert!(!room_allowed(Some(&p(&["lobby"])), "lobby2"));
    assert!(!room_allowed(Some(&p(&["lobby"])), "Lobby"));
    assert!(room_allowed(Some(&p(&["team-*"])), "team-blue"));
    assert!(room_allowed(Some(&p(&["team-*"])), "team-"));
    assert!(!room_allowed(Some(&p(&["team-*"])), "team"));
    assert!(!room_allowed(Some(&p(&["team-*"])), "xteam-blue"));
    assert!(room_allowed(Some(&p(&["a", "team-*"])), "a"));
    assert!(room_allowed(Some(&p(&["*"])), "any.room"));
    // A `*` is a wildcard only at the end.
    assert!(!room_allowed(Some(&p(&["*-blue"])), "team-blue"));
    // An empty list allows no room.
    assert!(!room_allowed(Some(&[]), "lobby"));
}

#[test]
fn token_room_patterns_follow_the_room_rule() {
    let rules = Rules::default();
    for ok in ["lobby", "team-*", "*", "a.b_c-*"] {
        assert!(check_room_pattern(ok, &rules).is_ok(), "{ok}");
    }
    for bad in ["", "a b", "team*x", "**", &"r".repeat(33)] {
        assert!(check_room_pattern(bad, &rules).is_err(), "{bad}");
    }
}

#[test]
fn admits_a_good_token_with_its_user_and_name() {
    let mut c = claims("user-1");
    c.name = Some("Ada".into());
    c.rooms = Some(vec!["team-*".into()]);
    let token = mint_hs256(SECRET, &c).expect("mint");
    assert_eq!(
        hs256().admit(&token, "team-blue"),
        Ok(Admission {
            user: Some(Arc::from("user-1")),
            name: Some("Ada".into()),
            start: None,
            data: None,
            share_sub: false,
            expires_at: Some(c.exp),
        })
    );
    let refused = hs256().admit(&token, "lobby");
    assert_eq!(
        refused,
        Err(Refusal::Forbidden {
            room: "lobby".into()
        })
    );
    assert_eq!(refused.unwrap_err().code(), ErrorCode::Forbidden);
}

#[test]
fn refuses_a_missing_token() {
    let r = hs256().admit("", "lobby");
    assert_eq!(r, Err(Refusal::Missing));
    assert_eq!(r.unwrap_err().code(), ErrorCode::Unauthenticated);
}

#[test]
fn refuses_malformed_tokens() {
    let v = hs256();
    assert_eq!(reason(v.admit("garbage", "lobby")), "malformed");
    assert_eq!(reason(v.admit("a.b.c", "lobby")), "malformed");
    assert_eq!(reason(v.admit("..", "lobby")), "malformed");
    let key = EncodingKey::from_secret(SECRET);
    let exp = unix_now() + 600;
    let no_sub = sign(Algorithm::HS256, &serde_json::json!({ "exp": exp }), &key);
    assert_eq!(reason(v.admit(&no_sub, "lobby")), "malformed");
    let no_exp = sign(Algorithm::HS256, &serde_json::json!({ "sub": "u" }), &key);
    assert_eq!(reason(v.admit(&no_exp, "lobby")), "malformed");
    let text_exp = sign(
        Algorithm::HS256,
        &serde_json::json!({ "sub": "u", "exp": "tomorrow" }),
        &key,
    );
    assert_eq!(reason(v.admit(&text_exp, "lobby")), "malformed");
    let rooms_string = sign(
        Algorithm::HS256,
        &serde_json::json!({ "sub": "u", "exp": exp, "rooms": "lobby" }),
        &key,
    );
    assert_eq!(reason(v.admit(&rooms_string, "lobby")), "malformed");
    let empty_sub = mint_hs256(SECRET, &claims("")).expect("mint");
    assert_eq!(reason(v.admit(&empty_sub, "lobby")), "malformed");
    let long_sub = mint_hs256(SECRET, &claims(&"u".repeat(MAX_SUB_BYTES + 1))).expect("mint");
    assert_eq!(reason(v.admit(&long_sub, "lobby")), "malformed");
    let longest = mint_hs256(SECRET, &claims(&"u".repeat(MAX_SUB_BYTES))).expect("mint");
    assert!(v.admit(&longest, "lobby").is_ok());
}

#[test]
fn refuses_a_bad_signature() {
    let v = hs256();
    let other = mint_hs256(b"another secret of at least 32 bytes!", &claims("u")).expect("mint");
    assert_eq!(reason(v.admit(&other, "lobby")), "bad_signature");
    // Claims changed after signing.
    let good = mint_hs256(SECRET, &claims("u")).expect("mint");
    let forged =
        mint_hs256(b"another secret of at least 32 bytes!", &claims("admin")).expect("mint");
    let mut parts: Vec<&str> = good.split('.').collect();
    parts[1] = forged.split('.').nth(1).expect("claims");
    assert_eq!(reason(v.admit(&parts.join("."), "lobby")), "bad_signature");
}

#[test]
fn accepts_only_the_keys_algorithm() {
    let v = hs256();
    let hs384 = sign(
        Algorithm::HS384,
        &claims("u"),
        &EncodingKey::from_secret(SECRET),
    );
    assert_eq!(reason(v.admit(&hs384, "lobby")), "algorithm");
    // `alg: none` with no signature: a refused algorithm (it was counted as
    // a malformed token).
    let good = mint_hs256(SECRET, &claims("u")).expect("mint");
    let claims_part = good.split('.').nth(1).expect("claims");
    // base64url of {"alg":"none","typ":"JWT"}
    let none = "eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0";
    let unsigned = format!("{none}.{claims_part}.");
    assert_eq!(reason(v.admit(&unsigned, "lobby")), "algorithm");

    // The classic confusion: an HS256 token keyed with the RSA public key's
    // PEM, sent to a server that holds that public key.
    let public = keys("rsa-public.pem");
    let rs = Verifier::new(
        DecodingKey::from_rsa_pem(&public).expect("rsa"),
        Algorithm::RS256,
    );
    let confused = sign(
        Algorithm::HS256,
        &claims("u"),
        &EncodingKey::from_secret(&public),
    );
    assert_eq!(reason(rs.admit(&confused, "lobby")), "algorithm");
}

#[test]
fn refuses_expired_tokens_beyond_the_leeway() {
    let v = hs256();
    let mut c = claims("u");
    c.exp = unix_now() - LEEWAY_SECS - 60;
    let expired = mint_hs256(SECRET, &c).expect("mint");
    assert_eq!(reason(v.admit(&expired, "lobby")), "expired");
    c.exp = unix_now() - LEEWAY_SECS / 2;
    let within_leeway = mint_hs256(SECRET, &c).expect("mint");
    assert!(v.admit(&within_leeway, "lobby").is_ok());
    // Expired and forged: the signature is checked first.
    c.exp = unix_now() - LEEWAY_SECS - 60;
    let forged = mint_hs256(b"another secret of at least 32 bytes!", &c).expect("mint");
    assert_eq!(reason(v.admit(&forged, "lobby")), "bad_signature");
}

#[test]
fn refuses_tokens_not_valid_yet_or_for_an_audience() {
    let v = hs256();
    let key = EncodingKey::from_secret(SECRET);
    let now = unix_now();
    let later = sign(
        Algorithm::HS256,
        &serde_json::json!({ "sub": "u", "exp": now + 600, "nbf": now + 300 }),
        &key,
    );
    assert_eq!(reason(v.admit(&later, "lobby")), "not_yet_valid");
    let for_someone = sign(
        Algorithm::HS256,
        &serde_json::json!({ "sub": "u", "exp": now + 600, "aud": "billing" }),
        &key,
    );
    assert_eq!(reason(v.admit(&for_someone, "lobby")), "audience");
}

#[test]
fn verifies_eddsa_and_rs256_with_public_keys() {
    let dir = TempDir::new();
    for (public, private, alg) in [
        (
            "ed25519-public.pem",
            "ed25519-private.pem",
            Algorithm::EdDSA,
        ),
        ("rsa-public.pem", "rsa-private.pem", Algorithm::RS256),
    ] {
        let path = dir.file(public, &keys(public));
        let (key, detected) = read_public_key(&path).expect("key");
        assert_eq!(detected, alg, "{public}");
        let v = Verifier::new(key, alg);
        let signing = match alg {
            Algorithm::EdDSA => EncodingKey::from_ed_pem(&keys(private)),
            _ => EncodingKey::from_rsa_pem(&keys(private)),
        }
        .expect("private key");
        let token = sign(alg, &claims("u"), &signing);
        assert!(v.admit(&token, "lobby").is_ok(), "{public}");
        let hs = mint_hs256(SECRET, &claims("u")).expect("mint");
        assert_eq!(reason(v.admit(&hs, "lobby")), "algorithm", "{public}");
    }
}

#[test]
fn setup_refuses_unusable_secrets_and_keys_naming_the_flag() {
    let dir = TempDir::new();
    let missing = dir.dir.path().join("nothing-here");
    let err = read_secret(&missing, SECRET_FLAG).unwrap_err().to_string();
    assert!(err.starts_with("--auth-hs256-secret-file "), "{err}");
    assert!(err.contains("cannot read"), "{err}");
    for short in [
        &b""[..],
        b"\n",
        &[b'x'; 31],
        b"0123456789012345678901234567890\n",
    ] {
        let path = dir.file("short", short);
        let err = read_secret(&path, SECRET_FLAG).unwrap_err().to_string();
        assert!(err.starts_with("--auth-hs256-secret-file "), "{err}");
        assert!(err.contains("use at least 32"), "{err}");
    }
    let path = dir.file("ok", b"0123456789abcdef0123456789abcdef\r\n");
    assert_eq!(
        read_secret(&path, SECRET_FLAG).expect("secret"),
        b"0123456789abcdef0123456789abcdef"
    );

    for (name, content, why) in [
        ("private", keys("ed25519-private.pem"), "private key"),
        ("ec", keys("ec-public.pem"), "not an RSA or Ed25519"),
        ("text", b"hello".to_vec(), "not an RSA or Ed25519"),
    ] {
        let path = dir.file(name, &content);
        let err = read_public_key(&path).unwrap_err().to_string();
        assert!(err.starts_with("--auth-public-key-file "), "{err}");
        assert!(err.contains(why), "{name}: {err}");
    }
}

#[test]
fn an_open_gate_ignores_tokens() {
    assert_eq!(Gate::Open.admit("", "lobby"), Ok(Admission::default()));
    assert_eq!(Gate::Open.admit("junk", "lobby"), Ok(Admission::default()));
}

/// A directory removed when the test ends.
struct TempDir {
    dir: tempfile::TempDir,
}

impl TempDir {
    fn new() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("amble-auth-")
            .tempdir()
            .expect("temp dir");
        Self { dir }
    }

    fn file(&self, name: &str, content: &[u8]) -> PathBuf {
        let path = self.dir.path().join(name);
        std::fs::write(&path, content).expect("write");
        path
    }
}

/// Issue #19: tokens from an identity provider name an audience and an
/// issuer. `--auth-audience` and `--auth-issuer` say which are accepted.
#[test]
fn audiences_and_issuers_follow_the_rules() {
    let key = EncodingKey::from_secret(SECRET);
    let rules = TokenRules {
        audiences: vec!["amble".into(), "amble-staging".into()],
        issuers: vec!["https://id.example.com/".into()],
        leeway_secs: LEEWAY_SECS,
    };
    let v = Verifier::with_rules(DecodingKey::from_secret(SECRET), Algorithm::HS256, &rules);
    let token = |extra: serde_json::Value| {
        let mut c = serde_json::json!({ "sub": "u1", "exp": unix_now() + 600 });
        c.as_object_mut()
            .expect("an object")
            .extend(extra.as_object().expect("an object").clone());
        sign(Algorithm::HS256, &c, &key)
    };
    let iss = "https://id.example.com/";
    let cases = [
        (serde_json::json!({ "aud": "amble", "iss": iss }), None),
        (
            serde_json::json!({ "aud": ["other", "amble-staging"], "iss": iss }),
            None,
        ),
        (
            serde_json::json!({ "aud": "other", "iss": iss }),
            Some("audience"),
        ),
        (serde_json::json!({ "iss": iss }), Some("audience")),
        (
            serde_json::json!({ "aud": "amble", "iss": "https://evil.example/" }),
            Some("issuer"),
        ),
        (serde_json::json!({ "aud": "amble" }), Some("issuer")),
    ];
    for (extra, want) in cases {
        let got = v.admit(&token(extra.clone()), "lobby");
        match want {
            None => assert!(got.is_ok(), "{extra}: {got:?}"),
            Some(why) => assert_eq!(reason(got), why, "{extra}"),
        }
    }
    // The default rules: no audience at all, any issuer.
    let plain = hs256();
    assert_eq!(
        reason(plain.admit(&token(serde_json::json!({ "aud": "amble" })), "lobby")),
        "audience"
    );
    assert!(
        plain
            .admit(&token(serde_json::json!({ "iss": "anyone" })), "lobby")
            .is_ok()
    );
}

#[test]
fn the_leeway_is_the_configured_one() {
    let key = EncodingKey::from_secret(SECRET);
    let mut c = claims("u1");
    c.exp = unix_now() - 45;
    let token = sign(Algorithm::HS256, &c, &key);
    assert_eq!(reason(hs256().admit(&token, "lobby")), "expired");
    let rules = TokenRules {
        leeway_secs: 60,
        ..TokenRules::default()
    };
    let lenient = Verifier::with_rules(DecodingKey::from_secret(SECRET), Algorithm::HS256, &rules);
    assert!(lenient.admit(&token, "lobby").is_ok());
}

#[test]
fn token_rules_without_a_key_refuse_the_start() {
    let config = AuthConfig {
        auth_hs256_secret_file: None,
        auth_public_key_file: None,
        auth_jwks_file: None,
        auth_jwks_url: None,
        auth_jwks_refresh_secs: jwks::remote::REFRESH_SECS,
        auth_audience: vec!["amble".into()],
        auth_issuer: Vec::new(),
        auth_leeway_secs: LEEWAY_SECS,
        auth_expiry_notice_secs: refresh::NOTICE_LEAD_SECS,
    };
    let err = Gate::from_config(&config, Counter::default()).expect_err("no key");
    assert_eq!(
        err.to_string(),
        "--auth-audience needs --auth-hs256-secret-file, --auth-public-key-file, --auth-jwks-file or --auth-jwks-url: without a key no token is read"
    );
}

/// A JWKS with the test keys: RSA under `rsa-1`, Ed25519 under `ed-1`.
fn jwks(keys_: &[(&str, &EncodingKey, Algorithm)]) -> String {
    let keys: Vec<serde_json::Value> = keys_
        .iter()
        .map(|(kid, key, alg)| {
            if *alg == Algorithm::EdDSA {
                // jsonwebtoken cannot make an Ed25519 JWK from a private key:
                // the public key's last 32 bytes of DER are its `x`.
                return ed25519_jwk(kid);
            }
            let mut jwk = jsonwebtoken::jwk::Jwk::from_encoding_key(key, *alg).expect("a jwk");
            jwk.common.key_id = Some((*kid).to_owned());
            serde_json::to_value(jwk).expect("json")
        })
        .collect();
    serde_json::json!({ "keys": keys }).to_string()
}

/// tests/keys/ed25519-public.pem as a JWK (no `alg`: it follows from the
/// key type).
fn ed25519_jwk(kid: &str) -> serde_json::Value {
    use base64::Engine as _;
    let pem = String::from_utf8(keys("ed25519-public.pem")).expect("text");
    let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    let der = base64::engine::general_purpose::STANDARD
        .decode(body)
        .expect("base64");
    let x = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&der[der.len() - 32..]);
    serde_json::json!({ "kty": "OKP", "crv": "Ed25519", "x": x, "kid": kid })
}

fn signed_with(kid: &str, alg: Algorithm, key: &EncodingKey) -> String {
    let mut header = Header::new(alg);
    header.kid = Some(kid.to_owned());
    jsonwebtoken::encode(&header, &claims("u1"), key).expect("sign")
}

/// Issue #19: several keys at once, chosen by `kid`, from a JWKS.
#[test]
fn a_key_set_picks_the_key_by_kid_and_its_algorithm() {
    let rsa = EncodingKey::from_rsa_pem(&keys("rsa-private.pem")).expect("rsa");
    let ed = EncodingKey::from_ed_pem(&keys("ed25519-private.pem")).expect("ed");
    let set = jwks::KeySet::parse(
        jwks(&[
            ("rsa-1", &rsa, Algorithm::RS256),
            ("ed-1", &ed, Algorithm::EdDSA),
        ])
        .as_bytes(),
    )
    .expect("a set");
    assert_eq!(set.len(), 2);
    assert_eq!(set.get("rsa-1").map(|k| k.1), Some(Algorithm::RS256));
    assert_eq!(set.get("ed-1").map(|k| k.1), Some(Algorithm::EdDSA));
    assert!(set.get("other").is_none());
    // Bad sets are refused with a reason.
    for (bad, why) in [
        (r#"{"keys": []}"#, "the set has no usable key"),
        ("not json", "not a JWKS"),
        (
            r#"{"keys": [{"kty": "oct", "k": "c2VjcmV0"}]}"#,
            "a key without a kid",
        ),
    ] {
        let err = jwks::KeySet::parse(bad.as_bytes())
            .expect_err(bad)
            .to_string();
        assert!(err.contains(why), "{bad}: {err}");
    }
}

#[test]
fn a_key_set_file_rotates_without_a_restart_and_keeps_the_last_good_set() {
    let rsa = EncodingKey::from_rsa_pem(&keys("rsa-private.pem")).expect("rsa");
    let ed = EncodingKey::from_ed_pem(&keys("ed25519-private.pem")).expect("ed");
    let dir = tempfile::tempdir().expect("a dir");
    let path = dir.path().join("jwks.json");
    std::fs::write(&path, jwks(&[("rsa-1", &rsa, Algorithm::RS256)])).expect("write");
    let failures = Counter::default();
    let config = AuthConfig {
        auth_hs256_secret_file: None,
        auth_public_key_file: None,
        auth_jwks_file: Some(path.clone()),
        auth_jwks_url: None,
        auth_jwks_refresh_secs: jwks::remote::REFRESH_SECS,
        auth_audience: Vec::new(),
        auth_issuer: Vec::new(),
        auth_leeway_secs: LEEWAY_SECS,
        auth_expiry_notice_secs: refresh::NOTICE_LEAD_SECS,
    };
    let gate = Gate::from_config(&config, failures.clone()).expect("a gate");
    let by_rsa = signed_with("rsa-1", Algorithm::RS256, &rsa);
    let by_ed = signed_with("ed-1", Algorithm::EdDSA, &ed);
    assert!(gate.admit(&by_rsa, "lobby").is_ok());
    assert_eq!(reason(gate.admit(&by_ed, "lobby")), "unknown_key");
    // No kid at all.
    let plain = sign(Algorithm::RS256, &claims("u1"), &rsa);
    assert_eq!(reason(gate.admit(&plain, "lobby")), "unknown_key");
    // A kid of the set, signed by another key: the signature fails.
    let forged = signed_with("rsa-1", Algorithm::EdDSA, &ed);
    assert_eq!(reason(gate.admit(&forged, "lobby")), "algorithm");

    // The provider rotates: the Ed25519 key comes, the RSA key goes. The
    // file is looked at again only a RECHECK after the last look.
    let Gate::Jwks(verifier) = &gate else {
        panic!("a key set gate")
    };
    let KeySource::File(file) = verifier.source() else {
        panic!("a key set file")
    };
    let t0 = std::time::Instant::now();
    std::fs::write(&path, jwks(&[("ed-1", &ed, Algorithm::EdDSA)])).expect("write");
    bump_mtime(&path);
    assert!(
        file.current_at(t0).get("ed-1").is_none(),
        "not looked at yet"
    );
    let later = t0 + jwks::RECHECK;
    let set = file.current_at(later);
    assert!(set.get("ed-1").is_some() && set.get("rsa-1").is_none());
    assert!(gate.admit(&by_ed, "lobby").is_ok());
    assert_eq!(reason(gate.admit(&by_rsa, "lobby")), "unknown_key");

    // A broken version: counted, and the last good set kept.
    std::fs::write(&path, "{ broken").expect("write");
    bump_mtime(&path);
    let set = file.current_at(later + 2 * jwks::RECHECK);
    assert!(set.get("ed-1").is_some());
    assert_eq!(failures.get(), 1);
    // Looked at again, unchanged: not counted twice.
    file.current_at(later + 4 * jwks::RECHECK);
    assert_eq!(failures.get(), 1);
}

/// Gives `path` a modification time one second on, whatever the file
/// system's clock granularity.
fn bump_mtime(path: &Path) {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .expect("open");
    let later = std::time::SystemTime::now() + std::time::Duration::from_secs(1);
    file.set_modified(later).expect("set mtime");
}

/// Issue #19: a token's `data` claim is an object of strings held to the
/// rules of a Join's data; `share_sub` reaches the admission.
#[test]
fn the_data_claim_is_an_object_of_strings_within_the_rules() {
    let rules = Rules::default();
    let got =
        data_claim(serde_json::json!({"role": "host", "colour": "red"}), &rules).expect("valid");
    assert_eq!(got.get("role"), Some("host"));
    assert_eq!(got.entries()[0].0, "colour", "sorted by key");
    assert_eq!(
        data_claim(serde_json::json!(["role"]), &rules),
        Err("not an object of strings (`{\"key\": \"value\"}`)".into())
    );
    assert_eq!(
        data_claim(serde_json::json!({"n": 3}), &rules),
        Err("key \"n\": the value is not a string".into())
    );
    assert_eq!(
        data_claim(serde_json::json!({"Role": "host"}), &rules),
        Err("key \"Role\": keys take only a-z, 0-9, '_', '.' and '-'".into())
    );
    let nine: serde_json::Map<String, serde_json::Value> = (0..9)
        .map(|i| (format!("k{i}"), serde_json::Value::from("v")))
        .collect();
    assert_eq!(
        data_claim(serde_json::Value::Object(nine), &rules),
        Err("9 entries: at most 8 are allowed".into())
    );

    let mut c = claims("user-1");
    c.data = Some(serde_json::json!({"role": "host"}));
    c.share_sub = true;
    let token = mint_hs256(SECRET, &c).expect("mint");
    let admitted = hs256().admit(&token, "lobby").expect("admitted");
    assert_eq!(admitted.data, Some(serde_json::json!({"role": "host"})));
    assert!(admitted.share_sub);
    let plain = mint_hs256(SECRET, &claims("user-1")).expect("mint");
    assert!(!hs256().admit(&plain, "lobby").expect("admitted").share_sub);
}

/// Issue #19: a provider's published set holds keys amble cannot use (an
/// encryption key, an algorithm it does not verify); they are skipped, not
/// a reason to refuse the whole set. A shared secret is never taken from a
/// published set.
#[test]
fn a_published_set_skips_keys_it_cannot_use_and_shared_secrets() {
    let rsa = EncodingKey::from_rsa_pem(&keys("rsa-private.pem")).expect("rsa");
    let mut sig = jsonwebtoken::jwk::Jwk::from_encoding_key(&rsa, Algorithm::RS256).expect("jwk");
    sig.common.key_id = Some("sig".into());
    let mut sig = serde_json::to_value(sig).expect("json");
    sig["use"] = "sig".into();
    let mut enc = sig.clone();
    enc["kid"] = "enc".into();
    enc["use"] = "enc".into();
    enc["alg"] = "RSA-OAEP".into();
    let mut oaep = sig.clone();
    oaep["kid"] = "oaep".into();
    oaep["use"] = serde_json::Value::Null;
    oaep["alg"] = "RSA-OAEP-256".into();
    let odd = serde_json::json!({ "kty": "XYZ", "kid": "odd" });
    let secret = serde_json::json!({ "kty": "oct", "kid": "hs", "k": "c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0LXNlY3JldA" });
    let doc = serde_json::json!({ "keys": [sig, enc, oaep, odd, secret] }).to_string();

    let published =
        jwks::KeySet::parse_with(doc.as_bytes(), jwks::Secrets::Skipped).expect("a set");
    assert_eq!(published.kids(), ["sig"]);
    let skipped = published.skipped();
    assert_eq!(skipped.len(), 4, "{skipped:?}");
    assert!(
        skipped[0].contains("kid enc is for encryption"),
        "{skipped:?}"
    );
    assert!(
        skipped[1].contains("kid oaep: no usable algorithm"),
        "{skipped:?}"
    );
    assert!(skipped[2].starts_with("key 3: not a key"), "{skipped:?}");
    assert!(
        skipped[3].contains("kid hs is a shared secret"),
        "{skipped:?}"
    );
    // A file on the server's own disk may hold a shared secret.
    let file = jwks::KeySet::parse(doc.as_bytes()).expect("a set");
    assert_eq!(file.kids(), ["hs", "sig"]);

    // Only unusable keys: refused, with every reason; reasons label metrics.
    let none = serde_json::json!({ "keys": [enc_only()] }).to_string();
    let err = jwks::KeySet::parse_with(none.as_bytes(), jwks::Secrets::Skipped).expect_err("none");
    assert_eq!(err.reason(), "keys");
    assert!(
        err.to_string()
            .starts_with("the set has no usable key: key 0: kid e is for encryption"),
        "{err}"
    );
    let twice = serde_json::json!({ "keys": [published_rsa("a"), published_rsa("a")] }).to_string();
    assert_eq!(
        jwks::KeySet::parse(twice.as_bytes()).expect_err("twice"),
        jwks::SetError::Twice("a".into())
    );
    let many: Vec<_> = (0..=jwks::MAX_KEYS)
        .map(|i| published_rsa(&i.to_string()))
        .collect();
    let many = serde_json::json!({ "keys": many }).to_string();
    assert_eq!(
        jwks::KeySet::parse(many.as_bytes()).expect_err("many"),
        jwks::SetError::TooMany
    );
    assert_eq!(
        jwks::KeySet::parse(b"[1, 2]").expect_err("json").reason(),
        "json"
    );
}

fn published_rsa(kid: &str) -> serde_json::Value {
    let rsa = EncodingKey::from_rsa_pem(&keys("rsa-private.pem")).expect("rsa");
    let mut jwk = jsonwebtoken::jwk::Jwk::from_encoding_key(&rsa, Algorithm::RS256).expect("jwk");
    jwk.common.key_id = Some(kid.into());
    serde_json::to_value(jwk).expect("json")
}

fn enc_only() -> serde_json::Value {
    let mut jwk = published_rsa("e");
    jwk["use"] = "enc".into();
    jwk
}

#[test]
fn a_key_set_url_is_https_or_loopback_http() {
    use jwks::fetch::Target;
    for ok in [
        "https://id.example.com/.well-known/jwks.json",
        "https://id.example.com:8443/certs?x=1",
        "http://127.0.0.1:8080/jwks.json",
        "http://127.3.4.5/jwks.json",
        "http://[::1]:9000/jwks.json",
        "http://localhost/jwks.json",
    ] {
        assert!(Target::parse(ok).is_ok(), "{ok}");
    }
    assert!(
        Target::parse("https://id.example.com/k")
            .expect("https")
            .tls()
    );
    assert!(!Target::parse("http://127.0.0.1/k").expect("http").tls());
    let refused = |url: &str| Target::parse(url).expect_err(url);
    assert_eq!(
        refused("http://id.example.com/jwks.json"),
        "plain http is accepted only for a loopback host (127.0.0.1, [::1], localhost: a test \
         or a sidecar); use https://id.example.com/jwks.json"
    );
    assert!(refused("http://10.0.0.1/k").contains("only for a loopback host"));
    assert!(refused("http://[::2]/k").contains("only for a loopback host"));
    assert!(refused("ftp://id.example.com/k").contains("must start with https://"));
    assert!(refused("/jwks.json").contains("no host"));
    assert!(refused("https://user:pw@id.example.com/k").contains("credentials"));
    assert!(refused("not a url at all").contains("not a URL"));
}

#[test]
fn cache_control_max_age_is_read() {
    use jwks::fetch::max_age;
    use std::time::Duration;
    assert_eq!(
        max_age("public, max-age=19874, must-revalidate"),
        Some(Duration::from_secs(19_874))
    );
    assert_eq!(max_age("max-age=60"), Some(Duration::from_secs(60)));
    assert_eq!(max_age("Max-Age=\"60\""), Some(Duration::from_secs(60)));
    assert_eq!(max_age("no-store, max-age=600"), Some(Duration::ZERO));
    assert_eq!(max_age("no-cache"), Some(Duration::ZERO));
    assert_eq!(max_age("public"), None);
    assert_eq!(max_age("max-age=soon"), None);
}

#[test]
fn refreshes_follow_the_interval_max_age_and_failures() {
    use jwks::remote::{after_failure, after_success};
    use std::time::Duration;
    let s = Duration::from_secs;
    let interval = s(300);
    assert_eq!(after_success(interval, None), s(300));
    assert_eq!(after_success(interval, Some(s(60))), s(60));
    // max-age never lengthens the interval, nor goes under 10 s.
    assert_eq!(after_success(interval, Some(s(20_000))), s(300));
    assert_eq!(after_success(interval, Some(s(0))), s(10));
    // Failures: 5 s, doubled, up to the interval.
    let waits: Vec<u64> = (1..=8)
        .map(|n| after_failure(interval, n).as_secs())
        .collect();
    assert_eq!(waits, [5, 10, 20, 40, 80, 160, 300, 300]);
    assert_eq!(after_failure(interval, u32::MAX), s(300));
    assert_eq!(after_failure(s(3), 1), s(3));
}

#[test]
fn unknown_kids_ask_for_a_fetch_at_most_once_per_gap() {
    use jwks::remote::{Ask, REFETCH_GAP, Refetch};
    use std::time::Duration;
    let t0 = tokio::time::Instant::now();
    let mut r = Refetch::default();
    assert_eq!(r.ask(t0), Ask::Fetch);
    // Under way: others wait for the same fetch.
    assert_eq!(r.ask(t0 + Duration::from_millis(5)), Ask::Wait);
    r.done();
    assert_eq!(r.ask(t0 + Duration::from_secs(1)), Ask::No);
    assert_eq!(r.ask(t0 + REFETCH_GAP - Duration::from_millis(1)), Ask::No);
    assert_eq!(r.ask(t0 + REFETCH_GAP), Ask::Fetch);
    r.done();
    assert_eq!(r.ask(t0 + REFETCH_GAP + Duration::from_secs(29)), Ask::No);
}

#[test]
fn fetch_failures_have_a_reason_and_only_the_network_is_retried_at_start() {
    use jwks::fetch::FetchError;
    let cases = [
        (
            FetchError::Connect {
                host: "h".into(),
                port: 443,
                why: "refused".into(),
            },
            "connect",
            true,
        ),
        (FetchError::Timeout, "timeout", true),
        (FetchError::Http("closed".into()), "http", true),
        (FetchError::Status(503), "status", true),
        (FetchError::Status(429), "status", true),
        (FetchError::Status(404), "status", false),
        (FetchError::Status(302), "status", false),
        (FetchError::Tls("unknown issuer".into()), "tls", false),
        (FetchError::TooLarge, "too_large", false),
        (
            FetchError::Set(jwks::SetError::NotJson("x".into())),
            "json",
            false,
        ),
        (FetchError::Set(jwks::SetError::TooMany), "keys", false),
    ];
    for (err, reason, transient) in cases {
        assert_eq!(err.reason(), reason, "{err}");
        assert_eq!(err.transient(), transient, "{err}");
    }
}
