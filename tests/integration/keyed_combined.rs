//! Combined limits under contention: real threads hammer a pair of token
//! buckets (and a keyed pair) in lock-step rounds; both limits must hold over
//! what was admitted, and no denied request may keep a permit in either.

use crate::support;

use std::sync::{Arc, Barrier};
use std::time::Duration;

use support::{StressRecord, check_fixed_window, check_token_bucket, mixed, round_times, stress};
use tollgate::keyed::{BucketConfig, Carry, Keyable, Keyed, Tunable, WindowConfig};
use tollgate::{Denied, FixedWindow, ManualClock, Rate, RateLimiter, Snapshot, TokenBucket};

type Bucket = TokenBucket<ManualClock>;

const THREADS: usize = 4;

/// Lock-step stress on a combined limit of `config`: 300 rounds about `step`
/// ns apart, each thread asking 64 times a round for 1 to 4 permits.
fn stress_pair<L: Keyable<Clock = ManualClock> + 'static>(
    config: L::Config,
    step: u64,
) -> StressRecord {
    let clock = ManualClock::new();
    let pair = Arc::new(Tunable::<L>::with_clock(config, clock.clone()));
    stress(
        pair,
        &clock,
        THREADS,
        &round_times(300, step),
        64,
        mixed::<4>,
    )
}

/// 40 per ms with bursts of 40, and 25 per ms with bursts of 60: each binds
/// in turn. Both promises must hold over the admitted requests.
#[test]
fn both_limits_hold_under_contention() {
    let fast = BucketConfig::new(40, Rate::new(40, Duration::from_millis(1))).unwrap();
    let slow = BucketConfig::new(60, Rate::new(25, Duration::from_millis(1))).unwrap();
    let record = stress_pair::<(Bucket, Bucket)>((fast, slow), 400_000);
    check_token_bucket(&record.admissions, 40, 40, 1_000_000);
    check_token_bucket(&record.admissions, 60, 25, 1_000_000);
    assert!(
        record.admissions.len() > 1_000,
        "the pair admitted too little to mean anything"
    );
}

/// A bucket and a window together, to mix kinds.
#[test]
fn bucket_and_window_hold_under_contention() {
    let bucket = BucketConfig::new(30, Rate::new(30, Duration::from_millis(1))).unwrap();
    let window = WindowConfig::new(Rate::new(50, Duration::from_millis(2))).unwrap();
    let record = stress_pair::<(Bucket, FixedWindow<ManualClock>)>((bucket, window), 300_000);
    check_token_bucket(&record.admissions, 30, 30, 1_000_000);
    check_fixed_window(&record.admissions, 50, 2_000_000);
}

/// Time stands still while threads race for a pair of capacity 100 and 30:
/// afterwards each part must show exactly its capacity less what the pair
/// admitted — a permit kept by a denied request would show as a missing one —
/// when the first part is a fixed window, whose refunds are exact whatever
/// races them. A token bucket first part keeps a denied request's permits
/// when a racing admission moved its word before the refund (it cannot tell
/// whether that admission stacked on them; see `kind::kinds`): it must then
/// show at most its capacity less what was admitted, and at least that less
/// the permits of denied requests.
#[test]
fn denied_requests_keep_no_permit() {
    type Window = FixedWindow<ManualClock>;
    for trial in 0..50 {
        let second = BucketConfig::new(30, Rate::per_hour(30)).unwrap();
        let wide = BucketConfig::new(1_000, Rate::per_hour(1_000)).unwrap();
        let window = WindowConfig::new(Rate::per_hour(100)).unwrap();
        let exact = Arc::new(Tunable::<(Window, Bucket)>::with_clock(
            (window, second),
            ManualClock::new(),
        ));
        let (admitted, _) = race(&exact, trial);
        assert!(admitted <= 30);
        assert_eq!(exact.snapshot().available, 30 - admitted);
        // Widen the second part, keeping its permits in use, to read the first.
        exact.reconfigure((window, wide), Carry::Additive);
        assert_eq!(
            exact.snapshot().available,
            100 - admitted,
            "trial {trial}: the window kept refunded permits"
        );

        let first = BucketConfig::new(100, Rate::per_hour(100)).unwrap();
        let buckets = Arc::new(Tunable::<(Bucket, Bucket)>::with_clock(
            (first, second),
            ManualClock::new(),
        ));
        let (admitted, denied) = race(&buckets, trial);
        assert!(admitted <= 30);
        // The pair shows the smaller part: a kept permit may make it the first.
        assert!(buckets.snapshot().available <= 30 - admitted);
        buckets.reconfigure((first, wide), Carry::Additive);
        let available = buckets.snapshot().available;
        assert!(
            available <= 100 - admitted,
            "trial {trial}: a refund gave too much"
        );
        assert!(
            available + denied >= 100 - admitted,
            "trial {trial}: more kept than the denied requests took"
        );
    }
}

/// `THREADS` threads start together and make 40 requests each; returns the
/// permits admitted and the permits denied.
fn race<L: RateLimiter + Send + Sync + 'static>(limiter: &Arc<L>, trial: usize) -> (u32, u32) {
    let start = Arc::new(Barrier::new(THREADS));
    (0..THREADS)
        .map(|t| {
            let (limiter, start) = (Arc::clone(limiter), Arc::clone(&start));
            std::thread::spawn(move || {
                start.wait();
                (0..40)
                    .map(|i| mixed::<4>(t + trial, i))
                    .fold((0, 0), |(ok, denied), n| match limiter.try_acquire_n(n) {
                        Ok(()) => (ok + n, denied),
                        Err(Denied::RetryAfter(_)) => (ok, denied + n),
                        Err(other) => panic!("{other:?}"),
                    })
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|t| t.join().unwrap())
        .fold((0, 0), |(a, d), (ok, denied)| (a + ok, d + denied))
}

/// The same through `Keyed`: a per-key pair, several keys, contention on each.
#[test]
fn keyed_pairs_hold_per_key() {
    let clock = ManualClock::new();
    let fast = BucketConfig::new(20, Rate::new(20, Duration::from_millis(1))).unwrap();
    let slow = BucketConfig::new(30, Rate::new(10, Duration::from_millis(1))).unwrap();
    let keyed = Arc::new(Keyed::<u8, (Bucket, Bucket)>::with_clock(
        (fast, slow),
        clock.clone(),
    ));
    let mut offset = 0;
    for key in 0..3u8 {
        let one_key = Arc::new(OneKey(Arc::clone(&keyed), key));
        let times: Vec<u64> = round_times(100, 300_000)
            .iter()
            .map(|t| t + offset)
            .collect();
        let record = stress(one_key, &clock, THREADS, &times, 32, mixed::<4>);
        check_token_bucket(&record.admissions, 20, 20, 1_000_000);
        check_token_bucket(&record.admissions, 30, 10, 1_000_000);
        // Time only moves forward: the next key starts later.
        offset = times.last().copied().unwrap_or(0) + 10_000_000;
    }
}

/// One key of a keyed limiter, as a `RateLimiter` for the stress harness.
struct OneKey(Arc<Keyed<u8, (Bucket, Bucket)>>, u8);

impl RateLimiter for OneKey {
    fn try_acquire_n(&self, n: u32) -> Result<(), Denied> {
        self.0.try_acquire_n(&self.1, n)
    }

    fn snapshot(&self) -> Snapshot {
        self.0.snapshot(&self.1)
    }

    fn try_acquire_n_with_snapshot(&self, n: u32) -> Result<Snapshot, tollgate::Rejection> {
        self.0.try_acquire_n_with_snapshot(&self.1, n)
    }
}
