//! Leased mode against one script per decision, at the same global limit
//! (burst 1,000,000, 1,000,000/s: far above what one script per decision
//! reaches, so it always takes its admitting path; the leased threads ask
//! faster than the budget refills, so the limit binds them), on one local
//! `redis-server` this bench starts, at 1 and 2 threads.
//!
//! Two passes:
//!
//! * **criterion** (`global limit/<mode>/<threads>`): time per decision, as
//!   throughput (elements/s, one element per thread per iteration). With 2
//!   threads each thread makes `iters` decisions; the time is the wall time
//!   for all of them (`iter_custom`).
//! * **a timed table** (printed after criterion, markdown): each mode and
//!   thread count runs for 2 s (`TOLLGATE_LEASED_TABLE_MS`) on a fresh key, every decision timed on its
//!   own (`Instant` before and after, into a log-linear histogram: 16
//!   sub-buckets per power of two, values within 6.25 %), giving p50/p99,
//!   plus Redis calls per 1,000 decisions (`INFO commandstats`: `evalsha` +
//!   `eval`, the server's own count) and the admitted permits against what
//!   the budget allowed over the run (burst + rate × time). The timer's own
//!   floor (an empty timed loop) is printed too: leased decisions are close
//!   to it, so their p50 is mostly the clock.
//!
//! "Threads": for leased mode, OS threads calling `try_acquire` (the refill
//! task runs on a tokio runtime with 2 workers beside them); for one script
//! per decision, tokio tasks on that runtime, one per worker, each awaiting
//! its decisions one after another.
//!
//! `cargo bench -p tollgate-redis --bench leased`

#[path = "../tests/support/mod.rs"]
mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use tollgate::Rate;
use tollgate_redis::{Client, LeaseOptions, LeasedLimiter, TokenBucket};

use support::RedisServer;

const THREADS: [usize; 2] = [1, 2];
const BURST: u32 = 1_000_000;
const RATE: u32 = 1_000_000;
/// How long each row of the timed table runs: 2 s, or
/// `TOLLGATE_LEASED_TABLE_MS`.
fn table_run() -> Duration {
    let ms = std::env::var("TOLLGATE_LEASED_TABLE_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000);
    Duration::from_millis(ms)
}

fn budget() -> TokenBucket {
    TokenBucket::new("bucket", BURST, Rate::per_second(RATE)).unwrap()
}

/// Log-linear latency histogram (ns): 16 sub-buckets per power of two.
struct Histogram {
    counts: Vec<u64>,
}

impl Histogram {
    fn new() -> Self {
        Histogram {
            counts: vec![0; 64 * 16],
        }
    }

    fn index(ns: u64) -> usize {
        if ns < 16 {
            return ns as usize;
        }
        let msb = 63 - ns.leading_zeros() as usize; // >= 4
        let sub = ((ns >> (msb - 4)) & 15) as usize;
        (msb - 3) * 16 + sub
    }

    /// The smallest value of bucket `i`.
    fn low(i: usize) -> u64 {
        if i < 16 {
            return i as u64;
        }
        let (msb, sub) = (i / 16 + 3, (i % 16) as u64);
        (16 + sub) << (msb - 4)
    }

    fn record(&mut self, ns: u64) {
        self.counts[Self::index(ns)] += 1;
    }

    fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
    }

    fn total(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// The `q` quantile, as the middle of its bucket.
    fn quantile(&self, q: f64) -> Duration {
        let rank = ((self.total() as f64) * q).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                let (low, high) = (Self::low(i), Self::low(i + 1));
                return Duration::from_nanos((low + high) / 2);
            }
        }
        Duration::ZERO
    }
}

/// Times decisions until `until`; returns the histogram and how many the
/// closure admitted.
fn timed(until: Instant, mut decide: impl FnMut() -> bool) -> (Histogram, u64) {
    let mut histogram = Histogram::new();
    let mut admitted = 0;
    let mut before = Instant::now();
    while before < until {
        if decide() {
            admitted += 1;
        }
        let after = Instant::now();
        histogram.record(after.duration_since(before).as_nanos() as u64);
        before = after;
    }
    (histogram, admitted)
}

/// 3 significant figures: "90 ns", "54.3 µs", "1.61 ms".
fn short(d: Duration) -> String {
    let ns = d.as_nanos() as f64;
    match ns {
        ns if ns < 1e3 => format!("{ns:.0} ns"),
        ns if ns < 1e4 => format!("{:.2} µs", ns / 1e3),
        ns if ns < 1e5 => format!("{:.1} µs", ns / 1e3),
        ns if ns < 1e6 => format!("{:.0} µs", ns / 1e3),
        ns => format!("{:.2} ms", ns / 1e6),
    }
}

/// 4102192.3 → "4.10 M", 10393.1 → "10.4 k".
fn per_second(rate: f64) -> String {
    if rate >= 1e6 {
        format!("{:.2} M", rate / 1e6)
    } else if rate >= 1e3 {
        format!("{:.1} k", rate / 1e3)
    } else {
        format!("{rate:.0}")
    }
}

/// One row of the timed table.
struct Row {
    mode: &'static str,
    threads: usize,
    histogram: Histogram,
    admitted: u64,
    wall: Duration,
    calls: u64,
}

fn script_calls(server: &RedisServer) -> u64 {
    server.script_calls()
}

