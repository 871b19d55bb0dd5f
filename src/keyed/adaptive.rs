//! One adaptive concurrency limit per key: [`KeyedAdaptiveLimit`], whose
//! docs hold the design (why it is not a [`Keyable`](super::Keyable) kind,
//! how eviction and admission exclude each other, what eviction forgets).

use std::borrow::Borrow;
use std::fmt;
use std::hash::{BuildHasher, Hash};
// std's `Arc`: the permits are the core's `OwnedAdaptivePermit`, which holds a
// std `Arc` (see `concurrency`); nothing is ordered through it.
use std::sync::Arc;
use std::time::Duration;

use crossbeam_utils::CachePadded;

use super::evict::{ROOM, STEP, Sweeper, search_order};
use super::hasher::KeyHasher;
use super::map::{Entry, Map, WriteGuard};
use crate::adaptive::{AdaptiveLimit, LimitAlgorithm, OwnedAdaptivePermit};
use crate::clock::{Clock, MonotonicClock};
use crate::error::ConfigError;
use crate::sync::fault::{Fault, injected};
use crate::sync::{AtomicU64, AtomicUsize, Ordering};
use crate::timeline::Timeline;

/// How long, by default, a key must go without a request (with nothing in
/// flight and nobody waiting) before it may be evicted: one minute.
///
/// ```
/// use std::time::Duration;
/// use tollgate::keyed::{KeyedAdaptiveLimit, DEFAULT_IDLE};
/// use tollgate::Aimd;
///
/// let per_key = KeyedAdaptiveLimit::<u32, Aimd>::new(|| Aimd::builder().build())?;
/// assert_eq!(per_key.idle(), DEFAULT_IDLE);
/// assert_eq!(DEFAULT_IDLE, Duration::from_secs(60));
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
pub const DEFAULT_IDLE: Duration = Duration::from_secs(60);

/// The default [`KeyedAdaptiveLimit::max_keys`]: 2^16 keys. A key's state is
/// an [`AdaptiveLimit`] with its gate and its algorithm (whose limit history
/// alone is 512 bytes): about 1.1 KB a key with `u64` keys and [`Aimd`](crate::Aimd)
/// or a windowed [`Gradient2`](crate::Gradient2), so about 70 MB at this
/// cap — a sixteenth of the rate limiters' [`DEFAULT_MAX_KEYS`](super::DEFAULT_MAX_KEYS),
/// for states about thirty times their size.
///
/// ```
/// use tollgate::keyed::{KeyedAdaptiveLimit, DEFAULT_MAX_ADAPTIVE_KEYS};
/// use tollgate::Aimd;
///
/// let per_key = KeyedAdaptiveLimit::<u64, Aimd>::new(|| Aimd::builder().build())?;
/// assert_eq!(per_key.max_keys(), DEFAULT_MAX_ADAPTIVE_KEYS);
/// assert_eq!(DEFAULT_MAX_ADAPTIVE_KEYS, 65_536);
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
pub const DEFAULT_MAX_ADAPTIVE_KEYS: usize = 1 << 16;

/// How far, in nanoseconds, a request's clock reading must pass a key's
/// last recorded use before the request records its own (2^20 ns, about a
/// millisecond): a key asked for a million times a second writes its time of
/// use about a thousand times, not a million. Idle times are measured from
/// the recorded use, so to within this step.
///
/// ```
/// assert_eq!(tollgate::keyed::TOUCH_STEP, 1 << 20);
/// ```
pub const TOUCH_STEP: u64 = 1 << 20;

/// The factory a [`KeyedAdaptiveLimit`] builds each key's algorithm with.
type Factory<A> = Box<dyn Fn() -> Result<A, ConfigError> + Send + Sync>;

/// One key's limit, with what eviction needs to know about it.
struct KeyState<A, C> {
    limit: Arc<AdaptiveLimit<A, C>>,
    /// Waiters that found the gate full and wait on it without the shard's
    /// read side (rule 2 of the type's docs).
    pins: AtomicUsize,
    /// The last recorded request, on the limiter's timeline.
    used: AtomicU64,
}

impl<A: LimitAlgorithm, C: Clock> KeyState<A, C> {
    fn new(limit: AdaptiveLimit<A, C>, now: u64) -> Self {
        KeyState {
            limit: Arc::new(limit),
            pins: AtomicUsize::new(0),
            used: AtomicU64::new(now),
        }
    }

    /// Records a request at `now`, at most once per [`TOUCH_STEP`].
    #[inline]
    fn touch(&self, now: u64) {
        // Relaxed: written under the shard's read side and read by eviction
        // under its write side, which the shard lock orders; a racing touch
        // that loses to an older one leaves the key looking older by less
        // than the time between them.
        if now >= self.used.load(Ordering::Relaxed).saturating_add(TOUCH_STEP) {
            self.used.store(now, Ordering::Relaxed);
        }
    }

