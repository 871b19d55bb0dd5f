//! Bounded memory: eviction of fresh keys, amortised over inserts, and the
//! hard cap on the number of keys.
//!
//! The user-facing documentation is on [`Keyed::sweep`](crate::keyed::Keyed::sweep).

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};

use super::map::{Entry, Map, VacantEntry};
use crossbeam_utils::CachePadded;

use super::Keyed;
use crate::kind::answer::{Answer, ask};
use crate::kind::reconfig::read;
use crate::kind::{Keyable, View};
use crate::limiter::check_request;
use crate::sync::{AtomicU64, Ordering, pin};

/// Buckets examined after every insert.
pub(crate) const STEP: usize = 8;

/// How long a key must have been fresh before an insert's sweep evicts it:
/// 2^30 ns, about a second. Inserts sweep only *idle* keys — fresh at the
/// floor and already fresh this long before it — while [`Keyed::sweep`] and
/// the search for room at the cap take every fresh key.
///
/// Why: a key whose limit is far above its use is fresh again a moment after
/// each request (a bucket of 10^6 at 10^7/s is full 100 ns after a request),
/// so judged at the floor alone every active key of a generous limit is
/// evictable. Each insert swept up to 8 of them away, each came back with its
/// next request as an insert that swept 8 more: on a busy map nearly every
/// request became an insert. Evicting only keys idle for a second breaks that
/// chain — a key requested at least once a second is never swept, a key that
/// comes back after a longer pause pays one insert — and changes no decision:
/// it only narrows what an insert removes, and a key is still removed only if
/// it is fresh at the floor.
///
/// ```
/// use std::time::Duration;
/// use tollgate::keyed::{BucketConfig, Keyed, IDLE_BEFORE_EVICTION};
/// use tollgate::{ManualClock, Rate, TokenBucket};
///
/// let clock = ManualClock::new();
/// let cfg = BucketConfig::new(1_000, Rate::per_second(1_000_000)).unwrap();
/// let per_key = Keyed::<u32, TokenBucket<ManualClock>>::with_clock(cfg, clock.clone());
/// per_key.try_acquire(&1).unwrap();
/// clock.advance(Duration::from_millis(1)); // key 1 is full again: fresh, but not idle
/// for key in 2..100 {
///     per_key.try_acquire(&key).unwrap();
/// }
/// assert_eq!(per_key.evicted(), 0);
/// clock.advance(Duration::from_nanos(IDLE_BEFORE_EVICTION));
/// for key in 100..2_000 {
///     per_key.try_acquire(&key).unwrap(); // each insert sweeps a few buckets
/// }
/// assert!(per_key.evicted() > 0); // keys idle for a second went
/// ```
pub const IDLE_BEFORE_EVICTION: u64 = 1 << 30;

/// Buckets examined, at most, to make room for a new key at the cap.
pub(crate) const ROOM: usize = 128;

/// The shards a search for room visits, of `shards`: the key's own,
/// `own`, then every other shard once, starting at one that `turn` (a count
/// of searches) moves from search to search.
pub(crate) fn search_order(own: usize, turn: usize, shards: usize) -> impl Iterator<Item = usize> {
    (0..shards).map(move |i| {
        if i == 0 {
            own
        } else {
            (own + 1 + (turn + i - 1) % (shards - 1)) % shards
        }
    })
}

/// Counters for the cap and the sweep.
#[derive(Debug)]
pub(crate) struct Sweeper {
    /// Keys in the map, counting reservations not yet inserted.
    len: CachePadded<AtomicU64>,
    max_keys: u64,
    /// Per shard: where its next sweep starts, in buckets (taken modulo the
    /// table size, which changes as the table grows).
    cursors: Box<[AtomicU64]>,
    /// Written on slow paths only; padded so that they never share a cache
    /// line with what every request reads.
    counters: CachePadded<Counters>,
}

#[derive(Debug)]
struct Counters {
    /// Which shard the next search for room visits after the key's own.
    room: AtomicU64,
    evicted: AtomicU64,
    overflowed: AtomicU64,
}

impl Sweeper {
    pub(crate) fn new(shards: usize, max_keys: usize) -> Self {
        Sweeper {
            len: CachePadded::new(AtomicU64::new(0)),
            max_keys: max_keys as u64,
            cursors: (0..shards).map(|_| AtomicU64::new(0)).collect(),
            counters: CachePadded::new(Counters {
                room: AtomicU64::new(0),
                evicted: AtomicU64::new(0),
                overflowed: AtomicU64::new(0),
            }),
        }
    }

