//! The sliding window: `N` permits in any `S` consecutive sub-windows, exact
//! under contention, with each sub-window's budget leased out to cache-padded
//! stripes so that cores stop fighting over one counter.
//!
//! The user-facing documentation (promise, state, proof) is on [`SlidingWindow`].

mod approx;
mod locking;
pub(crate) mod ring;
mod striped;

use std::time::Duration;

pub use approx::{ApproxSlidingWindow, LockingApproxSlidingWindow};
pub use locking::LockingSlidingWindow;

use crate::clock::{Clock, MonotonicClock};
use crate::error::{ConfigError, Denied};
use crate::limiter::{RateLimiter, Rejection, Snapshot, check_request, report};
use crate::rate::Rate;
use crate::timeline::Timeline;
use ring::WindowShape;
use striped::Striped;

/// How many sub-windows the builder was asked for.
#[derive(Debug, Clone, Copy)]
pub(crate) enum SubWindows {
    /// Ten, or fewer for a rate so fine that ten sub-windows would each be
    /// shorter than the limit in nanoseconds.
    Default,
    Exactly(u32),
}

impl SubWindows {
    fn resolve(self, rate: Rate) -> u32 {
        match self {
            SubWindows::Default => WindowShape::default_subs(rate),
            SubWindows::Exactly(n) => n,
        }
    }
}

