//! Where a limiter's state word lives: every direct limiter's, every locking
//! twin's and every key's. One trait, [`StateCell`], and two homes: an atomic
//! updated by the crate's one compare-and-swap loop ([`AtomicCell`]), and the
//! same word under a mutex ([`LockedCell`], the locking twins'). Both are
//! generic over the word's width ([`Word`]: one `u64`, or two words changed
//! as a whole in one `u128`, the warm-up's and the shaper's), and the atomic
//! one over the orderings its owner needs ([`Orders`]: [`Alone`] for a word
//! that is the whole state, [`Published`] for a keyed word that carries a
//! configuration record with it, [`Opening`] for a sliding window's pool as
//! it opens a sub-window, [`Charging`] for the keyed window's pool as an
//! admission charges one). The loop itself is [`update`], which the striped,
//! leased and sliding limiters also run on the bare atomics they keep beside
//! other read-modify-writes.
//!
//! [`Home`] is the choice between the two as a type parameter ([`Atomic`] or
//! [`Locked`]): a limiter with a locking twin is one generic type over it.
//!
//! Neither pads: a direct limiter is one per use and keeps its cell on its own
//! cache line (`CachePadded` around the cell, where it holds it); keys are
//! many, and a line per key would cost 128 bytes where the word needs 8.
//!
//! The types are `pub` in a private module only because the keyed kinds name
//! them as their sealed `Keyable::State`, and the twins' generic types take a
//! `Home`; no public path reaches them.

use std::fmt;
use std::marker::PhantomData;
use std::ops::{BitAnd, BitOr, Not};

use crate::sync::{AtomicU64, AtomicU128, Backoff, Mutex, Ordering};

/// Where a state word lives. `update` runs a decision on the current word and
/// stores the new word only if the decision admits; a refusal writes nothing.
#[allow(unreachable_pub)] // sealed: public only as a bound of the concurrency limit's home
pub trait StateCell: Send + Sync {
    /// The word's width.
    type Word: Word;

    fn new(initial: Self::Word) -> Self;

    /// The current word, for decisions that do not write (snapshots).
    fn load(&self) -> Self::Word;

    /// Applies `decide` to the current word until its result is stored or it
    /// refuses; returns the word stored. `decide` may run several times (the
    /// atomic cell retries after a lost race), so it must be a pure function
    /// of the word it is given.
    fn update<E>(
        &self,
        decide: impl FnMut(Self::Word) -> Result<Self::Word, E>,
    ) -> Result<Self::Word, E>;
}

/// A state word's width: `u64`, or `u128` for two words changed only as a
/// whole (the warm-up's `next << 64 | spent`, the shaper's `end << 64 | last
/// start`). Implemented here for those two; the module is private, so
/// nowhere else.
///
/// The bit operations and `From<u64>` are the keyed layer's: bit 63 is the
/// tag in both widths (of the low word in a `u128`; see `kind::TAG`).
#[allow(unreachable_pub)] // sealed: public only as a bound of the cells
pub trait Word:
    Copy
    + Eq
    + fmt::Debug
    + Send
    + Sync
    + BitAnd<Output = Self>
    + BitOr<Output = Self>
    + Not<Output = Self>
    + From<u64>
    + 'static
{
    /// The atomic that holds the word (under loom, loom's, or for `u128` the
    /// facade's stand-in).
    type Atomic: AtomicWord<Self>;

    /// The word with every bit clear.
    const ZERO: Self;

    /// The word in a reservation's ticket, which holds either width.
    fn widen(self) -> u128;

    /// The word back from a ticket `widen` filled (lossless for it).
    fn narrow(wide: u128) -> Self;
}

/// The four operations the cells use of a word's atomic, under the atomics'
/// own names, so the one loop below is written once for every width.
#[allow(unreachable_pub)] // sealed: public only as a bound of `Word`
pub trait AtomicWord<W>: fmt::Debug + Send + Sync {
    fn new(word: W) -> Self;
    fn load(&self, order: Ordering) -> W;
    /// Nothing in tollgate calls it: `scripts/mutate-loom`'s blind-store
    /// mutant of the CAS loop does (a lost update must fail a model).
    #[allow(dead_code)]
    fn store(&self, word: W, order: Ordering);
    fn compare_exchange_weak(
        &self,
        current: W,
        new: W,
        success: Ordering,
        failure: Ordering,
    ) -> Result<W, W>;
}

