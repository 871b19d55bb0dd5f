//! The default clock: the TSC through quanta, never stepping backwards.

use std::cell::Cell;

use super::Clock;

thread_local! {
    /// The latest reading this thread has returned. Thread-local, so the guard
    /// costs no shared write: a shared high-water mark would put every check of
    /// every thread on one contended cache line.
    static LAST: Cell<u64> = const { Cell::new(0) };
}

/// The default clock: the CPU's time-stamp counter read through
/// [quanta](https://docs.rs/quanta), about 10 ns per read, scaled to nanoseconds.
///
/// A thread that migrates to a core whose TSC lags would see time step backwards;
/// this clock returns the thread's previous reading instead, so its readings never
/// decrease on any one thread. Every `MonotonicClock` reads the same timeline
/// (nanoseconds since the counter's zero, scaled by quanta's one process-wide
/// calibration), so that guard is a single thread-local.
///
/// ```
/// use tollgate::{Clock, MonotonicClock};
///
/// let clock = MonotonicClock::new();
/// let a = clock.now();
/// let b = clock.now();
/// assert!(b >= a);
/// ```
#[derive(Debug, Clone)]
pub struct MonotonicClock {
    // Held by value, so a reading is the counter read and its scaling, with no
    // global lookup in between.
    clock: quanta::Clock,
}

impl MonotonicClock {
    /// A handle on the process-wide TSC timeline. The first call calibrates quanta
    /// (up to a few hundred milliseconds, once per process).
    ///
    /// ```
    /// let _clock = tollgate::MonotonicClock::new();
    /// ```
    pub fn new() -> Self {
        // `quanta::Clock::new` asks CPUID whether the TSC can be used (15–20 µs
        // in a VM, where CPUID traps); the answer cannot change while the
        // process runs, so it is asked once and every clock is a copy.
        static CLOCK: std::sync::OnceLock<quanta::Clock> = std::sync::OnceLock::new();
        MonotonicClock {
            clock: CLOCK.get_or_init(quanta::Clock::new).clone(),
        }
    }
}

impl Default for MonotonicClock {
    /// The same as [`MonotonicClock::new`].
    ///
    /// ```
    /// let _clock = tollgate::MonotonicClock::default();
    /// ```
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    #[inline]
    fn now(&self) -> u64 {
        // The delta from counter value 0 is the whole reading, scaled: an absolute
        // timeline shared by every instance (quanta calibrates once per process).
        let read = self.clock.delta_as_nanos(0, self.clock.raw());
        LAST.with(|last| {
            let now = read.max(last.get());
            last.set(now);
            now
        })
    }

    /// The raw scaled reading, without the backwards guard (about 0.7 ns of a
    /// check): a limiter already holds time still for a reading older than its
    /// state, so the guard would only repeat that.
    #[inline]
    fn now_for_limiter(&self) -> u64 {
        self.clock.delta_as_nanos(0, self.clock.raw())
    }
}
