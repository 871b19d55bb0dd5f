//! A three-master Redis Cluster on loopback, built with
//! `redis-cli --cluster create`.

use std::process::{Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use super::server::RedisServer;

/// Three cluster-enabled servers, every slot assigned; all killed on drop.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    pub fn start() -> RedisCluster {
        let nodes: Vec<RedisServer> = (0..3)
            .map(|_| {
                RedisServer::start_with(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "5000",
                    "--appendonly",
                    "no",
                ])
            })
            .collect();
        let addresses: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        let output = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addresses)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .expect("redis-cli --cluster create");
        assert!(
            output.status.success(),
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&output.stdout)
        );
        let cluster = RedisCluster { nodes };
        cluster.wait_ok();
        cluster
    }

    /// Waits until every node reports `cluster_state:ok` and knows all three
    /// masters.
    fn wait_ok(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ok = self.nodes.iter().all(|node| {
                let info: String = node.cmd(&["CLUSTER", "INFO"]);
                info.contains("cluster_state:ok") && info.contains("cluster_known_nodes:3")
            });
            if ok {
                return;
            }
            assert!(Instant::now() < deadline, "the cluster never became ok");
            sleep(Duration::from_millis(100));
        }
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.url()).collect()
    }

    /// The node that owns `key`'s slot: the one that answers for it instead
    /// of redirecting with `MOVED`.
    pub fn owner(&self, key: &str) -> &RedisServer {
        self.nodes
            .iter()
            .find(|node| {
                redis::cmd("EXISTS")
                    .arg(key)
                    .query::<i64>(&mut node.admin())
                    .is_ok()
            })
            .expect("some node owns every slot")
    }
}
