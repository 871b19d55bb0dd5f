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
//! A [`LogConfig`] may hold several rules `(N_i, T_i)`, enforced from the
//! same ring (`N = max N_i` slots): a request is admitted iff, for every
//! rule, the entry `N_i − n + 1` back has left `T_i`; the retry-after is the
//! longest of the waits; the snapshot is the binding rule's (fewest left);
//! the unit, re-basing, freshness and carry-over follow the longest window.
//! Rule `i` reads only the newest `N_i` entries, and the entry an admission
//! overwrites (`N` back) is no newer than any rule's, so it had left every
//! window (`tests/keyed_rules.rs` checks all of it against a reference
//! model; `docs/keyed.md` has the tables).
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
//! | `clock` | the latest admission's stamp, in ns; no admission is stamped before it |
//! | `base` | the unit the offsets count from |
//! | `first_busy` | the first logged permit possibly still in the window (where an admission's report resumes its search) |
//! | `ring` | `N` offsets (`N` the largest count of the rules): `0` = empty, else the stamp `base + offset − 1` (units) |
//!
//! Stamps are in units of `2^k` ns, the smallest `k` for which the (longest)
//! window is at most `2^31` units: 1 ns for windows up to 2.1 s (exact to the nanosecond),
//! 32 ns for a minute, 65.5 µs for a day. A stamp is rounded *up* to its
//! unit, so a permit leaves the window no earlier than it really does: the
//! bound holds exactly at every window length, and a decision can be stricter
//! than the nanosecond log's by less than one unit. When a stamp no longer
//! fits in 32 bits past the base (after `2^32 − 2^31` units or more), the log
//! re-bases at `now − T`: entries at or before it have left the window for
//! every later reading and are restamped at the base, the others are
//! re-encoded. That is
//! `O(N)`, once per at least `2^31` units (2.1 s at 1 ns units).
//!
//! A stale reading (or a clock that stepped back) gets the direct log's
//! answer: it is checked as it is, which can only deny more, and an
//! admission is stamped at `max(reading, clock)`, so the stamps only grow
//! along the tickets. The bound holds over the readings themselves, as the
//! direct log's does (`tests/keyed.rs` runs both, and the twin, on readings
//! that jump back, decision for decision). What the log drops or rewrites
//! never loosens a stale reading's check: a re-base restamps the entries it
//! drops at the base rather than emptying them, and a refund restamps the
//! refunded slots where the direct log's rollback does (`now − T`, at or after
//! every entry they replaced), so both read as busy at least as long as what
//! they stand for, and as free from the refunded admission's reading on. In a
//! [`Keyed`](crate::keyed::Keyed) limiter every reading is first raised to
//! the keyed floor, as for every kind.
//!
//! [`SlidingLog`]: crate::SlidingLog

use std::fmt;
// std's `Arc`, not the sync facade's: the rules are immutable once built
// (nothing for loom to order), and loom's `Arc` cannot hold a slice.
use std::sync::Arc;
use std::time::Duration;

use super::{Carry, Keyable, Refusal, View, sealed::Sealed};
use crate::clock::Clock;
use crate::error::{ConfigError, Denied};
use crate::limiter::{Snapshot, check_request};
use crate::rate::Rate;
use crate::sliding_log::SlidingLog;
use crate::sync::{Mutex, MutexGuard};

/// Windows of at most this many units: the offsets of a window's stamps then
/// fit in 32 bits with room to spare before a re-base.
const WINDOW_UNITS: u64 = 1 << 31;

/// One rule of a [`LogConfig`]: at most `limit` permits in any window of
/// `window` ns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Rule {
    rate: Rate,
    limit: u32,
    window: u64,
}

