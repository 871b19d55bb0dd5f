//! The scenarios replay: the traffic of Jianfeng Fu's "Throttling Solutions in
//! Standalone and Distributed Scenarios" (Alibaba Cloud Community blog, §3.1)
//! through every limiter on a manual clock, and each limiter timed on real
//! threads. The articles are listed in `docs/references.md`.
//!
//! ```text
//! cargo run --release --example scenarios
//! ```
//!
//! Every limiter is configured as "100 per minute" and sees the same arrivals.
//! The replay is deterministic (a `ManualClock` set to each arrival time), so the
//! admitted counts and the sliding maxima are the same on every machine; only the
//! checks-per-second columns depend on the hardware.
//!
//! A new limiter joins the table with one entry in [`LIMITERS`].

use std::sync::Barrier;
use std::time::{Duration, Instant};

use tollgate::{
    ApproxSlidingWindow, FixedWindow, LeakyBucket, LockingApproxSlidingWindow, LockingFixedWindow,
    LockingLeakyBucket, LockingShaper, LockingSlidingLog, LockingSlidingWindow, LockingTokenBucket,
    LockingWarmUp, ManualClock, MonotonicClock, Rate, RateLimiter, Shaper, SlidingLog,
    SlidingWindow, TokenBucket, WarmUp,
};

type Limiter = Box<dyn RateLimiter + Send + Sync>;

/// One limiter type, built two ways: on a manual clock for the replay, and on the
/// default clock for the real-thread measurement. The two constructors come from
/// one expression (see `limiter!`), so the two can never be configured apart.
struct Entry {
    name: &'static str,
    manual: fn(Rate, ManualClock) -> Limiter,
    real: fn(Rate, MonotonicClock) -> Limiter,
}

/// `limiter!("Name", |rate, clock| Name::with_clock(.., clock))`: an [`Entry`]
/// whose constructors both run that expression, each with its own clock type.
/// The expression turns "`rate.permits()` per `rate.period()`" into the limiter's
/// own configuration (a token bucket's capacity, say).
macro_rules! limiter {
    ($name:literal, |$rate:ident, $clock:ident| $build:expr) => {
        Entry {
            name: $name,
            manual: |$rate: Rate, $clock: ManualClock| -> Limiter {
                Box::new($build.expect(concat!($name, ": invalid configuration")))
            },
            real: |$rate: Rate, $clock: MonotonicClock| -> Limiter {
                Box::new($build.expect(concat!($name, ": invalid configuration")))
            },
        }
    };
}

/// Every limiter in the crate, atomic ones followed by their locking twins.
/// Token buckets get a burst capacity of one period's permits, so "100 per
/// minute" means capacity 100 refilled at 100 a minute.
const LIMITERS: &[Entry] = &[
    limiter!("TokenBucket", |rate, clock| {
        TokenBucket::with_clock(rate.permits(), rate, clock)
    }),
    limiter!("LockingTokenBucket", |rate, clock| {
        LockingTokenBucket::with_clock(rate.permits(), rate, clock)
    }),
    limiter!("FixedWindow", |rate, clock| {
        FixedWindow::with_clock(rate, clock)
    }),
    limiter!("LockingFixedWindow", |rate, clock| {
        LockingFixedWindow::with_clock(rate, clock)
    }),
    limiter!("SlidingLog", |rate, clock| SlidingLog::with_clock(
        rate, clock
    )),
    limiter!("LockingSlidingLog", |rate, clock| {
        LockingSlidingLog::with_clock(rate, clock)
    }),
    limiter!("SlidingWindow", |rate, clock| {
        SlidingWindow::with_clock(rate, clock)
    }),
    limiter!("LockingSlidingWindow", |rate, clock| {
        LockingSlidingWindow::with_clock(rate, clock)
    }),
    limiter!("ApproxSlidingWindow", |rate, clock| {
        ApproxSlidingWindow::with_clock(rate, clock)
    }),
    limiter!("LockingApproxSlidingWindow", |rate, clock| {
        LockingApproxSlidingWindow::with_clock(rate, clock)
    }),
    // A meter of the same size as the token bucket: it makes the same decisions.
    limiter!("LeakyBucket", |rate, clock| {
        LeakyBucket::with_clock(rate.permits(), rate, clock)
    }),
    limiter!("LockingLeakyBucket", |rate, clock| {
        LockingLeakyBucket::with_clock(rate.permits(), rate, clock)
    }),
    // nginx `limit_req` with no burst and no queue: one request per 1/rate.
    limiter!("Shaper", |rate, clock| {
        Shaper::with_clock(rate, 0, Duration::ZERO, clock)
    }),
    limiter!("LockingShaper", |rate, clock| {
        LockingShaper::with_clock(rate, 0, Duration::ZERO, clock)
    }),
    // Guava's SmoothWarmingUp: starts cold, reaches the full rate after a period.
    limiter!("WarmUp", |rate, clock| {
        WarmUp::with_clock(rate, rate.period(), clock)
    }),
    limiter!("LockingWarmUp", |rate, clock| {
        LockingWarmUp::with_clock(rate, rate.period(), clock)
    }),
];

