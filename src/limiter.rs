//! The trait every limiter implements.

use std::time::Duration;

use crate::error::Denied;

/// A rate limiter: ask for permits, get a plain yes or a [`Denied`] that says why
/// and, when waiting helps, for how long.
///
/// Every tollgate limiter implements it — the lock-free ones and their locking
/// twins alike — so code can be written once against `&dyn RateLimiter` or a
/// generic `L: RateLimiter`.
///
/// ```
/// use std::time::Duration;
/// use tollgate::{Denied, FixedWindow, ManualClock, Rate, RateLimiter, TokenBucket};
///
/// fn serve(limiter: &dyn RateLimiter) -> &'static str {
///     match limiter.try_acquire() {
///         Ok(()) => "200 OK",
///         Err(Denied::RetryAfter(_)) => "429 Too Many Requests",
///         Err(_) => "400 Bad Request",
///     }
/// }
///
/// let clock = ManualClock::new();
/// let bucket = TokenBucket::with_clock(1, Rate::per_second(1), clock.clone()).unwrap();
/// let window = FixedWindow::with_clock(Rate::per_second(1), clock.clone()).unwrap();
/// for limiter in [&bucket as &dyn RateLimiter, &window] {
///     assert_eq!(serve(limiter), "200 OK");
///     assert_eq!(serve(limiter), "429 Too Many Requests");
/// }
/// ```
pub trait RateLimiter {
    /// Asks for one permit.
    ///
    /// ```
    /// use tollgate::{Rate, RateLimiter, TokenBucket};
    /// let bucket = TokenBucket::new(1, Rate::per_hour(1)).unwrap();
    /// assert!(bucket.try_acquire().is_ok());
    /// assert!(bucket.try_acquire().is_err());
    /// ```
    #[inline]
    fn try_acquire(&self) -> Result<(), Denied> {
        self.try_acquire_n(1)
    }

    /// Asks for `n` permits at once: all of them are granted, or none.
    ///
    /// Errors: [`Denied::RetryAfter`] when the permits are not available yet,
    /// [`Denied::ExceedsCapacity`] when `n` is more than the limiter can ever grant
    /// at once, [`Denied::ZeroPermits`] when `n` is zero. A denial changes nothing.
    ///
    /// ```
    /// use tollgate::{Denied, Rate, RateLimiter, TokenBucket};
    /// let bucket = TokenBucket::new(10, Rate::per_hour(10)).unwrap();
    /// assert!(bucket.try_acquire_n(7).is_ok());
    /// assert!(matches!(bucket.try_acquire_n(7), Err(Denied::RetryAfter(_))));
    /// assert_eq!(bucket.try_acquire_n(0), Err(Denied::ZeroPermits));
    /// ```
    fn try_acquire_n(&self, n: u32) -> Result<(), Denied>;

    /// Reads the limiter's state without consuming anything.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{ManualClock, Rate, RateLimiter, TokenBucket};
    /// let clock = ManualClock::new();
    /// let bucket = TokenBucket::with_clock(10, Rate::per_second(10), clock).unwrap();
    /// bucket.try_acquire_n(4).unwrap();
    /// let snap = bucket.snapshot();
    /// assert_eq!((snap.available, snap.capacity), (6, 10));
    /// assert_eq!(snap.until_full, Duration::from_millis(400));
    /// ```
    fn snapshot(&self) -> Snapshot;
}

/// A non-consuming read of a limiter: what a request could get right now.
///
/// ```
/// use tollgate::{Rate, RateLimiter, TokenBucket};
/// let snap = TokenBucket::new(5, Rate::per_second(5)).unwrap().snapshot();
/// assert_eq!(snap.available, 5);
/// assert!(snap.until_full.is_zero());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Snapshot {
    /// Permits a request could be granted now.
    pub available: u32,
    /// The most permits the limiter can hold (burst capacity, or limit per window).
    pub capacity: u32,
    /// Time until `available == capacity` if nothing else is admitted.
    pub until_full: Duration,
}

impl Snapshot {
    pub(crate) fn new(available: u32, capacity: u32, until_full_ns: u64) -> Self {
        Snapshot {
            available,
            capacity,
            until_full: Duration::from_nanos(until_full_ns),
        }
    }
}

/// Checks `n` against the capacity: the part of every decision that does not
/// depend on state.
#[inline]
pub(crate) fn check_request(n: u32, capacity: u32) -> Result<(), Denied> {
    if n == 0 {
        Err(Denied::ZeroPermits)
    } else if n > capacity {
        Err(Denied::ExceedsCapacity {
            requested: n,
            capacity,
        })
    } else {
        Ok(())
    }
}
