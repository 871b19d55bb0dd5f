//! The adaptive concurrency limit: a [`ConcurrencyLimit`] whose limit a
//! [`LimitAlgorithm`] moves from what each permit reports when it ends.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::history::LimitHistory;
use super::{LimitAlgorithm, Outcome, Sample};
use crate::clock::{Clock, MonotonicClock};
use crate::concurrency::{ConcurrencyLimit, OwnedPermit, Permit};
use crate::error::ConfigError;
use crate::sync::fault::{Fault, injected};

/// A concurrency limit that finds a service's capacity by itself: at most
/// [`limit`](Self::limit) permits at once, the limit moved by an algorithm
/// ([`Aimd`](crate::Aimd), [`Vegas`](crate::Vegas),
/// [`Gradient2`](crate::Gradient2), each optionally
/// [`Windowed`](crate::Windowed)) from the latency and outcome each permit
/// reports when it ends.
///
/// A permit is an [`AdaptivePermit`]: end it with
/// [`success`](AdaptivePermit::success) (its latency, from grant to now on
/// this limiter's clock, is a sample), [`dropped`](AdaptivePermit::dropped)
/// (the work failed from overload: a timeout, a 503, a refused connection)
/// or [`ignore`](AdaptivePermit::ignore) (it says nothing about capacity: a
/// client error, a cancelled call). A permit dropped without any of them is
/// ignored: work abandoned half-way tells nothing about the service.
///
/// Guarantees: those of [`ConcurrencyLimit`] at every instant (never more in
/// flight than the limit in force when each was granted; a smaller limit
/// revokes nothing and admits nobody until releases bring the count under
/// it), with the limit always within the algorithm's `[min, max]`. Samples
/// that race are each counted once by the algorithm (see
/// [`LimitAlgorithm`]); when two releases race to apply their new limits,
/// the one that applies last re-reads the algorithm until what it applied
/// is current, so once releases stop the gate's limit is the algorithm's.
/// No lock is taken on the acquire or release path unless a thread waits.
///
/// Latency is read on the limiter's [`Clock`]: with a
/// [`ManualClock`](crate::ManualClock) a simulation runs in virtual time.
///
/// ```
/// use std::time::Duration;
/// use tollgate::{AdaptiveLimit, Aimd, Clock, ManualClock};
///
/// let clock = ManualClock::new();
/// let aimd = Aimd::builder().min_limit(1).initial_limit(2).build()?;
/// let limit = AdaptiveLimit::with_clock(aimd, clock.clone())?;
///
/// let first = limit.try_acquire().unwrap();
/// let second = limit.try_acquire().unwrap();
/// assert!(limit.try_acquire().is_none()); // 2 in flight, limit 2
///
/// clock.advance(Duration::from_millis(20));
/// first.success(); // a fast success with the limit in use: one more
/// assert_eq!(limit.limit(), 3);
/// second.dropped(); // overload: back off by the ratio
/// assert_eq!(limit.limit(), 2);
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
pub struct AdaptiveLimit<A, C = MonotonicClock> {
    gate: Arc<ConcurrencyLimit>,
    algorithm: A,
    clock: C,
    name: Option<&'static str>,
    /// The facade's handles (a named limit's only), registered at the first
    /// sample or publish.
    #[cfg(feature = "metrics")]
    metrics: crate::published::LazyAdaptiveMetrics,
}

impl<A: LimitAlgorithm> AdaptiveLimit<A> {
    /// A limit starting at the algorithm's current limit, timing permits on
    /// the default [`MonotonicClock`].
    ///
    /// Errors: none from tollgate's algorithms, whose limits are validated
    /// when built; [`ConfigError::InvalidConcurrencyLimit`] for an
    /// algorithm of one's own whose limit is 0 or above
    /// [`ConcurrencyLimit::MAX_LIMIT`].
    ///
    /// ```
    /// use tollgate::{AdaptiveLimit, Gradient2, Windowed};
    /// let limit = AdaptiveLimit::new(Windowed::builder().build(Gradient2::builder().build()?)?)?;
    /// assert_eq!(limit.limit(), 20);
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn new(algorithm: A) -> Result<Self, ConfigError> {
        Self::with_clock(algorithm, MonotonicClock::new())
    }
}