/// The configuration of a keyed or tunable [`SlidingLog`]: one rule — at
/// most `N` permits in any window of length `T`, per key — or a set of
/// rules enforced at once from one log (`5` a second, `30` a minute and
/// `1,000` a day), validated once.
///
/// Per key: a ring of `N` 32-bit stamps, `N` the largest count of the set
/// (`4·N` bytes, allocated on the key's first admission and freed when the
/// key is evicted) plus a 64-byte header in the map's entry (about 96 bytes
/// per key with the key and the table's share).
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
///
/// # Several rules on one log
///
/// [`with_rule`](LogConfig::with_rule) adds a rule (or changes the rule of
/// the same window), [`without_rule`](LogConfig::without_rule) removes one.
/// A request for `n` is admitted only if every rule admits it; its
/// retry-after is the longest of the rules' waits; `n` above the smallest
/// rule's count is [`Denied::ExceedsCapacity`] with that count as the
/// capacity. Every rule holds exactly: at most `N_i` permits in any window
/// `[t, t + T_i)`. Reconfiguring a `Keyed` or `Tunable` to another set keeps
/// the recorded history (see [`Carry`]), so rules can be added, removed or
/// changed at runtime.
///
/// Stamps are in the unit the *longest* window needs
/// ([`resolution`](LogConfig::resolution)), rounded up, so a shorter rule
/// can decide up to one unit stricter than alone (65.5 µs with a day's rule)
/// and never looser. A snapshot reports the binding rule: the one with the
/// fewest permits left (on a tie, the one that takes longer to be full).
///
/// ```
/// use std::time::Duration;
/// use tollgate::keyed::{Carry, Keyed, LogConfig};
/// use tollgate::{Denied, ManualClock, Rate, SlidingLog};
///
/// let clock = ManualClock::new();
/// let rules = LogConfig::new(Rate::per_second(5))?.with_rule(Rate::per_minute(8))?;
/// let per_user = Keyed::<String, SlidingLog<ManualClock>>::with_clock(rules.clone(), clock.clone());
/// assert_eq!(
///     per_user.try_acquire_n("alice", 6),
///     Err(Denied::ExceedsCapacity { requested: 6, capacity: 5 }),
/// );
/// per_user.try_acquire_n("alice", 5)?;
/// clock.advance(Duration::from_secs(1));
/// per_user.try_acquire_n("alice", 3)?; // 8 this minute
/// // The second rule binds: the first of the 8 leaves the minute in 59 s.
/// assert_eq!(per_user.try_acquire("alice"), Err(Denied::RetryAfter(Duration::from_secs(59))));
///
/// // A runtime change keeps the history: 10 a minute leaves room for 2.
/// per_user.reconfigure(rules.with_rule(Rate::per_minute(10))?, Carry::Proportional);
/// per_user.try_acquire_n("alice", 2)?;
/// assert!(per_user.try_acquire("alice").is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// [`Denied::ExceedsCapacity`]: crate::Denied::ExceedsCapacity
/// [`Carry`]: crate::keyed::Carry
#[derive(Clone)]
pub struct LogConfig {
    /// Sorted by window, one per window.
    rules: Arc<[Rule]>,
    /// The ring's length: the largest count.
    slots: u32,
    /// The largest request: the smallest count.
    capacity: u32,
    /// The longest window, ns.
    longest: u64,
    /// Units are `2^shift` ns.
    shift: u32,
}

impl LogConfig {
    /// One rule: `rate.permits()` per window of `rate.period()`, with the
    /// errors of [`SlidingLog::new`].
    ///
    /// ```
    /// use tollgate::keyed::LogConfig;
    /// use tollgate::{ConfigError, Rate};
    /// assert!(LogConfig::new(Rate::per_hour(1_000)).is_ok());
    /// assert_eq!(LogConfig::new(Rate::per_second(0)).unwrap_err(), ConfigError::ZeroRate);
    /// ```
    pub fn new(rate: Rate) -> Result<Self, ConfigError> {
        Ok(Self::from_rules(vec![Self::rule(rate)?]))
    }

    /// This set with `rate` added as a rule — or, if a rule has the same
    /// window, in its place (two counts over one window would leave the larger
    /// one nothing to do). The errors are [`new`](LogConfig::new)'s.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::keyed::LogConfig;
    /// use tollgate::{ConfigError, Rate};
    ///
    /// let day = Duration::from_secs(86_400);
    /// let rules = LogConfig::new(Rate::per_second(5))?
    ///     .with_rule(Rate::per_minute(30))?
    ///     .with_rule(Rate::new(1_000, day))?;
    /// assert_eq!(rules.rules().count(), 3);
    /// assert_eq!(rules.limit(), 5); // the most one request can take
    /// assert_eq!(rules.slots(), 1_000); // the ring's length
    /// assert_eq!(rules.window(), day);
    ///
    /// // Same window: the rule is changed, not added.
    /// let changed = rules.with_rule(Rate::per_minute(60))?;
    /// assert_eq!(changed.rules().nth(1), Some(Rate::per_minute(60)));
    /// assert_eq!(rules.with_rule(Rate::per_minute(0)).unwrap_err(), ConfigError::ZeroRate);
    /// # Ok::<(), ConfigError>(())
    /// ```
    pub fn with_rule(&self, rate: Rate) -> Result<Self, ConfigError> {
        let rule = Self::rule(rate)?;
        let mut rules: Vec<Rule> = self
            .rules
            .iter()
            .filter(|r| r.window != rule.window)
            .copied()
            .collect();
        rules.push(rule);
        Ok(Self::from_rules(rules))
    }

