//! A request's decision, the part every backend shares: its descriptors
//! matched to rules (the plan: which limits, under which keys, for how many
//! hits), and what the backend found turned into the protocol's answer.

use std::time::Duration;

use tollgate::{Denied, Rejection, Snapshot};

use crate::config::{
    Algorithm, Config, Match, Rule, Unit, apply_replaces, override_key, override_stat_name,
};
use crate::proto::envoy::config::core::v3::HeaderValue;
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

/// How a limit's refusal counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Its refusal refuses the request.
    Enforced,
    /// `shadow_mode`: its refusal is counted, the request goes on.
    Shadow,
    /// `quota_mode` (envoyproxy/ratelimit's): the request is refused by
    /// quota limits only when every one of them refuses it.
    Quota,
}

/// The limit a check asks.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Limit<'c> {
    /// A configured rule (never unlimited).
    Rule(&'c Rule),
    /// The request's own limit for a descriptor (Envoy's override): a fixed
    /// window of `permits` per `unit`.
    Override {
        /// Requests per unit.
        permits: u32,
        /// The window.
        unit: Unit,
    },
}

/// One limit a request must pass.
#[derive(Debug)]
pub(crate) struct Check<'c> {
    /// The descriptor it decides, by position in the request.
    pub(crate) descriptor: usize,
    pub(crate) limit: Limit<'c>,
    /// The key its state is kept under.
    pub(crate) key: String,
    /// The hits to charge: the descriptor's, else the request's.
    pub(crate) hits: u64,
    pub(crate) mode: Mode,
    /// envoyproxy/ratelimit's statistics name of the limit (metrics).
    pub(crate) stat_name: String,
}

impl Check<'_> {
    /// A rule of 0 requests: refuses every request, keeps no state.
    pub(crate) fn blocks_all(&self) -> bool {
        matches!(self.limit, Limit::Rule(rule) if rule.blocks_all())
    }

    /// `current_limit`, as the status shows it.
    fn wire_limit(&self) -> WireLimit {
        match self.limit {
            Limit::Rule(rule) => WireLimit {
                name: rule.name.clone().unwrap_or_default(),
                requests_per_unit: rule.requests_per_unit,
                unit: rule.unit.map_or(0, Unit::wire),
            },
            Limit::Override { permits, unit } => WireLimit {
                name: String::new(),
                requests_per_unit: permits,
                unit: unit.wire(),
            },
        }
    }
}

/// A request's limits, and its statuses before any is asked.
#[derive(Debug)]
pub(crate) struct Plan<'c> {
    pub(crate) checks: Vec<Check<'c>>,
    statuses: Vec<DescriptorStatus>,
}

/// What a backend found of a check.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Seen {
    /// Nothing known: not asked, and its state not read.
    NotAsked,
    /// It admits (or would have, had every other limit admitted): its state.
    Admitted(Snapshot),
    /// It refused.
    Refused(Rejection),
    /// It could not be decided, and counts as refused (the Redis backend's
    /// `closed` failure mode).
    Unanswered,
}

/// What a request's decision came to, for metrics and logs.
#[derive(Debug, Default, Clone)]
pub(crate) struct Decided {
    /// Whether the request was admitted.
    pub admitted: bool,
    /// Limits in shadow mode that would have refused it.
    pub shadow_refusals: usize,
}

/// The limits `request` must pass under `config`.
///
/// Errors: the [`BadRequest`]s the protocol answers with an error.
pub(crate) fn plan<'c>(
    config: &'c Config,
    bounds: Bounds,
    request: &RateLimitRequest,
) -> Result<Plan<'c>, BadRequest> {
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
    let mut checks: Vec<Check<'c>> = Vec::new();
    let mut matches: Vec<Option<Match<'c>>> = Vec::with_capacity(request.descriptors.len());
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
        checks.push(Check {
            descriptor: index,
            limit: Limit::Override {
                permits: limit.requests_per_unit,
                unit,
            },
            key: override_key(domain.name(), &entries),
            hits: hits(descriptor),
            mode: Mode::Enforced,
            stat_name: override_stat_name(domain.name(), &entries),
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
            checks.push(Check {
                descriptor: index,
                limit: Limit::Rule(rule),
                key: found.key.clone(),
                hits: hits(&request.descriptors[index]),
                mode: if rule.shadow_mode {
                    Mode::Shadow
                } else if rule.quota_mode {
                    Mode::Quota
                } else {
                    Mode::Enforced
                },
                stat_name: found.stat_name.clone(),
            });
        }
    }
    if checks.len() > bounds.max_limits {
        return Err(BadRequest::TooManyLimits {
            count: checks.len(),
            max: bounds.max_limits,
        });
    }
    Ok(Plan { checks, statuses })
}

