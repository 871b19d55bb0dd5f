//! Leased mode against one script per decision, at the same global limit (far
//! above what the bench reaches, so both take their admitting path), on one
//! local `redis-server` this bench starts: time per decision from criterion,
//! and Redis calls per 1,000 decisions from `INFO commandstats`.
//!
//! `cargo bench -p tollgate-redis --bench leased`

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use tollgate::Rate;
use tollgate_redis::{Client, LeaseOptions, LeasedLimiter, TokenBucket};

use support::RedisServer;

fn budget() -> TokenBucket {
    TokenBucket::new(1_000_000, Rate::per_second(1_000_000)).unwrap()
}

fn bench(c: &mut Criterion) {
    let server = RedisServer::start();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let client = runtime.block_on(Client::connect(&server.url())).unwrap();
    let mut group = c.benchmark_group("global limit");
    group.throughput(Throughput::Elements(1));

    let per_decision = budget();
    let before = server.calls("evalsha");
    let mut decisions = 0u64;
    group.bench_function("one script per decision", |b| {
        b.iter(|| {
            decisions += 1;
            runtime
                .block_on(client.try_acquire(&per_decision, "per-decision"))
                .is_ok()
        })
    });
    let script_calls = server.calls("evalsha") - before;

    let mut limiter = {
        let _guard = runtime.enter();
        LeasedLimiter::start(client.clone(), budget(), "leased", LeaseOptions::new())
    };
    let mut leased_decisions = 0u64;
    let mut admitted = 0u64;
    group.bench_function("leased", |b| {
        b.iter(|| {
            leased_decisions += 1;
            if limiter.try_acquire().is_ok() {
                admitted += 1;
            }
        })
    });
    group.finish();
    let stats = runtime.block_on(limiter.shutdown());
    println!(
        "one script per decision: {:.1} Redis calls per 1,000 decisions ({script_calls} for {decisions})",
        script_calls as f64 * 1000.0 / decisions as f64
    );
    println!(
        "leased: {:.3} Redis calls per 1,000 decisions ({} for {leased_decisions}), \
         {admitted} admitted ({:.1}%), {} leases",
        stats.redis_calls as f64 * 1000.0 / leased_decisions as f64,
        stats.redis_calls,
        admitted as f64 * 100.0 / leased_decisions as f64,
        stats.leases
    );
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(20);
    targets = bench
}
criterion_main!(benches);
