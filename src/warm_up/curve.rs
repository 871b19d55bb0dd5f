//! Guava's SmoothWarmingUp in integer nanoseconds: the pure decision function.

use std::time::Duration;

use crate::error::{ConfigError, Denied};
use crate::limiter::Snapshot;
use crate::limits::MAX_COLD_FACTOR;
use crate::machine::{Carry, Machine, Schedule, pack, scale_up, unpack};
use crate::rate::Rate;
use crate::waiting::MAX_WAIT;

/// The longest warm-up period: 2^52 ns, about 52 days. It keeps the cost
/// arithmetic below (products of two bank values and the cold factor) in u128.
const MAX_WARM_UP: u64 = 1 << 52;

/// The most one request may cost at the stable rate: `n · stable ≤ 2^60`, so
/// that `next` stays below `2^62 + MAX_WAIT + 2^60 + MAX_WARM_UP < 2^63`.
const MAX_REQUEST_COST: u64 = 1 << 60;

/// The warm-up curve.
///
/// Guava keeps `storedPermits` (a double, up to `maxPermits`) that grow by one
/// per `warmupPeriod / maxPermits` of idle time. Here the same quantity is kept
/// as **banked idle time** `b ∈ [0, W]`: stored permits = `b / coolDown`, so idle
/// time adds to the bank one nanosecond per nanosecond, exactly, with no
/// division. In those units (`s` = stable interval, `f` = cold factor, `W` =
/// warm-up period):
///
/// - Guava's threshold (`0.5·W/s` permits) is `b_T = W·(f + 1)/(f + 5)`;
/// - `coolDown = 2s·(f + 1)/(f + 5)`, so `n` stored permits are `n·coolDown` of bank;
/// - the cost of spending bank from `b1` down to `b0` is
///   `n·s + (f − 1)(f + 5)²·(p1² − p0²) / (16·(f + 1)·W)` with `p = max(b − b_T, 0)`:
///   the stable price of every permit plus the trapezoid above the threshold
///   (Guava's integral of its throttling line, rewritten on the bank axis, where
///   stored permits below the threshold cost exactly `s` — as fresh ones do).
///
/// All of it in u64/u128 integers; only the trapezoid is rounded (down, to the
/// nanosecond), and the bank spent per permit (down: the limiter stays colder by
/// under a nanosecond of bank, never warmer).
///
/// The state word is `next << 64 | spent`, with `spent = W − b`, the idle
/// time the bank lacks: a cold, idle limiter is then `0` under every
/// configuration, which a fresh key must be (it is created without one).
/// `spent <= W <= 2^52`, so bit 63 of the low word is free for the keyed
/// layer's tag.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Curve {
    stable: u64,
    warm_up: u64,
    cold_factor: u32,
    threshold: u64,
    capacity: u32,
}

impl Curve {
    pub(crate) fn new(
        rate: Rate,
        warm_up: Duration,
        cold_factor: u32,
    ) -> Result<Self, ConfigError> {
        let (permits, period) = rate.validate()?;
        let stable = period.div_ceil(u64::from(permits));
        let warm_up = u64::try_from(warm_up.as_nanos())
            .ok()
            .filter(|&w| w <= MAX_WARM_UP)
            .ok_or(ConfigError::WarmUpTooLong { warm_up })?;
        if !(1..=MAX_COLD_FACTOR).contains(&cold_factor) {
            return Err(ConfigError::InvalidColdFactor { cold_factor });
        }
        let f = u128::from(cold_factor);
        let threshold = (u128::from(warm_up) * (f + 1) / (f + 5)) as u64;
        let capacity = u32::try_from(MAX_REQUEST_COST / stable).unwrap_or(u32::MAX);
        if capacity == 0 {
            return Err(ConfigError::Overflow {
                what: "the time per permit (at most 2^60 ns)",
            });
        }
        Ok(Curve {
            stable,
            warm_up,
            cold_factor,
            threshold,
            capacity,
        })
    }

