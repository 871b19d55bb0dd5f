//! Every integration test of tollgate-redis in one binary: one build and one link
//! instead of one a file, and the files' tests run side by side. Apart,
//! each a binary of its own: `metrics` (installs a process-wide recorder), and `multi_process`,
//! `leased` and `leased_processes` (each starts copies of its own binary as
//! child processes).

#[path = "../support/mod.rs"]
mod support;

mod agreement;
mod cluster;
mod failures;
mod lease_agreement;
mod lease_refill;
mod many;
mod names;
mod report;
mod single_node;
