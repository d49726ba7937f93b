//! Bans and mutes of an app's users (the server API's), by token `sub`.
//!
//! [`Sanctions`] answers "may this user join?" and "may this user chat?"
//! for the time the caller passes in (ms since the Unix epoch), so every
//! rule is tested at exact instants. A ban or mute that ends is forgotten
//! at the next look; the store is bounded ([`MAX_SANCTIONED`]), and a new
//! sanction past the bound is refused, never another one silently lost.
//!
//! In a cluster every node holds every sanction: the server API tells all
//! nodes, and a node that starts asks its peers for theirs ([`Sanctions::merge`]),
//! so a ban outlives the restart of any one node. Users without a `sub`
//! (servers without tokens) cannot be banned, only kicked.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// The most users under a ban or a mute at once.
pub const MAX_SANCTIONED: usize = 100_000;
/// The longest reason kept, in characters.
pub const MAX_REASON_CHARS: usize = 200;

/// One user's ban and mute, each until an instant (ms since the epoch).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Sanction {
    /// Banned until then (0: not banned).
    pub ban_until_ms: u64,
    pub ban_reason: Arc<str>,
    /// Muted until then (0: not muted).
    pub mute_until_ms: u64,
}

impl Sanction {
    fn in_force(&self, now_ms: u64) -> bool {
        self.ban_until_ms > now_ms || self.mute_until_ms > now_ms
    }
}

/// The store was full: no new user can be sanctioned until some expire.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{MAX_SANCTIONED} users are banned or muted already")]
pub struct Full;

/// Every ban and mute in force on this node.
#[derive(Default)]
pub struct Sanctions {
    users: Mutex<HashMap<Arc<str>, Sanction>>,
}

