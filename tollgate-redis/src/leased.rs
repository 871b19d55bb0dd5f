//! Global quota at local speed: a process takes **leases** — batches of
//! permits debited at once from a global GCRA budget in Redis — and spends
//! them locally with one atomic compare-and-swap per decision, the way
//! tollgate's striped limiters lease budget to per-core stripes.
//!
//! * **Exact globally.** A lease is debited in Redis (by `lease.lua`, at
//!   server `TIME`, on the same `<prefix>:<name>:{<key>}:tb` state as
//!   [`TokenBucket`]) before any of its permits is spent.
//!   The permits every process spends never exceed what was debited, so all
//!   processes together stay within the bucket's promise by lease time: at
//!   most `capacity + (b − a)/interval` permits leased in any `[a, b]`.
//! * **Local decisions.** A background tokio task takes the next lease when
//!   the local pool falls to its low-water mark (half the last lease), so
//!   [`LeasedLimiter::try_acquire_n`] only ever reads and writes local
//!   atomics.
//! * **A cold pool is one round trip, not a refusal.** A pool that is empty
//!   or expired (after an idle spell) would refuse a request although the
//!   global budget has room. [`LeasedLimiter::try_acquire_n_waiting`]
//!   (async) and [`LeasedLimiter::try_acquire_n_blocking`] (a blocking
//!   thread) wait instead for the next lease call, at most the client's
//!   timeout ([`Options::timeout`](crate::Options::timeout)); requests that
//!   find the pool cold at the same time share that one call, and the lease
//!   is sized to cover them all. If the call fails, they get the
//!   [`Policy`]'s decision. The lifetime still bounds how long permits sit
//!   in a pool.
//! * **Rate-limited by the budget it refills.** When a lease call finds the
//!   budget exhausted — or a grant empties it — the limiter knows when the
//!   next permit is due (the script's retry-after) and makes no call before
//!   then, however many requests it refuses meanwhile: with the budget
//!   exhausted a process makes about one lease call per retry-after.
//!   Requests refused meanwhile, waiting ones included, get that retry-after
//!   (plus one emission interval per further permit) at once. Permits that
//!   another process gives back meanwhile are found at the next call, at most
//!   one emission interval later (under-admission, never over-admission).
//! * **Adaptive sizes.** Each lease asks for the permits the process spent in
//!   the last [`LeaseOptions::horizon`], clamped to
//!   `[1, LeaseOptions::max_lease]`, or for what the requests waiting on it
//!   ask, if more (at most the capacity). When fewer than
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
//! let global = TokenBucket::new("api", 10_000, Rate::per_second(50_000))?;
//! let local = tollgate::TokenBucket::new(2_500, Rate::per_second(12_500))?;
//! let options = LeaseOptions::new().policy(Policy::Local(Box::new(local)));
//! let mut limiter = LeasedLimiter::start(client, global, "api", options);
//! // Local atomics only; refused while the pool is cold.
//! if limiter.try_acquire().is_ok() {
//!     // serve
//! }
//! // The same, but a cold pool waits for one lease call instead of refusing.
//! if limiter.try_acquire_n_waiting(1).await.is_ok() {
//!     // serve
//! }
//! limiter.shutdown().await; // hands unused permits back
//! # Ok(()) }
//! ```

use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tollgate::{Denied, RateLimiter, check_request};

use crate::breaker::Breaker;
use crate::client::Client;
use crate::error::Error;
use crate::lease_script::{self, Terms, give_back, lease};
#[cfg(feature = "test-time")]
pub use crate::lease_script::{LeaseReply, ReturnReply};
use crate::limiter::Limiter;
use crate::token_bucket::TokenBucket;

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
    /// Of those, lease calls (granted, refused or failed).
    pub lease_calls: u64,
    /// Lease calls that found the budget exhausted (no permit granted).
    pub exhausted_leases: u64,
    /// Requests that found the pool cold and waited for a lease call
    /// ([`LeasedLimiter::try_acquire_n_waiting`],
    /// [`LeasedLimiter::try_acquire_n_blocking`]).
    pub waits: u64,
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
    /// Nanoseconds since `epoch` before which the budget has no permit, as
    /// the last lease call said (0 or past: not known to be exhausted).
    exhausted_until: AtomicU64,
    /// Lease calls completed, shifted left by 2, and the last one's outcome
    /// in the low bits (`GRANTED`, `EXHAUSTED`, `FAILED`, `STOPPED`).
    attempt: AtomicU64,
    /// Permits asked for by the requests waiting for a lease.
    waiting: AtomicU64,
    /// The most lease calls completed that a waiting request saw without
    /// finding its permits: the task calls again while this is at least its
    /// own count.
    asked: AtomicU64,
    waits: AtomicU64,
    degraded_decisions: AtomicU64,
    capacity: u32,
    interval_us: u64,
    /// How long a request waits for a lease: the client's timeout.
    wait_limit: Duration,
    policy: Policy,
    epoch: Instant,
    /// The refill task's wake-up.
    wake: Notify,
    /// Wakes the waiting requests after each lease call.
    done: Notify,
    /// The runtime the refill task runs on, for the waiters' timers.
    runtime: tokio::runtime::Handle,
    book: Mutex<Book>,
}

