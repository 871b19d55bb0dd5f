//! The token bucket's decision function: GCRA over one theoretical arrival time.

use std::time::Duration;

use crate::error::{ConfigError, Denied};
use crate::limiter::Snapshot;
use crate::machine::{Carry, Machine, Schedule, scale_up};
use crate::rate::Rate;
use crate::timeline::span;
use crate::waiting::schedule;

/// A token bucket as the generic cell rate algorithm: the whole state is the
/// theoretical arrival time (TAT), the instant at which the bucket will be full
/// again if nothing more is admitted.
#[derive(Debug, Clone, Copy)]
#[allow(unreachable_pub)] // sealed: public only as `BucketConfig`'s machine
pub struct Gcra {
    /// Nanoseconds per permit (the emission interval), rounded up.
    interval: u64,
    capacity: u32,
    /// `capacity * interval`: how far the TAT may run ahead of now.
    tolerance: u64,
}

impl Gcra {
    pub(crate) fn new(capacity: u32, rate: Rate) -> Result<Self, ConfigError> {
        let (permits, period) = rate.validate()?;
        if capacity == 0 {
            return Err(ConfigError::ZeroCapacity);
        }
        // Rounded up so the effective rate never exceeds the configured one; the
        // rate is exact whenever `permits` divides the period in nanoseconds.
        let interval = period.div_ceil(u64::from(permits));
        let tolerance = span(u64::from(capacity), interval, "capacity × time per permit")?;
        Ok(Gcra {
            interval,
            capacity,
            tolerance,
        })
    }

    pub(crate) fn interval(&self) -> Duration {
        Duration::from_nanos(self.interval)
    }

    /// Nanoseconds per permit.
    pub(crate) fn interval_ns(&self) -> u64 {
        self.interval
    }

    /// `capacity × interval` in nanoseconds.
    pub(crate) fn tolerance_ns(&self) -> u64 {
        self.tolerance
    }
}

impl Machine for Gcra {
    type Word = u64;

    /// Admits iff the TAT after paying `n` intervals is no further than the
    /// tolerance ahead of `now`.
    ///
    /// A `now` older than the state (a stale reading, or a clock that stepped
    /// back) only shrinks `now + tolerance`, so it can deny what a fresh reading
    /// would admit, never the reverse. No overflow: `now <= END = 2^62 − 1`, the
    /// TAT never exceeds `END + tolerance < 2^63` (bit 63 stays clear), and
    /// `n * interval <= tolerance`.
    #[inline]
    fn decide(&self, tat: u64, now: u64, n: u32) -> Result<u64, Denied> {
        let next = tat.max(now) + u64::from(n) * self.interval;
        let limit = now + self.tolerance;
        if next <= limit {
            Ok(next)
        } else {
            // Denied means `tat > now` (else `next <= now + tolerance`), so at
            // `now + wait` the base is still `tat` and `next` equals the limit.
            Err(Denied::RetryAfter(Duration::from_nanos(next - limit)))
        }
    }

    fn snapshot(&self, tat: u64, now: u64) -> Snapshot {
        let room = (now + self.tolerance).saturating_sub(tat.max(now));
        // `room <= tolerance`, so the quotient is at most `capacity`.
        let available = (room / self.interval) as u32;
        Snapshot::from_ns(available, self.capacity, tat.saturating_sub(now))
    }

    fn capacity(&self) -> u32 {
        self.capacity
    }

    /// The TAT is "the instant the bucket is full again": `TAT − now` is the
    /// *debt*, the time until the state is fresh again, carried over as the
    /// fraction of the tolerance in use (`Proportional`) or as the permits in
    /// use (`Additive`). A fresh TAT (no debt) carries to the initial word,
    /// whatever `carry`.
    fn carry(from: &Self, to: &Self, tat: u64, now: u64, carry: Carry) -> u64 {
        // A stale reading can see a TAT past `now + tolerance`; no state holds
        // more debt than a whole bucket.
        let debt = tat.saturating_sub(now).min(from.tolerance);
        let debt = match carry {
            Carry::Proportional => scale_up(debt, to.tolerance, from.tolerance),
            Carry::Additive => scale_up(debt, to.interval, from.interval).min(to.tolerance),
            Carry::Reset => 0,
        };
        // `now <= 2^62` and `debt <= tolerance <= 2^62`: no overflow.
        if debt == 0 { Self::INITIAL } else { now + debt }
    }
}

/// A booking queues behind the TAT and may start `capacity · interval` before
/// its end: a `try_acquire` is admitted only when its own start would be now,
/// so it never jumps ahead of a reservation.
impl Schedule for Gcra {
    #[inline]
    fn book(&self, tat: u64, now: u64, n: u32, max_wait: u64) -> Result<(u64, u64), Denied> {
        schedule(tat, now, n, self.interval, self.tolerance, max_wait)
    }
}
