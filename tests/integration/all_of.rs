//! `AllOf`: all-or-nothing across limiters.
//!
//! * Single-threaded it is exactly the conjunction of its members: a
//!   proptest drives a token bucket, a fixed window, a key of a keyed bucket
//!   and (last) a sliding log through `AllOf` and through independent
//!   sequential references; every decision (reported and plain), report and
//!   retry-after agrees,
//!   and every refund is exact (the members' states agree afterwards).
//! * Under contention every member's own invariant holds over what `AllOf`
//!   admitted, and with time frozen no member ever shows more permits than
//!   its capacity less what passed (a refund may be lost, never doubled).
//! * Refunds that cannot be shown safe give nothing back: a keyed key
//!   reconfigured or overridden between admission and refund, or decided by
//!   the overflow state at the key cap; a receipt given to another limiter.

use crate::support;

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use proptest::prelude::*;
use support::{
    ReferenceFixedWindow, ReferenceTokenBucket, check_fixed_window, check_token_bucket, mixed,
    round_times, stress,
};
use tollgate::keyed::{BucketConfig, Carry, Keyed};
use tollgate::{
    AllOf, Denied, FixedWindow, ManualClock, Rate, RateLimiter, Refundable, SlidingLog, TokenBucket,
};

type Bucket = TokenBucket<ManualClock>;
type Window = FixedWindow<ManualClock>;
type Log = SlidingLog<ManualClock>;

/// A sliding log as its definition says: the stamps of the last `limit`
/// permits; admitted iff fewer than `limit − n + 1` of them are in the window.
#[derive(Debug, Clone)]
struct ReferenceLog {
    limit: u32,
    window: u64,
    log: VecDeque<u64>,
}

impl ReferenceLog {
    fn try_acquire_n(&mut self, now: u64, n: u32) -> Result<(), Denied> {
        if n > self.limit {
            return Err(Denied::ExceedsCapacity {
                requested: n,
                capacity: self.limit,
            });
        }
        let in_window = self.log.iter().filter(|&&s| s + self.window > now).count() as u32;
        if in_window + n <= self.limit {
            for _ in 0..n {
                self.log.push_back(now);
                if self.log.len() > self.limit as usize {
                    self.log.pop_front();
                }
            }
            Ok(())
        } else {
            let k = (self.limit - n + 1) as usize;
            let free_at = self.log[self.log.len() - k] + self.window;
            Err(Denied::RetryAfter(Duration::from_nanos(free_at - now)))
        }
    }

    fn available(&self, now: u64) -> u32 {
        self.limit - self.log.iter().filter(|&&s| s + self.window > now).count() as u32
    }
}

/// The four references, asked in `AllOf`'s order.
#[derive(Debug, Clone)]
struct Reference {
    bucket: ReferenceTokenBucket,
    window: ReferenceFixedWindow,
    window_limit: u32,
    keys: HashMap<u8, ReferenceTokenBucket>,
    key_config: (u32, u32, u64),
    log: ReferenceLog,
}

/// The members' capacities and limits in the sequential-reference proptests,
/// `(bucket, window, key, log)`: 1 to 5 each.
fn limits() -> impl Strategy<Value = (u32, u32, u32, u32)> {
    (1u32..6, 1u32..6, 1u32..6, 1u32..6)
}

/// The members the sequential-reference proptests drive, on one manual
/// clock (time in units of 10 ns; every limit refills in tens to hundreds of
/// ns), and the reference that models them.
fn members(
    (bucket_cap, window_limit, key_cap, log_limit): (u32, u32, u32, u32),
) -> (
    ManualClock,
    Bucket,
    Window,
    Keyed<u8, Bucket>,
    Log,
    Reference,
) {
    let clock = ManualClock::new();
    let bucket = Bucket::with_clock(
        bucket_cap,
        Rate::new(1, Duration::from_nanos(30)),
        clock.clone(),
    )
    .unwrap();
    let window = Window::with_clock(
        Rate::new(window_limit, Duration::from_nanos(100)),
        clock.clone(),
    )
    .unwrap();
    let keyed = Keyed::<u8, Bucket>::with_clock(
        BucketConfig::new(key_cap, Rate::new(1, Duration::from_nanos(50))).unwrap(),
        clock.clone(),
    );
    let log = Log::with_clock(
        Rate::new(log_limit, Duration::from_nanos(200)),
        clock.clone(),
    )
    .unwrap();
    let reference = Reference::new(bucket_cap, window_limit, key_cap, log_limit);
    (clock, bucket, window, keyed, log, reference)
}

