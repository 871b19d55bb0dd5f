//! The leased token bucket: the GCRA word hands out runs of its timeline to
//! cache-padded per-core stripes, and each thread spends permits from its own
//! stripe, so threads on different cores write different cache lines.
//!
//! # The timeline of slots
//!
//! GCRA hands out permits as *slots*: intervals of length `I` (the emission
//! interval) on the limiter's timeline. An admission of `n` at reading `s` with
//! theoretical arrival time `TAT` takes the slots starting at
//! `x = max(TAT, s) + j·I`, `j < n`, and is allowed iff the last of them starts
//! no later than `s + τ`, `τ = (capacity − 1)·I`. So every admitted slot
//! satisfies `s ≤ x ≤ s + τ`, and slots never overlap; that is the whole bound
//! (docs/algorithms.md, "Leased token bucket").
//!
//! Here the word hands out a *lease*: a run `[next, end)` of the timeline, more
//! slots than the request needs, taken by the same GCRA test. The run is put in
//! the thread's stripe, and later requests carve their slots out of it by the
//! same rule: at reading `s`, `n` permits start at `max(next, s)` and are
//! admitted iff `max(next, s) + n·I ≤ min(end, s + capacity·I)`. A stripe is a
//! GCRA word with an end. The `s` in `max` expires the part of the lease that
//! time has passed (pure GCRA forgets the same slots); the `s + capacity·I`
//! bound keeps a stale or backwards reading from spending a slot more than `τ`
//! ahead of it. Without that time bound a lease taken at `v` and spent much later
//! over-admits, and the loom model `known_bad_untimed_lease_is_caught` shows it.
//!
//! # State
//!
//! | atomic | bits | meaning |
//! |---|---|---|
//! | word (`AtomicU64`, own cache line) | 0–63 | the TAT: every slot before it has been leased, spent or forgotten; every slot from it on is free. Below `2^63`, as the plain bucket's. |
//! | stripe `k` (`AtomicU64`, own cache line) | 63 | set: the stripe holds nothing (at birth, and once a lease is used up) |
//! | | 0–62 | `next`: the first slot start of the stripe's lease. The lease ends at `end(next)`, the first multiple of `2^b` above `next` — `b` fixed at construction (`2^b ≤ capacity·I / (2·stripes)`) — so one word says where the lease starts *and* ends. |
//! | contended-until (`AtomicU64`, own cache line) | 0–63 | readings below it go to the stripes, later ones straight to the word; raised to `s + CONTENDED_FOR` by a lost CAS on the word once less than half that window is left. A hint: no decision depends on it. |
//!
//! | operation | reads | writes |
//! |---|---|---|
//! | direct admission (uncontended: `s` ≥ contended-until) | contended-until, word | `TAT := max(TAT, s) + n·I` by one CAS, iff `≤ s + τ + I`; a lost CAS goes on to the stripes |
//! | direct denial | contended-until, word, own stripe | nothing, if the own stripe is empty (else the stripes decide) |
//! | spend from own stripe (contended fast path) | stripe | `next := max(next, s) + n·I` by CAS (empty if that is `end(next)`) |
//! | lease (slow path) | stripe, word | stripe emptied by swap (if it held a lease); word `TAT → v` or `→ end(v)` by CAS, `v = max(base, s) + n·I`, `base` = the old lease's `next` if the word still ends at it (the old lease given back), else the TAT; the spare `[v, end(v))` is leased when it holds a slot and is at most `(s + capacity·I − v) / (2·stripes)` long, and goes into the stripe if it is still empty, else back to the word |
//! | deny | stripe, word | the old lease given back to the word, or put back in the stripe while it still holds a slot (forgotten once time has passed it) |
//! | snapshot | word, every stripe | nothing |
//!
//! Leases are at most `2^b` ns of the timeline, at most `capacity·I /
//! (2·stripes)`, and at most a `1/(2·stripes)` share of what the bucket could
//! still grant when leased: together the stripes hold at most half of it, and
//! a bucket running low leases nothing (each request takes exactly its own
//! slots from the word).
//!
//! Every ordering is `Relaxed`: the word and the stripes are intervals of time
//! owned by exactly one place at a time, moved between places only by
//! read-modify-writes, and no other memory is published through them. Each
//! decision is a pure function of the one value its CAS replaces; see
//! docs/algorithms.md for the ownership argument.

