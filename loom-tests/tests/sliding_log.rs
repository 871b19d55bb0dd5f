#![cfg(loom)]
//! loom models of `tollgate::SlidingLog`: the ticket CAS, the lap-bit entries and
//! the seal-and-inherit reconfiguration, the code that ships, model-checked
//! through tollgate's sync facade (the ring pointer is a loom `AtomicPtr` in the
//! epoch stand-in, see `src/sync/epoch.rs`).
//!
//! Every model records each request with its exact decision time (the one clock
//! reading it took) and, after joining, asserts the log's promise on those
//! times — at most N permits in any half-open window `[t, t + T)` — then runs a
//! single-threaded tail: the log is neither stuck nor loose and its retry-after
//! is exact. Most models move the clock inside the model.
//!
//! The last model is the circular buffer `SlidingLog` starts from, the C#
//! `MultiNoLock` of Khaled Henidak's "Writing a Non-Locking Throttling
//! Component" (2015, <http://henidak.com/2015/08/writing-a-non-locking-throttling-component/>,
//! code at <https://github.com/khenidak/throttling>), translated line by
//! line: loom must find the interleaving in which it admits more than N, which
//! proves the models can fail. `docs/sliding_log.md` shows that interleaving.

use loom::sync::Arc;
use loom::sync::atomic::{AtomicI32, AtomicI64, Ordering};
use loom::thread;
use tollgate::fault::{Fault, inject};
use tollgate::{Clock, Denied, ManualClock, Rate, RateLimiter, SlidingLog};
use tollgate_loom_tests::Step::{self, Take};
use tollgate_loom_tests::{
    Move::{By, To},
    Op, RecordingClock, Subject, advance_between_acquires, clock_mover, depth, explore,
    explore_races, join_all, nanos, on_manual_clock, race, race_a_moving_clock, race_an_advance,
    record, requester, scripted, single_threaded_tail,
};

/// The window: 10 ns.
const WINDOW: u64 = 10;

/// A log of `limit` permits per [`WINDOW`] in one ring, on a manual clock at 0,
/// and a handle to move that clock. The ring's own models use this.
fn sliding_log(limit: u32) -> (Arc<SlidingLog<RecordingClock>>, ManualClock) {
    striped_log(limit, 1)
}

/// As [`sliding_log`], split over `stripes` rings. Model threads 1, 2, 3 have
/// home rings 1, 0, 1 of two.
fn striped_log(limit: u32, stripes: usize) -> (Arc<SlidingLog<RecordingClock>>, ManualClock) {
    let (log, clock) = on_manual_clock(|clock| {
        SlidingLog::with_clock(Rate::new(limit, nanos(WINDOW)), clock)
            .map(|log| log.with_stripes(stripes))
    });
    assert_eq!(log.stripes(), stripes);
    (log, clock)
}

/// The sliding log's promise on exact decision times: every half-open window
/// `[t, t + window)` holds at most `limit` permits. The fullest window starts at
/// an admission, so those are the windows checked.
fn assert_sliding_bound(limit: u32, window: u64, threads: &[Vec<Op>]) {
    let admitted: Vec<(u64, u32)> = threads
        .iter()
        .flatten()
        .filter(|op| op.result.is_ok())
        .map(|op| (op.at.expect("an admission read the clock"), op.n))
        .collect();
    for &(start, _) in &admitted {
        let count: u32 = admitted
            .iter()
            .filter(|&&(t, _)| start <= t && t < start + window)
            .map(|&(_, n)| n)
            .sum();
        assert!(
            count <= limit,
            "sliding log invariant violated: {count} permits admitted at times in \
             [{start}, {}) ns, limit {limit}; histories: {threads:#?}",
            start + window
        );
    }
}

fn admitted(threads: &[Vec<Op>]) -> u32 {
    threads
        .iter()
        .flatten()
        .filter(|op| op.result.is_ok())
        .map(|op| op.n)
        .sum()
}

