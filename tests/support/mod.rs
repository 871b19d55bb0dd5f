//! Shared by the integration tests: sequential reference models written
//! independently of the limiters, invariant checkers over recorded admissions,
//! and a lock-step harness that hammers one limiter from several threads.

#![allow(dead_code)] // each test binary uses a different part

use std::collections::HashMap;
use std::sync::{Arc, Barrier, Mutex, mpsc};
use std::time::Duration;

use proptest::prelude::*;
use tollgate::{ConfigError, Denied, LogConfig, ManualClock, Rate, RateLimiter, Snapshot};

/// Polls a future once, as an executor would on its first turn, with a waker
/// that does nothing.
pub fn poll_once<F: std::future::Future>(
    future: std::pin::Pin<&mut F>,
) -> std::task::Poll<F::Output> {
    future.poll(&mut std::task::Context::from_waker(std::task::Waker::noop()))
}

/// One admission: the decision time (ns since the limiter was built) and permits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admission {
    pub at: u64,
    pub n: u32,
}

/// Checks the token bucket's promise on admissions recorded in any order: for
/// every interval `[a, b]`, permits admitted in it `<= capacity + permits·(b − a)/period`,
/// with the configured (not the rounded) rate, in exact integer arithmetic.
///
/// Rewritten as `P_j·period − permits·t_j <= P_{i−1}·period − permits·t_i +
/// capacity·period` for sorted admissions `i <= j` (`P` = prefix sums), which a
/// suffix maximum checks in O(k log k).
pub fn check_token_bucket(admissions: &[Admission], capacity: u32, permits: u32, period_ns: u64) {
    let mut sorted = admissions.to_vec();
    sorted.sort_by_key(|a| a.at);
    let (permits, period, capacity) = (
        i128::from(permits),
        i128::from(period_ns),
        i128::from(capacity),
    );
    let mut prefix = Vec::with_capacity(sorted.len() + 1);
    prefix.push(0i128);
    for a in &sorted {
        prefix.push(prefix.last().unwrap() + i128::from(a.n));
    }
    // right[j] = P_j·period − permits·t_j, for the interval's end.
    let right: Vec<i128> = sorted
        .iter()
        .enumerate()
        .map(|(j, a)| prefix[j + 1] * period - permits * i128::from(a.at))
        .collect();
    let mut best_end = i128::MIN;
    let mut best_index = 0;
    for i in (0..sorted.len()).rev() {
        if right[i] > best_end {
            best_end = right[i];
            best_index = i;
        }
        let start = prefix[i] * period - permits * i128::from(sorted[i].at) + capacity * period;
        assert!(
            best_end <= start,
            "token bucket over-admitted: {} permits in [{}, {}] ns, bound is {} + {}·{}/{}",
            prefix[best_index + 1] - prefix[i],
            sorted[i].at,
            sorted[best_index].at,
            capacity,
            permits,
            sorted[best_index].at - sorted[i].at,
            period,
        );
    }
}

/// Checks the fixed window's promise: permits per aligned window `<= limit`.
pub fn check_fixed_window(admissions: &[Admission], limit: u32, window_ns: u64) {
    let mut per_window: HashMap<u64, u64> = HashMap::new();
    for a in admissions {
        *per_window.entry(a.at / window_ns).or_default() += u64::from(a.n);
    }
    for (window, count) in per_window {
        assert!(
            count <= u64::from(limit),
            "fixed window over-admitted: {count} permits in window {window}, limit {limit}"
        );
    }
}

/// The checks every limiter makes before looking at its state.
fn check_request(n: u32, capacity: u32) -> Result<(), Denied> {
    match n {
        0 => Err(Denied::ZeroPermits),
        n if n > capacity => Err(Denied::ExceedsCapacity {
            requested: n,
            capacity,
        }),
        _ => Ok(()),
    }
}

/// A classic token bucket — a token count and a last-refill time, refilled on
/// each request — not GCRA: an independent formulation to check GCRA against.
/// Tokens are counted in nanoseconds of refill time so that the arithmetic is
/// exact; the interval is the rate's period divided by its permits, rounded up,
/// as documented.
#[derive(Debug, Clone)]
pub struct ReferenceTokenBucket {
    capacity: u32,
    interval: u64,
    /// Refill time banked, in `[0, capacity·interval]`.
    level: u64,
    last: u64,
}

impl ReferenceTokenBucket {
    pub fn new(capacity: u32, permits: u32, period_ns: u64) -> Self {
        let interval = period_ns.div_ceil(u64::from(permits));
        ReferenceTokenBucket {
            capacity,
            interval,
            level: u64::from(capacity) * interval,
            last: 0,
        }
    }

    fn refill(&mut self, now: u64) {
        if now > self.last {
            let full = u64::from(self.capacity) * self.interval;
            self.level = (self.level + (now - self.last)).min(full);
            self.last = now;
        }
    }

    pub fn try_acquire_n(&mut self, now: u64, n: u32) -> Result<(), Denied> {
        check_request(n, self.capacity)?;
        self.refill(now);
        let need = u64::from(n) * self.interval;
        if self.level >= need {
            self.level -= need;
            Ok(())
        } else {
            Err(Denied::RetryAfter(Duration::from_nanos(need - self.level)))
        }
    }

    /// `(available, until_full)` at `now`.
    pub fn snapshot(&mut self, now: u64) -> (u32, Duration) {
        self.refill(now);
        let full = u64::from(self.capacity) * self.interval;
        (
            (self.level / self.interval) as u32,
            Duration::from_nanos(full - self.level),
        )
    }
}

/// A fixed window as a map from window index to count.
#[derive(Debug, Clone)]
pub struct ReferenceFixedWindow {
    limit: u32,
    window: u64,
    counts: HashMap<u64, u32>,
}

impl ReferenceFixedWindow {
    pub fn new(limit: u32, window_ns: u64) -> Self {
        ReferenceFixedWindow {
            limit,
            window: window_ns,
            counts: HashMap::new(),
        }
    }

