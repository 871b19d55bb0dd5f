//! Waiting your turn: reservations, cancellation, blocking and async acquire.
//!
//! The user-facing documentation (promise, state, proof) is on [`Reserve`].

mod retry;
mod schedule;

#[cfg(feature = "tokio")]
mod future;

use std::time::Duration;

use crate::error::Denied;

pub use retry::RetryAcquire;
pub(crate) use schedule::{MAX_WAIT, schedule, wait_bound};

/// Implements [`RawReserve`](sealed::RawReserve) for a limiter type over a
/// [`WordLimiter`](crate::machine::WordLimiter) whose machine is a
/// [`Schedule`](crate::machine::Schedule) (token bucket, leaky bucket meter,
/// shaper, warm-up): bookings and cancellations are the driver's. Invoke it
/// in the module that can see the type's `inner` field, as
/// `word_reserve!([generics] Type)`.
macro_rules! word_reserve {
    ([$($generics:tt)*] $limiter:ty) => {
        impl<$($generics)*> $crate::waiting::sealed::RawReserve for $limiter {
            fn timeline_now(&self) -> u64 {
                self.inner.now()
            }

            #[inline]
            fn reserve_raw(
                &self,
                permits: u32,
                max_wait: u64,
            ) -> Result<$crate::waiting::sealed::Ticket, $crate::error::Denied> {
                self.inner.reserve(permits, max_wait)
            }

            fn cancel_raw(&self, ticket: &$crate::waiting::sealed::Ticket) -> bool {
                self.inner.cancel(ticket)
            }
        }
    };
}

pub(crate) use word_reserve;

pub(crate) mod sealed {
    use crate::error::Denied;
    pub(crate) use crate::machine::Ticket;

    /// The raw operations behind [`Reserve`](super::Reserve). Sealed: only
    /// tollgate's limiters can be reserved from, because cancellation relies on
    /// each one's state moving strictly forward with every booking.
    #[allow(unreachable_pub)] // reachable only as a sealed supertrait
    pub trait RawReserve {
        /// Nanoseconds since the limiter was built, on its clock.
        fn timeline_now(&self) -> u64;

        /// Books `permits` at the earliest allowed start, if it is at most
        /// `max_wait` ns away (already clamped to the maximum wait); otherwise
        /// writes nothing.
        fn reserve_raw(&self, permits: u32, max_wait: u64) -> Result<Ticket, Denied>;

        /// Rolls the state from `ticket.after` back to `ticket.before` if it is
        /// still `ticket.after`, by compare-and-swap. `true` if it was.
        fn cancel_raw(&self, ticket: &Ticket) -> bool;
    }
}

use sealed::{RawReserve, Ticket};

