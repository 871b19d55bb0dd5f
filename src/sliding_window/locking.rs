//! The sliding window's locking twin: exact per-sub-window counts under a mutex.

use std::time::Duration;

use crossbeam_utils::CachePadded;

use super::ring::WindowShape;
use super::{SlidingWindowBuilder, SubWindows};
use crate::clock::{Clock, MonotonicClock};
use crate::error::{ConfigError, Denied};
use crate::limiter::{RateLimiter, Rejection, Snapshot, check_request, report};
use crate::rate::Rate;
use crate::sync::Mutex;
use crate::timeline::Timeline;

/// The newest sub-window seen and a ring of `(index, admitted)` per sub-window,
/// its length a power of two of at least the sub-window count (as the striped
/// limiter's history, so that a slot is a mask away).
#[derive(Debug)]
struct Counts {
    newest: u64,
    slots: Box<[(u64, u32)]>,
}

impl Counts {
    fn slot(&self, i: u64) -> usize {
        // Masked to below the ring's length, a usize.
        (i & (self.slots.len() as u64 - 1)) as usize
    }

    fn charge(&self, i: u64) -> u32 {
        let (stamp, count) = self.slots[self.slot(i)];
        if stamp == i { count } else { 0 }
    }
}

/// The [`SlidingWindow`](crate::SlidingWindow)'s twin: the same window and the
/// same rules, with the admitted count of each sub-window kept exactly under a
/// `parking_lot` mutex instead of in leased stripes.
///
/// Given the same clock readings it makes the same decisions as a
/// `SlidingWindow` used from one thread, with the same retry-after and the same
/// snapshots; from many threads it admits whatever the window allows, where the
/// striped limiter may deny a few requests while budget sits on other stripes.
/// It is the baseline in the benchmarks, the reference in the property tests,
/// and a fallback for anyone who prefers a lock (it is smaller: no stripes).
///
/// ```
/// use tollgate::{LockingSlidingWindow, Rate, RateLimiter};
///
/// let window = LockingSlidingWindow::new(Rate::per_minute(2)).unwrap();
/// assert!(window.try_acquire_n(2).is_ok());
/// assert!(window.try_acquire().is_err());
/// ```
#[derive(Debug)]
pub struct LockingSlidingWindow<C = MonotonicClock> {
    geo: WindowShape,
    counts: CachePadded<Mutex<Counts>>,
    timeline: Timeline<C>,
}

impl LockingSlidingWindow {
    /// As [`SlidingWindow::new`](crate::SlidingWindow::new), with the same errors.
    ///
    /// ```
    /// use tollgate::{LockingSlidingWindow, Rate};
    /// let window = LockingSlidingWindow::new(Rate::per_minute(100)).unwrap();
    /// assert_eq!(window.sub_windows(), 10);
    /// ```
    pub fn new(rate: Rate) -> Result<Self, ConfigError> {
        Self::with_clock(rate, MonotonicClock::new())
    }

    /// The same builder as [`SlidingWindow::builder`](crate::SlidingWindow::builder);
    /// finish it with [`SlidingWindowBuilder::build_locking`].
    ///
    /// ```
    /// use tollgate::{LockingSlidingWindow, Rate};
    /// let window = LockingSlidingWindow::builder(Rate::per_minute(60))
    ///     .sub_windows(6)
    ///     .build_locking()
    ///     .unwrap();
    /// assert_eq!(window.sub_windows(), 6);
    /// ```
    pub fn builder(rate: Rate) -> SlidingWindowBuilder {
        SlidingWindowBuilder::new(rate)
    }
}

impl<C: Clock> LockingSlidingWindow<C> {
    /// As [`SlidingWindow::with_clock`](crate::SlidingWindow::with_clock).
    ///
    /// ```
    /// use tollgate::{LockingSlidingWindow, ManualClock, Rate};
    /// let window = LockingSlidingWindow::with_clock(Rate::per_second(10), ManualClock::new()).unwrap();
    /// # let _ = window;
    /// ```
    pub fn with_clock(rate: Rate, clock: C) -> Result<Self, ConfigError> {
        Self::build(rate, SubWindows::Default, clock)
    }