    pub fn try_acquire_n(&mut self, now: u64, n: u32) -> Result<(), Denied> {
        check_request(n, self.limit)?;
        let index = now / self.window;
        let count = self.counts.entry(index).or_default();
        if *count + n <= self.limit {
            *count += n;
            Ok(())
        } else {
            Err(Denied::RetryAfter(Duration::from_nanos(
                (index + 1) * self.window - now,
            )))
        }
    }

    pub fn snapshot(&self, now: u64) -> (u32, Duration) {
        let index = now / self.window;
        let count = self.counts.get(&index).copied().unwrap_or(0);
        let until_full = if count == 0 {
            Duration::ZERO
        } else {
            Duration::from_nanos((index + 1) * self.window - now)
        };
        (self.limit - count, until_full)
    }
}

/// What one lock-step stress run did.
#[derive(Debug, Default)]
pub struct StressRecord {
    pub admissions: Vec<Admission>,
    /// Permits admitted per round, in round order.
    pub per_round: Vec<u64>,
}

/// Hammers `limiter` from `threads` threads in lock-step rounds: before each
/// round the clock is set to `times[round]`; during the round it stands still
/// and every thread makes `attempts` requests of `sizes(thread, attempt)` permits.
/// Since time stands still within a round, each admission's decision time is
/// exactly the round's time, and is recorded with it.
pub fn stress<L>(
    limiter: Arc<L>,
    clock: &ManualClock,
    threads: usize,
    times: &[u64],
    attempts: usize,
    sizes: fn(usize, usize) -> u32,
) -> StressRecord
where
    L: RateLimiter + Send + Sync + 'static,
{
    let start = Arc::new(Barrier::new(threads + 1));
    let end = Arc::new(Barrier::new(threads + 1));
    let rounds = times.len();
    let admitted: Arc<Mutex<Vec<Vec<u32>>>> = Arc::new(Mutex::new(vec![Vec::new(); rounds]));
    let workers: Vec<_> = (0..threads)
        .map(|thread| {
            let (limiter, start, end, admitted) = (
                limiter.clone(),
                start.clone(),
                end.clone(),
                admitted.clone(),
            );
            std::thread::spawn(move || {
                for round in 0..rounds {
                    start.wait();
                    let mut mine = Vec::new();
                    for attempt in 0..attempts {
                        let n = sizes(thread, attempt + round * attempts);
                        match limiter.try_acquire_n(n) {
                            Ok(()) => mine.push(n),
                            Err(Denied::RetryAfter(wait)) => assert!(!wait.is_zero()),
                            Err(other) => panic!("unexpected denial {other:?} for n = {n}"),
                        }
                    }
                    admitted.lock().unwrap()[round].extend(mine);
                    end.wait();
                }
            })
        })
        .collect();
    for &time in times {
        clock.set(time);
        start.wait();
        end.wait();
    }
    for worker in workers {
        worker.join().unwrap();
    }
    let admitted = Arc::try_unwrap(admitted).unwrap().into_inner().unwrap();
    let mut record = StressRecord::default();
    for (round, ns) in admitted.into_iter().enumerate() {
        record
            .per_round
            .push(ns.iter().map(|&n| u64::from(n)).sum());
        record.admissions.extend(ns.into_iter().map(|n| Admission {
            at: times[round],
            n,
        }));
    }
    record
}

/// Lock-step [`stress`] with single permits on the limiter `make` builds, 4
/// threads asking 64 times a round at each of `times`: demand outstrips
/// supply every round, so a tight limiter admits exactly what the sequential
/// `reference` admits, round by round. Returns the admissions, for the
/// limiter's own promise.
pub fn exact_under_contention<L: RateLimiter + Send + Sync + 'static>(
    make: impl FnOnce(ManualClock) -> L,
    times: &[u64],
    reference: &mut dyn Reference,
) -> Vec<Admission> {
    let clock = ManualClock::new();
    let limiter = Arc::new(make(clock.clone()));
    let record = stress(limiter, &clock, STRESS_THREADS, times, STRESS_ATTEMPTS, one);
    let expected = expected_per_round(reference, times, STRESS_THREADS * STRESS_ATTEMPTS);
    assert_eq!(record.per_round, expected);
    record.admissions
}

/// The bucket [`exact_bucket_rounds`] races: capacity 40, 100 permits a
/// millisecond, as `(capacity, permits, period_ns)`.
pub const EXACT_BUCKET: (u32, u32, u64) = (40, 100, 1_000_000);

/// [`exact_under_contention`] over [`STRESS_ROUNDS`] rounds 25 intervals
/// apart, on a bucket of [`EXACT_BUCKET`] that `with_clock` builds, against
/// the sequential `reference` built for the same numbers.
pub fn exact_bucket_rounds<L: RateLimiter + Send + Sync + 'static, R: Reference>(
    with_clock: fn(u32, Rate, ManualClock) -> Result<L, ConfigError>,
    reference: fn(u32, u32, u64) -> R,
) -> Vec<Admission> {
    let (capacity, permits, period) = EXACT_BUCKET;
    let rate = Rate::new(permits, Duration::from_nanos(period));
    let make = |clock| with_clock(capacity, rate, clock).unwrap();
    let times = round_times(STRESS_ROUNDS as u64, period / u64::from(permits) * 25);
    exact_under_contention(make, &times, &mut reference(capacity, permits, period))
}

/// A sequential reference model, decision for decision.
pub trait Reference {
    fn try_acquire_n(&mut self, now: u64, n: u32) -> Result<(), Denied>;
    /// `(available, until_full)` at `now`.
    fn snapshot(&mut self, now: u64) -> (u32, Duration);
}

impl Reference for ReferenceTokenBucket {
    fn try_acquire_n(&mut self, now: u64, n: u32) -> Result<(), Denied> {
        ReferenceTokenBucket::try_acquire_n(self, now, n)
    }
    fn snapshot(&mut self, now: u64) -> (u32, Duration) {
        ReferenceTokenBucket::snapshot(self, now)
    }
}

impl Reference for ReferenceFixedWindow {
    fn try_acquire_n(&mut self, now: u64, n: u32) -> Result<(), Denied> {
        ReferenceFixedWindow::try_acquire_n(self, now, n)
    }
    fn snapshot(&mut self, now: u64) -> (u32, Duration) {
        ReferenceFixedWindow::snapshot(self, now)
    }
}

