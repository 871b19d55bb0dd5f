//! All-or-nothing across limiters: a request passes only if every member
//! admits it, and the members that admitted a request a later member denied
//! get their permits back.
//!
//! The user-facing documentation (promise, state, proof) is on [`AllOf`].

use crate::error::Denied;
use crate::limiter::{RateLimiter, Rejection, Snapshot};
use crate::refund::Refundable;

/// All of its members must admit a request.
///
/// ```
/// use tollgate::{AllOf, FixedWindow, Rate, RateLimiter, TokenBucket};
///
/// let per_second = TokenBucket::new(10, Rate::per_second(10)).unwrap();
/// let per_hour = FixedWindow::new(Rate::per_hour(1_000)).unwrap();
/// let both = AllOf::new((&per_second, &per_hour));
/// assert!(both.try_acquire().is_ok());
/// assert_eq!(both.snapshot().available, 9);
/// ```
///
/// All-or-nothing across limiters: a request passes only if every member
/// admits it, and the members that admitted a request a later member denied
/// get their permits back.
///
/// The members are any limiters — direct ones, a key of a
/// [`Keyed`](crate::keyed::Keyed) limiter ([`Keyed::for_key`](crate::keyed::Keyed::for_key)),
/// references to either — as a tuple: `(global, per_ip, login)`. Every member
/// but the last must be [`Refundable`]; the last may be any [`RateLimiter`],
/// so a limiter that cannot give permits back safely (a
/// [`SlidingLog`](crate::SlidingLog), a [`SlidingWindow`](crate::SlidingWindow))
/// goes last, where nothing is asked after it. An `AllOf` is itself a
/// `RateLimiter`, so it can be the last member of another.
///
/// ```
/// use std::net::IpAddr;
/// use std::time::Duration;
/// use tollgate::keyed::{BucketConfig, Keyed};
/// use tollgate::{AllOf, Denied, ManualClock, Rate, RateLimiter, SlidingLog, TokenBucket};
///
/// type Bucket = TokenBucket<ManualClock>;
/// let clock = ManualClock::new();
/// let global = Bucket::with_clock(100, Rate::per_second(100), clock.clone()).unwrap();
/// let per_ip = Keyed::<IpAddr, Bucket>::with_clock(
///     BucketConfig::new(10, Rate::per_second(10)).unwrap(), clock.clone());
/// let logins = SlidingLog::with_clock(Rate::per_minute(2), clock.clone()).unwrap();
///
/// let ip: IpAddr = "192.0.2.7".parse().unwrap();
/// let login = AllOf::new((&global, per_ip.for_key(&ip), &logins));
/// for _ in 0..2 {
///     let passed = login.try_acquire_reporting().unwrap();
///     assert_eq!(passed.member, 2); // the login log has the least left
/// }
/// // The third login is denied by the log; the buckets get their permits back.
/// let blocked = login.try_acquire_reporting().unwrap_err();
/// assert_eq!((blocked.member, blocked.rejection.denied), (2, Denied::RetryAfter(Duration::from_secs(60))));
/// assert_eq!(global.snapshot().available, 98);
/// assert_eq!(per_ip.snapshot(&ip).available, 8);
/// ```
///
/// # The exact guarantee
///
/// * **Every member's own invariant holds over the permits it keeps**, under
///   any interleaving: a refund never gives back more than "as if the
///   refunded admission had not happened" (see [`refund`](crate::Refundable)).
///   What `AllOf` admits is admitted by every member, so every limit of the
///   set holds for what passes.
/// * **A denied request keeps no permit unless it was raced**: the members
///   that admitted it are refunded right after the denial. A refund is exact
///   unless another request was admitted by the same member in between
///   (nanoseconds, unless the thread is preempted; for a fixed window, always
///   exact); a refund that is not exact leaves the permits taken until they
///   refill: under-admission, never over-admission.
/// * **Refunded permits were briefly taken**: between a member's admission
///   and its refund, a concurrent request on that member can be denied
///   although in the end nobody kept them. Under-admission again.
/// * **The last member is decided last**: it is asked only once every other
///   member has admitted, so it never needs a refund. If it denies, the others
///   are refunded.
/// * **Retry-after** is the wait of the member that denied: the members
///   before it admitted (no wait); the members after it were not asked (an
///   answer would cost them an admission and a refund), so a longer wait of
///   theirs shows when the request is retried. If any member after it can
///   never hold `n` permits, the answer is that member's
///   [`Denied::ExceedsCapacity`] instead: no
///   wait helps. (That check reads the later members' snapshots, on the deny
///   path only and only for `n > 1`: every tollgate limiter holds at least one
///   permit. A limiter of your own reporting a capacity of 0 is not checked
///   for single permits.)
/// * **The report** on admission is the member with the least `available`
///   left (ties: the longer time to full; then the earlier member) and its
///   snapshot from its own decision — what `RateLimit` headers need; on denial,
///   the denying member and its [`Rejection`].
///
/// Property tests against a sequential reference: `tests/integration/all_of.rs`; the loom
/// models of a refund racing admissions at a later clock reading, with a
/// known-bad refund the models catch: `loom-tests/tests/all_of.rs`.
#[derive(Debug, Clone, Copy)]
pub struct AllOf<T> {
    members: T,
}

