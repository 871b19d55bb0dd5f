//! The sliding window as a keyed kind: per key, the direct window's pool
//! and history without stripes, decided with atomics only.
//!
//! The direct [`SlidingWindow`] leases each sub-window's budget to per-core
//! stripes (one 128-byte line each) so that many cores can share one limit.
//! One key's traffic is rarely contended, and a stripe per core per key
//! would cost kilobytes a key, so the keyed window keeps one pool word and a
//! history of the finished sub-windows' charges per key, and decides as the
//! twin does: the same [`WindowShape`] functions, so the same decisions,
//! retry-afters and snapshots as a [`LockingSlidingWindow`] built when the
//! keyed limiter was built (property tests in `tests/integration/keyed.rs`), and the same
//! bound: **at most `N` permits in any `S` consecutive aligned sub-windows**,
//! per key (at most `N` in any `(S − 1)/S` of the period, `2N` in any period).
//!
//! # State
//!
//! | where | field | meaning |
//! |---|---|---|
//! | pool (one 128-bit word) | `tag` | the keyed layer's tag: the configuration the key was last written under |
//! | | `sealed` | a carry-over is rewriting the key |
//! | | `newest` | the newest sub-window opened (by any decision, admitted or not — the twin's rule); readings in an older sub-window are denied |
//! | | `used` | what the `S − 1` sub-windows before `newest` had charged when it opened |
//! | | `count` | what `newest` has charged |
//! | history (behind an epoch-protected pointer; none until a sub-window with a charge is first left) | `tag` | the configuration whose shape its entries use |
//! | | `S` slots | sub-window `i`'s entry `(i, charge)` at `i mod S`, written before the pool leaves `i` |
//!
//! # Protocol
//!
//! | operation | reads | writes |
//! |---|---|---|
//! | admit (the reading's sub-window is `newest`) | the pool | the pool by CAS: `count + n`, if `used + count + n <= N` |
//! | deny | the pool; the history for the retry-after | nothing |
//! | open a later sub-window `j` (then admit or deny in it) | the pool, the history | `newest`'s entry into the history (`fetch_max`), then the pool by CAS (Release): `newest = j`, `used` = the charges of `j − S + 1 .. j − 1`, `count = 0` |
//! | refund, sub-window still `newest` | the pool | the pool by CAS: `count − n` |
//! | refund, finished sub-window still in the window | the pool, the history | its entry by CAS (`used` keeps the permits until the next opening, which reads the entry) |
//! | carry-over (a new configuration) | the pool, the history | seal the pool (CAS), a new history (CAS on the pointer), the carried pool (a store that unseals) |
//!
//! **Why the bound holds.** Every admission is a CAS on the pool that checks
//! `used + count + n <= N` for the window ending with `newest`, so it is
//! enough that `used` is never below what the `S − 1` sub-windows before
//! `newest` hold. An opener computes `used` from the pool it replaces (the
//! newest charge) and the history, whose entries were each written before
//! the pool left their sub-window and are published by the opener's Release
//! CAS to the Acquire load of every later decision; a history entry is
//! lowered only by a refund of permits it counted, and raised only by an
//! overtaken opener repeating an older count (`fetch_max`). The loom models
//! in `loom-tests/tests/keyed_window.rs` check the bound on recorded
//! decision times, with a known-bad opener that moves the pool before
//! writing the entry.
//!
//! **A carry-over never rewrites a history in place.** An opener can be
//! overtaken between reading the pool and writing its entry; if the entry
//! then landed in a history of another shape, it could overwrite a count
//! still in that window. So the carry-over seals the pool (every other write
//! of it fails from then on), reads the window, installs a new history (or
//! none) and unseals; the old one is retired through the epoch, and writes
//! that still reach it are lost harmlessly. A writer checks, before writing,
//! that the history it loaded carries its configuration's tag and that the
//! configuration is still the one in force, which rules out a later
//! configuration with the same tag bit.
//!
//! **What waits.** A request that meets a sealed pool waits for the carry-over
//! to finish (`O(S)` steps, once per key per reconfiguration); nothing else
//! waits.
//!
//! Sub-windows are aligned to the keyed limiter's time origin, shared by
//! every key, so a recreated key's sub-windows are where its predecessor's
//! were.
//!
//! [`SlidingWindow`]: crate::SlidingWindow
//! [`LockingSlidingWindow`]: crate::LockingSlidingWindow
//! [`WindowShape`]: crate::sliding_window::ring::WindowShape

use std::convert::Infallible;
use std::fmt;
use std::time::Duration;

use super::{Carry, Refusal, View, sealed::Kind};
use crate::cell::{self, Alone, Charging, Loss, Opening, Orders};
use crate::clock::Clock;
use crate::error::{ConfigError, Denied};
use crate::limiter::{Snapshot, check_request};
use crate::machine::scale_up;
use crate::rate::Rate;
use crate::sliding_window::SlidingWindow;
use crate::sliding_window::ring::WindowShape;
use crate::sync::fault::{Fault, injected};
use crate::sync::{AtomicU64, AtomicU128, Backoff, Guard, MaybeShared, Ordering, pin};

/// The configuration of a keyed or tunable [`SlidingWindow`]: at most `N`
/// permits in any `S` consecutive aligned sub-windows that cut the period
/// `T` into `S` parts, per key, validated once.
///
/// Per key, lock-free: one 128-bit word for the newest sub-window and an
/// `8·S`-byte history of the finished ones (no stripes: one key's traffic is
/// rarely contended), deciding exactly as the
/// [`LockingSlidingWindow`](crate::LockingSlidingWindow) twin does. A key
/// takes a 32-byte header in the map's entry, and the history once a
/// sub-window it charged is left, besides the key and the table's share
/// (measured per key in `docs/benchmarks.md`).
///
/// ```
/// use std::time::Duration;
/// use tollgate::keyed::{Keyed, SlidingWindowConfig};
/// use tollgate::{Denied, ManualClock, Rate, SlidingWindow};
///
/// let clock = ManualClock::new();
/// // 100 a minute, in 6 sub-windows of 10 s.
/// let cfg = SlidingWindowConfig::with_sub_windows(Rate::per_minute(100), 6)?;
/// let per_user = Keyed::<String, SlidingWindow<ManualClock>>::with_clock(cfg, clock.clone());
/// clock.set(55_000_000_000); // 0:55
/// per_user.try_acquire_n("alice", 100)?;
/// clock.set(65_000_000_000); // 1:05: the 0:50 sub-window still counts
/// assert_eq!(per_user.try_acquire("alice"), Err(Denied::RetryAfter(Duration::from_secs(45))));
/// assert!(per_user.try_acquire("bob").is_ok()); // every key has its own window
/// clock.set(110_000_000_000); // 1:50: it has left the window
/// per_user.try_acquire_n("alice", 100)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy)]
pub struct SlidingWindowConfig {
    rate: Rate,
    geo: WindowShape,
}

