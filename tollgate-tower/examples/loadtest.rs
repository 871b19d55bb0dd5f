//! Loopback load test: requests/s and latency of one axum service with no
//! limiter, behind tollgate-tower, and behind `tower_governor`, in one
//! process and one run (servers and load generator share the machine; the
//! numbers are ratios within a run).
//!
//! ```text
//! cargo run --release -p tollgate-tower --example loadtest -- --seconds 3 --rounds 3
//! ```
//!
//! Each round runs every variant once, in rotating order, for `--seconds`
//! after a short warm-up; the table reports the median round of each. The
//! load is `--connections` keep-alive HTTP/1.1 connections (hyper client),
//! spread over four client addresses (127.0.0.1–4, so per-IP limiters see
//! four keys), each sending its next request as soon as the last answer is
//! read. Two limit settings: **allow** (every request admitted: the cost of
//! deciding and writing the quota headers) and **deny** (one permit per key
//! per hour: nearly every request answered 429 by the layer).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::get;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpSocket};
use tollgate::keyed::{BucketConfig, Keyed};
use tollgate::{Rate, TokenBucket};
use tollgate_tower::{PeerIp, PerKey, ThrottleLayer};
use tower_governor::GovernorLayer;
use tower_governor::governor::GovernorConfigBuilder;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Variant {
    None,
    Tollgate,
    Governor,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Limits {
    Allow,
    Deny,
}

fn app(variant: Variant, limits: Limits) -> Router {
    let router = Router::new().route("/", get(|| async { "ok" }));
    // Allow: 10 M/s with a burst of 1 M per key, never exhausted here.
    // Deny: one permit per key per hour.
    let (burst, rate, governor_period) = match limits {
        Limits::Allow => (
            1_000_000,
            Rate::per_second(10_000_000),
            Duration::from_nanos(100),
        ),
        Limits::Deny => (1, Rate::per_hour(1), Duration::from_secs(3600)),
    };
    match variant {
        Variant::None => router,
        Variant::Tollgate => {
            let per_ip = Keyed::<IpAddr, TokenBucket>::new(BucketConfig::new(burst, rate).unwrap());
            router.layer(
                ThrottleLayer::builder(PeerIp)
                    .policy(PerKey::new("per-ip", per_ip).unwrap())
                    .build(),
            )
        }
        Variant::Governor => {
            // Quota headers on, as tollgate-tower always writes them.
            let config = GovernorConfigBuilder::default()
                .period(governor_period)
                .burst_size(burst)
                .use_headers()
                .finish()
                .unwrap();
            router.layer(GovernorLayer::new(Arc::new(config)))
        }
    }
}

struct Run {
    requests: u64,
    ok: u64,
    denied: u64,
    latencies_us: Vec<u32>,
    elapsed: Duration,
}

async fn run(variant: Variant, limits: Limits, connections: usize, seconds: f64) -> Run {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let service = app(variant, limits).into_make_service_with_connect_info::<SocketAddr>();
    let server = tokio::spawn(async move { axum::serve(listener, service).await });

    let warm_up = Duration::from_millis(500);
    let start = Instant::now() + warm_up;
    let end = start + Duration::from_secs_f64(seconds);
    let mut clients = Vec::new();
    for c in 0..connections {
        let local: IpAddr = format!("127.0.0.{}", 1 + c % 4).parse().unwrap();
        clients.push(tokio::spawn(async move {
            let socket = TcpSocket::new_v4().unwrap();
            socket.bind(SocketAddr::new(local, 0)).unwrap();
            let stream = socket.connect(addr).await.unwrap();
            stream.set_nodelay(true).unwrap();
            let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .unwrap();
            tokio::spawn(conn);
            let (mut ok, mut denied, mut latencies) = (0u64, 0u64, Vec::new());
            loop {
                let sent = Instant::now();
                if sent >= end {
                    break;
                }
                let request = http::Request::get("/")
                    .header("host", "bench")
                    .body(Empty::<Bytes>::new())
                    .unwrap();
                let response = sender.send_request(request).await.unwrap();
                let status = response.status();
                response.into_body().collect().await.unwrap();
                if sent >= start {
                    latencies.push(sent.elapsed().as_micros().min(u128::from(u32::MAX)) as u32);
                    match status.as_u16() {
                        200 => ok += 1,
                        429 => denied += 1,
                        other => panic!("unexpected status {other}"),
                    }
                }
            }
            (ok, denied, latencies)
        }));
    }
    let mut total = Run {
        requests: 0,
        ok: 0,
        denied: 0,
        latencies_us: Vec::new(),
        elapsed: Duration::from_secs_f64(seconds),
    };
    for client in clients {
        let (ok, denied, latencies) = client.await.unwrap();
        total.ok += ok;
        total.denied += denied;
        total.latencies_us.extend(latencies);
    }
    total.requests = total.ok + total.denied;
    total.latencies_us.sort_unstable();
    server.abort();
    total
}

fn percentile(sorted: &[u32], p: f64) -> u32 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |name: &str, default: f64| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .map_or(default, |v| v.parse().expect("a number"))
    };
    let seconds = flag("--seconds", 2.0);
    let rounds = flag("--rounds", 3.0) as usize;
    let connections = flag("--connections", 16.0) as usize;
    let threads = flag("--threads", 2.0) as usize;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .unwrap();
    let variants = [Variant::None, Variant::Tollgate, Variant::Governor];
    println!(
        "loopback, {connections} keep-alive connections from 4 addresses, {threads} runtime threads, \
         {rounds} rounds of {seconds} s per variant (median round shown)\n"
    );
    println!("| limits | layer | requests/s | vs none | p50 µs | p99 µs | 200 | 429 |");
    println!("|---|---|---:|---:|---:|---:|---:|---:|");
    for limits in [Limits::Allow, Limits::Deny] {
        let mut results: Vec<Vec<Run>> = variants.iter().map(|_| Vec::new()).collect();
        for round in 0..rounds {
            for i in 0..variants.len() {
                let v = (i + round) % variants.len();
                let r = runtime.block_on(run(variants[v], limits, connections, seconds));
                results[v].push(r);
            }
        }
        let mut medians = Vec::new();
        for runs in &mut results {
            runs.sort_by(|a, b| {
                let ra = a.requests as f64 / a.elapsed.as_secs_f64();
                let rb = b.requests as f64 / b.elapsed.as_secs_f64();
                ra.total_cmp(&rb)
            });
            medians.push(runs.swap_remove(runs.len() / 2));
        }
        let base = medians[0].requests as f64 / medians[0].elapsed.as_secs_f64();
        for (variant, m) in variants.iter().zip(&medians) {
            let rps = m.requests as f64 / m.elapsed.as_secs_f64();
            println!(
                "| {limits:?} | {variant:?} | {rps:.0} | {:+.1}% | {} | {} | {} | {} |",
                (rps / base - 1.0) * 100.0,
                percentile(&m.latencies_us, 0.5),
                percentile(&m.latencies_us, 0.99),
                m.ok,
                m.denied
            );
        }
    }
}