    /// This set without the rule whose window is `window`; `None` if no rule
    /// has that window, or if it is the only rule (a log needs one).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::keyed::LogConfig;
    /// use tollgate::Rate;
    ///
    /// let rules = LogConfig::new(Rate::per_second(5))?.with_rule(Rate::per_minute(30))?;
    /// let minute = rules.without_rule(Duration::from_secs(1)).unwrap();
    /// assert_eq!(minute, LogConfig::new(Rate::per_minute(30))?);
    /// assert!(rules.without_rule(Duration::from_secs(3_600)).is_none());
    /// assert!(minute.without_rule(Duration::from_secs(60)).is_none());
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn without_rule(&self, window: Duration) -> Option<Self> {
        let rules: Vec<Rule> = self
            .rules
            .iter()
            .filter(|r| Duration::from_nanos(r.window) != window)
            .copied()
            .collect();
        (rules.len() < self.rules.len() && !rules.is_empty()).then(|| Self::from_rules(rules))
    }

    /// The rules, shortest window first.
    ///
    /// ```
    /// # use tollgate::{keyed::LogConfig, Rate};
    /// let rules = LogConfig::new(Rate::per_minute(30))?.with_rule(Rate::per_second(5))?;
    /// let rates: Vec<Rate> = rules.rules().collect();
    /// assert_eq!(rates, [Rate::per_second(5), Rate::per_minute(30)]);
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn rules(&self) -> impl ExactSizeIterator<Item = Rate> + '_ {
        self.rules.iter().map(|r| r.rate)
    }

    fn rule(rate: Rate) -> Result<Rule, ConfigError> {
        let (limit, window) = rate.validate()?;
        Ok(Rule {
            rate,
            limit,
            window,
        })
    }

    /// `rules` is not empty and has one rule per window.
    fn from_rules(mut rules: Vec<Rule>) -> Self {
        rules.sort_by_key(|r| r.window);
        let longest = rules.iter().map(|r| r.window).max().unwrap_or(1);
        let mut shift = 0;
        while longest.div_ceil(1 << shift) > WINDOW_UNITS {
            shift += 1;
        }
        LogConfig {
            slots: rules.iter().map(|r| r.limit).max().unwrap_or(1),
            capacity: rules.iter().map(|r| r.limit).min().unwrap_or(1),
            rules: rules.into(),
            longest,
            shift,
        }
    }

    /// Permits per window with one rule; with several, the smallest count:
    /// the most one request can be granted (a larger request is
    /// [`ExceedsCapacity`](crate::Denied::ExceedsCapacity)).
    ///
    /// ```
    /// # use tollgate::{keyed::LogConfig, Rate};
    /// assert_eq!(LogConfig::new(Rate::per_minute(30)).unwrap().limit(), 30);
    /// ```
    pub fn limit(&self) -> u32 {
        self.capacity
    }

    /// Stamps kept per key: the largest count of the rules (the ring's
    /// length, `4·slots` bytes per key).
    ///
    /// ```
    /// # use tollgate::{keyed::LogConfig, Rate};
    /// let rules = LogConfig::new(Rate::per_second(5))?.with_rule(Rate::per_hour(100))?;
    /// assert_eq!(rules.slots(), 100);
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn slots(&self) -> u32 {
        self.slots
    }

    /// The window's length; with several rules, the longest.
    ///
    /// ```
    /// # use tollgate::{keyed::LogConfig, Rate};
    /// assert_eq!(LogConfig::new(Rate::per_minute(30)).unwrap().window().as_secs(), 60);
    /// ```
    pub fn window(&self) -> Duration {
        Duration::from_nanos(self.longest)
    }

    /// The unit stamps are kept in (rounded up): 1 ns for windows up to
    /// 2^31 ns (2.1 s), then the smallest power of two of nanoseconds that
    /// makes the longest window at most 2^31 units. Every rule of a set
    /// shares it.
    ///
    /// ```
    /// use std::time::Duration;
    /// # use tollgate::{keyed::LogConfig, Rate};
    /// assert_eq!(LogConfig::new(Rate::per_second(10)).unwrap().resolution(), Duration::from_nanos(1));
    /// assert_eq!(LogConfig::new(Rate::per_minute(30)).unwrap().resolution(), Duration::from_nanos(32));
    /// let day = Rate::new(1_000, Duration::from_secs(86_400));
    /// assert_eq!(LogConfig::new(day).unwrap().resolution(), Duration::from_nanos(65_536));
    /// let both = LogConfig::new(Rate::per_second(10)).unwrap().with_rule(day).unwrap();
    /// assert_eq!(both.resolution(), Duration::from_nanos(65_536));
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
        self.rules == other.rules
    }
}

