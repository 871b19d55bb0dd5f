//! The exact sliding log as a keyed kind: one lock-free ring per key.
//!
//! A key's log is the direct [`SlidingLog`]'s ring — the same entry words,
//! tickets, claims and proofs (`sliding_log/log.rs`, `sliding_log/ring.rs`)
//! — one ring per key without stripes, allocated on the key's first
//! admission: `8·N` bytes of slots and a 40-byte header, behind an
//! 8-byte epoch-protected pointer in the map's entry. A request for `n`
//! permits is admitted iff, for every rule `(N_i, T_i)` of its
//! [`LogConfig`] and every ticket `k` it takes, the entry of ticket `k − N_i`
//! has left `T_i` ([`Geometry::decide_rules`]): at most `N_i` permits in any
//! window `[t, t + T_i)` per key, decision for decision with the direct log
//! with one rule (property tests in `tests/keyed.rs`; several rules against a
//! reference model in `tests/keyed_rules.rs`). The ring holds `N = max N_i`
//! slots, so every rule's entry is still there.
//!
//! # State
//!
//! | where | what |
//! |---|---|
//! | the map's entry | a pointer to the key's current ring (epoch-protected) |
//! | ring header | the tag the ring was written under; the head (next ticket, and the sealed bit) |
//! | ring slots | `N` entry words: `stamp << 1 \| lap bit`, as the direct log's |
//!
//! | operation | reads | writes |
//! |---|---|---|
//! | admit | the pointer, the head, `n` entries per rule, the newest entry | head by CAS, then `n` entries (the direct log's claim) |
//! | deny | the pointer, the head, the entries up to the blocking one | nothing |
//! | first admission | the pointer | a new ring, published by CAS on the pointer |
//! | refund, if still the latest | the pointer, the head | seal (CAS at the admission's head), a copy with the head moved back, published by CAS |
//! | carry-over (new tag) | the pointer, every entry (sealed) | a new ring of the kept stamps, published by CAS |
//!
//! A ring is never changed behind a decision: anything that moves the head
//! back or changes the configuration seals the ring (claims fail from then
//! on), copies it and publishes the copy, so a decision made on the old ring
//! either completed before the seal or fails and decides again on the new
//! one. Requests that meet a sealed ring wait for the copy (`O(N)`); nothing
//! else waits. A refund tells its admission's ring by address, head and
//! newest stamp (`KeyRing::holds`).
//!
//! Stale readings are decided as the direct log decides them: checked as
//! they are, which can only deny more; the keyed layer's time floor keeps a
//! reading from going below the floor.
//!
//! [`SlidingLog`]: crate::SlidingLog
//! [`Geometry::decide_rules`]: crate::sliding_log::log::Geometry

use std::fmt;
// std's `Arc`, not the sync facade's: the rules are immutable once built
// (nothing for loom to order), and loom's `Arc` cannot hold a slice.
use std::sync::Arc;
use std::time::Duration;

use super::{Carry, Keyable, Refusal, View, sealed::Sealed};
use crate::clock::Clock;
use crate::error::ConfigError;
use crate::limiter::{Snapshot, check_request};
use crate::rate::Rate;
use crate::sliding_log::SlidingLog;
use crate::sliding_log::log::{
    EMPTY, Entries, Entry, Geometry, RulesVerdict, SEALED, entry_word, retry_after,
};
use crate::sliding_log::ring::{Settled, View as RingView, stamp_entry};
use crate::sync::{AtomicU64, Backoff, Guard, Mutex, Ordering, Shared, pin};

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
/// Per key: a lock-free ring of `N` 64-bit entries, `N` the largest count of
/// the set (`8·N` bytes and a 40-byte header, allocated on the key's first
/// admission and freed when the key is evicted), behind an 8-byte pointer in
/// the map's entry. Stamps are exact to the nanosecond.
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
/// A snapshot reports the binding rule: the one with the fewest permits
/// left (on a tie, the one that takes longer to be full).
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
    /// Each rule as `(count, window in ns)`, in `rules`' order: what a
    /// decision reads.
    pairs: Arc<[(u32, u64)]>,
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

