//! Who may join: signed tokens (JWT) on `Join`.
//!
//! With a key configured (`--auth-hs256-secret-file`,
//! `--auth-public-key-file` for RS256 or EdDSA, or a key set by `kid` from
//! `--auth-jwks-file` or `--auth-jwks-url`: [`jwks`]), every `Join` must
//! carry a token the app's backend or an identity provider signed: `sub` (the app's user id) and `exp` are
//! required, `name` replaces the display name asked for, `data` sets member
//! data the Join cannot change, `share_sub` shows `sub` to the room, and `rooms` lists
//! the rooms the token allows (a trailing `*` matches any suffix). Without a
//! key the [`Gate`] is open and tokens are ignored, as before tokens existed.
//!
//! Signatures are checked by the `jsonwebtoken` crate, never here. The
//! accepted algorithm is the one the key is for, and only that one: a token
//! whose header names another (`none` included) is refused. Plain data: no
//! sockets here (a key set URL is fetched by `jwks::fetch`, in the task of
//! `jwks::remote`); the wall clock is read by `jsonwebtoken` for `exp`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use prometheus_client::metrics::counter::Counter;
use serde::{Deserialize, Serialize};

use crate::protocol::{Data, DecodeError, ErrorCode, Rules, pb, validate_room};

/// Who may join: the key tokens are checked with (`--auth-*`). At most
/// one of the two files.
#[derive(Clone, Debug, clap::Args)]
pub struct AuthConfig {
    /// File holding an HS256 secret (at least 32 bytes; trailing line breaks
    /// are not part of it). When set, every Join must carry a token signed
    /// with it (see docs/protocol.md, "Tokens"). Read once at start.
    #[arg(
        long,
        display_order = 37,
        env = "AMBLE_AUTH_HS256_SECRET_FILE",
        value_name = "PATH",
        conflicts_with_all = ["auth_public_key_file", "auth_jwks_file"]
    )]
    pub auth_hs256_secret_file: Option<std::path::PathBuf>,

    /// File holding a PEM public key (RSA for RS256, or Ed25519 for EdDSA;
    /// the algorithm follows the key). When set, every Join must carry a
    /// token signed with the matching private key. Read once at start.
    #[arg(
        long,
        display_order = 38,
        env = "AMBLE_AUTH_PUBLIC_KEY_FILE",
        value_name = "PATH",
        conflicts_with = "auth_jwks_file"
    )]
    pub auth_public_key_file: Option<std::path::PathBuf>,

    /// File holding a JSON Web Key Set (`{"keys": [...]}`, as identity
    /// providers publish it): every Join must carry a token whose `kid`
    /// names one of its keys, signed with it. The file is read again when
    /// it changes (looked at once a second), so keys rotate without a
    /// restart; a version that does not parse is counted and the last good
    /// one kept.
    #[arg(
        long,
        display_order = 63,
        env = "AMBLE_AUTH_JWKS_FILE",
        value_name = "PATH"
    )]
    pub auth_jwks_file: Option<std::path::PathBuf>,

    /// URL of an identity provider's JSON Web Key Set (https; plain http
    /// only for a loopback host): every Join must carry a token whose `kid`
    /// names one of its keys, signed with it. Fetched at start (amble does
    /// not start without it), then every --auth-jwks-refresh-secs, and at
    /// once (at most every 30 s) when a token names an unknown `kid`; a
    /// failed fetch keeps the last good set.
    #[arg(
        long,
        display_order = 77,
        env = "AMBLE_AUTH_JWKS_URL",
        value_name = "URL",
        conflicts_with_all = ["auth_hs256_secret_file", "auth_public_key_file", "auth_jwks_file"]
    )]
    pub auth_jwks_url: Option<String>,

    /// How often the key set of --auth-jwks-url is fetched again, seconds
    /// (10 to 86400; sooner when the provider's Cache-Control max-age says
    /// so).
    #[arg(long, display_order = 78, env = "AMBLE_AUTH_JWKS_REFRESH_SECS",
          default_value_t = jwks::remote::REFRESH_SECS,
          value_parser = clap::value_parser!(u64).range(10..=86_400))]
    pub auth_jwks_refresh_secs: u64,

    /// Audiences a token may be for (its `aud`), comma-separated. When set,
    /// a token must name one of them, as an identity provider's tokens do.
    /// Without it, a token that names any audience is refused.
    #[arg(
        long,
        display_order = 60,
        env = "AMBLE_AUTH_AUDIENCE",
        value_delimiter = ',',
        value_name = "AUD"
    )]
    pub auth_audience: Vec<String>,

    /// Issuers a token may come from (its `iss`), comma-separated. When
    /// set, a token must carry one of them; without it, `iss` is not read.
    #[arg(
        long,
        display_order = 61,
        env = "AMBLE_AUTH_ISSUER",
        value_delimiter = ',',
        value_name = "ISS"
    )]
    pub auth_issuer: Vec<String>,

    /// Clock skew tolerated on a token's `exp` and `nbf`, seconds (at most
    /// 600).
    #[arg(long, display_order = 62, env = "AMBLE_AUTH_LEEWAY_SECS",
          default_value_t = LEEWAY_SECS, value_parser = clap::value_parser!(u64).range(0..=600))]
    pub auth_leeway_secs: u64,

    /// How long before its token expires a member is told
    /// (`TokenExpiring`), so that its client can send a fresh one
    /// (`RefreshToken`), seconds (1 to 3600; at once when less is left).
    #[arg(long, display_order = 90, env = "AMBLE_AUTH_EXPIRY_NOTICE_SECS",
          default_value_t = refresh::NOTICE_LEAD_SECS,
          value_parser = clap::value_parser!(u64).range(1..=3_600))]
    pub auth_expiry_notice_secs: u64,
}