impl Eq for LogConfig {}

impl fmt::Debug for LogConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        struct Rules<'a>(&'a [Rule]);
        impl fmt::Debug for Rules<'_> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_list()
                    .entries(
                        self.0
                            .iter()
                            .map(|r| (r.limit, Duration::from_nanos(r.window))),
                    )
                    .finish()
            }
        }
        f.debug_struct("LogConfig")
            .field("rules", &Rules(&self.rules))
            .finish()
    }
}

/// One key's log (see the module's state table).
#[derive(Debug, Clone)]
struct Log {
    tag: u64,
    tickets: u64,
    /// The latest admission's stamp, exact ns; 0 before any.
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

    /// When the entry of `ticket` leaves a window of `window` ns (0 for no
    /// ticket — before the first — or an empty slot).
    fn free_at(&self, config: &LogConfig, ticket: Option<u64>, window: u64) -> u64 {
        ticket
            .and_then(|t| self.stamp(config, self.slot(t)))
            .map_or(0, |s| s + window)
    }

    /// When the entry `back` permits before the newest (`1` = the newest)
    /// leaves a window of `window` ns; 0 if there
    /// is no such entry or it is empty. `head` is `slot(tickets)`, computed
    /// once per decision: this is on every rule's path, and a division per
    /// rule and per search step was most of the cost of a multi-rule
    /// decision.
    fn back_free_at(&self, config: &LogConfig, head: usize, back: u64, window: u64) -> u64 {
        if back > self.tickets {
            return 0;
        }
        let len = self.ring.len();
        if back > len as u64 {
            // Only when a request decides under a configuration two back
            // (the one-bit tag's documented relaxation, `reconfig.rs`) whose
            // rule is longer than this ring: the slot then holds a newer
            // entry, which leaves no earlier (the direct modulo, as before).
            return self.free_at(config, Some(self.tickets - back), window);
        }
        // `head < len` and `1 <= back <= len`: one wrap at most.
        let mut i = head + len - back as usize;
        if i >= len {
            i -= len;
        }
        self.stamp(config, i).map_or(0, |s| s + window)
    }

    /// How far back from the newest the entry is that rule `rule` must see
    /// gone before `n` more permits: `N_i − n + 1` (within the ring's last
    /// `slots >= N_i` entries).
    fn pivot(rule: &Rule, n: u64) -> u64 {
        u64::from(rule.limit) + 1 - n
    }

    fn slot(&self, ticket: u64) -> usize {
        (ticket % self.ring.len() as u64) as usize
    }

    /// The time an admission at `now` is stamped at: never before the latest
    /// admission's, so the stamps only grow along the tickets (the direct
    /// log's rule: the newest entry is the floor of a new stamp).
    fn time(&self, now: u64) -> u64 {
        now.max(self.clock)
    }

    /// `Ok(())` if every rule has `n` permits free at `now`, else the denial
    /// with the longest wait: each rule admits once its own wait is over and
    /// keeps admitting as time passes, so after the longest all do. A reading
    /// older than the newest stamp is checked as it is, as the direct log
    /// checks it: it can only be denied more.
    fn check(&self, config: &LogConfig, now: u64, n: u32) -> Result<(), Denied> {
        if self.ring.is_empty() {
            return Ok(());
        }
        let at = now;
        let head = self.slot(self.tickets);
        let mut until = 0;
        for rule in config.rules.iter() {
            // Stamps do not decrease along the tickets, so if this entry has
            // left the rule's window, all older ones have.
            let free_at =
                self.back_free_at(config, head, Self::pivot(rule, u64::from(n)), rule.window);
            if free_at > at {
                until = until.max(free_at);
            }
        }
        if until == 0 {
            Ok(())
        } else {
            // `until > at = now`; the same request at the reading plus
            // this wait finds every rule's entry gone, if nothing else was
            // admitted.
            Err(Denied::RetryAfter(Duration::from_nanos(until - now)))
        }
    }

