//! Every integration test of tollgate in one binary: one build and one link
//! instead of one a file, and the files' tests run side by side. Apart,
//! each a binary of its own: `keyed_flood` and `sliding_log` (each wraps its binary's allocator to count
//! bytes), `metrics` (needs the `metrics` feature) and `keyed_miri` (run under
//! Miri by name).

#[path = "../support/loops.rs"]
#[allow(dead_code, unused_imports)]
mod loops;
#[path = "../support/sim.rs"]
#[allow(dead_code, unused_imports)]
mod sim;
#[path = "../support/mod.rs"]
mod support;

mod adaptive_limit;
mod adaptive_sim;
mod all_of;
mod backwards_clock;
mod concurrency;
mod config_errors;
mod counted;
mod counted_tracing;
mod fixed_window;
mod keyed;
mod keyed_adaptive;
mod keyed_combined;
mod keyed_reconfig;
mod keyed_rules;
mod leaky_bucket;
mod leased_fixed_window;
mod leased_token_bucket;
mod rate_parse;
mod reports;
mod retry_acquire;
mod sliding_log_rules;
mod sliding_window;
mod stress;
mod token_bucket;
mod waiting;
mod warm_up;