use std::time::Duration;

use crossbeam_utils::CachePadded;

use super::gcra::Gcra;
use crate::cell::{self, Alone, Loss};
use crate::clock::{Clock, MonotonicClock};
use crate::error::{ConfigError, Denied};
use crate::limiter::{RateLimiter, Rejection, Snapshot, check_request, report};
use crate::machine::Machine;
use crate::rate::Rate;
use crate::stripe::{Refused, Stripes, default_stripes};
use crate::sync::fault::{Fault, injected};
use crate::sync::{AtomicU64, Ordering};
use crate::timeline::Timeline;

/// A stripe that holds nothing: bit 63, which no slot start has.
const EMPTY: u64 = 1 << 63;

/// How long (ns of the limiter's timeline, about 1 ms) requests keep to the
/// stripes after a compare-and-swap on the word was lost to another thread.
/// A time, not a count of attempts, so it means the same on every CPU: once
/// it has passed, the next request probes the word directly again, and a
/// probe that loses costs one failed CAS (well under a microsecond) per
/// window per thread — under 0.1% of the window whatever the hardware.
const CONTENDED_FOR: u64 = 1 << 20;

/// A lock-free token bucket whose permits are leased to per-core stripes: the
/// same guarantee as [`TokenBucket`](crate::TokenBucket) (at most
/// `capacity + rate·(b − a)` permits in any `[a, b]` of decision times), with
/// most checks writing only the calling thread's own cache line.
///
/// Choose it for one limiter shared by many threads on many cores. While no
/// other thread contends for the shared word, requests go straight to it, as
/// in [`TokenBucket`](crate::TokenBucket) (one more load of a line nobody
/// writes); a compare-and-swap lost to another thread sends requests to the
/// stripes for about a millisecond of the limiter's clock (docs/algorithms.md). Permits leased to one thread's stripe are not
/// available to another until they are spent or expire, so under contention it
/// can deny a request the plain bucket would admit (under-admission, bounded
/// in docs/algorithms.md, measured in docs/benchmarks.md); it never admits
/// more. With one thread, or whenever every request comes from the same stripe, it makes exactly the
/// decisions of [`LockingTokenBucket`](crate::LockingTokenBucket), its locking
/// twin, retry-afters included.
///
/// How it works: a permit is a *slot* of length `1/rate` on the bucket's
/// timeline, spendable at a reading `s` only if it starts in `[s, s + (capacity
/// − 1)/rate]`. The shared GCRA word leases runs of slots `[next, end)` to the
/// stripes; a stripe spends `n` at `s` from `max(next, s)` if the `n` slots fit
/// both before `end` and before `s + capacity/rate`. The state table and the
/// proof of the bound are in docs/algorithms.md ("Leased token bucket").
///
/// ```
/// use std::time::Duration;
/// use tollgate::{Denied, LeasedTokenBucket, ManualClock, Rate, RateLimiter};
///
/// let clock = ManualClock::new();
/// let bucket = LeasedTokenBucket::with_clock(5, Rate::per_second(100), clock.clone()).unwrap();
/// assert!(bucket.try_acquire_n(5).is_ok());
/// assert_eq!(bucket.try_acquire(), Err(Denied::RetryAfter(Duration::from_millis(10))));
/// clock.advance(Duration::from_millis(10));
/// assert!(bucket.try_acquire().is_ok());
/// ```
#[derive(Debug)]
pub struct LeasedTokenBucket<C = MonotonicClock> {
    gcra: Gcra,
    /// `gcra`'s interval and tolerance, copied out for the hot path.
    interval: u64,
    tolerance: u64,
    /// `b`: leases end at multiples of `2^b` ns.
    shift: u32,
    word: CachePadded<AtomicU64>,
    /// Readings below this go to the stripes; from it on, straight to the
    /// word. Raised to `s + CONTENDED_FOR` when a CAS on the word is lost; a
    /// hint of which path is cheaper, never a part of a decision.
    contended_until: CachePadded<AtomicU64>,
    /// Each holds a lease `next` (its end implied) or [`EMPTY`].
    stripes: Stripes,
    /// `log2(2·stripes)`: a spare run is at most `room >> share_shift`.
    share_shift: u32,
    timeline: Timeline<C>,
}

