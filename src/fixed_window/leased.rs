//! The leased fixed window: the window word hands out batches of the current
//! window's count to cache-padded per-core stripes, and each thread spends
//! permits from its own stripe, so threads on different cores write different
//! cache lines.
//!
//! # Batches and their time bound
//!
//! The word is the [`FixedWindow`](crate::FixedWindow)'s: `(index, count)`,
//! where `count` is everything *charged* to window `index` — permits admitted
//! through the word and permits leased to stripes. A stripe holds a batch
//! `(epoch, lease)`: `lease` permits already charged to window `epoch`, not yet
//! spent. A batch is spent only by a reading **inside its own window**
//! (`epoch·W ≤ now < (epoch + 1)·W`): a batch leased in window `w` and spent in
//! window `w + 1` would put `w`'s permits into `w + 1` beside `w + 1`'s own full
//! count (the loom model `known_bad_batch_spent_in_a_later_window_is_caught`
//! shows it), and a stale reading from an older window than the batch's is not
//! allowed to spend it either (it goes to the word, which charges it to the
//! stored window, as the plain window does). Batches shrink as the window runs
//! low: a batch is a `1/(2·stripes)` share of what the window has left after
//! the request that leases it, so a window near its limit leases nothing.
//!
//! # State
//!
//! With `b` = the number of bits needed to hold the limit:
//!
//! | atomic | bits | meaning |
//! |---|---|---|
//! | word (`AtomicU64`, own cache line) | `0 .. b` | permits charged to the window below: admitted through the word, or leased |
//! | | `b .. 64` | index of the newest window opened |
//! | stripe `k` (`AtomicU64`, own cache line) | `0 .. b` | `lease`: permits of window `epoch` the stripe may still spend (0: empty) |
//! | | `b .. 64` | `epoch`: the window the lease was charged to; only grows |
//!
//! | operation | reads | writes |
//! |---|---|---|
//! | spend from own stripe (fast path) | stripe | `lease − n` by CAS, iff `now` is in window `epoch` and `lease ≥ n` |
//! | lease (slow path) | stripe, word | the stripe's lease taken out by `fetch_and` (only if it held one); word `(i, c) → (j, c' + n + spare)` by CAS, `j` = the later of `i` and the reading's window, `c'` = `c` less the taken lease if it was `j`'s (given back), else `0` in a new window; the spare goes into the stripe (merged with a batch of `j`, replacing an older one), or back to the word if the stripe has moved past `j` |
//! | direct denial (own stripe empty) | stripe, word | nothing, if window `j` of the word and `now` has no room for `n`; retry-after = end of window `j` − `now` |
//! | deny | stripe, word | the taken lease given back to the word (`c → c − lease`) if the word is still at its window; retry-after = end of window `j` − `now` |
//! | snapshot | word, every stripe | nothing; the plain window's snapshot at `c − Σ` leases of window `i` |
//!
//! Every ordering is `Relaxed`: the word and the stripes hold counts charged
//! to windows, moved between places only by read-modify-writes, and no other
//! memory is published through them. See docs/algorithms.md ("Leased fixed
//! window") for the proof.

use std::time::Duration;

use crossbeam_utils::CachePadded;

use super::counter::WindowCounter;
use crate::cell::{self, Alone, Loss};
use crate::clock::{Clock, MonotonicClock};
use crate::error::{ConfigError, Denied};
use crate::limiter::{RateLimiter, Rejection, Snapshot, check_request, report};
use crate::machine::Machine;
use crate::rate::Rate;
use crate::stripe::{Refused, Stripes, default_stripes};
use crate::sync::{AtomicU64, Ordering};
use crate::timeline::Timeline;

/// A lock-free fixed window whose count is leased in batches to per-core
/// stripes: the same guarantee as [`FixedWindow`](crate::FixedWindow) (at most
/// `rate.permits()` per aligned window of `rate.period()`), with most checks
/// writing only the calling thread's own cache line.
///
/// Choose it for one window shared by many threads on many cores, where most
/// checks admit. Each check does more than [`FixedWindow`](crate::FixedWindow)'s
/// (a stripe load and a window test before its CAS; a denial on an empty
/// stripe also reads the window's word, and writes nothing, as the plain
/// window's does), docs/benchmarks.md. Permits leased to one thread's stripe are not
/// available to another until the window ends, so under contention it can
/// deny a request the plain window would admit (under-admission, bounded in
/// docs/algorithms.md, measured in docs/benchmarks.md); it never admits more.
/// With one thread, or whenever every request comes from the same stripe, it makes exactly the
/// decisions of [`LockingFixedWindow`](crate::LockingFixedWindow), its locking
/// twin, retry-afters and snapshots included.
///
/// ```
/// use std::time::Duration;
/// use tollgate::{Denied, LeasedFixedWindow, ManualClock, Rate, RateLimiter};
///
/// let clock = ManualClock::new();
/// let window = LeasedFixedWindow::with_clock(Rate::per_second(5), clock.clone()).unwrap();
/// assert!(window.try_acquire_n(5).is_ok());
/// assert_eq!(window.try_acquire(), Err(Denied::RetryAfter(Duration::from_secs(1))));
/// clock.advance(Duration::from_secs(1));
/// assert!(window.try_acquire().is_ok());
/// ```
#[derive(Debug)]
pub struct LeasedFixedWindow<C = MonotonicClock> {
    counter: WindowCounter,
    /// The window's length in ns, copied out for the hot path.
    window: u64,
    word: CachePadded<AtomicU64>,
    /// Each holds a batch `(epoch, lease)`.
    stripes: Stripes,
    timeline: Timeline<C>,
}

