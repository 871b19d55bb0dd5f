//! Epoch-protected pointers: a value that one thread replaces while others
//! may still read it, freed through crossbeam-epoch once no pinned thread can
//! hold it (the keyed limiters' configuration records and quota tables, the
//! sliding log's rings).
//!
//! A reader [`pin`]s the epoch and [`Shared::load`]s (or runs
//! [`Shared::with`]); a writer replaces the value by compare-and-swap
//! ([`Shared::compare_exchange`], then [`Shared::retire`] once the old value
//! is unreachable), through the pointers' one loop where a lost race is
//! decided again ([`Shared::update`], [`MaybeShared::update_from`]), or, where
//! it has excluded every other writer, by a store ([`Shared::replace_with`]).
//! [`MaybeShared`] is the same pointer that may also hold nothing (the keyed
//! sliding window's history, allocated when a key first needs it).
//!
//! crossbeam-epoch is not loom-aware (its own loom build needs
//! `--cfg crossbeam_loom`), so under `--cfg loom` a stand-in with the same
//! shape takes its place: a loom `AtomicPtr` whose replaced values are kept
//! until it drops, so a reference taken before a replacement stays valid. The
//! models thereby check the protocols built on it (the keyed reconfiguration,
//! the sliding log's seal, inherit, publish) with every access visible to
//! loom; reclamation itself is crossbeam-epoch's, and the counting-allocator
//! test in `tests/sliding_log.rs` checks that it happens.

use std::fmt;

pub(crate) use imp::{Guard, MaybeShared, Shared, pin};

#[cfg(not(loom))]
mod imp {
    use crossbeam_epoch::{self as epoch, Atomic, Owned};

    use crate::sync::Ordering;

    pub(crate) use crossbeam_epoch::Guard;

    /// Pins the current thread's epoch: nothing loaded from a [`Shared`] after
    /// this is freed before the guard drops.
    #[inline]
    pub(crate) fn pin() -> Guard {
        epoch::pin()
    }

    /// A value replaced by compare-and-swap, reclaimed through the epoch.
    #[allow(unreachable_pub)] // public only as the sliding log's `RingsHome::Store`
    pub struct Shared<T>(Atomic<T>);

    impl<T> Shared<T> {
        pub(crate) fn new(value: T) -> Self {
            Shared(Atomic::new(value))
        }

