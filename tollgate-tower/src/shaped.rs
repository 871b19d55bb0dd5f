//! Waiting instead of rejecting: a request books its permits on a
//! [`Reserve`] limiter and is held until they start, if that is within a
//! bound; a client that goes away while held gives its reservation back.

use std::sync::Arc;
use std::time::Duration;

use tollgate::{RateLimiter, Reserve};

use crate::fields::{IntoPolicyName, InvalidName, PolicyName};
use crate::policy::{Decision, Policy, PolicyOutcome};

/// A [`Reserve`] limiter ([`TokenBucket`](tollgate::TokenBucket),
/// [`Shaper`](tollgate::Shaper), [`LeakyBucket`](tollgate::LeakyBucket),
/// [`WarmUp`](tollgate::WarmUp), their twins) as a policy that delays a
/// request up to `max_wait` rather than rejecting it: the request books its
/// permits in arrival order
/// ([`Reserve::reserve_within`]) and is passed on when they start. A request
/// whose start would be more than `max_wait` away books nothing and is
/// rejected with the exact retry-after, as any other denial.
///
/// **Cancellation.** If the client goes away while the request waits, the
/// server drops the request's future; the wait's reservation is then
/// cancelled ([`Reservation::cancel`](tollgate::Reservation::cancel)): its
/// permits come back when no later reservation is outstanding, exactly as
/// the core documents. The tests check it with a client that disconnects.
///
/// **Reported quota.** The core has no reservation that reports its state,
/// so the `RateLimit` field of a shaped policy comes from a
/// [`snapshot`](RateLimiter::snapshot) read right after the wait (or the
/// denial): a read, not the decision's own word, unlike every other policy.
///
/// ```
/// use std::time::Duration;
/// use tollgate::{Rate, Shaper};
/// use tollgate_tower::Shaped;
///
/// let shaper = Shaper::new(Rate::per_second(50), 10, Duration::from_millis(200)).unwrap();
/// let _ = Shaped::new("backend", shaper, Duration::from_millis(200)).unwrap();
/// ```
pub struct Shaped<L: ?Sized> {
    name: PolicyName,
    limiter: Arc<L>,
    max_wait: Duration,
}

impl<L: Reserve + RateLimiter + Send + Sync + ?Sized + 'static> Shaped<L> {
    /// The policy `name`, holding requests up to `max_wait` on `limiter`.
    ///
    /// Errors: [`InvalidName`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Rate, TokenBucket};
    /// use tollgate_tower::Shaped;
    /// let bucket = TokenBucket::new(5, Rate::per_second(5)).unwrap();
    /// let _ = Shaped::new("smooth", bucket, Duration::from_secs(1)).unwrap();
    /// ```
    pub fn new(
        name: impl IntoPolicyName,
        limiter: L,
        max_wait: Duration,
    ) -> Result<Self, InvalidName>
    where
        L: Sized,
    {
        Self::shared(name, Arc::new(limiter), max_wait)
    }

    /// As [`Shaped::new`], over a `limiter` shared with other code.
    ///
    /// Errors: [`InvalidName`].
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use tollgate::{Rate, TokenBucket};
    /// use tollgate_tower::Shaped;
    /// let bucket = Arc::new(TokenBucket::new(5, Rate::per_second(5)).unwrap());
    /// let _ = Shaped::shared("smooth", Arc::clone(&bucket), Duration::from_secs(1)).unwrap();
    /// ```
    pub fn shared(
        name: impl IntoPolicyName,
        limiter: Arc<L>,
        max_wait: Duration,
    ) -> Result<Self, InvalidName> {
        Ok(Shaped {
            name: name.into_policy_name()?,
            limiter,
            max_wait,
        })
    }
}

impl<K, L: Reserve + RateLimiter + Send + Sync + ?Sized + 'static> Policy<K> for Shaped<L> {
    fn name(&self) -> &PolicyName {
        &self.name
    }

    fn decide(&self, _: &K, n: u32) -> Decision {
        let limiter = Arc::clone(&self.limiter);
        let max_wait = self.max_wait;
        Decision::Later(Box::pin(async move {
            match limiter.reserve_within(n, max_wait) {
                Ok(reservation) => {
                    // Dropped before its start (the client left), the wait
                    // cancels the reservation.
                    reservation.wait_async().await;
                    PolicyOutcome::Admitted(Some(limiter.snapshot()))
                }
                Err(denied) => PolicyOutcome::Denied {
                    denied,
                    snapshot: Some(limiter.snapshot()),
                },
            }
        }))
    }
}
