//! Per-key limiters: one limit per user, IP, API key or tenant, in a
//! [`DashMap`], with memory that stays bounded by itself,
//! per-key quotas, combined limits and lock-free runtime reconfiguration.
//!
//! ```
//! use std::time::Duration;
//! use tollgate::keyed::{BucketConfig, Carry, Keyed};
//! use tollgate::{Denied, ManualClock, Rate, TokenBucket};
//!
//! let clock = ManualClock::new();
//! let per_user = Keyed::<String, TokenBucket<ManualClock>>::with_clock(
//!     BucketConfig::new(2, Rate::per_second(1)).unwrap(),
//!     clock.clone(),
//! );
//! assert!(per_user.try_acquire_n("alice", 2).is_ok());
//! assert_eq!(per_user.try_acquire("alice"), Err(Denied::RetryAfter(Duration::from_secs(1))));
//! assert!(per_user.try_acquire("bob").is_ok()); // every key has its own bucket
//!
//! // A bigger quota for one key, and a new default for everyone else, at runtime.
//! per_user.set_override("carol".to_string(), BucketConfig::new(100, Rate::per_second(50)).unwrap(), Carry::Proportional);
//! assert!(per_user.try_acquire_n("carol", 100).is_ok());
//! per_user.reconfigure(BucketConfig::new(4, Rate::per_second(2)).unwrap(), Carry::Proportional);
//! assert!(per_user.try_acquire_n("dave", 4).is_ok());
//!
//! // Keys that are full again take no memory: they are swept away as new keys
//! // arrive, and a key that comes back decides exactly as it would have.
//! clock.advance(Duration::from_secs(10));
//! assert_eq!(per_user.sweep(), 3);
//! assert!(per_user.is_empty());
//! ```
//!
//! # Design
//!
//! **One word per key.** A kind ([`Keyable`]) is split into a configuration
//! shared by all keys and a per-key state: for the token bucket and the fixed
//! window, the same single `AtomicU64` as the direct limiter, unpadded, in the
//! map's value. All keys share one clock origin (the keyed limiter's), so a
//! key's state is directly comparable with a fresh one. Bytes per key are the
//! key, 8 bytes and the hash table's overhead — as in governor's keyed limiter,
//! which stores the same word.
//!
//! **Fast path.** An existing key costs one `DashMap::get` (a shard read lock),
//! a clock read and a CAS: no allocation, no epoch pin. A key's state is created
//! on its first request, under the shard's write lock.
//!
//! **Eviction never changes a decision.** A state that is *fresh* — full, with
//! nothing left to refill: a token bucket whose theoretical arrival time has
//! passed, a window that counted nothing in the current window — decides now
//! and forever after exactly as a brand-new state does, so it can be dropped and
//! recreated on demand with no observable difference. Every insert sweeps a few
//! buckets of its shard's table (an incremental cursor, under the shard's write
//! lock) and drops the fresh states it finds: the work is O(1) per insert,
//! nothing runs in the background, and keys that stop being used disappear as
//! new ones arrive. Decision times never go below the time of the latest
//! eviction (a floor read on every request), so even a clock that steps
//! backwards cannot make an evicted key more generous than the state it
//! replaced. See [`evict`] for the details and the cap.
//!
//! **A hard cap.** At most [`max_keys`](Keyed::max_keys) keys (2^20 by default)
//! are kept. A new key arriving at the cap first tries to make room by sweeping
//! a larger part of its shard; if every key there is still in use, it is
//! decided by one shared *overflow* state with the default quota: new callers
//! share one limit while the map is full of active callers, existing keys are
//! unaffected, and memory does not grow. A flood of distinct keys therefore
//! costs at most `max_keys` entries.
//!
//! **Per-key quotas** ([`quota`]): overrides for particular keys, a default for
//! the rest. **Combined limits** ([`combined`]): a pair of kinds is a kind.
//! **Reconfiguration** ([`reconfig`]): the default, each override and a
//! [`Tunable`] direct limiter can be changed at runtime, lock-free, with a
//! [`Carry`] strategy for the current state.

