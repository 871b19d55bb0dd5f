//! What a refused request gets back: a [`Refusal`] says why, a hook turns it
//! into a response (by default an RFC 9457 problem document), and the layer
//! adds `Retry-After` and the `RateLimit` fields.

use std::fmt::Write;
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
            Refusal::Unavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
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
            Refusal::NoKey(_) => None,
        }
    }
}

/// The default response: an RFC 9457 problem document
/// (`application/problem+json`) with the refusal's status; a `429` uses the
/// ratelimit draft's `quota-exceeded` problem type and names the violated
/// policy. Replace it with
/// [`ThrottleBuilder::on_refusal`](crate::ThrottleBuilder::on_refusal).
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
    let status = refusal.status();
    let mut body = String::from("{");
    match refusal {
        Refusal::TooManyRequests {
            policy,
            retry_after,
        } => {
            body.push_str(
                r#""type":"https://iana.org/assignments/http-problem-types#quota-exceeded","title":"Request cannot be satisfied as assigned quota has been exceeded","#,
            );
            let _ = write!(
                body,
                r#""detail":"retry after {} ms","violated-policies":[{}],"#,
                retry_after.as_millis(),
                json_string(policy)
            );
        }
        Refusal::NeverFits { policy, denied } => {
            let _ = write!(
                body,
                r#""title":"Request can never be satisfied by this quota","detail":{},"violated-policies":[{}],"#,
                json_string(&denied.to_string()),
                json_string(policy)
            );
        }
        Refusal::Unavailable { policy, reason } => {
            let _ = write!(
                body,
                r#""title":"Rate limit unavailable","detail":{},"violated-policies":[{}],"#,
                json_string(reason),
                json_string(policy)
            );
        }
        Refusal::NoKey(err) => {
            let _ = write!(
                body,
                r#""title":"Request cannot be attributed to a rate-limit key","detail":{},"#,
                json_string(err.reason())
            );
        }
    }
    let _ = write!(body, r#""status":{}}}"#, status.as_u16());
    let mut response = Response::new(Bytes::from(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    response
}

fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_escapes() {
        assert_eq!(json_string("a\"b\\c\n"), r#""a\"b\\c\u000a""#);
    }
}