impl<T: Members> AllOf<T> {
    /// A combinator over `members`, a tuple of 1 to 8 limiters of which all
    /// but the last are [`Refundable`].
    ///
    /// ```
    /// use tollgate::{AllOf, Rate, SlidingLog, TokenBucket};
    /// let bucket = TokenBucket::new(10, Rate::per_second(10)).unwrap();
    /// let log = SlidingLog::new(Rate::per_minute(5)).unwrap();
    /// let limits = AllOf::new((bucket, log)); // owning its members
    /// # let _ = limits;
    /// ```
    pub fn new(members: T) -> Self {
        AllOf { members }
    }

    /// The members, in the order they are asked.
    ///
    /// ```
    /// use tollgate::{AllOf, Rate, RateLimiter, TokenBucket};
    /// let limits = AllOf::new((TokenBucket::new(1, Rate::per_hour(1)).unwrap(),));
    /// assert_eq!(limits.members().0.snapshot().capacity, 1);
    /// ```
    pub fn members(&self) -> &T {
        &self.members
    }

    /// Asks every member for one permit; see
    /// [`try_acquire_n_reporting`](AllOf::try_acquire_n_reporting).
    ///
    /// ```
    /// use tollgate::{AllOf, Rate, TokenBucket};
    /// let a = TokenBucket::new(3, Rate::per_hour(3)).unwrap();
    /// let b = TokenBucket::new(5, Rate::per_hour(5)).unwrap();
    /// let passed = AllOf::new((&a, &b)).try_acquire_reporting().unwrap();
    /// assert_eq!((passed.member, passed.snapshot.available), (0, 2));
    /// ```
    #[inline]
    pub fn try_acquire_reporting(&self) -> Result<Tightest, Blocked> {
        self.members.decide(1)
    }

    /// Asks every member for `n` permits, in order; admits iff all admit, and
    /// refunds the members that admitted if a later one denies. Reports which
    /// member binds: on admission the one with the least left, on denial the
    /// one that denied (see [`AllOf`] for the retry-after).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{AllOf, Denied, ManualClock, Rate, RateLimiter, TokenBucket};
    ///
    /// let clock = ManualClock::new();
    /// let a = TokenBucket::with_clock(10, Rate::per_second(10), clock.clone()).unwrap();
    /// let b = TokenBucket::with_clock(4, Rate::per_second(1), clock.clone()).unwrap();
    /// let both = AllOf::new((&a, &b));
    /// let passed = both.try_acquire_n_reporting(3).unwrap();
    /// assert_eq!((passed.member, passed.snapshot.available), (1, 1));
    /// let blocked = both.try_acquire_n_reporting(2).unwrap_err();
    /// assert_eq!(blocked.member, 1);
    /// assert_eq!(blocked.rejection.denied, Denied::RetryAfter(Duration::from_secs(1)));
    /// assert_eq!(a.snapshot().available, 7); // a's two permits came back
    /// assert_eq!(both.try_acquire_n(5), Err(Denied::ExceedsCapacity { requested: 5, capacity: 4 }));
    /// ```
    #[inline]
    pub fn try_acquire_n_reporting(&self, n: u32) -> Result<Tightest, Blocked> {
        self.members.decide(n)
    }
}

impl<T: Members> RateLimiter for AllOf<T> {
    /// The same decision as
    /// [`try_acquire_n_reporting`](AllOf::try_acquire_n_reporting), without
    /// the reports: no member computes a snapshot.
    #[inline]
    fn try_acquire_n(&self, n: u32) -> Result<(), Denied> {
        self.members.decide_plain(n)
    }

    /// The tightest member's snapshot.
    fn snapshot(&self) -> Snapshot {
        self.members.tightest().snapshot
    }