pub mod combined;
pub mod evict;
mod kind;
mod kinds;
pub mod quota;
pub mod reconfig;

use std::borrow::Borrow;
use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hash};

use crossbeam_utils::CachePadded;
use dashmap::DashMap;

pub use kind::{Carry, Keyable};
#[doc(hidden)]
pub use kind::{Refusal, View};
#[doc(hidden)]
pub use kinds::{AtomicWord, LockedWord};
pub use kinds::{BucketConfig, WindowConfig};
pub use reconfig::Tunable;

use crate::clock::MonotonicClock;
use crate::error::Denied;
use crate::limiter::Snapshot;
use crate::sync::{AtomicU64, Ordering};
use crate::timeline::Timeline;
use evict::Sweeper;
use quota::Overrides;
use reconfig::{Record, Shared, decide, pin, read};

/// The default [`Keyed::max_keys`]: 2^20 keys (about 35 MB with `u64` keys and
/// token buckets).
pub const DEFAULT_MAX_KEYS: usize = 1 << 20;

/// A limiter per key, created on first use, evicted when indistinguishable
/// from a new one; see the [module docs](self).
///
/// `L` is the kind of limiter each key gets — [`TokenBucket`](crate::TokenBucket),
/// [`FixedWindow`](crate::FixedWindow), a locking twin, or a pair of kinds for
/// combined limits — and fixes the clock type. `S` is the map's hasher
/// (std's `RandomState` by default, resistant to hash flooding).
///
/// ```
/// use tollgate::keyed::{Keyed, WindowConfig};
/// use tollgate::{FixedWindow, Rate};
///
/// let per_ip = Keyed::<std::net::IpAddr, FixedWindow>::new(WindowConfig::new(Rate::per_minute(60)).unwrap());
/// let ip = "192.0.2.7".parse().unwrap();
/// assert!(per_ip.try_acquire(&ip).is_ok());
/// assert_eq!(per_ip.snapshot(&ip).available, 59);
/// ```
pub struct Keyed<K, L: Keyable, S = RandomState> {
    map: DashMap<K, L::State, S>,
    /// The default configuration. Requests on the map read it under a shard
    /// lock without pinning; see `reconfig` for why that is safe.
    default: Shared<Record<L::Config>>,
    overrides: Overrides<K, L, S>,
    /// No decision uses a time earlier than the latest eviction's.
    floor: CachePadded<AtomicU64>,
    timeline: Timeline<L::Clock>,
    /// Shared by new keys while the map is at its cap; padded, as it is
    /// written only then.
    overflow: CachePadded<L::State>,
    sweeper: Sweeper,
}

impl<K, L> Keyed<K, L>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
    L: Keyable<Clock = MonotonicClock>,
{
    /// Every key limited by `config`, on the default [`MonotonicClock`], with
    /// at most [`DEFAULT_MAX_KEYS`] keys.
    ///
    /// ```
    /// use tollgate::keyed::{BucketConfig, Keyed};
    /// use tollgate::{Rate, TokenBucket};
    ///
    /// let per_key = Keyed::<u64, TokenBucket>::new(BucketConfig::new(10, Rate::per_second(5)).unwrap());
    /// assert!(per_key.try_acquire(&7).is_ok());
    /// ```
    pub fn new(config: L::Config) -> Self {
        Self::with_clock(config, MonotonicClock::new())
    }
}

impl<K, L> Keyed<K, L>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
    L: Keyable,
{
    /// As [`Keyed::new`], reading `clock`.
    ///
    /// ```
    /// use tollgate::keyed::{BucketConfig, Keyed};
    /// use tollgate::{CachedClock, Rate, TokenBucket};
    ///
    /// let cfg = BucketConfig::new(10, Rate::per_second(5)).unwrap();
    /// let per_key = Keyed::<u64, TokenBucket<CachedClock>>::with_clock(cfg, CachedClock::new());
    /// assert!(per_key.try_acquire(&7).is_ok());
    /// ```
    pub fn with_clock(config: L::Config, clock: L::Clock) -> Self {
        Self::with_clock_and_hasher(config, clock, RandomState::new())
    }
}

