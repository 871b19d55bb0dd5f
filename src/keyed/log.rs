//! The exact sliding log as a keyed kind: a compact ring per key.
//!
//! A key's log is the last `N` stamps of its permits, as 32-bit offsets from
//! a per-key base, in a ring allocated on the key's first admission: `4·N`
//! bytes plus a small header (see [`LogConfig`] for the figures). A request for
//! `n` permits is admitted iff the stamp it would overwrite last — the permit
//! admitted `N − n + 1` permits ago — has left the window, exactly as the
//! direct [`SlidingLog`]: at most `N` permits in any window `[t, t + T)` per
//! key, decision for decision with the direct log on a clock that does not go
//! backwards (property tests in `tests/keyed.rs`).
//!
//! # State
//!
//! Per key, under the key's own mutex (one key's traffic is rarely contended;
//! the lock is held for a few loads and stores, `O(n)` for `n` permits):
//!
//! | field | meaning |
//! |---|---|
//! | `tag` | the keyed layer's tag: the configuration the log was last written under |
//! | `tickets` | permits logged so far (less refunds); the next slot is `tickets mod N` |
//! | `clock` | the latest decision time that admitted, in ns; no decision is made before it |
//! | `base` | the unit the offsets count from |
//! | `first_busy` | the first logged permit possibly still in the window (where an admission's report resumes its search) |
//! | `ring` | `N` offsets: `0` = empty, else the stamp `base + offset − 1` (units) |
//!
//! Stamps are in units of `2^k` ns, the smallest `k` for which a window is at
//! most `2^31` units: 1 ns for windows up to 2.1 s (exact to the nanosecond),
//! 32 ns for a minute, 65.5 µs for a day. A stamp is rounded *up* to its
//! unit, so a permit leaves the window no earlier than it really does: the
//! bound holds exactly at every window length, and a decision can be stricter
//! than the nanosecond log's by less than one unit. When a stamp no longer
//! fits in 32 bits past the base (after `2^32 − 2^31` units or more), the log
//! re-bases at `now − T`: entries at or before it have left the window for
//! every later decision and become empty, the others are re-encoded. That is
//! `O(N)`, once per at least `2^31` units (2.1 s at 1 ns units).
//!
//! A decision is made at `max(reading, clock)`: a stale reading (or a clock
//! that stepped back) is decided as if time stood still at the log's latest
//! admission, and its retry-after is measured from the reading. The bound is
//! over decision times: a slot's next permit is decided at least a window
//! after its previous one's (rounded-up) stamp, hence after its decision. So no decision is
//! ever made at a time before an entry the log has dropped, which is what
//! makes re-basing, refunds and eviction exact. (The direct log checks a stale
//! reading as it is, which can deny more; the two agree on every reading not
//! older than the latest stamp.)
//!
//! [`SlidingLog`]: crate::SlidingLog

use std::fmt;
use std::time::Duration;

use super::kind::{Carry, Keyable, Refusal, View, sealed::Sealed};
use crate::clock::Clock;
use crate::error::{ConfigError, Denied};
use crate::limiter::{Snapshot, check_request};
use crate::rate::Rate;
use crate::sliding_log::SlidingLog;

/// Windows of at most this many units: the offsets of a window's stamps then
/// fit in 32 bits with room to spare before a re-base.
const WINDOW_UNITS: u64 = 1 << 31;

/// The configuration of a keyed or tunable [`SlidingLog`]: at most `N`
/// permits in any window of length `T`, per key, validated once.
///
/// Per key: a ring of `N` 32-bit stamps (`4·N` bytes, allocated on the key's
/// first admission and freed when the key is evicted) plus a 64-byte header
/// in the map's entry (about 96 bytes per key with the key and the table:
/// 215.7 bytes at N = 30, measured).
///
/// ```
/// use std::time::Duration;
/// use tollgate::keyed::{Keyed, LogConfig};
/// use tollgate::{Denied, ManualClock, Rate, SlidingLog};
///
/// let clock = ManualClock::new();
/// let per_user = Keyed::<String, SlidingLog<ManualClock>>::with_clock(
///     LogConfig::new(Rate::per_minute(30)).unwrap(),
///     clock.clone(),
/// );
/// assert!(per_user.try_acquire_n("alice", 30).is_ok());
/// clock.advance(Duration::from_secs(59));
/// assert_eq!(per_user.try_acquire("alice"), Err(Denied::RetryAfter(Duration::from_secs(1))));
/// assert!(per_user.try_acquire("bob").is_ok());
/// ```
#[derive(Clone, Copy)]
pub struct LogConfig {
    rate: Rate,
    limit: u32,
    window: u64,
    /// Units are `2^shift` ns.
    shift: u32,
}

