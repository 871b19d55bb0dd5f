//! The sliding window as a keyed kind: per key, the counts of the last `S`
//! sub-windows under the key's own lock, without stripes.
//!
//! The direct [`SlidingWindow`] leases each sub-window's budget to per-core
//! stripes (one 128-byte line each) so that many cores can share one limit.
//! One key's traffic is rarely contended, and a stripe per core per key
//! would cost kilobytes a key, so the keyed window keeps what the locking
//! twin keeps — `S` counts and the newest sub-window opened — and decides as
//! the twin does: the same [`Geometry`] functions, so the same decisions,
//! retry-afters and snapshots as a [`LockingSlidingWindow`] built when the
//! keyed limiter was built (property tests in `tests/keyed.rs`), and the same
//! bound: **at most `N` permits in any `S` consecutive aligned sub-windows**,
//! per key (at most `N` in any `(S − 1)/S` of the period, `2N` in any period).
//!
//! `S` counts and an index do not fit one 128-bit word for useful `N` and
//! `S` (ten 7-bit counts for `N = 100` already take 70 bits, and the index
//! up to 57), so, as the keyed sliding log, the state is locked: a
//! `parking_lot` mutex held for one division, a few loads and stores (`O(1)`
//! within a sub-window; opening sub-windows clears at most `S` slots).
//!
//! # State
//!
//! | field | meaning |
//! |---|---|
//! | `tag` | the keyed layer's tag: the configuration the counts were last written under |
//! | `newest` | the newest sub-window opened (by any decision, admitted or not — the twin's rule); readings in an older sub-window are denied |
//! | `total` | the sum of the counts of the window ending with `newest` (sub-windows `newest − S + 1 ..= newest`) |
//! | `counts` | `S` counts; sub-window `i`'s is at `i mod S` while `newest − S < i <= newest`. Empty (no allocation) until the key's first admission |
//!
//! Sub-windows are aligned to the keyed limiter's time origin, shared by
//! every key, so a recreated key's sub-windows are where its predecessor's
//! were.
//!
//! [`SlidingWindow`]: crate::SlidingWindow
//! [`LockingSlidingWindow`]: crate::LockingSlidingWindow
//! [`Geometry`]: crate::sliding_window::ring::Geometry

use std::fmt;
use std::time::Duration;

use super::{Carry, Keyable, Refusal, View, sealed::Sealed};
use crate::clock::Clock;
use crate::error::{ConfigError, Denied};
use crate::limiter::{Snapshot, check_request};
use crate::machine::scale_up;
use crate::rate::Rate;
use crate::sliding_window::SlidingWindow;
use crate::sliding_window::ring::Geometry;
use crate::sync::{Mutex, MutexGuard};

/// The configuration of a keyed or tunable [`SlidingWindow`]: at most `N`
/// permits in any `S` consecutive aligned sub-windows that cut the period
/// `T` into `S` parts, per key, validated once.
///
/// Per key, the counts of the last `S` sub-windows under the key's own lock
/// (no stripes: one key's traffic is rarely contended), deciding exactly as
/// the [`LockingSlidingWindow`](crate::LockingSlidingWindow) twin does: `4·S`
/// bytes, allocated on the key's first admission, plus a 48-byte header in
/// the map's entry and the key and the table's share (measured per key in
/// `docs/keyed.md`).
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
    geo: Geometry,
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
        Self::with_sub_windows(rate, Geometry::default_subs(rate))
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
            geo: Geometry::new(rate, sub_windows)?,
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
        // The geometry is a function of these two.
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

/// One key's window (see the module's state table).
#[derive(Debug, Clone)]
struct Win {
    counts: Box<[u32]>,
    newest: u64,
    total: u64,
    tag: u64,
}

impl Win {
    fn empty(tag: u64) -> Self {
        Win {
            counts: Box::new([]),
            newest: 0,
            total: 0,
            tag,
        }
    }

    fn slot(&self, i: u64) -> usize {
        // Below `counts.len() <= MAX_SUB_WINDOWS`: the cast is lossless.
        (i % self.counts.len() as u64) as usize
    }

