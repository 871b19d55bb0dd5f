//! One key of a [`Keyed`] limiter as a limiter of its own: a
//! [`RateLimiter`] and a [`Refundable`], so a key can be a member of an
//! [`AllOf`](crate::AllOf) beside direct limiters.
//!
//! The user-facing documentation is on [`ForKey`].

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};
use std::marker::PhantomData;

use super::Keyed;
use crate::error::Denied;
use crate::kind::answer::{Answer, Reported, Site, later_snapshot};
use crate::kind::reconfig::read;
use crate::kind::{Keyable, Refusal};
use crate::limiter::{Keep, RateLimiter, Rejection, Snapshot};
use crate::refund::{Receipted, Refundable};
use crate::sync::{Guard, pin};

/// One key of a [`Keyed`] limiter: what [`Keyed::for_key`] returns.
///
/// ```
/// use tollgate::keyed::{Keyed, WindowConfig};
/// use tollgate::{FixedWindow, Rate, RateLimiter};
///
/// let per_user = Keyed::<String, FixedWindow>::new(WindowConfig::new(Rate::per_hour(2)).unwrap());
/// let alice = per_user.for_key("alice");
/// assert!(alice.try_acquire().is_ok());
/// assert_eq!(alice.snapshot().available, 1);
/// assert_eq!(per_user.snapshot("alice").available, 1);
/// ```
///
/// One key of a [`Keyed`] limiter as a limiter of its own: a
/// [`RateLimiter`] and a [`Refundable`], so a key can be a member of an
/// [`AllOf`](crate::AllOf) beside direct limiters.
///
/// # Refunds
///
/// A keyed refund looks the key up again and applies the kind's refund rule
/// (the direct limiter's, see [`refund`](crate::Refundable)) to the key's word,
/// under the configuration the admission was decided with. It gives nothing
/// back (the permits stay taken: under-admission) when that cannot be shown
/// safe:
///
/// * the admission was decided by the shared overflow state at the key cap
///   (refunding it through the key would move another key's permits), or by
///   a per-key override;
/// * the default configuration was reconfigured, or an override was set or
///   removed, between the admission and the refund (a state carried over or
///   dropped and recreated has words whose meaning changed). The receipt
///   holds an epoch guard from before the admission, so neither the
///   configuration record nor the override table the admission saw can be
///   freed and its address reused before the refund compares them;
/// * the key's word moved (the rule itself, as for a direct limiter).
///
/// A key evicted and recreated between the admission and the refund is safe
/// without a check: eviction needs the word fresh at the time floor, so the
/// admission's word is at or before the floor, and the recreated key (fresh,
/// or a copy of an overflow state that was not fresh at the floor) only ever
/// holds words past the floor (a token bucket) or in later windows (a fixed
/// window): the rule never matches them.
pub struct ForKey<'a, K, L: Keyable, S, Q: ?Sized> {
    keyed: &'a Keyed<K, L, S>,
    key: &'a Q,
}

impl<K, L, S> Keyed<K, L, S>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
    L: Keyable,
    S: BuildHasher + Clone + Send + Sync + 'static,
{
    /// `key`'s limits as a limiter of their own: a [`RateLimiter`] and a
    /// [`Refundable`], e.g. a member of an [`AllOf`](crate::AllOf). Creating
    /// it looks nothing up.
    ///
    /// ```
    /// use tollgate::keyed::{BucketConfig, Keyed};
    /// use tollgate::{AllOf, Rate, RateLimiter, TokenBucket};
    ///
    /// let global = TokenBucket::new(1_000, Rate::per_second(1_000)).unwrap();
    /// let per_ip = Keyed::<u32, TokenBucket>::new(BucketConfig::new(5, Rate::per_hour(5)).unwrap());
    /// let limits = AllOf::new((per_ip.for_key(&7), &global));
    /// assert!(limits.try_acquire().is_ok());
    /// assert_eq!(limits.snapshot().available, 4);
    /// ```
    pub fn for_key<'a, Q>(&'a self, key: &'a Q) -> ForKey<'a, K, L, S, Q>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        ForKey { keyed: self, key }
    }

    /// Asks for `n` permits for `key` and lets `keep` decide whether an
    /// admission stands, as [`RateLimiter::try_acquire_n_then`]: turned
    /// down, the permits go back by the key's refund rule (see [`ForKey`]'s
    /// module docs for when a keyed refund gives nothing back). Returns
    /// whether the permits stand.
    ///
    /// ```
    /// use tollgate::keyed::{BucketConfig, Keyed};
    /// use tollgate::{Rate, TokenBucket};
    ///
    /// let per_ip = Keyed::<u32, TokenBucket>::new(BucketConfig::new(5, Rate::per_hour(5)).unwrap());
    /// assert!(!per_ip.try_acquire_n_then(&7, 2, &mut |_| false)); // turned down: refunded
    /// assert_eq!(per_ip.snapshot(&7).available, 5);
    /// assert!(per_ip.try_acquire_n_then(&7, 2, &mut |answer| answer.is_ok()));
    /// assert_eq!(per_ip.snapshot(&7).available, 3);
    /// ```
    pub fn try_acquire_n_then<Q>(&self, key: &Q, n: u32, keep: Keep<'_>) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        crate::refund::decide_then(&self.for_key(key), n, keep)
    }
}

