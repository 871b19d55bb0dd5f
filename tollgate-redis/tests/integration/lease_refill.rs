//! The leased limiter's refills on a real server: a cold pool waits for one
//! lease call shared by every waiter instead of refusing, and with the budget
//! exhausted the refill task calls Redis about once per retry-after the
//! script returns, however many requests it refuses meanwhile.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tollgate::{Denied, Rate};
use tollgate_redis::{
    Attempt, Client, Error, LeaseOptions, LeaseStats, LeasedLimiter, Options, TokenBucket,
};

use support::RedisServer;

/// Script calls the server has run: `FCALL` (or `EVALSHA` and `EVAL`).
fn script_calls(server: &RedisServer) -> u64 {
    server.script_calls()
}

async fn client(server: &RedisServer) -> Client {
    // A generous timeout: these tests count calls, and a loaded machine must
    // not turn a slow reply into a failure.
    let options = Options::new().timeout(Duration::from_secs(2));
    Client::connect_with(&server.url(), options).await.unwrap()
}

/// Client options whose calls and connections both time out after `timeout`.
fn timing_out_after(timeout: Duration) -> Options {
    Options::new().timeout(timeout).connect_timeout(timeout)
}

/// Polls `limiter` until `done` holds (or 20 s: then the test fails).
async fn until(limiter: &LeasedLimiter, done: impl Fn(&LeaseStats) -> bool) -> LeaseStats {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let stats = limiter.stats();
        if done(&stats) {
            return stats;
        }
        assert!(Instant::now() < deadline, "never reached: {stats:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn retry_after(result: &Result<(), Error>) -> Duration {
    match result {
        Err(Error::Denied(Denied::RetryAfter(wait))) => *wait,
        other => panic!("expected a retry-after, got {other:?}"),
    }
}

/// A 10/s bucket with a burst of 2, hammered for 5 s by two threads deciding
/// synchronously, one thread blocking on cold pools and two tasks waiting on
/// them: every script call the server runs is counted. Each call either finds
/// the budget exhausted and returns a wait, or grants at least one permit
/// (and the grant that takes the last permit says when the next is due);
/// either way no call follows before that wait is over. The bound: two calls
/// per emission interval (the longest wait the script returns) over the
/// window, plus the burst and a constant for the calls in flight at its ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exhausted_budget_is_called_once_per_retry_after() {
    exhausted_budget(1, 2, 1, 2).await;
}

/// The same bound per limiter for three limiters (three processes' worth)
/// on one exhausted budget, each hammered by a thread and a waiting task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limiters_sharing_an_exhausted_budget_each_call_once_per_retry_after() {
    exhausted_budget(3, 1, 0, 1).await;
}

