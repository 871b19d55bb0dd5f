//! Runtime reconfiguration: a configuration record behind a pointer that
//! requests read without a lock, states carried over to the new record one by
//! one, and [`Tunable`], a direct limiter built on it.
//!
//! The user-facing documentation is on [`Tunable`].

use std::convert::Infallible;
use std::fmt;

use super::answer::{Answer, Plain, Reported, ask};
use super::{Carry, Keyable, TAG, View};
use crate::clock::MonotonicClock;
use crate::error::Denied;
use crate::limiter::{RateLimiter, Rejection, Snapshot};
use crate::sync::{AtomicU64, Ordering, Shared, pin};
use crate::timeline::Timeline;

/// One configuration in force: see the module docs.
#[derive(Debug)]
pub(crate) struct Record<G> {
    pub(crate) current: G,
    pub(crate) previous: G,
    pub(crate) carry: Carry,
    /// `0` or [`TAG`]: the tag of states written under `current`.
    pub(crate) tag: u64,
    /// Non-zero once every state has been carried over to `current`. Only the
    /// keyed default uses it: its states cannot all be settled in one CAS.
    pub(crate) complete: AtomicU64,
}

impl<G: Clone> Record<G> {
    pub(crate) fn first(config: G) -> Self {
        Record {
            current: config.clone(),
            previous: config,
            carry: Carry::Reset,
            tag: 0,
            complete: AtomicU64::new(1),
        }
    }

    pub(crate) fn next(&self, config: G, carry: Carry) -> Self {
        Record {
            previous: self.current.clone(),
            current: config,
            carry,
            tag: self.tag ^ TAG,
            complete: AtomicU64::new(0),
        }
    }

    pub(crate) fn view<'a>(&'a self, still_current: &'a dyn Fn() -> bool) -> View<'a, G> {
        View {
            current: &self.current,
            previous: &self.previous,
            carry: self.carry,
            tag: self.tag,
            still_current,
        }
    }

    pub(crate) fn is_complete(&self) -> bool {
        // Acquire: pairs with `mark_complete`, so the settled states are seen
        // settled by whoever goes on to publish a successor.
        self.complete.load(Ordering::Acquire) != 0
    }

    pub(crate) fn mark_complete(&self) {
        // Release: see `is_complete`.
        self.complete.store(1, Ordering::Release);
    }
}

/// Runs `f` under the current record of `shared` until it answers (`Some`)
/// for a record that was still current; `None` means the state has moved past
/// the record (a stale view), and `f` runs again on the newer one.
///
/// # Safety
///
/// As [`Shared::load_unprotected`]: the caller keeps loaded records alive.
#[inline]
pub(crate) unsafe fn read<G: Clone, R>(
    shared: &Shared<Record<G>>,
    mut f: impl FnMut(&View<'_, G>) -> Option<R>,
) -> R {
    loop {
        // SAFETY: the caller's guarantee.
        let record = unsafe { shared.load_unprotected() };
        let still_current = || shared.is_current(record);
        if let Some(r) = f(&record.view(&still_current)) {
            return r;
        }
    }
}

/// One reconfigurable state: a record and the state it governs. The body of
/// [`Tunable`] and of each per-key override in [`Keyed`](crate::keyed::Keyed).
pub(crate) struct Slot<L: Keyable> {
    record: Shared<Record<L::Config>>,
    state: L::State,
}

impl<L: Keyable> Slot<L> {
    pub(crate) fn new(config: L::Config) -> Self {
        Slot {
            record: Shared::new(Record::first(config)),
            state: L::fresh(0),
        }
    }

    pub(crate) fn config(&self) -> L::Config {
        let guard = pin();
        self.record.load(&guard).current.clone()
    }

    #[inline]
    pub(crate) fn answer<A: Answer<L>>(
        &self,
        now: u64,
        n: u32,
        answer: A,
    ) -> Result<A::Admitted, A::Denied> {
        let _guard = pin();
        // SAFETY: pinned for the whole call.
        unsafe {
            read(&self.record, |view| {
                ask(answer, view, &self.state, now, n).ok()
            })
        }
    }

    pub(crate) fn snapshot(&self, now: u64) -> Snapshot {
        let _guard = pin();
        // SAFETY: pinned for the whole call.
        unsafe { read(&self.record, |view| L::snapshot(view, &self.state, now)) }
    }

    /// Replaces the configuration and carries the state over; lock-free (a
    /// racing reconfiguration is helped, then retried after).
    pub(crate) fn reconfigure(&self, config: L::Config, carry: Carry, now: u64) {
        let guard = pin();
        // The epoch pointers' one loop (`Shared::update`): a lost race
        // decides again on the newer record.
        let Ok((record, published)) = self.record.update(&guard, |record| {
            let still_current = || self.record.is_current(record);
            // Step 1: nothing may still carry the tag of the record before
            // `record` once its successor is out (see the module docs).
            // `false` only if the view is stale: `record` was replaced, the
            // CAS fails and the newer record is decided on.
            L::settle(&record.view(&still_current), &self.state, now);
            Ok::<_, Infallible>(record.next(config.clone(), carry))
        });
        // SAFETY: replaced by us just now; every reader pins.
        unsafe { self.record.retire(record, &guard) };
        let still_current = || self.record.is_current(published);
        // If a newer record is already out, its publisher settled us.
        L::settle(&published.view(&still_current), &self.state, now);
    }
}

impl<L: Keyable> fmt::Debug for Slot<L>
where
    L::Config: fmt::Debug,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Slot")
            .field("config", &self.config())
            .finish_non_exhaustive()
    }
}

