//! The lock-free fixed window: one `AtomicU64` packing the current window's index
//! and its count, updated by compare-and-swap.
//!
//! The user-facing documentation (promise, state, proof) is on [`FixedWindow`].

pub(crate) mod counter;
mod leased;
mod locking;

use std::time::Duration;

pub use leased::LeasedFixedWindow;
pub use locking::LockingFixedWindow;

use crate::cell::AtomicCell;
use crate::clock::{Clock, MonotonicClock};
use crate::error::ConfigError;
use crate::machine::{WordLimiter, word_limiter};
use crate::rate::Rate;
use counter::WindowCounter;

word_limiter!(
    /// A lock-free fixed window: at most `rate.permits()` per aligned window of
    /// `rate.period()`.
    ///
    /// ```
    /// use tollgate::{FixedWindow, Rate, RateLimiter};
    ///
    /// let window = FixedWindow::new(Rate::per_second(100)).unwrap();
    /// assert!(window.try_acquire().is_ok());
    /// ```
    ///
    /// The lock-free fixed window: one `AtomicU64` packing the current window's index
    /// and its count, updated by compare-and-swap.
    ///
    /// Time is cut into aligned windows of the rate's period, starting when the
    /// limiter is built; each window admits up to the rate's permits.
    ///
    /// # State
    ///
    /// With `b` = the number of bits needed to hold the limit (7 for 100):
    ///
    /// | bits | meaning |
    /// |---|---|
    /// | `0 .. b` | permits admitted in the window below |
    /// | `b .. 64` | index of the window last written (`time since origin / window`) |
    ///
    /// | operation | reads | writes |
    /// |---|---|---|
    /// | admit `n` in the stored window | word | `count + n`, by CAS, if `≤ limit` |
    /// | admit `n` in a later window | word | `(new index, n)`, by CAS |
    /// | deny | word | nothing |
    ///
    /// The index never wraps, and the word never reaches bit 63: one permit per
    /// nanosecond at most means the window is at least `2^(b-1)` ns, and the
    /// limiter's time ends at `2^62 − 1` ns, so an index is at most `(2^62 − 1) /
    /// 2^(b−1) < 2^(63−b)` and fits in `63 − b` bits. Bit 63 is always zero (the
    /// keyed layer uses it as a tag); time ends one nanosecond short of 2^62
    /// precisely so that a 1-per-ns window with a power-of-two limit does not
    /// reach it.
    ///
    /// # Guarantee, and the known weakness
    ///
    /// Every admission is charged to exactly one aligned window — the window of its
    /// clock reading, or, when that reading is stale (older than the window already
    /// stored), the stored window — and under any interleaving no window is charged
    /// more than the limit. Exactly, not approximately: each admission is one CAS on
    /// the word that holds the count. Time is treated as having stood still for a
    /// stale reading, so a closed window never reopens. With a clock that every
    /// thread reads in order (the usual case), the charged window is the reading's
    /// own window and the promise is simply "at most the limit per aligned window".
    ///
    /// But windows are aligned, not sliding: a client can spend the whole limit at the
    /// end of one window and again at the start of the next, so **up to 2× the limit
    /// can pass in any span of one window's length** that straddles a boundary:
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{FixedWindow, ManualClock, Rate, RateLimiter};
    ///
    /// let clock = ManualClock::new();
    /// let window = FixedWindow::with_clock(Rate::per_minute(100), clock.clone()).unwrap();
    /// clock.advance(Duration::from_millis(59_900)); // 0:59.9
    /// assert!(window.try_acquire_n(100).is_ok());
    /// clock.advance(Duration::from_millis(200)); // 1:00.1
    /// assert!(window.try_acquire_n(100).is_ok()); // 200 in 0.2 s
    /// ```
    ///
    /// Choose it when its cost (the cheapest check there is) matters more than that
    /// burst; the sliding log or a token bucket when it does not. For one window
    /// shared by many threads on many cores, [`LeasedFixedWindow`] keeps the same
    /// promise with most checks writing only the calling thread's cache line.
    FixedWindow,
    WindowCounter,
    AtomicCell<u64>,
    "Rate::per_second(10)"
);

impl FixedWindow {
    /// `rate.permits()` per aligned window of `rate.period()`, windows starting now,
    /// on the default [`MonotonicClock`].
    ///
    /// Errors: [`ConfigError::ZeroRate`], [`ConfigError::ZeroPeriod`],
    /// [`ConfigError::TooFine`] (a limit above the window's length in ns),
    /// [`ConfigError::Overflow`] (a window longer than 2^62 ns).
    ///
    /// ```
    /// use tollgate::{FixedWindow, Rate};
    /// let per_minute = FixedWindow::new(Rate::per_minute(100)).unwrap();
    /// # let _ = per_minute;
    /// ```
    pub fn new(rate: Rate) -> Result<Self, ConfigError> {
        Self::with_clock(rate, MonotonicClock::new())
    }
}

impl<C: Clock> FixedWindow<C> {
    /// As [`FixedWindow::new`], reading `clock`.
    ///
    /// ```
    /// use tollgate::{FixedWindow, ManualClock, Rate};
    /// let window = FixedWindow::with_clock(Rate::per_second(10), ManualClock::new()).unwrap();
    /// # let _ = window;
    /// ```
    pub fn with_clock(rate: Rate, clock: C) -> Result<Self, ConfigError> {
        Ok(FixedWindow {
            inner: WordLimiter::new(WindowCounter::new(rate)?, clock),
        })
    }

    /// The window's length.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{FixedWindow, Rate};
    /// let window = FixedWindow::new(Rate::per_minute(100)).unwrap();
    /// assert_eq!(window.window(), Duration::from_secs(60));
    /// ```
    pub fn window(&self) -> Duration {
        self.inner.machine().window()
    }
}