/// A limiter that can book permits ahead: the waiting half of rate limiting.
///
/// Implemented by [`TokenBucket`](crate::TokenBucket), the leaky bucket
/// [`LeakyBucket`](crate::LeakyBucket) and [`Shaper`](crate::Shaper),
/// [`WarmUp`](crate::WarmUp), and all their locking twins
/// ([`LockingTokenBucket`](crate::LockingTokenBucket) included).
///
/// ```
/// use std::time::Duration;
/// use tollgate::{Denied, Rate, Reserve, TokenBucket};
///
/// let bucket = TokenBucket::new(1, Rate::per_second(1000)).unwrap();
/// bucket.acquire(1).unwrap(); // immediate: the bucket starts full
/// bucket.acquire(1).unwrap(); // sleeps about a millisecond
///
/// let hourly = TokenBucket::new(1, Rate::per_hour(1)).unwrap();
/// hourly.acquire(1).unwrap();
/// assert!(matches!(
///     hourly.acquire_timeout(1, Duration::from_millis(10)), // an hour away: no wait
///     Err(Denied::RetryAfter(_))
/// ));
/// ```
///
/// Waiting your turn: reservations, cancellation, blocking and async acquire.
///
/// Rejecting is half of rate limiting; the other half is making a caller wait.
/// A limiter that implements [`Reserve`] hands out [`Reservation`]s: `reserve(n)`
/// books `n` permits at the earliest instant the limiter allows *behind
/// everything booked before*, and says when that is. The caller then sleeps
/// ([`Reservation::wait`], [`Reserve::acquire`]), awaits
/// (`Reservation::wait_async`, `Reserve::acquire_async`, with the `tokio`
/// feature), or gives the permits back ([`Reservation::cancel`]).
///
/// ```
/// use std::time::Duration;
/// use tollgate::{ManualClock, Rate, Reserve, TokenBucket};
///
/// let clock = ManualClock::new();
/// let bucket = TokenBucket::with_clock(1, Rate::per_second(10), clock.clone()).unwrap();
/// let first = bucket.reserve(1).unwrap();
/// let second = bucket.reserve(1).unwrap();
/// assert_eq!(first.delay(), Duration::ZERO);
/// assert_eq!(second.delay(), Duration::from_millis(100));
/// // Changed our mind: the second permit goes back, as if never taken.
/// assert!(second.cancel());
/// assert_eq!(bucket.reserve(1).unwrap().delay(), Duration::from_millis(100));
/// ```
///
/// # Guarantees
///
/// - **Order.** Reservations are granted in the order they were made: each one's
///   start is no earlier than the start of any reservation made before it. A big
///   request is therefore never starved by a stream of small ones — it takes its
///   place in the queue, and the small ones queue behind it. (governor's
///   `until_ready` polls and sleeps, so a big request keeps losing to small ones
///   that fit into the gaps.) With readings in order, that is; when a
///   reservation's clock reading is older than an earlier one's (stale, or a
///   clock that stepped back), the [`Shaper`](crate::Shaper) still keeps the
///   order, but a token bucket or meter reservation can start before an earlier
///   one that was granted spare capacity — their rate bound holds either way
///   (see `docs/guide/waiting.md`).
/// - **The limit holds.** Starts obey the limiter's own invariant (for a token
///   bucket: at most `capacity + rate·(b − a)` permits start in any `[a, b]`);
///   the tests check it on every recorded start.
/// - **Bounded waits leave no trace.** `reserve_within(n, d)` and
///   `acquire_timeout(n, d)` decide before they write: if the start would be more
///   than `d` away, they return [`Denied::RetryAfter`] and the limiter is
///   exactly as it was.
/// - **Cancel returns the permits of the latest reservation, exactly**, and never
///   disturbs any other reservation (see below).
///
/// # Cancellation, and why it returns only the latest reservation
///
/// [`Reservation::cancel`] gives the permits back when no reservation made after
/// it is still outstanding: the limiter's state is rolled back, by one
/// compare-and-swap, to what it was before the reservation — as if it had never
/// been made. Reservations cancelled in reverse order (the usual case: the
/// newest waiter is the one whose wait is too long) all come back.
///
/// When a later reservation is still outstanding, the cancelled permits sit in
/// the *middle* of the queue. Later reservations keep their start times (they
/// were promised), so the hole cannot be closed; and a newcomer may not use it
/// either without being granted before the reservations queued ahead of it.
/// `cancel` then returns `false` and changes nothing: the hole costs throughput
/// once, never correctness.
///
/// Go's `x/time/rate` tries to do better and gets it wrong: `CancelAt` restores
/// `tokens − (tokens reserved after it)`, inferring the later tokens from the
/// distance between the last event and its own. golang/go#56924 reports it
/// returning less than it should, #69419 the wrong amount. Worse, the inference
/// breaks once a *second* out-of-order cancel has moved the state: an exhaustive
/// search over every sequence of up to eight reserves, cancels and clock ticks
/// (bucket of 3, exact integer arithmetic, so floating point is not the culprit)
/// finds Go's formula admitting 4 permits at one instant from a bucket of 3 —
/// reserve 1, 1, 3, 3, 1 at `t = 0`, cancel the fourth, then the third, reserve
/// 3. A one-word state cannot know which later reservations are still
/// outstanding, so tollgate returns permits only when it can prove it safe.
///
/// Limiters that cannot book ahead (the sliding log, the windows, an
/// [`AllOf`](crate::AllOf), a key of a [`Keyed`](crate::keyed::Keyed) limiter) wait
/// through [`RetryAcquire`] instead: sleep out the retry-after and ask again,
/// cancel-safe but with no queue order (see its docs).
///
/// # Clocks
///
/// Waiting sleeps in real time until the limiter's clock reaches the start.
/// With a [`ManualClock`](crate::ManualClock) nothing moves until someone
/// advances it, so a blocked waiter re-checks the clock after each sleep.
pub trait Reserve: RawReserve {
    /// Books `n` permits at the earliest start the limiter allows, however far
    /// away (up to 2^61 ns, about 73 years).
    ///
    /// Errors: [`Denied::ZeroPermits`], [`Denied::ExceedsCapacity`]; never
    /// [`Denied::RetryAfter`] short of the 73 years.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{ManualClock, Rate, Reserve, TokenBucket};
    ///
    /// let clock = ManualClock::new();
    /// let bucket = TokenBucket::with_clock(2, Rate::per_second(2), clock).unwrap();
    /// let now = bucket.reserve(2).unwrap();
    /// let later = bucket.reserve(1).unwrap();
    /// assert_eq!((now.delay(), later.delay()), (Duration::ZERO, Duration::from_millis(500)));
    /// ```
    fn reserve(&self, n: u32) -> Result<Reservation<'_, Self>, Denied> {
        self.reserve_within(n, Duration::MAX)
    }

    /// Books `n` permits if they can be used within `max_wait`; otherwise returns
    /// [`Denied::RetryAfter`] (how much later the same request would fit) and
    /// changes nothing.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Denied, ManualClock, Rate, Reserve, TokenBucket};
    ///
    /// let clock = ManualClock::new();
    /// let bucket = TokenBucket::with_clock(1, Rate::per_second(10), clock).unwrap();
    /// let _first = bucket.reserve(1).unwrap();
    /// assert_eq!(
    ///     bucket.reserve_within(1, Duration::from_millis(40)).unwrap_err(),
    ///     Denied::RetryAfter(Duration::from_millis(60)),
    /// );
    /// assert!(bucket.reserve_within(1, Duration::from_millis(100)).is_ok());
    /// ```
    fn reserve_within(&self, n: u32, max_wait: Duration) -> Result<Reservation<'_, Self>, Denied> {
        let ticket = self.reserve_raw(n, wait_bound(max_wait))?;
        Ok(Reservation {
            limiter: self,
            ticket,
        })
    }

    /// Blocks the thread until `n` permits are granted, in reservation order.
    ///
    /// Errors: [`Denied::ZeroPermits`], [`Denied::ExceedsCapacity`].
    ///
    /// ```
    /// use tollgate::{Rate, Reserve, TokenBucket};
    /// let bucket = TokenBucket::new(5, Rate::per_second(1000)).unwrap();
    /// for _ in 0..10 {
    ///     bucket.acquire(1).unwrap(); // five at once, then one per millisecond
    /// }
    /// ```
    fn acquire(&self, n: u32) -> Result<(), Denied> {
        self.reserve(n)?.wait();
        Ok(())
    }

    /// Blocks until `n` permits are granted if that takes at most `timeout`;
    /// otherwise returns [`Denied::RetryAfter`] at once, leaving no trace.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Denied, Rate, Reserve, TokenBucket};
    ///
    /// let bucket = TokenBucket::new(1, Rate::per_hour(1)).unwrap();
    /// bucket.acquire_timeout(1, Duration::ZERO).unwrap();
    /// let again = bucket.acquire_timeout(1, Duration::from_millis(1));
    /// assert!(matches!(again, Err(Denied::RetryAfter(_))));
    /// ```
    fn acquire_timeout(&self, n: u32, timeout: Duration) -> Result<(), Denied> {
        self.reserve_within(n, timeout)?.wait();
        Ok(())
    }

    /// Waits asynchronously, on tokio's timer, until `n` permits are granted.
    /// Dropping the future before it completes cancels its reservation (see
    /// [`Reservation::cancel`] for what that returns).
    ///
    /// Errors: [`Denied::ZeroPermits`], [`Denied::ExceedsCapacity`].
    ///
    /// ```
    /// use tollgate::{Rate, Reserve, TokenBucket};
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let bucket = TokenBucket::new(1, Rate::per_second(1000)).unwrap();
    /// bucket.acquire_async(1).await.unwrap();
    /// bucket.acquire_async(1).await.unwrap(); // about a millisecond later
    /// # });
    /// ```
    #[cfg(feature = "tokio")]
    fn acquire_async(&self, n: u32) -> impl std::future::Future<Output = Result<(), Denied>> + '_ {
        future::acquire(self, n, Duration::MAX)
    }

    /// As [`Reserve::acquire_async`], but returns [`Denied::RetryAfter`] at once,
    /// leaving no trace, if the wait would exceed `timeout`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Rate, Reserve, TokenBucket};
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let bucket = TokenBucket::new(1, Rate::per_hour(1)).unwrap();
    /// bucket.acquire_timeout_async(1, Duration::ZERO).await.unwrap();
    /// assert!(bucket.acquire_timeout_async(1, Duration::from_secs(1)).await.is_err());
    /// # });
    /// ```
    #[cfg(feature = "tokio")]
    #[allow(async_fn_in_trait)] // its future is `Send` as `acquire_async`'s is: where the limiter is `Sync`
    async fn acquire_timeout_async(&self, n: u32, timeout: Duration) -> Result<(), Denied> {
        future::acquire(self, n, timeout).await
    }
}

