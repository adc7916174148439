//! Atomics, swapped for loom's under `--cfg loom` so the model checker can
//! explore every interleaving of the generator's state machine.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU64, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicU64, Ordering};
