//! Global quota at local speed: a process takes **leases** — batches of
//! permits debited at once from a global GCRA budget in Redis — and spends
//! them locally with one atomic compare-and-swap per decision, the way
//! tollgate's striped limiters lease budget to per-core stripes.
//!
//! * **Exact globally.** A lease is debited in Redis (by `lease.lua`, at
//!   server `TIME`, on the same `<prefix>:{key}:tb` state as
//!   [`TokenBucket`]) before any of its permits is spent.
//!   The permits every process spends never exceed what was debited, so all
//!   processes together stay within the bucket's promise by lease time: at
//!   most `capacity + (b − a)/interval` permits leased in any `[a, b]`.
//! * **Never waits.** A background tokio task takes the next lease when the
//!   local pool falls to its low-water mark (half the last lease), so
//!   decisions only ever read and write local atomics.
//! * **Adaptive sizes.** Each lease asks for the permits the process spent in
//!   the last [`LeaseOptions::horizon`], clamped to
//!   `[1, LeaseOptions::max_lease]`. When fewer than
//!   the low-water mark of [`LeaseOptions::tail`] is left globally, the script
//!   grants at most `ceil(left / share)`, spreading the tail over processes.
//! * **Bounded lifetime, return.** A pool expires [`LeaseOptions::lifetime`]
//!   after its last lease; expired and, on [`LeasedLimiter::shutdown`] or
//!   drop, unused permits go back by `lease_return.lua` — exactly, while
//!   that lease is still the budget's last debit, otherwise they are
//!   forfeited (under-admission, never over-admission).
//! * **Degradation.** Every call has the client's timeout; after
//!   [`LeaseOptions::breaker`]'s failures in a row the limiter stops calling
//!   Redis, probes it after the cooldown, and meanwhile applies the
//!   [`Policy`]: deny, admit, or a local tollgate limiter holding the
//!   process's share. [`LeasedLimiter::mode`] and the mode callback say which.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use tollgate::Rate;
//! use tollgate_redis::{Client, LeaseOptions, LeasedLimiter, Policy, TokenBucket};
//!
//! let client = Client::connect("redis://127.0.0.1:6379/").await?;
//! let global = TokenBucket::new(10_000, Rate::per_second(50_000))?;
//! let local = tollgate::TokenBucket::new(2_500, Rate::per_second(12_500))?;
//! let options = LeaseOptions::new().policy(Policy::Local(Box::new(local)));
//! let mut limiter = LeasedLimiter::start(client, global, "api", options);
//! if limiter.try_acquire().is_ok() {
//!     // serve
//! }
//! limiter.shutdown().await; // hands unused permits back
//! # Ok(()) }
//! ```

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use redis::{Script, Value};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tollgate::{Denied, RateLimiter};

use crate::breaker::Breaker;
use crate::client::Client;
use crate::error::Error;
use crate::limiter::Limiter;
use crate::token_bucket::TokenBucket;

static LEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("lua/now_server.lua"),
        include_str!("lua/common.lua"),
        include_str!("lua/lease.lua")
    ))
});

static RETURN: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("lua/now_server.lua"),
        include_str!("lua/common.lua"),
        include_str!("lua/lease_return.lua")
    ))
});

/// What a leased limiter does while Redis is unreachable (its breaker open).
pub enum Policy {
    /// Deny every request the pool cannot cover: [`Error::Unavailable`].
    Closed,
    /// Admit every request the pool cannot cover.
    Open,
    /// Decide by this in-process limiter, configured with the process's share
    /// of the global limit (§4.4 of Jianfeng Fu's "Throttling Solutions in
    /// Standalone and Distributed Scenarios": "switch to standalone throttling").
    Local(Box<dyn RateLimiter + Send + Sync>),
}

impl std::fmt::Debug for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Policy::Closed => "Closed",
            Policy::Open => "Open",
            Policy::Local(_) => "Local(..)",
        })
    }
}

