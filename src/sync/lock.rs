//! Locks: the per-key mutex, the keyed map's shard locks, the locking twins'
//! mutex, and the cell for data read under a lock the code builds itself.
//! parking_lot's (and `core`'s cell) under std, loom's under loom, each behind
//! one signature, so the models see every lock.

// Per-key states that are locked rather than swapped (the keyed sliding log
// and sliding window) and the locking twins' states: parking_lot's mutex
// under std, loom's under loom, one `lock()` that cannot fail in both, so the
// models see every lock.
#[cfg(loom)]
pub(crate) use loom_mutex::Mutex;
#[cfg(not(loom))]
pub(crate) use parking_lot::Mutex;

#[cfg(loom)]
mod loom_mutex {
    /// loom's mutex behind parking_lot's signature: `lock` returns the guard.
    #[derive(Debug)]
    #[allow(unreachable_pub)] // public only in the sliding log's `RingsHome::Store`
    pub struct Mutex<T>(loom::sync::Mutex<T>);

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

// The keyed map's underlying shard locks, as the per-key mutex above:
// parking_lot's under std, loom's under loom, infallible in both.
#[cfg(loom)]
pub(crate) use loom_rwlock::{RwLock, RwLockReadGuard, RwLockWriteGuard};
#[cfg(not(loom))]
pub(crate) use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};

#[cfg(loom)]
mod loom_rwlock {
    /// loom's reader-writer lock behind parking_lot's signature.
    #[derive(Debug)]
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