        /// The current value, alive as long as the guard.
        #[inline]
        pub(crate) fn load<'g>(&self, guard: &'g Guard) -> &'g T {
            // Acquire: pairs with the Release that published the value (the
            // AcqRel of `compare_exchange`, the Release store of
            // `replace_with`), so the new value's contents are visible before
            // it is used.
            let value = self.0.load(Ordering::Acquire, guard);
            // SAFETY: never null (set at construction, only ever replaced by
            // another value); a replaced value is retired only after it is
            // unreachable, and epoch destroys it only after every thread pinned
            // before that has unpinned: `guard` is one of them.
            unsafe { value.deref() }
        }

        /// The current value, with no guard.
        ///
        /// # Safety
        ///
        /// The caller keeps the value alive for `'a` by other means: it holds a
        /// pin, or a lock that the replacer cycles before retiring the value.
        #[inline]
        pub(crate) unsafe fn load_unprotected<'a>(&self) -> &'a T {
            // SAFETY: not dereferenced beyond what the caller guarantees.
            let guard = unsafe { epoch::unprotected() };
            // Acquire: as in `load`.
            let value = self.0.load(Ordering::Acquire, guard);
            // SAFETY: never null; alive for 'a by the caller's guarantee.
            unsafe { value.deref() }
        }

        /// Whether `value` is still the current value.
        #[inline]
        pub(crate) fn is_current(&self, value: &T) -> bool {
            // SAFETY: the pointer is only compared, never dereferenced.
            let guard = unsafe { epoch::unprotected() };
            // Relaxed: a thread that saw a state carried over to a newer value
            // must see that value here too, and it does without any ordering
            // of its own: the state was written (Release) after the newer
            // value's CAS, and read by an Acquire load sequenced before this
            // one, so that CAS happens before this load, which by write-read
            // coherence returns it or a later value. Only the pointer is
            // compared; nothing is read through it.
            std::ptr::eq(self.0.load(Ordering::Relaxed, guard).as_raw(), value)
        }

        /// Replaces `current` with `new`, or gives `new` back if `current` has
        /// already been replaced. The old value is *not* retired: see `retire`.
        pub(crate) fn compare_exchange<'g>(
            &self,
            current: &'g T,
            new: T,
            guard: &'g Guard,
        ) -> Result<&'g T, T> {
            // AcqRel on success: Release publishes the new value's contents;
            // Acquire orders this after the loads that chose `current`.
            // Relaxed on failure: a failure hands `new` back and reads nothing
            // through the pointer it found; callers load the value again
            // (Acquire) before using it.
            match self.0.compare_exchange(
                epoch::Shared::from(current as *const T),
                Owned::new(new),
                Ordering::AcqRel,
                Ordering::Relaxed,
                guard,
            ) {
                // SAFETY: just published, never null, alive while `guard` is.
                Ok(new) => Ok(unsafe { new.deref() }),
                Err(failed) => Err(*failed.new.into_box()),
            }
        }

        /// Destroys a replaced value once no pinned thread can hold it.
        ///
        /// # Safety
        ///
        /// `old` was replaced by this thread's successful `compare_exchange`,
        /// is retired once, and no unpinned reader can still hold it.
        pub(crate) unsafe fn retire(&self, old: &T, guard: &Guard) {
            // SAFETY: the caller's guarantee.
            unsafe { guard.defer_destroy(epoch::Shared::from(old as *const T)) };
        }

        /// Runs `f` on the current value; if it returns a successor, publishes
        /// it and retires the old value. Returns whether it published.
        ///
        /// # Safety
        ///
        /// No other replacement of this pointer races this one: `f` returns a
        /// successor only in a caller that excludes every other (the sliding
        /// log: only the thread that sealed the current rings).
        pub(crate) unsafe fn replace_with(&self, f: impl FnOnce(&T) -> Option<T>) -> bool {
            let guard = epoch::pin();
            // Acquire (in `load`): as in `with`.
            let old = self.load(&guard);
            let Some(new) = f(old) else {
                return false;
            };
            // Release: publishes the new value's contents to the Acquire loads
            // of `load`.
            self.0.store(Owned::new(new), Ordering::Release);
            // SAFETY: `old` is no longer reachable from `self` (we replaced
            // it, and by the caller's guarantee no one else replaces it), so
            // no thread that pins from now on can load it; epoch reclamation
            // waits for those pinned before, `guard` among them.
            unsafe { self.retire(old, &guard) };
            true
        }
    }

    /// A [`Shared`] that may hold no value: replaced by compare-and-swap
    /// only, from a value or from nothing to a value or to nothing.
    pub(crate) struct MaybeShared<T>(Atomic<T>);

    impl<T> MaybeShared<T> {
        pub(crate) fn new(value: Option<T>) -> Self {
            MaybeShared(value.map_or_else(Atomic::null, Atomic::new))
        }

        /// The current value, alive as long as the guard.
        #[inline]
        pub(crate) fn load<'g>(&self, guard: &'g Guard) -> Option<&'g T> {
            // Acquire: as `Shared::load`'s.
            let value = self.0.load(Ordering::Acquire, guard);
            // SAFETY: null or a published value, retired only once
            // unreachable and destroyed only after `guard` unpins.
            unsafe { value.as_ref() }
        }

        /// Replaces `current` (a value or nothing) with `new`, or gives `new`
        /// back if `current` has already been replaced. The old value is
        /// *not* retired: see [`retire`](MaybeShared::retire).
        pub(crate) fn compare_exchange<'g>(
            &self,
            current: Option<&'g T>,
            new: Option<T>,
            guard: &'g Guard,
        ) -> Result<Option<&'g T>, Option<T>> {
            let current =
                current.map_or_else(epoch::Shared::null, |c| epoch::Shared::from(c as *const T));
            let new = new.map_or_else(epoch::Shared::null, |v| Owned::new(v).into_shared(guard));
            // AcqRel and Relaxed: as `Shared::compare_exchange`'s.
            match self
                .0
                .compare_exchange(current, new, Ordering::AcqRel, Ordering::Relaxed, guard)
            {
                // SAFETY: just published (or null), alive while `guard` is.
                Ok(_) => Ok(unsafe { new.as_ref() }),
                // SAFETY: `new` was made above from an `Owned` (or is null)
                // and was not published, so it is ours to take back.
                Err(_) => Err((!new.is_null()).then(|| *unsafe { new.into_owned() }.into_box())),
            }
        }

        /// Destroys a replaced value once no pinned thread can hold it.
        ///
        /// # Safety
        ///
        /// As [`Shared::retire`].
        pub(crate) unsafe fn retire(&self, old: &T, guard: &Guard) {
            // SAFETY: the caller's guarantee.
            unsafe { guard.defer_destroy(epoch::Shared::from(old as *const T)) };
        }
    }

    impl<T> Drop for MaybeShared<T> {
        fn drop(&mut self) {
            // SAFETY: `&mut self`: nobody else can reach the current value, so
            // it is ours to free; retired ones are epoch's. Relaxed: `&mut
            // self` already orders every earlier store before this load.
            unsafe {
                let current = self.0.load(Ordering::Relaxed, epoch::unprotected());
                if !current.is_null() {
                    drop(current.into_owned());
                }
            }
        }
    }

    impl<T> Drop for Shared<T> {
        fn drop(&mut self) {
            // SAFETY: `&mut self`: nobody else can reach the current value, so it
            // is ours to free; retired ones are epoch's.
            unsafe {
                drop(
                    self.0
                        .load(Ordering::Relaxed, epoch::unprotected())
                        .into_owned(),
                );
            }
        }
    }
}

