//! What the keyed benches (`keyed.rs`, `keyed_kinds.rs`) share: the keys, one
//! check against any keyed limiter, and an allocator that counts the bytes
//! the process holds (each bench registers it with
//! `#[global_allocator] static GLOBAL: common::keyed::Counting = common::keyed::Counting;`).

use std::alloc::{GlobalAlloc, Layout, System};
use std::hash::BuildHasher;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicIsize, Ordering};

use tollgate::keyed::{Keyable, Keyed};

/// splitmix64: the keys, distinct and scattered.
pub fn key(i: u64) -> u64 {
    let mut z = i
        .wrapping_add(0x9E37_79B9_7F4A_7C15)
        .wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 30)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// One keyed check, `true` if admitted.
pub trait Check: Send + Sync + 'static {
    fn check(&self, key: &u64) -> bool;
    /// Asks for `n` permits at once, `true` if admitted.
    fn spend(&self, key: &u64, n: u32) -> bool;
}

impl<L: Keyable + 'static, S> Check for Keyed<u64, L, S>
where
    L::Clock: Send + Sync,
    S: BuildHasher + Clone + Send + Sync + 'static,
{
    #[inline]
    fn check(&self, key: &u64) -> bool {
        self.try_acquire(key).is_ok()
    }

    fn spend(&self, key: &u64, n: u32) -> bool {
        self.try_acquire_n(key, n).is_ok()
    }
}

/// governor's dashmap-keyed limiter on its default clock.
pub type GovernorKeyed = governor::DefaultKeyedRateLimiter<u64>;

impl Check for GovernorKeyed {
    #[inline]
    fn check(&self, key: &u64) -> bool {
        self.check_key(key).is_ok()
    }

    fn spend(&self, key: &u64, n: u32) -> bool {
        let n = NonZeroU32::new(n).expect("non-zero");
        matches!(self.check_key_n(key, n), Ok(Ok(())))
    }
}

/// Counts the bytes the process holds, for the bytes-per-key tables.
pub struct Counting;

static ALLOCATED: AtomicIsize = AtomicIsize::new(0);

/// Bytes allocated and not yet freed, process-wide.
pub fn allocated() -> isize {
    ALLOCATED.load(Ordering::Relaxed)
}

// SAFETY: forwards to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATED.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        ALLOCATED.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATED.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        // SAFETY: the caller's contract, passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}
