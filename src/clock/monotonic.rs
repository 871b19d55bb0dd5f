//! The default clock: the TSC through quanta, never stepping backwards.

use std::cell::Cell;
use std::sync::OnceLock;

use super::Clock;

/// The process-wide quanta clock and the raw TSC reading that is nanosecond zero.
/// One timeline for every `MonotonicClock` lets the backwards-step guard below be
/// a single thread-local.
fn source() -> &'static (quanta::Clock, u64) {
    static SOURCE: OnceLock<(quanta::Clock, u64)> = OnceLock::new();
    SOURCE.get_or_init(|| {
        let clock = quanta::Clock::new();
        let origin = clock.raw();
        (clock, origin)
    })
}

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
/// decrease on any one thread. It is a zero-sized handle: every `MonotonicClock`
/// reads the same timeline.
///
/// ```
/// use tollgate::{Clock, MonotonicClock};
///
/// let clock = MonotonicClock::new();
/// let a = clock.now();
/// let b = clock.now();
/// assert!(b >= a);
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct MonotonicClock;

impl MonotonicClock {
    /// A handle on the process-wide TSC timeline. The first call calibrates quanta
    /// (up to a few hundred milliseconds, once per process).
    ///
    /// ```
    /// let _clock = tollgate::MonotonicClock::new();
    /// ```
    pub fn new() -> Self {
        source();
        MonotonicClock
    }
}

impl Clock for MonotonicClock {
    #[inline]
    fn now(&self) -> u64 {
        let (clock, origin) = source();
        let read = clock.delta_as_nanos(*origin, clock.raw());
        LAST.with(|last| {
            let now = read.max(last.get());
            last.set(now);
            now
        })
    }
}
