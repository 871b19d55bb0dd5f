//! The reserve path — what `acquire`, `acquire_timeout` and `acquire_async`
//! do before they sleep — of the lock-free limiters against their locking twins,
//! in one run, at 1, 2 and 4 threads.
//!
//! Every reservation succeeds and writes: the limiters are configured so fast
//! (one permit per nanosecond, a deep burst) that no start is ever in the future,
//! and the harness asserts that every reservation was granted. So the numbers
//! are the cost of booking — one clock read, the decision, one CAS (or the
//! mutex) — not of sleeping.
//!
//! Groups are `<limiter>/reserve/<threads>t` (`shaper/reserve/2t`), functions
//! `tollgate-atomic` and `tollgate-twin`. One criterion iteration is one
//! reservation on each of the `threads` threads, timed from the first thread's
//! start to the last thread's end, so elements/s (`Throughput::Elements(threads)`)
//! is total reservations per second. The machine these numbers come from has 2
//! cores: 4 threads oversubscribe it and show what preemption does to a lock
//! holder.
//!
//! `LockingTokenBucket` has no reservations yet, so the token bucket's atomic
//! reserve path runs alone; the leaky bucket meter's reservations are the same
//! code on the same kind of word, against a twin.

use std::hint::black_box;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use tollgate::{
    LeakyBucket, LockingLeakyBucket, LockingShaper, LockingWarmUp, Rate, Reserve, Shaper,
    TokenBucket, WarmUp,
};

const THREADS: [usize; 3] = [1, 2, 4];

/// One permit per nanosecond: faster than any number of threads can book.
fn fast() -> Rate {
    Rate::new(1, Duration::from_nanos(1))
}

/// Runs `iters` reservations of one permit on each of `threads` threads sharing
/// `limiter`; returns the wall time from the first start to the last end, after
/// asserting that every reservation was granted.
fn run<L: Reserve + Send + Sync + 'static>(limiter: L, threads: usize, iters: u64) -> Duration {
    let limiter = Arc::new(limiter);
    let barrier = Arc::new(Barrier::new(threads));
    let workers: Vec<_> = (0..threads)
        .map(|_| {
            let (limiter, barrier) = (Arc::clone(&limiter), Arc::clone(&barrier));
            thread::spawn(move || {
                barrier.wait();
                let start = Instant::now();
                let mut granted = 0u64;
                for _ in 0..iters {
                    if let Ok(r) = limiter.reserve(1) {
                        let _ = black_box(r);
                        granted += 1;
                    }
                }
                (start, Instant::now(), granted)
            })
        })
        .collect();
    let (mut first, mut last, mut granted) = (None::<Instant>, None::<Instant>, 0);
    for worker in workers {
        let (start, end, n) = worker.join().expect("bench thread panicked");
        first = Some(first.map_or(start, |f| f.min(start)));
        last = Some(last.map_or(end, |l| l.max(end)));
        granted += n;
    }
    assert_eq!(
        granted,
        iters * threads as u64,
        "every reservation is granted"
    );
    match (first, last) {
        (Some(start), Some(end)) => end.saturating_duration_since(start),
        _ => Duration::ZERO,
    }
}

fn bench<L: Reserve + Send + Sync + 'static>(
    c: &mut Criterion,
    limiter: &str,
    threads: usize,
    function: &str,
    make: impl Fn() -> L,
) {
    let mut group = c.benchmark_group(format!("{limiter}/reserve/{threads}t"));
    group.throughput(Throughput::Elements(threads as u64));
    group.bench_function(function, |b| {
        b.iter_custom(|iters| run(make(), threads, iters))
    });
    group.finish();
}

fn shaper(c: &mut Criterion) {
    // A burst of 2^30 (a second of backlog at this rate) absorbs clock staleness
    // between threads, so every start is "now".
    let (burst, wait) = (1 << 30, Duration::ZERO);
    for threads in THREADS {
        bench(c, "shaper", threads, "tollgate-atomic", || {
            Shaper::new(fast(), burst, wait).unwrap()
        });
        bench(c, "shaper", threads, "tollgate-twin", || {
            LockingShaper::new(fast(), burst, wait).unwrap()
        });
    }
}

/// Reservations queue: one start per microsecond, any wait allowed, so every
/// booking lands behind the previous one (the schedule runs ahead of the clock,
/// as when many waiters sleep on one limiter).
fn shaper_queueing(c: &mut Criterion) {
    let (rate, wait) = (
        Rate::new(1, Duration::from_micros(1)),
        Duration::from_secs(1 << 30),
    );
    for threads in THREADS {
        bench(c, "shaper-queueing", threads, "tollgate-atomic", || {
            Shaper::new(rate, 0, wait).unwrap()
        });
        bench(c, "shaper-queueing", threads, "tollgate-twin", || {
            LockingShaper::new(rate, 0, wait).unwrap()
        });
    }
}

fn warm_up(c: &mut Criterion) {
    // Warms up over a microsecond, then books at the stable nanosecond; a
    // reservation always starts at once because the threads cannot keep up.
    let period = Duration::from_micros(1);
    for threads in THREADS {
        bench(c, "warm_up", threads, "tollgate-atomic", || {
            WarmUp::new(fast(), period).unwrap()
        });
        bench(c, "warm_up", threads, "tollgate-twin", || {
            LockingWarmUp::new(fast(), period).unwrap()
        });
    }
}

fn leaky_bucket(c: &mut Criterion) {
    for threads in THREADS {
        bench(c, "leaky_bucket", threads, "tollgate-atomic", || {
            LeakyBucket::new(u32::MAX, fast()).unwrap()
        });
        bench(c, "leaky_bucket", threads, "tollgate-twin", || {
            LockingLeakyBucket::new(u32::MAX, fast()).unwrap()
        });
    }
}

fn token_bucket(c: &mut Criterion) {
    for threads in THREADS {
        bench(c, "token_bucket", threads, "tollgate-atomic", || {
            TokenBucket::new(u32::MAX, fast()).unwrap()
        });
    }
}

/// Defaults sized for a short run; criterion's `--warm-up-time`,
/// `--measurement-time` and `--sample-size` override them.
fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(20)
}

criterion_group! {
    name = benches;
    config = config();
    targets = leaky_bucket, shaper, shaper_queueing, warm_up, token_bucket
}
criterion_main!(benches);
