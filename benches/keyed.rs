//! tollgate's keyed limiter against governor's dashmap-keyed limiter, in one
//! run, at 1, 2 and 4 threads, and the bytes each keeps per key.
//!
//! Groups are named `keyed/<spread>/<threads>t`:
//!
//! - **hot**: every thread checks the same key (one dashmap shard, one word:
//!   the contended case);
//! - **spread**: a million keys are inserted before timing; thread `t` walks
//!   them (scattered over the hash space) from its own offset (the
//!   cache-missing case).
//!
//! Every check admits and so writes the key's word (the allow path): both
//! limiters get a burst of `u32::MAX` refilled at one permit per second, so no
//! run can reach a denial, and no key is ever full (fresh) again, so no key is
//! evicted and the map stays at a million keys; the harness asserts every
//! check was admitted. Functions: `tollgate` (`Keyed<u64, TokenBucket>`) and
//! `governor` (`RateLimiter::dashmap`), both on their default TSC clocks and
//! std's `RandomState` hasher. One criterion iteration is one check on each
//! thread, timed from the first thread's start to the last one's end, so
//! elements/s is total checks per second.
//!
//! Groups `keyed_log/<spread>/<threads>t` do the same with 100 k keys for
//! `tollgate_log` (`Keyed<u64, SlidingLog>`: a per-key lock around a ring of
//! 32-bit stamps), `tollgate_log_2_rules` (the same ring under two rules, 64
//! per 2 µs and 32 per 500 ns: every check reads both), `tollgate_bucket` and
//! `governor`, on the allow path too.
//!
//! Before the timed groups, the binary prints the bytes allocated per key with
//! a million `u64` keys for each kind and for governor, counted by this
//! binary's global allocator.

use std::alloc::{GlobalAlloc, Layout, System};
use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::Duration;

use criterion::Criterion;
use governor::Quota;
use tollgate::keyed::{
    BucketConfig, Keyable, Keyed, LogConfig, MeterConfig, ShaperConfig, WarmUpConfig, WindowConfig,
};
use tollgate::{
    FixedWindow, LeakyBucket, LockingFixedWindow, LockingTokenBucket, LockingWarmUp, ManualClock,
    Rate, Shaper, SlidingLog, TokenBucket, WarmUp,
};

mod common;
use common::THREADS;

const KEYS: usize = 1_000_000;

/// Counts the bytes the process holds, for the bytes-per-key table.
struct Counting;

static ALLOCATED: AtomicIsize = AtomicIsize::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATED.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        ALLOCATED.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATED.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        // SAFETY: the caller's contract, passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// splitmix64: the keys, distinct and scattered.
fn key(i: u64) -> u64 {
    let mut z = i
        .wrapping_add(0x9E37_79B9_7F4A_7C15)
        .wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 30)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn keys() -> Arc<Vec<u64>> {
    Arc::new((0..KEYS as u64).map(key).collect())
}

/// One keyed check, `true` if admitted.
trait Check: Send + Sync + 'static {
    fn check(&self, key: &u64) -> bool;
}

impl<L: Keyable + 'static> Check for Keyed<u64, L>
where
    L::Clock: Send + Sync,
{
    #[inline]
    fn check(&self, key: &u64) -> bool {
        self.try_acquire(key).is_ok()
    }
}

type GovernorKeyed = governor::DefaultKeyedRateLimiter<u64>;

impl Check for GovernorKeyed {
    #[inline]
    fn check(&self, key: &u64) -> bool {
        self.check_key(key).is_ok()
    }
}

fn tollgate_keyed() -> Keyed<u64, TokenBucket> {
    Keyed::new(BucketConfig::new(u32::MAX, Rate::per_second(1)).expect("valid"))
}

fn governor_keyed() -> GovernorKeyed {
    governor::RateLimiter::dashmap(Quota::per_second(NonZeroU32::MIN).allow_burst(NonZeroU32::MAX))
}

