//! The log's permits split over rings, one per stripe: a thread admits from its
//! own ring, and looks at the others only when its own cannot serve it.

use crossbeam_utils::CachePadded;

use crate::sync::Backoff;

use super::log::{Geometry, Inheritance, Moved, retry_after};
use super::ring::{AtomicRing, Claim, Mode, RingOutcome, SealedRing};
use super::rules::LogConfig;
use crate::error::Denied;
use crate::limiter::Snapshot;
use crate::sync::fault::{Fault, injected};
use crate::sync::thread::{refresh_thread_hint, thread_hint};
use crate::sync::{AtomicU64, Ordering};

/// The most rings a log splits into: a request that its own ring cannot serve
/// reads every ring, so more only lengthen that scan.
pub(crate) const MAX_RINGS: usize = 64;

/// Up to [`MAX_RINGS`] values, one per ring, on the stack: the slow path keeps
/// per-ring state without allocating.
type PerRing<T> = [T; MAX_RINGS];

/// What a log is built to: its rules, whether it logs denied attempts, and
/// the stripe count asked for.
#[derive(Debug, Clone)]
#[allow(unreachable_pub)] // sealed: public only in `RingsHome`'s methods
pub struct Plan {
    pub(crate) rules: LogConfig,
    pub(crate) count_denied: bool,
    pub(crate) stripes: usize,
}

/// A sliding log of `shape.capacity()` permits as rings whose capacities add up
/// to it — or, with several rules, one ring of the largest count, which every
/// rule reads. See the [module docs](super) for why the split keeps the log
/// exact and, single-threaded, tight.
#[derive(Debug)]
#[allow(unreachable_pub)] // sealed: public only in `RingsHome`'s methods
pub struct Rings {
    /// The whole log's ring layout: the slots (the largest count), the window
    /// of the slots' chain and the mode.
    shape: Geometry,
    /// The rules every decision applies.
    rules: LogConfig,
    /// The stripe count asked for; the ring count is the largest power of two
    /// at most this, the limit and [`MAX_RINGS`].
    requested: usize,
    /// Each on a cache line of its own (its head and the layout a decision
    /// reads beside it), so that stripes never share one.
    rings: Box<[CachePadded<AtomicRing>]>,
    /// Per ring, the hints its home threads keep (none with one ring, which
    /// decides alone): see [`Hints`].
    hints: Box<[CachePadded<Hints>]>,
    /// `rings.len() − 1`: a thread's home ring is its hint masked.
    mask: usize,
    /// How long an entry that left the window stays its own ring's while that
    /// ring's home threads are busy: a sixteenth of the window, within
    /// [`MIN_GRACE`] and [`MAX_GRACE`], never more than the window. See
    /// [`Rings::takeable_at`].
    grace: u64,
}

/// The grace is a sixteenth of the window, at least this (but never more than
/// the window): 2 µs, several times what a survey of another ring's lines
/// costs, so that surveys stay a small share of a thread's time.
const MIN_GRACE: u64 = 2_000;

/// The longest an entry that left the window is kept for its own ring's
/// threads: 50 µs (a sixteenth of a window of 0.8 ms).
const MAX_GRACE: u64 = 50_000;

/// What the threads whose home is one ring leave for each other, on a line of
/// its own that other threads read only when they survey every ring.
///
/// Both words are hints: no decision admits on their strength (every
/// admission is a claim on a ring, decided on its entries), so none of their
/// loads or updates needs an ordering — Relaxed throughout, with the reasons
/// where they are used.
#[derive(Debug, Default)]
struct Hints {
    /// One past the latest reading at which a home thread asked this ring for
    /// permits, admitted or not, kept to within an eighth of a grace (zero:
    /// none yet). The ring counts as busy until a grace after it, and keeps
    /// its newly freed entries for its own threads that long.
    home_at: AtomicU64,
    /// This ring's home threads can take no entry of another ring before
    /// this time: the latest of the earliest times the denying surveys of
    /// one permit found (zero: none yet); their own ring they ask first, on
    /// every request. Fronts only move later — an admission replaces a front
    /// with a newer stamp — and a busy ring only keeps its entries longer, so
    /// it is a lower bound for every later reading, stale ones included. The
    /// one exception is a spanning request's rollback, which frees its
    /// entries at once: a denial on the strength of this value can then miss
    /// a free entry until the time passes (under-admission, never over).
    ///
    /// Only a bound: once another thread has replaced the front it was read
    /// from, the other rings serve later than it says. So a denial answers
    /// from it only when the home ring's own front frees no later (the wait
    /// is then the home ring's, exact); otherwise it surveys.
    others_at: AtomicU64,
}

