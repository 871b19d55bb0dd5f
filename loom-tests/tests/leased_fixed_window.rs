#![cfg(loom)]
//! loom models of `tollgate::LeasedFixedWindow`: the window word leasing
//! batches of its count to stripes, spends from the stripes, batches given
//! back, merged, replaced or forgotten, and a clock that crosses window
//! boundaries and steps back — the code that ships, through tollgate's sync
//! facade (word and stripes are loom atomics, so weak-memory orders are
//! explored too).
//!
//! Every model records each request with its exact decision time and, after
//! joining, checks the fixed window's bound (`assert_window_bound`: some order
//! of the admissions consistent with every thread's program order charges
//! each to the later of its reading's window and those before it with no
//! window over the limit — with readings in order, "at most `limit` per
//! aligned window by decision time"), an exact single-threaded tail, the bound
//! again, and that in the next window the whole limit is admissible (no
//! permit stays stranded). Linearizability against the sequential window is
//! *not* checked: a batch held by another stripe may deny what the sequential
//! window admits (under-admission, docs/algorithms.md).
//!
//! Stripe numbers under loom are the model threads' numbers masked: with two
//! stripes, the model's main thread (0) and the second spawned thread (2)
//! share stripe 0, the first spawned thread (1) has stripe 1.

use std::time::Duration;

use loom::sync::Arc;
use loom::sync::atomic::{AtomicU64, Ordering};
use tollgate::{Clock, Denied, LeasedFixedWindow, ManualClock, Rate, RateLimiter};
use tollgate_loom_tests::Step::{self, By, Take, To};
use tollgate_loom_tests::{
    Ask, Move, Op, RecordingClock, UntimedStripes, assert_window_bound, assert_window_bound_then,
    explore, explore_limiter, race, race_a_moving_clock, race_after, record, single_threaded_tail,
};

/// The window's length in nanoseconds.
const WINDOW: u64 = 10;

fn nanos(ns: u64) -> Duration {
    Duration::from_nanos(ns)
}

type Window = LeasedFixedWindow<RecordingClock>;

/// A fresh window with `stripes` stripes on a manual clock at `start`.
fn limiter(limit: u32, stripes: usize, start: u64) -> (Arc<Window>, ManualClock) {
    let clock = ManualClock::new();
    let window = LeasedFixedWindow::with_stripes(
        Rate::new(limit, nanos(WINDOW)),
        RecordingClock::new(clock.clone()),
        stripes,
    )
    .expect("a valid configuration");
    assert_eq!(window.stripes(), stripes);
    clock.set(start);
    (Arc::new(window), clock)
}

/// The checks every model makes once its threads are joined (see the module docs).
fn verify(window: &Window, clock: &ManualClock, limit: u32, threads: Vec<Vec<Op>>) {
    assert_window_bound(limit, WINDOW, &threads);
    let mut tail = single_threaded_tail(clock, limit, || window.try_acquire());
    // The next window: every batch left on a stripe is of an older window.
    clock.set((clock.now() / WINDOW + 1) * WINDOW);
    let full = record(limit, || window.try_acquire_n(limit));
    assert_eq!(
        full.result,
        Ok(()),
        "a permit stayed stranded: {threads:#?}"
    );
    tail.push(full);
    assert_window_bound_then(limit, WINDOW, &threads, &tail);
}

/// [`explore_limiter`] on a fresh window of `limit` with `stripes` stripes,
/// its clock at `start`, in every interleaving, with [`verify`]'s checks.
fn explore_window(
    name: &str,
    preemption_bound: usize,
    (limit, stripes, start): (u32, usize, u64),
    model: impl Fn(&Arc<Window>, &ManualClock) -> Vec<Vec<Op>> + Sync + Send + 'static,
) {
    explore_limiter(
        name,
        preemption_bound,
        move || limiter(limit, stripes, start),
        model,
        move |window, clock, threads| verify(window, clock, limit, threads),
    );
}

/// Two stripes: stripe 1 leases a batch near the end of window 0 and spends
/// from it while stripe 0 takes most of the window from the word and a ticker
/// moves the clock into window 1, so spends race with leases, with the
/// boundary and with readings staler than the word.
#[test]
fn batches_race_with_the_word_and_the_boundary() {
    let name = "leased_fixed_window::batches_race_with_the_word_and_the_boundary";
    // Limit 9, two stripes: a single permit leases (9 − 1) / 4 = 2.
    explore_window(name, 2, (9, 2, 8), |window, clock| {
        race_a_moving_clock(window, clock, &[&[1, 1], &[7]], &[Move::By(WINDOW)])
    });
}

/// One stripe shared by two threads: one takes the stripe's batch out (to give
/// it back, or to lease more) while the other leases after it and installs its
/// own spare first, and the clock crosses into the next window between the
/// second thread's requests — so batches are given back, merged, replaced,
/// returned to the word from a stripe that moved on, or forgotten.
#[test]
fn a_shared_stripe_gives_back_merges_and_replaces() {
    let name = "leased_fixed_window::a_shared_stripe_gives_back_merges_and_replaces";
    // Limit 5, one stripe: a single permit leases (5 − 1) / 2 = 2.
    explore_window(name, 3, (5, 1, 0), |window, clock| {
        let second: &[Step] = &[Take(2), By(WINDOW), Take(1)];
        race(window, clock, &[&[Take(1), Take(3)], second])
    });
}

