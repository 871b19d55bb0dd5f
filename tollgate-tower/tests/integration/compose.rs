//! Several policies on one route, as a user meets them: a real axum server on
//! a loopback port, real HTTP clients from distinct loopback addresses, two
//! runtime threads serving. The limiters run on a `ManualClock` that nobody
//! moves, so nothing refills during a test: every count below is what the
//! policies' all-or-nothing guarantee dictates, whatever the scheduler does.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::routing::get;
use http::StatusCode;
use tollgate::keyed::{BucketConfig, Keyed};
use tollgate::{ManualClock, Rate, RateLimiter, SlidingLog, TokenBucket};
use tollgate_tower::{AsyncLimit, Limit, PeerIp, PerKey, PolicyOutcome, Route, ThrottleLayer};

use crate::support;
use support::{answer, client_from, serve};

type PerIp = Keyed<IpAddr, TokenBucket<ManualClock>>;
type Bucket = TokenBucket<ManualClock>;

fn app() -> Router {
    Router::new()
        .route("/search", get(|| async { "results" }))
        .route("/", get(|| async { "ok" }))
}

fn per_ip(capacity: u32, clock: &ManualClock) -> Arc<PerIp> {
    Arc::new(PerIp::with_clock(
        BucketConfig::new(capacity, Rate::per_second(capacity)).unwrap(),
        clock.clone(),
    ))
}

fn bucket(capacity: u32, clock: &ManualClock) -> Arc<Bucket> {
    Arc::new(Bucket::with_clock(capacity, Rate::per_second(capacity), clock.clone()).unwrap())
}

/// The orders a user can declare a per-IP limit and a global one for
/// `/search` in.
#[derive(Debug, Clone, Copy)]
enum Layout {
    /// `.route("/search", global).policy(per_ip)`: the docs' layout.
    RouteThenEvery,
    /// `.policy(per_ip).route("/search", global)`.
    EveryThenRoute,
    /// `.policy(global).policy(per_ip)`: both for every request.
    GlobalFirst,
    /// `.policy(per_ip).policy(global)`.
    PerIpFirst,
}

const LAYOUTS: [Layout; 4] = [
    Layout::RouteThenEvery,
    Layout::EveryThenRoute,
    Layout::GlobalFirst,
    Layout::PerIpFirst,
];

fn layer(
    layout: Layout,
    per_ip: &Arc<PerIp>,
    global: &Arc<Bucket>,
    cost: fn(&http::request::Parts) -> u32,
) -> ThrottleLayer<PeerIp> {
    let per_ip = || PerKey::shared("per-ip", Arc::clone(per_ip)).unwrap();
    let global = || Limit::shared("global", Arc::clone(global)).unwrap();
    let search = || Route::exact("/search");
    let builder = ThrottleLayer::builder(PeerIp).cost(cost);
    match layout {
        Layout::RouteThenEvery => builder.route(search(), global()).policy(per_ip()),
        Layout::EveryThenRoute => builder.policy(per_ip()).route(search(), global()),
        Layout::GlobalFirst => builder.policy(global()).policy(per_ip()),
        Layout::PerIpFirst => builder.policy(per_ip()).policy(global()),
    }
    .build()
}

fn one(_: &http::request::Parts) -> u32 {
    1
}

/// `app` served behind `layout`'s layer of a per-IP limit and a global one
/// of these capacities, on a clock nobody moves; returns the limits and the
/// address.
async fn serve_layout(
    layout: Layout,
    per_ip_capacity: u32,
    global_capacity: u32,
    cost: fn(&http::request::Parts) -> u32,
) -> (Arc<PerIp>, Arc<Bucket>, SocketAddr) {
    let clock = ManualClock::new();
    let per_ip = per_ip(per_ip_capacity, &clock);
    let global = bucket(global_capacity, &clock);
    let addr = serve(app().layer(layer(layout, &per_ip, &global, cost))).await;
    (per_ip, global, addr)
}

