//! The id generator: lock-free, bounded in every wait.
//!
//! State is one atomic word, the last issued `(tick, sequence)` packed as
//! `tick << sequence_bits | sequence`. A call reads the clock, computes the
//! next run of that packed counter and claims it with one compare-and-swap,
//! so ids come out in the order the swaps succeed: **any id returned before
//! another call starts is smaller than that call's id**, on every thread.
//! Node bits are constant, so the id grows with the packed counter.
//!
//! Twitter Snowflake's rules ("Announcing Snowflake", 2010, and its
//! `IdWorker`) are the defaults: a new tick
//! restarts the sequence at 0; a full sequence waits for the next tick; a
//! clock behind the last issued tick is an error. A layout with a random
//! start ([`crate::LayoutBuilder::random_start`]) starts each tick at a
//! keyed hash of the tick instead, the same for every call, and runs up
//! from there: the packed counter only grows, so no value is used twice. [`ExhaustedPolicy`] and
//! [`RollbackPolicy`] relax them, always within a bound: no call spins or
//! sleeps for longer than its policy allows plus the stall timeout.
//!
//! A call that must wait (a full tick, a batch wider than the ticks lived
//! through, a clock behind under [`RollbackPolicy::Wait`]) first **claims**
//! its ids with its one swap, then waits until the clock reaches the last
//! of them: a call never competes twice for the same ids, so a batch
//! completes in the time its ticks need however many other calls run
//! meanwhile, and ids are still never handed out ahead of the clock (beyond
//! the lead a policy allows). The `try_` calls leave the waiting to the
//! caller (an async runtime, say); see [`crate::wait`].
//!
//! [`LocalGenerator`] is the fastest mode, for one thread: it reserves small
//! blocks from the shared generator and hands them out without atomics,
//! each only while the clock reads its block's tick. Its ids increase on its
//! own thread only.

use std::time::Duration;

use crate::clock::{Clock, MonotonicClock};
use crate::error::{GenerateError, IdError};
use crate::id::{Id, NodeBits};
use crate::layout::{Layout, mask};
use crate::sync::{AtomicU64, Ordering};
use crate::wait::{Attempt, Step, block_on};

/// What to do when a tick's sequence runs out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ExhaustedPolicy {
    /// Wait for the next tick (Snowflake's behaviour).
    #[default]
    Wait,
    /// Take sequence values of future ticks while the generator is at most
    /// `max_lead` ahead of the clock, then wait.
    Borrow {
        /// How far ahead of the clock ids may be stamped.
        max_lead: Duration,
    },
}

/// What to do when the clock reads earlier than the last issued tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RollbackPolicy {
    /// Refuse with [`GenerateError::ClockMovedBackwards`] (Snowflake's behaviour).
    #[default]
    Error,
    /// Wait for the clock to catch up if it is at most `max` behind; refuse beyond.
    Wait {
        /// Longest rollback to wait out.
        max: Duration,
    },
    /// Keep issuing on the last tick (its sequence, then borrowed ticks)
    /// while the clock is at most `max` behind; refuse beyond.
    ///
    /// A generator cannot tell a tick it borrowed from a clock that stepped
    /// back, so this also lets a full tick borrow up to `max` ahead of the
    /// clock, as [`ExhaustedPolicy::Borrow`] would: the lead it may reach is
    /// the sum of the two bounds.
    Continue {
        /// Longest rollback to ride through.
        max: Duration,
    },
}

/// Counters of the cold paths, for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stats {
    /// Calls that found their tick's sequence used up.
    pub exhaustions: u64,
    /// Calls that found the clock behind the last issued tick.
    pub clock_behind: u64,
    /// Calls refused because the clock was behind by more than allowed.
    pub rollback_errors: u64,
}

/// Builds a [`Generator`]; see [`Generator::builder`].
#[derive(Debug, Clone)]
pub struct GeneratorBuilder<C = MonotonicClock> {
    layout: Layout,
    nodes: Vec<(String, u64)>,
    clock: C,
    exhausted: ExhaustedPolicy,
    rollback: RollbackPolicy,
    max_batch: u64,
    stall_timeout: Duration,
    resume_after_ms: Option<u64>,
}

