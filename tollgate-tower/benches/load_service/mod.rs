//! The load test's service and its two layers, shared by the measures of
//! the layer's cost: `benches/loadtest.rs` (over loopback), `benches/callcost.rs`
//! (in-process, for callgrind) and `benches/layer.rs` (criterion), each
//! including it as `mod load_service;`, so that all three measure the same
//! limits, keys and requests.
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
use tollgate::{Denied, Rate, RateLimiter, Rejection, Snapshot, TokenBucket};
use tollgate_tower::{
    Decision, Limit, PeerIp, PerKey, Policy, PolicyName, PolicyOutcome, ThrottleLayer,
};
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

/// The parts of [`tollgate_layer`]'s cost, each a layer of its own (for
/// `loadtest --breakdown` and `callcost --layer`):
///
/// - `no-policy`: the key and the plumbing — `PeerIp` extracted, no policy
///   asked, no fields;
/// - `unreported`: plus the decision — the same keyed bucket, asked through
///   a policy that reports no state, so no fields are written;
/// - `constant`: the key, the plumbing and the fields, without a limiter — a
///   policy whose "limiter" returns a fixed state of the same size as the
///   real one's.
///
/// `tollgate_layer` is all three: key, decision and fields.
pub fn breakdown_layer(part: &str, limits: &str) -> ThrottleLayer<PeerIp> {
    let (burst, rate, _) = limits_of(limits);
    let builder = ThrottleLayer::builder(PeerIp);
    match part {
        "no-policy" => builder.build(),
        "unreported" => builder
            .policy(Unreported {
                name: PolicyName::new("per-ip").unwrap(),
                keyed: Keyed::new(BucketConfig::new(burst, rate).unwrap()),
            })
            .build(),
        "constant" => builder
            .policy(Limit::new("per-ip", Constant { capacity: burst }).unwrap())
            .build(),
        other => panic!("breakdown part no-policy|unreported|constant, not {other}"),
    }
}

/// A per-IP bucket asked without its state: the decision's cost, no fields.
struct Unreported {
    name: PolicyName,
    keyed: Keyed<IpAddr, TokenBucket>,
}

impl Policy<IpAddr> for Unreported {
    fn name(&self) -> &PolicyName {
        &self.name
    }

    fn decide(&self, key: &IpAddr, n: u32) -> Decision {
        Decision::Now(match self.keyed.try_acquire_n(key, n) {
            Ok(()) => PolicyOutcome::Admitted(None),
            Err(denied) => PolicyOutcome::Denied {
                denied,
                snapshot: None,
            },
        })
    }
}

/// Admits everything and reports a full bucket less one (as many digits as
/// the real bucket's reports), or with `capacity` 1 (the deny limits)
/// refuses everything for an hour: the fields' cost without a limiter's.
struct Constant {
    capacity: u32,
}

impl Constant {
    fn decide(&self) -> Result<Snapshot, Rejection> {
        let wait = Duration::from_secs(3600);
        if self.capacity > 1 {
            Ok(Snapshot::new(
                self.capacity - 1,
                self.capacity,
                Duration::from_nanos(100),
            ))
        } else {
            Err(Rejection::new(
                Denied::RetryAfter(wait),
                Snapshot::new(0, 1, wait),
            ))
        }
    }
}

impl RateLimiter for Constant {
    fn try_acquire_n(&self, _: u32) -> Result<(), Denied> {
        self.decide().map(drop).map_err(|r| r.denied)
    }

    fn snapshot(&self) -> Snapshot {
        self.decide().unwrap_or_else(|r| r.snapshot)
    }

    fn try_acquire_n_with_snapshot(&self, _: u32) -> Result<Snapshot, Rejection> {
        self.decide()
    }
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
