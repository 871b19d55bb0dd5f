//! The sliding log's locking twin: the same rings and decisions under a mutex.

use std::time::Duration;

use crossbeam_utils::CachePadded;

use super::log::retry_after;
use super::rules::LogConfig;
use super::stripes::{Plan, Rings};
use super::{Replan, first_rings};
use crate::clock::{Clock, MonotonicClock};
use crate::error::{ConfigError, Denied};
use crate::limiter::{RateLimiter, Rejection, Snapshot, check_request, report};
use crate::rate::Rate;
use crate::sync::Mutex;
use crate::timeline::Timeline;

/// The [`SlidingLog`](crate::SlidingLog)'s twin: the same rings of entry words,
/// split over the same stripes, and the same decision code, run under a
/// `parking_lot` mutex.
///
/// Given the same clock readings on the same threads it makes the same
/// decisions, with the same retry-after and the same snapshots, and a
/// reconfiguration inherits the same entries. It is the baseline in the benchmarks, the second opinion in the
/// property tests, and a fallback for anyone who prefers a lock.
///
/// ```
/// use tollgate::{LockingSlidingLog, Rate, RateLimiter};
///
/// let log = LockingSlidingLog::new(Rate::per_minute(2)).unwrap();
/// assert!(log.try_acquire_n(2).is_ok());
/// assert!(log.try_acquire().is_err());
/// ```
#[derive(Debug)]
pub struct LockingSlidingLog<C = MonotonicClock> {
    rings: CachePadded<Mutex<Rings>>,
    timeline: Timeline<C>,
}

impl LockingSlidingLog {
    /// As [`SlidingLog::new`](crate::SlidingLog::new), with the same errors.
    ///
    /// ```
    /// use tollgate::{LockingSlidingLog, Rate};
    /// let log = LockingSlidingLog::new(Rate::per_second(100)).unwrap();
    /// # let _ = log;
    /// ```
    pub fn new(rate: Rate) -> Result<Self, ConfigError> {
        Self::with_clock(rate, MonotonicClock::new())
    }
}

impl<C: Clock> LockingSlidingLog<C> {
    /// As [`SlidingLog::with_clock`](crate::SlidingLog::with_clock).
    ///
    /// ```
    /// use tollgate::{LockingSlidingLog, ManualClock, Rate};
    /// let log = LockingSlidingLog::with_clock(Rate::per_second(10), ManualClock::new()).unwrap();
    /// # let _ = log;
    /// ```
    pub fn with_clock(rate: Rate, clock: C) -> Result<Self, ConfigError> {
        Ok(LockingSlidingLog {
            rings: CachePadded::new(Mutex::new(first_rings(rate)?)),
            timeline: Timeline::new(clock),
        })
    }

    /// As [`SlidingLog::count_denied`](crate::SlidingLog::count_denied).
    ///
    /// ```
    /// use tollgate::{LockingSlidingLog, ManualClock, Rate, RateLimiter};
    /// let log = LockingSlidingLog::with_clock(Rate::per_second(1), ManualClock::new())
    ///     .unwrap()
    ///     .count_denied(true);
    /// assert!(log.try_acquire().is_ok());
    /// assert!(log.try_acquire().is_err());
    /// ```
    pub fn count_denied(self, on: bool) -> Self {
        self.set_count_denied(on);
        self
    }

    /// As [`SlidingLog::with_stripes`](crate::SlidingLog::with_stripes).
    ///
    /// ```
    /// use tollgate::{LockingSlidingLog, Rate};
    /// let log = LockingSlidingLog::new(Rate::per_second(10)).unwrap().with_stripes(2);
    /// assert_eq!(log.stripes(), 2);
    /// ```
    pub fn with_stripes(self, stripes: usize) -> Self {
        self.set_stripes(stripes);
        self
    }

    /// As [`SlidingLog::stripes`](crate::SlidingLog::stripes).
    ///
    /// ```
    /// use tollgate::{LockingSlidingLog, Rate};
    /// let log = LockingSlidingLog::new(Rate::per_second(10)).unwrap().with_stripes(1);
    /// assert_eq!(log.stripes(), 1);
    /// ```
    pub fn stripes(&self) -> usize {
        self.rings.lock().ring_count()
    }

    /// As [`SlidingLog::reconfigure`](crate::SlidingLog::reconfigure): the same
    /// inherited entries, the same guarantee, the same errors.
    ///
    /// ```
    /// use tollgate::{LockingSlidingLog, Rate, RateLimiter};
    /// let log = LockingSlidingLog::new(Rate::per_minute(1)).unwrap();
    /// log.try_acquire().unwrap();
    /// log.reconfigure(Rate::per_minute(2)).unwrap();
    /// assert!(log.try_acquire().is_ok());
    /// assert!(log.try_acquire().is_err());
    /// ```
    pub fn reconfigure(&self, rate: Rate) -> Result<(), ConfigError> {
        self.set_rate(rate)
    }

