//! The exact sliding log: never more than N permits in any window of length T,
//! decided on rings of timestamps, one ring per stripe: lock-free
//! ([`SlidingLog`]), or under a mutex (its locking twin, [`LockingSlidingLog`]).
//!
//! The user-facing documentation (promise, state, proof) is on [`SlidingLogOf`].

mod home;
pub(crate) mod log;
pub(crate) mod ring;
mod rules;
mod stripes;

use std::fmt;
use std::time::Duration;

pub use rules::LogConfig;

use crate::cell::{Atomic, Locked};
use crate::clock::{Clock, MonotonicClock};
use crate::error::{ConfigError, Denied};
use crate::limiter::{RateLimiter, Rejection, Snapshot, report};
use crate::rate::Rate;
use crate::stripe::default_stripes;
use crate::timeline::Timeline;
use home::RingsHome;
use stripes::{Plan, Rings};

/// A lock-free, exact sliding log: at most `rate.permits()` permits in any
/// window of `rate.period()`, by the time each was admitted.
///
/// A check reads the clock, the head and one or two entries; an admission
/// adds one CAS and one store per permit; a denial writes no entry and no
/// head (with several rings, a check may leave hints on its own ring's line:
/// see the state table). What it promises, and how, is on [`SlidingLogOf`],
/// the type it names; [`LockingSlidingLog`] is its twin under a mutex.
///
/// ```
/// use tollgate::{Rate, RateLimiter, SlidingLog};
///
/// // A third-party API that silently drops calls beyond 30 per minute.
/// let quota = SlidingLog::new(Rate::per_minute(30)).unwrap();
/// if quota.try_acquire().is_ok() {
///     // call the API
/// }
/// ```
pub type SlidingLog<C = MonotonicClock> = SlidingLogOf<Atomic, C>;

/// The [`SlidingLog`]'s locking twin: the same rings of entry words, split
/// over the same stripes, and the same decision code, run under a
/// `parking_lot` mutex.
///
/// Given the same clock readings on the same threads it makes the same
/// decisions, with the same retry-after and the same snapshots, and a
/// reconfiguration inherits the same entries. It is the baseline in the
/// benchmarks, the second opinion in the property tests, and a fallback for
/// anyone who prefers a lock. Its methods, errors and guarantee are the
/// [`SlidingLog`]'s (less [`memory`](SlidingLog::memory)): both name
/// [`SlidingLogOf`].
///
/// ```
/// use tollgate::{ConfigError, LockingSlidingLog, Rate, RateLimiter};
///
/// let log = LockingSlidingLog::new(Rate::per_minute(2)).unwrap();
/// assert!(log.try_acquire_n(2).is_ok());
/// assert!(log.try_acquire().is_err());
/// assert_eq!(LockingSlidingLog::new(Rate::per_second(0)).unwrap_err(), ConfigError::ZeroRate);
/// ```
pub type LockingSlidingLog<C = MonotonicClock> = SlidingLogOf<Locked, C>;

