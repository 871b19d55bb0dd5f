//! One machine per algorithm, and the one driver that runs it.
//!
//! A [`Machine`] is an algorithm's pure decision function over its state word
//! (one `u64`, or two words changed as a whole in a `u128`): decide, report,
//! refund, carry over a reconfiguration, tell a fresh state. The token
//! bucket's GCRA, the fixed window's counter, the shaper's queue and
//! warm-up's curve each implement it once, beside their algorithm; the leaky
//! bucket's meter is the GCRA under a name of its own (the two decide alike,
//! the meter's level being the GCRA's debt). [`Schedule`] adds bookings
//! (reservations) to the machines whose state is a schedule. [`WordLimiter`]
//! drives a machine on a state cell (`crate::cell`): each machine's direct
//! limiter and its locking twin are one thin type over it, generic over the
//! cell's `Home`, and the keyed kinds (`crate::kind`) run the same machines
//! on their per-key cells.

use crossbeam_utils::CachePadded;

use crate::cell::{StateCell, Word};
use crate::clock::Clock;
use crate::error::Denied;
use crate::limiter::{Rejection, Snapshot, check_request, remembering, report};
use crate::timeline::Timeline;

/// What to do with a limiter's current state when its configuration changes.
///
/// Bucket4j's token-inheritance strategies, less its "as is" (which would leave
/// a full bucket less than full when the capacity grows, so a key would behave
/// differently depending on whether it had been evicted — see `docs/keyed.md`).
/// Every strategy here maps a fresh state to a fresh state.
///
/// ```
/// use tollgate::keyed::{BucketConfig, Carry, Tunable};
/// use tollgate::{ManualClock, Rate, RateLimiter, TokenBucket};
///
/// let clock = ManualClock::new();
/// let cfg = BucketConfig::new(10, Rate::per_second(10)).unwrap();
/// let limiter = Tunable::<TokenBucket<ManualClock>>::with_clock(cfg, clock.clone());
/// limiter.try_acquire_n(6).unwrap(); // 4 of 10 left
///
/// // Proportional: 40 % left stays 40 % left.
/// limiter.reconfigure(BucketConfig::new(20, Rate::per_second(20)).unwrap(), Carry::Proportional);
/// assert_eq!(limiter.snapshot().available, 8);
/// // Additive: the 12 permits in use stay in use.
/// limiter.reconfigure(BucketConfig::new(30, Rate::per_second(20)).unwrap(), Carry::Additive);
/// assert_eq!(limiter.snapshot().available, 18);
/// // Reset: full.
/// limiter.reconfigure(BucketConfig::new(5, Rate::per_second(5)).unwrap(), Carry::Reset);
/// assert_eq!(limiter.snapshot().available, 5);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Carry {
    /// The fraction of the capacity in use is kept (rounded towards "in use"):
    /// a bucket 40 % full stays 40 % full. The default: a quota change neither
    /// hands out a burst nor locks anyone out.
    #[default]
    Proportional,
    /// The permits in use are kept, capped at the new capacity: raising the
    /// capacity by 10 makes 10 more permits available at once.
    Additive,
    /// Every state starts afresh, full.
    Reset,
}

/// An algorithm's decision function over its state word: what the direct
/// limiter runs inside its cell's compare-and-swap loop, its locking twin
/// under its mutex, and the keyed layer on each key's word. Sharing it is
/// what makes the twins and the keys decide as the limiter does.
///
/// Every method is a pure function of its arguments: the atomic cell may run
/// one several times on a lost race. `now` may be older than the time the
/// state was last written (a stale reading, or a clock that stepped back);
/// each machine documents why that can only make it stricter.
pub(crate) trait Machine {
    /// The state's width: `u64`, or `u128` for two words changed together.
    type Word: Word;

    /// The state of a limiter that has admitted nothing. The same for every
    /// configuration, so that a fresh key needs no configuration to exist.
    /// The zero word for every machine: a token bucket's TAT at the origin
    /// (full), a meter's drain time at the origin (empty), window 0 with
    /// nothing counted, a schedule with nothing booked, a warm-up cold and
    /// idle.
    const INITIAL: Self::Word = <Self::Word as Word>::ZERO;

    /// The state after admitting `n` permits at `now`, or why not. Called with
    /// `1 <= n <= capacity` and `now <= END`.
    fn decide(&self, state: Self::Word, now: u64, n: u32) -> Result<Self::Word, Denied>;

    /// What a request could get at `now`, without changing anything.
    fn snapshot(&self, state: Self::Word, now: u64) -> Snapshot;

    /// The most permits one request may ask for.
    fn capacity(&self) -> u32;

