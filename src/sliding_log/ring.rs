//! The lock-free ring: a head word of tickets and one entry word per slot.

use crate::sync::Backoff;

use super::log::{
    Asked, EMPTY, Entries, Entry, Geometry, Inheritance, Moved, SEALED, Verdict, entry_word,
    lap_bit,
};
use crate::limiter::Snapshot;
use crate::sync::{AtomicU64, Ordering};

/// The ring was sealed by a reconfiguration: look up the current ring and retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SealedRing;

/// What a claim needs of the entries its tickets replace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// An admission: every replaced entry left the window.
    Admit,
    /// A denied attempt logged in counting mode: nothing (but no entry in flight).
    Log,
}

/// What one ring made of a request.
#[derive(Debug, Clone, Copy)]
pub(crate) enum RingOutcome {
    /// Admitted: the tickets are claimed and stamped.
    Admitted(Claim),
    /// Denied, and logged (counting mode); retry after `retry_ns` for this ring.
    Logged { retry_ns: u64 },
    /// Denied, nothing written; retry after `retry_ns` for this ring.
    Denied { retry_ns: u64 },
}

/// Tickets one ring gave a request: enough to take them back.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Claim {
    /// The head the claim moved: its first ticket.
    pub(crate) before: u64,
    /// The head it left: one past its last ticket.
    pub(crate) after: u64,
    pub(crate) n: u32,
    /// The tickets' stamp.
    pub(crate) stamp: u64,
    /// An upper bound on the stamps of the entries the tickets overwrote.
    pub(crate) replaced: u64,
}

/// `capacity` entry words and the head (the next ticket), updated without
/// locks, with the layout they follow. Its holder keeps it on a cache line of
/// its own (the log's stripes are padded): every admission writes the head,
/// and a decision reads the layout beside it, while the slots it guards are
/// spread out.
///
/// See the [module docs](super) for the state table and the orderings' proof.
#[derive(Debug)]
pub(crate) struct AtomicRing {
    core: RingCore,
    geometry: Geometry,
    /// Permits dropped by earlier reconfigurations: `(floor, count)`, none of
    /// them stamped after `floor`.
    dropped: (u64, u64),
    /// The newest inherited bound (0 if none): no stamp of a ring of several
    /// rules goes below it.
    inherited: u64,
}

/// A ring as one decision sees it: entries are classified against the head
/// that decision loaded. Any ring of this layout — the direct log's stripes,
/// a key's ring in the keyed log — is read through it.
pub(crate) struct RingView<'a> {
    head_word: &'a AtomicU64,
    slots: &'a [AtomicU64],
    head: u64,
}

impl<'a> RingView<'a> {
    /// The ring whose head word is `head_word` and entry words `slots`, as
    /// seen by a decision made on the head value `head`.
    #[inline]
    fn new(head_word: &'a AtomicU64, slots: &'a [AtomicU64], head: u64) -> Self {
        RingView {
            head_word,
            slots,
            head,
        }
    }
}

impl Entries for RingView<'_> {
    #[inline]
    fn read(&self, index: usize, lap: u64) -> Entry {
        // Acquire: pairs with the Release store of whoever wrote the word we read.
        // If it is a later lap's entry, its writer's head CAS thereby happens before
        // our own CAS, which therefore fails (the head only grows): a decision can
        // only succeed on entries of laps up to the one it expects. (The Acquire
        // head load rules out laps before that one; see `try_acquire_n`.)
        let word = self.slots[index].load(Ordering::Acquire);
        if word & 1 == lap_bit(lap) {
            Entry::Stamp(word >> 1)
        } else if self.head_word.load(Ordering::Relaxed) == self.head {
            // The other parity: the lap before the expected one (the ticket is
            // claimed, its store not landed) or the lap after it (a later ticket
            // is claimed and stored). In the second case the claim happens before
            // this reload (through the Acquire above), so coherence makes the
            // reload see a head past ours: Relaxed is enough to tell them apart.
            Entry::Pending
        } else {
            Entry::Moved
        }
    }
}

