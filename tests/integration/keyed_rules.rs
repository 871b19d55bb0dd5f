//! Several rules on one keyed sliding log (`LogConfig::with_rule`): decision
//! for decision against a reference model — a plain `Vec` of admission times
//! per key, each rule checked as "at most `N_i` in any window `[t, t + T_i)`"
//! — with rules changed at runtime and keys evicted; every rule's bound on
//! admissions recorded from several threads; and a known-bad log that checks
//! only the largest rule, which the same check catches.

use std::sync::Arc;
use std::time::Duration;

use crate::support;

use proptest::prelude::*;
use support::{
    Phase, PhasedAdmission, Rules, RulesModel, admitted_keeping_every_rule,
    assert_the_largest_rule_alone_is_caught, log_config, permits_in_phase, phased_rounds,
    rule_sets,
};
use tollgate::LogConfig;
use tollgate::keyed::{Carry, Keyed};
use tollgate::{Denied, ManualClock, SlidingLog, Snapshot};

type Log = SlidingLog<ManualClock>;

/// The documented carry-over at `t`: `Reset` forgets; otherwise the
/// times inside both the old and the new longest window, newest
/// `slots'` of them.
fn carry_over(model: &mut RulesModel, rules: Rules, carry: Carry, t: u64) {
    let longest = |r: &Rules| r.iter().map(|r| r.1).max().unwrap();
    let window = longest(&model.rules).min(longest(&rules));
    let slots = rules.iter().map(|r| r.0).max().unwrap() as usize;
    for log in model.logs.values_mut() {
        if carry == Carry::Reset {
            log.clear();
        } else {
            log.retain(|&s| s + window > t);
            let drop = log.len().saturating_sub(slots);
            log.drain(..drop);
        }
    }
    model.rules = rules;
}

#[derive(Debug, Clone)]
enum Op {
    Acquire { key: u32, n: u32 },
    Snapshot { key: u32 },
    Advance { ns: u64 },
    Reconfigure { rules: usize, carry: Carry },
}

const KEYS: u32 = 4;

fn ops(advance: BoxedStrategy<u64>, sets: usize) -> impl Strategy<Value = Vec<Op>> {
    let carry = prop_oneof![
        Just(Carry::Proportional),
        Just(Carry::Additive),
        Just(Carry::Reset)
    ];
    let op = prop_oneof![
        12 => (0..KEYS, 1u32..=6).prop_map(|(key, n)| Op::Acquire { key, n }),
        2 => (0..KEYS).prop_map(|key| Op::Snapshot { key }),
        4 => advance.prop_map(|ns| Op::Advance { ns }),
        1 => (0..sets, carry).prop_map(|(rules, carry)| Op::Reconfigure { rules, carry }),
    ];
    proptest::collection::vec(op, 1..400)
}

/// Runs `ops` on a `Keyed` that sweeps (evicts every fresh key) after every
/// operation, one that never sweeps, and the model, and checks all three
/// agree on every decision, retry-after and snapshot.
fn agrees_with_model(sets: &[Rules], ops: &[Op]) {
    let clock = ManualClock::new();
    let evicting = Keyed::<u32, Log>::with_clock(log_config(&sets[0]), clock.clone());
    let keeping = Keyed::<u32, Log>::with_clock(log_config(&sets[0]), clock.clone());
    let mut model = RulesModel::new(sets[0].clone());
    let mut now = 0u64;
    for (step, op) in ops.iter().enumerate() {
        match *op {
            Op::Acquire { key, n } => {
                let expected = model.acquire(key, n, now);
                assert_eq!(
                    evicting.try_acquire_n(&key, n),
                    expected,
                    "step {step}: {op:?}"
                );
                assert_eq!(
                    keeping.try_acquire_n(&key, n),
                    expected,
                    "step {step}: {op:?}"
                );
            }
            Op::Snapshot { key } => {
                let expected = model.snapshot(key, now);
                assert_eq!(evicting.snapshot(&key), expected, "step {step}: {op:?}");
                assert_eq!(keeping.snapshot(&key), expected, "step {step}: {op:?}");
            }
            Op::Advance { ns } => {
                clock.advance(Duration::from_nanos(ns));
                now += ns;
            }
            Op::Reconfigure { rules, carry } => {
                evicting.reconfigure(log_config(&sets[rules]), carry);
                keeping.reconfigure(log_config(&sets[rules]), carry);
                carry_over(&mut model, sets[rules].clone(), carry, now);
            }
        }
        evicting.sweep();
    }
}

const MS: u64 = 1_000_000;
const S: u64 = 1_000_000_000;
const DAY: u64 = 86_400 * S;

/// Sets with a day's rule, run over steps of 65,536 ns up to about 38 hours.
fn day_sets() -> Vec<Rules> {
    vec![
        vec![(5, S), (30, 60 * S), (100, DAY)],
        vec![(5, S), (60, 60 * S), (100, DAY)],
        vec![(30, 60 * S), (100, DAY)],
        vec![(2, S), (100, DAY)],
    ]
}

