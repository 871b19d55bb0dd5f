//! The `metrics` feature: what tollgate's in-process limiters report through
//! the [`metrics`](https://docs.rs/metrics) facade, and [`Published`], the
//! list of limiters an exporter's upkeep publishes.
//!
//! Nothing here is on a decision's path. A [`Counted`](crate::Counted)
//! limiter keeps counting in its own per-thread cells; publishing sums the
//! cells and sets the facade's counters to the sums. A named
//! [`AdaptiveLimit`](crate::AdaptiveLimit) counts a sample where its
//! algorithm is fed one (the permit's release), and sets its gauges where
//! the limit changes and when published. Every handle is registered with
//! the recorder once, the first time it is needed, and kept.
//!
//! Labels are the name a limiter was given and an outcome: a few values
//! each, never a key, an address or a user.

use std::fmt;
use std::sync::{Arc, OnceLock, Weak};

use metrics::{Counter, Gauge};

/// `tollgate_permits_total{limiter, outcome}`: a [`Counted`](crate::Counted)
/// limiter's admitted, denied and refunded permits.
pub(crate) const PERMITS_TOTAL: &str = "tollgate_permits_total";
/// `tollgate_adaptive_limit{limiter}`.
pub(crate) const ADAPTIVE_LIMIT: &str = "tollgate_adaptive_limit";
/// `tollgate_adaptive_in_flight{limiter}`.
pub(crate) const ADAPTIVE_IN_FLIGHT: &str = "tollgate_adaptive_in_flight";
/// `tollgate_adaptive_samples_total{limiter, outcome}`.
pub(crate) const ADAPTIVE_SAMPLES_TOTAL: &str = "tollgate_adaptive_samples_total";
/// `tollgate_adaptive_limit_changes_total{limiter}`.
pub(crate) const ADAPTIVE_LIMIT_CHANGES_TOTAL: &str = "tollgate_adaptive_limit_changes_total";

/// Something whose figures an exporter's upkeep publishes to the `metrics`
/// facade: a [`Counted`](crate::Counted) limiter, a named
/// [`AdaptiveLimit`](crate::AdaptiveLimit), or a source of one's own, held
/// in a [`Published`] list.
///
/// ```
/// use std::sync::Arc;
/// use tollgate::{Publish, Published};
///
/// /// A queue whose depth a dashboard shows beside the limits.
/// struct Queue(std::sync::atomic::AtomicU64);
///
/// impl Publish for Queue {
///     fn publish(&self) {
///         let depth = self.0.load(std::sync::atomic::Ordering::Relaxed);
///         metrics::gauge!("jobs_queue_depth").set(depth as f64);
///     }
/// }
///
/// let queue = Arc::new(Queue(0.into()));
/// let published = Published::new().with(&queue);
/// published.publish();
/// ```
pub trait Publish: Send + Sync {
    /// Sets this source's metrics to its current figures.
    fn publish(&self);
}

/// The limiters an exporter publishes, held weakly: one
/// [`publish`](Self::publish), called from the exporter's upkeep or a timer
/// before each scrape, publishes every one still alive.
///
/// A [`Counted`](crate::Counted) limiter counts in per-thread cells that
/// only a read sums, so its `tollgate_permits_total` counters move when it
/// is published, not at each decision; a named
/// [`AdaptiveLimit`](crate::AdaptiveLimit) counts its samples as they come,
/// and its gauges (`tollgate_adaptive_in_flight` above all) are current as
/// of its last publishing. Publishing a list of a few limiters is a few
/// hundred nanoseconds: call it as often as the exporter is scraped.
///
/// A dropped limiter leaves the list at the next publish; its series keep
/// their last values in the recorder.
///
/// ```
/// use std::sync::Arc;
/// use tollgate::{AdaptiveLimit, Aimd, Counted, Published, Rate, RateLimiter, TokenBucket};
///
/// let api = Arc::new(Counted::new("api", TokenBucket::new(100, Rate::per_second(100))?));
/// let backend = Arc::new(AdaptiveLimit::new(Aimd::builder().build()?)?.named("backend"));
/// let published = Published::new().with(&api).with(&backend);
///
/// assert!(api.try_acquire().is_ok());
/// backend.try_acquire().unwrap().success();
/// // From the exporter's upkeep (metrics-exporter-prometheus: before its
/// // `render`, or on a timer beside its upkeep task):
/// published.publish();
/// assert_eq!(published.len(), 2);
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
#[derive(Default)]
pub struct Published {
    sources: Vec<Weak<dyn Publish>>,
}

impl Published {
    /// An empty list.
    pub fn new() -> Self {
        Published::default()
    }

