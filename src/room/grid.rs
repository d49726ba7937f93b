//! The tick's time grid: when a tick falls, and when the cut before it
//! falls (`--cluster-lead-ms` earlier), in server time. The ticker
//! (`Rooms::run_ticker`) and the cutter (`Rooms::run_cutter`) both read it,
//! so they agree on every instant. Pure: the caller passes the time.

/// Ticks every `tick_ms` on multiples of it; each cut `lead_ms` before its
/// tick.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct TickGrid {
    tick_ms: u64,
    lead_ms: u64,
}

impl TickGrid {
    /// The grid of a `tick_ms` tick whose cuts lead it by `lead_ms`, at
    /// most `tick_ms - 1`; `None` for a zero tick (moves go out at once).
    pub(super) fn new(tick_ms: u64, lead_ms: u64) -> Option<Self> {
        (tick_ms > 0).then(|| Self {
            tick_ms,
            lead_ms: lead_ms.min(tick_ms - 1),
        })
    }

    /// The first tick after `now_ms`.
    pub(super) fn next_tick(self, now_ms: u64) -> u64 {
        now_ms - now_ms % self.tick_ms + self.tick_ms
    }

    /// When the cut before the tick at `tick_ms` falls.
    pub(super) fn cut_before(self, tick_ms: u64) -> u64 {
        tick_ms - self.lead_ms
    }

    /// The tick nearest `at_ms`: a tick timer fired at `at_ms`, which is on
    /// the grid up to the millisecond truncation of the clock origin.
    pub(super) fn nearest_tick(self, at_ms: u64) -> u64 {
        (at_ms + self.tick_ms / 2) / self.tick_ms * self.tick_ms
    }

    /// The tick a cut timer that fired at `at_ms` cuts for.
    pub(super) fn tick_after_cut(self, at_ms: u64) -> u64 {
        self.nearest_tick(at_ms + self.lead_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::TickGrid;

    fn grid(tick_ms: u64, lead_ms: u64) -> TickGrid {
        TickGrid::new(tick_ms, lead_ms).expect("a non-zero tick")
    }

    #[test]
    fn a_zero_tick_has_no_grid_and_the_lead_stays_below_the_tick() {
        assert_eq!(TickGrid::new(0, 10), None);
        assert_eq!(grid(100, 250).cut_before(1_000), 901);
        assert_eq!(grid(100, 99).cut_before(1_000), 901);
    }

    #[test]
    fn the_next_tick_is_strictly_after_now() {
        let g = grid(100, 20);
        for (now_ms, next) in [(0, 100), (1, 100), (99, 100), (100, 200), (1_234, 1_300)] {
            assert_eq!(g.next_tick(now_ms), next, "now {now_ms}");
        }
    }

    #[test]
    fn a_cut_falls_the_lead_before_its_tick() {
        assert_eq!(grid(100, 20).cut_before(1_000), 980);
        assert_eq!(grid(100, 0).cut_before(1_000), 1_000);
        assert_eq!(grid(50, 20).cut_before(50), 30);
    }

    #[test]
    fn a_timer_firing_near_the_grid_stands_for_the_nearest_tick() {
        let g = grid(100, 20);
        for (at_ms, tick) in [
            (1_000, 1_000),
            (999, 1_000),
            (1_049, 1_000),
            (1_050, 1_100),
            (950, 1_000),
        ] {
            assert_eq!(g.nearest_tick(at_ms), tick, "at {at_ms}");
        }
    }

    #[test]
    fn a_cut_fired_at_its_instant_cuts_for_the_tick_after_it() {
        let g = grid(100, 20);
        assert_eq!(g.tick_after_cut(980), 1_000);
        assert_eq!(g.tick_after_cut(979), 1_000);
        assert_eq!(g.tick_after_cut(g.cut_before(g.next_tick(1_234))), 1_300);
    }
}
