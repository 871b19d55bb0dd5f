//! What the multi-threaded benchmarks share: the thread harness, criterion's
//! settings, and the pieces the limiter-against-governor benches have in common.
//!
//! Include it with `mod common;` from a bench. The harness in three calls:
//!
//! ```ignore
//! for threads in common::THREADS {
//!     // One group `name` with Throughput::Elements(threads), one function in it.
//!     common::bench_threads(c, &format!("mine/allow/{threads}t"), "tollgate-atomic", threads, |iters| {
//!         // Fresh state per sample, built outside the timed region.
//!         let limiter = Arc::new(TokenBucket::new(10, rate).unwrap());
//!         let run = common::run_threads(threads, false, |_thread| {
//!             let limiter = Arc::clone(&limiter);
//!             // The timed loop: everything in this closure, and nothing else.
//!             move || (0..iters).map(|_| u64::from(limiter.try_acquire().is_ok())).sum()
//!         });
//!         assert_eq!(run.count, iters * threads as u64);
//!         run.wall
//!     });
//! }
//! ```
//!
//! One criterion iteration is then one pass of the loop on each of the
//! `threads` threads, timed from the first thread's start to the last thread's
//! end, so criterion's time per iteration is wall time per round and its
//! elements/s is total operations per second across the threads.

// Every bench includes the whole module and uses only part of it.
#![allow(dead_code)]

pub mod counting;
pub mod keyed;

use std::hint::black_box;
use std::sync::{Arc, Barrier, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, Throughput};
use governor::clock::QuantaUpkeepClock;
use governor::middleware::NoOpMiddleware;
use governor::state::{InMemoryState, NotKeyed};
use governor::{Quota, RateLimiter as Governor};
use tollgate::{CachedClock, RateLimiter};

/// Thread counts. The machine the published numbers come from has 2 cores, so
/// 4 threads oversubscribe it: they measure what preemption does to each design
/// (a twin preempted while holding its lock stalls every other thread; a CAS
/// loop never blocks anyone).
pub const THREADS: [usize; 3] = [1, 2, 4];

/// Criterion's defaults for these benches: 1 s of warm-up, 3 s of measurement,
/// 20 samples. Criterion's `--warm-up-time`, `--measurement-time` and
/// `--sample-size` override them (a bench with its own `main` must call
/// `configure_from_args` on it; `criterion_group!` does that itself).
pub fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(20)
}

/// Runs the bench functions `groups` on [`config`] with criterion's
/// command-line arguments, then prints criterion's summary: the `main` of a
/// bench that does something before its groups.
pub fn run_groups(groups: &[fn(&mut Criterion)]) {
    let mut c = config().configure_from_args();
    for group in groups {
        group(&mut c);
    }
    c.final_summary();
}

// ---------------------------------------------------------------------------
// The thread harness.
// ---------------------------------------------------------------------------

/// What one timed run of [`run_threads`] did.
#[derive(Debug)]
pub struct Run {
    /// From the first thread's start to the last thread's end.
    pub wall: Duration,
    /// The sum of what the threads' jobs returned (admitted checks, granted
    /// reservations, ...).
    pub count: u64,
    /// Each thread's kernel scheduling over its timed region, where asked for
    /// and available; for [`Parallelism::add`].
    pub sched: Vec<Option<Sched>>,
}

/// Runs one job on each of `threads` threads and times them together.
///
/// `job(t)` is called on this thread for `t` in `0..threads`, before anything is
/// timed: it does the per-thread setup (clone an `Arc`, pick an offset) and
/// returns the closure to time, which runs the whole loop and returns a count.
/// The threads are released together by a barrier; each reads the clock just
/// before and just after its closure. With `schedstat`, each also reads its
/// `/proc/thread-self/schedstat` outside those two readings.
///
/// A thread that panics (a failed assertion in a job) fails the bench.
pub fn run_threads<J>(threads: usize, schedstat: bool, mut job: impl FnMut(usize) -> J) -> Run
where
    J: FnOnce() -> u64 + Send + 'static,
{
    let barrier = Arc::new(Barrier::new(threads));
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let job = job(t);
            let barrier = Arc::clone(&barrier);
            thread::spawn(move || {
                barrier.wait();
                let sched = if schedstat { Sched::now() } else { None };
                let start = Instant::now();
                let count = job();
                let end = Instant::now();
                let sched = sched.zip(Sched::now()).map(|(a, b)| b.since(a));
                (start, end, count, sched)
            })
        })
        .collect();
    let mut span: Option<(Instant, Instant)> = None;
    let mut count = 0;
    let mut sched = Vec::with_capacity(threads);
    for worker in workers {
        let (start, end, n, s) = worker.join().expect("bench thread panicked");
        span = Some(span.map_or((start, end), |(s, e)| (s.min(start), e.max(end))));
        count += n;
        sched.push(s);
    }
    Run {
        wall: span.map_or(Duration::ZERO, |(s, e)| e.saturating_duration_since(s)),
        count,
        sched,
    }
}

