//! The keyed driver of every kind whose state is a word of either width
//! (one-word kinds, `one_word`; two-word kinds, `two_word`): the tag protocol
//! around the algorithm's own [`Machine`] (carry-over of a stale word,
//! decide, refund, fork, snapshot, freshness, settling), written once, and
//! the cells such a word lives in.

use super::{Refusal, TAG, View};
use crate::cell::{AtomicCell, LockedCell, Published, StateCell};
use crate::limiter::{Snapshot, check_request};
use crate::machine::Machine;

/// Where a keyed word lives: the crate's state cells (`crate::cell`),
/// unpadded (keys are many, and a cache line per key would cost 128 bytes
/// where the word needs 8), the atomic ones with the `Published` orderings:
/// a word carried over to a newer configuration record must be seen together
/// with that record (see `reconfig`).
#[allow(unreachable_pub)] // sealed: public only as `Kind::State`
pub type AtomicWord = AtomicCell<u64, Published>;

/// The twins' word: a `u64` under a mutex (parking_lot's; 16 bytes).
#[allow(unreachable_pub)] // sealed: public only as `Kind::State`
pub type LockedWord = LockedCell<u64>;

/// A two-word state in one 128-bit atomic (`cmpxchg16b` through
/// portable-atomic): 16 bytes per key, with the one-word keyed cell's
/// orderings, for the same reason.
#[allow(unreachable_pub)] // sealed: public only as `Kind::State`
pub type AtomicWideWord = AtomicCell<u128, Published>;

/// The two-word twins' state: a `u128` under a mutex (parking_lot's).
#[allow(unreachable_pub)] // sealed: public only as `Kind::State`
pub type LockedWideWord = LockedCell<u128>;

/// A configuration with a keyable machine inside.
pub(super) trait WordConfig {
    type Machine: Machine;
    fn machine(&self) -> &Self::Machine;
}

/// The state word of a configuration's machine.
pub(super) type WordOf<G> = <<G as WordConfig>::Machine as Machine>::Word;

/// The untagged state under the view's current configuration: the word itself
/// if it carries the current tag, carried over if it is stale, or `Stale` if it
/// has moved on to a newer record than the view's.
#[inline]
pub(super) fn resolve<G: WordConfig>(
    view: &View<'_, G>,
    word: WordOf<G>,
    now: u64,
) -> Result<WordOf<G>, Refusal> {
    let tag = WordOf::<G>::from(TAG);
    if word & tag == WordOf::<G>::from(view.tag) {
        Ok(word & !tag)
    } else if (view.still_current)() {
        Ok(G::Machine::carry(
            view.previous.machine(),
            view.current.machine(),
            word & !tag,
            now,
            view.carry,
        ))
    } else {
        Err(Refusal::Stale)
    }
}

/// Admits `n` at `now`; the receipt is `(before, written)`: the tagged state
/// the decision was made on (after any carry-over) and the tagged word stored.
#[inline]
pub(super) fn acquire<G: WordConfig, W: StateCell<Word = WordOf<G>>>(
    view: &View<'_, G>,
    cell: &W,
    now: u64,
    n: u32,
) -> Result<(WordOf<G>, WordOf<G>), Refusal> {
    let machine = view.current.machine();
    check_request(n, machine.capacity())?;
    let tag = WordOf::<G>::from(view.tag);
    let mut before = tag;
    let written = cell.update(|word| {
        let state = resolve(view, word, now)?;
        // The decision stored last is the one kept. Carried over, not the raw
        // word: a refund must never put back a word with the previous tag.
        before = tag | state;
        Ok::<_, Refusal>(tag | machine.decide(state, now, n)?)
    })?;
    Ok((before, written))
}

pub(super) fn peek<G: WordConfig, W: StateCell<Word = WordOf<G>>>(
    view: &View<'_, G>,
    cell: &W,
    now: u64,
    n: u32,
) -> Result<(), Refusal> {
    let machine = view.current.machine();
    check_request(n, machine.capacity())?;
    let state = resolve(view, cell.load(), now)?;
    machine.decide(state, now, n)?;
    Ok(())
}

