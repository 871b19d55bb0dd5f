//! The one door to the concurrency primitives: atomics (here), locks
//! ([`lock`]), epoch-protected pointers ([`epoch`]), the 128-bit atomic and
//! the ways a thread waits ([`wait`]), and who the calling thread is
//! ([`thread`]: the stripe hint and an exclusive thread number, the OS's
//! under `std`, the model thread's under loom).
//!
//! Every one of them in tollgate is imported through this module: `std`'s (or
//! parking_lot's, crossbeam-epoch's, portable-atomic's) normally, loom's or a
//! loom-visible stand-in when the crate is built with `RUSTFLAGS="--cfg loom"`.
//! The algorithms are therefore model-checked as written, not as a copy (the
//! pattern of tokio's `src/loom/` and crossbeam's `primitive` modules). The
//! choice between the two is made here, whole module by whole module, and
//! nowhere else: no file outside `src/sync/` says `cfg(loom)` to pick a
//! primitive.
//!
//! `sync` stands on the ground floor: it imports nothing from the rest of the
//! crate, so every other module may use it.
//!
//! Outside it (and in `thread`, whose state is the OS's, not a model's),
//! `std::sync` appears only where loom's types cannot serve and there is
//! nothing for a model to order: process-wide `static`s (the stripe hint's
//! round-robin counter, the registry of exclusive thread numbers behind
//! `Counted`'s cells, the cached clock's reading; loom's primitives cannot
//! be `static`s) and the keyed log's immutable rule list (a `std` `Arc`
//! of a slice, which loom's `Arc` cannot hold).
//!
//! The switches of the known-bad variants the models must catch are here
//! too, in `fault`: one `Fault` per variant, the tests' `inject` and the
//! algorithms' `injected`, a constant `false` outside loom (each known-bad
//! branch compiles away). So are the other things a model needs built
//! differently: the sizes a model walks (`sized`: the keyed map's shards and
//! reader lines) and the store loom must run as a swap (`store_as_swap`).
//! No file outside `src/sync/` says `cfg(loom)` but the crate root, which
//! exports `fault` to the loom models.

mod epoch;
#[cfg(loom)]
pub mod fault;
#[cfg(not(loom))]
pub(crate) mod fault;
mod lock;
pub(crate) mod park;
pub(crate) mod thread;
mod wait;
#[cfg(loom)]
mod wide;

pub(crate) use epoch::{Guard, MaybeShared, Shared, pin};
pub(crate) use lock::{
    ConstPtr, MutPtr, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard, UnsafeCell,
};
pub(crate) use wait::Backoff;

/// A structure's size: `model` under loom, where a model needs few slots to
/// reach both the shared and the separate case (two shards, two lines of
/// reader slots: one per spawned thread), else `real()`.
#[inline]
pub(crate) fn sized(model: usize, real: impl FnOnce() -> usize) -> usize {
    #[cfg(loom)]
    {
        let _ = real;
        model
    }
    #[cfg(not(loom))]
    {
        let _ = model;
        real()
    }
}

/// A store that loom runs as a swap (whose value is discarded). loom ends a
/// release sequence at a store where the memory model may let a later
/// read-modify-write continue it, so a model of a store can miss an edge the
/// program has; a caller uses this only where it has shown that the swap and
/// the store have the same happens-before (the sliding log's `stamp_entry`
/// says why for its entries). A normal build stores.
#[inline(always)]
pub(crate) fn store_as_swap(slot: &AtomicU64, word: u64, order: Ordering) {
    #[cfg(not(loom))]
    slot.store(word, order);
    #[cfg(loom)]
    let _ = slot.swap(word, order);
}

#[cfg(not(loom))]
pub(crate) use std::sync::Arc;
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicU64, Ordering};

#[cfg(loom)]
pub(crate) use loom::sync::Arc;
#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU64, Ordering};

// Warm-up's and the shaper's two-word state: cmpxchg16b through
// portable-atomic under std; loom has no 128-bit atomic, so a loom-visible
// stand-in (see `wide`).
#[cfg(not(loom))]
pub(crate) use portable_atomic::AtomicU128;
#[cfg(loom)]
pub(crate) use wide::LoomAtomicU128 as AtomicU128;

// The keyed map's shards (`keyed::map`): flags, counters and reader slots.
#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicUsize};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicUsize};

/// A `SeqCst` fence in the loom build only, between the store and the load of
/// a store-load pair whose accesses are each `SeqCst` (the keyed map's biased
/// lock).
///
/// loom regards `SeqCst` loads, stores and read-modify-writes as `AcqRel`
/// (its README, "Unsupported features"), which does not give the
/// exclusion's store-load pairs their order; `fence(SeqCst)` it does model.
/// So under loom each pair gets a `SeqCst` fence between its store and its
/// load, which in C11 orders the pair as the `SeqCst` accesses alone do in
/// the normal build. Without the fences the models fail at once: they show
/// that acquire/release is not enough, not that `SeqCst` accesses are.
#[inline(always)]
pub(crate) fn loom_seq_cst_fence() {
    #[cfg(loom)]
    loom::sync::atomic::fence(Ordering::SeqCst);
}
