#![cfg(loom)]
//! loom models of the keyed sliding log's per-key ring (`Keyable` for
//! `SlidingLog`): the direct log's lock-free ring, one per key, with several
//! rules read from it, replaced as a whole (sealed, copied, published) by a
//! refund or a carry-over. Driven through `Tunable` (the same per-state code
//! as every key of a `Keyed` map) and through `Keyed::for_key`'s refunds.
//!
//! The models record every request with its exact decision time and check
//! each rule afterwards — at most `N_i` admitted permits in any window
//! `[t, t + T_i)` — then, single-threaded, that the log is neither stuck nor
//! loose and its retry-after exact.
//!
//! A refund that moves the head back in place instead of replacing the ring
//! must be caught over-admitting: a decision made on the refunded entry
//! claims once the head has come back to the same ticket.

use std::time::Duration;

use loom::sync::Arc;
use loom::thread;
use tollgate::LogConfig;
use tollgate::fault::{Fault, inject};
use tollgate::keyed::{Keyed, Tunable};
use tollgate::{ManualClock, Rate, RateLimiter, Refundable, SlidingLog};
use tollgate_loom_tests::Step::{self, Take, To};
use tollgate_loom_tests::{
    Op, RecordingClock, admissions_in_order, depth, explore, join_all, race, record, requester,
    scripted, single_threaded_tail,
};

type Log = SlidingLog<RecordingClock>;

/// `(count, window in ns)` rules as a configuration.
fn config(rules: &[(u32, u64)]) -> LogConfig {
    let rate = |&(count, window): &(u32, u64)| Rate::new(count, Duration::from_nanos(window));
    let mut config = LogConfig::new(rate(&rules[0])).expect("a valid rule");
    for rule in &rules[1..] {
        config = config.with_rule(rate(rule)).expect("a valid rule");
    }
    config
}

/// A tunable log under `rules` on a manual clock at 0, and the clock.
fn logged(rules: &[(u32, u64)]) -> (Arc<Tunable<Log>>, ManualClock) {
    let clock = ManualClock::new();
    let log = Tunable::<Log>::with_clock(config(rules), RecordingClock::new(clock.clone()));
    (Arc::new(log), clock)
}

/// A thread that takes one permit at 0, 10 and 20: two laps of a one-slot
/// ring.
fn three_laps(log: &Arc<Tunable<Log>>, clock: &ManualClock) -> thread::JoinHandle<Vec<Op>> {
    scripted(
        log,
        clock,
        &[To(0), Take(1), To(10), Take(1), To(20), Take(1)],
    )
}

/// The sliding log's invariant for one rule, on exact decision times: no
/// half-open window of `window` ns holds more than `count` admitted permits.
fn assert_rule(count: u32, window: u64, threads: &[Vec<Op>]) {
    let admitted = admissions_in_order(threads);
    for &(start, _) in &admitted {
        let inside: u32 = admitted
            .iter()
            .filter(|&&(at, _)| at >= start && at < start + window)
            .map(|&(_, n)| n)
            .sum();
        assert!(
            inside <= count,
            "keyed sliding log invariant violated: {inside} permits admitted in \
             [{start}, {}) (rule {count} per {window} ns); histories: {threads:#?}",
            start + window
        );
    }
}

fn assert_rules(rules: &[(u32, u64)], threads: &[Vec<Op>]) {
    for &(count, window) in rules {
        assert_rule(count, window, threads);
    }
}

/// Two threads on one fresh key under two rules — 1 per 10 ns and 2 per
/// 40 ns — race the ring's creation (the first admission publishes it) and
/// each other's claims while the clock moves: one thread takes 1 twice, the
/// other takes 1, moves the clock to 10 and takes 1 again. Every rule holds,
/// then the single-threaded tail finds the log neither stuck nor loose.
#[test]
fn racing_claims_hold_every_rule() {
    const RULES: [(u32, u64); 2] = [(1, 10), (2, 40)];
    explore("keyed_log::racing_claims_hold_every_rule", 3, || {
        let (log, clock) = logged(&RULES);
        let b: &[Step] = &[Take(1), To(10), Take(1)];
        let mut threads = race(&log, &clock, &[&[Take(1), Take(1)], b]);
        assert_rules(&RULES, &threads);
        threads.push(single_threaded_tail(&clock, 1, || log.try_acquire()));
        assert_rules(&RULES, &threads);
    });
}

