#![cfg(loom)]
//! loom models of `tollgate::SlidingWindow` (the striped, leased window) and
//! `tollgate::ApproxSlidingWindow`: the code that ships, model-checked through
//! tollgate's sync facade.
//!
//! Every model uses two stripes, two or three sub-windows and tiny limits; a
//! thread moves a `ManualClock` inside the model so that sub-windows open (and
//! history slots are recycled) while other threads lease, spend, steal and put
//! back. Each request is recorded with its exact decision time (the one clock
//! reading it took), and after joining the model checks the promise: the
//! permits admitted in any `S` consecutive aligned sub-windows never exceed `N`.
//! Then, single-threaded, the limiter must be neither stuck nor loose and its
//! retry-after exact to the nanosecond. Threads get stripes by their loom
//! number: the model's main thread and the second spawned thread share stripe
//! 0, the first spawned thread has stripe 1.
//!
//! A Sentinel-style striped counter ("sum the stripes, then increment mine")
//! must be caught over-admitting: that proves the check can fail.

use std::time::Duration;

use loom::sync::Arc;
use loom::sync::atomic::{AtomicU64, Ordering};
use loom::thread;
use tollgate::{
    ApproxSlidingWindow, Clock, Denied, ManualClock, Rate, RateLimiter, SlidingWindow, Snapshot,
};
use tollgate_loom_tests::Step::{self, By, Take, To};
use tollgate_loom_tests::{
    Op, RecordingClock, admissions_in_order, explore, explore_limiter, explore_races, join_all,
    race, race_after, race_beside, record, requester, scripted, single_threaded_tail,
};

/// Sub-window length in nanoseconds (at least the limit, as the builder needs).
const SUB: u64 = 10;

fn nanos(ns: u64) -> Duration {
    Duration::from_nanos(ns)
}

/// `limit` permits in any `subs` sub-windows of `SUB` ns, `stripes` stripes
/// (one: every thread shares it), on a manual clock at 0, and a handle to
/// move that clock.
fn striped_window(
    limit: u32,
    subs: u32,
    stripes: usize,
) -> (Arc<SlidingWindow<RecordingClock>>, ManualClock) {
    let clock = ManualClock::new();
    let window = SlidingWindow::builder(Rate::new(limit, nanos(SUB * u64::from(subs))))
        .sub_windows(subs)
        .stripes(stripes)
        .clock(RecordingClock::new(clock.clone()))
        .build()
        .expect("a valid configuration");
    assert_eq!(window.sub_window(), nanos(SUB));
    (Arc::new(window), clock)
}

/// The sliding window's invariant on exact decision times: the permits
/// admitted at times in any `subs` consecutive sub-windows are at most `limit`.
fn assert_sliding_bound(limit: u32, subs: u32, threads: &[Vec<Op>]) {
    tollgate_loom_tests::assert_sliding_bound("sliding window", SUB, limit, subs, threads);
}

/// [`explore_limiter`] on a fresh `limit`-per-`subs`-sub-windows window of
/// `stripes` stripes in every interleaving, with every check a model makes
/// once its threads are joined.
fn explore_window(
    name: &str,
    preemption_bound: usize,
    (limit, subs, stripes): (u32, u32, usize),
    model: impl Fn(&Arc<SlidingWindow<RecordingClock>>, &ManualClock) -> Vec<Vec<Op>>
    + Sync
    + Send
    + 'static,
) {
    explore_limiter(
        name,
        preemption_bound,
        move || striped_window(limit, subs, stripes),
        model,
        move |window, clock, mut threads| {
            assert_sliding_bound(limit, subs, &threads);
            threads.push(single_threaded_tail(clock, limit, || window.try_acquire()));
            assert_sliding_bound(limit, subs, &threads);
        },
    );
}

fn acquire(w: &SlidingWindow<RecordingClock>, n: u32) -> Op {
    record(n, || w.try_acquire_n(n))
}

