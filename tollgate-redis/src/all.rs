//! Several limits of one request, decided all-or-nothing in one script call.

use std::collections::HashSet;
use std::fmt;
use std::time::Duration;

use tollgate::{Denied, Snapshot};

use crate::client::Client;
use crate::error::Error;
use crate::limiter::Limiter;
use crate::script::{Admission, Reply, reply};

/// One limit of an all-or-nothing request: a limiter, the caller's key and
/// the permits asked (1 unless [`Ask::n`] says otherwise).
///
/// ```
/// use tollgate::Rate;
/// use tollgate_redis::{Ask, TokenBucket};
/// let bucket = TokenBucket::new("tenant", 10, Rate::per_second(10)).unwrap();
/// let ask = Ask::new(&bucket, "tenant:7").n(3);
/// assert_eq!(ask.permits(), 3);
/// ```
#[derive(Clone, Copy)]
pub struct Ask<'a> {
    limiter: &'a dyn Limiter,
    key: &'a str,
    n: u32,
}

impl<'a> Ask<'a> {
    /// One permit of `limiter` for the caller's `key`.
    ///
    /// ```
    /// use tollgate::Rate;
    /// let window = tollgate_redis::FixedWindow::new("per-ip", Rate::per_minute(60)).unwrap();
    /// let ask = tollgate_redis::Ask::new(&window, "203.0.113.9");
    /// assert_eq!(ask.permits(), 1);
    /// ```
    pub fn new(limiter: &'a dyn Limiter, key: &'a str) -> Self {
        Ask { limiter, key, n: 1 }
    }

    /// The same limit, asking `n` permits.
    ///
    /// ```
    /// use tollgate::Rate;
    /// let window = tollgate_redis::FixedWindow::new("per-ip", Rate::per_minute(60)).unwrap();
    /// assert_eq!(tollgate_redis::Ask::new(&window, "k").n(5).permits(), 5);
    /// ```
    pub fn n(mut self, n: u32) -> Self {
        self.n = n;
        self
    }

    /// The permits asked.
    ///
    /// ```
    /// use tollgate::Rate;
    /// let window = tollgate_redis::FixedWindow::new("per-ip", Rate::per_minute(60)).unwrap();
    /// assert_eq!(tollgate_redis::Ask::new(&window, "k").permits(), 1);
    /// ```
    pub fn permits(&self) -> u32 {
        self.n
    }
}

impl fmt::Debug for Ask<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ask")
            .field("redis_key", &self.limiter.redis_key(self.key))
            .field("n", &self.n)
            .finish()
    }
}

/// Every limit of an all-or-nothing request admitted it: each one's
/// [`Admission`], in the order asked, and the report of the tightest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admitted {
    admissions: Vec<Admission>,
    reports: Vec<Snapshot>,
}

impl Admitted {
    /// Each limit's admission, in the order the limits were asked.
    ///
    /// ```no_run
    /// # async fn demo(client: tollgate_redis::Client, a: tollgate_redis::TokenBucket) -> Result<(), tollgate_redis::Error> {
    /// use tollgate_redis::Ask;
    /// let admitted = client.try_acquire_all(&[Ask::new(&a, "k")]).await?;
    /// println!("{} left", admitted.admissions()[0].remaining);
    /// # Ok(()) }
    /// ```
    pub fn admissions(&self) -> &[Admission] {
        &self.admissions
    }

    /// Each limit's report of its admission ([`Limiter::report`]), in order.
    ///
    /// ```no_run
    /// # async fn demo(client: tollgate_redis::Client, a: tollgate_redis::TokenBucket) -> Result<(), tollgate_redis::Error> {
    /// let admitted = client.try_acquire_all(&[tollgate_redis::Ask::new(&a, "k")]).await?;
    /// assert_eq!(admitted.reports().len(), 1);
    /// # Ok(()) }
    /// ```
    pub fn reports(&self) -> &[Snapshot] {
        &self.reports
    }