#[cfg(loom)]
mod imp {
    use loom::sync::atomic::AtomicPtr;

    use crate::sync::{AtomicU64, Ordering};

    /// No epoch under loom: retired values live until their `Shared` drops.
    pub(crate) struct Guard;

    pub(crate) fn pin() -> Guard {
        Guard
    }

    /// A published value and a loom atomic created with it. A record's fields
    /// are plain memory, which loom does not track, so a reader that got the
    /// pointer without synchronizing with its publisher would read them
    /// unseen; every load below also reads the witness, and loom reports a
    /// causality violation when an atomic is read by a thread its creation
    /// does not happen before. So a missing Acquire or Release on the pointer
    /// fails a model. `value` first (`repr(C)`): a `&T` is a `&Node<T>`.
    #[repr(C)]
    struct Node<T> {
        value: T,
        witness: AtomicU64,
    }

    impl<T> Node<T> {
        fn boxed(value: T) -> *mut Node<T> {
            Box::into_raw(Box::new(Node {
                value,
                witness: AtomicU64::new(0),
            }))
        }

        /// The value, once the witness is read: see the type's docs.
        ///
        /// # Safety
        ///
        /// `node` came from [`Node::boxed`] and is not freed for `'a`.
        unsafe fn seen<'a>(node: *mut Node<T>) -> &'a T {
            // SAFETY: the caller's guarantee.
            let node = unsafe { &*node };
            // Relaxed: only loom's causality check matters, not the value.
            node.witness.load(Ordering::Relaxed);
            &node.value
        }
    }

    /// Values replaced under loom, kept until their pointer drops, so a
    /// reference taken before a replacement stays valid.
    // Boxed on purpose: readers hold references into retired values, so
    // they must not move when the vector grows.
    #[allow(clippy::vec_box)]
    struct Retired<T>(std::sync::Mutex<Vec<Box<Node<T>>>>);

    impl<T> Retired<T> {
        fn new() -> Self {
            Retired(std::sync::Mutex::new(Vec::new()))
        }

        /// Keeps `old` until drop.
        ///
        /// # Safety
        ///
        /// `old` is the value of a node from `Node::boxed` (`repr(C)`, value
        /// first), no longer reachable from its pointer, and kept once.
        unsafe fn keep(&self, old: &T) {
            // SAFETY: the caller's guarantee; the block does not move, so
            // references other threads hold stay valid until drop.
            let old = unsafe { Box::from_raw(old as *const T as *mut Node<T>) };
            self.0.lock().unwrap_or_else(|e| e.into_inner()).push(old);
        }
    }

    /// The loom stand-in: a loom-visible pointer; replaced values are kept in a
    /// list freed on drop, so references taken before a replacement stay valid.
    #[allow(unreachable_pub)] // public only as the sliding log's `RingsHome::Store`
    pub struct Shared<T> {
        ptr: AtomicPtr<Node<T>>,
        retired: Retired<T>,
    }

