//! The driver shared by every limiter whose whole state is one 64-bit word.

use crossbeam_utils::CachePadded;

use crate::cell::StateCell;
use crate::clock::Clock;
use crate::error::Denied;
use crate::limiter::{Rejection, Snapshot, check_request, remembering, report};
use crate::timeline::Timeline;

/// An algorithm whose state is one `u64`: the pure decision function that the
/// atomic limiter runs inside its CAS loop and the locking twin runs under its
/// mutex. Sharing it is what makes the twins decide identically.
pub(crate) trait WordMachine {
    /// The state of a limiter that has admitted nothing.
    const INITIAL: u64;

    /// The most permits one request may ask for.
    fn capacity(&self) -> u32;

    /// The state after admitting `n` permits at `now`, or why not. Called with
    /// `1 <= n <= capacity` and `now <= END`; `now` may be older than the
    /// time the state was last written (a stale or backwards clock).
    fn decide(&self, state: u64, now: u64, n: u32) -> Result<u64, Denied>;

    /// What a request could get at `now`, without changing anything.
    fn snapshot(&self, state: u64, now: u64) -> Snapshot;
}

/// A one-word machine whose admissions can be given back: the rule shared by
/// the direct limiters' [`Refundable`](crate::Refundable) impls and the keyed
/// layer's refunds (`kind::kinds`), written once per machine beside it.
pub(crate) trait Refund: WordMachine {
    /// `state` less the `n` permits of the admission that replaced `before`
    /// with `written`, if that can be done without giving away anyone else's
    /// permits; `None` when nothing can be given back. `state` is the current
    /// word, under the same configuration as the other two.
    fn refund(&self, state: u64, before: u64, written: u64, n: u32) -> Option<u64>;
}

/// What a one-word admission leaves for its refund: the word it replaced,
/// the word it wrote, and how many permits it took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WordReceipt {
    pub(crate) before: u64,
    pub(crate) written: u64,
    pub(crate) n: u32,
}

/// A one-word limiter: its algorithm, where its state lives, and its clock.
#[derive(Debug)]
pub(crate) struct WordLimiter<M, S, C> {
    machine: M,
    /// On its own cache line: the limiter is one per use, and its word is
    /// what every request writes.
    state: CachePadded<S>,
    timeline: Timeline<C>,
}

impl<M: WordMachine, S: StateCell<Word = u64>, C: Clock> WordLimiter<M, S, C> {
    pub(crate) fn new(machine: M, clock: C) -> Self {
        WordLimiter {
            machine,
            state: CachePadded::new(S::new(M::INITIAL)),
            timeline: Timeline::new(clock),
        }
    }

    #[inline]
    pub(crate) fn try_acquire_n(&self, n: u32) -> Result<(), Denied> {
        check_request(n, self.machine.capacity())?;
        // One reading per request: a retry after a lost race reuses it. The reading
        // can only grow staler, and a stale reading can only make the decision
        // stricter (see each machine's `decide`).
        let now = self.timeline.now();
        self.state
            .update(|state| self.machine.decide(state, now, n))
            .map(|_| ())
    }

    pub(crate) fn snapshot(&self) -> Snapshot {
        let now = self.timeline.now();
        self.machine.snapshot(self.state.load(), now)
    }

    /// `try_acquire_n` with the snapshot of the word the decision stored (or
    /// denied on), at the decision's own reading.
    #[inline]
    pub(crate) fn try_acquire_n_with_snapshot(&self, n: u32) -> Result<Snapshot, Rejection> {
        if let Err(denied) = check_request(n, self.machine.capacity()) {
            return Err(Rejection::new(denied, self.snapshot()));
        }
        let now = self.timeline.now();
        let mut seen = M::INITIAL;
        let outcome = self.state.update(remembering(&mut seen, |state| {
            self.machine.decide(state, now, n)
        }));
        report(outcome, self.machine.snapshot(seen, now))
    }

    /// `try_acquire_n_with_snapshot` that also returns what a refund needs:
    /// the word the admission replaced and the word it wrote.
    #[inline]
    pub(crate) fn try_acquire_n_receipted(
        &self,
        n: u32,
    ) -> Result<(Snapshot, WordReceipt), Rejection> {
        if let Err(denied) = check_request(n, self.machine.capacity()) {
            return Err(Rejection::new(denied, self.snapshot()));
        }
        let now = self.timeline.now();
        let mut before = M::INITIAL;
        let mut seen = M::INITIAL;
        let outcome = self.state.update(remembering(&mut seen, |state| {
            before = state;
            self.machine.decide(state, now, n)
        }));
        let snapshot = self.machine.snapshot(seen, now);
        match outcome {
            Ok(_) => Ok((
                snapshot,
                WordReceipt {
                    before,
                    written: seen,
                    n,
                },
            )),
            Err(denied) => Err(Rejection::new(denied, snapshot)),
        }
    }

