//! The leaky bucket meter's decision function: the level, kept as the instant
//! the bucket will have drained empty.

use std::fmt;
use std::time::Duration;

use crate::error::{ConfigError, Denied};
use crate::limiter::Snapshot;
use crate::machine::{Carry, Machine, Schedule};
use crate::rate::Rate;
use crate::token_bucket::gcra::Gcra;

/// A leaky bucket meter: the whole state is `empty_at`, the instant at which the
/// water now in the bucket will have leaked out. The level at `now` is
/// `max(empty_at − now, 0)` nanoseconds of drain, i.e. that divided by the
/// drain interval in permits; the level is never stored, so nothing has to drip.
///
/// The meter is the token bucket's GCRA read the other way up, so it runs the
/// [`Gcra`] itself: `empty_at` is the TAT and the bucket's depth, `capacity ·
/// interval`, is the tolerance. Pouring `n` permits in iff the level after is
/// at most the depth, `max(empty_at − now, 0) + n·interval <= depth`, is the
/// GCRA's `max(TAT, now) + n·interval <= now + tolerance`; both write that
/// sum plus `now`, and both deny with the overflow, after which the level
/// (draining one nanosecond per nanosecond) fits. The room left is the
/// GCRA's room, and the time until the bucket is empty its time until full.
/// A type of its own keeps the leaky bucket's configuration apart from the
/// token bucket's.
#[derive(Clone, Copy)]
#[allow(unreachable_pub)] // sealed: public only as `MeterConfig`'s machine
pub struct Meter(Gcra);

impl Meter {
    pub(crate) fn new(capacity: u32, rate: Rate) -> Result<Self, ConfigError> {
        Gcra::new(capacity, rate).map(Meter)
    }

    pub(crate) fn interval(&self) -> Duration {
        self.0.interval()
    }
}

// In the bucket's own terms: its depth, not the GCRA's tolerance.
impl fmt::Debug for Meter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Meter")
            .field("interval", &self.0.interval_ns())
            .field("capacity", &self.0.capacity())
            .field("depth", &self.0.tolerance_ns())
            .finish()
    }
}

impl Machine for Meter {
    type Word = u64;

    /// A `now` older than the state's writer sees a higher level (less has
    /// drained), so a stale reading can only deny.
    #[inline]
    fn decide(&self, empty_at: u64, now: u64, n: u32) -> Result<u64, Denied> {
        self.0.decide(empty_at, now, n)
    }

    fn snapshot(&self, empty_at: u64, now: u64) -> Snapshot {
        self.0.snapshot(empty_at, now)
    }

    fn capacity(&self) -> u32 {
        self.0.capacity()
    }

    fn refund(&self, empty_at: u64, before: u64, written: u64, n: u32) -> Option<u64> {
        self.0.refund(empty_at, before, written, n)
    }

    fn is_fresh(&self, empty_at: u64, now: u64) -> bool {
        self.0.is_fresh(empty_at, now)
    }

    /// `empty_at − now`, the level in drain time, is the GCRA's debt: it
    /// carries over as the bucket does.
    fn carry(from: &Self, to: &Self, empty_at: u64, now: u64, carry: Carry) -> u64 {
        Gcra::carry(&from.0, &to.0, empty_at, now, carry)
    }
}

/// A booking pours its permits in now and starts when the level they reach
/// has drained to the depth: the GCRA's schedule with `depth` for the lead.
impl Schedule for Meter {
    #[inline]
    fn book(&self, empty_at: u64, now: u64, n: u32, max_wait: u64) -> Result<(u64, u64), Denied> {
        self.0.book(empty_at, now, n, max_wait)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::timeline::{END, MAX_TIME};

    /// The level rule of [`Meter`]'s documentation, written out: the decision
    /// for `n` permits and the snapshot at `now`.
    fn level_rule(
        meter: &Meter,
        empty_at: u64,
        now: u64,
        n: u32,
    ) -> (Result<u64, Denied>, Snapshot) {
        let (interval, depth) = (meter.0.interval_ns(), meter.0.tolerance_ns());
        let level = empty_at.saturating_sub(now);
        let poured = level + u64::from(n) * interval;
        let decision = if poured <= depth {
            Ok(now + poured)
        } else {
            Err(Denied::RetryAfter(Duration::from_nanos(poured - depth)))
        };
        let room = depth - level.min(depth);
        let snapshot = Snapshot::from_ns((room / interval) as u32, meter.capacity(), level);
        (decision, snapshot)
    }

    /// The meter decides and reports by the level rule, word for word and
    /// nanosecond for nanosecond, and its decision is its booking that must
    /// start now.
    #[test]
    fn the_gcra_decides_and_reports_the_level() {
        let rates = [
            Rate::per_second(10),
            Rate::new(3, Duration::from_nanos(10)),
            Rate::new(7, Duration::from_secs(60)),
            Rate::new(1, Duration::from_nanos(MAX_TIME / 4)),
        ];
        for capacity in [1, 2, 3, 10] {
            for rate in rates {
                let Ok(meter) = Meter::new(capacity, rate) else {
                    continue;
                };
                let (interval, depth) = (meter.0.interval_ns(), meter.0.tolerance_ns());
                let spans = [0, 1, interval - 1, interval, depth - 1, depth, depth + 1];
                for now in [0, 1, interval, depth, END] {
                    // Drained for a while, or filled up to a nanosecond past
                    // the brim (what a stale reading sees).
                    let drained = spans.map(|span| now.saturating_sub(span));
                    let filled = spans.map(|span| now + span);
                    for empty_at in drained.into_iter().chain(filled) {
                        for n in [1, capacity / 2 + 1, capacity] {
                            let (decision, snapshot) = level_rule(&meter, empty_at, now, n);
                            assert_eq!(meter.decide(empty_at, now, n), decision);
                            assert_eq!(meter.book_now(empty_at, now, n), decision);
                            assert_eq!(meter.snapshot(empty_at, now), snapshot);
                        }
                    }
                }
            }
        }
    }
}