/// What a token's registered claims must say, besides its signature and
/// expiry: from `--auth-audience`, `--auth-issuer`, `--auth-leeway-secs`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenRules {
    /// Accepted `aud` values; empty: a token must name none.
    pub audiences: Vec<String>,
    /// Accepted `iss` values; empty: `iss` is not read.
    pub issuers: Vec<String>,
    /// Clock skew tolerated on `exp` and `nbf`, seconds.
    pub leeway_secs: u64,
}

impl Default for TokenRules {
    fn default() -> Self {
        Self {
            audiences: Vec::new(),
            issuers: Vec::new(),
            leeway_secs: LEEWAY_SECS,
        }
    }
}

impl TokenRules {
    fn from_config(config: &AuthConfig) -> Self {
        Self {
            audiences: config.auth_audience.clone(),
            issuers: config.auth_issuer.clone(),
            leeway_secs: config.auth_leeway_secs,
        }
    }
}

/// Clock skew tolerated on `exp` (and `nbf`, when a token has one), seconds,
/// unless `--auth-leeway-secs` says otherwise.
pub const LEEWAY_SECS: u64 = 30;

/// The shortest HS256 secret accepted, bytes (RFC 7518 section 3.2: at
/// least the size of the hash output).
pub const MIN_SECRET_BYTES: usize = 32;

/// The longest `sub` accepted, bytes. A room keeps one per member.
pub const MAX_SUB_BYTES: usize = 256;

/// The claims amble reads. Others (`iat`, `jti`, ...) are ignored; `aud`
/// and `iss` are checked against `--auth-audience` and `--auth-issuer`
/// ([`TokenRules`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    /// The app's user id: one user is one avatar per room.
    pub sub: String,
    /// Expiry, seconds since the Unix epoch.
    pub exp: u64,
    /// The display name, replacing the one the Join asks for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Allowed rooms; absent allows every room. `team-*` allows every room
    /// whose name starts with `team-`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rooms: Option<Vec<String>>,
    /// Where the member appears (`{"x": .., "y": ..}`, in cm), replacing a
    /// start the Join asks for; checked to be within the world.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<StartClaim>,
    /// Member data the token sets (`{"role": "host"}`): an object of
    /// string values, held to the rules of a Join's data. Its entries win
    /// over the Join's, and SetData cannot change them. Checked when the
    /// Join is settled, so that a bad one is refused as INVALID_DATA.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<serde_json::Value>,
    /// Whether the room may see `sub` (as `Member.user`). Never by default.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub share_sub: bool,
}

/// A token's `start` claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StartClaim {
    pub x: u32,
    pub y: u32,
}

/// Whether `patterns` (a token's `rooms`) allow `room`. `None` allows all;
/// a pattern ending in `*` matches every room that starts with the rest of
/// it; any other pattern matches only itself (case-sensitive, as rooms are).
pub fn room_allowed(patterns: Option<&[String]>, room: &str) -> bool {
    let Some(patterns) = patterns else {
        return true;
    };
    patterns.iter().any(|p| match p.strip_suffix('*') {
        Some(prefix) => room.starts_with(prefix),
        None => p == room,
    })
}