/// Sends `count` requests to `url` from `client`, `concurrency` at a time;
/// returns how many were admitted (200) and refused with 429.
async fn send(
    client: reqwest::Client,
    url: String,
    count: usize,
    concurrency: usize,
) -> (usize, usize) {
    let next = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..concurrency)
        .map(|_| {
            let (client, url, next) = (client.clone(), url.clone(), Arc::clone(&next));
            tokio::spawn(async move {
                let (mut ok, mut throttled) = (0, 0);
                while next.fetch_add(1, Ordering::Relaxed) < count {
                    match answer(client.get(&url)).await.status() {
                        StatusCode::OK => ok += 1,
                        StatusCode::TOO_MANY_REQUESTS => throttled += 1,
                        other => panic!("unexpected status {other}"),
                    }
                }
                (ok, throttled)
            })
        })
        .collect();
    let mut total = (0, 0);
    for task in tasks {
        let (ok, throttled) = task.await.unwrap();
        total = (total.0 + ok, total.1 + throttled);
    }
    total
}

/// A client flooding `/search` far past its per-IP limit, while a
/// well-behaved client sends its 60 requests at the same time: the flooder's
/// refused requests never reach the global limit, so the global budget —
/// room for the flooder's admitted requests and the victim's, not for the
/// flood — serves the victim in full. In every declaration order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooder_held_by_its_own_limit_never_spends_the_global_one() {
    for layout in LAYOUTS {
        let (_, global, addr) = serve_layout(layout, 60, 150, one).await;
        let url = format!("http://{addr}/search");

        let flood = tokio::spawn(send(client_from("127.0.0.2"), url.clone(), 1_000, 8));
        let victim = send(client_from("127.0.0.3"), url.clone(), 60, 1).await;
        let flood = flood.await.unwrap();

        assert_eq!(victim, (60, 0), "{layout:?}: the victim was refused");
        // The flood was real: its per-IP limit refused most of it.
        assert_eq!(flood, (60, 940), "{layout:?}");
        // The global limit was charged for the 120 admitted requests only.
        assert_eq!(global.snapshot().available, 30, "{layout:?}");
    }
}

/// A request the global limit refuses after the per-IP limit admitted it
/// costs the client nothing: the per-IP admission is given back. In every
/// declaration order, and the `429` names the global policy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_refused_by_a_later_policy_is_charged_by_none() {
    for layout in LAYOUTS {
        let (per_ip, global, addr) = serve_layout(layout, 10, 5, one).await;
        let url = format!("http://{addr}/search");

        assert_eq!(
            send(client_from("127.0.0.4"), url.clone(), 5, 1).await,
            (5, 0)
        );
        // The global budget is spent: the next client is refused by it.
        let client = client_from("127.0.0.5");
        for _ in 0..3 {
            let refused = answer(client.get(&url)).await;
            assert_eq!(
                refused.status(),
                StatusCode::TOO_MANY_REQUESTS,
                "{layout:?}"
            );
            let body = refused.text().await.unwrap();
            assert!(
                body.contains(r#""violated-policies":["global"]"#),
                "{layout:?}: {body}"
            );
        }
        let refused_ip: IpAddr = "127.0.0.5".parse().unwrap();
        assert_eq!(
            per_ip.snapshot(&refused_ip).available,
            10,
            "{layout:?}: charged"
        );
        assert_eq!(global.snapshot().available, 0, "{layout:?}");
    }
}