/// The answer to a request whose `plan` a backend decided: what it `seen`
/// of each check, in the plan's order, and whether it admitted the request.
pub(crate) fn answer(
    plan: Plan<'_>,
    seen: Vec<Seen>,
    admitted: bool,
    headers: ResponseHeaders,
) -> (RateLimitResponse, Decided) {
    let Plan {
        checks,
        mut statuses,
    } = plan;
    let mut outcome = Decided {
        admitted,
        shadow_refusals: 0,
    };
    // Per descriptor: a refusal shows; else the tightest limit.
    let mut best: Vec<Option<(Snapshot, usize)>> = vec![None; statuses.len()];
    // Per descriptor: the refusing limit's state, for the IETF fields.
    let mut refusing: Vec<Option<(Snapshot, usize)>> = vec![None; statuses.len()];
    for (i, (check, seen)) in checks.iter().zip(seen).enumerate() {
        let status = &mut statuses[check.descriptor];
        if status.code == Code::OverLimit as i32 {
            continue;
        }
        match seen {
            Seen::Refused(rejection) if check.mode == Mode::Shadow => {
                outcome.shadow_refusals += 1;
                keep_tighter(&mut best[check.descriptor], rejection.snapshot, i);
            }
            Seen::Refused(rejection) => {
                refusing[check.descriptor] = Some((rejection.snapshot, i));
                status.code = Code::OverLimit as i32;
                status.current_limit = Some(check.wire_limit());
                status.limit_remaining = rejection.snapshot.available;
                status.duration_until_reset = match rejection.denied {
                    Denied::RetryAfter(wait) => Some(duration(wait)),
                    _ => None,
                };
            }
            Seen::Admitted(snapshot) => keep_tighter(&mut best[check.descriptor], snapshot, i),
            Seen::Unanswered => {
                status.code = Code::OverLimit as i32;
                status.current_limit = Some(check.wire_limit());
            }
            // Its limit, without a state to show.
            Seen::NotAsked if status.current_limit.is_none() => {
                status.current_limit = Some(check.wire_limit());
            }
            Seen::NotAsked => {}
        }
    }
    for (status, best) in statuses.iter_mut().zip(&best) {
        if status.code == Code::OverLimit as i32 {
            continue;
        }
        let best = *best;
        if let Some((snapshot, i)) = best {
            status.current_limit = Some(checks[i].wire_limit());
            status.limit_remaining = snapshot.available;
            status.duration_until_reset = Some(duration(snapshot.until_full));
        }
    }
    let overall = if admitted { Code::Ok } else { Code::OverLimit };
    let response_headers_to_add = match headers {
        ResponseHeaders::Off => Vec::new(),
        ResponseHeaders::RateLimit => ratelimit_headers(&statuses),
        ResponseHeaders::Ietf => {
            let shown = refusing.iter().zip(&best).map(|(r, b)| r.or(*b));
            ietf_fields(&checks, shown)
        }
    };
    (
        RateLimitResponse {
            overall_code: overall as i32,
            statuses,
            response_headers_to_add,
            ..Default::default()
        },
        outcome,
    )
}

/// Which headers the answer asks the proxy to add to the client's response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ResponseHeaders {
    /// None. The default.
    #[default]
    Off,
    /// envoyproxy/ratelimit's (`LIMIT_RESPONSE_HEADERS_ENABLED`):
    /// `RateLimit-Limit` (requests per unit), `RateLimit-Remaining` and
    /// `RateLimit-Reset` (whole seconds, rounded up) of the descriptor
    /// closest to its limit — one over its limit first, else the one with
    /// the fewest left. `RateLimit-Reset` is tollgate's exact time: for a
    /// refused request, until it fits; otherwise until the limit is whole
    /// again.
    RateLimit,
    /// The IETF httpapi fields, as tollgate-tower writes them
    /// (draft-ietf-httpapi-ratelimit-headers-10): `RateLimit-Policy` with a
    /// member per descriptor that has a limit — its statistics name (with
    /// characters a policy name cannot hold as `_`, at most 64), `q` the
    /// limit's capacity and `w` its unit in seconds for the windowed
    /// algorithms — and `RateLimit` with the same members' `r` (permits
    /// left) and `t` (whole seconds until the limit is whole again, rounded
    /// up). The refusing limit of a refused descriptor, else its tightest.
    Ietf,
}

