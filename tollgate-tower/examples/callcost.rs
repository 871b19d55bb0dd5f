//! Instructions per request through the layer, without the network, for
//! `valgrind --tool=callgrind` (instruction counts do not move with the
//! machine's load, unlike time): `--requests N` requests, each with its peer
//! address, through the load test's axum service (`GET /` → `"ok"`) with no
//! layer, tollgate-tower or `tower_governor`, the response future polled once
//! (it is ready: the handler and every policy here answer at once). The same
//! limits as the load test (`allow`: never reached; `deny`: one permit per
//! key per hour). Only the counted requests are collected; divide the total
//! by `N`:
//!
//! ```text
//! cargo build --release -p tollgate-tower --example callcost
//! valgrind --tool=callgrind --collect-atstart=no --toggle-collect='callcost::measured*' \
//!   target/release/examples/callcost --layer tollgate --limits allow --requests 10000
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
use http::{Request, Response};
use tollgate::keyed::{BucketConfig, Keyed};
use tollgate::{Rate, TokenBucket};
use tollgate_tower::{PeerIp, PerKey, ThrottleLayer};
use tower::Service;
use tower_governor::GovernorLayer;
use tower_governor::governor::GovernorConfigBuilder;

/// The load test's service, with the layer where the load test puts it
/// (`Router::layer`), so that every variant pays the same routing.
fn app(layer: &str, limits: &str) -> Router {
    let router = Router::new().route("/", get(|| async { "ok" }));
    let (burst, rate, period) = match limits {
        "allow" => (
            1_000_000,
            Rate::per_second(10_000_000),
            Duration::from_nanos(100),
        ),
        "deny" => (1, Rate::per_hour(1), Duration::from_secs(3600)),
        other => panic!("--limits allow|deny, not {other}"),
    };
    match layer {
        "none" => router,
        "tollgate" => {
            let per_ip = Keyed::<IpAddr, TokenBucket>::new(BucketConfig::new(burst, rate).unwrap());
            router.layer(
                ThrottleLayer::builder(PeerIp)
                    .policy(PerKey::new("per-ip", per_ip).unwrap())
                    .build(),
            )
        }
        "governor" => {
            let config = GovernorConfigBuilder::default()
                .period(period)
                .burst_size(burst)
                .use_headers()
                .finish()
                .unwrap();
            router.layer(GovernorLayer::new(Arc::new(config)))
        }
        other => panic!("--layer none|tollgate|governor, not {other}"),
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
    // As `into_make_service` does: the routes are built once, not per request.
    let service = app(&arg("--layer", "tollgate"), &arg("--limits", "allow")).with_state(());
    let (ok, denied) = drive(service, requests);
    println!("{ok} admitted, {denied} refused");
}
