//! Lock-free, model-checked rate limiters: every limiter, direct or per key,
//! decides with atomics only.
//!
//! Every direct limiter here decides with atomics only — no mutex, no
//! allocation on the hot path — and every atomic algorithm is model-checked
//! with [loom](https://docs.rs/loom) in `loom-tests/`. Per key
//! ([`Keyed`](keyed::Keyed)), the same atomics decide on each key's state
//! (the exact sliding log: on each key's lock-free ring); a lookup waits
//! only while an insertion or eviction holds the key's shard, and a request
//! on a per-key log or window only while a refund or a reconfiguration
//! replaces that key's state.
//! Each has a locking twin that
//! keeps the same state under a mutex and makes the same decisions, for
//! benchmarks, for property tests, and for anyone who prefers a lock.
//!
//! | limiter | promise | state | choose it for |
//! |---|---|---|---|
//! | [`TokenBucket`] | at most `capacity + rate·(b − a)` in any `[a, b]` | one `AtomicU64` (GCRA) | smooth rates that allow short bursts: API clients, proxies |
//! | [`LeasedTokenBucket`] | the same bound, exact under contention | one `AtomicU64` (GCRA) leasing runs of its timeline to cache-padded per-CPU stripes (one `AtomicU64` each: the next slot; a run ends at the next power-of-two boundary) | one bucket shared by many threads on many cores |
//! | [`FixedWindow`] | at most `limit` per aligned window (up to 2× across a boundary) | one `AtomicU64` (index + count) | the cheapest check, where a boundary burst is acceptable |
//! | [`LeasedFixedWindow`] | the same per-window limit, exact under contention | one `AtomicU64` (index + count) leasing batches of the window's count to cache-padded per-CPU stripes (one `AtomicU64` each: window + batch; a batch is spent only in its own window) | one window shared by many threads on many cores |
//! | [`SlidingWindow`] | at most N in any S consecutive aligned sub-windows of T/S — exact under contention (N in any (S−1)/S of T, 2N in any T); [`ApproxSlidingWindow`]: Cloudflare's weighted two-window estimate | per sub-window: a pool word, a ring of S charges, one cache-padded leased stripe per CPU | high-rate shared limits that must scale with cores: gateways, hot endpoints
//! | [`SlidingLog`] | at most N in *any* window of length T — exact, by decision time | a ring of N `AtomicU64` timestamps + a ticket head; N and T changeable at runtime | strict quotas: paid APIs, third-party limits, login attempts |
//! | [`LeakyBucket`] / [`Shaper`] | meter: level never above capacity; queue: starts spaced 1/rate after a burst, waits bounded | meter: one `AtomicU64` (drain time); queue: one 128-bit word (next free slot, latest start) | smoothing an outflow: nginx-style `limit_req`, pacing calls to a fragile backend |
//! | [`WarmUp`] | Guava's SmoothWarmingUp schedule: cold factor × the stable interval when idle, ramping to the stable rate over the warm-up period | one 128-bit word (next start, banked idle time) | services that need warming: cold caches, JIT, connection pools |
//! | [`Keyed`](keyed::Keyed) | a token bucket, fixed window, leaky bucket meter, shaper, warm-up limiter, exact sliding log (one rule, or several on one log) or sliding window (without stripes) (or a pair: both must admit) per key — user, IP, tenant — each with its own guarantee, at the key cap too; per-key quotas, combined limits, runtime reconfiguration. Not the approximate sliding window nor the leased limiters; the shaper and warm-up admit per key what can start at once | a sharded hash map (hashbrown tables under reader-biased locks) of one word (two for the shaper and warm-up; the direct log's lock-free ring for the log, shared by all its rules: 5/s, 30/min and 1,000/day on one ring; a 128-bit word and a history of `S` charges for the window) per key, evicted when fresh, capped | per-caller limits whose key space is unbounded: public APIs, multi-tenant services |
//! | [`ConcurrencyLimit`] / [`AdaptiveLimit`] | never more than `limit` permits held at once (RAII permits, cancel-safe waits); the adaptive one's limit moved by [`RoundTrip`] (recommended), [`Aimd`], [`Vegas`] or [`Gradient2`] from each request's latency and outcome | one `AtomicU64` (count, limit, a waiters flag); the algorithm's state in one to three more words | how *many* at once rather than how often: calls to a backend that slows under load |
//!
//! All of them implement [`RateLimiter`]: `try_acquire()` / `try_acquire_n(n)`
//! return a plain `Result<(), Denied>`; a denial carries the exact retry-after
//! (if nothing else happens, the same request is admitted when it runs out
//! and not a nanosecond sooner; for the sliding log, at any reading, a stale
//! one included: [its promise](SlidingLogOf#retry-after)), or says the request
//! can never succeed. [`RateLimiter::snapshot`] reads without consuming;
//! [`RateLimiter::try_acquire_n_with_snapshot`] decides and reports the
//! state the decision left (what `RateLimit` headers need) in one
//! operation, a denial as a [`Rejection`]. Time comes from a [`Clock`]: the TSC by default
//! ([`MonotonicClock`]), a cached reading for the fastest path
//! ([`CachedClock`]), or a [`ManualClock`] for tests.
//!
//! ```
//! use std::time::Duration;
//! use tollgate::{Denied, ManualClock, Rate, RateLimiter, TokenBucket};
//!
//! let clock = ManualClock::new();
//! let bucket = TokenBucket::with_clock(2, Rate::per_second(1), clock.clone()).unwrap();
//! assert!(bucket.try_acquire_n(2).is_ok());
//! match bucket.try_acquire() {
//!     Err(Denied::RetryAfter(wait)) => assert_eq!(wait, Duration::from_secs(1)),
//!     other => panic!("expected a retry-after, got {other:?}"),
//! }
//! ```
//!
//! Several limits on one request — global, per client, per route — go through
//! one [`AllOf`]: it admits only if every member admits, gives back the
//! permits of the members that admitted when a later one denies (every member
//! but the last is [`Refundable`]; a key of a [`Keyed`](keyed::Keyed) limiter is one through
//! [`Keyed::for_key`](keyed::Keyed::for_key)), and reports the binding member for the headers.
//!
//! ```
//! use tollgate::{AllOf, FixedWindow, Rate, RateLimiter, TokenBucket};
//!
//! let per_second = TokenBucket::new(10, Rate::per_second(10)).unwrap();
//! let per_day = FixedWindow::new(Rate::new(2, std::time::Duration::from_secs(86_400))).unwrap();
//! let both = AllOf::new((&per_second, &per_day));
//! assert!(both.try_acquire_n(2).is_ok());
//! assert!(both.try_acquire().is_err()); // the daily limit denies...
//! assert_eq!(per_second.snapshot().available, 8); // ...and the bucket got its permit back
//! ```
//!
//! Construction validates the configuration and returns a [`ConfigError`]; after
//! that, no input panics: not `n = 0`, not `n = u32::MAX`, not a clock that steps
//! backwards.
//!
//! A [`Rate`] can come from configuration: `"100/s"`, `"30/min"`, `"5/10ms"`,
//! `"5 per second"` parse with [`str::parse`] (a bad string is a
//! [`ParseRateError`]), and `Rate` prints back in that form.
//!
//! ```
//! use tollgate::{Rate, TokenBucket};
//!
//! let rate: Rate = "100/s".parse()?;
//! let bucket = TokenBucket::new(20, rate)?;
//! assert_eq!(rate.to_string(), "100/s");
//! # let _ = bucket;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Features
//!
//! - `tokio`: `acquire_async`, waiting for permits on tokio's timer
//!   ([`Reserve`] in booking order for the buckets, shaper and warm-up;
//!   [`RetryAcquire`] by retry-after for every other limiter, [`AllOf`] and
//!   [`Keyed`](keyed::Keyed) keys included).
//! - `serde`: `Serialize`/`Deserialize` for [`Rate`], as its string form.
//! - `tracing`: an event for every decision of a [`Counted`] limiter (denials
//!   at `INFO`, admissions and refunds at `DEBUG`); unwrapped limiters emit
//!   nothing.
//! - `metrics`: through the [`metrics`](https://docs.rs/metrics) facade, a
//!   named [`AdaptiveLimit`]'s limit, in-flight count and samples, and a
//!   [`Counted`] limiter's admitted, denied and refunded permits, summed from
//!   its stripes when published (`Publish`, `Published`: from an exporter's
//!   upkeep); no decision touches a shared counter. Unnamed, unwrapped
//!   limiters report nothing.

