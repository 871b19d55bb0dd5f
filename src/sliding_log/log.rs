//! The sliding log's decision logic, shared by the lock-free ring and the locking
//! twin: ticket arithmetic, the entry encoding, and the pure decision over the
//! entries a request would replace.

use std::collections::BinaryHeap;

use crate::error::Denied;
use crate::limiter::Snapshot;

/// Bit 63 of a head word: the ring is sealed (it is being replaced by a
/// reconfiguration) and admits nothing more. Ticket words stay below it.
pub(crate) const SEALED: u64 = 1 << 63;

/// The entry word of a slot nobody has written: lap −1, stamp 0. Zero, so a fresh
/// ring is zeroed memory.
pub(crate) const EMPTY: u64 = 0;

/// The lap bit an entry of lap `lap` carries: 1 for even laps, 0 for odd ones,
/// so that the never-written lap −1 has bit 0 and an empty slot is the word 0.
#[inline]
pub(crate) fn lap_bit(lap: u64) -> u64 {
    (lap & 1) ^ 1
}

/// The entry word for a permit of lap `lap` stamped at `stamp` (at most 2^62, so
/// the word fits).
#[inline]
pub(crate) fn entry_word(stamp: u64, lap: u64) -> u64 {
    (stamp << 1) | lap_bit(lap)
}

/// A reader saw the head move: the decision must be made again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Moved;

/// What a reader found in the slot that should hold a given ticket's entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Entry {
    /// The ticket's entry, stamped at this time.
    Stamp(u64),
    /// The ticket is claimed but its stamp is not stored yet (lock-free ring only).
    Pending,
    /// The head moved on since the reader loaded it: the decision is moot
    /// (lock-free ring only).
    Moved,
}

/// Read access to a ring's entries, as the decision sees them.
pub(crate) trait Entries {
    /// The entry of ticket `(lap, index)`: that ticket is below the head the
    /// decision was made on, so it has been claimed.
    fn read(&self, index: usize, lap: u64) -> Entry;
}

/// A request as a ring's rules see it: `n` permits at `now`, under `rules`
/// (`(count, window_ns)` pairs, every one of which must admit).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Asked<'r> {
    pub(crate) now: u64,
    pub(crate) n: u32,
    pub(crate) rules: &'r [(u32, u64)],
}

/// What a decision read of the entries its tickets compare with.
#[derive(Debug, Default, Clone, Copy)]
struct Survey {
    /// When the last of them leaves its rule's window (0 if all have).
    until: u64,
    /// The newest stamp among the entries the tickets replace.
    replaced: u64,
    /// The latest stamp read: what logging a denied attempt needs.
    latest: u64,
    /// Whether an entry was in flight.
    pending: bool,
}

/// What a request gets, before the head is moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Claim the tickets up to `next` and stamp them at `stamp`; `replaced`
    /// bounds the stamps of the entries they overwrite (0 if none), which a
    /// refund writes back.
    Admit {
        next: u64,
        stamp: u64,
        replaced: u64,
    },
    /// Denied; with `record`, the attempt is still logged (counting denied
    /// attempts): claim the tickets up to `next` and stamp them at `stamp`.
    Deny {
        retry_ns: u64,
        record: Option<(u64, u64)>,
    },
    /// The head moved under the reader: load it again and decide again.
    Moved,
}

/// A sliding log's shape: `capacity` permits per `window` ns, and the ticket
/// layout of its ring.
///
/// A ticket word is `(lap << shift) | index`: `index < capacity` is the slot,
/// `lap` how many times the ring has wrapped before it. Ticket `(lap, index)` is
/// the `(lap · capacity + index)`-th permit the ring has logged, and replaces the
/// entry of ticket `(lap − 1, index)`, logged `capacity` permits earlier.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Geometry {
    capacity: u32,
    window: u64,
    /// `capacity.next_power_of_two() == 1 << shift` (at most 32).
    shift: u32,
    /// Laps `0 ..= max_lap` keep a ticket word below [`SEALED`].
    max_lap: u64,
    count_denied: bool,
}

impl Geometry {
    /// `1 <= capacity <= window <= 2^62`, as [`Rate::validate`] ensures: a
    /// stamp is at most 2^62 and a stamp plus the window at most 2^63, so no
    /// sum here overflows.
    ///
    /// [`Rate::validate`]: crate::rate::Rate
    pub(crate) fn from_parts(capacity: u32, window: u64, count_denied: bool) -> Self {
        // In u64: the next power of two of a capacity above 2^31 is 2^32.
        let shift = u64::from(capacity).next_power_of_two().trailing_zeros();
        Geometry {
            capacity,
            window,
            shift,
            max_lap: (SEALED >> shift) - 1,
            count_denied,
        }
    }

