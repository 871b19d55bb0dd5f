//! Decisions per second and latency (p50/p99) of each Redis limiter at 1, 8 and
//! 64 concurrent tasks, against one local `redis-server` this bench starts,
//! beside the multi-round-trip designs the articles in `docs/references.md`
//! describe (a counter with INCR then EXPIRE; a token bucket read, computed on the
//! client and written back, here made safe with WATCH/GET/MULTI/SET/EXEC), the
//! list-based sliding log of "Redis realizes dynamic rate control", and the
//! in-process token bucket.
//!
//! Criterion reports the time per decision (throughput, elements/s); the same
//! runs record every decision's latency, and the table at the end (markdown,
//! as in docs/distributed.md) gives decisions/s, p50 and p99 per design.
//!
//! `cargo bench -p tollgate-redis --bench redis` (`TOLLGATE_BENCH_SCRIPTS=1`:
//! every script call an `EVALSHA`, as on Redis 6.2)

#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use tollgate::{Rate, RateLimiter};
use tollgate_redis::{
    ApproxSlidingWindow, Ask, Client, FixedWindow, Limiter, Options, SlidingLog, TokenBucket,
};

use support::RedisServer;

const CONCURRENCY: [usize; 3] = [1, 8, 64];
const KEYS: usize = 1000;

/// Latencies (ns) and wall time per (design, tasks), across criterion's samples.
#[derive(Default)]
struct Tally {
    latencies: Vec<u64>,
    decisions: u64,
    wall: Duration,
    /// The server's own time in the calls the design makes (`INFO
    /// commandstats`: FCALL, INCR(BY), EXPIRE; a script's inner commands are
    /// inside its FCALL), and the calls.
    server_us: u64,
    calls: u64,
}

/// A table row: the design's place in the list, its name, the task count.
type Row = (usize, String, usize);

static TALLIES: LazyLock<Mutex<BTreeMap<Row, Tally>>> =
    LazyLock::new(|| Mutex::new(BTreeMap::new()));

/// One way to decide.
#[derive(Clone)]
enum Design {
    Ours(Client, Arc<dyn Limiter>),
    /// Every decision on one of 4 keys: the hot keys of a shared limit.
    Hot(Client, Arc<dyn Limiter>),
    /// Two limits of one request, all or nothing, in one call.
    All(Client, Arc<dyn Limiter>, Arc<dyn Limiter>),
    /// Two limits asked one after the other.
    Both(Client, Arc<dyn Limiter>, Arc<dyn Limiter>),
    /// INCR and EXPIRE for each of `n` counters, in one pipeline.
    IncrExpirePipelined(MultiplexedConnection, usize),
    ListLog(MultiplexedConnection),
    IncrExpire(MultiplexedConnection),
    /// One connection per task: WATCH is per connection.
    MultiExec(redis::Client),
    InProcess(Arc<tollgate::TokenBucket>),
}

static LIST_LOG: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("list_log.lua")));

/// Limits far above what the bench reaches: the write path, every time.
fn rate() -> Rate {
    Rate::per_second(1_000_000)
}

impl Design {
    async fn task(&self, task: usize, decisions: u64, latencies: &mut Vec<u64>) {
        let mut watched = match self {
            Design::MultiExec(client) => {
                Some(client.get_multiplexed_async_connection().await.unwrap())
            }
            _ => None,
        };
        for i in 0..decisions {
            let key = format!("bench:{}", (task * 7919 + i as usize) % KEYS);
            let started = Instant::now();
            match self {
                Design::Ours(client, limiter) => {
                    let _ = client.try_acquire(&**limiter, &key).await;
                }
                Design::Hot(client, limiter) => {
                    let _ = client
                        .try_acquire(&**limiter, &format!("hot:{}", i % 4))
                        .await;
                }
                Design::All(client, first, second) => {
                    let asks = [Ask::new(&**first, &key), Ask::new(&**second, &key)];
                    let _ = client.try_acquire_all(&asks).await;
                }
                Design::Both(client, first, second) => {
                    if client.try_acquire(&**first, &key).await.is_ok() {
                        let _ = client.try_acquire(&**second, &key).await;
                    }
                }
                Design::IncrExpirePipelined(connection, counters) => {
                    let mut pipe = redis::pipe();
                    for counter in 0..*counters {
                        let window = format!("incr{counter}:{key}:{}", unix_seconds());
                        pipe.incr(&window, 1).expire(&window, 1).ignore();
                    }
                    let _: Vec<u64> = pipe.query_async(&mut connection.clone()).await.unwrap();
                }
                Design::ListLog(connection) => {
                    let _: redis::Value = LIST_LOG
                        .key(format!("list:{{{key}}}"))
                        .arg(1)
                        .arg(1_000_000)
                        .arg(1_000_000)
                        .invoke_async(&mut connection.clone())
                        .await
                        .unwrap();
                }
                Design::IncrExpire(connection) => {
                    // The articles' fixed window: INCR, then EXPIRE when the
                    // count is new — two round trips, and a key without TTL if
                    // the client dies in between.
                    let mut connection = connection.clone();
                    let window = format!("incr:{key}:{}", unix_seconds());
                    let count: u64 = connection.incr(&window, 1).await.unwrap();
                    if count == 1 {
                        let _: () = connection.expire(&window, 1).await.unwrap();
                    }
                }
                Design::MultiExec(_) => {
                    multi_exec_bucket(watched.as_mut().unwrap(), &key).await;
                }
                Design::InProcess(bucket) => {
                    let _ = bucket.try_acquire();
                }
            }
            latencies.push(started.elapsed().as_nanos() as u64);
        }
    }
}

