//! A sender's side of the accounting: the [`Trail`] of one bot's recent
//! moves, which the other bots of its run find by its name to tell which of
//! its moves a record delivers, and which of its in-window moves the server
//! is known to have applied. Each trail has its own lock: there is no lock
//! shared by a whole run on the receive path.

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use amble::protocol::Motion;

/// Sent moves a trail remembers. Bots send at most one move per interval,
/// and a batch arrives within a tick or two, so a few suffice.
const TRAIL_LEN: usize = 8;

/// Moves per bot whose application a trail records (one bit each): a bot
/// sending ten moves a second for 4.8 days. Later moves count as not
/// applied, so they are expected nowhere.
const MAX_TRACKED_SEQ: u32 = 1 << 22;

/// A move as its sender sent it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sent {
    pub motion: Motion,
    /// 1, 2, ... per bot; 0 is where the bot stood when it joined.
    pub seq: u32,
    pub at: Instant,
    /// Sent inside the measured window: its deliveries are counted.
    pub in_window: bool,
}

/// The recent moves of one bot, newest last, and which of its in-window
/// moves the server is known to have applied.
#[derive(Debug, Default)]
pub struct Trail {
    ring: Mutex<Ring>,
}

#[derive(Debug, Default)]
struct Ring {
    entries: [Option<(Sent, bool)>; TRAIL_LEN],
    next: usize,
    newest_seq: u32,
    /// Bit `seq`: an in-window move known to be applied.
    applied: Vec<u64>,
}

impl Ring {
    fn newest_first(&self) -> impl Iterator<Item = usize> + '_ {
        (1..=TRAIL_LEN).map(move |back| (self.next + TRAIL_LEN - back) % TRAIL_LEN)
    }

    fn find(&self, motion: &Motion) -> Option<usize> {
        self.newest_first()
            .find(|&i| matches!(&self.entries[i], Some((s, _)) if s.motion == *motion))
    }

    fn mark_applied(&mut self, sent: &Sent) {
        if !sent.in_window || sent.seq >= MAX_TRACKED_SEQ {
            return;
        }
        let (word, bit) = ((sent.seq / 64) as usize, sent.seq % 64);
        if self.applied.len() <= word {
            self.applied.resize(word + 1, 0);
        }
        self.applied[word] |= 1 << bit;
    }

    /// Applied in-window moves with `after < seq <= upto`.
    fn applied_between(&self, after: u32, upto: u32) -> u64 {
        let mut n = 0;
        for (w, &word) in self.applied.iter().enumerate() {
            let first = w as u64 * 64;
            let (lo, hi) = (u64::from(after) + 1, u64::from(upto));
            if first + 63 < lo || first > hi {
                continue;
            }
            let mut mask = u64::MAX;
            if lo > first {
                mask &= u64::MAX << (lo - first);
            }
            if hi < first + 63 {
                mask &= u64::MAX >> (63 - (hi - first));
            }
            n += u64::from((word & mask).count_ones());
        }
        n
    }
}