impl LeasedTokenBucket {
    /// A full bucket of `capacity` permits refilled at `rate`, with one stripe
    /// per CPU, on the default [`MonotonicClock`].
    ///
    /// Errors: those of [`TokenBucket::new`](crate::TokenBucket::new).
    ///
    /// ```
    /// use tollgate::{ConfigError, LeasedTokenBucket, Rate};
    /// let api = LeasedTokenBucket::new(100, Rate::per_second(100)).unwrap();
    /// assert_eq!(LeasedTokenBucket::new(0, Rate::per_second(1)).unwrap_err(), ConfigError::ZeroCapacity);
    /// # let _ = api;
    /// ```
    pub fn new(capacity: u32, rate: Rate) -> Result<Self, ConfigError> {
        Self::with_clock(capacity, rate, MonotonicClock::new())
    }
}

impl<C: Clock> LeasedTokenBucket<C> {
    /// As [`LeasedTokenBucket::new`], reading `clock`.
    ///
    /// ```
    /// use tollgate::{CachedClock, LeasedTokenBucket, Rate};
    /// let bucket = LeasedTokenBucket::with_clock(10, Rate::per_second(10), CachedClock::new()).unwrap();
    /// # let _ = bucket;
    /// ```
    pub fn with_clock(capacity: u32, rate: Rate, clock: C) -> Result<Self, ConfigError> {
        Self::with_stripes(capacity, rate, clock, default_stripes())
    }

    /// As [`LeasedTokenBucket::with_clock`], with `stripes` stripes (rounded up
    /// to a power of two, between 1 and 256). One stripe makes every thread
    /// share one lease: none of the scaling, and a lease briefly out of the
    /// stripe (on its way back to the word) can still cost other threads a
    /// denial (docs/algorithms.md, "Under-admission").
    ///
    /// ```
    /// use tollgate::{LeasedTokenBucket, ManualClock, Rate};
    /// let bucket = LeasedTokenBucket::with_stripes(10, Rate::per_second(10), ManualClock::new(), 3).unwrap();
    /// assert_eq!(bucket.stripes(), 4);
    /// ```
    pub fn with_stripes(
        capacity: u32,
        rate: Rate,
        clock: C,
        stripes: usize,
    ) -> Result<Self, ConfigError> {
        let gcra = Gcra::new(capacity, rate)?;
        // Every stripe empty.
        let stripes = Stripes::new(stripes, EMPTY);
        let count = stripes.len() as u64;
        // The longest lease: a power of two of at most capacity·I / (2·stripes)
        // (at least 1 ns; a lease shorter than one slot is never taken).
        let share = (gcra.tolerance_ns() / (2 * count)).max(1);
        let shift = share.ilog2();
        Ok(LeasedTokenBucket {
            shift,
            interval: gcra.interval_ns(),
            tolerance: gcra.tolerance_ns(),
            gcra,
            // A TAT of zero: full at birth.
            word: CachePadded::new(AtomicU64::new(0)),
            // Uncontended at birth: the first requests go to the word (in a
            // loom model of the stripes, contended for ever: see
            // `Fault::AlwaysStriped`).
            contended_until: CachePadded::new(AtomicU64::new(if injected(Fault::AlwaysStriped) {
                u64::MAX
            } else {
                0
            })),
            share_shift: (2 * count).ilog2(),
            stripes,
            timeline: Timeline::new(clock),
        })
    }