/// Every check a model makes once its threads are joined.
fn verify(log: &SlidingLog<RecordingClock>, clock: &ManualClock, mut threads: Vec<Vec<Op>>) {
    let (limit, window) = (log.limit(), log.window().as_nanos() as u64);
    assert_sliding_bound(limit, window, &threads);
    threads.push(single_threaded_tail(clock, limit, || log.try_acquire()));
    assert_sliding_bound(limit, window, &threads);
    assert_whole_limit_fits_a_window_later(log, clock, &threads);
}

/// The log is not stuck: a window after the latest decision every entry has
/// left the window (no stamp is later than the latest decision time), so a
/// request for the whole limit — one ticket of every ring — is admitted. The
/// tail cannot see a single ring that refuses for good (say, a slot left
/// looking claimed-but-unstamped by a rollback that overwrote a later lap's
/// entry): its single permits are served by another ring.
fn assert_whole_limit_fits_a_window_later(
    log: &SlidingLog<RecordingClock>,
    clock: &ManualClock,
    threads: &[Vec<Op>],
) {
    let limit = log.limit();
    let latest = threads
        .iter()
        .flatten()
        .filter_map(|op| op.at)
        .fold(clock.now(), u64::max);
    clock.set(latest + log.window().as_nanos() as u64);
    let op = record(limit, || log.try_acquire_n(limit));
    assert_eq!(
        op.result,
        Ok(()),
        "the whole limit ({limit}) was refused a window after the latest decision \
         ({latest} ns); histories: {threads:#?}"
    );
}

/// The log of one ring as the shared model shapes run it.
const LOG: Subject<SlidingLog<RecordingClock>> = Subject {
    build: sliding_log,
    verify: |log, clock, _, threads| verify(log, clock, threads),
};

/// Three threads, one permit each, time standing still, N = 2 in `stripes`
/// rings: exactly two get in, in every interleaving. With one ring the first
/// lap's tickets need no entry, so no denial can come from an entry still in
/// flight; with two rings of one slot, threads 1 and 3 share a home ring, and
/// whoever finds its home taken crosses to the other ring.
fn race_for_two_slots(name: &'static str, stripes: usize, bound: usize) {
    explore_races(name, bound, move || {
        const LIMIT: u32 = 2;
        let (log, clock) = striped_log(LIMIT, stripes);
        let handles = (0..3).map(|_| requester(&log, &[1])).collect();
        let threads = join_all(handles);
        assert_eq!(admitted(&threads), LIMIT, "{threads:#?}");
        verify(&log, &clock, threads);
    });
}

#[test]
fn three_threads_race_for_two_slots() {
    race_for_two_slots("sliding_log::three_threads_race_for_two_slots", 1, 3);
}

#[test]
fn two_threads_wrap_the_ring_with_concurrent_advance() {
    let name = "sliding_log::two_threads_wrap_the_ring_with_concurrent_advance";
    LOG.explore(name, 3, 2, |log, clock| {
        let threads = advance_between_acquires(log, clock, 2, WINDOW);
        // Four single permits, two per window and one window passing: at
        // least the first two, never more than the two windows' four.
        assert!((2..=4).contains(&admitted(&threads)), "{threads:#?}");
        threads
    });
}

#[test]
fn one_slot_many_laps_with_a_ticking_clock() {
    let name = "sliding_log::one_slot_many_laps_with_a_ticking_clock";
    LOG.explore(name, 2, 1, |log, clock| {
        // 0 → 6 → 12: one window passes on the second tick. Every admission
        // wraps the one-slot ring, so the lap bit flips on every ticket.
        race_a_moving_clock(log, clock, &[&[1, 1], &[1, 1]], &[By(6), By(6)])
    });
}

/// The log of `limit` in `stripes` rings, all taken at 0 by one request; then
/// a request for 2 races a single permit while a third thread moves the clock a
/// window and asks for `late` permits. Everything after the first lap needs
/// entries written by other threads.
fn pair_races_single_across_a_window(name: &'static str, limit: u32, stripes: usize, late: u32) {
    explore_races(name, 2, move || {
        let (log, clock) = striped_log(limit, stripes);
        assert_eq!(log.try_acquire_n(limit), Ok(()));

        let mut threads = race_an_advance(&log, &clock, &[&[2], &[1]], WINDOW, &[late]);
        threads.push(vec![Op {
            n: limit,
            at: Some(0),
            result: Ok(()),
        }]);
        verify(&log, &clock, threads);
    });
}