impl Rings {
    /// An empty log built to `plan`.
    pub(crate) fn new(plan: Plan) -> Self {
        Rings::inheriting(plan, Inheritance::none())
    }

    /// A log built to `plan`, starting from `inheritance` (at most the
    /// largest count's stamps). Several rules share one ring: a rule whose
    /// count is below the ring count could not be split over rings.
    fn inheriting(plan: Plan, inheritance: Inheritance) -> Self {
        let Plan {
            rules,
            count_denied,
            stripes,
        } = plan;
        let shape = Geometry::from_parts(rules.slots(), rules.slot_window(), count_denied);
        let limit = shape.capacity() as usize;
        let bound = match rules.is_several() {
            true => 1,
            false => stripes.clamp(1, MAX_RINGS).min(limit),
        };
        // The largest power of two at most `bound` (which is at least 1).
        let count = 1usize << (usize::BITS - 1 - bound.leading_zeros());
        let capacities: Vec<u32> = (0..count)
            .map(|i| (limit / count + usize::from(i < limit % count)) as u32)
            .collect();
        let rings = capacities
            .iter()
            .zip(inheritance.deal(&capacities))
            .map(|(&capacity, part)| {
                CachePadded::new(AtomicRing::inheriting(shape.with_capacity(capacity), part))
            })
            .collect();
        Rings {
            grace: (shape.window() / 16)
                .clamp(MIN_GRACE, MAX_GRACE)
                .min(shape.window()),
            shape,
            rules,
            requested: stripes,
            rings,
            mask: count - 1,
            hints: match count {
                1 => Box::new([]),
                _ => (0..count)
                    .map(|_| CachePadded::new(Hints::default()))
                    .collect(),
            },
        }
    }

    /// The whole log's ring layout and mode.
    pub(crate) fn shape(&self) -> &Geometry {
        &self.shape
    }

    /// The rules every decision applies.
    pub(crate) fn rules(&self) -> &LogConfig {
        &self.rules
    }

    /// The most one request may ask for: the smallest count.
    pub(crate) fn limit(&self) -> u32 {
        self.rules.limit()
    }

    /// The rules a decision applies (under loom, with the known-bad log on,
    /// the largest alone).
    #[inline]
    fn rule_pairs(&self) -> &[(u32, u64)] {
        if injected(Fault::LargestRuleOnly) {
            let pairs = self.rules.pairs();
            let largest = pairs.iter().max_by_key(|r| r.0).expect("a rule");
            return std::slice::from_ref(largest);
        }
        self.rules.pairs()
    }

    /// What this log was built to.
    pub(crate) fn plan(&self) -> Plan {
        Plan {
            rules: self.rules.clone(),
            count_denied: self.shape.count_denied(),
            stripes: self.requested,
        }
    }

    /// How many rings the permits are split over.
    pub(crate) fn ring_count(&self) -> usize {
        self.rings.len()
    }

    /// Bytes of heap the rings take (their heads and bookkeeping, and the slots).
    pub(crate) fn heap_bytes(&self) -> usize {
        std::mem::size_of_val::<[CachePadded<AtomicRing>]>(&self.rings)
            + std::mem::size_of_val::<[CachePadded<Hints>]>(&self.hints)
            + self
                .rings
                .iter()
                .map(|ring| ring.slot_bytes())
                .sum::<usize>()
    }

