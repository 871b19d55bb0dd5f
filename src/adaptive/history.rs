//! The last changes of an adaptive limit, for dashboards: a fixed ring of
//! 128-bit slots and a ticket counter, written lock-free by whichever thread
//! changed the limit.
//!
//! | word | bits | meaning |
//! |---|---|---|
//! | `head` | 64 | tickets handed out: the number of changes recorded so far |
//! | slot, bits 0..64 | 64 | the change's time, ns on the limiter's clock |
//! | slot, bits 64..96 | 32 | the new limit |
//! | slot, bits 96..128 | 32 | the change's ticket + 1, wrapping (0: never written) |
//!
//! A change takes the next ticket and writes slot `ticket % HISTORY_LEN`
//! unless the slot already holds a later ticket (a writer that lapped this
//! one). A reader takes the tickets `head − HISTORY_LEN .. head` and keeps
//! each slot that holds exactly its ticket: a writer still between its
//! ticket and its store leaves a gap, never a wrong entry.

use crate::cell::{AtomicCell, StateCell};
use crate::sync::{AtomicU64, Ordering};

/// How many changes a [`LimitHistory`] keeps.
///
/// ```
/// assert_eq!(tollgate::HISTORY_LEN, 32);
/// ```
pub const HISTORY_LEN: usize = 32;

/// One change of an adaptive limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LimitChange {
    /// The change's number, from 0: the first change is 0, the next 1.
    pub seq: u64,
    /// The new limit.
    pub limit: u32,
    /// When it changed: the `now_ns` of the sample that changed it.
    pub at_ns: u64,
}

/// The recent changes of an adaptive limit: the last [`HISTORY_LEN`] of
/// them with their times, and how many there have been.
///
/// Recording is lock-free (a `fetch_add` and a compare-and-swap, only when
/// the limit changes). Changes made by racing threads get their numbers in
/// the order they reach the ring, which may differ from the order in which
/// their limits were stored: the entries describe what each change set, and
/// [`LimitAlgorithm::limit`](crate::LimitAlgorithm::limit) is the authority
/// on the current limit. A change still being recorded when
/// [`recent`](Self::recent) reads may be missing from its answer.
///
/// ```
/// use tollgate::{Aimd, LimitAlgorithm, Sample};
///
/// let aimd = Aimd::builder().min_limit(1).initial_limit(4).build()?;
/// aimd.on_sample(Sample::success(1_000, 4), 100);
/// aimd.on_sample(Sample::dropped(1_000, 5), 200);
/// let history = aimd.history().unwrap();
/// let limits: Vec<(u32, u64)> = history.recent().iter().map(|c| (c.limit, c.at_ns)).collect();
/// assert_eq!(limits, [(5, 100), (4, 200)]);
/// assert_eq!(history.changes(), 2);
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
#[derive(Debug)]
pub struct LimitHistory {
    head: AtomicU64,
    slots: [AtomicCell<u128>; HISTORY_LEN],
}

impl LimitHistory {
    pub(crate) fn new() -> Self {
        LimitHistory {
            head: AtomicU64::new(0),
            slots: std::array::from_fn(|_| AtomicCell::new(0)),
        }
    }

    /// Records that the limit became `limit` at `at_ns`.
    pub(crate) fn record(&self, limit: u32, at_ns: u64) {
        // Relaxed: the ticket only has to be unique; the slot's own word
        // carries the entry, and nothing else is published through either.
        let ticket = self.head.fetch_add(1, Ordering::Relaxed);
        self.write(ticket, limit, at_ns);
    }

    /// Stores change number `ticket` in its slot unless a later one is there.
    fn write(&self, ticket: u64, limit: u32, at_ns: u64) {
        let tag = tag_of(ticket);
        let entry = u128::from(tag) << 96 | u128::from(limit) << 64 | u128::from(at_ns);
        let slot = &self.slots[slot_of(ticket)];
        let _ = slot.update(|current| {
            let held = (current >> 96) as u32;
            // A later ticket (by wrapping distance) already wrote here: this
            // entry is older than the ring keeps, so it is not written.
            if held != 0 && (held.wrapping_sub(tag) as i32) > 0 {
                Err(())
            } else {
                Ok(entry)
            }
        });
    }

    /// How many changes have been recorded since the algorithm was built.
    pub fn changes(&self) -> u64 {
        // Relaxed: a count for display; any value in its modification order
        // is a count that was true at some point.
        self.head.load(Ordering::Relaxed)
    }

    /// The last changes, oldest first: at most [`HISTORY_LEN`].
    pub fn recent(&self) -> Vec<LimitChange> {
        // Relaxed: as in `changes`; each slot says itself which ticket it
        // holds, so a stale head only shortens the answer.
        let head = self.head.load(Ordering::Relaxed);
        let first = head.saturating_sub(HISTORY_LEN as u64);
        (first..head)
            .filter_map(|seq| {
                let word = self.slots[slot_of(seq)].load();
                ((word >> 96) as u32 == tag_of(seq)).then_some(LimitChange {
                    seq,
                    limit: (word >> 64) as u32,
                    at_ns: word as u64,
                })
            })
            .collect()
    }

    /// The most recent change in the ring, if any.
    pub fn last(&self) -> Option<LimitChange> {
        self.recent().pop()
    }
}

fn slot_of(ticket: u64) -> usize {
    (ticket % HISTORY_LEN as u64) as usize
}

/// The 32-bit tag a ticket is stored under: never 0, so 0 marks an empty
/// slot; wrapping, compared by wrapping distance (tickets in one slot differ
/// by multiples of `HISTORY_LEN`, far below 2^31).
fn tag_of(ticket: u64) -> u32 {
    (ticket as u32).wrapping_add(1).max(1)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_last_changes_in_order() {
        let history = LimitHistory::new();
        assert!(history.recent().is_empty());
        for i in 0..(HISTORY_LEN as u64 + 5) {
            history.record(i as u32, i * 10);
        }
        let recent = history.recent();
        assert_eq!(recent.len(), HISTORY_LEN);
        assert_eq!(recent[0].seq, 5);
        assert_eq!(recent[0].limit, 5);
        assert_eq!(recent[0].at_ns, 50);
        assert_eq!(history.last().unwrap().seq, HISTORY_LEN as u64 + 4);
        assert_eq!(history.changes(), HISTORY_LEN as u64 + 5);
    }

    #[test]
    fn an_older_writer_does_not_overwrite_a_newer_entry() {
        let history = LimitHistory::new();
        // Ticket HISTORY_LEN lands first; ticket 0, in the same slot, is late.
        history
            .head
            .store(HISTORY_LEN as u64 + 1, Ordering::Relaxed);
        history.write(HISTORY_LEN as u64, 7, 70);
        history.write(0, 3, 30);
        let last = history.last().unwrap();
        assert_eq!(
            (last.seq, last.limit, last.at_ns),
            (HISTORY_LEN as u64, 7, 70)
        );
    }
}
