//! The keyed sliding log and the keyed sliding window against governor's
//! dashmap-keyed limiter (and tollgate's keyed token bucket, for scale), in
//! one run, at 1 and 2 threads, and the bytes each keeps per key.
//!
//! Groups are named `keyed_kinds/<spread>/<threads>t`:
//!
//! - **hot**: every thread checks the same key (`tollgate_log_2_rules`: the
//!   same 64-slot ring under a second rule, 32 per 500 ns; every check reads
//!   both) (one shard, one key's state: the contended case). The direct
//!   `SlidingWindow` (striped, default stripes) and its locking twin run
//!   beside them under the same limit, with no key: what a per-key window
//!   without stripes gives up on one hot key. So do the direct `SlidingLog`
//!   (the lock-free rings, default stripes) and its locking twin under the
//!   log's limit: what one unstriped ring per key gives up.
//! - **spread**: a million keys, scattered over the hash space, inserted
//!   before timing; thread `t` walks them from its own offset (the
//!   cache-missing case).
//! - **deny**: one hot key whose limit was spent before timing (64 an hour
//!   for the log, 1,000 an hour in 10 sub-windows for the window, a burst
//!   of 1 refilled one an hour for the buckets): every check denies, with
//!   its exact retry-after, and writes nothing.
//! - **limit**: one hot key offered about twice its rate: each kind's rate
//!   is one permit per `P`, `P` twice its own time per check allow-heavy on
//!   the hot key at that thread count, measured first in the same process
//!   (64 per `64·P` for the log, 1,000 per `1,000·P` in 10 sub-windows for
//!   the window, a burst of 64 and one per `P` for the buckets), so about
//!   half the checks admit and the limit binds throughout.
//!
//! In hot and spread every check admits and so writes its key's state (the
//! allow path); in no group is a key evicted while timing. Hot: the log has 64 permits per 2 µs
//! (32 M/s) and the window 10^6 per 10 ms in 10 sub-windows of 1 ms (100 M/s,
//! the most ten sub-windows allow), more than one key gets here. A window
//! denies a reading older than the newest sub-window opened (the direct
//! window's rule): with two threads on one key, a reading taken just before
//! a boundary and decided just after the other thread opened the next
//! sub-window; the direct striped window can also deny while budget sits
//! leased on a stripe no thread uses any more (the harness starts new
//! threads for every sample; 0.35 % of one warm-up's checks here). The
//! harness asserts every other check admitted. Spread: 64 per hour for both — a key is checked a few dozen
//! times in a whole run, so none nears its limit, and none refills (is
//! fresh) within the run, so inserts sweep nothing; the harness asserts
//! every check was admitted and every key still resident after timing.
//! The keyed token bucket and governor get a burst of `u32::MAX` refilled
//! one permit a second on the hot key, and 2^20 refilled one an hour over
//! the million keys (a key checked once owes an hour). All on their default TSC clocks and std's
//! `RandomState`. One criterion iteration is one check on each thread,
//! timed from the first thread's start to the last one's end, so elements/s
//! is total checks per second.
//!
//! Before the timed groups the binary prints the bytes allocated per key
//! with a million `u64` keys, each admitted once, counted by this binary's
//! global allocator: `cargo bench --bench keyed_kinds -- no_such_bench`
//! prints the table alone.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use criterion::Criterion;
use governor::Quota;
use tollgate::LogConfig;
use tollgate::keyed::{BucketConfig, Keyed, SlidingWindowConfig};
use tollgate::{
    LockingSlidingLog, LockingSlidingWindow, ManualClock, Rate, RateLimiter, SlidingLog,
    SlidingWindow, TokenBucket,
};

mod common;
use common::counting::{Counting, key};
use common::keyed::{
    Check, GovernorKeyed, KEYS, bytes_per_key_then, check_keys, governor_row, keyed_bytes_per_key,
    print_bytes_per_key,
};

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Thread counts: the machine has 2 cores.
const THREADS: [usize; 2] = [1, 2];

/// A direct limiter, for the hot-key groups: the key is ignored.
struct Direct<L>(L);

impl<L: RateLimiter + Send + Sync + 'static> Check for Direct<L> {
    #[inline]
    fn check(&self, _key: &u64) -> bool {
        self.0.try_acquire().is_ok()
    }

    fn spend(&self, _key: &u64, n: u32) -> bool {
        self.0.try_acquire_n(n).is_ok()
    }
}

