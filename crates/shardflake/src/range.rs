//! Ids by time: the smallest and largest id a layout makes in a span of
//! time, so "rows from last week" is a range scan on the id's index
//! (`WHERE id BETWEEN first AND last`), and how long a layout has left.
//!
//! Two caveats hold for every layout:
//!
//! - **Ticks.** An id records the tick it was made in, not the millisecond.
//!   A range covers whole ticks: ids made in the tick that holds `from`,
//!   before `from`, are in it too (at most one tick early).
//! - **Sign.** A layout that uses all 64 bits with time on top (Instagram's)
//!   makes ids that are negative as a signed `bigint` from
//!   [`Layout::negative_from_ms`] on. A range that crosses that time is one
//!   range of unsigned ids but two of signed ones:
//!   [`IdRange::signed_ranges`] gives them.
//!
//! A layout with a node or shard field above the time field keeps no time
//! order across that field, so a span of time is not one range of ids:
//! those layouts are refused with [`TimeRangeError::FieldAboveTime`].

use std::ops::{Range, RangeInclusive};

use crate::error::TimeRangeError;
use crate::id::Id;
use crate::layout::{Layout, mask};

/// The ids a layout makes in a span of time, both ends included.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IdRange {
    /// The smallest id of the span's first tick.
    pub first: Id,
    /// The largest id of the span's last tick.
    pub last: Id,
}

impl IdRange {
    /// Whether `id` is in the range.
    pub fn contains(&self, id: Id) -> bool {
        self.first <= id && id <= self.last
    }

    /// The range as a signed `bigint` column stores it: one range, or two
    /// when it crosses into ids with the sign bit set (the non-negative part
    /// first, then the negative one). Query with `id BETWEEN a AND b OR id
    /// BETWEEN c AND d`; a single `BETWEEN first AND last` of the wrapped
    /// values would be empty.
    ///
    /// ```
    /// use shardflake::{Id, range::IdRange};
    /// let r = IdRange { first: Id(5), last: Id(1 << 63) };
    /// assert_eq!(r.signed_ranges(), vec![5..=i64::MAX, i64::MIN..=i64::MIN]);
    /// ```
    pub fn signed_ranges(&self) -> Vec<RangeInclusive<i64>> {
        let (first, last) = (self.first.as_i64(), self.last.as_i64());
        if (first < 0) == (last < 0) {
            vec![first..=last]
        } else {
            vec![first..=i64::MAX, i64::MIN..=last]
        }
    }
}

impl Layout {
    /// The tick that holds `unix_ms`, or why it has none.
    fn tick_for_range(&self, unix_ms: u64) -> Result<u64, TimeRangeError> {
        if self.time().shift() + self.time().bits() != self.total_bits() {
            return Err(TimeRangeError::FieldAboveTime {
                layout: self.name().to_string(),
                field: self.fields()[0].name().to_string(),
            });
        }
        let tick = self
            .unix_ms_to_tick(unix_ms)
            .ok_or_else(|| TimeRangeError::BeforeEpoch {
                layout: self.name().to_string(),
                unix_ms,
                epoch_ms: self.epoch_ms(),
            })?;
        if tick > self.max_tick() {
            return Err(TimeRangeError::AfterEndOfLife {
                layout: self.name().to_string(),
                unix_ms,
                end_ms: self.end_of_life_ms(),
            });
        }
        Ok(tick)
    }

