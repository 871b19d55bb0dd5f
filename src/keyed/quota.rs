//! Per-key quotas: overrides for particular keys, the default for the rest.
//!
//! The user-facing documentation is on [`Keyed::set_override`](crate::keyed::Keyed::set_override).

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hash};

use super::Keyed;
use crate::kind::answer::Answer;
use crate::kind::reconfig::Slot;
use crate::kind::{Carry, Keyable};
use crate::limiter::Snapshot;
use crate::sync::{Arc, AtomicU64, Guard, Ordering, Shared, pin};

type Table<K, L, S> = HashMap<K, Arc<Slot<L>>, S>;

/// The override table and whether it is empty.
pub(crate) struct Overrides<K, L: Keyable, S> {
    table: Shared<Table<K, L, S>>,
    /// Non-zero while the table is not empty: the fast path's only look.
    any: AtomicU64,
}

impl<K, L, S> Overrides<K, L, S>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
    L: Keyable,
    S: BuildHasher + Clone + Send + Sync + 'static,
{
    pub(crate) fn new(hasher: S) -> Self {
        Overrides {
            table: Shared::new(HashMap::with_hasher(hasher)),
            any: AtomicU64::new(0),
        }
    }

    #[inline]
    pub(crate) fn any(&self) -> bool {
        // Relaxed: a request that misses a new override is one that started
        // before it was set; the table itself is read with Acquire.
        self.any.load(Ordering::Relaxed) != 0
    }

    /// The override's decision, if `key` has one.
    pub(crate) fn answer<Q, A: Answer<L>>(
        &self,
        key: &Q,
        n: u32,
        answer: A,
        now: impl FnOnce() -> u64,
    ) -> Option<Result<A::Admitted, A::Denied>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let guard = pin();
        let slot = self.table.load(&guard).get(key)?;
        Some(slot.answer(now(), n, answer))
    }

    pub(crate) fn snapshot<Q>(&self, key: &Q, now: impl FnOnce() -> u64) -> Option<Snapshot>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let guard = pin();
        let slot = self.table.load(&guard).get(key)?;
        Some(slot.snapshot(now()))
    }

    /// Which override table is in force, as an address: a table replaced
    /// after `guard` was pinned is not freed, so its address is not reused,
    /// while the guard lives (`keyed::for_key` compares two of them).
    pub(crate) fn table_id(&self, guard: &Guard) -> usize {
        self.table.load(guard) as *const Table<K, L, S> as usize
    }

    pub(crate) fn config<Q>(&self, key: &Q) -> Option<L::Config>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let guard = pin();
        self.table.load(&guard).get(key).map(|slot| slot.config())
    }

    /// Sets `key`'s override; `true` if the key had none before.
    fn set(&self, key: K, config: L::Config, carry: Carry, now: u64) -> bool {
        let guard = pin();
        let added = self.edit(&guard, |table| {
            if let Some(slot) = table.get(&key) {
                return Err(slot);
            }
            let mut next = table.clone();
            next.insert(key.clone(), Arc::new(Slot::new(config.clone())));
            Ok(next)
        });
        match added {
            Ok(_) => {
                // Relaxed: see `any`.
                self.any.store(1, Ordering::Relaxed);
                true
            }
            Err(slot) => {
                slot.reconfigure(config, carry, now);
                false
            }
        }
    }

    /// Removes `key`'s override; `true` if it had one.
    fn remove<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let guard = pin();
        let removed = self.edit(&guard, |table| {
            if !table.contains_key(key) {
                return Err(());
            }
            let mut next = table.clone();
            next.remove(key);
            Ok(next)
        });
        let Ok(published) = removed else {
            return false;
        };
        if published.is_empty() {
            // Relaxed: see `any`. A racing `set` may store 1 before this 0;
            // the flag is then re-derived below.
            self.any.store(0, Ordering::Relaxed);
            if !self.table.load(&guard).is_empty() {
                self.any.store(1, Ordering::Relaxed);
            }
        }
        true
    }

    /// Replaces the table in force by `edit`'s copy of it, deciding again on
    /// the newer table when another edit came first (the epoch pointers' one
    /// loop, `Shared::update`); returns the table published, or `edit`'s
    /// refusal.
    fn edit<'g, R>(
        &self,
        guard: &'g Guard,
        edit: impl FnMut(&'g Table<K, L, S>) -> Result<Table<K, L, S>, R>,
    ) -> Result<&'g Table<K, L, S>, R> {
        let (table, published) = self.table.update(guard, edit)?;
        // SAFETY: replaced by us; every reader of the table pins.
        unsafe { self.table.retire(table, guard) };
        Ok(published)
    }
}

