//! The fastest clock: quanta's cached `recent()` time, refreshed by a thread.

use std::cell::Cell;
use std::sync::OnceLock;
use std::time::Duration;

use super::Clock;

/// How often the upkeep thread refreshes the cached time.
const UPKEEP_INTERVAL: Duration = Duration::from_millis(1);

/// The instant that is nanosecond zero, taken after the upkeep thread has
/// published its first reading. The upkeep handle lives as long as the process.
fn origin() -> &'static quanta::Instant {
    static ORIGIN: OnceLock<quanta::Instant> = OnceLock::new();
    ORIGIN.get_or_init(|| {
        match quanta::Upkeep::new(UPKEEP_INTERVAL).start() {
            // Leaked on purpose: dropping the handle stops the thread, and the
            // cached time must stay fresh for as long as any limiter reads it.
            Ok(handle) => std::mem::forget(handle),
            // Another upkeep thread (someone else's, e.g. governor's
            // `QuantaUpkeepClock`) already refreshes the same global value.
            Err(quanta::Error::UpkeepRunning) => {}
            // No thread could be spawned. `recent()` would then freeze at the last
            // value set; setting none makes quanta fall back to a real read.
            Err(_) => {}
        }
        quanta::Instant::recent()
    })
}

thread_local! {
    /// The latest reading this thread returned (see `MonotonicClock`).
    static LAST: Cell<u64> = const { Cell::new(0) };
}

/// The fastest clock: a cached time that an upkeep thread refreshes every
/// millisecond, read in about 2–3 ns instead of the TSC's 10.
///
/// **Precision**: a reading lags real time by up to the upkeep interval (1 ms)
/// plus the upkeep thread's scheduling delay. A limiter on this clock therefore
/// decides as if each request arrived up to ~1 ms earlier than it did: it never
/// admits more than its rate allows over the cached timeline, but refills arrive
/// in 1 ms steps and retry-after values are exact only to ~1 ms. Use it where the
/// limit's period is much longer than a millisecond (the usual case: per second,
/// per minute).
///
/// The first `CachedClock` in the process starts quanta's upkeep thread (or joins
/// one already running); it runs until the process exits.
///
/// ```
/// use tollgate::{CachedClock, Clock, Rate, RateLimiter, TokenBucket};
///
/// let bucket = TokenBucket::with_clock(10, Rate::per_second(100), CachedClock::new()).unwrap();
/// assert!(bucket.try_acquire().is_ok());
/// let clock = CachedClock::new();
/// assert!(clock.now() <= clock.now());
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct CachedClock;

impl CachedClock {
    /// A handle on the cached timeline, starting the upkeep thread if needed.
    ///
    /// ```
    /// let _clock = tollgate::CachedClock::new();
    /// ```
    pub fn new() -> Self {
        origin();
        CachedClock
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

impl Clock for CachedClock {
    #[inline]
    fn now(&self) -> u64 {
        let elapsed = quanta::Instant::recent().saturating_duration_since(*origin());
        // `as_secs() * 1e9` cannot overflow u64 for 584 years of uptime.
        let read = elapsed.as_secs() * 1_000_000_000 + u64::from(elapsed.subsec_nanos());
        LAST.with(|last| {
            let now = read.max(last.get());
            last.set(now);
            now
        })
    }
}
