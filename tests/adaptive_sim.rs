//! The adaptive limit algorithms against simulated services, in virtual
//! time (`support/sim.rs`): for each algorithm and scenario, where the limit
//! settles against the scenario's knee, how fast it comes back after the
//! capacity halves, and what latency the admitted requests see.
//! `docs/adaptive.md` tabulates the results and explains the misses.

#[path = "support/sim.rs"]
mod sim;

use std::time::Duration;

use sim::{Link, MS, Report, SECOND, Scenario};
use tollgate::{Aimd, Gradient2, LimitAlgorithm, Vegas, Windowed};

/// The unloaded latency of every scenario.
const BASE: u64 = 20 * MS;
/// The knee at full capacity: requests in flight at which latency starts
/// to grow (or refusals start).
const KNEE: f64 = 60.0;
/// Offered load: 1.5 × what the full service can answer (KNEE / BASE =
/// 3000 a second), 3 × the halved one.
const OFFERED: f64 = 4500.0;
const HALVED_AT: u64 = 300 * SECOND;
const RECOVERED_AT: u64 = 420 * SECOND;
const END: u64 = 600 * SECOND;

/// The six scenarios. Each but the constant link halves its capacity at
/// 300 s and recovers it at 420 s.
fn scenarios() -> Vec<Scenario> {
    let halving = |name, link, capacity: f64| Scenario {
        name,
        link,
        base_latency: BASE,
        offered: OFFERED,
        phases: vec![
            (0, capacity),
            (HALVED_AT, capacity / 2.0),
            (RECOVERED_AT, capacity),
        ],
        knees: vec![KNEE, KNEE / 2.0, KNEE],
        end: END,
        seed: 0x5eed_0000 + name.len() as u64,
    };
    vec![
        Scenario {
            name: "constant",
            link: Link::Queue,
            base_latency: BASE,
            offered: OFFERED,
            phases: vec![(0, KNEE)],
            knees: vec![KNEE],
            end: END,
            seed: 0x5eed,
        },
        halving("refusing", Link::Refusing, KNEE),
        halving("slows_at", Link::SlowsAt, KNEE),
        // The knee in flight is rate × base latency: 3000/s × 20 ms = 60.
        halving(
            "slows_with_rate",
            Link::SlowsWithRate,
            KNEE * SECOND as f64 / BASE as f64,
        ),
        halving("jittery", Link::Jittery, KNEE),
        halving("halving", Link::Queue, KNEE),
    ]
}

/// The p99 round trip an admitted request may see, in multiples of the base
/// latency: 2.5× on the steady links (at 1.25 × the knee a queue adds at
/// most a quarter; the rest is the limit's swing); 6× on the jittery one,
/// whose own unloaded p99 is about 5× (one request in fifty takes 2.5–7.5×).
fn p99_allowed(scenario: &str) -> f64 {
    if scenario == "jittery" { 6.0 } else { 2.5 }
}

