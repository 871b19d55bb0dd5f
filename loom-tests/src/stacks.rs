//! Thread stacks kept for the next execution instead of handed back to the
//! kernel.
//!
//! loom runs every thread of every execution (the model's main thread
//! included) on a coroutine of the `generator` crate, and each coroutine gets a
//! stack of its own: `mmap` of 32 KiB and a guard page, `mprotect` of the guard
//! page, and `munmap` when the coroutine is dropped at the end of the
//! execution. A model explores tens of thousands of executions of two to four
//! threads, so the kernel maps, guards, zero-fills on first touch and unmaps a
//! few hundred thousand stacks per model: measured on a 2-vCPU KVM guest, a
//! three-thread sliding-log model made 245,000 calls of each, and spent 3.9 s
//! of CPU in the kernel against 3.2 s in the model itself.
//!
//! This module defines `mmap`, `mprotect` and `munmap` in the model binaries.
//! A definition in the executable takes precedence over the C library's for
//! every call the Rust code makes (the C library's own allocations call its
//! internal entry points and never come here), so:
//!
//! - `munmap` of a region this module handed out as a stack keeps it in a
//!   pool (up to [`POOL`] of them) instead of unmapping it;
//! - `mmap` asking for a stack of the same length (anonymous, private,
//!   `MAP_STACK`, read-write, no address hint) gets one from the pool;
//! - `mprotect` making the first page of a pooled stack inaccessible, which
//!   the coroutine library does to every new stack, is already done and
//!   returns at once.
//!
//! A kept stack comes back with its first page already inaccessible, as the
//! coroutine library makes every new stack right after mapping it: only that
//! library maps with `MAP_STACK` through `mmap` in these binaries (the C
//! library's own thread stacks never come here).
//!
//! Every other call goes to the kernel unchanged. Nothing here is seen by
//! loom: a stack's bytes are not model state (each coroutine starts from a
//! context it writes itself), so reusing one changes no interleaving and no
//! result; it only takes the kernel out of the loop.

use std::ffi::{c_int, c_long, c_void};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// How many unused stacks are kept. A process runs at most a few models at
/// once (libtest's threads), each with at most loom's 5 threads alive.
const POOL: usize = 64;

/// How many stacks may be handed out and alive at once before a new one is
/// no longer tracked (and so goes back to the kernel when unmapped).
const LIVE: usize = 64;

/// The flags of the coroutine library's stack mappings.
const STACK_FLAGS: c_int = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK;

/// A stack region: its start and length.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Region {
    start: usize,
    len: usize,
}

const NONE: Option<Region> = None;

struct Stacks {
    /// Stacks handed out and not yet unmapped, with whether their first page
    /// is already a guard page.
    live: [Option<(Region, bool)>; LIVE],
    /// Stacks unmapped by their user and kept, every one with its guard page
    /// in place.
    pool: [Option<Region>; POOL],
}

static STACKS: Mutex<Stacks> = Mutex::new(Stacks {
    live: [None; LIVE],
    pool: [NONE; POOL],
});

/// Set by [`keep_stacks`]: until then every call goes to the kernel.
static ENABLED: AtomicBool = AtomicBool::new(false);

/// How many stacks the pool has handed out again so far.
static REUSED: AtomicUsize = AtomicUsize::new(0);

/// How many stack mappings, in this process so far, were served from the
/// pool instead of the kernel: a test checks that the models do reuse their
/// stacks (were the coroutine library to map them differently, the pool
/// would silently stop serving them).
pub fn reused_stacks() -> usize {
    REUSED.load(Ordering::Relaxed)
}

/// Turns the pool on for the rest of the process. Called by every model
/// before it starts exploring (which also makes sure this module, and so the
/// three definitions below, is linked into every model binary).
pub(crate) fn keep_stacks() {
    // Relaxed: the flag only selects between two correct paths; a call that
    // still sees `false` maps or unmaps through the kernel, as it would
    // without this module.
    ENABLED.store(true, Ordering::Relaxed);
}

