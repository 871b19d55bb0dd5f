//! The token bucket: one word holding a GCRA theoretical arrival time, in an
//! atomic updated by compare-and-swap ([`TokenBucket`]) or under a mutex (its
//! locking twin, [`LockingTokenBucket`]).
//!
//! The user-facing documentation (promise, state, proof) is on [`TokenBucketOf`].

pub(crate) mod gcra;
mod leased;

use std::time::Duration;

pub use leased::LeasedTokenBucket;

use crate::cell::{Atomic, Home, Locked};
use crate::clock::{Clock, MonotonicClock};
use crate::error::ConfigError;
use crate::machine::{WordLimiter, word_limiter};
use crate::rate::Rate;
use crate::waiting::word_reserve;
use gcra::Gcra;

/// A lock-free token bucket: bursts up to a capacity, refilled at a rate.
///
/// A check reads the clock and one atomic; an admission adds one CAS; a denial
/// writes nothing. What it promises, and how, is on [`TokenBucketOf`], the
/// type it names; [`LockingTokenBucket`] is its twin under a mutex.
///
/// ```
/// use tollgate::{Rate, RateLimiter, TokenBucket};
///
/// let bucket = TokenBucket::new(10, Rate::per_second(100)).unwrap();
/// if bucket.try_acquire().is_ok() {
///     // handle the request
/// }
/// ```
pub type TokenBucket<C = MonotonicClock> = TokenBucketOf<Atomic, C>;

/// The [`TokenBucket`]'s locking twin: the same TAT word and the same decision
/// function, under a `parking_lot` mutex instead of a CAS loop.
///
/// Given the same clock readings it makes the same decisions, with the same
/// retry-after. It is the baseline in the benchmarks, the second opinion in the
/// property tests, and a fallback for anyone who prefers a lock. Its methods,
/// errors and guarantee are the [`TokenBucket`]'s: both name [`TokenBucketOf`].
///
/// ```
/// use tollgate::{ConfigError, LockingTokenBucket, Rate, RateLimiter};
///
/// let bucket = LockingTokenBucket::new(2, Rate::per_hour(1)).unwrap();
/// assert!(bucket.try_acquire_n(2).is_ok());
/// assert!(bucket.try_acquire().is_err());
/// assert_eq!(LockingTokenBucket::new(1, Rate::per_second(0)).unwrap_err(), ConfigError::ZeroRate);
/// ```
pub type LockingTokenBucket<C = MonotonicClock> = TokenBucketOf<Locked, C>;

word_limiter!(
    /// A token bucket: the one type behind [`TokenBucket`] (its word in an atomic,
    /// updated by compare-and-swap) and [`LockingTokenBucket`] (the same word under
    /// a mutex). Every method, decision and guarantee is the same for both, and
    /// documented here; name it through those two, since the parameter `H` says
    /// only where the word lives.
    ///
    /// A bucket of `capacity` permits refills at `rate`; a request for `n` permits
    /// takes them all or none. Instead of storing a token count and a refill time
    /// (two words that must change together), the bucket stores one instant, the
    /// *theoretical arrival time* (TAT): when the bucket will be full again if nothing
    /// more is admitted. Tokens available at `now` are
    /// `(now + capacity·interval − max(TAT, now)) / interval`, where `interval` is
    /// the time per permit.
    ///
    /// For one bucket shared by many threads on many cores, [`LeasedTokenBucket`]
    /// keeps the same guarantee while most checks write only the calling thread's
    /// own cache line (permits leased to per-core stripes).
    ///
    /// # State
    ///
    /// | bits | meaning |
    /// |---|---|
    /// | 0–63 | TAT in nanoseconds since the limiter was built; `0` = full at birth. At most `(2^62 − 1) + capacity·interval < 2^63`: bit 63 is always clear. |
    ///
    /// | operation | reads | writes |
    /// |---|---|---|
    /// | admit `n` at `now` | TAT | `max(TAT, now) + n·interval`, by CAS (the twin: under its mutex), if that is `≤ now + capacity·interval` |
    /// | deny | TAT | nothing |
    /// | snapshot | TAT | nothing |
    ///
    /// # Guarantee
    ///
    /// Under any interleaving, permits admitted at decision times in any interval
    /// `[a, b]` number at most `capacity + (b − a) / interval`. Each admission moves
    /// the TAT forward by its own `n·interval` from at least its decision time, and
    /// never past that time plus `capacity·interval`; summing over the admissions in
    /// `[a, b]` gives the bound. The loom models in `loom-tests/` check it in every
    /// interleaving of small cases, with the clock moving inside the model.
    ///
    /// Single-threaded, the bucket is *tight*: it admits every request the bound
    /// allows, and a denial's retry-after is exact to the nanosecond.
    ///
    /// # Rate precision
    ///
    /// The interval is `period / permits` in whole nanoseconds, rounded up: exact for
    /// 100 per second (10 ms) or 30 per minute (2 s); 7 per second becomes one permit
    /// per 142,857,143 ns, 0.0000002% slower than asked. The limiter never runs
    /// faster than configured. There is no floating point anywhere in a decision.
    ///
    /// # Stale and backwards time
    ///
    /// A reading older than the TAT's last writer only lowers `now + capacity·interval`,
    /// so it can deny, never over-admit. A clock that steps back makes the bucket
    /// deny until the clock regains the lost ground, then it carries on unchanged.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Denied, ManualClock, Rate, RateLimiter, TokenBucket};
    ///
    /// let clock = ManualClock::new();
    /// // Bursts of up to 5, refilling 100 per second (one per 10 ms).
    /// let bucket = TokenBucket::with_clock(5, Rate::per_second(100), clock.clone()).unwrap();
    /// assert!(bucket.try_acquire_n(5).is_ok());
    /// assert_eq!(bucket.try_acquire(), Err(Denied::RetryAfter(Duration::from_millis(10))));
    /// clock.advance(Duration::from_millis(10));
    /// assert!(bucket.try_acquire().is_ok());
    /// ```
    TokenBucketOf<H>, Gcra, "TokenBucket", "LockingTokenBucket"
);

