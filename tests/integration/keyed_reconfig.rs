//! Runtime reconfiguration under real threads: requests race a change of the
//! default quota of a keyed limiter. No loom model runs `Keyed::reconfigure`
//! yet (the keyed map runs under loom, so one could), so this is where the
//! keyed default's protocol (records read while a request holds its shard for
//! reading, in a reader slot or under the read lock; every key carried over
//! under the shard's write lock, which waits for the slots) meets real
//! contention. Time stands still in each trial, so every outcome is exact
//! arithmetic: each key's history must be "some requests under the old quota,
//! one carry-over, the rest under the new one", and the key's final state must
//! say so.

use std::sync::{Arc, Barrier};

use std::time::Duration;

use tollgate::LogConfig;
use tollgate::keyed::{
    BucketConfig, Carry, Keyed, MeterConfig, ShaperConfig, SlidingWindowConfig, Tunable,
    WarmUpConfig, WindowConfig,
};
use tollgate::{
    FixedWindow, LeakyBucket, ManualClock, Rate, RateLimiter, Shaper, SlidingLog, SlidingWindow,
    Snapshot, TokenBucket, WarmUp,
};

const THREADS: usize = 3;
const KEYS: u32 = 4;

/// Runs a trial: `THREADS` threads take single permits on `KEYS` keys while
/// one thread reconfigures from `old` to `new`; then checks every key against
/// the sequential histories "j permits under `old`, carry, k − j under `new`".
fn trial<L>(old: L::Config, new: L::Config, carry: Carry, attempts: u32)
where
    L: tollgate::keyed::Keyable<Clock = ManualClock> + 'static,
{
    let keyed = Arc::new(Keyed::<u32, L>::with_clock(old.clone(), ManualClock::new()));
    let start = Arc::new(Barrier::new(THREADS + 1));
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let (keyed, start) = (Arc::clone(&keyed), Arc::clone(&start));
            std::thread::spawn(move || {
                start.wait();
                let mut admitted = vec![0u32; KEYS as usize];
                for i in 0..attempts {
                    let key = (i + t as u32) % KEYS;
                    if keyed.try_acquire(&key).is_ok() {
                        admitted[key as usize] += 1;
                    }
                }
                admitted
            })
        })
        .collect();
    let reconfigurer = {
        let (keyed, start, new) = (Arc::clone(&keyed), Arc::clone(&start), new.clone());
        std::thread::spawn(move || {
            start.wait();
            keyed.reconfigure(new, carry);
        })
    };
    let mut admitted = vec![0u32; KEYS as usize];
    for worker in workers {
        for (total, mine) in admitted.iter_mut().zip(worker.join().unwrap()) {
            *total += mine;
        }
    }
    reconfigurer.join().unwrap();
    for key in 0..KEYS {
        let k = admitted[key as usize];
        let actual = keyed.snapshot(&key);
        let explained = (0..=k).any(|j| {
            let seq = Tunable::<L>::with_clock(old.clone(), ManualClock::new());
            let ok = (0..j).all(|_| seq.try_acquire().is_ok());
            seq.reconfigure(new.clone(), carry);
            ok && (j..k).all(|_| seq.try_acquire().is_ok()) && seq.snapshot() == actual
        });
        assert!(
            explained,
            "key {key}: {k} admitted, final {actual:?}: no history explains it"
        );
    }
    // And nothing more is admitted than the new quota allows now.
    let Snapshot { available, .. } = keyed.snapshot(&0);
    assert!(available <= L::capacity(&new));
}

/// Thirty [`trial`]s each way between `small` and `large`, every carry in
/// turn.
fn both_ways<L>(small: L::Config, large: L::Config, attempts: u32)
where
    L: tollgate::keyed::Keyable<Clock = ManualClock> + 'static,
{
    for round in 0..30 {
        let carry = [Carry::Proportional, Carry::Additive, Carry::Reset][round % 3];
        trial::<L>(small.clone(), large.clone(), carry, attempts);
        trial::<L>(large.clone(), small.clone(), carry, attempts);
    }
}

#[test]
fn token_bucket_default_reconfiguration_races_requests() {
    let small = BucketConfig::new(20, Rate::per_hour(20)).unwrap();
    let large = BucketConfig::new(50, Rate::per_hour(50)).unwrap();
    both_ways::<TokenBucket<ManualClock>>(small, large, 60);
}

