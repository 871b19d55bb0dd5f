#![cfg(loom)]
//! loom models of `tollgate::LeasedTokenBucket`: the GCRA word leasing runs of
//! its timeline to stripes, spends from the stripes, leases given back,
//! kept or forgotten — the code that ships, through tollgate's sync facade
//! (stripes and word are loom atomics, so weak-memory orders are explored too).
//!
//! Every model moves a `ManualClock` inside the model (forward, and back),
//! records each request with its exact decision time, and after joining checks
//! the bucket's bound on every pair of admission times, an exact
//! single-threaded tail (the limiter is neither loose nor stuck), the bound
//! again, and that once the clock passes everything leased the whole capacity
//! is available (no permit stays stranded). Linearizability against sequential
//! GCRA is *not* checked: a lease held by another stripe may deny what
//! sequential GCRA admits (under-admission, docs/algorithms.md).
//!
//! Stripe numbers under loom are the model threads' numbers masked: with two
//! stripes, the model's main thread (0) and the second spawned thread (2)
//! share stripe 0, the first spawned thread (1) has stripe 1.

use std::time::Duration;

use loom::sync::Arc;
use loom::sync::atomic::{AtomicU64, Ordering};
use tollgate::fault::{self, Fault};
use tollgate::{Clock, Denied, LeasedTokenBucket, ManualClock, Rate, RateLimiter};
use tollgate_loom_tests::Step::{self, By, Take, To};
use tollgate_loom_tests::{
    Ask, Op, RecordingClock, UntimedStripes, assert_bucket_bound, explore, explore_limiter, race,
    record, single_threaded_tail,
};

/// Nanoseconds per permit.
const INTERVAL: u64 = 10;

fn nanos(ns: u64) -> Duration {
    Duration::from_nanos(ns)
}

type Bucket = LeasedTokenBucket<RecordingClock>;

/// A full bucket with `stripes` stripes on a manual clock at 0, every request
/// through the stripes (as under contention: the lease protocol is what these
/// models are about; `direct_and_striped_requests_race` models the switch).
fn bucket(capacity: u32, stripes: usize) -> (Arc<Bucket>, ManualClock) {
    let (bucket, clock) = always_striped(|| new_bucket(capacity, stripes));
    (Arc::new(bucket), clock)
}

/// What `build` builds with `Fault::AlwaysStriped` on: a leased bucket that
/// sends every request through its stripes.
fn always_striped<T>(build: impl FnOnce() -> T) -> T {
    fault::inject(Fault::AlwaysStriped, true);
    let built = build();
    fault::inject(Fault::AlwaysStriped, false);
    built
}

/// As `bucket`, but as it ships: requests go straight to the word until a
/// thread loses a race for it.
fn adaptive_bucket(capacity: u32, stripes: usize) -> (Arc<Bucket>, ManualClock) {
    let (bucket, clock) = new_bucket(capacity, stripes);
    (Arc::new(bucket), clock)
}

fn new_bucket(capacity: u32, stripes: usize) -> (Bucket, ManualClock) {
    let clock = ManualClock::new();
    let bucket = LeasedTokenBucket::with_stripes(
        capacity,
        Rate::new(1, nanos(INTERVAL)),
        RecordingClock::new(clock.clone()),
        stripes,
    )
    .expect("a valid configuration");
    assert_eq!(bucket.stripes(), stripes);
    (bucket, clock)
}

/// The checks every model makes once its threads are joined (see the module docs).
fn verify(bucket: &Bucket, clock: &ManualClock, capacity: u32, mut threads: Vec<Vec<Op>>) {
    assert_bucket_bound(capacity, INTERVAL, &threads);
    threads.push(single_threaded_tail(clock, capacity, || {
        bucket.try_acquire()
    }));
    assert_bucket_bound(capacity, INTERVAL, &threads);
    // Every lease ends at or before the TAT, at most `capacity·INTERVAL` past
    // the latest reading: one capacity later, nothing is leased any more.
    clock.advance(nanos(u64::from(capacity) * INTERVAL));
    let full = record(capacity, || bucket.try_acquire_n(capacity));
    assert_eq!(
        full.result,
        Ok(()),
        "a permit stayed stranded: {threads:#?}"
    );
    threads.push(vec![full]);
    assert_bucket_bound(capacity, INTERVAL, &threads);
}

