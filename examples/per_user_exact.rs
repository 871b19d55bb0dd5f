//! Exact per-user limits (the scenario of "Redis-based dynamic rate control":
//! a third-party API that silently drops calls over 30 a minute per user):
//! a keyed sliding log, four threads of callers, simulated time, and the
//! rule raised from 30 to 60 a minute halfway through without losing the
//! log. A second rule, 5 a second, is enforced from the same log throughout
//! (several rules on one log). Afterwards the admissions are replayed and the
//! most admitted for one user in any 60-second window is printed, for
//! windows under the old rule, across the change and under the new one, and
//! in any 1-second window.
//!
//! ```text
//! cargo run --release --example per_user_exact
//! ```
//!
//! Time is a `ManualClock` stepped by the main thread in lock-step rounds of
//! 100 ms (four simulated minutes), so the run is as exact on a loaded
//! machine as on a quiet one; the threads race each other for real within a
//! round, and the rule change races them too.

use std::collections::HashMap;
use std::sync::{Arc, Barrier, Mutex};
use std::time::Duration;

use tollgate::LogConfig;
use tollgate::keyed::{Carry, Keyed};
use tollgate::{Clock, ManualClock, Rate, SlidingLog};

const THREADS: usize = 4;
const USERS: u64 = 50;
const ROUND: Duration = Duration::from_millis(100);
const ROUNDS: usize = 2_400; // four minutes
const CHANGE_AT: usize = ROUNDS / 2; // two minutes
const REQUESTS_PER_ROUND: u64 = 20; // per thread: ~16 per user per second

fn main() {
    let clock = ManualClock::new();
    let rules = |per_minute| {
        LogConfig::new(Rate::per_minute(per_minute))
            .and_then(|c| c.with_rule(Rate::per_second(5)))
            .expect("valid")
    };
    let per_user = Arc::new(Keyed::<u64, SlidingLog<ManualClock>>::with_clock(
        rules(30),
        clock.clone(),
    ));
    let admitted: Arc<Mutex<Vec<(u64, u64)>>> = Arc::default();
    let start = Arc::new(Barrier::new(THREADS + 1));
    let end = Arc::new(Barrier::new(THREADS + 1));
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let (per_user, admitted, clock) =
                (Arc::clone(&per_user), Arc::clone(&admitted), clock.clone());
            let (start, end) = (Arc::clone(&start), Arc::clone(&end));
            std::thread::spawn(move || {
                let mut seed = 0x9E37_79B9_7F4A_7C15_u64.wrapping_mul(t as u64 + 1);
                for _ in 0..ROUNDS {
                    start.wait();
                    let now = clock.now();
                    let mut mine = Vec::new();
                    for _ in 0..REQUESTS_PER_ROUND {
                        seed ^= seed << 13;
                        seed ^= seed >> 7;
                        seed ^= seed << 17;
                        let user = seed % USERS;
                        if per_user.try_acquire(&user).is_ok() {
                            mine.push((user, now));
                        }
                    }
                    admitted.lock().expect("no panic").extend(mine);
                    end.wait();
                }
            })
        })
        .collect();
    for round in 0..ROUNDS {
        clock.set(round as u64 * ROUND.as_nanos() as u64);
        start.wait();
        if round == CHANGE_AT {
            // While the callers run: every user's log is carried over, the
            // stamps of the last minute kept; the 5-a-second rule stays.
            per_user.reconfigure(rules(60), Carry::Additive);
        }
        end.wait();
    }
    for worker in workers {
        worker.join().expect("no panic");
    }

    let change = CHANGE_AT as u64 * ROUND.as_nanos() as u64;
    let minute = 60_000_000_000u64;
    let mut by_user: HashMap<u64, Vec<u64>> = HashMap::new();
    for (user, at) in admitted.lock().expect("no panic").iter() {
        by_user.entry(*user).or_default().push(*at);
    }
    // For each user, the most admitted in any window [t, t + 60 s), by where
    // the window lies: before the change, across it, after it.
    let mut worst = [0usize; 3];
    let mut worst_second = 0;
    let mut total = 0;
    println!("user  admitted  max/60s before (30)  across  after (60)");
    let mut users: Vec<_> = by_user.into_iter().collect();
    users.sort();
    for (user, mut stamps) in users {
        stamps.sort_unstable();
        total += stamps.len();
        let mut max = [0usize; 3];
        for (i, &t) in stamps.iter().enumerate() {
            let inside = stamps[i..].partition_point(|&s| s < t + minute);
            let class = if t + minute <= change {
                0
            } else if t < change {
                1
            } else {
                2
            };
            max[class] = max[class].max(inside);
            let in_second = stamps[i..].partition_point(|&s| s < t + 1_000_000_000);
            worst_second = worst_second.max(in_second);
        }
        if user < 5 {
            println!(
                "{user:>4}  {:>8}  {:>19}  {:>6}  {:>10}",
                stamps.len(),
                max[0],
                max[1],
                max[2]
            );
        }
        for (w, m) in worst.iter_mut().zip(max) {
            *w = (*w).max(m);
        }
    }
    println!(" ...");
    println!(
        "all {USERS} users, {total} admitted in 4 min: max per user in any 60 s window: \
         {} before the change (rule 30), {} across it, {} after it (rule 60); \
         in any 1 s window: {worst_second} (rule 5)",
        worst[0], worst[1], worst[2]
    );
    assert!(worst_second <= 5, "over 5 a second");
    assert!(worst[0] <= 30, "over 30 a minute under the 30 rule");
    assert!(worst[1] <= 60 && worst[2] <= 60, "over 60 a minute");
    // Exact, not just safe: demand was far above the limits.
    assert_eq!(
        (worst[0], worst[2], worst_second),
        (30, 60, 5),
        "the limits were not reached"
    );
}
