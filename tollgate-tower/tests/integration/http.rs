//! The layer in front of a real axum service on a loopback port, driven by a
//! real HTTP client (reqwest; a raw TCP client where the test must hang up
//! mid-request). Client addresses differ by binding the client's socket to
//! other loopback addresses (127.0.0.2, ...: all of 127/8 is loopback on
//! Linux). Limiters run on a `ManualClock` that the test alone moves, so every
//! count below is what the limiter's invariant dictates, whatever the
//! scheduler does.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::routing::{get, post};
use bytes::Bytes;
use http::{Response, StatusCode};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tollgate::keyed::{BucketConfig, Keyed};
use tollgate::{ManualClock, Rate, RateLimiter, TokenBucket};
use tollgate_tower::{
    ForwardedIp, Global, HeaderKey, KeyExtractor, Limit, PeerIp, PerKey, PolicyName, Route, Shaped,
    ThrottleBuilder, ThrottleLayer,
};

use crate::support;
use support::{answer, client_from, scripted_remote, serve};

type PerIp = Keyed<IpAddr, TokenBucket<ManualClock>>;

fn app() -> Router {
    Router::new()
        .route("/", get(|| async { "ok" }))
        .route("/login", post(|| async { "welcome" }))
}

/// One member of a `RateLimit` field: `"name";r=<int>;t=<int>`.
fn parse_ratelimit(field: &str, name: &str) -> (u64, u64) {
    let member = field
        .split(", ")
        .find(|m| m.starts_with(&format!("\"{name}\";")))
        .unwrap_or_else(|| panic!("no member {name} in {field:?}"));
    let mut r = None;
    let mut t = None;
    for param in member.split(';').skip(1) {
        let (k, v) = param.split_once('=').unwrap();
        let v: u64 = v
            .parse()
            .unwrap_or_else(|_| panic!("not an integer in {member:?}"));
        match k {
            "r" => r = Some(v),
            "t" => t = Some(v),
            other => panic!("unexpected parameter {other} in {member:?}"),
        }
    }
    (r.unwrap(), t.unwrap())
}

fn per_ip(capacity: u32, rate: Rate, clock: &ManualClock) -> Arc<PerIp> {
    Arc::new(PerIp::with_clock(
        BucketConfig::new(capacity, rate).unwrap(),
        clock.clone(),
    ))
}

/// A layer builder whose login attempts ([`login_route`]) are limited per
/// peer by `logins`, under the policy name `login`.
fn logins_limited(logins: &Arc<PerIp>) -> ThrottleBuilder<PeerIp> {
    ThrottleLayer::builder(PeerIp).route(
        login_route(),
        PerKey::shared("login", Arc::clone(logins)).unwrap(),
    )
}

/// Posts a login attempt to `addr` from `client`.
async fn post_login(client: &reqwest::Client, addr: SocketAddr) -> reqwest::Response {
    answer(client.post(format!("http://{addr}/login"))).await
}

/// The route group of login attempts: `POST /login`.
fn login_route() -> Route {
    Route::exact("/login").method(http::Method::POST)
}

/// The status `addr` answers a `GET /` with.
async fn root_status(addr: SocketAddr) -> StatusCode {
    reqwest::get(format!("http://{addr}/"))
        .await
        .unwrap()
        .status()
}

