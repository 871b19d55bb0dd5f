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
//!
//! Groups are named `<limiter>/<workload>/<threads>t` (`token_bucket/allow/2t`),
//! functions after the implementation: `tollgate-atomic` (the lock-free limiter),
//! `tollgate-twin` (its locking twin), `governor` (its direct limiter, token
//! bucket only), each on its default clock, and the same with a `-cached` suffix
//! on the cached clocks. `scripts/bench-table` turns the results into the table
//! in `docs/benchmarks.md`. One criterion iteration is one check on each of the
//! `threads` threads, timed from the first thread's start to the last thread's
//! end, so criterion's time per iteration is wall time per round of checks and
//! its elements/s (`Throughput::Elements(threads)`) is total checks per second.
//!
//! The `clock/now` group times one reading of each clock, for reading the rest.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::{Arc, Barrier, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use governor::clock::{Clock as _, QuantaClock, QuantaUpkeepClock};
use governor::middleware::NoOpMiddleware;
use governor::state::{InMemoryState, NotKeyed};
use governor::{Quota, RateLimiter as Governor};
use tollgate::{
    CachedClock, Clock, FixedWindow, LockingFixedWindow, LockingTokenBucket, MonotonicClock, Rate,
    RateLimiter, TokenBucket,
};

/// Thread counts. The machine these numbers come from has 2 cores, so 4 threads
/// oversubscribe it: they measure what preemption does to each design (a twin
/// preempted while holding its lock stalls every other thread; a CAS loop never
/// blocks anyone).
const THREADS: [usize; 3] = [1, 2, 4];

/// quanta's upkeep interval for both cached clocks, tollgate's and governor's.
const UPKEEP: Duration = Duration::from_millis(1);

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Workload {
    Allow,
    Deny,
}

impl Workload {
    fn name(self) -> &'static str {
        match self {
            Workload::Allow => "allow",
            Workload::Deny => "deny",
        }
    }
}

/// One check, `true` if admitted. A trait rather than a function pointer, so the
/// check is inlined into the timed loop as it would be in a user's code.
trait Check: Send + Sync + 'static {
    fn check(&self) -> bool;
}

/// A tollgate limiter, checked through the public trait.
struct Tollgate<L>(L);

impl<L: RateLimiter + Send + Sync + 'static> Check for Tollgate<L> {
    #[inline]
    fn check(&self) -> bool {
        self.0.try_acquire().is_ok()
    }
}

type GovernorDirect<C> =
    Governor<NotKeyed, InMemoryState, C, NoOpMiddleware<<C as governor::clock::Clock>::Instant>>;

impl<C> Check for GovernorDirect<C>
where
    C: governor::clock::Clock + Send + Sync + 'static,
    C::Instant: Send + Sync,
{
    #[inline]
    fn check(&self) -> bool {
        self.check().is_ok()
    }
}

/// governor's cached clock, shared by every cached benchmark.
///
/// quanta has one global cached time and allows one upkeep thread. governor's
/// constructor fails if the thread is already running, so this clock starts it,
/// before any `CachedClock`; tollgate's `CachedClock` then joins that thread
/// rather than starting its own. The thread stops when governor's last clone is
/// dropped, and a `CachedClock` that joined it would then stand still; holding
/// one clone in a static for the whole process prevents that. Both cached
/// clocks therefore read the same value, refreshed every `UPKEEP`.
fn governor_upkeep_clock() -> QuantaUpkeepClock {
    static CLOCK: OnceLock<QuantaUpkeepClock> = OnceLock::new();
    CLOCK
        .get_or_init(|| {
            QuantaUpkeepClock::from_interval(UPKEEP)
                .expect("governor's upkeep clock must start before tollgate's CachedClock")
        })
        .clone()
}

fn tollgate_cached_clock() -> CachedClock {
    governor_upkeep_clock();
    CachedClock::new()
}

/// What the kernel says one thread did during a sample: nanoseconds on a CPU and
/// nanoseconds runnable but waiting for one (`/proc/thread-self/schedstat`).
#[derive(Clone, Copy, Default)]
struct Sched {
    on_cpu: u64,
    waiting: u64,
}

impl Sched {
    /// `None` where the kernel does not expose schedstat (not Linux, or built
    /// without it); the benchmark then runs without the report.
    fn now() -> Option<Sched> {
        let stat = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
        let mut fields = stat.split_whitespace().map(|f| f.parse::<u64>().ok());
        Some(Sched {
            on_cpu: fields.next()??,
            waiting: fields.next()??,
        })
    }

