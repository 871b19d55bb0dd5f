//! The keyed limiter's map: shards of hashbrown tables, each under a
//! reader-biased lock, so that looking up an existing key writes no memory
//! that another core reads.
//!
//! # Why not a plain reader-writer lock
//!
//! A reader-writer lock's read side is a read-modify-write on the lock's
//! word. Every core that looks up a key of that shard writes the same cache
//! line, so two cores on one hot key (or on a million keys over a handful of
//! shards) pass the line back and forth on every lookup: that, not the hash
//! or the probe, was most of a keyed check's cost at 2 threads (dashmap,
//! which tollgate used before, and governor's keyed limiter both pay it).
//!
//! # The biased shard lock
//!
//! The shard lock here is a reader-writer lock with a second, *biased* read
//! side (after Dice and Kogan's BRAVO, "Biased Locking for Reader-Writer
//! Locks", USENIX ATC 2019). Each map has a small table of *reader slots*,
//! one cache line per thread group; a thread's line is its stripe hint
//! (`sync::thread::thread_hint`, the one the striped limiters use: the rank of the
//! CPU it ran on when it first asked, or when it last found its slot taken),
//! and the slot within the line is the shard's index modulo 8. A
//! reader announces itself by a compare-and-swap of its slot from 0 to
//! `shard + 1` — a write to a line that threads on other cores do not write
//! (their hints differ) — and then checks that the shard is still
//! biased. A writer takes the underlying lock, clears the bias, and waits
//! until no slot names its shard. The underlying lock (parking_lot's) serves
//! readers while the bias is off, and writers always.
//!
//! | state of shard `s` | a reader | a writer |
//! |---|---|---|
//! | biased, no writer | CAS own slot 0 → `s+1`, bias still set: reads; stores 0 when done | takes the lock, clears the bias, waits for every slot ≠ `s+1` |
//! | biased, slot taken (another thread of the line, another shard) | takes the read lock | as above |
//! | bias cleared | takes the read lock; the `rebias_after`-th such read since the last write sets the bias again | takes the lock; nothing to wait for |
//!
//! A reader that announced itself and then finds the bias cleared undoes its
//! slot and takes the read lock (the writer may be waiting for that slot).
//!
//! **Why it excludes.** The reader's slot CAS and its bias load, and the
//! writer's bias swap and its slot loads, are `SeqCst`: in their single total
//! order, either the reader's bias load comes first — then its slot CAS came
//! before the writer's swap, and the writer's slot load sees `s + 1` and
//! waits — or the writer's swap comes first, and the reader sees the bias
//! cleared (only a reader holding the read lock sets it again, which no
//! reader can do while the writer holds the lock). This is the store-load
//! pattern that needs sequential consistency: with acquire/release alone both
//! could read the other's old value.
//!
//! **What loom checks.** The models (`loom-tests/tests/keyed_eviction.rs` and
//! every keyed model) run the keyed code on this map, with loom's
//! reader-writer lock underneath and the tables in loom cells, which report a
//! table read concurrent with a write. loom regards `SeqCst` accesses as
//! `AcqRel` (its README, "Unsupported features"), so under loom each
//! store-load pair also has a `fence(SeqCst)`, which it does model (see
//! `loom_seq_cst_fence`); without those fences the models fail at the first
//! interleaving, which shows that acquire/release is not enough. Two
//! known-bad locks, switched on in loom builds only, are caught: readers that
//! skip the second bias check (`Fault::UncheckedBias`) and writers that do
//! not wait for the readers in their slots (`Fault::UnwaitedReaders`).
//! That the accesses' own `SeqCst` suffices without the fence is the C11
//! rule for `SeqCst` operations, which loom cannot show.
//!
//! **Why a fast reader sees the last write.** The bias is set (with
//! `Release`) only by a reader holding the read lock, which the last writer
//! released; a fast reader's `SeqCst` (so acquiring) bias load reads that
//! store. A writer's slot load acquires the reader's `Release` store of 0, so
//! the reader's reads come before the writer's writes.
//!
//! **When the bias comes back.** A write costs a scan of one slot per line
//! (16 lines on a 2-core machine) when it clears the bias. To keep that cost
//! small against the lookups it speeds up, a shard is rebiased only after
//! `rebias_after` reads through the lock since its last write — four per
//! line, so a revocation's scan is at most a quarter of the slow reads that
//! paid for it. A flood of new keys keeps its shards unbiased and costs what
//! a plain reader-writer lock costs; a steady set of keys reads without any
//! shared write.
//!
//! Everything the keyed layer builds on its shard locks — an eviction never
//! erases a state a request is deciding on, the floor argument of
//! `Keyed::decision_time`, and reconfiguration's "every shard visited" — holds
//! as it did: this is a reader-writer lock, with a cheaper read side.

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};