    /// Sub-window `i`'s count; 0 outside the ring's window.
    fn charge(&self, i: u64) -> u32 {
        let len = self.counts.len() as u64;
        if len == 0 || i > self.newest || i + len <= self.newest {
            0
        } else {
            self.counts[self.slot(i)]
        }
    }

    /// Opens sub-window `j > newest`: the sub-windows that leave the window
    /// ending with `j` are cleared (at most `S` of them).
    fn open(&mut self, j: u64) {
        let len = self.counts.len() as u64;
        if len > 0 {
            if j - self.newest >= len {
                self.counts.fill(0);
                self.total = 0;
            } else {
                for i in self.newest + 1..=j {
                    let slot = self.slot(i);
                    self.total -= u64::from(self.counts[slot]);
                    self.counts[slot] = 0;
                }
            }
        }
        self.newest = j;
    }

    /// The twin's decision (`LockingSlidingWindow::decide`) on these counts:
    /// a reading older than `newest` is denied until `newest` starts (or
    /// later); otherwise its sub-window opens and `n` is admitted if the
    /// window ending with it has room. Returns the sub-window charged.
    fn decide(&mut self, geo: &Geometry, now: u64, n: u32) -> Result<u64, Denied> {
        let j = geo.index(now);
        if j < self.newest {
            let newest = self.newest;
            return Err(geo.retry_after(now, newest, newest, n, |i| self.charge(i)));
        }
        if j > self.newest {
            self.open(j);
        }
        if u64::from(geo.limit()).saturating_sub(self.total) >= u64::from(n) {
            if self.counts.is_empty() {
                self.counts = vec![0; geo.subs() as usize].into_boxed_slice();
            }
            let slot = self.slot(j);
            // `counts[slot] + n <= total + n <= limit`.
            self.counts[slot] += n;
            self.total += u64::from(n);
            Ok(j)
        } else {
            Err(geo.retry_after_next(now, j, n, self.total, |i| self.charge(i)))
        }
    }

    /// What [`decide`](Win::decide) would answer, without writing anything.
    fn check(&self, geo: &Geometry, now: u64, n: u32) -> Result<(), Denied> {
        let j = geo.index(now);
        if j < self.newest {
            let newest = self.newest;
            return Err(geo.retry_after(now, newest, newest, n, |i| self.charge(i)));
        }
        // As `decide` after opening `j`: sub-windows after `newest` have
        // charged nothing, and none the window ending with `j` has left is read.
        if geo.room(j, j, |i| self.charge(i)) >= n {
            Ok(())
        } else {
            Err(geo.retry_after(now, j + 1, j, n, |i| self.charge(i)))
        }
    }

    fn snapshot(&self, geo: &Geometry, now: u64) -> Snapshot {
        geo.snapshot(now, self.newest, |i| self.charge(i))
    }

    /// [`snapshot`](Win::snapshot) right after [`decide`](Win::decide)
    /// admitted into sub-window `j` at `now`, in O(1) rather than O(S):
    /// `j` is the newest sub-window and the reading's, so the room is what
    /// `total` leaves, and `j`, which has just been charged, is the last
    /// charged sub-window, full again once sub-window `j + S` starts.
    fn admitted(&self, geo: &Geometry, now: u64, j: u64) -> Snapshot {
        debug_assert!(j == self.newest && j == geo.index(now) && self.charge(j) > 0);
        // `total <= limit`: the cast is lossless.
        let available = (u64::from(geo.limit()) - self.total) as u32;
        let full_at = geo.start(j + u64::from(geo.subs()));
        Snapshot::from_ns(available, geo.limit(), full_at.saturating_sub(now))
    }

