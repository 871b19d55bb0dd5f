//! Concurrency limits at the entry (or the exit): a layer that admits a
//! request only with a permit of an in-flight limit — a fixed
//! [`ConcurrencyLimit`] or an [`AdaptiveLimit`] that finds the service's
//! capacity by itself — holds the permit until the response's body is done,
//! and tells the limit how the request ended.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tollgate::{
    AdaptiveLimit, Clock, ConcurrencyLimit, LimitAlgorithm, OwnedAdaptivePermit, OwnedPermit,
};
use tower_layer::Layer;
use tower_service::Service;

use crate::metrics;
use crate::response::{Refusal, grpc_response, is_grpc, problem_response};

type RefusalHook = Arc<dyn Fn(&Refusal<'_>) -> Response<Bytes> + Send + Sync>;

mod sealed {
    #[allow(unreachable_pub)]
    pub trait Sealed {}
}

/// An in-flight limit the [`ConcurrencyLayer`] takes permits from:
/// [`ConcurrencyLimit`] (a fixed bound) or [`AdaptiveLimit`] (a bound its
/// algorithm moves from each request's outcome). Sealed.
///
/// ```
/// use tollgate::{AdaptiveLimit, ConcurrencyLimit, RoundTrip};
/// use tollgate_tower::InFlightLimit;
///
/// fn room<L: InFlightLimit>(limit: &L) -> u32 {
///     limit.limit() - limit.in_flight().min(limit.limit())
/// }
/// assert_eq!(room(&ConcurrencyLimit::new(8)?), 8);
/// // The recommended adaptive limit starts at 1 and finds the rest itself.
/// assert_eq!(room(&AdaptiveLimit::new(RoundTrip::default())?), 1);
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
pub trait InFlightLimit: sealed::Sealed + Send + Sync + 'static {
    /// A permit, held by the request until its response is done.
    #[doc(hidden)]
    type Permit: Send + 'static;

    #[doc(hidden)]
    fn try_permit(self: &Arc<Self>) -> Option<Self::Permit>;

    #[doc(hidden)]
    fn wait_permit(self: Arc<Self>) -> Pin<Box<dyn Future<Output = Self::Permit> + Send>>;

    #[doc(hidden)]
    fn record(permit: Self::Permit, outcome: tollgate::Outcome);

    /// The limit in force.
    fn limit(&self) -> u32;

    /// Permits held now (a reading).
    fn in_flight(&self) -> u32;
}

impl sealed::Sealed for ConcurrencyLimit {}

impl InFlightLimit for ConcurrencyLimit {
    type Permit = OwnedPermit;

    fn try_permit(self: &Arc<Self>) -> Option<OwnedPermit> {
        self.try_acquire_owned()
    }

    fn wait_permit(self: Arc<Self>) -> Pin<Box<dyn Future<Output = OwnedPermit> + Send>> {
        Box::pin(self.acquire_owned_async())
    }

    /// A fixed limit learns nothing: the permit goes back.
    fn record(permit: OwnedPermit, _: tollgate::Outcome) {
        drop(permit);
    }

    fn limit(&self) -> u32 {
        ConcurrencyLimit::limit(self)
    }

    fn in_flight(&self) -> u32 {
        ConcurrencyLimit::in_flight(self)
    }
}

impl<A, C> sealed::Sealed for AdaptiveLimit<A, C> {}

impl<A, C> InFlightLimit for AdaptiveLimit<A, C>
where
    A: LimitAlgorithm + 'static,
    C: Clock + Send + Sync + 'static,
{
    type Permit = OwnedAdaptivePermit<A, C>;

    fn try_permit(self: &Arc<Self>) -> Option<Self::Permit> {
        self.try_acquire_owned()
    }

    fn wait_permit(self: Arc<Self>) -> Pin<Box<dyn Future<Output = Self::Permit> + Send>> {
        Box::pin(self.acquire_owned_async())
    }

    fn record(permit: Self::Permit, outcome: tollgate::Outcome) {
        permit.record(outcome);
    }

    fn limit(&self) -> u32 {
        AdaptiveLimit::limit(self)
    }

    fn in_flight(&self) -> u32 {
        AdaptiveLimit::in_flight(self)
    }
}

/// How a request's ending is reported to an adaptive limit: from the
/// response's head, or from the inner service's error (`E`).
///
/// [`DefaultClassify`] is the default; a closure
/// `Fn(StatusCode, &HeaderMap) -> tollgate::Outcome` is a classifier that
/// counts every error as [`Dropped`](tollgate::Outcome::Dropped). Implement
/// the trait to judge errors too (a client's own mistakes, say, as
/// [`Ignored`](tollgate::Outcome::Ignored)).
///
/// ```
/// use http::{HeaderMap, StatusCode};
/// use tollgate::Outcome;
/// use tollgate_tower::Classify;
///
/// // gRPC over HTTP: the status is in a header, and only UNAVAILABLE (14) is overload.
/// let grpc = |_: StatusCode, headers: &HeaderMap| match headers.get("grpc-status") {
///     Some(code) if code == "14" => Outcome::Dropped,
///     _ => Outcome::Success,
/// };
/// assert_eq!(Classify::<std::io::Error>::response(&grpc, StatusCode::OK, &HeaderMap::new()), Outcome::Success);
/// ```
pub trait Classify<E>: Send + Sync + 'static {
    /// The outcome of a response, from its status and headers.
    fn response(&self, status: StatusCode, headers: &HeaderMap) -> tollgate::Outcome;

    /// The outcome of an error from the inner service (default:
    /// [`Dropped`](tollgate::Outcome::Dropped): a timeout, a refused or
    /// reset connection — the service could not answer).
    fn error(&self, error: &E) -> tollgate::Outcome {
        let _ = error;
        tollgate::Outcome::Dropped
    }
}