/// The limit every scenario is played against.
const LIMIT: Rate = Rate::per_minute(100);

const SECOND: u64 = 1_000_000_000;

/// A traffic pattern: when each single-permit request arrives, in nanoseconds
/// from the limiter's construction.
struct Scenario {
    name: &'static str,
    arrivals: Vec<u64>,
}

/// `count` requests, one every `gap` ns, the first at `start`.
fn evenly(start: u64, gap: u64, count: u64) -> impl Iterator<Item = u64> {
    (0..count).map(move |i| start + i * gap)
}

/// Fu's article §3.1, "critical mutation": some requests at 0:00, then 10 a
/// second from 0:50 to 1:10, which straddles the minute boundary.
fn boundary(name: &'static str, at_zero: u64) -> Scenario {
    let mut arrivals: Vec<u64> = std::iter::repeat_n(0, at_zero as usize).collect();
    arrivals.extend(evenly(50 * SECOND, SECOND / 10, 200));
    Scenario { name, arrivals }
}

fn scenarios() -> Vec<Scenario> {
    vec![
        // Fu's article §3.1: 200 a minute, evenly spread, against 100 a minute.
        Scenario {
            name: "steady",
            arrivals: evenly(0, 60 * SECOND / 200, 5 * 200).collect(),
        },
        // The article's "several visits" at 0:00: the first window still has room
        // when the 0:50 traffic starts, so both sides of 1:00 fill up.
        boundary("boundary", 5),
        // A full burst at 0:00 instead: the worst case for a token bucket, which
        // refills while idle and lets nearly a second full burst through before 1:00.
        boundary("burst+boundary", 100),
    ]
}

/// Replays `arrivals` one permit at a time, setting the manual clock to each
/// arrival first, and returns the decision times of the admitted requests.
fn replay(entry: &Entry, arrivals: &[u64]) -> Vec<u64> {
    let clock = ManualClock::new();
    let limiter = (entry.manual)(LIMIT, clock.clone());
    let mut admitted = Vec::new();
    for &t in arrivals {
        clock.set(t);
        if limiter.try_acquire().is_ok() {
            admitted.push(t);
        }
    }
    admitted
}

/// The most admissions in any half-open window `[t, t + length)`, over all `t`.
///
/// Some maximal window starts at an admission (slide any window right until its
/// left edge meets one, losing nothing), so a two-pointer sweep over the sorted
/// times is exact: for each admission `j`, `first` is the earliest admission less
/// than `length` before it.
fn busiest_window(sorted: &[u64], length: u64) -> usize {
    let mut first = 0;
    let mut best = 0;
    for (j, &t) in sorted.iter().enumerate() {
        while t - sorted[first] >= length {
            first += 1;
        }
        best = best.max(j + 1 - first);
    }
    best
}

/// Each thread count hammers the limiter for `TRIALS` runs of `TRIAL` and keeps
/// the best: the machine may be shared, and a descheduled thread says nothing
/// about the limiter.
const TRIAL: Duration = Duration::from_millis(100);
const TRIALS: u32 = 2;

/// 65,536 per 100 µs (655 million a second) with a burst of 65,536: far more
/// than any thread can ask for, so every check is admitted and writes the shared
/// state — the allow path, the expensive one. The limit is kept small because a
/// log-based limiter holds one timestamp per permit of its limit.
const ALLOW_HEAVY: Rate = Rate::new(65_536, Duration::from_micros(100));

/// Millions of checks per second, all threads together, on one shared limiter
/// built with the default clock (best of `TRIALS`); also how many checks were
/// denied and made, over all trials.
///
/// A few denials are expected: a thread descheduled between its clock read and
/// its CAS comes back with a reading older than the state by more than the
/// burst allows, and a stale reading may only deny (docs/algorithms.md).
fn throughput(entry: &Entry, threads: usize) -> (f64, u64, u64) {
    let limiter = (entry.real)(ALLOW_HEAVY, MonotonicClock::new());
    let mut best = 0.0f64;
    let (mut all_checks, mut all_denied) = (0, 0);
    for _ in 0..TRIALS {
        let (checks, admitted, elapsed) = trial(&*limiter, threads);
        best = best.max(checks as f64 / elapsed.as_secs_f64() / 1e6);
        all_checks += checks;
        all_denied += checks - admitted;
    }
    (best, all_denied, all_checks)
}

