//! Small, threaded workouts of every `unsafe` path of the keyed layer, sized to
//! run under Miri (`cargo +nightly miri test --test keyed_miri`): the epoch
//! protected configuration records (pin, compare-and-swap, deferred
//! destruction, drop) of `Tunable`, overrides and the keyed default; the
//! records read while a shard is held for reading; and the keyed map's
//! `unsafe` (its tables in cells, read by biased readers through their slots
//! or under the read lock, written under the write lock by inserts and the
//! eviction sweep). A `ManualClock` throughout:
//! the TSC clock's CPUID does not run under Miri. Under plain `cargo test` the
//! same tests run as quick smoke tests.

use std::sync::Arc;
use std::time::Duration;

use tollgate::keyed::{BucketConfig, Carry, Keyed, Tunable, WindowConfig};
use tollgate::{FixedWindow, ManualClock, Rate, RateLimiter, TokenBucket};

type Bucket = TokenBucket<ManualClock>;

fn bucket(capacity: u32) -> BucketConfig {
    BucketConfig::new(capacity, Rate::new(capacity, Duration::from_millis(10))).unwrap()
}

const ROUNDS: u32 = if cfg!(miri) { 8 } else { 200 };

#[test]
fn tunable_reconfigures_while_threads_acquire() {
    let clock = ManualClock::new();
    let limiter = Arc::new(Tunable::<(Bucket, FixedWindow<ManualClock>)>::with_clock(
        (bucket(4), WindowConfig::new(Rate::per_second(3)).unwrap()),
        clock.clone(),
    ));
    let worker = {
        let limiter = Arc::clone(&limiter);
        std::thread::spawn(move || {
            for i in 0..ROUNDS * 4 {
                let _ = limiter.try_acquire_n(1 + i % 2);
                let _ = limiter.snapshot();
            }
        })
    };
    for i in 0..ROUNDS {
        let window = WindowConfig::new(Rate::per_second(2 + i % 3)).unwrap();
        limiter.reconfigure(
            (bucket(2 + i % 5), window),
            [Carry::Proportional, Carry::Additive, Carry::Reset][i as usize % 3],
        );
        clock.advance(Duration::from_millis(3));
    }
    worker.join().unwrap();
    assert_eq!(limiter.config().0, bucket(2 + (ROUNDS - 1) % 5));
}

#[test]
fn keyed_sweeps_overrides_and_reconfigurations_race_requests() {
    let clock = ManualClock::new();
    let keyed =
        Arc::new(Keyed::<String, Bucket>::with_clock(bucket(2), clock.clone()).with_max_keys(16));
    let worker = {
        let keyed = Arc::clone(&keyed);
        std::thread::spawn(move || {
            for i in 0..ROUNDS * 8 {
                let key = format!("k{}", i % 24); // more keys than the cap
                let _ = keyed.try_acquire(key.as_str());
                let _ = keyed.snapshot(key.as_str());
            }
        })
    };
    for i in 0..ROUNDS {
        match i % 4 {
            0 => keyed.reconfigure(bucket(1 + i % 3), Carry::Proportional),
            1 => keyed.set_override(format!("k{}", i % 24), bucket(5), Carry::Additive),
            2 => {
                keyed.remove_override(format!("k{}", (i + 23) % 24).as_str());
            }
            _ => {
                keyed.sweep();
            }
        }
        clock.advance(Duration::from_millis(7));
    }
    worker.join().unwrap();
    assert!(keyed.len() <= 16);
    clock.advance(Duration::from_secs(1));
    keyed.sweep();
    keyed.shrink_to_fit();
    assert_eq!(keyed.len(), 0);
}
