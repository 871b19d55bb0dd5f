//! The two shapes of a keyed answer: the plain one of `try_acquire_n` and the
//! one that reports the key's state with it (`try_acquire_n_with_snapshot`).
//!
//! Every path of a keyed decision (an override's slot, a key already in the
//! map, a key being inserted, the overflow state at the cap) is written once,
//! generic over the shape; the plain shape computes no snapshot, so its code
//! is what it was before reports existed.

use std::time::Duration;

use super::{Keyable, Refusal, View};
use crate::error::Denied;
use crate::limiter::{Rejection, Snapshot};

/// Where a keyed decision was made: the configuration view, the key's state
/// and the decision time. What an answer may read to shape itself.
pub(crate) struct Site<'s, L: Keyable> {
    pub(crate) view: &'s View<'s, L::Config>,
    pub(crate) state: &'s L::State,
    pub(crate) now: u64,
}

impl<L: Keyable> Clone for Site<'_, L> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<L: Keyable> Copy for Site<'_, L> {}

/// How a keyed decision answers.
pub(crate) trait Answer<L: Keyable>: Copy {
    /// What an admission returns.
    type Admitted;
    /// What a denial returns.
    type Denied;

    /// The answer to an admission with `receipt` at `site`.
    fn admitted(self, site: Site<'_, L>, receipt: L::Receipt) -> Self::Admitted;

    /// The answer to a denial at `site`; `Stale` if the view went stale before
    /// the state could be read.
    fn denied(self, site: Site<'_, L>, denied: Denied) -> Result<Self::Denied, Refusal>;

    /// A request that no state could ever grant (`n = 0`, `n` above the
    /// capacity), refused before any state is looked at; `snapshot` reads the
    /// key's state if the answer needs it.
    fn invalid(self, denied: Denied, snapshot: impl FnOnce() -> Snapshot) -> Self::Denied;

    /// The answer at `now` restated for a request whose clock read `reading`
    /// (`now > reading` when the decision time was raised to the floor): its
    /// waits are measured from the reading.
    fn measured_from(
        self,
        reading: u64,
        now: u64,
        answer: Result<Self::Admitted, Self::Denied>,
    ) -> Result<Self::Admitted, Self::Denied>;
}

/// Asks `state` for `n` permits and shapes the answer: the one decision step
/// of every keyed path.
#[inline]
pub(crate) fn ask<L: Keyable, A: Answer<L>>(
    answer: A,
    view: &View<'_, L::Config>,
    state: &L::State,
    now: u64,
    n: u32,
) -> Result<Result<A::Admitted, A::Denied>, Refusal> {
    let site = Site { view, state, now };
    match L::acquire(view, state, now, n) {
        Ok(receipt) => Ok(Ok(answer.admitted(site, receipt))),
        Err(Refusal::Denied(denied)) => answer.denied(site, denied).map(Err),
        Err(Refusal::Stale) => Err(Refusal::Stale),
    }
}

/// `try_acquire_n`'s answer: `Ok(())` or the [`Denied`].
#[derive(Clone, Copy)]
pub(crate) struct Plain;

impl<L: Keyable> Answer<L> for Plain {
    type Admitted = ();
    type Denied = Denied;

    #[inline]
    fn admitted(self, _: Site<'_, L>, _: L::Receipt) {}

    #[inline]
    fn denied(self, _: Site<'_, L>, denied: Denied) -> Result<Denied, Refusal> {
        Ok(denied)
    }

    fn invalid(self, denied: Denied, _: impl FnOnce() -> Snapshot) -> Denied {
        denied
    }

    #[inline]
    fn measured_from(
        self,
        reading: u64,
        now: u64,
        answer: Result<(), Denied>,
    ) -> Result<(), Denied> {
        answer.map_err(|denied| later(denied, reading, now))
    }
}

/// `try_acquire_n_with_snapshot`'s answer: the key's state after the decision
/// beside it. An admission's snapshot is of the word its compare-and-swap
/// wrote; a denial's is of the state it was denied on, read right after (a
/// denial writes nothing, so that is the same state unless another request
/// changed it in between).
#[derive(Clone, Copy)]
pub(crate) struct Reported;

impl<L: Keyable> Answer<L> for Reported {
    type Admitted = Snapshot;
    type Denied = Rejection;

    #[inline]
    fn admitted(self, site: Site<'_, L>, receipt: L::Receipt) -> Snapshot {
        L::admitted(site.view, receipt, site.now)
    }

    fn denied(self, site: Site<'_, L>, denied: Denied) -> Result<Rejection, Refusal> {
        let snapshot = L::snapshot(site.view, site.state, site.now).ok_or(Refusal::Stale)?;
        Ok(Rejection::new(denied, snapshot))
    }

    fn invalid(self, denied: Denied, snapshot: impl FnOnce() -> Snapshot) -> Rejection {
        Rejection::new(denied, snapshot())
    }

    fn measured_from(
        self,
        reading: u64,
        now: u64,
        answer: Result<Snapshot, Rejection>,
    ) -> Result<Snapshot, Rejection> {
        match answer {
            Ok(snapshot) => Ok(later_snapshot(snapshot, reading, now)),
            Err(rejection) => Err(Rejection::new(
                later(rejection.denied, reading, now),
                later_snapshot(rejection.snapshot, reading, now),
            )),
        }
    }
}

/// A retry-after decided at `now`, measured from `reading`.
#[inline]
fn later(denied: Denied, reading: u64, now: u64) -> Denied {
    match denied {
        Denied::RetryAfter(wait) if now > reading => {
            Denied::RetryAfter(wait + Duration::from_nanos(now - reading))
        }
        other => other,
    }
}

/// A snapshot taken at `now`, its time to full measured from `reading`, as a
/// retry-after is.
pub(crate) fn later_snapshot(snap: Snapshot, reading: u64, now: u64) -> Snapshot {
    if snap.until_full.is_zero() || now <= reading {
        return snap;
    }
    Snapshot {
        until_full: snap.until_full + Duration::from_nanos(now - reading),
        ..snap
    }
}