/// Two threads on different stripes lease and spend while a third moves the
/// clock across two boundaries: sub-window 0 closes (its slot is recycled for
/// sub-window 2 with S = 2), leases go stale, the roller sweeps them back.
#[test]
fn rollover_races_leases_on_two_stripes() {
    let name = "sliding_window::rollover_races_leases_on_two_stripes";
    explore_window(name, 3, (2, 2, 2), |window, clock| {
        let first = requester(window, &[1, 1]);
        let second = requester(window, &[1, 1]);
        // 0 → 10 → 20: into sub-window 1, then 2 (slot 0 again).
        clock.advance(nanos(SUB));
        clock.advance(nanos(SUB));
        join_all(vec![first, second])
    });
}

/// Multi-permit requests that must gather from the pool and steal from the
/// other stripe, against single permits, as a boundary passes: the budget of
/// the new sub-window is what the previous one left.
#[test]
fn acquire_n_steals_across_stripes_at_rollover() {
    let name = "sliding_window::acquire_n_steals_across_stripes_at_rollover";
    explore_window(name, 3, (3, 2, 2), |window, clock| {
        race(
            window,
            clock,
            &[&[Take(1), Take(2)], &[Take(2), By(SUB), Take(1)]],
        )
    });
}

/// Three threads, two of them sharing a stripe, three sub-windows: the shared
/// stripe's lease is spent, put back into and overwritten by both, while the
/// clock moves into sub-window 1.
#[test]
fn three_threads_share_a_stripe() {
    let name = "sliding_window::three_threads_share_a_stripe";
    explore_window(name, 3, (3, 3, 2), |window, clock| {
        // The main thread shares stripe 0 with the second.
        let scripts: &[&[Step]] = &[&[Take(1), Take(1)], &[By(SUB), Take(2)]];
        race_beside(window, clock, scripts, || vec![acquire(window, 1)])
    });
}

/// A clock that steps back across a boundary while threads acquire: a reading
/// older than the newest sub-window must never be admitted in it (only from
/// its own sub-window's lease), and the limiter must not get stuck.
#[test]
fn clock_steps_back_across_rollover() {
    let name = "sliding_window::clock_steps_back_across_rollover";
    explore_window(name, 3, (2, 2, 2), |window, clock| {
        // One request in sub-window 1, then the clock steps back into 0.
        let stepper: &[Step] = &[To(SUB + 2), Take(1), To(SUB - 2)];
        race(window, clock, &[&[Take(1), Take(1)], stepper])
    });
}

/// The clock jumps over a sub-window (never opened, so it charged nothing)
/// while one thread is denied for a 2-permit request and another spends: the
/// denial puts its gathered permits back, the jump recycles nothing yet, and
/// the window of three sub-windows still counts sub-window 0.
#[test]
fn clock_skips_a_sub_window_while_a_request_is_denied() {
    let name = "sliding_window::clock_skips_a_sub_window_while_a_request_is_denied";
    explore_window(name, 3, (2, 3, 2), |window, clock| {
        let jumper: &[Step] = &[Take(1), By(2 * SUB), Take(1)];
        race(window, clock, &[&[Take(1), Take(2)], jumper])
    });
}

// Lost updates. A lease is a count in a stripe word, a charge a count in a
// history word: two threads that both read a word and both write it back would
// spend one permit twice, or hand one back twice. Each model below makes two
// threads race on one such word while demand exceeds what is left, so that a
// lost update shows as an admission over the bound — in the threads' own
// decisions or in the single-threaded tail, which spends whatever the limiter
// believes is left. (Each was checked against a blind-store mutant of the CAS
// it targets: `scripts/mutate-loom`.)

/// One stripe holding a spare lease that two threads spend at once (the fast
/// path's CAS), while a third request takes the whole lease for a two-permit
/// request (the slow path's CAS on its own stripe) and leases the rest.
#[test]
fn shared_stripe_lease_spent_by_two_threads() {
    let name = "sliding_window::shared_stripe_lease_spent_by_two_threads";
    explore_window(name, 2, (4, 2, 1), |window, clock| {
        // Leases 2 of 4 (a share: half the budget over one stripe), spends 1:
        // the stripe holds 1 for sub-window 0.
        let first = acquire(window, 1);
        race_beside(window, clock, &[&[Take(1)], &[Take(2)]], || {
            vec![first, acquire(window, 1)]
        })
    });
}

