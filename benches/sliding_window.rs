//! The striped sliding window against its locking twin, tollgate's token
//! bucket and governor's direct limiter, in one run, at 1, 2 and 4 threads.
//!
//! Three workloads, as in `benches/limiters.rs`:
//!
//! - **allow**: every check admits and writes (the windows hold `u32::MAX`
//!   permits per 43 s, more than any sample can check; the token buckets refill
//!   one permit per nanosecond with a burst of `u32::MAX`). The harness asserts
//!   that every check was admitted.
//! - **deny**: the limiter is exhausted before timing starts (one permit an
//!   hour), so every check denies; asserted too.
//! - **limit**: offered load about twice the rate — the windows hold one
//!   millisecond's worth of one permit per `P` ns, the token buckets and
//!   governor refill one per `P` ns with that burst, `P` twice the token
//!   bucket's allow-heavy time per check at that thread count, measured first
//!   in the same process (`common::limit_period`). The share admitted is
//!   printed with each result.
//!
//! Groups are `sliding_window/<workload>/<threads>t`, functions after the
//! implementation; `tollgate-sliding-*` are the striped window with one stripe
//! per CPU, `-cached` ones read [`CachedClock`] (governor's twin reads its own
//! cached clock). One criterion iteration is one check on each thread, timed
//! from the first thread's start to the last thread's end, so elements/s
//! (`Throughput::Elements(threads)`) is total checks per second.
//!
//! Before timing, the bench prints two things criterion cannot measure:
//!
//! - **memory** per limiter, for each stripe count;
//! - **precision**: threads hammering an exhaustible window in lock-step
//!   rounds on a manual clock (time stands still within a round), counting the
//!   permits denied while the window still had room for them — budget stranded
//!   in other threads' hands or on other stripes.
//!
//! This machine has 2 cores: 4 threads oversubscribe it, and the numbers are
//! ratios within one run.

use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use governor::RateLimiter as Governor;
use tollgate::{
    ApproxSlidingWindow, LockingSlidingWindow, ManualClock, MonotonicClock, Rate, RateLimiter,
    SlidingWindow, TokenBucket,
};

mod common;
use common::{
    Check, GovernorDirect, THREADS, Workload, allow_quota, deny_quota, governor_limiter,
    governor_upkeep_clock, limit_quota, limit_rate, tollgate_cached_clock, tollgate_limiter,
};

/// One benchmark: `make` builds a fresh limiter per sample, outside the timed
/// region; asserts the workload (all admitted, or all denied).
fn bench<L: Check>(
    c: &mut Criterion,
    workload: Workload,
    threads: usize,
    function: &str,
    make: impl Fn() -> L,
) {
    let group = format!("sliding_window/{}/{threads}t", workload.name());
    let tally = std::cell::Cell::new((0u64, 0u64));
    common::bench_threads(c, &group, function, threads, |iters| {
        let run = common::run_checks(make(), threads, iters, false);
        let checks = iters * threads as u64;
        workload.assert_admitted(run.count, checks);
        let (admitted, total) = tally.get();
        tally.set((admitted + run.count, total + checks));
        run.wall
    });
    let (admitted, checks) = tally.get();
    if workload == Workload::Limit && checks > 0 {
        println!(
            "{group}/{function}: {:.3}% of {checks} checks admitted",
            100.0 * admitted as f64 / checks as f64
        );
    }
}

/// A window no sample can exhaust: `u32::MAX` permits per 43 s, in the default
/// ten sub-windows (each at least `u32::MAX` ns long, as the builder needs).
fn allow_window() -> Rate {
    Rate::new(u32::MAX, Duration::from_secs(43))
}

fn deny_rate() -> Rate {
    Rate::per_hour(1)
}

fn sliding_window(c: &mut Criterion) {
    for workload in [Workload::Allow, Workload::Deny, Workload::Limit] {
        for threads in THREADS {
            let (window, bucket, quota) = match workload {
                Workload::Allow => (
                    allow_window(),
                    (u32::MAX, Rate::new(1, Duration::from_nanos(1))),
                    allow_quota(),
                ),
                Workload::Deny => (deny_rate(), (1, deny_rate()), deny_quota()),
                Workload::Limit => {
                    let (per_millisecond, rate) = limit_rate(threads);
                    (
                        Rate::new(per_millisecond, Duration::from_millis(1)),
                        (per_millisecond, rate),
                        limit_quota(threads),
                    )
                }
            };
            bench(c, workload, threads, "tollgate-sliding", || {
                tollgate_limiter(SlidingWindow::new(window).unwrap(), workload)
            });
            bench(c, workload, threads, "tollgate-sliding-cached", || {
                tollgate_limiter(
                    SlidingWindow::with_clock(window, tollgate_cached_clock()).unwrap(),
                    workload,
                )
            });
            bench(c, workload, threads, "tollgate-sliding-twin", || {
                tollgate_limiter(LockingSlidingWindow::new(window).unwrap(), workload)
            });
            bench(c, workload, threads, "tollgate-sliding-twin-cached", || {
                tollgate_limiter(
                    LockingSlidingWindow::with_clock(window, tollgate_cached_clock()).unwrap(),
                    workload,
                )
            });
            bench(c, workload, threads, "tollgate-approx", || {
                tollgate_limiter(ApproxSlidingWindow::new(window).unwrap(), workload)
            });
            bench(c, workload, threads, "tollgate-token-bucket", || {
                tollgate_limiter(TokenBucket::new(bucket.0, bucket.1).unwrap(), workload)
            });
            bench(c, workload, threads, "governor", || {
                governor_limiter(Governor::direct(quota), workload)
            });
            bench(c, workload, threads, "governor-cached", || {
                governor_limiter(
                    Governor::direct_with_clock(quota, governor_upkeep_clock()),
                    workload,
                )
            });
        }
    }
}

