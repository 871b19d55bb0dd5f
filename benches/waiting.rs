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
//! The token bucket and the leaky bucket meter book through the same code on
//! the same kind of word; both run against their twins.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use tollgate::{
    LeakyBucket, LockingLeakyBucket, LockingShaper, LockingTokenBucket, LockingWarmUp, Rate,
    Reserve, Shaper, TokenBucket, WarmUp,
};

mod common;
use common::THREADS;

/// One permit per nanosecond: faster than any number of threads can book.
fn fast() -> Rate {
    Rate::new(1, Duration::from_nanos(1))
}

/// Runs `iters` reservations of one permit on each of `threads` threads sharing
/// `limiter`; returns the wall time from the first start to the last end, after
/// asserting that every reservation was granted.
fn run<L: Reserve + Send + Sync + 'static>(limiter: L, threads: usize, iters: u64) -> Duration {
    let limiter = Arc::new(limiter);
    let run = common::run_threads(threads, false, |_| {
        let limiter = Arc::clone(&limiter);
        move || {
            let mut granted = 0u64;
            for _ in 0..iters {
                if let Ok(r) = limiter.reserve(1) {
                    let _ = black_box(r);
                    granted += 1;
                }
            }
            granted
        }
    });
    assert_eq!(
        run.count,
        iters * threads as u64,
        "every reservation is granted"
    );
    run.wall
}

fn bench<L: Reserve + Send + Sync + 'static>(
    c: &mut Criterion,
    limiter: &str,
    threads: usize,
    function: &str,
    make: impl Fn() -> L,
) {
    let group = format!("{limiter}/reserve/{threads}t");
    common::bench_threads(c, &group, function, threads, |iters| {
        run(make(), threads, iters)
    });
}

/// `limiter`'s atomic design and its locking twin, at each thread count.
fn atomic_and_twin<A, B>(
    c: &mut Criterion,
    limiter: &str,
    atomic: impl Fn() -> A,
    twin: impl Fn() -> B,
) where
    A: Reserve + Send + Sync + 'static,
    B: Reserve + Send + Sync + 'static,
{
    for threads in THREADS {
        bench(c, limiter, threads, "tollgate-atomic", &atomic);
        bench(c, limiter, threads, "tollgate-twin", &twin);
    }
}

fn shaper(c: &mut Criterion) {
    // A burst of 2^30 (a second of backlog at this rate) absorbs clock staleness
    // between threads, so every start is "now".
    let (burst, wait) = (1 << 30, Duration::ZERO);
    atomic_and_twin(
        c,
        "shaper",
        || Shaper::new(fast(), burst, wait).unwrap(),
        || LockingShaper::new(fast(), burst, wait).unwrap(),
    );
}

/// Reservations queue: one start per microsecond, any wait allowed, so every
/// booking lands behind the previous one (the schedule runs ahead of the clock,
/// as when many waiters sleep on one limiter).
fn shaper_queueing(c: &mut Criterion) {
    let (rate, wait) = (
        Rate::new(1, Duration::from_micros(1)),
        Duration::from_secs(1 << 30),
    );
    atomic_and_twin(
        c,
        "shaper-queueing",
        || Shaper::new(rate, 0, wait).unwrap(),
        || LockingShaper::new(rate, 0, wait).unwrap(),
    );
}

fn warm_up(c: &mut Criterion) {
    // Warms up over a microsecond, then books at the stable nanosecond; a
    // reservation always starts at once because the threads cannot keep up.
    let period = Duration::from_micros(1);
    atomic_and_twin(
        c,
        "warm_up",
        || WarmUp::new(fast(), period).unwrap(),
        || LockingWarmUp::new(fast(), period).unwrap(),
    );
}

fn leaky_bucket(c: &mut Criterion) {
    atomic_and_twin(
        c,
        "leaky_bucket",
        || LeakyBucket::new(u32::MAX, fast()).unwrap(),
        || LockingLeakyBucket::new(u32::MAX, fast()).unwrap(),
    );
}

fn token_bucket(c: &mut Criterion) {
    atomic_and_twin(
        c,
        "token_bucket",
        || TokenBucket::new(u32::MAX, fast()).unwrap(),
        || LockingTokenBucket::new(u32::MAX, fast()).unwrap(),
    );
}

criterion_group! {
    name = benches;
    config = common::config();
    targets = leaky_bucket, shaper, shaper_queueing, warm_up, token_bucket
}
criterion_main!(benches);