impl<E, F> Classify<E> for F
where
    F: Fn(StatusCode, &HeaderMap) -> tollgate::Outcome + Send + Sync + 'static,
{
    fn response(&self, status: StatusCode, headers: &HeaderMap) -> tollgate::Outcome {
        self(status, headers)
    }
}

/// The default classification:
///
/// | ending | outcome | why |
/// |---|---|---|
/// | `1xx`, `2xx`, `3xx` | [`Success`](tollgate::Outcome::Success), its latency a sample | the service did the work |
/// | `5xx` | [`Dropped`](tollgate::Outcome::Dropped) | the service failed; under load, mostly from overload |
/// | `429`, `408` | [`Dropped`](tollgate::Outcome::Dropped) | the service (or a layer inside this one) says it is too busy, or a request timed out |
/// | other `4xx` | [`Ignored`](tollgate::Outcome::Ignored) | the client's mistake: often answered without the work, its latency would make the service look faster than it is |
/// | a gRPC `grpc-status` (in the head of a trailers-only answer, or in the trailers) of `UNAVAILABLE` (14), `RESOURCE_EXHAUSTED` (8) or `DEADLINE_EXCEEDED` (4) | [`Dropped`](tollgate::Outcome::Dropped) | gRPC answers `200` and says in `grpc-status` how the call ended; these three are overload |
/// | an error from the inner service | [`Dropped`](tollgate::Outcome::Dropped) | a timeout, a refused or reset connection |
/// | the response future or body dropped unfinished (the client went away) | [`Ignored`](tollgate::Outcome::Ignored), unless the head already said `Dropped` | abandoned work says nothing about capacity |
///
/// A `5xx` that is a bug rather than overload (a handler failing at once)
/// still backs the limit off; classify such routes yourself if they are
/// common. The gRPC rule for trailers holds whatever the classifier: a
/// response whose trailers carry one of those three codes is recorded as
/// dropped (the head, `200`, could not say so).
///
/// ```
/// use http::{HeaderMap, StatusCode};
/// use tollgate::Outcome;
/// use tollgate_tower::{Classify, DefaultClassify};
///
/// let head = |status: u16| Classify::<()>::response(&DefaultClassify, StatusCode::from_u16(status).unwrap(), &HeaderMap::new());
/// assert_eq!(head(200), Outcome::Success);
/// assert_eq!(head(503), Outcome::Dropped);
/// assert_eq!(head(429), Outcome::Dropped);
/// assert_eq!(head(404), Outcome::Ignored);
/// assert_eq!(DefaultClassify.error(&()), Outcome::Dropped);
/// let mut grpc = HeaderMap::new();
/// grpc.insert("grpc-status", "14".parse().unwrap());
/// assert_eq!(Classify::<()>::response(&DefaultClassify, StatusCode::OK, &grpc), Outcome::Dropped);
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct DefaultClassify;

impl<E> Classify<E> for DefaultClassify {
    fn response(&self, status: StatusCode, headers: &HeaderMap) -> tollgate::Outcome {
        use tollgate::Outcome::{Dropped, Ignored, Success};
        match status.as_u16() {
            500..=599 | 429 | 408 => Dropped,
            400..=499 => Ignored,
            _ => grpc_overload(headers).unwrap_or(Success),
        }
    }
}

/// `Dropped` for a gRPC status that means overload: `UNAVAILABLE` (14),
/// `RESOURCE_EXHAUSTED` (8), `DEADLINE_EXCEEDED` (4).
fn grpc_overload(headers: &HeaderMap) -> Option<tollgate::Outcome> {
    match headers.get("grpc-status")?.as_bytes() {
        b"14" | b"8" | b"4" => Some(tollgate::Outcome::Dropped),
        _ => None,
    }
}

/// What a [`Concurrency`] service does with a request it has no permit for:
/// [`ServerFace`] answers `503`, [`ClientFace`] returns
/// [`ConcurrencyError::Overloaded`]. Sealed.
pub trait Face: sealed::Sealed + Send + Sync + 'static {
    /// The service's error type over the inner service's error `E`.
    type Error<E>;

    #[doc(hidden)]
    fn inner<E>(error: E) -> Self::Error<E>;

    #[doc(hidden)]
    fn shed<E>(hook: &RefusalHook, limit: u32) -> Result<Response<Bytes>, Self::Error<E>>;
}

