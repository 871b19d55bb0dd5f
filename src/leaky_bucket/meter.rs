//! The leaky bucket meter's decision function: the level, kept as the instant
//! the bucket will have drained empty.

use std::time::Duration;

use crate::error::{ConfigError, Denied};
use crate::limiter::Snapshot;
use crate::machine::{Carry, Machine, Schedule, carry_debt};
use crate::rate::Rate;
use crate::timeline::MAX_TIME;
use crate::waiting::schedule;

/// A leaky bucket meter: the whole state is `empty_at`, the instant at which the
/// water now in the bucket will have leaked out. The level at `now` is
/// `max(empty_at − now, 0)` nanoseconds of drain, i.e. that divided by the
/// drain interval in permits; the level is never stored, so nothing has to drip.
#[derive(Debug, Clone, Copy)]
#[allow(unreachable_pub)] // sealed: public only as `MeterConfig`'s machine
pub struct Meter {
    /// Nanoseconds for one permit to drain, rounded up (never drains faster than asked).
    interval: u64,
    capacity: u32,
    /// `capacity * interval`: the deepest the bucket gets, in drain time.
    depth: u64,
}

impl Meter {
    pub(crate) fn new(capacity: u32, rate: Rate) -> Result<Self, ConfigError> {
        let (permits, period) = rate.validate()?;
        if capacity == 0 {
            return Err(ConfigError::ZeroCapacity);
        }
        let interval = period.div_ceil(u64::from(permits));
        let depth = interval
            .checked_mul(u64::from(capacity))
            .filter(|&d| d <= MAX_TIME)
            .ok_or(ConfigError::Overflow {
                what: "capacity × time per permit",
            })?;
        Ok(Meter {
            interval,
            capacity,
            depth,
        })
    }

    pub(crate) fn interval(&self) -> Duration {
        Duration::from_nanos(self.interval)
    }

    /// The level at `now`, in nanoseconds of drain time.
    fn level(empty_at: u64, now: u64) -> u64 {
        empty_at.saturating_sub(now)
    }
}

impl Machine for Meter {
    type Word = u64;

    /// Empty at the limiter's origin.
    const INITIAL: u64 = 0;

    fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Pours `n` permits in iff the level after pouring is at most the capacity.
    ///
    /// A `now` older than the state's writer sees a higher level (less has
    /// drained), so a stale reading can only deny. No overflow: `empty_at <=
    /// now_max + depth <= 2^62 + 2^62`, and `n * interval <= depth`.
    #[inline]
    fn decide(&self, empty_at: u64, now: u64, n: u32) -> Result<u64, Denied> {
        let level = Self::level(empty_at, now) + u64::from(n) * self.interval;
        if level <= self.depth {
            Ok(now + level)
        } else {
            // The level drains one nanosecond per nanosecond, so after exactly
            // the overflow it fits.
            Err(Denied::RetryAfter(Duration::from_nanos(level - self.depth)))
        }
    }

    fn snapshot(&self, empty_at: u64, now: u64) -> Snapshot {
        let level = Self::level(empty_at, now);
        // `depth - level` is the room left; whole permits of it are available.
        let available = ((self.depth - level.min(self.depth)) / self.interval) as u32;
        Snapshot::from_ns(available, self.capacity, level)
    }

    /// `empty_at − now` is the level in drain time, exactly the GCRA's debt
    /// (the meter's decision is the GCRA's with `depth` for `tolerance`), so
    /// it carries over as the bucket does. Its refund is the default stack
    /// rule: `empty_at` moves strictly forward with every admission.
    fn carry(from: &Self, to: &Self, empty_at: u64, now: u64, carry: Carry) -> u64 {
        let shape = |m: &Meter| (m.interval, m.capacity);
        carry_debt(shape(from), shape(to), empty_at, now, carry)
    }
}

/// A booking pours its permits in now and starts when the level they reach
/// has drained to the depth: the GCRA's schedule with `depth` for the lead.
impl Schedule for Meter {
    #[inline]
    fn book(&self, empty_at: u64, now: u64, n: u32, max_wait: u64) -> Result<(u64, u64), Denied> {
        schedule(empty_at, now, n, self.interval, self.depth, max_wait)
    }
}