impl std::str::FromStr for ResponseHeaders {
    type Err = String;

    fn from_str(s: &str) -> Result<ResponseHeaders, String> {
        match s {
            "off" => Ok(ResponseHeaders::Off),
            "ratelimit" => Ok(ResponseHeaders::RateLimit),
            "ietf" => Ok(ResponseHeaders::Ietf),
            other => Err(format!("{other:?}: `off`, `ratelimit` or `ietf`")),
        }
    }
}

/// The `RateLimit-*` headers of the status closest to its limit.
fn ratelimit_headers(statuses: &[DescriptorStatus]) -> Vec<HeaderValue> {
    let closest = statuses
        .iter()
        .filter(|s| s.current_limit.is_some())
        .min_by_key(|s| (s.code != Code::OverLimit as i32, s.limit_remaining));
    let Some(status) = closest else {
        return Vec::new();
    };
    let limit = status
        .current_limit
        .as_ref()
        .map_or(0, |l| l.requests_per_unit);
    // Whole seconds rounded up, as tollgate-tower writes `Retry-After`.
    let reset = status.duration_until_reset.map_or(0, |d| {
        let exact = Duration::new(u64::try_from(d.seconds).unwrap_or(0), d.nanos.max(0) as u32);
        tollgate_tower::retry_after_secs(exact)
    });
    let header = |key: &str, value: u64| HeaderValue {
        key: key.to_owned(),
        value: value.to_string(),
        ..Default::default()
    };
    vec![
        header("RateLimit-Limit", u64::from(limit)),
        header("RateLimit-Remaining", u64::from(status.limit_remaining)),
        header("RateLimit-Reset", reset),
    ]
}

/// The IETF `RateLimit-Policy` and `RateLimit` fields: a member for each
/// descriptor whose limit `shown` a state of.
fn ietf_fields(
    checks: &[Check<'_>],
    shown: impl Iterator<Item = Option<(Snapshot, usize)>>,
) -> Vec<HeaderValue> {
    let mut fields = tollgate_tower::RateLimitFields::new();
    for (snapshot, i) in shown.flatten() {
        let check = &checks[i];
        let name: String = check
            .stat_name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || "-_.:/".contains(c) {
                    c
                } else {
                    '_'
                }
            })
            .take(64)
            .collect();
        let Ok(mut policy) = tollgate_tower::PolicyName::new(&name) else {
            continue;
        };
        let window = match check.limit {
            Limit::Rule(rule) => match rule.algorithm {
                Algorithm::TokenBucket { .. } => None,
                _ => rule.unit,
            },
            Limit::Override { unit, .. } => Some(unit),
        };
        if let Some(unit) = window {
            policy = policy.window(unit.duration());
        }
        fields.push(&policy, &snapshot);
    }
    let Some((policy, state)) = fields.values() else {
        return Vec::new();
    };
    // The values are ASCII: checked names, digits and `";=, `.
    let header = |key: &str, value: &[u8]| HeaderValue {
        key: key.to_owned(),
        value: String::from_utf8_lossy(value).into_owned(),
        ..Default::default()
    };
    vec![
        header("RateLimit-Policy", policy.as_bytes()),
        header("RateLimit", state.as_bytes()),
    ]
}

/// A request of `hits` that the limit can never hold.
pub(crate) fn never_fits(hits: u64, now: Snapshot) -> Rejection {
    Rejection::new(
        Denied::ExceedsCapacity {
            requested: u32::try_from(hits).unwrap_or(u32::MAX),
            capacity: now.capacity,
        },
        now,
    )
}

/// Keeps the report of the limit that binds first: fewer permits left, then
/// the longer time to full.
fn keep_tighter(best: &mut Option<(Snapshot, usize)>, snapshot: Snapshot, index: usize) {
    if best.is_none_or(|(b, _)| snapshot.binds_before(&b)) {
        *best = Some((snapshot, index));
    }
}

fn duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}