impl LeasedFixedWindow {
    /// `rate.permits()` per aligned window of `rate.period()`, windows starting
    /// now, with one stripe per CPU, on the default [`MonotonicClock`].
    ///
    /// Errors: those of [`FixedWindow::new`](crate::FixedWindow::new).
    ///
    /// ```
    /// use tollgate::{ConfigError, LeasedFixedWindow, Rate};
    /// let api = LeasedFixedWindow::new(Rate::per_minute(100)).unwrap();
    /// assert_eq!(LeasedFixedWindow::new(Rate::per_second(0)).unwrap_err(), ConfigError::ZeroRate);
    /// # let _ = api;
    /// ```
    pub fn new(rate: Rate) -> Result<Self, ConfigError> {
        Self::with_clock(rate, MonotonicClock::new())
    }
}

impl<C: Clock> LeasedFixedWindow<C> {
    /// As [`LeasedFixedWindow::new`], reading `clock`.
    ///
    /// ```
    /// use tollgate::{CachedClock, LeasedFixedWindow, Rate};
    /// let window = LeasedFixedWindow::with_clock(Rate::per_second(10), CachedClock::new()).unwrap();
    /// # let _ = window;
    /// ```
    pub fn with_clock(rate: Rate, clock: C) -> Result<Self, ConfigError> {
        Self::with_stripes(rate, clock, default_stripes())
    }

    /// As [`LeasedFixedWindow::with_clock`], with `stripes` stripes (rounded up
    /// to a power of two, between 1 and 256). One stripe makes every thread
    /// share one batch: none of the scaling.
    ///
    /// ```
    /// use tollgate::{LeasedFixedWindow, ManualClock, Rate};
    /// let window = LeasedFixedWindow::with_stripes(Rate::per_second(10), ManualClock::new(), 3).unwrap();
    /// assert_eq!(window.stripes(), 4);
    /// ```
    pub fn with_stripes(rate: Rate, clock: C, stripes: usize) -> Result<Self, ConfigError> {
        let counter = WindowCounter::new(rate)?;
        Ok(LeasedFixedWindow {
            window: counter.window_ns(),
            counter,
            // Window 0, nothing charged; every stripe "window 0, nothing leased".
            word: CachePadded::new(AtomicU64::new(WindowCounter::INITIAL)),
            stripes: Stripes::new(stripes, WindowCounter::INITIAL),
            timeline: Timeline::new(clock),
        })
    }

    /// The window's length.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{LeasedFixedWindow, Rate};
    /// let window = LeasedFixedWindow::new(Rate::per_minute(100)).unwrap();
    /// assert_eq!(window.window(), Duration::from_secs(60));
    /// ```
    pub fn window(&self) -> Duration {
        self.counter.window()
    }

    /// The number of stripes.
    ///
    /// ```
    /// use tollgate::{LeasedFixedWindow, ManualClock, Rate};
    /// let window = LeasedFixedWindow::with_stripes(Rate::per_second(10), ManualClock::new(), 2).unwrap();
    /// assert_eq!(window.stripes(), 2);
    /// ```
    pub fn stripes(&self) -> usize {
        self.stripes.len()
    }

    /// The clock this limiter reads.
    ///
    /// ```
    /// use tollgate::{Clock, LeasedFixedWindow, ManualClock, Rate};
    /// let clock = ManualClock::new();
    /// let window = LeasedFixedWindow::with_clock(Rate::per_second(1), clock.clone()).unwrap();
    /// clock.set(7);
    /// assert_eq!(window.clock().now(), 7);
    /// ```
    pub fn clock(&self) -> &C {
        self.timeline.clock()
    }

