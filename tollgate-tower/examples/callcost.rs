//! Instructions per request through the layer, without the network, for
//! `valgrind --tool=callgrind` (instruction counts do not move with the
//! machine's load, unlike time): `--requests N` requests, each with its peer
//! address, through the load test's axum service (`GET /` → `"ok"`) with no
//! layer, tollgate-tower or `tower_governor`, the response future polled once
//! (it is ready: the handler and every policy here answer at once), the layer
//! in front of the whole router (`--placement outer`, the default) or added
//! with axum's `Router::layer` (`--placement router`). The same
//! limits as the load test (`allow`: never reached; `deny`: one permit per
//! key per hour). Only the counted requests are collected; divide the total
//! by `N`:
//!
//! ```text
//! cargo build --release -p tollgate-tower --example callcost
//! valgrind --tool=callgrind --collect-atstart=no --toggle-collect='callcost::measured*' \
//!   target/release/examples/callcost --layer tollgate --limits allow --placement outer --requests 10000
//! ```

use std::future::Future;
use std::hint::black_box;
use std::net::{IpAddr, SocketAddr};
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::routing::get;
use governor::middleware::StateInformationMiddleware;
use http::{Request, Response};
use tollgate::keyed::{BucketConfig, Keyed};
use tollgate::{Rate, TokenBucket};
use tollgate_tower::{PeerIp, PerKey, ThrottleLayer};
use tower::{Layer, Service};
use tower_governor::GovernorLayer;
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::key_extractor::PeerIpKeyExtractor;

/// `(burst, rate, tower_governor's period)` of `limits`, as the load test's.
fn limits_of(limits: &str) -> (u32, Rate, Duration) {
    match limits {
        "allow" => (
            1_000_000,
            Rate::per_second(10_000_000),
            Duration::from_nanos(100),
        ),
        "deny" => (1, Rate::per_hour(1), Duration::from_secs(3600)),
        other => panic!("--limits allow|deny, not {other}"),
    }
}

fn tollgate_layer(limits: &str) -> ThrottleLayer<PeerIp> {
    let (burst, rate, _) = limits_of(limits);
    let per_ip = Keyed::<IpAddr, TokenBucket>::new(BucketConfig::new(burst, rate).unwrap());
    ThrottleLayer::builder(PeerIp)
        .policy(PerKey::new("per-ip", per_ip).unwrap())
        .build()
}

fn governor_layer(
    limits: &str,
) -> GovernorLayer<PeerIpKeyExtractor, StateInformationMiddleware, Body> {
    let (burst, _, period) = limits_of(limits);
    let config = GovernorConfigBuilder::default()
        .period(period)
        .burst_size(burst)
        .use_headers()
        .finish()
        .unwrap();
    GovernorLayer::new(Arc::new(config))
}

/// The load test's service with the layer where the load test puts it
/// (`--placement outer`: in front of the whole router; `router`: axum's
/// `Router::layer`), counted over `requests` requests. The routes are
/// built once first (`with_state`), as `into_make_service` does.
fn run(layer: &str, limits: &str, placement: &str, requests: u64) -> (u64, u64) {
    let router = Router::new().route("/", get(|| async { "ok" }));
    match (layer, placement) {
        ("none", _) => drive(router.with_state::<()>(()), requests),
        ("tollgate", "outer") => drive(
            tollgate_layer(limits).layer(router.with_state::<()>(())),
            requests,
        ),
        ("tollgate", "router") => drive(
            router.layer(tollgate_layer(limits)).with_state::<()>(()),
            requests,
        ),
        ("governor", "outer") => drive(
            governor_layer(limits).layer(router.with_state::<()>(())),
            requests,
        ),
        ("governor", "router") => drive(
            router.layer(governor_layer(limits)).with_state::<()>(()),
            requests,
        ),
        (layer, placement) => panic!(
            "--layer none|tollgate|governor and --placement outer|router, not {layer} and {placement}"
        ),
    }
}

fn request(i: u64) -> Request<Body> {
    let mut request = Request::get("/").body(Body::empty()).unwrap();
    let ip = IpAddr::from([127, 0, 0, 1 + (i % 4) as u8]);
    request
        .extensions_mut()
        .insert(ConnectInfo(SocketAddr::new(ip, 40_000)));
    request
}

/// One request through `service`, its (ready) future polled once; whether
/// it was admitted.
fn once<S>(service: &mut S, i: u64) -> bool
where
    S: Service<Request<Body>, Response = Response<Body>>,
    S::Error: std::fmt::Debug,
{
    let mut cx = Context::from_waker(Waker::noop());
    let future = pin!(service.call(black_box(request(i))));
    let Poll::Ready(response) = future.poll(&mut cx) else {
        unreachable!("every service here answers at once")
    };
    black_box(response.unwrap()).status() == 200
}

/// The requests counted: callgrind's `--toggle-collect` names this function,
/// so the warm-up before it (the clock's calibration, the keys' first
/// insertion, the deny case's first permits) is left out.
#[inline(never)]
fn measured<S>(service: &mut S, requests: u64) -> u64
where
    S: Service<Request<Body>, Response = Response<Body>>,
    S::Error: std::fmt::Debug,
{
    (0..requests).map(|i| u64::from(once(service, i))).sum()
}

fn drive<S>(mut service: S, requests: u64) -> (u64, u64)
where
    S: Service<Request<Body>, Response = Response<Body>>,
    S::Error: std::fmt::Debug,
{
    for i in 0..8 {
        once(&mut service, i);
    }
    let ok = measured(&mut service, requests);
    (ok, requests - ok)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |name: &str, default: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .map_or(default.to_owned(), Clone::clone)
    };
    let requests: u64 = arg("--requests", "10000").parse().expect("a count");
    let (ok, denied) = run(
        &arg("--layer", "tollgate"),
        &arg("--limits", "allow"),
        &arg("--placement", "outer"),
        requests,
    );
    println!("{ok} admitted, {denied} refused");
}
