//! What the layer adds to one request, without the network: a request with
//! its peer address goes through `Throttle` (or `tower_governor`'s service)
//! around a service that answers at once, and the response future is polled
//! once (it is ready: every policy here decides synchronously). Allow-heavy
//! (limits never reached) and deny-heavy (every request refused), 1 thread:
//! the per-request cost that the loopback load test (examples/loadtest.rs)
//! shows diluted in HTTP's own cost.
//!
//! ```text
//! cargo bench -p tollgate-tower --bench layer -- --warm-up-time 1 --measurement-time 2
//! ```

use std::convert::Infallible;
use std::future::{Future, Ready, ready};
use std::net::{IpAddr, SocketAddr};
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use criterion::{Criterion, criterion_group, criterion_main};
use http::{Request, Response};
use tollgate::keyed::{BucketConfig, Keyed};
use tollgate::{Rate, TokenBucket};
use tollgate_tower::{PeerIp, PerKey, ThrottleLayer};
use tower::{Layer, Service};
use tower_governor::GovernorLayer;
use tower_governor::governor::GovernorConfigBuilder;

#[derive(Clone)]
struct Answer;

impl Service<Request<Body>> for Answer {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Ready<Result<Response<Body>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<Body>) -> Self::Future {
        ready(Ok(Response::new(Body::from("ok"))))
    }
}

fn request(i: u64) -> Request<Body> {
    let mut request = Request::get("/").body(Body::empty()).unwrap();
    // Four client addresses, as in the load test.
    let ip = IpAddr::from([127, 0, 0, 1 + (i % 4) as u8]);
    request
        .extensions_mut()
        .insert(ConnectInfo(SocketAddr::new(ip, 40_000)));
    request
}

/// One request through `service`, its (ready) future polled once.
fn once<S>(service: &mut S, i: u64) -> u16
where
    S: Service<Request<Body>, Response = Response<Body>>,
    S::Error: std::fmt::Debug,
{
    let mut cx = Context::from_waker(Waker::noop());
    let future = pin!(service.call(request(i)));
    match future.poll(&mut cx) {
        Poll::Ready(response) => response.unwrap().status().as_u16(),
        Poll::Pending => unreachable!("every service here answers at once"),
    }
}

fn bench(c: &mut Criterion) {
    for (label, burst, rate, period) in [
        (
            "allow",
            1_000_000,
            Rate::per_second(10_000_000),
            Duration::from_nanos(100),
        ),
        ("deny", 1, Rate::per_hour(1), Duration::from_secs(3600)),
    ] {
        let mut group = c.benchmark_group(format!("layer/{label}"));
        let mut bare = Answer;
        let per_ip = Keyed::<IpAddr, TokenBucket>::new(BucketConfig::new(burst, rate).unwrap());
        let mut tollgate = ThrottleLayer::builder(PeerIp)
            .policy(PerKey::new("per-ip", per_ip).unwrap())
            .build()
            .layer(Answer);
        let config = GovernorConfigBuilder::default()
            .period(period)
            .burst_size(burst)
            .use_headers()
            .finish()
            .unwrap();
        let mut governor = GovernorLayer::new(Arc::new(config)).layer(Answer);
        // Spend the deny case's one permit per key first.
        for i in 0..4 {
            once(&mut tollgate, i);
            once(&mut governor, i);
        }
        let mut i = 0u64;
        group.bench_function("none", |b| {
            b.iter(|| {
                i += 1;
                once(&mut bare, i)
            })
        });
        group.bench_function("tollgate-tower", |b| {
            b.iter(|| {
                i += 1;
                once(&mut tollgate, i)
            })
        });
        group.bench_function("tower_governor", |b| {
            b.iter(|| {
                i += 1;
                once(&mut governor, i)
            })
        });
        group.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
