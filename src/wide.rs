//! The two homes of a two-word limiter state (the warm-up limiter's, the
//! shaper's): one 128-bit atomic updated by CAS, and the same two words under
//! a mutex (the locking twin).

use crossbeam_utils::CachePadded;

use crate::error::Denied;
use crate::sync::{AtomicU128, Backoff, Mutex, Ordering};

/// A two-word state (the warm-up's `next << 64 | bank`, the shaper's `end << 64
/// | last start`), changed only as a whole. `update`
/// stores the decision's new state only if it admits; a denial writes nothing.
pub(crate) trait WideCell {
    fn new(initial: u128) -> Self;

    fn load(&self) -> u128;

    /// Applies `decide` to the current state until a result is stored or
    /// `decide` denies; `decide` may run more than once, so it must be pure.
    fn update(&self, decide: impl FnMut(u128) -> Result<u128, Denied>) -> Result<(), Denied>;
}

/// The lock-free cell: a 128-bit compare-and-swap (`cmpxchg16b` on x86-64,
/// `casp` on AArch64, through portable-atomic) on its own cache line.
///
/// Every ordering is `Relaxed`, for the reason the one-word cell gives: the
/// 128 bits are the whole limiter state and publish no other memory; all
/// operations on one atomic are totally ordered by its modification order, so
/// every successful CAS is decided on exactly the value it replaces.
#[derive(Debug)]
pub(crate) struct AtomicWide(CachePadded<AtomicU128>);

impl WideCell for AtomicWide {
    fn new(initial: u128) -> Self {
        AtomicWide(CachePadded::new(AtomicU128::new(initial)))
    }

    #[inline]
    fn load(&self) -> u128 {
        // Relaxed: a point-in-time read of the one state word.
        self.0.load(Ordering::Relaxed)
    }

    #[inline]
    fn update(&self, mut decide: impl FnMut(u128) -> Result<u128, Denied>) -> Result<(), Denied> {
        // Relaxed: the decision needs a value of the word; the CAS checks it is
        // still the current one.
        let mut current = self.0.load(Ordering::Relaxed);
        let mut backoff = Backoff::new();
        loop {
            let next = decide(current)?;
            // Weak: a spurious failure costs one more pure decision. Relaxed on
            // success (the swap publishes nothing else) and on failure (the fresh
            // value is all the retry needs).
            match self
                .0
                .compare_exchange_weak(current, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return Ok(()),
                Err(actual) => {
                    current = actual;
                    // Lost a race: as `AtomicCell::update`, step aside for a
                    // bounded time (`Backoff::wait`) before retrying, so the winner
                    // can finish its next booking with the line still in its
                    // cache instead of both threads bouncing it on every
                    // attempt. Never blocks.
                    backoff.wait();
                }
            }
        }
    }
}

/// The locking twin's cell: the same 128 bits under a mutex (parking_lot's).
#[derive(Debug)]
pub(crate) struct LockedWide(CachePadded<Mutex<u128>>);

impl WideCell for LockedWide {
    fn new(initial: u128) -> Self {
        LockedWide(CachePadded::new(Mutex::new(initial)))
    }

    #[inline]
    fn load(&self) -> u128 {
        *self.0.lock()
    }

    #[inline]
    fn update(&self, mut decide: impl FnMut(u128) -> Result<u128, Denied>) -> Result<(), Denied> {
        let mut state = self.0.lock();
        *state = decide(*state)?;
        Ok(())
    }
}