impl SlidingWindowConfig {
    /// `rate.permits()` in any window of `rate.period()` cut into the direct
    /// window's default sub-windows (ten, or fewer for rates so fine that a
    /// tenth of the period is shorter than the limit in nanoseconds), with the
    /// errors of [`SlidingWindow::new`].
    ///
    /// ```
    /// use tollgate::keyed::SlidingWindowConfig;
    /// use tollgate::{ConfigError, Rate};
    /// assert_eq!(SlidingWindowConfig::new(Rate::per_minute(100))?.sub_windows(), 10);
    /// assert_eq!(SlidingWindowConfig::new(Rate::per_second(0)).unwrap_err(), ConfigError::ZeroRate);
    /// # Ok::<(), ConfigError>(())
    /// ```
    pub fn new(rate: Rate) -> Result<Self, ConfigError> {
        Self::with_sub_windows(rate, WindowShape::default_subs(rate))
    }

    /// Cut into `sub_windows` sub-windows, with the errors of
    /// [`SlidingWindowBuilder::sub_windows`](crate::SlidingWindowBuilder::sub_windows):
    /// zero, more than [`MAX_SUB_WINDOWS`](crate::MAX_SUB_WINDOWS),
    /// or a sub-window shorter than the limit in nanoseconds is
    /// [`ConfigError::InvalidSubWindows`].
    ///
    /// ```
    /// use tollgate::keyed::SlidingWindowConfig;
    /// use tollgate::{ConfigError, Rate};
    /// let cfg = SlidingWindowConfig::with_sub_windows(Rate::per_minute(60), 4)?;
    /// assert_eq!(cfg.sub_window().as_secs(), 15);
    /// assert_eq!(
    ///     SlidingWindowConfig::with_sub_windows(Rate::per_minute(60), 0).unwrap_err(),
    ///     ConfigError::InvalidSubWindows { sub_windows: 0, max: 4096 },
    /// );
    /// # Ok::<(), ConfigError>(())
    /// ```
    pub fn with_sub_windows(rate: Rate, sub_windows: u32) -> Result<Self, ConfigError> {
        Ok(SlidingWindowConfig {
            rate,
            geo: WindowShape::new(rate, sub_windows)?,
        })
    }

    /// Permits in any `S` consecutive sub-windows: the largest request.
    ///
    /// ```
    /// # use tollgate::{keyed::SlidingWindowConfig, Rate};
    /// assert_eq!(SlidingWindowConfig::new(Rate::per_hour(7)).unwrap().limit(), 7);
    /// ```
    pub fn limit(&self) -> u32 {
        self.geo.limit()
    }

    /// The period the sub-windows cut.
    ///
    /// ```
    /// # use tollgate::{keyed::SlidingWindowConfig, Rate};
    /// assert_eq!(SlidingWindowConfig::new(Rate::per_hour(7)).unwrap().window().as_secs(), 3600);
    /// ```
    pub fn window(&self) -> Duration {
        self.rate.period()
    }

    /// The number of sub-windows, `S`.
    ///
    /// ```
    /// # use tollgate::{keyed::SlidingWindowConfig, Rate};
    /// assert_eq!(SlidingWindowConfig::with_sub_windows(Rate::per_hour(7), 3).unwrap().sub_windows(), 3);
    /// ```
    pub fn sub_windows(&self) -> u32 {
        self.geo.subs()
    }

    /// One sub-window's length: the period divided by `S`, rounded up to a
    /// whole nanosecond (never faster than asked).
    ///
    /// ```
    /// use std::time::Duration;
    /// # use tollgate::{keyed::SlidingWindowConfig, Rate};
    /// let cfg = SlidingWindowConfig::with_sub_windows(Rate::per_second(5), 3).unwrap();
    /// assert_eq!(cfg.sub_window(), Duration::from_nanos(333_333_334));
    /// ```
    pub fn sub_window(&self) -> Duration {
        Duration::from_nanos(self.geo.sub())
    }

    fn subs(&self) -> u64 {
        u64::from(self.geo.subs())
    }
}

impl PartialEq for SlidingWindowConfig {
    fn eq(&self, other: &Self) -> bool {
        // The shape is a function of these two.
        (self.rate, self.geo.subs()) == (other.rate, other.geo.subs())
    }
}

impl Eq for SlidingWindowConfig {}

impl fmt::Debug for SlidingWindowConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SlidingWindowConfig")
            .field("limit", &self.limit())
            .field("window", &self.window())
            .field("sub_windows", &self.sub_windows())
            .finish()
    }
}

/// A window's counts as plain values: what a carry-over reads from a key's
/// cell, rewrites for the new configuration and writes back.
#[derive(Debug, Clone)]
struct Win {
    /// `S` counts; sub-window `i`'s at `i mod S` while `newest − S < i <=
    /// newest`. Empty when nothing is counted.
    counts: Box<[u32]>,
    newest: u64,
    total: u64,
}

impl Win {
    fn empty() -> Self {
        Win {
            counts: Box::new([]),
            newest: 0,
            total: 0,
        }
    }

    /// The window that ends with `newest` under `geo`, read through `charge`.
    fn read(geo: &WindowShape, newest: u64, charge: impl Fn(u64) -> u32) -> Self {
        let subs = u64::from(geo.subs());
        let mut counts = vec![0u32; geo.subs() as usize].into_boxed_slice();
        let mut total = 0u64;
        for i in (newest + 1).saturating_sub(subs)..=newest {
            let count = charge(i);
            // Below `S <= MAX_SUB_WINDOWS`: the cast is lossless.
            counts[(i % subs) as usize] = count;
            total += u64::from(count);
        }
        if total == 0 {
            // Nothing counted, but readings before `newest` are still stale.
            return Win {
                newest,
                ..Win::empty()
            };
        }
        Win {
            counts,
            newest,
            total,
        }
    }

    fn slot(&self, i: u64) -> usize {
        // Below `counts.len() <= MAX_SUB_WINDOWS`: the cast is lossless.
        (i % self.counts.len() as u64) as usize
    }

    /// Sub-window `i`'s count; 0 outside the window.
    fn charge(&self, i: u64) -> u32 {
        let len = self.counts.len() as u64;
        if len == 0 || i > self.newest || i + len <= self.newest {
            0
        } else {
            self.counts[self.slot(i)]
        }
    }