impl LogConfig {
    /// `rate.permits()` per window of `rate.period()`, with the errors of
    /// [`SlidingLog::new`].
    ///
    /// ```
    /// use tollgate::keyed::LogConfig;
    /// use tollgate::{ConfigError, Rate};
    /// assert!(LogConfig::new(Rate::per_hour(1_000)).is_ok());
    /// assert_eq!(LogConfig::new(Rate::per_second(0)).unwrap_err(), ConfigError::ZeroRate);
    /// ```
    pub fn new(rate: Rate) -> Result<Self, ConfigError> {
        let (limit, window) = rate.validate()?;
        let mut shift = 0;
        while window.div_ceil(1 << shift) > WINDOW_UNITS {
            shift += 1;
        }
        Ok(LogConfig {
            rate,
            limit,
            window,
            shift,
        })
    }

    /// Permits per window.
    ///
    /// ```
    /// # use tollgate::{keyed::LogConfig, Rate};
    /// assert_eq!(LogConfig::new(Rate::per_minute(30)).unwrap().limit(), 30);
    /// ```
    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// The window's length.
    ///
    /// ```
    /// # use tollgate::{keyed::LogConfig, Rate};
    /// assert_eq!(LogConfig::new(Rate::per_minute(30)).unwrap().window().as_secs(), 60);
    /// ```
    pub fn window(&self) -> Duration {
        Duration::from_nanos(self.window)
    }

    /// The unit stamps are kept in (rounded up): 1 ns for windows up to
    /// 2^31 ns (2.1 s), then the smallest power of two of nanoseconds that
    /// makes a window at most 2^31 units.
    ///
    /// ```
    /// use std::time::Duration;
    /// # use tollgate::{keyed::LogConfig, Rate};
    /// assert_eq!(LogConfig::new(Rate::per_second(10)).unwrap().resolution(), Duration::from_nanos(1));
    /// assert_eq!(LogConfig::new(Rate::per_minute(30)).unwrap().resolution(), Duration::from_nanos(32));
    /// let day = Rate::new(1_000, Duration::from_secs(86_400));
    /// assert_eq!(LogConfig::new(day).unwrap().resolution(), Duration::from_nanos(65_536));
    /// ```
    pub fn resolution(&self) -> Duration {
        Duration::from_nanos(1 << self.shift)
    }

    /// `ns` rounded up to units.
    fn units(&self, ns: u64) -> u64 {
        ns.div_ceil(1 << self.shift)
    }

    fn ns(&self, units: u64) -> u64 {
        units << self.shift
    }
}

impl PartialEq for LogConfig {
    fn eq(&self, other: &Self) -> bool {
        self.rate == other.rate
    }
}

impl Eq for LogConfig {}

impl fmt::Debug for LogConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LogConfig")
            .field("limit", &self.limit)
            .field("window", &self.window())
            .finish()
    }
}

/// One key's log (see the module's state table).
#[derive(Debug, Clone)]
struct Log {
    tag: u64,
    tickets: u64,
    /// The latest decision time that admitted, exact ns; 0 before any.
    clock: u64,
    base: u64,
    /// Every logged permit before this ticket has left the window for good
    /// (as of `clock`): where the search for the first busy entry resumes.
    first_busy: u64,
    ring: Box<[u32]>,
}

impl Log {
    fn empty(tag: u64) -> Self {
        Log {
            tag,
            tickets: 0,
            clock: 0,
            base: 0,
            first_busy: 0,
            ring: Box::new([]),
        }
    }

    /// The stamp (ns, rounded up) of slot `i`, `None` if empty.
    fn stamp(&self, config: &LogConfig, i: usize) -> Option<u64> {
        match self.ring[i] {
            0 => None,
            offset => Some(config.ns(self.base + u64::from(offset) - 1)),
        }
    }

