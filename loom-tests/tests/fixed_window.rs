#![cfg(loom)]
//! loom models of `tollgate::FixedWindow`: its packed (window index, count)
//! compare-and-swap loop, the code that ships, model-checked through tollgate's
//! sync facade.
//!
//! Every model moves a `ManualClock` inside the model, racing with the acquires,
//! records each request with its exact decision time, and after joining checks
//! the per-window limit, linearizability against the sequential window counter
//! (exact retry-afters included) and an exact single-threaded tail.
//! `docs/verification.md` lists what each model explores and how long it takes.

use loom::sync::Arc;
use loom::sync::atomic::{AtomicU64, Ordering};
use tollgate::{Clock, Denied, FixedWindow, ManualClock, Rate, RateLimiter};
use tollgate_loom_tests::{
    Ask,
    Move::{By, To},
    Op, RecordingClock, Step, Subject, WindowSpec, advancer, assert_all_admitted,
    assert_linearizable, assert_window_bound, assert_window_bound_then, clock_mover, explore,
    join_all, nanos, on_manual_clock, race, race_a_moving_clock, race_an_advance,
    racer_with_invalid_requests, requester, single_threaded_tail, with_manual_clock,
};

/// The window's length in nanoseconds.
const WINDOW: u64 = 10;

/// A fresh window limiter on a manual clock at 0, and a handle to move that clock.
fn limiter(limit: u32) -> (Arc<FixedWindow<RecordingClock>>, ManualClock) {
    let (window, clock) =
        on_manual_clock(|clock| FixedWindow::with_clock(Rate::new(limit, nanos(WINDOW)), clock));
    assert_eq!(window.window(), nanos(WINDOW));
    (window, clock)
}

/// Every check a model makes once its threads are joined.
fn verify(
    window: &FixedWindow<RecordingClock>,
    clock: &ManualClock,
    limit: u32,
    threads: Vec<Vec<Op>>,
) {
    assert_window_bound(limit, WINDOW, &threads);
    assert_linearizable(
        &WindowSpec {
            limit,
            window: WINDOW,
        },
        &threads,
    );
    let tail = single_threaded_tail(clock, limit, || window.try_acquire());
    assert_window_bound_then(limit, WINDOW, &threads, &tail);
}

/// The window as the shared model shapes run it.
const WINDOWED: Subject<FixedWindow<RecordingClock>> = Subject {
    build: limiter,
    verify,
};

#[test]
fn clock_crosses_boundary_while_threads_race() {
    let name = "fixed_window::clock_crosses_boundary_while_threads_race";
    WINDOWED.explore(name, 3, 2, |window, clock| {
        let first = requester(window, &[1, 1]);
        let second = racer_with_invalid_requests(window, 2);
        // 0 → 6 → 12: the first step stays in window 0, the second crosses into
        // window 1, both racing with the four acquires.
        let ticker = clock_mover(clock, &[By(6), By(6)]);
        let threads = join_all(vec![first, second]);
        ticker.join().unwrap();
        threads
    });
}

#[test]
fn one_thread_crosses_boundary_between_its_acquires() {
    let name = "fixed_window::one_thread_crosses_boundary_between_its_acquires";
    WINDOWED.explore(name, 3, 1, |window, clock| {
        let advancer = advancer(window, clock, &[1], WINDOW, &[1]);
        let racer = requester(window, &[1, 1]);
        let threads = join_all(vec![advancer, racer]);
        // Two windows of one permit each, four requests: exactly one admission
        // per window, in every interleaving (the advancing thread reads window
        // 1 after its own advance, so window 1 is always reached).
        let admitted = threads
            .iter()
            .flatten()
            .filter(|op| op.result.is_ok())
            .count();
        assert_eq!(admitted, 2, "{threads:#?}");
        threads
    });
}

#[test]
fn three_threads_acquire_n_mixed_with_acquire() {
    let name = "fixed_window::three_threads_acquire_n_mixed_with_acquire";
    WINDOWED.explore(name, 3, 2, |window, clock| {
        race_an_advance(window, clock, &[&[2], &[1]], WINDOW, &[1])
    });
}