/// A ring's words: the head (the next ticket, `(lap << shift) | index`, plus
/// [`SEALED`]) and one entry word per slot (`(stamp << 1) | lap_bit(lap)`;
/// zero = never written). The direct log's rings and a key's ring each hold
/// one, and every access the two share is here, once: the head a decision
/// starts from, the claim, the seal, the reads of a sealed ring.
#[derive(Debug)]
pub(crate) struct RingCore {
    head: AtomicU64,
    slots: Box<[AtomicU64]>,
}

impl RingCore {
    /// A ring of `slots` whose head is `head`.
    pub(crate) fn from_parts(head: u64, slots: Box<[AtomicU64]>) -> Self {
        RingCore {
            head: AtomicU64::new(head),
            slots,
        }
    }

    /// A ring of `geometry`'s capacity whose first tickets (lap 0) hold
    /// `stamps`, oldest first (at most the capacity of them), the head just
    /// past them.
    pub(crate) fn with_stamps(geometry: &Geometry, stamps: &[u64]) -> Self {
        let slots: Box<[AtomicU64]> = (0..geometry.capacity() as usize)
            .map(|i| AtomicU64::new(stamps.get(i).map_or(EMPTY, |&s| entry_word(s, 0))))
            .collect();
        // `stamps.len() <= capacity`, so the head stays in lap 0 or starts lap 1.
        let head = geometry
            .advance(0, stamps.len() as u32)
            .expect("one lap of tickets always fits");
        RingCore::from_parts(head, slots)
    }

    #[inline]
    pub(crate) fn slots(&self) -> &[AtomicU64] {
        &self.slots
    }

    /// The head word itself, for what only a key's ring does with it (a
    /// refund's conditional seal, its undoing).
    #[inline]
    pub(crate) fn head_word(&self) -> &AtomicU64 {
        &self.head
    }

