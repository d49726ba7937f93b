//! The random generator: SplitMix64, small, fast and seedable. Each bot
//! owns one (so a run is reproducible per bot and no generator is shared);
//! the run tag draws from one too.

/// A small, fast, seedable generator (SplitMix64): each bot owns one, so
/// runs are reproducible per bot and no generator is shared.
#[derive(Clone, Debug)]
pub struct SplitMix(u64);

impl SplitMix {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n.max(1))) >> 64) as u64
    }

    /// Uniform in `lo..=hi`.
    pub fn between(&mut self, lo: i64, hi: i64) -> i64 {
        lo + self.below((hi - lo + 1) as u64) as i64
    }

    /// Uniform in `0.0..1.0`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A bot's jitter is `below(n + 1)` added to its interval: never
    /// negative, never above `n`.
    #[test]
    fn jitter_never_shortens_the_interval() {
        let mut rng = SplitMix::new(3);
        for _ in 0..10_000 {
            let v = rng.below(10);
            assert!(v < 10);
        }
        let u = rng.unit();
        assert!((0.0..1.0).contains(&u));
    }
}
