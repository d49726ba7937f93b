//! Area of interest in a spatial room (issue #17): who sees whom. Pure: no
//! I/O, no clock; positions in, cells and view changes out, tested at
//! exact values.
//!
//! **The rule.** The world is cut into square cells. A member lives in one
//! cell (its *home*), and sees the members whose home is its own cell or
//! one of the eight around it: the 3 × 3 block. Seeing is symmetric: A
//! sees B exactly when B sees A.
//!
//! **Hysteresis.** A member's home changes only once it stands more than
//! [`Grid::margin_cm`] (an eighth of the radius) outside the home's
//! bounds, so someone walking along a cell's edge does not flicker in and
//! out of view of the members two cells away. A cell's side is the radius
//! plus twice the margin: then everyone within the radius is always seen,
//! however far each stands outside its home ([`Grid::must_see`]), and
//! nobody is seen who stands two sides plus two margins away or more on
//! either axis ([`Grid::may_see`], the band at the edge where a delivery
//! is allowed but not owed; the load tester's ledger and the tests use
//! both).

use crate::protocol::Position;

/// One cell of the grid, by column and row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Cell {
    pub col: u16,
    pub row: u16,
}

/// The grid over one spatial room's world.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grid {
    /// A cell's side, cm: the interest radius plus two margins.
    pub cell_cm: u32,
    /// How far outside its home a member goes before its home changes, cm.
    pub margin_cm: u32,
    cols: u16,
    rows: u16,
}

/// The most cells along one side: bounds a grid's memory whatever the
/// flags (a 500 m world with a 1 m radius is 500 a side).
pub const MAX_CELLS_PER_SIDE: u32 = 4_096;

impl Grid {
    /// A grid over a `world` (cm) for an interest radius of `radius_cm`
    /// (at least 1 cm, and raised so that no side has more than
    /// [`MAX_CELLS_PER_SIDE`] cells): margins of an eighth of the radius
    /// (at least 1 cm), cells of the radius plus two margins.
    pub fn new(world: Position, radius_cm: u32) -> Self {
        let longest = world.x.max(world.y).max(1);
        let radius = radius_cm.max(1).max(longest.div_ceil(MAX_CELLS_PER_SIDE));
        let margin_cm = (radius / 8).max(1);
        let cell_cm = radius.saturating_add(2 * margin_cm);
        let side = |len: u32| -> u16 {
            // At most MAX_CELLS_PER_SIDE + 1 (a point on the far edge).
            u16::try_from(len / cell_cm + 1).unwrap_or(u16::MAX)
        };
        Self {
            cell_cm,
            margin_cm,
            cols: side(world.x),
            rows: side(world.y),
        }
    }

    /// Columns and rows.
    pub fn size(&self) -> (u16, u16) {
        (self.cols, self.rows)
    }

    /// The cell `p` falls in, ignoring hysteresis (a member's first home).
    pub fn cell_of(&self, p: Position) -> Cell {
        let clamp = |v: u32, n: u16| -> u16 {
            u16::try_from(v / self.cell_cm)
                .unwrap_or(u16::MAX)
                .min(n.saturating_sub(1))
        };
        Cell {
            col: clamp(p.x, self.cols),
            row: clamp(p.y, self.rows),
        }
    }

    /// Where a member whose home is `home` lives once at `p`: still `home`
    /// while `p` is within the home's bounds grown by the margin, else the
    /// cell `p` falls in.
    pub fn rehome(&self, home: Cell, p: Position) -> Cell {
        let (lo_x, lo_y) = (
            u64::from(home.col) * u64::from(self.cell_cm),
            u64::from(home.row) * u64::from(self.cell_cm),
        );
        let m = u64::from(self.margin_cm);
        let c = u64::from(self.cell_cm);
        let within = |v: u32, lo: u64| {
            let v = u64::from(v);
            v + m >= lo && v < lo + c + m
        };
        if within(p.x, lo_x) && within(p.y, lo_y) {
            home
        } else {
            self.cell_of(p)
        }
    }

    /// Whether a member living in `viewer` sees one living in `subject`.
    pub fn sees(viewer: Cell, subject: Cell) -> bool {
        viewer.col.abs_diff(subject.col) <= 1 && viewer.row.abs_diff(subject.row) <= 1
    }

