//! The atomics the breaker's state machine is built on.
//!
//! Normally `std`'s. Under `--cfg breaker_loom` they are loom's, so the loom
//! model test (`tests/loom.rs`) explores every interleaving of the probe claim.
//! A crate-specific cfg keeps tokio's own `--cfg loom` code switched off.

#[cfg(breaker_loom)]
pub(crate) use loom::sync::atomic::{AtomicU32, AtomicU64, Ordering};
#[cfg(not(breaker_loom))]
pub(crate) use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
