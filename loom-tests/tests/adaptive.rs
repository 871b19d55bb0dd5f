#![cfg(loom)]
//! loom models of the adaptive limit algorithms (`tollgate::Aimd`, `Vegas`,
//! `Gradient2`, `Windowed`): their compare-and-swap loops and the limit
//! history, the code that ships, through tollgate's sync facade.
//!
//! Two threads feed samples to one algorithm. After joining, a model checks
//! that every limit returned and the final limit are within `[min, max]`,
//! that the final state (the limit with the round trip the word keeps beside
//! it) is the state of some serial order of the samples that keeps each
//! thread's order — a lost or half-applied update would leave a state no
//! serial order gives — and that the history recorded one change per
//! changed limit, each in bounds. `Windowed` is checked on its aggregation:
//! every window that reaches the inner algorithm averages consistently, and
//! no sample, drop or peak in flight is lost to a racing close.
//! `docs/verification.md` lists what each model explores.

use std::collections::HashSet;
use std::sync::Mutex;

use loom::sync::Arc;
use loom::thread::{self, JoinHandle};
use tollgate::Outcome::{Dropped, Success};
use tollgate::fault::{Fault, inject};
use tollgate::{
    AdaptiveLimit, Aimd, Gradient2, LimitAlgorithm, ManualClock, Outcome, RoundTrip, Sample, Vegas,
    Windowed,
};
use tollgate_loom_tests::{explore, explore_races};

/// Every merge of `a` and `b` that keeps each one's order.
fn merges(a: &[Sample], b: &[Sample]) -> Vec<Vec<Sample>> {
    if a.is_empty() || b.is_empty() {
        return vec![a.iter().chain(b).copied().collect()];
    }
    let mut out = Vec::new();
    for mut rest in merges(&a[1..], b) {
        rest.insert(0, a[0]);
        out.push(rest);
    }
    for mut rest in merges(a, &b[1..]) {
        rest.insert(0, b[0]);
        out.push(rest);
    }
    out
}

/// [`explore_races`] at a preemption bound of 3 of [`race`]: the samples of
/// `threads` fed on two threads to the algorithm `build` makes.
fn explore_race<A, S>(
    name: &str,
    build: impl Fn() -> A + Sync + Send + 'static,
    bounds: (u32, u32),
    [a, b]: [&[Sample]; 2],
    observe: impl Fn(&A) -> S + Sync + Send + 'static,
) where
    A: LimitAlgorithm + 'static,
    S: Eq + std::hash::Hash + std::fmt::Debug,
{
    let (a, b) = (a.to_vec(), b.to_vec());
    explore_races(name, 3, move || race(&build, bounds, &a, &b, &observe));
}

/// Runs `a` and `b` on two threads against the algorithm `build` makes and
/// checks the outcome against every serial order; `observe` reads the state
/// the model compares (the limit, and what the word keeps beside it).
fn race<A, S>(
    build: impl Fn() -> A,
    bounds: (u32, u32),
    a: &[Sample],
    b: &[Sample],
    observe: impl Fn(&A) -> S,
) where
    A: LimitAlgorithm + 'static,
    S: Eq + std::hash::Hash + std::fmt::Debug,
{
    let algorithm = Arc::new(build());
    let feed = |samples: &[Sample]| {
        let (algorithm, samples) = (algorithm.clone(), samples.to_vec());
        thread::spawn(move || {
            samples
                .iter()
                .enumerate()
                .filter_map(|(i, &s)| algorithm.on_sample(s, i as u64))
                .collect::<Vec<u32>>()
        })
    };
    let returned = join_both(feed(a), feed(b));
    let (min, max) = bounds;
    for &limit in returned.iter().chain([algorithm.limit()].iter()) {
        assert!(
            (min..=max).contains(&limit),
            "limit {limit} outside [{min}, {max}]"
        );
    }
    let serial: HashSet<S> = merges(a, b)
        .into_iter()
        .map(|order| {
            let fresh = build();
            for (i, &s) in order.iter().enumerate() {
                fresh.on_sample(s, i as u64);
            }
            observe(&fresh)
        })
        .collect();
    let state = observe(&algorithm);
    assert!(
        serial.contains(&state),
        "final state {state:?} is no serial order's; serial orders give {serial:?}"
    );
    history_matches(&*algorithm, &returned);
}

/// The new limits `first` and then `second` reported, once both are joined.
fn join_both(first: JoinHandle<Vec<u32>>, second: JoinHandle<Vec<u32>>) -> Vec<u32> {
    let mut returned = first.join().unwrap();
    returned.extend(second.join().unwrap());
    returned
}

