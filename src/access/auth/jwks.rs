//! Several keys chosen by `kid`, from a JSON Web Key Set: a file
//! (`--auth-jwks-file`), re-read when it changes, or a URL
//! (`--auth-jwks-url`, [`remote`], fetched by [`fetch`]), fetched again on a
//! schedule and for an unknown `kid`; so keys rotate without a restart: an
//! identity provider's published keys, or an app's own.
//!
//! [`KeySet::parse`] is pure (bytes in, keys or an error out);
//! [`JwksFile`] looks at the file's modification time at most once per
//! [`RECHECK`] and keeps the last good set when a new version does not
//! parse (counted and logged).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::str::FromStr as _;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey};
use prometheus_client::metrics::counter::Counter;
use tracing::{error, info};

use super::{Admission, Refusal, TokenRules, Verifier, header_field};

/// How often the file's modification time is looked at, at most.
pub const RECHECK: Duration = Duration::from_secs(1);
/// The most keys a set may hold.
pub const MAX_KEYS: usize = 64;
/// The largest file read, bytes.
pub const MAX_FILE_BYTES: u64 = 1024 * 1024;

/// The keys of one version of the set, by `kid`.
pub struct KeySet {
    keys: HashMap<String, (DecodingKey, Algorithm)>,
    skipped: Vec<String>,
}

impl std::fmt::Debug for KeySet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeySet")
            .field("kids", &self.kids())
            .field("skipped", &self.skipped)
            .finish()
    }
}

/// Whether a set may hold shared (HS256) secrets: a file on the server's
/// disk may, a set fetched from a URL (published for anyone to read) never.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Secrets {
    Allowed,
    Skipped,
}

/// Why a key set cannot be used. [`reason`](SetError::reason) labels it
/// in `amble_auth_jwks_fetch_failures_total`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SetError {
    /// Not JSON, or not `{"keys": [...]}`.
    #[error("not a JWKS: {0}")]
    NotJson(String),
    /// More keys than [`MAX_KEYS`].
    #[error("more than {MAX_KEYS} keys")]
    TooMany,
    /// Two keys under one `kid`: which one a token means is unknowable.
    #[error("kid {0} twice")]
    Twice(String),
    /// No key amble can verify tokens with; each skipped one says why.
    #[error("the set has no usable key{}", skipped_list(.skipped))]
    NoKey { skipped: Vec<String> },
}

fn skipped_list(skipped: &[String]) -> String {
    if skipped.is_empty() {
        String::new()
    } else {
        format!(": {}", skipped.join("; "))
    }
}

impl SetError {
    /// `json` or `keys`.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::NotJson(_) => "json",
            _ => "keys",
        }
    }
}

impl KeySet {
    /// Reads a JWKS (`{"keys": [...]}`) from a file: see
    /// [`parse_with`](Self::parse_with).
    pub fn parse(bytes: &[u8]) -> Result<Self, SetError> {
        Self::parse_with(bytes, Secrets::Allowed)
    }

    /// Reads a JWKS (`{"keys": [...]}`). A key's algorithm is its `alg`,
    /// or follows its type (RSA: RS256, Ed25519: EdDSA, P-256: ES256, P-384:
    /// ES384, a symmetric key: HS256). Keys amble cannot use are skipped,
    /// each with its reason ([`skipped`](Self::skipped)): no `kid`, `use:
    /// enc`, an encryption or unknown algorithm, a key type it does not
    /// know, a shared secret under [`Secrets::Skipped`]. A set with no key
    /// left, more than [`MAX_KEYS`], or a `kid` twice is refused.
    pub fn parse_with(bytes: &[u8], secrets: Secrets) -> Result<Self, SetError> {
        #[derive(serde::Deserialize)]
        struct Raw {
            keys: Vec<serde_json::Value>,
        }
        let raw: Raw =
            serde_json::from_slice(bytes).map_err(|err| SetError::NotJson(err.to_string()))?;
        if raw.keys.len() > MAX_KEYS {
            return Err(SetError::TooMany);
        }
        let mut keys = HashMap::new();
        let mut skipped = Vec::new();
        for (i, value) in raw.keys.into_iter().enumerate() {
            match usable(value, secrets) {
                Ok((kid, key, alg)) => {
                    if keys.insert(kid.clone(), (key, alg)).is_some() {
                        return Err(SetError::Twice(kid));
                    }
                }
                Err(why) => skipped.push(format!("key {i}: {why}")),
            }
        }
        if keys.is_empty() {
            return Err(SetError::NoKey { skipped });
        }
        Ok(Self { keys, skipped })
    }

    /// The key and algorithm for `kid`.
    pub fn get(&self, kid: &str) -> Option<&(DecodingKey, Algorithm)> {
        self.keys.get(kid)
    }

    /// How many keys.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether it has no key (never, once parsed).
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The `kid`s, sorted.
    pub fn kids(&self) -> Vec<&str> {
        let mut kids: Vec<&str> = self.keys.keys().map(String::as_str).collect();
        kids.sort_unstable();
        kids
    }

    /// The keys left out, each with why.
    pub fn skipped(&self) -> &[String] {
        &self.skipped
    }
}

/// One key of a set, when amble can verify tokens with it.
fn usable(
    value: serde_json::Value,
    secrets: Secrets,
) -> Result<(String, DecodingKey, Algorithm), String> {
    let jwk: Jwk = serde_json::from_value(value).map_err(|err| format!("not a key: {err}"))?;
    let kid = jwk
        .common
        .key_id
        .clone()
        .filter(|k| !k.is_empty())
        .ok_or("a key without a kid")?;
    if matches!(jwk.common.public_key_use, Some(PublicKeyUse::Encryption)) {
        return Err(format!("kid {kid} is for encryption (use: enc)"));
    }
    if secrets == Secrets::Skipped && matches!(jwk.algorithm, AlgorithmParameters::OctetKey(_)) {
        return Err(format!(
            "kid {kid} is a shared secret (kty: oct), never taken from a published set"
        ));
    }
    let alg = algorithm(&jwk).ok_or_else(|| format!("kid {kid}: no usable algorithm"))?;
    let key = DecodingKey::from_jwk(&jwk).map_err(|err| format!("kid {kid}: {err}"))?;
    Ok((kid, key, alg))
}

