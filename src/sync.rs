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

// Per-key states that are locked rather than swapped (the keyed sliding log
// and sliding window): parking_lot's mutex under std, loom's under loom, one
// `lock()` that cannot fail in both, so the models see every lock.
#[cfg(loom)]
pub(crate) use loom_mutex::{Mutex, MutexGuard};
#[cfg(not(loom))]
pub(crate) use parking_lot::{Mutex, MutexGuard};

#[cfg(loom)]
mod loom_mutex {
    /// loom's mutex behind parking_lot's signature: `lock` returns the guard.
    pub(crate) struct Mutex<T>(loom::sync::Mutex<T>);

    pub(crate) type MutexGuard<'a, T> = loom::sync::MutexGuard<'a, T>;

    impl<T> Mutex<T> {
        pub(crate) fn new(value: T) -> Self {
            Mutex(loom::sync::Mutex::new(value))
        }

        /// A panic while the lock is held ends the model anyway, so a poisoned
        /// lock is never seen by a caller that could handle it.
        pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
            self.0.lock().expect("no panics while a lock is held")
        }
    }
}
