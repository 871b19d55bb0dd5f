//! What a refused request gets back: a [`Refusal`] says why, a hook turns it
//! into a response (by default an RFC 9457 problem document, or a gRPC
//! trailers-only response for a gRPC request), and the layer adds
//! `Retry-After` and the `RateLimit` fields.

use std::time::Duration;

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderMap, HeaderValue, Response, StatusCode};
use tollgate::Denied;

use crate::key::KeyError;

/// Why the layer answered a request itself instead of passing it on.
///
/// ```
/// use std::time::Duration;
/// use http::StatusCode;
/// use tollgate_tower::Refusal;
///
/// let refusal = Refusal::TooManyRequests { policy: "per-ip", retry_after: Duration::from_millis(1200) };
/// assert_eq!(refusal.status(), StatusCode::TOO_MANY_REQUESTS);
/// ```
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub enum Refusal<'a> {
    /// `429`: a policy has no room now; the same request fits after
    /// `retry_after` (exact; `Retry-After` carries it rounded up).
    TooManyRequests {
        /// The policy that denied.
        policy: &'a str,
        /// The exact wait.
        retry_after: Duration,
    },
    /// `403`: the request can never pass this policy — it asks for more
    /// permits than the policy's capacity, so no wait helps. Not `429`
    /// (retrying is futile and `Retry-After` would be a lie), not `413`
    /// (RFC 9110 reserves it for content size, and a request's cost may come
    /// from its route), not `400` (the request is well-formed): `403` is
    /// "understood, refused, do not repeat it unchanged".
    NeverFits {
        /// The policy that denied.
        policy: &'a str,
        /// The core's answer ([`Denied::ExceedsCapacity`] with the figures).
        denied: Denied,
    },
    /// `503`: a policy could not decide (its remote limiter is unreachable).
    Unavailable {
        /// The policy that failed.
        policy: &'a str,
        /// What went wrong.
        reason: &'a str,
    },
    /// The request's key could not be found: the [`KeyError`]'s status.
    NoKey(&'a KeyError),
    /// `503`: a [`ConcurrencyLayer`](crate::ConcurrencyLayer) has no permit
    /// free (within its queue's bound): the service is at its concurrency
    /// limit. No `Retry-After`: when a permit comes back depends on requests
    /// in flight, not on a clock.
    Overloaded {
        /// The concurrency limit in force when the request was refused.
        limit: u32,
    },
}