/// A key's algorithm: its `alg`, else from its type.
fn algorithm(jwk: &Jwk) -> Option<Algorithm> {
    if let Some(alg) = jwk.common.key_algorithm {
        return Algorithm::from_str(&alg.to_string()).ok();
    }
    match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => Some(Algorithm::RS256),
        AlgorithmParameters::OctetKeyPair(_) => Some(Algorithm::EdDSA),
        AlgorithmParameters::OctetKey(_) => Some(Algorithm::HS256),
        AlgorithmParameters::EllipticCurve(ec) => match ec.curve {
            EllipticCurve::P256 => Some(Algorithm::ES256),
            EllipticCurve::P384 => Some(Algorithm::ES384),
            _ => None,
        },
    }
}

/// The set in `--auth-jwks-file`, re-read when the file changes.
#[derive(Debug)]
pub struct JwksFile {
    path: PathBuf,
    state: Mutex<Loaded>,
    failures: Counter,
}

#[derive(Debug)]
struct Loaded {
    set: Arc<KeySet>,
    modified: Option<SystemTime>,
    checked: Instant,
}

impl JwksFile {
    /// Reads the file at start: a file that cannot be read or parsed is an
    /// error then. Later failures keep the last good set and count in
    /// `failures`.
    pub fn open(path: &Path, failures: Counter) -> Result<Self, String> {
        let (set, modified) = read(path)?;
        Ok(Self {
            path: path.to_owned(),
            state: Mutex::new(Loaded {
                set: Arc::new(set),
                modified,
                checked: Instant::now(),
            }),
            failures,
        })
    }

    /// The current set, re-read first when [`RECHECK`] has passed since the
    /// last look and the file's modification time changed.
    pub fn current(&self) -> Arc<KeySet> {
        self.current_at(Instant::now())
    }

    /// [`current`](Self::current) at `now` (tests pass their own instants).
    /// The file is looked at and read without the lock held, so the other
    /// joins meanwhile take the current set at once; only the join that
    /// found the look due does it.
    pub fn current_at(&self, now: Instant) -> Arc<KeySet> {
        let (set, seen) = {
            let mut loaded = self.lock();
            if now.saturating_duration_since(loaded.checked) < RECHECK {
                return Arc::clone(&loaded.set);
            }
            loaded.checked = now;
            (Arc::clone(&loaded.set), loaded.modified)
        };
        let modified = std::fs::metadata(&self.path)
            .and_then(|m| m.modified())
            .ok();
        if modified == seen {
            return set;
        }
        let read = read(&self.path);
        let mut loaded = self.lock();
        loaded.modified = modified;
        match read {
            Ok((set, _)) => {
                info!(path = %self.path.display(), keys = set.len(), "auth: the key set changed; re-read");
                loaded.set = Arc::new(set);
            }
            Err(why) => {
                self.failures.inc();
                error!(path = %self.path.display(), %why, "auth: cannot re-read the key set; keeping the last good one");
            }
        }
        Arc::clone(&loaded.set)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Loaded> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

fn read(path: &Path) -> Result<(KeySet, Option<SystemTime>), String> {
    let meta = std::fs::metadata(path).map_err(|err| format!("cannot read it: {err}"))?;
    if meta.len() > MAX_FILE_BYTES {
        return Err(format!("larger than {MAX_FILE_BYTES} bytes"));
    }
    let bytes = std::fs::read(path).map_err(|err| format!("cannot read it: {err}"))?;
    let set = KeySet::parse(&bytes).map_err(|err| err.to_string())?;
    Ok((set, meta.modified().ok()))
}

/// Where a key set comes from.
#[derive(Debug)]
pub enum KeySource {
    /// `--auth-jwks-file`.
    File(JwksFile),
    /// `--auth-jwks-url`.
    Url(remote::JwksUrl),
}

impl std::fmt::Display for KeySource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::File(file) => write!(f, "{}", file.path().display()),
            Self::Url(url) => write!(f, "{}", url.target()),
        }
    }
}

/// Checks Join tokens with the key their `kid` names in a key set.
#[derive(Debug)]
pub struct JwksVerifier {
    source: KeySource,
    rules: TokenRules,
}

impl JwksVerifier {
    /// A verifier reading keys from `source`, for tokens that follow
    /// `rules`.
    pub fn new(source: KeySource, rules: TokenRules) -> Self {
        Self { source, rules }
    }

    /// Where the key set comes from.
    pub fn source(&self) -> &KeySource {
        &self.source
    }

    /// Verifies `token` with the key its `kid` names, and checks that it
    /// allows `room`.
    pub fn admit(&self, token: &str, room: &str) -> Result<Admission, Refusal> {
        if token.is_empty() {
            return Err(Refusal::Missing);
        }
        let kid = header_field(token, "kid").ok_or(Refusal::UnknownKey)?;
        let set = match &self.source {
            KeySource::File(file) => file.current(),
            KeySource::Url(url) => url.current(),
        };
        let (key, alg) = set.get(&kid).ok_or(Refusal::UnknownKey)?;
        Verifier::with_rules(key.clone(), *alg, &self.rules).admit(token, room)
    }
}

pub mod fetch;
pub mod remote;