/// The server's face (the default): a request without a permit is answered
/// `503 Service Unavailable` (a problem document, or the
/// [`on_shed`](ConcurrencyBuilder::on_shed) hook's response) — a gRPC call
/// with `grpc-status` `14` `UNAVAILABLE` (the
/// [`on_grpc_shed`](ConcurrencyBuilder::on_grpc_shed) hook's response) —
/// and the inner service's errors pass through unchanged.
#[derive(Debug, Clone, Copy, Default)]
pub struct ServerFace;

/// The client's face ([`ConcurrencyBuilder::client`]): a request without a
/// permit is not sent and fails with [`ConcurrencyError::Overloaded`]; the
/// inner service's errors come as [`ConcurrencyError::Inner`].
#[derive(Debug, Clone, Copy, Default)]
pub struct ClientFace;

impl sealed::Sealed for ServerFace {}
impl sealed::Sealed for ClientFace {}

impl Face for ServerFace {
    type Error<E> = E;

    fn inner<E>(error: E) -> E {
        error
    }

    fn shed<E>(hook: &RefusalHook, limit: u32) -> Result<Response<Bytes>, E> {
        Ok(shed_response(hook, limit))
    }
}

impl Face for ClientFace {
    type Error<E> = ConcurrencyError<E>;

    fn inner<E>(error: E) -> ConcurrencyError<E> {
        ConcurrencyError::Inner(error)
    }

    fn shed<E>(_: &RefusalHook, limit: u32) -> Result<Response<Bytes>, ConcurrencyError<E>> {
        Err(ConcurrencyError::Overloaded { limit })
    }
}

#[cold]
#[inline(never)]
fn shed_response(hook: &RefusalHook, limit: u32) -> Response<Bytes> {
    hook(&Refusal::Overloaded { limit })
}

/// The error of a [`Concurrency`] service on the client's face.
///
/// ```
/// use tollgate_tower::ConcurrencyError;
///
/// let refused: ConcurrencyError<std::io::Error> = ConcurrencyError::Overloaded { limit: 8 };
/// assert!(refused.is_overloaded());
/// assert_eq!(refused.to_string(), "not sent: all 8 permits of the concurrency limit are in use");
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum ConcurrencyError<E> {
    /// No permit was free (within the queue's bound, if there is one): the
    /// request was not sent. Nothing was recorded to the limit.
    Overloaded {
        /// The limit in force when the request was refused.
        limit: u32,
    },
    /// The inner service's error, recorded as its classifier said (by
    /// default: [`Dropped`](tollgate::Outcome::Dropped)).
    Inner(E),
}

impl<E> ConcurrencyError<E> {
    /// Whether the request was refused by the limit (not sent).
    pub fn is_overloaded(&self) -> bool {
        matches!(self, ConcurrencyError::Overloaded { .. })
    }

    /// The inner service's error, if it was one.
    pub fn into_inner(self) -> Option<E> {
        match self {
            ConcurrencyError::Inner(error) => Some(error),
            ConcurrencyError::Overloaded { .. } => None,
        }
    }
}

impl<E: fmt::Display> fmt::Display for ConcurrencyError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConcurrencyError::Overloaded { limit } => write!(
                f,
                "not sent: all {limit} permits of the concurrency limit are in use"
            ),
            ConcurrencyError::Inner(error) => error.fmt(f),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for ConcurrencyError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ConcurrencyError::Inner(error) => Some(error),
            ConcurrencyError::Overloaded { .. } => None,
        }
    }
}

/// How long, and how many, requests may wait for a permit.
#[derive(Debug, Clone, Copy)]
struct Queue {
    max_waiting: u32,
    timeout: Duration,
}

struct Shared<L, K> {
    limit: Arc<L>,
    classify: K,
    queue: Option<Queue>,
    /// Requests waiting for a permit now.
    waiting: AtomicU32,
    on_shed: RefusalHook,
    on_grpc_shed: RefusalHook,
}

/// Builds a [`ConcurrencyLayer`]; start with [`ConcurrencyLayer::builder`].
pub struct ConcurrencyBuilder<L, K = DefaultClassify, F = ServerFace> {
    limit: Arc<L>,
    classify: K,
    queue: Option<Queue>,
    on_shed: RefusalHook,
    on_grpc_shed: RefusalHook,
    face: F,
}

impl<L: InFlightLimit, K, F: Face> ConcurrencyBuilder<L, K, F> {
    /// Lets a request that finds every permit taken wait for one, up to
    /// `timeout`, if fewer than `max_waiting` requests wait already; it is
    /// refused at once otherwise, and when the timeout passes. Waiters are
    /// woken in the order they came, but a request arriving as a permit
    /// comes back may take it first (the core's
    /// [`ConcurrencyLimit`] ordering). The wait is not part of the
    /// request's latency sample, which starts at the grant. Without a
    /// queue (the default), a request without a free permit is refused at
    /// once.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use tollgate::ConcurrencyLimit;
    /// use tollgate_tower::ConcurrencyLayer;
    ///
    /// let limit = Arc::new(ConcurrencyLimit::new(64)?);
    /// let _layer = ConcurrencyLayer::builder(limit).queue(256, Duration::from_millis(50)).build();
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn queue(mut self, max_waiting: u32, timeout: Duration) -> Self {
        self.queue = Some(Queue {
            max_waiting,
            timeout,
        });
        self
    }