    #[inline]
    fn try_acquire_n_with_snapshot(&self, n: u32) -> Result<Snapshot, Rejection> {
        self.members
            .decide(n)
            .map(|tightest| tightest.snapshot)
            .map_err(|blocked| blocked.rejection)
    }
}

/// The member of an [`AllOf`] that binds an admitted request: the one with
/// the least left after it, and its report.
///
/// ```
/// use tollgate::{AllOf, Rate, TokenBucket};
/// let a = TokenBucket::new(3, Rate::per_hour(3)).unwrap();
/// let passed = AllOf::new((&a,)).try_acquire_reporting().unwrap();
/// assert_eq!((passed.member, passed.snapshot.available, passed.snapshot.capacity), (0, 2, 3));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Tightest {
    /// The member's position in the tuple, from 0.
    pub member: usize,
    /// The member's state after its admission (for
    /// [`AllOf::snapshot`](RateLimiter::snapshot), its current state).
    pub snapshot: Snapshot,
}

/// The member of an [`AllOf`] that denied a request, and its answer.
///
/// ```
/// use tollgate::{AllOf, Denied, Rate, TokenBucket};
/// let a = TokenBucket::new(3, Rate::per_hour(3)).unwrap();
/// let blocked = AllOf::new((&a,)).try_acquire_n_reporting(4).unwrap_err();
/// assert_eq!(blocked.member, 0);
/// assert_eq!(blocked.rejection.denied, Denied::ExceedsCapacity { requested: 4, capacity: 3 });
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Blocked {
    /// The member's position in the tuple, from 0.
    pub member: usize,
    /// Its denial and the state it was decided on.
    pub rejection: Rejection,
}

impl From<Blocked> for Denied {
    fn from(blocked: Blocked) -> Denied {
        blocked.rejection.denied
    }
}

/// Tuples an [`AllOf`] can hold: 1 to 8 limiters, all but the last
/// [`Refundable`], the last any [`RateLimiter`]. Sealed: implemented for
/// those tuples only.
pub trait Members: sealed::Sealed {
    #[doc(hidden)]
    fn decide(&self, n: u32) -> Result<Tightest, Blocked>;
    #[doc(hidden)]
    fn decide_plain(&self, n: u32) -> Result<(), Denied>;
    #[doc(hidden)]
    fn tightest(&self) -> Tightest;
}

mod sealed {
    #[allow(unreachable_pub)]
    pub trait Sealed {}
}

/// Keeps the report of the member that binds first
/// ([`Snapshot::binds_before`]; on a tie the earlier member).
#[inline]
fn keep_tighter(best: &mut Option<Tightest>, member: usize, snapshot: Snapshot) {
    if best.is_none_or(|b| snapshot.binds_before(&b.snapshot)) {
        *best = Some(Tightest { member, snapshot });
    }
}

/// The answer to a denial by `member`: its own, unless it is a wait and a
/// member after it can never hold `n` permits (`later` reads their states;
/// only for `n > 1`).
#[cold]
fn blocked(
    member: usize,
    rejection: Rejection,
    n: u32,
    later: &[(usize, &dyn Fn() -> Snapshot)],
) -> Blocked {
    // Every tollgate limiter holds at least one permit: the callers answer a
    // request for one without coming here (the deny path under a flood of
    // single requests builds nothing).
    if n > 1 && matches!(rejection.denied, Denied::RetryAfter(_)) {
        for &(index, snapshot) in later {
            let snapshot = snapshot();
            if snapshot.capacity < n {
                return Blocked {
                    member: index,
                    rejection: Rejection::new(
                        Denied::ExceedsCapacity {
                            requested: n,
                            capacity: snapshot.capacity,
                        },
                        snapshot,
                    ),
                };
            }
        }
    }
    Blocked { member, rejection }
}

/// `blocked` for the plain decision: the answer's reason only.
#[cold]
fn blocked_plain(
    member: usize,
    denied: Denied,
    n: u32,
    later: &[(usize, &dyn Fn() -> Snapshot)],
) -> Denied {
    // The snapshot is only read for a request that a later member might
    // never hold (see `blocked`); a placeholder stands in otherwise.
    let placeholder = Snapshot::new(0, 0, std::time::Duration::ZERO);
    blocked(member, Rejection::new(denied, placeholder), n, later)
        .rejection
        .denied
}