#[test]
fn acquire_n_races_single_permits_across_a_window() {
    // One ring of 3: the second lap's tickets replace entries of the first.
    pair_races_single_across_a_window(
        "sliding_log::acquire_n_races_single_permits_across_a_window",
        3,
        1,
        2,
    );
}

#[test]
fn clock_stepping_back_races_with_acquires() {
    let name = "sliding_log::clock_stepping_back_races_with_acquires";
    LOG.explore(name, 2, 2, |log, clock| {
        // Back by two windows: readings of 30 and of 10 race with the acquires
        // in both orders. Entries may be stamped at 30 while the clock reads
        // 10: the tail starts from there and must still find the exact
        // retry-after.
        race_a_moving_clock(log, clock, &[&[1, 1], &[2]], &[To(3 * WINDOW), To(WINDOW)])
    });
}

/// A thread asking for each of `requests` permits races one that
/// reconfigures `log` to the same rate of `limit`, moves the clock on half a
/// window and asks for one permit. The limit in force never changes, so the
/// plain invariant must hold across the swap (of every ring): an admission
/// lost in it (made on an old ring after its entries were copied) would let
/// one permit too many into the window. Someone is admitted.
fn same_rate_reconfiguration_races(
    log: &Arc<SlidingLog<RecordingClock>>,
    clock: &ManualClock,
    limit: u32,
    requests: &[u32],
) -> Vec<Vec<Op>> {
    let acquirer = requester(log, requests);
    let (l, c) = (log.clone(), clock.clone());
    let changer = thread::spawn(move || {
        l.reconfigure(Rate::new(limit, nanos(WINDOW))).unwrap();
        c.advance(nanos(WINDOW / 2));
        vec![record(1, || l.try_acquire())]
    });
    let threads = join_all(vec![acquirer, changer]);
    assert!(admitted(&threads) >= 1, "{threads:#?}");
    threads
}

#[test]
fn reconfiguration_races_acquires() {
    explore_races("sliding_log::reconfiguration_races_acquires", 2, || {
        let (log, clock) = sliding_log(1);
        let threads = same_rate_reconfiguration_races(&log, &clock, 1, &[1, 1]);
        verify(&log, &clock, threads);
    });
}

#[test]
fn growing_reconfiguration_races_acquires() {
    explore_races(
        "sliding_log::growing_reconfiguration_races_acquires",
        2,
        || {
            let (log, clock) = sliding_log(1);

            let acquirer = requester(&log, &[1, 1]);
            let l = log.clone();
            let changer = thread::spawn(move || {
                l.reconfigure(Rate::new(2, nanos(WINDOW))).unwrap();
                vec![record(1, || l.try_acquire())]
            });

            let threads = vec![acquirer.join().unwrap(), changer.join().unwrap()];
            // Time stands still: at most the new limit, and the changer's
            // request, made under the new limit of 2, finds room unless both of
            // the acquirer's got in.
            let total = admitted(&threads);
            assert!((1..=2).contains(&total), "{threads:#?}");
            assert!(threads[1][0].result.is_ok() || total == 2, "{threads:#?}");
            assert_eq!(log.limit(), 2);
            verify(&log, &clock, threads);
        },
    );
}