/// `Word` for one width and `AtomicWord` for its atomic, each operation the
/// atomic's own (an inherent method wins over the trait's of the same name).
macro_rules! word {
    ($word:ty, $atomic:ty) => {
        impl Word for $word {
            type Atomic = $atomic;

            const ZERO: Self = 0;

            #[inline]
            fn widen(self) -> u128 {
                u128::from(self)
            }

            #[inline]
            fn narrow(wide: u128) -> Self {
                // A ticket holds the word its own limiter widened.
                wide as $word
            }
        }

        impl AtomicWord<$word> for $atomic {
            #[inline]
            fn new(word: $word) -> Self {
                <$atomic>::new(word)
            }

            #[inline]
            fn load(&self, order: Ordering) -> $word {
                <$atomic>::load(self, order)
            }

            fn store(&self, word: $word, order: Ordering) {
                <$atomic>::store(self, word, order)
            }

            #[inline]
            fn compare_exchange_weak(
                &self,
                current: $word,
                new: $word,
                success: Ordering,
                failure: Ordering,
            ) -> Result<$word, $word> {
                <$atomic>::compare_exchange_weak(self, current, new, success, failure)
            }
        }
    };
}

word!(u64, AtomicU64);
// `cmpxchg16b` on x86-64, `casp` on AArch64, through portable-atomic. Under
// loom, a loom mutex (`sync::wide`): every load and CAS is one loom-visible,
// linearizable step, so the models check this loop and the decisions on it.
word!(u128, AtomicU128);

/// The orderings of an [`AtomicCell`]: of the load a decision starts from (and
/// a snapshot reads), and of the CAS's success and failure. A parameter of the
/// cell type, so each owner states what its word publishes and the loop is
/// still one.
#[allow(unreachable_pub)] // sealed: public only as a bound of `AtomicCell`
pub trait Orders: fmt::Debug + Send + Sync + 'static {
    /// The first read of an update, and a snapshot's.
    const LOAD: Ordering;
    /// A CAS that stores the decision.
    const SUCCESS: Ordering;
    /// A CAS that lost a race: the word it read is decided on next.
    const FAILURE: Ordering;
}

/// The direct limiters' orderings (token bucket, fixed window, leaky bucket
/// meter, shaper, warm-up): every one `Relaxed`, and that is enough. The word
/// *is* the whole limiter state and no other memory is published through it.
/// All reads and read-modify-writes of one atomic are totally ordered by its
/// modification order, so each successful CAS is decided on the very value it
/// replaces; that is all the invariants need (a permit is a right to proceed,
/// not a handle on data).
#[derive(Debug)]
#[allow(unreachable_pub)] // sealed: public only as a parameter of `AtomicCell`
pub struct Alone;

impl Orders for Alone {
    // Relaxed: the decision only needs *a* value of the word (a snapshot, a
    // point-in-time read of it); the CAS then checks that it is still *the*
    // value, in the word's modification order.
    const LOAD: Ordering = Ordering::Relaxed;
    // Relaxed: the swap is the admission and publishes nothing else.
    const SUCCESS: Ordering = Ordering::Relaxed;
    // Relaxed: the fresh value is all the retry needs.
    const FAILURE: Ordering = Ordering::Relaxed;
}

/// The keyed words' orderings (`kind::one_word`, `kind::two_word`): a word
/// carried over to a newer configuration record (published `Release`, see
/// `kind::reconfig`) must be seen together with that record, so not the
/// direct limiters' `Relaxed`. On x86 the same plain load and `lock cmpxchg`.
///
/// For the 128-bit keyed words (the keyed shaper's and warm-up's), the loom
/// stand-in is a loom mutex, which synchronises more than these ask: their
/// models check the loop, not these orderings; the 64-bit keyed words' models
/// (`reconfigure`, `combined`) check these.
#[derive(Debug)]
#[allow(unreachable_pub)] // sealed: public only as a parameter of `AtomicCell`
pub struct Published;

impl Orders for Published {
    // Acquire: a carried-over word is seen with the record it was carried to.
    const LOAD: Ordering = Ordering::Acquire;
    // AcqRel: Release publishes a carry-over with its record; Acquire as in
    // `LOAD`.
    const SUCCESS: Ordering = Ordering::AcqRel;
    // Acquire, as `LOAD`: the word the lost race returns is decided on next.
    const FAILURE: Ordering = Ordering::Acquire;
}