/// Which source of permits a leased limiter is deciding from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Leases from Redis: the global limit holds.
    Leased,
    /// Redis is unreachable: the [`Policy`] decides.
    Degraded,
}

/// A leased limiter's configuration.
///
/// ```
/// use std::time::Duration;
/// use tollgate_redis::LeaseOptions;
/// let options = LeaseOptions::new().max_lease(500).lifetime(Duration::from_secs(2));
/// # let _ = options;
/// ```
pub struct LeaseOptions {
    initial_lease: u32,
    max_lease: u32,
    horizon: Duration,
    lifetime: Duration,
    low_water_global: u32,
    share: u32,
    breaker: (u32, Duration),
    policy: Policy,
    record: bool,
    on_mode: Option<Arc<dyn Fn(Mode) + Send + Sync>>,
}

impl std::fmt::Debug for LeaseOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseOptions")
            .field("initial_lease", &self.initial_lease)
            .field("max_lease", &self.max_lease)
            .field("horizon", &self.horizon)
            .field("lifetime", &self.lifetime)
            .field("tail", &(self.low_water_global, self.share))
            .field("breaker", &self.breaker)
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl Default for LeaseOptions {
    fn default() -> Self {
        LeaseOptions {
            initial_lease: 16,
            max_lease: 4096,
            horizon: Duration::from_millis(100),
            lifetime: Duration::from_secs(1),
            low_water_global: 0,
            share: 4,
            breaker: (3, Duration::from_millis(500)),
            policy: Policy::Closed,
            record: false,
            on_mode: None,
        }
    }
}

impl LeaseOptions {
    /// Defaults: first lease 16, at most 4096, sized to 100 ms of measured
    /// use, 1 s lifetime, tail sharing below 10% of the capacity in quarters,
    /// breaker open after 3 failures for 500 ms, [`Policy::Closed`].
    ///
    /// ```
    /// let options = tollgate_redis::LeaseOptions::new();
    /// # let _ = options;
    /// ```
    pub fn new() -> Self {
        Self::default()
    }

    /// The first lease's size (at least 1).
    ///
    /// ```
    /// let options = tollgate_redis::LeaseOptions::new().initial_lease(100);
    /// # let _ = options;
    /// ```
    pub fn initial_lease(mut self, permits: u32) -> Self {
        self.initial_lease = permits.max(1);
        self
    }

    /// The largest lease (at least 1): what one process can strand.
    ///
    /// ```
    /// let options = tollgate_redis::LeaseOptions::new().max_lease(1000);
    /// # let _ = options;
    /// ```
    pub fn max_lease(mut self, permits: u32) -> Self {
        self.max_lease = permits.max(1);
        self
    }

    /// How much measured consumption a lease covers.
    ///
    /// ```
    /// let options = tollgate_redis::LeaseOptions::new().horizon(std::time::Duration::from_millis(50));
    /// # let _ = options;
    /// ```
    pub fn horizon(mut self, horizon: Duration) -> Self {
        self.horizon = horizon;
        self
    }

    /// How long a lease's permits may be spent.
    ///
    /// ```
    /// let options = tollgate_redis::LeaseOptions::new().lifetime(std::time::Duration::from_secs(5));
    /// # let _ = options;
    /// ```
    pub fn lifetime(mut self, lifetime: Duration) -> Self {
        self.lifetime = lifetime;
        self
    }

    /// Below this many permits left globally, leases shrink to
    /// `ceil(left / share)` (`share` at least 1). Default: 10% of the
    /// bucket's capacity, quarters.
    ///
    /// ```
    /// let options = tollgate_redis::LeaseOptions::new().tail(1_000, 8);
    /// # let _ = options;
    /// ```
    pub fn tail(mut self, low_water_global: u32, share: u32) -> Self {
        self.low_water_global = low_water_global;
        self.share = share.max(1);
        self
    }