    pub(crate) fn set_max_keys(&mut self, max_keys: usize) {
        self.max_keys = max_keys as u64;
    }

    pub(crate) fn max_keys(&self) -> usize {
        self.max_keys as usize
    }

    pub(crate) fn len(&self) -> usize {
        // Relaxed: a count; it orders nothing.
        self.len.load(Ordering::Relaxed) as usize
    }

    /// Takes a place for a new key, if there is one. Exact under races: the
    /// count is reserved before the check.
    pub(crate) fn reserve(&self) -> bool {
        // Relaxed throughout: a counter, not a publication.
        if self.len.load(Ordering::Relaxed) >= self.max_keys {
            return false;
        }
        if self.len.fetch_add(1, Ordering::Relaxed) < self.max_keys {
            true
        } else {
            self.len.fetch_sub(1, Ordering::Relaxed);
            false
        }
    }

    pub(crate) fn release(&self, keys: u64) {
        // A sweep that evicted nothing writes nothing (also keeps loom 0.7
        // from tripping over an RMW that reads a store of equal order).
        if keys > 0 {
            self.len.fetch_sub(keys, Ordering::Relaxed);
        }
    }

    /// `key`'s entry in `map`, with a place for a new key reserved before
    /// it is taken (`true` if there was one); a key already in the map
    /// gives its place back at once.
    pub(crate) fn entry<'m, K: Eq + Hash, V, S: BuildHasher>(
        &self,
        map: &'m Map<K, V, S>,
        key: K,
    ) -> (Entry<'m, K, V, S>, bool) {
        let reserved = self.reserve();
        let entry = map.entry(key);
        if reserved && matches!(entry, Entry::Occupied(_)) {
            self.release(1);
            return (entry, false);
        }
        (entry, reserved)
    }
}

/// Removes the fresh states among `$indices` (bucket positions) of `$table`,
/// a shard's table under its write lock held by the caller; evaluates to how
/// many it removed and how many it kept that were fresh but not idle. A macro
/// so that the keyed limiter's fields and the guard are borrowed separately.
macro_rules! evict_fresh {
    ($keyed:ident, $table:ident, $indices:expr, $idle:expr) => {{
        // Judged at the floor, the earliest time any later decision can use
        // (see `Keyed::decision_time`), not at a clock reading: a state fresh
        // at the floor decides as a new one at every time a request can still
        // be decided at, a backwards clock included. Relaxed: read under the
        // shard's write lock, which orders it before the floor load of any
        // request that finds the key gone.
        let now = $keyed.floor.load(Ordering::Relaxed);
        // Idle: fresh already `$idle` before the floor (see
        // `IDLE_BEFORE_EVICTION`); an earlier time only narrows what goes.
        let idle_since = now.saturating_sub($idle);
        // SAFETY: the caller holds the shard's write lock.
        let record = unsafe { $keyed.default.load_unprotected() };
        let still_current = || $keyed.default.is_current(record);
        let view = record.view(&still_current);
        let mut evicted = 0usize;
        let mut kept_fresh = 0usize;
        // One pin for the whole sweep: the states that keep their data
        // behind an epoch pointer (a log's ring, a window's history) pin
        // again to read it, and a nested pin costs no fence, where a first
        // pin per state made a search at the cap a fence per key examined.
        let _pinned = pin();
        for index in $indices {
            let Some(state) = $table.value_at(index) else {
                continue;
            };
            if L::is_fresh(&view, state, now) != Some(true) {
                continue;
            }
            if idle_since == now || L::is_fresh(&view, state, idle_since) == Some(true) {
                $table.remove_at(index);
                evicted += 1;
            } else {
                kept_fresh += 1;
            }
        }
        $keyed.sweeper.release(evicted as u64);
        if evicted > 0 {
            // Relaxed: a statistic.
            $keyed
                .sweeper
                .counters
                .evicted
                .fetch_add(evicted as u64, Ordering::Relaxed);
        }
        (evicted, kept_fresh)
    }};
}

