//! The fixed window: one word packing the current window's index and its
//! count, in an atomic updated by compare-and-swap ([`FixedWindow`]) or under
//! a mutex (its locking twin, [`LockingFixedWindow`]).
//!
//! The user-facing documentation (promise, state, proof) is on [`FixedWindowOf`].

pub(crate) mod counter;
mod leased;

use std::time::Duration;

pub use leased::LeasedFixedWindow;

use crate::cell::{Atomic, Home, Locked};
use crate::clock::{Clock, MonotonicClock};
use crate::error::ConfigError;
use crate::machine::{WordLimiter, word_limiter};
use crate::rate::Rate;
use counter::WindowCounter;

/// A lock-free fixed window: at most `rate.permits()` per aligned window of
/// `rate.period()`.
///
/// A check reads the clock and one atomic; an admission adds one CAS; a denial
/// writes nothing. What it promises, and its known weakness, are on
/// [`FixedWindowOf`], the type it names; [`LockingFixedWindow`] is its twin
/// under a mutex.
///
/// ```
/// use tollgate::{FixedWindow, Rate, RateLimiter};
///
/// let window = FixedWindow::new(Rate::per_second(100)).unwrap();
/// assert!(window.try_acquire().is_ok());
/// ```
pub type FixedWindow<C = MonotonicClock> = FixedWindowOf<Atomic, C>;

/// The [`FixedWindow`]'s locking twin: the same packed word and the same
/// decision function under a `parking_lot` mutex. Its methods, errors and
/// guarantee are the [`FixedWindow`]'s: both name [`FixedWindowOf`].
///
/// ```
/// use tollgate::{LockingFixedWindow, Rate, RateLimiter};
///
/// let window = LockingFixedWindow::new(Rate::per_hour(1)).unwrap();
/// assert!(window.try_acquire().is_ok());
/// assert!(window.try_acquire().is_err());
/// ```
pub type LockingFixedWindow<C = MonotonicClock> = FixedWindowOf<Locked, C>;

word_limiter!(
    /// A fixed window: the one type behind [`FixedWindow`] (its word in an atomic,
    /// updated by compare-and-swap) and [`LockingFixedWindow`] (the same word under
    /// a mutex). Every method, decision and guarantee is the same for both, and
    /// documented here; name it through those two, since the parameter `H` says
    /// only where the word lives.
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
    /// | admit `n` in the stored window | word | `count + n`, by CAS (the twin: under its mutex), if `≤ limit` |
    /// | admit `n` in a later window | word | `(new index, n)`, by CAS (the twin: under its mutex) |
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
    FixedWindowOf<H>, WindowCounter, "FixedWindow", "LockingFixedWindow"
);

/// The window's and its twin's constructor on the default clock (the example
/// runs on the lock-free one; the twin answers the same).
impl<H: Home> FixedWindowOf<H> {
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

/// The methods of the window and its twin on any clock (each example runs on
/// the lock-free one; the twin answers the same).
impl<H: Home, C: Clock> FixedWindowOf<H, C> {
    /// As [`new`](Self::new), reading `clock`.
    ///
    /// ```
    /// use tollgate::{FixedWindow, ManualClock, Rate};
    /// let window = FixedWindow::with_clock(Rate::per_second(10), ManualClock::new()).unwrap();
    /// # let _ = window;
    /// ```
    pub fn with_clock(rate: Rate, clock: C) -> Result<Self, ConfigError> {
        Ok(FixedWindowOf {
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

    /// The clock this window reads.
    ///
    /// ```
    /// use tollgate::{Clock, FixedWindow, ManualClock, Rate};
    /// let clock = ManualClock::new();
    /// let window = FixedWindow::with_clock(Rate::per_second(10), clock.clone()).unwrap();
    /// clock.set(7);
    /// assert_eq!(window.clock().now(), 7);
    /// ```
    pub fn clock(&self) -> &C {
        self.inner.clock()
    }
}
