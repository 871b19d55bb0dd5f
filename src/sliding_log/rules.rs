//! A sliding log's rules: one — at most `N` permits in any window of length
//! `T` — or several enforced at once from one log.

use std::fmt;
// std's `Arc`, not the sync facade's: the rules are immutable once built
// (nothing for loom to order), and loom's `Arc` cannot hold a slice.
use std::sync::Arc;
use std::time::Duration;

use crate::error::ConfigError;
use crate::rate::Rate;
#[cfg(doc)]
use crate::sliding_log::SlidingLog;

/// One rule of a [`LogConfig`]: at most `limit` permits in any window of
/// `window` ns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Rule {
    rate: Rate,
    limit: u32,
    window: u64,
}

/// The rules of a [`SlidingLog`]: one rule — at most `N` permits in any
/// window of length `T` — or a set of rules enforced at once from one log
/// (`5` a second, `30` a minute and `1,000` a day), validated once. The
/// configuration of a per-key or tunable log, and what
/// [`SlidingLog::reconfigure_rules`] takes.
///
/// Per key: a lock-free ring of `N` 64-bit entries, `N` the largest count of
/// the set (`8·N` bytes and a 40-byte header, allocated on the key's first
/// admission and freed when the key is evicted), behind an 8-byte pointer in
/// the map's entry. Stamps are exact to the nanosecond.
///
/// ```
/// use std::time::Duration;
/// use tollgate::keyed::Keyed;
/// use tollgate::LogConfig;
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
/// A snapshot reports the binding rule: the one with the fewest permits
/// left (on a tie, the one that takes longer to be full).
///
/// ```
/// use std::time::Duration;
/// use tollgate::keyed::{Carry, Keyed};
/// use tollgate::LogConfig;
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
    /// Each rule as `(count, window in ns)`, in `rules`' order: what a
    /// decision reads.
    pairs: Arc<[(u32, u64)]>,
}

impl LogConfig {
    /// One rule: `rate.permits()` per window of `rate.period()`, with the
    /// errors of [`SlidingLog::new`].
    ///
    /// ```
    /// use tollgate::LogConfig;
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
    /// use tollgate::LogConfig;
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
    /// use tollgate::LogConfig;
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
    /// # use tollgate::{LogConfig, Rate};
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
        LogConfig {
            pairs: rules.iter().map(|r| (r.limit, r.window)).collect(),
            slots: rules.iter().map(|r| r.limit).max().unwrap_or(1),
            capacity: rules.iter().map(|r| r.limit).min().unwrap_or(1),
            rules: rules.into(),
            longest,
        }
    }

    /// Permits per window with one rule; with several, the smallest count:
    /// the most one request can be granted (a larger request is
    /// [`ExceedsCapacity`](crate::Denied::ExceedsCapacity)).
    ///
    /// ```
    /// # use tollgate::{LogConfig, Rate};
    /// assert_eq!(LogConfig::new(Rate::per_minute(30)).unwrap().limit(), 30);
    /// ```
    pub fn limit(&self) -> u32 {
        self.capacity
    }

    /// Stamps kept per key, or by a direct log: the largest count of the
    /// rules (the ring's length, `8·slots` bytes).
    ///
    /// ```
    /// # use tollgate::{LogConfig, Rate};
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
    /// # use tollgate::{LogConfig, Rate};
    /// assert_eq!(LogConfig::new(Rate::per_minute(30)).unwrap().window().as_secs(), 60);
    /// ```
    pub fn window(&self) -> Duration {
        Duration::from_nanos(self.longest)
    }

    /// Each rule as `(count, window in ns)`, shortest window first.
    pub(crate) fn pairs(&self) -> &[(u32, u64)] {
        &self.pairs
    }

    /// The longest window, ns.
    pub(crate) fn longest_ns(&self) -> u64 {
        self.longest
    }

    /// Whether the set has more than one rule.
    pub(crate) fn is_several(&self) -> bool {
        self.pairs.len() > 1
    }

    /// The window of the ring's slots' chain: a ticket replaces the entry
    /// `slots` tickets back, which the rules with the largest count require
    /// to have left their windows, the longest of which bounds how far apart
    /// a slot's stamps are.
    pub(crate) fn slot_window(&self) -> u64 {
        self.pairs
            .iter()
            .filter(|&&(count, _)| count == self.slots)
            .map(|&(_, window)| window)
            .max()
            .unwrap_or(self.longest)
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
