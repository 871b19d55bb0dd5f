//! A token bucket that warms up: Guava's `SmoothWarmingUp`, with integer
//! time, lock-free ([`WarmUp`]) or under a mutex (its locking twin,
//! [`LockingWarmUp`]).
//!
//! The user-facing documentation (promise, state, proof) is on [`WarmUpOf`].

pub(crate) mod curve;

use std::time::Duration;

use crate::cell::{Atomic, Home, Locked};
use crate::clock::{Clock, MonotonicClock};
use crate::error::ConfigError;
use crate::machine::{WordLimiter, word_limiter};
use crate::rate::Rate;
use crate::waiting::word_reserve;
use curve::Curve;

/// Guava's default cold factor: a cold limiter hands out permits at a third of
/// its stable rate.
pub const DEFAULT_COLD_FACTOR: u32 = 3;

/// A lock-free warm-up limiter with Guava's `SmoothWarmingUp` schedule:
/// starts cold, ramps to its stable rate over the warm-up period, cools
/// down again when idle.
///
/// Use it through [`Reserve`](crate::Reserve) to wait
/// (`acquire(n)` is Guava's `acquire(n)`), or as a
/// [`RateLimiter`](crate::RateLimiter) to reject (`try_acquire_n(n)` is
/// Guava's `tryAcquire(n)`). What it promises, and how, is on [`WarmUpOf`],
/// the type it names; [`LockingWarmUp`] is its twin under a mutex.
///
/// ```
/// use std::time::Duration;
/// use tollgate::{Rate, RateLimiter, Reserve, WarmUp};
///
/// let limiter = WarmUp::new(Rate::per_minute(1), Duration::from_secs(600)).unwrap();
/// limiter.acquire(1).unwrap(); // the first permit is free...
/// assert!(limiter.try_acquire().is_err()); // ...and costs the cold interval
/// ```
pub type WarmUp<C = MonotonicClock> = WarmUpOf<Atomic, C>;

/// The [`WarmUp`]'s locking twin: the same two words and decisions under a
/// `parking_lot` mutex. Same clock readings, same schedule. Its methods,
/// errors and guarantee are the [`WarmUp`]'s: both name [`WarmUpOf`].
///
/// ```
/// use std::time::Duration;
/// use tollgate::{LockingWarmUp, Rate, Reserve};
///
/// let limiter = LockingWarmUp::new(Rate::per_second(1000), Duration::from_millis(20)).unwrap();
/// limiter.acquire(1).unwrap();
/// ```
pub type LockingWarmUp<C = MonotonicClock> = WarmUpOf<Locked, C>;

