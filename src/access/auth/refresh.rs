//! A token's life after the Join: when its member is told that it
//! expires, when the session ends without a refresh, and whether a
//! `RefreshToken` may take its place.
//!
//! A refresh is checked by the same [`Gate`] as a Join's token (signature,
//! `exp`, `nbf`, `aud`, `iss`, `kid`, the room), and must carry the same
//! `sub` as the member's. Its `name`, `start` and `data` claims are not
//! read: they settled the member at its Join. Plain data: the times are
//! passed in (the wall clock is read only by `jsonwebtoken`, for `exp`).

use std::time::Duration;

use super::{Gate, Refusal};
use crate::protocol::ErrorCode;

/// How long before its token's `exp` a member gets `TokenExpiring`, seconds
/// (at once when less is left), unless `--auth-expiry-notice-secs` says
/// otherwise.
pub const NOTICE_LEAD_SECS: u64 = 60;

/// The latest expiry sent on the wire, ms: 2^53 − 1, the largest integer
/// a JavaScript Number holds exactly (the SDK refuses a larger uint64).
/// Later than the year 285,000, so a session capped to it never ends.
pub const MAX_EXPIRES_AT_MS: u64 = (1 << 53) - 1;

/// A token's `exp` (seconds) as the wire's `expires_at_ms`: in ms, at most
/// [`MAX_EXPIRES_AT_MS`].
pub fn expires_at_ms(exp_secs: u64) -> u64 {
    exp_secs.saturating_mul(1000).min(MAX_EXPIRES_AT_MS)
}

/// When a session's token runs out, each in ms since the Unix epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Expiry {
    /// The token's `exp`: what `TokenExpiring` and `TokenRefreshed` carry.
    pub expires_at_ms: u64,
    /// When the member is told: `lead` before `exp` (in the past, hence at
    /// once, when less is left).
    pub notice_at_ms: u64,
    /// When the session ends without a refresh: `exp` plus the leeway, as
    /// long as a Join would still have taken the token.
    pub ends_at_ms: u64,
}

impl Expiry {
    /// The expiry of a token that expires at `expires_at_ms` (its `exp`
    /// through [`expires_at_ms`]), with the server's leeway and the
    /// notice's lead.
    pub fn new(expires_at_ms: u64, leeway_secs: u64, lead: Duration) -> Self {
        let lead_ms = u64::try_from(lead.as_millis()).unwrap_or(u64::MAX);
        Self {
            expires_at_ms,
            notice_at_ms: expires_at_ms.saturating_sub(lead_ms),
            ends_at_ms: expires_at_ms.saturating_add(leeway_secs.saturating_mul(1000)),
        }
    }
}

/// Why a `RefreshToken` was refused. The session keeps its old expiry.
/// Counted under its [`reason`](RefreshRefusal::reason) in
/// `amble_auth_refresh_refused_total`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RefreshRefusal {
    /// The token itself, as a Join's would be refused (its room included:
    /// the member's current room).
    #[error("token refresh refused: {}", token_text(.0))]
    Token(Refusal),
    /// A valid token for another user (`sub`) than the member's.
    #[error(
        "token refresh refused: the token is for another user (sub) than this member's; \
         a refresh must carry the same sub (join again to change user)"
    )]
    OtherUser,
}

/// A refusal's text for a refresh: the Join's, except for a missing token.
fn token_text(refusal: &Refusal) -> String {
    match refusal {
        Refusal::Missing => "RefreshToken.token is empty: send the fresh JWT".into(),
        other => other.to_string(),
    }
}

impl RefreshRefusal {
    /// The protocol error code sent back: FORBIDDEN for another user or a
    /// room the token does not allow, UNAUTHENTICATED otherwise.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::Token(refusal) => refusal.code(),
            Self::OtherUser => ErrorCode::Forbidden,
        }
    }

    /// The `reason` label in `/metrics`: a Join refusal's, or `other_user`.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Token(refusal) => refusal.reason(),
            Self::OtherUser => "other_user",
        }
    }
}