    /// The ring as a decision made on the head value `head` reads it.
    #[inline]
    pub(crate) fn view(&self, head: u64) -> RingView<'_> {
        RingView::new(&self.head, &self.slots, head)
    }

    /// The head, for a decision to be made on; `Err` once the ring is sealed.
    #[inline]
    pub(crate) fn head(&self) -> Result<u64, SealedRing> {
        // Acquire: pairs with the Release of the CAS that wrote this head (and,
        // through the release sequence of the head's RMWs, of every earlier
        // claim). Each of those claimers read, with Acquire, the entry its
        // tickets replace before claiming; so those entries' stores happen
        // before our reads of the same slots, and coherence lets us see nothing
        // older. With the Acquire on entry loads this pins every entry we
        // classify to exactly one lap, though the word keeps one lap bit.
        let head = self.head.load(Ordering::Acquire);
        if head & SEALED != 0 {
            Err(SealedRing)
        } else {
            Ok(head)
        }
    }

    /// The head a snapshot reads, sealed or not. Advisory: entries in flight
    /// count as stamped at the snapshot's time.
    #[inline]
    pub(crate) fn snapshot_head(&self) -> u64 {
        // Acquire: as in `head`, so the entries read are those of the laps
        // the head implies.
        self.head.load(Ordering::Acquire) & !SEALED
    }

    /// Seals the ring: no ticket can be claimed after this returns. `true`
    /// for the one caller that sealed it.
    pub(crate) fn seal(&self) -> bool {
        // AcqRel: Acquire so that the claims before the seal (and, through
        // them, the entry reads their claimers made) happen before our reads
        // of the sealed ring's entries; Release so that a request that sees
        // the seal with Acquire (a key ring's `is_sealed`) also sees what the
        // sealer did before it: the taking of the key ring's replacement lock,
        // which it then waits on. (The direct log's rings need only the
        // Acquire; on an RMW the Release costs nothing.)
        self.head.fetch_or(SEALED, Ordering::AcqRel) & SEALED == 0
    }

    /// The head of a sealed ring, without the seal.
    #[inline]
    pub(crate) fn sealed_head(&self) -> u64 {
        // Relaxed: the seal's Acquire already synchronized with every claim.
        self.head.load(Ordering::Relaxed) & !SEALED
    }

    /// A sealed ring's entries, each waited for while its claimer has not
    /// stored it yet.
    #[inline]
    pub(crate) fn settled(&self) -> Settled<'_> {
        Settled(&self.slots)
    }

    /// One request's claim on this ring — a stripe of the direct log, a
    /// key's ring — the one place its tickets are claimed and stamped:
    /// `decide` judges the entries as of one head load, and an admission (or
    /// a logged denial) claims its tickets by one compare-and-swap of the
    /// head and then stamps them. Sets `lost` when another thread moved the
    /// head first.
    #[inline(always)]
    pub(crate) fn claim(
        &self,
        geometry: &Geometry,
        n: u32,
        lost: &mut bool,
        decide: impl Fn(&RingView<'_>, u64) -> Verdict,
    ) -> Result<RingOutcome, SealedRing> {
        let (head_word, slots) = (&self.head, &*self.slots);
        // Lost races back off a little: a retry re-reads two contended lines (the
        // head and the slot's), and retrying at once mostly loses again.
        let mut backoff = Backoff::new();
        loop {
            let head = self.head()?;
            let (next, stamp, replaced, denied) =
                match decide(&RingView::new(head_word, slots, head), head) {
                    Verdict::Moved => {
                        *lost = true;
                        backoff.wait();
                        continue;
                    }
                    Verdict::Admit {
                        next,
                        stamp,
                        replaced,
                    } => (next, stamp, replaced, None),
                    Verdict::Deny {
                        retry_ns,
                        record: Some((next, stamp)),
                    } => (next, stamp, 0, Some(retry_ns)),
                    Verdict::Deny {
                        retry_ns,
                        record: None,
                    } => return Ok(RingOutcome::Denied { retry_ns }),
                };
            // Release: see `head`; this claim must carry our entry reads to
            // later claimers (and to a sealer). Relaxed on failure: we start over
            // with a fresh Acquire load. A sealed head also fails the CAS (it
            // differs from `head`), so no ticket is claimed after a seal. Weak: a
            // spurious failure only costs one more decision.
            //
            // The first entry's slot and word are ready before the claim, so the
            // window in which a claimed ticket is pending — the window in which a
            // preempted writer makes requests for its slot look elsewhere — is a
            // single store for n = 1.
            let first = &slots[geometry.index(head)];
            let first_word = entry_word(stamp, geometry.lap(head));
            if head_word
                .compare_exchange_weak(head, next, Ordering::Release, Ordering::Relaxed)
                .is_ok()
            {
                // Release: pairs with the readers' Acquire (see `RingView::read`).
                stamp_entry(first, first_word, Ordering::Release);
                for (lap, i) in geometry.tickets(head, n).skip(1) {
                    // Release: as above.
                    stamp_entry(&slots[i], entry_word(stamp, lap), Ordering::Release);
                }
                return Ok(match denied {
                    None => RingOutcome::Admitted(Claim {
                        before: head,
                        after: next,
                        n,
                        stamp,
                        replaced,
                    }),
                    Some(retry_ns) => RingOutcome::Logged { retry_ns },
                });
            }
            *lost = true;
            backoff.wait();
        }
    }
}

impl AtomicRing {
    /// A ring whose first tickets (lap 0) hold the inherited stamps, oldest first
    /// (at most `capacity` of them), the head just past them.
    pub(crate) fn inheriting(geometry: Geometry, inheritance: Inheritance) -> Self {
        let stamps = &inheritance.stamps;
        AtomicRing {
            core: RingCore::with_stamps(&geometry, stamps),
            geometry,
            dropped: (inheritance.floor, inheritance.dropped),
            inherited: stamps.last().copied().unwrap_or(0),
        }
    }

