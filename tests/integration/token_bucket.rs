//! The token bucket against its locking twin and an independent reference model.

use crate::support;

use std::time::Duration;

use proptest::prelude::*;
use support::{
    Op, ReferenceTokenBucket, assert_agree, bucket_config, check_token_bucket, forward_ops,
    op_steps, scaled_to,
};
use tollgate::{Denied, LockingTokenBucket, ManualClock, Rate, RateLimiter, TokenBucket};

/// Operations for a 3 µs interval (scaled to the bucket's by `scaled_to`):
/// steps around one interval, where rounding and exactness bite.
fn ops() -> impl Strategy<Value = Vec<Op>> {
    forward_ops(10, 9_000, 4)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Atomic bucket, twin and reference make identical decisions (including
    /// retry-after to the nanosecond) and identical snapshots, and what they admit
    /// keeps the bound.
    #[test]
    fn atomic_twin_and_reference_agree(
        (capacity, permits, period) in bucket_config(),
        seed_ops in ops(),
    ) {
        let rate = Rate::new(permits, Duration::from_nanos(period));
        let clock = ManualClock::new();
        let atomic = TokenBucket::with_clock(capacity, rate, clock.clone()).unwrap();
        let twin = LockingTokenBucket::with_clock(capacity, rate, clock.clone()).unwrap();
        let mut reference = ReferenceTokenBucket::new(capacity, permits, period);
        let interval = atomic.emission_interval().as_nanos() as u64;
        let steps = op_steps(&seed_ops, scaled_to(interval));
        let admissions = assert_agree(&steps, &clock, &[&atomic, &twin], &mut reference);
        check_token_bucket(&admissions, capacity, permits, period);
    }

    /// A denial's retry-after is exact: waiting that long admits the same request,
    /// waiting one nanosecond less does not.
    #[test]
    fn retry_after_is_exact(
        (capacity, permits, period) in bucket_config(),
        drain in 1..=10u32,
        n in 1..=10u32,
    ) {
        let n = n.min(capacity);
        let rate = Rate::new(permits, Duration::from_nanos(period));
        let clock = ManualClock::new();
        let bucket = TokenBucket::with_clock(capacity, rate, clock.clone()).unwrap();
        let _ = bucket.try_acquire_n(drain.min(capacity));
        if let Err(Denied::RetryAfter(wait)) = bucket.try_acquire_n(n) {
            let wait = wait.as_nanos() as u64;
            prop_assert!(wait > 0);
            clock.set(wait - 1);
            prop_assert!(bucket.try_acquire_n(n).is_err());
            clock.set(wait);
            prop_assert_eq!(bucket.try_acquire_n(n), Ok(()));
        }
    }
}

#[test]
fn starts_full_and_refills_at_the_rate() {
    let clock = ManualClock::new();
    let bucket = TokenBucket::with_clock(100, Rate::per_minute(100), clock.clone()).unwrap();
    assert_eq!(bucket.try_acquire_n(100), Ok(()));
    assert_eq!(
        bucket.try_acquire(),
        Err(Denied::RetryAfter(Duration::from_millis(600)))
    );
    clock.advance(Duration::from_secs(30));
    let snap = bucket.snapshot();
    assert_eq!(snap.available, 50);
    assert_eq!(snap.until_full, Duration::from_secs(30));
    assert_eq!(bucket.try_acquire_n(50), Ok(()));
    assert!(bucket.try_acquire().is_err());
}

#[test]
fn rates_from_the_issue_have_exact_intervals() {
    for (rate, interval) in [
        (Rate::per_second(100), Duration::from_millis(10)),
        (Rate::per_minute(30), Duration::from_secs(2)),
        (
            Rate::new(5, Duration::from_millis(10)),
            Duration::from_millis(2),
        ),
    ] {
        assert_eq!(
            TokenBucket::new(1, rate).unwrap().emission_interval(),
            interval
        );
    }
}

#[test]
fn odd_request_sizes_never_panic() {
    let bucket = TokenBucket::new(5, Rate::per_second(5)).unwrap();
    support::assert_odd_sizes_denied(&bucket, 5);
    assert_eq!(bucket.try_acquire_n(5), Ok(()));
    let largest = TokenBucket::new(u32::MAX, Rate::new(u32::MAX, Duration::from_secs(5))).unwrap();
    assert_eq!(largest.try_acquire_n(u32::MAX), Ok(()));
    assert!(
        largest
            .try_acquire_n(u32::MAX)
            .unwrap_err()
            .retry_after()
            .is_some()
    );
}

#[test]
fn denials_leave_no_trace() {
    let clock = ManualClock::new();
    let bucket = TokenBucket::with_clock(3, Rate::per_second(3), clock.clone()).unwrap();
    bucket.try_acquire_n(2).unwrap();
    let before = bucket.snapshot();
    for _ in 0..1000 {
        assert!(bucket.try_acquire_n(2).is_err());
    }
    assert_eq!(bucket.snapshot(), before);
    assert_eq!(bucket.try_acquire(), Ok(()));
}
