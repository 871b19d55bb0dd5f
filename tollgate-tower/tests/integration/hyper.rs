//! The layer on a plain hyper server (no axum): tower's `ServiceBuilder`
//! around a `service_fn`, the connection's address inserted into each
//! request's extensions, served by hyper's HTTP/1 connection builder on a
//! loopback port and driven by a real client.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tollgate::{ManualClock, Rate, RateLimiter, TokenBucket};
use tollgate_tower::{Limit, PeerIp, ThrottleLayer};
use tower::{ServiceBuilder, ServiceExt, service_fn};

#[tokio::test]
async fn the_layer_serves_plain_hyper() {
    let clock = ManualClock::new();
    let bucket = Arc::new(TokenBucket::with_clock(2, Rate::per_minute(2), clock).unwrap());
    let layer = ThrottleLayer::builder(PeerIp)
        .policy(Limit::shared("global", Arc::clone(&bucket)).unwrap())
        .build();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (stream, peer) = listener.accept().await.unwrap();
            let service = ServiceBuilder::new()
                .layer(layer.clone())
                .service(service_fn(|_: Request<Incoming>| async {
                    Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
                }))
                .map_request(move |mut request: Request<Incoming>| {
                    request.extensions_mut().insert::<SocketAddr>(peer);
                    request
                });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), TowerToHyperService::new(service)),
            );
        }
    });
    let client = reqwest::Client::new();
    let url = format!("http://{addr}/");
    for remaining in [1, 0] {
        let response = client.get(&url).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(
            response.headers()["ratelimit"],
            format!("\"global\";r={remaining};t={}", 30 * (2 - remaining)).as_str()
        );
        assert_eq!(response.text().await.unwrap(), "ok");
    }
    let denied = client.get(&url).send().await.unwrap();
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(denied.headers()["retry-after"], "30");
    assert_eq!(bucket.snapshot().available, 0);
}