    fn since(self, earlier: Sched) -> Sched {
        Sched {
            on_cpu: self.on_cpu.saturating_sub(earlier.on_cpu),
            waiting: self.waiting.saturating_sub(earlier.waiting),
        }
    }
}

/// How many of a benchmark's threads were actually running at once, summed over
/// its samples. On 2 shared cores the multi-threaded numbers mean something only
/// if the threads ran in parallel: two threads sharing one core (because another
/// process holds the other) never contend for the cache line, and measure a
/// single thread's speed.
#[derive(Default)]
struct Parallelism {
    wall: u64,
    on_cpu: u64,
    waiting: u64,
    complete: bool,
}

impl Parallelism {
    fn add(&mut self, wall: Duration, threads: &[Option<Sched>]) {
        let first = self.wall == 0;
        self.wall += u64::try_from(wall.as_nanos()).unwrap_or(u64::MAX);
        let all = threads.iter().all(Option::is_some);
        self.complete = all && (first || self.complete);
        for sched in threads.iter().flatten() {
            self.on_cpu += sched.on_cpu;
            self.waiting += sched.waiting;
        }
    }

    /// One line per benchmark, which `scripts/bench-table` reads: the mean number
    /// of threads on a CPU during the timed region, and the share of the threads'
    /// time spent waiting for a CPU.
    fn report(&self, id: &str) {
        if self.complete && self.wall > 0 {
            let busy = self.on_cpu as f64 / self.wall as f64;
            let waiting = self.waiting as f64 / (self.on_cpu + self.waiting).max(1) as f64;
            println!(
                "parallelism {id}: {busy:.2} threads on CPU, {:.1}% waiting for a CPU",
                100.0 * waiting
            );
        }
    }
}

/// Runs `iters` checks on each of `threads` threads sharing `limiter`, and returns
/// the wall time from the first thread's start to the last thread's end. Asserts
/// that every check was admitted (allow) or denied (deny), so a misconfigured
/// workload cannot pass for the other one.
fn run<L: Check>(
    limiter: L,
    workload: Workload,
    threads: usize,
    iters: u64,
    parallelism: &mut Parallelism,
) -> Duration {
    let limiter = Arc::new(limiter);
    let barrier = Arc::new(Barrier::new(threads));
    let workers: Vec<_> = (0..threads)
        .map(|_| {
            let limiter = Arc::clone(&limiter);
            let barrier = Arc::clone(&barrier);
            thread::spawn(move || {
                barrier.wait();
                let sched = Sched::now();
                let start = Instant::now();
                let mut admitted = 0u64;
                for _ in 0..iters {
                    admitted += u64::from(black_box(limiter.check()));
                }
                let end = Instant::now();
                let sched = sched.zip(Sched::now()).map(|(a, b)| b.since(a));
                (start, end, admitted, sched)
            })
        })
        .collect();

    let mut first_start: Option<Instant> = None;
    let mut last_end: Option<Instant> = None;
    let mut admitted = 0;
    let mut sched = Vec::with_capacity(threads);
    for worker in workers {
        let (start, end, n, s) = worker.join().expect("bench thread panicked");
        first_start = Some(first_start.map_or(start, |f| f.min(start)));
        last_end = Some(last_end.map_or(end, |l| l.max(end)));
        admitted += n;
        sched.push(s);
    }
    let checks = iters * threads as u64;
    let expected = match workload {
        Workload::Allow => checks,
        Workload::Deny => 0,
    };
    assert_eq!(
        admitted, expected,
        "{workload:?} workload: {admitted} of {checks} checks admitted"
    );
    let wall = match (first_start, last_end) {
        (Some(start), Some(end)) => end.saturating_duration_since(start),
        _ => Duration::ZERO,
    };
    parallelism.add(wall, &sched);
    wall
}

/// One criterion group: a limiter, a workload, a thread count.
struct Case {
    limiter: &'static str,
    workload: Workload,
    threads: usize,
}

impl Case {
    /// Benchmarks one implementation: `make` builds a fresh limiter per sample, in
    /// the state the workload needs (exhausted for deny), outside the timed region.
    fn bench<L: Check>(&self, c: &mut Criterion, function: &str, make: impl Fn() -> L) {
        let (workload, threads) = (self.workload, self.threads);
        let name = format!("{}/{}/{threads}t", self.limiter, workload.name());
        let mut parallelism = Parallelism::default();
        let mut group = c.benchmark_group(&name);
        group.throughput(Throughput::Elements(threads as u64));
        group.bench_function(function, |b| {
            b.iter_custom(|iters| run(make(), workload, threads, iters, &mut parallelism))
        });
        group.finish();
        parallelism.report(&format!("{name}/{function}"));
    }
}