impl<C: Clock> GeneratorBuilder<C> {
    /// Sets a node or shard field (`node`, `datacenter`, `shard`, ...).
    pub fn node(mut self, field: impl Into<String>, value: u64) -> Self {
        self.nodes.push((field.into(), value));
        self
    }
    /// Uses another clock.
    pub fn clock<D: Clock>(self, clock: D) -> GeneratorBuilder<D> {
        GeneratorBuilder {
            layout: self.layout,
            nodes: self.nodes,
            clock,
            exhausted: self.exhausted,
            rollback: self.rollback,
            max_batch: self.max_batch,
            stall_timeout: self.stall_timeout,
            resume_after_ms: self.resume_after_ms,
        }
    }
    /// What to do when a tick's sequence runs out.
    pub fn on_exhausted(mut self, policy: ExhaustedPolicy) -> Self {
        self.exhausted = policy;
        self
    }
    /// What to do when the clock goes backwards.
    pub fn on_rollback(mut self, policy: RollbackPolicy) -> Self {
        self.rollback = policy;
        self
    }
    /// Largest batch [`Generator::next_ids`] hands out (default 1,048,576).
    pub fn max_batch(mut self, max: u64) -> Self {
        self.max_batch = max;
        self
    }
    /// How long a wait may go on with the clock not advancing before it
    /// fails with [`GenerateError::ClockStalled`] (default 1 s).
    pub fn stall_timeout(mut self, timeout: Duration) -> Self {
        self.stall_timeout = timeout;
        self
    }
    /// Treats every tick up to and including the one holding `unix_ms` as
    /// used: a restarted node passes its recorded high-water time here so it
    /// never reissues a tick its previous life may have used.
    pub fn resume_after(mut self, unix_ms: u64) -> Self {
        self.resume_after_ms = Some(unix_ms);
        self
    }

    /// Checks the node values against the layout and builds.
    pub fn build(self) -> Result<Generator<C>, IdError> {
        let values: Vec<(&str, u64)> = self.nodes.iter().map(|(n, v)| (n.as_str(), *v)).collect();
        let node_bits = self.layout.nodes(&values)?;
        let seq_bits = self.layout.sequence().bits();
        // Nothing is ever stamped before the generator was built (a batch
        // may take recent ticks, but only ones this generator has lived
        // through), so a process started after another's last tick has
        // passed can never reuse it; nor at or before a recorded high-water.
        let max_tick = self.layout.max_tick();
        let to_tick = |ms: u64| self.layout.unix_ms_to_tick(ms).map(|t| t.min(max_tick));
        let built =
            to_tick(self.clock.now_ms_precise()).map_or(0, |t| (t << seq_bits).saturating_sub(1));
        let resumed = self
            .resume_after_ms
            .and_then(to_tick)
            .map_or(0, |t| (t << seq_bits) | mask(seq_bits));
        let state = built.max(resumed);
        let ticks = |d: Duration| millis(d).div_ceil(self.layout.tick_ms());
        let borrow = match self.exhausted {
            ExhaustedPolicy::Wait => 0,
            ExhaustedPolicy::Borrow { max_lead } => ticks(max_lead),
        };
        let ride = match self.rollback {
            RollbackPolicy::Continue { max } => ticks(max),
            _ => 0,
        };
        Ok(Generator {
            state: Padded(AtomicU64::new(state)),
            clock: self.clock,
            node_bits,
            epoch_ms: self.layout.epoch_ms(),
            tick_ms: self.layout.tick_ms(),
            seq_bits,
            seq_mask: mask(seq_bits),
            time_shift: self.layout.time().shift(),
            seq_shift: self.layout.sequence().shift(),
            max_tick,
            fast_ticks: if self.layout.tick_ms() == 1 {
                max_tick.saturating_add(1)
            } else {
                0
            },
            start_mask: mask(self.layout.random_start_bits()),
            start_key: if self.layout.random_start_bits() > 0 {
                random_key()
            } else {
                0
            },
            borrow_ticks: borrow,
            allowed_lead: borrow.saturating_add(ride),
            rollback: self.rollback,
            max_batch: self.max_batch,
            stall_timeout: self.stall_timeout,
            exhaustions: AtomicU64::new(0),
            clock_behind: AtomicU64::new(0),
            rollback_errors: AtomicU64::new(0),
            claimed_until: AtomicU64::new(0),
            claim_reading: AtomicU64::new(0),
            layout: self.layout,
        })
    }
}