    /// The smallest id the layout can make at `unix_ms`: the first id of the
    /// tick that holds it, so ids made earlier in that tick are at or above
    /// it too. `WHERE id >= min_id_at(t)` finds every row made from `t` on.
    ///
    /// ```
    /// let layout = shardflake::preset::by_name("snowflake")?;
    /// let id = layout.min_id_at(1_700_000_000_000)?;
    /// assert_eq!(id.decode(&layout)?.unix_ms, 1_700_000_000_000);
    /// assert_eq!(id.decode(&layout)?.sequence, 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn min_id_at(&self, unix_ms: u64) -> Result<Id, TimeRangeError> {
        let tick = self.tick_for_range(unix_ms)?;
        Ok(Id(tick << self.time().shift()))
    }

    /// The largest id the layout can make at `unix_ms`: the last id of the
    /// tick that holds it (every field below time at its maximum).
    pub fn max_id_at(&self, unix_ms: u64) -> Result<Id, TimeRangeError> {
        let tick = self.tick_for_range(unix_ms)?;
        let shift = self.time().shift();
        Ok(Id((tick << shift) | mask(shift)))
    }

    /// The ids made in the half-open span `from_ms..to_ms` (Unix ms): from
    /// the first id of `from_ms`'s tick to the last id of the tick of the
    /// span's last millisecond. An id is in the range exactly when its tick
    /// overlaps the span. The span must lie in the layout's life:
    /// `epoch_ms <= from_ms < to_ms <= end_of_life_ms`.
    ///
    /// ```
    /// let layout = shardflake::preset::by_name("instagram")?;
    /// let day = 86_400_000;
    /// let from = 1_700_000_000_000;
    /// let range = layout.id_range(from..from + day)?;
    /// let id = layout.compose(from + 5, &layout.nodes(&[("shard", 7)])?, 3)?;
    /// assert!(range.contains(id));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn id_range(&self, span: Range<u64>) -> Result<IdRange, TimeRangeError> {
        if span.start >= span.end {
            return Err(TimeRangeError::NotBefore {
                from_ms: span.start,
                to_ms: span.end,
            });
        }
        let first = self.min_id_at(span.start)?;
        // `to` may be the end of life itself: the span ends before it.
        let last = self.max_id_at(span.end - 1)?;
        Ok(IdRange { first, last })
    }

    /// The first Unix millisecond whose ids no longer fit a signed `bigint`
    /// column: the earlier of the end of life and
    /// [`Layout::negative_from_ms`] (the epoch, for a layout with a field
    /// above time that holds the sign bit).
    pub fn lifetime_end_ms(&self) -> u128 {
        match self.negative_from_ms() {
            Some(negative) => u128::from(negative).min(self.end_of_life_ms()),
            None => self.end_of_life_ms(),
        }
    }

    /// Milliseconds from `now_ms` to [`Layout::lifetime_end_ms`]; zero once
    /// past it.
    pub fn lifetime_left_ms(&self, now_ms: u64) -> u128 {
        self.lifetime_end_ms().saturating_sub(u128::from(now_ms))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::preset;
    use proptest::prelude::*;

    fn custom() -> Layout {
        // Node field below the sequence, 100 ms ticks, 64 bits in use.
        Layout::builder("custom")
            .epoch_ms(1_500_000_000_000)
            .tick_ms(100)
            .time(40)
            .sequence(9)
            .node("zone", 15)
            .build_at(1_600_000_000_000)
            .unwrap()
    }

    fn layouts() -> Vec<Layout> {
        let mut all = preset::all();
        all.push(custom());
        all
    }

    /// An id of `tick` with arbitrary values in every field below time,
    /// decoded back to check it says that tick.
    fn id_of_tick(layout: &Layout, tick: u64, low: u64) -> Id {
        let shift = layout.time().shift();
        let id = Id((tick << shift) | (low & mask(shift)));
        let parts = id.decode(layout).unwrap();
        assert_eq!(parts.tick, tick);
        id
    }

    /// Times worth testing: the epoch, the end of life, the first negative
    /// tick, tick boundaries around `t`.
    fn edge_times(layout: &Layout, t: u64) -> Vec<u64> {
        let eol = u64::try_from(layout.end_of_life_ms()).unwrap();
        let tick = layout.tick_ms();
        let start = t - (t - layout.epoch_ms()) % tick;
        let mut times = vec![layout.epoch_ms(), eol - 1, t, start, start + tick - 1];
        if let Some(negative) = layout.negative_from_ms() {
            times.extend([negative - 1, negative, negative + tick - 1]);
        }
        times.retain(|&x| x >= layout.epoch_ms() && x < eol);
        times
    }

    /// The property: an id is in `id_range(from..to)` exactly when its tick
    /// overlaps the span, checked on decoded ids in, at and next to the
    /// span's first and last ticks; and its signed ranges hold the same ids.
    fn check_span(layout: &Layout, from: u64, to: u64, low: u64) {
        let range = layout.id_range(from..to).unwrap();
        let first_tick = layout.unix_ms_to_tick(from).unwrap();
        let last_tick = layout.unix_ms_to_tick(to - 1).unwrap();
        let mut ticks = vec![first_tick, last_tick];
        for t in [first_tick, last_tick] {
            ticks.extend([t.wrapping_sub(1), t + 1]);
        }
        ticks.retain(|&t| t <= layout.max_tick());
        for tick in ticks {
            for low in [0, u64::MAX, low] {
                let id = id_of_tick(layout, tick, low);
                let starts = layout.tick_to_unix_ms(tick);
                let overlaps = starts < to && starts + layout.tick_ms() > from;
                assert_eq!(
                    range.contains(id),
                    overlaps,
                    "{layout}: id {id} (tick {tick}) in {from}..{to} -> {range:?}"
                );
                let signed = range
                    .signed_ranges()
                    .iter()
                    .any(|r| r.contains(&id.as_i64()));
                assert_eq!(signed, overlaps, "{layout}: signed {id} {range:?}");
            }
        }
    }

    proptest! {
        #[test]
        fn ranges_hold_exactly_the_ids_of_their_ticks(
            which in 0usize..8,
            a in any::<u64>(),
            b in any::<u64>(),
            low in any::<u64>(),
            edge_a in any::<prop::sample::Index>(),
            edge_b in any::<prop::sample::Index>(),
        ) {
            let layout = &layouts()[which % layouts().len()];
            let eol = u64::try_from(layout.end_of_life_ms()).unwrap();
            let life = eol - layout.epoch_ms();
            let a = layout.epoch_ms() + a % life;
            let b = layout.epoch_ms() + b % life;
            // Half the cases at edges (epoch, end, sign, tick bounds).
            let a = if low % 2 == 0 { *edge_a.get(&edge_times(layout, a)) } else { a };
            let b = if low % 4 < 2 { *edge_b.get(&edge_times(layout, b)) } else { b };
            let (from, to) = (a.min(b), a.max(b) + 1);
            check_span(layout, from, to, low);
        }
    }

    #[test]
    fn every_layout_at_its_edges() {
        for layout in layouts() {
            let eol = u64::try_from(layout.end_of_life_ms()).unwrap();
            let epoch = layout.epoch_ms();
            check_span(&layout, epoch, epoch + 1, 12345);
            check_span(&layout, epoch, eol, 12345);
            check_span(&layout, eol - 1, eol, 12345);
            assert_eq!(layout.min_id_at(epoch).unwrap(), Id(0));
            assert_eq!(layout.max_id_at(eol - 1).unwrap(), Id(layout.max_id()));
            if let Some(negative) = layout.negative_from_ms() {
                let r = layout.id_range(negative - 1..negative + 1).unwrap();
                assert_eq!(r.signed_ranges().len(), 2, "{layout}");
                assert!(layout.min_id_at(negative).unwrap().as_i64() < 0);
                assert!(layout.max_id_at(negative - 1).unwrap().as_i64() > 0);
            }
        }
    }

    #[test]
    fn times_outside_the_life_and_reversed_spans_are_typed_errors() {
        let layout = preset::by_name("sonyflake").unwrap();
        let epoch = layout.epoch_ms();
        let eol = u64::try_from(layout.end_of_life_ms()).unwrap();
        assert_eq!(
            layout.min_id_at(epoch - 1),
            Err(TimeRangeError::BeforeEpoch {
                layout: "sonyflake".into(),
                unix_ms: epoch - 1,
                epoch_ms: epoch,
            })
        );
        assert_eq!(
            layout.max_id_at(eol),
            Err(TimeRangeError::AfterEndOfLife {
                layout: "sonyflake".into(),
                unix_ms: eol,
                end_ms: u128::from(eol),
            })
        );
        assert!(layout.id_range(epoch..eol).is_ok());
        assert!(matches!(
            layout.id_range(epoch..eol + 1),
            Err(TimeRangeError::AfterEndOfLife { .. })
        ));
        assert_eq!(
            layout.id_range(epoch + 5..epoch + 5),
            Err(TimeRangeError::NotBefore {
                from_ms: epoch + 5,
                to_ms: epoch + 5,
            })
        );
        let shard_on_top = Layout::builder("top")
            .node("shard", 1)
            .time(40)
            .sequence(10)
            .build_at(1)
            .unwrap();
        let err = shard_on_top.min_id_at(5).unwrap_err();
        assert_eq!(
            err,
            TimeRangeError::FieldAboveTime {
                layout: "top".into(),
                field: "shard".into(),
            }
        );
        assert!(err.to_string().contains("shard"));
    }

    #[test]
    fn lifetime_left_ends_at_the_sign_bit_or_the_end_of_life() {
        let instagram = preset::by_name("instagram").unwrap();
        let negative = instagram.negative_from_ms().unwrap();
        assert_eq!(instagram.lifetime_left_ms(negative - 10), 10);
        assert_eq!(instagram.lifetime_left_ms(negative + 10), 0);
        let sony = preset::by_name("sonyflake").unwrap();
        let eol = sony.end_of_life_ms();
        assert_eq!(sony.lifetime_left_ms(eol as u64 - 7), 7);
    }
}
