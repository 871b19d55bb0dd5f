//! A `tollgate-redis` limiter as a policy (feature `redis`): one limit shared
//! by every server process through Redis, decided asynchronously.

use std::fmt::Display;
use std::sync::Arc;

use tollgate::Rejection;
use tollgate_redis::{Ask, Attempt, Client, Error, LeasedLimiter, Limiter, Refused};

use crate::fields::{IntoPolicyName, InvalidName, PolicyName};
use crate::policy::{Decision, Policy, PolicyOutcome, Scope};

/// A [`tollgate_redis`] limiter (token bucket, fixed window, sliding window,
/// sliding log) as a policy: each request's key — printed with `Display`, so
/// an `IpAddr`, a `String` or `()` — is the limiter's caller key, and the
/// decision is one script call on the shared server
/// ([`Client::try_acquire_n`]). The limiter's own name (its constructor's
/// first argument), not the policy's, is what keeps its state in Redis apart
/// from every other limiter's: no request's key can reach another limiter's
/// state.
///
/// A denial is the script's exact retry-after (a `429` like any other); a
/// server that cannot be reached within the client's timeout is
/// [`PolicyOutcome::Unavailable`] (`503`). For a policy that keeps deciding while
/// Redis is gone, use a [`LeasedLimit`].
/// An admission adds the policy's `RateLimit` members: the permits the
/// script reports remaining, and the time until the quota is whole again
/// from the limiter's configuration ([`Limiter::report`]: exact or an upper
/// bound, never shorter). A denial adds none: its `Retry-After` is exact.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use tollgate::Rate;
/// use tollgate_tower::{PeerIp, RedisLimit, ThrottleLayer};
///
/// let client = tollgate_redis::Client::connect("redis://127.0.0.1/").await?;
/// let per_ip = tollgate_redis::SlidingLog::new("per-ip", Rate::per_minute(60))?;
/// let layer = ThrottleLayer::builder(PeerIp)
///     .policy(RedisLimit::new("per-ip", client, per_ip)?)
///     .build();
/// # let _ = layer; Ok(()) }
/// ```
pub struct RedisLimit<L> {
    name: PolicyName,
    client: Client,
    limiter: Arc<L>,
}

impl<L: Limiter + 'static> RedisLimit<L> {
    /// The policy `name`: `limiter` on the server behind `client`.
    ///
    /// Errors: [`InvalidName`].
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use tollgate::Rate;
    /// let client = tollgate_redis::Client::connect("redis://127.0.0.1/").await?;
    /// let bucket = tollgate_redis::TokenBucket::new("shared", 10, Rate::per_second(5))?;
    /// let _ = tollgate_tower::RedisLimit::new("shared", client, bucket)?;
    /// # Ok(()) }
    /// ```
    pub fn new(name: impl IntoPolicyName, client: Client, limiter: L) -> Result<Self, InvalidName> {
        Ok(RedisLimit {
            name: name.into_policy_name()?,
            client,
            limiter: Arc::new(limiter),
        })
    }
}

impl<K: Display, L: Limiter + 'static> Policy<K> for RedisLimit<L> {
    fn name(&self) -> &PolicyName {
        &self.name
    }

    /// One script call on the shared server: asked after every in-process
    /// policy.
    fn scope(&self) -> Scope {
        Scope::Shared
    }

    fn capacity(&self, _: &K) -> Option<u32> {
        Some(self.limiter.capacity())
    }

    fn decide(&self, key: &K, n: u32) -> Decision {
        let client = self.client.clone();
        let limiter = Arc::clone(&self.limiter);
        let key = key.to_string();
        Decision::Later(Box::pin(async move {
            match client.try_acquire_n(&*limiter, &key, n).await {
                Ok(admission) => PolicyOutcome::Admitted(Some(limiter.report(&admission))),
                Err(err) => outcome(Err(err)),
            }
        }))
    }
}

