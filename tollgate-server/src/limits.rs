//! The memory backend: one keyed limiter per configured rule, each key of it
//! one descriptor value's state, decided in this process without a lock.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tollgate::keyed::{BucketConfig, Carry, Keyed, SlidingWindowConfig, WindowConfig};
use tollgate::{
    ConfigError, FixedWindow, LogConfig, Rate, Rejection, SlidingLog, SlidingWindow, Snapshot,
    TokenBucket,
};

use crate::config::{Algorithm, RuleId};

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
    pub(crate) fn decide_then(
        &self,
        key: &str,
        n: u32,
        keep: &mut dyn FnMut(Result<Snapshot, Rejection>) -> bool,
    ) -> bool {
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
