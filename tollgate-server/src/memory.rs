//! The memory backend: one keyed limiter per configured rule, each key of it
//! one descriptor value's state, decided in this process without a lock.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tollgate::keyed::{BucketConfig, Carry, Keyed, SlidingWindowConfig, WindowConfig};
use tollgate::{
    ConfigError, FixedWindow, Keep, LogConfig, Rate, Rejection, SlidingLog, SlidingWindow,
    Snapshot, TokenBucket,
};

use crate::config::{Algorithm, RuleId};
use crate::decide::{BadRequest, Check, Limit, Mode, Plan, Seen, never_fits};

/// What a rule's state is: its algorithm and rate. Two rules with the same
/// definition decide alike, so a reload that keeps the definition keeps the
/// state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Definition {
    pub(crate) algorithm: Algorithm,
    pub(crate) rate: Rate,
}

/// One rule's state for every key: a keyed limiter of the rule's algorithm.
pub(crate) enum Store {
    FixedWindow(Keyed<String, FixedWindow>),
    TokenBucket(Keyed<String, TokenBucket>),
    SlidingLog(Keyed<String, SlidingLog>),
    SlidingWindow(Keyed<String, SlidingWindow>),
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self {
            Store::FixedWindow(_) => "FixedWindow",
            Store::TokenBucket(_) => "TokenBucket",
            Store::SlidingLog(_) => "SlidingLog",
            Store::SlidingWindow(_) => "SlidingWindow",
        };
        f.debug_struct("Store").field("kind", &kind).finish()
    }
}

impl Store {
    /// A store with no key yet, holding at most `max_keys` keys (beyond them,
    /// the keyed limiters' shared overflow state: never an admission more).
    pub(crate) fn new(definition: Definition, max_keys: usize) -> Result<Store, ConfigError> {
        let rate = definition.rate;
        Ok(match definition.algorithm {
            Algorithm::FixedWindow => {
                Store::FixedWindow(Keyed::new(WindowConfig::new(rate)?).with_max_keys(max_keys))
            }
            Algorithm::TokenBucket { burst } => Store::TokenBucket(
                Keyed::new(BucketConfig::new(burst, rate)?).with_max_keys(max_keys),
            ),
            Algorithm::SlidingLog => {
                Store::SlidingLog(Keyed::new(LogConfig::new(rate)?).with_max_keys(max_keys))
            }
            Algorithm::SlidingWindow => Store::SlidingWindow(
                Keyed::new(SlidingWindowConfig::new(rate)?).with_max_keys(max_keys),
            ),
        })
    }

    /// Whether a permit this store admitted can be given back exactly when a
    /// later limit of the same request refuses. The logs cannot (a refund
    /// would need the admission's own record), so a request asks them last.
    pub(crate) fn refundable(&self) -> bool {
        matches!(self, Store::FixedWindow(_) | Store::TokenBucket(_))
    }

    /// Asks `key` for `n` permits; `keep` sees the answer and says whether
    /// an admission stands (the rest of the request admitted). Returns
    /// whether it stands. See [`tollgate::RateLimiter::try_acquire_n_then`].
    pub(crate) fn decide_then(&self, key: &str, n: u32, keep: Keep<'_>) -> bool {
        match self {
            Store::FixedWindow(k) => k.try_acquire_n_then(key, n, keep),
            Store::TokenBucket(k) => k.try_acquire_n_then(key, n, keep),
            Store::SlidingLog(k) => k.try_acquire_n_then(key, n, keep),
            Store::SlidingWindow(k) => k.try_acquire_n_then(key, n, keep),
        }
    }

    /// `key`'s state now, charging nothing.
    pub(crate) fn snapshot(&self, key: &str) -> Snapshot {
        match self {
            Store::FixedWindow(k) => k.snapshot(key),
            Store::TokenBucket(k) => k.snapshot(key),
            Store::SlidingLog(k) => k.snapshot(key),
            Store::SlidingWindow(k) => k.snapshot(key),
        }
    }

    /// Keys held now.
    pub(crate) fn len(&self) -> usize {
        match self {
            Store::FixedWindow(k) => k.len(),
            Store::TokenBucket(k) => k.len(),
            Store::SlidingLog(k) => k.len(),
            Store::SlidingWindow(k) => k.len(),
        }
    }

    /// Takes `definition`'s rate and capacity in place when the algorithm
    /// is the same, every key's state carried over proportionally (a
    /// bucket 40 % used stays 40 % used); `false` when it is another
    /// algorithm, whose state means something else.
    fn reconfigure(&self, definition: Definition) -> Result<bool, ConfigError> {
        let rate = definition.rate;
        match (self, definition.algorithm) {
            (Store::FixedWindow(k), Algorithm::FixedWindow) => {
                k.reconfigure(WindowConfig::new(rate)?, Carry::Proportional)
            }
            (Store::TokenBucket(k), Algorithm::TokenBucket { burst }) => {
                k.reconfigure(BucketConfig::new(burst, rate)?, Carry::Proportional)
            }
            (Store::SlidingLog(k), Algorithm::SlidingLog) => {
                k.reconfigure(LogConfig::new(rate)?, Carry::Proportional)
            }
            (Store::SlidingWindow(k), Algorithm::SlidingWindow) => {
                k.reconfigure(SlidingWindowConfig::new(rate)?, Carry::Proportional)
            }
            _ => return Ok(false),
        }
        Ok(true)
    }
}

