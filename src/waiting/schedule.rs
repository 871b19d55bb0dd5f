//! The reservation arithmetic shared by every limiter whose state is one
//! "theoretical arrival time": the token bucket (GCRA) and the leaky bucket
//! shaper.

use std::time::Duration;

use crate::error::Denied;
use crate::timeline::MAX_TIME;

/// The longest wait any reservation may be given: 2^61 ns, about 73 years.
/// Bounding it keeps every state time at most `now + MAX_WAIT + lead <=
/// 2^62 + 2^61 + 2^62`, so adding one more request's `n·interval <= 2^62` (in
/// this module, or in a limiter's own non-waiting decision) stays below 2^64.
pub(crate) const MAX_WAIT: u64 = MAX_TIME / 2;

/// A wait bound in nanoseconds, saturated at [`MAX_WAIT`].
pub(crate) fn wait_bound(max_wait: Duration) -> u64 {
    u64::try_from(max_wait.as_nanos()).map_or(MAX_WAIT, |ns| ns.min(MAX_WAIT))
}

/// Schedules `n` permits behind everything reserved so far.
///
/// `tat` is the virtual end of the schedule (the instant at which everything
/// admitted so far has been paid for, one `interval` per permit); the request
/// occupies `[max(tat, now), end)` with `end = max(tat, now) + n·interval`. It
/// may start `lead` nanoseconds before its end — `capacity·interval` for a token
/// bucket, `(burst + n)·interval` for a shaper — but never before `now`. It is
/// granted only if that start is at most `max_wait` after `now`; otherwise
/// nothing changes and the denial says how much sooner it would have to start.
///
/// Returns `(end, start)`. Callers guarantee `tat <= 2^62 + MAX_WAIT + 2^62`,
/// `now <= 2^62`, `n·interval <= 2^62`, `lead <= 2^62` and `max_wait <=
/// MAX_WAIT`, so nothing overflows, and the new end is again within the first bound.
#[inline]
pub(crate) fn schedule(
    tat: u64,
    now: u64,
    n: u32,
    interval: u64,
    lead: u64,
    max_wait: u64,
) -> Result<(u64, u64), Denied> {
    let end = tat.max(now) + u64::from(n) * interval;
    let start = end.saturating_sub(lead).max(now);
    let wait = start - now;
    if wait <= max_wait {
        Ok((end, start))
    } else {
        // Nothing else admitted, the same request made `wait − max_wait` later
        // starts at the same instant, exactly `max_wait` after it was made.
        Err(Denied::RetryAfter(Duration::from_nanos(wait - max_wait)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_free_schedule_starts_now() {
        assert_eq!(schedule(0, 100, 1, 10, 10, 0), Ok((110, 100)));
    }

    #[test]
    fn a_busy_schedule_queues_behind_its_end() {
        // Token bucket of 2 at 10 ns/permit, two taken at 0: the third is due at 10.
        assert_eq!(schedule(20, 0, 1, 10, 20, u64::MAX), Ok((30, 10)));
        assert_eq!(
            schedule(20, 0, 1, 10, 20, 9),
            Err(Denied::RetryAfter(Duration::from_nanos(1)))
        );
    }

    #[test]
    fn wait_bounds_saturate() {
        assert_eq!(wait_bound(Duration::MAX), MAX_WAIT);
        assert_eq!(wait_bound(Duration::from_nanos(5)), 5);
    }
}