/// What a configuration is held to in one scenario.
enum Expect {
    /// The target: after the settling time the limit is within ±25 % of the
    /// knee in at least 95 % of the 100 ms readings; after each capacity
    /// change it enters the new band within `back` seconds and stays for
    /// 10 s, and from the rebound time on it is in band 95 % of the time;
    /// the p99 round trip is within `p99_allowed`; excess load is shed.
    Meets { back: f64 },
    /// A documented miss: what the configuration does achieve instead
    /// (`docs/adaptive.md` gives the numbers and the reason).
    Misses(&'static str, fn(&Report) -> bool),
}

struct Config {
    label: &'static str,
    settle: u64,
    rebound: u64,
    build: fn() -> Box<dyn LimitAlgorithm>,
    expect: fn(&str) -> Expect,
}

fn check(config: &Config) {
    let mut failures = Vec::new();
    for scenario in scenarios() {
        let algorithm = (config.build)();
        let run = sim::run(&scenario, &*algorithm);
        let r = scenario.report(&run, config.settle, config.rebound);
        let halves = scenario.phases.len() >= 3;
        eprintln!(
            "| {} | {} | {:.1} % | {}–{} | {} | {:.1} % | {}–{} | {} | {:.1} % | {:.2}× | {:.0} % |",
            config.label,
            scenario.name,
            r.in_band * 100.0,
            r.range.0,
            r.range.1,
            r.back_after_halving
                .map_or("never".into(), |b| format!("{b:.1} s")),
            r.in_band_halved * 100.0,
            r.range_halved.0,
            r.range_halved.1,
            r.back_after_recovery
                .map_or("never".into(), |b| format!("{b:.1} s")),
            r.in_band_recovered * 100.0,
            r.p99_multiple,
            r.shed * 100.0,
        );
        let ok = match (config.expect)(scenario.name) {
            Expect::Meets { back } => {
                r.in_band >= 0.95
                    && r.p99_multiple <= p99_allowed(scenario.name)
                    // The excess turned away: by the gate, or refused by
                    // the service itself (the refusing link).
                    && r.shed + r.refused >= 0.2
                    && (!halves
                        || (r.back_after_halving.is_some_and(|b| b <= back)
                            && r.back_after_recovery.is_some_and(|b| b <= back)
                            && r.in_band_halved >= 0.95
                            && r.in_band_recovered >= 0.95))
            }
            Expect::Misses(why, achieved) => {
                if !achieved(&r) {
                    failures.push(format!("{} (documented: {why}): {r:?}", scenario.name));
                }
                true
            }
        };
        if !ok {
            failures.push(format!("{}: {r:?}", scenario.name));
        }
    }
    assert!(failures.is_empty(), "{}: {failures:#?}", config.label);
}

fn windowed(inner: impl LimitAlgorithm + 'static) -> Box<dyn LimitAlgorithm> {
    Box::new(Windowed::builder().build(inner).unwrap())
}

/// Whether the scenario's only signal is latency (no refusals).
fn latency_only(scenario: &str) -> bool {
    scenario != "refusing"
}

#[test]
fn aimd_per_sample_defaults() {
    check(&Config {
        label: "AIMD, per sample, defaults",
        settle: 30 * SECOND,
        rebound: 30 * SECOND,
        build: || Box::new(Aimd::builder().build().unwrap()),
        expect: |scenario| {
            if latency_only(scenario) {
                Expect::Misses("no drop, no round trip over 5 s: pinned at the max", |r| {
                    r.range == (200, 200)
                })
            } else {
                Expect::Misses(
                    "a burst of refusals multiplies the limit by 0.9 each: swings min to 2×",
                    |r| r.in_band < 0.6 && r.range.0 <= 25 && r.range.1 >= 100,
                )
            }
        },
    });
}

#[test]
fn aimd_windowed_defaults() {
    check(&Config {
        label: "AIMD, windowed 1 s, defaults",
        settle: 30 * SECOND,
        rebound: 30 * SECOND,
        build: || windowed(Aimd::builder().build().unwrap()),
        expect: |scenario| {
            if latency_only(scenario) {
                Expect::Misses("no drop, no round trip over 5 s: climbs to the max", |r| {
                    r.range.1 == 200 && r.in_band < 0.15
                })
            } else {
                Expect::Meets { back: 20.0 }
            }
        },
    });
}

#[test]
fn aimd_windowed_timeout() {
    check(&Config {
        label: "AIMD, windowed 1 s, timeout 23 ms",
        settle: 30 * SECOND,
        rebound: 30 * SECOND,
        build: || {
            windowed(
                Aimd::builder()
                    .timeout(Duration::from_millis(23))
                    .build()
                    .unwrap(),
            )
        },
        // 1.15 × the base latency. The margin is thin: 22 ms lets the
        // jittery link's unloaded tail trip it (78 % in band), 24 ms trips
        // only at 1.26 × the knee on `slows_with_rate` (80 %).
        expect: |_| Expect::Meets { back: 20.0 },
    });
}

#[test]
fn vegas_per_sample_defaults() {
    check(&Config {
        label: "Vegas, per sample, defaults",
        settle: 30 * SECOND,
        rebound: 30 * SECOND,
        build: || Box::new(Vegas::builder().build().unwrap()),
        expect: |scenario| {
            if latency_only(scenario) {
                Expect::Misses(
                    "probes every ~0.5 s take a queued round trip as no-load: swings 4× and more",
                    |r| r.in_band < 0.35 && r.range.1 >= 4 * r.range.0,
                )
            } else {
                Expect::Misses(
                    "every success with no queue adds β: sits at 1.6–2.6× the knee between refusals",
                    |r| r.in_band < 0.05 && r.range.0 >= 90,
                )
            }
        },
    });
}

#[test]
fn vegas_windowed_defaults() {
    check(&Config {
        label: "Vegas, windowed 1 s, defaults",
        settle: 30 * SECOND,
        rebound: 40 * SECOND,
        build: || windowed(Vegas::builder().build().unwrap()),
        expect: |_| Expect::Meets { back: 35.0 },
    });
}

#[test]
fn gradient2_per_sample_defaults() {
    check(&Config {
        label: "Gradient2, per sample, defaults",
        settle: 60 * SECOND,
        rebound: 30 * SECOND,
        build: || Box::new(Gradient2::builder().build().unwrap()),
        expect: |_| {
            Expect::Misses(
                "600 samples are 0.2 s here: the long round trip is the current one, the limit climbs",
                |r| r.in_band < 0.15 && r.range.1 >= 140,
            )
        },
    });
}

#[test]
fn gradient2_windowed_defaults() {
    check(&Config {
        label: "Gradient2, windowed 1 s, defaults",
        settle: 60 * SECOND,
        rebound: 30 * SECOND,
        build: || windowed(Gradient2::builder().build().unwrap()),
        expect: |scenario| {
            if latency_only(scenario) {
                Expect::Misses(
                    "tolerance 1.5 admits 1.5× the long round trip, which follows the load up",
                    |r| {
                        r.range.0 >= 67
                            && r.in_band < 0.05
                            && (r.in_band_halved.is_nan() || r.in_band_halved == 0.0)
                    },
                )
            } else {
                Expect::Misses(
                    "drops are ignored by default: holds near the full knee, 2× the halved one",
                    |r| r.in_band >= 0.95 && r.in_band_halved == 0.0 && r.range_halved.0 >= 55,
                )
            }
        },
    });
}

#[test]
fn gradient2_windowed_tuned() {
    check(&Config {
        label: "Gradient2, windowed 1 s, tolerance 1.0, queue 3, drop backoff 0.9",
        settle: 60 * SECOND,
        rebound: 40 * SECOND,
        build: || {
            windowed(
                Gradient2::builder()
                    .rtt_tolerance(1.0)
                    .queue_size(3)
                    .drop_backoff(0.9)
                    .build()
                    .unwrap(),
            )
        },
        // The queue of 3 (Netflix's 4 is 13 % of a halved knee of 30 and
        // held the halved limit at 1.23–1.33 ×); 2 comes back too slowly
        // after a recovery (25–42 s).
        expect: |_| Expect::Meets { back: 35.0 },
    });
}

#[test]
fn round_trip_defaults() {
    check(&Config {
        label: "RoundTrip, defaults",
        settle: 30 * SECOND,
        rebound: 30 * SECOND,
        build: || Box::new(tollgate::RoundTrip::default()),
        expect: |_| Expect::Meets { back: 20.0 },
    });
}

#[test]
#[ignore]
fn trace_round_trip() {
    let name = std::env::var("SCEN").unwrap_or("halving".into());
    for scenario in scenarios() {
        if scenario.name != name {
            continue;
        }
        let algorithm = tollgate::RoundTrip::default();
        let run = sim::run(&scenario, &algorithm);
        for (t, l) in run.limits.iter().step_by(5) {
            if *t % (2 * SECOND) == 0 && *t < 300 * SECOND {
                eprintln!("{:.1} {l}", *t as f64 / 1e9);
            }
        }
        eprintln!("baseline {}", algorithm.baseline_ns());
    }
}