    /// When slot `i` leaves the window (0 for an empty slot).
    fn free_at(&self, config: &LogConfig, i: usize) -> u64 {
        self.stamp(config, i).map_or(0, |s| s + config.window)
    }

    fn slot(&self, ticket: u64) -> usize {
        (ticket % self.ring.len() as u64) as usize
    }

    /// The decision time for a reading: never before the latest admission's.
    fn time(&self, now: u64) -> u64 {
        now.max(self.clock)
    }

    /// `Ok(())` if `n` permits are free at `now`, else the denial.
    fn check(&self, config: &LogConfig, now: u64, n: u32) -> Result<(), Denied> {
        if self.ring.is_empty() {
            return Ok(());
        }
        let at = self.time(now);
        // The newest of the `n` entries the request replaces: the ring is
        // oldest-first from the head, so if it has left, all have.
        let free_at = self.free_at(config, self.slot(self.tickets + u64::from(n) - 1));
        if free_at <= at {
            Ok(())
        } else {
            // `free_at > at >= now`; the same request at the reading plus
            // this wait finds the entry gone, if nothing else was admitted.
            Err(Denied::RetryAfter(Duration::from_nanos(free_at - now)))
        }
    }

    /// Logs `n` permits at `now`, after a successful [`check`](Log::check).
    fn admit(&mut self, config: &LogConfig, now: u64, n: u32) {
        if self.ring.is_empty() {
            self.ring = vec![0; config.limit as usize].into_boxed_slice();
        }
        let at = self.time(now);
        // Rounded up: a permit leaves the window no earlier than it should.
        // Monotone, as decision times are.
        let stamp = config.units(at);
        if stamp - self.base + 1 > u64::from(u32::MAX) {
            self.rebase(config, stamp);
        }
        let offset = (stamp - self.base + 1) as u32;
        for ticket in self.tickets..self.tickets + u64::from(n) {
            let i = self.slot(ticket);
            self.ring[i] = offset;
        }
        self.tickets += u64::from(n);
        self.clock = at;
    }

    /// Moves the base to the window's start before `stamp` (units): entries at
    /// or before it are free at every decision from now on (decisions are made
    /// at `stamp` or later) and become empty; the rest are re-encoded.
    fn rebase(&mut self, config: &LogConfig, stamp: u64) {
        let window = config.units(config.window);
        let base = stamp.saturating_sub(window + 1);
        for offset in self.ring.iter_mut().filter(|o| **o != 0) {
            let units = self.base + u64::from(*offset) - 1;
            *offset = if units <= base {
                0
            } else {
                // `base < units <= stamp <= base + window + 1 < base + 2^32 − 1`.
                (units - base + 1) as u32
            };
        }
        self.base = base;
    }

