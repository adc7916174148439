//! The core crate's integration tests: one binary, one module per theme.
//! The loom model check of the generator's atomics is the crate
//! `shardflake-loom` (its `--cfg loom` build then needs none of the
//! dependencies of these tests).

mod backfill;
mod clock_policies;
mod concurrency;
mod conversions;
mod random_start;
mod roundtrip;
