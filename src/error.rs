//! What can go wrong: a configuration that cannot be honoured, and a request that
//! is denied.

use std::fmt;
use std::time::Duration;

/// Why a limiter could not be built.
///
/// Every limiter validates its configuration once, at construction, so that the
/// decision path never has to: after `new` succeeds, no input can make a limiter
/// panic or overflow.
///
/// ```
/// use tollgate::{ConfigError, Rate, TokenBucket};
///
/// let err = TokenBucket::new(0, Rate::per_second(10)).unwrap_err();
/// assert_eq!(err, ConfigError::ZeroCapacity);
/// assert_eq!(err.to_string(), "capacity must be at least 1 permit");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// The rate admits zero permits per period.
    ZeroRate,
    /// The rate's period is zero.
    ZeroPeriod,
    /// The burst capacity (token bucket) is zero.
    ZeroCapacity,
    /// More than one permit per nanosecond: finer than the clock can resolve.
    TooFine {
        /// Permits per period, as configured.
        permits: u32,
        /// The period, as configured.
        period: Duration,
    },
    /// A value does not fit the limiter's 62-bit nanosecond time arithmetic
    /// (about 146 years).
    Overflow {
        /// Which quantity overflowed.
        what: &'static str,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::ZeroRate => f.write_str("rate must admit at least 1 permit per period"),
            ConfigError::ZeroPeriod => f.write_str("rate period must be longer than zero"),
            ConfigError::ZeroCapacity => f.write_str("capacity must be at least 1 permit"),
            ConfigError::TooFine { permits, period } => write!(
                f,
                "{permits} permits per {period:?} is more than one permit per nanosecond"
            ),
            ConfigError::Overflow { what } => write!(
                f,
                "{what} overflows the limiter's time range (2^62 ns, about 146 years)"
            ),
        }
    }
}

impl std::error::Error for ConfigError {}

/// Why a request was not admitted.
///
/// A denial is either temporary ([`Denied::RetryAfter`]) or permanent for this
/// request ([`Denied::ExceedsCapacity`], [`Denied::ZeroPermits`]); only the first
/// is worth retrying.
///
/// ```
/// use std::time::Duration;
/// use tollgate::{Denied, ManualClock, Rate, RateLimiter, TokenBucket};
///
/// let clock = ManualClock::new();
/// let bucket = TokenBucket::with_clock(2, Rate::per_second(2), clock.clone()).unwrap();
/// assert_eq!(bucket.try_acquire_n(3), Err(Denied::ExceedsCapacity { requested: 3, capacity: 2 }));
/// bucket.try_acquire_n(2).unwrap();
/// assert_eq!(bucket.try_acquire(), Err(Denied::RetryAfter(Duration::from_millis(500))));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Denied {
    /// Not now. The same request would be admitted after exactly this long, measured
    /// on the limiter's clock, if no other request were admitted in between.
    RetryAfter(Duration),
    /// The request asks for more permits than the limiter can ever hold at once;
    /// it can never succeed, so there is nothing to wait for.
    ExceedsCapacity {
        /// Permits requested.
        requested: u32,
        /// The most permits one request can be granted.
        capacity: u32,
    },
    /// A request for zero permits is a caller bug, reported rather than admitted.
    ZeroPermits,
}

impl Denied {
    /// The wait before retrying, if waiting can help.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::Denied;
    ///
    /// assert_eq!(Denied::RetryAfter(Duration::from_secs(1)).retry_after(), Some(Duration::from_secs(1)));
    /// assert_eq!(Denied::ZeroPermits.retry_after(), None);
    /// ```
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Denied::RetryAfter(wait) => Some(*wait),
            _ => None,
        }
    }
}

impl fmt::Display for Denied {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Denied::RetryAfter(wait) => write!(f, "rate limited; retry after {wait:?}"),
            Denied::ExceedsCapacity {
                requested,
                capacity,
            } => write!(
                f,
                "{requested} permits requested but at most {capacity} can ever be granted at once"
            ),
            Denied::ZeroPermits => f.write_str("a request must ask for at least 1 permit"),
        }
    }
}

impl std::error::Error for Denied {}