use crossbeam_utils::CachePadded;
use hashbrown::HashTable;

use crate::sync::fault::{Fault, injected};
use crate::sync::thread::{refresh_thread_hint, thread_hint};
use crate::sync::{
    AtomicBool, AtomicUsize, Backoff, ConstPtr, MutPtr, Ordering, RwLock, RwLockReadGuard,
    RwLockWriteGuard, UnsafeCell, loom_seq_cst_fence,
};

/// Reader slots per line: a cache line of `usize`s. A shard's slot is its
/// index modulo this.
const SLOTS_PER_LINE: usize = 8;

/// Lines of reader slots: four per core (threads' hints are their CPUs'
/// ranks, so threads on different cores use different lines), at least 16. Under loom, two:
/// a model's two spawned threads (loom's threads 1 and 2) get one each.
fn lines() -> usize {
    crate::sync::sized(2, || {
        // The parallelism the striped limiters use, asked of the OS once per
        // process (`available_parallelism` reads cgroup files each call).
        let cores = crate::stripe::default_stripes();
        (cores * 4).next_power_of_two().max(16)
    })
}

/// Shards: as dashmap's default, four per core, a power of two (at least
/// 2). Under loom, two: enough for a model to put keys in the same shard or
/// in different ones.
fn shard_count() -> usize {
    crate::sync::sized(2, || {
        // The parallelism the striped limiters use, asked of the OS once per
        // process (`available_parallelism` reads cgroup files each call).
        let cores = crate::stripe::default_stripes();
        (cores * 4).next_power_of_two().max(2)
    })
}

/// Reads through the lock, since a shard's last write, before it is biased
/// again: four per line of slots (see the module docs). Under loom, one, so
/// that a model sees the bias cleared and set again within a few steps.
fn rebias_after(lines: usize) -> usize {
    crate::sync::sized(1, || 4 * lines)
}

/// One shard: its table, the underlying lock, and the bias.
struct Shard<K, V> {
    /// Set: readers may read without the lock, announcing themselves in their
    /// reader slot. Cleared by writers, set again by a reader holding the
    /// read lock.
    biased: AtomicBool,
    /// Reads through the lock since the last write.
    slow_reads: AtomicUsize,
    lock: RwLock<()>,
    table: UnsafeCell<HashTable<(K, V)>>,
}

/// A map of per-key states, sharded, each shard a hashbrown table under a
/// biased reader-writer lock (see the module docs).
pub(crate) struct Map<K, V, S> {
    shards: Box<[CachePadded<Shard<K, V>>]>,
    /// One line of reader slots per thread group.
    readers: Box<[CachePadded<[AtomicUsize; SLOTS_PER_LINE]>]>,
    rebias_after: usize,
    /// `64 - log2(shards)`: a shard is chosen by the hash's bits below the
    /// top 7, which hashbrown keeps for its control bytes.
    shift: u32,
    hasher: S,
}

