//! The sliding windows — striped exact and two-window approximate — against
//! their locking twins, independent sequential reference models and invariant
//! checkers; lock-step stress with recorded admissions (and the under-admission
//! figure); and the traffic scenarios of Jianfeng Fu's "Throttling Solutions in Standalone and Distributed Scenarios"
//! (docs/references.md) with each mode's error.
//!
//! `cargo test --release --test integration sliding_window:: -- --nocapture` prints the
//! figures quoted in `docs/sliding_window.md`.

use crate::support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use support::{
    Admission, Op, Reference, Step, StressRecord, assert_agree, check_sliding_window, lockstep,
    mixed, one, op_steps, stress,
};
use tollgate::MAX_SUB_WINDOWS;
use tollgate::{
    ApproxSlidingWindow, ConfigError, Denied, FixedWindow, LockingApproxSlidingWindow, ManualClock,
    Rate, RateLimiter, SlidingWindow,
};

fn check_request(n: u32, limit: u32) -> Result<(), Denied> {
    match n {
        0 => Err(Denied::ZeroPermits),
        n if n > limit => Err(Denied::ExceedsCapacity {
            requested: n,
            capacity: limit,
        }),
        _ => Ok(()),
    }
}

/// The exact sliding window as a map from sub-window index to admitted
/// permits, answering every question by brute-force sums over it.
#[derive(Debug, Clone)]
struct ReferenceSliding {
    limit: u32,
    sub: u64,
    subs: u64,
    /// The newest sub-window any request (admitted or not) has read.
    newest: u64,
    counts: BTreeMap<u64, u32>,
}

impl ReferenceSliding {
    fn new(limit: u32, sub: u64, subs: u32) -> Self {
        ReferenceSliding {
            limit,
            sub,
            subs: u64::from(subs),
            newest: 0,
            counts: BTreeMap::new(),
        }
    }

    /// Permits admitted in the `subs` sub-windows ending with `q`.
    fn used(&self, q: u64) -> u64 {
        let first = (q + 1).saturating_sub(self.subs);
        self.counts
            .range(first..=q)
            .map(|(_, &c)| u64::from(c))
            .sum()
    }

    fn retry(&self, now: u64, from: u64, n: u32) -> Denied {
        let fit = (from..)
            .find(|&q| self.used(q) + u64::from(n) <= u64::from(self.limit))
            .unwrap();
        Denied::RetryAfter(Duration::from_nanos(fit * self.sub - now))
    }
}

impl Reference for ReferenceSliding {
    fn try_acquire_n(&mut self, now: u64, n: u32) -> Result<(), Denied> {
        check_request(n, self.limit)?;
        let j = now / self.sub;
        if j < self.newest {
            return Err(self.retry(now, self.newest, n));
        }
        self.newest = j;
        if self.used(j) + u64::from(n) <= u64::from(self.limit) {
            *self.counts.entry(j).or_default() += n;
            Ok(())
        } else {
            Err(self.retry(now, j + 1, n))
        }
    }

    fn snapshot(&mut self, now: u64) -> (u32, Duration) {
        let j = now / self.sub;
        let stale = j < self.newest;
        let available = if stale {
            0
        } else {
            (u64::from(self.limit) - self.used(j)) as u32
        };
        let full_at = self
            .counts
            .iter()
            .rev()
            .find(|(_, c)| **c > 0)
            .map_or(0, |(&i, _)| (i + self.subs) * self.sub);
        let open_at = if stale { self.newest * self.sub } else { 0 };
        (
            available,
            Duration::from_nanos(full_at.max(open_at).saturating_sub(now)),
        )
    }
}

/// The two-window counter as a map from window to admitted permits; waits are
/// found by binary search over time rather than by the limiter's closed form.
#[derive(Debug, Clone)]
struct ReferenceApprox {
    limit: u32,
    window: u64,
    /// The newest window with an admission.
    newest: u64,
    counts: BTreeMap<u64, u32>,
}

impl ReferenceApprox {
    fn new(limit: u32, window: u64) -> Self {
        ReferenceApprox {
            limit,
            window,
            newest: 0,
            counts: BTreeMap::new(),
        }
    }

    fn count(&self, k: Option<u64>) -> u32 {
        k.and_then(|k| self.counts.get(&k).copied()).unwrap_or(0)
    }