/// Asserts that `response`'s body contains `needle`.
async fn assert_body_contains(response: reqwest::Response, needle: &str) {
    let body = response.text().await.unwrap();
    assert!(body.contains(needle), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_per_key_follow_the_bucket_and_headers_parse() {
    let clock = ManualClock::new();
    // 5 at once, then one every 1.5 s.
    let limiter = per_ip(5, Rate::new(2, Duration::from_secs(3)), &clock);
    let policy = PolicyName::new("per-ip")
        .unwrap()
        .window(Duration::from_millis(7500));
    let layer = ThrottleLayer::builder(PeerIp)
        .policy(PerKey::shared(policy, Arc::clone(&limiter)).unwrap())
        .build();
    let addr = serve(app().layer(layer)).await;

    let ips = ["127.0.0.1", "127.0.0.2", "127.0.0.3"];
    let burst = |ip: &'static str, count: usize| {
        let client = client_from(ip);
        async move {
            let requests = (0..count).map(|_| client.get(format!("http://{addr}/")).send());
            futures_join_all(requests).await
        }
    };
    for ip in ips {
        let responses = burst(ip, 8).await;
        let mut remaining = Vec::new();
        let mut denied = 0;
        for response in responses {
            let headers = response.headers();
            assert_eq!(headers["ratelimit-policy"], "\"per-ip\";q=5;w=8");
            let (r, t) = parse_ratelimit(headers["ratelimit"].to_str().unwrap(), "per-ip");
            match response.status() {
                StatusCode::OK => remaining.push(r),
                StatusCode::TOO_MANY_REQUESTS => {
                    denied += 1;
                    assert_eq!(r, 0);
                    // 1.5 s exactly, rounded up to whole seconds.
                    assert_eq!(headers["retry-after"], "2");
                    assert_eq!(t, 8); // 7.5 s until full, rounded up
                    assert_eq!(headers["content-type"], "application/problem+json");
                }
                other => panic!("unexpected status {other}"),
            }
        }
        remaining.sort_unstable();
        assert_eq!(
            remaining,
            [0, 1, 2, 3, 4],
            "{ip}: five admitted, one per remaining count"
        );
        assert_eq!(denied, 3, "{ip}");
    }
    // 3 s later each key has exactly two more permits.
    clock.advance(Duration::from_secs(3));
    for ip in ips {
        let ok = burst(ip, 4)
            .await
            .iter()
            .filter(|r| r.status() == StatusCode::OK)
            .count();
        assert_eq!(ok, 2, "{ip}");
    }
}

/// `join_all` without another dependency: spawn and collect in order.
async fn futures_join_all<F>(futures: impl Iterator<Item = F>) -> Vec<reqwest::Response>
where
    F: std::future::Future<Output = reqwest::Result<reqwest::Response>> + Send + 'static,
{
    let handles: Vec<_> = futures.map(tokio::spawn).collect();
    let mut out = Vec::new();
    for handle in handles {
        out.push(handle.await.unwrap().unwrap());
    }
    out
}

#[tokio::test]
async fn a_request_above_capacity_is_forbidden_not_throttled() {
    let clock = ManualClock::new();
    let limiter = per_ip(5, Rate::per_second(5), &clock);
    let layer = ThrottleLayer::builder(PeerIp)
        .policy(PerKey::shared("per-ip", Arc::clone(&limiter)).unwrap())
        .cost(|parts| {
            parts
                .headers
                .get("x-cost")
                .and_then(|v| v.to_str().ok()?.parse().ok())
                .unwrap_or(1)
        })
        .build();
    let addr = serve(app().layer(layer)).await;
    let client = reqwest::Client::new();
    let huge = answer(client.get(format!("http://{addr}/")).header("x-cost", "6")).await;
    assert_eq!(huge.status(), StatusCode::FORBIDDEN);
    assert!(huge.headers().get("retry-after").is_none());
    assert_eq!(huge.headers()["ratelimit-policy"], "\"per-ip\";q=5");
    let body = huge.text().await.unwrap();
    assert!(body.contains("at most 5 can ever be granted"), "{body}");
    // Nothing was spent: the whole capacity is still there.
    let all = answer(client.get(format!("http://{addr}/")).header("x-cost", "5")).await;
    assert_eq!(all.status(), StatusCode::OK);
    assert_eq!(
        parse_ratelimit(all.headers()["ratelimit"].to_str().unwrap(), "per-ip").0,
        0
    );
    // Cost 0 is free: passed on without asking, no fields.
    let free = answer(client.get(format!("http://{addr}/")).header("x-cost", "0")).await;
    assert_eq!(free.status(), StatusCode::OK);
    assert!(free.headers().get("ratelimit").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarding_headers_count_only_from_trusted_proxies() {
    let clock = ManualClock::new();
    let limiter = per_ip(1, Rate::per_hour(1), &clock);
    // Only 127.0.0.1 is a trusted proxy; 127.0.0.2 is a client.
    let keys = ForwardedIp::x_forwarded_for(["127.0.0.1".parse().unwrap()]);
    let layer = ThrottleLayer::builder(keys)
        .policy(PerKey::shared("per-ip", Arc::clone(&limiter)).unwrap())
        .build();
    let addr = serve(app().layer(layer)).await;
    let url = format!("http://{addr}/");
    let status = |client: &reqwest::Client, xff: &'static str| {
        let request = client.get(&url).header("x-forwarded-for", xff).send();
        async move { request.await.unwrap().status() }
    };

    // A client spoofing: every claim is ignored, its own address is the key.
    let client = client_from("127.0.0.2");
    assert_eq!(status(&client, "9.9.9.9").await, StatusCode::OK);
    assert_eq!(
        status(&client, "9.9.9.8").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    let fresh = |ip: &str| limiter.snapshot(&ip.parse::<IpAddr>().unwrap()).available == 1;
    assert!(fresh("9.9.9.9") && fresh("9.9.9.8"));
    assert!(!fresh("127.0.0.2"));

    // Through the trusted proxy: the right-most untrusted entry is the key,
    // and what the client wrote to the left of it changes nothing.
    let proxy = client_from("127.0.0.1");
    assert_eq!(status(&proxy, "6.6.6.6, 203.0.113.9").await, StatusCode::OK);
    assert_eq!(
        status(&proxy, "7.7.7.7, 203.0.113.9").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        status(&proxy, "203.0.113.10, 127.0.0.1").await,
        StatusCode::OK
    );
    assert!(!fresh("203.0.113.9") && !fresh("203.0.113.10"));
    assert!(fresh("6.6.6.6") && fresh("7.7.7.7") && fresh("127.0.0.1"));
    // Garbage where the client should be: 400, nothing spent.
    assert_eq!(
        status(&proxy, "1.2.3.4, unknown").await,
        StatusCode::BAD_REQUEST
    );
    assert!(fresh("1.2.3.4"));
}

#[tokio::test]
async fn a_request_without_a_key_gets_the_configured_response() {
    let limiter = Arc::new(TokenBucket::new(100, Rate::per_second(100)).unwrap());
    // A header key: 401 from the extractor, body from the hook.
    let layer = ThrottleLayer::builder(
        HeaderKey::new("x-api-key").missing_status(StatusCode::UNAUTHORIZED),
    )
    .policy(Limit::shared("global", Arc::clone(&limiter)).unwrap())
    .on_refusal(|refusal| {
        let mut response = Response::new(Bytes::from(format!("refused: {}", refusal.status())));
        *response.status_mut() = refusal.status();
        response
    })
    .build();
    let addr = serve(app().layer(layer)).await;
    let response = reqwest::get(format!("http://{addr}/")).await.unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(response.text().await.unwrap(), "refused: 401 Unauthorized");
    assert_eq!(limiter.snapshot().available, 100, "no key, nothing spent");

    // The peer address without connect info: a wiring mistake, 500, said so.
    let layer = ThrottleLayer::builder(PeerIp)
        .policy(Limit::shared("global", Arc::clone(&limiter)).unwrap())
        .build();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app().layer(layer)).await.unwrap() });
    let response = reqwest::get(format!("http://{addr}/")).await.unwrap();
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_body_contains(response, "into_make_service_with_connect_info").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn route_groups_and_everyone_all_must_admit() {
    let clock = ManualClock::new();
    let logins = per_ip(2, Rate::per_hour(2), &clock);
    let global = Arc::new(TokenBucket::with_clock(3, Rate::per_hour(3), clock.clone()).unwrap());
    let layer = logins_limited(&logins)
        .policy(Limit::shared("global", Arc::clone(&global)).unwrap())
        .build();
    let addr = serve(app().layer(layer)).await;
    let client = reqwest::Client::new();
    let first = post_login(&client, addr).await;
    assert_eq!(first.status(), StatusCode::OK);
    // Both policies report, route group first.
    assert_eq!(
        first.headers()["ratelimit-policy"],
        "\"login\";q=2, \"global\";q=3"
    );
    assert_eq!(
        first.headers()["ratelimit"],
        "\"login\";r=1;t=1800, \"global\";r=2;t=1200"
    );
    assert_eq!(post_login(&client, addr).await.status(), StatusCode::OK);
    let third = post_login(&client, addr).await;
    assert_eq!(third.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_body_contains(third, r#""violated-policies":["login"]"#).await;
    // The login denial came first: the global bucket was not charged for it.
    assert_eq!(global.snapshot().available, 1);
    // Other routes see only the global policy.
    let page = answer(client.get(format!("http://{addr}/"))).await;
    assert_eq!(page.status(), StatusCode::OK);
    assert_eq!(page.headers()["ratelimit-policy"], "\"global\";q=3");
    let denied = answer(client.get(format!("http://{addr}/"))).await;
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(denied.headers()["retry-after"], "1200");
}

/// The layer in front of the whole router (`layer.layer(router)`, the
/// placement the docs recommend): the make-service's `ConnectInfo` reaches
/// `PeerIp` there too, route groups match the request's own path, and a
/// refusal never reaches the router.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_layer_in_front_of_the_router_keys_by_peer_and_matches_routes() {
    use tower::Layer as _;

    let clock = ManualClock::new();
    let logins = per_ip(1, Rate::per_hour(1), &clock);
    let everyone = per_ip(3, Rate::per_hour(3), &clock);
    let layer = logins_limited(&logins)
        .policy(PerKey::shared("per-ip", Arc::clone(&everyone)).unwrap())
        .build();
    let reached = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&reached);
    let router = app().route(
        "/counted",
        get(move || {
            counter.fetch_add(1, Ordering::Relaxed);
            async { "counted" }
        }),
    );
    let app = layer.layer(router.with_state::<()>(()));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let service =
            axum::ServiceExt::<axum::extract::Request>::into_make_service_with_connect_info::<
                SocketAddr,
            >(app);
        axum::serve(listener, service).await.unwrap();
    });

    let url = |path: &str| format!("http://{addr}{path}");
    let a = client_from("127.0.0.2");
    let login = post_login(&a, addr).await;
    assert_eq!(login.status(), StatusCode::OK);
    assert_eq!(
        login.headers()["ratelimit"],
        "\"login\";r=0;t=3600, \"per-ip\";r=2;t=1200"
    );
    assert_eq!(
        post_login(&a, addr).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    // A path the router does not know is still counted: the layer decides
    // before routing (the router answers it 404, with the fields).
    let unknown = answer(a.get(url("/nowhere"))).await;
    assert_eq!(unknown.status(), StatusCode::NOT_FOUND);
    assert_eq!(unknown.headers()["ratelimit"], "\"per-ip\";r=1;t=2400");
    assert_eq!(
        answer(a.get(url("/counted"))).await.status(),
        StatusCode::OK
    );
    // The key is the peer's: 127.0.0.2 is spent, 127.0.0.3 is not; the
    // refused request never reached the handler.
    let refused = answer(a.get(url("/counted"))).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.headers()["retry-after"], "1200");
    let b = client_from("127.0.0.3");
    let other = answer(b.get(url("/counted"))).await;
    assert_eq!(other.status(), StatusCode::OK);
    assert_eq!(other.headers()["ratelimit"], "\"per-ip\";r=2;t=1200");
    assert_eq!(reached.load(Ordering::Relaxed), 2);
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    assert_eq!(everyone.snapshot(&ip("127.0.0.2")).available, 0);
    assert_eq!(everyone.snapshot(&ip("127.0.0.3")).available, 2);
}