impl<A: LimitAlgorithm, C: Clock> AdaptiveLimit<A, C> {
    /// As [`new`](Self::new), timing permits on `clock`.
    ///
    /// ```
    /// use tollgate::{AdaptiveLimit, Aimd, ManualClock};
    /// let limit = AdaptiveLimit::with_clock(Aimd::builder().build()?, ManualClock::new())?;
    /// assert_eq!(limit.in_flight(), 0);
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn with_clock(algorithm: A, clock: C) -> Result<Self, ConfigError> {
        let gate = Arc::new(ConcurrencyLimit::new(algorithm.limit())?);
        Ok(AdaptiveLimit {
            gate,
            algorithm,
            clock,
            name: None,
            #[cfg(feature = "metrics")]
            metrics: Default::default(),
        })
    }

    /// This limit, named: with the `metrics` feature, the name labels the
    /// metrics it reports through the [`metrics`](https://docs.rs/metrics)
    /// facade (`limiter="…"`). A limit without a name reports nothing.
    ///
    /// | metric | kind | when |
    /// |---|---|---|
    /// | `tollgate_adaptive_samples_total{limiter, outcome}` | counter | each permit's end: `outcome` as the permit reported it, `success`, `dropped` or `ignored` (a permit dropped unended is `ignored`) |
    /// | `tollgate_adaptive_limit{limiter}` | gauge | each change of the limit, and when published |
    /// | `tollgate_adaptive_in_flight{limiter}` | gauge | when published |
    /// | `tollgate_adaptive_limit_changes_total{limiter}` | counter | when published: the changes the algorithm's [`history`](Self::history) has counted |
    ///
    /// "When published" is at each `publish` (the limit's own, or that of a
    /// `Published` list holding it), which an exporter's upkeep calls before
    /// a scrape. The handles are registered with the installed recorder at
    /// the first sample or publish, and kept; acquiring a permit touches
    /// none of them. Give each named limit a name of its own.
    ///
    /// ```
    /// use tollgate::{AdaptiveLimit, Aimd};
    /// let limit = AdaptiveLimit::new(Aimd::builder().build()?)?.named("backend");
    /// assert_eq!(limit.name(), Some("backend"));
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn named(mut self, name: &'static str) -> Self {
        self.name = Some(name);
        self
    }

