#![cfg(loom)]
//! loom models of `tollgate::TokenBucket`: its GCRA compare-and-swap loop, the
//! code that ships, model-checked through tollgate's sync facade.
//!
//! Every model moves a `ManualClock` inside the model, racing with the acquires,
//! records each request with its exact decision time, and after joining checks
//! the bucket's bound on every pair of admission times, linearizability against
//! sequential GCRA (exact retry-afters included) and an exact single-threaded
//! tail. `docs/verification.md` lists what each model explores and how long it
//! takes.

use std::time::Duration;

use loom::sync::Arc;
use loom::sync::atomic::{AtomicU64, Ordering};
use loom::thread;
use tollgate::keyed::{BucketConfig, Tunable};
use tollgate::{Clock, Denied, ManualClock, Rate, RateLimiter, TokenBucket};
use tollgate_loom_tests::{Op, RecordingClock, assert_bucket_bound, explore, record, verify_gcra};

/// Nanoseconds per permit: one permit per 10 ns.
const INTERVAL: u64 = 10;

fn nanos(ns: u64) -> Duration {
    Duration::from_nanos(ns)
}

/// A full bucket on a manual clock at 0, and a handle to move that clock.
fn bucket(capacity: u32) -> (Arc<TokenBucket<RecordingClock>>, ManualClock) {
    let clock = ManualClock::new();
    let bucket = TokenBucket::with_clock(
        capacity,
        Rate::new(1, nanos(INTERVAL)),
        RecordingClock::new(clock.clone()),
    )
    .expect("a valid configuration");
    assert_eq!(bucket.emission_interval(), nanos(INTERVAL));
    (Arc::new(bucket), clock)
}

/// Requests that can never be admitted, made while other threads race: they
/// must be rejected as such, without reading the clock or touching the state.
fn invalid_requests(bucket: &TokenBucket<RecordingClock>, capacity: u32) -> Vec<Op> {
    let ops = [0, capacity + 1, u32::MAX].map(|n| record(n, || bucket.try_acquire_n(n)));
    assert_eq!(ops[0].result, Err(Denied::ZeroPermits));
    for op in &ops[1..] {
        assert_eq!(
            op.result,
            Err(Denied::ExceedsCapacity {
                requested: op.n,
                capacity
            })
        );
    }
    ops.to_vec()
}

#[test]
fn two_threads_two_acquires_with_concurrent_advance() {
    let explored = explore(
        "token_bucket::two_threads_two_acquires_with_concurrent_advance",
        3,
        || {
            const CAPACITY: u32 = 2;
            let (bucket, clock) = bucket(CAPACITY);

            let (b, c) = (bucket.clone(), clock.clone());
            let advancer = thread::spawn(move || {
                let mut ops = vec![record(1, || b.try_acquire())];
                c.advance(nanos(INTERVAL));
                ops.push(record(1, || b.try_acquire()));
                ops
            });
            let b = bucket.clone();
            let racer = thread::spawn(move || {
                let mut ops = vec![record(1, || b.try_acquire()), record(1, || b.try_acquire())];
                ops.extend(invalid_requests(&b, CAPACITY));
                ops
            });

            let threads = vec![advancer.join().unwrap(), racer.join().unwrap()];
            // Four single permits against a full bucket of two and one refill: two
            // or three admissions, never four, in every interleaving.
            let admitted: u32 = threads
                .iter()
                .flatten()
                .filter(|op| op.result.is_ok())
                .map(|op| op.n)
                .sum();
            assert!(
                (2..=3).contains(&admitted),
                "{admitted} admitted: {threads:#?}"
            );
            verify_gcra(&*bucket, &clock, CAPACITY, INTERVAL, threads);
        },
    );
    assert!(explored > 1);
}

