//! Rate limits without a clock: the caller passes `now`, so every decision
//! can be tested at exact instants.
//!
//! [`Gcra`] is the generic cell rate algorithm (a token bucket kept as one
//! "theoretical arrival time"). [`Budget`] pairs two of them: the budget a
//! client is served at, and a much larger one past which it is flooding.

use std::time::Duration;

use tokio::time::Instant;

/// What a rate limiter says about one event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admit {
    /// Within the budget: go ahead.
    Now,
    /// Over the budget: the earliest instant it would be admitted.
    At(Instant),
}

/// A rate limit of one event per `interval`, with bursts of `burst`.
///
/// Every connection holds several (moves, chat, joins, pings, strikes), so
/// the two spans are kept as nanoseconds: 32 bytes a limiter, not 48.
#[derive(Clone, Debug)]
pub struct Gcra {
    interval_ns: u64,
    tolerance_ns: u64,
    /// When the bucket is next empty of debt; `None` until the first event.
    tat: Option<Instant>,
}

/// `d` in nanoseconds, saturating (at about 584 years).
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Gcra {
    /// `burst` events may pass back to back (at least 1).
    pub fn new(interval: Duration, burst: u32) -> Self {
        let interval_ns = nanos(interval);
        Self {
            interval_ns,
            tolerance_ns: interval_ns.saturating_mul(u64::from(burst.saturating_sub(1))),
            tat: None,
        }
    }

    /// Would an event at `now` pass? Does not consume budget.
    pub fn check(&self, now: Instant) -> Admit {
        let tat = self.tat.map_or(now, |t| t.max(now));
        let earliest = tat
            .checked_sub(Duration::from_nanos(self.tolerance_ns))
            .unwrap_or(now);
        if earliest <= now {
            Admit::Now
        } else {
            Admit::At(earliest)
        }
    }

    /// Takes one event at `now` if the budget allows.
    pub fn admit(&mut self, now: Instant) -> Admit {
        let verdict = self.check(now);
        if verdict == Admit::Now {
            self.tat =
                Some(self.tat.map_or(now, |t| t.max(now)) + Duration::from_nanos(self.interval_ns));
        }
        verdict
    }

    /// Whether the whole burst is available again at `now` (no debt left).
    pub fn is_rested(&self, now: Instant) -> bool {
        self.tat.is_none_or(|t| t <= now)
    }
}

/// What to do with one incoming move or chat.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Apply it now.
    Apply,
    /// Over budget: hold it (moves: newest wins) until this instant.
    Defer(Instant),
    /// Far over budget, sustained: close the connection.
    Flood,
}

/// A served budget and a flood limit `factor` times larger.
#[derive(Clone, Debug)]
pub struct Budget {
    served: Gcra,
    flood: Gcra,
}

impl Budget {
    pub fn new(interval: Duration, burst: u32, factor: u32) -> Self {
        Self {
            served: Gcra::new(interval, burst),
            flood: Gcra::new(interval / factor.max(1), burst.saturating_mul(factor)),
        }
    }

    /// Counts one arrival at `now` and says what to do with it.
    pub fn arrive(&mut self, now: Instant) -> Verdict {
        if let Admit::At(_) = self.flood.admit(now) {
            return Verdict::Flood;
        }
        match self.served.admit(now) {
            Admit::Now => Verdict::Apply,
            Admit::At(t) => Verdict::Defer(t),
        }
    }

    /// Takes budget for a deferred event whose instant has come; `At` if
    /// the budget still does not allow it (the caller waits again).
    pub fn take_deferred(&mut self, now: Instant) -> Admit {
        self.served.admit(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SEC: Duration = Duration::from_secs(1);

    #[test]
    fn a_limiter_is_small() {
        // Several live in every connection's task (docs/benchmarks.md).
        assert!(std::mem::size_of::<Gcra>() <= 32);
        assert!(std::mem::size_of::<Budget>() <= 64);
    }

    #[test]
    fn burst_then_one_per_interval() {
        let t0 = Instant::now();
        let mut g = Gcra::new(SEC, 2);
        assert_eq!(g.admit(t0), Admit::Now);
        assert_eq!(g.admit(t0), Admit::Now);
        assert_eq!(g.admit(t0), Admit::At(t0 + SEC));
        assert_eq!(g.admit(t0 + SEC), Admit::Now);
        assert_eq!(g.admit(t0 + SEC), Admit::At(t0 + 2 * SEC));
        // A long pause refills the burst, no more.
        let later = t0 + 100 * SEC;
        assert_eq!(g.admit(later), Admit::Now);
        assert_eq!(g.admit(later), Admit::Now);
        assert_eq!(g.admit(later), Admit::At(later + SEC));
    }

    #[test]
    fn check_does_not_consume() {
        let t0 = Instant::now();
        let mut g = Gcra::new(SEC, 1);
        assert_eq!(g.check(t0), Admit::Now);
        assert_eq!(g.check(t0), Admit::Now);
        assert_eq!(g.admit(t0), Admit::Now);
        assert_eq!(g.check(t0), Admit::At(t0 + SEC));
    }

    #[test]
    fn deferral_then_flood() {
        let t0 = Instant::now();
        let mut b = Budget::new(SEC, 2, 20);
        assert_eq!(b.arrive(t0), Verdict::Apply);
        assert_eq!(b.arrive(t0), Verdict::Apply);
        assert_eq!(b.arrive(t0), Verdict::Defer(t0 + SEC));
        // 40 arrivals pass the flood limit at once; the 41st does not.
        let mut verdicts = (3..40).map(|_| b.arrive(t0));
        assert!(verdicts.all(|v| matches!(v, Verdict::Defer(_))));
        assert_eq!(b.arrive(t0), Verdict::Flood);
    }

    #[test]
    fn a_client_at_its_budget_never_floods() {
        let t0 = Instant::now();
        let mut b = Budget::new(SEC, 2, 20);
        for i in 0..1_000 {
            let v = b.arrive(t0 + SEC * i);
            assert_eq!(v, Verdict::Apply, "move {i}");
        }
    }

    proptest! {
        /// In any window of `n` intervals no more than `n + burst - 1` events pass.
        #[test]
        fn never_admits_more_than_the_budget(
            gaps in proptest::collection::vec(0u64..1_500, 1..300),
            burst in 1u32..5,
        ) {
            let t0 = Instant::now();
            let mut g = Gcra::new(SEC, burst);
            let mut now = t0;
            let mut admitted = Vec::new();
            for gap in gaps {
                now += Duration::from_millis(gap);
                if g.admit(now) == Admit::Now {
                    admitted.push(now);
                }
            }
            for (i, &start) in admitted.iter().enumerate() {
                for window_s in 1u32..5 {
                    let end = start + SEC * window_s;
                    let n = admitted[i..].iter().take_while(|&&t| t < end).count();
                    prop_assert!((n as u32) < window_s + burst, "{n} in {window_s}s");
                }
            }
        }
    }
}
