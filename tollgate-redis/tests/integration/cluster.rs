//! The limiters on a real three-master Redis Cluster (built with
//! `redis-cli --cluster create` on loopback): decisions route to the node that
//! owns each key's slot, every key of a caller shares that slot, scripts reload
//! on every node, TTLs are set where the keys live; leased limiters on keys
//! spread over the masters keep each key's global invariant.

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tollgate::{Denied, Rate};
use tollgate_redis::{
    ApproxSlidingWindow, Client, Error, FixedWindow, LeaseOptions, LeasedLimiter, Limiter, Options,
    SlidingLog, TokenBucket, blocking,
};

use support::{RedisCluster, cluster_client, gcra_violations};

fn limiters() -> Vec<Box<dyn Limiter>> {
    let hourly = Rate::per_hour(3);
    vec![
        Box::new(TokenBucket::new("bucket", 3, hourly).unwrap()),
        Box::new(FixedWindow::new("window", hourly).unwrap()),
        Box::new(ApproxSlidingWindow::new("approx", hourly).unwrap()),
        Box::new(SlidingLog::new("log", hourly).unwrap()),
    ]
}

#[tokio::test]
async fn every_limiter_works_across_a_three_master_cluster() {
    let cluster = RedisCluster::start();
    let client = cluster_client(&cluster, Options::default()).await;
    let keys: Vec<String> = (0..24).map(|i| format!("user:{i}")).collect();
    let mut owners = BTreeSet::new();
    for limiter in limiters() {
        for key in &keys {
            assert_eq!(
                client
                    .try_acquire_n(&*limiter, key, 3)
                    .await
                    .unwrap()
                    .remaining,
                0
            );
            assert!(matches!(
                client.try_acquire(&*limiter, key).await,
                Err(Error::Denied(Denied::RetryAfter(_)))
            ));
            let redis_key = limiter.redis_key(key);
            // The caller's key is the hash tag: its slot is the Redis key's.
            let slot: i64 = cluster.nodes[0].cmd(&["CLUSTER", "KEYSLOT", &redis_key]);
            let tag_slot: i64 = cluster.nodes[0].cmd(&["CLUSTER", "KEYSLOT", key]);
            assert_eq!(slot, tag_slot);
            let owner = cluster.owner(&redis_key);
            owners.insert(owner.port());
            let pttl: i64 = owner.cmd(&["PTTL", &redis_key]);
            assert!(pttl > 0 && pttl <= 2 * 3_600_000, "{redis_key}: {pttl}");
        }
    }
    assert_eq!(owners.len(), 3, "24 keys should land on all three masters");

    // A library flushed everywhere is loaded again, on every master, by the
    // first call that misses it; later calls find it wherever they land.
    let libraries = |node: &support::RedisServer| -> usize {
        let list: Vec<redis::Value> = node.cmd(&["FUNCTION", "LIST", "LIBRARYNAME", "tollgate_*"]);
        list.len()
    };
    for node in &cluster.nodes {
        assert_eq!(libraries(node), 1, "loaded where decisions ran");
        let _: () = node.cmd(&["FUNCTION", "FLUSH"]);
    }
    let loads = |cluster: &RedisCluster| -> u64 {
        cluster.nodes.iter().map(|n| n.calls("function|load")).sum()
    };
    let before = loads(&cluster);
    for limiter in limiters() {
        for key in [
            "fresh:1", "fresh:2", "fresh:3", "fresh:4", "fresh:5", "fresh:6",
        ] {
            assert!(client.try_acquire(&*limiter, key).await.is_ok());
        }
    }
    for node in &cluster.nodes {
        assert_eq!(libraries(node), 1, "loaded again on every master");
    }
    assert_eq!(
        loads(&cluster) - before,
        3,
        "one load, on the three masters"
    );
    let decisions: u64 = cluster.nodes.iter().map(|n| n.script_calls()).sum();
    assert!(decisions >= 4 * 24 + 4 * 6);
}

#[test]
fn the_blocking_client_works_on_a_cluster() {
    let cluster = RedisCluster::start();
    let urls = cluster.urls();
    let nodes: Vec<&str> = urls.iter().map(String::as_str).collect();
    let client = blocking::Client::connect_cluster_with(&nodes, Options::new()).unwrap();
    for limiter in limiters() {
        for key in ["a", "b", "c", "d", "e", "f"] {
            assert!(client.try_acquire_n(&*limiter, key, 3).is_ok());
            assert!(client.try_acquire(&*limiter, key).unwrap_err().is_denied());
        }
    }
}

