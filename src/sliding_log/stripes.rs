//! The log's permits split over rings, one per stripe: a thread admits from its
//! own ring, and looks at the others only when its own cannot serve it.

use crossbeam_utils::CachePadded;

use crate::sync::Backoff;

use super::log::{Geometry, Inheritance, Moved, retry_after};
use super::ring::{AtomicRing, Claim, Mode, Outcome, Sealed};
use crate::error::Denied;
use crate::limiter::Snapshot;
use crate::stripe::{refresh_thread_hint, thread_hint};
use crate::sync::{AtomicU64, Ordering};

/// The most rings a log splits into: a request that its own ring cannot serve
/// reads every ring, so more only lengthen that scan.
pub(crate) const MAX_RINGS: usize = 64;

/// Up to [`MAX_RINGS`] values, one per ring, on the stack: the slow path keeps
/// per-ring state without allocating.
type PerRing<T> = [T; MAX_RINGS];

/// A sliding log of `shape.capacity()` permits as rings whose capacities add up
/// to it. See the [module docs](super) for why the split keeps the log exact
/// and, single-threaded, tight.
#[derive(Debug)]
pub(crate) struct Rings {
    /// The whole log: its limit, window and mode.
    shape: Geometry,
    /// The stripe count asked for; the ring count is the largest power of two
    /// at most this, the limit and [`MAX_RINGS`].
    requested: usize,
    rings: Box<[AtomicRing]>,
    /// `rings.len() − 1`: a thread's home ring is its hint masked.
    mask: usize,
    /// No ring's front entry leaves the window before this time: the
    /// earliest front the last denying survey read (for one permit). Fronts
    /// only move later — an admission replaces a front with a newer stamp —
    /// so a reading below it is denied without surveying every ring again.
    /// The one exception is a spanning request's rollback, which frees its
    /// entries at once: a denial on the strength of this value can then miss
    /// a free entry until the time passes (under-admission, never over).
    fronts_free_at: CachePadded<AtomicU64>,
}

impl Rings {
    /// An empty log of `shape`, split for `stripes` stripes.
    pub(crate) fn new(shape: Geometry, stripes: usize) -> Self {
        Rings::inheriting(shape, stripes, Inheritance::none())
    }

    /// A log of `shape` split for `stripes` stripes, starting from `inheritance`
    /// (at most `shape.capacity()` stamps).
    fn inheriting(shape: Geometry, stripes: usize, inheritance: Inheritance) -> Self {
        let limit = shape.capacity() as usize;
        let bound = stripes.clamp(1, MAX_RINGS).min(limit);
        // The largest power of two at most `bound` (which is at least 1).
        let count = 1usize << (usize::BITS - 1 - bound.leading_zeros());
        let capacities: Vec<u32> = (0..count)
            .map(|i| (limit / count + usize::from(i < limit % count)) as u32)
            .collect();
        let rings = capacities
            .iter()
            .zip(inheritance.deal(&capacities))
            .map(|(&capacity, part)| AtomicRing::inheriting(shape.with_capacity(capacity), part))
            .collect();
        Rings {
            shape,
            requested: stripes,
            rings,
            mask: count - 1,
            fronts_free_at: CachePadded::new(AtomicU64::new(0)),
        }
    }

    /// The whole log's limit, window and mode.
    pub(crate) fn shape(&self) -> &Geometry {
        &self.shape
    }

    /// The stripe count asked for.
    pub(crate) fn requested_stripes(&self) -> usize {
        self.requested
    }

    /// How many rings the permits are split over.
    pub(crate) fn ring_count(&self) -> usize {
        self.rings.len()
    }

    /// Bytes of heap the rings take (their heads and bookkeeping, and the slots).
    pub(crate) fn heap_bytes(&self) -> usize {
        std::mem::size_of_val::<[AtomicRing]>(&self.rings)
            + self.rings.iter().map(AtomicRing::slot_bytes).sum::<usize>()
    }

