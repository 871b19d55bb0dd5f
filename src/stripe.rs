//! How many stripes a striped limiter has, and the stripes of the leased and
//! striped limiters with the protocol they share ([`Stripes`]). Which stripe a
//! thread uses is its hint (`sync::thread`), shared by every striped limiter.
//!
//! Striped limiters (the sliding window's leases, the sliding log's rings) give
//! each thread a home stripe so that threads on different cores write different
//! cache lines. The hint only spreads threads out; no limiter's exactness
//! depends on it.

use crossbeam_utils::CachePadded;

use crate::cell::{self, Alone, Loss};
use crate::sync::AtomicU64;
use crate::sync::thread::{refresh_thread_hint, thread_hint};

/// The most stripes a limiter will have; more only cost memory and longer
/// steal scans.
pub(crate) const MAX_STRIPES: usize = 256;

/// The default stripe count: the machine's parallelism, rounded up to a power
/// of two (a thread's stripe is its hint masked), at most [`MAX_STRIPES`].
///
/// Asked of the OS once per process: `available_parallelism` reads cgroup
/// files on Linux (about 20 µs), which a service creating a limiter per key
/// would otherwise pay for every key.
pub(crate) fn default_stripes() -> usize {
    static STRIPES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *STRIPES.get_or_init(|| {
        std::thread::available_parallelism()
            .map_or(1, usize::from)
            .next_power_of_two()
            .min(MAX_STRIPES)
    })
}

/// A striped limiter's per-core stripe words, each on its own cache line, and
/// the protocol every such limiter runs on them (the leased token bucket,
/// the leased fixed window, the striped sliding window):
///
/// - **spend**: a request decides on its own stripe's word; a race lost there
///   means another thread shares the stripe, so the thread's hint moves to
///   its CPU's stripe (the contended hint) and it decides again at once;
/// - **take**: the slow path empties its stripe by the limiter's own
///   read-modify-write (a swap, a `fetch_and`), then decides on the shared
///   word;
/// - **keep or return**: what the caller owns afterwards goes back into its
///   stripe by a decision on the stripe's word, or, when that finds the
///   stripe has moved on, back to a shared word by a decision on that word
///   (or is forgotten: under-admission only).
///
/// Every stripe operation is `Relaxed` ([`Alone`]): a stripe word is a count
/// or an interval of time owned by exactly one place at a time, moved between
/// places only by read-modify-writes, and no other memory is read on its
/// strength.
#[derive(Debug)]
pub(crate) struct Stripes {
    words: Box<[CachePadded<AtomicU64>]>,
    /// `words.len() - 1`; the length is a power of two.
    mask: usize,
}

/// Why a stripe takes nothing in ([`Stripes::keep_or_return`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// Leave it: nothing to put in, or the stripe is taken and what the
    /// caller holds is forgotten.
    Leave,
    /// The stripe has moved on: what the caller holds goes back to the
    /// shared word.
    Return,
}

impl Stripes {
    /// `count` stripes (clamped to `1..=MAX_STRIPES`, rounded up to a power of
    /// two), each holding `empty`.
    pub(crate) fn new(count: usize, empty: u64) -> Self {
        let count = count.clamp(1, MAX_STRIPES).next_power_of_two();
        Stripes {
            words: (0..count)
                .map(|_| CachePadded::new(AtomicU64::new(empty)))
                .collect(),
            mask: count - 1,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.words.len()
    }

    /// The calling thread's stripe: its hint, masked.
    #[inline]
    pub(crate) fn own(&self) -> usize {
        thread_hint() & self.mask
    }

    /// Stripe `k` (any `k`: masked).
    #[inline]
    pub(crate) fn get(&self, k: usize) -> &AtomicU64 {
        &self.words[k & self.mask]
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &AtomicU64> {
        self.words.iter().map(|word| &**word)
    }

    /// Heap bytes of the stripes.
    pub(crate) fn heap_bytes(&self) -> usize {
        std::mem::size_of_val::<[CachePadded<AtomicU64>]>(&self.words)
    }

    /// A slow path's decision on stripe `k`'s word (a take, a reclaim, a
    /// steal), until stored or refused; a loss is decided again at once.
    pub(crate) fn update<E>(
        &self,
        k: usize,
        decide: impl FnMut(u64) -> Result<u64, E>,
    ) -> Result<u64, E> {
        cell::update::<Alone, u64, E>(self.get(k), decide, |_, _| Loss::DecideAgain)
    }

    /// The fast path: `decide` on stripe `own`'s word until its result is
    /// stored or it refuses. A lost race is another thread spending the same
    /// stripe: the thread moves to its CPU's stripe for its next request, and
    /// decides again at once (no clock read on the fast path).
    #[inline]
    pub(crate) fn spend<E>(
        &self,
        own: usize,
        decide: impl FnMut(u64) -> Result<u64, E>,
    ) -> Result<u64, E> {
        cell::update::<Alone, u64, E>(self.get(own), decide, |_, _| {
            refresh_thread_hint();
            Loss::DecideAgain
        })
    }

    /// Keep or return: puts what the caller owns into stripe `own` by `keep`,
    /// a decision on the stripe's word; when that refuses with
    /// [`Refused::Return`], gives it back to `home` by `give_back`, a decision
    /// on that word whose refusal forgets it. Returns the stripe word that was
    /// replaced, or the refusal.
    pub(crate) fn keep_or_return(
        &self,
        own: usize,
        mut keep: impl FnMut(u64) -> Result<u64, Refused>,
        home: &AtomicU64,
        give_back: impl FnMut(u64) -> Result<u64, ()>,
    ) -> Result<u64, Refused> {
        let mut replaced = 0;
        let kept = cell::update::<Alone, u64, Refused>(
            self.get(own),
            |word| {
                replaced = word;
                keep(word)
            },
            // Decide again at once: as `spend`'s, a loss here is to a thread
            // of the same stripe.
            |_, _| Loss::DecideAgain,
        );
        match kept {
            Ok(_) => Ok(replaced),
            Err(Refused::Leave) => Err(Refused::Leave),
            Err(Refused::Return) => {
                // A refusal: the word has moved past what was given, which
                // is then forgotten (under-admission only).
                let _ = return_to(home, give_back);
                Err(Refused::Return)
            }
        }
    }
}

/// Gives what the caller owns back to a shared word by `give_back`, a
/// decision on that word (a refusal forgets it). Relaxed throughout
/// ([`Alone`]): a count or interval returned, checked by CAS against the
/// word's newest value; nothing else is published.
pub(crate) fn return_to(
    home: &AtomicU64,
    give_back: impl FnMut(u64) -> Result<u64, ()>,
) -> Result<u64, ()> {
    cell::update::<Alone, u64, ()>(home, give_back, |_, _| Loss::DecideAgain)
}
