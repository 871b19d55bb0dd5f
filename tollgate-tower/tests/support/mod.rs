//! What the HTTP tests share: a real axum server on a loopback port and
//! clients bound to other loopback addresses (all of 127/8 is loopback on
//! Linux), so that each client is its own peer address.

#![allow(dead_code)]

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use tokio::net::TcpListener;
use tollgate::LimitHistory;

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
