//! Every exhaustion and rollback policy on the manual clock, including the
//! bounds. Threads that move the clock wait on the generator's own counters
//! (not on sleeps) to know the generator is waiting.

use std::thread;
use std::time::{Duration, Instant};

use shardflake::{
    ExhaustedPolicy, GenerateError, Generator, Layout, ManualClock, RollbackPolicy, preset,
};

const T0: u64 = 1_700_000_000_000;

/// 4 ids per tick: sequences run out quickly.
fn tiny() -> Layout {
    Layout::builder("tiny")
        .epoch_ms(1_600_000_000_000)
        .time(41)
        .node("node", 10)
        .sequence(2)
        .build()
        .unwrap()
}

/// A builder for node 1 of [`tiny`] on `clock`.
fn on(clock: ManualClock) -> shardflake::GeneratorBuilder<ManualClock> {
    Generator::with_clock(tiny(), clock).node("node", 1)
}

fn tick_of(layout: &Layout, id: shardflake::Id) -> u64 {
    id.decode(layout).unwrap().unix_ms
}

/// Spins (yielding) until `done`, for at most 10 s: never a fixed sleep.
fn until(done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "condition never held");
        thread::yield_now();
    }
}

#[test]
fn full_tick_waits_for_the_next_one() {
    let clock = ManualClock::new(T0);
    let g = on(clock.clone()).build().unwrap();
    let first: Vec<_> = (0..4).map(|_| g.next_id().unwrap()).collect();
    assert!(first.iter().all(|&id| tick_of(g.layout(), id) == T0));
    thread::scope(|s| {
        let waiter = s.spawn(|| g.next_id());
        until(|| g.stats().exhaustions > 0);
        clock.advance(1);
        let fifth = waiter.join().unwrap().unwrap();
        assert_eq!(tick_of(g.layout(), fifth), T0 + 1);
        assert!(fifth > first[3]);
    });
}

#[test]
fn full_tick_with_a_stopped_clock_gives_up_after_the_stall_timeout() {
    let clock = ManualClock::new(T0);
    let g = on(clock)
        .stall_timeout(Duration::from_millis(30))
        .build()
        .unwrap();
    g.next_ids(4).unwrap();
    let started = Instant::now();
    assert!(matches!(
        g.next_id(),
        Err(GenerateError::ClockStalled { .. })
    ));
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn borrowing_runs_ahead_up_to_the_lead_then_waits() {
    let clock = ManualClock::new(T0);
    let g = on(clock.clone())
        .on_exhausted(ExhaustedPolicy::Borrow {
            max_lead: Duration::from_millis(3),
        })
        .stall_timeout(Duration::from_millis(20))
        .build()
        .unwrap();
    // The current tick and three borrowed ones: 16 ids without the clock moving.
    let ids: Vec<_> = (0..16).map(|_| g.next_id().unwrap()).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]));
    assert_eq!(tick_of(g.layout(), ids[15]), T0 + 3);
    assert_eq!(g.lead(), Duration::from_millis(3));
    // Beyond the lead it waits, and a clock that never comes is an error.
    assert!(matches!(
        g.next_id(),
        Err(GenerateError::ClockStalled { .. })
    ));
    clock.advance(1);
    assert_eq!(tick_of(g.layout(), g.next_id().unwrap()), T0 + 4);
}

#[test]
fn rollback_error_is_the_default() {
    let clock = ManualClock::new(T0);
    let g = on(clock.clone()).build().unwrap();
    let before = g.next_id().unwrap();
    assert_eq!(g.check_clock(), Ok(()));
    clock.set(T0 - 5);
    // A readiness probe sees the refusal coming, without taking an id.
    assert_eq!(
        g.check_clock(),
        Err(GenerateError::ClockMovedBackwards { behind_ms: 5 })
    );
    assert_eq!(
        g.next_id(),
        Err(GenerateError::ClockMovedBackwards { behind_ms: 5 })
    );
    assert_eq!(g.stats().rollback_errors, 1);
    clock.set(T0);
    assert_eq!(g.check_clock(), Ok(()));
    assert!(
        g.next_id().unwrap() > before,
        "recovers once the clock is back"
    );
}