/// Keeps the hot atomic on its own cache line, away from the read-only fields.
#[derive(Debug)]
#[repr(align(128))]
struct Padded<T>(T);

/// A thread-safe, lock-free id generator for one node.
///
/// ```
/// use shardflake::{preset, Generator};
///
/// let generator = Generator::builder(preset::by_name("snowflake")?)
///     .node("node", 7)
///     .build()?;
/// let a = generator.next_id()?;
/// let b = generator.next_id()?;
/// assert!(a < b);
/// assert_eq!(b.decode(generator.layout())?.field("node"), Some(7));
/// let batch = generator.next_ids(1000)?;
/// assert_eq!(batch.iter().count(), 1000);
/// assert!(batch.first() > b);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct Generator<C = MonotonicClock> {
    state: Padded<AtomicU64>,
    clock: C,
    node_bits: NodeBits,
    epoch_ms: u64,
    tick_ms: u64,
    seq_bits: u32,
    seq_mask: u64,
    time_shift: u32,
    seq_shift: u32,
    max_tick: u64,
    /// Ticks the fast path of `next_id` serves, `max_tick + 1`; 0 (none)
    /// unless the tick is 1 ms.
    fast_ticks: u64,
    /// The layout's random start: each tick's first sequence value is a
    /// keyed hash of the tick, masked by `start_mask` (0: off).
    start_mask: u64,
    start_key: u64,
    borrow_ticks: u64,
    allowed_lead: u64,
    rollback: RollbackPolicy,
    max_batch: u64,
    stall_timeout: Duration,
    exhaustions: AtomicU64,
    clock_behind: AtomicU64,
    rollback_errors: AtomicU64,
    /// The latest tick any call claimed ahead of the clock, and the latest
    /// precise reading such a call made: state ahead of the clock up to
    /// `claimed_until` is explained by claims, not a clock step, as long as
    /// the clock has not gone back from `claim_reading`.
    claimed_until: AtomicU64,
    claim_reading: AtomicU64,
    layout: Layout,
}

/// A run of consecutive `(tick, sequence)` values from one reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Batch {
    start: u64,
    end: u64,
    seq_bits: u32,
    time_shift: u32,
    seq_shift: u32,
    node_bits: u64,
}

impl Batch {
    /// Number of ids.
    pub fn len(&self) -> u64 {
        self.end - self.start + 1
    }
    /// Never true: a batch holds at least one id.
    pub fn is_empty(&self) -> bool {
        false
    }
    /// The smallest id.
    pub fn first(&self) -> Id {
        self.id(self.start)
    }
    /// The largest id.
    pub fn last(&self) -> Id {
        self.id(self.end)
    }
    /// Every id, ascending.
    pub fn iter(&self) -> BatchIter {
        BatchIter {
            range: self.start..=self.end,
            batch: *self,
        }
    }
    #[inline]
    fn id(&self, packed: u64) -> Id {
        let tick = packed >> self.seq_bits;
        let seq = packed & mask(self.seq_bits);
        Id((tick << self.time_shift) | (seq << self.seq_shift) | self.node_bits)
    }
}

impl IntoIterator for Batch {
    type Item = Id;
    type IntoIter = BatchIter;
    fn into_iter(self) -> BatchIter {
        self.iter()
    }
}

/// The ids of a [`Batch`], ascending.
#[derive(Debug, Clone)]
pub struct BatchIter {
    range: std::ops::RangeInclusive<u64>,
    batch: Batch,
}