/// An exact sliding log: the one type behind [`SlidingLog`] (its rings behind
/// a pointer, decided lock-free) and [`LockingSlidingLog`] (the same rings
/// under a mutex). Every method, decision and guarantee is the same for both,
/// and documented here; name it through those two, since the parameter `H`
/// says only where the rings live.
///
/// The log: never more than N permits in any window of length T, decided on
/// rings of timestamps, one ring per stripe.
///
/// A ring of entry words remembers when each of its last permits was admitted.
/// A request for `n` permits takes the ring's next `n` *tickets*; ticket `k`
/// replaces the entry of ticket `k − M` (`M` = the ring's capacity) — the permit
/// admitted M permits earlier in that ring — and is admitted only if that entry
/// left the window, i.e. was stamped at or before `now − T`. This is the
/// circular buffer with head and tail of Khaled Henidak's ["Writing a
/// Non-Locking Throttling Component"](http://henidak.com/2015/08/writing-a-non-locking-throttling-component/)
/// (2015), with the tail made
/// implicit (it is always `head − M`) and the racy read-then-write of the head
/// replaced by one compare-and-swap that claims the tickets, as in crossbeam's
/// `ArrayQueue`.
///
/// The N permits are split over rings, one per stripe (the stripe count
/// defaults to the CPU count; [`SlidingLog::with_stripes`]): a thread admits
/// from its home ring, so admissions on different cores write different cache
/// lines. A request its home ring cannot serve alone surveys every ring's front
/// and claims the free entries it finds there, taking its claims back if a ring
/// was taken meanwhile; it is denied only if all rings together lack `n`
/// entries it may take, with the retry-after of the n-th of them.
///
/// An entry that left the window is its own ring's threads' first: while they
/// are busy (one of them asked for permits, admitted or not, within the last
/// *grace*), a thread of another ring may take it only once it has been
/// free for a grace; from a ring whose threads are quiet, at once. The grace
/// is a sixteenth of the window, at least 2 µs and at most 50 µs, never more
/// than the window. Near
/// the limit, where every thread wants more than its ring's share, threads
/// then keep to their own rings' lines instead of taking each other's entries
/// the moment they free (which made two threads no faster than one). It
/// decides only who gets an entry and when, never how many: the log stays
/// exact, and an entry is at most a grace late for anyone. With one thread,
/// or one ring, there is no other ring's thread to wait for.
///
/// # State
///
/// Per ring: the head, one `AtomicU64` on its own cache line:
///
/// | bits | meaning |
/// |---|---|
/// | `0 .. s` | index of the next ticket's slot (`s` = bits of N's next power of two) |
/// | `s .. 63` | lap of the next ticket: how often the ring has wrapped |
/// | `63` | sealed: a reconfiguration is replacing this ring |
///
/// Each of the ring's slots, one `AtomicU64`:
///
/// | bits | meaning |
/// |---|---|
/// | `0` | lap bit of the entry's ticket: 1 for even laps, 0 for odd; the never-written lap −1 has 0 |
/// | `1 .. 64` | the stamp: ns since the limiter was built (at most 2^62) |
///
/// With more than one ring, each ring also has a cache line of hints that no
/// decision admits on (both Relaxed): `home_at`, one past its threads' latest
/// request, admitted or not (kept to an eighth of a grace); `others_at`, the
/// earliest time another ring can serve its threads, a lower bound raised by
/// `fetch_max` after a survey that denied one permit.
///
/// | operation | reads | writes |
/// |---|---|---|
/// | admit `n` at `now` from one ring | its head (Acquire); the `n` replaced entries and the newest (Acquire) | head → head + n by CAS (Release); then the `n` entries, `max(now, newest stamp of the ring)` (Release); `home_at` once it is an eighth of a grace behind |
/// | admit across rings | every head; each ring's front entries until `n` can be taken; other rings' hints | each ring's front run, as above, home ring first; on a lost race the claims are restamped at `now − T` by CAS (Relaxed: it continues the release sequence of the claim's own store) |
/// | deny | its home ring's head, front and hints (one permit whose home front frees no later than `others_at`); else the heads, the entries up to the n-th oldest of all, other rings' hints | no entry and no head (or, counting denials, the n oldest entries of all are replaced, as admit); `home_at` once it is an eighth of a grace behind; after a survey for one permit, its ring's `others_at` |
/// | snapshot | every head; all N entries | nothing |
/// | reconfigure | every head (seal, AcqRel); all N entries | new rings, published by pointer (Release) |
///
/// # Why it is exact
///
/// Every ticket of one slot is admitted only once the entry it replaces — the
/// previous ticket of the *same* slot — is a full window old, and is stamped no
/// earlier than its own reading. So the admissions of one slot are at least T
/// apart, both by clock reading and by stamp; a half-open window `[t, t + T)`
/// holds at most one of them per slot, hence at most N permits, whichever rings
/// the slots are in. A claim taken back is restamped at `now − T`, no earlier
/// than any entry it replaced (they were free), so each slot's stamps still only
/// grow. Nothing here
/// assumes that stamps grow from slot to slot, so readings that are not monotone
/// across threads (a stale `now`) cannot break it: a stale reading only fails the
/// check more often.
///
/// The rest is making sure a decision reads *the* entry its ticket replaces:
///
/// * **Claimed but not yet stamped.** A ticket is claimed by the head CAS and
///   stamped by a store just after. A reader that finds the previous lap's word
///   in the slot (the lap bit says which) sees a *pending* entry, stamped at about
///   now by a writer that claimed it moments ago, and that ring refuses — the
///   request never waits on another thread, and never claims past a pending
///   entry (the late store would land on top of it). The price: a writer
///   *preempted* between its claim and its store makes its ring refuse every
///   request that needs its entry until it runs again. The request then tries
///   the other rings; no thread ever waits and nothing is over-admitted, and on
///   an oversubscribed machine the extra denials are small
///   (`docs/sliding_log.md`).
/// * **Older laps.** One lap bit tells only two laps apart. The head load is
///   Acquire and the claim CAS Release; every claimer read the entry its tickets
///   replace (Acquire) before claiming. So the stores of all entries replaced by
///   claimed tickets happen before our reads of the same slots, and coherence
///   forbids seeing anything older: a slot shows the expected lap, the one
///   before it (pending), or a later one.
/// * **Later laps.** A later lap's entry was stored (Release) after its writer's
///   CAS moved the head past our tickets; reading it (Acquire) orders that CAS
///   before ours, which therefore fails. A decision can succeed only on the
///   entries it expects.
///
/// Single-threaded the log is also *tight*: each ring's stamps then only grow,
/// so a ring's free entries are exactly its front run, and the rings together
/// have `n` free entries exactly when at most `N − n` permits were admitted in
/// `(now − T, now]`; the log admits exactly then. A denial's retry-after is the
/// exact time until the n-th oldest entry of all (the `(N − n + 1)`-th most
/// recent permit) leaves the window.
///
/// # Retry-after
///
/// A request denied at reading `t` with [`Denied::RetryAfter`]`(d)` is, on
/// the log as the denial left it, denied at every reading before `t + d` and
/// admitted at `t + d`, when made again by the same thread (with several
/// rings, which entries a thread may take first depends on its ring): the
/// wait is *exact*, to the nanosecond. That holds on one ring or several,
/// from one thread or several, for one permit or more, at any reading — one
/// older than admissions the log has already made (a clock that stepped
/// back, a thread preempted after reading it) included. Counting denied
/// attempts, the wait is for the same request made after the denied one was
/// logged. Decisions that race are exact as of the entries they read, as any
/// limiter's are.
///
/// Every wait is read from the entries its decision saw. With several
/// rings, a thread that found nothing free keeps, on its home ring's line,
/// a lower bound of when the other rings can next serve it (`others_at`),
/// and denies one permit without reading their lines again only while its
/// home ring's own front frees no later than that bound: the wait is then
/// its home ring's, as with one ring. A bound that comes first says
/// nothing exact — another thread may since have taken the entry it was
/// read from — so such a denial reads the rings.
///
/// ```
/// use std::time::Duration;
/// use tollgate::{Denied, ManualClock, Rate, RateLimiter, SlidingLog};
///
/// let clock = ManualClock::new();
/// let log = SlidingLog::with_clock(Rate::new(2, Duration::from_micros(2)), clock.clone())?
///     .with_stripes(2);
/// clock.set(197_526);
/// log.try_acquire_n(2)?;
/// clock.set(199_526);
/// log.try_acquire_n(2)?;
/// // A reading from before both admissions: the permits of 199,526 leave the
/// // window at 201,526.
/// clock.set(166_658);
/// assert_eq!(log.try_acquire(), Err(Denied::RetryAfter(Duration::from_nanos(34_868))));
/// clock.set(201_526);
/// assert!(log.try_acquire().is_ok());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Stale and backwards time
///
/// The clock is read once per request. A reading older than a ring's newest
/// entry is checked as it is (so it can only deny more) and the permits are
/// stamped with that entry's time: for each ring, time stands still until the
/// clock catches up; it never runs backwards, never panics, and is never stuck
/// for longer than the step back plus one window. (With one ring that is the
/// whole log; with several, a ring whose newest entry is older than another's
/// takes the stale reading as its stamp.)
///
/// ```
/// use std::time::Duration;
/// use tollgate::{Denied, ManualClock, Rate, RateLimiter, SlidingLog};
///
/// let clock = ManualClock::new();
/// let log = SlidingLog::with_clock(Rate::per_minute(100), clock.clone()).unwrap();
/// clock.advance(Duration::from_millis(59_900)); // 0:59.9
/// assert!(log.try_acquire_n(100).is_ok());
/// clock.advance(Duration::from_millis(200)); // 1:00.1: a fixed window would reopen
/// assert_eq!(
///     log.try_acquire(),
///     Err(Denied::RetryAfter(Duration::from_millis(59_800)))
/// );
/// ```
///
/// # Several rules
///
/// [`SlidingLog::with_rule`] adds a rule — `5` a second *and* `100` a minute
/// *and* `1,000` a day, from one log — and [`SlidingLog::reconfigure_rules`]
/// changes the whole set ([`LogConfig`]). A request for `n` is admitted only
/// if, for every rule `(N_i, T_i)` and every ticket `k` it takes, the entry
/// of ticket `k − N_i` has left `T_i`: each rule's tickets form `N_i`
/// chains, every admission a full `T_i` after its chain's previous stamp, so
/// every rule holds exactly (at most `N_i` permits in any window of `T_i`),
/// stale readings included. Single-threaded the log is tight for every rule;
/// a denial's retry-after is the longest of the rules' waits, and a snapshot
/// reports the rule that binds first (the fewest permits left). A request
/// above the smallest count is [`Denied::ExceedsCapacity`].
///
/// The rules share one ring of the largest count (stripes do not apply: a
/// rule whose count is below the ring count could not be split over rings),
/// so the memory is that of the largest rule alone. Counting denied attempts
/// works as with one rule: a logged attempt is stamped no earlier than any
/// entry a rule compared it with.
///
/// ```
/// use std::time::Duration;
/// use tollgate::{ManualClock, Rate, RateLimiter, SlidingLog};
///
/// let clock = ManualClock::new();
/// let api = SlidingLog::with_clock(Rate::per_second(5), clock.clone())?
///     .with_rule(Rate::per_minute(30))?
///     .with_rule(Rate::new(1_000, Duration::from_secs(86_400)))?;
/// assert_eq!((api.limit(), api.window()), (5, Duration::from_secs(86_400)));
/// for _ in 0..6 {
///     api.try_acquire_n(5)?; // 5 a second for six seconds: 30 this minute
///     clock.advance(Duration::from_secs(1));
/// }
/// let minute = api.try_acquire().unwrap_err().retry_after().unwrap();
/// assert_eq!(minute, Duration::from_secs(54)); // the first five leave the minute at 60 s
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Counting denied attempts
///
/// Off by default. With [`SlidingLog::count_denied`], a denied request is logged
/// like an admitted one (stamped no earlier than the entries it replaces), so a
/// caller that keeps hammering stays blocked until it pauses for a whole window —
/// the Redis design of gunslinger008's "Redis realizes dynamic rate control"
/// (2022), which compares each request with the N-th previous one. Admitted
/// permits still never exceed N per window.
///
/// # Reconfiguration
///
/// [`SlidingLog::reconfigure`] changes N and T without a lock on the request
/// path. The current ring sits behind a crossbeam-epoch pointer. The
/// reconfiguring thread seals the ring (a bit in its head: claims fail from
/// then on), waits for tickets claimed before the seal to be stamped, builds the
/// new ring and publishes it; requests that meet the sealed ring wait for the
/// new one and decide there. The old ring is freed once no thread can hold it.
/// The locking twin seals and replaces its rings under its mutex, so no request
/// meets a sealed ring there; the new rings inherit the same entries.
///
/// The new ring inherits upper bounds on the stamps of the N′ most recent
/// permits. Every permit the old ring knows of has a bound: the ring holds the
/// last entry of each slot, the `k`-th entry before it in that slot was stamped
/// at least `k·T` earlier (each admission waited a window after the entry it
/// replaced), and the permits earlier reconfigurations left out are remembered
/// as a count and one bound for all of them. The new ring's entries are the N′
/// largest bounds, oldest first; it remembers how many bounds it left out and
/// the largest of them.
///
/// **Guarantee**: every half-open window of length T′ that contains a permit
/// admitted under the new configuration holds at most N′ permits, old ones
/// included. (If more than N′ bounds exist, a new admission comes at least T′
/// after the smallest inherited bound, which is no earlier than any permit left
/// out, so none of those shares its window; among the inherited and the new
/// permits each new slot holds at most one per T′.) Windows holding only old
/// permits keep the old promise. The bounds can be later than the real stamps
/// (a slot's earlier entries may be older than `k·T` back), so a
/// reconfiguration may hold requests back longer than a full history would,
/// never less. In counting mode a logged denial is only known to be no earlier
/// than what it replaced, so all of a slot's bounds are its last stamp: safe,
/// and stricter.
///
/// # Memory
///
/// Eight bytes per permit of the limit plus a constant of 256 bytes per ring
/// (its cache-padded head and bookkeeping) and one more cache-padded word
/// (when the rings' fronts free, for denials at the limit):
/// [`SlidingLog::memory`] reports it (on x86-64 with one ring, 8·N + 568
/// bytes: 1,368 for N = 100, 80,568 for N = 10,000; with two, 8·N + 824). A request for `n` permits reads and writes
/// `n` entries; a snapshot reads all N.
pub struct SlidingLogOf<H: RingsHome, C = MonotonicClock> {
    rings: H::Store,
    timeline: Timeline<C>,
}

