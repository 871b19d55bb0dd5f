#![cfg(loom)]
//! loom models of reservations: `reserve`, the no-trace rollback of a bounded
//! `reserve_within` that does not fit, and `cancel`, racing each other on a
//! token bucket and a leaky bucket shaper, with a `ManualClock` created inside
//! each model and moved while they race.
//!
//! After joining, each model checks that the kept bookings (all but the
//! successful cancels) keep the limiter's bound on their start times, that a
//! cancel that succeeded really had no outstanding booking after it, that
//! starts never decrease in booking order, and that the final state is exactly
//! what the kept bookings imply (a single-threaded booking lands right behind
//! them). A known-bad cancel (subtracting its permits' time without checking
//! that it is the latest) must be caught by the same checks.

use std::time::Duration;

use loom::sync::Arc;
use loom::sync::atomic::{AtomicU64, Ordering};
use loom::thread;
use tollgate::{Clock, Denied, ManualClock, Rate, Reserve, Shaper, TokenBucket};
use tollgate_loom_tests::{explore, explore_races};

const INTERVAL: u64 = 10;

fn nanos(ns: u64) -> Duration {
    Duration::from_nanos(ns)
}

/// A booking as a model saw it, with the end of the schedule it wrote. Ends grow
/// with every booking, so sorting by them recovers the order in which the
/// compare-and-swaps took effect.
#[derive(Debug, Clone, Copy)]
struct Booked {
    n: u32,
    start: u64,
    end: u64,
    cancelled: Option<bool>,
}

/// Starts of single permits on a token bucket of `capacity`: at most
/// `capacity + (b − a) / INTERVAL` in any `[a, b]`.
fn assert_bucket_starts(capacity: u64, kept: &[Booked]) {
    for a in kept {
        for b in kept {
            if a.start > b.start {
                continue;
            }
            let count: u64 = kept
                .iter()
                .filter(|k| a.start <= k.start && k.start <= b.start)
                .map(|k| u64::from(k.n))
                .sum();
            assert!(
                count.saturating_sub(capacity) * INTERVAL <= b.start - a.start,
                "bucket bound violated: {count} permits start in [{}, {}]: {kept:#?}",
                a.start,
                b.start
            );
        }
    }
}

/// Checks common to every model, on all bookings made (any thread): the kept
/// ones (all but the successful cancels), in the order their writes took
/// effect, start in that order and keep the bucket bound. Returns them.
///
/// Whether a successful cancel really was the latest booking is checked by its
/// consequence: had it returned a slot that a kept booking still occupied, the
/// next booking into that slot would double it and break the bound, and the
/// final state would not be the one the kept bookings imply (each model checks
/// that last).
///
/// With `slots`, each booking of `n` permits is checked as `n` single permits
/// starting one interval apart (a shaper's queue slots); otherwise all `n` start
/// at its start (a token bucket).
fn assert_bookings(all: &[Booked], capacity: u64, slots: bool) -> Vec<Booked> {
    let mut kept: Vec<Booked> = all
        .iter()
        .copied()
        .filter(|b| b.cancelled != Some(true))
        .collect();
    kept.sort_by_key(|b| b.end);
    for pair in kept.windows(2) {
        assert!(
            pair[0].start <= pair[1].start,
            "granted out of order: {all:#?}"
        );
    }
    let permits: Vec<Booked> = if slots {
        kept.iter()
            .flat_map(|b| {
                (0..u64::from(b.n)).map(move |k| Booked {
                    n: 1,
                    start: b.start + k * INTERVAL,
                    ..*b
                })
            })
            .collect()
    } else {
        kept.clone()
    };
    assert_bucket_starts(capacity, &permits);
    kept
}

