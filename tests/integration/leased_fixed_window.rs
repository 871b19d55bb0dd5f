//! The leased fixed window: decision for decision and snapshot for snapshot
//! against its locking twin (`LockingFixedWindow`) and the reference on one
//! thread, clock stepping back included; the per-window bound and liveness on
//! random sequences spread over several threads' stripes; lock-step stress
//! with recorded admissions and the under-admission figure (`-- --nocapture`
//! prints it); odd inputs.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use support::{
    Op, ReferenceFixedWindow, STRESS_THREADS, Workers, admitted_at, assert_agree,
    assert_odd_sizes_denied, assert_twins_agree, check_fixed_window, demanded_and_got,
    leased_stress_rounds, op_steps, op_times, ops_stepping_back, replay_on_workers, round_times,
    stress_mode, without_steps_back,
};
use tollgate::{Denied, LeasedFixedWindow, LockingFixedWindow, ManualClock, Rate, RateLimiter};

/// Operations for windows of up to 5 µs: steps of up to one and a half of
/// them, and back by up to two.
fn ops() -> impl Strategy<Value = Vec<Op>> {
    ops_stepping_back(40, 7_500, 3, 10_000)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// On one thread the leased window (1 stripe and 4), the twin and the
    /// reference make identical decisions, retry-afters to the nanosecond, and
    /// report identical snapshots; what they admit keeps the per-window bound.
    #[test]
    fn leased_twin_and_reference_agree(
        limit in 1..=40u32,
        window in 40..=5_000u64,
        seed_ops in ops(),
    ) {
        let rate = Rate::new(limit, Duration::from_nanos(window));
        let clock = ManualClock::new();
        let one = LeasedFixedWindow::with_stripes(rate, clock.clone(), 1).unwrap();
        let four = LeasedFixedWindow::with_stripes(rate, clock.clone(), 4).unwrap();
        let twin = LockingFixedWindow::with_clock(rate, clock.clone()).unwrap();
        let mut reference = ReferenceFixedWindow::new(limit, window);
        let forward: Vec<Op> = without_steps_back(seed_ops)
            .into_iter()
            .map(|op| match op {
                Op::Acquire(n) if n <= 40 && n > limit => Op::Acquire(n % limit + 1),
                op => op,
            })
            .collect();
        let steps = op_steps(&forward, |step| step);
        let admissions = assert_agree(&steps, &clock, &[&one, &four, &twin], &mut reference);
        check_fixed_window(&admissions, limit, window);
    }

    /// With the clock stepping back too, the leased window and the twin still
    /// agree decision for decision (retry-afters included), report for report
    /// and snapshot for snapshot.
    #[test]
    fn leased_and_twin_agree_when_time_steps_back(
        limit in 1..=40u32,
        window in 40..=5_000u64,
        stripes in prop_oneof![Just(1usize), Just(4)],
        seed_ops in ops(),
    ) {
        let rate = Rate::new(limit, Duration::from_nanos(window));
        let clock = ManualClock::new();
        let leased = LeasedFixedWindow::with_stripes(rate, clock.clone(), stripes).unwrap();
        let twin = LockingFixedWindow::with_clock(rate, clock.clone()).unwrap();
        let times = op_times(&seed_ops, |step| step);
        assert_twins_agree(&leased, &twin, &clock, &seed_ops, &times, |i| i % 3 == 0)?;
    }

    /// Requests from three threads (three stripes), interleaved in a random
    /// but fixed order, clock moving forward only: every window keeps its
    /// limit by decision time, and in the next window the whole limit is
    /// available again from any thread (no permit stays stranded).
    #[test]
    fn spread_over_stripes_keeps_the_bound_and_recovers(
        limit in 1..=40u32,
        window in 40..=5_000u64,
        seed_ops in ops(),
        who in proptest::collection::vec(0..3usize, 200),
    ) {
        let rate = Rate::new(limit, Duration::from_nanos(window));
        let clock = ManualClock::new();
        let leased = Arc::new(LeasedFixedWindow::with_stripes(rate, clock.clone(), 8).unwrap());
        let workers = Workers::new(leased.clone(), 3);
        let forward = without_steps_back(seed_ops);
        let times = op_times(&forward, |step| step);
        let (admissions, mut now) = replay_on_workers(&workers, &clock, &forward, &times, &who, limit)?;
        check_fixed_window(&admissions, limit, window);
        for thread in 0..3 {
            now = (now / window + 1) * window;
            clock.set(now);
            prop_assert_eq!(leased.snapshot().available, limit);
            prop_assert_eq!(workers.acquire(thread, limit), Ok(()));
            prop_assert!(workers.acquire(thread, 1).is_err());
        }
    }
}