/// `iters` checks on each of `threads` threads, thread `t` from its own offset
/// into `keys` (or all on the hot key); returns the wall time. Asserts that
/// every check was admitted.
fn run<L: Check>(
    limiter: &Arc<L>,
    keys: &Arc<Vec<u64>>,
    hot: bool,
    threads: usize,
    iters: u64,
) -> Duration {
    let run = common::run_threads(threads, false, |t| {
        let (limiter, keys) = (Arc::clone(limiter), Arc::clone(keys));
        let offset = t * keys.len() / threads;
        move || {
            let mut admitted = 0u64;
            for i in 0..iters as usize {
                let key = if hot {
                    &keys[0]
                } else {
                    &keys[(offset + i) % keys.len()]
                };
                admitted += u64::from(limiter.check(key));
            }
            assert_eq!(admitted, iters, "a check was denied");
            admitted
        }
    });
    run.wall
}

fn throughput(c: &mut Criterion) {
    let keys = keys();
    let tollgate = Arc::new(tollgate_keyed());
    let governor = Arc::new(governor_keyed());
    for key in keys.iter() {
        assert!(tollgate.check(key) && governor.check(key));
    }
    assert_eq!(tollgate.len(), KEYS);
    for (spread, hot) in [("hot", true), ("spread", false)] {
        for threads in THREADS {
            let mut group =
                common::threads_group(c, &format!("keyed/{spread}/{threads}t"), threads);
            group.bench_function("tollgate", |b| {
                b.iter_custom(|iters| run(&tollgate, &keys, hot, threads, iters))
            });
            group.bench_function("governor", |b| {
                b.iter_custom(|iters| run(&governor, &keys, hot, threads, iters))
            });
            group.finish();
        }
    }
    assert_eq!(tollgate.len(), KEYS, "no key may be evicted while timing");
}

/// Keys of the sliding-log groups: fewer than `KEYS`, as every log key
/// holds a ring.
const LOG_KEYS: usize = 100_000;

/// The keyed sliding log (a per-key lock around a ring of 32-bit stamps)
/// beside the keyed token bucket and governor, on the allow path: 64
/// permits per 2 µs per key (32 M/s, more than any key gets here, so every
/// check is admitted and writes; a 256-byte ring per key, 25.6 MB over the
/// 100 k keys), hot key and 100 k keys.
fn log_throughput(c: &mut Criterion) {
    let keys: Arc<Vec<u64>> = Arc::new((0..LOG_KEYS as u64).map(key).collect());
    let rate = Rate::new(64, Duration::from_micros(2));
    let log = Arc::new(Keyed::<u64, SlidingLog>::new(
        LogConfig::new(rate).expect("valid"),
    ));
    // Two rules on the same 64-slot ring: every check reads both.
    let two_rules = LogConfig::new(rate)
        .and_then(|c| c.with_rule(Rate::new(32, Duration::from_nanos(500))))
        .expect("valid");
    let log_2_rules = Arc::new(Keyed::<u64, SlidingLog>::new(two_rules));
    let bucket = Arc::new(tollgate_keyed());
    let governor = Arc::new(governor_keyed());
    for key in keys.iter() {
        assert!(
            log.check(key) && log_2_rules.check(key) && bucket.check(key) && governor.check(key)
        );
    }
    for (spread, hot) in [("hot", true), ("spread", false)] {
        for threads in THREADS {
            let mut group =
                common::threads_group(c, &format!("keyed_log/{spread}/{threads}t"), threads);
            group.bench_function("tollgate_log", |b| {
                b.iter_custom(|iters| run(&log, &keys, hot, threads, iters))
            });
            group.bench_function("tollgate_log_2_rules", |b| {
                b.iter_custom(|iters| run(&log_2_rules, &keys, hot, threads, iters))
            });
            group.bench_function("tollgate_bucket", |b| {
                b.iter_custom(|iters| run(&bucket, &keys, hot, threads, iters))
            });
            group.bench_function("governor", |b| {
                b.iter_custom(|iters| run(&governor, &keys, hot, threads, iters))
            });
            group.finish();
        }
    }
}

