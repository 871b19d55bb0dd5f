//! Entry throttling and load shedding for HTTP services built on tower
//! (axum, hyper, tonic):
//! a [`ThrottleLayer`] that keys each request (peer address, trusted-proxy
//! forwarding headers, a header, one global key, a closure), asks the
//! request's policies — any tollgate limiter, keyed or not, per route group,
//! `n` permits from a cost closure, async limiters such as Redis-backed
//! ones, or a bounded wait — and answers:
//!
//! - admitted: the service's response, with `RateLimit-Policy` and
//!   `RateLimit` fields (IETF draft-ietf-httpapi-ratelimit-headers, revision 10) from
//!   the decision's own report — no second read of the limiter;
//! - not now: `429 Too Many Requests` with `Retry-After` in whole seconds
//!   rounded up from the exact retry-after (never `0` for a real wait), and
//!   the same fields;
//! - never (more permits than the policy's capacity): `403`, see
//!   [`Refusal::NeverFits`];
//! - no key: the [`KeyError`]'s status (`500` for a missing peer address,
//!   `400` for a missing header) — never a panic, never a silent pass;
//! - a remote limiter that cannot decide: `503`;
//! - a gRPC call: a gRPC status instead, see [below](#grpc).
//!
//! Several policies on one request are **all-or-nothing, whatever order they
//! were added in**: asked narrowest first (per key, then this process, then
//! shared with other processes), a request above any policy's capacity
//! refused before any is asked, and the in-process admissions of a request a
//! later policy refuses given back — the exact guarantee is on
//! [`ThrottleBuilder`].
//!
//! Load shedding above a concurrency limit, fixed or adaptive, at the entry
//! or around an outbound client, is [`ConcurrencyLayer`]'s: see
//! [below](#concurrency-limits-and-load-shedding).
//!
//! The response of a refusal comes from a hook ([`ThrottleBuilder::on_refusal`];
//! default [`problem_response`], an RFC 9457 problem document). A gRPC call
//! is answered in gRPC's own terms instead: see [below](#grpc).
//!
//! ```
//! use std::net::IpAddr;
//! use std::time::Duration;
//! use http::Method;
//! use tollgate::keyed::{BucketConfig, Keyed};
//! use tollgate::{LogConfig, Rate, SlidingLog, TokenBucket};
//! use tollgate_tower::{Limit, PeerIp, PerKey, PolicyName, Route, ThrottleLayer};
//!
//! let per_ip = Keyed::<IpAddr, TokenBucket>::new(BucketConfig::new(20, Rate::per_second(10))?);
//! let logins = Keyed::<IpAddr, SlidingLog>::new(LogConfig::new(Rate::per_minute(5))?);
//! let search = SlidingLog::new(Rate::per_second(100))?;
//! let layer = ThrottleLayer::builder(PeerIp)
//!     .route(
//!         Route::exact("/login").method(Method::POST),
//!         PerKey::new(PolicyName::new("login")?.window(Duration::from_secs(60)), logins)?,
//!     )
//!     .route(Route::prefix("/search"), Limit::new("search", search)?)
//!     .policy(PerKey::new(PolicyName::new("per-ip")?.window(Duration::from_secs(2)), per_ip)?)
//!     .build();
//! # let _ = layer;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! With axum, put the layer **in front of the whole router** (it matches its
//! own routes), the router's routes built once with `with_state` as
//! `Router::into_make_service` would, and serve it with the peer's address
//! (`ConnectInfo`, which [`PeerIp`] reads): [`ThrottleLayer::serve`] does all
//! three. `Router::layer(layer)` works too, but axum then wraps every route
//! and pays a boxed clone of the route and a second route future per
//! request. This is the README's quick start:
//!
//! ```no_run
//! # async fn serve() -> Result<(), Box<dyn std::error::Error>> {
//! use std::net::IpAddr;
//! use std::time::Duration;
//! use axum::{Router, routing::get};
//! use tollgate::keyed::{BucketConfig, Keyed};
//! use tollgate::{Rate, TokenBucket};
//! use tollgate_tower::{PeerIp, PerKey, PolicyName, ThrottleLayer};
//!
//! let per_ip = Keyed::<IpAddr, TokenBucket>::new(BucketConfig::new(20, Rate::per_second(10))?);
//! let layer = ThrottleLayer::builder(PeerIp)
//!     .policy(PerKey::new(PolicyName::new("per-ip")?.window(Duration::from_secs(2)), per_ip)?)
//!     .build();
//! let router = Router::new().route("/", get(|| async { "hello" }));
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//! // In front of the whole router, with peer addresses.
//! axum::serve(listener, layer.serve(router)).await?;
//! # Ok(())
//! # }
//! ```
//!
//! Without axum (hyper, tonic), put it around any service with
//! [`Layer::layer`] and insert the peer address yourself, or key by
//! something else ([`HeaderKey`], [`ForwardedIp`], [`Global`]).
//!
//! # gRPC
//!
//! A gRPC client reads a call's status from `grpc-status`, not from the
//! HTTP status: HTTP `429` with a problem document reaches its application
//! as `UNAVAILABLE` (the protocol's mapping of HTTP statuses) or `INTERNAL`
//! (tonic, which tries to read the document as a message), with no message
//! and no way to say when to come back. So a refused request whose
//! `content-type` is `application/grpc` (or starts with `application/grpc+`
//! or `application/grpc;`) gets a gRPC **trailers-only** response
//! ([`grpc_response`]): HTTP `200`, an empty body, and in its headers
//! `grpc-status` — `8` `RESOURCE_EXHAUSTED` for a spent quota, `9`
//! `FAILED_PRECONDITION` for a request above a policy's capacity, `14`
//! `UNAVAILABLE` for a policy that could not decide and for a request a
//! [`ConcurrencyLayer`] sheds, the [`KeyError`]'s status mapped for a
//! request without a key ([`Refusal::grpc_code`] has the table) — a
//! percent-encoded `grpc-message`, and for a spent quota
//! `grpc-retry-pushback-ms`, the wait that gRPC client retry policies honour.
//! The layer adds what it adds to every refusal: `retry-after` (whole
//! seconds, rounded up) and the `ratelimit-policy` and `ratelimit` fields,
//! which the client reads as the status's metadata. The metrics count
//! these refusals as they count the others. Other requests are answered as
//! before; [`ThrottleBuilder::on_grpc_refusal`] and
//! [`ConcurrencyBuilder::on_grpc_shed`] replace the gRPC answers.
//!
//! ```
//! use std::time::Duration;
//! use bytes::Bytes;
//! use http::Request;
//! use tollgate::{ManualClock, Rate, TokenBucket};
//! use tollgate_tower::{Global, Layer, Limit, PolicyName, ThrottleLayer};
//! use tower::{ServiceExt, service_fn};
//!
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let bucket = TokenBucket::with_clock(1, Rate::per_second(2), ManualClock::new()).unwrap();
//! let name = PolicyName::new("global").unwrap().window(Duration::from_secs(1));
//! let layer = ThrottleLayer::builder(Global).policy(Limit::new(name, bucket).unwrap()).build();
//! let service = layer.layer(service_fn(|_: Request<()>| async {
//!     Ok::<_, std::convert::Infallible>(http::Response::new(Bytes::new()))
//! }));
//! let call = || {
//!     Request::post("/demo.Greeter/SayHello")
//!         .header("content-type", "application/grpc")
//!         .body(())
//!         .unwrap()
//! };
//! let admitted = service.clone().oneshot(call()).await.unwrap();
//! assert!(admitted.headers().get("grpc-status").is_none()); // the service's own answer
//! let refused = service.oneshot(call()).await.unwrap();
//! assert_eq!(refused.status(), 200);
//! assert_eq!(refused.headers()["content-type"], "application/grpc");
//! assert_eq!(refused.headers()["grpc-status"], "8"); // RESOURCE_EXHAUSTED
//! assert_eq!(refused.headers()["grpc-message"], r#"quota "global" exceeded; retry after 500 ms"#);
//! assert_eq!(refused.headers()["grpc-retry-pushback-ms"], "500");
//! assert_eq!(refused.headers()["retry-after"], "1");
//! assert_eq!(refused.headers()["ratelimit-policy"], r#""global";q=1;w=1"#);
//! assert_eq!(refused.headers()["ratelimit"], r#""global";r=0;t=1"#);
//! assert!(refused.body().is_empty());
//! # });
//! ```
//!
//! With tonic, put the layer around the server's routes with
//! `Server::builder().layer(..)`. tonic's routes answer with tonic's own
//! body type, which a refusal cannot be written into: map it to axum's (a
//! dependency of tonic's router already) behind the throttle layer. A
//! [`ConcurrencyLayer`] needs no such step. tonic puts the peer's address
//! in its own extension, which [`PeerIp`] does not read: key by a metadata
//! header ([`HeaderKey`]) or with a [`KeyFn`].
//!
//! ```no_run
//! # async fn serve(routes: tonic::service::Routes) -> Result<(), Box<dyn std::error::Error>> {
//! use tollgate::keyed::{BucketConfig, Keyed};
//! use tollgate::{Rate, TokenBucket};
//! use tollgate_tower::{HeaderKey, PerKey, ThrottleLayer};
//!
//! // Per API key, sent by the client as metadata.
//! let per_key = Keyed::<String, TokenBucket>::new(BucketConfig::new(20, Rate::per_second(10))?);
//! let throttle = ThrottleLayer::builder(HeaderKey::new("x-api-key"))
//!     .policy(PerKey::new("per-key", per_key)?)
//!     .build();
//! tonic::transport::Server::builder()
//!     .layer(
//!         tower::ServiceBuilder::new()
//!             .layer(throttle)
//!             .map_response(|response: http::Response<_>| response.map(axum::body::Body::new)),
//!     )
//!     .add_routes(routes)
//!     .serve("127.0.0.1:50051".parse()?)
//!     .await?;
//! # Ok(())
//! # }
//! ```
//!
//! # Concurrency limits and load shedding
//!
//! A rate limit bounds how often requests come; a [`ConcurrencyLayer`]
//! bounds how many are served at once. Each request takes a permit of an
//! [`InFlightLimit`] — a fixed [`ConcurrencyLimit`](tollgate::ConcurrencyLimit),
//! or an [`AdaptiveLimit`](tollgate::AdaptiveLimit) whose algorithm finds
//! the service's capacity from how requests end — and holds it until its
//! response's body is done ([`PermitBody`]). Without a free permit the
//! request is shed at once with `503` ([`Refusal::Overloaded`], no
//! `Retry-After`), or waits in a bounded queue first
//! ([`ConcurrencyBuilder::queue`]). Each ending is classified for the
//! algorithm ([`DefaultClassify`]): `2xx`/`3xx` a success timed to the
//! body's end, `5xx`, `429`, `408` and the inner service's errors
//! overload, other `4xx` and abandoned requests ignored.
//!
//! Around an outbound client ([`ConcurrencyBuilder::client`]) the same
//! layer protects a dependency: a refusal is the error
//! [`ConcurrencyError::Overloaded`] and nothing is sent, and the client's
//! own errors (timeouts, refused connections) count as overload.
//!
//! ```
//! use std::sync::Arc;
//! use axum::{Router, routing::get};
//! use bytes::Bytes;
//! use http_body_util::Empty;
//! use hyper_util::{client::legacy::Client, rt::TokioExecutor};
//! use tollgate::{AdaptiveLimit, RoundTrip};
//! use tollgate_tower::{ConcurrencyLayer, Global, Layer, ThrottleLayer};
//!
//! // The service's own capacity, found by the recommended algorithm with its
//! // defaults: from a limit of 1, one decision per round trip of the
//! // service; it grows while the limit is used and latency shows no queue,
//! // shrinks when it does, and backs off on a failed request.
//! let limit = Arc::new(AdaptiveLimit::new(RoundTrip::default())?);
//! let router: Router = Router::new()
//!     .route("/", get(|| async { "hello" }))
//!     .layer(ConcurrencyLayer::new(Arc::clone(&limit)));
//! // Rate limits in front: a request they refuse never takes a permit.
//! let _service = ThrottleLayer::builder(Global).build().serve(router);
//!
//! // A dependency's capacity, on the way out: at most 32 calls in flight.
//! let outbound = Arc::new(tollgate::ConcurrencyLimit::new(32)?);
//! let http = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
//! let _client = ConcurrencyLayer::builder(outbound).client().build().layer(http);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ## Over HTTP/2: read what a refusal drops
//!
//! A refusal (shed, `429`, or a gRPC status) answers without reading the
//! request's body. Over HTTP/2, h2 keeps each small DATA frame that
//! arrives after the body was dropped charged to the connection's budget
//! against framing floods, and closes the connection once enough are
//! (`GOAWAY ENHANCE_YOUR_CALM "too_many_data_frames"`), failing every call
//! on it — under load, where refusals are many. Put a [`DrainLayer`]
//! outside the refusing layers: a body dropped before its end is read to it
//! (bounded in bytes and time) by a background task. For tonic, whose
//! routes take its own body type, re-box the wrapped body:
//!
//! ```no_run
//! # async fn serve(routes: tonic::service::Routes) -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use tollgate_tower::{ConcurrencyLayer, DrainLayer};
//!
//! let drain = DrainLayer::new();
//! tonic::transport::Server::builder()
//!     .layer(tower::util::MapRequestLayer::new(move |call: http::Request<tonic::body::Body>| {
//!         call.map(|body| tonic::body::Body::new(drain.wrap(body)))
//!     }))
//!     .layer(ConcurrencyLayer::new(Arc::new(tollgate::ConcurrencyLimit::new(256)?)))
//!     .add_routes(routes)
//!     .serve("127.0.0.1:50051".parse()?)
//!     .await?;
//! # Ok(())
//! # }
//! ```
//!
//! # Features
//!
//! - `axum` (default): read the peer address from axum's `ConnectInfo`.
//! - `redis`: `RedisLimit` (a `tollgate-redis` limiter, one script call per
//!   request), `RedisAllOf` (several of them, all or nothing in one call)
//!   and `LeasedLimit` (its leased limiter, no Redis call on the request
//!   path) as policies.
//! - `metrics`: counters, gauges and histograms through the
//!   [`metrics`](https://docs.rs/metrics) facade for the exporter the
//!   application installs (with `redis`, tollgate-redis's own too); without
//!   it nothing is recorded or compiled in. No label carries a request's
//!   key, address or user (a time series per client would grow without
//!   bound):
//!
//!   | metric | labels | what |
//!   |---|---|---|
//!   | `tollgate_tower_decisions_total` | `policy`, `outcome` (`admitted`, `rate`, `never_fits`, `unavailable`) | each policy's answers; a combined policy's under its binding member's name |
//!   | `tollgate_tower_requests_total` | `outcome` (`passed`, `refused`, `no_key`) | a throttle layer's requests |
//!   | `tollgate_tower_decision_duration_seconds` | | histogram: the decision of a request that waited on a remote policy or a shaped wait |
//!   | `tollgate_tower_concurrency_requests_total` | `outcome` (`admitted`, `queued`, `shed`) | a concurrency layer's requests (a queued one that times out is counted `shed` too) |
//!   | `tollgate_tower_concurrency_outcomes_total` | `outcome` (`success`, `dropped`, `ignored`) | what each permit taught the limit |
//!   | `tollgate_tower_concurrency_queue_wait_seconds` | | histogram: a queued request's wait, granted or not |
//!   | `tollgate_tower_concurrency_in_flight`, `tollgate_tower_concurrency_limit` | | gauges, read at each request's admission or refusal |