    /// Nothing in flight and nobody waiting (rules 1 and 2).
    fn is_unused(&self) -> bool {
        // Acquire: pairs with the `Release` decrement of a waiter that was
        // admitted (`Pinned::drop`), so its admission — made before that
        // decrement — is visible to the in-flight load below. The pins are
        // read first: read second, a waiter could be admitted and unpin
        // between the two loads and the state look unused with a permit out.
        if self.pins.load(Ordering::Acquire) != 0 {
            return false;
        }
        // The gate's word is read `Relaxed`: every admission by a lookup
        // happened under the shard's read side, which the caller's write
        // lock follows; every admission by a waiter is ordered by the pin
        // load above.
        self.limit.in_flight() == 0
    }

    /// Unused, and no request for at least `idle` ns before `now`.
    fn is_idle(&self, now: u64, idle: u64) -> bool {
        // Relaxed: see `touch`.
        self.is_unused() && now.saturating_sub(self.used.load(Ordering::Relaxed)) >= idle
    }
}

/// A waiter's pin on a state: keeps it from eviction until dropped (rule 2).
struct Pinned<A, C>(Arc<KeyState<A, C>>);

impl<A: LimitAlgorithm, C: Clock> Pinned<A, C> {
    /// Pins `state`; called under its shard's read or write side.
    fn new(state: &Arc<KeyState<A, C>>) -> Self {
        if !injected(Fault::AdaptiveUnpinnedWaiters) {
            // Relaxed: made under the shard's read or write side, so an
            // eviction (under the write side) sees it or runs before the
            // lookup.
            state.pins.fetch_add(1, Ordering::Relaxed);
        }
        Pinned(Arc::clone(state))
    }

    async fn wait(self) -> OwnedAdaptivePermit<A, C> {
        let permit = Arc::clone(&self.0.limit).acquire_owned_async().await;
        // The pin goes only now, after the admission (`Drop`).
        drop(self);
        permit
    }
}

impl<A, C> Drop for Pinned<A, C> {
    fn drop(&mut self) {
        if injected(Fault::AdaptiveUnpinnedWaiters) {
            return;
        }
        // Release: publishes the admission made before it to the eviction
        // that reads the pins with `Acquire` (`KeyState::is_unused`).
        self.0.pins.fetch_sub(1, Ordering::Release);
    }
}

/// What a request answers, by what it does when the key's gate is full.
trait OnFull<A: LimitAlgorithm, C: Clock> {
    type Output;
    fn admitted(permit: OwnedAdaptivePermit<A, C>) -> Self::Output;
    /// Called under the state's shard (read or write side).
    fn full(state: &Arc<KeyState<A, C>>) -> Self::Output;
}

/// `try_acquire`: a full gate refuses.
struct Refuse;

impl<A: LimitAlgorithm, C: Clock> OnFull<A, C> for Refuse {
    type Output = Option<OwnedAdaptivePermit<A, C>>;

    fn admitted(permit: OwnedAdaptivePermit<A, C>) -> Self::Output {
        Some(permit)
    }

    fn full(_: &Arc<KeyState<A, C>>) -> Self::Output {
        None
    }
}

/// `acquire_async`: a full gate's state is pinned, to wait on.
struct Wait;

impl<A: LimitAlgorithm, C: Clock> OnFull<A, C> for Wait {
    type Output = Result<OwnedAdaptivePermit<A, C>, Pinned<A, C>>;

    fn admitted(permit: OwnedAdaptivePermit<A, C>) -> Self::Output {
        Ok(permit)
    }

    fn full(state: &Arc<KeyState<A, C>>) -> Self::Output {
        Err(Pinned::new(state))
    }
}