// SAFETY: the tables are only reached through the shard locks (see `Map::read`
// and `Map::write`), so sharing the map shares `K` and `V` across threads as
// a `RwLock<HashTable<(K, V)>>` would.
unsafe impl<K: Send + Sync, V: Send + Sync, S: Sync> Sync for Map<K, V, S> {}
// SAFETY: as above; sending the map sends its keys and values.
unsafe impl<K: Send, V: Send, S: Send> Send for Map<K, V, S> {}

impl<K: Eq + Hash, V, S: BuildHasher> Map<K, V, S> {
    /// An empty map hashing with `hasher`.
    pub(crate) fn with_hasher(hasher: S) -> Self {
        let shards = shard_count();
        let lines = lines();
        Map {
            shards: (0..shards)
                .map(|_| {
                    CachePadded::new(Shard {
                        biased: AtomicBool::new(true),
                        slow_reads: AtomicUsize::new(0),
                        lock: RwLock::new(()),
                        table: UnsafeCell::new(HashTable::new()),
                    })
                })
                .collect(),
            readers: (0..lines)
                .map(|_| CachePadded::new(std::array::from_fn(|_| AtomicUsize::new(0))))
                .collect(),
            rebias_after: rebias_after(lines),
            shift: 64 - shards.trailing_zeros(),
            hasher,
        }
    }

    /// How many shards the map has.
    pub(crate) fn shard_count(&self) -> usize {
        self.shards.len()
    }

    fn shard_of(&self, hash: u64) -> usize {
        ((hash << 7) >> self.shift) as usize
    }

    /// The shard `key` lives in.
    pub(crate) fn determine_map<Q>(&self, key: &Q) -> usize
    where
        K: Borrow<Q>,
        Q: Hash + ?Sized,
    {
        self.shard_of(self.hasher.hash_one(key))
    }