    /// These counts, written under `from`, carried over to `to` at `now`.
    ///
    /// `Reset` empties them. `Proportional` (each count × new limit / old
    /// limit, rounded up) and `Additive` (each count as is) keep the
    /// sub-windows still inside the old window at `now`; each moves to the new
    /// sub-window holding its last instant (the current one's to the new
    /// sub-window of `now`), counts landing together adding up, each capped
    /// at the new limit (a count of the limit already fills every window it
    /// is in). The new window opens at `now`'s sub-window, so a reading older
    /// than the change is denied as stale, never counted in the past; counts
    /// that land outside its window are dropped. Nothing kept is a new
    /// window: a fresh state carries to a fresh one.
    fn carried(
        &self,
        from: &SlidingWindowConfig,
        to: &SlidingWindowConfig,
        now: u64,
        carry: Carry,
    ) -> Win {
        if carry == Carry::Reset || self.counts.is_empty() {
            return Win::empty();
        }
        let (old, new) = (&from.geo, &to.geo);
        // Never before the newest sub-window opened: it holds the present.
        let at = now.max(old.start(self.newest));
        let q = old.index(at);
        let newest = new.index(at);
        let mut counts = vec![0u32; to.geo.subs() as usize].into_boxed_slice();
        let mut total = 0u64;
        for i in q.saturating_sub(from.subs() - 1)..=self.newest {
            let count = self.charge(i);
            if count == 0 {
                continue;
            }
            // The old sub-window's last instant, or `at` if that is later.
            let p = new.index((old.start(i + 1) - 1).min(at));
            if p + to.subs() <= newest {
                continue;
            }
            let count = match carry {
                Carry::Proportional => scale_up(
                    u64::from(count),
                    u64::from(to.limit()),
                    u64::from(from.limit()),
                ),
                _ => u64::from(count),
            };
            let slot = (p % to.subs()) as usize;
            let before = u64::from(counts[slot]);
            let after = (before + count).min(u64::from(to.limit()));
            // At most the new limit: the cast is lossless.
            counts[slot] = after as u32;
            total += after - before;
        }
        if total == 0 {
            return Win::empty();
        }
        Win {
            counts,
            newest,
            total,
        }
    }
}

/// What the twin's `check` answers on a window whose newest opened
/// sub-window is `newest`: a reading older than it is denied until it starts
/// (or later); otherwise `n` fits if the window ending with the reading's
/// sub-window has room (sub-windows after `newest` have charged nothing).
fn check(
    geo: &WindowShape,
    now: u64,
    n: u32,
    newest: u64,
    charge: impl Fn(u64) -> u32,
) -> Result<(), Denied> {
    let j = geo.index(now);
    if j < newest {
        return Err(geo.retry_after(now, newest, newest, n, charge));
    }
    if geo.room(j, newest, &charge) >= n {
        Ok(())
    } else {
        Err(geo.retry_after(now, j + 1, newest, n, charge))
    }
}

/// Whether a window decides, at `now` and at every later time, exactly as a
/// new one: no reading from `now` on is older than `newest`, and every charge
/// has left the window ending with `now`'s sub-window, so it has left every
/// later one.
fn is_fresh(geo: &WindowShape, now: u64, newest: u64, charge: impl Fn(u64) -> u32) -> bool {
    let q = geo.index(now);
    if q < newest {
        return false;
    }
    let subs = u64::from(geo.subs());
    (q.saturating_sub(subs - 1)..=newest).all(|i| charge(i) == 0)
}

/// The pool word's tag bit (the keyed layer's [`TAG`](super::TAG), moved to
/// bit 127).
const POOL_TAG: u128 = 1 << 127;
/// Set while a carry-over rewrites the key: nothing else writes the pool.
const POOL_SEALED: u128 = 1 << 126;
/// The newest sub-window's bits: an index is below `2^62` (a reading is at
/// most `2^62 − 1` ns and a sub-window at least 1 ns).
const NEWEST_BITS: u64 = (1 << 62) - 1;

/// A key's pool word, unpacked (see the module's state table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Pool {
    /// `0` or [`TAG`](super::TAG).
    tag: u64,
    sealed: bool,
    /// The newest sub-window opened.
    newest: u64,
    /// What the `S − 1` sub-windows before `newest` had charged when it
    /// opened (at most the limit).
    used: u32,
    /// What `newest` has charged.
    count: u32,
}

impl Pool {
    fn fresh(tag: u64) -> Self {
        Pool {
            tag,
            sealed: false,
            newest: 0,
            used: 0,
            count: 0,
        }
    }

    fn pack(self) -> u128 {
        debug_assert!(self.newest <= NEWEST_BITS);
        let mut word = (u128::from(self.newest) << 64)
            | (u128::from(self.used) << 32)
            | u128::from(self.count);
        if self.tag != 0 {
            word |= POOL_TAG;
        }
        if self.sealed {
            word |= POOL_SEALED;
        }
        word
    }

    fn unpack(word: u128) -> Self {
        Pool {
            tag: if word & POOL_TAG != 0 { super::TAG } else { 0 },
            sealed: word & POOL_SEALED != 0,
            // The masks keep 62 and 32 bits: the casts are lossless.
            newest: ((word >> 64) as u64) & NEWEST_BITS,
            used: (word >> 32) as u32,
            count: word as u32,
        }
    }
}

/// Finished sub-windows' charges: sub-window `i`'s entry,
/// `WindowShape::pack(i, count)`, at `i mod S`, written before the pool leaves
/// `i`. A slot holding another index is an older sub-window's: `i` charged
/// nothing.
struct History {
    /// The tag of the configuration whose shape the entries use.
    tag: u64,
    slots: Box<[AtomicU64]>,
}

impl History {
    fn new(tag: u64, subs: u32) -> Self {
        History {
            tag,
            slots: (0..subs).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    fn slot(&self, i: u64) -> &AtomicU64 {
        // Below `S <= MAX_SUB_WINDOWS`: the cast is lossless.
        &self.slots[(i % self.slots.len() as u64) as usize]
    }

    /// Whether this is the history of pools tagged `tag` under `geo`. One
    /// that is not (allocated by an opener that a carry-over overtook) holds
    /// nothing: nothing is written into a history before the writer has
    /// checked it is its configuration's (see `WindowCell::open`).
    fn serves(&self, tag: u64, geo: &WindowShape) -> bool {
        self.tag == tag && self.slots.len() == geo.subs() as usize
    }
}

/// A pool and the history read with it: the charges of the window that
/// ends with the pool's newest sub-window.
struct Seen<'g> {
    pool: Pool,
    history: Option<&'g History>,
    geo: &'g WindowShape,
}

impl Seen<'_> {
    /// The pool with sub-window `j > newest` opened: what the `S − 1`
    /// sub-windows before it have charged, nothing charged to it.
    fn opened(&self, j: u64) -> Pool {
        let geo = self.geo;
        let used: u64 = ((j + 1).saturating_sub(u64::from(geo.subs()))..j)
            .map(|i| u64::from(self.charge(i)))
            .sum();
        Pool {
            newest: j,
            // A sum of counts each taken at its largest can pass the limit
            // after refunds; the limit already fills the window.
            used: used.min(u64::from(geo.limit())) as u32,
            count: 0,
            ..self.pool
        }
    }

