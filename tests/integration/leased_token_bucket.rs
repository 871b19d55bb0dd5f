//! The leased token bucket: decision for decision against its locking twin
//! (`LockingTokenBucket`) and the independent reference on one thread; the
//! bound and liveness on random sequences spread over several threads'
//! stripes; lock-step stress with recorded admissions and the under-admission
//! figure (`-- --nocapture` prints it); odd inputs and a clock that steps back.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use support::{
    Admission, Op, ReferenceTokenBucket, STRESS_ATTEMPTS, STRESS_THREADS, Workers, admitted_at,
    assert_agree, assert_odd_sizes_denied, assert_twins_agree, bucket_config, check_token_bucket,
    demanded_and_got, expected_per_round, leased_stress_rounds, op_steps, op_times,
    ops_stepping_back, replay_on_workers, round_times, scaled_to, stress_mode, without_steps_back,
};
use tollgate::{Denied, LeasedTokenBucket, LockingTokenBucket, ManualClock, Rate, RateLimiter};

/// Operations for a 3 µs interval (scaled to the bucket's by `scaled_to`):
/// steps of up to three intervals, and back by up to two.
fn ops() -> impl Strategy<Value = Vec<Op>> {
    ops_stepping_back(10, 9_000, 4, 6_000)
}

/// The rate of `permits` a `period` ns, a clock, the locking twin of
/// `capacity` on it and the twin's emission interval in ns.
fn twin_on_a_clock(
    capacity: u32,
    permits: u32,
    period: u64,
) -> (Rate, ManualClock, LockingTokenBucket<ManualClock>, u64) {
    let rate = Rate::new(permits, Duration::from_nanos(period));
    let clock = ManualClock::new();
    let twin = LockingTokenBucket::with_clock(capacity, rate, clock.clone()).unwrap();
    let interval = twin.emission_interval().as_nanos() as u64;
    (rate, clock, twin, interval)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// On one thread the leased bucket (1 stripe and 4), the twin and the
    /// reference make identical decisions, retry-afters to the nanosecond, and
    /// report identical snapshots; what they admit keeps the bound.
    #[test]
    fn leased_twin_and_reference_agree(
        (capacity, permits, period) in bucket_config(),
        seed_ops in ops(),
    ) {
        let (rate, clock, twin, interval) = twin_on_a_clock(capacity, permits, period);
        let one = LeasedTokenBucket::with_stripes(capacity, rate, clock.clone(), 1).unwrap();
        let four = LeasedTokenBucket::with_stripes(capacity, rate, clock.clone(), 4).unwrap();
        let mut reference = ReferenceTokenBucket::new(capacity, permits, period);
        let steps = op_steps(&without_steps_back(seed_ops), scaled_to(interval));
        let admissions =
            assert_agree(&steps, &clock, &[&one, &four, &twin], &mut reference);
        check_token_bucket(&admissions, capacity, permits, period);
    }

    /// With the clock stepping back too, the leased bucket and the twin still
    /// agree decision for decision and snapshot for snapshot.
    #[test]
    fn leased_and_twin_agree_when_time_steps_back(
        (capacity, permits, period) in bucket_config(),
        seed_ops in ops(),
    ) {
        let (rate, clock, twin, interval) = twin_on_a_clock(capacity, permits, period);
        let leased = LeasedTokenBucket::with_clock(capacity, rate, clock.clone()).unwrap();
        let times = op_times(&seed_ops, scaled_to(interval));
        assert_twins_agree(&leased, &twin, &clock, &seed_ops, &times, |_| false)?;
    }

    /// Requests from three threads (three stripes), interleaved in a random
    /// but fixed order, clock moving forward and back: what is admitted keeps
    /// the bound, and once the clock passes everything leased the whole
    /// capacity is available again from any thread (no permit stays stranded).
    #[test]
    fn spread_over_stripes_keeps_the_bound_and_recovers(
        (capacity, permits, period) in bucket_config(),
        seed_ops in ops(),
        who in proptest::collection::vec(0..3usize, 200),
    ) {
        let rate = Rate::new(permits, Duration::from_nanos(period));
        let clock = ManualClock::new();
        let leased = Arc::new(LeasedTokenBucket::with_stripes(capacity, rate, clock.clone(), 8).unwrap());
        let workers = Workers::new(leased.clone(), 3);
        let interval = leased.emission_interval().as_nanos() as u64;
        let times = op_times(&seed_ops, scaled_to(interval));
        let (admissions, latest) =
            replay_on_workers(&workers, &clock, &seed_ops, &times, &who, capacity)?;
        check_token_bucket(&admissions, capacity, permits, period);
        // Every lease ends at or before the word's TAT, which is at most
        // `latest + capacity·interval`: past that, nothing is leased.
        clock.set(latest + u64::from(capacity) * interval);
        for thread in 0..3 {
            prop_assert_eq!(leased.snapshot().available, capacity);
            prop_assert_eq!(workers.acquire(thread, capacity), Ok(()));
            prop_assert!(workers.acquire(thread, 1).is_err());
            clock.set(clock_now(&clock) + u64::from(capacity) * interval);
        }
    }
}

fn clock_now(clock: &ManualClock) -> u64 {
    use tollgate::Clock;
    clock.now()
}

