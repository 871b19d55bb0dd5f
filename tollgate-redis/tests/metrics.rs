//! The `metrics` feature: every metric the crate reports, read back from a
//! recorder (metrics-util's debugging recorder, installed for this test
//! binary) after known traffic on a real server, and checked exactly:
//! requests by outcome, calls by script and outcome with their durations,
//! batch sizes, and a leased limiter's counters against its own stats.
#![cfg(feature = "metrics")]

mod support;

use std::time::Duration;

use metrics_util::debugging::DebuggingRecorder;
use tollgate::Rate;
use tollgate_redis::{
    Ask, Client, FixedWindow, LeaseOptions, LeasedLimiter, Limiter, Options, TokenBucket,
};

use support::RedisServer;
use support::recorded::{Metrics, counter, gauge, histogram, read};

/// One test: the recorder is global to this binary, and the counts are
/// exact only with no other traffic.
#[tokio::test]
async fn every_metric_counts_what_happened() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install().unwrap();

    let mut server = RedisServer::start();
    let client = Client::connect_with(
        &server.url(),
        Options::new().timeout(Duration::from_millis(500)),
    )
    .await
    .unwrap();
    let bucket = TokenBucket::new("bucket", 2, Rate::per_hour(2)).unwrap();
    let window = FixedWindow::new("w", Rate::per_hour(1)).unwrap();
    let _: () = server.cmd(&["RPUSH", &bucket.redis_key("typed"), "a list"]);

    // One limit: 2 admitted, 1 denied, 1 that can never pass (no call),
    // 1 on a key of another type.
    client.try_acquire(&bucket, "u").await.unwrap();
    client.try_acquire(&bucket, "u").await.unwrap();
    assert!(
        client
            .try_acquire(&bucket, "u")
            .await
            .unwrap_err()
            .is_denied()
    );
    assert!(client.try_acquire_n(&bucket, "u", 3).await.is_err());
    assert!(client.try_acquire(&bucket, "typed").await.is_err());
    // Several: 1 admitted, 1 denied.
    let asks = [Ask::new(&bucket, "v"), Ask::new(&window, "v")];
    client.try_acquire_all(&asks).await.unwrap();
    assert!(client.try_acquire_all(&asks).await.is_err());

    let metrics = read(&snapshotter);
    let one = |outcome| {
        counter(
            &metrics,
            "tollgate_redis_requests_total",
            &[("limits", "one"), ("outcome", outcome)],
        )
    };
    assert_eq!(
        [
            one("admitted"),
            one("denied"),
            one("never"),
            one("wrong_type")
        ],
        [2, 1, 1, 1]
    );
    let several = |outcome| {
        counter(
            &metrics,
            "tollgate_redis_requests_total",
            &[("limits", "several"), ("outcome", outcome)],
        )
    };
    assert_eq!([several("admitted"), several("denied")], [1, 1]);
    let decide = [("script", "decide")];
    let calls = counter(
        &metrics,
        "tollgate_redis_calls_total",
        &[("script", "decide"), ("outcome", "ok")],
    );
    assert_eq!(calls, 6, "every request but the one that can never pass");
    let durations = histogram(&metrics, "tollgate_redis_call_duration_seconds", &decide);
    assert_eq!(durations.len(), 6);
    assert!(
        durations.iter().all(|&d| d > 0.0 && d < 0.5),
        "{durations:?}"
    );
    // One request at a time: every call carried one, of one or two limits.
    let requests = histogram(&metrics, "tollgate_redis_batch_requests", &[]);
    let decisions = histogram(&metrics, "tollgate_redis_batch_decisions", &[]);
    assert_eq!(requests, [1.0; 6]);
    assert_eq!(decisions, [1.0, 1.0, 1.0, 1.0, 2.0, 2.0]);

    // A leased limiter: its counters as its own stats say, labelled by the
    // key it was started for, after it stops.
    let global = TokenBucket::new("global", 100, Rate::per_hour(100)).unwrap();
    let mut leased = LeasedLimiter::start(client.clone(), global, "api", LeaseOptions::new());
    let mut admitted = 0;
    for _ in 0..20 {
        if leased.try_acquire_n_waiting(1).await.is_ok() {
            admitted += 1;
        }
    }
    assert!(admitted > 0);
    let stats = leased.shutdown().await;
    let metrics = read(&snapshotter);
    let api = [("limit", "api")];
    assert_eq!(
        counter(&metrics, "tollgate_redis_lease_calls_total", &api),
        stats.lease_calls
    );
    assert_eq!(
        counter(&metrics, "tollgate_redis_leases_total", &api),
        stats.leases
    );
    assert!(stats.leases > 0);
    for (event, value) in [
        ("leased", stats.leased),
        ("returned", stats.returned),
        ("forfeited", stats.forfeited),
        ("spent", stats.spent),
    ] {
        assert_eq!(
            counter(
                &metrics,
                "tollgate_redis_lease_permits_total",
                &[("limit", "api"), ("event", event)]
            ),
            value,
            "{event}"
        );
    }
    assert_eq!(stats.spent, admitted);
    assert_eq!(gauge(&metrics, "tollgate_redis_lease_degraded", &api), 0.0);
    let lease_calls = counter(
        &metrics,
        "tollgate_redis_calls_total",
        &[("script", "lease"), ("outcome", "ok")],
    );
    assert_eq!(lease_calls, stats.lease_calls);

    // A server gone: a refused call and a failed request, never a panic.
    server.kill();
    let before = counter(
        &read(&snapshotter),
        "tollgate_redis_calls_total",
        &[("script", "decide"), ("outcome", "refused")],
    ) + counter(
        &read(&snapshotter),
        "tollgate_redis_calls_total",
        &[("script", "decide"), ("outcome", "interrupted")],
    );
    let failed = client.try_acquire(&bucket, "w").await.unwrap_err();
    let metrics = read(&snapshotter);
    let after = counter(
        &metrics,
        "tollgate_redis_calls_total",
        &[("script", "decide"), ("outcome", "refused")],
    ) + counter(
        &metrics,
        "tollgate_redis_calls_total",
        &[("script", "decide"), ("outcome", "interrupted")],
    ) + counter(
        &metrics,
        "tollgate_redis_calls_total",
        &[("script", "decide"), ("outcome", "timeout")],
    );
    assert_eq!(after, before + 1, "{failed}");
    let failures: u64 = ["refused", "interrupted", "timeout"]
        .iter()
        .map(|outcome| one_of(&metrics, outcome))
        .sum();
    assert_eq!(failures, 1);
}

fn one_of(metrics: &Metrics, outcome: &str) -> u64 {
    counter(
        metrics,
        "tollgate_redis_requests_total",
        &[("limits", "one"), ("outcome", outcome)],
    )
}