impl Gate {
    /// Checks a `RefreshToken` of the member `user` (its token's `sub`) in
    /// `room`: the new token's `exp` in seconds, or `None` on an open
    /// server, which reads no token and accepts any refresh.
    pub fn refresh(
        &self,
        token: &str,
        user: Option<&str>,
        room: &str,
    ) -> Result<Option<u64>, RefreshRefusal> {
        if matches!(self, Self::Open) {
            return Ok(None);
        }
        let admission = self.admit(token, room).map_err(RefreshRefusal::Token)?;
        if admission.user.as_deref() != user || user.is_none() {
            return Err(RefreshRefusal::OtherUser);
        }
        Ok(admission.expires_at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::auth::{Claims, Verifier, mint_hs256, unix_now};
    use jsonwebtoken::{Algorithm, DecodingKey};

    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef-refresh-test";

    fn gate() -> Gate {
        Gate::Tokens(Box::new(Verifier::new(
            DecodingKey::from_secret(SECRET),
            Algorithm::HS256,
        )))
    }

    fn token(sub: &str, exp: u64, rooms: Option<&[&str]>) -> String {
        let claims = Claims {
            sub: sub.into(),
            exp,
            name: None,
            rooms: rooms.map(|r| r.iter().map(|s| s.to_string()).collect()),
            start: None,
            data: None,
            share_sub: false,
        };
        mint_hs256(SECRET, &claims).expect("mint")
    }

    #[test]
    fn the_notice_comes_a_lead_before_exp_and_the_end_a_leeway_after() {
        let lead = Duration::from_secs(60);
        assert_eq!(
            Expiry::new(1_000_000, 30, lead),
            Expiry {
                expires_at_ms: 1_000_000,
                notice_at_ms: 940_000,
                ends_at_ms: 1_030_000,
            }
        );
        // Less left than the lead: a notice time long past, so at once.
        assert_eq!(Expiry::new(10_000, 0, lead).notice_at_ms, 0);
        assert_eq!(Expiry::new(10_000, 0, lead).ends_at_ms, 10_000);
        // Capped where JavaScript still counts exactly; no overflow.
        assert_eq!(expires_at_ms(1_764_600_600), 1_764_600_600_000);
        assert_eq!(
            expires_at_ms(MAX_EXPIRES_AT_MS / 1000),
            9_007_199_254_740_000
        );
        assert_eq!(
            expires_at_ms(MAX_EXPIRES_AT_MS / 1000 + 1),
            MAX_EXPIRES_AT_MS
        );
        let far = Expiry::new(expires_at_ms(u64::MAX), 600, lead);
        assert_eq!(far.expires_at_ms, MAX_EXPIRES_AT_MS);
        assert_eq!(far.ends_at_ms, MAX_EXPIRES_AT_MS + 600_000);
        assert_eq!(Expiry::new(u64::MAX, 600, lead).ends_at_ms, u64::MAX);
    }

    #[test]
    fn a_refresh_of_the_same_user_is_accepted_with_its_exp() {
        let exp = unix_now() + 900;
        let t = token("u-1", exp, None);
        assert_eq!(gate().refresh(&t, Some("u-1"), "lobby"), Ok(Some(exp)));
    }

    #[test]
    fn another_user_is_forbidden_and_says_so() {
        let t = token("u-2", unix_now() + 900, None);
        let refused = gate().refresh(&t, Some("u-1"), "lobby").unwrap_err();
        assert_eq!(refused, RefreshRefusal::OtherUser);
        assert_eq!(refused.code(), ErrorCode::Forbidden);
        assert_eq!(refused.reason(), "other_user");
        assert!(refused.to_string().contains("same sub"), "{refused}");
        // A member without a user (it cannot be, under keys) takes none.
        let t = token("u-1", unix_now() + 900, None);
        assert_eq!(
            gate().refresh(&t, None, "lobby"),
            Err(RefreshRefusal::OtherUser)
        );
    }

    #[test]
    fn a_token_that_does_not_allow_the_room_is_forbidden() {
        let t = token("u-1", unix_now() + 900, Some(&["team-*"]));
        let refused = gate().refresh(&t, Some("u-1"), "lobby").unwrap_err();
        assert_eq!(refused.code(), ErrorCode::Forbidden);
        assert_eq!(refused.reason(), "forbidden");
        assert_eq!(
            gate()
                .refresh(&t, Some("u-1"), "team-a")
                .map(|e| e.is_some()),
            Ok(true)
        );
    }

    #[test]
    fn bad_tokens_are_unauthenticated_with_the_joins_reasons() {
        let other = mint_hs256(
            b"another secret of at least thirty-two bytes",
            &Claims {
                sub: "u-1".into(),
                exp: unix_now() + 900,
                name: None,
                rooms: None,
                start: None,
                data: None,
                share_sub: false,
            },
        )
        .expect("mint");
        let expired = token("u-1", unix_now() - 3_600, None);
        for (t, reason) in [
            ("", "missing"),
            ("junk", "malformed"),
            (other.as_str(), "bad_signature"),
            (expired.as_str(), "expired"),
        ] {
            let refused = gate().refresh(t, Some("u-1"), "lobby").unwrap_err();
            assert_eq!(refused.code(), ErrorCode::Unauthenticated, "{reason}");
            assert_eq!(refused.reason(), reason);
            assert!(refused.to_string().starts_with("token refresh refused: "));
        }
        let missing = gate().refresh("", Some("u-1"), "lobby").unwrap_err();
        assert!(missing.to_string().contains("RefreshToken.token is empty"));
    }

    #[test]
    fn an_open_server_accepts_any_refresh_as_no_expiry() {
        assert_eq!(Gate::Open.refresh("", None, "lobby"), Ok(None));
        assert_eq!(Gate::Open.refresh("junk", Some("u"), "lobby"), Ok(None));
    }
}
