//! Where limiters get the time.
//!
//! The user-facing documentation (promise, state, proof) is on [`Clock`].

mod cached;
mod manual;
mod monotonic;

pub use cached::CachedClock;
pub use manual::ManualClock;
pub use monotonic::MonotonicClock;

/// A source of time in integer nanoseconds since an arbitrary, fixed origin.
///
/// Implement it to drive a limiter from your own time source; readings should not
/// go backwards, but a limiter stays safe if they do (it denies until the clock
/// catches up, and never panics).
///
/// ```
/// use tollgate::{Clock, Rate, RateLimiter, TokenBucket};
///
/// struct Frozen;
/// impl Clock for Frozen {
///     fn now(&self) -> u64 { 42 }
/// }
///
/// let bucket = TokenBucket::with_clock(1, Rate::per_second(1), Frozen).unwrap();
/// assert!(bucket.try_acquire().is_ok());
/// assert!(bucket.try_acquire().is_err()); // time never moves, so no refill
/// ```
///
/// Where limiters get the time.
///
/// A [`Clock`] gives integer nanoseconds. Three are provided:
///
/// | clock | source | cost of a read | precision |
/// |---|---|---|---|
/// | [`MonotonicClock`] (default) | the TSC through quanta | ~10 ns | ~1 ns |
/// | [`CachedClock`] | one atomic refreshed by tollgate's own upkeep thread | ~0.3 ns (one relaxed load) | the upkeep interval (1 ms by default) |
/// | [`ManualClock`] | whatever the test sets | one atomic load | exact |
///
/// The two real clocks never step backwards as seen by any one thread, even when
/// the thread migrates between cores whose TSCs disagree (governor #299). Across
/// threads, two readings taken concurrently are unordered anyway, so every limiter
/// also treats a reading older than its state as if time had stood still: a stale
/// reading can make it deny, never over-admit.
pub trait Clock {
    /// Nanoseconds since this clock's origin.
    fn now(&self) -> u64;

    /// The reading a limiter decides on: [`Clock::now`], unless the clock can
    /// skip work that a limiter does not need. Every tollgate limiter treats a
    /// reading older than its own state as "time stood still" (it can only
    /// deny more, and the backwards-clock tests check that), so
    /// [`MonotonicClock`] skips its per-thread backwards guard here. Implement
    /// only [`Clock::now`]; this has a default.
    ///
    /// ```
    /// use tollgate::{Clock, ManualClock};
    /// let clock = ManualClock::new();
    /// clock.set(5);
    /// assert_eq!(clock.now_for_limiter(), 5);
    /// ```
    #[doc(hidden)]
    #[inline]
    fn now_for_limiter(&self) -> u64 {
        self.now()
    }
}

/// A reference or an `Arc` of a clock reads the clock it points to, the
/// limiter's reading included.
macro_rules! forward_clock {
    ($($pointer:ty),*) => {
        $(
            impl<C: Clock + ?Sized> Clock for $pointer {
                #[inline]
                fn now(&self) -> u64 {
                    (**self).now()
                }

                #[inline]
                fn now_for_limiter(&self) -> u64 {
                    (**self).now_for_limiter()
                }
            }
        )*
    };
}

forward_clock!(&C, std::sync::Arc<C>);
