//! A small axum service behind tollgate-tower: a per-IP token bucket on
//! every request, an exact sliding log on `/search` (shared by all callers),
//! and a per-IP login limit on `POST /login` (5 at once, then one every 12 s);
//! each route's limits all-or-nothing (the core's `AllOf`).
//!
//! ```text
//! cargo run --release -p tollgate-tower --example service              # drives itself: 40 requests, prints what came back
//! cargo run --release -p tollgate-tower --example service -- --requests 100
//! cargo run --release -p tollgate-tower --example service -- --serve 127.0.0.1:3000 --duration 60
//! ```
//!
//! With `--serve`, try `curl -i localhost:3000/` and `curl -i -X POST
//! localhost:3000/login` six times; the server stops after `--duration`
//! seconds (default 30).

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::connect_info::IntoMakeServiceWithConnectInfo;
use axum::routing::{get, post};
use http::Method;
use tokio::net::TcpListener;
use tollgate::keyed::{BucketConfig, Keyed};
use tollgate::{AllOf, Rate, SlidingLog, TokenBucket};
use tollgate_tower::{AllOfLimit, PeerIp, PerKey, PolicyName, Route, Throttle, ThrottleLayer};

/// The service: the layer in front of the whole router (it matches its own
/// routes), the router's routes built once (`with_state`, as
/// `Router::into_make_service` would do).
fn app() -> Result<
    IntoMakeServiceWithConnectInfo<Throttle<Router, PeerIp>, SocketAddr>,
    Box<dyn std::error::Error>,
> {
    // Every request: 20 at once per IP, then 10 a second.
    let per_ip = Arc::new(Keyed::<IpAddr, TokenBucket>::new(BucketConfig::new(
        20,
        Rate::per_second(10),
    )?));
    // Logins: 5 at once per IP, then one every 12 s (the bucket's bound: at
    // most 5 + t/12 s in any span t; a fixed window would allow 10 across a
    // boundary).
    let logins = Arc::new(Keyed::<IpAddr, TokenBucket>::new(BucketConfig::new(
        5,
        Rate::per_minute(5),
    )?));
    // Search: 30 a second for everyone together, in any window of 1 s
    // (exact: a sliding log, the last member of its AllOf as it cannot refund).
    let search = Arc::new(SlidingLog::new(Rate::per_second(30))?);

    // Each route group's limits are one AllOf: all admit or none keeps a
    // permit (a login denied by the login limit gives its per-IP permit back).
    let name = |n: &str, secs| {
        Ok::<_, tollgate_tower::InvalidName>(PolicyName::new(n)?.window(Duration::from_secs(secs)))
    };
    let (ip_a, ip_b, ip_c) = (Arc::clone(&per_ip), Arc::clone(&per_ip), per_ip);
    let login = AllOfLimit::new(
        [name("per-ip", 2)?, name("login", 60)?],
        move |ip: &IpAddr, n| {
            AllOf::new((ip_a.for_key(ip), logins.for_key(ip))).try_acquire_n_reporting(n)
        },
    )?;
    let search = AllOfLimit::new(
        [name("per-ip", 2)?, name("search", 1)?],
        move |ip: &IpAddr, n| AllOf::new((ip_b.for_key(ip), &*search)).try_acquire_n_reporting(n),
    )?;
    let layer = ThrottleLayer::builder(PeerIp)
        .route(Route::exact("/login").method(Method::POST), login)
        .route(Route::prefix("/search"), search)
        // Everything else: the per-IP bucket alone (the first matching group decides).
        .route(
            Route::prefix("/"),
            PerKey::shared(name("per-ip", 2)?, ip_c)?,
        )
        .build();
    let router = Router::new()
        .route("/", get(|| async { "hello\n" }))
        .route("/search", get(|| async { "results\n" }))
        .route("/login", post(|| async { "welcome\n" }));
    Ok(layer.serve(router))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let app = app()?;
    if let Some(addr) = flag("--serve") {
        let seconds: u64 = flag("--duration").map_or(Ok(30), |d| d.parse())?;
        let listener = TcpListener::bind(&addr).await?;
        println!(
            "serving on http://{} for {seconds} s",
            listener.local_addr()?
        );
        let server = axum::serve(listener, app);
        let _ = tokio::time::timeout(Duration::from_secs(seconds), server).await;
        return Ok(());
    }

    let requests: usize = flag("--requests").map_or(Ok(40), |n| n.parse())?;
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    let client = reqwest::Client::new();
    let mut counts: BTreeMap<(&str, u16), usize> = BTreeMap::new();
    for i in 0..requests {
        let (label, request) = match i % 4 {
            0 => ("POST /login", client.post(format!("http://{addr}/login"))),
            1 => ("GET /search", client.get(format!("http://{addr}/search"))),
            _ => ("GET /", client.get(format!("http://{addr}/"))),
        };
        let response = request.send().await?;
        let status = response.status().as_u16();
        if !counts.contains_key(&(label, status)) {
            println!("first {status} for {label}:");
            for name in ["ratelimit-policy", "ratelimit", "retry-after"] {
                if let Some(value) = response.headers().get(name) {
                    println!("  {name}: {}", value.to_str()?);
                }
            }
            if status != 200 {
                println!("  body: {}", response.text().await?);
            }
        }
        *counts.entry((label, status)).or_default() += 1;
    }
    println!("\n{requests} requests from one address:");
    for ((label, status), count) in counts {
        println!("  {label:12} {status}: {count}");
    }
    Ok(())
}
