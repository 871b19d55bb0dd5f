#![cfg(loom)]
//! loom models of the concurrency limit (`src/concurrency/`): admissions and
//! releases racing, the limit shrunk while permits are held and grown while a
//! thread sleeps, blocking and async waiters woken by a release, and a woken
//! waiter dropped before it asks again.
//!
//! Every model checks, in every interleaving:
//!
//! - **the bound**, independently of the word: each holder counts itself in
//!   a loom atomic of the model's own after its admission and out before its
//!   release, so the count never exceeds the permits the word has granted,
//!   and the model asserts it stays within the limit (the largest limit the
//!   model ever sets, or a tighter one where the model knows it);
//! - each permit's report: `granted_in_flight <= granted_limit`;
//! - **no stranded permit**: after joining, nothing is in flight and exactly
//!   `limit` fresh `try_acquire`s succeed (`assert_drained`).
//!
//! A wake-up that never comes leaves a thread parked (or a `block_on`
//! pending) forever; loom reports that as a deadlock, so the waiting models
//! need no assertion of their own for it. Two known-bad variants, switched
//! on under `--cfg loom` only, must be caught: an acquire that decides on a
//! load and stores blindly, and a woken waiter that gives up without passing
//! its wake-up on.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicU32, Ordering};
use loom::thread;
use tollgate::fault::{Fault, inject};
use tollgate::{ConcurrencyLimit, LockingConcurrencyLimit, Permit, PermitSource};
use tollgate_loom_tests::{block_on, explore, explore_races};

/// Counts the holders of a limit's permits, as the model sees them.
struct Holders {
    now: AtomicU32,
    most: u32,
}

impl Holders {
    fn new(most: u32) -> Arc<Self> {
        Arc::new(Holders {
            now: AtomicU32::new(0),
            most,
        })
    }

    /// Holds `permit` while `work` runs, counted; checks the bound and the
    /// permit's report.
    fn hold<L: PermitSource, R>(&self, permit: Permit<'_, L>, work: impl FnOnce() -> R) -> R {
        assert!(
            permit.granted_in_flight() >= 1 && permit.granted_in_flight() <= permit.granted_limit(),
            "concurrency invariant violated: a permit reports {permit:?}"
        );
        let held = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        assert!(
            held <= self.most,
            "concurrency invariant violated: {held} permits held against a limit of {}",
            self.most
        );
        let result = work();
        self.now.fetch_sub(1, Ordering::SeqCst);
        drop(permit);
        result
    }
}

/// No stranded permit: nothing in flight, and exactly `limit` permits free.
fn assert_drained(limit: &ConcurrencyLimit) {
    assert_eq!(limit.in_flight(), 0, "a permit stranded: {limit:?}");
    let all: Vec<_> = (0..limit.limit()).map(|_| limit.try_acquire()).collect();
    assert!(
        all.iter().all(Option::is_some),
        "a fresh limit of {} refused: {all:?}",
        limit.limit()
    );
    assert!(limit.try_acquire().is_none(), "more than the limit free");
    drop(all);
    assert_eq!(limit.in_flight(), 0);
}

/// Threads (the model's own among them) each try once, hold and release.
/// Every denial must have had `limit` other holders, so at least `limit` are
/// admitted (no spurious denial).
fn racing_acquires(limit: u32, threads: usize) {
    let gate = Arc::new(ConcurrencyLimit::new(limit).unwrap());
    let holders = Holders::new(limit);
    let attempt = {
        let (gate, holders) = (gate.clone(), holders.clone());
        move || match gate.try_acquire() {
            Some(permit) => holders.hold(permit, || 1),
            None => 0,
        }
    };
    let handles: Vec<_> = (1..threads)
        .map(|_| thread::spawn(attempt.clone()))
        .collect();
    let mut admitted = attempt();
    for handle in handles {
        admitted += handle.join().unwrap();
    }
    assert!(
        admitted >= limit.min(threads as u32),
        "concurrency invariant violated: only {admitted} admitted by a limit of {limit}"
    );
    assert_drained(&gate);
}

