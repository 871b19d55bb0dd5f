//! A request's decision on the memory backend: its descriptors matched to
//! rules, every limit asked in turn, all or nothing, and the answer in the
//! protocol's terms.

use std::sync::Arc;
use std::time::Duration;

use tollgate::{Denied, Rejection, Snapshot};

use crate::config::{Config, Match, Unit, apply_replaces, override_key};
use crate::limits::{Store, Stores};
use crate::proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use crate::proto::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit as WireLimit,
};
use crate::proto::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};

/// Why a request gets no answer: the protocol's error cases.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BadRequest {
    /// The request names no domain.
    EmptyDomain,
    /// The request has no descriptor.
    NoDescriptors,
    /// More descriptors than the server accepts in one request.
    TooManyDescriptors {
        /// Descriptors in the request.
        count: usize,
        /// The server's bound.
        max: usize,
    },
    /// More limits matched than the server decides in one request.
    TooManyLimits {
        /// Limits the descriptors matched.
        count: usize,
        /// The server's bound.
        max: usize,
    },
    /// A descriptor has an entry with an empty key.
    EmptyKey {
        /// The descriptor's position in the request.
        descriptor: usize,
    },
    /// A descriptor's own `limit` cannot be kept: a zero or unknown unit,
    /// zero requests, or more distinct request-chosen limits than the server
    /// keeps.
    BadOverride {
        /// The descriptor's position in the request.
        descriptor: usize,
        /// Why.
        reason: &'static str,
    },
}

impl std::fmt::Display for BadRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BadRequest::EmptyDomain => f.write_str("rate limit domain must not be empty"),
            BadRequest::NoDescriptors => {
                f.write_str("rate limit descriptor list must not be empty")
            }
            BadRequest::TooManyDescriptors { count, max } => {
                write!(f, "{count} descriptors in one request; at most {max}")
            }
            BadRequest::TooManyLimits { count, max } => write!(
                f,
                "the request's descriptors match {count} limits; at most {max} are decided in one request"
            ),
            BadRequest::EmptyKey { descriptor } => {
                write!(f, "descriptor {descriptor} has an entry with an empty key")
            }
            BadRequest::BadOverride { descriptor, reason } => {
                write!(f, "descriptor {descriptor}'s limit: {reason}")
            }
        }
    }
}

impl std::error::Error for BadRequest {}

/// Bounds on one request, so that one request's cost is bounded.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// Descriptors in one request.
    pub max_descriptors: usize,
    /// Limits one request's descriptors may match (each is asked in turn).
    pub max_limits: usize,
}

impl Default for Bounds {
    fn default() -> Self {
        Bounds {
            max_descriptors: 1024,
            max_limits: 128,
        }
    }
}

/// What a limit reports in a status: Envoy's `current_limit`.
#[derive(Debug, Clone)]
struct Shown {
    name: String,
    requests_per_unit: u32,
    unit: i32,
}

/// How a limit's refusal counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Its refusal refuses the request.
    Enforced,
    /// `shadow_mode`: its refusal is counted, the request goes on.
    Shadow,
    /// `quota_mode` (envoyproxy/ratelimit's): the request is refused by
    /// quota limits only when every one of them refuses it.
    Quota,
}

/// One limit a request must pass.
struct Check {
    descriptor: usize,
    /// `None`: a rule of 0 requests, which refuses every request.
    store: Option<Arc<Store>>,
    key: String,
    hits: u64,
    mode: Mode,
    shown: Shown,
}

impl Check {
    /// The limit's state now, charging nothing.
    fn snapshot(&self) -> Snapshot {
        match &self.store {
            Some(store) => store.snapshot(&self.key),
            None => Snapshot::new(0, 0, Duration::ZERO),
        }
    }

    fn refundable(&self) -> bool {
        self.store.as_ref().is_none_or(|s| s.refundable())
    }
}

/// What happened to a check.
#[derive(Debug, Clone, Copy)]
enum Seen {
    /// Not asked: an earlier limit refused first.
    NotAsked,
    Admitted(Snapshot),
    Refused(Rejection),
}

/// The decision's outcome, for metrics and logs.
#[derive(Debug, Default, Clone)]
pub(crate) struct Outcome {
    /// Whether the request was admitted.
    pub admitted: bool,
    /// Limits in shadow mode that would have refused it.
    pub shadow_refusals: usize,
}

