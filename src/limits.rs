//! Bounds on configurations that more than one part of the crate needs: the
//! limiters that enforce them and the errors that name them. Low-level: it
//! imports nothing, so `error` can print the bounds without depending on the
//! algorithms. Their public path is the crate root.

/// The most sub-windows a [`SlidingWindow`](crate::SlidingWindow) may be cut into (see
/// [`SlidingWindowBuilder::sub_windows`](crate::SlidingWindowBuilder::sub_windows)). Each costs 8 bytes of history, and a
/// denial's retry-after takes time proportional to their number; 4096 cut an
/// hour into sub-windows of under a second.
///
/// ```
/// use tollgate::MAX_SUB_WINDOWS;
/// use tollgate::{ConfigError, Rate, SlidingWindow};
///
/// let rate = Rate::per_hour(100);
/// assert!(SlidingWindow::builder(rate).sub_windows(MAX_SUB_WINDOWS).build().is_ok());
/// assert_eq!(
///     SlidingWindow::builder(rate).sub_windows(MAX_SUB_WINDOWS + 1).build().unwrap_err(),
///     ConfigError::InvalidSubWindows { sub_windows: MAX_SUB_WINDOWS + 1, max: MAX_SUB_WINDOWS }
/// );
/// ```
pub const MAX_SUB_WINDOWS: u32 = 4096;

/// The largest cold factor accepted: a cold limiter is at most a thousand times
/// slower than a warm one. Outside `1..=MAX_COLD_FACTOR`, construction fails
/// with [`ConfigError::InvalidColdFactor`](crate::ConfigError::InvalidColdFactor).
///
/// ```
/// use std::time::Duration;
/// use tollgate::MAX_COLD_FACTOR;
/// use tollgate::{ManualClock, Rate, WarmUp};
///
/// let rate = Rate::per_second(5);
/// let warm_up = Duration::from_secs(4);
/// assert!(WarmUp::with_cold_factor(rate, warm_up, MAX_COLD_FACTOR, ManualClock::new()).is_ok());
/// assert!(WarmUp::with_cold_factor(rate, warm_up, MAX_COLD_FACTOR + 1, ManualClock::new()).is_err());
/// ```
pub const MAX_COLD_FACTOR: u32 = 1000;