/// `threads` tokio tasks, each making `iters` decisions in turn.
async fn per_decision(client: &Client, bucket: &Arc<TokenBucket>, threads: usize, iters: u64) {
    let tasks: Vec<_> = (0..threads)
        .map(|_| {
            let (client, bucket) = (client.clone(), bucket.clone());
            tokio::spawn(async move {
                for _ in 0..iters {
                    let _ = client.try_acquire(&*bucket, "per-decision").await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
}

/// `threads` OS threads, each making `iters` decisions.
fn leased(limiter: &LeasedLimiter, threads: usize, iters: u64) -> Duration {
    let start = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                for _ in 0..iters {
                    std::hint::black_box(limiter.try_acquire().is_ok());
                }
            });
        }
    });
    start.elapsed()
}

fn bench(c: &mut Criterion) {
    let server = RedisServer::start();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let client = runtime.block_on(Client::connect(&server.url())).unwrap();
    let mut group = c.benchmark_group("global limit");
    for threads in THREADS {
        group.throughput(Throughput::Elements(threads as u64));
        let bucket = Arc::new(budget());
        group.bench_function(BenchmarkId::new("one script per decision", threads), |b| {
            b.iter_custom(|iters| {
                let start = Instant::now();
                runtime.block_on(per_decision(&client, &bucket, threads, iters));
                start.elapsed()
            })
        });
        let mut limiter = {
            let _inside = runtime.enter();
            let key = format!("leased-{threads}");
            LeasedLimiter::start(client.clone(), budget(), &key, LeaseOptions::new())
        };
        group.bench_function(BenchmarkId::new("leased", threads), |b| {
            b.iter_custom(|iters| leased(&limiter, threads, iters))
        });
        runtime.block_on(limiter.shutdown());
    }
    group.finish();

    table(&server, &runtime, &client);
}

/// The timed table: p50/p99, Redis calls per 1,000 decisions, admitted vs
/// the budget.
fn table(server: &RedisServer, runtime: &tokio::runtime::Runtime, client: &Client) {
    let floor = timed(Instant::now() + Duration::from_millis(500), || true).0;
    let mut rows = Vec::new();
    for threads in THREADS {
        // One script per decision: tasks on the runtime, each timing its own.
        let key = format!("table-per-decision-{threads}");
        let bucket = Arc::new(budget());
        let calls = script_calls(server);
        let start = Instant::now();
        let until = start + table_run();
        let results = runtime.block_on(async {
            let tasks: Vec<_> = (0..threads)
                .map(|_| {
                    let (client, bucket, key) = (client.clone(), bucket.clone(), key.clone());
                    tokio::spawn(async move {
                        let mut histogram = Histogram::new();
                        let mut admitted = 0u64;
                        while Instant::now() < until {
                            let before = Instant::now();
                            if client.try_acquire(&*bucket, &key).await.is_ok() {
                                admitted += 1;
                            }
                            histogram.record(before.elapsed().as_nanos() as u64);
                        }
                        (histogram, admitted)
                    })
                })
                .collect();
            let mut results = Vec::new();
            for task in tasks {
                results.push(task.await.unwrap());
            }
            results
        });
        rows.push(row(
            "one script per decision",
            threads,
            results,
            start.elapsed(),
            script_calls(server) - calls,
        ));

        // Leased: OS threads.
        let key = format!("table-leased-{threads}");
        let calls = script_calls(server);
        let start = Instant::now();
        let mut limiter = {
            let _inside = runtime.enter();
            LeasedLimiter::start(client.clone(), budget(), &key, LeaseOptions::new())
        };
        let until = start + table_run();
        let results = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..threads)
                .map(|_| scope.spawn(|| timed(until, || limiter.try_acquire().is_ok())))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap())
                .collect::<Vec<_>>()
        });
        let wall = start.elapsed();
        runtime.block_on(limiter.shutdown());
        rows.push(row(
            "leased",
            threads,
            results,
            wall,
            script_calls(server) - calls,
        ));
    }

    println!(
        "\ntimer floor (an empty timed loop): p50 {}, p99 {}",
        short(floor.quantile(0.5)),
        short(floor.quantile(0.99))
    );
    println!(
        "\n| mode | threads | decisions/s (timed pass) | p50 | p99 | Redis calls per 1,000 decisions | \
         admitted / budget allowed |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for r in &rows {
        let decisions = r.histogram.total();
        let allowed = u64::from(BURST) + (r.wall.as_secs_f64() * f64::from(RATE)) as u64;
        println!(
            "| {} | {} | {} | {} | {} | {:.3} | {} / {} ({:.1} %) |",
            r.mode,
            r.threads,
            per_second(decisions as f64 / r.wall.as_secs_f64()),
            short(r.histogram.quantile(0.5)),
            short(r.histogram.quantile(0.99)),
            r.calls as f64 * 1000.0 / decisions as f64,
            r.admitted,
            allowed,
            r.admitted as f64 * 100.0 / allowed as f64,
        );
        assert!(
            r.admitted <= allowed,
            "over-admission: {} > {allowed}",
            r.admitted
        );
    }
}

fn row(
    mode: &'static str,
    threads: usize,
    results: Vec<(Histogram, u64)>,
    wall: Duration,
    calls: u64,
) -> Row {
    let mut histogram = Histogram::new();
    let mut admitted = 0;
    for (h, a) in &results {
        histogram.merge(h);
        admitted += a;
    }
    Row {
        mode,
        threads,
        histogram,
        admitted,
        wall,
        calls,
    }
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
