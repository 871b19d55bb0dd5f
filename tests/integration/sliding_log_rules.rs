//! Several rules on one direct sliding log (`SlidingLog::with_rule`):
//! decision for decision against the reference model, the per-key log on one
//! key and the locking twin; across rule changes and while logging denied
//! attempts, against the twin, with every rule in force held on the
//! admissions; every rule held on admissions from threads; and a known-bad
//! log that checks only the largest rule, which the same check catches.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use support::{
    Phase, PhasedAdmission, Rules, RulesModel, admitted_keeping_every_rule,
    assert_the_largest_rule_alone_is_caught, log_config, permits_in_phase, phased_rounds,
    rule_sets, rule_violations,
};
use tollgate::keyed::Keyed;
use tollgate::{
    ConfigError, Denied, LockingSlidingLog, LogConfig, ManualClock, Rate, RateLimiter, SlidingLog,
};

type Log = SlidingLog<ManualClock>;
type Twin = LockingSlidingLog<ManualClock>;

const MS: u64 = 1_000_000;
const S: u64 = 1_000 * MS;

fn rate(&(n, w): &(u32, u64)) -> Rate {
    Rate::new(n, Duration::from_nanos(w))
}

/// The log of type `$log` of `$rules`, built rule by rule, asked for four
/// stripes (which several rules do not use).
macro_rules! log_of {
    ($log:ty, $rules:expr, $clock:expr) => {{
        let rules: &[(u32, u64)] = $rules;
        let first = <$log>::with_clock(rate(&rules[0]), $clock.clone()).unwrap();
        rules[1..]
            .iter()
            .fold(first, |log, rule| log.with_rule(rate(rule)).unwrap())
            .with_stripes(4)
    }};
}

/// The direct log of `rules`, as [`log_of`] builds it.
fn direct(rules: &[(u32, u64)], clock: &ManualClock) -> Log {
    log_of!(Log, rules, clock)
}

/// Its locking twin, built the same way.
fn twin(rules: &[(u32, u64)], clock: &ManualClock) -> Twin {
    log_of!(Twin, rules, clock)
}

#[derive(Debug, Clone)]
enum Op {
    Acquire { n: u32 },
    Snapshot,
    Advance { ns: u64 },
    Reconfigure { rules: usize },
}

fn ops(reconfigure: u32) -> impl Strategy<Value = Vec<Op>> {
    let op = prop_oneof![
        12 => (1u32..=6).prop_map(|n| Op::Acquire { n }),
        2 => Just(Op::Snapshot),
        4 => prop_oneof![0..20 * MS, 0..2_500 * MS].prop_map(|ns| Op::Advance { ns }),
        reconfigure => (0..rule_sets().len()).prop_map(|rules| Op::Reconfigure { rules }),
    ];
    proptest::collection::vec(op, 1..400)
}

/// With fixed rules: the direct log, its twin, a per-key log's one key and
/// the model agree on every decision, retry-after and snapshot.
fn agrees_with_the_model(set: usize, ops: &[Op]) {
    let rules = &rule_sets()[set];
    let clock = ManualClock::new();
    let (log, twin) = (direct(rules, &clock), twin(rules, &clock));
    let keyed = Keyed::<u8, Log>::with_clock(log_config(rules), clock.clone());
    let mut model = RulesModel::new(rules.clone());
    let mut now = 0;
    for (step, op) in ops.iter().enumerate() {
        match *op {
            Op::Acquire { n } => {
                let expected = model.acquire(0, n, now);
                assert_eq!(log.try_acquire_n(n), expected, "step {step}: {op:?}");
                assert_eq!(twin.try_acquire_n(n), expected, "step {step}: {op:?}");
                assert_eq!(keyed.try_acquire_n(&0, n), expected, "step {step}: {op:?}");
            }
            Op::Snapshot => {
                let expected = model.snapshot(0, now);
                assert_eq!(log.snapshot(), expected, "step {step}");
                assert_eq!(twin.snapshot(), expected, "step {step}");
                assert_eq!(keyed.snapshot(&0), expected, "step {step}");
            }
            Op::Advance { ns } => {
                clock.advance(Duration::from_nanos(ns));
                now += ns;
            }
            Op::Reconfigure { .. } => unreachable!("fixed rules"),
        }
    }
}

/// Across rule changes, counting denied attempts or not: the direct log and
/// its twin agree on every decision, retry-after and snapshot, and every
/// admission keeps every rule in force when it was made, the permits before
/// the change included.
fn keeps_every_rule_across_changes(counting: bool, ops: &[Op]) {
    let sets = rule_sets();
    let clock = ManualClock::new();
    let log = direct(&sets[0], &clock).count_denied(counting);
    let twin = twin(&sets[0], &clock).count_denied(counting);
    let mut phases = vec![Phase {
        from: 0,
        rules: sets[0].clone(),
    }];
    let mut admitted = Vec::new();
    let mut now = 0;
    for (step, op) in ops.iter().enumerate() {
        match *op {
            Op::Acquire { n } => {
                let got = log.try_acquire_n(n);
                assert_eq!(twin.try_acquire_n(n), got, "step {step}: {op:?}");
                if got.is_ok() {
                    admitted.push((0, now, n, phases.len() - 1));
                }
                if let Err(Denied::ExceedsCapacity { capacity, .. }) = got {
                    assert_eq!(capacity, log.limit());
                }
            }
            Op::Snapshot => assert_eq!(log.snapshot(), twin.snapshot(), "step {step}"),
            Op::Advance { ns } => {
                clock.advance(Duration::from_nanos(ns));
                now += ns;
            }
            Op::Reconfigure { rules } => {
                log.reconfigure_rules(&log_config(&sets[rules]));
                twin.reconfigure_rules(&log_config(&sets[rules]));
                assert_eq!(log.rules(), log_config(&sets[rules]));
                phases.push(Phase {
                    from: step as u32,
                    rules: sets[rules].clone(),
                });
            }
        }
    }
    assert_eq!(rule_violations(&phases, &admitted), Vec::<String>::new());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn a_direct_log_with_rules_agrees_with_the_model(set in 0..rule_sets().len(), ops in ops(0)) {
        agrees_with_the_model(set, &ops);
    }

    #[test]
    fn a_direct_log_keeps_every_rule_across_changes(ops in ops(1)) {
        keeps_every_rule_across_changes(false, &ops);
    }

    #[test]
    fn a_counting_direct_log_keeps_every_rule_across_changes(ops in ops(1)) {
        keeps_every_rule_across_changes(true, &ops);
    }
}