/// The history holds exactly the changes `returned` reported.
fn history_matches(algorithm: &impl LimitAlgorithm, returned: &[u32]) {
    let history = algorithm.history().expect("tollgate's algorithms keep one");
    assert_eq!(history.changes(), returned.len() as u64);
    let recent = history.recent();
    assert_eq!(recent.len(), returned.len());
    let mut recorded: Vec<u32> = recent.iter().map(|c| c.limit).collect();
    let mut expected = returned.to_vec();
    recorded.sort_unstable();
    expected.sort_unstable();
    assert_eq!(recorded, expected, "the history holds the changes returned");
}

const MS: u64 = 1_000_000;

/// A sample of `rtt_ns` with `in_flight` in flight and its `outcome`.
const fn sample(rtt_ns: u64, in_flight: u32, outcome: Outcome) -> Sample {
    Sample {
        rtt_ns,
        in_flight,
        outcome,
    }
}

#[test]
fn aimd_increase_races_backoff() {
    explore_race(
        "adaptive::aimd_increase_races_backoff",
        || {
            Aimd::builder()
                .min_limit(2)
                .initial_limit(4)
                .max_limit(6)
                .backoff_ratio(0.5)
                .build()
                .unwrap()
        },
        (2, 6),
        // From 4: + 1, + 1 against × 0.5. Serial orders end at 3 or 4; a
        // lost update ends elsewhere.
        [
            &[sample(MS, 8, Success), sample(MS, 8, Success)],
            &[sample(MS, 8, Dropped)],
        ],
        |a| a.limit(),
    );
}

#[test]
fn vegas_min_rtt_races_an_update() {
    explore_race(
        "adaptive::vegas_min_rtt_races_an_update",
        || {
            let vegas = Vegas::builder()
                .min_limit(15)
                .max_limit(30)
                .build()
                .unwrap();
            // A no-load round trip of 10 ms to start from.
            vegas.on_sample(Sample::success(10 * MS, 1), 0);
            vegas
        },
        (15, 30),
        // Thread A lowers the no-load round trip and then reports a queue;
        // thread B reports no queue (+ β) and a drop (− log10).
        [
            &[sample(5 * MS, 20, Success), sample(20 * MS, 20, Success)],
            &[sample(10 * MS, 20, Success), sample(10 * MS, 20, Dropped)],
        ],
        |v| (v.limit(), v.rtt_noload_ns()),
    );
}

#[test]
fn gradient2_samples_race() {
    explore_race(
        "adaptive::gradient2_samples_race",
        || {
            Gradient2::builder()
                .min_limit(10)
                .initial_limit(20)
                .max_limit(24)
                .smoothing(1.0)
                .drop_backoff(0.5)
                .build()
                .unwrap()
        },
        (10, 24),
        // A fast and a slow sample against two steady ones: the estimate and
        // the long round trip share the word and must come from one serial
        // order.
        [
            &[sample(10 * MS, 20, Success), sample(40 * MS, 20, Success)],
            &[sample(20 * MS, 20, Success), sample(20 * MS, 20, Dropped)],
        ],
        |g| (g.limit(), g.long_rtt_ns()),
    );
}

/// Records the samples that reach it (a `std` mutex: loom runs one thread at
/// a time, and the model orders nothing through it).
#[derive(Default)]
struct Recorder(Mutex<Vec<Sample>>);

impl LimitAlgorithm for Recorder {
    fn on_sample(&self, sample: Sample, _now_ns: u64) -> Option<u32> {
        self.0.lock().unwrap().push(sample);
        None
    }

    fn limit(&self) -> u32 {
        1
    }
}

#[test]
fn windowed_samples_race_a_close() {
    explore_races("adaptive::windowed_samples_race_a_close", 3, || {
        const RTT: u64 = 7 * MS;
        let windowed = Arc::new(
            Windowed::builder()
                .window(std::time::Duration::from_micros(1))
                .min_samples(1)
                .build(Recorder::default())
                .unwrap(),
        );
        // The first sample at 1 ns closes the empty window and starts one
        // ending at 1 001 ns; the samples at 5 000 ns close that one.
        let feed = |samples: [(u32, Outcome, u64); 2]| {
            let w = windowed.clone();
            thread::spawn(move || {
                for (in_flight, outcome, now) in samples {
                    w.on_sample(sample(RTT, in_flight, outcome), now);
                }
            })
        };
        let a = feed([(1, Outcome::Success, 1), (4, Outcome::Success, 5_000)]);
        let b = feed([(2, Outcome::Dropped, 1), (3, Outcome::Success, 5_000)]);
        a.join().unwrap();
        b.join().unwrap();
        // Close whatever is left open.
        windowed.on_sample(Sample::success(RTT, 1), 1 << 40);
        let open = windowed.open_window();
        assert_eq!(open.samples, 0, "the last close took every sample");
        let forwarded = windowed.inner().0.lock().unwrap().clone();
        // Every success has the one round trip, so a window's mean is it —
        // or 0 for a window that held only the drop (a drop is flagged, not
        // averaged). Sum and count from different windows would give
        // another value.
        for s in &forwarded {
            assert!(
                s.rtt_ns == RTT || (s.rtt_ns == 0 && s.outcome == Outcome::Dropped),
                "sum and count from different windows: {forwarded:?}"
            );
        }
        assert!(
            forwarded.iter().any(|s| s.outcome == Outcome::Dropped),
            "the drop was lost: {forwarded:?}"
        );
        assert_eq!(
            forwarded.iter().map(|s| s.in_flight).max(),
            Some(4),
            "the peak in flight was lost: {forwarded:?}"
        );
        // At most one close per claimed close time: the initial one, the
        // one at 5 000 ns, the final one; each window is non-empty.
        assert!(
            (1..=3).contains(&forwarded.len()),
            "{} windows closed: {forwarded:?}",
            forwarded.len()
        );
    });
}