impl<H: RingsHome, C: fmt::Debug> fmt::Debug for SlidingLogOf<H, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The alias's name: the one the user wrote, not the generic type's.
        f.debug_struct(H::name("SlidingLog", "LockingSlidingLog"))
            .field("rings", &self.rings)
            .field("timeline", &self.timeline)
            .finish()
    }
}

/// The log's and its twin's constructor on the default clock (the example
/// runs on the lock-free one; the twin answers the same).
impl<H: RingsHome> SlidingLogOf<H> {
    /// At most `rate.permits()` permits in any window of `rate.period()`, on the
    /// default [`MonotonicClock`]. Allocates one 8-byte entry per permit.
    ///
    /// Errors: [`ConfigError::ZeroRate`], [`ConfigError::ZeroPeriod`],
    /// [`ConfigError::TooFine`] (more than one permit per nanosecond),
    /// [`ConfigError::Overflow`] (a period longer than 2^62 ns).
    ///
    /// ```
    /// use tollgate::{ConfigError, Rate, SlidingLog};
    ///
    /// let logins = SlidingLog::new(Rate::per_hour(5)).unwrap();
    /// # let _ = logins;
    /// assert_eq!(SlidingLog::new(Rate::per_second(0)).unwrap_err(), ConfigError::ZeroRate);
    /// ```
    pub fn new(rate: Rate) -> Result<Self, ConfigError> {
        Self::with_clock(rate, MonotonicClock::new())
    }
}

