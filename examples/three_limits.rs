//! An axum service with three limits, written with the tollgate core alone:
//! a global token bucket, a per-IP token bucket, and an exact per-IP login
//! limit (a sliding log, 5 a minute). Every request is one decision through
//! `AllOf` — all limits or none, so a login denied by the log gives its
//! permits back to both buckets — and the `RateLimit` / `RateLimit-Policy` /
//! `Retry-After` headers come from that decision's report: no second lookup,
//! no hand-written refund.
//!
//! ```sh
//! cargo run --release --example three_limits                # serve on 127.0.0.1:3000
//! cargo run --release --example three_limits -- --self-test # drive it over loopback, check, exit
//! ```

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tollgate::RateLimiter as _;

// ---- the glue: limits, one decision per request, headers (counted in docs/all_of.md) ----
use tollgate::keyed::{BucketConfig, Keyed, LogConfig};
use tollgate::{AllOf, Blocked, Rate, SlidingLog, Tightest, TokenBucket};

struct Limits {
    global: TokenBucket,
    per_ip: Keyed<IpAddr, TokenBucket>,
    // One exact log per IP, evicted once its window holds nothing.
    logins: Keyed<IpAddr, SlidingLog>,
}

const POLICIES: [&str; 3] = ["global", "per-ip", "login"];

async fn limit(
    State(limits): State<Arc<Limits>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    request: Request,
    next: Next,
) -> Response {
    let ip = peer.ip();
    let per_ip = limits.per_ip.for_key(&ip);
    let decision = if request.uri().path() == "/login" {
        let login = limits.logins.for_key(&ip);
        AllOf::new((&limits.global, per_ip, login)).try_acquire_reporting()
    } else {
        AllOf::new((&limits.global, per_ip)).try_acquire_reporting()
    };
    let (mut response, member, snapshot) = match decision {
        Ok(Tightest {
            member, snapshot, ..
        }) => (next.run(request).await, member, snapshot),
        Err(Blocked {
            member, rejection, ..
        }) => {
            let mut response = StatusCode::TOO_MANY_REQUESTS.into_response();
            if let Some(wait) = rejection.denied.retry_after() {
                // Whole seconds, rounded up: never "Retry-After: 0".
                let secs = wait.as_nanos().div_ceil(1_000_000_000);
                response
                    .headers_mut()
                    .insert("retry-after", HeaderValue::from(secs as u64));
            }
            (response, member, rejection.snapshot)
        }
    };
    let name = POLICIES[member];
    let reset = snapshot.until_full.as_nanos().div_ceil(1_000_000_000);
    let headers = response.headers_mut();
    let policy = format!("\"{name}\";q={}", snapshot.capacity);
    let state = format!("\"{name}\";r={};t={reset}", snapshot.available);
    headers.insert(
        "ratelimit-policy",
        HeaderValue::from_str(&policy).expect("ascii"),
    );
    headers.insert("ratelimit", HeaderValue::from_str(&state).expect("ascii"));
    response
}
// ---- end of the glue ----

fn app(limits: Arc<Limits>) -> axum::Router {
    axum::Router::new()
        .route("/", get(|| async { "hello\n" }))
        .route("/login", post(|| async { "welcome\n" }))
        .layer(middleware::from_fn_with_state(limits, limit))
}

/// The service's limits: 1,000 a second overall, 10 a second per IP in bursts
/// of 20. The self-test refills both buckets per hour instead, so that no
/// refill during the test can make up for a refund that did not happen.
fn limits(self_testing: bool) -> Arc<Limits> {
    let (global, per_ip) = if self_testing {
        (Rate::per_hour(1_000), Rate::per_hour(10))
    } else {
        (Rate::per_second(1_000), Rate::per_second(10))
    };
    Arc::new(Limits {
        global: TokenBucket::new(1_000, global).expect("a valid bucket"),
        per_ip: Keyed::new(BucketConfig::new(20, per_ip).expect("a valid bucket")),
        logins: Keyed::new(LogConfig::new(Rate::per_minute(5)).expect("a valid log")),
    })
}

/// One HTTP/1.1 request over a fresh loopback connection: the status and the
/// headers (lower-cased names).
async fn call(addr: SocketAddr, method: &str, path: &str) -> (u16, HashMap<String, String>) {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.expect("send");
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await.expect("receive");
    let head = raw.split("\r\n\r\n").next().unwrap_or_default();
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|line| line.split(' ').nth(1))
        .and_then(|code| code.parse().ok())
        .expect("a status line");
    let headers = lines
        .filter_map(|line| line.split_once(": "))
        .map(|(name, value)| (name.to_ascii_lowercase(), value.to_string()))
        .collect();
    (status, headers)
}

/// Seven logins from one address: five pass, two are denied by the login log
/// with a `Retry-After`, and neither bucket keeps a permit for the denied
/// ones: after three more plain requests the per-IP bucket has exactly
/// 20 − 5 − 3 left and the global one 1000 − 8 (refilling per hour, neither
/// gains a permit in the seconds the test takes).
async fn self_test(addr: SocketAddr, limits: &Limits) {
    let mut statuses = Vec::new();
    for attempt in 1..=7 {
        let (status, headers) = call(addr, "POST", "/login").await;
        println!(
            "login {attempt}: {status}  RateLimit: {}  Retry-After: {}",
            headers.get("ratelimit").map_or("-", String::as_str),
            headers.get("retry-after").map_or("-", String::as_str)
        );
        assert!(headers.contains_key("ratelimit") && headers.contains_key("ratelimit-policy"));
        if status == 429 {
            let retry: u64 = headers["retry-after"].parse().expect("whole seconds");
            assert!((1..=60).contains(&retry), "Retry-After: {retry}");
            assert!(headers["ratelimit"].starts_with("\"login\";r=0"));
        }
        statuses.push(status);
    }
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429, 429]);
    for _ in 0..3 {
        let (status, headers) = call(addr, "GET", "/").await;
        assert_eq!(status, 200);
        println!("GET /: {status}  RateLimit: {}", headers["ratelimit"]);
    }
    let ip: IpAddr = addr.ip();
    // Time refills the buckets while this runs; at 10 and 1,000 per second
    // over a few milliseconds, at most a permit or two.
    let per_ip = limits.per_ip.snapshot(&ip).available;
    let global = limits.global.snapshot().available;
    println!("per-IP bucket: {per_ip} of 20 left; global: {global} of 1000 left");
    assert!(
        (12..=20).contains(&per_ip),
        "the denied logins kept per-IP permits: {per_ip} left"
    );
    assert!(
        global >= 992,
        "the denied logins kept global permits: {global} left"
    );
    println!("self-test passed: 5 of 7 logins admitted, denied logins refunded both buckets");
}

#[tokio::main]
async fn main() {
    let self_testing = std::env::args().any(|arg| arg == "--self-test");
    let limits = limits(self_testing);
    let bind = if self_testing {
        "127.0.0.1:0"
    } else {
        "127.0.0.1:3000"
    };
    let listener = TcpListener::bind(bind).await.expect("bind");
    let addr = listener.local_addr().expect("an address");
    let service = app(limits.clone()).into_make_service_with_connect_info::<SocketAddr>();
    let server = tokio::spawn(async move { axum::serve(listener, service).await });
    if self_testing {
        self_test(addr, &limits).await;
        server.abort();
    } else {
        println!("listening on http://{addr} (POST /login: 5 a minute per IP)");
        server.await.expect("the server task").expect("the server");
    }
}