    /// Decides `n` permits (`1 <= n <= limit`) at `now`, and on admission stamps
    /// them.
    #[inline]
    pub(crate) fn try_acquire_n(&self, now: u64, n: u32) -> Result<Result<(), Denied>, SealedRing> {
        if self.mask == 0 {
            // One ring: its own decision is the log's, retry-after included.
            let outcome = if self.rules.is_several() {
                // Every rule read on it.
                self.rings[0].claim_rules(now, n, self.rule_pairs())?
            } else {
                let mode = match self.shape.count_denied() {
                    true => Mode::Log,
                    false => Mode::Admit,
                };
                self.rings[0].claim(now, n, mode)?
            };
            return Ok(match outcome {
                RingOutcome::Admitted(_) => Ok(()),
                RingOutcome::Logged { retry_ns } | RingOutcome::Denied { retry_ns } => {
                    Err(retry_after(retry_ns))
                }
            });
        }
        let home = thread_hint() & self.mask;
        let ring = &self.rings[home];
        // The common case touches only the home ring's lines, which other
        // threads' home rings do not share.
        let mut lost = false;
        let outcome = match n <= ring.geometry().capacity() {
            true => Some(ring.claim_noting(now, n, Mode::Admit, &mut lost)?),
            false => None,
        };
        if lost {
            // Another thread shares this home ring — two threads whose first
            // check ran on one CPU (a parent's, before the scheduler spread
            // them), or one that migrated since — and every check would pull
            // the ring's head line across cores for as long as both live. Take
            // the ring of the CPU this thread runs on now, as the striped
            // window and the leased bucket do.
            refresh_thread_hint();
        }
        // Admitted or not, this thread wants its ring's entries: the ring's
        // threads are busy. (Marked on denials too: threads denied for a
        // while would otherwise look quiet, and two threads that each first
        // see the other's entry free would keep taking each other's.)
        self.note_home(home, now);
        // How long until the home ring alone can serve the request, as its
        // decision just read it (for one permit, until its front frees).
        let home_wait = match outcome {
            Some(RingOutcome::Admitted(_)) => return Ok(Ok(())),
            Some(RingOutcome::Denied { retry_ns }) => retry_ns,
            // `Mode::Admit` logs nothing; `None`: more than the ring holds.
            Some(RingOutcome::Logged { .. }) | None => u64::MAX,
        };
        if n == 1 && !self.shape.count_denied() {
            // Relaxed: a lower bound of when this thread may take an entry of
            // another ring (see `Hints`); a stale value is an older, lower
            // bound and only sends the request on to the survey, which
            // decides on the rings themselves.
            let others_at = self.hints[home].others_at.load(Ordering::Relaxed);
            if now.saturating_add(home_wait) <= others_at {
                // No other ring can serve this thread before its home ring's
                // front frees (that is after `now`), so the survey would deny,
                // and the request fits exactly when that front frees: the
                // wait is the home ring's own, from the entries this decision
                // read, as with one ring. Where the bound comes first it
                // cannot say when: another thread may have taken the front it
                // was read from since, and a wait read from it would be early.
                return Ok(Err(retry_after(home_wait)));
            }
        }
        self.across(now, n, home)
    }

    /// The request the home ring could not serve alone: admitted if the rings
    /// together have `n` entries at their fronts that this thread may take
    /// ([`Rings::takeable_at`]).
    fn across(&self, now: u64, n: u32, home: usize) -> Result<Result<(), Denied>, SealedRing> {
        let mut backoff = Backoff::new();
        loop {
            // `None`: an entry moved to a new ring mid-read; survey again.
            let Some(survey) = self.survey(now, n, home)? else {
                backoff.wait();
                continue;
            };
            if survey.total == n {
                if self.claim_all(now, &survey.free, home)? {
                    return Ok(Ok(()));
                }
                backoff.wait();
                continue;
            }
            match self.denial(now, n, home, survey)? {
                Some(wait) => return Ok(Err(retry_after(wait))),
                None => backoff.wait(),
            }
        }
    }

    /// How many entries at the front of each ring this request may take,
    /// home first, until it has enough. A ring admits its tickets in order,
    /// so only the front run counts. `None` if an entry moved to a new ring
    /// while it was read.
    fn survey(&self, now: u64, n: u32, home: usize) -> Result<Option<Fronts>, SealedRing> {
        let mut survey = Fronts {
            heads: [0; MAX_RINGS],
            free: [0; MAX_RINGS],
            total: 0,
            earliest: u64::MAX,
            earliest_other: u64::MAX,
        };
        for (head, ring) in survey.heads.iter_mut().zip(self.rings.iter()) {
            *head = ring.head()?;
        }
        for step in 0..self.rings.len() {
            let index = (home + step) & self.mask;
            let ring = &self.rings[index];
            while survey.total < n && survey.free[index] < ring.geometry().capacity() {
                let Ok(at) = ring.free_at(survey.heads[index], survey.free[index], now) else {
                    return Ok(None);
                };
                let at = self.takeable_at(at, index, home);
                if at <= now {
                    survey.free[index] += 1;
                    survey.total += 1;
                    continue;
                }
                survey.earliest = survey.earliest.min(at);
                if index != home {
                    survey.earliest_other = survey.earliest_other.min(at);
                }
                break;
            }
        }
        Ok(Some(survey))
    }

