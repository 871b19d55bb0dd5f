//! Observing a limiter: counts of the permits it admitted and denied, read
//! without locks, and (with the `tracing` feature) an event per decision.
//!
//! The user-facing documentation (promise, state, proof) is on [`Counted`].

use crossbeam_utils::CachePadded;

use crate::error::Denied;
use crate::limiter::{Keep, RateLimiter, Rejection, Snapshot};
use crate::refund::{Receipted, Refundable};
use crate::stripe::{MAX_STRIPES, default_stripes};
use crate::sync::thread::thread_slot;
use crate::sync::{AtomicU64, Ordering};

/// One cell of counters. The three on one line: a decision touches one of
/// them, and only the cell's writers write the line.
#[derive(Debug, Default)]
struct Counters {
    admitted: AtomicU64,
    denied: AtomicU64,
    refunded: AtomicU64,
}

/// Which of a cell's counters a count goes to.
#[derive(Clone, Copy)]
enum Counter {
    Admitted,
    Denied,
    Refunded,
}

impl Counters {
    fn counter(&self, counter: Counter) -> &AtomicU64 {
        match counter {
            Counter::Admitted => &self.admitted,
            Counter::Denied => &self.denied,
            Counter::Refunded => &self.refunded,
        }
    }
}

/// A limiter with counters of what it decided.
///
/// It implements [`RateLimiter`] (and [`Refundable`] if the limiter does, so
/// it can be a member of an [`AllOf`](crate::AllOf)), counting every
/// decision made through it.
///
/// ```
/// use tollgate::{AllOf, Counted, Rate, RateLimiter, SlidingLog, TokenBucket};
///
/// let global = Counted::new("global", TokenBucket::new(100, Rate::per_second(100)).unwrap());
/// let logins = Counted::new("logins", SlidingLog::new(Rate::per_hour(1)).unwrap());
/// let login = AllOf::new((&global, &logins));
/// login.try_acquire().unwrap();
/// assert!(login.try_acquire().is_err()); // denied by the log; the bucket refunded
/// assert_eq!(global.counts().admitted, 2);
/// assert_eq!(global.counts().refunded, 1);
/// assert_eq!(logins.counts().denied, 1);
/// ```
///
/// Observing a limiter: counts of the permits it admitted and denied, read
/// without locks, and (with the `tracing` feature) an event per decision.
///
/// [`Counted`] wraps any [`RateLimiter`]. It is opt-in: a limiter that is not
/// wrapped pays nothing, and the counting is this module's alone. Each
/// decision adds its permits to a counter in a cache-padded cell that only
/// the calling thread writes, with a plain load and store (no locked
/// instruction, no cache line traded between cores); a read sums the cells.
/// Cells are held by the first threads to count — twice the machine's
/// parallelism, at least 8, a thread's cell passing to a later thread when
/// it exits — and threads beyond them share one further cell, counted with
/// an atomic add. What it costs is in docs/benchmarks.md ("Counting
/// decisions", "Publishing counts").
///
/// With the `tracing` feature, a `Counted` limiter also emits a `tracing`
/// event for every denial (level `INFO`, with the permits asked, the reason
/// and the retry-after) and for every admission (level `DEBUG`), each carrying
/// the name the limiter was given. Limiters that are not wrapped emit nothing.
///
/// With the `metrics` feature, its `publish` sets the
/// `tollgate_permits_total` counters of the [`metrics`](https://docs.rs/metrics)
/// facade to the sums, labelled with the name, when an exporter's upkeep
/// asks; the decisions stay as above.
///
/// ```
/// use tollgate::{Counted, ManualClock, Rate, RateLimiter, TokenBucket};
///
/// let bucket = TokenBucket::with_clock(3, Rate::per_hour(3), ManualClock::new()).unwrap();
/// let counted = Counted::new("api", bucket);
/// counted.try_acquire_n(2).unwrap();
/// assert!(counted.try_acquire_n(2).is_err());
/// let counts = counted.counts();
/// assert_eq!((counts.admitted, counts.denied), (2, 2));
/// ```
#[derive(Debug)]
pub struct Counted<L> {
    limiter: L,
    name: &'static str,
    /// A cell per thread number ([`thread_slot`]): written only by the
    /// thread holding the number.
    owned: Box<[CachePadded<Counters>]>,
    /// The cell of threads whose number has no cell of its own.
    shared: CachePadded<Counters>,
    /// The facade's counters, registered at the first publish; never
    /// touched by a decision.
    #[cfg(feature = "metrics")]
    published: crate::published::LazyPermitCounters,
}