    /// The limit with the least left, as tollgate's `AllOf` picks it (the
    /// fewest permits available; ties: the longer time until full, then the
    /// earlier limit), and its report: what `RateLimit` headers need. `None`
    /// for a request of no limits.
    ///
    /// ```no_run
    /// # async fn demo(client: tollgate_redis::Client, a: tollgate_redis::TokenBucket, b: tollgate_redis::SlidingLog) -> Result<(), tollgate_redis::Error> {
    /// use tollgate_redis::Ask;
    /// let admitted = client.try_acquire_all(&[Ask::new(&a, "k"), Ask::new(&b, "k")]).await?;
    /// if let Some((member, report)) = admitted.tightest() {
    ///     println!("limit {member}: {} of {} left", report.available, report.capacity);
    /// }
    /// # Ok(()) }
    /// ```
    pub fn tightest(&self) -> Option<(usize, Snapshot)> {
        let mut best: Option<(usize, Snapshot)> = None;
        for (member, report) in self.reports.iter().enumerate() {
            if best.is_none_or(|(_, kept)| report.binds_before(&kept)) {
                best = Some((member, *report));
            }
        }
        best
    }
}

/// An all-or-nothing request that was not admitted, and no limit was
/// charged for it (unless [`Error::may_have_run`] says the call may have
/// run): the [`Error`], and the limit it concerns when it concerns one.
///
/// A denial is the one with the longest wait, so its
/// [`Denied::RetryAfter`] is when every limit that refused would admit (if
/// nothing else is admitted meanwhile); a limit that can never grant its
/// permits is that limit's [`Denied::ExceedsCapacity`], decided before any
/// call. `?` turns it into the [`Error`].
///
/// ```
/// use std::time::Duration;
/// use tollgate::Denied;
/// use tollgate_redis::{Error, Refused};
/// let refused = Refused::new(Some(1), Error::Denied(Denied::RetryAfter(Duration::from_secs(2))));
/// assert_eq!(refused.member, Some(1));
/// assert_eq!(Error::from(refused).retry_after(), Some(Duration::from_secs(2)));
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Refused {
    /// The limit (its place in the request) that refused, or whose key was
    /// damaged; `None` for an error of the whole call (a timeout, a lost
    /// connection, an invalid call).
    pub member: Option<usize>,
    /// Why.
    pub error: Error,
    /// For a [`Denied::RetryAfter`], that limit's state as the script found
    /// it ([`Limiter::report`] of the permits free then): what `RateLimit`
    /// fields need; `None` otherwise.
    pub report: Option<Snapshot>,
    /// For a request the script refused, every limit's state as the script
    /// found it, in the order asked, none of them charged: a limit that
    /// would have admitted reports the permits it holds still, one that
    /// refused the permits it had free. Empty when the script did not
    /// decide (an error, or a refusal decided before any call).
    pub found: Vec<Snapshot>,
}

impl Refused {
    /// A refusal of `member` (or of the whole call) for `error`.
    ///
    /// ```
    /// let refused = tollgate_redis::Refused::new(None, tollgate_redis::Error::Unavailable);
    /// assert_eq!(refused.member, None);
    /// ```
    pub fn new(member: Option<usize>, error: Error) -> Self {
        Refused {
            member,
            error,
            report: None,
            found: Vec::new(),
        }
    }
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.member {
            Some(member) => write!(f, "limit {member}: {}", self.error),
            None => self.error.fmt(f),
        }
    }
}