#[test]
fn leaky_bucket_meter_default_reconfiguration_races_requests() {
    let small = MeterConfig::new(20, Rate::per_hour(20)).unwrap();
    let large = MeterConfig::new(50, Rate::per_hour(50)).unwrap();
    both_ways::<LeakyBucket<ManualClock>>(small, large, 60);
}

#[test]
fn shaper_and_warm_up_default_reconfiguration_races_requests() {
    // Time stands still: the shaper admits its burst + 1, a warm-up key one.
    let small = ShaperConfig::new(Rate::per_hour(20), 14, Duration::ZERO).unwrap();
    let large = ShaperConfig::new(Rate::per_hour(50), 39, Duration::ZERO).unwrap();
    let cold = WarmUpConfig::new(Rate::per_hour(20), Duration::from_secs(60)).unwrap();
    let colder =
        WarmUpConfig::with_cold_factor(Rate::per_hour(50), Duration::from_secs(90), 9).unwrap();
    both_ways::<Shaper<ManualClock>>(small, large, 60);
    both_ways::<WarmUp<ManualClock>>(cold, colder, 20);
}

#[test]
fn sliding_log_default_reconfiguration_races_requests() {
    let small = LogConfig::new(Rate::per_hour(15)).unwrap();
    let large = LogConfig::new(Rate::per_hour(40)).unwrap();
    both_ways::<SlidingLog<ManualClock>>(small, large, 60);
}

/// Several rules on one log: the hour's rule changed and a minute's rule
/// added, then removed, while requests race.
#[test]
fn multi_rule_log_default_reconfiguration_races_requests() {
    let small = LogConfig::new(Rate::per_hour(15))
        .and_then(|c| c.with_rule(Rate::per_minute(10)))
        .unwrap();
    let large = LogConfig::new(Rate::per_hour(40)).unwrap();
    both_ways::<SlidingLog<ManualClock>>(small, large, 60);
}

/// The sliding window, its sub-window count changed too (10 to 4 and back):
/// each key is sealed, carried over and unsealed while requests race.
#[test]
fn sliding_window_default_reconfiguration_races_requests() {
    let small = SlidingWindowConfig::with_sub_windows(Rate::per_hour(15), 10).unwrap();
    let large = SlidingWindowConfig::with_sub_windows(Rate::per_hour(40), 4).unwrap();
    both_ways::<SlidingWindow<ManualClock>>(small, large, 60);
}

#[test]
fn fixed_window_default_reconfiguration_races_requests() {
    let small = WindowConfig::new(Rate::per_hour(15)).unwrap();
    let large = WindowConfig::new(Rate::per_hour(40)).unwrap();
    both_ways::<FixedWindow<ManualClock>>(small, large, 60);
}

/// Several reconfigurations in a row while requests run, on many keys: no
/// panic, every key ends under the last configuration, within its capacity.
#[test]
fn back_to_back_reconfigurations_settle_every_key() {
    let configs = [
        BucketConfig::new(5, Rate::per_second(5)).unwrap(),
        BucketConfig::new(50, Rate::per_second(20)).unwrap(),
        BucketConfig::new(2, Rate::per_second(1)).unwrap(),
    ];
    let clock = ManualClock::new();
    let keyed = Arc::new(Keyed::<u32, TokenBucket<ManualClock>>::with_clock(
        configs[0],
        clock.clone(),
    ));
    let workers: Vec<_> = (0..2u32)
        .map(|t| {
            let keyed = Arc::clone(&keyed);
            std::thread::spawn(move || {
                for i in 0..200_000u32 {
                    let _ = keyed.try_acquire_n(&((i * 7 + t) % 5_000), 1 + i % 2);
                }
            })
        })
        .collect();
    for i in 0..60 {
        keyed.reconfigure(
            configs[i % 3],
            [Carry::Proportional, Carry::Additive][i % 2],
        );
        clock.advance(std::time::Duration::from_millis(3));
    }
    for worker in workers {
        worker.join().unwrap();
    }
    let last = configs[59 % 3];
    assert_eq!(keyed.config(), last);
    for key in 0..5_000 {
        let snap = keyed.snapshot(&key);
        assert_eq!(snap.capacity, last.capacity());
        assert!(snap.available <= last.capacity());
    }
}