    #[inline]
    fn view(&self, head: u64) -> RingView<'_> {
        self.core.view(head)
    }

    pub(crate) fn geometry(&self) -> &Geometry {
        &self.geometry
    }

    /// Bytes of heap the ring's slots take.
    pub(crate) fn slot_bytes(&self) -> usize {
        std::mem::size_of_val(self.core.slots())
    }

    /// Decides the next `n` tickets (`1 <= n <= capacity`) at `now` for this
    /// ring alone, and claims and stamps them when [`Mode`] says so:
    /// [`Mode::Admit`] claims only if every entry they replace left the window;
    /// [`Mode::Log`] (counting denied attempts) also logs a denied attempt,
    /// unless an entry it would replace is still in flight.
    #[inline]
    pub(crate) fn claim(&self, now: u64, n: u32, mode: Mode) -> Result<RingOutcome, SealedRing> {
        self.claim_noting(now, n, mode, &mut false)
    }

    /// [`claim`](Self::claim), setting `lost` when another thread moved the
    /// head first (a lost compare-and-swap, or entries that moved under the
    /// decision): the sign that another thread shares this ring.
    pub(crate) fn claim_noting(
        &self,
        now: u64,
        n: u32,
        mode: Mode,
        lost: &mut bool,
    ) -> Result<RingOutcome, SealedRing> {
        let geometry = self.geometry.with_count_denied(matches!(mode, Mode::Log));
        self.core.claim(&self.geometry, n, lost, |view, head| {
            geometry.decide(view, head, now, n)
        })
    }

    /// Decides `n` permits at `now` on a ring that holds several `rules` at
    /// once ([`Geometry::decide_rules`]), and claims and stamps them if every
    /// rule admits them (or, counting denied attempts, logs the denial).
    pub(crate) fn claim_rules(
        &self,
        now: u64,
        n: u32,
        rules: &[(u32, u64)],
    ) -> Result<RingOutcome, SealedRing> {
        self.core
            .claim(&self.geometry, n, &mut false, |view, head| {
                self.geometry
                    .decide_rules(view, head, Asked { now, n, rules }, self.inherited)
            })
    }

    /// What a ring of several `rules` reports at `now`
    /// ([`Geometry::snapshot_rules`]).
    pub(crate) fn snapshot_rules(&self, now: u64, rules: &[(u32, u64)]) -> Snapshot {
        let head = self.core.snapshot_head();
        self.geometry
            .snapshot_rules(&self.view(head), head, now, rules)
    }

    /// Takes back an admission that a request spanning several rings could not
    /// complete: each claimed entry is restamped at `to`, a time at or after
    /// every entry the claim replaced left the window (the claim was an
    /// admission, so `now − window` is one). The slot's stamps still only grow,
    /// which is all the guarantee needs, and the entry is free again at once.
    /// An entry that a later lap already replaced — possible only after a whole
    /// window — is left alone: the request then simply counted, which is safe.
    pub(crate) fn undo(&self, claim: Claim, to: u64) {
        for (lap, index) in self.geometry.tickets(claim.before, claim.n) {
            // Relaxed on success: a reader that reads the restamped word needs
            // only what reading our claim's word gave it — that our head CAS
            // happens before its own (see `RingView::read`) — and still gets it:
            // this CAS is an RMW, so it continues the release sequence headed
            // by our claim's Release store of this very word (a success means
            // nothing else was stored in between), and an Acquire load that
            // reads it synchronizes with that store. The word is the whole
            // entry; nothing else is published. Relaxed on failure: the slot
            // moved on and we leave it. No ABA: a word with our lap bit and our
            // stamp can only be ours (two laps later the stamp is at least two
            // windows larger).
            let _ = self.core.slots()[index].compare_exchange(
                entry_word(claim.stamp, lap),
                entry_word(to, lap),
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
        }
    }

    /// The head, for a decision to be made on; `Err` once the ring is sealed.
    #[inline]
    pub(crate) fn head(&self) -> Result<u64, SealedRing> {
        self.core.head()
    }

    /// When the entry the `k`-th ticket from `head` (a value [`AtomicRing::head`]
    /// returned; `k < capacity`) would replace leaves the window.
    #[inline]
    pub(crate) fn free_at(&self, head: u64, k: u32, now: u64) -> Result<u64, Moved> {
        self.geometry
            .replaced_free_at(&self.view(head), head, k, now)
    }

    /// What a request could get at `now`. Advisory under concurrency: entries in
    /// flight count as stamped at `now`.
    pub(crate) fn snapshot(&self, now: u64) -> Snapshot {
        let head = self.core.snapshot_head();
        self.geometry.snapshot(&self.view(head), head, now)
    }

    /// Seals the ring: no ticket can be claimed after this returns. `true` for
    /// the one caller that sealed it.
    pub(crate) fn seal(&self) -> bool {
        self.core.seal()
    }

    /// What a ring of `capacity` slots inherits from this sealed one
    /// ([`Geometry::inherit`]). Waits for tickets claimed before the seal to be
    /// stamped: their writers are between their claim and their stores.
    pub(crate) fn inheritance(&self, capacity: u32) -> Inheritance {
        let head = self.core.sealed_head();
        self.geometry
            .inherit(&self.core.settled(), head, self.dropped, capacity)
    }
}