    /// How responses and errors are reported to the limit (default
    /// [`DefaultClassify`]).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use http::{HeaderMap, StatusCode};
    /// use tollgate::{AdaptiveLimit, Outcome, RoundTrip};
    /// use tollgate_tower::ConcurrencyLayer;
    ///
    /// let limit = Arc::new(AdaptiveLimit::new(RoundTrip::default())?);
    /// // Only 503 is overload; everything else answered is a success.
    /// let _layer = ConcurrencyLayer::builder(limit)
    ///     .classify(|status: StatusCode, _: &HeaderMap| {
    ///         if status == StatusCode::SERVICE_UNAVAILABLE { Outcome::Dropped } else { Outcome::Success }
    ///     })
    ///     .build();
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn classify<K2>(self, classify: K2) -> ConcurrencyBuilder<L, K2, F> {
        ConcurrencyBuilder {
            limit: self.limit,
            classify,
            queue: self.queue,
            on_shed: self.on_shed,
            on_grpc_shed: self.on_grpc_shed,
            face: self.face,
        }
    }

    /// The response to a refused request on the server's face, unless it is
    /// a gRPC call (see [`on_grpc_shed`](Self::on_grpc_shed)) (default:
    /// [`problem_response`] of [`Refusal::Overloaded`], a `503` problem
    /// document without `Retry-After`: a concurrency limit cannot know
    /// when a permit will come back). A hook that knows better — a typical
    /// response time, a client contract — may add one.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use bytes::Bytes;
    /// use http::{Response, StatusCode};
    /// use tollgate::ConcurrencyLimit;
    /// use tollgate_tower::ConcurrencyLayer;
    ///
    /// let layer = ConcurrencyLayer::builder(Arc::new(ConcurrencyLimit::new(32)?))
    ///     .on_shed(|refusal| {
    ///         let mut response = Response::new(Bytes::from_static(b"busy, try again"));
    ///         *response.status_mut() = refusal.status();
    ///         response.headers_mut().insert("retry-after", "1".parse().unwrap());
    ///         response
    ///     })
    ///     .build();
    /// # let _ = layer;
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn on_shed(
        mut self,
        hook: impl Fn(&Refusal<'_>) -> Response<Bytes> + Send + Sync + 'static,
    ) -> Self {
        self.on_shed = Arc::new(hook);
        self
    }

    /// The response to a refused gRPC call on the server's face — a request
    /// whose `content-type` is `application/grpc`, or starts with
    /// `application/grpc+` or `application/grpc;` (default:
    /// [`grpc_response`] of [`Refusal::Overloaded`]: HTTP `200` with
    /// `grpc-status` `14` `UNAVAILABLE` in a trailers-only response, which a
    /// gRPC client reports as the call's status and its retry policy may
    /// retry; no pushback, for the reason `on_shed` gives no
    /// `Retry-After`).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use bytes::Bytes;
    /// use http::{HeaderValue, Request};
    /// use http_body_util::Full;
    /// use tollgate::ConcurrencyLimit;
    /// use tollgate_tower::{ConcurrencyLayer, Layer, grpc_response};
    /// use tower::{ServiceExt, service_fn};
    ///
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let limit = Arc::new(ConcurrencyLimit::new(1).unwrap());
    /// let layer = ConcurrencyLayer::builder(Arc::clone(&limit))
    ///     // The default, with a pushback of a second for clients that retry.
    ///     .on_grpc_shed(|refusal| {
    ///         let mut response = grpc_response(refusal);
    ///         response.headers_mut().insert("grpc-retry-pushback-ms", HeaderValue::from_static("1000"));
    ///         response
    ///     })
    ///     .build();
    /// let service = layer.layer(service_fn(|_: Request<()>| async {
    ///     Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(Bytes::new())))
    /// }));
    /// let _held = limit.try_acquire().unwrap();
    /// let call = Request::post("/demo.Greeter/SayHello").header("content-type", "application/grpc+proto").body(()).unwrap();
    /// let shed = service.oneshot(call).await.unwrap();
    /// assert_eq!(shed.status(), 200);
    /// assert_eq!(shed.headers()["grpc-status"], "14");
    /// assert_eq!(shed.headers()["grpc-retry-pushback-ms"], "1000");
    /// # });
    /// ```
    pub fn on_grpc_shed(
        mut self,
        hook: impl Fn(&Refusal<'_>) -> Response<Bytes> + Send + Sync + 'static,
    ) -> Self {
        self.on_grpc_shed = Arc::new(hook);
        self
    }

    /// The client's face: around an outbound client (any
    /// `Service<Request<B>>`, such as hyper-util's), a request without a
    /// permit is not sent and fails with [`ConcurrencyError::Overloaded`];
    /// the client's errors (timeouts, refused connections) come as
    /// [`ConcurrencyError::Inner`] and count as overload by default.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tollgate::{AdaptiveLimit, RoundTrip};
    /// use tollgate_tower::ConcurrencyLayer;
    ///
    /// let limit = Arc::new(AdaptiveLimit::new(RoundTrip::default())?);
    /// let _outbound = ConcurrencyLayer::builder(limit).client().build();
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn client(self) -> ConcurrencyBuilder<L, K, ClientFace> {
        ConcurrencyBuilder {
            limit: self.limit,
            classify: self.classify,
            queue: self.queue,
            on_shed: self.on_shed,
            on_grpc_shed: self.on_grpc_shed,
            face: ClientFace,
        }
    }

    /// The layer.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tollgate::ConcurrencyLimit;
    /// use tollgate_tower::ConcurrencyLayer;
    /// let _layer = ConcurrencyLayer::builder(Arc::new(ConcurrencyLimit::new(32)?)).build();
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn build(self) -> ConcurrencyLayer<L, K, F> {
        ConcurrencyLayer {
            shared: Arc::new(Shared {
                limit: self.limit,
                classify: self.classify,
                queue: self.queue,
                waiting: AtomicU32::new(0),
                on_shed: self.on_shed,
                on_grpc_shed: self.on_grpc_shed,
            }),
            face: self.face,
        }
    }
}

impl<L, K, F> fmt::Debug for ConcurrencyBuilder<L, K, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrencyBuilder")
            .field("queue", &self.queue)
            .finish_non_exhaustive()
    }
}

