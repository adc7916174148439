//! Waiting for the clock, done by the caller.
//!
//! A generator sometimes cannot hand out ids yet: the tick is full, a batch
//! needs ticks that have not come, or the clock stepped back and the policy
//! says wait. The `try_` calls ([`Generator::try_next_ids`],
//! [`ObjectIdGenerator::try_next_id`]) never sleep: they answer
//! [`Step::Wait`] with how long to wait, and the caller waits however suits
//! it (a thread sleep, a tokio timer) and calls again with the same
//! [`Attempt`]. The blocking calls (`next_id`, `next_ids`) are that loop with
//! a thread sleep ([`block_on`]).
//!
//! The [`Attempt`] carries the call's bound: its first wait fixes a budget
//! (the time its ticks need plus the stall timeout), and a call past it fails
//! with [`GenerateError::ClockStalled`]. Dropping an attempt abandons the
//! call; ids it had claimed are skipped, never handed out.
//!
//! [`Generator::try_next_ids`]: crate::Generator::try_next_ids
//! [`ObjectIdGenerator::try_next_id`]: crate::ObjectIdGenerator::try_next_id

use std::time::{Duration, Instant};

use crate::error::GenerateError;

/// The answer of a call that never sleeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step<T> {
    /// Done.
    Ready(T),
    /// Wait this long, then call again with the same [`Attempt`].
    Wait(Duration),
}

/// One call's progress across its waits; see the module docs.
#[derive(Debug, Default)]
pub struct Attempt {
    /// When the first wait began, and how long the call may wait in all.
    deadline: Option<(Instant, Duration)>,
    /// The latest tick a precise clock reading showed this call.
    pub(crate) seen: u64,
    /// Packed `(start, end)` values claimed ahead of the clock, not yet handed out.
    pub(crate) claimed: Option<(u64, u64)>,
    spins: u32,
}

impl Attempt {
    /// A call that has not waited yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Asks the caller to wait `ahead` (until the clock reaches what the call
    /// needs), or fails once the call has waited past its budget, which its
    /// first wait sets to `ahead + stall`.
    pub(crate) fn wait(
        &mut self,
        ahead: Duration,
        stall: Duration,
    ) -> Result<Duration, GenerateError> {
        let (started, budget) = *self
            .deadline
            .get_or_insert_with(|| (Instant::now(), ahead.saturating_add(stall)));
        let waited = started.elapsed();
        if waited >= budget {
            return Err(GenerateError::ClockStalled {
                waited_ms: u64::try_from(waited.as_millis()).unwrap_or(u64::MAX),
            });
        }
        Ok(ahead.min(budget - waited))
    }
}

/// Runs a `try_` call to completion on this thread: short waits spin, then
/// yield; longer ones sleep, leaving a millisecond to spin out precisely.
pub fn block_on<T>(
    mut call: impl FnMut(&mut Attempt) -> Result<Step<T>, GenerateError>,
) -> Result<T, GenerateError> {
    let mut attempt = Attempt::new();
    loop {
        match call(&mut attempt)? {
            Step::Ready(v) => return Ok(v),
            Step::Wait(d) if d > Duration::from_millis(2) => {
                std::thread::sleep(d - Duration::from_millis(1));
            }
            Step::Wait(_) if attempt.spins < 64 => {
                attempt.spins += 1;
                std::hint::spin_loop();
            }
            Step::Wait(_) => std::thread::yield_now(),
        }
    }
}