    /// What a request could get at `t` with nothing else admitted: `None` for a
    /// reading before the newest window.
    fn available(&self, t: u64) -> Option<u32> {
        let k = t / self.window;
        if k < self.newest {
            return None;
        }
        let (prev, cur) = (self.count(k.checked_sub(1)), self.count(Some(k)));
        let left = u128::from(self.window - (t - k * self.window));
        let weighted = (u128::from(prev) * left).div_ceil(u128::from(self.window));
        Some((u128::from(self.limit).saturating_sub(weighted + u128::from(cur))) as u32)
    }

    /// The first time from `now` on at which `ok` holds (it is monotone in
    /// time when nothing is admitted).
    fn first_time(&self, now: u64, ok: impl Fn(u64) -> bool) -> u64 {
        let (mut lo, mut hi) = (now, now.max(self.newest * self.window) + 3 * self.window);
        assert!(ok(hi));
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if ok(mid) { hi = mid } else { lo = mid + 1 }
        }
        lo
    }
}

impl Reference for ReferenceApprox {
    fn try_acquire_n(&mut self, now: u64, n: u32) -> Result<(), Denied> {
        check_request(n, self.limit)?;
        if self.available(now).is_some_and(|a| a >= n) {
            let k = now / self.window;
            self.newest = k;
            *self.counts.entry(k).or_default() += n;
            Ok(())
        } else {
            let at = self.first_time(now, |t| self.available(t).is_some_and(|a| a >= n));
            Err(Denied::RetryAfter(Duration::from_nanos(at - now)))
        }
    }

    fn snapshot(&mut self, now: u64) -> (u32, Duration) {
        let full = self.first_time(now, |t| self.available(t) == Some(self.limit));
        (
            self.available(now).unwrap_or(0),
            Duration::from_nanos(full - now),
        )
    }
}

/// Checks the approximate window's promise on recorded admissions: for every
/// admission at `t`, `prev·(T − e)/T` plus the permits admitted in `t`'s window
/// at times up to `t` is at most `limit` (`prev` = the previous window's total).
fn check_approx(admissions: &[Admission], limit: u32, window: u64) {
    let mut per_window: BTreeMap<u64, u64> = BTreeMap::new();
    for a in admissions {
        *per_window.entry(a.at / window).or_default() += u64::from(a.n);
    }
    let mut sorted = admissions.to_vec();
    sorted.sort_by_key(|a| a.at);
    let (mut current, mut so_far) = (u64::MAX, 0u64);
    let mut i = 0;
    while i < sorted.len() {
        let t = sorted[i].at;
        let k = t / window;
        if k != current {
            (current, so_far) = (k, 0);
        }
        while i < sorted.len() && sorted[i].at == t {
            so_far += u64::from(sorted[i].n);
            i += 1;
        }
        let prev = k
            .checked_sub(1)
            .and_then(|p| per_window.get(&p).copied())
            .unwrap_or(0);
        let left = window - (t - k * window);
        assert!(
            u128::from(prev) * u128::from(left) + u128::from(so_far) * u128::from(window)
                <= u128::from(limit) * u128::from(window),
            "approximate window over-admitted at {t} ns: {prev} before weighing \
             {left}/{window}, {so_far} in the window so far, limit {limit}"
        );
    }
}

/// Turns relative clock moves into absolute `Step`s; backward moves stop at 0.
fn steps(ops: &[Op]) -> Vec<Step> {
    op_steps(ops, |d| d)
}

fn ops(limit: u32, period: u64) -> impl Strategy<Value = Vec<Op>> {
    proptest::collection::vec(
        prop_oneof![
            8 => (1..=limit).prop_map(Op::Acquire),
            1 => prop_oneof![Just(0u32), Just(u32::MAX), Just(limit + 1)].prop_map(Op::Acquire),
            4 => (0..=period / 2).prop_map(Op::Advance),
            1 => (0..=3u64).prop_map(Op::Advance),
            1 => (period..=4 * period).prop_map(Op::Advance),
            1 => (0..=period).prop_map(Op::Back),
        ],
        1..160,
    )
}