impl Iterator for BatchIter {
    type Item = Id;
    #[inline]
    fn next(&mut self) -> Option<Id> {
        self.range.next().map(|packed| self.batch.id(packed))
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        self.range.size_hint()
    }
}

impl Generator<MonotonicClock> {
    /// Starts a generator for `layout` on the process's monotonic clock,
    /// with Snowflake's policies.
    pub fn builder(layout: Layout) -> GeneratorBuilder<MonotonicClock> {
        Generator::with_clock(layout, MonotonicClock::new())
    }
}

impl<C: Clock> Generator<C> {
    /// Starts a generator for `layout` on `clock`, with Snowflake's policies.
    pub fn with_clock(layout: Layout, clock: C) -> GeneratorBuilder<C> {
        GeneratorBuilder {
            layout,
            nodes: Vec::new(),
            clock,
            exhausted: ExhaustedPolicy::Wait,
            rollback: RollbackPolicy::Error,
            max_batch: 1 << 20,
            stall_timeout: Duration::from_secs(1),
            resume_after_ms: None,
        }
    }
}

impl<C: Clock> Generator<C> {
    /// The layout.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }
    /// The clock.
    pub fn clock(&self) -> &C {
        &self.clock
    }
    /// The packed node fields.
    pub fn node_bits(&self) -> NodeBits {
        self.node_bits
    }
    /// Largest batch allowed.
    pub fn max_batch(&self) -> u64 {
        self.max_batch
    }
    /// Cold-path counters.
    pub fn stats(&self) -> Stats {
        Stats {
            exhaustions: self.exhaustions.load(Ordering::Relaxed),
            clock_behind: self.clock_behind.load(Ordering::Relaxed),
            rollback_errors: self.rollback_errors.load(Ordering::Relaxed),
        }
    }
    /// Unix millisecond of the last issued tick's end: every id issued so
    /// far has a time before it. Persist it (plus a window) as a high-water
    /// mark and pass it to [`GeneratorBuilder::resume_after`] after a restart.
    pub fn high_water_ms(&self) -> u64 {
        let tick = self.state.0.load(Ordering::Acquire) >> self.seq_bits;
        self.layout.tick_to_unix_ms(tick.saturating_add(1)) - 1
    }
    /// How far the generator's last tick is ahead of the clock: borrowed,
    /// ridden through a rollback, or claimed by a call still waiting for it.
    pub fn lead(&self) -> Duration {
        let tick = self.state.0.load(Ordering::Relaxed) >> self.seq_bits;
        let now = self.tick(self.clock.now_ms_precise()).unwrap_or(0);
        Duration::from_millis(tick.saturating_sub(now) * self.tick_ms)
    }

    /// The next id.
    #[inline]
    pub fn next_id(&self) -> Result<Id, GenerateError> {
        // Small enough to inline into every caller, across crates: the
        // common case in registers, everything else out of line.
        match self.next_fast() {
            Some(packed) => Ok(self.id(packed)),
            None => self.next_id_slow(),
        }
    }

    /// The common case of [`Generator::next_id`], or `None`: a 1 ms tick,
    /// the clock within the layout's life, the next value of the clock's
    /// tick free, and the swap won. Anything else, a lost race included,
    /// takes the full path.
    #[inline(always)]
    fn next_fast(&self) -> Option<u64> {
        let cur = self.state.0.load(Ordering::Acquire);
        // Before the epoch the subtraction wraps past `fast_ticks`, which is
        // 0 unless the tick is 1 ms: one comparison for all three guards.
        let now = self.clock.now_ms().wrapping_sub(self.epoch_ms);
        if now >= self.fast_ticks {
            return None;
        }
        let tick_start = now << self.seq_bits;
        let next = if cur >= tick_start {
            // The tick's last value taken (or a later tick's): full path.
            if cur >= tick_start | self.seq_mask {
                return None;
            }
            cur + 1
        } else {
            tick_start | self.random_start(now)
        };
        self.state
            .0
            .compare_exchange(cur, next, Ordering::AcqRel, Ordering::Relaxed)
            .ok()
            .map(|_| next)
    }