    fn charge(&self, i: u64) -> u32 {
        let pool = &self.pool;
        if i == pool.newest {
            return pool.count;
        }
        if i > pool.newest || i + u64::from(self.geo.subs()) <= pool.newest {
            return 0;
        }
        let Some(history) = self.history else {
            return 0;
        };
        // Relaxed: the entry of every sub-window before `newest` was written
        // before the pool left it (by the opener's Release CAS, or by the
        // carry-over before its Release store), and the pool this was read
        // with was loaded with Acquire, so the entry is seen. A later write
        // (a refund, or an overtaken opener's `fetch_max`) may or may not be:
        // either value is at least what the sub-window still holds.
        let (stamp, count) = self.geo.unpack(history.slot(i).load(Ordering::Relaxed));
        if stamp == i { count } else { 0 }
    }
}

/// A key's window without a lock: one 128-bit pool word and a history of
/// finished sub-windows behind an epoch-protected pointer (see the module's
/// state table and protocol).
#[allow(unreachable_pub)] // sealed: public only as `Kind::State`
pub struct WindowCell {
    pool: AtomicU128,
    history: MaybeShared<History>,
}

impl WindowCell {
    fn with(pool: Pool, history: Option<History>) -> Self {
        WindowCell {
            pool: AtomicU128::new(pool.pack()),
            history: MaybeShared::new(history),
        }
    }

    /// A cell holding `win`, tagged `tag`, under `geo`.
    fn holding(win: &Win, tag: u64, geo: &WindowShape) -> Self {
        let (pool, history) = split(win, tag, geo);
        WindowCell::with(pool, history)
    }

    /// The pool word, once no carry-over is rewriting it.
    fn load(&self) -> u128 {
        let mut backoff = Backoff::new();
        loop {
            // `Charging::LOAD` (Acquire): pairs with the opener's Release CAS
            // (the history entries it wrote before leaving a sub-window) and
            // with the carry-over's Release store (the history it installed).
            let word = self.pool.load(Charging::LOAD);
            if word & POOL_SEALED == 0 {
                return word;
            }
            // A carry-over is rewriting the key (`O(S)` steps): only it can
            // finish, so wait for it.
            backoff.pause();
        }
    }

    /// The history that goes with `pool` (tagged as the pool, under `geo`),
    /// or `None` if the pool moved to another configuration meanwhile (read
    /// the pool again).
    fn seen<'g>(&self, pool: Pool, geo: &'g WindowShape, guard: &'g Guard) -> Option<Seen<'g>> {
        let history = self.history.load(guard);
        if let Some(h) = history {
            if h.serves(pool.tag, geo) {
                return Some(Seen { pool, history, geo });
            }
        }
        // No history of this configuration: either it never needed one (no
        // sub-window with a charge has been left since it began), or a
        // carry-over has replaced it since the pool was read. Only a
        // carry-over changes the tag or seals the pool, so the same tag,
        // unsealed, tells the first case. Relaxed: a carry-over seals the
        // pool before it replaces the history, and a history (or its
        // absence) loaded above with Acquire from that replacement makes
        // the seal happen before this load, which by coherence then returns
        // the sealed pool or a later one; a history loaded before any
        // replacement needs no ordering to be the pool's.
        let again = Pool::unpack(self.pool.load(Ordering::Relaxed));
        (again.tag == pool.tag && !again.sealed).then_some(Seen {
            pool,
            history: None,
            geo,
        })
    }

    /// Runs `f` on the key's window under the view's configuration —
    /// carried over without writing anything if the key is still under the
    /// previous one — as `(shape, newest, charge)`.
    fn with_window<R>(
        &self,
        view: &WindowView<'_>,
        now: u64,
        f: impl FnOnce(&WindowShape, u64, &dyn Fn(u64) -> u32) -> R,
    ) -> Result<R, Refusal> {
        let guard = pin();
        loop {
            let pool = Pool::unpack(self.load());
            if pool.tag == view.tag {
                let geo = &view.current.geo;
                if let Some(seen) = self.seen(pool, geo, &guard) {
                    return Ok(f(geo, pool.newest, &|i| seen.charge(i)));
                }
            } else if (view.still_current)() {
                if let Some(seen) = self.seen(pool, &view.previous.geo, &guard) {
                    let win = Win::read(&view.previous.geo, pool.newest, |i| seen.charge(i))
                        .carried(view.previous, view.current, now, view.carry);
                    return Ok(f(&view.current.geo, win.newest, &|i| win.charge(i)));
                }
            } else {
                return Err(Refusal::Stale);
            }
        }
    }

    /// The twin's decision on this key: a reading older than the newest
    /// sub-window is denied until it starts (or later); otherwise its
    /// sub-window opens (whether or not `n` is then admitted) and `n` is
    /// admitted if the window ending with it has room. Returns the
    /// sub-window charged and the snapshot after the admission.
    fn decide(&self, view: &WindowView<'_>, now: u64, n: u32) -> Result<(u64, Snapshot), Refusal> {
        let geo = &view.current.geo;
        let limit = u64::from(geo.limit());
        let j = geo.index(now);
        let mut word = self.load();
        loop {
            // `Charging`: the admission publishes nothing but the word; the
            // word it decides on, loaded or found, may be an opener's.
            // Lost races step aside, as an admission always has.
            let detour = match self.update::<Charging, Detour>(
                word,
                |word| charge(word, view.tag, j, n, limit),
                Loss::StepAside,
            ) {
                Ok(stored) => {
                    let pool = Pool::unpack(stored);
                    // `used + count <= limit` (`charge`): the cast is lossless.
                    let available = (limit - u64::from(pool.used) - u64::from(pool.count)) as u32;
                    // Full again once sub-window `j + S` starts: `j` has just
                    // been charged and is the newest.
                    let full_at = geo.start(j + u64::from(geo.subs()));
                    let after =
                        Snapshot::from_ns(available, geo.limit(), full_at.saturating_sub(now));
                    return Ok((j, after));
                }
                Err(detour) => detour,
            };
            word = match detour {
                Detour::Retagged(word) => {
                    self.carry(view, word, now)?;
                    self.load()
                }
                Detour::Opens(word, pool) => self.open(view, word, pool, j)?,
                Detour::Older(pool) => match self.denial(pool, geo, |seen| {
                    geo.retry_after(now, pool.newest, pool.newest, n, |i| seen.charge(i))
                }) {
                    Some(denied) => return Err(denied.into()),
                    None => self.load(),
                },
                Detour::Full(pool, sum) => match self.denial(pool, geo, |seen| {
                    geo.retry_after_next(now, j, n, sum, |i| seen.charge(i))
                }) {
                    Some(denied) => return Err(denied.into()),
                    None => self.load(),
                },
            };
        }
    }

