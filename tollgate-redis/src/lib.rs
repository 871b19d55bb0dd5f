//! Rate limits shared across processes and machines through Redis (or Valkey):
//! tollgate's limiters with their state in Redis, decided by one Lua script:
//! one call for a request, for all the limits of a request at once
//! ([`Client::try_acquire_all`], all or nothing), and for the requests that
//! queue on a client while its calls are in flight (batched automatically).
//!
//! | limiter | promise (by server time) | Redis state per key |
//! |---|---|---|
//! | [`TokenBucket`] (GCRA) | at most `capacity + rate·(b − a)` in any `[a, b]` | a string: the theoretical arrival time |
//! | [`FixedWindow`] | at most `limit` per aligned window (up to 2× across a boundary) | a string: window index, count |
//! | [`ApproxSlidingWindow`] | the weighted two-window estimate (Cloudflare's) | a string: window, count, previous count |
//! | [`SlidingLog`] | **exactly** at most N in any window of length T; rules change without losing the log | a sorted set: one member per permit |
//!
//! Every decision:
//!
//! * is **one round trip**: `FCALL` of the decision function of the crate's
//!   Redis Function library (loaded once per server, and again by the first
//!   call that finds it missing, after a restart without persistence or
//!   `FUNCTION FLUSH`; on a server without Functions, Redis 6.2, `EVALSHA`
//!   of the same script), which it may share with the other requests queued
//!   on the client;
//! * reads the time from **Redis `TIME`** inside the script, so client clocks
//!   never matter, and copes with a server clock that steps back by denying,
//!   never by over-admitting;
//! * touches **one key**, `<prefix>:<name>:{<your key>}:<kind>`: the
//!   limiter's name, which every constructor requires (1 to
//!   [`MAX_NAME_LEN`] bytes, no braces), keeps limiters apart, so no
//!   caller's key can reach another limiter's state; the hash tag keeps
//!   every key of a caller in one Redis Cluster slot;
//! * sets a **TTL** on every key it writes, so that idle keys vanish when
//!   forgetting them changes nothing;
//! * returns the **same outcomes** as the in-process limiters: an
//!   [`Admission`], or [`Error::Denied`] holding tollgate's
//!   [`Denied`](tollgate::Denied) — `RetryAfter` with the exact wait computed by
//!   the script, `ExceedsCapacity` or `ZeroPermits` (decided without a round
//!   trip);
//! * uses integer arithmetic only, every value below 2^53, where Lua's doubles
//!   are exact (constructors refuse configurations that could leave it, with
//!   tollgate's [`ConfigError`](tollgate::ConfigError), checked by the same
//!   rules as the in-process limiters at a microsecond's resolution). Time is
//!   in microseconds, `TIME`'s resolution.
//!
//! Redis failures are errors, never panics and never admissions:
//! [`Error::Timeout`] (bounded: [`Options`]), [`Error::Redis`],
//! [`Error::WrongType`], [`Error::UnknownState`].
//!
//! ```no_run
//! use std::time::Duration;
//! use tollgate::{Denied, Rate};
//! use tollgate_redis::{Client, Error, Options, TokenBucket};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let options = Options::new().timeout(Duration::from_millis(50));
//! let client = Client::connect_with("redis://127.0.0.1:6379/", options).await?;
//! let api = TokenBucket::new("api", 20, Rate::per_second(100))?;
//! match client.try_acquire(&api, "user:42").await {
//!     Ok(admission) => println!("serve; {} left", admission.remaining),
//!     Err(Error::Denied(Denied::RetryAfter(wait))) => println!("429, Retry-After {wait:?}"),
//!     Err(Error::Denied(never)) => println!("400: {never}"),
//!     Err(unavailable) => println!("Redis unavailable: {unavailable}; fail open or closed"),
//! }
//! # Ok(()) }
//! ```
//!
//! [`blocking::Client`] offers the same for code that is not async.
//!
//! # Features
//!
//! * `metrics`: counters and histograms through the
//!   [`metrics`](https://docs.rs/metrics) facade, for whatever exporter the
//!   application installs (Prometheus, OpenTelemetry, StatsD); without it
//!   nothing is recorded and nothing is compiled in. Labels are few and
//!   bounded — never a caller's key:
//!
//!   | metric | labels | what |
//!   |---|---|---|
//!   | `tollgate_redis_requests_total` | `limits` (`one`, `several`), `outcome` | requests by answer: `admitted`, `denied`, `never` (can never pass, or an invalid call), `wrong_type`, `unknown_state`, `timeout`, `interrupted`, `refused`, `unexpected_reply` |
//!   | `tollgate_redis_calls_total` | `script` (`decide`, `lease`, `lease_return`), `outcome` (`ok` or a failure as above) | script calls to Redis |
//!   | `tollgate_redis_call_duration_seconds` | `script` | histogram: a call's time, queueing on the connection included |
//!   | `tollgate_redis_batch_requests`, `tollgate_redis_batch_decisions` | | histograms: requests and decisions per decision call |
//!   | `tollgate_redis_lease_calls_total`, `tollgate_redis_leases_total`, `tollgate_redis_lease_exhausted_total`, `tollgate_redis_lease_waits_total`, `tollgate_redis_lease_degraded_decisions_total` | `limit` (the key the leased limiter was started for) | a [`LeasedLimiter`]'s [`LeaseStats`] |
//!   | `tollgate_redis_lease_permits_total` | `limit`, `event` (`leased`, `returned`, `forfeited`, `spent`) | permits through its leases |
//!   | `tollgate_redis_lease_degraded`, `tollgate_redis_lease_pool_permits` | `limit` | gauges: 1 while degraded; the permits the process holds |
//!
//! * `test-time`: [`Client::try_acquire_n_at`], which runs each script with a
//!   time the caller gives instead of `TIME`, so tests can replay one timeline
//!   through Redis and through the in-process limiters; and
//!   [`Client::lease_at`] and [`Client::return_lease_at`], the same for the
//!   leased limiter's scripts. For tests only.