    /// The time one permit takes to refill, as
    /// [`TokenBucket::emission_interval`](crate::TokenBucket::emission_interval).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{LeasedTokenBucket, Rate};
    /// let bucket = LeasedTokenBucket::new(1, Rate::per_second(100)).unwrap();
    /// assert_eq!(bucket.emission_interval(), Duration::from_millis(10));
    /// ```
    pub fn emission_interval(&self) -> Duration {
        self.gcra.interval()
    }

    /// The number of stripes.
    ///
    /// ```
    /// use tollgate::{LeasedTokenBucket, ManualClock, Rate};
    /// let bucket = LeasedTokenBucket::with_stripes(10, Rate::per_second(10), ManualClock::new(), 2).unwrap();
    /// assert_eq!(bucket.stripes(), 2);
    /// ```
    pub fn stripes(&self) -> usize {
        self.stripes.len()
    }

    /// The clock this limiter reads.
    ///
    /// ```
    /// use tollgate::{Clock, LeasedTokenBucket, ManualClock, Rate};
    /// let clock = ManualClock::new();
    /// let bucket = LeasedTokenBucket::with_clock(1, Rate::per_second(1), clock.clone()).unwrap();
    /// clock.set(7);
    /// assert_eq!(bucket.clock().now(), 7);
    /// ```
    pub fn clock(&self) -> &C {
        self.timeline.clock()
    }

    /// Where a lease starting at `next` ends: the first multiple of `2^b`
    /// above it. `next < 2^63` and `b ≤ 62`, so this is at most `2^63`.
    #[inline]
    fn end_of(&self, next: u64) -> u64 {
        ((next >> self.shift) + 1) << self.shift
    }

    /// Admits `n` (in `1..=capacity`) at reading `now`: straight from the
    /// word while no other thread contends for it, else from the calling
    /// thread's stripe when its lease has room, else through the word.
    #[inline]
    fn acquire_at(&self, now: u64, n: u32) -> Result<(), Denied> {
        // Relaxed: which path to take is a guess about cost; both paths are
        // exact on their own, whatever this load returns.
        if now >= self.contended_until.load(Ordering::Relaxed) {
            if let Some(admitted) = self.acquire_direct(now, n) {
                return admitted;
            }
        }
        self.acquire_striped(now, n)
    }

    /// The plain bucket's step on the word, tried once: `None` if the word
    /// cannot admit while the caller's own stripe holds a lease (the stripes
    /// decide, so that the lease still serves it) or another thread's CAS came
    /// first (the stripes decide, and keep deciding for [`CONTENDED_FOR`]).
    ///
    /// A direct admission takes the slots `[max(TAT, s), max(TAT, s) + n·I)`
    /// from the word, the lease step without a spare run: slots before the
    /// TAT are leased, spent or forgotten and never taken twice, so leases
    /// held by stripes are untouched and the bound is the one proven for the
    /// slow path (docs/algorithms.md).
    #[inline]
    fn acquire_direct(&self, now: u64, n: u32) -> Option<Result<(), Denied>> {
        let cost = u64::from(n) * self.interval;
        // Relaxed: a decision on a stale TAT is checked by the CAS below.
        let tat = self.word.load(Ordering::Relaxed);
        let spent = tat.max(now) + cost;
        let limit = now + self.tolerance;
        if spent > limit {
            // Relaxed: whether the stripe held a lease at some point during
            // the request; if it did not, the stripes' path would decide on
            // this same word to the same denial (its empty-stripe branch).
            let own = self.stripes.get(self.stripes.own());
            if own.load(Ordering::Relaxed) & EMPTY == 0 {
                return None;
            }
            return Some(Err(Denied::RetryAfter(Duration::from_nanos(spent - limit))));
        }
        // One CAS, not the crate's loop (`cell::update`): a lost race is not
        // decided again here but sends the request to the stripes, which
        // decide instead. Relaxed both ways: decided on the very TAT it
        // replaces, publishing nothing else. Strong: a spurious failure would
        // report contention that is not there.
        match self
            .word
            .compare_exchange(tat, spent, Ordering::Relaxed, Ordering::Relaxed)
        {
            Ok(_) => Some(Ok(())),
            Err(_) => {
                self.mark_contended(now);
                None
            }
        }
    }