    /// Admits `n` (in `1..=limit`) at reading `now`: from the calling thread's
    /// stripe when it holds a batch of `now`'s window with room, else through
    /// the word.
    #[inline]
    fn acquire_at(&self, now: u64, n: u32) -> Result<(), Denied> {
        let own = self.stripes.own();
        let n = u64::from(n);
        // The spend is decided on the very batch it replaces (see `Stripes`
        // for the orderings); a refusal carries the lease it found.
        let spent = self.stripes.spend(own, |batch| {
            let (epoch, lease) = self.counter.unpack(batch);
            // The time bound: only a reading inside the batch's own window may
            // spend it. `now − start` wraps to a huge value when `now` is
            // before the start; `epoch` is at most `END / W`, so no overflow.
            if now.wrapping_sub(epoch * self.window) >= self.window || lease < n {
                return Err(lease);
            }
            // The count is the low bits: subtracting `n ≤ lease` keeps the
            // epoch.
            Ok(batch - n)
        });
        let Err(lease) = spent else {
            return Ok(());
        };
        // An empty stripe has nothing to give back, so the slow path would
        // decide on the word alone: a full window denies here, reading the
        // word and writing nothing (a flood of denials costs what it does on
        // the plain window).
        if lease == 0 {
            if let Some(denied) = self.deny_direct(now, n) {
                return Err(denied);
            }
        }
        self.acquire_slow(now, n, own, lease > 0)
    }

    /// The denial the slow path would make for a stripe that holds nothing,
    /// if the word's window is full for `n` at `now`; `None` if it has room
    /// (or a new window opens), which the slow path then leases.
    #[inline]
    fn deny_direct(&self, now: u64, n: u64) -> Option<Denied> {
        // Relaxed: a denial on any value the word held during the request is
        // one the slow path could have made on that value (its first load); a
        // denial writes nothing, so nothing is published or checked.
        let state = self.word.load(Ordering::Relaxed);
        let (j, count) = self.counter.counted(state, now);
        (count + n > self.counter.limit()).then(|| self.counter.denial(j, now))
    }

    /// The stripe cannot serve the request: take its batch out, give it back
    /// to the word if the word is still at its window, and decide on the word,
    /// leasing a spare batch for the stripe when the window has room to spare.
    /// `had_lease`: the stripe held a batch when last read; if it did not, the
    /// stripe is not written before the decision, so a denial on an empty
    /// stripe writes nothing.
    #[inline(never)]
    fn acquire_slow(&self, now: u64, n: u64, own: usize, had_lease: bool) -> Result<(), Denied> {
        // Relaxed: the RMW makes the batch's permits ours alone (no other
        // thread can spend them once the count is cleared); the epoch stays,
        // so the stripe's epochs only grow.
        let (held_epoch, held) = if had_lease {
            self.counter.unpack(
                self.stripes
                    .get(own)
                    .fetch_and(!self.counter.count_mask(), Ordering::Relaxed),
            )
        } else {
            (0, 0)
        };
        // The step the last decision took: what a stored word means.
        let last = std::cell::Cell::new(None);
        // `Alone`: a charge or a give-back is decided on the very word it
        // replaces and publishes nothing; the fresh word a lost race returns
        // is all the next decision needs, decided on at once.
        let stored = cell::update::<Alone, u64, Denied>(
            &self.word,
            |state| {
                let step = self.word_step(state, now, n, held_epoch, held);
                last.set(Some(step));
                match step {
                    WindowStep::Deny {
                        denied,
                        give_back: None,
                    } => Err(denied),
                    WindowStep::Deny {
                        give_back: Some(next),
                        ..
                    } => Ok(next),
                    WindowStep::Admit { next, .. } => Ok(next),
                }
            },
            |_, _| Loss::DecideAgain,
        );
        match (stored, last.get()) {
            (Err(denied), _) | (Ok(_), Some(WindowStep::Deny { denied, .. })) => Err(denied),
            (Ok(_), Some(WindowStep::Admit { window, spare, .. })) => {
                self.install(own, window, spare);
                Ok(())
            }
            (Ok(_), None) => unreachable!("a word is stored only by a decision"),
        }
    }