pub(super) fn refund<G: WordConfig, W: StateCell<Word = WordOf<G>>>(
    view: &View<'_, G>,
    cell: &W,
    (before, written): (WordOf<G>, WordOf<G>),
    n: u32,
) {
    let machine = view.current.machine();
    let tag = WordOf::<G>::from(TAG);
    let _ = cell.update(|word| {
        // A carry-over in between changed what the word means: keep it.
        if word & tag != written & tag {
            return Err(());
        }
        machine
            .refund(word & !tag, before & !tag, written & !tag, n)
            .map(|state| state | (word & tag))
            .ok_or(())
    });
}

/// The key's state as the current configuration reads it at `now` (carried
/// over from the previous one if it was written under it); `None` if the
/// view went stale. What `fork`, `snapshot` and `is_fresh` start from.
pub(super) fn resolved<G: WordConfig, W: StateCell<Word = WordOf<G>>>(
    view: &View<'_, G>,
    cell: &W,
    now: u64,
) -> Option<WordOf<G>> {
    resolve(view, cell.load(), now).ok()
}

pub(super) fn settle<G: WordConfig, W: StateCell<Word = WordOf<G>>>(
    view: &View<'_, G>,
    cell: &W,
    now: u64,
) -> bool {
    let tag = WordOf::<G>::from(view.tag);
    let result = cell.update(|word| {
        if word & WordOf::<G>::from(TAG) == tag {
            return Err(true);
        }
        resolve(view, word, now)
            .map(|state| state | tag)
            .map_err(|_| false)
    });
    !matches!(result, Err(false))
}

pub(super) fn admitted<G: WordConfig>(
    view: &View<'_, G>,
    written: WordOf<G>,
    now: u64,
) -> Snapshot {
    view.current
        .machine()
        .snapshot(written & !WordOf::<G>::from(TAG), now)
}

/// Implements [`Keyable`] for a limiter type over a [`WordConfig`] and a
/// [`StateCell`]: one line per keyable kind, whatever its word's width.
macro_rules! word_kind {
    ($limiter:ident, $config:ty, $cell:ty, $word:ty) => {
        impl<C: Clock> $crate::kind::sealed::Kind for $limiter<C> {
            type Config = $config;
            type Clock = C;
            type State = $cell;
            type Receipt = ($word, $word);

            fn capacity(config: &$config) -> u32 {
                $crate::machine::Machine::capacity(config.machine())
            }

            fn fresh(tag: u64) -> $cell {
                <$cell as $crate::cell::StateCell>::new(
                    WordOf::<$config>::from(tag)
                        | <<$config as WordConfig>::Machine as $crate::machine::Machine>::INITIAL,
                )
            }

            #[inline]
            fn acquire(
                view: &View<'_, $config>,
                state: &$cell,
                now: u64,
                n: u32,
            ) -> Result<Self::Receipt, Refusal> {
                acquire(view, state, now, n)
            }

            fn admitted(
                view: &View<'_, $config>,
                (_, written): Self::Receipt,
                now: u64,
            ) -> Snapshot {
                admitted(view, written, now)
            }

            fn peek(
                view: &View<'_, $config>,
                state: &$cell,
                now: u64,
                n: u32,
            ) -> Result<(), Refusal> {
                peek(view, state, now, n)
            }

            fn refund(view: &View<'_, $config>, state: &$cell, receipt: Self::Receipt, n: u32) {
                refund(view, state, receipt, n)
            }

            fn fork(view: &View<'_, $config>, state: &$cell, now: u64) -> Option<$cell> {
                let tag = WordOf::<$config>::from(view.tag);
                resolved(view, state, now)
                    .map(|word| <$cell as $crate::cell::StateCell>::new(word | tag))
            }

            fn snapshot(view: &View<'_, $config>, state: &$cell, now: u64) -> Option<Snapshot> {
                resolved(view, state, now).map(|word| {
                    $crate::machine::Machine::snapshot(view.current.machine(), word, now)
                })
            }

            fn is_fresh(view: &View<'_, $config>, state: &$cell, now: u64) -> Option<bool> {
                resolved(view, state, now).map(|word| {
                    $crate::machine::Machine::is_fresh(view.current.machine(), word, now)
                })
            }

            fn settle(view: &View<'_, $config>, state: &$cell, now: u64) -> bool {
                settle(view, state, now)
            }
        }
    };
}

pub(super) use word_kind;