    /// A request the rings cannot admit: its wait (at least a nanosecond),
    /// after logging the attempt in counting mode. `None` if an entry moved
    /// to a new ring while it was read.
    fn denial(
        &self,
        now: u64,
        n: u32,
        home: usize,
        survey: Fronts,
    ) -> Result<Option<u64>, SealedRing> {
        let Fronts {
            mut heads,
            earliest,
            earliest_other,
            ..
        } = survey;
        // The request fits once the n-th oldest entry of all — the limit's
        // (N − n + 1)-th most recent permit — can be taken. For one permit
        // (and nothing free, so every ring's front was read) that is the
        // earliest front the survey saw.
        let mut oldest: PerRing<u32> = [0; MAX_RINGS];
        let mut free_at = earliest;
        // Only a front read from its stamp is exact: an entry still in
        // flight (its writer between claim and store) reads as freeing at
        // `now + window`, an upper bound, and so do the ends of the time
        // range. Anything below `now + window` is a stamp's own time.
        if n == 1 && earliest_other < now.saturating_add(self.shape.window()) {
            // Relaxed: see `Hints`; `fetch_max`, as every survey's earliest
            // other front is a lower bound for all later times, and so is
            // the largest of them. An older value only sends a later
            // request to the survey.
            self.hints[home]
                .others_at
                .fetch_max(earliest_other, Ordering::Relaxed);
        }
        if n > 1 || self.shape.count_denied() {
            match self.nth_free_at(&heads, home, n, now, &mut oldest) {
                Ok(at) => free_at = at,
                Err(Moved) => return Ok(None),
            }
        }
        if self.shape.count_denied() {
            // The attempt is logged like an admission, replacing the n oldest
            // entries of all (each ring's share is at its front), and the
            // retry-after is for the same request made after it.
            for (ring, &count) in self.rings.iter().zip(oldest.iter()) {
                if count > 0 {
                    // `RingOutcome::Denied`: an entry in flight; that share is
                    // not logged, which only makes the log less strict
                    // than asked, never admits.
                    ring.claim(now, count, Mode::Log)?;
                }
            }
            for (head, ring) in heads.iter_mut().zip(self.rings.iter()) {
                *head = ring.head()?;
            }
            if let Ok(after) = self.nth_free_at(&heads, home, n, now, &mut oldest) {
                free_at = after;
            }
        }
        // Under a race the n-th oldest may have left the window meanwhile: a
        // denial still says to come back, at the earliest a nanosecond later.
        Ok(Some(free_at.saturating_sub(now).max(1)))
    }

    /// When a thread whose home is ring `home` may take an entry of ring
    /// `index` that leaves the window at `at`: at once from its home ring;
    /// from another ring only once the entry has been free for a grace, while
    /// that ring's own threads are busy (its [`Hints::home_at`] is within a
    /// grace of that time).
    ///
    /// Without the grace, two threads each offering more than their ring's
    /// share would take each other's entries the moment they free, and every
    /// admission near the limit would pull the other ring's lines across
    /// cores. With it, an entry goes to the threads whose ring it is when
    /// they want it, and to anyone else a grace later; a ring nobody calls
    /// home, or whose threads went quiet, gives its entries to anyone at
    /// once. It never admits more: it only decides who gets an entry, and
    /// when. Monotone in `at` and in the ring's `home_at`, so a time computed
    /// from older readings is never later.
    #[inline]
    fn takeable_at(&self, at: u64, index: usize, home: usize) -> u64 {
        if index == home {
            return at;
        }
        // Relaxed: a hint (see `Hints`); a stale value is older, so the
        // ring looks idle sooner and its entries are taken sooner — exactly
        // what a log without the grace would do. One past the reading; zero:
        // never asked. Never later than a grace after the ring's threads'
        // last request, so a window after every thread stopped, every entry
        // is anyone's (the grace is at most the window).
        let asked = self.hints[index].home_at.load(Ordering::Relaxed);
        if asked == 0 {
            return at;
        }
        at.max(
            at.saturating_add(self.grace)
                .min((asked - 1).saturating_add(self.grace)),
        )
    }

