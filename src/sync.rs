//! The one place atomics come from.
//!
//! Every atomic in tollgate is imported through this module: `std`'s normally and
//! loom's when the crate is built with `RUSTFLAGS="--cfg loom"`. The algorithms are
//! therefore model-checked as written, not as a copy (the pattern of tokio's
//! `src/loom/` and crossbeam's `primitive` modules).

#[cfg(not(loom))]
pub(crate) use std::sync::Arc;
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicU64, Ordering};

#[cfg(loom)]
pub(crate) use loom::sync::Arc;
#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU64, Ordering};
// Warm-up's two-word state: cmpxchg16b through portable-atomic under std; loom
// has no 128-bit atomic, so a loom-visible stand-in (see `wide`).
#[cfg(loom)]
pub(crate) use crate::wide::LoomAtomicU128 as AtomicU128;
#[cfg(not(loom))]
pub(crate) use portable_atomic::AtomicU128;
// Pointers swapped by reconfiguration (the sliding log's ring, keyed records):
// crossbeam-epoch's `Atomic` under std, a loom `AtomicPtr` in the loom stand-ins.
#[cfg(loom)]
pub(crate) use loom::sync::atomic::AtomicPtr;