impl Reference {
    /// The references of the limiters [`members`] builds.
    fn new(bucket_cap: u32, window_limit: u32, key_cap: u32, log_limit: u32) -> Self {
        Reference {
            bucket: ReferenceTokenBucket::new(bucket_cap, 1, 30),
            window: ReferenceFixedWindow::new(window_limit, 100),
            window_limit,
            keys: HashMap::new(),
            key_config: (key_cap, 1, 50),
            log: ReferenceLog {
                limit: log_limit,
                window: 200,
                log: VecDeque::new(),
            },
        }
    }
}

impl Reference {
    /// [`Reference::try_acquire_n`], or `ZeroPermits` (decided by the first
    /// member) for nothing asked.
    fn decide(&mut self, now: u64, key: u8, n: u32) -> Result<(), (usize, Denied)> {
        if n == 0 {
            Err((0, Denied::ZeroPermits))
        } else {
            self.try_acquire_n(now, key, n)
        }
    }

    /// Every member's state at `now` is the reference's: refunds were exact.
    fn assert_states(
        &mut self,
        now: u64,
        bucket: &dyn RateLimiter,
        window: &dyn RateLimiter,
        keyed: &Keyed<u8, Bucket>,
        log: &Log,
    ) -> Result<(), TestCaseError> {
        prop_assert_eq!(bucket.snapshot().available, self.bucket.snapshot(now).0);
        prop_assert_eq!(window.snapshot().available, self.window.snapshot(now).0);
        for (k, r) in self.keys.iter_mut() {
            prop_assert_eq!(keyed.snapshot(k).available, r.snapshot(now).0, "key {}", k);
        }
        prop_assert_eq!(log.snapshot().available, self.log.available(now));
        Ok(())
    }

    /// The conjunction, deciding on copies: applied only if every member admits.
    /// Returns the index of the member that decided a denial.
    fn try_acquire_n(&mut self, now: u64, key: u8, n: u32) -> Result<(), (usize, Denied)> {
        let mut next = self.clone();
        let (capacity, permits, period) = self.key_config;
        let keyed = next
            .keys
            .entry(key)
            .or_insert_with(|| ReferenceTokenBucket::new(capacity, permits, period));
        let answers = [
            next.bucket.try_acquire_n(now, n),
            next.window.try_acquire_n(now, n),
            keyed.try_acquire_n(now, n),
        ];
        for (member, answer) in answers.into_iter().enumerate() {
            if let Err(denied) = answer {
                // AllOf's rule: a wait yields to a later member that can
                // never hold `n`.
                let capacities = [(1, self.window_limit), (2, capacity), (3, self.log.limit)];
                if matches!(denied, Denied::RetryAfter(_)) {
                    for (later, cap) in capacities.into_iter().filter(|&(i, _)| i > member) {
                        if n > cap {
                            return Err((
                                later,
                                Denied::ExceedsCapacity {
                                    requested: n,
                                    capacity: cap,
                                },
                            ));
                        }
                    }
                }
                return Err((member, denied));
            }
        }
        next.log
            .try_acquire_n(now, n)
            .map_err(|denied| (3, denied))?;
        *self = next;
        Ok(())
    }
}

