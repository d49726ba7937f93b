//! Several keys chosen by `kid`, from a JSON Web Key Set file
//! (`--auth-jwks-file`), re-read when it changes, so keys rotate without a
//! restart: an identity provider's published keys, or an app's own.
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

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey};
use prometheus_client::metrics::counter::Counter;
use tracing::{error, info};

/// How often the file's modification time is looked at, at most.
pub const RECHECK: Duration = Duration::from_secs(1);
/// The most keys a set may hold.
pub const MAX_KEYS: usize = 64;
/// The largest file read, bytes.
pub const MAX_FILE_BYTES: u64 = 1024 * 1024;

/// The keys of one version of the set, by `kid`.
pub struct KeySet {
    keys: HashMap<String, (DecodingKey, Algorithm)>,
}

impl std::fmt::Debug for KeySet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut kids: Vec<&String> = self.keys.keys().collect();
        kids.sort();
        f.debug_struct("KeySet").field("kids", &kids).finish()
    }
}

impl KeySet {
    /// Reads a JWKS (`{"keys": [...]}`): every key needs a `kid`; its
    /// algorithm is its `alg`, or follows its type (RSA: RS256, Ed25519:
    /// EdDSA, P-256: ES256, P-384: ES384, a symmetric key: HS256).
    pub fn parse(bytes: &[u8]) -> Result<Self, String> {
        let set: JwkSet =
            serde_json::from_slice(bytes).map_err(|err| format!("not a JWKS: {err}"))?;
        if set.keys.is_empty() {
            return Err("the set has no key".into());
        }
        if set.keys.len() > MAX_KEYS {
            return Err(format!("more than {MAX_KEYS} keys"));
        }
        let mut keys = HashMap::new();
        for jwk in &set.keys {
            let kid = jwk
                .common
                .key_id
                .clone()
                .filter(|k| !k.is_empty())
                .ok_or("a key without a kid")?;
            let alg = algorithm(jwk).ok_or_else(|| format!("key {kid}: no usable algorithm"))?;
            let key = DecodingKey::from_jwk(jwk).map_err(|err| format!("key {kid}: {err}"))?;
            if keys.insert(kid.clone(), (key, alg)).is_some() {
                return Err(format!("kid {kid} twice"));
            }
        }
        Ok(Self { keys })
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
    pub fn current_at(&self, now: Instant) -> Arc<KeySet> {
        let mut loaded = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if now.saturating_duration_since(loaded.checked) >= RECHECK {
            loaded.checked = now;
            let modified = std::fs::metadata(&self.path)
                .and_then(|m| m.modified())
                .ok();
            if modified != loaded.modified {
                loaded.modified = modified;
                match read(&self.path) {
                    Ok((set, _)) => {
                        info!(path = %self.path.display(), keys = set.len(), "auth: the key set changed; re-read");
                        loaded.set = Arc::new(set);
                    }
                    Err(why) => {
                        self.failures.inc();
                        error!(path = %self.path.display(), %why, "auth: cannot re-read the key set; keeping the last good one");
                    }
                }
            }
        }
        Arc::clone(&loaded.set)
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
    Ok((KeySet::parse(&bytes)?, meta.modified().ok()))
}