    /// Keeps requests on the stripes until `now + CONTENDED_FOR`.
    #[cold]
    fn mark_contended(&self, now: u64) {
        let until = now + CONTENDED_FOR;
        // Relaxed: a hint (see `contended_until`). Racing raises may lower it
        // a little; never below a reading of this window, and never from the
        // `u64::MAX` of a loom model's `Fault::AlwaysStriped`, which no raise
        // exceeds. Raised only once less than half the window is left: every
        // check reads this line, and under steady contention a store per lost
        // race would make the hint itself a line the cores trade.
        if self.contended_until.load(Ordering::Relaxed) < until - CONTENDED_FOR / 2 {
            self.contended_until.store(until, Ordering::Relaxed);
        }
    }

    /// Admits `n` (in `1..=capacity`) at reading `now`: from the calling
    /// thread's stripe when its lease has room, else through the word.
    #[inline]
    fn acquire_striped(&self, now: u64, n: u32) -> Result<(), Denied> {
        let own = self.stripes.own();
        // `n ≤ capacity`, so `cost ≤ tolerance ≤ 2^62`; `now ≤ 2^62 − 1` and
        // slot starts stay below `2^63`, so no sum below overflows.
        let cost = u64::from(n) * self.interval;
        let limit = now + self.tolerance;
        // The spend is decided on the very lease it replaces (see `Stripes`
        // for the orderings); a refusal says whether the stripe held a lease.
        let spent = self.stripes.spend(own, |next| {
            if next & EMPTY != 0 {
                return Err(false);
            }
            let end = self.end_of(next);
            let after = next.max(now) + cost;
            // The slots `[max(next, now), after)` must lie in the lease and
            // start no later than `now + τ`; that is GCRA's own test, capped
            // at the lease's end.
            if after > end || after > limit {
                return Err(true);
            }
            // Used up exactly: `after` itself would name the next run.
            Ok(if after == end { EMPTY } else { after })
        });
        match spent {
            Ok(_) => Ok(()),
            Err(had_lease) => self.acquire_slow(now, n, own, had_lease),
        }
    }