/// A criterion group named `name` whose throughput is `threads` elements per
/// iteration: one operation on each thread. Add functions with
/// `bench_function(.., |b| b.iter_custom(..))` and `finish` it.
pub fn threads_group<'c>(
    c: &'c mut Criterion,
    name: &str,
    threads: usize,
) -> BenchmarkGroup<'c, WallTime> {
    let mut group = c.benchmark_group(name);
    group.throughput(Throughput::Elements(threads as u64));
    group
}

/// One benchmark: function `function` in the [`threads_group`] `group`, timed
/// by `routine(iters)`, which returns the wall time of `iters` rounds (usually
/// [`Run::wall`]).
pub fn bench_threads(
    c: &mut Criterion,
    group: &str,
    function: &str,
    threads: usize,
    mut routine: impl FnMut(u64) -> Duration,
) {
    let mut g = threads_group(c, group, threads);
    g.bench_function(function, |b| b.iter_custom(&mut routine));
    g.finish();
}

// ---------------------------------------------------------------------------
// Allow-heavy and deny-heavy checks, tollgate against governor.
// ---------------------------------------------------------------------------

/// What the checks should see: every check admits (and writes), or every check
/// denies (and only reads).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Workload {
    Allow,
    Deny,
    /// At the limit: offered load about twice the rate ([`limit_rate`]), so
    /// most checks admit while the bucket hovers at empty and every thread
    /// races for the last permits.
    Limit,
}

impl Workload {
    /// The name in group names: `allow` or `deny`.
    pub fn name(self) -> &'static str {
        match self {
            Workload::Allow => "allow",
            Workload::Deny => "deny",
            Workload::Limit => "limit",
        }
    }

    /// Asserts that `admitted` of `checks` is all of them (allow) or none
    /// (deny), so a misconfigured workload cannot pass for the other one.
    pub fn assert_admitted(self, admitted: u64, checks: u64) {
        let expected = match self {
            Workload::Allow => checks,
            Workload::Deny => 0,
            // Some, not all: a rate so high that nothing is denied, or so low
            // that nothing passes, is not the regime this workload measures.
            Workload::Limit => {
                assert!(admitted > 0, "limit workload: nothing of {checks} admitted");
                return;
            }
        };
        assert_eq!(
            admitted, expected,
            "{self:?} workload: {admitted} of {checks} checks admitted"
        );
    }
}

/// One check, `true` if admitted. A trait rather than a function pointer, so the
/// check is inlined into the timed loop as it would be in a user's code.
pub trait Check: Send + Sync + 'static {
    fn check(&self) -> bool;
}

/// A tollgate limiter, checked through the public trait.
pub struct Tollgate<L>(pub L);

impl<L: RateLimiter + Send + Sync + 'static> Check for Tollgate<L> {
    #[inline]
    fn check(&self) -> bool {
        self.0.try_acquire().is_ok()
    }
}

/// governor's direct (unkeyed) limiter on clock `C`.
pub type GovernorDirect<C> =
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

/// `iters` checks of `limiter` on each of `threads` threads ([`run_threads`]);
/// [`Run::count`] is the number admitted.
pub fn run_checks<L: Check>(limiter: L, threads: usize, iters: u64, schedstat: bool) -> Run {
    let limiter = Arc::new(limiter);
    run_threads(threads, schedstat, |_| {
        let limiter = Arc::clone(&limiter);
        move || {
            let mut admitted = 0u64;
            for _ in 0..iters {
                admitted += u64::from(black_box(limiter.check()));
            }
            admitted
        }
    })
}

/// `limiter`, with the first permit of the hour taken for a deny workload.
pub fn tollgate_limiter<L: RateLimiter>(limiter: L, workload: Workload) -> Tollgate<L> {
    if workload == Workload::Deny {
        assert!(limiter.try_acquire().is_ok(), "first permit of the hour");
    }
    Tollgate(limiter)
}

/// As [`tollgate_limiter`], for governor.
pub fn governor_limiter<C: governor::clock::Clock>(
    limiter: GovernorDirect<C>,
    workload: Workload,
) -> GovernorDirect<C> {
    if workload == Workload::Deny {
        assert!(limiter.check().is_ok(), "first permit of the hour");
    }
    limiter
}

/// An allow-heavy quota: a permit per nanosecond and a burst of `u32::MAX`.
pub fn allow_quota() -> Quota {
    Quota::with_period(Duration::from_nanos(1))
        .expect("non-zero period")
        .allow_burst(std::num::NonZeroU32::MAX)
}

/// The at-the-limit rate for `threads` threads: one permit per `period`,
/// `period` set so the rate is half of what the plain `TokenBucket` checks
/// allow-heavy at that thread count on this machine, measured once per
/// thread count in this process (about 0.1 s); and a burst of 1 ms of the
/// rate. The offered load is then about twice the rate, whatever the CPU.
pub fn limit_period(threads: usize) -> Duration {
    limit_period_of("token bucket", threads, || {
        tollgate::TokenBucket::new(u32::MAX, tollgate::Rate::new(1, Duration::from_nanos(1)))
            .expect("a valid rate")
    })
}