/// One step of a replayed sequence: ask for permits, or move the clock to an
/// absolute time (never backwards in these replays).
#[derive(Debug, Clone, Copy)]
pub enum Step {
    Acquire(u32),
    SetTime(u64),
}

/// Replays `steps` through every limiter in `limiters` (all reading `clock`) and
/// through `reference`, asserting after each step that all of them made the same
/// decision and report the same snapshot. Returns the admissions, for the
/// invariant checker.
pub fn assert_agree(
    steps: &[Step],
    clock: &ManualClock,
    limiters: &[&dyn RateLimiter],
    reference: &mut dyn Reference,
) -> Vec<Admission> {
    let mut now = 0;
    let mut admissions = Vec::new();
    for &step in steps {
        match step {
            Step::Acquire(n) => {
                let expected = reference.try_acquire_n(now, n);
                for (i, limiter) in limiters.iter().enumerate() {
                    assert_eq!(
                        limiter.try_acquire_n(n),
                        expected,
                        "limiter #{i}, n = {n} at {now} ns"
                    );
                }
                if expected.is_ok() {
                    admissions.push(Admission { at: now, n });
                }
            }
            Step::SetTime(time) => {
                now = time;
                clock.set(now);
            }
        }
        let (available, until_full) = reference.snapshot(now);
        for (i, limiter) in limiters.iter().enumerate() {
            let snap = limiter.snapshot();
            assert_eq!(
                (snap.available, snap.until_full),
                (available, until_full),
                "snapshot of limiter #{i} at {now} ns"
            );
        }
    }
    admissions
}

/// Permits a sequential `reference` admits per round when `demand` single-permit
/// requests arrive at each of `times`: what a tight concurrent limiter must
/// admit in the lock-step stress harness.
pub fn expected_per_round(reference: &mut dyn Reference, times: &[u64], demand: usize) -> Vec<u64> {
    times
        .iter()
        .map(|&now| {
            let mut admitted = 0;
            while admitted < demand && reference.try_acquire_n(now, 1).is_ok() {
                admitted += 1;
            }
            admitted as u64
        })
        .collect()
}

// ---- leaky bucket, shaper and reservations (added for tests/integration/leaky_bucket.rs,
// tests/integration/waiting.rs, tests/integration/warm_up.rs) ----

/// The `LeakyBucketThrottler` of Jianfeng Fu's "Throttling Solutions in
/// Standalone and Distributed Scenarios" (§3.3; docs/references.md) — a water
/// level and the time of the last injection, drained on each request — in exact integer arithmetic: the level is
/// kept in nanoseconds of drain time, `interval` per permit (the rate's period
/// divided by its permits, rounded up, as documented).
#[derive(Debug, Clone)]
pub struct ReferenceLeakyBucket {
    capacity: u32,
    interval: u64,
    level: u64,
    last: u64,
}

impl ReferenceLeakyBucket {
    pub fn new(capacity: u32, permits: u32, period_ns: u64) -> Self {
        ReferenceLeakyBucket {
            capacity,
            interval: period_ns.div_ceil(u64::from(permits)),
            level: 0,
            last: 0,
        }
    }

    fn drain(&mut self, now: u64) {
        if now > self.last {
            self.level = self.level.saturating_sub(now - self.last);
            self.last = now;
        }
    }
}

impl Reference for ReferenceLeakyBucket {
    fn try_acquire_n(&mut self, now: u64, n: u32) -> Result<(), Denied> {
        check_request(n, self.capacity)?;
        self.drain(now);
        let poured = self.level + u64::from(n) * self.interval;
        let depth = u64::from(self.capacity) * self.interval;
        if poured <= depth {
            self.level = poured;
            Ok(())
        } else {
            Err(Denied::RetryAfter(Duration::from_nanos(poured - depth)))
        }
    }

    fn snapshot(&mut self, now: u64) -> (u32, Duration) {
        self.drain(now);
        let depth = u64::from(self.capacity) * self.interval;
        (
            ((depth - self.level) / self.interval) as u32,
            Duration::from_nanos(self.level),
        )
    }
}

/// Checks the leaky bucket meter's promise by replaying the admissions in time
/// order through a bucket that drains one nanosecond of level per nanosecond:
/// the level never exceeds `capacity · interval`.
pub fn check_leaky_bucket(admissions: &[Admission], capacity: u32, interval: u64) {
    let mut sorted = admissions.to_vec();
    sorted.sort_by_key(|a| a.at);
    let depth = u64::from(capacity) * interval;
    let (mut level, mut last) = (0u64, 0u64);
    for a in &sorted {
        level = level.saturating_sub(a.at - last);
        last = a.at;
        level += u64::from(a.n) * interval;
        assert!(
            level <= depth,
            "leaky bucket overflowed: level {level} ns > {depth} ns after {} permits at {} ns",
            a.n,
            a.at
        );
    }
}

/// One granted start: when the request was decided, when it may start, how many
/// permits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Start {
    pub decided: u64,
    pub start: u64,
    pub n: u32,
}

impl Start {
    /// An admission that starts when it is decided: a shaper's `try_acquire_n`.
    pub fn at_once(admission: &Admission) -> Start {
        Start {
            decided: admission.at,
            start: admission.at,
            n: admission.n,
        }
    }
}

