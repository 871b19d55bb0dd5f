//! Concurrency limits: how many at once, rather than how often.
//!
//! A [`ConcurrencyLimit`] hands out at most `limit` [`Permit`]s at a time; a
//! permit is given back when it is dropped. The limit can be changed while
//! permits are held: a smaller one revokes nothing, and admits nobody until
//! enough permits have come back to bring the count under it; a larger one
//! wakes waiters at once. [`LockingConcurrencyLimit`] is its locking twin:
//! the same state under a mutex, the same decisions.
//!
//! | operation | how |
//! |---|---|
//! | `try_acquire` | one compare-and-swap on one word (count and limit together): admit iff `in_flight < limit` |
//! | drop a permit | one read-modify-write of the word; takes the waiters' lock only if a waiter sleeps |
//! | `acquire`, `acquire_timeout` | parks the thread in a queue until a release or a larger limit wakes it |
//! | `acquire_async` | a future on any executor (no timer needed); `acquire_timeout_async` with the `tokio` feature |
//! | `set_limit` | one read-modify-write; wakes sleepers if it opened room |
//!
//! The promises are on [`ConcurrencyLimit`]; the algorithm, the word's
//! layout and why each ordering is enough in the `gate` module's docs.

mod gate;
mod wait;

use std::fmt;
// std's `Arc`, not the sync facade's: `try_acquire_owned(self: &Arc<Self>)`
// needs a receiver type, which loom's `Arc` cannot be, and the `Arc` only
// keeps the limit alive; nothing is ordered through it.
use std::sync::Arc;
use std::time::Duration;

use crate::cell::{Atomic, Home, Locked};
use crate::error::ConfigError;
use gate::{Gate, Granted, Held};

/// A source of permits: [`ConcurrencyLimit`] or [`LockingConcurrencyLimit`],
/// what a [`Permit`] gives its permit back to. Sealed: implemented by those
/// two only.
///
/// ```
/// use tollgate::{ConcurrencyLimit, Permit, PermitSource};
///
/// fn held<L: PermitSource>(permit: &Permit<'_, L>) -> u32 {
///     permit.granted_in_flight()
/// }
/// let limit = ConcurrencyLimit::new(1)?;
/// assert_eq!(held(&limit.try_acquire().unwrap()), 1);
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
pub trait PermitSource: sealed::Sealed {
    #[doc(hidden)]
    fn release_permit(&self);
}

mod sealed {
    #[allow(unreachable_pub)]
    pub trait Sealed {}
}

fn check_limit(limit: u32) -> Result<u32, ConfigError> {
    if (1..=gate::MAX_LIMIT).contains(&limit) {
        Ok(limit)
    } else {
        Err(ConfigError::InvalidConcurrencyLimit {
            limit,
            max: gate::MAX_LIMIT,
        })
    }
}

/// A permit of a concurrency limit, given back when dropped.
///
/// It reports the word its admission wrote — how many permits were in flight
/// right after it was granted (itself included) and the limit then in force —
/// and nothing about time.
///
/// ```
/// use tollgate::ConcurrencyLimit;
///
/// let limit = ConcurrencyLimit::new(2)?;
/// let first = limit.try_acquire().unwrap();
/// let second = limit.try_acquire().unwrap();
/// assert_eq!((first.granted_in_flight(), second.granted_in_flight()), (1, 2));
/// assert_eq!(second.granted_limit(), 2);
/// drop(first);
/// assert_eq!(limit.in_flight(), 1);
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
#[must_use = "a permit is given back as soon as it is dropped"]
pub struct Permit<'a, L: PermitSource + ?Sized = ConcurrencyLimit> {
    source: &'a L,
    granted: Granted,
}

/// A permit that owns an [`Arc`] of its limit, for holding across tasks and
/// threads; given back when dropped. As [`Permit`] otherwise.
///
/// ```
/// use std::sync::Arc;
/// use tollgate::ConcurrencyLimit;
///
/// let limit = Arc::new(ConcurrencyLimit::new(1)?);
/// let permit = limit.try_acquire_owned().unwrap();
/// let worker = std::thread::spawn(move || {
///     let _held = permit; // given back when the worker ends
/// });
/// worker.join().unwrap();
/// assert_eq!(limit.in_flight(), 0);
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
#[must_use = "a permit is given back as soon as it is dropped"]
pub struct OwnedPermit<L: PermitSource = ConcurrencyLimit> {
    source: Arc<L>,
    granted: Granted,
}

