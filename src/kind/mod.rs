//! Limiter kinds: how a limiter is decided on a small state under a shared
//! configuration, and reconfigured at runtime. [`Keyed`](crate::keyed::Keyed)
//! runs a kind per key, [`Tunable`](crate::keyed::Tunable) once, without keys;
//! the keyed map itself (lookups, eviction, quotas, per-key handles) is
//! `crate::keyed`, which re-exports this layer's public items.
//!
//! This file is the contract between the keyed layer and a limiter kind: a
//! shared, validated configuration and a small per-key state, with the
//! operations the layer needs (decide, peek, refund, snapshot, "is this state
//! fresh?", carry over a reconfiguration). The kinds: `one_word` (the one-word
//! limiters), `two_word` (the shaper and warm-up), `log` (the exact sliding
//! log), `sliding` (the sliding window) and `combined` (pairs of kinds); the
//! one-word and two-word kinds run the algorithms' own machines
//! (`crate::machine`);
//! `reconfig` holds the reconfiguration protocol and `Tunable`, `answer` the
//! two shapes of an answer.

pub(crate) mod answer;
pub mod combined;
mod log;
mod one_word;
pub(crate) mod reconfig;
mod sliding;
mod two_word;
mod word;

use std::fmt;

use crate::clock::Clock;
use crate::error::Denied;
use crate::limiter::Snapshot;

pub use crate::machine::Carry;
pub use one_word::{BucketConfig, CapacityRate, MeterConfig, WindowConfig};
pub use reconfig::Tunable;
pub use sliding::SlidingWindowConfig;
pub use two_word::{ShaperConfig, WarmUpConfig};

/// The tag bit of a state word: which of two consecutive configurations the
/// rest of the word was last written under (see [`View`]). Every keyable
/// one-word machine keeps its state strictly below 2^63 — at the end of time
/// too, which is why time ends at `2^62 − 1` (`timeline::END`): a token
/// bucket's TAT and a meter's `empty_at` are at most `END + capacity·interval
/// <= 2^63 − 1`, a fixed window's index at most `END / window < 2^(63 − b)` —
/// so bit 63 is free. The test `states_stay_below_the_tag_at_the_end_of_time`
/// in `one_word.rs` checks all three. Two-word states (`u128`) keep the tag in
/// the same bit 63, of their low word: the shaper's latest start and
/// warm-up's spent idle time never reach it (`two_word.rs` and its test
/// `two_word_states_stay_below_the_tag_at_the_end_of_time`).
pub(crate) const TAG: u64 = 1 << 63;

/// A decision a kind could not make, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(unreachable_pub)] // sealed: public only because `Kind` mentions it
pub enum Refusal {
    /// The limiter's answer: denied.
    Denied(Denied),
    /// The configuration this call started with has been replaced and the state
    /// already carried over to its successor: reload the configuration and retry.
    Stale,
}

impl From<Denied> for Refusal {
    fn from(denied: Denied) -> Self {
        Refusal::Denied(denied)
    }
}

/// One configuration as a state sees it: the configuration in force, the one
/// before it (for states not yet carried over), the carry strategy between them,
/// and the tag that marks states already carried over.
///
/// A configuration change publishes a new record with the tag flipped; a state
/// whose tag differs was last written under `previous` and is carried over
/// (by compare-and-swap) the first time it is touched, so every state's history
/// is a run of decisions under one configuration, one carry, a run under the
/// next. `still_current` tells a state that looks stale from one that has moved
/// on to a newer record than this view's (see `reconfig.rs`).
#[allow(unreachable_pub)] // sealed: public only because `Kind` mentions it
pub struct View<'a, G> {
    pub(crate) current: &'a G,
    pub(crate) previous: &'a G,
    pub(crate) carry: Carry,
    /// `0` or [`TAG`].
    pub(crate) tag: u64,
    pub(crate) still_current: &'a dyn Fn() -> bool,
}

impl<G> Clone for View<'_, G> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<G> Copy for View<'_, G> {}

impl<'a, G> View<'a, G> {
    /// The same view of one part of a combined configuration.
    pub(crate) fn map<H>(&self, part: impl Fn(&'a G) -> &'a H) -> View<'a, H> {
        View {
            current: part(self.current),
            previous: part(self.previous),
            carry: self.carry,
            tag: self.tag,
            still_current: self.still_current,
        }
    }
}

impl<G: fmt::Debug> fmt::Debug for View<'_, G> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("View")
            .field("current", self.current)
            .field("previous", self.previous)
            .field("carry", &self.carry)
            .field("tag", &(self.tag != 0))
            .finish_non_exhaustive()
    }
}

pub(crate) mod sealed {
    use super::{Clock, Refusal, Snapshot, View, fmt};

