//! The exact sliding log in Redis: never more than `N` permits in any window of
//! length `T`, by server time, as tollgate's in-process
//! [`SlidingLog`](tollgate::SlidingLog).
//!
//! The key is a sorted set with one member per admitted permit, scored by its
//! stamp (server µs). A request for `n` is admitted iff at most `N − n` permits
//! were stamped in `(now − T, now]` (`ZCOUNT`); a denial waits until the
//! `(used + n − N)`-th oldest of them leaves the window (`ZRANGEBYSCORE …
//! LIMIT`), exactly. Permits are stamped `max(now, newest stamp)`, so stamps
//! never go back even when the server clock does, and a reading older than the
//! newest stamp can only deny more.
//!
//! # Why a sorted set
//!
//! The design of gunslinger008's "Redis realizes dynamic rate control" (2022)
//! compares each request with the `N`-th previous one (a list of the last `N`
//! stamps, or one key per index). That list must hold exactly the last `N`, so
//! when the rule changes to a larger `N` the older stamps it needs are gone, and
//! the article's own complaint — rules that cannot change without deleting the
//! key — returns. A sorted set keeps stamps by
//! *time* instead: every permit of the last `history` (at least `T`) is there,
//! whatever `N` is, so **a rule change keeps the log**: a larger or smaller `N`,
//! a shorter `T`, or a longer one up to `history`, all decide on the same
//! entries, exactly. It also holds only the permits of the last `history` (at
//! most `N` per `T`), not a fixed `N` forever. `docs/benchmarks.md` measures
//! both designs.
//!
//! # Keys and expiry
//!
//! Members are zero-padded ticket numbers, so permits stamped in the same
//! microsecond still sort in order; a marker member at `-inf`, outside every
//! time range, tags the format. An admission drops the entries older than
//! `history` except the last `N` (a reading from a server clock that stepped
//! back may find those in its window again, as the in-process log's ring of `N`
//! would: the two agree decision for decision, backwards steps included); the
//! key expires `history` after its newest stamp.
//!
//! A sorted set whose first member is not the marker at `-inf`, whose newest
//! member is not a 16-digit ticket stamped with a whole, non-negative time no
//! later than the key's own expiry, that holds one of the tickets an admission
//! would add, or that has no expiry, is
//! [`Error::UnknownState`](crate::Error::UnknownState) naming the member; so is
//! a denial whose deciding entry has a fractional stamp. Every check comes
//! before the script's first write: damaged state is left untouched and never
//! admits.
//!
//! ```no_run
//! # async fn demo(client: tollgate_redis::Client) -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use tollgate::Rate;
//! use tollgate_redis::SlidingLog;
//!
//! // A third-party API allows 30 calls a minute and silently drops the rest.
//! let hour = Duration::from_secs(3600);
//! let log = SlidingLog::new("partner", Rate::per_minute(30))?.with_history(hour)?;
//! client.try_acquire(&log, "partner-api").await?;
//! // Later the partner raises the limit: same name and key, same log, new rule.
//! let raised = SlidingLog::new("partner", Rate::per_minute(60))?.with_history(hour)?;
//! client.try_acquire(&raised, "partner-api").await?;
//! # Ok(()) }
//! ```

use std::time::Duration;

use tollgate::{ConfigError, Rate};

use crate::keys::{DEFAULT_PREFIX, check_name, check_prefix, redis_key};
use crate::limiter::{Kind, Limiter, Plan};
use crate::micros::{span, validate};
use crate::script::Admission;

/// The most permits per window a sliding log keeps entries for: one sorted-set
/// member each.
pub const MAX_LOG_LIMIT: u32 = 1 << 20;

/// An exact sliding log shared through Redis: at most `rate.permits()` in any
/// window of `rate.period()`, per caller key. See the [module docs](self).
///
/// ```
/// use std::time::Duration;
/// use tollgate::Rate;
/// let log = tollgate_redis::SlidingLog::new("partner", Rate::per_minute(30)).unwrap();
/// assert_eq!(log.window(), Duration::from_secs(60));
/// assert_eq!(log.history(), Duration::from_secs(60));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlidingLog {
    limit: u32,
    window: u64,
    /// How long entries are kept, at least the window.
    history: u64,
    prefix: String,
    name: String,
}

