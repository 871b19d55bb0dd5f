//! The keyed limiter's map: dashmap, or under `--cfg loom` a stand-in whose
//! shard locks are loom's, so the models see every lock a lookup, an insert
//! and an eviction take.
//!
//! The keyed layer relies on the shard locks for more than memory safety: an
//! eviction judges a state fresh and erases it under its shard's write lock,
//! and a request decides on a state under the same shard's read lock, so an
//! eviction never erases a state that a request is admitting on (see
//! `evict`). dashmap's locks are its own atomics, invisible to loom; the
//! stand-in offers the same few calls (`get`, `entry`, `remove`, `shards`
//! and the raw table's bucket walk) over `loom::sync::RwLock`s, so that
//! protocol is model-checked with the rest of the keyed code.

#[cfg(not(loom))]
pub(crate) use dashmap::DashMap as Map;
#[cfg(not(loom))]
pub(crate) use dashmap::mapref::entry::Entry;

#[cfg(loom)]
pub(crate) use stand_in::{Entry, Map, UNLOCKED_LOOKUPS};

#[cfg(loom)]
mod stand_in {
    use std::borrow::Borrow;
    use std::hash::{BuildHasher, Hash};
    use std::ops::Deref;

    use loom::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

    /// Two shards: enough for a model to put keys in the same shard or in
    /// different ones.
    const SHARDS: usize = 2;

    /// dashmap's value wrapper, kept so the keyed code reads `.1.get()` in
    /// both builds.
    pub(crate) struct SharedValue<V>(V);

    impl<V> SharedValue<V> {
        pub(crate) fn get(&self) -> &V {
            &self.0
        }
    }

    /// One shard's table: a power-of-two number of buckets, as hashbrown's
    /// (the sweep masks its cursor with `buckets - 1`), searched linearly.
    /// An entry, boxed so that its address never moves.
    type Slot<K, V> = Box<(K, SharedValue<V>)>;

    pub(crate) struct Table<K, V> {
        slots: Vec<Option<Slot<K, V>>>,
        /// Erased entries, kept until the table drops: an entry is boxed and
        /// never freed while the map lives, so the known-bad unlocked lookup
        /// (below) reads a stale state instead of freed memory, and the
        /// models catch it by its over-admission.
        erased: Vec<Slot<K, V>>,
    }

    /// A bucket, as hashbrown's: a position, read through the table.
    pub(crate) struct Bucket<K, V> {
        slot: *const (K, SharedValue<V>),
        index: usize,
    }

    impl<K, V> Bucket<K, V> {
        /// # Safety
        /// The bucket is full and the table is neither changed nor dropped
        /// while the reference lives (hashbrown's contract).
        pub(crate) unsafe fn as_ref<'a>(&self) -> &'a (K, SharedValue<V>) {
            // SAFETY: the caller's contract.
            unsafe { &*self.slot }
        }
    }

    impl<K: Eq, V> Table<K, V> {
        fn new() -> Self {
            Table {
                slots: (0..4).map(|_| None).collect(),
                erased: Vec::new(),
            }
        }

        pub(crate) fn buckets(&self) -> usize {
            self.slots.len()
        }

        /// # Safety
        /// `index < buckets()` (hashbrown's contract; checked here anyway).
        pub(crate) unsafe fn is_bucket_full(&self, index: usize) -> bool {
            self.slots[index].is_some()
        }

        /// # Safety
        /// `index < buckets()` and the bucket is full.
        pub(crate) unsafe fn bucket(&self, index: usize) -> Bucket<K, V> {
            let slot: &(K, SharedValue<V>) = self.slots[index].as_ref().expect("a full bucket");
            Bucket { slot, index }
        }

        /// # Safety
        /// `bucket` is full and came from this table.
        pub(crate) unsafe fn erase(&mut self, bucket: Bucket<K, V>) {
            if let Some(entry) = self.slots[bucket.index].take() {
                self.erased.push(entry);
            }
        }

        fn find<Q>(&self, key: &Q) -> Option<usize>
        where
            K: Borrow<Q>,
            Q: Eq + ?Sized,
        {
            self.slots
                .iter()
                .position(|slot| slot.as_ref().is_some_and(|entry| entry.0.borrow() == key))
        }

        fn insert(&mut self, key: K, value: V) -> usize {
            let entry = Box::new((key, SharedValue(value)));
            if let Some(free) = self.slots.iter().position(Option::is_none) {
                self.slots[free] = Some(entry);
                return free;
            }
            let at = self.slots.len();
            self.slots.resize_with(2 * at, || None);
            self.slots[at] = Some(entry);
            at
        }
    }

    /// A shard: its table under a loom lock, locked as dashmap's (`write()`
    /// returns the guard itself).
    pub(crate) struct Shard<K, V>(RwLock<Table<K, V>>);

    impl<K, V> Shard<K, V> {
        pub(crate) fn write(&self) -> RwLockWriteGuard<'_, Table<K, V>> {
            self.0.write().expect("no panics while a shard is locked")
        }

