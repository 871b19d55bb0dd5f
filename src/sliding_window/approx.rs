//! The approximate sliding window: the two-window counter of Vineet Sagar's
//! rate-limiter system-design notes (`RateLimiter.md`, GitHub repository
//! `system-design`) and Cloudflare's rate limiter, with the previous window's count
//! weighted by how much of it the sliding window still overlaps.
//!
//! The rule, the state and the error are documented on [`ApproxSlidingWindow`].

use std::time::Duration;

use crossbeam_utils::CachePadded;

use crate::cell::{self, Loss, Opening};
use crate::clock::{Clock, MonotonicClock};
use crate::error::{ConfigError, Denied};
use crate::limiter::{RateLimiter, Rejection, Snapshot, check_request};
use crate::rate::Rate;
use crate::sync::{AtomicU64, Mutex, Ordering};
use crate::timeline::Timeline;

/// The two-window counter's arithmetic, shared by the atomic limiter and its
/// twin.
#[derive(Debug, Clone, Copy)]
struct Approx {
    limit: u32,
    window: u64,
    count_bits: u32,
}

/// What a decision does: the new pool word, and the finished window's word to
/// publish into `prev` first when it opens a new window.
type Decision = Result<(u64, Option<u64>), Denied>;

impl Approx {
    /// The window is at least `limit >= 2^(b-1)` ns (one permit per ns at most),
    /// so a window index over 2^62 ns is below `2^(63-b)` and fits beside a
    /// `b`-bit count.
    fn new(rate: Rate) -> Result<Self, ConfigError> {
        let (limit, window) = rate.validate()?;
        Ok(Approx {
            limit,
            window,
            count_bits: u32::BITS - limit.leading_zeros(),
        })
    }

    fn pack(&self, index: u64, count: u32) -> u64 {
        (index << self.count_bits) | u64::from(count)
    }

    fn unpack(&self, word: u64) -> (u64, u32) {
        // At most 32 bits survive the mask.
        (
            word >> self.count_bits,
            (word & ((1u64 << self.count_bits) - 1)) as u32,
        )
    }

    fn slot(index: u64) -> usize {
        (index % 2) as usize
    }

    /// The count of finished window `i`, from the two `prev` words.
    fn prev(&self, prev: [u64; 2], i: Option<u64>) -> u32 {
        let Some(i) = i else { return 0 };
        let (stamp, count) = self.unpack(prev[Self::slot(i)]);
        if stamp == i { count } else { 0 }
    }

    /// Whether `n` more fit at `elapsed` ns into a window with `prev` before it
    /// and `current` in it.
    fn fits(&self, prev: u32, current: u32, elapsed: u64, n: u32) -> bool {
        let t = u128::from(self.window);
        u128::from(prev) * (t - u128::from(elapsed)) + (u128::from(current) + u128::from(n)) * t
            <= u128::from(self.limit) * t
    }

    /// The window a reading counts in and its `(index, C, P)`, or `None` for a
    /// reading older than the newest window.
    fn view(&self, pool: u64, prev: [u64; 2], now: u64) -> (u64, u32, u32, bool) {
        let (k, c) = self.unpack(pool);
        let kr = now / self.window;
        if kr <= k {
            (k, c, self.prev(prev, k.checked_sub(1)), kr < k)
        } else {
            // A window not yet opened: `k`'s count becomes the previous one only
            // if `k` is just before it.
            (kr, 0, if kr == k + 1 { c } else { 0 }, false)
        }
    }

    fn decide(&self, pool: u64, prev: [u64; 2], now: u64, n: u32) -> Decision {
        let (k, c, p, stale) = self.view(pool, prev, now);
        if stale {
            return Err(self.retry(now, k, c, p, n));
        }
        let elapsed = now - k * self.window;
        if !self.fits(p, c, elapsed, n) {
            return Err(self.retry(now, k, c, p, n));
        }
        // `c + n <= limit`: `fits` implies it.
        let publish = (k != self.unpack(pool).0).then_some(pool);
        Ok((self.pack(k, c + n), publish))
    }

    /// The exact wait until `n` fit, from `now` (or from the start of window `k`
    /// for a stale reading), if nothing else is admitted.
    fn retry(&self, now: u64, k: u64, c: u32, p: u32, n: u32) -> Denied {
        let (t, limit) = (u128::from(self.window), u128::from(self.limit));
        let start = k * self.window;
        // In u64: with a limit of u32::MAX, `c + n` may not fit a u32.
        let at = if u64::from(c) + u64::from(n) <= u64::from(self.limit) {
            // Inside window `k`, once `p·(T − e) <= (N − C − n)·T`. At `e = T`
            // it always holds (that is the next window, empty, with `C` before).
            let slack = (limit - u128::from(c) - u128::from(n)) * t;
            let reach = if p == 0 {
                t
            } else {
                (slack / u128::from(p)).min(t)
            };
            // `reach <= T`, a u64.
            start + self.window - reach as u64
        } else {
            // Window `k + 1`, with `C >= 1` before it and nothing in it.
            let slack = (limit - u128::from(n)) * t;
            let reach = (slack / u128::from(c)).min(t);
            start + 2 * self.window - reach as u64
        };
        Denied::RetryAfter(Duration::from_nanos(at.max(start).saturating_sub(now)))
    }