/// [`explore_limiter`] on a fresh bucket of `capacity` and `stripes` stripes
/// in every interleaving (see [`bucket`]), with [`verify`]'s checks.
fn explore_bucket(
    name: &str,
    preemption_bound: usize,
    (capacity, stripes): (u32, usize),
    model: impl Fn(&Arc<Bucket>, &ManualClock) -> Vec<Vec<Op>> + Sync + Send + 'static,
) {
    explore_limiter(
        name,
        preemption_bound,
        move || bucket(capacity, stripes),
        model,
        move |bucket, clock, threads| verify(bucket, clock, capacity, threads),
    );
}

/// Two stripes, two threads: the first leases a spare run on stripe 1 and
/// spends it while the second takes most of the bucket from the word and the
/// clock moves on (past the first lease's first slots), so spends race with
/// leases and with readings older than the slots they find.
#[test]
fn spends_race_with_leases_and_the_clock() {
    let name = "leased_token_bucket::spends_race_with_leases_and_the_clock";
    // Two stripes, capacity 16 (160 ns): leases end on multiples of 32 ns
    // (≤ 160 / (2·2)), so a single permit at 0 leases [10, 32).
    explore_bucket(name, 3, (16, 2), |bucket, clock| {
        let other: &[Step] = &[Take(12), By(INTERVAL + 5), Take(2)];
        race(bucket, clock, &[&[Take(1), Take(1)], other])
    });
}

/// The bucket as it ships: both threads start on the word's direct path. A
/// thread whose CAS on the word loses to the other's switches to the stripes
/// and leases, so direct admissions race with leases, spends and the clock.
#[test]
fn direct_and_striped_requests_race() {
    const CAPACITY: u32 = 16;
    explore_limiter(
        "leased_token_bucket::direct_and_striped_requests_race",
        3,
        || adaptive_bucket(CAPACITY, 2),
        |bucket, clock| {
            let other: &[Step] = &[Take(11), By(INTERVAL + 5), Take(2)];
            race(bucket, clock, &[&[Take(1), Take(1), Take(1)], other])
        },
        |bucket, clock, threads| verify(bucket, clock, CAPACITY, threads),
    );
}

/// One stripe shared by two threads: one takes the stripe's lease out (to give
/// it back, or to lease more) while the other finds the stripe empty, leases
/// after it, and installs its own spare slots first — so leases are given
/// back, kept, returned to the word or forgotten, in every order.
#[test]
fn a_shared_stripe_gives_back_keeps_and_forgets() {
    let name = "leased_token_bucket::a_shared_stripe_gives_back_keeps_and_forgets";
    // One stripe, capacity 8 (80 ns): leases end on multiples of 32 ns
    // (≤ 80 / 2), so a single permit at 0 leases [10, 32).
    explore_bucket(name, 3, (8, 1), |bucket, clock| {
        let second: &[Step] = &[Take(1), By(INTERVAL), Take(1)];
        race(bucket, clock, &[&[Take(1), Take(2)], second])
    });
}

/// Slots that time has passed are expired: a lease `[10, 32)` taken at 0 on
/// stripe 1 must not be spent at 100, where stripe 0 has just taken the full
/// capacity from the word (17 admissions at 100 if it were).
#[test]
fn expired_lease_slots_are_not_spent() {
    let name = "leased_token_bucket::expired_lease_slots_are_not_spent";
    // Two stripes, capacity 16: a single permit at 0 leases [10, 32).
    explore_bucket(name, 3, (16, 2), |bucket, clock| {
        let leaser: &[Step] = &[Take(1), To(10 * INTERVAL), Take(1)];
        race(bucket, clock, &[leaser, &[Take(16)]])
    });
}

/// A stale or backwards reading must not spend a slot more than `τ` ahead of
/// it: a lease taken at 100 (`[110, 128)`) must not be spent at a reading of
/// 0, where the whole capacity was admitted already (one stripe, shared).
#[test]
fn clock_stepping_back_cannot_spend_leases_early() {
    let name = "leased_token_bucket::clock_stepping_back_cannot_spend_leases_early";
    // One stripe, capacity 8: a single permit at 100 leases [110, 128).
    explore_bucket(name, 3, (8, 1), |bucket, clock| {
        let stepper: &[Step] = &[To(10 * INTERVAL), Take(1), To(0), Take(1)];
        race(bucket, clock, &[stepper, &[Take(8)]])
    });
}

