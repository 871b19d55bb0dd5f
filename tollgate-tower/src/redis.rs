//! A `tollgate-redis` limiter as a policy (feature `redis`): one limit shared
//! by every server process through Redis, decided asynchronously.

use std::fmt::Display;
use std::sync::Arc;

use tollgate_redis::{Client, Error, Limiter};

use crate::policy::{Decision, IntoPolicyName, InvalidName, Outcome, Policy, PolicyName};

/// A [`tollgate_redis`] limiter (token bucket, fixed window, sliding window,
/// sliding log) as a policy: each request's key — printed with `Display`, so
/// an `IpAddr`, a `String` or `()` — is the Redis-side key, and the decision
/// is one script call on the shared server ([`Client::try_acquire_n`]).
///
/// A denial is the script's exact retry-after (a `429` like any other); a
/// server that cannot be reached within the client's timeout is
/// [`Outcome::Unavailable`] (`503`). For a policy that keeps deciding while
/// Redis is gone, use a leased limiter through [`AsyncLimit`](crate::AsyncLimit).
/// The scripts report the permits remaining but not the time until full,
/// so this policy adds no `RateLimit` members.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use tollgate::Rate;
/// use tollgate_tower::{PeerIp, RedisLimit, ThrottleLayer};
///
/// let client = tollgate_redis::Client::connect("redis://127.0.0.1/").await?;
/// let per_ip = tollgate_redis::SlidingLog::new(Rate::per_minute(60))?;
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
    /// let bucket = tollgate_redis::TokenBucket::new(10, Rate::per_second(5))?;
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

    fn decide(&self, key: &K, n: u32) -> Decision {
        let client = self.client.clone();
        let limiter = Arc::clone(&self.limiter);
        let key = key.to_string();
        Decision::Later(Box::pin(async move {
            match client.try_acquire_n(&*limiter, &key, n).await {
                Ok(_) => Outcome::Admitted(None),
                Err(Error::Denied(denied)) => Outcome::Denied {
                    denied,
                    snapshot: None,
                },
                Err(err) => Outcome::Unavailable(err.to_string()),
            }
        }))
    }
}