/// A token bucket of `burst` refilled one permit per `period`, tollgate's and
/// governor's. On the hot key: `u32::MAX` per second (the most a 2^62 ns
/// timeline allows with that burst), never reached. Over the million keys:
/// 2^20 refilled one an hour, so a key checked once owes an hour and is not
/// fresh (evictable) again within a run.
fn bucket_keyed(burst: u32, period: Duration) -> Keyed<u64, TokenBucket> {
    Keyed::new(BucketConfig::new(burst, Rate::new(1, period)).expect("valid"))
}

fn governor_keyed(burst: u32, period: Duration) -> GovernorKeyed {
    let quota = Quota::with_period(period)
        .expect("a non-zero period")
        .allow_burst(NonZeroU32::new(burst).expect("non-zero"));
    governor::RateLimiter::dashmap(quota)
}

const SECOND: Duration = Duration::from_secs(1);
const HOUR: Duration = Duration::from_secs(3_600);

/// What a group's checks are expected to get.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Regime {
    /// Every check admits (the windows and logs may deny a few, below).
    Allow,
    /// Every check denies.
    Deny,
    /// Some admit: the limit binds.
    Limit,
}

/// `iters` checks on each of `threads` threads, thread `t` from its own offset
/// into `keys` (or all on the hot key); returns the wall time and the checks
/// admitted. Asserts what `regime` promises.
fn run<L: Check>(
    limiter: &Arc<L>,
    keys: &Arc<Vec<u64>>,
    hot: bool,
    regime: Regime,
    threads: usize,
    iters: u64,
) -> (Duration, u64) {
    // The windows and the logs, keyed or direct, may deny a few checks: each
    // checks a reading older than another thread's newest admission as it
    // is (a stale reading can only deny more).
    let name = std::any::type_name::<L>();
    let tolerant = name.contains("SlidingWindow") || name.contains("SlidingLog");
    // Each run resumes the walk where the last one stopped: a walk from key
    // 0 every run checked the first keys in every one of criterion's many
    // short warm-up runs, past their 64 an hour.
    static CURSOR: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let start = CURSOR.fetch_add(iters as usize, Ordering::Relaxed);
    let run = common::run_threads(threads, false, |t| {
        let (limiter, keys) = (Arc::clone(limiter), Arc::clone(keys));
        let offset = start + t * keys.len() / threads;
        move || {
            let admitted = check_keys(&*limiter, &keys, hot, offset, iters);
            // The windows and the logs may deny a few checks (above); the
            // others none.
            match regime {
                Regime::Allow if !tolerant => assert_eq!(admitted, iters, "a check was denied"),
                Regime::Deny => assert_eq!(admitted, 0, "a check was admitted"),
                _ => {}
            }
            admitted
        }
    });
    (run.wall, run.count)
}

fn bench<L: Check>(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    limiter: &Arc<L>,
    keys: &Arc<Vec<u64>>,
    hot: bool,
    threads: usize,
) {
    bench_in(group, name, limiter, keys, hot, Regime::Allow, threads);
}

fn bench_in<L: Check>(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    limiter: &Arc<L>,
    keys: &Arc<Vec<u64>>,
    hot: bool,
    regime: Regime,
    threads: usize,
) {
    group.bench_function(name, |b| {
        b.iter_custom(|iters| run(limiter, keys, hot, regime, threads, iters).0)
    });
}

/// The hot-key rows of the deny and at-the-limit groups: the log, the
/// window, the keyed bucket and governor.
fn the_four<A: Check, B: Check, C: Check, D: Check>(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    (log, window, bucket, governor): (&Arc<A>, &Arc<B>, &Arc<C>, &Arc<D>),
    keys: &Arc<Vec<u64>>,
    regime: Regime,
    threads: usize,
) {
    bench_in(group, "tollgate_log", log, keys, true, regime, threads);
    bench_in(
        group,
        "tollgate_window",
        window,
        keys,
        true,
        regime,
        threads,
    );
    bench_in(
        group,
        "tollgate_bucket",
        bucket,
        keys,
        true,
        regime,
        threads,
    );
    bench_in(group, "governor", governor, keys, true, regime, threads);
}

/// One permit per twice the time `make`'s limiter takes per check
/// allow-heavy on the hot key at `threads` threads.
fn limit_period<L: Check>(name: &str, threads: usize, make: impl FnOnce() -> L) -> Duration {
    let keys = Arc::new(vec![key(0)]);
    let iters = 2_000_000;
    let (wall, _) = run(
        &Arc::new(make()),
        &keys,
        true,
        Regime::Allow,
        threads,
        iters,
    );
    let ns_per_check = wall.as_nanos() as f64 / (iters as f64 * threads as f64);
    let period = Duration::from_nanos((2.0 * ns_per_check).ceil().max(10.0) as u64);
    eprintln!(
        "{name} at {threads}t: one permit per {period:?} (allow-heavy {:.1} M checks/s)",
        1e3 / ns_per_check
    );
    period
}