/// Writes a claimed ticket's entry word: a plain store, except under loom.
///
/// loom (0.7) orders the writes to one atomic by vector clocks, and a plain
/// store that has not seen another thread's read-modify-write can end up
/// unordered with it: the storing thread's next load may then return the RMW's
/// older value, which write-read coherence forbids (tokio-rs/loom#389, #282).
/// Here that RMW is a rollback (`undo`'s CAS) of the entry a claimer just read:
/// the claimer's store must follow it (the CAS read the entry the claimer read,
/// so it comes right after that entry), but loom may let the claimer read the
/// rolled-back word back, see its slot as claimed-but-unstamped for good and
/// refuse. With every write to a slot an RMW, loom keeps each slot's writes in
/// one total order, so in the loom build the entry is written by a `swap`.
///
/// The two are the same program for this algorithm: the swap's value is
/// discarded, so every execution of the store has a twin in which the swap
/// reads the entry just before it in modification order (coherence allows
/// that read: whatever happens before the write is ordered before it). The
/// one thing an RMW adds is that it continues the release sequence of the
/// entry it overwrites, so a reader that acquires our entry also synchronizes
/// with that entry's writer. That edge is already there with the store: a
/// claim is only made after its decision read every entry its tickets replace
/// with `Acquire` (`Geometry::replaced`), so the replaced entry's writer (or,
/// through its release sequence, the rollback that restamped it) happens
/// before our claim, hence before every reader of our entry. (A first-lap
/// ticket replaces nothing and reads nothing: the word before it is the
/// slot's initial value, which heads no release sequence.) Same
/// happens-before, same values: what loom proves of the swap holds for the
/// store that ships, where a swap would cost a locked instruction per permit.
#[inline(always)]
pub(crate) fn stamp_entry(slot: &AtomicU64, word: u64, order: Ordering) {
    crate::sync::store_as_swap(slot, word, order);
}

/// A sealed ring's entry words, read once its claimed entries have landed.
pub(crate) struct Settled<'a>(&'a [AtomicU64]);

impl Entries for Settled<'_> {
    fn read(&self, index: usize, lap: u64) -> Entry {
        let mut pause = Backoff::default();
        loop {
            // Relaxed: the seal's Acquire already ordered every claim (and the
            // reads each claimer made of the entry it replaced) before this
            // load, so coherence rules out every lap older than the previous
            // one; the word read is the stamp itself, and nothing else is read
            // on its strength. A store still on its way is waited for below.
            let word = self.0[index].load(Ordering::Relaxed);
            // No ticket is claimed after the seal, so the other parity can only be
            // the previous lap: a store still on its way.
            if word & 1 == lap_bit(lap) {
                return Entry::Stamp(word >> 1);
            }
            pause.pause();
        }
    }
}
