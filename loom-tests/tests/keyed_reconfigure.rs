#![cfg(loom)]
//! loom model of `Keyed::reconfigure` racing itself and a request decided by
//! the overflow state (a key that finds the map at its cap), through the
//! shipped keyed code and map.
//!
//! A reconfiguration publishes its record, then carries every state over to
//! it: the map's, one shard at a time under its write lock, then the
//! overflow state, outside any lock; then it marks the record complete. The
//! tag of a state alternates between records, so a state still tagged for
//! the record two back would pass for one of the newest: a reconfiguration
//! must not publish its successor before its predecessor's carry-over is
//! complete *and visible to it* — the mark's Release and its reader's
//! Acquire (`kind::reconfig::Record::is_complete`). A request decided by the
//! overflow state takes no lock the carry-over released after settling the
//! overflow, so that pairing is all that orders the two; for the map's
//! states the shard locks order them anyway.
//!
//! The race: the overflow has used its 1 permit under the first record
//! (limit 1); one thread reconfigures to limit 5 with `Carry::Reset`,
//! another to limit 5 with a reset again, and a request asks for 5 through the overflow.
//! Decided under the first record it can never fit; under either later one
//! the overflow holds nothing (the reset), so it is admitted. A refusal to
//! wait (a retry-after) means it was decided on the first record's state
//! taken for the newest's.

use std::collections::hash_map::DefaultHasher;
use std::hash::BuildHasherDefault;
use std::time::Duration;

use loom::sync::Arc;
use loom::thread;
use tollgate::keyed::{Carry, Keyed, WindowConfig};
use tollgate::{Denied, FixedWindow, ManualClock, Rate};
use tollgate_loom_tests::explore_races;

/// A fixed hasher: loom replays each execution, so the keys' shards must not
/// change from one to the next.
type Fixed = BuildHasherDefault<DefaultHasher>;

fn window(limit: u32) -> WindowConfig {
    WindowConfig::new(Rate::new(limit, Duration::from_secs(3_600))).expect("a valid configuration")
}

fn race() {
    let keyed = Keyed::<u64, FixedWindow<ManualClock>, Fixed>::with_clock_and_hasher(
        window(1),
        ManualClock::new(),
        Fixed::default(),
    )
    .with_max_keys(1);
    // Key 0 takes the one place; key 1 is decided by the overflow state,
    // which now holds its one permit.
    keyed.try_acquire(&0).expect("a fresh key");
    keyed.try_acquire(&1).expect("a fresh overflow");
    let keyed = Arc::new(keyed);

    let k = keyed.clone();
    let first = thread::spawn(move || k.reconfigure(window(5), Carry::Reset));
    let k = keyed.clone();
    let second = thread::spawn(move || k.reconfigure(window(5), Carry::Reset));
    let asked = keyed.try_acquire_n(&1, 5);
    first.join().expect("no panic");
    second.join().expect("no panic");
    assert!(
        !matches!(asked, Err(Denied::RetryAfter(_))),
        "decided on a state of the first record taken for the newest: {asked:?}"
    );
}

#[test]
fn a_reconfiguration_waits_for_the_carry_over_before_it() {
    explore_races(
        "keyed_reconfigure::a_reconfiguration_waits_for_the_carry_over_before_it",
        2,
        race,
    );
}
