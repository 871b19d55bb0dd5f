//! What a refused request gets back: a [`Refusal`] says why, a hook turns it
//! into a response (by default an RFC 9457 problem document), and the layer
//! adds `Retry-After` and the `RateLimit` fields.

use std::time::Duration;

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderValue, Response, StatusCode};
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
