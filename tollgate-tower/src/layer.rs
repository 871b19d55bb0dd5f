//! The layer and its service: extract the key, ask the request's policies,
//! answer a refusal or pass the request on, and put the fields on the
//! response.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::RETRY_AFTER;
use http::request::Parts;
use http::{HeaderMap, Method, Request, Response};
use pin_project_lite::pin_project;
use tollgate::Denied;
use tower_layer::Layer;
use tower_service::Service;

use crate::fields::{Fields, retry_after_value};
use crate::key::KeyExtractor;
use crate::metrics;
use crate::policy::{Decision, OutcomeFuture, Policy, PolicyOutcome};
use crate::response::{Refusal, grpc_response, is_grpc, problem_response};

type CostFn = Arc<dyn Fn(&Parts) -> u32 + Send + Sync>;
type RefusalHook = Arc<dyn Fn(&Refusal<'_>) -> Response<Bytes> + Send + Sync>;
type Policies<K> = Vec<Arc<dyn Policy<K>>>;

/// Which requests a route group's policies apply to: a path (exact or a
/// prefix), optionally one method.
///
/// ```
/// use http::Method;
/// use tollgate_tower::Route;
///
/// let login = Route::exact("/login").method(Method::POST);
/// let api = Route::prefix("/api/");
/// # let _ = (login, api);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    method: Option<Method>,
    path: String,
    prefix: bool,
}

impl Route {
    /// Requests whose path is exactly `path`.
    ///
    /// ```
    /// use tollgate_tower::Route;
    /// let _ = Route::exact("/login");
    /// ```
    pub fn exact(path: impl Into<String>) -> Self {
        Route {
            method: None,
            path: path.into(),
            prefix: false,
        }
    }

    /// Requests whose path starts with `prefix` (byte-wise: write
    /// `"/api/"`, not `"/api"`, to leave `/apiary` out).
    ///
    /// ```
    /// use tollgate_tower::Route;
    /// let _ = Route::prefix("/api/");
    /// ```
    pub fn prefix(prefix: impl Into<String>) -> Self {
        Route {
            method: None,
            path: prefix.into(),
            prefix: true,
        }
    }

    /// Only requests with `method`.
    ///
    /// ```
    /// use http::Method;
    /// use tollgate_tower::Route;
    /// let _ = Route::exact("/login").method(Method::POST);
    /// ```
    pub fn method(mut self, method: Method) -> Self {
        self.method = Some(method);
        self
    }

    fn matches(&self, parts: &Parts) -> bool {
        if self.method.as_ref().is_some_and(|m| *m != parts.method) {
            return false;
        }
        let path = parts.uri.path();
        if self.prefix {
            path.starts_with(&self.path)
        } else {
            path == self.path
        }
    }
}

/// Builds a [`ThrottleLayer`]; start with [`ThrottleLayer::builder`].
///
/// A request is decided by the policies of the **first route group that
/// matches it** (in the order the groups were first named) together with the
/// policies for **every request**. All must admit, and they are
/// **all-or-nothing, whatever the order they were added in**:
///
/// 1. A request costing more than some policy's [capacity](Policy::capacity)
///    is refused (`403`) before any policy is asked: it spends nothing.
/// 2. The policies are asked narrowest first — by [`Scope`]: per-key limits,
///    then this process's shared limits, then limits shared with other
///    processes (Redis, leases); within a scope, in the order they were
///    added. The first refusal answers the request, and the policies after
///    it are not asked: a client refused by its own per-key limit never
///    spends a shared one.
/// 3. When a later policy refuses, every in-process policy that admitted the
///    request at once gives its permits back
///    ([`Policy::decide_then`]), by the core's refund rule: exact unless
///    another request was admitted by the same limiter in between, and never
///    more than "as if the request had not happened" (so a raced refund can
///    leave permits taken until they refill: under-admission, never
///    over-admission). A limiter that cannot give permits back safely (a
///    sliding log or window, a leased limiter) keeps them, so add it after
///    refundable ones of its scope.
/// 4. What cannot be given back: an admission that was awaited (a
///    [`Shaped`](crate::Shaped) or [`PerKey::wait_up_to`](crate::PerKey::wait_up_to)
///    wait, a remote decision) and every admission before it stand even if a
///    policy asked after them refuses. Remote policies are asked last for
///    that reason.
///
/// [`Scope`]: crate::Scope
pub struct ThrottleBuilder<E: KeyExtractor> {
    extractor: E,
    every: Policies<E::Key>,
    routes: Vec<(Route, Policies<E::Key>)>,
    cost: Option<CostFn>,
    on_refusal: RefusalHook,
    on_grpc_refusal: RefusalHook,
}

