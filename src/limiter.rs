//! The trait every limiter implements.

use std::fmt;
use std::time::Duration;

use crate::error::Denied;

/// A rate limiter: ask for permits, get a plain yes or a [`Denied`] that says why
/// and, when waiting helps, for how long.
///
/// Every tollgate limiter implements it — the lock-free ones and their locking
/// twins alike — so code can be written once against `&dyn RateLimiter` or a
/// generic `L: RateLimiter`.
///
/// ```
/// use std::time::Duration;
/// use tollgate::{Denied, FixedWindow, ManualClock, Rate, RateLimiter, TokenBucket};
///
/// fn serve(limiter: &dyn RateLimiter) -> &'static str {
///     match limiter.try_acquire() {
///         Ok(()) => "200 OK",
///         Err(Denied::RetryAfter(_)) => "429 Too Many Requests",
///         Err(_) => "400 Bad Request",
///     }
/// }
///
/// let clock = ManualClock::new();
/// let bucket = TokenBucket::with_clock(1, Rate::per_second(1), clock.clone()).unwrap();
/// let window = FixedWindow::with_clock(Rate::per_second(1), clock.clone()).unwrap();
/// for limiter in [&bucket as &dyn RateLimiter, &window] {
///     assert_eq!(serve(limiter), "200 OK");
///     assert_eq!(serve(limiter), "429 Too Many Requests");
/// }
/// ```
pub trait RateLimiter {
    /// Asks for one permit.
    ///
    /// ```
    /// use tollgate::{Rate, RateLimiter, TokenBucket};
    /// let bucket = TokenBucket::new(1, Rate::per_hour(1)).unwrap();
    /// assert!(bucket.try_acquire().is_ok());
    /// assert!(bucket.try_acquire().is_err());
    /// ```
    #[inline]
    fn try_acquire(&self) -> Result<(), Denied> {
        self.try_acquire_n(1)
    }

    /// Asks for `n` permits at once: all of them are granted, or none.
    ///
    /// Errors: [`Denied::RetryAfter`] when the permits are not available yet,
    /// [`Denied::ExceedsCapacity`] when `n` is more than the limiter can ever grant
    /// at once, [`Denied::ZeroPermits`] when `n` is zero. A denial changes nothing.
    ///
    /// ```
    /// use tollgate::{Denied, Rate, RateLimiter, TokenBucket};
    /// let bucket = TokenBucket::new(10, Rate::per_hour(10)).unwrap();
    /// assert!(bucket.try_acquire_n(7).is_ok());
    /// assert!(matches!(bucket.try_acquire_n(7), Err(Denied::RetryAfter(_))));
    /// assert_eq!(bucket.try_acquire_n(0), Err(Denied::ZeroPermits));
    /// ```
    fn try_acquire_n(&self, n: u32) -> Result<(), Denied>;

    /// Reads the limiter's state without consuming anything.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{ManualClock, Rate, RateLimiter, TokenBucket};
    /// let clock = ManualClock::new();
    /// let bucket = TokenBucket::with_clock(10, Rate::per_second(10), clock).unwrap();
    /// bucket.try_acquire_n(4).unwrap();
    /// let snap = bucket.snapshot();
    /// assert_eq!((snap.available, snap.capacity), (6, 10));
    /// assert_eq!(snap.until_full, Duration::from_millis(400));
    /// ```
    fn snapshot(&self) -> Snapshot;

    /// Asks for one permit and reports the state the decision left: what a
    /// `RateLimit` header needs. See
    /// [`try_acquire_n_with_snapshot`](RateLimiter::try_acquire_n_with_snapshot).
    ///
    /// ```
    /// use tollgate::{Rate, RateLimiter, TokenBucket};
    /// let bucket = TokenBucket::new(3, Rate::per_hour(3)).unwrap();
    /// assert_eq!(bucket.try_acquire_with_snapshot().unwrap().available, 2);
    /// ```
    #[inline]
    fn try_acquire_with_snapshot(&self) -> Result<Snapshot, Rejection> {
        self.try_acquire_n_with_snapshot(1)
    }