    /// Runs `decide` on the pool word through the crate's one loop
    /// (`cell::update_from`, with the orderings `O` and `lost` the cost of
    /// a lost race) from `word`, a value of the pool, until it stores a word
    /// or refuses; returns the word stored or the refusal. A sealed pool is
    /// never decided on (a carry-over is rewriting the key, and every write
    /// of it would fail): its end is waited out (`load`) and the decision
    /// made on the word it leaves.
    fn update<O: Orders, E>(
        &self,
        mut word: u128,
        mut decide: impl FnMut(u128) -> Result<u128, E>,
        lost: Loss,
    ) -> Result<u128, E> {
        loop {
            let decided = cell::update_from::<O, u128, Option<E>>(
                &self.pool,
                word,
                |word| {
                    if word & POOL_SEALED != 0 {
                        return Err(None);
                    }
                    decide(word).map_err(Some)
                },
                |_, _| lost,
            );
            match decided {
                Ok(stored) => return Ok(stored),
                Err(Some(refused)) => return Err(refused),
                Err(None) => word = self.load(),
            }
        }
    }

    /// A denial computed by `f` from the charges that go with `pool`, or
    /// `None` if the pool moved to another configuration meanwhile.
    fn denial(
        &self,
        pool: Pool,
        geo: &WindowShape,
        f: impl FnOnce(&Seen<'_>) -> Denied,
    ) -> Option<Denied> {
        let guard = pin();
        self.seen(pool, geo, &guard).map(|seen| f(&seen))
    }

    /// Opens sub-window `j > pool.newest`: writes the newest sub-window's
    /// charge into the history, then moves the pool to `j` with what the
    /// `S − 1` sub-windows before `j` have charged. Returns the pool word to
    /// decide on next (the opened one, or whatever beat this thread to it).
    fn open(&self, view: &WindowView<'_>, word: u128, pool: Pool, j: u64) -> Result<u128, Refusal> {
        let geo = &view.current.geo;
        let guard = pin();
        let mut history = self.history.load(&guard);
        if pool.count > 0 && !history.is_some_and(|h| h.serves(view.tag, geo)) {
            // The first sub-window with a charge to leave since the key
            // began (or since a carry-over that kept no history): the
            // history is allocated now, once, by whoever wins this CAS. A
            // history that does not serve this configuration is an
            // overtaken opener's, empty — unless this thread is the one
            // overtaken, and the history a carry-over's for the next
            // configuration. A carry-over seals the pool before it installs
            // its history, so a pool read after the history, still unsealed
            // under this tag, tells that no carry-over has installed one;
            // one that starts later replaces whatever this CAS installs.
            // Relaxed: as in `seen` (the seal happens before a history
            // loaded from the replacement that followed it).
            let again = Pool::unpack(self.pool.load(Ordering::Relaxed));
            if again.tag != pool.tag || again.sealed {
                return Ok(self.load());
            }
            if !(view.still_current)() {
                return Err(Refusal::Stale);
            }
            let fresh = History::new(view.tag, geo.subs());
            // One CAS, not a loop (nor the epoch pointers' one loop,
            // `MaybeShared::update_from`): the checks above hold for the
            // history loaded before them only, so a lost race decides again
            // from the pool, not from the history it found.
            match self.history.compare_exchange(history, Some(fresh), &guard) {
                Ok(installed) => {
                    if let Some(old) = history {
                        // SAFETY: replaced by this CAS, so retired once; every
                        // reader pins before loading it.
                        unsafe { self.history.retire(old, &guard) };
                    }
                    history = installed;
                }
                // Another thread installed one: decide again.
                Err(_) => return Ok(self.load()),
            }
        }
        let history = history.filter(|h| h.serves(view.tag, geo));
        // The history loaded above is this configuration's, not a later
        // one's with the same tag bit, only if the view's configuration is
        // still the one in force: the tag changes only after a new
        // configuration is published, and the pool's tag matched the view's
        // when it was read (after the view). Writing a stamp into a history
        // of another shape could overwrite a count still in its window.
        if !(view.still_current)() {
            return Err(Refusal::Stale);
        }
        let opened = Seen { pool, history, geo }.opened(j);
        if injected(Fault::WindowOpenBeforePublish) {
            // The known-bad order: the pool moves before the entry is written.
            let next = self.move_to(word, opened);
            if next == opened.pack() {
                publish(history, pool, geo);
            }
            return Ok(next);
        }
        publish(history, pool, geo);
        Ok(self.move_to(word, opened))
    }

    /// Moves the pool from `word` to `opened`; returns the pool word to
    /// decide on next (the opened one, or whatever beat this thread to it).
    fn move_to(&self, word: u128, opened: Pool) -> u128 {
        // `Opening`: Release on success publishes the history entry
        // `publish` wrote (and the history itself) to every thread that
        // loads the pool with Acquire and then reads the left sub-window's
        // charge from the history; Acquire on failure, as the admission's.
        // One decision: open from `word` alone; any other word (one that
        // beat this thread to it) is handed back to be decided on, so only
        // a spurious failure of the weak CAS is tried again. Not through
        // `update`, which would wait out a seal and decide again: the
        // opening was checked against the view before this call only.
        let moved = cell::update_from::<Opening, u128, u128>(
            &self.pool,
            word,
            |found| {
                if found == word {
                    Ok(opened.pack())
                } else {
                    Err(found)
                }
            },
            |_, _| Loss::DecideAgain,
        );
        match moved {
            Ok(stored) => stored,
            Err(found) if found & POOL_SEALED == 0 => found,
            Err(_) => self.load(),
        }
    }

    /// Carries the key over from the view's previous configuration to its
    /// current one: seals the pool (every other write fails from then on),
    /// reads the window, installs the carried history, publishes the carried
    /// pool. `Ok` once it is done or if another thread sealed first (read
    /// the pool again); `Err(Stale)` if the view is no longer current.
    fn carry(&self, view: &WindowView<'_>, word: u128, now: u64) -> Result<(), Refusal> {
        if !(view.still_current)() {
            return Err(Refusal::Stale);
        }
        // `Alone` (Relaxed): the window read below needs every history entry
        // published before the pool reached `word`, and the caller read
        // `word` with Acquire (`load`, or a failed CAS's Acquire), which
        // already synchronised with the opener of `word`'s newest
        // sub-window; the seal succeeding means the pool still holds that
        // value, with the same newest sub-window and so the same entries.
        // Relaxed on failure: the caller loads the pool again with Acquire.
        // One decision: seal `word` alone; any other word means another
        // writer came first (only a spurious failure is tried again).
        let sealed = cell::update_from::<Alone, u128, ()>(
            &self.pool,
            word,
            |found| {
                if found == word {
                    Ok(word | POOL_SEALED)
                } else {
                    Err(())
                }
            },
            |_, _| Loss::DecideAgain,
        );
        if sealed.is_err() {
            return Ok(());
        }
        let pool = Pool::unpack(word);
        let guard = pin();
        let current = self.history.load(&guard);
        let old = &view.previous.geo;
        // Sealed: no entry of this configuration is written from now on but
        // an overtaken opener's, which only repeats what the pool or the
        // history already holds, or more (see `open`).
        let seen = Seen {
            pool,
            history: current.filter(|h| h.serves(pool.tag, old)),
            geo: old,
        };
        let win = Win::read(old, pool.newest, |i| seen.charge(i)).carried(
            view.previous,
            view.current,
            now,
            view.carry,
        );
        let geo = &view.current.geo;
        let next = carried_pool(&win, view.tag);
        // Always a new history (or none), never the old one rewritten: an
        // overtaken opener may still write into the old one. Whatever
        // history is current is replaced: a lost race means an overtaken
        // opener installed an (empty) one since, and that one is replaced
        // next, by a history built again.
        let Ok((replaced, _)) = self.history.update_from(current, &guard, |_| {
            Ok::<_, Infallible>(carried_history(&win, view.tag, geo))
        });
        if let Some(old) = replaced {
            // SAFETY: replaced by this thread's CAS, so retired once; every
            // reader pins before loading it.
            unsafe { self.history.retire(old, &guard) };
        }
        // Release: publishes the history installed above (and the
        // configuration change) to every thread that loads the pool with
        // Acquire. A store: the seal keeps every other writer out.
        self.pool.store(next.pack(), Ordering::Release);
        Ok(())
    }

    /// Gives back `n` permits charged to sub-window `j` under `tag`, if the
    /// key is still under that configuration and the sub-window still in its
    /// window. The newest sub-window's count is exact; a finished
    /// sub-window's entry is lowered, but the pool's `used` keeps the
    /// permits until the next sub-window opens (the opener of the one after
    /// reads the lowered entry). Never below what was admitted since.
    fn refund(&self, view: &WindowView<'_>, j: u64, tag: u64, n: u32) {
        let geo = if tag == view.tag {
            &view.current.geo
        } else {
            &view.previous.geo
        };
        if let Some(pool) = self.refund_newest(j, tag, n) {
            self.refund_history(view, geo, pool, j, tag, n);
        }
    }

    /// The refund of permits of sub-window `j` while it is still the
    /// pool's newest: lowers the pool's count. `Some(pool)` if the pool had
    /// left `j` (the history's entry is the one to lower), `None` if the
    /// refund is done or owes nothing.
    fn refund_newest(&self, j: u64, tag: u64, n: u32) -> Option<Pool> {
        // `Alone`: Relaxed on success, as a refund publishes nothing but the
        // word. Relaxed on failure: the pool may have left `j`, and the
        // history's entry for `j` is read next; a load that misses the entry
        // (it reads an older sub-window's stamp) gives nothing back, which
        // keeps the permits counted: under-admission only. Lost races step
        // aside, as a refund always has.
        let refunded = self.update::<Alone, Option<Pool>>(
            self.load(),
            |word| {
                let pool = Pool::unpack(word);
                // A carry-over in between moved the counts to other
                // sub-windows: keep them.
                if pool.tag != tag || j > pool.newest {
                    return Err(None);
                }
                if j < pool.newest {
                    return Err(Some(pool));
                }
                if pool.count < n {
                    return Err(None);
                }
                let next = Pool {
                    count: pool.count - n,
                    ..pool
                };
                Ok(next.pack())
            },
            Loss::StepAside,
        );
        refunded.err().flatten()
    }

    /// The refund of permits of a finished sub-window `j`: lowers its
    /// history entry, if the history is still the receipt's configuration's
    /// and `j` still in the window of `pool` (the pool as it left `j`).
    fn refund_history(
        &self,
        view: &WindowView<'_>,
        geo: &WindowShape,
        pool: Pool,
        j: u64,
        tag: u64,
        n: u32,
    ) {
        if j + u64::from(geo.subs()) <= pool.newest {
            return;
        }
        let guard = pin();
        let Some(history) = self.history.load(&guard).filter(|h| h.serves(tag, geo)) else {
            return;
        };
        // As in `open`: the history is the receipt's configuration's only
        // if that configuration is still in force.
        if tag != view.tag || !(view.still_current)() {
            return;
        }
        // `Alone`: Relaxed load, as the entry was published before the pool
        // left `j`, and a load that misses it gives nothing back (above);
        // Relaxed CAS, as a lowered entry publishes nothing, and a reader
        // that misses it counts the permits longer. A lost race is decided
        // again at once, as the entry's always has.
        let _ = cell::update::<Alone, u64, ()>(
            history.slot(j),
            |entry| {
                let (stamp, count) = geo.unpack(entry);
                if stamp != j || count < n {
                    return Err(());
                }
                Ok(geo.pack(j, count - n))
            },
            |_, _| Loss::DecideAgain,
        );
    }
}

/// Writes `pool`'s newest charge, if any, into `history` (which `open` has
/// installed and checked for a charged pool) before the pool leaves it.
fn publish(history: Option<&History>, pool: Pool, geo: &WindowShape) {
    if pool.count == 0 {
        return;
    }
    let Some(h) = history else {
        unreachable!("a charged pool's history was installed before it opens");
    };
    // Relaxed: published by the opener's Release CAS (`move_to`).
    // `fetch_max`, not a store: an opener that lost its CAS to an admission
    // (a larger count) or to another opener may write an older count of the
    // same sub-window, or one the slot has since moved past; the larger
    // stamp, then the larger count, stays. A count larger than the final one
    // (a refund came in between) only counts the refunded permits longer.
    h.slot(pool.newest)
        .fetch_max(geo.pack(pool.newest, pool.count), Ordering::Relaxed);
}

/// What an admission's decision on the pool word (`charge`) found instead
/// of room in the sub-window it reads: what `WindowCell::decide` does
/// outside the loop before it decides again (or denies).
enum Detour {
    /// The pool is tagged with another configuration: carry it over.
    Retagged(u128),
    /// The reading's sub-window is later than the pool's newest: open it.
    Opens(u128, Pool),
    /// The reading's sub-window is older than the pool's newest: denied.
    Older(Pool),
    /// No room in the window: denied, `sum` (the window's charge) already
    /// counted.
    Full(Pool, u64),
}

/// The admission's decision on the (unsealed) pool word: `n` more charged to
/// sub-window `j`, the newest, if the window ending with it has room under
/// `limit` and the word is tagged `tag`; otherwise the detour it needs.
fn charge(word: u128, tag: u64, j: u64, n: u32, limit: u64) -> Result<u128, Detour> {
    let pool = Pool::unpack(word);
    if pool.tag != tag {
        return Err(Detour::Retagged(word));
    }
    if j > pool.newest {
        return Err(Detour::Opens(word, pool));
    }
    if j < pool.newest {
        return Err(Detour::Older(pool));
    }
    let sum = u64::from(pool.used) + u64::from(pool.count);
    if sum + u64::from(n) > limit {
        return Err(Detour::Full(pool, sum));
    }
    // `count + n <= used + count + n <= limit`: no overflow.
    Ok(Pool {
        count: pool.count + n,
        ..pool
    }
    .pack())
}

/// `win` as a pool tagged `tag` and the history of its finished
/// sub-windows (none if it has none), under `geo`.
fn split(win: &Win, tag: u64, geo: &WindowShape) -> (Pool, Option<History>) {
    (carried_pool(win, tag), carried_history(win, tag, geo))
}

/// `win` as a pool tagged `tag`: [`split`]'s pool.
fn carried_pool(win: &Win, tag: u64) -> Pool {
    if win.counts.is_empty() {
        return Pool {
            newest: win.newest,
            ..Pool::fresh(tag)
        };
    }
    let count = win.charge(win.newest);
    Pool {
        tag,
        sealed: false,
        newest: win.newest,
        // `total <= limit`: the cast is lossless.
        used: (win.total - u64::from(count)) as u32,
        count,
    }
}

/// The history of `win`'s finished sub-windows (none if it has none),
/// tagged `tag`, under `geo`: [`split`]'s history.
fn carried_history(win: &Win, tag: u64, geo: &WindowShape) -> Option<History> {
    if win.counts.is_empty() {
        return None;
    }
    let finished = (win.newest + 1).saturating_sub(u64::from(geo.subs()))..win.newest;
    if finished.clone().all(|i| win.charge(i) == 0) {
        return None;
    }
    let history = History::new(tag, geo.subs());
    for i in finished {
        let count = win.charge(i);
        if count > 0 {
            // Relaxed: not yet published (see `WindowCell::carry`).
            history.slot(i).store(geo.pack(i, count), Ordering::Relaxed);
        }
    }
    Some(history)
}

impl fmt::Debug for WindowCell {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WindowCell").finish_non_exhaustive()
    }
}