impl<E: KeyExtractor> ThrottleBuilder<E> {
    /// Adds `policy` for every request.
    ///
    /// ```
    /// use tollgate::{Rate, TokenBucket};
    /// use tollgate_tower::{Global, Limit, ThrottleLayer};
    /// let layer = ThrottleLayer::builder(Global)
    ///     .policy(Limit::new("global", TokenBucket::new(100, Rate::per_second(100)).unwrap()).unwrap())
    ///     .build();
    /// # let _ = layer;
    /// ```
    pub fn policy(mut self, policy: impl Policy<E::Key>) -> Self {
        self.every.push(Arc::new(policy));
        self
    }

    /// Adds `policy` for requests that `route` matches (the same `route`
    /// again adds to its group).
    ///
    /// ```
    /// use std::net::IpAddr;
    /// use http::Method;
    /// use tollgate::keyed::{Keyed, WindowConfig};
    /// use tollgate::{FixedWindow, Rate};
    /// use tollgate_tower::{PeerIp, PerKey, Route, ThrottleLayer};
    ///
    /// let logins = Keyed::<IpAddr, FixedWindow>::new(WindowConfig::new(Rate::per_minute(5)).unwrap());
    /// let layer = ThrottleLayer::builder(PeerIp)
    ///     .route(Route::exact("/login").method(Method::POST), PerKey::new("login", logins).unwrap())
    ///     .build();
    /// # let _ = layer;
    /// ```
    pub fn route(mut self, route: Route, policy: impl Policy<E::Key>) -> Self {
        let policy: Arc<dyn Policy<E::Key>> = Arc::new(policy);
        match self.routes.iter_mut().find(|(r, _)| *r == route) {
            Some((_, group)) => group.push(policy),
            None => self.routes.push((route, vec![policy])),
        }
        self
    }

    /// How many permits a request costs (default 1), from its head: by
    /// route, by a declared size, ... A cost of `0` makes the request free:
    /// it is passed on without asking any policy (for health checks).
    ///
    /// ```
    /// use tollgate_tower::{Global, ThrottleLayer};
    /// let layer = ThrottleLayer::builder(Global)
    ///     .cost(|parts| if parts.uri.path().starts_with("/export") { 10 } else { 1 })
    ///     .build();
    /// # let _ = layer;
    /// ```
    pub fn cost(mut self, cost: impl Fn(&Parts) -> u32 + Send + Sync + 'static) -> Self {
        self.cost = Some(Arc::new(cost));
        self
    }