#[test]
fn dedicated_clock_thread_ticks_while_two_threads_acquire_twice() {
    let explored = explore(
        "token_bucket::dedicated_clock_thread_ticks_while_two_threads_acquire_twice",
        3,
        || {
            const CAPACITY: u32 = 1;
            let (bucket, clock) = bucket(CAPACITY);

            let acquirers: Vec<_> = (0..2)
                .map(|_| {
                    let b = bucket.clone();
                    thread::spawn(move || {
                        vec![record(1, || b.try_acquire()), record(1, || b.try_acquire())]
                    })
                })
                .collect();
            let c = clock.clone();
            // 0 → 6 → 12: one refill becomes due on the second tick, part of one
            // on the first, while the four acquires race.
            let ticker = thread::spawn(move || {
                c.advance(nanos(6));
                c.advance(nanos(6));
            });

            let threads: Vec<_> = acquirers.into_iter().map(|h| h.join().unwrap()).collect();
            ticker.join().unwrap();
            verify_gcra(&*bucket, &clock, CAPACITY, INTERVAL, threads);
        },
    );
    assert!(explored > 1);
}

#[test]
fn three_threads_acquire_n_mixed_with_acquire() {
    let explored = explore(
        "token_bucket::three_threads_acquire_n_mixed_with_acquire",
        3,
        || {
            const CAPACITY: u32 = 2;
            let (bucket, clock) = bucket(CAPACITY);

            let b = bucket.clone();
            let pair = thread::spawn(move || vec![record(2, || b.try_acquire_n(2))]);
            let b = bucket.clone();
            let single = thread::spawn(move || vec![record(1, || b.try_acquire())]);
            let (b, c) = (bucket.clone(), clock.clone());
            let advancer = thread::spawn(move || {
                c.advance(nanos(INTERVAL));
                vec![record(1, || b.try_acquire())]
            });

            let threads = vec![
                pair.join().unwrap(),
                single.join().unwrap(),
                advancer.join().unwrap(),
            ];
            verify_gcra(&*bucket, &clock, CAPACITY, INTERVAL, threads);
        },
    );
    assert!(explored > 1);
}

#[test]
fn demand_within_capacity_is_all_admitted() {
    let explored = explore(
        "token_bucket::demand_within_capacity_is_all_admitted",
        3,
        || {
            const CAPACITY: u32 = 3;
            const STEP: u64 = INTERVAL / 2;
            let (bucket, clock) = bucket(CAPACITY);

            let b = bucket.clone();
            let first = thread::spawn(move || vec![record(1, || b.try_acquire())]);
            let (b, c) = (bucket.clone(), clock.clone());
            let advancer = thread::spawn(move || {
                c.advance(nanos(STEP));
                vec![record(1, || b.try_acquire())]
            });

            let threads = vec![first.join().unwrap(), advancer.join().unwrap()];
            // A reading that is STEP older than an admission already stored loses
            // up to STEP of refill (it is treated as a clock that stepped back), so
            // the demand that must always fit is what the bucket holds minus STEP:
            // 2 permits, 2·INTERVAL + STEP <= 3·INTERVAL. Any denial is spurious.
            for op in threads.iter().flatten() {
                assert_eq!(op.result, Ok(()), "spurious denial: {threads:#?}");
            }
            verify_gcra(&*bucket, &clock, CAPACITY, INTERVAL, threads);
        },
    );
    assert!(explored > 1);
}

#[test]
fn clock_stepping_back_races_with_acquires() {
    let explored = explore(
        "token_bucket::clock_stepping_back_races_with_acquires",
        3,
        || {
            const CAPACITY: u32 = 2;
            let (bucket, clock) = bucket(CAPACITY);

            let b = bucket.clone();
            let twice = thread::spawn(move || {
                vec![record(1, || b.try_acquire()), record(1, || b.try_acquire())]
            });
            let b = bucket.clone();
            let pair = thread::spawn(move || vec![record(2, || b.try_acquire_n(2))]);
            let c = clock.clone();
            let stepper = thread::spawn(move || {
                c.set(3 * INTERVAL);
                // Back by more than a refill: readings of 3·INTERVAL and of
                // INTERVAL race with the acquires in both orders.
                c.set(INTERVAL);
            });

            let threads = vec![twice.join().unwrap(), pair.join().unwrap()];
            stepper.join().unwrap();
            verify_gcra(&*bucket, &clock, CAPACITY, INTERVAL, threads);
        },
    );
    assert!(explored > 1);
}

