//! The exact sliding log as a keyed kind: one lock-free ring per key.
//!
//! A key's log is the direct [`SlidingLog`]'s ring — the same entry words,
//! tickets, claims and proofs (`sliding_log/log.rs`, `sliding_log/ring.rs`)
//! — one ring per key without stripes, allocated on the key's first
//! admission: `8·N` bytes of slots and a 40-byte header, behind an
//! 8-byte epoch-protected pointer in the map's entry. A request for `n`
//! permits is admitted iff, for every rule `(N_i, T_i)` of its
//! [`LogConfig`] and every ticket `k` it takes, the entry of ticket `k − N_i`
//! has left `T_i` ([`Geometry::decide_rules`]): at most `N_i` permits in any
//! window `[t, t + T_i)` per key, decision for decision with the direct log
//! with one rule (property tests in `tests/integration/keyed.rs`; several rules against a
//! reference model in `tests/integration/keyed_rules.rs`). The ring holds `N = max N_i`
//! slots, so every rule's entry is still there.
//!
//! # State
//!
//! | where | what |
//! |---|---|
//! | the map's entry | a pointer to the key's current ring (epoch-protected) |
//! | ring header | the tag the ring was written under; the head (next ticket, and the sealed bit) |
//! | ring slots | `N` entry words: `stamp << 1 \| lap bit`, as the direct log's |
//!
//! | operation | reads | writes |
//! |---|---|---|
//! | admit | the pointer, the head, `n` entries per rule, the newest entry | head by CAS, then `n` entries (the direct log's claim) |
//! | deny | the pointer, the head, the entries up to the blocking one | nothing |
//! | first admission | the pointer | a new ring, published by CAS on the pointer |
//! | refund, if still the latest | the pointer, the head | seal (CAS at the admission's head), a copy with the head moved back, published by CAS |
//! | carry-over (new tag) | the pointer, every entry (sealed) | a new ring of the kept stamps, published by CAS |
//!
//! A ring is never changed behind a decision: anything that moves the head
//! back or changes the configuration seals the ring (claims fail from then
//! on), copies it and publishes the copy, so a decision made on the old ring
//! either completed before the seal or fails and decides again on the new
//! one. Requests that meet a sealed ring wait for the copy (`O(N)`); nothing
//! else waits. A refund tells its admission's ring by address, head and
//! newest stamp (`KeyRing::holds`).
//!
//! Stale readings are decided as the direct log decides them: checked as
//! they are, which can only deny more; the keyed layer's time floor keeps a
//! reading from going below the floor.
//!
//! [`SlidingLog`]: crate::SlidingLog
//! [`Geometry::decide_rules`]: crate::sliding_log::log::Geometry

use std::fmt;

use super::{Carry, Refusal, View, sealed::Kind};
use crate::clock::Clock;
use crate::limiter::{Snapshot, check_request};
use crate::sliding_log::log::{
    Asked, EMPTY, Entries, Entry, Geometry, SEALED, Verdict, entry_word, retry_after,
};
use crate::sliding_log::ring::{Claim, RingCore, RingOutcome, RingView, stamp_entry};
use crate::sliding_log::{LogConfig, SlidingLog};
use crate::sync::fault::{Fault, injected};
use crate::sync::{AtomicU64, Backoff, Guard, Mutex, Ordering, Shared, pin};

/// One key's ring: the tag it was written under, the head of its tickets and
/// its entry words, laid out as the direct log's rings are
/// ([`Geometry`] with the ring's length as its capacity). A ring with no
/// slots is a key that has admitted nothing yet.
struct KeyRing {
    tag: u64,
    /// The head and the entry words, as in the direct log's rings.
    core: RingCore,
    /// Held by whoever seals the ring, until its successor is published (or
    /// a refund finds its admission gone and unseals): requests that meet
    /// the sealed ring wait on it rather than spin. No claim takes it.
    replacing: Mutex<()>,
}

/// The ring was sealed: a refund or a carry-over is replacing it.
#[derive(Debug, Clone, Copy)]
struct Replacing;

impl KeyRing {
    fn fresh(tag: u64) -> Self {
        KeyRing {
            tag,
            core: RingCore::from_parts(0, Box::new([])),
            replacing: Mutex::new(()),
        }
    }