/// Bytes allocated per key with `KEYS` keys, each admitted once.
fn bytes_per_key<L: Check>(make: impl FnOnce() -> L) -> f64 {
    let before = ALLOCATED.load(Ordering::Relaxed);
    let limiter = make();
    for i in 0..KEYS as u64 {
        assert!(limiter.check(&key(i)));
    }
    let bytes = ALLOCATED.load(Ordering::Relaxed) - before;
    drop(limiter);
    bytes as f64 / KEYS as f64
}

fn memory() {
    // A manual clock that never moves: no key refills, so none is evicted.
    let bucket = || BucketConfig::new(10, Rate::per_second(10)).expect("valid");
    let window = || WindowConfig::new(Rate::per_second(10)).expect("valid");
    let meter = || MeterConfig::new(10, Rate::per_second(10)).expect("valid");
    let shaper = || ShaperConfig::new(Rate::per_second(10), 0, Duration::ZERO).expect("valid");
    let warm_up =
        || WarmUpConfig::new(Rate::per_second(10), Duration::from_secs(1)).expect("valid");
    let clock = ManualClock::new;
    let rows = [
        (
            "tollgate TokenBucket",
            bytes_per_key(|| Keyed::<u64, TokenBucket<ManualClock>>::with_clock(bucket(), clock())),
        ),
        (
            "tollgate LockingTokenBucket",
            bytes_per_key(|| {
                Keyed::<u64, LockingTokenBucket<ManualClock>>::with_clock(bucket(), clock())
            }),
        ),
        (
            "tollgate FixedWindow",
            bytes_per_key(|| Keyed::<u64, FixedWindow<ManualClock>>::with_clock(window(), clock())),
        ),
        (
            "tollgate LockingFixedWindow",
            bytes_per_key(|| {
                Keyed::<u64, LockingFixedWindow<ManualClock>>::with_clock(window(), clock())
            }),
        ),
        (
            "tollgate LeakyBucket (meter)",
            bytes_per_key(|| Keyed::<u64, LeakyBucket<ManualClock>>::with_clock(meter(), clock())),
        ),
        (
            "tollgate Shaper (two words)",
            bytes_per_key(|| Keyed::<u64, Shaper<ManualClock>>::with_clock(shaper(), clock())),
        ),
        (
            "tollgate WarmUp (two words)",
            bytes_per_key(|| Keyed::<u64, WarmUp<ManualClock>>::with_clock(warm_up(), clock())),
        ),
        (
            "tollgate LockingWarmUp",
            bytes_per_key(|| {
                Keyed::<u64, LockingWarmUp<ManualClock>>::with_clock(warm_up(), clock())
            }),
        ),
        (
            "tollgate (TokenBucket, TokenBucket)",
            bytes_per_key(|| {
                Keyed::<u64, (TokenBucket<ManualClock>, TokenBucket<ManualClock>)>::with_clock(
                    (bucket(), bucket()),
                    clock(),
                )
            }),
        ),
        (
            "governor dashmap keyed",
            bytes_per_key(|| {
                governor::RateLimiter::dashmap(Quota::per_second(
                    NonZeroU32::new(10).expect("non-zero"),
                ))
            }),
        ),
    ];
    println!("bytes per key with {KEYS} u64 keys (allocator count):");
    for (name, bytes) in rows {
        println!("  {name:<38} {bytes:6.1}");
    }
}

fn main() {
    memory();
    let mut c = common::config().configure_from_args();
    // The log groups first: their setup is small, while the million-key
    // setup of `throughput` asserts that no key was evicted while inserting,
    // which a loaded machine taking over a second to insert can break.
    log_throughput(&mut c);
    throughput(&mut c);
    c.final_summary();
}