/// The methods of the log and its twin on any clock (each example runs on the
/// lock-free one; the twin answers the same).
impl<H: RingsHome, C: Clock> SlidingLogOf<H, C> {
    /// As [`SlidingLog::new`], reading `clock`: a [`ManualClock`](crate::ManualClock)
    /// in tests, a [`CachedClock`](crate::CachedClock) for the cheapest reads.
    ///
    /// ```
    /// use tollgate::{ManualClock, Rate, SlidingLog};
    /// let log = SlidingLog::with_clock(Rate::per_second(10), ManualClock::new()).unwrap();
    /// # let _ = log;
    /// ```
    pub fn with_clock(rate: Rate, clock: C) -> Result<Self, ConfigError> {
        Ok(SlidingLogOf {
            rings: H::store(first_rings(rate)?),
            timeline: Timeline::new(clock),
        })
    }

    /// Also logs denied attempts (off by default), so that a caller who keeps
    /// hammering stays blocked until it pauses for a whole window. Admitted
    /// permits still never exceed the limit in any window. Meant for a log that
    /// has not served requests yet; on one that has, its history carries over as
    /// through [`SlidingLog::reconfigure`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{ManualClock, Rate, RateLimiter, SlidingLog};
    ///
    /// let clock = ManualClock::new();
    /// let log = SlidingLog::with_clock(Rate::per_second(1), clock.clone())
    ///     .unwrap()
    ///     .count_denied(true);
    /// assert!(log.try_acquire().is_ok());
    /// clock.advance(Duration::from_millis(900));
    /// assert!(log.try_acquire().is_err()); // logged at 0.9 s
    /// clock.advance(Duration::from_millis(200));
    /// assert!(log.try_acquire().is_err()); // 1.1 s: still within a second of 0.9 s
    /// ```
    pub fn count_denied(self, on: bool) -> Self {
        H::replace_rings(&self.rings, |plan| Plan {
            count_denied: on,
            ..plan
        });
        self
    }

