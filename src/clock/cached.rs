//! The fastest clock: a reading cached in one atomic, refreshed by a thread.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::{Clock, MonotonicClock};

/// How often the upkeep thread refreshes the cached time.
const UPKEEP_INTERVAL: Duration = Duration::from_millis(1);

/// The cached reading: a [`MonotonicClock`] reading taken by the upkeep thread.
/// A std atomic on purpose: it is a process-wide `static` (loom atomics cannot
/// be), and it is not limiter state, so no loom model needs to see it.
static CACHED: AtomicU64 = AtomicU64::new(0);

/// Starts tollgate's own upkeep thread once per process. tollgate does not share
/// quanta's global upkeep thread: that one belongs to whoever started it (e.g.
/// governor's `QuantaUpkeepClock`), stops when its owner drops its handle, and
/// refuses a second starter — either way one library's cached clock would
/// silently freeze or fail because of the other.
fn start_upkeep() -> bool {
    static STARTED: OnceLock<bool> = OnceLock::new();
    *STARTED.get_or_init(|| {
        let source = MonotonicClock::new();
        // Relaxed: a reading is a plain number; nothing else is published with it.
        CACHED.store(source.now(), Ordering::Relaxed);
        std::thread::Builder::new()
            .name("tollgate-clock".into())
            .spawn(move || {
                loop {
                    std::thread::sleep(UPKEEP_INTERVAL);
                    // Relaxed: see above. One writer whose readings never decrease
                    // (the monotonic guard is per thread, and this is one thread),
                    // so every reader sees a non-decreasing sequence (coherence).
                    CACHED.store(source.now(), Ordering::Relaxed);
                }
            })
            .is_ok()
    })
}

/// The fastest clock: a time cached in one atomic that a tollgate thread
/// refreshes every millisecond, read in about 1 ns instead of the TSC's 10.
///
/// **Precision**: a reading lags real time by up to the upkeep interval (1 ms)
/// plus the upkeep thread's scheduling delay. A limiter on this clock therefore
/// decides as if each request arrived up to ~1 ms earlier than it did: it never
/// admits more than its rate allows over the cached timeline, but refills arrive
/// in 1 ms steps and retry-after values are exact only to ~1 ms. Use it where the
/// limit's period is much longer than a millisecond (the usual case: per second,
/// per minute).
///
/// The first `CachedClock` in the process starts the upkeep thread, which runs
/// until the process exits. It is tollgate's own thread, independent of quanta's
/// global upkeep thread, so it neither freezes when someone else's upkeep handle
/// is dropped nor stops them from starting one. If the thread cannot be spawned,
/// readings fall back to the [`MonotonicClock`].
///
/// Readings share the [`MonotonicClock`]'s timeline and never decrease.
///
/// ```
/// use tollgate::{CachedClock, Clock, Rate, RateLimiter, TokenBucket};
///
/// let bucket = TokenBucket::with_clock(10, Rate::per_second(100), CachedClock::new()).unwrap();
/// assert!(bucket.try_acquire().is_ok());
/// let clock = CachedClock::new();
/// assert!(clock.now() <= clock.now());
/// ```
#[derive(Debug, Clone)]
pub struct CachedClock {
    /// `Some` only if the upkeep thread could not be started.
    fallback: Option<MonotonicClock>,
}

impl CachedClock {
    /// A handle on the cached timeline, starting the upkeep thread if needed.
    ///
    /// ```
    /// let _clock = tollgate::CachedClock::new();
    /// ```
    pub fn new() -> Self {
        CachedClock {
            fallback: (!start_upkeep()).then(MonotonicClock::new),
        }
    }

    /// How far behind real time a reading may lag, before scheduling delays.
    ///
    /// ```
    /// assert_eq!(tollgate::CachedClock::precision(), std::time::Duration::from_millis(1));
    /// ```
    pub const fn precision() -> Duration {
        UPKEEP_INTERVAL
    }
}

impl Default for CachedClock {
    fn default() -> Self {
        CachedClock::new()
    }
}

impl Clock for CachedClock {
    #[inline]
    fn now(&self) -> u64 {
        match &self.fallback {
            // Relaxed: see `start_upkeep`.
            None => CACHED.load(Ordering::Relaxed),
            Some(clock) => clock.now(),
        }
    }
}