    /// Asks for `n` permits, as [`try_acquire_n`](RateLimiter::try_acquire_n)
    /// does, and returns with the decision the limiter's state after it: on
    /// admission, the permits still available and the time until full; on
    /// denial, the same beside the [`Denied`] reason (in a [`Rejection`]).
    ///
    /// The report comes from the decision itself, not from a second read that
    /// other threads could slip in front of: the one-word and 128-bit limiters
    /// ([`TokenBucket`](crate::TokenBucket), [`FixedWindow`](crate::FixedWindow),
    /// [`LeakyBucket`](crate::LeakyBucket), [`Shaper`](crate::Shaper),
    /// [`WarmUp`](crate::WarmUp)) and
    /// [`ApproxSlidingWindow`](crate::ApproxSlidingWindow) compute it from the
    /// very word their compare-and-swap wrote (or the word a denial was decided
    /// on), and every locking twin under the same lock as the decision. The
    /// [`SlidingWindow`](crate::SlidingWindow) and
    /// [`SlidingLog`](crate::SlidingLog), whose state is spread over stripes
    /// and ring slots by design, read it right after the decision at the
    /// decision's own clock reading; a concurrent admission in between can make
    /// `available` lower than it was at the decision, never higher than the
    /// limiter allows. Both report the same figures as the locking twins when
    /// nothing runs concurrently. Costs: docs/benchmarks.md ("Decisions that
    /// report their quota").
    ///
    /// `try_acquire_n` stays the cheapest call: it computes no report.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Denied, ManualClock, Rate, RateLimiter, TokenBucket};
    ///
    /// let clock = ManualClock::new();
    /// let bucket = TokenBucket::with_clock(10, Rate::per_second(10), clock.clone()).unwrap();
    /// let admitted = bucket.try_acquire_n_with_snapshot(4).unwrap();
    /// assert_eq!((admitted.available, admitted.capacity), (6, 10));
    /// assert_eq!(admitted.until_full, Duration::from_millis(400));
    ///
    /// let denied = bucket.try_acquire_n_with_snapshot(7).unwrap_err();
    /// assert_eq!(denied.denied, Denied::RetryAfter(Duration::from_millis(100)));
    /// assert_eq!(denied.snapshot.available, 6);
    /// ```
    fn try_acquire_n_with_snapshot(&self, n: u32) -> Result<Snapshot, Rejection>;

    /// Asks for `n` permits as
    /// [`try_acquire_n_with_snapshot`](RateLimiter::try_acquire_n_with_snapshot)
    /// does, hands the answer to `keep`, and — when it was an admission and
    /// `keep` returns `false` — gives the permits back as far as that is safe.
    /// Returns whether the permits stand: admitted and kept.
    ///
    /// This is how something that asks several limiters in turn (an HTTP
    /// layer's policies, say) makes a request refused by a later one cost
    /// nothing here: `keep` asks the others and says whether they all
    /// admitted. A [`Refundable`](crate::Refundable) limiter (the token
    /// buckets, fixed windows, leaky buckets, their twins, a key of a
    /// [`Keyed`](crate::keyed::Keyed) limiter) refunds by its own rule — exact unless
    /// another request was admitted in between, never more than "as if it had
    /// not happened" ([`refund`](crate::Refundable)); any other limiter keeps the
    /// permits (the default), so put those last. Nothing is held while
    /// `keep` runs but the decision's receipt on this call's stack.
    ///
    /// ```
    /// use tollgate::{ManualClock, Rate, RateLimiter, SlidingLog, TokenBucket};
    ///
    /// let clock = ManualClock::new();
    /// let bucket = TokenBucket::with_clock(5, Rate::per_hour(5), clock.clone()).unwrap();
    /// let log = SlidingLog::with_clock(Rate::per_hour(1), clock).unwrap();
    /// // Both must admit: the bucket's admission stands only if the log admits.
    /// let both = |n| bucket.try_acquire_n_then(n, &mut |answer| answer.is_ok() && log.try_acquire_n(n).is_ok());
    /// assert!(both(1));
    /// assert!(!both(1)); // the log refuses: the bucket gets its permit back
    /// assert_eq!(bucket.snapshot().available, 4);
    /// ```
    fn try_acquire_n_then(&self, n: u32, keep: Keep<'_>) -> bool {
        let decided = self.try_acquire_n_with_snapshot(n);
        let admitted = decided.is_ok();
        keep(decided) && admitted
    }
}