/// Checks the shaper's promise: sorted by start, the permits of the requests
/// from `i` up to (not including) `j` are at most `burst + (start_j − start_i) /
/// interval`; and every start is within `[decided, decided + max_wait]`.
/// `starts` must be in booking order: requests with equal starts are taken in
/// that order (a booking made at a stale reading may share the start of one
/// booked before it, and comes after it).
pub fn check_shaper(starts: &[Start], interval: u64, burst: u32, max_wait: u64) {
    let mut sorted = starts.to_vec();
    // Stable: equal starts stay in booking order.
    sorted.sort_by_key(|s| s.start);
    for s in &sorted {
        assert!(
            s.decided <= s.start && s.start - s.decided <= max_wait,
            "start {s:?} is outside [decided, decided + {max_wait}]"
        );
    }
    // Σ_{i..j} n·interval − start_j + start_i <= burst·interval, for all i < j:
    // with prefix sums P, (P_j − start_j) − (P_i − start_i) <= burst·interval, so a
    // running minimum of P_i − start_i checks every pair in one pass.
    let slack = i128::from(burst) * i128::from(interval);
    let mut prefix = 0i128;
    // The lowest `P_i − start_i` so far, with its `P_i` and `start_i`.
    let mut lowest: Option<(i128, i128, u64)> = None;
    for s in &sorted {
        let here = prefix - i128::from(s.start);
        if let Some((low, prefix_i, start_i)) = lowest {
            assert!(
                here - low <= slack,
                "shaper started too much too soon: {} ns of permits started in [{start_i}, {}] ns \
                 (interval {interval}, burst {burst})",
                prefix - prefix_i,
                s.start
            );
        }
        if lowest.is_none_or(|(low, _, _)| here < low) {
            lowest = Some((here, prefix, s.start));
        }
        prefix += i128::from(s.n) * i128::from(interval);
    }
}

/// [`check_shaper`] for starts granted to racing threads, whose booking order
/// among equal starts nobody recorded: equal starts are taken smallest request
/// first. Sound: if the booking order keeps the promise, so does this one. A
/// pair of starts in different groups counts a whole group whatever its order
/// (the earlier group from its first start on, every permit of it), and within
/// a group the most a start can have before it is the group's permits but the
/// last one's, least when the last is the largest; the booking order's last
/// start already passed with at least that much before it.
pub fn check_shaper_any_order(starts: &[Start], interval: u64, burst: u32, max_wait: u64) {
    let mut sorted = starts.to_vec();
    sorted.sort_by_key(|s| (s.start, s.n));
    check_shaper(&sorted, interval, burst, max_wait);
}

/// The shaper in nginx's terms: an "excess" of queued work (ns) that drains one
/// nanosecond per nanosecond. A request waits for the excess beyond `burst`
/// intervals, is rejected if that wait exceeds `max_wait`, and otherwise adds
/// its own `n · interval` to the excess.
#[derive(Debug, Clone)]
pub struct ReferenceShaper {
    interval: u64,
    burst: u64,
    max_wait: u64,
    capacity: u32,
    excess: u64,
    last: u64,
}

impl ReferenceShaper {
    pub fn new(permits: u32, period_ns: u64, burst: u32, max_wait: u64) -> Self {
        let interval = period_ns.div_ceil(u64::from(permits));
        let capacity = u32::try_from(u64::from(burst) + 1 + max_wait / interval).unwrap();
        ReferenceShaper {
            interval,
            burst: u64::from(burst),
            max_wait,
            capacity,
            excess: 0,
            last: 0,
        }
    }

    /// The start granted to `n` permits at `now`, waiting at most `max_wait`
    /// (and the queue's own bound), or the denial.
    pub fn reserve(&mut self, now: u64, n: u32, max_wait: u64) -> Result<u64, Denied> {
        check_request(n, self.capacity)?;
        if now > self.last {
            self.excess = self.excess.saturating_sub(now - self.last);
            self.last = now;
        }
        let ahead = self.excess + self.last - now;
        let wait = ahead.saturating_sub(self.burst * self.interval);
        let bound = max_wait.min(self.max_wait);
        if wait > bound {
            return Err(Denied::RetryAfter(Duration::from_nanos(wait - bound)));
        }
        self.excess += u64::from(n) * self.interval;
        Ok(now + wait)
    }
}

impl Reference for ReferenceShaper {
    fn try_acquire_n(&mut self, now: u64, n: u32) -> Result<(), Denied> {
        self.reserve(now, n, 0).map(|_| ())
    }

    fn snapshot(&mut self, now: u64) -> (u32, Duration) {
        if now > self.last {
            self.excess = self.excess.saturating_sub(now - self.last);
            self.last = now;
        }
        let ahead = self.excess + self.last - now;
        let wait = ahead.saturating_sub(self.burst * self.interval);
        let available = if wait == 0 { self.capacity } else { 0 };
        (available, Duration::from_nanos(wait))
    }
}

/// Runs `work(thread, round)` on `threads` threads in lock-step rounds: before
/// each round the clock is set to `times[round]` and stands still during it.
/// Returns what each round produced, all threads' results concatenated.
pub fn lockstep<T, F>(clock: &ManualClock, threads: usize, times: &[u64], work: F) -> Vec<Vec<T>>
where
    T: Send + 'static,
    F: Fn(usize, usize) -> Vec<T> + Send + Sync + 'static,
{
    lockstep_between(clock, threads, times, |_| {}, work)
}

/// [`lockstep`], calling `between(round)` on the calling thread before each
/// round starts, while no worker runs (a reconfiguration between rounds).
pub fn lockstep_between<T, F>(
    clock: &ManualClock,
    threads: usize,
    times: &[u64],
    mut between: impl FnMut(usize),
    work: F,
) -> Vec<Vec<T>>
where
    T: Send + 'static,
    F: Fn(usize, usize) -> Vec<T> + Send + Sync + 'static,
{
    let start = Arc::new(Barrier::new(threads + 1));
    let end = Arc::new(Barrier::new(threads + 1));
    let rounds = times.len();
    let produced: Arc<Mutex<Vec<Vec<T>>>> =
        Arc::new(Mutex::new((0..rounds).map(|_| Vec::new()).collect()));
    let work = Arc::new(work);
    let workers: Vec<_> = (0..threads)
        .map(|thread| {
            let (start, end, produced, work) =
                (start.clone(), end.clone(), produced.clone(), work.clone());
            std::thread::spawn(move || {
                for round in 0..rounds {
                    start.wait();
                    let mine = work(thread, round);
                    produced.lock().unwrap()[round].extend(mine);
                    end.wait();
                }
            })
        })
        .collect();
    for (round, &time) in times.iter().enumerate() {
        between(round);
        clock.set(time);
        start.wait();
        end.wait();
    }
    for worker in workers {
        worker.join().unwrap();
    }
    Arc::try_unwrap(produced)
        .unwrap_or_else(|_| panic!("workers still hold the results"))
        .into_inner()
        .unwrap()
}