/// What a [`Counted`] limiter has decided so far, in permits.
///
/// Each figure is exact once the decisions it counts have returned; read
/// while decisions run, the three figures are not one instant's (each is
/// summed over the threads' cells, and may lag a decision in flight).
///
/// ```
/// use tollgate::{Counted, Rate, RateLimiter, TokenBucket};
/// let counted = Counted::new("api", TokenBucket::new(1, Rate::per_hour(1)).unwrap());
/// counted.try_acquire().unwrap();
/// assert_eq!(counted.counts().admitted, 1);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub struct Counts {
    /// Permits admitted.
    pub admitted: u64,
    /// Permits denied (every denial: retry-after, exceeds capacity, zero).
    pub denied: u64,
    /// Permits of admissions handed back to [`Refundable::refund`] (by an
    /// [`AllOf`](crate::AllOf) whose later member denied). A raced refund
    /// gives back less (see [`refund`](crate::Refundable)), so this is what was
    /// asked back, not necessarily what came back.
    pub refunded: u64,
}

impl<L: RateLimiter> Counted<L> {
    /// Wraps `limiter`; `name` labels its `tracing` events and its
    /// published metrics.
    ///
    /// ```
    /// use tollgate::{Counted, FixedWindow, Rate};
    /// let counted = Counted::new("per-minute", FixedWindow::new(Rate::per_minute(60)).unwrap());
    /// assert_eq!(counted.name(), "per-minute");
    /// ```
    pub fn new(name: &'static str, limiter: L) -> Self {
        let owned = (0..Self::owned_cells())
            .map(|_| CachePadded::new(Counters::default()))
            .collect();
        Counted {
            limiter,
            name,
            owned,
            shared: CachePadded::new(Counters::default()),
            #[cfg(feature = "metrics")]
            published: Default::default(),
        }
    }

    /// The limiter inside.
    ///
    /// ```
    /// use tollgate::{Counted, Rate, RateLimiter, TokenBucket};
    /// let counted = Counted::new("api", TokenBucket::new(5, Rate::per_hour(5)).unwrap());
    /// assert_eq!(counted.get_ref().snapshot().capacity, 5);
    /// ```
    pub fn get_ref(&self) -> &L {
        &self.limiter
    }

    /// The name given at construction.
    ///
    /// ```
    /// use tollgate::{Counted, Rate, TokenBucket};
    /// assert_eq!(Counted::new("x", TokenBucket::new(1, Rate::per_hour(1)).unwrap()).name(), "x");
    /// ```
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The counts so far: a sum over the threads' cells, without locks.
    ///
    /// ```
    /// use tollgate::{Counted, Rate, RateLimiter, TokenBucket};
    /// let counted = Counted::new("api", TokenBucket::new(1, Rate::per_hour(1)).unwrap());
    /// assert!(counted.try_acquire_n(0).is_err());
    /// assert_eq!(counted.counts().denied, 0); // a request for 0 denies 0 permits
    /// ```
    pub fn counts(&self) -> Counts {
        let mut counts = Counts::default();
        for cell in self.owned.iter().chain(std::iter::once(&self.shared)) {
            // Relaxed: each counter is a monotonic sum read on its own; no
            // other memory is published through it.
            counts.admitted = counts
                .admitted
                .wrapping_add(cell.admitted.load(Ordering::Relaxed));
            counts.denied = counts
                .denied
                .wrapping_add(cell.denied.load(Ordering::Relaxed));
            counts.refunded = counts
                .refunded
                .wrapping_add(cell.refunded.load(Ordering::Relaxed));
        }
        counts
    }

