//! What the server counts, through the `metrics` facade (the binary exports
//! it in Prometheus's text format on `/metrics`).
//!
//! | name | kind | labels | what |
//! |---|---|---|---|
//! | `tollgate_server_requests_total` | counter | `domain`, `code` (`ok`, `over_limit`, `invalid`) | requests answered |
//! | `tollgate_server_hits_total` | counter | `domain`, `descriptor` | hits asked of a limit (envoyproxy/ratelimit's `total_hits`) |
//! | `tollgate_server_limit_hits_total` | counter | `domain`, `descriptor`, `outcome` | the same hits by outcome: `within_limit`, `near_limit` (admitted with more than 80 % of the limit in use, counted in `within_limit` too), `over_limit`, `shadow_mode` (refused by a limit in shadow mode, so admitted) |
//! | `tollgate_server_backend_failures_total` | counter | `domain`, `failure` (`open`, `closed`, `local`) | requests Redis did not decide, answered by the failure mode |
//! | `tollgate_server_backend_duration_seconds` | histogram | `backend` (`memory`, `redis`, `leased`) | time to decide a request's limits |
//! | `tollgate_server_leased_keys` | gauge | | keys whose limits this process holds leases of (the leased backend) |
//! | `tollgate_server_reloads_total` | counter | `outcome` (`ok`, `error`) | configuration reloads |
//!
//! `domain` is a configured domain's name, or `unknown` for a request of
//! another (clients choose domains: their names must not grow the label's
//! values). `descriptor` is envoyproxy/ratelimit's statistics name of the
//! matched limit (the domain and the descriptor's keys, with values only
//! where the configuration gives them or `detailed_metric` asks for them),
//! so its values are bounded by the configuration unless `detailed_metric`
//! or `value_to_metric` is set.

use std::time::Duration;

use crate::decide::{Mode, Plan, Seen};

/// The share of a limit in use above which an admission counts as
/// `near_limit` (envoyproxy/ratelimit's default `NEAR_LIMIT_RATIO`).
const NEAR_LIMIT: f64 = 0.8;

/// Counts a decided request: its code, and each limit's hits by outcome.
pub(crate) fn decided(domain: &str, plan: &Plan<'_>, seen: &[Seen], admitted: bool) {
    let code = if admitted { "ok" } else { "over_limit" };
    metrics::counter!("tollgate_server_requests_total", "domain" => domain.to_owned(), "code" => code)
        .increment(1);
    for (check, seen) in plan.checks.iter().zip(seen) {
        let hits = check.hits;
        let labels = [
            ("domain", domain.to_owned()),
            ("descriptor", check.stat_name.clone()),
        ];
        metrics::counter!("tollgate_server_hits_total", &labels).increment(hits);
        let outcome = |outcome: &'static str| {
            metrics::counter!(
                "tollgate_server_limit_hits_total",
                "domain" => domain.to_owned(),
                "descriptor" => check.stat_name.clone(),
                "outcome" => outcome
            )
            .increment(hits);
        };
        match seen {
            Seen::Refused(_) if check.mode == Mode::Shadow => outcome("shadow_mode"),
            Seen::Refused(_) | Seen::Unanswered => outcome("over_limit"),
            Seen::Admitted(snapshot) if admitted => {
                outcome("within_limit");
                let used = f64::from(snapshot.capacity - snapshot.available.min(snapshot.capacity));
                if used > NEAR_LIMIT * f64::from(snapshot.capacity) {
                    outcome("near_limit");
                }
            }
            // Admitted by this limit, refused by another: given back.
            Seen::Admitted(_) | Seen::NotAsked => {}
        }
    }
}

/// Counts a request the protocol could not answer.
pub(crate) fn invalid(domain: &str) {
    metrics::counter!("tollgate_server_requests_total", "domain" => domain.to_owned(), "code" => "invalid")
        .increment(1);
}

/// Counts a request Redis did not decide.
pub(crate) fn backend_failure(domain: &str, failure: &'static str) {
    metrics::counter!("tollgate_server_backend_failures_total", "domain" => domain.to_owned(), "failure" => failure)
        .increment(1);
}

/// Records how long a backend took to decide.
pub(crate) fn backend_duration(backend: &'static str, took: Duration) {
    metrics::histogram!("tollgate_server_backend_duration_seconds", "backend" => backend)
        .record(took.as_secs_f64());
}

/// The leased backend's keys held in leases.
pub(crate) fn leased_keys(keys: usize) {
    metrics::gauge!("tollgate_server_leased_keys").set(keys as f64);
}

/// Counts a reload.
pub(crate) fn reload(ok: bool) {
    let outcome = if ok { "ok" } else { "error" };
    metrics::counter!("tollgate_server_reloads_total", "outcome" => outcome).increment(1);
}
