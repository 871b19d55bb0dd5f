//! Redis key names: `<prefix>:{<caller's key>}:<kind>`.
//!
//! The caller's key sits in a hash tag, so every Redis key made from it lands in
//! one Redis Cluster slot, whatever kind of state it holds: a script may touch
//! several of them in one decision (the leases of the next step do). Each kind's
//! suffix ends differently from every other's, so two caller keys can never
//! name the same Redis key, braces in them or not.

use tollgate::ConfigError;

/// The prefix every limiter uses unless told otherwise.
pub(crate) const DEFAULT_PREFIX: &str = "tollgate";

/// Checks a prefix: no braces, so the tag around the caller's key is the
/// first in the name.
pub(crate) fn check_prefix(prefix: &str) -> Result<String, ConfigError> {
    if prefix.contains(['{', '}']) {
        return Err(ConfigError::InvalidPrefix);
    }
    Ok(prefix.to_owned())
}

/// The Redis key holding `kind` state for the caller's `key`.
pub(crate) fn redis_key(prefix: &str, key: &str, kind: &str) -> String {
    format!("{prefix}:{{{key}}}:{kind}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_callers_key_is_the_hash_tag() {
        assert_eq!(
            redis_key("tollgate", "user:42", "tb"),
            "tollgate:{user:42}:tb"
        );
        assert_eq!(check_prefix("a{b"), Err(ConfigError::InvalidPrefix));
    }
}
