//! tollgate's keyed limiter against governor's dashmap-keyed limiter, in one
//! run, at 1, 2 and 4 threads, and the bytes each keeps per key.
//!
//! Groups `keyed_<spread>/<workload>/<threads>t`:
//!
//! - spread **hot**: every thread checks the same key (one shard, one word:
//!   the contended case; governor's threads also share the lock word of its
//!   dashmap shard, tollgate's each claim a reader slot on a line of their
//!   own while the shard is biased); **spread**: a million keys are inserted
//!   before timing; thread `t` walks them (scattered over the hash space)
//!   from its own offset (the cache-missing case);
//! - workload **allow**: a burst of `u32::MAX` refilled at 1/s, an hour's
//!   worth spent per key by the prefill, so every check admits and writes and
//!   no key is fresh (evictable) again for an hour; **deny**: one permit per
//!   hour, spent by the prefill, so every check is denied; **limit**: each
//!   key refilled at half the rate the allow-heavy checks reach it (one
//!   permit per `P` ns, `P` twice the allow-heavy time between two checks of
//!   one key at that thread count, measured first in the same process; a
//!   burst of 1 ms of refill, at least one permit), emptied by the prefill,
//!   so checks race for each permit as it comes and about half are admitted
//!   (the share is printed). The harness asserts every allow and deny answer,
//!   and that the map kept every key.
//!
//! Functions: `tollgate` (`Keyed<u64, TokenBucket>`, its default
//! `KeyHasher`), `tollgate_siphash` (the same on std's `RandomState`: the
//! hasher's share) and `governor` (`RateLimiter::dashmap`, std's
//! `RandomState`), all on their default TSC clocks.
//!
//! Groups `keyed_flood/allow/<threads>t`: every check brings a key never seen
//! before, to limiters already holding a million keys in use (tollgate at its
//! cap; governor has none and grows).
//!
//! One criterion iteration is one check on each thread, timed from the first
//! thread's start to the last one's end, so elements/s is total checks per
//! second.
//!
//! The keyed sliding log and sliding window are in `benches/keyed_kinds.rs`.
//!
//! Before the timed groups, the binary prints the bytes allocated per key with
//! a million `u64` keys for each kind and for governor, counted by this
//! binary's global allocator.

use std::collections::hash_map::RandomState;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use criterion::Criterion;
use governor::Quota;
use tollgate::keyed::{BucketConfig, Keyed, MeterConfig, ShaperConfig, WarmUpConfig, WindowConfig};
use tollgate::{
    FixedWindow, LeakyBucket, LockingFixedWindow, LockingTokenBucket, LockingWarmUp, ManualClock,
    MonotonicClock, Rate, Shaper, TokenBucket, WarmUp,
};

mod common;
use common::THREADS;
use common::counting::{Counting, key};
use common::keyed::{
    Check, GovernorKeyed, KEYS, check_keys, governor_row, keyed_bytes_per_key, print_bytes_per_key,
};

#[global_allocator]
static GLOBAL: Counting = Counting;

fn keys() -> Arc<Vec<u64>> {
    Arc::new((0..KEYS as u64).map(key).collect())
}

/// What every check of a group answers.
#[derive(Clone, Copy, PartialEq)]
enum Workload {
    /// A burst of `u32::MAX` at one permit per second: every check admits
    /// and writes its key's word.
    Allow,
    /// One permit per hour, spent by the prefill: every check is denied.
    Deny,
    /// One permit per the given period per key, 1 ms of burst (at least
    /// one), spent by the prefill: the offered load about twice the rate.
    Limit(Duration),
}

impl Workload {
    fn name(self) -> &'static str {
        match self {
            Workload::Allow => "allow",
            Workload::Deny => "deny",
            Workload::Limit(_) => "limit",
        }
    }

    /// (burst, refill rate). A burst of `u32::MAX` takes the per-second
    /// rate: an hourly one would overflow capacity × time per permit.
    fn quota(self) -> (u32, Rate) {
        match self {
            Workload::Allow => (u32::MAX, Rate::per_second(1)),
            Workload::Deny => (1, Rate::per_hour(1)),
            Workload::Limit(period) => (limit_burst(period), Rate::new(1, period)),
        }
    }

    /// What the prefill spends per key: an hour of refill, so no key is full
    /// (fresh, evictable) again during setup or timing, however slow the
    /// machine; the map keeps every key.
    fn prefill(self) -> u32 {
        match self {
            Workload::Allow => 3_600,
            Workload::Deny => 1,
            // Empty from the start: at the limit from the first check.
            Workload::Limit(period) => limit_burst(period),
        }
    }
}