    /// The geometry of one stripe's ring: `capacity` (at least 1, at most this
    /// geometry's) of the permits, the same window and mode.
    pub(crate) fn with_capacity(&self, capacity: u32) -> Self {
        Geometry::from_parts(capacity, self.window, self.count_denied)
    }

    pub(crate) fn with_count_denied(mut self, on: bool) -> Self {
        self.count_denied = on;
        self
    }

    pub(crate) fn capacity(&self) -> u32 {
        self.capacity
    }

    pub(crate) fn window(&self) -> u64 {
        self.window
    }

    pub(crate) fn count_denied(&self) -> bool {
        self.count_denied
    }

    #[inline]
    pub(crate) fn index(&self, ticket: u64) -> usize {
        (ticket & ((1 << self.shift) - 1)) as usize
    }

    #[inline]
    pub(crate) fn lap(&self, ticket: u64) -> u64 {
        (ticket & !SEALED) >> self.shift
    }

    #[inline]
    fn ticket(&self, lap: u64, index: usize) -> u64 {
        (lap << self.shift) | index as u64
    }

    /// The ticket `n <= capacity` permits after `ticket`, or `None` once the laps
    /// run out (after 2^63 / 2^shift laps: more than 2^62 permits, which at one
    /// permit per nanosecond at most is the limiter's whole 2^62 ns lifetime).
    #[inline]
    pub(crate) fn advance(&self, ticket: u64, n: u32) -> Option<u64> {
        let index = self.index(ticket) + n as usize;
        if index < self.capacity as usize {
            Some(ticket + u64::from(n))
        } else {
            let lap = self.lap(ticket) + 1;
            (lap <= self.max_lap).then(|| self.ticket(lap, index - self.capacity as usize))
        }
    }

    /// The ticket logged just before `ticket`, if any.
    #[inline]
    fn previous(&self, ticket: u64) -> Option<u64> {
        let (lap, index) = (self.lap(ticket), self.index(ticket));
        if index > 0 {
            Some(ticket - 1)
        } else if lap > 0 {
            Some(self.ticket(lap - 1, self.capacity as usize - 1))
        } else {
            None
        }
    }

    /// How many tickets lie below `head` in the ring: all claimed, at most
    /// the capacity.
    #[inline]
    pub(crate) fn logged(&self, head: u64) -> u32 {
        if self.lap(head) == 0 {
            self.index(head) as u32
        } else {
            self.capacity
        }
    }

    /// The `(lap, index)` of the last `count` tickets below `head` (`count <=
    /// logged(head)`), oldest first.
    #[inline]
    pub(crate) fn before(&self, head: u64, count: u32) -> impl Iterator<Item = (u64, usize)> {
        let first = self
            .behind(self.lap(head), self.index(head), count)
            .map_or(0, |(lap, index)| self.ticket(lap, index));
        self.tickets(first, count)
    }

    /// The `(lap, index)` of `count` tickets from `first` on, in order.
    #[inline]
    pub(crate) fn tickets(&self, first: u64, count: u32) -> impl Iterator<Item = (u64, usize)> {
        let capacity = self.capacity as usize;
        let (mut lap, mut index) = (self.lap(first), self.index(first));
        (0..count).map(move |_| {
            let at = (lap, index);
            index += 1;
            if index == capacity {
                index = 0;
                lap += 1;
            }
            at
        })
    }

    /// The latest stamp among the entries that tickets `first ..` (`count` of them)
    /// would replace (`None` if all are unwritten: the first lap), and whether one
    /// of them is still pending; `Err` if one shows the head moved.
    #[inline]
    fn replaced<E: Entries>(
        &self,
        entries: &E,
        first: u64,
        count: u32,
    ) -> Result<(Option<u64>, bool), Moved> {
        let mut latest = None;
        let mut pending = false;
        for (lap, index) in self.tickets(first, count) {
            if lap == 0 {
                // Nothing was logged `capacity` permits before the first lap.
                continue;
            }
            match entries.read(index, lap - 1) {
                Entry::Stamp(stamp) => latest = latest.max(Some(stamp)),
                Entry::Pending => pending = true,
                Entry::Moved => return Err(Moved),
            }
        }
        Ok((latest, pending))
    }