    /// `state` less the `n` permits of the admission that replaced `before`
    /// with `written`, if that gives away no one else's permits; `None` when
    /// nothing can be given back. `state` is the current word, under the same
    /// configuration as the other two. The direct limiters' refunds
    /// ([`Refundable`](crate::Refundable)), the keyed refunds and the
    /// cancellation of a reservation are all this one rule.
    ///
    /// The default is the rule of every machine whose state moves strictly
    /// forward with each admission (a token bucket's TAT, a meter's drain
    /// time, a schedule's end): the word the admission replaced is restored
    /// if the word is still the one it wrote, otherwise nothing comes back.
    /// Every successful refund restores the exact word its admission
    /// replaced, so the words form a stack: the word equals `written` iff
    /// every change since has been undone, and restoring `before` is "as if
    /// it had never happened".
    ///
    /// Why not subtract `n` intervals from whatever a TAT has become: a later
    /// admission either *stacked* on ours (its base was the TAT, and removing
    /// our `n·I` from it would be exact) or found the bucket *full* (decided
    /// at some `t > TAT >= written`, base `t`), which absorbed ours: "as if
    /// ours never happened" then leaves the TAT where it is, and taking `n·I`
    /// off would hand the later admissions' permits out again. Neither the
    /// word nor the decision times can tell the two apart (a stale reading
    /// can be older than a later admission's). For example, on a keyed pair
    /// with parts (1, 1/100 ns) and (3, 1/100 ns): a request reads 1127, is
    /// admitted by the first part and denied by the second; meanwhile a
    /// request at 3534 finds the first part full. A refund of `min(n·I,
    /// written − now)` at the stale 1127 would give that request's permit
    /// away, and a third request would be admitted at 3534: 2 against a
    /// capacity of 1. A refund that finds the word moved keeps the permits:
    /// under-admission, and only when another request on the same state was
    /// admitted between our admission and our refund.
    fn refund(
        &self,
        state: Self::Word,
        before: Self::Word,
        written: Self::Word,
        _n: u32,
    ) -> Option<Self::Word> {
        (state == written).then_some(before)
    }

    /// Whether `state` decides, at `now` and at every later time, exactly as
    /// [`INITIAL`](Machine::INITIAL) does (and snapshots as it does). Exact:
    /// the keyed layer evicts on it.
    ///
    /// The default, "full with nothing to refill", is exactly that for the
    /// one-word machines (a GCRA word with `TAT <= now`; a meter with
    /// `empty_at <= now`, i.e. empty; a window word counting nothing in the
    /// current window).
    fn is_fresh(&self, state: Self::Word, now: u64) -> bool {
        let snap = self.snapshot(state, now);
        snap.available == snap.capacity && snap.until_full.is_zero()
    }

    /// The state under `to` that carries `state` (under `from`) over at `now`.
    /// Maps every fresh state to [`INITIAL`](Machine::INITIAL), whatever
    /// `carry`.
    fn carry(from: &Self, to: &Self, state: Self::Word, now: u64, carry: Carry) -> Self::Word;
}

/// A machine whose state is a schedule: a request can be *booked* to start
/// later, up to a wait bound, and a booking cancelled by
/// [`refund`](Machine::refund)'s stack rule (the token bucket, the leaky
/// bucket meter, the shaper and warm-up).
pub(crate) trait Schedule: Machine {
    /// The state after booking `n` permits at `now`, and their start (at
    /// least `now`, at most `now + max_wait`); or the denial, whose
    /// retry-after is the time until the same booking would fit the bound.
    fn book(
        &self,
        state: Self::Word,
        now: u64,
        n: u32,
        max_wait: u64,
    ) -> Result<(Self::Word, u64), Denied>;

    /// The state after booking `n` permits that must start at `now`: the
    /// decision of a machine that admits only what its schedule lets start
    /// at once (the shaper and warm-up as [`RateLimiter`](crate::RateLimiter)s).
    /// The token bucket's decision is this booking in closed form.
    #[inline]
    fn book_now(&self, state: Self::Word, now: u64, n: u32) -> Result<Self::Word, Denied> {
        self.book(state, now, n, 0).map(|(after, _)| after)
    }
}

/// A two-word machine's state (the shaper's, warm-up's), `high << 64 | low`:
/// one `u128`, so that both words change together.
#[inline]
pub(crate) fn pack(high: u64, low: u64) -> u128 {
    (u128::from(high) << 64) | u128::from(low)
}

/// A two-word machine's state as `(high, low)`.
#[inline]
pub(crate) fn unpack(state: u128) -> (u64, u64) {
    ((state >> 64) as u64, state as u64)
}

/// `numerator / denominator` of `x`, rounded up, in 128 bits: a carry-over
/// rounds towards "in use", never handing out a permit.
pub(crate) fn scale_up(x: u64, numerator: u64, denominator: u64) -> u64 {
    let scaled = (u128::from(x) * u128::from(numerator)).div_ceil(u128::from(denominator.max(1)));
    u64::try_from(scaled).unwrap_or(u64::MAX)
}

/// A booking on a [`Schedule`]: enough to report it and to undo it (the
/// waiting layer's reservations hold one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(unreachable_pub)] // public only as the sealed `RawReserve`'s result
pub struct Ticket {
    /// When the permits may be used, on the limiter's timeline.
    pub(crate) start: u64,
    pub(crate) permits: u32,
    /// The limiter's state right after booking, and what to restore on
    /// cancel, widened to hold either width (see [`Word::widen`]).
    pub(crate) after: u128,
    pub(crate) before: u128,
}