    /// [`Generator::next_id`]'s full path: claims, waits and refusals.
    #[cold]
    #[inline(never)]
    fn next_id_slow(&self) -> Result<Id, GenerateError> {
        let (start, _) = block_on(|a| self.try_reserve(1, false, a))?;
        Ok(self.id(start))
    }

    /// `count` ids reserved in one step: consecutive sequence values, over as
    /// few ticks as the layout allows (the most recent ones when the count
    /// spans several).
    ///
    /// A batch may only use ticks the generator has lived through (or may
    /// borrow), so a batch wider than that claims the ticks it needs and
    /// waits for the clock to reach them: about `count / ids per tick` ticks
    /// (256 ms for 2^20 `snowflake` ids), plus what calls claimed before
    /// it, within the stall timeout, whatever other calls run meanwhile.
    /// Keep [`GeneratorBuilder::max_batch`] to what a caller may wait for.
    pub fn next_ids(&self, count: u64) -> Result<Batch, GenerateError> {
        block_on(|a| self.try_next_ids(count, a))
    }

    /// [`Generator::next_ids`] that never sleeps: [`Step::Wait`] asks the
    /// caller to wait and call again with the same `attempt` (see
    /// [`crate::wait`]). Dropping the attempt abandons the ids it claimed.
    ///
    /// ```
    /// use shardflake::{preset, Generator};
    /// use shardflake::wait::{Attempt, Step};
    ///
    /// let generator = Generator::builder(preset::by_name("snowflake")?).node("node", 1).build()?;
    /// let mut attempt = Attempt::new();
    /// let batch = loop {
    ///     match generator.try_next_ids(10_000, &mut attempt)? {
    ///         Step::Ready(batch) => break batch,
    ///         Step::Wait(d) => std::thread::sleep(d), // or an async timer
    ///     }
    /// };
    /// assert_eq!(batch.len(), 10_000);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn try_next_ids(
        &self,
        count: u64,
        attempt: &mut Attempt,
    ) -> Result<Step<Batch>, GenerateError> {
        if count == 0 || count > self.max_batch {
            return Err(GenerateError::InvalidCount {
                requested: count,
                max: self.max_batch,
            });
        }
        Ok(match self.try_reserve(count, false, attempt)? {
            Step::Ready((start, end)) => Step::Ready(self.batch(start, end)),
            Step::Wait(d) => Step::Wait(d),
        })
    }

    /// A handle for one thread that reserves `block` ids at a time (at most
    /// a tick's worth) and hands them out without touching shared state,
    /// each stamped with the tick the clock reads when it is handed out
    /// (see [`LocalGenerator`]). Ids increase per handle; across threads
    /// only the blocks are ordered.
    pub fn local(&self, block: u64) -> LocalGenerator<'_, C> {
        LocalGenerator {
            generator: self,
            block: block.clamp(1, 1 << self.seq_bits),
            next: 0,
            left: 0,
            step: 1 << self.seq_shift,
            from_ms: 0,
            window_ms: 0,
        }
    }

    fn batch(&self, start: u64, end: u64) -> Batch {
        Batch {
            start,
            end,
            seq_bits: self.seq_bits,
            time_shift: self.time_shift,
            seq_shift: self.seq_shift,
            node_bits: self.node_bits.get(),
        }
    }

    #[inline]
    fn id(&self, packed: u64) -> Id {
        let tick = packed >> self.seq_bits;
        let seq = packed & self.seq_mask;
        Id((tick << self.time_shift) | (seq << self.seq_shift) | self.node_bits.get())
    }

    /// The first sequence value of `tick`: 0, or with the layout's random
    /// start, the same keyed hash of the tick for every call.
    #[inline]
    fn random_start(&self, tick: u64) -> u64 {
        if self.start_mask == 0 {
            return 0;
        }
        mix(tick ^ self.start_key) & self.start_mask
    }

    /// The packed value after `packed`: the next sequence value, or, where
    /// that begins a new tick, the tick's start. `None` past the last value.
    #[inline]
    fn successor(&self, packed: u64) -> Option<u64> {
        let next = packed.checked_add(1)?;
        Some(match next & mask(self.seq_bits) {
            0 => next | self.random_start(next >> self.seq_bits),
            _ => next,
        })
    }

    #[inline]
    fn tick(&self, unix_ms: u64) -> Result<u64, GenerateError> {
        let ms = unix_ms
            .checked_sub(self.epoch_ms)
            .ok_or(GenerateError::BeforeEpoch {
                now_ms: unix_ms,
                epoch_ms: self.epoch_ms,
            })?;
        Ok(if self.tick_ms == 1 {
            ms
        } else {
            ms / self.tick_ms
        })
    }

    /// Claims `count` consecutive packed values; returns the first and last
    /// once the clock allows them. With `within_tick`, the run stops at the
    /// end of its first tick.
    #[inline]
    fn try_reserve(
        &self,
        count: u64,
        within_tick: bool,
        attempt: &mut Attempt,
    ) -> Result<Step<(u64, u64)>, GenerateError> {
        if let Some(claim) = attempt.claimed {
            return self.await_claim(claim, attempt);
        }
        // Ticks a batch needs; it may be stamped with that many recent ticks.
        // (A shift, not a division: this is the hot path.)
        let span = (count.saturating_sub(1) >> self.seq_bits) + 1;
        let mut cur = self.state.0.load(Ordering::Acquire);
        loop {
            let cur_tick = cur >> self.seq_bits;
            // The cached reading may lag a precise one this call already made.
            let mut now = self.tick(self.clock.now_ms())?.max(attempt.seen);
            if now < cur_tick {
                // The cached reading may lag, or another thread read a later
                // clock: only a precise reading tells a real rollback.
                now = self.tick(self.clock.now_ms_precise())?;
            }
            if now > self.max_tick {
                return Err(self.exhausted_epoch());
            }
            let first_tick = (now + 1).saturating_sub(span);
            let floor = (first_tick << self.seq_bits) | self.random_start(first_tick);
            let start = self
                .successor(cur)
                .ok_or_else(|| self.exhausted_epoch())?
                .max(floor);
            let mut end = start
                .checked_add(count - 1)
                .ok_or_else(|| self.exhausted_epoch())?;
            if within_tick {
                end = end.min(start | mask(self.seq_bits));
            }
            let end_tick = end >> self.seq_bits;
            if end_tick > self.max_tick {
                return Err(self.exhausted_epoch());
            }
            let ahead = end_tick > now.saturating_add(self.allowed_lead);
            if ahead {
                // Loaded before the precise reading below, so a claim they
                // show was made on a reading taken before ours.
                let claimed_until = self.claimed_until.load(Ordering::Acquire);
                let claim_reading = self.claim_reading.load(Ordering::Acquire);
                let precise = self.tick(self.clock.now_ms_precise())?;
                if precise > now {
                    // Only the cached reading was behind: try again with the
                    // precise one (no wait, no exhaustion).
                    attempt.seen = precise;
                    cur = self.state.0.load(Ordering::Acquire);
                    continue;
                }
                let reading =
                    self.check_rollback(cur_tick, precise, claimed_until, claim_reading, span)?;
                // Published before the swap: a caller that sees the claim in
                // the state also sees why the state is ahead of the clock.
                self.claimed_until.fetch_max(end_tick, Ordering::AcqRel);
                self.claim_reading.fetch_max(reading, Ordering::AcqRel);
            }
            match self
                .state
                .0
                .compare_exchange_weak(cur, end, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) if !ahead => return Ok(Step::Ready((start, end))),
                Ok(_) => {
                    attempt.claimed = Some((start, end));
                    return self.await_claim((start, end), attempt);
                }
                Err(actual) => cur = actual,
            }
        }
    }

    /// The cold path: a run lies ahead of the clock beyond the allowed lead.
    /// Tells a clock that stepped back (refused or waited out, by policy)
    /// from ticks that earlier calls claimed or borrowed (waited for).
    /// Returns the latest tick the clock is known to have read.
    #[cold]
    #[inline(never)]
    fn check_rollback(
        &self,
        cur_tick: u64,
        now: u64,
        claimed_until: u64,
        claim_reading: u64,
        span: u64,
    ) -> Result<u64, GenerateError> {
        let (behind, reading) = self.stepped_back(cur_tick, now, claimed_until, claim_reading);
        if behind > 0 {
            self.clock_behind.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(reading) = reading {
            let behind_ms = behind.saturating_mul(self.tick_ms);
            if self.refuses(behind_ms) {
                self.rollback_errors.fetch_add(1, Ordering::Relaxed);
                return Err(GenerateError::ClockMovedBackwards { behind_ms });
            }
            return Ok(reading);
        }
        if span == 1 {
            // A call that fits in one tick found the ticks up to now used.
            self.exhaustions.fetch_add(1, Ordering::Relaxed);
        }
        Ok(now)
    }

    /// How far (ticks) the clock reading `now` is behind the state, and, if
    /// it stepped back, the latest tick it is known to have read before.
    fn stepped_back(
        &self,
        cur_tick: u64,
        now: u64,
        claimed_until: u64,
        claim_reading: u64,
    ) -> (u64, Option<u64>) {
        // State up to a claimed tick is ahead because calls claimed it, not
        // because the clock went back: measure the clock against the reading
        // those claims were made on. Past it, against the state itself, of
        // which only borrowing explains a lead.
        if cur_tick <= claimed_until {
            let behind = claim_reading.saturating_sub(now);
            (behind, (behind > 0).then_some(claim_reading))
        } else {
            let behind = cur_tick.saturating_sub(now);
            let stepped = behind > self.borrow_ticks;
            (behind, stepped.then(|| cur_tick - self.borrow_ticks))
        }
    }

    /// Whether the rollback policy refuses a clock `behind_ms` behind.
    fn refuses(&self, behind_ms: u64) -> bool {
        match self.rollback {
            RollbackPolicy::Error => true,
            RollbackPolicy::Wait { max } | RollbackPolicy::Continue { max } => {
                behind_ms > millis(max)
            }
        }
    }

    /// Whether a call made now would be refused because of the clock:
    /// before the epoch, or stepped back further than the rollback policy
    /// allows. Takes no id; a readiness probe asks this.
    pub fn check_clock(&self) -> Result<(), GenerateError> {
        let cur_tick = self.state.0.load(Ordering::Acquire) >> self.seq_bits;
        let claimed_until = self.claimed_until.load(Ordering::Acquire);
        let claim_reading = self.claim_reading.load(Ordering::Acquire);
        let now = self.tick(self.clock.now_ms_precise())?;
        match self.stepped_back(cur_tick, now, claimed_until, claim_reading) {
            (behind, Some(_)) if self.refuses(behind.saturating_mul(self.tick_ms)) => {
                Err(GenerateError::ClockMovedBackwards {
                    behind_ms: behind.saturating_mul(self.tick_ms),
                })
            }
            _ => Ok(()),
        }
    }

    /// A claimed run is handed out once the clock reaches its last tick
    /// (less the allowed lead); until then the caller waits.
    fn await_claim(
        &self,
        (start, end): (u64, u64),
        attempt: &mut Attempt,
    ) -> Result<Step<(u64, u64)>, GenerateError> {
        let target = (end >> self.seq_bits).saturating_sub(self.allowed_lead);
        let now_ms = self.clock.now_ms_precise();
        let now = self.tick(now_ms)?;
        if now >= target {
            // The clock read this far: a later step back is measured from here.
            self.claim_reading.fetch_max(now, Ordering::AcqRel);
            attempt.claimed = None;
            return Ok(Step::Ready((start, end)));
        }
        attempt.seen = attempt.seen.max(now);
        let target_ms = self
            .epoch_ms
            .saturating_add(target.saturating_mul(self.tick_ms));
        let ahead = Duration::from_millis(target_ms.saturating_sub(now_ms).max(1));
        Ok(Step::Wait(attempt.wait(ahead, self.stall_timeout)?))
    }

    #[cold]
    fn exhausted_epoch(&self) -> GenerateError {
        GenerateError::EpochExhausted {
            layout: self.layout.name().to_string(),
            end_ms: self.layout.end_of_life_ms(),
        }
    }
}