/// Checks a `rooms` pattern as `amble token` writes it: a room name, or the
/// start of one followed by `*` (`*` alone allows every room).
pub fn check_room_pattern(pattern: &str, rules: &Rules) -> Result<(), DecodeError> {
    match pattern.strip_suffix('*') {
        Some("") => Ok(()),
        Some(prefix) => validate_room(prefix.to_owned(), rules).map(drop),
        None => validate_room(pattern.to_owned(), rules).map(drop),
    }
}

/// Reads a token's `data` claim: an object whose values are strings, held
/// to the rules of a Join's data. The error says what is wrong with it.
pub fn data_claim(value: serde_json::Value, rules: &Rules) -> Result<Data, String> {
    let serde_json::Value::Object(map) = value else {
        return Err("not an object of strings (`{\"key\": \"value\"}`)".into());
    };
    if map.len() > rules.max_data_entries {
        return Err(format!(
            "{} entries: at most {} are allowed",
            map.len(),
            rules.max_data_entries
        ));
    }
    let mut entries = Vec::with_capacity(map.len());
    for (key, value) in map {
        let serde_json::Value::String(value) = value else {
            return Err(format!("key {key:?}: the value is not a string"));
        };
        entries.push(pb::DataEntry { key, value });
    }
    Data::check(entries, rules).map_err(|err| err.to_string())
}

/// What an admitted Join brings with it.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Admission {
    /// The token's `sub`: `None` on an open server.
    pub user: Option<Arc<str>>,
    /// The token's `name` claim, not yet checked against the name rule.
    pub name: Option<String>,
    /// The token's `start` claim, not yet checked against the world.
    pub start: Option<StartClaim>,
    /// The token's `data` claim, not yet checked against the data rules.
    pub data: Option<serde_json::Value>,
    /// The token's `share_sub` claim.
    pub share_sub: bool,
    /// The token's `exp`, seconds since the Unix epoch: `None` on an open
    /// server. The session ends at it unless refreshed (see [`refresh`]).
    pub expires_at: Option<u64>,
}

/// Why a Join's token was refused. Each is counted under its
/// [`reason`](Refusal::reason) in `amble_auth_refused_total`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The Join carries no token.
    #[error("this server requires a token: send Join.token (a JWT from the app)")]
    Missing,
    /// Not a JWT, or its claims are missing or of the wrong type.
    #[error("malformed token: {0}")]
    Malformed(String),
    /// The signature does not verify with the server's key.
    #[error("the token's signature does not verify")]
    BadSignature,
    /// The header names an algorithm other than the key's.
    #[error("the token is signed with another algorithm than this server's key ({expected:?})")]
    Algorithm { expected: Algorithm },
    /// `exp` is past (beyond the leeway).
    #[error("the token has expired")]
    Expired,
    /// `nbf` is still ahead (beyond the leeway).
    #[error("the token is not valid yet (nbf)")]
    NotYetValid,
    /// The token's audience (`aud`) is not one of `--auth-audience` (or
    /// it names one and the server accepts none).
    #[error("the token is for an audience (aud) this server does not accept (--auth-audience)")]
    Audience,
    /// The token's issuer (`iss`) is not one of `--auth-issuer`, or it has
    /// none.
    #[error("the token is from an issuer (iss) this server does not accept (--auth-issuer)")]
    Issuer,
    /// The token's `kid` names no key of the key set (`--auth-jwks-file`,
    /// `--auth-jwks-url`), or it has none.
    #[error("the token's key (kid) is not one of this server's key set")]
    UnknownKey,
    /// The token's `rooms` do not include this room.
    #[error("the token does not allow room {room}")]
    Forbidden { room: String },
}

impl Refusal {
    /// The protocol error code sent back.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::Forbidden { .. } => ErrorCode::Forbidden,
            _ => ErrorCode::Unauthenticated,
        }
    }

    /// The `reason` label in `/metrics`.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Missing => "missing",
            Self::Malformed(_) => "malformed",
            Self::BadSignature => "bad_signature",
            Self::Algorithm { .. } => "algorithm",
            Self::Expired => "expired",
            Self::NotYetValid => "not_yet_valid",
            Self::Audience => "audience",
            Self::Issuer => "issuer",
            Self::UnknownKey => "unknown_key",
            Self::Forbidden { .. } => "forbidden",
        }
    }
}

