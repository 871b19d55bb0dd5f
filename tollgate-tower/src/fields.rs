//! The response fields: `Retry-After` (RFC 9110 §10.2.3) and the IETF
//! httpapi `RateLimit-Policy` and `RateLimit` fields, as
//! draft-ietf-httpapi-ratelimit-headers-10 writes them: Structured-Field
//! lists whose members are a quoted policy name with integer parameters —
//! `RateLimit-Policy: "per-ip";q=100;w=60` (quota, window in seconds) and
//! `RateLimit: "per-ip";r=42;t=17` (remaining, seconds until the quota is
//! whole again: revision 10's `t`, the seconds until the quota resets —
//! not the later revisions' seconds until more quota is made available). The partition key `pk` is left out: it would echo the
//! client's key (an address, an API key) back in every response.
//!
//! The quoted name is a [`PolicyName`], here with the fields it is written
//! into: its rule (letters, digits and `-_.:/`) is what makes it a valid
//! Structured-Field string as it stands, and it caches its own
//! `RateLimit-Policy` member.

use std::fmt::{self, Write};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};
use tollgate::Snapshot;

/// `RateLimit-Policy`.
///
/// ```
/// assert_eq!(tollgate_tower::RATELIMIT_POLICY.as_str(), "ratelimit-policy");
/// ```
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit`.
///
/// ```
/// assert_eq!(tollgate_tower::RATELIMIT.as_str(), "ratelimit");
/// ```
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// A policy's name and the window it advertises: the `"name";w=…` of the
/// `RateLimit-Policy` field. A name is 1 to 64 characters of letters, digits
/// and `-_.:/`, so it is a valid Structured-Field string as it stands.
///
/// ```
/// use std::time::Duration;
/// use tollgate_tower::PolicyName;
///
/// let name = PolicyName::new("per-ip").unwrap().window(Duration::from_secs(60));
/// assert_eq!(name.as_str(), "per-ip");
/// assert_eq!(name.window_secs(), Some(60));
/// assert!(PolicyName::new("bad name").is_err());
/// ```
#[derive(Clone)]
pub struct PolicyName {
    name: Arc<str>,
    window: Option<u64>,
    /// This policy's `RateLimit-Policy` member for the capacity it was first
    /// written with: the member only changes when the capacity does, so the
    /// common response reuses it instead of formatting it again.
    member: Arc<OnceLock<(u32, HeaderValue)>>,
    /// Its decision counters, registered with the metrics recorder on first
    /// use: a request then updates a counter without building its key.
    #[cfg(feature = "metrics")]
    counters: Arc<OnceLock<[metrics::Counter; 4]>>,
}

impl PartialEq for PolicyName {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name && self.window == other.window
    }
}

impl Eq for PolicyName {}

impl fmt::Debug for PolicyName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PolicyName")
            .field("name", &self.name)
            .field("window", &self.window)
            .finish()
    }
}

impl PolicyName {
    /// This policy's decision counters, by outcome (`admitted`, `rate`,
    /// `never_fits`, `unavailable`), registered on first use.
    #[cfg(feature = "metrics")]
    pub(crate) fn counters(&self) -> &[metrics::Counter; 4] {
        self.counters.get_or_init(|| {
            ["admitted", "rate", "never_fits", "unavailable"].map(|outcome| {
                metrics::counter!(
                    "tollgate_tower_decisions_total",
                    "policy" => metrics::SharedString::from(Arc::clone(&self.name)),
                    "outcome" => outcome
                )
            })
        })
    }

    /// Checks `name`.
    ///
    /// Errors: [`InvalidName`] for an empty, longer than 64, or otherwise
    /// unusable name.
    ///
    /// ```
    /// use tollgate_tower::PolicyName;
    /// assert_eq!(PolicyName::new("login").unwrap().as_str(), "login");
    /// assert!(PolicyName::new("").is_err());
    /// ```
    pub fn new(name: &str) -> Result<Self, InvalidName> {
        let ok = !name.is_empty()
            && name.len() <= 64
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.:/".contains(&b));
        if ok {
            Ok(PolicyName {
                name: name.into(),
                window: None,
                member: Arc::default(),
                #[cfg(feature = "metrics")]
                counters: Arc::default(),
            })
        } else {
            Err(InvalidName(name.to_owned()))
        }
    }

