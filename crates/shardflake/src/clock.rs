//! Clocks: where a generator's time comes from.
//!
//! - [`SystemClock`]: the wall clock (`SystemTime`), read on every call. It
//!   follows NTP steps, backwards too, which the generator's
//!   [`RollbackPolicy`](crate::RollbackPolicy) then handles.
//! - [`MonotonicClock`]: the wall clock read once at start, advanced by the
//!   monotonic clock. Never goes backwards within a process. Reading it is one
//!   atomic load: a shared ticker thread refreshes it every 100 µs, because a
//!   real clock read (~30 ns here) would cost more than the rest of
//!   `next_id`. Generators read it precisely while they wait for a tick.
//! - [`ManualClock`]: set by hand, for tests.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::sync::{AtomicU64, Ordering};

/// A source of Unix milliseconds.
pub trait Clock: Send + Sync {
    /// Milliseconds since the Unix epoch; cheap, and may lag real time by
    /// a fraction of a millisecond.
    fn now_ms(&self) -> u64;

    /// Milliseconds since the Unix epoch, read exactly. Generators call it
    /// when [`Clock::now_ms`] looks behind and while they wait for a tick.
    fn now_ms_precise(&self) -> u64 {
        self.now_ms()
    }
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now_ms(&self) -> u64 {
        (**self).now_ms()
    }
    fn now_ms_precise(&self) -> u64 {
        (**self).now_ms_precise()
    }
}

/// The operating system's wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        system_ms()
    }
}

fn system_ms() -> u64 {
    // A clock before 1970 reads as 0, which every layout treats as before its epoch.
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Wall time at process start plus monotonic time since; see the module docs.
#[derive(Debug, Clone, Copy)]
pub struct MonotonicClock {
    ticker: &'static Ticker,
}

#[derive(Debug)]
struct Ticker {
    start: Instant,
    start_unix_ms: u64,
    now: std::sync::atomic::AtomicU64,
}

impl Ticker {
    fn precise(&self) -> u64 {
        self.start_unix_ms + self.start.elapsed().as_millis() as u64
    }
}

impl MonotonicClock {
    /// The process-wide monotonic clock (starts its ticker on first use).
    pub fn new() -> Self {
        static TICKER: OnceLock<&'static Ticker> = OnceLock::new();
        let ticker = *TICKER.get_or_init(|| {
            let ticker: &'static Ticker = Box::leak(Box::new(Ticker {
                start: Instant::now(),
                start_unix_ms: system_ms(),
                now: std::sync::atomic::AtomicU64::new(0),
            }));
            ticker.now.store(ticker.precise(), Ordering::Relaxed);
            // If the thread cannot start, readings fall back to precise ones.
            let _ = std::thread::Builder::new()
                .name("shardflake-clock".into())
                .spawn(move || {
                    loop {
                        std::thread::sleep(Duration::from_micros(100));
                        // A store, even of the same value, takes the cache
                        // line from every core reading it: write only a new
                        // millisecond.
                        let now = ticker.precise();
                        if now != ticker.now.load(Ordering::Relaxed) {
                            ticker.now.store(now, Ordering::Relaxed);
                        }
                    }
                })
                .map_err(|_| ticker.now.store(u64::MAX, Ordering::Relaxed));
            ticker
        });
        MonotonicClock { ticker }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    #[inline]
    fn now_ms(&self) -> u64 {
        match self.ticker.now.load(Ordering::Relaxed) {
            u64::MAX => self.ticker.precise(),
            ms => ms,
        }
    }
    fn now_ms_precise(&self) -> u64 {
        self.ticker.precise()
    }
}

/// A clock that only moves when told to; clones share one reading.
///
/// ```
/// use shardflake::{Clock, ManualClock};
/// let clock = ManualClock::new(1_000);
/// clock.advance(5);
/// clock.set(900); // a step backwards
/// assert_eq!(clock.now_ms(), 900);
/// ```
#[derive(Debug, Clone, Default)]
pub struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    /// A clock reading `unix_ms`.
    pub fn new(unix_ms: u64) -> Self {
        ManualClock(Arc::new(AtomicU64::new(unix_ms)))
    }
    /// Sets the reading (backwards too).
    pub fn set(&self, unix_ms: u64) {
        self.0.store(unix_ms, Ordering::SeqCst);
    }
    /// Moves the reading forward.
    pub fn advance(&self, ms: u64) {
        self.0.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn monotonic_tracks_the_wall_clock_and_never_goes_back() {
        let c = MonotonicClock::new();
        let wall = SystemClock.now_ms();
        let mut last = c.now_ms();
        assert!(last.abs_diff(wall) < 1_000, "{last} vs {wall}");
        for _ in 0..10_000 {
            let now = c.now_ms();
            assert!(now >= last);
            assert!(c.now_ms_precise() >= now);
            last = now;
        }
    }
}
