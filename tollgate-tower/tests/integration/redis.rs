//! The `redis` feature: a policy decided by a real `redis-server` this test
//! starts (tollgate-redis's test support), behind a real axum server and
//! client. Run with `--features redis`.
#![cfg(feature = "redis")]

use crate::server;
use crate::support;

use axum::Router;
use axum::routing::get;
use http::StatusCode;
use tokio::net::TcpListener;
use tollgate::Rate;
use tollgate_tower::{PeerIp, RedisAllOf, RedisLimit, ThrottleLayer};

/// Serves `ok` at `/` with what `layered` adds to the route, returning its
/// URL.
async fn serve_ok(layered: impl FnOnce(Router) -> Router) -> String {
    let addr = support::serve(layered(Router::new().route("/", get(|| async { "ok" })))).await;
    format!("http://{addr}/")
}

/// A response's `retry-after`, in seconds.
fn retry_after(response: &reqwest::Response) -> u64 {
    response.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

/// A fresh Redis server and a client on it.
async fn redis_and_client() -> (server::RedisServer, tollgate_redis::Client) {
    let redis = server::RedisServer::start();
    let client = tollgate_redis::Client::connect(&redis.url()).await.unwrap();
    (redis, client)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_limit_throttles_and_a_dead_server_is_503() {
    let (redis, client) = redis_and_client().await;
    // An hour-long window: nothing refills during the test.
    let window = tollgate_redis::FixedWindow::new("shared", Rate::per_hour(3)).unwrap();
    let layer = ThrottleLayer::builder(PeerIp)
        .policy(RedisLimit::new("shared", client, window).unwrap())
        .build();
    let url = serve_ok(|app| app.layer(layer)).await;
    let mut statuses = Vec::new();
    for expected in [2, 1, 0] {
        let admitted = reqwest::get(&url).await.unwrap();
        assert_eq!(admitted.status(), StatusCode::OK);
        // The script's remaining count and the time to the window's end.
        assert_eq!(admitted.headers()["ratelimit-policy"], "\"shared\";q=3");
        let field = admitted.headers()["ratelimit"].to_str().unwrap().to_owned();
        let t: u64 = field
            .strip_prefix(&format!("\"shared\";r={expected};t="))
            .unwrap_or_else(|| panic!("{field}"))
            .parse()
            .unwrap();
        assert!((1..=3600).contains(&t), "{field}");
    }
    for _ in 0..2 {
        statuses.push(reqwest::get(&url).await.unwrap().status());
    }
    assert!(
        statuses.iter().all(|s| *s == StatusCode::TOO_MANY_REQUESTS),
        "{statuses:?}"
    );
    let denied = reqwest::get(&url).await.unwrap();
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry = retry_after(&denied);
    assert!((1..=3600).contains(&retry), "{retry}");

    drop(redis); // the server goes away mid-service
    let gone = reqwest::get(&url).await.unwrap();
    assert_eq!(gone.status(), StatusCode::SERVICE_UNAVAILABLE);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leased_limit_never_admits_more_than_the_global_budget() {
    use std::time::Duration;
    use tollgate_redis::{LeaseOptions, LeasedLimiter};
    use tollgate_tower::{Global, LeasedLimit};

    let (_redis, client) = redis_and_client().await;
    // Five permits an hour for the whole cluster of servers.
    let bucket = tollgate_redis::TokenBucket::new("api", 5, Rate::per_hour(5)).unwrap();
    let leased = LeasedLimiter::start(client, bucket, "api", LeaseOptions::new());
    let layer = ThrottleLayer::builder(Global)
        .policy(LeasedLimit::new("cluster", leased).unwrap())
        .build();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let url = format!("http://{addr}/");
    // Leases arrive in the background: keep asking until the budget is spent
    // (a denial while a lease is on its way is a 429 with the hint).
    let mut admitted = 0;
    for _ in 0..2000 {
        match reqwest::get(&url).await.unwrap().status() {
            StatusCode::OK => admitted += 1,
            StatusCode::TOO_MANY_REQUESTS => {}
            other => panic!("unexpected {other}"),
        }
        if admitted == 5 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(admitted, 5, "the whole budget is reachable through leases");
    // The hour's budget is spent: nothing more, however often we ask.
    for _ in 0..20 {
        assert_eq!(
            reqwest::get(&url).await.unwrap().status(),
            StatusCode::TOO_MANY_REQUESTS
        );
    }
}

/// A quiet leased route: after more than the lease's lifetime idle, the local
/// lease has expired, and the first request waits for one lease call instead
/// of being refused — while the shared budget is unused, every such request
/// is admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leased_route_admits_the_first_request_after_idle() {
    use std::time::{Duration, Instant};
    use tollgate_redis::{LeaseOptions, LeasedLimiter};
    use tollgate_tower::{Global, LeasedLimit};

    let (redis, client) = redis_and_client().await;
    let bucket =
        tollgate_redis::TokenBucket::new("search", 1_000, Rate::per_second(1_000)).unwrap();
    let options = LeaseOptions::new().lifetime(Duration::from_secs(1));
    let leased = LeasedLimiter::start(client, bucket, "search", options);
    let layer = ThrottleLayer::builder(Global)
        .route(
            tollgate_tower::Route::exact("/search"),
            LeasedLimit::new("search", leased).unwrap(),
        )
        .build();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let router = Router::new().route("/search", get(|| async { "results" }));
    tokio::spawn(async move { axum::serve(listener, layer.serve(router)).await.unwrap() });
    let url = format!("http://{addr}/search");
    let http = reqwest::Client::new();
    let mut first_after_idle = Vec::new();
    for round in 0..2 {
        // Idle for three lease lifetimes: whatever was leased has expired.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let started = Instant::now();
        let response = http.get(&url).send().await.unwrap();
        first_after_idle.push(started.elapsed());
        assert_eq!(
            response.status(),
            StatusCode::OK,
            "round {round}: {:?}",
            response.headers().get("retry-after")
        );
        // The process's view of the shared budget: the global capacity, the
        // permits its lease holds, a full refill's time (1 s).
        assert_eq!(response.headers()["ratelimit-policy"], "\"search\";q=1000");
        let field = response.headers()["ratelimit"].to_str().unwrap();
        let r: u32 = field
            .strip_prefix("\"search\";r=")
            .and_then(|rest| rest.strip_suffix(";t=1"))
            .unwrap_or_else(|| panic!("{field}"))
            .parse()
            .unwrap();
        assert!(r < 1000, "{field}");
    }
    eprintln!("first request after idle: {first_after_idle:?}");

    // Redis gone while the route is idle: the cold request's lease call
    // fails, and the limiter's policy (`Closed`) answers — `503`, as a busy
    // process whose breaker has opened answers, not a `429` that would
    // invite a retry.
    drop(redis);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let response = http.get(&url).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
}

/// Two Redis limits of a route in one call per request, all or nothing: the
/// fields name the tightest member, a denial names the member that refused
/// with its exact wait, and the other member is not charged for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_limits_of_a_route_go_in_one_call_all_or_nothing() {
    let (redis, client) = redis_and_client().await;
    let burst = tollgate_redis::TokenBucket::new("burst", 5, Rate::per_hour(5)).unwrap();
    let hourly = tollgate_redis::FixedWindow::new("hourly", Rate::per_hour(3)).unwrap();
    let policy = RedisAllOf::new(client.clone(), "burst", burst.clone())
        .unwrap()
        .and("hourly", hourly)
        .unwrap();
    let layer = ThrottleLayer::builder(PeerIp).policy(policy).build();
    let url = serve_ok(|app| app.layer(layer)).await;
    for expected in [2, 1, 0] {
        let admitted = reqwest::get(&url).await.unwrap();
        assert_eq!(admitted.status(), StatusCode::OK);
        let field = admitted.headers()["ratelimit"].to_str().unwrap().to_owned();
        assert!(
            field.starts_with(&format!("\"hourly\";r={expected};t=")),
            "{field}"
        );
    }
    let _: () = redis.cmd(&["CONFIG", "RESETSTAT"]);
    let denied = reqwest::get(&url).await.unwrap();
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(redis.script_calls(), 1, "one call for both limits");
    let retry = retry_after(&denied);
    assert!((1..=3600).contains(&retry), "{retry}");
    let field = denied.headers()["ratelimit"].to_str().unwrap().to_owned();
    assert!(field.starts_with("\"hourly\";r=0;t="), "{field}");
    // The bucket kept its 2: the refused request took nothing from it.
    let key = "127.0.0.1";
    assert_eq!(client.try_acquire(&burst, key).await.unwrap().remaining, 1);
}
