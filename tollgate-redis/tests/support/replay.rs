//! What the agreement tests share: the property runner (its case count from
//! `TOLLGATE_REDIS_AGREEMENT_CASES`, 96 by default), a fresh Redis key per
//! case, and the in-process retry-after as the scripts give it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use proptest::test_runner::{Config, TestRunner};
use tollgate::Denied;

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

/// `wait` in whole microseconds, rounded up: the scripts' resolution.
pub fn micros_up(wait: Duration) -> u64 {
    u64::try_from(wait.as_nanos().div_ceil(1000)).unwrap()
}

/// The in-process verdict as the scripts give it: retry-after rounded up to a
/// whole microsecond.
pub fn to_micros(verdict: Result<(), Denied>) -> Result<(), Denied> {
    verdict.map_err(|denied| match denied {
        Denied::RetryAfter(wait) => Denied::RetryAfter(Duration::from_micros(micros_up(wait))),
        other => other,
    })
}