const GRANTED: u64 = 0;
const EXHAUSTED: u64 = 1;
const FAILED: u64 = 2;
const STOPPED: u64 = 3;

impl Shared {
    fn now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    /// Takes `n` permits from a fresh pool, all or none.
    fn take(&self, n: u32, now: u64) -> bool {
        // Relaxed: the deadline is a bound the refill task also enforces by
        // emptying the pool; a stale value only moves a spend by the time the
        // store takes to become visible, and never creates a permit.
        if now >= self.deadline.load(Ordering::Relaxed) {
            return false;
        }
        let n64 = u64::from(n);
        // Relaxed is enough for the pool: it is one counter whose every
        // change is a read-modify-write, so no decrement is lost and none
        // goes below zero; nothing else is published through it.
        let Ok(before) = self
            .pool
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |p| p.checked_sub(n64))
        else {
            return false;
        };
        // Relaxed: a threshold; a stale one moves a refill by one decision.
        if before - n64 <= self.low_water.load(Ordering::Relaxed) {
            self.want_refill();
        }
        // Relaxed: a statistic, read for the lease size only.
        self.spent.fetch_add(n64, Ordering::Relaxed);
        true
    }

    fn want_refill(&self) {
        // Relaxed: the swap only dedups wake-ups; Notify orders the rest.
        // The load first keeps refusals from writing the shared line while
        // a refill is already wanted (the exhausted budget's steady state);
        // a stale 1 skips one wake-up, and the task looks again within
        // 50 ms or at the next request's.
        if self.wanted.load(Ordering::Relaxed) == 0 && self.wanted.swap(1, Ordering::Relaxed) == 0 {
            self.wake.notify_one();
        }
    }

    /// Whether waiting for a lease call can help: Redis is reachable, the
    /// budget is not known to be exhausted, the task still runs.
    fn can_wait(&self, now: u64) -> bool {
        // Relaxed: each flag is advisory; a stale one costs at most one
        // lease call's wait or one answer that a waiter would have got a
        // moment later anyway.
        !self.degraded.load(Ordering::Relaxed)
            && !self.stopping.load(Ordering::Relaxed)
            && self.exhausted_until.load(Ordering::Relaxed) <= now
    }

    /// The answer when the pool cannot cover `n`: the policy while degraded;
    /// otherwise a denial, with the script's retry-after while the budget is
    /// known to be exhausted, else one emission interval per permit (a hint).
    fn fallback(&self, n: u32, now: u64) -> Result<u32, Error> {
        // Relaxed: the mode is advisory; either answer is a valid decision.
        if self.degraded.load(Ordering::Relaxed) {
            return self.by_policy(n);
        }
        let n64 = u64::from(n);
        // Relaxed: a stale value gives the hint instead of the exact wait.
        let until = self.exhausted_until.load(Ordering::Relaxed);
        let wait = if until > now {
            // The first permit is due at `until`, each further one an
            // emission interval later: what the token bucket's script says.
            // A script's wait for one permit is at most one interval; the
            // cap keeps it so when `now` was read before a newer `until`.
            Duration::from_nanos(until - now)
                .min(Duration::from_micros(self.interval_us))
                .saturating_add(Duration::from_micros(
                    self.interval_us.saturating_mul(n64 - 1),
                ))
        } else {
            Duration::from_micros(self.interval_us.saturating_mul(n64))
        };
        Err(Error::Denied(Denied::RetryAfter(wait)))
    }

    /// The [`Policy`]'s decision: Redis did not answer. An admission takes
    /// nothing from the pool.
    fn by_policy(&self, n: u32) -> Result<u32, Error> {
        // Relaxed: a statistic.
        self.degraded_decisions.fetch_add(1, Ordering::Relaxed);
        match &self.policy {
            Policy::Closed => Err(Error::Unavailable),
            Policy::Open => Ok(0),
            Policy::Local(local) => local.try_acquire_n(n).map(|()| 0).map_err(Error::Denied),
        }
    }
}

