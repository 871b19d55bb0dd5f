//! The leaky bucket, as a meter ([`LeakyBucket`]) and as a queue ([`Shaper`]),
//! each with a locking twin ([`LockingLeakyBucket`], [`LockingShaper`]): one
//! generic type per use, [`LeakyBucketOf`] and [`ShaperOf`].
//!
//! The user-facing documentation (promise, state, proof) is on [`LeakyBucketOf`].

pub(crate) mod meter;
pub(crate) mod shaper;

use std::time::Duration;

use crate::cell::{Atomic, Home, Locked};
use crate::clock::{Clock, MonotonicClock};
use crate::error::ConfigError;
use crate::machine::{WordLimiter, word_limiter};
use crate::rate::Rate;
use crate::waiting::word_reserve;
use meter::Meter;
use shaper::Queue;

/// A lock-free leaky bucket meter: up to `capacity` permits in the bucket,
/// draining at `rate`; a request that would overflow it is rejected.
///
/// A check reads the clock and one atomic; an admission adds one CAS; a denial
/// writes nothing. [`snapshot`](crate::RateLimiter::snapshot) reports the room
/// left and, as `until_full`, the time until the bucket is empty again. What
/// it promises, and how, is on [`LeakyBucketOf`], the type it names;
/// [`LockingLeakyBucket`] is its twin under a mutex.
///
/// ```
/// use std::time::Duration;
/// use tollgate::{Denied, LeakyBucket, ManualClock, Rate, RateLimiter};
///
/// let clock = ManualClock::new();
/// let bucket = LeakyBucket::with_clock(3, Rate::per_second(10), clock.clone()).unwrap();
/// assert!(bucket.try_acquire_n(3).is_ok()); // filled to the brim
/// assert_eq!(bucket.try_acquire(), Err(Denied::RetryAfter(Duration::from_millis(100))));
/// clock.advance(Duration::from_millis(100)); // one permit leaks out
/// assert!(bucket.try_acquire().is_ok());
/// ```
pub type LeakyBucket<C = MonotonicClock> = LeakyBucketOf<Atomic, C>;

/// The [`LeakyBucket`]'s locking twin: the same `empty_at` word and decision
/// function under a `parking_lot` mutex. Same clock readings, same decisions.
/// Its methods, errors and guarantee are the [`LeakyBucket`]'s: both name
/// [`LeakyBucketOf`].
///
/// ```
/// use tollgate::{ConfigError, LockingLeakyBucket, Rate, RateLimiter};
///
/// let bucket = LockingLeakyBucket::new(2, Rate::per_hour(1)).unwrap();
/// assert!(bucket.try_acquire_n(2).is_ok());
/// assert!(bucket.try_acquire().is_err());
/// assert_eq!(LockingLeakyBucket::new(1, Rate::per_second(0)).unwrap_err(), ConfigError::ZeroRate);
/// ```
pub type LockingLeakyBucket<C = MonotonicClock> = LeakyBucketOf<Locked, C>;