/// A denied request gives its stripe's lease back only if nothing was leased
/// after it: stripe 1 holds `[10, 32)` and is denied 16 permits at 0 (giving
/// the lease back), racing stripe 0's admission of 12 from the word. Giving
/// back over stripe 0's admission would hand its slots out again (the tail
/// then admits 15 more at 0).
#[test]
fn a_denial_gives_back_only_an_unfollowed_lease() {
    let name = "leased_token_bucket::a_denial_gives_back_only_an_unfollowed_lease";
    explore_bucket(name, 3, (16, 2), |bucket, clock| {
        race(bucket, clock, &[&[Take(1), Take(16)], &[Take(12)]])
    });
}

/// A run used up exactly is gone: with 8 ns per permit a single permit at 0
/// leases `[8, 32)` on stripe 1 and three more use it up exactly; the stripe
/// must then read empty, not `[32, 64)` — a run never taken from the word,
/// which stripe 0 is taking at the same time (17 admissions at 0 if it were).
#[test]
fn a_used_up_run_leaves_the_stripe_empty() {
    // Capacity 16 of 8 ns: runs end on multiples of 32 ns (≤ 128 / 4).
    const CAPACITY: u32 = 16;
    explore_limiter(
        "leased_token_bucket::a_used_up_run_leaves_the_stripe_empty",
        3,
        || {
            let clock = ManualClock::new();
            let bucket = Arc::new(always_striped(|| {
                LeasedTokenBucket::with_stripes(
                    CAPACITY,
                    Rate::new(1, nanos(8)),
                    RecordingClock::new(clock.clone()),
                    2,
                )
                .expect("a valid configuration")
            }));
            (bucket, clock)
        },
        |bucket, clock| race(bucket, clock, &[&[Take(1); 5], &[Take(12)]]),
        |_, _, threads| assert_bucket_bound(CAPACITY, 8, &threads),
    );
}

/// The lease without its time bound: a stripe keeps a *count* of leased
/// permits and spends it at any reading. A permit leased at 0 and spent at
/// 100, beside a full bucket's worth taken from the word at 100, puts
/// `capacity + 1` admissions at time 100. The bound the models above assert
/// must catch it: this proves they can fail.
#[test]
#[should_panic(expected = "token bucket invariant violated")]
fn known_bad_untimed_lease_is_caught() {
    explore(
        "leased_token_bucket::known_bad_untimed_lease_is_caught",
        2,
        || {
            const CAPACITY: u32 = 2;
            let clock = ManualClock::new();
            let bucket = Arc::new(UntimedLeases {
                tat: AtomicU64::new(0),
                stripes: UntimedStripes::default(),
                capacity: CAPACITY,
                clock: RecordingClock::new(clock.clone()),
            });
            let leaser: &[Step] = &[Take(1), To(100), Take(1)];
            let threads = race(&bucket, &clock, &[leaser, &[Take(2)]]);
            assert_bucket_bound(CAPACITY, INTERVAL, &threads);
        },
    );
}

/// A leased bucket whose stripes hold a count of permits with no time bound:
/// spend while the count lasts; otherwise lease every slot the GCRA word
/// grants, spend `n` and keep the rest.
struct UntimedLeases {
    tat: AtomicU64,
    stripes: UntimedStripes,
    capacity: u32,
    clock: RecordingClock,
}

impl Ask for UntimedLeases {
    fn ask(&self, n: u32) -> Result<(), Denied> {
        let now = self.clock.now();
        let n = u64::from(n);
        if self.stripes.spend(n) {
            return Ok(());
        }
        let limit = now + u64::from(self.capacity) * INTERVAL;
        let mut tat = self.tat.load(Ordering::SeqCst);
        loop {
            let start = tat.max(now);
            if start + n * INTERVAL > limit {
                return Err(Denied::RetryAfter(nanos(start + n * INTERVAL - limit)));
            }
            let slots = (limit - start) / INTERVAL;
            match self.tat.compare_exchange(
                tat,
                start + slots * INTERVAL,
                Ordering::SeqCst,
                Ordering::SeqCst,
            ) {
                Ok(_) => {
                    self.stripes.keep(slots - n);
                    return Ok(());
                }
                Err(actual) => tat = actual,
            }
        }
    }
}