/// One adaptive concurrency limit per key — per downstream, per tenant —
/// in the keyed map, with bounded memory; the design is below.
///
/// Each key gets its own [`AdaptiveLimit`], built by the factory on the
/// key's first request; its permits are the core's [`OwnedAdaptivePermit`]s,
/// ended with [`success`](OwnedAdaptivePermit::success),
/// [`dropped`](OwnedAdaptivePermit::dropped) or
/// [`ignore`](OwnedAdaptivePermit::ignore) (or dropped: ignored).
///
/// Promises: a key never has more in flight than its gate's bound (the
/// limit in force at its latest admission, never above the algorithm's
/// `max`), across eviction and at the cap, because all of a key's permits
/// in flight are always from one gate; a key with a permit held, a waiter,
/// or a request within [`idle`](Self::idle) is never evicted; at most
/// [`max_keys`](Self::max_keys) states exist. Eviction forgets: a key back
/// after an idle spell starts at the algorithm's initial limit.
///
/// ```
/// use std::time::Duration;
/// use tollgate::keyed::KeyedAdaptiveLimit;
/// use tollgate::{Aimd, ManualClock};
///
/// let clock = ManualClock::new();
/// let aimd = Aimd::builder().min_limit(1).initial_limit(2).max_limit(10);
/// let per_tenant = KeyedAdaptiveLimit::<String, Aimd, ManualClock>::with_clock(
///     move || aimd.clone().build(),
///     clock.clone(),
/// )?
/// .with_idle(Duration::from_secs(30));
///
/// let a = per_tenant.try_acquire("alice").unwrap();
/// let b = per_tenant.try_acquire("alice").unwrap();
/// assert!(per_tenant.try_acquire("alice").is_none()); // alice: 2 in flight, limit 2
/// assert!(per_tenant.try_acquire("bob").is_some()); // every key has its own limit
///
/// clock.advance(Duration::from_millis(20));
/// a.success(); // a fast success, the limit in use: alice's limit grows
/// b.success();
/// assert_eq!(per_tenant.limit_of("alice"), Some(4));
///
/// // Idle for 30 s with nothing in flight: swept, and the learned limit with it.
/// clock.advance(Duration::from_secs(30));
/// assert_eq!(per_tenant.sweep(), 2);
/// assert_eq!(per_tenant.limit_of("alice"), None);
/// per_tenant.try_acquire("alice").unwrap().ignore();
/// assert_eq!(per_tenant.limit_of("alice"), Some(2)); // back at the initial limit
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
///
/// # Design: why not a [`Keyable`](super::Keyable) kind
///
/// The keyed rate limiters split a kind into a configuration and a small
/// state that decides *at a time*, and evict a state only when it is
/// *fresh*: when it decides exactly as a brand-new one would, so eviction
/// changes no decision. A concurrency limit does not fit that shape:
///
/// - its permits outlive the lookup that granted them: a permit holds its
///   key's gate (an [`Arc`] of the key's [`AdaptiveLimit`]) until the work
///   ends, long after the shard's read side is let go, and gives the permit
///   back without touching the map;
/// - an adaptive limit is never fresh once it has learned: a limit moved
///   from 20 to 57 decides unlike a new one, so evicting it always loses
///   something. What a key may lose, and when, has to be a stated policy
///   (below), not an equivalence;
/// - a kind's other duties — time floors, refunds, forks of an overflow
///   state, reconfiguration with a carry — have no meaning for a count of
///   requests in flight.
///
/// So this is a small container of its own on the keyed map (the same
/// sharded tables and reader-biased shard locks, the same key cap and
/// incremental sweep), whose values are each key's [`AdaptiveLimit`], built
/// by a factory the caller supplies. Permits are the core's
/// [`OwnedAdaptivePermit`]: ended with `success`, `dropped` or `ignore`
/// exactly as for a direct [`AdaptiveLimit`].
///
/// # The promise: one gate per key
///
/// **At every instant, every permit in flight for a key was granted by one
/// gate** — the key's current state, or the shared overflow limit (below) —
/// so a key never has more in flight than that gate's own bound: the limit in
/// force at its latest admission, never more than the algorithm's `max`.
/// Two gates for one key would break that: a request that found the key's
/// state, an eviction that removed it, a request that created a new one, and
/// the first request then admitted on the removed one would hold two permits
/// under a limit of one. Three rules exclude it:
///
/// 1. **Acquire under the read side.** A request looks the key up and
///    compare-and-swaps its gate while it still holds the shard's read side
///    (a reader slot or the read lock). Eviction takes the shard's write side
///    and removes a state only if nothing is in flight on it and nobody waits
///    on it. Reader and writer exclude each other, so either the admission
///    came first — its increment happens before the write lock is taken, and
///    the eviction's load of the gate's word sees it (or a later release) —
///    or the eviction came first, and the lookup does not find the state.
///    A removed state is reachable by nobody: no later admission can happen
///    on it.
/// 2. **A waiter pins its state.** [`acquire_async`](KeyedAdaptiveLimit::acquire_async)
///    waits on the key's gate without holding the shard (holding it across
///    an `.await` would stall every writer of the shard). Before it lets the
///    read side go it increments the state's *pin* count, and it decrements
///    it only after its own admission, so there is no moment at which the
///    state has neither a waiter nor a permit counted: eviction reads the
///    pins first (`Acquire`, pairing with the waiter's `Release` decrement)
///    and the gate's word second, so a pin seen gone means the admission it
///    was waiting for is seen too.
/// 3. **At the cap, one gate at a time.** A key that finds no room at the
///    cap is decided by one shared *overflow* limit, under its shard's write
///    lock (a vacant entry), as [`Keyed`](super::Keyed) does. A key gets a
///    state of its own only while the overflow has nothing in flight and no
///    waiter (checked under the same lock, pins before the word): its
///    overflow permits, if it had any, are all back. Nothing remembers which
///    keys the overflow served, so this is checked for the overflow as a
///    whole.
///
/// # Bounded memory, and what eviction forgets
///
/// At most [`max_keys`](KeyedAdaptiveLimit::max_keys) keys
/// ([`DEFAULT_MAX_ADAPTIVE_KEYS`] by default, about 1.1 KB each) have a
/// state.
/// A key is *idle* when nothing is in flight for it, nobody waits on it, and
/// no request asked for it for [`idle`](KeyedAdaptiveLimit::idle) (one
/// minute by default, [`DEFAULT_IDLE`]; measured on the limiter's clock, from
/// each request to within [`TOUCH_STEP`] ns). Idle keys are evicted as in
/// [`Keyed`](super::Keyed): every insert sweeps a few buckets of its shard, a
/// new key at the cap first searches for an idle key to evict, and
/// [`sweep`](KeyedAdaptiveLimit::sweep) takes them all. A key in use — a
/// permit held, a waiter, a request within the idle time — is never evicted,
/// not even at the cap.
///
/// **Eviction forgets the learned limit.** A key that comes back after it was
/// evicted gets a new [`AdaptiveLimit`] from the factory: it starts at the
/// algorithm's initial limit, with none of its round-trip estimates. Choose
/// the idle time longer than the gaps between a key's requests if its limit
/// takes long to learn.
///
/// **At the cap** (every resident key in use), a new key's requests share the
/// overflow limit, one [`AdaptiveLimit`] built by the same factory: new keys
/// are served, together, by one adaptive limit; resident keys are unaffected;
/// memory does not grow. By rule 3, a key stays on the overflow while the
/// overflow has anything in flight, even if room appears meanwhile: stricter,
/// never looser. A factory that fails for a key after construction (its own
/// algorithm with an invalid limit) sends that key to the overflow too, which
/// was built and validated when the limiter was. While new keys keep the
/// overflow busy, none of them leaves it, even with room: the price of not
/// remembering which keys it served.
///
/// # Cost
///
/// An existing key: one lookup (its shard's reader slot, as for
/// [`Keyed`](super::Keyed): no shared write), one clock read, the gate's
/// compare-and-swap, and a store of the time of use at most once per
/// [`TOUCH_STEP`]. Ending a permit is the core's (the algorithm's sample, the
/// gate's release) and never touches the map. A new key: the factory call
/// and two allocations under its shard's write lock, then a sweep of a few
/// buckets. A waiter takes no lock while it waits.
///
/// # Verification
///
/// loom models (`loom-tests/tests/keyed_adaptive.rs`) race an eviction
/// against an acquire of the same key, a waiter against a release, a sweep
/// and an acquire, and a key at the cap against its own overflow permit, on
/// the shipped map and gates, counting every key's holders independently of
/// the gates; three known-bad protocols — an admission after the read side
/// is let go, a waiter that does not pin, an insert beside a busy overflow —
/// are caught by that count. A property test follows every key's limit and
/// in-flight count with a reference model through random acquires, outcomes,
/// clock steps and sweeps at a cap of two keys.
pub struct KeyedAdaptiveLimit<K, A, C = MonotonicClock, S = KeyHasher> {
    map: Map<K, Arc<KeyState<A, C>>, S>,
    factory: Factory<A>,
    timeline: Timeline<C>,
    /// Shared by new keys while the map is at its cap (rule 3).
    overflow: Arc<KeyState<A, C>>,
    idle: u64,
    sweeper: Sweeper,
    /// Per shard: where its next incremental sweep starts, in buckets.
    cursors: Box<[AtomicU64]>,
    /// Written on slow paths only.
    counters: CachePadded<Counters>,
}

