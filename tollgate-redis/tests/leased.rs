//! The leased limiter on real servers: several OS processes spending leases
//! of one global budget (every lease's debit recorded by its server time and
//! the GCRA invariant checked over all of them, every process's spend checked
//! against its net debits), and the faults: SIGKILL and restart, `CLIENT
//! PAUSE`, `DEBUG SLEEP`, a full-memory server.

mod support;

use std::io::{BufWriter, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tollgate::Rate;
use tollgate_redis::{
    Client, Error, LeaseOptions, LeasedLimiter, Mode, Options, Policy, TokenBucket,
};

use support::RedisServer;
use support::children::run_children;
use support::{gcra_violations, server_and_client};

const PROCESSES: usize = 4;
const THREADS: usize = 2;
const KEY: &str = "global";
/// The global budget: bursts of 20,000, 200,000 per second (5 µs a permit).
const CAPACITY: u32 = 20_000;
const INTERVAL_US: u64 = 5;

fn budget() -> TokenBucket {
    TokenBucket::new("budget", CAPACITY, Rate::per_second(200_000)).unwrap()
}

/// The child: `decisions` decisions on THREADS threads (with
/// `TOLLGATE_LEASE_CHILD_WAIT_EVERY=k`, one in k of the first thread's waits
/// for a lease when it finds the pool cold), then its
/// leases and counts to the output file: `lease <time> <granted> <returned>`
/// lines, then `spent <n> decisions <n> leased <n> returned <n> forfeited <n>
/// calls <n> nanos <n> waits <n>` (the time its threads spent deciding, and
/// the decisions that waited).
#[test]
fn child() {
    let (Ok(url), Ok(out), Ok(decisions)) = (
        std::env::var("TOLLGATE_LEASE_CHILD_URL"),
        std::env::var("TOLLGATE_LEASE_CHILD_OUT"),
        std::env::var("TOLLGATE_LEASE_CHILD_DECISIONS"),
    ) else {
        return; // Not a child.
    };
    let decisions: u64 = decisions.parse().unwrap();
    let wait_every: u64 = std::env::var("TOLLGATE_LEASE_CHILD_WAIT_EVERY")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let options = Options::new().timeout(Duration::from_secs(5));
    let client = runtime
        .block_on(Client::connect_with(&url, options))
        .unwrap();
    let limiter = {
        let _guard = runtime.enter();
        Arc::new(LeasedLimiter::start(
            client,
            budget(),
            KEY,
            LeaseOptions::new()
                .record_leases(true)
                .lifetime(Duration::from_secs(5)),
        ))
    };
    let admitted = Arc::new(AtomicU64::new(0));
    let deciding = Instant::now();
    std::thread::scope(|scope| {
        for t in 0..THREADS {
            let (limiter, admitted) = (limiter.clone(), admitted.clone());
            scope.spawn(move || {
                let mut seed = (std::process::id() as u64) << 8 | t as u64;
                for i in 0..decisions / THREADS as u64 {
                    seed = seed
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let n = (seed >> 40) as u32 % 3 + 1;
                    let decision = if t == 0 && wait_every > 0 && i % wait_every == 0 {
                        limiter.try_acquire_n_blocking(n)
                    } else {
                        limiter.try_acquire_n(n)
                    };
                    match decision {
                        Ok(()) => {
                            admitted.fetch_add(u64::from(n), Ordering::Relaxed);
                        }
                        Err(Error::Denied(_)) => std::hint::spin_loop(),
                        Err(other) => panic!("{other}"),
                    }
                }
            });
        }
    });
    let deciding = deciding.elapsed();
    let mut limiter = Arc::into_inner(limiter).unwrap();
    let stats = runtime.block_on(limiter.shutdown());
    let leases = limiter.leases();
    let mut file = BufWriter::new(std::fs::File::create(out).unwrap());
    for l in &leases {
        writeln!(file, "lease {} {} {}", l.time_us, l.granted, l.returned).unwrap();
    }
    writeln!(
        file,
        "spent {} decisions {} leased {} returned {} forfeited {} calls {} nanos {} waits {}",
        admitted.load(Ordering::Relaxed),
        decisions / THREADS as u64 * THREADS as u64,
        stats.leased,
        stats.returned,
        stats.forfeited,
        stats.redis_calls,
        deciding.as_nanos(),
        stats.waits
    )
    .unwrap();
    file.flush().unwrap();
    assert_eq!(stats.spent, admitted.load(Ordering::Relaxed));
}

#[test]
fn the_checker_catches_violations() {
    assert_eq!(gcra_violations(&[(0, 2), (10, 1)], 2, 10), 0);
    assert_eq!(gcra_violations(&[(0, 2), (5, 1)], 2, 10), 1);
}

fn decisions() -> u64 {
    std::env::var("TOLLGATE_REDIS_DECISIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000)
}

#[test]
fn processes_sharing_leases_never_over_admit() {
    processes_never_over_admit(0);
}

/// The same with one in 64 of each process's first thread's decisions
/// waiting for a lease on a cold pool: what waiters get comes out of the
/// same debited leases.
#[test]
fn processes_waiting_on_cold_leases_never_over_admit() {
    processes_never_over_admit(64);
}

fn processes_never_over_admit(wait_every: u64) {
    let server = RedisServer::start();
    let total = decisions();
    let outputs = run_children(
        &format!("tollgate-lease-mp-{wait_every}"),
        PROCESSES,
        "TOLLGATE_LEASE_CHILD_OUT",
        &[
            ("TOLLGATE_LEASE_CHILD_URL", server.url()),
            ("TOLLGATE_LEASE_CHILD_WAIT_EVERY", wait_every.to_string()),
            (
                "TOLLGATE_LEASE_CHILD_DECISIONS",
                (total / PROCESSES as u64).to_string(),
            ),
        ],
    );
    let mut debits = Vec::new();
    let (mut spent, mut made, mut leased, mut returned, mut forfeited, mut calls, mut waits) =
        (0u64, 0u64, 0u64, 0u64, 0u64, 0u64, 0u64);
    // Decisions per second: each process's own rate, summed (they run
    // side by side).
    let mut per_second = 0f64;
    for lines in &outputs {
        let mut net = 0;
        for line in lines {
            let fields: Vec<&str> = line.split(' ').collect();
            let number = |i: usize| fields[i].parse::<u64>().unwrap();
            if fields[0] == "lease" {
                debits.push((number(1), number(2) - number(3)));
                net += number(2) - number(3);
            } else {
                let child_spent = number(1);
                // Locally exact: a process never spends more than it holds.
                assert!(child_spent <= net, "spent {child_spent} of {net} net");
                spent += child_spent;
                made += number(3);
                leased += number(5);
                returned += number(7);
                forfeited += number(9);
                calls += number(11);
                per_second += number(3) as f64 * 1e9 / number(13).max(1) as f64;
                waits += number(15);
            }
        }
    }
    debits.sort_by_key(|&(time, _)| time);
    let violations = gcra_violations(&debits, CAPACITY.into(), INTERVAL_US);
    let (first, last) = (debits.first().unwrap().0, debits.last().unwrap().0);
    let allowance = u64::from(CAPACITY) + (last - first) / INTERVAL_US;
    let net = leased - returned;
    println!(
        "leased multi-process: {PROCESSES} processes x {THREADS} threads, {made} decisions \
         ({per_second:.0} decisions/s, each process's rate summed), \
         {spent} permits admitted, {} leases ({leased} permits, {returned} returned, \
         {forfeited} forfeited), {calls} Redis calls ({:.2} per 1,000 decisions), \
         {waits} decisions waited for a lease, \
         allowance over the leases' span {allowance}, {violations} GCRA violations, \
         under-admission (debited, never spent) {} = {:.3}% of net debits",
        debits.len(),
        calls as f64 * 1000.0 / made as f64,
        net - spent,
        (net - spent) as f64 * 100.0 / net.max(1) as f64,
    );
    assert!(made >= total - PROCESSES as u64 * THREADS as u64);
    assert_eq!(violations, 0);
    assert!(spent <= net);
    assert!(spent <= allowance);
}

/// A limiter on `server` with a small breaker and a 50 ms timeout, its mode
/// changes counted, once it holds a lease; and the longest decision until
/// then.
async fn faulty(server: &RedisServer, policy: Policy) -> (LeasedLimiter, Duration) {
    let options = Options::new()
        .timeout(Duration::from_millis(50))
        .connect_timeout(Duration::from_millis(100));
    let client = Client::connect_with(&server.url(), options).await.unwrap();
    let limiter = LeasedLimiter::start(
        client,
        budget(),
        KEY,
        LeaseOptions::new()
            .breaker(2, Duration::from_millis(100))
            .lifetime(Duration::from_millis(200))
            .policy(policy),
    );
    let up = drive_until(&limiter, leased_ok).await;
    (limiter, up)
}

/// Drives `limiter` until it holds a lease again, prints the longest
/// decision of the fault `what` (`down`) and after it, and shuts it down.
async fn recovers(mut limiter: LeasedLimiter, what: &str, down: Duration) {
    let back = drive_until(&limiter, leased_ok).await;
    println!("{what}: longest decision while down {down:?}, after {back:?}");
    limiter.shutdown().await;
}

/// Drives decisions until `done` says so (or 20 s: then the test fails),
/// returning the longest single decision.
async fn drive_until(
    limiter: &LeasedLimiter,
    mut done: impl FnMut(&LeasedLimiter, &Result<(), Error>) -> bool,
) -> Duration {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut longest = Duration::ZERO;
    loop {
        let start = Instant::now();
        let result = limiter.try_acquire();
        longest = longest.max(start.elapsed());
        if done(limiter, &result) {
            return longest;
        }
        assert!(Instant::now() < deadline, "never reached: {result:?}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

fn leased_ok(limiter: &LeasedLimiter, result: &Result<(), Error>) -> bool {
    limiter.mode() == Mode::Leased && result.is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_and_restart_degrade_to_the_local_share_and_back() {
    let mut server = RedisServer::start();
    let local = tollgate::TokenBucket::new(5, Rate::per_hour(1)).unwrap();
    let (mut limiter, up) = faulty(&server, Policy::Local(Box::new(local))).await;
    server.kill();
    // Degraded: the pool (debited) first, then exactly the local share of 5.
    let down = drive_until(&limiter, |l, _| l.mode() == Mode::Degraded).await;
    while limiter.pool() > 0 {
        let _ = limiter.try_acquire();
    }
    let local_admitted = (0..100).filter(|_| limiter.try_acquire().is_ok()).count();
    assert!(
        local_admitted <= 5,
        "the local share is 5, admitted {local_admitted}"
    );
    server.restart();
    let back = drive_until(&limiter, leased_ok).await;
    println!(
        "SIGKILL: longest decision up {up:?}, while down {down:?}, after restart {back:?}; \
         local admitted {local_admitted} of 100"
    );
    let stats = limiter.shutdown().await;
    assert!(stats.degraded_decisions >= 100);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_pause_fails_closed_within_the_timeout() {
    let server = RedisServer::start();
    let (limiter, _) = faulty(&server, Policy::Closed).await;
    let _: () = server.cmd(&["CLIENT", "PAUSE", "3000", "ALL"]);
    let down = drive_until(&limiter, |l, r| {
        l.mode() == Mode::Degraded && l.pool() == 0 && matches!(r, Err(Error::Unavailable))
    })
    .await;
    let _: () = server.cmd(&["CLIENT", "UNPAUSE"]);
    recovers(limiter, "CLIENT PAUSE (closed)", down).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debug_sleep_fails_open_and_recovers() {
    let server = RedisServer::start_with(&["--enable-debug-command", "local"]);
    let (limiter, _) = faulty(&server, Policy::Open).await;
    let url = server.url();
    let sleeper = std::thread::spawn(move || {
        let mut admin = redis::Client::open(url).unwrap().get_connection().unwrap();
        let _: () = redis::cmd("DEBUG")
            .arg("SLEEP")
            .arg("3")
            .query(&mut admin)
            .unwrap();
    });
    let down = drive_until(&limiter, |l, r| l.mode() == Mode::Degraded && r.is_ok()).await;
    sleeper.join().unwrap();
    recovers(limiter, "DEBUG SLEEP (open)", down).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_memory_server_degrades_and_recovers() {
    let server = RedisServer::start_with(&["--maxmemory-policy", "noeviction"]);
    let (limiter, _) = faulty(&server, Policy::Closed).await;
    // Drop the key so that the next lease must write a new one.
    let _: () = server.cmd(&["CONFIG", "SET", "maxmemory", "1"]);
    let _: i64 = server.cmd(&["DEL", "tollgate:budget:{global}:tb"]);
    let down = drive_until(&limiter, |l, r| {
        l.mode() == Mode::Degraded && matches!(r, Err(Error::Unavailable))
    })
    .await;
    let _: () = server.cmd(&["CONFIG", "SET", "maxmemory", "0"]);
    recovers(limiter, "maxmemory noeviction (closed)", down).await;
}

#[tokio::test(flavor = "current_thread")]
async fn bad_requests_are_errors_and_shutdown_returns_unused_permits() {
    let (server, client) = server_and_client().await;
    // A budget that refills slowly, so the lease's debit is still pending
    // at shutdown.
    let slow = TokenBucket::new("budget", 1_000, Rate::per_hour(1_000)).unwrap();
    let mut limiter =
        LeasedLimiter::start(client, slow, KEY, LeaseOptions::new().initial_lease(100));
    assert!(matches!(
        limiter.try_acquire_n(0),
        Err(Error::Denied(tollgate::Denied::ZeroPermits))
    ));
    assert!(matches!(
        limiter.try_acquire_n(CAPACITY + 1),
        Err(Error::Denied(tollgate::Denied::ExceedsCapacity { .. }))
    ));
    let done = AtomicBool::new(false);
    while !done.load(Ordering::Relaxed) {
        if limiter.pool() > 0 {
            done.store(true, Ordering::Relaxed);
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert!(limiter.try_acquire().is_ok());
    // The only client: the lease is the budget's last debit, so everything
    // unspent goes back exactly.
    let stats = limiter.shutdown().await;
    assert_eq!(stats.spent, 1);
    assert_eq!(stats.forfeited, 0);
    assert_eq!(stats.returned, stats.leased - 1);
    let state: Option<String> = server.cmd(&["GET", "tollgate:budget:{global}:tb"]);
    let time: Vec<String> = server.cmd(&["TIME"]);
    let now = time[0].parse::<u64>().unwrap() * 1_000_000 + time[1].parse::<u64>().unwrap();
    // One permit spent: the TAT is one interval (3.6 s) past the lease time.
    let tat: u64 = state
        .unwrap()
        .strip_prefix("tb2:")
        .unwrap()
        .parse()
        .unwrap();
    assert!(tat <= now + 3_600_000 && tat + 3_600_000 - 1_000_000 > now);
}