    /// Changes the limit and the window while requests keep flowing, without a
    /// lock on their path. The new log inherits the most recent admissions:
    /// every window of the new length that contains a permit admitted under the
    /// new rate holds at most its permits, old ones included (see the
    /// [`SlidingLogOf`](SlidingLogOf#reconfiguration)). The replaced ring is freed once no
    /// thread can still be reading it.
    ///
    /// Requests that arrive during the change wait for it (it copies at most
    /// the new limit's entries); a request for more permits than the new limit
    /// gets [`Denied::ExceedsCapacity`]. Errors are those of [`SlidingLog::new`],
    /// and leave the log unchanged.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{ManualClock, Rate, RateLimiter, SlidingLog};
    ///
    /// let clock = ManualClock::new();
    /// let log = SlidingLog::with_clock(Rate::per_minute(2), clock.clone()).unwrap();
    /// log.try_acquire_n(2).unwrap();
    /// log.reconfigure(Rate::per_minute(3)).unwrap();
    /// assert!(log.try_acquire().is_ok()); // the third of the new three
    /// assert!(log.try_acquire().is_err());
    /// log.reconfigure(Rate::new(1, Duration::from_secs(10))).unwrap();
    /// clock.advance(Duration::from_secs(10));
    /// assert!(log.try_acquire().is_ok());
    /// ```
    pub fn reconfigure(&self, rate: Rate) -> Result<(), ConfigError> {
        self.reconfigure_rules(&LogConfig::new(rate)?);
        Ok(())
    }