    fn snapshot(&self, pool: u64, prev: [u64; 2], now: u64) -> Snapshot {
        let (k, c, p, stale) = self.view(pool, prev, now);
        let start = k * self.window;
        let available = if stale {
            0
        } else {
            let (t, elapsed) = (u128::from(self.window), u128::from(now - start));
            let weighted = (u128::from(p) * (t - elapsed)).div_ceil(t);
            // At most `limit`, so the cast is lossless.
            u128::from(self.limit).saturating_sub(weighted + u128::from(c)) as u32
        };
        // Full once nothing is in the current window and the previous one weighs
        // nothing; a stale reading also waits for window `k` to start.
        let full_at = match (c, p) {
            (0, 0) => start,
            (0, _) => start + self.window,
            _ => start + 2 * self.window,
        };
        Snapshot::from_ns(available, self.limit, full_at.saturating_sub(now))
    }
}

/// A lock-free approximate sliding window (the two-window counter): the
/// previous window's count, weighted by its overlap with the sliding window,
/// plus the current window's count, must stay within `rate.permits()`.
///
/// Use it when a few words of state matter more than exactness;
/// [`SlidingWindow`](crate::SlidingWindow) is exact per sub-window and scales
/// with cores.
///
/// # Rule
///
/// Time is cut into aligned windows of the period `T`. At a reading `e` ns into
/// window `k`, with `P` permits admitted in window `k − 1` and `C` so far in `k`,
/// `n` more are admitted if
///
/// ```text
/// P·(T − e)/T + C + n ≤ N        (checked as P·(T − e) + (C + n)·T ≤ N·T in u128)
/// ```
///
/// that is, if the sliding window ending now would hold at most `N` *were the
/// previous window's permits spread evenly over it*. No floating point: the
/// check is exact integer arithmetic, and the retry-after is the exact time the
/// inequality next holds.
///
/// # State
///
/// | word | bits `0..b` | bits `b..64` |
/// |---|---|---|
/// | `pool` | `C`, permits admitted in window `k` | `k`, the newest window |
/// | `prev[i % 2]` | permits admitted in finished window `i` | `i` |
///
/// `b` is the number of bits of `N`. Admitting is one CAS on `pool`; the first
/// admission of a new window publishes the old window's final count into
/// `prev` (`fetch_max`, so a racing publisher's older, smaller count cannot
/// win) before its CAS, which is `Release`; readers acquire `pool`, so they see
/// the count. Two slots, because a would-be opener may publish window `k`'s
/// count while `k` is still open, and readers of `k` need `k − 1`'s.
///
/// # What it promises, and its error
///
/// Under any interleaving, for every admission at reading `t` in window `k`,
/// `P·(T − e)/T` plus the permits admitted in `k` at readings up to `t` is at
/// most `N` (each admission's CAS saw every earlier-decided one, and the weight
/// only falls as `t` grows). A reading older than the newest window is denied.
///
/// It is not a true sliding window: the previous window's permits are not
/// spread evenly in reality, so it admits more than `N` in some spans of `T`
/// (when the previous window's traffic was early) and less than a sliding log
/// would (when it was late). `docs/sliding_window.md` measures both on the
/// scenarios of Jianfeng Fu's "Throttling Solutions in Standalone and
/// Distributed Scenarios" (Alibaba Cloud Community blog), beside the exact [`SlidingWindow`](crate::SlidingWindow).
/// It is one word of contended state, like the fixed window: cheap, but it does
/// not scale with cores the way the striped window does.
///
/// ```
/// use std::time::Duration;
/// use tollgate::{ApproxSlidingWindow, Denied, ManualClock, Rate, RateLimiter};
///
/// let clock = ManualClock::new();
/// let window = ApproxSlidingWindow::with_clock(Rate::per_minute(100), clock.clone()).unwrap();
/// assert!(window.try_acquire_n(100).is_ok());
/// clock.set(75_000_000_000); // 1:15: a quarter of the next window has passed
/// // The previous 100 weigh 75 now, so 25 more fit.
/// assert!(window.try_acquire_n(25).is_ok());
/// assert_eq!(window.try_acquire(), Err(Denied::RetryAfter(Duration::from_millis(600))));
/// ```
#[derive(Debug)]
pub struct ApproxSlidingWindow<C = MonotonicClock> {
    machine: Approx,
    pool: CachePadded<AtomicU64>,
    prev: [AtomicU64; 2],
    timeline: Timeline<C>,
}