    /// The name given by [`named`](Self::named), if any.
    pub fn name(&self) -> Option<&'static str> {
        self.name
    }

    /// Publishes this limit's gauges and its changes counter to the
    /// [`metrics`](https://docs.rs/metrics) facade (the `metrics` feature;
    /// see [`named`](Self::named) for the metrics): from the exporter's
    /// upkeep, before a scrape. A limit without a name publishes nothing.
    ///
    /// ```
    /// use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    /// use tollgate::{AdaptiveLimit, Aimd};
    ///
    /// let recorder = DebuggingRecorder::new();
    /// let snapshotter = recorder.snapshotter();
    /// metrics::with_local_recorder(&recorder, || {
    ///     let aimd = Aimd::builder().min_limit(1).initial_limit(4).build().unwrap();
    ///     let limit = AdaptiveLimit::new(aimd).unwrap().named("backend");
    ///     let _held = limit.try_acquire().unwrap();
    ///     limit.publish();
    /// });
    /// let in_flight = snapshotter.snapshot().into_vec().into_iter().find_map(|(key, _, _, value)| {
    ///     (key.key().name() == "tollgate_adaptive_in_flight").then_some(value)
    /// });
    /// assert_eq!(in_flight, Some(DebugValue::Gauge(1.0.into())));
    /// ```
    #[cfg(feature = "metrics")]
    pub fn publish(&self) {
        if let Some(metrics) = self.metrics() {
            let (limit, in_flight, changes) = self.readings();
            metrics.publish(limit, in_flight, changes);
        }
    }

    /// A named limit's handles, registered at the first call.
    #[cfg(feature = "metrics")]
    fn metrics(&self) -> Option<&crate::published::AdaptiveMetrics> {
        let name = self.name?;
        Some(self.metrics.get(name, || self.readings()))
    }

    /// What the gauges and the changes counter show: the limit, what is in
    /// flight, the changes the history counted.
    #[cfg(feature = "metrics")]
    fn readings(&self) -> (u32, u32, Option<u64>) {
        let changes = self.algorithm.history().map(LimitHistory::changes);
        (self.gate.limit(), self.gate.in_flight(), changes)
    }

    /// A permit if fewer than the limit are in flight; `None` (and nothing
    /// changed) otherwise.
    ///
    /// ```
    /// use tollgate::{AdaptiveLimit, Aimd};
    /// let limit = AdaptiveLimit::new(Aimd::builder().min_limit(1).initial_limit(1).build()?)?;
    /// let permit = limit.try_acquire().unwrap();
    /// assert!(limit.try_acquire().is_none());
    /// permit.ignore();
    /// assert!(limit.try_acquire().is_some());
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn try_acquire(&self) -> Option<AdaptivePermit<'_, A, C>> {
        self.gate.try_acquire().map(|permit| self.permit(permit))
    }

    /// As [`try_acquire`](Self::try_acquire), a permit that holds an [`Arc`]
    /// of the limit, for work that moves across tasks or threads.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tollgate::{AdaptiveLimit, Aimd};
    /// let limit = Arc::new(AdaptiveLimit::new(Aimd::builder().build()?)?);
    /// let permit = limit.try_acquire_owned().unwrap();
    /// std::thread::spawn(move || permit.success()).join().unwrap();
    /// assert_eq!(limit.in_flight(), 0);
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn try_acquire_owned(self: &Arc<Self>) -> Option<OwnedAdaptivePermit<A, C>> {
        let permit = self.gate.try_acquire_owned()?;
        Some(OwnedAdaptivePermit {
            started: self.started(permit.granted_in_flight()),
            permit: Some(permit),
            limit: Arc::clone(self),
        })
    }

    /// Blocks the calling thread until a permit is free or `timeout` has
    /// passed (then `None`, holding nothing). The wait is not part of the
    /// permit's latency: it is timed from its grant.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{AdaptiveLimit, Aimd};
    /// let limit = AdaptiveLimit::new(Aimd::builder().min_limit(1).initial_limit(1).build()?)?;
    /// let _held = limit.try_acquire().unwrap();
    /// assert!(limit.acquire_timeout(Duration::from_millis(1)).is_none());
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn acquire_timeout(&self, timeout: Duration) -> Option<AdaptivePermit<'_, A, C>> {
        self.gate
            .acquire_timeout(timeout)
            .map(|permit| self.permit(permit))
    }

    /// Waits, on any executor, until a permit is free. Cancel-safe: a future
    /// dropped before it completes holds nothing and passes on any wake-up it
    /// was given.
    ///
    /// ```
    /// use tollgate::{AdaptiveLimit, Aimd};
    /// # let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    /// # rt.block_on(async {
    /// let limit = AdaptiveLimit::new(Aimd::builder().build()?)?;
    /// let permit = limit.acquire_async().await;
    /// permit.success();
    /// # Ok::<(), tollgate::ConfigError>(())
    /// # }).unwrap();
    /// ```
    pub async fn acquire_async(&self) -> AdaptivePermit<'_, A, C> {
        let permit = self.gate.acquire_async().await;
        self.permit(permit)
    }

    /// As [`acquire_async`](Self::acquire_async), for an owned permit.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tollgate::{AdaptiveLimit, Aimd};
    /// # let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    /// # rt.block_on(async {
    /// let limit = Arc::new(AdaptiveLimit::new(Aimd::builder().build()?)?);
    /// let permit = Arc::clone(&limit).acquire_owned_async().await;
    /// permit.dropped();
    /// # Ok::<(), tollgate::ConfigError>(())
    /// # }).unwrap();
    /// ```
    pub async fn acquire_owned_async(self: Arc<Self>) -> OwnedAdaptivePermit<A, C> {
        let permit = Arc::clone(&self.gate).acquire_owned_async().await;
        OwnedAdaptivePermit {
            started: self.started(permit.granted_in_flight()),
            permit: Some(permit),
            limit: self,
        }
    }

    /// Waits on tokio's timer until a permit is free or `timeout` has passed
    /// (then `None`, holding nothing). Cancel-safe, as
    /// [`acquire_async`](Self::acquire_async).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{AdaptiveLimit, Aimd};
    /// # let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
    /// # rt.block_on(async {
    /// let limit = AdaptiveLimit::new(Aimd::builder().min_limit(1).initial_limit(1).build()?)?;
    /// let _held = limit.try_acquire().unwrap();
    /// assert!(limit.acquire_timeout_async(Duration::from_millis(1)).await.is_none());
    /// # Ok::<(), tollgate::ConfigError>(())
    /// # }).unwrap();
    /// ```
    #[cfg(feature = "tokio")]
    pub async fn acquire_timeout_async(
        &self,
        timeout: Duration,
    ) -> Option<AdaptivePermit<'_, A, C>> {
        let permit = self.gate.acquire_timeout_async(timeout).await?;
        Some(self.permit(permit))
    }

    /// The limit in force: what the algorithm last decided, once the release
    /// that changed it has applied it.
    pub fn limit(&self) -> u32 {
        self.gate.limit()
    }

    /// Permits held now.
    pub fn in_flight(&self) -> u32 {
        self.gate.in_flight()
    }

    /// The algorithm, for its own readings (bounds, estimates).
    pub fn algorithm(&self) -> &A {
        &self.algorithm
    }

    /// The limit's recent changes, for dashboards (see [`LimitHistory`]).
    ///
    /// ```
    /// use tollgate::{AdaptiveLimit, Aimd};
    /// let limit = AdaptiveLimit::new(Aimd::builder().min_limit(1).initial_limit(4).build()?)?;
    /// limit.try_acquire().unwrap().dropped();
    /// let last = limit.history().unwrap().last().unwrap();
    /// assert_eq!(last.limit, 3);
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn history(&self) -> Option<&LimitHistory> {
        self.algorithm.history()
    }

    /// The clock permits are timed on.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    fn permit<'a>(&'a self, permit: Permit<'a>) -> AdaptivePermit<'a, A, C> {
        AdaptivePermit {
            started: self.started(permit.granted_in_flight()),
            permit: Some(permit),
            limit: self,
        }
    }

    fn started(&self, in_flight: u32) -> Started {
        Started {
            at: self.clock.now(),
            in_flight,
        }
    }

    /// Feeds the algorithm a finished permit's sample and makes the gate
    /// follow any change, before the permit goes back (so that a smaller
    /// limit is in force before its release can admit a waiter).
    fn finish(&self, started: Started, outcome: Outcome) {
        #[cfg(feature = "metrics")]
        let metrics = self.metrics();
        #[cfg(feature = "metrics")]
        if let Some(metrics) = metrics {
            metrics.sample(outcome.label());
        }
        if outcome == Outcome::Ignored {
            return;
        }
        let now = self.clock.now();
        let sample = Sample {
            rtt_ns: now.saturating_sub(started.at),
            in_flight: started.in_flight,
            outcome,
        };
        if self.algorithm.on_sample(sample, now).is_some() {
            self.follow();
            #[cfg(feature = "metrics")]
            if let Some(metrics) = metrics {
                metrics.limit(self.gate.limit());
            }
        }
    }

    /// Copies the algorithm's limit to the gate until what was copied is
    /// still the algorithm's. Two releases may learn of their changes in one
    /// order and copy them in the other; the one that copies last sees on
    /// its re-read that the algorithm has moved on (if it has) and copies
    /// again, so after the last release the gate holds the algorithm's limit.
    /// It loops only while other releases keep changing the limit, each of
    /// which is progress.
    fn follow(&self) {
        loop {
            let limit = self.algorithm.limit();
            // The algorithm's limits are within `[1, MAX_ADAPTIVE_LIMIT]`,
            // which the gate accepts; one of the user's own that is not is
            // ignored (the gate keeps its limit) rather than a panic here.
            let _ = self.gate.set_limit(limit);
            if injected(Fault::Unfollowed) {
                // The known-bad copy: once, without the re-read.
                return;
            }
            if self.algorithm.limit() == limit {
                return;
            }
        }
    }
}