word_limiter!(
    /// A leaky bucket meter: the one type behind [`LeakyBucket`] (its word in an
    /// atomic, updated by compare-and-swap) and [`LockingLeakyBucket`] (the same
    /// word under a mutex). Every method, decision and guarantee is the same for
    /// both, and documented here; name it through those two, since the
    /// parameter `H` says only where the word lives.
    ///
    /// The leaky bucket's two uses, the meter and the queue ([`Shaper`]), are
    /// described together below.
    ///
    /// Requests pour water into a bucket that leaks at a constant rate. As a
    /// **meter**, a request that would make the bucket overflow is rejected: the
    /// level never exceeds the capacity, and the accepted traffic, whatever its
    /// shape, is what a constant outflow can absorb. As a **queue** (a shaper), every
    /// accepted request is given its *start time*: starts leave the bucket one rate
    /// interval apart, after an optional burst, and a request that would wait longer
    /// than the queue's bound is rejected — in the words of Jianfeng Fu's
    /// "Throttling Solutions in Standalone and Distributed Scenarios" (Alibaba Cloud
    /// Community blog, §3.4), "the input rate can vary, but the output rate remains
    /// constant. It is usually used with a FIFO queue".
    ///
    /// Neither needs a drip process (a background task that drains the bucket on a
    /// timer): the state is one instant from which the level follows.
    ///
    /// # State
    ///
    /// The meter keeps one `AtomicU64`, the shaper one 128-bit word (`cmpxchg16b`
    /// through portable-atomic, like [`WarmUp`](crate::WarmUp)); each is updated
    /// by compare-and-swap (their locking twins keep the same word under a mutex):
    ///
    /// | limiter | state | admit `n` at `now` |
    /// |---|---|---|
    /// | [`LeakyBucket`] | bits 0–63, `empty_at`: when the bucket will have drained; level = `max(empty_at − now, 0)` ns of drain | if `level + n·interval ≤ capacity·interval`: `empty_at ← now + level + n·interval` |
    /// | [`Shaper`] | bits 64–127, `end`: when the queue will have started everything accepted (the next free slot); bits 0–63, `last`: the latest start granted | `at = max(now, last)`; slot `[max(end, at), +n·interval)`; start = `max(at, slot − burst·interval)`; if `start − now ≤ max_wait`: `(end, last) ← (slot end, start)` |
    ///
    /// Why the shaper needs `last`: a start is at least the request's own
    /// reading, and a reading can be older than a start already granted (a stale
    /// reading, or a clock that stepped back). Without the floor such a request
    /// was started before requests booked ahead of it, and the spacing below,
    /// counted in start order, broke (for example: 5 permits started in a span where
    /// burst 3 allowed 4). With it, starts never go backwards; fresh readings
    /// never see it (it is at most the reading of the booking that set it, or
    /// below that booking's `end − burst·interval`).
    ///
    /// A denial writes nothing. A [`Shaper`] reservation is cancelled by one CAS
    /// that restores the previous end if no later booking is outstanding (see
    /// [`waiting`](crate::Reserve)).
    ///
    /// # Guarantees
    ///
    /// - [`LeakyBucket`]: replaying the admissions in time order, the level (drained
    ///   one permit per interval, never below zero) never exceeds the capacity — the
    ///   same as at most `capacity + rate·(b − a)` permits in any `[a, b]`, so the
    ///   meter decides exactly like a [`TokenBucket`](crate::TokenBucket) of the same
    ///   capacity and rate (Fu's article: the leaky bucket "is essentially the same as
    ///   the token bucket algorithm"). It is here
    ///   for the vocabulary and for its snapshot, which reports the level.
    /// - [`Shaper`]: for any two accepted requests `i` before `j` in start order,
    ///   the permits of the requests from `i` up to (not including) `j` are at most
    ///   `burst + (start_j − start_i) / interval`; and no request starts more than
    ///   `max_wait` after it was made. With `burst = 0` and single permits: starts
    ///   exactly one interval apart, FIFO.
    ///
    /// Under any interleaving: each admission is one CAS on the word whose value it
    /// was decided on. The loom models in `loom-tests/` check both invariants with
    /// the clock moving inside the model; the stress tests check them on real
    /// threads.
    ///
    /// # nginx's `limit_req`
    ///
    /// nginx counts each request as one permit and keeps an "excess" that drains at
    /// `rate`; a request is rejected when the excess would pass `burst`, and delayed
    /// by the part of the excess beyond `delay` (`nodelay` = `delay=burst`).
    /// A [`Shaper`] with `rate` per second makes the same decisions:
    ///
    /// | nginx | `Shaper::new(rate, burst, max_wait)` |
    /// |---|---|
    /// | `rate=10r/s` | `(Rate::per_second(10), 0, Duration::ZERO)` |
    /// | `rate=10r/s burst=5` | `(Rate::per_second(10), 0, 5 × 100 ms)` — queue up to 5, delayed |
    /// | `rate=10r/s burst=5 nodelay` | `(Rate::per_second(10), 5, Duration::ZERO)` — 5 extra at once |
    /// | `rate=10r/s burst=12 delay=8` | `(Rate::per_second(10), 8, 4 × 100 ms)` — 8 at once, 4 queued |
    ///
    /// In every row the shaper's [`capacity`](Shaper::capacity) is nginx's
    /// `1 + burst`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{ManualClock, Rate, Reserve, Shaper};
    ///
    /// // nginx `rate=10r/s burst=2`: one now, two queued 100 ms apart, the rest rejected.
    /// let clock = ManualClock::new();
    /// let shaper = Shaper::with_clock(Rate::per_second(10), 0, Duration::from_millis(200), clock.clone()).unwrap();
    /// let starts: Vec<_> = (0..3).map(|_| shaper.reserve(1).unwrap().ready_at()).collect();
    /// assert_eq!(starts, [Duration::ZERO, Duration::from_millis(100), Duration::from_millis(200)]);
    /// assert!(shaper.reserve(1).is_err());
    /// ```
    LeakyBucketOf<H>, Meter, "LeakyBucket", "LockingLeakyBucket"
);

// Reservations on the meter: "when will there be room for `n`", booked ahead.
word_reserve!([H: Home, C: Clock] LeakyBucketOf<H, C>);

