//! The Lua scripts, each a function of `(KEYS, ARGV)` after the shared
//! helpers, with the decision time read from Redis `TIME` (the only version
//! production code can run) or, under the `test-time` feature, taken from the
//! last argument; loaded as one Redis Function library, or run by `EVALSHA`
//! where the server has no Functions; and the one parser of their replies.

use std::sync::LazyLock;
use std::time::Duration;

use redis::{Script, Value};
use tollgate::Denied;

use crate::error::Error;

/// One of the scripts: its name is its file's under `src/lua/` (without
/// `.lua`), the name of the Lua function the file defines, and its name in
/// metrics.
#[derive(Debug)]
pub(crate) struct LuaScript {
    pub(crate) name: &'static str,
}

/// Every limiter's decisions: one script for every kind, one request or many.
pub(crate) static DECIDE: LuaScript = LuaScript { name: "decide" };

/// The scripts' bodies, in the order the library defines them.
const BODIES: [(&str, &str); 3] = [
    ("decide", include_str!("lua/decide.lua")),
    ("lease", include_str!("lua/lease.lua")),
    ("lease_return", include_str!("lua/lease_return.lua")),
];

/// The scripts as Redis runs them, for one way of reading the time: one
/// library for `FUNCTION LOAD` (its helpers defined once per server, not once
/// per call), and each script alone for `EVALSHA`.
pub(crate) struct Library {
    /// The `FUNCTION LOAD` text.
    pub(crate) text: String,
    /// Each script's function name in the library, and its `EVALSHA` form.
    scripts: Vec<(&'static str, String, Script)>,
}

impl Library {
    /// The library after the clock's definitions. Its name and its
    /// functions' carry a hash of its text, so two versions of this crate
    /// (a rolling upgrade) or the two clocks never replace each other's.
    fn build(clock: &str) -> Library {
        let common = include_str!("lua/common.lua");
        let mut body = format!("{clock}{common}");
        for (_, source) in BODIES {
            body.push_str(source);
        }
        let hash = Script::new(&body).get_hash()[..16].to_owned();
        let mut text = format!("#!lua name=tollgate_{hash}\n{body}");
        let mut scripts = Vec::new();
        for (name, source) in BODIES {
            let function = format!("tollgate_{name}_{hash}");
            text.push_str(&format!("redis.register_function('{function}', {name})\n"));
            let alone = format!("{clock}{common}{source}return {name}(KEYS, ARGV)\n");
            scripts.push((name, function, Script::new(&alone)));
        }
        Library { text, scripts }
    }

    fn entry(&self, script: &LuaScript) -> &(&'static str, String, Script) {
        self.scripts
            .iter()
            .find(|(name, ..)| *name == script.name)
            .expect("every script is in the library")
    }

    /// `script`'s name for `FCALL`.
    pub(crate) fn function(&self, script: &LuaScript) -> &str {
        &self.entry(script).1
    }

    /// `script` alone, for `EVALSHA`.
    pub(crate) fn script(&self, script: &LuaScript) -> &Script {
        &self.entry(script).2
    }
}

static LIVE: LazyLock<Library> =
    LazyLock::new(|| Library::build(include_str!("lua/now_server.lua")));
#[cfg(feature = "test-time")]
static AT_TIME: LazyLock<Library> =
    LazyLock::new(|| Library::build(include_str!("lua/now_argument.lua")));

/// The library that reads the server's clock (`None`), or the one that takes
/// the time as its last argument (`Some`, under `test-time`; no other build
/// makes a `Some`).
pub(crate) fn library(now_us: Option<u64>) -> &'static Library {
    #[cfg(feature = "test-time")]
    if now_us.is_some() {
        return &AT_TIME;
    }
    debug_assert!(now_us.is_none(), "only test-time builds replay a time");
    &LIVE
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