    /// Adds a rule — or changes the rule of the same window — so that a
    /// request is admitted only if every rule admits it: `5` a second *and*
    /// `100` a minute from one log. Every rule holds exactly (at most `N_i`
    /// permits in any window of `T_i`); a denial's retry-after is the longest
    /// of the rules' waits; a request above the smallest count is
    /// [`Denied::ExceedsCapacity`]. Errors are those of [`SlidingLog::new`].
    ///
    /// With several rules the log keeps one ring of the largest count, which
    /// every rule reads (see [Several rules](SlidingLogOf#several-rules)). Like
    /// [`SlidingLog::count_denied`], meant before the log serves requests; on
    /// one that has, its history carries over as through
    /// [`SlidingLog::reconfigure_rules`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Denied, ManualClock, Rate, RateLimiter, SlidingLog};
    ///
    /// let clock = ManualClock::new();
    /// let api = SlidingLog::with_clock(Rate::per_second(5), clock.clone())?
    ///     .with_rule(Rate::per_minute(8))?;
    /// assert_eq!(api.limit(), 5); // the most one request can take
    /// api.try_acquire_n(5)?;
    /// clock.advance(Duration::from_secs(1));
    /// api.try_acquire_n(3)?; // 8 this minute
    /// // The minute binds: the first of the 8 leaves it in 59 s.
    /// assert_eq!(api.try_acquire(), Err(Denied::RetryAfter(Duration::from_secs(59))));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_rule(self, rate: Rate) -> Result<Self, ConfigError> {
        let rules = self.rules().with_rule(rate)?;
        self.reconfigure_rules(&rules);
        Ok(self)
    }

    /// Changes the whole set of rules while requests keep flowing, as
    /// [`SlidingLog::reconfigure`] changes one: the new log inherits upper
    /// bounds on the most recent permits, so every rule of the new set holds
    /// in every window that contains a permit admitted under it, old permits
    /// included.
    ///
    /// ```
    /// use tollgate::{LogConfig, Rate, RateLimiter, SlidingLog};
    ///
    /// let log = SlidingLog::new(Rate::per_second(10))?;
    /// log.try_acquire_n(4)?;
    /// log.reconfigure_rules(&LogConfig::new(Rate::per_second(10))?.with_rule(Rate::per_hour(5))?);
    /// assert!(log.try_acquire().is_ok()); // the fifth this hour
    /// assert!(log.try_acquire().is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reconfigure_rules(&self, rules: &LogConfig) {
        H::replace_rings(&self.rings, |plan| Plan {
            rules: rules.clone(),
            ..plan
        });
    }

    /// The rules in force, shortest window first.
    ///
    /// ```
    /// use tollgate::{Rate, SlidingLog};
    ///
    /// let log = SlidingLog::new(Rate::per_minute(30))?.with_rule(Rate::per_second(5))?;
    /// let rules: Vec<Rate> = log.rules().rules().collect();
    /// assert_eq!(rules, [Rate::per_second(5), Rate::per_minute(30)]);
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn rules(&self) -> LogConfig {
        H::with(&self.rings, |rings| rings.rules().clone())
    }

    /// Splits the log's permits over rings for `stripes` stripes (default: one
    /// per CPU, rounded up to a power of two). Threads admit from their own
    /// stripe's ring, so admissions on different cores write different cache
    /// lines; a request its own ring cannot serve looks at all of them, and the
    /// log stays exact and, single-threaded, tight whatever the count. The
    /// ring count is the largest power of two at most `stripes`, the limit and
    /// 64; a log of several rules keeps one ring. Like [`SlidingLog::count_denied`], meant before the log serves
    /// requests; on one that has, its history carries over.
    ///
    /// ```
    /// use tollgate::{Rate, SlidingLog};
    /// let log = SlidingLog::new(Rate::per_second(100)).unwrap().with_stripes(4);
    /// assert_eq!(log.stripes(), 4);
    /// let tiny = SlidingLog::new(Rate::per_second(3)).unwrap().with_stripes(4);
    /// assert_eq!(tiny.stripes(), 2); // at most the limit, a power of two
    /// ```
    pub fn with_stripes(self, stripes: usize) -> Self {
        H::replace_rings(&self.rings, |plan| Plan { stripes, ..plan });
        self
    }

    /// How many rings the permits are split over (see [`SlidingLog::with_stripes`]).
    ///
    /// ```
    /// use tollgate::{Rate, SlidingLog};
    /// let log = SlidingLog::new(Rate::per_second(100)).unwrap().with_stripes(1);
    /// assert_eq!(log.stripes(), 1);
    /// ```
    pub fn stripes(&self) -> usize {
        H::with(&self.rings, Rings::ring_count)
    }

    /// The permits allowed per window; with several rules, the smallest
    /// count: the most one request can take.
    ///
    /// ```
    /// use tollgate::{Rate, SlidingLog};
    /// assert_eq!(SlidingLog::new(Rate::per_second(100)).unwrap().limit(), 100);
    /// ```
    pub fn limit(&self) -> u32 {
        H::with(&self.rings, Rings::limit)
    }

    /// The window's length; with several rules, the longest.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Rate, SlidingLog};
    /// let log = SlidingLog::new(Rate::per_minute(100)).unwrap();
    /// assert_eq!(log.window(), Duration::from_secs(60));
    /// ```
    pub fn window(&self) -> Duration {
        H::with(&self.rings, |rings| rings.rules().window())
    }

    /// The clock this limiter reads.
    ///
    /// ```
    /// use tollgate::{Clock, ManualClock, Rate, SlidingLog};
    /// let clock = ManualClock::new();
    /// let log = SlidingLog::with_clock(Rate::per_second(10), clock.clone()).unwrap();
    /// clock.set(7);
    /// assert_eq!(log.clock().now(), 7);
    /// ```
    pub fn clock(&self) -> &C {
        self.timeline.clock()
    }
}

