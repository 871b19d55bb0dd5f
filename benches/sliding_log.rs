//! The sliding log against its locking twin, beside the token bucket, at 1, 2
//! and 4 threads, for N = 100 and N = 10,000, allow-heavy and deny-heavy.
//!
//! - **allow**: N permits per N ns (one per nanosecond, the finest rate a limiter
//!   accepts), so the entry a check replaces — written N admissions earlier — is
//!   always out of the window by the time it is needed, and every check admits
//!   and writes (the head CAS and one entry). The token bucket next to it gets
//!   the same one-per-ns rate and a burst of `u32::MAX`. On an oversubscribed
//!   machine (4 threads, 2 cores) a thread preempted between its claim and its
//!   store, or holding a reading from before its preemption, makes others deny
//!   for a while (see `docs/sliding_log.md`); the harness prints the share of
//!   checks admitted next to each allow result.
//! - **deny**: N permits per hour, all taken before timing starts: every check
//!   reads the head and the entry it would replace, and denies without writing.
//!
//! Groups are named `sliding_log/<N>/<workload>/<threads>t`, functions
//! `tollgate-atomic`, `tollgate-twin` and `token_bucket` (the lock-free token
//! bucket, for scale). One criterion iteration is one check on each of the
//! `threads` threads, timed from the first thread's start to the last one's end,
//! so elements/s is total checks per second.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use tollgate::{LockingSlidingLog, Rate, RateLimiter, SlidingLog, TokenBucket};

/// Thread counts; the machine has 2 cores, so 4 threads oversubscribe it.
const THREADS: [usize; 3] = [1, 2, 4];

/// Log sizes.
const SIZES: [u32; 2] = [100, 10_000];

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Workload {
    Allow,
    Deny,
}

/// Checks admitted and made, per benchmark, over all of criterion's runs.
struct Tally {
    admitted: AtomicU64,
    checks: AtomicU64,
}

/// Runs `iters` checks on each of `threads` threads sharing `limiter` and returns
/// the wall time from the first start to the last end.
fn run<L: RateLimiter + Send + Sync + 'static>(
    limiter: L,
    workload: Workload,
    threads: usize,
    iters: u64,
    tally: &Tally,
) -> Duration {
    let limiter = Arc::new(limiter);
    let barrier = Arc::new(Barrier::new(threads));
    let workers: Vec<_> = (0..threads)
        .map(|_| {
            let (limiter, barrier) = (limiter.clone(), barrier.clone());
            thread::spawn(move || {
                barrier.wait();
                let start = Instant::now();
                let mut admitted = 0u64;
                for _ in 0..iters {
                    admitted += u64::from(black_box(limiter.try_acquire()).is_ok());
                }
                (start, Instant::now(), admitted)
            })
        })
        .collect();
    let mut span: Option<(Instant, Instant)> = None;
    let mut admitted = 0;
    for worker in workers {
        let (start, end, n) = worker.join().expect("bench thread panicked");
        span = Some(span.map_or((start, end), |(s, e)| (s.min(start), e.max(end))));
        admitted += n;
    }
    let checks = iters * threads as u64;
    match workload {
        // Not every check: see the module docs. But a misconfigured rate that
        // admits nothing must not pass for the allow path.
        Workload::Allow => assert!(admitted > 0, "allow workload: nothing admitted"),
        Workload::Deny => assert_eq!(admitted, 0, "deny workload admitted"),
    }
    tally.admitted.fetch_add(admitted, Ordering::Relaxed);
    tally.checks.fetch_add(checks, Ordering::Relaxed);
    span.map_or(Duration::ZERO, |(s, e)| e.saturating_duration_since(s))
}

fn bench<L: RateLimiter + Send + Sync + 'static>(
    c: &mut Criterion,
    group: &str,
    function: &str,
    workload: Workload,
    threads: usize,
    make: impl Fn() -> L,
) {
    let tally = Tally {
        admitted: AtomicU64::new(0),
        checks: AtomicU64::new(0),
    };
    let mut g = c.benchmark_group(group);
    g.throughput(Throughput::Elements(threads as u64));
    g.bench_function(function, |b| {
        b.iter_custom(|iters| run(make(), workload, threads, iters, &tally))
    });
    g.finish();
    let checks = tally.checks.load(Ordering::Relaxed);
    if workload == Workload::Allow && checks > 0 {
        let (admitted, checks) = (
            tally.admitted.load(Ordering::Relaxed),
            tally.checks.load(Ordering::Relaxed),
        );
        println!(
            "{group}/{function}: {:.3}% of {checks} checks admitted",
            100.0 * admitted as f64 / checks.max(1) as f64
        );
    }
}

fn rate(n: u32, workload: Workload) -> Rate {
    match workload {
        Workload::Allow => Rate::new(n, Duration::from_nanos(u64::from(n))),
        Workload::Deny => Rate::per_hour(n),
    }
}

fn exhausted<L: RateLimiter>(limiter: L, n: u32, workload: Workload) -> L {
    if workload == Workload::Deny {
        assert!(limiter.try_acquire_n(n).is_ok(), "the hour's permits");
    }
    limiter
}

fn sliding_log(c: &mut Criterion) {
    for n in SIZES {
        for workload in [Workload::Allow, Workload::Deny] {
            let rate = rate(n, workload);
            for threads in THREADS {
                let name = match workload {
                    Workload::Allow => "allow",
                    Workload::Deny => "deny",
                };
                let group = format!("sliding_log/{n}/{name}/{threads}t");
                bench(c, &group, "tollgate-atomic", workload, threads, || {
                    exhausted(SlidingLog::new(rate).unwrap(), n, workload)
                });
                bench(c, &group, "tollgate-twin", workload, threads, || {
                    exhausted(LockingSlidingLog::new(rate).unwrap(), n, workload)
                });
                bench(c, &group, "token_bucket", workload, threads, || {
                    let (capacity, rate) = match workload {
                        Workload::Allow => (u32::MAX, Rate::new(1, Duration::from_nanos(1))),
                        Workload::Deny => (n, Rate::per_hour(n)),
                    };
                    exhausted(TokenBucket::new(capacity, rate).unwrap(), n, workload)
                });
            }
        }
    }
}

/// Sized so the whole run (36 benchmarks) takes about three minutes on 2 cores;
/// criterion's `--warm-up-time`, `--measurement-time` and `--sample-size`
/// override these.
fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(20)
}

criterion_group! {
    name = benches;
    config = config();
    targets = sliding_log
}
criterion_main!(benches);
