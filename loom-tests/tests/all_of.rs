#![cfg(loom)]
//! loom models of `AllOf` (all-or-nothing across direct limiters): the
//! refund a denied request makes to the members that admitted it races
//! admissions at a later clock reading, and must never hand out a permit a
//! later admission holds. A refund by the rule the keyed pair had before
//! issue 17 (take the admission's permits off whatever the word has become)
//! is the known-bad variant the same model catches.
//!
//! Only the first member reads a `RecordingClock`, so each request's
//! decision time is its reading on that member, whose bound is checked; the
//! second member (the one that denies) reads the same time through a plain
//! `ManualClock`.

use std::time::Duration;

use loom::sync::Arc;
use loom::sync::atomic::{AtomicU64, Ordering};
use loom::thread;
use tollgate::{
    AllOf, Clock, Denied, ManualClock, Rate, RateLimiter, Receipted, Refundable, Rejection,
    Snapshot, TokenBucket,
};
use tollgate_loom_tests::{
    Op, RecordingClock, assert_bucket_bound, explore, explore_races, record,
};

/// One request for a permit through `all`, reported or plain.
fn decide<A: Refundable, const REPORTED: bool>(
    all: &AllOf<(&A, &TokenBucket<ManualClock>)>,
) -> Result<(), Denied> {
    if REPORTED {
        all.try_acquire_n_reporting(1)
            .map(drop)
            .map_err(Denied::from)
    } else {
        all.try_acquire_n(1)
    }
}

/// Capacity 1, one permit per 100 ns: the member that admits the stale request.
const FIRST: (u32, u64) = (1, 100);
/// Capacity 2, one permit per 1000 ns: the member that denies it.
const SECOND: (u32, u64) = (2, 1_000);

fn rate(interval: u64) -> Rate {
    Rate::new(1, Duration::from_nanos(interval))
}

/// The interleaving of issue 17, through `AllOf`: a request reads 200 and
/// is admitted by the first member (TAT 300); the clock moves to 2000, where
/// a request finds the first member full, resets it (TAT 2100) and passes;
/// the stale request is then denied by the second member and refunds the
/// first. Two more requests at 2000 follow: at most one may pass the first
/// member. `first` is the first member, `second` the second, and both have
/// had one admission at 0 and one at 100 before the threads start.
///
/// `REPORTED` picks the decision: `try_acquire_n_reporting` (every member
/// reports) or the plain `try_acquire_n` (no member computes a snapshot).
fn stale_refund_model<A, const REPORTED: bool>(
    first: Arc<A>,
    second: Arc<TokenBucket<ManualClock>>,
    clock: ManualClock,
) where
    A: Refundable + Send + Sync + 'static,
{
    let mut setup: Vec<Op> = Vec::new();
    for at in [0, 100] {
        clock.set(at);
        let op = record(1, || {
            decide::<A, REPORTED>(&AllOf::new((&*first, &*second)))
        });
        assert!(op.result.is_ok(), "setup at {at}: {op:?}");
        setup.push(op);
    }
    clock.set(200);
    let stale = {
        let (first, second) = (Arc::clone(&first), Arc::clone(&second));
        thread::spawn(move || {
            let op = record(1, || {
                decide::<A, REPORTED>(&AllOf::new((&*first, &*second)))
            });
            vec![op]
        })
    };
    let later = {
        let (first, second) = (Arc::clone(&first), Arc::clone(&second));
        let clock = clock.clone();
        thread::spawn(move || {
            clock.set(2_000);
            let both = AllOf::new((&*first, &*second));
            let mut ops = vec![record(1, || decide::<A, REPORTED>(&both))];
            // A request on the first member alone: it must not find the
            // permit the request above holds.
            ops.push(record(1, || first.try_acquire_n(1)));
            ops
        })
    };
    let threads = vec![
        setup,
        stale.join().expect("no panic"),
        later.join().expect("no panic"),
    ];
    assert_bucket_bound(FIRST.0, FIRST.1, &threads);
}

type StaleMembers = (
    Arc<TokenBucket<RecordingClock>>,
    Arc<TokenBucket<ManualClock>>,
    ManualClock,
);

fn stale_members() -> StaleMembers {
    let clock = ManualClock::new();
    let first = TokenBucket::with_clock(FIRST.0, rate(FIRST.1), RecordingClock::new(clock.clone()))
        .expect("valid");
    let second = TokenBucket::with_clock(SECOND.0, rate(SECOND.1), clock.clone()).expect("valid");
    (Arc::new(first), Arc::new(second), clock)
}

/// Through the plain `try_acquire_n` (receipts, no reports).
#[test]
fn all_of_refund_at_a_stale_reading() {
    explore_races("all_of::refund_at_a_stale_reading", 2, || {
        let (first, second, clock) = stale_members();
        stale_refund_model::<_, false>(first, second, clock);
    });
}

/// Through `try_acquire_n_reporting` (every member reports).
#[test]
fn all_of_reported_refund_at_a_stale_reading() {
    explore_races("all_of::reported_refund_at_a_stale_reading", 2, || {
        let (first, second, clock) = stale_members();
        stale_refund_model::<_, true>(first, second, clock);
    });
}

