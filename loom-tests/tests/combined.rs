#![cfg(loom)]
//! loom models of combined limits (`tollgate::keyed::combined`) with the clock
//! moving inside the model, so a request can decide at a reading older than a
//! later request's: the refund a denied request makes to the parts that
//! admitted it must never hand out a permit that a later admission holds.
//!
//! (The frozen-time models of combined refunds and of a pair racing a
//! reconfiguration are in `reconfigure.rs`.)

use std::time::Duration;

use loom::sync::Arc;
use loom::thread;
use tollgate::keyed::{BucketConfig, Tunable};
use tollgate::{ManualClock, Rate, RateLimiter, TokenBucket};
use tollgate_loom_tests::{Op, RecordingClock, assert_bucket_bound, explore_races, record};

type Bucket = TokenBucket<RecordingClock>;

/// Capacity 1, one permit per 100 ns: the part that admits the stale request.
const FIRST: (u32, u64) = (1, 100);
/// Capacity 2, one permit per 1000 ns: the part that denies it.
const SECOND: (u32, u64) = (2, 1_000);

fn config((capacity, interval): (u32, u64)) -> BucketConfig {
    BucketConfig::new(capacity, Rate::new(1, Duration::from_nanos(interval)))
        .expect("a valid configuration")
}

/// Issue 17, item 1. A request reads 200 and is admitted by the first part
/// (TAT 300); the clock moves to 2000 and a request there finds the first part
/// full, resets it (TAT 2100) and is admitted by both; the stale request is
/// then denied by the second part and refunds the first. The old refund gave
/// back `min(n·I, written − now) = 100` ns at its stale reading, handing out
/// the permit the request at 2000 holds: a third request at 2000 was admitted,
/// 2 permits at one instant from a bucket of 1. Both parts' bounds are checked
/// on every admission by its exact decision time.
#[test]
fn combined_refund_at_a_stale_reading() {
    explore_races("combined::refund_at_a_stale_reading", 2, || {
        let clock = ManualClock::new();
        let pair = Arc::new(Tunable::<(Bucket, Bucket)>::with_clock(
            (config(FIRST), config(SECOND)),
            RecordingClock::new(clock.clone()),
        ));
        // Before the threads: one admission at 0 and one at 100 (the second
        // part is then in debt until 2000).
        let mut setup: Vec<Op> = Vec::new();
        for at in [0, 100] {
            clock.set(at);
            let op = record(1, || pair.try_acquire_n(1));
            assert!(op.result.is_ok(), "setup at {at}: {op:?}");
            setup.push(op);
        }
        clock.set(200);
        let stale = {
            let pair = Arc::clone(&pair);
            thread::spawn(move || vec![record(1, || pair.try_acquire_n(1))])
        };
        let later = {
            let pair = Arc::clone(&pair);
            let clock = clock.clone();
            thread::spawn(move || {
                clock.set(2_000);
                (0..2)
                    .map(|_| record(1, || pair.try_acquire_n(1)))
                    .collect::<Vec<_>>()
            })
        };
        let threads = vec![
            setup,
            stale.join().expect("no panic"),
            later.join().expect("no panic"),
        ];
        assert_bucket_bound(FIRST.0, FIRST.1, &threads);
        assert_bucket_bound(SECOND.0, SECOND.1, &threads);
    });
}