/// A direct limiter whose configuration can be replaced while it runs, without
/// a lock: [`TokenBucket`](crate::TokenBucket), [`FixedWindow`](crate::FixedWindow),
/// the [`LeakyBucket`](crate::LeakyBucket) meter, the [`Shaper`](crate::Shaper),
/// [`WarmUp`](crate::WarmUp), the [`SlidingLog`](crate::SlidingLog), their
/// twins or a combination of them, behind an epoch-protected
/// configuration record.
///
/// It makes the same decisions as the fixed limiter it wraps, plus a
/// crossbeam-epoch pin per request (about 8 ns here); choose the plain limiter
/// when the limit never changes. [`reconfigure`](Tunable::reconfigure) carries
/// the current state over with a [`Carry`] strategy. What a request racing a
/// reconfiguration sees is described below: it is decided under a
/// configuration in force at some instant during the call.
///
/// ```
/// use std::time::Duration;
/// use tollgate::keyed::{BucketConfig, Carry, Tunable};
/// use tollgate::{Denied, ManualClock, Rate, RateLimiter, TokenBucket};
///
/// let clock = ManualClock::new();
/// let api = Tunable::<TokenBucket<ManualClock>>::with_clock(
///     BucketConfig::new(2, Rate::per_second(2)).unwrap(),
///     clock.clone(),
/// );
/// api.try_acquire_n(2).unwrap();
/// assert_eq!(api.try_acquire(), Err(Denied::RetryAfter(Duration::from_millis(500))));
/// // Double the rate; the empty bucket stays empty, but refills twice as fast.
/// api.reconfigure(BucketConfig::new(4, Rate::per_second(4)).unwrap(), Carry::Proportional);
/// assert_eq!(api.try_acquire(), Err(Denied::RetryAfter(Duration::from_millis(250))));
/// ```
///
/// Runtime reconfiguration: a configuration record behind a pointer that
/// requests read without a lock, states carried over to the new record one by
/// one, and [`Tunable`], a direct limiter built on it.
///
/// # The protocol
///
/// A `Record` holds the configuration in force, the one before it, the
/// [`Carry`] strategy between them, and a one-bit *tag*. Every state word keeps
/// the tag of the record it was last written under (bit 63, free in every
/// one-word machine). A reconfiguration:
///
/// 1. makes sure every state carries the current record's tag (it *settles*
///    them: carries over any that still has the previous tag);
/// 2. publishes a new record — new configuration, `previous` = the old current
///    one, tag flipped — by compare-and-swap on the pointer (Release);
/// 3. settles the states again, now to the new record.
///
/// A request loads the record (Acquire), then the state. If the tags match, it
/// decides under the record and writes with a CAS, as a fixed limiter would. If
/// they differ, either the state is stale — written before this record was
/// published, not yet carried over — and the request carries it over and
/// decides in the same CAS (Release); or another thread has already carried it
/// over to a *newer* record than this request's, which the request detects by
/// reloading the pointer, and it retries with the newer record. Step 1 is what
/// makes one bit enough: a record is never published while any state still
/// has the tag of two records back.
///
/// So each state's history is a run of decisions under one configuration, one
/// carry-over, a run under the next; no request waits for a reconfiguration,
/// and reconfigurations never wait for requests (a racing reconfiguration is
/// helped along, not waited for).
///
/// What a request may observe, exactly:
///
/// * **Keys of a [`Keyed`](crate::keyed::Keyed) map** are linearizable: a request
///   holds its shard's read lock from loading the record to its CAS, and a
///   reconfiguration carries the keys over under each shard's write lock, so
///   every request happens wholly before or wholly after its key's carry-over,
///   and a second reconfiguration cannot start until the first has visited
///   every shard. The stress test `tests/integration/keyed_reconfig.rs` checks every key's
///   final state against the sequential histories.
/// * **[`Tunable`], per-key overrides and the overflow state** are lock-free
///   all the way, and linearizable as long as no single request spans *two*
///   complete reconfigurations: the loom models in
///   `loom-tests/tests/reconfigure.rs` check exactly that. A request that stalls
///   (is preempted) between loading the record and its CAS while two
///   reconfigurations complete can find the state carrying its own tag again —
///   one bit cannot tell "current" from "two back" — and is then decided under
///   the configuration it loaded: one that was in force at some instant during
///   the call, applied once, to the state as it then is. Nothing else is
///   affected; the next request uses the newest configuration.
///
/// # Reclamation
///
/// Records are freed through crossbeam-epoch: a request pins the epoch, and a
/// replaced record is destroyed once every thread pinned before the replacement
/// has unpinned. [`Keyed`](crate::keyed::Keyed) avoids the pin on its hot path: it
/// reads its default record only while holding a lock on one of its map's
/// shards, and its reconfiguration takes every shard's write lock after
/// publishing (it has to visit every key anyway) before it retires the old
/// record — the shard locks serve as the grace period.
///
/// The pointer is the sync facade's epoch-protected `Shared`; under
/// `--cfg loom` it is a loom `AtomicPtr` whose replaced values are kept until
/// it drops: the models check the protocol above with every access visible to
/// loom; reclamation is crossbeam-epoch's.
pub struct Tunable<L: Keyable> {
    slot: Slot<L>,
    timeline: Timeline<L::Clock>,
}