#[test]
fn token_bucket_reserve_cancel_and_rollback_race() {
    explore_races(
        "waiting::token_bucket_reserve_cancel_and_rollback_race",
        3,
        || {
            const CAPACITY: u32 = 1;
            let clock = ManualClock::new();
            let bucket = Arc::new(
                TokenBucket::with_clock(CAPACITY, Rate::new(1, nanos(INTERVAL)), clock.clone())
                    .unwrap(),
            );
            let end_of = |start: u64| start + u64::from(CAPACITY) * INTERVAL;

            // Books one permit, then changes its mind.
            let b = bucket.clone();
            let canceller = thread::spawn(move || {
                let r = b.reserve(1).unwrap();
                let start = r.ready_at().as_nanos() as u64;
                let returned = r.cancel();
                vec![Booked {
                    n: 1,
                    start,
                    end: 0,
                    cancelled: Some(returned),
                }]
            });
            // Books one permit, then tries one more that must start at once; the
            // second either fits or leaves no trace. Moves the clock in between.
            let (b, c) = (bucket.clone(), clock.clone());
            let booker = thread::spawn(move || {
                let r = b.reserve(1).unwrap();
                let mut mine = vec![Booked {
                    n: 1,
                    start: r.ready_at().as_nanos() as u64,
                    end: 0,
                    cancelled: None,
                }];
                c.advance(nanos(INTERVAL / 2));
                match b.reserve_within(1, Duration::ZERO) {
                    Ok(r) => mine.push(Booked {
                        n: 1,
                        start: r.ready_at().as_nanos() as u64,
                        end: 0,
                        cancelled: None,
                    }),
                    Err(Denied::RetryAfter(wait)) => assert!(!wait.is_zero()),
                    Err(other) => panic!("{other:?}"),
                }
                mine
            });

            let mut all: Vec<Booked> = [canceller.join().unwrap(), booker.join().unwrap()].concat();
            // At capacity 1 a booking's end is `max(TAT, now) + I` and its start
            // `max(now, end − I)`, so the end is always its start plus one interval.
            for b in &mut all {
                b.end = end_of(b.start);
            }
            let kept = assert_bookings(&all, u64::from(CAPACITY), false);
            // The state is exactly what the kept bookings imply: a fresh booking
            // starts right at the last kept end (or now), no hole, no overlap.
            let now = clock.now();
            let expected = kept.last().map_or(now, |k| k.end.max(now));
            let next = bucket.reserve(1).unwrap().ready_at().as_nanos() as u64;
            assert_eq!(next, expected, "{all:#?}");
        },
    );
}

#[test]
fn shaper_cancels_race_with_bookings() {
    explore_races("waiting::shaper_cancels_race_with_bookings", 3, || {
        // No burst, queue up to 60 ns: each booking's slot is [start, start + n·I).
        let clock = ManualClock::new();
        let shaper = Arc::new(
            Shaper::with_clock(
                Rate::new(1, nanos(INTERVAL)),
                0,
                nanos(6 * INTERVAL),
                clock.clone(),
            )
            .unwrap(),
        );
        fn book(
            s: &Shaper<ManualClock>,
            n: u32,
        ) -> Result<(tollgate::Reservation<'_, Shaper<ManualClock>>, Booked), Denied> {
            s.reserve(n).map(|r| {
                let start = r.ready_at().as_nanos() as u64;
                (
                    r,
                    Booked {
                        n,
                        start,
                        end: start + u64::from(n) * INTERVAL,
                        cancelled: None,
                    },
                )
            })
        }

        let s = shaper.clone();
        let a = thread::spawn(move || {
            let (r1, mut b1) = book(&s, 1).unwrap();
            let (r2, mut b2) = book(&s, 1).unwrap();
            // Newest first: the second always can come back unless the other
            // thread booked after it; then the first only if the second did.
            b2.cancelled = Some(r2.cancel());
            b1.cancelled = Some(r1.cancel());
            vec![b1, b2]
        });
        let (s, c) = (shaper.clone(), clock.clone());
        let b = thread::spawn(move || {
            c.advance(nanos(INTERVAL));
            match book(&s, 2) {
                Ok((_r, b)) => vec![b],
                Err(Denied::RetryAfter(_)) => vec![],
                Err(other) => panic!("{other:?}"),
            }
        });

        let all: Vec<Booked> = [a.join().unwrap(), b.join().unwrap()].concat();
        // Shaper, no burst: one permit per interval, i.e. the bucket bound with
        // capacity 1 on every permit's own slot.
        let kept = assert_bookings(&all, 1, true);
        // The schedule ends exactly at the last kept booking's end.
        let now = clock.now();
        let end = kept.iter().map(|k| k.end).max().unwrap_or(0);
        let next = shaper.reserve(1).unwrap().ready_at().as_nanos() as u64;
        assert_eq!(next, end.max(now), "{all:#?}");
    });
}