impl std::error::Error for Refused {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl From<Refused> for Error {
    fn from(refused: Refused) -> Error {
        refused.error
    }
}

impl Client {
    /// Asks several limits for one request, all or nothing, in one script
    /// call: admitted only if every limit admits, and then charged on every
    /// one; refused anywhere, charged nowhere. Any mix of kinds, limiters
    /// and keys; the order does not change the decision.
    ///
    /// The limits are decided at one server time, atomically: no other
    /// decision runs between them. Errors ([`Refused`]):
    /// [`Denied::ExceedsCapacity`] or [`Denied::ZeroPermits`] for a limit
    /// that can never grant its permits (no call made); the longest
    /// [`Denied::RetryAfter`] of the limits that refused; a key of a limit
    /// that holds another type or damaged state ([`Error::WrongType`],
    /// [`Error::UnknownState`], nothing charged); [`Error::InvalidCall`] when
    /// two limits name the same Redis key, or on a Cluster when the keys lie
    /// in different slots (give them one hash tag: the caller's key of every
    /// limiter is one already); or the call's own failure.
    ///
    /// ```no_run
    /// # async fn demo(client: tollgate_redis::Client) -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use tollgate::Rate;
    /// use tollgate_redis::{Ask, FixedWindow, TokenBucket};
    ///
    /// let per_second = TokenBucket::new("per-second", 20, Rate::per_second(10))?;
    /// let per_day = FixedWindow::new("per-day", Rate::new(10_000, Duration::from_secs(86_400)))?;
    /// let admitted = client
    ///     .try_acquire_all(&[Ask::new(&per_second, "tenant:7"), Ask::new(&per_day, "tenant:7")])
    ///     .await?;
    /// println!("{:?}", admitted.tightest());
    /// # Ok(()) }
    /// ```
    pub async fn try_acquire_all(&self, asks: &[Ask<'_>]) -> Result<Admitted, Refused> {
        self.decide_all(asks, None).await
    }

    /// A request's decision, counted in the metrics.
    async fn decide_all(&self, asks: &[Ask<'_>], now_us: Option<u64>) -> Result<Admitted, Refused> {
        let result = self.decide_all_uncounted(asks, now_us).await;
        crate::metrics::request(true, &result.as_ref().map_err(|refused| &refused.error));
        result
    }

    /// As [`Client::try_acquire_all`] at a time the caller gives, in µs
    /// since the Unix epoch, instead of the server's `TIME`. Only under the
    /// `test-time` feature.
    #[cfg(feature = "test-time")]
    pub async fn try_acquire_all_at(
        &self,
        asks: &[Ask<'_>],
        now_us: u64,
    ) -> Result<Admitted, Refused> {
        self.decide_all(asks, Some(now_us)).await
    }

    async fn decide_all_uncounted(
        &self,
        asks: &[Ask<'_>],
        now_us: Option<u64>,
    ) -> Result<Admitted, Refused> {
        if asks.is_empty() {
            return Ok(Admitted {
                admissions: Vec::new(),
                reports: Vec::new(),
            });
        }
        let mut decisions = Vec::with_capacity(asks.len());
        let mut seen = HashSet::with_capacity(asks.len());
        for (member, ask) in asks.iter().enumerate() {
            tollgate::check_request(ask.n, ask.limiter.capacity())
                .map_err(|denied| Refused::new(Some(member), Error::Denied(denied)))?;
            let key = ask.limiter.redis_key(ask.key);
            if !seen.insert(key.clone()) {
                return Err(Refused::new(
                    Some(member),
                    Error::InvalidCall(format!(
                        "two limits of one request name the Redis key {key:?}: give the \
                         limiters different names, or ask one of them for the sum"
                    )),
                ));
            }
            let last = member + 1 == asks.len();
            decisions.push((key, ask.limiter.plan().arguments(ask.n, last)));
        }
        let keys: Vec<String> = decisions.iter().map(|(key, _)| key.clone()).collect();
        let replies = self
            .submit(decisions, now_us)
            .await
            .map_err(|err| Refused::new(None, err))?;
        let mut admissions = Vec::with_capacity(asks.len());
        // Each member's state as found, uncharged: what a refusal reports.
        let mut found = Vec::with_capacity(asks.len());
        let mut longest: Option<(usize, Duration)> = None;
        for (member, (value, key)) in replies.into_iter().zip(&keys).enumerate() {
            let limiter = asks[member].limiter;
            match reply(value, key).map_err(|err| Refused::new(Some(member), err))? {
                Reply::Done { time_us, count, .. } => {
                    let remaining = u32::try_from(count).unwrap_or(u32::MAX);
                    let before = remaining.saturating_add(asks[member].n);
                    found.push(limiter.report(&Admission::new(time_us, before)));
                    admissions.push(Admission { time_us, remaining });
                }
                Reply::Refused {
                    wait_us,
                    time_us,
                    free,
                } => {
                    let free = u32::try_from(free).unwrap_or(u32::MAX);
                    found.push(limiter.report(&Admission::new(time_us, free)));
                    let wait = Duration::from_micros(wait_us);
                    if longest.is_none_or(|(_, kept)| wait > kept) {
                        longest = Some((member, wait));
                    }
                }
            }
        }
        if let Some((member, wait)) = longest {
            return Err(Refused {
                member: Some(member),
                error: Error::Denied(Denied::RetryAfter(wait)),
                report: Some(found[member]),
                found,
            });
        }
        let reports = asks
            .iter()
            .zip(&admissions)
            .map(|(ask, admission)| ask.limiter.report(admission))
            .collect();
        Ok(Admitted {
            admissions,
            reports,
        })
    }
}
