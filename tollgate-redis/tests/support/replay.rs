//! What the agreement tests share: the property runner (its case count from
//! `TOLLGATE_REDIS_AGREEMENT_CASES`, 96 by default) and a fresh Redis key
//! per case.

use std::sync::atomic::{AtomicU64, Ordering};

use proptest::test_runner::{Config, TestRunner};

static CASE: AtomicU64 = AtomicU64::new(0);

/// A key no other case of this process uses.
pub fn fresh_key(name: &str) -> String {
    format!("{name}-{}", CASE.fetch_add(1, Ordering::Relaxed))
}

/// The runner every agreement property uses.
pub fn runner() -> TestRunner {
    let cases = std::env::var("TOLLGATE_REDIS_AGREEMENT_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(96);
    TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    })
}
