//! Places kept for members whose connection dropped: resume tokens and
//! held places, a pure core (no clock: callers pass `now_ms`).
//!
//! Every local member of a server with a resume grace (`--resume-grace-ms`)
//! has one current [`ResumeToken`], sent in its `Welcome`. When its
//! connection ends without a `Leave` (the socket closed or failed, the
//! idle timeout, a peer that stopped reading), the member is *held*: it
//! stays in the room's state, standing where it was, and nobody is told;
//! only its sink is gone. A Join carrying its token within the grace takes
//! the place back (same id, a fresh `Welcome`), and the token is spent: the
//! new `Welcome` carries the next one. After the grace the member leaves as
//! it would have at once (`Left`).
//!
//! [`Places`] is one room's table (bounded by the room's members: one token
//! and at most one held place per member); the room holds it under its
//! `state` lock. The rooms count held places node-wide, under a cap.

use std::collections::HashMap;
use std::fmt;

use crate::protocol::{LeaveReason, MemberId};

/// A member's resume token: 128 random bits, shown as 32 lowercase hex
/// digits. Not guessable, so holding one is the proof of a place.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ResumeToken([u8; 16]);

/// Why a Join's resume token was not honoured (the Join then joins afresh).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Not 32 hex digits.
    Malformed,
    /// No place here has it: spent, expired, never issued, or held by a
    /// node that did not answer.
    Unknown,
    /// The place belongs to another app user (token `sub`).
    OtherUser,
}

impl Refusal {
    /// The label of `amble_resume_refused_total`.
    pub fn reason(self) -> &'static str {
        match self {
            Self::Malformed => "malformed",
            Self::Unknown => "unknown",
            Self::OtherUser => "other_user",
        }
    }
}

impl ResumeToken {
    /// A fresh token from the operating system's random source. `None` if
    /// it failed (the member then gets no token, and joins afresh next time).
    pub fn random() -> Option<Self> {
        let mut bits = [0u8; 16];
        getrandom::fill(&mut bits).ok()?;
        Some(Self(bits))
    }

    /// A token from its text form (a Join's `resume_token`).
    pub fn parse(text: &str) -> Result<Self, Refusal> {
        let text = text.as_bytes();
        if text.len() != 32 {
            return Err(Refusal::Malformed);
        }
        let mut bits = [0u8; 16];
        for (byte, pair) in bits.iter_mut().zip(text.chunks_exact(2)) {
            let hi = hex_digit(pair[0]).ok_or(Refusal::Malformed)?;
            let lo = hex_digit(pair[1]).ok_or(Refusal::Malformed)?;
            *byte = hi << 4 | lo;
        }
        Ok(Self(bits))
    }

    /// The token's 16 bytes (for the cluster's wire).
    pub fn bytes(&self) -> [u8; 16] {
        self.0
    }

    /// A token from its 16 bytes.
    pub fn from_bytes(bits: [u8; 16]) -> Self {
        Self(bits)
    }

    /// What other nodes are told of the token: the first 16 bytes of its
    /// SHA-256. A node shown the token recognises the place; nobody can
    /// make the token from it.
    pub fn hash(&self) -> [u8; 16] {
        use sha2::Digest as _;
        let digest = sha2::Sha256::digest(self.0);
        let mut hash = [0u8; 16];
        hash.copy_from_slice(&digest[..16]);
        hash
    }
}

fn hex_digit(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

impl fmt::Display for ResumeToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

/// Never printed whole: a token in a log would be a place given away.
impl fmt::Debug for ResumeToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ResumeToken({:02x}{:02x}…)", self.0[0], self.0[1])
    }
}

/// A place held for a member whose connection dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Held {
    /// When the grace ends (server time, ms).
    pub until_ms: u64,
    /// The `Left` reason the room sees if nobody resumes it.
    pub reason: LeaveReason,
}

/// One room's resume tokens and held places. Bounded by the room's
/// members: one token and at most one held place each.
#[derive(Debug, Default)]
pub struct Places {
    /// The current token of each local member that has one.
    tokens: HashMap<ResumeToken, MemberId>,
    /// The same, by member, to spend or forget a member's token.
    issued: HashMap<MemberId, ResumeToken>,
    held: HashMap<MemberId, Held>,
}

impl Places {
    /// `token` is now `id`'s only token (an older one is spent).
    pub fn issue(&mut self, id: MemberId, token: ResumeToken) {
        if let Some(old) = self.issued.insert(id, token) {
            self.tokens.remove(&old);
        }
        self.tokens.insert(token, id);
    }

    /// Whose place `token` is, without spending it.
    pub fn owner(&self, token: &ResumeToken) -> Option<MemberId> {
        self.tokens.get(token).copied()
    }

    /// `id`'s current token, if it has one.
    pub fn token_of(&self, id: MemberId) -> Option<ResumeToken> {
        self.issued.get(&id).copied()
    }

