//! Per-key limiters: one limit per user, IP, API key or tenant, in a sharded
//! map whose lookups write no shared memory, with memory that stays bounded
//! by itself, per-key quotas, combined limits and lock-free runtime
//! reconfiguration.
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
//! **A small state per key.** A kind ([`Keyable`]) is split into a configuration
//! shared by all keys and a per-key state: for the token bucket, the fixed
//! window and the leaky bucket meter, the same single `AtomicU64` as the
//! direct limiter (for the shaper and warm-up, their 128-bit word; for the
//! sliding log, the direct log's lock-free ring, see [`LogConfig`](crate::LogConfig); for the
//! sliding window, `S` counts, see [`SlidingWindowConfig`]), unpadded,
//! in the
//! map's value. All keys share one clock origin (the keyed limiter's), so a
//! key's state is directly comparable with a fresh one. Bytes per key are the
//! key, 8 bytes and the hash table's overhead — as in governor's keyed limiter,
//! which stores the same word.
//!
//! **Fast path.** An existing key costs one lookup, a clock read and a CAS:
//! no allocation, no epoch pin. The map's shards are hashbrown tables under a
//! reader-biased lock: a lookup claims a slot on its thread's own cache line
//! rather than writing the shard's lock word, which every thread reading that
//! shard would share (see `map` for the lock, its state table and its loom
//! models). A key's state is created on its first request, under the shard's
//! write lock.
//!
//! **A time floor.** The keyed limiter never decides at a time below its
//! *floor*: a request whose clock reading is older (a stale reading, or a
//! clock that stepped back) is decided as if time had stood still at the
//! floor, and its retry-after is measured from its reading. The floor moves
//! up to a request's reading once that is [`FLOOR_STEP`] (≈ 66 µs) past it —
//! so it is written at most once per step, not per request — and to the
//! reading of every explicit [`sweep`](Keyed::sweep). It moves for every key
//! alike, and never because of what was evicted.
//!
//! **Eviction never changes a decision.** A state that is *fresh* at the
//! floor — full, with nothing left to refill: a token bucket whose theoretical
//! arrival time is not after the floor, a window that counted nothing in the
//! floor's window — decides at every time a request can still be decided at
//! exactly as a brand-new state does, a backwards clock included, so it can be
//! dropped and recreated on demand with no observable difference: every
//! decision and retry-after is the same whether the key was evicted or kept.
//! Every insert sweeps a few buckets of its shard's table (an incremental
//! cursor, under the shard's write lock) and drops the *idle* states it
//! finds — fresh, and fresh already [`IDLE_BEFORE_EVICTION`] (about a second)
//! earlier: the work is O(1) per insert, nothing runs in the background,
//! keys that stop being used disappear as new ones arrive, and a key in use
//! at least once a second is never swept, however generous its limit. See
//! [`Keyed::sweep`] for the details and the cap.
//!
//! **A hard cap.** At most [`max_keys`](Keyed::max_keys) keys (2^20 by default)
//! are kept. A new key arriving at the cap first tries to make room by sweeping
//! a larger part of its shard; if every key there is still in use, it is
//! decided by one shared *overflow* state with the default quota: new callers
//! share one limit while the map is full of active callers, existing keys are
//! unaffected, and memory does not grow. A flood of distinct keys therefore
//! costs at most `max_keys` entries. **What holds at the cap: every key keeps
//! its own bound** — over all its admissions, by its own state or by the
//! overflow — because a key inserted while the overflow state is not fresh
//! starts from a copy of it (the overflow holds every key's overflow
//! admissions, and more): while the cap is being hit, new and returning keys
//! may be stricter than their own history requires, never looser. When the cap
//! has not been hit for a capacity's worth of time, the overflow is fresh and
//! new keys start exactly fresh.
//!
//! **Per-key quotas** ([`Keyed::set_override`]): overrides for particular keys, a default for
//! the rest. **Combined limits** ([`combined`]): a pair of kinds is a kind.
//! **Reconfiguration** ([`Tunable`], [`Keyed::reconfigure`]): the default, each override and a
//! [`Tunable`] direct limiter can be changed at runtime, lock-free, with a
//! [`Carry`] strategy for the current state.