#![deny(missing_docs)]
#![warn(rust_2018_idioms, unreachable_pub)]

mod adaptive;
mod all_of;
mod cell;
mod clock;
mod concurrency;
mod counted;
mod error;
mod fixed_window;
pub mod keyed;
mod kind;
mod leaky_bucket;
mod limiter;
mod limits;
mod machine;
#[cfg(feature = "metrics")]
mod published;
mod rate;
mod refund;
mod sliding_log;
mod sliding_window;
mod stripe;
mod sync;
mod timeline;
mod token_bucket;
mod waiting;
mod warm_up;

pub use adaptive::{
    AdaptiveLimit, AdaptivePermit, Aimd, AimdBuilder, Gradient2, Gradient2Builder, HISTORY_LEN,
    LimitAlgorithm, LimitChange, LimitHistory, MAX_ADAPTIVE_LIMIT, Outcome, OwnedAdaptivePermit,
    RoundStats, RoundTrip, RoundTripBuilder, Sample, Vegas, VegasBuilder, WindowStats, Windowed,
    WindowedBuilder,
};
pub use all_of::{AllOf, Blocked, Members, Tightest};
pub use clock::{CachedClock, Clock, ManualClock, MonotonicClock};
pub use concurrency::{
    ConcurrencyLimit, ConcurrencyLimitOf, LockingConcurrencyLimit, OwnedPermit, Permit,
    PermitSource,
};
pub use counted::{Counted, CountedReceipt, Counts};
pub use error::{ConfigError, Denied};
pub use fixed_window::{FixedWindow, FixedWindowOf, LeasedFixedWindow, LockingFixedWindow};
pub use leaky_bucket::{
    LeakyBucket, LeakyBucketOf, LockingLeakyBucket, LockingShaper, Shaper, ShaperOf,
};
pub use limiter::{Keep, RateLimiter, Rejection, Snapshot, check_request};
pub use limits::{MAX_COLD_FACTOR, MAX_SUB_WINDOWS};
#[cfg(feature = "metrics")]
pub use published::{Publish, Published};
pub use rate::{ParseRateError, ParseRateErrorKind, Rate};
pub use refund::{Receipt, Receipted, Refundable};
pub use sliding_log::{LockingSlidingLog, LogConfig, SlidingLog, SlidingLogOf};
pub use sliding_window::{
    ApproxSlidingWindow, LockingApproxSlidingWindow, LockingSlidingWindow, SlidingWindow,
    SlidingWindowBuilder,
};
pub use token_bucket::{LeasedTokenBucket, LockingTokenBucket, TokenBucket, TokenBucketOf};
pub use waiting::{Reservation, Reserve, RetryAcquire};
pub use warm_up::{DEFAULT_COLD_FACTOR, LockingWarmUp, WarmUp, WarmUpOf};

// The loom models (`loom-tests/`) switch the known-bad variants they must
// catch through this; a normal build has no such module.
#[cfg(loom)]
pub use sync::fault;

// The README and the guide's pages (docs/guide/), compiled and run as
// doctests, so that an example that stops compiling fails `cargo test`. Only
// under `doctest`: the packaged crate holds no docs/guide/.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

#[cfg(doctest)]
mod guide {
    #[doc = include_str!("../docs/guide/choosing.md")]
    struct Choosing;

    #[doc = include_str!("../docs/guide/per-key.md")]
    struct PerKey;

    #[doc = include_str!("../docs/guide/combining.md")]
    struct Combining;

    #[doc = include_str!("../docs/guide/verification.md")]
    struct Verification;

    #[doc = include_str!("../docs/guide/concurrency.md")]
    struct Concurrency;

    // Its async example needs `acquire_async`, as `--all-features` gives it.
    #[cfg(feature = "tokio")]
    #[doc = include_str!("../docs/guide/waiting.md")]
    struct Waiting;
}
