//! The sliding window's arithmetic, shared by the striped limiter and its twin:
//! the shape (limit, sub-window length, sub-window count), the packing of an
//! index with a count into one word, and the pure functions that turn per
//! sub-window charges into room, retry-after and snapshots.
//!
//! Both limiters call these functions with their own view of the charges (the
//! twin with exact counts under its mutex, the striped limiter with what it reads
//! from its atomics), which is what makes them decide alike.

use std::time::Duration;

use crate::error::{ConfigError, Denied};
use crate::limiter::Snapshot;
use crate::limits::MAX_SUB_WINDOWS;
use crate::rate::Rate;

/// How many sub-windows a window is cut into unless told otherwise.
pub(crate) const DEFAULT_SUB_WINDOWS: u32 = 10;

/// The shape of a sliding window: `limit` permits in any `subs` consecutive
/// aligned sub-windows of `sub` nanoseconds each.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WindowShape {
    limit: u32,
    sub: u64,
    subs: u32,
    /// Bits holding a count (at most `limit`); an index takes the other bits.
    count_bits: u32,
}

impl WindowShape {
    /// Validates `rate` and cuts its period into `subs` sub-windows of
    /// `ceil(period / subs)` ns each, so that `subs` sub-windows span at least the
    /// period and the limiter is never faster than asked.
    ///
    /// Errors: those of [`Rate`]'s validation; [`ConfigError::InvalidSubWindows`]
    /// for `subs` outside `1..=`[`WindowShape::max_subs`]: zero (each sub-window
    /// would last no time), more than [`MAX_SUB_WINDOWS`], or so many that a
    /// sub-window is shorter than `limit` ns. That last rule is what lets an
    /// index and a count share one word for the limiter's whole 2^62 ns life: a
    /// sub-window of at least `limit >= 2^(b-1)` ns has an index below
    /// `2^62 / 2^(b-1) = 2^(63-b)`, which fits the `64 - b` bits a `b`-bit count
    /// leaves.
    pub(crate) fn new(rate: Rate, subs: u32) -> Result<Self, ConfigError> {
        let (limit, period) = rate.validate()?;
        let max = Self::max_subs(limit, period);
        if !(1..=max).contains(&subs) {
            return Err(ConfigError::InvalidSubWindows {
                sub_windows: subs,
                max,
            });
        }
        let sub = period.div_ceil(u64::from(subs));
        debug_assert!(sub >= u64::from(limit));
        Ok(WindowShape {
            limit,
            sub,
            subs,
            count_bits: u32::BITS - limit.leading_zeros(),
        })
    }

    /// The most sub-windows, at most [`MAX_SUB_WINDOWS`], that a validated
    /// `period` (in ns, at least `limit`) can be cut into with none shorter than
    /// `limit` ns; at least 1.
    ///
    /// `ceil(period / s) >= limit` holds for every `s` when `limit = 1`, and
    /// otherwise exactly when `period > s·(limit − 1)`, that is when
    /// `s <= (period − 1) / (limit − 1)`, which is at least 1 as
    /// `period >= limit`.
    fn max_subs(limit: u32, period: u64) -> u32 {
        let fit = match limit {
            1 => u64::MAX,
            _ => (period - 1) / u64::from(limit - 1),
        };
        // At most MAX_SUB_WINDOWS, so the cast is lossless.
        fit.min(u64::from(MAX_SUB_WINDOWS)) as u32
    }

    /// The most sub-windows, up to [`DEFAULT_SUB_WINDOWS`], that `rate` can be cut
    /// into under the rule of [`WindowShape::new`]; 1 if the rate is invalid (then
    /// `new` reports why).
    pub(crate) fn default_subs(rate: Rate) -> u32 {
        let Ok((limit, period)) = rate.validate() else {
            return 1;
        };
        Self::max_subs(limit, period).min(DEFAULT_SUB_WINDOWS)
    }

    pub(crate) fn limit(&self) -> u32 {
        self.limit
    }

    /// Sub-window length in ns.
    pub(crate) fn sub(&self) -> u64 {
        self.sub
    }

    pub(crate) fn subs(&self) -> u32 {
        self.subs
    }

    /// The sub-window a reading falls in.
    #[inline]
    pub(crate) fn index(&self, now: u64) -> u64 {
        now / self.sub
    }

    /// Where sub-window `index` starts. Never overflows: an index comes from a
    /// reading of at most `MAX_TIME`, or is at most `subs + 1` past one, and
    /// `MAX_TIME + (subs + 1)·sub < 2^63`.
    #[inline]
    pub(crate) fn start(&self, index: u64) -> u64 {
        index * self.sub
    }

    /// `(index << count_bits) | count`. Callers keep `count <= limit` and the index
    /// below `2^(64 - count_bits)` (see [`WindowShape::new`]).
    #[inline]
    pub(crate) fn pack(&self, index: u64, count: u32) -> u64 {
        (index << self.count_bits) | u64::from(count)
    }

