//! Requests per second of the rate limit service over gRPC on loopback,
//! against an empty tonic service that answers the same response without
//! deciding anything: what the limiter costs beside gRPC's own cost.
//!
//! One process: each server on a tokio runtime of its own (2 workers), the
//! client on another (2 workers) with `STREAMS` calls in flight over one
//! HTTP/2 connection. The tollgate servers are served as the binary serves
//! them: their in-flight bound off (`unbounded`), at its default (`default`:
//! 1,024 calls), and `adaptive` (a bound that follows round-trip times;
//! calls past it are shed with `UNAVAILABLE`, counted apart: `shed` is the
//! share of its calls shed, and only decisions count as requests/s). Rounds
//! rotate between the servers (paired), each round a fixed time; the table
//! shows each server's median round and its ratio to the empty service's,
//! for three regimes:
//!
//! * `allow`: every request admitted (a key per stream, a limit no stream
//!   reaches);
//! * `deny`: every request refused (a limit of 1 per day, spent at once);
//! * `at-limit`: one key shared by every stream, its limit about the rate
//!   the server answers, so admissions and refusals interleave.
//!
//! A second table compares the backends on token-bucket limits, same
//! regimes, same client: `memory` (default bound), `redis` (one script call
//! per request to a `redis-server` the bench starts on loopback) and
//! `leased` (every token bucket leased; a request spends from the pool and
//! calls Redis only for a lease). Skipped when `redis-server` is missing.
//!
//! Run: `cargo bench -p tollgate-server --bench server` (env `STREAMS`,
//! `ROUNDS`, `ROUND_MS` to change the shape).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::net::TcpListener;
use tollgate_server::config::Config;
use tollgate_server::proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use tollgate_server::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use tollgate_server::proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tollgate_server::proto::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use tollgate_server::proto::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tollgate_server::{Failure, InFlight, Leasing, Options, RedisSettings, Server};
use tonic::transport::Channel;

#[allow(dead_code)]
#[path = "../../tollgate-redis/tests/support/server.rs"]
mod redis_server;

const CONFIG: &str = "
domain: bench
descriptors:
  - key: allow
    rate_limit: { unit: second, requests_per_unit: 1000000000 }
  - key: deny
    rate_limit: { unit: day, requests_per_unit: 1 }
  - key: at_limit
    rate_limit: { unit: second, requests_per_unit: 8000, algorithm: token_bucket, burst: 100 }
";

/// The same regimes as token buckets, which the leased backend can lease
/// (Redis rates stop at 1,000,000 a second).
const BUCKETS: &str = "
domain: bench
descriptors:
  - key: allow
    rate_limit: { unit: second, requests_per_unit: 1000000, algorithm: token_bucket, burst: 1000000 }
  - key: deny
    rate_limit: { unit: day, requests_per_unit: 1, algorithm: token_bucket, burst: 1 }
  - key: at_limit
    rate_limit: { unit: second, requests_per_unit: 8000, algorithm: token_bucket, burst: 100 }
";

/// A service that decides nothing: it answers every request with the
/// response the limiter gave the regime's first request.
#[derive(Clone)]
struct Empty(Arc<RateLimitResponse>);

#[tonic::async_trait]
impl RateLimitService for Empty {
    async fn should_rate_limit(
        &self,
        _: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        Ok(tonic::Response::new((*self.0).clone()))
    }
}

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A multi-threaded runtime of two workers: each server's, and the
/// clients'.
fn two_workers() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Serves a tollgate server as the binary does ([`tollgate_server::serve`],
/// its in-flight bound included) on a runtime of its own.
fn start_tollgate(server: Server) -> (SocketAddr, tokio::runtime::Runtime) {
    let runtime = two_workers();
    let grpc = runtime.block_on(TcpListener::bind("127.0.0.1:0")).unwrap();
    let http = runtime.block_on(TcpListener::bind("127.0.0.1:0")).unwrap();
    let addr = grpc.local_addr().unwrap();
    runtime.spawn(tollgate_server::serve(
        server,
        grpc,
        http,
        None,
        std::future::pending(),
    ));
    (addr, runtime)
}

/// Serves `service` on a runtime of its own; returns its address and the
/// runtime (dropped at the end of the bench).
fn start<S>(service: S) -> (SocketAddr, tokio::runtime::Runtime)
where
    S: RateLimitService,
{
    let runtime = two_workers();
    let listener = runtime.block_on(TcpListener::bind("127.0.0.1:0")).unwrap();
    let addr = listener.local_addr().unwrap();
    runtime.spawn(
        tonic::transport::Server::builder()
            .add_service(RateLimitServiceServer::new(service))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    (addr, runtime)
}

fn request(key: &str, value: String) -> RateLimitRequest {
    RateLimitRequest {
        domain: "bench".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: key.into(),
                value,
            }],
            ..Default::default()
        }],
        hits_addend: 0,
    }
}

