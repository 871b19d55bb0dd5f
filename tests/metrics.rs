//! The `metrics` feature: a `Counted` limiter's published permit counts and
//! a named adaptive limit's gauges and samples, read back from metrics-util's
//! debugging recorder after known traffic and checked exactly — every name,
//! every label, every value. Each test installs a recorder of its own for
//! its thread (`metrics::with_local_recorder`); the limiters register their
//! handles on that thread, so the tests run in parallel without sharing one.
//!
//! The debugging recorder's snapshot takes each value and leaves 0 behind:
//! a counter reads what was added (or set) since the last read, a gauge
//! what was set since.
#![cfg(feature = "metrics")]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use tollgate::{
    AdaptiveLimit, Aimd, AllOf, Counted, Gradient2, LimitAlgorithm, ManualClock, Published, Rate,
    RateLimiter, SlidingLog, TokenBucket, Vegas,
};

/// A metric's name and its labels, sorted, as `name{k=v,k=v}`.
fn series(name: &str, labels: &[(&str, &str)]) -> String {
    let mut labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    labels.sort();
    format!("{name}{{{}}}", labels.join(","))
}

/// Every metric the recorder holds: counters as integers, gauges as their
/// value (every gauge here holds an integer).
fn read(snapshotter: &Snapshotter) -> BTreeMap<String, u64> {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| {
            let key = key.key();
            let labels: Vec<(&str, &str)> = key.labels().map(|l| (l.key(), l.value())).collect();
            let value = match value {
                DebugValue::Counter(value) => value,
                DebugValue::Gauge(value) => {
                    let value = value.into_inner();
                    assert_eq!(value.fract(), 0.0, "{key:?}: {value}");
                    value as u64
                }
                other => panic!("{key:?}: {other:?}"),
            };
            (series(key.name(), &labels), value)
        })
        .collect()
}

fn permits(limiter: &str, outcome: &str) -> String {
    series(
        "tollgate_permits_total",
        &[("limiter", limiter), ("outcome", outcome)],
    )
}

fn expect(pairs: &[(String, u64)]) -> BTreeMap<String, u64> {
    pairs.iter().cloned().collect()
}

/// A counted limiter's permit counters: `[admitted, denied, refunded]`.
fn permit_series(limiter: &str, [admitted, denied, refunded]: [u64; 3]) -> Vec<(String, u64)> {
    vec![
        (permits(limiter, "admitted"), admitted),
        (permits(limiter, "denied"), denied),
        (permits(limiter, "refunded"), refunded),
    ]
}

/// Runs `test` with a debugging recorder of its own installed for this
/// thread, whose snapshotter it is given.
fn recorded(test: impl FnOnce(&Snapshotter)) {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || test(&snapshotter));
}

#[test]
fn counted_publishes_its_stripe_sums() {
    recorded(|snapshotter| {
        let clock = ManualClock::new();
        let global = Arc::new(Counted::new(
            "global",
            TokenBucket::with_clock(20, Rate::per_hour(20), clock.clone()).unwrap(),
        ));
        let logins = Counted::new(
            "logins",
            SlidingLog::with_clock(Rate::per_hour(2), clock.clone()).unwrap(),
        );

        // Two threads, four single permits each, on a bucket of 20: every
        // one admitted, counted on the threads' own stripes.
        std::thread::scope(|scope| {
            for _ in 0..2 {
                scope.spawn(|| {
                    for _ in 0..4 {
                        global.try_acquire().unwrap();
                    }
                });
            }
        });
        // Decisions alone record nothing: the facade sees only what is
        // published.
        assert!(read(snapshotter).is_empty());

        // Logins through both: two admitted, then the log denies and the
        // bucket is refunded; 3 permits at once never fit the log (denied).
        let login = AllOf::new((&*global, &logins));
        login.try_acquire().unwrap();
        login.try_acquire().unwrap();
        assert!(login.try_acquire().is_err());
        assert!(logins.try_acquire_n(3).is_err());
        // The bucket holds 20 - 8 - 2 = 10 (the refund came back): 1 more,
        // then a denial of 10.
        global.try_acquire_n(1).unwrap();
        assert!(global.try_acquire_n(10).is_err());

        let published = Published::new().with(&global);
        published.publish();
        logins.publish();
        assert_eq!(
            read(snapshotter),
            expect(
                &[
                    permit_series("global", [12, 10, 1]),
                    permit_series("logins", [2, 4, 0]),
                ]
                .concat()
            )
        );
        assert_eq!(global.counts().admitted, 12);

        // More traffic, published again: the counters are set to the sums
        // (the read above left them at 0; an exporter's stay where they
        // were and move to the sums). `logins` is not in the list.
        global.try_acquire_n(9).unwrap();
        assert!(global.try_acquire().is_err());
        published.publish();
        let read = read(snapshotter);
        assert_eq!(read[&permits("global", "admitted")], 21);
        assert_eq!(read[&permits("global", "denied")], 11);
        assert_eq!(read[&permits("global", "refunded")], 1);
        assert_eq!(read[&permits("logins", "denied")], 0);
    });
}

