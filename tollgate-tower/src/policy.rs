//! What decides: a [`Policy`] is one named limit the layer asks about each
//! request's key. Any tollgate limiter is one ([`Limit`] for a direct limiter,
//! [`PerKey`] for a [`Keyed`] one); limiters that decide asynchronously —
//! over the network, like `tollgate-redis` — are one through [`AsyncLimit`];
//! waiting instead of rejecting is [`Shaped`](crate::Shaped).

use std::fmt;
use std::future::Future;
use std::hash::{BuildHasher, Hash};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tollgate::keyed::{Keyable, Keyed};
use tollgate::{Blocked, Denied, RateLimiter, Rejection, Snapshot, Tightest};

use crate::fields::{IntoPolicyName, InvalidName, PolicyName};

/// One policy's answer for one request.
///
/// ```
/// use tollgate::{Rate, RateLimiter, TokenBucket};
/// use tollgate_tower::PolicyOutcome;
///
/// let bucket = TokenBucket::new(1, Rate::per_hour(1)).unwrap();
/// assert!(matches!(PolicyOutcome::from(bucket.try_acquire_with_snapshot()), PolicyOutcome::Admitted(Some(_))));
/// assert!(matches!(PolicyOutcome::from(bucket.try_acquire_with_snapshot()), PolicyOutcome::Denied { .. }));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PolicyOutcome {
    /// Admitted; with the state the admission left when the limiter reports it.
    Admitted(Option<Snapshot>),
    /// Denied: [`Denied::RetryAfter`] becomes a `429`, the others a request
    /// that can never pass; with the state it was decided on when reported.
    Denied {
        /// Why.
        denied: Denied,
        /// The state the denial was decided on, if the limiter reports it.
        snapshot: Option<Snapshot>,
    },
    /// No decision could be had (a remote limiter's server is unreachable):
    /// `503`, unless the policy itself chose to admit or deny.
    Unavailable(String),
    /// Admitted by every member of a combined policy ([`AllOfLimit`]); the
    /// report is the tightest member's, named by
    /// [`Policy::member_name`]`(member)`.
    AdmittedBy {
        /// The member with the least left.
        member: usize,
        /// Its state after its own decision.
        snapshot: Snapshot,
    },
    /// Denied by `member` of a combined policy ([`AllOfLimit`]); the members
    /// before it were refunded by the core's [`AllOf`](tollgate::AllOf).
    DeniedBy {
        /// The member that denied.
        member: usize,
        /// Its denial and the state it was decided on.
        rejection: Rejection,
    },
}

impl From<Result<Snapshot, Rejection>> for PolicyOutcome {
    fn from(decision: Result<Snapshot, Rejection>) -> Self {
        match decision {
            Ok(snapshot) => PolicyOutcome::Admitted(Some(snapshot)),
            Err(rejection) => PolicyOutcome::Denied {
                denied: rejection.denied,
                snapshot: Some(rejection.snapshot),
            },
        }
    }
}

/// A future of an [`PolicyOutcome`], for policies that decide asynchronously.
///
/// ```
/// use tollgate_tower::{PolicyOutcome, OutcomeFuture};
/// let later: OutcomeFuture = Box::pin(async { PolicyOutcome::Admitted(None) });
/// # drop(later);
/// ```
pub type OutcomeFuture = Pin<Box<dyn Future<Output = PolicyOutcome> + Send + 'static>>;

/// A policy's decision: at once (every in-process limiter), or later.
///
/// ```
/// use tollgate_tower::{AsyncLimit, Decision, PolicyOutcome, Policy};
/// let remote = AsyncLimit::new("remote", |_: &(), _| async { PolicyOutcome::Admitted(None) }).unwrap();
/// assert!(matches!(remote.decide(&(), 1), Decision::Later(_)));
/// ```
pub enum Decision {
    /// Decided during the call.
    Now(PolicyOutcome),
    /// Decided when the future completes. Dropping it (the client went away)
    /// must leave the limiter as a cancelled request should: a
    /// [`Shaped`](crate::Shaped) wait gives its reservation back.
    Later(OutcomeFuture),
}

impl fmt::Debug for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Decision::Now(outcome) => f.debug_tuple("Now").field(outcome).finish(),
            Decision::Later(_) => f.write_str("Later(..)"),
        }
    }
}

