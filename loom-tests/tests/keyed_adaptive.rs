#![cfg(loom)]
//! loom models of `KeyedAdaptiveLimit` (`src/keyed/adaptive.rs`): one
//! adaptive concurrency limit per key, on the shipped keyed map (its
//! reader-biased shard locks on loom's lock and atomics, its tables in loom
//! cells), the shipped `AdaptiveLimit` and `ConcurrencyLimit` gates, and an
//! `Aimd` held at a limit of 1 (min = initial = max = 1), so the bound is
//! one permit per key.
//!
//! The promise: a key never has more in flight than its limit, across
//! eviction and at the cap — all of a key's permits come from one gate. Each
//! holder counts itself in the model's own per-key atomic after its admission
//! and out before its release, and the count must stay at most 1 in every
//! interleaving. Keys are evicted as soon as nothing is in flight for them
//! (idle time 0), so every eviction the protocol allows is explored.
//!
//! Three known-bad protocols, switched on in the loom build only, must be
//! caught by that count: a lookup that lets go of the shard's read side
//! before it admits, a waiter that waits without pinning its key's state,
//! and a key given a state of its own while the overflow still has permits
//! out.

use std::collections::hash_map::DefaultHasher;
use std::hash::BuildHasherDefault;
use std::time::Duration;

use loom::sync::Arc;
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::thread;
use tollgate::fault::{Fault, inject};
use tollgate::keyed::KeyedAdaptiveLimit;
use tollgate::{Aimd, ManualClock, OwnedAdaptivePermit};
use tollgate_loom_tests::{block_on, explore, explore_races};

/// A fixed hasher: loom replays each execution, so the keys' shards must not
/// change from one to the next (the default hasher is seeded at random).
type Fixed = BuildHasherDefault<DefaultHasher>;

type PerKey = KeyedAdaptiveLimit<u64, Aimd, ManualClock, Fixed>;

type Permit = OwnedAdaptivePermit<Aimd, ManualClock>;

/// A limit of 1 per key, keys evicted as soon as unused, at most `max_keys`.
fn per_key(max_keys: usize) -> Arc<PerKey> {
    let keyed = KeyedAdaptiveLimit::with_clock_and_hasher(
        || {
            Aimd::builder()
                .min_limit(1)
                .initial_limit(1)
                .max_limit(1)
                .build()
        },
        ManualClock::new(),
        Fixed::default(),
    )
    .expect("a valid algorithm")
    .with_idle(Duration::ZERO)
    .with_max_keys(max_keys);
    Arc::new(keyed)
}

/// Per-key holders, counted independently of the gates.
#[derive(Default)]
struct Holders([AtomicUsize; 3]);

impl Holders {
    /// Counts a permit's holder in for `key` while it is held, checks the
    /// bound, and counts it out before giving the permit back. Whether it was
    /// admitted.
    fn hold(&self, key: u64, permit: Option<Permit>) -> bool {
        let Some(permit) = permit else {
            return false;
        };
        let count = &self.0[key as usize];
        let held = count.fetch_add(1, Ordering::SeqCst) + 1;
        assert!(
            held <= 1,
            "{held} in flight for key {key} under a limit of 1"
        );
        count.fetch_sub(1, Ordering::SeqCst);
        permit.ignore();
        true
    }
}

/// Nothing left in flight anywhere.
fn assert_drained(keyed: &PerKey) {
    for key in 0..3 {
        assert_eq!(keyed.in_flight_of(&key), 0, "key {key} kept a permit");
    }
    assert_eq!(
        keyed.overflow().in_flight(),
        0,
        "the overflow kept a permit"
    );
}

/// Key 1 has a state with nothing in flight. One thread asks for key 1; the
/// other sweeps (evicting key 1 if it finds it unused) and then asks for key
/// 1 (on the old state, or on a new one if the sweep evicted it). An
/// admission on a state the sweep removed, beside one on its replacement,
/// would be two permits for key 1.
fn eviction_race() {
    let keyed = per_key(usize::MAX);
    keyed.try_acquire(&1).expect("a new key").ignore();
    let holders = Arc::new(Holders::default());

    let (k, h) = (keyed.clone(), holders.clone());
    let asker = thread::spawn(move || h.hold(1, k.try_acquire(&1)));
    let (k, h) = (keyed.clone(), holders.clone());
    let sweeper = thread::spawn(move || {
        k.sweep();
        h.hold(1, k.try_acquire(&1))
    });
    let admitted = [
        asker.join().expect("no panic"),
        sweeper.join().expect("no panic"),
    ];
    // A refusal needs the other request holding the one permit.
    assert!(admitted.iter().any(|&a| a), "both refused");
    assert_drained(&keyed);
}