#[test]
fn counting_denied_attempts_races() {
    explore_races("sliding_log::counting_denied_attempts_races", 2, || {
        const LIMIT: u32 = 1;
        let clock = ManualClock::new();
        let log = Arc::new(
            SlidingLog::with_clock(
                Rate::new(LIMIT, nanos(WINDOW)),
                RecordingClock::new(clock.clone()),
            )
            .expect("a valid configuration")
            .with_stripes(1)
            .count_denied(true),
        );
        let hammers: Vec<_> = (0..2).map(|_| requester(&log, &[1, 1])).collect();
        // Half a window, twice: a denial logged at 5 keeps the log closed until 15.
        let ticker = clock_mover(&clock, &[By(WINDOW / 2), By(WINDOW / 2)]);
        let threads = join_all(hammers);
        ticker.join().unwrap();
        // Denied attempts are logged, admitted permits still keep the limit.
        assert!(admitted(&threads) >= 1, "{threads:#?}");
        let mut threads = threads;
        assert_sliding_bound(LIMIT, WINDOW, &threads);
        // The tail for a counting log: its retry-after counts the attempt it just
        // logged, and waiting exactly that long (with no attempt in between) admits.
        let mut tail = Vec::new();
        let wait = loop {
            let op = record(1, || log.try_acquire());
            tail.push(op);
            match op.result {
                Ok(()) => assert!(tail.len() <= LIMIT as usize, "{tail:#?}"),
                Err(Denied::RetryAfter(wait)) => break wait,
                Err(other) => panic!("{other:?}"),
            }
        };
        clock.advance(wait);
        let after = record(1, || log.try_acquire());
        assert_eq!(after.result, Ok(()), "a retry-after of {wait:?} ran out");
        tail.push(after);
        threads.push(tail);
        assert_sliding_bound(LIMIT, WINDOW, &threads);
    });
}

#[test]
fn two_rings_three_threads_race_for_two_slots() {
    race_for_two_slots(
        "sliding_log::two_rings_three_threads_race_for_two_slots",
        2,
        depth(2, 3),
    );
}

#[test]
fn two_rings_spanning_requests_race_and_roll_back() {
    // Two rings of one slot: the request for 2 needs both, one from each. It
    // claims its home ring, then the other, and takes its first claim back if
    // the single permit took the other ring meanwhile.
    pair_races_single_across_a_window(
        "sliding_log::two_rings_spanning_requests_race_and_roll_back",
        2,
        2,
        1,
    );
}

#[test]
fn two_rings_reconfiguration_races_spanning_acquires() {
    explore_races(
        "sliding_log::two_rings_reconfiguration_races_spanning_acquires",
        2,
        || {
            let (log, clock) = striped_log(2, 2);
            let threads = same_rate_reconfiguration_races(&log, &clock, 2, &[1, 2]);
            assert_eq!(log.stripes(), 2);
            verify(&log, &clock, threads);
        },
    );
}

/// The ring's second lap, time standing still and demand within the limit:
/// both requests for 2 of 4 must be admitted in every interleaving. A request
/// that finds the entry its ticket replaces already overwritten by the other's
/// claim (the first or the second of its two stores) must see that the head
/// moved and retry, not mistake the entry for one still in flight and refuse.
/// (First-lap tickets replace nothing and read no entry, hence the lap.)
#[test]
fn demand_within_capacity_is_all_admitted() {
    const LIMIT: u32 = 4;
    let name = "sliding_log::demand_within_capacity_is_all_admitted";
    LOG.explore(name, 3, LIMIT, |log, clock| {
        let first_lap = vec![record(LIMIT, || log.try_acquire_n(LIMIT))];
        clock.advance(nanos(WINDOW));

        let one = requester(log, &[2]);
        let two = requester(log, &[2]);

        let mut threads = join_all(vec![one, two]);
        assert_eq!(admitted(&threads), LIMIT, "{threads:#?}");
        threads.push(first_lap);
        threads
    });
}

/// A request spanning two rings of one slot claims its home ring, loses the
/// other to a single permit and takes its claim back — late: meanwhile the
/// other thread moved the clock a window on and claimed both rings again. The
/// late undo must leave the newer lap's entry alone.
#[test]
fn late_undo_meets_a_later_lap() {
    explore_races("sliding_log::late_undo_meets_a_later_lap", 1, || {
        let (log, clock) = striped_log(2, 2);
        let mover: &[Step] = &[Take(1), Step::By(WINDOW), Take(2)];
        let threads = race(&log, &clock, &[&[Take(2)], mover]);
        verify(&log, &clock, threads);
    });
}