async fn exhausted_budget(limiters: usize, sync_threads: usize, blocking: usize, tasks: usize) {
    let server = RedisServer::start();
    let bucket = TokenBucket::new("bucket", 2, Rate::per_second(10)).unwrap();
    let interval = bucket.emission_interval();
    let mut shared = Vec::new();
    for _ in 0..limiters {
        shared.push(Arc::new(LeasedLimiter::start(
            client(&server).await,
            bucket.clone(),
            "exhausted",
            LeaseOptions::new(),
        )));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let admitted = Arc::new(AtomicU64::new(0));
    let longest_wait = Arc::new(AtomicU64::new(0));
    let tally = |result: Result<(), Error>, admitted: &AtomicU64, longest: &AtomicU64| match result
    {
        Ok(()) => {
            admitted.fetch_add(1, Ordering::Relaxed);
        }
        Err(Error::Denied(Denied::RetryAfter(wait))) => {
            longest.fetch_max(wait.as_nanos() as u64, Ordering::Relaxed);
        }
        Err(other) => panic!("{other}"),
    };
    let mut threads = Vec::new();
    let mut spawned = Vec::new();
    for limiter in &shared {
        for blocks in (0..sync_threads + blocking).map(|i| i >= sync_threads) {
            let (limiter, stop, admitted, longest) = (
                limiter.clone(),
                stop.clone(),
                admitted.clone(),
                longest_wait.clone(),
            );
            threads.push(std::thread::spawn(move || {
                let mut decisions = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let result = if blocks {
                        limiter.try_acquire_n_blocking(1)
                    } else {
                        limiter.try_acquire()
                    };
                    tally(result, &admitted, &longest);
                    decisions += 1;
                }
                decisions
            }));
        }
        for _ in 0..tasks {
            let (limiter, stop, admitted, longest) = (
                limiter.clone(),
                stop.clone(),
                admitted.clone(),
                longest_wait.clone(),
            );
            spawned.push(tokio::spawn(async move {
                let mut decisions = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    tally(limiter.try_acquire_n_waiting(1).await, &admitted, &longest);
                    decisions += 1;
                    // Leave the workers to the refill tasks now and then.
                    tokio::task::yield_now().await;
                }
                decisions
            }));
        }
    }
    let sum = |stats: &[LeaseStats], field: fn(&LeaseStats) -> u64| -> u64 {
        stats.iter().map(field).sum()
    };
    let all_stats = |shared: &[Arc<LeasedLimiter>]| -> Vec<LeaseStats> {
        shared.iter().map(|l| l.stats()).collect()
    };
    // The burst goes at once; the window starts with the budget exhausted.
    let deadline = Instant::now() + Duration::from_secs(20);
    while sum(&all_stats(&shared), |s| s.spent) < 3 {
        assert!(Instant::now() < deadline, "the budget was never spent");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (calls_before, stats_before, window) =
        (script_calls(&server), all_stats(&shared), Instant::now());
    tokio::time::sleep(Duration::from_secs(5)).await;
    // The limiter counts a lease call when its reply is in, after the
    // server counted it: reading the limiters first at the end means every
    // call they count was counted by the server too.
    let (stats_after, calls_after, window) =
        (all_stats(&shared), script_calls(&server), window.elapsed());
    stop.store(true, Ordering::Relaxed);
    let mut decisions = 0;
    for thread in threads {
        decisions += thread.join().unwrap();
    }
    for task in spawned {
        decisions += task.await.unwrap();
    }
    let calls = calls_after - calls_before;
    let lease_calls = sum(&stats_after, |s| s.lease_calls) - sum(&stats_before, |s| s.lease_calls);
    let exhausted =
        sum(&stats_after, |s| s.exhausted_leases) - sum(&stats_before, |s| s.exhausted_leases);
    let waits = window.as_nanos().div_ceil(interval.as_nanos()) as u64;
    let bound = limiters as u64 * (2 * waits + 4) + 2;
    let mut stats = Vec::new();
    for limiter in shared {
        stats.push(Arc::into_inner(limiter).unwrap().shutdown().await);
    }
    println!(
        "exhausted budget (10/s, burst 2), {limiters} limiter(s), each with {sync_threads} \
         sync thread(s), {blocking} blocking thread(s) and {tasks} waiting task(s), for \
         {window:?}: {decisions} decisions, {calls} script calls ({lease_calls} lease calls, \
         {exhausted} found the budget exhausted; bound {bound}), {} permits admitted, {} waited \
         for a lease, longest retry-after {:?}",
        sum(&stats, |s| s.spent),
        sum(&stats, |s| s.waits),
        Duration::from_nanos(longest_wait.load(Ordering::Relaxed)),
    );
    assert!(
        calls <= bound,
        "{calls} script calls in {window:?}, bound {bound}"
    );
    // At the start the order cannot help: a call the server counted before
    // the window whose reply came in after it is the limiter's and not the
    // server's. Each limiter has at most one lease call in flight.
    assert!(
        lease_calls <= calls + limiters as u64,
        "{lease_calls} lease calls counted by {limiters} limiter(s), {calls} by the server"
    );
    // The refusals carried a wait no longer than the script's (one interval
    // for one permit), and nothing was spent that was not leased.
    assert!(Duration::from_nanos(longest_wait.load(Ordering::Relaxed)) <= interval);
    assert_eq!(sum(&stats, |s| s.spent), admitted.load(Ordering::Relaxed));
    for s in &stats {
        assert!(s.spent <= s.leased);
    }
}