impl<A: fmt::Debug, C> fmt::Debug for AdaptiveLimit<A, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdaptiveLimit")
            .field("name", &self.name)
            .field("limit", &self.gate.limit())
            .field("in_flight", &self.gate.in_flight())
            .field("algorithm", &self.algorithm)
            .finish()
    }
}

/// [`AdaptiveLimit::publish`], for a [`Published`](crate::Published) list.
#[cfg(feature = "metrics")]
impl<A: LimitAlgorithm, C: Clock + Send + Sync> crate::published::Publish for AdaptiveLimit<A, C> {
    fn publish(&self) {
        AdaptiveLimit::publish(self);
    }
}

/// When a permit was granted and with how many in flight (itself included).
#[derive(Debug, Clone, Copy)]
struct Started {
    at: u64,
    in_flight: u32,
}

/// A permit of an [`AdaptiveLimit`]: end it with
/// [`success`](Self::success), [`dropped`](Self::dropped) or
/// [`ignore`](Self::ignore); dropped without one, it is ignored.
#[must_use = "a permit is given back as soon as it is dropped, and says nothing to the algorithm"]
pub struct AdaptivePermit<'a, A: LimitAlgorithm, C: Clock = MonotonicClock> {
    limit: &'a AdaptiveLimit<A, C>,
    started: Started,
    // `None` once given back: `record` takes it out so that `Drop` does not
    // give it back twice.
    permit: Option<Permit<'a>>,
}

