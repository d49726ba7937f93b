//! A Join: its token checked and its claims settled against what the Join
//! asked for (name, start, data), its budgets, then the room.

use std::sync::Arc;

use tokio::time::Instant;
use tracing::debug;

use super::{Connection, End, Refused};
use crate::access::auth::data_claim;
use crate::access::auth::refresh::expires_at_ms;
use crate::access::sanctions::banned_text;
use crate::access::throttle::Verdict;
use crate::protocol::{
    Data, DecodeError, ErrorCode, LeaveReason, Position, check_position, validate_name,
};
use crate::room::resume::ResumeToken;
use crate::room::sink::Removal;
use crate::room::{Arrival, JoinError};

/// What a Join asks for: the token's claims may override each.
pub(super) struct Asked {
    pub(super) name: String,
    pub(super) start: Option<Position>,
    pub(super) data: Data,
    /// The Join's resume token (empty: a fresh join).
    pub(super) resume_token: String,
}

impl Connection {
    /// Checks a Join's token (when the server requires one) and settles the
    /// name, the start and the data: the token's `name`, `start` and `data`
    /// claims, else what the Join asked for (a `data` claim wins key by
    /// key). Counts every refusal by reason.
    fn admit(&self, room: &str, asked: Asked, token: &str) -> Result<Arrival, Refused> {
        let Asked {
            name: asked,
            start: asked_start,
            data: asked_data,
            resume_token,
        } = asked;
        let metrics = &self.shared.metrics;
        let mut admission = self.shared.gate.admit(token, room).map_err(|refusal| {
            metrics.auth_refuse(refusal.reason());
            debug!(reason = refusal.reason(), "token refused");
            (refusal.code(), refusal.to_string())
        })?;
        if admission.user.is_some() {
            metrics.auth_admitted.inc();
        }
        let name = match admission.name {
            Some(claimed) => validate_name(claimed, &self.shared.rules)
                .map_err(|err| (err.code(), format!("the token's name claim: {err}")))?,
            None if asked.is_empty() => {
                return Err((
                    ErrorCode::InvalidName,
                    "no name: the Join has none and the token no name claim".into(),
                ));
            }
            None => asked,
        };
        let start = match admission.start {
            Some(claimed) => {
                let p = Position {
                    x: claimed.x,
                    y: claimed.y,
                };
                let p = check_position(p, &self.shared.rules)
                    .and_then(|p| self.within_room(room, p))
                    .map_err(|err| (err.code(), format!("the token's start claim: {err}")))?;
                Some(p)
            }
            None => asked_start
                .map(|p| self.within_room(room, p))
                .transpose()
                .map_err(|err| (err.code(), err.to_string()))?,
        };
        let rules = &self.shared.rules;
        let claimed = match admission.data {
            Some(claim) => data_claim(claim, rules).map_err(|why| {
                (
                    ErrorCode::InvalidData,
                    format!("the token's data claim: {why}"),
                )
            })?,
            None => Data::default(),
        };
        let data = Data::with_claims(asked_data, &claimed, rules).map_err(|err| {
            (
                ErrorCode::InvalidData,
                format!("invalid data: the Join's data and the token's data claim together: {err}"),
            )
        })?;
        let token_expires_at_ms = admission.expires_at.take().map_or(0, expires_at_ms);
        // A token that cannot be one joins afresh, like an unknown one.
        let resume = match resume_token.as_str() {
            "" => None,
            text => ResumeToken::parse(text)
                .inspect_err(|refusal| metrics.resume_refuse(refusal.reason()))
                .ok(),
        };
        Ok(Arrival {
            resume,
            token_expires_at_ms,
            name,
            share_user: admission.share_sub && admission.user.is_some(),
            user: admission.user,
            start,
            data,
            claimed,
        })
    }

    /// `p` if it lies within `room`'s world (each room has its own; the
    /// decoder checked only the largest).
    fn within_room(&self, room: &str, p: Position) -> Result<Position, DecodeError> {
        let world = self.shared.rooms.world_of(room);
        if p.x > world.x || p.y > world.y {
            return Err(DecodeError::InvalidPosition {
                width: world.x,
                height: world.y,
            });
        }
        Ok(p)
    }

    /// The ban on `user` in force now, if any.
    fn ban_of(&self, user: &str) -> Option<(u64, Arc<str>)> {
        self.shared
            .sanctions
            .banned(user, self.shared.clock.now_ms())
    }

    /// A Join's refusal when its user is banned.
    fn banned(&self, user: Option<&str>) -> Option<Refused> {
        let (until_ms, reason) = self.ban_of(user?)?;
        let left_ms = until_ms.saturating_sub(self.shared.clock.now_ms());
        Some((ErrorCode::Banned, banned_text(left_ms, &reason)))
    }

    /// A Join: one at a time, within the connection's and the address's
    /// join budgets, with a token when the server asks for one.
    pub(super) async fn join(
        &mut self,
        room: String,
        asked: Asked,
        token: String,
        now: Instant,
    ) -> Result<(), End> {
        if let Some(m) = &self.membership {
            let text = format!(
                "already in room {} as member {}: send Leave first",
                m.room(),
                m.id().0
            );
            return self.refuse(ErrorCode::AlreadyJoined, text).await;
        }
        match self.joins.arrive(now) {
            Verdict::Apply => {}
            Verdict::Defer(at) => {
                let wait = at.saturating_duration_since(now).as_millis();
                let text = format!("joining too often: try again in {wait} ms");
                return self.refuse(ErrorCode::RateLimited, text).await;
            }
            Verdict::Flood => return self.flood("joins").await,
        }
        // A token naming a key the set lacks may wait (bounded) for the set
        // to be fetched again: a provider's rotation.
        self.shared.gate.await_key(&token).await;
        let arrival = match self.admit(&room, asked, &token) {
            Ok(admitted) => admitted,
            Err((code, text)) => return self.refuse(code, text).await,
        };
        let expires_at = (arrival.token_expires_at_ms > 0).then_some(arrival.token_expires_at_ms);
        let user = arrival.user.clone();
        if let Some((code, text)) = self.banned(user.as_deref()) {
            return self.refuse(code, text).await;
        }
        if let Err(at) = self.shared.addresses.admit_join(&self.client, now) {
            let wait = at.saturating_duration_since(now).as_millis();
            let text = format!("too many joins from your address: try again in {wait} ms");
            return self.refuse(ErrorCode::RateLimited, text).await;
        }
        let sink = Arc::clone(&self.outbox);
        match self.shared.rooms.arrive(&room, arrival, sink).await {
            Ok(m) => {
                tracing::Span::current()
                    .record("room", room.as_str())
                    .record("member", m.id().0);
                debug!(resumed = m.resumed(), "joined");
                // A ban that landed while this member arrived: its sweep
                // may have missed the member, so it leaves now.
                if let Some((until_ms, reason)) = user.as_deref().and_then(|u| self.ban_of(u)) {
                    m.leave(LeaveReason::Kicked).await;
                    return Err(End::Removed(Removal::Banned { until_ms, reason }));
                }
                self.membership = Some(m);
                self.token = expires_at.map(|exp| Box::new(self.token_clock(exp)));
                self.user = user;
                Ok(())
            }
            Err(err @ JoinError::RoomFull { .. }) => {
                self.refuse(ErrorCode::RoomFull, err.to_string()).await
            }
            Err(JoinError::ShuttingDown) => Err(End::Shutdown),
        }
    }
}
