//! Ids for rows from the past: a generator that takes each id's time from
//! the row it is for, so imported rows sort among the others by their
//! original time.
//!
//! # What makes it safe
//!
//! An id is unique when its (tick, node values, sequence) is. A
//! [`Backfill`] holds:
//!
//! - **A node id of its own.** The backfill makes ids for one set of node
//!   values, which no live generator may use for any time the rows hold nor
//!   while the backfill runs: reserve a node id for backfills (leave it out
//!   of the fleet's range, or hold it as a live node would). Ids of every
//!   other node id differ from the backfill's in their node bits.
//! - **A counter per tick.** Rows come in any order, so the backfill keeps,
//!   for each tick it has used, the next sequence value (a map tick → next
//!   sequence: one entry per distinct tick used, 16 bytes and the map's
//!   overhead). A tick's ids are 0, 1, 2, … in the order its rows come;
//!   none is handed out twice.
//! - **Its counters kept across runs.** A backfill stopped in the middle
//!   and run again must start from the counters the first run left, or it
//!   repeats its ids: [`Backfill::used`] lists them and
//!   [`Backfill::restore`] takes them back (the `shardflake backfill`
//!   command keeps them in a state file, written before any id is printed).
//!
//! # What it refuses
//!
//! - **A time that is not in the past:** a time in the tick that holds
//!   `now_ms` (given at construction) or later is
//!   [`BackfillError::NotInPast`]. Live ids are made at the present tick
//!   and after, so the backfill never makes an id a live generator could
//!   make later, even one that takes the backfill's node id once the
//!   backfill is over.
//! - **A full tick:** the tick's sequence is used up
//!   ([`BackfillError::TickFull`]). The id is not moved to the next tick,
//!   which would change the row's time; spread such rows over a longer
//!   span yourself, or use a layout with a wider sequence.
//! - A time before the layout's epoch or after its end of life
//!   ([`BackfillError::Time`]).
//!
//! Every tick's sequence starts at 0: the layout's random start
//! ([`crate::LayoutBuilder::random_start`]) is not applied to backfilled ids.
//!
//! ```
//! use shardflake::{backfill::Backfill, preset};
//!
//! let layout = preset::by_name("snowflake")?;
//! let nodes = layout.nodes(&[("node", 1023)])?; // reserved for backfills
//! let mut backfill = Backfill::new(layout.clone(), nodes, 1_700_000_000_000);
//! let a = backfill.id_at(1_600_000_000_000)?;
//! let b = backfill.id_at(1_500_000_000_000)?;
//! let c = backfill.id_at(1_600_000_000_000)?;
//! assert!(b < a && a < c);
//! assert_eq!(a.decode(&layout)?.unix_ms, 1_600_000_000_000);
//! assert_eq!(c.decode(&layout)?.sequence, 1);
//! assert!(backfill.id_at(1_700_000_000_000).is_err()); // not in the past
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::HashMap;

use crate::error::{BackfillError, TimeRangeError};
use crate::id::{Id, NodeBits};
use crate::layout::Layout;

/// Makes ids at the times of past rows, in any order, never one twice.
/// See the [module documentation](self) for what it holds and refuses.
#[derive(Debug, Clone)]
pub struct Backfill {
    layout: Layout,
    nodes: NodeBits,
    now_ms: u64,
    /// The first tick refused: the one that holds `now_ms`.
    present_tick: u64,
    /// Tick → the next sequence value to hand out in it.
    next: HashMap<u64, u64>,
}

impl Backfill {
    /// A backfill for the node values `nodes` (from [`Layout::nodes`]),
    /// taking times before the tick that holds `now_ms`.
    pub fn new(layout: Layout, nodes: NodeBits, now_ms: u64) -> Self {
        // Before the epoch there is no past to fill: tick 0 is refused too.
        let present_tick = layout.unix_ms_to_tick(now_ms).unwrap_or(0);
        Backfill {
            layout,
            nodes,
            now_ms,
            present_tick,
            next: HashMap::new(),
        }
    }

    /// The layout.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The node values every id carries.
    pub fn nodes(&self) -> NodeBits {
        self.nodes
    }

    /// The next id of the tick that holds `unix_ms`.
    pub fn id_at(&mut self, unix_ms: u64) -> Result<Id, BackfillError> {
        let tick = self.tick(unix_ms)?;
        let next = self.next.entry(tick).or_insert(0);
        if *next >= self.layout.ids_per_tick() {
            return Err(BackfillError::TickFull {
                unix_ms,
                tick,
                ids_per_tick: self.layout.ids_per_tick(),
            });
        }
        let sequence = *next;
        *next += 1;
        Ok(Id(self.layout.pack(tick, sequence) | self.nodes.get()))
    }

