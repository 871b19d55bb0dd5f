//! Decisions that can be given back: the contract [`AllOf`](crate::AllOf)
//! needs from every member but its last.
//!
//! The user-facing documentation (promise, state, proof) is on [`Refundable`].

use std::marker::PhantomData;

use crate::cell::Word;
use crate::limiter::{Keep, RateLimiter, Rejection, Snapshot};
use crate::machine::WordReceipt;

/// A limiter whose admissions can be given back: the rule every
/// implementation follows and what each limiter returns are below.
///
/// Implemented by the token buckets, fixed windows, leaky buckets (meters),
/// shapers and warm-up limiters and their locking twins, by a key of a [`Keyed`](crate::keyed::Keyed) limiter
/// ([`Keyed::for_key`](crate::keyed::Keyed::for_key)), and by references to any of
/// them.
///
/// Decisions that can be given back: the contract [`AllOf`](crate::AllOf)
/// needs from every member but its last.
///
/// A [`Refundable`] limiter admits with a *receipt*; handing the receipt back
/// to [`refund`](Refundable::refund) returns the permits, as far as that is
/// safe. "Safe" means one thing for every limiter:
///
/// > After a refund, the limiter admits no more than it would have had the
/// > refunded admission never happened — whatever was admitted in between,
/// > at whatever clock readings (stale ones included).
///
/// So a refund can only ever *lose* a permit (leave it taken: under-admission),
/// never hand out one that another request holds (over-admission). Each
/// limiter's own invariant therefore holds over the admissions it keeps.
///
/// | limiter | refund rule | exact when |
/// |---|---|---|
/// | [`TokenBucket`](crate::TokenBucket), [`LockingTokenBucket`](crate::LockingTokenBucket) | restore the TAT the admission replaced if the TAT is still the one it wrote | no other admission on the bucket between the admission and its refund |
/// | [`LeakyBucket`](crate::LeakyBucket), [`LockingLeakyBucket`](crate::LockingLeakyBucket) | the same, on the time the bucket is empty | the same |
/// | [`Shaper`](crate::Shaper), [`WarmUp`](crate::WarmUp) and their twins | restore the 128-bit word the admission replaced if it is still the one it wrote (the rule of a cancelled reservation) | no other admission or reservation in between |
/// | [`FixedWindow`](crate::FixedWindow), [`LockingFixedWindow`](crate::LockingFixedWindow) | take `n` off the count while the window is still the one the permits went to | always (once the window has closed the permits constrain nothing) |
/// | [`Keyed::for_key`](crate::keyed::Keyed::for_key) (every keyable kind, pairs too) | the kind's rule above on the key's word (the shaper's and warm-up's 128-bit word: restored if unchanged; the per-key sliding log: its slots emptied if its admission is still the latest), if the key's configuration and overrides have not changed since | no admission on the key, no reconfiguration or override change in between, and the key was not decided by the shared overflow state at the key cap |
///
/// Why "restore only an unchanged word" for the buckets: a later admission
/// either stacked on ours (then removing our permits from it would be exact)
/// or found the bucket full and absorbed ours (then removing them hands the
/// later request's permits out again), and one word cannot tell the two apart
/// — a loom model with a stale reading found the second. Every admission moves the
/// word strictly forward and every successful refund restores the exact value
/// its admission replaced, so the word equals what ours wrote iff every change
/// since has been undone.
///
/// Not refundable, so only ever the *last* member of an [`AllOf`](crate::AllOf):
/// [`SlidingLog`](crate::SlidingLog) and [`SlidingWindow`](crate::SlidingWindow)
/// (an admission claims ring slots or stripe leases that later admissions
/// build on; no single-word check can tell that it was undone),
/// [`ApproxSlidingWindow`](crate::ApproxSlidingWindow), and the
/// [`Shaper`](crate::Shaper) and [`WarmUp`](crate::WarmUp) (their 128-bit
/// words move forward too, so the same rule would apply; it is not written
/// yet).
///
/// ```
/// use tollgate::{ManualClock, Rate, RateLimiter, Refundable, TokenBucket};
///
/// let bucket = TokenBucket::with_clock(2, Rate::per_hour(2), ManualClock::new()).unwrap();
/// let admitted = bucket.try_acquire_n_refundable(2).unwrap();
/// assert_eq!(admitted.snapshot.available, 0);
/// bucket.refund(admitted.receipt); // nobody else was admitted: exact
/// assert_eq!(bucket.snapshot().available, 2);
/// ```
pub trait Refundable: RateLimiter {
    /// What an admission hands back for its refund. It borrows the limiter,
    /// and a receipt given to another limiter than the one that issued it is
    /// ignored.
    type Receipt<'a>
    where
        Self: 'a;