    pub(super) fn build(rate: Rate, subs: SubWindows, clock: C) -> Result<Self, ConfigError> {
        let geo = WindowShape::new(rate, subs.resolve(rate))?;
        Ok(LockingSlidingWindow {
            geo,
            counts: CachePadded::new(Mutex::new(Counts {
                newest: 0,
                slots: vec![(0, 0); (geo.subs() as usize).next_power_of_two()].into_boxed_slice(),
            })),
            timeline: Timeline::new(clock),
        })
    }

    /// The number of sub-windows the window is cut into.
    ///
    /// ```
    /// use tollgate::{LockingSlidingWindow, Rate};
    /// let window = LockingSlidingWindow::new(Rate::per_second(5)).unwrap();
    /// assert_eq!(window.sub_windows(), 10);
    /// ```
    pub fn sub_windows(&self) -> u32 {
        self.geo.subs()
    }

    /// The length of one sub-window: the rate's period divided by the number of
    /// sub-windows, rounded up to a whole nanosecond.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{LockingSlidingWindow, Rate};
    /// let window = LockingSlidingWindow::new(Rate::per_second(5)).unwrap();
    /// assert_eq!(window.sub_window(), Duration::from_millis(100));
    /// ```
    pub fn sub_window(&self) -> Duration {
        Duration::from_nanos(self.geo.sub())
    }

    /// Bytes this limiter occupies, inline and on the heap (allocator overhead
    /// aside).
    ///
    /// ```
    /// use tollgate::{LockingSlidingWindow, Rate};
    /// let window = LockingSlidingWindow::new(Rate::per_second(5)).unwrap();
    /// assert!(window.memory() > std::mem::size_of_val(&window));
    /// ```
    pub fn memory(&self) -> usize {
        std::mem::size_of_val(self)
            + std::mem::size_of_val::<[(u64, u32)]>(&self.counts.lock().slots)
    }

    /// The clock this limiter reads.
    ///
    /// ```
    /// use tollgate::{Clock, LockingSlidingWindow, ManualClock, Rate};
    /// let clock = ManualClock::new();
    /// let window = LockingSlidingWindow::with_clock(Rate::per_second(10), clock.clone()).unwrap();
    /// clock.set(7);
    /// assert_eq!(window.clock().now(), 7);
    /// ```
    pub fn clock(&self) -> &C {
        self.timeline.clock()
    }
}

impl<C: Clock> LockingSlidingWindow<C> {
    /// The decision, on the counts its caller has locked.
    fn decide(&self, counts: &mut Counts, now: u64, n: u32) -> Result<(), Denied> {
        let j = self.geo.index(now);
        let newest = counts.newest;
        if j < newest {
            // A reading older than a sub-window already opened: nothing can be
            // admitted before that sub-window starts (the striped limiter's pool
            // has moved on, and so has this one).
            return Err(self
                .geo
                .retry_after(now, newest, newest, n, |i| counts.charge(i)));
        }
        // Opening a sub-window is remembered even if this request is denied, as
        // the striped limiter's pool remembers it.
        counts.newest = j;
        if self.geo.room(j, j, |i| counts.charge(i)) >= n {
            let slot = counts.slot(j);
            let admitted = counts.charge(j) + n;
            counts.slots[slot] = (j, admitted);
            Ok(())
        } else {
            Err(self.geo.retry_after(now, j + 1, j, n, |i| counts.charge(i)))
        }
    }
}

impl<C: Clock> RateLimiter for LockingSlidingWindow<C> {
    fn try_acquire_n(&self, n: u32) -> Result<(), Denied> {
        check_request(n, self.geo.limit())?;
        let now = self.timeline.now();
        self.decide(&mut self.counts.lock(), now, n)
    }

    fn snapshot(&self) -> Snapshot {
        let now = self.timeline.now();
        let counts = self.counts.lock();
        self.geo.snapshot(now, counts.newest, |i| counts.charge(i))
    }

    /// The snapshot is of the counts the decision left, under the same lock.
    fn try_acquire_n_with_snapshot(&self, n: u32) -> Result<Snapshot, Rejection> {
        if let Err(denied) = check_request(n, self.geo.limit()) {
            return Err(Rejection::new(denied, self.snapshot()));
        }
        let now = self.timeline.now();
        let mut counts = self.counts.lock();
        let outcome = self.decide(&mut counts, now, n);
        report(
            outcome,
            self.geo.snapshot(now, counts.newest, |i| counts.charge(i)),
        )
    }
}