/// A window shape: limit, sub-window count, sub-window length, and the period
/// that rounds up to it (so `⌈period / subs⌉ = sub`).
fn shape() -> impl Strategy<Value = (u32, u32, u64, u64)> {
    (1..=12u32, 1..=5u32, 0..=60u64).prop_flat_map(|(limit, subs, extra)| {
        let sub = u64::from(limit) + extra;
        (0..u64::from(subs)).prop_map(move |short| {
            let period = (sub * u64::from(subs) - short).max(u64::from(limit));
            (limit, subs, sub, period)
        })
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    /// Single-threaded, the striped window (1 and 4 stripes) and its twin make
    /// the reference's decisions, retry-afters and snapshots, and the
    /// admissions keep the invariant.
    #[test]
    fn striped_twin_and_reference_agree(
        (limit, subs, sub, period, ops) in shape().prop_flat_map(|(limit, subs, sub, period)| {
            (Just(limit), Just(subs), Just(sub), Just(period), ops(limit, period))
        }),
    ) {
        let rate = Rate::new(limit, Duration::from_nanos(period));
        let clock = ManualClock::new();
        let builder = SlidingWindow::builder(rate).sub_windows(subs).clock(clock.clone());
        let one = builder.clone().stripes(1).build().unwrap();
        let four = builder.clone().stripes(4).build().unwrap();
        let twin = builder.build_locking().unwrap();
        prop_assert_eq!(one.sub_window(), Duration::from_nanos(sub));
        let mut reference = ReferenceSliding::new(limit, sub, subs);
        let admissions = assert_agree(&steps(&ops), &clock, &[&one, &four, &twin], &mut reference);
        check_sliding_window(&admissions, limit, sub, subs);
    }

    /// The same for the approximate window and its twin.
    #[test]
    fn approx_twin_and_reference_agree(
        (limit, window, ops) in (1..=12u32, 0..=200u64).prop_flat_map(|(limit, extra)| {
            let window = u64::from(limit) + extra;
            (Just(limit), Just(window), ops(limit, window))
        }),
    ) {
        let rate = Rate::new(limit, Duration::from_nanos(window));
        let clock = ManualClock::new();
        let atomic = ApproxSlidingWindow::with_clock(rate, clock.clone()).unwrap();
        let twin = LockingApproxSlidingWindow::with_clock(rate, clock.clone()).unwrap();
        let mut reference = ReferenceApprox::new(limit, window);
        let admissions = assert_agree(&steps(&ops), &clock, &[&atomic, &twin], &mut reference);
        check_approx(&admissions, limit, window);
    }
}

// ---- stress: real threads, lock-step rounds, recorded admissions ----

const THREADS: usize = 4;
const ROUNDS: usize = 400;
const ATTEMPTS: usize = 64;

/// Round times with irregular steps (some rounds add nothing, some cross
/// several sub-windows), plus a few steps back.
fn times(step: u64) -> Vec<u64> {
    let mut now = 0u64;
    (0..ROUNDS as u64)
        .map(|round| {
            if round % 37 == 36 {
                now = now.saturating_sub(step);
            } else {
                now += (round * 7919 % 5) * step / 2 + round % 3;
            }
            now
        })
        .collect()
}

/// Denials while budget was left, from a lock-step record of unit requests:
/// in each round (time stands still) an exact limiter would admit
/// `min(demand, room)`, where `room` is what the recorded admissions so far
/// leave in the window; the shortfall is permits denied while budget sat on
/// other stripes or in other threads' hands.
#[derive(Debug, Default)]
struct Shortfall {
    /// Permits an exact limiter would have admitted, over all rounds.
    exact: u64,
    /// Permits denied although the window had room for them.
    missed: u64,
    /// The largest shortfall in one round.
    worst: u64,
    /// Rounds with any shortfall.
    rounds: usize,
}

/// Checks the window's promise on `record`, then its shortfall at a demand
/// of every attempt of every thread.
fn checked_shortfall(
    record: &StressRecord,
    times: &[u64],
    limit: u32,
    sub: u64,
    subs: u32,
) -> Shortfall {
    check_sliding_window(&record.admissions, limit, sub, subs);
    shortfall(record, times, (THREADS * ATTEMPTS) as u64, limit, sub, subs)
}

fn shortfall(
    record: &StressRecord,
    times: &[u64],
    demand: u64,
    limit: u32,
    sub: u64,
    subs: u32,
) -> Shortfall {
    let mut counts: BTreeMap<u64, u64> = BTreeMap::new();
    let mut newest = 0;
    let mut result = Shortfall::default();
    for (round, &now) in times.iter().enumerate() {
        let j = now / sub;
        let admitted = record.per_round[round];
        let room = if j < newest {
            0 // a stale round: nothing is admissible
        } else {
            newest = j;
            let first = (j + 1).saturating_sub(u64::from(subs));
            u64::from(limit) - counts.range(first..=j).map(|(_, c)| c).sum::<u64>()
        };
        let exact = demand.min(room);
        assert!(admitted <= exact, "round {round}: {admitted} > {exact}");
        let missed = exact - admitted;
        result.exact += exact;
        result.missed += missed;
        result.worst = result.worst.max(missed);
        result.rounds += usize::from(missed > 0);
        *counts.entry(j).or_default() += admitted;
    }
    result
}

fn striped(
    limit: u32,
    period: Duration,
    subs: u32,
    stripes: usize,
    clock: ManualClock,
) -> SlidingWindow<ManualClock> {
    SlidingWindow::builder(Rate::new(limit, period))
        .sub_windows(subs)
        .stripes(stripes)
        .clock(clock)
        .build()
        .unwrap()
}

/// The admissions of lock-step rounds `step` ns apart, each thread asking
/// for 1 to 4 permits at a time of the limiter `make` builds on the test
/// clock; asserts that some were admitted.
fn mixed_rounds<L: RateLimiter + Send + Sync + 'static>(
    step: u64,
    make: impl FnOnce(ManualClock) -> L,
) -> Vec<Admission> {
    let clock = ManualClock::new();
    let limiter = make(clock.clone());
    let record = stress(
        Arc::new(limiter),
        &clock,
        THREADS,
        &times(step),
        ATTEMPTS,
        mixed::<4>,
    );
    assert!(!record.admissions.is_empty());
    record.admissions
}

fn stress_unit(stripes: usize, limit: u32, subs: u32) -> Shortfall {
    let period = Duration::from_millis(1);
    let sub = 1_000_000 / u64::from(subs);
    let clock = ManualClock::new();
    let limiter = Arc::new(striped(limit, period, subs, stripes, clock.clone()));
    let times = times(sub / 3);
    let record = stress(limiter, &clock, THREADS, &times, ATTEMPTS, one);
    checked_shortfall(&record, &times, limit, sub, subs)
}

#[test]
fn striped_is_exact_under_contention() {
    for (stripes, limit, subs) in [
        (1, 50, 5),
        (2, 50, 5),
        (4, 50, 5),
        (4, 200, 10),
        (8, 1000, 4),
    ] {
        let s = stress_unit(stripes, limit, subs);
        println!(
            "striped stress: {THREADS} threads, {stripes} stripes, N = {limit}, S = {subs}: \
             {} of {} admissible permits denied ({:.3}%), worst round {}, {} of {ROUNDS} rounds short",
            s.missed,
            s.exact,
            100.0 * s.missed as f64 / s.exact.max(1) as f64,
            s.worst,
            s.rounds
        );
        assert!(s.exact > 0);
    }
}

/// Clients that back off at their first denial (a 429) until the next round:
/// a denial while budget sits in another thread's hands is then a permit the
/// round never admits, so the shortfall shows. A denial can miss only what
/// other threads hold between taking it and spending or putting it back: at
/// most a lease share (`⌈N / 2P⌉`) plus a few requests' worth each.
#[test]
fn striped_under_admission_when_clients_back_off() {
    for (stripes, limit, subs) in [(2, 50, 5), (4, 50, 5), (4, 1_000, 10), (8, 1_000, 4)] {
        let sub = 1_000_000 / u64::from(subs);
        let clock = ManualClock::new();
        let limiter = Arc::new(striped(
            limit,
            Duration::from_millis(1),
            subs,
            stripes,
            clock.clone(),
        ));
        let times = times(sub / 3);
        let rounds = lockstep(&clock, THREADS, &times, move |_, _| {
            let mut admitted = Vec::new();
            for _ in 0..ATTEMPTS {
                match limiter.try_acquire() {
                    Ok(()) => admitted.push(1u32),
                    Err(_) => break,
                }
            }
            admitted
        });
        let record = StressRecord {
            admissions: rounds
                .iter()
                .zip(&times)
                .flat_map(|(r, &at)| r.iter().map(move |&n| Admission { at, n }))
                .collect(),
            per_round: rounds.iter().map(|r| r.len() as u64).collect(),
        };
        let s = checked_shortfall(&record, &times, limit, sub, subs);
        let share = u64::from(limit).div_ceil(2 * stripes as u64);
        let bound = (THREADS as u64 - 1) * (share + 3);
        println!(
            "back-off stress: {THREADS} threads, {stripes} stripes, N = {limit}, S = {subs}: \
             {} of {} admissible permits denied ({:.3}%), worst round {} (bound {bound}), \
             {} of {ROUNDS} rounds short",
            s.missed,
            s.exact,
            100.0 * s.missed as f64 / s.exact.max(1) as f64,
            s.worst,
            s.rounds
        );
        assert!(s.worst <= bound, "{s:?}");
    }
}

#[test]
fn locking_twin_is_exact_and_tight_under_contention() {
    let (limit, subs) = (50, 5);
    let sub = 1_000_000 / u64::from(subs);
    let clock = ManualClock::new();
    let twin = SlidingWindow::builder(Rate::new(limit, Duration::from_millis(1)))
        .sub_windows(subs)
        .clock(clock.clone())
        .build_locking()
        .unwrap();
    let times = times(sub / 3);
    let record = stress(Arc::new(twin), &clock, THREADS, &times, ATTEMPTS, one);
    let s = checked_shortfall(&record, &times, limit, sub, subs);
    assert_eq!(s.missed, 0, "the twin decides under one lock: {s:?}");
}

#[test]
fn striped_keeps_its_bound_with_mixed_sizes() {
    for stripes in [1, 2, 4] {
        let (limit, subs) = (11, 3);
        let rate = Rate::new(limit, Duration::from_micros(3));
        let admissions = mixed_rounds(500, |clock| {
            SlidingWindow::builder(rate)
                .sub_windows(subs)
                .stripes(stripes)
                .clock(clock)
                .build()
                .unwrap()
        });
        check_sliding_window(&admissions, limit, 1_000, subs);
    }
}

#[test]
fn approx_keeps_its_bound_under_contention() {
    let (limit, window) = (40, 1_000_000u64);
    let rate = Rate::new(limit, Duration::from_nanos(window));
    let admissions = mixed_rounds(window / 7, |clock| {
        ApproxSlidingWindow::with_clock(rate, clock).unwrap()
    });
    check_approx(&admissions, limit, window);
}

/// Threads free-running on a moving clock (not lock-step): decision times are
/// not recorded, but the count per sub-window cannot exceed the window, so the
/// total over a run is bounded by the sub-windows it spans.
#[test]
fn striped_total_is_bounded_with_a_moving_clock() {
    let clock = ManualClock::new();
    let (limit, subs) = (64u32, 4u32);
    let limiter = Arc::new(striped(
        limit,
        Duration::from_micros(400),
        subs,
        4,
        clock.clone(),
    ));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let (limiter, stop) = (limiter.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut admitted = 0u64;
                let mut i = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    if limiter.try_acquire_n(mixed::<4>(t, i)).is_ok() {
                        admitted += u64::from(mixed::<4>(t, i));
                    }
                    i += 1;
                }
                admitted
            })
        })
        .collect();
    let steps = 2_000u64;
    for _ in 0..steps {
        clock.advance(Duration::from_nanos(997));
        std::thread::yield_now();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let total: u64 = workers.into_iter().map(|w| w.join().unwrap()).sum();
    // Sub-windows of 100 µs; the run spans `steps · 997` ns. Any S consecutive
    // sub-windows hold at most N, so the sub-windows the run touches hold at
    // most N per S of them, rounded up.
    let touched = steps * 997 / 100_000 + 1;
    let bound = u64::from(limit) * touched.div_ceil(u64::from(subs));
    assert!(total <= bound, "{total} admitted, bound {bound}");
}