    /// The tick of `unix_ms`, if the backfill may use it.
    fn tick(&self, unix_ms: u64) -> Result<u64, BackfillError> {
        let layout = &self.layout;
        let tick = layout
            .unix_ms_to_tick(unix_ms)
            .ok_or_else(|| TimeRangeError::BeforeEpoch {
                layout: layout.name().to_string(),
                unix_ms,
                epoch_ms: layout.epoch_ms(),
            })?;
        if tick >= self.present_tick {
            return Err(BackfillError::NotInPast {
                unix_ms,
                now_ms: self.now_ms,
            });
        }
        if tick > layout.max_tick() {
            return Err(TimeRangeError::AfterEndOfLife {
                layout: layout.name().to_string(),
                unix_ms,
                end_ms: layout.end_of_life_ms(),
            }
            .into());
        }
        Ok(tick)
    }

    /// The next sequence value of `tick` (0 for a tick not used yet).
    pub fn next_sequence(&self, tick: u64) -> u64 {
        self.next.get(&tick).copied().unwrap_or(0)
    }

    /// Every tick used so far and its next sequence value, in no order:
    /// what a later run must [`restore`](Backfill::restore).
    pub fn used(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.next.iter().map(|(&tick, &next)| (tick, next))
    }

    /// Takes back a tick's counter from an earlier run: the tick's next
    /// sequence becomes at least `next` (a counter never goes back).
    pub fn restore(&mut self, tick: u64, next: u64) -> Result<(), BackfillError> {
        if tick > self.layout.max_tick() || next > self.layout.ids_per_tick() {
            return Err(BackfillError::BadCounter {
                tick,
                next,
                max_tick: self.layout.max_tick(),
                ids_per_tick: self.layout.ids_per_tick(),
            });
        }
        let counter = self.next.entry(tick).or_insert(0);
        *counter = (*counter).max(next);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::preset;

    fn sonyflake() -> (Layout, Backfill) {
        let layout = preset::by_name("sonyflake").unwrap();
        let nodes = layout.nodes(&[("machine", 9)]).unwrap();
        let now = layout.epoch_ms() + 1_000_000;
        (layout.clone(), Backfill::new(layout, nodes, now))
    }

    #[test]
    fn a_full_tick_is_refused_and_its_neighbours_are_not() {
        let (layout, mut backfill) = sonyflake();
        let t = layout.epoch_ms() + 500_003; // tick 50,000 (10 ms ticks)
        for sequence in 0..layout.ids_per_tick() {
            let id = backfill.id_at(t).unwrap();
            assert_eq!(id.decode(&layout).unwrap().sequence, sequence);
        }
        assert_eq!(
            backfill.id_at(t + 6),
            Err(BackfillError::TickFull {
                unix_ms: t + 6,
                tick: 50_000,
                ids_per_tick: 256,
            })
        );
        assert!(backfill.id_at(t + 7).is_ok()); // the next tick
        assert!(backfill.id_at(t - 4).is_ok()); // the tick before
    }

    #[test]
    fn the_present_tick_the_future_and_before_the_epoch_are_refused() {
        let (layout, mut backfill) = sonyflake();
        let now = layout.epoch_ms() + 1_000_000;
        assert_eq!(
            backfill.id_at(now),
            Err(BackfillError::NotInPast {
                unix_ms: now,
                now_ms: now
            })
        );
        assert!(backfill.id_at(now + 86_400_000).is_err());
        assert!(backfill.id_at(now - 10).is_ok()); // the tick before now's
        let err = backfill.id_at(layout.epoch_ms() - 1).unwrap_err();
        assert!(matches!(
            err,
            BackfillError::Time(TimeRangeError::BeforeEpoch { .. })
        ));
        // A clock past the end of life: the end itself is still refused.
        let eol = u64::try_from(layout.end_of_life_ms()).unwrap();
        let mut late = Backfill::new(layout.clone(), backfill.nodes(), eol + 100);
        assert!(matches!(
            late.id_at(eol),
            Err(BackfillError::Time(TimeRangeError::AfterEndOfLife { .. }))
        ));
        assert!(late.id_at(eol - 1).is_ok());
    }

    #[test]
    fn restored_counters_continue_and_never_go_back() {
        let (layout, mut first) = sonyflake();
        let t = layout.epoch_ms() + 12_340;
        let a: Vec<Id> = (0..3).map(|_| first.id_at(t).unwrap()).collect();
        let (_, mut second) = sonyflake();
        for (tick, next) in first.used() {
            second.restore(tick, next).unwrap();
            second.restore(tick, 1).unwrap(); // lower: ignored
        }
        let b = second.id_at(t).unwrap();
        assert!(!a.contains(&b));
        assert_eq!(b.decode(&layout).unwrap().sequence, 3);
        assert!(matches!(
            second.restore(1, 257),
            Err(BackfillError::BadCounter { .. })
        ));
    }
}