/// Decides `request` on `config`'s rules and `stores`' state.
pub(crate) fn decide(
    config: &Config,
    stores: &Stores,
    bounds: Bounds,
    request: &RateLimitRequest,
) -> Result<(RateLimitResponse, Outcome), BadRequest> {
    if request.domain.is_empty() {
        return Err(BadRequest::EmptyDomain);
    }
    if request.descriptors.is_empty() {
        return Err(BadRequest::NoDescriptors);
    }
    if request.descriptors.len() > bounds.max_descriptors {
        return Err(BadRequest::TooManyDescriptors {
            count: request.descriptors.len(),
            max: bounds.max_descriptors,
        });
    }
    let request_hits = u64::from(request.hits_addend.max(1));
    // A descriptor's hits: its own, else the request's (0 there means 1).
    let hits = |d: &RateLimitDescriptor| d.hits_addend.unwrap_or(request_hits);
    let domain = config.domain(&request.domain);
    // Each descriptor's status: unlimited until a limit says otherwise.
    let mut statuses: Vec<DescriptorStatus> = request
        .descriptors
        .iter()
        .map(|_| DescriptorStatus {
            code: Code::Ok as i32,
            ..Default::default()
        })
        .collect();
    let mut checks: Vec<Check> = Vec::new();
    let mut matches: Vec<Option<Match<'_>>> = Vec::with_capacity(request.descriptors.len());
    let mut entries: Vec<(&str, &str)> = Vec::new();
    for (index, descriptor) in request.descriptors.iter().enumerate() {
        entries.clear();
        for entry in &descriptor.entries {
            if entry.key.is_empty() {
                return Err(BadRequest::EmptyKey { descriptor: index });
            }
            entries.push((entry.key.as_str(), entry.value.as_str()));
        }
        let Some(domain) = domain else {
            matches.push(None);
            continue;
        };
        let Some(limit) = &descriptor.limit else {
            matches.push(domain.matching(&entries));
            continue;
        };
        // The caller's own limit for this descriptor, as Envoy's override: a
        // fixed window of `requests_per_unit` per `unit`, kept under the
        // descriptor's entries, in place of any configured rule.
        matches.push(None);
        let unit = Unit::from_wire(limit.unit).ok_or(BadRequest::BadOverride {
            descriptor: index,
            reason: "unknown unit",
        })?;
        if limit.requests_per_unit == 0 {
            return Err(BadRequest::BadOverride {
                descriptor: index,
                reason: "requests_per_unit must be above 0",
            });
        }
        let store = stores
            .overridden(limit.requests_per_unit, unit.duration())
            .ok_or(BadRequest::BadOverride {
                descriptor: index,
                reason: "the server keeps no more request-chosen limits",
            })?;
        checks.push(Check {
            descriptor: index,
            store: Some(store),
            key: override_key(domain.name(), &entries),
            hits: hits(descriptor),
            mode: Mode::Enforced,
            shown: Shown {
                name: String::new(),
                requests_per_unit: limit.requests_per_unit,
                unit: unit.wire(),
            },
        });
    }
    // A limit another matched limit replaces is not applied (request-wide,
    // as envoyproxy/ratelimit does).
    apply_replaces(&mut matches);
    for (index, found) in matches.iter().enumerate() {
        let Some(found) = found else { continue };
        for rule in found.in_force() {
            if rule.unlimited {
                statuses[index].limit_remaining = u32::MAX;
                continue;
            }
            // A rule of 0 requests refuses everything: no state to keep.
            let store = if rule.blocks_all() {
                None
            } else {
                match stores.rule(&rule.id) {
                    Some(store) => Some(store.clone()),
                    None => continue,
                }
            };
            checks.push(Check {
                descriptor: index,
                store,
                key: found.key.clone(),
                hits: hits(&request.descriptors[index]),
                mode: if rule.shadow_mode {
                    Mode::Shadow
                } else if rule.quota_mode {
                    Mode::Quota
                } else {
                    Mode::Enforced
                },
                shown: Shown {
                    name: rule.name.clone().unwrap_or_default(),
                    requests_per_unit: rule.requests_per_unit,
                    unit: rule.unit.map_or(0, Unit::wire),
                },
            });
        }
    }
    if checks.len() > bounds.max_limits {
        return Err(BadRequest::TooManyLimits {
            count: checks.len(),
            max: bounds.max_limits,
        });
    }
    // The limits that give permits back exactly go first, so one that
    // cannot is asked only when every other admitted (the core `AllOf`'s
    // rule).
    checks.sort_by_key(|c| !c.refundable());
    let quotas = checks.iter().filter(|c| c.mode == Mode::Quota).count();
    let mut seen = vec![Seen::NotAsked; checks.len()];
    let admitted = chain(&checks, &mut seen, quotas, 0);
    let mut outcome = Outcome {
        admitted,
        shadow_refusals: 0,
    };
    // Per descriptor: a refusal shows; else the tightest limit.
    let mut best: Vec<Option<(Snapshot, usize)>> = vec![None; statuses.len()];
    for (i, check) in checks.iter().enumerate() {
        let status = &mut statuses[check.descriptor];
        if status.code == Code::OverLimit as i32 {
            continue;
        }
        let seen = match seen[i] {
            // Admitted, then given back because another limit refused: its
            // state now is what a retry meets.
            Seen::Admitted(_) if !admitted => Seen::Admitted(check.snapshot()),
            // Not asked: whether it would have admitted, read without
            // charging it.
            Seen::NotAsked => {
                let now = check.snapshot();
                if u64::from(now.available) >= check.hits {
                    Seen::Admitted(now)
                } else if u64::from(now.capacity) >= check.hits {
                    Seen::Refused(Rejection::new(Denied::RetryAfter(now.until_full), now))
                } else {
                    Seen::Refused(never_fits(check.hits, now))
                }
            }
            seen => seen,
        };
        match seen {
            Seen::Refused(rejection) if check.mode == Mode::Shadow => {
                outcome.shadow_refusals += 1;
                keep_tighter(&mut best[check.descriptor], rejection.snapshot, i);
            }
            Seen::Refused(rejection) => {
                status.code = Code::OverLimit as i32;
                status.current_limit = Some(wire_limit(&check.shown));
                status.limit_remaining = rejection.snapshot.available;
                status.duration_until_reset = match rejection.denied {
                    Denied::RetryAfter(wait) => Some(duration(wait)),
                    _ => None,
                };
            }
            Seen::Admitted(snapshot) => keep_tighter(&mut best[check.descriptor], snapshot, i),
            Seen::NotAsked => unreachable!("resolved above"),
        }
    }
    for (status, best) in statuses.iter_mut().zip(best) {
        if status.code == Code::OverLimit as i32 {
            continue;
        }
        if let Some((snapshot, i)) = best {
            status.current_limit = Some(wire_limit(&checks[i].shown));
            status.limit_remaining = snapshot.available;
            status.duration_until_reset = Some(duration(snapshot.until_full));
        }
    }
    let overall = if admitted { Code::Ok } else { Code::OverLimit };
    Ok((
        RateLimitResponse {
            overall_code: overall as i32,
            statuses,
            ..Default::default()
        },
        outcome,
    ))
}