    /// What the word `state` says to a request of `n` at `now` the stripe
    /// could not serve, `held` permits of window `held_epoch` having been
    /// taken out of the stripe: a pure decision, which the caller commits
    /// with one compare-and-swap of `state`.
    #[inline]
    fn word_step(&self, state: u64, now: u64, n: u64, held_epoch: u64, held: u64) -> WindowStep {
        let limit = self.counter.limit();
        let (index, _) = self.counter.unpack(state);
        // `j`: the later of the reading's window and the stored one.
        let (j, count) = self.counter.counted(state, now);
        // Our batch is part of the count of `j` if it was leased in `j` and
        // `j` is still the word's window: it goes back before we decide.
        let back = if held > 0 && held_epoch == index && j == index {
            held
        } else {
            0
        };
        // `count ≥ back`: the batch is charged to `index` (invariant C).
        let count = count - back;
        if count + n > limit {
            // A batch of an older window is forgotten: never spent.
            return WindowStep::Deny {
                denied: self.counter.denial(j, now),
                give_back: (back > 0).then(|| self.counter.pack(j, count)),
            };
        }
        // The spare batch: a `1/(2·stripes)` share of what the window has
        // left after this request, so all stripes together hold at most
        // about half of it and a window running low leases nothing.
        let spare = (limit - count - n) / (2 * self.stripes.len() as u64);
        WindowStep::Admit {
            // `count + n + spare ≤ limit`: the count stays in its bits.
            next: self.counter.pack(j, count + n + spare),
            window: j,
            spare,
        }
    }

    /// Puts `spare` permits, just charged to window `j`, into stripe `own`:
    /// merged with a batch of `j`, replacing a batch of an older window
    /// (forgotten: its window is over), or, if the stripe has moved past `j`
    /// (another thread of the stripe leased in a later window), back to the
    /// word while it is still at `j` (else forgotten). With nothing to spare,
    /// the stripe's epoch is still raised to `j`, so a thread never spends
    /// from an older window than one it was already charged to.
    fn install(&self, own: usize, j: u64, spare: u64) {
        let _ = self.stripes.keep_or_return(
            own,
            |batch| {
                let (epoch, lease) = self.counter.unpack(batch);
                if epoch == j && spare > 0 {
                    // Both are charged to `j`, whose count is at most `limit`.
                    Ok(self.counter.pack(j, lease + spare))
                } else if epoch < j {
                    Ok(self.counter.pack(j, spare))
                } else if epoch > j && spare > 0 {
                    Err(Refused::Return)
                } else {
                    // Nothing to merge, or nothing to give back.
                    Err(Refused::Leave)
                }
            },
            &self.word,
            |state| {
                let (index, count) = self.counter.unpack(state);
                if index != j {
                    return Err(());
                }
                // `count ≥ spare`: they are charged to `j` (invariant C).
                Ok(self.counter.pack(j, count - spare))
            },
        );
    }

    /// The word with every stripe's unspent batch of the word's window counted
    /// as not charged: what the window would hold if they were given back.
    fn effective_state(&self) -> u64 {
        // Relaxed: a point-in-time estimate (see `RateLimiter::snapshot`).
        let (index, count) = self.counter.unpack(self.word.load(Ordering::Relaxed));
        let leased = self.stripes.iter().fold(0u64, |sum, stripe| {
            let (epoch, lease) = self.counter.unpack(stripe.load(Ordering::Relaxed));
            if epoch == index { sum + lease } else { sum }
        });
        // Saturating: the loads are not one consistent state.
        self.counter.pack(index, count.saturating_sub(leased))
    }
}

impl<C: Clock> RateLimiter for LeasedFixedWindow<C> {
    #[inline]
    fn try_acquire_n(&self, n: u32) -> Result<(), Denied> {
        check_request(n, self.counter.capacity())?;
        // One reading per request, the decision time of whatever path decides.
        let now = self.timeline.now();
        self.acquire_at(now, n)
    }

    /// The window's state with every stripe's unspent batch of the current
    /// window counted as available: exact when no batch is outstanding
    /// elsewhere (one thread, or one stripe); with batches on other stripes,
    /// `available` includes permits only those stripes' threads can spend.
    fn snapshot(&self) -> Snapshot {
        let now = self.timeline.now();
        self.counter.snapshot(self.effective_state(), now)
    }

    /// Decides, then reads the snapshot at the decision's own reading: the
    /// state is spread over stripes, so the report is not the word a CAS wrote.
    fn try_acquire_n_with_snapshot(&self, n: u32) -> Result<Snapshot, Rejection> {
        let now = self.timeline.now();
        let outcome = match check_request(n, self.counter.capacity()) {
            Ok(()) => self.acquire_at(now, n),
            Err(denied) => Err(denied),
        };
        report(outcome, self.counter.snapshot(self.effective_state(), now))
    }
}

/// What the word says to a request the stripe could not serve
/// (`LeasedFixedWindow::word_step`).
#[derive(Debug, Clone, Copy)]
enum WindowStep {
    /// Denied; `give_back`: the word to write first, the count less the
    /// batch taken out when it was charged to the word's window.
    Deny {
        denied: Denied,
        give_back: Option<u64>,
    },
    /// Admitted: the word becomes `next`, charging `spare` more permits of
    /// `window` for the stripe.
    Admit { next: u64, window: u64, spare: u64 },
}