    /// `try_acquire_n_receipted` without the report.
    #[inline]
    pub(crate) fn try_acquire_n_receipt(&self, n: u32) -> Result<WordReceipt, Denied> {
        check_request(n, self.machine.capacity())?;
        let now = self.timeline.now();
        let mut before = M::INITIAL;
        let mut written = M::INITIAL;
        self.state.update(|state| {
            before = state;
            written = self.machine.decide(state, now, n)?;
            Ok::<_, Denied>(written)
        })?;
        Ok(WordReceipt { before, written, n })
    }

    /// Gives back the permits of `receipt`'s admission as far as the
    /// machine's [`Refund`] rule allows; otherwise leaves the word alone.
    pub(crate) fn refund(&self, receipt: WordReceipt)
    where
        M: Refund,
    {
        // The "denial" only stops the update: nothing is written.
        let _ = self.state.update(|word| {
            self.machine
                .refund(word, receipt.before, receipt.written, receipt.n)
                .ok_or(Denied::ZeroPermits)
        });
    }

    pub(crate) fn machine(&self) -> &M {
        &self.machine
    }

    pub(crate) fn clock(&self) -> &C {
        self.timeline.clock()
    }
}

/// Declares a public one-word limiter type over a [`WordMachine`] and a
/// [`StateCell`]: the struct, its [`RateLimiter`](crate::RateLimiter) impl and its
/// clock accessor; `$args` are the constructor arguments before the clock, for the
/// generated doc example. Constructors, which differ per algorithm, are written by hand.
macro_rules! word_limiter {
    ($(#[$doc:meta])* $name:ident, $machine:ty, $cell:ty, $args:literal) => {
        $(#[$doc])*
        #[derive(Debug)]
        pub struct $name<C = $crate::clock::MonotonicClock> {
            inner: $crate::word::WordLimiter<$machine, $cell, C>,
        }

        impl<C: $crate::clock::Clock> $name<C> {
            /// The clock this limiter reads.
            ///
            /// ```
            #[doc = concat!("use tollgate::{Clock, ManualClock, Rate, ", stringify!($name), "};")]
            /// let clock = ManualClock::new();
            #[doc = concat!("let limiter = ", stringify!($name), "::with_clock(")]
            #[doc = concat!("    ", $args, ", clock.clone()).unwrap();")]
            /// clock.set(7);
            /// assert_eq!(limiter.clock().now(), 7);
            /// ```
            pub fn clock(&self) -> &C {
                self.inner.clock()
            }
        }

        impl<C: $crate::clock::Clock> $crate::limiter::RateLimiter for $name<C> {
            #[inline]
            fn try_acquire_n(&self, n: u32) -> Result<(), $crate::error::Denied> {
                self.inner.try_acquire_n(n)
            }

            fn snapshot(&self) -> $crate::limiter::Snapshot {
                self.inner.snapshot()
            }

            #[inline]
            fn try_acquire_n_with_snapshot(
                &self,
                n: u32,
            ) -> Result<$crate::limiter::Snapshot, $crate::limiter::Rejection> {
                self.inner.try_acquire_n_with_snapshot(n)
            }

            #[inline]
            fn try_acquire_n_then(
                &self,
                n: u32,
                keep: &mut dyn FnMut(
                    Result<$crate::limiter::Snapshot, $crate::limiter::Rejection>,
                ) -> bool,
            ) -> bool {
                $crate::refund::decide_then(self, n, keep)
            }
        }

        impl<C: $crate::clock::Clock> $crate::refund::Refundable for $name<C> {
            type Receipt<'a>
                = $crate::refund::Receipt<'a>
            where
                Self: 'a;

            #[inline]
            fn try_acquire_n_refundable(
                &self,
                n: u32,
            ) -> Result<
                $crate::refund::Receipted<$crate::refund::Receipt<'_>>,
                $crate::limiter::Rejection,
            > {
                let (snapshot, word) = self.inner.try_acquire_n_receipted(n)?;
                Ok($crate::refund::Receipted::new(
                    snapshot,
                    $crate::refund::Receipt::new(self, word),
                ))
            }

            #[inline]
            fn try_acquire_n_receipt(
                &self,
                n: u32,
            ) -> Result<$crate::refund::Receipt<'_>, $crate::error::Denied> {
                let word = self.inner.try_acquire_n_receipt(n)?;
                Ok($crate::refund::Receipt::new(self, word))
            }

            fn refund<'a>(&'a self, receipt: $crate::refund::Receipt<'a>) {
                if let Some(word) = receipt.word_for(self) {
                    self.inner.refund(word);
                }
            }
        }
    };
}

pub(crate) use word_limiter;

/// For limiters that drive the same word by other decisions than `try_acquire_n`
/// (reservations, in `crate::waiting`): the limiter's time and its state cell.
impl<M: WordMachine, S: StateCell<Word = u64>, C: Clock> WordLimiter<M, S, C> {
    #[inline]
    pub(crate) fn now(&self) -> u64 {
        self.timeline.now()
    }

    #[inline]
    pub(crate) fn state(&self) -> &S {
        &self.state
    }
}
