//! Combined limits: a pair of kinds is a kind, admitting a request only if both
//! admit it.
//!
//! `(TokenBucket, TokenBucket)` configured with `(10 per second, 1,000 per
//! hour)` is "10 per second *and* 1,000 per hour"; pairs nest, so
//! `(A, (B, C))` is three limits. A pair works wherever a kind does: per key in
//! [`Keyed`](crate::keyed::Keyed) (8 bytes per limit per key), directly in
//! [`Tunable`](crate::keyed::Tunable), with per-key overrides, eviction (a key is
//! fresh when both parts are) and reconfiguration (both parts are carried over
//! with the same [`Carry`](crate::keyed::Carry)).
//!
//! ```
//! use std::time::Duration;
//! use tollgate::keyed::{BucketConfig, Tunable};
//! use tollgate::{Denied, ManualClock, Rate, RateLimiter, TokenBucket};
//!
//! type Bucket = TokenBucket<ManualClock>;
//! let clock = ManualClock::new();
//! let per_second = BucketConfig::new(10, Rate::per_second(10)).unwrap();
//! let per_hour = BucketConfig::new(15, Rate::per_hour(15)).unwrap();
//! let both = Tunable::<(Bucket, Bucket)>::with_clock((per_second, per_hour), clock.clone());
//!
//! assert!(both.try_acquire_n(10).is_ok()); // the per-second bucket is empty
//! // Denied by the first limit; the second is not charged.
//! assert_eq!(both.try_acquire_n(5), Err(Denied::RetryAfter(Duration::from_millis(500))));
//! clock.advance(Duration::from_secs(1));
//! // Denied by the second limit (5 left this hour); the first gets its 6 back.
//! assert!(matches!(both.try_acquire_n(6), Err(Denied::RetryAfter(_))));
//! assert_eq!(both.snapshot().available, 5);
//! assert!(both.try_acquire_n(5).is_ok());
//! ```
//!
//! # How, and the exact guarantee
//!
//! A request asks each part in turn; if a later part denies, the parts that
//! admitted are *refunded*. Every part keeps its own guarantee over the permits
//! it keeps, so every limit of the set holds for the requests the pair admits.
//!
//! * **A refund never gives away a permit someone else holds**, whatever the
//!   clock readings: the state after it admits no more than if the refunded
//!   admission had never happened. For the fixed window the refund takes `n`
//!   from the count if the window is still the one the permits went to (every
//!   admission since stacked on them; if the window has closed they constrain
//!   nothing any more): exact, always. For the token bucket it restores the
//!   word the admission replaced if the word is still the one the admission
//!   wrote; if another admission has moved it since, the permits stay taken.
//!   (Taking `n` intervals off a moved TAT is exact if the later admissions
//!   stacked on ours, but over-admits if one found the bucket full and
//!   absorbed it — for example: a request decided at a stale 1127 ns refunded a
//!   permit that a request at 3534 ns held, and a third was admitted at 3534,
//!   2 against a capacity of 1. One word cannot tell the two apart; see
//!   `token_bucket/refund.rs`.)
//! * **A denied request keeps no permit unless it was raced**: without a
//!   concurrent admission on the same part between its admission and its
//!   refund (nanoseconds, unless the thread is preempted) every refund is
//!   exact. When a token bucket part was raced, the denied request's `n`
//!   permits stay taken until they refill: under-admission, never
//!   over-admission.
//! * **A refunded permit was briefly unavailable.** Between the first part's
//!   admission and its refund (nanoseconds, unless the thread is preempted),
//!   the permits are taken: a concurrent request on the same key may be denied
//!   by that part although in the end nobody kept them. That is the only
//!   effect — under-admission during the window, never over-admission.
//! * **A refund is skipped** if the part's state was carried over to a new
//!   configuration in between: the permits then stay taken (under-admission).
//! * **Retry-after** is the longest of the parts' waits: each limit admits
//!   once its own wait is over and stays admitting as time passes, so that is
//!   the exact time at which the same request would pass if nothing else
//!   happened.
//! * **Snapshot** is the binding part's: the one with the fewest permits
//!   available (on a tie the longer time to full, then the first part), with
//!   its own capacity and time to full — the rule of
//!   [`AllOf`](crate::AllOf) and of a sliding log with several rules, so a
//!   `RateLimit` field written from it describes one real limit.
//!
//! The stress tests in `tests/integration/keyed_combined.rs` hammer pairs from several
//! threads and check both limits on what was admitted, and that with time
//! frozen a window part ends with exactly its capacity less what passed; the
//! loom model `loom-tests/tests/combined.rs` races a refund made at a stale
//! reading against admissions at a later one.

