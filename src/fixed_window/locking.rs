//! The fixed window's locking twin.

use std::time::Duration;

use super::counter::WindowCounter;
use crate::cell::LockedCell;
use crate::clock::{Clock, MonotonicClock};
use crate::error::ConfigError;
use crate::machine::{WordLimiter, word_limiter};
use crate::rate::Rate;

word_limiter!(
    /// The [`FixedWindow`](crate::FixedWindow)'s twin: the same packed word and the
    /// same decision function under a `parking_lot` mutex.
    ///
    /// ```
    /// use tollgate::{LockingFixedWindow, Rate, RateLimiter};
    ///
    /// let window = LockingFixedWindow::new(Rate::per_hour(1)).unwrap();
    /// assert!(window.try_acquire().is_ok());
    /// assert!(window.try_acquire().is_err());
    /// ```
    LockingFixedWindow,
    WindowCounter,
    LockedCell<u64>,
    "Rate::per_second(10)"
);

impl LockingFixedWindow {
    /// As [`FixedWindow::new`](crate::FixedWindow::new), with the same errors.
    ///
    /// ```
    /// use tollgate::{LockingFixedWindow, Rate};
    /// let window = LockingFixedWindow::new(Rate::per_minute(100)).unwrap();
    /// # let _ = window;
    /// ```
    pub fn new(rate: Rate) -> Result<Self, ConfigError> {
        Self::with_clock(rate, MonotonicClock::new())
    }
}

impl<C: Clock> LockingFixedWindow<C> {
    /// As [`FixedWindow::with_clock`](crate::FixedWindow::with_clock).
    ///
    /// ```
    /// use tollgate::{LockingFixedWindow, ManualClock, Rate};
    /// let window = LockingFixedWindow::with_clock(Rate::per_second(10), ManualClock::new()).unwrap();
    /// # let _ = window;
    /// ```
    pub fn with_clock(rate: Rate, clock: C) -> Result<Self, ConfigError> {
        Ok(LockingFixedWindow {
            inner: WordLimiter::new(WindowCounter::new(rate)?, clock),
        })
    }

    /// The window's length.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{LockingFixedWindow, Rate};
    /// let window = LockingFixedWindow::new(Rate::per_second(10)).unwrap();
    /// assert_eq!(window.window(), Duration::from_secs(1));
    /// ```
    pub fn window(&self) -> Duration {
        self.inner.machine().window()
    }
}