    /// Available permits (the free run from the head) and the time until
    /// every entry has left, at `now`. The free entries are a prefix of the
    /// ring from the head (it is oldest-first, empty slots first), so a
    /// binary search finds the run.
    fn snapshot(&self, config: &LogConfig, now: u64) -> Snapshot {
        if self.ring.is_empty() {
            return Snapshot::from_ns(config.limit, config.limit, 0);
        }
        let at = self.time(now);
        let (mut lo, mut hi) = (0u64, u64::from(config.limit));
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.free_at(config, self.slot(self.tickets + mid)) <= at {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        let newest = self.free_at(
            config,
            self.slot(self.tickets + u64::from(config.limit) - 1),
        );
        Snapshot::from_ns(lo as u32, config.limit, newest.saturating_sub(now))
    }

    /// The snapshot an admission at `now` left, in amortised O(1): the
    /// free run from the head ends at the first entry still in the window,
    /// and that only moves forward (decision times do not go back, and a
    /// refund only empties entries before it), so the search resumes where
    /// the previous one stopped.
    fn report(&mut self, config: &LogConfig, now: u64) -> Snapshot {
        let at = self.time(now);
        let len = self.ring.len() as u64;
        let oldest = self.tickets.saturating_sub(len);
        let mut busy = self.first_busy.clamp(oldest, self.tickets);
        while busy < self.tickets && self.free_at(config, self.slot(busy)) <= at {
            busy += 1;
        }
        self.first_busy = busy;
        // Tickets before `oldest` are slots never written in this ring: free.
        let available = busy - oldest + (len - (self.tickets - oldest));
        let newest = self.free_at(config, self.slot(self.tickets + len - 1));
        Snapshot::from_ns(available as u32, config.limit, newest.saturating_sub(now))
    }

    /// Exactly a new log's decisions from `now` on: every entry has left the
    /// window (the newest is stamped at most `clock` rounded up to the unit)
    /// and no decision can be pinned to a later time by `clock`.
    fn is_fresh(&self, config: &LogConfig, now: u64) -> bool {
        self.ring.is_empty() || config.ns(config.units(self.clock)) + config.window <= now
    }

    /// This log, written under `from`, carried over to `to` at `now`.
    ///
    /// The log keeps its history: `Proportional` and `Additive` both keep
    /// the stamps still inside the window in force *and* inside the new one
    /// (the newest `N'` of them), re-encoded in the new unit (rounded up);
    /// `Reset` empties it. Stamps already outside the old window are dropped
    /// even if the new window is longer: a key whose log held only those was
    /// fresh, may have been evicted, and must decide the same either way.
    fn carried(&self, from: &LogConfig, to: &LogConfig, now: u64, carry: Carry) -> Log {
        let mut log = Log::empty(self.tag);
        if carry == Carry::Reset || self.ring.is_empty() {
            return log;
        }
        let at = self.time(now);
        let window = from.window.min(to.window);
        let len = self.ring.len() as u64;
        let kept: Vec<u64> = (self.tickets..self.tickets + len)
            .filter_map(|t| self.stamp(from, self.slot(t)))
            .filter(|&s| s + window > at)
            .collect();
        let kept = &kept[kept.len().saturating_sub(to.limit as usize)..];
        if kept.is_empty() {
            return log;
        }
        log.ring = vec![0; to.limit as usize].into_boxed_slice();
        log.clock = self.clock;
        log.base = to.units(at).saturating_sub(to.units(to.window) + 1);
        // Oldest first from slot 0; the head is just after the newest.
        for (i, &stamp) in kept.iter().enumerate() {
            let units = to.units(stamp).max(log.base + 1);
            log.ring[i] = (units - log.base + 1) as u32;
        }
        log.tickets = kept.len() as u64;
        log
    }

    /// Takes back the `n` permits of the admission that left `tickets` if it
    /// is still the latest: their slots become empty, which is exact because
    /// the entries they replaced had left the window at that admission's
    /// decision time, and no later decision is made earlier (`clock` stays).
    fn refund(&mut self, tickets: u64, n: u32) -> bool {
        if self.tickets != tickets || self.ring.is_empty() {
            return false;
        }
        for ticket in tickets - u64::from(n)..tickets {
            let i = self.slot(ticket);
            self.ring[i] = 0;
        }
        self.tickets -= u64::from(n);
        true
    }
}

/// A key's log under its own mutex (a loom mutex under `--cfg loom`, so the
/// models see every lock).
#[doc(hidden)]
#[allow(unreachable_pub)] // sealed: public only as `Keyable::State`
pub struct LogCell(Lock<Log>);

#[cfg(not(loom))]
type Lock<T> = parking_lot::Mutex<T>;
#[cfg(loom)]
type Lock<T> = loom::sync::Mutex<T>;

impl LogCell {
    fn new(log: Log) -> Self {
        LogCell(Lock::new(log))
    }

    #[cfg(not(loom))]
    fn lock(&self) -> parking_lot::MutexGuard<'_, Log> {
        self.0.lock()
    }

    #[cfg(loom)]
    fn lock(&self) -> loom::sync::MutexGuard<'_, Log> {
        self.0.lock().expect("no panics while a log is locked")
    }
}

impl fmt::Debug for LogCell {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LogCell").finish_non_exhaustive()
    }
}

/// The log carried over to the view's configuration, if it is stale and the
/// view current; `Err(Stale)` if it moved past the view; `Ok(None)` if it is
/// already under the view's configuration.
fn resolve(view: &View<'_, LogConfig>, log: &Log, now: u64) -> Result<Option<Log>, Refusal> {
    if log.tag == view.tag {
        Ok(None)
    } else if (view.still_current)() {
        let mut carried = log.carried(view.previous, view.current, now, view.carry);
        carried.tag = view.tag;
        Ok(Some(carried))
    } else {
        Err(Refusal::Stale)
    }
}