/// Where a policy's limit lives, which orders how the layer asks a
/// request's policies: [`Key`](Scope::Key) first, then
/// [`Process`](Scope::Process), then [`Shared`](Scope::Shared), each scope in
/// the order its policies were added. A narrow limit thus refuses before a
/// wider one is charged, and a cheap local decision before a remote one.
///
/// ```
/// use tollgate_tower::Scope;
/// assert!(Scope::Key < Scope::Process && Scope::Process < Scope::Shared);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scope {
    /// One limit per key, in this process ([`PerKey`]).
    Key,
    /// One limit for every request that reaches it, in this process
    /// ([`Limit`], [`AllOfLimit`], [`Shaped`](crate::Shaped)).
    Process,
    /// A limit shared with other processes: Redis, leases of a global
    /// budget, any [`AsyncLimit`].
    Shared,
}

/// One named limit, asked about each request's key (of type `K`).
///
/// Implemented by [`Limit`], [`PerKey`], [`AsyncLimit`], [`AllOfLimit`] and
/// [`Shaped`](crate::Shaped); implement it for anything else that decides.
/// Only [`name`](Policy::name) and [`decide`](Policy::decide) are required;
/// the rest tell the layer how to keep a request's policies all-or-nothing
/// (see [`ThrottleBuilder`](crate::ThrottleBuilder)).
///
/// ```
/// use tollgate::{Rate, TokenBucket};
/// use tollgate_tower::{Decision, Limit, PolicyOutcome, Policy};
///
/// let global = Limit::new("global", TokenBucket::new(1, Rate::per_hour(1)).unwrap()).unwrap();
/// assert_eq!(Policy::<()>::name(&global).as_str(), "global");
/// assert!(matches!(global.decide(&(), 1), Decision::Now(PolicyOutcome::Admitted(_))));
/// assert!(matches!(global.decide(&(), 1), Decision::Now(PolicyOutcome::Denied { .. })));
/// ```
pub trait Policy<K>: Send + Sync + 'static {
    /// The policy's name in the `RateLimit` fields.
    fn name(&self) -> &PolicyName;

    /// The name of member `member` of a combined policy, for the
    /// [`PolicyOutcome::AdmittedBy`] and [`PolicyOutcome::DeniedBy`] it reports; a
    /// single policy is its own only member.
    fn member_name(&self, member: usize) -> &PolicyName {
        let _ = member;
        self.name()
    }

    /// Decides `n` permits for `key`.
    fn decide(&self, key: &K, n: u32) -> Decision;

    /// Where the limit lives (default [`Scope::Process`]): the layer asks
    /// narrower scopes first.
    fn scope(&self) -> Scope {
        Scope::Process
    }

    /// The most permits `key` can ever be granted at once, if the policy
    /// knows (default: it does not). The layer refuses a request costing
    /// more with `403` before asking any policy, so such a request spends
    /// nothing anywhere. Asked only for requests costing more than one
    /// permit.
    fn capacity(&self, key: &K) -> Option<u32> {
        let _ = key;
        None
    }

    /// Decides as [`decide`](Policy::decide) and hands the decision to
    /// `rest`, which asks the request's remaining policies and returns
    /// whether the request passed; if it returns `false` after this policy
    /// admitted at once, the policy gives the permits back as far as that is
    /// safe ([`RateLimiter::try_acquire_n_then`]). The default gives nothing
    /// back.
    fn decide_then(&self, key: &K, n: u32, rest: &mut dyn FnMut(Decision) -> bool) {
        rest(self.decide(key, n));
    }
}

/// A direct (unkeyed) limiter as a policy: every request that reaches it
/// shares it, whatever its key — a limit on the whole service or route. Any
/// [`RateLimiter`]: a tollgate limiter, a locking twin, or an all-or-nothing
/// combination of several.
///
/// ```
/// use tollgate::{Rate, SlidingLog};
/// use tollgate_tower::Limit;
/// let _ = Limit::new("search", SlidingLog::new(Rate::per_second(100)).unwrap()).unwrap();
/// ```
pub struct Limit<L: ?Sized> {
    name: PolicyName,
    limiter: Arc<L>,
}

impl<L: RateLimiter + Send + Sync + ?Sized + 'static> Limit<L> {
    /// The policy `name` over `limiter`.
    ///
    /// Errors: [`InvalidName`].
    ///
    /// ```
    /// use tollgate::{Rate, TokenBucket};
    /// use tollgate_tower::Limit;
    /// let _ = Limit::new("global", TokenBucket::new(10, Rate::per_second(10)).unwrap()).unwrap();
    /// ```
    pub fn new(name: impl IntoPolicyName, limiter: L) -> Result<Self, InvalidName>
    where
        L: Sized,
    {
        Self::shared(name, Arc::new(limiter))
    }

    /// The policy `name` over a `limiter` shared with other code (that reads
    /// or reconfigures it).
    ///
    /// Errors: [`InvalidName`].
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tollgate::{Rate, RateLimiter, TokenBucket};
    /// use tollgate_tower::Limit;
    /// let bucket = Arc::new(TokenBucket::new(10, Rate::per_second(10)).unwrap());
    /// let _ = Limit::shared("global", Arc::clone(&bucket)).unwrap();
    /// let _ = Limit::shared("any", bucket as Arc<dyn RateLimiter + Send + Sync>).unwrap();
    /// ```
    pub fn shared(name: impl IntoPolicyName, limiter: Arc<L>) -> Result<Self, InvalidName> {
        Ok(Limit {
            name: name.into_policy_name()?,
            limiter,
        })
    }
}