impl<L: RawReserve + ?Sized> Reserve for L {}

/// Permits booked from a limiter, usable from [`Reservation::delay`] on.
///
/// Dropping a reservation keeps its permits (they are spent, used or not); to
/// give them back, [`cancel`](Reservation::cancel) it.
///
/// ```
/// use std::time::Duration;
/// use tollgate::{ManualClock, Rate, Reserve, Shaper};
///
/// let clock = ManualClock::new();
/// let shaper = Shaper::with_clock(Rate::per_second(4), 0, Duration::from_secs(1), clock).unwrap();
/// let starts: Vec<_> = (0..3).map(|_| shaper.reserve(1).unwrap().ready_at()).collect();
/// assert_eq!(starts, [Duration::ZERO, Duration::from_millis(250), Duration::from_millis(500)]);
/// ```
#[must_use = "a reservation spends its permits whether or not it is waited on; cancel it to give them back"]
#[derive(Debug)]
pub struct Reservation<'a, L: RawReserve + ?Sized> {
    limiter: &'a L,
    ticket: Ticket,
}

impl<'a, L: RawReserve + ?Sized> Reservation<'a, L> {
    /// The permits booked.
    ///
    /// ```
    /// use tollgate::{Rate, Reserve, TokenBucket};
    /// let bucket = TokenBucket::new(5, Rate::per_second(5)).unwrap();
    /// assert_eq!(bucket.reserve(3).unwrap().permits(), 3);
    /// ```
    pub fn permits(&self) -> u32 {
        self.ticket.permits
    }