/// Several [`tollgate_redis`] limiters on one client, asked about each
/// request in **one** script call ([`Client::try_acquire_all`]): admitted
/// only if every member admits, and then charged on every one; refused by
/// any member, charged on none. One round trip where separate
/// [`RedisLimit`]s take one each, and none of them keeps an admission when
/// another refuses.
///
/// Each member has its own name; the fields report the binding member under
/// it: on admission the member with the least left, on denial the member
/// whose wait is longest, with that wait as the `Retry-After` (every member
/// that refused admits by then, if nothing else is admitted meanwhile). The
/// request's key, printed with `Display`, is every member's caller key, so
/// the members' Redis keys share one hash tag (one Cluster slot); two
/// members must not name the same Redis key (give limiters of one kind
/// different names), or every request is `503`.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use tollgate::Rate;
/// use tollgate_tower::{PeerIp, RedisAllOf, ThrottleLayer};
///
/// let client = tollgate_redis::Client::connect("redis://127.0.0.1/").await?;
/// let burst = tollgate_redis::TokenBucket::new("burst", 20, Rate::per_second(10))?;
/// let per_day = Rate::new(10_000, Duration::from_secs(86_400));
/// let daily = tollgate_redis::FixedWindow::new("daily", per_day)?;
/// let layer = ThrottleLayer::builder(PeerIp)
///     .policy(RedisAllOf::new(client, "burst", burst)?.and("daily", daily)?)
///     .build();
/// # let _ = layer; Ok(()) }
/// ```
pub struct RedisAllOf {
    names: Vec<PolicyName>,
    client: Client,
    limiters: Arc<[Arc<dyn Limiter>]>,
}

impl RedisAllOf {
    /// A policy of one member, `limiter` named `name`, on the server behind
    /// `client`; add members with [`and`](RedisAllOf::and).
    ///
    /// Errors: [`InvalidName`].
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use tollgate::Rate;
    /// let client = tollgate_redis::Client::connect("redis://127.0.0.1/").await?;
    /// let bucket = tollgate_redis::TokenBucket::new("burst", 10, Rate::per_second(5))?;
    /// let _ = tollgate_tower::RedisAllOf::new(client, "burst", bucket)?;
    /// # Ok(()) }
    /// ```
    pub fn new(
        client: Client,
        name: impl IntoPolicyName,
        limiter: impl Limiter + 'static,
    ) -> Result<Self, InvalidName> {
        Ok(RedisAllOf {
            names: vec![name.into_policy_name()?],
            client,
            limiters: Arc::new([Arc::new(limiter) as Arc<dyn Limiter>]),
        })
    }

    /// The same policy with one more member, asked after the others.
    ///
    /// Errors: [`InvalidName`].
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use tollgate::Rate;
    /// let client = tollgate_redis::Client::connect("redis://127.0.0.1/").await?;
    /// let bucket = tollgate_redis::TokenBucket::new("burst", 10, Rate::per_second(5))?;
    /// let log = tollgate_redis::SlidingLog::new("hourly", Rate::per_hour(100))?;
    /// let _ = tollgate_tower::RedisAllOf::new(client, "burst", bucket)?.and("hourly", log)?;
    /// # Ok(()) }
    /// ```
    pub fn and(
        mut self,
        name: impl IntoPolicyName,
        limiter: impl Limiter + 'static,
    ) -> Result<Self, InvalidName> {
        self.names.push(name.into_policy_name()?);
        let mut limiters: Vec<Arc<dyn Limiter>> = self.limiters.iter().cloned().collect();
        limiters.push(Arc::new(limiter));
        self.limiters = limiters.into();
        Ok(self)
    }
}

impl<K: Display> Policy<K> for RedisAllOf {
    fn name(&self) -> &PolicyName {
        &self.names[0]
    }

    fn member_name(&self, member: usize) -> &PolicyName {
        self.names.get(member).unwrap_or(&self.names[0])
    }

    /// One script call on the shared server: asked after every in-process
    /// policy.
    fn scope(&self) -> Scope {
        Scope::Shared
    }

    fn capacity(&self, _: &K) -> Option<u32> {
        self.limiters.iter().map(|limiter| limiter.capacity()).min()
    }

    fn decide(&self, key: &K, n: u32) -> Decision {
        let client = self.client.clone();
        let limiters = Arc::clone(&self.limiters);
        let key = key.to_string();
        Decision::Later(Box::pin(async move {
            let asks: Vec<Ask<'_>> = limiters
                .iter()
                .map(|limiter| Ask::new(&**limiter, &key).n(n))
                .collect();
            match client.try_acquire_all(&asks).await {
                Ok(admitted) => match admitted.tightest() {
                    Some((member, snapshot)) => PolicyOutcome::AdmittedBy { member, snapshot },
                    None => PolicyOutcome::Admitted(None),
                },
                Err(Refused {
                    member: Some(member),
                    error: Error::Denied(denied),
                    report: Some(snapshot),
                    ..
                }) => PolicyOutcome::DeniedBy {
                    member,
                    rejection: Rejection::new(denied, snapshot),
                },
                Err(refused) => outcome(Err(refused.error)),
            }
        }))
    }
}

fn outcome(decision: Result<(), Error>) -> PolicyOutcome {
    match decision {
        Ok(()) => PolicyOutcome::Admitted(None),
        Err(Error::Denied(denied)) => PolicyOutcome::Denied {
            denied,
            snapshot: None,
        },
        Err(err) => PolicyOutcome::Unavailable(err.to_string()),
    }
}