// ---- edge cases ----

#[test]
fn odd_request_sizes_never_panic() {
    let window = SlidingWindow::new(Rate::per_second(3)).unwrap();
    support::assert_odd_sizes_denied(&window, 3);
    assert_eq!(window.try_acquire_n(4).unwrap_err().retry_after(), None);
    // The largest limit: a sub-window must be at least u32::MAX ns long.
    let rate = Rate::new(u32::MAX, Duration::from_secs(40));
    for largest in [
        Box::new(SlidingWindow::new(rate).unwrap()) as Box<dyn RateLimiter>,
        Box::new(SlidingWindow::builder(rate).build_locking().unwrap()),
        Box::new(ApproxSlidingWindow::new(rate).unwrap()),
    ] {
        assert_eq!(largest.try_acquire_n(u32::MAX), Ok(()));
        assert!(largest.try_acquire().unwrap_err().retry_after().is_some());
        assert_eq!(largest.snapshot().available, 0);
    }
}

#[test]
fn configuration_errors() {
    let build = |rate: Rate, subs: u32| {
        SlidingWindow::builder(rate)
            .sub_windows(subs)
            .build()
            .map(|_| ())
    };
    assert_eq!(build(Rate::per_second(0), 2), Err(ConfigError::ZeroRate));
    assert_eq!(
        build(Rate::new(1, Duration::ZERO), 2),
        Err(ConfigError::ZeroPeriod)
    );
    assert_eq!(
        build(Rate::per_second(5), 0),
        Err(ConfigError::InvalidSubWindows {
            sub_windows: 0,
            max: MAX_SUB_WINDOWS
        })
    );
    assert_eq!(
        build(Rate::per_second(5), MAX_SUB_WINDOWS + 1),
        Err(ConfigError::InvalidSubWindows {
            sub_windows: MAX_SUB_WINDOWS + 1,
            max: MAX_SUB_WINDOWS
        })
    );
    // Absurd counts are refused before anything is allocated.
    assert!(matches!(
        build(Rate::per_hour(1), u32::MAX),
        Err(ConfigError::InvalidSubWindows { .. })
    ));
    assert!(build(Rate::per_second(5), MAX_SUB_WINDOWS).is_ok());
    // 10 sub-windows of 100 ns cannot hold 1000 permits each; 1 sub-window of
    // 1000 ns can.
    let fine = Rate::new(1_000, Duration::from_micros(1));
    assert_eq!(
        build(fine, 10),
        Err(ConfigError::InvalidSubWindows {
            sub_windows: 10,
            max: 1
        })
    );
    assert!(build(fine, 1).is_ok());
    // The largest count is exact: 3 sub-windows of 334 ns hold 334 permits,
    // 4 of 250 ns do not.
    let rate = Rate::new(334, Duration::from_nanos(1_000));
    assert!(build(rate, 3).is_ok());
    assert_eq!(
        build(rate, 4),
        Err(ConfigError::InvalidSubWindows {
            sub_windows: 4,
            max: 3
        })
    );
    // The locking twin refuses the same counts.
    assert_eq!(
        SlidingWindow::builder(fine)
            .sub_windows(2)
            .build_locking()
            .map(|_| ()),
        Err(ConfigError::InvalidSubWindows {
            sub_windows: 2,
            max: 1
        })
    );
    assert!(matches!(
        build(Rate::new(1, Duration::from_secs(u64::MAX)), 2),
        Err(ConfigError::Overflow { .. })
    ));
    assert!(matches!(
        ApproxSlidingWindow::new(Rate::new(2, Duration::from_nanos(1))),
        Err(ConfigError::TooFine { .. })
    ));
    // The default sub-window count shrinks for very fine rates instead of failing.
    let fine = SlidingWindow::new(Rate::new(1_000_000_000, Duration::from_secs(1))).unwrap();
    assert_eq!(fine.sub_windows(), 1);
    let fine = SlidingWindow::new(Rate::new(300_000_000, Duration::from_secs(1))).unwrap();
    assert_eq!(fine.sub_windows(), 3);
    assert_eq!(
        SlidingWindow::new(Rate::per_second(100))
            .unwrap()
            .sub_windows(),
        10
    );
}