/// A reconfiguration seals a one-slot ring while another thread laps it three
/// times (at 0, 10 and 20). The seal must order every claim before it ahead
/// of the sealer's reads: the slot's word has one lap bit, so an entry two
/// laps old would pass for the newest one and be inherited as free.
#[test]
fn reconfiguration_seals_a_ring_being_lapped() {
    explore_races(
        "sliding_log::reconfiguration_seals_a_ring_being_lapped",
        3,
        || {
            const LIMIT: u32 = 1;
            let (log, clock) = sliding_log(LIMIT);

            let laps = [
                Take(1),
                Step::By(WINDOW),
                Take(1),
                Step::By(WINDOW),
                Take(1),
            ];
            let lapper = scripted(&log, &clock, &laps);
            let changer = reconfigurer(&log, LIMIT);

            let threads = vec![lapper.join().unwrap()];
            changer.join().unwrap();
            verify(&log, &clock, threads);
        },
    );
}

/// Spawns a thread that reconfigures `log` to the same rate of `limit`.
fn reconfigurer(log: &Arc<SlidingLog<RecordingClock>>, limit: u32) -> thread::JoinHandle<()> {
    let l = log.clone();
    thread::spawn(move || l.reconfigure(Rate::new(limit, nanos(WINDOW))).unwrap())
}

/// Two reconfigurations at once, while a thread acquires: the second to seal
/// replaces the rings the first published, so it must see them whole.
#[test]
fn two_reconfigurations_race() {
    explore_races("sliding_log::two_reconfigurations_race", 3, || {
        const LIMIT: u32 = 1;
        let (log, clock) = sliding_log(LIMIT);

        let l = log.clone();
        let first = thread::spawn(move || {
            l.reconfigure(Rate::new(LIMIT, nanos(WINDOW))).unwrap();
            vec![record(1, || l.try_acquire())]
        });
        let second = reconfigurer(&log, LIMIT);

        let threads = vec![first.join().unwrap()];
        second.join().unwrap();
        verify(&log, &clock, threads);
    });
}

/// Two rules on one log: 1 per [`WINDOW`] and 2 per four of them.
const RULES: [(u32, u64); 2] = [(1, WINDOW), (2, 4 * WINDOW)];

/// A log of [`RULES`] on a manual clock at 0 (one ring of the largest
/// count, which both rules read), counting denied attempts or not.
fn ruled_log(counting: bool) -> (Arc<SlidingLog<RecordingClock>>, ManualClock) {
    let clock = ManualClock::new();
    let [(n1, w1), (n2, w2)] = RULES;
    let log = SlidingLog::with_clock(Rate::new(n1, nanos(w1)), RecordingClock::new(clock.clone()))
        .expect("a valid rule")
        .with_rule(Rate::new(n2, nanos(w2)))
        .expect("a valid rule")
        .count_denied(counting);
    assert_eq!((log.limit(), log.stripes()), (1, 1));
    (Arc::new(log), clock)
}

/// Every rule's bound on exact decision times, then the single-threaded
/// tail (exact retry-after, not stuck) and the bounds again.
fn verify_rules(log: &SlidingLog<RecordingClock>, clock: &ManualClock, mut threads: Vec<Vec<Op>>) {
    for (limit, window) in RULES {
        assert_sliding_bound(limit, window, &threads);
    }
    threads.push(single_threaded_tail(clock, log.limit(), || {
        log.try_acquire()
    }));
    for (limit, window) in RULES {
        assert_sliding_bound(limit, window, &threads);
    }
}

/// Two threads take a permit twice each while the clock ticks a window
/// twice (0 → 10 → 20): every admission must have left the short rule's
/// window since the entry one back and the long rule's since the entry two
/// back, whichever thread wrote them and whenever it read the clock.
fn rules_race_a_ticking_clock(name: &'static str, largest_only: bool) {
    explore_races(name, 2, move || {
        inject(Fault::LargestRuleOnly, largest_only);
        let (log, clock) = ruled_log(false);
        let acquirers: Vec<_> = (0..2).map(|_| requester(&log, &[1, 1])).collect();
        let ticker = clock_mover(&clock, &[By(WINDOW), By(WINDOW)]);
        let threads = join_all(acquirers);
        ticker.join().unwrap();
        assert!(admitted(&threads) >= 1, "{threads:#?}");
        verify_rules(&log, &clock, threads);
    });
}

