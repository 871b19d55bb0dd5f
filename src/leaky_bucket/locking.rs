//! The leaky bucket's locking twins.

use std::time::Duration;

use super::meter::Meter;
use super::shaper::shaper;
use crate::cell::LockedCell;
use crate::clock::{Clock, MonotonicClock};
use crate::error::ConfigError;
use crate::machine::{WordLimiter, word_limiter};
use crate::rate::Rate;
use crate::waiting::word_reserve;

word_limiter!(
    /// The [`LeakyBucket`](crate::LeakyBucket)'s twin: the same `empty_at` word
    /// and decision function under a `parking_lot` mutex. Same clock readings,
    /// same decisions.
    ///
    /// ```
    /// use tollgate::{LockingLeakyBucket, Rate, RateLimiter};
    ///
    /// let bucket = LockingLeakyBucket::new(2, Rate::per_hour(1)).unwrap();
    /// assert!(bucket.try_acquire_n(2).is_ok());
    /// assert!(bucket.try_acquire().is_err());
    /// ```
    LockingLeakyBucket,
    Meter,
    LockedCell<u64>,
    "10, Rate::per_second(10)"
);

impl LockingLeakyBucket {
    /// As [`LeakyBucket::new`](crate::LeakyBucket::new), with the same errors.
    ///
    /// ```
    /// use tollgate::{ConfigError, LockingLeakyBucket, Rate};
    /// assert_eq!(LockingLeakyBucket::new(1, Rate::per_second(0)).unwrap_err(), ConfigError::ZeroRate);
    /// ```
    pub fn new(capacity: u32, rate: Rate) -> Result<Self, ConfigError> {
        Self::with_clock(capacity, rate, MonotonicClock::new())
    }
}

impl<C: Clock> LockingLeakyBucket<C> {
    /// As [`LeakyBucket::with_clock`](crate::LeakyBucket::with_clock).
    ///
    /// ```
    /// use tollgate::{LockingLeakyBucket, ManualClock, Rate};
    /// let bucket = LockingLeakyBucket::with_clock(1, Rate::per_second(1), ManualClock::new()).unwrap();
    /// # let _ = bucket;
    /// ```
    pub fn with_clock(capacity: u32, rate: Rate, clock: C) -> Result<Self, ConfigError> {
        Ok(LockingLeakyBucket {
            inner: WordLimiter::new(Meter::new(capacity, rate)?, clock),
        })
    }

    /// As [`LeakyBucket::drain_interval`](crate::LeakyBucket::drain_interval).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{LockingLeakyBucket, Rate};
    /// let bucket = LockingLeakyBucket::new(1, Rate::per_second(100)).unwrap();
    /// assert_eq!(bucket.drain_interval(), Duration::from_millis(10));
    /// ```
    pub fn drain_interval(&self) -> Duration {
        self.inner.machine().interval()
    }
}

word_reserve!(LockingLeakyBucket);

shaper!(
    /// The [`Shaper`](crate::Shaper)'s twin: the same schedule end and the same
    /// decisions under a `parking_lot` mutex, including reservations and their
    /// cancellation.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{LockingShaper, Rate, Reserve};
    ///
    /// let shaper = LockingShaper::new(Rate::per_second(1000), 0, Duration::from_millis(10)).unwrap();
    /// shaper.acquire(1).unwrap();
    /// ```
    LockingShaper,
    LockedCell<u128>
);