    /// A ring of `slots` slots whose first tickets hold `stamps`, oldest
    /// first (at most `slots` of them), its head just past them.
    fn with_stamps(tag: u64, slots: u32, stamps: &[u64]) -> Self {
        let geometry = Geometry::from_parts(slots, 1, false);
        KeyRing {
            tag,
            core: RingCore::with_stamps(&geometry, stamps),
            replacing: Mutex::new(()),
        }
    }

    #[inline]
    fn slots(&self) -> &[AtomicU64] {
        self.core.slots()
    }

    /// The ticket layout of this ring (`window` only for the time range's
    /// end); the ring has slots.
    #[inline]
    fn geometry(&self, window: u64) -> Geometry {
        Geometry::from_parts(self.slots().len() as u32, window, false)
    }

    #[inline]
    fn view(&self, head: u64) -> RingView<'_> {
        self.core.view(head)
    }

    /// The head, for a decision to be made on; `Err` once sealed.
    #[inline]
    fn head(&self) -> Result<u64, Replacing> {
        // As the direct log's rings' (`RingCore::head`, Acquire).
        self.core.head().map_err(|_sealed| Replacing)
    }

    /// Whether a replacement has sealed this ring.
    #[inline]
    fn is_sealed(&self) -> bool {
        // Acquire: pairs with the seal's Release, so the sealer's taking of
        // `replacing` (before its seal) happens before our `wait_out`: we
        // wait on the lock it holds, never slip in ahead of it.
        self.core.head_word().load(Ordering::Acquire) & SEALED != 0
    }

    /// Waits until whoever sealed this ring (seen sealed, by `is_sealed` or
    /// a claim's Acquire head load) has published its successor or unsealed
    /// it.
    #[cold]
    fn wait_out(&self) {
        drop(self.replacing.lock());
    }

    /// Decides `n` permits at `now` under `config` and claims them if every
    /// rule admits them: `Ok(Err(retry_ns))` if denied (nothing written).
    fn claim(&self, config: &LogConfig, now: u64, n: u32) -> Result<Result<Claim, u64>, Replacing> {
        let geometry = self.geometry(config.longest_ns());
        // The direct log's claim: the same CAS, orderings and stores. A
        // key's geometry does not count denials, so nothing but an admission
        // is ever written.
        let outcome = self.core.claim(&geometry, n, &mut false, |view, head| {
            geometry.decide_rules(
                view,
                head,
                Asked {
                    now,
                    n,
                    rules: config.pairs(),
                },
                0,
            )
        });
        match outcome.map_err(|_sealed| Replacing)? {
            RingOutcome::Admitted(claim) => Ok(Ok(claim)),
            RingOutcome::Denied { retry_ns } | RingOutcome::Logged { retry_ns } => {
                Ok(Err(retry_ns))
            }
        }
    }

    /// What `n` permits at `now` would get under `config`, writing nothing:
    /// `Ok(Err(retry_ns))` if denied.
    fn check(&self, config: &LogConfig, now: u64, n: u32) -> Result<Result<(), u64>, Replacing> {
        if self.slots().is_empty() {
            return Ok(Ok(()));
        }
        let geometry = self.geometry(config.longest_ns());
        let mut backoff = Backoff::new();
        loop {
            let head = self.head()?;
            let asked = Asked {
                now,
                n,
                rules: config.pairs(),
            };
            match geometry.decide_rules(&self.view(head), head, asked, 0) {
                Verdict::Moved => backoff.wait(),
                Verdict::Deny { retry_ns, .. } => return Ok(Err(retry_ns)),
                Verdict::Admit { .. } => return Ok(Ok(())),
            }
        }
    }

    /// Seals the ring for a replacement, `replacing` held: no ticket can be
    /// claimed after this returns `true`, which it does for one caller only.
    fn seal(&self) -> bool {
        // The direct log's seal (`RingCore::seal`), whose Release a request
        // that sees the seal needs here (`is_sealed`).
        self.core.seal()
    }

    /// Seals the ring only if its head is still `head` (`replacing` held):
    /// a refund's "is our admission still the latest?". AcqRel on success
    /// as `seal`; Relaxed on failure: nothing is read on its strength. One
    /// CAS, not a loop (nor the ring's claim loop): any other head answers
    /// "no".
    fn seal_at(&self, head: u64) -> bool {
        self.core
            .head_word()
            .compare_exchange(head, head | SEALED, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    }

    /// Whether this ring, sealed at `claimed.after` by [`seal_at`], holds
    /// that admission as its newest: the newest entry is its stamp. A ring
    /// at the admission's old address with the same head is another's only
    /// if the key was evicted in between (rings replaced by a refund or a
    /// carry-over outlive every pinned caller), and eviction needs every
    /// entry a window old at the time floor, below which no later decision
    /// stamps: so that ring's newest stamp is later than ours.
    ///
    /// [`seal_at`]: Self::seal_at
    fn holds(&self, claimed: &Claim) -> bool {
        if self.slots().is_empty() {
            return false;
        }
        let geometry = self.geometry(1);
        let Some((lap, index)) = geometry.before(claimed.after, 1).next() else {
            return false;
        };
        // Waits if in flight: the seal ordered every claim before us.
        self.core.settled().read(index, lap) == Entry::Stamp(claimed.stamp)
    }

    /// Undoes a [`seal_at`](Self::seal_at) whose ring turned out not to be
    /// the one wanted: nothing was changed.
    fn unseal(&self, head: u64) {
        // Release: the sealer acquired every claim before the seal; this
        // store passes them on to the next head loads (a plain store ends
        // the head's release sequence, so it must head its own).
        self.core.head_word().store(head, Ordering::Release);
    }

    /// The sealed ring's stamps, oldest first: every logged ticket's, each
    /// waited for if its claimer has not stored it yet.
    fn sealed_stamps(&self, window: u64) -> Vec<u64> {
        if self.slots().is_empty() {
            return Vec::new();
        }
        let head = self.core.sealed_head();
        let geometry = self.geometry(window);
        let settled = self.core.settled();
        geometry
            .before(head, geometry.logged(head))
            .filter_map(|(lap, index)| match settled.read(index, lap) {
                Entry::Stamp(stamp) => Some(stamp),
                _ => None,
            })
            .collect()
    }

    /// The stamps of a ring in use, oldest first, as of one head: retried
    /// while an entry is in flight or the head moves; `Err` once sealed.
    fn live_stamps(&self, window: u64) -> Result<Vec<u64>, Replacing> {
        if self.slots().is_empty() {
            return Ok(Vec::new());
        }
        let geometry = self.geometry(window);
        let mut backoff = Backoff::new();
        'read: loop {
            let head = self.head()?;
            let view = self.view(head);
            let mut stamps = Vec::with_capacity(self.slots().len());
            for (lap, index) in geometry.before(head, geometry.logged(head)) {
                match view.read(index, lap) {
                    Entry::Stamp(stamp) => stamps.push(stamp),
                    Entry::Pending | Entry::Moved => {
                        // A claimer between its claim and its store, or a
                        // newer head: read again once it has run.
                        backoff.pause();
                        continue 'read;
                    }
                }
            }
            return Ok(stamps);
        }
    }

    /// The ring a refund leaves: this sealed ring with its head back at the
    /// refunded admission's first ticket and the entries its tickets
    /// overwrote written back, each as the latest stamp among them (an
    /// upper bound on each: stricter, never looser, and exact for every
    /// reading from the refunded admission's on, at which all of them had
    /// left the window) — or empty where the ticket overwrote nothing.
    fn refunded(&self, claimed: &Claim, n: u32) -> KeyRing {
        let geometry = self.geometry(1);
        let after = claimed.after;
        let settled = self.core.settled();
        // Every slot as the latest ticket below `after` left it, waited for
        // if still in flight (the seal ordered every claim before us).
        let (lap, head_index) = (geometry.lap(after), geometry.index(after));
        let words: Box<[AtomicU64]> = (0..self.slots().len())
            .map(|i| {
                let latest = if i < head_index {
                    Some(lap)
                } else {
                    lap.checked_sub(1)
                };
                AtomicU64::new(match latest {
                    Some(lap) => match settled.read(i, lap) {
                        Entry::Stamp(stamp) => entry_word(stamp, lap),
                        _ => EMPTY,
                    },
                    None => EMPTY,
                })
            })
            .collect();
        let ring = KeyRing {
            tag: self.tag,
            core: RingCore::from_parts(claimed.before, words),
            replacing: Mutex::new(()),
        };
        for (lap, i) in geometry.tickets(claimed.before, n) {
            let word = match lap.checked_sub(1) {
                Some(lap) => entry_word(claimed.replaced, lap),
                None => EMPTY,
            };
            // Relaxed: the ring is not published yet; its publication (a
            // Release CAS on the cell) carries every word.
            ring.slots()[i].store(word, Ordering::Relaxed);
        }
        ring
    }

    /// What this ring reports under `config` at `now` on the head `head`:
    /// the rule that binds first ([`Geometry::snapshot_rules`]).
    fn snapshot(&self, config: &LogConfig, head: u64, now: u64) -> Snapshot {
        if self.slots().is_empty() {
            return Snapshot::from_ns(config.limit(), config.limit(), 0);
        }
        self.geometry(config.longest_ns()).snapshot_rules(
            &self.view(head),
            head,
            now,
            config.pairs(),
        )
    }

    /// Exactly a new ring's decisions at `now` and later: every entry has
    /// left the longest window. The newest entry is checked first (stamps
    /// grow along the tickets unless concurrent readings were out of order,
    /// so it nearly always answers "no" alone); a "yes" is confirmed on every
    /// entry. An entry in flight is not fresh.
    fn is_fresh(&self, config: &LogConfig, now: u64) -> Result<bool, Replacing> {
        if self.slots().is_empty() {
            return Ok(true);
        }
        let head = self.head()?;
        let geometry = self.geometry(config.longest_ns());
        let view = self.view(head);
        let gone = |stamp: u64| stamp + config.longest_ns() <= now;
        // An entry in flight counts as stamped `now`: not gone.
        match geometry.newest_stamp(&view, head, now) {
            None => return Ok(true),
            Some(stamp) if !gone(stamp) => return Ok(false),
            Some(_) => {}
        }
        Ok(geometry
            .before(head, geometry.logged(head))
            .all(|(lap, index)| matches!(view.read(index, lap), Entry::Stamp(s) if gone(s))))
    }
}