/// One key's ring: the tag it was written under, the head of its tickets and
/// its entry words, laid out as the direct log's rings are
/// ([`Geometry`] with the ring's length as its capacity). A ring with no
/// slots is a key that has admitted nothing yet.
struct KeyRing {
    tag: u64,
    /// The next ticket, `(lap << shift) | index`, plus [`SEALED`].
    head: AtomicU64,
    /// Entry words, `(stamp << 1) | lap_bit(lap)`; zero = never written.
    slots: Box<[AtomicU64]>,
    /// Held by whoever seals the ring, until its successor is published (or
    /// a refund finds its admission gone and unseals): requests that meet
    /// the sealed ring wait on it rather than spin. No claim takes it.
    replacing: Mutex<()>,
}

/// Tickets one admission took: enough to take them back.
#[derive(Debug, Clone, Copy)]
struct Claimed {
    before: u64,
    after: u64,
    /// An upper bound on the stamps of the entries the tickets overwrote.
    replaced: u64,
    /// The tickets' stamp.
    stamp: u64,
}

/// The ring was sealed: a refund or a carry-over is replacing it.
#[derive(Debug, Clone, Copy)]
struct Replacing;

impl KeyRing {
    fn fresh(tag: u64) -> Self {
        KeyRing {
            tag,
            head: AtomicU64::new(0),
            slots: Box::new([]),
            replacing: Mutex::new(()),
        }
    }

    /// A ring of `slots` slots whose first tickets hold `stamps`, oldest
    /// first (at most `slots` of them), its head just past them.
    fn with_stamps(tag: u64, slots: u32, stamps: &[u64]) -> Self {
        let words: Box<[AtomicU64]> = (0..slots as usize)
            .map(|i| AtomicU64::new(stamps.get(i).map_or(EMPTY, |&s| entry_word(s, 0))))
            .collect();
        let head = Geometry::from_parts(slots, 1, false)
            .advance(0, stamps.len() as u32)
            .expect("one lap of tickets always fits");
        KeyRing {
            tag,
            head: AtomicU64::new(head),
            slots: words,
            replacing: Mutex::new(()),
        }
    }

    /// The ticket layout of this ring (`window` only for the time range's
    /// end); the ring has slots.
    #[inline]
    fn geometry(&self, window: u64) -> Geometry {
        Geometry::from_parts(self.slots.len() as u32, window, false)
    }