/// The caller's say on a decision in
/// [`RateLimiter::try_acquire_n_then`]: handed the decision (the admission's
/// snapshot, or the rejection), it returns whether an admission stands;
/// `false` gives its permits back where the limiter can.
pub type Keep<'k> = &'k mut dyn FnMut(Result<Snapshot, Rejection>) -> bool;

/// A reference decides as the limiter it points to, so a limiter can be
/// shared by reference, e.g. as a member of an [`AllOf`](crate::AllOf).
impl<L: RateLimiter + ?Sized> RateLimiter for &L {
    #[inline]
    fn try_acquire_n(&self, n: u32) -> Result<(), Denied> {
        (**self).try_acquire_n(n)
    }

    fn snapshot(&self) -> Snapshot {
        (**self).snapshot()
    }

    #[inline]
    fn try_acquire_n_with_snapshot(&self, n: u32) -> Result<Snapshot, Rejection> {
        (**self).try_acquire_n_with_snapshot(n)
    }

    #[inline]
    fn try_acquire_n_then(&self, n: u32, keep: Keep<'_>) -> bool {
        (**self).try_acquire_n_then(n, keep)
    }
}

/// A denial together with the limiter's state it was decided on: what a `429`
/// response needs for its `Retry-After` and `RateLimit` headers. Returned by
/// [`RateLimiter::try_acquire_n_with_snapshot`]; converts into the plain
/// [`Denied`] with `?` or `.into()`.
///
/// ```
/// use tollgate::{Denied, Rate, RateLimiter, Rejection, TokenBucket};
///
/// fn admit(limiter: &dyn RateLimiter) -> Result<u32, Denied> {
///     let snap = limiter.try_acquire_with_snapshot()?; // Rejection -> Denied
///     Ok(snap.available)
/// }
/// let bucket = TokenBucket::new(1, Rate::per_hour(1)).unwrap();
/// assert_eq!(admit(&bucket), Ok(0));
/// assert!(matches!(admit(&bucket), Err(Denied::RetryAfter(_))));
/// let rejection: Rejection = bucket.try_acquire_with_snapshot().unwrap_err();
/// assert_eq!(rejection.snapshot.available, 0);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Rejection {
    /// Why the request was denied.
    pub denied: Denied,
    /// The limiter's state the denial was decided on.
    pub snapshot: Snapshot,
}

impl Rejection {
    /// A denial beside the state it was decided on, for limiters written
    /// outside this crate.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Denied, Rate, RateLimiter, Rejection, TokenBucket};
    /// let snapshot = TokenBucket::new(1, Rate::per_hour(1)).unwrap().snapshot();
    /// let rejection = Rejection::new(Denied::RetryAfter(Duration::from_secs(1)), snapshot);
    /// assert_eq!(rejection.snapshot.capacity, 1);
    /// ```
    pub fn new(denied: Denied, snapshot: Snapshot) -> Self {
        Rejection { denied, snapshot }
    }
}

impl From<Rejection> for Denied {
    fn from(rejection: Rejection) -> Denied {
        rejection.denied
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ({} of {} permits available)",
            self.denied, self.snapshot.available, self.snapshot.capacity
        )
    }
}

impl std::error::Error for Rejection {}

/// Runs a decision loop's `decide` and remembers the state it last saw: the
/// state it wrote if it admitted, the one it denied on otherwise. A cell's
/// update keeps the result of its last call, so after the loop this is the
/// state the decision actually stored or refused on.
#[inline]
pub(crate) fn remembering<T: Copy>(
    seen: &mut T,
    mut decide: impl FnMut(T) -> Result<T, Denied>,
) -> impl FnMut(T) -> Result<T, Denied> {
    move |state| {
        let decided = decide(state);
        *seen = *decided.as_ref().unwrap_or(&state);
        decided
    }
}