/// One thread's handle on a shared [`Generator`]; see [`Generator::local`].
///
/// It holds one block, a run of sequence values of one tick, and hands out
/// an id of it only while the clock reads that tick: the same cached clock
/// reading the shared calls take, checked against the block's window with
/// one subtraction and one comparison. A clock past the window (the next
/// tick, or a step forward) or before it (a step back) ends the block, and
/// the next id comes from a new block reserved from the shared generator,
/// whose policies then apply: [`RollbackPolicy::Error`] refuses a clock
/// stepped back, `Wait` waits, `Continue` rides on. The window starts
/// earlier only by the lead those policies allow ids to have on the clock,
/// so a block is handed out exactly where a shared call would hand out an
/// id of its tick.
#[derive(Debug)]
pub struct LocalGenerator<'g, C = MonotonicClock> {
    generator: &'g Generator<C>,
    block: u64,
    /// The block's next id, as the id itself: within a tick the next id is
    /// one sequence `step` above the last.
    next: u64,
    left: u64,
    step: u64,
    /// Clock readings (Unix ms) at which the block may be handed out:
    /// `from_ms` and the `window_ms - 1` after it.
    from_ms: u64,
    window_ms: u64,
}

impl<C: Clock> LocalGenerator<'_, C> {
    /// The next id; larger than every id this handle returned before.
    #[inline]
    pub fn next_id(&mut self) -> Result<Id, GenerateError> {
        let now_ms = self.generator.clock.now_ms();
        // Before the window, the subtraction wraps to a number past it.
        if self.left > 0 && now_ms.wrapping_sub(self.from_ms) < self.window_ms {
            return Ok(self.take());
        }
        self.refill()
    }

    #[inline]
    fn take(&mut self) -> Id {
        let id = Id(self.next);
        self.left -= 1;
        // Past the block's last id only once `left` is 0, never read then.
        self.next = self.next.wrapping_add(self.step);
        id
    }

    /// The cold path: the cached reading is outside the block's tick, or the
    /// block is spent.
    #[cold]
    #[inline(never)]
    fn refill(&mut self) -> Result<Id, GenerateError> {
        let g = self.generator;
        // The cached reading may lag a precise one another call made (and
        // reserved this block's tick with): only a precise reading ends it.
        if self.left > 0 && g.clock.now_ms_precise().wrapping_sub(self.from_ms) < self.window_ms {
            return Ok(self.take());
        }
        let (start, end) = block_on(|a| g.try_reserve(self.block, true, a))?;
        let tick = start >> g.seq_bits;
        // The layout keeps every tick's end within u64 milliseconds.
        let from_tick = tick.saturating_sub(g.allowed_lead);
        self.from_ms = g.epoch_ms + from_tick * g.tick_ms;
        self.window_ms = (tick - from_tick + 1) * g.tick_ms;
        self.next = g.id(start).get();
        self.left = end - start + 1;
        Ok(self.take())
    }
}

/// A 64-bit mixing function (splitmix64's finalizer): every input bit
/// moves about half the output bits, so consecutive ticks get unrelated
/// starts.
#[inline]
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A generator's key for its random starts: from the operating system, or,
/// where it has none to give, the clock's nanoseconds (the starts need to
/// differ between generators, not to be secret).
fn random_key() -> u64 {
    getrandom::u64().unwrap_or_else(|_| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    })
}

/// Whole milliseconds of `d`, saturating (a `Duration` can hold more).
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