/// The background task's records (never touched by decisions).
#[derive(Default)]
struct Book {
    stats: LeaseStats,
    leases: Vec<LeaseRecord>,
    /// The last lease's TAT, index in `leases` and size, for an exact return.
    last: Option<(u64, usize, u64)>,
    /// Why the last lease or return call failed, until one succeeds.
    last_error: Option<String>,
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
    /// The first lease is taken at once.
    ///
    /// ```no_run
    /// # async fn demo(client: tollgate_redis::Client) -> Result<(), Box<dyn std::error::Error>> {
    /// use tollgate::Rate;
    /// use tollgate_redis::{LeaseOptions, LeasedLimiter, TokenBucket};
    /// let bucket = TokenBucket::new("search", 1_000, Rate::per_second(10_000))?;
    /// let limiter = LeasedLimiter::start(client, bucket, "search", LeaseOptions::new());
    /// # let _ = limiter; Ok(()) }
    /// ```
    pub fn start(
        client: Client,
        bucket: TokenBucket,
        key: &str,
        options: LeaseOptions,
    ) -> LeasedLimiter {
        let [interval_us, tolerance_us] = bucket.terms();
        let capacity = bucket.capacity();
        let shared = Arc::new(Shared {
            pool: AtomicU64::new(0),
            deadline: AtomicU64::new(0),
            low_water: AtomicU64::new(u64::from(options.initial_lease / 2)),
            spent: AtomicU64::new(0),
            degraded: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            wanted: AtomicU8::new(1),
            exhausted_until: AtomicU64::new(0),
            attempt: AtomicU64::new(GRANTED),
            waiting: AtomicU64::new(0),
            asked: AtomicU64::new(0),
            waits: AtomicU64::new(0),
            degraded_decisions: AtomicU64::new(0),
            capacity,
            interval_us,
            wait_limit: client.options().get_timeout(),
            policy: options.policy,
            epoch: Instant::now(),
            wake: Notify::new(),
            done: Notify::new(),
            runtime: tokio::runtime::Handle::current(),
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
            name: key.to_owned(),
            redis_key,
            terms: Terms {
                interval_us,
                tolerance_us,
                low_water: u64::from(low_water_global),
                share: u64::from(options.share),
            },
            want: u64::from(options.initial_lease.min(options.max_lease)),
            max_lease: u64::from(options.max_lease),
            horizon: options.horizon,
            lifetime: options.lifetime,
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
    /// atomic operations, never a Redis call. When the pool cannot cover `n`
    /// (empty, or expired after an idle spell) the refill task is woken, and:
    /// in [`Mode::Leased`], [`Error::Denied`] — `RetryAfter` the script's
    /// wait while the budget is known to be exhausted (plus one emission
    /// interval per further permit), else one emission interval per permit,
    /// a hint: a refill is on its way; in [`Mode::Degraded`], the [`Policy`].
    ///
    /// A cold pool refuses here even while the global budget has room: use
    /// [`LeasedLimiter::try_acquire_n_waiting`] (async) or
    /// [`LeasedLimiter::try_acquire_n_blocking`] to wait for the lease
    /// instead.
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
        check_request(n, shared.capacity)?;
        let now = shared.now();
        if shared.take(n, now) {
            return Ok(());
        }
        shared.want_refill();
        shared.fallback(n, now).map(drop)
    }

    /// `n` permits, all or none, decided at once when it can be and
    /// otherwise handed back as a future that waits for one lease call.
    ///
    /// [`Attempt::Decided`] with what [`LeasedLimiter::try_acquire_n`] would
    /// answer when the pool covers `n`, when `n` can never pass, when
    /// degraded (the [`Policy`]), when the budget is known to be exhausted
    /// (a denial with the script's retry-after, and no call), or after
    /// [`LeasedLimiter::shutdown`]. Otherwise the pool is cold while the
    /// budget may have room: [`Attempt::Waiting`], whose [`LeaseWait`]
    /// resolves after the next lease call as
    /// [`LeasedLimiter::try_acquire_n_waiting`] describes. The lease call
    /// starts at once, whether or not the future is polled; dropping the
    /// future withdraws the request.
    ///
    /// This lets a caller that decides synchronously in the common case (an
    /// HTTP layer) allocate a future only on the cold path.
    ///
    /// ```no_run
    /// # async fn demo(limiter: &tollgate_redis::LeasedLimiter) {
    /// use tollgate_redis::leased::Attempt;
    /// let decision = match limiter.try_acquire_n_or_wait(1) {
    ///     Attempt::Decided(decision) => decision,
    ///     Attempt::Waiting(wait) => wait.await,
    /// };
    /// if decision.is_ok() { /* serve */ }
    /// # }
    /// ```
    pub fn try_acquire_n_or_wait(&self, n: u32) -> Attempt {
        match self.decide_or_wait(n) {
            Ok(decision) => Attempt::Decided(decision.map(drop)),
            Err(wait) => Attempt::Waiting(wait),
        }
    }

    /// The decision and the permits it took from the pool, or the wait for
    /// the next lease call.
    fn decide_or_wait(&self, n: u32) -> Result<Result<u32, Error>, LeaseWait> {
        let shared = &*self.shared;
        if let Err(never) = check_request(n, shared.capacity) {
            return Ok(Err(Error::Denied(never)));
        }
        let now = shared.now();
        if shared.take(n, now) {
            return Ok(Ok(n));
        }
        if !shared.can_wait(now) {
            shared.want_refill();
            return Ok(shared.fallback(n, now));
        }
        Err(LeaseWait::new(Registration::new(self.shared.clone(), n)))
    }

    /// [`LeasedLimiter::try_acquire_n`]'s decision (never waiting), with a
    /// [`LeaseReceipt`] that can hand the permits back to the pool.
    ///
    /// ```no_run
    /// # fn demo(leased: &tollgate_redis::LeasedLimiter) {
    /// if let Ok(receipt) = leased.try_acquire_n_receipt(1) {
    ///     leased.refund(receipt); // changed our mind: the pool has it back
    /// }
    /// # }
    /// ```
    pub fn try_acquire_n_receipt(&self, n: u32) -> Result<LeaseReceipt<'_>, Error> {
        let shared = &*self.shared;
        check_request(n, shared.capacity)?;
        let now = shared.now();
        let pooled = if shared.take(n, now) {
            n
        } else {
            shared.want_refill();
            shared.fallback(n, now)?
        };
        Ok(LeaseReceipt {
            limiter: self,
            pooled,
        })
    }

    /// Whether the pool holds a lease that has not expired (with permits
    /// left or not): `false` before the first lease and after an idle spell
    /// longer than [`LeaseOptions::lifetime`]. A caller can wait for a
    /// lease call only when this is `false` (a cold start, which a refusal
    /// would wrong) and refuse at once when a live pool ran dry (the budget
    /// is at its limit, and a refill is on its way).
    ///
    /// ```no_run
    /// # async fn demo(leased: &tollgate_redis::LeasedLimiter) {
    /// let decision = if leased.holds_lease() {
    ///     leased.try_acquire_n(1)
    /// } else {
    ///     leased.try_acquire_n_waiting(1).await
    /// };
    /// # let _ = decision; }
    /// ```
    pub fn holds_lease(&self) -> bool {
        // Relaxed: a report; see Shared::take.
        self.shared.now() < self.shared.deadline.load(Ordering::Relaxed)
    }

    /// [`LeasedLimiter::try_acquire_n_waiting`]'s decision, with a
    /// [`LeaseReceipt`] that can hand the permits back to the pool: for a caller
    /// that decides several limits all or nothing and learns after this one
    /// admitted that another refuses.
    ///
    /// ```no_run
    /// # async fn demo(leased: &tollgate_redis::LeasedLimiter, other: &tollgate::TokenBucket) {
    /// use tollgate::RateLimiter;
    /// if let Ok(receipt) = leased.try_acquire_n_receipt_waiting(1).await {
    ///     if other.try_acquire().is_err() {
    ///         leased.refund(receipt); // refused by the other: this one charges nothing
    ///     }
    /// }
    /// # }
    /// ```
    pub async fn try_acquire_n_receipt_waiting(&self, n: u32) -> Result<LeaseReceipt<'_>, Error> {
        let pooled = match self.decide_or_wait(n) {
            Ok(decision) => decision?,
            Err(wait) => wait.inner.await?,
        };
        Ok(LeaseReceipt {
            limiter: self,
            pooled,
        })
    }