/// Two permits of an [`AdaptiveLimit`] end at once, each changing the
/// algorithm's limit (a success with the limit in use grows it, a drop
/// halves it), while a third thread asks for permits. The releases copy
/// their new limits to the gate in either order; the one that copies last
/// must leave the gate at the algorithm's limit. After joining: the gate's
/// limit is the algorithm's, within `[min, max]`, nothing is in flight, and
/// every permit granted meanwhile was within the largest limit.
fn releases_race(expect_follow: bool) {
    let aimd = Aimd::builder()
        .min_limit(1)
        .initial_limit(2)
        .max_limit(4)
        .backoff_ratio(0.5)
        .build()
        .expect("a valid AIMD");
    // A std `Arc`: the owned permits hold one (its count is no part of the
    // algorithm; the gate's word and the algorithm's are loom's).
    let limit = std::sync::Arc::new(AdaptiveLimit::with_clock(aimd, ManualClock::new()).unwrap());
    let first = limit.try_acquire_owned().expect("two free permits");
    let second = limit.try_acquire_owned().expect("two free permits");
    let grow = thread::spawn(move || first.success());
    let back_off = thread::spawn(move || second.dropped());
    let asker = {
        let limit = limit.clone();
        thread::spawn(move || limit.try_acquire().map(|p| p.granted_in_flight()))
    };
    grow.join().unwrap();
    back_off.join().unwrap();
    if let Some(in_flight) = asker.join().unwrap() {
        assert!(
            in_flight <= 4,
            "{in_flight} in flight past the largest limit"
        );
    }
    assert_eq!(limit.in_flight(), 0, "a permit was stranded");
    let (gate, algorithm) = (limit.limit(), limit.algorithm().limit());
    assert!(
        (1..=4).contains(&algorithm),
        "limit {algorithm} outside [1, 4]"
    );
    if expect_follow {
        assert_eq!(gate, algorithm, "the gate did not follow the algorithm");
    } else if gate != algorithm {
        panic!("the gate did not follow the algorithm");
    }
}

#[test]
fn adaptive_limit_releases_race() {
    explore_races("adaptive::adaptive_limit_releases_race", 3, || {
        releases_race(true)
    });
}

#[test]
#[should_panic(expected = "the gate did not follow the algorithm")]
fn known_bad_unfollowed_is_caught() {
    inject(Fault::Unfollowed, true);
    explore("adaptive::known_bad_unfollowed_is_caught", 3, || {
        releases_race(false)
    });
}

/// Feeds `a` and `b`, each a sample and its time, to `rt` on two threads;
/// returns the new limits they reported, `a`'s first.
fn race_round_trip(rt: &Arc<RoundTrip>, a: (Sample, u64), b: (Sample, u64)) -> Vec<u32> {
    let feed = |(sample, now): (Sample, u64)| {
        let rt = rt.clone();
        thread::spawn(move || rt.on_sample(sample, now).into_iter().collect())
    };
    join_both(feed(a), feed(b))
}

/// A round trip limit from `min` (where it starts) to `max`.
fn round_trip(min: u32, max: u32) -> Arc<RoundTrip> {
    Arc::new(
        RoundTrip::builder()
            .initial_limit(min)
            .min_limit(min)
            .max_limit(max)
            .build()
            .unwrap(),
    )
}

/// Closes `rounds` rounds on `rt` from one thread, each with the whole
/// limit in flight and no queue; returns the last close's time and the
/// changes returned.
fn grow_round_trip(rt: &RoundTrip, rounds: u32) -> (u64, Vec<u32>) {
    let (mut now, mut changes) = (0, Vec::new());
    for _ in 0..rounds {
        now += 101 * MS;
        changes.extend(rt.on_sample(Sample::success(100 * MS, rt.limit()), now));
    }
    (now, changes)
}