/// A clock that steps back makes the window deny until the clock catches up,
/// with a retry-after that points there, then it carries on.
#[test]
fn backwards_clock_denies_until_caught_up() {
    let clock = ManualClock::new();
    let window = striped(4, Duration::from_millis(4), 4, 2, clock.clone());
    let twin = SlidingWindow::builder(Rate::new(4, Duration::from_millis(4)))
        .sub_windows(4)
        .clock(clock.clone())
        .build_locking()
        .unwrap();
    for limiter in [&window as &dyn RateLimiter, &twin] {
        clock.set(5_500_000); // sub-window 5
        assert_eq!(limiter.try_acquire(), Ok(()));
        clock.set(2_500_000); // back to sub-window 2
        assert_eq!(
            limiter.try_acquire(),
            Err(Denied::RetryAfter(Duration::from_micros(2_500)))
        );
        assert_eq!(limiter.snapshot().available, 0);
        clock.set(5_000_000);
        assert_eq!(limiter.try_acquire_n(3), Ok(()));
        clock.set(0);
    }
}

/// Over the whole 2^62 ns range, indices stay distinct (an old sub-window's
/// charge or lease is never taken for a new one).
#[test]
fn indices_never_wrap() {
    let clock = ManualClock::new();
    let rate = Rate::new(u32::MAX, Duration::from_nanos(2 * u64::from(u32::MAX)));
    let window = SlidingWindow::builder(rate)
        .sub_windows(2)
        .stripes(2)
        .clock(clock.clone())
        .build()
        .unwrap();
    let mut now = 0u64;
    while now < (1 << 62) {
        assert_eq!(window.try_acquire_n(u32::MAX), Ok(()), "at {now}");
        assert!(window.try_acquire().is_err());
        now = now.saturating_mul(3).max(u64::from(u32::MAX)) + 2 * u64::from(u32::MAX);
        clock.set(now);
    }
}