struct Counters {
    /// Which shard a search for room visits after the key's own.
    room: AtomicU64,
    evicted: AtomicU64,
    overflowed: AtomicU64,
}

impl<K, A> KeyedAdaptiveLimit<K, A>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
    A: LimitAlgorithm + 'static,
{
    /// A limit per key, each key's algorithm built by `factory` (a
    /// builder's `build`, typically), timed on the default
    /// [`MonotonicClock`], with at most [`DEFAULT_MAX_ADAPTIVE_KEYS`] keys and keys
    /// evicted after [`DEFAULT_IDLE`].
    ///
    /// The factory is called once here, for the shared overflow limit:
    /// its error, or [`ConfigError::InvalidConcurrencyLimit`] for an
    /// algorithm of one's own whose limit is 0 or above
    /// [`ConcurrencyLimit::MAX_LIMIT`](crate::ConcurrencyLimit::MAX_LIMIT),
    /// is returned. Later it is called for each new key under that key's
    /// shard's write lock, so it must not call back into this limiter.
    ///
    /// ```
    /// use tollgate::keyed::KeyedAdaptiveLimit;
    /// use tollgate::{Aimd, ConfigError};
    ///
    /// let per_key = KeyedAdaptiveLimit::<u64, Aimd>::new(|| Aimd::builder().build())?;
    /// assert_eq!(per_key.try_acquire(&7).unwrap().granted_in_flight(), 1);
    ///
    /// let bad = KeyedAdaptiveLimit::<u64, Aimd>::new(|| Aimd::builder().min_limit(0).build());
    /// assert!(matches!(bad, Err(ConfigError::InvalidLimits { min: 0, .. })));
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn new<F>(factory: F) -> Result<Self, ConfigError>
    where
        F: Fn() -> Result<A, ConfigError> + Send + Sync + 'static,
    {
        Self::with_clock(factory, MonotonicClock::new())
    }
}

