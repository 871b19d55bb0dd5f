//! The limiters on a real three-master Redis Cluster (built with
//! `redis-cli --cluster create` on loopback): decisions route to the node that
//! owns each key's slot, every key of a caller shares that slot, scripts reload
//! on every node, TTLs are set where the keys live.

mod support;

use std::collections::BTreeSet;

use tollgate::{Denied, Rate};
use tollgate_redis::{
    Client, Error, FixedWindow, Limiter, Options, SlidingLog, SlidingWindow, TokenBucket, blocking,
};

use support::RedisCluster;

fn limiters() -> Vec<Box<dyn Limiter>> {
    let hourly = Rate::per_hour(3);
    vec![
        Box::new(TokenBucket::new(3, hourly).unwrap()),
        Box::new(FixedWindow::new(hourly).unwrap()),
        Box::new(SlidingWindow::new(hourly).unwrap()),
        Box::new(SlidingLog::new(hourly).unwrap()),
    ]
}

#[tokio::test]
async fn every_limiter_works_across_a_three_master_cluster() {
    let cluster = RedisCluster::start();
    let urls = cluster.urls();
    let nodes: Vec<&str> = urls.iter().map(String::as_str).collect();
    let client = Client::connect_cluster(&nodes).await.unwrap();
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

    // Scripts flushed everywhere are reloaded on whichever node needs them.
    for node in &cluster.nodes {
        let _: () = node.cmd(&["SCRIPT", "FLUSH"]);
    }
    for limiter in limiters() {
        for key in ["fresh:1", "fresh:2", "fresh:3", "fresh:4"] {
            assert!(client.try_acquire(&*limiter, key).await.is_ok());
        }
    }
    let decisions: u64 = cluster.nodes.iter().map(|n| n.calls("evalsha")).sum();
    assert!(decisions >= 4 * 24 * 2);
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