/// The worry: a thread still spending a lease from a sub-window while
/// others recycle that sub-window's slot. A lease is stamped with its
/// sub-window, so it cannot be spent in the new one.
#[test]
fn stale_lease_is_not_spent_in_a_new_sub_window() {
    let clock = ManualClock::new();
    // N = 8 per 2 sub-windows of 1 µs, one stripe shared by both threads here.
    let window = Arc::new(striped(8, Duration::from_micros(2), 2, 1, clock.clone()));
    assert_eq!(window.try_acquire(), Ok(())); // leases a share into the stripe
    clock.set(2_000); // sub-window 2: the slot of sub-window 0 is recycled
    let other = {
        let window = window.clone();
        std::thread::spawn(move || (0..20).filter(|_| window.try_acquire().is_ok()).count())
    };
    let here = (0..20).filter(|_| window.try_acquire().is_ok()).count();
    assert_eq!(here + other.join().unwrap(), 8);
}

// ---- the scenarios of Fu's throttling article: each mode's error ----

const SECOND: u64 = 1_000_000_000;
const MINUTE: u64 = 60 * SECOND;

fn evenly(start: u64, gap: u64, count: u64) -> impl Iterator<Item = u64> {
    (0..count).map(move |i| start + i * gap)
}

/// The traffic of Fu's throttling article (§3.1, §3.2), against 100 per minute.
fn scenarios() -> Vec<(&'static str, Vec<u64>)> {
    let boundary = |at_zero: usize| {
        let mut arrivals = vec![0; at_zero];
        arrivals.extend(evenly(50 * SECOND, SECOND / 10, 200));
        arrivals
    };
    let stampede = (0..5u64)
        .flat_map(|m| evenly(m * MINUTE + MINUTE - SECOND / 2, SECOND / 150, 150))
        .collect();
    vec![
        // Fu's article §3.1: 200 a minute, evenly spread, for 5 minutes.
        ("steady", evenly(0, MINUTE / 200, 1_000).collect()),
        // §3.1 "critical mutation": a few at 0:00, then 10/s from 0:50 to 1:10.
        ("boundary", boundary(5)),
        ("burst+boundary", boundary(100)),
        // §3.2 precision: 20/s from 0:05 for two minutes.
        (
            "precision",
            evenly(5 * SECOND, SECOND / 20, 2_400).collect(),
        ),
        // System-design notes: clients stampede as each minute resets, 150
        // requests in the second around every boundary.
        ("stampede", stampede),
    ]
}