/// A lock-free sliding window: at most `rate.permits()` in any `S` consecutive
/// sub-windows that cut `rate.period()` into `S` parts, with each sub-window's
/// count striped across cache-padded, leased per-thread counters.
///
/// A check reads the clock and the calling thread's
/// stripe, and admits with one CAS on that stripe; other threads' checks do not
/// touch it.
///
/// ```
/// use tollgate::{Rate, RateLimiter, SlidingWindow};
///
/// let window = SlidingWindow::new(Rate::per_second(100)).unwrap();
/// if window.try_acquire().is_ok() {
///     // handle the request
/// }
/// ```
///
/// The sliding window: `N` permits in any `S` consecutive sub-windows, exact
/// under contention, with each sub-window's budget leased out to cache-padded
/// stripes so that cores stop fighting over one counter.
///
/// Time is cut into aligned sub-windows of `w = ⌈T / S⌉` nanoseconds (Sentinel's
/// LeapArray with `sampleCount = S`), starting when the limiter is built. The
/// promise is that **the permits admitted in any `S` consecutive sub-windows never
/// exceed `N`**, under any interleaving, which in real time means at most `N` in
/// any span of `(S − 1)·w` and at most `2N` in any span of `T`. A fixed window is
/// the case `S = 1`; more sub-windows remember the past more finely.
///
/// Everyone else keeps one counter per sub-window, so every request of every
/// core writes the same cache line, and Sentinel's controller checks the sum
/// and then increments, which over-admits by up to the number of racing threads.
/// Here the common path writes only the calling thread's own stripe:
///
/// 1. When a sub-window `j` opens, its **budget** is `N` minus the charges of the
///    `S − 1` sub-windows before it.
/// 2. A thread whose stripe has no lease for `j` **leases** a share of what is
///    left of the budget from the **pool** (one CAS), shares shrinking as the pool
///    runs low — the quota pre-allocation to machines of Jianfeng Fu's "Throttling
///    Solutions in Standalone and Distributed Scenarios" (Alibaba Cloud Community
///    blog, §4.4), applied to cores instead of machines.
/// 3. Requests **spend** the lease with one CAS on the thread's stripe, which no
///    other thread writes unless it shares the stripe or is stealing.
/// 4. When the pool runs dry, a thread **steals** what it needs from other
///    stripes' leases for `j` before it denies.
/// 5. Leases left over when `j` ends are **returned**: taken out of their stripe
///    by CAS and subtracted from `j`'s charge, so the sub-windows after `j` get
///    them back.
///
/// # State
///
/// Every word packs a sub-window index with a count of `b` bits, where `b` is
/// the number of bits of `N` (7 for 100): `(index << b) | count`.
///
/// | word | bits `0..b` | bits `b..64` | written by |
/// |---|---|---|---|
/// | `pool` (1, cache-padded) | permits leased out of sub-window `p` so far | `p`, the newest sub-window opened | lease (CAS `+k`), open (CAS to `(j, 0)`) |
/// | `history[i & (R − 1)]` (`R` = `S` rounded up to a power of two, one array) | charge of finished sub-window `i`: leased, less what was returned | `i` | open (`fetch_max((p, c))` before leaving `p`), return (CAS `−l`) |
/// | `stripe[t]` (one per stripe, cache-padded) | lease: permits charged to `e`, not yet spent | `e`, the lease's sub-window | spend (CAS `−n`), lease/put back (CAS), steal (CAS `−k`), reclaim (CAS to `(e, 0)`) |
///
/// | operation | reads | writes |
/// |---|---|---|
/// | admit from own lease (fast path) | clock, own stripe | own stripe |
/// | open sub-window `j` | pool | `history[p]`, pool, stale leases on every stripe |
/// | lease | pool, `history` (`S − 1` slots) | pool, own stripe |
/// | steal | other stripes | those stripes, own stripe |
/// | deny | pool, `history`, stripes | leftover into own stripe |
/// | snapshot | pool, `history`, stripes | nothing |
///
/// The index never wraps: a sub-window may not be shorter than `N` ns (the
/// builder says [`ConfigError::InvalidSubWindows`] otherwise), so indices over the
/// limiter's 2^62 ns life fit in `64 − b` bits.
///
/// # Why it is exact
///
/// - Every admission in sub-window `j` is paid from permits **charged** to `j`
///   by a pool CAS, since a lease carries its sub-window and is spent only by a
///   request whose clock reading falls in that sub-window.
/// - A finished sub-window's history slot is **never below what it admitted**:
///   before the CAS that leaves `p`, the opener publishes `p`'s final charge
///   (`fetch_max`, so a racing opener's older, smaller reading cannot win), and a
///   return subtracts only permits it took out of a stripe by CAS — permits no
///   one can spend any more.
/// - A lease of `k` is granted only if `charged(j) + k ≤ N − Σ history` over the
///   `S − 1` previous sub-windows, read after acquiring the pool at `j`, and the
///   pool is the one word every lease and every opening goes through. So the
///   last lease of `j` proves that the window ending with `j` holds at most `N`.
///   Every window ends with some sub-window, and a window ending with one that
///   was never opened is covered by the window of the last one that was.
///
/// The loom models in `loom-tests/tests/sliding_window.rs` check the bound in
/// every interleaving of small cases (2–3 threads, 2 stripes, 2–3 sub-windows)
/// with the clock moving inside the model.
///
/// # Orderings
///
/// The pool is read with `Acquire` and opened with a `Release` CAS: the history
/// slot written just before the opening CAS is then visible to whoever sees the
/// pool at that sub-window or later (every pool change is an RMW, so later leases
/// do not break the release sequence). Everything else is `Relaxed`: leases,
/// spends, steals and returns move counts, and each is a CAS that checks the
/// very value it replaces, so conservation follows from each word's
/// modification order alone.
///
/// # Under-admission
///
/// From one thread, the limiter admits exactly what the window allows and agrees
/// decision for decision with [`LockingSlidingWindow`]. From many threads it never
/// admits more, but may deny a request while the budget it needs is held by
/// another thread between leasing and spending it (at most one lease per
/// thread in flight), or sits in a lease that appeared on a stripe after the
/// steal scan passed it. `docs/sliding_window.md` bounds this;
/// `docs/benchmarks.md` gives the measured figures.
///
/// # Stale and backwards time
///
/// A reading older than the newest sub-window opened is denied (unless its own
/// stripe still holds a lease for the reading's sub-window): admitting it in the
/// newest sub-window would count it where it does not belong. Its retry-after
/// runs to the newest sub-window's start, so it is never zero, and a clock that
/// steps back only makes the limiter deny until the clock catches up.
///
/// ```
/// use std::time::Duration;
/// use tollgate::{Denied, ManualClock, Rate, RateLimiter, SlidingWindow};
///
/// let clock = ManualClock::new();
/// // 100 per minute in 6 sub-windows of 10 s (the figure in Fu's article, §3.2).
/// let window = SlidingWindow::builder(Rate::per_minute(100))
///     .sub_windows(6)
///     .clock(clock.clone())
///     .build()
///     .unwrap();
/// clock.set(55_000_000_000); // 0:55
/// assert!(window.try_acquire_n(100).is_ok());
/// clock.set(65_000_000_000); // 1:05: the 0:50 sub-window still counts
/// assert_eq!(window.try_acquire(), Err(Denied::RetryAfter(Duration::from_secs(45))));
/// clock.set(110_000_000_000); // 1:50: it has left the window
/// assert!(window.try_acquire_n(100).is_ok());
/// ```
#[derive(Debug)]
pub struct SlidingWindow<C = MonotonicClock> {
    core: Striped,
    timeline: Timeline<C>,
}