impl<L: Keyable<Clock = MonotonicClock>> Tunable<L> {
    /// A limiter configured by `config`, on the default [`MonotonicClock`].
    ///
    /// ```
    /// use tollgate::keyed::{BucketConfig, Tunable};
    /// use tollgate::{Rate, RateLimiter, TokenBucket};
    ///
    /// let limiter = Tunable::<TokenBucket>::new(BucketConfig::new(10, Rate::per_second(10)).unwrap());
    /// assert!(limiter.try_acquire().is_ok());
    /// ```
    pub fn new(config: L::Config) -> Self {
        Self::with_clock(config, MonotonicClock::new())
    }
}

impl<L: Keyable> Tunable<L> {
    /// A limiter configured by `config`, reading `clock`.
    ///
    /// ```
    /// use tollgate::keyed::{Tunable, WindowConfig};
    /// use tollgate::{FixedWindow, ManualClock, Rate};
    ///
    /// let cfg = WindowConfig::new(Rate::per_minute(100)).unwrap();
    /// let limiter = Tunable::<FixedWindow<ManualClock>>::with_clock(cfg, ManualClock::new());
    /// assert_eq!(limiter.config(), cfg);
    /// ```
    pub fn with_clock(config: L::Config, clock: L::Clock) -> Self {
        Tunable {
            slot: Slot::new(config),
            timeline: Timeline::new(clock),
        }
    }

    /// The configuration in force.
    ///
    /// ```
    /// use tollgate::keyed::{BucketConfig, Tunable};
    /// use tollgate::{Rate, TokenBucket};
    ///
    /// let cfg = BucketConfig::new(10, Rate::per_second(10)).unwrap();
    /// assert_eq!(Tunable::<TokenBucket>::new(cfg).config(), cfg);
    /// ```
    pub fn config(&self) -> L::Config {
        self.slot.config()
    }

    /// Replaces the configuration, carrying the current state over as `carry`
    /// says. Lock-free: requests never wait for it, and it never waits for
    /// requests. When it returns, every later request is decided under `config`
    /// (or a later one).
    ///
    /// ```
    /// use tollgate::keyed::{Carry, Tunable, WindowConfig};
    /// use tollgate::{FixedWindow, Rate, RateLimiter};
    ///
    /// let limiter = Tunable::<FixedWindow>::new(WindowConfig::new(Rate::per_hour(1)).unwrap());
    /// limiter.try_acquire().unwrap();
    /// assert!(limiter.try_acquire().is_err());
    /// limiter.reconfigure(WindowConfig::new(Rate::per_hour(3)).unwrap(), Carry::Additive);
    /// assert!(limiter.try_acquire_n(2).is_ok());
    /// ```
    pub fn reconfigure(&self, config: L::Config, carry: Carry) {
        self.slot.reconfigure(config, carry, self.timeline.now());
    }

    /// The clock this limiter reads.
    ///
    /// ```
    /// use tollgate::keyed::{BucketConfig, Tunable};
    /// use tollgate::{Clock, ManualClock, Rate, TokenBucket};
    ///
    /// let clock = ManualClock::new();
    /// let cfg = BucketConfig::new(1, Rate::per_second(1)).unwrap();
    /// let limiter = Tunable::<TokenBucket<ManualClock>>::with_clock(cfg, clock.clone());
    /// clock.set(5);
    /// assert_eq!(limiter.clock().now(), 5);
    /// ```
    pub fn clock(&self) -> &L::Clock {
        self.timeline.clock()
    }
}

impl<L: Keyable> RateLimiter for Tunable<L> {
    #[inline]
    fn try_acquire_n(&self, n: u32) -> Result<(), Denied> {
        self.slot.answer(self.timeline.now(), n, Plain)
    }

    fn snapshot(&self) -> Snapshot {
        self.slot.snapshot(self.timeline.now())
    }

    /// An admission's snapshot is of the word its compare-and-swap wrote; a
    /// denial's, of the state read right after it (a denial writes nothing).
    fn try_acquire_n_with_snapshot(&self, n: u32) -> Result<Snapshot, Rejection> {
        self.slot.answer(self.timeline.now(), n, Reported)
    }
}

impl<L: Keyable> fmt::Debug for Tunable<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tunable")
            .field("config", &self.slot.config())
            .finish_non_exhaustive()
    }
}