/// Every admission of [`phased_rounds`] on one direct log, all on key 0:
/// each thread takes one or two permits a few times a round (`config` builds
/// each phase's rules).
fn run_threads(phases: &[Phase], config: &dyn Fn(&Rules) -> LogConfig) -> Vec<PhasedAdmission> {
    let clock = ManualClock::new();
    let log = Arc::new(SlidingLog::with_clock(Rate::per_second(1), clock.clone()).unwrap());
    log.reconfigure_rules(&config(&phases[0].rules));
    let l = log.clone();
    phased_rounds(
        &clock,
        phases,
        |rules| log.reconfigure_rules(&config(rules)),
        move |t, round| {
            let mut admitted = Vec::new();
            for attempt in 0..3 {
                let n = if (round + t + attempt) % 3 == 0 { 2 } else { 1 };
                if l.try_acquire_n(n as u32).is_ok() {
                    admitted.push((0, n as u32));
                }
            }
            admitted
        },
    )
}

/// At 180 s the 10 s rule is removed, and the minute's rule allows more.
const LAST_MINUTE: u32 = 30;

#[test]
fn every_rule_holds_on_admissions_from_threads() {
    let (phases, admitted) = admitted_keeping_every_rule(LAST_MINUTE, run_threads);
    // Not a log that denies everything: every phase admits at least its
    // minute rule's count a minute (the log's admissions are all on key 0).
    for (phase, p) in phases.iter().enumerate() {
        let got = permits_in_phase(&admitted, 0, phase);
        let minute = p.rules.iter().find(|r| r.1 == 60 * S).unwrap().0;
        assert!(got >= minute, "phase {phase}: only {got} admitted");
    }
}

/// Known-bad: a log that checks only the largest rule (each phase's minute
/// rule alone). Four threads take up to twelve permits in the first round,
/// all admitted against 25 a minute; the 3-a-second rule's check reports it.
#[test]
fn checking_only_the_largest_rule_is_caught() {
    assert_the_largest_rule_alone_is_caught(LAST_MINUTE, run_threads);
}

/// What the log says of itself with several rules, and requests that can
/// never succeed: `n` above the smallest count is `ExceedsCapacity` with that
/// count, whatever the other rules allow; `n = 0` is `ZeroPermits`.
#[test]
fn a_log_with_rules_describes_itself_and_refuses_what_can_never_fit() {
    let clock = ManualClock::new();
    let log = direct(&[(5, S), (30, 60 * S), (1_000, 86_400 * S)], &clock);
    assert_eq!(
        (log.limit(), log.window()),
        (5, Duration::from_secs(86_400))
    );
    // One ring of the largest count, whatever the stripes asked for.
    assert_eq!(log.stripes(), 1);
    let one_rule = SlidingLog::with_clock(Rate::per_second(5), clock.clone())
        .unwrap()
        .with_stripes(1);
    assert_eq!(log.memory() - one_rule.memory(), 8 * (1_000 - 5));
    assert_eq!(
        log.try_acquire_n(6),
        Err(Denied::ExceedsCapacity {
            requested: 6,
            capacity: 5
        })
    );
    assert_eq!(log.try_acquire_n(0), Err(Denied::ZeroPermits));
    assert_eq!(log.try_acquire_n(5), Ok(()));
    // A rule of the same window replaces it; a bad rate is an error and
    // leaves the rules as they were.
    let log = log.with_rule(Rate::per_second(7)).unwrap();
    assert_eq!(log.limit(), 7);
    assert_eq!(log.rules().rules().count(), 3);
    assert!(matches!(
        log.with_rule(Rate::per_second(0)),
        Err(ConfigError::ZeroRate)
    ));
}

/// Counting denied attempts with several rules: a caller that keeps asking
/// faster than the rules allow stays blocked (where a log that does not count
/// its attempts lets some through), and the retry-after of its last attempt,
/// which counts that attempt, is exactly when it gets in.
#[test]
fn a_counting_log_with_rules_keeps_a_hammering_caller_out() {
    let hammer = |counting: bool| {
        let clock = ManualClock::new();
        let log = direct(&[(2, S), (5, 60 * S)], &clock).count_denied(counting);
        assert_eq!(log.try_acquire_n(2), Ok(()));
        let mut last = Ok(());
        let mut admitted = 0;
        for _ in 0..10 {
            clock.advance(Duration::from_millis(300));
            last = log.try_acquire();
            admitted += u32::from(last.is_ok());
        }
        (admitted, last, log, clock)
    };
    assert!(hammer(false).0 > 0);
    let (admitted, last, log, clock) = hammer(true);
    assert_eq!(admitted, 0);
    let wait = last.unwrap_err().retry_after().unwrap();
    clock.advance(wait - Duration::from_nanos(1));
    assert!(log.try_acquire().is_err());
    let wait = log.snapshot().until_full;
    clock.advance(wait);
    assert_eq!(log.try_acquire(), Ok(()));
}