    /// When the permits may be used, measured from the limiter's construction on
    /// its clock (with a [`ManualClock`](crate::ManualClock) that starts at zero,
    /// simply the clock's time).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{ManualClock, Rate, Reserve, TokenBucket};
    ///
    /// let clock = ManualClock::new();
    /// clock.advance(Duration::from_secs(5));
    /// let bucket = TokenBucket::with_clock(1, Rate::per_second(1), clock.clone()).unwrap();
    /// clock.advance(Duration::from_secs(1));
    /// let _ = bucket.reserve(1).unwrap();
    /// assert_eq!(bucket.reserve(1).unwrap().ready_at(), Duration::from_secs(2));
    /// ```
    pub fn ready_at(&self) -> Duration {
        Duration::from_nanos(self.ticket.start)
    }

    /// How long until the permits may be used, from a fresh clock reading; zero
    /// once they may.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{ManualClock, Rate, Reserve, TokenBucket};
    ///
    /// let clock = ManualClock::new();
    /// let bucket = TokenBucket::with_clock(1, Rate::per_second(1), clock.clone()).unwrap();
    /// let _ = bucket.reserve(1).unwrap();
    /// let next = bucket.reserve(1).unwrap();
    /// clock.advance(Duration::from_millis(300));
    /// assert_eq!(next.delay(), Duration::from_millis(700));
    /// ```
    pub fn delay(&self) -> Duration {
        Duration::from_nanos(
            self.ticket
                .start
                .saturating_sub(self.limiter.timeline_now()),
        )
    }

