//! Reservations, cancellation, blocking and async acquire, on the token bucket
//! and the leaky bucket shaper (warm-up has its own file).

use crate::support;

use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use support::{Admission, Start, check_shaper, check_token_bucket};
use tollgate::{
    Denied, LeakyBucket, LockingLeakyBucket, LockingShaper, ManualClock, Rate, RateLimiter,
    Reservation, Reserve, Shaper, TokenBucket,
};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn cancelling_the_latest_reservation_restores_the_limiter_exactly() {
    let clock = ManualClock::new();
    let bucket = TokenBucket::with_clock(2, Rate::per_second(10), clock.clone()).unwrap();
    let shaper = Shaper::with_clock(Rate::per_second(10), 1, ms(500), clock.clone()).unwrap();
    let _a = bucket.reserve(2).unwrap();
    let _b = shaper.reserve(1).unwrap();
    clock.advance(ms(30));
    let (bucket_before, shaper_before) = (bucket.snapshot(), shaper.snapshot());
    let r = bucket.reserve(2).unwrap();
    let s = shaper.reserve(3).unwrap();
    assert_eq!((r.delay(), s.delay()), (ms(170), Duration::ZERO));
    assert_ne!(bucket.snapshot(), bucket_before);
    assert!(r.cancel());
    assert!(s.cancel());
    assert_eq!(bucket.snapshot(), bucket_before);
    assert_eq!(shaper.snapshot(), shaper_before);
    // The permits are really back: the same requests get the same starts again.
    assert_eq!(bucket.reserve(2).unwrap().delay(), ms(170));
    assert_eq!(shaper.reserve(3).unwrap().delay(), Duration::ZERO);
}

#[test]
fn a_cancel_in_the_middle_moves_nothing_and_reverse_order_returns_all() {
    let clock = ManualClock::new();
    let bucket = TokenBucket::with_clock(1, Rate::per_second(1), clock.clone()).unwrap();
    let reservations: Vec<_> = (0..4).map(|_| bucket.reserve(1).unwrap()).collect();
    let starts: Vec<u64> = reservations
        .iter()
        .map(|r| r.ready_at().as_secs())
        .collect();
    assert_eq!(starts, [0, 1, 2, 3]);
    let before = bucket.snapshot();
    let mut reservations = reservations.into_iter();
    let first = reservations.next().unwrap();
    let second = reservations.next().unwrap();
    // Later reservations are outstanding: cancelling the second changes nothing.
    assert!(!second.cancel());
    assert_eq!(bucket.snapshot(), before);
    // Newest first, everything comes back, down to the second's hole.
    let rest: Vec<_> = reservations.collect();
    for r in rest.into_iter().rev() {
        assert!(r.cancel());
    }
    assert_eq!(bucket.reserve(1).unwrap().ready_at().as_secs(), 2);
    // The first is granted already and still the latest but one: cancelling it
    // now fails too, as the booking after it is outstanding.
    assert!(!first.cancel());
}

/// golang/go#56924's scenario (limit 10/s, burst 20): reserve 15 at t0, `r` = 10
/// at t0+100 ms, 2 more at t0+200 ms, cancel `r` at t0+300 ms. Go restores 8
/// tokens (10 minus the 2 reserved after it). tollgate returns nothing (a later
/// reservation is outstanding), and neither over-admits: checked on what they
/// then admit.
#[test]
fn go_56924_scenario_stays_within_the_bound() {
    let clock = ManualClock::new();
    let bucket = TokenBucket::with_clock(20, Rate::per_second(10), clock.clone()).unwrap();
    let mut admitted = Vec::new();
    fn keep(r: &Reservation<'_, TokenBucket<ManualClock>>, kept: &mut Vec<Admission>) {
        kept.push(Admission {
            at: r.ready_at().as_nanos() as u64,
            n: r.permits(),
        });
    }
    keep(&bucket.reserve(15).unwrap(), &mut admitted);
    clock.set(100_000_000);
    let r = bucket.reserve(10).unwrap();
    assert_eq!(r.ready_at(), ms(500));
    clock.set(200_000_000);
    keep(&bucket.reserve(2).unwrap(), &mut admitted);
    clock.set(300_000_000);
    keep(&r, &mut admitted); // kept: it will not be returned
    assert!(!r.cancel());
    while let Ok(r) = bucket.reserve_within(1, ms(700)) {
        keep(&r, &mut admitted);
    }
    check_token_bucket(&admitted, 20, 10, 1_000_000_000);
}

