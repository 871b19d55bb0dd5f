//! Several OS processes hammer the same keys of one real server; every
//! admission is recorded by the server time its script returned, and each
//! limiter's invariant is checked over all of them afterwards.
//!
//! The parent test re-executes this test binary as its children (the `child`
//! test, which does nothing unless the parent's environment names a job).
//! Decisions per limiter: `TOLLGATE_REDIS_DECISIONS` (default 250,000, so one
//! run of the suite makes 10^6 across the four limiters).

mod support;

use std::collections::BTreeMap;
use std::io::{BufWriter, Write};
use std::time::Duration;

use tollgate::Rate;
use tollgate_redis::{
    ApproxSlidingWindow, Client, Error, FixedWindow, Limiter, SlidingLog, TokenBucket,
};

use support::RedisServer;
use support::children::run_children;

const PROCESSES: usize = 4;
const TASKS_PER_PROCESS: usize = 4;
const KEYS: [&str; 2] = ["hot:a", "hot:b"];
const MAX_N: u32 = 3;

/// The limiters under test, by name: short windows, so that the run crosses
/// many boundaries and both admits and denies.
fn limiter(kind: &str) -> Box<dyn Limiter> {
    match kind {
        // 10 at once, one per 200 µs.
        "token_bucket" => Box::new(
            TokenBucket::new("bucket", 10, Rate::new(5, Duration::from_millis(1))).unwrap(),
        ),
        "fixed_window" => {
            Box::new(FixedWindow::new("window", Rate::new(40, Duration::from_millis(7))).unwrap())
        }
        "sliding_window" => Box::new(
            ApproxSlidingWindow::new("approx", Rate::new(40, Duration::from_millis(7))).unwrap(),
        ),
        "sliding_log" => {
            Box::new(SlidingLog::new("log", Rate::new(25, Duration::from_millis(5))).unwrap())
        }
        other => panic!("unknown limiter {other}"),
    }
}

/// One admission: which key, when (server µs), how many permits.
#[derive(Debug, Clone, Copy)]
struct Record {
    key: usize,
    time: u64,
    n: u64,
}

/// The child's job: hammer the keys, write every admission to the output file
/// and the counts to the last line.
#[test]
fn child() {
    let (Ok(url), Ok(kind), Ok(out), Ok(decisions)) = (
        std::env::var("TOLLGATE_REDIS_CHILD_URL"),
        std::env::var("TOLLGATE_REDIS_CHILD_KIND"),
        std::env::var("TOLLGATE_REDIS_CHILD_OUT"),
        std::env::var("TOLLGATE_REDIS_CHILD_DECISIONS"),
    ) else {
        return; // Not a child: nothing to do.
    };
    let decisions: usize = decisions.parse().unwrap();
    let runtime = support::runtime();
    let records = runtime.block_on(async move {
        let options = tollgate_redis::Options::new().timeout(Duration::from_secs(5));
        let client = Client::connect_with(&url, options).await.unwrap();
        let limiter: std::sync::Arc<dyn Limiter> = limiter(&kind).into();
        let tasks: Vec<_> = (0..TASKS_PER_PROCESS)
            .map(|task| {
                let (client, limiter) = (client.clone(), limiter.clone());
                tokio::spawn(async move {
                    let mut admitted = Vec::new();
                    let mut seed = (std::process::id() as u64) << 8 | task as u64;
                    for i in 0..decisions / TASKS_PER_PROCESS {
                        seed = seed
                            .wrapping_mul(6364136223846793005)
                            .wrapping_add(1442695040888963407);
                        let key = (seed >> 33) as usize % KEYS.len();
                        let n = (seed >> 40) as u32 % MAX_N + 1;
                        match client.try_acquire_n(&*limiter, KEYS[key], n).await {
                            Ok(admission) => admitted.push(Record {
                                key,
                                time: admission.time_us,
                                n: n.into(),
                            }),
                            Err(Error::Denied(_)) => {}
                            Err(other) => panic!("decision {i}: {other}"),
                        }
                    }
                    admitted
                })
            })
            .collect();
        support::joined(tasks).await
    });
    let mut file = BufWriter::new(std::fs::File::create(out).unwrap());
    for r in &records {
        writeln!(file, "{} {} {}", r.key, r.time, r.n).unwrap();
    }
    file.flush().unwrap();
}