/// The time bound, both ways, with the clock stepping back: a thread leases a
/// batch in window 1, steps the clock back to window 0 and asks again (a stale
/// reading must not spend window 1's batch outside the word's charge), then
/// forward to window 2 (window 1's batch must not be spent there), while
/// another thread on the other stripe takes a full window.
#[test]
fn a_batch_is_spent_only_in_its_window() {
    let name = "leased_fixed_window::a_batch_is_spent_only_in_its_window";
    explore_window(name, 3, (9, 2, WINDOW), |window, clock| {
        let stepper: &[Step] = &[Take(1), To(0), Take(1), To(2 * WINDOW), Take(1)];
        race(window, clock, &[stepper, &[Take(9)]])
    });
}

/// A denied request gives its stripe's batch back to the word while the word
/// is still at the batch's window: stripe 1 holds a batch and is denied a full
/// window, racing stripe 0's admissions from the word; nothing is handed out
/// twice, and what comes back is admissible (the tail checks exactness).
#[test]
fn a_denial_gives_the_batch_back() {
    let name = "leased_fixed_window::a_denial_gives_the_batch_back";
    explore_window(name, 3, (9, 2, 0), |window, clock| {
        race(window, clock, &[&[Take(1), Take(9)], &[Take(5), Take(2)]])
    });
}

/// Two threads of one stripe spend from the same batch at once: each spend
/// is a CAS on the very count it read, so neither is lost (a lost spend would
/// leave permits in the batch that were already admitted, and the tail would
/// take them again).
#[test]
fn two_threads_spend_one_batch() {
    let name = "leased_fixed_window::two_threads_spend_one_batch";
    // Limit 9, one stripe: a single permit leases (9 − 1) / 2 = 4.
    explore_window(name, 3, (9, 1, 0), |window, clock| {
        race_after(window, clock, &[1], &[&[Take(2)], &[Take(2)]])
    });
}

/// A thread installs a spare batch in the stripe while another thread of the
/// same stripe spends from the batch already there: the merge is a CAS on the
/// very batch it read, so the spend is not undone (it would be admitted again
/// by the tail).
#[test]
fn a_spend_races_a_merge() {
    let name = "leased_fixed_window::a_spend_races_a_merge";
    // Limit 9, one stripe: A's first permit leases 4 (word 5); B's
    // leases (9 − 5 − 1) / 2 = 1 and merges it with what A left.
    explore_window(name, 3, (9, 1, 0), |window, clock| {
        race(window, clock, &[&[Take(1), Take(1)], &[Take(1)]])
    });
}

/// A spare batch of window 0 finds its stripe already in window 1 (the other
/// thread of the stripe moved on) and goes back to the word only while the
/// word is still at window 0: the give-back is a CAS, so a stale read of the
/// word cannot roll window 1's admissions back.
#[test]
fn a_late_spare_goes_back_only_to_its_window() {
    let name = "leased_fixed_window::a_late_spare_goes_back_only_to_its_window";
    // Limit 5, one stripe: A's permit at 0 leases 2; B takes 4 in
    // window 1, leasing nothing, and raises the stripe to window 1.
    explore_window(name, 3, (5, 1, 0), |window, clock| {
        race(window, clock, &[&[Take(1)], &[To(WINDOW), Take(4)]])
    });
}

/// The batch without its time bound: a stripe keeps a *count* of leased
/// permits and spends it at any reading. A batch leased at the end of window 0
/// and spent in window 1, beside a full window 1 taken from the word, puts
/// `limit + 1` admissions in window 1. The bound the models above assert must
/// catch it: this proves they can fail.
#[test]
#[should_panic(expected = "fixed window invariant violated")]
fn known_bad_batch_spent_in_a_later_window_is_caught() {
    explore(
        "leased_fixed_window::known_bad_batch_spent_in_a_later_window_is_caught",
        2,
        || {
            const LIMIT: u32 = 4;
            let clock = ManualClock::new();
            clock.set(WINDOW - 1);
            let window = Arc::new(UntimedBatches {
                word: AtomicU64::new(0),
                stripes: UntimedStripes::default(),
                limit: u64::from(LIMIT),
                clock: RecordingClock::new(clock.clone()),
            });
            let leaser: &[Step] = &[Take(1), To(WINDOW), Take(1)];
            let threads = race(&window, &clock, &[leaser, &[Take(LIMIT)]]);
            assert_window_bound(LIMIT, WINDOW, &threads);
        },
    );
}

/// A leased window whose batches carry no window: a stripe spends its count
/// at any reading; otherwise it takes `n` plus half the window's room from
/// the word (`index << 32 | count`) and keeps the spare.
struct UntimedBatches {
    word: AtomicU64,
    stripes: UntimedStripes,
    limit: u64,
    clock: RecordingClock,
}

impl Ask for UntimedBatches {
    fn ask(&self, n: u32) -> Result<(), Denied> {
        let now = self.clock.now();
        let n = u64::from(n);
        if self.stripes.spend(n) {
            return Ok(());
        }
        let mut word = self.word.load(Ordering::SeqCst);
        loop {
            let (index, count) = (word >> 32, word & 0xffff_ffff);
            let (index, count) = if now / WINDOW > index {
                (now / WINDOW, 0)
            } else {
                (index, count)
            };
            if count + n > self.limit {
                let end = (index + 1) * WINDOW;
                return Err(Denied::RetryAfter(nanos(end.saturating_sub(now).max(1))));
            }
            let spare = (self.limit - count - n) / 2;
            match self.word.compare_exchange(
                word,
                (index << 32) | (count + n + spare),
                Ordering::SeqCst,
                Ordering::SeqCst,
            ) {
                Ok(_) => {
                    self.stripes.keep(spare);
                    return Ok(());
                }
                Err(actual) => word = actual,
            }
        }
    }
}