/// A shaper whose cancel subtracts its own permits' time from the end with a
/// `fetch_sub`, without checking that it is still the latest booking: the bug
/// of returning permits "without disturbing later reservations" done naively.
struct FetchSubCancelShaper {
    end: AtomicU64,
    clock: ManualClock,
}

impl FetchSubCancelShaper {
    fn reserve(&self) -> Booked {
        let now = self.clock.now();
        let mut end = self.end.load(Ordering::SeqCst);
        loop {
            let start = end.max(now);
            match self.end.compare_exchange(
                end,
                start + INTERVAL,
                Ordering::SeqCst,
                Ordering::SeqCst,
            ) {
                Ok(_) => {
                    return Booked {
                        n: 1,
                        start,
                        end: start + INTERVAL,
                        cancelled: None,
                    };
                }
                Err(actual) => end = actual,
            }
        }
    }

    fn cancel(&self) -> bool {
        self.end.fetch_sub(INTERVAL, Ordering::SeqCst);
        true
    }
}

#[test]
#[should_panic(expected = "bucket bound violated")]
fn known_bad_fetch_sub_cancel_is_caught() {
    explore("waiting::known_bad_fetch_sub_cancel_is_caught", 3, || {
        let clock = ManualClock::new();
        let shaper = Arc::new(FetchSubCancelShaper {
            end: AtomicU64::new(0),
            clock: clock.clone(),
        });
        let s = shaper.clone();
        let a = thread::spawn(move || {
            let mut b = s.reserve();
            b.cancelled = Some(s.cancel());
            vec![b]
        });
        let s = shaper.clone();
        let b = thread::spawn(move || vec![s.reserve()]);
        let mut all = [a.join().unwrap(), b.join().unwrap()].concat();
        // The third booking lands where the broken cancel left the end: on top of
        // the other thread's booking when the cancel came after it.
        all.push(shaper.reserve());
        assert_bookings(&all, 1, false);
    });
}