impl Sanctions {
    fn lock(&self) -> MutexGuard<'_, HashMap<Arc<str>, Sanction>> {
        // Every critical section writes whole values.
        self.users.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Bans `user` until `until_ms` (a later ban replaces an earlier one;
    /// `until_ms` at or before `now_ms` lifts it).
    pub fn ban(&self, user: &str, until_ms: u64, reason: &str, now_ms: u64) -> Result<(), Full> {
        self.update(user, now_ms, |s| {
            s.ban_until_ms = until_ms;
            s.ban_reason = clip(reason).into();
        })
    }

    /// Mutes `user` until `until_ms` (`until_ms` at or before `now_ms`
    /// lifts it).
    pub fn mute(&self, user: &str, until_ms: u64, now_ms: u64) -> Result<(), Full> {
        self.update(user, now_ms, |s| s.mute_until_ms = until_ms)
    }

    fn update(
        &self,
        user: &str,
        now_ms: u64,
        change: impl FnOnce(&mut Sanction),
    ) -> Result<(), Full> {
        let mut users = self.lock();
        if let Some(s) = users.get_mut(user) {
            change(s);
            if !s.in_force(now_ms) {
                users.remove(user);
            }
            return Ok(());
        }
        let mut s = Sanction::default();
        change(&mut s);
        if !s.in_force(now_ms) {
            return Ok(());
        }
        if users.len() >= MAX_SANCTIONED {
            users.retain(|_, s| s.in_force(now_ms));
            if users.len() >= MAX_SANCTIONED {
                return Err(Full);
            }
        }
        users.insert(user.into(), s);
        Ok(())
    }

    /// The ban on `user` in force at `now_ms`: until when, and why.
    pub fn banned(&self, user: &str, now_ms: u64) -> Option<(u64, Arc<str>)> {
        let users = self.lock();
        let s = users.get(user)?;
        (s.ban_until_ms > now_ms).then(|| (s.ban_until_ms, Arc::clone(&s.ban_reason)))
    }

    /// Until when `user` is muted at `now_ms`.
    pub fn muted(&self, user: &str, now_ms: u64) -> Option<u64> {
        let users = self.lock();
        let s = users.get(user)?;
        (s.mute_until_ms > now_ms).then_some(s.mute_until_ms)
    }

    /// `user`'s sanction in force at `now_ms` (expired parts zeroed).
    pub fn of(&self, user: &str, now_ms: u64) -> Option<Sanction> {
        let users = self.lock();
        let s = users.get(user).filter(|s| s.in_force(now_ms))?;
        Some(current(s, now_ms))
    }

    /// Every sanction in force at `now_ms`, to hand to a node that starts.
    pub fn list(&self, now_ms: u64) -> Vec<(Arc<str>, Sanction)> {
        let mut users = self.lock();
        users.retain(|_, s| s.in_force(now_ms));
        users
            .iter()
            .map(|(u, s)| (Arc::clone(u), current(s, now_ms)))
            .collect()
    }

    /// Takes sanctions learnt from a peer: for each user, the later end of
    /// each (a ban lifted on the peer meanwhile is not lifted here: lifting
    /// is told to every node when it happens). Past the bound, the rest is
    /// dropped and counted in the returned number.
    pub fn merge(
        &self,
        learnt: impl IntoIterator<Item = (Arc<str>, Sanction)>,
        now_ms: u64,
    ) -> usize {
        let mut dropped = 0;
        for (user, theirs) in learnt {
            let merged = self.update(&user, now_ms, |s| {
                if theirs.ban_until_ms > s.ban_until_ms {
                    s.ban_until_ms = theirs.ban_until_ms;
                    s.ban_reason = clip(&theirs.ban_reason).into();
                }
                s.mute_until_ms = s.mute_until_ms.max(theirs.mute_until_ms);
            });
            if merged.is_err() {
                dropped += 1;
            }
        }
        dropped
    }

    /// Users under a ban or mute at `now_ms`.
    pub fn len(&self, now_ms: u64) -> usize {
        self.lock().values().filter(|s| s.in_force(now_ms)).count()
    }
}

/// `s` with its ended parts cleared.
fn current(s: &Sanction, now_ms: u64) -> Sanction {
    let banned = s.ban_until_ms > now_ms;
    Sanction {
        ban_until_ms: if banned { s.ban_until_ms } else { 0 },
        ban_reason: if banned {
            Arc::clone(&s.ban_reason)
        } else {
            "".into()
        },
        mute_until_ms: if s.mute_until_ms > now_ms {
            s.mute_until_ms
        } else {
            0
        },
    }
}

/// At most [`MAX_REASON_CHARS`] characters of `reason`.
fn clip(reason: &str) -> &str {
    match reason.char_indices().nth(MAX_REASON_CHARS) {
        Some((at, _)) => &reason[..at],
        None => reason,
    }
}

/// The `Error{BANNED}` text for a ban with `left_ms` to run.
pub fn banned_text(left_ms: u64, reason: &str) -> String {
    let secs = left_ms.div_ceil(1000);
    if reason.is_empty() {
        format!("you are banned by the app for {secs} s more")
    } else {
        format!("you are banned by the app for {secs} s more: {reason}")
    }
}

/// The `Error{MUTED}` text for a mute with `left_ms` to run.
pub fn muted_text(left_ms: u64) -> String {
    format!(
        "you are muted by the app for {} s more: message dropped",
        left_ms.div_ceil(1000)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ban_holds_until_its_end_and_not_a_millisecond_longer() {
        let s = Sanctions::default();
        s.ban("u-1", 10_000, "spam", 1_000).expect("room");
        assert_eq!(s.banned("u-1", 9_999), Some((10_000, "spam".into())));
        assert_eq!(s.banned("u-1", 10_000), None);
        assert_eq!(s.banned("u-2", 1_000), None);
        assert_eq!(s.muted("u-1", 1_000), None, "a ban is not a mute");
        assert_eq!(s.len(9_999), 1);
        assert_eq!(s.len(10_000), 0);
    }

    #[test]
    fn a_mute_is_kept_beside_a_ban_and_each_ends_on_its_own() {
        let s = Sanctions::default();
        s.ban("u", 5_000, "", 0).expect("room");
        s.mute("u", 8_000, 0).expect("room");
        assert_eq!(
            s.of("u", 4_000),
            Some(Sanction {
                ban_until_ms: 5_000,
                ban_reason: "".into(),
                mute_until_ms: 8_000
            })
        );
        assert_eq!(
            s.of("u", 6_000),
            Some(Sanction {
                ban_until_ms: 0,
                ban_reason: "".into(),
                mute_until_ms: 8_000
            })
        );
        assert_eq!(s.of("u", 8_000), None);
    }

    #[test]
    fn an_end_in_the_past_lifts_and_stores_nothing() {
        let s = Sanctions::default();
        s.ban("u", 0, "", 1_000).expect("nothing stored");
        assert_eq!(s.len(1_000), 0);
        s.ban("u", 9_000, "x", 1_000).expect("room");
        s.ban("u", 1_000, "", 2_000).expect("lift");
        assert_eq!(s.banned("u", 2_000), None);
        assert_eq!(s.list(2_000), vec![]);
    }

    #[test]
    fn the_store_is_bounded_and_makes_room_from_expired_ones_first() {
        let s = Sanctions::default();
        for i in 0..MAX_SANCTIONED {
            s.mute(&format!("u{i}"), 100, 0).expect("room");
        }
        assert_eq!(s.mute("late", 100, 0), Err(Full));
        // Updating one already held still works when full.
        s.ban("u7", 500, "r", 0).expect("held already");
        // Once the mutes have ended, there is room again.
        s.mute("late", 1_000, 200).expect("expired ones swept");
        assert_eq!(s.len(200), 2);
    }

    #[test]
    fn merging_a_peers_list_keeps_the_later_end_of_each() {
        let here = Sanctions::default();
        here.ban("a", 5_000, "here", 0).expect("room");
        here.mute("b", 9_000, 0).expect("room");
        let peer = Sanctions::default();
        peer.ban("a", 7_000, "peer", 0).expect("room");
        peer.mute("b", 3_000, 0).expect("room");
        peer.ban("c", 4_000, "only there", 0).expect("room");
        assert_eq!(here.merge(peer.list(1_000), 1_000), 0);
        assert_eq!(here.banned("a", 1_000), Some((7_000, "peer".into())));
        assert_eq!(here.muted("b", 1_000), Some(9_000));
        assert_eq!(here.banned("c", 1_000), Some((4_000, "only there".into())));
    }

    #[test]
    fn reasons_are_clipped_on_a_character_boundary() {
        let s = Sanctions::default();
        let long = "é".repeat(MAX_REASON_CHARS + 5);
        s.ban("u", 10, &long, 0).expect("room");
        let (_, reason) = s.banned("u", 0).expect("banned");
        assert_eq!(reason.chars().count(), MAX_REASON_CHARS);
    }

    #[test]
    fn the_texts_say_how_long_is_left_in_whole_seconds() {
        assert_eq!(
            banned_text(59_001, "spam"),
            "you are banned by the app for 60 s more: spam"
        );
        assert_eq!(
            banned_text(1_000, ""),
            "you are banned by the app for 1 s more"
        );
        assert_eq!(
            muted_text(500),
            "you are muted by the app for 1 s more: message dropped"
        );
    }
}