// ---- sliding window (added for tests/integration/sliding_window.rs) ----

/// Checks the sliding window's promise: the permits admitted in any `subs`
/// consecutive aligned sub-windows of `sub_ns` (sub-window `i` is
/// `[i·sub_ns, (i+1)·sub_ns)`) are at most `limit`. Every such window ending
/// with an empty sub-window holds no more than the one ending with the last
/// non-empty sub-window before it, so only windows ending with a non-empty
/// sub-window are checked, with a two-pointer sweep.
pub fn check_sliding_window(admissions: &[Admission], limit: u32, sub_ns: u64, subs: u32) {
    let mut per_sub = std::collections::BTreeMap::<u64, u64>::new();
    for a in admissions {
        *per_sub.entry(a.at / sub_ns).or_default() += u64::from(a.n);
    }
    let subs_list: Vec<(u64, u64)> = per_sub.into_iter().collect();
    let (mut first, mut sum) = (0, 0u64);
    for (last, &(q, count)) in subs_list.iter().enumerate() {
        sum += count;
        while subs_list[first].0 + u64::from(subs) <= q {
            sum -= subs_list[first].1;
            first += 1;
        }
        assert!(
            sum <= u64::from(limit),
            "sliding window over-admitted: {sum} permits in sub-windows {}..={q} \
             ({} sub-windows of {sub_ns} ns, limit {limit}; {} non-empty)",
            q.saturating_sub(u64::from(subs) - 1),
            subs,
            last + 1 - first,
        );
    }
}

/// Lock-step round times with irregular steps: some rounds add nothing, some
/// cross several intervals or windows.
pub fn round_times(rounds: u64, step: u64) -> Vec<u64> {
    let mut now = 0;
    (0..rounds)
        .map(|round| {
            now += (round * 7919 % 5) * step / 2 + round % 3;
            now
        })
        .collect()
}

/// Request sizes for [`stress`]: one permit per attempt.
pub fn one(_: usize, _: usize) -> u32 {
    1
}

/// Request sizes for [`stress`]: 1 to `MAX` permits, varying with the thread
/// and the attempt.
pub fn mixed<const MAX: usize>(thread: usize, attempt: usize) -> u32 {
    1 + ((thread * 31 + attempt * 17) % MAX) as u32
}

/// Worker threads that run requests on a limiter one at a time, in the order
/// the test sends them: a deterministic interleaving of several threads, so
/// of several stripes.
pub struct Workers {
    senders: Vec<mpsc::Sender<u32>>,
    replies: mpsc::Receiver<Result<(), Denied>>,
    handles: Vec<std::thread::JoinHandle<()>>,
}

impl Workers {
    pub fn new<L: RateLimiter + Send + Sync + 'static>(limiter: Arc<L>, threads: usize) -> Self {
        let (reply, replies) = mpsc::channel();
        let mut senders = Vec::new();
        let mut handles = Vec::new();
        for _ in 0..threads {
            let (send, receive) = mpsc::channel::<u32>();
            let (limiter, reply) = (limiter.clone(), reply.clone());
            handles.push(std::thread::spawn(move || {
                for n in receive {
                    reply.send(limiter.try_acquire_n(n)).unwrap();
                }
            }));
            senders.push(send);
        }
        Workers {
            senders,
            replies,
            handles,
        }
    }

    pub fn acquire(&self, thread: usize, n: u32) -> Result<(), Denied> {
        self.senders[thread].send(n).unwrap();
        self.replies.recv().unwrap()
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        self.senders.clear();
        for handle in self.handles.drain(..) {
            let _ = handle.join();
        }
    }
}

/// Rules of a sliding log: `(count, window in ns)`.
pub type Rules = Vec<(u32, u64)>;

/// The log configuration of `rules`.
pub fn log_config(rules: &[(u32, u64)]) -> LogConfig {
    let rate = |&(n, w): &(u32, u64)| Rate::new(n, Duration::from_nanos(w));
    let mut config = LogConfig::new(rate(&rules[0])).unwrap();
    for rule in &rules[1..] {
        config = config.with_rule(rate(rule)).unwrap();
    }
    config
}

/// The reference: every admitted permit's decision time, per key, oldest
/// first, and the rules in force.
pub struct RulesModel {
    pub rules: Rules,
    pub logs: HashMap<u32, Vec<u64>>,
}

impl RulesModel {
    pub fn new(rules: Rules) -> Self {
        RulesModel {
            rules,
            logs: HashMap::new(),
        }
    }

    pub fn capacity(&self) -> u32 {
        self.rules.iter().map(|r| r.0).min().unwrap()
    }

    /// Admits `n` at `t` iff every rule still has room for them in
    /// `(t − T_i, t]`; otherwise the longest wait until each rule has.
    pub fn acquire(&mut self, key: u32, n: u32, t: u64) -> Result<(), Denied> {
        let capacity = self.capacity();
        if n > capacity {
            return Err(Denied::ExceedsCapacity {
                requested: n,
                capacity,
            });
        }
        let log = self.logs.entry(key).or_default();
        let mut until = 0;
        for &(limit, window) in &self.rules {
            let busy = log.iter().filter(|&&s| s + window > t).count();
            if busy + n as usize > limit as usize {
                // Room for `n` once this entry, `limit − n + 1` back, leaves.
                let pivot = log[log.len() + n as usize - 1 - limit as usize];
                until = until.max(pivot + window);
            }
        }
        if until > 0 {
            return Err(Denied::RetryAfter(Duration::from_nanos(until - t)));
        }
        log.extend(std::iter::repeat_n(t, n as usize));
        Ok(())
    }