impl ApproxSlidingWindow {
    /// `rate.permits()` per sliding `rate.period()`, approximately, on the default
    /// [`MonotonicClock`].
    ///
    /// Errors: [`ConfigError::ZeroRate`], [`ConfigError::ZeroPeriod`],
    /// [`ConfigError::TooFine`], [`ConfigError::Overflow`], as for
    /// [`FixedWindow::new`](crate::FixedWindow::new).
    ///
    /// ```
    /// use tollgate::{ApproxSlidingWindow, Rate};
    /// let window = ApproxSlidingWindow::new(Rate::per_minute(100)).unwrap();
    /// # let _ = window;
    /// ```
    pub fn new(rate: Rate) -> Result<Self, ConfigError> {
        Self::with_clock(rate, MonotonicClock::new())
    }
}

impl<C: Clock> ApproxSlidingWindow<C> {
    /// As [`ApproxSlidingWindow::new`], reading `clock`.
    ///
    /// ```
    /// use tollgate::{ApproxSlidingWindow, ManualClock, Rate};
    /// let window = ApproxSlidingWindow::with_clock(Rate::per_second(10), ManualClock::new()).unwrap();
    /// # let _ = window;
    /// ```
    pub fn with_clock(rate: Rate, clock: C) -> Result<Self, ConfigError> {
        Ok(ApproxSlidingWindow {
            machine: Approx::new(rate)?,
            // Window 0, nothing admitted; neither slot holds a finished window
            // with a count, which is true.
            pool: CachePadded::new(AtomicU64::new(0)),
            prev: [AtomicU64::new(0), AtomicU64::new(0)],
            timeline: Timeline::new(clock),
        })
    }

    /// The clock this limiter reads.
    ///
    /// ```
    /// use tollgate::{ApproxSlidingWindow, Clock, ManualClock, Rate};
    /// let clock = ManualClock::new();
    /// let window = ApproxSlidingWindow::with_clock(Rate::per_second(10), clock.clone()).unwrap();
    /// clock.set(7);
    /// assert_eq!(window.clock().now(), 7);
    /// ```
    pub fn clock(&self) -> &C {
        self.timeline.clock()
    }

    fn prev(&self) -> [u64; 2] {
        // Relaxed: the caller acquired the pool first, which makes the finished
        // window's count, published before the Release CAS that left it, visible.
        [
            self.prev[0].load(Ordering::Relaxed),
            self.prev[1].load(Ordering::Relaxed),
        ]
    }
}

/// The pool word and the previous windows' counts a decision saw (or wrote).
type Seen = (u64, [u64; 2]);

impl<C: Clock> ApproxSlidingWindow<C> {
    /// The decision loop of both [`RateLimiter`] calls: the pool word stored,
    /// or the denial with the pool word and previous counts it was decided on.
    #[inline]
    fn acquire(&self, now: u64, n: u32) -> Result<Seen, (Denied, Seen)> {
        let mut seen = [0; 2];
        // `Opening`: the load's and the failure's Acquire pair with the
        // Release CAS that opened the pool's window, so the previous window's
        // final count is visible to the decision. Release on success: a CAS
        // that opens a window publishes the count written just before it (for
        // one that does not, it costs nothing on x86 and keeps one rule).
        cell::update::<Opening, u64, (Denied, Seen)>(
            &self.pool,
            |pool| {
                let mut prev = self.prev();
                let (next, publish) = self
                    .machine
                    .decide(pool, prev, now, n)
                    .map_err(|denied| (denied, (pool, prev)))?;
                if let Some(finished) = publish {
                    let (index, _) = self.machine.unpack(finished);
                    // Relaxed: published by the Release CAS that stores
                    // this decision.
                    self.prev[Approx::slot(index)].fetch_max(finished, Ordering::Relaxed);
                    let slot = &mut prev[Approx::slot(index)];
                    *slot = (*slot).max(finished);
                }
                seen = prev;
                Ok(next)
            },
            // Decided again at once, as the window always has.
            |_, _| Loss::DecideAgain,
        )
        .map(|next| (next, seen))
    }
}

impl<C: Clock> RateLimiter for ApproxSlidingWindow<C> {
    fn try_acquire_n(&self, n: u32) -> Result<(), Denied> {
        check_request(n, self.machine.limit)?;
        let now = self.timeline.now();
        self.acquire(now, n)
            .map(drop)
            .map_err(|(denied, ..)| denied)
    }

    fn snapshot(&self) -> Snapshot {
        let now = self.timeline.now();
        // Acquire: as in `acquire`.
        let pool = self.pool.load(Ordering::Acquire);
        self.machine.snapshot(pool, self.prev(), now)
    }