    /// The cells a member living in `home` sees: the 3 × 3 block around it,
    /// within the world, row by row.
    pub fn view(&self, home: Cell) -> impl Iterator<Item = Cell> + use<> {
        let (cols, rows) = (self.cols, self.rows);
        let span =
            |v: u16, n: u16| v.saturating_sub(1)..=(v.saturating_add(1)).min(n.saturating_sub(1));
        let cols_span = span(home.col, cols);
        span(home.row, rows)
            .flat_map(move |row| cols_span.clone().map(move |col| Cell { col, row }))
    }

    /// What a move from `from` to `to` changes: the cells that come into
    /// view, and those that go out of it (both empty when `from == to`).
    pub fn change(&self, from: Cell, to: Cell) -> (Vec<Cell>, Vec<Cell>) {
        let entering = self.view(to).filter(|c| !Self::sees(from, *c)).collect();
        let leaving = self.view(from).filter(|c| !Self::sees(to, *c)).collect();
        (entering, leaving)
    }

    /// The band at the rule's edge: whether a member at `viewer` may be
    /// sent what happens at `subject` at all, whatever the homes'
    /// histories (the block grown by the margin). Outside it, a delivery
    /// is a leak.
    pub fn may_see(&self, viewer: Position, subject: Position) -> bool {
        let reach = 2 * u64::from(self.cell_cm) + 2 * u64::from(self.margin_cm);
        u64::from(viewer.x.abs_diff(subject.x)) < reach
            && u64::from(viewer.y.abs_diff(subject.y)) < reach
    }

    /// The interest radius, cm.
    pub fn radius_cm(&self) -> u32 {
        self.cell_cm - 2 * self.margin_cm
    }

