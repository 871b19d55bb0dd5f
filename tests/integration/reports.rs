//! Decisions that report their quota: `try_acquire_n_with_snapshot`.
//!
//! - Sequentially, for every limiter (lock-free and locking twin) and random
//!   request sequences on a manual clock: the reporting call makes the same
//!   decision as `try_acquire_n` on an identical limiter, and its report equals
//!   the `snapshot()` taken right after it at the same time.
//! - Concurrently, for the limiters that report from the word their
//!   compare-and-swap wrote: with time frozen, the `available` figures that the
//!   admissions of any number of racing threads report are exactly
//!   `capacity − 1, …, 0`, each once, whatever the interleaving. A report read
//!   after the decision (a second load) could show two threads the same figure.

use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

use proptest::prelude::*;
use tollgate::LogConfig;
use tollgate::keyed::{
    BucketConfig, Keyed, MeterConfig, ShaperConfig, Tunable, WarmUpConfig, WindowConfig,
};
use tollgate::{
    ApproxSlidingWindow, Denied, FixedWindow, LeakyBucket, LeasedFixedWindow, LeasedTokenBucket,
    LockingApproxSlidingWindow, LockingFixedWindow, LockingLeakyBucket, LockingShaper,
    LockingSlidingLog, LockingSlidingWindow, LockingTokenBucket, LockingWarmUp, ManualClock, Rate,
    RateLimiter, Shaper, SlidingLog, SlidingWindow, Snapshot, TokenBucket, WarmUp,
};

type Build = fn(ManualClock) -> Box<dyn RateLimiter + Send + Sync>;

/// Every limiter kind at 10 permits per second: each lock-free limiter
/// followed by its locking twin, then the reconfigurable ones, then the leased
/// token bucket.
fn every_limiter() -> Vec<(&'static str, Build)> {
    vec![
        ("TokenBucket", |c| {
            Box::new(TokenBucket::with_clock(10, Rate::per_second(10), c).unwrap())
        }),
        ("LockingTokenBucket", |c| {
            Box::new(LockingTokenBucket::with_clock(10, Rate::per_second(10), c).unwrap())
        }),
        ("FixedWindow", |c| {
            Box::new(FixedWindow::with_clock(Rate::per_second(10), c).unwrap())
        }),
        ("LockingFixedWindow", |c| {
            Box::new(LockingFixedWindow::with_clock(Rate::per_second(10), c).unwrap())
        }),
        ("LeakyBucket", |c| {
            Box::new(LeakyBucket::with_clock(10, Rate::per_second(10), c).unwrap())
        }),
        ("LockingLeakyBucket", |c| {
            Box::new(LockingLeakyBucket::with_clock(10, Rate::per_second(10), c).unwrap())
        }),
        ("Shaper", |c| {
            Box::new(Shaper::with_clock(Rate::per_second(10), 3, Duration::ZERO, c).unwrap())
        }),
        ("LockingShaper", |c| {
            Box::new(LockingShaper::with_clock(Rate::per_second(10), 3, Duration::ZERO, c).unwrap())
        }),
        ("WarmUp", |c| {
            Box::new(WarmUp::with_clock(Rate::per_second(10), Duration::from_secs(2), c).unwrap())
        }),
        ("LockingWarmUp", |c| {
            Box::new(
                LockingWarmUp::with_clock(Rate::per_second(10), Duration::from_secs(2), c).unwrap(),
            )
        }),
        ("SlidingWindow", |c| {
            Box::new(SlidingWindow::with_clock(Rate::per_second(10), c).unwrap())
        }),
        ("LockingSlidingWindow", |c| {
            Box::new(LockingSlidingWindow::with_clock(Rate::per_second(10), c).unwrap())
        }),
        ("ApproxSlidingWindow", |c| {
            Box::new(ApproxSlidingWindow::with_clock(Rate::per_second(10), c).unwrap())
        }),
        ("LockingApproxSlidingWindow", |c| {
            Box::new(LockingApproxSlidingWindow::with_clock(Rate::per_second(10), c).unwrap())
        }),
        ("SlidingLog", |c| {
            Box::new(SlidingLog::with_clock(Rate::per_second(10), c).unwrap())
        }),
        ("LockingSlidingLog", |c| {
            Box::new(LockingSlidingLog::with_clock(Rate::per_second(10), c).unwrap())
        }),
        ("Tunable<TokenBucket>", |c| {
            let cfg = BucketConfig::new(10, Rate::per_second(10)).unwrap();
            Box::new(Tunable::<TokenBucket<ManualClock>>::with_clock(cfg, c))
        }),
        ("Tunable<FixedWindow>", |c| {
            let cfg = WindowConfig::new(Rate::per_second(10)).unwrap();
            Box::new(Tunable::<FixedWindow<ManualClock>>::with_clock(cfg, c))
        }),
        // Its twin is `LockingTokenBucket` (compared in
        // tests/integration/leased_token_bucket.rs), so it sits outside the pairs above.
        ("LeasedTokenBucket", |c| {
            Box::new(LeasedTokenBucket::with_clock(10, Rate::per_second(10), c).unwrap())
        }),
        // Its twin is `LockingFixedWindow` (compared in
        // tests/integration/leased_fixed_window.rs).
        ("LeasedFixedWindow", |c| {
            Box::new(LeasedFixedWindow::with_clock(Rate::per_second(10), c).unwrap())
        }),
    ]
}