#[test]
fn eviction_races_an_acquire_on_the_same_key() {
    explore_races(
        "keyed_adaptive::eviction_races_an_acquire_on_the_same_key",
        3,
        eviction_race,
    );
}

/// The same race with lookups that let go of the shard's read side before
/// admitting: the state found may be swept away and a new one made for key
/// 1, and both admit.
#[test]
#[should_panic(expected = "in flight for key 1 under a limit of 1")]
fn known_bad_unlocked_acquire_is_caught() {
    inject(Fault::AdaptiveUnlockedAcquire, true);
    explore(
        "keyed_adaptive::known_bad_unlocked_acquire_is_caught",
        3,
        eviction_race,
    );
}

/// Key 1's one permit is held. One thread waits for key 1 with
/// `acquire_async`; the other gives the permit back, sweeps, and asks for
/// key 1. The waiter must keep key 1's state from eviction until it is
/// admitted, or the sweep removes it and the asker admits on a new state
/// while the waiter is admitted on the old one.
fn waiter_race() {
    let keyed = per_key(usize::MAX);
    let holders = Arc::new(Holders::default());
    let held = keyed.try_acquire(&1).expect("a new key");
    holders.0[1].fetch_add(1, Ordering::SeqCst);

    let (k, h) = (keyed.clone(), holders.clone());
    let waiter = thread::spawn(move || {
        let permit = block_on(k.acquire_async(&1));
        h.hold(1, Some(permit))
    });
    let (k, h) = (keyed.clone(), holders.clone());
    let releaser = thread::spawn(move || {
        h.0[1].fetch_sub(1, Ordering::SeqCst);
        held.ignore();
        k.sweep();
        h.hold(1, k.try_acquire(&1))
    });
    assert!(waiter.join().expect("no panic"), "the waiter is admitted");
    releaser.join().expect("no panic");
    assert_drained(&keyed);
}

#[test]
fn a_waiter_keeps_its_key_from_eviction() {
    explore_races(
        "keyed_adaptive::a_waiter_keeps_its_key_from_eviction",
        3,
        waiter_race,
    );
}

/// The waiter model with waiters that do not pin the state they wait on.
#[test]
#[should_panic(expected = "in flight for key 1 under a limit of 1")]
fn known_bad_unpinned_waiter_is_caught() {
    inject(Fault::AdaptiveUnpinnedWaiters, true);
    explore(
        "keyed_adaptive::known_bad_unpinned_waiter_is_caught",
        3,
        waiter_race,
    );
}

/// One key kept at most. Key 1 holds its permit; one thread asks for key 2
/// (no room while key 1 is busy: the overflow decides), the other gives key
/// 1's permit back and asks for key 2 (key 1 is now evictable: room). Key 2
/// must not get a state of its own while the overflow still holds its
/// permit.
fn cap_race() {
    let keyed = per_key(1);
    let holders = Arc::new(Holders::default());
    let held = keyed.try_acquire(&1).expect("a new key");

    let (k, h) = (keyed.clone(), holders.clone());
    let first = thread::spawn(move || h.hold(2, k.try_acquire(&2)));
    let (k, h) = (keyed.clone(), holders.clone());
    let second = thread::spawn(move || {
        held.ignore();
        h.hold(2, k.try_acquire(&2))
    });
    let admitted = [
        first.join().expect("no panic"),
        second.join().expect("no panic"),
    ];
    assert!(admitted.iter().any(|&a| a), "both refused");
    assert!(keyed.len() <= 1, "{} keys kept, one allowed", keyed.len());
    assert_drained(&keyed);
}

#[test]
fn at_the_cap_a_key_keeps_one_gate() {
    explore_races(
        "keyed_adaptive::at_the_cap_a_key_keeps_one_gate",
        3,
        cap_race,
    );
}

/// The cap model with keys inserted while the overflow has permits out.
#[test]
#[should_panic(expected = "in flight for key 2 under a limit of 1")]
fn known_bad_busy_overflow_insert_is_caught() {
    inject(Fault::AdaptiveBusyOverflowInsert, true);
    explore(
        "keyed_adaptive::known_bad_busy_overflow_insert_is_caught",
        3,
        cap_race,
    );
}