impl<K, L, S> Keyed<K, L, S>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
    L: Keyable,
    S: BuildHasher + Clone + Send + Sync + 'static,
{
    /// Gives `key` its own quota. A key without an override starts full under
    /// `config` (its state under the default is dropped); a key that already
    /// has one is reconfigured in place with `carry`. See [`quota`](crate::keyed::Keyed::set_override).
    ///
    /// ```
    /// use tollgate::keyed::{BucketConfig, Carry, Keyed};
    /// use tollgate::{Rate, TokenBucket};
    ///
    /// let free = BucketConfig::new(10, Rate::per_minute(10)).unwrap();
    /// let paid = BucketConfig::new(1_000, Rate::per_minute(1_000)).unwrap();
    /// let per_tenant = Keyed::<String, TokenBucket>::new(free);
    /// per_tenant.set_override("acme".to_string(), paid, Carry::Proportional);
    /// assert!(per_tenant.try_acquire_n("acme", 500).is_ok());
    /// assert!(per_tenant.try_acquire_n("other", 500).is_err());
    /// assert_eq!(per_tenant.override_of("acme"), Some(paid));
    /// ```
    ///
    /// Per-key quotas: overrides for particular keys, the default for the rest.
    ///
    /// The overrides are an immutable hash map from key to a reconfigurable slot
    /// (its own configuration record and state), replaced as a whole by
    /// compare-and-swap when a key gains or loses its override, and read by
    /// requests under an epoch pin. While no override exists, requests do not look
    /// at it at all (one relaxed load of a flag); with overrides, every request
    /// pays one pin and one lookup in that map before the main one.
    ///
    /// * Setting an override for a key **without** one starts it full under its own
    ///   quota, and drops the key's state under the default, so that removing the
    ///   override later starts it afresh under the default too.
    /// * Setting an override for a key that already has one reconfigures it in
    ///   place, with the given [`Carry`] (as [`Keyed::reconfigure`] does for the
    ///   default).
    /// * Overridden keys are not evicted and do not count towards the cap: they are
    ///   exactly as many as the caller sets.
    /// * A request already inside its call when an override is set or removed may
    ///   still be decided by the quota it looked up first (and may recreate a
    ///   default state for the key, which is then ignored until the override goes
    ///   and evicted once fresh).
    pub fn set_override(&self, key: K, config: L::Config, carry: Carry) {
        if self.overrides.set(key.clone(), config, carry, self.now()) {
            self.forget(&key);
        }
    }

    /// Removes `key`'s override; it starts afresh under the default. Returns
    /// whether it had one.
    ///
    /// ```
    /// use tollgate::keyed::{BucketConfig, Carry, Keyed};
    /// use tollgate::{Rate, TokenBucket};
    ///
    /// let cfg = BucketConfig::new(1, Rate::per_hour(1)).unwrap();
    /// let per_key = Keyed::<u32, TokenBucket>::new(cfg);
    /// per_key.set_override(7, BucketConfig::new(2, Rate::per_hour(2)).unwrap(), Carry::Proportional);
    /// assert!(per_key.try_acquire_n(&7, 2).is_ok());
    /// assert!(per_key.remove_override(&7));
    /// assert!(per_key.try_acquire_n(&7, 2).is_err()); // back to a capacity of 1
    /// assert!(!per_key.remove_override(&7));
    /// ```
    pub fn remove_override<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let removed = self.overrides.remove(key);
        if removed {
            self.forget(key);
        }
        removed
    }

    /// `key`'s own quota, if it has one.
    ///
    /// ```
    /// use tollgate::keyed::{BucketConfig, Keyed};
    /// use tollgate::{Rate, TokenBucket};
    ///
    /// let per_key = Keyed::<u32, TokenBucket>::new(BucketConfig::new(1, Rate::per_hour(1)).unwrap());
    /// assert_eq!(per_key.override_of(&7), None);
    /// ```
    pub fn override_of<Q>(&self, key: &Q) -> Option<L::Config>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        if self.overrides.any() {
            self.overrides.config(key)
        } else {
            None
        }
    }

    /// Drops `key`'s state under the default quota, if any.
    fn forget<Q>(&self, key: &Q)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        if self.map.remove(key).is_some() {
            self.sweeper.release(1);
        }
    }
}