fn decisions_per_limiter() -> usize {
    std::env::var("TOLLGATE_REDIS_DECISIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(250_000)
}

/// Runs the children for one limiter and returns the admissions per key,
/// sorted by time.
fn hammer(server: &RedisServer, kind: &str, decisions: usize) -> Vec<Vec<Record>> {
    let outputs = run_children(
        &format!("tollgate-redis-mp-{kind}"),
        PROCESSES,
        "TOLLGATE_REDIS_CHILD_OUT",
        &[
            ("TOLLGATE_REDIS_CHILD_URL", server.url()),
            ("TOLLGATE_REDIS_CHILD_KIND", kind.to_owned()),
            (
                "TOLLGATE_REDIS_CHILD_DECISIONS",
                (decisions / PROCESSES).to_string(),
            ),
        ],
    );
    let mut per_key = vec![Vec::new(); KEYS.len()];
    for line in outputs.iter().flatten() {
        let mut fields = line.split(' ').map(|f| f.parse::<u64>().unwrap());
        let (key, time, n) = (
            fields.next().unwrap(),
            fields.next().unwrap(),
            fields.next().unwrap(),
        );
        per_key[key as usize].push(Record {
            key: key as usize,
            time,
            n,
        });
    }
    for records in &mut per_key {
        records.sort_by_key(|r| r.time);
    }
    per_key
}

/// GCRA: in any `[a, b]`, at most `capacity + (b − a)/interval`, checked as
/// `permits·I − (b − a) ≤ capacity·I` over all pairs in one pass.
fn token_bucket_violations(records: &[Record], capacity: u64, interval: u64) -> usize {
    let mut violations = 0;
    let mut before = 0u64; // permits before record j
    // The min over i <= j of S_{i-1}·I − t_i, and its i.
    let mut lowest: Option<(i128, usize)> = None;
    for (j, r) in records.iter().enumerate() {
        let b = i128::from(before) * i128::from(interval) - i128::from(r.time);
        if lowest.is_none_or(|(l, _)| b < l) {
            lowest = Some((b, j));
        }
        before += r.n;
        let a = i128::from(before) * i128::from(interval) - i128::from(r.time);
        let (low, i) = lowest.unwrap();
        if a - low > i128::from(capacity) * i128::from(interval) {
            if violations < 3 {
                let shown: Vec<_> = records[i..=j]
                    .iter()
                    .take(40)
                    .map(|r| (r.time, r.n))
                    .collect();
                println!("token bucket violation over records {i}..={j}: {shown:?}");
            }
            violations += 1;
        }
    }
    violations
}

/// Fixed window: at most `limit` per aligned window.
fn fixed_window_violations(records: &[Record], limit: u64, window: u64) -> usize {
    let mut per_window = BTreeMap::new();
    for r in records {
        *per_window.entry(r.time / window).or_insert(0) += r.n;
    }
    per_window.values().filter(|&&count| count > limit).count()
}

/// Sliding log: at most `limit` stamps in any `[t, t + window)`.
fn sliding_log_violations(records: &[Record], limit: u64, window: u64) -> usize {
    let mut violations = 0;
    let (mut start, mut inside) = (0, 0u64);
    for (end, r) in records.iter().enumerate() {
        inside += r.n;
        while records[start].time + window <= r.time {
            inside -= records[start].n;
            start += 1;
        }
        // Every window containing `r` as its last stamp holds at most this many.
        if inside > limit && (end + 1 == records.len() || records[end + 1].time != r.time) {
            violations += 1;
        }
    }
    violations
}

/// Sliding window counter: for every admission at `e` into window `k`,
/// `p·(T − e) + (permits in k up to it)·T ≤ N·T`.
fn sliding_window_violations(records: &[Record], limit: u64, window: u64) -> usize {
    let mut totals = BTreeMap::new();
    for r in records {
        *totals.entry(r.time / window).or_insert(0u64) += r.n;
    }
    let mut violations = 0;
    let mut current = (u64::MAX, 0u64);
    for (i, r) in records.iter().enumerate() {
        let k = r.time / window;
        if current.0 != k {
            current = (k, 0);
        }
        current.1 += r.n;
        // Ties are checked once, after all of them: the last one saw them all.
        if i + 1 < records.len() && records[i + 1].time == r.time {
            continue;
        }
        let p = k
            .checked_sub(1)
            .and_then(|prev| totals.get(&prev))
            .copied()
            .unwrap_or(0);
        let elapsed = r.time - k * window;
        let weighed = u128::from(p) * u128::from(window - elapsed)
            + u128::from(current.1) * u128::from(window);
        if weighed > u128::from(limit) * u128::from(window) {
            violations += 1;
        }
    }
    violations
}

#[test]
fn processes_sharing_keys_never_break_an_invariant() {
    let server = RedisServer::start();
    let decisions = decisions_per_limiter();
    let mut total_decisions = 0;
    let mut total_violations = 0;
    for kind in [
        "token_bucket",
        "fixed_window",
        "sliding_window",
        "sliding_log",
    ] {
        let per_key = hammer(&server, kind, decisions);
        let admitted: u64 = per_key.iter().flatten().map(|r| r.n).sum();
        let violations: usize = per_key
            .iter()
            .map(|records| match kind {
                "token_bucket" => token_bucket_violations(records, 10, 200),
                "fixed_window" => fixed_window_violations(records, 40, 7_000),
                "sliding_window" => sliding_window_violations(records, 40, 7_000),
                _ => sliding_log_violations(records, 25, 5_000),
            })
            .sum();
        let made = decisions / PROCESSES / TASKS_PER_PROCESS * PROCESSES * TASKS_PER_PROCESS;
        println!(
            "multi-process {kind}: {PROCESSES} processes x {TASKS_PER_PROCESS} tasks, {made} decisions, \
             {admitted} permits admitted on {} keys, {violations} violations",
            KEYS.len()
        );
        assert!(admitted > 0, "{kind}: nothing admitted");
        total_decisions += made;
        total_violations += violations;
    }
    println!("multi-process: {total_decisions} decisions in total, {total_violations} violations");
    assert_eq!(total_violations, 0);
}

#[test]
fn the_checkers_catch_violations() {
    let at = |time, n| Record { key: 0, time, n };
    // Bucket of 2, one per 10 µs: 3 at once is one too many.
    assert_eq!(token_bucket_violations(&[at(0, 2), at(10, 1)], 2, 10), 0);
    assert_eq!(token_bucket_violations(&[at(0, 2), at(5, 1)], 2, 10), 1);
    assert_eq!(
        fixed_window_violations(&[at(0, 2), at(9, 1), at(10, 2)], 2, 10),
        1
    );
    assert_eq!(
        sliding_log_violations(&[at(0, 1), at(5, 1), at(10, 1)], 2, 10),
        0
    );
    assert_eq!(
        sliding_log_violations(&[at(0, 1), at(5, 1), at(9, 1)], 2, 10),
        1
    );
    // Limit 2 per 10: 2 at the end of window 0 weigh 1 at 5 µs into window 1.
    assert_eq!(sliding_window_violations(&[at(9, 2), at(15, 1)], 2, 10), 0);
    assert_eq!(sliding_window_violations(&[at(9, 2), at(15, 2)], 2, 10), 1);
}
