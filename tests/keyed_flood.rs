//! A flood of distinct keys cannot exhaust memory: millions of random keys
//! against a capped keyed limiter, with every byte the process allocates
//! counted by this binary's global allocator.
//!
//! The tests in this file share the allocator's counter, so they run one at a
//! time (a mutex), and each measures the growth across its own flood.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tollgate::keyed::{BucketConfig, IDLE_BEFORE_EVICTION, Keyable, Keyed, WindowConfig};
use tollgate::{FixedWindow, ManualClock, Rate, TokenBucket};

#[path = "../benches/common/counting.rs"]
mod counting;
use counting::{Counting, allocated, key};

static SERIAL: Mutex<()> = Mutex::new(());

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Bytes one resident entry may cost: `(u64 key, 8-byte word)` = 16 bytes plus
/// one control byte per bucket, at a load between 7/16 and 7/8 (hashbrown
/// doubles), so at most `17 × 16 / 7 ≈ 39` bytes; 48 leaves room for shard
/// imbalance.
const BYTES_PER_ENTRY: isize = 48;

/// Floods a keyed `L` capped at `CAP` keys with `flood` distinct keys, time
/// frozen so that no key is ever fresh: the cap holds exactly, every key past
/// it is decided by the overflow state, the peak stays within `per_key` bytes
/// times the cap, and dropping the limiter gives the memory back.
fn flood_at_the_cap<L: Keyable<Clock = ManualClock>>(
    name: &str,
    config: L::Config,
    per_key: isize,
    flood: u64,
) {
    const CAP: usize = 100_000;
    let before = allocated();
    let keyed = Keyed::<u64, L>::with_clock(config, ManualClock::new()).with_max_keys(CAP);
    let mut peak = 0;
    for i in 0..flood {
        let _ = keyed.try_acquire(&key(i));
        if i % 65_536 == 0 {
            assert!(keyed.len() <= CAP);
            peak = peak.max(allocated() - before);
        }
    }
    peak = peak.max(allocated() - before);
    assert_eq!(keyed.len(), CAP);
    assert_eq!(keyed.overflowed(), flood - CAP as u64);
    let bound = CAP as isize * per_key + 64 * 1024;
    eprintln!(
        "{name} flood: {flood} keys, {} resident, peak {peak} bytes ({:.1} per resident key), bound {bound}",
        keyed.len(),
        peak as f64 / CAP as f64
    );
    assert!(peak <= bound, "{name}: peak {peak} bytes > {bound}");
    drop(keyed);
    assert!(
        allocated() - before < 64 * 1024,
        "{name}: the limiter gives its memory back"
    );
}

#[test]
fn a_flood_of_keys_that_stay_busy_is_held_at_the_cap() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let cfg = BucketConfig::new(10, Rate::per_second(10)).unwrap();
    flood_at_the_cap::<TokenBucket<ManualClock>>("busy", cfg, BYTES_PER_ENTRY, 3_000_000);
}

#[test]
fn a_flood_of_short_lived_keys_is_swept_as_it_goes() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    const FLOOD: u64 = 2_000_000;
    let before = allocated();
    let clock = ManualClock::new();
    // One request empties a key's window; the window closes 1 ms later.
    let cfg = WindowConfig::new(Rate::new(1, Duration::from_millis(1))).unwrap();
    let keyed = Keyed::<u64, FixedWindow<ManualClock>>::with_clock(cfg, clock.clone());
    let mut peak_len = 0;
    let mut peak = 0;
    for i in 0..FLOOD {
        assert!(keyed.try_acquire(&key(i)).is_ok());
        // A quarter of `IDLE_BEFORE_EVICTION` per 1,000 new keys: about
        // 4,000 keys not yet idle at any time (the window itself closes
        // 1 ms after each key's request), the rest evictable by inserts.
        if i % 1_000 == 999 {
            clock.advance(Duration::from_nanos(IDLE_BEFORE_EVICTION / 4));
        }
        if i % 8_192 == 0 {
            peak_len = peak_len.max(keyed.len());
            peak = peak.max(allocated() - before);
        }
    }
    eprintln!(
        "short-lived flood: {FLOOD} keys, peak {peak_len} resident, peak {peak} bytes, {} evicted",
        keyed.evicted()
    );
    assert_eq!(keyed.overflowed(), 0);
    assert!(peak_len < 8_000, "{peak_len} keys resident at the peak");
    assert!(
        peak < 8_000 * BYTES_PER_ENTRY + 64 * 1024,
        "peak {peak} bytes"
    );
}

