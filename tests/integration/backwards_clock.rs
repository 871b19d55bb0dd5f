//! A clock that steps backwards: no over-admission, no panic, no stuck limiter.
//!
//! Admissions are recorded at the latest time the limiter has been shown so far:
//! the truest time available, since a reading that steps back is older than one
//! the limiter has already seen.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use support::{Admission, check_fixed_window, check_token_bucket};
use tollgate::{
    Denied, FixedWindow, LockingFixedWindow, LockingTokenBucket, ManualClock, Rate, RateLimiter,
    TokenBucket,
};

const MS: u64 = 1_000_000;

/// Times that climb with frequent backwards steps of up to 3 ms.
fn jittery_times() -> Vec<u64> {
    let mut now = 10 * MS;
    (0..5_000u64)
        .map(|i| {
            let step = (i * 2_654_435_761) % (4 * MS);
            if i % 3 == 0 {
                now = now.saturating_sub(step * 3 / 4);
            } else {
                now += step / 2;
            }
            now
        })
        .collect()
}

/// Replays `jittery_times`, one request of 1–2 permits per reading, and returns
/// the admissions at the max-so-far time.
fn replay(limiter: &dyn RateLimiter, clock: &ManualClock) -> Vec<Admission> {
    let mut latest = 0;
    let mut admissions = Vec::new();
    for (i, now) in jittery_times().into_iter().enumerate() {
        clock.set(now);
        latest = latest.max(now);
        let n = 1 + (i % 2) as u32;
        match limiter.try_acquire_n(n) {
            Ok(()) => admissions.push(Admission { at: latest, n }),
            Err(Denied::RetryAfter(wait)) => assert!(!wait.is_zero()),
            Err(other) => panic!("unexpected {other:?}"),
        }
    }
    admissions
}

#[test]
fn token_buckets_never_over_admit_when_time_steps_back() {
    let rate = Rate::new(5, Duration::from_millis(10));
    let clock = ManualClock::new();
    let atomic = TokenBucket::with_clock(4, rate, clock.clone()).unwrap();
    let admissions = replay(&atomic, &clock);
    assert!(admissions.len() > 100, "only {} admitted", admissions.len());
    check_token_bucket(&admissions, 4, 5, 10 * MS);

    let clock = ManualClock::new();
    let twin = LockingTokenBucket::with_clock(4, rate, clock.clone()).unwrap();
    assert_eq!(
        replay(&twin, &clock),
        admissions,
        "the twin decides the same"
    );
}

#[test]
fn fixed_windows_never_over_admit_when_time_steps_back() {
    let rate = Rate::new(6, Duration::from_millis(5));
    let clock = ManualClock::new();
    let atomic = FixedWindow::with_clock(rate, clock.clone()).unwrap();
    let admissions = replay(&atomic, &clock);
    assert!(admissions.len() > 100, "only {} admitted", admissions.len());
    check_fixed_window(&admissions, 6, 5 * MS);

    let clock = ManualClock::new();
    let twin = LockingFixedWindow::with_clock(rate, clock.clone()).unwrap();
    assert_eq!(
        replay(&twin, &clock),
        admissions,
        "the twin decides the same"
    );
}

/// After a step back, the limiter waits for the clock to regain the lost ground
/// (treating the gap as time standing still), then carries on as before: it is
/// not stuck, and its retry-after says when, on the clock it reads.
#[test]
fn a_large_step_back_pauses_then_recovers() {
    let clock = ManualClock::new();
    let bucket = TokenBucket::with_clock(2, Rate::per_second(2), clock.clone()).unwrap();
    let window = FixedWindow::with_clock(Rate::per_second(2), clock.clone()).unwrap();
    clock.set(3_600 * 1_000 * MS); // an hour in
    for limiter in [&bucket as &dyn RateLimiter, &window] {
        assert_eq!(limiter.try_acquire_n(2), Ok(()));
    }
    clock.set(10 * MS); // back by almost an hour
    let Err(Denied::RetryAfter(wait)) = bucket.try_acquire() else {
        panic!("a bucket drained an hour from now must not refill in the past")
    };
    assert_eq!(
        wait.as_nanos() as u64,
        3_600 * 1_000 * MS + 500 * MS - 10 * MS
    );
    let Err(Denied::RetryAfter(wait)) = window.try_acquire() else {
        panic!("a window spent an hour from now must not reopen in the past")
    };
    assert_eq!(wait.as_nanos() as u64, 3_601 * 1_000 * MS - 10 * MS);
    clock.set(3_601 * 1_000 * MS); // the clock regains the lost ground
    for limiter in [&bucket as &dyn RateLimiter, &window] {
        assert_eq!(limiter.try_acquire_n(2), Ok(()));
    }
}

/// Readings at the ends of the u64 range, and before the limiter's origin.
#[test]
fn extreme_readings_never_panic() {
    let clock = ManualClock::new();
    clock.set(u64::MAX / 2);
    let bucket = TokenBucket::with_clock(3, Rate::per_second(1), clock.clone()).unwrap();
    let window = FixedWindow::with_clock(Rate::per_second(3), clock.clone()).unwrap();
    for now in [u64::MAX / 2, 0, u64::MAX, 1, u64::MAX - 1, u64::MAX / 2 + 1] {
        clock.set(now);
        for limiter in [&bucket as &dyn RateLimiter, &window] {
            for n in [1, 2, 3, 0, u32::MAX] {
                let _ = limiter.try_acquire_n(n);
            }
            let snap = limiter.snapshot();
            assert!(snap.available <= snap.capacity);
        }
    }
}

/// Threads acquire while another thread drags the clock back and forth; the
/// totals stay within what the latest time allows, nothing panics, and once the
/// clock settles well past its maximum, the limiters admit again.
#[test]
fn concurrent_backwards_steps() {
    let clock = ManualClock::new();
    let rate = Rate::new(10, Duration::from_millis(1));
    let bucket = Arc::new(TokenBucket::with_clock(5, rate, clock.clone()).unwrap());
    let window = Arc::new(FixedWindow::with_clock(rate, clock.clone()).unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let admitted = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
    let workers: Vec<_> = (0..3)
        .map(|_| {
            let (bucket, window, stop, admitted) = (
                bucket.clone(),
                window.clone(),
                stop.clone(),
                admitted.clone(),
            );
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    if bucket.try_acquire().is_ok() {
                        admitted[0].fetch_add(1, Ordering::Relaxed);
                    }
                    if window.try_acquire().is_ok() {
                        admitted[1].fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    let mut latest = 0;
    for now in jittery_times() {
        clock.set(now);
        latest = latest.max(now);
        // Long enough for the workers to decide a few times on each reading.
        for _ in 0..2_000 {
            std::hint::spin_loop();
        }
    }
    stop.store(true, Ordering::Relaxed);
    for worker in workers {
        worker.join().unwrap();
    }
    let bucket_bound = 5 + latest / 100_000;
    let window_bound = 10 * (latest / MS + 1);
    assert!(admitted[0].load(Ordering::Relaxed) <= bucket_bound);
    assert!(admitted[1].load(Ordering::Relaxed) <= window_bound);
    clock.set(latest + 10 * MS);
    assert_eq!(bucket.try_acquire_n(5), Ok(()));
    assert_eq!(window.try_acquire_n(10), Ok(()));
}