fn unix_seconds() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// The articles' read-compute-write token bucket made atomic as an afterthought: WATCH, GET the
/// state, compute on the client's clock, MULTI/SET/EXEC; retry when another
/// client changed the key in between.
async fn multi_exec_bucket(connection: &mut MultiplexedConnection, key: &str) {
    let key = format!("multi:{key}");
    loop {
        let _: () = redis::cmd("WATCH")
            .arg(&key)
            .query_async(connection)
            .await
            .unwrap();
        let state: Option<String> = connection.get(&key).await.unwrap();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_micros() as u64;
        let (tokens, at) = state
            .and_then(|s| {
                let (tokens, at) = s.split_once(':')?;
                Some((tokens.parse::<u64>().ok()?, at.parse::<u64>().ok()?))
            })
            .unwrap_or((1_000_000, now));
        let tokens = (tokens + now.saturating_sub(at)).min(1_000_000);
        let next = format!("{}:{now}", tokens.saturating_sub(1));
        let done: Option<()> = redis::pipe()
            .atomic()
            .set_ex(&key, next, 2)
            .ignore()
            .query_async(connection)
            .await
            .unwrap();
        if done.is_some() {
            return;
        }
    }
}

fn designs(runtime: &tokio::runtime::Runtime, server: &RedisServer) -> Vec<(String, Design)> {
    let url = server.url();
    runtime.block_on(async {
        let client = Client::connect(&url).await.unwrap();
        let unbatched = Client::connect_with(&url, Options::new().max_batch(1))
            .await
            .unwrap();
        let bucket = || -> Arc<dyn Limiter> {
            Arc::new(TokenBucket::new("bucket", 1_000_000, rate()).unwrap())
        };
        let daily = || -> Arc<dyn Limiter> { Arc::new(FixedWindow::new("daily", rate()).unwrap()) };
        let plain = redis::Client::open(url.as_str()).unwrap();
        let connection = plain.get_multiplexed_async_connection().await.unwrap();
        let ours = |limiter: Arc<dyn Limiter>| Design::Ours(client.clone(), limiter);
        vec![
            (
                "TokenBucket (GCRA)".to_owned(),
                ours(Arc::new(
                    TokenBucket::new("bucket", 1_000_000, rate()).unwrap(),
                )),
            ),
            (
                "TokenBucket, one call per decision (max_batch 1)".to_owned(),
                Design::Ours(unbatched.clone(), bucket()),
            ),
            (
                "TokenBucket, 4 hot keys".to_owned(),
                Design::Hot(client.clone(), bucket()),
            ),
            (
                "TokenBucket, 4 hot keys, one call per decision".to_owned(),
                Design::Hot(unbatched.clone(), bucket()),
            ),
            (
                "FixedWindow".to_owned(),
                ours(Arc::new(FixedWindow::new("window", rate()).unwrap())),
            ),
            (
                "ApproxSlidingWindow (counter)".to_owned(),
                ours(Arc::new(
                    ApproxSlidingWindow::new("approx", Rate::per_second(1_000)).unwrap(),
                )),
            ),
            (
                "SlidingLog, N = 100 (sorted set)".to_owned(),
                ours(Arc::new(
                    SlidingLog::new("log", Rate::per_second(100)).unwrap(),
                )),
            ),
            (
                "SlidingLog, N = 100 (list, bench only)".to_owned(),
                Design::ListLog(connection.clone()),
            ),
            (
                "INCR + EXPIRE (bench only)".to_owned(),
                Design::IncrExpire(connection.clone()),
            ),
            (
                "INCR + EXPIRE, one pipeline (bench only)".to_owned(),
                Design::IncrExpirePipelined(connection.clone(), 1),
            ),
            (
                "two limits, one call (try_acquire_all)".to_owned(),
                Design::All(client.clone(), bucket(), daily()),
            ),
            (
                "two limits, one call each (2 × try_acquire)".to_owned(),
                Design::Both(client.clone(), bucket(), daily()),
            ),
            (
                "two limits, one call each, unbatched".to_owned(),
                Design::Both(unbatched.clone(), bucket(), daily()),
            ),
            (
                "2 × (INCR + EXPIRE), one pipeline (bench only)".to_owned(),
                Design::IncrExpirePipelined(connection.clone(), 2),
            ),
            (
                "WATCH/GET/MULTI/SET/EXEC (bench only)".to_owned(),
                Design::MultiExec(plain.clone()),
            ),
            (
                "in-process TokenBucket".to_owned(),
                Design::InProcess(Arc::new(
                    tollgate::TokenBucket::new(1_000_000, rate()).unwrap(),
                )),
            ),
        ]
    })
}

