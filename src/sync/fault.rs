//! Known-bad variants of the algorithms, switched on by the loom models that
//! must catch them. A normal build has no switch: there [`injected`] is a
//! constant `false`, and each known-bad branch is compiled away.
//!
//! A model that passes proves something only if the same model fails on the
//! mistakes it is meant to rule out. Each [`Fault`] is one such mistake,
//! written into the algorithm as a branch on [`injected`] next to the code it
//! breaks, so that the broken variant differs from the shipped one by exactly
//! that mistake. A test turns it on with [`inject`] and expects its model to
//! fail.
//!
//! The switches are per OS thread and outside loom's view. loom runs every
//! thread of a model on the test's own OS thread, one at a time, so a switch
//! the test sets reaches its whole model, every execution of it, and no other
//! test (libtest runs each test on a thread of its own). Being outside loom's
//! view, reading one adds no access for loom to interleave: the model
//! explores the same executions with the switch off as it does in a build
//! without the branch.

// Public to the loom models (`tollgate::fault` under loom); the crate's own
// otherwise.
#![cfg_attr(not(loom), allow(unreachable_pub))]

#[cfg(loom)]
use std::cell::Cell;

/// A known-bad variant of an algorithm, and the loom model that catches it.
///
/// Named after what the variant gets wrong. Each is off until [`inject`]
/// turns it on, for the calling OS thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// An adaptive limit's release copies the algorithm's limit to the gate
    /// once, without re-reading it: a stale copy can land last and leave the
    /// gate at a limit the algorithm has left. Caught by
    /// `adaptive::known_bad_unfollowed_is_caught`.
    Unfollowed,
    /// A keyed adaptive lookup lets go of its shard's read side before it
    /// admits on the state it found: an eviction can remove the state and a
    /// new one be made for the same key, two gates for one key. Caught by
    /// `keyed_adaptive::known_bad_unlocked_acquire_is_caught`.
    AdaptiveUnlockedAcquire,
    /// A keyed adaptive waiter that finds its key's gate full waits on it
    /// without pinning the state: an eviction can remove the state it waits
    /// on and a new one be made, two gates for one key. Caught by
    /// `keyed_adaptive::known_bad_unpinned_waiter_is_caught`.
    AdaptiveUnpinnedWaiters,
    /// A keyed adaptive key gets a state of its own while the overflow still
    /// has permits out: the key's overflow permits and its own state's are
    /// two gates. Caught by
    /// `keyed_adaptive::known_bad_busy_overflow_insert_is_caught`.
    AdaptiveBusyOverflowInsert,
    /// Every keyed lookup lets go of its shard's hold (slot or read lock)
    /// before the caller decides on the state it found: an eviction can then
    /// change the table while the request reads it, which loom's cell
    /// tracking reports. Caught by
    /// `keyed_eviction::known_bad_unlocked_lookup_is_caught`.
    UnlockedLookups,
    /// Biased readers of the keyed map skip the second bias check after
    /// claiming their slot, so a writer that cleared the bias in between
    /// does not see them and writes while they read. Caught by
    /// `keyed_eviction::known_bad_unchecked_bias_is_caught`.
    UncheckedBias,
    /// Writers of the keyed map clear the bias without waiting for the
    /// readers in their slots, and write while they read. Caught by
    /// `keyed_eviction::known_bad_unwaited_readers_is_caught`.
    UnwaitedReaders,
    /// The keyed sliding window's openers move the pool to the new
    /// sub-window *before* writing the one they leave into the history: an
    /// opener of the sub-window after can then miss a count still in its
    /// window and over-admit. Caught by
    /// `keyed_window::known_bad_open_before_publish_is_caught`.
    WindowOpenBeforePublish,
    /// A keyed sliding log's refund moves its ring's head back in place (and
    /// writes back the overwritten entries) instead of publishing a copy: a
    /// decision made on the refunded admission's entry can still claim once
    /// the head has come back to the same ticket, and over-admit. Caught by
    /// `keyed_log::known_bad_unsealed_refund_is_caught`.
    UnsealedLogRefunds,
    /// A concurrency limit's `try_acquire` decides on a load and stores its
    /// result without checking the word is unchanged: two threads admit on
    /// the same free permit. Caught by
    /// `concurrency::known_bad_load_then_store_is_caught`.
    LoadThenStore,
    /// A woken waiter of a concurrency limit that gives up does not pass its
    /// wake-up on: the next sleeper sleeps forever, which loom reports as a
    /// deadlock. Caught by `concurrency::known_bad_forgetful_leave_is_caught`.
    ForgetfulLeave,
    /// A sliding log of several rules decides by the rule of the largest
    /// count alone, and over-admits against the shorter rules. Caught by
    /// `sliding_log::known_bad_largest_rule_only_is_caught`.
    LargestRuleOnly,
    /// A counted limiter's threads all add to one cell with a load and a
    /// store, as if each held the cell alone: two threads' counts land on
    /// the same value and one is lost. Caught by
    /// `counted::known_bad_shared_count_cell_is_caught`.
    SharedCountCell,
    /// Not a mistake but a model's switch: a leased token bucket built
    /// while it is on sends every request through its stripes, as if every
    /// thread had just lost a race for the word, so that a model of the
    /// lease protocol reaches it in every execution rather than only in
    /// those where a CAS on the word fails.
    AlwaysStriped,
}

#[cfg(loom)]
impl Fault {
    /// The variant's bit in the switch set.
    const fn bit(self) -> u32 {
        1 << self as u32
    }
}

// The last variant: one past the set's width would share a bit with another
// and switch it on too.
const _: () = assert!((Fault::AlwaysStriped as u32) < u32::BITS);

#[cfg(loom)]
std::thread_local! {
    /// The calling OS thread's switched-on faults, a bit per [`Fault`].
    static INJECTED: Cell<u32> = const { Cell::new(0) };
}

/// Turns `fault` on (or off again) for the calling OS thread, which is every
/// thread of a loom model the caller then runs.
#[cfg(loom)]
pub fn inject(fault: Fault, on: bool) {
    INJECTED.with(|set| {
        let bits = if on {
            set.get() | fault.bit()
        } else {
            set.get() & !fault.bit()
        };
        set.set(bits);
    });
}

/// Whether `fault` is on for the calling OS thread: the algorithm's branch to
/// its known-bad variant.
#[cfg(loom)]
#[inline]
pub(crate) fn injected(fault: Fault) -> bool {
    INJECTED.with(|set| set.get() & fault.bit() != 0)
}

/// Whether `fault` is on: never, outside loom.
#[cfg(not(loom))]
#[inline(always)]
pub(crate) const fn injected(_: Fault) -> bool {
    false
}
