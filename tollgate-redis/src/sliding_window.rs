//! The weighted sliding-window counter in Redis: Cloudflare's two-window
//! estimate, as tollgate's in-process
//! [`ApproxSlidingWindow`](tollgate::ApproxSlidingWindow).
//!
//! The key is a string `sw2:<k>:<c>:<p>`: the newest window `k` (aligned to
//! the Unix epoch), its count `c`, and the count `p` of window `k − 1`. At a
//! server reading `e` µs into window `k`, `n` more are admitted if
//!
//! ```text
//! p·(T − e) + (c + n)·T ≤ N·T
//! ```
//!
//! in exact integers (the constructor keeps `N·T` at most 2^51, so every term
//! stays below 2^53 in Lua's doubles). A denial carries the exact time the
//! inequality next holds, to the microsecond. A reading older than the newest
//! window (a server clock that stepped back) is denied until time catches up.
//! The key expires two windows after its newest window starts, when it weighs
//! nothing any more.
//!
//! A key that does not hold `sw2:` and three non-negative integers, a count
//! above 2^32 − 1, or a newest window after the current one (further than
//! this window writes) whose state outlives the key's own expiry or on a key
//! without expiry, is [`Error::UnknownState`](crate::Error::UnknownState)
//! naming the field, and is left untouched: damaged state never admits. A
//! hash `{v: "sw1", k, c, p}`, the format of earlier versions, is read too and
//! written anew as a string.
//!
//! It is an estimate, not a sliding log: it assumes the previous window's
//! permits were spread evenly, so it can admit more than `N` in some spans of
//! `T` (see tollgate's `docs/sliding_window.md`). [`SlidingLog`](crate::SlidingLog)
//! is exact.
//!
//! ```no_run
//! # async fn demo(client: tollgate_redis::Client) -> Result<(), Box<dyn std::error::Error>> {
//! use tollgate::Rate;
//! let window = tollgate_redis::ApproxSlidingWindow::new("api", Rate::per_minute(100))?;
//! client.try_acquire(&window, "user:42").await?;
//! # Ok(()) }
//! ```

use std::time::Duration;

use tollgate::{ConfigError, Rate};

use crate::limiter::{Kind, Limiter, Plan};
use crate::micros::product;
use crate::script::Admission;
use crate::window::Window;

/// A weighted two-window counter shared through Redis: about
/// `rate.permits()` per sliding `rate.period()`, per caller key. See the
/// [module docs](self).
///
/// ```
/// use tollgate::Rate;
/// let window = tollgate_redis::ApproxSlidingWindow::new("api", Rate::per_minute(100)).unwrap();
/// assert_eq!(window.window().as_secs(), 60);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApproxSlidingWindow(Window);

/// The former name of [`ApproxSlidingWindow`], which is the approximate
/// window (tollgate's exact sliding window, with the core's name, is
/// [`tollgate::SlidingWindow`]).
#[deprecated(
    note = "renamed `ApproxSlidingWindow`, the core's name for this estimate; this alias will be removed in the next release"
)]
pub type SlidingWindow = ApproxSlidingWindow;

impl ApproxSlidingWindow {
    /// The window `name`: about `rate.permits()` per sliding `rate.period()`
    /// (rounded up to a whole microsecond).
    ///
    /// The name sets the limiter apart: its state lives under
    /// `<prefix>:<name>:{<key>}:sw`, so limiters with different names never
    /// share state, whatever keys they are asked about. Processes that share
    /// one limit give it the same name, prefix and configuration.
    ///
    /// Errors: [`ConfigError::InvalidName`] (empty, longer than
    /// [`MAX_NAME_LEN`](crate::MAX_NAME_LEN) bytes, or with `{` or `}`),
    /// [`ConfigError::ZeroRate`], [`ConfigError::ZeroPeriod`],
    /// [`ConfigError::TooFine`] (more than one permit per µs),
    /// [`ConfigError::Overflow`] (the limit times the
    /// window in µs above 2^51: 100,000 per hour fits, `u32::MAX` per day
    /// does not).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{ConfigError, Rate};
    /// use tollgate_redis::ApproxSlidingWindow;
    /// assert!(ApproxSlidingWindow::new("api", Rate::per_hour(100_000)).is_ok());
    /// assert!(matches!(
    ///     ApproxSlidingWindow::new("api", Rate::new(u32::MAX, Duration::from_secs(86_400))),
    ///     Err(ConfigError::Overflow { .. })
    /// ));
    /// assert_eq!(
    ///     ApproxSlidingWindow::new("}", Rate::per_hour(1)),
    ///     Err(ConfigError::InvalidName)
    /// );
    /// ```
    pub fn new(name: &str, rate: Rate) -> Result<Self, ConfigError> {
        let counter = Window::new(name, rate)?;
        product(
            counter.window,
            u64::from(counter.limit),
            "the limit × the window",
        )?;
        Ok(ApproxSlidingWindow(counter))
    }

    /// The same window under another key prefix (default `tollgate`): the
    /// namespace of an application that shares its Redis with others. Its
    /// limiters keep apart by their names.
    ///
    /// Errors: [`ConfigError::InvalidPrefix`] (a prefix with `{` or `}`).
    ///
    /// ```
    /// use tollgate::Rate;
    /// use tollgate_redis::{ApproxSlidingWindow, Limiter};
    /// let api = ApproxSlidingWindow::new("api", Rate::per_minute(60)).unwrap();
    /// let api = api.with_prefix("shop").unwrap();
    /// assert_eq!(api.redis_key("k"), "shop:api:{k}:sw");
    /// ```
    pub fn with_prefix(self, prefix: &str) -> Result<Self, ConfigError> {
        self.0.with_prefix(prefix).map(ApproxSlidingWindow)
    }

    /// The window's length.
    ///
    /// ```
    /// use tollgate::Rate;
    /// let window = tollgate_redis::ApproxSlidingWindow::new("api", Rate::per_second(10)).unwrap();
    /// assert_eq!(window.window().as_secs(), 1);
    /// ```
    pub fn window(&self) -> Duration {
        self.0.length()
    }
}

impl Limiter for ApproxSlidingWindow {
    fn capacity(&self) -> u32 {
        self.0.limit
    }

    fn name(&self) -> &str {
        &self.0.name
    }

    fn redis_key(&self, key: &str) -> String {
        self.0.redis_key(key, "sw")
    }

    /// Whole again once the admission's window and the next have passed:
    /// the counter weighs the previous window into the current one.
    fn report(&self, admission: &Admission) -> tollgate::Snapshot {
        self.0.report(admission, self.0.window)
    }

    fn plan(&self) -> Plan {
        self.0.plan(Kind::SlidingWindow)
    }
}
