//! What can go wrong with a decision: a denial, or no decision at all. A
//! configuration the scripts cannot honour is the core's
//! [`ConfigError`](tollgate::ConfigError).

use std::fmt;
use std::time::Duration;

use tollgate::Denied;

/// Why a decision did not admit the request.
///
/// [`Error::Denied`] is the limiter's answer, the same [`Denied`] the
/// in-process limiters give; every other variant says the answer could not be
/// had, and what to do then (fail open, fail closed, fall back to a local
/// limiter) is the caller's policy.
///
/// # Whether the request was charged
///
/// A failed call may still have admitted the request on the server: the
/// script ran and took the permits, and the reply was lost.
/// [`may_have_run`](Error::may_have_run) says which failures leave that open
/// (`true`: the request may have been charged) and which prove it was not
/// (`false`: no permit was taken for this call).
///
/// | variant | `may_have_run()` | what happened |
/// |---|---|---|
/// | [`Denied`](Error::Denied) | `false` | the script decided and wrote nothing, or no call was made |
/// | [`Timeout`](Error::Timeout) | **`true`** | the deadline passed: the request may have reached the server, and the script may have run |
/// | [`Interrupted`](Error::Interrupted) | **`true`** | the connection failed after the request may have been sent (dropped, reset, closed mid-call), or a cluster client resent it |
/// | [`Redis`](Error::Redis) | `false` | refused before any permit was taken: connection refused, server `LOADING`, `BUSY`, `NOSCRIPT`, `OOM` or `READONLY` (refused before the script's first write), an invalid URL or configuration |
/// | [`WrongType`](Error::WrongType) | `false` | the script found another Redis type and wrote nothing |
/// | [`UnknownState`](Error::UnknownState) | `false` | the script found state it did not write, or damaged fields, and wrote nothing |
/// | [`UnexpectedReply`](Error::UnexpectedReply) | **`true`** | a reply came that the scripts never give: what the server did is unknown |
/// | [`Unavailable`](Error::Unavailable) | `false` | the leased limiter refused locally, without a call |
/// | [`BlockingInAsync`](Error::BlockingInAsync) | `false` | nothing was sent |
/// | [`InvalidCall`](Error::InvalidCall) | `false` | nothing was sent |
///
/// Every expired deadline is [`Error::Timeout`]: the client's own, and
/// redis-rs's (a connection attempt that timed out included, which reports
/// `true` though it sent nothing, since the two cannot be told apart).
/// Errors from `connect` never ran anything, whatever this says.
///
/// ```
/// use std::time::Duration;
/// use tollgate::Denied;
/// use tollgate_redis::Error;
///
/// let denied = Error::Denied(Denied::RetryAfter(Duration::from_millis(20)));
/// assert_eq!(denied.retry_after(), Some(Duration::from_millis(20)));
/// assert!(denied.is_denied());
/// assert!(!denied.may_have_run());
///
/// let timeout = Error::Timeout(Duration::from_millis(50));
/// assert!(!timeout.is_denied());
/// assert!(timeout.may_have_run());
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Error {
    /// The limiter decided: not now ([`Denied::RetryAfter`], exact, computed by
    /// the script from server time), or never
    /// ([`Denied::ExceedsCapacity`], [`Denied::ZeroPermits`], decided without
    /// a round trip).
    Denied(Denied),
    /// No reply within the client's timeout (or a redis-rs timeout): the
    /// server may or may not have run the script, and so may have admitted
    /// the request. [`may_have_run`](Error::may_have_run): `true`.
    Timeout(Duration),
    /// The request was refused before the script took any permit: the
    /// connection was refused, the server answered `LOADING`, `BUSY`,
    /// `NOSCRIPT`, `OOM` or `READONLY` (the last two before the script's first
    /// write), or the URL or configuration is invalid.
    /// [`may_have_run`](Error::may_have_run): `false`.
    Redis(redis::RedisError),
    /// The call failed after the request may have reached the server: the
    /// connection dropped, was reset or closed mid-call, the server replied
    /// with an error no script of this crate raises before writing, or a
    /// cluster client resent the request after an earlier attempt failed. The
    /// script may have run and admitted the request.
    /// [`may_have_run`](Error::may_have_run): `true`.
    Interrupted(redis::RedisError),
    /// The key holds another Redis type than the limiter's.
    WrongType {
        /// The Redis key.
        key: String,
        /// The server's message.
        detail: String,
    },
    /// The key holds state this version of the scripts did not write (another
    /// program's, or an older format), or a tagged key whose fields are out of
    /// what the scripts write (not a non-negative integer, a count above any
    /// limit, a time after the key's own expiry, a sliding log member that is
    /// not a ticket): it is left untouched, never reinterpreted, and `detail`
    /// names the field or member.
    UnknownState {
        /// The Redis key.
        key: String,
        /// What the script found.
        detail: String,
    },
    /// The server's reply does not have the shape the scripts return.
    UnexpectedReply(String),
    /// Redis is unreachable and the leased limiter's policy is
    /// [`Policy::Closed`](crate::Policy::Closed).
    Unavailable,
    /// The blocking client was called from inside an async runtime, where
    /// blocking would stall it; use the async [`Client`](crate::Client) there.
    BlockingInAsync,
    /// The call cannot be made as asked, and nothing was sent: two limits of
    /// one all-or-nothing call name the same Redis key (one limiter asked
    /// twice for the same caller, or two limiters sharing a prefix, a name
    /// and a kind), or, on a Cluster, the keys of one call lie in different
    /// slots.
    InvalidCall(String),
}

