//! The lock-free core of [`SlidingWindow`](super::SlidingWindow): a pool that
//! leases each sub-window's budget, a ring of finished sub-windows' charges, and
//! cache-padded stripes that hold the leases. See the module docs for the state
//! table and the argument; the comments here say why each step is safe.

use crossbeam_utils::CachePadded;

use super::ring::WindowShape;
use crate::cell::{self, Alone, Loss, Opening};
use crate::error::Denied;
use crate::limiter::Snapshot;
use crate::stripe::{self, Refused, Stripes};
use crate::sync::{AtomicU64, Ordering};

/// The striped, leased sliding window state.
#[derive(Debug)]
pub(crate) struct Striped {
    geo: WindowShape,
    /// `(index p, charged c)`: the newest sub-window opened and the permits leased
    /// out of it so far. Only ever changed by CAS, so every modification is a
    /// read-modify-write (which keeps release sequences unbroken).
    pool: CachePadded<AtomicU64>,
    /// Slot `i & history_mask` holds `(i, charge of sub-window i)` once `i` is
    /// closed: at least what `i` admitted, exactly that once its unspent leases
    /// are back. The ring has `subs` slots rounded up to a power of two, so a
    /// slot is found with a mask rather than a division; any ring of at least
    /// `subs` slots works: the `subs − 1` sub-windows before `p` and `p` itself
    /// all have different slots, and the one `p` takes last held `p − len`,
    /// which is out of every window that still matters.
    history: Box<[AtomicU64]>,
    history_mask: u64,
    /// `(epoch e, lease l)`: `l` permits charged to sub-window `e`, not yet spent.
    stripes: Stripes,
}

/// What steps 4 and 5 of the slow path came to (`Striped::gather`): the
/// permits gathered, `j`'s charge and the window's charges when last summed.
struct Gathered {
    gathered: u32,
    charged: u32,
    sum: u64,
}

/// One lease from the pool (`Striped::lease`): `want` permits taken (0: no
/// room), `j`'s charge and the window's charges after it.
#[derive(Default, Clone, Copy)]
struct Leased {
    want: u32,
    charged: u32,
    sum: u64,
}

/// Where a stale lease found in a stripe goes.
enum Stale {
    /// Its sub-window still counts in some future window: give it back there.
    Return { epoch: u64, lease: u32 },
    /// Nothing, or nothing that matters any more.
    Nothing,
}

impl Striped {
    pub(crate) fn new(geo: WindowShape, stripes: usize) -> Self {
        // `subs` is a u32, so the rounded length fits a usize on 64-bit targets
        // (the only ones with the 64-bit atomics this needs).
        let ring = (geo.subs() as usize).next_power_of_two();
        Striped {
            geo,
            // Sub-window 0, nothing charged; every slot and stripe likewise says
            // "sub-window 0, zero", which is true.
            pool: CachePadded::new(AtomicU64::new(0)),
            history: (0..ring).map(|_| AtomicU64::new(0)).collect(),
            history_mask: ring as u64 - 1,
            stripes: Stripes::new(stripes, 0),
        }
    }

    pub(crate) fn shape(&self) -> &WindowShape {
        &self.geo
    }

    pub(crate) fn stripe_count(&self) -> usize {
        self.stripes.len()
    }

    /// Heap bytes owned by the limiter (history ring and stripes).
    pub(crate) fn heap_bytes(&self) -> usize {
        std::mem::size_of_val::<[AtomicU64]>(&self.history) + self.stripes.heap_bytes()
    }

    /// Admits `n` (already checked to be in `1..=limit`) at reading `now`.
    ///
    /// The fast path touches only the calling thread's stripe: when it holds a
    /// lease for the reading's sub-window with at least `n` left, one CAS spends
    /// it. No division: the reading is compared with the lease's sub-window.
    #[inline]
    pub(crate) fn try_acquire_n(&self, now: u64, n: u32) -> Result<(), Denied> {
        let own = self.stripes.own();
        // A lease spent is a count decremented, ordered with every other
        // change to it by the stripe's modification order (see `Stripes`).
        let spent = self.stripes.spend(own, |word| {
            let (epoch, lease) = self.geo.unpack(word);
            // `now - start` wraps to a huge value when `now` is before the start.
            if now.wrapping_sub(self.geo.start(epoch)) >= self.geo.sub() || lease < n {
                return Err(());
            }
            // The count is the low bits, so subtracting `n <= lease` keeps the
            // epoch.
            Ok(word - u64::from(n))
        });
        match spent {
            Ok(_) => Ok(()),
            Err(()) => self.acquire_slow(now, n, own),
        }
    }