    /// Publishes the counts to the [`metrics`](https://docs.rs/metrics)
    /// facade (the `metrics` feature): `tollgate_permits_total{limiter,
    /// outcome}` with `limiter` the name given at construction and `outcome`
    /// `admitted`, `denied` or `refunded`, each set to its sum over the
    /// threads' cells. Call it (or [`Published::publish`](crate::Published::publish)
    /// on a list holding this limiter) from the exporter's upkeep, before a
    /// scrape: the decisions themselves touch only those cells, so a shared
    /// counter's cache line never enters the decision path, and the facade's
    /// counters move only when published.
    ///
    /// The counters are registered with the installed recorder at the first
    /// publish and kept. Give each published limiter a name of its own: two
    /// with one name would publish to one series (which would show the larger
    /// of their sums). Refunded permits are also among the admitted ones: the
    /// permits an admission kept are `admitted − refunded`.
    ///
    /// ```
    /// use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    /// use tollgate::{Counted, Rate, RateLimiter, TokenBucket};
    ///
    /// let recorder = DebuggingRecorder::new();
    /// let snapshotter = recorder.snapshotter();
    /// metrics::with_local_recorder(&recorder, || {
    ///     let counted = Counted::new("api", TokenBucket::new(2, Rate::per_hour(2)).unwrap());
    ///     counted.try_acquire_n(2).unwrap();
    ///     assert!(counted.try_acquire().is_err());
    ///     counted.publish();
    /// });
    /// let mut admitted = None;
    /// for (key, _, _, value) in snapshotter.snapshot().into_vec() {
    ///     let key = key.key();
    ///     let outcome = key.labels().find(|l| l.key() == "outcome").unwrap().value().to_owned();
    ///     assert_eq!(key.name(), "tollgate_permits_total");
    ///     if outcome == "admitted" {
    ///         admitted = Some(value);
    ///     }
    /// }
    /// assert_eq!(admitted, Some(DebugValue::Counter(2)));
    /// ```
    #[cfg(feature = "metrics")]
    pub fn publish(&self) {
        let counts = self.counts();
        self.published
            .get(self.name)
            .set(counts.admitted, counts.denied, counts.refunded);
    }

    /// How many threads count in cells of their own: enough for every core
    /// twice over (a service's workers and the threads beside them), and
    /// never so few that a small machine's handful of threads share.
    fn owned_cells() -> usize {
        (2 * default_stripes()).clamp(8, MAX_STRIPES)
    }

    /// Adds `n` to the calling thread's `counter`.
    #[inline]
    fn add(&self, counter: Counter, n: u32) {
        let slot = thread_slot();
        let slot = if crate::sync::fault::injected(crate::sync::fault::Fault::SharedCountCell) {
            Some(0)
        } else {
            slot
        };
        match slot.and_then(|slot| self.owned.get(slot)) {
            Some(cell) => {
                // A load and a store, not an atomic add: no other thread
                // writes this cell while this one holds its number
                // (`thread_slot`), so nothing can land between the two, and
                // the number's hand-over orders a previous holder's last
                // store before this load. Relaxed: a count publishes no
                // other memory; readers only sum. Wrapping: 2^64 permits are
                // never reached, and a count must not panic.
                let counter = cell.counter(counter);
                counter.store(
                    counter.load(Ordering::Relaxed).wrapping_add(u64::from(n)),
                    Ordering::Relaxed,
                );
            }
            None => {
                // Several threads write the shared cell: an atomic add.
                // Relaxed: as above, a count orders nothing.
                self.shared
                    .counter(counter)
                    .fetch_add(u64::from(n), Ordering::Relaxed);
            }
        }
    }

    #[inline]
    fn count_admitted(&self, n: u32) {
        self.add(Counter::Admitted, n);
        #[cfg(feature = "tracing")]
        tracing::debug!(limiter = self.name, permits = n, "admitted");
    }