    /// Open the breaker after `failures` failed calls in a row, probe after
    /// `cooldown`.
    ///
    /// ```
    /// let options = tollgate_redis::LeaseOptions::new().breaker(5, std::time::Duration::from_secs(1));
    /// # let _ = options;
    /// ```
    pub fn breaker(mut self, failures: u32, cooldown: Duration) -> Self {
        self.breaker = (failures, cooldown);
        self
    }

    /// What to do while Redis is unreachable.
    ///
    /// ```
    /// let options = tollgate_redis::LeaseOptions::new().policy(tollgate_redis::Policy::Open);
    /// # let _ = options;
    /// ```
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
    }

    /// Keep every lease in [`LeasedLimiter::leases`] (for audits and tests:
    /// memory grows with the leases taken).
    ///
    /// ```
    /// let options = tollgate_redis::LeaseOptions::new().record_leases(true);
    /// # let _ = options;
    /// ```
    pub fn record_leases(mut self, record: bool) -> Self {
        self.record = record;
        self
    }

    /// Called (from the background task) whenever the mode changes.
    ///
    /// ```
    /// let options = tollgate_redis::LeaseOptions::new().on_mode(|mode| eprintln!("limiter: {mode:?}"));
    /// # let _ = options;
    /// ```
    pub fn on_mode(mut self, callback: impl Fn(Mode) + Send + Sync + 'static) -> Self {
        self.on_mode = Some(Arc::new(callback));
        self
    }
}

/// One lease as Redis granted it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseRecord {
    /// Server time of the debit, µs since the Unix epoch.
    pub time_us: u64,
    /// Permits debited.
    pub granted: u64,
    /// Of those, permits given back exactly (the net debit is the difference).
    pub returned: u64,
}

/// Counters of a leased limiter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct LeaseStats {
    /// Leases granted.
    pub leases: u64,
    /// Permits debited in Redis.
    pub leased: u64,
    /// Permits given back exactly.
    pub returned: u64,
    /// Unused permits that could not be given back (expired or dropped after
    /// another debit): the under-admission this process caused.
    pub forfeited: u64,
    /// Permits admitted from leases.
    pub spent: u64,
    /// Permits admitted or denied by the policy while degraded.
    pub degraded_decisions: u64,
    /// Calls made to Redis (leases, returns, probes), failed ones included.
    pub redis_calls: u64,
}

/// The decision path's state, shared with the background task.
struct Shared {
    pool: AtomicU64,
    /// Nanoseconds since `epoch` after which the pool may not be spent.
    deadline: AtomicU64,
    low_water: AtomicU64,
    spent: AtomicU64,
    degraded: AtomicBool,
    stopping: AtomicBool,
    /// 0: idle, 1: a refill is wanted.
    wanted: AtomicU8,
    degraded_decisions: AtomicU64,
    capacity: u32,
    interval_us: u64,
    policy: Policy,
    epoch: Instant,
    wake: Notify,
    book: Mutex<Book>,
}

/// The background task's records (never touched by decisions).
#[derive(Default)]
struct Book {
    stats: LeaseStats,
    leases: Vec<LeaseRecord>,
    /// The last lease's TAT, index in `leases` and size, for an exact return.
    last: Option<(u64, usize, u64)>,
}

/// A limiter that spends leases of a global Redis budget locally. See the
/// [module docs](self).
pub struct LeasedLimiter {
    shared: Arc<Shared>,
    task: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for LeasedLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeasedLimiter")
            .field("mode", &self.mode())
            .field("pool", &self.shared.pool.load(Ordering::Relaxed))
            .finish()
    }
}

