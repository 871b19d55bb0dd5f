//! The Redis backend: every limit's state in Redis (one server or a Redis
//! Cluster) through tollgate-redis, so any number of server replicas share
//! the limits exactly; a request's limits decided all or nothing by one
//! script call.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use tollgate::{Denied, Rejection, Snapshot};
use tollgate_redis::{Ask, Client, Limiter};

use crate::config::{Algorithm, Config, Failure, InvalidRule, RuleId, Unit};
use crate::decide::{Check, Limit, Mode, Plan, Seen, never_fits};

/// The Redis backend's settings.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RedisSettings {
    /// The prefix of every Redis key the server writes (default
    /// `tollgate-server`): give two servers that must not share limits
    /// different prefixes. Without `{` or `}`: every key is
    /// `<prefix>:<limit>:{<domain>}:…`, the domain its hash tag, and
    /// [`Server::with_redis`](crate::Server::with_redis) refuses a prefix
    /// with a brace ([`InvalidRule`](crate::InvalidRule), for the first rule
    /// that keeps state).
    pub prefix: String,
    /// What a request gets when Redis cannot answer, in a domain whose
    /// file does not say (`failure_mode`).
    pub failure: Failure,
    /// Lease fast token-bucket limits instead of calling Redis for each of
    /// their decisions (the leased backend); `None` (the default) calls
    /// Redis for every decision.
    pub lease: Option<crate::Leasing>,
}

impl Default for RedisSettings {
    fn default() -> Self {
        RedisSettings {
            prefix: "tollgate-server".to_owned(),
            failure: Failure::default(),
            lease: None,
        }
    }
}

/// Every rule's limiter in Redis, by the rule's identity.
pub(crate) struct RedisLimits {
    by_rule: HashMap<RuleId, Arc<dyn Limiter>>,
    overrides: parking_lot::RwLock<HashMap<(u32, Unit), Arc<dyn Limiter>>>,
    prefix: String,
}

/// The name of a configured rule's limiter in Redis: `rule-<index>`, the
/// rule's index in its descriptor's `rate_limits`. The rest of the rule's
/// identity is in the caller key ([`caller_key`]): its domain, and the state
/// key, which spells the descriptor entries it matched. So two rules never
/// share a Redis key: rules of one descriptor differ by name, rules of
/// different descriptors or domains by caller key. The leased backend's
/// buckets take the same names, so both backends keep one rule's state
/// under one key.
pub(crate) fn rule_name(rule: &RuleId) -> String {
    format!("rule-{}", rule.index)
}

/// The name of the limiter of a request's own limit (an override):
/// `override-<permits>-per-<unit>`, apart from every rule's.
fn override_name(permits: u32, unit: Unit) -> String {
    format!("override-{permits}-per-{}", unit.name())
}

/// One limit's limiter in Redis, named `name`.
fn limiter(
    algorithm: Algorithm,
    rate: tollgate::Rate,
    prefix: &str,
    name: &str,
) -> Result<Arc<dyn Limiter>, tollgate::ConfigError> {
    Ok(match algorithm {
        Algorithm::FixedWindow => {
            Arc::new(tollgate_redis::FixedWindow::new(name, rate)?.with_prefix(prefix)?)
        }
        Algorithm::TokenBucket { burst } => {
            Arc::new(tollgate_redis::TokenBucket::new(name, burst, rate)?.with_prefix(prefix)?)
        }
        Algorithm::SlidingLog => {
            Arc::new(tollgate_redis::SlidingLog::new(name, rate)?.with_prefix(prefix)?)
        }
        // Redis keeps the two-window estimate (the memory backend keeps
        // sub-windows): see `Algorithm::SlidingWindow`.
        Algorithm::SlidingWindow => {
            Arc::new(tollgate_redis::ApproxSlidingWindow::new(name, rate)?.with_prefix(prefix)?)
        }
    })
}

