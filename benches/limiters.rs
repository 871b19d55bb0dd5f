//! tollgate's lock-free limiters against their locking twins and against
//! governor's direct limiter, in one run, at 1, 2 and 4 threads.
//!
//! Two workloads:
//!
//! - **allow**: every check admits, so every check *writes* the limiter's word
//!   (a CAS, or a store under the mutex). The limiters are configured so fast
//!   that no run can reach a denial (one permit per nanosecond, a burst of
//!   `u32::MAX`), and the harness asserts that every check was admitted.
//! - **deny**: the limiter is exhausted before timing starts and refills once an
//!   hour, so every check reads the word and denies without writing; asserted too.
//! - **limit** (every limiter here): at the limit — one
//!   permit per `P` ns with 1 ms of burst, `P` set so the rate is half of what
//!   the plain token bucket checks allow-heavy at that thread count, measured
//!   in the same process first (`common::limit_period`): the offered load is
//!   about twice the rate, most checks admit while the bucket hovers at empty
//!   and the threads race for the last permits. The share admitted is printed.
//!
//! Groups are named `<limiter>/<workload>/<threads>t` (`token_bucket/allow/2t`),
//! functions after the implementation: `tollgate-atomic` (the lock-free limiter),
//! `tollgate-twin` (its locking twin), `governor` (its direct limiter, token
//! bucket only; `leased_token_bucket` has only `tollgate-atomic` rows, compared
//! with the token bucket's twin and governor, and `leased_fixed_window` likewise
//! with the fixed window's atomic and twin rows — governor has no fixed window),
//! each on its default clock, and the same with a `-cached` suffix
//! on the cached clocks. `scripts/bench-table` turns the results into the table
//! in `docs/benchmarks.md`. One criterion iteration is one check on each of the
//! `threads` threads, timed from the first thread's start to the last thread's
//! end, so criterion's time per iteration is wall time per round of checks and
//! its elements/s (`Throughput::Elements(threads)`) is total checks per second.
//!
//! The `clock/now` group times one reading of each clock, for reading the rest.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use governor::RateLimiter as Governor;
use governor::clock::{Clock as _, QuantaClock};
use tollgate::{
    CachedClock, Clock, FixedWindow, LeasedFixedWindow, LeasedTokenBucket, LockingFixedWindow,
    LockingTokenBucket, MonotonicClock, Rate, RateLimiter, TokenBucket,
};

mod common;
use common::{
    Check, Parallelism, THREADS, Workload, allow_quota, deny_quota, governor_limiter,
    governor_upkeep_clock, limit_quota, limit_rate, tollgate_cached_clock, tollgate_limiter,
};

/// One criterion group: a limiter, a workload, a thread count.
struct Case {
    limiter: &'static str,
    workload: Workload,
    threads: usize,
}

impl Case {
    /// Benchmarks one implementation: `make` builds a fresh limiter per sample, in
    /// the state the workload needs (exhausted for deny), outside the timed region.
    /// Asserts that every check was admitted (allow) or denied (deny), and prints
    /// how parallel the threads ran.
    fn bench<L: Check>(&self, c: &mut Criterion, function: &str, make: impl Fn() -> L) {
        let (workload, threads) = (self.workload, self.threads);
        let name = format!("{}/{}/{threads}t", self.limiter, workload.name());
        let mut parallelism = Parallelism::default();
        let (mut admitted, mut checks) = (0u64, 0u64);
        common::bench_threads(c, &name, function, threads, |iters| {
            let run = common::run_checks(make(), threads, iters, true);
            workload.assert_admitted(run.count, iters * threads as u64);
            admitted += run.count;
            checks += iters * threads as u64;
            parallelism.add(&run);
            run.wall
        });
        parallelism.report(&format!("{name}/{function}"));
        if workload == Workload::Limit && checks > 0 {
            eprintln!(
                "{name}/{function}: {:.3}% of {checks} checks admitted",
                100.0 * admitted as f64 / checks.max(1) as f64
            );
        }
    }

    /// Benchmarks a tollgate limiter as `function` on its default clock
    /// (`plain`) and as `function-cached` on the cached clock (`cached`).
    fn tollgate<L: RateLimiter + Send + Sync + 'static, M: RateLimiter + Send + Sync + 'static>(
        &self,
        c: &mut Criterion,
        function: &str,
        plain: impl Fn() -> L,
        cached: impl Fn(CachedClock) -> M,
    ) {
        let workload = self.workload;
        self.bench(c, function, || tollgate_limiter(plain(), workload));
        self.bench(c, &format!("{function}-cached"), || {
            tollgate_limiter(cached(tollgate_cached_clock()), workload)
        });
    }

    /// The token bucket's capacity and rate for this workload.
    fn bucket_rate(&self) -> (u32, Rate) {
        match self.workload {
            Workload::Allow => allow_rate(),
            Workload::Deny => deny_rate(),
            Workload::Limit => limit_rate(self.threads),
        }
    }

    /// The fixed window's rate for this workload.
    fn window_rate(&self) -> Rate {
        match self.workload {
            Workload::Allow => allow_window(),
            Workload::Deny => deny_rate().1,
            Workload::Limit => limit_window(self.threads),
        }
    }
}

/// Runs `run` on every workload at every thread count, as `limiter`'s cases.
fn each_case(c: &mut Criterion, limiter: &'static str, mut run: impl FnMut(&mut Criterion, &Case)) {
    for workload in [Workload::Allow, Workload::Deny, Workload::Limit] {
        for threads in THREADS {
            let case = Case {
                limiter,
                workload,
                threads,
            };
            run(c, &case);
        }
    }
}