/// As [`AdaptivePermit`], holding an [`Arc`] of its limit.
#[must_use = "a permit is given back as soon as it is dropped, and says nothing to the algorithm"]
pub struct OwnedAdaptivePermit<A: LimitAlgorithm, C: Clock = MonotonicClock> {
    limit: Arc<AdaptiveLimit<A, C>>,
    started: Started,
    permit: Option<OwnedPermit>,
}

macro_rules! adaptive_permit {
    ($permit:ident $(<$lt:lifetime>)?) => {
        impl<$($lt,)? A: LimitAlgorithm, C: Clock> $permit<$($lt,)? A, C> {
            /// The work succeeded: its latency is a sample.
            pub fn success(self) {
                self.record(Outcome::Success);
            }

            /// The work failed from overload (a timeout, a 503, a refused
            /// connection): the algorithm backs off.
            pub fn dropped(self) {
                self.record(Outcome::Dropped);
            }

            /// The work says nothing about capacity (a client error, a
            /// cancelled call): the permit goes back, the algorithm learns
            /// nothing. What dropping the permit does.
            pub fn ignore(self) {
                self.record(Outcome::Ignored);
            }

            /// Ends the permit with `outcome`.
            pub fn record(mut self, outcome: Outcome) {
                if let Some(permit) = self.permit.take() {
                    self.limit.finish(self.started, outcome);
                    drop(permit);
                }
            }

            /// How many permits were in flight right after this one was
            /// granted, itself included.
            pub fn granted_in_flight(&self) -> u32 {
                self.started.in_flight
            }
        }

        /// A permit dropped unended is an `ignored` sample of a named
        /// limit's metrics (and, as ever, nothing to the algorithm).
        #[cfg(feature = "metrics")]
        impl<$($lt,)? A: LimitAlgorithm, C: Clock> Drop for $permit<$($lt,)? A, C> {
            fn drop(&mut self) {
                if self.permit.is_some() {
                    if let Some(metrics) = self.limit.metrics() {
                        metrics.sample(Outcome::Ignored.label());
                    }
                }
            }
        }

        impl<$($lt,)? A: LimitAlgorithm, C: Clock> fmt::Debug for $permit<$($lt,)? A, C> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_struct(stringify!($permit))
                    .field("granted_in_flight", &self.started.in_flight)
                    .field("granted_at", &self.started.at)
                    .finish()
            }
        }
    };
}

adaptive_permit!(AdaptivePermit<'a>);
adaptive_permit!(OwnedAdaptivePermit);
