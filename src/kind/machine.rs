//! The contract between the keyed layer's state cells and a kind's decision
//! function, for every width of state: one `u64` (token bucket, fixed window,
//! leaky bucket meter) or one `u128` (shaper, warm-up). The tag handling, the
//! cells and the `Keyable` impls over them are written once, in `kinds`.

use std::fmt;
use std::ops::{BitAnd, BitOr, Not};

use super::Carry;
use crate::error::Denied;
use crate::limiter::Snapshot;
use crate::word::{Refund, WordMachine};

/// A per-key state word: one `u64`, or two as one `u128` (the shaper's and
/// warm-up's states). Bit 63 is the tag in both (see [`TAG`]): every keyable
/// machine keeps it clear — the one-word ones in their only word, the
/// two-word ones in their low word, which holds a start or a bank, never an
/// instant that can run past `2^63` (see each machine's `KeyMachine` impl).
pub(crate) trait Word:
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
}

impl Word for u64 {}
impl Word for u128 {}

/// A one-word decision function the keyed layer can reconfigure and refund
/// (its refund rule, [`Refund`], is the direct limiter's: see `word.rs`).
pub(crate) trait Carried: Refund {
    /// The state under `to` that carries `state` (under `from`) over at `now`.
    /// Maps every fresh state to a fresh one, whatever `carry`.
    fn carry(from: &Self, to: &Self, state: u64, now: u64, carry: Carry) -> u64;
}

/// The decision function of a keyable kind, over its state word: what the
/// keyed layer needs to decide, report, evict, carry over and refund. One
/// contract for every width: the one-word machines get it from [`Carried`]
/// (above; its impls are in `kinds`), the two-word ones implement it
/// directly (`kind::two_word`).
pub(crate) trait KeyMachine {
    type Word: Word;
    /// The state of a key that has admitted nothing (untagged). The same for
    /// every configuration, so a fresh state needs no configuration.
    const INITIAL: Self::Word;

    fn capacity(&self) -> u32;

    /// The state after admitting `n` at `now`, or the denial.
    fn decide(&self, state: Self::Word, now: u64, n: u32) -> Result<Self::Word, Denied>;

    fn snapshot(&self, state: Self::Word, now: u64) -> Snapshot;

    /// Whether `state` decides, at `now` and at every later time, exactly as
    /// [`INITIAL`](KeyMachine::INITIAL) does (and snapshots as it does).
    /// Exact: eviction relies on it.
    fn is_fresh(&self, state: Self::Word, now: u64) -> bool;

    /// The state under `to` that carries `state` (under `from`) over at `now`.
    /// Maps every fresh state to a fresh one, whatever `carry`.
    fn carry(from: &Self, to: &Self, state: Self::Word, now: u64, carry: Carry) -> Self::Word;

    /// `state` less the `n` permits of the admission that replaced `before`
    /// with `written`, if that gives away no one else's permits; `None` when
    /// nothing can be given back.
    fn refund(
        &self,
        state: Self::Word,
        before: Self::Word,
        written: Self::Word,
        n: u32,
    ) -> Option<Self::Word>;
}

impl<M: Carried> KeyMachine for M {
    type Word = u64;
    const INITIAL: u64 = <M as WordMachine>::INITIAL;

    #[inline]
    fn capacity(&self) -> u32 {
        WordMachine::capacity(self)
    }

    #[inline]
    fn decide(&self, state: u64, now: u64, n: u32) -> Result<u64, Denied> {
        WordMachine::decide(self, state, now, n)
    }

    fn snapshot(&self, state: u64, now: u64) -> Snapshot {
        WordMachine::snapshot(self, state, now)
    }

    /// Fresh means full with nothing to refill: for every one-word machine
    /// that is exactly "decides as the initial word does, now and from now
    /// on" (a GCRA word with `TAT <= now`; a meter with `empty_at <= now`,
    /// i.e. empty; a window word counting nothing in the current window).
    fn is_fresh(&self, state: u64, now: u64) -> bool {
        let snap = WordMachine::snapshot(self, state, now);
        snap.available == snap.capacity && snap.until_full.is_zero()
    }

    fn carry(from: &Self, to: &Self, state: u64, now: u64, carry: Carry) -> u64 {
        Carried::carry(from, to, state, now, carry)
    }

    fn refund(&self, state: u64, before: u64, written: u64, n: u32) -> Option<u64> {
        Refund::refund(self, state, before, written, n)
    }
}
