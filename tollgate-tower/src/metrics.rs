//! What the layers report through the [`metrics`](https://docs.rs/metrics)
//! facade under the `metrics` feature; without it every function here is
//! empty and compiles away. Labels are a policy's name and an outcome: never
//! a request's key, address or user.

#[cfg(feature = "metrics")]
use std::time::Duration;

use crate::fields::PolicyName;

/// A policy's answer: `tollgate_tower_decisions_total{policy, outcome}`,
/// `outcome` one of `admitted`, `rate` (a `429`), `never_fits` (a `403`:
/// the request costs more than the policy's capacity), `unavailable` (a
/// `503`: the policy could not decide).
#[cfg(feature = "metrics")]
pub(crate) fn decision(policy: &PolicyName, outcome: &'static str) {
    let index = match outcome {
        "admitted" => 0,
        "rate" => 1,
        "never_fits" => 2,
        _ => 3,
    };
    policy.counters()[index].increment(1);
}

#[cfg(not(feature = "metrics"))]
#[inline(always)]
pub(crate) fn decision(_: &PolicyName, _: &'static str) {}

/// A request's fate in a throttle layer:
/// `tollgate_tower_requests_total{outcome}` (`passed`, `refused`, `no_key`)
/// and, for a decision that took time of its own (a remote policy, a wait),
/// `tollgate_tower_decision_duration_seconds`.
#[cfg(feature = "metrics")]
pub(crate) fn request(outcome: &'static str) {
    // Registered with the recorder at the first request, then kept: one
    // atomic add per request after that.
    static COUNTERS: std::sync::OnceLock<[metrics::Counter; 3]> = std::sync::OnceLock::new();
    let counters = COUNTERS.get_or_init(|| {
        ["passed", "refused", "no_key"]
            .map(|outcome| metrics::counter!("tollgate_tower_requests_total", "outcome" => outcome))
    });
    let index = match outcome {
        "passed" => 0,
        "refused" => 1,
        _ => 2,
    };
    counters[index].increment(1);
}

#[cfg(not(feature = "metrics"))]
#[inline(always)]
pub(crate) fn request(_: &'static str) {}

#[cfg(feature = "metrics")]
pub(crate) fn decision_time(took: Duration) {
    metrics::histogram!("tollgate_tower_decision_duration_seconds").record(took.as_secs_f64());
}

/// A concurrency layer's request: `tollgate_tower_concurrency_requests_total{outcome}`
/// (`admitted`, `queued`, `shed`), with the limit and what is in flight as
/// gauges (`tollgate_tower_concurrency_limit`,
/// `tollgate_tower_concurrency_in_flight`).
/// `state` reads them (in flight, limit), only when metrics are on.
#[cfg(feature = "metrics")]
pub(crate) fn concurrency(outcome: &'static str, state: impl FnOnce() -> (u32, u32)) {
    metrics::counter!("tollgate_tower_concurrency_requests_total", "outcome" => outcome)
        .increment(1);
    let (in_flight, limit) = state();
    metrics::gauge!("tollgate_tower_concurrency_in_flight").set(f64::from(in_flight));
    metrics::gauge!("tollgate_tower_concurrency_limit").set(f64::from(limit));
}

#[cfg(not(feature = "metrics"))]
#[inline(always)]
pub(crate) fn concurrency(_: &'static str, _: impl FnOnce() -> (u32, u32)) {}

/// A queued request's wait for its permit, granted or not:
/// `tollgate_tower_concurrency_queue_wait_seconds`.
#[cfg(feature = "metrics")]
pub(crate) fn queue_wait(took: Duration) {
    metrics::histogram!("tollgate_tower_concurrency_queue_wait_seconds").record(took.as_secs_f64());
}

/// A permit's outcome as the limit records it:
/// `tollgate_tower_concurrency_outcomes_total{outcome}` (`success`,
/// `dropped`, `ignored`).
#[cfg(feature = "metrics")]
pub(crate) fn outcome(outcome: tollgate::Outcome) {
    let outcome = match outcome {
        tollgate::Outcome::Success => "success",
        tollgate::Outcome::Dropped => "dropped",
        _ => "ignored",
    };
    metrics::counter!("tollgate_tower_concurrency_outcomes_total", "outcome" => outcome)
        .increment(1);
}

#[cfg(not(feature = "metrics"))]
#[inline(always)]
pub(crate) fn outcome(_: tollgate::Outcome) {}
