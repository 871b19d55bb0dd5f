//! The work one keyed check does, counted in instructions rather than timed:
//! tollgate's `Keyed<u64, TokenBucket>` (default hasher, and std's SipHash),
//! governor's dashmap-keyed limiter.
//!
//! Timings of the keyed benches (`cargo bench --bench keyed`) move with
//! whatever else the machine runs; an instruction count under valgrind does
//! not, so this is the number to compare on a shared machine:
//!
//! ```text
//! exe=$(cargo bench --no-run --bench keyed_cost 2>&1 | grep -o 'target/release/deps/keyed_cost-[0-9a-f]*')
//! for n in 1000000 3000000; do
//!   valgrind --tool=callgrind --callgrind-out-file=/dev/null $exe tollgate allow 1 $n
//! done
//! ```
//!
//! The difference of the two totals divided by 2,000,000 is the cost of one
//! check (setup, clock calibration and the prefill cancel out).
//!
//! Arguments: `tollgate | siphash | governor`, `allow | deny`, the number of
//! keys (1 = one hot key), the number of checks. Keys are prefilled first
//! (allow: a burst of `u32::MAX` refilled at 1/s, an hour of it spent per
//! key; deny: one permit per hour, spent), then the checks walk the keys in
//! order; the program asserts that every check got the workload's answer.
//! Without arguments (as a plain `cargo bench` runs it) it runs every
//! contender and workload once on 1,000 keys: the answers checked, nothing
//! measured.

use std::collections::hash_map::RandomState;
use std::hint::black_box;
use std::num::NonZeroU32;
use std::process::ExitCode;

use governor::Quota;
use tollgate::keyed::{BucketConfig, Keyed};
use tollgate::{MonotonicClock, Rate, TokenBucket};

mod common;
use common::counting::key;

type Check = Box<dyn Fn(&u64, u32) -> bool>;

fn contender(name: &str, deny: bool) -> Option<Check> {
    let (burst, rate) = if deny {
        (1, Rate::per_hour(1))
    } else {
        (u32::MAX, Rate::per_second(1))
    };
    let config = BucketConfig::new(burst, rate).ok()?;
    Some(match name {
        "tollgate" => {
            let keyed = Keyed::<u64, TokenBucket>::new(config);
            Box::new(move |k, n| keyed.try_acquire_n(k, n).is_ok())
        }
        "siphash" => {
            let keyed = Keyed::<u64, TokenBucket, RandomState>::with_clock_and_hasher(
                config,
                MonotonicClock::new(),
                RandomState::new(),
            );
            Box::new(move |k, n| keyed.try_acquire_n(k, n).is_ok())
        }
        "governor" => {
            let quota = if deny {
                Quota::per_hour(NonZeroU32::MIN)
            } else {
                Quota::per_second(NonZeroU32::MIN).allow_burst(NonZeroU32::MAX)
            };
            let keyed = governor::RateLimiter::dashmap(quota);
            Box::new(move |k, n| {
                NonZeroU32::new(n).is_some_and(|n| matches!(keyed.check_key_n(k, n), Ok(Ok(()))))
            })
        }
        _ => return None,
    })
}

/// One run: prefill the keys, then `checks` checks walking them in order,
/// each asserted to get the workload's answer.
fn run(check: Check, deny: bool, keys: u64, checks: u64) {
    let keys: Vec<u64> = (0..keys).map(key).collect();
    let prefill = if deny { 1 } else { 3_600 };
    for k in &keys {
        assert!(check(k, prefill), "a fresh key was denied");
    }
    let mut admitted = 0u64;
    for i in 0..checks as usize {
        admitted += u64::from(check(black_box(&keys[i % keys.len()]), 1));
    }
    assert_eq!(
        admitted,
        if deny { 0 } else { checks },
        "a check got the other answer"
    );
}

fn main() -> ExitCode {
    // `cargo bench` adds `--bench`: flags are skipped.
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let usage = "usage: keyed_cost tollgate|siphash|governor allow|deny KEYS CHECKS";
    if args.is_empty() {
        for who in ["tollgate", "siphash", "governor"] {
            for deny in [false, true] {
                run(
                    contender(who, deny).expect("a contender"),
                    deny,
                    1_000,
                    10_000,
                );
            }
        }
        println!("keyed_cost: every contender answered right ({usage})");
        return ExitCode::SUCCESS;
    }
    let [who, workload, keys, checks] = args.as_slice() else {
        eprintln!("{usage}");
        return ExitCode::FAILURE;
    };
    let deny = match workload.as_str() {
        "allow" => false,
        "deny" => true,
        _ => {
            eprintln!("{usage}");
            return ExitCode::FAILURE;
        }
    };
    let (Ok(keys), Ok(checks)) = (keys.parse::<u64>(), checks.parse::<u64>()) else {
        eprintln!("{usage}");
        return ExitCode::FAILURE;
    };
    let Some(check) = contender(who, deny).filter(|_| keys > 0) else {
        eprintln!("{usage}");
        return ExitCode::FAILURE;
    };
    run(check, deny, keys, checks);
    ExitCode::SUCCESS
}