    /// Decides `n` permits (`1 <= n <= limit`) at `now`, and on admission stamps
    /// them.
    #[inline]
    pub(crate) fn try_acquire_n(&self, now: u64, n: u32) -> Result<Result<(), Denied>, Sealed> {
        if self.mask == 0 {
            // One ring: its own decision is the log's, retry-after included.
            let mode = match self.shape.count_denied() {
                true => Mode::Log,
                false => Mode::Admit,
            };
            return Ok(match self.rings[0].claim(now, n, mode)? {
                Outcome::Admitted(_) => Ok(()),
                Outcome::Logged { retry_ns } | Outcome::Denied { retry_ns } => {
                    Err(retry_after(retry_ns))
                }
            });
        }
        let home = thread_hint() & self.mask;
        let ring = &self.rings[home];
        // The common case touches only the home ring's lines, which other
        // threads' home rings do not share.
        let mut lost = false;
        let admitted = n <= ring.geometry().capacity()
            && matches!(
                ring.claim_noting(now, n, Mode::Admit, &mut lost)?,
                Outcome::Admitted(_)
            );
        if lost {
            // Another thread shares this home ring — two threads whose first
            // check ran on one CPU (a parent's, before the scheduler spread
            // them), or one that migrated since — and every check would pull
            // the ring's head line across cores for as long as both live. Take
            // the ring of the CPU this thread runs on now, as the striped
            // window and the leased bucket do.
            refresh_thread_hint();
        }
        if admitted {
            return Ok(Ok(()));
        }
        if n == 1 && !self.shape.count_denied() {
            // Relaxed: a lower bound of when any front frees (see the field);
            // a stale value is an older, lower bound and only sends the
            // request on to the survey, which decides on the rings
            // themselves. Nothing else is read on its strength.
            let fronts_free_at = self.fronts_free_at.load(Ordering::Relaxed);
            if now < fronts_free_at {
                // Every ring's front is in the window at `now`: the survey
                // would deny too, with this retry-after unless another
                // thread has moved a front since (then later, as any raced
                // retry-after).
                return Ok(Err(retry_after(fronts_free_at - now)));
            }
        }
        self.across(now, n, home)
    }

