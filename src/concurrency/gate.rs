//! The gate behind both concurrency limits: one word for the decision, a
//! queue under a lock for the waiters.
//!
//! # The word
//!
//! | bits | meaning |
//! |---|---|
//! | 0–31 | permits in flight: granted and not yet released |
//! | 32–62 | the limit, `1..=MAX_LIMIT` |
//! | 63 | `WAITING`: a waiter sleeps in the queue (see below) |
//!
//! The count and the limit share the word so that one compare-and-swap
//! decides an admission against the limit in force at that instant: a
//! `set_limit` and an acquire cannot both take effect on an older view of
//! each other. In-flight never exceeds the largest limit ever set (an
//! admission needs `in_flight < limit`, and nothing else adds to it), so 32
//! bits hold it and the limit's 31 leave one for the flag.
//!
//! Every write goes through the crate's one state cell ([`StateCell::update`]:
//! the atomic cell's compare-and-swap loop, or the twin's mutex), the release
//! included: a `fetch_sub` would need the cell's atomic, which the cell keeps
//! to itself so that there is one place a word is stored and retried. The
//! release's loop almost never retries (a lost race costs one more decision
//! of a subtraction).
//!
//! # The decision path is lock-free; waiting is not
//!
//! `try_acquire` is one CAS: admit iff `in_flight < limit`. A release
//! subtracts one and looks at the flag in the word it wrote: only if a waiter
//! sleeps, and the release left a permit free, does it take the queue's lock
//! to wake one. With nobody waiting, neither touches a lock.
//!
//! Waiters (threads and tasks) sleep in a queue under a mutex, as in tokio's
//! `batch_semaphore`, because waiting is not the decision path: a waiter is
//! on its way to sleep anyway. Three rules make a wake-up impossible to lose:
//!
//! 1. A waiter goes to sleep only by a CAS, made while holding the queue's
//!    lock, that either admits it (a permit is free) or finds the word full
//!    and sets `WAITING` in it (or finds it set already). It is then put in
//!    the queue before the lock is let go.
//! 2. `WAITING` is cleared only by a holder of the queue's lock, and only
//!    when the queue is empty. So while a waiter sleeps, the flag is set, and
//!    every release or growth after the waiter's CAS sees it in the word its
//!    own write produced.
//! 3. Whoever frees a permit while the flag is set (a release that leaves
//!    `in_flight < limit`, a `set_limit` that opens room) wakes that many
//!    sleepers, in the order they first queued; a woken waiter leaves the
//!    queue. A woken waiter then asks again by rule 1: it takes a free permit
//!    or goes back to sleep at its old place in the queue (its id). A woken
//!    waiter that is dropped, or times out, before asking again passes the
//!    wake-up on to the next sleeper, so the permit it was woken for is never
//!    left with nobody waiting for it.
//!
//! A permit is only ever taken by its own waiter's CAS, never handed to a
//! waiter while it sleeps: a dropped or leaked future, or a thread that gave
//! up, holds no permit. (A leaked future that had been woken keeps that
//! wake-up; the sleepers behind it wait for the next release. A dropped one
//! passes it on.) The price is fairness: a `try_acquire` may take the permit a
//! woken waiter was about to take; the waiter then sleeps again at the head
//! of the queue.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::task::Waker;

use crossbeam_utils::CachePadded;

use crate::cell::{Orders, StateCell};
use crate::sync::fault::{Fault, injected};
use crate::sync::park::{self, Thread};
use crate::sync::{Mutex, Ordering};

/// The largest limit: the word keeps it in 31 bits.
pub(crate) const MAX_LIMIT: u32 = (1 << 31) - 1;

const LIMIT_SHIFT: u32 = 32;
const LIMIT_BITS: u64 = (MAX_LIMIT as u64) << LIMIT_SHIFT;
const WAITING: u64 = 1 << 63;

#[inline]
fn in_flight(word: u64) -> u32 {
    word as u32
}

#[inline]
fn limit(word: u64) -> u32 {
    ((word & LIMIT_BITS) >> LIMIT_SHIFT) as u32
}

#[inline]
fn waiting(word: u64) -> bool {
    word & WAITING != 0
}

/// The gate's orderings (the atomic limit's; the twin's mutex orders
/// everything). Not the direct limiters' all-`Relaxed` [`Alone`](crate::cell::Alone):
/// a permit is a right to touch what the limit guards, so a release must
/// happen before every admission that comes after it in the word's order.
#[derive(Debug)]
#[allow(unreachable_pub)] // sealed: public only as a parameter of `AtomicCell`
pub struct Held;