/// A keyed sliding window's configuration view.
type WindowView<'v> = View<'v, SlidingWindowConfig>;

/// What an admission leaves: the sub-window it charged, the tag it was
/// written under, and the snapshot after it.
#[derive(Debug, Clone, Copy)]
#[allow(unreachable_pub)] // sealed: public only as `Kind::Receipt`
pub struct WindowReceipt {
    sub_window: u64,
    tag: u64,
    after: Snapshot,
}

impl<C: Clock> Kind for SlidingWindow<C> {
    type Config = SlidingWindowConfig;
    type Clock = C;
    type State = WindowCell;
    type Receipt = WindowReceipt;

    fn capacity(config: &SlidingWindowConfig) -> u32 {
        config.limit()
    }

    fn fresh(tag: u64) -> WindowCell {
        WindowCell::with(Pool::fresh(tag), None)
    }

    fn acquire(
        view: &WindowView<'_>,
        state: &WindowCell,
        now: u64,
        n: u32,
    ) -> Result<WindowReceipt, Refusal> {
        check_request(n, view.current.geo.limit())?;
        let (sub_window, after) = state.decide(view, now, n)?;
        Ok(WindowReceipt {
            sub_window,
            tag: view.tag,
            after,
        })
    }

    fn admitted(_view: &WindowView<'_>, receipt: WindowReceipt, _now: u64) -> Snapshot {
        receipt.after
    }