/// Bytes per limiter: the striped window for each stripe count (default ten
/// sub-windows), and the others for comparison.
fn print_memory() {
    let rate = Rate::per_second(1_000);
    eprintln!("memory per limiter (bytes, inline + heap, allocator overhead aside):");
    for stripes in [1, 2, 4, 8, 16, 64] {
        let window = SlidingWindow::builder(rate)
            .stripes(stripes)
            .build()
            .unwrap();
        eprintln!(
            "  SlidingWindow, S = 10, {stripes:>2} stripes: {:>6}",
            window.memory()
        );
    }
    eprintln!(
        "  LockingSlidingWindow, S = 10:        {:>6}",
        LockingSlidingWindow::new(rate).unwrap().memory()
    );
    eprintln!(
        "  ApproxSlidingWindow:                 {:>6}",
        std::mem::size_of::<ApproxSlidingWindow>()
    );
    eprintln!(
        "  TokenBucket:                         {:>6}",
        std::mem::size_of::<TokenBucket>()
    );
    eprintln!(
        "  governor direct limiter:             {:>6}",
        std::mem::size_of::<GovernorDirect<governor::clock::QuantaClock>>()
    );
}

/// Lock-step rounds on a manual clock: `threads` threads make up to `attempts`
/// single-permit requests each per round (stopping at their first denial if
/// `back_off`, as a client would on a 429), time standing still within a round.
/// Returns (permits an exact limiter would have admitted, permits denied
/// although the window had room).
fn precision(threads: usize, stripes: usize, attempts: usize, back_off: bool) -> (u64, u64) {
    const LIMIT: u32 = 10_000;
    const SUBS: u32 = 10;
    const SUB: u64 = 1_000_000;
    const ROUNDS: usize = 200;
    let clock = ManualClock::new();
    let window = Arc::new(
        SlidingWindow::builder(Rate::new(LIMIT, Duration::from_millis(10)))
            .sub_windows(SUBS)
            .stripes(stripes)
            .clock(clock.clone())
            .build()
            .unwrap(),
    );
    let start = Arc::new(Barrier::new(threads + 1));
    let end = Arc::new(Barrier::new(threads + 1));
    let workers: Vec<_> = (0..threads)
        .map(|_| {
            let (window, start, end) = (window.clone(), start.clone(), end.clone());
            thread::spawn(move || {
                let mut per_round = Vec::with_capacity(ROUNDS);
                for _ in 0..ROUNDS {
                    start.wait();
                    let mut admitted = 0u64;
                    for _ in 0..attempts {
                        match window.try_acquire() {
                            Ok(()) => admitted += 1,
                            Err(_) if back_off => break,
                            Err(_) => {}
                        }
                    }
                    per_round.push(admitted);
                    end.wait();
                }
                per_round
            })
        })
        .collect();
    // Rounds a third of a sub-window apart: three rounds share each sub-window.
    let times: Vec<u64> = (0..ROUNDS as u64).map(|r| r * SUB / 3).collect();
    for &t in &times {
        clock.set(t);
        start.wait();
        end.wait();
    }
    let per_thread: Vec<Vec<u64>> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    let mut counts = std::collections::BTreeMap::<u64, u64>::new();
    let (mut exact, mut missed) = (0, 0);
    for (round, &t) in times.iter().enumerate() {
        let j = t / SUB;
        let admitted: u64 = per_thread.iter().map(|p| p[round]).sum();
        let first = (j + 1).saturating_sub(u64::from(SUBS));
        let room = u64::from(LIMIT) - counts.range(first..=j).map(|(_, c)| c).sum::<u64>();
        let ideal = room.min((threads * attempts) as u64);
        assert!(admitted <= ideal, "over-admission in round {round}");
        exact += ideal;
        missed += ideal - admitted;
        *counts.entry(j).or_default() += admitted;
    }
    (exact, missed)
}

fn print_precision() {
    eprintln!(
        "precision: N = 10000 per 10 sub-windows, lock-step rounds, single permits \
         (denied while the window had room / admissible):"
    );
    for (threads, stripes) in [(2, 2), (4, 2), (4, 4), (8, 8)] {
        for (attempts, back_off) in [(20_000, false), (20_000, true)] {
            let (exact, missed) = precision(threads, stripes, attempts, back_off);
            let mode = if back_off { "until denied" } else { "all" };
            eprintln!(
                "  {threads} threads, {stripes} stripes, {attempts} requests/thread/round ({mode}): \
                 {missed} / {exact} ({:.4}%)",
                100.0 * missed as f64 / exact.max(1) as f64
            );
        }
    }
}

fn reports(_: &mut Criterion) {
    // Calibrates the TSC before anything is timed.
    let _ = MonotonicClock::new();
    print_memory();
    print_precision();
}

/// Sized so the whole run (48 benchmarks) takes about three minutes on 2
/// cores: the shared defaults with less warm-up and measurement. Criterion's
/// `--warm-up-time`, `--measurement-time` and `--sample-size` override it.
fn config() -> Criterion {
    common::config()
        .warm_up_time(Duration::from_millis(800))
        .measurement_time(Duration::from_secs(2))
}

criterion_group! {
    name = benches;
    config = config();
    targets = reports, sliding_window
}
criterion_main!(benches);
