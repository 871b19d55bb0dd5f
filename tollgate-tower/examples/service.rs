//! An axum service with three limits, behind tollgate-tower:
//!
//! - every request: 20 at once per client address, then 10 a second;
//! - `POST /login`: 5 a minute per address, exactly (a sliding log: never a
//!   6th login in any 60 s);
//! - `GET /search`: 30 a second for all clients together.
//!
//! ```sh
//! cargo run --release -p tollgate-tower --example service                # serve on 127.0.0.1:3000
//! cargo run --release -p tollgate-tower --example service -- --self-test # drive it over loopback, check, exit
//! ```
//!
//! While it serves, try `curl -i -X POST localhost:3000/login` six times.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::http::Method;
use axum::routing::{get, post};
use tokio::net::TcpListener;
use tollgate::LogConfig;
use tollgate::keyed::{BucketConfig, Keyed};
use tollgate::{Rate, SlidingLog, TokenBucket};
use tollgate_tower::{Limit, PeerIp, PerKey, PolicyName, Route, ThrottleLayer};

type Error = Box<dyn std::error::Error>;

/// The per-address bucket, kept so that the self-test can look at it.
type PerIp = Arc<Keyed<IpAddr, TokenBucket>>;

/// The three limits. A request must pass its route's policies and every
/// `.policy(...)`, all or nothing: a request one limit refuses gives back
/// what the others took, whatever order they are declared in. (The
/// self-test refills per hour instead of per second, so that nothing refills
/// while it counts.)
fn limits(self_test: bool) -> Result<(ThrottleLayer<PeerIp>, PerIp), Error> {
    let per = |n| {
        if self_test {
            Rate::per_hour(n)
        } else {
            Rate::per_second(n)
        }
    };
    let per_ip: PerIp = Arc::new(Keyed::new(BucketConfig::new(20, per(10))?));
    let logins = Keyed::<IpAddr, SlidingLog>::new(LogConfig::new(Rate::per_minute(5))?);
    let search = SlidingLog::new(if self_test {
        Rate::per_hour(3)
    } else {
        per(30)
    })?;

    // A name with a window is advertised as `RateLimit-Policy: "login";q=5;w=60`.
    let name =
        |name, secs| Ok::<_, Error>(PolicyName::new(name)?.window(Duration::from_secs(secs)));
    let layer = ThrottleLayer::builder(PeerIp)
        .route(
            Route::exact("/login").method(Method::POST),
            PerKey::new(name("login", 60)?, logins)?,
        )
        .route(
            Route::exact("/search"),
            Limit::new(name("search", 1)?, search)?,
        )
        .policy(PerKey::shared(name("per-ip", 2)?, Arc::clone(&per_ip))?)
        .build();
    Ok((layer, per_ip))
}

fn router() -> Router {
    Router::new()
        .route("/", get(|| async { "hello\n" }))
        .route("/search", get(|| async { "results\n" }))
        .route("/login", post(|| async { "welcome\n" }))
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let self_test = std::env::args().any(|arg| arg == "--self-test");
    let (layer, per_ip) = limits(self_test)?;
    let listener = TcpListener::bind(if self_test {
        "127.0.0.1:0"
    } else {
        "127.0.0.1:3000"
    })
    .await?;
    let addr = listener.local_addr()?;
    // The layer in front of the whole router, with each request's peer address.
    let server = axum::serve(listener, layer.serve(router()));
    if !self_test {
        println!("serving on http://{addr}");
        return Ok(server.await?);
    }
    tokio::spawn(async move { server.await });
    check(addr, &per_ip).await
}

/// Sends `count` requests; returns their statuses and prints what came back.
async fn send(
    addr: SocketAddr,
    method: Method,
    path: &str,
    count: usize,
) -> Result<Vec<u16>, Error> {
    let client = reqwest::Client::new();
    let mut statuses = Vec::new();
    for _ in 0..count {
        let response = client
            .request(method.clone(), format!("http://{addr}{path}"))
            .send()
            .await?;
        let header = |name| response.headers().get(name).map_or(Ok("-"), |v| v.to_str());
        let (status, limit, retry) = (
            response.status(),
            header("ratelimit")?,
            header("retry-after")?,
        );
        println!("{method} {path}: {status}  RateLimit: {limit}  Retry-After: {retry}");
        // Every answer says where it stands; a refusal names the limit and when to retry.
        assert!(response.headers().contains_key("ratelimit-policy"));
        if status == 429 {
            let secs: u64 = retry.parse()?;
            assert!(secs >= 1, "Retry-After: {secs}");
        }
        statuses.push(status.as_u16());
    }
    Ok(statuses)
}

/// The self-test: real HTTP requests over loopback, from one address.
async fn check(addr: SocketAddr, per_ip: &PerIp) -> Result<(), Error> {
    // Five logins a minute: the 6th and 7th are refused.
    let logins = send(addr, Method::POST, "/login", 7).await?;
    assert_eq!(logins, [200, 200, 200, 200, 200, 429, 429]);
    // Search (3 an hour here, for everyone): the 4th and 5th are refused.
    let searches = send(addr, Method::GET, "/search", 5).await?;
    assert_eq!(searches, [200, 200, 200, 429, 429]);
    // The four refused requests took nothing from the per-address bucket:
    // 20 − 5 logins − 3 searches.
    let ip = addr.ip();
    assert_eq!(per_ip.snapshot(&ip).available, 12);
    // The per-address bucket's last 12, then a refusal on every route.
    assert!(
        send(addr, Method::GET, "/", 12)
            .await?
            .iter()
            .all(|&s| s == 200)
    );
    assert_eq!(send(addr, Method::GET, "/", 1).await?, [429]);
    assert_eq!(per_ip.snapshot(&ip).available, 0);
    println!("self-test passed: each limit refused in turn, refused requests took nothing");
    Ok(())
}
