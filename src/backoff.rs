//! How a thread that lost a compare-and-swap waits before it decides again:
//! for a stretch of **time**, not for a count of spin hints.
//!
//! Why wait at all: when two cores update one word in turn, each update pulls
//! the word's cache line over from the other core, and a retry straight after
//! a lost race mostly loses again (the winner is already updating). A loser
//! that steps aside for a moment lets the winner run its next few updates
//! with the line still in its own cache.
//!
//! Why time: the usual loop (`crossbeam_utils::Backoff::spin`, 1, 2, 4 … 64
//! `pause` instructions) waits as long as `pause` lasts, and that differs by
//! more than ten times between CPU families and generations (about 140 cycles
//! on Intel since Skylake, a few to a few dozen on AMD Zen): the same loop
//! waits 40 ns on one machine and 2 ns on another. Here the waits are
//! nanoseconds read from the TSC, so they are the same on every CPU. They are
//! scaled to what they stand aside for, not to a benchmark: the first is
//! [`FIRST_WAIT_NS`], about one transfer of a cache line between two cores of
//! a current x86 server (tens of nanoseconds on either family), each further
//! loss doubles it, and none exceeds [`LONGEST_WAIT_NS`], so a request never
//! waits more than about a microsecond per lost race and a thread that never
//! loses never reads the clock here.
//!
//! Under loom the wait is nothing: a model explores interleavings, not
//! durations, and a lost race there is simply decided again.

/// The first wait after a lost race, in nanoseconds: about one cache-line
/// transfer between cores.
#[cfg(not(loom))]
const FIRST_WAIT_NS: u64 = 32;

/// The longest single wait, in nanoseconds: thirty-two first waits (six
/// doublings, as the spin loop it replaces had seven steps).
#[cfg(not(loom))]
const LONGEST_WAIT_NS: u64 = 1024;

/// The waits of one operation's retries: create one per operation, call
/// [`Backoff::wait`] after each lost race.
#[derive(Debug)]
pub(crate) struct Backoff {
    /// The next wait in nanoseconds.
    #[cfg(not(loom))]
    next_ns: u64,
}

impl Backoff {
    /// No wait yet; the first lost race waits [`FIRST_WAIT_NS`].
    #[inline]
    pub(crate) fn new() -> Self {
        Backoff {
            #[cfg(not(loom))]
            next_ns: FIRST_WAIT_NS,
        }
    }

    /// Waits after a lost race, twice as long as the last time, at most
    /// [`LONGEST_WAIT_NS`]. Spins (with spin hints) rather than sleeping: the
    /// wait is far shorter than the OS can schedule.
    #[cfg(not(loom))]
    #[cold]
    pub(crate) fn wait(&mut self) {
        let clock = crate::clock::MonotonicClock::new();
        let until = crate::clock::Clock::now_for_limiter(&clock) + self.next_ns;
        while crate::clock::Clock::now_for_limiter(&clock) < until {
            std::hint::spin_loop();
        }
        self.next_ns = (self.next_ns * 2).min(LONGEST_WAIT_NS);
    }

    /// Under loom: nothing (see the module docs).
    #[cfg(loom)]
    pub(crate) fn wait(&mut self) {}
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::clock::{Clock, MonotonicClock};

    /// Each wait lasts at least its own length on the clock it reads
    /// (whatever a spin hint costs on this CPU), the lengths double, and they
    /// stop growing at the cap. (Only lower bounds: a preempted thread waits
    /// longer.)
    #[test]
    fn waits_last_at_least_their_time_and_double_up_to_the_cap() {
        let mut backoff = Backoff::new();
        let mut expected = FIRST_WAIT_NS;
        for _ in 0..8 {
            assert_eq!(backoff.next_ns, expected);
            let clock = MonotonicClock::new();
            let start = clock.now_for_limiter();
            backoff.wait();
            assert!(clock.now_for_limiter() - start >= expected);
            expected = (expected * 2).min(LONGEST_WAIT_NS);
        }
        assert_eq!(backoff.next_ns, LONGEST_WAIT_NS);
    }
}