/// One step of a request sequence: move the clock forward, then ask for `n`
/// (0 and above-capacity requests included).
fn steps() -> impl Strategy<Value = Vec<(u64, u32)>> {
    prop::collection::vec((0u64..150_000_000, 0u32..13), 1..60)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn a_report_is_the_decision_and_the_state_it_left(steps in steps()) {
        for (name, build) in every_limiter() {
            let (plain_clock, reporting_clock) = (ManualClock::new(), ManualClock::new());
            let plain = build(plain_clock.clone());
            let reporting = build(reporting_clock.clone());
            let mut now = 0;
            for &(dt, n) in &steps {
                now += dt;
                plain_clock.set(now);
                reporting_clock.set(now);
                let decided = plain.try_acquire_n(n);
                let reported = reporting.try_acquire_n_with_snapshot(n);
                let after = reporting.snapshot();
                match reported {
                    Ok(snap) => {
                        prop_assert_eq!(decided, Ok(()), "{} at {} for {}", name, now, n);
                        prop_assert_eq!(snap, after, "{} at {} for {}", name, now, n);
                    }
                    Err(rejection) => {
                        prop_assert_eq!(decided, Err(rejection.denied), "{} at {} for {}", name, now, n);
                        prop_assert_eq!(rejection.snapshot, after, "{} at {} for {}", name, now, n);
                        prop_assert_eq!(Denied::from(rejection), rejection.denied);
                    }
                }
            }
        }
    }

    #[test]
    fn a_lock_free_limiter_reports_what_its_twin_reports(steps in steps()) {
        let limiters = every_limiter();
        for pair in limiters[..16].chunks(2) {
            let [(name, atomic), (twin_name, twin)] = pair else { unreachable!() };
            prop_assert_eq!(format!("Locking{name}"), *twin_name);
            let clock = ManualClock::new();
            let (atomic, twin) = (atomic(clock.clone()), twin(clock.clone()));
            let mut now = 0;
            for &(dt, n) in &steps {
                now += dt;
                clock.set(now);
                prop_assert_eq!(
                    atomic.try_acquire_n_with_snapshot(n),
                    twin.try_acquire_n_with_snapshot(n),
                    "{} at {} for {}", name, now, n
                );
            }
        }
    }

    #[test]
    fn a_keyed_report_is_the_decision_and_the_state_it_left(
        steps in prop::collection::vec((0u64..150_000_000, 0u32..13, 0u8..4), 1..60),
    ) {
        let (plain_clock, reporting_clock) = (ManualClock::new(), ManualClock::new());
        let cfg = BucketConfig::new(10, Rate::per_second(10)).unwrap();
        let plain = Keyed::<u8, TokenBucket<ManualClock>>::with_clock(cfg, plain_clock.clone());
        let reporting = Keyed::<u8, TokenBucket<ManualClock>>::with_clock(cfg, reporting_clock.clone());
        let window = WindowConfig::new(Rate::per_second(10)).unwrap();
        let pair_cfg = (BucketConfig::new(10, Rate::per_second(10)).unwrap(), window);
        let pair_plain = Keyed::<u8, (TokenBucket<ManualClock>, FixedWindow<ManualClock>)>::with_clock(pair_cfg, plain_clock.clone());
        let pair_reporting = Keyed::<u8, (TokenBucket<ManualClock>, FixedWindow<ManualClock>)>::with_clock(pair_cfg, reporting_clock.clone());
        let meter = MeterConfig::new(10, Rate::per_second(10)).unwrap();
        let meter_plain = Keyed::<u8, LeakyBucket<ManualClock>>::with_clock(meter, plain_clock.clone());
        let meter_reporting = Keyed::<u8, LeakyBucket<ManualClock>>::with_clock(meter, reporting_clock.clone());
        let queue = ShaperConfig::new(Rate::per_second(10), 3, Duration::from_millis(500)).unwrap();
        let queue_plain = Keyed::<u8, Shaper<ManualClock>>::with_clock(queue, plain_clock.clone());
        let queue_reporting = Keyed::<u8, Shaper<ManualClock>>::with_clock(queue, reporting_clock.clone());
        let warm = WarmUpConfig::new(Rate::per_second(10), Duration::from_millis(500)).unwrap();
        let warm_plain = Keyed::<u8, WarmUp<ManualClock>>::with_clock(warm, plain_clock.clone());
        let warm_reporting = Keyed::<u8, WarmUp<ManualClock>>::with_clock(warm, reporting_clock.clone());
        let log = LogConfig::new(Rate::new(10, Duration::from_millis(300))).unwrap();
        let log_plain = Keyed::<u8, SlidingLog<ManualClock>>::with_clock(log.clone(), plain_clock.clone());
        let log_reporting = Keyed::<u8, SlidingLog<ManualClock>>::with_clock(log, reporting_clock.clone());
        let mut now = 0;
        for &(dt, n, key) in &steps {
            now += dt;
            plain_clock.set(now);
            reporting_clock.set(now);
            for (decided, reported, after) in [
                (plain.try_acquire_n(&key, n), reporting.try_acquire_n_with_snapshot(&key, n), reporting.snapshot(&key)),
                (pair_plain.try_acquire_n(&key, n), pair_reporting.try_acquire_n_with_snapshot(&key, n), pair_reporting.snapshot(&key)),
                (meter_plain.try_acquire_n(&key, n), meter_reporting.try_acquire_n_with_snapshot(&key, n), meter_reporting.snapshot(&key)),
                (queue_plain.try_acquire_n(&key, n), queue_reporting.try_acquire_n_with_snapshot(&key, n), queue_reporting.snapshot(&key)),
                (warm_plain.try_acquire_n(&key, n), warm_reporting.try_acquire_n_with_snapshot(&key, n), warm_reporting.snapshot(&key)),
                (log_plain.try_acquire_n(&key, n), log_reporting.try_acquire_n_with_snapshot(&key, n), log_reporting.snapshot(&key)),
            ] {
                match reported {
                    Ok(snap) => {
                        prop_assert_eq!(decided, Ok(()));
                        prop_assert_eq!(snap, after);
                    }
                    Err(rejection) => {
                        prop_assert_eq!(decided, Err(rejection.denied));
                        prop_assert_eq!(rejection.snapshot, after);
                    }
                }
            }
        }
    }
}