/// One step of the plain decision: as `step!`, without reports.
macro_rules! step_plain {
    ($self:ident, $n:ident, [$($done:tt $rd:ident),*], [], $last:tt) => {{
        match $self.$last.try_acquire_n($n) {
            Ok(()) => Ok(()),
            Err(denied) => {
                $($self.$done.refund($rd);)*
                Err(denied)
            }
        }
    }};
    ($self:ident, $n:ident, [$($done:tt $rd:ident),*],
     [$next:tt $rn:ident $(, $rest:tt $rr:ident)*], $last:tt) => {{
        match $self.$next.try_acquire_n_receipt($n) {
            Ok($rn) => step_plain!($self, $n, [$($done $rd,)* $next $rn], [$($rest $rr),*], $last),
            Err(denied) if $n == 1 => {
                // One permit: no later member can be too small for it.
                $($self.$done.refund($rd);)*
                Err(denied)
            }
            Err(denied) => {
                $($self.$done.refund($rd);)*
                Err(blocked_plain($next, denied, $n, &[
                    $(($rest, &|| $self.$rest.snapshot()),)*
                    ($last, &|| $self.$last.snapshot()),
                ]))
            }
        }
    }};
}

/// One step of the decision: asks the next refundable member, or the last.
/// `$done` are the members already admitted (with their receipts), `$rest`
/// those still to ask before `$last`.
macro_rules! step {
    ($self:ident, $n:ident, $best:ident, [$($done:tt $rd:ident),*], [], $last:tt) => {{
        match $self.$last.try_acquire_n_with_snapshot($n) {
            Ok(snapshot) => {
                keep_tighter(&mut $best, $last, snapshot);
                // Some: the last member's report was just kept or beaten.
                Ok($best.expect("a report"))
            }
            Err(rejection) => {
                $($self.$done.refund($rd.receipt);)*
                Err(Blocked { member: $last, rejection })
            }
        }
    }};
    ($self:ident, $n:ident, $best:ident, [$($done:tt $rd:ident),*],
     [$next:tt $rn:ident $(, $rest:tt $rr:ident)*], $last:tt) => {{
        match $self.$next.try_acquire_n_refundable($n) {
            Ok($rn) => {
                keep_tighter(&mut $best, $next, $rn.snapshot);
                step!($self, $n, $best, [$($done $rd,)* $next $rn], [$($rest $rr),*], $last)
            }
            Err(rejection) if $n == 1 => {
                // One permit: no later member can be too small for it.
                $($self.$done.refund($rd.receipt);)*
                Err(Blocked { member: $next, rejection })
            }
            Err(rejection) => {
                $($self.$done.refund($rd.receipt);)*
                Err(blocked($next, rejection, $n, &[
                    $(($rest, &|| $self.$rest.snapshot()),)*
                    ($last, &|| $self.$last.snapshot()),
                ]))
            }
        }
    }};
}

macro_rules! members {
    ($([$($name:ident $index:tt $receipt:ident),*] $lname:ident $last:tt;)*) => {$(
        impl<$($name: Refundable,)* $lname: RateLimiter> sealed::Sealed for ($($name,)* $lname,) {}

        impl<$($name: Refundable,)* $lname: RateLimiter> Members for ($($name,)* $lname,) {
            #[inline]
            fn decide(&self, n: u32) -> Result<Tightest, Blocked> {
                let mut best: Option<Tightest> = None;
                let this = self;
                step!(this, n, best, [], [$($index $receipt),*], $last)
            }

            #[inline]
            fn decide_plain(&self, n: u32) -> Result<(), Denied> {
                let this = self;
                step_plain!(this, n, [], [$($index $receipt),*], $last)
            }

            fn tightest(&self) -> Tightest {
                let mut best: Option<Tightest> = None;
                $(keep_tighter(&mut best, $index, self.$index.snapshot());)*
                keep_tighter(&mut best, $last, self.$last.snapshot());
                best.expect("at least one member")
            }
        }
    )*};
}

members! {
    [] Z 0;
    [A 0 a] Z 1;
    [A 0 a, B 1 b] Z 2;
    [A 0 a, B 1 b, C 2 c] Z 3;
    [A 0 a, B 1 b, C 2 c, D 3 d] Z 4;
    [A 0 a, B 1 b, C 2 c, D 3 d, E 4 e] Z 5;
    [A 0 a, B 1 b, C 2 c, D 3 d, E 4 e, F 5 f] Z 6;
    [A 0 a, B 1 b, C 2 c, D 3 d, E 4 e, F 5 f, G 6 g] Z 7;
}