    /// The keyed layer's contract with a kind, described in `docs/keyed.md`
    /// for whoever adds a kind to tollgate. Only tollgate's limiters (and
    /// combinations of them) implement it: the layer relies on their states
    /// being exactly comparable with a fresh one. [`Keyable`](super::Keyable)
    /// is its public face.
    #[allow(unreachable_pub)]
    pub trait Kind: Sized {
        /// The validated configuration shared by every key (e.g.
        /// [`BucketConfig`](crate::keyed::BucketConfig)).
        type Config: Clone + fmt::Debug + PartialEq + Send + Sync + 'static;
        /// The clock the limiter reads.
        type Clock: Clock;
        type State: Send + Sync;
        type Receipt: Copy;

        /// The most permits one request can get under `config`.
        fn capacity(config: &Self::Config) -> u32;

        /// A state that has admitted nothing, tagged `tag`.
        fn fresh(tag: u64) -> Self::State;

        /// Admits `n` permits at `now` or says why not; a denial writes nothing
        /// (a state not yet carried over may be carried over). The receipt is what
        /// `refund` needs to give the permits back.
        fn acquire(
            view: &View<'_, Self::Config>,
            state: &Self::State,
            now: u64,
            n: u32,
        ) -> Result<Self::Receipt, Refusal>;

        /// The snapshot of the state an admission left, from the word it wrote:
        /// what [`Keyed::try_acquire_n_with_snapshot`](crate::keyed::Keyed::try_acquire_n_with_snapshot)
        /// reports. Called only in the call that admitted, pinned throughout and
        /// with the state alive (the sliding log reads its ring here).
        fn admitted(view: &View<'_, Self::Config>, receipt: Self::Receipt, now: u64) -> Snapshot;

        /// What `acquire` would answer, without writing anything.
        fn peek(
            view: &View<'_, Self::Config>,
            state: &Self::State,
            now: u64,
            n: u32,
        ) -> Result<(), Refusal>;

        /// Gives back permits admitted with `receipt`, as far as that is safe: the
        /// state afterwards never admits more than if the permits had never been
        /// taken, whatever was admitted in between and at whatever times (stale
        /// ones included). See [`combined`](crate::keyed::combined) for what each kind
        /// returns.
        fn refund(
            view: &View<'_, Self::Config>,
            state: &Self::State,
            receipt: Self::Receipt,
            n: u32,
        );

        /// A new state, tagged with the view's tag, that decides exactly as
        /// `state` does under the view's configuration (carried over first if it
        /// is stale); `None` if the view is stale. The keyed layer gives it to a
        /// key that leaves the shared overflow state (see `evict`).
        fn fork(
            view: &View<'_, Self::Config>,
            state: &Self::State,
            now: u64,
        ) -> Option<Self::State>;

        /// The state as a snapshot; `None` if the view is stale.
        fn snapshot(
            view: &View<'_, Self::Config>,
            state: &Self::State,
            now: u64,
        ) -> Option<Snapshot>;

        /// Whether the state decides, at `now` and at every later time, exactly as
        /// `fresh` does; `None` if the view is stale.
        fn is_fresh(view: &View<'_, Self::Config>, state: &Self::State, now: u64) -> Option<bool>;

        /// Carries a state written under the view's previous configuration over to
        /// its current one. `false` if the view is stale.
        fn settle(view: &View<'_, Self::Config>, state: &Self::State, now: u64) -> bool;
    }
}

/// A limiter kind that the keyed layer can run per key: [`Keyed`](crate::keyed::Keyed)
/// and [`Tunable`](crate::keyed::Tunable) are generic over it.
///
/// It splits a limiter into a shared, validated configuration and
/// a small per-key state (one `AtomicU64` for the token bucket and the fixed
/// window, the same word as the direct limiter's), so a key costs what the key
/// and its word cost and nothing else. It is implemented for [`TokenBucket`],
/// [`FixedWindow`], the [`LeakyBucket`] meter, the [`Shaper`] and [`WarmUp`]
/// (one `u128` per key, admitting what can start at once), the
/// [`SlidingLog`] (the direct log's lock-free ring, one per key),
/// the [`SlidingWindow`] (a 128-bit word and a history of `S` charges per
/// key, lock-free, without the direct window's stripes), the one- and two-word kinds' locking twins,
/// and tuples of them
/// (`(TokenBucket, TokenBucket)` is "both limits must admit", see
/// [`combined`](crate::keyed::combined)).
///
/// Its associated types name the configuration (`L::Config`, e.g.
/// [`BucketConfig`](crate::keyed::BucketConfig): validated once, shared by
/// every key) and the clock (`L::Clock`, as in `Keyable<Clock =
/// ManualClock>`); `L::capacity(&config)` is the most permits one request
/// can get. The trait is sealed: the rest of it is the layer's contract with
/// a kind, described in `docs/keyed.md` for whoever adds a kind to tollgate.
///
/// [`TokenBucket`]: crate::TokenBucket
/// [`FixedWindow`]: crate::FixedWindow
/// [`LeakyBucket`]: crate::LeakyBucket
/// [`Shaper`]: crate::Shaper
/// [`WarmUp`]: crate::WarmUp
/// [`SlidingLog`]: crate::SlidingLog
/// [`SlidingWindow`]: crate::SlidingWindow
pub trait Keyable: sealed::Kind {}

impl<K: sealed::Kind> Keyable for K {}
