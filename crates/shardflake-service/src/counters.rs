//! The service's counters, plain atomics the issuing path and the lease
//! keeper update; `metrics.rs` renders them.

use std::sync::atomic::AtomicU64;

/// Counters updated by the issuing path and the lease keeper.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Ids of the layout issued.
    pub ids: AtomicU64,
    /// Batch requests served (count > 1).
    pub batches: AtomicU64,
    /// Batches being reserved right now (a large one waits for ticks).
    pub batches_in_flight: AtomicU64,
    /// UUIDs and ObjectIds issued.
    pub other_kinds: AtomicU64,
    /// Requests refused because the lease deadline had passed.
    pub refused_fenced: AtomicU64,
    /// Requests refused because the clock ran past the recorded high-water.
    pub refused_high_water: AtomicU64,
    /// Node ids acquired.
    pub acquisitions: AtomicU64,
    /// Successful lease keep-alives.
    pub renewals: AtomicU64,
    /// Failed keep-alives.
    pub renewal_failures: AtomicU64,
    /// Leases lost (fenced, then re-acquiring).
    pub losses: AtomicU64,
    /// High-water records written.
    pub high_water_writes: AtomicU64,
    /// Failed high-water writes.
    pub high_water_failures: AtomicU64,
}