impl KeyRing {
    /// The known-bad refund (`Fault::UnsealedLogRefunds`): the ring sealed
    /// at `claimed.after` is unsealed at `claimed.before`, then the
    /// overwritten entries are written back.
    fn refund_in_place(&self, claimed: &Claim, n: u32) {
        let geometry = self.geometry(1);
        self.core
            .head_word()
            .store(claimed.before, Ordering::Release);
        for (lap, i) in geometry.tickets(claimed.before, n) {
            let word = match lap.checked_sub(1) {
                Some(lap) => entry_word(claimed.replaced, lap),
                None => EMPTY,
            };
            stamp_entry(&self.slots()[i], word, Ordering::Release);
        }
    }
}

/// A key's log: its current ring, behind an epoch-protected pointer that a
/// refund or a carry-over replaces.
#[allow(unreachable_pub)] // sealed: public only as `Kind::State`
pub struct LogCell(Shared<KeyRing>);

impl LogCell {
    fn new(ring: KeyRing) -> Self {
        LogCell(Shared::new(ring))
    }
}

impl fmt::Debug for LogCell {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LogCell").finish_non_exhaustive()
    }
}

/// The stamps a ring written under `from` passes on to `to` at `now`,
/// oldest first.
///
/// The log keeps its history: `Proportional` and `Additive` both keep the
/// stamps still inside the longest window in force *and* inside the new
/// longest window (the newest `slots'` of them); `Reset` empties it. Stamps
/// already outside the old longest window are dropped even if the new one is
/// longer: a key whose log held only those was fresh, may have been evicted,
/// and must decide the same either way. A set of rules changed to another
/// keeps one history, which every new rule reads.
fn carried(stamps: &[u64], from: &LogConfig, to: &LogConfig, now: u64, carry: Carry) -> Vec<u64> {
    if carry == Carry::Reset {
        return Vec::new();
    }
    let window = from.longest_ns().min(to.longest_ns());
    let mut kept: Vec<u64> = stamps
        .iter()
        .copied()
        .filter(|&s| s + window > now)
        .collect();
    kept.sort_unstable();
    kept.drain(..kept.len().saturating_sub(to.slots() as usize));
    kept
}