impl Refusal<'_> {
    /// The status the default response uses.
    ///
    /// ```
    /// use http::StatusCode;
    /// use tollgate::Denied;
    /// use tollgate_tower::Refusal;
    ///
    /// let never = Refusal::NeverFits { policy: "p", denied: Denied::ExceedsCapacity { requested: 9, capacity: 5 } };
    /// assert_eq!(never.status(), StatusCode::FORBIDDEN);
    /// ```
    pub fn status(&self) -> StatusCode {
        match self {
            Refusal::TooManyRequests { .. } => StatusCode::TOO_MANY_REQUESTS,
            Refusal::NeverFits { .. } => StatusCode::FORBIDDEN,
            Refusal::Unavailable { .. } | Refusal::Overloaded { .. } => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            Refusal::NoKey(err) => err.status(),
        }
    }

    /// The gRPC status code the default gRPC response
    /// ([`grpc_response`]) uses, as its number (`tonic::Code::from(code)`
    /// with tonic). The one place a refusal's gRPC code is decided, as
    /// [`status`](Self::status) is for HTTP:
    ///
    /// | refusal | code | why |
    /// |---|---|---|
    /// | [`TooManyRequests`](Refusal::TooManyRequests) | `8` `RESOURCE_EXHAUSTED` | a quota is spent for now: gRPC's own example of the code ("perhaps a per-user quota") |
    /// | [`NeverFits`](Refusal::NeverFits) | `9` `FAILED_PRECONDITION` | the request costs more than the policy's capacity: not `RESOURCE_EXHAUSTED`, which says "wait and retry" (and retry policies often retry it), when no wait helps; the status code guide's rule for this code is "do not retry until the system state has been explicitly fixed" — here, the policy's capacity raised. Not `INVALID_ARGUMENT`, which is for requests wrong "regardless of the state of the system" (the same request fits a larger capacity); not `OUT_OF_RANGE`, which is for positions past the end of an ordered space that callers iterate through |
    /// | [`Unavailable`](Refusal::Unavailable) | `14` `UNAVAILABLE` | the policy could not decide (its remote limiter is unreachable): transient, and retrying the call is safe — nothing was done |
    /// | [`Overloaded`](Refusal::Overloaded) | `14` `UNAVAILABLE` | shed by a concurrency limit before any work: the code gRPC retry policies retry |
    /// | [`NoKey`](Refusal::NoKey) | from the [`KeyError`]'s status | `400` → `3` `INVALID_ARGUMENT`, `401` → `16` `UNAUTHENTICATED`, `403` → `7` `PERMISSION_DENIED`, `404` → `5` `NOT_FOUND`, `409` → `10` `ABORTED`, `429` → `8` `RESOURCE_EXHAUSTED`, `499` → `1` `CANCELLED`, `500` → `13` `INTERNAL` (the default for a missing peer address: a wiring mistake), `501` → `12` `UNIMPLEMENTED`, `503` → `14` `UNAVAILABLE`, `504` → `4` `DEADLINE_EXCEEDED` (`google.rpc.Code`'s HTTP mapping, read backwards); any other → `2` `UNKNOWN` |
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::Denied;
    /// use tollgate_tower::Refusal;
    ///
    /// let wait = Refusal::TooManyRequests { policy: "per-ip", retry_after: Duration::from_secs(1) };
    /// assert_eq!(wait.grpc_code(), 8); // RESOURCE_EXHAUSTED
    /// assert_eq!(tonic::Code::from(wait.grpc_code()), tonic::Code::ResourceExhausted);
    /// let never = Refusal::NeverFits { policy: "p", denied: Denied::ExceedsCapacity { requested: 9, capacity: 5 } };
    /// assert_eq!(never.grpc_code(), 9); // FAILED_PRECONDITION
    /// assert_eq!(Refusal::Overloaded { limit: 8 }.grpc_code(), 14); // UNAVAILABLE
    /// ```
    pub fn grpc_code(&self) -> i32 {
        match self {
            Refusal::TooManyRequests { .. } => grpc::RESOURCE_EXHAUSTED,
            Refusal::NeverFits { .. } => grpc::FAILED_PRECONDITION,
            Refusal::Unavailable { .. } | Refusal::Overloaded { .. } => grpc::UNAVAILABLE,
            Refusal::NoKey(err) => grpc::code_of_http(err.status()),
        }
    }

    /// The policy involved, if any.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate_tower::Refusal;
    /// let r = Refusal::TooManyRequests { policy: "login", retry_after: Duration::from_secs(1) };
    /// assert_eq!(r.policy(), Some("login"));
    /// ```
    pub fn policy(&self) -> Option<&str> {
        match self {
            Refusal::TooManyRequests { policy, .. }
            | Refusal::NeverFits { policy, .. }
            | Refusal::Unavailable { policy, .. } => Some(policy),
            Refusal::NoKey(_) | Refusal::Overloaded { .. } => None,
        }
    }
}