impl Trail {
    fn ring(&self) -> MutexGuard<'_, Ring> {
        // A panic while holding this lock leaves plain data behind: go on.
        self.ring.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Remembers a move just before it is sent (or, as seq 0, where the bot
    /// stood when it joined).
    pub fn push(&self, sent: Sent) {
        let mut ring = self.ring();
        let i = ring.next;
        ring.entries[i] = Some((sent, false));
        ring.next = (i + 1) % TRAIL_LEN;
        ring.newest_seq = ring.newest_seq.max(sent.seq);
    }

    /// Whether `motion` is among the remembered moves (a new move must not be).
    pub fn contains(&self, motion: &Motion) -> bool {
        self.ring().find(motion).is_some()
    }

    /// The newest remembered move with this motion.
    #[cfg(test)]
    pub fn find(&self, motion: &Motion) -> Option<Sent> {
        let ring = self.ring();
        ring.find(motion)
            .and_then(|i| ring.entries[i].map(|(s, _)| s))
    }

    /// The newest seq sent so far.
    pub fn newest_seq(&self) -> u32 {
        self.ring().newest_seq
    }

    /// The newest seq sent at or before `at` (0 when none the trail still
    /// holds was).
    pub fn newest_seq_before(&self, at: std::time::Instant) -> u32 {
        self.ring()
            .entries
            .iter()
            .flatten()
            .filter(|(s, _)| s.at <= at)
            .map(|(s, _)| s.seq)
            .max()
            .unwrap_or(0)
    }

    /// The move with this motion, seen delivered (so applied).
    pub(super) fn delivered(&self, motion: &Motion) -> Option<Sent> {
        let mut ring = self.ring();
        let sent = ring.find(motion).and_then(|i| ring.entries[i])?.0;
        ring.mark_applied(&sent);
        Some(sent)
    }

    /// The seq of the move a snapshot shows this bot at (it was applied);
    /// 0 if none of the remembered ones: the bot had not moved there yet.
    pub(super) fn shown_at(&self, motion: Option<&Motion>) -> u32 {
        motion.and_then(|m| self.delivered(m)).map_or(0, |s| s.seq)
    }

    /// Marks the move with this motion as echoed (so applied); returns it
    /// the first time.
    pub(super) fn echo(&self, motion: &Motion) -> Result<Option<Sent>, ()> {
        let mut ring = self.ring();
        let i = ring.find(motion).ok_or(())?;
        let Some((sent, echoed)) = ring.entries[i] else {
            return Err(());
        };
        ring.mark_applied(&sent);
        if echoed {
            return Ok(None);
        }
        ring.entries[i] = Some((sent, true));
        Ok(Some(sent))
    }

    /// Applied in-window moves with `after < seq <= upto`.
    pub fn applied_between(&self, after: u32, upto: u32) -> u64 {
        self.ring().applied_between(after, upto)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use amble::protocol::Position;

    fn at(x: u32) -> Motion {
        Motion::standing(Position { x, y: x })
    }

    fn sent(trail: &Trail, motion: Motion, seq: u32, at: Instant, in_window: bool) {
        trail.push(Sent {
            motion,
            seq,
            at,
            in_window,
        });
    }

    #[test]
    fn trail_forgets_the_oldest() {
        let trail = Trail::default();
        let now = Instant::now();
        for x in 0..(TRAIL_LEN as u32 + 2) {
            sent(&trail, at(x), x, now, true);
        }
        assert!(!trail.contains(&at(0)) && !trail.contains(&at(1)));
        assert!(trail.contains(&at(2)));
        assert_eq!(
            trail.find(&at(TRAIL_LEN as u32 + 1)).unwrap().seq,
            TRAIL_LEN as u32 + 1
        );
        assert_eq!(trail.newest_seq(), TRAIL_LEN as u32 + 1);
    }

    #[test]
    fn applied_moves_are_counted_by_range() {
        let trail = Trail::default();
        let now = Instant::now();
        for seq in 1..200 {
            sent(&trail, at(seq), seq, now, seq % 3 != 0);
            // Every in-window move but seq 100 is seen applied.
            if seq != 100 {
                trail.delivered(&at(seq));
            }
        }
        let applied = |after: u32, upto: u32| {
            (after + 1..=upto)
                .filter(|s| s % 3 != 0 && *s != 100 && *s < 200)
                .count() as u64
        };
        for (after, upto) in [
            (0, 199),
            (0, 63),
            (63, 64),
            (60, 130),
            (99, 100),
            (5, 5),
            (150, 400),
        ] {
            assert_eq!(
                trail.applied_between(after, upto),
                applied(after, upto),
                "({after}, {upto}]"
            );
        }
        assert_eq!(trail.applied_between(10, 3), 0);
        // Past the bound, nothing is recorded (and nothing panics).
        sent(&trail, at(1), MAX_TRACKED_SEQ, now, true);
        assert!(trail.delivered(&at(1)).is_some());
        assert_eq!(trail.applied_between(199, u32::MAX), 0);
    }
}
