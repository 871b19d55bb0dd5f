#![cfg(loom)]
//! loom models of `tollgate::LeakyBucket` (the meter) and `tollgate::Shaper`
//! (the queue): the compare-and-swap loops that ship, through tollgate's sync
//! facade, with a `ManualClock` created inside each model and moved while the
//! requests race.
//!
//! The meter is checked like the token bucket (it makes GCRA's decisions): the
//! level bound on every pair of exact decision times, linearizability against
//! sequential GCRA (exact retry-afters included) and an exact single-threaded
//! tail. The shaper is checked on the start times it grants: spacing after the
//! burst, no start beyond the wait bound, linearizability against its sequential
//! schedule, and a final state that is exactly what the granted starts imply.

use std::cell::Cell;

use loom::sync::Arc;
use loom::thread;
use tollgate::{Denied, LeakyBucket, ManualClock, Rate, RateLimiter, Reserve, Shaper};
use tollgate_loom_tests::{
    Move::To, Op, RecordingClock, Spec, Subject, advancer, assert_linearizable, explore_races,
    join_all, nanos, on_manual_clock, race_a_moving_clock, record, requester, verify_gcra,
};

/// Nanoseconds per permit.
const INTERVAL: u64 = 10;

/// The meter as the shared model shapes run it, checked as GCRA.
const METER: Subject<LeakyBucket<RecordingClock>> = Subject {
    build: meter,
    verify: |bucket, clock, capacity, threads| {
        verify_gcra(bucket, clock, capacity, INTERVAL, threads)
    },
};

fn meter(capacity: u32) -> (Arc<LeakyBucket<RecordingClock>>, ManualClock) {
    on_manual_clock(|clock| LeakyBucket::with_clock(capacity, Rate::new(1, nanos(INTERVAL)), clock))
}

#[test]
fn meter_two_threads_pour_while_the_clock_moves() {
    let name = "leaky_bucket::meter_two_threads_pour_while_the_clock_moves";
    METER.explore(name, 3, 2, |bucket, clock| {
        let advancer = advancer(bucket, clock, &[1], INTERVAL, &[1]);
        let pourer = requester(bucket, &[2, 1, 0]);
        join_all(vec![advancer, pourer])
    });
}

#[test]
fn meter_clock_steps_back_while_pouring() {
    let name = "leaky_bucket::meter_clock_steps_back_while_pouring";
    METER.explore(name, 3, 1, |bucket, clock| {
        race_a_moving_clock(
            bucket,
            clock,
            &[&[1], &[1]],
            &[To(2 * INTERVAL), To(INTERVAL / 2)],
        )
    });
}

/// The shaper's sequential schedule, for the linearizability check: the state is
/// the schedule's end and the latest start granted; `n` permits at `now` take
/// the slot `[max(end, now), +n·interval)` and start `burst` intervals before it
/// (never before `now`, nor before the latest start), admitted iff that start
/// is at most `max_wait` after `now`.
#[derive(Debug, Clone, Copy)]
struct ShaperSpec {
    burst: u32,
    max_wait: u64,
    capacity: u32,
}

impl ShaperSpec {
    /// The shaper the spec describes, one start per [`INTERVAL`], on a manual
    /// clock at 0, and a handle to move that clock.
    fn shaper(&self) -> (Arc<Shaper<RecordingClock>>, ManualClock) {
        on_manual_clock(|clock| {
            Shaper::with_clock(
                Rate::new(1, nanos(INTERVAL)),
                self.burst,
                nanos(self.max_wait),
                clock,
            )
        })
    }

    fn start(&self, (end, last): (u64, u64), now: u64) -> u64 {
        end.max(now)
            .saturating_sub(u64::from(self.burst) * INTERVAL)
            .max(now)
            .max(last)
    }
}

impl Spec for ShaperSpec {
    type State = (u64, u64);

    fn initial(&self) -> (u64, u64) {
        (0, 0)
    }

    fn capacity(&self) -> u32 {
        self.capacity
    }

    fn decide(&self, state: (u64, u64), now: u64, n: u32) -> Result<(u64, u64), Denied> {
        let start = self.start(state, now);
        let wait = start - now;
        if wait <= self.max_wait {
            Ok((state.0.max(now) + u64::from(n) * INTERVAL, start))
        } else {
            Err(Denied::RetryAfter(nanos(wait - self.max_wait)))
        }
    }
}

/// A reservation as a model saw it: the op (with its exact decision time) and
/// the start it was granted.
fn reserve(shaper: &Shaper<RecordingClock>, n: u32) -> (Op, Option<u64>) {
    let start = Cell::new(None);
    let op = record(n, || {
        shaper.reserve(n).map(|r| {
            start.set(Some(r.ready_at().as_nanos() as u64));
        })
    });
    (op, start.get())
}

