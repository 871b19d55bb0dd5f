//! The Lua scripts, each built from one body with the decision time read from
//! Redis `TIME` (the only version production code can run) or, under the
//! `test-time` feature, taken from the last argument; and the one parser of
//! their replies.

use std::sync::LazyLock;
use std::time::Duration;

use redis::{Script, Value};
use tollgate::Denied;

use crate::error::Error;

/// One script, compiled into the crate: the limiters' and the leased
/// limiter's alike.
pub(crate) struct LuaScript {
    /// Its name in metrics: the file's, without `.lua`.
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(crate) name: &'static str,
    pub(crate) live: LazyLock<Script>,
    #[cfg(feature = "test-time")]
    pub(crate) at_time: LazyLock<Script>,
}

/// Declares a script from its Lua body under `src/lua/` (the file's name
/// without `.lua`), after the shared
/// helpers of `common.lua` and the line that reads the time.
macro_rules! lua_script {
    ($name:ident, $file:literal) => {
        pub(crate) static $name: $crate::script::LuaScript = $crate::script::LuaScript {
            name: $file,
            live: ::std::sync::LazyLock::new(|| {
                ::redis::Script::new(concat!(
                    include_str!("lua/now_server.lua"),
                    include_str!("lua/common.lua"),
                    include_str!(concat!("lua/", $file, ".lua"))
                ))
            }),
            #[cfg(feature = "test-time")]
            at_time: ::std::sync::LazyLock::new(|| {
                ::redis::Script::new(concat!(
                    include_str!("lua/now_argument.lua"),
                    include_str!("lua/common.lua"),
                    include_str!(concat!("lua/", $file, ".lua"))
                ))
            }),
        };
    };
}
pub(crate) use lua_script;

// Every limiter's decisions: one script for every kind, one request or many.
lua_script!(DECIDE, "decide");

impl LuaScript {
    /// The script that reads the server's clock (`None`), or the one that
    /// takes the time as its last argument (`Some`, under `test-time`; no
    /// other build makes a `Some`).
    pub(crate) fn at(&self, now_us: Option<u64>) -> &Script {
        #[cfg(feature = "test-time")]
        if now_us.is_some() {
            return &self.at_time;
        }
        debug_assert!(now_us.is_none(), "only test-time builds replay a time");
        &self.live
    }
}

/// An admitted request: when, by the server's clock, and what is left.
///
/// ```
/// # async fn demo(client: &tollgate_redis::Client) -> Result<(), tollgate_redis::Error> {
/// use tollgate::Rate;
/// use tollgate_redis::TokenBucket;
///
/// let bucket = TokenBucket::new("api", 10, Rate::per_second(10)).unwrap();
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

/// A script's reply, `{status, time, count, value}`: status 1, the work done
/// at server time `time` (µs), with a `count` of permits (left, granted or
/// returned) and a `value` in µs (a TAT for the lease scripts); status 0, a
/// refusal whose last item is the wait in µs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reply {
    Done {
        time_us: u64,
        count: u64,
        value: u64,
    },
    Refused {
        wait_us: u64,
        time_us: u64,
        /// The permits free at the refusal (0 when the script reports fewer,
        /// after a server clock stepped back).
        free: u64,
    },
}

/// Parses every script's reply: the two shapes of [`Reply`], or the scripts'
/// refusals of a key they did not write, `{-1|-2, message}`, as the errors
/// that name the key.
pub(crate) fn reply(reply: Value, key: &str) -> Result<Reply, Error> {
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
    match int(0)? {
        1 => Ok(Reply::Done {
            time_us: number(1)?,
            count: number(2)?,
            value: number(3)?,
        }),
        // A refusal's count may be below zero (a server clock that stepped
        // back): none free.
        0 => Ok(Reply::Refused {
            wait_us: number(3)?,
            time_us: number(1)?,
            free: int(2).map(|v| u64::try_from(v).unwrap_or(0))?,
        }),
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

/// A limiter script's reply as the caller's result: an admission with the
/// permits left, or the exact retry-after.
pub(crate) fn outcome(value: Value, key: &str) -> Result<Admission, Error> {
    match reply(value, key)? {
        Reply::Done { time_us, count, .. } => Ok(Admission {
            time_us,
            remaining: u32::try_from(count).unwrap_or(u32::MAX),
        }),
        Reply::Refused { wait_us, .. } => Err(Error::Denied(Denied::RetryAfter(
            Duration::from_micros(wait_us),
        ))),
    }
}