fn bench(c: &mut Criterion) {
    // `TOLLGATE_BENCH_SCRIPTS=1`: a server that answers FCALL as an unknown
    // command (as Redis 6.2 does), so every call is an EVALSHA: the scripts'
    // figures beside the Function library's, on one binary.
    let scripts_only = std::env::var_os("TOLLGATE_BENCH_SCRIPTS").is_some();
    let server = if scripts_only {
        RedisServer::start_with(&["--rename-command", "FCALL", ""])
    } else {
        RedisServer::start()
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let designs = designs(&runtime, &server);
    for tasks in CONCURRENCY {
        let mut group = c.benchmark_group(format!("redis/{tasks} tasks"));
        group.throughput(Throughput::Elements(1));
        for (order, (name, design)) in designs.iter().enumerate() {
            group.bench_function(name.as_str(), |b| {
                b.iter_custom(|iters| {
                    let per_task = iters.div_ceil(tasks as u64);
                    let _: () = server.cmd(&["CONFIG", "RESETSTAT"]);
                    let started = Instant::now();
                    let latencies = runtime.block_on(async {
                        let handles: Vec<_> = (0..tasks)
                            .map(|task| {
                                let design = design.clone();
                                tokio::spawn(async move {
                                    let mut latencies = Vec::with_capacity(per_task as usize);
                                    design.task(task, per_task, &mut latencies).await;
                                    latencies
                                })
                            })
                            .collect();
                        support::joined(handles).await
                    });
                    let wall = started.elapsed();
                    let (server_us, calls) = server_time(&server);
                    let mut tallies = TALLIES.lock().unwrap();
                    let tally = tallies.entry((order, name.clone(), tasks)).or_default();
                    tally.server_us += server_us;
                    tally.calls += calls;
                    tally.decisions += latencies.len() as u64;
                    tally.latencies.extend(latencies);
                    tally.wall += wall;
                    // Per decision, as criterion expects for `iters`.
                    wall.mul_f64(iters as f64 / (per_task * tasks as u64) as f64)
                })
            });
        }
        group.finish();
    }
    print_table(&server);
}

/// The server's µs in top-level calls since the last reset, and the calls.
fn server_time(server: &RedisServer) -> (u64, u64) {
    let stats: String = server.cmd(&["INFO", "commandstats"]);
    let (mut usec, mut calls) = (0, 0);
    for line in stats.lines() {
        let Some((command, fields)) = line
            .strip_prefix("cmdstat_")
            .and_then(|l| l.split_once(':'))
        else {
            continue;
        };
        if !matches!(command, "fcall" | "evalsha" | "incr" | "incrby" | "expire") {
            continue;
        }
        for field in fields.split(',') {
            match field.split_once('=') {
                Some(("usec", v)) => usec += v.parse::<u64>().unwrap_or(0),
                Some(("calls", v)) => calls += v.parse::<u64>().unwrap_or(0),
                _ => {}
            }
        }
    }
    (usec, calls)
}

fn print_table(server: &RedisServer) {
    let version: String = server.cmd(&["INFO", "server"]);
    let version = version
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .unwrap_or("?")
        .trim()
        .to_owned();
    let form = if std::env::var_os("TOLLGATE_BENCH_SCRIPTS").is_some() {
        "EVALSHA (FCALL renamed away)"
    } else {
        "FCALL"
    };
    println!(
        "\nRedis {version}, one local server, scripts by {form}; decisions/s and latency per decision\n"
    );
    println!(
        "| design | tasks | decisions/s | p50 | p99 | server µs per decision | calls per decision |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    let mut tallies = TALLIES.lock().unwrap();
    let mut rows: Vec<_> = tallies.iter_mut().collect();
    rows.sort_by_key(|((order, _, tasks), _)| (*order, *tasks));
    for ((_, name, tasks), tally) in rows {
        tally.latencies.sort_unstable();
        let at = |q: f64| {
            let i = ((tally.latencies.len() as f64 * q) as usize).min(tally.latencies.len() - 1);
            Duration::from_nanos(tally.latencies[i])
        };
        let per = |v: u64| v as f64 / tally.decisions.max(1) as f64;
        println!(
            "| {name} | {tasks} | {:.0} | {:.1?} | {:.1?} | {:.2} | {:.3} |",
            tally.decisions as f64 / tally.wall.as_secs_f64(),
            at(0.50),
            at(0.99),
            per(tally.server_us),
            per(tally.calls),
        );
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .sample_size(10);
    targets = bench
}
criterion_main!(benches);
