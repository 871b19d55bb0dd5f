//! Every integration test of tollgate-server in one binary: one build and one link
//! instead of one a file, and the files' tests run side by side. Apart,
//! each a binary of its own: `metrics` (installs a process-wide recorder).

#[path = "../../../tollgate-redis/tests/support/cluster.rs"]
#[allow(dead_code, unused_imports)]
mod cluster;
#[path = "../../../tollgate-redis/tests/support/server.rs"]
#[allow(dead_code, unused_imports)]
mod server;
#[path = "../support/mod.rs"]
mod support;

mod config;
mod grpc;
mod leased;
mod python;
mod redis;
mod reload;
mod replicas;