impl RedisLimits {
    /// A limiter for each of `config`'s rules that keeps state.
    pub(crate) fn build(config: &Config, prefix: &str) -> Result<RedisLimits, InvalidRule> {
        let mut by_rule = HashMap::new();
        for rule in config.domains().flat_map(|d| d.rules()) {
            let Some(rate) = rule.rate().filter(|_| !rule.blocks_all()) else {
                continue;
            };
            let limiter =
                limiter(rule.algorithm, rate, prefix, &rule_name(&rule.id)).map_err(|error| {
                    InvalidRule {
                        rule: rule.id.to_string(),
                        error,
                    }
                })?;
            by_rule.insert(rule.id.clone(), limiter);
        }
        Ok(RedisLimits {
            by_rule,
            overrides: parking_lot::RwLock::default(),
            prefix: prefix.to_owned(),
        })
    }

    /// The limiter of a request's own limit, made at its first use (at most
    /// [`MAX_OVERRIDES`](crate::memory::MAX_OVERRIDES) of them).
    fn overridden(&self, permits: u32, unit: Unit) -> Option<Arc<dyn Limiter>> {
        if let Some(l) = self.overrides.read().get(&(permits, unit)) {
            return Some(l.clone());
        }
        let mut overrides = self.overrides.write();
        if overrides.len() >= crate::memory::MAX_OVERRIDES {
            return overrides.get(&(permits, unit)).cloned();
        }
        let rate = tollgate::Rate::new(permits, unit.duration());
        let name = override_name(permits, unit);
        let made = limiter(Algorithm::FixedWindow, rate, &self.prefix, &name).ok()?;
        Some(overrides.entry((permits, unit)).or_insert(made).clone())
    }

    fn limiter_of(&self, check: &Check<'_>) -> Option<Arc<dyn Limiter>> {
        match check.limit {
            Limit::Rule(rule) => self.by_rule.get(&rule.id).cloned(),
            Limit::Override { permits, unit } => self.overridden(permits, unit),
        }
    }
}

/// The caller key of a check in Redis: `<domain>}:<state key>`. Its domain
/// comes first and ends with `}`: tollgate-redis puts the caller key in a
/// hash tag (`<prefix>:<name>:{<caller key>}:<kind>`, the limiter's name
/// before the tag), and Redis Cluster hashes only up to the first `}`, so
/// every key of one domain, under every limiter's name, lands in one slot
/// and a request's limits can be decided by one script. Which limit the key
/// belongs to — a rule of the descriptor, or a request's own limit — is the
/// limiter's name ([`rule_name`]).
pub(crate) fn caller_key(domain: &str, check: &Check<'_>) -> String {
    // A brace in the domain would end (or open) the tag early: left out,
    // which only ever puts two domains in one slot.
    let tag: String = domain.chars().filter(|c| !matches!(c, '{' | '}')).collect();
    format!("{tag}}}:{}", check.key)
}

/// The Redis side of a server: its limiters and, once connected, its
/// client.
pub(crate) struct Redis {
    pub(crate) settings: RedisSettings,
    pub(crate) client: ArcSwapOption<Client>,
}

impl Redis {
    pub(crate) fn new(settings: RedisSettings) -> Redis {
        Redis {
            settings,
            client: ArcSwapOption::empty(),
        }
    }
}

/// Why the Redis backend did not decide a request.
#[derive(Debug)]
pub(crate) enum Unanswered {
    /// Not connected yet.
    NotConnected,
    /// Redis answered with an error, or not in time.
    Redis(tollgate_redis::Error),
}

impl std::fmt::Display for Unanswered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unanswered::NotConnected => f.write_str("not connected to Redis"),
            Unanswered::Redis(e) => e.fmt(f),
        }
    }
}