    /// Hands the permits of `receipt` back to the local pool, where this
    /// process can spend them again: they stay debited in Redis, so a refund
    /// never creates a permit. Permits admitted by the [`Policy`] while
    /// degraded were taken from no pool: their refund does nothing (the
    /// [`Policy::Local`] limiter keeps its charge). A receipt of another
    /// limiter refunds nothing. Permits refunded after the pool expired are
    /// returned with it (or carried over by the next lease, as a lease taken
    /// before expiry carries the pool over).
    ///
    /// ```no_run
    /// # async fn demo(leased: &tollgate_redis::LeasedLimiter) {
    /// let before = leased.pool();
    /// let receipt = leased.try_acquire_n_receipt_waiting(2).await.unwrap();
    /// leased.refund(receipt);
    /// assert!(leased.pool() >= before);
    /// # }
    /// ```
    pub fn refund(&self, receipt: LeaseReceipt<'_>) {
        if receipt.pooled == 0 || !std::ptr::eq(receipt.limiter, self) {
            return;
        }
        let n = u64::from(receipt.pooled);
        // Relaxed: see Shared::take; the permits came out of this pool and
        // were debited in Redis before it held them.
        self.shared.pool.fetch_add(n, Ordering::Relaxed);
        // Relaxed: a statistic; `take` added these `n` before.
        self.shared.spent.fetch_sub(n, Ordering::Relaxed);
    }

