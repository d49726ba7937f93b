//! A bearer token read from a file: the one that guards `GET /metrics`
//! (`--metrics-token-file`) and the server API's key (`--api-key-file`).
//!
//! The token is read once at start. A request must carry
//! `Authorization: Bearer <token>`; the comparison takes the same time
//! whichever byte differs (`subtle`), so the token cannot be guessed byte
//! by byte from response times.

use std::path::Path;

use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq as _;

/// Shortest token accepted: anything shorter is guessable.
const MIN_TOKEN_BYTES: usize = 16;

/// The secret a caller must present.
pub struct BearerToken(Box<[u8]>);

impl std::fmt::Debug for BearerToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BearerToken(..)")
    }
}

/// Why the token file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TokenFileError {
    /// The file cannot be read.
    #[error("cannot read {flag} {path}")]
    Read {
        flag: &'static str,
        path: String,
        source: std::io::Error,
    },
    /// Too short, or has characters a header cannot carry.
    #[error(
        "{flag} {path}: the token must be at least {MIN_TOKEN_BYTES} \
         visible ASCII characters with no spaces (for example `openssl rand -hex 32`)"
    )]
    Unusable { flag: &'static str, path: String },
}

/// Why a request for `/metrics` was refused: the label of
/// `amble_metrics_refused_total{reason="..."}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Denied {
    /// No `Authorization: Bearer` header.
    Missing,
    /// A bearer token that is not the one configured (or a header that is
    /// repeated or not a bearer token).
    Wrong,
}

impl Denied {
    pub fn label(self) -> &'static str {
        match self {
            Self::Missing => "missing_token",
            Self::Wrong => "wrong_token",
        }
    }
}

impl IntoResponse for Denied {
    /// 401 with `WWW-Authenticate: Bearer` (RFC 6750 section 3).
    fn into_response(self) -> Response {
        let (challenge, text) = match self {
            Self::Missing => (
                r#"Bearer realm="amble metrics""#,
                "/metrics needs Authorization: Bearer <token>\n",
            ),
            Self::Wrong => (
                r#"Bearer realm="amble metrics", error="invalid_token""#,
                "the bearer token for /metrics is wrong\n",
            ),
        };
        (
            StatusCode::UNAUTHORIZED,
            [(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static(challenge),
            )],
            text,
        )
            .into_response()
    }
}

impl BearerToken {
    /// Reads the token from `path` (given by `flag`): the file's content
    /// without surrounding white space (so a trailing newline does not
    /// count).
    pub fn read(path: &Path, flag: &'static str) -> Result<Self, TokenFileError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| TokenFileError::Read {
            flag,
            path: shown.clone(),
            source,
        })?;
        Self::parse(&text).ok_or(TokenFileError::Unusable { flag, path: shown })
    }

    fn parse(text: &str) -> Option<Self> {
        let token = text.trim();
        (token.len() >= MIN_TOKEN_BYTES && token.bytes().all(|b| b.is_ascii_graphic()))
            .then(|| Self(token.as_bytes().into()))
    }

    /// Whether `headers` carry this token as `Authorization: Bearer`.
    pub fn admits(&self, headers: &HeaderMap) -> Result<(), Denied> {
        let mut values = headers.get_all(header::AUTHORIZATION).iter();
        let Some(value) = values.next() else {
            return Err(Denied::Missing);
        };
        if values.next().is_some() {
            return Err(Denied::Wrong);
        }
        let presented = value
            .as_bytes()
            .split_at_checked(7)
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case(b"bearer "))
            .map(|(_, token)| token.trim_ascii())
            .ok_or(Denied::Wrong)?;
        // Constant time in the content; a length mismatch answers at once,
        // which tells an attacker only the length.
        if bool::from(presented.ct_eq(&self.0)) {
            Ok(())
        } else {
            Err(Denied::Wrong)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "0123456789abcdef0123456789abcdef";

    fn with(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.append(
            header::AUTHORIZATION,
            HeaderValue::from_str(value).expect("value"),
        );
        headers
    }

    fn token() -> BearerToken {
        BearerToken::parse(&format!("  {SECRET}\n")).expect("usable")
    }

    #[test]
    fn the_right_bearer_token_is_admitted() {
        let t = token();
        assert_eq!(t.admits(&with(&format!("Bearer {SECRET}"))), Ok(()));
        assert_eq!(t.admits(&with(&format!("bearer  {SECRET} "))), Ok(()));
    }

    #[test]
    fn anything_else_is_refused() {
        let t = token();
        assert_eq!(t.admits(&HeaderMap::new()), Err(Denied::Missing));
        for value in [
            "Bearer",
            "Bearer ",
            "Bearer 0123456789abcdef0123456789abcdeF",
            "Bearer 0123456789abcdef0123456789abcde",
            "Bearer 0123456789abcdef0123456789abcdef0",
            &format!("Basic {SECRET}"),
            SECRET,
        ] {
            assert_eq!(t.admits(&with(value)), Err(Denied::Wrong), "{value}");
        }
        let mut twice = with(&format!("Bearer {SECRET}"));
        twice.append(
            header::AUTHORIZATION,
            HeaderValue::from_str(&format!("Bearer {SECRET}")).expect("value"),
        );
        assert_eq!(t.admits(&twice), Err(Denied::Wrong));
    }

    #[test]
    fn weak_or_unsendable_tokens_are_refused_at_start() {
        for text in [
            "",
            "\n",
            "short",
            "has a space in the middle of it",
            "é".repeat(16).as_str(),
        ] {
            assert!(BearerToken::parse(text).is_none(), "{text:?}");
        }
        let missing = BearerToken::read(
            Path::new("/nonexistent/amble-token"),
            "--metrics-token-file",
        )
        .expect_err("no such file");
        assert!(
            missing.to_string().contains("/nonexistent/amble-token"),
            "{missing}"
        );
    }

    #[test]
    fn denials_challenge_with_bearer() {
        for denied in [Denied::Missing, Denied::Wrong] {
            let response = denied.into_response();
            assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
            let challenge = response.headers()[header::WWW_AUTHENTICATE]
                .to_str()
                .expect("ascii");
            assert!(challenge.starts_with("Bearer "), "{challenge}");
        }
    }
}
