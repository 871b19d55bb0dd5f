//! Waiting for a key's permits: [`RetryAcquire`] for a key of a [`Keyed`]
//! limiter ([`ForKey`]), and the same calls on the `Keyed` limiter with the
//! key as argument. A keyed state is one word per key with no schedule to
//! book into, so waiting sleeps out the retry-after and asks again: no queue
//! order between waiters on one key. [`Tunable`] waits the same way. Both are
//! cancel-safe: nothing is taken until the decision that admits. See
//! [`RetryAcquire`].

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};
use std::time::Duration;

use super::{ForKey, Keyed};
use crate::error::Denied;
use crate::kind::{Keyable, Tunable};
use crate::waiting::RetryAcquire;

impl<K, L, S, Q> RetryAcquire for ForKey<'_, K, L, S, Q>
where
    K: Eq + Hash + Clone + Send + Sync + 'static + Borrow<Q>,
    L: Keyable,
    S: BuildHasher + Clone + Send + Sync + 'static,
    Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
{
}

/// A [`Tunable`] limiter waits the same way: one word, no schedule.
impl<L: Keyable> RetryAcquire for Tunable<L> {}

impl<K, L, S> Keyed<K, L, S>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
    L: Keyable,
    S: BuildHasher + Clone + Send + Sync + 'static,
{
    /// Blocks the thread until `n` permits for `key` are admitted; see
    /// [`RetryAcquire::acquire`].
    ///
    /// ```
    /// use tollgate::keyed::{Keyed, WindowConfig};
    /// use tollgate::{FixedWindow, Rate};
    ///
    /// let per_key = Keyed::<String, FixedWindow>::new(WindowConfig::new(Rate::per_second(1_000)).unwrap());
    /// per_key.acquire("k", 1_000).unwrap();
    /// per_key.acquire("k", 1).unwrap(); // waits for the next window, about a millisecond
    /// ```
    pub fn acquire<Q>(&self, key: &Q, n: u32) -> Result<(), Denied>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.for_key(key).acquire(n)
    }

    /// As [`acquire`](Keyed::acquire), giving up with the
    /// [`Denied::RetryAfter`] that would take the waits past `timeout`; see
    /// [`RetryAcquire::acquire_timeout`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::keyed::{BucketConfig, Keyed};
    /// use tollgate::{Denied, Rate, TokenBucket};
    ///
    /// let per_key = Keyed::<u32, TokenBucket>::new(BucketConfig::new(1, Rate::per_hour(1)).unwrap());
    /// per_key.acquire_timeout(&7, 1, Duration::ZERO).unwrap();
    /// assert!(matches!(per_key.acquire_timeout(&7, 1, Duration::from_millis(1)), Err(Denied::RetryAfter(_))));
    /// ```
    pub fn acquire_timeout<Q>(&self, key: &Q, n: u32, timeout: Duration) -> Result<(), Denied>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.for_key(key).acquire_timeout(n, timeout)
    }

    /// Waits asynchronously, on tokio's timer, until `n` permits for `key`
    /// are admitted; dropping the future takes nothing. See
    /// [`RetryAcquire::acquire_async`].
    ///
    /// ```
    /// use tollgate::keyed::{BucketConfig, Keyed};
    /// use tollgate::{Rate, TokenBucket};
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let per_key = Keyed::<u32, TokenBucket>::new(BucketConfig::new(1, Rate::per_second(1_000)).unwrap());
    /// per_key.acquire_async(&7, 1).await.unwrap();
    /// per_key.acquire_async(&7, 1).await.unwrap(); // about a millisecond later
    /// # });
    /// ```
    #[cfg(feature = "tokio")]
    pub async fn acquire_async<Q>(&self, key: &Q, n: u32) -> Result<(), Denied>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.for_key(key).acquire_async(n).await
    }

    /// As [`acquire_async`](Keyed::acquire_async), with the timeout of
    /// [`acquire_timeout`](Keyed::acquire_timeout).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::keyed::{BucketConfig, Keyed};
    /// use tollgate::{Rate, TokenBucket};
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let per_key = Keyed::<u32, TokenBucket>::new(BucketConfig::new(1, Rate::per_hour(1)).unwrap());
    /// per_key.acquire_timeout_async(&7, 1, Duration::ZERO).await.unwrap();
    /// assert!(per_key.acquire_timeout_async(&7, 1, Duration::from_secs(1)).await.is_err());
    /// # });
    /// ```
    #[cfg(feature = "tokio")]
    pub async fn acquire_timeout_async<Q>(
        &self,
        key: &Q,
        n: u32,
        timeout: Duration,
    ) -> Result<(), Denied>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.for_key(key).acquire_timeout_async(n, timeout).await
    }
}
