//! Who the calling thread is, for the striped state: a hint that spreads
//! threads over stripes (the CPU it runs on), and a number no other live
//! thread holds. Here, in the facade, because both are the OS's under `std`
//! and the model thread's under loom: a model must explore the same
//! executions every run, which an OS-given number would not allow.
//!
//! Neither is limiter state. The hint only spreads threads out (any hint,
//! even the same for every thread, leaves every limiter exact); the
//! exclusive number lets a cell have one writer at a time.

/// A number for the calling thread that spreads threads over stripes: the
/// CPU it first asked on (as a rank among the CPUs the process may use), or
/// round-robin where the OS cannot say; kept until the thread loses a race on
/// its stripe ([`refresh_thread_hint`]).
///
/// The counter is `std`'s, not the sync facade's, on purpose: it is not limiter
/// state (any hint, even the same for every thread, leaves the limiter exact),
/// and it must be a `static`, which loom's atomics cannot be. Under loom the hint
/// is the model thread's number instead, which is deterministic across the
/// executions loom explores.
#[cfg(not(loom))]
#[inline]
pub(crate) fn thread_hint() -> usize {
    HINT.with(|hint| {
        let mine = hint.get();
        if mine != usize::MAX {
            return mine;
        }
        let mine = current_cpu().unwrap_or_else(round_robin);
        hint.set(mine);
        mine
    })
}

/// Called by a thread that lost a compare-and-swap on its own stripe to
/// another thread: it takes the stripe of the CPU it runs on now.
///
/// Why: with more threads than stripes (or a thread that migrated), a
/// per-thread number can put two threads that run at the same time on
/// different cores on one stripe, for as long as they live — at 4 threads on
/// 2 cores, a third of the time. A thread's CPU is the number that keeps
/// cores apart, but asking for it on every check costs more than the check
/// (a few ns where a spend is one CAS). A lost race is the sign that the
/// cached number is wrong, so the thread asks then, and only then: no
/// counts, spins or thresholds, so nothing here depends on the CPU model.
#[cfg(not(loom))]
#[cold]
pub(crate) fn refresh_thread_hint() {
    if let Some(cpu) = current_cpu() {
        HINT.with(|hint| hint.set(cpu));
    }
}

/// Puts the calling thread on stripe `hint` (masked by each limiter), for
/// tests that play several threads' parts from one.
#[cfg(all(test, not(loom)))]
pub(crate) fn set_thread_hint(hint: usize) {
    HINT.with(|cell| cell.set(hint));
}

/// Under loom the hint stays the thread's number: a refresh would make it
/// depend on the OS, not on the explored schedule.
#[cfg(loom)]
pub(crate) fn refresh_thread_hint() {}

#[cfg(not(loom))]
std::thread_local! {
    static HINT: std::cell::Cell<usize> = const { std::cell::Cell::new(usize::MAX) };
}

/// The next number of a process-wide count, for threads whose CPU is unknown.
#[cfg(not(loom))]
fn round_robin() -> usize {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    // Relaxed: only distinctness matters, which any ordering gives an RMW.
    NEXT.fetch_add(1, Ordering::Relaxed) % (usize::MAX / 2)
}

/// The CPU the calling thread runs on, as its rank among the CPUs the process
/// may run on when it first asked: a process confined to CPUs 8 and 10 gets 0
/// and 1, which mask to different stripes, where the raw numbers would share
/// one. A CPU outside that set (the affinity changed since) answers with its
/// own number.
#[cfg(all(target_os = "linux", not(loom)))]
fn current_cpu() -> Option<usize> {
    use std::sync::OnceLock;
    /// `CPU_SETSIZE` ranks; `u16::MAX` for a CPU the process may not use.
    static RANKS: OnceLock<Box<[u16]>> = OnceLock::new();

    // SAFETY: no preconditions. glibc (2.35+) answers from the thread's rseq
    // area without a system call, older ones through the vDSO.
    let cpu = usize::try_from(unsafe { libc::sched_getcpu() }).ok()?;
    let ranks = RANKS.get_or_init(|| {
        // SAFETY: `cpu_set_t` is a plain bit array; all zeros is empty.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: `set` is a valid, writable `cpu_set_t` of the size passed.
        let known =
            unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) }
                == 0;
        let mut next = 0u16;
        (0..libc::CPU_SETSIZE as usize)
            .map(|cpu| {
                // SAFETY: `cpu < CPU_SETSIZE`, the set's size in bits.
                if known && unsafe { libc::CPU_ISSET(cpu, &set) } {
                    next += 1;
                    next - 1
                } else {
                    u16::MAX
                }
            })
            .collect()
    });
    match ranks.get(cpu) {
        Some(&rank) if rank != u16::MAX => Some(usize::from(rank)),
        _ => Some(cpu),
    }
}