/// An allow-heavy token bucket: a permit per nanosecond refills faster than any
/// number of threads can check, and a burst of `u32::MAX` (4.3 s of refill)
/// absorbs any clock staleness, so every check admits and writes.
fn allow_rate() -> (u32, Rate) {
    (u32::MAX, Rate::new(1, Duration::from_nanos(1)))
}

fn allow_quota() -> Quota {
    Quota::with_period(Duration::from_nanos(1))
        .expect("non-zero period")
        .allow_burst(NonZeroU32::MAX)
}

/// A deny-heavy limiter allows one permit an hour; the harness takes it first.
fn deny_rate() -> (u32, Rate) {
    (1, Rate::per_hour(1))
}

fn deny_quota() -> Quota {
    Quota::per_hour(NonZeroU32::MIN)
}

fn tollgate_limiter<L: RateLimiter>(limiter: L, workload: Workload) -> Tollgate<L> {
    if workload == Workload::Deny {
        assert!(limiter.try_acquire().is_ok(), "first permit of the hour");
    }
    Tollgate(limiter)
}

fn governor_limiter<C: governor::clock::Clock>(
    limiter: GovernorDirect<C>,
    workload: Workload,
) -> GovernorDirect<C> {
    if workload == Workload::Deny {
        assert!(limiter.check().is_ok(), "first permit of the hour");
    }
    limiter
}

fn token_bucket(c: &mut Criterion) {
    for workload in [Workload::Allow, Workload::Deny] {
        let ((capacity, rate), quota) = match workload {
            Workload::Allow => (allow_rate(), allow_quota()),
            Workload::Deny => (deny_rate(), deny_quota()),
        };
        for threads in THREADS {
            let case = Case {
                limiter: "token_bucket",
                workload,
                threads,
            };
            case.bench(c, "tollgate-atomic", || {
                tollgate_limiter(TokenBucket::new(capacity, rate).unwrap(), workload)
            });
            case.bench(c, "tollgate-atomic-cached", || {
                let clock = tollgate_cached_clock();
                tollgate_limiter(
                    TokenBucket::with_clock(capacity, rate, clock).unwrap(),
                    workload,
                )
            });
            case.bench(c, "tollgate-twin", || {
                tollgate_limiter(LockingTokenBucket::new(capacity, rate).unwrap(), workload)
            });
            case.bench(c, "tollgate-twin-cached", || {
                let clock = tollgate_cached_clock();
                tollgate_limiter(
                    LockingTokenBucket::with_clock(capacity, rate, clock).unwrap(),
                    workload,
                )
            });
            case.bench(c, "governor", || {
                governor_limiter(Governor::direct(quota), workload)
            });
            case.bench(c, "governor-cached", || {
                let clock = governor_upkeep_clock();
                governor_limiter(Governor::direct_with_clock(quota, clock), workload)
            });
        }
    }
}

/// An allow-heavy window: `u32::MAX` permits per `u32::MAX` ns (4.3 s), one per
/// nanosecond, more than any run can check.
fn allow_window() -> Rate {
    Rate::new(u32::MAX, Duration::from_nanos(u64::from(u32::MAX)))
}

fn fixed_window(c: &mut Criterion) {
    for workload in [Workload::Allow, Workload::Deny] {
        let rate = match workload {
            Workload::Allow => allow_window(),
            Workload::Deny => deny_rate().1,
        };
        for threads in THREADS {
            let case = Case {
                limiter: "fixed_window",
                workload,
                threads,
            };
            case.bench(c, "tollgate-atomic", || {
                tollgate_limiter(FixedWindow::new(rate).unwrap(), workload)
            });
            case.bench(c, "tollgate-atomic-cached", || {
                let clock = tollgate_cached_clock();
                tollgate_limiter(FixedWindow::with_clock(rate, clock).unwrap(), workload)
            });
            case.bench(c, "tollgate-twin", || {
                tollgate_limiter(LockingFixedWindow::new(rate).unwrap(), workload)
            });
            case.bench(c, "tollgate-twin-cached", || {
                let clock = tollgate_cached_clock();
                tollgate_limiter(
                    LockingFixedWindow::with_clock(rate, clock).unwrap(),
                    workload,
                )
            });
        }
    }
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

/// Defaults sized so the whole run (68 benchmarks) takes about five minutes on
/// 2 cores; criterion's `--warm-up-time`, `--measurement-time` and
/// `--sample-size` override them.
fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(20)
}

criterion_group! {
    name = benches;
    config = config();
    targets = clocks, token_bucket, fixed_window
}
criterion_main!(benches);