    /// The stripe's lease cannot serve the request: take the lease out, give it
    /// back to the word if nothing was leased after it, and decide on the word,
    /// leasing a spare run for the stripe when there is room. `had_lease`: the
    /// stripe held a lease when last read; if it did not, it is left alone, so
    /// a denial on an empty stripe writes nothing.
    #[inline(never)]
    fn acquire_slow(&self, now: u64, n: u32, own: usize, had_lease: bool) -> Result<(), Denied> {
        // Relaxed: the swap makes the lease ours alone (no other thread can
        // spend it once it is out); nothing else is read on its strength. A
        // lease installed after the stripe was read empty stays where it is.
        let held = if had_lease {
            self.stripes.get(own).swap(EMPTY, Ordering::Relaxed)
        } else {
            EMPTY
        };
        let holding = held & EMPTY == 0;
        let held_end = if holding { self.end_of(held) } else { 0 };
        // Whether the lease still holds a slot for a later request: one that
        // time has passed is forgotten rather than put back, or each request
        // of its stripe would find it, fail on it and come here again.
        let alive = holding && held.max(now) + self.interval <= held_end;
        // The step the last decision took: what a stored word means.
        let last = std::cell::Cell::new(None);
        // `Alone`: each decision (a lease, a give-back or a spend alike) is
        // made on the very TAT it replaces and publishes nothing.
        let stored = cell::update::<Alone, u64, Denied>(
            &self.word,
            |tat| {
                let step = self.word_step(tat, held, holding, held_end, now, n);
                last.set(Some(step));
                match step {
                    WordStep::Deny {
                        denied,
                        give_back: None,
                    } => Err(denied),
                    WordStep::Deny {
                        give_back: Some(base),
                        ..
                    } => Ok(base),
                    WordStep::Admit { tat, .. } => Ok(tat),
                }
            },
            |tat, actual| {
                if actual != tat && matches!(last.get(), Some(WordStep::Admit { .. })) {
                    self.mark_contended(now);
                    // Lost to another thread: step aside before deciding
                    // again, as the plain bucket's cell does. Near the limit
                    // the stripes lease nothing and every request comes
                    // here, so without it the threads trade the word's line
                    // on every attempt.
                    Loss::StepAside
                } else {
                    // A spurious failure, or a give-back's: decide again.
                    Loss::DecideAgain
                }
            },
        );
        match (stored, last.get()) {
            (Err(denied), _) => {
                if alive {
                    self.keep(own, held);
                }
                Err(denied)
            }
            (Ok(_), Some(WordStep::Deny { denied, .. })) => Err(denied),
            (
                Ok(_),
                Some(WordStep::Admit {
                    giving_back, spare, ..
                }),
            ) => {
                if alive && !giving_back {
                    // Leased after by someone else: it cannot go back to
                    // the word, but it can stay where it was.
                    self.keep(own, held);
                }
                if let Some((spent, end)) = spare {
                    self.keep_or_return(own, spent, end);
                }
                Ok(())
            }
            (Ok(_), None) => unreachable!("a word is stored only by a decision"),
        }
    }

    /// What the word `tat` says to a request the stripe could not serve,
    /// `held` being the lease taken out of the stripe (if `holding`, ending
    /// at `held_end`): a pure decision, which the caller commits with one
    /// compare-and-swap of `tat`.
    #[inline]
    fn word_step(
        &self,
        tat: u64,
        held: u64,
        holding: bool,
        held_end: u64,
        now: u64,
        n: u32,
    ) -> WordStep {
        let cost = u64::from(n) * self.interval;
        let limit = now + self.tolerance;
        // The word ends exactly where our lease does: nothing was leased
        // after it, so its unspent part goes back (docs/algorithms.md).
        let giving_back = holding && tat == held_end;
        let base = if giving_back { held } else { tat };
        let spent = base.max(now) + cost;
        if spent > limit {
            return WordStep::Deny {
                denied: Denied::RetryAfter(Duration::from_nanos(spent - limit)),
                give_back: giving_back.then_some(base),
            };
        }
        // The spare run `[spent, end(spent))`, if it holds a slot and is at
        // most a `1/(2·stripes)` share of what the bucket may still grant
        // at this reading: leases stop as the bucket runs low.
        let end = self.end_of(spent);
        let share = (limit - spent) >> self.share_shift;
        let lease = end - spent >= self.interval && end - spent <= share;
        WordStep::Admit {
            tat: if lease { end } else { spent },
            spare: lease.then_some((spent, end)),
            giving_back,
        }
    }

    /// Puts a lease we own (starting at `next`, ending at `end_of(next)`) into
    /// stripe `own` if the stripe is empty; otherwise the lease is forgotten
    /// (its slots are never spent: under-admission only).
    fn keep(&self, own: usize, next: u64) {
        // Not through the word: a lease that cannot stay in its stripe is
        // one that was leased after, and cannot go back (`keep_or_return`).
        self.put(own, next, Refused::Leave, |_| Err(()));
    }

