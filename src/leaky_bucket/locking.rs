//! The shaper's locking twin.

use super::shaper::shaper;
use crate::cell::LockedCell;

shaper!(
    /// The [`Shaper`](crate::Shaper)'s twin: the same schedule end and the same
    /// decisions under a `parking_lot` mutex, including reservations and their
    /// cancellation.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{LockingShaper, Rate, Reserve};
    ///
    /// let shaper = LockingShaper::new(Rate::per_second(1000), 0, Duration::from_millis(10)).unwrap();
    /// shaper.acquire(1).unwrap();
    /// ```
    LockingShaper,
    LockedCell<u128>
);
