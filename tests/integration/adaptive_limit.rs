//! `AdaptiveLimit` under real threads: the in-flight bound on recorded
//! permits while the limit moves, nothing stranded, and the gate following
//! its algorithm once the releases stop. The races themselves are
//! model-checked (`loom-tests/tests/adaptive.rs`); these tests run the same
//! code at scale, asserting only what is guaranteed.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

use tollgate::{
    AdaptiveLimit, Aimd, Gradient2, LimitAlgorithm, ManualClock, Outcome, Vegas, Windowed,
};

/// Threads take permits, hold them briefly, and end them with outcomes that
/// push the limit both ways. An independent holder count, raised after a
/// grant and lowered before the release, never exceeds the largest limit
/// the algorithm can reach; each permit's own report is within the limit it
/// was granted under; afterwards nothing is in flight and the gate's limit
/// is the algorithm's.
fn stress<A: LimitAlgorithm + 'static>(algorithm: A, max: u32) {
    const THREADS: usize = 4;
    const PERMITS: usize = 20_000;
    let limit = Arc::new(AdaptiveLimit::new(algorithm).unwrap());
    let holders = Arc::new(AtomicU32::new(0));
    let peak = Arc::new(AtomicU32::new(0));
    let start = Arc::new(Barrier::new(THREADS));
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let (limit, holders, peak, start) = (
                Arc::clone(&limit),
                Arc::clone(&holders),
                Arc::clone(&peak),
                Arc::clone(&start),
            );
            thread::spawn(move || {
                start.wait();
                let mut granted = 0;
                let mut i = t;
                while granted < PERMITS {
                    i = i
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let Some(permit) = limit.try_acquire() else {
                        thread::yield_now();
                        continue;
                    };
                    granted += 1;
                    let now = holders.fetch_add(1, Ordering::SeqCst) + 1;
                    peak.fetch_max(now, Ordering::SeqCst);
                    assert!(
                        permit.granted_in_flight() <= max,
                        "{} in flight past the largest limit {max}",
                        permit.granted_in_flight()
                    );
                    if i % 7 == 0 {
                        thread::yield_now();
                    }
                    holders.fetch_sub(1, Ordering::SeqCst);
                    let outcome = match i % 10 {
                        0 => Outcome::Dropped,
                        1 => Outcome::Ignored,
                        _ => Outcome::Success,
                    };
                    permit.record(outcome);
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().unwrap();
    }
    assert!(
        peak.load(Ordering::SeqCst) <= max,
        "held {} at once, past the largest limit {max}",
        peak.load(Ordering::SeqCst)
    );
    assert_eq!(limit.in_flight(), 0, "a permit was stranded");
    assert_eq!(
        limit.limit(),
        limit.algorithm().limit(),
        "the gate did not follow the algorithm"
    );
    let changes = limit.history().unwrap().changes();
    assert!(changes > 0, "the limit never moved");
}

#[test]
fn aimd_bound_holds_while_the_limit_moves() {
    stress(
        Aimd::builder()
            .min_limit(1)
            .initial_limit(2)
            .max_limit(6)
            .build()
            .unwrap(),
        6,
    );
}

#[test]
fn vegas_bound_holds_while_the_limit_moves() {
    stress(
        Vegas::builder()
            .min_limit(1)
            .initial_limit(3)
            .max_limit(8)
            .build()
            .unwrap(),
        8,
    );
}

#[test]
fn gradient2_bound_holds_while_the_limit_moves() {
    stress(
        Gradient2::builder()
            .min_limit(1)
            .initial_limit(3)
            .max_limit(8)
            .drop_backoff(0.5)
            .build()
            .unwrap(),
        8,
    );
}

/// A shrinking limit revokes nothing: permits held past it stay valid, and
/// no new one is granted until the count is back under the new limit.
#[test]
fn a_shrinking_limit_revokes_nothing() {
    let aimd = Aimd::builder()
        .min_limit(1)
        .initial_limit(4)
        .backoff_ratio(0.5)
        .build()
        .unwrap();
    let limit = AdaptiveLimit::with_clock(aimd, ManualClock::new()).unwrap();
    let held: Vec<_> = (0..4).map(|_| limit.try_acquire().unwrap()).collect();
    let mut held = held.into_iter();
    held.next().unwrap().dropped(); // 4 → 2, with 3 still held
    assert_eq!((limit.limit(), limit.in_flight()), (2, 3));
    assert!(limit.try_acquire().is_none(), "3 held against a limit of 2");
    held.next().unwrap().ignore();
    assert!(limit.try_acquire().is_none(), "2 held against a limit of 2");
    held.next().unwrap().ignore();
    assert!(limit.try_acquire().is_some(), "1 held: room for one");
}

/// A permit dropped unrecorded is ignored: it goes back and the algorithm
/// learns nothing; a blocking wait that times out holds nothing.
#[test]
fn unrecorded_and_timed_out_permits_leave_no_trace() {
    let aimd = Aimd::builder()
        .min_limit(1)
        .initial_limit(1)
        .build()
        .unwrap();
    let limit = AdaptiveLimit::new(aimd).unwrap();
    let held = limit.try_acquire().unwrap();
    assert!(limit.acquire_timeout(Duration::from_millis(5)).is_none());
    drop(held);
    assert_eq!(limit.in_flight(), 0);
    assert_eq!(
        limit.history().unwrap().changes(),
        0,
        "a drop taught it something"
    );
    // Behind `Windowed`, one aggregated sample a window: the gate still
    // follows whatever the algorithm decides.
    let windowed = Windowed::builder()
        .min_samples(1)
        .build(
            Aimd::builder()
                .min_limit(1)
                .initial_limit(2)
                .build()
                .unwrap(),
        )
        .unwrap();
    let clock = ManualClock::new();
    let limit = AdaptiveLimit::with_clock(windowed, clock.clone()).unwrap();
    for _ in 0..3 {
        let permit = limit.try_acquire().unwrap();
        clock.advance(Duration::from_secs(2));
        permit.dropped();
    }
    assert_eq!(limit.limit(), limit.algorithm().limit());
    assert!(limit.limit() < 2, "three windows of drops did not back off");
}
