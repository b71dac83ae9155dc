//! The atomics the breaker's state machine is built on.
//!
//! Normally `std`'s. Under `--cfg breaker_loom` they are loom's, so the loom
//! models explore every interleaving of the probe claim (`tests/loom.rs`)
//! and of the count window's records (`window.rs`, `loom_models`).
//! A crate-specific cfg keeps tokio's own `--cfg loom` code switched off.

#[cfg(breaker_loom)]
pub(crate) use loom::sync::atomic::{AtomicU32, AtomicU64, Ordering};
#[cfg(not(breaker_loom))]
pub(crate) use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