    /// Advertises `window` (whole seconds, rounded up) as the policy's `w`:
    /// the time over which its quota is granted (a fixed window's length, a
    /// token bucket's time to refill from empty). Without it, `w` is left out,
    /// as the draft allows.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate_tower::PolicyName;
    /// let name = PolicyName::new("x").unwrap().window(Duration::from_millis(1500));
    /// assert_eq!(name.window_secs(), Some(2));
    /// ```
    pub fn window(mut self, window: Duration) -> Self {
        self.window = Some(ceil_secs(window));
        self.member = Arc::default();
        self
    }

    /// The name.
    ///
    /// ```
    /// use tollgate_tower::PolicyName;
    /// assert_eq!(PolicyName::new("a").unwrap().as_str(), "a");
    /// ```
    pub fn as_str(&self) -> &str {
        &self.name
    }

    /// The advertised window in seconds, if any.
    ///
    /// ```
    /// use tollgate_tower::PolicyName;
    /// assert_eq!(PolicyName::new("a").unwrap().window_secs(), None);
    /// ```
    pub fn window_secs(&self) -> Option<u64> {
        self.window
    }

    /// The `RateLimit-Policy` member for `capacity`, cached for the first
    /// capacity seen.
    pub(crate) fn policy_member(&self, capacity: u32) -> HeaderValue {
        let format = || policy_member(self, capacity);
        match self.member.get() {
            Some((cached, value)) if *cached == capacity => value.clone(),
            Some(_) => format(),
            None => self.member.get_or_init(|| (capacity, format())).1.clone(),
        }
    }
}

/// A policy name that cannot be used; see [`PolicyName::new`].
///
/// ```
/// use tollgate_tower::PolicyName;
/// let err = PolicyName::new("a b").unwrap_err();
/// assert_eq!(err.to_string(), "policy name \"a b\" must be 1 to 64 of A-Z a-z 0-9 - _ . : /");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidName(pub(crate) String);

impl fmt::Display for InvalidName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "policy name {:?} must be 1 to 64 of A-Z a-z 0-9 - _ . : /",
            self.0
        )
    }
}

impl std::error::Error for InvalidName {}

/// Anything that names a policy: a `&str` (checked) or a [`PolicyName`].
///
/// ```
/// use tollgate_tower::{IntoPolicyName, PolicyName};
/// assert_eq!("a".into_policy_name().unwrap(), PolicyName::new("a").unwrap());
/// ```
pub trait IntoPolicyName {
    /// The checked name.
    ///
    /// Errors: [`InvalidName`], see [`PolicyName::new`].
    fn into_policy_name(self) -> Result<PolicyName, InvalidName>;
}

impl IntoPolicyName for &str {
    fn into_policy_name(self) -> Result<PolicyName, InvalidName> {
        PolicyName::new(self)
    }
}

impl IntoPolicyName for PolicyName {
    fn into_policy_name(self) -> Result<PolicyName, InvalidName> {
        Ok(self)
    }
}

/// Whole seconds, rounded up: a wait of 1 ns is 1 s, never 0. Saturates:
/// `Duration::MAX` has a fraction on top of `u64::MAX` seconds.
pub(crate) fn ceil_secs(d: Duration) -> u64 {
    d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0))
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
/// assert_eq!(retry_after_secs(Duration::MAX), u64::MAX);
/// ```
pub fn retry_after_secs(retry_after: Duration) -> u64 {
    ceil_secs(retry_after)
}

/// The `Retry-After` value of an exact retry-after, in one allocation of
/// its exact size (`HeaderValue::from(u64)` made two: a spare-capacity
/// buffer, then a shared header for it).
pub(crate) fn retry_after_value(retry_after: Duration) -> HeaderValue {
    let mut digits = itoa::Buffer::new();
    let digits = digits.format(retry_after_secs(retry_after)).as_bytes();
    // SAFETY: digits.
    unsafe { crate_value(digits.to_vec()) }
}

