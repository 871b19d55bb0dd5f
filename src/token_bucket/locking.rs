//! The token bucket's locking twin.

use std::time::Duration;

use super::gcra::Gcra;
use crate::cell::LockedCell;
use crate::clock::{Clock, MonotonicClock};
use crate::error::ConfigError;
use crate::machine::{WordLimiter, word_limiter};
use crate::rate::Rate;
use crate::waiting::word_reserve;

word_limiter!(
    /// The [`TokenBucket`](crate::TokenBucket)'s twin: the same TAT word and the
    /// same decision function, under a `parking_lot` mutex instead of a CAS loop.
    ///
    /// Given the same clock readings it makes the same decisions, with the same
    /// retry-after. It is the baseline in the benchmarks, the second opinion in the
    /// property tests, and a fallback for anyone who prefers a lock.
    ///
    /// ```
    /// use tollgate::{LockingTokenBucket, Rate, RateLimiter};
    ///
    /// let bucket = LockingTokenBucket::new(2, Rate::per_hour(1)).unwrap();
    /// assert!(bucket.try_acquire_n(2).is_ok());
    /// assert!(bucket.try_acquire().is_err());
    /// ```
    LockingTokenBucket,
    Gcra,
    LockedCell<u64>,
    "10, Rate::per_second(10)"
);

impl LockingTokenBucket {
    /// As [`TokenBucket::new`](crate::TokenBucket::new), with the same errors.
    ///
    /// ```
    /// use tollgate::{ConfigError, LockingTokenBucket, Rate};
    /// assert_eq!(LockingTokenBucket::new(1, Rate::per_second(0)).unwrap_err(), ConfigError::ZeroRate);
    /// ```
    pub fn new(capacity: u32, rate: Rate) -> Result<Self, ConfigError> {
        Self::with_clock(capacity, rate, MonotonicClock::new())
    }
}

impl<C: Clock> LockingTokenBucket<C> {
    /// As [`TokenBucket::with_clock`](crate::TokenBucket::with_clock).
    ///
    /// ```
    /// use tollgate::{LockingTokenBucket, ManualClock, Rate};
    /// let bucket = LockingTokenBucket::with_clock(1, Rate::per_second(1), ManualClock::new()).unwrap();
    /// # let _ = bucket;
    /// ```
    pub fn with_clock(capacity: u32, rate: Rate, clock: C) -> Result<Self, ConfigError> {
        Ok(LockingTokenBucket {
            inner: WordLimiter::new(Gcra::new(capacity, rate)?, clock),
        })
    }

    /// As [`TokenBucket::emission_interval`](crate::TokenBucket::emission_interval).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{LockingTokenBucket, Rate};
    /// let bucket = LockingTokenBucket::new(1, Rate::per_second(100)).unwrap();
    /// assert_eq!(bucket.emission_interval(), Duration::from_millis(10));
    /// ```
    pub fn emission_interval(&self) -> Duration {
        self.inner.machine().interval()
    }
}

word_reserve!(LockingTokenBucket);
