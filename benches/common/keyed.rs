//! What the keyed benches (`keyed.rs`, `keyed_kinds.rs`) share: one check
//! against any keyed limiter and the bytes-per-key table, counted by
//! `common::counting::Counting` (each bench registers it with
//! `#[global_allocator] static GLOBAL: Counting = Counting;`).

use std::hash::BuildHasher;
use std::num::NonZeroU32;

use tollgate::ManualClock;
use tollgate::keyed::{Keyable, Keyed};

use super::counting::{allocated, key};

/// One keyed check, `true` if admitted.
pub trait Check: Send + Sync + 'static {
    fn check(&self, key: &u64) -> bool;
    /// Asks for `n` permits at once, `true` if admitted.
    fn spend(&self, key: &u64, n: u32) -> bool;
}

impl<L: Keyable + 'static, S> Check for Keyed<u64, L, S>
where
    L::Clock: Send + Sync,
    S: BuildHasher + Clone + Send + Sync + 'static,
{
    #[inline]
    fn check(&self, key: &u64) -> bool {
        self.try_acquire(key).is_ok()
    }

    fn spend(&self, key: &u64, n: u32) -> bool {
        self.try_acquire_n(key, n).is_ok()
    }
}

/// One thread's checks of a keyed bench: `iters` checks of the first key
/// when `hot`, else of the keys from `offset` on (wrapping). Returns how many
/// were admitted.
#[inline]
pub fn check_keys<L: Check>(
    limiter: &L,
    keys: &[u64],
    hot: bool,
    offset: usize,
    iters: u64,
) -> u64 {
    let mut admitted = 0u64;
    for i in 0..iters as usize {
        let key = if hot {
            &keys[0]
        } else {
            &keys[(offset + i) % keys.len()]
        };
        admitted += u64::from(limiter.check(key));
    }
    admitted
}

/// governor's dashmap-keyed limiter on its default clock.
pub type GovernorKeyed = governor::DefaultKeyedRateLimiter<u64>;

impl Check for GovernorKeyed {
    #[inline]
    fn check(&self, key: &u64) -> bool {
        self.check_key(key).is_ok()
    }

    fn spend(&self, key: &u64, n: u32) -> bool {
        let n = NonZeroU32::new(n).expect("non-zero");
        matches!(self.check_key_n(key, n), Ok(Ok(())))
    }
}

/// How many keys the keyed benches fill their limiters with.
pub const KEYS: usize = 1_000_000;

/// Admits each of the first `KEYS` keys once.
fn admit_every_key<L: Check>(limiter: &L) {
    for i in 0..KEYS as u64 {
        assert!(limiter.check(&key(i)));
    }
}

/// Bytes allocated per key by the limiter `make` builds and what `fill`
/// does with it, with `KEYS` keys.
fn bytes_per_key_of<L: Check>(make: impl FnOnce() -> L, fill: impl FnOnce(&L)) -> f64 {
    let before = allocated();
    let limiter = make();
    fill(&limiter);
    let bytes = allocated() - before;
    drop(limiter);
    bytes as f64 / KEYS as f64
}

/// Bytes allocated per key with `KEYS` keys, each admitted once.
pub fn bytes_per_key<L: Check>(make: impl FnOnce() -> L) -> f64 {
    bytes_per_key_of(make, admit_every_key)
}

/// Bytes allocated per key with `KEYS` keys, each admitted once
/// before `then` and once after.
pub fn bytes_per_key_then<L: Check>(make: impl FnOnce() -> L, then: impl FnOnce()) -> f64 {
    bytes_per_key_of(make, |limiter| {
        admit_every_key(limiter);
        then();
        admit_every_key(limiter);
    })
}

/// Bytes per key of a `Keyed` map of `L` on a manual clock that never moves
/// (no key refills, so none is evicted); `config` is built in the measured
/// region, as the map's own copy of it is.
pub fn keyed_bytes_per_key<L>(config: impl FnOnce() -> L::Config) -> f64
where
    L: Keyable<Clock = ManualClock> + 'static,
{
    bytes_per_key(|| Keyed::<u64, L>::with_clock(config(), ManualClock::new()))
}

/// Bytes per key of governor's dashmap-keyed limiter at `quota`.
pub fn governor_bytes_per_key(quota: governor::Quota) -> f64 {
    bytes_per_key::<GovernorKeyed>(|| governor::RateLimiter::dashmap(quota))
}

/// The bytes-per-key row of governor's dashmap-keyed limiter at `quota`.
pub fn governor_row(quota: governor::Quota) -> (&'static str, f64) {
    ("governor dashmap keyed", governor_bytes_per_key(quota))
}

/// Prints the bytes-per-key table, names padded to `width`.
pub fn print_bytes_per_key(rows: &[(&str, f64)], width: usize) {
    println!("bytes per key with {KEYS} u64 keys (allocator count):");
    for (name, bytes) in rows {
        println!("  {name:<width$} {bytes:6.1}");
    }
}