#[test]
fn several_rules_race_a_ticking_clock() {
    rules_race_a_ticking_clock("sliding_log::several_rules_race_a_ticking_clock", false);
}

/// Known-bad: the log decides by its largest rule alone (2 per 40 ns), and
/// two permits get into one window of the 1-per-10-ns rule.
#[test]
#[should_panic(expected = "sliding log invariant violated")]
fn known_bad_largest_rule_only_is_caught() {
    rules_race_a_ticking_clock("sliding_log::known_bad_largest_rule_only_is_caught", true);
}

/// The same rules set again while a thread takes permits at 0 and, a window
/// later, again: the reconfiguration seals the ring and the new one inherits
/// bounds on its entries, so a claim either lands before the seal (and is
/// inherited) or decides again on the new ring; both rules hold throughout.
#[test]
fn several_rules_reconfiguration_races_acquires() {
    explore_races(
        "sliding_log::several_rules_reconfiguration_races_acquires",
        2,
        || {
            let (log, clock) = ruled_log(false);
            let acquirer = scripted(&log, &clock, &[Take(1), Step::By(WINDOW), Take(1)]);
            let l = log.clone();
            let changer = thread::spawn(move || {
                l.reconfigure_rules(&l.rules());
                vec![record(1, || l.try_acquire())]
            });
            let threads = join_all(vec![acquirer, changer]);
            verify_rules(&log, &clock, threads);
        },
    );
}

/// Counting denied attempts with two rules: denials are logged on the one
/// ring while a clock ticks, and the admitted permits still keep both rules.
#[test]
fn several_rules_counting_denied_attempts_race() {
    explore_races(
        "sliding_log::several_rules_counting_denied_attempts_race",
        2,
        || {
            let (log, clock) = ruled_log(true);
            let hammers: Vec<_> = (0..2).map(|_| requester(&log, &[1, 1])).collect();
            let ticker = clock_mover(&clock, &[By(WINDOW)]);
            let threads = join_all(hammers);
            ticker.join().unwrap();
            assert!(admitted(&threads) >= 1, "{threads:#?}");
            for (limit, window) in RULES {
                assert_sliding_bound(limit, window, &threads);
            }
        },
    );
}

/// Henidak's non-locking throttle, translated line by line from its C#
/// `MultiNoLock` (`setTail`, `_ShouldDoIt`, `ShouldDoIt`): a ring of ticks with
/// a head and a tail. `Interlocked.Exchange` becomes `swap`; a plain field read
/// becomes a load. Every access is `SeqCst`, the strongest there is, so what
/// loom finds is a flaw of the algorithm, not of memory ordering.
struct MultiNoLock {
    all_ticks: Vec<AtomicI64>,
    head: AtomicI32,
    tail: AtomicI32,
    max_req_allowed_in_period: i32,
    ticks_in_period: i64,
    clock: RecordingClock,
}

const SC: Ordering = Ordering::SeqCst;

impl MultiNoLock {
    fn new(max: i32, period: i64, clock: RecordingClock) -> Self {
        MultiNoLock {
            all_ticks: (0..max).map(|_| AtomicI64::new(0)).collect(),
            head: AtomicI32::new(0),
            tail: AtomicI32::new(-1),
            max_req_allowed_in_period: max,
            ticks_in_period: period,
            clock,
        }
    }

    fn ticks(&self, i: i32) -> &AtomicI64 {
        &self.all_ticks[i as usize]
    }