    /// Everything but a spend from a sufficient lease: opening a sub-window,
    /// returning stale leases, leasing from the pool, stealing from other
    /// stripes, and denying.
    #[inline(never)]
    fn acquire_slow(&self, now: u64, n: u32, own: usize) -> Result<(), Denied> {
        let j = self.geo.index(now);

        // 1. The thread's own stripe: take its current lease whole (it is charged
        //    to `j`, so it is ours to spend), or note a stale one.
        let gathered = match self.take_own(own, j, n) {
            Ok(took) if took == n => return Ok(()),
            Ok(took) => took,
            // Someone leased for a later sub-window, so the pool is past `j`.
            Err(Some(epoch)) => return Err(self.deny_stale(now, n, epoch)),
            Err(None) => 0,
        };

        // 2. Bring the pool to `j`, opening it if this reading is the first in it.
        let pool = self.open(j);
        let (p, _) = self.geo.unpack(pool);
        if p > j {
            self.put_back(own, j, gathered);
            return Err(self.deny_stale(now, n, p));
        }

        // 3. Our own stale lease, if any, goes back before we look at the budget:
        //    single-threaded, that makes every charge exact before it is summed.
        //    The pool is at `j` (acquired in `open`), so every older sub-window's
        //    charge is final and visible.
        self.reclaim(own, j);

        // 4. Lease from the pool; 5. steal from other stripes if it runs short.
        let Gathered {
            gathered,
            charged,
            sum,
        } = self.gather(now, n, own, j, pool, gathered)?;

        // 6. Spend, or deny; either way what is left of the gathered permits
        //    stays charged to `j` and goes into our stripe, where we or a stealer
        //    can spend it.
        if gathered >= n {
            self.put_back(own, j, gathered - n);
            return Ok(());
        }
        self.put_back(own, j, gathered);
        // What `j` has really used: everything charged, less what we hold unspent
        // (single-threaded, every unspent permit of `j` is now in our stripe).
        let used = charged.saturating_sub(gathered);
        let sum = sum.saturating_sub(u64::from(charged - used));
        Err(self
            .geo
            .retry_after_next(now, j, n, sum, |i| self.charge(i, j, used)))
    }

    /// Step 1 of the slow path, a decision on the own stripe's word: takes `n`
    /// from a lease for `j` that has them, else the whole lease. `Ok`: the
    /// permits taken (`n`: the request is served); `Err(Some(e))`: the stripe
    /// holds a lease for a later sub-window `e`; `Err(None)`: nothing for `j`.
    fn take_own(&self, own: usize, j: u64, n: u32) -> Result<u32, Option<u64>> {
        let mut took = 0;
        // A count taken out of the stripe, as in the fast path.
        let taken = self.stripes.update(own, |word| {
            let (epoch, lease) = self.geo.unpack(word);
            if epoch > j {
                return Err(Some(epoch));
            }
            if epoch < j || lease == 0 {
                return Err(None);
            }
            took = lease.min(n);
            Ok(if lease >= n {
                word - u64::from(n)
            } else {
                self.geo.pack(j, 0)
            })
        });
        taken.map(|_| took)
    }

    /// Steps 4 and 5 of the slow path: leases from the pool (at `j` when last
    /// read as `pool`) and, if it runs short, steals from other stripes; a
    /// steal scan that returns a stale lease raises the budget, so the pool is
    /// tried once more after it. `gathered`: permits already taken. The denial
    /// if the pool moved past `j` (what was gathered is put back).
    fn gather(
        &self,
        now: u64,
        n: u32,
        own: usize,
        j: u64,
        mut pool: u64,
        mut gathered: u32,
    ) -> Result<Gathered, Denied> {
        let mut lease = Leased::default();
        for round in 0..2 {
            lease = match self.lease(j, pool, n - gathered) {
                Ok(lease) => lease,
                Err(p) => {
                    // The pool only moves forward: someone opened a later
                    // sub-window while we gathered.
                    self.put_back(own, j, gathered);
                    return Err(self.deny_stale(now, n, p));
                }
            };
            gathered += lease.want;
            if gathered >= n {
                break;
            }
            let (stolen, returned) = self.steal(j, n - gathered, own);
            gathered += stolen;
            if gathered >= n || !returned || round == 1 {
                break;
            }
            // Relaxed: as the lease CAS's failure ordering (`lease`) — at `j`
            // the history is already visible, past `j` the value is only
            // checked. (The returns that raised the budget are this thread's
            // own.)
            pool = self.pool.load(Ordering::Relaxed);
        }
        Ok(Gathered {
            gathered,
            charged: lease.charged,
            sum: lease.sum,
        })
    }

