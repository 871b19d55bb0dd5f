//! The load test's service and its two layers, shared by the measures of
//! the layer's cost: `examples/loadtest.rs` (over loopback), `examples/callcost.rs`
//! (in-process, for callgrind) and `benches/layer.rs` (criterion, included with
//! `#[path]`), so that all three measure the same limits, keys and requests.
//! Not every includer uses every item.
#![allow(dead_code)]

use std::future::Future;
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
use tower::Service;
use tower_governor::GovernorLayer;
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::key_extractor::PeerIpKeyExtractor;

/// The service: `GET /` answers `"ok"`, nothing else.
pub fn router() -> Router {
    Router::new().route("/", get(|| async { "ok" }))
}

/// `(burst, rate, tower_governor's period)` of `limits`. Allow: 10 M/s with
/// a burst of 1 M per key, never exhausted here. Deny: one permit per key
/// per hour.
pub fn limits_of(limits: &str) -> (u32, Rate, Duration) {
    match limits {
        "allow" => (
            1_000_000,
            Rate::per_second(10_000_000),
            Duration::from_nanos(100),
        ),
        "deny" => (1, Rate::per_hour(1), Duration::from_secs(3600)),
        other => panic!("limits allow|deny, not {other}"),
    }
}

/// tollgate-tower: a token bucket per peer IP.
pub fn tollgate_layer(limits: &str) -> ThrottleLayer<PeerIp> {
    let (burst, rate, _) = limits_of(limits);
    let per_ip = Keyed::<IpAddr, TokenBucket>::new(BucketConfig::new(burst, rate).unwrap());
    ThrottleLayer::builder(PeerIp)
        .policy(PerKey::new("per-ip", per_ip).unwrap())
        .build()
}

/// `tower_governor`: GCRA per peer IP, quota headers on, as tollgate-tower
/// always writes them.
pub fn governor_layer(
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

/// Request `i`: `GET /` from one of four client addresses, as the load
/// test's clients are, with its peer address where axum's `ConnectInfo` puts it.
pub fn request(i: u64) -> Request<Body> {
    let mut request = Request::get("/").body(Body::empty()).unwrap();
    let ip = IpAddr::from([127, 0, 0, 1 + (i % 4) as u8]);
    request
        .extensions_mut()
        .insert(ConnectInfo(SocketAddr::new(ip, 40_000)));
    request
}

/// One request through `service`, its (ready) future polled once; the
/// response's status.
pub fn once<S>(service: &mut S, i: u64) -> u16
where
    S: Service<Request<Body>, Response = Response<Body>>,
    S::Error: std::fmt::Debug,
{
    let mut cx = Context::from_waker(Waker::noop());
    let future = pin!(service.call(std::hint::black_box(request(i))));
    let Poll::Ready(response) = future.poll(&mut cx) else {
        unreachable!("every service here answers at once")
    };
    std::hint::black_box(response.unwrap()).status().as_u16()
}