/// Requests decided against the exact rule "at most 100 in (t − 60 s, t]" on
/// the limiter's own admission history: allowed although the rule would deny,
/// and denied although it would allow.
#[derive(Debug, Default, Clone)]
struct Error {
    /// Admission times, in order.
    times: Vec<u64>,
    admitted: usize,
    busiest: usize,
    wrongly_allowed: usize,
    wrongly_denied: usize,
}

/// Replays single-permit `arrivals` through `decide` (true = admitted at `t`).
fn replay(arrivals: &[u64], mut decide: impl FnMut(u64) -> bool) -> Error {
    let mut admitted: Vec<u64> = Vec::new();
    let mut error = Error::default();
    let mut first = 0;
    for &t in arrivals {
        while first < admitted.len() && admitted[first] + MINUTE <= t {
            first += 1;
        }
        let exact_allows = admitted.len() - first < 100;
        let allowed = decide(t);
        match (allowed, exact_allows) {
            (true, false) => error.wrongly_allowed += 1,
            (false, true) => error.wrongly_denied += 1,
            _ => {}
        }
        if allowed {
            admitted.push(t);
        }
    }
    error.admitted = admitted.len();
    error.busiest = busiest(&admitted, MINUTE);
    error.times = admitted;
    error
}

/// The most admissions in any half-open span `[t, t + length)`; some busiest
/// span starts at an admission, so a two-pointer sweep is exact.
fn busiest(sorted: &[u64], length: u64) -> usize {
    let mut lo = 0;
    let mut best = 0;
    for (hi, &t) in sorted.iter().enumerate() {
        while t - sorted[lo] >= length {
            lo += 1;
        }
        best = best.max(hi + 1 - lo);
    }
    best
}