    /// Read access to shard `index`: through the caller's reader slot while
    /// the shard is biased, through the read lock otherwise.
    #[inline]
    fn read(&self, index: usize) -> ReadHold<'_> {
        let shard = &self.shards[index];
        // Relaxed: a hint; the `SeqCst` load below decides.
        if shard.biased.load(Ordering::Relaxed) {
            let line = &self.readers[thread_hint() & (self.readers.len() - 1)];
            let slot = &line[index % SLOTS_PER_LINE];
            // SeqCst, with the bias load after it: the store-load pair that
            // excludes writers (module docs). A slot held by another thread
            // of this line, for any shard, sends us through the lock. One
            // CAS, not a loop (nor the crate's, `cell::update`): a claim is
            // tried once, and its loss is the lock's to decide.
            let claimed = slot
                .compare_exchange(0, index + 1, Ordering::SeqCst, Ordering::Relaxed)
                .is_ok();
            if !claimed {
                // Another thread of this line holds the slot: most likely one
                // on another CPU whose hint is stale, or ours is (threads start
                // on their parent's CPU). Take the CPU we run on now as our
                // line, so the next lookup claims a slot of its own.
                refresh_thread_hint();
            }
            if claimed {
                loom_seq_cst_fence();
                if injected(Fault::UncheckedBias) || shard.biased.load(Ordering::SeqCst) {
                    return ReadHold::Slot(SlotHold(slot));
                }
                // A writer is clearing the bias (and may be waiting for this
                // slot). Relaxed: nothing was read from the table, so there is
                // nothing to order before the writer's writes.
                slot.store(0, Ordering::Relaxed);
            }
        }
        let guard = shard.lock.read();
        // Relaxed: the count only paces rebiasing.
        if !shard.biased.load(Ordering::Relaxed)
            && shard.slow_reads.fetch_add(1, Ordering::Relaxed) + 1 == self.rebias_after
        {
            // Release: a fast reader that acquires this sees every write made
            // before we took the read lock (module docs). Set while holding
            // the read lock, so no writer is between its swap and its scan.
            shard.biased.store(true, Ordering::Release);
        }
        ReadHold::Lock(guard)
    }

    /// Exclusive access to shard `index`: the write lock, and no biased
    /// reader left in it.
    pub(crate) fn write(&self, index: usize) -> WriteGuard<'_, K, V, S> {
        let shard = &self.shards[index];
        let guard = shard.lock.write();
        // SeqCst: the store half of the exclusion (module docs); a swap so
        // that only a writer that cleared the bias pays for the scan (one
        // that found it cleared follows a writer that scanned, and no reader
        // could set it since without the read lock).
        if shard.biased.swap(false, Ordering::SeqCst) && !injected(Fault::UnwaitedReaders) {
            loom_seq_cst_fence();
            // Waits for readers still in their slots: a pause lets a
            // preempted reader run (and, under loom, the model run it).
            let mut backoff = Backoff::new();
            for line in self.readers.iter() {
                let slot = &line[index % SLOTS_PER_LINE];
                // SeqCst: the load half of the exclusion; it also acquires
                // the reader's `Release` store of 0, ordering its reads
                // before our writes.
                while slot.load(Ordering::SeqCst) == index + 1 {
                    backoff.pause();
                }
            }
        }
        // Relaxed: ordered by the write lock, like every slow read's count.
        shard.slow_reads.store(0, Ordering::Relaxed);
        WriteGuard {
            table: shard.table.get_mut(),
            hasher: &self.hasher,
            _guard: guard,
        }
    }

    /// The value for `key`, read-held while the returned reference lives.
    #[inline]
    pub(crate) fn get<Q>(&self, key: &Q) -> Option<Ref<'_, K, V>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let hash = self.hasher.hash_one(key);
        let index = self.shard_of(hash);
        let hold = self.read(index);
        let table = self.shards[index].table.get();
        // SAFETY: read-held (`hold`), so no writer changes the table while
        // `table` lives; both are moved into the `Ref`, dropped in order.
        let (_, value) = unsafe { table.deref() }.find(hash, |(k, _)| k.borrow() == key)?;
        let value: *const V = value;
        if injected(Fault::UnlockedLookups) {
            // The known-bad protocol: the hold is let go before the caller
            // decides on the state. loom's cell tracking sees the table read
            // while a writer may change it.
            drop(hold);
            return Some(Ref {
                value,
                _table: table,
                _hold: None,
            });
        }
        Some(Ref {
            value,
            _table: table,
            _hold: Some(hold),
        })
    }

    /// The key's entry, under the shard's write lock.
    pub(crate) fn entry(&self, key: K) -> Entry<'_, K, V, S> {
        let hash = self.hasher.hash_one(&key);
        let guard = self.write(self.shard_of(hash));
        match guard.find(hash, &key) {
            Some(index) => Entry::Occupied(OccupiedEntry { guard, index }),
            None => Entry::Vacant(VacantEntry { guard, key, hash }),
        }
    }

    /// Removes `key`, returning its value.
    pub(crate) fn remove<Q>(&self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let hash = self.hasher.hash_one(key);
        let mut guard = self.write(self.shard_of(hash));
        let index = guard.find(hash, key)?;
        guard.remove_at(index)
    }

    /// Gives every table's unused memory back.
    pub(crate) fn shrink_to_fit(&self) {
        for index in 0..self.shards.len() {
            self.write(index).shrink_to_fit();
        }
    }
}

/// A reader's claim on its slot; gives it back when dropped.
struct SlotHold<'a>(&'a AtomicUsize);

impl Drop for SlotHold<'_> {
    fn drop(&mut self) {
        // Release: orders the reader's reads before the writer that acquires
        // this value (module docs).
        self.0.store(0, Ordering::Release);
    }
}

/// Read access to a shard: a reader slot or the read lock.
enum ReadHold<'a> {
    Slot(#[allow(dead_code)] SlotHold<'a>),
    Lock(#[allow(dead_code)] RwLockReadGuard<'a, ()>),
}

/// A read-held value. Fields drop in order: the table pointer (which loom
/// tracks as a read) before the hold.
pub(crate) struct Ref<'a, K, V> {
    value: *const V,
    _table: ConstPtr<HashTable<(K, V)>>,
    _hold: Option<ReadHold<'a>>,
}