    #[inline]
    fn view(&self, head: u64) -> RingView<'_> {
        RingView::new(&self.head, &self.slots, head)
    }

    /// The head, for a decision to be made on; `Err` once sealed.
    #[inline]
    fn head(&self) -> Result<u64, Replacing> {
        // Acquire: as the direct log's (`AtomicRing::head`): pairs with the
        // Release of the CAS that wrote this head and, through the release
        // sequence of the head's RMWs, of every earlier claim, whose claimers
        // read the entries their tickets replace before claiming; so no slot
        // can show us a lap older than the one before the expected one.
        let head = self.head.load(Ordering::Acquire);
        if head & SEALED != 0 {
            Err(Replacing)
        } else {
            Ok(head)
        }
    }

    /// Whether a replacement has sealed this ring.
    #[inline]
    fn is_sealed(&self) -> bool {
        // Acquire: pairs with the seal's Release, so the sealer's taking of
        // `replacing` (before its seal) happens before our `wait_out`: we
        // wait on the lock it holds, never slip in ahead of it.
        self.head.load(Ordering::Acquire) & SEALED != 0
    }

    /// Waits until whoever sealed this ring (seen sealed, by `is_sealed` or
    /// a claim's Acquire head load) has published its successor or unsealed
    /// it.
    #[cold]
    fn wait_out(&self) {
        drop(self.replacing.lock());
    }

    /// Decides `n` permits at `now` under `config` and claims them if every
    /// rule admits them: `Ok(Err(retry_ns))` if denied (nothing written).
    fn claim(
        &self,
        config: &LogConfig,
        now: u64,
        n: u32,
    ) -> Result<Result<Claimed, u64>, Replacing> {
        let geometry = self.geometry(config.longest);
        let mut backoff = Backoff::new();
        loop {
            let head = self.head()?;
            let (next, stamp, replaced) =
                match geometry.decide_rules(&self.view(head), head, now, n, &config.pairs) {
                    RulesVerdict::Moved => {
                        backoff.wait();
                        continue;
                    }
                    RulesVerdict::Deny { retry_ns } => return Ok(Err(retry_ns)),
                    RulesVerdict::Admit {
                        next,
                        stamp,
                        replaced,
                    } => (next, stamp, replaced),
                };
            // Release, Relaxed on failure, weak, and a sealed head failing
            // the CAS: as the direct log's claim (`AtomicRing::claim_noting`):
            // the claim carries our entry reads to later claimers and to the
            // sealer.
            if self
                .head
                .compare_exchange_weak(head, next, Ordering::Release, Ordering::Relaxed)
                .is_ok()
            {
                for (lap, i) in geometry.tickets(head, n) {
                    // Release: pairs with the readers' Acquire (`View::read`).
                    stamp_entry(&self.slots[i], entry_word(stamp, lap), Ordering::Release);
                }
                return Ok(Ok(Claimed {
                    before: head,
                    after: next,
                    replaced,
                    stamp,
                }));
            }
            backoff.wait();
        }
    }

    /// What `n` permits at `now` would get under `config`, writing nothing:
    /// `Ok(Err(retry_ns))` if denied.
    fn check(&self, config: &LogConfig, now: u64, n: u32) -> Result<Result<(), u64>, Replacing> {
        if self.slots.is_empty() {
            return Ok(Ok(()));
        }
        let geometry = self.geometry(config.longest);
        let mut backoff = Backoff::new();
        loop {
            let head = self.head()?;
            match geometry.decide_rules(&self.view(head), head, now, n, &config.pairs) {
                RulesVerdict::Moved => backoff.wait(),
                RulesVerdict::Deny { retry_ns } => return Ok(Err(retry_ns)),
                RulesVerdict::Admit { .. } => return Ok(Ok(())),
            }
        }
    }

    /// Seals the ring for a replacement, `replacing` held: no ticket can be
    /// claimed after this returns `true`, which it does for one caller only.
    fn seal(&self) -> bool {
        // AcqRel: Acquire so that the claims before the seal, and through
        // them the entry reads their claimers made, happen before the copy's
        // reads (as the direct log's `seal`); Release so that a request that
        // sees the seal (Acquire) sees `replacing` taken (`is_sealed`).
        self.head.fetch_or(SEALED, Ordering::AcqRel) & SEALED == 0
    }

    /// Seals the ring only if its head is still `head` (`replacing` held):
    /// a refund's "is our admission still the latest?". AcqRel on success
    /// as `seal`; Relaxed on failure: nothing is read on its strength.
    fn seal_at(&self, head: u64) -> bool {
        self.head
            .compare_exchange(head, head | SEALED, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    }

    /// Whether this ring, sealed at `claimed.after` by [`seal_at`], holds
    /// that admission as its newest: the newest entry is its stamp. A ring
    /// at the admission's old address with the same head is another's only
    /// if the key was evicted in between (rings replaced by a refund or a
    /// carry-over outlive every pinned caller), and eviction needs every
    /// entry a window old at the time floor, below which no later decision
    /// stamps: so that ring's newest stamp is later than ours.
    ///
    /// [`seal_at`]: Self::seal_at
    fn holds(&self, claimed: &Claimed) -> bool {
        if self.slots.is_empty() {
            return false;
        }
        let geometry = self.geometry(1);
        let Some((lap, index)) = geometry.before(claimed.after, 1).next() else {
            return false;
        };
        // Waits if in flight: the seal ordered every claim before us.
        Settled(&self.slots).read(index, lap) == Entry::Stamp(claimed.stamp)
    }

    /// Undoes a [`seal_at`](Self::seal_at) whose ring turned out not to be
    /// the one wanted: nothing was changed.
    fn unseal(&self, head: u64) {
        // Release: the sealer acquired every claim before the seal; this
        // store passes them on to the next head loads (a plain store ends
        // the head's release sequence, so it must head its own).
        self.head.store(head, Ordering::Release);
    }

    /// The sealed ring's stamps, oldest first: every logged ticket's, each
    /// waited for if its claimer has not stored it yet.
    fn sealed_stamps(&self, window: u64) -> Vec<u64> {
        if self.slots.is_empty() {
            return Vec::new();
        }
        // Relaxed: the seal's Acquire ordered every claim before this.
        let head = self.head.load(Ordering::Relaxed) & !SEALED;
        let geometry = self.geometry(window);
        let settled = Settled(&self.slots);
        geometry
            .before(head, geometry.logged(head))
            .filter_map(|(lap, index)| match settled.read(index, lap) {
                Entry::Stamp(stamp) => Some(stamp),
                _ => None,
            })
            .collect()
    }

    /// The stamps of a ring in use, oldest first, as of one head: retried
    /// while an entry is in flight or the head moves; `Err` once sealed.
    fn live_stamps(&self, window: u64) -> Result<Vec<u64>, Replacing> {
        if self.slots.is_empty() {
            return Ok(Vec::new());
        }
        let geometry = self.geometry(window);
        let mut backoff = Backoff::new();
        'read: loop {
            let head = self.head()?;
            let view = self.view(head);
            let mut stamps = Vec::with_capacity(self.slots.len());
            for (lap, index) in geometry.before(head, geometry.logged(head)) {
                match view.read(index, lap) {
                    Entry::Stamp(stamp) => stamps.push(stamp),
                    Entry::Pending | Entry::Moved => {
                        // A claimer between its claim and its store, or a
                        // newer head: read again once it has run.
                        backoff.pause();
                        continue 'read;
                    }
                }
            }
            return Ok(stamps);
        }
    }

    /// The ring a refund leaves: this sealed ring with its head back at the
    /// refunded admission's first ticket and the entries its tickets
    /// overwrote written back, each as the latest stamp among them (an
    /// upper bound on each: stricter, never looser, and exact for every
    /// reading from the refunded admission's on, at which all of them had
    /// left the window) — or empty where the ticket overwrote nothing.
    fn refunded(&self, claimed: &Claimed, n: u32) -> KeyRing {
        let geometry = self.geometry(1);
        let after = claimed.after;
        let settled = Settled(&self.slots);
        // Every slot as the latest ticket below `after` left it, waited for
        // if still in flight (the seal ordered every claim before us).
        let (lap, head_index) = (geometry.lap(after), geometry.index(after));
        let words: Box<[AtomicU64]> = (0..self.slots.len())
            .map(|i| {
                let latest = if i < head_index {
                    Some(lap)
                } else {
                    lap.checked_sub(1)
                };
                AtomicU64::new(match latest {
                    Some(lap) => match settled.read(i, lap) {
                        Entry::Stamp(stamp) => entry_word(stamp, lap),
                        _ => EMPTY,
                    },
                    None => EMPTY,
                })
            })
            .collect();
        let ring = KeyRing {
            tag: self.tag,
            head: AtomicU64::new(claimed.before),
            slots: words,
            replacing: Mutex::new(()),
        };
        for (lap, i) in geometry.tickets(claimed.before, n) {
            let word = match lap.checked_sub(1) {
                Some(lap) => entry_word(claimed.replaced, lap),
                None => EMPTY,
            };
            // Relaxed: the ring is not published yet; its publication (a
            // Release CAS on the cell) carries every word.
            ring.slots[i].store(word, Ordering::Relaxed);
        }
        ring
    }

    /// What this ring reports under `config` at `now` on the head `head`:
    /// the rule that binds first ([`Snapshot::binds_before`]: the fewest
    /// permits left, on a tie the longer wait, then the earlier rule), with
    /// its count and the time until the newest entry leaves its window.
    fn snapshot(&self, config: &LogConfig, head: u64, now: u64) -> Snapshot {
        if self.slots.is_empty() {
            return Snapshot::from_ns(config.capacity, config.capacity, 0);
        }
        let geometry = self.geometry(config.longest);
        let view = self.view(head);
        let newest = geometry.newest_stamp(&view, head, now);
        let mut binding: Option<Snapshot> = None;
        for &(count, window) in config.pairs.iter() {
            // At most `count`: the least of them is at most the capacity.
            let available = geometry.rule_available(&view, head, now, (count, window));
            let until = newest.map_or(0, |s| (s + window).saturating_sub(now));
            let this = Snapshot::from_ns(available, count, until);
            binding = Some(binding.map_or(this, |first| first.tightest(this)));
        }
        // Some: a configuration has at least one rule.
        binding.unwrap_or(Snapshot::from_ns(0, 0, 0))
    }

    /// Exactly a new ring's decisions at `now` and later: every entry has
    /// left the longest window. The newest entry is checked first (stamps
    /// grow along the tickets unless concurrent readings were out of order,
    /// so it nearly always answers "no" alone); a "yes" is confirmed on every
    /// entry. An entry in flight is not fresh.
    fn is_fresh(&self, config: &LogConfig, now: u64) -> Result<bool, Replacing> {
        if self.slots.is_empty() {
            return Ok(true);
        }
        let head = self.head()?;
        let geometry = self.geometry(config.longest);
        let view = self.view(head);
        let gone = |stamp: u64| stamp + config.longest <= now;
        // An entry in flight counts as stamped `now`: not gone.
        match geometry.newest_stamp(&view, head, now) {
            None => return Ok(true),
            Some(stamp) if !gone(stamp) => return Ok(false),
            Some(_) => {}
        }
        Ok(geometry
            .before(head, geometry.logged(head))
            .all(|(lap, index)| matches!(view.read(index, lap), Entry::Stamp(s) if gone(s))))
    }
}