    /// The request the home ring could not serve alone: admitted if the rings
    /// together have `n` entries that left the window, at the front of each.
    fn across(&self, now: u64, n: u32, home: usize) -> Result<Result<(), Denied>, Sealed> {
        let mut backoff = Backoff::new();
        'survey: loop {
            let mut heads: PerRing<u64> = [0; MAX_RINGS];
            for (head, ring) in heads.iter_mut().zip(self.rings.iter()) {
                *head = ring.head()?;
            }
            // How many entries at the front of each ring left the window, home
            // first, until the request has enough. A ring admits its tickets in
            // order, so only the front run counts.
            let mut free: PerRing<u32> = [0; MAX_RINGS];
            let mut total = 0;
            // The earliest time an entry at a ring's front leaves the window,
            // among the fronts read: for one permit, the retry-after.
            let mut earliest = u64::MAX;
            for step in 0..self.rings.len() {
                let index = (home + step) & self.mask;
                let ring = &self.rings[index];
                while total < n && free[index] < ring.geometry().capacity() {
                    match ring.free_at(heads[index], free[index], now) {
                        Ok(at) if at <= now => {
                            free[index] += 1;
                            total += 1;
                        }
                        Ok(at) => {
                            earliest = earliest.min(at);
                            break;
                        }
                        Err(Moved) => {
                            backoff.wait();
                            continue 'survey;
                        }
                    }
                }
            }
            if total == n {
                match self.claim_all(now, &free, home)? {
                    true => return Ok(Ok(())),
                    false => {
                        backoff.wait();
                        continue 'survey;
                    }
                }
            }
            // Denied. The request fits once the n-th oldest entry of all — the
            // limit's (N − n + 1)-th most recent permit — has left the window.
            // For one permit (and nothing free, so every ring's front was read)
            // that is the earliest front the survey saw.
            let mut oldest: PerRing<u32> = [0; MAX_RINGS];
            let mut free_at = earliest;
            // Only a front read from its stamp is exact: an entry still in
            // flight (its writer between claim and store) reads as freeing at
            // `now + window`, an upper bound, and so do the ends of the time
            // range. Anything below `now + window` is a stamp's own time.
            if n == 1 && earliest < now.saturating_add(self.shape.window()) {
                // Relaxed: see the field; `fetch_max`, as every survey's
                // earliest front is a lower bound for all later times, and so
                // is the largest of them.
                self.fronts_free_at.fetch_max(earliest, Ordering::Relaxed);
            }
            if n > 1 || self.shape.count_denied() {
                match self.nth_free_at(&heads, n, now, &mut oldest) {
                    Ok(at) => free_at = at,
                    Err(Moved) => {
                        backoff.wait();
                        continue 'survey;
                    }
                }
            }
            if self.shape.count_denied() {
                // The attempt is logged like an admission, replacing the n oldest
                // entries of all (each ring's share is at its front), and the
                // retry-after is for the same request made after it.
                for (ring, &count) in self.rings.iter().zip(oldest.iter()) {
                    if count > 0 {
                        // `Outcome::Denied`: an entry in flight; that share is
                        // not logged, which only makes the log less strict
                        // than asked, never admits.
                        ring.claim(now, count, Mode::Log)?;
                    }
                }
                for (head, ring) in heads.iter_mut().zip(self.rings.iter()) {
                    *head = ring.head()?;
                }
                if let Ok(after) = self.nth_free_at(&heads, n, now, &mut oldest) {
                    free_at = after;
                }
            }
            // Under a race the n-th oldest may have left the window meanwhile: a
            // denial still says to come back, at the earliest a nanosecond later.
            return Ok(Err(retry_after(free_at.saturating_sub(now).max(1))));
        }
    }

    /// Claims `free[i]` tickets from each ring `i`, home first; `Ok(false)` if a
    /// ring no longer has them (a race), with every claim taken back.
    fn claim_all(&self, now: u64, free: &[u32], home: usize) -> Result<bool, Sealed> {
        let mut claims: PerRing<Option<Claim>> = [None; MAX_RINGS];
        for step in 0..self.rings.len() {
            let index = (home + step) & self.mask;
            if free[index] == 0 {
                continue;
            }
            match self.rings[index].claim(now, free[index], Mode::Admit) {
                Ok(Outcome::Admitted(claim)) => claims[index] = Some(claim),
                outcome => {
                    self.undo(&claims, now);
                    return outcome.map(|_| false);
                }
            }
        }
        Ok(true)
    }

    /// Takes back the claims of a request that could not complete.
    fn undo(&self, claims: &[Option<Claim>], now: u64) {
        // Every claim was an admission at `now`: the entries it replaced all
        // left the window by `now − window`.
        let to = now.saturating_sub(self.shape.window());
        for (ring, claim) in self.rings.iter().zip(claims) {
            if let Some(claim) = claim {
                ring.undo(*claim, to);
            }
        }
    }

    /// When the n-th oldest entry of all rings (the rings read at `heads`) leaves
    /// the window; `oldest[i]` is set to how many of the n are ring `i`'s. Each
    /// ring's entries are oldest first from its head (single-threaded; under
    /// concurrency this is an estimate, as any retry-after is), so this merges
    /// the rings' fronts.
    fn nth_free_at(
        &self,
        heads: &[u64],
        n: u32,
        now: u64,
        oldest: &mut [u32],
    ) -> Result<u64, Moved> {
        oldest.fill(0);
        // The next candidate of each ring: when its entry leaves the window.
        let mut next: PerRing<u64> = [u64::MAX; MAX_RINGS];
        for (i, ring) in self.rings.iter().enumerate() {
            next[i] = ring.free_at(heads[i], 0, now)?;
        }
        let mut at = 0;
        for _ in 0..n {
            let (i, &t) = next[..self.rings.len()]
                .iter()
                .enumerate()
                .min_by_key(|&(_, t)| *t)
                .expect("at least one ring");
            at = t;
            oldest[i] += 1;
            let ring = &self.rings[i];
            next[i] = if oldest[i] < ring.geometry().capacity() {
                ring.free_at(heads[i], oldest[i], now)?
            } else {
                u64::MAX
            };
        }
        Ok(at)
    }

    /// What a request could get at `now`: the rings' free fronts added up, and
    /// the latest time one of them is full.
    pub(crate) fn snapshot(&self, now: u64) -> Snapshot {
        let (available, until_full) = self.rings.iter().fold((0, 0u64), |(a, u), ring| {
            let part = ring.snapshot(now);
            (a + part.available, u.max(part.until_full.as_nanos() as u64))
        });
        Snapshot::from_ns(available, self.shape.capacity(), until_full)
    }

    /// Seals every ring: no ticket can be claimed after this returns. `true` for
    /// the one caller that sealed the first ring, which alone may build the
    /// successor; the others wait for it.
    pub(crate) fn seal(&self) -> bool {
        if !self.rings[0].seal() {
            return false;
        }
        for ring in &self.rings[1..] {
            ring.seal();
        }
        true
    }

    /// The log that replaces this sealed one under `shape`, split for `stripes`
    /// stripes, inheriting the upper bounds of the most recent permits of all
    /// rings ([`Geometry::inherit`], [`Inheritance::merge`]).
    pub(crate) fn successor(&self, shape: Geometry, stripes: usize) -> Rings {
        let parts = self
            .rings
            .iter()
            .map(|ring| ring.inheritance(shape.capacity()))
            .collect();
        Rings::inheriting(shape, stripes, Inheritance::merge(parts, shape.capacity()))
    }
}