    /// Builds the response of a refused request that is not a gRPC call
    /// (default: [`problem_response`]; a gRPC call's comes from
    /// [`on_grpc_refusal`](Self::on_grpc_refusal)). The layer then adds
    /// `Retry-After` to a `429` (unless the hook set it) and the `RateLimit`
    /// fields.
    ///
    /// ```
    /// use bytes::Bytes;
    /// use http::Response;
    /// use tollgate_tower::{Global, ThrottleLayer};
    /// let layer = ThrottleLayer::builder(Global)
    ///     .on_refusal(|refusal| {
    ///         let mut response = Response::new(Bytes::from(format!("slow down ({:?})", refusal.policy())));
    ///         *response.status_mut() = refusal.status();
    ///         response
    ///     })
    ///     .build();
    /// # let _ = layer;
    /// ```
    pub fn on_refusal(
        mut self,
        hook: impl Fn(&Refusal<'_>) -> Response<Bytes> + Send + Sync + 'static,
    ) -> Self {
        self.on_refusal = Arc::new(hook);
        self
    }

    /// Builds the response of a refused gRPC call — a request whose
    /// `content-type` is `application/grpc`, or starts with
    /// `application/grpc+` or `application/grpc;` (default:
    /// [`grpc_response`], a trailers-only response whose `grpc-status` a
    /// gRPC client reads as the call's status). As for
    /// [`on_refusal`](Self::on_refusal), the layer then adds `retry-after`
    /// to a [`Refusal::TooManyRequests`] (unless the hook set it) and the
    /// `RateLimit` fields, which a gRPC client reads as the status's
    /// metadata. `.on_grpc_refusal(problem_response)` answers gRPC calls as
    /// other requests are (HTTP `429` and a problem document, which gRPC
    /// clients cannot read as a status).
    ///
    /// A hook with tonic at hand can build its response from a
    /// `tonic::Status` (`into_http` writes the trailers-only form):
    ///
    /// ```
    /// use bytes::Bytes;
    /// use http::Request;
    /// use tollgate::{Rate, TokenBucket};
    /// use tollgate_tower::{Global, Layer, Limit, Refusal, ThrottleLayer};
    /// use tower::{ServiceExt, service_fn};
    ///
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let layer = ThrottleLayer::builder(Global)
    ///     .policy(Limit::new("global", TokenBucket::new(1, Rate::per_hour(1)).unwrap()).unwrap())
    ///     .on_grpc_refusal(|refusal: &Refusal<'_>| {
    ///         let message = match refusal.policy() {
    ///             Some(policy) => format!("slow down ({policy})"),
    ///             None => "slow down".to_owned(),
    ///         };
    ///         tonic::Status::new(refusal.grpc_code().into(), message).into_http::<Bytes>()
    ///     })
    ///     .build();
    /// let service = layer.layer(service_fn(|_: Request<()>| async {
    ///     Ok::<_, std::convert::Infallible>(http::Response::new(Bytes::new()))
    /// }));
    /// let call = || Request::post("/demo.Greeter/SayHello").header("content-type", "application/grpc").body(()).unwrap();
    /// service.clone().oneshot(call()).await.unwrap();
    /// let refused = service.oneshot(call()).await.unwrap();
    /// assert_eq!(refused.status(), 200);
    /// assert_eq!(refused.headers()["grpc-status"], "8");
    /// assert_eq!(refused.headers()["grpc-message"], "slow%20down%20(global)");
    /// assert_eq!(refused.headers()["retry-after"], "3600");
    /// # });
    /// ```
    pub fn on_grpc_refusal(
        mut self,
        hook: impl Fn(&Refusal<'_>) -> Response<Bytes> + Send + Sync + 'static,
    ) -> Self {
        self.on_grpc_refusal = Arc::new(hook);
        self
    }

    /// The layer.
    ///
    /// ```
    /// use tollgate_tower::{PeerIp, ThrottleLayer};
    /// let _layer = ThrottleLayer::builder(PeerIp).build();
    /// ```
    pub fn build(self) -> ThrottleLayer<E> {
        let order = |group: &[Arc<dyn Policy<E::Key>>]| {
            let mut policies: Policies<E::Key> =
                group.iter().chain(self.every.iter()).cloned().collect();
            // Stable: within a scope, the order they were added in.
            policies.sort_by_key(|policy| policy.scope());
            policies
        };
        let ordered = self
            .routes
            .iter()
            .map(|(_, group)| order(group))
            .chain(std::iter::once(order(&[])))
            .collect();
        ThrottleLayer {
            shared: Arc::new(Shared {
                ordered,
                extractor: self.extractor,
                every: self.every,
                routes: self.routes,
                cost: self.cost,
                on_refusal: self.on_refusal,
                on_grpc_refusal: self.on_grpc_refusal,
            }),
        }
    }
}

struct Shared<E: KeyExtractor> {
    extractor: E,
    every: Policies<E::Key>,
    routes: Vec<(Route, Policies<E::Key>)>,
    /// For each route group, then for requests of no group: the policies
    /// deciding them, in the order they are asked (by scope, then as added).
    ordered: Vec<Policies<E::Key>>,
    cost: Option<CostFn>,
    on_refusal: RefusalHook,
    on_grpc_refusal: RefusalHook,
}

impl<E: KeyExtractor> Shared<E> {
    /// The policies deciding a request of route group `group` (`None`: no
    /// group), in the order they are asked.
    fn policies(&self, group: Option<usize>) -> &[Arc<dyn Policy<E::Key>>] {
        &self.ordered[group.unwrap_or(self.routes.len())]
    }

    // Cold: refusals are built away from the admitted path's code.
    // `request` is the refused request's headers: a gRPC call gets the gRPC
    // hook's response.
    #[cold]
    #[inline(never)]
    fn respond<B: From<Bytes>>(
        &self,
        refusal: &Refusal<'_>,
        fields: Fields,
        request: &HeaderMap,
    ) -> Response<B> {
        let hook = if is_grpc(request) {
            &self.on_grpc_refusal
        } else {
            &self.on_refusal
        };
        let mut response = hook(refusal);
        if let Refusal::TooManyRequests { retry_after, .. } = refusal {
            response
                .headers_mut()
                .entry(RETRY_AFTER)
                .or_insert_with(|| retry_after_value(*retry_after));
        }
        fields.apply(response.headers_mut());
        response.map(B::from)
    }
}

/// Adds `policy`'s outcome to the fields; a refusal's response if it refuses.
#[inline]
fn judge<E: KeyExtractor, B: From<Bytes>>(
    shared: &Shared<E>,
    policy: &dyn Policy<E::Key>,
    outcome: PolicyOutcome,
    fields: &mut Fields,
    request: &HeaderMap,
) -> Result<(), Response<B>> {
    match outcome {
        PolicyOutcome::Admitted(snapshot) => {
            fields.push(policy.name(), snapshot.as_ref());
            metrics::decision(policy.name(), "admitted");
            Ok(())
        }
        outcome => judge_cold(shared, policy, outcome, fields, request),
    }
}

/// [`judge`] for every outcome but a plain admission (a combined policy's
/// admission, every refusal): out of line and cold,
/// so the admitted path's code stays in as few cache lines as it can (an
/// admitted request here is a few hundred instructions among the kernel's
/// thousands, and pays for each line of code it has to fetch again).
#[cold]
#[inline(never)]
fn judge_cold<E: KeyExtractor, B: From<Bytes>>(
    shared: &Shared<E>,
    policy: &dyn Policy<E::Key>,
    outcome: PolicyOutcome,
    fields: &mut Fields,
    request: &HeaderMap,
) -> Result<(), Response<B>> {
    let (name, denied, reason) = match outcome {
        PolicyOutcome::Admitted(snapshot) => {
            fields.push(policy.name(), snapshot.as_ref());
            metrics::decision(policy.name(), "admitted");
            return Ok(());
        }
        PolicyOutcome::AdmittedBy { member, snapshot } => {
            fields.push(policy.member_name(member), Some(&snapshot));
            metrics::decision(policy.member_name(member), "admitted");
            return Ok(());
        }
        PolicyOutcome::Denied { denied, snapshot } => {
            fields.push(policy.name(), snapshot.as_ref());
            (policy.name(), Some(denied), None)
        }
        PolicyOutcome::DeniedBy { member, rejection } => {
            let name = policy.member_name(member);
            fields.push(name, Some(&rejection.snapshot));
            (name, Some(rejection.denied), None)
        }
        PolicyOutcome::Unavailable(reason) => (policy.name(), None, Some(reason)),
    };
    let label = match denied {
        Some(Denied::RetryAfter(_)) => "rate",
        Some(_) => "never_fits",
        None => "unavailable",
    };
    metrics::decision(name, label);
    let policy = name.as_str();
    let refusal = match (denied, &reason) {
        (Some(Denied::RetryAfter(retry_after)), _) => Refusal::TooManyRequests {
            policy,
            retry_after,
        },
        (Some(denied), _) => Refusal::NeverFits { policy, denied },
        (None, reason) => Refusal::Unavailable {
            policy,
            reason: reason.as_deref().unwrap_or(""),
        },
    };
    Err(shared.respond(&refusal, std::mem::take(fields), request))
}

/// Entry throttling for a tower service: see the [crate docs](crate).
pub struct ThrottleLayer<E: KeyExtractor> {
    shared: Arc<Shared<E>>,
}

impl<E: KeyExtractor> ThrottleLayer<E> {
    /// A builder keying requests with `extractor`.
    ///
    /// ```
    /// use tollgate_tower::{HeaderKey, ThrottleLayer};
    /// let _ = ThrottleLayer::builder(HeaderKey::new("x-api-key"));
    /// ```
    pub fn builder(extractor: E) -> ThrottleBuilder<E> {
        ThrottleBuilder {
            extractor,
            every: Vec::new(),
            routes: Vec::new(),
            cost: None,
            on_refusal: Arc::new(problem_response),
            on_grpc_refusal: Arc::new(grpc_response),
        }
    }
}

impl<E: KeyExtractor> Clone for ThrottleLayer<E> {
    fn clone(&self) -> Self {
        ThrottleLayer {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<E: KeyExtractor> fmt::Debug for ThrottleLayer<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ThrottleLayer")
            .field("policies", &self.shared.every.len())
            .field("routes", &self.shared.routes.len())
            .finish_non_exhaustive()
    }
}

impl<S, E: KeyExtractor> Layer<S> for ThrottleLayer<E> {
    type Service = Throttle<S, E>;

    fn layer(&self, inner: S) -> Self::Service {
        Throttle {
            inner,
            shared: Arc::clone(&self.shared),
        }
    }
}

/// The service [`ThrottleLayer`] wraps around another.
///
/// ```
/// use std::convert::Infallible;
/// use bytes::Bytes;
/// use http::{Request, Response};
/// use tollgate::{Rate, TokenBucket};
/// use tollgate_tower::{Global, Limit, ThrottleLayer};
/// use tower_layer::Layer;
/// use tower_service::Service;
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let layer = ThrottleLayer::builder(Global)
///     .policy(Limit::new("global", TokenBucket::new(1, Rate::per_hour(1)).unwrap()).unwrap())
///     .build();
/// let inner = tower_util_like::service_fn(|_: Request<()>| async {
///     Ok::<_, Infallible>(Response::new(Bytes::from_static(b"ok")))
/// });
/// let mut service = layer.layer(inner);
/// let first = service.call(Request::new(())).await.unwrap();
/// assert_eq!(first.status(), 200);
/// assert_eq!(first.headers()["ratelimit"], "\"global\";r=0;t=3600");
/// let second = service.call(Request::new(())).await.unwrap();
/// assert_eq!(second.status(), 429);
/// assert_eq!(second.headers()["retry-after"], "3600");
/// # });
/// # mod tower_util_like {
/// #     use std::task::{Context, Poll};
/// #     #[derive(Clone)]
/// #     pub struct ServiceFn<F>(F);
/// #     pub fn service_fn<F>(f: F) -> ServiceFn<F> { ServiceFn(f) }
/// #     impl<F, R, Fut, T, E> tower_service::Service<R> for ServiceFn<F>
/// #     where F: FnMut(R) -> Fut, Fut: std::future::Future<Output = Result<T, E>> {
/// #         type Response = T; type Error = E; type Future = Fut;
/// #         fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), E>> { Poll::Ready(Ok(())) }
/// #         fn call(&mut self, r: R) -> Fut { (self.0)(r) }
/// #     }
/// # }
/// ```
pub struct Throttle<S, E: KeyExtractor> {
    inner: S,
    shared: Arc<Shared<E>>,
}

impl<S: Clone, E: KeyExtractor> Clone for Throttle<S, E> {
    fn clone(&self) -> Self {
        Throttle {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S: fmt::Debug, E: KeyExtractor> fmt::Debug for Throttle<S, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Throttle")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

type BoxResponse<B, E> = Pin<Box<dyn Future<Output = Result<Response<B>, E>> + Send>>;

impl<S, E, ReqBody, ResBody> Service<Request<ReqBody>> for Throttle<S, E>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    E: KeyExtractor,
    ReqBody: Send + 'static,
    ResBody: From<Bytes> + Send + 'static,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, ResBody, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let (parts, body) = request.into_parts();
        // The decision is made out of line: with it in this function, the
        // inner service's future was built in a temporary and copied twice
        // on its way out (320 and 400 bytes for axum's route).
        match self.shared.verdict(&parts) {
            Verdict::Pass(fields) => ResponseFuture {
                fields,
                kind: Kind::Inner {
                    future: self.inner.call(Request::from_parts(parts, body)),
                },
            },
            Verdict::Answer(response) => ResponseFuture::answered(response),
            Verdict::Later(later) => {
                let request = Request::from_parts(parts, body);
                self.deferred(later, request)
            }
        }
    }
}

/// What the policies that decide during the call said about a request.
enum Verdict<K, B> {
    /// All admitted: pass it on, with these fields.
    Pass(Fields),
    /// The layer answers it.
    Answer(Response<B>),
    /// A policy decides asynchronously.
    Later(Later<K>),
}

/// The state of a request whose decision goes on asynchronously.
struct Later<K> {
    key: K,
    n: u32,
    group: Option<usize>,
    /// The index, among the request's policies, of the one deciding.
    index: usize,
    first: OutcomeFuture,
    fields: Fields,
}

impl<E: KeyExtractor> Shared<E> {
    /// Asks the request's policies, in order, until one refuses or decides
    /// asynchronously.
    fn verdict<B: From<Bytes>>(&self, parts: &Parts) -> Verdict<E::Key, B> {
        let key = match self.extractor.extract(parts) {
            Ok(key) => key,
            Err(err) => {
                metrics::request("no_key");
                return Verdict::Answer(self.respond(
                    &Refusal::NoKey(&err),
                    Fields::default(),
                    &parts.headers,
                ));
            }
        };
        let n = self.cost.as_ref().map_or(1, |cost| cost(parts));
        let mut fields = Fields::default();
        if n == 0 {
            return Verdict::Pass(fields);
        }
        let group = self.routes.iter().position(|(r, _)| r.matches(parts));
        let policies = self.policies(group);
        if n > 1 {
            if let Err(response) = self.fits(policies, &key, n, &parts.headers) {
                metrics::request("refused");
                return Verdict::Answer(response);
            }
        }
        match self.chain(policies, 0, &key, n, &mut fields, &parts.headers) {
            Step::Pass => {
                metrics::request("passed");
                Verdict::Pass(fields)
            }
            Step::Answer(response) => {
                metrics::request("refused");
                Verdict::Answer(response)
            }
            Step::Later { index, future } => Verdict::Later(Later {
                key,
                n,
                group,
                index,
                first: future,
                fields,
            }),
        }
    }

    /// Refuses a request costing more than some policy's capacity, before
    /// any other policy is asked. The policy that can never hold it is then
    /// asked alone, for its report: a request above capacity is a denial
    /// that changes nothing, in every tollgate limiter.
    #[cold]
    #[inline(never)]
    fn fits<B: From<Bytes>>(
        &self,
        policies: &[Arc<dyn Policy<E::Key>>],
        key: &E::Key,
        n: u32,
        request: &HeaderMap,
    ) -> Result<(), Response<B>> {
        for policy in policies {
            let Some(capacity) = policy.capacity(key).filter(|&capacity| n > capacity) else {
                continue;
            };
            let mut fields = Fields::default();
            if let Decision::Now(outcome) = policy.decide(key, n) {
                judge(self, &**policy, outcome, &mut fields, request)?;
            }
            // Decided later (a remote policy: the future is dropped unpolled,
            // so nothing was asked), or a policy whose decision disagrees
            // with its own capacity: the refusal without its report.
            metrics::decision(policy.name(), "never_fits");
            let refusal = Refusal::NeverFits {
                policy: policy.name().as_str(),
                denied: Denied::ExceedsCapacity {
                    requested: n,
                    capacity,
                },
            };
            return Err(self.respond(&refusal, fields, request));
        }
        Ok(())
    }

    /// Asks `policies[index..]` in turn. Every policy but the last decides
    /// through [`Policy::decide_then`], with the rest of the chain as its
    /// continuation: a refusal further on comes back to it as `false`, and
    /// it refunds while its receipt is still on this stack. Stops at the
    /// first refusal or the first decision that completes later.
    fn chain<B: From<Bytes>>(
        &self,
        policies: &[Arc<dyn Policy<E::Key>>],
        index: usize,
        key: &E::Key,
        n: u32,
        fields: &mut Fields,
        request: &HeaderMap,
    ) -> Step<B> {
        let Some(policy) = policies.get(index) else {
            return Step::Pass;
        };
        let mut step = Step::Pass;
        let take = |decision: Decision, fields: &mut Fields| match decision {
            Decision::Now(outcome) => match judge(self, &**policy, outcome, fields, request) {
                Ok(()) => None,
                Err(response) => Some(Step::Answer(response)),
            },
            Decision::Later(future) => Some(Step::Later { index, future }),
        };
        if index + 1 == policies.len() {
            // The last asks nothing after it: nothing to give back.
            if let Some(last) = take(policy.decide(key, n), fields) {
                step = last;
            }
        } else {
            policy.decide_then(key, n, &mut |decision| {
                step = match take(decision, fields) {
                    None => self.chain(policies, index + 1, key, n, fields, request),
                    Some(stop) => stop,
                };
                // Kept unless refused further on; a decision that completes
                // later keeps what was admitted before it.
                !matches!(step, Step::Answer(_))
            });
        }
        step
    }
}

/// Where a chain of decisions stopped.
enum Step<B> {
    /// Every policy admitted.
    Pass,
    /// Refused: the response.
    Answer(Response<B>),
    /// Policy `index` decides asynchronously.
    Later { index: usize, future: OutcomeFuture },
}

impl<S, E> Throttle<S, E>
where
    E: KeyExtractor,
{
    /// The rest of an asynchronous decision, in a future that owns what it
    /// needs and calls the service that was made ready.
    fn deferred<ReqBody, ResBody>(
        &mut self,
        later: Later<E::Key>,
        request: Request<ReqBody>,
    ) -> ResponseFuture<S::Future, ResBody, S::Error>
    where
        S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
        S::Future: Send + 'static,
        S::Error: Send + 'static,
        ReqBody: Send + 'static,
        ResBody: From<Bytes> + Send + 'static,
    {
        let ready = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, ready);
        let shared = Arc::clone(&self.shared);
        let Later {
            key,
            n,
            group,
            index,
            first,
            mut fields,
        } = later;
        ResponseFuture::deferred(Box::pin(async move {
            let policies = shared.policies(group);
            let (mut index, mut pending) = (index, first);
            #[cfg(feature = "metrics")]
            let started = std::time::Instant::now();
            let refused = loop {
                let outcome = pending.await;
                let head = request.headers();
                if let Err(response) = judge(&shared, &*policies[index], outcome, &mut fields, head)
                {
                    break Some(response);
                }
                // The policies after an awaited one decide as a chain of
                // their own: refunds among them, none back to it.
                match shared.chain(policies, index + 1, &key, n, &mut fields, head) {
                    Step::Pass => break None,
                    Step::Answer(response) => break Some(response),
                    Step::Later {
                        index: next,
                        future,
                    } => (index, pending) = (next, future),
                }
            };
            #[cfg(feature = "metrics")]
            metrics::decision_time(started.elapsed());
            if let Some(response) = refused {
                metrics::request("refused");
                return Ok(response);
            }
            metrics::request("passed");
            let mut response = inner.call(request).await?;
            fields.apply(response.headers_mut());
            Ok(response)
        }))
    }
}

pin_project! {
    /// The response future of [`Throttle`]: the inner service's response
    /// with the fields added, the layer's own refusal, or — when a policy
    /// decides asynchronously — a boxed future that decides and then calls
    /// the inner service. Dropping it (the client went away) drops a pending
    /// decision, which cancels a [`Shaped`](crate::Shaped) wait.
    pub struct ResponseFuture<F, B, E> {
        // The fields to add to the inner service's response (none: nothing
        // to add).
        fields: Fields,
        #[pin]
        kind: Kind<F, B, E>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F, B, E> {
        // Admitted: the inner service's response, fields to add.
        Inner { #[pin] future: F },
        // Refused by the layer.
        Answered { response: Option<Response<B>> },
        // A policy decides asynchronously.
        Deferred { future: BoxResponse<B, E> },
    }
}

impl<F, B, E> ResponseFuture<F, B, E> {
    fn answered(response: Response<B>) -> Self {
        ResponseFuture {
            fields: Fields::default(),
            kind: Kind::Answered {
                response: Some(response),
            },
        }
    }

    fn deferred(future: BoxResponse<B, E>) -> Self {
        ResponseFuture {
            fields: Fields::default(),
            kind: Kind::Deferred { future },
        }
    }
}

impl<F, B, E> Future for ResponseFuture<F, B, E>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<B>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        match this.kind.project() {
            KindProj::Inner { future } => {
                // The fields are added where the inner service's response
                // lies: moving it out and back cost two copies of it.
                let mut poll = future.poll(cx);
                if let Poll::Ready(Ok(response)) = &mut poll {
                    std::mem::take(this.fields).apply(response.headers_mut());
                }
                poll
            }
            KindProj::Answered { response } => Poll::Ready(Ok(response
                .take()
                .expect("ResponseFuture polled after completion"))),
            KindProj::Deferred { future } => future.as_mut().poll(cx),
        }
    }
}

impl<F, B, E> fmt::Debug for ResponseFuture<F, B, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ResponseFuture")
    }
}