    /// Records that a home thread of ring `home` asked it for permits at
    /// `now`, admitted or not.
    #[inline]
    fn note_home(&self, home: usize, now: u64) {
        let hint = &self.hints[home].home_at;
        // One past the reading, so that zero means "never".
        let at = now.saturating_add(1);
        // Relaxed: a hint (see `Hints`). Written once it is an eighth of a
        // grace behind, so a busy ring's threads write its line a few times
        // per grace rather than on every admission, and the ring still looks
        // busy to others for at least seven eighths of a grace after each
        // survey (surveys stay rare). A plain store rather than `fetch_max`:
        // two home threads racing here can leave the earlier of two readings
        // taken moments apart, which only makes the ring look idle that much
        // sooner — a foreign request then takes an entry at most that much
        // earlier than the grace says, never one that is in the window.
        if at >= hint.load(Ordering::Relaxed).saturating_add(self.grace / 8) {
            hint.store(at, Ordering::Relaxed);
        }
    }

    /// Claims `free[i]` tickets from each ring `i`, home first; `Ok(false)` if a
    /// ring no longer has them (a race), with every claim taken back.
    fn claim_all(&self, now: u64, free: &[u32], home: usize) -> Result<bool, SealedRing> {
        let mut claims: PerRing<Option<Claim>> = [None; MAX_RINGS];
        for step in 0..self.rings.len() {
            let index = (home + step) & self.mask;
            if free[index] == 0 {
                continue;
            }
            match self.rings[index].claim(now, free[index], Mode::Admit) {
                Ok(RingOutcome::Admitted(claim)) => claims[index] = Some(claim),
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
        home: usize,
        n: u32,
        now: u64,
        oldest: &mut [u32],
    ) -> Result<u64, Moved> {
        oldest.fill(0);
        // When the `k`-th entry from ring `i`'s front can be taken.
        let takeable = |i: usize, k: u32| -> Result<u64, Moved> {
            let at = self.rings[i].free_at(heads[i], k, now)?;
            Ok(self.takeable_at(at, i, home))
        };
        // The next candidate of each ring.
        let mut next: PerRing<u64> = [u64::MAX; MAX_RINGS];
        for (i, slot) in next.iter_mut().enumerate().take(self.rings.len()) {
            *slot = takeable(i, 0)?;
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
                takeable(i, oldest[i])?
            } else {
                u64::MAX
            };
        }
        Ok(at)
    }

    /// What a request could get at `now`: the rings' free fronts added up, and
    /// the latest time one of them is full.
    pub(crate) fn snapshot(&self, now: u64) -> Snapshot {
        if self.rules.is_several() {
            return self.rings[0].snapshot_rules(now, self.rule_pairs());
        }
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

    /// The log that replaces this sealed one, built to `plan`, inheriting the upper bounds of the most recent permits of all
    /// rings ([`Geometry::inherit`], [`Inheritance::merge`]).
    pub(crate) fn successor(&self, plan: Plan) -> Rings {
        let slots = plan.rules.slots();
        let parts = self
            .rings
            .iter()
            .map(|ring| ring.inheritance(slots))
            .collect();
        Rings::inheriting(plan, Inheritance::merge(parts, slots))
    }
}

#[cfg(all(test, not(loom)))]
mod grace {
    use std::time::Duration;

    use super::{Ordering, Plan, Rings};
    use crate::rate::Rate;
    use crate::sliding_log::LogConfig;
    use crate::sync::thread::set_thread_hint;

    const WINDOW: u64 = 1_000_000;

    /// One rule, admissions only, split for `stripes`.
    fn plan(rate: Rate, stripes: usize) -> Plan {
        Plan {
            rules: LogConfig::new(rate).unwrap(),
            count_denied: false,
            stripes,
        }
    }

    /// Four permits per ms over two rings of two; the grace is 50 µs.
    fn rings() -> Rings {
        let rings = Rings::new(plan(Rate::new(4, Duration::from_nanos(WINDOW)), 2));
        assert_eq!((rings.ring_count(), rings.grace), (2, 50_000));
        rings
    }

    fn admit(rings: &Rings, home: usize, now: u64) -> Result<(), Duration> {
        set_thread_hint(home);
        rings
            .try_acquire_n(now, 1)
            .expect("not sealed")
            .map_err(|denied| denied.retry_after().expect("a retry-after"))
    }

    /// Both rings full at 0 (two permits each, by their own threads); a
    /// window later, at the returned time, ring 1's thread takes one of its
    /// own entries (ring 1 is now busy) and ring 0's thread its own two:
    /// one entry is left, ring 1's, free since `WINDOW`.
    fn one_entry_left_in_a_busy_ring() -> (Rings, u64) {
        let rings = rings();
        for home in [0, 1, 0, 1] {
            assert_eq!(admit(&rings, home, 0), Ok(()));
        }
        let t = WINDOW + 10;
        for home in [1, 0, 0] {
            assert_eq!(admit(&rings, home, t), Ok(()));
        }
        (rings, t)
    }

    /// An entry freed in a ring whose own thread is admitting waits a grace
    /// for that thread before another ring's thread may take it; the
    /// denial says when, to the nanosecond, and the log never holds more
    /// than its four permits.
    #[test]
    fn a_busy_ring_keeps_a_freed_entry_for_a_grace() {
        let (rings, t) = one_entry_left_in_a_busy_ring();
        let grace = rings.grace;
        // Ring 1's second entry has been free since `WINDOW`, but its ring
        // is busy: ring 0's thread gets it only at `WINDOW + grace`.
        let now = t + 10;
        assert_eq!(
            admit(&rings, 0, now),
            Err(Duration::from_nanos(WINDOW + grace - now))
        );
        assert_eq!(
            admit(&rings, 0, now + 5),
            Err(Duration::from_nanos(WINDOW + grace - now - 5))
        );
        // Its own thread takes it at once.
        assert_eq!(admit(&rings, 1, now), Ok(()));
        // Now both rings are full until `t + WINDOW`. Ring 0's hint still
        // says `WINDOW + grace`, the front just taken: below its home
        // ring's front, so a denial surveys, and says the exact time at any
        // reading. The survey leaves the new bound, which no longer hides
        // an earlier front: the next denial answers from its home ring alone.
        assert_eq!(
            admit(&rings, 0, now),
            Err(Duration::from_nanos(t + WINDOW - now))
        );
        assert_eq!(rings.hints[0].others_at.load(Ordering::Relaxed), t + WINDOW);
        assert_eq!(
            admit(&rings, 0, WINDOW + grace),
            Err(Duration::from_nanos(t - grace))
        );
    }

    /// Once the entry has waited its grace, another ring's thread takes it.
    #[test]
    fn after_its_grace_a_busy_ring_entry_goes_to_anyone() {
        let (rings, _) = one_entry_left_in_a_busy_ring();
        let grace = rings.grace;
        assert!(admit(&rings, 0, WINDOW + grace - 1).is_err());
        assert_eq!(admit(&rings, 0, WINDOW + grace), Ok(()));
        // Four in the window again: nobody gets a fifth.
        assert!(admit(&rings, 1, WINDOW + grace).is_err());
    }

    /// The cause of two threads running no faster than one near the limit,
    /// shown gone: two threads (played here in turn, one request every
    /// microsecond between them), each asking hundreds of times per window
    /// for a limit of four. The window is a nanosecond longer than a whole
    /// number of microseconds, so each entry leaves it just after its own
    /// thread's request and the first to see it free is the *other*
    /// thread. Without the grace that one took it, every time, and each
    /// thread lived on the other's ring (on two cores: each admission pulls
    /// the other core's lines). Now no admission crosses rings, and each
    /// entry is reused at its own thread's next request.
    #[test]
    fn near_the_limit_each_thread_keeps_to_its_own_ring() {
        let window = WINDOW + 1;
        let rings = Rings::new(plan(Rate::new(4, Duration::from_nanos(window)), 2));
        assert_eq!(rings.grace, 50_000);
        let step = 1_000;
        let windows = 20;
        let (mut admitted, mut crossed) = (0u64, 0u64);
        for k in 0..windows * WINDOW / step {
            let home = (k % 2) as usize;
            let now = k * step;
            let before: Vec<u64> = rings.rings.iter().map(|r| r.head().unwrap()).collect();
            if admit(&rings, home, now).is_ok() {
                admitted += 1;
                let moved = |i: usize| rings.rings[i].head().unwrap() != before[i];
                if moved(1 - home) {
                    assert!(!moved(home), "one permit, one ring");
                    crossed += 1;
                }
            }
        }
        assert_eq!(crossed, 0, "admissions that took another ring's entry");
        // Every slot is reused at most two steps (its thread's next request)
        // after it frees: 4 permits per window of `window + 2·step`.
        let floor = 4 * windows * WINDOW / (window + 2 * step);
        assert!(
            admitted >= floor,
            "{admitted} admitted, at least {floor} expected"
        );
    }

    /// A ring whose threads went quiet a grace ago, or that no thread calls
    /// home, gives its free entries to anyone at once: one thread alone gets
    /// the whole limit, as a log without rings would give it.
    #[test]
    fn a_quiet_ring_gives_its_entries_at_once() {
        let rings = rings();
        // Ring 1's thread admitted at 0 and went quiet.
        assert_eq!(admit(&rings, 1, 0), Ok(()));
        assert_eq!(admit(&rings, 1, 0), Ok(()));
        // Ring 0's thread, a window later: the whole limit, at once.
        let later = WINDOW + rings.grace;
        for _ in 0..4 {
            assert_eq!(admit(&rings, 0, later), Ok(()));
        }
        assert!(admit(&rings, 0, later).is_err());
        // A fresh log: ring 1 was never anyone's home, so a lone thread of
        // ring 0 takes its entries the moment they free.
        let rings = self::rings();
        for _ in 0..4 {
            assert_eq!(admit(&rings, 0, 0), Ok(()));
        }
        assert_eq!(admit(&rings, 0, WINDOW - 1), Err(Duration::from_nanos(1)));
        for _ in 0..4 {
            assert_eq!(admit(&rings, 0, WINDOW), Ok(()));
        }
    }
}

/// What a survey of the rings' fronts found for one request.
#[derive(Clone, Copy)]
struct Fronts {
    /// Each ring's head as read.
    heads: PerRing<u64>,
    /// How many entries at each ring's front the request may take.
    free: PerRing<u32>,
    /// Their sum (at most the request's permits).
    total: u32,
    /// The earliest time an entry at a ring's front can be taken, among the
    /// fronts read: for one permit, the retry-after.
    earliest: u64,
    /// The same over the other rings alone, for the home ring's hint.
    earliest_other: u64,
}

/// The retry-after of a log of several rings, from one thread and from
/// several (played here in turn on one thread, each with its home ring), at
/// readings that step back: on the log as a denial left it, the request is
/// denied a nanosecond before the wait runs out and admitted when it does.
#[cfg(all(test, not(loom)))]
mod retry {
    use std::time::Duration;

    use super::{Plan, Rings};
    use crate::error::Denied;
    use crate::rate::Rate;
    use crate::sliding_log::LogConfig;
    use crate::sync::thread::set_thread_hint;

    /// One request: the thread's home ring, its reading, its permits.
    #[derive(Debug, Clone, Copy)]
    struct Request {
        home: usize,
        at: u64,
        n: u32,
    }

    fn rings(limit: u32, window: u64, stripes: usize, count_denied: bool) -> Rings {
        Rings::new(Plan {
            rules: LogConfig::new(Rate::new(limit, Duration::from_nanos(window))).unwrap(),
            count_denied,
            stripes,
        })
    }

    fn ask(rings: &Rings, request: Request) -> Result<(), Denied> {
        set_thread_hint(request.home);
        rings
            .try_acquire_n(request.at, request.n)
            .expect("not sealed")
    }

    fn wait(answer: Result<(), Denied>) -> Option<u64> {
        match answer {
            Err(Denied::RetryAfter(wait)) => Some(wait.as_nanos() as u64),
            _ => None,
        }
    }

    /// xorshift64: the sequences below, the same on every run.
    struct Rng(u64);

    impl Rng {
        fn below(&mut self, bound: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % bound
        }
    }

    /// Threads of `homes` home rings taking turns, `len` requests of 1 to
    /// `limit` permits (mostly one) at readings that climb and step back by
    /// up to a window.
    fn requests(rng: &mut Rng, homes: u64, limit: u32, window: u64, len: usize) -> Vec<Request> {
        let mut at = 10 * window;
        (0..len)
            .map(|_| {
                match rng.below(4) {
                    0 => at = at.saturating_sub(rng.below(window + 1)),
                    1 | 2 => at += rng.below(window / 2 + 1),
                    _ => {}
                }
                let n = match rng.below(3) {
                    0 => 1 + rng.below(u64::from(limit)) as u32,
                    _ => 1,
                };
                Request {
                    home: rng.below(homes) as usize,
                    at,
                    n,
                }
            })
            .collect()
    }

    /// Each denial of `requests`, asked again of a log built by `make` and
    /// sent the requests up to it: one nanosecond before its wait runs out
    /// (denied), and when it does. Returns, per denial, the request and the
    /// answer then.
    fn probe(make: &dyn Fn() -> Rings, requests: &[Request]) -> Vec<(Request, Result<(), Denied>)> {
        let log = make();
        let mut then = Vec::new();
        for (i, &request) in requests.iter().enumerate() {
            let Some(told) = wait(ask(&log, request)) else {
                continue;
            };
            assert!(told > 0, "{request:?}: a zero wait");
            let again = |at: u64| {
                let replica = make();
                for &earlier in &requests[..=i] {
                    let _ = ask(&replica, earlier);
                }
                ask(&replica, Request { at, ..request })
            };
            let early = again(request.at + told - 1);
            assert!(
                told == 1 || wait(early).is_some(),
                "{request:?}, told to wait {told} ns: {early:?} a nanosecond before; \
                 requests: {:?}",
                &requests[..=i]
            );
            then.push((request, again(request.at + told)));
        }
        then
    }

    /// Runs 300 cases over limits, windows, stripe counts and counted
    /// denials, each on the requests `draw` makes for it, and checks that
    /// every wait a denial names is exact; at least 1,000 of them.
    fn every_wait_is_exact(seed: u64, draw: impl Fn(&mut Rng, usize, u32, u64) -> Vec<Request>) {
        let mut rng = Rng(seed);
        let mut denials = 0;
        for case in 0..300 {
            let (limit, window) = ([2, 3, 4, 8][case % 4], [2_000, 3_000, 100_000][case % 3]);
            let stripes = [2, 4][case / 4 % 2];
            let counting = case % 5 == 0;
            let make = || rings(limit, window, stripes, counting);
            let requests = draw(&mut rng, case, limit, window);
            for (request, then) in probe(&make, &requests) {
                denials += 1;
                assert_eq!(then, Ok(()), "case {case}, {request:?}: {requests:?}");
            }
        }
        assert!(denials > 1_000, "only {denials} denials checked");
    }

    /// One thread, any reading: every wait is exact.
    #[test]
    fn one_thread_gets_the_exact_wait_at_every_reading() {
        every_wait_is_exact(0x9e37_79b9_7f4a_7c15, |rng, _, limit, window| {
            let home = rng.below(4) as usize;
            let mut requests = requests(rng, 1, limit, window, 60);
            for request in &mut requests {
                request.home = home;
            }
            requests
        });
    }

    /// Several threads, any reading: every wait is exact too, one permit's
    /// included — a denial that answers from its ring's bound on the other
    /// rings does so only where its own ring binds.
    #[test]
    fn several_threads_get_the_exact_wait_at_every_reading() {
        every_wait_is_exact(0x2545_f491_4f6c_dd1d, |rng, case, limit, window| {
            requests(rng, 2 + case as u64 % 2, limit, window, 60)
        });
    }

    /// Two threads: the thread of ring 1 surveyed both rings at 198,526
    /// (ring 0's front frees at 199,526); at 199,526 each thread took its
    /// own ring's entry; then ring 1's thread, with a reading from before
    /// all that, must be told 201,526, when both fronts free — not 199,526,
    /// the bound its survey left, which another thread's admission made
    /// stale.
    #[test]
    fn another_threads_admission_leaves_a_stale_wait_exact() {
        let log = rings(2, 2_000, 2, false);
        let request = |home, at| Request { home, at, n: 1 };
        for home in [0, 1] {
            assert_eq!(ask(&log, request(home, 197_526)), Ok(()));
        }
        assert_eq!(wait(ask(&log, request(1, 198_526))), Some(1_000));
        for home in [0, 1] {
            assert_eq!(ask(&log, request(home, 199_526)), Ok(()));
        }
        assert_eq!(wait(ask(&log, request(1, 166_658))), Some(34_868));
        assert_eq!(wait(ask(&log, request(1, 201_525))), Some(1));
        assert_eq!(ask(&log, request(1, 201_526)), Ok(()));
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
    use crate::sync::thread::thread_hint;

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