/// A request costing more than one policy can ever grant is refused with
/// `403` before any policy is asked: every other policy's quota is untouched,
/// whichever policy cannot hold it and in every declaration order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_can_never_pass_spends_nothing() {
    fn cost(parts: &http::request::Parts) -> u32 {
        parts
            .headers
            .get("x-cost")
            .and_then(|v| v.to_str().ok()?.parse().ok())
            .unwrap_or(1)
    }
    for layout in LAYOUTS {
        let (per_ip, global, addr) = serve_layout(layout, 20, 1_000, cost).await;
        let client = client_from("127.0.0.6");
        let ip: IpAddr = "127.0.0.6".parse().unwrap();
        let costing = |cost: &str| {
            answer(
                client
                    .get(format!("http://{addr}/search"))
                    .header("x-cost", cost),
            )
        };

        // Above the per-IP capacity, within the global one.
        let huge = costing("1000").await;
        assert_eq!(huge.status(), StatusCode::FORBIDDEN, "{layout:?}");
        assert!(huge.headers().get("retry-after").is_none());
        assert_eq!(huge.headers()["ratelimit-policy"], "\"per-ip\";q=20");
        let body = huge.text().await.unwrap();
        assert!(body.contains("at most 20 can ever be granted"), "{body}");
        assert_eq!(
            global.snapshot().available,
            1_000,
            "{layout:?}: global charged"
        );
        assert_eq!(per_ip.snapshot(&ip).available, 20, "{layout:?}");

        // Above both: refused all the same, nothing spent.
        let larger = costing("5000").await;
        assert_eq!(larger.status(), StatusCode::FORBIDDEN, "{layout:?}");
        assert_eq!(global.snapshot().available, 1_000, "{layout:?}");
        assert_eq!(per_ip.snapshot(&ip).available, 20, "{layout:?}");

        // Within both: admitted and charged by both.
        let fits = costing("20").await;
        assert_eq!(fits.status(), StatusCode::OK, "{layout:?}");
        assert_eq!(global.snapshot().available, 980, "{layout:?}");
        assert_eq!(per_ip.snapshot(&ip).available, 0, "{layout:?}");
    }
}

/// A remote policy added first is still asked last: a request refused by
/// the per-IP limit never reaches it, so the remote side sees exactly the
/// requests every in-process policy admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_policy_is_asked_only_after_every_local_one_admitted() {
    let clock = ManualClock::new();
    let per_ip = per_ip(7, &clock);
    let log = Arc::new(SlidingLog::with_clock(Rate::per_hour(100), clock.clone()).unwrap());
    let calls = Arc::new(AtomicUsize::new(0));
    let remote = {
        let calls = Arc::clone(&calls);
        AsyncLimit::new("remote", move |_: &IpAddr, _| {
            calls.fetch_add(1, Ordering::Relaxed);
            async { PolicyOutcome::Admitted(None) }
        })
        .unwrap()
    };
    let layer = ThrottleLayer::builder(PeerIp)
        .policy(remote)
        .route(
            Route::exact("/search"),
            Limit::shared("log", Arc::clone(&log)).unwrap(),
        )
        .policy(PerKey::shared("per-ip", Arc::clone(&per_ip)).unwrap())
        .build();
    let addr: SocketAddr = serve(app().layer(layer)).await;
    let (ok, throttled) = send(
        client_from("127.0.0.7"),
        format!("http://{addr}/search"),
        50,
        4,
    )
    .await;
    assert_eq!((ok, throttled), (7, 43));
    assert_eq!(calls.load(Ordering::Relaxed), 7);
    assert_eq!(log.snapshot().available, 93);
}

/// `ThrottleLayer::serve` puts the layer in front of a whole router with peer
/// addresses, so `PeerIp` keys a real client by its address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_puts_the_layer_in_front_of_the_router_with_peer_addresses() {
    let clock = ManualClock::new();
    let per_ip = per_ip(1, &clock);
    let layer = ThrottleLayer::builder(PeerIp)
        .policy(PerKey::shared("per-ip", Arc::clone(&per_ip)).unwrap())
        .build();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, layer.serve(app())).await.unwrap() });
    let url = format!("http://{addr}/search");
    for ip in ["127.0.0.8", "127.0.0.9"] {
        let client = client_from(ip);
        let first = answer(client.get(&url)).await;
        assert_eq!(first.status(), StatusCode::OK);
        assert_eq!(first.text().await.unwrap(), "results");
        assert_eq!(
            answer(client.get(&url)).await.status(),
            StatusCode::TOO_MANY_REQUESTS
        );
    }
    assert_eq!(
        per_ip
            .snapshot(&"127.0.0.8".parse::<IpAddr>().unwrap())
            .available,
        0
    );
}