/// Warm-up's two-word CAS loop (on loom's stand-in for a 128-bit atomic):
/// bookings, a cancel and a clock tick race. Every kept booking (all but a
/// successful cancel) must be reproduced — same start, in start order, at its
/// recorded decision time — by the sequential locking twin, which must then end
/// in the same state: the history is one Guava's algorithm could produce.
#[test]
fn warm_up_bookings_and_a_cancel_race() {
    use std::cell::Cell;
    use tollgate::{LockingWarmUp, RateLimiter, WarmUp};
    use tollgate_loom_tests::{RecordingClock, record};

    explore_races("waiting::warm_up_bookings_and_a_cancel_race", 3, || {
        // 1 permit per 10 ns once warm, warming up over 40 ns, cold factor 3.
        let rate = Rate::new(1, nanos(INTERVAL));
        let warm_up = nanos(4 * INTERVAL);
        let clock = ManualClock::new();
        let limiter = Arc::new(
            WarmUp::with_clock(rate, warm_up, RecordingClock::new(clock.clone())).unwrap(),
        );
        // (decision time, n, start, cancelled)
        type Seen = (u64, u32, u64, Option<bool>);
        fn book(l: &WarmUp<RecordingClock>, n: u32) -> Seen {
            let start = Cell::new(0);
            let op = record(n, || {
                l.reserve(n)
                    .map(|r| start.set(r.ready_at().as_nanos() as u64))
            });
            (op.at.unwrap(), n, start.get(), None)
        }

        let l = limiter.clone();
        let a = thread::spawn(move || {
            let first = book(&l, 1);
            let start = Cell::new(0);
            let mut handle = None;
            let op = record(2, || {
                l.reserve(2).map(|r| {
                    start.set(r.ready_at().as_nanos() as u64);
                    handle = Some(r);
                })
            });
            let returned = handle.unwrap().cancel();
            vec![first, (op.at.unwrap(), 2, start.get(), Some(returned))]
        });
        let (l, c) = (limiter.clone(), clock.clone());
        let b = thread::spawn(move || {
            c.advance(nanos(INTERVAL));
            vec![book(&l, 1)]
        });
        let all: Vec<Seen> = [a.join().unwrap(), b.join().unwrap()].concat();

        let mut kept: Vec<Seen> = all.iter().copied().filter(|s| s.3 != Some(true)).collect();
        kept.sort_by_key(|s| s.2);
        let replay_clock = ManualClock::new();
        let replay = LockingWarmUp::with_clock(rate, warm_up, replay_clock.clone()).unwrap();
        for &(at, n, start, _) in &kept {
            replay_clock.set(at);
            let got = replay.reserve(n).unwrap().ready_at().as_nanos() as u64;
            assert_eq!(got, start, "replaying {kept:?} (all: {all:?})");
        }
        let now = tollgate::Clock::now(&clock);
        replay_clock.set(now);
        assert_eq!(replay.snapshot(), limiter.snapshot(), "{all:?}");
        // And both agree on what comes next.
        let next = limiter.reserve(1).unwrap().ready_at();
        assert_eq!(replay.reserve(1).unwrap().ready_at(), next, "{all:?}");
    });
}

/// Three threads: two book and cancel (one newest-first pair, one single), the
/// third books with a bound while moving the clock. Same checks as above, on a
/// token bucket of one permit, where every booking's end is its start plus one
/// interval.
#[test]
fn three_threads_book_and_cancel_on_a_token_bucket() {
    explore_races(
        "waiting::three_threads_book_and_cancel_on_a_token_bucket",
        3,
        || {
            let clock = ManualClock::new();
            let bucket = Arc::new(
                TokenBucket::with_clock(1, Rate::new(1, nanos(INTERVAL)), clock.clone()).unwrap(),
            );
            let seen = |start: u64, cancelled: Option<bool>| Booked {
                n: 1,
                start,
                end: start + INTERVAL,
                cancelled,
            };

            let b = bucket.clone();
            let pair = thread::spawn(move || {
                let r1 = b.reserve(1).unwrap();
                let r2 = b.reserve(1).unwrap();
                let (s1, s2) = (
                    r1.ready_at().as_nanos() as u64,
                    r2.ready_at().as_nanos() as u64,
                );
                let c2 = r2.cancel();
                let c1 = r1.cancel();
                vec![seen(s1, Some(c1)), seen(s2, Some(c2))]
            });
            let b = bucket.clone();
            let single = thread::spawn(move || {
                let r = b.reserve(1).unwrap();
                let s = r.ready_at().as_nanos() as u64;
                vec![seen(s, Some(r.cancel()))]
            });
            let (b, c) = (bucket.clone(), clock.clone());
            let bounded = thread::spawn(move || {
                c.advance(nanos(INTERVAL));
                match b.reserve_within(1, nanos(INTERVAL)) {
                    Ok(r) => vec![seen(r.ready_at().as_nanos() as u64, None)],
                    Err(Denied::RetryAfter(wait)) => {
                        assert!(!wait.is_zero());
                        vec![]
                    }
                    Err(other) => panic!("{other:?}"),
                }
            });

            let all: Vec<Booked> = [
                pair.join().unwrap(),
                single.join().unwrap(),
                bounded.join().unwrap(),
            ]
            .concat();
            let kept = assert_bookings(&all, 1, false);
            let now = clock.now();
            let expected = kept.last().map_or(now, |k| k.end.max(now));
            let next = bucket.reserve(1).unwrap().ready_at().as_nanos() as u64;
            assert_eq!(next, expected, "{all:#?}");
        },
    );
}