#[test]
fn rollback_wait_waits_within_the_bound_and_refuses_beyond() {
    let clock = ManualClock::new(T0);
    let g = on(clock.clone())
        .on_rollback(RollbackPolicy::Wait {
            max: Duration::from_millis(10),
        })
        .build()
        .unwrap();
    let before = g.next_id().unwrap();
    clock.set(T0 - 10);
    thread::scope(|s| {
        let waiter = s.spawn(|| g.next_id());
        until(|| g.stats().clock_behind > 0);
        clock.set(T0);
        let after = waiter.join().unwrap().unwrap();
        assert!(after > before);
        assert_eq!(tick_of(g.layout(), after), T0);
    });
    clock.set(T0 - 11);
    assert_eq!(
        g.next_id(),
        Err(GenerateError::ClockMovedBackwards { behind_ms: 11 })
    );
}

#[test]
fn rollback_continue_rides_on_within_the_bound_and_refuses_beyond() {
    let clock = ManualClock::new(T0);
    let g = on(clock.clone())
        .on_rollback(RollbackPolicy::Continue {
            max: Duration::from_millis(10),
        })
        .stall_timeout(Duration::from_millis(20))
        .build()
        .unwrap();
    let mut last = g.next_id().unwrap();
    clock.set(T0 - 8);
    // The rest of T0, then ticks T0+1.. up to 10 ms ahead of the clock (T0+2).
    for _ in 0..3 + 2 * 4 {
        let id = g.next_id().unwrap();
        assert!(id > last);
        last = id;
    }
    assert_eq!(tick_of(g.layout(), last), T0 + 2);
    assert!(g.next_id().is_err(), "no further than the bound");
    clock.set(T0 - 20);
    assert!(matches!(
        g.next_id(),
        Err(GenerateError::ClockMovedBackwards { .. })
    ));
}

#[test]
fn resumes_after_a_recorded_high_water() {
    let clock = ManualClock::new(T0);
    let g = on(clock.clone())
        .resume_after(T0 + 2)
        .on_rollback(RollbackPolicy::Wait {
            max: Duration::from_millis(5),
        })
        .build()
        .unwrap();
    thread::scope(|s| {
        let waiter = s.spawn(|| g.next_id());
        until(|| g.stats().clock_behind > 0);
        clock.set(T0 + 3);
        assert_eq!(tick_of(g.layout(), waiter.join().unwrap().unwrap()), T0 + 3);
    });
}

#[test]
fn clock_before_the_epoch_and_after_the_end_are_errors() {
    let layout = Layout::builder("short")
        .epoch_ms(T0)
        .time(4)
        .sequence(4)
        .build_at(T0)
        .unwrap();
    let clock = ManualClock::new(T0 - 1);
    let g = Generator::with_clock(layout.clone(), clock.clone())
        .build()
        .unwrap();
    assert!(matches!(
        g.next_id(),
        Err(GenerateError::BeforeEpoch { .. })
    ));
    clock.set(T0 + 15);
    let last = g.next_id().unwrap();
    assert_eq!(
        last.decode(&layout).unwrap().tick,
        15,
        "the last tick is usable"
    );
    assert_eq!(g.next_ids(15).unwrap().last().get(), layout.max_id());
    assert!(matches!(
        g.next_id(),
        Err(GenerateError::EpochExhausted { .. })
    ));
    clock.set(T0 + 16);
    assert!(matches!(
        g.next_id(),
        Err(GenerateError::EpochExhausted { .. })
    ));
}

#[test]
fn batch_counts_are_checked() {
    let g = Generator::with_clock(preset::by_name("snowflake").unwrap(), ManualClock::new(T0))
        .node("node", 1)
        .max_batch(100)
        .build()
        .unwrap();
    assert_eq!(
        g.next_ids(0),
        Err(GenerateError::InvalidCount {
            requested: 0,
            max: 100
        })
    );
    assert_eq!(
        g.next_ids(101),
        Err(GenerateError::InvalidCount {
            requested: 101,
            max: 100
        })
    );
    let b = g.next_ids(100).unwrap();
    assert_eq!((b.len(), b.iter().count()), (100, 100));
}