/// The meter's and its twin's constructor on the default clock (the example
/// runs on the lock-free one; the twin answers the same).
impl<H: Home> LeakyBucketOf<H> {
    /// An empty bucket holding up to `capacity` permits, draining at `rate`, on
    /// the default [`MonotonicClock`].
    ///
    /// Errors: [`ConfigError::ZeroCapacity`], [`ConfigError::ZeroRate`],
    /// [`ConfigError::ZeroPeriod`], [`ConfigError::TooFine`],
    /// [`ConfigError::Overflow`] (`capacity` permits take longer than 2^62 ns to
    /// drain).
    ///
    /// ```
    /// use tollgate::{ConfigError, LeakyBucket, Rate};
    /// let bucket = LeakyBucket::new(60, Rate::per_minute(60)).unwrap();
    /// assert_eq!(LeakyBucket::new(0, Rate::per_second(1)).unwrap_err(), ConfigError::ZeroCapacity);
    /// # let _ = bucket;
    /// ```
    pub fn new(capacity: u32, rate: Rate) -> Result<Self, ConfigError> {
        Self::with_clock(capacity, rate, MonotonicClock::new())
    }
}

/// The methods of the meter and its twin on any clock (each example runs on
/// the lock-free one; the twin answers the same).
impl<H: Home, C: Clock> LeakyBucketOf<H, C> {
    /// As [`new`](Self::new), reading `clock`.
    ///
    /// ```
    /// use tollgate::{LeakyBucket, ManualClock, Rate};
    /// let bucket = LeakyBucket::with_clock(10, Rate::per_second(10), ManualClock::new()).unwrap();
    /// # let _ = bucket;
    /// ```
    pub fn with_clock(capacity: u32, rate: Rate, clock: C) -> Result<Self, ConfigError> {
        Ok(LeakyBucketOf {
            inner: WordLimiter::new(Meter::new(capacity, rate)?, clock),
        })
    }

    /// The time one permit takes to drain: the rate's period divided by its
    /// permits, rounded up to a whole nanosecond.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{LeakyBucket, Rate};
    /// let bucket = LeakyBucket::new(1, Rate::per_second(8)).unwrap();
    /// assert_eq!(bucket.drain_interval(), Duration::from_millis(125));
    /// ```
    pub fn drain_interval(&self) -> Duration {
        self.inner.machine().interval()
    }

    /// The clock this meter reads.
    ///
    /// ```
    /// use tollgate::{Clock, LeakyBucket, ManualClock, Rate};
    /// let clock = ManualClock::new();
    /// let bucket = LeakyBucket::with_clock(10, Rate::per_second(10), clock.clone()).unwrap();
    /// clock.set(7);
    /// assert_eq!(bucket.clock().now(), 7);
    /// ```
    pub fn clock(&self) -> &C {
        self.inner.clock()
    }
}

/// A lock-free leaky bucket used as a queue: each accepted request gets its
/// start time, starts are spaced one interval apart after an optional burst,
/// and a request that would wait longer than the bound is rejected, leaving
/// no trace.
///
/// Use it through [`Reserve`](crate::Reserve): `reserve(n)` returns the start
/// ([`Reservation::ready_at`](crate::Reservation::ready_at)), `acquire(n)`
/// sleeps until it. As a [`RateLimiter`](crate::RateLimiter) it admits only
/// what can start at once. Its methods are on [`ShaperOf`], the type it
/// names; the guarantee and the mapping from nginx's `rate`, `burst` and
/// `nodelay` are on [`LeakyBucketOf`]. [`LockingShaper`] is its twin under a
/// mutex.
///
/// ```
/// use std::time::Duration;
/// use tollgate::{Rate, Reserve, Shaper};
///
/// // At most one start per millisecond, queueing up to 10 ms.
/// let shaper = Shaper::new(Rate::per_second(1000), 0, Duration::from_millis(10)).unwrap();
/// for _ in 0..5 {
///     shaper.acquire(1).unwrap();
/// }
/// ```
pub type Shaper<C = MonotonicClock> = ShaperOf<Atomic, C>;

/// The [`Shaper`]'s locking twin: the same two-word state (the schedule's
/// end and the latest start) and the same decisions under a `parking_lot`
/// mutex, including reservations and their cancellation. Its methods, errors
/// and guarantee are the [`Shaper`]'s: both name [`ShaperOf`].
///
/// ```
/// use std::time::Duration;
/// use tollgate::{LockingShaper, Rate, Reserve};
///
/// let shaper = LockingShaper::new(Rate::per_second(1000), 0, Duration::from_millis(10)).unwrap();
/// shaper.acquire(1).unwrap();
/// ```
pub type LockingShaper<C = MonotonicClock> = ShaperOf<Locked, C>;