/// The lock-free log's own: the twin keeps its rings inline, under its mutex.
impl<C: Clock> SlidingLog<C> {
    /// Bytes this limiter occupies: the struct, its ring's head and bookkeeping,
    /// and 8 bytes per permit of the limit.
    ///
    /// ```
    /// use tollgate::{Rate, SlidingLog};
    /// let small = SlidingLog::new(Rate::per_second(100)).unwrap();
    /// let large = SlidingLog::new(Rate::per_second(10_000)).unwrap();
    /// assert_eq!(large.memory() - small.memory(), 8 * 9_900);
    /// ```
    pub fn memory(&self) -> usize {
        std::mem::size_of::<Self>()
            + self
                .rings
                .with(|rings| std::mem::size_of::<Rings>() + rings.heap_bytes())
    }
}

/// The rings a log starts with: one rule, `rate`; denied attempts not
/// counted; the default stripes.
fn first_rings(rate: Rate) -> Result<Rings, ConfigError> {
    Ok(Rings::new(Plan {
        rules: LogConfig::new(rate)?,
        count_denied: false,
        stripes: default_stripes(),
    }))
}

/// The log's and its twin's decisions: the same code on the same rings,
/// wherever they live (see `RingsHome::decide`).
impl<H: RingsHome, C: Clock> RateLimiter for SlidingLogOf<H, C> {
    #[inline]
    fn try_acquire_n(&self, n: u32) -> Result<(), Denied> {
        H::decide(
            &self.rings,
            n,
            || self.timeline.now(),
            |_, denied| Err(denied),
            |_, _, decided| decided,
        )
    }