/// The sliding windows' pool words (`sliding_window::approx`'s and the
/// striped window's opening of a sub-window): a CAS that opens a window
/// publishes the finished window's count, written (by `fetch_max`) just
/// before it into memory beside the word, and whoever decides on the word
/// reads that memory on its strength.
#[derive(Debug)]
#[allow(unreachable_pub)] // sealed: public only as a parameter of the loop
pub struct Opening;

impl Orders for Opening {
    // Acquire: pairs with the Release CAS that opened the word's window (or
    // a later one): every pool change is a read-modify-write, so that CAS
    // heads a release sequence later changes do not break, and the counts it
    // published are visible to the decision.
    const LOAD: Ordering = Ordering::Acquire;
    // Release: a CAS that opens a window publishes the count written just
    // before it (one that does not open costs nothing more on x86, and keeps
    // one rule).
    const SUCCESS: Ordering = Ordering::Release;
    // Acquire, as `LOAD`: the word the lost race returns is decided on next.
    const FAILURE: Ordering = Ordering::Acquire;
}

/// The keyed sliding window's pool word (`kind::sliding`) as an admission
/// changes it: the CAS that charges the newest sub-window publishes nothing
/// but the word, while the word it decides on may be an opener's or a
/// carry-over's, whose history writes the decision (or the denial's
/// retry-after) reads. The pool's other changes take other orderings: the
/// opening CAS `Opening`'s, a refund's and the seal `Alone`'s.
#[derive(Debug)]
#[allow(unreachable_pub)] // sealed: public only as a parameter of the loop
pub struct Charging;

impl Orders for Charging {
    // Acquire: the pool every decision starts from (`WindowCell::load`,
    // which waits out a seal) pairs with the opener's Release CAS (the
    // history entries it wrote before leaving a sub-window) and with the
    // carry-over's Release store (the history it installed).
    const LOAD: Ordering = Ordering::Acquire;
    // Relaxed: an admission publishes nothing but the word (the count an
    // opener later copies into the history is read from the word itself).
    const SUCCESS: Ordering = Ordering::Relaxed;
    // Acquire: the pool found may have moved to a later sub-window, whose
    // history this thread may read next (its entries were published by that
    // opener's Release).
    const FAILURE: Ordering = Ordering::Acquire;
}

/// The lock-free cell: the word's atomic, updated by a compare-and-swap loop
/// with the orderings `O`. Unpadded (see the module docs).
#[derive(Debug)]
#[allow(unreachable_pub)] // sealed: public only as `Kind::State`
pub struct AtomicCell<W: Word, O = Alone>(W::Atomic, PhantomData<fn() -> O>);

impl<W: Word, O: Orders> StateCell for AtomicCell<W, O> {
    type Word = W;

    fn new(initial: W) -> Self {
        AtomicCell(W::Atomic::new(initial), PhantomData)
    }

    #[inline]
    fn load(&self) -> W {
        // `O::LOAD`: see `Orders`.
        self.0.load(O::LOAD)
    }

    #[inline]
    fn update<E>(&self, decide: impl FnMut(W) -> Result<W, E>) -> Result<W, E> {
        // Every lost race is stepped aside from (see `update_from`).
        update::<O, W, E>(&self.0, decide, |_, _| Loss::StepAside)
    }
}

/// What a lost race costs the loser, the one thing owners of the loop differ
/// in beyond their orderings (`update`'s `lost`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Loss {
    /// Wait a moment before deciding again (`sync::Backoff::wait`).
    StepAside,
    /// Decide again at once: the owner keeps its hot path free of the
    /// clock, or the loss was not to another thread.
    DecideAgain,
}

/// The crate's one compare-and-swap loop, on a word kept in a bare atomic:
/// [`AtomicCell`]'s `update`, for owners that also change the word by other
/// read-modify-writes (a swap, a `fetch_and`, a `fetch_max`) or keep it
/// beside others with other orderings. Applies `decide` to the word (read
/// with `O::LOAD`) until its result is stored or it refuses; returns the word
/// stored. After each failed CAS, `lost(tried, actual)` (the word decided on
/// and the word found) says whether to step aside before deciding again.
///
/// `decide` may run several times, so it must decide on the word it is
/// given alone; anything else it reads must be something the word's
/// orderings make valid for that word, and anything it writes must be safe
/// to write again (the sliding windows publish a finished window's count by
/// `fetch_max` before the CAS that opens the next).
#[inline]
pub(crate) fn update<O: Orders, W: Word, E>(
    atomic: &W::Atomic,
    decide: impl FnMut(W) -> Result<W, E>,
    lost: impl FnMut(W, W) -> Loss,
) -> Result<W, E> {
    // `O::LOAD`: the decision starts from this value; the CAS checks it is
    // still the current one.
    update_from::<O, W, E>(atomic, atomic.load(O::LOAD), decide, lost)
}