    /// A lease of up to `need` from the pool, starting from `pool`, a value
    /// read with the pool at `j` or later: what was leased (`want`, 0 if the
    /// window has no room), with `j`'s charge and the window's charges once
    /// it was taken; `Err(p)` if the pool is at a later sub-window `p`.
    fn lease(&self, j: u64, pool: u64, need: u32) -> Result<Leased, u64> {
        let mut seen = Leased::default();
        // `Alone`, all `Relaxed`. Success: the lease is a count taken from
        // the pool, decided on the very value it replaces; what we read
        // before deciding (the history) was made visible by the Acquire in
        // `open` that gave us the pool at `j`. Failure: a fresh value still
        // at `j` needs no new visibility — the charges the next decision
        // reads are those of sub-windows before `j`, final and visible since
        // that same Acquire (later returns only lower them, and a stale,
        // higher charge can only deny); a value past `j` is not decided on
        // but sent to `deny_stale`, which acquires the pool itself.
        let leased = cell::update_from::<Alone, u64, Option<u64>>(
            &self.pool,
            pool,
            |pool| {
                let (p, c) = self.geo.unpack(pool);
                if p != j {
                    return Err(Some(p));
                }
                let sum = self.geo.window_sum(j, j, |i| self.charge(i, j, c));
                // At most `limit` when positive.
                let avail = u64::from(self.geo.limit()).saturating_sub(sum) as u32;
                let want = if avail >= need {
                    self.lease_size(avail, need)
                } else {
                    avail
                };
                seen = Leased {
                    want,
                    charged: c,
                    sum,
                };
                if want == 0 {
                    return Err(None);
                }
                // `c + want <= limit` (that is what `avail` means), so the
                // count stays in its bits.
                Ok(pool + u64::from(want))
            },
            |_, _| Loss::DecideAgain,
        );
        match leased {
            Ok(_) => Ok(Leased {
                want: seen.want,
                charged: seen.charged + seen.want,
                sum: seen.sum + u64::from(seen.want),
            }),
            Err(None) => Ok(seen),
            Err(Some(p)) => Err(p),
        }
    }

    /// Brings the pool to sub-window `j` if it is older, and returns the pool word
    /// as last read (Acquire): its index is `j` or later.
    fn open(&self, j: u64) -> u64 {
        // `Opening`: the load's and the failure's Acquire pair with the
        // Release of the CAS that opened the pool's sub-window (or any later
        // one): after it, every charge that CAS's thread published is
        // visible. Every change to the pool is an RMW, so the CAS heads a
        // release sequence that later leases do not break. Release on
        // success: whoever acquires the pool at `j` or later sees `p`'s
        // charge.
        let opened = cell::update::<Opening, u64, u64>(
            &self.pool,
            |pool| {
                let (p, _) = self.geo.unpack(pool);
                if p >= j {
                    return Err(pool);
                }
                // Publish `p`'s charge before leaving it. Anyone who failed
                // to open may have published an older (smaller) charge of
                // `p`, or will; the maximum keeps the final one, and a newer
                // sub-window's stamp beats both. Relaxed: the Release CAS
                // publishes it.
                self.history[self.slot(p)].fetch_max(pool, Ordering::Relaxed);
                Ok(self.geo.pack(j, 0))
            },
            |_, _| Loss::DecideAgain,
        );
        match opened {
            Ok(opened) => {
                self.sweep(j);
                opened
            }
            Err(pool) => pool,
        }
    }

    fn slot(&self, index: u64) -> usize {
        // Masked to below the ring's length, a usize.
        (index & self.history_mask) as usize
    }

