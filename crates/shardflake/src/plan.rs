//! Capacity planning: what a layout allows, and a layout for a need.

use crate::error::LayoutError;
use crate::layout::Layout;

/// What a layout allows.
#[derive(Debug, Clone, PartialEq)]
pub struct Capacity {
    /// Ids per tick per node.
    pub ids_per_tick: u64,
    /// Ids per second per node.
    pub ids_per_second: f64,
    /// Distinct nodes.
    pub nodes: u128,
    /// First Unix ms the layout cannot represent.
    pub end_of_life_ms: u128,
    /// First Unix ms whose ids are negative as a signed `bigint`.
    pub negative_from_ms: Option<u64>,
    /// First Unix ms whose ids reach 2^53 (unsafe in JavaScript).
    pub js_unsafe_from_ms: Option<u64>,
}

impl Layout {
    /// This layout's capacity.
    pub fn capacity(&self) -> Capacity {
        Capacity {
            ids_per_tick: self.ids_per_tick(),
            ids_per_second: self.ids_per_second(),
            nodes: self.node_count(),
            end_of_life_ms: self.end_of_life_ms(),
            negative_from_ms: self.negative_from_ms(),
            js_unsafe_from_ms: self.js_unsafe_from_ms(),
        }
    }
}

/// What a deployment needs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Need {
    /// Nodes that generate at once.
    pub nodes: u64,
    /// Peak ids per second on one node.
    pub rate_per_node: f64,
    /// Years the layout must last.
    pub years: f64,
    /// The epoch, Unix ms (usually the start of the project).
    pub epoch_ms: u64,
}

const MS_PER_YEAR: f64 = 365.25 * 24.0 * 3600.0 * 1000.0;

/// Bits needed to count `n` values (a fraction of a value counts as one
/// more: 4.2 ticks need 5); 65 (too many) for anything past `u64`.
fn bits_for(n: f64) -> u32 {
    let n = n.ceil();
    if n <= 1.0 {
        0
    } else if n.is_finite() && n <= 2f64.powi(64) {
        (n - 1.0).log2().floor() as u32 + 1
    } else {
        65
    }
}

/// The smallest layout (sign bit kept clear) that meets `need`, trying tick
/// lengths of 1, 2, 5, 10, 100 and 1000 ms; spare bits widen the sequence.
///
/// ```
/// use shardflake::plan::{suggest, Need};
/// let l = suggest(&Need { nodes: 1000, rate_per_node: 4_000_000.0, years: 69.0, epoch_ms: 1_288_834_974_657 })?;
/// assert_eq!(l.to_string(), "suggested: time 41 | node 10 | sequence 12 (epoch 1288834974657 ms, tick 1 ms)");
/// # Ok::<(), shardflake::LayoutError>(())
/// ```
pub fn suggest(need: &Need) -> Result<Layout, LayoutError> {
    // In integers: `nodes as f64` rounds above 2^53, so 2^54 nodes got 55
    // bits (`2^54 - 1.0` is 2^54 in f64), one more than they need.
    let node_bits = match need.nodes {
        0 | 1 => 0,
        n => 64 - (n - 1).leading_zeros(),
    };
    let mut widest = 0;
    for tick_ms in [1u64, 2, 5, 10, 100, 1000] {
        let time_bits = bits_for(need.years * MS_PER_YEAR / tick_ms as f64).max(1);
        let seq_bits = bits_for(need.rate_per_node * tick_ms as f64 / 1000.0).max(1);
        let used = time_bits + node_bits + seq_bits;
        widest = widest.max(used);
        if used <= 63 {
            let mut b = Layout::builder("suggested")
                .epoch_ms(need.epoch_ms)
                .tick_ms(tick_ms)
                .time(time_bits);
            if node_bits > 0 {
                b = b.node("node", node_bits);
            }
            return b.sequence(seq_bits + (63 - used)).build_at(u64::MAX);
        }
    }
    Err(LayoutError::TooWide {
        bits: u64::from(widest) + 1,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by `cargo fuzz` (target `plan`): a need of 4.96 ticks got a
    /// 2-bit time field (4 ticks), so the layout ran out before the years
    /// asked for.
    #[test]
    fn a_fraction_of_a_tick_counts_as_a_whole_one() {
        assert_eq!((bits_for(4.0), bits_for(4.2), bits_for(4.96)), (2, 3, 3));
        assert_eq!((bits_for(0.5), bits_for(1.5), bits_for(2.0)), (0, 1, 1));
        let need = Need {
            nodes: 795_741_901_218_119_680,
            rate_per_node: 1.8e-255,
            years: 7.870_588_816_848_456e-10,
            epoch_ms: 795_741_901_218_843_403,
        };
        let l = suggest(&need).unwrap();
        let lasts_ms = l.end_of_life_ms() - u128::from(need.epoch_ms);
        assert!(lasts_ms as f64 >= need.years * MS_PER_YEAR, "{l}");
    }

    #[test]
    fn node_bits_are_counted_exactly() {
        for nodes in [2, 3, 1024, 1025, (1 << 53) + 1, 1 << 54, u64::MAX] {
            let need = Need {
                nodes,
                rate_per_node: 0.0,
                years: 0.0,
                epoch_ms: 0,
            };
            let Ok(l) = suggest(&need) else {
                assert!(nodes > 1 << 61, "{nodes}");
                continue;
            };
            assert!(l.node_count() >= u128::from(nodes), "{nodes}: {l}");
            assert!(l.node_count() < 2 * u128::from(nodes), "{nodes}: {l}");
        }
    }

    #[test]
    fn suggests_the_smallest_tick_that_fits() {
        let need = Need {
            nodes: 65536,
            rate_per_node: 25_600.0,
            years: 174.0,
            epoch_ms: 0,
        };
        let l = suggest(&need).unwrap();
        // 174 years of 1 ms ticks need 43 bits, 2 ms ticks 42: neither fits with
        // 16 node bits and the sequence; 5 ms ticks do.
        assert_eq!(l.tick_ms(), 5);
        assert!(l.ids_per_second() >= need.rate_per_node);
        assert!(l.node_count() >= 65536);
        assert!(l.end_of_life_ms() as f64 >= need.years * MS_PER_YEAR);
        let huge = Need {
            nodes: u64::MAX,
            rate_per_node: 1e12,
            years: 1e6,
            epoch_ms: 0,
        };
        assert!(matches!(suggest(&huge), Err(LayoutError::TooWide { .. })));
        // Needs past any float's integer range are refused, not wrapped.
        for (rate, years) in [(f64::INFINITY, 1.0), (1.0, 1e300), (1e308, 1.0)] {
            let need = Need {
                nodes: 1,
                rate_per_node: rate,
                years,
                epoch_ms: 0,
            };
            assert!(
                matches!(suggest(&need), Err(LayoutError::TooWide { .. })),
                "{rate} {years}"
            );
        }
    }
}
