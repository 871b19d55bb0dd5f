//! Where the current rings lives: a pointer swapped by reconfiguration, old rings
//! reclaimed through crossbeam-epoch.
//!
//! crossbeam-epoch is not loom-aware (its own loom build needs
//! `--cfg crossbeam_loom`), so under `--cfg loom` a stand-in with the same shape
//! takes its place: a loom `AtomicPtr`, and replaced rings kept until the limiter
//! drops. The models thereby check the swap protocol (seal, inherit, publish)
//! with every access visible to loom; reclamation itself is crossbeam-epoch's, and
//! the counting-allocator test in `tests/sliding_log.rs` checks that it happens.

use super::stripes::Rings;

/// Waits a little, for a writer between its claim and its stores or for a
/// reconfiguration to publish its ring.
#[derive(Debug, Default)]
pub(crate) struct Pause(#[cfg(not(loom))] crossbeam_utils::Backoff);

impl Pause {
    #[cfg(not(loom))]
    pub(crate) fn pause(&mut self) {
        self.0.snooze();
    }

    #[cfg(loom)]
    pub(crate) fn pause(&mut self) {
        loom::thread::yield_now();
    }
}

#[cfg(not(loom))]
mod imp {
    use crossbeam_epoch::{self as epoch, Atomic, Owned};

    use super::Rings;
    use crate::sync::Ordering;

    /// The current ring, behind an epoch-protected pointer.
    #[derive(Debug)]
    pub(crate) struct Current(Atomic<Rings>);

    impl Current {
        pub(crate) fn new(ring: Rings) -> Self {
            Current(Atomic::new(ring))
        }

        /// Runs `f` on the current rings, which stays alive until `f` returns.
        #[inline]
        pub(crate) fn with<R>(&self, f: impl FnOnce(&Rings) -> R) -> R {
            let guard = epoch::pin();
            // Acquire: pairs with the Release in `replace_with`, so the ring's
            // initial contents are visible before we use it.
            let ring = self.0.load(Ordering::Acquire, &guard);
            // SAFETY: the pointer is never null (set at construction, only ever
            // replaced by another ring), and a replaced ring is destroyed only after
            // every thread pinned before the replacement has unpinned; we hold
            // `guard` for as long as the reference lives.
            f(unsafe { ring.deref() })
        }

        /// Runs `f` on the current rings; if it returns a successor, publishes it and
        /// retires the old ring. Only the caller that sealed the current rings may
        /// return a successor, so no other replacement can race this one.
        pub(crate) fn replace_with(&self, f: impl FnOnce(&Rings) -> Option<Rings>) -> bool {
            let guard = epoch::pin();
            // Acquire: as in `with`.
            let old = self.0.load(Ordering::Acquire, &guard);
            // SAFETY: as in `with`.
            let Some(new) = f(unsafe { old.deref() }) else {
                return false;
            };
            // Release: publishes the new ring's contents to the Acquire loads above.
            self.0.store(Owned::new(new), Ordering::Release);
            // SAFETY: `old` is no longer reachable from `self` (we replaced it, and
            // only the sealer replaces a ring), so no thread that pins from now on
            // can load it; epoch reclamation waits for those pinned before.
            unsafe { guard.defer_destroy(old) };
            true
        }
    }

    impl Drop for Current {
        fn drop(&mut self) {
            // SAFETY: `&mut self`: no other thread can be using the limiter, so the
            // current ring is ours to free; retired rings are epoch's to free.
            unsafe {
                drop(
                    self.0
                        .load(Ordering::Relaxed, epoch::unprotected())
                        .into_owned(),
                );
            }
        }
    }
}

#[cfg(loom)]
mod imp {
    use super::Rings;
    use crate::sync::{AtomicPtr, Ordering};

    /// The loom stand-in: a loom-visible pointer; replaced rings are retired to a
    /// list freed on drop, so a reference taken before a replacement stays valid.
    #[derive(Debug)]
    pub(crate) struct Current {
        ptr: AtomicPtr<Rings>,
        // Boxed: other threads may still hold references into retired rings,
        // which must not move when the list grows.
        #[allow(clippy::vec_box)]
        retired: std::sync::Mutex<Vec<Box<Rings>>>,
    }

    impl Current {
        pub(crate) fn new(ring: Rings) -> Self {
            Current {
                ptr: AtomicPtr::new(Box::into_raw(Box::new(ring))),
                retired: std::sync::Mutex::new(Vec::new()),
            }
        }

        pub(crate) fn with<R>(&self, f: impl FnOnce(&Rings) -> R) -> R {
            // Acquire: pairs with the Release in `replace_with`.
            let ring = self.ptr.load(Ordering::Acquire);
            // SAFETY: never null, and never freed before `self` drops.
            f(unsafe { &*ring })
        }

        pub(crate) fn replace_with(&self, f: impl FnOnce(&Rings) -> Option<Rings>) -> bool {
            // Acquire: as in `with`.
            let old = self.ptr.load(Ordering::Acquire);
            // SAFETY: as in `with`.
            let Some(new) = f(unsafe { &*old }) else {
                return false;
            };
            // Release: publishes the new ring's contents.
            self.ptr
                .store(Box::into_raw(Box::new(new)), Ordering::Release);
            // SAFETY: `old` came from `Box::into_raw` and is retired exactly once
            // (only the sealer replaces a ring); the heap block does not move, so
            // references other threads hold stay valid until drop.
            let old = unsafe { Box::from_raw(old) };
            self.retired
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(old);
            true
        }
    }

    impl Drop for Current {
        fn drop(&mut self) {
            // SAFETY: `&mut self`: nobody else holds the pointer.
            drop(unsafe { Box::from_raw(self.ptr.load(Ordering::Relaxed)) });
        }
    }
}

pub(crate) use imp::Current;
