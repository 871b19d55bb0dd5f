//! The token bucket's refund rule: what a denied request that the bucket had
//! admitted (in [`AllOf`](crate::AllOf) or a keyed pair) may give back.

use super::gcra::Gcra;
use crate::word::Refund;

impl Refund for Gcra {
    /// Restores the word the admission replaced, if the word is still the one
    /// it wrote; otherwise gives nothing back.
    ///
    /// Why not subtract `n` intervals from whatever the TAT has become: a
    /// later admission either *stacked* on ours (its base was the TAT, and
    /// removing our `n·I` from it would be exact) or found the bucket *full*
    /// (decided at some `t > TAT >= written`, base `t`), which absorbed ours:
    /// "as if ours never happened" then leaves the TAT where it is, and taking
    /// `n·I` off would hand the later admissions' permits out again. The word
    /// cannot tell the two apart, and the decision times cannot either: a
    /// stale reading (ours, or a clock that stepped back) can be older than a
    /// later admission's. An example, on a keyed pair with parts (1, 1/100
    /// ns) and (3, 1/100 ns): a request reads 1127, is admitted by the first
    /// part and denied by the second; meanwhile a request at 3534 finds the
    /// first part full. A refund of `min(n·I, written − now)` at the stale
    /// 1127 would give that request's permit away, and a third request would
    /// be admitted at 3534: 2 against a
    /// capacity of 1. Restoring only an unchanged word is exact ("as if never
    /// taken", the argument of `waiting::cancel_word`): every admission moves
    /// the TAT strictly forward and every successful refund restores the exact
    /// value its admission replaced, so the word equals `written` iff every
    /// change since ours has been undone. A refund that finds the word moved
    /// keeps the permits taken: under-admission, and only when another
    /// request on the same state was admitted during the nanoseconds between
    /// our admission and our refund.
    fn refund(&self, tat: u64, before: u64, written: u64, _n: u32) -> Option<u64> {
        (tat == written).then_some(before)
    }
}