    /// Whether a member at `viewer` must be sent what happens at
    /// `subject`: within the radius, always seen.
    pub fn must_see(&self, viewer: Position, subject: Position) -> bool {
        let (dx, dy) = (
            u64::from(viewer.x.abs_diff(subject.x)),
            u64::from(viewer.y.abs_diff(subject.y)),
        );
        let r = u64::from(self.radius_cm());
        dx * dx + dy * dy <= r * r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(x: u32, y: u32) -> Position {
        Position { x, y }
    }

    fn c(col: u16, row: u16) -> Cell {
        Cell { col, row }
    }

    /// A 500 m x 500 m world with a 15 m radius: the defaults.
    fn plaza() -> Grid {
        Grid::new(p(50_000, 50_000), 1_500)
    }

    #[test]
    fn cells_are_the_radius_and_two_margins_and_cover_the_world_edge_included() {
        let g = plaza();
        assert_eq!((g.cell_cm, g.margin_cm, g.radius_cm()), (1_874, 187, 1_500));
        assert_eq!(g.size(), (27, 27));
        assert_eq!(g.cell_of(p(0, 0)), c(0, 0));
        assert_eq!(g.cell_of(p(1_873, 1_874)), c(0, 1));
        assert_eq!(g.cell_of(p(50_000, 50_000)), c(26, 26));
        // Past the world (never accepted from a client): the last cell.
        assert_eq!(g.cell_of(p(u32::MAX, 0)), c(26, 0));
    }

    #[test]
    fn a_tiny_radius_over_a_huge_world_is_bounded() {
        let g = Grid::new(p(10_000_000, 10_000_000), 1);
        assert_eq!((g.radius_cm(), g.margin_cm, g.cell_cm), (2_442, 305, 3_052));
        assert!(u32::from(g.size().0) <= MAX_CELLS_PER_SIDE + 1);
    }

    #[test]
    fn the_home_changes_only_past_the_margin() {
        let g = plaza();
        let home = c(1, 1); // 1874..3748 on both axes
        assert_eq!(g.rehome(home, p(3_747, 2_000)), home);
        assert_eq!(g.rehome(home, p(3_934, 2_000)), home, "inside the margin");
        assert_eq!(g.rehome(home, p(3_935, 2_000)), c(2, 1), "past it");
        assert_eq!(g.rehome(home, p(1_687, 2_000)), home);
        assert_eq!(g.rehome(home, p(1_686, 2_000)), c(0, 1));
        // Walking back along the edge does not flip it back at once.
        assert_eq!(g.rehome(c(2, 1), p(3_740, 2_000)), c(2, 1));
        assert_eq!(g.rehome(c(0, 0), p(40_000, 40_000)), c(21, 21), "a jump");
    }

    #[test]
    fn the_view_is_the_block_around_the_home_clipped_to_the_world() {
        let g = plaza();
        assert_eq!(
            g.view(c(0, 0)).collect::<Vec<_>>(),
            [c(0, 0), c(1, 0), c(0, 1), c(1, 1)]
        );
        assert_eq!(g.view(c(5, 5)).count(), 9);
        assert_eq!(g.view(c(26, 10)).count(), 6);
        assert!(Grid::sees(c(4, 4), c(5, 5)) && Grid::sees(c(5, 5), c(4, 4)));
        assert!(!Grid::sees(c(3, 5), c(5, 5)));
    }

    #[test]
    fn a_step_to_the_next_cell_brings_three_cells_in_and_takes_three_out() {
        let g = plaza();
        let (entering, leaving) = g.change(c(5, 5), c(6, 5));
        assert_eq!(entering, [c(7, 4), c(7, 5), c(7, 6)]);
        assert_eq!(leaving, [c(4, 4), c(4, 5), c(4, 6)]);
        let (entering, leaving) = g.change(c(5, 5), c(6, 6));
        assert_eq!(entering.len(), 5);
        assert_eq!(leaving.len(), 5);
        assert_eq!(g.change(c(5, 5), c(5, 5)), (vec![], vec![]));
        let (entering, leaving) = g.change(c(0, 0), c(20, 20));
        assert_eq!((entering.len(), leaving.len()), (9, 4));
    }

    #[test]
    fn everyone_within_the_radius_is_seen_and_nobody_past_the_band() {
        let g = plaza();
        for (a, b) in [
            (p(1_874, 1_874), p(2_800, 2_800)),
            (p(3_000, 1_500), p(4_499, 1_500)),
            (p(100, 100), p(1_160, 1_160)),
        ] {
            assert!(g.must_see(a, b), "{a:?} {b:?}");
            assert!(Grid::sees(g.cell_of(a), g.cell_of(b)), "{a:?} {b:?}");
            assert!(g.may_see(a, b));
        }
        // Seen through the block, though further than the radius.
        let (a, b) = (p(1_874, 1_874), p(5_000, 5_000));
        assert!(!g.must_see(a, b) && Grid::sees(g.cell_of(a), g.cell_of(b)));
        // The band: two cells and two margins, on either axis.
        assert!(!g.may_see(p(0, 0), p(4_122, 0)));
        assert!(g.may_see(p(0, 0), p(4_121, 0)));
    }

    #[test]
    fn homes_with_hysteresis_stay_inside_the_band() {
        // Whatever path two members take, if their homes see each other
        // their positions are within may_see.
        let g = Grid::new(p(20_000, 20_000), 1_000);
        let mut near = 0;
        let mut rng = 7_u64;
        let mut next = |n: u32| {
            rng = rng.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            u32::try_from((rng >> 33) % u64::from(n)).unwrap_or(0)
        };
        for _ in 0..200 {
            // Two members starting near each other, so that their walks
            // cross the radius and the band many times.
            let mut a = p(next(20_000), next(20_000));
            let mut b = p(
                (a.x + next(4_001)).saturating_sub(2_000).min(20_000),
                (a.y + next(4_001)).saturating_sub(2_000).min(20_000),
            );
            let (mut ha, mut hb) = (g.cell_of(a), g.cell_of(b));
            for _ in 0..400 {
                a = p(
                    (a.x + next(401)).saturating_sub(200).min(20_000),
                    (a.y + next(401)).saturating_sub(200).min(20_000),
                );
                b = p(
                    (b.x + next(401)).saturating_sub(200).min(20_000),
                    (b.y + next(401)).saturating_sub(200).min(20_000),
                );
                ha = g.rehome(ha, a);
                hb = g.rehome(hb, b);
                if Grid::sees(ha, hb) {
                    assert!(g.may_see(a, b), "{a:?} in {ha:?} sees {b:?} in {hb:?}");
                }
                if g.must_see(a, b) {
                    assert!(Grid::sees(ha, hb), "{a:?} in {ha:?} misses {b:?} in {hb:?}");
                    near += 1;
                }
            }
        }
        assert!(
            near > 1_000,
            "the walks met within the radius only {near} times"
        );
    }
}
