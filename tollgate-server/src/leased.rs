//! The leased backend: the Redis backend, except that token-bucket limits of
//! high rate are leased from Redis in batches and spent in this process
//! (tollgate-redis's [`LeasedLimiter`]), so their decisions make no Redis
//! call while the lease lasts. Every other limit is decided in Redis as the
//! Redis backend decides it, and a request's limits stay all or nothing: a
//! refusal by any hands the leased permits back to their pools.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tollgate::Rejection;
use tollgate_redis::{Client, LeaseOptions, LeaseReceipt, LeasedLimiter, Limiter, Policy};

use crate::config::{Algorithm, Config, InvalidRule, RuleId};
use crate::decide::{Check, Limit, Mode, Plan, Seen};
use crate::redis::{RedisLimits, Unanswered, caller_key, rule_name};

/// Which limits the leased backend leases, and how.
///
/// ```
/// use std::time::Duration;
/// use tollgate_server::Leasing;
/// let mut leasing = Leasing::default();
/// leasing.min_rate_per_second = 1_000.0;
/// leasing.lifetime = Duration::from_millis(500);
/// # let _ = leasing;
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct Leasing {
    /// `token_bucket` rules of at least this many requests per second are
    /// leased (default 100); slower ones, and every other algorithm, are
    /// decided in Redis. A lease is a debit of a token bucket's budget, so
    /// only token buckets can be leased exactly.
    pub min_rate_per_second: f64,
    /// Keys held in leases at once, over every rule (default 1,024). A key
    /// beyond them is decided in Redis, exactly, until an idle one leaves.
    pub max_keys: usize,
    /// How long leased permits may sit in this process before they go back
    /// (default 1 s): the bound on how late a permit is spent after it was
    /// debited.
    pub lifetime: Duration,
    /// The largest lease, in permits (default 4,096).
    pub max_lease: u32,
    /// A key not asked for this long gives its lease back and leaves
    /// (default 10 s).
    pub idle: Duration,
}

impl Default for Leasing {
    fn default() -> Self {
        Leasing {
            min_rate_per_second: 100.0,
            max_keys: 1024,
            lifetime: Duration::from_secs(1),
            max_lease: 4096,
            idle: Duration::from_secs(10),
        }
    }
}

/// One key's lease.
struct Held {
    limiter: LeasedLimiter,
    rule: RuleId,
    bucket: tollgate_redis::TokenBucket,
    /// Milliseconds since [`Leases::epoch`] of its last use.
    used: AtomicU64,
}

/// The leased rules and the keys held in leases.
pub(crate) struct Leases {
    settings: Leasing,
    /// The bucket of every rule that leases.
    buckets: HashMap<RuleId, tollgate_redis::TokenBucket>,
    /// The keys held, by their Redis key (one per rule and caller key).
    held: parking_lot::RwLock<HashMap<String, Arc<Held>>>,
    epoch: Instant,
    /// Milliseconds since `epoch` of the last sweep of idle keys.
    swept: AtomicU64,
}