    /// When the entry that the `k`-th ticket from `head` (`k < capacity`) would
    /// replace leaves the window: 0 if nothing was logged there yet, `now +
    /// window` if it is in flight (stamped at about now).
    #[inline]
    pub(crate) fn replaced_free_at<E: Entries>(
        &self,
        entries: &E,
        head: u64,
        k: u32,
        now: u64,
    ) -> Result<u64, Moved> {
        let Some(ticket) = self.advance(head, k) else {
            // Out of laps: the end of the limiter's time range.
            return Ok(now + self.window);
        };
        let (lap, index) = (self.lap(ticket), self.index(ticket));
        if lap == 0 {
            return Ok(0);
        }
        match entries.read(index, lap - 1) {
            Entry::Stamp(stamp) => Ok(stamp + self.window),
            Entry::Pending => Ok(now + self.window),
            Entry::Moved => Err(Moved),
        }
    }

    /// The stamp of the ticket just before `head`, or 0: only a floor for new
    /// stamps (it keeps a single thread's log monotone when its clock steps
    /// back), which the guarantee does not need, so an entry in flight is skipped.
    #[inline]
    fn newest<E: Entries>(&self, entries: &E, head: u64) -> u64 {
        self.previous(head)
            .and_then(|t| match entries.read(self.index(t), self.lap(t)) {
                Entry::Stamp(stamp) => Some(stamp),
                _ => None,
            })
            .unwrap_or(0)
    }

    /// The decision for `n` permits (`1 <= n <= capacity`) at `now`, on a ring
    /// whose head is `head`: admit iff every entry the request's tickets replace —
    /// the entries logged `capacity` permits before each of them — left the window,
    /// i.e. was stamped at or before `now − window`.
    ///
    /// The admitted permits are stamped `max(now, newest stamp)`: a reading older
    /// than the log's newest entry (a stale or backwards clock) is checked as it
    /// is, which can only deny more, but never moves the log back in time.
    #[inline]
    pub(crate) fn decide<E: Entries>(&self, entries: &E, head: u64, now: u64, n: u32) -> Verdict {
        let Some(next) = self.advance(head, n) else {
            // Out of laps: the end of the limiter's time range, where time stands still.
            return Verdict::Deny {
                retry_ns: self.window,
                record: None,
            };
        };
        let Ok((latest, pending)) = self.replaced(entries, head, n) else {
            return Verdict::Moved;
        };
        let free_at = latest.map_or(0, |s| s + self.window);
        if pending {
            // A claimed entry whose stamp is still on its way was stamped at about
            // now (its writer claimed it just before this reader loaded the head),
            // so the request is denied as if it were stamped `now`. Its tickets
            // cannot be claimed even to log a denied attempt: the pending store
            // would land on top of the later ticket's entry.
            return Verdict::Deny {
                retry_ns: free_at.max(now + self.window) - now,
                record: None,
            };
        }
        if free_at <= now {
            return Verdict::Admit {
                next,
                stamp: now.max(self.newest(entries, head)),
                replaced: latest.unwrap_or(0),
            };
        }
        let retry_ns = free_at - now;
        if !self.count_denied {
            return Verdict::Deny {
                retry_ns,
                record: None,
            };
        }
        // Counting denied attempts: the attempt is logged like an admission, at
        // a stamp no older than the entries it replaces, so each slot's stamps
        // still only grow (the guarantee needs that). Its retry-after is for the
        // same request made after this one was logged.
        let stamp = now.max(self.newest(entries, head)).max(latest.unwrap_or(0));
        let mut until = free_at;
        for (lap, index) in self.tickets(next, n) {
            if lap == 0 {
                continue;
            }
            let replaced = self.ticket(lap - 1, index);
            let at = if replaced >= head {
                stamp
            } else {
                match entries.read(index, lap - 1) {
                    Entry::Stamp(s) => s,
                    Entry::Moved => return Verdict::Moved,
                    Entry::Pending => now,
                }
            };
            until = until.max(at + self.window);
        }
        Verdict::Deny {
            retry_ns: until - now,
            record: Some((next, stamp)),
        }
    }