/// `threads` threads race for every permit of a full limiter with the clock
/// frozen; returns the `available` each admission reported, sorted.
fn race(
    ask: impl Fn() -> Result<Snapshot, tollgate::Rejection> + Send + Sync + 'static,
    threads: usize,
) -> Vec<u32> {
    let ask = Arc::new(ask);
    let start = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let (ask, start) = (Arc::clone(&ask), Arc::clone(&start));
            thread::spawn(move || {
                start.wait();
                let mut seen = Vec::new();
                // Ask until denied: with time frozen nothing refills.
                while let Ok(snap) = ask() {
                    seen.push(snap.available);
                }
                seen
            })
        })
        .collect();
    let mut all: Vec<u32> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    all.sort_unstable();
    all
}

#[test]
fn racing_admissions_report_each_remaining_count_once() {
    const CAPACITY: u32 = 20_000;
    let everything: Vec<u32> = (0..CAPACITY).collect();
    let threads = 4;
    for round in 0..5 {
        let clock = ManualClock::new();
        let bucket =
            TokenBucket::with_clock(CAPACITY, Rate::per_hour(CAPACITY), clock.clone()).unwrap();
        assert_eq!(
            race(move || bucket.try_acquire_with_snapshot(), threads),
            everything,
            "bucket, round {round}"
        );

        let window = FixedWindow::with_clock(Rate::per_hour(CAPACITY), clock.clone()).unwrap();
        assert_eq!(
            race(move || window.try_acquire_with_snapshot(), threads),
            everything,
            "window, round {round}"
        );

        let meter =
            LeakyBucket::with_clock(CAPACITY, Rate::per_hour(CAPACITY), clock.clone()).unwrap();
        assert_eq!(
            race(move || meter.try_acquire_with_snapshot(), threads),
            everything,
            "meter, round {round}"
        );

        let approx =
            ApproxSlidingWindow::with_clock(Rate::per_hour(CAPACITY), clock.clone()).unwrap();
        assert_eq!(
            race(move || approx.try_acquire_with_snapshot(), threads),
            everything,
            "approx, round {round}"
        );

        let cfg = BucketConfig::new(CAPACITY, Rate::per_hour(CAPACITY)).unwrap();
        let tunable = Tunable::<TokenBucket<ManualClock>>::with_clock(cfg, clock.clone());
        assert_eq!(
            race(move || tunable.try_acquire_with_snapshot(), threads),
            everything,
            "tunable, round {round}"
        );

        let keyed = Keyed::<u32, TokenBucket<ManualClock>>::with_clock(cfg, clock.clone());
        assert_eq!(
            race(move || keyed.try_acquire_with_snapshot(&7), threads),
            everything,
            "keyed hot key, round {round}"
        );
    }
}