impl Orders for Held {
    // Relaxed: a decision needs only *a* value of the word; the CAS then
    // checks that it is still the current one. (`in_flight()`/`limit()` are
    // point-in-time reads that order nothing.)
    const LOAD: Ordering = Ordering::Relaxed;
    // AcqRel. Release: what a holder did before its release is published with
    // the release's write. Acquire: an admission reads from the release
    // sequence that release heads (every later write to the word is a
    // read-modify-write, so it continues the sequence), and so synchronizes
    // with every release before it in the word's modification order. With
    // a limit of 1 that is a mutex's guarantee. One constant for every update
    // of the word, so `set_limit` and the releases' writes pay it too (on
    // x86 the same `lock cmpxchg`).
    const SUCCESS: Ordering = Ordering::AcqRel;
    // Relaxed: a lost race only supplies the value to decide on next; a
    // denial takes no permit and so is owed no ordering.
    const FAILURE: Ordering = Ordering::Relaxed;
}

/// What the word said right after an admission: the permit's own report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Granted {
    pub(crate) in_flight: u32,
    pub(crate) limit: u32,
}

impl Granted {
    fn of(word: u64) -> Self {
        Granted {
            in_flight: in_flight(word),
            limit: limit(word),
        }
    }
}

/// How a sleeper is woken.
#[derive(Debug)]
enum Wake {
    Thread(Thread),
    Task(Waker),
}

impl Wake {
    fn wake(self) {
        match self {
            Wake::Thread(thread) => thread.unpark(),
            Wake::Task(waker) => waker.wake(),
        }
    }
}

/// The sleepers, by id: ids grow with each new waiter, so the first entry is
/// the one that queued first, and a woken waiter that sleeps again under its
/// old id goes back to its old place.
#[derive(Debug, Default)]
struct Waiters {
    next_id: u64,
    asleep: BTreeMap<u64, Wake>,
}

/// One step of a waiter ([`Gate::wait_step`]).
#[derive(Debug)]
pub(crate) enum Step {
    Acquired(Granted),
    /// Asleep in the queue under this id, until woken.
    Asleep(u64),
}

/// The word, on its own cache line (every admission and release writes it),
/// and the queue.
#[derive(Debug)]
pub(crate) struct Gate<S> {
    word: CachePadded<S>,
    waiters: Mutex<Waiters>,
}

impl<S: StateCell<Word = u64>> Gate<S> {
    /// A gate with nothing in flight; `limit` already validated.
    pub(crate) fn new(limit: u32) -> Self {
        Gate {
            word: CachePadded::new(S::new(u64::from(limit) << LIMIT_SHIFT)),
            waiters: Mutex::new(Waiters::default()),
        }
    }

    pub(crate) fn limit(&self) -> u32 {
        limit(self.word.load())
    }

    pub(crate) fn in_flight(&self) -> u32 {
        in_flight(self.word.load())
    }

    pub(crate) fn has_waiters(&self) -> bool {
        waiting(self.word.load())
    }

    /// Admits iff a permit is free, by one CAS; a denial writes nothing. It
    /// does not look at the queue: see the module docs on fairness.
    #[inline]
    pub(crate) fn try_acquire(&self) -> Option<Granted> {
        if injected(Fault::LoadThenStore) {
            // The known-bad acquire: the store does not check the word it
            // decided on is still there.
            let word = self.word.load();
            if in_flight(word) >= limit(word) {
                return None;
            }
            let stored = self.word.update(|_| Ok::<_, Infallible>(word + 1));
            return stored.ok().map(Granted::of);
        }
        self.word
            .update(|word| {
                if in_flight(word) < limit(word) {
                    Ok(word + 1)
                } else {
                    Err(())
                }
            })
            .ok()
            .map(Granted::of)
    }

    /// Gives a permit back; wakes a sleeper if the word says one sleeps and
    /// the release left a permit free.
    #[inline]
    pub(crate) fn release(&self) {
        // Only a permit calls it, so `in_flight >= 1`; the guard keeps a
        // broken count from borrowing from the limit's bits.
        let after = self
            .word
            .update(|word| Ok::<_, Infallible>(word - u64::from(in_flight(word) > 0)));
        let Ok(after) = after;
        if waiting(after) && in_flight(after) < limit(after) {
            self.wake(1);
        }
    }