    /// Logs `n` permits at `now`, after a successful [`check`](Log::check).
    ///
    /// The entries overwritten (`slots` back) are no newer than any rule's
    /// pivot (`N_i <= slots`), so they had left every rule's window.
    fn admit(&mut self, config: &LogConfig, now: u64, n: u32) {
        if self.ring.is_empty() {
            self.ring = vec![0; config.slots as usize].into_boxed_slice();
        }
        let at = self.time(now);
        // Rounded up: a permit leaves every window no earlier than it
        // should. Monotone: never before the latest stamp.
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

    /// Moves the base to the longest window's start before `stamp` (units):
    /// entries at or before it are restamped at the base itself, where they
    /// are free for every rule at every reading from `stamp − 1` units on,
    /// and later than they were, so a staler reading (checked as it is) can
    /// only be denied more than before; the rest are re-encoded.
    fn rebase(&mut self, config: &LogConfig, stamp: u64) {
        let window = config.units(config.longest);
        let base = stamp.saturating_sub(window + 1);
        for offset in self.ring.iter_mut().filter(|o| **o != 0) {
            let units = self.base + u64::from(*offset) - 1;
            *offset = if units <= base {
                1
            } else {
                // `base < units <= stamp <= base + window + 1 < base + 2^32 − 1`.
                (units - base + 1) as u32
            };
        }
        self.base = base;
    }

    /// The binding rule's figures at `now`: each rule's available permits
    /// (the largest `n` its pivot admits, by binary search: free entries are
    /// the oldest) and time until its newest entry leaves; the rule that
    /// binds first ([`Snapshot::binds_before`]: the fewest available, on a
    /// tie the longer wait, then the earlier rule) is reported. Its
    /// `available` is the largest request every rule admits.
    fn snapshot(&self, config: &LogConfig, now: u64) -> Snapshot {
        if self.ring.is_empty() {
            return Snapshot::from_ns(config.capacity, config.capacity, 0);
        }
        // As `check` reads it: a stale reading as it is.
        let at = now;
        let head = self.slot(self.tickets);
        let mut binding: Option<Snapshot> = None;
        for rule in config.rules.iter() {
            let (mut lo, mut hi) = (0u64, u64::from(rule.limit));
            while lo < hi {
                let mid = lo + (hi - lo) / 2;
                let back = Self::pivot(rule, mid + 1);
                if self.back_free_at(config, head, back, rule.window) <= at {
                    lo = mid + 1;
                } else {
                    hi = mid;
                }
            }
            let newest = self.back_free_at(config, head, 1, rule.window);
            let until = newest.saturating_sub(now);
            // `lo <= rule.limit`, a u32: the cast is lossless.
            let this = Snapshot::from_ns(lo as u32, rule.limit, until);
            binding = Some(binding.map_or(this, |first| first.tightest(this)));
        }
        // Some: a configuration has at least one rule.
        binding.unwrap_or(Snapshot::from_ns(0, 0, 0))
    }

    /// The snapshot an admission at `now` left. With one rule and a reading
    /// not older than the newest stamp, amortised O(1): the free run from the
    /// head ends at the first entry still in the window, and that only moves
    /// forward (such readings do not go back, and a refund restamps entries
    /// so that they are free at every such reading), so the search resumes
    /// where the previous one stopped. Otherwise [`snapshot`]'s search per
    /// rule (`O(rules · log N)`), which leaves the resume point alone.
    ///
    /// [`snapshot`]: Log::snapshot
    fn report(&mut self, config: &LogConfig, now: u64) -> Snapshot {
        let [rule] = &*config.rules else {
            return self.snapshot(config, now);
        };
        if now < self.clock {
            // A stale reading: the free run at `now` may end before the
            // resume point, which is for the latest admission's time.
            return self.snapshot(config, now);
        }
        let at = now;
        let len = self.ring.len() as u64;
        let oldest = self.tickets.saturating_sub(len);
        let mut busy = self.first_busy.clamp(oldest, self.tickets);
        while busy < self.tickets && self.free_at(config, Some(busy), rule.window) <= at {
            busy += 1;
        }
        self.first_busy = busy;
        // Tickets before `oldest` are slots never written in this ring: free.
        let available = busy - oldest + (len - (self.tickets - oldest));
        let newest = self.free_at(config, self.tickets.checked_sub(1), rule.window);
        Snapshot::from_ns(available as u32, rule.limit, newest.saturating_sub(now))
    }

    /// Exactly a new log's decisions at `now` and every later reading: every
    /// entry has left the longest window (the newest is stamped at most
    /// `clock` rounded up to the unit), and `clock <= now`, so no admission
    /// from then on is stamped later than its reading, as a new log's is
    /// not. (A keyed limiter decides no reading below the floor this is
    /// judged at.)
    fn is_fresh(&self, config: &LogConfig, now: u64) -> bool {
        self.ring.is_empty() || config.ns(config.units(self.clock)) + config.longest <= now
    }

    /// This log, written under `from`, carried over to `to` at `now`.
    ///
    /// The log keeps its history: `Proportional` and `Additive` both keep
    /// the stamps still inside the longest window in force *and* inside the
    /// new longest window (the newest `slots'` of them), re-encoded in the
    /// new unit (rounded up); `Reset` empties it. Stamps already outside the
    /// old longest window are dropped even if the new one is longer: a key
    /// whose log held only those was fresh, may have been evicted, and must
    /// decide the same either way. A set of rules changed to another keeps
    /// one history, which every new rule reads.
    fn carried(&self, from: &LogConfig, to: &LogConfig, now: u64, carry: Carry) -> Log {
        let mut log = Log::empty(self.tag);
        if carry == Carry::Reset || self.ring.is_empty() {
            return log;
        }
        let at = self.time(now);
        let window = from.longest.min(to.longest);
        let len = self.ring.len() as u64;
        // Busy at `now` as it is (a stale reading keeps more, never fewer).
        let kept: Vec<u64> = (self.tickets..self.tickets + len)
            .filter_map(|t| self.stamp(from, self.slot(t)))
            .filter(|&s| s + window > now)
            .collect();
        let kept = &kept[kept.len().saturating_sub(to.slots as usize)..];
        if kept.is_empty() {
            return log;
        }
        log.ring = vec![0; to.slots as usize].into_boxed_slice();
        log.clock = self.clock;
        log.base = to.units(at).saturating_sub(to.units(to.longest) + 1);
        // Oldest first from slot 0; the head is just after the newest.
        for (i, &stamp) in kept.iter().enumerate() {
            // Offset 1 is a stamp at the base itself (0 is empty), so a
            // stamp at 0 with the base saturated at 0 keeps its value: moving
            // it a unit later would be safe but stricter than the log it was.
            let units = to.units(stamp).max(log.base);
            log.ring[i] = (units - log.base + 1) as u32;
        }
        log.tickets = kept.len() as u64;
        log
    }

    /// The stamp (units) that a refund of an admission checked at `now`
    /// restamps its slots at: `now − T` for the longest window `T`, rounded
    /// down; `None` before time `T`. The entries the admission replaced are
    /// older than the longest rule's pivot, which had left its window at
    /// `now`, so their (rounded-up) stamps were no later than this.
    fn restamp(config: &LogConfig, now: u64) -> Option<u64> {
        now.checked_sub(config.longest).map(|t| t >> config.shift)
    }

    /// Takes back the `n` permits of the admission that left `tickets`, if
    /// it is still the latest, restamping its slots at `restamp`
    /// ([`Log::restamp`] of the admission's reading, the direct log's
    /// rollback), or emptying them if nothing can be that old — which is what
    /// they held. Every reading from the admission's on then decides as if
    /// it had never happened, and a staler one (checked as it is) no more
    /// loosely: never over-admission.
    fn refund(&mut self, tickets: u64, restamp: Option<u64>, n: u32) -> bool {
        if self.tickets != tickets || self.ring.is_empty() {
            return false;
        }
        let offset = match restamp {
            // The base is at most the stamp the admission wrote, so this fits.
            Some(units) if units >= self.base => (units - self.base + 1) as u32,
            // Older than the base or than time itself: the replaced slots
            // were empty (an entry is never older than the base).
            _ => 0,
        };
        for ticket in tickets - u64::from(n)..tickets {
            let i = self.slot(ticket);
            self.ring[i] = offset;
        }
        self.tickets -= u64::from(n);
        true
    }
}

/// A key's log under its own mutex (a loom mutex under `--cfg loom`, so the
/// models see every lock).
#[doc(hidden)]
#[allow(unreachable_pub)] // sealed: public only as `Keyable::State`
pub struct LogCell(Mutex<Log>);

impl LogCell {
    fn new(log: Log) -> Self {
        LogCell(Mutex::new(log))
    }