impl SlidingWindow {
    /// `rate.permits()` in any window of `rate.period()` cut into 10 sub-windows,
    /// one stripe per CPU, on the default [`MonotonicClock`].
    ///
    /// Ten sub-windows hold the limit over any 90% of the period (Sentinel's
    /// default of 2 holds it over 50%) for 128 bytes of history. For rates so fine
    /// that a tenth of the period is shorter than the limit in nanoseconds, the
    /// default is the most sub-windows (at least 1) that are not.
    ///
    /// Errors: [`ConfigError::ZeroRate`], [`ConfigError::ZeroPeriod`],
    /// [`ConfigError::TooFine`] (more than one permit per nanosecond),
    /// [`ConfigError::Overflow`] (a period longer than 2^62 ns).
    ///
    /// ```
    /// use tollgate::{Rate, SlidingWindow};
    /// let per_minute = SlidingWindow::new(Rate::per_minute(100)).unwrap();
    /// assert_eq!(per_minute.sub_windows(), 10);
    /// ```
    pub fn new(rate: Rate) -> Result<Self, ConfigError> {
        Self::with_clock(rate, MonotonicClock::new())
    }

    /// A builder, to choose the number of sub-windows, the number of stripes or
    /// the clock.
    ///
    /// ```
    /// use tollgate::{ManualClock, Rate, SlidingWindow};
    /// let window = SlidingWindow::builder(Rate::per_minute(600))
    ///     .sub_windows(60)
    ///     .stripes(4)
    ///     .clock(ManualClock::new())
    ///     .build()
    ///     .unwrap();
    /// assert_eq!((window.sub_windows(), window.stripes()), (60, 4));
    /// ```
    pub fn builder(rate: Rate) -> SlidingWindowBuilder {
        SlidingWindowBuilder::new(rate)
    }
}

impl<C: Clock> SlidingWindow<C> {
    /// As [`SlidingWindow::new`], reading `clock`: a [`CachedClock`](crate::CachedClock)
    /// for the fastest checks, a [`ManualClock`](crate::ManualClock) in tests.
    ///
    /// ```
    /// use tollgate::{CachedClock, Rate, SlidingWindow};
    /// let window = SlidingWindow::with_clock(Rate::per_second(10), CachedClock::new()).unwrap();
    /// # let _ = window;
    /// ```
    pub fn with_clock(rate: Rate, clock: C) -> Result<Self, ConfigError> {
        Self::build(rate, SubWindows::Default, None, clock)
    }

    fn build(
        rate: Rate,
        subs: SubWindows,
        stripes: Option<usize>,
        clock: C,
    ) -> Result<Self, ConfigError> {
        let geo = WindowShape::new(rate, subs.resolve(rate))?;
        let stripes = stripes.unwrap_or_else(crate::stripe::default_stripes);
        Ok(SlidingWindow {
            core: Striped::new(geo, stripes),
            timeline: Timeline::new(clock),
        })
    }

    /// The number of sub-windows the window is cut into.
    ///
    /// ```
    /// use tollgate::{Rate, SlidingWindow};
    /// let window = SlidingWindow::builder(Rate::per_second(5)).sub_windows(4).build().unwrap();
    /// assert_eq!(window.sub_windows(), 4);
    /// ```
    pub fn sub_windows(&self) -> u32 {
        self.core.shape().subs()
    }

