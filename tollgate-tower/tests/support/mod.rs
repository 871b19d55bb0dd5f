//! What the HTTP tests share: a real axum server on a loopback port and
//! clients bound to other loopback addresses (all of 127/8 is loopback on
//! Linux), so that each client is its own peer address.

#![allow(dead_code)]

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::get;
use http::StatusCode;
use tokio::net::TcpListener;
use tollgate::{Denied, LimitHistory};
use tollgate_tower::{AsyncLimit, Policy, PolicyOutcome};

/// Serves `app` on a free loopback port with peer addresses; returns the address.
pub async fn serve(app: Router) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    addr
}

/// A client whose requests come from `ip`.
pub fn client_from(ip: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .local_address(ip.parse::<IpAddr>().unwrap())
        .build()
        .unwrap()
}

/// Sends `request` and waits for its answer.
pub async fn answer(request: reqwest::RequestBuilder) -> reqwest::Response {
    request.send().await.unwrap()
}

/// Decrements the handler's count however the request ends.
struct InFlight(Arc<AtomicUsize>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A service that slows with concurrency past a knee, as an overloaded
/// backend does: a request that finds `n` in flight (itself included,
/// counted by the handler) when the knee is `k` takes
/// `base · max(1, n / k)²`, fixed when it starts. The knee is read per
/// request, so a test may move it.
pub fn slow_service(base: Duration, knee: Arc<AtomicUsize>) -> Router {
    let in_flight = Arc::new(AtomicUsize::new(0));
    Router::new().route(
        "/",
        get(move || {
            let in_flight = Arc::clone(&in_flight);
            let knee = knee.load(Ordering::SeqCst) as f64;
            async move {
                let n = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                let _guard = InFlight(in_flight);
                let factor = (n as f64 / knee).max(1.0).powi(2);
                tokio::time::sleep(base.mul_f64(factor)).await;
                "done"
            }
        }),
    )
}

/// The limits an adaptive limit's history recorded, oldest first.
pub fn recent_limits(history: Option<&LimitHistory>) -> Vec<u32> {
    history.unwrap().recent().iter().map(|c| c.limit).collect()
}

/// The latencies of 40 requests to `addr`'s `/`, sent one at a time: the
/// service unloaded, in the order they were sent.
pub async fn unloaded_latencies(addr: SocketAddr) -> Vec<Duration> {
    let client = reqwest::Client::new();
    let mut latencies = Vec::new();
    for _ in 0..40 {
        let sent = Instant::now();
        let response = answer(client.get(format!("http://{addr}/"))).await;
        assert_eq!(response.status(), StatusCode::OK);
        response.bytes().await.unwrap();
        latencies.push(sent.elapsed());
    }
    latencies
}

/// One answered request of [`drive`]: when it was sent and answered (since
/// the start) and whether it was admitted.
#[derive(Debug, Clone, Copy)]
pub struct Answer {
    pub sent: Duration,
    pub answered: Duration,
    pub admitted: bool,
}

/// `clients` loops, each sending its next request to `url` when the last is
/// answered (after `backoff` if it was shed with a `503`), until `end` after
/// `start`.
pub async fn drive(
    url: &str,
    clients: usize,
    backoff: Duration,
    start: Instant,
    end: Duration,
) -> Vec<Answer> {
    let client = reqwest::Client::new();
    let loops: Vec<_> = (0..clients)
        .map(|_| {
            let (client, url) = (client.clone(), url.to_owned());
            tokio::spawn(async move {
                let mut answers = Vec::new();
                while start.elapsed() < end {
                    let sent = start.elapsed();
                    let response = answer(client.get(&url)).await;
                    let status = response.status();
                    response.bytes().await.unwrap();
                    let answered = start.elapsed();
                    let admitted = match status {
                        StatusCode::OK => true,
                        StatusCode::SERVICE_UNAVAILABLE => false,
                        other => panic!("unexpected status {other}"),
                    };
                    answers.push(Answer {
                        sent,
                        answered,
                        admitted,
                    });
                    if !admitted {
                        tokio::time::sleep(backoff).await;
                    }
                }
                answers
            })
        })
        .collect();
    let mut all = Vec::new();
    for client in loops {
        all.extend(client.await.unwrap());
    }
    all
}

/// The asynchronous policy "remote", deciding on a later poll (the layer's
/// deferred path): it admits the first request, refuses the second with
/// `retry_after`, and cannot decide from the third on, for the reason
/// `unavailable` gives for the permits asked. The counter is how many
/// requests it was asked about.
pub fn scripted_remote(
    retry_after: Duration,
    unavailable: fn(u32) -> String,
) -> (impl Policy<()>, Arc<AtomicUsize>) {
    let asked = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&asked);
    let remote = AsyncLimit::new("remote", move |_: &(), n: u32| {
        let count = seen.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            tokio::task::yield_now().await;
            match count {
                1 => PolicyOutcome::Admitted(None),
                2 => PolicyOutcome::Denied {
                    denied: Denied::RetryAfter(retry_after),
                    snapshot: None,
                },
                _ => PolicyOutcome::Unavailable(unavailable(n)),
            }
        }
    })
    .unwrap();
    (remote, asked)
}
