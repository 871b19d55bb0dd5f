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
//! Every check admits and so writes the key's word (the allow path). On the
//! hot key both limiters get a burst of `u32::MAX` refilled at one permit
//! per second, so no run can reach a denial. Over the million keys, a burst
//! of 2^20 refilled at one permit an hour: a key checked once owes an hour,
//! so none is full (fresh) again within a run, no insert sweeps one away and
//! the map stays at a million keys. (Both used to share the first limiter: a
//! key checked once was fresh a second later, so a setup that took more than
//! a second to insert the million keys — a loaded machine — had its inserts
//! sweep the first keys away, and the "no eviction" assertion failed, or the
//! spread groups re-inserted evicted keys while timing.) The harness asserts
//! every check was admitted and every key still resident. Functions: `tollgate` (`Keyed<u64, TokenBucket>`) and
//! `governor` (`RateLimiter::dashmap`), both on their default TSC clocks and
//! std's `RandomState` hasher. One criterion iteration is one check on each
//! thread, timed from the first thread's start to the last one's end, so
//! elements/s is total checks per second.
//!
//! The keyed sliding log and sliding window are in `benches/keyed_kinds.rs`.
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
    BucketConfig, Keyable, Keyed, MeterConfig, ShaperConfig, WarmUpConfig, WindowConfig,
};
use tollgate::{
    FixedWindow, LeakyBucket, LockingFixedWindow, LockingTokenBucket, LockingWarmUp, ManualClock,
    Rate, Shaper, TokenBucket, WarmUp,
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

/// A keyed token bucket of `burst` refilled one permit per `period`.
fn tollgate_keyed(burst: u32, period: Duration) -> Keyed<u64, TokenBucket> {
    Keyed::new(BucketConfig::new(burst, Rate::new(1, period)).expect("valid"))
}

fn governor_keyed(burst: u32, period: Duration) -> GovernorKeyed {
    let quota = Quota::with_period(period)
        .expect("a non-zero period")
        .allow_burst(NonZeroU32::new(burst).expect("non-zero"));
    governor::RateLimiter::dashmap(quota)
}

/// The hot key's limits: the largest burst, which a 2^62 ns timeline allows
/// at one permit a second.
const HOT: (u32, Duration) = (u32::MAX, Duration::from_secs(1));

/// The million keys' limits: no key is fresh again within an hour of a check.
const SPREAD: (u32, Duration) = (1 << 20, Duration::from_secs(3_600));

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
    let hot_pair = (
        Arc::new(tollgate_keyed(HOT.0, HOT.1)),
        Arc::new(governor_keyed(HOT.0, HOT.1)),
    );
    let spread_pair = (
        Arc::new(tollgate_keyed(SPREAD.0, SPREAD.1)),
        Arc::new(governor_keyed(SPREAD.0, SPREAD.1)),
    );
    for key in keys.iter() {
        assert!(spread_pair.0.check(key) && spread_pair.1.check(key));
    }
    // Every key owes an hour: none was fresh when an insert swept its bucket.
    assert_eq!(spread_pair.0.len(), KEYS);
    for (spread, hot) in [("hot", true), ("spread", false)] {
        let (tollgate, governor) = if hot { &hot_pair } else { &spread_pair };
        for threads in THREADS {
            let mut group =
                common::threads_group(c, &format!("keyed/{spread}/{threads}t"), threads);
            group.bench_function("tollgate", |b| {
                b.iter_custom(|iters| run(tollgate, &keys, hot, threads, iters))
            });
            group.bench_function("governor", |b| {
                b.iter_custom(|iters| run(governor, &keys, hot, threads, iters))
            });
            group.finish();
        }
    }
    assert_eq!(
        spread_pair.0.len(),
        KEYS,
        "no key may be evicted while timing"
    );
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
    throughput(&mut c);
    c.final_summary();
}
