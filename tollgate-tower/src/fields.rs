//! The response fields: `Retry-After` (RFC 9110 §10.2.3) and the IETF
//! httpapi `RateLimit-Policy` and `RateLimit` fields, as
//! draft-ietf-httpapi-ratelimit-headers-10 writes them: Structured-Field
//! lists whose members are a quoted policy name with integer parameters —
//! `RateLimit-Policy: "per-ip";q=100;w=60` (quota, window in seconds) and
//! `RateLimit: "per-ip";r=42;t=17` (remaining, seconds until the quota is
//! whole again). The partition key `pk` is left out: it would echo the
//! client's key (an address, an API key) back in every response.

use std::fmt::Write;
use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue};
use tollgate::Snapshot;

use crate::policy::PolicyName;

/// `RateLimit-Policy`.
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit`.
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// Whole seconds, rounded up: a wait of 1 ns is 1 s, never 0.
pub(crate) fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// The `Retry-After` value for an exact retry-after: whole seconds rounded
/// up, so a client that honours it is never early, and never `0` for a wait
/// that is not zero.
///
/// ```
/// use std::time::Duration;
/// use tollgate_tower::retry_after_secs;
/// assert_eq!(retry_after_secs(Duration::from_nanos(1)), 1);
/// assert_eq!(retry_after_secs(Duration::from_secs(2)), 2);
/// assert_eq!(retry_after_secs(Duration::from_millis(2001)), 3);
/// ```
pub fn retry_after_secs(retry_after: Duration) -> u64 {
    ceil_secs(retry_after)
}

/// The two fields being built for one response, one member per policy that
/// decided.
#[derive(Debug, Default)]
pub(crate) struct Fields {
    policy: String,
    state: String,
}

impl Fields {
    /// Adds `name`'s members from the state its decision reported; a policy
    /// that reports nothing adds nothing.
    pub(crate) fn push(&mut self, name: &PolicyName, snapshot: Option<&Snapshot>) {
        let Some(snapshot) = snapshot else { return };
        let sep = |s: &mut String| {
            if !s.is_empty() {
                s.push_str(", ");
            }
        };
        sep(&mut self.policy);
        // Writing to a String cannot fail.
        let _ = write!(self.policy, "\"{}\";q={}", name.as_str(), snapshot.capacity);
        if let Some(w) = name.window_secs() {
            let _ = write!(self.policy, ";w={w}");
        }
        sep(&mut self.state);
        let _ = write!(
            self.state,
            "\"{}\";r={};t={}",
            name.as_str(),
            snapshot.available,
            ceil_secs(snapshot.until_full)
        );
    }

    /// Sets both fields on `headers` (replacing any the inner service set).
    pub(crate) fn apply(self, headers: &mut HeaderMap) {
        if self.policy.is_empty() {
            return;
        }
        // Names are checked to letters, digits and `-_.:/`, the rest is
        // digits and punctuation: always a valid field value.
        if let (Ok(policy), Ok(state)) = (
            HeaderValue::from_str(&self.policy),
            HeaderValue::from_str(&self.state),
        ) {
            headers.insert(RATELIMIT_POLICY, policy);
            headers.insert(RATELIMIT, state);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_in_order_and_syntax() {
        let mut fields = Fields::default();
        let a = PolicyName::new("per-ip")
            .unwrap()
            .window(Duration::from_secs(60));
        let b = PolicyName::new("global").unwrap();
        fields.push(
            &a,
            Some(&Snapshot::new(42, 100, Duration::from_millis(16_001))),
        );
        fields.push(&b, None);
        fields.push(&b, Some(&Snapshot::new(0, 5, Duration::ZERO)));
        let mut headers = HeaderMap::new();
        fields.apply(&mut headers);
        assert_eq!(
            headers[RATELIMIT_POLICY],
            "\"per-ip\";q=100;w=60, \"global\";q=5"
        );
        assert_eq!(
            headers[RATELIMIT],
            "\"per-ip\";r=42;t=17, \"global\";r=0;t=0"
        );
    }
}