/// A request of `hits` that the limit can never hold.
fn never_fits(hits: u64, now: Snapshot) -> Rejection {
    Rejection::new(
        Denied::ExceedsCapacity {
            requested: u32::try_from(hits).unwrap_or(u32::MAX),
            capacity: now.capacity,
        },
        now,
    )
}

/// Asks `checks[0]`, and — if it admits, or its refusal does not refuse
/// the request (shadow and quota mode) — the rest inside its decision, so
/// that a refusal further on gives its permits back
/// ([`tollgate::RateLimiter::try_acquire_n_then`]). `quotas` is the number
/// of quota-mode limits, `quota_refusals` how many of those refused so far.
/// Returns whether the request is admitted.
fn chain(checks: &[Check], seen: &mut [Seen], quotas: usize, quota_refusals: usize) -> bool {
    let Some((check, rest)) = checks.split_first() else {
        // Every enforced limit admitted; quota limits refuse only together.
        return quotas == 0 || quota_refusals < quotas;
    };
    let (first, later) = seen.split_first_mut().expect("one per check");
    let n = match (&check.store, u32::try_from(check.hits)) {
        (Some(_), Ok(n)) => n,
        // A rule of 0 requests, or more hits than any limit holds.
        _ => {
            *first = Seen::Refused(never_fits(check.hits, check.snapshot()));
            return after_refusal(check.mode, rest, later, quotas, quota_refusals);
        }
    };
    if n == 0 {
        // No hits: the state is read, not charged.
        *first = Seen::Admitted(check.snapshot());
        return chain(rest, later, quotas, quota_refusals);
    }
    let store = check.store.as_ref().expect("matched above");
    let mut admitted = false;
    store.decide_then(&check.key, n, &mut |answer| match answer {
        Ok(snapshot) => {
            *first = Seen::Admitted(snapshot);
            admitted = chain(rest, later, quotas, quota_refusals);
            admitted
        }
        Err(rejection) => {
            *first = Seen::Refused(rejection);
            admitted = after_refusal(check.mode, rest, later, quotas, quota_refusals);
            false
        }
    });
    admitted
}

/// What is left of the request after a limit in `mode` refused it.
fn after_refusal(
    mode: Mode,
    rest: &[Check],
    later: &mut [Seen],
    quotas: usize,
    quota_refusals: usize,
) -> bool {
    match mode {
        Mode::Enforced => false,
        Mode::Shadow => chain(rest, later, quotas, quota_refusals),
        Mode::Quota => chain(rest, later, quotas, quota_refusals + 1),
    }
}

/// Keeps the report of the limit that binds first: fewer permits left, then
/// the longer time to full.
fn keep_tighter(best: &mut Option<(Snapshot, usize)>, snapshot: Snapshot, index: usize) {
    if best.is_none_or(|(b, _)| snapshot.binds_before(&b)) {
        *best = Some((snapshot, index));
    }
}

fn wire_limit(shown: &Shown) -> WireLimit {
    WireLimit {
        name: shown.name.clone(),
        requests_per_unit: shown.requests_per_unit,
        unit: shown.unit,
    }
}

fn duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}