word_limiter!(
    /// A token bucket that warms up (Guava's `SmoothWarmingUp`, with integer
    /// time): the one type behind [`WarmUp`] (its word in a 128-bit atomic,
    /// updated by compare-and-swap) and [`LockingWarmUp`] (the same word under
    /// a mutex). Every method, decision and guarantee is the same for both, and
    /// documented here; name it through those two, since the parameter `H`
    /// says only where the word lives.
    ///
    /// A service that has been idle is cold — caches empty, connections closed, JIT
    /// not done — and cannot take its full rate at once. The limiter starts cold and
    /// ramps up: after idleness, permits are handed out at `cold_factor` × the stable
    /// interval, and the interval shrinks linearly to the stable one as the limiter
    /// is used, over the warm-up period. The schedule is Guava's, formula for
    /// formula; the table test in `tests/integration/warm_up.rs` reproduces the expected waits
    /// of Guava's own `RateLimiterTest` within 1 µs (most of them exactly).
    ///
    /// Like Guava's `RateLimiter`, a request is never delayed for its *own* cost:
    /// it starts at the limiter's next free instant and pushes that instant back by
    /// its cost ("pay later"). So a [`Reserve::reserve`](crate::Reserve::reserve)
    /// returns when the *previous* requests are paid for, and
    /// [`try_acquire`](crate::RateLimiter::try_acquire) succeeds iff nothing is
    /// outstanding.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{ManualClock, Rate, Reserve, WarmUp};
    ///
    /// // Guava: RateLimiter.create(2.0, 4, SECONDS) — cold factor 3.
    /// let clock = ManualClock::new();
    /// let limiter = WarmUp::with_clock(Rate::per_second(2), Duration::from_secs(4), clock.clone()).unwrap();
    /// let mut waits = Vec::new();
    /// for _ in 0..8 {
    ///     let r = limiter.reserve(1).unwrap();
    ///     let wait = r.delay();
    ///     clock.advance(wait); // sleep, as Guava's acquire() does
    ///     waits.push(wait.as_millis());
    /// }
    /// assert_eq!(waits, [0, 1375, 1125, 875, 625, 500, 500, 500]);
    /// ```
    ///
    /// # State
    ///
    /// One 128-bit word, updated by a 128-bit compare-and-swap (`cmpxchg16b`;
    /// the twin keeps it under its mutex):
    ///
    /// | bits | meaning |
    /// |---|---|
    /// | 64–127 | `next`: ns since the limiter was built at which the next request may start |
    /// | 0–63 | `spent = warm_up − bank`: the idle time the bank lacks, in `[0, warm_up]` ns; the bank is the idle time banked, and Guava's `storedPermits` is `bank / coolDown`. Kept as what is spent so that a cold, idle limiter is the word 0 under every configuration (a key's fresh state) |
    ///
    /// | operation | writes |
    /// |---|---|
    /// | book `n` at `now` | if `now > next`: `bank += now − next` (capped), `next = now`; then, if `next − now ≤ max_wait`: `next += cost(n)`, `bank −= n·coolDown` |
    /// | deny | nothing |
    /// | cancel | the word before the booking, iff the word is still the one the booking wrote |
    ///
    /// Guava keeps `storedPermits` as a double and time in microseconds; here the
    /// stored permits are kept as the idle time that bought them, so idleness adds
    /// to the bank one nanosecond per nanosecond with no division, and the cost of
    /// spending it is Guava's integral, rewritten on that axis and computed in
    /// u128 integers (see `curve.rs`). Costs are exact to the nanosecond but for the
    /// trapezoid above the threshold, rounded down.
    ///
    /// Two words must change together, so the state is one 128-bit atomic (loom has
    /// none; the loom models run the same code on a loom-visible stand-in). A
    /// reading older than the state's `next` changes nothing and waits longer; a
    /// reading older than the truth but newer than `next` decides exactly as Guava
    /// would for a request arriving at that reading — a time after every earlier
    /// decision, so the history stays one that Guava could produce.
    ///
    /// # Differences from Guava
    ///
    /// - Integer nanoseconds and an integer stable interval (the rate's period
    ///   divided by its permits, rounded up), no floating point in a decision.
    /// - The cold factor is an integer from 1 to 1000 (Guava's tests use 1, 2, 3,
    ///   10); the warm-up period at most 2^52 ns (about 52 days); one request may
    ///   cost at most 2^60 ns at the stable rate.
    /// - No `setRate`: build a new limiter to change the rate.
    WarmUpOf<H>, Curve, "WarmUp", "LockingWarmUp"
);

// Reservations on the same two words, booked ahead.
word_reserve!([H: Home, C: Clock] WarmUpOf<H, C>);

/// The limiter's and its twin's constructor on the default clock (the example
/// runs on the lock-free one; the twin answers the same).
impl<H: Home> WarmUpOf<H> {
    /// A cold limiter with a stable `rate`, warming up over `warm_up`, with
    /// Guava's default cold factor of 3, on the default [`MonotonicClock`].
    ///
    /// Errors: [`ConfigError::ZeroRate`], [`ConfigError::ZeroPeriod`],
    /// [`ConfigError::TooFine`], [`ConfigError::WarmUpTooLong`] (a warm-up
    /// period over 2^52 ns), [`ConfigError::Overflow`] (more than 2^60 ns per
    /// permit).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Rate, WarmUp};
    /// let limiter = WarmUp::new(Rate::per_second(100), Duration::from_secs(10)).unwrap();
    /// assert_eq!(limiter.cold_factor(), 3);
    /// ```
    pub fn new(rate: Rate, warm_up: Duration) -> Result<Self, ConfigError> {
        Self::with_clock(rate, warm_up, MonotonicClock::new())
    }
}