use super::{Keyable, Refusal, View, sealed::Kind};
use crate::error::Denied;
use crate::limiter::{Snapshot, check_request};

/// The longer of two waits; a stale or permanent answer wins over a wait.
fn longest(first: Refusal, second: Result<(), Refusal>) -> Refusal {
    match (first, second) {
        (Refusal::Stale, _) | (_, Err(Refusal::Stale)) => Refusal::Stale,
        (Refusal::Denied(Denied::RetryAfter(a)), Err(Refusal::Denied(Denied::RetryAfter(b)))) => {
            Refusal::Denied(Denied::RetryAfter(a.max(b)))
        }
        (Refusal::Denied(Denied::RetryAfter(_)), Err(other)) => other,
        (first, _) => first,
    }
}

impl<A: Keyable, B: Keyable<Clock = A::Clock>> Kind for (A, B) {
    type Config = (A::Config, B::Config);
    type Clock = A::Clock;
    type State = (A::State, B::State);
    type Receipt = (A::Receipt, B::Receipt);

    fn capacity(config: &Self::Config) -> u32 {
        A::capacity(&config.0).min(B::capacity(&config.1))
    }

    fn fresh(tag: u64) -> Self::State {
        (A::fresh(tag), B::fresh(tag))
    }

    #[inline]
    fn acquire(
        view: &View<'_, Self::Config>,
        state: &Self::State,
        now: u64,
        n: u32,
    ) -> Result<Self::Receipt, Refusal> {
        // A request no part can ever grant touches nothing.
        check_request(n, Self::capacity(view.current))?;
        let (va, vb) = (view.map(|c| &c.0), view.map(|c| &c.1));
        let ra = A::acquire(&va, &state.0, now, n)
            .map_err(|denied| longest(denied, B::peek(&vb, &state.1, now, n)))?;
        match B::acquire(&vb, &state.1, now, n) {
            Ok(rb) => Ok((ra, rb)),
            Err(refusal) => {
                A::refund(&va, &state.0, ra, n);
                Err(refusal)
            }
        }
    }

    fn admitted(view: &View<'_, Self::Config>, receipt: Self::Receipt, now: u64) -> Snapshot {
        let a = A::admitted(&view.map(|c| &c.0), receipt.0, now);
        let b = B::admitted(&view.map(|c| &c.1), receipt.1, now);
        both(a, b)
    }

    fn peek(
        view: &View<'_, Self::Config>,
        state: &Self::State,
        now: u64,
        n: u32,
    ) -> Result<(), Refusal> {
        check_request(n, Self::capacity(view.current))?;
        let (va, vb) = (view.map(|c| &c.0), view.map(|c| &c.1));
        let b = B::peek(&vb, &state.1, now, n);
        match A::peek(&va, &state.0, now, n) {
            Ok(()) => b,
            Err(first) => Err(longest(first, b)),
        }
    }

    fn refund(view: &View<'_, Self::Config>, state: &Self::State, receipt: Self::Receipt, n: u32) {
        A::refund(&view.map(|c| &c.0), &state.0, receipt.0, n);
        B::refund(&view.map(|c| &c.1), &state.1, receipt.1, n);
    }

    fn fork(view: &View<'_, Self::Config>, state: &Self::State, now: u64) -> Option<Self::State> {
        let a = A::fork(&view.map(|c| &c.0), &state.0, now)?;
        let b = B::fork(&view.map(|c| &c.1), &state.1, now)?;
        Some((a, b))
    }

    fn snapshot(view: &View<'_, Self::Config>, state: &Self::State, now: u64) -> Option<Snapshot> {
        let a = A::snapshot(&view.map(|c| &c.0), &state.0, now)?;
        let b = B::snapshot(&view.map(|c| &c.1), &state.1, now)?;
        Some(both(a, b))
    }

    fn is_fresh(view: &View<'_, Self::Config>, state: &Self::State, now: u64) -> Option<bool> {
        let a = A::is_fresh(&view.map(|c| &c.0), &state.0, now)?;
        let b = B::is_fresh(&view.map(|c| &c.1), &state.1, now)?;
        Some(a && b)
    }

    fn settle(view: &View<'_, Self::Config>, state: &Self::State, now: u64) -> bool {
        let a = A::settle(&view.map(|c| &c.0), &state.0, now);
        let b = B::settle(&view.map(|c| &c.1), &state.1, now);
        a && b
    }
}

/// A pair's snapshot: the part that binds first, with its own figures
/// ([`Snapshot::tightest`], the rule of `AllOf` and of a log's rules). Its
/// `available` is what both parts allow, as the binding part has the fewest.
fn both(a: Snapshot, b: Snapshot) -> Snapshot {
    a.tightest(b)
}
