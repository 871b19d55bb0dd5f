//! A rate: so many permits per period.

use std::time::Duration;

use crate::error::ConfigError;
use crate::timeline::MAX_TIME;

/// So many permits per period: `Rate::per_second(100)`, `Rate::per_minute(30)`,
/// `Rate::new(5, Duration::from_millis(10))`.
///
/// Building a `Rate` never fails; the limiter that receives it validates it and
/// reports a [`ConfigError`] for a zero rate, a zero period, more than one permit
/// per nanosecond, or a period too long for the 62-bit time arithmetic.
///
/// ```
/// use std::time::Duration;
/// use tollgate::Rate;
///
/// let rate = Rate::new(5, Duration::from_millis(10));
/// assert_eq!(rate.permits(), 5);
/// assert_eq!(rate.period(), Duration::from_millis(10));
/// assert_eq!(Rate::per_minute(30), Rate::new(30, Duration::from_secs(60)));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rate {
    permits: u32,
    period: Duration,
}

impl Rate {
    /// `permits` per `period`.
    ///
    /// ```
    /// use std::time::Duration;
    /// let rate = tollgate::Rate::new(100, Duration::from_secs(1));
    /// assert_eq!(rate, tollgate::Rate::per_second(100));
    /// ```
    pub const fn new(permits: u32, period: Duration) -> Rate {
        Rate { permits, period }
    }

    /// `permits` per second.
    ///
    /// ```
    /// assert_eq!(tollgate::Rate::per_second(7).permits(), 7);
    /// ```
    pub const fn per_second(permits: u32) -> Rate {
        Rate::new(permits, Duration::from_secs(1))
    }

    /// `permits` per minute.
    ///
    /// ```
    /// assert_eq!(tollgate::Rate::per_minute(30).period().as_secs(), 60);
    /// ```
    pub const fn per_minute(permits: u32) -> Rate {
        Rate::new(permits, Duration::from_secs(60))
    }

    /// `permits` per hour.
    ///
    /// ```
    /// assert_eq!(tollgate::Rate::per_hour(1000).period().as_secs(), 3600);
    /// ```
    pub const fn per_hour(permits: u32) -> Rate {
        Rate::new(permits, Duration::from_secs(3600))
    }

    /// Permits per period.
    ///
    /// ```
    /// assert_eq!(tollgate::Rate::per_hour(1000).permits(), 1000);
    /// ```
    pub const fn permits(&self) -> u32 {
        self.permits
    }

    /// The period.
    ///
    /// ```
    /// assert_eq!(tollgate::Rate::per_second(1).period(), std::time::Duration::from_secs(1));
    /// ```
    pub const fn period(&self) -> Duration {
        self.period
    }

    /// Checks the rate and returns `(permits, period in ns)`, both non-zero, with at
    /// most one permit per nanosecond and the period inside the time range.
    pub(crate) fn validate(&self) -> Result<(u32, u64), ConfigError> {
        if self.permits == 0 {
            return Err(ConfigError::ZeroRate);
        }
        if self.period.is_zero() {
            return Err(ConfigError::ZeroPeriod);
        }
        let period_ns = u64::try_from(self.period.as_nanos())
            .ok()
            .filter(|&ns| ns <= MAX_TIME)
            .ok_or(ConfigError::Overflow { what: "the period" })?;
        if period_ns < u64::from(self.permits) {
            return Err(ConfigError::TooFine {
                permits: self.permits,
                period: self.period,
            });
        }
        Ok((self.permits, period_ns))
    }
}