/// One stripe, two threads that each lease a share and put the spare back
/// (merging into the stripe while the other spends from it), then spend again.
#[test]
fn put_back_merges_while_the_stripe_is_spent() {
    let name = "sliding_window::put_back_merges_while_the_stripe_is_spent";
    explore_window(name, 2, (8, 2, 1), |window, clock| {
        race(window, clock, &[&[Take(1), Take(1)], &[Take(2), Take(1)]])
    });
}

/// The main thread takes a permit in sub-window 0, leaving a spare lease on
/// the one stripe, and moves the clock into sub-window 1; then a thread that
/// asks for one permit races a thread that takes `other`. The first
/// thread's request is the main thread's next, for the checks.
fn a_spare_of_sub_window_0(
    window: &Arc<SlidingWindow<RecordingClock>>,
    clock: &ManualClock,
    other: &[Step],
) -> Vec<Vec<Op>> {
    let mut mine = vec![acquire(window, 1)];
    clock.set(SUB);
    let [late, other] =
        <[Vec<Op>; 2]>::try_from(race(window, clock, &[&[Take(1)], other])).expect("two threads");
    mine.extend(late);
    vec![mine, other]
}

/// A stale lease (sub-window 0's spare, on the one stripe) taken back twice at
/// once: by the thread that opens sub-window 1 (its sweep) and by the other
/// thread reclaiming its own stripe. Returned twice, sub-window 0's charge
/// would fall below what it admitted.
#[test]
fn stale_lease_reclaimed_by_two_threads() {
    let name = "sliding_window::stale_lease_reclaimed_by_two_threads";
    explore_window(name, 3, (4, 2, 1), |window, clock| {
        // Sub-window 0: 1 admitted, 2 leased, 1 left on the stripe.
        a_spare_of_sub_window_0(window, clock, &[Take(1)])
    });
}

/// A thread short of budget steals the spare lease on another stripe while
/// that stripe's owner spends it: the permit must go to one of them.
#[test]
fn steal_races_the_owner_spending_its_lease() {
    let name = "sliding_window::steal_races_the_owner_spending_its_lease";
    explore_window(name, 2, (8, 2, 2), |window, clock| {
        // Stripe 0 (the main thread's and the second spawned thread's):
        // a share of 2 leased, 1 spent, 1 spare. Pool: 6 left.
        // Stripe 1: 6 from the pool, 1 stolen from stripe 0.
        race_after(window, clock, &[1], &[&[Take(7)], &[Take(1)]])
    });
}

/// A return to history delayed across two openings: a thread at sub-window 1
/// gives sub-window 0's stale lease back while another thread opens
/// sub-windows 2 and 3, which recycles slot 0 for sub-window 2's charge. The
/// late return must not overwrite that charge.
#[test]
fn delayed_return_meets_a_recycled_slot() {
    let name = "sliding_window::delayed_return_meets_a_recycled_slot";
    explore_window(name, 2, (4, 2, 1), |window, clock| {
        // Sub-window 0: 1 admitted, 1 spare left on the stripe.
        a_spare_of_sub_window_0(window, clock, &[To(2 * SUB), Take(1), To(3 * SUB), Take(1)])
    });
}

/// A snapshot taken by the calling thread, and the clock reading it used.
fn snapshot_at(limiter: &impl RateLimiter) -> (u64, Snapshot) {
    let mut snapshot = None;
    let op = record(1, || {
        snapshot = Some(limiter.snapshot());
        Ok(())
    });
    (
        op.at.expect("a snapshot reads the clock"),
        snapshot.expect("taken"),
    )
}

