//! The two homes of a one-word limiter state: an atomic updated by CAS, and the
//! same word under a mutex (the locking twin).

use crossbeam_utils::CachePadded;

use crate::error::Denied;
use crate::sync::{AtomicU64, Backoff, Mutex, Ordering};

/// Where a one-word state lives. `update` runs a decision on the current state and
/// stores the new state only if the decision admits; a denial writes nothing.
pub(crate) trait StateCell {
    fn new(initial: u64) -> Self;

    /// The current state, for decisions that do not write (snapshots).
    fn load(&self) -> u64;

    /// Applies `decide` to the current state until a result is stored or `decide`
    /// denies. `decide` may run several times (the atomic cell retries after a
    /// lost race), so it must be a pure function of the state it is given.
    fn update(&self, decide: impl FnMut(u64) -> Result<u64, Denied>) -> Result<(), Denied>;
}

/// The lock-free cell: one `AtomicU64` on its own cache line, updated by a
/// compare-and-swap loop.
///
/// Every ordering here is `Relaxed`, and that is enough: the word *is* the whole
/// limiter state and no other memory is published through it. All reads and
/// read-modify-writes of one atomic are totally ordered by its modification order,
/// so each successful CAS is decided on the very value it replaces; that is all
/// the invariants need (a permit is a right to proceed, not a handle on data).
#[derive(Debug)]
pub(crate) struct AtomicCell(CachePadded<AtomicU64>);

impl StateCell for AtomicCell {
    fn new(initial: u64) -> Self {
        AtomicCell(CachePadded::new(AtomicU64::new(initial)))
    }

    #[inline]
    fn load(&self) -> u64 {
        // Relaxed: see the type's docs; a snapshot is a point-in-time read of one word.
        self.0.load(Ordering::Relaxed)
    }

    #[inline]
    fn update(&self, mut decide: impl FnMut(u64) -> Result<u64, Denied>) -> Result<(), Denied> {
        // Relaxed: the decision below only needs *a* value of the word; the CAS
        // then checks that it is still *the* value, in the word's modification order.
        let mut current = self.0.load(Ordering::Relaxed);
        let mut backoff = Backoff::new();
        loop {
            let next = decide(current)?;
            // Weak CAS: a spurious failure just costs one more (pure) decision.
            // Relaxed on success: the swap is the admission and publishes nothing
            // else. Relaxed on failure: the fresh value is all the retry needs.
            match self
                .0
                .compare_exchange_weak(current, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return Ok(()),
                Err(actual) => {
                    current = actual;
                    // Lost a race: step aside for a moment (32 ns, doubling
                    // per loss, at most about a microsecond: time, not a count
                    // of spin hints, so the same on every CPU; see `sync::Backoff`)
                    // before deciding again. The winner's next update then
                    // finds the line still in its own cache instead of both
                    // cores trading it on every attempt.
                    // Bounded: it never blocks, and a thread that never loses
                    // never waits.
                    backoff.wait();
                }
            }
        }
    }
}

/// The locking twin's cell: the same word under a mutex (parking_lot's).
#[derive(Debug)]
pub(crate) struct LockedCell(CachePadded<Mutex<u64>>);

impl StateCell for LockedCell {
    fn new(initial: u64) -> Self {
        LockedCell(CachePadded::new(Mutex::new(initial)))
    }

    #[inline]
    fn load(&self) -> u64 {
        *self.0.lock()
    }

    #[inline]
    fn update(&self, mut decide: impl FnMut(u64) -> Result<u64, Denied>) -> Result<(), Denied> {
        let mut state = self.0.lock();
        *state = decide(*state)?;
        Ok(())
    }
}
