//! A clock that moves only when told to, for deterministic tests.

use std::time::Duration;

use super::Clock;
use crate::sync::{Arc, AtomicU64, Ordering};

/// A clock that moves only when told to: for your own tests, and for every
/// property test, stress test and loom model in tollgate.
///
/// Clones share one time, so a test keeps a clone and advances it while the
/// limiter holds another. It may also be set backwards, to test what a limiter
/// does when time steps back. Its time is an atomic from tollgate's sync facade,
/// so under `--cfg loom` loom sees every read and every advance.
///
/// ```
/// use std::time::Duration;
/// use tollgate::{Clock, ManualClock};
///
/// let clock = ManualClock::new();
/// let handle = clock.clone();
/// handle.advance(Duration::from_millis(5));
/// assert_eq!(clock.now(), 5_000_000);
/// handle.set(1_000);
/// assert_eq!(clock.now(), 1_000);
/// ```
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    nanos: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock reading zero.
    ///
    /// ```
    /// use tollgate::Clock;
    /// assert_eq!(tollgate::ManualClock::new().now(), 0);
    /// ```
    pub fn new() -> Self {
        Self::default()
    }

    /// Moves time forward by `by`, saturating at `u64::MAX` nanoseconds.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::Clock;
    /// let clock = tollgate::ManualClock::new();
    /// clock.advance(Duration::from_secs(1));
    /// assert_eq!(clock.now(), 1_000_000_000);
    /// ```
    pub fn advance(&self, by: Duration) {
        let by = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        // Release pairs with the Acquire in `now`, so a thread that sees the new
        // time also sees whatever the advancing thread did before advancing (tests
        // use this to order "fill the bucket, then move time").
        let _ = self
            .nanos
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| {
                Some(t.saturating_add(by))
            });
    }

    /// Sets the time to `nanos`, forwards or backwards.
    ///
    /// ```
    /// use tollgate::Clock;
    /// let clock = tollgate::ManualClock::new();
    /// clock.set(10);
    /// clock.set(3); // time may step back
    /// assert_eq!(clock.now(), 3);
    /// ```
    pub fn set(&self, nanos: u64) {
        // Release: as in `advance`.
        self.nanos.store(nanos, Ordering::Release);
    }
}

impl Clock for ManualClock {
    #[inline]
    fn now(&self) -> u64 {
        // Acquire pairs with the Release of `advance` and `set`.
        self.nanos.load(Ordering::Acquire)
    }
}