#[test]
fn acquires_and_releases_race() {
    explore_races("concurrency::acquires_and_releases_race", 3, || {
        racing_acquires(1, 3)
    });
}

#[test]
fn acquires_and_releases_race_under_a_limit_of_two() {
    explore_races(
        "concurrency::acquires_and_releases_race_under_a_limit_of_two",
        3,
        || racing_acquires(2, 3),
    );
}

/// The known-bad acquire: two threads load the same free word and both
/// store one more; the holders' count sees two against a limit of one.
#[test]
#[should_panic(expected = "concurrency invariant violated")]
fn known_bad_load_then_store_is_caught() {
    inject(Fault::LoadThenStore, true);
    explore(
        "concurrency::known_bad_load_then_store_is_caught",
        3,
        || racing_acquires(1, 2),
    );
}

/// A limit of 2 shrunk to 1 while a permit is held and others race for it.
/// The shrinking thread then asks once: if it is admitted (its admission
/// reads the word its own `set_limit` wrote, or a later one), it must be the
/// only holder, however the held permit's release and the other request fell.
#[test]
fn shrink_while_held_admits_nobody_past_the_new_limit() {
    explore_races(
        "concurrency::shrink_while_held_admits_nobody_past_the_new_limit",
        3,
        || {
            let gate = Arc::new(ConcurrencyLimit::new(2).unwrap());
            let holders = Holders::new(2);
            let held = gate.try_acquire().unwrap();

            let (g, h) = (gate.clone(), holders.clone());
            let shrinker = thread::spawn(move || {
                g.set_limit(1).unwrap();
                if let Some(permit) = g.try_acquire() {
                    assert_eq!(permit.granted_limit(), 1);
                    h.hold(permit, || {
                        assert_eq!(
                            h.now.load(Ordering::SeqCst),
                            1,
                            "concurrency invariant violated: admitted past a shrunk limit"
                        );
                    });
                }
            });
            let (g, h) = (gate.clone(), holders.clone());
            let racer = thread::spawn(move || {
                if let Some(permit) = g.try_acquire() {
                    h.hold(permit, || ());
                }
            });
            holders.hold(held, || ());
            shrinker.join().unwrap();
            racer.join().unwrap();
            assert_eq!(gate.limit(), 1);
            assert_drained(&gate);
        },
    );
}

/// A thread blocks on a full limit of 1 whose holder never lets go until the
/// waiter is served; another thread grows the limit to 2. Only the growth can
/// wake the waiter: lost, the model deadlocks.
#[test]
fn growth_wakes_a_blocked_waiter() {
    explore_races("concurrency::growth_wakes_a_blocked_waiter", 3, || {
        let gate = Arc::new(ConcurrencyLimit::new(1).unwrap());
        let holders = Holders::new(2);
        let held = gate.try_acquire().unwrap();
        let (g, h) = (gate.clone(), holders.clone());
        let waiter = thread::spawn(move || {
            let permit = g.acquire();
            assert_eq!((permit.granted_in_flight(), permit.granted_limit()), (2, 2));
            h.hold(permit, || ());
        });
        let g = gate.clone();
        let grower = thread::spawn(move || g.set_limit(2).unwrap());
        waiter.join().unwrap();
        grower.join().unwrap();
        holders.hold(held, || ());
        assert_drained(&gate);
    });
}

