//! The core crate's integration tests: one binary, one module per theme.
//! Built with `RUSTFLAGS="--cfg loom"` (scripts/test.sh), the binary holds
//! only the loom model check, whose atomics the generator then uses.

#[cfg(not(loom))]
mod clock_policies;
#[cfg(not(loom))]
mod concurrency;
#[cfg(not(loom))]
mod conversions;
#[cfg(loom)]
mod loom;
#[cfg(not(loom))]
mod roundtrip;
