//! What the crate reports through the [`metrics`](https://docs.rs/metrics)
//! facade under the `metrics` feature; without it every function here is
//! empty and compiles away. Names follow Prometheus conventions (`_total`
//! counters, seconds); labels are few and bounded: a script's name, an
//! outcome, the key a leased limiter was started for (one per limiter) —
//! never the key of a request.

use std::time::Duration;

use crate::error::Error;

/// The outcome label of a failed call or request.
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
fn failure(err: &Error) -> &'static str {
    match err {
        Error::Denied(tollgate::Denied::RetryAfter(_)) => "denied",
        Error::Denied(_) | Error::InvalidCall(_) => "never",
        Error::Timeout(_) => "timeout",
        Error::Interrupted(_) => "interrupted",
        Error::Redis(_) => "refused",
        Error::WrongType { .. } => "wrong_type",
        Error::UnknownState { .. } => "unknown_state",
        Error::UnexpectedReply(_) => "unexpected_reply",
        Error::Unavailable => "unavailable",
        Error::BlockingInAsync => "blocking_in_async",
    }
}

/// One script call: `tollgate_redis_calls_total{script, outcome}` (`ok`,
/// `timeout`, `interrupted`, `refused`) and
/// `tollgate_redis_call_duration_seconds{script}`.
#[cfg(feature = "metrics")]
pub(crate) fn call<T>(script: &'static str, result: &Result<T, Error>, took: Duration) {
    let outcome = match result {
        Ok(_) => "ok",
        Err(err) => failure(err),
    };
    metrics::counter!("tollgate_redis_calls_total", "script" => script, "outcome" => outcome)
        .increment(1);
    metrics::histogram!("tollgate_redis_call_duration_seconds", "script" => script)
        .record(took.as_secs_f64());
}

#[cfg(not(feature = "metrics"))]
#[inline(always)]
pub(crate) fn call<T>(_: &'static str, _: &Result<T, Error>, _: Duration) {}

/// One request's answer: `tollgate_redis_requests_total{limits, outcome}`,
/// `limits` `one` or `several` (an all-or-nothing request), `outcome`
/// `admitted`, `denied` (a retry-after), `never` (it can never pass, or
/// the call was invalid), `wrong_type`, `unknown_state`, or why no answer
/// came (`timeout`, `interrupted`, `refused`, `unexpected_reply`).
#[cfg(feature = "metrics")]
pub(crate) fn request<T>(several: bool, result: &Result<T, &Error>) {
    let outcome = match result {
        Ok(_) => "admitted",
        Err(err) => failure(err),
    };
    let limits = if several { "several" } else { "one" };
    metrics::counter!("tollgate_redis_requests_total", "limits" => limits, "outcome" => outcome)
        .increment(1);
}

#[cfg(not(feature = "metrics"))]
#[inline(always)]
pub(crate) fn request<T>(_: bool, _: &Result<T, &Error>) {}

/// One batched call: `tollgate_redis_batch_requests` and
/// `tollgate_redis_batch_decisions`, the requests and decisions it carried.
#[cfg(feature = "metrics")]
pub(crate) fn batch(requests: usize, decisions: usize) {
    metrics::histogram!("tollgate_redis_batch_requests").record(requests as f64);
    metrics::histogram!("tollgate_redis_batch_decisions").record(decisions as f64);
}

#[cfg(not(feature = "metrics"))]
#[inline(always)]
pub(crate) fn batch(_: usize, _: usize) {}

/// A leased limiter's counters, as its background task last saw them,
/// labelled `limit` with the key it was started for.
#[cfg(feature = "metrics")]
pub(crate) fn lease(limit: &str, stats: &crate::LeaseStats, degraded: bool, pool: u64) {
    let limit = limit.to_owned();
    let counter = |name: &'static str, value: u64| {
        metrics::counter!(name, "limit" => limit.clone()).absolute(value);
    };
    counter("tollgate_redis_lease_calls_total", stats.lease_calls);
    counter("tollgate_redis_leases_total", stats.leases);
    counter(
        "tollgate_redis_lease_exhausted_total",
        stats.exhausted_leases,
    );
    counter("tollgate_redis_lease_waits_total", stats.waits);
    counter(
        "tollgate_redis_lease_degraded_decisions_total",
        stats.degraded_decisions,
    );
    for (event, value) in [
        ("leased", stats.leased),
        ("returned", stats.returned),
        ("forfeited", stats.forfeited),
        ("spent", stats.spent),
    ] {
        metrics::counter!("tollgate_redis_lease_permits_total", "limit" => limit.clone(), "event" => event)
            .absolute(value);
    }
    metrics::gauge!("tollgate_redis_lease_degraded", "limit" => limit.clone()).set(if degraded {
        1.0
    } else {
        0.0
    });
    metrics::gauge!("tollgate_redis_lease_pool_permits", "limit" => limit).set(pool as f64);
}