/// The exhaustive search's counterexample to Go's restore formula, in exact
/// integer arithmetic (bucket of 3, one permit per second, everything at t = 0):
/// reserve 1, 1, 3, 3, 1; cancel the fourth, then the third; reserve 3. Go's
/// formula lets the last reservation start at the same instant as the 1-permit
/// one before it: 4 permits at t = 6 s from a bucket of 3. tollgate's cancels
/// both return nothing (each has a later reservation outstanding), and the
/// bound holds.
#[test]
fn out_of_order_cancels_that_break_gos_formula_keep_the_bound() {
    // Go's formula on the GCRA state, exactly: restore = n − (tokens reserved
    // after it), where the latter is inferred from the distance to the last end.
    fn go(tat: &mut u64, end: u64, n_ns: u64) {
        let later = tat.saturating_sub(end);
        *tat -= n_ns.saturating_sub(later);
    }
    let (capacity, second) = (3u64, 1_000_000_000u64);
    let reserve = |tat: &mut u64, n: u64| {
        let end = *tat + n * second;
        *tat = end;
        (end.saturating_sub(capacity * second), end)
    };
    let mut tat = 0;
    let starts: Vec<(u64, u64)> = [1, 1, 3, 3, 1].map(|n| reserve(&mut tat, n)).to_vec();
    go(&mut tat, starts[3].1, 3 * second);
    go(&mut tat, starts[2].1, 3 * second);
    let last = reserve(&mut tat, 3);
    let kept = [
        Admission {
            at: starts[0].0,
            n: 1,
        },
        Admission {
            at: starts[1].0,
            n: 1,
        },
        Admission {
            at: starts[4].0,
            n: 1,
        },
        Admission { at: last.0, n: 3 },
    ];
    assert_eq!((starts[4].0, last.0), (6 * second, 6 * second));
    let go_over_admits =
        std::panic::catch_unwind(|| check_token_bucket(&kept, 3, 1, second)).is_err();
    assert!(go_over_admits, "the checker must catch Go's over-admission");

    let clock = ManualClock::new();
    let bucket = TokenBucket::with_clock(3, Rate::per_second(1), clock).unwrap();
    let rs: Vec<_> = [1, 1, 3, 3, 1].map(|n| bucket.reserve(n).unwrap()).into();
    let mut kept: Vec<Admission> = Vec::new();
    let mut rs = rs.into_iter();
    let (r0, r1, r2, r3, r4) = (
        rs.next().unwrap(),
        rs.next().unwrap(),
        rs.next().unwrap(),
        rs.next().unwrap(),
        rs.next().unwrap(),
    );
    for r in [&r0, &r1, &r2, &r3, &r4] {
        kept.push(Admission {
            at: r.ready_at().as_nanos() as u64,
            n: r.permits(),
        });
    }
    assert!(!r3.cancel());
    assert!(!r2.cancel());
    let last = bucket.reserve(3).unwrap();
    kept.push(Admission {
        at: last.ready_at().as_nanos() as u64,
        n: 3,
    });
    check_token_bucket(&kept, 3, 1, second);
}

