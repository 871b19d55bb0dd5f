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

use loom::sync::Arc;
use loom::sync::atomic::{AtomicU64, Ordering};
use loom::thread;
use tollgate::keyed::{BucketConfig, Tunable};
use tollgate::{Clock, Denied, ManualClock, Rate, RateLimiter, TokenBucket};
use tollgate_loom_tests::Step::Take;
use tollgate_loom_tests::{
    Ask,
    Move::{By, To},
    RecordingClock, Subject, advance_between_acquires, assert_all_admitted, assert_bucket_bound,
    explore, explore_races, nanos, on_manual_clock, race, race_a_moving_clock, race_an_advance,
    verify_gcra, with_manual_clock,
};

/// Nanoseconds per permit: one permit per 10 ns.
const INTERVAL: u64 = 10;

/// The bucket as the shared model shapes run it, checked as GCRA.
const BUCKET: Subject<TokenBucket<RecordingClock>> = Subject {
    build: bucket,
    verify: |bucket, clock, capacity, threads| {
        verify_gcra(bucket, clock, capacity, INTERVAL, threads)
    },
};

/// A full bucket on a manual clock at 0, and a handle to move that clock.
fn bucket(capacity: u32) -> (Arc<TokenBucket<RecordingClock>>, ManualClock) {
    let (bucket, clock) = on_manual_clock(|clock| {
        TokenBucket::with_clock(capacity, Rate::new(1, nanos(INTERVAL)), clock)
    });
    assert_eq!(bucket.emission_interval(), nanos(INTERVAL));
    (bucket, clock)
}

#[test]
fn two_threads_two_acquires_with_concurrent_advance() {
    let name = "token_bucket::two_threads_two_acquires_with_concurrent_advance";
    BUCKET.explore(name, 3, 2, |bucket, clock| {
        let threads = advance_between_acquires(bucket, clock, 2, INTERVAL);
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
        threads
    });
}

#[test]
fn dedicated_clock_thread_ticks_while_two_threads_acquire_twice() {
    let name = "token_bucket::dedicated_clock_thread_ticks_while_two_threads_acquire_twice";
    BUCKET.explore(name, 3, 1, |bucket, clock| {
        // 0 → 6 → 12: one refill becomes due on the second tick, part of one
        // on the first, while the four acquires race.
        race_a_moving_clock(bucket, clock, &[&[1, 1], &[1, 1]], &[By(6), By(6)])
    });
}

#[test]
fn three_threads_acquire_n_mixed_with_acquire() {
    let name = "token_bucket::three_threads_acquire_n_mixed_with_acquire";
    BUCKET.explore(name, 3, 2, |bucket, clock| {
        race_an_advance(bucket, clock, &[&[2], &[1]], INTERVAL, &[1])
    });
}

#[test]
fn demand_within_capacity_is_all_admitted() {
    const STEP: u64 = INTERVAL / 2;
    let name = "token_bucket::demand_within_capacity_is_all_admitted";
    BUCKET.explore(name, 3, 3, |bucket, clock| {
        let threads = race_an_advance(bucket, clock, &[&[1]], STEP, &[1]);
        // A reading that is STEP older than an admission already stored loses
        // up to STEP of refill (it is treated as a clock that stepped back), so
        // the demand that must always fit is what the bucket holds minus STEP:
        // 2 permits, 2·INTERVAL + STEP <= 3·INTERVAL.
        assert_all_admitted(&threads);
        threads
    });
}

#[test]
fn clock_stepping_back_races_with_acquires() {
    let name = "token_bucket::clock_stepping_back_races_with_acquires";
    BUCKET.explore(name, 3, 2, |bucket, clock| {
        // Back by more than a refill: readings of 3·INTERVAL and of INTERVAL
        // race with the acquires in both orders.
        race_a_moving_clock(
            bucket,
            clock,
            &[&[1, 1], &[2]],
            &[To(3 * INTERVAL), To(INTERVAL)],
        )
    });
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

impl Ask for CheckThenStoreBucket {
    /// Single permits only: the model asks for no more.
    fn ask(&self, n: u32) -> Result<(), Denied> {
        assert_eq!(n, 1);
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
            let (bucket, clock) = with_manual_clock(|clock| CheckThenStoreBucket {
                tat: AtomicU64::new(0),
                capacity: CAPACITY,
                clock,
            });
            let threads = race(&bucket, &clock, &[&[Take(1)], &[Take(1)]]);
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
    explore_races(
        "token_bucket::racing_reports_are_the_words_each_admission_wrote",
        3,
        || {
            let (bucket, _clock) = bucket(3);
            racing_reports(bucket);
        },
    );
}

/// The same through the keyed layer's decision path (`Tunable`: the record,
/// the tagged word, the report from the admission's receipt).
#[test]
fn racing_keyed_reports_are_the_words_each_admission_wrote() {
    explore_races(
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