word_limiter!(
    /// A leaky bucket used as a queue: the one type behind [`Shaper`] (its
    /// word in a 128-bit atomic, updated by compare-and-swap) and
    /// [`LockingShaper`] (the same word under a mutex). Every method and
    /// decision is the same for both, and documented here; name it through
    /// those two, since the parameter `H` says only where the word lives.
    ///
    /// Each accepted request gets its start time: starts are spaced one
    /// interval apart after an optional burst, and a request that would wait
    /// longer than the bound is rejected, leaving no trace. The state, the
    /// guarantee and the mapping from nginx's `limit_req` are on
    /// [`LeakyBucketOf`], with the meter's.
    ShaperOf<H>, Queue, "Shaper", "LockingShaper"
);

// Reservations on the queue: the start of each request, booked ahead.
word_reserve!([H: Home, C: Clock] ShaperOf<H, C>);

/// The shaper's and its twin's constructor on the default clock (the example
/// runs on the lock-free one; the twin answers the same).
impl<H: Home> ShaperOf<H> {
    /// A shaper on the default [`MonotonicClock`]: starts spaced one `rate`
    /// interval apart, `burst` extra requests may start at once on an idle
    /// queue, and a request that would wait more than `max_wait` is rejected,
    /// leaving no trace.
    ///
    /// Errors: [`ConfigError::ZeroRate`], [`ConfigError::ZeroPeriod`],
    /// [`ConfigError::TooFine`], [`ConfigError::MaxWaitTooLong`] (a
    /// `max_wait` over 2^61 ns, about 73 years), [`ConfigError::Overflow`] (a
    /// queue that takes longer than 2^62 ns to drain).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Rate, Shaper};
    /// // nginx `limit_req rate=10r/s burst=5;`
    /// let shaper = Shaper::new(Rate::per_second(10), 0, Duration::from_millis(500)).unwrap();
    /// # let _ = shaper;
    /// ```
    pub fn new(rate: Rate, burst: u32, max_wait: Duration) -> Result<Self, ConfigError> {
        Self::with_clock(rate, burst, max_wait, MonotonicClock::new())
    }
}

/// The methods of the shaper and its twin on any clock (each example runs on
/// the lock-free one; the twin answers the same).
impl<H: Home, C: Clock> ShaperOf<H, C> {
    /// As [`new`](Self::new), reading `clock`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{ManualClock, Rate, Shaper};
    /// let shaper = Shaper::with_clock(Rate::per_second(10), 2, Duration::ZERO, ManualClock::new()).unwrap();
    /// assert_eq!(shaper.capacity(), 3);
    /// ```
    pub fn with_clock(
        rate: Rate,
        burst: u32,
        max_wait: Duration,
        clock: C,
    ) -> Result<Self, ConfigError> {
        Ok(ShaperOf {
            inner: WordLimiter::new(Queue::new(rate, burst, max_wait)?, clock),
        })
    }

    /// The time between starts: the rate's period divided by its permits,
    /// rounded up to a whole nanosecond.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Rate, Shaper};
    /// let shaper = Shaper::new(Rate::per_second(4), 0, Duration::ZERO).unwrap();
    /// assert_eq!(shaper.interval(), Duration::from_millis(250));
    /// ```
    pub fn interval(&self) -> Duration {
        self.inner.machine().interval()
    }

    /// Requests that may start at once on an idle queue, beyond the first
    /// (nginx's `delay`, or its `burst` with `nodelay`).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Rate, Shaper};
    /// let shaper = Shaper::new(Rate::per_second(4), 3, Duration::ZERO).unwrap();
    /// assert_eq!(shaper.burst(), 3);
    /// ```
    pub fn burst(&self) -> u32 {
        self.inner.machine().burst()
    }

    /// The longest a request may be queued before it starts.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Rate, Shaper};
    /// let shaper = Shaper::new(Rate::per_second(4), 0, Duration::from_secs(1)).unwrap();
    /// assert_eq!(shaper.max_wait(), Duration::from_secs(1));
    /// ```
    pub fn max_wait(&self) -> Duration {
        self.inner.machine().max_wait()
    }

    /// The queue's size in permits: `1 + burst + max_wait / interval`, the
    /// most one request may ask for.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Rate, Shaper};
    /// let shaper = Shaper::new(Rate::per_second(10), 2, Duration::from_millis(500)).unwrap();
    /// assert_eq!(shaper.capacity(), 8);
    /// ```
    pub fn capacity(&self) -> u32 {
        self.inner.machine().capacity()
    }

    /// The clock this shaper reads.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Clock, ManualClock, Rate, Shaper};
    /// let clock = ManualClock::new();
    /// let shaper = Shaper::with_clock(Rate::per_second(1), 0, Duration::ZERO, clock.clone()).unwrap();
    /// clock.set(7);
    /// assert_eq!(shaper.clock().now(), 7);
    /// ```
    pub fn clock(&self) -> &C {
        self.inner.clock()
    }
}
