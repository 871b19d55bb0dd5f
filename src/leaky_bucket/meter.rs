//! The leaky bucket meter's decision function: the level, kept as the instant
//! the bucket will have drained empty.

use std::time::Duration;

use crate::error::{ConfigError, Denied};
use crate::limiter::Snapshot;
use crate::rate::Rate;
use crate::timeline::MAX_TIME;
use crate::word::{Refund, WordMachine};

/// A leaky bucket meter: the whole state is `empty_at`, the instant at which the
/// water now in the bucket will have leaked out. The level at `now` is
/// `max(empty_at − now, 0)` nanoseconds of drain, i.e. that divided by the
/// drain interval in permits; the level is never stored, so nothing has to drip.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Meter {
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

impl WordMachine for Meter {
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
}

/// The meter's refund rule, the token bucket's: the word (the time the bucket
/// is empty) moves strictly forward on every admission, so it equals the word
/// an admission wrote iff every change since has been undone; only then is
/// the word it replaced restored. A refund that finds the word moved keeps
/// the permits poured (under-admission, never over-admission).
impl Refund for Meter {
    fn refund(&self, empty_at: u64, before: u64, written: u64, _n: u32) -> Option<u64> {
        (empty_at == written).then_some(before)
    }
}