#[test]
fn a_published_list_forgets_dropped_limiters() {
    recorded(|snapshotter| {
        let kept = Arc::new(Counted::new(
            "kept",
            TokenBucket::new(5, Rate::per_hour(5)).unwrap(),
        ));
        let gone = Arc::new(Counted::new(
            "gone",
            TokenBucket::new(5, Rate::per_hour(5)).unwrap(),
        ));
        let backend = Arc::new(
            AdaptiveLimit::new(
                Aimd::builder()
                    .min_limit(1)
                    .initial_limit(7)
                    .build()
                    .unwrap(),
            )
            .unwrap()
            .named("backend"),
        );
        let mut published = Published::new();
        published.add(&kept).add(&gone).add(&backend);
        assert_eq!(published.len(), 3);
        kept.try_acquire_n(2).unwrap();
        gone.try_acquire_n(3).unwrap();
        drop(gone);
        assert_eq!(published.len(), 2);
        published.publish();
        assert_eq!(
            read(snapshotter),
            expect(
                &[
                    permit_series("kept", [2, 0, 0]),
                    // Registered at the publish: every series, from 0.
                    adaptive_series("backend", [0, 0, 0], [7, 0, 0]),
                ]
                .concat()
            )
        );
    });
}

fn adaptive(name: &str, metric: &str) -> String {
    series(metric, &[("limiter", name)])
}

fn samples(name: &str, outcome: &str) -> String {
    series(
        "tollgate_adaptive_samples_total",
        &[("limiter", name), ("outcome", outcome)],
    )
}

/// A named adaptive limit's series: its samples by outcome, `[success,
/// dropped, ignored]`, then `[limit, in flight, changes of the limit]`.
fn adaptive_series(
    name: &str,
    [success, dropped, ignored]: [u64; 3],
    [limit, in_flight, changes]: [u64; 3],
) -> Vec<(String, u64)> {
    vec![
        (samples(name, "success"), success),
        (samples(name, "dropped"), dropped),
        (samples(name, "ignored"), ignored),
        (adaptive(name, "tollgate_adaptive_limit"), limit),
        (adaptive(name, "tollgate_adaptive_in_flight"), in_flight),
        (
            adaptive(name, "tollgate_adaptive_limit_changes_total"),
            changes,
        ),
    ]
}

#[test]
fn a_named_adaptive_limit_reports_samples_limit_and_in_flight() {
    recorded(|snapshotter| {
        let clock = ManualClock::new();
        let aimd = Aimd::builder()
            .min_limit(1)
            .initial_limit(2)
            .build()
            .unwrap();
        let limit = AdaptiveLimit::with_clock(aimd, clock.clone())
            .unwrap()
            .named("checkout");

        // Acquiring records nothing.
        let first = limit.try_acquire().unwrap();
        let second = limit.try_acquire().unwrap();
        assert!(limit.try_acquire().is_none());
        assert!(read(snapshotter).is_empty());

        clock.advance(Duration::from_millis(20));
        first.success(); // + 1: 3
        second.dropped(); // × 0.9: 2
        limit.try_acquire().unwrap().ignore();
        drop(limit.try_acquire().unwrap()); // unended: ignored
        let _held = limit.try_acquire().unwrap();

        // The samples as they happened, the limit as it changed; the gauge
        // of what is in flight as of the first sample (registration sets
        // the gauges: 2 in flight then, itself included), the changes none.
        assert_eq!(
            read(snapshotter),
            expect(&adaptive_series("checkout", [1, 1, 2], [2, 2, 0]))
        );

        // Published: what is in flight now, and the two changes.
        limit.publish();
        assert_eq!(
            read(snapshotter),
            expect(&adaptive_series("checkout", [0, 0, 0], [2, 1, 2]))
        );
    });
}

#[test]
fn unnamed_limits_report_nothing() {
    recorded(|snapshotter| {
        let limit = Arc::new(AdaptiveLimit::new(Aimd::builder().build().unwrap()).unwrap());
        limit.try_acquire().unwrap().success();
        limit.try_acquire().unwrap().dropped();
        let published = Published::new().with(&limit);
        published.publish();
        limit.publish();
        assert_eq!(limit.name(), None);
        assert!(read(snapshotter).is_empty());
    });
}

/// Vegas and Gradient2 through many samples on a manual clock: the gauge
/// and the changes counter follow the algorithm exactly, and every sample
/// is counted under the outcome its permit reported — Gradient2 ignores
/// drops (its limit does not move on them), but they are counted as drops.
#[test]
fn gauges_follow_every_algorithm() {
    fn drive<A: LimitAlgorithm>(name: &'static str, algorithm: A) {
        recorded(|snapshotter| {
            let clock = ManualClock::new();
            let limit = AdaptiveLimit::with_clock(algorithm, clock.clone())
                .unwrap()
                .named(name);
            let (mut successes, mut drops) = (0, 0);
            for round in 0..200u64 {
                let permits: Vec<_> = std::iter::from_fn(|| limit.try_acquire()).collect();
                // Latency grows with the load; every seventh round drops one.
                clock.advance(Duration::from_micros(1_000 + 50 * permits.len() as u64));
                for (i, permit) in permits.into_iter().enumerate() {
                    if i == 0 && round % 7 == 0 {
                        permit.dropped();
                        drops += 1;
                    } else {
                        permit.success();
                        successes += 1;
                    }
                }
            }
            limit.publish();
            let changes = limit.history().unwrap().changes();
            assert!(changes > 0, "{name}: the limit never moved");
            assert_eq!(
                read(snapshotter),
                expect(&adaptive_series(
                    name,
                    [successes, drops, 0],
                    [u64::from(limit.limit()), 0, changes]
                )),
                "{name}"
            );
        });
    }
    drive("vegas", Vegas::builder().build().unwrap());
    drive("gradient2", Gradient2::builder().build().unwrap());
    drive("aimd", Aimd::builder().build().unwrap());
}
