//! What the layer adds to one request, without the network: a request with
//! its peer address goes through `Throttle` (or `tower_governor`'s service)
//! around a service that answers at once, and the response future is polled
//! once (it is ready: every policy here decides synchronously). Allow-heavy
//! (limits never reached) and deny-heavy (every request refused), 1 thread:
//! the per-request cost that the loopback load test (benches/loadtest.rs)
//! shows diluted in HTTP's own cost.
//!
//! ```text
//! cargo bench -p tollgate-tower --bench layer -- --warm-up-time 1 --measurement-time 2
//! ```
//!
//! With `--features metrics`, the layer records its metrics; with
//! `TOLLGATE_BENCH_RECORDER=prometheus` as well, into a Prometheus recorder
//! (`metrics-exporter-prometheus`, as a service would install it) instead of
//! the facade's no-op default.

use std::convert::Infallible;
use std::future::{Ready, ready};
use std::task::{Context, Poll};

use axum::body::Body;
use criterion::{Criterion, criterion_group, criterion_main};
use http::{Request, Response};
use tower::{Layer, Service};

mod load_service;
use load_service::{governor_layer, once, tollgate_layer};

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

fn bench(c: &mut Criterion) {
    if std::env::var("TOLLGATE_BENCH_RECORDER").as_deref() == Ok("prometheus") {
        metrics_exporter_prometheus::PrometheusBuilder::new()
            .install_recorder()
            .expect("a recorder");
    }
    for label in ["allow", "deny"] {
        let mut group = c.benchmark_group(format!("layer/{label}"));
        let mut bare = Answer;
        let mut tollgate = tollgate_layer(label).layer(Answer);
        let mut governor = governor_layer(label).layer(Answer);
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
