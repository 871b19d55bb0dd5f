//! What it costs to create a limiter: services that create one per key (per
//! user, per IP) on first sight pay this on the request path.
//!
//! Each function creates one limiter on its default clock and drops it, so the
//! time includes the allocation and the free. `clock/monotonic-new` is the
//! default clock alone; governor's direct limiter is beside them for scale.
//! The two `os/` functions are what every construction paid before tollgate
//! asked them once per process: quanta's CPUID probe and the OS's CPU count.
//!
//! ```sh
//! cargo bench --bench construction
//! ```

use std::hint::black_box;
use std::num::NonZeroU32;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};

mod common;
use tollgate::{
    FixedWindow, LeakyBucket, MonotonicClock, Rate, SlidingLog, SlidingWindow, TokenBucket,
};

fn construction(c: &mut Criterion) {
    let mut group = c.benchmark_group("construction");
    let rate = Rate::per_minute(100);
    group.bench_function("clock/monotonic-new", |b| {
        b.iter(|| black_box(MonotonicClock::new()))
    });
    group.bench_function("os/quanta-clock-new", |b| {
        b.iter(|| black_box(quanta::Clock::new()))
    });
    group.bench_function("os/available-parallelism", |b| {
        b.iter(|| black_box(std::thread::available_parallelism()))
    });
    group.bench_function("token_bucket", |b| {
        b.iter(|| black_box(TokenBucket::new(black_box(20), rate).unwrap()))
    });
    group.bench_function("fixed_window", |b| {
        b.iter(|| black_box(FixedWindow::new(black_box(rate)).unwrap()))
    });
    group.bench_function("leaky_bucket", |b| {
        b.iter(|| black_box(LeakyBucket::new(black_box(20), rate).unwrap()))
    });
    group.bench_function("sliding_log", |b| {
        b.iter(|| black_box(SlidingLog::new(black_box(rate)).unwrap()))
    });
    group.bench_function("sliding_window", |b| {
        b.iter(|| black_box(SlidingWindow::new(black_box(rate)).unwrap()))
    });
    group.bench_function("governor/direct", |b| {
        let quota = governor::Quota::per_minute(NonZeroU32::new(100).unwrap());
        b.iter(|| black_box(governor::RateLimiter::direct(black_box(quota))))
    });
    group.finish();
}

/// The shared defaults with less warm-up and measurement: each function is
/// a single allocation and free, timed on one thread.
fn config() -> Criterion {
    common::config()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
}

criterion_group! {
    name = benches;
    config = config();
    targets = construction
}
criterion_main!(benches);