    /// The charge of sub-window `i` as seen with the pool at `newest` charging
    /// `current` to itself: the pool's own count, or a finished sub-window's slot
    /// if it holds that sub-window (a sub-window never opened charged nothing).
    /// Callers acquired the pool at `newest`, so every finished charge is final.
    fn charge(&self, i: u64, newest: u64, current: u32) -> u32 {
        if i == newest {
            return current;
        }
        // Relaxed: visibility comes from the caller's Acquire of the pool.
        let (stamp, count) = self
            .geo
            .unpack(self.history[self.slot(i)].load(Ordering::Relaxed));
        if stamp == i { count } else { 0 }
    }

    /// How much to lease when the pool has `avail` and this request needs `need`:
    /// a share of what is left, so that every stripe can hold a lease while half
    /// the budget stays in the pool, shrinking as the pool runs low — never less
    /// than the request.
    fn lease_size(&self, avail: u32, need: u32) -> u32 {
        let share = (avail / (2 * self.stripes.len() as u32)).max(1);
        share.clamp(need, avail)
    }

    /// Takes stripe `k`'s lease if it is for a sub-window before `j` and gives
    /// it back to that sub-window's charge if the charge still counts. Either
    /// way the stale lease is emptied, so that a later reading from that old
    /// sub-window (a clock stepping back) cannot spend it: single-threaded, every
    /// reading older than the newest sub-window is then denied, as the twin
    /// denies it. The caller has acquired the pool at `j` or later.
    fn reclaim(&self, k: usize, j: u64) {
        let mut taken = 0;
        // The lease is a count, taken by CAS; see `give_back` for the history
        // side.
        let emptied = self.stripes.update(k, |word| {
            let (epoch, lease) = self.geo.unpack(word);
            if epoch >= j || lease == 0 {
                return Err(());
            }
            taken = word;
            Ok(self.geo.pack(epoch, 0))
        });
        if emptied.is_ok() {
            if let Stale::Return { epoch, lease } = self.stale(taken, j) {
                self.give_back(epoch, lease);
            }
        }
    }

    fn stale(&self, word: u64, j: u64) -> Stale {
        let (epoch, lease) = self.geo.unpack(word);
        if epoch < j && lease > 0 && epoch + u64::from(self.geo.subs()) > j {
            Stale::Return { epoch, lease }
        } else {
            Stale::Nothing
        }
    }

    /// Subtracts `lease` unspent permits from finished sub-window `epoch`'s charge.
    /// The caller took them out of a stripe by CAS, so they can never be spent.
    fn give_back(&self, epoch: u64, lease: u32) {
        // Refused: the slot has moved on, and `epoch` no longer counts anywhere.
        let _ = stripe::return_to(&self.history[self.slot(epoch)], self.returned(epoch, lease));
    }

