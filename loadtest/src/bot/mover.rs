//! Where a bot is and how it picks its next move: `walk` (click-to-move,
//! one message per walk) or `wander` (a plain position each interval),
//! inside the world its Welcome gave, each move distinct from the bot's
//! recent ones (its [`Trail`]). No I/O and no clock (callers pass `now`
//! and the bot's generator), so it is tested exactly.

use std::time::{Duration, Instant};

use amble::protocol::{Motion, Position, Walk, pb};

use crate::ledger::Trail;
use crate::plan::Movement;
use crate::random::SplitMix;

/// Walking speed, cm/s (capped by the server's max_speed).
const WALK_SPEED: u32 = 150;
/// Largest step of a wandering bot per move, cm.
const WANDER_STEP: i64 = 100;

/// The world a bot moves in, from the Welcome's limits.
#[derive(Clone, Copy, Debug)]
pub(super) struct World {
    width: u32,
    height: u32,
    max_speed: u32,
}

impl World {
    /// The Welcome's limits; a limit the server left out (0) takes the
    /// default: 5,000 cm square, walking at [`WALK_SPEED`].
    pub(super) fn from_limits(limits: &pb::Limits) -> Self {
        Self {
            width: if limits.world_width > 0 {
                limits.world_width
            } else {
                5_000
            },
            height: if limits.world_height > 0 {
                limits.world_height
            } else {
                5_000
            },
            max_speed: if limits.max_speed > 0 {
                limits.max_speed
            } else {
                WALK_SPEED
            },
        }
    }

    pub(super) fn clamp(&self, x: i64, y: i64) -> Position {
        Position {
            x: x.clamp(0, i64::from(self.width)) as u32,
            y: y.clamp(0, i64::from(self.height)) as u32,
        }
    }

    /// Where a bot of a crowd starts (`--preset plaza`): four in five
    /// around one of eight spots (a ring at a quarter of the world around
    /// its middle), within about 15 m of it; the rest anywhere, walkers
    /// between the crowds.
    pub(super) fn in_crowd(&self, index: u32, rng: &mut SplitMix) -> Position {
        if index % 5 == 4 {
            return self.anywhere(rng);
        }
        let spot = f64::from(index % 8) * std::f64::consts::TAU / 8.0;
        let (w, h) = (f64::from(self.width), f64::from(self.height));
        let (cx, cy) = (
            w / 2.0 + w / 4.0 * spot.cos(),
            h / 2.0 + h / 4.0 * spot.sin(),
        );
        // A triangle-ish spread: denser near the spot.
        let spread = 1_500.0 * (rng.unit() + rng.unit() - 1.0);
        let angle = rng.unit() * std::f64::consts::TAU;
        self.clamp(
            (cx + spread * angle.cos()).round() as i64,
            (cy + spread * angle.sin()).round() as i64,
        )
    }

    pub(super) fn anywhere(&self, rng: &mut SplitMix) -> Position {
        Position {
            x: rng.below(u64::from(self.width) + 1) as u32,
            y: rng.below(u64::from(self.height) + 1) as u32,
        }
    }
}

/// Where a bot is and how it picks its next move.
#[derive(Clone, Debug)]
pub(super) struct Mover {
    movement: Movement,
    world: World,
    /// Wander: where it stands. Walk: where its last walk started.
    from: Position,
    walk: Option<(Walk, Instant)>,
    interval: Duration,
}

impl Mover {
    pub(super) fn new(
        movement: Movement,
        world: World,
        start: Position,
        interval: Duration,
    ) -> Self {
        Self {
            movement,
            world,
            from: start,
            walk: None,
            interval,
        }
    }

    /// Where the bot is at `now`.
    pub(super) fn position(&self, now: Instant) -> Position {
        let Some((walk, started)) = self.walk else {
            return self.from;
        };
        let (x0, y0) = (f64::from(self.from.x), f64::from(self.from.y));
        let (x1, y1) = (f64::from(walk.target.x), f64::from(walk.target.y));
        let length = (x1 - x0).hypot(y1 - y0);
        let walked = now.saturating_duration_since(started).as_secs_f64() * f64::from(walk.speed);
        let f = if length <= 0.0 {
            1.0
        } else {
            (walked / length).min(1.0)
        };
        self.world.clamp(
            (x0 + (x1 - x0) * f).round() as i64,
            (y0 + (y1 - y0) * f).round() as i64,
        )
    }