#[test]
fn odd_request_sizes_never_panic() {
    let clock = ManualClock::new();
    for capacity in [1, 7, u32::MAX] {
        let bucket =
            LeasedTokenBucket::with_clock(capacity, Rate::per_second(1), clock.clone()).unwrap();
        assert_odd_sizes_denied(&bucket, capacity);
        assert_eq!(bucket.try_acquire_n(capacity), Ok(()));
        assert!(matches!(bucket.try_acquire(), Err(Denied::RetryAfter(_))));
    }
    // The largest configuration: u32::MAX permits of the longest interval
    // that fits the time range, asked for all at once, at the end of time.
    let rate = Rate::new(1, Duration::from_nanos((1 << 62) / u64::from(u32::MAX)));
    let bucket = LeasedTokenBucket::with_clock(u32::MAX, rate, clock.clone()).unwrap();
    clock.set(u64::MAX);
    assert_eq!(bucket.try_acquire_n(u32::MAX), Ok(()));
    assert!(bucket.try_acquire_n(u32::MAX).is_err());
    let _ = bucket.snapshot();
}

#[test]
fn reports_what_the_twin_reports_on_one_thread() {
    let clock = ManualClock::new();
    let rate = Rate::per_second(10);
    let leased = LeasedTokenBucket::with_clock(10, rate, clock.clone()).unwrap();
    let twin = LockingTokenBucket::with_clock(10, rate, clock.clone()).unwrap();
    for (step, n) in [
        (0, 4),
        (0, 7),
        (50, 1),
        (100, 6),
        (0, 0),
        (0, 11),
        (1000, 10),
    ] {
        clock.advance(Duration::from_millis(step));
        assert_eq!(
            leased.try_acquire_n_with_snapshot(n),
            twin.try_acquire_n_with_snapshot(n),
            "n = {n}"
        );
    }
}

#[test]
fn never_over_admits_when_time_steps_back() {
    // A lease taken at 100 ms must not be spent at a reading 90 ms older.
    const MS: u64 = 1_000_000;
    let clock = ManualClock::new();
    let rate = Rate::new(1, Duration::from_millis(10));
    let bucket = LeasedTokenBucket::with_clock(4, rate, clock.clone()).unwrap();
    let mut admissions = Vec::new();
    for (at, n) in [
        (0, 1),
        (100, 1),
        (10, 1),
        (10, 3),
        (100, 3),
        (95, 1),
        (0, 1),
        (130, 4),
    ] {
        clock.set(at * MS);
        if bucket.try_acquire_n(n).is_ok() {
            admissions.push(Admission { at: at * MS, n });
        }
    }
    check_token_bucket(&admissions, 4, 1, 10 * MS);
}

/// Lock-step rounds on a manual clock, 4 threads, every admission recorded at
/// its round's time: the bound holds, and the permits denied while the
/// bucket (as a sequential bucket fed the same admissions would see it) still
/// had room are counted and printed: under-admission.
fn stress_rounds(
    stripes: usize,
    capacity: u32,
    sizes: fn(usize, usize) -> u32,
    stop_at_denial: bool,
) {
    const ROUNDS: u64 = 300;
    let (permits, period) = (100, 1_000_000u64);
    let interval = period / permits;
    let clock = ManualClock::new();
    let rate = Rate::new(permits as u32, Duration::from_nanos(period));
    let bucket =
        Arc::new(LeasedTokenBucket::with_stripes(capacity, rate, clock.clone(), stripes).unwrap());
    let times = round_times(ROUNDS, interval * 25);
    let rounds = leased_stress_rounds(bucket, &clock, &times, sizes, stop_at_denial);
    let mut admissions = Vec::new();
    // A sequential GCRA fed the recorded admissions: its room at each round is
    // what an exact limiter could still have admitted.
    let (mut tat, mut admissible, mut missed, mut admitted) = (0u64, 0u64, 0u64, 0u64);
    for (round, requests) in rounds.iter().enumerate() {
        let at = times[round];
        let (demand, got) = demanded_and_got(requests);
        let room = (at + u64::from(capacity) * interval).saturating_sub(tat.max(at)) / interval;
        admissible += room.min(demand);
        // Permits denied while the room covered them (for single permits,
        // exactly the shortfall; for mixed sizes, an upper estimate).
        missed += room.min(demand).saturating_sub(got);
        admitted += got;
        tat = tat.max(at) + got * interval;
        admissions.extend(admitted_at(at, requests));
    }
    check_token_bucket(&admissions, capacity, permits as u32, period);
    // What a sequential bucket admits when every round's demand exceeds its
    // room (single permits): an exact, tight limiter admits exactly this.
    let mut reference = ReferenceTokenBucket::new(capacity, permits as u32, period);
    let sequential: u64 =
        expected_per_round(&mut reference, &times, STRESS_THREADS * STRESS_ATTEMPTS)
            .iter()
            .sum();
    println!(
        "leased token bucket, {STRESS_THREADS} threads, {stripes} stripes, capacity {capacity}, \
         {} requests: admitted {admitted} (sequential bucket: {sequential}), \
         admissible {admissible}, denied with room {missed}",
        stress_mode(stop_at_denial)
    );
}

#[test]
fn stress_single_permits_keep_the_bound() {
    support::stress_single_permits(stress_rounds, 40);
}

#[test]
fn stress_mixed_sizes_keep_the_bound() {
    support::stress_mixed_sizes(stress_rounds, 40);
}