#[cfg(all(test, target_os = "linux", not(loom)))]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Barrier};
    use std::time::{Duration, Instant};

    use crate::limiter::RateLimiter;
    use crate::rate::Rate;
    use crate::sliding_log::SlidingLog;
    use crate::stripe::thread_hint;

    /// The CPUs this process may run on.
    fn allowed_cpus() -> Vec<usize> {
        // SAFETY: `cpu_set_t` is a plain bit array; all zeros is empty.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: `set` is a valid, writable `cpu_set_t` of the size passed.
        let status =
            unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
        assert_eq!(status, 0);
        (0..libc::CPU_SETSIZE as usize)
            // SAFETY: `cpu < CPU_SETSIZE`, the set's size in bits.
            .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
            .collect()
    }

    /// Moves the calling thread to `cpu` alone.
    fn pin(cpu: usize) {
        // SAFETY: as in `allowed_cpus`; `cpu` is below `CPU_SETSIZE`.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            let status = libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
            assert_eq!(status, 0, "cannot pin to CPU {cpu}");
        }
    }

    /// Two threads whose first check ran on one CPU share a home ring; moved
    /// to two CPUs and checking at once, they lose races on that ring, and
    /// the loser takes the ring of the CPU it runs on: they end on different
    /// rings instead of trading one ring's head line for as long as they live.
    #[test]
    fn threads_that_first_checked_on_one_cpu_move_apart() {
        let cpus = allowed_cpus();
        assert!(
            cpus.len() >= 2,
            "this test needs two CPUs, the process may use {cpus:?}"
        );
        let rings = 2;
        // One permit a nanosecond: far more than two threads can ask for, so
        // every check is an admission on the home ring.
        let log = Arc::new(
            SlidingLog::new(Rate::new(100_000, Duration::from_micros(100)))
                .unwrap()
                .with_stripes(rings),
        );
        let homes = Arc::new([AtomicUsize::new(usize::MAX), AtomicUsize::new(usize::MAX)]);
        let start = Arc::new(Barrier::new(2));
        let threads: Vec<_> = (0..2)
            .map(|i| {
                let (log, homes, start, cpus) = (
                    Arc::clone(&log),
                    Arc::clone(&homes),
                    Arc::clone(&start),
                    cpus.clone(),
                );
                std::thread::spawn(move || {
                    pin(cpus[0]);
                    log.try_acquire().unwrap();
                    let first = thread_hint() % rings;
                    start.wait();
                    pin(cpus[i]);
                    let deadline = Instant::now() + Duration::from_secs(20);
                    loop {
                        for _ in 0..1_000 {
                            log.try_acquire().unwrap();
                        }
                        // Relaxed: a report read after both threads stop.
                        homes[i].store(thread_hint() % rings, Ordering::Relaxed);
                        let other = homes[1 - i].load(Ordering::Relaxed);
                        if other != usize::MAX && other != homes[i].load(Ordering::Relaxed) {
                            break;
                        }
                        assert!(Instant::now() < deadline, "still on one ring");
                    }
                    first
                })
            })
            .collect();
        let first: Vec<usize> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        assert_eq!(first[0], first[1], "both first checked on CPU {}", cpus[0]);
    }
}