    /// Sets the limit (validated by the caller). Revokes nothing: in flight
    /// may stay above a smaller limit until releases bring it under. A limit
    /// that leaves permits free while waiters sleep wakes that many.
    pub(crate) fn set_limit(&self, new: u32) {
        let after = self.word.update(|word| {
            Ok::<_, Infallible>((word & !LIMIT_BITS) | (u64::from(new) << LIMIT_SHIFT))
        });
        let Ok(after) = after;
        if waiting(after) {
            let free = limit(after).saturating_sub(in_flight(after));
            if free > 0 {
                self.wake(free);
            }
        }
    }

    /// Wakes up to `count` sleepers, first queued first.
    #[cold]
    fn wake(&self, count: u32) {
        let (first, rest) = {
            let mut waiters = self.waiters.lock();
            let first = self.pop(&mut waiters);
            // Allocates only for a growth that wakes more than one.
            let rest: Vec<Wake> = (1..count).map_while(|_| self.pop(&mut waiters)).collect();
            (first, rest)
        };
        // Outside the lock: the woken waiter's first act is to take it.
        first.into_iter().chain(rest).for_each(Wake::wake);
    }

    /// Takes the first sleeper out of the queue (it is woken); clears
    /// `WAITING` once nobody sleeps. Called under the queue's lock.
    fn pop(&self, waiters: &mut Waiters) -> Option<Wake> {
        let first = waiters.asleep.pop_first().map(|(_, wake)| wake);
        if waiters.asleep.is_empty() {
            self.clear_waiting();
        }
        first
    }

    /// Under the queue's lock, with the queue empty: rule 2 of the module
    /// docs.
    fn clear_waiting(&self) {
        let _ = self
            .word
            .update(|word| Ok::<_, Infallible>(word & !WAITING));
    }

    /// One step of a waiter: `id` is `None` for a waiter not yet queued.
    /// A waiter still asleep stays so (its waker refreshed). Otherwise (new,
    /// or woken) it takes a free permit, or goes to sleep: rule 1 of the
    /// module docs. `waker` is the task's, or `None` for the calling thread.
    pub(crate) fn wait_step(&self, id: Option<u64>, waker: Option<&Waker>) -> Step {
        let mut waiters = self.waiters.lock();
        if let Some(id) = id {
            if let Some(wake) = waiters.asleep.get_mut(&id) {
                if let (Wake::Task(old), Some(new)) = (&*wake, waker) {
                    if !old.will_wake(new) {
                        *wake = Wake::Task(new.clone());
                    }
                }
                return Step::Asleep(id);
            }
        }
        let mut admitted = false;
        let decided = self.word.update(|word| {
            // Set on every run: the run whose word is stored is the one kept.
            admitted = in_flight(word) < limit(word);
            if admitted {
                Ok(word + 1)
            } else if waiting(word) {
                // Set already, and only a holder of this lock clears it
                // (rule 2): nothing to write.
                Err(())
            } else {
                Ok(word | WAITING)
            }
        });
        match decided {
            Ok(word) if admitted => Step::Acquired(Granted::of(word)),
            _ => {
                let id = id.unwrap_or_else(|| {
                    waiters.next_id += 1;
                    waiters.next_id
                });
                let wake = match waker {
                    Some(waker) => Wake::Task(waker.clone()),
                    None => Wake::Thread(park::current()),
                };
                waiters.asleep.insert(id, wake);
                Step::Asleep(id)
            }
        }
    }

    /// A waiter gives up (dropped, or timed out). Asleep, it leaves the
    /// queue; woken, it passes the wake-up on to the next sleeper (rule 3).
    pub(crate) fn leave(&self, id: u64) {
        let pass_on = {
            let mut waiters = self.waiters.lock();
            if waiters.asleep.remove(&id).is_some() {
                if waiters.asleep.is_empty() {
                    self.clear_waiting();
                }
                None
            } else if forgetful_leave() {
                None
            } else {
                self.pop(&mut waiters)
            }
        };
        if let Some(wake) = pass_on {
            wake.wake();
        }
    }
}

#[inline(always)]
fn forgetful_leave() -> bool {
    injected(Fault::ForgetfulLeave)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::cell::AtomicCell;

    #[test]
    fn the_word_packs_count_limit_and_flag_apart() {
        let word = (u64::from(MAX_LIMIT) << LIMIT_SHIFT) | u64::from(u32::MAX >> 1) | WAITING;
        assert_eq!(in_flight(word), u32::MAX >> 1);
        assert_eq!(limit(word), MAX_LIMIT);
        assert!(waiting(word));
        assert!(!waiting(word & !WAITING));
    }

    #[test]
    fn a_release_never_borrows_from_the_limit() {
        let gate = Gate::<AtomicCell<u64, Held>>::new(3);
        gate.release();
        assert_eq!((gate.in_flight(), gate.limit()), (0, 3));
    }
}