/// Spacing after the burst and the wait bound, on exact decision times.
fn assert_starts(spec: &ShaperSpec, granted: &[(Op, Option<u64>)]) {
    let mut starts: Vec<(u64, u32)> = Vec::new();
    for (op, start) in granted {
        if let (Ok(()), Some(at), Some(start)) = (op.result, op.at, *start) {
            assert!(
                at <= start && start - at <= spec.max_wait,
                "start {start} for a request decided at {at}: {granted:#?}"
            );
            starts.push((start, op.n));
        }
    }
    starts.sort();
    for i in 0..starts.len() {
        for j in i + 1..starts.len() {
            let between: u64 = starts[i..j].iter().map(|&(_, n)| u64::from(n)).sum();
            assert!(
                between * INTERVAL <= u64::from(spec.burst) * INTERVAL + starts[j].0 - starts[i].0,
                "shaper invariant violated: {between} permits started in [{}, {}) with burst {}: {granted:#?}",
                starts[i].0,
                starts[j].0,
                spec.burst
            );
        }
    }
}

#[test]
fn shaper_queues_racing_requests_while_the_clock_moves() {
    explore_races(
        "leaky_bucket::shaper_queues_racing_requests_while_the_clock_moves",
        3,
        || {
            // One start per 10 ns, no burst, queueing up to 20 ns: capacity 3.
            let spec = ShaperSpec {
                burst: 0,
                max_wait: 2 * INTERVAL,
                capacity: 3,
            };
            let (shaper, clock) = spec.shaper();

            let (s, c) = (shaper.clone(), clock.clone());
            let advancer = thread::spawn(move || {
                let first = reserve(&s, 1);
                c.advance(nanos(INTERVAL / 2));
                vec![first, reserve(&s, 1)]
            });
            let s = shaper.clone();
            let racer = thread::spawn(move || vec![reserve(&s, 2), reserve(&s, 1)]);

            let granted: Vec<_> = [advancer.join().unwrap(), racer.join().unwrap()].concat();
            assert_starts(&spec, &granted);
            let threads: Vec<Vec<Op>> = vec![
                granted[..2].iter().map(|g| g.0).collect(),
                granted[2..].iter().map(|g| g.0).collect(),
            ];
            assert_linearizable(&spec, &threads);
            // With no burst each granted request's slot is [start, start + n·I):
            // the schedule must end exactly at the last of them.
            let end = granted
                .iter()
                .filter_map(|(op, s)| s.map(|s| s + u64::from(op.n) * INTERVAL))
                .max()
                .unwrap_or(0);
            let (op, next) = reserve(&shaper, 1);
            let now = op.at.unwrap();
            let expected = end.max(now);
            match op.result {
                Ok(()) => assert_eq!(next, Some(expected), "{granted:#?}"),
                Err(_) => assert!(expected - now > spec.max_wait, "{granted:#?}"),
            }
        },
    );
}

#[test]
fn shaper_burst_and_try_acquire_race() {
    explore_races("leaky_bucket::shaper_burst_and_try_acquire_race", 3, || {
        // Two may start at once, none may wait: nginx `burst=1 nodelay`.
        let spec = ShaperSpec {
            burst: 1,
            max_wait: 0,
            capacity: 2,
        };
        let (shaper, clock) = spec.shaper();
        let (s, c) = (shaper.clone(), clock.clone());
        let a = thread::spawn(move || {
            let ops = vec![record(1, || s.try_acquire())];
            c.advance(nanos(INTERVAL));
            ops
        });
        let s = shaper.clone();
        let b = thread::spawn(move || {
            vec![record(1, || s.try_acquire()), record(1, || s.try_acquire())]
        });
        let threads = vec![a.join().unwrap(), b.join().unwrap()];
        let granted: Vec<(Op, Option<u64>)> =
            threads.iter().flatten().map(|op| (*op, op.at)).collect();
        assert_starts(&spec, &granted);
        assert_linearizable(&spec, &threads);
        let admitted = threads
            .iter()
            .flatten()
            .filter(|op| op.result.is_ok())
            .count();
        assert!((2..=3).contains(&admitted), "{threads:#?}");
    });
}

/// Issue 17, item 4: a request whose reading is older than a start granted
/// before it. One start per 10 ns, burst 2, queueing up to 10 ns (capacity
/// 4). A thread reads 90 and books 4 permits; meanwhile the clock moves to
/// 100 and a request there is booked to start at 100. The old schedule, which
/// remembered only its end, started the stale request at its own reading, 90:
/// 4 permits in [90, 100) against burst 2 + 1. Starts must keep the spacing
/// in start order, within the wait bound of each request's exact reading, and
/// be linearizable to the sequential schedule with its floor.
#[test]
fn shaper_stale_reading_books_behind_a_later_start() {
    explore_races(
        "leaky_bucket::shaper_stale_reading_books_behind_a_later_start",
        2,
        || {
            let spec = ShaperSpec {
                burst: 2,
                max_wait: INTERVAL,
                capacity: 4,
            };
            let (shaper, clock) = spec.shaper();
            assert_eq!(shaper.capacity(), spec.capacity);
            // Built at 0, so readings and starts share one origin.
            clock.set(90);
            let s = shaper.clone();
            let stale = thread::spawn(move || vec![reserve(&s, 4)]);
            let (s, c) = (shaper.clone(), clock.clone());
            let later = thread::spawn(move || {
                c.set(100);
                vec![reserve(&s, 1)]
            });
            let granted: Vec<_> = [stale.join().unwrap(), later.join().unwrap()].concat();
            assert_starts(&spec, &granted);
            let threads: Vec<Vec<Op>> = granted.iter().map(|g| vec![g.0]).collect();
            assert_linearizable(&spec, &threads);
        },
    );
}
