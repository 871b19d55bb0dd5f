//! The adaptive limit algorithms against simulated services, in virtual
//! time (`support/sim.rs`): for each algorithm and scenario, where the limit
//! settles against the scenario's knee, how fast it comes back after the
//! capacity halves, and what latency the admitted requests see.
//! `docs/adaptive.md` tabulates the results and explains the misses.

use crate::loops;
use crate::sim;

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

// ---------------------------------------------------------------------------
// Behaviours: short runs (a restart) and long ones, closed and open loop,
// each attempt timed alone with a 1 s timeout and retries outside the permit
// (`support/loops.rs`). Every behaviour is checked for the recommended
// configuration (`RoundTrip::default()`) on five seeds; the table in
// docs/adaptive.md ("Behaviours") shows every configuration on the first.

use loops::{Load, Report as LoopReport, Service, Setup};

/// One behaviour: a setup, when measuring starts, the limit to start from,
/// what is shown in the table and what is required.
struct Behaviour {
    name: &'static str,
    setup: Setup,
    from: u64,
    /// The figure the table shows.
    figure: fn(&LoopReport) -> String,
    /// `Err(why)` when the run misses the behaviour.
    check: fn(&Setup, &LoopReport) -> Result<(), String>,
}

const B: u64 = 100 * MS;

fn setup(service: Service, base: u64, load: Load, duration: u64) -> Setup {
    Setup {
        service,
        base,
        load,
        duration,
        seed: 1,
        timeout: loops::TIMEOUT,
    }
}

fn require(ok: bool, why: impl FnOnce() -> String) -> Result<(), String> {
    if ok { Ok(()) } else { Err(why()) }
}

/// The figure of an open-loop run.
fn backlog_figure(r: &LoopReport) -> String {
    format!(
        "backlog ≤ {}, ≤ {} in flight, limit {}",
        r.max_backlog, r.max_in_flight, r.final_limit
    )
}

fn never_inflated(r: &LoopReport) -> Result<(), String> {
    require(!r.inflated, || {
        "the limit went above twice what was ever in flight".into()
    })
}

fn mean_in_flight_within(
    r: &LoopReport,
    range: std::ops::RangeInclusive<f64>,
) -> Result<(), String> {
    require(range.contains(&r.mean_in_flight), || {
        format!("mean in flight {:.1}", r.mean_in_flight)
    })
}

/// Throughput at `n` in flight on a knee of 10 at ×1.1 per extra, per s.
fn knee_throughput(n: f64, base: u64) -> f64 {
    n / (base as f64 / SECOND as f64 * 1.1f64.powf((n - 10.0).max(0.0)))
}

