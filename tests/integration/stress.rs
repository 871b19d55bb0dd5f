//! Real threads hammering one limiter while a manual clock steps in lock-step
//! rounds. Every admission is recorded with its decision time (the round's time:
//! the clock stands still within a round), and afterwards the invariant is checked
//! and the totals compared with what a sequential limiter would admit.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use support::{
    Admission, EXACT_BUCKET, ReferenceFixedWindow, ReferenceTokenBucket, STRESS_ATTEMPTS,
    STRESS_ROUNDS, STRESS_THREADS, check_fixed_window, check_token_bucket, exact_bucket_rounds,
    exact_under_contention, mixed, round_times, stress,
};
use tollgate::{
    ConfigError, FixedWindow, LockingFixedWindow, LockingTokenBucket, ManualClock, Rate,
    RateLimiter, TokenBucket,
};

/// Single permits: demand outstrips supply every round, so a tight limiter
/// admits exactly what a sequential one would, round by round.
fn token_bucket_rounds<L: RateLimiter + Send + Sync + 'static>(
    with_clock: fn(u32, Rate, ManualClock) -> Result<L, ConfigError>,
) {
    let (capacity, permits, period) = EXACT_BUCKET;
    let admissions = exact_bucket_rounds(with_clock, ReferenceTokenBucket::new);
    check_token_bucket(&admissions, capacity, permits, period);
}

/// The admissions of `STRESS_ROUNDS` rounds `step` ns apart, each thread asking for
/// 1 to 3 permits at a time of the limiter `make` builds on the test clock;
/// asserts that some were admitted.
fn mixed_rounds<L: RateLimiter + Send + Sync + 'static>(
    step: u64,
    make: impl FnOnce(ManualClock) -> L,
) -> Vec<Admission> {
    let clock = ManualClock::new();
    let limiter = Arc::new(make(clock.clone()));
    let times = round_times(STRESS_ROUNDS as u64, step);
    let record = stress(
        limiter,
        &clock,
        STRESS_THREADS,
        &times,
        STRESS_ATTEMPTS,
        mixed::<3>,
    );
    assert!(!record.admissions.is_empty());
    record.admissions
}

#[test]
fn token_bucket_is_exact_under_contention() {
    token_bucket_rounds(TokenBucket::with_clock);
}

#[test]
fn locking_token_bucket_is_exact_under_contention() {
    token_bucket_rounds(LockingTokenBucket::with_clock);
}

#[test]
fn token_bucket_keeps_its_bound_with_mixed_sizes() {
    let rate = Rate::new(7, Duration::from_micros(10)); // an interval that rounds
    let admissions = mixed_rounds(4_000, |clock| {
        TokenBucket::with_clock(9, rate, clock).unwrap()
    });
    check_token_bucket(&admissions, 9, 7, 10_000);
}

fn fixed_window_rounds<L: RateLimiter + Send + Sync + 'static>(make: fn(ManualClock) -> L) {
    let (limit, window) = (50, 1_000_000u64);
    let times = round_times(STRESS_ROUNDS as u64, window / 2);
    let mut reference = ReferenceFixedWindow::new(limit, window);
    let admissions = exact_under_contention(make, &times, &mut reference);
    check_fixed_window(&admissions, limit, window);
}

#[test]
fn fixed_window_is_exact_under_contention() {
    fixed_window_rounds(|clock| {
        FixedWindow::with_clock(Rate::new(50, Duration::from_millis(1)), clock).unwrap()
    });
}

#[test]
fn locking_fixed_window_is_exact_under_contention() {
    fixed_window_rounds(|clock| {
        LockingFixedWindow::with_clock(Rate::new(50, Duration::from_millis(1)), clock).unwrap()
    });
}

#[test]
fn fixed_window_keeps_its_bound_with_mixed_sizes() {
    let rate = Rate::new(11, Duration::from_micros(3));
    let admissions = mixed_rounds(1_500, |clock| FixedWindow::with_clock(rate, clock).unwrap());
    check_fixed_window(&admissions, 11, 3_000);
}