    /// The ticket `back` permits before ticket `(lap, index)` (`back <=
    /// capacity`), as `(lap, index)`; `None` before the first ticket.
    #[inline]
    fn behind(&self, lap: u64, index: usize, back: u32) -> Option<(u64, usize)> {
        let back = back as usize;
        if index >= back {
            Some((lap, index - back))
        } else if lap > 0 {
            Some((lap - 1, index + self.capacity as usize - back))
        } else {
            None
        }
    }

    /// The decision for `n` permits at `now` on a ring that holds several
    /// rules at once, each `(count, window)` with `n <= count`: admit iff,
    /// for every rule and every ticket `k` the request would take, the entry
    /// of ticket `k − count` has left the rule's window. A rule whose count
    /// exceeds the ring's capacity reads the entry `capacity` back instead —
    /// a newer one, which leaves no earlier: stricter, never looser.
    ///
    /// Why each rule holds: the tickets `k, k + count, k + 2·count, …` form a
    /// chain in which every admission comes a full window after its
    /// predecessor's stamp, and a stamp is never before its admission's
    /// reading; so a window of the rule's length holds at most one admission
    /// per chain, and there are `count` chains. Nothing here needs stamps to
    /// grow along the tickets (stale readings from other threads may break
    /// that): only each chain's order, which the tickets give. With one rule
    /// whose count is the capacity this is [`decide`](Self::decide)'s rule,
    /// where the chains are the slots.
    ///
    /// Every entry read is of a ticket below `head` (`n <= count`), so it was
    /// claimed: a pending one counts as stamped now, which denies, and the
    /// admitted permits are stamped `max(now, newest stamp)` as in `decide`.
    /// `replaced` is the latest stamp among the entries the request's tickets
    /// overwrite (`capacity` back): an upper bound on each, which a refund
    /// writes back.
    ///
    /// Counting denied attempts, a denial is logged like an admission (unless
    /// an entry it read is in flight, as in `decide`), stamped no earlier than
    /// every entry a rule compared it with: along every rule's chains stamps
    /// still only grow, which is what the chain argument needs of an entry an
    /// admission is compared with.
    ///
    /// Every stamp written is at least `floor`: a ring that inherited bounds
    /// on earlier permits passes the newest of them, so that no permit
    /// logged on it is stamped before one it inherited, even when the entry
    /// before the head is still in flight and the reading is stale (the
    /// inheritance argument of the direct log needs it; see
    /// `docs/sliding_log.md`).
    #[inline]
    pub(crate) fn decide_rules<E: Entries>(
        &self,
        entries: &E,
        head: u64,
        asked: Asked<'_>,
        floor: u64,
    ) -> Verdict {
        let Asked { now, n, .. } = asked;
        let Some(next) = self.advance(head, n) else {
            // Out of laps: the end of the limiter's time range.
            return Verdict::Deny {
                retry_ns: self.window,
                record: None,
            };
        };
        let Some(survey) = self.survey(entries, head, asked) else {
            return Verdict::Moved;
        };
        let newest = self.newest(entries, head).max(floor);
        if survey.until <= now {
            return Verdict::Admit {
                next,
                stamp: now.max(newest),
                replaced: survey.replaced,
            };
        }
        if !self.count_denied || survey.pending {
            return Verdict::Deny {
                retry_ns: survey.until - now,
                record: None,
            };
        }
        let stamp = now.max(newest).max(survey.latest);
        let Some(until) = self.logged_until(entries, head, next, asked, stamp) else {
            return Verdict::Moved;
        };
        Verdict::Deny {
            retry_ns: until.max(survey.until) - now,
            record: Some((next, stamp)),
        }
    }

    /// What the entries each rule compares a request's tickets with say:
    /// when the last of them leaves its window, and what admitting or
    /// logging needs of them. `None` if an entry has moved to a new ring.
    #[inline]
    fn survey<E: Entries>(&self, entries: &E, head: u64, asked: Asked<'_>) -> Option<Survey> {
        let Asked { now, n, rules } = asked;
        let mut survey = Survey::default();
        for &(count, window) in rules {
            let back = count.min(self.capacity);
            for (lap, index) in self.tickets(head, n) {
                let Some((lap, index)) = self.behind(lap, index, back) else {
                    continue;
                };
                let free_at = match entries.read(index, lap) {
                    Entry::Stamp(stamp) => {
                        if back == self.capacity {
                            survey.replaced = survey.replaced.max(stamp);
                        }
                        survey.latest = survey.latest.max(stamp);
                        stamp + window
                    }
                    // Claimed just before our head load: stamped at about now.
                    Entry::Pending => {
                        survey.pending = true;
                        now + window
                    }
                    Entry::Moved => return None,
                };
                if free_at > now {
                    survey.until = survey.until.max(free_at);
                }
            }
        }
        Some(survey)
    }