    /// The binding rule's figures: fewest available, on a tie the longer
    /// time until full.
    pub fn snapshot(&self, key: u32, t: u64) -> Snapshot {
        let empty = Vec::new();
        let log = self.logs.get(&key).unwrap_or(&empty);
        let mut best: Option<(u32, u32, u64)> = None;
        for &(limit, window) in &self.rules {
            let busy = log.iter().filter(|&&s| s + window > t).count() as u32;
            let available = limit.saturating_sub(busy);
            let until = log.last().map_or(0, |&s| (s + window).saturating_sub(t));
            if best.is_none_or(|(a, _, u)| available < a || (available == a && until > u)) {
                best = Some((available, limit, until));
            }
        }
        let (available, limit, until) = best.unwrap();
        Snapshot::new(available, limit, Duration::from_nanos(until))
    }
}

/// A phase of a threaded run of a log with rules: from round `from`, these rules.
pub struct Phase {
    pub from: u32,
    pub rules: Rules,
}

impl Phase {
    /// Which of `phases` is in force in each of `rounds` rounds.
    pub fn by_round(phases: &[Phase], rounds: u32) -> Vec<usize> {
        (0..rounds)
            .map(|round| phases.iter().rposition(|p| p.from <= round).unwrap())
            .collect()
    }

    /// The phase that starts at `round`, if one does after the first.
    pub fn starting(phases: &[Phase], round: usize) -> Option<&Phase> {
        phases
            .iter()
            .find(|p| p.from as usize == round && round > 0)
    }
}

/// The sets of rules both rule tests reconfigure between, each a valid
/// `LogConfig`: windows up to 2 s, where with 1 ns stamps every decision is
/// the model's.
pub fn rule_sets() -> Vec<Rules> {
    const MS: u64 = 1_000_000;
    const S: u64 = 1_000 * MS;
    vec![
        vec![(3, 10 * MS), (8, 100 * MS), (20, S)],
        // The 1 s rule removed.
        vec![(3, 10 * MS), (8, 100 * MS)],
        // The 10 ms rule changed.
        vec![(5, 10 * MS), (8, 100 * MS), (20, S)],
        vec![(20, S), (30, 2 * S)],
        // One rule: a direct log's striped log.
        vec![(6, 100 * MS)],
        vec![(2, MS), (4, 50 * MS), (12, 1_500 * MS)],
        // A longer window with a smaller count: the short rule never binds.
        vec![(10, 10 * MS), (4, S)],
    ]
}

/// The rule changes both rule tests run through: the longest window stays a
/// minute in every phase, so the history each rule reads is all kept across
/// the changes; from round 720 (180 s in rounds of 250 ms) the 10 s rule is
/// removed and the minute's rule allows `last_minute`.
pub fn rule_phases(last_minute: u32) -> Vec<Phase> {
    const S: u64 = 1_000_000_000;
    vec![
        Phase {
            from: 0,
            rules: vec![(3, S), (10, 10 * S), (25, 60 * S)],
        },
        // At 90 s: the second's rule raised, the minute's lowered.
        Phase {
            from: 360,
            rules: vec![(4, S), (10, 10 * S), (20, 60 * S)],
        },
        Phase {
            from: 720,
            rules: vec![(4, S), (last_minute, 60 * S)],
        },
    ]
}

/// `(key, decision time, permits, phase)` of every admission of [`phased_rounds`].
pub type PhasedAdmission = (u32, u64, u32, usize);

/// Four threads in 960 lock-step rounds of 250 ms (the clock stands still in
/// a round, so a round's admissions share its decision time), the rules
/// changing between rounds as `phases` say: `reconfigure(rules)` before the
/// round a phase starts. `work(thread, round)` makes one thread's requests of
/// a round and returns the admitted ones as `(key, permits)`.
pub fn phased_rounds<F>(
    clock: &ManualClock,
    phases: &[Phase],
    mut reconfigure: impl FnMut(&Rules),
    work: F,
) -> Vec<PhasedAdmission>
where
    F: Fn(usize, usize) -> Vec<(u32, u32)> + Send + Sync + 'static,
{
    const ROUNDS: u32 = 960;
    const ROUND: u64 = 250_000_000;
    let times: Vec<u64> = (0..u64::from(ROUNDS)).map(|round| round * ROUND).collect();
    let phase_by_round = Phase::by_round(phases, ROUNDS);
    let at = times.clone();
    let rounds = lockstep_between(
        clock,
        4,
        &times,
        |round| {
            if let Some(phase) = Phase::starting(phases, round) {
                reconfigure(&phase.rules);
            }
        },
        move |thread, round| {
            work(thread, round)
                .into_iter()
                .map(|(key, n)| (key, at[round], n, phase_by_round[round]))
                .collect()
        },
    );
    rounds.into_iter().flatten().collect()
}

/// Every admission against every rule in force when it was decided: the
/// permits of its key decided in `(t − T_i, t]`, earlier phases included
/// (the log keeps its history), are at most `N_i`. At `t` itself only those
/// of its phase or before count: phases only move forward, so one of a later
/// phase at the same instant was decided after it (and is checked against
/// its own rules).
pub fn rule_violations(phases: &[Phase], admitted: &[(u32, u64, u32, usize)]) -> Vec<String> {
    let mut violations = Vec::new();
    for &(key, t, _, phase) in admitted {
        for &(limit, window) in &phases[phase].rules {
            let in_window: u32 = admitted
                .iter()
                .filter(|a| a.0 == key && (a.1 < t || a.1 == t && a.3 <= phase))
                .filter(|a| a.1 + window > t)
                .map(|a| a.2)
                .sum();
            if in_window > limit {
                violations.push(format!(
                    "key {key} at {t} ns: {in_window} in a window of {window} ns, rule {limit}"
                ));
            }
        }
    }
    violations
}

/// A threaded run of a log with rules over the phases it is given, each
/// phase's configuration built by the function it is given: its admissions.
pub type PhasedRun = fn(&[Phase], &dyn Fn(&Rules) -> LogConfig) -> Vec<PhasedAdmission>;

/// The phases of [`rule_phases`]`(last_minute)` and the admissions of `run`
/// over them, every rule configured; asserts that they keep every rule.
pub fn admitted_keeping_every_rule(
    last_minute: u32,
    run: PhasedRun,
) -> (Vec<Phase>, Vec<PhasedAdmission>) {
    let phases = rule_phases(last_minute);
    let admitted = run(&phases, &|rules: &Rules| log_config(rules));
    assert_eq!(rule_violations(&phases, &admitted), Vec::<String>::new());
    (phases, admitted)
}