impl<K, L, S, Q> RateLimiter for ForKey<'_, K, L, S, Q>
where
    K: Eq + Hash + Clone + Send + Sync + 'static + Borrow<Q>,
    L: Keyable,
    S: BuildHasher + Clone + Send + Sync + 'static,
    Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
{
    #[inline]
    fn try_acquire_n(&self, n: u32) -> Result<(), Denied> {
        self.keyed.try_acquire_n(self.key, n)
    }

    fn snapshot(&self) -> Snapshot {
        self.keyed.snapshot(self.key)
    }

    #[inline]
    fn try_acquire_n_with_snapshot(&self, n: u32) -> Result<Snapshot, Rejection> {
        self.keyed.try_acquire_n_with_snapshot(self.key, n)
    }

    /// Refunds by the key's rule (the module docs) when `keep` says no.
    fn try_acquire_n_then(&self, n: u32, keep: Keep<'_>) -> bool {
        crate::refund::decide_then(self, n, keep)
    }
}

impl<K, L, S, Q> Refundable for ForKey<'_, K, L, S, Q>
where
    K: Eq + Hash + Clone + Send + Sync + 'static + Borrow<Q>,
    L: Keyable,
    S: BuildHasher + Clone + Send + Sync + 'static,
    Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
{
    type Receipt<'r>
        = KeyedReceipt<'r, L>
    where
        Self: 'r;

    fn try_acquire_n_refundable(
        &self,
        n: u32,
    ) -> Result<Receipted<KeyedReceipt<'_, L>>, Rejection> {
        // Pinned before anything is read: see the module docs.
        let guard = pin();
        let table = self.keyed.overrides.table_id(&guard);
        let answer = WithKeyReceipt {
            overflow: &*self.keyed.overflow as *const L::State as usize,
        };
        let (snapshot, key_receipt) = self.keyed.answer(self.key, n, answer)?;
        Ok(Receipted::new(
            snapshot,
            KeyedReceipt {
                key_receipt,
                n,
                table,
                owner: self as *const Self as usize,
                guard,
                _view: PhantomData,
            },
        ))
    }

    fn refund<'r>(&'r self, receipt: KeyedReceipt<'r, L>) {
        let Some(key_receipt) = receipt.key_receipt else {
            return;
        };
        if receipt.owner != self as *const Self as usize
            || self.keyed.overrides.table_id(&receipt.guard) != receipt.table
        {
            return;
        }
        let Some(state) = self.keyed.map.get(self.key) else {
            // Evicted: its permits no longer count.
            return;
        };
        // SAFETY: `state` holds its shard for reading (a reader slot or the read lock) until it drops.
        unsafe {
            read(&self.keyed.default, |view| {
                if view.current as *const L::Config as usize == key_receipt.config {
                    L::refund(view, &state, key_receipt.receipt, receipt.n);
                }
                Some(())
            })
        }
    }
}

/// The receipt of an admission by a [`ForKey`]: opaque. It holds an epoch
/// guard (so it is neither `Send` nor `Sync`): refund it, or drop it, soon.
pub struct KeyedReceipt<'a, L: Keyable> {
    /// `None` when the admission cannot be refunded (overflow or override).
    key_receipt: Option<KeyReceipt<L>>,
    n: u32,
    table: usize,
    /// The view that issued it: a view is one key of one `Keyed`.
    owner: usize,
    guard: Guard,
    _view: PhantomData<&'a ()>,
}

impl<L: Keyable> std::fmt::Debug for KeyedReceipt<'_, L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyedReceipt")
            .field("refundable", &self.key_receipt.is_some())
            .field("n", &self.n)
            .finish_non_exhaustive()
    }
}

/// What a refund needs from an admission decided on a key's own state under
/// the default configuration: the kind's receipt and that configuration's
/// address.
struct KeyReceipt<L: Keyable> {
    receipt: L::Receipt,
    config: usize,
}

impl<L: Keyable> Clone for KeyReceipt<L> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<L: Keyable> Copy for KeyReceipt<L> {}

/// The answer shape of a refundable keyed decision: `Reported`'s, with a
/// key receipt beside an admission's snapshot.
#[derive(Clone, Copy)]
struct WithKeyReceipt {
    /// The address of the keyed limiter's overflow state.
    overflow: usize,
}

impl<L: Keyable> Answer<L> for WithKeyReceipt {
    type Admitted = (Snapshot, Option<KeyReceipt<L>>);
    type Denied = Rejection;

    #[inline]
    fn admitted(self, site: Site<'_, L>, receipt: L::Receipt) -> Self::Admitted {
        let key_receipt =
            (site.state as *const L::State as usize != self.overflow).then_some(KeyReceipt {
                receipt,
                config: site.view.current as *const L::Config as usize,
            });
        (Reported.admitted(site, receipt), key_receipt)
    }

    fn denied(self, site: Site<'_, L>, denied: Denied) -> Result<Rejection, Refusal> {
        Reported.denied(site, denied)
    }

    fn invalid(self, denied: Denied, snapshot: impl FnOnce() -> Snapshot) -> Rejection {
        Answer::<L>::invalid(Reported, denied, snapshot)
    }

    fn measured_from(
        self,
        reading: u64,
        now: u64,
        answer: Result<Self::Admitted, Rejection>,
    ) -> Result<Self::Admitted, Rejection> {
        match answer {
            Ok((snapshot, key_receipt)) => {
                Ok((later_snapshot(snapshot, reading, now), key_receipt))
            }
            Err(rejection) => Answer::<L>::measured_from(Reported, reading, now, Err(rejection))
                .map(|snapshot| (snapshot, None)),
        }
    }
}