#[test]
fn a_batch_larger_than_a_tick_takes_the_most_recent_ticks() {
    let clock = ManualClock::new(T0);
    let g = on(clock.clone()).build().unwrap();
    clock.set(T0 + 100);
    let b = g.next_ids(10).unwrap();
    let ids: Vec<_> = b.iter().collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]));
    assert_eq!(tick_of(g.layout(), b.first()), T0 + 98);
    assert_eq!(tick_of(g.layout(), b.last()), T0 + 100);
    assert!(g.lead().is_zero(), "stamped no later than now");
}

#[test]
fn nothing_is_stamped_before_the_generator_was_built() {
    // A previous process used ticks up to T0 + 99 and exited; this one starts
    // at T0 + 100 and must not take a batch's ticks from before its start.
    let clock = ManualClock::new(T0 + 100);
    let g = on(clock.clone()).build().unwrap();
    let first = g.next_ids(4).unwrap();
    assert_eq!(tick_of(g.layout(), first.first()), T0 + 100);
    clock.set(T0 + 102);
    let b = g.next_ids(8).unwrap();
    assert_eq!(
        tick_of(g.layout(), b.first()),
        T0 + 101,
        "back to the first unused tick only"
    );
    assert_eq!(tick_of(g.layout(), b.last()), T0 + 102);
}

#[test]
fn max_node_and_max_sequence_compose() {
    let clock = ManualClock::new(T0);
    let g = Generator::with_clock(tiny(), clock)
        .node("node", 1023)
        .build()
        .unwrap();
    let b = g.next_ids(4).unwrap();
    let last = b.last().decode(g.layout()).unwrap();
    assert_eq!((last.field("node"), last.sequence), (Some(1023), 3));
    assert!(matches!(
        Generator::with_clock(tiny(), ManualClock::new(T0))
            .node("node", 1024)
            .build(),
        Err(shardflake::IdError::OutOfRange { .. })
    ));
}

#[test]
fn ten_ms_ticks_wait_borrow_and_refuse_in_whole_ticks() {
    // Sonyflake: 10 ms ticks, 256 ids per tick; T0 starts a tick.
    let layout = preset::by_name("sonyflake").unwrap();
    let clock = ManualClock::new(T0);
    let g = Generator::with_clock(layout.clone(), clock.clone())
        .node("machine", 9)
        // No bound at all must not overflow the wait's arithmetic.
        .stall_timeout(Duration::MAX)
        .build()
        .unwrap();
    let first = g.next_ids(256).unwrap();
    assert_eq!(tick_of(&layout, first.last()), T0);
    thread::scope(|s| {
        let waiter = s.spawn(|| g.next_id());
        until(|| g.stats().exhaustions > 0);
        // 9 ms later it is still the same tick: the waiter keeps waiting.
        clock.advance(9);
        clock.advance(1);
        let next = waiter.join().unwrap().unwrap();
        assert_eq!(tick_of(&layout, next), T0 + 10);
        assert!(next > first.last());
        assert_eq!(next.decode(&layout).unwrap().field("machine"), Some(9));
    });
    // The clock 20 ms behind the last tick (T0 + 10) is two ticks: refused.
    clock.set(T0 - 10);
    assert_eq!(
        g.next_id(),
        Err(GenerateError::ClockMovedBackwards { behind_ms: 20 })
    );

    // Borrowing 20 ms is two whole ticks: three ticks of ids on a stopped clock.
    let clock = ManualClock::new(T0);
    let g = Generator::with_clock(layout.clone(), clock.clone())
        .node("machine", 9)
        .on_exhausted(ExhaustedPolicy::Borrow {
            max_lead: Duration::from_millis(20),
        })
        .stall_timeout(Duration::from_millis(20))
        .build()
        .unwrap();
    let run = g.next_ids(3 * 256).unwrap();
    assert_eq!(tick_of(&layout, run.last()), T0 + 20);
    assert_eq!(g.lead(), Duration::from_millis(20));
    assert!(matches!(
        g.next_id(),
        Err(GenerateError::ClockStalled { .. })
    ));
}