    /// Exactly a new window's decisions (and snapshots) at `now` and every
    /// later time: no reading from `now` on is older than `newest`, and
    /// every charge has left the window ending with `now`'s sub-window, so
    /// it has left every later one. (A new window has `newest = 0` and no
    /// charge; both open the decision's sub-window and find it empty.)
    fn is_fresh(&self, geo: &Geometry, now: u64) -> bool {
        let q = geo.index(now);
        if q < self.newest {
            return false;
        }
        let subs = u64::from(geo.subs());
        (q.saturating_sub(subs - 1)..=self.newest).all(|i| self.charge(i) == 0)
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
        let mut win = Win::empty(self.tag);
        if carry == Carry::Reset || self.counts.is_empty() {
            return win;
        }
        let (old, new) = (&from.geo, &to.geo);
        // Never before the newest sub-window opened: it holds the present.
        let at = now.max(old.start(self.newest));
        let q = old.index(at);
        let newest = new.index(at);
        let mut counts = vec![0u32; to.geo.subs() as usize].into_boxed_slice();
        let mut total = 0u64;
        let mut kept = false;
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
            kept = true;
        }
        if kept {
            win.counts = counts;
            win.newest = newest;
            win.total = total;
        }
        win
    }

    /// Takes back `n` permits charged to sub-window `j`, if it is still in
    /// the ring's window: the counts are then exactly what they would be had
    /// the permits never been taken, less nothing any later admission holds
    /// (admissions in between were decided on counts at least as high).
    fn refund(&mut self, j: u64, n: u32) {
        if self.charge(j) >= n {
            let slot = self.slot(j);
            self.counts[slot] -= n;
            self.total -= u64::from(n);
        }
    }
}

/// A key's window under its own mutex (a loom mutex under `--cfg loom`, so
/// the models see every lock).
#[doc(hidden)]
#[allow(unreachable_pub)] // sealed: public only as `Keyable::State`
pub struct WindowCell(Mutex<Win>);

impl WindowCell {
    fn new(win: Win) -> Self {
        WindowCell(Mutex::new(win))
    }

    fn lock(&self) -> MutexGuard<'_, Win> {
        self.0.lock()
    }
}

impl fmt::Debug for WindowCell {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WindowCell").finish_non_exhaustive()
    }
}

/// The window carried over to the view's configuration, if it is stale and
/// the view current; `Err(Stale)` if it moved past the view; `Ok(None)` if
/// it is already under the view's configuration.
fn resolve(
    view: &View<'_, SlidingWindowConfig>,
    win: &Win,
    now: u64,
) -> Result<Option<Win>, Refusal> {
    if win.tag == view.tag {
        Ok(None)
    } else if (view.still_current)() {
        let mut carried = win.carried(view.previous, view.current, now, view.carry);
        carried.tag = view.tag;
        Ok(Some(carried))
    } else {
        Err(Refusal::Stale)
    }
}

/// What an admission leaves: the sub-window it charged, the tag it was
/// written under, and the snapshot after it.
#[doc(hidden)]
#[derive(Debug, Clone, Copy)]
#[allow(unreachable_pub)] // sealed: public only as `Keyable::Receipt`
pub struct WindowReceipt {
    sub_window: u64,
    tag: u64,
    after: Snapshot,
}

impl<C: Clock> Sealed for SlidingWindow<C> {}

impl<C: Clock> Keyable for SlidingWindow<C> {
    type Config = SlidingWindowConfig;
    type Clock = C;
    type State = WindowCell;
    type Receipt = WindowReceipt;

    fn capacity(config: &SlidingWindowConfig) -> u32 {
        config.limit()
    }

    fn fresh(tag: u64) -> WindowCell {
        WindowCell::new(Win::empty(tag))
    }

    fn acquire(
        view: &View<'_, SlidingWindowConfig>,
        state: &WindowCell,
        now: u64,
        n: u32,
    ) -> Result<WindowReceipt, Refusal> {
        let geo = &view.current.geo;
        check_request(n, geo.limit())?;
        let mut win = state.lock();
        if let Some(carried) = resolve(view, &win, now)? {
            *win = carried;
        }
        let sub_window = win.decide(geo, now, n)?;
        Ok(WindowReceipt {
            sub_window,
            tag: win.tag,
            after: win.admitted(geo, now, sub_window),
        })
    }