    /// The length of one sub-window: the rate's period divided by the number of
    /// sub-windows, rounded up to a whole nanosecond (so the limiter is never
    /// faster than asked).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Rate, SlidingWindow};
    /// let window = SlidingWindow::builder(Rate::per_second(5)).sub_windows(3).build().unwrap();
    /// assert_eq!(window.sub_window(), Duration::from_nanos(333_333_334));
    /// ```
    pub fn sub_window(&self) -> Duration {
        Duration::from_nanos(self.core.shape().sub())
    }

    /// The number of stripes: what was asked for, rounded up to a power of two,
    /// at most 256.
    ///
    /// ```
    /// use tollgate::{Rate, SlidingWindow};
    /// let window = SlidingWindow::builder(Rate::per_second(5)).stripes(3).build().unwrap();
    /// assert_eq!(window.stripes(), 4);
    /// ```
    pub fn stripes(&self) -> usize {
        self.core.stripe_count()
    }

    /// Bytes this limiter occupies, inline and on the heap (allocator overhead
    /// aside): mostly one 128-byte line per stripe on x86-64.
    ///
    /// ```
    /// use tollgate::{Rate, SlidingWindow};
    /// let two = SlidingWindow::builder(Rate::per_second(5)).stripes(2).build().unwrap();
    /// let eight = SlidingWindow::builder(Rate::per_second(5)).stripes(8).build().unwrap();
    /// assert!(eight.memory() > two.memory());
    /// ```
    pub fn memory(&self) -> usize {
        std::mem::size_of_val(self) + self.core.heap_bytes()
    }

    /// The clock this limiter reads.
    ///
    /// ```
    /// use tollgate::{Clock, ManualClock, Rate, SlidingWindow};
    /// let clock = ManualClock::new();
    /// let window = SlidingWindow::with_clock(Rate::per_second(10), clock.clone()).unwrap();
    /// clock.set(7);
    /// assert_eq!(window.clock().now(), 7);
    /// ```
    pub fn clock(&self) -> &C {
        self.timeline.clock()
    }
}

impl<C: Clock> RateLimiter for SlidingWindow<C> {
    #[inline]
    fn try_acquire_n(&self, n: u32) -> Result<(), Denied> {
        check_request(n, self.core.shape().limit())?;
        // One reading per request: every step of the decision, retries included,
        // uses it, and it is the time the admission counts at.
        self.core.try_acquire_n(self.timeline.now(), n)
    }

    fn snapshot(&self) -> Snapshot {
        self.core.snapshot(self.timeline.now())
    }

    /// The snapshot is read right after the decision, at the decision's
    /// reading: the state is spread over the pool and the stripes' leases, and
    /// no one word holds it (see the trait method).
    fn try_acquire_n_with_snapshot(&self, n: u32) -> Result<Snapshot, Rejection> {
        if let Err(denied) = check_request(n, self.core.shape().limit()) {
            return Err(Rejection::new(denied, self.snapshot()));
        }
        let now = self.timeline.now();
        let outcome = self.core.try_acquire_n(now, n);
        report(outcome, self.core.snapshot(now))
    }
}

/// Configures a [`SlidingWindow`] or a [`LockingSlidingWindow`]: the number of
/// sub-windows, the number of stripes, the clock.
///
/// ```
/// use tollgate::{ManualClock, Rate, RateLimiter, SlidingWindow};
///
/// let clock = ManualClock::new();
/// let builder = SlidingWindow::builder(Rate::per_second(10)).sub_windows(5).clock(clock);
/// let atomic = builder.clone().stripes(2).build().unwrap();
/// let twin = builder.build_locking().unwrap();
/// assert_eq!(atomic.try_acquire_n(10), twin.try_acquire_n(10));
/// ```
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until `build` or `build_locking`"]
pub struct SlidingWindowBuilder<C = MonotonicClock> {
    rate: Rate,
    subs: SubWindows,
    stripes: Option<usize>,
    clock: C,
}

impl SlidingWindowBuilder {
    fn new(rate: Rate) -> Self {
        SlidingWindowBuilder {
            rate,
            subs: SubWindows::Default,
            stripes: None,
            // Naming the unit struct does not calibrate the TSC: a builder given
            // another clock never pays for it.
            clock: MonotonicClock::new(),
        }
    }
}