impl Error {
    /// The limiter's denial, if that is what this is.
    ///
    /// ```
    /// use tollgate::Denied;
    /// use tollgate_redis::Error;
    /// assert_eq!(Error::Denied(Denied::ZeroPermits).denied(), Some(Denied::ZeroPermits));
    /// ```
    pub fn denied(&self) -> Option<Denied> {
        match self {
            Error::Denied(denied) => Some(*denied),
            _ => None,
        }
    }

    /// Whether the limiter decided to deny (rather than failing to decide).
    ///
    /// ```
    /// use tollgate::Denied;
    /// use tollgate_redis::Error;
    /// assert!(Error::Denied(Denied::ZeroPermits).is_denied());
    /// ```
    pub fn is_denied(&self) -> bool {
        matches!(self, Error::Denied(_))
    }

    /// Whether the server may have run the script and admitted the request
    /// though the caller got no [`Admission`](crate::Admission): `true` for
    /// [`Timeout`](Error::Timeout), [`Interrupted`](Error::Interrupted) and
    /// [`UnexpectedReply`](Error::UnexpectedReply); `false` when no permit was
    /// taken for this call. The [table above](Error) lists every variant.
    ///
    /// A caller that counts its own spending, or refunds a client, should
    /// count a `true` as possibly spent.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::Denied;
    /// use tollgate_redis::Error;
    ///
    /// assert!(Error::Timeout(Duration::from_millis(50)).may_have_run());
    /// assert!(!Error::Denied(Denied::ZeroPermits).may_have_run());
    /// assert!(!Error::Unavailable.may_have_run());
    /// ```
    pub fn may_have_run(&self) -> bool {
        match self {
            Error::Timeout(_) | Error::Interrupted(_) | Error::UnexpectedReply(_) => true,
            Error::Denied(_)
            | Error::Redis(_)
            | Error::WrongType { .. }
            | Error::UnknownState { .. }
            | Error::Unavailable
            | Error::BlockingInAsync
            | Error::InvalidCall(_) => false,
        }
    }

    /// The wait before retrying, if the limiter denied and waiting can help.
    ///
    /// ```
    /// use tollgate::Denied;
    /// use tollgate_redis::Error;
    /// assert_eq!(Error::Denied(Denied::ZeroPermits).retry_after(), None);
    /// ```
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        self.denied().and_then(|d| d.retry_after())
    }
}

impl Error {
    /// This call's error as every request of a call that decided `groups`
    /// of them sees it. A server refusal that comes at a script's first write
    /// at the latest (`OOM`, `READONLY`) proves nothing was written when the
    /// script decided one request; with several, the groups before the
    /// refused write may have been written.
    pub(crate) fn for_batch_of(self, groups: usize) -> Error {
        match self {
            Error::Redis(err)
                if groups > 1
                    && matches!(
                        err.kind(),
                        redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly)
                    ) | matches!(err.code(), Some("OOM")) =>
            {
                Error::Interrupted(err)
            }
            other => other,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Denied(denied) => denied.fmt(f),
            Error::Timeout(after) => write!(
                f,
                "no reply from Redis within {after:?} (the script may have run)"
            ),
            Error::Redis(err) => write!(f, "redis: {err}"),
            Error::Interrupted(err) => write!(
                f,
                "redis: {err} (the request may have reached the server: the script may have run)"
            ),
            Error::WrongType { key, detail } => {
                write!(f, "key {key:?} holds the wrong Redis type: {detail}")
            }
            Error::UnknownState { key, detail } => write!(
                f,
                "key {key:?} holds state these scripts did not write: {detail}"
            ),
            Error::UnexpectedReply(what) => write!(f, "unexpected reply from Redis: {what}"),
            Error::Unavailable => {
                f.write_str("the global limit is unreachable and the policy is fail-closed")
            }
            Error::BlockingInAsync => f.write_str(
                "the blocking client cannot run inside an async runtime; use the async Client",
            ),
            Error::InvalidCall(why) => write!(f, "invalid call (nothing was sent): {why}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Denied(denied) => Some(denied),
            Error::Redis(err) | Error::Interrupted(err) => Some(err),
            _ => None,
        }
    }
}

impl From<Denied> for Error {
    fn from(denied: Denied) -> Self {
        Error::Denied(denied)
    }
}

impl From<redis::RedisError> for Error {
    fn from(err: redis::RedisError) -> Self {
        Error::Redis(err)
    }
}