impl SlidingLog {
    /// The log `name`: at most `rate.permits()` in any window of
    /// `rate.period()` (rounded up to a whole microsecond); entries are kept
    /// for one window.
    ///
    /// The name sets the limiter apart: its state lives under
    /// `<prefix>:<name>:{<key>}:sl`, so limiters with different names never
    /// share state, whatever keys they are asked about. Processes that share
    /// one limit give it the same name, prefix and configuration; a rule
    /// change that keeps the log keeps the name.
    ///
    /// Errors: [`ConfigError::InvalidName`] (empty, longer than
    /// [`MAX_NAME_LEN`](crate::MAX_NAME_LEN) bytes, or with `{` or `}`),
    /// [`ConfigError::ZeroRate`], [`ConfigError::ZeroPeriod`],
    /// [`ConfigError::TooFine`] (more than one permit per µs),
    /// [`ConfigError::Overflow`] (a window above 2^51 µs),
    /// [`ConfigError::LogTooLong`] (more than [`MAX_LOG_LIMIT`]).
    ///
    /// ```
    /// use tollgate::{ConfigError, Rate};
    /// use tollgate_redis::SlidingLog;
    /// use tollgate_redis::sliding_log::MAX_LOG_LIMIT;
    /// assert!(SlidingLog::new("search", Rate::per_second(100)).is_ok());
    /// assert_eq!(
    ///     SlidingLog::new("search", Rate::per_hour(2_000_000)),
    ///     Err(ConfigError::LogTooLong { limit: 2_000_000, max: MAX_LOG_LIMIT })
    /// );
    /// assert_eq!(
    ///     SlidingLog::new(&"n".repeat(129), Rate::per_second(1)),
    ///     Err(ConfigError::InvalidName)
    /// );
    /// ```
    pub fn new(name: &str, rate: Rate) -> Result<Self, ConfigError> {
        let name = check_name(name)?;
        let (limit, window) = validate(rate)?;
        if limit > MAX_LOG_LIMIT {
            return Err(ConfigError::LogTooLong {
                limit,
                max: MAX_LOG_LIMIT,
            });
        }
        Ok(SlidingLog {
            limit,
            window,
            history: window,
            prefix: DEFAULT_PREFIX.to_owned(),
            name,
        })
    }

    /// Keeps entries for `history` (at least the window): a later rule on the
    /// same keys may then use any window up to `history` and still see every
    /// permit in it. With the default (one window), a longer window sees only
    /// the permits of the last old window.
    ///
    /// Errors: [`ConfigError::Overflow`] (above 2^51 µs).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::Rate;
    /// let log = tollgate_redis::SlidingLog::new("partner", Rate::per_minute(30))
    ///     .unwrap()
    ///     .with_history(Duration::from_secs(3600))
    ///     .unwrap();
    /// assert_eq!(log.history(), Duration::from_secs(3600));
    /// ```
    pub fn with_history(mut self, history: Duration) -> Result<Self, ConfigError> {
        let history = span(history, "the history")?;
        self.history = history.max(self.window);
        Ok(self)
    }

    /// The same log under another key prefix (default `tollgate`): the
    /// namespace of an application that shares its Redis with others. Its
    /// limiters keep apart by their names.
    ///
    /// Errors: [`ConfigError::InvalidPrefix`] (a prefix with `{` or `}`).
    ///
    /// ```
    /// use tollgate::Rate;
    /// use tollgate_redis::{Limiter, SlidingLog};
    /// let log = SlidingLog::new("login", Rate::per_minute(5)).unwrap();
    /// let log = log.with_prefix("shop").unwrap();
    /// assert_eq!(log.redis_key("alice"), "shop:login:{alice}:sl");
    /// ```
    pub fn with_prefix(mut self, prefix: &str) -> Result<Self, ConfigError> {
        self.prefix = check_prefix(prefix)?;
        Ok(self)
    }

    /// The window's length.
    ///
    /// ```
    /// use tollgate::Rate;
    /// let log = tollgate_redis::SlidingLog::new("api", Rate::per_second(10)).unwrap();
    /// assert_eq!(log.window().as_secs(), 1);
    /// ```
    pub fn window(&self) -> Duration {
        Duration::from_micros(self.window)
    }

    /// How long entries are kept.
    ///
    /// ```
    /// use tollgate::Rate;
    /// let log = tollgate_redis::SlidingLog::new("api", Rate::per_second(10)).unwrap();
    /// assert_eq!(log.history().as_secs(), 1);
    /// ```
    pub fn history(&self) -> Duration {
        Duration::from_micros(self.history)
    }
}

impl Limiter for SlidingLog {
    fn capacity(&self) -> u32 {
        self.limit
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn redis_key(&self, key: &str) -> String {
        redis_key(&self.prefix, &self.name, key, "sl")
    }

    /// Whole again when the admission's own entries leave the window: one
    /// window after its stamp.
    fn report(&self, admission: &Admission) -> tollgate::Snapshot {
        tollgate::Snapshot::new(
            admission.remaining,
            self.limit,
            Duration::from_micros(self.window),
        )
    }

    fn plan(&self) -> Plan {
        Plan::new(
            Kind::SlidingLog,
            &[self.window, u64::from(self.limit), self.history],
        )
    }
}