    pub(crate) fn stable_interval(&self) -> Duration {
        Duration::from_nanos(self.stable)
    }

    pub(crate) fn warm_up(&self) -> Duration {
        Duration::from_nanos(self.warm_up)
    }

    pub(crate) fn cold_factor(&self) -> u32 {
        self.cold_factor
    }

    /// The state at `now` before any booking: idle time since `next` is banked
    /// (Guava's `resync`). A `now` at or before `next` (busy, stale or
    /// backwards) changes nothing.
    #[inline]
    fn resync(&self, next: u64, bank: u64, now: u64) -> (u64, u64) {
        if now > next {
            (now, (bank + (now - next)).min(self.warm_up))
        } else {
            (next, bank)
        }
    }

    /// The bank left after spending `n` stored permits from `bank`, and the time
    /// those `n` permits cost (stored ones first, then fresh ones).
    #[inline]
    fn spend(&self, bank: u64, n: u32) -> (u64, u64) {
        let f = u128::from(self.cold_factor);
        let n = u128::from(n);
        // n · coolDown, with coolDown = 2s(f + 1)/(f + 5): ≤ 2^60 · 2^11 / 6.
        let wanted = n * u128::from(self.stable) * 2 * (f + 1) / (f + 5);
        let left = (u128::from(bank).saturating_sub(wanted)) as u64;
        let base = n as u64 * self.stable;
        if self.cold_factor == 1 || self.warm_up == 0 {
            return (left, base);
        }
        let p1 = u128::from(bank.saturating_sub(self.threshold));
        let p0 = u128::from(left.saturating_sub(self.threshold));
        // (f − 1)(f + 5)²(p1 − p0)(p1 + p0) / (16(f + 1)W). Each (f + 5)·p is at
        // most (f + 5)(W − b_T) ≈ 4W ≤ 2^54, so the numerator stays under 2^120.
        let numerator = (f - 1) * ((f + 5) * (p1 - p0)) * ((f + 5) * (p1 + p0));
        let extra = numerator / (16 * (f + 1) * u128::from(self.warm_up));
        (left, base + extra as u64)
    }
}

impl Machine for Curve {
    type Word = u128;

    /// Admitted only if it can start at `now` (Guava's `tryAcquire(n)`).
    #[inline]
    fn decide(&self, state: u128, now: u64, n: u32) -> Result<u128, Denied> {
        self.book_now(state, now, n)
    }

    fn snapshot(&self, state: u128, now: u64) -> Snapshot {
        let (next, _) = unpack(state);
        let wait = next.saturating_sub(now);
        let available = if wait == 0 { self.capacity } else { 0 };
        Snapshot::from_ns(available, self.capacity, wait)
    }

    fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Fresh iff idle long enough to be cold again: `next + spent <= now`.
    /// Then at every `t >= now` the resync (`t > next`) banks `t − next >=
    /// spent`, so the bank is full and `next = t`: the initial word's state.
    /// (`next == now` needs `spent == 0`, and the initial word at `t` is
    /// `(t, full)` too.)
    fn is_fresh(&self, state: u128, now: u64) -> bool {
        let (next, spent) = unpack(state);
        next.saturating_add(spent) <= now
    }

    /// Resynced at `now` first (idle time banked). The time owed, `next −
    /// now`, is kept in permits at the new stable interval by both
    /// `Proportional` and `Additive`; the warmth is kept as a fraction of the
    /// warm-up period (`Proportional`, rounded towards cold) or as the same
    /// idle time spent, capped (`Additive`); `Reset` is cold and idle. Never
    /// warmer than it was: rounding is towards the slower side.
    fn carry(from: &Self, to: &Self, state: u128, now: u64, carry: Carry) -> u128 {
        let (next, spent) = unpack(state);
        let (next, spent) = if now > next {
            (now, spent.saturating_sub(now - next))
        } else {
            (next, spent)
        };
        let (w_from, w_to) = (from.warm_up, to.warm_up);
        let owed = next - now;
        let (owed, spent) = match carry {
            Carry::Proportional => (
                scale_up(owed, to.stable, from.stable),
                // Rounded down: less spent is colder, i.e. slower.
                (u128::from(spent.min(w_from)) * u128::from(w_to) / u128::from(w_from.max(1)))
                    as u64,
            ),
            Carry::Additive => (scale_up(owed, to.stable, from.stable), spent.min(w_to)),
            Carry::Reset => (0, 0),
        };
        // The longest wait bounds what is owed: `next` stays below `2^62 +
        // 2^61`, and a booking adds at most `2^60 + W`.
        let owed = owed.min(MAX_WAIT);
        if owed == 0 && spent == 0 {
            Self::INITIAL
        } else {
            pack(now + owed, spent)
        }
    }
}