/// A local handle hands out an id only while the clock reads its block's
/// tick: a step forward ends the block, and the next id is of the new tick.
#[test]
fn local_handle_follows_a_clock_stepped_forward() {
    let clock = ManualClock::new(T0);
    let g = on(clock.clone()).build().unwrap();
    let mut local = g.local(4);
    let first = local.next_id().unwrap();
    assert_eq!(tick_of(g.layout(), first), T0);
    clock.advance(5);
    let next = local.next_id().unwrap();
    assert_eq!(
        tick_of(g.layout(), next),
        T0 + 5,
        "stamped with a stale tick"
    );
    assert!(next > first);
}

/// A step back ends the block too, so the shared policies decide, as for a
/// shared call: `Error` (the default) refuses, instead of handing out the
/// rest of a block stamped ahead of the clock.
#[test]
fn local_handle_refuses_a_clock_stepped_back() {
    let clock = ManualClock::new(T0);
    let g = on(clock.clone()).build().unwrap();
    let mut local = g.local(4);
    let first = local.next_id().unwrap();
    clock.set(T0 - 5);
    assert_eq!(
        local.next_id(),
        Err(GenerateError::ClockMovedBackwards { behind_ms: 5 })
    );
    clock.set(T0 + 1);
    let next = local.next_id().unwrap();
    assert_eq!(tick_of(g.layout(), next), T0 + 1);
    assert!(next > first);
}

/// Under `RollbackPolicy::Wait` a local handle waits for the clock, like a
/// shared call, and its next id is of the tick the clock then reads.
#[test]
fn local_handle_waits_out_a_clock_stepped_back() {
    let clock = ManualClock::new(T0);
    let g = on(clock.clone())
        .on_rollback(RollbackPolicy::Wait {
            max: Duration::from_millis(10),
        })
        .build()
        .unwrap();
    let mut local = g.local(4);
    let first = local.next_id().unwrap();
    clock.set(T0 - 2);
    thread::scope(|s| {
        let waiter = s.spawn(|| local.next_id());
        until(|| g.stats().clock_behind > 0);
        clock.set(T0 + 1);
        let next = waiter.join().unwrap().unwrap();
        assert_eq!(tick_of(g.layout(), next), T0 + 1);
        assert!(next > first);
    });
}

/// Under `RollbackPolicy::Continue` a local handle rides on, within the
/// bound, as a shared call would: ids above the last, none refused.
#[test]
fn local_handle_rides_a_clock_stepped_back_within_the_bound() {
    let clock = ManualClock::new(T0);
    let g = on(clock.clone())
        .on_rollback(RollbackPolicy::Continue {
            max: Duration::from_millis(10),
        })
        .build()
        .unwrap();
    let mut local = g.local(2);
    let mut last = local.next_id().unwrap();
    clock.set(T0 - 8);
    // The rest of T0's block, then T0's other block.
    for _ in 0..3 {
        let id = local.next_id().unwrap();
        assert!(id > last);
        assert_eq!(tick_of(g.layout(), id), T0);
        last = id;
    }
    assert_eq!(g.stats().rollback_errors, 0);
}

/// A clock whose cheap reading lags its precise one, as the monotonic
/// clock's ticker may.
#[derive(Debug, Clone)]
struct LaggingClock {
    cached: ManualClock,
    precise: ManualClock,
}

impl shardflake::Clock for LaggingClock {
    fn now_ms(&self) -> u64 {
        self.cached.now_ms()
    }
    fn now_ms_precise(&self) -> u64 {
        self.precise.now_ms()
    }
}

/// A block reserved on a precise reading stays good while the cheap reading
/// still lags behind its tick: no block is thrown away for the ticker's lag.
#[test]
fn local_handle_keeps_its_block_while_the_cached_reading_lags() {
    use shardflake::Clock;
    let clock = LaggingClock {
        cached: ManualClock::new(T0 - 1),
        precise: ManualClock::new(T0),
    };
    let g = Generator::with_clock(tiny(), clock.clone())
        .node("node", 1)
        .build()
        .unwrap();
    let mut local = g.local(4);
    let ids: Vec<_> = (0..4).map(|_| local.next_id().unwrap()).collect();
    let sequences: Vec<_> = ids
        .iter()
        .map(|id| id.decode(g.layout()).unwrap().sequence)
        .collect();
    assert_eq!(sequences, [0, 1, 2, 3], "one block, every id of it");
    assert!(ids.iter().all(|&id| tick_of(g.layout(), id) == T0));
    assert!(clock.cached.now_ms() < T0);
}