/// Three clients (as three processes would have), each with a leased
/// limiter on each of 6 keys that land on all three masters; two threads
/// spend from all 18 limiters for a second. Every lease is recorded by its
/// server time: per key, the merged net debits keep the GCRA invariant, and
/// each limiter spent at most its net debits.
#[test]
fn leases_on_a_cluster_keep_each_keys_global_invariant() {
    const BURST: u32 = 2_000;
    const INTERVAL_US: u64 = 50; // 20,000/s
    let cluster = RedisCluster::start();
    let urls = cluster.urls();
    let nodes: Vec<&str> = urls.iter().map(String::as_str).collect();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let bucket = || TokenBucket::new("bucket", BURST, Rate::per_second(20_000)).unwrap();
    let keys: Vec<String> = (0..6).map(|i| format!("tenant:{i}")).collect();
    let owners: BTreeSet<u16> = keys
        .iter()
        .map(|key| cluster.owner(&bucket().redis_key(key)).port())
        .collect();
    assert_eq!(owners.len(), 3, "the keys should land on all three masters");

    let mut limiters = Vec::new();
    for _ in 0..3 {
        let client = runtime
            .block_on(Client::connect_cluster_with(
                &nodes,
                Options::new().timeout(Duration::from_secs(2)),
            ))
            .unwrap();
        let _inside = runtime.enter();
        for key in &keys {
            let options = LeaseOptions::new().record_leases(true).max_lease(500);
            let limiter = LeasedLimiter::start(client.clone(), bucket(), key, options);
            limiters.push((key.clone(), limiter, AtomicU64::new(0)));
        }
    }
    let until = Instant::now() + Duration::from_secs(1);
    std::thread::scope(|scope| {
        for t in 0..2 {
            let limiters = &limiters;
            scope.spawn(move || {
                let mut i = t;
                while Instant::now() < until {
                    let (_, limiter, admitted) = &limiters[i % limiters.len()];
                    if limiter.try_acquire().is_ok() {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                    i += 1;
                }
            });
        }
    });

    let mut debits: BTreeMap<String, Vec<(u64, u64)>> = BTreeMap::new();
    let (mut spent, mut leases) = (0u64, 0usize);
    for (key, mut limiter, admitted) in limiters {
        let stats = runtime.block_on(limiter.shutdown());
        let records = limiter.leases();
        let net: u64 = records.iter().map(|l| l.granted - l.returned).sum();
        let admitted = admitted.load(Ordering::Relaxed);
        assert_eq!(stats.spent, admitted);
        assert!(
            admitted <= net,
            "{key}: spent {admitted} of {net} net debits"
        );
        spent += admitted;
        leases += records.len();
        let key_debits = debits.entry(key).or_default();
        key_debits.extend(records.iter().map(|l| (l.time_us, l.granted - l.returned)));
    }
    for (key, records) in &mut debits {
        records.sort_unstable();
        assert!(!records.is_empty(), "{key}: no lease");
        let violations = gcra_violations(records, BURST.into(), INTERVAL_US);
        assert_eq!(violations, 0, "{key}: {violations} GCRA violations");
    }
    // Every master ran lease scripts (for the keys whose slots it owns).
    for node in &cluster.nodes {
        assert!(node.script_calls() > 0);
    }
    println!(
        "cluster leases: 3 clients x 6 keys on 3 masters, {leases} leases, \
         {spent} permits admitted, 0 GCRA violations"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_or_killed_node_reports_that_the_script_may_have_run() {
    let mut cluster = RedisCluster::start();
    let timeout = Duration::from_millis(50);
    let client = cluster_client(&cluster, Options::new().timeout(timeout)).await;
    let bucket = TokenBucket::new("bucket", 1_000, Rate::per_hour(1_000)).unwrap();
    let key = "paused";
    client.try_acquire(&bucket, key).await.unwrap();
    let owner = cluster
        .nodes
        .iter()
        .position(|node| node.port() == cluster.owner(&bucket.redis_key(key)).port())
        .unwrap();

    // The owner paused: a call that completes within the pause had no reply,
    // and every expired deadline is a Timeout, never redis-rs's own.
    let pause = Duration::from_secs(2);
    let before = Instant::now();
    let _: () = cluster.nodes[owner].cmd(&["CLIENT", "PAUSE", "2000", "ALL"]);
    let mut during_pause = 0;
    while before.elapsed() < pause - Duration::from_millis(300) {
        let outcome = client.try_acquire(&bucket, key).await;
        if before.elapsed() < pause {
            during_pause += 1;
            assert!(
                matches!(outcome, Err(Error::Timeout(t)) if t == timeout),
                "{outcome:?}"
            );
        }
        if let Err(err) = outcome {
            assert!(matches!(err, Error::Timeout(_)), "{err:?}");
            assert!(err.may_have_run());
        }
    }
    assert!(during_pause > 0);
    tokio::time::sleep(pause.saturating_sub(before.elapsed())).await;

    // The owner killed while a call waits there: whatever the cluster client
    // does next (it may resend), the caller hears that the script may have
    // run.
    let long = cluster_client(&cluster, Options::new().timeout(Duration::from_secs(5))).await;
    long.try_acquire(&bucket, key).await.unwrap();
    let _: () = cluster.nodes[owner].cmd(&["CLIENT", "PAUSE", "20000", "WRITE"]);
    let call = {
        let long = long.clone();
        let bucket = bucket.clone();
        tokio::spawn(async move { long.try_acquire(&bucket, key).await })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let clients: String = cluster.nodes[owner].cmd(&["CLIENT", "LIST"]);
        if clients
            .lines()
            .any(|line| line.contains("cmd=fcall") && line.contains("flags=b"))
        {
            break;
        }
        assert!(Instant::now() < deadline, "the call never reached the node");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    cluster.nodes[owner].kill();
    let err = call.await.unwrap().unwrap_err();
    assert!(
        matches!(err, Error::Interrupted(_) | Error::Timeout(_)),
        "{err:?}"
    );
    assert!(err.may_have_run(), "{err:?}");
}