/// As [`limit_period`], for the limiter `make` builds allow-heavy (named
/// `name`, which keys the measurement): half of what it checks allow-heavy
/// at `threads` threads.
pub fn limit_period_of<L: RateLimiter + Send + Sync + 'static>(
    name: &'static str,
    threads: usize,
    make: impl FnOnce() -> L,
) -> Duration {
    use std::collections::BTreeMap;
    use std::sync::Mutex;
    static PERIODS: Mutex<BTreeMap<(&'static str, usize), Duration>> = Mutex::new(BTreeMap::new());
    let mut periods = PERIODS.lock().unwrap_or_else(|e| e.into_inner());
    *periods.entry((name, threads)).or_insert_with(|| {
        let iters = 2_000_000;
        let run = run_checks(Tollgate(make()), threads, iters, false);
        let checks = iters as f64 * threads as f64;
        let ns_per_check = run.wall.as_nanos() as f64 / checks;
        let period = Duration::from_nanos((2.0 * ns_per_check).ceil().max(1.0) as u64);
        eprintln!(
            "limit rate at {threads}t: one permit per {period:?} (allow-heavy {name}: {:.1} M checks/s)",
            1e3 / ns_per_check
        );
        period
    })
}

/// [`limit_period`] as a tollgate capacity and rate.
pub fn limit_rate(threads: usize) -> (u32, tollgate::Rate) {
    let period = limit_period(threads);
    let burst = (1_000_000 / period.as_nanos()).clamp(1, u128::from(u32::MAX)) as u32;
    (burst, tollgate::Rate::new(1, period))
}

/// [`limit_period`] as a governor quota.
pub fn limit_quota(threads: usize) -> Quota {
    let (burst, _) = limit_rate(threads);
    Quota::with_period(limit_period(threads))
        .expect("non-zero period")
        .allow_burst(std::num::NonZeroU32::new(burst).expect("at least 1"))
}

/// A deny-heavy quota: one permit an hour.
pub fn deny_quota() -> Quota {
    Quota::per_hour(std::num::NonZeroU32::MIN)
}

// ---------------------------------------------------------------------------
// Cached clocks.
// ---------------------------------------------------------------------------

/// quanta's upkeep interval for both cached clocks, tollgate's and governor's.
pub const UPKEEP: Duration = Duration::from_millis(1);

/// governor's cached clock, shared by every cached benchmark.
///
/// quanta has one global cached time and allows one upkeep thread. governor's
/// constructor fails if the thread is already running, so this clock starts it,
/// before any `CachedClock`; tollgate's `CachedClock` then joins that thread
/// rather than starting its own. The thread stops when governor's last clone is
/// dropped, and a `CachedClock` that joined it would then stand still; holding
/// one clone in a static for the whole process prevents that. Both cached
/// clocks therefore read the same value, refreshed every `UPKEEP`.
pub fn governor_upkeep_clock() -> QuantaUpkeepClock {
    static CLOCK: OnceLock<QuantaUpkeepClock> = OnceLock::new();
    CLOCK
        .get_or_init(|| {
            QuantaUpkeepClock::from_interval(UPKEEP)
                .expect("governor's upkeep clock must start before tollgate's CachedClock")
        })
        .clone()
}

/// tollgate's cached clock, on the upkeep thread of [`governor_upkeep_clock`].
pub fn tollgate_cached_clock() -> CachedClock {
    governor_upkeep_clock();
    CachedClock::new()
}

// ---------------------------------------------------------------------------
// How parallel the threads really ran.
// ---------------------------------------------------------------------------

/// What the kernel says one thread did during a sample: nanoseconds on a CPU and
/// nanoseconds runnable but waiting for one (`/proc/thread-self/schedstat`).
#[derive(Clone, Copy, Default, Debug)]
pub struct Sched {
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
/// its samples (runs made with `schedstat`). On 2 shared cores the
/// multi-threaded numbers mean something only if the threads ran in parallel:
/// two threads sharing one core (because another process holds the other) never
/// contend for the cache line, and measure a single thread's speed.
#[derive(Default)]
pub struct Parallelism {
    wall: u64,
    on_cpu: u64,
    waiting: u64,
    complete: bool,
}

impl Parallelism {
    /// Adds one run. A run with a thread that has no schedstat makes the whole
    /// benchmark's report go missing rather than wrong.
    pub fn add(&mut self, run: &Run) {
        let first = self.wall == 0;
        self.wall += u64::try_from(run.wall.as_nanos()).unwrap_or(u64::MAX);
        let all = run.sched.iter().all(Option::is_some);
        self.complete = all && (first || self.complete);
        for sched in run.sched.iter().flatten() {
            self.on_cpu += sched.on_cpu;
            self.waiting += sched.waiting;
        }
    }

    /// One line per benchmark, which `scripts/bench-table` reads: the mean number
    /// of threads on a CPU during the timed region, and the share of the threads'
    /// time spent waiting for a CPU.
    pub fn report(&self, id: &str) {
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