/// 1 ms of refill at one permit per `period`, at least one permit.
fn limit_burst(period: Duration) -> u32 {
    (1_000_000 / period.as_nanos().max(1)).clamp(1, u128::from(u32::MAX)) as u32
}

fn bucket_config(workload: Workload) -> BucketConfig {
    let (burst, rate) = workload.quota();
    BucketConfig::new(burst, rate).expect("valid")
}

fn tollgate_keyed(workload: Workload) -> Keyed<u64, TokenBucket> {
    Keyed::new(bucket_config(workload))
}

/// The same limiter on std's SipHash `RandomState`: the map's share of the
/// difference without the hasher's.
fn tollgate_keyed_siphash(workload: Workload) -> Keyed<u64, TokenBucket, RandomState> {
    Keyed::with_clock_and_hasher(
        bucket_config(workload),
        MonotonicClock::new(),
        RandomState::new(),
    )
}

fn governor_keyed(workload: Workload) -> GovernorKeyed {
    // The same quota as `Workload::quota`.
    let quota = match workload {
        Workload::Allow => Quota::per_second(NonZeroU32::MIN).allow_burst(NonZeroU32::MAX),
        Workload::Deny => Quota::per_hour(NonZeroU32::MIN),
        Workload::Limit(period) => Quota::with_period(period)
            .expect("a non-zero period")
            .allow_burst(NonZeroU32::new(limit_burst(period)).expect("at least one")),
    };
    governor::RateLimiter::dashmap(quota)
}

/// `iters` checks on each of `threads` threads, thread `t` from its own offset
/// into `keys` (or all on the hot key); returns the wall time and the checks
/// admitted. Asserts that every check got the workload's answer (allow and
/// deny; at the limit, only that no more were admitted than checked).
fn run<L: Check>(
    limiter: &Arc<L>,
    keys: &Arc<Vec<u64>>,
    hot: bool,
    workload: Workload,
    threads: usize,
    iters: u64,
) -> (Duration, u64) {
    // Each run starts where the last one stopped, so that the samples walk
    // all the keys. Starting every run at the same offset made a sample touch
    // only its first `iters` keys — a working set that criterion sizes by
    // the contender's speed (a faster one runs more iterations, touches more
    // keys and misses the cache more), so the million-key ratios moved with
    // the iteration counts rather than with the limiters.
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    // Relaxed: a position, not a publication.
    let base = NEXT.fetch_add(iters as usize, Ordering::Relaxed);
    let run = common::run_threads(threads, false, |t| {
        let (limiter, keys) = (Arc::clone(limiter), Arc::clone(keys));
        let offset = (base + t * keys.len() / threads) % keys.len();
        move || check_keys(&*limiter, &keys, hot, offset, iters)
    });
    let checks = iters * threads as u64;
    match workload {
        Workload::Allow => assert_eq!(run.count, checks, "an allow-heavy check was denied"),
        Workload::Deny => assert_eq!(run.count, 0, "a deny-heavy check was admitted"),
        Workload::Limit(_) => assert!(run.count <= checks),
    }
    (run.wall, run.count)
}

/// The per-key period at which the checks of `threads` threads (all on the
/// hot key, or spread over every key) offer about twice the rate: twice the
/// allow-heavy time between two checks of one key, measured on `allow`.
fn limit_period<L: Check>(
    allow: &Arc<L>,
    keys: &Arc<Vec<u64>>,
    hot: bool,
    threads: usize,
) -> Duration {
    let iters = 2_000_000 / threads as u64;
    let (wall, _) = run(allow, keys, hot, Workload::Allow, threads, iters);
    let ns_per_check = wall.as_nanos() as f64 / (iters * threads as u64) as f64;
    let keys_walked = if hot { 1.0 } else { keys.len() as f64 };
    let period = Duration::from_nanos((2.0 * ns_per_check * keys_walked).ceil().max(1.0) as u64);
    eprintln!(
        "keyed limit rate at {threads}t ({}): one permit per {period:?} per key (allow-heavy: {:.1} M checks/s)",
        if hot { "hot" } else { "spread" },
        1e3 / ns_per_check
    );
    period
}