    /// Whether `id` has a token (a place that can be held).
    pub fn has_token(&self, id: MemberId) -> bool {
        self.issued.contains_key(&id)
    }

    /// Spends `token`: its member's place is taken back. Returns the member
    /// and the place it held, if it was held (the hold ends).
    pub fn claim(&mut self, token: &ResumeToken) -> Option<(MemberId, Option<Held>)> {
        let id = self.tokens.remove(token)?;
        self.issued.remove(&id);
        Some((id, self.held.remove(&id)))
    }

    /// Holds `id`'s place until `until_ms`.
    pub fn hold(&mut self, id: MemberId, until_ms: u64, reason: LeaveReason) {
        self.held.insert(id, Held { until_ms, reason });
    }

    /// `id`'s held place, if it is held.
    pub fn held(&self, id: MemberId) -> Option<Held> {
        self.held.get(&id).copied()
    }

    /// `id`'s held place if its grace is over at `now_ms`.
    pub fn expired(&self, id: MemberId, now_ms: u64) -> Option<Held> {
        self.held(id).filter(|h| h.until_ms <= now_ms)
    }

    /// `id` left the room: its token and any held place go. Returns whether
    /// its place was held.
    pub fn forget(&mut self, id: MemberId) -> bool {
        if let Some(token) = self.issued.remove(&id) {
            self.tokens.remove(&token);
        }
        self.held.remove(&id).is_some()
    }

    /// Places held now.
    pub fn held_count(&self) -> usize {
        self.held.len()
    }

    /// Every held member (a node's shutdown lets them go).
    pub fn held_members(&self) -> Vec<MemberId> {
        self.held.keys().copied().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(n: u8) -> ResumeToken {
        ResumeToken::from_bytes([n; 16])
    }

    #[test]
    fn a_token_round_trips_as_32_hex_digits() {
        let t = ResumeToken::from_bytes([0xab; 16]);
        let text = t.to_string();
        assert_eq!(text, "ab".repeat(16));
        assert_eq!(ResumeToken::parse(&text), Ok(t));
        assert_eq!(ResumeToken::parse(&text.to_uppercase()), Ok(t));
        assert!(!format!("{t:?}").contains(&text));
    }

    #[test]
    fn malformed_tokens_are_refused() {
        for bad in [
            "",
            "abc",
            &"g".repeat(32),
            &"a".repeat(31),
            &"a".repeat(33),
            &"é".repeat(16),
        ] {
            assert_eq!(ResumeToken::parse(bad), Err(Refusal::Malformed), "{bad:?}");
        }
    }

    #[test]
    fn a_token_hash_is_the_head_of_its_sha256() {
        // SHA-256 of sixteen zero bytes: 374708fff7719dd5979ec875d56cd228...
        let hash = ResumeToken::from_bytes([0; 16]).hash();
        assert_eq!(
            hash,
            [
                0x37, 0x47, 0x08, 0xff, 0xf7, 0x71, 0x9d, 0xd5, 0x97, 0x9e, 0xc8, 0x75, 0xd5, 0x6c,
                0xd2, 0x28
            ]
        );
        assert_ne!(ResumeToken::from_bytes([1; 16]).hash(), hash);
    }

    #[test]
    fn random_tokens_differ() {
        let a = ResumeToken::random().expect("random");
        let b = ResumeToken::random().expect("random");
        assert_ne!(a, b);
    }

    #[test]
    fn a_token_is_spent_once_and_replaced_by_the_next() {
        let mut p = Places::default();
        p.issue(MemberId(3), token(1));
        assert_eq!(p.owner(&token(1)), Some(MemberId(3)));
        p.hold(MemberId(3), 10_000, LeaveReason::Disconnected);
        let held = Held {
            until_ms: 10_000,
            reason: LeaveReason::Disconnected,
        };
        assert_eq!(p.claim(&token(1)), Some((MemberId(3), Some(held))));
        assert_eq!(p.claim(&token(1)), None, "valid once");
        assert_eq!(p.held_count(), 0);
        assert!(!p.has_token(MemberId(3)));
        p.issue(MemberId(3), token(2));
        p.issue(MemberId(3), token(4));
        assert_eq!(p.owner(&token(2)), None, "an older token is spent");
        assert_eq!(p.claim(&token(4)), Some((MemberId(3), None)));
    }

    #[test]
    fn a_held_place_expires_at_its_deadline_exactly() {
        let mut p = Places::default();
        p.issue(MemberId(0), token(1));
        p.hold(MemberId(0), 5_000, LeaveReason::TimedOut);
        assert_eq!(p.expired(MemberId(0), 4_999), None);
        assert_eq!(
            p.expired(MemberId(0), 5_000).map(|h| h.reason),
            Some(LeaveReason::TimedOut)
        );
        assert!(p.forget(MemberId(0)));
        assert_eq!(p.owner(&token(1)), None);
        assert!(!p.forget(MemberId(0)));
        assert_eq!(p.held_members(), Vec::<MemberId>::new());
    }
}