impl<K, V> std::ops::Deref for Ref<'_, K, V> {
    type Target = V;

    #[inline]
    fn deref(&self) -> &V {
        // SAFETY: found in the table, which no writer changes while the hold
        // lives (but for loom's known-bad unlocked lookups, which loom's cell
        // tracking reports).
        unsafe { &*self.value }
    }
}

/// A shard's table under its write lock, with no biased reader in it. Fields
/// drop in order: the table pointer before the lock.
pub(crate) struct WriteGuard<'a, K, V, S> {
    table: MutPtr<HashTable<(K, V)>>,
    hasher: &'a S,
    _guard: RwLockWriteGuard<'a, ()>,
}

impl<K: Eq + Hash, V, S: BuildHasher> WriteGuard<'_, K, V, S> {
    fn table(&self) -> &HashTable<(K, V)> {
        // SAFETY: write-held, so no other thread reads or writes the table.
        unsafe { self.table.deref() }
    }

    fn table_mut(&mut self) -> &mut HashTable<(K, V)> {
        // SAFETY: as above, and `&mut self` makes this the only reference.
        unsafe { self.table.deref() }
    }

    fn find<Q>(&self, hash: u64, key: &Q) -> Option<usize>
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        self.table()
            .find_bucket_index(hash, |(k, _)| k.borrow() == key)
    }

    /// The table's bucket count, a power of two: the eviction sweep's
    /// positions are below it.
    pub(crate) fn buckets(&self) -> usize {
        self.table().num_buckets()
    }

    /// The value in bucket `index`, if the bucket is full (`None` past the
    /// table's end, too).
    pub(crate) fn value_at(&self, index: usize) -> Option<&V> {
        self.table().get_bucket(index).map(|(_, value)| value)
    }

    /// Empties bucket `index`, returning its value if it was full.
    pub(crate) fn remove_at(&mut self, index: usize) -> Option<V> {
        let entry = self.table_mut().get_bucket_entry(index).ok()?;
        Some(entry.remove().0.1)
    }

    fn insert(&mut self, hash: u64, key: K, value: V) {
        let hasher = self.hasher;
        self.table_mut()
            .insert_unique(hash, (key, value), |(k, _)| hasher.hash_one(k));
    }

    fn shrink_to_fit(&mut self) {
        let hasher = self.hasher;
        self.table_mut().shrink_to_fit(|(k, _)| hasher.hash_one(k));
    }
}

/// A key's place in its shard, under the shard's write lock.
pub(crate) enum Entry<'a, K, V, S> {
    Occupied(OccupiedEntry<'a, K, V, S>),
    Vacant(VacantEntry<'a, K, V, S>),
}

/// A key that has a value.
pub(crate) struct OccupiedEntry<'a, K, V, S> {
    guard: WriteGuard<'a, K, V, S>,
    index: usize,
}

impl<K: Eq + Hash, V, S: BuildHasher> OccupiedEntry<'_, K, V, S> {
    /// The key's value.
    pub(crate) fn get(&self) -> &V {
        self.guard
            .value_at(self.index)
            .expect("found under the write lock, which is still held")
    }
}

/// A key without a value.
pub(crate) struct VacantEntry<'a, K, V, S> {
    guard: WriteGuard<'a, K, V, S>,
    key: K,
    hash: u64,
}

impl<'a, K: Eq + Hash, V, S: BuildHasher> VacantEntry<'a, K, V, S> {
    /// Inserts the value; the returned guard keeps the write lock.
    pub(crate) fn insert(mut self, value: V) -> WriteGuard<'a, K, V, S> {
        self.guard.insert(self.hash, self.key, value);
        self.guard
    }
}