    /// The snapshot is of the pool word the decision stored (or denied on),
    /// with the previous windows' counts as the decision read them (and, when
    /// it opened a window, wrote them).
    fn try_acquire_n_with_snapshot(&self, n: u32) -> Result<Snapshot, Rejection> {
        if let Err(denied) = check_request(n, self.machine.limit) {
            return Err(Rejection::new(denied, self.snapshot()));
        }
        let now = self.timeline.now();
        match self.acquire(now, n) {
            Ok((pool, prev)) => Ok(self.machine.snapshot(pool, prev, now)),
            Err((denied, (pool, prev))) => Err(Rejection::new(
                denied,
                self.machine.snapshot(pool, prev, now),
            )),
        }
    }
}

/// The [`ApproxSlidingWindow`]'s twin: the same words and the same decision
/// function under a `parking_lot` mutex. Given the same clock readings it makes
/// the same decisions.
///
/// ```
/// use tollgate::{LockingApproxSlidingWindow, Rate, RateLimiter};
///
/// let window = LockingApproxSlidingWindow::new(Rate::per_hour(1)).unwrap();
/// assert!(window.try_acquire().is_ok());
/// assert!(window.try_acquire().is_err());
/// ```
#[derive(Debug)]
pub struct LockingApproxSlidingWindow<C = MonotonicClock> {
    machine: Approx,
    state: CachePadded<Mutex<(u64, [u64; 2])>>,
    timeline: Timeline<C>,
}

impl LockingApproxSlidingWindow {
    /// As [`ApproxSlidingWindow::new`], with the same errors.
    ///
    /// ```
    /// use tollgate::{LockingApproxSlidingWindow, Rate};
    /// let window = LockingApproxSlidingWindow::new(Rate::per_minute(100)).unwrap();
    /// # let _ = window;
    /// ```
    pub fn new(rate: Rate) -> Result<Self, ConfigError> {
        Self::with_clock(rate, MonotonicClock::new())
    }
}

impl<C: Clock> LockingApproxSlidingWindow<C> {
    /// As [`ApproxSlidingWindow::with_clock`].
    ///
    /// ```
    /// use tollgate::{LockingApproxSlidingWindow, ManualClock, Rate};
    /// let window = LockingApproxSlidingWindow::with_clock(Rate::per_second(10), ManualClock::new()).unwrap();
    /// # let _ = window;
    /// ```
    pub fn with_clock(rate: Rate, clock: C) -> Result<Self, ConfigError> {
        Ok(LockingApproxSlidingWindow {
            machine: Approx::new(rate)?,
            state: CachePadded::new(Mutex::new((0, [0, 0]))),
            timeline: Timeline::new(clock),
        })
    }

    /// The clock this limiter reads.
    ///
    /// ```
    /// use tollgate::{Clock, LockingApproxSlidingWindow, ManualClock, Rate};
    /// let clock = ManualClock::new();
    /// let window = LockingApproxSlidingWindow::with_clock(Rate::per_second(10), clock.clone()).unwrap();
    /// clock.set(7);
    /// assert_eq!(window.clock().now(), 7);
    /// ```
    pub fn clock(&self) -> &C {
        self.timeline.clock()
    }
}

impl<C: Clock> RateLimiter for LockingApproxSlidingWindow<C> {
    fn try_acquire_n(&self, n: u32) -> Result<(), Denied> {
        check_request(n, self.machine.limit)?;
        let now = self.timeline.now();
        let mut state = self.state.lock();
        let (pool, prev) = *state;
        let (next, publish) = self.machine.decide(pool, prev, now, n)?;
        if let Some(finished) = publish {
            let (index, _) = self.machine.unpack(finished);
            let slot = &mut state.1[Approx::slot(index)];
            *slot = (*slot).max(finished);
        }
        state.0 = next;
        Ok(())
    }

    fn snapshot(&self) -> Snapshot {
        let now = self.timeline.now();
        let (pool, prev) = *self.state.lock();
        self.machine.snapshot(pool, prev, now)
    }

    fn try_acquire_n_with_snapshot(&self, n: u32) -> Result<Snapshot, Rejection> {
        if let Err(denied) = check_request(n, self.machine.limit) {
            return Err(Rejection::new(denied, self.snapshot()));
        }
        let now = self.timeline.now();
        let mut state = self.state.lock();
        let (pool, prev) = *state;
        let (next, publish) = self
            .machine
            .decide(pool, prev, now, n)
            .map_err(|denied| Rejection::new(denied, self.machine.snapshot(pool, prev, now)))?;
        if let Some(finished) = publish {
            let (index, _) = self.machine.unpack(finished);
            let slot = &mut state.1[Approx::slot(index)];
            *slot = (*slot).max(finished);
        }
        state.0 = next;
        Ok(self.machine.snapshot(next, state.1, now))
    }
}