impl<K, L, S> Keyed<K, L, S>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
    L: Keyable,
    S: BuildHasher + Clone + Send + Sync + 'static,
{
    /// A request for a key not in the map: insert it (if there is room), sweep
    /// a little, or fall back to the overflow state. `reading` is the
    /// request's one clock reading.
    #[cold]
    pub(super) fn acquire_new<Q, A: Answer<L>>(
        &self,
        key: &Q,
        n: u32,
        reading: u64,
        answer: A,
    ) -> Result<A::Admitted, A::Denied>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        {
            let _guard = pin();
            // SAFETY: pinned while the record is used.
            let capacity = L::capacity(&unsafe { self.default.load_unprotected() }.current);
            // A request that can never succeed creates nothing.
            if let Err(denied) = check_request(n, capacity) {
                return Err(answer.invalid(denied, || self.snapshot(key)));
            }
        }
        let shard = self.map.determine_map(key);
        let mut room_searches = 0;
        loop {
            let (entry, reserved) = self.sweeper.entry(&self.map, key.to_owned());
            // The entry holds the shard's write lock: inserting the key,
            // deciding it by the overflow state and forking the overflow
            // state for it are serialised, so a request decided by the
            // overflow is always in the state the key's own one forks.
            let entry = match entry {
                Entry::Occupied(entry) => {
                    let now = self.decision_time(reading);
                    // SAFETY: `entry` holds the shard's write lock.
                    let result = unsafe {
                        read(&self.default, |view| {
                            ask(answer, view, entry.get(), now, n).ok()
                        })
                    };
                    return answer.measured_from(reading, now, result);
                }
                Entry::Vacant(entry) => entry,
            };
            let now = self.decision_time(reading);
            if reserved {
                match self.insert_reserved(entry, answer, shard, n, now) {
                    Some(outcome) => return answer.measured_from(reading, now, outcome),
                    // The overflow state has moved on to a newer record.
                    None => continue,
                }
            }
            // At the cap, and the key is not in. Look for room without the
            // lock (the search takes shards' write locks), at most twice: a
            // racing insert can take the room we made.
            if room_searches < 2 {
                drop(entry);
                room_searches = self.search_room(shard, room_searches);
                continue;
            }
            // Still under the entry's lock (see above).
            self.sweeper
                .counters
                .overflowed
                .fetch_add(1, Ordering::Relaxed);
            let _guard = pin();
            // SAFETY: pinned for the whole call.
            let result = unsafe {
                read(&self.default, |view| {
                    ask(answer, view, &self.overflow, now, n).ok()
                })
            };
            drop(entry);
            return answer.measured_from(reading, now, result);
        }
    }

    /// One search for room without the entry's lock (the search takes
    /// shards' write locks), the `searches`-th: the first takes only idle
    /// keys (as an insert's sweep does), the second any fresh one. Returns
    /// the searches to count as done: a search that evicted counts; one
    /// that saw only keys not idle enough leaves the second search to do (a
    /// search that saw no fresh key would find none again: both done).
    fn search_room(&self, shard: usize, searches: u32) -> u32 {
        let idle = if searches == 0 {
            IDLE_BEFORE_EVICTION
        } else {
            0
        };
        let (evicted, saw_fresh) = self.make_room(shard, idle);
        if evicted > 0 {
            searches + 1
        } else if saw_fresh {
            // Nothing idle, but fresh keys: next time round, any fresh key.
            1
        } else {
            // Nothing fresh: next time round, the overflow state.
            2
        }
    }

    /// Inserts the key of `entry` (room reserved) with a new state decided
    /// at `now`: kept if it admits, dropped if it denies (a denied new state
    /// is unchanged), then a sweep step. `None`, with the reservation given
    /// back, if the overflow state has moved on to a newer record: ask again.
    fn insert_reserved<A: Answer<L>>(
        &self,
        entry: VacantEntry<'_, K, L::State, S>,
        answer: A,
        shard: usize,
        n: u32,
        now: u64,
    ) -> Option<Result<A::Admitted, A::Denied>> {
        // SAFETY: `entry` holds the shard's write lock.
        let record = unsafe { self.default.load_unprotected() };
        let still_current = || self.default.is_current(record);
        // Tagged with the record read under the write lock: a
        // reconfiguration that published a newer one visits this
        // shard after us (see `Keyed::settle_all`).
        let view = record.view(&still_current);
        let Some(state) = self.new_state(&view, now) else {
            drop(entry);
            self.sweeper.release(1);
            return None;
        };
        let outcome = match ask(answer, &view, &state, now, n) {
            Ok(Ok(admitted)) => {
                drop(entry.insert(state));
                Ok(admitted)
            }
            Ok(Err(denied)) => {
                drop(entry);
                self.sweeper.release(1);
                Err(denied)
            }
            // Cannot happen (the state has the record's tag), but
            // retrying is always correct.
            Err(_stale) => {
                drop(entry);
                self.sweeper.release(1);
                return None;
            }
        };
        self.sweep_step(shard, STEP, IDLE_BEFORE_EVICTION);
        Some(outcome)
    }

    /// The state a key gets when it is inserted, decided at `now`: a fresh
    /// one, unless the overflow state is not fresh at the floor; then a fork
    /// of the overflow state. `None` if the view is stale.
    ///
    /// Why: a key may have been decided by the overflow state (at the cap)
    /// before it got a state of its own, and nothing remembers which keys
    /// were. Starting it fresh would let it take its whole bound again on top
    /// of what it took through the overflow (for example: capacity 2, 1 per
    /// 10 ns, one key allowed: a second key took 2 through the overflow at 0
    /// and, once the first was evicted at 10, 2 more on a fresh bucket: 4 in
    /// `[0, 10]` against 3). The overflow state holds every such key's
    /// admissions and more, so a key that starts from it stays within its own
    /// bound. While the cap has not been hit recently the overflow is fresh at
    /// the floor and every new key starts exactly fresh: eviction changes
    /// nothing. A key inserted while the overflow still refills starts as
    /// indebted as the overflow — stricter, never looser.
    pub(super) fn new_state(&self, view: &View<'_, L::Config>, now: u64) -> Option<L::State> {
        if self.overflow_is_fresh(view)? {
            Some(L::fresh(view.tag))
        } else {
            L::fork(view, &self.overflow, now)
        }
    }

    /// Whether the overflow state decides as a fresh one at every time a
    /// request can still be decided at (from the floor on); `None` if the
    /// view is stale.
    pub(super) fn overflow_is_fresh(&self, view: &View<'_, L::Config>) -> Option<bool> {
        // Relaxed: a lower bound on later decision times; a stale value only
        // makes this answer `false` more often (a fork of a fresh-at-now
        // state, which decides as a fresh one from then on).
        L::is_fresh(view, &self.overflow, self.floor.load(Ordering::Relaxed))
    }

    /// Examines up to `budget` buckets of shard `shard` from its cursor and
    /// removes the states idle for `idle` (fresh ones if 0); returns how many
    /// it removed, how many it examined, and how many fresh ones it kept.
    fn sweep_step(&self, shard: usize, budget: usize, idle: u64) -> (usize, usize, usize) {
        let mut table = self.map.write(shard);
        // Relaxed: only spreads sweeps over the table; any value is correct.
        let start =
            self.sweeper.cursors[shard].fetch_add(budget as u64, Ordering::Relaxed) as usize;
        let buckets = table.buckets();
        let examined = budget.min(buckets);
        let (evicted, kept_fresh) = evict_fresh!(
            self,
            table,
            (0..examined).map(|i| (start + i) & (buckets - 1)),
            idle
        );
        (evicted, examined, kept_fresh)
    }

    /// Looks for keys to evict at the cap (idle for `idle`, or fresh if 0):
    /// the key's own shard first, then the others in rotation, `ROOM` buckets
    /// at most; returns how many it evicted, and whether it passed over fresh
    /// keys that were not idle.
    fn make_room(&self, own: usize, idle: u64) -> (usize, bool) {
        let shards = self.map.shard_count();
        // Relaxed: spreads searches over the shards; any value is correct.
        let next = self.sweeper.counters.room.fetch_add(1, Ordering::Relaxed) as usize;
        let mut budget = ROOM;
        let mut saw_fresh = false;
        for shard in search_order(own, next, shards) {
            let (evicted, examined, kept_fresh) = self.sweep_step(shard, budget, idle);
            budget -= examined;
            saw_fresh |= kept_fresh > 0;
            if evicted > 0 || budget == 0 {
                return (evicted, saw_fresh);
            }
        }
        (0, saw_fresh)
    }

    /// Removes every fresh key now, visiting the whole map (O(keys), one shard
    /// at a time under its write lock); returns how many it removed. Not needed
    /// for bounded memory — inserts sweep as they go — but frees the keys of a
    /// map that stopped growing.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::keyed::{BucketConfig, Keyed};
    /// use tollgate::{ManualClock, Rate, TokenBucket};
    ///
    /// let clock = ManualClock::new();
    /// let cfg = BucketConfig::new(1, Rate::per_second(1)).unwrap();
    /// let per_key = Keyed::<u32, TokenBucket<ManualClock>>::with_clock(cfg, clock.clone());
    /// per_key.try_acquire(&1).unwrap();
    /// assert_eq!(per_key.sweep(), 0); // still refilling
    /// clock.advance(Duration::from_secs(1));
    /// assert_eq!(per_key.sweep(), 1);
    /// ```
    ///
    /// Bounded memory: eviction of fresh keys, amortised over inserts, and the
    /// hard cap on the number of keys.
    ///
    /// # Eviction
    ///
    /// A key's state is *fresh* when it decides, now and at every later time,
    /// exactly as a new state would (a full bucket with nothing to refill; an
    /// empty leaky bucket; a shaper whose schedule has ended; a warm-up key idle
    /// long enough to be cold again; a log whose stamps have all left the
    /// window; a window that counted nothing in the current window). Such a key is removed; if it
    /// comes back, it gets a new state and cannot tell the difference. The property
    /// test in `tests/integration/keyed.rs` runs random operations against a keyed limiter that
    /// sweeps after every request and one that never evicts, and checks they agree
    /// on every decision, retry-after and snapshot.
    ///
    /// Three details make "cannot tell" exact rather than approximate:
    ///
    /// * Freshness is judged at the limiter's *time floor* (see
    ///   [`FLOOR_STEP`](super::FLOOR_STEP)), read under the shard's write lock, so
    ///   no request holds the state while it is removed. Any request that later
    ///   finds the key missing takes the same lock after, so its own load of the
    ///   floor returns that value or a later one, and it decides at a time at or
    ///   after it: a clock that steps back cannot see the new state differ from
    ///   the evicted one.
    /// * The floor never moves because of an eviction: it follows the requests'
    ///   readings (in steps) and explicit sweeps, which are the same whether a key
    ///   was evicted or kept, so a backwards clock finds time standing still at
    ///   the same floor for every key either way. (It used to be the time of the
    ///   latest eviction: evicting one key then changed the decisions of others
    ///   after a backwards step — for example: key 2 got `RetryAfter(50)` then `Ok`
    ///   with key 1 evicted, `RetryAfter(150)` and `RetryAfter(50)` without — and
    ///   a retry-after measured from the floor rather than the reading was short.)
    /// * All keys share the keyed limiter's time origin, so a fixed window's
    ///   windows stay aligned to the same boundaries however often its key is
    ///   recreated.
    ///
    /// # Amortised, incremental, no background thread
    ///
    /// Each shard of the map has a cursor. Every insert of a new key, after
    /// releasing the shard's lock, takes it again for writing and examines the
    /// next `STEP` (8) buckets of that shard's table from the cursor, removing
    /// *idle* states: fresh at the floor and already fresh
    /// [`IDLE_BEFORE_EVICTION`] (about a second) before it. The cost per insert
    /// is O(1) (a few control bytes and words), no request ever scans the map,
    /// and the sweep keeps pace with churn: a shard of `B` buckets is fully swept
    /// every `B / STEP` inserts into it, and with the table at most ~87.5 % full
    /// and never more than twice the keys it holds (hashbrown grows by doubling)
    /// that is every `< 2 × keys / STEP` inserts — the map holds at most about
    /// `live / (1 − 2/STEP)` keys, where `live` is the number of keys not yet
    /// idle.
    ///
    /// Why idle and not merely fresh: a key whose limit is far above its use is
    /// fresh a moment after each request, and sweeping such keys turned a busy
    /// map's requests into inserts — each swept key came back with its next
    /// request and swept more (see [`IDLE_BEFORE_EVICTION`]). [`Keyed::sweep`]
    /// and the search for room at the cap (below, after a first search for idle
    /// keys) still take every fresh key.
    ///
    /// Lookups of existing keys never sweep. A map that stops receiving new keys
    /// keeps its stale keys (it is not growing either); [`Keyed::sweep`] removes
    /// them all at once for a caller that wants the memory back, and
    /// [`Keyed::shrink_to_fit`] returns the table memory.
    ///
    /// # The cap
    ///
    /// The number of resident keys never exceeds [`Keyed::max_keys`]: a new key
    /// reserves its place in a counter before it is inserted. At the cap, the new
    /// key first tries to make room: it sweeps its own shard further, then other
    /// shards in rotation, up to `ROOM` (128) buckets in all (a bounded cost, paid only
    /// by new keys at the cap); if that finds nothing fresh — every key there is in active use — the request is decided
    /// by the *overflow* state: one state with the default configuration, shared by
    /// every key that could not get its own. Existing keys keep working as before;
    /// new callers share one limit until room appears; memory stays bounded. The
    /// flood test in `tests/keyed_flood.rs` sends millions of distinct keys and
    /// checks the number of keys and the bytes allocated.
    ///
    /// What holds at the cap: **every key keeps its own bound**, over all its
    /// admissions, whether decided by its own state or by the overflow state.
    /// Nothing remembers which keys the overflow decided, so a key inserted while
    /// the overflow state is not fresh (at the floor) starts from a copy of it
    /// (`Keyable::fork`): the overflow holds every overflow admission of every
    /// key, so the copy is at least as indebted as the key's own history. And a
    /// request decided by the overflow holds its key's shard write lock (a vacant
    /// entry) while it decides, as an insert of that key does while it copies, so
    /// no overflow admission of a key can fall between the copy and the key's
    /// first request on its own state. (Before, a key could take its bound through
    /// the overflow and again on a fresh state — for example: capacity 2, 1 per
    /// 10 ns, one key allowed: 4 permits in `[0, 10]` against 3.) The price: while
    /// the cap is being hit, new and returning keys can be stricter than their own
    /// history requires; once the overflow has refilled, new keys start exactly
    /// fresh again and eviction is exact.
    pub fn sweep(&self) -> usize {
        // An explicit sweep is a clock reading like a request's: it moves the
        // floor up to it (whatever the step), and keys are judged there.
        // Relaxed: see `Keyed::read_clock`.
        self.floor.fetch_max(self.timeline.now(), Ordering::Relaxed);
        let mut evicted = 0;
        for shard in 0..self.map.shard_count() {
            let mut table = self.map.write(shard);
            let buckets = table.buckets();
            evicted += evict_fresh!(self, table, 0..buckets, 0).0;
        }
        evicted
    }

    /// Keys removed by eviction so far.
    ///
    /// ```
    /// # use tollgate::keyed::{BucketConfig, Keyed};
    /// # use tollgate::{Rate, TokenBucket};
    /// let per_key = Keyed::<u32, TokenBucket>::new(BucketConfig::new(5, Rate::per_second(5)).unwrap());
    /// assert_eq!(per_key.evicted(), 0);
    /// ```
    pub fn evicted(&self) -> u64 {
        self.sweeper.counters.evicted.load(Ordering::Relaxed)
    }

    /// Requests decided by the shared overflow state because the map was at
    /// its cap.
    ///
    /// ```
    /// use tollgate::keyed::{BucketConfig, Keyed};
    /// use tollgate::{Rate, TokenBucket};
    ///
    /// let cfg = BucketConfig::new(5, Rate::per_hour(5)).unwrap();
    /// let per_key = Keyed::<u32, TokenBucket>::new(cfg).with_max_keys(1);
    /// per_key.try_acquire(&1).unwrap();
    /// per_key.try_acquire(&2).unwrap(); // no room: shares the overflow bucket
    /// assert_eq!((per_key.len(), per_key.overflowed()), (1, 1));
    /// ```
    pub fn overflowed(&self) -> u64 {
        self.sweeper.counters.overflowed.load(Ordering::Relaxed)
    }

    /// Gives the hash tables' unused memory back (tables never shrink by
    /// themselves). Locks each shard in turn; run [`sweep`](Keyed::sweep) first.
    ///
    /// ```
    /// # use tollgate::keyed::{BucketConfig, Keyed};
    /// # use tollgate::{Rate, TokenBucket};
    /// let per_key = Keyed::<u32, TokenBucket>::new(BucketConfig::new(5, Rate::per_second(5)).unwrap());
    /// per_key.sweep();
    /// per_key.shrink_to_fit();
    /// ```
    pub fn shrink_to_fit(&self) {
        self.map.shrink_to_fit();
    }
}