/// A concurrency limit for a tower service: each request needs a permit of
/// an [`InFlightLimit`] — a fixed [`ConcurrencyLimit`], or an
/// [`AdaptiveLimit`] that moves its bound from how requests end — held until
/// its response's body is done.
///
/// - **Admitted**: the inner service's response, its body wrapped in a
///   [`PermitBody`] that holds the permit. When the body ends, the permit
///   goes back with the outcome the classifier ([`DefaultClassify`]) gave
///   the head: `2xx`/`3xx` a success timed from the grant to the body's end
///   (on the limit's clock), `5xx`, `429`, `408` and the inner service's
///   errors a drop, other `4xx` ignored.
/// - **No permit free**: on the server's face (the default), `503` with a
///   problem document ([`Refusal::Overloaded`]) and no `Retry-After` (a
///   gRPC call: `grpc-status` `14` `UNAVAILABLE`, see
///   [`grpc_response`](crate::grpc_response)); on the client's face
///   ([`ConcurrencyBuilder::client`]), the error
///   [`ConcurrencyError::Overloaded`] and nothing sent. With
///   [`queue`](ConcurrencyBuilder::queue), a bounded number of requests wait
///   a bounded time first. A refusal records nothing.
/// - **Cancel-safe**: a response future dropped before it completes (the
///   client went away), waiting or not, holds no permit afterwards; a body
///   dropped before its end gives its permit back as ignored (unless its
///   head said dropped). The permit's own drop does it, so nothing can leak.
///
/// Put a rate-limiting [`ThrottleLayer`](crate::ThrottleLayer) *in front*
/// of it, so that requests a per-client quota refuses never take a permit
/// (and their `429`s are not mistaken for overload).
///
/// ```
/// use std::sync::Arc;
/// use tollgate::{AdaptiveLimit, RoundTrip};
/// use tollgate_tower::ConcurrencyLayer;
///
/// // The recommended algorithm with its defaults: from a limit of 1, one
/// // decision per round trip of the service; +1 a round trip while the limit
/// // is used and latency shows no queue (faster after eight such rounds in a
/// // row), down when it shows one, × 0.7 at once when a request fails.
/// let limit = Arc::new(AdaptiveLimit::new(RoundTrip::default())?);
/// let layer = ConcurrencyLayer::new(Arc::clone(&limit));
/// let router: axum::Router = axum::Router::new()
///     .route("/", axum::routing::get(|| async { "hello" }))
///     .layer(layer);
/// # let _ = router;
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
pub struct ConcurrencyLayer<L, K = DefaultClassify, F = ServerFace> {
    shared: Arc<Shared<L, K>>,
    face: F,
}

impl<L: InFlightLimit> ConcurrencyLayer<L> {
    /// A layer taking permits from `limit`, refusing at once with `503` when
    /// none is free, classifying with [`DefaultClassify`].
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tollgate::ConcurrencyLimit;
    /// use tollgate_tower::ConcurrencyLayer;
    /// let _layer = ConcurrencyLayer::new(Arc::new(ConcurrencyLimit::new(100)?));
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn new(limit: Arc<L>) -> Self {
        Self::builder(limit).build()
    }

    /// A builder: a queue, a classifier, a refusal response, the client's
    /// face.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use tollgate::ConcurrencyLimit;
    /// use tollgate_tower::ConcurrencyLayer;
    /// let _layer = ConcurrencyLayer::builder(Arc::new(ConcurrencyLimit::new(100)?))
    ///     .queue(100, Duration::from_millis(20))
    ///     .build();
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn builder(limit: Arc<L>) -> ConcurrencyBuilder<L> {
        ConcurrencyBuilder {
            limit,
            classify: DefaultClassify,
            queue: None,
            on_shed: Arc::new(problem_response),
            on_grpc_shed: Arc::new(grpc_response),
            face: ServerFace,
        }
    }
}

