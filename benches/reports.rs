//! What a decision that reports its quota costs beside the plain one:
//! `try_acquire_with_snapshot` against `try_acquire` on the same limiter, at
//! 1, 2 and 4 threads, allow-heavy and deny-heavy (the workloads of
//! `benches/limiters.rs`, same harness).
//!
//! Groups are `reports/<limiter>/<workload>/<threads>t`, functions `plain` and
//! `with-snapshot`. Each iteration is one check on each thread.
//!
//! ```sh
//! cargo bench --bench reports
//! ```

use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use tollgate::keyed::{BucketConfig, Keyed};
use tollgate::{
    ApproxSlidingWindow, FixedWindow, Rate, RateLimiter, SlidingLog, SlidingWindow, TokenBucket,
};

mod common;
use common::{Check, THREADS, Workload};

/// A check through `try_acquire_with_snapshot`; the report is kept alive so it
/// is computed.
struct Reported<L>(L);

impl<L: RateLimiter + Send + Sync + 'static> Check for Reported<L> {
    #[inline]
    fn check(&self) -> bool {
        std::hint::black_box(self.0.try_acquire_with_snapshot()).is_ok()
    }
}

/// A check through `try_acquire`.
struct Plain<L>(L);

impl<L: RateLimiter + Send + Sync + 'static> Check for Plain<L> {
    #[inline]
    fn check(&self) -> bool {
        self.0.try_acquire().is_ok()
    }
}

/// One hot key of a keyed token bucket, through each call.
struct KeyedPlain(Keyed<u64, TokenBucket>);
struct KeyedReported(Keyed<u64, TokenBucket>);

impl Check for KeyedPlain {
    #[inline]
    fn check(&self) -> bool {
        self.0.try_acquire(&7).is_ok()
    }
}

impl Check for KeyedReported {
    #[inline]
    fn check(&self) -> bool {
        std::hint::black_box(self.0.try_acquire_with_snapshot(&7)).is_ok()
    }
}

fn bench<L: Check>(
    c: &mut Criterion,
    limiter: &str,
    workload: Workload,
    threads: usize,
    function: &str,
    make: impl Fn() -> L,
) {
    let name = format!("reports/{limiter}/{}/{threads}t", workload.name());
    common::bench_threads(c, &name, function, threads, |iters| {
        let run = common::run_checks(make(), threads, iters, false);
        workload.assert_admitted(run.count, iters * threads as u64);
        run.wall
    });
}

/// Builds a limiter in the workload's state: never denying (allow), or
/// exhausted for the hour (deny).
fn prepared<L: RateLimiter>(make: impl Fn(u32, Rate) -> L, workload: Workload) -> L {
    match workload {
        Workload::Allow => make(u32::MAX, Rate::new(1, Duration::from_nanos(1))),
        Workload::Deny => {
            let limiter = make(1, Rate::per_hour(1));
            assert!(limiter.try_acquire().is_ok(), "first permit of the hour");
            limiter
        }
        Workload::Limit => unreachable!("this bench runs the allow and deny workloads only"),
    }
}

/// The windows' allow-heavy rate: the most a window can count (`u32::MAX`)
/// per 5 s, which no run exhausts; the deny-heavy rate unchanged.
fn window_rate(rate: Rate) -> Rate {
    if rate.period() == Duration::from_nanos(1) {
        Rate::new(u32::MAX, Duration::from_secs(5))
    } else {
        rate
    }
}

macro_rules! pair {
    ($c:expr, $name:literal, $workload:expr, $threads:expr, $make:expr) => {{
        let make = $make;
        bench($c, $name, $workload, $threads, "plain", || {
            Plain(prepared(make, $workload))
        });
        bench($c, $name, $workload, $threads, "with-snapshot", || {
            Reported(prepared(make, $workload))
        });
    }};
}

fn reports(c: &mut Criterion) {
    for workload in [Workload::Allow, Workload::Deny] {
        for threads in THREADS {
            pair!(c, "token_bucket", workload, threads, |cap, rate| {
                TokenBucket::new(cap, rate).unwrap()
            });
            pair!(c, "fixed_window", workload, threads, |_, rate: Rate| {
                FixedWindow::new(window_rate(rate)).unwrap()
            });
            pair!(
                c,
                "approx_sliding_window",
                workload,
                threads,
                |_, rate: Rate| { ApproxSlidingWindow::new(window_rate(rate)).unwrap() }
            );
            pair!(c, "sliding_window", workload, threads, |_, rate: Rate| {
                SlidingWindow::new(window_rate(rate)).unwrap()
            });
            if workload == Workload::Deny {
                // A log of N entries reports in O(N): a small N, deny-heavy
                // (an allow-heavy log needs N as large as the run).
                pair!(c, "sliding_log_n100", workload, threads, |_, _| {
                    let log = SlidingLog::new(Rate::per_hour(100)).unwrap();
                    log.try_acquire_n(99).unwrap();
                    log
                });
            }
            let keyed = |workload| {
                let (cap, rate) = match workload {
                    Workload::Allow => (u32::MAX, Rate::new(1, Duration::from_nanos(1))),
                    Workload::Deny => (1, Rate::per_hour(1)),
                    Workload::Limit => {
                        unreachable!("this bench runs the allow and deny workloads only")
                    }
                };
                let k = Keyed::<u64, TokenBucket>::new(BucketConfig::new(cap, rate).unwrap());
                if workload == Workload::Deny {
                    assert!(k.try_acquire(&7).is_ok());
                }
                k
            };
            bench(c, "keyed_hot_key", workload, threads, "plain", || {
                KeyedPlain(keyed(workload))
            });
            bench(
                c,
                "keyed_hot_key",
                workload,
                threads,
                "with-snapshot",
                || KeyedReported(keyed(workload)),
            );
        }
    }
}

criterion_group! {
    name = benches;
    config = common::config();
    targets = reports
}
criterion_main!(benches);