impl LeasedLimiter {
    /// Starts leasing from `bucket`'s state for `key` (the same Redis key a
    /// [`Client::try_acquire`] on `bucket` uses, so both kinds of client
    /// share one limit). Spawns the refill task: call inside a tokio runtime.
    ///
    /// ```no_run
    /// # async fn demo(client: tollgate_redis::Client) -> Result<(), Box<dyn std::error::Error>> {
    /// use tollgate::Rate;
    /// use tollgate_redis::{LeaseOptions, LeasedLimiter, TokenBucket};
    /// let bucket = TokenBucket::new(1_000, Rate::per_second(10_000))?;
    /// let limiter = LeasedLimiter::start(client, bucket, "search", LeaseOptions::new());
    /// # let _ = limiter; Ok(()) }
    /// ```
    pub fn start(
        client: Client,
        bucket: TokenBucket,
        key: &str,
        options: LeaseOptions,
    ) -> LeasedLimiter {
        let interval_us = u64::try_from(bucket.emission_interval().as_micros()).unwrap_or(u64::MAX);
        let capacity = bucket.capacity();
        let shared = Arc::new(Shared {
            pool: AtomicU64::new(0),
            deadline: AtomicU64::new(0),
            low_water: AtomicU64::new(u64::from(options.initial_lease / 2)),
            spent: AtomicU64::new(0),
            degraded: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            wanted: AtomicU8::new(1),
            degraded_decisions: AtomicU64::new(0),
            capacity,
            interval_us,
            policy: options.policy,
            epoch: Instant::now(),
            wake: Notify::new(),
            book: Mutex::new(Book::default()),
        });
        let redis_key = bucket.redis_key(key);
        let low_water_global = if options.low_water_global == 0 {
            (capacity / 10).max(1)
        } else {
            options.low_water_global
        };
        let refill = Refill {
            shared: shared.clone(),
            client,
            redis_key,
            tolerance: interval_us.saturating_mul(u64::from(capacity)),
            want: u64::from(options.initial_lease.min(options.max_lease)),
            max_lease: u64::from(options.max_lease),
            horizon: options.horizon,
            lifetime: options.lifetime,
            low_water_global: u64::from(low_water_global),
            share: u64::from(options.share),
            breaker: Breaker::new(options.breaker.0, options.breaker.1),
            record: options.record,
            on_mode: options.on_mode,
            measured_at: Instant::now(),
            measured_spent: 0,
        };
        let task = tokio::spawn(refill.run());
        LeasedLimiter {
            shared,
            task: Some(task),
        }
    }

    /// One permit: see [`LeasedLimiter::try_acquire_n`].
    ///
    /// ```no_run
    /// # fn demo(limiter: &tollgate_redis::LeasedLimiter) {
    /// if limiter.try_acquire().is_ok() { /* serve */ }
    /// # }
    /// ```
    pub fn try_acquire(&self) -> Result<(), Error> {
        self.try_acquire_n(1)
    }