/// Replaces `ring`, the cell's current ring, by `build`'s ring from its
/// stamps: a ring with slots is sealed first (only the sealer replaces it);
/// an empty one is replaced by compare-and-swap. `false` if another
/// replacement got there first.
fn replace<'g>(
    cell: &LogCell,
    ring: &'g KeyRing,
    window: u64,
    guard: &'g Guard,
    build: impl FnOnce(&[u64]) -> KeyRing,
) -> bool {
    if ring.slots().is_empty() {
        return publish(cell, ring, build(&[]), guard);
    }
    let _replacing = ring.replacing.lock();
    if !ring.seal() {
        return false;
    }
    let next = build(&ring.sealed_stamps(window));
    publish(cell, ring, next, guard)
}

/// Publishes `next` in place of `ring`; `false` (and `next` dropped) if
/// `ring` was already replaced, which a sealed ring never is but by its
/// sealer. One CAS, not a loop (nor the epoch pointers' one loop,
/// `Shared::update`): `next` was built from `ring` alone (a sealed one's
/// stamps), and a loss sends the caller back to the ring in force, to wait
/// out a seal or build from that one.
fn publish<'g>(cell: &LogCell, ring: &'g KeyRing, next: KeyRing, guard: &'g Guard) -> bool {
    match cell.0.compare_exchange(ring, next, guard) {
        Ok(_) => {
            // SAFETY: `ring` was replaced by our CAS, once; every reader of
            // it is pinned.
            unsafe { cell.0.retire(ring, guard) };
            true
        }
        Err(_) => false,
    }
}