macro_rules! permit_reports {
    () => {
        /// How many permits were in flight right after this one was granted,
        /// itself included: at most [`granted_limit`](Self::granted_limit).
        ///
        /// ```
        /// use tollgate::ConcurrencyLimit;
        /// let limit = ConcurrencyLimit::new(4)?;
        /// let _a = limit.try_acquire().unwrap();
        /// assert_eq!(limit.try_acquire().unwrap().granted_in_flight(), 2);
        /// # Ok::<(), tollgate::ConfigError>(())
        /// ```
        pub fn granted_in_flight(&self) -> u32 {
            self.granted.in_flight
        }

        /// The limit in force when this permit was granted.
        ///
        /// ```
        /// use tollgate::ConcurrencyLimit;
        /// let limit = ConcurrencyLimit::new(4)?;
        /// let permit = limit.try_acquire().unwrap();
        /// limit.set_limit(1)?;
        /// assert_eq!((permit.granted_limit(), limit.limit()), (4, 1));
        /// # Ok::<(), tollgate::ConfigError>(())
        /// ```
        pub fn granted_limit(&self) -> u32 {
            self.granted.limit
        }
    };
}

impl<L: PermitSource + ?Sized> Permit<'_, L> {
    permit_reports!();
}

impl<L: PermitSource> OwnedPermit<L> {
    permit_reports!();
}

impl<L: PermitSource + ?Sized> Drop for Permit<'_, L> {
    fn drop(&mut self) {
        self.source.release_permit();
    }
}

impl<L: PermitSource> Drop for OwnedPermit<L> {
    fn drop(&mut self) {
        self.source.release_permit();
    }
}

impl<L: PermitSource + ?Sized> fmt::Debug for Permit<'_, L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("granted_in_flight", &self.granted.in_flight)
            .field("granted_limit", &self.granted.limit)
            .finish()
    }
}

impl<L: PermitSource> fmt::Debug for OwnedPermit<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OwnedPermit")
            .field("granted_in_flight", &self.granted.in_flight)
            .field("granted_limit", &self.granted.limit)
            .finish()
    }
}

/// The lock-free concurrency limit: at most `limit` [`Permit`]s held at once.
///
/// One `AtomicU64` holds the count in flight, the limit and a flag that says
/// a waiter sleeps; `try_acquire` and giving a permit back are one
/// read-modify-write of it each and touch no lock unless a waiter sleeps.
/// Waiting (`acquire`, `acquire_timeout`, `acquire_async`) queues under a
/// mutex. [`LockingConcurrencyLimit`] is the twin under a mutex.
///
/// # Promises
///
/// - **The bound.** A permit is granted only by a compare-and-swap that finds
///   `in_flight < limit` in the limit's one word, so the permits held at any
///   instant are at most the limit in force at the latest admission before
///   it, and never more than the largest limit ever set. Each permit reports
///   the word its admission wrote ([`Permit::granted_in_flight`] ≤
///   [`Permit::granted_limit`]).
/// - **Shrinking revokes nothing.** After `set_limit(smaller)`, in flight may
///   stay above the new limit; nothing is admitted until releases bring it
///   under, and from then on no more than the new limit are held.
/// - **Hand-over.** Releasing a permit happens before every later admission
///   of the same limit: what a holder wrote, the next holder sees (with a
///   limit of 1, a mutex's guarantee).
/// - **No lost wake-up.** A waiter sleeps only while every permit is taken,
///   and a release or a larger limit that frees a permit wakes a sleeper.
/// - **Cancel-safe.** A waiter holds no permit until its own admission: a
///   dropped `acquire_async` future or an `acquire_timeout` that gave up
///   holds none, and passes on a wake-up it had been given, so no permit is
///   stranded. A leaked future holds none either (a wake-up it held is then
///   lost to the waiters behind it until the next release).
/// - **Order.** Waiters are woken in the order they queued, but not served
///   strictly in order: a `try_acquire` may take the permit a woken waiter
///   was about to take, and the waiter then sleeps again at the head of the
///   queue.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use tollgate::ConcurrencyLimit;
///
/// let limit = Arc::new(ConcurrencyLimit::new(2)?);
/// let a = limit.try_acquire().unwrap();
/// let _b = limit.try_acquire().unwrap();
/// assert!(limit.try_acquire().is_none()); // two in flight: full
///
/// // A blocked thread is woken by the release.
/// let waiter = {
///     let limit = Arc::clone(&limit);
///     std::thread::spawn(move || limit.acquire().granted_in_flight())
/// };
/// drop(a);
/// assert_eq!(waiter.join().unwrap(), 2);
///
/// // Shrinking revokes nothing: `_b` is still held, and nothing more is
/// // admitted until in-flight is under the new limit.
/// limit.set_limit(1)?;
/// assert_eq!(limit.in_flight(), 1);
/// assert!(limit.acquire_timeout(Duration::from_millis(1)).is_none());
/// assert_eq!(tollgate::ConcurrencyLimit::new(0).unwrap_err().to_string(),
///            "a concurrency limit of 0 is outside 1..=2147483647");
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
pub type ConcurrencyLimit = ConcurrencyLimitOf<Atomic>;