/// After 3 s idle the pool has expired (lifetime 1 s) and the budget is
/// unused: the first requests find the pool cold, wait, and are admitted, and
/// the eight that wait together share one lease call (the lease is sized to
/// cover them: the measured size, halved by the idle spell, is 32).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_pool_waits_for_one_lease_shared_by_its_waiters() {
    let server = RedisServer::start();
    let bucket = TokenBucket::new("bucket", 1_000, Rate::per_second(1_000)).unwrap();
    let limiter = Arc::new(LeasedLimiter::start(
        client(&server).await,
        bucket,
        "cold",
        LeaseOptions::new()
            .initial_lease(64)
            .lifetime(Duration::from_secs(1)),
    ));
    until(&limiter, |s| s.leases == 1).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    // Expired and emptied (given back, or forfeited if the budget's key
    // expired first: a full bucket either way): the next request would be
    // refused by the local pool alone.
    let before = limiter.stats();
    assert_eq!(before.returned + before.forfeited, 64, "{before:?}");
    let mut waits = Vec::new();
    for i in 0..8 {
        match limiter.try_acquire_n_or_wait(1) {
            Attempt::Waiting(wait) => waits.push(tokio::spawn(wait)),
            // A later request may find the lease already in.
            Attempt::Decided(decision) => {
                assert!(i > 0, "the first request after idle must wait");
                assert!(decision.is_ok(), "{decision:?}");
            }
        }
    }
    let waiters = waits.len() as u64;
    for wait in waits {
        let decision = wait.await.unwrap();
        assert!(decision.is_ok(), "a cold request was refused: {decision:?}");
    }
    let after = limiter.stats();
    assert_eq!(after.lease_calls - before.lease_calls, 1);
    assert_eq!(after.leases - before.leases, 1);
    assert_eq!(after.waits - before.waits, waiters);
    assert_eq!(after.spent, 8);
    Arc::into_inner(limiter).unwrap().shutdown().await;
}

/// The budget drained behind the limiter's back: the first cold request
/// waits for one lease call, which finds the budget exhausted, and gets the
/// script's retry-after; every cold request after it, async, blocking or
/// synchronous, gets a retry-after at once without a call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_request_on_an_exhausted_budget_gets_the_retry_after_without_calls() {
    let server = RedisServer::start();
    // 10 s a permit: the retry-after stays in the future for the whole test.
    let bucket = TokenBucket::new("bucket", 3, Rate::per_minute(6)).unwrap();
    let interval = bucket.emission_interval();
    let client = client(&server).await;
    let limiter = Arc::new(LeasedLimiter::start(
        client.clone(),
        bucket.clone(),
        "drained",
        LeaseOptions::new()
            .initial_lease(1)
            .lifetime(Duration::from_millis(200)),
    ));
    // The first lease (1 of 3) expires and goes back exactly.
    until(&limiter, |s| s.leases == 1 && s.returned == 1).await;
    client.try_acquire_n(&bucket, "drained", 3).await.unwrap();
    let before = limiter.stats();

    let first = limiter.try_acquire_n_waiting(1).await;
    let wait = retry_after(&first);
    let after_first = limiter.stats();
    assert_eq!(after_first.lease_calls - before.lease_calls, 1);
    assert_eq!(after_first.exhausted_leases - before.exhausted_leases, 1);
    assert_eq!(after_first.waits - before.waits, 1);
    // The script's wait, counted from the reply: no shorter than what the
    // script says a moment later (1 ms for the two clocks), and at most
    // one emission interval.
    let later = retry_after(&client.try_acquire(&bucket, "drained").await.map(drop));
    assert!(
        wait + Duration::from_millis(1) >= later,
        "{wait:?} < {later:?}"
    );
    assert!(wait <= interval, "{wait:?}");

    let calls = script_calls(&server);
    assert!(matches!(
        limiter.try_acquire_n_or_wait(1),
        Attempt::Decided(Err(Error::Denied(Denied::RetryAfter(_))))
    ));
    for n in 1..=3 {
        let waited = retry_after(&limiter.try_acquire_n_waiting(n).await);
        // The first permit when the script said, each further one an
        // interval later.
        assert!(waited <= wait + interval * (n - 1), "{waited:?}");
        assert!(waited > interval * (n - 1), "{waited:?}");
        retry_after(&limiter.try_acquire_n(n));
        let blocking = limiter.clone();
        retry_after(
            &tokio::task::spawn_blocking(move || blocking.try_acquire_n_blocking(n))
                .await
                .unwrap(),
        );
    }
    assert_eq!(script_calls(&server), calls);
    let end = limiter.stats();
    assert_eq!(end.lease_calls, after_first.lease_calls);
    assert_eq!(end.waits, after_first.waits);
    assert_eq!(end.spent, 0);
    Arc::into_inner(limiter).unwrap().shutdown().await;
}