/// The key's ring under the view's configuration, not sealed: carried over
/// (and published) first if it was written under the previous one, or
/// re-laid for this configuration if its length is another's (a state two
/// configurations back under the one-bit tag, `reconfig.rs`, keeps its
/// history); `Err(Stale)` if the view is stale.
fn current<'g>(
    view: &View<'_, LogConfig>,
    cell: &LogCell,
    now: u64,
    guard: &'g Guard,
) -> Result<&'g KeyRing, Refusal> {
    let config = view.current;
    let mut backoff = Backoff::new();
    loop {
        let ring = cell.0.load(guard);
        if ring.is_sealed() {
            // A refund or a carry-over is copying it: wait for its successor.
            ring.wait_out();
            continue;
        }
        let fits = ring.slots().is_empty() || ring.slots().len() == config.slots() as usize;
        if ring.tag == view.tag && fits {
            return Ok(ring);
        }
        let (from, carry) = if ring.tag == view.tag {
            (config, Carry::Proportional)
        } else if (view.still_current)() {
            (view.previous, view.carry)
        } else {
            return Err(Refusal::Stale);
        };
        let tag = view.tag;
        let window = from.longest_ns();
        if !replace(cell, ring, window, guard, |stamps| {
            let kept = carried(stamps, from, config, now, carry);
            if kept.is_empty() {
                KeyRing::fresh(tag)
            } else {
                KeyRing::with_stamps(tag, config.slots(), &kept)
            }
        }) {
            backoff.pause();
        }
    }
}

/// What an admission leaves: the ring it claimed on (by address) and its
/// tickets.
#[derive(Debug, Clone, Copy)]
#[allow(unreachable_pub)] // sealed: public only as `Kind::Receipt`
pub struct LogReceipt {
    ring: usize,
    claimed: Claim,
}

impl<C: Clock> Kind for SlidingLog<C> {
    type Config = LogConfig;
    type Clock = C;
    type State = LogCell;
    type Receipt = LogReceipt;

    fn capacity(config: &LogConfig) -> u32 {
        config.limit()
    }

    fn fresh(tag: u64) -> LogCell {
        LogCell::new(KeyRing::fresh(tag))
    }

    fn acquire(
        view: &View<'_, LogConfig>,
        state: &LogCell,
        now: u64,
        n: u32,
    ) -> Result<LogReceipt, Refusal> {
        let config = view.current;
        check_request(n, config.limit())?;
        let guard = pin();
        loop {
            let ring = current(view, state, now, &guard)?;
            if ring.slots().is_empty() {
                // The key's first admission allocates its ring; a racing one
                // may have already.
                publish(
                    state,
                    ring,
                    KeyRing::with_stamps(ring.tag, config.slots(), &[]),
                    &guard,
                );
                continue;
            }
            match ring.claim(config, now, n) {
                Err(Replacing) => ring.wait_out(),
                Ok(Err(retry_ns)) => return Err(Refusal::Denied(retry_after(retry_ns))),
                Ok(Ok(claimed)) => {
                    return Ok(LogReceipt {
                        ring: ring as *const KeyRing as usize,
                        claimed,
                    });
                }
            }
        }
    }