mod adaptive;
mod evict;
mod for_key;
mod hasher;
mod map;
mod quota;
mod waiting;

use std::borrow::Borrow;
use std::convert::Infallible;
use std::fmt;
use std::hash::{BuildHasher, Hash};

use crossbeam_utils::CachePadded;

pub use adaptive::{DEFAULT_IDLE, DEFAULT_MAX_ADAPTIVE_KEYS, KeyedAdaptiveLimit, TOUCH_STEP};
pub use evict::IDLE_BEFORE_EVICTION;
pub use for_key::{ForKey, KeyedReceipt};
pub use hasher::{KeyHash, KeyHasher};
// The kinds and their reconfiguration live in `crate::kind`; their public
// paths are these. The types a kind's sealed contract names (its state
// cell, its views) are public in that private module and nameable nowhere.
pub use crate::kind::SlidingWindowConfig;
pub use crate::kind::combined;
pub use crate::kind::{BucketConfig, CapacityRate, MeterConfig, WindowConfig};
pub use crate::kind::{Carry, Keyable};
pub use crate::kind::{ShaperConfig, Tunable, WarmUpConfig};

use crate::clock::MonotonicClock;
use crate::error::Denied;
use crate::kind::answer::{Answer, Plain, Reported, ask, later_snapshot};
use crate::kind::reconfig::{Record, read};
use crate::limiter::{Rejection, Snapshot};
use crate::sync::{AtomicU64, Ordering, Shared, pin};
use crate::timeline::Timeline;
use evict::Sweeper;
use map::Map;
use quota::Overrides;

/// The default [`Keyed::max_keys`]: 2^20 keys (about 35 MB with `u64` keys and
/// token buckets).
pub const DEFAULT_MAX_KEYS: usize = 1 << 20;

/// How far, in nanoseconds, a clock reading must pass a [`Keyed`] limiter's
/// *time floor* before the request that took it moves the floor up to it
/// (2^16 ns, about 66 µs). See the [module docs](self): no decision uses a
/// time below the floor, and eviction judges freshness at the floor, so a
/// clock that steps backwards finds time standing still at the floor for
/// every key alike, evicted or not. The step only bounds how often the floor
/// (one shared cache line) is written: once per step at most, rather than on
/// every request.
///
/// ```
/// use std::time::Duration;
/// use tollgate::keyed::{BucketConfig, Keyed, FLOOR_STEP};
/// use tollgate::{Denied, ManualClock, Rate, TokenBucket};
///
/// let clock = ManualClock::new();
/// let cfg = BucketConfig::new(1, Rate::per_second(1)).unwrap();
/// let per_key = Keyed::<u8, TokenBucket<ManualClock>>::with_clock(cfg, clock.clone());
/// clock.set(FLOOR_STEP + 1_000_000_000);
/// per_key.try_acquire(&1).unwrap(); // moves the floor to this reading
/// clock.set(0); // the clock steps back: time stands still at the floor
/// assert_eq!(
///     per_key.try_acquire(&1),
///     // A retry-after is measured from the reading.
///     Err(Denied::RetryAfter(Duration::from_nanos(FLOOR_STEP + 2_000_000_000)))
/// );
/// ```
pub const FLOOR_STEP: u64 = 1 << 16;