prop_compose! {
    fn op()(advance in 0u64..40, key in 0u8..3, n in 0u32..7, plain in any::<bool>())
        -> (u64, u8, u32, bool) {
        (advance, key, n, plain)
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// `RateLimiter::try_acquire_n_then` chains the same conjunction as a
    /// continuation per member (what an HTTP layer's policies do): admitted
    /// iff every member admits, and a member turned down by a later one is
    /// refunded exactly, single-threaded — through `&dyn RateLimiter`, a
    /// `Counted` wrapper and a key of a keyed limiter alike. The log, last,
    /// is asked plainly.
    #[test]
    fn chained_decisions_agree_with_a_sequential_reference(
        limits in limits(),
        ops in prop::collection::vec(op(), 1..80),
    ) {
        let (clock, bucket, window, keyed, log, mut reference) = members(limits);
        let window = tollgate::Counted::new("window", window);
        let mut now = 0;
        let mut refunds = 0;
        for (advance, key, n, _) in ops {
            now += advance * 10;
            clock.set(now);
            let want = reference.decide(now, key, n);
            let dyn_bucket: &dyn RateLimiter = &bucket;
            let mut window_turned_down = false;
            let passed = dyn_bucket.try_acquire_n_then(n, &mut |a| {
                a.is_ok() && window.try_acquire_n_then(n, &mut |b| {
                    let kept = b.is_ok() && keyed.try_acquire_n_then(&key, n, &mut |c| {
                        c.is_ok() && log.try_acquire_n(n).is_ok()
                    });
                    window_turned_down = b.is_ok() && !kept;
                    kept
                })
            });
            prop_assert_eq!(passed, want.is_ok(), "at {} for {} on key {}", now, n, key);
            refunds += u64::from(window_turned_down) * u64::from(n);
            prop_assert_eq!(window.counts().refunded, refunds);
            reference.assert_states(now, &bucket, &window, &keyed, &log)?;
        }
    }

    /// Single-threaded, `AllOf` is the conjunction of its members, decision
    /// for decision, and every refund is exact.
    #[test]
    fn agrees_with_a_sequential_reference(
        limits in limits(),
        ops in prop::collection::vec(op(), 1..80),
    ) {
        // Time in units of 10 ns; every limit refills in tens to hundreds of ns.
        let (clock, bucket, window, keyed, log, mut reference) = members(limits);
        let mut now = 0;
        for (advance, key, n, plain) in ops {
            now += advance * 10;
            clock.set(now);
            let all = AllOf::new((&bucket, &window, keyed.for_key(&key), &log));
            let want = reference.decide(now, key, n);
            if plain {
                // The plain path: the same decision, no reports.
                prop_assert_eq!(all.try_acquire_n(n), want.map_err(|(_, denied)| denied));
            } else { match (all.try_acquire_n_reporting(n), want) {
                (Ok(tightest), Ok(())) => {
                    let availables = [
                        reference.bucket.snapshot(now).0,
                        reference.window.snapshot(now).0,
                        reference.keys.get_mut(&key).unwrap().snapshot(now).0,
                        reference.log.available(now),
                    ];
                    let least = *availables.iter().min().unwrap();
                    prop_assert_eq!(tightest.snapshot.available, least);
                    prop_assert_eq!(availables[tightest.member], least);
                }
                (Err(blocked), Err((member, denied))) => {
                    prop_assert_eq!(blocked.rejection.denied, denied, "at {} for {} on key {}", now, n, key);
                    prop_assert_eq!(blocked.member, member);
                }
                (got, want) => prop_assert!(false, "at {now}, {n} on key {key}: AllOf {got:?}, reference {want:?}"),
            } }
            reference.assert_states(now, &bucket, &window, &keyed, &log)?;
        }
    }
}

/// Four threads hammer `AllOf((bucket, window, bucket))` in lock-step rounds:
/// each member's promise holds over what passed.
#[test]
fn every_members_invariant_holds_under_contention() {
    let clock = ManualClock::new();
    let fast = Bucket::with_clock(40, Rate::new(40, Duration::from_millis(1)), clock.clone());
    let window = Window::with_clock(Rate::new(50, Duration::from_millis(2)), clock.clone());
    let slow = Bucket::with_clock(60, Rate::new(20, Duration::from_millis(1)), clock.clone());
    let all = Arc::new(AllOf::new((fast.unwrap(), window.unwrap(), slow.unwrap())));
    let record = stress(
        all.clone(),
        &clock,
        4,
        &round_times(300, 400_000),
        48,
        mixed::<4>,
    );
    check_token_bucket(&record.admissions, 40, 40, 1_000_000);
    check_fixed_window(&record.admissions, 50, 2_000_000);
    check_token_bucket(&record.admissions, 60, 20, 1_000_000);
    assert!(
        record.admissions.len() > 1_000,
        "{}",
        record.admissions.len()
    );
}

/// With time frozen, threads race `AllOf((a, b))` where `b` binds, and
/// also take permits from `a` directly. No member ever shows more permits
/// than its capacity less what it admitted: a raced refund is lost
/// (under-admission), never doubled.
#[test]
fn a_raced_refund_is_lost_never_doubled() {
    for round in 0..50 {
        let clock = ManualClock::new();
        clock.set(1_000);
        let a = Bucket::with_clock(64, Rate::per_hour(64), clock.clone()).unwrap();
        let b = Bucket::with_clock(8, Rate::per_hour(8), clock.clone()).unwrap();
        let through_all = AtomicU64::new(0);
        let direct = AtomicU64::new(0);
        std::thread::scope(|s| {
            for thread in 0..4 {
                let (a, b, through_all, direct) = (&a, &b, &through_all, &direct);
                s.spawn(move || {
                    let all = AllOf::new((a, b));
                    for i in 0..40 {
                        if (thread + i + round) % 3 == 0 {
                            if a.try_acquire().is_ok() {
                                direct.fetch_add(1, Ordering::Relaxed);
                            }
                        } else if all.try_acquire().is_ok() {
                            through_all.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        let (through_all, direct) = (
            through_all.load(Ordering::Relaxed),
            direct.load(Ordering::Relaxed),
        );
        assert_eq!(through_all, 8, "b binds: exactly its capacity passes");
        assert_eq!(u64::from(b.snapshot().available), 0);
        let a_left = u64::from(a.snapshot().available);
        assert!(
            a_left + through_all + direct <= 64,
            "a shows {a_left} left after {through_all} + {direct} admitted from 64"
        );
    }
}

/// Keyed buckets of `capacity` an hour, on a clock 1 µs in.
fn keyed_per_hour(capacity: u32) -> (Keyed<u32, Bucket>, ManualClock) {
    let clock = ManualClock::new();
    clock.set(1_000);
    let config = BucketConfig::new(capacity, Rate::per_hour(capacity)).unwrap();
    (Keyed::with_clock(config, clock.clone()), clock)
}

/// The keyed view under contention: per-key and global limits hold, and no
/// key shows more than its capacity less what passed for it.
#[test]
fn keyed_members_lose_refunds_never_double_them() {
    let (keyed, clock) = keyed_per_hour(6);
    let global = Bucket::with_clock(10, Rate::per_hour(10), clock.clone()).unwrap();
    let passed: Vec<AtomicU64> = (0..4).map(|_| AtomicU64::new(0)).collect();
    std::thread::scope(|s| {
        for thread in 0..4u32 {
            let (keyed, global, passed) = (&keyed, &global, &passed);
            s.spawn(move || {
                for i in 0..30u32 {
                    let key = (thread + i) % 4;
                    let all = AllOf::new((keyed.for_key(&key), global));
                    if all.try_acquire().is_ok() {
                        passed[key as usize].fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    let total: u64 = passed.iter().map(|p| p.load(Ordering::Relaxed)).sum();
    assert_eq!(total, 10, "the global bucket binds");
    for (key, p) in passed.iter().enumerate() {
        let left = u64::from(keyed.snapshot(&(key as u32)).available);
        assert!(left + p.load(Ordering::Relaxed) <= 6, "key {key}");
    }
}

/// Issue 17's interleaving through the public API, on a direct bucket: an
/// admission at 200 is refunded only after a request at 2000 found the
/// bucket full again; the refund must not hand that request's permit out.
#[test]
fn a_refund_after_a_later_admission_gives_nothing_away() {
    let clock = ManualClock::new();
    let a = Bucket::with_clock(1, Rate::new(1, Duration::from_nanos(100)), clock.clone()).unwrap();
    clock.set(200);
    let stale = a.try_acquire_n_refundable(1).unwrap();
    clock.set(2_000);
    a.try_acquire().unwrap();
    a.refund(stale.receipt);
    assert!(
        a.try_acquire().is_err(),
        "2 permits at 2000 from a bucket of 1"
    );
}

#[test]
fn an_unraced_refund_is_exact_for_every_refundable_kind() {
    let clock = ManualClock::new();
    clock.set(5_000);
    let bucket = Bucket::with_clock(3, Rate::per_hour(3), clock.clone()).unwrap();
    let window = Window::with_clock(Rate::per_hour(3), clock.clone()).unwrap();
    let leaky = tollgate::LeakyBucket::with_clock(3, Rate::per_hour(3), clock.clone()).unwrap();
    let locking =
        tollgate::LockingTokenBucket::with_clock(3, Rate::per_hour(3), clock.clone()).unwrap();
    fn check<L: Refundable>(limiter: &L) {
        limiter.try_acquire().unwrap();
        let before = limiter.snapshot();
        let admitted = limiter.try_acquire_n_refundable(2).unwrap();
        assert_eq!(admitted.snapshot.available, before.available - 2);
        limiter.refund(admitted.receipt);
        assert_eq!(limiter.snapshot(), before);
    }
    check(&bucket);
    check(&window);
    check(&leaky);
    check(&locking);
}

/// `member` before the `last` member, which denies: `member` gets its permit
/// back, its snapshot as before.
fn refunded_when_the_last_denies<M: Refundable>(member: &M, last: &Bucket, what: &str) {
    let before = member.snapshot();
    assert!(AllOf::new((member, last)).try_acquire().is_err());
    assert_eq!(member.snapshot(), before, "{what} got its permit back");
}

/// The two-word limiters (shaper, warm-up) are members like the others: a
/// later member's denial gives their admission back, exactly, by the same
/// rule as a cancelled reservation (the word restored if unchanged); and a
/// refund after a later admission gives nothing back.
#[test]
fn two_word_members_are_refunded_by_the_stack_rule() {
    let clock = ManualClock::new();
    clock.set(5_000);
    let shaper =
        tollgate::Shaper::with_clock(Rate::per_second(10), 1, Duration::ZERO, clock.clone())
            .unwrap();
    let warm =
        tollgate::WarmUp::with_clock(Rate::per_second(10), Duration::from_secs(1), clock.clone())
            .unwrap();
    let empty = Bucket::with_clock(1, Rate::per_hour(1), clock.clone()).unwrap();
    empty.try_acquire().unwrap();

    refunded_when_the_last_denies(&shaper, &empty, "the shaper");
    // Two start at once (burst 1), the third not: exactly as if nothing had
    // been taken.
    assert!(shaper.try_acquire().is_ok() && shaper.try_acquire().is_ok());
    assert!(shaper.try_acquire().is_err());

    refunded_when_the_last_denies(&warm, &empty, "the warm-up limiter");
    assert!(warm.try_acquire().is_ok());

    // A later admission in between: the refund keeps the permits.
    clock.advance(Duration::from_secs(10));
    let held = shaper.try_acquire_n_refundable(1).unwrap();
    shaper.try_acquire().unwrap();
    let after_both = shaper.snapshot();
    shaper.refund(held.receipt);
    assert_eq!(shaper.snapshot(), after_both, "nothing given away");
}

/// A keyed refund across a reconfiguration or an override change gives
/// nothing back: the word's meaning may have changed.
#[test]
fn keyed_refunds_across_configuration_changes_keep_the_permits() {
    let (keyed, _clock) = keyed_per_hour(4);
    let config = BucketConfig::new(4, Rate::per_hour(4)).unwrap();
    let view = keyed.for_key(&1);

    let admitted = view.try_acquire_n_refundable(2).unwrap();
    keyed.reconfigure(config, Carry::Additive);
    view.refund(admitted.receipt);
    assert_eq!(keyed.snapshot(&1).available, 2, "reconfigured: kept");

    let admitted = view.try_acquire_n_refundable(1).unwrap();
    keyed.set_override(2, config, Carry::Additive);
    view.refund(admitted.receipt);
    assert_eq!(keyed.snapshot(&1).available, 1, "overrides changed: kept");

    // Unchanged: exact.
    let admitted = view.try_acquire_n_refundable(1).unwrap();
    view.refund(admitted.receipt);
    assert_eq!(keyed.snapshot(&1).available, 1);

    // An overridden key is decided by its own slot: not refunded.
    let over = keyed.for_key(&2);
    let admitted = over.try_acquire_n_refundable(1).unwrap();
    over.refund(admitted.receipt);
    assert_eq!(keyed.snapshot(&2).available, 3);
}

/// At the key cap a new key is decided by the shared overflow state; its
/// refund would move other keys' permits, so it gives nothing back.
#[test]
fn overflow_admissions_are_not_refunded() {
    let (keyed, _clock) = keyed_per_hour(4);
    let keyed = keyed.with_max_keys(1);
    keyed.try_acquire(&1).unwrap();
    let view = keyed.for_key(&2);
    let admitted = view.try_acquire_n_refundable(1).unwrap();
    let after = view.snapshot();
    view.refund(admitted.receipt);
    assert_eq!(view.snapshot(), after);
}

/// A receipt is honoured only by the view (key) that issued it.
#[test]
fn a_receipt_for_one_key_does_not_refund_another() {
    let (keyed, _clock) = keyed_per_hour(2);
    let (one, two) = (keyed.for_key(&1), keyed.for_key(&2));
    let admitted = one.try_acquire_n_refundable(1).unwrap();
    two.try_acquire().unwrap();
    two.refund(admitted.receipt);
    assert_eq!(keyed.snapshot(&2).available, 1);
    assert_eq!(keyed.snapshot(&1).available, 1);
}

/// The combined retry-after: the denier's wait, or `ExceedsCapacity` from a
/// later member that can never hold the request.
#[test]
fn a_later_member_that_can_never_admit_wins_over_a_wait() {
    let clock = ManualClock::new();
    let a = Bucket::with_clock(10, Rate::per_second(10), clock.clone()).unwrap();
    let b = Bucket::with_clock(3, Rate::per_second(3), clock.clone()).unwrap();
    a.try_acquire_n(10).unwrap();
    let blocked = AllOf::new((&a, &b)).try_acquire_n_reporting(4).unwrap_err();
    assert_eq!(blocked.member, 1);
    assert_eq!(
        blocked.rejection.denied,
        Denied::ExceedsCapacity {
            requested: 4,
            capacity: 3
        }
    );
    let blocked = AllOf::new((&a, &b)).try_acquire_n_reporting(2).unwrap_err();
    assert_eq!(blocked.member, 0);
    assert_eq!(
        blocked.rejection.denied,
        Denied::RetryAfter(Duration::from_millis(200))
    );
}

/// The keyed pair and `AllOf` hold several limits by one rule: the same
/// admissions, the same refunds (a denied request's first part gets its
/// permits back in both) and the same report, the binding limit's own
/// figures — never one limit's `available` beside another's `capacity`.
/// Their retry-afters may differ by design, so only the kind of denial is
/// compared: the pair asks both parts without writing and answers the longer
/// wait, `AllOf` the refusing member's.
#[test]
fn a_keyed_pair_reports_and_refunds_as_all_of_does() {
    use tollgate::keyed::{BucketConfig, Keyed, WindowConfig};
    let clock = ManualClock::new();
    let second = BucketConfig::new(10, Rate::per_second(10)).unwrap();
    let hour = WindowConfig::new(Rate::per_hour(25)).unwrap();
    let pair = Keyed::<u8, (TokenBucket<ManualClock>, FixedWindow<ManualClock>)>::with_clock(
        (second, hour),
        clock.clone(),
    );
    let bucket = TokenBucket::with_clock(10, Rate::per_second(10), clock.clone()).unwrap();
    let window = FixedWindow::with_clock(Rate::per_hour(25), clock.clone()).unwrap();
    let all = AllOf::new((&bucket, &window));

    // The per-second bucket binds first, then (once 20 are spent) the hourly
    // window, then the bucket again after a burst.
    let steps: [(u64, u32); 9] = [
        (0, 10),
        (0, 1),
        (1_000_000_000, 6),
        (0, 5),
        (500_000_000, 4),
        (100_000_000, 5),
        (3_600_000_000_000, 10),
        (0, 26),
        (0, 1),
    ];
    let mut reports = Vec::new();
    for (advance, n) in steps {
        clock.advance(Duration::from_nanos(advance));
        let (got, want) = (
            pair.try_acquire_n_with_snapshot(&0, n),
            all.try_acquire_n_with_snapshot(n),
        );
        match (&got, &want) {
            (Ok(a), Ok(b)) => assert_eq!(a, b, "{n} admitted"),
            (Err(a), Err(b)) => {
                assert_eq!(
                    std::mem::discriminant(&a.denied),
                    std::mem::discriminant(&b.denied),
                    "{n}"
                );
            }
            _ => panic!("{n}: pair {got:?}, AllOf {want:?}"),
        }
        assert_eq!(pair.snapshot(&0), all.snapshot(), "after {n}");
        reports.push(all.snapshot());
    }
    // Both limits were the binding one at some step, each reported whole.
    assert!(reports.iter().any(|s| s.capacity == 10 && s.available < 10));
    assert!(reports.iter().any(|s| s.capacity == 25 && s.available < 10));
}