#[cfg(loom)]
std::thread_local! {
    /// Test-only: refunds that move the head back in place.
    static UNSEALED_REFUNDS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Loom builds only: a keyed sliding log's refund moves its ring's head back
/// in place (and writes back the overwritten entries) instead of publishing
/// a copy — the known-bad refund the models must catch: a decision made on
/// the refunded admission's entry can still claim once the head has come
/// back to the same ticket. For the calling OS thread. Never compiled into a
/// normal build.
#[cfg(loom)]
#[doc(hidden)]
pub fn known_bad_unsealed_log_refunds(on: bool) {
    UNSEALED_REFUNDS.with(|bad| bad.set(on));
}

#[cfg(loom)]
impl KeyRing {
    /// The known-bad refund: the ring sealed at `claimed.after` is unsealed
    /// at `claimed.before`, then the overwritten entries are written back.
    fn refund_in_place(&self, claimed: &Claimed, n: u32) {
        let geometry = self.geometry(1);
        self.head.store(claimed.before, Ordering::Release);
        for (lap, i) in geometry.tickets(claimed.before, n) {
            let word = match lap.checked_sub(1) {
                Some(lap) => entry_word(claimed.replaced, lap),
                None => EMPTY,
            };
            stamp_entry(&self.slots[i], word, Ordering::Release);
        }
    }
}

/// A key's log: its current ring, behind an epoch-protected pointer that a
/// refund or a carry-over replaces.
#[doc(hidden)]
#[allow(unreachable_pub)] // sealed: public only as `Keyable::State`
pub struct LogCell(Shared<KeyRing>);

impl LogCell {
    fn new(ring: KeyRing) -> Self {
        LogCell(Shared::new(ring))
    }
}

impl fmt::Debug for LogCell {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LogCell").finish_non_exhaustive()
    }
}

