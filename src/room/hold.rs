//! A member's place held after its connection dropped, and taken back by a
//! resume (the table itself, pure, is [`resume`](super::resume)).
//!
//! [`Membership::hold`] is how a connection that ended without a `Leave`
//! lets go: the member stays in the room's state (the others keep seeing
//! it where it stood), its sink goes, and one timer task per held place
//! ends it after the grace with the `Left` it would have had at once. A
//! Join whose resume token names the place takes it back under the room
//! lock ([`Rooms::resume_locked`]): same id, the same seat to other nodes
//! with the next lease (`next_lease`), a fresh `Welcome`; nothing is published, locally or to other nodes. A
//! connection still open on the place (its client gave up on it first) is
//! told through its sink ([`Sink::superseded`]) and closes quietly.

use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};

use crate::protocol::{Data, LeaveReason, MemberId};
use crate::room::resume::{Refusal, ResumeToken};
use crate::room::sink::Sink;
use crate::room::{Membership, Room, Rooms, State, fan_out, next_lease, remote};

/// A Join taking back a held place (or a place whose connection is still
/// open): what it brings.
pub(super) struct Taker {
    /// The token it presented (spent by the resume).
    pub(super) token: ResumeToken,
    /// Whose place the token names.
    pub(super) id: MemberId,
    /// The new token's `data` claim (SetData cannot change these keys).
    pub(super) claimed: Data,
    pub(super) token_expires_at_ms: u64,
}

impl Rooms {
    /// Whether `token` names a place of this room that `user` may take:
    /// its member's, for the same app user (or none on both sides).
    pub(super) fn resumable(
        &self,
        st: &State,
        token: &ResumeToken,
        user: Option<&Arc<str>>,
    ) -> Result<MemberId, Refusal> {
        let id = st.places.owner(token).ok_or(Refusal::Unknown)?;
        let member = st.members.get(&id).ok_or(Refusal::Unknown)?;
        if member.user.as_deref() != user.map(|u| &**u) {
            return Err(Refusal::OtherUser);
        }
        Ok(id)
    }

    /// Gives member `taker.id` a fresh token, if the server holds places;
    /// returns it for the `Welcome`.
    pub(super) fn issue_token(&self, st: &mut State, id: MemberId) -> Option<ResumeToken> {
        if self.settings.resume_grace.is_zero() {
            return None;
        }
        let token = ResumeToken::random()?;
        st.places.issue(id, token);
        Some(token)
    }

    /// One held place fewer on this node.
    pub(super) fn unheld(&self) {
        self.held.fetch_sub(1, Ordering::Relaxed);
        self.metrics.resume_held.dec();
    }

    /// Gives the place `taker` names to `sink`'s connection: the token is
    /// spent, a hold ends, an open connection on the place is superseded,
    /// and `sink` gets a `Welcome` (`resumed`) with the room as it is. The
    /// others are told nothing: for them the member never left.
    pub(super) fn resume_locked(
        self: &Arc<Self>,
        handle: &Arc<Room>,
        mut st: MutexGuard<'_, State>,
        taker: Taker,
        sink: Arc<dyn Sink>,
    ) -> Membership {
        let Taker {
            token,
            id,
            claimed,
            token_expires_at_ms,
        } = taker;
        if let Some((_, Some(_))) = st.places.claim(&token) {
            self.unheld();
        }
        let seat = match st.members.get_mut(&id) {
            Some(member) => {
                member.seat = next_lease(member.seat);
                member.seat
            }
            // Cannot happen: `resumable` found it under this same lock,
            // held since.
            None => unreachable!("a resumable member is in the room"),
        };
        // Cluster mode: moves cut for a tick not yet written go to the
        // members here now, not again to the resumer, whose snapshot shows
        // them (as for a join).
        let early_batch = self.batch_before_join(&mut st);
        let next = self.issue_token(&mut st, id);
        // The other nodes learn the new token's hash: the next reconnect
        // may reach one of them.
        if let (Some(cluster), Some(next)) = (self.cluster.get(), next) {
            remote::published_resume_hash(cluster, &mut st, id, next.hash());
        }
        let welcome = self.welcome(&st, handle.name(), id, token_expires_at_ms, next, true);
        let mut out = handle.out();
        drop(st);
        if let Some(batch) = early_batch {
            out.publish(&batch, &self.metrics);
        }
        let old = out
            .sinks
            .iter()
            .position(|(m, _)| *m == id)
            .map(|at| out.sinks.remove(at).1);
        self.metrics.sent_to(1, welcome.len());
        sink.send_snapshot(welcome);
        out.sinks.push((id, sink));
        drop(out);
        if let Some(old) = old {
            old.superseded();
        }
        self.metrics.resumed("same_node");
        Membership {
            rooms: Arc::clone(self),
            room: Arc::clone(handle),
            id,
            seat,
            claimed,
            left: false,
            resumed: true,
        }
    }