impl<L, K, F> ConcurrencyLayer<L, K, F> {
    /// The limit permits are taken from.
    pub fn limit(&self) -> &Arc<L> {
        &self.shared.limit
    }
}

impl<L, K, F: Clone> Clone for ConcurrencyLayer<L, K, F> {
    fn clone(&self) -> Self {
        ConcurrencyLayer {
            shared: Arc::clone(&self.shared),
            face: self.face.clone(),
        }
    }
}

impl<L: fmt::Debug, K, F> fmt::Debug for ConcurrencyLayer<L, K, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrencyLayer")
            .field("limit", &self.shared.limit)
            .field("queue", &self.shared.queue)
            .finish_non_exhaustive()
    }
}

impl<S, L, K, F: Clone> Layer<S> for ConcurrencyLayer<L, K, F> {
    type Service = Concurrency<S, L, K, F>;

    fn layer(&self, inner: S) -> Self::Service {
        Concurrency {
            inner,
            shared: Arc::clone(&self.shared),
            face: self.face.clone(),
        }
    }
}

/// The service [`ConcurrencyLayer`] wraps around another: see there.
///
/// ```
/// use std::convert::Infallible;
/// use std::sync::Arc;
/// use bytes::Bytes;
/// use http::{Request, Response};
/// use http_body_util::Full;
/// use tollgate::ConcurrencyLimit;
/// use tollgate_tower::{ConcurrencyError, ConcurrencyLayer};
/// use tower::{Service, ServiceExt, service_fn};
/// use tower_layer::Layer;
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let limit = Arc::new(ConcurrencyLimit::new(1).unwrap());
/// let inner = service_fn(|_: Request<()>| async {
///     Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
/// });
/// // The server's face: a 503 when the permit is taken.
/// let mut server = ConcurrencyLayer::new(Arc::clone(&limit)).layer(inner.clone());
/// let first = server.ready().await.unwrap().call(Request::new(())).await.unwrap();
/// assert_eq!(limit.in_flight(), 1); // held by `first`'s body
/// let second = server.ready().await.unwrap().call(Request::new(())).await.unwrap();
/// assert_eq!(second.status(), 503);
/// drop(first); // the body, unread: the permit goes back
/// assert_eq!(limit.in_flight(), 0);
///
/// // The client's face: an error, the request not sent.
/// let mut client = ConcurrencyLayer::builder(Arc::clone(&limit)).client().build().layer(inner);
/// let _held = limit.try_acquire().unwrap();
/// let refused = client.ready().await.unwrap().call(Request::new(())).await.unwrap_err();
/// assert!(matches!(refused, ConcurrencyError::Overloaded { limit: 1 }));
/// # });
/// ```
pub struct Concurrency<S, L, K = DefaultClassify, F = ServerFace> {
    inner: S,
    shared: Arc<Shared<L, K>>,
    face: F,
}

impl<S: Clone, L, K, F: Clone> Clone for Concurrency<S, L, K, F> {
    fn clone(&self) -> Self {
        Concurrency {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
            face: self.face.clone(),
        }
    }
}

impl<S: fmt::Debug, L, K, F> fmt::Debug for Concurrency<S, L, K, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Concurrency")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

type BoxResult<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

impl<S, L, K, F, ReqBody, ResBody> Service<Request<ReqBody>> for Concurrency<S, L, K, F>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    L: InFlightLimit,
    K: Classify<S::Error>,
    F: Face,
    F::Error<S::Error>: Send + 'static,
    ReqBody: Send + 'static,
    ResBody: Body + Send + 'static,
{
    type Response = Response<PermitBody<ResBody, L>>;
    type Error = F::Error<S::Error>;
    type Future = ConcurrencyFuture<S::Future, L, K, F, ResBody, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(F::inner)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let shared = &self.shared;
        if let Some(permit) = shared.limit.try_permit() {
            metrics::concurrency("admitted", || {
                (shared.limit.in_flight(), shared.limit.limit())
            });
            return ConcurrencyFuture {
                kind: FutureKind::Inner {
                    future: self.inner.call(request),
                    held: Some((permit, Arc::clone(shared))),
                },
            };
        }
        match shared.queue {
            Some(queue) if shared.waiting.fetch_add(1, Ordering::Relaxed) < queue.max_waiting => {
                metrics::concurrency("queued", || {
                    (shared.limit.in_flight(), shared.limit.limit())
                });
                self.queued(queue.timeout, request)
            }
            queue => {
                if queue.is_some() {
                    shared.waiting.fetch_sub(1, Ordering::Relaxed);
                }
                metrics::concurrency("shed", || (shared.limit.in_flight(), shared.limit.limit()));
                ConcurrencyFuture {
                    kind: FutureKind::Refused {
                        refusal: Some(shed::<L, K, F, ResBody, S::Error>(
                            shared,
                            request.headers(),
                        )),
                    },
                }
            }
        }
    }
}