/// The charge a sub-window's opening publishes must reach every reader that
/// finds the pool opened: a snapshot and a stale-reading denial both read the
/// history on the strength of the pool word alone. The filler admits 2 (the
/// limit) at 0, moves the clock to 5 and 10, and opens sub-window 1 (denied);
/// a reader whose reading is 5 or more synchronized with those clock moves,
/// so both admissions happened before it: the window is full until 20.
#[test]
fn late_readers_see_the_charge_an_opening_published() {
    let name = "sliding_window::late_readers_see_the_charge_an_opening_published";
    explore_window(name, 3, (2, 2, 1), |window, clock| {
        let steps = [Take(1), Take(1), To(SUB / 2), To(SUB), Take(1)];
        let filler = scripted(window, clock, &steps);
        let w = window.clone();
        let reader = thread::spawn(move || {
            let (at, snapshot) = snapshot_at(&*w);
            (at, snapshot, acquire(&w, 1))
        });

        let filled = filler.join().unwrap();
        let (at, snapshot, op) = reader.join().unwrap();
        if at >= SUB / 2 {
            assert_eq!(
                snapshot.available, 0,
                "a snapshot at {at} ns, after 2 admissions at 0, with {filled:?}"
            );
        }
        if let Some(t) = op.at.filter(|&t| t >= SUB / 2) {
            match op.result {
                Err(Denied::RetryAfter(wait)) => assert!(
                    wait >= nanos(2 * SUB - t),
                    "retry after {wait:?} at {t} ns, the window full until {} ns; {filled:?}",
                    2 * SUB
                ),
                other => panic!("{other:?} at {t} ns, the window full until 20 ns"),
            }
        }
        vec![filled, vec![op]]
    });
}

/// The approximate window's promise on exact decision times: at every
/// admission at `t` in window `k`, the previous window's total weighted by
/// `(T − e)/T` plus the permits admitted in `k` up to `t` is at most `limit`.
fn assert_approx_bound(limit: u32, window: u64, threads: &[Vec<Op>]) {
    let admitted = admissions_in_order(threads);
    let total = |k: u64| -> u64 {
        admitted
            .iter()
            .filter(|(t, _)| t / window == k)
            .map(|&(_, n)| u64::from(n))
            .sum()
    };
    for &(t, _) in &admitted {
        let k = t / window;
        let prev = k.checked_sub(1).map_or(0, total);
        let so_far: u64 = admitted
            .iter()
            .filter(|&&(u, _)| u / window == k && u <= t)
            .map(|&(_, n)| u64::from(n))
            .sum();
        let left = window - (t - k * window);
        assert!(
            prev * left + so_far * window <= u64::from(limit) * window,
            "approximate window invariant violated at {t} ns: {prev} before, weighing \
             {left}/{window}, {so_far} so far; histories: {threads:#?}"
        );
    }
}

/// Permits per approximate window, and the window's length in nanoseconds.
const APPROX_LIMIT: u32 = 2;
const APPROX_WINDOW: u64 = 10;

/// `limit` permits per approximate window of `window` ns on a manual clock.
fn approx(limit: u32, window: u64) -> (Arc<ApproxSlidingWindow<RecordingClock>>, ManualClock) {
    let clock = ManualClock::new();
    let limiter = ApproxSlidingWindow::with_clock(
        Rate::new(limit, nanos(window)),
        RecordingClock::new(clock.clone()),
    )
    .expect("a valid configuration");
    (Arc::new(limiter), clock)
}

/// [`explore_limiter`] on a fresh approximate window of `APPROX_LIMIT` per
/// `APPROX_WINDOW` ns in every interleaving: the bound on the threads'
/// admissions, then the single-threaded tail and the bound again.
fn explore_approx(
    name: &str,
    preemption_bound: usize,
    model: impl Fn(&Arc<ApproxSlidingWindow<RecordingClock>>, &ManualClock) -> Vec<Vec<Op>>
    + Sync
    + Send
    + 'static,
) {
    let (limit, window) = (APPROX_LIMIT, APPROX_WINDOW);
    explore_limiter(
        name,
        preemption_bound,
        move || approx(limit, window),
        model,
        move |limiter, clock, mut threads| {
            assert_approx_bound(limit, window, &threads);
            threads.push(single_threaded_tail(clock, limit, || limiter.try_acquire()));
            assert_approx_bound(limit, window, &threads);
        },
    );
}

/// The approximate window: two racing acquirers while the clock crosses into
/// the next window, where the previous count (published before the opening
/// CAS) must be seen.
#[test]
fn approx_window_opens_while_threads_race() {
    let name = "sliding_window::approx_window_opens_while_threads_race";
    explore_approx(name, 3, |limiter, clock| {
        let second: &[Step] = &[Take(1), By(APPROX_WINDOW + 5), Take(1)];
        race(limiter, clock, &[&[Take(1), Take(1)], second])
    });
}