#![deny(missing_docs)]
#![warn(rust_2018_idioms, unreachable_pub)]

mod concurrency;
pub mod drain;
mod fields;
mod forwarded;
mod key;
mod layer;
mod metrics;
mod policy;
#[cfg(feature = "redis")]
mod redis;
mod response;
#[cfg(feature = "axum")]
mod serve;
mod shaped;

pub use concurrency::{
    Classify, ClientFace, Concurrency, ConcurrencyBuilder, ConcurrencyError, ConcurrencyFuture,
    ConcurrencyLayer, DefaultClassify, Face, InFlightLimit, PermitBody, ServerFace,
};
pub use drain::{Drain, DrainLayer, Drained};
pub use fields::{
    IntoPolicyName, InvalidName, PolicyName, RATELIMIT, RATELIMIT_POLICY, RateLimitFields,
    retry_after_secs,
};
pub use forwarded::{Cidr, ForwardedIp, ParseCidrError};
pub use key::{Global, HeaderKey, KeyError, KeyExtractor, KeyFn, PeerIp};
pub use layer::{ResponseFuture, Route, Throttle, ThrottleBuilder, ThrottleLayer};
pub use policy::{
    AllOfLimit, AsyncLimit, Decision, Limit, OutcomeFuture, PerKey, Policy, PolicyOutcome, Scope,
};
#[cfg(feature = "redis")]
pub use redis::{LeasedLimit, RedisAllOf, RedisLimit};
pub use response::{Refusal, grpc_response, problem_response};
pub use shaped::Shaped;
/// The `tower` trait that puts the layer around a service (`layer.layer(service)`),
/// re-exported so that no `tower` dependency is needed for it.
pub use tower_layer::Layer;

// The README's examples, compiled and run as doctests. Its second example
// needs the `redis` feature, as `--all-features` gives it.
#[cfg(all(doctest, feature = "axum", feature = "redis"))]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

// The guide's page on this crate (docs/guide/http.md), compiled and run as
// doctests in the repository (its last example needs `redis`); the packaged
// crate holds no docs/.
#[cfg(all(doctest, feature = "axum", feature = "redis"))]
#[doc = include_str!("../../docs/guide/http.md")]
struct GuideHttp;

// The guide's page on metrics (docs/guide/watching.md), compiled as
// doctests in the repository.
#[cfg(all(doctest, feature = "axum", feature = "metrics"))]
#[doc = include_str!("../../docs/guide/watching.md")]
struct GuideWatching;