    /// `n` permits from the local pool, all or none, without waiting: a few
    /// atomic operations, never a Redis call. When the pool cannot cover `n`:
    /// in [`Mode::Leased`], [`Error::Denied`] (`RetryAfter` one emission
    /// interval per permit, a hint: a refill is on its way); in
    /// [`Mode::Degraded`], the [`Policy`].
    ///
    /// ```no_run
    /// # fn demo(limiter: &tollgate_redis::LeasedLimiter) {
    /// match limiter.try_acquire_n(3) {
    ///     Ok(()) => println!("serve"),
    ///     Err(e) if e.is_denied() => println!("429"),
    ///     Err(e) => println!("unavailable: {e}"),
    /// }
    /// # }
    /// ```
    pub fn try_acquire_n(&self, n: u32) -> Result<(), Error> {
        let shared = &*self.shared;
        if n == 0 {
            return Err(Error::Denied(Denied::ZeroPermits));
        }
        if n > shared.capacity {
            return Err(Error::Denied(Denied::ExceedsCapacity {
                requested: n,
                capacity: shared.capacity,
            }));
        }
        let now = shared.epoch.elapsed().as_nanos() as u64;
        // Relaxed: the deadline is a bound the refill task also enforces by
        // emptying the pool; a stale value only moves a spend by the time the
        // store takes to become visible, and never creates a permit.
        let fresh = now < shared.deadline.load(Ordering::Relaxed);
        let n64 = u64::from(n);
        // Relaxed is enough for the pool: it is one counter whose every
        // change is a read-modify-write, so no decrement is lost and none
        // goes below zero; nothing else is published through it.
        let taken = fresh
            && shared
                .pool
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |p| p.checked_sub(n64))
                .map(|before| {
                    if before - n64 <= shared.low_water.load(Ordering::Relaxed) {
                        self.want_refill();
                    }
                })
                .is_ok();
        if taken {
            // Relaxed: a statistic, read for the lease size only.
            shared.spent.fetch_add(n64, Ordering::Relaxed);
            return Ok(());
        }
        self.want_refill();
        // Relaxed: the mode is advisory; either answer is a valid decision.
        if shared.degraded.load(Ordering::Relaxed) {
            shared.degraded_decisions.fetch_add(1, Ordering::Relaxed);
            return match &shared.policy {
                Policy::Closed => Err(Error::Unavailable),
                Policy::Open => Ok(()),
                Policy::Local(local) => local.try_acquire_n(n).map_err(Error::Denied),
            };
        }
        Err(Error::Denied(Denied::RetryAfter(Duration::from_micros(
            shared.interval_us.saturating_mul(n64),
        ))))
    }

    fn want_refill(&self) {
        // Relaxed: the swap only dedups wake-ups; Notify orders the rest.
        if self.shared.wanted.swap(1, Ordering::Relaxed) == 0 {
            self.shared.wake.notify_one();
        }
    }

    /// Where permits come from now.
    ///
    /// ```no_run
    /// # fn demo(limiter: &tollgate_redis::LeasedLimiter) {
    /// if limiter.mode() == tollgate_redis::Mode::Degraded { eprintln!("Redis is down"); }
    /// # }
    /// ```
    pub fn mode(&self) -> Mode {
        // Relaxed: a report, as current as a load can be.
        if self.shared.degraded.load(Ordering::Relaxed) {
            Mode::Degraded
        } else {
            Mode::Leased
        }
    }

    /// Permits in the local pool now.
    ///
    /// ```no_run
    /// # fn demo(limiter: &tollgate_redis::LeasedLimiter) {
    /// println!("{} permits on hand", limiter.pool());
    /// # }
    /// ```
    pub fn pool(&self) -> u64 {
        // Relaxed: a report.
        self.shared.pool.load(Ordering::Relaxed)
    }

    /// The counters so far.
    ///
    /// ```no_run
    /// # fn demo(limiter: &tollgate_redis::LeasedLimiter) {
    /// let stats = limiter.stats();
    /// println!("{} Redis calls for {} permits", stats.redis_calls, stats.spent);
    /// # }
    /// ```
    pub fn stats(&self) -> LeaseStats {
        let mut stats = self
            .shared
            .book
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .stats;
        // Relaxed: counters read for a report.
        stats.spent = self.shared.spent.load(Ordering::Relaxed);
        stats.degraded_decisions = self.shared.degraded_decisions.load(Ordering::Relaxed);
        stats
    }

    /// Every lease taken, if [`LeaseOptions::record_leases`] was set.
    ///
    /// ```no_run
    /// # fn demo(limiter: &tollgate_redis::LeasedLimiter) {
    /// let net: u64 = limiter.leases().iter().map(|l| l.granted - l.returned).sum();
    /// # let _ = net; }
    /// ```
    pub fn leases(&self) -> Vec<LeaseRecord> {
        self.shared
            .book
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .leases
            .clone()
    }

    /// Stops leasing, empties the pool and gives its permits back (exactly
    /// if the last lease is still the budget's last debit), within the
    /// client's timeout. Returns the final counters. Afterwards the pool
    /// stays empty: decisions are denied (or, if degraded, left to the
    /// policy).
    ///
    /// ```no_run
    /// # async fn demo(mut limiter: tollgate_redis::LeasedLimiter) {
    /// let stats = limiter.shutdown().await;
    /// println!("returned {} permits", stats.returned);
    /// # }
    /// ```
    pub async fn shutdown(&mut self) -> LeaseStats {
        self.stop();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
        self.stats()
    }

    fn stop(&self) {
        // Relaxed: Notify's permit carries the wake-up; the task re-reads
        // the flag after every wake.
        self.shared.stopping.store(true, Ordering::Relaxed);
        self.shared.wake.notify_one();
    }
}