    fn snapshot(&self) -> Snapshot {
        H::with(&self.rings, |rings| rings.snapshot(self.timeline.now()))
    }

    /// The snapshot is read right after the decision, from the same rings and
    /// at the decision's reading: the state is a ring of entries, not one word
    /// (see the trait method). Like [`snapshot`](RateLimiter::snapshot), it
    /// reads every entry: O(N).
    fn try_acquire_n_with_snapshot(&self, n: u32) -> Result<Snapshot, Rejection> {
        H::decide(
            &self.rings,
            n,
            || self.timeline.now(),
            |rings, denied| Err(Rejection::new(denied, rings.snapshot(self.timeline.now()))),
            |rings, now, decided| report(decided, rings.snapshot(now)),
        )
    }
}

/// The retry-after of logs of several rings shared by threads, played in
/// turn on one thread, each request with its thread's home ring.
#[cfg(all(test, not(loom)))]
mod tests {
    use std::time::Duration;

    use super::{LockingSlidingLog, SlidingLog};
    use crate::clock::ManualClock;
    use crate::error::Denied;
    use crate::limiter::RateLimiter;
    use crate::rate::Rate;
    use crate::sync::thread::set_thread_hint;

    const WINDOW: u64 = 2_000;

    /// One request: the home ring of the thread that makes it, its reading.
    type Request = (usize, u64);

    fn retry(ns: u64) -> Result<(), Denied> {
        Err(Denied::RetryAfter(Duration::from_nanos(ns)))
    }

    /// A fresh log and twin of `limit` permits per [`WINDOW`] over `rings`
    /// rings, each sent `history` in order, answering each request as it
    /// says; then `last` asked of each, whose answers are returned.
    fn replay(
        limit: u32,
        rings: usize,
        history: &[(Request, Result<(), Denied>)],
        last: Request,
    ) -> [Result<(), Denied>; 2] {
        let clock = ManualClock::new();
        let rate = Rate::new(limit, Duration::from_nanos(WINDOW));
        let log = SlidingLog::with_clock(rate, clock.clone())
            .unwrap()
            .with_stripes(rings);
        let twin = LockingSlidingLog::with_clock(rate, clock.clone())
            .unwrap()
            .with_stripes(rings);
        assert_eq!((log.stripes(), twin.stripes()), (rings, rings));
        let ask = |(home, at): Request| {
            set_thread_hint(home);
            clock.set(at);
            [log.try_acquire(), twin.try_acquire()]
        };
        for &(request, expected) in history {
            assert_eq!(ask(request), [expected; 2], "{request:?}");
        }
        ask(last)
    }

    /// With several threads, one per ring: the thread of ring 1 surveys
    /// every ring at 198,526 and learns that ring 0's front frees at
    /// 199,526; there every thread takes its own ring's entries; then the
    /// thread of ring 1 decides on a reading from before all of it. Every
    /// permit is in the window until 201,526, and that is the wait it must
    /// be told — not 199,526, the bound its survey left, where the request
    /// is still denied. A nanosecond earlier it is denied; then, admitted.
    #[test]
    fn a_stale_reading_after_other_threads_admissions_gets_the_exact_wait() {
        let (first, surveyed, second, stale) = (197_526, 198_526, 199_526, 166_658);
        let free = second + WINDOW;
        for rings in [2, 4] {
            for per_ring in [1, 2] {
                let limit = (rings * per_ring) as u32;
                let mut history = Vec::new();
                for home in 0..rings {
                    history.extend((0..per_ring).map(|_| ((home, first), Ok(()))));
                }
                history.push(((1, surveyed), retry(second - surveyed)));
                for home in 0..rings {
                    history.extend((0..per_ring).map(|_| ((home, second), Ok(()))));
                }
                let case = format!("{limit} permits over {rings} rings");
                let stale_request = (1, stale);
                assert_eq!(
                    replay(limit, rings, &history, stale_request),
                    [retry(free - stale); 2],
                    "{case}"
                );
                history.push((stale_request, retry(free - stale)));
                assert_eq!(
                    replay(limit, rings, &history, (1, free - 1)),
                    [retry(1); 2],
                    "{case}"
                );
                assert_eq!(
                    replay(limit, rings, &history, (1, free)),
                    [Ok(()); 2],
                    "{case}"
                );
            }
        }
    }
}