    /// Asks for `n` permits, as
    /// [`try_acquire_n_with_snapshot`](RateLimiter::try_acquire_n_with_snapshot)
    /// does (the same answers, the same report), and on admission returns a
    /// receipt for [`refund`](Refundable::refund) beside the report.
    ///
    /// ```
    /// use tollgate::{Denied, FixedWindow, Rate, Refundable};
    /// let window = FixedWindow::new(Rate::per_hour(3)).unwrap();
    /// let admitted = window.try_acquire_n_refundable(2).unwrap();
    /// assert_eq!(admitted.snapshot.available, 1);
    /// let denied = window.try_acquire_n_refundable(2).unwrap_err();
    /// assert!(matches!(denied.denied, Denied::RetryAfter(_)));
    /// ```
    fn try_acquire_n_refundable(&self, n: u32) -> Result<Receipted<Self::Receipt<'_>>, Rejection>;

    /// As [`try_acquire_n_refundable`](Refundable::try_acquire_n_refundable),
    /// without the report: what [`AllOf`](crate::AllOf)'s plain
    /// [`try_acquire_n`](RateLimiter::try_acquire_n) asks, so that a decision
    /// nobody reports computes no snapshot. The default drops the report; the
    /// one-word limiters compute none.
    ///
    /// ```
    /// use tollgate::{Rate, RateLimiter, Refundable, TokenBucket};
    /// let bucket = TokenBucket::new(2, Rate::per_hour(2)).unwrap();
    /// let receipt = bucket.try_acquire_n_receipt(2).unwrap();
    /// bucket.refund(receipt);
    /// assert_eq!(bucket.snapshot().available, 2);
    /// ```
    #[inline]
    fn try_acquire_n_receipt(&self, n: u32) -> Result<Self::Receipt<'_>, crate::error::Denied> {
        self.try_acquire_n_refundable(n)
            .map(|admitted| admitted.receipt)
            .map_err(|rejection| rejection.denied)
    }

    /// Gives back the permits of the admission that issued `receipt`, as far
    /// as that is safe (see [`Refundable`]): never more than "as if
    /// it had not happened", possibly nothing if other requests have moved
    /// the state since.
    ///
    /// ```
    /// use tollgate::{FixedWindow, Rate, RateLimiter, Refundable};
    /// let window = FixedWindow::new(Rate::per_hour(3)).unwrap();
    /// let first = window.try_acquire_n_refundable(1).unwrap();
    /// window.try_acquire_n(1).unwrap(); // stacks on the first in the same window
    /// window.refund(first.receipt); // a count is a sum: exact even so
    /// assert_eq!(window.snapshot().available, 2);
    /// ```
    fn refund<'a>(&'a self, receipt: Self::Receipt<'a>);
}

/// An admission that can be given back: the report of the state it left and
/// the receipt for [`Refundable::refund`].
///
/// ```
/// use tollgate::{Rate, Refundable, TokenBucket};
/// let bucket = TokenBucket::new(5, Rate::per_hour(5)).unwrap();
/// let admitted = bucket.try_acquire_n_refundable(1).unwrap();
/// assert_eq!((admitted.snapshot.available, admitted.snapshot.capacity), (4, 5));
/// # bucket.refund(admitted.receipt);
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub struct Receipted<R> {
    /// The limiter's state after the admission, as
    /// [`try_acquire_n_with_snapshot`](RateLimiter::try_acquire_n_with_snapshot)
    /// reports it.
    pub snapshot: Snapshot,
    /// What [`Refundable::refund`] needs to give the permits back.
    pub receipt: R,
}

