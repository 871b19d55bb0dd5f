//! The sliding log against its locking twin, beside the token bucket, at 1, 2
//! and 4 threads, for N = 100 and N = 10,000, allow-heavy, deny-heavy and at
//! the limit.
//!
//! - **allow**: N permits per N ns (one per nanosecond, the finest rate a limiter
//!   accepts), so the entry a check replaces — written N admissions earlier — is
//!   always out of the window by the time it is needed, and every check admits
//!   and writes (its ring's head CAS and one entry). The token bucket next to
//!   it gets the same one-per-ns rate and a burst of `u32::MAX`. A thread
//!   preempted between its claim and its store, or holding a reading from
//!   before its preemption, can make others deny for a while (see
//!   `docs/sliding_log.md`); the harness prints the share of checks admitted
//!   next to each allow result.
//! - **deny**: N permits per hour, all taken before timing starts: every check
//!   reads the head and the entry it would replace, and denies without writing.
//! - **limit**: N permits per N·P ns, `P` twice the log's own time per check
//!   allow-heavy at that thread count, measured first in the same process
//!   (`common::limit_period_of`): the offered load is about twice the rate. The
//!   token bucket beside it is at its own limit (`common::limit_rate`).
//!
//! Groups are named `sliding_log/<N>/<workload>/<threads>t`, functions
//! `tollgate-atomic` (the default split: one ring per CPU),
//! `tollgate-atomic-1-stripe` (one ring, every thread on one head),
//! `tollgate-twin` (the same rings under a mutex) and `token_bucket` (the
//! lock-free token bucket, for scale). One criterion iteration is one check on each of the
//! `threads` threads, timed from the first thread's start to the last one's end,
//! so elements/s is total checks per second.

mod common;

use std::cell::RefCell;
use std::time::Duration;

use common::{Parallelism, Tollgate, Workload};
use criterion::{Criterion, criterion_group, criterion_main};
use tollgate::{LockingSlidingLog, Rate, RateLimiter, SlidingLog, TokenBucket};

/// Log sizes.
const SIZES: [u32; 2] = [100, 10_000];

/// One benchmark: `make` builds a fresh limiter per sample (outside the timed
/// region), the harness runs `iters` checks on each of `threads` threads. Prints
/// the share admitted (allow) and the threads' parallelism.
fn bench<L: RateLimiter + Send + Sync + 'static>(
    c: &mut Criterion,
    group: &str,
    function: &str,
    workload: Workload,
    threads: usize,
    make: impl Fn() -> L,
) {
    let tally = RefCell::new((0u64, 0u64, Parallelism::default()));
    common::bench_threads(c, group, function, threads, |iters| {
        let run = common::run_checks(Tollgate(make()), threads, iters, true);
        let checks = iters * threads as u64;
        match workload {
            // Not every check needs to admit: see the module docs. But a
            // misconfigured rate that admits nothing must not pass for the
            // allow path.
            Workload::Allow => assert!(run.count > 0, "allow workload: nothing admitted"),
            Workload::Deny | Workload::Limit => workload.assert_admitted(run.count, checks),
        }
        let mut tally = tally.borrow_mut();
        tally.0 += run.count;
        tally.1 += checks;
        tally.2.add(&run);
        run.wall
    });
    let (admitted, checks, parallelism) = tally.into_inner();
    parallelism.report(&format!("{group}/{function}"));
    if workload != Workload::Deny && checks > 0 {
        println!(
            "{group}/{function}: {:.3}% of {checks} checks admitted",
            100.0 * admitted as f64 / checks as f64
        );
    }
}

fn rate(n: u32, workload: Workload, threads: usize) -> Rate {
    match workload {
        Workload::Allow => Rate::new(n, Duration::from_nanos(u64::from(n))),
        Workload::Deny => Rate::per_hour(n),
        // At the limit: N permits per N periods, the period twice the time
        // this log takes per check allow-heavy at this thread count, so the
        // offered load is about twice the rate.
        Workload::Limit => {
            let period = common::limit_period_of(
                if n == 100 { "log 100" } else { "log 10000" },
                threads,
                || SlidingLog::new(rate(n, Workload::Allow, threads)).unwrap(),
            );
            Rate::new(n, period * n)
        }
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
        for workload in [Workload::Allow, Workload::Deny, Workload::Limit] {
            for threads in common::THREADS {
                let rate = rate(n, workload, threads);
                let group = format!("sliding_log/{n}/{}/{threads}t", workload.name());
                bench(c, &group, "tollgate-atomic", workload, threads, || {
                    exhausted(SlidingLog::new(rate).unwrap(), n, workload)
                });
                bench(
                    c,
                    &group,
                    "tollgate-atomic-1-stripe",
                    workload,
                    threads,
                    || exhausted(SlidingLog::new(rate).unwrap().with_stripes(1), n, workload),
                );
                bench(c, &group, "tollgate-twin", workload, threads, || {
                    exhausted(LockingSlidingLog::new(rate).unwrap(), n, workload)
                });
                bench(c, &group, "token_bucket", workload, threads, || {
                    let (capacity, rate) = match workload {
                        Workload::Allow => (u32::MAX, Rate::new(1, Duration::from_nanos(1))),
                        // One token an hour: none comes back during a sample
                        // (N per hour would return one every 0.36 s at N = 10,000).
                        Workload::Deny => (n, Rate::per_hour(1)),
                        Workload::Limit => common::limit_rate(threads),
                    };
                    exhausted(TokenBucket::new(capacity, rate).unwrap(), n, workload)
                });
            }
        }
    }
}

criterion_group! {
    name = benches;
    config = common::config();
    targets = sliding_log
}
criterion_main!(benches);
