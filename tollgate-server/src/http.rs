//! The HTTP side: the rate limit request as JSON on `POST /json` (the
//! protocol's JSON mapping, as envoyproxy/ratelimit offers it),
//! `GET /healthcheck`, and `GET /metrics` in Prometheus's text format.

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use metrics_exporter_prometheus::PrometheusHandle;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::config::Unit;
use crate::proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use crate::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use crate::proto::envoy::service::ratelimit::v3::rate_limit_response::Code;
use crate::proto::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use crate::server::Server;

/// The routes: `POST /json`, `GET /healthcheck`, and with a recorder's
/// handle `GET /metrics`.
pub(crate) fn router(server: Server, metrics: Option<PrometheusHandle>) -> Router {
    let router = Router::new()
        .route("/json", post(json_decision))
        .route("/healthcheck", get(|| async { "OK" }))
        .with_state(server);
    match metrics {
        Some(handle) => router.route(
            "/metrics",
            get(move || {
                let handle = handle.clone();
                async move {
                    (
                        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
                        handle.render(),
                    )
                }
            }),
        ),
        None => router,
    }
}

/// `POST /json`: a `RateLimitRequest` in the protocol's JSON mapping (field
/// names in `lowerCamelCase` or as in the `.proto`), answered with the
/// `RateLimitResponse` in the same mapping: `200` when the overall code is
/// `OK`, `429` when `OVER_LIMIT`, `400` for a request that cannot be read
/// or decided.
async fn json_decision(State(server): State<Server>, body: Bytes) -> Response {
    let request = match serde_json::from_slice::<JsonRequest>(&body)
        .map_err(|e| e.to_string())
        .and_then(JsonRequest::into_wire)
    {
        Ok(request) => request,
        Err(reason) => return bad_request(&reason),
    };
    match server.should_rate_limit(&request).await {
        Ok(response) => {
            let status = if response.overall_code == Code::OverLimit as i32 {
                StatusCode::TOO_MANY_REQUESTS
            } else {
                StatusCode::OK
            };
            (
                status,
                [(header::CONTENT_TYPE, "application/json")],
                response_json(&response).to_string(),
            )
                .into_response()
        }
        Err(bad) => bad_request(&bad.to_string()),
    }
}