/// A `RateLimit-Policy` member: `"name";q=<capacity>[;w=<window>]`.
pub(crate) fn policy_member(name: &PolicyName, capacity: u32) -> HeaderValue {
    let mut member = String::with_capacity(name.as_str().len() + 24);
    // Writing to a String cannot fail.
    let _ = write!(member, "\"{}\";q={capacity}", name.as_str());
    if let Some(w) = name.window_secs() {
        let _ = write!(member, ";w={w}");
    }
    // Checked (written once per policy and capacity, then cached).
    HeaderValue::from_maybe_shared(Bytes::from(member))
        .unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// A `RateLimit` member, `"name";r=<available>;t=<secs>`, in a buffer of
/// its exact size: one allocation, which the value then owns without a
/// copy (a stack buffer copied by `HeaderValue::from_bytes` cost zeroing the
/// buffer, bounds checks on every write, and a second copy).
fn state_member(name: &PolicyName, available: u32, until_full_secs: u64) -> HeaderValue {
    let name = name.as_str().as_bytes();
    let mut r = itoa::Buffer::new();
    let r = r.format(available).as_bytes();
    let mut t = itoa::Buffer::new();
    let t = t.format(until_full_secs).as_bytes();
    let mut member = Vec::with_capacity(name.len() + r.len() + t.len() + 8);
    member.push(b'"');
    member.extend_from_slice(name);
    member.extend_from_slice(b"\";r=");
    member.extend_from_slice(r);
    member.extend_from_slice(b";t=");
    member.extend_from_slice(t);
    // SAFETY: a checked name, digits and `";=rt`.
    unsafe { crate_value(member) }
}

/// A field value from bytes the crate wrote, taken as they are: a buffer
/// whose length is its capacity becomes a `Bytes` without a copy, and
/// http's check of each byte is skipped — about 7 instructions a byte and
/// 70 more on every response (a safe `is_ascii` check first cost 45).
///
/// # Safety
///
/// `bytes` must be ASCII (http's contract is UTF-8). All callers write
/// visible ASCII and spaces, as a field value must be: policy names checked
/// by `PolicyName::new` (letters, digits and `-_.:/`), digits, the
/// parameters' letters, `";=, `, and members written here. Debug builds of
/// http check values and panic, which the tests exercise.
unsafe fn crate_value(bytes: Vec<u8>) -> HeaderValue {
    debug_assert!(bytes.is_ascii());
    // SAFETY: the caller's.
    unsafe { HeaderValue::from_maybe_shared_unchecked(Bytes::from(bytes)) }
}

/// `before, member`: the field of several policies.
fn join(before: &HeaderValue, member: &[u8]) -> HeaderValue {
    let mut joined = Vec::with_capacity(before.len() + 2 + member.len());
    joined.extend_from_slice(before.as_bytes());
    joined.extend_from_slice(b", ");
    joined.extend_from_slice(member);
    // SAFETY: members this module wrote, and `, `.
    unsafe { crate_value(joined) }
}

/// A second policy's members after the first's: out of line and cold, so
/// the one-policy response's code stays in fewer cache lines.
#[cold]
#[inline(never)]
fn join_both(
    policies: &mut HeaderValue,
    states: &mut HeaderValue,
    member: HeaderValue,
    state: HeaderValue,
) {
    *policies = join(policies, member.as_bytes());
    *states = join(states, state.as_bytes());
}

/// The two fields being built for one response, one member per policy that
/// decided. One policy (the common case) costs one small allocation, for the
/// `RateLimit` value: its `RateLimit-Policy` member is cached by its
/// [`PolicyName`].
#[derive(Debug, Default)]
pub(crate) struct Fields {
    policy: Option<HeaderValue>,
    state: Option<HeaderValue>,
}

impl Fields {
    /// Adds `name`'s members from the state its decision reported; a policy
    /// that reports nothing adds nothing.
    pub(crate) fn push(&mut self, name: &PolicyName, snapshot: Option<&Snapshot>) {
        let Some(snapshot) = snapshot else { return };
        let member = name.policy_member(snapshot.capacity);
        let state = state_member(name, snapshot.available, ceil_secs(snapshot.until_full));
        // Matched in place (both are set together): taking the values out
        // and putting them back cost copies of both on every response.
        match (&mut self.policy, &mut self.state) {
            (Some(policies), Some(states)) => join_both(policies, states, member, state),
            _ => {
                self.policy = Some(member);
                self.state = Some(state);
            }
        }
    }

    /// Sets both fields on `headers` (replacing any the inner service set).
    pub(crate) fn apply(self, headers: &mut HeaderMap) {
        if let Fields {
            policy: Some(policy),
            state: Some(state),
        } = self
        {
            headers.insert(RATELIMIT_POLICY, policy);
            headers.insert(RATELIMIT, state);
        }
    }
}

/// The `RateLimit-Policy` and `RateLimit` fields of one response, as the
/// layer writes them, for code that answers outside a layer: a rate limit
/// service that tells a proxy which fields to add, say. One member per
/// policy pushed, in order.
///
/// ```
/// use std::time::Duration;
/// use tollgate::Snapshot;
/// use tollgate_tower::{PolicyName, RateLimitFields};
///
/// let mut fields = RateLimitFields::new();
/// let per_ip = PolicyName::new("per-ip").unwrap().window(Duration::from_secs(60));
/// fields.push(&per_ip, &Snapshot::new(42, 100, Duration::from_millis(16_001)));
/// let (policy, state) = fields.values().unwrap();
/// assert_eq!(policy, r#""per-ip";q=100;w=60"#);
/// assert_eq!(state, r#""per-ip";r=42;t=17"#);
/// assert!(RateLimitFields::new().values().is_none());
/// ```
#[derive(Debug, Default)]
pub struct RateLimitFields {
    fields: Fields,
}

impl RateLimitFields {
    /// No member yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `name`'s members for the state `snapshot` reports: its capacity
    /// as `q`, its available permits as `r`, and the seconds until it is
    /// whole again (rounded up) as `t`.
    pub fn push(&mut self, name: &PolicyName, snapshot: &Snapshot) {
        self.fields.push(name, Some(snapshot));
    }

    /// The `RateLimit-Policy` and `RateLimit` values, or `None` if no
    /// member was pushed.
    pub fn values(self) -> Option<(HeaderValue, HeaderValue)> {
        match self.fields {
            Fields {
                policy: Some(policy),
                state: Some(state),
            } => Some((policy, state)),
            _ => None,
        }
    }

    /// Sets both fields on `headers` (replacing any there), if a member was
    /// pushed.
    pub fn apply(self, headers: &mut HeaderMap) {
        self.fields.apply(headers);
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

    #[test]
    fn a_changed_capacity_is_written_fresh() {
        let name = PolicyName::new("tenant").unwrap();
        for (capacity, expected) in [
            (5, "\"tenant\";q=5"),
            (7, "\"tenant\";q=7"),
            (5, "\"tenant\";q=5"),
        ] {
            let mut fields = Fields::default();
            fields.push(&name, Some(&Snapshot::new(1, capacity, Duration::ZERO)));
            let mut headers = HeaderMap::new();
            fields.apply(&mut headers);
            assert_eq!(headers[RATELIMIT_POLICY], expected);
        }
    }

    #[test]
    fn the_longest_member_fits() {
        let long = "n".repeat(64);
        let name = PolicyName::new(&long).unwrap();
        let mut fields = Fields::default();
        let snapshot = Snapshot::new(u32::MAX, u32::MAX, Duration::MAX);
        fields.push(&name, Some(&snapshot));
        let mut headers = HeaderMap::new();
        fields.apply(&mut headers);
        let expected = format!("\"{long}\";r={};t={}", u32::MAX, ceil_secs(Duration::MAX));
        assert_eq!(headers[RATELIMIT], expected.as_str());
    }
}
