//! How many stripes a striped limiter has. Which stripe a thread uses is its
//! hint (`sync::thread`), shared by every striped limiter.
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
