//! Which turns a window shows once the budget leaves older ones out: the
//! newest run that fits (`sliding`, the budget rule alone), or that run
//! from a stride boundary on (`stable`), so that consecutive reads of a
//! growing conversation begin with the same turns until the boundary
//! moves, and a provider's prompt cache keeps serving their prefix.
//!
//! The rule, written once here and applied by every selection after its
//! budget (`Selector`, the template selector, the cut of a loaded
//! tokenizer's counts): let `s` be the seq of the oldest turn of the run
//! the budget kept (the reserved first turn and the summary are not in
//! the run: they stay in front), and `B` the first seq at or above `s`
//! with `B ≡ 1 (mod stride)`. The stable window is the run's turns with
//! `seq ≥ B`; when none is (a run of fewer turns than a stride), or when
//! the budget left no turn out, it is the whole run. Seqs are absolute:
//! neither a range read nor a summary's rewrite moves the boundaries.
//!
//! So the window is a suffix of what fit: never over a bound, never a
//! gap, and at most `stride − 1` turns fewer than sliding. As the
//! conversation grows, `s` does not move back (a fixed budget holds no
//! more of the older turns once a newer one joins), so `B` stays put
//! until `s` passes it, then moves one stride: about one read in
//! `stride` begins with other turns than the read before.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// How a read's window moves: `sliding` or `stable`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum WindowKind {
    #[default]
    Sliding,
    Stable,
}

/// A read's window, validated: a stable one's stride is at least 2 (a
/// stride of 1 is sliding).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Window {
    #[default]
    Sliding,
    Stable {
        stride: u64,
    },
}

impl Window {
    pub fn is_stable(self) -> bool {
        matches!(self, Window::Stable { .. })
    }

    /// How many of the oldest turns of `run` (the seqs of the newest run
    /// the budget kept, oldest first, the reserved first turn not among
    /// them) the window leaves out. `stopped`: the budget left turns out.
    pub fn drops(self, run: impl IntoIterator<Item = u64>, stopped: bool) -> usize {
        let Window::Stable { stride } = self else {
            return 0;
        };
        if !stopped {
            return 0;
        }
        let mut run = run.into_iter();
        let Some(oldest) = run.next() else {
            return 0;
        };
        let boundary = boundary_from(oldest, stride);
        if oldest >= boundary {
            return 0;
        }
        (1..)
            .zip(run)
            .find(|&(_, seq)| seq >= boundary)
            .map_or(0, |(below, _)| below)
    }
}

/// The first seq at or above `seq` that begins a stride (`≡ 1 mod stride`).
pub fn boundary_from(seq: u64, stride: u64) -> u64 {
    let s = seq.max(1) - 1;
    s.div_ceil(stride).saturating_mul(stride).saturating_add(1)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn boundaries_begin_strides() {
        assert_eq!(boundary_from(1, 10), 1);
        assert_eq!(boundary_from(2, 10), 11);
        assert_eq!(boundary_from(10, 10), 11);
        assert_eq!(boundary_from(11, 10), 11);
        assert_eq!(boundary_from(12, 10), 21);
        assert_eq!(boundary_from(0, 4), 1);
        assert_eq!(boundary_from(u64::MAX, 2), u64::MAX);
    }

    #[test]
    fn a_stable_window_begins_at_the_boundary() {
        let w = Window::Stable { stride: 10 };
        assert_eq!(w.drops(14..=30, true), 7, "from 21");
        assert_eq!(w.drops(11..=30, true), 0, "on a boundary");
        assert_eq!(w.drops(14..=20, true), 0, "no boundary in the run");
        assert_eq!(w.drops(14..=21, true), 7, "only the boundary's turn");
        assert_eq!(w.drops(14..=30, false), 0, "every candidate fits");
        assert_eq!(w.drops([14, 15, 23, 24], true), 2, "a gap: from 23");
        assert_eq!(Window::Sliding.drops(14..=30, true), 0);
        assert_eq!(w.drops(std::iter::empty(), true), 0);
    }

    /// The oldest seq of the newest run that fits `budget`, among turns
    /// 1..=newest of these costs: the sliding rule.
    fn sliding_start(costs: &[u64], newest: usize, budget: u64) -> Option<u64> {
        let mut sum = 0;
        let mut start = None;
        for seq in (1..=newest).rev() {
            sum += costs[seq - 1];
            if sum > budget {
                break;
            }
            start = Some(seq as u64);
        }
        start
    }

    proptest! {
        /// Replays a growing conversation of random turn costs under a
        /// fixed budget: each window is a suffix of the sliding one, at
        /// most a stride shorter, and begins where the previous one began
        /// until its boundary is passed.
        #[test]
        fn a_growing_conversation_keeps_its_window_between_boundaries(
            costs in prop::collection::vec(1u64..50, 1..120),
            budget in 1u64..400,
            stride in 2u64..16,
        ) {
            let w = Window::Stable { stride };
            let mut previous: Option<(u64, u64)> = None; // (window start, boundary)
            for newest in 1..=costs.len() {
                let Some(s) = sliding_start(&costs, newest, budget) else {
                    previous = None;
                    continue;
                };
                let run: Vec<u64> = (s..=newest as u64).collect();
                let stopped = s > 1;
                let dropped = w.drops(run.iter().copied(), stopped);
                prop_assert!(dropped < run.len(), "never empty");
                prop_assert!(dropped < stride as usize, "at most a stride fewer");
                let start = run[dropped];
                let spent: u64 = costs[start as usize - 1..newest].iter().sum();
                prop_assert!(spent <= budget, "within the budget");
                if dropped > 0 {
                    prop_assert_eq!((start - 1) % stride, 0, "on a boundary");
                }
                let boundary = boundary_from(s, stride);
                if let Some((before, _)) = previous {
                    prop_assert!(start >= before, "it does not move back");
                    // While the boundary is still ahead of the sliding
                    // start and inside the run, the window stays.
                    if stopped && before == boundary && boundary <= newest as u64 {
                        prop_assert_eq!(start, before);
                    }
                }
                previous = Some((start, boundary));
            }
        }
    }
}