/// The locking twin of [`ConcurrencyLimit`]: the same word under a mutex
/// (parking_lot's), the same decisions and the same waiting, with every
/// method of the lock-free limit; for benchmarks, for property tests, and
/// for anyone who prefers a lock.
///
/// ```
/// use tollgate::LockingConcurrencyLimit;
///
/// let limit = LockingConcurrencyLimit::new(1)?;
/// let permit = limit.try_acquire().unwrap();
/// assert!(limit.try_acquire().is_none());
/// drop(permit);
/// assert!(limit.try_acquire().is_some());
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
pub type LockingConcurrencyLimit = ConcurrencyLimitOf<Locked>;

/// The one type behind [`ConcurrencyLimit`] (its word in an atomic) and
/// [`LockingConcurrencyLimit`] (under a mutex): every method and promise is
/// the same for both, and documented here. Name it through those two; the
/// parameter says only where the word lives.
pub struct ConcurrencyLimitOf<H: Home> {
    gate: Gate<H::Cell<u64, Held>>,
}

impl<H: Home> sealed::Sealed for ConcurrencyLimitOf<H> {}

impl<H: Home> PermitSource for ConcurrencyLimitOf<H> {
    #[inline]
    fn release_permit(&self) {
        self.gate.release();
    }
}

impl<H: Home> fmt::Debug for ConcurrencyLimitOf<H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct(H::name("ConcurrencyLimit", "LockingConcurrencyLimit"))
            .field("limit", &self.limit())
            .field("in_flight", &self.in_flight())
            .finish()
    }
}

/// The methods of the limit and its twin (each example runs on the
/// lock-free one; the twin answers the same).
impl<H: Home> ConcurrencyLimitOf<H> {
    /// The largest limit: 2^31 − 1 permits (the count and the limit
    /// share one 64-bit word with a flag).
    ///
    /// ```
    /// use tollgate::ConcurrencyLimit;
    /// assert!(ConcurrencyLimit::new(ConcurrencyLimit::MAX_LIMIT).is_ok());
    /// assert!(ConcurrencyLimit::new(ConcurrencyLimit::MAX_LIMIT + 1).is_err());
    /// ```
    pub const MAX_LIMIT: u32 = gate::MAX_LIMIT;