/// Two successes, both admitted after the open round opened, race to close
/// it. The round word's one compare-and-swap lets exactly one close it and
/// open the next round at its own time; the other, admitted before that,
/// lands in the new round. So exactly one round closes (one decision: the
/// limit grows 1 → 2 once, whatever the order) and the new round holds the
/// other success alone. A close that lost an update (both closing, or the
/// second sample dropped) would grow twice or leave the new round empty.
#[test]
fn round_trip_successes_race_a_close() {
    explore_races("adaptive::round_trip_successes_race_a_close", 3, || {
        let rt = Arc::new(RoundTrip::default());
        // Admitted at 10 ms and 20 ms (the round opened at 0), answering at
        // 110 ms and 115 ms: each could close the first round.
        let a = (Sample::success(100 * MS, 1), 110 * MS);
        let b = (Sample::success(95 * MS, 1), 115 * MS);
        let returned = race_round_trip(&rt, a, b);
        assert_eq!(rt.limit(), 2, "one close, one growth: {returned:?}");
        assert_eq!(returned, [2]);
        let open = rt.open_round();
        assert_eq!(
            open.samples, 1,
            "the other success is in the next round: {open:?}"
        );
        assert!(open.mean_rtt_ns == 100 * MS || open.mean_rtt_ns == 95 * MS);
        history_matches(&*rt, &returned);
    });
}

/// [`explore_races`] at a preemption bound of 3: a round trip limit from
/// `min` to `max`, grown `rounds` rounds to `grown` on one thread; then the
/// two `samples` race on two threads, each that many milliseconds after the
/// last close, `check` judges the limit and what the race returned, and the
/// history must hold every change, the growth's included.
fn explore_grown_race(
    name: &str,
    (min, max, rounds, grown): (u32, u32, u32, u32),
    samples: [(Sample, u64); 2],
    check: fn(&RoundTrip, u64, &[u32]),
) {
    explore_races(name, 3, move || {
        let rt = round_trip(min, max);
        let (now, mut changes) = grow_round_trip(&rt, rounds);
        assert_eq!(rt.limit(), grown);
        let [a, b] = samples.map(|(sample, after)| (sample, now + after * MS));
        let returned = race_round_trip(&rt, a, b);
        check(&rt, now, &returned);
        changes.extend(&returned);
        history_matches(&*rt, &changes);
    });
}

/// Two drops of requests admitted before either answered race: one
/// congestion event, so one back-off. The control word's compare-and-swap
/// decides freshness (admitted after the last back-off?) on the word it
/// replaces, so whichever lands second finds the first's back-off time and
/// passes: 10 → 7, never 10 → 7 → 4. A freshness read outside the swap, or
/// a lost update, ends at 4 or leaves the back-off time behind.
#[test]
fn round_trip_drops_race_one_back_off() {
    explore_grown_race(
        "adaptive::round_trip_drops_race_one_back_off",
        // Grow to 15 in five rounds (one thread, before the race).
        (10, 100, 5, 15),
        // Both admitted at now + 10 ms, dropped at now + 50 and now + 60 ms.
        [
            (Sample::dropped(40 * MS, 15), 50),
            (Sample::dropped(50 * MS, 15), 60),
        ],
        |rt, now, returned| {
            assert_eq!(returned, [10], "one back-off: floor(15 · 0.7)");
            assert_eq!((rt.limit(), rt.ceiling()), (10, Some(15)));
            // The next drop admitted after the back-off is fresh: the
            // back-off time was written with the limit.
            rt.on_sample(Sample::dropped(MS, 10), now + 70 * MS);
            assert_eq!(rt.ceiling(), Some(10));
        },
    );
}

/// A success closing a round races a drop: the close (its filters, then
/// its decision on the control word) and the back-off interleave in any
/// order. Every order ends with the limit and its estimate within
/// `[min, max]`, the drop's back-off applied exactly once (the estimate is
/// what one back-off and at most one growth give), and the history holding
/// exactly the changes returned.
#[test]
fn round_trip_close_races_a_drop() {
    explore_grown_race(
        "adaptive::round_trip_close_races_a_drop",
        (6, 8, 2, 8),
        [
            (Sample::success(100 * MS, 8), 105),
            (Sample::dropped(2 * MS, 8), 10),
        ],
        |rt, _, returned| {
            // 8 → floor(8 · 0.7) = 5, held at the minimum 6; the close grows
            // at most to the max, 8, and never past the ceiling 8 - 1 = 7.
            let estimate = rt.estimate();
            assert!(
                (6..=7).contains(&estimate),
                "estimate {estimate}: {returned:?}"
            );
            assert!((6..=8).contains(&rt.limit()));
            assert_eq!(rt.ceiling(), Some(8));
        },
    );
}