    /// Read from the ring on the head the admission left (advisory under
    /// concurrency, exact alone), only when a caller asks for it.
    fn admitted(view: &View<'_, LogConfig>, receipt: LogReceipt, now: u64) -> Snapshot {
        // SAFETY: the keyed layer asks for an admission's snapshot in the
        // call that admitted it, pinned throughout and with the state alive
        // (`Keyable::admitted`), and a ring replaced since is destroyed
        // through the epoch: the ring is alive.
        let ring = unsafe { &*(receipt.ring as *const KeyRing) };
        ring.snapshot(view.current, receipt.claimed.after, now)
    }

    fn peek(view: &View<'_, LogConfig>, state: &LogCell, now: u64, n: u32) -> Result<(), Refusal> {
        let config = view.current;
        check_request(n, config.limit())?;
        let guard = pin();
        loop {
            let ring = current(view, state, now, &guard)?;
            match ring.check(config, now, n) {
                Err(Replacing) => ring.wait_out(),
                Ok(verdict) => return verdict.map_err(|ns| Refusal::Denied(retry_after(ns))),
            }
        }
    }

    fn refund(view: &View<'_, LogConfig>, state: &LogCell, receipt: LogReceipt, n: u32) {
        let _ = view;
        let guard = pin();
        let ring = state.0.load(&guard);
        // The ring it claimed on (a carry-over or another refund since
        // replaced it: keep the permits), with its admission still the
        // latest (see `holds` for a ring at the same address).
        if ring as *const KeyRing as usize != receipt.ring {
            return;
        }
        let _replacing = ring.replacing.lock();
        if !ring.seal_at(receipt.claimed.after) {
            return;
        }
        if !ring.holds(&receipt.claimed) {
            ring.unseal(receipt.claimed.after);
            return;
        }
        if injected(Fault::UnsealedLogRefunds) {
            ring.refund_in_place(&receipt.claimed, n);
            return;
        }
        let next = ring.refunded(&receipt.claimed, n);
        let published = publish(state, ring, next, &guard);
        debug_assert!(published, "only the sealer replaces a sealed ring");
    }

    fn fork(view: &View<'_, LogConfig>, state: &LogCell, now: u64) -> Option<LogCell> {
        let config = view.current;
        let guard = pin();
        loop {
            let ring = current(view, state, now, &guard).ok()?;
            match ring.live_stamps(config.longest_ns()) {
                Err(Replacing) => ring.wait_out(),
                Ok(stamps) if stamps.is_empty() => {
                    return Some(LogCell::new(KeyRing::fresh(view.tag)));
                }
                Ok(stamps) => {
                    return Some(LogCell::new(KeyRing::with_stamps(
                        view.tag,
                        config.slots(),
                        &stamps,
                    )));
                }
            }
        }
    }

    fn snapshot(view: &View<'_, LogConfig>, state: &LogCell, now: u64) -> Option<Snapshot> {
        let guard = pin();
        let ring = current(view, state, now, &guard).ok()?;
        // Acquire: as in `KeyRing::head`, so the entries read are those of
        // the laps the head implies (a sealed head: read as it was).
        let head = ring.core.snapshot_head();
        Some(ring.snapshot(view.current, head, now))
    }

    fn is_fresh(view: &View<'_, LogConfig>, state: &LogCell, now: u64) -> Option<bool> {
        let guard = pin();
        loop {
            let ring = current(view, state, now, &guard).ok()?;
            match ring.is_fresh(view.current, now) {
                Err(Replacing) => ring.wait_out(),
                Ok(fresh) => return Some(fresh),
            }
        }
    }

    fn settle(view: &View<'_, LogConfig>, state: &LogCell, now: u64) -> bool {
        let guard = pin();
        current(view, state, now, &guard).is_ok()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// Per key: one pointer in the map's entry, and a ring header beside
    /// the slots.
    #[test]
    fn the_per_key_state_is_a_pointer_and_a_small_header() {
        assert_eq!(std::mem::size_of::<LogCell>(), 8);
        assert_eq!(std::mem::size_of::<KeyRing>(), 40);
    }
}