/// [`update`], starting from `current`, a value of the word the caller has
/// already read (with the ordering its own argument needs; `O::LOAD` is not
/// used).
#[inline]
pub(crate) fn update_from<O: Orders, W: Word, E>(
    atomic: &W::Atomic,
    mut current: W,
    mut decide: impl FnMut(W) -> Result<W, E>,
    mut lost: impl FnMut(W, W) -> Loss,
) -> Result<W, E> {
    let mut backoff = Backoff::new();
    loop {
        let next = decide(current)?;
        // Weak CAS: a spurious failure just costs one more decision, on the
        // same word. `O::SUCCESS` / `O::FAILURE`: see `Orders`.
        match atomic.compare_exchange_weak(current, next, O::SUCCESS, O::FAILURE) {
            Ok(_) => return Ok(next),
            Err(actual) => {
                let tried = std::mem::replace(&mut current, actual);
                if lost(tried, actual) == Loss::StepAside {
                    // Lost a race: step aside for a moment (32 ns, doubling
                    // per loss, at most about a microsecond: time, not a
                    // count of spin hints, so the same on every CPU; see
                    // `sync::Backoff`) before deciding again. The winner's
                    // next update then finds the line still in its own
                    // cache instead of both cores trading it on every
                    // attempt. Bounded: it never blocks, and a thread that
                    // never loses never waits.
                    backoff.wait();
                }
            }
        }
    }
}

/// The locking twins' cell: the same word under a mutex (parking_lot's; 16
/// bytes for a `u64`). Unpadded (see the module docs).
#[derive(Debug)]
#[allow(unreachable_pub)] // sealed: public only as `Kind::State`
pub struct LockedCell<W>(Mutex<W>);

impl<W: Word> StateCell for LockedCell<W> {
    type Word = W;

    fn new(initial: W) -> Self {
        LockedCell(Mutex::new(initial))
    }

    #[inline]
    fn load(&self) -> W {
        *self.0.lock()
    }

    #[inline]
    fn update<E>(&self, mut decide: impl FnMut(W) -> Result<W, E>) -> Result<W, E> {
        let mut word = self.0.lock();
        *word = decide(*word)?;
        Ok(*word)
    }
}

/// Where a limiter keeps its word, as a type parameter: [`Atomic`] or
/// [`Locked`]. A limiter with a locking twin is one generic type over it,
/// named by two aliases (`ConcurrencyLimit` and `LockingConcurrencyLimit`,
/// `TokenBucket` and `LockingTokenBucket`, ...), so that the twins share
/// every method and decision by construction, not by copy. Sealed: this
/// module is private, so no one else can implement it.
#[allow(unreachable_pub)] // sealed: public only as the limiters' parameter
pub trait Home: Send + Sync + 'static {
    /// The cell of a `W` word: an atomic whose updates take the orderings
    /// `O`, or the word under a mutex (which orders everything, so it has
    /// no use for `O`).
    type Cell<W: Word, O: Orders>: StateCell<Word = W> + fmt::Debug;

    /// The limiter's name in `Debug` output: its alias's, `atomic` or
    /// `locking`.
    fn name(atomic: &'static str, locking: &'static str) -> &'static str;
}

/// The lock-free home: the word in an atomic, changed by compare-and-swap
/// ([`AtomicCell`]).
#[derive(Debug)]
#[allow(unreachable_pub)] // sealed: public only as the limiters' parameter
pub enum Atomic {}

/// The locking twins' home: the same word under a mutex ([`LockedCell`]).
#[derive(Debug)]
#[allow(unreachable_pub)] // sealed: public only as the limiters' parameter
pub enum Locked {}

impl Home for Atomic {
    type Cell<W: Word, O: Orders> = AtomicCell<W, O>;

    fn name(atomic: &'static str, _: &'static str) -> &'static str {
        atomic
    }
}

impl Home for Locked {
    type Cell<W: Word, O: Orders> = LockedCell<W>;

    fn name(_: &'static str, locking: &'static str) -> &'static str {
        locking
    }
}
