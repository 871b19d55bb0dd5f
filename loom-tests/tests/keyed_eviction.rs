#![cfg(loom)]
//! loom models of a `Keyed` map's eviction racing requests on the key it
//! evicts: the shipped keyed code over the shipped map (`src/keyed/map.rs`),
//! whose shard locks — a loom reader-writer lock with tollgate's biased read
//! side, and the tables in loom cells — are explored like every atomic. The
//! bias starts set and, under loom, comes back after one read through the
//! lock, so the models run biased readers, readers through the lock and
//! writers clearing the bias against each other.
//!
//! The promise: eviction never changes a decision. In particular the state
//! evicted must never be one with an admission the fresh state that replaces
//! it would not know of — which shows as over-admission: the key's own
//! admissions, over the original and the recreated state, break the token
//! bucket's bound.
//!
//! Three known-bad protocols, switched on in the loom build only, must be
//! caught, which proves the checks can fail: a lookup that lets go of the
//! shard before deciding, a biased reader that does not check the bias again
//! after claiming its slot, and a writer that clears the bias without waiting
//! for the readers in their slots. loom catches each as a table read
//! concurrent with a write (its cell tracking), before any decision is made.

use std::collections::hash_map::DefaultHasher;
use std::hash::BuildHasherDefault;
use std::time::Duration;

use loom::sync::Arc;
use loom::thread;
use tollgate::fault::{Fault, inject};
use tollgate::keyed::{BucketConfig, FLOOR_STEP, Keyed};
use tollgate::{ManualClock, Rate, TokenBucket};
use tollgate_loom_tests::{
    Op, RecordingClock, assert_bucket_bound, explore, explore_races, record,
};

/// The refill interval, past the floor step: a reading one interval later
/// moves the keyed limiter's time floor up to it, so eviction judges
/// freshness there.
const INTERVAL: u64 = 2 * FLOOR_STEP;

/// A fixed hasher: loom replays each execution, so the keys' shards must not
/// change from one to the next (the default hasher is seeded at random).
type Fixed = BuildHasherDefault<DefaultHasher>;

type PerKey = Keyed<u64, TokenBucket<RecordingClock>, Fixed>;

/// One permit per `INTERVAL` per key, at most one key kept: a second key
/// makes room by evicting the first if it is fresh at the floor.
fn per_key() -> (Arc<PerKey>, ManualClock) {
    let clock = ManualClock::new();
    let config = BucketConfig::new(1, Rate::new(1, Duration::from_nanos(INTERVAL)))
        .expect("a valid configuration");
    let keyed =
        Keyed::with_clock_and_hasher(config, RecordingClock::new(clock.clone()), Fixed::default())
            .with_max_keys(1);
    (Arc::new(keyed), clock)
}

/// `capacity` permits per key, one per `INTERVAL`, no key cap, on a clock
/// that stays at 0.
fn frozen(capacity: u32) -> Arc<PerKey> {
    let config = BucketConfig::new(capacity, Rate::new(1, Duration::from_nanos(INTERVAL)))
        .expect("a valid configuration");
    Arc::new(Keyed::with_clock_and_hasher(
        config,
        RecordingClock::new(ManualClock::new()),
        Fixed::default(),
    ))
}

/// Key 1 asks at 0; its thread moves the clock to `INTERVAL` (key 1 is full
/// again: fresh, evictable, from the moment the floor gets there) and asks
/// twice more — the first may be decided on the old state or a new one, the
/// second must then be denied (one permit per interval). Meanwhile key 2
/// arrives at the cap and evicts key 1 if it finds it fresh, racing key 1's
/// requests. Then key 1's admissions must keep the bucket's bound.
fn race() {
    let (keyed, clock) = per_key();

    let (k, c) = (keyed.clone(), clock.clone());
    let first = thread::spawn(move || {
        let mut ops = vec![record(1, || k.try_acquire(&1))];
        c.advance(Duration::from_nanos(INTERVAL));
        ops.push(record(1, || k.try_acquire(&1)));
        ops.push(record(1, || k.try_acquire(&1)));
        ops
    });
    let k = keyed.clone();
    let second = thread::spawn(move || vec![record(1, || k.try_acquire(&2))]);

    let key_1: Vec<Op> = first.join().expect("no panic");
    let key_2: Vec<Op> = second.join().expect("no panic");
    // No "a fresh key is admitted" check: at the cap a new key may start
    // from the overflow state, as indebted as it (stricter, never looser).
    assert_bucket_bound(1, INTERVAL, &[key_1]);
    assert_bucket_bound(1, INTERVAL, &[key_2]);
}