impl<C> SlidingWindowBuilder<C> {
    /// Cuts the period into `count` sub-windows (Sentinel's `sampleCount`). More
    /// remember the past more finely — the limit holds over any `(count − 1)/count`
    /// of the period — for 8 bytes each (rounded up to a power of two), and a
    /// denial's retry-after takes `O(count)` to compute. `build` refuses, with
    /// [`ConfigError::InvalidSubWindows`], zero, more than [`MAX_SUB_WINDOWS`](crate::MAX_SUB_WINDOWS),
    /// and a count that would make a sub-window shorter than the limit in
    /// nanoseconds; the error says the most this rate allows.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{ConfigError, Rate, SlidingWindow};
    /// assert!(SlidingWindow::builder(Rate::per_minute(100)).sub_windows(60).build().is_ok());
    /// let err = SlidingWindow::builder(Rate::per_minute(100)).sub_windows(0).build().unwrap_err();
    /// assert_eq!(err, ConfigError::InvalidSubWindows { sub_windows: 0, max: 4096 });
    /// // 1000 permits per µs: no sub-window may be shorter than 1000 ns.
    /// let fine = Rate::new(1_000, Duration::from_micros(1));
    /// let err = SlidingWindow::builder(fine).sub_windows(2).build().unwrap_err();
    /// assert_eq!(err, ConfigError::InvalidSubWindows { sub_windows: 2, max: 1 });
    /// ```
    pub fn sub_windows(mut self, count: u32) -> Self {
        self.subs = SubWindows::Exactly(count);
        self
    }

    /// Splits each sub-window's count across `count` stripes, rounded up to a
    /// power of two and kept in `1..=256` (the default is the number of CPUs).
    /// This is a performance knob only: any value is exact. Fewer stripes than
    /// threads means threads share stripes (and their cache lines); more means
    /// longer steal scans when the budget runs low. Ignored by the locking twin.
    ///
    /// ```
    /// use tollgate::{Rate, SlidingWindow};
    /// let window = SlidingWindow::builder(Rate::per_second(10)).stripes(0).build().unwrap();
    /// assert_eq!(window.stripes(), 1);
    /// ```
    pub fn stripes(mut self, count: usize) -> Self {
        self.stripes = Some(count);
        self
    }

    /// The clock the limiter will read.
    ///
    /// ```
    /// use tollgate::{Clock, ManualClock, Rate, SlidingWindow};
    /// let clock = ManualClock::new();
    /// clock.set(5);
    /// let window = SlidingWindow::builder(Rate::per_second(10)).clock(clock).build().unwrap();
    /// assert_eq!(window.clock().now(), 5);
    /// ```
    pub fn clock<D: Clock>(self, clock: D) -> SlidingWindowBuilder<D> {
        SlidingWindowBuilder {
            rate: self.rate,
            subs: self.subs,
            stripes: self.stripes,
            clock,
        }
    }
}

impl<C: Clock> SlidingWindowBuilder<C> {
    /// Builds the lock-free [`SlidingWindow`].
    ///
    /// Errors: those of [`SlidingWindow::new`], and those of
    /// [`sub_windows`](Self::sub_windows).
    ///
    /// ```
    /// use tollgate::{Rate, SlidingWindow};
    /// let window = SlidingWindow::builder(Rate::per_second(10)).build().unwrap();
    /// # let _ = window;
    /// ```
    pub fn build(self) -> Result<SlidingWindow<C>, ConfigError> {
        SlidingWindow::build(self.rate, self.subs, self.stripes, self.clock)
    }

    /// Builds the [`LockingSlidingWindow`] twin, with the same errors as
    /// [`build`](Self::build).
    ///
    /// ```
    /// use tollgate::{Rate, SlidingWindow};
    /// let twin = SlidingWindow::builder(Rate::per_second(10)).build_locking().unwrap();
    /// # let _ = twin;
    /// ```
    pub fn build_locking(self) -> Result<LockingSlidingWindow<C>, ConfigError> {
        LockingSlidingWindow::build(self.rate, self.subs, self.clock)
    }
}
