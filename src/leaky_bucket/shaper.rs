//! The leaky bucket as a queue: every admitted request is given its start time.

use std::time::Duration;

use crate::error::{ConfigError, Denied};
use crate::limiter::Snapshot;
use crate::machine::{Carry, Machine, Schedule, pack, scale_up, unpack};
use crate::rate::Rate;
use crate::timeline::span;
use crate::waiting::MAX_WAIT;

/// The shaper's configuration: the pure part of every decision.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Queue {
    /// Nanoseconds between starts, rounded up (never faster than asked).
    interval: u64,
    /// Requests that may start at once on an idle queue, beyond the first.
    burst: u32,
    /// The longest a request may be queued, in ns.
    max_wait: u64,
    /// The most permits one request may ask for: what the queue can hold.
    capacity: u32,
}

impl Queue {
    pub(crate) fn new(rate: Rate, burst: u32, max_wait: Duration) -> Result<Self, ConfigError> {
        let (permits, period) = rate.validate()?;
        let interval = period.div_ceil(u64::from(permits));
        let max_wait = u64::try_from(max_wait.as_nanos())
            .ok()
            .filter(|&w| w <= MAX_WAIT)
            .ok_or(ConfigError::MaxWaitTooLong { max_wait })?;
        // Immediate starts (1 + burst) plus the starts that fit in the wait.
        let capacity = u64::from(burst) + 1 + max_wait / interval;
        let capacity = u32::try_from(capacity).unwrap_or(u32::MAX);
        // The furthest a request may reach past its start: (burst + n)·interval
        // for n up to the capacity. Bounding it bounds every state time.
        let lead = u64::from(burst) + u64::from(capacity);
        span(lead, interval, "(burst + capacity) × time per permit")?;
        Ok(Queue {
            interval,
            burst,
            max_wait,
            capacity,
        })
    }

    pub(crate) fn interval(&self) -> Duration {
        Duration::from_nanos(self.interval)
    }

    pub(crate) fn capacity(&self) -> u32 {
        self.capacity
    }

    pub(crate) fn burst(&self) -> u32 {
        self.burst
    }

    pub(crate) fn max_wait(&self) -> Duration {
        Duration::from_nanos(self.max_wait)
    }
}

/// The shaper's word is `end << 64 | last` ([`pack`]). `end` is the
/// schedule's end (the next free slot, a theoretical arrival time); `last` is
/// the latest start granted, the floor under every later start.
///
/// Why the second word: a request may start up to `burst` intervals before
/// its slot, but never before its own clock reading, so a start is
/// `max(end − burst·I, now)`. When `now` is the larger, that start depends on
/// a reading the word `end` does not remember; a later request whose reading
/// is *older* (stale: read before a racing request's, or a clock that stepped
/// back) would be granted an earlier start than a request booked before it,
/// and the spacing promise, which counts permits from one start to the next in
/// start order, breaks (for example: 5 per 5001 ns, burst 3, a request read at
/// 152324, another was booked at 153325, then the first was granted 5 permits
/// starting at 152324 — 5 in [152324, 153325) against 3 + 1). With the latest
/// start kept beside the end, every start is at least the one before it, so
/// start order is booking order and the single-word argument holds again.
/// Fresh readings never see the floor: it is at most the reading of the
/// booking that set it, or below that booking's `end − burst·I`.
///
/// `last` is at most a reading plus the longest wait, `2^62 + 2^61 < 2^63`,
/// so bit 63 of the low word is free for the keyed layer's tag.
impl Machine for Queue {
    type Word = u128;

    /// Admitted only if it can start at `now`: the shaper used as a meter.
    #[inline]
    fn decide(&self, state: u128, now: u64, n: u32) -> Result<u128, Denied> {
        self.book_now(state, now, n)
    }

    /// What a request could get at `now`: a request of any size up to the
    /// capacity starts now iff the schedule ends within `burst` intervals and
    /// no start granted so far is later than `now`.
    fn snapshot(&self, state: u128, now: u64) -> Snapshot {
        let (end, last) = unpack(state);
        let slack = u64::from(self.burst) * self.interval;
        let earliest = end.saturating_sub(slack).max(last);
        let available = if earliest <= now { self.capacity } else { 0 };
        Snapshot::from_ns(available, self.capacity, earliest.saturating_sub(now))
    }

    fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Fresh iff the schedule has ended: `end <= now`. Then `last <= end <=
    /// now` (a start never passes its slot's end), so at every `t >= now` a
    /// booking's base is `max(end, t) = t` and its floor `max(t, last) = t`,
    /// exactly the initial word's. Not the snapshot's "a request starts now",
    /// which holds as soon as `end − burst·I <= now`: a queue with burst
    /// still in use is not fresh.
    fn is_fresh(&self, state: u128, now: u64) -> bool {
        unpack(state).0 <= now
    }

    /// The queued time `end − now` is carried like the bucket's debt, over the
    /// furthest the end can run ahead, `(burst + capacity)·interval`:
    /// `Proportional` keeps its fraction, `Additive` the permits queued
    /// (capped), `Reset` none. The start floor is kept where the new end
    /// allows. An ended schedule carries to the initial word.
    fn carry(from: &Self, to: &Self, state: u128, now: u64, carry: Carry) -> u128 {
        let (end, last) = unpack(state);
        let reach = |q: &Queue| q.interval * (u64::from(q.burst) + u64::from(q.capacity));
        let queued = end.saturating_sub(now).min(reach(from));
        let queued = match carry {
            Carry::Proportional => scale_up(queued, reach(to), reach(from)),
            Carry::Additive => scale_up(queued, to.interval, from.interval).min(reach(to)),
            Carry::Reset => 0,
        };
        if queued == 0 {
            return Self::INITIAL;
        }
        // `now <= 2^62`, `queued <= reach <= 2^62`: the bounds of `book`.
        let end = now + queued;
        pack(end, last.min(end))
    }
}

/// A booking's cancellation is the default refund: every booking moves `end`
/// strictly forward (by `n·interval > 0`), and restoring the exact state it
/// replaced, latest start included, is "as if it had never been made".
impl Schedule for Queue {
    /// The state after booking `n` permits on `state` at `now`, and their
    /// start, if the start is within both the queue's bound and the caller's
    /// `max_wait` of `now`. The request occupies the slot `[max(end, now),
    /// +n·interval)`; its first permit may run `burst` intervals ahead of the
    /// slot, but it starts neither before `now` nor before the latest start
    /// granted (see the word, on `Machine for Queue`).
    ///
    /// No overflow: `end <= 2^62 + MAX_WAIT + 2^62` and `last <= end` (the
    /// bounds of `waiting::schedule`, which this is with a floor).
    #[inline]
    fn book(&self, state: u128, now: u64, n: u32, max_wait: u64) -> Result<(u128, u64), Denied> {
        let (end, last) = unpack(state);
        // A stale reading is lifted to the latest start: time never runs
        // backwards for the schedule. `last < end`, so the slot is unchanged.
        let at = now.max(last);
        let slot_end = end.max(at) + u64::from(n) * self.interval;
        let lead = (u64::from(self.burst) + u64::from(n)) * self.interval;
        let start = slot_end.saturating_sub(lead).max(at);
        // Measured from the request's own reading: a stale one waits longer
        // on paper, which can only deny, and its retry-after is then the
        // exact time from that reading until the same start is within bounds.
        let wait = start - now;
        let max_wait = max_wait.min(self.max_wait);
        if wait <= max_wait {
            Ok((pack(slot_end, start), start))
        } else {
            Err(Denied::RetryAfter(Duration::from_nanos(wait - max_wait)))
        }
    }
}