/// The stamps a ring written under `from` passes on to `to` at `now`,
/// oldest first.
///
/// The log keeps its history: `Proportional` and `Additive` both keep the
/// stamps still inside the longest window in force *and* inside the new
/// longest window (the newest `slots'` of them); `Reset` empties it. Stamps
/// already outside the old longest window are dropped even if the new one is
/// longer: a key whose log held only those was fresh, may have been evicted,
/// and must decide the same either way. A set of rules changed to another
/// keeps one history, which every new rule reads.
fn carried(stamps: &[u64], from: &LogConfig, to: &LogConfig, now: u64, carry: Carry) -> Vec<u64> {
    if carry == Carry::Reset {
        return Vec::new();
    }
    let window = from.longest.min(to.longest);
    let mut kept: Vec<u64> = stamps
        .iter()
        .copied()
        .filter(|&s| s + window > now)
        .collect();
    kept.sort_unstable();
    kept.drain(..kept.len().saturating_sub(to.slots as usize));
    kept
}

/// Replaces `ring`, the cell's current ring, by `build`'s ring from its
/// stamps: a ring with slots is sealed first (only the sealer replaces it);
/// an empty one is replaced by compare-and-swap. `false` if another
/// replacement got there first.
fn replace<'g>(
    cell: &LogCell,
    ring: &'g KeyRing,
    window: u64,
    guard: &'g Guard,
    build: impl FnOnce(&[u64]) -> KeyRing,
) -> bool {
    if ring.slots.is_empty() {
        return publish(cell, ring, build(&[]), guard);
    }
    let _replacing = ring.replacing.lock();
    if !ring.seal() {
        return false;
    }
    let next = build(&ring.sealed_stamps(window));
    publish(cell, ring, next, guard)
}

