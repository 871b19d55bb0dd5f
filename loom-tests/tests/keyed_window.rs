#![cfg(loom)]
//! loom models of the keyed sliding window's per-key state (`Keyable` for
//! `SlidingWindow`: `S` counts under the key's lock, a loom mutex here),
//! driven through `tollgate::keyed::Tunable`, which runs the same per-state
//! code (tag, carry-over, decision) as every key of a `Keyed` map.
//!
//! A state is created empty (no counts allocated): the first admission
//! allocates them. The models race that creation, and sub-window rollovers,
//! against other acquires, record every request with its exact decision time
//! and check the window's promise afterwards — at most `N` permits in any `S`
//! consecutive sub-windows — then, single-threaded, that the window is
//! neither stuck nor loose and its retry-after exact. The map around the
//! states (creation under a shard's write lock, eviction under the same
//! lock, so never beside an acquire on the key) is the same for every kind
//! and modelled in `keyed_eviction.rs`; these models run on the same map.
//!
//! A per-key window that checks the room under the lock and counts the
//! admission under a second lock must be caught over-admitting: that proves
//! the checks can fail.

use std::time::Duration;

use loom::sync::{Arc, Mutex};
use loom::thread;
use tollgate::fault::{Fault, inject};
use tollgate::keyed::{SlidingWindowConfig, Tunable};
use tollgate::{Clock, Denied, ManualClock, Rate, SlidingWindow};
use tollgate_loom_tests::Step::{self, Take, To};
use tollgate_loom_tests::{
    Ask, Op, RecordingClock, explore, join_all, race, record, scripted, single_threaded_tail,
};

/// Sub-window length in nanoseconds.
const SUB: u64 = 10;

type Window = Tunable<SlidingWindow<RecordingClock>>;

/// `limit` permits in any `subs` sub-windows of `SUB` ns, on a manual clock
/// at 0, and a handle to move that clock.
fn window(limit: u32, subs: u32) -> (Arc<Window>, ManualClock) {
    let clock = ManualClock::new();
    let rate = Rate::new(limit, Duration::from_nanos(SUB * u64::from(subs)));
    let config = SlidingWindowConfig::with_sub_windows(rate, subs).expect("a valid configuration");
    assert_eq!(config.sub_window(), Duration::from_nanos(SUB));
    let window = Tunable::with_clock(config, RecordingClock::new(clock.clone()));
    (Arc::new(window), clock)
}

/// The sliding window's invariant on exact decision times: the permits
/// admitted at times in any `subs` consecutive sub-windows are at most `limit`.
fn assert_sliding_bound(limit: u32, subs: u32, threads: &[Vec<Op>]) {
    tollgate_loom_tests::assert_sliding_bound("keyed sliding window", SUB, limit, subs, threads);
}

/// The checks on the joined threads' requests: the bound, the
/// single-threaded tail and the bound over everything.
fn verify(
    limiter: &impl Ask,
    clock: &ManualClock,
    (limit, subs): (u32, u32),
    mut threads: Vec<Vec<Op>>,
) {
    assert_sliding_bound(limit, subs, &threads);
    threads.push(single_threaded_tail(clock, limit, || limiter.ask(1)));
    assert_sliding_bound(limit, subs, &threads);
}

/// The race every model below runs on `make`'s limiter (2 in any 2
/// sub-windows): one thread takes 1 then 1 on the fresh state (its first
/// admission allocates the counts); the other takes 1, moves the clock into
/// sub-window 1 and takes 2. Then the bound, the single-threaded tail and the
/// bound over everything.
fn creation_races_a_rollover<W: Ask + Send + Sync + 'static>(
    make: impl Fn() -> (Arc<W>, ManualClock),
) {
    let (limiter, clock) = make();
    let second: &[Step] = &[Take(1), To(SUB), Take(2)];
    let threads = race(&limiter, &clock, &[&[Take(1), Take(1)], second]);
    verify(&*limiter, &clock, (2, 2), threads);
}

/// A state's creation (its first admission allocates the counts) racing
/// another acquire, while the clock crosses into the next sub-window.
#[test]
fn creation_races_acquires_across_a_rollover() {
    explore(
        "keyed_window::creation_races_acquires_across_a_rollover",
        3,
        || {
            creation_races_a_rollover(|| window(2, 2));
        },
    );
}

/// Three threads on one key, 3 in any 3 sub-windows: two take 2 and 1 while
/// the third moves the clock twice (sub-windows open past counted ones) and
/// takes 1 in each.
#[test]
fn three_threads_share_a_key_while_sub_windows_open() {
    explore(
        "keyed_window::three_threads_share_a_key_while_sub_windows_open",
        2,
        || {
            let (limiter, clock) = window(3, 3);
            let mover: &[Step] = &[To(SUB), Take(1), To(3 * SUB), Take(1)];
            let threads = race(&limiter, &clock, &[&[Take(2)], &[Take(1)], mover]);
            verify(&*limiter, &clock, (3, 3), threads);
        },
    );
}

