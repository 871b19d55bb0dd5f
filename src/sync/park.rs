//! Parking a thread until another wakes it: the blocking waits of the
//! concurrency limit (`concurrency::wait`). std's under std, loom's under
//! loom, so a model can block a thread on a permit and loom explores every
//! order of the park and the unpark (and reports a wake-up that never comes
//! as a deadlock).

#[cfg(not(loom))]
pub(crate) use std::thread::{Thread, current, park, park_timeout};

#[cfg(loom)]
pub(crate) use loom::thread::{Thread, current, park};

/// Under loom, which has no time: a return at once, as a spurious wake-up
/// (which `park_timeout` may always have). A waiter with a deadline then
/// checks the time and parks again; no model waits with a deadline.
#[cfg(loom)]
pub(crate) fn park_timeout(_timeout: std::time::Duration) {
    loom::thread::yield_now();
}