/// The refusal of a request without a permit: a `503` (a gRPC status for a
/// gRPC call, whose headers are `request`) or an error, by face.
fn shed<L: InFlightLimit, K, F: Face, B, E>(
    shared: &Shared<L, K>,
    request: &HeaderMap,
) -> Result<Response<PermitBody<B, L>>, F::Error<E>> {
    let hook = if is_grpc(request) {
        &shared.on_grpc_shed
    } else {
        &shared.on_shed
    };
    F::shed(hook, shared.limit.limit()).map(|response| response.map(PermitBody::full))
}

/// Leaves the count of waiting requests when dropped: however the wait ends.
struct Waiting<L, K>(Arc<Shared<L, K>>);

impl<L, K> Drop for Waiting<L, K> {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::Relaxed);
    }
}

impl<S, L, K, F> Concurrency<S, L, K, F> {
    /// A request that waits for a permit, up to `timeout`, in a future that
    /// owns the service made ready (a clone takes its place).
    fn queued<ReqBody, ResBody>(
        &mut self,
        timeout: Duration,
        request: Request<ReqBody>,
    ) -> ConcurrencyFuture<S::Future, L, K, F, ResBody, S::Error>
    where
        S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
        S::Future: Send + 'static,
        S::Error: Send + 'static,
        L: InFlightLimit,
        K: Classify<S::Error>,
        F: Face,
        F::Error<S::Error>: Send + 'static,
        ReqBody: Send + 'static,
        ResBody: Body + Send + 'static,
    {
        let ready = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, ready);
        let waiting = Waiting(Arc::clone(&self.shared));
        ConcurrencyFuture {
            kind: FutureKind::Queued {
                future: Box::pin(async move {
                    let wait = Arc::clone(&waiting.0.limit).wait_permit();
                    #[cfg(feature = "metrics")]
                    let started = std::time::Instant::now();
                    let permit = tokio::time::timeout(timeout, wait).await;
                    #[cfg(feature = "metrics")]
                    metrics::queue_wait(started.elapsed());
                    let Waiting(shared) = &waiting;
                    let shared = Arc::clone(shared);
                    drop(waiting);
                    let Ok(permit) = permit else {
                        metrics::concurrency("shed", || {
                            (shared.limit.in_flight(), shared.limit.limit())
                        });
                        return shed::<L, K, F, ResBody, S::Error>(&shared, request.headers());
                    };
                    let result = inner.call(request).await;
                    finish::<L, K, F, ResBody, S::Error>(result, permit, &shared)
                }),
            },
        }
    }
}

/// Classifies the inner service's answer: a response's body takes the
/// permit with the head's outcome; an error records its own at once.
fn finish<L: InFlightLimit, K: Classify<E>, F: Face, B: Body, E>(
    result: Result<Response<B>, E>,
    permit: L::Permit,
    shared: &Shared<L, K>,
) -> Result<Response<PermitBody<B, L>>, F::Error<E>> {
    match result {
        Ok(response) => {
            let outcome = shared
                .classify
                .response(response.status(), response.headers());
            Ok(response.map(|body| PermitBody::held(body, permit, outcome)))
        }
        Err(error) => {
            record::<L>(permit, shared.classify.error(&error));
            Err(F::inner(error))
        }
    }
}

pin_project! {
    /// The response future of [`Concurrency`]: the inner service's response
    /// with its body holding the permit, or the refusal. Dropping it gives
    /// back a permit it holds (recorded as ignored) and leaves a queue it
    /// waits in.
    pub struct ConcurrencyFuture<Fut, L: InFlightLimit, K, F: Face, B, E> {
        #[pin]
        kind: FutureKind<Fut, L, K, F, B, E>,
    }
}

type Answer<B, L, F, E> = Result<Response<PermitBody<B, L>>, <F as Face>::Error<E>>;

pin_project! {
    #[project = FutureKindProj]
    enum FutureKind<Fut, L: InFlightLimit, K, F: Face, B, E> {
        // Admitted at once: the inner service's future, and the permit.
        Inner {
            #[pin]
            future: Fut,
            held: Option<(L::Permit, Arc<Shared<L, K>>)>,
        },
        // Waiting for a permit, then the inner service's future.
        Queued { future: BoxResult<Response<PermitBody<B, L>>, F::Error<E>> },
        // Refused at once.
        Refused { refusal: Option<Answer<B, L, F, E>> },
    }
}

impl<Fut, L, K, F, B, E> Future for ConcurrencyFuture<Fut, L, K, F, B, E>
where
    Fut: Future<Output = Result<Response<B>, E>>,
    L: InFlightLimit,
    K: Classify<E>,
    F: Face,
    B: Body,
{
    type Output = Answer<B, L, F, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            FutureKindProj::Inner { future, held } => {
                let result = std::task::ready!(future.poll(cx));
                let (permit, shared) = held
                    .take()
                    .expect("ConcurrencyFuture polled after completion");
                Poll::Ready(finish::<L, K, F, B, E>(result, permit, &shared))
            }
            FutureKindProj::Queued { future } => future.as_mut().poll(cx),
            FutureKindProj::Refused { refusal } => Poll::Ready(
                refusal
                    .take()
                    .expect("ConcurrencyFuture polled after completion"),
            ),
        }
    }
}