/// An allow-heavy token bucket: a permit per nanosecond refills faster than any
/// number of threads can check, and a burst of `u32::MAX` (4.3 s of refill)
/// absorbs any clock staleness, so every check admits and writes.
fn allow_rate() -> (u32, Rate) {
    (u32::MAX, Rate::new(1, Duration::from_nanos(1)))
}

/// A deny-heavy limiter allows one permit an hour; the harness takes it first.
fn deny_rate() -> (u32, Rate) {
    (1, Rate::per_hour(1))
}

fn token_bucket(c: &mut Criterion) {
    each_case(c, "token_bucket", |c, case| {
        let (capacity, rate) = case.bucket_rate();
        case.tollgate(
            c,
            "tollgate-atomic",
            || TokenBucket::new(capacity, rate).unwrap(),
            |clock| TokenBucket::with_clock(capacity, rate, clock).unwrap(),
        );
        case.tollgate(
            c,
            "tollgate-twin",
            || LockingTokenBucket::new(capacity, rate).unwrap(),
            |clock| LockingTokenBucket::with_clock(capacity, rate, clock).unwrap(),
        );
        let quota = match case.workload {
            Workload::Allow => allow_quota(),
            Workload::Deny => deny_quota(),
            Workload::Limit => limit_quota(case.threads),
        };
        case.bench(c, "governor", || {
            governor_limiter(Governor::direct(quota), case.workload)
        });
        case.bench(c, "governor-cached", || {
            let clock = governor_upkeep_clock();
            governor_limiter(Governor::direct_with_clock(quota, clock), case.workload)
        });
    });
}

/// The leased token bucket (per-core stripes) on the token bucket's workloads.
/// Its twin and governor are the token bucket's rows of the same run
/// (`scripts/bench-table` compares against them).
fn leased_token_bucket(c: &mut Criterion) {
    each_case(c, "leased_token_bucket", |c, case| {
        let (capacity, rate) = case.bucket_rate();
        case.tollgate(
            c,
            "tollgate-atomic",
            || LeasedTokenBucket::new(capacity, rate).unwrap(),
            |clock| LeasedTokenBucket::with_clock(capacity, rate, clock).unwrap(),
        );
    });
}

/// An allow-heavy window: `u32::MAX` permits per `u32::MAX` ns (4.3 s), one per
/// nanosecond, more than any run can check.
fn allow_window() -> Rate {
    Rate::new(u32::MAX, Duration::from_nanos(u64::from(u32::MAX)))
}

/// The at-the-limit window: the token bucket's at-the-limit rate as a count
/// per 1 ms window.
fn limit_window(threads: usize) -> Rate {
    let (per_millisecond, _) = limit_rate(threads);
    Rate::new(per_millisecond, Duration::from_millis(1))
}

fn fixed_window(c: &mut Criterion) {
    each_case(c, "fixed_window", |c, case| {
        let rate = case.window_rate();
        case.tollgate(
            c,
            "tollgate-atomic",
            || FixedWindow::new(rate).unwrap(),
            |clock| FixedWindow::with_clock(rate, clock).unwrap(),
        );
        case.tollgate(
            c,
            "tollgate-twin",
            || LockingFixedWindow::new(rate).unwrap(),
            |clock| LockingFixedWindow::with_clock(rate, clock).unwrap(),
        );
    });
}

/// The leased fixed window (per-core stripes) on the fixed window's workloads.
/// Its plain window and twin are the fixed window's rows of the same run
/// (`scripts/bench-table` compares against them). In the allow workload a
/// stripe's batch is up to `1/(2·stripes)` of the window's `u32::MAX` room, so
/// nearly every check is a spend from the thread's own stripe, as it would be
/// for any window whose limit is large against one thread's share of it.
fn leased_fixed_window(c: &mut Criterion) {
    each_case(c, "leased_fixed_window", |c, case| {
        let rate = case.window_rate();
        case.tollgate(
            c,
            "tollgate-atomic",
            || LeasedFixedWindow::new(rate).unwrap(),
            |clock| LeasedFixedWindow::with_clock(rate, clock).unwrap(),
        );
    });
}

/// One reading of each clock, single-threaded: what a check pays before it
/// touches any state.
fn clocks(c: &mut Criterion) {
    let mut group = c.benchmark_group("clock/now");
    let monotonic = MonotonicClock::new();
    group.bench_function("tollgate-monotonic", |b| {
        b.iter(|| black_box(monotonic.now()))
    });
    let cached = tollgate_cached_clock();
    group.bench_function("tollgate-cached", |b| b.iter(|| black_box(cached.now())));
    let quanta = quanta::Clock::new();
    group.bench_function("quanta-raw", |b| b.iter(|| black_box(quanta.raw())));
    group.bench_function("quanta-now", |b| b.iter(|| black_box(quanta.now())));
    group.bench_function("quanta-recent", |b| b.iter(|| black_box(quanta.recent())));
    let governor = QuantaClock::default();
    group.bench_function("governor", |b| b.iter(|| black_box(governor.now())));
    let governor_cached = governor_upkeep_clock();
    group.bench_function("governor-cached", |b| {
        b.iter(|| black_box(governor_cached.now()))
    });
    group.bench_function("std-instant", |b| b.iter(|| black_box(Instant::now())));
    group.finish();
}

criterion_group! {
    name = benches;
    // Sized so the whole run (92 benchmarks) takes about five minutes on 2
    // cores; criterion's `--warm-up-time`, `--measurement-time` and
    // `--sample-size` override the defaults.
    config = common::config();
    targets = clocks, token_bucket, leased_token_bucket, fixed_window, leased_fixed_window
}
criterion_main!(benches);