    /// The decision of a return of `lease` permits to sub-window `epoch`'s
    /// history slot: its charge lowered, or a refusal if the slot holds
    /// another sub-window. Relaxed (`stripe::return_to`): a decrement is a
    /// count, checked by CAS against the slot's newest value. Callers that
    /// acquired the pool past `epoch` (all but `put_back`'s) read the final
    /// charge or a later value; one that did not may lower an older charge
    /// that the final `fetch_max` then overrides, which leaves the permits
    /// charged: safe, if less exact.
    fn returned(&self, epoch: u64, lease: u32) -> impl FnMut(u64) -> Result<u64, ()> + '_ {
        move |word| {
            let (stamp, count) = self.geo.unpack(word);
            if stamp != epoch {
                return Err(());
            }
            Ok(self.geo.pack(epoch, count.saturating_sub(lease)))
        }
    }

    /// Returns every stale lease that still counts, once per sub-window, by the
    /// thread that opened it: an idle thread's lease would otherwise stay charged
    /// for the rest of its window.
    fn sweep(&self, j: u64) {
        for k in 0..self.stripes.len() {
            self.reclaim(k, j);
        }
    }

    /// Takes up to `need` permits of sub-window `j` from the other stripes'
    /// leases, returning stale leases on the way. Returns what it took and whether
    /// it returned anything (which raises the pool's budget).
    fn steal(&self, j: u64, mut need: u32, own: usize) -> (u32, bool) {
        let mut stolen = 0;
        let mut returned = false;
        for k in 1..self.stripes.len() {
            if need == 0 {
                break;
            }
            let victim = own + k;
            let mut take = 0;
            // Leases are counts, taken by CAS; a refusal carries the word.
            let taken = self.stripes.update(victim, |word| {
                let (epoch, lease) = self.geo.unpack(word);
                if epoch != j || lease == 0 {
                    return Err(word);
                }
                take = lease.min(need);
                Ok(word - u64::from(take))
            });
            match taken {
                Ok(_) => {
                    stolen += take;
                    need -= take;
                }
                Err(word) => {
                    if let Stale::Return { .. } = self.stale(word, j) {
                        self.reclaim(victim, j);
                        returned = true;
                    }
                }
            }
        }
        (stolen, returned)
    }

    /// Puts `spare` unspent permits of sub-window `j` into stripe `own`, merging
    /// with a lease for `j`, replacing (and returning) a stale one. If the stripe
    /// already holds a later sub-window's lease (another thread on the same
    /// stripe moved on), `j` is finished and the permits go back to its charge.
    /// The caller has acquired the pool at `j`.
    fn put_back(&self, own: usize, j: u64, spare: u32) {
        if spare == 0 {
            return;
        }
        let kept = self.stripes.keep_or_return(
            own,
            |word| {
                let (epoch, _) = self.geo.unpack(word);
                if epoch == j {
                    // Both are charged to `j`, whose charge is at most `limit`.
                    Ok(word + u64::from(spare))
                } else if epoch < j {
                    Ok(self.geo.pack(j, spare))
                } else {
                    Err(Refused::Return)
                }
            },
            // `j` is finished (a lease for `epoch > j` exists): the permits
            // go back to its charge. No ordering is needed first: the return
            // is a CAS, which reads the slot's newest value, so it either
            // lowers the final charge or, if that charge has not landed yet,
            // lowers an older one that the final `fetch_max` then overrides —
            // the permits stay charged (unspent, never over-admitted), the
            // only cost of such a race.
            &self.history[self.slot(j)],
            self.returned(j, spare),
        );
        // A stale lease we replaced goes back (the caller acquired the pool
        // at `j`, past its sub-window).
        if let Ok(replaced) = kept {
            if let Stale::Return { epoch, lease } = self.stale(replaced, j) {
                self.give_back(epoch, lease);
            }
        }
    }

    /// The denial for a reading older than the newest sub-window: it can be
    /// admitted no earlier than that sub-window's start, and then only if the
    /// sub-window has room. Leases still on stripes count as unused: for the
    /// newest sub-window they are there to be spent or stolen, for older ones
    /// they go back when the next sub-window opens. (Rare, so it pays for the
    /// stripe scans that make the wait exact single-threaded.) `newer` is the
    /// sub-window after the reading's that the caller found opened.
    fn deny_stale(&self, now: u64, n: u32, newer: u64) -> Denied {
        // Acquire: the history is read on the strength of this value.
        let (p, c) = self.geo.unpack(self.pool.load(Ordering::Acquire));
        if p < newer {
            // `newer` came from a stripe's lease, whose word carries no
            // synchronization: this load may return a pool older than the one
            // that lease was taken from (coherence only forbids values older
            // than this thread's own reads of the pool). The request waits at
            // least until `newer` starts — never a zero retry-after (loom
            // `delayed_return_meets_a_recycled_slot` found one). Single-threaded
            // the pool is always at `newer` or later, and the wait exact.
            return Denied::RetryAfter(std::time::Duration::from_nanos(
                self.geo.start(newer).saturating_sub(now),
            ));
        }
        self.geo.retry_after(now, p, p, n, |i| {
            self.charge(i, p, c).saturating_sub(self.unspent(i))
        })
    }

    /// Permits of sub-window `i` sitting in stripes' leases.
    fn unspent(&self, i: u64) -> u32 {
        self.stripes
            .iter()
            // Relaxed: an estimate of counts; nothing is decided on it.
            .map(|s| self.geo.unpack(s.load(Ordering::Relaxed)))
            .filter(|&(epoch, _)| epoch == i)
            .fold(0u32, |sum, (_, lease)| sum.saturating_add(lease))
    }

    /// What a request could get at `now`, counting leases still on the stripes
    /// as unused (they are, until spent).
    pub(crate) fn snapshot(&self, now: u64) -> Snapshot {
        // Acquire: as in `open`.
        let (p, c) = self.geo.unpack(self.pool.load(Ordering::Acquire));
        self.geo.snapshot(now, p, |i| {
            self.charge(i, p, c).saturating_sub(self.unspent(i))
        })
    }
}