    /// A limit of `limit` permits at once, none in flight.
    ///
    /// Errors: [`ConfigError::InvalidConcurrencyLimit`] for 0 or more than
    /// [`MAX_LIMIT`](Self::MAX_LIMIT).
    ///
    /// ```
    /// use tollgate::{ConfigError, ConcurrencyLimit};
    /// let limit = ConcurrencyLimit::new(8)?;
    /// assert_eq!((limit.limit(), limit.in_flight()), (8, 0));
    /// assert!(matches!(ConcurrencyLimit::new(0), Err(ConfigError::InvalidConcurrencyLimit { .. })));
    /// # Ok::<(), ConfigError>(())
    /// ```
    pub fn new(limit: u32) -> Result<Self, ConfigError> {
        Ok(Self {
            gate: Gate::new(check_limit(limit)?),
        })
    }

    /// A permit if one is free now (`in_flight < limit`), else `None`
    /// at once. Never waits and never queues; it does not wait behind
    /// sleeping waiters either (see the type's docs on fairness).
    ///
    /// ```
    /// use tollgate::ConcurrencyLimit;
    /// let limit = ConcurrencyLimit::new(1)?;
    /// let held = limit.try_acquire().expect("one free");
    /// assert!(limit.try_acquire().is_none());
    /// drop(held);
    /// assert!(limit.try_acquire().is_some());
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    #[inline]
    pub fn try_acquire(&self) -> Option<Permit<'_, Self>> {
        let granted = self.gate.try_acquire()?;
        Some(Permit {
            source: self,
            granted,
        })
    }

    /// As [`try_acquire`](Self::try_acquire), for a permit that holds
    /// an `Arc` of the limit.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tollgate::ConcurrencyLimit;
    /// let limit = Arc::new(ConcurrencyLimit::new(1)?);
    /// let permit = limit.try_acquire_owned().unwrap();
    /// assert!(limit.try_acquire_owned().is_none());
    /// drop(permit);
    /// assert_eq!(limit.in_flight(), 0);
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    #[inline]
    pub fn try_acquire_owned(self: &Arc<Self>) -> Option<OwnedPermit<Self>> {
        let granted = self.gate.try_acquire()?;
        Some(OwnedPermit {
            source: Arc::clone(self),
            granted,
        })
    }

    /// Parks the thread until a permit is granted.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tollgate::ConcurrencyLimit;
    /// let limit = Arc::new(ConcurrencyLimit::new(1)?);
    /// let held = limit.acquire(); // free: at once
    /// let other = Arc::clone(&limit);
    /// let waiter = std::thread::spawn(move || drop(other.acquire()));
    /// drop(held); // wakes the waiter
    /// waiter.join().unwrap();
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn acquire(&self) -> Permit<'_, Self> {
        Permit {
            source: self,
            granted: wait::block(&self.gate),
        }
    }

    /// Parks the thread until a permit is granted or `timeout` has
    /// passed; `None` then, having left the queue (holding no permit,
    /// and passing on a wake-up it had been given). A zero timeout is
    /// [`try_acquire`](Self::try_acquire).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::ConcurrencyLimit;
    /// let limit = ConcurrencyLimit::new(1)?;
    /// let _held = limit.acquire_timeout(Duration::from_secs(1)).unwrap();
    /// assert!(limit.acquire_timeout(Duration::from_millis(5)).is_none());
    /// assert_eq!(limit.in_flight(), 1);
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn acquire_timeout(&self, timeout: Duration) -> Option<Permit<'_, Self>> {
        let granted = wait::block_timeout(&self.gate, timeout)?;
        Some(Permit {
            source: self,
            granted,
        })
    }

    /// Waits asynchronously until a permit is granted. Runs on any
    /// executor (it needs no timer, so no feature). Cancel-safe:
    /// dropping the future at any point leaves nothing held, and a
    /// wake-up it had been given goes to the next waiter.
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// use tollgate::ConcurrencyLimit;
    /// let limit = ConcurrencyLimit::new(1).unwrap();
    /// let permit = limit.acquire_async().await;
    /// assert_eq!(permit.granted_in_flight(), 1);
    /// # });
    /// ```
    pub async fn acquire_async(&self) -> Permit<'_, Self> {
        let granted = wait::Acquire::new(&self.gate).await;
        Permit {
            source: self,
            granted,
        }
    }

    /// As [`acquire_async`](Self::acquire_async), for a permit that
    /// holds an `Arc` of the limit (to move into a spawned task).
    ///
    /// ```
    /// use std::sync::Arc;
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// use tollgate::ConcurrencyLimit;
    /// let limit = Arc::new(ConcurrencyLimit::new(1).unwrap());
    /// let permit = Arc::clone(&limit).acquire_owned_async().await;
    /// assert_eq!(limit.in_flight(), 1);
    /// drop(permit);
    /// # });
    /// ```
    pub async fn acquire_owned_async(self: Arc<Self>) -> OwnedPermit<Self> {
        let granted = wait::Acquire::new(&self.gate).await;
        OwnedPermit {
            source: self,
            granted,
        }
    }

    /// As [`acquire_async`](Self::acquire_async), giving up after
    /// `timeout` on tokio's timer (the `tokio` feature): `None` then,
    /// holding nothing.
    ///
    /// ```
    /// use std::time::Duration;
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// use tollgate::ConcurrencyLimit;
    /// let limit = ConcurrencyLimit::new(1).unwrap();
    /// let _held = limit.acquire_async().await;
    /// assert!(limit.acquire_timeout_async(Duration::from_millis(5)).await.is_none());
    /// # });
    /// ```
    #[cfg(feature = "tokio")]
    pub async fn acquire_timeout_async(&self, timeout: Duration) -> Option<Permit<'_, Self>> {
        tokio::time::timeout(timeout, self.acquire_async())
            .await
            .ok()
    }

    /// Changes the limit. A smaller limit revokes no permit: in flight
    /// may stay above it until releases bring it under, and nothing is
    /// admitted meanwhile. A larger one wakes waiters for the room it
    /// opens.
    ///
    /// Errors: [`ConfigError::InvalidConcurrencyLimit`] for 0 or more than
    /// [`MAX_LIMIT`](Self::MAX_LIMIT); the limit is then unchanged.
    ///
    /// ```
    /// use tollgate::ConcurrencyLimit;
    /// let limit = ConcurrencyLimit::new(2)?;
    /// let (a, b) = (limit.try_acquire().unwrap(), limit.try_acquire().unwrap());
    /// limit.set_limit(1)?;
    /// drop(a);
    /// assert!(limit.try_acquire().is_none()); // b alone fills the new limit
    /// drop(b);
    /// assert!(limit.try_acquire().is_some());
    /// assert!(limit.set_limit(0).is_err());
    /// assert_eq!(limit.limit(), 1);
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn set_limit(&self, limit: u32) -> Result<(), ConfigError> {
        self.gate.set_limit(check_limit(limit)?);
        Ok(())
    }

    /// The limit now.
    ///
    /// ```
    /// use tollgate::ConcurrencyLimit;
    /// assert_eq!(ConcurrencyLimit::new(3)?.limit(), 3);
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn limit(&self) -> u32 {
        self.gate.limit()
    }

    /// Permits held now (a reading: others may change it at once). May
    /// exceed [`limit`](Self::limit) after the limit was made smaller.
    ///
    /// ```
    /// use tollgate::ConcurrencyLimit;
    /// let limit = ConcurrencyLimit::new(3)?;
    /// let _p = limit.try_acquire();
    /// assert_eq!(limit.in_flight(), 1);
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn in_flight(&self) -> u32 {
        self.gate.in_flight()
    }

    /// Whether a waiter sleeps in the queue now (a reading: the
    /// `WAITING` flag of the limit's word). A woken waiter that has
    /// not yet asked again is not counted.
    ///
    /// ```
    /// use std::future::Future;
    /// use std::pin::pin;
    /// use std::task::{Context, Waker};
    /// use tollgate::ConcurrencyLimit;
    /// let limit = ConcurrencyLimit::new(1)?;
    /// let held = limit.try_acquire();
    /// let mut waiter = pin!(limit.acquire_async());
    /// assert!(waiter.as_mut().poll(&mut Context::from_waker(Waker::noop())).is_pending());
    /// assert!(limit.has_waiters());
    /// drop(held); // wakes it: out of the queue
    /// assert!(!limit.has_waiters());
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn has_waiters(&self) -> bool {
        self.gate.has_waiters()
    }
}