/// Why the configured secret or key cannot be used. The message names the
/// flag, so the operator knows what to fix.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// The file cannot be read.
    #[error("{flag} {}: cannot read it: {source}", path.display())]
    Read {
        flag: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    /// The secret is empty or shorter than [`MIN_SECRET_BYTES`].
    #[error(
        "{flag} {}: the secret is {len} bytes; use at least {MIN_SECRET_BYTES} \
         (for example `openssl rand -base64 48 > {}`)",
        path.display(), path.display()
    )]
    ShortSecret {
        flag: &'static str,
        path: PathBuf,
        len: usize,
    },
    /// A token rule (`--auth-audience`, `--auth-issuer`) without a key to
    /// check tokens with.
    #[error(
        "{flag} needs {SECRET_FLAG}, {PUBLIC_KEY_FLAG}, --auth-jwks-file or --auth-jwks-url: without a key no token is read"
    )]
    NoKey { flag: &'static str },
    /// The key set file cannot be read or parsed at start.
    #[error("--auth-jwks-file {}: {why}", path.display())]
    Jwks { path: PathBuf, why: String },
    /// The key set URL is not accepted, or no key set could be fetched
    /// from it at start.
    #[error("--auth-jwks-url {url}: {why}")]
    JwksUrl { url: String, why: String },
    /// The key file is not a public key amble can use.
    #[error("{flag} {}: {why}", path.display())]
    Key {
        flag: &'static str,
        path: PathBuf,
        why: &'static str,
    },
}

/// The flag names, for messages.
pub const SECRET_FLAG: &str = "--auth-hs256-secret-file";
pub const PUBLIC_KEY_FLAG: &str = "--auth-public-key-file";

/// Reads an HS256 secret: the file's bytes, less trailing line breaks.
/// Refuses a missing, empty or short one, naming `flag`.
pub fn read_secret(path: &Path, flag: &'static str) -> Result<Vec<u8>, SetupError> {
    let mut secret = std::fs::read(path).map_err(|source| SetupError::Read {
        flag,
        path: path.to_owned(),
        source,
    })?;
    while secret.last().is_some_and(|b| matches!(b, b'\n' | b'\r')) {
        secret.pop();
    }
    if secret.len() < MIN_SECRET_BYTES {
        return Err(SetupError::ShortSecret {
            flag,
            path: path.to_owned(),
            len: secret.len(),
        });
    }
    Ok(secret)
}

/// Reads a PEM public key and the one algorithm it verifies: RS256 for an
/// RSA key, EdDSA for an Ed25519 key.
fn read_public_key(path: &Path) -> Result<(DecodingKey, Algorithm), SetupError> {
    let flag = PUBLIC_KEY_FLAG;
    let bad = |why| SetupError::Key {
        flag,
        path: path.to_owned(),
        why,
    };
    let pem = std::fs::read(path).map_err(|source| SetupError::Read {
        flag,
        path: path.to_owned(),
        source,
    })?;
    if pem.windows(11).any(|w| w == b"PRIVATE KEY") {
        return Err(bad(
            "this is a private key: give the public one (`openssl pkey -in KEY -pubout`)",
        ));
    }
    let (key, alg) = if let Ok(key) = DecodingKey::from_rsa_pem(&pem) {
        (key, Algorithm::RS256)
    } else if let Ok(key) = DecodingKey::from_ed_pem(&pem) {
        (key, Algorithm::EdDSA)
    } else {
        return Err(bad(
            "not an RSA or Ed25519 public key in PEM (-----BEGIN PUBLIC KEY-----)",
        ));
    };
    // A probe: a key that parses as PEM but not as a key fails here, at
    // start, rather than on every Join.
    match jsonwebtoken::crypto::verify("AAAA", b"probe", &key, alg) {
        Ok(_) => Ok((key, alg)),
        Err(_) => Err(bad("the PEM holds no usable RSA or Ed25519 public key")),
    }
}

/// Checks Join tokens with one key and one algorithm.
pub struct Verifier {
    key: DecodingKey,
    validation: Validation,
}

impl std::fmt::Debug for Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Verifier")
            .field("algorithm", &self.algorithm())
            .finish_non_exhaustive()
    }
}

impl Verifier {
    /// A verifier for `key`, accepting `alg` and nothing else, with the
    /// default rules (no audience, any issuer, 30 s of leeway).
    pub fn new(key: DecodingKey, alg: Algorithm) -> Self {
        Self::with_rules(key, alg, &TokenRules::default())
    }

