//! Lock-free, model-checked rate limiters.
//!
//! Every limiter here decides with atomics only — no mutex, no allocation on the
//! hot path — and every atomic algorithm is model-checked with
//! [loom](https://docs.rs/loom) in `loom-tests/`. Each has a locking twin that
//! keeps the same state under a mutex and makes the same decisions, for
//! benchmarks, for property tests, and for anyone who prefers a lock.
//!
//! | limiter | promise | state | choose it for |
//! |---|---|---|---|
//! | [`TokenBucket`] | at most `capacity + rate·(b − a)` in any `[a, b]` | one `AtomicU64` (GCRA) | smooth rates that allow short bursts: API clients, proxies |
//! | [`FixedWindow`] | at most `limit` per aligned window (up to 2× across a boundary) | one `AtomicU64` (index + count) | the cheapest check, where a boundary burst is acceptable |
//!
//! All of them implement [`RateLimiter`]: `try_acquire()` / `try_acquire_n(n)`
//! return a plain `Result<(), Denied>`; a denial carries the exact retry-after, or
//! says the request can never succeed. [`RateLimiter::snapshot`] reads without
//! consuming. Time comes from a [`Clock`]: the TSC by default
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
//! Construction validates the configuration and returns a [`ConfigError`]; after
//! that, no input panics: not `n = 0`, not `n = u32::MAX`, not a clock that steps
//! backwards.

#![deny(missing_docs)]
#![warn(rust_2018_idioms, unreachable_pub)]

mod cell;
pub mod clock;
mod error;
pub mod fixed_window;
mod limiter;
mod rate;
mod sync;
mod timeline;
pub mod token_bucket;
mod word;

pub use clock::{CachedClock, Clock, ManualClock, MonotonicClock};
pub use error::{ConfigError, Denied};
pub use fixed_window::{FixedWindow, LockingFixedWindow};
pub use limiter::{RateLimiter, Snapshot};
pub use rate::Rate;
pub use token_bucket::{LockingTokenBucket, TokenBucket};