impl Drop for LeasedLimiter {
    /// The task returns the unused permits on its own (if the runtime lives).
    fn drop(&mut self) {
        if self.task.is_some() {
            self.stop();
        }
    }
}

/// The background task: leases, expiry, returns, the breaker.
struct Refill {
    shared: Arc<Shared>,
    client: Client,
    redis_key: String,
    tolerance: u64,
    want: u64,
    max_lease: u64,
    horizon: Duration,
    lifetime: Duration,
    low_water_global: u64,
    share: u64,
    breaker: Breaker,
    record: bool,
    on_mode: Option<Arc<dyn Fn(Mode) + Send + Sync>>,
    measured_at: Instant,
    measured_spent: u64,
}

enum Leased {
    Granted,
    Exhausted(Duration),
    Failed,
}

impl Refill {
    async fn run(mut self) {
        loop {
            if self.shared.stopping.load(Ordering::Relaxed) {
                break;
            }
            let now = Instant::now();
            let deadline = self.deadline_instant();
            let expired = now >= deadline;
            if expired {
                self.give_back().await;
            }
            // Relaxed: see want_refill.
            let wanted = self.shared.wanted.swap(0, Ordering::Relaxed) == 1;
            // An expired pool is refilled only on demand: an idle process
            // holds no lease.
            let low = !expired
                && self.shared.pool.load(Ordering::Relaxed)
                    <= self.shared.low_water.load(Ordering::Relaxed);
            // Nothing to expire: sleep until asked.
            let mut sleep_for = if expired {
                Duration::from_millis(50)
            } else {
                deadline.saturating_duration_since(Instant::now())
            };
            if (wanted || low) && self.breaker.allows(Instant::now()) {
                match self.lease().await {
                    Leased::Granted => continue,
                    Leased::Exhausted(wait) => sleep_for = wait.max(Duration::from_micros(100)),
                    Leased::Failed => sleep_for = Duration::from_millis(10),
                }
                // Asked again while we were away: the sleep ends at once.
                self.shared.wanted.store(1, Ordering::Relaxed);
            }
            let sleep_for = sleep_for.clamp(Duration::from_micros(100), Duration::from_millis(50));
            let _ = tokio::time::timeout(sleep_for, self.shared.wake.notified()).await;
        }
        self.give_back().await;
    }

    fn deadline_instant(&self) -> Instant {
        self.shared.epoch + Duration::from_nanos(self.shared.deadline.load(Ordering::Relaxed))
    }

    /// The next lease's size: what was spent over the last horizon.
    fn size(&mut self) -> u64 {
        let now = Instant::now();
        let elapsed = now.duration_since(self.measured_at);
        if elapsed >= self.horizon / 4 {
            let spent = self.shared.spent.load(Ordering::Relaxed);
            let rate = (spent - self.measured_spent) as f64 / elapsed.as_secs_f64();
            let target = (rate * self.horizon.as_secs_f64()).ceil() as u64;
            // Move halfway: one burst or lull does not swing the size.
            self.want = (self.want + target).div_ceil(2).clamp(1, self.max_lease);
            self.measured_at = now;
            self.measured_spent = spent;
        }
        self.want
    }