/// What an admission leaves: the ticket count after it, the tag it was
/// written under, and the snapshot after it at its decision's reading.
#[doc(hidden)]
#[derive(Debug, Clone, Copy)]
#[allow(unreachable_pub)] // sealed: public only as `Keyable::Receipt`
pub struct LogReceipt {
    tickets: u64,
    tag: u64,
    after: Snapshot,
}

impl<C: Clock> Sealed for SlidingLog<C> {}

impl<C: Clock> Keyable for SlidingLog<C> {
    type Config = LogConfig;
    type Clock = C;
    type State = LogCell;
    type Receipt = LogReceipt;

    fn capacity(config: &LogConfig) -> u32 {
        config.limit
    }

    fn fresh(tag: u64) -> LogCell {
        LogCell::new(Log::empty(tag))
    }

    fn acquire(
        view: &View<'_, LogConfig>,
        state: &LogCell,
        now: u64,
        n: u32,
    ) -> Result<LogReceipt, Refusal> {
        let config = view.current;
        check_request(n, config.limit)?;
        let mut log = state.lock();
        if let Some(carried) = resolve(view, &log, now)? {
            *log = carried;
        }
        log.check(config, now, n)?;
        log.admit(config, now, n);
        Ok(LogReceipt {
            tickets: log.tickets,
            tag: log.tag,
            after: log.report(config, now),
        })
    }

    fn admitted(_view: &View<'_, LogConfig>, receipt: LogReceipt, _now: u64) -> Snapshot {
        receipt.after
    }

    fn peek(view: &View<'_, LogConfig>, state: &LogCell, now: u64, n: u32) -> Result<(), Refusal> {
        let config = view.current;
        check_request(n, config.limit)?;
        let log = state.lock();
        match resolve(view, &log, now)? {
            Some(carried) => carried.check(config, now, n)?,
            None => log.check(config, now, n)?,
        }
        Ok(())
    }

    fn refund(view: &View<'_, LogConfig>, state: &LogCell, receipt: LogReceipt, n: u32) {
        let _ = view;
        let mut log = state.lock();
        // A carry-over in between changed what the slots mean: keep them.
        if log.tag == receipt.tag {
            log.refund(receipt.tickets, n);
        }
    }

    fn fork(view: &View<'_, LogConfig>, state: &LogCell, now: u64) -> Option<LogCell> {
        let log = state.lock();
        let forked = resolve(view, &log, now)
            .ok()?
            .unwrap_or_else(|| log.clone());
        Some(LogCell::new(forked))
    }

    fn snapshot(view: &View<'_, LogConfig>, state: &LogCell, now: u64) -> Option<Snapshot> {
        let log = state.lock();
        Some(match resolve(view, &log, now).ok()? {
            Some(carried) => carried.snapshot(view.current, now),
            None => log.snapshot(view.current, now),
        })
    }

    fn is_fresh(view: &View<'_, LogConfig>, state: &LogCell, now: u64) -> Option<bool> {
        let log = state.lock();
        Some(match resolve(view, &log, now).ok()? {
            Some(carried) => carried.is_fresh(view.current, now),
            None => log.is_fresh(view.current, now),
        })
    }

    fn settle(view: &View<'_, LogConfig>, state: &LogCell, now: u64) -> bool {
        let mut log = state.lock();
        match resolve(view, &log, now) {
            Ok(Some(carried)) => {
                *log = carried;
                true
            }
            Ok(None) => true,
            Err(_) => false,
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// The per-key header: 56 bytes of state and the lock, 64 in all.
    #[test]
    fn the_per_key_header_is_sixty_four_bytes() {
        assert_eq!(std::mem::size_of::<LogCell>(), 64);
    }

    /// A window just past 2^31 ns takes 2 ns units; at 2^31 ns, 1 ns.
    #[test]
    fn units_are_the_smallest_that_fit() {
        let at = |ns| LogConfig::new(Rate::new(1, Duration::from_nanos(ns))).unwrap();
        assert_eq!(at(1 << 31).resolution(), Duration::from_nanos(1));
        assert_eq!(at((1 << 31) + 1).resolution(), Duration::from_nanos(2));
        assert_eq!(at(1 << 62).resolution(), Duration::from_nanos(1 << 31));
    }
}