    fn peek(view: &WindowView<'_>, state: &WindowCell, now: u64, n: u32) -> Result<(), Refusal> {
        check_request(n, view.current.geo.limit())?;
        state.with_window(view, now, |geo, newest, charge| {
            check(geo, now, n, newest, charge)
        })??;
        Ok(())
    }

    fn refund(view: &WindowView<'_>, state: &WindowCell, receipt: WindowReceipt, n: u32) {
        state.refund(view, receipt.sub_window, receipt.tag, n);
    }

    fn fork(view: &WindowView<'_>, state: &WindowCell, now: u64) -> Option<WindowCell> {
        let geo = &view.current.geo;
        let win = state
            .with_window(view, now, |geo, newest, charge| {
                Win::read(geo, newest, charge)
            })
            .ok()?;
        Some(WindowCell::holding(&win, view.tag, geo))
    }

    fn snapshot(view: &WindowView<'_>, state: &WindowCell, now: u64) -> Option<Snapshot> {
        state
            .with_window(view, now, |geo, newest, charge| {
                geo.snapshot(now, newest, charge)
            })
            .ok()
    }

    fn is_fresh(view: &WindowView<'_>, state: &WindowCell, now: u64) -> Option<bool> {
        state
            .with_window(view, now, |geo, newest, charge| {
                is_fresh(geo, now, newest, charge)
            })
            .ok()
    }