#[test]
fn demand_within_limit_is_all_admitted() {
    let name = "fixed_window::demand_within_limit_is_all_admitted";
    WINDOWED.explore(name, 3, 3, |window, clock| {
        // Within window 0: the limit is never reached.
        let threads = race_an_advance(window, clock, &[&[2]], WINDOW / 2, &[1]);
        assert_all_admitted(&threads);
        threads
    });
}

#[test]
fn clock_stepping_back_across_boundary_races_with_acquires() {
    let name = "fixed_window::clock_stepping_back_across_boundary_races_with_acquires";
    WINDOWED.explore(name, 3, 2, |window, clock| {
        // Into window 1, then back into window 0: a reading there must count
        // against window 1 once window 1 is stored, never reopen window 0.
        race_a_moving_clock(
            window,
            clock,
            &[&[1, 1], &[1]],
            &[To(WINDOW + 2), To(WINDOW - 2)],
        )
    });
}

/// The simple window of Jianfeng Fu's "Throttling Solutions in Standalone and
/// Distributed Scenarios" (§3.1) made "lock-free" the obvious way: the window index
/// and the count in two atomics; a thread that finds the window expired resets
/// both with plain stores, then every thread counts with `fetch_add` (undone on
/// denial). Two threads can both see the old index and both reset, the second
/// reset wiping out a count the first one already admitted against.
struct ResetByStoreWindow {
    index: AtomicU64,
    count: AtomicU64,
    limit: u64,
    clock: RecordingClock,
}

impl Ask for ResetByStoreWindow {
    /// Single permits only: the model asks for no more.
    fn ask(&self, n: u32) -> Result<(), Denied> {
        assert_eq!(n, 1);
        let now = self.clock.now();
        let index = now / WINDOW;
        if self.index.load(Ordering::SeqCst) < index {
            self.index.store(index, Ordering::SeqCst);
            self.count.store(0, Ordering::SeqCst);
        }
        if self.count.fetch_add(1, Ordering::SeqCst) < self.limit {
            Ok(())
        } else {
            self.count.fetch_sub(1, Ordering::SeqCst);
            Err(Denied::RetryAfter(nanos((index + 1) * WINDOW - now)))
        }
    }
}

/// The same window check that every model above asserts must catch the broken
/// counter: this proves the models can fail. The loss needs one thread to be
/// preempted between reading the old index and resetting, after the other
/// thread has reset and admitted: loom has to search for it.
#[test]
#[should_panic(expected = "fixed window invariant violated")]
fn known_bad_reset_by_store_window_is_caught() {
    explore(
        "fixed_window::known_bad_reset_by_store_window_is_caught",
        3,
        || {
            const LIMIT: u32 = 1;
            let (window, clock) = with_manual_clock(|clock| ResetByStoreWindow {
                index: AtomicU64::new(0),
                count: AtomicU64::new(0),
                limit: u64::from(LIMIT),
                clock,
            });
            let advancer: &[Step] = &[Step::By(WINDOW), Step::Take(1)];
            let threads = race(&window, &clock, &[advancer, &[Step::Take(1)]]);
            assert_window_bound(LIMIT, WINDOW, &threads);
        },
    );
}

/// The tail is ordered after the joined threads. Limit 1: a thread admitted at
/// 15 (window 1); then, on the model's thread, a reading of 5 admitted. The
/// window already stored is 1, so that admission counts there too: two in
/// window 1, a violation. Appended as one more thread, the search could place
/// the tail's admission first (window 0, then window 1) and pass it; the tail
/// check must not.
#[test]
fn a_tail_admission_is_ordered_after_the_threads() {
    let admitted = |at| Op {
        n: 1,
        at: Some(at),
        result: Ok(()),
    };
    let threads = vec![vec![admitted(15)]];
    let tail = vec![admitted(5)];
    let mut as_a_thread = threads.clone();
    as_a_thread.push(tail.clone());
    assert_window_bound(1, 10, &as_a_thread); // the weaker check passes it
    let caught = std::panic::catch_unwind(|| assert_window_bound_then(1, 10, &threads, &tail));
    assert!(caught.is_err(), "the tail check must reject the history");
}