    impl<T> Shared<T> {
        pub(crate) fn new(value: T) -> Self {
            Shared {
                ptr: AtomicPtr::new(Node::boxed(value)),
                retired: Retired::new(),
            }
        }

        pub(crate) fn load<'g>(&self, _guard: &'g Guard) -> &'g T {
            // Acquire: as the std version's.
            // SAFETY: never null; never freed before `self` drops.
            unsafe { Node::seen(self.ptr.load(Ordering::Acquire)) }
        }

        pub(crate) unsafe fn load_unprotected<'a>(&self) -> &'a T {
            // Acquire: as the std version's.
            // SAFETY: as in `load`.
            unsafe { Node::seen(self.ptr.load(Ordering::Acquire)) }
        }

        pub(crate) fn is_current(&self, value: &T) -> bool {
            // Relaxed: as the std version's.
            std::ptr::eq(self.ptr.load(Ordering::Relaxed) as *const T, value)
        }

        pub(crate) fn compare_exchange<'g>(
            &self,
            current: &'g T,
            new: T,
            _guard: &'g Guard,
        ) -> Result<&'g T, T> {
            let new = Node::boxed(new);
            // AcqRel on success, Relaxed on failure: as the std version's.
            match self.ptr.compare_exchange(
                current as *const T as *mut Node<T>,
                new,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                // SAFETY: just published; freed only when `self` drops.
                Ok(_) => Ok(unsafe { &(*new).value }),
                // SAFETY: `new` came from `Box::into_raw` above and was not published.
                Err(_) => Err(unsafe { Box::from_raw(new) }.value),
            }
        }

        pub(crate) unsafe fn retire(&self, old: &T, _guard: &Guard) {
            // SAFETY: replaced and retired once (the caller's guarantee).
            unsafe { self.retired.keep(old) };
        }

        pub(crate) unsafe fn replace_with(&self, f: impl FnOnce(&T) -> Option<T>) -> bool {
            let guard = pin();
            // Acquire (in `load`): as the std version's.
            let old = self.load(&guard);
            let Some(new) = f(old) else {
                return false;
            };
            // Release: publishes the new value's contents, as the std version's.
            self.ptr.store(Node::boxed(new), Ordering::Release);
            // SAFETY: `old` was just replaced, and by the caller's guarantee
            // by no one else, so it is retired once; the block does not move,
            // so references other threads hold stay valid until drop.
            unsafe { self.retire(old, &guard) };
            true
        }
    }

    /// The loom stand-in of the nullable pointer: as [`Shared`]'s, null
    /// allowed.
    pub(crate) struct MaybeShared<T> {
        ptr: AtomicPtr<Node<T>>,
        retired: Retired<T>,
    }

    impl<T> MaybeShared<T> {
        pub(crate) fn new(value: Option<T>) -> Self {
            MaybeShared {
                ptr: AtomicPtr::new(value.map_or(std::ptr::null_mut(), Node::boxed)),
                retired: Retired::new(),
            }
        }

        pub(crate) fn load<'g>(&self, _guard: &'g Guard) -> Option<&'g T> {
            // Acquire: as the std version's.
            let node = self.ptr.load(Ordering::Acquire);
            // SAFETY: null or from `Node::boxed`, never freed before `self` drops.
            (!node.is_null()).then(|| unsafe { Node::seen(node) })
        }

        pub(crate) fn compare_exchange<'g>(
            &self,
            current: Option<&'g T>,
            new: Option<T>,
            _guard: &'g Guard,
        ) -> Result<Option<&'g T>, Option<T>> {
            let current = current.map_or(std::ptr::null_mut(), |c| c as *const T as *mut Node<T>);
            let new = new.map_or(std::ptr::null_mut(), Node::boxed);
            // AcqRel on success, Relaxed on failure: as the std version's.
            match self
                .ptr
                .compare_exchange(current, new, Ordering::AcqRel, Ordering::Relaxed)
            {
                // SAFETY: just published (or null); freed only when `self` drops.
                Ok(_) => Ok((!new.is_null()).then(|| unsafe { &(*new).value })),
                // SAFETY: `new` came from `Box::into_raw` above and was not published.
                Err(_) => Err((!new.is_null()).then(|| unsafe { Box::from_raw(new) }.value)),
            }
        }

        pub(crate) unsafe fn retire(&self, old: &T, _guard: &Guard) {
            // SAFETY: replaced and retired once (the caller's guarantee).
            unsafe { self.retired.keep(old) };
        }
    }

    impl<T> Drop for MaybeShared<T> {
        fn drop(&mut self) {
            // Relaxed: `&mut self`, nobody else holds the pointer.
            let node = self.ptr.load(Ordering::Relaxed);
            if !node.is_null() {
                // SAFETY: `&mut self`: nobody else holds the pointer.
                drop(unsafe { Box::from_raw(node) });
            }
        }
    }

    impl<T> Drop for Shared<T> {
        fn drop(&mut self) {
            // Relaxed: `&mut self`, nobody else holds the pointer.
            // SAFETY: `&mut self`: nobody else holds the pointer.
            drop(unsafe { Box::from_raw(self.ptr.load(Ordering::Relaxed)) });
        }
    }
}

