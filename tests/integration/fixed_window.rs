//! The fixed window against its locking twin and a reference model, and its
//! known weakness.

use crate::support;

use std::time::Duration;

use proptest::prelude::*;
use support::{ReferenceFixedWindow, assert_agree, check_fixed_window, forward_ops, op_steps};
use tollgate::{Denied, FixedWindow, LockingFixedWindow, ManualClock, Rate, RateLimiter};

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn atomic_twin_and_reference_agree(
        limit in 1..=10u32,
        window in 10..=5_000u64,
        seed_ops in forward_ops(10, 6_000, 3),
    ) {
        let rate = Rate::new(limit, Duration::from_nanos(window));
        let clock = ManualClock::new();
        let atomic = FixedWindow::with_clock(rate, clock.clone()).unwrap();
        let twin = LockingFixedWindow::with_clock(rate, clock.clone()).unwrap();
        let mut reference = ReferenceFixedWindow::new(limit, window);
        let steps = op_steps(&seed_ops, |step| step);
        let admissions = assert_agree(&steps, &clock, &[&atomic, &twin], &mut reference);
        check_fixed_window(&admissions, limit, window);
    }
}

/// The documented weakness: a full limit at the end of one window and another at
/// the start of the next, 2× the limit within one window's length.
#[test]
fn boundary_burst_admits_twice_the_limit() {
    let clock = ManualClock::new();
    let window = FixedWindow::with_clock(Rate::per_minute(100), clock.clone()).unwrap();
    clock.set(Duration::from_millis(59_900).as_nanos() as u64);
    assert_eq!(window.try_acquire_n(100), Ok(()));
    assert_eq!(
        window.try_acquire(),
        Err(Denied::RetryAfter(Duration::from_millis(100)))
    );
    clock.set(Duration::from_millis(60_100).as_nanos() as u64);
    assert_eq!(window.try_acquire_n(100), Ok(()));
    // 200 admitted within 200 ms, against a limit of 100 per minute.
}

#[test]
fn windows_are_aligned_to_construction() {
    let clock = ManualClock::new();
    clock.set(5_000_000_000); // the clock's origin is not the limiter's
    let window = FixedWindow::with_clock(Rate::per_second(2), clock.clone()).unwrap();
    assert_eq!(window.try_acquire_n(2), Ok(()));
    clock.advance(Duration::from_millis(999));
    assert_eq!(
        window.try_acquire(),
        Err(Denied::RetryAfter(Duration::from_millis(1)))
    );
    clock.advance(Duration::from_millis(1));
    assert_eq!(window.try_acquire_n(2), Ok(()));
}

#[test]
fn odd_request_sizes_never_panic() {
    let window = FixedWindow::new(Rate::per_second(3)).unwrap();
    support::assert_odd_sizes_denied(&window, 3);
    let largest = FixedWindow::new(Rate::new(u32::MAX, Duration::from_secs(5))).unwrap();
    assert_eq!(largest.try_acquire_n(u32::MAX), Ok(()));
    assert!(largest.try_acquire().unwrap_err().retry_after().is_some());
}

/// A limiter that lives for the whole 2^62 ns range keeps distinct window indices
/// (the packed index never wraps into an old window's count).
#[test]
fn window_index_never_wraps() {
    let clock = ManualClock::new();
    let rate = Rate::new(u32::MAX, Duration::from_nanos(u64::from(u32::MAX)));
    let window = FixedWindow::with_clock(rate, clock.clone()).unwrap();
    let mut now = 0u64;
    while now < (1 << 62) {
        assert_eq!(window.try_acquire_n(u32::MAX), Ok(()), "at {now}");
        assert!(window.try_acquire().is_err());
        now = now.saturating_mul(3).max(u64::from(u32::MAX));
        clock.set(now);
    }
}