#[test]
fn a_bounded_reservation_past_its_bound_leaves_no_trace() {
    let clock = ManualClock::new();
    let bucket = TokenBucket::with_clock(2, Rate::per_second(2), clock.clone()).unwrap();
    let _ = bucket.reserve(2).unwrap();
    let before = bucket.snapshot();
    assert_eq!(
        bucket.reserve_within(2, ms(300)).unwrap_err(),
        Denied::RetryAfter(ms(700))
    );
    assert_eq!(
        bucket.acquire_timeout(1, ms(100)).unwrap_err(),
        Denied::RetryAfter(ms(400))
    );
    assert_eq!(bucket.snapshot(), before);
    // Exactly at the retry-after, it fits within the same bound.
    clock.advance(ms(700));
    assert_eq!(bucket.reserve_within(2, ms(300)).unwrap().delay(), ms(300));
}

#[test]
fn reservations_are_granted_in_order_and_a_big_one_is_not_starved() {
    let clock = ManualClock::new();
    let bucket = TokenBucket::with_clock(4, Rate::per_second(4), clock.clone()).unwrap();
    bucket.try_acquire_n(4).unwrap();
    let small1 = bucket.reserve(1).unwrap();
    let big = bucket.reserve(4).unwrap();
    // A stream of small requests keeps arriving; each queues behind the big one.
    let mut last = big.ready_at();
    for _ in 0..10 {
        clock.advance(ms(50));
        let small = bucket.reserve(1).unwrap();
        assert!(small.ready_at() >= last);
        last = small.ready_at();
        assert!(
            bucket.try_acquire().is_err(),
            "a try must not jump the queue"
        );
    }
    assert_eq!((small1.ready_at(), big.ready_at()), (ms(250), ms(1250)));
}

