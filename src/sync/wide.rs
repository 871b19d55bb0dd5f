//! The 128-bit atomic under loom (compiled only with `--cfg loom`; the std
//! build uses portable-atomic's `AtomicU128`).

use super::{AtomicUsize, Ordering};

/// loom has no 128-bit atomic. Under `--cfg loom` the two-word cells
/// (warm-up's, the shaper's, their keys') and the keyed sliding window's pool
/// run on this stand-in: each distinct value ever used gets a number, and a
/// loom `AtomicUsize` holds the number of the current value. A value always
/// gets the same number, so a compare-and-swap of numbers succeeds exactly
/// when a compare-and-swap of the values would. Each operation is one
/// loom-visible access with the caller's ordering, so loom explores every
/// order of them *and* every value a weakly ordered load may return, and a
/// missing `Acquire` or `Release` on the word is seen by the models (a
/// stand-in built on a mutex would order every access and hide it). The
/// table of values sits behind a `std` mutex that loom does not see: a
/// number's value never changes, so the table orders nothing.
#[allow(unreachable_pub)] // public only as `cell::Word::Atomic` of `u128`
pub struct LoomAtomicU128 {
    current: AtomicUsize,
    values: std::sync::Mutex<Vec<u128>>,
}

impl std::fmt::Debug for LoomAtomicU128 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoomAtomicU128").finish_non_exhaustive()
    }
}

impl LoomAtomicU128 {
    pub(crate) fn new(value: u128) -> Self {
        LoomAtomicU128 {
            current: AtomicUsize::new(0),
            values: std::sync::Mutex::new(vec![value]),
        }
    }

    fn value(&self, number: usize) -> u128 {
        self.values.lock().unwrap_or_else(|e| e.into_inner())[number]
    }

    /// The value's number, given one if it has none yet.
    fn number(&self, value: u128) -> usize {
        let mut values = self.values.lock().unwrap_or_else(|e| e.into_inner());
        match values.iter().position(|&v| v == value) {
            Some(number) => number,
            None => {
                values.push(value);
                values.len() - 1
            }
        }
    }

    pub(crate) fn load(&self, order: Ordering) -> u128 {
        self.value(self.current.load(order))
    }

    /// A plain store: the keyed sliding window publishes a carried-over pool
    /// with it; `scripts/mutate-loom`'s blind-store mutants of the CAS loops
    /// call it too (a lost update must fail a model).
    pub(crate) fn store(&self, value: u128, order: Ordering) {
        self.current.store(self.number(value), order);
    }

    /// Never fails spuriously: the models need not explore it, since every
    /// caller retries a failure as it would a lost race.
    pub(crate) fn compare_exchange_weak(
        &self,
        current: u128,
        new: u128,
        success: Ordering,
        failure: Ordering,
    ) -> Result<u128, u128> {
        self.current
            .compare_exchange(self.number(current), self.number(new), success, failure)
            .map(|_| current)
            .map_err(|found| self.value(found))
    }
}