impl<K, L, S> Keyed<K, L, S>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
    L: Keyable,
    S: BuildHasher + Clone + Send + Sync + 'static,
{
    /// As [`Keyed::with_clock`], hashing keys with `hasher`.
    ///
    /// ```
    /// use std::hash::BuildHasherDefault;
    /// use std::collections::hash_map::DefaultHasher;
    /// use tollgate::keyed::{BucketConfig, Keyed};
    /// use tollgate::{MonotonicClock, Rate, TokenBucket};
    ///
    /// let cfg = BucketConfig::new(10, Rate::per_second(5)).unwrap();
    /// let per_key = Keyed::<u64, TokenBucket, _>::with_clock_and_hasher(
    ///     cfg, MonotonicClock::new(), BuildHasherDefault::<DefaultHasher>::default());
    /// assert!(per_key.try_acquire(&7).is_ok());
    /// ```
    pub fn with_clock_and_hasher(config: L::Config, clock: L::Clock, hasher: S) -> Self {
        let map = DashMap::with_hasher(hasher.clone());
        let shards = map.shards().len();
        Keyed {
            map,
            default: Shared::new(Record::first(config)),
            overrides: Overrides::new(hasher),
            floor: CachePadded::new(AtomicU64::new(0)),
            timeline: Timeline::new(clock),
            overflow: CachePadded::new(L::fresh(0)),
            sweeper: Sweeper::new(shards, DEFAULT_MAX_KEYS),
        }
    }

    /// Sets the most keys kept at once (at least 1). Keys with an override do
    /// not count: they are as many as you set.
    ///
    /// ```
    /// use tollgate::keyed::{BucketConfig, Keyed};
    /// use tollgate::{Rate, TokenBucket};
    ///
    /// let cfg = BucketConfig::new(10, Rate::per_second(5)).unwrap();
    /// let small = Keyed::<u64, TokenBucket>::new(cfg).with_max_keys(1_000);
    /// assert_eq!(small.max_keys(), 1_000);
    /// ```
    pub fn with_max_keys(mut self, max_keys: usize) -> Self {
        self.sweeper.set_max_keys(max_keys.max(1));
        self
    }

    /// The most keys kept at once.
    ///
    /// ```
    /// # use tollgate::keyed::{BucketConfig, Keyed, DEFAULT_MAX_KEYS};
    /// # use tollgate::{Rate, TokenBucket};
    /// let per_key = Keyed::<u64, TokenBucket>::new(BucketConfig::new(1, Rate::per_second(1)).unwrap());
    /// assert_eq!(per_key.max_keys(), DEFAULT_MAX_KEYS);
    /// ```
    pub fn max_keys(&self) -> usize {
        self.sweeper.max_keys()
    }

    /// The time decisions are made at: the clock, never below the latest
    /// eviction's time.
    #[inline]
    fn now(&self) -> u64 {
        // Relaxed: the floor is written under a shard's write lock and read
        // after taking that shard's lock, which orders the two.
        self.timeline.now().max(self.floor.load(Ordering::Relaxed))
    }

    /// Asks for one permit for `key`.
    ///
    /// ```
    /// use tollgate::keyed::{Keyed, WindowConfig};
    /// use tollgate::{FixedWindow, Rate};
    ///
    /// let per_key = Keyed::<String, FixedWindow>::new(WindowConfig::new(Rate::per_hour(1)).unwrap());
    /// assert!(per_key.try_acquire("k").is_ok());
    /// assert!(per_key.try_acquire("k").is_err());
    /// ```
    #[inline]
    pub fn try_acquire<Q>(&self, key: &Q) -> Result<(), Denied>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.try_acquire_n(key, 1)
    }

    /// Asks for `n` permits for `key`, all or none, with the same answers as
    /// [`RateLimiter::try_acquire_n`](crate::RateLimiter::try_acquire_n). A
    /// request that can never succeed (`n = 0`, `n` above the capacity) never
    /// creates a key.
    ///
    /// ```
    /// use tollgate::keyed::{BucketConfig, Keyed};
    /// use tollgate::{Denied, Rate, TokenBucket};
    ///
    /// let per_key = Keyed::<String, TokenBucket>::new(BucketConfig::new(5, Rate::per_second(5)).unwrap());
    /// assert!(per_key.try_acquire_n("k", 5).is_ok());
    /// assert_eq!(per_key.try_acquire_n("other", 6), Err(Denied::ExceedsCapacity { requested: 6, capacity: 5 }));
    /// assert_eq!(per_key.len(), 1);
    /// ```
    #[inline]
    pub fn try_acquire_n<Q>(&self, key: &Q, n: u32) -> Result<(), Denied>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        if self.overrides.any() {
            if let Some(result) = self.overrides.try_acquire_n(key, n, || self.now()) {
                return result;
            }
        }
        if let Some(state) = self.map.get(key) {
            let now = self.now();
            // SAFETY: `state` holds a read lock on its shard until it drops.
            return unsafe {
                decide(&self.default, |view| {
                    L::acquire(view, &state, now, n).map(drop)
                })
            };
        }
        self.acquire_new(key, n)
    }

    /// What a request for `key` could get now, without consuming anything. A
    /// key not in the map reads as fresh.
    ///
    /// ```
    /// use tollgate::keyed::{BucketConfig, Keyed};
    /// use tollgate::{Rate, TokenBucket};
    ///
    /// let per_key = Keyed::<u32, TokenBucket>::new(BucketConfig::new(5, Rate::per_hour(5)).unwrap());
    /// per_key.try_acquire_n(&1, 3).unwrap();
    /// assert_eq!(per_key.snapshot(&1).available, 2);
    /// assert_eq!(per_key.snapshot(&2).available, 5);
    /// ```
    pub fn snapshot<Q>(&self, key: &Q) -> Snapshot
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        if self.overrides.any() {
            if let Some(snap) = self.overrides.snapshot(key, || self.now()) {
                return snap;
            }
        }
        if let Some(state) = self.map.get(key) {
            let now = self.now();
            // SAFETY: `state` holds a read lock on its shard until it drops.
            return unsafe { read(&self.default, |view| L::snapshot(view, &state, now)) };
        }
        let _guard = pin();
        let now = self.now();
        // SAFETY: pinned for the whole call.
        unsafe {
            read(&self.default, |view| {
                L::snapshot(view, &L::fresh(view.tag), now)
            })
        }
    }

    /// The default configuration: the one for keys without an override.
    ///
    /// ```
    /// use tollgate::keyed::{BucketConfig, Keyed};
    /// use tollgate::{Rate, TokenBucket};
    ///
    /// let cfg = BucketConfig::new(5, Rate::per_second(5)).unwrap();
    /// assert_eq!(Keyed::<u32, TokenBucket>::new(cfg).config(), cfg);
    /// ```
    pub fn config(&self) -> L::Config {
        let guard = pin();
        self.default.load(&guard).current.clone()
    }

    /// Replaces the default configuration, carrying every key's state over as
    /// `carry` says. Requests never wait for it: they read the configuration
    /// without a lock, and a key not yet carried over is carried over by the
    /// first request that touches it. The call itself visits every key (under
    /// each shard's write lock in turn) before it returns, so it costs
    /// O(keys); a racing call is helped to finish, then applied after it.
    ///
    /// ```
    /// use tollgate::keyed::{Carry, Keyed, WindowConfig};
    /// use tollgate::{FixedWindow, Rate};
    ///
    /// let per_key = Keyed::<u32, FixedWindow>::new(WindowConfig::new(Rate::per_hour(1)).unwrap());
    /// per_key.try_acquire(&1).unwrap();
    /// per_key.reconfigure(WindowConfig::new(Rate::per_hour(2)).unwrap(), Carry::Additive);
    /// assert!(per_key.try_acquire(&1).is_ok());
    /// assert!(per_key.try_acquire(&1).is_err());
    /// ```
    pub fn reconfigure(&self, config: L::Config, carry: Carry) {
        let guard = pin();
        let mut pending = config;
        loop {
            let record = self.default.load(&guard);
            if !record.is_complete() {
                // A racing reconfiguration is still carrying keys over: finish
                // it, or a key could skip a configuration (see `reconfig`).
                self.settle_all(record);
                continue;
            }
            match self
                .default
                .compare_exchange(record, record.next(pending, carry), &guard)
            {
                Ok(published) => {
                    self.settle_all(published);
                    // SAFETY: replaced by us. `settle_all` took every shard's
                    // write lock after the replacement (or found a newer record,
                    // whose publisher saw ours complete, i.e. every shard
                    // visited): no unpinned reader still holds `record`, and
                    // pinned ones are what `retire` waits for.
                    unsafe { self.default.retire(record, &guard) };
                    return;
                }
                Err(next) => pending = next.current,
            }
        }
    }

    /// Resident keys: those with a state in the map (overrides not counted).
    ///
    /// ```
    /// # use tollgate::keyed::{BucketConfig, Keyed};
    /// # use tollgate::{Rate, TokenBucket};
    /// let per_key = Keyed::<u32, TokenBucket>::new(BucketConfig::new(5, Rate::per_second(5)).unwrap());
    /// per_key.try_acquire(&1).unwrap();
    /// assert_eq!(per_key.len(), 1);
    /// ```
    pub fn len(&self) -> usize {
        self.sweeper.len()
    }

    /// Whether no key is resident.
    ///
    /// ```
    /// # use tollgate::keyed::{BucketConfig, Keyed};
    /// # use tollgate::{Rate, TokenBucket};
    /// assert!(Keyed::<u32, TokenBucket>::new(BucketConfig::new(5, Rate::per_second(5)).unwrap()).is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The clock the limiter reads.
    ///
    /// ```
    /// use tollgate::keyed::{BucketConfig, Keyed};
    /// use tollgate::{Clock, ManualClock, Rate, TokenBucket};
    ///
    /// let clock = ManualClock::new();
    /// let cfg = BucketConfig::new(5, Rate::per_second(5)).unwrap();
    /// let per_key = Keyed::<u32, TokenBucket<ManualClock>>::with_clock(cfg, clock.clone());
    /// clock.set(3);
    /// assert_eq!(per_key.clock().now(), 3);
    /// ```
    pub fn clock(&self) -> &L::Clock {
        self.timeline.clock()
    }

    /// Carries every state over to `record`, one shard at a time under its
    /// write lock, then marks the record complete; stops early if `record` is
    /// replaced meanwhile (its successor's publisher saw it complete).
    fn settle_all(&self, record: &Record<L::Config>) {
        let still_current = || self.default.is_current(record);
        let view = record.view(&still_current);
        for shard in self.map.shards() {
            let table = shard.write();
            if !still_current() {
                return;
            }
            let now = self.now();
            // SAFETY: indices below `buckets()`, full buckets only, under the
            // write lock, and nothing is erased.
            unsafe {
                for index in 0..table.buckets() {
                    if table.is_bucket_full(index) {
                        L::settle(&view, table.bucket(index).as_ref().1.get(), now);
                    }
                }
            }
        }
        if L::settle(&view, &self.overflow, self.now()) {
            record.mark_complete();
        }
    }
}

impl<K, L: Keyable, S> fmt::Debug for Keyed<K, L, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let guard = pin();
        f.debug_struct("Keyed")
            .field("config", &self.default.load(&guard).current)
            .field("len", &self.sweeper.len())
            .field("max_keys", &self.sweeper.max_keys())
            .finish_non_exhaustive()
    }
}
