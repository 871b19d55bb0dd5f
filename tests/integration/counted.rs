//! `Counted`: exact counts under contention, and refunds counted when an
//! `AllOf` hands permits back. Its `tracing` events: `tests/integration/counted_tracing.rs`.

use std::sync::atomic::{AtomicU64, Ordering};

use tollgate::{
    AllOf, Counted, Denied, FixedWindow, ManualClock, Rate, RateLimiter, SlidingLog, TokenBucket,
};

/// What the deciding threads saw, in permits.
#[derive(Default)]
struct Seen {
    admitted: AtomicU64,
    denied: AtomicU64,
}

impl Seen {
    /// `rounds` requests of 1 to `sizes` permits (varied by thread and
    /// round), each answer added to what was seen.
    fn decide<L: RateLimiter>(&self, counted: &Counted<L>, thread: u32, rounds: u32, sizes: u32) {
        for i in 0..rounds {
            let n = 1 + (thread + i) % sizes;
            let seen = match counted.try_acquire_n(n) {
                Ok(()) => &self.admitted,
                Err(_) => &self.denied,
            };
            seen.fetch_add(u64::from(n), Ordering::Relaxed);
        }
    }

    /// The counts, checked against what was seen.
    fn matches<L: RateLimiter>(&self, counted: &Counted<L>) -> tollgate::Counts {
        let counts = counted.counts();
        assert_eq!(counts.admitted, self.admitted.load(Ordering::Relaxed));
        assert_eq!(counts.denied, self.denied.load(Ordering::Relaxed));
        counts
    }
}

/// Four threads decide through one `Counted` bucket with time frozen: the
/// counters equal what the threads saw, permit for permit, and the admitted
/// count is the bucket's capacity.
#[test]
fn counts_are_exact_under_contention() {
    let clock = ManualClock::new();
    let counted = Counted::new(
        "shared",
        TokenBucket::with_clock(1_000, Rate::per_hour(1_000), clock).unwrap(),
    );
    let seen = Seen::default();
    std::thread::scope(|s| {
        for thread in 0..4u32 {
            let (counted, seen) = (&counted, &seen);
            s.spawn(move || seen.decide(counted, thread, 500, 3));
        }
    });
    let counts = seen.matches(&counted);
    assert_eq!(
        counts.admitted,
        1_000 - u64::from(counted.snapshot().available)
    );
}

/// More threads than a counted limiter has cells of their own (at least
/// 8, twice the parallelism), in waves: the later waves take the numbers
/// of exited threads, so a cell passes between threads, and the threads
/// beyond the cells count in the shared one. Every permit is counted.
#[test]
fn counts_are_exact_with_more_threads_than_cells_and_threads_that_come_and_go() {
    let threads_per_wave = 4 * std::thread::available_parallelism().map_or(1, usize::from) + 16;
    let clock = ManualClock::new();
    let counted = Counted::new(
        "waves",
        TokenBucket::with_clock(20_000, Rate::per_hour(20_000), clock).unwrap(),
    );
    let seen = Seen::default();
    for _wave in 0..3 {
        std::thread::scope(|s| {
            for thread in 0..threads_per_wave as u32 {
                let (counted, seen) = (&counted, &seen);
                s.spawn(move || seen.decide(counted, thread, 300, 4));
            }
        });
    }
    let counts = seen.matches(&counted);
    assert!(
        counts.denied > 0,
        "the waves asked for more than the bucket holds"
    );
    assert_eq!(
        counts.admitted,
        20_000 - u64::from(counted.snapshot().available)
    );
}

#[test]
fn every_decision_path_is_counted() {
    let clock = ManualClock::new();
    let window = Counted::new(
        "window",
        FixedWindow::with_clock(Rate::per_hour(10), clock.clone()).unwrap(),
    );
    let log = Counted::new(
        "log",
        SlidingLog::with_clock(Rate::per_hour(1), clock.clone()).unwrap(),
    );
    window.try_acquire_with_snapshot().unwrap();
    assert_eq!(
        window.try_acquire_n(11),
        Err(Denied::ExceedsCapacity {
            requested: 11,
            capacity: 10
        })
    );
    let both = AllOf::new((&window, &log));
    both.try_acquire().unwrap();
    // Denied by the log: the window is refunded, exactly (a count is a sum).
    assert!(both.try_acquire_n(2).is_err());
    let w = window.counts();
    assert_eq!((w.admitted, w.denied, w.refunded), (1 + 1 + 2, 11, 2));
    assert_eq!(window.snapshot().available, 8);
    let l = log.counts();
    assert_eq!((l.admitted, l.denied, l.refunded), (1, 2, 0));
}