/// A frozen server (SIGSTOP): a cold request waits for the lease call, which
/// times out, and gets the policy's decision (`Closed`: unavailable) — async
/// and blocking — long before the breaker opens; after the server thaws,
/// cold requests are admitted again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_request_during_an_outage_gets_the_policy() {
    let server = RedisServer::start();
    let options = timing_out_after(Duration::from_millis(100));
    let client = Client::connect_with(&server.url(), options).await.unwrap();
    let bucket = TokenBucket::new("bucket", 1_000, Rate::per_second(1_000)).unwrap();
    let limiter = Arc::new(LeasedLimiter::start(
        client,
        bucket,
        "outage",
        LeaseOptions::new()
            .lifetime(Duration::from_millis(200))
            .breaker(100, Duration::from_secs(1)),
    ));
    until(&limiter, |s| {
        s.leases == 1 && s.returned + s.forfeited == s.leased
    })
    .await;
    server.pause();
    let waited = limiter.try_acquire_n_waiting(1).await;
    let blocking = limiter.clone();
    let blocked = tokio::task::spawn_blocking(move || blocking.try_acquire_n_blocking(1))
        .await
        .unwrap();
    server.resume();
    assert!(matches!(waited, Err(Error::Unavailable)), "{waited:?}");
    assert!(matches!(blocked, Err(Error::Unavailable)), "{blocked:?}");
    let stats = limiter.stats();
    assert_eq!(stats.waits, 2);
    assert_eq!(stats.spent, 0);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        tokio::time::sleep(Duration::from_millis(300)).await;
        if limiter.try_acquire_n_waiting(1).await.is_ok() {
            break;
        }
        assert!(Instant::now() < deadline, "never admitted after the outage");
    }
    Arc::into_inner(limiter).unwrap().shutdown().await;
}

/// The latency of the first request after the pool expired, through the
/// waiting path (async, and blocking on a plain thread), next to one
/// per-decision script call after the same idle spell on the same server.
/// A measurement, not a check: run by hand with `--ignored --nocapture`
/// (figures in docs/benchmarks.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: run with --ignored --nocapture"]
async fn first_request_after_idle_latency() {
    let server = RedisServer::start();
    let client = client(&server).await;
    let bucket = TokenBucket::new("bucket", 1_000, Rate::per_second(1_000)).unwrap();
    let lifetime = Duration::from_millis(300);
    let idle = lifetime + Duration::from_millis(200);
    let limiter = Arc::new(LeasedLimiter::start(
        client.clone(),
        bucket.clone(),
        "idle",
        LeaseOptions::new().lifetime(lifetime),
    ));
    until(&limiter, |s| s.leases == 1).await;
    client.try_acquire(&bucket, "direct").await.unwrap();
    let trials = 10;
    let (mut waiting, mut blocking, mut direct) = (Vec::new(), Vec::new(), Vec::new());
    for trial in 0..trials {
        // On a worker, as a server's handler runs.
        tokio::time::sleep(idle).await;
        let on_worker = limiter.clone();
        let (decision, took) = tokio::spawn(async move {
            let start = Instant::now();
            (on_worker.try_acquire_n_waiting(1).await, start.elapsed())
        })
        .await
        .unwrap();
        waiting.push(took);
        assert!(decision.is_ok(), "trial {trial}: {decision:?}");

        tokio::time::sleep(idle).await;
        let limiter = limiter.clone();
        let (decision, took) = std::thread::spawn(move || {
            let start = Instant::now();
            (limiter.try_acquire_n_blocking(1), start.elapsed())
        })
        .join()
        .unwrap();
        blocking.push(took);
        assert!(decision.is_ok(), "trial {trial}: {decision:?}");

        tokio::time::sleep(idle).await;
        let (on_worker, bucket) = (client.clone(), bucket.clone());
        direct.push(
            tokio::spawn(async move {
                let start = Instant::now();
                on_worker.try_acquire(&bucket, "direct").await.unwrap();
                start.elapsed()
            })
            .await
            .unwrap(),
        );
    }
    let summary = |name: &str, samples: &mut Vec<Duration>| {
        samples.sort();
        format!(
            "{name}: p50 {:?}, max {:?}",
            samples[samples.len() / 2],
            samples[samples.len() - 1]
        )
    };
    println!(
        "first request after {idle:?} idle ({trials} trials each, lifetime {lifetime:?}): {}; {}; \
         one per-decision script call after the same idle (on a worker): {}",
        summary("waiting (async, on a worker)", &mut waiting),
        summary("blocking (plain thread)", &mut blocking),
        summary("direct", &mut direct),
    );
    let stats = Arc::into_inner(limiter).unwrap().shutdown().await;
    assert_eq!(stats.waits, 2 * trials as u64);
}