/// Elsewhere the OS is not asked: threads are numbered round-robin.
#[cfg(all(not(target_os = "linux"), not(loom)))]
fn current_cpu() -> Option<usize> {
    None
}

#[cfg(loom)]
pub(crate) fn thread_hint() -> usize {
    // loom threads are numbered 0 (the model's main thread), 1, 2, ... in spawn
    // order; loom prints the number and offers no other way to read it.
    let id = format!("{:?}", loom::thread::current().id());
    id.bytes()
        .filter(u8::is_ascii_digit)
        .fold(0, |acc, d| acc * 10 + usize::from(d - b'0'))
}

/// A number no other live thread holds: the lowest free one, taken at the
/// calling thread's first ask and given back when it exits (its successor
/// may take it). `None` while the thread is being torn down (its number is
/// already given back).
///
/// Unlike [`thread_hint`], which only spreads threads out, this one is
/// *exclusive*: a cell indexed by it has one writer at a time, which may
/// then add to it with a plain load and store instead of a locked
/// read-modify-write (`Counted`'s counts). A number passes from an exiting
/// thread to the next through the registry's lock, which orders the old
/// owner's last store before the new owner's first load.
///
/// The registry is `std`'s on purpose: it is a process-wide `static`, which
/// loom's primitives cannot be. Under loom the number is the model thread's
/// (unique among a model's threads, and deterministic).
#[cfg(not(loom))]
#[inline]
pub(crate) fn thread_slot() -> Option<usize> {
    SLOT.try_with(|slot| slot.0).ok()
}

#[cfg(loom)]
pub(crate) fn thread_slot() -> Option<usize> {
    Some(thread_hint())
}

/// A thread's exclusive number, given back to [`FREE_SLOTS`] at thread exit.
#[cfg(not(loom))]
struct Slot(usize);

/// The numbers given back by exited threads (a min-heap: the lowest is
/// reused first, so long-lived processes keep numbers small), and the next
/// never-used one.
#[cfg(not(loom))]
static FREE_SLOTS: std::sync::Mutex<(
    std::collections::BinaryHeap<std::cmp::Reverse<usize>>,
    usize,
)> = std::sync::Mutex::new((std::collections::BinaryHeap::new(), 0));

#[cfg(not(loom))]
impl Slot {
    fn take() -> Slot {
        // A poisoned lock still holds a consistent heap (no code here panics
        // between its writes), so its content is taken as it is.
        let mut free = FREE_SLOTS
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let number = match free.0.pop() {
            Some(std::cmp::Reverse(number)) => number,
            None => {
                free.1 += 1;
                free.1 - 1
            }
        };
        Slot(number)
    }
}

#[cfg(not(loom))]
impl Drop for Slot {
    fn drop(&mut self) {
        let mut free = FREE_SLOTS
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        free.0.push(std::cmp::Reverse(self.0));
    }
}

#[cfg(not(loom))]
std::thread_local! {
    static SLOT: Slot = Slot::take();
}

#[cfg(all(test, target_os = "linux", not(loom)))]
mod tests {
    use super::*;

    /// The hint is a rank among the CPUs this process may run on (not the
    /// CPU's own number), before and after a refresh, on whichever CPU this
    /// runs.
    #[test]
    fn hints_are_ranks_below_the_cpus_the_process_may_use() {
        // SAFETY: as in `current_cpu`.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: as in `current_cpu`.
        let status =
            unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
        assert_eq!(status, 0);
        // SAFETY: `set` was filled by `sched_getaffinity`.
        let cpus = usize::try_from(unsafe { libc::CPU_COUNT(&set) }).expect("a count");
        for _ in 0..100 {
            let rank = current_cpu().expect("Linux names the CPU");
            assert!(rank < cpus, "rank {rank} of {cpus} CPUs");
            refresh_thread_hint();
            assert!(thread_hint() < cpus);
        }
    }
}

#[cfg(all(test, not(loom)))]
mod slot_tests {
    use super::thread_slot;
    use std::sync::{Arc, Barrier};

    /// Threads alive at one time hold different numbers: the exclusivity a
    /// cell written with plain stores rests on. (Other tests' threads take
    /// numbers too, so which numbers is not asserted.)
    #[test]
    fn live_threads_hold_different_slots() {
        let threads = 16;
        let barrier = Arc::new(Barrier::new(threads));
        let mut slots: Vec<usize> = (0..threads)
            .map(|_| {
                let barrier = Arc::clone(&barrier);
                std::thread::spawn(move || {
                    let slot = thread_slot().expect("a live thread has a slot");
                    // Every thread holds its number until all have one.
                    barrier.wait();
                    assert_eq!(thread_slot(), Some(slot), "a thread keeps its number");
                    slot
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|handle| handle.join().expect("the thread ran"))
            .collect();
        slots.sort_unstable();
        slots.dedup();
        assert_eq!(slots.len(), threads);
    }
}