/// Decisions per second from `streams` tasks over `channel` for `round`,
/// the share of calls shed, and the calls that failed in transport.
async fn round(channel: &Channel, regime: &str, streams: u64, round: Duration) -> (f64, f64, u64) {
    let done = Arc::new(AtomicU64::new(0));
    let shed = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for stream in 0..streams {
        let mut client = RateLimitServiceClient::new(channel.clone());
        let req = match regime {
            "allow" => request("allow", format!("s{stream}")),
            "deny" => request("deny", "all".into()),
            _ => request("at_limit", "all".into()),
        };
        let (done, shed, failed, stop) = (done.clone(), shed.clone(), failed.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                // A shed call (UNAVAILABLE) is counted apart: only
                // decisions count as throughput.
                match client.should_rate_limit(req.clone()).await {
                    Ok(_) => done.fetch_add(1, Ordering::Relaxed),
                    Err(status) if status.code() == tonic::Code::Unavailable => {
                        shed.fetch_add(1, Ordering::Relaxed)
                    }
                    // A transport error (the connection closed under the
                    // client: tonic reconnects) is no decision: counted
                    // apart and shown.
                    Err(_) => failed.fetch_add(1, Ordering::Relaxed),
                };
            }
        }));
    }
    let start = Instant::now();
    let (before, shed_before) = (done.load(Ordering::Relaxed), shed.load(Ordering::Relaxed));
    tokio::time::sleep(round).await;
    let calls = done.load(Ordering::Relaxed) - before;
    let shed_calls = shed.load(Ordering::Relaxed) - shed_before;
    let elapsed = start.elapsed();
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    let share = shed_calls as f64 / (calls + shed_calls).max(1) as f64;
    (
        calls as f64 / elapsed.as_secs_f64(),
        share,
        failed.load(Ordering::Relaxed),
    )
}

/// A row's rates: the first (the baseline's), then each other with its ratio
/// to the first.
fn with_ratios(rates: &[f64]) -> String {
    let mut row = format!("{:>12.0}", rates[0]);
    for rate in &rates[1..] {
        row += &format!(" {rate:>10.0} {:>6.2}", rate / rates[0]);
    }
    row
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    // `cargo bench` passes `--bench`; a filter argument is not supported.
    let streams = env("STREAMS", 64);
    let rounds = env("ROUNDS", 7) as usize;
    let round_time = Duration::from_millis(env("ROUND_MS", 1000));
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".into());
    println!(
        "CPU: {cpu}; {} cores; {streams} streams over one connection; {rounds} rounds of {} ms each, paired",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        round_time.as_millis()
    );
    println!(
        "{:<10} {:>12} {:>10} {:>6} {:>10} {:>6} {:>10} {:>6} {:>6}",
        "regime",
        "empty req/s",
        "unbounded",
        "ratio",
        "default",
        "ratio",
        "adaptive",
        "ratio",
        "shed"
    );
    let client_rt = two_workers();
    for regime in ["allow", "deny", "at-limit"] {
        let make = |in_flight: InFlight| {
            let config = Config::from_files([("bench.yaml", CONFIG)]).unwrap();
            let mut options = Options::default();
            options.in_flight = in_flight;
            Server::new(config, options).unwrap()
        };
        let (unbounded, default, adaptive) = (
            make(InFlight::Unlimited),
            make(InFlight::default()),
            make(InFlight::Adaptive),
        );
        // The empty service answers what the limiter answers this regime's
        // requests, so both send the same bytes.
        let sample = match regime {
            "allow" => request("allow", "s0".into()),
            "deny" => request("deny", "all".into()),
            _ => request("at_limit", "all".into()),
        };
        let mut response = client_rt
            .block_on(unbounded.should_rate_limit(&sample))
            .unwrap();
        if regime == "deny" {
            response = client_rt
                .block_on(unbounded.should_rate_limit(&sample))
                .unwrap();
            client_rt
                .block_on(adaptive.should_rate_limit(&sample))
                .unwrap();
        }
        let targets = [
            start(Empty(Arc::new(response))),
            start_tollgate(unbounded),
            start_tollgate(default),
            start_tollgate(adaptive),
        ];
        let (m, mut shed, failed) =
            measure(&client_rt, &targets, regime, streams, rounds, round_time);
        println!(
            "{regime:<10} {} {:>5.1}%  {:?}",
            with_ratios(&m),
            100.0 * median(&mut shed[3]),
            failed
        );
    }
    backends(&client_rt, streams, rounds, round_time);
}