    /// Holds member `id`'s place (the connection in `seat` ended without a
    /// Leave) for the grace, or removes it at once with
    /// `reason` when places are not held, the member has no token, the
    /// server is shutting down, or the node holds its cap of places.
    fn hold_or_remove(&self, room: &Arc<Room>, id: MemberId, seat: u64, reason: LeaveReason) {
        let grace = self.settings.resume_grace;
        let held = !grace.is_zero() && !self.shutting_down.load(Ordering::Relaxed) && {
            let mut st = room.state();
            match st.members.get_mut(&id) {
                // Not ours any more: nothing to hold or remove.
                Some(m) if m.seat != seat => return,
                None => return,
                Some(m) => m.pending = None,
            }
            let room_has_token = st.places.has_token(id);
            if room_has_token && self.take_held_slot() {
                let until_ms = self.clock.now_ms().saturating_add(millis(grace));
                st.places.hold(id, until_ms, reason);
                let mut out = room.out();
                drop(st);
                out.sinks.retain(|(m, _)| *m != id);
                true
            } else {
                if room_has_token {
                    self.metrics.resume_hold_refused.inc();
                }
                false
            }
        };
        if !held {
            self.remove(room, id, seat, reason);
            return;
        }
        // From now, not from when the task first runs.
        let deadline = tokio::time::Instant::now() + grace;
        let (rooms, room) = (self.this.clone(), Arc::clone(room));
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(async move {
                    tokio::time::sleep_until(deadline).await;
                    if let Some(rooms) = rooms.upgrade() {
                        fan_out(|| rooms.expire(&room, id, seat)).await;
                    }
                });
            }
            // No runtime to wait on (cannot happen in the server): the
            // place goes at once.
            Err(_) => self.expire_now(&room, id, seat),
        }
    }

    /// One more held place on this node, if under the cap.
    fn take_held_slot(&self) -> bool {
        let max = self.settings.max_held;
        let taken = self
            .held
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < max).then_some(n + 1)
            })
            .is_ok();
        if taken {
            self.metrics.resume_held.inc();
        }
        taken
    }

    /// The grace of `id`'s held place (in `seat`) ran out: it leaves, with
    /// the reason its connection ended with. Nothing if it was resumed, or
    /// held again since (a later deadline).
    fn expire(&self, room: &Arc<Room>, id: MemberId, seat: u64) {
        self.expire_if(room, id, seat, |places| {
            places.expired(id, self.clock.now_ms())
        });
    }

    /// `id`'s held place goes now, whatever its deadline.
    fn expire_now(&self, room: &Arc<Room>, id: MemberId, seat: u64) {
        self.expire_if(room, id, seat, |places| places.held(id));
    }

    /// Removes `id` (in `seat`) if `due` finds its place held and over. A
    /// resume between the two locks moved the seat to its next lease, so
    /// the removal misses it.
    fn expire_if(
        &self,
        room: &Arc<Room>,
        id: MemberId,
        seat: u64,
        due: impl FnOnce(&crate::room::resume::Places) -> Option<crate::room::resume::Held>,
    ) {
        let reason = {
            let st = room.state();
            if st.members.get(&id).is_none_or(|m| m.seat != seat) {
                return;
            }
            match due(&st.places) {
                Some(held) => held.reason,
                None => return,
            }
        };
        self.metrics.resume_expired.inc();
        self.remove(room, id, seat, reason);
    }
}

fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Membership {
    /// The connection ended without a Leave (it dropped, went idle or
    /// stopped reading): the member's place is held for the resume grace,
    /// unseen by the others, then it leaves with `reason`. Without a grace
    /// (or past the node's cap of held places) it leaves at once.
    pub async fn hold(mut self, reason: LeaveReason) {
        self.left = true;
        fan_out(|| {
            self.rooms
                .hold_or_remove(&self.room, self.id, self.seat, reason)
        })
        .await;
    }
}