    /// `n` permits, all or none; a cold pool waits for one lease call
    /// instead of refusing.
    ///
    /// When the pool covers `n`, this is [`LeasedLimiter::try_acquire_n`]
    /// and returns without yielding. When the pool is empty or expired and
    /// the budget may have room (Redis reachable, no lease call has found the
    /// budget exhausted with a retry-after still in the future), it wakes the
    /// refill task and waits for its next lease call — one call shared by
    /// every request waiting at the time, sized to cover them all (up to the
    /// capacity) — then takes its permits from the refilled pool. The
    /// permits it gets were debited in Redis like any others: waiting never
    /// admits more than was leased. The answer:
    ///
    /// * the permits, if the lease left enough in the pool;
    /// * if the lease call found the budget exhausted (or another process
    ///   spent it first): [`Error::Denied`] with the script's retry-after,
    ///   plus one emission interval per further permit;
    /// * if the call failed or timed out: the [`Policy`]'s decision
    ///   ([`Policy::Closed`]: [`Error::Unavailable`]), as while degraded —
    ///   Redis did not answer;
    /// * if other waiters took the lease's permits first, it waits for the
    ///   next call.
    ///
    /// It waits at most the client's timeout
    /// ([`Options::timeout`](crate::Options::timeout)) in all. If no lease
    /// call completed by then, the [`Policy`] decides; otherwise (its
    /// permits went to others) it answers as [`LeasedLimiter::try_acquire_n`]
    /// would. While the budget is known to be exhausted, while degraded and
    /// after shutdown it answers at once without a call. Cancel-safe:
    /// dropping the future withdraws the request and takes nothing.
    ///
    /// Needs the runtime the limiter was started on to be running (the
    /// refill task makes the call).
    ///
    /// ```no_run
    /// # async fn demo(limiter: &tollgate_redis::LeasedLimiter) {
    /// match limiter.try_acquire_n_waiting(2).await {
    ///     Ok(()) => println!("serve"),
    ///     Err(e) if e.is_denied() => println!("429"),
    ///     Err(e) => println!("unavailable: {e}"),
    /// }
    /// # }
    /// ```
    pub async fn try_acquire_n_waiting(&self, n: u32) -> Result<(), Error> {
        match self.try_acquire_n_or_wait(n) {
            Attempt::Decided(decision) => decision,
            Attempt::Waiting(wait) => wait.await,
        }
    }

    /// [`LeasedLimiter::try_acquire_n_waiting`] for synchronous code: the
    /// same decisions, blocking the calling thread for at most the client's
    /// timeout while a cold pool is refilled.
    ///
    /// Call it from a thread that is not running async tasks (a plain
    /// thread, or inside [`tokio::task::spawn_blocking`]). On a tokio worker
    /// thread it blocks that thread's tasks until it returns; on the thread
    /// that drives a current-thread runtime the refill task cannot run at
    /// all, so every cold call waits out the full timeout and then gets the
    /// [`Policy`]'s decision, as if Redis had not answered. It never panics.
    ///
    /// ```no_run
    /// # fn demo(limiter: std::sync::Arc<tollgate_redis::LeasedLimiter>) {
    /// std::thread::spawn(move || {
    ///     if limiter.try_acquire_n_blocking(1).is_ok() { /* serve */ }
    /// });
    /// # }
    /// ```
    pub fn try_acquire_n_blocking(&self, n: u32) -> Result<(), Error> {
        let shared = &*self.shared;
        check_request(n, shared.capacity)?;
        let now = shared.now();
        if shared.take(n, now) {
            return Ok(());
        }
        if !shared.can_wait(now) {
            shared.want_refill();
            return shared.fallback(n, now).map(drop);
        }
        let registration = Registration::new(self.shared.clone(), n);
        let deadline = Instant::now() + shared.wait_limit;
        match block_on_until(registration.wait(), deadline) {
            Some(decision) => decision.map(drop),
            None => registration.timed_out().map(drop),
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

    /// The quota as this process sees it, for a `RateLimit` field: the
    /// permits its pool holds now (what it can admit without a Redis call;
    /// 0 once the pool has expired), the global capacity, and the time the
    /// whole budget takes to refill from empty — an upper bound on the time
    /// until full, as the global state is not read. Other processes' pools
    /// and the budget left in Redis are not counted, so `available` is a
    /// lower bound of what the cluster could still grant.
    ///
    /// ```no_run
    /// # fn demo(limiter: &tollgate_redis::LeasedLimiter) {
    /// let report = limiter.report();
    /// println!("{} of {} held here", report.available, report.capacity);
    /// # }
    /// ```
    pub fn report(&self) -> tollgate::Snapshot {
        let shared = &*self.shared;
        // Relaxed: a report (see `pool`).
        let held = if shared.now() < shared.deadline.load(Ordering::Relaxed) {
            shared.pool.load(Ordering::Relaxed)
        } else {
            0
        };
        tollgate::Snapshot::new(
            u32::try_from(held).unwrap_or(u32::MAX).min(shared.capacity),
            shared.capacity,
            Duration::from_micros(u64::from(shared.capacity).saturating_mul(shared.interval_us)),
        )
    }

    /// Why the last lease (or return) call failed, while no call has
    /// succeeded since: a timeout, a refused connection, or a key the lease
    /// script will not decide on — another Redis type, or damaged state
    /// (`Error::UnknownState`, naming the key and the field). A damaged key
    /// opens the breaker as an outage does, so the [`Policy`] decides until
    /// the key is repaired or deleted; this says why.
    ///
    /// ```no_run
    /// # fn demo(limiter: &tollgate_redis::LeasedLimiter) {
    /// if let Some(why) = limiter.last_error() {
    ///     eprintln!("leasing is failing: {why}");
    /// }
    /// # }
    /// ```
    pub fn last_error(&self) -> Option<String> {
        self.shared
            .book
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .last_error
            .clone()
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
        stats.waits = self.shared.waits.load(Ordering::Relaxed);
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
        // Waiters re-read `stopping` after every wake-up and answer at once.
        self.shared.done.notify_waiters();
    }
}

/// Permits a [`LeasedLimiter`] admitted, which
/// [`LeasedLimiter::refund`] can hand back to its pool; dropped, they stay
/// spent.
#[derive(Debug)]
#[must_use = "dropping a receipt keeps the permits spent; refund() hands them back"]
pub struct LeaseReceipt<'a> {
    limiter: &'a LeasedLimiter,
    /// The permits taken from the pool (0: admitted by the policy).
    pooled: u32,
}

impl LeaseReceipt<'_> {
    /// The permits this admission took from the local pool: what a refund
    /// hands back (0 for an admission by the [`Policy`] while degraded).
    pub fn pooled(&self) -> u32 {
        self.pooled
    }
}