/// The racy bucket of a read-then-write design (the Redis token bucket of
/// Jianfeng Fu's "Throttling Solutions in Standalone and Distributed
/// Scenarios", §4.3, reads with HGETALL and writes back with HMSET): decide on
/// a loaded TAT, then `store` the new one instead of compare-and-swapping it, so two racing admissions can both
/// decide on the same TAT and one of them is lost.
struct CheckThenStoreBucket {
    tat: AtomicU64,
    capacity: u32,
    clock: RecordingClock,
}

impl CheckThenStoreBucket {
    fn try_acquire(&self) -> Result<(), Denied> {
        let now = self.clock.now();
        let tat = self.tat.load(Ordering::SeqCst);
        let next = tat.max(now) + INTERVAL;
        let limit = now + u64::from(self.capacity) * INTERVAL;
        if next <= limit {
            self.tat.store(next, Ordering::SeqCst);
            Ok(())
        } else {
            Err(Denied::RetryAfter(nanos(next - limit)))
        }
    }
}

/// The same bound that every model above asserts must catch the broken bucket:
/// this proves the models can fail.
#[test]
#[should_panic(expected = "token bucket invariant violated")]
fn known_bad_check_then_store_bucket_is_caught() {
    explore(
        "token_bucket::known_bad_check_then_store_bucket_is_caught",
        3,
        || {
            const CAPACITY: u32 = 1;
            let clock = ManualClock::new();
            let bucket = Arc::new(CheckThenStoreBucket {
                tat: AtomicU64::new(0),
                capacity: CAPACITY,
                clock: RecordingClock::new(clock.clone()),
            });
            let handles: Vec<_> = (0..2)
                .map(|_| {
                    let b = bucket.clone();
                    thread::spawn(move || vec![record(1, || b.try_acquire())])
                })
                .collect();
            let threads: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
            assert_bucket_bound(CAPACITY, INTERVAL, &threads);
        },
    );
}

/// `try_acquire_with_snapshot` reports the word its own compare-and-swap
/// wrote: with time frozen, three racing admissions from a bucket of 3 report
/// 2, 1 and 0 permits left, each once, in every interleaving. A report read
/// after the decision (a second load) could show two threads the same figure.
#[test]
fn racing_reports_are_the_words_each_admission_wrote() {
    let explored = explore(
        "token_bucket::racing_reports_are_the_words_each_admission_wrote",
        3,
        || {
            let (bucket, _clock) = bucket(3);
            racing_reports(bucket);
        },
    );
    assert!(explored > 1);
}

/// The same through the keyed layer's decision path (`Tunable`: the record,
/// the tagged word, the report from the admission's receipt).
#[test]
fn racing_keyed_reports_are_the_words_each_admission_wrote() {
    let explored = explore(
        "token_bucket::racing_keyed_reports_are_the_words_each_admission_wrote",
        3,
        || {
            let config =
                BucketConfig::new(3, Rate::new(1, nanos(INTERVAL))).expect("a valid configuration");
            let tunable = Tunable::<TokenBucket<RecordingClock>>::with_clock(
                config,
                RecordingClock::new(ManualClock::new()),
            );
            racing_reports(Arc::new(tunable));
        },
    );
    assert!(explored > 1);
}

/// Two threads take the three permits of a full bucket, frozen at time 0,
/// through `try_acquire_with_snapshot`; see the models above.
fn racing_reports<L: RateLimiter + Send + Sync + 'static>(bucket: Arc<L>) {
    let b = bucket.clone();
    let twice = thread::spawn(move || {
        [b.try_acquire_with_snapshot(), b.try_acquire_with_snapshot()]
            .map(|r| r.expect("3 permits for 3 requests").available)
    });
    let once = bucket
        .try_acquire_with_snapshot()
        .expect("3 permits")
        .available;
    let mut left = twice.join().unwrap().to_vec();
    left.push(once);
    left.sort_unstable();
    assert_eq!(left, [0, 1, 2]);
    let rejection = bucket.try_acquire_with_snapshot().unwrap_err();
    assert_eq!(rejection.denied, Denied::RetryAfter(nanos(INTERVAL)));
    assert_eq!(rejection.snapshot.available, 0);
}