/// A limiter per key, created on first use, evicted when indistinguishable
/// from a new one; see the [module docs](self).
///
/// `L` is the kind of limiter each key gets — [`TokenBucket`](crate::TokenBucket),
/// [`FixedWindow`](crate::FixedWindow), the [`LeakyBucket`](crate::LeakyBucket)
/// meter, the [`Shaper`](crate::Shaper), [`WarmUp`](crate::WarmUp), the exact
/// [`SlidingLog`](crate::SlidingLog), a locking twin, or a pair of kinds for
/// combined limits — and fixes the clock type. `S` is the map's hasher
/// ([`KeyHasher`] by default: aHash with per-map random seeds, resistant to
/// hash flooding).
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
pub struct Keyed<K, L: Keyable, S = KeyHasher> {
    map: Map<K, L::State, S>,
    /// The default configuration. Requests on the map read it under a shard
    /// lock without pinning; see `reconfig` for why that is safe.
    default: Shared<Record<L::Config>>,
    overrides: Overrides<K, L, S>,
    /// The time floor: no decision uses an earlier time, and eviction judges
    /// freshness at it. Raised by requests whose reading is at least
    /// [`FLOOR_STEP`] past it and by [`sweep`](Keyed::sweep), never by the
    /// sweeps inserts make, so it does not depend on what was evicted.
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
        Self::with_clock_and_hasher(config, clock, KeyHasher::new())
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
        let map = Map::with_hasher(hasher.clone());
        let shards = map.shard_count();
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

    /// Reads the clock for one request, moving the floor up to the reading if
    /// it is [`FLOOR_STEP`] or more past it.
    #[inline]
    fn read_clock(&self) -> u64 {
        let reading = self.timeline.now();
        // Relaxed: the floor orders no other memory. A request that misses a
        // racing raise decides at its own reading or the older floor, as it
        // would had it run first; what eviction needs (below) comes from the
        // shard locks.
        if reading >= self.floor.load(Ordering::Relaxed) + FLOOR_STEP {
            self.floor.fetch_max(reading, Ordering::Relaxed);
        }
        reading
    }

    /// The time a request with clock reading `reading` is decided at: never
    /// below the floor. Called after taking the lock on the key's shard: a
    /// sweep that evicted the key read the floor under that shard's write
    /// lock, so this load sees that value or a later one (the floor only
    /// grows), and the recreated key never decides before the time its
    /// predecessor was judged fresh at.
    #[inline]
    fn decision_time(&self, reading: u64) -> u64 {
        // Relaxed: ordered by the shard lock, see above.
        reading.max(self.floor.load(Ordering::Relaxed))
    }

    /// A decision time for work that is not a request (settling states,
    /// setting overrides).
    fn now(&self) -> u64 {
        self.decision_time(self.read_clock())
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
        self.answer(key, n, Plain)
    }