const UNIT: u64 = 1 << 16;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn multi_rule_log_agrees_with_the_model(
        ops in ops(prop_oneof![0..20 * MS, 0..2_500 * MS].boxed(), rule_sets().len()),
    ) {
        agrees_with_model(&rule_sets(), &ops);
    }

    #[test]
    fn multi_rule_log_with_a_day_rule_agrees_with_the_model(
        ops in ops(
            prop_oneof![0..1u64 << 15, 0..1u64 << 21, 0..1u64 << 31]
                .prop_map(|units| units * UNIT)
                .boxed(),
            day_sets().len(),
        ),
    ) {
        // 2^31 units is over 38 hours: runs cross the day.
        agrees_with_model(&day_sets(), &ops);
    }

    /// Arbitrary readings with a day's rule: stamps are exact to the
    /// nanosecond, so every decision and retry-after is the model's.
    #[test]
    fn every_rule_holds_at_any_reading(
        steps in proptest::collection::vec((1u32..=5, prop_oneof![0..2 * S, 0..70 * S]), 1..400),
    ) {
        let rules = day_sets()[0].clone();
        let clock = ManualClock::new();
        let keyed = Keyed::<u8, Log>::with_clock(log_config(&rules), clock.clone());
        let mut model = RulesModel::new(rules);
        let mut now = 0;
        for (n, advance) in steps {
            prop_assert_eq!(keyed.try_acquire_n(&0, n), model.acquire(0, n, now), "at {}", now);
            clock.advance(Duration::from_nanos(advance));
            now += advance;
            keyed.sweep();
        }
    }
}

/// Every admission of [`phased_rounds`] on a keyed log: each thread takes
/// permits on eight keys a round (`config` builds each phase's
/// configuration).
fn run_threads(phases: &[Phase], config: &dyn Fn(&Rules) -> LogConfig) -> Vec<PhasedAdmission> {
    let clock = ManualClock::new();
    let keyed = Arc::new(Keyed::<u32, Log>::with_clock(
        config(&phases[0].rules),
        clock.clone(),
    ));
    let k = keyed.clone();
    phased_rounds(
        &clock,
        phases,
        |rules| keyed.reconfigure(config(rules), Carry::Proportional),
        move |t, round| {
            let mut admitted = Vec::new();
            for key in 0..8 {
                let n = if (round as u32 + t as u32 + key) % 3 == 0 {
                    2
                } else {
                    1
                };
                if k.try_acquire_n(&key, n).is_ok() {
                    admitted.push((key, n));
                }
            }
            admitted
        },
    )
}

/// At 180 s the 10 s rule is removed and the minute's rule stays at 20.
const LAST_MINUTE: u32 = 20;

#[test]
fn every_rule_holds_on_admissions_from_threads() {
    let (phases, admitted) = admitted_keeping_every_rule(LAST_MINUTE, run_threads);
    // Not a limiter that denies everything: each phase's minute rule is the
    // binding one over a minute, and each key gets permits in every phase.
    for key in 0..8 {
        for phase in 0..phases.len() {
            let got = permits_in_phase(&admitted, key, phase);
            assert!(got >= 20, "key {key}, phase {phase}: only {got} admitted");
        }
    }
}

/// Known-bad: a log that checks only the largest rule (each phase's minute
/// rule alone). Four threads take at least five permits per key in the first
/// round, all admitted against 25 a minute; the 3-a-second rule's check
/// reports it.
#[test]
fn checking_only_the_largest_rule_is_caught() {
    assert_the_largest_rule_alone_is_caught(LAST_MINUTE, run_threads);
}

/// `n` above the smallest count can never be admitted, whatever the other
/// rules allow: `ExceedsCapacity` with that count, and no key is created.
#[test]
fn a_request_above_the_smallest_count_exceeds_capacity() {
    let keyed = Keyed::<u8, Log>::with_clock(
        log_config(&[(5, S), (30, 60 * S), (1_000, DAY)]),
        ManualClock::new(),
    );
    assert_eq!(
        keyed.try_acquire_n(&1, 6),
        Err(Denied::ExceedsCapacity {
            requested: 6,
            capacity: 5
        })
    );
    assert_eq!(keyed.len(), 0);
    assert_eq!(keyed.try_acquire_n(&1, 5), Ok(()));
}

/// The snapshot reports the binding rule: the one with the fewest permits
/// left, and its own count and time to full.
#[test]
fn the_snapshot_reports_the_binding_rule() {
    let clock = ManualClock::new();
    let keyed = Keyed::<u8, Log>::with_clock(log_config(&[(5, S), (8, 60 * S)]), clock.clone());
    assert_eq!(keyed.snapshot(&1), Snapshot::new(5, 5, Duration::ZERO));
    keyed.try_acquire_n(&1, 4).unwrap();
    // The second's rule has 1 left, the minute's 4.
    assert_eq!(
        keyed.snapshot(&1),
        Snapshot::new(1, 5, Duration::from_secs(1))
    );
    clock.advance(Duration::from_secs(1));
    keyed.try_acquire_n(&1, 3).unwrap();
    // The second's rule has 2 left, the minute's 1: the minute binds.
    assert_eq!(
        keyed.snapshot(&1),
        Snapshot::new(1, 8, Duration::from_secs(60))
    );
}
