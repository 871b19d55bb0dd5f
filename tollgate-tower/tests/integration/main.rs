//! Every integration test of tollgate-tower in one binary: one build and one link
//! instead of one a file, and the files' tests run side by side. Apart,
//! each a binary of its own: `metrics` (installs a process-wide recorder).

#[path = "../../../tollgate-redis/tests/support/server.rs"]
#[allow(dead_code, unused_imports)]
mod server;
#[path = "../support/mod.rs"]
mod support;

mod capacity_change;
mod compose;
mod concurrency;
mod drain;
mod forwarded;
mod grpc;
mod http;
mod hyper;
mod overload;
mod redis;