    /// The next move at `now`: one distinct from every move in `trail`.
    pub(super) fn next(&mut self, now: Instant, trail: &Trail, rng: &mut SplitMix) -> Motion {
        let here = self.position(now);
        for attempt in 0.. {
            let motion = match self.movement {
                Movement::Wander => {
                    let step = if attempt < 16 {
                        WANDER_STEP
                    } else {
                        i64::from(self.world.width)
                    };
                    let to = self.world.clamp(
                        i64::from(here.x) + rng.between(-step, step),
                        i64::from(here.y) + rng.between(-step, step),
                    );
                    Motion::standing(to)
                }
                Movement::Walk => {
                    let speed = WALK_SPEED.min(self.world.max_speed).max(1);
                    // A walk that ends before the next click: one message per walk.
                    let reach = f64::from(speed) * self.interval.as_secs_f64();
                    let distance = reach * (0.3 + 0.6 * rng.unit());
                    let angle = rng.unit() * std::f64::consts::TAU;
                    let target = if attempt < 16 {
                        self.world.clamp(
                            i64::from(here.x) + (distance * angle.cos()).round() as i64,
                            i64::from(here.y) + (distance * angle.sin()).round() as i64,
                        )
                    } else {
                        self.world.anywhere(rng)
                    };
                    Motion {
                        position: here,
                        walk: Some(Walk { target, speed }),
                    }
                }
            };
            let moved = motion
                .walk
                .map_or(motion.position != here, |w| w.target != here);
            if moved && !trail.contains(&motion) {
                match motion.walk {
                    None => self.from = motion.position,
                    Some(walk) => {
                        self.from = here;
                        self.walk = Some((walk, now));
                    }
                }
                return motion;
            }
        }
        unreachable!("the loop returns once a distinct move is found")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::Sent;

    fn world() -> World {
        World {
            width: 5_000,
            height: 5_000,
            max_speed: 1_000,
        }
    }

    #[test]
    fn moves_are_distinct_and_in_bounds() {
        for movement in [Movement::Walk, Movement::Wander] {
            let trail = Trail::default();
            let mut rng = SplitMix::new(7);
            // A corner, to exercise clamping.
            let mut mover = Mover::new(
                movement,
                world(),
                Position { x: 0, y: 5_000 },
                Duration::from_secs(1),
            );
            let mut now = Instant::now();
            let mut seen = Vec::new();
            for seq in 0..1_000 {
                let m = mover.next(now, &trail, &mut rng);
                assert!(m.position.x <= 5_000 && m.position.y <= 5_000);
                if let Some(w) = m.walk {
                    assert!(w.target.x <= 5_000 && w.target.y <= 5_000);
                    assert!(w.speed >= 1 && w.speed <= 1_000);
                }
                assert!(!trail.contains(&m), "{movement:?} repeated a recent move");
                trail.push(Sent {
                    motion: m,
                    seq,
                    at: now,
                    in_window: true,
                });
                seen.push(m);
                now += Duration::from_secs(1);
            }
        }
    }

    #[test]
    fn walking_follows_the_last_walk() {
        let mut rng = SplitMix::new(1);
        let trail = Trail::default();
        let start = Position { x: 2_500, y: 2_500 };
        let mut mover = Mover::new(Movement::Walk, world(), start, Duration::from_secs(2));
        let t0 = Instant::now();
        let first = mover.next(t0, &trail, &mut rng);
        assert_eq!(first.position, start);
        let walk = first.walk.unwrap();
        // Long after, the bot stands at the target: the next walk starts there.
        let second = mover.next(t0 + Duration::from_secs(60), &trail, &mut rng);
        assert_eq!(second.position, walk.target);
        // The walk fits in one interval: one message per walk.
        let dx = f64::from(walk.target.x) - 2_500.0;
        let dy = f64::from(walk.target.y) - 2_500.0;
        assert!(dx.hypot(dy) <= f64::from(walk.speed) * 2.0 + 1.0);
    }
}