    /// A logged denial's wait: its retry-after is for the same request made
    /// after it, whose tickets (from `next`) compare with the entries
    /// `count` back from theirs — ours, stamped `stamp`, where those fall on
    /// the tickets just logged. `None` if an entry has moved to a new ring.
    #[inline]
    fn logged_until<E: Entries>(
        &self,
        entries: &E,
        head: u64,
        next: u64,
        asked: Asked<'_>,
        stamp: u64,
    ) -> Option<u64> {
        let Asked { now, n, rules } = asked;
        let mut until = 0;
        for &(count, window) in rules {
            let back = count.min(self.capacity);
            for (lap, index) in self.tickets(next, n) {
                let Some((lap, index)) = self.behind(lap, index, back) else {
                    continue;
                };
                let at = if self.ticket(lap, index) >= head {
                    stamp
                } else {
                    match entries.read(index, lap) {
                        Entry::Stamp(s) => s,
                        Entry::Pending => now,
                        Entry::Moved => return None,
                    }
                };
                until = until.max(at + window);
            }
        }
        Some(until)
    }

    /// How many permits a rule `(count, window)` has free at `now` on a ring
    /// whose head is `head`: the largest `m <= count` such that the entries
    /// `count` back from the next `m` tickets have all left the window, by
    /// binary search (exact when stamps grow along the tickets, as they do
    /// single-threaded; advisory under concurrency, entries in flight counting
    /// as stamped now).
    pub(crate) fn rule_available<E: Entries>(
        &self,
        entries: &E,
        head: u64,
        now: u64,
        (count, window): (u32, u64),
    ) -> u32 {
        let back = count.min(self.capacity);
        // Is the entry `back` before the ticket `j` after the head free?
        // `j < count`, so that entry is below the head.
        let free = |j: u32| -> bool {
            let Some(ticket) = self.advance(head, j) else {
                return false;
            };
            match self.behind(self.lap(ticket), self.index(ticket), back) {
                None => true,
                Some((lap, index)) => match entries.read(index, lap) {
                    Entry::Stamp(stamp) => stamp + window <= now,
                    Entry::Pending | Entry::Moved => false,
                },
            }
        };
        let (mut lo, mut hi) = (0, count.min(self.capacity));
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if free(mid) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    }

    /// The stamp of the newest entry (the ticket before `head`), `None` if
    /// nothing was logged; an entry in flight counts as stamped `now`.
    pub(crate) fn newest_stamp<E: Entries>(&self, entries: &E, head: u64, now: u64) -> Option<u64> {
        let ticket = self.previous(head)?;
        Some(match entries.read(self.index(ticket), self.lap(ticket)) {
            Entry::Stamp(stamp) => stamp,
            Entry::Pending | Entry::Moved => now,
        })
    }

    /// What a request could get at `now`: `available` is the longest run of
    /// tickets from `head` on whose replaced entries all left the window;
    /// `until_full` is when the newest entry in the ring leaves it.
    pub(crate) fn snapshot<E: Entries>(&self, entries: &E, head: u64, now: u64) -> Snapshot {
        let mut available = 0;
        let mut blocked = false;
        let mut full_at = 0;
        for (lap, index) in self.tickets(head, self.capacity) {
            let free_at = if lap == 0 {
                0
            } else {
                match entries.read(index, lap - 1) {
                    Entry::Stamp(stamp) => stamp + self.window,
                    // In flight: stamped at about now.
                    Entry::Pending | Entry::Moved => now + self.window,
                }
            };
            full_at = full_at.max(free_at);
            if free_at > now {
                blocked = true;
            } else if !blocked {
                available += 1;
            }
        }
        Snapshot::from_ns(available, self.capacity, full_at.saturating_sub(now))
    }

