//! The 128-bit atomic under loom (compiled only with `--cfg loom`; the std
//! build uses portable-atomic's `AtomicU128`).

use super::Ordering;

/// loom has no 128-bit atomic. Under `--cfg loom` the two-word cells
/// (`cell::AtomicCell<u128, _>`: warm-up's, the shaper's, their keys') run on this
/// stand-in: a loom mutex around the value, so every load and every
/// compare-and-swap is one loom-visible, linearizable step, and loom explores
/// every order of them. (The real `cmpxchg16b` is linearizable the same way; what
/// the models check is the CAS loop and the decisions built on it.)
#[derive(Debug)]
#[allow(unreachable_pub)] // public only as `cell::Word::Atomic` of `u128`
pub struct LoomAtomicU128(loom::sync::Mutex<u128>);

impl LoomAtomicU128 {
    pub(crate) fn new(value: u128) -> Self {
        LoomAtomicU128(loom::sync::Mutex::new(value))
    }

    pub(crate) fn load(&self, _: Ordering) -> u128 {
        *self.0.lock().unwrap()
    }

    /// A plain store: nothing in tollgate calls it; `scripts/mutate-loom`'s
    /// blind-store mutant of the CAS loop does (a lost update must fail a model),
    /// through `cell::AtomicWord::store`.
    pub(crate) fn store(&self, value: u128, _: Ordering) {
        *self.0.lock().unwrap() = value;
    }

    pub(crate) fn compare_exchange_weak(
        &self,
        current: u128,
        new: u128,
        _: Ordering,
        _: Ordering,
    ) -> Result<u128, u128> {
        let mut value = self.0.lock().unwrap();
        if *value == current {
            *value = new;
            Ok(current)
        } else {
            Err(*value)
        }
    }
}
