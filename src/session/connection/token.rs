//! The member's token after its Join: the notice before it expires, the
//! end of the session when it does, and a `RefreshToken` that moves both.

use std::time::Duration;

use tokio::time::Instant;
use tracing::debug;

use super::{Connection, End, JOIN_BURST, JOIN_INTERVAL};
use crate::access::auth::refresh::{Expiry, expires_at_ms};
use crate::access::throttle::{Budget, Verdict};
use crate::protocol::pb::server_message::Body;
use crate::protocol::{ErrorCode, encode_server, pb};

/// The member's token: when it runs out, and the one instant the loop's
/// token timer waits for (the notice, then the end).
pub(super) struct TokenClock {
    expiry: Expiry,
    /// Whether `TokenExpiring` was sent for this expiry.
    noticed: bool,
    /// `expiry.notice_at_ms`, then `expiry.ends_at_ms`, as an instant.
    pub(super) due: Instant,
}

impl Connection {
    /// The token clock of a token expiring at `expires_at_ms` (as the
    /// wire says it): its notice first.
    pub(super) fn token_clock(&self, expires_at_ms: u64) -> TokenClock {
        let auth = &self.shared.config.auth;
        let lead = Duration::from_secs(auth.auth_expiry_notice_secs);
        let expiry = Expiry::new(expires_at_ms, auth.auth_leeway_secs, lead);
        TokenClock {
            expiry,
            noticed: false,
            due: self.shared.clock.instant_at(expiry.notice_at_ms),
        }
    }

    /// The token timer fired: `TokenExpiring` the first time, the end of
    /// the session the second (no refresh came in between).
    pub(super) async fn on_token_due(&mut self) -> Result<(), End> {
        let Some(clock) = &mut self.token else {
            return Ok(());
        };
        if clock.noticed {
            debug!("token expired without a refresh");
            return Err(End::TokenExpired);
        }
        clock.noticed = true;
        clock.due = self.shared.clock.instant_at(clock.expiry.ends_at_ms);
        let expires_at_ms = clock.expiry.expires_at_ms;
        debug!(expires_at_ms, "token expiring");
        let notice = encode_server(Body::TokenExpiring(pb::TokenExpiring { expires_at_ms }));
        self.send_frame(notice).await
    }

    /// A `RefreshToken`: a member's, within the refresh budget, verified as
    /// a Join's token with the member's `sub` and room. Accepted, the
    /// session ends at the new token's expiry; refused, nothing changes.
    pub(super) async fn refresh(&mut self, token: String, now: Instant) -> Result<(), End> {
        let Some(m) = &self.membership else {
            return self
                .refuse(ErrorCode::NotJoined, "RefreshToken before Join")
                .await;
        };
        let room = m.room().to_owned();
        let flood_factor = self.shared.config.session.flood_factor;
        let budget = self
            .refreshes
            .get_or_insert_with(|| Box::new(Budget::new(JOIN_INTERVAL, JOIN_BURST, flood_factor)));
        match budget.arrive(now) {
            Verdict::Apply => {}
            Verdict::Defer(at) => {
                let wait = at.saturating_duration_since(now).as_millis();
                let text = format!("refreshing too often: try again in {wait} ms");
                return self.refuse(ErrorCode::RateLimited, text).await;
            }
            Verdict::Flood => return self.flood("token refreshes").await,
        }
        // As at a Join: a key the fetched set lacks may wait (bounded) for it.
        self.shared.gate.await_key(&token).await;
        let metrics = &self.shared.metrics;
        match self
            .shared
            .gate
            .refresh(&token, self.user.as_deref(), &room)
        {
            Ok(exp) => {
                metrics.auth_refreshed.inc();
                let expires_at_ms = exp.map_or(0, expires_at_ms);
                self.token = exp.map(|_| Box::new(self.token_clock(expires_at_ms)));
                debug!(expires_at_ms, "token refreshed");
                let reply =
                    encode_server(Body::TokenRefreshed(pb::TokenRefreshed { expires_at_ms }));
                self.send_frame(reply).await
            }
            Err(refusal) => {
                metrics.auth_refresh_refuse(refusal.reason());
                debug!(reason = refusal.reason(), "token refresh refused");
                self.refuse(refusal.code(), refusal.to_string()).await
            }
        }
    }
}
