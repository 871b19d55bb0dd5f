//! gRPC calls through the layers: a real tonic server on a loopback port,
//! the layer put around its routes with `Server::builder().layer(..)`, and a
//! real tonic client calling it over HTTP/2. The messages are derived by
//! hand with prost and the method is served through tonic's own
//! `server::Grpc::unary`, so no protoc and no build script are needed.
//!
//! A refused call must reach the client's application as the `tonic::Status`
//! the layer meant — its code, its message, `retry-after` and the
//! `RateLimit` fields as metadata — and must never reach the service. The
//! limiters run on a `ManualClock` that only the test moves, so every number
//! below is exact.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::uri::PathAndQuery;
use http::{Request, StatusCode};
use tokio::net::TcpListener;
use tollgate::keyed::{BucketConfig, Keyed};
use tollgate::{ConcurrencyLimit, ManualClock, Rate, TokenBucket};
use tollgate_tower::{
    ConcurrencyLayer, Global, HeaderKey, Layer, PerKey, PolicyName, ThrottleLayer,
};
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Code, Status};
use tower::{Service, ServiceBuilder, ServiceExt, service_fn};

use crate::support::scripted_remote;

#[derive(Clone, PartialEq, prost::Message)]
struct HelloRequest {
    #[prost(string, tag = "1")]
    name: String,
}

#[derive(Clone, PartialEq, prost::Message)]
struct HelloReply {
    #[prost(string, tag = "1")]
    message: String,
}

/// The one method of the test service.
const SAY_HELLO: &str = "/demo.Greeter/SayHello";

/// The gRPC service `demo.Greeter`: `SayHello` answers "hello <name>", and
/// every call that reaches the service is counted.
#[derive(Clone, Default)]
struct Greeter {
    calls: Arc<AtomicUsize>,
}

impl Greeter {
    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

impl tonic::server::NamedService for Greeter {
    const NAME: &'static str = "demo.Greeter";
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = Result<T, Infallible>> + Send>>;

impl Service<http::Request<tonic::body::Body>> for Greeter {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            assert_eq!(request.uri().path(), SAY_HELLO);
            let say_hello = service_fn(|request: tonic::Request<HelloRequest>| async move {
                let name = request.into_inner().name;
                Ok::<_, Status>(tonic::Response::new(HelloReply {
                    message: format!("hello {name}"),
                }))
            });
            let codec = tonic_prost::ProstCodec::<HelloReply, HelloRequest>::default();
            Ok(tonic::server::Grpc::new(codec)
                .unary(say_hello, request)
                .await)
        })
    }
}

/// A free loopback port to serve on, and its URL.
async fn listen() -> (TcpIncoming, String) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    (TcpIncoming::from(listener), url)
}

/// Serves `greeter` behind `throttle`, the way the crate docs show: the
/// throttle layer around tonic's routes, whose body is mapped to axum's.
async fn serve_throttled<E: tollgate_tower::KeyExtractor>(
    throttle: ThrottleLayer<E>,
    greeter: &Greeter,
) -> String {
    let (incoming, url) = listen().await;
    let router = Server::builder()
        .layer(
            ServiceBuilder::new()
                .layer(throttle)
                .map_response(|response: http::Response<_>| response.map(axum::body::Body::new)),
        )
        .add_service(greeter.clone());
    tokio::spawn(async move { router.serve_with_incoming(incoming).await.unwrap() });
    url
}

async fn client(url: String) -> tonic::client::Grpc<Channel> {
    let channel = Endpoint::from_shared(url).unwrap().connect().await.unwrap();
    tonic::client::Grpc::new(channel)
}