#[test]
fn odd_request_sizes_never_panic() {
    let clock = ManualClock::new();
    for limit in [1, 7, u32::MAX] {
        let rate = Rate::new(limit, Duration::from_secs(10));
        let window = LeasedFixedWindow::with_clock(rate, clock.clone()).unwrap();
        assert_odd_sizes_denied(&window, limit);
        assert_eq!(window.try_acquire(), Ok(()));
        assert!(matches!(
            window.try_acquire_n(limit),
            Err(Denied::RetryAfter(_))
        ));
    }
    // The finest and the longest windows, at the end of time.
    for rate in [
        Rate::new(1 << 31, Duration::from_nanos(1 << 31)),
        Rate::new(u32::MAX, Duration::from_nanos(1 << 62)),
    ] {
        let window = LeasedFixedWindow::with_clock(rate, clock.clone()).unwrap();
        clock.set(u64::MAX);
        assert_eq!(window.try_acquire_n(rate.permits()), Ok(()));
        assert!(window.try_acquire().is_err());
        let _ = window.snapshot();
        clock.set(0);
        assert!(window.try_acquire().is_err());
    }
}

/// A batch leased in one window is never spent in another: a thread leases
/// a batch at the end of window 0, another thread fills window 1, and the
/// first may spend nothing in window 1; stepped back to window 0 the first
/// thread's reading is charged to window 1 (as the plain window charges it),
/// so it is denied too.
#[test]
fn a_batch_stays_in_its_window() {
    let clock = ManualClock::new();
    let rate = Rate::new(100, Duration::from_nanos(1_000));
    let window = Arc::new(LeasedFixedWindow::with_stripes(rate, clock.clone(), 2).unwrap());
    let workers = Workers::new(window.clone(), 2);
    clock.set(999);
    // 1 admitted, a batch of (100 − 1) / 4 = 24 leased to the first stripe.
    assert_eq!(workers.acquire(0, 1), Ok(()));
    clock.set(1_000);
    assert_eq!(workers.acquire(1, 100), Ok(()));
    assert!(workers.acquire(0, 1).is_err());
    clock.set(999);
    assert!(workers.acquire(0, 1).is_err());
    assert!(workers.acquire(1, 1).is_err());
    clock.set(2_000);
    assert_eq!(window.snapshot().available, 100);
}

/// Lock-step rounds on a manual clock, 4 threads, every admission recorded at
/// its round's time: each window keeps its limit, and the permits denied while
/// the window still had room (its limit less what was admitted in it) are
/// counted and printed: under-admission.
fn stress_rounds(stripes: usize, limit: u32, sizes: fn(usize, usize) -> u32, stop_at_denial: bool) {
    const ROUNDS: u64 = 300;
    let window = 1_000_000u64;
    let clock = ManualClock::new();
    let rate = Rate::new(limit, Duration::from_nanos(window));
    let limiter = Arc::new(LeasedFixedWindow::with_stripes(rate, clock.clone(), stripes).unwrap());
    // Several rounds per window, some rounds crossing windows.
    let times = round_times(ROUNDS, window / 4);
    let rounds = leased_stress_rounds(limiter, &clock, &times, sizes, stop_at_denial);
    let mut admissions = Vec::new();
    let (mut current, mut used) = (u64::MAX, 0u64);
    let (mut admitted, mut missed, mut sequential, mut seq_used) = (0u64, 0u64, 0u64, 0u64);
    for (round, requests) in rounds.iter().enumerate() {
        let at = times[round];
        if at / window != current {
            current = at / window;
            used = 0;
            seq_used = 0;
        }
        let (demand, got) = demanded_and_got(requests);
        let room = u64::from(limit) - used;
        // Denied while the window, as the recorded admissions leave it, had
        // room for them (single permits: exactly the shortfall).
        missed += room.min(demand).saturating_sub(got);
        // A sequential window given the same demand of single permits.
        let seq = (u64::from(limit) - seq_used).min(demand);
        seq_used += seq;
        sequential += seq;
        used += got;
        admitted += got;
        admissions.extend(admitted_at(at, requests));
    }
    check_fixed_window(&admissions, limit, window);
    println!(
        "leased fixed window, {STRESS_THREADS} threads, {stripes} stripes, limit {limit}, {}: \
         admitted {admitted} (sequential window: {sequential}), denied with room {missed}",
        stress_mode(stop_at_denial)
    );
}

#[test]
fn stress_single_permits_keep_the_bound() {
    support::stress_single_permits(stress_rounds, 100);
}

#[test]
fn stress_mixed_sizes_keep_the_bound() {
    support::stress_mixed_sizes(stress_rounds, 100);
}

/// Every configuration the plain window rejects, the leased window rejects
/// with the same error; every other one it accepts, with any stripe count.
#[test]
fn configuration_errors_are_the_fixed_windows() {
    use tollgate::FixedWindow;
    let clock = ManualClock::new();
    for rate in [
        Rate::per_second(0),
        Rate::new(5, Duration::ZERO),
        Rate::new(1_001, Duration::from_micros(1)),
        Rate::new(1, Duration::from_nanos((1 << 62) + 1)),
        Rate::new(u32::MAX, Duration::MAX),
        Rate::new(1, Duration::from_nanos(1)),
        Rate::per_hour(1),
    ] {
        let plain = FixedWindow::with_clock(rate, clock.clone()).map(drop);
        for stripes in [0, 1, 3, 1_000] {
            assert_eq!(
                LeasedFixedWindow::with_stripes(rate, clock.clone(), stripes).map(drop),
                plain,
                "{rate:?}, {stripes} stripes"
            );
        }
    }
}