/// Publishes `next` in place of `ring`; `false` (and `next` dropped) if
/// `ring` was already replaced, which a sealed ring never is but by its
/// sealer.
fn publish<'g>(cell: &LogCell, ring: &'g KeyRing, next: KeyRing, guard: &'g Guard) -> bool {
    match cell.0.compare_exchange(ring, next, guard) {
        Ok(_) => {
            // SAFETY: `ring` was replaced by our CAS, once; every reader of
            // it is pinned.
            unsafe { cell.0.retire(ring, guard) };
            true
        }
        Err(_) => false,
    }
}

/// The key's ring under the view's configuration, not sealed: carried over
/// (and published) first if it was written under the previous one, or
/// re-laid for this configuration if its length is another's (a state two
/// configurations back under the one-bit tag, `reconfig.rs`, keeps its
/// history); `Err(Stale)` if the view is stale.
fn current<'g>(
    view: &View<'_, LogConfig>,
    cell: &LogCell,
    now: u64,
    guard: &'g Guard,
) -> Result<&'g KeyRing, Refusal> {
    let config = view.current;
    let mut backoff = Backoff::new();
    loop {
        let ring = cell.0.load(guard);
        if ring.is_sealed() {
            // A refund or a carry-over is copying it: wait for its successor.
            ring.wait_out();
            continue;
        }
        let fits = ring.slots.is_empty() || ring.slots.len() == config.slots as usize;
        if ring.tag == view.tag && fits {
            return Ok(ring);
        }
        let (from, carry) = if ring.tag == view.tag {
            (config, Carry::Proportional)
        } else if (view.still_current)() {
            (view.previous, view.carry)
        } else {
            return Err(Refusal::Stale);
        };
        let tag = view.tag;
        let window = from.longest;
        if !replace(cell, ring, window, guard, |stamps| {
            let kept = carried(stamps, from, config, now, carry);
            if kept.is_empty() {
                KeyRing::fresh(tag)
            } else {
                KeyRing::with_stamps(tag, config.slots, &kept)
            }
        }) {
            backoff.pause();
        }
    }
}