fn behaviours() -> Vec<Behaviour> {
    let flat = |base: u64, duration: u64| setup(Service::Flat, base, Load::Closed(1000), duration);
    let mut out = vec![
        Behaviour {
            name: "flat 100 ms, cold start: ≥ 10 in flight within 5 s, still growing",
            setup: flat(B, 5 * SECOND),
            from: 0,
            figure: |r| {
                format!(
                    "10 at {}, limit {}→{}",
                    r.ten_in_flight_at
                        .map_or("never".into(), |t| format!("{:.1} s", t as f64 / 1e9)),
                    r.limit_at(5 * SECOND / 2),
                    r.final_limit,
                )
            },
            check: |s, r| {
                require(r.ten_in_flight_at.is_some_and(|t| t <= 5 * SECOND), || {
                    format!("10 in flight at {:?}", r.ten_in_flight_at)
                })?;
                // Growing, or already at the configuration's maximum (1000).
                let (half, end) = (r.limit_at(s.duration / 2), r.final_limit);
                require(end > half || end >= 1000, || {
                    format!(
                        "the limit stopped growing on a flat link: {half} at 2.5 s, {end} at 5 s"
                    )
                })?;
                require(r.mean_rtt <= 1.01 * s.base as f64, || {
                    format!("mean rtt {}", r.mean_rtt)
                })
            },
        },
        Behaviour {
            name: "flat 100 ms, 60 s: keeps growing (≥ 50 at the end)",
            setup: flat(B, 60 * SECOND),
            from: 0,
            figure: |r| format!("limit {} at 60 s", r.final_limit),
            check: |_, r| {
                require(r.final_limit >= 50, || {
                    format!("limit {} at the end", r.final_limit)
                })
            },
        },
    ];
    for (base, label) in [(MS, "1 ms"), (SECOND, "1 s")] {
        out.push(Behaviour {
            name: if base == MS {
                "flat 1 ms: rises from 1 to ≥ 10 within 40 round trips"
            } else {
                "flat 1 s: rises from 1 to ≥ 10 within 40 round trips"
            },
            // A client's timeout above the 1 s round trip.
            setup: Setup {
                timeout: 5 * SECOND,
                ..flat(base, 40 * base)
            },
            from: 0,
            figure: |r| format!("limit {} after 40 rtt", r.final_limit),
            check: |_, r| {
                require(r.final_limit >= 10, || {
                    format!("limit {} after 40 round trips", r.final_limit)
                })
            },
        });
        let _ = label;
    }
    for (jitter, duration) in [(0.1, 30 * SECOND), (0.5, 30 * SECOND), (0.5, 300 * SECOND)] {
        out.push(Behaviour {
            name: match (jitter > 0.2, duration > 60 * SECOND) {
                (false, _) => "jitter ×(1 + 0.1·Exp), 20 clients, 30 s: mean in flight ≥ 8, ≥ 70 % of 20's throughput",
                (true, false) => "jitter ×(1 + 0.5·Exp), 20 clients, 30 s: mean in flight ≥ 8, ≥ 70 % of 20's throughput",
                (true, true) => "jitter ×(1 + 0.5·Exp), 20 clients, 300 s: mean in flight ≥ 8, ≥ 70 % of 20's throughput",
            },
            setup: setup(Service::Jitter(jitter), B, Load::Closed(20), duration),
            from: 0,
            figure: |r| format!("{:.1} in flight, {:.0}/s", r.mean_in_flight, r.throughput),
            check: |s, r| {
                let Service::Jitter(j) = s.service else { unreachable!() };
                let twenty = 20.0 / (s.base as f64 * (1.0 + j) / SECOND as f64);
                require(r.mean_in_flight >= 8.0, || format!("mean in flight {:.1}", r.mean_in_flight))?;
                require(r.throughput >= 0.7 * twenty, || {
                    format!("{:.0}/s, 20 in flight get {twenty:.0}/s", r.throughput)
                })
            },
        });
    }
    for duration in [30 * SECOND, 300 * SECOND] {
        out.push(Behaviour {
            name: if duration == 30 * SECOND {
                "knee at 10 (×1.1 per extra), 40 clients, 30 s: mean in flight 6–14, ≥ 93 % of peak throughput"
            } else {
                "knee at 10 (×1.1 per extra), 40 clients, 300 s: mean in flight 6–14, ≥ 93 % of peak throughput"
            },
            setup: setup(Service::Knee { knee: 10, factor: 1.1 }, B, Load::Closed(40), duration),
            from: 5 * SECOND,
            figure: |r| {
                format!(
                    "{:.1} in flight, {:.0} % of peak",
                    r.mean_in_flight,
                    100.0 * r.throughput / knee_throughput(10.0, B)
                )
            },
            check: |s, r| {
                mean_in_flight_within(r, 6.0..=14.0)?;
                let peak = knee_throughput(10.0, s.base);
                require(r.throughput >= 0.93 * peak, || format!("{:.1}/s of {peak:.1}/s", r.throughput))
            },
        });
    }
    out.extend([
        Behaviour {
            name: "latency ∝ in flight (20 ms × n), 20 clients, 30 s: mean in flight ≤ 5",
            setup: setup(Service::Proportional, 20 * MS, Load::Closed(20), 30 * SECOND),
            from: 5 * SECOND,
            figure: |r| format!("{:.1} in flight", r.mean_in_flight),
            check: |_, r| require(r.mean_in_flight <= 5.0, || format!("mean in flight {:.1}", r.mean_in_flight)),
        },
        Behaviour {
            name: "retriable error above 5 in flight, 20 clients, 30 s: mean in flight 2–6, errors ≤ 20 %",
            setup: setup(Service::ErrorsAbove { n: 5, after: 10 * MS }, B, Load::Closed(20), 30 * SECOND),
            from: 0,
            figure: |r| format!("{:.1} in flight, {:.0} % errors", r.mean_in_flight, 100.0 * r.failed_share()),
            check: |_, r| {
                mean_in_flight_within(r, 2.0..=6.0)?;
                require(r.failed_share() <= 0.2, || format!("{} errors of {} attempts", r.errors, r.attempts))
            },
        },
    ]);
    for (name, duration) in [
        (
            "no answer above 4 in flight (1 s timeout), 20 clients, 30 s: max in flight ≤ 5, timeouts ≤ 20 %",
            30,
        ),
        (
            "no answer above 4 in flight (1 s timeout), 20 clients, 300 s: max in flight ≤ 5, timeouts ≤ 20 %",
            300,
        ),
    ] {
        out.push(Behaviour {
            name,
            setup: setup(
                Service::SilentAbove { n: 4 },
                B,
                Load::Closed(20),
                duration * SECOND,
            ),
            from: 0,
            figure: |r| {
                format!(
                    "max {}, {:.0} % timeouts",
                    r.max_in_flight,
                    100.0 * r.failed_share()
                )
            },
            check: |_, r| {
                require(r.max_in_flight <= 5, || {
                    format!("max in flight {}", r.max_in_flight)
                })?;
                require(r.failed_share() <= 0.2, || {
                    format!("{} timeouts of {} attempts", r.timeouts, r.attempts)
                })
            },
        });
    }
    out.extend([
        Behaviour {
            name: "attempt rate capped at 100/s (100 ms), 40 clients, 30 s: mean in flight 7–13, peak ≤ 125 attempts/s",
            setup: setup(
                Service::RateCap { per_second: 100.0, burst: 10.0, after: 5 * MS },
                B,
                Load::Closed(40),
                30 * SECOND,
            ),
            from: 5 * SECOND,
            figure: |r| format!("{:.1} in flight, peak {}/s", r.mean_in_flight, r.peak_attempt_rate),
            check: |_, r| {
                mean_in_flight_within(r, 7.0..=13.0)?;
                require(r.peak_attempt_rate <= 125, || format!("peak {} attempts/s", r.peak_attempt_rate))
            },
        },
        Behaviour {
            name: "open loop, steady 45/s at 100 ms (~4.5 in flight), from 1, 30 s: keeps up, backlog ≤ 9, ≤ 9 in flight, limit never inflated",
            setup: setup(Service::Flat, B, Load::Paced(45.0), 30 * SECOND),
            from: 5 * SECOND,
            figure: backlog_figure,
            check: |s, r| {
                let Load::Paced(rate) = s.load else { unreachable!() };
                require(r.max_backlog <= 9, || format!("backlog reached {}", r.max_backlog))?;
                require(r.max_in_flight <= 9, || format!("{} in flight", r.max_in_flight))?;
                require(r.final_backlog <= 1, || format!("backlog {} at the end", r.final_backlog))?;
                require(r.throughput >= 0.97 * rate, || format!("{:.1}/s of {rate}/s", r.throughput))?;
                never_inflated(r)
            },
        },
        Behaviour {
            name: "open loop, Poisson 45/s at 100 ms, from 1, 30 s: keeps up, limit never inflated",
            setup: setup(Service::Flat, B, Load::Open(45.0), 30 * SECOND),
            from: 5 * SECOND,
            figure: backlog_figure,
            check: |s, r| {
                let Load::Open(rate) = s.load else { unreachable!() };
                require(r.final_backlog <= 9, || format!("backlog {} at the end", r.final_backlog))?;
                require(r.throughput >= 0.95 * rate, || format!("{:.1}/s of {rate}/s", r.throughput))?;
                never_inflated(r)
            },
        },
    ]);
    out
}