/// A decision that loses its CAS to a window's opening decides again on the
/// word it lost to, and must see the count that opening published. The main
/// thread moves the clock (10, then 25), so the acquirers are synchronized
/// with it but not with each other: `second` may start from the pool as it was
/// at 0, publish nothing that matters, and lose to `first` opening window 2
/// with window 1's count (2, weighing 1 at 25).
#[test]
fn approx_retry_after_a_lost_race_sees_the_published_count() {
    let name = "sliding_window::approx_retry_after_a_lost_race_sees_the_published_count";
    explore_approx(name, 3, |limiter, clock| {
        let first = requester(limiter, &[2, 1]);
        let second = requester(limiter, &[1]);
        clock.set(APPROX_WINDOW);
        clock.set(2 * APPROX_WINDOW + APPROX_WINDOW / 2);
        join_all(vec![first, second])
    });
}

/// A snapshot that finds the next window opened must weigh the count its
/// opening published. The filler takes all 4 permits at 0, moves the clock to
/// 5 and 15, and admits 1 at 15 (opening window 1: 4 weighing 1/2, so 2 fit).
/// A reader at 5 or later synchronized with those moves: it may see at most 2
/// available.
#[test]
fn approx_snapshot_sees_the_published_count() {
    explore_races(
        "sliding_window::approx_snapshot_sees_the_published_count",
        3,
        || {
            const LIMIT: u32 = 4;
            const WINDOW: u64 = APPROX_WINDOW;
            let (limiter, clock) = approx(LIMIT, WINDOW);

            let steps = [Take(4), To(WINDOW / 2), To(WINDOW + WINDOW / 2), Take(1)];
            let filler = scripted(&limiter, &clock, &steps);
            let l = limiter.clone();
            let reader = thread::spawn(move || snapshot_at(&*l));

            let filled = filler.join().unwrap();
            let (at, snapshot) = reader.join().unwrap();
            if at >= WINDOW / 2 {
                assert!(
                    snapshot.available <= 2,
                    "{snapshot:?} at {at} ns, after 4 admissions at 0; {filled:?}"
                );
            }
            assert_approx_bound(LIMIT, WINDOW, &[filled]);
        },
    );
}

/// Sentinel's controller on striped counters: sum the sub-window's stripes,
/// and if there is room, increment this thread's stripe. Each step is atomic,
/// the whole is not: two threads can both see room for the last permit.
struct SumThenIncrement {
    stripes: [AtomicU64; 2],
    limit: u64,
    clock: RecordingClock,
}

impl SumThenIncrement {
    fn try_acquire(&self, stripe: usize) -> Result<(), Denied> {
        let now = self.clock.now();
        let sum: u64 = self.stripes.iter().map(|s| s.load(Ordering::SeqCst)).sum();
        if sum < self.limit {
            self.stripes[stripe].fetch_add(1, Ordering::SeqCst);
            Ok(())
        } else {
            Err(Denied::RetryAfter(nanos(SUB - now % SUB)))
        }
    }
}

/// The same check the models above pass must catch the racy striped counter.
#[test]
#[should_panic(expected = "sliding window invariant violated")]
fn known_bad_sum_then_increment_is_caught() {
    explore(
        "sliding_window::known_bad_sum_then_increment_is_caught",
        3,
        || {
            let clock = ManualClock::new();
            let counter = Arc::new(SumThenIncrement {
                stripes: [AtomicU64::new(0), AtomicU64::new(0)],
                limit: 1,
                clock: RecordingClock::new(clock),
            });
            let c = counter.clone();
            let first = thread::spawn(move || vec![record(1, || c.try_acquire(0))]);
            let c = counter.clone();
            let second = thread::spawn(move || vec![record(1, || c.try_acquire(1))]);
            let threads = vec![first.join().unwrap(), second.join().unwrap()];
            assert_sliding_bound(1, 2, &threads);
        },
    );
}
