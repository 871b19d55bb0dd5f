//! The fixed window's decision function: one word packing a window index and a
//! count.

use std::time::Duration;

use crate::error::{ConfigError, Denied};
use crate::limiter::Snapshot;
use crate::machine::{Carry, Machine, scale_up};
use crate::rate::Rate;

/// `limit` permits per aligned window of `window` nanoseconds, the state packing
/// `(window index << count_bits) | count`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WindowCounter {
    window: u64,
    limit: u32,
    /// Bits needed to hold `limit`; the index takes the rest.
    count_bits: u32,
}

impl WindowCounter {
    pub(crate) fn new(rate: Rate) -> Result<Self, ConfigError> {
        // `validate` guarantees `window >= limit >= 1` (at most one permit per ns)
        // and `window <= 2^62`. With `count_bits = bits(limit)`, `limit >=
        // 2^(count_bits - 1)`, and time never passes `END = 2^62 − 1`, so an
        // index (at most `END / window`) is strictly below `2^(63 −
        // count_bits)` — at `2^62` itself it would *equal* it for `limit =
        // window = 2^(count_bits − 1)` — and the packed word is below 2^63:
        // it never wraps, no two windows in the limiter's lifetime share an
        // index, and bit 63 stays free for the keyed layer's tag.
        let (limit, window) = rate.validate()?;
        Ok(WindowCounter {
            window,
            limit,
            count_bits: u32::BITS - limit.leading_zeros(),
        })
    }

    pub(crate) fn window(&self) -> Duration {
        Duration::from_nanos(self.window)
    }

    /// The window a decision at `now` counts against, and its count. A `now` in an
    /// older window than the state's (stale or backwards time) counts against the
    /// state's window: time is treated as having stood still.
    #[inline]
    fn current(&self, state: u64, now: u64) -> (u64, u64) {
        let index = state >> self.count_bits;
        // Most decisions fall in the stored window: one multiply settles it, and
        // the division runs only when a new window opens. No overflow: the
        // index is at most END / window, so its end is at most 2^62 + window.
        if now < (index + 1) * self.window {
            (index, state & ((1 << self.count_bits) - 1))
        } else {
            (now / self.window, 0)
        }
    }

    /// The window length in nanoseconds.
    #[inline]
    pub(crate) fn window_ns(&self) -> u64 {
        self.window
    }

    /// The limit, as a count.
    #[inline]
    pub(crate) fn limit(&self) -> u64 {
        u64::from(self.limit)
    }

    /// The word `(index, count)`; `count <= limit` keeps it in its bits.
    #[inline]
    pub(crate) fn pack(&self, index: u64, count: u64) -> u64 {
        (index << self.count_bits) | count
    }

    /// The word's `(index, count)`.
    #[inline]
    pub(crate) fn unpack(&self, state: u64) -> (u64, u64) {
        (
            state >> self.count_bits,
            state & ((1 << self.count_bits) - 1),
        )
    }

    /// The bits of a word that hold the count.
    #[inline]
    pub(crate) fn count_mask(&self) -> u64 {
        (1 << self.count_bits) - 1
    }

    /// As `current`, for the leased window's slow path.
    #[inline]
    pub(crate) fn counted(&self, state: u64, now: u64) -> (u64, u64) {
        self.current(state, now)
    }

    /// The denial of a request that does not fit window `index` at `now`.
    #[inline]
    pub(crate) fn denial(&self, index: u64, now: u64) -> Denied {
        Denied::RetryAfter(Duration::from_nanos(self.until_end(index, now)))
    }

    /// Nanoseconds from `now` to the end of window `index`.
    #[inline]
    fn until_end(&self, index: u64, now: u64) -> u64 {
        ((index + 1) * self.window).saturating_sub(now)
    }
}

impl Machine for WindowCounter {
    type Word = u64;

    #[inline]
    fn decide(&self, state: u64, now: u64, n: u32) -> Result<u64, Denied> {
        let (index, count) = self.current(state, now);
        let count = count + u64::from(n);
        if count <= u64::from(self.limit) {
            Ok((index << self.count_bits) | count)
        } else {
            // `n <= limit`, so the request fits the next window, which is empty.
            Err(Denied::RetryAfter(Duration::from_nanos(
                self.until_end(index, now),
            )))
        }
    }

    fn snapshot(&self, state: u64, now: u64) -> Snapshot {
        let (index, count) = self.current(state, now);
        let until_full = if count == 0 {
            0
        } else {
            self.until_end(index, now)
        };
        // `count <= limit`, so the difference fits a u32.
        Snapshot::from_ns(self.limit - count as u32, self.limit, until_full)
    }

    fn capacity(&self) -> u32 {
        self.limit
    }

    /// The fixed window's refund rule: what a denied request that the window had
    /// admitted (in [`AllOf`](crate::AllOf) or a keyed pair) may give back.
    ///
    /// Gives the permits back while their window is still the current one;
    /// once the window has moved on they no longer count against anything.
    /// Exact whatever happened in between and whatever the readings: a count
    /// is a sum, so every later admission in the same window stacked on ours,
    /// and the window index never goes back (a stale reading counts against
    /// the stored window), so "the same index" is "the same window".
    fn refund(&self, state: u64, _before: u64, written: u64, n: u32) -> Option<u64> {
        let bits = self.count_bits;
        let count = state & ((1 << bits) - 1);
        (state >> bits == written >> bits && count >= u64::from(n)).then(|| state - u64::from(n))
    }

    /// The count used in the current window is carried; the word packs
    /// `(window index << b) | count`.
    fn carry(from: &Self, to: &Self, state: u64, now: u64, carry: Carry) -> u64 {
        let used = Machine::snapshot(from, state, now);
        let used = u64::from(used.capacity - used.available);
        let used = match carry {
            Carry::Proportional => {
                scale_up(used, u64::from(to.capacity()), u64::from(from.capacity()))
            }
            Carry::Additive => used.min(u64::from(to.capacity())),
            Carry::Reset => 0,
        };
        if used == 0 {
            return Self::INITIAL;
        }
        // `1 <= used <= limit`, so a fresh window admits it: the word for
        // "`used` counted in the window of `now`".
        to.decide(Self::INITIAL, now, used as u32)
            .unwrap_or(Self::INITIAL)
    }
}