    #[inline]
    pub(crate) fn unpack(&self, word: u64) -> (u64, u32) {
        // The mask keeps at most `count_bits <= 32` bits, so the cast is lossless.
        (
            word >> self.count_bits,
            (word & ((1u64 << self.count_bits) - 1)) as u32,
        )
    }

    /// The oldest sub-window in the window that ends with sub-window `q`.
    #[inline]
    fn first_in_window(&self, q: u64) -> u64 {
        (q + 1).saturating_sub(u64::from(self.subs))
    }

    /// Permits charged to the window ending with sub-window `q`, counting only
    /// sub-windows up to `newest` (later ones have charged nothing yet).
    pub(crate) fn window_sum(&self, q: u64, newest: u64, charge: impl Fn(u64) -> u32) -> u64 {
        (self.first_in_window(q)..=q.min(newest))
            .map(|i| u64::from(charge(i)))
            .sum()
    }

    /// What the window ending with sub-window `q` still has room for.
    pub(crate) fn room(&self, q: u64, newest: u64, charge: impl Fn(u64) -> u32) -> u32 {
        // The sum is at most `subs · limit`; the difference, when positive, fits
        // a u32 because it is at most `limit`.
        u64::from(self.limit).saturating_sub(self.window_sum(q, newest, charge)) as u32
    }

    /// The first sub-window from `from` on whose window has room for `n`, if
    /// nothing more is admitted. `charge` gives the charges of sub-windows up to
    /// `newest`; `from <= newest + 1`. Always at most `newest + subs`, where every
    /// charge has left the window and a request of at most `limit` fits.
    pub(crate) fn first_fit(
        &self,
        from: u64,
        newest: u64,
        n: u32,
        charge: impl Fn(u64) -> u32,
    ) -> u64 {
        let sum = self.window_sum(from, newest, &charge);
        self.first_fit_from(from, newest, n, sum, charge)
    }

    /// As [`first_fit`](Self::first_fit), given `sum`, the window sum at `from`.
    fn first_fit_from(
        &self,
        from: u64,
        newest: u64,
        n: u32,
        mut sum: u64,
        charge: impl Fn(u64) -> u32,
    ) -> u64 {
        let last = newest + u64::from(self.subs);
        let mut q = from;
        while q < last {
            if u64::from(self.limit).saturating_sub(sum) >= u64::from(n) {
                return q;
            }
            // Slide one sub-window: the oldest leaves, the next one (if it has
            // charged anything) joins. Saturating, because a concurrent reader
            // may see a charge shrink between two reads of it.
            let leaving = q + 1;
            if let Some(out) = leaving.checked_sub(u64::from(self.subs)) {
                if out <= newest {
                    sum = sum.saturating_sub(u64::from(charge(out)));
                }
            }
            if leaving <= newest {
                sum += u64::from(charge(leaving));
            }
            q = leaving;
        }
        last
    }

    /// The denial for `n` permits at reading `now` when the earliest sub-window
    /// that could admit them is searched from `from`: the time from `now` to the
    /// start of the first that fits. Positive whenever `from` starts after `now`.
    pub(crate) fn retry_after(
        &self,
        now: u64,
        from: u64,
        newest: u64,
        n: u32,
        charge: impl Fn(u64) -> u32,
    ) -> Denied {
        self.wait_for(now, self.first_fit(from, newest, n, charge))
    }

    /// As [`retry_after`](Self::retry_after) from `newest + 1`, given `sum`, the
    /// window sum at `newest` (which a denial has just computed): the search
    /// starts by sliding it one sub-window instead of summing again.
    pub(crate) fn retry_after_next(
        &self,
        now: u64,
        newest: u64,
        n: u32,
        sum: u64,
        charge: impl Fn(u64) -> u32,
    ) -> Denied {
        let from = newest + 1;
        let sum = match from.checked_sub(u64::from(self.subs)) {
            Some(out) => sum.saturating_sub(u64::from(charge(out))),
            None => sum,
        };
        self.wait_for(now, self.first_fit_from(from, newest, n, sum, charge))
    }

    fn wait_for(&self, now: u64, fit: u64) -> Denied {
        Denied::RetryAfter(Duration::from_nanos(self.start(fit).saturating_sub(now)))
    }

    /// The snapshot at reading `now`, given the newest sub-window that has been
    /// opened and the charges up to it. A reading older than `newest` can get
    /// nothing until `newest` starts (requests at it are denied); otherwise the
    /// window ending with the reading's sub-window gives the room. The window is
    /// full again once the newest sub-window with a charge has left it.
    pub(crate) fn snapshot(&self, now: u64, newest: u64, charge: impl Fn(u64) -> u32) -> Snapshot {
        let q = self.index(now);
        let (available, open_at) = if q < newest {
            (0, self.start(newest))
        } else {
            (self.room(q, newest, &charge), 0)
        };
        let last_charged = (self.first_in_window(newest)..=newest)
            .rev()
            .find(|&i| charge(i) > 0);
        let full_at = last_charged.map_or(0, |i| self.start(i + u64::from(self.subs)));
        Snapshot::from_ns(
            available,
            self.limit,
            full_at.max(open_at).saturating_sub(now),
        )
    }
}