/// What [`LeasedLimiter::try_acquire_n_or_wait`] found.
#[must_use = "a waiting attempt decides nothing until it is awaited"]
pub enum Attempt {
    /// Decided without waiting.
    Decided(Result<(), Error>),
    /// The pool is cold and the budget may have room: the decision after
    /// the next lease call.
    Waiting(LeaseWait),
}

impl std::fmt::Debug for Attempt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Attempt::Decided(decision) => f.debug_tuple("Decided").field(decision).finish(),
            Attempt::Waiting(_) => f.write_str("Waiting(..)"),
        }
    }
}

/// A request waiting for a lease call: resolves as
/// [`LeasedLimiter::try_acquire_n_waiting`] describes, within the client's
/// timeout. `Send` and `'static`; dropping it withdraws the request.
#[must_use = "futures do nothing unless polled; dropping it withdraws the request"]
pub struct LeaseWait {
    /// The decision, and the permits it took from the pool.
    inner: Pin<Box<dyn Future<Output = Result<u32, Error>> + Send>>,
}

impl std::fmt::Debug for LeaseWait {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LeaseWait(..)")
    }
}

impl LeaseWait {
    fn new(registration: Registration) -> LeaseWait {
        let shared = registration.shared.clone();
        // The timer starts now, not at the first poll; entering the runtime
        // lets it be made on any thread.
        let sleep = {
            let _runtime = shared.runtime.enter();
            tokio::time::sleep(shared.wait_limit)
        };
        LeaseWait {
            inner: Box::pin(async move {
                let mut sleep = pin!(sleep);
                let mut wait = pin!(registration.wait());
                std::future::poll_fn(|cx| {
                    if let Poll::Ready(decision) = wait.as_mut().poll(cx) {
                        return Poll::Ready(decision);
                    }
                    if sleep.as_mut().poll(cx).is_ready() {
                        return Poll::Ready(registration.timed_out());
                    }
                    Poll::Pending
                })
                .await
            }),
        }
    }
}

impl Future for LeaseWait {
    type Output = Result<(), Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner
            .as_mut()
            .poll(cx)
            .map(|decision| decision.map(drop))
    }
}

/// A request counted among the waiters until dropped.
struct Registration {
    shared: Arc<Shared>,
    n: u32,
    /// The lease calls completed when the request began waiting.
    seen: u64,
}

impl Registration {
    fn new(shared: Arc<Shared>, n: u32) -> Registration {
        // Acquire: pairs with the task's Release store, as in `wait`.
        let seen = shared.attempt.load(Ordering::Acquire) >> 2;
        // Relaxed: the sum only sizes the next lease; a call already in
        // flight is not resized, and the next one reads it after Notify.
        shared.waiting.fetch_add(u64::from(n), Ordering::Relaxed);
        // Relaxed: a statistic.
        shared.waits.fetch_add(1, Ordering::Relaxed);
        let registration = Registration { shared, n, seen };
        registration.ask(seen);
        registration
    }

    /// Asks the task for a lease call after the `seen`th.
    fn ask(&self, seen: u64) {
        // Relaxed: Notify's wake-up orders this store before the task's next
        // look at `asked` (the task reads it after every wake-up).
        self.shared.asked.fetch_max(seen, Ordering::Relaxed);
        self.shared.wake.notify_one();
    }

    /// Waits for lease calls until the pool covers `n` or a call says that
    /// waiting cannot help.
    async fn wait(&self) -> Result<u32, Error> {
        let shared = &*self.shared;
        let mut seen = self.seen;
        loop {
            // Made before the checks, so a lease completing between the
            // checks and the await still wakes this waiter.
            let mut done = pin!(shared.done.notified());
            done.as_mut().enable();
            // Acquire: pairs with the task's Release store after it filled
            // the pool, so the take below sees a completed lease's permits
            // (or what later spenders left of them).
            let word = shared.attempt.load(Ordering::Acquire);
            let now = shared.now();
            if shared.take(self.n, now) {
                return Ok(self.n);
            }
            if word >> 2 != seen {
                seen = word >> 2;
                match word & 3 {
                    GRANTED => {}
                    // Redis did not answer the call this request waited for.
                    FAILED => return shared.by_policy(self.n),
                    _ => return shared.fallback(self.n, now),
                }
                if shared.can_wait(now) {
                    // Granted, but spent by others first: one more call.
                    self.ask(seen);
                }
            }
            if !shared.can_wait(now) {
                return shared.fallback(self.n, now);
            }
            done.await;
        }
    }