/// Benchmarks `function` on `limiter` in group `name`, printing the share
/// admitted at the limit.
fn bench_keyed<L: Check>(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    function: &str,
    limiter: &Arc<L>,
    (keys, hot, workload, threads): (&Arc<Vec<u64>>, bool, Workload, usize),
) {
    let (mut admitted, mut checks) = (0u64, 0u64);
    group.bench_function(function, |b| {
        b.iter_custom(|iters| {
            let (wall, count) = run(limiter, keys, hot, workload, threads, iters);
            admitted += count;
            checks += iters * threads as u64;
            wall
        })
    });
    if matches!(workload, Workload::Limit(_)) && checks > 0 {
        eprintln!(
            "{name}/{function}: {:.3}% of {checks} checks admitted",
            100.0 * admitted as f64 / checks as f64
        );
    }
}

/// The three limiters every keyed group compares, built for one workload
/// and prefilled with every key.
struct Contenders {
    tollgate: Arc<Keyed<u64, TokenBucket>>,
    siphash: Arc<Keyed<u64, TokenBucket, RandomState>>,
    governor: Arc<GovernorKeyed>,
}

impl Contenders {
    fn new(keys: &[u64], workload: Workload) -> Self {
        let contenders = Contenders {
            tollgate: Arc::new(tollgate_keyed(workload)),
            siphash: Arc::new(tollgate_keyed_siphash(workload)),
            governor: Arc::new(governor_keyed(workload)),
        };
        prefill(&*contenders.tollgate, keys, workload);
        prefill(&*contenders.siphash, keys, workload);
        prefill(&*contenders.governor, keys, workload);
        contenders
    }

    /// Group `keyed_<spread>/<workload>/<threads>t` over the three.
    fn bench(
        &self,
        c: &mut Criterion,
        keys: &Arc<Vec<u64>>,
        spread: &str,
        hot: bool,
        workload: Workload,
        threads: usize,
    ) {
        let name = format!("keyed_{spread}/{}/{threads}t", workload.name());
        let mut group = common::threads_group(c, &name, threads);
        let args = (keys, hot, workload, threads);
        bench_keyed(&mut group, &name, "tollgate", &self.tollgate, args);
        bench_keyed(&mut group, &name, "tollgate_siphash", &self.siphash, args);
        bench_keyed(&mut group, &name, "governor", &self.governor, args);
        group.finish();
    }

    /// Asserts that the map kept every key.
    fn assert_kept_every_key(&self) {
        assert_eq!(self.tollgate.len(), KEYS, "no key may be evicted");
        assert_eq!(self.siphash.len(), KEYS, "no key may be evicted");
    }
}

/// Inserts every key, spending the workload's prefill (see
/// [`Workload::prefill`]).
fn prefill<L: Check>(limiter: &L, keys: &[u64], workload: Workload) {
    for key in keys {
        assert!(
            limiter.spend(key, workload.prefill()),
            "a fresh key was denied"
        );
    }
}

/// Groups `keyed_<spread>/<workload>/<threads>t`.
fn throughput(c: &mut Criterion) {
    let keys = keys();
    for workload in [Workload::Allow, Workload::Deny] {
        let contenders = Contenders::new(&keys, workload);
        for (spread, hot) in [("hot", true), ("spread", false)] {
            for threads in THREADS {
                contenders.bench(c, &keys, spread, hot, workload, threads);
            }
        }
        contenders.assert_kept_every_key();
    }
}

/// Groups `keyed_<spread>/limit/<threads>t`: each (spread, thread count) at
/// its own measured rate, so fresh limiters per group, emptied by the
/// prefill.
fn at_the_limit(c: &mut Criterion) {
    let keys = keys();
    let allow = Arc::new(tollgate_keyed(Workload::Allow));
    prefill(&*allow, &keys, Workload::Allow);
    for (spread, hot) in [("hot", true), ("spread", false)] {
        for threads in THREADS {
            let workload = Workload::Limit(limit_period(&allow, &keys, hot, threads));
            let contenders = Contenders::new(&keys, workload);
            contenders.bench(c, &keys, spread, hot, workload, threads);
            contenders.assert_kept_every_key();
        }
    }
}

