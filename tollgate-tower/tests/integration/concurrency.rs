//! The concurrency layer in front of a real axum service on a loopback port,
//! and around a real outbound client (hyper-util's), driven by real clients.
//! Requests are held in the handler until the test releases them (a
//! semaphore the test adds permits to), so a full limit is a fact, not a
//! race; adaptive limits run on a `ManualClock` the test alone moves, so
//! each change of the limit is the algorithm's rule applied to a known
//! sample.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body::Frame;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tollgate::{AdaptiveLimit, Aimd, ConcurrencyLimit, ManualClock};
use tollgate_tower::{ConcurrencyError, ConcurrencyLayer, InFlightLimit, Layer};
use tower::ServiceExt;

use crate::support;
use support::{answer, recent_limits, serve};

type Adaptive = AdaptiveLimit<Aimd, ManualClock>;

/// An AIMD limit on a clock that never moves unless the test moves it: every
/// success is fast, so the limit follows the outcomes alone (+1 for a
/// success with at least half the limit in flight, × 0.9 for a drop).
fn aimd(min: u32, initial: u32, max: u32) -> (Arc<Adaptive>, ManualClock) {
    let clock = ManualClock::new();
    let aimd = Aimd::builder()
        .min_limit(min)
        .initial_limit(initial)
        .max_limit(max)
        .timeout(Duration::from_millis(5))
        .build()
        .unwrap();
    let limit = AdaptiveLimit::with_clock(aimd, clock.clone()).unwrap();
    (Arc::new(limit), clock)
}

/// The handlers: `/hold` waits for a permit of `release` (the test adds
/// them); the others answer at once with their status.
fn app(release: &Arc<Semaphore>) -> Router {
    let release = Arc::clone(release);
    Router::new()
        .route(
            "/hold",
            get(move || async move {
                release.acquire().await.unwrap().forget();
                "held"
            }),
        )
        .route("/ok", get(|| async { "ok" }))
        .route("/fail", get(|| async { StatusCode::INTERNAL_SERVER_ERROR }))
        .route("/missing", get(|| async { StatusCode::NOT_FOUND }))
        .route("/busy", get(|| async { StatusCode::TOO_MANY_REQUESTS }))
        .route(
            "/unavailable",
            get(|| async { StatusCode::SERVICE_UNAVAILABLE }),
        )
}

/// Waits (up to 10 s) until `done` holds.
async fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < Duration::from_secs(10), "never: {what}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

async fn get_status(client: &reqwest::Client, url: String) -> StatusCode {
    let response = answer(client.get(url)).await;
    let status = response.status();
    response.bytes().await.unwrap();
    status
}