/// The report of a decision: the snapshot of the state it left, beside its
/// answer (whatever an admission returned, such as the word a cell stored, is
/// not needed: the snapshot says it).
#[inline]
pub(crate) fn report<T>(
    outcome: Result<T, Denied>,
    snapshot: Snapshot,
) -> Result<Snapshot, Rejection> {
    match outcome {
        Ok(_) => Ok(snapshot),
        Err(denied) => Err(Rejection::new(denied, snapshot)),
    }
}

/// A non-consuming read of a limiter: what a request could get right now.
///
/// ```
/// use tollgate::{Rate, RateLimiter, TokenBucket};
/// let snap = TokenBucket::new(5, Rate::per_second(5)).unwrap().snapshot();
/// assert_eq!(snap.available, 5);
/// assert!(snap.until_full.is_zero());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Snapshot {
    /// Permits a request could be granted now.
    pub available: u32,
    /// The most permits the limiter can hold (burst capacity, or limit per window).
    pub capacity: u32,
    /// Time until `available == capacity` if nothing else is admitted.
    pub until_full: Duration,
}

impl Snapshot {
    /// A snapshot with these figures, for limiters written outside this crate
    /// (the fields are public to read; the type is `#[non_exhaustive]` so that
    /// it can grow).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::Snapshot;
    /// let snap = Snapshot::new(3, 10, Duration::from_millis(700));
    /// assert_eq!((snap.available, snap.capacity), (3, 10));
    /// assert_eq!(snap.until_full, Duration::from_millis(700));
    /// ```
    pub fn new(available: u32, capacity: u32, until_full: Duration) -> Self {
        Snapshot {
            available,
            capacity,
            until_full,
        }
    }

    pub(crate) fn from_ns(available: u32, capacity: u32, until_full_ns: u64) -> Self {
        Snapshot {
            available,
            capacity,
            until_full: Duration::from_nanos(until_full_ns),
        }
    }

    /// Whether this limit binds before `other`: fewer permits available, or
    /// as few and longer until full. The one rule by which everything that
    /// holds several limits — [`AllOf`](crate::AllOf), a keyed pair, a
    /// sliding log with several rules — picks the limit it reports: the one a
    /// client meets first, with its own figures (never a mix of two limits'
    /// fields, which would describe no limit). On a tie the earlier is kept.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::Snapshot;
    /// let fewer = Snapshot::new(2, 10, Duration::from_secs(1));
    /// let longer = Snapshot::new(3, 10, Duration::from_secs(9));
    /// assert!(fewer.binds_before(&longer));
    /// assert!(!fewer.binds_before(&fewer)); // a tie: the earlier is kept
    /// ```
    #[inline]
    pub fn binds_before(&self, other: &Snapshot) -> bool {
        (self.available, std::cmp::Reverse(self.until_full))
            < (other.available, std::cmp::Reverse(other.until_full))
    }

    /// The one of two limits' snapshots that binds first (`self` on a tie):
    /// see [`binds_before`](Snapshot::binds_before).
    #[inline]
    pub(crate) fn tightest(self, later: Snapshot) -> Snapshot {
        if later.binds_before(&self) {
            later
        } else {
            self
        }
    }
}

/// Checks a request for `n` permits against the capacity: the part of every
/// decision that does not depend on state, which every limiter of this crate
/// makes first. [`Denied::ZeroPermits`] for `n = 0`,
/// [`Denied::ExceedsCapacity`] for `n` above `capacity`, `Ok` otherwise. For
/// limiters written outside this crate (tollgate-redis's), so that they deny
/// the same requests in the same way.
///
/// ```
/// use tollgate::{Denied, check_request};
///
/// assert_eq!(check_request(3, 5), Ok(()));
/// assert_eq!(check_request(0, 5), Err(Denied::ZeroPermits));
/// assert_eq!(check_request(6, 5), Err(Denied::ExceedsCapacity { requested: 6, capacity: 5 }));
/// ```
#[inline]
pub fn check_request(n: u32, capacity: u32) -> Result<(), Denied> {
    if n == 0 {
        Err(Denied::ZeroPermits)
    } else if n > capacity {
        Err(Denied::ExceedsCapacity {
            requested: n,
            capacity,
        })
    } else {
        Ok(())
    }
}
