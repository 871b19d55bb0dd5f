//! The `metrics` feature: a throttle layer's and a concurrency layer's
//! counters, read back from a recorder (metrics-util's debugging recorder,
//! installed for this test binary) after known traffic over real HTTP on
//! loopback, and checked exactly.
#![cfg(feature = "metrics")]

#[path = "../../tollgate-redis/tests/support/recorded.rs"]
#[allow(dead_code)]
mod recorded;
mod support;

use std::sync::Arc;

use axum::Router;
use axum::routing::get;
use http::StatusCode;
use metrics_util::debugging::DebuggingRecorder;
use tollgate::{ConcurrencyLimit, Rate, TokenBucket};
use tollgate_tower::{ConcurrencyLayer, HeaderKey, Limit, ThrottleLayer};

use recorded::{counter, gauge, histogram, read};

async fn status(client: &reqwest::Client, url: &str, key: Option<&str>) -> StatusCode {
    let mut request = client.get(url);
    if let Some(key) = key {
        request = request.header("x-api-key", key);
    }
    let response = request.send().await.unwrap();
    let status = response.status();
    response.bytes().await.unwrap();
    status
}

/// A gRPC call's head (over HTTP/1.1: the layers read only the head): the
/// `grpc-status` of the answer, `None` for the service's own.
async fn grpc_status(client: &reqwest::Client, url: &str, key: Option<&str>) -> Option<String> {
    let mut request = client.post(url).header("content-type", "application/grpc");
    if let Some(key) = key {
        request = request.header("x-api-key", key);
    }
    let response = request.send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let status = response
        .headers()
        .get("grpc-status")
        .map(|status| status.to_str().unwrap().to_owned());
    response.bytes().await.unwrap();
    status
}

/// Serves `app` on loopback; returns the URL of its root.
async fn serve_root(app: Router) -> String {
    let addr = support::serve(app).await;
    format!("http://{addr}/")
}

/// One test: the recorder is global to this binary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_counts_what_happened() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install().unwrap();
    let client = reqwest::Client::new();

    // A throttle layer: two policies, one per key header and one global.
    let global = Limit::new("global", TokenBucket::new(3, Rate::per_hour(3)).unwrap()).unwrap();
    let per_key = Limit::new("burst", TokenBucket::new(2, Rate::per_hour(2)).unwrap()).unwrap();
    let throttled = ThrottleLayer::builder(HeaderKey::new("x-api-key"))
        .policy(per_key)
        .policy(global)
        .build();
    let url = serve_root(
        Router::new()
            .route("/", get(|| async { "ok" }).post(|| async { "ok" }))
            .layer(throttled),
    )
    .await;
    // burst admits 2 then refuses; global admits those 2 and a third.
    let statuses = [
        status(&client, &url, Some("a")).await,
        status(&client, &url, Some("a")).await,
        status(&client, &url, Some("a")).await,
        status(&client, &url, None).await,
    ];
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::BAD_REQUEST
        ]
    );
    // gRPC calls, refused with gRPC statuses, count as the HTTP refusals do:
    // one more for each counter above but `passed`.
    assert_eq!(
        [
            grpc_status(&client, &url, Some("a")).await,
            grpc_status(&client, &url, None).await,
        ],
        [Some("8".to_owned()), Some("3".to_owned())]
    );
    let metrics = read(&snapshotter);
    let decisions = |policy, outcome| {
        counter(
            &metrics,
            "tollgate_tower_decisions_total",
            &[("policy", policy), ("outcome", outcome)],
        )
    };
    assert_eq!(decisions("burst", "admitted"), 2);
    assert_eq!(decisions("burst", "rate"), 2);
    assert_eq!(decisions("global", "admitted"), 2);
    assert_eq!(decisions("global", "rate"), 0);
    let requests = |outcome| {
        counter(
            &metrics,
            "tollgate_tower_requests_total",
            &[("outcome", outcome)],
        )
    };
    assert_eq!(
        [requests("passed"), requests("refused"), requests("no_key")],
        [2, 2, 2]
    );

    // A concurrency layer of one permit: held, a request is shed; free, one
    // is admitted and its success recorded.
    let limit = Arc::new(ConcurrencyLimit::new(1).unwrap());
    let url = serve_root(
        Router::new()
            .route("/", get(|| async { "ok" }).post(|| async { "ok" }))
            .layer(ConcurrencyLayer::new(Arc::clone(&limit))),
    )
    .await;
    let held = limit.try_acquire().unwrap();
    assert_eq!(
        status(&client, &url, None).await,
        StatusCode::SERVICE_UNAVAILABLE
    );
    // A gRPC call shed with UNAVAILABLE is counted shed as well.
    assert_eq!(
        grpc_status(&client, &url, None).await,
        Some("14".to_owned())
    );
    drop(held);
    assert_eq!(status(&client, &url, None).await, StatusCode::OK);
    let metrics = read(&snapshotter);
    let concurrency = |outcome| {
        counter(
            &metrics,
            "tollgate_tower_concurrency_requests_total",
            &[("outcome", outcome)],
        )
    };
    assert_eq!([concurrency("admitted"), concurrency("shed")], [1, 2]);
    assert_eq!(
        counter(
            &metrics,
            "tollgate_tower_concurrency_outcomes_total",
            &[("outcome", "success")]
        ),
        1
    );
    assert_eq!(
        gauge(&metrics, "tollgate_tower_concurrency_limit", &[]),
        1.0
    );
    // Read when the admitted request took its permit.
    assert_eq!(
        gauge(&metrics, "tollgate_tower_concurrency_in_flight", &[]),
        1.0
    );

    // A queue of one: a request that waits out its 100 ms is shed, one
    // whose permit comes back while it waits is granted; each wait is a
    // sample of the histogram.
    let limit = Arc::new(ConcurrencyLimit::new(1).unwrap());
    let url = serve_root(
        Router::new().route("/", get(|| async { "ok" })).layer(
            ConcurrencyLayer::builder(Arc::clone(&limit))
                .queue(1, std::time::Duration::from_millis(100))
                .build(),
        ),
    )
    .await;
    let held = limit.try_acquire().unwrap();
    assert_eq!(
        status(&client, &url, None).await,
        StatusCode::SERVICE_UNAVAILABLE
    );
    let granted = tokio::spawn({
        let (client, url) = (client.clone(), url.clone());
        async move { status(&client, &url, None).await }
    });
    // The permit comes back only once the request is queued for it.
    while !limit.has_waiters() {
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    drop(held);
    assert_eq!(granted.await.unwrap(), StatusCode::OK);
    let waits = histogram(
        &read(&snapshotter),
        "tollgate_tower_concurrency_queue_wait_seconds",
        &[],
    );
    assert_eq!(waits.len(), 2, "one wait shed, one granted: {waits:?}");
    assert!(
        waits.iter().any(|&wait| wait >= 0.1),
        "the shed request waited its whole timeout: {waits:?}"
    );
}
