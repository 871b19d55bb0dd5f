//! The token bucket in Redis: GCRA over one theoretical arrival time per key,
//! as tollgate's in-process [`TokenBucket`](tollgate::TokenBucket).
//!
//! The key is a string `tb2:<tat>`: the TAT in µs since the Unix epoch, when
//! the bucket is full again. An admission of `n` at server time `now`
//! sets `TAT = max(TAT, now) + n·interval` if that is at most
//! `now + capacity·interval`; a denial writes nothing and carries the exact
//! wait, `TAT + n·interval − now − capacity·interval`. The key expires at its
//! TAT, when a missing key means the same thing (a full bucket).
//!
//! A key that does not hold `tb2:` and one non-negative integer, or whose TAT
//! lies beyond `now + capacity·interval` (further than this bucket writes)
//! and after the key's own expiry or on a key without expiry, is
//! [`Error::UnknownState`](crate::Error::UnknownState) naming the field, and
//! is left untouched: damaged state never admits. (The expiry is read only for
//! such a TAT: one within the capacity is what a decision could have written,
//! and the next admission sets the expiry with it.) A hash `{v: "tb1", tat}`,
//! the format of earlier versions, is read too and written anew as a string.
//!
//! Guarantee, by server decision time: at most `capacity + (b − a)/interval`
//! permits in any interval `[a, b]`, across every client of the key.
//!
//! ```no_run
//! # async fn demo(client: tollgate_redis::Client) -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use tollgate::{Denied, Rate};
//! use tollgate_redis::{Error, TokenBucket};
//!
//! // Bursts of up to 5, refilling 100 per second (one per 10 ms).
//! let bucket = TokenBucket::new("api", 5, Rate::per_second(100))?;
//! client.try_acquire_n(&bucket, "user:42", 5).await?;
//! match client.try_acquire(&bucket, "user:42").await {
//!     Err(Error::Denied(Denied::RetryAfter(wait))) => assert!(wait <= Duration::from_millis(10)),
//!     other => panic!("expected a retry-after, got {other:?}"),
//! }
//! # Ok(()) }
//! ```

use std::time::Duration;

use tollgate::{ConfigError, Rate};

use crate::keys::{DEFAULT_PREFIX, check_name, check_prefix, redis_key};
use crate::limiter::{Kind, Limiter, Plan};
use crate::micros::{product, validate};
use crate::script::Admission;

/// A token bucket shared through Redis: bursts up to a capacity, refilled at a
/// rate, per caller key. See the [module docs](self).
///
/// ```
/// use std::time::Duration;
/// use tollgate::Rate;
/// use tollgate_redis::TokenBucket;
///
/// let bucket = TokenBucket::new("api", 20, Rate::per_second(100)).unwrap();
/// assert_eq!(bucket.emission_interval(), Duration::from_millis(10));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenBucket {
    capacity: u32,
    /// Microseconds per permit, rounded up.
    interval: u64,
    /// `capacity · interval`.
    tolerance: u64,
    prefix: String,
    name: String,
}

impl TokenBucket {
    /// The bucket `name`: `capacity` permits refilled at `rate`; a key never
    /// seen is full.
    ///
    /// The name sets the limiter apart: its state lives under
    /// `<prefix>:<name>:{<key>}:tb`, so limiters with different names never
    /// share state, whatever keys they are asked about. Processes that share
    /// one limit give it the same name, prefix and configuration.
    ///
    /// The time per permit is `rate`'s period over its permits, rounded up to a
    /// whole microsecond (Redis `TIME`'s resolution), so the bucket never runs
    /// faster than asked. Errors: [`ConfigError::InvalidName`] (empty, longer
    /// than [`MAX_NAME_LEN`](crate::MAX_NAME_LEN) bytes, or with `{` or `}`),
    /// [`ConfigError::ZeroCapacity`],
    /// [`ConfigError::ZeroRate`], [`ConfigError::ZeroPeriod`],
    /// [`ConfigError::TooFine`] (more than one permit per µs),
    /// [`ConfigError::Overflow`] (capacity × time per permit above 2^51 µs).
    ///
    /// ```
    /// use tollgate::{ConfigError, Rate};
    /// use tollgate_redis::TokenBucket;
    /// assert!(TokenBucket::new("login", 30, Rate::per_minute(30)).is_ok());
    /// assert_eq!(TokenBucket::new("login", 1, Rate::per_second(0)), Err(ConfigError::ZeroRate));
    /// assert_eq!(TokenBucket::new("", 1, Rate::per_second(1)), Err(ConfigError::InvalidName));
    /// ```
    pub fn new(name: &str, capacity: u32, rate: Rate) -> Result<Self, ConfigError> {
        let name = check_name(name)?;
        let (permits, period) = validate(rate)?;
        if capacity == 0 {
            return Err(ConfigError::ZeroCapacity);
        }
        let interval = period.div_ceil(u64::from(permits));
        let tolerance = product(interval, u64::from(capacity), "capacity × time per permit")?;
        Ok(TokenBucket {
            capacity,
            interval,
            tolerance,
            prefix: DEFAULT_PREFIX.to_owned(),
            name,
        })
    }

    /// The same bucket under another key prefix (default `tollgate`): the
    /// namespace of an application that shares its Redis with others. Its
    /// limiters keep apart by their names.
    ///
    /// Errors: [`ConfigError::InvalidPrefix`] (a prefix with `{` or `}`).
    ///
    /// ```
    /// use tollgate::Rate;
    /// use tollgate_redis::{Limiter, TokenBucket};
    /// let login = TokenBucket::new("login", 5, Rate::per_minute(5)).unwrap();
    /// let login = login.with_prefix("shop").unwrap();
    /// assert_eq!(login.redis_key("alice"), "shop:login:{alice}:tb");
    /// ```
    pub fn with_prefix(mut self, prefix: &str) -> Result<Self, ConfigError> {
        self.prefix = check_prefix(prefix)?;
        Ok(self)
    }

    /// The time one permit takes to refill, in whole microseconds.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::Rate;
    /// let bucket = tollgate_redis::TokenBucket::new("api", 1, Rate::per_second(7)).unwrap();
    /// assert_eq!(bucket.emission_interval(), Duration::from_micros(142_858));
    /// ```
    pub fn emission_interval(&self) -> Duration {
        Duration::from_micros(self.interval)
    }

    /// The GCRA terms every script on this state takes: the time per permit
    /// and the tolerance (`capacity ×` it), in µs.
    pub(crate) fn terms(&self) -> [u64; 2] {
        [self.interval, self.tolerance]
    }
}

impl Limiter for TokenBucket {
    fn capacity(&self) -> u32 {
        self.capacity
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn redis_key(&self, key: &str) -> String {
        redis_key(&self.prefix, &self.name, key, "tb")
    }

    /// Each missing permit refills in one interval: the bucket is whole
    /// again at most `(capacity − remaining) · interval` after the admission.
    fn report(&self, admission: &Admission) -> tollgate::Snapshot {
        let missing = u64::from(self.capacity.saturating_sub(admission.remaining));
        tollgate::Snapshot::new(
            admission.remaining,
            self.capacity,
            Duration::from_micros(missing.saturating_mul(self.interval)),
        )
    }

    fn plan(&self) -> Plan {
        Plan::new(Kind::TokenBucket, &self.terms())
    }
}
