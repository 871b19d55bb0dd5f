//! The warm-up limiter against Guava: the expected waits of Guava's own
//! `RateLimiterTest` for warming-up limiters, a transcription of Guava's
//! floating-point algorithm as a reference model, its twin, and real threads.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use support::lockstep;
use tollgate::{
    ConfigError, Denied, LockingWarmUp, ManualClock, Rate, RateLimiter, Reserve, WarmUp,
};

/// One step of a Guava test: `acquire(n)` (with the wait Guava's algorithm
/// computes, in µs, and the string Guava's test expects), or a user sleep (ms).
#[derive(Debug, Clone, Copy)]
enum Event {
    R(u32, u64, &'static str),
    U(u64),
}
use Event::{R, U};

/// Formats microseconds as Guava's `FakeStopwatch` does (`%3.2f` seconds,
/// rounding half up).
fn guava_format(micros: u64) -> String {
    let centis = (micros + 5_000) / 10_000;
    format!("{}.{:02}", centis / 100, centis % 100)
}

/// Replays a Guava test's events, sleeping (advancing the manual clock) by each
/// wait as Guava's `acquire` does, and checks every wait against Guava's within
/// 1 µs and against the string Guava's test asserts.
fn replay(limiter: &impl Reserve, clock: &ManualClock, events: &[Event]) -> u64 {
    let mut worst = 0;
    for (i, &event) in events.iter().enumerate() {
        match event {
            R(n, guava_micros, expected) => {
                let r = limiter.reserve(n).unwrap();
                let wait = r.delay();
                clock.advance(wait);
                let ns = wait.as_nanos() as u64;
                let off = ns.abs_diff(guava_micros * 1_000);
                worst = worst.max(off);
                assert!(
                    off <= 1_000,
                    "event {i}: waited {ns} ns, Guava {guava_micros} µs"
                );
                assert_eq!(guava_format(ns / 1_000), expected, "event {i}");
                assert_eq!(guava_format(guava_micros), expected, "event {i} (table)");
            }
            U(ms) => clock.advance(Duration::from_millis(ms)),
        }
    }
    worst
}

fn table_test(per_second: u32, warm_up_ms: u64, cold_factor: u32, events: &[Event]) {
    for twin in [false, true] {
        let clock = ManualClock::new();
        let rate = Rate::per_second(per_second);
        let warm_up = Duration::from_millis(warm_up_ms);
        let worst = if twin {
            let l = LockingWarmUp::with_cold_factor(rate, warm_up, cold_factor, clock.clone());
            replay(&l.unwrap(), &clock, events)
        } else {
            let l = WarmUp::with_cold_factor(rate, warm_up, cold_factor, clock.clone());
            replay(&l.unwrap(), &clock, events)
        };
        println!(
            "{per_second}/s, {warm_up_ms} ms, cold factor {cold_factor}: worst {worst} ns off Guava"
        );
    }
}

/// Eight single acquires from rest at the stable rate: the first waits
/// nothing, the others `micros` each (Guava's test shows `shown`).
fn steady(micros: u64, shown: &'static str) -> Vec<Event> {
    std::iter::once(R(1, 0, "0.00"))
        .chain(std::iter::repeat_n(R(1, micros, shown), 7))
        .collect()
}

/// The script of Guava's warm-up tests (4 s of warm-up), from cold: eight
/// acquires, the first free, then the `warming` waits, then the `stable`
/// ones; the last acquire repaid (`repay` ms) and the whole warm-up slept,
/// cold again and the same waits; repaid again and a rest of `rest` ms, too
/// short to get cold: the steady waits.
fn cold_again_then_warm(
    (per_second, cold_factor): (u32, u32),
    warming: &[Event],
    repay: u64,
    rest: u64,
    (stable, shown): (u64, &'static str),
) {
    let cold: Vec<Event> = std::iter::once(R(1, 0, "0.00"))
        .chain(warming.iter().copied())
        .chain(std::iter::repeat_n(R(1, stable, shown), 7 - warming.len()))
        .collect();
    let cold = &cold[..];
    let warm = steady(stable, shown);
    let events = [
        cold,
        &[U(repay), U(4000)],
        cold,
        &[U(repay), U(rest)],
        &warm[..],
    ]
    .concat();
    table_test(per_second, 4000, cold_factor, &events);
}

/// `testWarmUp`: `RateLimiter.create(stopwatch, 2.0, 4000, MILLISECONDS, 3.0)`.
/// After the second cold run it would take another 2 s to get cold.
#[test]
fn guava_test_warm_up() {
    let warming = [
        R(1, 1_375_000, "1.38"),
        R(1, 1_125_000, "1.13"),
        R(1, 875_000, "0.88"),
        R(1, 625_000, "0.63"),
    ];
    cold_again_then_warm((2, 3), &warming, 500, 2000, (500_000, "0.50"));
}

/// `testWarmUpWithColdFactor`: `create(stopwatch, 5.0, 4000, MILLISECONDS, 10.0)`.
/// The fifth wait is 300,227 µs in Guava (its double arithmetic truncated to a
/// microsecond); exactly 300,227,272.7 ns. After the second cold run it would
/// take another 3 s to get cold.
#[test]
fn guava_test_warm_up_with_cold_factor() {
    let warming = [
        R(1, 1_752_500, "1.75"),
        R(1, 1_257_500, "1.26"),
        R(1, 762_500, "0.76"),
        R(1, 300_227, "0.30"),
    ];
    cold_again_then_warm((5, 10), &warming, 200, 1000, (200_000, "0.20"));
}

/// `testWarmUpWithColdFactor1`: a cold factor of 1 is no warm-up at all.
#[test]
fn guava_test_warm_up_with_cold_factor_1() {
    let steady = steady(200_000, "0.20");
    let events = [&steady[..], &[U(340)], &steady[..]].concat();
    table_test(5, 4000, 1, &events);
}

/// Guava's floating-point `SmoothWarmingUp`, transcribed (microseconds, doubles,
/// truncation to `long` where Guava truncates): the reference model.
struct GuavaModel {
    stable: f64,
    warm_up: f64,
    threshold: f64,
    max_permits: f64,
    slope: f64,
    stored: f64,
    next: i64,
}

impl GuavaModel {
    fn new(interval_us: f64, warm_up_us: f64, cold_factor: f64) -> Self {
        let cold = interval_us * cold_factor;
        let threshold = 0.5 * warm_up_us / interval_us;
        let max_permits = threshold + 2.0 * warm_up_us / (interval_us + cold);
        GuavaModel {
            stable: interval_us,
            warm_up: warm_up_us,
            threshold,
            max_permits,
            slope: (cold - interval_us) / (max_permits - threshold),
            stored: max_permits,
            next: 0,
        }
    }

    fn permits_to_time(&self, permits: f64) -> f64 {
        self.stable + permits * self.slope
    }

    fn stored_permits_to_wait_time(&self, stored: f64, mut take: f64) -> i64 {
        let above = stored - self.threshold;
        let mut micros = 0i64;
        if above > 0.0 {
            let from_above = above.min(take);
            let length = self.permits_to_time(above) + self.permits_to_time(above - from_above);
            micros = (from_above * length / 2.0) as i64;
            take -= from_above;
        }
        micros + (self.stable * take) as i64
    }

    /// Guava's `reserve`: the wait, in µs, of `n` permits at `now` (µs).
    fn reserve(&mut self, now: i64, n: u32) -> i64 {
        if now > self.next {
            let fresh = (now - self.next) as f64 / (self.warm_up / self.max_permits);
            self.stored = self.max_permits.min(self.stored + fresh);
            self.next = now;
        }
        let moment = self.next;
        let spend = f64::from(n).min(self.stored);
        let fresh = f64::from(n) - spend;
        let wait =
            self.stored_permits_to_wait_time(self.stored, spend) + (fresh * self.stable) as i64;
        self.next += wait;
        self.stored -= spend;
        (moment - now).max(0)
    }
}

#[derive(Debug, Clone)]
enum Op {
    Acquire(u32),
    Sleep(u64),
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Random acquires (sleeping out each wait, as Guava's `acquire` does) and
    /// user sleeps: the atomic limiter, its twin and Guava's own algorithm wait
    /// the same, up to Guava's own rounding (see the slack below; the table tests
    /// above hold us to 1 µs where Guava's test values are exact).
    #[test]
    fn atomic_twin_and_guava_wait_the_same(
        per_second in prop_oneof![Just(1u32), Just(2), Just(4), Just(5), Just(8), Just(10), Just(100)],
        warm_up_ms in 1..=5_000u64,
        cold_factor in 1..=10u32,
        ops in proptest::collection::vec(prop_oneof![
            4 => (1..=4u32).prop_map(Op::Acquire),
            1 => (0..=3_000u64).prop_map(Op::Sleep),
        ], 1..60),
    ) {
        let rate = Rate::per_second(per_second);
        let warm_up = Duration::from_millis(warm_up_ms);
        let clock = ManualClock::new();
        let atomic = WarmUp::with_cold_factor(rate, warm_up, cold_factor, clock.clone()).unwrap();
        let twin = LockingWarmUp::with_cold_factor(rate, warm_up, cold_factor, clock.clone()).unwrap();
        let mut guava = GuavaModel::new(
            1e6 / f64::from(per_second),
            warm_up_ms as f64 * 1_000.0,
            f64::from(cold_factor),
        );
        // Guava's stopwatch keeps its own time, advanced by Guava's own waits
        // (whole µs), as its FakeStopwatch does; ours by ours (ns).
        let mut guava_now = 0i64;
        let mut requests = 0u64;
        for op in ops {
            match op {
                Op::Acquire(n) => {
                    let expected = guava.reserve(guava_now, n);
                    guava_now += expected;
                    let a = atomic.reserve(n).unwrap().delay();
                    let t = twin.reserve(n).unwrap().delay();
                    prop_assert_eq!(a, t);
                    requests += 1;
                    // Guava truncates each cost to the µs (twice when a request
                    // spans the threshold), so its next free instant runs early
                    // by up to 2 µs a request; after idleness that error becomes
                    // banked idle time, which the warm zone charges at up to
                    // `cold_factor` × the stable rate. (On the cases proptest
                    // shrank to, an exact rational model agrees with ours to
                    // the nanosecond; Guava is the one off.)
                    let off = (a.as_nanos() as u64).abs_diff(expected as u64 * 1_000);
                    let slack = 2_000 * requests * u64::from(cold_factor);
                    prop_assert!(off <= slack, "waited {:?}, Guava {} µs", a, expected);
                    clock.advance(a);
                }
                Op::Sleep(ms) => {
                    let us = ms * 1_000 + ms % 7;
                    guava_now += us as i64;
                    clock.advance(Duration::from_micros(us));
                }
            }
        }
    }

    /// Guava's `testTimeToWarmUpIsHonouredEvenWithWeights`: however the
    /// `warmupPermits` permits are split into requests, taking them from a cold
    /// limiter (and repaying the last) costs exactly the warm-up period.
    #[test]
    fn time_to_warm_up_is_honoured_even_with_weights(
        cold_factor in prop_oneof![Just(2u32), Just(3), Just(10)],
        period_ms in prop_oneof![Just(250u64), Just(500), Just(1_000), Just(2_000), Just(10_000)],
        cuts in proptest::collection::vec(1..=10u32, 1..10),
    ) {
        const WARMUP_PERMITS: u64 = 10;
        // warmupPeriod = (1 + coldFactor) · warmupPermits · stableInterval / 2.
        let warm_up_ms = (1 + u64::from(cold_factor)) * WARMUP_PERMITS * period_ms / 2;
        let clock = ManualClock::new();
        let limiter = WarmUp::with_cold_factor(
            Rate::new(1, Duration::from_millis(period_ms)),
            Duration::from_millis(warm_up_ms),
            cold_factor,
            clock.clone(),
        ).unwrap();
        let mut left = WARMUP_PERMITS as u32;
        let mut total = Duration::ZERO;
        let mut requests = 0;
        for cut in cuts.into_iter().chain(std::iter::repeat(left)) {
            if left == 0 {
                break;
            }
            let n = cut.min(left);
            left -= n;
            let wait = limiter.reserve(n).unwrap().delay();
            clock.advance(wait);
            total += wait;
            requests += 1;
        }
        let wait = limiter.reserve(1).unwrap().delay(); // repay the last
        total += wait;
        let expected = warm_up_ms * 1_000_000;
        let off = (total.as_nanos() as u64).abs_diff(expected);
        prop_assert!(off <= 1_000 * (requests + 1), "{:?} vs {} ms", total, warm_up_ms);
    }
}

#[test]
fn try_acquire_is_guavas_try_acquire() {
    let clock = ManualClock::new();
    let limiter =
        WarmUp::with_clock(Rate::per_second(2), Duration::from_secs(4), clock.clone()).unwrap();
    assert!(limiter.try_acquire().is_ok());
    // The first permit cost the cold interval's trapezoid: 1.375 s.
    assert_eq!(
        limiter.try_acquire(),
        Err(Denied::RetryAfter(Duration::from_millis(1375)))
    );
    let snap = limiter.snapshot();
    assert_eq!(
        (snap.available, snap.until_full),
        (0, Duration::from_millis(1375))
    );
    clock.advance(Duration::from_millis(1375));
    assert!(limiter.try_acquire_n(3).is_ok());
    // A bounded wait that does not fit leaves no trace.
    let before = limiter.snapshot();
    assert!(matches!(
        limiter.acquire_timeout(1, Duration::from_millis(100)),
        Err(Denied::RetryAfter(_))
    ));
    assert_eq!(limiter.snapshot(), before);
}

#[test]
fn cancelling_the_latest_booking_restores_the_warmth() {
    let clock = ManualClock::new();
    let limiter =
        WarmUp::with_clock(Rate::per_second(2), Duration::from_secs(4), clock.clone()).unwrap();
    let _first = limiter.reserve(1).unwrap();
    let second = limiter.reserve(1).unwrap();
    let third = limiter.reserve(2).unwrap();
    assert!(!second.cancel());
    assert!(third.cancel());
    // The two permits are back, and so is the coldness they would have used up:
    // the same request costs the same again.
    assert_eq!(
        limiter.reserve(2).unwrap().ready_at(),
        Duration::from_millis(2500)
    );
}

#[test]
fn odd_requests_and_configurations() {
    let limiter = WarmUp::new(Rate::per_second(10), Duration::from_secs(1)).unwrap();
    assert_eq!(limiter.try_acquire_n(0), Err(Denied::ZeroPermits));
    assert_eq!(limiter.reserve(0).unwrap_err(), Denied::ZeroPermits);
    // A huge request is allowed (Guava's "pay later") as long as its cost fits.
    assert!(limiter.try_acquire_n(u32::MAX).is_ok());
    assert!(limiter.try_acquire().is_err());
    let slow = WarmUp::new(Rate::per_hour(1), Duration::from_secs(1)).unwrap();
    assert!(matches!(
        slow.try_acquire_n(u32::MAX),
        Err(Denied::ExceedsCapacity { .. })
    ));
    // No warm-up at all: every permit at the stable interval.
    let clock = ManualClock::new();
    let flat = WarmUp::with_clock(Rate::per_second(4), Duration::ZERO, clock).unwrap();
    let starts: Vec<_> = (0..3)
        .map(|_| flat.reserve(1).unwrap().ready_at())
        .collect();
    assert_eq!(starts, [0, 250, 500].map(Duration::from_millis));
    // Both twins, with messages, in tests/integration/config_errors.rs.
    let cold = |factor| {
        WarmUp::with_cold_factor(
            Rate::per_second(1),
            Duration::from_secs(1),
            factor,
            ManualClock::new(),
        )
        .map(drop)
    };
    for bad in [0, 1001, u32::MAX] {
        assert_eq!(
            cold(bad),
            Err(ConfigError::InvalidColdFactor { cold_factor: bad })
        );
    }
    assert_eq!((cold(1), cold(1000)), (Ok(()), Ok(())));
    let sixty_days = Duration::from_secs(60 * 60 * 24 * 60);
    assert_eq!(
        WarmUp::new(Rate::per_second(1), sixty_days).unwrap_err(),
        ConfigError::WarmUpTooLong {
            warm_up: sixty_days
        }
    );
    // The longest warm-up accepted is 2^52 ns; one more is refused, by both.
    let longest = Duration::from_nanos(1 << 52);
    assert!(WarmUp::new(Rate::per_second(1), longest).is_ok());
    let over = longest + Duration::from_nanos(1);
    assert_eq!(
        LockingWarmUp::new(Rate::per_second(1), over).unwrap_err(),
        ConfigError::WarmUpTooLong { warm_up: over }
    );
    assert_eq!(
        WarmUp::new(Rate::per_second(1), Duration::MAX).unwrap_err(),
        ConfigError::WarmUpTooLong {
            warm_up: Duration::MAX
        }
    );
    // More than 2^60 ns per permit is still an overflow of the time arithmetic.
    assert_eq!(
        WarmUp::new(
            Rate::new(1, Duration::from_nanos((1 << 60) + 1)),
            Duration::ZERO
        )
        .unwrap_err(),
        ConfigError::Overflow {
            what: "the time per permit (at most 2^60 ns)"
        }
    );
    assert_eq!(
        WarmUp::new(Rate::per_second(0), Duration::from_secs(1)).unwrap_err(),
        ConfigError::ZeroRate
    );
    // A clock that steps back: no panic, no over-admission, not stuck.
    let clock = ManualClock::new();
    clock.set(5_000_000_000);
    let back =
        WarmUp::with_clock(Rate::per_second(10), Duration::from_secs(1), clock.clone()).unwrap();
    assert!(back.try_acquire().is_ok());
    clock.set(0);
    assert!(back.try_acquire().is_err());
    clock.set(u64::MAX);
    assert!(back.try_acquire().is_ok());
}

/// Warm-up is lock-free where the CPU has a 128-bit compare-and-swap
/// (`cmpxchg16b` on x86-64, which a few virtual machines hide); elsewhere
/// portable-atomic falls back to a lock and the decisions stay the same. The
/// check runs where the CPU says it has the instruction and says so, outside
/// the test harness's capture, where it does not.
#[test]
fn the_128_bit_cas_is_lock_free() {
    #[cfg(target_arch = "x86_64")]
    let has_instruction = std::arch::is_x86_feature_detected!("cmpxchg16b");
    #[cfg(target_arch = "aarch64")]
    let has_instruction = true; // ldxp/stxp (or casp) on every aarch64 CPU
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let has_instruction = false;
    if has_instruction {
        assert!(portable_atomic::AtomicU128::is_lock_free());
    } else {
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED the_128_bit_cas_is_lock_free: this CPU has no 128-bit \
             compare-and-swap, so WarmUp runs on portable-atomic's lock-based fallback \
             (same decisions, not lock-free)"
        );
    }
}

/// Four threads reserve single permits in lock-step rounds: whichever thread
/// gets which, the starts granted in a round are exactly the ones a sequential
/// limiter grants to as many requests at that instant.
#[test]
fn concurrent_bookings_follow_the_sequential_schedule() {
    const THREADS: usize = 4;
    let clock = ManualClock::new();
    let rate = Rate::per_second(1000);
    let warm_up = Duration::from_millis(20);
    let limiter = Arc::new(WarmUp::with_clock(rate, warm_up, clock.clone()).unwrap());
    let mut now = 0u64;
    let times: Vec<u64> = (0..200u64)
        .map(|round| {
            now += (round * 7919 % 11) * 1_300_000;
            now
        })
        .collect();
    let l = limiter.clone();
    let rounds = lockstep(&clock, THREADS, &times, move |thread, round| {
        (0..1 + (thread + round) % 3)
            .filter_map(|_| l.reserve_within(1, Duration::from_millis(5)).ok())
            .map(|r| r.ready_at().as_nanos() as u64)
            .collect()
    });
    let reference_clock = ManualClock::new();
    let reference = WarmUp::with_clock(rate, warm_up, reference_clock.clone()).unwrap();
    let mut total = 0;
    for (round, mut starts) in rounds.into_iter().enumerate() {
        starts.sort_unstable();
        reference_clock.set(times[round]);
        let expected: Vec<u64> = (0..starts.len())
            .map(|_| reference.reserve(1).unwrap().ready_at().as_nanos() as u64)
            .collect();
        assert_eq!(starts, expected, "round {round}");
        total += starts.len();
    }
    assert!(total > 150, "{total}");
}
