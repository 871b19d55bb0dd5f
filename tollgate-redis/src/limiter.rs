//! What every Redis limiter shares: the trait the clients call through.

use crate::script::Admission;

/// A limiter whose state lives in Redis: a configuration (validated once, at
/// construction) plus the Lua script that decides.
///
/// Limiters hold no connection: ask a [`Client`](crate::Client) (async) or a
/// [`blocking::Client`](crate::blocking::Client) to decide with one. The same
/// limiter may be used with any number of clients, and any number of processes
/// that build it with the same name, prefix and configuration share one limit
/// per key. Limiters with different names never share state: each name is a
/// limit of its own, whatever keys its callers give.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use tollgate::Rate;
/// use tollgate_redis::{Ask, Client, FixedWindow, TokenBucket};
///
/// let client = Client::connect("redis://127.0.0.1:6379/").await?;
/// let per_second = TokenBucket::new("per-second", 20, Rate::per_second(10))?;
/// let day = std::time::Duration::from_secs(86_400);
/// let per_day = FixedWindow::new("per-day", Rate::new(10_000, day))?;
/// // Both must admit, in one call: refused by either, charged on neither.
/// let both = [Ask::new(&per_second, "tenant:7"), Ask::new(&per_day, "tenant:7")];
/// client.try_acquire_all(&both).await?;
/// # Ok(()) }
/// ```
pub trait Limiter: Send + Sync {
    /// The most permits one request can be granted; a larger request is
    /// [`Denied::ExceedsCapacity`](tollgate::Denied::ExceedsCapacity) without
    /// a round trip.
    fn capacity(&self) -> u32;

    /// The limiter's name, as given to its constructor: what sets its state
    /// apart from every other limiter's.
    ///
    /// ```
    /// use tollgate::Rate;
    /// use tollgate_redis::{Limiter, TokenBucket};
    /// let bucket = TokenBucket::new("login", 1, Rate::per_second(1)).unwrap();
    /// assert_eq!(bucket.name(), "login");
    /// ```
    fn name(&self) -> &str;

    /// The Redis key that holds the state of the caller's `key`:
    /// `<prefix>:<name>:{<key>}:<kind>`, the caller's key in the Redis
    /// Cluster hash tag and the limiter's prefix and name before it.
    ///
    /// ```
    /// use tollgate::Rate;
    /// use tollgate_redis::{Limiter, TokenBucket};
    /// let bucket = TokenBucket::new("login", 1, Rate::per_second(1)).unwrap();
    /// assert_eq!(bucket.redis_key("user:42"), "tollgate:login:{user:42}:tb");
    /// ```
    fn redis_key(&self, key: &str) -> String;

    /// The quota `admission` left, as a [`Snapshot`](tollgate::Snapshot)
    /// (what a `RateLimit` header needs): the permits remaining, the
    /// capacity, and the time until the quota is whole again if nothing else
    /// is admitted — exact for the fixed window and the sliding log, for the
    /// token bucket rounded up to whole permits, for the sliding window
    /// counter at most its two windows. Never shorter than the truth, so a
    /// client that waits it out finds the quota whole.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::Rate;
    /// use tollgate_redis::{Admission, FixedWindow, Limiter};
    ///
    /// let window = FixedWindow::new("api", Rate::per_second(10)).unwrap();
    /// let report = window.report(&Admission::new(2_300_000, 7)); // 2.3 s
    /// assert_eq!((report.available, report.capacity), (7, 10));
    /// assert_eq!(report.until_full, Duration::from_millis(700));
    /// ```
    fn report(&self, admission: &Admission) -> tollgate::Snapshot;

    /// The script and its arguments after `n`: the crate's own business.
    #[doc(hidden)]
    fn plan(&self) -> Plan;
}

/// A decision's kind and configuration terms, as the decision script takes
/// them.
#[doc(hidden)]
#[derive(Clone, Copy)]
pub struct Plan {
    pub(crate) kind: Kind,
    pub(crate) terms: [u64; 3],
}

/// The kinds the decision script knows, by the number it takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    TokenBucket = 1,
    FixedWindow = 2,
    SlidingWindow = 3,
    SlidingLog = 4,
}

impl Plan {
    pub(crate) fn new(kind: Kind, terms: &[u64]) -> Plan {
        let mut packed = [0; 3];
        packed[..terms.len()].copy_from_slice(terms);
        Plan {
            kind,
            terms: packed,
        }
    }

    /// The script's six arguments for `n` permits: kind, n, the terms, and
    /// whether the decision ends its group.
    pub(crate) fn arguments(&self, n: u32, ends_group: bool) -> [u64; 6] {
        [
            self.kind as u64,
            u64::from(n),
            self.terms[0],
            self.terms[1],
            self.terms[2],
            u64::from(ends_group),
        ]
    }
}