/// Every rule's store, by the rule's identity, and the stores of limits a
/// request brings itself (Envoy's per-descriptor `limit` override).
#[derive(Debug, Default)]
pub(crate) struct Stores {
    by_rule: HashMap<RuleId, (Definition, Arc<Store>)>,
    overrides: parking_lot::RwLock<HashMap<(Algorithm, u32, Duration), Arc<Store>>>,
    max_keys: usize,
}

/// How many distinct override limits one server keeps: each is a keyed
/// limiter, created at the first request that asks for it, so a client
/// choosing rates freely must not grow memory without bound.
pub(crate) const MAX_OVERRIDES: usize = 1024;

impl Stores {
    /// Stores for `rules` (identity and definition), reusing `previous`'s
    /// where a rule of the same identity is still there: its state is kept
    /// when the definition is unchanged and carried over when only the rate
    /// changed. Overrides are carried over as they are.
    pub(crate) fn build<'a>(
        rules: impl IntoIterator<Item = (&'a RuleId, Definition)>,
        previous: Option<&Stores>,
        max_keys: usize,
    ) -> Result<Stores, (RuleId, ConfigError)> {
        let mut by_rule = HashMap::new();
        for (id, definition) in rules {
            let failed = |e| (id.clone(), e);
            let reused = match previous.and_then(|p| p.by_rule.get(id)) {
                Some((old, store)) if *old == definition => Some(store.clone()),
                Some((_, store)) if store.reconfigure(definition).map_err(failed)? => {
                    Some(store.clone())
                }
                _ => None,
            };
            let store = match reused {
                Some(store) => store,
                None => Arc::new(Store::new(definition, max_keys).map_err(failed)?),
            };
            by_rule.insert(id.clone(), (definition, store));
        }
        let overrides = previous
            .map(|p| p.overrides.read().clone())
            .unwrap_or_default();
        Ok(Stores {
            by_rule,
            overrides: parking_lot::RwLock::new(overrides),
            max_keys,
        })
    }

    /// The store of the rule `id`.
    pub(crate) fn rule(&self, id: &RuleId) -> Option<&Arc<Store>> {
        self.by_rule.get(id).map(|(_, store)| store)
    }

    /// The store of a request's own limit (`permits` per `period`, Envoy's
    /// override semantics: a fixed window), created at first use; `None`
    /// when [`MAX_OVERRIDES`] distinct ones exist already or the rate is
    /// invalid.
    pub(crate) fn overridden(&self, permits: u32, period: Duration) -> Option<Arc<Store>> {
        let key = (Algorithm::FixedWindow, permits, period);
        if let Some(store) = self.overrides.read().get(&key) {
            return Some(store.clone());
        }
        let mut overrides = self.overrides.write();
        if let Some(store) = overrides.get(&key) {
            return Some(store.clone());
        }
        if overrides.len() >= MAX_OVERRIDES {
            return None;
        }
        let definition = Definition {
            algorithm: Algorithm::FixedWindow,
            rate: Rate::new(permits, period),
        };
        let store = Arc::new(Store::new(definition, self.max_keys).ok()?);
        overrides.insert(key, store.clone());
        Some(store)
    }

    /// Keys held by every store (a gauge for operators).
    pub(crate) fn keys(&self) -> usize {
        self.by_rule.values().map(|(_, s)| s.len()).sum::<usize>()
            + self
                .overrides
                .read()
                .values()
                .map(|s| s.len())
                .sum::<usize>()
    }
}

/// A check with its store: `None` for a rule of 0 requests.
type Resolved<'p, 'c> = (&'p Check<'c>, Option<Arc<Store>>);