/// Random reserves (with random wait bounds), try-acquires, cancels of random
/// outstanding reservations and clock steps. Checked against the model of what
/// a cancel may do: it succeeds iff every booking made after it is cancelled;
/// replaying only the kept bookings (failed cancels are kept) in a fresh limiter
/// reproduces every start and the final state; starts never decrease in booking
/// order; the kept admissions keep the limiter's bound.
fn random_bookings<L: Reserve + RateLimiter>(
    make: &dyn Fn(ManualClock) -> L,
    check: &dyn Fn(&[Start]),
    ops: &[(u8, u32, u64)],
) {
    #[derive(Clone, Copy)]
    struct Booking {
        n: u32,
        decided: u64,
        max_wait: Option<u64>, // None: a try-acquire
        start: u64,
        cancelled: bool,
    }
    let clock = ManualClock::new();
    let limiter = make(clock.clone());
    let mut now = 0u64;
    let mut bookings: Vec<Booking> = Vec::new();
    let mut outstanding: Vec<(usize, Reservation<'_, L>)> = Vec::new();
    for &(kind, n, x) in ops {
        match kind % 4 {
            0 => {
                let max_wait = if x % 3 == 0 { u64::MAX } else { x * 37 };
                if let Ok(r) = limiter.reserve_within(n, Duration::from_nanos(max_wait)) {
                    bookings.push(Booking {
                        n,
                        decided: now,
                        max_wait: Some(max_wait),
                        start: r.ready_at().as_nanos() as u64,
                        cancelled: false,
                    });
                    outstanding.push((bookings.len() - 1, r));
                }
            }
            1 => {
                if limiter.try_acquire_n(n).is_ok() {
                    bookings.push(Booking {
                        n,
                        decided: now,
                        max_wait: None,
                        start: now,
                        cancelled: false,
                    });
                }
            }
            2 if !outstanding.is_empty() => {
                let (i, r) = outstanding.remove(x as usize % outstanding.len());
                let latest = bookings[i + 1..].iter().all(|b| b.cancelled);
                assert_eq!(r.cancel(), latest, "cancel of booking {i}");
                bookings[i].cancelled = latest;
            }
            _ => {
                now += x;
                clock.set(now);
            }
        }
    }
    drop(outstanding);
    let kept: Vec<Booking> = bookings.iter().copied().filter(|b| !b.cancelled).collect();
    for pair in kept.windows(2) {
        assert!(
            pair[0].start <= pair[1].start,
            "starts out of booking order"
        );
    }
    let starts: Vec<Start> = kept
        .iter()
        .map(|b| Start {
            decided: b.decided,
            start: b.start,
            n: b.n,
        })
        .collect();
    check(&starts);
    // Replay the kept bookings alone.
    let replay_clock = ManualClock::new();
    let replay = make(replay_clock.clone());
    for b in &kept {
        replay_clock.set(b.decided);
        let start = match b.max_wait {
            Some(w) => replay
                .reserve_within(b.n, Duration::from_nanos(w))
                .map(|r| r.ready_at().as_nanos() as u64),
            None => replay.try_acquire_n(b.n).map(|()| b.decided),
        };
        assert_eq!(
            start,
            Ok(b.start),
            "replaying {} permits at {}",
            b.n,
            b.decided
        );
    }
    replay_clock.set(now);
    assert_eq!(replay.snapshot(), limiter.snapshot());
}

fn booking_ops() -> impl Strategy<Value = Vec<(u8, u32, u64)>> {
    proptest::collection::vec((0..4u8, 1..=3u32, 0..2_000u64), 1..120)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn token_bucket_bookings_and_cancels(ops in booking_ops(), capacity in 3..=5u32) {
        random_bookings(
            &|clock| TokenBucket::with_clock(capacity, Rate::new(1, Duration::from_nanos(100)), clock).unwrap(),
            &|starts| {
                let admitted: Vec<Admission> =
                    starts.iter().map(|s| Admission { at: s.start, n: s.n }).collect();
                check_token_bucket(&admitted, capacity, 1, 100);
            },
            &ops,
        );
    }

    #[test]
    fn leaky_bucket_bookings_and_cancels(ops in booking_ops(), capacity in 3..=5u32) {
        let rate = Rate::new(1, Duration::from_nanos(100));
        let check = |starts: &[Start]| {
            let admitted: Vec<Admission> =
                starts.iter().map(|s| Admission { at: s.start, n: s.n }).collect();
            check_token_bucket(&admitted, capacity, 1, 100);
        };
        random_bookings(&|clock| LeakyBucket::with_clock(capacity, rate, clock).unwrap(), &check, &ops);
        random_bookings(&|clock| LockingLeakyBucket::with_clock(capacity, rate, clock).unwrap(), &check, &ops);
    }

    #[test]
    fn shaper_bookings_and_cancels(ops in booking_ops(), burst in 0..=2u32) {
        let (rate, wait) = (Rate::new(1, Duration::from_nanos(100)), Duration::from_nanos(1_000));
        let check = |starts: &[Start]| check_shaper(starts, 100, burst, 1_000);
        random_bookings(&|clock| Shaper::with_clock(rate, burst, wait, clock).unwrap(), &check, &ops);
        random_bookings(&|clock| LockingShaper::with_clock(rate, burst, wait, clock).unwrap(), &check, &ops);
    }
}

/// Blocking acquire on a real clock: eight threads take single permits from a
/// 2 ms shaper; the grant times, in reservation order, are spaced at least one
/// interval apart, and nobody is let through before its start; and a big
/// token-bucket request made in the middle of a stream of small ones is granted
/// in its turn, ahead of every small one reserved after it.
///
/// Only what the limiters guarantee is asserted: a loaded machine may
/// deschedule any thread for any time, which can only spread the starts
/// further apart and make the waits end later.
#[test]
fn blocking_acquire_grants_in_reservation_order_on_a_real_clock() {
    let interval = ms(2);
    let shaper = Arc::new(Shaper::new(Rate::per_second(500), 0, ms(100)).unwrap());
    let grants = Arc::new(Mutex::new(Vec::new()));
    let go = Arc::new(Barrier::new(8));
    let handles: Vec<_> = (0..8)
        .map(|_| {
            let (shaper, grants, go) = (shaper.clone(), grants.clone(), go.clone());
            std::thread::spawn(move || {
                go.wait();
                for _ in 0..3 {
                    let asked = Instant::now();
                    let r = shaper.reserve(1).unwrap();
                    let at = r.ready_at();
                    r.wait();
                    grants.lock().unwrap().push((at, asked, Instant::now()));
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let mut grants = grants.lock().unwrap().clone();
    grants.sort();
    assert_eq!(grants.len(), 24);
    for pair in grants.windows(2) {
        let ((start, _, _), (next, _, _)) = (pair[0], pair[1]);
        assert!(next - start >= interval, "starts {start:?} and {next:?}");
    }
    // Nobody was let through before its start. A reservation's start is no
    // earlier than the shaper's reading when it was made, so between asking for
    // the first start and passing the last one, at least the difference of the
    // two starts went by (1 ms for the TSC and `Instant` disagreeing).
    let (first, asked, _) = grants[0];
    let (last, _, passed) = grants[23];
    assert!(
        passed - asked + ms(1) >= last - first,
        "{:?} between asking and passing, starts {first:?} and {last:?}",
        passed - asked
    );

    // A stream of single permits at 1 ms each; after its third, a request for
    // five is made, and the stream does not go on past its tenth until it was
    // made. Every single permit reserved after the big one starts after it.
    let bucket = Arc::new(TokenBucket::new(5, Rate::per_second(1000)).unwrap());
    bucket.try_acquire_n(5).unwrap();
    let streamed = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let big_made = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stream = {
        let (bucket, streamed, big_made) = (bucket.clone(), streamed.clone(), big_made.clone());
        std::thread::spawn(move || {
            (0..40)
                .map(|i| {
                    if i == 10 {
                        while !big_made.load(std::sync::atomic::Ordering::Acquire) {
                            std::thread::yield_now();
                        }
                    }
                    let r = bucket.reserve(1).unwrap();
                    let at = r.ready_at();
                    r.wait();
                    streamed.store(i + 1, std::sync::atomic::Ordering::Release);
                    at
                })
                .collect::<Vec<_>>()
        })
    };
    while streamed.load(std::sync::atomic::Ordering::Acquire) < 3 {
        std::thread::yield_now();
    }
    let big = bucket.reserve(5).unwrap();
    let big_at = big.ready_at();
    big_made.store(true, std::sync::atomic::Ordering::Release);
    big.wait();
    let small = stream.join().unwrap();
    for (i, &at) in small.iter().enumerate().skip(10) {
        assert!(
            at >= big_at + ms(1),
            "single permit {i}, reserved after the big request, starts at {at:?}, \
             before the big request's {big_at:?} plus one interval: it jumped the queue"
        );
    }
    assert!(small.windows(2).all(|pair| pair[1] >= pair[0]), "{small:?}");
}

#[test]
fn zero_and_huge_requests_never_panic() {
    let bucket = TokenBucket::new(3, Rate::per_second(3)).unwrap();
    let shaper = Shaper::new(Rate::per_second(3), 0, ms(1)).unwrap();
    assert_eq!(bucket.reserve(0).unwrap_err(), Denied::ZeroPermits);
    assert_eq!(bucket.acquire(0).unwrap_err(), Denied::ZeroPermits);
    assert_eq!(
        bucket.acquire_timeout(u32::MAX, Duration::MAX).unwrap_err(),
        Denied::ExceedsCapacity {
            requested: u32::MAX,
            capacity: 3
        }
    );
    assert!(matches!(
        shaper.acquire(u32::MAX),
        Err(Denied::ExceedsCapacity { .. })
    ));
    // Reserving far ahead, again and again, never overflows.
    let clock = ManualClock::new();
    let slow = TokenBucket::with_clock(1, Rate::per_hour(1), clock.clone()).unwrap();
    let mut granted = 0;
    while slow.reserve(1).is_ok() {
        granted += 1;
        assert!(granted < 1_000_000, "73 years of hours is about 640,000");
    }
    assert!(slow.try_acquire().is_err());
    // The end of time (clamped to the limiter's 146 years) is past all of it.
    clock.set(u64::MAX);
    assert!(slow.try_acquire().is_ok());
    assert_eq!(slow.reserve(1).unwrap().delay(), Duration::from_secs(3600));
}

#[cfg(feature = "tokio")]
mod with_tokio {
    use super::*;
    use crate::support::poll_once;
    use std::pin::pin;

    #[tokio::test]
    async fn a_dropped_acquire_returns_its_permits() {
        let clock = ManualClock::new();
        let bucket = TokenBucket::with_clock(1, Rate::per_second(10), clock.clone()).unwrap();
        bucket.try_acquire().unwrap();
        let before = bucket.snapshot();
        {
            let mut waiting = pin!(bucket.acquire_async(1));
            assert!(poll_once(waiting.as_mut()).is_pending());
            // Booked: the next reservation would queue behind it.
            assert_ne!(bucket.snapshot(), before);
        } // dropped before its turn
        assert_eq!(bucket.snapshot(), before);
        assert_eq!(bucket.reserve(1).unwrap().ready_at(), ms(100));
    }

    #[tokio::test]
    async fn a_dropped_shaper_wait_returns_its_slot() {
        let clock = ManualClock::new();
        let shaper = Shaper::with_clock(Rate::per_second(10), 0, ms(500), clock).unwrap();
        let first = shaper.reserve(1).unwrap();
        let second = shaper.reserve(1).unwrap();
        {
            let mut waiting = pin!(second.wait_async());
            assert!(poll_once(waiting.as_mut()).is_pending());
        }
        assert_eq!(shaper.reserve(1).unwrap().ready_at(), ms(100));
        drop(first);
    }

    #[tokio::test]
    async fn async_acquire_waits_its_turn_on_a_real_clock() {
        let bucket = Arc::new(TokenBucket::new(1, Rate::per_second(200)).unwrap());
        let start = Instant::now();
        let tasks: Vec<_> = (0..4)
            .map(|_| {
                let bucket = bucket.clone();
                tokio::spawn(async move { bucket.acquire_async(1).await })
            })
            .collect();
        for t in tasks {
            t.await.unwrap().unwrap();
        }
        // One at once, then three 5 ms apart (1 ms for the TSC and `Instant`
        // disagreeing); a loaded machine can only make it longer.
        assert!(start.elapsed() >= ms(14), "{:?}", start.elapsed());

        // A request that cannot be served within its timeout is denied at once
        // and takes nothing. The bucket refills once an hour, so it is still
        // empty however late this thread runs.
        let empty = TokenBucket::new(1, Rate::per_hour(1)).unwrap();
        empty.try_acquire().unwrap();
        let before = empty.snapshot();
        assert!(matches!(
            empty.acquire_timeout_async(1, Duration::ZERO).await,
            Err(Denied::RetryAfter(_))
        ));
        assert!(matches!(
            empty.acquire_timeout_async(1, ms(10)).await,
            Err(Denied::RetryAfter(_))
        ));
        assert_eq!(empty.snapshot().available, before.available);
    }

    #[tokio::test]
    async fn a_timed_out_acquire_returns_its_permits() {
        let clock = ManualClock::new();
        let shaper =
            Shaper::with_clock(Rate::per_second(1), 0, Duration::from_secs(10), clock).unwrap();
        let _first = shaper.reserve(1).unwrap();
        let before = shaper.snapshot();
        // The manual clock never moves, so this would wait forever.
        let gave_up = tokio::time::timeout(ms(20), shaper.acquire_async(1)).await;
        assert!(gave_up.is_err());
        assert_eq!(shaper.snapshot(), before);
    }
}
