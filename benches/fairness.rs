//! How the contended one-word limiters share the word between threads: total
//! throughput is what the criterion benches measure; this measures the split.
//!
//! `threads` threads call `try_acquire` in a tight loop on one token bucket of
//! one permit per nanosecond with a burst of `u32::MAX` (every check admits and
//! writes), for a fixed time, all of them running throughout. Reported per
//! limiter: total checks per second, each thread's share, and — in a second
//! run with every check timed by `Instant` (which slows the loop) — how many
//! checks took over 10 µs and the slowest one.
//!
//! The lock-free bucket backs off after a lost CAS (`AtomicCell::update`), so the
//! thread that keeps winning keeps the cache line and does more of the checks;
//! the twin's `parking_lot` mutex queues its waiters. `docs/benchmarks.md`
//! ("The 2-thread allow-heavy bound, and backing off") has a run.
//!
//! ```sh
//! cargo bench --bench fairness            # 2 s per line
//! cargo bench --bench fairness -- 0.5     # seconds per line
//! ```

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use tollgate::{LockingTokenBucket, Rate, RateLimiter, TokenBucket};

/// What one thread did.
struct Share {
    checks: u64,
    over_10us: u64,
    slowest: Duration,
}

/// Runs `threads` threads on `limiter` for `secs`, each check timed if `timed`.
fn run<L: RateLimiter + Send + Sync + 'static>(
    limiter: L,
    threads: usize,
    secs: f64,
    timed: bool,
) -> Vec<Share> {
    let limiter = Arc::new(limiter);
    let stop = Arc::new(AtomicBool::new(false));
    let start = Arc::new(Barrier::new(threads + 1));
    let workers: Vec<_> = (0..threads)
        .map(|_| {
            let (limiter, stop, start) = (limiter.clone(), stop.clone(), start.clone());
            std::thread::spawn(move || {
                let mut share = Share {
                    checks: 0,
                    over_10us: 0,
                    slowest: Duration::ZERO,
                };
                start.wait();
                while !stop.load(Ordering::Relaxed) {
                    // Batches of 64, so the stop flag is not on the measured path.
                    for _ in 0..64 {
                        if timed {
                            let began = Instant::now();
                            black_box(limiter.try_acquire().is_ok());
                            let took = began.elapsed();
                            share.slowest = share.slowest.max(took);
                            share.over_10us += u64::from(took > Duration::from_micros(10));
                        } else {
                            black_box(limiter.try_acquire().is_ok());
                        }
                    }
                    share.checks += 64;
                }
                share
            })
        })
        .collect();
    start.wait();
    std::thread::sleep(Duration::from_secs_f64(secs));
    stop.store(true, Ordering::Relaxed);
    workers
        .into_iter()
        .map(|w| w.join().expect("fairness thread panicked"))
        .collect()
}

/// A plain run and a timed one of `threads` threads, `secs` each, each on a
/// fresh limiter of `make`: the table's row `name`.
fn report<L: RateLimiter + Send + Sync + 'static>(
    name: &str,
    threads: usize,
    secs: f64,
    make: impl Fn() -> L,
) {
    let plain = run(make(), threads, secs, false);
    let timed = run(make(), threads, secs, true);
    let total: u64 = plain.iter().map(|s| s.checks).sum();
    let shares: Vec<String> = plain
        .iter()
        .map(|s| format!("{:.0}%", 100.0 * s.checks as f64 / total.max(1) as f64))
        .collect();
    let over: Vec<String> = timed.iter().map(|s| s.over_10us.to_string()).collect();
    let slowest = timed.iter().map(|s| s.slowest).max().unwrap_or_default();
    println!(
        "| {name} | {threads} | {:.1} | {} | {} | {:.2} ms |",
        total as f64 / secs / 1e6,
        shares.join(" / "),
        over.join(" / "),
        slowest.as_secs_f64() * 1e3
    );
}

fn main() {
    // `cargo bench` passes `--bench`; a number is the seconds per line.
    let secs = std::env::args()
        .skip(1)
        .find_map(|a| a.parse::<f64>().ok())
        .unwrap_or(2.0);
    let rate = Rate::new(1, Duration::from_nanos(1));
    println!(
        "| limiter | threads | M checks/s | share per thread | checks over 10 µs (timed run) | slowest check |"
    );
    println!("|---|---:|---:|---|---|---:|");
    for threads in [2, 4] {
        report("TokenBucket", threads, secs, || {
            TokenBucket::new(u32::MAX, rate).expect("valid")
        });
        report("LockingTokenBucket", threads, secs, || {
            LockingTokenBucket::new(u32::MAX, rate).expect("valid")
        });
    }
}