fn bad_request(reason: &str) -> Response {
    (
        StatusCode::BAD_REQUEST,
        [(header::CONTENT_TYPE, "application/json")],
        json!({ "error": reason }).to_string(),
    )
        .into_response()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonRequest {
    #[serde(default)]
    domain: String,
    #[serde(default)]
    descriptors: Vec<JsonDescriptor>,
    #[serde(default, alias = "hits_addend", rename = "hitsAddend")]
    hits_addend: Option<JsonInt>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonDescriptor {
    #[serde(default)]
    entries: Vec<JsonEntry>,
    #[serde(default)]
    limit: Option<JsonOverride>,
    #[serde(default, alias = "hits_addend", rename = "hitsAddend")]
    hits_addend: Option<JsonInt>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonEntry {
    key: String,
    #[serde(default)]
    value: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonOverride {
    #[serde(alias = "requests_per_unit", rename = "requestsPerUnit")]
    requests_per_unit: JsonInt,
    unit: JsonUnit,
}

/// An integer as the JSON mapping writes it: a number, or (64-bit fields) a
/// string of digits.
#[derive(Deserialize)]
#[serde(untagged)]
enum JsonInt {
    Number(u64),
    Text(String),
}

impl JsonInt {
    fn get(&self) -> Result<u64, String> {
        match self {
            JsonInt::Number(n) => Ok(*n),
            JsonInt::Text(s) => s.parse().map_err(|_| format!("not an integer: {s:?}")),
        }
    }
}

/// A unit as the JSON mapping writes an enum: its name, or its number.
#[derive(Deserialize)]
#[serde(untagged)]
enum JsonUnit {
    Number(i32),
    Name(String),
}

impl JsonRequest {
    fn into_wire(self) -> Result<RateLimitRequest, String> {
        let hits_addend = match &self.hits_addend {
            Some(n) => u32::try_from(n.get()?).map_err(|_| "hitsAddend above 2^32 - 1")?,
            None => 0,
        };
        let descriptors = self
            .descriptors
            .into_iter()
            .map(|d| {
                let limit = match d.limit {
                    Some(o) => Some(RateLimitOverride {
                        requests_per_unit: u32::try_from(o.requests_per_unit.get()?)
                            .map_err(|_| "requestsPerUnit above 2^32 - 1")?,
                        unit: match o.unit {
                            JsonUnit::Number(n) => n,
                            JsonUnit::Name(name) => Unit::from_name(&name)
                                .map(Unit::wire)
                                .ok_or_else(|| format!("unknown unit {name:?}"))?,
                        },
                    }),
                    None => None,
                };
                Ok(RateLimitDescriptor {
                    entries: d
                        .entries
                        .into_iter()
                        .map(|e| Entry {
                            key: e.key,
                            value: e.value,
                        })
                        .collect(),
                    limit,
                    hits_addend: d.hits_addend.map(|h| h.get()).transpose()?,
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok(RateLimitRequest {
            domain: self.domain,
            descriptors,
            hits_addend,
        })
    }
}

/// The response in the JSON mapping: `lowerCamelCase` names, enums by name,
/// durations as seconds with an `s`, fields at their default left out.
fn response_json(response: &RateLimitResponse) -> Value {
    let mut out = Map::new();
    out.insert(
        "overallCode".into(),
        code_name(response.overall_code).into(),
    );
    let statuses: Vec<Value> = response
        .statuses
        .iter()
        .map(|s| {
            let mut status = Map::new();
            status.insert("code".into(), code_name(s.code).into());
            if let Some(limit) = &s.current_limit {
                let mut l = Map::new();
                if !limit.name.is_empty() {
                    l.insert("name".into(), limit.name.clone().into());
                }
                l.insert("requestsPerUnit".into(), limit.requests_per_unit.into());
                l.insert(
                    "unit".into(),
                    Unit::from_wire(limit.unit)
                        .map_or("UNKNOWN", Unit::wire_name)
                        .into(),
                );
                status.insert("currentLimit".into(), Value::Object(l));
            }
            if s.limit_remaining != 0 {
                status.insert("limitRemaining".into(), s.limit_remaining.into());
            }
            if let Some(d) = &s.duration_until_reset {
                status.insert("durationUntilReset".into(), duration_json(d).into());
            }
            Value::Object(status)
        })
        .collect();
    if !statuses.is_empty() {
        out.insert("statuses".into(), Value::Array(statuses));
    }
    if !response.response_headers_to_add.is_empty() {
        let headers: Vec<Value> = response
            .response_headers_to_add
            .iter()
            .map(|h| json!({ "key": h.key, "value": h.value }))
            .collect();
        out.insert("responseHeadersToAdd".into(), Value::Array(headers));
    }
    Value::Object(out)
}

fn code_name(code: i32) -> &'static str {
    match Code::try_from(code) {
        Ok(Code::Ok) => "OK",
        Ok(Code::OverLimit) => "OVER_LIMIT",
        _ => "UNKNOWN",
    }
}

/// A duration as the JSON mapping writes it: seconds, with 0, 3, 6 or 9
/// fractional digits, and an `s`.
fn duration_json(d: &prost_types::Duration) -> String {
    let nanos = d.nanos;
    if nanos == 0 {
        format!("{}s", d.seconds)
    } else if nanos % 1_000_000 == 0 {
        format!("{}.{:03}s", d.seconds, nanos / 1_000_000)
    } else if nanos % 1_000 == 0 {
        format!("{}.{:06}s", d.seconds, nanos / 1_000)
    } else {
        format!("{}.{:09}s", d.seconds, nanos)
    }
}