/// The deny-heavy groups: one hot key, its limit spent before timing.
fn deny(c: &mut Criterion) {
    let keys = Arc::new(vec![key(0)]);
    let log = Arc::new(Keyed::<u64, SlidingLog>::new(
        LogConfig::new(Rate::per_hour(64)).expect("valid"),
    ));
    let window = Arc::new(Keyed::<u64, SlidingWindow>::new(
        SlidingWindowConfig::with_sub_windows(Rate::per_hour(1_000), 10).expect("valid"),
    ));
    let bucket = Arc::new(bucket_keyed(1, HOUR));
    let governor = Arc::new(governor_keyed(1, HOUR));
    let hot = &keys[0];
    assert!(log.spend(hot, 64) && window.spend(hot, 1_000));
    assert!(bucket.check(hot) && governor.check(hot));
    for threads in THREADS {
        let mut group = common::threads_group(c, &format!("keyed_kinds/deny/{threads}t"), threads);
        the_four(
            &mut group,
            (&log, &window, &bucket, &governor),
            &keys,
            Regime::Deny,
            threads,
        );
        group.finish();
    }
}

/// The at-the-limit groups: one hot key offered about twice its rate.
fn limit(c: &mut Criterion) {
    let keys = Arc::new(vec![key(0)]);
    let log_rate = Rate::new(64, Duration::from_micros(2));
    let window_rate = Rate::new(1_000_000, Duration::from_millis(10));
    for threads in THREADS {
        let p = limit_period("tollgate_log", threads, || {
            Keyed::<u64, SlidingLog>::new(LogConfig::new(log_rate).expect("valid"))
        });
        let log = Arc::new(Keyed::<u64, SlidingLog>::new(
            LogConfig::new(Rate::new(64, 64 * p)).expect("valid"),
        ));
        let p = limit_period("tollgate_window", threads, || {
            Keyed::<u64, SlidingWindow>::new(
                SlidingWindowConfig::with_sub_windows(window_rate, 10).expect("valid"),
            )
        });
        let window = Arc::new(Keyed::<u64, SlidingWindow>::new(
            SlidingWindowConfig::with_sub_windows(Rate::new(1_000, 1_000 * p), 10).expect("valid"),
        ));
        let p = limit_period("tollgate_bucket", threads, || {
            bucket_keyed(u32::MAX, SECOND)
        });
        let bucket = Arc::new(Keyed::<u64, TokenBucket>::new(
            BucketConfig::new(64, Rate::new(1, p)).expect("valid"),
        ));
        let p = limit_period("governor", threads, || governor_keyed(u32::MAX, SECOND));
        let governor = Arc::new(governor_keyed(64, p));
        let mut group = common::threads_group(c, &format!("keyed_kinds/limit/{threads}t"), threads);
        the_four(
            &mut group,
            (&log, &window, &bucket, &governor),
            &keys,
            Regime::Limit,
            threads,
        );
        group.finish();
    }
}

/// The hot-key groups: every thread on one key.
fn hot(c: &mut Criterion) {
    let keys = Arc::new(vec![key(0)]);
    let log_rate = Rate::new(64, Duration::from_micros(2));
    let window_rate = Rate::new(1_000_000, Duration::from_millis(10));
    let log = Arc::new(Keyed::<u64, SlidingLog>::new(
        LogConfig::new(log_rate).expect("valid"),
    ));
    // Two rules on the same 64-slot ring: every check reads both.
    let two_rules = LogConfig::new(log_rate)
        .and_then(|c| c.with_rule(Rate::new(32, Duration::from_nanos(500))))
        .expect("valid");
    let log_2_rules = Arc::new(Keyed::<u64, SlidingLog>::new(two_rules));
    let window = Arc::new(Keyed::<u64, SlidingWindow>::new(
        SlidingWindowConfig::with_sub_windows(window_rate, 10).expect("valid"),
    ));
    let striped = Arc::new(Direct(
        SlidingWindow::builder(window_rate)
            .sub_windows(10)
            .build()
            .expect("valid"),
    ));
    let twin = Arc::new(Direct(
        LockingSlidingWindow::builder(window_rate)
            .sub_windows(10)
            .build_locking()
            .expect("valid"),
    ));
    // The same exact log, direct: the lock-free ring (one per stripe) and its
    // locking twin, against which the keyed log's per-key mutex is measured.
    let direct_log = Arc::new(Direct(SlidingLog::new(log_rate).expect("valid")));
    let direct_log_twin = Arc::new(Direct(LockingSlidingLog::new(log_rate).expect("valid")));
    let bucket = Arc::new(bucket_keyed(u32::MAX, SECOND));
    let governor = Arc::new(governor_keyed(u32::MAX, SECOND));
    for threads in THREADS {
        let mut group = common::threads_group(c, &format!("keyed_kinds/hot/{threads}t"), threads);
        bench(&mut group, "tollgate_log", &log, &keys, true, threads);
        bench(
            &mut group,
            "tollgate_log_2_rules",
            &log_2_rules,
            &keys,
            true,
            threads,
        );
        bench(&mut group, "direct_log", &direct_log, &keys, true, threads);
        bench(
            &mut group,
            "direct_log_twin",
            &direct_log_twin,
            &keys,
            true,
            threads,
        );
        bench(&mut group, "tollgate_window", &window, &keys, true, threads);
        bench(&mut group, "tollgate_bucket", &bucket, &keys, true, threads);
        bench(&mut group, "governor", &governor, &keys, true, threads);
        bench(
            &mut group,
            "direct_striped_window",
            &striped,
            &keys,
            true,
            threads,
        );
        bench(
            &mut group,
            "direct_window_twin",
            &twin,
            &keys,
            true,
            threads,
        );
        group.finish();
    }
}