        fn read(&self) -> RwLockReadGuard<'_, Table<K, V>> {
            self.0.read().expect("no panics while a shard is locked")
        }
    }

    pub(crate) struct Map<K, V, S> {
        shards: Box<[Shard<K, V>]>,
        hasher: S,
    }

    impl<K: Eq + Hash, V, S: BuildHasher> Map<K, V, S> {
        pub(crate) fn with_hasher(hasher: S) -> Self {
            Map {
                shards: (0..SHARDS)
                    .map(|_| Shard(RwLock::new(Table::new())))
                    .collect(),
                hasher,
            }
        }

        pub(crate) fn shards(&self) -> &[Shard<K, V>] {
            &self.shards
        }

        pub(crate) fn determine_map<Q>(&self, key: &Q) -> usize
        where
            K: Borrow<Q>,
            Q: Hash + ?Sized,
        {
            (self.hasher.hash_one(key) as usize) % SHARDS
        }

        pub(crate) fn get<Q>(&self, key: &Q) -> Option<Ref<'_, K, V>>
        where
            K: Borrow<Q>,
            Q: Hash + Eq + ?Sized,
        {
            let guard = self.shards[self.determine_map(key)].read();
            let index = guard.find(key)?;
            if UNLOCKED_LOOKUPS.with(std::cell::Cell::get) {
                // The known-bad protocol: the lock is dropped before the caller
                // decides on the state, so an eviction can erase it meanwhile.
                let entry: &(K, SharedValue<V>) = guard.slots[index].as_ref().expect("found");
                let value: *const V = &entry.1.0;
                drop(guard);
                return Some(Ref {
                    _guard: None,
                    value,
                });
            }
            let value: *const V = &guard.slots[index].as_ref().expect("found").1.0;
            Some(Ref {
                _guard: Some(guard),
                value,
            })
        }

        pub(crate) fn entry(&self, key: K) -> Entry<'_, K, V> {
            let guard = self.shards[self.determine_map(&key)].write();
            match guard.find(&key) {
                Some(index) => Entry::Occupied(OccupiedEntry { guard, index }),
                None => Entry::Vacant(VacantEntry { guard, key }),
            }
        }

        pub(crate) fn remove<Q>(&self, key: &Q) -> Option<(K, V)>
        where
            K: Borrow<Q>,
            Q: Hash + Eq + ?Sized,
        {
            let mut guard = self.shards[self.determine_map(key)].write();
            let index = guard.find(key)?;
            let entry = guard.slots[index].take()?;
            let (k, v) = *entry;
            Some((k, v.0))
        }

        pub(crate) fn shrink_to_fit(&self) {}
    }

    std::thread_local! {
        /// Test-only: lookups that let go of the shard's read lock before
        /// the caller decides (the known-bad protocol the eviction models must
        /// catch). Outside loom's view, and per OS thread: loom runs a
        /// model's threads on the test's own thread, so one test's setting
        /// reaches all of its model and no other test.
        pub(crate) static UNLOCKED_LOOKUPS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }

    /// A read-locked value, as dashmap's `Ref` (the lock is held while it
    /// lives, but for the known-bad unlocked lookups).
    pub(crate) struct Ref<'a, K, V> {
        /// Held, not read: the shard stays read-locked while the value is.
        _guard: Option<RwLockReadGuard<'a, Table<K, V>>>,
        /// Into a boxed entry, which stays allocated while the map lives.
        value: *const V,
    }

    impl<K, V> Deref for Ref<'_, K, V> {
        type Target = V;

        fn deref(&self) -> &V {
            // SAFETY: entries are boxed and never freed before the map (see
            // `Table::erased`), and the map outlives `'a`.
            unsafe { &*self.value }
        }
    }

    /// As dashmap's `Entry`: the shard's write lock, held until dropped.
    pub(crate) enum Entry<'a, K, V> {
        Occupied(OccupiedEntry<'a, K, V>),
        Vacant(VacantEntry<'a, K, V>),
    }

    pub(crate) struct OccupiedEntry<'a, K, V> {
        guard: RwLockWriteGuard<'a, Table<K, V>>,
        index: usize,
    }

    impl<K, V> OccupiedEntry<'_, K, V> {
        pub(crate) fn get(&self) -> &V {
            &self.guard.slots[self.index]
                .as_ref()
                .expect("held under the lock")
                .1
                .0
        }
    }

    pub(crate) struct VacantEntry<'a, K, V> {
        guard: RwLockWriteGuard<'a, Table<K, V>>,
        key: K,
    }

    impl<'a, K: Eq, V> VacantEntry<'a, K, V> {
        /// Inserts the value; the returned guard keeps the lock, as
        /// dashmap's `RefMut`.
        pub(crate) fn insert(mut self, value: V) -> RwLockWriteGuard<'a, Table<K, V>> {
            self.guard.insert(self.key, value);
            self.guard
        }
    }
}