/// With time frozen, a request through `AllOf` (denied by the second member)
/// races two direct requests on the first: the first member never admits
/// more than its capacity, whether the refund lands before, between or after
/// them, and a refund that found the word moved leaves the permit taken.
#[test]
fn all_of_refund_races_direct_admissions() {
    explore_races("all_of::refund_races_direct_admissions", 3, || {
        let clock = ManualClock::new();
        clock.set(1_000);
        let first = Arc::new(
            TokenBucket::with_clock(2, rate(FIRST.1 * 1_000), RecordingClock::new(clock.clone()))
                .expect("valid"),
        );
        let second = Arc::new(
            TokenBucket::with_clock(1, rate(SECOND.1 * 1_000), clock.clone()).expect("valid"),
        );
        // The second member is empty: every `AllOf` request is refunded.
        second.try_acquire().expect("a fresh bucket");
        let combined = {
            let (first, second) = (Arc::clone(&first), Arc::clone(&second));
            thread::spawn(move || {
                vec![record(1, || {
                    AllOf::new((&*first, &*second)).try_acquire_n(1)
                })]
            })
        };
        let direct = {
            let first = Arc::clone(&first);
            thread::spawn(move || {
                (0..3)
                    .map(|_| record(1, || first.try_acquire_n(1)))
                    .collect::<Vec<_>>()
            })
        };
        let threads = vec![
            combined.join().expect("no panic"),
            direct.join().expect("no panic"),
        ];
        assert!(threads[0][0].result.is_err(), "the second member is empty");
        assert_bucket_bound(2, FIRST.1 * 1_000, &threads);
        // Every refund that did not land left exactly its permit taken:
        // the direct requests got 1 or 2 permits, never 3.
        let direct_admitted = threads[1].iter().filter(|op| op.result.is_ok()).count();
        assert!((1..=2).contains(&direct_admitted), "{threads:?}");
    });
}

/// A token bucket whose refund takes the admission's permits off whatever
/// the TAT has become — `min(n·I, written − now)` at the admission's reading,
/// the keyed pair's rule before issue 17. Otherwise the real GCRA.
struct SubtractingRefundBucket {
    tat: AtomicU64,
    clock: RecordingClock,
}

/// What the known-bad refund needs: the admission's reading and the TAT it wrote.
struct Written {
    now: u64,
    tat: u64,
}

impl SubtractingRefundBucket {
    fn decide(&self, now: u64) -> Result<u64, Denied> {
        let mut tat = self.tat.load(Ordering::Relaxed);
        loop {
            let next = tat.max(now) + FIRST.1;
            let limit = now + u64::from(FIRST.0) * FIRST.1;
            if next > limit {
                return Err(Denied::RetryAfter(Duration::from_nanos(next - limit)));
            }
            match self
                .tat
                .compare_exchange(tat, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return Ok(next),
                Err(actual) => tat = actual,
            }
        }
    }

    fn report(&self) -> Snapshot {
        Snapshot::new(0, FIRST.0, Duration::ZERO)
    }
}

impl RateLimiter for SubtractingRefundBucket {
    fn try_acquire_n(&self, n: u32) -> Result<(), Denied> {
        assert_eq!(n, 1, "the model asks for one permit");
        self.decide(self.clock.now()).map(drop)
    }

    fn snapshot(&self) -> Snapshot {
        self.report()
    }

    fn try_acquire_n_with_snapshot(&self, n: u32) -> Result<Snapshot, Rejection> {
        self.try_acquire_n(n)
            .map(|()| self.report())
            .map_err(|denied| Rejection::new(denied, self.report()))
    }
}

impl Refundable for SubtractingRefundBucket {
    type Receipt<'a> = Written;

    fn try_acquire_n_refundable(&self, n: u32) -> Result<Receipted<Written>, Rejection> {
        assert_eq!(n, 1, "the model asks for one permit");
        let now = self.clock.now();
        match self.decide(now) {
            Ok(tat) => Ok(Receipted::new(self.report(), Written { now, tat })),
            Err(denied) => Err(Rejection::new(denied, self.report())),
        }
    }

    fn refund(&self, written: Written) {
        let give = FIRST.1.min(written.tat.saturating_sub(written.now));
        let mut tat = self.tat.load(Ordering::Relaxed);
        while let Err(actual) = self.tat.compare_exchange(
            tat,
            tat.saturating_sub(give),
            Ordering::Relaxed,
            Ordering::Relaxed,
        ) {
            tat = actual;
        }
    }
}

/// The model above must catch the old refund rule: this proves it can fail.
#[test]
#[should_panic(expected = "token bucket invariant violated")]
fn known_bad_subtracting_refund_is_caught() {
    explore("all_of::known_bad_subtracting_refund_is_caught", 2, || {
        let clock = ManualClock::new();
        let first = SubtractingRefundBucket {
            tat: AtomicU64::new(0),
            clock: RecordingClock::new(clock.clone()),
        };
        let second =
            TokenBucket::with_clock(SECOND.0, rate(SECOND.1), clock.clone()).expect("valid");
        stale_refund_model::<_, false>(Arc::new(first), Arc::new(second), clock);
    });
}