/// What an admission leaves: the ring it claimed on (by address) and its
/// tickets.
#[doc(hidden)]
#[derive(Debug, Clone, Copy)]
#[allow(unreachable_pub)] // sealed: public only as `Keyable::Receipt`
pub struct LogReceipt {
    ring: usize,
    claimed: Claimed,
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
        LogCell::new(KeyRing::fresh(tag))
    }

    fn acquire(
        view: &View<'_, LogConfig>,
        state: &LogCell,
        now: u64,
        n: u32,
    ) -> Result<LogReceipt, Refusal> {
        let config = view.current;
        check_request(n, config.capacity)?;
        let guard = pin();
        loop {
            let ring = current(view, state, now, &guard)?;
            if ring.slots.is_empty() {
                // The key's first admission allocates its ring; a racing one
                // may have already.
                publish(
                    state,
                    ring,
                    KeyRing::with_stamps(ring.tag, config.slots, &[]),
                    &guard,
                );
                continue;
            }
            match ring.claim(config, now, n) {
                Err(Replacing) => ring.wait_out(),
                Ok(Err(retry_ns)) => return Err(Refusal::Denied(retry_after(retry_ns))),
                Ok(Ok(claimed)) => {
                    return Ok(LogReceipt {
                        ring: ring as *const KeyRing as usize,
                        claimed,
                    });
                }
            }
        }
    }

    /// Read from the ring on the head the admission left (advisory under
    /// concurrency, exact alone), only when a caller asks for it.
    fn admitted(view: &View<'_, LogConfig>, receipt: LogReceipt, now: u64) -> Snapshot {
        // SAFETY: the keyed layer asks for an admission's snapshot in the
        // call that admitted it, pinned throughout and with the state alive
        // (`Keyable::admitted`), and a ring replaced since is destroyed
        // through the epoch: the ring is alive.
        let ring = unsafe { &*(receipt.ring as *const KeyRing) };
        ring.snapshot(view.current, receipt.claimed.after, now)
    }

    fn peek(view: &View<'_, LogConfig>, state: &LogCell, now: u64, n: u32) -> Result<(), Refusal> {
        let config = view.current;
        check_request(n, config.capacity)?;
        let guard = pin();
        loop {
            let ring = current(view, state, now, &guard)?;
            match ring.check(config, now, n) {
                Err(Replacing) => ring.wait_out(),
                Ok(verdict) => return verdict.map_err(|ns| Refusal::Denied(retry_after(ns))),
            }
        }
    }

    fn refund(view: &View<'_, LogConfig>, state: &LogCell, receipt: LogReceipt, n: u32) {
        let _ = view;
        let guard = pin();
        let ring = state.0.load(&guard);
        // The ring it claimed on (a carry-over or another refund since
        // replaced it: keep the permits), with its admission still the
        // latest (see `holds` for a ring at the same address).
        if ring as *const KeyRing as usize != receipt.ring {
            return;
        }
        let _replacing = ring.replacing.lock();
        if !ring.seal_at(receipt.claimed.after) {
            return;
        }
        if !ring.holds(&receipt.claimed) {
            ring.unseal(receipt.claimed.after);
            return;
        }
        #[cfg(loom)]
        if UNSEALED_REFUNDS.with(std::cell::Cell::get) {
            ring.refund_in_place(&receipt.claimed, n);
            return;
        }
        let next = ring.refunded(&receipt.claimed, n);
        let published = publish(state, ring, next, &guard);
        debug_assert!(published, "only the sealer replaces a sealed ring");
    }

    fn fork(view: &View<'_, LogConfig>, state: &LogCell, now: u64) -> Option<LogCell> {
        let config = view.current;
        let guard = pin();
        loop {
            let ring = current(view, state, now, &guard).ok()?;
            match ring.live_stamps(config.longest) {
                Err(Replacing) => ring.wait_out(),
                Ok(stamps) if stamps.is_empty() => {
                    return Some(LogCell::new(KeyRing::fresh(view.tag)));
                }
                Ok(stamps) => {
                    return Some(LogCell::new(KeyRing::with_stamps(
                        view.tag,
                        config.slots,
                        &stamps,
                    )));
                }
            }
        }
    }

    fn snapshot(view: &View<'_, LogConfig>, state: &LogCell, now: u64) -> Option<Snapshot> {
        let guard = pin();
        let ring = current(view, state, now, &guard).ok()?;
        // Acquire: as in `KeyRing::head`, so the entries read are those of
        // the laps the head implies (a sealed head: read as it was).
        let head = ring.head.load(Ordering::Acquire) & !SEALED;
        Some(ring.snapshot(view.current, head, now))
    }

    fn is_fresh(view: &View<'_, LogConfig>, state: &LogCell, now: u64) -> Option<bool> {
        let guard = pin();
        loop {
            let ring = current(view, state, now, &guard).ok()?;
            match ring.is_fresh(view.current, now) {
                Err(Replacing) => ring.wait_out(),
                Ok(fresh) => return Some(fresh),
            }
        }
    }

    fn settle(view: &View<'_, LogConfig>, state: &LogCell, now: u64) -> bool {
        let guard = pin();
        current(view, state, now, &guard).is_ok()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// Per key: one pointer in the map's entry, and a ring header beside
    /// the slots.
    #[test]
    fn the_per_key_state_is_a_pointer_and_a_small_header() {
        assert_eq!(std::mem::size_of::<LogCell>(), 8);
        assert_eq!(std::mem::size_of::<KeyRing>(), 40);
    }
}
