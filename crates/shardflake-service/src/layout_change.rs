//! A fleet's later layout must not make an id an earlier layout could have
//! made: the new layout's ids from a time on are compared with every id the
//! old one could have made until then.
//!
//! Fields are disjoint bit ranges, so the largest id a layout makes with its
//! clock at or before a time sets the time field to that tick and every other
//! field to its largest value, and the smallest id it makes from a time on
//! sets the time field to that tick and every other field to zero, whatever
//! the order of the fields.

use shardflake::Layout;

/// What a change from one layout to another allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayoutChange {
    /// The largest id the old layout could have made until `until_ms`.
    pub old_max_id: u64,
    /// The smallest id the new layout makes from `from_ms` on.
    pub new_min_id: u64,
    /// The last Unix ms whose ids under the new layout may be at or below
    /// `old_max_id`: the new layout's ids are all above it after this ms.
    /// `None`: never (the new layout's time field cannot get there).
    pub unsafe_until_ms: Option<u64>,
    /// The latest epoch the new layout (its fields and tick as they are)
    /// could have for its ids from `from_ms` on to be above `old_max_id`;
    /// `None`: no epoch will do.
    pub latest_epoch_ms: Option<u64>,
}

impl LayoutChange {
    /// The old layout made ids until `until_ms` (its last holder's
    /// high-water, or now); the new one makes ids from `from_ms` on.
    pub fn new(old: &Layout, until_ms: u64, new: &Layout, from_ms: u64) -> LayoutChange {
        let old_max_id = largest_id_until(old, until_ms);
        let new_min_id = smallest_id_from(new, from_ms);
        let time = new.time();
        // The first tick of the new layout whose smallest id is above.
        let first_tick = (old_max_id >> time.shift())
            .checked_add(1)
            .filter(|&t| t <= time.max());
        let unsafe_until_ms = first_tick.map(|t| new.tick_to_unix_ms(t).saturating_sub(1));
        let latest_epoch_ms = first_tick
            .and_then(|t| t.checked_mul(new.tick_ms()))
            .and_then(|ms| from_ms.checked_sub(ms));
        LayoutChange {
            old_max_id,
            new_min_id,
            unsafe_until_ms,
            latest_epoch_ms,
        }
    }

    /// Every id of the new layout from `from_ms` on is above every id of the
    /// old one until `until_ms`.
    pub fn is_safe(&self) -> bool {
        self.new_min_id > self.old_max_id
    }
}

/// The largest id `layout` can have made with its clock at or before
/// `unix_ms` (0 before its epoch: it made none).
pub fn largest_id_until(layout: &Layout, unix_ms: u64) -> u64 {
    let Some(tick) = layout.unix_ms_to_tick(unix_ms) else {
        return 0;
    };
    layout.fields().iter().fold(0, |id, field| {
        let value = if field.name() == layout.time().name() {
            tick.min(field.max())
        } else {
            field.max()
        };
        id | (value << field.shift())
    })
}

/// The smallest id `layout` makes with its clock at or after `unix_ms`.
pub fn smallest_id_from(layout: &Layout, unix_ms: u64) -> u64 {
    let tick = layout.unix_ms_to_tick(unix_ms).unwrap_or(0);
    let time = layout.time();
    tick.min(time.max()) << time.shift()
}

#[cfg(test)]
mod tests {
    use super::*;
    use shardflake::preset::resolve;

    fn layout(epoch_ms: u64) -> Layout {
        resolve(&format!(
            "l: time 41 | node 10 | sequence 12 (epoch {epoch_ms} ms)"
        ))
        .unwrap()
    }

    #[test]
    fn a_later_epoch_makes_the_ids_of_before_again() {
        let now = 1_700_000_000_000;
        let old = layout(1_600_000_000_000);
        // 15 s later: the new ids of now are the old ones of 15 s ago.
        let later = LayoutChange::new(&old, now, &layout(1_600_000_015_000), now);
        assert!(!later.is_safe());
        assert_eq!(later.unsafe_until_ms, Some(now + 15_000));
        assert_eq!(later.latest_epoch_ms, Some(1_600_000_000_000 - 1));
        // The same epoch: the same ids.
        assert!(!LayoutChange::new(&old, now, &old, now).is_safe());
        // An earlier epoch: above.
        let earlier = LayoutChange::new(&old, now, &layout(1_599_999_990_000), now);
        assert!(earlier.is_safe());
        assert!(earlier.unsafe_until_ms.unwrap() < now);
    }

    #[test]
    fn ids_above_every_field_and_a_field_order_that_puts_time_low() {
        let old = resolve("o: node 4 | time 40 | sequence 19 (epoch 0 ms)").unwrap();
        // Node above time: the largest old id has every node bit set.
        assert_eq!(largest_id_until(&old, 5) >> 59, 0b1111);
        assert_eq!(
            largest_id_until(&old, 5) & ((1 << 59) - 1),
            (5 << 19) | ((1 << 19) - 1)
        );
        // A new layout whose time field cannot go above: no epoch helps.
        let new = resolve("n: time 30 | node 4 | sequence 19 (epoch 0 ms)").unwrap();
        let change = LayoutChange::new(&old, 5, &new, 5);
        assert!(!change.is_safe());
        assert_eq!(change.latest_epoch_ms, None);
        // Before its epoch a layout made nothing.
        assert_eq!(largest_id_until(&layout(100), 99), 0);
    }
}