impl<K, A, C> KeyedAdaptiveLimit<K, A, C>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
    A: LimitAlgorithm + 'static,
    C: Clock + Clone + Send + Sync + 'static,
{
    /// As [`new`](KeyedAdaptiveLimit::new), on `clock`: every key's permits
    /// are timed on a clone of it, and idle times are measured on it.
    ///
    /// ```
    /// use tollgate::keyed::KeyedAdaptiveLimit;
    /// use tollgate::{ManualClock, Vegas};
    ///
    /// let per_key = KeyedAdaptiveLimit::<u64, Vegas, ManualClock>::with_clock(
    ///     || Vegas::builder().build(), ManualClock::new())?;
    /// assert_eq!(per_key.overflow().limit(), 20);
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn with_clock<F>(factory: F, clock: C) -> Result<Self, ConfigError>
    where
        F: Fn() -> Result<A, ConfigError> + Send + Sync + 'static,
    {
        Self::with_clock_and_hasher(factory, clock, KeyHasher::new())
    }
}

impl<K, A, C, S> KeyedAdaptiveLimit<K, A, C, S>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
    A: LimitAlgorithm + 'static,
    C: Clock + Clone + Send + Sync + 'static,
    S: BuildHasher + Clone + Send + Sync + 'static,
{
    /// As [`with_clock`](KeyedAdaptiveLimit::with_clock), hashing keys with
    /// `hasher`.
    ///
    /// ```
    /// use std::collections::hash_map::DefaultHasher;
    /// use std::hash::BuildHasherDefault;
    /// use tollgate::keyed::KeyedAdaptiveLimit;
    /// use tollgate::{Aimd, MonotonicClock};
    ///
    /// let per_key = KeyedAdaptiveLimit::<u64, Aimd, _, _>::with_clock_and_hasher(
    ///     || Aimd::builder().build(),
    ///     MonotonicClock::new(),
    ///     BuildHasherDefault::<DefaultHasher>::default(),
    /// )?;
    /// assert!(per_key.try_acquire(&1).is_some());
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn with_clock_and_hasher<F>(factory: F, clock: C, hasher: S) -> Result<Self, ConfigError>
    where
        F: Fn() -> Result<A, ConfigError> + Send + Sync + 'static,
    {
        let overflow = AdaptiveLimit::with_clock(factory()?, clock.clone())?;
        let timeline = Timeline::new(clock);
        let map = Map::with_hasher(hasher);
        let shards = map.shard_count();
        Ok(KeyedAdaptiveLimit {
            overflow: Arc::new(KeyState::new(overflow, timeline.now())),
            map,
            factory: Box::new(factory),
            timeline,
            idle: duration_ns(DEFAULT_IDLE),
            sweeper: Sweeper::new(shards, DEFAULT_MAX_ADAPTIVE_KEYS),
            cursors: (0..shards).map(|_| AtomicU64::new(0)).collect(),
            counters: CachePadded::new(Counters {
                room: AtomicU64::new(0),
                evicted: AtomicU64::new(0),
                overflowed: AtomicU64::new(0),
            }),
        })
    }

    /// Sets the most keys with a state at once (at least 1; 0 is taken as 1,
    /// as for [`Keyed::with_max_keys`](super::Keyed::with_max_keys)).
    ///
    /// ```
    /// use tollgate::keyed::KeyedAdaptiveLimit;
    /// use tollgate::Aimd;
    ///
    /// let per_key = KeyedAdaptiveLimit::<u64, Aimd>::new(|| Aimd::builder().build())?
    ///     .with_max_keys(100);
    /// assert_eq!(per_key.max_keys(), 100);
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn with_max_keys(mut self, max_keys: usize) -> Self {
        self.sweeper.set_max_keys(max_keys.max(1));
        self
    }

    /// Sets how long a key must go without a request, with nothing in flight
    /// and nobody waiting, before it may be evicted (and its learned limit
    /// forgotten). `Duration::ZERO` evicts a key as soon as nothing is in
    /// flight for it; durations past `u64::MAX` ns are taken as `u64::MAX`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::keyed::KeyedAdaptiveLimit;
    /// use tollgate::Aimd;
    ///
    /// let per_key = KeyedAdaptiveLimit::<u64, Aimd>::new(|| Aimd::builder().build())?
    ///     .with_idle(Duration::ZERO);
    /// per_key.try_acquire(&1).unwrap().success();
    /// assert_eq!(per_key.sweep(), 1); // nothing in flight: gone
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn with_idle(mut self, idle: Duration) -> Self {
        self.idle = duration_ns(idle);
        self
    }

    /// The most keys with a state at once.
    ///
    /// ```
    /// use tollgate::keyed::{KeyedAdaptiveLimit, DEFAULT_MAX_ADAPTIVE_KEYS};
    /// use tollgate::Aimd;
    /// let per_key = KeyedAdaptiveLimit::<u64, Aimd>::new(|| Aimd::builder().build())?;
    /// assert_eq!(per_key.max_keys(), DEFAULT_MAX_ADAPTIVE_KEYS);
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn max_keys(&self) -> usize {
        self.sweeper.max_keys()
    }

    /// How long a key must go unused before it may be evicted.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::keyed::KeyedAdaptiveLimit;
    /// use tollgate::Aimd;
    /// let per_key = KeyedAdaptiveLimit::<u64, Aimd>::new(|| Aimd::builder().build())?
    ///     .with_idle(Duration::from_secs(5));
    /// assert_eq!(per_key.idle(), Duration::from_secs(5));
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn idle(&self) -> Duration {
        Duration::from_nanos(self.idle)
    }

    /// A permit for `key` if fewer than its limit are in flight; `None` (and
    /// nothing held) otherwise. A key without a state gets one, built by the
    /// factory, unless the map is at its cap with every key in use: then the
    /// shared overflow limit decides (see the type's docs).
    ///
    /// ```
    /// use tollgate::keyed::KeyedAdaptiveLimit;
    /// use tollgate::Aimd;
    ///
    /// let per_key = KeyedAdaptiveLimit::<String, Aimd>::new(|| {
    ///     Aimd::builder().min_limit(1).initial_limit(1).build()
    /// })?;
    /// let held = per_key.try_acquire("db-1").unwrap();
    /// assert!(per_key.try_acquire("db-1").is_none());
    /// held.dropped(); // overload: the limit backs off (it is at its minimum)
    /// assert!(per_key.try_acquire("db-1").is_some());
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn try_acquire<Q>(&self, key: &Q) -> Option<OwnedAdaptivePermit<A, C>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.answer::<Q, Refuse>(key)
    }

    /// Waits, on any executor, until `key` has a permit free. While it waits
    /// it holds no shard lock; it pins the key's state instead, which keeps
    /// the state from eviction (so that it is admitted by the key's one
    /// gate). Cancel-safe: a future dropped before it completes holds no
    /// permit and no pin, and passes on any wake-up it was given. A future
    /// leaked while it waits keeps its key from eviction for good.
    ///
    /// ```
    /// use tollgate::keyed::KeyedAdaptiveLimit;
    /// use tollgate::Aimd;
    /// # let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    /// # rt.block_on(async {
    /// let per_key = KeyedAdaptiveLimit::<u64, Aimd>::new(|| Aimd::builder().build())?;
    /// let permit = per_key.acquire_async(&3).await;
    /// permit.success();
    /// # Ok::<(), tollgate::ConfigError>(())
    /// # }).unwrap();
    /// ```
    pub async fn acquire_async<Q>(&self, key: &Q) -> OwnedAdaptivePermit<A, C>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        match self.answer::<Q, Wait>(key) {
            Ok(permit) => permit,
            Err(pinned) => pinned.wait().await,
        }
    }

    /// The limit in force for `key`, if it has a state; `None` if it has
    /// none (its next request starts at the algorithm's initial limit, or, at
    /// the cap, shares the [`overflow`](Self::overflow)).
    ///
    /// ```
    /// use tollgate::keyed::KeyedAdaptiveLimit;
    /// use tollgate::Aimd;
    /// let per_key = KeyedAdaptiveLimit::<u64, Aimd>::new(|| Aimd::builder().build())?;
    /// assert_eq!(per_key.limit_of(&1), None);
    /// let _held = per_key.try_acquire(&1);
    /// assert_eq!(per_key.limit_of(&1), Some(20));
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn limit_of<Q>(&self, key: &Q) -> Option<u32>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.map.get(key).map(|state| state.limit.limit())
    }

    /// Permits in flight on `key`'s own state (0 without one; permits the
    /// overflow granted are counted on [`overflow`](Self::overflow)).
    ///
    /// ```
    /// use tollgate::keyed::KeyedAdaptiveLimit;
    /// use tollgate::Aimd;
    /// let per_key = KeyedAdaptiveLimit::<u64, Aimd>::new(|| Aimd::builder().build())?;
    /// let _held = per_key.try_acquire(&1);
    /// assert_eq!((per_key.in_flight_of(&1), per_key.in_flight_of(&2)), (1, 0));
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn in_flight_of<Q>(&self, key: &Q) -> u32
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.map.get(key).map_or(0, |state| state.limit.in_flight())
    }

    /// The shared limit that decides new keys while the map is at its cap
    /// (and keys whose factory call failed), for its readings.
    ///
    /// ```
    /// use tollgate::keyed::KeyedAdaptiveLimit;
    /// use tollgate::Aimd;
    /// let per_key = KeyedAdaptiveLimit::<u64, Aimd>::new(|| Aimd::builder().build())?
    ///     .with_max_keys(1);
    /// let _first = per_key.try_acquire(&1).unwrap();
    /// let _second = per_key.try_acquire(&2).unwrap(); // no room: the overflow
    /// assert_eq!(per_key.overflow().in_flight(), 1);
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn overflow(&self) -> &AdaptiveLimit<A, C> {
        &self.overflow.limit
    }

    /// Keys with a state now.
    ///
    /// ```
    /// use tollgate::keyed::KeyedAdaptiveLimit;
    /// use tollgate::Aimd;
    /// let per_key = KeyedAdaptiveLimit::<u64, Aimd>::new(|| Aimd::builder().build())?;
    /// let _held = (per_key.try_acquire(&1), per_key.try_acquire(&2));
    /// assert_eq!(per_key.len(), 2);
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn len(&self) -> usize {
        self.sweeper.len()
    }

    /// Whether no key has a state.
    ///
    /// ```
    /// use tollgate::keyed::KeyedAdaptiveLimit;
    /// use tollgate::Aimd;
    /// assert!(KeyedAdaptiveLimit::<u64, Aimd>::new(|| Aimd::builder().build())?.is_empty());
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keys evicted so far.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::keyed::KeyedAdaptiveLimit;
    /// use tollgate::Aimd;
    /// let per_key = KeyedAdaptiveLimit::<u64, Aimd>::new(|| Aimd::builder().build())?
    ///     .with_idle(Duration::ZERO);
    /// drop(per_key.try_acquire(&1));
    /// per_key.sweep();
    /// assert_eq!(per_key.evicted(), 1);
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn evicted(&self) -> u64 {
        // Relaxed: a statistic.
        self.counters.evicted.load(Ordering::Relaxed)
    }

    /// Requests decided by the overflow limit: at the cap, or after a
    /// factory call failed.
    ///
    /// ```
    /// use tollgate::keyed::KeyedAdaptiveLimit;
    /// use tollgate::Aimd;
    /// let per_key = KeyedAdaptiveLimit::<u64, Aimd>::new(|| Aimd::builder().build())?
    ///     .with_max_keys(1);
    /// let _first = per_key.try_acquire(&1);
    /// let _second = per_key.try_acquire(&2);
    /// assert_eq!(per_key.overflowed(), 1);
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn overflowed(&self) -> u64 {
        // Relaxed: a statistic.
        self.counters.overflowed.load(Ordering::Relaxed)
    }

    /// Evicts every idle key now — nothing in flight, nobody waiting, no
    /// request for [`idle`](Self::idle) — visiting the whole map (one shard
    /// at a time under its write lock); returns how many it evicted. Not
    /// needed for bounded memory (inserts sweep as they go, and a new key at
    /// the cap looks for room), but frees the keys of a map that stopped
    /// growing. Evicted keys forget their learned limits.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::keyed::KeyedAdaptiveLimit;
    /// use tollgate::{Aimd, ManualClock};
    ///
    /// let clock = ManualClock::new();
    /// let per_key = KeyedAdaptiveLimit::<u64, Aimd, ManualClock>::with_clock(
    ///     || Aimd::builder().build(), clock.clone())?
    /// .with_idle(Duration::from_secs(1));
    /// let held = per_key.try_acquire(&1).unwrap();
    /// per_key.try_acquire(&2).unwrap().ignore();
    /// clock.advance(Duration::from_secs(1));
    /// assert_eq!(per_key.sweep(), 1); // key 2; key 1 has a permit out
    /// drop(held);
    /// assert_eq!(per_key.sweep(), 1);
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn sweep(&self) -> usize {
        let now = self.timeline.now();
        let mut evicted = 0;
        for shard in 0..self.map.shard_count() {
            let mut table = self.map.write(shard);
            let buckets = table.buckets();
            evicted += self.evict_idle(&mut table, 0..buckets, now);
        }
        evicted
    }

    /// Gives the hash tables' unused memory back; run
    /// [`sweep`](Self::sweep) first.
    ///
    /// ```
    /// use tollgate::keyed::KeyedAdaptiveLimit;
    /// use tollgate::Aimd;
    /// let per_key = KeyedAdaptiveLimit::<u64, Aimd>::new(|| Aimd::builder().build())?;
    /// per_key.sweep();
    /// per_key.shrink_to_fit();
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn shrink_to_fit(&self) {
        self.map.shrink_to_fit();
    }

    /// The clock permits are timed on.
    ///
    /// ```
    /// use tollgate::keyed::KeyedAdaptiveLimit;
    /// use tollgate::{Aimd, Clock, ManualClock};
    /// let clock = ManualClock::new();
    /// let per_key = KeyedAdaptiveLimit::<u64, Aimd, ManualClock>::with_clock(
    ///     || Aimd::builder().build(), clock.clone())?;
    /// clock.set(9);
    /// assert_eq!(per_key.clock().now(), 9);
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn clock(&self) -> &C {
        self.timeline.clock()
    }

    /// The one body of both requests: a permit, or what `F` does with a full
    /// gate.
    fn answer<Q, F: OnFull<A, C>>(&self, key: &Q) -> F::Output
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let now = self.timeline.now();
        if let Some(state) = self.map.get(key) {
            state.touch(now);
            if injected(Fault::AdaptiveUnlockedAcquire) {
                // The known-bad protocol: the read side is let go before the
                // admission, which then lands on whatever state was found,
                // removed or not.
                let found = Arc::clone(&*state);
                drop(state);
                return admit::<A, C, F>(&found);
            }
            // Under the read side (`state` holds it): rule 1.
            return admit::<A, C, F>(&state);
        }
        self.answer_new::<Q, F>(key, now)
    }

    /// A request for a key without a state: insert one (if there is room and
    /// the overflow is unused), or let the overflow decide.
    #[cold]
    fn answer_new<Q, F: OnFull<A, C>>(&self, key: &Q, now: u64) -> F::Output
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let shard = self.map.determine_map(key);
        let mut searched = false;
        loop {
            let (entry, reserved) = self.sweeper.entry(&self.map, key.to_owned());
            // The entry holds the shard's write lock: inserting the key and
            // deciding it by the overflow are serialised (rule 3).
            let entry = match entry {
                Entry::Occupied(entry) => {
                    let state = entry.get();
                    state.touch(now);
                    return admit::<A, C, F>(state);
                }
                Entry::Vacant(entry) => entry,
            };
            if reserved {
                if injected(Fault::AdaptiveBusyOverflowInsert) || self.overflow.is_unused() {
                    if let Ok(limit) = (self.factory)().and_then(|algorithm| {
                        AdaptiveLimit::with_clock(algorithm, self.clock().clone())
                    }) {
                        let state = Arc::new(KeyState::new(limit, now));
                        // A new gate has its whole limit (at least 1) free.
                        let answer = admit::<A, C, F>(&state);
                        drop(entry.insert(state));
                        self.sweep_step(shard, STEP, now);
                        return answer;
                    }
                }
                // The overflow still has permits out (some may be this key's),
                // or the factory failed: the overflow decides.
                self.sweeper.release(1);
            } else if !searched {
                // At the cap: look for an idle key to evict, once, without
                // the lock (the search takes shards' write locks). A racing
                // insert may take the room made; then the overflow decides.
                drop(entry);
                searched = true;
                self.make_room(shard, now);
                continue;
            }
            // Relaxed: a statistic.
            self.counters.overflowed.fetch_add(1, Ordering::Relaxed);
            let answer = admit::<A, C, F>(&self.overflow);
            drop(entry);
            return answer;
        }
    }

    /// Removes the idle states among `indices` (bucket positions) of a
    /// shard's table, whose write lock the caller holds; returns how many.
    fn evict_idle(
        &self,
        table: &mut WriteGuard<'_, K, Arc<KeyState<A, C>>, S>,
        indices: impl Iterator<Item = usize>,
        now: u64,
    ) -> usize {
        let mut evicted = 0;
        for index in indices {
            if table
                .value_at(index)
                .is_some_and(|state| state.is_idle(now, self.idle))
            {
                table.remove_at(index);
                evicted += 1;
            }
        }
        self.sweeper.release(evicted as u64);
        if evicted > 0 {
            // Relaxed: a statistic.
            self.counters
                .evicted
                .fetch_add(evicted as u64, Ordering::Relaxed);
        }
        evicted
    }

    /// Examines up to `budget` buckets of shard `shard` from its cursor,
    /// evicting idle states; returns how many it evicted and examined.
    fn sweep_step(&self, shard: usize, budget: usize, now: u64) -> (usize, usize) {
        let mut table = self.map.write(shard);
        // Relaxed: only spreads sweeps over the table; any value is correct.
        let start = self.cursors[shard].fetch_add(budget as u64, Ordering::Relaxed) as usize;
        let buckets = table.buckets();
        let examined = budget.min(buckets);
        let indices = (0..examined).map(|i| (start + i) & (buckets - 1));
        (self.evict_idle(&mut table, indices, now), examined)
    }

    /// Looks for idle keys to evict at the cap: the key's own shard first,
    /// then the others in rotation, `ROOM` buckets at most; returns how many
    /// it evicted.
    fn make_room(&self, own: usize, now: u64) -> usize {
        let shards = self.map.shard_count();
        // Relaxed: spreads searches over the shards; any value is correct.
        let next = self.counters.room.fetch_add(1, Ordering::Relaxed) as usize;
        let mut budget = ROOM;
        for shard in search_order(own, next, shards) {
            let (evicted, examined) = self.sweep_step(shard, budget, now);
            budget -= examined;
            if evicted > 0 || budget == 0 {
                return evicted;
            }
        }
        0
    }
}

/// Admits on `state`'s gate, or answers as `F` does for a full one. Called
/// under the state's shard (read or write side) for a keyed state, so that
/// rules 1 and 2 hold.
fn admit<A: LimitAlgorithm, C: Clock, F: OnFull<A, C>>(state: &Arc<KeyState<A, C>>) -> F::Output {
    match state.limit.try_acquire_owned() {
        Some(permit) => F::admitted(permit),
        None => F::full(state),
    }
}

fn duration_ns(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

impl<K, A: fmt::Debug, C, S> fmt::Debug for KeyedAdaptiveLimit<K, A, C, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedAdaptiveLimit")
            .field("len", &self.sweeper.len())
            .field("max_keys", &self.sweeper.max_keys())
            .field("idle", &Duration::from_nanos(self.idle))
            .field("overflow", &self.overflow.limit)
            .finish_non_exhaustive()
    }
}