impl<Fut, L: InFlightLimit, K, F: Face, B, E> fmt::Debug for ConcurrencyFuture<Fut, L, K, F, B, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ConcurrencyFuture")
    }
}

pin_project! {
    /// A response body that holds its request's permit until it ends: the
    /// inner service's body, or the layer's own refusal document.
    ///
    /// When the body ends (its last frame read, or empty from the start)
    /// the permit goes back with the outcome its response's head was given;
    /// an error frame records a drop; dropped before its end (the client
    /// went away), it records the head's outcome if that was a drop, and
    /// nothing (ignored) otherwise — so does a body discarded unread above
    /// the layer, such as a `HEAD` response's.
    pub struct PermitBody<B, L: InFlightLimit> {
        #[pin]
        kind: BodyKind<B>,
        held: Held<L>,
    }
}

pin_project! {
    #[project = BodyKindProj]
    enum BodyKind<B> {
        Inner { #[pin] body: B },
        Full { data: Option<Bytes> },
    }
}

/// A permit and the outcome to record with it; on drop (the body abandoned
/// before its end), a drop is still recorded and anything else ignored.
struct Held<L: InFlightLimit>(Option<(L::Permit, tollgate::Outcome)>);

impl<L: InFlightLimit> Held<L> {
    fn record(&mut self, outcome: Option<tollgate::Outcome>) {
        if let Some((permit, head)) = self.0.take() {
            record::<L>(permit, outcome.unwrap_or(head));
        }
    }
}

impl<L: InFlightLimit> Drop for Held<L> {
    fn drop(&mut self) {
        if let Some((permit, head)) = self.0.take() {
            let outcome = match head {
                tollgate::Outcome::Dropped => tollgate::Outcome::Dropped,
                _ => tollgate::Outcome::Ignored,
            };
            record::<L>(permit, outcome);
        }
    }
}

/// Gives a permit back with its outcome, counted in the metrics.
fn record<L: InFlightLimit>(permit: L::Permit, outcome: tollgate::Outcome) {
    metrics::outcome(outcome);
    L::record(permit, outcome);
}

impl<B: Body, L: InFlightLimit> PermitBody<B, L> {
    fn held(body: B, permit: L::Permit, outcome: tollgate::Outcome) -> Self {
        let mut held = Held(Some((permit, outcome)));
        if body.is_end_stream() {
            // Nothing to wait for (an empty body may never be polled).
            held.record(None);
        }
        PermitBody {
            kind: BodyKind::Inner { body },
            held,
        }
    }
}

impl<B, L: InFlightLimit> PermitBody<B, L> {
    fn full(data: Bytes) -> Self {
        PermitBody {
            kind: BodyKind::Full {
                data: (!data.is_empty()).then_some(data),
            },
            held: Held(None),
        }
    }

    /// Whether the body still holds its request's permit (its end not yet
    /// read).
    pub fn holds_permit(&self) -> bool {
        self.held.0.is_some()
    }
}

/// A body of the layer's own, holding no permit: what lets a layer that
/// answers with `Bytes` bodies (a [`ThrottleLayer`](crate::ThrottleLayer)
/// in a `ServiceBuilder`) sit in front of this one.
impl<B, L: InFlightLimit> From<Bytes> for PermitBody<B, L> {
    fn from(data: Bytes) -> Self {
        PermitBody::full(data)
    }
}

impl<B, L> Body for PermitBody<B, L>
where
    B: Body,
    B::Data: From<Bytes>,
    L: InFlightLimit,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let this = self.project();
        match this.kind.project() {
            BodyKindProj::Inner { mut body } => {
                let frame = std::task::ready!(body.as_mut().poll_frame(cx));
                match &frame {
                    None => this.held.record(None),
                    Some(Err(_)) => this.held.record(Some(tollgate::Outcome::Dropped)),
                    // gRPC says how a call ended in its trailers.
                    Some(Ok(f)) if f.is_trailers() => {
                        this.held.record(f.trailers_ref().and_then(grpc_overload));
                    }
                    Some(Ok(_)) if body.is_end_stream() => this.held.record(None),
                    Some(Ok(_)) => {}
                }
                Poll::Ready(frame)
            }
            BodyKindProj::Full { data } => {
                Poll::Ready(data.take().map(|data| Ok(Frame::data(data.into()))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            BodyKind::Inner { body } => body.is_end_stream(),
            BodyKind::Full { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            BodyKind::Inner { body } => body.size_hint(),
            BodyKind::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |data| data.len() as u64))
            }
        }
    }
}

impl<B, L: InFlightLimit> fmt::Debug for PermitBody<B, L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PermitBody")
            .field("holds_permit", &self.holds_permit())
            .finish_non_exhaustive()
    }
}
