//! A service whose limits can be watched: axum behind a throttle layer (a
//! per-key burst, a global budget and, given `--redis URL`, a limit per key
//! shared through Redis) and an adaptive concurrency layer, exporting every
//! tollgate metric on `/metrics` in Prometheus's text format through
//! `metrics-exporter-prometheus`.
//!
//! `cargo run --release -p tollgate-tower --features metrics,redis --example watched -- --port 3000 --redis redis://127.0.0.1:6379/`
//! then `curl -H 'x-api-key: a' localhost:3000/` a few times and
//! `curl localhost:3000/metrics`. `scripts/prometheus-check` scrapes it with
//! a real Prometheus and checks the counters against the traffic it sends.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::routing::get;
use metrics_exporter_prometheus::PrometheusBuilder;
use tollgate::keyed::{BucketConfig, Keyed};
use tollgate::{AdaptiveLimit, Counted, Published, Rate, RoundTrip, TokenBucket};
use tollgate_tower::{ConcurrencyLayer, HeaderKey, Limit, PerKey, RedisLimit, ThrottleLayer};

/// The value after `flag` on the command line.
fn arg(flag: &str) -> Option<String> {
    std::env::args().skip_while(|arg| arg != flag).nth(1)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let port: u16 = arg("--port")
        .map(|port| port.parse())
        .transpose()?
        .unwrap_or(3000);
    // The recorder first: metrics recorded before it is installed are lost.
    let prometheus = PrometheusBuilder::new().install_recorder()?;

    // Three requests an hour per API key, a thousand an hour in all.
    let per_key = Keyed::<String, TokenBucket>::new(BucketConfig::new(3, Rate::per_hour(3))?);
    let burst = PerKey::new("burst", per_key)?;
    // The global bucket counted (the core crate's `Counted`), its counts
    // published at each scrape.
    let counted = Arc::new(Counted::new(
        "global",
        TokenBucket::new(1_000, Rate::per_hour(1_000))?,
    ));
    let global = Limit::shared("global", Arc::clone(&counted))?;
    let mut throttle = ThrottleLayer::builder(HeaderKey::new("x-api-key"))
        .policy(burst)
        .policy(global);
    if let Some(url) = arg("--redis") {
        // Ten an hour per key across every process of the service.
        let client = tollgate_redis::Client::connect(&url).await?;
        let shared = tollgate_redis::FixedWindow::new("watched", Rate::per_hour(10))?;
        throttle = throttle.policy(RedisLimit::new("shared", client, shared)?);
    }
    let throttle = throttle.build();
    let adaptive = Arc::new(AdaptiveLimit::new(RoundTrip::default())?.named("service"));
    let published = Arc::new(Published::new().with(&counted).with(&adaptive));
    let concurrency = ConcurrencyLayer::new(adaptive);
    // The throttle outermost: a request it refuses never takes a permit
    // (nor teaches an adaptive limit that the service is busy).
    let api = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(concurrency)
        .layer(throttle);
    // The scrape path is outside the limits: watching never spends them.
    let app = api.route(
        "/metrics",
        get(move || {
            // The counts summed from their stripes, the gauges read, then
            // everything rendered.
            published.publish();
            let prometheus = prometheus.clone();
            async move { prometheus.render() }
        }),
    );
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    println!("listening on {}", listener.local_addr()?);
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