/// Groups `keyed_flood/allow/<threads>t`: every check brings a key never
/// seen before, to a limiter already holding `KEYS` keys that are all in use.
/// tollgate is at its cap (`max_keys` = `KEYS`): each new key sweeps part of
/// its shard for room, finds none, and is decided by the shared overflow
/// state, so memory stays put. governor has no cap: it inserts every key,
/// and its map grows by every check timed (and is dropped after the group).
fn flood(c: &mut Criterion) {
    let keys = keys();
    for threads in THREADS {
        let tollgate = Arc::new(tollgate_keyed(Workload::Allow).with_max_keys(KEYS));
        let governor = Arc::new(governor_keyed(Workload::Allow));
        prefill(&*tollgate, &keys, Workload::Allow);
        prefill(&*governor, &keys, Workload::Allow);
        // Every check of the group, over all its samples, takes the next
        // number: no key repeats.
        let next = Arc::new(AtomicU64::new(KEYS as u64));
        let mut group = common::threads_group(c, &format!("keyed_flood/allow/{threads}t"), threads);
        group.bench_function("tollgate", |b| {
            b.iter_custom(|iters| flood_run(&tollgate, &next, threads, iters))
        });
        group.bench_function("governor", |b| {
            b.iter_custom(|iters| flood_run(&governor, &next, threads, iters))
        });
        group.finish();
        assert_eq!(tollgate.len(), KEYS, "the cap holds under the flood");
    }
}

fn flood_run<L: Check>(
    limiter: &Arc<L>,
    next: &Arc<AtomicU64>,
    threads: usize,
    iters: u64,
) -> Duration {
    let run = common::run_threads(threads, false, |_| {
        let limiter = Arc::clone(limiter);
        let first = next.fetch_add(iters, Ordering::Relaxed);
        move || {
            (first..first + iters)
                .map(|i| u64::from(limiter.check(&key(i))))
                .sum()
        }
    });
    assert_eq!(
        run.count,
        iters * threads as u64,
        "a flood check was denied"
    );
    run.wall
}

fn memory() {
    let bucket = || BucketConfig::new(10, Rate::per_second(10)).expect("valid");
    let window = || WindowConfig::new(Rate::per_second(10)).expect("valid");
    let meter = || MeterConfig::new(10, Rate::per_second(10)).expect("valid");
    let shaper = || ShaperConfig::new(Rate::per_second(10), 0, Duration::ZERO).expect("valid");
    let warm_up =
        || WarmUpConfig::new(Rate::per_second(10), Duration::from_secs(1)).expect("valid");
    let rows = [
        (
            "tollgate TokenBucket",
            keyed_bytes_per_key::<TokenBucket<ManualClock>>(bucket),
        ),
        (
            "tollgate LockingTokenBucket",
            keyed_bytes_per_key::<LockingTokenBucket<ManualClock>>(bucket),
        ),
        (
            "tollgate FixedWindow",
            keyed_bytes_per_key::<FixedWindow<ManualClock>>(window),
        ),
        (
            "tollgate LockingFixedWindow",
            keyed_bytes_per_key::<LockingFixedWindow<ManualClock>>(window),
        ),
        (
            "tollgate LeakyBucket (meter)",
            keyed_bytes_per_key::<LeakyBucket<ManualClock>>(meter),
        ),
        (
            "tollgate Shaper (two words)",
            keyed_bytes_per_key::<Shaper<ManualClock>>(shaper),
        ),
        (
            "tollgate WarmUp (two words)",
            keyed_bytes_per_key::<WarmUp<ManualClock>>(warm_up),
        ),
        (
            "tollgate LockingWarmUp",
            keyed_bytes_per_key::<LockingWarmUp<ManualClock>>(warm_up),
        ),
        (
            "tollgate (TokenBucket, TokenBucket)",
            keyed_bytes_per_key::<(TokenBucket<ManualClock>, TokenBucket<ManualClock>)>(|| {
                (bucket(), bucket())
            }),
        ),
        governor_row(Quota::per_second(NonZeroU32::new(10).expect("non-zero"))),
    ];
    print_bytes_per_key(&rows, 38);
}

fn main() {
    memory();
    common::run_groups(&[throughput, at_the_limit, flood]);
}