fn stacks() -> std::sync::MutexGuard<'static, Stacks> {
    // A panicking model (a known-bad one, on purpose) can never poison this
    // lock while holding it: nothing below panics. Recover anyway rather
    // than turn every later mapping into a panic.
    STACKS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn page() -> usize {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as usize }
}

/// # Safety
///
/// As the C library's `mmap`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mmap(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    offset: libc::off_t,
) -> *mut c_void {
    // The kernel's `mmap`, bypassing this definition. `syscall` returns -1
    // (and sets errno) on failure, which is MAP_FAILED.
    let args = [
        addr as c_long,
        len as c_long,
        prot as c_long,
        flags as c_long,
        fd as c_long,
        offset as c_long,
    ];
    let kernel_mmap = || unsafe { kernel(libc::SYS_mmap, &args) as *mut c_void };
    let is_stack = addr.is_null()
        && flags == STACK_FLAGS
        && prot == libc::PROT_READ | libc::PROT_WRITE
        && fd == -1
        && offset == 0;
    if !is_stack || !ENABLED.load(Ordering::Relaxed) {
        return kernel_mmap();
    }
    let mut stacks = stacks();
    let Some(free) = stacks.live.iter().position(Option::is_none) else {
        drop(stacks);
        return kernel_mmap();
    };
    let pooled = stacks
        .pool
        .iter_mut()
        .find(|slot| slot.is_some_and(|region| region.len == len))
        .and_then(Option::take);
    let (region, guarded) = match pooled {
        Some(region) => {
            // Relaxed: a count read after the models' threads are joined.
            REUSED.fetch_add(1, Ordering::Relaxed);
            (region, true)
        }
        None => {
            let start = kernel_mmap();
            if start == libc::MAP_FAILED {
                return start;
            }
            (
                Region {
                    start: start as usize,
                    len,
                },
                false,
            )
        }
    };
    stacks.live[free] = Some((region, guarded));
    region.start as *mut c_void
}

/// # Safety
///
/// As the C library's `mprotect`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mprotect(addr: *mut c_void, len: usize, prot: c_int) -> c_int {
    let kernel_mprotect = || unsafe {
        kernel(
            libc::SYS_mprotect,
            &[addr as c_long, len as c_long, prot as c_long],
        ) as c_int
    };
    if prot == libc::PROT_NONE && len == page() && ENABLED.load(Ordering::Relaxed) {
        let mut stacks = stacks();
        let tracked = stacks
            .live
            .iter_mut()
            .flatten()
            .find(|(region, _)| region.start == addr as usize);
        if let Some((_, guarded)) = tracked {
            if *guarded {
                return 0;
            }
            let done = kernel_mprotect();
            if done == 0 {
                *guarded = true;
            }
            return done;
        }
    }
    kernel_mprotect()
}

/// # Safety
///
/// As the C library's `munmap`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn munmap(addr: *mut c_void, len: usize) -> c_int {
    if !ENABLED.load(Ordering::Relaxed) {
        return unsafe { kernel(libc::SYS_munmap, &[addr as c_long, len as c_long]) as c_int };
    }
    let region = Region {
        start: addr as usize,
        len,
    };
    let mut stacks = stacks();
    let tracked = stacks
        .live
        .iter_mut()
        .find(|slot| slot.is_some_and(|(live, _)| live == region));
    if let Some(slot) = tracked {
        let (_, guarded) = slot.take().expect("found as Some");
        // Only a stack with its guard page in place is pooled: the next user
        // gets exactly what the coroutine library makes of a new mapping.
        if guarded && let Some(free) = stacks.pool.iter_mut().find(|slot| slot.is_none()) {
            *free = Some(region);
            return 0;
        }
    }
    drop(stacks);
    unsafe { kernel(libc::SYS_munmap, &[addr as c_long, len as c_long]) as c_int }
}

/// A system call with up to six arguments, through the C library's
/// `syscall` (which sets errno and returns -1 on failure, as the wrappers do).
unsafe fn kernel(number: c_long, args: &[c_long]) -> c_long {
    let mut six = [0 as c_long; 6];
    six[..args.len()].copy_from_slice(args);
    unsafe { libc::syscall(number, six[0], six[1], six[2], six[3], six[4], six[5]) }
}
