//! Waiting by retry-after (`RetryAcquire`): the sliding log, the windows,
//! `AllOf` and a key of a `Keyed` limiter. Time is a `ManualClock` moved by
//! the test, so no assertion depends on how fast anything runs: a waiter is
//! admitted only once the clock has moved far enough, takes nothing while it
//! waits or when it gives up, and a dropped async waiter takes nothing.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tollgate::keyed::{BucketConfig, Keyed, WindowConfig};
use tollgate::{
    AllOf, ApproxSlidingWindow, Denied, FixedWindow, LockingFixedWindow, LockingSlidingLog,
    ManualClock, Rate, RateLimiter, RetryAcquire, SlidingLog, SlidingWindow, TokenBucket,
};

type Bucket = TokenBucket<ManualClock>;

/// Windows of 1 µs: a waiter sleeps at most a microsecond before asking again.
fn rate(limit: u32) -> Rate {
    Rate::new(limit, Duration::from_micros(1))
}

/// Fills `limiter`, starts a blocking `acquire(1)` on another thread, and
/// checks that it is not admitted until the main thread moves the clock a
/// full window on; then that it is admitted, having taken exactly one permit.
fn waits_for_the_clock<L: RetryAcquire + Sync>(limiter: &L, clock: &ManualClock, capacity: u32) {
    assert!(limiter.try_acquire_n(capacity).is_ok());
    let admitted = AtomicBool::new(false);
    std::thread::scope(|s| {
        let waiter = s.spawn(|| {
            let result = limiter.acquire(1);
            admitted.store(true, Ordering::SeqCst);
            result
        });
        // However long this thread is delayed, the waiter cannot pass while
        // the clock stands still: every retry is denied.
        for _ in 0..100 {
            std::thread::yield_now();
        }
        assert!(
            !admitted.load(Ordering::SeqCst),
            "admitted with the limiter full"
        );
        clock.advance(Duration::from_micros(2));
        assert_eq!(waiter.join().unwrap(), Ok(()));
    });
    assert_eq!(limiter.snapshot().available, capacity - 1);
}

/// [`waits_for_the_clock`] on the limiter `make` builds on a clock of its own.
fn waits_on_its_clock<L: RetryAcquire + Sync>(make: impl FnOnce(ManualClock) -> L, capacity: u32) {
    let clock = ManualClock::new();
    waits_for_the_clock(&make(clock.clone()), &clock, capacity);
}

#[test]
fn every_retry_limiter_waits_until_the_clock_allows() {
    waits_on_its_clock(|c| SlidingLog::with_clock(rate(3), c).unwrap(), 3);
    waits_on_its_clock(|c| LockingSlidingLog::with_clock(rate(3), c).unwrap(), 3);
    waits_on_its_clock(|c| FixedWindow::with_clock(rate(3), c).unwrap(), 3);
    waits_on_its_clock(|c| LockingFixedWindow::with_clock(rate(3), c).unwrap(), 3);
    let sliding = |c| {
        SlidingWindow::builder(rate(4))
            .sub_windows(2)
            .clock(c)
            .build()
            .unwrap()
    };
    waits_on_its_clock(sliding, 4);
    waits_on_its_clock(|c| ApproxSlidingWindow::with_clock(rate(3), c).unwrap(), 3);
    let clock = ManualClock::new();
    let a = Bucket::with_clock(10, Rate::per_hour(10), clock.clone()).unwrap();
    let log = SlidingLog::with_clock(rate(2), clock.clone()).unwrap();
    waits_for_the_clock(&AllOf::new((&a, &log)), &clock, 2);
    // The bucket lost only what passed: 2 + 1, refunds of the denied retries exact.
    assert_eq!(a.snapshot().available, 7);

    let keyed = Keyed::<u32, FixedWindow<ManualClock>>::with_clock(
        WindowConfig::new(rate(3)).unwrap(),
        clock.clone(),
    );
    waits_for_the_clock(&keyed.for_key(&5), &clock, 3);
    assert_eq!(keyed.snapshot(&5).available, 2);
}

#[test]
fn a_timeout_shorter_than_the_wait_gives_up_at_once_and_takes_nothing() {
    let clock = ManualClock::new();
    let log = SlidingLog::with_clock(Rate::per_minute(2), clock.clone()).unwrap();
    log.try_acquire_n(2).unwrap();
    clock.advance(Duration::from_secs(20));
    let before = log.snapshot();
    assert_eq!(
        log.acquire_timeout(1, Duration::from_secs(39)),
        Err(Denied::RetryAfter(Duration::from_secs(40)))
    );
    assert_eq!(log.snapshot(), before);

    let keyed = Keyed::<u32, Bucket>::with_clock(
        BucketConfig::new(1, Rate::per_minute(1)).unwrap(),
        clock.clone(),
    );
    keyed.try_acquire(&1).unwrap();
    assert_eq!(
        keyed.acquire_timeout(&1, 1, Duration::from_secs(59)),
        Err(Denied::RetryAfter(Duration::from_secs(60)))
    );
    assert_eq!(keyed.snapshot(&1).available, 0);
}