    /// What a ring of several rules reports at `now` on the head `head`: the
    /// rule that binds first ([`Snapshot::tightest`]: the fewest permits
    /// left, on a tie the longer wait, then the earlier rule), with its
    /// count and the time until the newest entry leaves its window.
    pub(crate) fn snapshot_rules<E: Entries>(
        &self,
        entries: &E,
        head: u64,
        now: u64,
        rules: &[(u32, u64)],
    ) -> Snapshot {
        let newest = self.newest_stamp(entries, head, now);
        let mut binding: Option<Snapshot> = None;
        for &(count, window) in rules {
            // At most `count`: the least of them is at most the capacity.
            let available = self.rule_available(entries, head, now, (count, window));
            let until = newest.map_or(0, |s| (s + window).saturating_sub(now));
            let this = Snapshot::from_ns(available, count, until);
            binding = Some(binding.map_or(this, |first| first.tightest(this)));
        }
        // Some: a set of rules has at least one.
        binding.unwrap_or(Snapshot::from_ns(0, 0, 0))
    }

    /// What a ring of `capacity` slots inherits from this ring, sealed at `head`,
    /// which itself remembers `dropped` earlier permits stamped at most `floor`.
    ///
    /// Every permit this ring knows of gets an upper bound on its stamp. The ring
    /// holds the last entry of each slot; the entries it replaced are gone, but
    /// each was stamped at least a window before its replacer (an admission needs
    /// that), so the `k`-th before an entry stamped `s` was stamped at most
    /// `s − k·window`. A logged denial (counting mode) is only no earlier than
    /// what it replaced, so there the bound is `s` itself. Permits dropped by
    /// earlier reconfigurations are bounded by `floor`. The new ring takes the
    /// `capacity` largest bounds as its entries, and remembers how many bounds it
    /// left out and the largest of them.
    pub(crate) fn inherit<E: Entries>(
        &self,
        entries: &E,
        head: u64,
        (floor, dropped): (u64, u64),
        capacity: u32,
    ) -> Inheritance {
        let step = if self.count_denied { 0 } else { self.window };
        // Candidates, one per source: (bound, bounds left after it, step).
        let mut heap = BinaryHeap::with_capacity(self.capacity as usize + 1);
        if dropped > 0 {
            heap.push((floor, dropped - 1, 0));
        }
        for (lap, index) in self.tickets(head, self.capacity) {
            if lap == 0 {
                continue;
            }
            if let Entry::Stamp(stamp) = entries.read(index, lap - 1) {
                // Laps `0 .. lap` of this slot: `lap − 1` entries before this one.
                heap.push((stamp, lap - 1, step));
            }
        }
        let mut stamps = Vec::with_capacity(capacity as usize);
        let mut left_out = (0, 0);
        while let Some((bound, rest, step)) = heap.pop() {
            if stamps.len() < capacity as usize {
                stamps.push(bound);
                if rest > 0 {
                    heap.push((bound.saturating_sub(step), rest - 1, step));
                }
            } else {
                // The largest bound left out, and how many were.
                let count = heap.iter().fold(1 + rest, |sum: u64, &(_, rest, _)| {
                    sum.saturating_add(1 + rest)
                });
                left_out = (bound, count);
                break;
            }
        }
        stamps.reverse();
        Inheritance {
            stamps,
            floor: left_out.0,
            dropped: left_out.1,
        }
    }
}

/// What a new ring starts from: entries, oldest first, and a bound on the
/// permits that did not fit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Inheritance {
    /// Upper bounds on the stamps of the most recent permits, oldest first.
    pub(crate) stamps: Vec<u64>,
    /// No permit left out was stamped later than this.
    pub(crate) floor: u64,
    /// How many permits were left out (saturating).
    pub(crate) dropped: u64,
}

impl Inheritance {
    /// Nothing inherited: a fresh ring.
    pub(crate) fn none() -> Self {
        Inheritance {
            stamps: Vec::new(),
            floor: 0,
            dropped: 0,
        }
    }

    /// One inheritance for a log of `capacity` permits from those of the old
    /// log's rings (each computed for `capacity`): the `capacity` largest bounds
    /// of all, and the rest counted as dropped under the largest of them.
    pub(crate) fn merge(parts: Vec<Inheritance>, capacity: u32) -> Self {
        let mut stamps: Vec<u64> = Vec::new();
        let (mut floor, mut dropped) = (0u64, 0u64);
        for part in parts {
            stamps.extend_from_slice(&part.stamps);
            if part.dropped > 0 {
                floor = floor.max(part.floor);
                dropped = dropped.saturating_add(part.dropped);
            }
        }
        stamps.sort_unstable();
        let left_out = stamps.len().saturating_sub(capacity as usize);
        if left_out > 0 {
            floor = floor.max(stamps[left_out - 1]);
            dropped = dropped.saturating_add(left_out as u64);
        }
        stamps.drain(..left_out);
        Inheritance {
            stamps,
            floor,
            dropped,
        }
    }

