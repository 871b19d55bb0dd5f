//! How a thread waits: [`Backoff`], the one helper for every "wait a little"
//! in tollgate, with two methods for the two reasons a thread waits.
//!
//! - [`Backoff::wait`]: after a **lost race** (a compare-and-swap that found
//!   another thread's update). The loser has nothing to wait *for*: it can
//!   decide again at once, and the wait only gives the winner room. It never
//!   yields the thread, and under loom it is nothing.
//! - [`Backoff::pause`]: while **waiting for another thread** to finish a step
//!   that this one cannot do for it (a sliding-log writer between its claim
//!   and its stores, a reconfiguration publishing its ring, a keyed-map reader
//!   leaving its slot). Here progress needs the other thread to run: once the
//!   short spins are used up the waiter yields its core (the other thread may
//!   be preempted, and on a 2-core machine it often is), and under loom it
//!   yields to loom's scheduler, without which a model that spins on another
//!   thread's store never ends.
//!
//! Both wait for stretches of **time**, not for a count of spin hints.
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
//! The TSC is read through quanta, as `MonotonicClock` reads it (one
//! process-wide calibration, so the same nanoseconds), but directly: `sync`
//! stands below the clocks and imports nothing above it.
//!
//! Under loom the waits are nothing (a model explores interleavings, not
//! durations, and a lost race there is simply decided again) and a pause is a
//! loom yield.

/// The first wait after a lost race, in nanoseconds: about one cache-line
/// transfer between cores.
#[cfg(not(loom))]
const FIRST_WAIT_NS: u64 = 32;

/// The longest single wait, in nanoseconds: thirty-two first waits (six
/// doublings, as the spin loop it replaces had seven steps).
#[cfg(not(loom))]
const LONGEST_WAIT_NS: u64 = 1024;

/// The waits of one operation: create one per operation, call
/// [`Backoff::wait`] after each lost race, or [`Backoff::pause`] each time the
/// operation finds it must wait for another thread (see the module docs for
/// which is which).
#[derive(Debug)]
pub(crate) struct Backoff {
    /// The next wait in nanoseconds; past [`LONGEST_WAIT_NS`] only after
    /// `pause` has spun its longest wait (its waits then yield).
    #[cfg(not(loom))]
    next_ns: u64,
}

impl Default for Backoff {
    /// The same as [`Backoff::new`].
    fn default() -> Self {
        Self::new()
    }
}

impl Backoff {
    /// No wait yet; the first waits [`FIRST_WAIT_NS`].
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
        spin_for(self.next_ns);
        self.next_ns = (self.next_ns * 2).min(LONGEST_WAIT_NS);
    }

    /// Under loom: nothing (see the module docs).
    #[cfg(loom)]
    pub(crate) fn wait(&mut self) {}

    /// Waits for another thread to finish a step: the waits of
    /// [`wait`](Backoff::wait) up to and including the longest one (about 2 µs
    /// in all), then a yield of the thread at every call, so a preempted
    /// thread that is waited for can run.
    #[cfg(not(loom))]
    #[cold]
    pub(crate) fn pause(&mut self) {
        if self.next_ns > LONGEST_WAIT_NS {
            std::thread::yield_now();
        } else {
            spin_for(self.next_ns);
            self.next_ns *= 2;
        }
    }

    /// Under loom: a loom yield, so the model runs the thread waited for.
    #[cfg(loom)]
    pub(crate) fn pause(&mut self) {
        loom::thread::yield_now();
    }
}

/// Spins (with spin hints) until `ns` nanoseconds have passed on the TSC.
#[cfg(not(loom))]
fn spin_for(ns: u64) {
    let tsc = tsc();
    let until = tsc.delta_as_nanos(0, tsc.raw()) + ns;
    while tsc.delta_as_nanos(0, tsc.raw()) < until {
        std::hint::spin_loop();
    }
}

/// The process's TSC through quanta. `quanta::Clock::new` asks CPUID whether
/// the TSC can be used (15–20 µs in a VM, where CPUID traps), so it is asked
/// once and every wait reads a copy.
#[cfg(not(loom))]
fn tsc() -> &'static quanta::Clock {
    static TSC: std::sync::OnceLock<quanta::Clock> = std::sync::OnceLock::new();
    TSC.get_or_init(quanta::Clock::new)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn now() -> u64 {
        tsc().delta_as_nanos(0, tsc().raw())
    }

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
            let start = now();
            backoff.wait();
            assert!(now() - start >= expected);
            expected = (expected * 2).min(LONGEST_WAIT_NS);
        }
        assert_eq!(backoff.next_ns, LONGEST_WAIT_NS);
    }

    /// A pause spins the same doubling waits, the longest one included, and
    /// from then on yields instead of spinning.
    #[test]
    fn pauses_spin_the_waits_then_yield() {
        let mut backoff = Backoff::default();
        let mut expected = FIRST_WAIT_NS;
        while expected <= LONGEST_WAIT_NS {
            assert_eq!(backoff.next_ns, expected);
            let start = now();
            backoff.pause();
            assert!(now() - start >= expected);
            expected *= 2;
        }
        let spun_out = backoff.next_ns;
        assert!(spun_out > LONGEST_WAIT_NS);
        for _ in 0..4 {
            backoff.pause();
            assert_eq!(backoff.next_ns, spun_out, "a yield, not a spin");
        }
    }
}