/// Known bad: per-key counts whose room is checked under the lock and whose
/// admission is counted under a second lock. Two acquires both see room for
/// the last permit.
struct CheckThenCount {
    /// (newest sub-window, its count, the previous one's count).
    counts: Mutex<(u64, u32, u32)>,
    limit: u32,
    clock: RecordingClock,
}

impl Ask for CheckThenCount {
    fn ask(&self, n: u32) -> Result<(), Denied> {
        let now = self.clock.now();
        let j = now / SUB;
        let room = {
            let mut c = self.counts.lock().unwrap();
            if j > c.0 {
                *c = (j, 0, if j == c.0 + 1 { c.1 } else { 0 });
            }
            self.limit - (c.1 + c.2).min(self.limit)
        };
        if room < n {
            return Err(Denied::RetryAfter(Duration::from_nanos(
                (j + 1) * SUB - now,
            )));
        }
        let mut c = self.counts.lock().unwrap();
        c.1 += n;
        Ok(())
    }
}

#[test]
#[should_panic(expected = "keyed sliding window invariant violated")]
fn known_bad_check_then_count_is_caught() {
    explore(
        "keyed_window::known_bad_check_then_count_is_caught",
        3,
        || {
            creation_races_a_rollover(|| {
                let clock = ManualClock::new();
                let bad = CheckThenCount {
                    counts: Mutex::new((0, 0, 0)),
                    limit: 2,
                    clock: RecordingClock::new(clock.clone()),
                };
                (Arc::new(bad), clock)
            });
        },
    );
}

/// 2 in any 3 sub-windows. One thread takes 1 at 0 and 1 in sub-window 1
/// (opening it writes sub-window 0's charge into the history); the other
/// takes 1, moves the clock to sub-window 2 and takes 1 more: opening
/// sub-window 2 must count sub-window 0's charge, which only the history
/// holds by then.
fn a_later_opener_reads_the_history(make: impl Fn() -> (Arc<Window>, ManualClock)) {
    let (limiter, clock) = make();
    let first: &[Step] = &[Take(1), To(SUB), Take(1)];
    let second: &[Step] = &[Take(1), To(2 * SUB), Take(1)];
    let threads = race(&limiter, &clock, &[first, second]);
    verify(&*limiter, &clock, (2, 3), threads);
}

/// Sub-windows opening on two threads: each opener publishes the charge it
/// leaves before the pool moves on, and each reads what earlier ones left.
#[test]
fn a_later_opener_reads_the_history_an_earlier_one_wrote() {
    explore(
        "keyed_window::a_later_opener_reads_the_history_an_earlier_one_wrote",
        3,
        || a_later_opener_reads_the_history(|| window(2, 3)),
    );
}

/// Known bad: openers that move the pool before writing the sub-window they
/// leave into the history. The opener of sub-window 2 can then miss
/// sub-window 0's charge and admit a third permit.
#[test]
#[should_panic(expected = "keyed sliding window invariant violated")]
fn known_bad_open_before_publish_is_caught() {
    explore(
        "keyed_window::known_bad_open_before_publish_is_caught",
        3,
        || {
            inject(Fault::WindowOpenBeforePublish, true);
            a_later_opener_reads_the_history(|| window(2, 3));
        },
    );
}

/// A reconfiguration of a window of 2 in any 2 sub-windows to `to` (counts
/// carried as they are) racing a thread that takes 1 at 0 and 1 in
/// sub-window 1, whose opening writes sub-window 0's charge into the
/// history: the carry-over seals the pool, reads the history and installs a
/// new one, keeping every count, so 2 in any 2 sub-windows holds across the
/// change as long as `to` is at least as strict.
fn a_carry_over_races_an_opener(to: SlidingWindowConfig) {
    let (limiter, clock) = window(2, 2);
    let taker = scripted(&limiter, &clock, &[Take(1), To(SUB), Take(1)]);
    let l = Arc::clone(&limiter);
    let changer = thread::spawn(move || {
        l.reconfigure(to, tollgate::keyed::Carry::Additive);
        vec![]
    });
    let threads = join_all(vec![taker, changer]);
    verify(&*limiter, &clock, (2, 2), threads);
}

/// The same limits again: the history is replaced, never rewritten.
#[test]
fn a_carry_over_to_the_same_limits_races_an_opener() {
    explore(
        "keyed_window::a_carry_over_to_the_same_limits_races_an_opener",
        3,
        || a_carry_over_races_an_opener(window(2, 2).0.config()),
    );
}

/// A window of 3 sub-windows: the new history has another length, and an
/// overtaken opener's write must not reach it.
#[test]
fn a_carry_over_to_more_sub_windows_races_an_opener() {
    explore(
        "keyed_window::a_carry_over_to_more_sub_windows_races_an_opener",
        3,
        || a_carry_over_races_an_opener(window(2, 3).0.config()),
    );
}

type PerKey = tollgate::keyed::Keyed<
    u64,
    SlidingWindow<RecordingClock>,
    std::hash::BuildHasherDefault<std::collections::hash_map::DefaultHasher>,
>;