/// Calls `SayHello` with the given metadata.
async fn say_hello(
    client: &mut tonic::client::Grpc<Channel>,
    metadata: &[(&'static str, &str)],
) -> Result<tonic::Response<HelloReply>, Status> {
    client.ready().await.unwrap();
    let mut request = tonic::Request::new(HelloRequest {
        name: "tollgate".into(),
    });
    for (name, value) in metadata {
        request.metadata_mut().insert(*name, value.parse().unwrap());
    }
    let codec = tonic_prost::ProstCodec::<HelloRequest, HelloReply>::default();
    client
        .unary(request, PathAndQuery::from_static(SAY_HELLO), codec)
        .await
}

/// A metadata value as text (`None`: absent).
fn meta<'a>(metadata: &'a tonic::metadata::MetadataMap, name: &str) -> Option<&'a str> {
    metadata.get(name).map(|value| value.to_str().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_call_is_resource_exhausted_with_its_wait_in_the_metadata() {
    let clock = ManualClock::new();
    // Two at once per API key, then one every 30 s.
    let per_key = Keyed::<String, TokenBucket<ManualClock>>::with_clock(
        BucketConfig::new(2, Rate::per_minute(2)).unwrap(),
        clock.clone(),
    );
    let policy = PolicyName::new("per-key")
        .unwrap()
        .window(Duration::from_secs(60));
    let throttle = ThrottleLayer::builder(HeaderKey::new("x-api-key"))
        .policy(PerKey::new(policy, per_key).unwrap())
        // A request says what it costs in `x-cost` (default 1).
        .cost(|parts| {
            parts
                .headers
                .get("x-cost")
                .and_then(|cost| cost.to_str().ok()?.parse().ok())
                .unwrap_or(1)
        })
        .build();
    let greeter = Greeter::default();
    let mut client = client(serve_throttled(throttle, &greeter).await).await;

    // Admitted: the service's answer, with the fields as metadata.
    let key = [("x-api-key", "k1")];
    let admitted = say_hello(&mut client, &key).await.unwrap();
    assert_eq!(admitted.get_ref().message, "hello tollgate");
    let metadata = admitted.metadata();
    assert_eq!(
        meta(metadata, "ratelimit-policy"),
        Some(r#""per-key";q=2;w=60"#)
    );
    assert_eq!(meta(metadata, "ratelimit"), Some(r#""per-key";r=1;t=30"#));
    say_hello(&mut client, &key).await.unwrap();
    assert_eq!(greeter.calls(), 2);

    // Refused: RESOURCE_EXHAUSTED, its message, and when to come back.
    let refused = say_hello(&mut client, &key).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert_eq!(
        refused.message(),
        r#"quota "per-key" exceeded; retry after 30000 ms"#
    );
    let metadata = refused.metadata();
    assert_eq!(meta(metadata, "retry-after"), Some("30"));
    assert_eq!(meta(metadata, "grpc-retry-pushback-ms"), Some("30000"));
    assert_eq!(
        meta(metadata, "ratelimit-policy"),
        Some(r#""per-key";q=2;w=60"#)
    );
    assert_eq!(meta(metadata, "ratelimit"), Some(r#""per-key";r=0;t=60"#));
    assert_eq!(
        greeter.calls(),
        2,
        "a refused call never reaches the service"
    );

    // Another key has its own quota; the first has one more permit 30 s on.
    say_hello(&mut client, &[("x-api-key", "k2")])
        .await
        .unwrap();
    clock.advance(Duration::from_secs(30));
    say_hello(&mut client, &key).await.unwrap();
    assert_eq!(greeter.calls(), 4);

    // More than the capacity: no wait helps, FAILED_PRECONDITION, no wait
    // offered, and nothing spent (k2, full again, still admits two).
    let never = say_hello(&mut client, &[("x-api-key", "k2"), ("x-cost", "3")])
        .await
        .unwrap_err();
    assert_eq!(never.code(), Code::FailedPrecondition, "{never:?}");
    assert_eq!(
        never.message(),
        r#"request can never be satisfied by quota "per-key": 3 permits requested but at most 2 can ever be granted at once"#
    );
    assert_eq!(meta(never.metadata(), "retry-after"), None);
    assert_eq!(meta(never.metadata(), "grpc-retry-pushback-ms"), None);
    assert_eq!(
        meta(never.metadata(), "ratelimit-policy"),
        Some(r#""per-key";q=2;w=60"#)
    );
    say_hello(&mut client, &[("x-api-key", "k2")])
        .await
        .unwrap();
    say_hello(&mut client, &[("x-api-key", "k2")])
        .await
        .unwrap();

    // No key: the extractor's 400 is INVALID_ARGUMENT.
    let no_key = say_hello(&mut client, &[]).await.unwrap_err();
    assert_eq!(no_key.code(), Code::InvalidArgument, "{no_key:?}");
    assert_eq!(
        no_key.message(),
        "request cannot be attributed to a rate-limit key: missing header x-api-key"
    );
    assert_eq!(greeter.calls(), 6);
}

/// A policy decided asynchronously (the layer's deferred path): a refusal
/// there is a gRPC status too, and a policy that cannot decide is
/// UNAVAILABLE.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_asynchronous_refusal_and_an_unavailable_policy_are_grpc_statuses() {
    let (remote, asked) = scripted_remote(Duration::from_millis(1500), |_| {
        "redis: connection refused".into()
    });
    let greeter = Greeter::default();
    let throttle = ThrottleLayer::builder(Global).policy(remote).build();
    let mut client = client(serve_throttled(throttle, &greeter).await).await;

    say_hello(&mut client, &[]).await.unwrap();
    let refused = say_hello(&mut client, &[]).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert_eq!(
        refused.message(),
        r#"quota "remote" exceeded; retry after 1500 ms"#
    );
    assert_eq!(meta(refused.metadata(), "retry-after"), Some("2"));
    assert_eq!(
        meta(refused.metadata(), "grpc-retry-pushback-ms"),
        Some("1500")
    );
    let unavailable = say_hello(&mut client, &[]).await.unwrap_err();
    assert_eq!(unavailable.code(), Code::Unavailable, "{unavailable:?}");
    assert_eq!(
        unavailable.message(),
        r#"rate limit "remote" unavailable: redis: connection refused"#
    );
    assert_eq!(greeter.calls(), 1);
    assert_eq!(asked.load(Ordering::SeqCst), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shed_call_is_unavailable() {
    let limit = Arc::new(ConcurrencyLimit::new(1).unwrap());
    let greeter = Greeter::default();
    let (incoming, url) = listen().await;
    // A concurrency layer needs no body mapping: its body wraps tonic's.
    let router = Server::builder()
        .layer(ConcurrencyLayer::new(Arc::clone(&limit)))
        .add_service(greeter.clone());
    tokio::spawn(async move { router.serve_with_incoming(incoming).await.unwrap() });
    let mut client = client(url).await;

    // The one permit held elsewhere: the call is shed.
    let held = limit.try_acquire().unwrap();
    let shed = say_hello(&mut client, &[]).await.unwrap_err();
    assert_eq!(shed.code(), Code::Unavailable, "{shed:?}");
    assert_eq!(
        shed.message(),
        "service overloaded: every request slot is in use; try again later"
    );
    // No wait to offer: when a permit comes back depends on other requests.
    assert_eq!(meta(shed.metadata(), "retry-after"), None);
    assert_eq!(meta(shed.metadata(), "grpc-retry-pushback-ms"), None);
    assert_eq!(greeter.calls(), 0);

    // The permit back: the call is served.
    drop(held);
    let reply = say_hello(&mut client, &[]).await.unwrap();
    assert_eq!(reply.get_ref().message, "hello tollgate");
    assert_eq!(greeter.calls(), 1);
}

/// Which requests get the gRPC answer, in process: the content types the
/// gRPC protocol names do; anything else — gRPC-Web, JSON, none — gets the
/// HTTP answer, unchanged.
#[tokio::test]
async fn only_grpc_content_types_get_the_grpc_answer() {
    let bucket = TokenBucket::with_clock(1, Rate::per_hour(1), ManualClock::new()).unwrap();
    let layer = ThrottleLayer::builder(Global)
        .policy(tollgate_tower::Limit::new("global", bucket).unwrap())
        .build();
    let service = layer.layer(service_fn(|_: Request<()>| async {
        Ok::<_, Infallible>(http::Response::new(Bytes::from_static(b"ok")))
    }));
    let call = |content_type: Option<&str>| {
        let mut request = Request::post(SAY_HELLO);
        if let Some(content_type) = content_type {
            request = request.header("content-type", content_type);
        }
        service.clone().oneshot(request.body(()).unwrap())
    };
    assert_eq!(call(None).await.unwrap().status(), StatusCode::OK);

    for grpc in [
        "application/grpc",
        "application/grpc+proto",
        "application/grpc+json",
        "application/grpc;charset=utf-8",
        "Application/gRPC",
    ] {
        let response = call(Some(grpc)).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK, "{grpc}");
        let headers = response.headers();
        assert_eq!(headers["content-type"], "application/grpc", "{grpc}");
        assert_eq!(headers["grpc-status"], "8", "{grpc}");
        assert_eq!(headers["retry-after"], "3600", "{grpc}");
        assert!(response.body().is_empty(), "{grpc}");
    }

    for other in [
        None,
        Some("application/grpc-web"),
        Some("application/grpc-web+proto"),
        Some("application/grpcx"),
        Some("application/json"),
    ] {
        let response = call(other).await.unwrap();
        assert_eq!(
            response.status(),
            StatusCode::TOO_MANY_REQUESTS,
            "{other:?}"
        );
        let headers = response.headers();
        assert_eq!(headers["content-type"], "application/problem+json");
        assert!(headers.get("grpc-status").is_none(), "{other:?}");
        assert_eq!(headers["retry-after"], "3600");
        assert_eq!(headers["ratelimit"], r#""global";r=0;t=3600"#);
        assert_eq!(
            response.body(),
            r#"{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","title":"Request cannot be satisfied as assigned quota has been exceeded","detail":"retry after 3600000 ms","violated-policies":["global"],"status":429}"#
        );
    }
}

/// A hook for other requests leaves gRPC calls to the gRPC default, and a
/// gRPC hook replaces it.
#[tokio::test]
async fn the_grpc_hook_is_separate_from_the_http_hook() {
    let bucket = TokenBucket::with_clock(1, Rate::per_hour(1), ManualClock::new()).unwrap();
    let text = |refusal: &tollgate_tower::Refusal<'_>| {
        let mut response = http::Response::new(Bytes::from_static(b"slow down"));
        *response.status_mut() = refusal.status();
        response
    };
    let layer = ThrottleLayer::builder(Global)
        .policy(tollgate_tower::Limit::new("global", bucket).unwrap())
        .on_refusal(text)
        .build();
    let service = layer.layer(service_fn(|_: Request<()>| async {
        Ok::<_, Infallible>(http::Response::new(Bytes::from_static(b"ok")))
    }));
    let call = |content_type: &str| {
        let request = Request::post(SAY_HELLO)
            .header("content-type", content_type)
            .body(())
            .unwrap();
        service.clone().oneshot(request)
    };
    call("application/grpc").await.unwrap();
    let http = call("application/json").await.unwrap();
    assert_eq!(http.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(http.body(), "slow down");
    let grpc = call("application/grpc").await.unwrap();
    assert_eq!(grpc.headers()["grpc-status"], "8");

    // With a gRPC hook, its answer; the layer still adds the wait.
    let bucket = TokenBucket::with_clock(1, Rate::per_hour(1), ManualClock::new()).unwrap();
    let layer = ThrottleLayer::builder(Global)
        .policy(tollgate_tower::Limit::new("global", bucket).unwrap())
        .on_refusal(text)
        .on_grpc_refusal(|refusal| {
            Status::new(Code::from(refusal.grpc_code()), "busy").into_http::<Bytes>()
        })
        .build();
    let service = layer.layer(service_fn(|_: Request<()>| async {
        Ok::<_, Infallible>(http::Response::new(Bytes::from_static(b"ok")))
    }));
    let request = || {
        Request::post(SAY_HELLO)
            .header("content-type", "application/grpc")
            .body(())
            .unwrap()
    };
    service.clone().oneshot(request()).await.unwrap();
    let grpc = service.oneshot(request()).await.unwrap();
    assert_eq!(grpc.status(), StatusCode::OK);
    assert_eq!(grpc.headers()["grpc-status"], "8");
    assert_eq!(grpc.headers()["grpc-message"], "busy");
    assert!(grpc.headers().get("grpc-retry-pushback-ms").is_none());
    assert_eq!(grpc.headers()["retry-after"], "3600");
    assert_eq!(grpc.headers()["ratelimit"], r#""global";r=0;t=3600"#);
}
