//! What can go wrong: a configuration that cannot be honoured, and a request that
//! is denied.

use std::fmt;
use std::time::Duration;

use crate::limits::{MAX_COLD_FACTOR, MAX_SUB_WINDOWS};

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
    /// More than one permit per tick of the limiter's clock: finer than the
    /// clock can resolve. A tick is a nanosecond for the in-process limiters
    /// and a microsecond (the resolution of Redis `TIME`) for limits kept in
    /// Redis by tollgate-redis.
    TooFine {
        /// Permits per period, as configured.
        permits: u32,
        /// The period, as configured.
        period: Duration,
    },
    /// A value does not fit the limiter's exact time arithmetic: 2^62 ns
    /// (about 146 years) for the in-process limiters, 2^51 µs (about 71
    /// years) for limits kept in Redis, whose Lua numbers are exact only
    /// below 2^53.
    Overflow {
        /// Which quantity overflowed.
        what: &'static str,
    },
    /// A sliding window cannot be cut into this many sub-windows: the count must
    /// be at least 1, at most [`MAX_SUB_WINDOWS`](crate::MAX_SUB_WINDOWS),
    /// and small enough that no sub-window is shorter than the limit in
    /// nanoseconds (one permit per nanosecond, as for [`TooFine`](Self::TooFine)).
    ///
    /// ```
    /// use tollgate::{ConfigError, Rate, SlidingWindow};
    ///
    /// let err = SlidingWindow::builder(Rate::per_second(5)).sub_windows(0).build().unwrap_err();
    /// assert_eq!(err, ConfigError::InvalidSubWindows { sub_windows: 0, max: 4096 });
    /// assert_eq!(
    ///     err.to_string(),
    ///     "0 sub-windows is outside 1..=4096: a sliding window has at most 4096 sub-windows, \
    ///      none shorter than 1 ns per permit"
    /// );
    /// ```
    InvalidSubWindows {
        /// The sub-window count asked for.
        sub_windows: u32,
        /// The most sub-windows this rate's window can be cut into.
        max: u32,
    },
    /// A warm-up limiter's cold factor is outside `1..=`[`MAX_COLD_FACTOR`](crate::MAX_COLD_FACTOR).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{ConfigError, ManualClock, Rate, WarmUp};
    ///
    /// let err = WarmUp::with_cold_factor(Rate::per_second(5), Duration::from_secs(4), 0, ManualClock::new())
    ///     .unwrap_err();
    /// assert_eq!(err, ConfigError::InvalidColdFactor { cold_factor: 0 });
    /// assert_eq!(err.to_string(), "cold factor 0 is outside 1..=1000");
    /// ```
    InvalidColdFactor {
        /// The cold factor asked for.
        cold_factor: u32,
    },
    /// A warm-up limiter's warm-up period is longer than 2^52 ns (about 52 days),
    /// the most its cost arithmetic can hold.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{ConfigError, Rate, WarmUp};
    ///
    /// let warm_up = Duration::from_secs(60 * 60 * 24 * 60); // 60 days
    /// let err = WarmUp::new(Rate::per_second(5), warm_up).unwrap_err();
    /// assert_eq!(err, ConfigError::WarmUpTooLong { warm_up });
    /// assert_eq!(
    ///     err.to_string(),
    ///     "a warm-up period of 5184000s is longer than 2^52 ns (about 52 days)"
    /// );
    /// ```
    WarmUpTooLong {
        /// The warm-up period asked for.
        warm_up: Duration,
    },
    /// A shaper's maximum wait is longer than 2^61 ns (about 73 years), the most
    /// a request may be queued for.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{ConfigError, Rate, Shaper};
    ///
    /// let err = Shaper::new(Rate::per_second(5), 0, Duration::MAX).unwrap_err();
    /// assert_eq!(err, ConfigError::MaxWaitTooLong { max_wait: Duration::MAX });
    /// assert!(err.to_string().ends_with("is longer than 2^61 ns (about 73 years)"));
    /// ```
    MaxWaitTooLong {
        /// The maximum wait asked for.
        max_wait: Duration,
    },
    /// A log that keeps one entry per permit cannot hold this many per
    /// window: tollgate-redis's sliding log keeps one sorted-set member per
    /// permit and allows at most `max`.
    ///
    /// ```
    /// use tollgate::ConfigError;
    ///
    /// let err = ConfigError::LogTooLong { limit: 2_000_000, max: 1 << 20 };
    /// assert_eq!(err.to_string(), "a sliding log of 2000000 entries is longer than 1048576");
    /// ```
    LogTooLong {
        /// The limit asked for.
        limit: u32,
        /// The most entries the log keeps per window.
        max: u32,
    },
    /// A key prefix contains `{` or `}`. Limiters that keep their state
    /// under named keys (tollgate-redis) put the caller's key in a Redis
    /// Cluster hash tag, which must be the first braces of the name.
    ///
    /// ```
    /// use tollgate::ConfigError;
    ///
    /// assert_eq!(
    ///     ConfigError::InvalidPrefix.to_string(),
    ///     "a key prefix must not contain '{' or '}'"
    /// );
    /// ```
    InvalidPrefix,
    /// A limiter's name is empty, longer than 128 bytes, or contains `{` or
    /// `}`. Limiters that keep their state under named keys (tollgate-redis)
    /// put their name before the Redis Cluster hash tag that holds the
    /// caller's key, and those tag braces must be the first of the key.
    ///
    /// ```
    /// use tollgate::ConfigError;
    ///
    /// assert_eq!(
    ///     ConfigError::InvalidName.to_string(),
    ///     "a limiter's name must be 1 to 128 bytes long and must not contain '{' or '}'"
    /// );
    /// ```
    InvalidName,
    /// An adaptive limit's bounds are out of order: they must satisfy
    /// `1 <= min <= initial <= max <=` [`MAX_ADAPTIVE_LIMIT`](crate::MAX_ADAPTIVE_LIMIT).
    ///
    /// ```
    /// use tollgate::{Aimd, ConfigError};
    ///
    /// let err = Aimd::builder().min_limit(0).build().unwrap_err();
    /// assert_eq!(err, ConfigError::InvalidLimits { min: 0, initial: 20, max: 200 });
    /// assert_eq!(
    ///     err.to_string(),
    ///     "adaptive limits must satisfy 1 <= min (0) <= initial (20) <= max (200) <= 1048576"
    /// );
    /// ```
    InvalidLimits {
        /// The lowest limit asked for.
        min: u32,
        /// The limit to start from.
        initial: u32,
        /// The highest limit asked for.
        max: u32,
    },
    /// A parameter of an adaptive limit algorithm is outside its range.
    ///
    /// ```
    /// use tollgate::{Aimd, ConfigError};
    ///
    /// let err = Aimd::builder().backoff_ratio(0.2).build().unwrap_err();
    /// assert_eq!(err.to_string(), "backoff ratio is outside [0.5, 1)");
    /// ```
    InvalidParameter {
        /// The parameter.
        name: &'static str,
        /// The values it may take.
        range: &'static str,
    },
    /// A concurrency limit is outside `1..=max`: it must admit at least one
    /// permit at a time, and it packs its count and limit into one word,
    /// which holds at most [`ConcurrencyLimit::MAX_LIMIT`](crate::ConcurrencyLimit::MAX_LIMIT).
    ///
    /// ```
    /// use tollgate::{ConcurrencyLimit, ConfigError};
    ///
    /// let err = ConcurrencyLimit::new(0).unwrap_err();
    /// assert_eq!(err, ConfigError::InvalidConcurrencyLimit { limit: 0, max: ConcurrencyLimit::MAX_LIMIT });
    /// assert_eq!(err.to_string(), "a concurrency limit of 0 is outside 1..=2147483647");
    /// ```
    InvalidConcurrencyLimit {
        /// The limit asked for.
        limit: u32,
        /// The largest limit allowed.
        max: u32,
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
                "{permits} permits per {period:?} is more than one permit per tick of the \
                 limiter's clock (1 ns in process, 1 µs in Redis)"
            ),
            ConfigError::Overflow { what } => write!(
                f,
                "{what} overflows the limiter's time range (2^62 ns, about 146 years, in \
                 process; 2^51 µs, about 71 years, in Redis)"
            ),
            ConfigError::InvalidSubWindows { sub_windows, max } => write!(
                f,
                "{sub_windows} sub-windows is outside 1..={max}: a sliding window has at \
                 most {MAX_SUB_WINDOWS} sub-windows, none shorter than 1 ns per permit"
            ),
            ConfigError::InvalidColdFactor { cold_factor } => write!(
                f,
                "cold factor {cold_factor} is outside 1..={MAX_COLD_FACTOR}"
            ),
            ConfigError::WarmUpTooLong { warm_up } => write!(
                f,
                "a warm-up period of {warm_up:?} is longer than 2^52 ns (about 52 days)"
            ),
            ConfigError::MaxWaitTooLong { max_wait } => write!(
                f,
                "a maximum wait of {max_wait:?} is longer than 2^61 ns (about 73 years)"
            ),
            ConfigError::LogTooLong { limit, max } => {
                write!(f, "a sliding log of {limit} entries is longer than {max}")
            }
            ConfigError::InvalidPrefix => f.write_str("a key prefix must not contain '{' or '}'"),
            ConfigError::InvalidName => f.write_str(
                "a limiter's name must be 1 to 128 bytes long and must not contain '{' or '}'",
            ),
            ConfigError::InvalidLimits { min, initial, max } => write!(
                f,
                "adaptive limits must satisfy 1 <= min ({min}) <= initial ({initial}) <= max \
                 ({max}) <= 1048576"
            ),
            ConfigError::InvalidParameter { name, range } => {
                write!(f, "{name} is outside {range}")
            }
            ConfigError::InvalidConcurrencyLimit { limit, max } => {
                write!(f, "a concurrency limit of {limit} is outside 1..={max}")
            }
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