impl<K, L: RateLimiter + Send + Sync + ?Sized + 'static> Policy<K> for Limit<L> {
    fn name(&self) -> &PolicyName {
        &self.name
    }

    #[inline]
    fn decide(&self, _: &K, n: u32) -> Decision {
        Decision::Now(self.limiter.try_acquire_n_with_snapshot(n).into())
    }

    fn capacity(&self, _: &K) -> Option<u32> {
        Some(self.limiter.snapshot().capacity)
    }

    fn decide_then(&self, _: &K, n: u32, rest: &mut dyn FnMut(Decision) -> bool) {
        self.limiter
            .try_acquire_n_then(n, &mut |answer| rest(Decision::Now(answer.into())));
    }
}

/// A [`Keyed`] limiter as a policy: each key its own limit, decided and
/// reported in one lookup
/// ([`Keyed::try_acquire_n_with_snapshot`]).
///
/// ```
/// use std::net::IpAddr;
/// use tollgate::keyed::{BucketConfig, Keyed};
/// use tollgate::{Rate, TokenBucket};
/// use tollgate_tower::PerKey;
///
/// let per_ip = Keyed::<IpAddr, TokenBucket>::new(BucketConfig::new(20, Rate::per_second(10)).unwrap());
/// let _ = PerKey::new("per-ip", per_ip).unwrap();
/// ```
pub struct PerKey<K, L: Keyable, S = tollgate::keyed::KeyHasher> {
    name: PolicyName,
    limiter: Arc<Keyed<K, L, S>>,
    max_wait: Duration,
}

impl<K, L, S> PerKey<K, L, S>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
    L: Keyable + 'static,
    S: BuildHasher + Clone + Send + Sync + 'static,
    Keyed<K, L, S>: Send + Sync,
{
    /// The policy `name` over `limiter`.
    ///
    /// Errors: [`InvalidName`].
    ///
    /// ```
    /// use tollgate::keyed::{Keyed, WindowConfig};
    /// use tollgate::{FixedWindow, Rate};
    /// use tollgate_tower::PerKey;
    /// let per_key = Keyed::<String, FixedWindow>::new(WindowConfig::new(Rate::per_minute(60)).unwrap());
    /// let _ = PerKey::new("per-key", per_key).unwrap();
    /// ```
    pub fn new(name: impl IntoPolicyName, limiter: Keyed<K, L, S>) -> Result<Self, InvalidName> {
        Self::shared(name, Arc::new(limiter))
    }

    /// The policy `name` over a `limiter` shared with other code (that reads
    /// it, sets per-key overrides or reconfigures it).
    ///
    /// Errors: [`InvalidName`].
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tollgate::keyed::{Keyed, WindowConfig};
    /// use tollgate::{FixedWindow, Rate};
    /// use tollgate_tower::PerKey;
    /// let per_key = Arc::new(Keyed::<String, FixedWindow>::new(WindowConfig::new(Rate::per_minute(60)).unwrap()));
    /// let _ = PerKey::shared("per-key", Arc::clone(&per_key)).unwrap();
    /// ```
    pub fn shared(
        name: impl IntoPolicyName,
        limiter: Arc<Keyed<K, L, S>>,
    ) -> Result<Self, InvalidName> {
        Ok(PerKey {
            name: name.into_policy_name()?,
            limiter,
            max_wait: Duration::ZERO,
        })
    }

    /// Holds a request whose key has no room yet, for up to `max_wait`,
    /// instead of refusing it at once: a request the key admits now passes
    /// at once (one synchronous decision, as without waiting); one whose
    /// exact retry-after is within `max_wait` waits on the core's
    /// [`Keyed::acquire_timeout_async`] — it sleeps out the retry-after and
    /// asks again, holding nothing while it sleeps, so a client that goes away
    /// costs nothing, but waiters on one key are not served in arrival order
    /// (a keyed state has no schedule to book into; [`Shaped`](crate::Shaped)
    /// keeps order on a direct limiter). A request whose retry-after is
    /// beyond `max_wait` is refused at once with it, as any denial. After a
    /// wait the `RateLimit` field comes from a [`Keyed::snapshot`] read, not
    /// the decision.
    ///
    /// ```
    /// use std::net::IpAddr;
    /// use std::time::Duration;
    /// use tollgate::keyed::{BucketConfig, Keyed};
    /// use tollgate::{Rate, TokenBucket};
    /// use tollgate_tower::PerKey;
    ///
    /// let per_ip = Keyed::<IpAddr, TokenBucket>::new(BucketConfig::new(5, Rate::per_second(5)).unwrap());
    /// let _ = PerKey::new("per-ip", per_ip).unwrap().wait_up_to(Duration::from_millis(500));
    /// ```
    pub fn wait_up_to(mut self, max_wait: Duration) -> Self {
        self.max_wait = max_wait;
        self
    }

    /// The decision for an answer of the key's limiter: a wait if the
    /// denial's retry-after is within `max_wait`.
    #[inline]
    fn decision(&self, key: &K, n: u32, decided: Result<Snapshot, Rejection>) -> Decision {
        match decided {
            Err(rejection)
                if matches!(rejection.denied, Denied::RetryAfter(wait) if wait <= self.max_wait)
                    && !self.max_wait.is_zero() =>
            {
                let limiter = Arc::clone(&self.limiter);
                let key = key.clone();
                let max_wait = self.max_wait;
                Decision::Later(Box::pin(async move {
                    let waited = limiter.acquire_timeout_async(&key, n, max_wait).await;
                    let snapshot = Some(limiter.snapshot(&key));
                    match waited {
                        Ok(()) => PolicyOutcome::Admitted(snapshot),
                        Err(denied) => PolicyOutcome::Denied { denied, snapshot },
                    }
                }))
            }
            decided => Decision::Now(decided.into()),
        }
    }
}