#![deny(missing_docs)]
#![warn(rust_2018_idioms, unreachable_pub)]

mod all;
mod batch;
pub mod blocking;
mod breaker;
mod client;
mod error;
pub mod fixed_window;
mod keys;
mod lease_script;
pub mod leased;
mod limiter;
mod metrics;
mod micros;
mod script;
pub mod sliding_log;
pub mod sliding_window;
pub mod token_bucket;
mod window;

pub use all::{Admitted, Ask, Refused};
pub use client::{Client, Options};
pub use error::Error;
pub use fixed_window::FixedWindow;
pub use keys::MAX_NAME_LEN;
pub use leased::{
    Attempt, LeaseOptions, LeaseReceipt, LeaseRecord, LeaseStats, LeaseWait, LeasedLimiter, Mode,
    Policy,
};
pub use limiter::{Limiter, Plan};
/// The `redis` crate this one is built on, at the version it uses: name its
/// types (a `redis::RedisError` inside [`Error`], a URL's
/// `redis::ConnectionInfo`) through this path, with no second, separately
/// pinned `redis` dependency that could drift to another version.
///
/// ```
/// let info: tollgate_redis::redis::ConnectionInfo = "redis://127.0.0.1:6379/".parse()?;
/// # let _ = info;
/// # Ok::<(), tollgate_redis::redis::RedisError>(())
/// ```
pub use redis;
pub use script::Admission;
pub use sliding_log::SlidingLog;
pub use sliding_window::ApproxSlidingWindow;
#[allow(deprecated)]
pub use sliding_window::SlidingWindow;
pub use token_bucket::TokenBucket;

/// The error every constructor returns: tollgate's own
/// [`ConfigError`](tollgate::ConfigError), whose variants name the same
/// limits for Redis (`TooFine` at a microsecond's resolution, `Overflow`
/// above 2^51 µs, `LogTooLong`, `InvalidPrefix`, `InvalidName`).
#[deprecated(
    note = "use `tollgate::ConfigError`, which the constructors return; this alias will be removed in the next release"
)]
pub type ConfigError = tollgate::ConfigError;

// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

// The guide's page on this crate (docs/guide/distributed.md), compiled as
// doctests in the repository; the packaged crate holds no docs/.
#[cfg(doctest)]
#[doc = include_str!("../../docs/guide/distributed.md")]
struct GuideDistributed;