/// The configurations the table compares: the recommended one first.
/// A configuration: its label in the table, and how it is built.
type Configuration = (&'static str, fn() -> Box<dyn LimitAlgorithm>);

fn configurations() -> Vec<Configuration> {
    vec![
        ("RoundTrip::default()", || {
            Box::new(tollgate::RoundTrip::default())
        }),
        ("Windowed AIMD, timeout 1.15 × base", || {
            windowed(
                Aimd::builder()
                    .min_limit(1)
                    .initial_limit(1)
                    .timeout(Duration::from_millis(115))
                    .build()
                    .unwrap(),
            )
        }),
        ("Windowed Vegas", || {
            windowed(Vegas::builder().initial_limit(1).build().unwrap())
        }),
        ("Windowed Gradient2, tuned", || {
            windowed(
                Gradient2::builder()
                    .min_limit(1)
                    .initial_limit(1)
                    .rtt_tolerance(1.0)
                    .queue_size(3)
                    .drop_backoff(0.9)
                    .build()
                    .unwrap(),
            )
        }),
        ("AIMD, per sample", || {
            Box::new(
                Aimd::builder()
                    .min_limit(1)
                    .initial_limit(1)
                    .build()
                    .unwrap(),
            )
        }),
        ("Vegas, per sample", || {
            Box::new(Vegas::builder().initial_limit(1).build().unwrap())
        }),
        ("Gradient2, per sample", || {
            Box::new(
                Gradient2::builder()
                    .min_limit(1)
                    .initial_limit(1)
                    .build()
                    .unwrap(),
            )
        }),
    ]
}

#[test]
fn round_trip_meets_every_behaviour_on_five_seeds() {
    let mut misses = Vec::new();
    for behaviour in behaviours() {
        for seed in 1..=5 {
            let mut setup = behaviour.setup;
            setup.seed = seed * 0x9e37_79b9;
            let algorithm = (configurations()[0].1)();
            let report = loops::run(&setup, &*algorithm, behaviour.from);
            if let Err(why) = (behaviour.check)(&setup, &report) {
                misses.push(format!("{} (seed {seed}): {why}", behaviour.name));
            }
        }
    }
    assert!(misses.is_empty(), "{misses:#?}");
}

/// The behaviours table of docs/adaptive.md, regenerated: every
/// configuration on the first seed. `TOLLGATE_BLESS=1` writes it into the
/// docs; otherwise the docs must already hold it.
#[test]
fn behaviours_table_is_current() {
    let configs = configurations();
    let mut table = String::from("| behaviour |");
    for (label, _) in &configs {
        table += &format!(" {label} |");
    }
    table += "\n|---|";
    table += &"---|".repeat(configs.len());
    table += "\n";
    let mut met = vec![0; configs.len()];
    let list = behaviours();
    for behaviour in &list {
        table += &format!("| {} |", behaviour.name);
        for (i, (_, build)) in configs.iter().enumerate() {
            let algorithm = build();
            let report = loops::run(&behaviour.setup, &*algorithm, behaviour.from);
            let ok = (behaviour.check)(&behaviour.setup, &report).is_ok();
            met[i] += usize::from(ok);
            table += &format!(
                " {} {} |",
                if ok { "✓" } else { "✗" },
                (behaviour.figure)(&report)
            );
        }
        table += "\n";
    }
    table += "| **met** |";
    for m in met {
        table += &format!(" **{m} of {}** |", list.len());
    }
    table += "\n";
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/adaptive.md");
    let doc = std::fs::read_to_string(path).unwrap();
    let (begin, end) = ("<!-- behaviours:begin -->\n", "<!-- behaviours:end -->");
    let start = doc
        .find(begin)
        .expect("docs/adaptive.md has the behaviours markers")
        + begin.len();
    let stop = doc
        .find(end)
        .expect("docs/adaptive.md has the behaviours markers");
    if std::env::var_os("TOLLGATE_BLESS").is_some() {
        let fresh = format!("{}{table}{}", &doc[..start], &doc[stop..]);
        std::fs::write(path, fresh).unwrap();
    } else {
        assert_eq!(
            doc[start..stop],
            table,
            "docs/adaptive.md's behaviours table is stale: rerun with TOLLGATE_BLESS=1"
        );
    }
}