impl<R> Receipted<R> {
    /// An admission's report and receipt, for limiters written outside this
    /// crate.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Receipted, Snapshot};
    /// let admitted = Receipted::new(Snapshot::new(1, 2, Duration::ZERO), ());
    /// assert_eq!(admitted.snapshot.available, 1);
    /// ```
    pub fn new(snapshot: Snapshot, receipt: R) -> Self {
        Receipted { snapshot, receipt }
    }
}

/// The receipt of a one-word limiter (token bucket, fixed window, leaky
/// bucket, and their twins): the word the admission replaced and the word it
/// wrote. Opaque; it borrows the limiter that issued it.
///
/// ```
/// use tollgate::{Rate, RateLimiter, Refundable, TokenBucket};
/// let a = TokenBucket::new(1, Rate::per_hour(1)).unwrap();
/// let b = TokenBucket::new(1, Rate::per_hour(1)).unwrap();
/// let receipt = a.try_acquire_n_refundable(1).unwrap().receipt;
/// b.try_acquire().unwrap();
/// b.refund(receipt); // not b's: ignored
/// assert_eq!(b.snapshot().available, 0);
/// ```
#[derive(Debug)]
pub struct Receipt<'a> {
    /// Widened: the receipt of a one-word limiter and of a two-word one
    /// (shaper, warm-up) are one type.
    word: WordReceipt<u128>,
    /// The issuing limiter's address: it cannot move or be reused while the
    /// receipt borrows it.
    owner: usize,
    _limiter: PhantomData<&'a ()>,
}

impl<'a> Receipt<'a> {
    pub(crate) fn new<T, W: Word>(owner: &'a T, word: WordReceipt<W>) -> Self {
        Receipt {
            word: WordReceipt {
                before: word.before.widen(),
                written: word.written.widen(),
                n: word.n,
            },
            owner: owner as *const T as usize,
            _limiter: PhantomData,
        }
    }

    /// The receipt's words if `limiter` issued it.
    pub(crate) fn word_for<T, W: Word>(&self, limiter: &T) -> Option<WordReceipt<W>> {
        (self.owner == limiter as *const T as usize).then_some(WordReceipt {
            before: W::narrow(self.word.before),
            written: W::narrow(self.word.written),
            n: self.word.n,
        })
    }
}

impl<L: Refundable> Refundable for &L {
    type Receipt<'a>
        = L::Receipt<'a>
    where
        Self: 'a;

    #[inline]
    fn try_acquire_n_refundable(&self, n: u32) -> Result<Receipted<Self::Receipt<'_>>, Rejection> {
        (**self).try_acquire_n_refundable(n)
    }

    #[inline]
    fn try_acquire_n_receipt(&self, n: u32) -> Result<Self::Receipt<'_>, crate::error::Denied> {
        (**self).try_acquire_n_receipt(n)
    }

    fn refund<'a>(&'a self, receipt: Self::Receipt<'a>) {
        (**self).refund(receipt)
    }
}

/// [`RateLimiter::try_acquire_n_then`] for a [`Refundable`] limiter: the
/// admission's receipt stays on this stack while `keep` runs, and goes back
/// by the limiter's own refund rule if `keep` says no.
#[inline]
pub(crate) fn decide_then<L: Refundable + ?Sized>(limiter: &L, n: u32, keep: Keep<'_>) -> bool {
    match limiter.try_acquire_n_refundable(n) {
        Ok(admitted) => {
            if keep(Ok(admitted.snapshot)) {
                true
            } else {
                limiter.refund(admitted.receipt);
                false
            }
        }
        Err(rejection) => {
            keep(Err(rejection));
            false
        }
    }
}