/// The default response: an RFC 9457 problem document
/// (`application/problem+json`) with the refusal's status; a `429` uses the
/// ratelimit draft's `quota-exceeded` problem type and names the violated
/// policy. Replace it with
/// [`ThrottleBuilder::on_refusal`](crate::ThrottleBuilder::on_refusal) (or
/// [`ConcurrencyBuilder::on_shed`](crate::ConcurrencyBuilder::on_shed) for
/// [`Refusal::Overloaded`]).
///
/// ```
/// use std::time::Duration;
/// use tollgate_tower::{Refusal, problem_response};
///
/// let response = problem_response(&Refusal::TooManyRequests { policy: "per-ip", retry_after: Duration::from_secs(2) });
/// assert_eq!(response.status(), 429);
/// assert_eq!(response.headers()["content-type"], "application/problem+json");
/// assert!(std::str::from_utf8(response.body()).unwrap().contains(r#""violated-policies":["per-ip"]"#));
/// ```
pub fn problem_response(refusal: &Refusal<'_>) -> Response<Bytes> {
    use Piece::{Json, Text};
    let status = refusal.status();
    let body = match refusal {
        Refusal::TooManyRequests {
            policy,
            retry_after,
        } => {
            let mut ms = itoa::Buffer::new();
            document(&[
                Text(
                    r#"{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","title":"Request cannot be satisfied as assigned quota has been exceeded","detail":"retry after "#,
                ),
                // Whole milliseconds rounded up, as `Retry-After` rounds up
                // to seconds: a real wait never reads 0. Formatting a u128
                // costs twice a u64's.
                Text(match u64::try_from(ceil_millis(*retry_after)) {
                    Ok(millis) => ms.format(millis),
                    Err(_) => ms.format(ceil_millis(*retry_after)),
                }),
                Text(r#" ms","violated-policies":["#),
                Json(policy),
                Text(r#"],"status":429}"#),
            ])
        }
        Refusal::NeverFits { policy, denied } => document(&[
            Text(r#"{"title":"Request can never be satisfied by this quota","detail":"#),
            Json(&denied.to_string()),
            Text(r#","violated-policies":["#),
            Json(policy),
            Text(r#"],"status":403}"#),
        ]),
        Refusal::Unavailable { policy, reason } => document(&[
            Text(r#"{"title":"Rate limit unavailable","detail":"#),
            Json(reason),
            Text(r#","violated-policies":["#),
            Json(policy),
            Text(r#"],"status":503}"#),
        ]),
        Refusal::NoKey(err) => document(&[
            Text(r#"{"title":"Request cannot be attributed to a rate-limit key","detail":"#),
            Json(err.reason()),
            Text(r#","status":"#),
            Text(status.as_str()),
            Text("}"),
        ]),
        // The limit is not written: a client has no use for it, and it
        // tells anyone probing how much load the service takes.
        Refusal::Overloaded { .. } => document(&[Text(
            r#"{"title":"Service overloaded","detail":"every request slot is in use; try again later","status":503}"#,
        )]),
    };
    let mut response = Response::new(body);
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    response
}

/// The default response to a refused gRPC request (one whose
/// `content-type` is `application/grpc`, or starts with `application/grpc+`
/// or `application/grpc;`): a gRPC "trailers-only" response, the form the
/// gRPC protocol gives a call that fails at once. Its HTTP status is `200`
/// (a gRPC client reads any other status as a broken proxy's: a `429`
/// reaches the application as `UNAVAILABLE` or `INTERNAL`, without its
/// message), its body is empty, and its headers are the call's status:
///
/// - `content-type: application/grpc` (no message follows, so no subtype is
///   needed to decode one; every gRPC client accepts the base type);
/// - `grpc-status`: [`Refusal::grpc_code`] — `8` `RESOURCE_EXHAUSTED` for a
///   spent quota, `9` `FAILED_PRECONDITION` for a request no wait lets
///   through, `14` `UNAVAILABLE` for a policy that could not decide and for
///   a shed request;
/// - `grpc-message`: what happened, percent-encoded as the protocol says
///   (every byte outside printable ASCII, and `%`, as `%XX`);
/// - for [`Refusal::TooManyRequests`], `grpc-retry-pushback-ms`: the wait
///   in whole milliseconds, rounded up — the server pushback that gRPC's
///   client retry policies honour (when their `retryableStatusCodes`
///   include `RESOURCE_EXHAUSTED`) in place of their own backoff.
///
/// The throttle layer then adds what it adds to every refusal, as metadata
/// the client reads from its status (`status.metadata()` in tonic):
/// `retry-after` in whole seconds rounded up, and the `ratelimit-policy` and
/// `ratelimit` fields. Replace it with
/// [`ThrottleBuilder::on_grpc_refusal`](crate::ThrottleBuilder::on_grpc_refusal)
/// (or [`ConcurrencyBuilder::on_grpc_shed`](crate::ConcurrencyBuilder::on_grpc_shed)
/// for [`Refusal::Overloaded`]).
///
/// ```
/// use std::time::Duration;
/// use tollgate_tower::{Refusal, grpc_response};
///
/// let response = grpc_response(&Refusal::TooManyRequests { policy: "per-ip", retry_after: Duration::from_millis(1500) });
/// assert_eq!(response.status(), 200);
/// assert_eq!(response.headers()["content-type"], "application/grpc");
/// assert_eq!(response.headers()["grpc-status"], "8");
/// assert_eq!(response.headers()["grpc-message"], r#"quota "per-ip" exceeded; retry after 1500 ms"#);
/// assert_eq!(response.headers()["grpc-retry-pushback-ms"], "1500");
/// assert!(response.body().is_empty());
/// ```
pub fn grpc_response(refusal: &Refusal<'_>) -> Response<Bytes> {
    let mut pushback = None;
    let message = match refusal {
        Refusal::TooManyRequests {
            policy,
            retry_after,
        } => {
            // Whole milliseconds rounded up, as in the problem document: a
            // real wait never reads 0 (saturated at u64::MAX).
            let millis = u64::try_from(ceil_millis(*retry_after)).unwrap_or(u64::MAX);
            pushback = Some(HeaderValue::from(millis));
            grpc::message(&[
                "quota \"",
                policy,
                "\" exceeded; retry after ",
                itoa::Buffer::new().format(millis),
                " ms",
            ])
        }
        Refusal::NeverFits { policy, denied } => grpc::message(&[
            "request can never be satisfied by quota \"",
            policy,
            "\": ",
            &denied.to_string(),
        ]),
        Refusal::Unavailable { policy, reason } => grpc::message(&[
            "rate limit \"",
            policy,
            "\" unavailable",
            if reason.is_empty() { "" } else { ": " },
            reason,
        ]),
        Refusal::NoKey(err) => grpc::message(&[
            "request cannot be attributed to a rate-limit key: ",
            err.reason(),
        ]),
        // As in the problem document, the limit is not written.
        Refusal::Overloaded { .. } => HeaderValue::from_static(
            "service overloaded: every request slot is in use; try again later",
        ),
    };
    let mut response = Response::new(Bytes::new());
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.insert(grpc::STATUS, HeaderValue::from(refusal.grpc_code()));
    headers.insert(grpc::MESSAGE, message);
    if let Some(pushback) = pushback {
        headers.insert(grpc::RETRY_PUSHBACK, pushback);
    }
    response
}

/// Whether a request with these headers is a gRPC call: its `content-type`
/// is `application/grpc`, or that followed by `+` (a message subtype such as
/// `+proto`) or `;` (parameters), the type and subtype compared without
/// regard to case. gRPC-Web (`application/grpc-web…`) is another protocol
/// and is not matched.
pub(crate) fn is_grpc(headers: &HeaderMap) -> bool {
    const BASE: &[u8] = b"application/grpc";
    let Some(value) = headers.get(CONTENT_TYPE) else {
        return false;
    };
    let value = value.as_bytes();
    value.len() >= BASE.len()
        && value[..BASE.len()].eq_ignore_ascii_case(BASE)
        && matches!(value.get(BASE.len()), None | Some(b'+' | b';'))
}

/// gRPC's names and numbers.
mod grpc {
    use http::{HeaderName, HeaderValue, StatusCode};

    pub(super) const STATUS: HeaderName = HeaderName::from_static("grpc-status");
    pub(super) const MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
    /// The server's pushback of the client's retry (gRFC A6, client retries).
    pub(super) const RETRY_PUSHBACK: HeaderName = HeaderName::from_static("grpc-retry-pushback-ms");

    pub(super) const CANCELLED: i32 = 1;
    pub(super) const UNKNOWN: i32 = 2;
    pub(super) const INVALID_ARGUMENT: i32 = 3;
    pub(super) const DEADLINE_EXCEEDED: i32 = 4;
    pub(super) const NOT_FOUND: i32 = 5;
    pub(super) const PERMISSION_DENIED: i32 = 7;
    pub(super) const RESOURCE_EXHAUSTED: i32 = 8;
    pub(super) const FAILED_PRECONDITION: i32 = 9;
    pub(super) const ABORTED: i32 = 10;
    pub(super) const UNIMPLEMENTED: i32 = 12;
    pub(super) const INTERNAL: i32 = 13;
    pub(super) const UNAVAILABLE: i32 = 14;
    pub(super) const UNAUTHENTICATED: i32 = 16;

    /// The code of an HTTP status: `google.rpc.Code`'s HTTP mapping read
    /// backwards (where several codes share a status, the general one:
    /// `400` is `INVALID_ARGUMENT`, `409` `ABORTED`, `500` `INTERNAL`).
    pub(super) fn code_of_http(status: StatusCode) -> i32 {
        match status.as_u16() {
            400 => INVALID_ARGUMENT,
            401 => UNAUTHENTICATED,
            403 => PERMISSION_DENIED,
            404 => NOT_FOUND,
            409 => ABORTED,
            429 => RESOURCE_EXHAUSTED,
            499 => CANCELLED,
            500 => INTERNAL,
            501 => UNIMPLEMENTED,
            503 => UNAVAILABLE,
            504 => DEADLINE_EXCEEDED,
            _ => UNKNOWN,
        }
    }

    /// Whether `byte` stands as it is in a `grpc-message`: space and
    /// visible ASCII but `%` (the protocol's Percent-Byte-Unencoded).
    fn plain(byte: u8) -> bool {
        matches!(byte, 0x20..=0x24 | 0x26..=0x7e)
    }

    /// `pieces`, one after another, as a `grpc-message` value: UTF-8,
    /// percent-encoded with upper-case hex digits, written into a buffer of
    /// its exact size that the value takes without a copy.
    pub(super) fn message(pieces: &[&str]) -> HeaderValue {
        const HEX: &[u8; 16] = b"0123456789ABCDEF";
        let len = pieces
            .iter()
            .flat_map(|piece| piece.bytes())
            .map(|b| if plain(b) { 1 } else { 3 })
            .sum();
        let mut out = Vec::with_capacity(len);
        for b in pieces.iter().flat_map(|piece| piece.bytes()) {
            if plain(b) {
                out.push(b);
            } else {
                out.extend_from_slice(&[b'%', HEX[usize::from(b >> 4)], HEX[usize::from(b & 0xf)]]);
            }
        }
        debug_assert_eq!(out.len(), len);
        HeaderValue::from_maybe_shared(bytes::Bytes::from(out))
            .expect("percent-encoded text is a valid header value")
    }
}

/// A piece of a problem document: text as it stands, or a string to write as
/// a JSON string.
enum Piece<'a> {
    Text(&'a str),
    Json(&'a str),
}

/// The document of `pieces`, written into a buffer of its exact size: a
/// `Bytes` takes that buffer without a copy or another allocation. (Written
/// with `fmt` into a growing `String`, a `429` cost more than the rest of the
/// layer's refusal together.) Inlined, the loops over a constant list unroll
/// and the texts' copies have constant sizes.
#[inline(always)]
fn document(pieces: &[Piece<'_>]) -> Bytes {
    let len = pieces
        .iter()
        .map(|piece| match piece {
            Piece::Text(text) => text.len(),
            Piece::Json(s) => json_len(s),
        })
        .sum();
    let mut out = Vec::with_capacity(len);
    for piece in pieces {
        match piece {
            Piece::Text(text) => out.extend_from_slice(text.as_bytes()),
            Piece::Json(s) => push_json(&mut out, s),
        }
    }
    debug_assert_eq!(out.len(), len);
    Bytes::from(out)
}

/// How many bytes `push_json` writes for `byte`: 2 for the two escapes JSON
/// names, 6 for `\u00XX` (the other control characters), else 1 — bytes of
/// multi-byte characters (all `>= 0x80`) are written as they are.
fn escape_len(byte: u8) -> usize {
    match byte {
        b'"' | b'\\' => 2,
        0..0x20 => 6,
        _ => 1,
    }
}

fn json_len(s: &str) -> usize {
    if plain(s) {
        s.len() + 2
    } else {
        2 + s.bytes().map(escape_len).sum::<usize>()
    }
}

/// Whether `s` needs no escape (policy names never do).
fn plain(s: &str) -> bool {
    s.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\')
}

fn push_json(out: &mut Vec<u8>, s: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push(b'"');
    if plain(s) {
        out.extend_from_slice(s.as_bytes());
    } else {
        for b in s.bytes() {
            match b {
                b'"' | b'\\' => out.extend_from_slice(&[b'\\', b]),
                0..0x20 => out.extend_from_slice(&[
                    b'\\',
                    b'u',
                    b'0',
                    b'0',
                    HEX[usize::from(b >> 4)],
                    HEX[usize::from(b & 0xf)],
                ]),
                _ => out.push(b),
            }
        }
    }
    out.push(b'"');
}

/// `duration` in whole milliseconds, rounded up.
fn ceil_millis(duration: std::time::Duration) -> u128 {
    duration.as_nanos().div_ceil(1_000_000)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(refusal: &Refusal<'_>) -> String {
        String::from_utf8(problem_response(refusal).into_body().to_vec()).unwrap()
    }

    /// The documents byte for byte, as the `fmt` version wrote them.
    #[test]
    fn documents() {
        assert_eq!(
            body(&Refusal::TooManyRequests {
                policy: "per-ip",
                retry_after: Duration::from_micros(1_200_000)
            }),
            r#"{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","title":"Request cannot be satisfied as assigned quota has been exceeded","detail":"retry after 1200 ms","violated-policies":["per-ip"],"status":429}"#
        );
        // Rounded up, as `Retry-After` is: a sub-millisecond wait is 1 ms.
        for (wait, ms) in [(1_200_500, "1201"), (300, "1"), (1, "1")] {
            let text = body(&Refusal::TooManyRequests {
                policy: "p",
                retry_after: Duration::from_micros(wait),
            });
            assert!(text.contains(&format!("retry after {ms} ms")), "{text}");
        }
        assert_eq!(
            body(&Refusal::NeverFits {
                policy: "login",
                denied: Denied::ExceedsCapacity {
                    requested: 9,
                    capacity: 5
                }
            }),
            r#"{"title":"Request can never be satisfied by this quota","detail":"9 permits requested but at most 5 can ever be granted at once","violated-policies":["login"],"status":403}"#
        );
        assert_eq!(
            body(&Refusal::Unavailable {
                policy: "remote",
                reason: "connection refused\n"
            }),
            r#"{"title":"Rate limit unavailable","detail":"connection refused\u000a","violated-policies":["remote"],"status":503}"#
        );
        assert_eq!(
            body(&Refusal::Overloaded { limit: 12 }),
            r#"{"title":"Service overloaded","detail":"every request slot is in use; try again later","status":503}"#
        );
        let err = KeyError::new(StatusCode::UNAUTHORIZED, "no \"key\"");
        assert_eq!(
            body(&Refusal::NoKey(&err)),
            r#"{"title":"Request cannot be attributed to a rate-limit key","detail":"no \"key\"","status":401}"#
        );
    }

    fn grpc(refusal: &Refusal<'_>) -> (String, String) {
        let response = grpc_response(refusal);
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.headers()[CONTENT_TYPE], "application/grpc");
        assert!(response.body().is_empty());
        let header = |name| response.headers()[name].to_str().unwrap().to_owned();
        (header("grpc-status"), header("grpc-message"))
    }

    /// Each refusal's code and message, byte for byte.
    #[test]
    fn grpc_statuses() {
        let wait = Refusal::TooManyRequests {
            policy: "per-ip",
            retry_after: Duration::from_micros(1_200_500),
        };
        assert_eq!(
            grpc(&wait),
            (
                "8".into(),
                r#"quota "per-ip" exceeded; retry after 1201 ms"#.into()
            )
        );
        assert_eq!(
            grpc_response(&wait).headers()["grpc-retry-pushback-ms"],
            "1201"
        );
        let never = Refusal::NeverFits {
            policy: "login",
            denied: Denied::ExceedsCapacity {
                requested: 9,
                capacity: 5,
            },
        };
        assert_eq!(
            grpc(&never),
            (
                "9".into(),
                r#"request can never be satisfied by quota "login": 9 permits requested but at most 5 can ever be granted at once"#.into()
            )
        );
        let unavailable = Refusal::Unavailable {
            policy: "remote",
            reason: "connection refused\n",
        };
        assert_eq!(
            grpc(&unavailable),
            (
                "14".into(),
                r#"rate limit "remote" unavailable: connection refused%0A"#.into()
            )
        );
        let silent = Refusal::Unavailable {
            policy: "remote",
            reason: "",
        };
        assert_eq!(grpc(&silent).1, r#"rate limit "remote" unavailable"#);
        assert_eq!(
            grpc(&Refusal::Overloaded { limit: 12 }),
            (
                "14".into(),
                "service overloaded: every request slot is in use; try again later".into()
            )
        );
        let err = KeyError::new(StatusCode::UNAUTHORIZED, "no key, 100% sure");
        assert_eq!(
            grpc(&Refusal::NoKey(&err)),
            (
                "16".into(),
                "request cannot be attributed to a rate-limit key: no key, 100%25 sure".into()
            )
        );
        for refusal in [&never, &unavailable, &Refusal::Overloaded { limit: 1 }] {
            assert!(
                grpc_response(refusal)
                    .headers()
                    .get("grpc-retry-pushback-ms")
                    .is_none()
            );
        }
    }

    #[test]
    fn key_errors_map_to_grpc_codes() {
        let code = |status: u16| {
            let err = KeyError::new(StatusCode::from_u16(status).unwrap(), "x");
            Refusal::NoKey(&err).grpc_code()
        };
        let pairs = [
            (400, 3),
            (401, 16),
            (403, 7),
            (404, 5),
            (409, 10),
            (429, 8),
            (499, 1),
            (500, 13),
            (501, 12),
            (503, 14),
            (504, 4),
            (418, 2),
            (502, 2),
        ];
        for (status, expected) in pairs {
            assert_eq!(code(status), expected, "{status}");
        }
    }

    /// The protocol's Percent-Encoded: space and visible ASCII but `%` as
    /// they are, everything else (UTF-8 bytes, controls, `%`) as `%XX` with
    /// upper-case digits.
    #[test]
    fn grpc_message_encoding() {
        let encoded = |s: &str| grpc::message(&[s]).to_str().unwrap().to_owned();
        assert_eq!(
            encoded("plain text: \"ok\" ~!#$&'()*+,/;=?@[]^_`{|}"),
            "plain text: \"ok\" ~!#$&'()*+,/;=?@[]^_`{|}"
        );
        assert_eq!(encoded("100%"), "100%25");
        assert_eq!(encoded("a\tb\r\n\u{7f}"), "a%09b%0D%0A%7F");
        assert_eq!(encoded("café ✓"), "caf%C3%A9 %E2%9C%93");
        assert_eq!(grpc::message(&["a", "", "b%"]), "ab%25");
    }

    #[test]
    fn grpc_content_types() {
        let with = |content_type: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(CONTENT_TYPE, HeaderValue::from_str(content_type).unwrap());
            is_grpc(&headers)
        };
        for yes in [
            "application/grpc",
            "application/grpc+proto",
            "application/grpc+json",
            "application/grpc;charset=utf-8",
            "application/grpc+",
            "APPLICATION/GRPC+proto",
        ] {
            assert!(with(yes), "{yes}");
        }
        for no in [
            "application/grpc-web",
            "application/grpc-web+proto",
            "application/grpc-web-text",
            "application/grpcx",
            "application/grp",
            "application/json",
            "text/plain; application/grpc",
            "",
        ] {
            assert!(!with(no), "{no}");
        }
        assert!(!is_grpc(&HeaderMap::new()));
    }

    fn json(s: &str) -> String {
        let mut out = Vec::new();
        push_json(&mut out, s);
        assert_eq!(out.len(), json_len(s));
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn json_escapes() {
        assert_eq!(json("a\"b\\c\n"), r#""a\"b\\c\u000a""#);
        assert_eq!(json("\u{1f}é\u{7f}"), "\"\\u001fé\u{7f}\"");
        assert_eq!(json("per-ip"), r#""per-ip""#);
        assert_eq!(json(""), r#""""#);
    }
}