/// One HTTP/2 connection to `addr`.
fn connect(client_rt: &tokio::runtime::Runtime, addr: SocketAddr) -> Channel {
    client_rt.block_on(async move {
        Channel::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap()
    })
}

/// Paired rounds over `targets` (after a warm-up round each): each one's
/// median decisions per second, its rounds' shed shares, and its transport
/// failures.
fn measure(
    client_rt: &tokio::runtime::Runtime,
    targets: &[(SocketAddr, tokio::runtime::Runtime)],
    regime: &str,
    streams: u64,
    rounds: usize,
    round_time: Duration,
) -> (Vec<f64>, Vec<Vec<f64>>, Vec<u64>) {
    let channels: Vec<Channel> = targets
        .iter()
        .map(|(addr, _)| connect(client_rt, *addr))
        .collect();
    // One warm-up round each (the adaptive bound finds its level, leases
    // their size).
    for ch in &channels {
        client_rt.block_on(round(ch, regime, streams, round_time / 2));
    }
    let mut results = vec![Vec::new(); channels.len()];
    let mut shed = vec![Vec::new(); channels.len()];
    let mut failed = vec![0; channels.len()];
    for i in 0..rounds {
        // Rotate which goes first, so drift favours none.
        for k in 0..channels.len() {
            let j = (i + k) % channels.len();
            let (rate, share, lost) =
                client_rt.block_on(round(&channels[j], regime, streams, round_time));
            results[j].push(rate);
            shed[j].push(share);
            failed[j] += lost;
        }
    }
    let m = results.iter_mut().map(|r| median(r)).collect();
    (m, shed, failed)
}

/// The backends side by side on token buckets: memory, Redis, leased.
fn backends(
    client_rt: &tokio::runtime::Runtime,
    streams: u64,
    rounds: usize,
    round_time: Duration,
) {
    if std::process::Command::new("redis-server")
        .arg("--version")
        .output()
        .is_err()
    {
        println!("backends: skipped (no redis-server; scripts/install-redis installs it)");
        return;
    }
    let redis = redis_server::RedisServer::start();
    println!(
        "{:<10} {:>12} {:>10} {:>6} {:>10} {:>6}  redis calls/request (redis, leased)",
        "backends", "memory req/s", "redis", "ratio", "leased", "ratio"
    );
    for regime in ["allow", "deny", "at-limit"] {
        let config = || Config::from_files([("bench.yaml", BUCKETS)]).unwrap();
        let memory = Server::new(config(), Options::default()).unwrap();
        let on_redis = |lease: Option<Leasing>, prefix: &str| {
            let mut settings = RedisSettings::default();
            settings.failure = Failure::Closed;
            settings.lease = lease;
            settings.prefix = format!("{prefix}-{regime}");
            let server = Server::with_redis(config(), Options::default(), settings).unwrap();
            let url = redis.url();
            let client = client_rt.block_on(async move {
                tollgate_redis::Client::connect_with(
                    &url,
                    tollgate_redis::Options::new().timeout(Duration::from_millis(15)),
                )
                .await
                .unwrap()
            });
            server.connect_redis(client);
            server
        };
        let mut leasing = Leasing::default();
        leasing.min_rate_per_second = 0.0;
        let targets = [
            start_tollgate(memory),
            start_tollgate(on_redis(None, "redis")),
            start_tollgate(on_redis(Some(leasing), "leased")),
        ];
        // Script calls per request of each Redis backend, from one round
        // each alone (the paired rounds below interleave them).
        let mut per_request = [0.0; 2];
        for (j, target) in targets[1..].iter().enumerate() {
            let calls = |redis: &redis_server::RedisServer| redis.script_calls();
            let channel = connect(client_rt, target.0);
            client_rt.block_on(round(&channel, regime, streams, round_time / 4));
            let before = calls(&redis);
            let started = Instant::now();
            let (rate, _, _) = client_rt.block_on(round(&channel, regime, streams, round_time));
            let requests = rate * started.elapsed().as_secs_f64();
            per_request[j] = (calls(&redis) - before) as f64 / requests.max(1.0);
        }
        let (m, _, failed) = measure(client_rt, &targets, regime, streams, rounds, round_time);
        println!(
            "{regime:<10} {}  {:.3} {:.4}  {:?}",
            with_ratios(&m),
            per_request[0],
            per_request[1],
            failed
        );
    }
}