    /// The answer when the wait ran out: the [`Policy`] if no lease call
    /// completed meanwhile (Redis did not answer within the timeout),
    /// otherwise what a request that does not wait gets.
    fn timed_out(&self) -> Result<u32, Error> {
        // Acquire: as in `wait`.
        if self.shared.attempt.load(Ordering::Acquire) >> 2 == self.seen {
            self.shared.by_policy(self.n)
        } else {
            self.shared.fallback(self.n, self.shared.now())
        }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        // Relaxed: see Registration::new.
        self.shared
            .waiting
            .fetch_sub(u64::from(self.n), Ordering::Relaxed);
    }
}

/// Polls `future` on this thread, parking between wake-ups, until it is
/// ready or `deadline` passes (`None`).
fn block_on_until<F: Future>(future: F, deadline: Instant) -> Option<F::Output> {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
        fn wake_by_ref(self: &Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut future = pin!(future);
    loop {
        if let Poll::Ready(output) = future.as_mut().poll(&mut cx) {
            return Some(output);
        }
        let now = Instant::now();
        if now >= deadline {
            return None;
        }
        std::thread::park_timeout(deadline - now);
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
    /// The key the limiter was started for: its `limit` label in metrics.
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    name: String,
    redis_key: String,
    /// The bucket's GCRA terms and the tail rule, as the lease script takes
    /// them.
    terms: Terms,
    want: u64,
    max_lease: u64,
    horizon: Duration,
    lifetime: Duration,
    breaker: Breaker,
    record: bool,
    on_mode: Option<Arc<dyn Fn(Mode) + Send + Sync>>,
    measured_at: Instant,
    measured_spent: u64,
}

enum Leased {
    Granted,
    Exhausted,
    Failed,
}

impl Refill {
    async fn run(mut self) {
        loop {
            // Relaxed: stop() notifies after the store; the flag is re-read
            // after every wake-up.
            if self.shared.stopping.load(Ordering::Relaxed) {
                break;
            }
            if Instant::now() >= self.deadline_instant() {
                self.give_back().await;
            }
            let now = Instant::now();
            let deadline = self.deadline_instant();
            let expired = now >= deadline;
            // Nothing to expire: sleep until asked.
            let mut sleep_for = if expired {
                Duration::from_millis(50)
            } else {
                deadline.saturating_duration_since(now)
            };
            let exhausted = self.exhausted_instant();
            if now < exhausted {
                // No permit before then: no call either, however many
                // requests are refused meanwhile. `wanted` stays as they
                // left it, so they do not wake this task again.
                sleep_for = sleep_for.min(exhausted - now);
            } else if self.breaker.allows(now) {
                // Relaxed: see want_refill and Registration::ask; only this
                // task writes `attempt`.
                let wanted = self.shared.wanted.swap(0, Ordering::Relaxed) == 1
                    || self.shared.asked.load(Ordering::Relaxed)
                        >= self.shared.attempt.load(Ordering::Relaxed) >> 2;
                // An expired pool is refilled only on demand: an idle process
                // holds no lease. Relaxed: a threshold read; a stale value
                // moves a refill by one loop.
                let low = !expired
                    && self.shared.pool.load(Ordering::Relaxed)
                        <= self.shared.low_water.load(Ordering::Relaxed);
                if wanted || low {
                    match self.lease().await {
                        Leased::Granted => {
                            // Refusals during the call saw the old pool; a
                            // pool still low after this grant asks again.
                            // Relaxed: see want_refill.
                            self.shared.wanted.store(0, Ordering::Relaxed);
                            continue;
                        }
                        // The gate above holds the next call back.
                        Leased::Exhausted => continue,
                        // Requests arriving meanwhile end the sleep at once.
                        Leased::Failed => sleep_for = Duration::from_millis(10),
                    }
                }
            }
            self.export();
            // While the breaker is open, `wanted` stays set: requests do not
            // wake the task, which looks again within 50 ms.
            let sleep_for = sleep_for.clamp(Duration::from_micros(100), Duration::from_millis(50));
            let _ = tokio::time::timeout(sleep_for, self.shared.wake.notified()).await;
        }
        self.give_back().await;
        self.export();
        self.publish(STOPPED);
    }

    /// Reports the limiter's counters to the metrics recorder (a no-op
    /// without the `metrics` feature): the same figures as
    /// [`LeasedLimiter::stats`].
    fn export(&self) {
        #[cfg(feature = "metrics")]
        {
            let mut stats = self.book().stats;
            // Relaxed: counters read for a report.
            stats.spent = self.shared.spent.load(Ordering::Relaxed);
            stats.degraded_decisions = self.shared.degraded_decisions.load(Ordering::Relaxed);
            stats.waits = self.shared.waits.load(Ordering::Relaxed);
            crate::metrics::lease(
                &self.name,
                &stats,
                self.shared.degraded.load(Ordering::Relaxed),
                self.shared.pool.load(Ordering::Relaxed),
            );
        }
    }

    /// When the budget's next permit is due, as the last lease call said.
    fn exhausted_instant(&self) -> Instant {
        // Relaxed: only this task writes it.
        self.shared.epoch
            + Duration::from_nanos(self.shared.exhausted_until.load(Ordering::Relaxed))
    }

    /// Ends a lease call: counts it and wakes its waiters.
    fn publish(&self, outcome: u64) {
        // Relaxed load: only this task writes the word. Release store: the
        // pool, deadline and exhaustion written before it are visible to a
        // waiter that reads the new word with Acquire.
        let calls = self.shared.attempt.load(Ordering::Relaxed) >> 2;
        self.shared
            .attempt
            .store((calls + 1) << 2 | outcome, Ordering::Release);
        self.shared.done.notify_waiters();
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
        let measured = self.size();
        // Relaxed: see Registration::new; a waiter counted late is served by
        // this lease's leftovers or by the next call.
        let waiting = self.shared.waiting.load(Ordering::Relaxed);
        let want = measured.max(waiting.min(u64::from(self.shared.capacity)));
        let reply = lease(&self.client, &self.redis_key, want, self.terms, None).await;
        {
            let mut book = self.book();
            book.stats.redis_calls += 1;
            book.stats.lease_calls += 1;
        }
        let reply = match reply {
            Ok(reply) => reply,
            Err(err) => {
                // A damaged or foreign key is no outage, but leasing from it
                // cannot go on either: the breaker opens as for a failure
                // (the policy decides meanwhile), and the error that names
                // the key and the field stays readable in `last_error`.
                self.book().last_error = Some(err.to_string());
                self.failed();
                self.publish(FAILED);
                return Leased::Failed;
            }
        };
        self.book().last_error = None;
        self.recovered();
        match reply {
            lease_script::LeaseReply::Granted {
                time_us: time,
                granted,
                tat,
            } => {
                // The pool's new deadline first, then the permits: a spender
                // that sees the permits with the old deadline only denies.
                let received = self.shared.epoch.elapsed();
                let deadline = received + self.lifetime;
                self.shared
                    .deadline
                    .store(deadline.as_nanos() as u64, Ordering::Relaxed);
                // Relaxed: a threshold (see Shared::take). From the measured
                // size: a lease grown for waiters is spent at once.
                self.shared.low_water.store(measured / 2, Ordering::Relaxed);
                // Relaxed: see Shared::take; the permits were debited in
                // Redis before this line runs.
                self.shared.pool.fetch_add(granted, Ordering::Relaxed);
                // A grant that took the last permit leaves the budget as
                // exhausted as a refusal would: the next permit is due when
                // the script would say, `tat + interval − tolerance`, counted
                // from the reply's arrival (a little late, never early).
                let due = (tat + self.terms.interval_us).saturating_sub(self.terms.tolerance_us);
                let wait = Duration::from_micros(due.saturating_sub(time));
                self.exhausted_for(received, wait);
                let record = self.record;
                {
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
                }
                self.publish(GRANTED);
                Leased::Granted
            }
            lease_script::LeaseReply::Exhausted { wait_us } => {
                let received = self.shared.epoch.elapsed();
                // At least 1 µs, so that a refusal always gates the next call.
                let wait = Duration::from_micros(wait_us.max(1));
                self.exhausted_for(received, wait);
                self.book().stats.exhausted_leases += 1;
                self.publish(EXHAUSTED);
                Leased::Exhausted
            }
        }
    }

    /// Records that the budget has no permit for `wait` after `received`
    /// (nothing, for a zero wait).
    fn exhausted_for(&self, received: Duration, wait: Duration) {
        let until = if wait.is_zero() {
            0
        } else {
            received.saturating_add(wait).as_nanos() as u64
        };
        // Relaxed: published to waiters by the Release in `publish`; the
        // synchronous path reads it as a hint.
        self.shared.exhausted_until.store(until, Ordering::Relaxed);
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
                let unused = unused.min(granted);
                let terms = [self.terms.interval_us, self.terms.tolerance_us];
                let reply =
                    give_back(&self.client, &self.redis_key, unused, terms, tat, None).await;
                self.book().stats.redis_calls += 1;
                match reply {
                    Ok(reply) => {
                        let returned = reply.returned;
                        if returned > 0 {
                            // The permits are back in the budget: a grant's
                            // "exhausted until" no longer holds.
                            // Relaxed: see exhausted_for.
                            self.shared.exhausted_until.store(0, Ordering::Relaxed);
                        }
                        let mut book = self.book();
                        if let Some(lease) = book.leases.get_mut(index) {
                            lease.returned = returned;
                        }
                        returned
                    }
                    Err(err) => {
                        self.book().last_error = Some(err.to_string());
                        0
                    }
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
