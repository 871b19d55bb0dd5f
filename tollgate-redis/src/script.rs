//! The limiters' Lua scripts: each built from one body, with the decision time
//! read from Redis `TIME` (the only version production code can run) or, under
//! the `test-time` feature, taken from the last argument.

use std::sync::LazyLock;
use std::time::Duration;

use redis::{Script, Value};
use tollgate::Denied;

use crate::error::Error;

/// One limiter's script, compiled into the crate.
pub(crate) struct LimiterScript {
    pub(crate) live: LazyLock<Script>,
    #[cfg(feature = "test-time")]
    pub(crate) at_time: LazyLock<Script>,
}

/// Declares a limiter's script from its Lua body under `src/lua/`.
macro_rules! limiter_script {
    ($name:ident, $file:literal) => {
        pub(crate) static $name: $crate::script::LimiterScript = $crate::script::LimiterScript {
            live: ::std::sync::LazyLock::new(|| {
                ::redis::Script::new(concat!(
                    include_str!("lua/now_server.lua"),
                    include_str!("lua/common.lua"),
                    include_str!(concat!("lua/", $file))
                ))
            }),
            #[cfg(feature = "test-time")]
            at_time: ::std::sync::LazyLock::new(|| {
                ::redis::Script::new(concat!(
                    include_str!("lua/now_argument.lua"),
                    include_str!("lua/common.lua"),
                    include_str!(concat!("lua/", $file))
                ))
            }),
        };
    };
}
pub(crate) use limiter_script;

impl LimiterScript {
    /// The script that reads the server's clock.
    pub(crate) fn live(&self) -> &Script {
        &self.live
    }

    /// The script that takes the time as its last argument.
    #[cfg(feature = "test-time")]
    pub(crate) fn at_time(&self) -> &Script {
        &self.at_time
    }
}

/// An admitted request: when, by the server's clock, and what is left.
///
/// ```
/// # async fn demo(client: &tollgate_redis::Client) -> Result<(), tollgate_redis::Error> {
/// use tollgate::Rate;
/// use tollgate_redis::TokenBucket;
///
/// let bucket = TokenBucket::new(10, Rate::per_second(10)).unwrap();
/// let admission = client.try_acquire(&bucket, "user:42").await?;
/// println!("admitted at {:?}, {} left", admission.time(), admission.remaining);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Admission {
    /// The admission's server time, in microseconds since the Unix epoch: the
    /// decision time (the sliding log: the stamp it logged, which never goes
    /// back even when the server clock does).
    pub time_us: u64,
    /// Permits a request could still be granted right after this one.
    pub remaining: u32,
}

impl Admission {
    /// An admission at `time_us` (µs since the Unix epoch) leaving
    /// `remaining` permits: what a script reports, for tests and reports.
    ///
    /// ```
    /// let admission = tollgate_redis::Admission::new(1_000_000, 3);
    /// assert_eq!((admission.time_us, admission.remaining), (1_000_000, 3));
    /// ```
    pub fn new(time_us: u64, remaining: u32) -> Self {
        Admission { time_us, remaining }
    }

    /// [`time_us`](Self::time_us) as a `SystemTime`.
    ///
    /// ```
    /// # fn demo(admission: tollgate_redis::Admission) {
    /// let age = admission.time().elapsed();
    /// # let _ = age; }
    /// ```
    pub fn time(&self) -> std::time::SystemTime {
        std::time::UNIX_EPOCH + Duration::from_micros(self.time_us)
    }
}

/// Turns a script's reply, `{status, time, remaining, retry_us}` or `{-1|-2,
/// message}`, into the caller's result.
pub(crate) fn outcome(reply: Value, key: &str) -> Result<Admission, Error> {
    let Value::Array(items) = reply else {
        return Err(Error::UnexpectedReply(format!("{reply:?}")));
    };
    let int = |i: usize| match items.get(i) {
        Some(Value::Int(v)) => Ok(*v),
        other => Err(Error::UnexpectedReply(format!(
            "item {i} of {items:?} is {other:?}"
        ))),
    };
    let text = |i: usize| match items.get(i) {
        Some(Value::BulkString(bytes)) => String::from_utf8_lossy(bytes).into_owned(),
        Some(Value::SimpleString(s)) => s.clone(),
        other => format!("{other:?}"),
    };
    let number = |i: usize| {
        int(i).and_then(|v| {
            u64::try_from(v).map_err(|_| Error::UnexpectedReply(format!("negative item {i}")))
        })
    };
    let remaining = |i: usize| number(i).map(|v| u32::try_from(v).unwrap_or(u32::MAX));
    match int(0)? {
        1 => Ok(Admission {
            time_us: number(1)?,
            remaining: remaining(2)?,
        }),
        0 => Err(Error::Denied(Denied::RetryAfter(Duration::from_micros(
            number(3)?,
        )))),
        -1 => Err(Error::WrongType {
            key: key.to_owned(),
            detail: text(1),
        }),
        -2 => Err(Error::UnknownState {
            key: key.to_owned(),
            detail: text(1),
        }),
        status => Err(Error::UnexpectedReply(format!("status {status}"))),
    }
}
