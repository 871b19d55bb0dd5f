//! tollgate's keyed token bucket against governor's keyed limiter in
//! **paired, interleaved rounds**: a ratio per round, then the median.
//!
//! ```text
//! cargo bench --bench keyed_paired -- [ROUNDS] [MILLISECONDS]
//! ```
//!
//! Why: on a shared VM the million-key groups of `cargo bench --bench keyed`
//! move by up to 1.8× from one run to the next, for both crates (they are
//! bound by memory latency, which neighbours on the host change), more than
//! the ratio between them. criterion times each contender for seconds, one
//! after the other, so a drift between them lands in the ratio. Here both
//! maps are built once and kept; each round runs tollgate and governor for a
//! few milliseconds each, in alternating order, on the same keys and the same
//! threads, and yields one ratio; slow drift cancels in it.
//!
//! Workloads as in the bench: **allow** (a burst of `u32::MAX` refilled at
//! 1/s, an hour of it spent per key first: every check admits and writes,
//! no key is ever fresh) and **deny** (one permit per hour, spent first:
//! every check is denied); a **hot** key (every thread on key 0) and **1 M**
//! keys (each thread walks them from its own offset); 1 and 2 threads. Every
//! answer is checked. Output: the median ratio of checks per second
//! (tollgate ÷ governor, above 1: tollgate faster), its interquartile range,
//! and each contender's median M checks/s.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use governor::Quota;
use governor::state::keyed::DefaultKeyedStateStore;
use governor::{DefaultKeyedRateLimiter, RateLimiter, clock::DefaultClock};
use tollgate::keyed::{BucketConfig, Keyed};
use tollgate::{Rate, TokenBucket};

/// splitmix64: distinct, scattered keys (as `benches/keyed.rs`).
fn key(i: u64) -> u64 {
    let mut z = i.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

struct Pair {
    tollgate: Keyed<u64, TokenBucket>,
    governor: DefaultKeyedRateLimiter<u64>,
    deny: bool,
}

impl Pair {
    fn new(deny: bool, keys: &[u64]) -> Pair {
        let (burst, rate, quota) = if deny {
            (1, Rate::per_hour(1), Quota::per_hour(NonZeroU32::MIN))
        } else {
            (
                u32::MAX,
                Rate::per_second(1),
                Quota::per_second(NonZeroU32::MIN).allow_burst(NonZeroU32::MAX),
            )
        };
        let config = BucketConfig::new(burst, rate).expect("a valid configuration");
        let pair = Pair {
            tollgate: Keyed::new(config).with_max_keys(keys.len().max(1)),
            governor: RateLimiter::<u64, DefaultKeyedStateStore<u64>, DefaultClock>::dashmap(quota),
            deny,
        };
        let prefill = if deny { 1 } else { 3_600 };
        for k in keys {
            assert!(pair.check(true, k, prefill), "tollgate denied a fresh key");
            assert!(pair.check(false, k, prefill), "governor denied a fresh key");
        }
        pair
    }

    #[inline]
    fn check(&self, tollgate: bool, k: &u64, n: u32) -> bool {
        if tollgate {
            self.tollgate.try_acquire_n(k, n).is_ok()
        } else {
            let n = NonZeroU32::new(n).expect("n > 0");
            matches!(self.governor.check_key_n(k, n), Ok(Ok(())))
        }
    }

    /// Checks per second of one contender over `run`, with `threads` threads
    /// walking `keys` from their own offsets.
    fn rate(&self, tollgate: bool, keys: &[u64], threads: usize, run: Duration) -> f64 {
        let stop = AtomicBool::new(false);
        let total = AtomicU64::new(0);
        let start = Instant::now();
        std::thread::scope(|scope| {
            for t in 0..threads {
                let (stop, total) = (&stop, &total);
                scope.spawn(move || {
                    let mut i = t * keys.len() / threads;
                    let mut done = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        for _ in 0..256 {
                            i = if i + 1 == keys.len() { 0 } else { i + 1 };
                            let admitted = self.check(tollgate, black_box(&keys[i]), 1);
                            assert_eq!(admitted, !self.deny, "a check got the other answer");
                        }
                        done += 256;
                    }
                    total.fetch_add(done, Ordering::Relaxed);
                });
            }
            std::thread::sleep(run);
            stop.store(true, Ordering::Relaxed);
        });
        total.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
    }
}

fn quartiles(mut values: Vec<f64>) -> (f64, f64, f64) {
    values.sort_by(f64::total_cmp);
    let at = |q: f64| values[((values.len() - 1) as f64 * q).round() as usize];
    (at(0.25), at(0.5), at(0.75))
}

fn main() {
    // `cargo bench` adds `--bench`: flags are skipped.
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .map(|a| a.parse().expect("ROUNDS and MILLISECONDS are numbers"))
        .collect();
    let rounds = args.first().copied().unwrap_or(21) as usize;
    let run = Duration::from_millis(args.get(1).copied().unwrap_or(150));
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    println!(
        "{cpu}, {cores} logical CPUs; {rounds} rounds of {} ms per contender\n",
        run.as_millis()
    );
    println!(
        "| case | threads | tollgate ÷ governor (median) | IQR | tollgate M/s | governor M/s |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    let million: Vec<u64> = (0..1_000_000).map(key).collect();
    let hot = vec![key(0)];
    for deny in [false, true] {
        for (name, keys) in [("hot key", &hot), ("1 M keys", &million)] {
            let pair = Pair::new(deny, keys);
            for threads in [1, 2] {
                let (mut ratios, mut ours, mut theirs) = (Vec::new(), Vec::new(), Vec::new());
                for round in 0..rounds {
                    // Alternate which contender runs first.
                    let (t, g) = if round % 2 == 0 {
                        let t = pair.rate(true, keys, threads, run);
                        (t, pair.rate(false, keys, threads, run))
                    } else {
                        let g = pair.rate(false, keys, threads, run);
                        (pair.rate(true, keys, threads, run), g)
                    };
                    ratios.push(t / g);
                    ours.push(t / 1e6);
                    theirs.push(g / 1e6);
                }
                let (q1, median, q3) = quartiles(ratios);
                println!(
                    "| {name}, {} | {threads} | {median:.2}× | {q1:.2}–{q3:.2}× | {:.1} | {:.1} |",
                    if deny { "deny" } else { "allow" },
                    quartiles(ours).1,
                    quartiles(theirs).1,
                );
            }
        }
    }
}