/// Two threads block on a full limit of 1 whose holder never lets go; a
/// third grows the limit to 3. Each served waiter keeps its permit (forgets
/// it), so no release can wake the other: the growth must wake both, as many
/// as it opened room for.
#[test]
fn growth_wakes_as_many_waiters_as_it_opens_room_for() {
    explore_races(
        "concurrency::growth_wakes_as_many_waiters_as_it_opens_room_for",
        3,
        || {
            let gate = Arc::new(ConcurrencyLimit::new(1).unwrap());
            let held = gate.try_acquire().unwrap();
            let waiters: Vec<_> = (0..2)
                .map(|_| {
                    let g = gate.clone();
                    thread::spawn(move || {
                        let permit = g.acquire();
                        assert!(permit.granted_in_flight() <= permit.granted_limit());
                        std::mem::forget(permit);
                    })
                })
                .collect();
            let g = gate.clone();
            let grower = thread::spawn(move || g.set_limit(3).unwrap());
            for waiter in waiters {
                waiter.join().unwrap();
            }
            grower.join().unwrap();
            assert_eq!(gate.in_flight(), 3);
            assert!(gate.try_acquire().is_none());
            drop(held);
            assert_eq!(gate.in_flight(), 2, "the two forgotten permits stay held");
        },
    );
}

/// What the models below ask of either limit: the lock-free one and its
/// locking twin have the same methods, but no trait to name them by.
trait Gate: PermitSource + Send + Sync + Sized + 'static {
    fn try_acquire(&self) -> Option<Permit<'_, Self>>;
    fn acquire(&self) -> Permit<'_, Self>;
}

macro_rules! gate {
    ($($limit:ty),*) => {$(
        impl Gate for $limit {
            fn try_acquire(&self) -> Option<Permit<'_, Self>> {
                <$limit>::try_acquire(self)
            }

            fn acquire(&self) -> Permit<'_, Self> {
                <$limit>::acquire(self)
            }
        }
    )*};
}

gate!(ConcurrencyLimit, LockingConcurrencyLimit);

/// A full `gate` of 1 whose holder, the model's thread, releases while
/// `first` and `second` run on threads of their own; returns the gate once
/// both are joined.
fn release_while_two_ask<G: Gate>(
    gate: G,
    first: fn(&G, &Holders),
    second: fn(&G, &Holders),
) -> Arc<G> {
    let gate = Arc::new(gate);
    let holders = Holders::new(1);
    let held = Gate::try_acquire(&*gate).unwrap();
    let (g, h) = (gate.clone(), holders.clone());
    let first = thread::spawn(move || first(&g, &h));
    let (g, h) = (gate.clone(), holders.clone());
    let second = thread::spawn(move || second(&g, &h));
    holders.hold(held, || ());
    first.join().unwrap();
    second.join().unwrap();
    gate
}

/// Blocks until admitted, then holds the permit.
fn wait<G: Gate>(gate: &G, holders: &Holders) {
    holders.hold(Gate::acquire(gate), || ());
}

/// Asks once without waiting, and holds the permit if admitted.
fn barge<G: Gate>(gate: &G, holders: &Holders) {
    if let Some(permit) = Gate::try_acquire(gate) {
        holders.hold(permit, || ());
    }
}

/// Waits in `acquire_async` under `block_on`, then holds the permit.
fn wait_async(gate: &ConcurrencyLimit, holders: &Holders) {
    holders.hold(block_on(gate.acquire_async()), || ());
}

/// A blocked thread on a full limit of 1 is woken by the holder's release,
/// racing its registration; a second thread asks without waiting meanwhile
/// (it may take the freed permit first: the waiter then sleeps again and is
/// woken by that release).
#[test]
fn release_wakes_a_blocked_waiter() {
    explore_races("concurrency::release_wakes_a_blocked_waiter", 3, || {
        let gate = ConcurrencyLimit::new(1).unwrap();
        assert_drained(&release_while_two_ask(gate, wait, barge));
    });
}

