//! Waiting for limiters that cannot book ahead: sleep out the retry-after,
//! then ask again.
//!
//! [`Reserve`](super::Reserve) books permits in order on limiters whose state
//! is one schedule (the buckets, the shaper, warm-up). The others — the
//! sliding log, the windows, an [`AllOf`](crate::AllOf), a key of a
//! [`Keyed`](crate::keyed::Keyed) limiter — have no queue to book into, so their
//! waiting is [`RetryAcquire`]: ask; if denied with a retry-after, sleep that
//! long and ask again.
//!
//! The guarantees are on [`RetryAcquire`].

use std::time::Duration;

use crate::error::Denied;
use crate::limiter::RateLimiter;

/// Blocking and async waiting by retry-after, for limiters that cannot book
/// ahead: ask; if denied with a retry-after, sleep that long and ask again.
///
/// * **No queue order.** Waiters are not served in the order they started: a
///   request asking again after its wait competes with every request that
///   arrives meanwhile, so a large request can keep losing to small ones that
///   fit first. Where order matters, use a limiter that implements
///   [`Reserve`](crate::Reserve).
/// * **The limit holds exactly**: every permit is taken by the limiter's own
///   decision, as with `try_acquire_n`.
/// * **Cancel-safe**: nothing is taken until the decision that admits, which
///   is synchronous; a dropped `acquire_async` future, or a timeout, has taken
///   nothing.
/// * **Timeouts** count the waits slept (the retry-afters, on the limiter's
///   clock): `acquire_timeout` returns the [`Denied::RetryAfter`] at once when
///   the next wait would take the total past the timeout.
/// * **Clocks**: waits are slept in real time. With a
///   [`ManualClock`](crate::ManualClock) nothing changes until someone moves
///   it, so a waiter asks again after each sleep until it does.
///
/// Implemented by [`SlidingLog`](crate::SlidingLog),
/// [`SlidingWindow`](crate::SlidingWindow),
/// [`ApproxSlidingWindow`](crate::ApproxSlidingWindow),
/// [`FixedWindow`](crate::FixedWindow), their locking twins,
/// [`AllOf`](crate::AllOf) and [`ForKey`](crate::keyed::ForKey) (a key of a
/// [`Keyed`](crate::keyed::Keyed) limiter, which also has
/// [`Keyed::acquire`](crate::keyed::Keyed::acquire)), and [`Tunable`](crate::keyed::Tunable).
/// The buckets, shaper and
/// warm-up wait through [`Reserve`](crate::Reserve) instead, in order.
///
/// ```
/// use std::time::Duration;
/// use tollgate::{Denied, Rate, RetryAcquire, SlidingLog};
///
/// let log = SlidingLog::new(Rate::per_hour(1)).unwrap();
/// log.acquire(1).unwrap(); // admitted at once
/// // The next permit is an hour away: more than the timeout, so no wait.
/// assert!(matches!(log.acquire_timeout(1, Duration::from_millis(5)), Err(Denied::RetryAfter(_))));
/// ```
pub trait RetryAcquire: RateLimiter {
    /// Blocks the thread until `n` permits are admitted.
    ///
    /// Errors: [`Denied::ZeroPermits`], [`Denied::ExceedsCapacity`].
    ///
    /// ```
    /// use tollgate::{FixedWindow, Rate, RetryAcquire};
    /// let window = FixedWindow::new(Rate::per_second(1_000)).unwrap();
    /// for _ in 0..3 {
    ///     window.acquire(400).unwrap(); // the third waits for the next window
    /// }
    /// ```
    fn acquire(&self, n: u32) -> Result<(), Denied> {
        self.acquire_timeout(n, Duration::MAX)
    }

    /// Blocks until `n` permits are admitted if the waits it takes add up to
    /// at most `timeout`; otherwise returns the [`Denied::RetryAfter`] that
    /// would have taken it past the timeout, without waiting for it.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Denied, Rate, RateLimiter, RetryAcquire, SlidingLog};
    ///
    /// let log = SlidingLog::new(Rate::per_hour(2)).unwrap();
    /// log.acquire_timeout(2, Duration::ZERO).unwrap();
    /// assert!(matches!(log.acquire_timeout(1, Duration::from_secs(1)), Err(Denied::RetryAfter(_))));
    /// assert_eq!(log.snapshot().available, 0);
    /// ```
    fn acquire_timeout(&self, n: u32, timeout: Duration) -> Result<(), Denied> {
        let mut left = timeout;
        loop {
            match self.try_acquire_n(n) {
                Err(Denied::RetryAfter(wait)) if wait <= left => {
                    left -= wait;
                    std::thread::sleep(wait);
                }
                other => return other,
            }
        }
    }

    /// Waits asynchronously, on tokio's timer, until `n` permits are
    /// admitted. Dropping the future takes nothing.
    ///
    /// Errors: [`Denied::ZeroPermits`], [`Denied::ExceedsCapacity`].
    ///
    /// ```
    /// use tollgate::{Rate, RetryAcquire, SlidingLog};
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let log = SlidingLog::new(Rate::per_second(1_000)).unwrap();
    /// log.acquire_async(1_000).await.unwrap();
    /// log.acquire_async(1).await.unwrap(); // about a millisecond later
    /// # });
    /// ```
    #[cfg(feature = "tokio")]
    fn acquire_async(&self, n: u32) -> impl std::future::Future<Output = Result<(), Denied>> + '_ {
        self.acquire_timeout_async(n, Duration::MAX)
    }

    /// As [`acquire_async`](RetryAcquire::acquire_async), with the timeout of
    /// [`acquire_timeout`](RetryAcquire::acquire_timeout).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Rate, RetryAcquire, SlidingLog};
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let log = SlidingLog::new(Rate::per_hour(1)).unwrap();
    /// log.acquire_timeout_async(1, Duration::ZERO).await.unwrap();
    /// assert!(log.acquire_timeout_async(1, Duration::from_secs(1)).await.is_err());
    /// # });
    /// ```
    #[cfg(feature = "tokio")]
    #[allow(async_fn_in_trait)] // its future is `Send` as `acquire_async`'s is: where the limiter is `Sync`
    async fn acquire_timeout_async(&self, n: u32, timeout: Duration) -> Result<(), Denied> {
        let mut left = timeout;
        loop {
            match self.try_acquire_n(n) {
                Err(Denied::RetryAfter(wait)) if wait <= left => {
                    left -= wait;
                    // Nothing is held across this await: dropping the
                    // future here leaves the limiter untouched.
                    tokio::time::sleep(wait).await;
                }
                other => return other,
            }
        }
    }
}

macro_rules! retry_acquire {
    ($($limiter:ident),*) => {$(
        impl<C: crate::clock::Clock> RetryAcquire for crate::$limiter<C> {}
    )*};
}

retry_acquire!(
    SlidingLog,
    LockingSlidingLog,
    SlidingWindow,
    LockingSlidingWindow,
    ApproxSlidingWindow,
    LockingApproxSlidingWindow,
    FixedWindow,
    LockingFixedWindow
);

impl<T: crate::all_of::Members> RetryAcquire for crate::all_of::AllOf<T> {}