/// What an admission leaves for its refund: the word it replaced, the word
/// it wrote, and how many permits it took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WordReceipt<W = u64> {
    pub(crate) before: W,
    pub(crate) written: W,
    pub(crate) n: u32,
}

/// A limiter over one state word: its machine, where its word lives (an
/// atomic cell or a locked one), and its clock.
#[derive(Debug)]
pub(crate) struct WordLimiter<M, S, C> {
    machine: M,
    /// On its own cache line: the limiter is one per use, and its word is
    /// what every request writes.
    state: CachePadded<S>,
    timeline: Timeline<C>,
}

impl<M: Machine, S: StateCell<Word = M::Word>, C: Clock> WordLimiter<M, S, C> {
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
    ) -> Result<(Snapshot, WordReceipt<M::Word>), Rejection> {
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
    pub(crate) fn try_acquire_n_receipt(&self, n: u32) -> Result<WordReceipt<M::Word>, Denied> {
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
    /// machine's [`refund`](Machine::refund) rule allows; otherwise leaves
    /// the word alone. Returns whether it gave them back.
    pub(crate) fn refund(&self, receipt: WordReceipt<M::Word>) -> bool {
        // The "denial" only stops the update: nothing is written.
        self.state
            .update(|word| {
                self.machine
                    .refund(word, receipt.before, receipt.written, receipt.n)
                    .ok_or(Denied::ZeroPermits)
            })
            .is_ok()
    }

    pub(crate) fn machine(&self) -> &M {
        &self.machine
    }

    pub(crate) fn clock(&self) -> &C {
        self.timeline.clock()
    }
}

/// `word_limiter!(docs Name<H>, Machine, "Atomic", "Locking")` declares the
/// one public type behind a limiter and its locking twin over a [`Machine`]
/// of either width, generic over where its word lives
/// ([`Home`](crate::cell::Home)): the struct, its
/// [`RateLimiter`](crate::RateLimiter) and [`Refundable`](crate::Refundable)
/// impls, and a `Debug` that prints the alias's name (`"Atomic"` or
/// `"Locking"`). Constructors, which differ per algorithm, and the clock
/// accessor, whose example needs an alias, are written by hand.
/// `word_limiter!(@impls [generics] Type)` writes the two trait impls alone.
macro_rules! word_limiter {
    (@impls [$($generics:tt)*] $limiter:ty) => {
        impl<$($generics)*> $crate::limiter::RateLimiter for $limiter {
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
                keep: $crate::limiter::Keep<'_>,
            ) -> bool {
                $crate::refund::decide_then(self, n, keep)
            }
        }

        impl<$($generics)*> $crate::refund::Refundable for $limiter {
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
    ($(#[$doc:meta])* $name:ident<H>, $machine:ty, $atomic:literal, $locking:literal) => {
        $(#[$doc])*
        pub struct $name<H: $crate::cell::Home, C = $crate::clock::MonotonicClock> {
            inner: $crate::machine::WordLimiter<
                $machine,
                H::Cell<<$machine as $crate::machine::Machine>::Word, $crate::cell::Alone>,
                C,
            >,
        }

        impl<H: $crate::cell::Home, C: std::fmt::Debug> std::fmt::Debug for $name<H, C> {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                // The alias's name: the one the user wrote, not the generic
                // type's.
                f.debug_struct(H::name($atomic, $locking))
                    .field("inner", &self.inner)
                    .finish()
            }
        }

        $crate::machine::word_limiter!(
            @impls [H: $crate::cell::Home, C: $crate::clock::Clock] $name<H, C>
        );
    };
}

pub(crate) use word_limiter;

/// Reservations: a booking on the machine's schedule, and its cancellation.
impl<M: Schedule, S: StateCell<Word = M::Word>, C: Clock> WordLimiter<M, S, C> {
    #[inline]
    pub(crate) fn now(&self) -> u64 {
        self.timeline.now()
    }

    /// Books `n` permits to start within `max_wait` of now; a denial writes
    /// nothing.
    #[inline]
    pub(crate) fn reserve(&self, n: u32, max_wait: u64) -> Result<Ticket, Denied> {
        check_request(n, self.machine.capacity())?;
        // One reading per request, reused on a lost race: a stale reading sees
        // more of the schedule ahead of it, so it can only wait longer.
        let now = self.timeline.now();
        let mut booked = Ticket {
            start: 0,
            permits: n,
            after: 0,
            before: 0,
        };
        self.state.update(|state| {
            let (after, start) = self.machine.book(state, now, n, max_wait)?;
            // The values of the decision that is stored last are the ones kept.
            booked = Ticket {
                start,
                permits: n,
                after: after.widen(),
                before: state.widen(),
            };
            Ok::<_, Denied>(after)
        })?;
        Ok(booked)
    }

    /// Cancels `ticket`'s booking by the machine's refund rule: as if it had
    /// never been made if no later booking is outstanding, otherwise nothing.
    pub(crate) fn cancel(&self, ticket: &Ticket) -> bool {
        self.refund(WordReceipt {
            before: M::Word::narrow(ticket.before),
            written: M::Word::narrow(ticket.after),
            n: ticket.permits,
        })
    }
}