    /// Whether the permits may be used now.
    ///
    /// ```
    /// use tollgate::{Rate, Reserve, TokenBucket};
    /// let bucket = TokenBucket::new(1, Rate::per_hour(1)).unwrap();
    /// assert!(bucket.reserve(1).unwrap().is_ready());
    /// assert!(!bucket.reserve(1).unwrap().is_ready());
    /// ```
    pub fn is_ready(&self) -> bool {
        self.limiter.timeline_now() >= self.ticket.start
    }

    /// Blocks the thread until the permits may be used.
    ///
    /// ```
    /// use tollgate::{Rate, Reserve, TokenBucket};
    /// let bucket = TokenBucket::new(1, Rate::per_second(1000)).unwrap();
    /// bucket.reserve(1).unwrap().wait();
    /// let next = bucket.reserve(1).unwrap();
    /// next.wait(); // about a millisecond
    /// ```
    pub fn wait(self) {
        loop {
            let now = self.limiter.timeline_now();
            if now >= self.ticket.start {
                return;
            }
            // Sleep the whole remainder: an early wake-up (or a clock running
            // slower than real time) just loops once more.
            std::thread::sleep(Duration::from_nanos(self.ticket.start - now));
        }
    }

    /// Waits asynchronously, on tokio's timer, until the permits may be used.
    /// Dropping the future before it completes cancels the reservation.
    ///
    /// ```
    /// use tollgate::{Rate, Reserve, TokenBucket};
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let bucket = TokenBucket::new(1, Rate::per_second(1000)).unwrap();
    /// bucket.reserve(1).unwrap().wait_async().await;
    /// # });
    /// ```
    #[cfg(feature = "tokio")]
    pub async fn wait_async(self) {
        future::wait(self).await
    }

    /// Gives the permits back if no reservation made after this one is still
    /// outstanding, restoring the limiter exactly as it was before this
    /// reservation; returns whether it did. Otherwise changes nothing and returns
    /// `false` (see [`Reserve`] for why). Either way, other
    /// reservations are untouched.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{ManualClock, Rate, Reserve, TokenBucket};
    ///
    /// let clock = ManualClock::new();
    /// let bucket = TokenBucket::with_clock(1, Rate::per_second(1), clock).unwrap();
    /// let a = bucket.reserve(1).unwrap();
    /// let b = bucket.reserve(1).unwrap();
    /// let c = bucket.reserve(1).unwrap();
    /// assert!(!b.cancel()); // c is queued behind it: nothing moves
    /// assert!(c.cancel());
    /// assert_eq!(bucket.reserve(1).unwrap().ready_at(), Duration::from_secs(2));
    /// # let _ = a;
    /// ```
    pub fn cancel(self) -> bool {
        self.limiter.cancel_raw(&self.ticket)
    }
}