#[test]
fn invalid_requests_are_rejected_with_the_state_untouched() {
    let clock = ManualClock::new();
    let bucket = TokenBucket::with_clock(5, Rate::per_second(5), clock.clone()).unwrap();
    bucket.try_acquire_n(2).unwrap();
    let zero = bucket.try_acquire_n_with_snapshot(0).unwrap_err();
    assert_eq!(zero.denied, Denied::ZeroPermits);
    assert_eq!(zero.snapshot.available, 3);
    let big = bucket.try_acquire_n_with_snapshot(6).unwrap_err();
    assert_eq!(
        big.denied,
        Denied::ExceedsCapacity {
            requested: 6,
            capacity: 5
        }
    );
    assert_eq!(big.snapshot.available, 3);

    let keyed = Keyed::<String, TokenBucket<ManualClock>>::with_clock(
        BucketConfig::new(5, Rate::per_second(5)).unwrap(),
        clock,
    );
    let missing = keyed.try_acquire_n_with_snapshot("new", 6).unwrap_err();
    assert_eq!(
        missing.denied,
        Denied::ExceedsCapacity {
            requested: 6,
            capacity: 5
        }
    );
    assert_eq!(
        (missing.snapshot.available, missing.snapshot.capacity),
        (5, 5)
    );
    assert!(
        keyed.is_empty(),
        "a request that can never succeed creates no key"
    );
    assert!(format!("{missing}").contains("5 of 5 permits available"));
}