    fn set_tail(&self, now_ticks: i64) {
        let new_t_tail = 0;
        // only first call
        if -1 == self.tail.load(SC) {
            self.tail.swap(new_t_tail, SC);
            self.ticks(new_t_tail).swap(now_ticks, SC);
            return;
        }
        let ticks_after = now_ticks - self.ticks_in_period;
        let mut newtail = self.tail.load(SC);
        let currenttail = newtail;
        // no need to trim if current tail is within period
        if self.ticks(newtail).load(SC) >= ticks_after {
            return;
        }
        loop {
            if newtail == self.max_req_allowed_in_period - 1 {
                newtail = 0;
            } else {
                newtail += 1;
            }
            // all entries are really old, and a previous thread didn't just set the value
            if newtail == currenttail && self.ticks(newtail).load(SC) < ticks_after {
                // reset place the tail just one place before the head.
                let head = self.head.load(SC);
                newtail = if head == 0 {
                    self.max_req_allowed_in_period - 1
                } else {
                    self.head.load(SC) - 1
                };
                self.tail.swap(newtail, SC);
                self.ticks(newtail).swap(now_ticks, SC);
                return;
            }
            // is a good tail?
            if self.ticks(newtail).load(SC) >= ticks_after {
                self.tail.swap(newtail, SC);
                return;
            }
        }
    }

    fn should_do_it_inner(&self, now_ticks: i64) -> bool {
        self.set_tail(now_ticks);
        let max = self.max_req_allowed_in_period;
        // Interlocked.Exchange(ref currentHead, head): reads the head into a local.
        let mut current_head = self.head.load(SC);
        if (current_head < max - 1 && current_head + 1 == self.tail.load(SC))
            || (0 == self.tail.load(SC) && current_head == max - 1)
        {
            return false;
        }
        // "there is a slim possiblity that head has incremented in this case the
        // increment will be lost"
        if current_head < max - 1 {
            current_head += 1;
            self.head.swap(current_head, SC);
        } else {
            current_head = 0;
            self.head.swap(0, SC);
        }
        self.ticks(current_head).swap(now_ticks, SC);
        true
    }

    /// `ShouldDoIt(ref TryAfterTicks)`, as a `Result`.
    fn try_acquire(&self) -> Result<(), Denied> {
        let now_ticks = self.clock.now() as i64;
        if self.should_do_it_inner(now_ticks) {
            return Ok(());
        }
        let try_after =
            (self.ticks(self.tail.load(SC)).load(SC) + self.ticks_in_period) - now_ticks;
        // `MultiNoLock`'s retry-after can come out zero or negative under races (it
        // reads a tail another thread is moving); clamped so that `record`, which
        // rejects a zero retry-after, lets the model reach the invariant.
        Err(Denied::RetryAfter(nanos(try_after.max(1) as u64)))
    }

    fn state(&self) -> String {
        let ticks: Vec<i64> = self.all_ticks.iter().map(|t| t.load(SC)).collect();
        format!(
            "head = {}, tail = {}, allTicks = {ticks:?}",
            self.head.load(SC),
            self.tail.load(SC)
        )
    }
}

/// Henidak's algorithm with N = 2 and three concurrent requests, time standing
/// still: loom finds the interleaving in which all three read the head before
/// any of them moves it, and all three are admitted. The very check every model
/// above asserts must catch it.
#[test]
#[should_panic(expected = "sliding log invariant violated")]
fn known_bad_multinolock_is_caught() {
    explore("sliding_log::known_bad_multinolock_is_caught", 3, || {
        const LIMIT: u32 = 2;
        let clock = ManualClock::new();
        let throttle = Arc::new(MultiNoLock::new(
            LIMIT as i32,
            WINDOW as i64,
            RecordingClock::new(clock.clone()),
        ));
        let handles: Vec<_> = (0..3)
            .map(|_| {
                let s = throttle.clone();
                thread::spawn(move || vec![record(1, || s.try_acquire())])
            })
            .collect();
        let threads = join_all(handles);
        if admitted(&threads) > LIMIT {
            eprintln!(
                "MultiNoLock state after the over-admission: {}",
                throttle.state()
            );
        }
        assert_sliding_bound(LIMIT, WINDOW, &threads);
    });
}