    /// A verifier for `key`, accepting `alg` and nothing else, and tokens
    /// whose `aud` and `iss` follow `rules`.
    pub fn with_rules(key: DecodingKey, alg: Algorithm, rules: &TokenRules) -> Self {
        let mut validation = Validation::new(alg);
        let mut required = vec!["exp", "sub"];
        if !rules.audiences.is_empty() {
            validation.set_audience(&rules.audiences);
            required.push("aud");
        }
        if !rules.issuers.is_empty() {
            validation.set_issuer(&rules.issuers);
            required.push("iss");
        }
        validation.set_required_spec_claims(&required);
        validation.leeway = rules.leeway_secs;
        validation.validate_exp = true;
        validation.validate_nbf = true;
        validation.validate_aud = true;
        Self { key, validation }
    }

    /// The one algorithm accepted.
    pub fn algorithm(&self) -> Algorithm {
        self.validation.algorithms[0]
    }

    /// Verifies `token` and checks that it allows `room`.
    pub fn admit(&self, token: &str, room: &str) -> Result<Admission, Refusal> {
        if token.is_empty() {
            return Err(Refusal::Missing);
        }
        // An algorithm jsonwebtoken has no name for (`none`, above all) is
        // a refused algorithm, not a malformed token.
        if let Some(alg) = header_field(token, "alg")
            && alg != format!("{:?}", self.algorithm())
        {
            return Err(Refusal::Algorithm {
                expected: self.algorithm(),
            });
        }
        let claims = jsonwebtoken::decode::<Claims>(token, &self.key, &self.validation)
            .map_err(|err| self.refusal(err))?
            .claims;
        if claims.sub.is_empty() {
            return Err(Refusal::Malformed("empty sub".into()));
        }
        if claims.sub.len() > MAX_SUB_BYTES {
            return Err(Refusal::Malformed(format!(
                "sub is longer than {MAX_SUB_BYTES} bytes"
            )));
        }
        if !room_allowed(claims.rooms.as_deref(), room) {
            return Err(Refusal::Forbidden {
                room: room.to_owned(),
            });
        }
        Ok(Admission {
            user: Some(Arc::from(claims.sub)),
            name: claims.name,
            start: claims.start,
            data: claims.data,
            share_sub: claims.share_sub,
            expires_at: Some(claims.exp),
        })
    }

    fn refusal(&self, err: jsonwebtoken::errors::Error) -> Refusal {
        match err.into_kind() {
            ErrorKind::InvalidSignature => Refusal::BadSignature,
            ErrorKind::InvalidAlgorithm => Refusal::Algorithm {
                expected: self.algorithm(),
            },
            ErrorKind::ExpiredSignature => Refusal::Expired,
            ErrorKind::ImmatureSignature => Refusal::NotYetValid,
            ErrorKind::InvalidAudience => Refusal::Audience,
            ErrorKind::InvalidIssuer => Refusal::Issuer,
            ErrorKind::MissingRequiredClaim(claim) if claim == "aud" => Refusal::Audience,
            ErrorKind::MissingRequiredClaim(claim) if claim == "iss" => Refusal::Issuer,
            ErrorKind::MissingRequiredClaim(claim) => {
                Refusal::Malformed(format!("no {claim} claim"))
            }
            ErrorKind::InvalidClaimFormat(claim) => {
                Refusal::Malformed(format!("{claim} is not a number"))
            }
            ErrorKind::Json(err) => Refusal::Malformed(format!("claims or header: {err}")),
            ErrorKind::Base64(_) | ErrorKind::Utf8(_) => {
                Refusal::Malformed("not base64url-encoded JSON".into())
            }
            ErrorKind::InvalidToken => {
                Refusal::Malformed("not a JWT (header.claims.signature)".into())
            }
            // Key or provider failures on this token: it does not verify.
            _ => Refusal::BadSignature,
        }
    }
}

/// The string field `name` (`alg`, `kid`) of a token's header, when its
/// header is base64url JSON with such a field.
fn header_field(token: &str, name: &str) -> Option<String> {
    use base64::Engine as _;
    let header = token.split('.').next()?;
    let json = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(header)
        .ok()?;
    let value: serde_json::Value = serde_json::from_slice(&json).ok()?;
    value.get(name)?.as_str().map(str::to_owned)
}