    /// As [`SlidingLog::with_rule`](crate::SlidingLog::with_rule).
    ///
    /// ```
    /// use tollgate::{LockingSlidingLog, Rate, RateLimiter};
    /// let log = LockingSlidingLog::new(Rate::per_second(5))?.with_rule(Rate::per_hour(6))?;
    /// assert!(log.try_acquire_n(5).is_ok());
    /// assert!(log.try_acquire_n(2).is_err()); // 7 this hour
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn with_rule(self, rate: Rate) -> Result<Self, ConfigError> {
        self.add_rule(rate)?;
        Ok(self)
    }

    /// As [`SlidingLog::reconfigure_rules`](crate::SlidingLog::reconfigure_rules):
    /// the same inherited entries.
    ///
    /// ```
    /// use tollgate::{LockingSlidingLog, LogConfig, Rate, RateLimiter};
    /// let log = LockingSlidingLog::new(Rate::per_second(10))?;
    /// log.reconfigure_rules(&LogConfig::new(Rate::per_second(10))?.with_rule(Rate::per_hour(1))?);
    /// assert!(log.try_acquire().is_ok());
    /// assert!(log.try_acquire().is_err());
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn reconfigure_rules(&self, rules: &LogConfig) {
        self.set_rules(rules);
    }

    /// As [`SlidingLog::rules`](crate::SlidingLog::rules).
    ///
    /// ```
    /// use tollgate::{LockingSlidingLog, Rate};
    /// let log = LockingSlidingLog::new(Rate::per_second(5))?;
    /// assert_eq!(log.rules().rules().collect::<Vec<_>>(), [Rate::per_second(5)]);
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn rules(&self) -> LogConfig {
        self.current_rules()
    }

    /// The permits allowed per window.
    ///
    /// ```
    /// use tollgate::{LockingSlidingLog, Rate};
    /// assert_eq!(LockingSlidingLog::new(Rate::per_second(100)).unwrap().limit(), 100);
    /// ```
    pub fn limit(&self) -> u32 {
        self.rings.lock().limit()
    }

    /// The window's length.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{LockingSlidingLog, Rate};
    /// let log = LockingSlidingLog::new(Rate::per_second(100)).unwrap();
    /// assert_eq!(log.window(), Duration::from_secs(1));
    /// ```
    pub fn window(&self) -> Duration {
        self.rings.lock().rules().window()
    }

    /// The clock this limiter reads.
    ///
    /// ```
    /// use tollgate::{Clock, LockingSlidingLog, ManualClock, Rate};
    /// let clock = ManualClock::new();
    /// let log = LockingSlidingLog::with_clock(Rate::per_second(10), clock.clone()).unwrap();
    /// clock.set(7);
    /// assert_eq!(log.clock().now(), 7);
    /// ```
    pub fn clock(&self) -> &C {
        self.timeline.clock()
    }
}

impl<C> Replan for LockingSlidingLog<C> {
    /// Under the lock, inheriting as the lock-free log does.
    fn replace_rings(&self, make: impl Fn(Plan) -> Plan) {
        let mut rings = self.rings.lock();
        // Under the lock nobody else seals: this caller always does.
        rings.seal();
        *rings = rings.successor(make(rings.plan()));
    }

    fn current_rules(&self) -> LogConfig {
        self.rings.lock().rules().clone()
    }
}

impl<C: Clock> RateLimiter for LockingSlidingLog<C> {
    fn try_acquire_n(&self, n: u32) -> Result<(), Denied> {
        let rings = self.rings.lock();
        check_request(n, rings.limit())?;
        // Read under the lock, like the lock-free log reads it after finding its
        // rings: one reading per request, checked against the state it decides on.
        let now = self.timeline.now();
        // Only a reconfiguration seals rings, and it replaces them under the lock.
        rings
            .try_acquire_n(now, n)
            .unwrap_or_else(|_sealed| Err(retry_after(rings.shape().window())))
    }

    fn snapshot(&self) -> Snapshot {
        let rings = self.rings.lock();
        rings.snapshot(self.timeline.now())
    }

    /// The snapshot is of the rings the decision left, under the same lock.
    fn try_acquire_n_with_snapshot(&self, n: u32) -> Result<Snapshot, Rejection> {
        let rings = self.rings.lock();
        if let Err(denied) = check_request(n, rings.limit()) {
            return Err(Rejection::new(denied, rings.snapshot(self.timeline.now())));
        }
        let now = self.timeline.now();
        let outcome = rings
            .try_acquire_n(now, n)
            .unwrap_or_else(|_sealed| Err(retry_after(rings.shape().window())));
        report(outcome, rings.snapshot(now))
    }
}