    #[inline]
    fn count_denied(&self, n: u32, denied: &Denied) {
        self.add(Counter::Denied, n);
        #[cfg(feature = "tracing")]
        tracing::info!(
            limiter = self.name,
            permits = n,
            retry_after = ?denied.retry_after(),
            reason = %denied,
            "denied"
        );
        #[cfg(not(feature = "tracing"))]
        let _ = denied;
    }

    #[inline]
    fn count<T>(&self, n: u32, outcome: Result<T, Denied>) -> Result<T, Denied> {
        match &outcome {
            Ok(_) => self.count_admitted(n),
            Err(denied) => self.count_denied(n, denied),
        }
        outcome
    }

    /// As `count`, for an answer that reports the limiter's state.
    #[inline]
    fn count_reported<T>(&self, n: u32, answer: &Result<T, Rejection>) {
        match answer {
            Ok(_) => self.count_admitted(n),
            Err(rejection) => self.count_denied(n, &rejection.denied),
        }
    }
}

impl<L: RateLimiter> RateLimiter for Counted<L> {
    #[inline]
    fn try_acquire_n(&self, n: u32) -> Result<(), Denied> {
        self.count(n, self.limiter.try_acquire_n(n))
    }

    fn snapshot(&self) -> Snapshot {
        self.limiter.snapshot()
    }

    #[inline]
    fn try_acquire_n_with_snapshot(&self, n: u32) -> Result<Snapshot, Rejection> {
        let outcome = self.limiter.try_acquire_n_with_snapshot(n);
        self.count_reported(n, &outcome);
        outcome
    }

    /// Counts the decision, and an admission that `keep` turns down as
    /// [`Counts::refunded`]: asked back, whatever the inner limiter can give
    /// (a limiter that is not [`Refundable`] keeps the permits).
    #[inline]
    fn try_acquire_n_then(&self, n: u32, keep: Keep<'_>) -> bool {
        self.limiter.try_acquire_n_then(n, &mut |answer| {
            let admitted = answer.is_ok();
            self.count_reported(n, &answer);
            let kept = keep(answer);
            if admitted && !kept {
                self.add(Counter::Refunded, n);
            }
            kept
        })
    }
}

/// The receipt of a [`Counted`] limiter's refundable admission: the
/// limiter's own, and the permits it took (for [`Counts::refunded`]).
#[derive(Debug)]
pub struct CountedReceipt<R> {
    receipt: R,
    permits: u32,
}

impl<L: Refundable> Refundable for Counted<L> {
    type Receipt<'a>
        = CountedReceipt<L::Receipt<'a>>
    where
        Self: 'a;

    #[inline]
    fn try_acquire_n_refundable(&self, n: u32) -> Result<Receipted<Self::Receipt<'_>>, Rejection> {
        let answer = self.limiter.try_acquire_n_refundable(n);
        self.count_reported(n, &answer);
        answer.map(|admitted| {
            Receipted::new(
                admitted.snapshot,
                CountedReceipt {
                    receipt: admitted.receipt,
                    permits: n,
                },
            )
        })
    }

    #[inline]
    fn try_acquire_n_receipt(&self, n: u32) -> Result<Self::Receipt<'_>, Denied> {
        let receipt = self.count(n, self.limiter.try_acquire_n_receipt(n))?;
        Ok(CountedReceipt {
            receipt,
            permits: n,
        })
    }

    fn refund<'a>(&'a self, receipt: Self::Receipt<'a>) {
        self.add(Counter::Refunded, receipt.permits);
        #[cfg(feature = "tracing")]
        tracing::debug!(limiter = self.name, permits = receipt.permits, "refunded");
        self.limiter.refund(receipt.receipt);
    }
}

impl<L: RateLimiter> crate::waiting::RetryAcquire for Counted<L> {}

/// [`Counted::publish`], for a [`Published`](crate::Published) list.
#[cfg(feature = "metrics")]
impl<L: RateLimiter + Send + Sync> crate::published::Publish for Counted<L> {
    fn publish(&self) {
        Counted::publish(self);
    }
}