/// A booking's cancellation is the default refund: every booking moves `next`
/// forward by at least one stable interval.
impl Schedule for Curve {
    /// Books `n` permits at `now` if they may start within `max_wait`: returns
    /// the new state and the start. The start is the (resynced) next free
    /// instant; the request's cost pushes the next one back (Guava: "pay later").
    #[inline]
    fn book(&self, state: u128, now: u64, n: u32, max_wait: u64) -> Result<(u128, u64), Denied> {
        let (next, spent) = unpack(state);
        let (next, bank) = self.resync(next, self.warm_up - spent.min(self.warm_up), now);
        // After resync `next >= now`; a stale reading sees a longer wait (the
        // resync banks less idle time), never a shorter one.
        let wait = next - now;
        let bound = max_wait.min(MAX_WAIT);
        if wait > bound {
            // Nothing else booked, the same request `wait − bound` later starts at
            // the same instant, exactly `bound` after it is made.
            return Err(Denied::RetryAfter(Duration::from_nanos(wait - bound)));
        }
        let (bank, cost) = self.spend(bank, n);
        Ok((pack(next + cost, self.warm_up - bank), next))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn curve(per_second: u32, warm_up_ms: u64, cold_factor: u32) -> Curve {
        Curve::new(
            Rate::per_second(per_second),
            Duration::from_millis(warm_up_ms),
            cold_factor,
        )
        .unwrap()
    }

    #[test]
    fn a_cold_limiter_charges_the_trapezoid() {
        // Guava's testWarmUp: 2/s, 4 s, cold factor 3. maxPermits = 8 and the
        // threshold 4, so the first permit costs (1.5 + 1.25)/2 s = 1.375 s.
        let c = curve(2, 4000, 3);
        let (bank, cost) = c.spend(c.warm_up, 1);
        assert_eq!(cost, 1_375_000_000);
        assert_eq!(bank, c.warm_up - 500_000_000);
        // Below the threshold, stored permits cost the stable interval.
        assert_eq!(c.spend(c.threshold, 1).1, 500_000_000);
        // Spending the whole warm zone costs exactly the warm-up period, plus one
        // stable interval per permit below the threshold (none here).
        let warm = (c.warm_up - c.threshold) / 500_000_000;
        assert_eq!(c.spend(c.warm_up, warm as u32).1, 4_000_000_000);
    }

    #[test]
    fn extreme_values_do_not_overflow() {
        let c = Curve::new(
            Rate::new(1, Duration::from_nanos(1 << 59)),
            Duration::from_nanos(MAX_WARM_UP),
            MAX_COLD_FACTOR,
        )
        .unwrap();
        let (_, cost) = c.spend(c.warm_up, c.capacity);
        assert!(cost <= MAX_REQUEST_COST + MAX_WARM_UP);
        let fast = Curve::new(
            Rate::per_second(1_000_000_000),
            Duration::from_nanos(MAX_WARM_UP),
            MAX_COLD_FACTOR,
        )
        .unwrap();
        let (_, cost) = fast.spend(fast.warm_up, u32::MAX);
        assert!(cost < 1 << 63);
        assert!(
            fast.book(Curve::INITIAL, 1 << 62, u32::MAX, MAX_WAIT)
                .is_ok()
        );
    }
}