/// Two requests hold both permits; a third is answered `503` with a problem
/// document and no `Retry-After`, without reaching the service; once the
/// two are released, the permits are all back.
async fn sheds_when_full<L: InFlightLimit>(limit: Arc<L>) {
    let release = Arc::new(Semaphore::new(0));
    let addr = serve(app(&release).layer(ConcurrencyLayer::new(Arc::clone(&limit)))).await;
    let client = reqwest::Client::new();
    let held: Vec<_> = (0..2)
        .map(|_| {
            tokio::spawn(get_status_owned(
                client.clone(),
                format!("http://{addr}/hold"),
            ))
        })
        .collect();
    eventually("both permits taken", || limit.in_flight() == 2).await;

    let shed = answer(client.get(format!("http://{addr}/ok"))).await;
    assert_eq!(shed.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(shed.headers()["content-type"], "application/problem+json");
    assert!(shed.headers().get("retry-after").is_none());
    let body = shed.text().await.unwrap();
    assert!(body.contains("\"title\":\"Service overloaded\""), "{body}");
    assert!(body.contains("\"status\":503"), "{body}");
    assert_eq!(limit.in_flight(), 2, "a refusal takes nothing");

    release.add_permits(2);
    for request in held {
        assert_eq!(request.await.unwrap(), StatusCode::OK);
    }
    eventually("the permits came back", || limit.in_flight() == 0).await;
    assert_eq!(
        get_status(&client, format!("http://{addr}/ok")).await,
        StatusCode::OK
    );
}

async fn get_status_owned(client: reqwest::Client, url: String) -> StatusCode {
    get_status(&client, url).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_fixed_limit_sheds_with_503() {
    sheds_when_full(Arc::new(ConcurrencyLimit::new(2).unwrap())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_adaptive_limit_sheds_with_503() {
    // min = max: the limit cannot move, so "full" stays full.
    sheds_when_full(aimd(2, 2, 2).0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_holds_a_bounded_number_for_a_bounded_time() {
    let limit = Arc::new(ConcurrencyLimit::new(1).unwrap());
    let release = Arc::new(Semaphore::new(0));
    // One may wait, for up to a minute (longer than this test runs).
    let layer = ConcurrencyLayer::builder(Arc::clone(&limit))
        .queue(1, Duration::from_secs(60))
        .build();
    let addr = serve(app(&release).layer(layer)).await;
    let client = reqwest::Client::new();
    let holder = tokio::spawn(get_status_owned(
        client.clone(),
        format!("http://{addr}/hold"),
    ));
    eventually("the permit taken", || limit.in_flight() == 1).await;
    let queued = tokio::spawn(get_status_owned(
        client.clone(),
        format!("http://{addr}/ok"),
    ));
    eventually("a request waits", || limit.has_waiters()).await;
    // The queue is full: the next is refused at once.
    assert_eq!(
        get_status(&client, format!("http://{addr}/ok")).await,
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert!(!queued.is_finished());
    // The holder's release hands the permit to the waiter.
    release.add_permits(1);
    assert_eq!(holder.await.unwrap(), StatusCode::OK);
    assert_eq!(queued.await.unwrap(), StatusCode::OK);
    eventually("all back", || limit.in_flight() == 0).await;

    // A waiter whose client hangs up leaves the queue (and its place).
    let holder = tokio::spawn(get_status_owned(
        client.clone(),
        format!("http://{addr}/hold"),
    ));
    eventually("the permit taken again", || limit.in_flight() == 1).await;
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET /ok HTTP/1.1\r\nhost: test\r\n\r\n")
        .await
        .unwrap();
    eventually("the raw client waits", || limit.has_waiters()).await;
    drop(stream);
    eventually("it left the queue", || !limit.has_waiters()).await;
    // Its place is free: another request may wait (with max_waiting = 1 it
    // would be refused at once if the count had leaked).
    let queued = tokio::spawn(get_status_owned(
        client.clone(),
        format!("http://{addr}/ok"),
    ));
    eventually("the place is taken again", || limit.has_waiters()).await;
    release.add_permits(1);
    assert_eq!(holder.await.unwrap(), StatusCode::OK);
    assert_eq!(queued.await.unwrap(), StatusCode::OK);

    // With a short bound the waiter is refused after it, never before.
    let layer = ConcurrencyLayer::builder(Arc::clone(&limit))
        .queue(8, Duration::from_millis(100))
        .build();
    let addr = serve(app(&release).layer(layer)).await;
    let holder = tokio::spawn(get_status_owned(
        client.clone(),
        format!("http://{addr}/hold"),
    ));
    eventually("held for the timeout", || limit.in_flight() == 1).await;
    let start = Instant::now();
    assert_eq!(
        get_status(&client, format!("http://{addr}/ok")).await,
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert!(start.elapsed() >= Duration::from_millis(100));
    release.add_permits(1);
    assert_eq!(holder.await.unwrap(), StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_move_the_adaptive_limit_by_their_class() {
    let (limit, _clock) = aimd(1, 2, 10);
    let release = Arc::new(Semaphore::new(0));
    let addr = serve(app(&release).layer(ConcurrencyLayer::new(Arc::clone(&limit)))).await;
    let client = reqwest::Client::new();
    // One at a time: each is admitted with itself alone in flight.
    let steps = [
        ("/ok", StatusCode::OK, 3),                      // success, 2·1 ≥ 2: + 1
        ("/fail", StatusCode::INTERNAL_SERVER_ERROR, 2), // 5xx: ⌊3 · 0.9⌋
        ("/missing", StatusCode::NOT_FOUND, 2),          // other 4xx: ignored
        ("/busy", StatusCode::TOO_MANY_REQUESTS, 1),     // 429: ⌊2 · 0.9⌋
        ("/unavailable", StatusCode::SERVICE_UNAVAILABLE, 1), // at the min
        ("/ok", StatusCode::OK, 2),                      // 2·1 ≥ 1: + 1
    ];
    for (path, status, after) in steps {
        assert_eq!(
            get_status(&client, format!("http://{addr}{path}")).await,
            status
        );
        eventually("the permit back", || limit.in_flight() == 0).await;
        assert_eq!(limit.limit(), after, "after {path}");
    }
    // The 404 changed nothing: the history holds exactly the other changes.
    let changes = recent_limits(limit.history());
    assert_eq!(changes, [3, 2, 1, 2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_hangs_up_gives_the_permit_back_unrecorded() {
    // At limit 2, one in flight: a success would add one, a drop take one.
    let (limit, _clock) = aimd(1, 2, 10);
    let release = Arc::new(Semaphore::new(0));
    let addr = serve(app(&release).layer(ConcurrencyLayer::new(Arc::clone(&limit)))).await;
    for _ in 0..3 {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(b"GET /hold HTTP/1.1\r\nhost: test\r\n\r\n")
            .await
            .unwrap();
        eventually("the request holds a permit", || limit.in_flight() == 1).await;
        drop(stream);
        eventually("the permit came back", || limit.in_flight() == 0).await;
    }
    // Ignored: the algorithm heard nothing.
    assert_eq!(limit.limit(), 2);
    assert_eq!(limit.history().unwrap().changes(), 0);
}

/// A body that sends the frames put in its channel and ends when the
/// sender is dropped.
struct ChannelBody(mpsc::UnboundedReceiver<Frame<Bytes>>);

impl ChannelBody {
    /// A body of `frames` and nothing more.
    fn of(frames: Vec<Frame<Bytes>>) -> ChannelBody {
        let (tx, rx) = mpsc::unbounded_channel();
        for frame in frames {
            tx.send(frame).unwrap();
        }
        ChannelBody(rx)
    }
}

impl http_body::Body for ChannelBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        self.0.poll_recv(cx).map(|frame| frame.map(Ok))
    }
}

/// A request behind `limit` to a server whose one route answers at once
/// with a body that streams what the test sends into the returned channel
/// (one request only); `first ` is sent and read as the `200`'s first chunk,
/// so the head and a chunk are out and the body is not done.
async fn streaming_response(
    limit: &Arc<Adaptive>,
) -> (mpsc::UnboundedSender<Frame<Bytes>>, reqwest::Response) {
    let (tx, rx) = mpsc::unbounded_channel::<Frame<Bytes>>();
    let rx = Arc::new(std::sync::Mutex::new(Some(rx)));
    let router = Router::new().route(
        "/stream",
        get(move || {
            let rx = rx.lock().unwrap().take().unwrap();
            async move { Body::new(ChannelBody(rx)) }
        }),
    );
    let addr = serve(router.layer(ConcurrencyLayer::new(Arc::clone(limit)))).await;
    tx.send(Frame::data(Bytes::from_static(b"first "))).unwrap();
    let mut response = reqwest::get(format!("http://{addr}/stream")).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.chunk().await.unwrap().unwrap(), "first ");
    (tx, response)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_permit_is_held_until_the_body_ends_and_timed_to_it() {
    // The AIMD timeout is 5 ms on the test's clock.
    let (limit, clock) = aimd(1, 2, 10);
    let (tx, mut response) = streaming_response(&limit).await;
    // The head and a chunk are out, the body is not done: still held.
    assert_eq!(limit.in_flight(), 1);
    // 10 ms pass on the limit's clock before the body ends: past the 5 ms
    // timeout, so the sample, timed to the body's end, is a drop.
    clock.advance(Duration::from_millis(10));
    tx.send(Frame::data(Bytes::from_static(b"last"))).unwrap();
    drop(tx);
    assert_eq!(response.chunk().await.unwrap().unwrap(), "last");
    assert!(response.chunk().await.unwrap().is_none());
    eventually("the permit came back", || limit.in_flight() == 0).await;
    assert_eq!(limit.limit(), 1, "⌊2 · 0.9⌋: timed to the body's end");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_abandoned_half_way_gives_the_permit_back_unrecorded() {
    // At limit 2, one in flight, a fast success would add one.
    let (limit, _clock) = aimd(1, 2, 10);
    let (tx, response) = streaming_response(&limit).await;
    assert_eq!(limit.in_flight(), 1);
    // The client goes away mid-body; the server finds out when it writes
    // the next chunks, and drops the body.
    drop(response);
    let start = Instant::now();
    while limit.in_flight() != 0 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "never given back"
        );
        let _ = tx.send(Frame::data(Bytes::from_static(b"more ")));
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert_eq!(limit.limit(), 2);
    assert_eq!(limit.history().unwrap().changes(), 0);
}

/// A closed port: connecting to it is refused.
async fn closed_port() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn around_an_outbound_client_refusals_are_errors_and_failures_overload() {
    let release = Arc::new(Semaphore::new(0));
    let hits = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&hits);
    let router = app(&release).layer(axum::middleware::from_fn(
        move |request: axum::extract::Request, next: axum::middleware::Next| {
            counted.fetch_add(1, Ordering::SeqCst);
            next.run(request)
        },
    ));
    let addr = serve(router).await;
    let (limit, _clock) = aimd(1, 1, 10);
    let http = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let client = ConcurrencyLayer::builder(Arc::clone(&limit))
        .client()
        .build()
        .layer(http);
    let call = |uri: String| {
        let client = client.clone();
        async move {
            let request = Request::get(uri).body(Empty::<Bytes>::new()).unwrap();
            let response = client.oneshot(request).await?;
            let status = response.status();
            response.into_body().collect().await.unwrap();
            Ok::<_, ConcurrencyError<_>>(status)
        }
    };

    // Successes grow the limit, a 503 from upstream and a refused
    // connection shrink it: 1 → 2 → 3 → ⌊2.7⌋ → ⌊1.8⌋.
    assert_eq!(
        call(format!("http://{addr}/ok")).await.unwrap(),
        StatusCode::OK
    );
    assert_eq!(
        call(format!("http://{addr}/ok")).await.unwrap(),
        StatusCode::OK
    );
    assert_eq!(limit.limit(), 3);
    assert_eq!(
        call(format!("http://{addr}/unavailable")).await.unwrap(),
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(limit.limit(), 2);
    let dead = closed_port().await;
    match call(format!("http://{dead}/ok")).await {
        Err(ConcurrencyError::Inner(error)) => assert!(error.is_connect(), "{error}"),
        other => panic!("expected the client's error, got {other:?}"),
    }
    assert_eq!(limit.limit(), 1);
    assert_eq!(limit.in_flight(), 0);

    // The one permit held by a request upstream holds: the next is not sent.
    let held = tokio::spawn(call(format!("http://{addr}/hold")));
    eventually("the permit taken", || limit.in_flight() == 1).await;
    let sent = hits.load(Ordering::SeqCst);
    match call(format!("http://{addr}/ok")).await {
        Err(ConcurrencyError::Overloaded { limit: 1 }) => {}
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_eq!(
        hits.load(Ordering::SeqCst),
        sent,
        "the refused request was not sent"
    );
    release.add_permits(1);
    assert_eq!(held.await.unwrap().unwrap(), StatusCode::OK);
    assert_eq!(limit.in_flight(), 0);
}

/// A `ThrottleLayer` in front of a `ConcurrencyLayer` in one `ServiceBuilder`
/// (no axum router between them): a request the rate limit refuses gets its
/// `429` and never takes a permit; an admitted one holds its permit until
/// its body is dropped.
#[tokio::test]
async fn a_throttle_in_front_composes_and_spends_no_permit() {
    use http_body_util::Full;
    use tollgate::{Rate, TokenBucket};
    use tollgate_tower::{Global, Limit, ThrottleLayer};
    use tower::{ServiceBuilder, service_fn};

    let bucket = TokenBucket::with_clock(1, Rate::per_hour(1), ManualClock::new()).unwrap();
    let throttle = ThrottleLayer::builder(Global)
        .policy(Limit::new("global", bucket).unwrap())
        .build();
    let limit = Arc::new(ConcurrencyLimit::new(4).unwrap());
    let service = ServiceBuilder::new()
        .layer(throttle)
        .layer(ConcurrencyLayer::new(Arc::clone(&limit)))
        .service(service_fn(|_: Request<()>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(Bytes::from_static(
                b"ok",
            ))))
        }));
    let admitted = service.clone().oneshot(Request::new(())).await.unwrap();
    assert_eq!(admitted.status(), StatusCode::OK);
    assert_eq!(limit.in_flight(), 1);
    let throttled = service.oneshot(Request::new(())).await.unwrap();
    assert_eq!(throttled.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(limit.in_flight(), 1, "the refused request took no permit");
    drop(admitted);
    assert_eq!(limit.in_flight(), 0);
}

/// gRPC answers `200` and says how a call ended in `grpc-status`, in its
/// trailers (or in the head of a trailers-only answer): `UNAVAILABLE`,
/// `RESOURCE_EXHAUSTED` and `DEADLINE_EXCEEDED` back the adaptive limit off;
/// `OK` is a success.
#[tokio::test]
async fn a_grpc_status_of_overload_backs_the_adaptive_limit_off() {
    let (limit, _clock) = aimd(1, 4, 10);
    let service = ConcurrencyLayer::new(Arc::clone(&limit)).layer(tower::service_fn(
        |request: Request<()>| async move {
            let code = request.uri().path().trim_start_matches('/').to_owned();
            let mut response = http::Response::builder().header("content-type", "application/grpc");
            let mut frames = Vec::new();
            if let Some(head_only) = code.strip_prefix("head-") {
                // Trailers-only: the status in the head, no body.
                response = response.header("grpc-status", head_only);
            } else {
                let mut trailers = http::HeaderMap::new();
                trailers.insert("grpc-status", code.parse().unwrap());
                frames.push(Frame::data(Bytes::from_static(b"\0\0\0\0\0")));
                frames.push(Frame::trailers(trailers));
            }
            Ok::<_, std::convert::Infallible>(response.body(ChannelBody::of(frames)).unwrap())
        },
    ));
    // One call at a time: a success with 1 of ≥ 3 in flight changes nothing;
    // a drop is × 0.9; other codes (NOT_FOUND) are successes: at a limit of
    // 1, + 1.
    for (code, after) in [
        ("0", 4),
        ("14", 3),
        ("0", 3),
        ("8", 2),
        ("head-4", 1),
        ("5", 2),
    ] {
        let response = service
            .clone()
            .oneshot(Request::get(format!("/{code}")).body(()).unwrap())
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        response.into_body().collect().await.unwrap();
        assert_eq!(limit.in_flight(), 0);
        assert_eq!(limit.limit(), after, "after grpc-status {code}");
    }
}