#[test]
fn requests_that_can_never_pass_return_at_once() {
    let clock = ManualClock::new();
    let window = FixedWindow::with_clock(Rate::per_hour(3), clock.clone()).unwrap();
    assert_eq!(window.acquire(0), Err(Denied::ZeroPermits));
    assert_eq!(
        window.acquire(4),
        Err(Denied::ExceedsCapacity {
            requested: 4,
            capacity: 3
        })
    );
    let keyed = Keyed::<u32, Bucket>::with_clock(
        BucketConfig::new(2, Rate::per_hour(2)).unwrap(),
        clock.clone(),
    );
    assert!(matches!(
        keyed.acquire(&1, 3),
        Err(Denied::ExceedsCapacity { .. })
    ));
    assert!(keyed.is_empty());
}

#[cfg(feature = "tokio")]
mod with_tokio {
    use super::*;
    use crate::support::poll_once;
    use std::pin::pin;

    /// A dropped waiter has taken nothing: not from the log, not from the
    /// members of an `AllOf` (their refunds were exact), not from a key.
    #[tokio::test]
    async fn a_dropped_async_waiter_takes_nothing() {
        let clock = ManualClock::new();
        let a = Bucket::with_clock(5, Rate::per_hour(5), clock.clone()).unwrap();
        let log = SlidingLog::with_clock(Rate::per_hour(1), clock.clone()).unwrap();
        let keyed = Keyed::<u32, Bucket>::with_clock(
            BucketConfig::new(3, Rate::per_hour(3)).unwrap(),
            clock.clone(),
        );
        log.try_acquire().unwrap();
        let all = AllOf::new((&a, keyed.for_key(&9), &log));
        {
            let mut waiting = pin!(all.acquire_async(1));
            assert!(poll_once(waiting.as_mut()).is_pending());
        }
        assert_eq!(a.snapshot().available, 5);
        assert_eq!(keyed.snapshot(&9).available, 3);
        assert_eq!(log.snapshot().available, 0);

        keyed.try_acquire_n(&9, 3).unwrap();
        {
            let mut waiting = pin!(keyed.acquire_async(&9, 1));
            assert!(poll_once(waiting.as_mut()).is_pending());
        }
        assert_eq!(keyed.snapshot(&9).available, 0);
    }

    /// On the real clock with an hourly rate, the wait is an hour: a timeout
    /// gives up at once, whatever the machine's speed.
    #[tokio::test]
    async fn async_timeouts_give_up_without_taking() {
        let log = SlidingLog::new(Rate::per_hour(1)).unwrap();
        log.acquire_timeout_async(1, Duration::ZERO).await.unwrap();
        assert!(matches!(
            log.acquire_timeout_async(1, Duration::from_secs(1)).await,
            Err(Denied::RetryAfter(_))
        ));
        assert_eq!(log.snapshot().available, 0);
    }

    /// The futures can be spawned on a multi-threaded runtime (a tower
    /// service's futures must be `Send`).
    #[test]
    fn async_waiters_are_send() {
        fn send<T: Send>(_: T) {}
        let clock = ManualClock::new();
        let log = SlidingLog::with_clock(rate(1), clock.clone()).unwrap();
        let a = Bucket::with_clock(1, Rate::per_hour(1), clock.clone()).unwrap();
        let keyed = Keyed::<u32, Bucket>::with_clock(
            BucketConfig::new(1, Rate::per_hour(1)).unwrap(),
            clock.clone(),
        );
        send(log.acquire_async(1));
        send(keyed.acquire_async(&1, 1));
        let all = AllOf::new((&a, keyed.for_key(&1), &log));
        send(all.acquire_timeout_async(1, Duration::ZERO));
    }

    /// An async waiter is admitted once the manual clock moves.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_async_waiter_is_admitted_once_the_clock_moves() {
        let clock = ManualClock::new();
        let log = std::sync::Arc::new(SlidingLog::with_clock(rate(1), clock.clone()).unwrap());
        log.try_acquire().unwrap();
        let waiter = {
            let log = log.clone();
            tokio::spawn(async move { log.acquire_async(1).await })
        };
        tokio::task::yield_now().await;
        clock.advance(Duration::from_micros(2));
        assert_eq!(waiter.await.unwrap(), Ok(()));
        assert_eq!(log.snapshot().available, 0);
    }
}
