//! A limiter's private view of time: nanoseconds since the limiter was built.

use crate::clock::Clock;

/// The end of every limiter's time range: 2^62 ns, about 146 years after it was
/// built. Readings past it are held at it, so no time arithmetic can overflow:
/// a state time is at most `MAX_TIME` plus one capacity's worth of time
/// (also at most `MAX_TIME`), which is below 2^63.
pub(crate) const MAX_TIME: u64 = 1 << 62;

/// A clock plus the instant the limiter was built.
///
/// Limiters keep integer nanoseconds since their own origin, so the states start
/// at zero and every bound on them is a bound on the limiter's age, not on the
/// clock's.
#[derive(Debug)]
pub(crate) struct Timeline<C> {
    clock: C,
    origin: u64,
}

impl<C: Clock> Timeline<C> {
    pub(crate) fn new(clock: C) -> Self {
        let origin = clock.now();
        Timeline { clock, origin }
    }

    /// Nanoseconds since the origin, in `[0, MAX_TIME]`. A clock that reads before
    /// the origin reads as the origin; it never panics or wraps. Read through
    /// [`Clock::now_for_limiter`]: every limiter copes with a reading older than
    /// its state, so a clock's own backwards guard is not needed here.
    #[inline]
    pub(crate) fn now(&self) -> u64 {
        self.clock
            .now_for_limiter()
            .saturating_sub(self.origin)
            .min(MAX_TIME)
    }

    pub(crate) fn clock(&self) -> &C {
        &self.clock
    }
}
