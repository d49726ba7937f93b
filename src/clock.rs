//! Server time: Unix epoch milliseconds that never jump backwards.
//!
//! Read once from the system clock at start, then advanced by tokio's
//! monotonic clock (so paused-time tests control it too).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

#[derive(Clone, Copy, Debug)]
pub struct Clock {
    origin: Instant,
    origin_ms: u64,
}

impl Clock {
    pub fn start() -> Self {
        let origin_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        Self {
            origin: Instant::now(),
            origin_ms,
        }
    }

    /// Server time at `instant`.
    pub fn ms_at(&self, instant: Instant) -> u64 {
        let elapsed = instant.saturating_duration_since(self.origin);
        self.origin_ms + u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX / 2)
    }

    pub fn now_ms(&self) -> u64 {
        self.ms_at(Instant::now())
    }

    /// The instant at which server time is `ms` (clamped to the origin).
    pub fn instant_at(&self, ms: u64) -> Instant {
        self.origin + Duration::from_millis(ms.saturating_sub(self.origin_ms))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn follows_the_monotonic_clock() {
        let clock = Clock::start();
        let t0 = clock.now_ms();
        tokio::time::advance(Duration::from_millis(1_500)).await;
        assert_eq!(clock.now_ms(), t0 + 1_500);
        assert_eq!(clock.ms_at(clock.instant_at(t0 + 20)), t0 + 20);
    }
}