    fn lock(&self) -> MutexGuard<'_, Log> {
        self.0.lock()
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
    /// Where a refund restamps the admission's slots ([`Log::restamp`]).
    restamp: Option<u64>,
    after: Snapshot,
}

impl<C: Clock> Sealed for SlidingLog<C> {}

impl<C: Clock> Keyable for SlidingLog<C> {
    type Config = LogConfig;
    type Clock = C;
    type State = LogCell;
    type Receipt = LogReceipt;

    fn capacity(config: &LogConfig) -> u32 {
        config.capacity
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
        check_request(n, config.capacity)?;
        let mut log = state.lock();
        if let Some(carried) = resolve(view, &log, now)? {
            *log = carried;
        }
        log.check(config, now, n)?;
        log.admit(config, now, n);
        Ok(LogReceipt {
            tickets: log.tickets,
            tag: log.tag,
            restamp: Log::restamp(config, now),
            after: log.report(config, now),
        })
    }

    fn admitted(_view: &View<'_, LogConfig>, receipt: LogReceipt, _now: u64) -> Snapshot {
        receipt.after
    }

    fn peek(view: &View<'_, LogConfig>, state: &LogCell, now: u64, n: u32) -> Result<(), Refusal> {
        let config = view.current;
        check_request(n, config.capacity)?;
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
            log.refund(receipt.tickets, receipt.restamp, n);
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

    fn two_per_100ns() -> LogConfig {
        LogConfig::new(Rate::new(2, Duration::from_nanos(100))).unwrap()
    }

    /// A refunded admission's slots free up at its own reading and later,
    /// and a staler reading — checked as it is — is denied at least as
    /// long as without the admission: restamping where the direct log
    /// rolls back, not emptying (which would admit a third permit in
    /// `[0, 100)` here).
    #[test]
    fn a_refund_leaves_a_stale_reading_no_looser() {
        let config = two_per_100ns();
        let mut log = Log::empty(0);
        for at in [0, 50] {
            log.check(&config, at, 1).unwrap();
            log.admit(&config, at, 1);
        }
        // At 150 the entry at 0 has left the window: admitted, then refunded.
        log.check(&config, 150, 1).unwrap();
        log.admit(&config, 150, 1);
        assert!(log.refund(log.tickets, Log::restamp(&config, 150), 1));
        assert_eq!(log.check(&config, 150, 1), Ok(()));
        // Without the admission a reading of 90 waits 10 ns for the entry at
        // 0; the restamped slot (at 50) makes it wait longer, never less.
        let Err(Denied::RetryAfter(wait)) = log.check(&config, 90, 1) else {
            panic!("a stale reading admitted after a refund");
        };
        assert!(wait >= Duration::from_nanos(10));
    }

    /// Re-basing keeps entries older than the new base at the base, so a
    /// reading older than them is still denied (the direct log, which keeps
    /// every stamp, denies it too) where an emptied slot would admit it.
    #[test]
    fn re_basing_leaves_a_stale_reading_no_looser() {
        let config = two_per_100ns();
        let mut log = Log::empty(0);
        log.check(&config, 0, 1).unwrap();
        log.admit(&config, 0, 1);
        let late = (1 << 32) + 10;
        log.check(&config, late, 1).unwrap();
        log.admit(&config, late, 1);
        assert!(log.base > 0, "the second stamp re-based the log");
        // The entry at 0 is the pivot for a reading of 50: busy until 100.
        let Err(Denied::RetryAfter(wait)) = log.check(&config, 50, 1) else {
            panic!("a stale reading admitted after a re-base");
        };
        assert!(wait >= Duration::from_nanos(50));
        // Every reading from the re-base on finds it gone.
        assert_eq!(log.check(&config, late + 100, 1), Ok(()));
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