    /// Deals the stamps (oldest first) round-robin over rings of the given
    /// capacities, each ring's share staying oldest first; the dropped permits'
    /// bound goes to the first ring. The stamps must fit (at most the capacities'
    /// sum), and then every ring is full whenever any permit was dropped.
    pub(crate) fn deal(self, capacities: &[u32]) -> Vec<Inheritance> {
        let mut parts: Vec<Inheritance> = capacities.iter().map(|_| Inheritance::none()).collect();
        parts[0].floor = self.floor;
        parts[0].dropped = self.dropped;
        let mut ring = 0;
        for stamp in self.stamps {
            while parts[ring].stamps.len() == capacities[ring] as usize {
                ring = (ring + 1) % capacities.len();
            }
            parts[ring].stamps.push(stamp);
            ring = (ring + 1) % capacities.len();
        }
        parts
    }
}

/// Turns a verdict's retry time into the denial the caller sees.
#[inline]
pub(crate) fn retry_after(retry_ns: u64) -> Denied {
    Denied::RetryAfter(std::time::Duration::from_nanos(retry_ns))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Plain words, as the locking twin keeps them.
    struct Words(Vec<u64>);

    impl Entries for Words {
        fn read(&self, index: usize, lap: u64) -> Entry {
            let word = self.0[index];
            if word & 1 == lap_bit(lap) {
                Entry::Stamp(word >> 1)
            } else {
                Entry::Pending
            }
        }
    }

    #[test]
    fn tickets_wrap_at_the_largest_capacity() {
        let g = Geometry::from_parts(u32::MAX, 10_000_000_000, false);
        let last = u64::from(u32::MAX) - 1;
        assert_eq!((g.lap(last), g.index(last)), (0, u32::MAX as usize - 1));
        let next = g.advance(last, 1).unwrap();
        assert_eq!((g.lap(next), g.index(next)), (1, 0));
        let far = g.advance(last, u32::MAX).unwrap();
        assert_eq!((g.lap(far), g.index(far)), (1, u32::MAX as usize - 1));
        assert!(far < SEALED);
    }

    #[test]
    fn laps_run_out_below_the_seal_bit() {
        let g = Geometry::from_parts(4, 10, false);
        let last_lap = g.ticket(g.max_lap, 3);
        assert!(last_lap < SEALED);
        assert_eq!(g.advance(last_lap, 1), None);
        // And the decision for it denies rather than wraps into the seal bit.
        let words = Words(vec![entry_word(0, g.max_lap - 1); 4]);
        assert!(matches!(
            g.decide(&words, last_lap, 1_000, 1),
            Verdict::Deny { record: None, .. }
        ));
    }

    #[test]
    fn inheritance_bounds_every_permit() {
        // 2 permits per 10 ns, head at lap 2, index 1: slot 0 holds lap 2 (stamped
        // 20, after laps 0 and 1), slot 1 holds lap 1 (stamped 15, after lap 0).
        let g = Geometry::from_parts(2, 10, false);
        let words = Words(vec![entry_word(20, 2), entry_word(15, 1)]);
        let head = g.ticket(2, 1);
        // All five permits fit in 8 slots: bounds 20, 10, 0 and 15, 5.
        let all = g.inherit(&words, head, (0, 0), 8);
        assert_eq!(all.stamps, vec![0, 5, 10, 15, 20]);
        assert_eq!((all.floor, all.dropped), (0, 0));
        // Two fit: the two largest bounds; three left out, the largest of them 10.
        let two = g.inherit(&words, head, (0, 0), 2);
        assert_eq!(two.stamps, vec![15, 20]);
        assert_eq!((two.floor, two.dropped), (10, 3));
        // Earlier drops (three, at most 12) compete with the ring's own bounds.
        let with_drops = g.inherit(&words, head, (12, 3), 3);
        assert_eq!(with_drops.stamps, vec![12, 15, 20]);
        assert_eq!((with_drops.floor, with_drops.dropped), (12, 5));
        // Counting mode: a slot's earlier entries are bounded by its last stamp.
        let counting = g.with_count_denied(true).inherit(&words, head, (0, 0), 3);
        assert_eq!(counting.stamps, vec![20, 20, 20]);
        assert_eq!((counting.floor, counting.dropped), (15, 2));
    }
}