    async fn lease(&mut self) -> Leased {
        let want = self.size();
        let args = [
            want,
            self.shared.interval_us,
            self.tolerance,
            self.low_water_global,
            self.share,
        ];
        let reply = self.client.eval(&LEASE, &self.redis_key, &args).await;
        self.book().stats.redis_calls += 1;
        let items = match reply.and_then(ints) {
            Ok(items) => items,
            Err(_) => {
                self.failed();
                return Leased::Failed;
            }
        };
        self.recovered();
        match items.as_slice() {
            [1, time, granted, tat] => {
                let (time, granted, tat) = (*time as u64, *granted as u64, *tat as u64);
                // The pool's new deadline first, then the permits: a spender
                // that sees the permits with the old deadline only denies.
                let deadline = self.shared.epoch.elapsed() + self.lifetime;
                self.shared
                    .deadline
                    .store(deadline.as_nanos() as u64, Ordering::Relaxed);
                self.shared.low_water.store(want / 2, Ordering::Relaxed);
                // Relaxed: see try_acquire_n; the permits were debited in
                // Redis before this line runs.
                self.shared.pool.fetch_add(granted, Ordering::Relaxed);
                let record = self.record;
                let mut book = self.book();
                book.stats.leases += 1;
                book.stats.leased += granted;
                let index = book.leases.len();
                if record {
                    book.leases.push(LeaseRecord {
                        time_us: time,
                        granted,
                        returned: 0,
                    });
                }
                book.last = Some((tat, index, granted));
                Leased::Granted
            }
            [0, _, _, wait] => Leased::Exhausted(Duration::from_micros(*wait as u64)),
            _ => Leased::Failed,
        }
    }

    /// Empties the pool and returns what it held.
    async fn give_back(&mut self) {
        // Relaxed: the swap is the pool's last change; see try_acquire_n.
        let unused = self.shared.pool.swap(0, Ordering::Relaxed);
        if unused == 0 {
            return;
        }
        let last = self.book().last.take();
        let returned = match last {
            Some((tat, index, granted)) if self.breaker.allows(Instant::now()) => {
                // The pool may hold permits carried over from older leases:
                // only the last lease's debit can be undone, and only up to
                // its size.
                let args = [unused.min(granted), self.shared.interval_us, tat];
                let reply = self.client.eval(&RETURN, &self.redis_key, &args).await;
                self.book().stats.redis_calls += 1;
                match reply.and_then(ints).as_deref() {
                    Ok([1, _, returned, _]) => {
                        let returned = *returned as u64;
                        let mut book = self.book();
                        if let Some(lease) = book.leases.get_mut(index) {
                            lease.returned = returned;
                        }
                        returned
                    }
                    _ => 0,
                }
            }
            _ => 0,
        };
        let mut book = self.book();
        book.stats.returned += returned;
        book.stats.forfeited += unused - returned;
    }

    fn book(&self) -> std::sync::MutexGuard<'_, Book> {
        self.shared.book.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn failed(&mut self) {
        self.breaker.failure(Instant::now());
        if self.breaker.is_open() && !self.shared.degraded.swap(true, Ordering::Relaxed) {
            if let Some(callback) = &self.on_mode {
                callback(Mode::Degraded);
            }
        }
    }

    fn recovered(&mut self) {
        self.breaker.success();
        // Relaxed: the mode is advisory (see try_acquire_n).
        if self.shared.degraded.swap(false, Ordering::Relaxed) {
            if let Some(callback) = &self.on_mode {
                callback(Mode::Leased);
            }
        }
    }
}

/// A script's reply as integers.
fn ints(reply: Value) -> Result<Vec<i64>, Error> {
    let Value::Array(items) = reply else {
        return Err(Error::UnexpectedReply(format!("{reply:?}")));
    };
    items
        .into_iter()
        .map(|item| match item {
            Value::Int(v) => Ok(v),
            other => Err(Error::UnexpectedReply(format!("{other:?}"))),
        })
        .collect()
}