    /// Adds `source` (held weakly: the list does not keep it alive).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tollgate::{Counted, FixedWindow, Published, Rate};
    ///
    /// let limiters = ["search", "upload"]
    ///     .map(|name| Arc::new(Counted::new(name, FixedWindow::new(Rate::per_second(10)).unwrap())));
    /// let mut published = Published::new();
    /// for limiter in &limiters {
    ///     published.add(limiter);
    /// }
    /// assert_eq!(published.len(), 2);
    /// ```
    pub fn add<P: Publish + 'static>(&mut self, source: &Arc<P>) -> &mut Self {
        let weak: Weak<dyn Publish> = Arc::downgrade(source) as Weak<dyn Publish>;
        self.sources.push(weak);
        self
    }

    /// As [`add`](Self::add), by value, for a chain of them.
    pub fn with<P: Publish + 'static>(mut self, source: &Arc<P>) -> Self {
        self.add(source);
        self
    }

    /// Publishes every source still alive, in the order they were added.
    pub fn publish(&self) {
        for source in &self.sources {
            if let Some(source) = source.upgrade() {
                source.publish();
            }
        }
    }

    /// Sources still alive.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tollgate::{Counted, Published, Rate, TokenBucket};
    ///
    /// let limiter = Arc::new(Counted::new("api", TokenBucket::new(1, Rate::per_hour(1)).unwrap()));
    /// let published = Published::new().with(&limiter);
    /// assert_eq!(published.len(), 1);
    /// drop(limiter);
    /// assert_eq!(published.len(), 0);
    /// assert!(published.is_empty());
    /// ```
    pub fn len(&self) -> usize {
        self.sources
            .iter()
            .filter(|source| source.strong_count() > 0)
            .count()
    }

    /// No source alive.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Publish for Published {
    fn publish(&self) {
        Published::publish(self);
    }
}

impl fmt::Debug for Published {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Published")
            .field("sources", &self.len())
            .finish()
    }
}

/// A [`Counted`](crate::Counted) limiter's counters, registered once.
pub(crate) struct PermitCounters {
    admitted: Counter,
    denied: Counter,
    refunded: Counter,
}

impl PermitCounters {
    fn register(limiter: &'static str) -> Self {
        let counter = |outcome: &'static str| metrics::counter!(PERMITS_TOTAL, "limiter" => limiter, "outcome" => outcome);
        PermitCounters {
            admitted: counter("admitted"),
            denied: counter("denied"),
            refunded: counter("refunded"),
        }
    }

    /// Sets the counters to the sums (a counter never goes back: the
    /// recorder keeps the larger of its value and the one set).
    pub(crate) fn set(&self, admitted: u64, denied: u64, refunded: u64) {
        self.admitted.absolute(admitted);
        self.denied.absolute(denied);
        self.refunded.absolute(refunded);
    }
}

/// Registered at the first publish, then kept.
#[derive(Default)]
pub(crate) struct LazyPermitCounters(OnceLock<PermitCounters>);

impl LazyPermitCounters {
    pub(crate) fn get(&self, limiter: &'static str) -> &PermitCounters {
        self.0.get_or_init(|| PermitCounters::register(limiter))
    }
}

impl fmt::Debug for LazyPermitCounters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.get().is_some() {
            "registered"
        } else {
            "unregistered"
        })
    }
}

/// A named adaptive limit's handles, registered once.
pub(crate) struct AdaptiveMetrics {
    limit: Gauge,
    in_flight: Gauge,
    success: Counter,
    dropped: Counter,
    ignored: Counter,
    changes: Counter,
}

impl AdaptiveMetrics {
    fn register(limiter: &'static str) -> Self {
        let samples = |outcome: &'static str| metrics::counter!(ADAPTIVE_SAMPLES_TOTAL, "limiter" => limiter, "outcome" => outcome);
        AdaptiveMetrics {
            limit: metrics::gauge!(ADAPTIVE_LIMIT, "limiter" => limiter),
            in_flight: metrics::gauge!(ADAPTIVE_IN_FLIGHT, "limiter" => limiter),
            success: samples("success"),
            dropped: samples("dropped"),
            ignored: samples("ignored"),
            changes: metrics::counter!(ADAPTIVE_LIMIT_CHANGES_TOTAL, "limiter" => limiter),
        }
    }

    /// One sample, as its permit reported it: the counter of its outcome
    /// (`success`, `dropped`, `ignored`), named by the adaptive limit, which
    /// owns the outcomes.
    pub(crate) fn sample(&self, outcome: &str) {
        match outcome {
            "success" => &self.success,
            "dropped" => &self.dropped,
            _ => {
                debug_assert_eq!(outcome, "ignored");
                &self.ignored
            }
        }
        .increment(1);
    }

    /// The limit in force.
    pub(crate) fn limit(&self, limit: u32) {
        self.limit.set(f64::from(limit));
    }

    /// The gauges, and the changes the limit's history has counted (if the
    /// algorithm keeps one).
    pub(crate) fn publish(&self, limit: u32, in_flight: u32, changes: Option<u64>) {
        self.limit(limit);
        self.in_flight.set(f64::from(in_flight));
        if let Some(changes) = changes {
            self.changes.absolute(changes);
        }
    }
}

/// Registered at the first sample or publish, then kept.
#[derive(Default)]
pub(crate) struct LazyAdaptiveMetrics(OnceLock<AdaptiveMetrics>);

impl LazyAdaptiveMetrics {
    /// The handles; registered, the first time, with the gauges and the
    /// changes set to `now()`'s (limit, in flight, changes), so that no
    /// gauge reads 0 for want of a publish.
    pub(crate) fn get(
        &self,
        limiter: &'static str,
        now: impl FnOnce() -> (u32, u32, Option<u64>),
    ) -> &AdaptiveMetrics {
        self.0.get_or_init(|| {
            let metrics = AdaptiveMetrics::register(limiter);
            let (limit, in_flight, changes) = now();
            metrics.publish(limit, in_flight, changes);
            metrics
        })
    }
}

impl fmt::Debug for LazyAdaptiveMetrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.get().is_some() {
            "registered"
        } else {
            "unregistered"
        })
    }
}