    fn settle(view: &WindowView<'_>, state: &WindowCell, now: u64) -> bool {
        loop {
            let word = state.load();
            if Pool::unpack(word).tag == view.tag {
                return true;
            }
            if state.carry(view, word, now).is_err() {
                return false;
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// The per-key header: the pool word and the history's pointer, padded
    /// to the pool's 16-byte alignment.
    #[test]
    fn the_per_key_header_is_thirty_two_bytes() {
        assert_eq!(std::mem::size_of::<WindowCell>(), 32);
    }

    fn cfg(limit: u32, ms: u64, subs: u32) -> SlidingWindowConfig {
        SlidingWindowConfig::with_sub_windows(Rate::new(limit, Duration::from_millis(ms)), subs)
            .unwrap()
    }

    fn view<'a>(
        current: &'a SlidingWindowConfig,
        previous: &'a SlidingWindowConfig,
        carry: Carry,
        tag: u64,
        still_current: &'a dyn Fn() -> bool,
    ) -> View<'a, SlidingWindowConfig> {
        View {
            current,
            previous,
            carry,
            tag,
            still_current,
        }
    }

    /// Every field of the pool word round-trips, at its largest values too.
    #[test]
    fn the_pool_word_packs_every_field() {
        for pool in [
            Pool::fresh(0),
            Pool::fresh(super::super::TAG),
            Pool {
                tag: super::super::TAG,
                sealed: true,
                newest: NEWEST_BITS,
                used: u32::MAX,
                count: u32::MAX,
            },
            Pool {
                tag: 0,
                sealed: false,
                newest: 12_345,
                used: 7,
                count: 3,
            },
        ] {
            assert_eq!(Pool::unpack(pool.pack()), pool);
        }
    }

    /// A window holding only charges that have left it carries to a new
    /// one under every strategy, even into a longer window.
    #[test]
    fn a_fresh_window_carries_to_a_new_one() {
        let (a, b) = (cfg(4, 100, 4), cfg(9, 1_000, 5));
        let win = Win::read(&a.geo, 0, |i| if i == 0 { 3 } else { 0 });
        let now = 200_000_000;
        assert!(is_fresh(&a.geo, now, win.newest, |i| win.charge(i)));
        for carry in [Carry::Proportional, Carry::Additive, Carry::Reset] {
            let carried = win.carried(&a, &b, now, carry);
            assert!(carried.counts.is_empty() && carried.newest == 0);
        }
    }

    /// The same configuration, `Proportional` or `Additive`, at a time in
    /// the newest sub-window: the same counts in the same sub-windows.
    #[test]
    fn carrying_to_the_same_configuration_keeps_the_counts() {
        let a = cfg(5, 100, 4);
        // 2 in sub-window 0 (at 10 ms), 1 in sub-window 2 (at 60 ms).
        let win = Win::read(&a.geo, 2, |i| [2, 0, 1][i as usize]);
        assert_eq!(win.total, 3);
        for carry in [Carry::Proportional, Carry::Additive] {
            let carried = win.carried(&a, &a, 70_000_000, carry);
            assert_eq!(carried.newest, win.newest);
            assert_eq!(carried.total, 3);
            for i in 0..=win.newest {
                assert_eq!(carried.charge(i), win.charge(i), "sub-window {i}");
            }
        }
    }

    /// A cell holding a window (as a fork or a carry-over writes one) reads
    /// back the same window: the newest count in the pool, the finished ones
    /// in the history, and the pool's `used` their sum.
    #[test]
    fn a_cell_holds_the_window_it_was_given() {
        let a = cfg(9, 100, 4);
        let win = Win::read(&a.geo, 5, |i| [0, 0, 0, 2, 0, 4][i as usize]);
        let cell = WindowCell::holding(&win, 0, &a.geo);
        let pool = Pool::unpack(cell.load());
        assert_eq!((pool.newest, pool.used, pool.count), (5, 2, 4));
        let yes = || true;
        let v = view(&a, &a, Carry::Reset, 0, &yes);
        let read = cell
            .with_window(&v, 130_000_000, |geo, newest, charge| {
                Win::read(geo, newest, charge)
            })
            .unwrap();
        assert_eq!(read.newest, 5);
        for i in 0..=5 {
            assert_eq!(read.charge(i), win.charge(i), "sub-window {i}");
        }
        // Two more at sub-window 6: the room is 9 − 2 − 4 = 3.
        let (j, after) = cell.decide(&v, 150_000_000, 2).unwrap();
        assert_eq!((j, after.available), (6, 1));
    }

    /// A refund of the newest sub-window is exact; one of a finished
    /// sub-window lowers its entry, which the next opening reads.
    #[test]
    fn refunds_give_back_the_newest_count_and_finished_entries() {
        let a = cfg(4, 100, 4);
        let yes = || true;
        let v = view(&a, &a, Carry::Reset, 0, &yes);
        let cell = WindowCell::with(Pool::fresh(0), None);
        cell.decide(&v, 0, 3).unwrap();
        cell.refund(&v, 0, 0, 1);
        assert_eq!(Pool::unpack(cell.load()).count, 2);
        // Sub-window 1 opens: 2 used before it.
        cell.decide(&v, 25_000_000, 1).unwrap();
        assert_eq!(Pool::unpack(cell.load()).used, 2);
        cell.refund(&v, 0, 0, 2);
        // The pool keeps them until the next opening...
        assert!(cell.decide(&v, 26_000_000, 2).is_err());
        // ...which reads the lowered entry: only sub-window 1's 1 is left.
        let (_, after) = cell.decide(&v, 50_000_000, 3).unwrap();
        assert_eq!(after.available, 0);
        // A refund under another tag (a carry-over in between) keeps the counts.
        cell.refund(&v, 2, TAG_OTHER, 3);
        assert_eq!(Pool::unpack(cell.load()).count, 3);
    }

    const TAG_OTHER: u64 = super::super::TAG;

    /// A carry-over rewrites the pool and the history under the new
    /// shape; a stale view neither decides nor carries.
    #[test]
    fn a_carry_over_rewrites_pool_and_history() {
        let (a, b) = (cfg(4, 100, 4), cfg(8, 100, 2));
        let yes = || true;
        let old = view(&a, &a, Carry::Reset, 0, &yes);
        let cell = WindowCell::with(Pool::fresh(0), None);
        cell.decide(&old, 10_000_000, 1).unwrap(); // sub-window 0
        cell.decide(&old, 60_000_000, 2).unwrap(); // sub-window 2
        let new = view(&b, &a, Carry::Additive, TAG_OTHER, &yes);
        // At 70 ms: old sub-window 0 ends in new sub-window 0, 2 in 1.
        assert!(<SlidingWindow<crate::clock::ManualClock> as Kind>::settle(
            &new, &cell, 70_000_000
        ));
        let pool = Pool::unpack(cell.load());
        assert_eq!(
            (pool.tag, pool.newest, pool.used, pool.count),
            (TAG_OTHER, 1, 1, 2)
        );
        assert_eq!(
            <SlidingWindow<crate::clock::ManualClock> as Kind>::snapshot(&new, &cell, 70_000_000)
                .unwrap()
                .available,
            5
        );
        let no = || false;
        let stale = view(&a, &b, Carry::Additive, 0, &no);
        assert_eq!(
            cell.decide(&stale, 70_000_000, 1).unwrap_err(),
            Refusal::Stale
        );
    }
}