#[test]
fn concurrent_floods_never_pass_the_cap() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    const CAP: usize = 50_000;
    let before = allocated();
    let cfg = BucketConfig::new(1, Rate::per_hour(1)).unwrap();
    let keyed = Arc::new(
        Keyed::<u64, TokenBucket<ManualClock>>::with_clock(cfg, ManualClock::new())
            .with_max_keys(CAP),
    );
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let keyed = Arc::clone(&keyed);
            std::thread::spawn(move || {
                for i in 0..400_000u64 {
                    let _ = keyed.try_acquire(&key(t << 40 | i));
                    if i % 4_096 == 0 {
                        assert!(keyed.len() <= CAP);
                    }
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    // Not necessarily exactly `CAP`: once a request has been decided by the
    // overflow state (time stands still, so it never refills), a key whose
    // place was reserved just before starts from a copy of it, is denied, and
    // its place is given back; later keys start from the same copy.
    assert!(keyed.len() <= CAP);
    let used = allocated() - before;
    eprintln!(
        "concurrent flood: 1.6 M keys from 4 threads, {} resident, {used} bytes",
        keyed.len()
    );
    assert!(
        used <= CAP as isize * BYTES_PER_ENTRY + 64 * 1024,
        "{used} bytes"
    );
}

/// Bytes per key at a million keys, against governor's dashmap-keyed limiter
/// with the same key type: at most governor's.
#[test]
fn bytes_per_key_at_a_million_keys_are_at_most_governors() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    const KEYS: u64 = 1_000_000;
    let ours = {
        let before = allocated();
        let cfg = BucketConfig::new(10, Rate::per_second(10)).unwrap();
        let keyed = Keyed::<u64, TokenBucket<ManualClock>>::with_clock(cfg, ManualClock::new());
        for i in 0..KEYS {
            keyed.try_acquire(&key(i)).unwrap();
        }
        assert_eq!(keyed.len(), KEYS as usize);
        (allocated() - before) as f64 / KEYS as f64
    };
    let governor = {
        use std::num::NonZeroU32;
        let before = allocated();
        let quota = governor::Quota::per_second(NonZeroU32::new(10).unwrap());
        let limiter = governor::RateLimiter::<u64, _, _>::dashmap(quota);
        for i in 0..KEYS {
            limiter.check_key(&key(i)).unwrap();
        }
        assert_eq!(limiter.len(), KEYS as usize);
        (allocated() - before) as f64 / KEYS as f64
    };
    eprintln!("bytes per key at 1 M u64 keys: tollgate {ours:.1}, governor {governor:.1}");
    assert!(
        ours <= governor + 0.5,
        "tollgate {ours:.1} > governor {governor:.1} bytes per key"
    );
}

/// The per-key sliding log: bytes per resident key (the allocator's count of
/// requested bytes: the map's entry and table share, the ring's header and
/// its 8-byte entries) for limits of 30, 100 and 10,000, each key admitted
/// once. The ring is `8·N` bytes; everything else is a constant per key.
#[test]
fn a_keyed_sliding_log_costs_eight_bytes_per_slot_and_a_constant() {
    use tollgate::LogConfig;
    use tollgate::SlidingLog;
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for (limit, keys) in [(30u32, 100_000u64), (100, 100_000), (10_000, 2_000)] {
        let config = LogConfig::new(Rate::new(limit, Duration::from_secs(60))).unwrap();
        let before = allocated();
        let keyed = Keyed::<u64, SlidingLog<ManualClock>>::with_clock(config, ManualClock::new());
        for i in 0..keys {
            assert!(keyed.try_acquire(&key(i)).is_ok());
        }
        let per_key = (allocated() - before) as f64 / keys as f64;
        let ring = 8.0 * f64::from(limit);
        println!(
            "N = {limit}: {per_key:.1} bytes per key ({keys} keys): ring {ring}, the rest {:.1}",
            per_key - ring
        );
        assert!(
            per_key <= ring + 160.0,
            "N = {limit}: {per_key:.1} bytes per key"
        );
        drop(keyed);
    }
}

/// A flood like the first test's on a keyed sliding log (30 a minute: a
/// 240-byte ring per key) and a keyed sliding window (30 a minute in ten
/// sub-windows: 40 bytes of counts per key), time frozen so that no key is
/// ever fresh: the cap holds exactly, every key past it is decided by the
/// overflow state, and the peak stays within the measured per-key cost
/// (`docs/benchmarks.md`, memory per key) times the cap.
#[test]
fn a_flood_of_busy_keys_on_a_sliding_log_or_window_is_held_at_the_cap() {
    use tollgate::LogConfig;
    use tollgate::keyed::SlidingWindowConfig;
    use tollgate::{SlidingLog, SlidingWindow};
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // Five times the cap past it: enough to show the peak does not grow with
    // the flood. (At the cap every new key's insert sweeps a few buckets,
    // each resident ring or window asked whether it is fresh: ~10 µs a
    // request here, where the bucket's one-word answer is ~1.)
    const FLOOD: u64 = 600_000;
    let log = LogConfig::new(Rate::per_minute(30)).unwrap();
    // The ring (8·N) and the 160-byte constant of the test above.
    flood_at_the_cap::<SlidingLog<ManualClock>>("sliding log, N = 30", log, 8 * 30 + 160, FLOOD);
    let window = SlidingWindowConfig::new(Rate::per_minute(30)).unwrap();
    // 40 bytes of counts, a 48-byte header beside an 8-byte key, the table.
    flood_at_the_cap::<SlidingWindow<ManualClock>>(
        "sliding window, S = 10",
        window,
        4 * 10 + 160,
        FLOOD,
    );
}