/// `threads` threads checking `limiter` for `TRIAL`, started together: total
/// checks, total admitted, and the longest thread's run time.
fn trial(limiter: &(dyn RateLimiter + Sync), threads: usize) -> (u64, u64, Duration) {
    let start = Barrier::new(threads);
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    start.wait();
                    let began = Instant::now();
                    let (mut checks, mut admitted) = (0u64, 0u64);
                    loop {
                        // Batches keep the deadline check off the measured path.
                        for _ in 0..1024 {
                            admitted += u64::from(limiter.try_acquire().is_ok());
                        }
                        checks += 1024;
                        let elapsed = began.elapsed();
                        if elapsed >= TRIAL {
                            return (checks, admitted, elapsed);
                        }
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("worker panicked"))
            .fold((0, 0, Duration::ZERO), |(c, a, e), (wc, wa, we)| {
                (c + wc, a + wa, e.max(we))
            })
    })
}

fn main() {
    // Calibrates quanta's TSC clock now, not inside the first measurement.
    let _ = MonotonicClock::new();
    let window = u64::try_from(LIMIT.period().as_nanos()).expect("a one-minute window");
    let scenarios = scenarios();

    println!(
        "tollgate scenarios replay: every limiter at {} per {:?}, replayed on a manual clock\n",
        LIMIT.permits(),
        LIMIT.period()
    );
    println!(
        "{:<26} {:<15} {:>8} {:>8} {:>11} {:>11} {:>11}",
        "limiter", "scenario", "requests", "admitted", "max in 60s", "1 thr M/s", "2 thr M/s"
    );
    println!("{}", "-".repeat(96));
    let mut denied_while_timing = Vec::new();
    for entry in LIMITERS {
        let (one, denied_one, checks_one) = throughput(entry, 1);
        let (two, denied_two, checks_two) = throughput(entry, 2);
        // A trace of denials is expected (see `throughput`); more than this
        // means the configuration is not allow-heavy for this limiter.
        let share = 100.0 * (denied_one + denied_two) as f64 / (checks_one + checks_two) as f64;
        if share > 1.0 {
            denied_while_timing.push(format!("{} {share:.1}%", entry.name));
        }
        for (i, scenario) in scenarios.iter().enumerate() {
            let admitted = replay(entry, &scenario.arrivals);
            let (one, two) = if i == 0 {
                (format!("{one:.1}"), format!("{two:.1}"))
            } else {
                (String::new(), String::new())
            };
            let row = format!(
                "{:<26} {:<15} {:>8} {:>8} {:>11} {:>11} {:>11}",
                if i == 0 { entry.name } else { "" },
                scenario.name,
                scenario.arrivals.len(),
                admitted.len(),
                busiest_window(&admitted, window),
                one,
                two,
            );
            println!("{}", row.trim_end());
        }
    }
    println!("{}", "-".repeat(96));
    println!(
        "\
steady          200 requests a minute, evenly spaced (one every 300 ms), for 5 minutes
boundary        5 requests at 0:00, then 10 a second from 0:50 to 1:10 (Fu's article §3.1)
burst+boundary  100 requests at 0:00, then the same 10 a second from 0:50 to 1:10
max in 60s      most admissions in ANY 60-second span [t, t+60s), not just aligned
                minutes. Bounds: token bucket and leaky bucket capacity + rate x
                60 s = 200; fixed window 100 per aligned minute, so up to 200
                across a boundary; sliding log exactly 100; striped sliding window
                100 in any 10 consecutive aligned 6 s sub-windows;
                approximate window: an estimate, no hard bound; shaper one per
                600 ms; warm-up starts cold (slower) and reaches the rate after 60 s.
M/s             millions of checks per second, all threads together, on one shared
                limiter on the default (TSC) clock, through `dyn RateLimiter`, best
                of {} runs of {} ms, allow path: a check is denied only if its thread
                was descheduled between reading the clock and deciding. Measured once
                per limiter; the criterion benches give the careful numbers.",
        TRIALS,
        TRIAL.as_millis()
    );
    if !denied_while_timing.is_empty() {
        println!(
            "warning: over 1% of timed checks denied, so these rates mix in the deny path: {}",
            denied_while_timing.join(", ")
        );
    }
}