/// The million-key groups.
fn spread(c: &mut Criterion) {
    let keys: Arc<Vec<u64>> = Arc::new((0..KEYS as u64).map(key).collect());
    let hourly = Rate::per_hour(64);
    let log = Arc::new(Keyed::<u64, SlidingLog>::new(
        LogConfig::new(hourly).expect("valid"),
    ));
    let window = Arc::new(Keyed::<u64, SlidingWindow>::new(
        SlidingWindowConfig::new(hourly).expect("valid"),
    ));
    let bucket = Arc::new(bucket_keyed(1 << 20, HOUR));
    let governor = Arc::new(governor_keyed(1 << 20, HOUR));
    for key in keys.iter() {
        assert!(log.check(key) && window.check(key) && bucket.check(key) && governor.check(key));
    }
    let resident = || [log.len(), window.len(), bucket.len()];
    // No key refills within an hour, so no insert swept one.
    assert_eq!(resident(), [KEYS; 3]);
    for threads in THREADS {
        let mut group =
            common::threads_group(c, &format!("keyed_kinds/spread/{threads}t"), threads);
        bench(&mut group, "tollgate_log", &log, &keys, false, threads);
        bench(
            &mut group,
            "tollgate_window",
            &window,
            &keys,
            false,
            threads,
        );
        bench(
            &mut group,
            "tollgate_bucket",
            &bucket,
            &keys,
            false,
            threads,
        );
        bench(&mut group, "governor", &governor, &keys, false, threads);
        group.finish();
    }
    assert_eq!(resident(), [KEYS; 3], "no key may be evicted while timing");
}

fn memory() {
    let log = |limit| LogConfig::new(Rate::per_minute(limit)).expect("valid");
    let window =
        |subs| SlidingWindowConfig::with_sub_windows(Rate::per_minute(30), subs).expect("valid");
    let rows = [
        (
            "tollgate SlidingLog, 30/min",
            keyed_bytes_per_key::<SlidingLog<ManualClock>>(|| log(30)),
        ),
        (
            "tollgate SlidingLog, 64/min",
            keyed_bytes_per_key::<SlidingLog<ManualClock>>(|| log(64)),
        ),
        (
            "tollgate SlidingWindow, 30/min, S = 10",
            keyed_bytes_per_key::<SlidingWindow<ManualClock>>(|| window(10)),
        ),
        (
            "tollgate SlidingWindow, 30/min, S = 4",
            keyed_bytes_per_key::<SlidingWindow<ManualClock>>(|| window(4)),
        ),
        ("tollgate SlidingWindow, S = 10, a sub-window later", {
            let moved = ManualClock::new();
            let handle = moved.clone();
            bytes_per_key_then(
                || Keyed::<u64, SlidingWindow<ManualClock>>::with_clock(window(10), moved),
                || handle.advance(Duration::from_secs(6)),
            )
        }),
        (
            "tollgate TokenBucket",
            keyed_bytes_per_key::<TokenBucket<ManualClock>>(|| {
                BucketConfig::new(30, Rate::per_minute(30)).expect("valid")
            }),
        ),
        governor_row(Quota::per_minute(NonZeroU32::new(30).expect("non-zero"))),
    ];
    print_bytes_per_key(&rows, 42);
}

fn main() {
    memory();
    common::run_groups(&[hot, spread, deny, limit]);
}
