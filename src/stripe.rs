//! Which stripe a thread uses: a per-thread hint shared by every striped limiter.
//!
//! Striped limiters (the sliding window's leases, the sliding log's rings) give
//! each thread a home stripe so that threads on different cores write different
//! cache lines. The hint only spreads threads out; no limiter's exactness
//! depends on it.

/// The most stripes a limiter will have; more only cost memory and longer
/// steal scans.
pub(crate) const MAX_STRIPES: usize = 256;

/// The default stripe count: the machine's parallelism, rounded up to a power
/// of two (a thread's stripe is its hint masked), at most [`MAX_STRIPES`].
///
/// Asked of the OS once per process: `available_parallelism` reads cgroup
/// files on Linux (about 20 µs), which a service creating a limiter per key
/// would otherwise pay for every key.
pub(crate) fn default_stripes() -> usize {
    static STRIPES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *STRIPES.get_or_init(|| {
        std::thread::available_parallelism()
            .map_or(1, usize::from)
            .next_power_of_two()
            .min(MAX_STRIPES)
    })
}

/// A number for the calling thread, fixed for its life, that spreads threads
/// over stripes round-robin.
///
/// The counter is `std`'s, not the sync facade's, on purpose: it is not limiter
/// state (any hint, even the same for every thread, leaves the limiter exact),
/// and it must be a `static`, which loom's atomics cannot be. Under loom the hint
/// is the model thread's number instead, which is deterministic across the
/// executions loom explores.
#[cfg(not(loom))]
#[inline]
pub(crate) fn thread_hint() -> usize {
    use std::cell::Cell;
    use std::sync::atomic::AtomicUsize;

    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static HINT: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    HINT.with(|hint| {
        let mine = hint.get();
        if mine != usize::MAX {
            return mine;
        }
        // Relaxed: only distinctness matters, which any ordering gives an RMW.
        let mine = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % (usize::MAX / 2);
        hint.set(mine);
        mine
    })
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