impl<K, L, S> Policy<K> for PerKey<K, L, S>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
    L: Keyable + 'static,
    S: BuildHasher + Clone + Send + Sync + 'static,
    Keyed<K, L, S>: Send + Sync,
{
    fn name(&self) -> &PolicyName {
        &self.name
    }

    #[inline]
    fn decide(&self, key: &K, n: u32) -> Decision {
        self.decision(key, n, self.limiter.try_acquire_n_with_snapshot(key, n))
    }

    fn scope(&self) -> Scope {
        Scope::Key
    }

    fn capacity(&self, key: &K) -> Option<u32> {
        Some(self.limiter.snapshot(key).capacity)
    }

    fn decide_then(&self, key: &K, n: u32, rest: &mut dyn FnMut(Decision) -> bool) {
        self.limiter
            .try_acquire_n_then(key, n, &mut |answer| rest(self.decision(key, n, answer)));
    }
}

/// A policy that decides asynchronously, from a closure that returns a
/// future of an [`PolicyOutcome`]: a limiter on another machine (the `redis`
/// feature's `RedisLimit` is one), or any async check.
/// The future must own what it uses (`'static`); dropping it must be safe.
///
/// ```
/// use tollgate_tower::{AsyncLimit, PolicyOutcome};
/// let _ = AsyncLimit::new("remote", |key: &String, n: u32| {
///     let key = key.clone();
///     async move {
///         let _ = (key, n); // ask the remote limiter here
///         PolicyOutcome::Admitted(None)
///     }
/// })
/// .unwrap();
/// ```
pub struct AsyncLimit<F> {
    name: PolicyName,
    decide: F,
}

impl<F> AsyncLimit<F> {
    /// The policy `name`, deciding with `decide`.
    ///
    /// Errors: [`InvalidName`].
    ///
    /// ```
    /// use tollgate_tower::{AsyncLimit, PolicyOutcome};
    /// let _ = AsyncLimit::new("always", |_: &(), _| async { PolicyOutcome::Admitted(None) }).unwrap();
    /// ```
    pub fn new<K, Fut>(name: impl IntoPolicyName, decide: F) -> Result<Self, InvalidName>
    where
        F: Fn(&K, u32) -> Fut,
        Fut: Future<Output = PolicyOutcome> + Send + 'static,
    {
        Ok(AsyncLimit {
            name: name.into_policy_name()?,
            decide,
        })
    }
}

impl<K, F, Fut> Policy<K> for AsyncLimit<F>
where
    F: Fn(&K, u32) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = PolicyOutcome> + Send + 'static,
{
    fn name(&self) -> &PolicyName {
        &self.name
    }

    fn decide(&self, key: &K, n: u32) -> Decision {
        Decision::Later(Box::pin((self.decide)(key, n)))
    }

    /// An async check is taken to be remote: asked after every in-process
    /// policy.
    fn scope(&self) -> Scope {
        Scope::Shared
    }
}