/// The permits admitted on `key` in `phase`.
pub fn permits_in_phase(admitted: &[PhasedAdmission], key: u32, phase: usize) -> u32 {
    admitted
        .iter()
        .filter(|a| a.0 == key && a.3 == phase)
        .map(|a| a.2)
        .sum()
}

/// Known-bad: `run` over [`rule_phases`]`(last_minute)` with only each
/// phase's largest rule (by count) configured; the check of the 3-a-second
/// rule reports what it let through.
pub fn assert_the_largest_rule_alone_is_caught(last_minute: u32, run: PhasedRun) {
    let phases = &rule_phases(last_minute);
    let admitted = run(phases, &|rules: &Rules| {
        let &(n, w) = rules.iter().max_by_key(|r| r.0).unwrap();
        LogConfig::new(Rate::new(n, Duration::from_nanos(w))).unwrap()
    });
    let violations = rule_violations(phases, &admitted);
    assert!(
        violations.iter().any(|v| v.contains("rule 3")),
        "the largest rule alone broke no other rule: {violations:?}"
    );
}

/// A bucket's capacity and rate for the property tests, `(capacity, permits,
/// period in ns)`: periods of a few µs, where rounding bites, or about a
/// second (a prime just under it among them), never more than one permit a
/// nanosecond.
pub fn bucket_config() -> impl Strategy<Value = (u32, u32, u64)> {
    (
        1..=10u32,
        1..=50u32,
        prop_oneof![1_000..=10_000u64, 999_999_937..=1_000_000_000u64],
    )
        .prop_filter("at most one permit per ns", |&(_, permits, period)| {
            period >= u64::from(permits)
        })
}

/// The requests of one thread in one lock-step round of a leased limiter's
/// stress test, each `(permits, admitted)`: `attempts` requests, the next
/// size from `sizes(thread, attempt + round · attempts)`, and with
/// `stop_at_denial` none after the first denial. A denial must name a wait.
pub fn stress_round<L: RateLimiter + ?Sized>(
    limiter: &L,
    sizes: fn(usize, usize) -> u32,
    (thread, round): (usize, usize),
    attempts: usize,
    stop_at_denial: bool,
) -> Vec<(u32, bool)> {
    let mut mine = Vec::new();
    for attempt in 0..attempts {
        let n = sizes(thread, attempt + round * attempts);
        match limiter.try_acquire_n(n) {
            Ok(()) => mine.push((n, true)),
            Err(Denied::RetryAfter(wait)) => {
                assert!(!wait.is_zero());
                mine.push((n, false));
                if stop_at_denial {
                    break;
                }
            }
            Err(other) => panic!("unexpected {other:?} for n = {n}"),
        }
    }
    mine
}

/// The permits a round's requests asked for, and those admitted.
pub fn demanded_and_got(requests: &[(u32, bool)]) -> (u64, u64) {
    let demand = requests.iter().map(|r| u64::from(r.0)).sum();
    let got = requests
        .iter()
        .filter(|r| r.1)
        .map(|r| u64::from(r.0))
        .sum();
    (demand, got)
}

/// A round's admitted requests, at its decision time `at`.
pub fn admitted_at(at: u64, requests: &[(u32, bool)]) -> impl Iterator<Item = Admission> + '_ {
    requests
        .iter()
        .filter(|r| r.1)
        .map(move |&(n, _)| Admission { at, n })
}

/// How a stress test's threads ask, for its report.
pub fn stress_mode(stop_at_denial: bool) -> &'static str {
    if stop_at_denial {
        "stop at first denial"
    } else {
        "64 per round"
    }
}

/// One operation of a random sequence on one limiter: ask for permits, move
/// the clock on, or step it back (saturating at zero).
#[derive(Debug, Clone)]
pub enum Op {
    Acquire(u32),
    Advance(u64),
    Back(u64),
}

/// One operation that never steps the clock back: a request of 1 to `max`
/// permits or of an odd size (none, more than `max`), a clock step of up to
/// `long` or a small one of up to `short`, where rounding bites.
fn forward_op(max: u32, long: u64, short: u64) -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (1..=max).prop_map(Op::Acquire),
        1 => prop_oneof![Just(0u32), Just(u32::MAX), (max + 1)..=(max + 3)]
            .prop_map(Op::Acquire),
        3 => (0..=long).prop_map(Op::Advance),
        1 => (0..=short).prop_map(Op::Advance),
    ]
}

/// Up to 200 [`forward_op`]s.
pub fn forward_ops(max: u32, long: u64, short: u64) -> impl Strategy<Value = Vec<Op>> {
    proptest::collection::vec(forward_op(max, long, short), 1..200)
}

/// [`forward_ops`] with steps back of up to `back` too, one operation in 12
/// (as often as a small step).
pub fn ops_stepping_back(
    max: u32,
    long: u64,
    short: u64,
    back: u64,
) -> impl Strategy<Value = Vec<Op>> {
    let op = prop_oneof![
        11 => forward_op(max, long, short),
        1 => (0..=back).prop_map(Op::Back),
    ];
    proptest::collection::vec(op, 1..200)
}

/// `ops` with every step back made a step of nothing: the clock only moves on.
pub fn without_steps_back(ops: Vec<Op>) -> Vec<Op> {
    ops.into_iter()
        .map(|op| match op {
            Op::Back(_) => Op::Advance(0),
            op => op,
        })
        .collect()
}

/// The clock steps of the sequences are drawn for a 3 µs interval: a step
/// scaled to a bucket of `interval` ns.
pub fn scaled_to(interval: u64) -> impl Fn(u64) -> u64 {
    move |step| step * interval / 3_000 + step % 3
}