#[tokio::test]
async fn async_policies_decide_later_and_can_be_unavailable() {
    let (remote, _) = scripted_remote(Duration::from_millis(1), |n| {
        format!("remote limiter unreachable (asked for {n})")
    });
    let local = Arc::new(TokenBucket::new(10, Rate::per_hour(10)).unwrap());
    let layer = ThrottleLayer::builder(Global)
        .policy(remote)
        .policy(Limit::shared("local", Arc::clone(&local)).unwrap())
        .build();
    let addr = serve(app().layer(layer)).await;
    let url = format!("http://{addr}/");
    let first = reqwest::get(&url).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    // The remote reports no quota: only the local policy has members.
    assert_eq!(first.headers()["ratelimit-policy"], "\"local\";q=10");
    let second = reqwest::get(&url).await.unwrap();
    assert_eq!(second.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        second.headers()["retry-after"],
        "1",
        "1 ms rounds up to 1 s, never 0"
    );
    let third = reqwest::get(&url).await.unwrap();
    assert_eq!(third.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_body_contains(third, "remote limiter unreachable").await;
    // The local policy, though added second, was asked first, every time: a
    // remote decision is awaited after every in-process one, and an awaited
    // refusal leaves what was admitted before it.
    assert_eq!(local.snapshot().available, 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shaped_request_waits_within_its_bound() {
    // Real clock: three requests 50 ms apart fit in a 1 s bound whatever the
    // scheduler does (a late request only waits less).
    let bucket = TokenBucket::new(1, Rate::per_second(20)).unwrap();
    let layer = ThrottleLayer::builder(Global)
        .policy(Shaped::new("smooth", bucket, Duration::from_secs(1)).unwrap())
        .build();
    let addr = serve(app().layer(layer)).await;
    three_at_once_pass(addr).await;

    // A bound of zero on a frozen clock: the second request is refused with
    // the exact wait rounded up, and books nothing.
    let clock = ManualClock::new();
    let bucket = Arc::new(TokenBucket::with_clock(1, Rate::per_minute(1), clock).unwrap());
    let layer = ThrottleLayer::builder(Global)
        .policy(Shaped::shared("strict", Arc::clone(&bucket), Duration::ZERO).unwrap())
        .build();
    let addr = serve(app().layer(layer)).await;
    one_passes_then_a_minute_to_wait(addr).await;
    assert_eq!(bucket.snapshot().until_full, Duration::from_secs(60));
}

/// Three requests to `addr` at once: all pass, each with the fields.
async fn three_at_once_pass(addr: SocketAddr) {
    let client = reqwest::Client::new();
    let requests = (0..3).map(|_| client.get(format!("http://{addr}/")).send());
    for response in futures_join_all(requests).await {
        assert_eq!(response.status(), StatusCode::OK);
        assert!(response.headers().get("ratelimit").is_some());
    }
}

/// Two requests to `addr`, on a frozen clock that grants one a minute: the
/// first passes, the second is refused at once with the whole minute to wait.
async fn one_passes_then_a_minute_to_wait(addr: SocketAddr) {
    assert_eq!(root_status(addr).await, StatusCode::OK);
    let refused = reqwest::get(format!("http://{addr}/")).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.headers()["retry-after"], "60");
}

/// Polls `cond` every 10 ms for up to 20 s: waits for an event the server
/// causes, asserting nothing about how long it takes.
async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..2000 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("never happened: {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_hangs_up_gives_its_reservation_back() {
    let clock = ManualClock::new();
    // One permit per 10 s; requests may wait up to a minute.
    let bucket =
        Arc::new(TokenBucket::with_clock(1, Rate::new(1, Duration::from_secs(10)), clock).unwrap());
    let layer = ThrottleLayer::builder(Global)
        .policy(Shaped::shared("queue", Arc::clone(&bucket), Duration::from_secs(60)).unwrap())
        .build();
    let addr = serve(app().layer(layer)).await;
    assert_eq!(root_status(addr).await, StatusCode::OK);
    assert_eq!(bucket.snapshot().until_full, Duration::from_secs(10));

    // A client asks, is held (its reservation moves the bucket 10 s further
    // out) and hangs up.
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET / HTTP/1.1\r\nhost: test\r\n\r\n")
        .await
        .unwrap();
    eventually("the request reserved", || {
        bucket.snapshot().until_full == Duration::from_secs(20)
    })
    .await;
    drop(stream);
    // The server drops the request's future; the wait cancels its reservation.
    eventually("the reservation came back", || {
        bucket.snapshot().until_full == Duration::from_secs(10)
    })
    .await;

    // A client that stays is still held: the queue is intact behind it.
    let client = reqwest::Client::new();
    let held = tokio::spawn(client.get(format!("http://{addr}/")).send());
    eventually("the second waiter reserved", || {
        bucket.snapshot().until_full == Duration::from_secs(20)
    })
    .await;
    assert!(!held.is_finished());
    held.abort();
}

#[test]
fn extractors_are_usable_outside_a_server() {
    let (parts, ()) = http::Request::get("/").body(()).unwrap().into_parts();
    assert_eq!(Global.extract(&parts), Ok(()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_of_limits_refund_what_a_later_member_denied() {
    use tollgate::AllOf;
    use tollgate::keyed::WindowConfig;
    use tollgate_tower::AllOfLimit;

    let clock = ManualClock::new();
    let global = Arc::new(TokenBucket::with_clock(10, Rate::per_hour(10), clock.clone()).unwrap());
    let per_ip = per_ip(5, Rate::per_hour(5), &clock);
    let logins = Arc::new(
        Keyed::<IpAddr, tollgate::FixedWindow<ManualClock>>::with_clock(
            WindowConfig::new(Rate::per_hour(2)).unwrap(),
            clock.clone(),
        ),
    );
    let (g, p, l) = (
        Arc::clone(&global),
        Arc::clone(&per_ip),
        Arc::clone(&logins),
    );
    let login = AllOfLimit::new(["global", "per-ip", "login"], move |ip: &IpAddr, n| {
        AllOf::new((&*g, p.for_key(ip), l.for_key(ip))).try_acquire_n_reporting(n)
    })
    .unwrap();
    let layer = ThrottleLayer::builder(PeerIp)
        .route(login_route(), login)
        .build();
    let addr = serve(app().layer(layer)).await;
    let client = reqwest::Client::new();

    let first = post_login(&client, addr).await;
    assert_eq!(first.status(), StatusCode::OK);
    // The binding member (least left) under its own name.
    assert_eq!(first.headers()["ratelimit-policy"], "\"login\";q=2");
    assert_eq!(
        parse_ratelimit(first.headers()["ratelimit"].to_str().unwrap(), "login").0,
        1
    );
    assert_eq!(post_login(&client, addr).await.status(), StatusCode::OK);
    for _ in 0..3 {
        let denied = post_login(&client, addr).await;
        assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(denied.headers()["ratelimit-policy"], "\"login\";q=2");
        assert_body_contains(denied, r#""violated-policies":["login"]"#).await;
    }
    // Two logins passed; the three denied by the last member were refunded
    // to the global and per-IP buckets (nothing raced them here).
    assert_eq!(global.snapshot().available, 8);
    let ip: IpAddr = "127.0.0.1".parse().unwrap();
    assert_eq!(per_ip.snapshot(&ip).available, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_per_key_policy_can_wait_for_its_key() {
    // Real clock: one permit per key, then 20 a second. Three concurrent
    // requests from one address all pass within a 30 s bound (they need
    // 100 ms of the limiter's time; the bound only has to outlast a stall).
    let per_ip =
        Keyed::<IpAddr, TokenBucket>::new(BucketConfig::new(1, Rate::per_second(20)).unwrap());
    let layer = ThrottleLayer::builder(PeerIp)
        .policy(
            PerKey::new("per-ip", per_ip)
                .unwrap()
                .wait_up_to(Duration::from_secs(30)),
        )
        .build();
    let addr = serve(app().layer(layer)).await;
    three_at_once_pass(addr).await;

    // A frozen clock and a wait beyond the bound: refused at once with the
    // exact retry-after, nothing spent.
    let clock = ManualClock::new();
    let limiter = per_ip_waiting(&clock);
    let layer = ThrottleLayer::builder(PeerIp)
        .policy(
            PerKey::shared("per-ip", Arc::clone(&limiter))
                .unwrap()
                .wait_up_to(Duration::from_secs(5)),
        )
        .build();
    let addr = serve(app().layer(layer)).await;
    one_passes_then_a_minute_to_wait(addr).await;
    let ip: IpAddr = "127.0.0.1".parse().unwrap();
    assert_eq!(limiter.snapshot(&ip).until_full, Duration::from_secs(60));
}

fn per_ip_waiting(clock: &ManualClock) -> Arc<PerIp> {
    per_ip(1, Rate::per_minute(1), clock)
}