#[test]
fn eviction_races_requests_on_the_key_it_evicts() {
    explore_races(
        "keyed_eviction::eviction_races_requests_on_the_key_it_evicts",
        3,
        race,
    );
}

/// The same race with lookups that drop the shard's lock before deciding: an
/// eviction (or an insert) can change the table while key 1's request reads
/// the state it found.
#[test]
#[should_panic(expected = "Causality violation")]
fn known_bad_unlocked_lookup_is_caught() {
    inject(Fault::UnlockedLookups, true);
    explore(
        "keyed_eviction::known_bad_unlocked_lookup_is_caught",
        2,
        race,
    );
}

/// The same race with biased readers that do not check the bias again after
/// claiming their slot: a reader that read the bias set, then claimed its
/// slot after a writer's scan passed it, reads while the writer writes.
#[test]
#[should_panic(expected = "Causality violation")]
fn known_bad_unchecked_bias_is_caught() {
    inject(Fault::UncheckedBias, true);
    explore(
        "keyed_eviction::known_bad_unchecked_bias_is_caught",
        3,
        race,
    );
}

/// The same race with writers that clear the bias and do not wait for the
/// biased readers already in their slots.
#[test]
#[should_panic(expected = "Causality violation")]
fn known_bad_unwaited_readers_is_caught() {
    inject(Fault::UnwaitedReaders, true);
    explore(
        "keyed_eviction::known_bad_unwaited_readers_is_caught",
        3,
        race,
    );
}

/// Two threads ask for a key no state exists for yet: one creates it under
/// the shard's write lock while the other finds it, or waits on that lock and
/// finds it then. Two permits a key, the clock frozen: exactly two of the three
/// requests are admitted, whatever the order.
#[test]
fn creation_races_an_acquire_on_the_same_key() {
    explore_races(
        "keyed_eviction::creation_races_an_acquire_on_the_same_key",
        3,
        || {
            let keyed = frozen(2);
            let k = keyed.clone();
            let first = thread::spawn(move || {
                vec![
                    record(1, || k.try_acquire(&1)),
                    record(1, || k.try_acquire(&1)),
                ]
            });
            let k = keyed.clone();
            let second = thread::spawn(move || vec![record(1, || k.try_acquire(&1))]);
            let threads = vec![
                first.join().expect("no panic"),
                second.join().expect("no panic"),
            ];
            let admitted = threads
                .iter()
                .flatten()
                .filter(|op| op.result.is_ok())
                .count();
            assert_eq!(admitted, 2, "two permits, three requests: {threads:#?}");
            assert_eq!(keyed.len(), 1);
        },
    );
}

/// Two biased readers on one line of reader slots and a writer. loom numbers
/// a model's threads 0 (main), 1, 2, 3, and a thread's line is its number
/// modulo the two lines loom builds have, so readers 1 and 3 share a line
/// and, reading the same key, the same slot: the second must find the slot
/// taken and read through the lock. A sweep (the writer) visits every shard.
/// A slot claimed by a blind store instead of a compare-and-swap would let
/// the first reader's release free the slot while the other still reads, and
/// the sweep write beside it — loom's cell tracking reports that.
#[test]
fn readers_sharing_a_slot_and_a_sweep() {
    explore_races(
        "keyed_eviction::readers_sharing_a_slot_and_a_sweep",
        2,
        || {
            let keyed = frozen(4);
            // The insert clears the shard's bias; the second request reads
            // through the lock, which (after one such read, under loom) sets
            // it again: the readers below start biased.
            assert!(keyed.try_acquire(&1).is_ok());
            assert!(keyed.try_acquire(&1).is_ok());
            let k = keyed.clone();
            let first = thread::spawn(move || record(1, || k.try_acquire(&1)));
            let k = keyed.clone();
            let sweeper = thread::spawn(move || k.sweep());
            let k = keyed.clone();
            let third = thread::spawn(move || record(1, || k.try_acquire(&1)));
            let ops = [
                first.join().expect("no panic"),
                third.join().expect("no panic"),
            ];
            // Four permits, none refilled: both admitted, and the key (not
            // fresh) is kept by the sweep.
            assert_eq!(sweeper.join().expect("no panic"), 0);
            assert!(ops.iter().all(|op| op.result.is_ok()), "{ops:#?}");
        },
    );
}