/// The same race on the locking twin: the same gate over the twins' locked
/// cell (loom's mutex), whose word updates loom sees as lock and unlock.
#[test]
fn the_twin_wakes_a_blocked_waiter_on_release() {
    explore_races(
        "concurrency::the_twin_wakes_a_blocked_waiter_on_release",
        3,
        || {
            let gate = LockingConcurrencyLimit::new(1).unwrap();
            let gate = release_while_two_ask(gate, wait, barge);
            assert_eq!(gate.in_flight(), 0, "a permit stranded");
            let (a, b) = (gate.try_acquire(), gate.try_acquire());
            assert!(a.is_some() && b.is_none());
        },
    );
}

/// Two async waiters (`acquire_async` under `block_on`) on a full
/// limit of 1, woken one release at a time.
#[test]
fn release_wakes_async_waiters() {
    explore_races("concurrency::release_wakes_async_waiters", 3, || {
        let gate = ConcurrencyLimit::new(1).unwrap();
        assert_drained(&release_while_two_ask(gate, wait_async, wait_async));
    });
}

/// Polls `acquire_async` once with a waker that does nothing, then drops the
/// future without polling it again: if the first poll queued it and a
/// release woke it, the drop must pass the wake-up on.
fn poll_once_then_drop(gate: &ConcurrencyLimit, holders: &Holders) {
    let mut future = pin!(gate.acquire_async());
    let mut cx = Context::from_waker(Waker::noop());
    if let Poll::Ready(permit) = future.as_mut().poll(&mut cx) {
        holders.hold(permit, || ());
    }
}

/// A full limit of 1: one thread polls `acquire_async` once and drops it,
/// another waits in `block_on`, the holder releases. In the interleavings
/// where the release wakes the first waiter and it is then dropped, the
/// second is served only if the drop passed the wake-up on.
fn woken_waiter_dropped() {
    let gate = ConcurrencyLimit::new(1).unwrap();
    assert_drained(&release_while_two_ask(
        gate,
        poll_once_then_drop,
        wait_async,
    ));
}

#[test]
fn a_woken_waiter_dropped_passes_the_wake_up_on() {
    explore_races(
        "concurrency::a_woken_waiter_dropped_passes_the_wake_up_on",
        3,
        woken_waiter_dropped,
    );
}

/// The known-bad cancellation: the dropped waiter keeps the wake-up, the
/// other sleeps forever, and loom reports the deadlock.
#[test]
#[should_panic(expected = "deadlock")]
fn known_bad_forgetful_leave_is_caught() {
    inject(Fault::ForgetfulLeave, true);
    explore(
        "concurrency::known_bad_forgetful_leave_is_caught",
        3,
        woken_waiter_dropped,
    );
}

/// A cell touched only under a permit of a limit of 1.
struct Guarded(UnsafeCell<u32>);

// SAFETY: every access is made holding the one permit; whether the permits
// order them is what the model checks (loom reports an unordered pair).
unsafe impl Sync for Guarded {}

/// A limit of 1 is a mutex: each thread that is admitted increments a plain
/// cell (loom's, which reports two accesses not ordered by happens-before).
/// The admission must see every earlier holder's write: the release's
/// `Release` and the admission's `Acquire` on the word order them.
#[test]
fn a_release_happens_before_the_next_admission() {
    explore_races(
        "concurrency::a_release_happens_before_the_next_admission",
        3,
        || {
            let gate = Arc::new(ConcurrencyLimit::new(1).unwrap());
            let data = Arc::new(Guarded(UnsafeCell::new(0u32)));
            let attempt = {
                let (gate, data) = (gate.clone(), data.clone());
                move || {
                    if let Some(_permit) = gate.try_acquire() {
                        // SAFETY: the permit of a limit of 1 excludes others.
                        data.0.with_mut(|n| unsafe { *n += 1 });
                    }
                }
            };
            let other = thread::spawn(attempt.clone());
            attempt();
            other.join().unwrap();
            attempt();
            // SAFETY: as above.
            let n = gate.try_acquire().map(|_p| data.0.with(|n| unsafe { *n }));
            assert!(matches!(n, Some(1..=3)), "{n:?}");
            assert_drained(&gate);
        },
    );
}