/// One permit per 10 ns on one key. One thread is admitted (at 0 or 10),
/// refunds the permit through `for_key` and asks again; the other moves the
/// clock to 10 and asks once — so it may decide on the refunded permit's
/// entry before the refund and claim after it. The refunded request is left
/// out of the bound (a refund that takes effect frees its permit; one that
/// does not only makes the rest fewer), so two admissions at 10 are an
/// over-admission either way. With `tail`, the single-threaded tail follows.
fn refund_races_a_decision(tail: bool) {
    const RULE: (u32, u64) = (1, 10);
    let clock = ManualClock::new();
    let keyed = Arc::new(Keyed::<u32, Log>::with_clock(
        config(&[RULE]),
        RecordingClock::new(clock.clone()),
    ));
    let k = Arc::clone(&keyed);
    let refunder = thread::spawn(move || {
        let handle = k.for_key(&0);
        let mut receipt = None;
        let refunded = record(1, || match handle.try_acquire_n_refundable(1) {
            Ok(admitted) => {
                receipt = Some(admitted.receipt);
                Ok(())
            }
            Err(rejection) => Err(rejection.denied),
        });
        if let Some(receipt) = receipt {
            handle.refund(receipt);
        }
        let again = record(1, || handle.try_acquire());
        (refunded, again)
    });
    let k = Arc::clone(&keyed);
    let c = clock.clone();
    let other = thread::spawn(move || {
        c.set(10);
        vec![record(1, || k.try_acquire(&0))]
    });
    let (_refunded, again) = refunder.join().unwrap();
    let mut threads = vec![vec![again], other.join().unwrap()];
    assert_rule(RULE.0, RULE.1, &threads);
    if !tail {
        return;
    }
    threads.push(single_threaded_tail(&clock, RULE.0, || {
        keyed.try_acquire(&0)
    }));
    assert_rule(RULE.0, RULE.1, &threads);
}

#[test]
fn a_refund_races_a_decision_on_its_entry() {
    explore(
        "keyed_log::a_refund_races_a_decision_on_its_entry",
        3,
        || refund_races_a_decision(true),
    );
}

#[test]
#[should_panic(expected = "keyed sliding log invariant violated")]
fn known_bad_unsealed_refund_is_caught() {
    explore("keyed_log::known_bad_unsealed_refund_is_caught", 3, || {
        inject(Fault::UnsealedLogRefunds, true);
        // No tail: the in-place refund also leaves entries that look in
        // flight for good (a stuck key, which the tail reports first); the
        // model is after the over-admission.
        refund_races_a_decision(false);
    });
}

/// A rule change (1 per 10 ns to 1 per 10 ns and 2 per 40 ns, history kept)
/// racing a claim on the old ring: the carry-over seals the ring and copies
/// it, the claim either lands before the seal (and is copied) or decides
/// again on the copy. The request after it at the same instant is denied by
/// either rule.
#[test]
fn a_carry_over_races_a_claim() {
    const BEFORE: [(u32, u64); 1] = [(1, 10)];
    const AFTER: [(u32, u64); 2] = [(1, 10), (2, 40)];
    explore("keyed_log::a_carry_over_races_a_claim", 3, || {
        let (log, clock) = logged(&BEFORE);
        // A ring to carry over: one admission at 0.
        let setup = record(1, || log.try_acquire());
        assert_eq!(setup.result, Ok(()));
        clock.set(10);
        let l = Arc::clone(&log);
        let claimer = thread::spawn(move || vec![record(1, || l.try_acquire())]);
        let l = Arc::clone(&log);
        let changer = thread::spawn(move || {
            l.reconfigure(config(&AFTER), tollgate::keyed::Carry::Proportional);
            vec![record(1, || l.try_acquire())]
        });
        let mut threads = vec![
            vec![setup],
            claimer.join().unwrap(),
            changer.join().unwrap(),
        ];
        assert_rule(1, 10, &threads);
        let admitted_at_10 = threads[1..]
            .iter()
            .flatten()
            .filter(|op| op.result.is_ok())
            .count();
        assert_eq!(admitted_at_10, 1, "one of two requests at 10: {threads:#?}");
        threads.push(single_threaded_tail(&clock, 1, || log.try_acquire()));
        assert_rule(1, 10, &threads);
        // The new rules from the change on: the permit at 0 had left the old
        // (longest) window when the history was carried, so it is not part
        // of it (a key holding only it was fresh, and could have been
        // evicted).
        assert_rules(&AFTER, &threads[1..]);
    });
}