    /// Puts a spare run `[next, end)`, just leased, into stripe `own`, or, if
    /// another thread of the same stripe filled it first, gives it back to the
    /// word while nothing has been leased after it (else it is forgotten).
    fn keep_or_return(&self, own: usize, next: u64, end: u64) {
        self.put(own, next, Refused::Return, |tat| {
            if tat == end { Ok(next) } else { Err(()) }
        });
    }

    /// Stores `next` in stripe `own` if it is empty, else refuses with
    /// `refused` and, for `Refused::Return`, offers the word `give_back`.
    /// Inlined into both callers, so each keeps its own constant paths.
    #[inline(always)]
    fn put(
        &self,
        own: usize,
        next: u64,
        refused: Refused,
        give_back: impl FnMut(u64) -> Result<u64, ()>,
    ) {
        let _ = self.stripes.keep_or_return(
            own,
            |word| {
                if word == EMPTY {
                    Ok(next)
                } else {
                    Err(refused)
                }
            },
            &self.word,
            give_back,
        );
    }

    /// What the bucket would hold if every stripe's unexpired lease were given
    /// back: the word's TAT less the leased time still ahead of `now`.
    fn effective_tat(&self, now: u64) -> u64 {
        // Relaxed: a point-in-time estimate (see `RateLimiter::snapshot` below).
        let tat = self.word.load(Ordering::Relaxed);
        // Saturating: the loads are not one consistent state, so the sum is
        // not bounded by the TAT.
        let leased = self.stripes.iter().fold(0u64, |sum, stripe| {
            let next = stripe.load(Ordering::Relaxed);
            if next & EMPTY != 0 {
                return sum;
            }
            sum.saturating_add(self.end_of(next).saturating_sub(next.max(now)))
        });
        tat.saturating_sub(leased)
    }
}

impl<C: Clock> RateLimiter for LeasedTokenBucket<C> {
    #[inline]
    fn try_acquire_n(&self, n: u32) -> Result<(), Denied> {
        check_request(n, self.gcra.capacity())?;
        // One reading per request, the decision time of whatever path decides.
        let now = self.timeline.now();
        self.acquire_at(now, n)
    }

    /// The bucket's state with every stripe's unexpired lease counted as still
    /// available: exact when no lease is outstanding elsewhere (one thread, or
    /// one stripe); with leases on other stripes, `available` includes permits
    /// only those stripes' threads can spend until the leases run out.
    fn snapshot(&self) -> Snapshot {
        let now = self.timeline.now();
        self.gcra.snapshot(self.effective_tat(now), now)
    }

    /// Decides, then reads the snapshot at the decision's own reading (as the
    /// [`SlidingWindow`](crate::SlidingWindow) does): the state is spread over
    /// stripes, so the report is not the word a CAS wrote.
    fn try_acquire_n_with_snapshot(&self, n: u32) -> Result<Snapshot, Rejection> {
        let now = self.timeline.now();
        let outcome = match check_request(n, self.gcra.capacity()) {
            Ok(()) => self.acquire_at(now, n),
            Err(denied) => Err(denied),
        };
        report(outcome, self.gcra.snapshot(self.effective_tat(now), now))
    }
}

/// What the word says to a request the stripe could not serve
/// (`LeasedTokenBucket::word_step`).
#[derive(Debug, Clone, Copy)]
enum WordStep {
    /// Denied; `give_back`: the word to write first, the start of the
    /// lease taken out when nothing was leased after it.
    Deny {
        denied: Denied,
        give_back: Option<u64>,
    },
    /// Admitted: the word becomes `tat`; `spare`, a run `[spent, end)`
    /// leased to the stripe; `giving_back`, whether the lease taken out went
    /// back to the word on the way.
    Admit {
        tat: u64,
        spare: Option<(u64, u64)>,
        giving_back: bool,
    },
}
