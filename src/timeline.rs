//! A limiter's private view of time: nanoseconds since the limiter was built.

use crate::clock::Clock;
use crate::error::ConfigError;

/// The length of every limiter's time range: 2^62 ns, about 146 years after it
/// was built. Durations a limiter stores (a period, a capacity's worth of time)
/// are validated to be at most this long.
pub(crate) const MAX_TIME: u64 = 1 << 62;

/// `count · unit` as a stored span of time: at most [`MAX_TIME`], or
/// [`ConfigError::Overflow`] naming `what` the span is.
pub(crate) fn span(count: u64, unit: u64, what: &'static str) -> Result<u64, ConfigError> {
    count
        .checked_mul(unit)
        .filter(|&span| span <= MAX_TIME)
        .ok_or(ConfigError::Overflow { what })
}

/// The last instant of a limiter's time: readings past it are held at it. One
/// short of [`MAX_TIME`], so that every state time is *strictly* below 2^63: a
/// state time is at most `END + MAX_TIME < 2^63` (a token bucket's theoretical
/// arrival time), and a fixed window's index, at most `END / window`, stays
/// strictly below `2^(63 − b)` for a window of at least `2^(b−1)` ns. Bit 63 of
/// every one-word state is therefore free at the end of time too: the keyed
/// layer tags states with it (`kind::TAG`).
pub(crate) const END: u64 = MAX_TIME - 1;

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

    /// Nanoseconds since the origin, in `[0, END]`. A clock that reads before
    /// the origin reads as the origin; it never panics or wraps. Read through
    /// [`Clock::now_for_limiter`]: every limiter copes with a reading older than
    /// its state, so a clock's own backwards guard is not needed here.
    #[inline]
    pub(crate) fn now(&self) -> u64 {
        self.clock
            .now_for_limiter()
            .saturating_sub(self.origin)
            .min(END)
    }

    pub(crate) fn clock(&self) -> &C {
        &self.clock
    }
}