/// The epoch pointers' one compare-and-swap loop ([`Shared::update`],
/// [`MaybeShared::update_from`]), as `cell::update` is the words': from
/// `current`, a value of the pointer, `decide` makes a successor (it may
/// allocate one), `swap` tries to publish it in place of `current`; a lost
/// race drops the successor, `load`s the pointer again and decides again on
/// what it holds. Returns the value replaced (the caller's to retire, once no
/// reader can reach it) and the one published, or `decide`'s refusal.
///
/// `decide` may run several times, so it must decide on the value it is
/// given alone, and anything it does besides must be safe to do again.
fn update_pointer<C: Copy, N, E>(
    mut current: C,
    load: impl Fn() -> C,
    swap: impl Fn(C, N) -> Result<C, N>,
    mut decide: impl FnMut(C) -> Result<N, E>,
) -> Result<(C, C), E> {
    loop {
        let next = decide(current)?;
        match swap(current, next) {
            Ok(published) => return Ok((current, published)),
            // The CAS's failure ordering reads nothing through the pointer
            // (see `compare_exchange`): the value to decide on next is
            // loaded again, with `load`'s Acquire.
            Err(_) => current = load(),
        }
    }
}

impl<T> Shared<T> {
    /// Replaces the current value by `decide`'s successor of it, deciding
    /// again on the newer value when another replacement came first; returns
    /// `(replaced, published)`, or `decide`'s refusal. The replaced value is
    /// *not* retired: see `retire`, which the caller calls once no reader
    /// can reach it.
    pub(crate) fn update<'g, E>(
        &self,
        guard: &'g Guard,
        decide: impl FnMut(&'g T) -> Result<T, E>,
    ) -> Result<(&'g T, &'g T), E> {
        update_pointer(
            // Acquire (in `load`): the decision reads the value's contents.
            self.load(guard),
            || self.load(guard),
            |current, next| self.compare_exchange(current, next, guard),
            decide,
        )
    }

    /// Runs `f` on the current value, which stays alive until `f` returns.
    #[inline]
    pub(crate) fn with<R>(&self, f: impl FnOnce(&T) -> R) -> R {
        let guard = pin();
        // Acquire (in `load`): pairs with the Release that published the
        // value, so its contents are visible before `f` uses them.
        f(self.load(&guard))
    }
}

impl<T> MaybeShared<T> {
    /// [`Shared::update`] from `current`, a value (or the absence of one)
    /// the caller has already loaded: `decide` makes its successor (a value
    /// or nothing).
    pub(crate) fn update_from<'g, E>(
        &self,
        current: Option<&'g T>,
        guard: &'g Guard,
        decide: impl FnMut(Option<&'g T>) -> Result<Option<T>, E>,
    ) -> Result<(Option<&'g T>, Option<&'g T>), E> {
        update_pointer(
            current,
            // Acquire (in `load`): as `Shared::update`'s.
            || self.load(guard),
            |current, next| self.compare_exchange(current, next, guard),
            decide,
        )
    }
}

impl<T: fmt::Debug> fmt::Debug for Shared<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let guard = pin();
        f.debug_tuple("Shared").field(self.load(&guard)).finish()
    }
}