/// One permit per 10 ns: the rule of the one-slot models below.
const ONE_SLOT: (u32, u64) = (1, 10);

/// [`explore`]s `model` at `preemption_bound` on a fresh log of one slot
/// ([`ONE_SLOT`]) in every interleaving; the rule must hold on the requests
/// it returns.
fn explore_one_slot(
    name: &str,
    preemption_bound: usize,
    model: impl Fn(&Arc<Tunable<Log>>, &ManualClock) -> Vec<Vec<Op>> + Sync + Send + 'static,
) {
    explore(name, preemption_bound, move || {
        let (log, clock) = logged(&[ONE_SLOT]);
        let threads = model(&log, &clock);
        assert_rule(ONE_SLOT.0, ONE_SLOT.1, &threads);
    });
}

/// One permit per 10 ns on a one-slot ring: one thread is admitted at 0, 10
/// and 20 (moving the clock itself), so the slot goes through three laps,
/// while the other asks once. A reader that sees the head two laps on must
/// see the slot at least one lap on: the lap bit tells only two laps apart,
/// and the entry of 0 read as the entry of 20 would admit a second permit at
/// 20. (The head's Acquire load and the claim's Release CAS.)
#[test]
fn a_reader_two_laps_behind_the_head() {
    let name = "keyed_log::a_reader_two_laps_behind_the_head";
    explore_one_slot(name, 3, |log, clock| {
        join_all(vec![three_laps(log, clock), requester(log, &[1])])
    });
}

/// The same laps racing a carry-over (the rule kept, the tag flipped): the
/// copy is made from the sealed ring, so the sealer must see every claim
/// before the seal and the entries those claimers read (the seal's Acquire);
/// a copy holding the entry of 0 where the ring holds 20's would admit
/// again at 20.
#[test]
fn a_carry_over_two_laps_behind_the_head() {
    let name = "keyed_log::a_carry_over_two_laps_behind_the_head";
    explore_one_slot(name, depth(2, 3), |log, clock| {
        let laps = three_laps(log, clock);
        let l = Arc::clone(log);
        let changer = thread::spawn(move || {
            l.reconfigure(config(&[ONE_SLOT]), tollgate::keyed::Carry::Proportional);
            vec![record(1, || l.try_acquire())]
        });
        join_all(vec![laps, changer])
    });
}

/// One permit per 10 ns on a one-slot ring, three threads: one is admitted
/// at 0, a second at 10 on the first's entry, a third asks once. A reader
/// that syncs with the second claim must see the first entry's store too —
/// the second claimer read it before claiming — or the slot's initial word,
/// whose lap bit is the second lap's, reads as a stamp of 0 and admits a
/// second permit at 10. (The entry's Release store: the link from a claim
/// to the entry it replaced.)
///
/// Preemption bound 1 (2 in the deeper run): the execution it was written
/// for needs no preemption at all (the three threads run one after another;
/// what differs is which store a load may still read). Bound 2 explores
/// about half a million interleavings in 41 s, bound 3 4.4 million in about
/// 530 s.
#[test]
fn a_reader_behind_two_claimers() {
    let name = "keyed_log::a_reader_behind_two_claimers";
    explore_one_slot(name, depth(1, 2), |log, clock| {
        race(log, clock, &[&[Take(1)], &[To(10), Take(1)], &[Take(1)]])
    });
}
