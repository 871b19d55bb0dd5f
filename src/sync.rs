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

// The keyed map's shards (`keyed::map`): flags, counters and reader slots.
#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicUsize};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicUsize};

// The keyed map's underlying shard locks, as the per-key mutex above:
// parking_lot's under std, loom's under loom, infallible in both.
#[cfg(loom)]
pub(crate) use loom_rwlock::{RwLock, RwLockReadGuard, RwLockWriteGuard};
#[cfg(not(loom))]
pub(crate) use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};

#[cfg(loom)]
mod loom_rwlock {
    /// loom's reader-writer lock behind parking_lot's signature.
    pub(crate) struct RwLock<T>(loom::sync::RwLock<T>);

    pub(crate) type RwLockReadGuard<'a, T> = loom::sync::RwLockReadGuard<'a, T>;
    pub(crate) type RwLockWriteGuard<'a, T> = loom::sync::RwLockWriteGuard<'a, T>;

    impl<T> RwLock<T> {
        pub(crate) fn new(value: T) -> Self {
            RwLock(loom::sync::RwLock::new(value))
        }

        /// As `Mutex::lock`: a panic under the lock ends the model anyway.
        pub(crate) fn read(&self) -> RwLockReadGuard<'_, T> {
            self.0.read().expect("no panics while a lock is held")
        }

        pub(crate) fn write(&self) -> RwLockWriteGuard<'_, T> {
            self.0.write().expect("no panics while a lock is held")
        }
    }
}

// Data read under a lock the code builds itself (the keyed map's tables):
// loom's cell, which reports a read and a write not ordered by the models'
// atomics, or a plain `UnsafeCell` with the same calls.
#[cfg(loom)]
pub(crate) use loom::cell::{ConstPtr, MutPtr, UnsafeCell};
#[cfg(not(loom))]
pub(crate) use plain_cell::{ConstPtr, MutPtr, UnsafeCell};

#[cfg(not(loom))]
mod plain_cell {
    /// `core::cell::UnsafeCell` behind loom's signature.
    pub(crate) struct UnsafeCell<T>(core::cell::UnsafeCell<T>);

    /// A pointer for reading, as loom's (which tracks the read while it lives).
    pub(crate) struct ConstPtr<T>(*const T);

    /// A pointer for writing, as loom's.
    pub(crate) struct MutPtr<T>(*mut T);

    impl<T> UnsafeCell<T> {
        pub(crate) const fn new(value: T) -> Self {
            UnsafeCell(core::cell::UnsafeCell::new(value))
        }

        #[inline(always)]
        pub(crate) fn get(&self) -> ConstPtr<T> {
            ConstPtr(self.0.get())
        }

        #[inline(always)]
        pub(crate) fn get_mut(&self) -> MutPtr<T> {
            MutPtr(self.0.get())
        }
    }

    impl<T> ConstPtr<T> {
        /// # Safety
        /// No write to the value while the reference lives.
        #[inline(always)]
        pub(crate) unsafe fn deref(&self) -> &T {
            // SAFETY: the caller's contract.
            unsafe { &*self.0 }
        }
    }

    impl<T> MutPtr<T> {
        /// # Safety
        /// No other access to the value while the reference lives.
        #[allow(clippy::mut_from_ref)]
        #[inline(always)]
        pub(crate) unsafe fn deref(&self) -> &mut T {
            // SAFETY: the caller's contract.
            unsafe { &mut *self.0 }
        }
    }
}

/// One step of a wait for another thread (a writer waiting for a reader to
/// leave its slot): a yield, which lets a preempted reader run; loom's yield
/// under loom, so the models can run the reader.
#[inline]
pub(crate) fn spin_wait() {
    #[cfg(not(loom))]
    std::thread::yield_now();
    #[cfg(loom)]
    loom::thread::yield_now();
}