/// Decides `plan` of a request of `domain` in Redis: its enforced limits
/// in one call, all or nothing; then each shadow-mode and quota-mode limit
/// in a call of its own, only when the enforced ones admitted (a request
/// refused by every quota limit is then charged by its enforced ones:
/// Redis gives nothing back). Checks `seen` already admitted (the leased
/// backend's) are not asked again.
pub(crate) async fn decide(
    limits: &RedisLimits,
    client: &Client,
    domain: &str,
    plan: &Plan<'_>,
    mut seen: Vec<Seen>,
) -> Result<(Vec<Seen>, bool), Unanswered> {
    let checks = &plan.checks;
    let mut limiters: Vec<Option<Arc<dyn Limiter>>> = Vec::with_capacity(checks.len());
    let mut keys = Vec::with_capacity(checks.len());
    let mut refused_now = false;
    for (i, check) in checks.iter().enumerate() {
        let limiter = if check.blocks_all() {
            None
        } else {
            limits.limiter_of(check)
        };
        let Some(l) = &limiter else {
            seen[i] = Seen::Refused(never_fits(check.hits, Snapshot::new(0, 0, Duration::ZERO)));
            refused_now |= check.mode == Mode::Enforced;
            limiters.push(None);
            keys.push(String::new());
            continue;
        };
        if u32::try_from(check.hits).is_err() || check.hits > u64::from(l.capacity()) {
            let capacity = l.capacity();
            seen[i] = Seen::Refused(never_fits(
                check.hits,
                Snapshot::new(0, capacity, Duration::ZERO),
            ));
            refused_now |= check.mode == Mode::Enforced;
        }
        limiters.push(limiter);
        keys.push(caller_key(domain, check));
    }
    if refused_now {
        // A limit refuses whatever Redis holds: nothing to ask.
        return Ok((seen, false));
    }
    let ask = |i: usize| -> Ask<'_> {
        let limiter: &dyn Limiter = limiters[i].as_deref().expect("asked limits have one");
        Ask::new(limiter, &keys[i]).n(u32::try_from(checks[i].hits).unwrap_or(u32::MAX))
    };
    let asked = |mode: Mode| {
        (0..checks.len())
            .filter(move |&i| checks[i].mode == mode && checks[i].hits > 0)
            .filter(|&i| matches!(seen[i], Seen::NotAsked))
            .collect::<Vec<usize>>()
    };
    let enforced = asked(Mode::Enforced);
    let shadows = asked(Mode::Shadow);
    let quotas = asked(Mode::Quota);
    let asks: Vec<Ask<'_>> = enforced.iter().map(|&i| ask(i)).collect();
    // No call when every enforced limit was leased: an empty ask admits.
    match client.try_acquire_all(&asks).await {
        Ok(admitted) => {
            for (&i, report) in enforced.iter().zip(admitted.reports()) {
                seen[i] = Seen::Admitted(*report);
            }
        }
        Err(refused) => {
            let tollgate_redis::Error::Denied(denied) = refused.error else {
                return Err(Unanswered::Redis(refused.error));
            };
            for (j, &i) in enforced.iter().enumerate() {
                let capacity = limiters[i].as_ref().map_or(0, |l| l.capacity());
                let state = refused.found.get(j).copied().unwrap_or(Snapshot::new(
                    0,
                    capacity,
                    Duration::ZERO,
                ));
                seen[i] = if refused.member == Some(j) {
                    Seen::Refused(Rejection::new(denied, state))
                } else if u64::from(state.available) >= checks[i].hits {
                    Seen::Admitted(state)
                } else if refused.found.is_empty() {
                    Seen::NotAsked
                } else {
                    // Another limit that refused too: its wait is at most
                    // the time until it is whole again.
                    Seen::Refused(Rejection::new(Denied::RetryAfter(state.until_full), state))
                };
            }
            return Ok((seen, false));
        }
    }
    for &i in &shadows {
        seen[i] = match client.try_acquire_all(&[ask(i)]).await {
            Ok(admitted) => Seen::Admitted(admitted.reports()[0]),
            Err(refused) => match refused.error {
                tollgate_redis::Error::Denied(denied) => Seen::Refused(Rejection::new(
                    denied,
                    refused
                        .report
                        .unwrap_or(Snapshot::new(0, 0, Duration::ZERO)),
                )),
                // A shadow limit's failure refuses nothing.
                _ => Seen::NotAsked,
            },
        };
    }
    let mut quota_refusals = 0;
    for &i in &quotas {
        seen[i] = match client.try_acquire_all(&[ask(i)]).await {
            Ok(admitted) => Seen::Admitted(admitted.reports()[0]),
            Err(refused) => match refused.error {
                tollgate_redis::Error::Denied(denied) => {
                    quota_refusals += 1;
                    Seen::Refused(Rejection::new(
                        denied,
                        refused
                            .report
                            .unwrap_or(Snapshot::new(0, 0, Duration::ZERO)),
                    ))
                }
                error => return Err(Unanswered::Redis(error)),
            },
        };
    }
    let admitted = quotas.is_empty() || quota_refusals < quotas.len();
    Ok((seen, admitted))
}
