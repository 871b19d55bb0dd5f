//! Where a sliding log's rings live: behind an epoch pointer that a
//! reconfiguration swaps after sealing them ([`SlidingLog`](crate::SlidingLog)),
//! or under a mutex ([`LockingSlidingLog`](crate::LockingSlidingLog)). It is
//! the one thing the log and its twin do differently: both read, replace and
//! decide on the same [`Rings`], with the same plans and the same decision
//! code.

use std::fmt;

use crossbeam_utils::CachePadded;

use super::log::retry_after;
use super::ring::SealedRing;
use super::stripes::{Plan, Rings};
use crate::cell::{Atomic, Home, Locked};
use crate::error::Denied;
use crate::limiter::check_request;
use crate::sync::{Backoff, Mutex, Shared};

/// Where a log keeps its rings, by its [`Home`]: [`Atomic`], behind a pointer
/// swapped by a reconfiguration that sealed them first, or [`Locked`], under
/// a mutex. Sealed: this module is private, so no one else can implement it.
#[allow(unreachable_pub)] // sealed: public only as the log's parameter
pub trait RingsHome: Home {
    /// What holds the rings.
    type Store: fmt::Debug + Send + Sync;

    /// A holder of `rings`.
    fn store(rings: Rings) -> Self::Store;

    /// Runs `read` on the current rings.
    fn with<R>(store: &Self::Store, read: impl FnOnce(&Rings) -> R) -> R;

    /// Replaces the rings with their successor, built to the plan `make`
    /// derives from the old rings'.
    fn replace_rings(store: &Self::Store, make: impl Fn(Plan) -> Plan);

    /// Decides a request for `n` permits on the current rings. One above
    /// their limit is answered by `refused`; otherwise the clock is read
    /// (`now`), once per request, and the rings decide at that reading, which
    /// `decided` answers, given the same rings and the same reading.
    fn decide<R>(
        store: &Self::Store,
        n: u32,
        now: impl FnMut() -> u64,
        refused: impl FnMut(&Rings, Denied) -> R,
        decided: impl FnMut(&Rings, u64, Result<(), Denied>) -> R,
    ) -> R;
}

impl RingsHome for Atomic {
    type Store = Shared<Rings>;

    fn store(rings: Rings) -> Shared<Rings> {
        Shared::new(rings)
    }

    #[inline]
    fn with<R>(store: &Shared<Rings>, read: impl FnOnce(&Rings) -> R) -> R {
        store.with(read)
    }

    /// Seals the current rings and publishes their successor.
    fn replace_rings(store: &Shared<Rings>, make: impl Fn(Plan) -> Plan) {
        let mut backoff = Backoff::new();
        // Only the thread that seals the rings replaces them; another
        // reconfiguration that got there first is waited for, then the next
        // rings are sealed.
        // SAFETY: a successor is returned only by the thread whose `seal`
        // sealed the rings, and rings are sealed once: no other replacement
        // races this one.
        while !unsafe {
            store.replace_with(|rings| rings.seal().then(|| rings.successor(make(rings.plan()))))
        } {
            backoff.pause();
        }
    }

    #[inline]
    fn decide<R>(
        store: &Shared<Rings>,
        n: u32,
        mut now: impl FnMut() -> u64,
        mut refused: impl FnMut(&Rings, Denied) -> R,
        mut decided: impl FnMut(&Rings, u64, Result<(), Denied>) -> R,
    ) -> R {
        // One clock reading per request, taken once `n` is known to be valid; a
        // request that meets a sealed ring reuses it on the next ring (a reading
        // can only grow staler, which only makes decisions stricter).
        let mut reading = None;
        let mut backoff = Backoff::new();
        loop {
            let outcome = store.with(|rings| {
                if let Err(denied) = check_request(n, rings.limit()) {
                    return Ok::<_, SealedRing>(refused(rings, denied));
                }
                let now = *reading.get_or_insert_with(&mut now);
                let outcome = rings.try_acquire_n(now, n)?;
                Ok(decided(rings, now, outcome))
            });
            match outcome {
                Ok(answer) => return answer,
                // Sealed: a reconfiguration is publishing the next ring.
                Err(_sealed) => backoff.pause(),
            }
        }
    }
}

impl RingsHome for Locked {
    type Store = CachePadded<Mutex<Rings>>;

    fn store(rings: Rings) -> CachePadded<Mutex<Rings>> {
        CachePadded::new(Mutex::new(rings))
    }

    fn with<R>(store: &CachePadded<Mutex<Rings>>, read: impl FnOnce(&Rings) -> R) -> R {
        read(&store.lock())
    }

    /// Under the lock, inheriting as the lock-free log does.
    fn replace_rings(store: &CachePadded<Mutex<Rings>>, make: impl Fn(Plan) -> Plan) {
        let mut rings = store.lock();
        // Under the lock nobody else seals: this caller always does.
        rings.seal();
        *rings = rings.successor(make(rings.plan()));
    }

    fn decide<R>(
        store: &CachePadded<Mutex<Rings>>,
        n: u32,
        mut now: impl FnMut() -> u64,
        mut refused: impl FnMut(&Rings, Denied) -> R,
        mut decided: impl FnMut(&Rings, u64, Result<(), Denied>) -> R,
    ) -> R {
        let rings = store.lock();
        if let Err(denied) = check_request(n, rings.limit()) {
            return refused(&rings, denied);
        }
        // Read under the lock, like the lock-free log reads it after finding its
        // rings: one reading per request, checked against the state it decides on.
        let now = now();
        // Only a reconfiguration seals rings, and it replaces them under the lock.
        let outcome = rings
            .try_acquire_n(now, n)
            .unwrap_or_else(|_sealed| Err(retry_after(rings.shape().window())));
        decided(&rings, now, outcome)
    }
}