impl Stores {
    /// Decides `plan` on these stores: its limits asked in turn, each
    /// inside the one before's decision, so that a refusal gives back what
    /// the limits before it took (all or nothing). Returns what was seen of
    /// each check (the plan reordered: the limits that refund exactly
    /// first) and whether the request is admitted.
    ///
    /// Errors: [`BadRequest::BadOverride`] when the server keeps no more
    /// request-chosen limits.
    pub(crate) fn decide(&self, plan: &mut Plan<'_>) -> Result<(Vec<Seen>, bool), BadRequest> {
        let mut resolved = Vec::with_capacity(plan.checks.len());
        for check in &plan.checks {
            let store = match check.limit {
                Limit::Rule(_) if check.blocks_all() => None,
                // Built from the same configuration: every rule has one.
                Limit::Rule(rule) => self.rule(&rule.id).cloned(),
                Limit::Override { permits, unit } => Some(
                    self.overridden(permits, unit.duration())
                        .ok_or(BadRequest::BadOverride {
                            descriptor: check.descriptor,
                            reason: "the server keeps no more request-chosen limits",
                        })?,
                ),
            };
            resolved.push(store);
        }
        // The limits that give permits back exactly go first, so one that
        // cannot is asked only when every other admitted (the core
        // `AllOf`'s rule).
        let mut order: Vec<usize> = (0..plan.checks.len()).collect();
        order.sort_by_key(|&i| !resolved[i].as_ref().is_none_or(|s| s.refundable()));
        let quotas = plan.checks.iter().filter(|c| c.mode == Mode::Quota).count();
        let ordered: Vec<Resolved<'_, '_>> = order
            .iter()
            .map(|&i| (&plan.checks[i], resolved[i].clone()))
            .collect();
        let mut seen = vec![Seen::NotAsked; ordered.len()];
        let admitted = chain(&ordered, &mut seen, quotas, 0);
        // What the answer shows: a limit admitted then given back, its state
        // now (what a retry meets); one not asked, whether it would admit,
        // read without charging it.
        for ((check, store), seen) in ordered.iter().zip(seen.iter_mut()) {
            let now = || store_snapshot(store, &check.key);
            *seen = match *seen {
                Seen::Admitted(_) if !admitted => Seen::Admitted(now()),
                Seen::NotAsked => {
                    let now = now();
                    if u64::from(now.available) >= check.hits {
                        Seen::Admitted(now)
                    } else if u64::from(now.capacity) >= check.hits {
                        Seen::Refused(Rejection::new(
                            tollgate::Denied::RetryAfter(now.until_full),
                            now,
                        ))
                    } else {
                        Seen::Refused(never_fits(check.hits, now))
                    }
                }
                seen => seen,
            };
        }
        // Back in the plan's order.
        let mut in_order = vec![Seen::NotAsked; seen.len()];
        for (seen, &i) in seen.into_iter().zip(&order) {
            in_order[i] = seen;
        }
        Ok((in_order, admitted))
    }
}

/// `key`'s state in `store`; a rule of 0 requests holds nothing.
fn store_snapshot(store: &Option<Arc<Store>>, key: &str) -> Snapshot {
    match store {
        Some(store) => store.snapshot(key),
        None => Snapshot::new(0, 0, Duration::ZERO),
    }
}

/// Asks `checks[0]`, and — if it admits, or its refusal does not refuse
/// the request (shadow and quota mode) — the rest inside its decision, so
/// that a refusal further on gives its permits back
/// ([`tollgate::RateLimiter::try_acquire_n_then`]). `quotas` is the number
/// of quota-mode limits, `quota_refusals` how many of those refused so far.
/// Returns whether the request is admitted.
fn chain(
    checks: &[Resolved<'_, '_>],
    seen: &mut [Seen],
    quotas: usize,
    quota_refusals: usize,
) -> bool {
    let Some(((check, store), rest)) = checks.split_first() else {
        // Every enforced limit admitted; quota limits refuse only together.
        return quotas == 0 || quota_refusals < quotas;
    };
    let (first, later) = seen.split_first_mut().expect("one per check");
    let (store, n) = match (store, u32::try_from(check.hits)) {
        (Some(store), Ok(n)) => (store, n),
        // A rule of 0 requests, or more hits than any limit holds.
        _ => {
            *first = Seen::Refused(never_fits(check.hits, store_snapshot(store, &check.key)));
            return after_refusal(check.mode, rest, later, quotas, quota_refusals);
        }
    };
    if n == 0 {
        // No hits: the state is read, not charged.
        *first = Seen::Admitted(store.snapshot(&check.key));
        return chain(rest, later, quotas, quota_refusals);
    }
    let mut admitted = false;
    store.decide_then(&check.key, n, &mut |answer| match answer {
        Ok(snapshot) => {
            *first = Seen::Admitted(snapshot);
            admitted = chain(rest, later, quotas, quota_refusals);
            admitted
        }
        Err(rejection) => {
            *first = Seen::Refused(rejection);
            admitted = after_refusal(check.mode, rest, later, quotas, quota_refusals);
            false
        }
    });
    admitted
}

/// What is left of the request after a limit in `mode` refused it.
fn after_refusal(
    mode: Mode,
    rest: &[Resolved<'_, '_>],
    later: &mut [Seen],
    quotas: usize,
    quota_refusals: usize,
) -> bool {
    match mode {
        Mode::Enforced => false,
        Mode::Shadow => chain(rest, later, quotas, quota_refusals),
        Mode::Quota => chain(rest, later, quotas, quota_refusals + 1),
    }
}