/// A [`LeasedLimiter`] as a policy: one global limit kept in Redis, spent
/// from a local lease without a Redis call on the request path (the limiter
/// refills its lease in the background and follows its own degradation
/// policy while Redis is gone). The limiter is for one Redis key, so the
/// request's key is not used: put it in a route group or an every-request
/// policy. A request that finds the local lease cold (empty, or expired
/// after an idle spell) while the budget may have room waits for one lease
/// call instead of being refused. Its denials carry the script's
/// retry-after. Its `RateLimit` member is the process's view
/// ([`LeasedLimiter::report`]): the permits its lease holds (a lower bound of
/// what the cluster could grant), the global capacity, and a full refill's
/// time as an upper bound of the time until full.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use tollgate::Rate;
/// use tollgate_redis::{LeaseOptions, LeasedLimiter, TokenBucket};
/// use tollgate_tower::{Global, LeasedLimit, ThrottleLayer};
///
/// let client = tollgate_redis::Client::connect("redis://127.0.0.1/").await?;
/// let bucket = TokenBucket::new("cluster", 1_000, Rate::per_second(1_000))?;
/// let leased = LeasedLimiter::start(client, bucket, "api", LeaseOptions::new());
/// let layer = ThrottleLayer::builder(Global)
///     .policy(LeasedLimit::new("cluster", leased)?)
///     .build();
/// # let _ = layer; Ok(()) }
/// ```
pub struct LeasedLimit {
    name: PolicyName,
    limiter: Arc<LeasedLimiter>,
}

impl LeasedLimit {
    /// The policy `name` over `limiter`.
    ///
    /// Errors: [`InvalidName`].
    ///
    /// ```no_run
    /// # fn demo(leased: tollgate_redis::LeasedLimiter) {
    /// let _ = tollgate_tower::LeasedLimit::new("cluster", leased).unwrap();
    /// # }
    /// ```
    pub fn new(name: impl IntoPolicyName, limiter: LeasedLimiter) -> Result<Self, InvalidName> {
        Self::shared(name, Arc::new(limiter))
    }

    /// The policy `name` over a `limiter` shared with other code (that reads
    /// its statistics or shuts it down).
    ///
    /// Errors: [`InvalidName`].
    ///
    /// ```no_run
    /// # fn demo(leased: std::sync::Arc<tollgate_redis::LeasedLimiter>) {
    /// let _ = tollgate_tower::LeasedLimit::shared("cluster", leased).unwrap();
    /// # }
    /// ```
    pub fn shared(
        name: impl IntoPolicyName,
        limiter: Arc<LeasedLimiter>,
    ) -> Result<Self, InvalidName> {
        Ok(LeasedLimit {
            name: name.into_policy_name()?,
            limiter,
        })
    }
}

impl LeasedLimit {
    fn outcome(&self, decision: Result<(), Error>) -> PolicyOutcome {
        reported(outcome(decision), self.limiter.report())
    }
}

/// An outcome with the leased limiter's report: the permits this process
/// holds, the global capacity, a full refill's time.
fn reported(outcome: PolicyOutcome, report: tollgate::Snapshot) -> PolicyOutcome {
    match outcome {
        PolicyOutcome::Admitted(_) => PolicyOutcome::Admitted(Some(report)),
        PolicyOutcome::Denied { denied, .. } => PolicyOutcome::Denied {
            denied,
            snapshot: Some(report),
        },
        other => other,
    }
}

impl<K> Policy<K> for LeasedLimit {
    fn name(&self) -> &PolicyName {
        &self.name
    }

    /// From the local lease when it covers `n` (decided at once); a cold
    /// lease — empty, or expired after an idle spell — while the budget may
    /// have room waits for one lease call
    /// ([`LeasedLimiter::try_acquire_n_or_wait`]), bounded by the client's
    /// timeout, instead of refusing.
    fn decide(&self, _: &K, n: u32) -> Decision {
        match self.limiter.try_acquire_n_or_wait(n) {
            Attempt::Decided(decision) => Decision::Now(self.outcome(decision)),
            Attempt::Waiting(wait) => {
                let limiter = Arc::clone(&self.limiter);
                Decision::Later(Box::pin(async move {
                    reported(outcome(wait.await), limiter.report())
                }))
            }
        }
    }

    fn capacity(&self, _: &K) -> Option<u32> {
        Some(self.limiter.report().capacity)
    }

    /// A budget shared with other processes: asked after every in-process
    /// policy.
    fn scope(&self) -> Scope {
        Scope::Shared
    }
}