    fn admitted(
        _view: &View<'_, SlidingWindowConfig>,
        receipt: WindowReceipt,
        _now: u64,
    ) -> Snapshot {
        receipt.after
    }

    fn peek(
        view: &View<'_, SlidingWindowConfig>,
        state: &WindowCell,
        now: u64,
        n: u32,
    ) -> Result<(), Refusal> {
        let geo = &view.current.geo;
        check_request(n, geo.limit())?;
        let win = state.lock();
        match resolve(view, &win, now)? {
            Some(carried) => carried.check(geo, now, n)?,
            None => win.check(geo, now, n)?,
        }
        Ok(())
    }

    fn refund(
        _view: &View<'_, SlidingWindowConfig>,
        state: &WindowCell,
        receipt: WindowReceipt,
        n: u32,
    ) {
        let mut win = state.lock();
        // A carry-over in between moved the counts to other sub-windows:
        // keep them.
        if win.tag == receipt.tag {
            win.refund(receipt.sub_window, n);
        }
    }

    fn fork(
        view: &View<'_, SlidingWindowConfig>,
        state: &WindowCell,
        now: u64,
    ) -> Option<WindowCell> {
        let win = state.lock();
        let forked = resolve(view, &win, now)
            .ok()?
            .unwrap_or_else(|| win.clone());
        Some(WindowCell::new(forked))
    }

    fn snapshot(
        view: &View<'_, SlidingWindowConfig>,
        state: &WindowCell,
        now: u64,
    ) -> Option<Snapshot> {
        let win = state.lock();
        let geo = &view.current.geo;
        Some(match resolve(view, &win, now).ok()? {
            Some(carried) => carried.snapshot(geo, now),
            None => win.snapshot(geo, now),
        })
    }

    fn is_fresh(
        view: &View<'_, SlidingWindowConfig>,
        state: &WindowCell,
        now: u64,
    ) -> Option<bool> {
        let win = state.lock();
        let geo = &view.current.geo;
        Some(match resolve(view, &win, now).ok()? {
            Some(carried) => carried.is_fresh(geo, now),
            None => win.is_fresh(geo, now),
        })
    }

    fn settle(view: &View<'_, SlidingWindowConfig>, state: &WindowCell, now: u64) -> bool {
        let mut win = state.lock();
        match resolve(view, &win, now) {
            Ok(Some(carried)) => {
                *win = carried;
                true
            }
            Ok(None) => true,
            Err(_) => false,
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// The per-key header: the counts' pointer and length, three words and
    /// the lock (one byte, padded to a word).
    #[test]
    fn the_per_key_header_is_forty_eight_bytes() {
        assert_eq!(std::mem::size_of::<WindowCell>(), 48);
    }

    fn cfg(limit: u32, ms: u64, subs: u32) -> SlidingWindowConfig {
        SlidingWindowConfig::with_sub_windows(Rate::new(limit, Duration::from_millis(ms)), subs)
            .unwrap()
    }

    /// A window holding only charges that have left it carries to a new
    /// one under every strategy, even into a longer window.
    #[test]
    fn a_fresh_window_carries_to_a_new_one() {
        let (a, b) = (cfg(4, 100, 4), cfg(9, 1_000, 5));
        let mut win = Win::empty(0);
        win.decide(&a.geo, 10_000_000, 3).unwrap();
        let now = 200_000_000;
        assert!(win.is_fresh(&a.geo, now));
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
        let mut win = Win::empty(0);
        win.decide(&a.geo, 10_000_000, 2).unwrap();
        win.decide(&a.geo, 60_000_000, 1).unwrap();
        for carry in [Carry::Proportional, Carry::Additive] {
            let carried = win.carried(&a, &a, 70_000_000, carry);
            assert_eq!(carried.newest, win.newest);
            assert_eq!(carried.total, 3);
            for i in 0..=win.newest {
                assert_eq!(carried.charge(i), win.charge(i), "sub-window {i}");
            }
        }
    }
}
