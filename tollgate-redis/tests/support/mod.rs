//! Real Redis servers for the tests: each test starts its own `redis-server`
//! processes on free loopback ports (never a system service) and they are
//! killed when the handle drops, a panicking test included.

#![allow(dead_code, unused_imports)]

pub mod children;
pub mod cluster;
pub mod gcra;
pub mod recorded;
pub mod replay;
pub mod server;

pub use cluster::RedisCluster;
pub use gcra::gcra_violations;
pub use server::RedisServer;

/// A current-thread runtime with its timers and I/O.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Everything the spawned `tasks` return, task after task; a task's panic
/// fails the caller.
pub async fn joined<T>(tasks: Vec<tokio::task::JoinHandle<Vec<T>>>) -> Vec<T> {
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.unwrap());
    }
    all
}

/// An async client on `cluster`'s masters, with `options`.
pub async fn cluster_client(
    cluster: &RedisCluster,
    options: tollgate_redis::Options,
) -> tollgate_redis::Client {
    let urls = cluster.urls();
    let nodes: Vec<&str> = urls.iter().map(String::as_str).collect();
    tollgate_redis::Client::connect_cluster_with(&nodes, options)
        .await
        .unwrap()
}

/// A fresh server and an async client on it.
pub async fn server_and_client() -> (RedisServer, tollgate_redis::Client) {
    let server = RedisServer::start();
    let client = tollgate_redis::Client::connect(&server.url())
        .await
        .unwrap();
    (server, client)
}