// Reservations on the same TAT word, booked ahead.
word_reserve!([H: Home, C: Clock] TokenBucketOf<H, C>);

/// The bucket's and its twin's constructor on the default clock (the example
/// runs on the lock-free one; the twin answers the same).
impl<H: Home> TokenBucketOf<H> {
    /// A full bucket of `capacity` permits, refilled at `rate`, on the default
    /// [`MonotonicClock`].
    ///
    /// Errors: [`ConfigError::ZeroCapacity`], [`ConfigError::ZeroRate`],
    /// [`ConfigError::ZeroPeriod`], [`ConfigError::TooFine`] (more than one permit
    /// per nanosecond), [`ConfigError::Overflow`] (`capacity` permits take longer
    /// than 2^62 ns to refill).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Rate, TokenBucket};
    ///
    /// let api = TokenBucket::new(100, Rate::per_second(100)).unwrap();
    /// let quota = TokenBucket::new(30, Rate::per_minute(30)).unwrap();
    /// let pacer = TokenBucket::new(1, Rate::new(5, Duration::from_millis(10))).unwrap();
    /// # let _ = (api, quota, pacer);
    /// ```
    pub fn new(capacity: u32, rate: Rate) -> Result<Self, ConfigError> {
        Self::with_clock(capacity, rate, MonotonicClock::new())
    }
}

/// The methods of the bucket and its twin on any clock (each example runs on
/// the lock-free one; the twin answers the same).
impl<H: Home, C: Clock> TokenBucketOf<H, C> {
    /// As [`new`](Self::new), reading `clock`: a [`CachedClock`](crate::CachedClock)
    /// for the fastest checks, a [`ManualClock`](crate::ManualClock) in tests.
    ///
    /// ```
    /// use tollgate::{CachedClock, Rate, TokenBucket};
    /// let bucket = TokenBucket::with_clock(10, Rate::per_second(10), CachedClock::new()).unwrap();
    /// # let _ = bucket;
    /// ```
    pub fn with_clock(capacity: u32, rate: Rate, clock: C) -> Result<Self, ConfigError> {
        Ok(TokenBucketOf {
            inner: WordLimiter::new(Gcra::new(capacity, rate)?, clock),
        })
    }

    /// The time one permit takes to refill: the rate's period divided by its
    /// permits, rounded up to a whole nanosecond.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Rate, TokenBucket};
    /// let bucket = TokenBucket::new(1, Rate::per_second(7)).unwrap();
    /// assert_eq!(bucket.emission_interval(), Duration::from_nanos(142_857_143));
    /// ```
    pub fn emission_interval(&self) -> Duration {
        self.inner.machine().interval()
    }

    /// The clock this bucket reads.
    ///
    /// ```
    /// use tollgate::{Clock, ManualClock, Rate, TokenBucket};
    /// let clock = ManualClock::new();
    /// let bucket = TokenBucket::with_clock(10, Rate::per_second(10), clock.clone()).unwrap();
    /// clock.set(7);
    /// assert_eq!(bucket.clock().now(), 7);
    /// ```
    pub fn clock(&self) -> &C {
        self.inner.clock()
    }
}
