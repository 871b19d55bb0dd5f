//! The fixed window in Redis: a count per aligned window per key, as tollgate's
//! in-process [`FixedWindow`](tollgate::FixedWindow).
//!
//! The key is a string `fw2:<w>:<c>`: the index of the window last written
//! (server µs since the Unix epoch divided by the window) and its count.
//! Windows are aligned to the epoch, so every client agrees on them. A reading
//! older than the stored window (a server clock that stepped back) counts
//! against the stored window: a closed window never reopens. The key expires
//! when its window ends. A denial waits exactly until the window ends.
//!
//! A key that does not hold `fw2:` and two non-negative integers, a count
//! above 2^32 − 1, or a window after the current one (further than this
//! window writes) that ends after the key's own expiry or on a key without
//! expiry, is [`Error::UnknownState`](crate::Error::UnknownState) naming the
//! field, and is left untouched: damaged state never admits. A hash
//! `{v: "fw1", w, c}`, the format of earlier versions, is read too and written
//! anew as a string.
//!
//! Guarantee: at most `limit` per aligned window — and, like every fixed
//! window, up to 2× `limit` in a span of one window that straddles a boundary.
//!
//! ```no_run
//! # async fn demo(client: tollgate_redis::Client) -> Result<(), Box<dyn std::error::Error>> {
//! use tollgate::Rate;
//! let per_minute = tollgate_redis::FixedWindow::new("per-ip", Rate::per_minute(100))?;
//! let admission = client.try_acquire(&per_minute, "203.0.113.9").await?;
//! println!("{} left this minute", admission.remaining);
//! # Ok(()) }
//! ```

use std::time::Duration;

use tollgate::{ConfigError, Rate};

use crate::limiter::{Kind, Limiter, Plan};
use crate::script::Admission;
use crate::window::Window;

/// A fixed window shared through Redis: at most `rate.permits()` per aligned
/// window of `rate.period()`, per caller key. See the [module docs](self).
///
/// ```
/// use std::time::Duration;
/// use tollgate::Rate;
/// let window = tollgate_redis::FixedWindow::new("per-ip", Rate::per_minute(100)).unwrap();
/// assert_eq!(window.window(), Duration::from_secs(60));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FixedWindow(Window);

impl FixedWindow {
    /// The window `name`: `rate.permits()` per aligned window of
    /// `rate.period()` (rounded up to a whole microsecond).
    ///
    /// The name sets the limiter apart: its state lives under
    /// `<prefix>:<name>:{<key>}:fw`, so limiters with different names never
    /// share state, whatever keys they are asked about. Processes that share
    /// one limit give it the same name, prefix and configuration.
    ///
    /// Errors: [`ConfigError::InvalidName`] (empty, longer than
    /// [`MAX_NAME_LEN`](crate::MAX_NAME_LEN) bytes, or with `{` or `}`),
    /// [`ConfigError::ZeroRate`], [`ConfigError::ZeroPeriod`],
    /// [`ConfigError::TooFine`] (more than one permit per µs),
    /// [`ConfigError::Overflow`] (a window above 2^51 µs).
    ///
    /// ```
    /// use tollgate::{ConfigError, Rate};
    /// use tollgate_redis::FixedWindow;
    /// assert!(FixedWindow::new("exports", Rate::per_hour(1000)).is_ok());
    /// assert_eq!(FixedWindow::new("exports", Rate::per_hour(0)), Err(ConfigError::ZeroRate));
    /// assert_eq!(FixedWindow::new("a{b}", Rate::per_hour(1)), Err(ConfigError::InvalidName));
    /// ```
    pub fn new(name: &str, rate: Rate) -> Result<Self, ConfigError> {
        Window::new(name, rate).map(FixedWindow)
    }

    /// The same window under another key prefix (default `tollgate`): the
    /// namespace of an application that shares its Redis with others. Its
    /// limiters keep apart by their names.
    ///
    /// Errors: [`ConfigError::InvalidPrefix`] (a prefix with `{` or `}`).
    ///
    /// ```
    /// use tollgate::Rate;
    /// use tollgate_redis::{FixedWindow, Limiter};
    /// let api = FixedWindow::new("api", Rate::per_minute(60)).unwrap();
    /// let api = api.with_prefix("shop").unwrap();
    /// assert_eq!(api.redis_key("k"), "shop:api:{k}:fw");
    /// ```
    pub fn with_prefix(self, prefix: &str) -> Result<Self, ConfigError> {
        self.0.with_prefix(prefix).map(FixedWindow)
    }

    /// The window's length.
    ///
    /// ```
    /// use tollgate::Rate;
    /// let window = tollgate_redis::FixedWindow::new("api", Rate::per_second(10)).unwrap();
    /// assert_eq!(window.window().as_secs(), 1);
    /// ```
    pub fn window(&self) -> Duration {
        self.0.length()
    }
}

impl Limiter for FixedWindow {
    fn capacity(&self) -> u32 {
        self.0.limit
    }

    fn name(&self) -> &str {
        &self.0.name
    }

    fn redis_key(&self, key: &str) -> String {
        self.0.redis_key(key, "fw")
    }

    /// Whole again when the admission's window ends.
    fn report(&self, admission: &Admission) -> tollgate::Snapshot {
        self.0.report(admission, 0)
    }

    fn plan(&self) -> Plan {
        self.0.plan(Kind::FixedWindow)
    }
}