/// The absolute clock time after each operation of `ops` (`None` for a
/// request), a step of `s` moving the clock by `scale(s)`.
pub fn op_times(ops: &[Op], scale: impl Fn(u64) -> u64) -> Vec<Option<u64>> {
    let mut now = 0u64;
    ops.iter()
        .map(|op| match *op {
            Op::Acquire(_) => None,
            Op::Advance(step) => {
                now += scale(step);
                Some(now)
            }
            Op::Back(step) => {
                now = now.saturating_sub(scale(step));
                Some(now)
            }
        })
        .collect()
}

/// `ops` as steps for [`assert_agree`], clock steps scaled as in [`op_times`].
pub fn op_steps(ops: &[Op], scale: impl Fn(u64) -> u64) -> Vec<Step> {
    ops.iter()
        .zip(op_times(ops, scale))
        .map(|(op, time)| match (op, time) {
            (Op::Acquire(n), _) => Step::Acquire(*n),
            (_, Some(t)) => Step::SetTime(t),
            _ => unreachable!("a clock step has a time"),
        })
        .collect()
}

/// Replays `ops` (clock times `times`) on one thread through `limiter` and
/// its `twin`, which must make the same decision at every request (the full
/// report where `report(i)` says so for the operation at index `i`) and
/// report the same snapshot after every operation.
pub fn assert_twins_agree(
    limiter: &dyn RateLimiter,
    twin: &dyn RateLimiter,
    clock: &ManualClock,
    ops: &[Op],
    times: &[Option<u64>],
    report: impl Fn(usize) -> bool,
) -> Result<(), TestCaseError> {
    for (i, (op, time)) in ops.iter().zip(times).enumerate() {
        match (op, *time) {
            (Op::Acquire(n), _) if report(i) => {
                prop_assert_eq!(
                    limiter.try_acquire_n_with_snapshot(*n),
                    twin.try_acquire_n_with_snapshot(*n)
                );
            }
            (Op::Acquire(n), _) => {
                prop_assert_eq!(limiter.try_acquire_n(*n), twin.try_acquire_n(*n));
            }
            (_, Some(t)) => clock.set(t),
            _ => unreachable!("a clock step has a time"),
        }
        prop_assert_eq!(limiter.snapshot(), twin.snapshot());
    }
    Ok(())
}

/// Replays `ops` (clock times `times`) through `workers`, the operation at
/// index `i` on thread `who[i]`, checking every decision against a limiter
/// that never admits more than `bound` at once: a denial names its cause or a
/// wait. Returns the admissions and the latest clock time.
pub fn replay_on_workers(
    workers: &Workers,
    clock: &ManualClock,
    ops: &[Op],
    times: &[Option<u64>],
    who: &[usize],
    bound: u32,
) -> Result<(Vec<Admission>, u64), TestCaseError> {
    let (mut admissions, mut now, mut latest) = (Vec::new(), 0, 0);
    for ((op, time), &thread) in ops.iter().zip(times).zip(who) {
        match (op, *time) {
            (Op::Acquire(n), _) => match (workers.acquire(thread, *n), *n) {
                (Ok(()), n) => admissions.push(Admission { at: now, n }),
                (Err(Denied::ZeroPermits), 0) => {}
                (Err(Denied::ExceedsCapacity { .. }), n) => prop_assert!(n > bound),
                (Err(Denied::RetryAfter(wait)), n) => {
                    prop_assert!(n <= bound && !wait.is_zero());
                }
                (other, n) => prop_assert!(false, "{:?} for n = {}", other, n),
            },
            (_, Some(t)) => {
                now = t;
                latest = latest.max(t);
                clock.set(t);
            }
            _ => unreachable!("a clock step has a time"),
        }
    }
    Ok((admissions, latest))
}

/// Asserts the denials every limiter holding at most `capacity` gives odd
/// request sizes: none asked for, and more than it can ever hold.
pub fn assert_odd_sizes_denied(limiter: &dyn RateLimiter, capacity: u32) {
    assert_eq!(limiter.try_acquire_n(0), Err(Denied::ZeroPermits));
    if capacity < u32::MAX {
        assert_eq!(
            limiter.try_acquire_n(u32::MAX),
            Err(Denied::ExceedsCapacity {
                requested: u32::MAX,
                capacity
            })
        );
        assert!(matches!(
            limiter.try_acquire_n_with_snapshot(capacity + 1),
            Err(r) if matches!(r.denied, Denied::ExceedsCapacity { .. })
        ));
    }
}

/// Threads and requests a round of a lock-step stress test, and its rounds.
pub const STRESS_THREADS: usize = 4;
pub const STRESS_ATTEMPTS: usize = 64;
pub const STRESS_ROUNDS: usize = 300;

/// Lock-step rounds of [`stress_round`] on `limiter` at `times`,
/// [`STRESS_THREADS`] threads of [`STRESS_ATTEMPTS`] requests: every round's
/// requests, `(permits, admitted)`.
pub fn leased_stress_rounds<L: RateLimiter + Send + Sync + 'static>(
    limiter: Arc<L>,
    clock: &ManualClock,
    times: &[u64],
    sizes: fn(usize, usize) -> u32,
    stop_at_denial: bool,
) -> Vec<Vec<(u32, bool)>> {
    lockstep(clock, STRESS_THREADS, times, move |thread, round| {
        stress_round(
            &*limiter,
            sizes,
            (thread, round),
            STRESS_ATTEMPTS,
            stop_at_denial,
        )
    })
}

/// A leased limiter's stress test: `(stripes, bound, sizes, stop_at_denial)`.
pub type LeasedStress = fn(usize, u32, fn(usize, usize) -> u32, bool);

/// The single-permit stress runs every leased limiter passes: each stripe
/// count, asking on after a denial or not, at a `bound` of the test's and at
/// a larger one.
pub fn stress_single_permits(stress: LeasedStress, bound: u32) {
    for stripes in [1, 2, 4, 8] {
        stress(stripes, bound, one, false);
        stress(stripes, bound, one, true);
        stress(stripes, 1_000, one, true);
    }
}

/// The stress runs of mixed request sizes every leased limiter passes.
pub fn stress_mixed_sizes(stress: LeasedStress, bound: u32) {
    for stripes in [1, 4] {
        stress(stripes, bound, mixed::<7>, false);
    }
}