impl Leases {
    /// The leased rules of `config`; keys held by `previous` whose rule
    /// kept its bucket stay held (their pools and leases carry over).
    pub(crate) fn build(
        config: &Config,
        prefix: &str,
        settings: Leasing,
        previous: Option<&Leases>,
    ) -> Result<Leases, InvalidRule> {
        let mut buckets = HashMap::new();
        for rule in config.domains().flat_map(|d| d.rules()) {
            let (Algorithm::TokenBucket { burst }, Some(rate), Some(unit)) =
                (rule.algorithm, rule.rate(), rule.unit)
            else {
                continue;
            };
            let per_second = f64::from(rule.requests_per_unit) / unit.duration().as_secs_f64();
            if rule.blocks_all() || per_second < settings.min_rate_per_second {
                continue;
            }
            // The Redis backend's name for the rule: a key beyond the
            // leased ones, decided in Redis, is on the same state.
            let bucket = tollgate_redis::TokenBucket::new(&rule_name(&rule.id), burst, rate)
                .and_then(|b| b.with_prefix(prefix))
                .map_err(|error| InvalidRule {
                    rule: rule.id.to_string(),
                    error,
                })?;
            buckets.insert(rule.id.clone(), bucket);
        }
        let (epoch, held) = match previous {
            Some(previous) => {
                let kept = previous
                    .held
                    .read()
                    .iter()
                    .filter(|(_, h)| buckets.get(&h.rule) == Some(&h.bucket))
                    .map(|(k, h)| (k.clone(), h.clone()))
                    .collect();
                (previous.epoch, kept)
            }
            None => (Instant::now(), HashMap::new()),
        };
        crate::metrics::leased_keys(held.len());
        Ok(Leases {
            settings,
            buckets,
            held: parking_lot::RwLock::new(held),
            epoch,
            swept: AtomicU64::new(0),
        })
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// The lease of `check`'s key, started at its first use; `None` when
    /// its rule does not lease, it asks more than the bucket holds, or
    /// [`Leasing::max_keys`] are held.
    fn held(&self, domain: &str, check: &Check<'_>, client: &Client) -> Option<Arc<Held>> {
        let Limit::Rule(rule) = check.limit else {
            return None;
        };
        let bucket = self.buckets.get(&rule.id)?;
        if check.hits > u64::from(bucket.capacity()) {
            return None;
        }
        let now = self.now_ms();
        self.sweep(now);
        let caller = caller_key(domain, check);
        let key = bucket.redis_key(&caller);
        if let Some(held) = self.held.read().get(&key) {
            // Relaxed: an idle clock; a stale value moves an eviction by
            // one sweep. Written once a millisecond at most: a hot key's
            // decisions do not trade its cache line.
            if held.used.load(Ordering::Relaxed) != now {
                held.used.store(now, Ordering::Relaxed);
            }
            return Some(held.clone());
        }
        let mut map = self.held.write();
        if let Some(held) = map.get(&key) {
            return Some(held.clone());
        }
        if map.len() >= self.settings.max_keys {
            return None;
        }
        let options = LeaseOptions::new()
            .max_lease(self.settings.max_lease)
            .lifetime(self.settings.lifetime)
            // The server's failure mode answers for the whole request when
            // a lease cannot be had: see `decide`.
            .policy(Policy::Closed);
        let held = Arc::new(Held {
            limiter: LeasedLimiter::start(client.clone(), bucket.clone(), &caller, options),
            rule: rule.id.clone(),
            bucket: bucket.clone(),
            used: AtomicU64::new(now),
        });
        map.insert(key, held.clone());
        crate::metrics::leased_keys(map.len());
        Some(held)
    }

    /// Drops the keys idle for [`Leasing::idle`]: their limiters stop and
    /// give their unused permits back. At most one sweep per half that time.
    fn sweep(&self, now: u64) {
        let idle = u64::try_from(self.settings.idle.as_millis()).unwrap_or(u64::MAX);
        // Relaxed: one thread wins the exchange and sweeps; the others go on.
        let last = self.swept.load(Ordering::Relaxed);
        if now.saturating_sub(last) < idle / 2
            || self
                .swept
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        let mut map = self.held.write();
        // Relaxed: see `held`.
        map.retain(|_, h| now.saturating_sub(h.used.load(Ordering::Relaxed)) < idle);
        crate::metrics::leased_keys(map.len());
    }

    /// Keys held in leases now.
    pub(crate) fn keys(&self) -> usize {
        self.held.read().len()
    }
}

/// Decides `plan` of a request of `domain`: its enforced leased limits from
/// their pools (a key without a live lease waits for one lease call, at
/// most the client's timeout; a live pool that ran dry refuses), then the rest in Redis by one call as the Redis backend does.
/// A refusal by any limit, or a failure, hands the leased permits back.
pub(crate) async fn decide(
    leases: &Leases,
    limits: &RedisLimits,
    client: &Client,
    domain: &str,
    plan: &Plan<'_>,
) -> Result<(Vec<Seen>, bool), Unanswered> {
    let checks = &plan.checks;
    let mut seen = vec![Seen::NotAsked; checks.len()];
    // Every lease first, so that the receipts below can borrow them.
    let held: Vec<(usize, Arc<Held>)> = checks
        .iter()
        .enumerate()
        .filter(|(_, c)| c.mode == Mode::Enforced && c.hits > 0 && !c.blocks_all())
        .filter_map(|(i, c)| leases.held(domain, c, client).map(|h| (i, h)))
        .collect();
    let mut receipts: Vec<(&Held, LeaseReceipt<'_>)> = Vec::with_capacity(held.len());
    let refund = |receipts: Vec<(&Held, LeaseReceipt<'_>)>| {
        for (held, receipt) in receipts {
            held.limiter.refund(receipt);
        }
    };
    for (i, held) in &held {
        // `held` refused hits above the bucket's capacity, which fits a u32.
        let hits = u32::try_from(checks[*i].hits).unwrap_or(u32::MAX);
        // A live pool that ran dry refuses at once (its budget is at the
        // limit; a refill is on its way); only a key without a live lease
        // (new, or idle past the lifetime) waits for one lease call.
        let decision = if held.limiter.holds_lease() {
            held.limiter.try_acquire_n_receipt(hits)
        } else {
            held.limiter.try_acquire_n_receipt_waiting(hits).await
        };
        match decision {
            Ok(receipt) => {
                seen[*i] = Seen::Admitted(held.limiter.report());
                receipts.push((held, receipt));
            }
            Err(tollgate_redis::Error::Denied(denied)) => {
                seen[*i] = Seen::Refused(Rejection::new(denied, held.limiter.report()));
                refund(receipts);
                return Ok((seen, false));
            }
            Err(error) => {
                refund(receipts);
                return Err(Unanswered::Redis(error));
            }
        }
    }
    let decided = crate::redis::decide(limits, client, domain, plan, seen).await;
    if !matches!(decided, Ok((_, true))) {
        refund(receipts);
    }
    decided
}