/// The true sliding window: at most 100 admissions in any (t − 60 s, t], kept
/// as a log of admission times. The yardstick for the scenarios.
fn exact_log() -> impl FnMut(u64) -> bool {
    let mut log = std::collections::VecDeque::new();
    move |t| {
        while log.front().is_some_and(|&a: &u64| a + MINUTE <= t) {
            log.pop_front();
        }
        let admit = log.len() < 100;
        if admit {
            log.push_back(t);
        }
        admit
    }
}

#[test]
fn article_scenarios_error() {
    type Make = fn(ManualClock) -> Box<dyn RateLimiter>;
    let limiters: [(&str, Make); 4] = [
        ("SlidingWindow S=6", |c| {
            Box::new(striped(100, Duration::from_secs(60), 6, 2, c))
        }),
        ("SlidingWindow S=10", |c| {
            Box::new(striped(100, Duration::from_secs(60), 10, 2, c))
        }),
        ("ApproxSlidingWindow", |c| {
            Box::new(ApproxSlidingWindow::with_clock(Rate::per_minute(100), c).unwrap())
        }),
        ("FixedWindow", |c| {
            Box::new(FixedWindow::with_clock(Rate::per_minute(100), c).unwrap())
        }),
    ];
    println!(
        "{:<16} {:<20} {:>8} {:>8} {:>11} {:>9} {:>9}",
        "scenario", "limiter", "requests", "admitted", "max in 60s", "wrong +", "wrong −"
    );
    let row = |name: &str, label: &str, requests: usize, e: &Error| {
        println!(
            "{name:<16} {label:<20} {requests:>8} {:>8} {:>11} {:>8.2}% {:>8.2}%",
            e.admitted,
            e.busiest,
            100.0 * e.wrongly_allowed as f64 / requests as f64,
            100.0 * e.wrongly_denied as f64 / requests as f64,
        );
    };
    for (name, arrivals) in scenarios() {
        let log = replay(&arrivals, exact_log());
        row(name, "exact log", arrivals.len(), &log);
        assert_eq!((log.wrongly_allowed, log.wrongly_denied), (0, 0));
        assert!(log.busiest <= 100);
        for (label, make) in limiters {
            let clock = ManualClock::new();
            let limiter = make(clock.clone());
            let e = replay(&arrivals, |t| {
                clock.set(t);
                limiter.try_acquire().is_ok()
            });
            row(name, label, arrivals.len(), &e);
            if let Some(subs) = label.strip_prefix("SlidingWindow S=") {
                // Exact per sub-window: at most N in any span of (S − 1)
                // sub-windows, at most 2N in any span of T.
                let subs: u64 = subs.parse().unwrap();
                assert!(busiest(&e.times, (subs - 1) * MINUTE / subs) <= 100);
                assert!(e.busiest <= 200);
            }
        }
    }
}