/// Who may join: everyone (no key configured) or token holders.
#[derive(Debug)]
pub enum Gate {
    /// No key: Joins need no token, and a token sent is ignored.
    Open,
    /// Every Join needs a token this verifier accepts.
    Tokens(Box<Verifier>),
    /// Every Join needs a token signed with a key of the key set.
    Jwks(Box<JwksVerifier>),
}

impl Gate {
    /// [`from_config`](Self::from_config), and for `--auth-jwks-url` the
    /// first fetch of the key set (start-up fails without one) and the task
    /// that keeps it fresh (it ends when the gate is dropped).
    pub async fn start(
        config: &AuthConfig,
        jwks_failures: Counter,
        counters: jwks::remote::Counters,
    ) -> Result<Self, SetupError> {
        let Some(url) = &config.auth_jwks_url else {
            return Self::from_config(config, jwks_failures);
        };
        let interval = std::time::Duration::from_secs(config.auth_jwks_refresh_secs);
        let source = jwks::remote::JwksUrl::start(url, interval, counters)
            .await
            .map_err(|why| SetupError::JwksUrl {
                url: url.clone(),
                why,
            })?;
        Ok(Self::Jwks(Box::new(JwksVerifier::new(
            KeySource::Url(source),
            TokenRules::from_config(config),
        ))))
    }

    /// Before [`admit`](Self::admit): when the key set comes from a URL and
    /// lacks the token's `kid`, asks for the set again and waits for it, at
    /// most [`jwks::remote::JOIN_WAIT`] (once per
    /// [`jwks::remote::REFETCH_GAP`]; otherwise at once). Every other gate
    /// returns at once.
    pub async fn await_key(&self, token: &str) {
        if let Self::Jwks(verifier) = self
            && let KeySource::Url(url) = verifier.source()
            && let Some(kid) = header_field(token, "kid")
        {
            url.await_kid(&kid).await;
        }
    }

    /// The gate the config asks for, reading its secret or key file once
    /// (a key set file, again when it changes: `jwks_failures` counts the
    /// versions that could not be read).
    pub fn from_config(config: &AuthConfig, jwks_failures: Counter) -> Result<Self, SetupError> {
        let rules = TokenRules::from_config(config);
        if let Some(url) = &config.auth_jwks_url {
            // Never an open gate for a configured URL.
            return Err(SetupError::JwksUrl {
                url: url.clone(),
                why: "a key set URL is fetched by Gate::start".into(),
            });
        }
        if let Some(path) = &config.auth_jwks_file {
            let file =
                jwks::JwksFile::open(path, jwks_failures).map_err(|why| SetupError::Jwks {
                    path: path.to_owned(),
                    why,
                })?;
            return Ok(Self::Jwks(Box::new(JwksVerifier::new(
                KeySource::File(file),
                rules,
            ))));
        }
        if let Some(path) = &config.auth_hs256_secret_file {
            let secret = read_secret(path, SECRET_FLAG)?;
            return Ok(Self::Tokens(Box::new(Verifier::with_rules(
                DecodingKey::from_secret(&secret),
                Algorithm::HS256,
                &rules,
            ))));
        }
        if let Some(path) = &config.auth_public_key_file {
            let (key, alg) = read_public_key(path)?;
            return Ok(Self::Tokens(Box::new(Verifier::with_rules(
                key, alg, &rules,
            ))));
        }
        if !config.auth_audience.is_empty() {
            return Err(SetupError::NoKey {
                flag: "--auth-audience",
            });
        }
        if !config.auth_issuer.is_empty() {
            return Err(SetupError::NoKey {
                flag: "--auth-issuer",
            });
        }
        Ok(Self::Open)
    }

    /// Admits a Join to `room` with `token` (ignored when open).
    pub fn admit(&self, token: &str, room: &str) -> Result<Admission, Refusal> {
        match self {
            Self::Open => Ok(Admission::default()),
            Self::Tokens(verifier) => verifier.admit(token, room),
            Self::Jwks(verifier) => verifier.admit(token, room),
        }
    }
}

/// Signs `claims` with an HS256 `secret` (for `amble token` and tests).
pub fn mint_hs256(secret: &[u8], claims: &Claims) -> Result<String, jsonwebtoken::errors::Error> {
    jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        claims,
        &EncodingKey::from_secret(secret),
    )
}

/// Seconds since the Unix epoch, as `exp` counts them.
pub fn unix_now() -> u64 {
    jsonwebtoken::get_current_timestamp()
}

pub mod jwks;
pub use jwks::{JwksVerifier, KeySource};
pub mod refresh;

#[cfg(test)]
mod tests;