/// Several limits that must all admit a request, all or nothing: the core's
/// [`AllOf`] over direct limiters and keys of [`Keyed`] ones
/// ([`Keyed::for_key`]), built per request by a closure from the request's
/// key. A member that denies gets the members before it refunded (see
/// [`AllOf`] for the exact guarantee), as separate policies in
/// one layer are too ([`ThrottleBuilder`](crate::ThrottleBuilder)); an
/// `AllOfLimit` fixes the order its members are asked in and decides them as
/// one policy, asked with this process's shared limits ([`Scope::Process`]);
/// the layer cannot refund it, so it keeps its admission if a policy asked
/// after it refuses.
/// The fields report the binding member under its own name: on admission
/// the member with the least left, on denial the one that denied.
///
/// [`AllOf`]: tollgate::AllOf
///
/// ```
/// use std::net::IpAddr;
/// use std::sync::Arc;
/// use tollgate::keyed::{BucketConfig, Keyed, WindowConfig};
/// use tollgate::{AllOf, FixedWindow, Rate, TokenBucket};
/// use tollgate_tower::{AllOfLimit, Decision, PolicyOutcome, Policy};
///
/// let global = Arc::new(TokenBucket::new(100, Rate::per_second(100))?);
/// let per_ip = Arc::new(Keyed::<IpAddr, TokenBucket>::new(BucketConfig::new(10, Rate::per_second(5))?));
/// let logins = Arc::new(Keyed::<IpAddr, FixedWindow>::new(WindowConfig::new(Rate::per_minute(1))?));
/// let login = AllOfLimit::new(["global", "per-ip", "login"], move |ip: &IpAddr, n| {
///     AllOf::new((&*global, per_ip.for_key(ip), logins.for_key(ip))).try_acquire_n_reporting(n)
/// })?;
/// let ip: IpAddr = "192.0.2.7".parse()?;
/// assert!(matches!(login.decide(&ip, 1), Decision::Now(PolicyOutcome::AdmittedBy { member: 2, .. })));
/// assert!(matches!(login.decide(&ip, 1), Decision::Now(PolicyOutcome::DeniedBy { member: 2, .. })));
/// assert_eq!(login.member_name(2).as_str(), "login");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct AllOfLimit<F> {
    names: Vec<PolicyName>,
    decide: F,
}

impl<F> AllOfLimit<F> {
    /// The members' `names`, in the order of the `AllOf` tuple `decide`
    /// builds, and `decide` itself.
    ///
    /// Errors: [`InvalidName`] for a bad name, or for no names at all.
    ///
    /// ```
    /// use tollgate::{AllOf, Rate, TokenBucket};
    /// use tollgate_tower::AllOfLimit;
    /// let a = TokenBucket::new(5, Rate::per_second(5)).unwrap();
    /// let b = TokenBucket::new(50, Rate::per_minute(50)).unwrap();
    /// let _ = AllOfLimit::new(["second", "minute"], move |_: &(), n| AllOf::new((&a, &b)).try_acquire_n_reporting(n)).unwrap();
    /// assert!(AllOfLimit::new(Vec::<&str>::new(), |_: &(), _| unreachable!()).is_err());
    /// ```
    pub fn new<K, I>(names: I, decide: F) -> Result<Self, InvalidName>
    where
        I: IntoIterator,
        I::Item: IntoPolicyName,
        F: Fn(&K, u32) -> Result<Tightest, Blocked>,
    {
        let names = names
            .into_iter()
            .map(IntoPolicyName::into_policy_name)
            .collect::<Result<Vec<_>, _>>()?;
        if names.is_empty() {
            return Err(InvalidName(String::new()));
        }
        Ok(AllOfLimit { names, decide })
    }
}

impl<K, F> Policy<K> for AllOfLimit<F>
where
    F: Fn(&K, u32) -> Result<Tightest, Blocked> + Send + Sync + 'static,
{
    fn name(&self) -> &PolicyName {
        &self.names[0]
    }

    fn member_name(&self, member: usize) -> &PolicyName {
        self.names.get(member).unwrap_or(&self.names[0])
    }

    #[inline]
    fn decide(&self, key: &K, n: u32) -> Decision {
        Decision::Now(match (self.decide)(key, n) {
            Ok(tightest) => PolicyOutcome::AdmittedBy {
                member: tightest.member,
                snapshot: tightest.snapshot,
            },
            Err(blocked) => PolicyOutcome::DeniedBy {
                member: blocked.member,
                rejection: blocked.rejection,
            },
        })
    }
}
