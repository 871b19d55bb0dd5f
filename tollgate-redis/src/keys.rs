//! Redis key names: `<prefix>:<name>:{<caller's key>}:<kind>`.
//!
//! The caller's key sits in a hash tag, so every Redis key made from it lands in
//! one Redis Cluster slot, whatever limiter or kind of state it belongs to: a
//! script may touch several of them in one decision (all of a request's
//! limits, decided at once, do). Redis Cluster hashes the text between the
//! first `{` and the first `}` after it, and neither the prefix nor the name
//! may contain a brace, so the tag is always the caller's key (up to its own
//! first `}`, if it has one): the slot depends on the caller's key alone.
//! (An empty tag — a caller key that is empty or starts with `}` — makes
//! Redis hash the whole key instead, so such a caller's keys may lie in
//! different slots.)
//!
//! Two limiters never share a Redis key unless they have the same prefix, the
//! same name and the same kind, and are asked about the same caller key:
//!
//! * **Two names never share a key.** Everything before the first `{` is
//!   `<prefix>:<name>:`, written by the limiter and never by a caller (the
//!   prefix and the name hold no brace). Two limiters under one prefix whose
//!   names differ differ there, whatever their callers' keys are: no caller
//!   key can reach another name's state, however it imitates its keys
//!   (`global}:tb`, `x:{global`).
//! * **Two caller keys never share a key.** After the first `{` comes the
//!   caller's key, then `}:` and the kind. Each kind's suffix ends
//!   differently from every other's, so the kind is read from the end of the
//!   key, and the caller's key is what lies between the first `{` and that
//!   suffix: one key, braces in it or not.
//!
//! A limiter's identity is thus the text `<prefix>:<name>` and its kind: with
//! the default prefix, different names keep limiters apart. (With a `:` in a
//! prefix or a name, one such text can be spelt in two ways — the prefix
//! `a:b` with the name `c`, the prefix `a` with the name `b:c` — so give each
//! limiter of an application its own name under one prefix.)

use tollgate::ConfigError;

/// The prefix every limiter uses unless told otherwise.
pub(crate) const DEFAULT_PREFIX: &str = "tollgate";

/// The longest name a limiter may have, in bytes.
pub const MAX_NAME_LEN: usize = 128;

/// Checks a prefix: no braces, so the tag around the caller's key is the
/// first in the name.
pub(crate) fn check_prefix(prefix: &str) -> Result<String, ConfigError> {
    if prefix.contains(['{', '}']) {
        return Err(ConfigError::InvalidPrefix);
    }
    Ok(prefix.to_owned())
}

/// Checks a limiter's name: not empty, at most [`MAX_NAME_LEN`] bytes, no
/// braces (which would move the hash tag).
pub(crate) fn check_name(name: &str) -> Result<String, ConfigError> {
    if name.is_empty() || name.len() > MAX_NAME_LEN || name.contains(['{', '}']) {
        return Err(ConfigError::InvalidName);
    }
    Ok(name.to_owned())
}

/// The Redis key holding `kind` state of the limiter `name` for the caller's
/// `key`.
pub(crate) fn redis_key(prefix: &str, name: &str, key: &str, kind: &str) -> String {
    format!("{prefix}:{name}:{{{key}}}:{kind}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_callers_key_is_the_hash_tag() {
        assert_eq!(
            redis_key("tollgate", "api", "user:42", "tb"),
            "tollgate:api:{user:42}:tb"
        );
        assert_eq!(check_prefix("a{b"), Err(ConfigError::InvalidPrefix));
    }

    #[test]
    fn names_are_checked() {
        assert_eq!(check_name("login").as_deref(), Ok("login"));
        assert_eq!(check_name("é").as_deref(), Ok("é"));
        let longest = "n".repeat(MAX_NAME_LEN);
        assert_eq!(check_name(&longest), Ok(longest.clone()));
        for bad in ["", "a{b", "a}b", "{", "}", &"n".repeat(MAX_NAME_LEN + 1)] {
            assert_eq!(check_name(bad), Err(ConfigError::InvalidName), "{bad:?}");
        }
        // The core's message names the same bound.
        assert!(
            ConfigError::InvalidName
                .to_string()
                .contains(&format!("1 to {MAX_NAME_LEN} bytes"))
        );
    }

    #[test]
    fn no_caller_key_reaches_another_names_keys() {
        let global = redis_key("tollgate", "global", "global", "tb");
        for key in [
            "global",
            "global}:tb",
            "x:{global",
            "}:tb",
            "{global}",
            ":global:{global",
        ] {
            for name in ["per-user", "globa", "global:x", "x"] {
                let other = redis_key("tollgate", name, key, "tb");
                assert_ne!(other, global, "{name:?} {key:?}");
            }
        }
    }
}