/// A lease key holding damaged state (a `tat` that is not a whole number):
/// the lease script refuses it, nothing is admitted (the default policy,
/// `Closed`, once the breaker opens), and `last_error` names the key and the
/// field instead of leaving the refusals unexplained. Repaired (deleted), the
/// key leases again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_lease_key_admits_nothing_and_says_why() {
    let server = RedisServer::start();
    let bucket = TokenBucket::new("bucket", 5, Rate::per_hour(5)).unwrap();
    let key = tollgate_redis::Limiter::redis_key(&bucket, "damaged");
    let _: () = server.cmd(&["HSET", &key, "tat", "nan"]);
    let _: () = server.cmd(&["PEXPIRE", &key, "3600000"]);
    let options = LeaseOptions::new().breaker(1, Duration::from_millis(50));
    let limiter = LeasedLimiter::start(client(&server).await, bucket, "damaged", options);
    let mut admitted = 0;
    for _ in 0..20 {
        if limiter.try_acquire_n_waiting(1).await.is_ok() {
            admitted += 1;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(admitted, 0);
    let why = limiter.last_error().expect("the failure is reported");
    assert!(why.contains(&key) && why.contains("tat"), "{why}");
    assert_eq!(limiter.stats().leased, 0);

    let _: () = server.cmd(&["DEL", &key]);
    let deadline = Instant::now() + Duration::from_secs(20);
    while limiter.try_acquire_n_waiting(1).await.is_err() {
        assert!(Instant::now() < deadline, "{:?}", limiter.last_error());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(limiter.last_error(), None);
}

/// A refunded receipt puts its permits back in the pool, where they are
/// spent again: a 10-permit budget that refills once an hour admits 10, then
/// (3 refunded) exactly 3 more, and the limiter counts 10 spent. A receipt of
/// another limiter, and one of an admission by the policy while Redis is
/// paused (taken from no pool), refund nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_goes_back_to_the_pool_and_never_beyond_the_lease() {
    let server = RedisServer::start();
    let options = timing_out_after(Duration::from_millis(200));
    let bucket = TokenBucket::new("bucket", 10, Rate::per_hour(1)).unwrap();
    let start = |key: &'static str, client: Client| {
        LeasedLimiter::start(
            client,
            bucket.clone(),
            key,
            LeaseOptions::new()
                .initial_lease(10)
                .max_lease(10)
                .lifetime(Duration::from_secs(60))
                .breaker(1, Duration::from_secs(60))
                .policy(tollgate_redis::Policy::Open),
        )
    };
    let limiter = start(
        "refund",
        Client::connect_with(&server.url(), options).await.unwrap(),
    );
    let mut receipts = Vec::new();
    while let Ok(receipt) = limiter.try_acquire_n_receipt_waiting(1).await {
        assert_eq!(receipt.pooled(), 1);
        receipts.push(receipt);
        assert!(receipts.len() <= 10, "more than the budget admitted");
    }
    assert_eq!(receipts.len(), 10);
    for receipt in receipts.drain(..3) {
        limiter.refund(receipt);
    }
    assert_eq!(limiter.pool(), 3);
    let mut again = 0;
    while limiter.try_acquire_n_waiting(1).await.is_ok() {
        again += 1;
        assert!(again <= 3, "a refund admitted more than it gave back");
    }
    assert_eq!(again, 3);
    assert_eq!(limiter.stats().spent, 10);

    // Another limiter's receipt refunds nothing here.
    let other = start(
        "refund-other",
        Client::connect_with(&server.url(), options).await.unwrap(),
    );
    let foreign = other.try_acquire_n_receipt_waiting(1).await.unwrap();
    limiter.refund(foreign);
    assert_eq!(limiter.pool(), 0);

    // Paused from its start: the first lease call fails, the breaker opens,
    // the policy admits from no pool, and its refund adds nothing.
    let client = Client::connect_with(&server.url(), options).await.unwrap();
    server.pause();
    let paused = start("refund-paused", client);
    let deadline = Instant::now() + Duration::from_secs(20);
    while paused.mode() != tollgate_redis::Mode::Degraded {
        assert!(Instant::now() < deadline, "never degraded");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let by_policy = paused.try_acquire_n_receipt_waiting(1).await.unwrap();
    assert_eq!(by_policy.pooled(), 0);
    paused.refund(by_policy);
    assert_eq!(paused.pool(), 0);
    server.resume();
}