/// A keyed window of `limit` in any `subs` sub-windows of `SUB` ns (a fixed
/// hasher: loom replays each execution, so the key's shard must not change).
fn per_key(limit: u32, subs: u32) -> (Arc<PerKey>, ManualClock) {
    let clock = ManualClock::new();
    let rate = Rate::new(limit, Duration::from_nanos(SUB * u64::from(subs)));
    let config = SlidingWindowConfig::with_sub_windows(rate, subs).expect("a valid configuration");
    let keyed = tollgate::keyed::Keyed::with_clock_and_hasher(
        config,
        RecordingClock::new(clock.clone()),
        Default::default(),
    );
    (Arc::new(keyed), clock)
}

/// 2 in any 2 sub-windows, time frozen at 0: one thread takes 1 and turns it
/// down (a refund of the newest sub-window's count), the other takes 1
/// twice. The refunded permit counts for nothing, so with the tail at most 2
/// stand in sub-window 0: a refund that lost the other thread's admission
/// (a store in place of the CAS) lets a third through.
#[test]
fn a_refund_races_an_admission() {
    explore("keyed_window::a_refund_races_an_admission", 3, || {
        let (keyed, clock) = per_key(2, 2);
        let k = Arc::clone(&keyed);
        let refunder = thread::spawn(move || {
            assert!(!k.try_acquire_n_then(&1, 1, &mut |_| false));
            vec![]
        });
        let k = Arc::clone(&keyed);
        let taker = thread::spawn(move || {
            vec![
                record(1, || k.try_acquire_n(&1, 1)),
                record(1, || k.try_acquire_n(&1, 1)),
            ]
        });
        let mut threads = vec![refunder.join().unwrap(), taker.join().unwrap()];
        threads.push(single_threaded_tail(&clock, 2, || {
            keyed.try_acquire_n(&1, 1)
        }));
        assert_sliding_bound(2, 2, &threads);
    });
}

/// 2 in any `subs` sub-windows: one thread takes 1 at 0 and turns it down
/// (a refund, of a finished sub-window if the other thread has opened the
/// next by then), the other moves the clock through sub-windows 1 to
/// `last`, taking 1 in each. Returns the key, the clock and the records.
fn a_late_refund(subs: u32, last: u64) -> (Arc<PerKey>, ManualClock, Vec<Vec<Op>>) {
    let (keyed, clock) = per_key(2, subs);
    let k = Arc::clone(&keyed);
    let refunder = thread::spawn(move || {
        let _ = k.try_acquire_n_then(&1, 1, &mut |_| false);
        vec![]
    });
    let k = Arc::clone(&keyed);
    let c = clock.clone();
    let mover = thread::spawn(move || {
        let mut ops = Vec::new();
        for sub in 1..=last {
            c.set(sub * SUB);
            ops.push(record(1, || k.try_acquire_n(&1, 1)));
        }
        ops
    });
    let threads = vec![refunder.join().unwrap(), mover.join().unwrap()];
    (keyed, clock, threads)
}

/// 2 in any 2 sub-windows. One thread takes 1 at 0 and turns it down; the
/// other moves the clock through sub-windows 1, 2 and 3, taking 1 in each.
/// A refund that finds sub-window 0 finished lowers its history entry; by
/// then the slot may hold sub-window 2's entry, which a store in place of
/// the CAS would erase, letting a third permit into sub-windows 2 and 3.
/// A refund of a finished sub-window is not exact (the pool's `used` keeps
/// the permits until the next opening, so a retry-after read from the
/// lowered history can disagree with it for the rest of the sub-window): the
/// tail checks the bound, then that a window later the key has exactly its
/// limit again.
#[test]
fn a_late_refund_races_the_openers_after_it() {
    explore(
        "keyed_window::a_late_refund_races_the_openers_after_it",
        3,
        || {
            let (keyed, clock, mut threads) = a_late_refund(2, 3);
            let mut tail = vec![record(1, || keyed.try_acquire_n(&1, 1))];
            clock.advance(Duration::from_nanos(2 * SUB));
            let full = vec![
                record(1, || keyed.try_acquire_n(&1, 1)),
                record(1, || keyed.try_acquire_n(&1, 1)),
                record(1, || keyed.try_acquire_n(&1, 1)),
            ];
            assert_eq!(
                full.iter().map(|op| op.result.is_ok()).collect::<Vec<_>>(),
                [true, true, false],
                "a window after the last charge, the key takes its limit exactly"
            );
            tail.extend(full);
            threads.push(tail);
            assert_sliding_bound(2, 2, &threads);
        },
    );
}

/// 2 in any 3 sub-windows. One thread takes 1 at 0 and turns it down; the
/// other moves the clock through sub-windows 1 to 5, taking 1 in each. A
/// refund that finds sub-window 0 finished lowers its history entry; by
/// then the slot may hold sub-window 3's entry, which the opener of
/// sub-window 5 sums into what is already charged: a store in place of the
/// CAS would erase it and let a third permit into sub-windows 3 to 5.
#[test]
fn a_late_refund_races_an_entry_still_to_be_read() {
    explore(
        "keyed_window::a_late_refund_races_an_entry_still_to_be_read",
        2,
        || {
            let (_, _, threads) = a_late_refund(3, 5);
            assert_sliding_bound(2, 3, &threads);
        },
    );
}