    /// Asks for one permit for `key` and reports the key's state after the
    /// decision; see [`try_acquire_n_with_snapshot`](Keyed::try_acquire_n_with_snapshot).
    ///
    /// ```
    /// use tollgate::keyed::{Keyed, WindowConfig};
    /// use tollgate::{FixedWindow, Rate};
    ///
    /// let per_key = Keyed::<String, FixedWindow>::new(WindowConfig::new(Rate::per_hour(2)).unwrap());
    /// assert_eq!(per_key.try_acquire_with_snapshot("k").unwrap().available, 1);
    /// ```
    #[inline]
    pub fn try_acquire_with_snapshot<Q>(&self, key: &Q) -> Result<Snapshot, Rejection>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.try_acquire_n_with_snapshot(key, 1)
    }

    /// Asks for `n` permits for `key`, as [`try_acquire_n`](Keyed::try_acquire_n)
    /// does, and returns with the decision the key's state after it (as
    /// [`RateLimiter::try_acquire_n_with_snapshot`](crate::RateLimiter::try_acquire_n_with_snapshot)
    /// does): one lookup of the key, not a decision and then a
    /// [`snapshot`](Keyed::snapshot). An admission's snapshot is computed from
    /// the word its compare-and-swap wrote (for a pair, each part's word; the
    /// pair reports the part that binds first, with that part's own figures,
    /// as [`AllOf`](crate::AllOf) does); a denial writes nothing, and its
    /// snapshot is of the key's state read right after it under the same
    /// lookup.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::keyed::{BucketConfig, Keyed};
    /// use tollgate::{Denied, ManualClock, Rate, TokenBucket};
    ///
    /// let cfg = BucketConfig::new(5, Rate::per_second(5)).unwrap();
    /// let per_ip = Keyed::<u32, TokenBucket<ManualClock>>::with_clock(cfg, ManualClock::new());
    /// let snap = per_ip.try_acquire_n_with_snapshot(&7, 4).unwrap();
    /// assert_eq!((snap.available, snap.capacity), (1, 5));
    /// assert_eq!(snap.until_full, Duration::from_millis(800));
    /// let rejection = per_ip.try_acquire_n_with_snapshot(&7, 2).unwrap_err();
    /// assert_eq!(rejection.denied, Denied::RetryAfter(Duration::from_millis(200)));
    /// assert_eq!(rejection.snapshot.available, 1);
    /// ```
    #[inline]
    pub fn try_acquire_n_with_snapshot<Q>(&self, key: &Q, n: u32) -> Result<Snapshot, Rejection>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.answer(key, n, Reported)
    }

    /// The one body of both decisions, generic over the answer's shape.
    #[inline]
    fn answer<Q, A: Answer<L>>(&self, key: &Q, n: u32, answer: A) -> Result<A::Admitted, A::Denied>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let reading = self.read_clock();
        if self.overrides.any() {
            let now = self.decision_time(reading);
            if let Some(result) = self.overrides.answer(key, n, answer, || now) {
                return answer.measured_from(reading, now, result);
            }
        }
        if let Some(state) = self.map.get(key) {
            let now = self.decision_time(reading);
            // SAFETY: `state` holds its shard for reading (a reader slot or the read lock) until it drops.
            let result =
                unsafe { read(&self.default, |view| ask(answer, view, &state, now, n).ok()) };
            return answer.measured_from(reading, now, result);
        }
        self.acquire_new(key, n, reading, answer)
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
        let reading = self.read_clock();
        if self.overrides.any() {
            let now = self.decision_time(reading);
            if let Some(snap) = self.overrides.snapshot(key, || now) {
                return later_snapshot(snap, reading, now);
            }
        }
        if let Some(state) = self.map.get(key) {
            let now = self.decision_time(reading);
            // SAFETY: `state` holds its shard for reading (a reader slot or the read lock) until it drops.
            let snap = unsafe { read(&self.default, |view| L::snapshot(view, &state, now)) };
            return later_snapshot(snap, reading, now);
        }
        let _guard = pin();
        let now = self.decision_time(reading);
        // SAFETY: pinned for the whole call.
        let snap = unsafe {
            read(&self.default, |view| {
                // What the key would start with (see `evict::Keyed::new_state`).
                if self.overflow_is_fresh(view)? {
                    L::snapshot(view, &L::fresh(view.tag), now)
                } else {
                    L::snapshot(view, &self.overflow, now)
                }
            })
        };
        later_snapshot(snap, reading, now)
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
        // The epoch pointers' one loop (`Shared::update`): a lost race
        // decides again on the newer record.
        let Ok((record, published)) = self.default.update(&guard, |record| {
            if !record.is_complete() {
                // A racing reconfiguration is still carrying keys over: finish
                // it, or a key could skip a configuration (see `reconfig`).
                // `settle_all` returns with `record` complete, or replaced
                // (it found the view stale), and then the CAS fails and the
                // newer record is decided on.
                self.settle_all(record);
            }
            Ok::<_, Infallible>(record.next(config.clone(), carry))
        });
        self.settle_all(published);
        // SAFETY: replaced by us. `settle_all` took every shard's write lock
        // after the replacement (or found a newer record, whose publisher saw
        // ours complete, i.e. every shard visited): no unpinned reader still
        // holds `record`, and pinned ones are what `retire` waits for.
        unsafe { self.default.retire(record, &guard) };
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
        for shard in 0..self.map.shard_count() {
            let table = self.map.write(shard);
            if !still_current() {
                return;
            }
            let now = self.now();
            for index in 0..table.buckets() {
                if let Some(state) = table.value_at(index) {
                    L::settle(&view, state, now);
                }
            }
        }
        if L::settle(&view, &self.overflow, self.now()) {
            record.mark_complete();
        }
    }
}

/// A result decided at `now` for a request whose clock read `reading`: a
/// retry-after is measured from the reading (the clock must first climb back
/// to the decision time), so it stays exact: the same request made that much
/// later on the same clock is admitted if nothing else was.
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