/// The methods of the limiter and its twin on any clock (each example runs on
/// the lock-free one; the twin answers the same).
impl<H: Home, C: Clock> WarmUpOf<H, C> {
    /// As [`new`](Self::new), reading `clock`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{ManualClock, Rate, WarmUp};
    /// let limiter = WarmUp::with_clock(Rate::per_second(5), Duration::from_secs(4), ManualClock::new()).unwrap();
    /// # let _ = limiter;
    /// ```
    pub fn with_clock(rate: Rate, warm_up: Duration, clock: C) -> Result<Self, ConfigError> {
        Self::with_cold_factor(rate, warm_up, DEFAULT_COLD_FACTOR, clock)
    }

    /// As [`with_clock`](Self::with_clock), with a cold factor from 1 (no
    /// warm-up: every permit at the stable interval) to 1000: a cold
    /// limiter's interval is `cold_factor` × the stable one.
    ///
    /// Errors: as [`new`](Self::new), and [`ConfigError::InvalidColdFactor`]
    /// for a cold factor outside `1..=`[`MAX_COLD_FACTOR`](crate::MAX_COLD_FACTOR).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{ConfigError, ManualClock, Rate, WarmUp};
    /// // Guava: RateLimiter.create(5.0, 4, SECONDS, 10.0)
    /// let limiter = WarmUp::with_cold_factor(Rate::per_second(5), Duration::from_secs(4), 10, ManualClock::new()).unwrap();
    /// assert_eq!(limiter.cold_factor(), 10);
    /// let err = WarmUp::with_cold_factor(Rate::per_second(5), Duration::from_secs(4), 0, ManualClock::new()).unwrap_err();
    /// assert_eq!(err, ConfigError::InvalidColdFactor { cold_factor: 0 });
    /// ```
    pub fn with_cold_factor(
        rate: Rate,
        warm_up: Duration,
        cold_factor: u32,
        clock: C,
    ) -> Result<Self, ConfigError> {
        Ok(WarmUpOf {
            inner: WordLimiter::new(Curve::new(rate, warm_up, cold_factor)?, clock),
        })
    }

    /// The interval between permits once warm: the rate's period over its
    /// permits, rounded up to a whole nanosecond.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Rate, WarmUp};
    /// let limiter = WarmUp::new(Rate::per_second(4), Duration::from_secs(1)).unwrap();
    /// assert_eq!(limiter.stable_interval(), Duration::from_millis(250));
    /// ```
    pub fn stable_interval(&self) -> Duration {
        self.inner.machine().stable_interval()
    }

    /// The warm-up period: how long saturated demand takes to bring a
    /// fully cold limiter down to the threshold of the stable rate.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Rate, WarmUp};
    /// let limiter = WarmUp::new(Rate::per_second(4), Duration::from_secs(3)).unwrap();
    /// assert_eq!(limiter.warm_up_period(), Duration::from_secs(3));
    /// ```
    pub fn warm_up_period(&self) -> Duration {
        self.inner.machine().warm_up()
    }

    /// The cold factor: a fully cold limiter's interval over the stable one.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Rate, WarmUp};
    /// let limiter = WarmUp::new(Rate::per_second(4), Duration::from_secs(3)).unwrap();
    /// assert_eq!(limiter.cold_factor(), tollgate::DEFAULT_COLD_FACTOR);
    /// ```
    pub fn cold_factor(&self) -> u32 {
        self.inner.machine().cold_factor()
    }

    /// The clock this limiter reads.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Clock, ManualClock, Rate, WarmUp};
    /// let clock = ManualClock::new();
    /// let limiter = WarmUp::with_clock(Rate::per_second(1), Duration::from_secs(1), clock.clone()).unwrap();
    /// clock.set(7);
    /// assert_eq!(limiter.clock().now(), 7);
    /// ```
    pub fn clock(&self) -> &C {
        self.inner.clock()
    }
}
