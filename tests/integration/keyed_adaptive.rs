//! `KeyedAdaptiveLimit`: one adaptive concurrency limit per key. Unit tests
//! of its rules (idle eviction, what eviction forgets, pins, the cap and the
//! overflow, factory errors), a property test against a reference model of
//! every key's limit and in-flight count, and a stress test whose holders are
//! counted per key independently of the gates.

use std::collections::hash_map::DefaultHasher;
use std::future::Future;
use std::hash::BuildHasherDefault;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::task::{Context, Poll, Waker};
use std::thread;
use std::time::Duration;

use crate::support::poll_once;
use proptest::prelude::*;
use tollgate::keyed::{DEFAULT_IDLE, DEFAULT_MAX_ADAPTIVE_KEYS, KeyedAdaptiveLimit, TOUCH_STEP};
use tollgate::{
    Aimd, Clock, ConcurrencyLimit, ConfigError, LimitAlgorithm, ManualClock, Outcome,
    OwnedAdaptivePermit, Sample,
};

type Fixed = BuildHasherDefault<DefaultHasher>;
type PerKey = KeyedAdaptiveLimit<u32, Aimd, ManualClock, Fixed>;
type Permit = OwnedAdaptivePermit<Aimd, ManualClock>;

const MS: u64 = 1_000_000;

fn aimd(min: u32, initial: u32, max: u32) -> impl Fn() -> Result<Aimd, ConfigError> {
    move || {
        Aimd::builder()
            .min_limit(min)
            .initial_limit(initial)
            .max_limit(max)
            .backoff_ratio(0.5)
            .build()
    }
}

fn per_key(min: u32, initial: u32, max: u32) -> (PerKey, ManualClock) {
    let clock = ManualClock::new();
    let keyed = KeyedAdaptiveLimit::with_clock_and_hasher(
        aimd(min, initial, max),
        clock.clone(),
        Fixed::default(),
    )
    .expect("a valid algorithm");
    (keyed, clock)
}

/// Wakes the thread parked in [`block_on`].
struct Unpark(thread::Thread);

impl std::task::Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// Polls `future` on this thread until it is ready, parking between polls.
fn block_on<F: Future>(future: F) -> F::Output {
    let waker = Waker::from(Arc::new(Unpark(thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut future = pin!(future);
    loop {
        if let Poll::Ready(output) = future.as_mut().poll(&mut cx) {
            return output;
        }
        thread::park();
    }
}

#[test]
fn defaults() {
    let keyed = KeyedAdaptiveLimit::<u32, Aimd>::new(|| Aimd::builder().build()).unwrap();
    assert_eq!(keyed.max_keys(), DEFAULT_MAX_ADAPTIVE_KEYS);
    assert_eq!(keyed.idle(), DEFAULT_IDLE);
    assert!(keyed.is_empty());
    assert_eq!(keyed.with_max_keys(0).max_keys(), 1, "0 keys is taken as 1");
    let huge = KeyedAdaptiveLimit::<u32, Aimd>::new(|| Aimd::builder().build())
        .unwrap()
        .with_idle(Duration::MAX);
    assert_eq!(huge.idle(), Duration::from_nanos(u64::MAX));
}

/// An algorithm of one's own whose limit the gate cannot take.
#[derive(Debug)]
struct Fixed0(u32);

impl LimitAlgorithm for Fixed0 {
    fn on_sample(&self, _: Sample, _: u64) -> Option<u32> {
        None
    }

    fn limit(&self) -> u32 {
        self.0
    }
}

#[test]
fn bad_algorithms_are_refused_with_a_clear_error() {
    let err = KeyedAdaptiveLimit::<u32, Aimd>::new(|| {
        Aimd::builder().min_limit(5).initial_limit(2).build()
    })
    .unwrap_err();
    assert_eq!(
        err,
        ConfigError::InvalidLimits {
            min: 5,
            initial: 2,
            max: 200
        }
    );
    for bad in [0, ConcurrencyLimit::MAX_LIMIT + 1] {
        let err = KeyedAdaptiveLimit::<u32, Fixed0>::new(move || Ok(Fixed0(bad))).unwrap_err();
        assert_eq!(
            err,
            ConfigError::InvalidConcurrencyLimit {
                limit: bad,
                max: ConcurrencyLimit::MAX_LIMIT
            }
        );
        assert!(err.to_string().contains("outside 1..="), "{err}");
    }
}

#[test]
fn a_factory_that_fails_later_sends_the_key_to_the_overflow() {
    let fail = Arc::new(AtomicBool::new(false));
    let f = fail.clone();
    let keyed = KeyedAdaptiveLimit::<u32, Fixed0>::new(move || {
        if f.load(Ordering::Relaxed) {
            Ok(Fixed0(0))
        } else {
            Ok(Fixed0(1))
        }
    })
    .unwrap();
    fail.store(true, Ordering::Relaxed);
    let held = keyed.try_acquire(&1).expect("the overflow has room");
    assert_eq!((keyed.len(), keyed.overflowed()), (0, 1));
    assert_eq!(keyed.overflow().in_flight(), 1);
    assert!(keyed.try_acquire(&2).is_none(), "the overflow is full");
    drop(held);
    fail.store(false, Ordering::Relaxed);
    let _own = keyed.try_acquire(&1).unwrap();
    assert_eq!(keyed.len(), 1);
}

#[test]
fn every_key_has_its_own_limit_and_learns_alone() {
    let (keyed, clock) = per_key(1, 2, 10);
    let a = keyed.try_acquire(&1).unwrap();
    let b = keyed.try_acquire(&1).unwrap();
    assert_eq!(b.granted_in_flight(), 2);
    assert!(keyed.try_acquire(&1).is_none());
    let c = keyed.try_acquire(&2).unwrap();
    assert_eq!(keyed.len(), 2);
    clock.advance(Duration::from_millis(5));
    a.success();
    b.success();
    c.dropped();
    assert_eq!(keyed.limit_of(&1), Some(4));
    assert_eq!(keyed.limit_of(&2), Some(1));
    assert_eq!(keyed.limit_of(&3), None);
    assert_eq!((keyed.in_flight_of(&1), keyed.in_flight_of(&2)), (0, 0));
}

#[test]
fn idle_keys_are_evicted_and_forget_what_they_learned() {
    let (keyed, clock) = per_key(1, 2, 10);
    let keyed = keyed.with_idle(Duration::from_secs(1));
    for _ in 0..3 {
        let _a = keyed.try_acquire(&1).unwrap();
        let b = keyed.try_acquire(&1).unwrap();
        b.success(); // granted with 2 in flight: the limit was in use
    }
    assert_eq!(keyed.limit_of(&1), Some(5));
    // Used within the idle time: kept, learned limit and all.
    clock.advance(Duration::from_millis(999));
    assert_eq!(keyed.sweep(), 0);
    keyed.try_acquire(&1).unwrap().ignore(); // a request: the idle time starts again
    clock.advance(Duration::from_millis(999));
    assert_eq!(keyed.sweep(), 0);
    assert_eq!(keyed.limit_of(&1), Some(5));
    clock.advance(Duration::from_millis(1));
    assert_eq!(keyed.sweep(), 1);
    assert_eq!((keyed.evicted(), keyed.len()), (1, 0));
    // Back: a new limit from the factory, at its initial value.
    keyed.try_acquire(&1).unwrap().ignore();
    assert_eq!(keyed.limit_of(&1), Some(2));
}

#[test]
fn refused_requests_count_as_use() {
    let (keyed, clock) = per_key(1, 1, 1);
    let keyed = keyed.with_idle(Duration::from_secs(1));
    let held = keyed.try_acquire(&1).unwrap();
    clock.advance(Duration::from_millis(900));
    assert!(keyed.try_acquire(&1).is_none());
    drop(held);
    clock.advance(Duration::from_millis(900));
    assert_eq!(keyed.sweep(), 0, "refused 900 ms ago: in use");
}

#[test]
fn idle_is_measured_to_within_the_touch_step() {
    let (keyed, clock) = per_key(1, 1, 1);
    let keyed = keyed.with_idle(Duration::from_nanos(10 * TOUCH_STEP));
    keyed.try_acquire(&1).unwrap().ignore(); // used at 0
    clock.set(TOUCH_STEP - 1);
    keyed.try_acquire(&1).unwrap().ignore(); // within a step: not recorded
    clock.set(10 * TOUCH_STEP);
    assert_eq!(keyed.sweep(), 1);
}

/// One permit per key, a key evictable the moment it is idle.
fn evicting_when_idle() -> (PerKey, ManualClock) {
    let (keyed, clock) = per_key(1, 1, 1);
    (keyed.with_idle(Duration::ZERO), clock)
}

#[test]
fn a_key_with_a_permit_out_is_never_evicted() {
    let (keyed, clock) = evicting_when_idle();
    let held = keyed.try_acquire(&1).unwrap();
    clock.advance(Duration::from_secs(3600));
    assert_eq!(keyed.sweep(), 0);
    assert_eq!(keyed.in_flight_of(&1), 1);
    held.success();
    assert_eq!(keyed.sweep(), 1);
}

#[test]
fn a_waiter_pins_its_key_until_admitted_or_dropped() {
    let (keyed, clock) = evicting_when_idle();
    let held = keyed.try_acquire(&1).unwrap();
    {
        let mut waiter = pin!(keyed.acquire_async(&1));
        assert!(poll_once(waiter.as_mut()).is_pending());
        drop(held); // wakes the waiter, which has not asked again yet
        clock.advance(Duration::from_secs(60));
        assert_eq!(keyed.sweep(), 0, "a waiter pins the state it waits on");
        let Poll::Ready(permit) = poll_once(waiter.as_mut()) else {
            panic!("a permit is free");
        };
        assert_eq!(keyed.in_flight_of(&1), 1);
        assert_eq!(keyed.sweep(), 0);
        permit.ignore();
    }
    assert_eq!(keyed.sweep(), 1, "admitted and released: unpinned");

    // A waiter dropped before it is admitted unpins too.
    let held = keyed.try_acquire(&2).unwrap();
    {
        let mut waiter = pin!(keyed.acquire_async(&2));
        assert!(poll_once(waiter.as_mut()).is_pending());
    }
    drop(held);
    assert_eq!(keyed.sweep(), 1);
}

#[cfg(feature = "tokio")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_async_is_woken_by_a_release() {
    let keyed = Arc::new(
        KeyedAdaptiveLimit::<u32, Aimd>::new(|| {
            Aimd::builder()
                .min_limit(1)
                .initial_limit(1)
                .max_limit(1)
                .build()
        })
        .unwrap(),
    );
    let held = keyed.acquire_async(&7).await;
    let k = keyed.clone();
    let waiter = tokio::spawn(async move { k.acquire_async(&7).await.granted_in_flight() });
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(!waiter.is_finished());
    held.success();
    assert_eq!(waiter.await.unwrap(), 1);
}

#[test]
fn at_the_cap_new_keys_share_the_overflow() {
    let (keyed, clock) = per_key(1, 1, 1);
    let keyed = keyed.with_max_keys(2).with_idle(Duration::from_secs(1));
    let a = keyed.try_acquire(&1).unwrap();
    let b = keyed.try_acquire(&2).unwrap();
    // Key 3 finds no idle key to evict: the overflow (limit 1) decides, and
    // key 4 shares it.
    let c = keyed.try_acquire(&3).unwrap();
    assert!(keyed.try_acquire(&4).is_none());
    assert_eq!((keyed.len(), keyed.overflowed()), (2, 2));
    assert_eq!(keyed.limit_of(&3), None);
    assert_eq!(keyed.overflow().in_flight(), 1);

    // Key 1 goes idle: room, but the overflow still has a permit out (key
    // 3's): key 3 stays on the overflow, and is refused there.
    a.ignore();
    clock.advance(Duration::from_secs(1));
    assert!(keyed.try_acquire(&3).is_none());
    assert_eq!(keyed.limit_of(&3), None);
    // Once the overflow is unused, key 3 gets a state of its own.
    c.ignore();
    let own = keyed.try_acquire(&3).unwrap();
    assert_eq!(keyed.limit_of(&3), Some(1));
    assert_eq!(keyed.limit_of(&1), None, "evicted to make room");
    assert!(keyed.len() <= 2);
    drop((b, own));
}

#[test]
fn a_flood_of_keys_stays_under_the_cap() {
    let (keyed, clock) = per_key(1, 2, 4);
    let keyed = keyed.with_max_keys(64).with_idle(Duration::from_millis(1));
    let mut held = Vec::new();
    for key in 0..20_000u32 {
        if key % 1000 == 0 {
            // A few keys stay in use throughout.
            held.extend(keyed.try_acquire(&key));
        } else if let Some(permit) = keyed.try_acquire(&key) {
            permit.success();
        }
        assert!(keyed.len() <= 64);
        clock.advance(Duration::from_micros(100));
    }
    assert!(keyed.evicted() > 10_000, "evicted {}", keyed.evicted());
    for permit in &held {
        assert_eq!(permit.granted_in_flight(), 1);
    }
    for key in (0..20_000u32).step_by(1000) {
        assert_eq!(keyed.in_flight_of(&key), 1, "key {key} in use was kept");
    }
}

// ---- Property test against a reference model ----

/// One step of a random sequence.
#[derive(Debug, Clone)]
enum Op {
    Acquire(u32),
    /// Ends the held permit at this index (modulo the number held).
    End(usize, End),
    Advance(u64),
    Sweep,
}

#[derive(Debug, Clone, Copy)]
enum End {
    Success,
    Dropped,
    Ignore,
    Drop,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..KEYS).prop_map(Op::Acquire),
        3 => (0..8usize, prop_oneof![
            Just(End::Success), Just(End::Dropped), Just(End::Ignore), Just(End::Drop)
        ]).prop_map(|(i, e)| Op::End(i, e)),
        2 => prop_oneof![Just(0), Just(300_000), Just(2 * MS), Just(IDLE + 1)].prop_map(Op::Advance),
        1 => Just(Op::Sweep),
    ]
}

const KEYS: u32 = 4;
const MAX_KEYS: usize = 2;
const IDLE: u64 = 10 * MS;

/// A key's (or the overflow's) state in the reference: its own algorithm,
/// fed the same samples, its in-flight count and its recorded use.
struct RefState {
    algorithm: Aimd,
    in_flight: u32,
    used: u64,
}

impl RefState {
    fn new(now: u64) -> Self {
        RefState {
            algorithm: aimd(1, 2, 4)().unwrap(),
            in_flight: 0,
            used: now,
        }
    }

    fn touch(&mut self, now: u64) {
        if now >= self.used.saturating_add(TOUCH_STEP) {
            self.used = now;
        }
    }

    fn idle(&self, now: u64) -> bool {
        self.in_flight == 0 && now.saturating_sub(self.used) >= IDLE
    }

    /// Admits if in flight is under the limit; the permit's in-flight count.
    fn admit(&mut self) -> Option<u32> {
        (self.in_flight < self.algorithm.limit()).then(|| {
            self.in_flight += 1;
            self.in_flight
        })
    }
}

/// Where a held permit came from.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Gate {
    Own(u32),
    Overflow(u32),
}

struct Held {
    gate: Gate,
    permit: Permit,
    granted_at: u64,
    granted_in_flight: u32,
}

struct Reference {
    keys: Vec<Option<RefState>>,
    overflow: RefState,
}

impl Reference {
    fn resident(&self) -> usize {
        self.keys.iter().filter(|k| k.is_some()).count()
    }

    /// Per key, permits held on its own state and on the overflow: never
    /// both (one gate per key).
    fn check_one_gate(&self, held: &[Held]) {
        for key in 0..KEYS {
            let own = held.iter().any(|h| h.gate == Gate::Own(key));
            let over = held.iter().any(|h| h.gate == Gate::Overflow(key));
            assert!(!(own && over), "key {key} holds permits of two gates");
        }
    }
}

fn run(ops: &[Op]) {
    let (keyed, clock) = per_key(1, 2, 4);
    let keyed = keyed
        .with_max_keys(MAX_KEYS)
        .with_idle(Duration::from_nanos(IDLE));
    let mut reference = Reference {
        keys: (0..KEYS).map(|_| None).collect(),
        overflow: RefState::new(0),
    };
    let mut held: Vec<Held> = Vec::new();
    for op in ops {
        let now = clock.now();
        let before: Vec<bool> = reference.keys.iter().map(Option::is_some).collect();
        match *op {
            Op::Acquire(key) => {
                let overflow_before = keyed.overflow().in_flight();
                let got = keyed.try_acquire(&key);
                let k = key as usize;
                let expected_gate;
                let expected;
                if let Some(state) = reference.keys[k].as_mut() {
                    state.touch(now);
                    expected = state.admit();
                    expected_gate = Gate::Own(key);
                } else {
                    // Room: under the cap, or an idle key to evict (the
                    // search covers these small tables).
                    let room = reference.resident() < MAX_KEYS
                        || reference.keys.iter().flatten().any(|s| s.idle(now));
                    let resident_after = keyed.limit_of(&key).is_some();
                    if room && reference.overflow.in_flight == 0 {
                        assert!(resident_after, "key {key} should have got a state");
                        let mut state = RefState::new(now);
                        expected = state.admit();
                        reference.keys[k] = Some(state);
                        expected_gate = Gate::Own(key);
                    } else {
                        assert!(!resident_after, "key {key} inserted beside a busy overflow");
                        expected = reference.overflow.admit();
                        expected_gate = Gate::Overflow(key);
                    }
                }
                assert_eq!(
                    got.as_ref().map(|p| p.granted_in_flight()),
                    expected,
                    "{op:?} at {now}"
                );
                let on_overflow = keyed.overflow().in_flight() > overflow_before;
                assert_eq!(
                    on_overflow,
                    got.is_some() && matches!(expected_gate, Gate::Overflow(_))
                );
                if let Some(permit) = got {
                    held.push(Held {
                        gate: expected_gate,
                        granted_in_flight: permit.granted_in_flight(),
                        permit,
                        granted_at: now,
                    });
                }
            }
            Op::End(index, end) => {
                if held.is_empty() {
                    continue;
                }
                let h = held.remove(index % held.len());
                let state = match h.gate {
                    Gate::Own(key) => reference.keys[key as usize]
                        .as_mut()
                        .expect("a key with a permit out is resident"),
                    Gate::Overflow(_) => &mut reference.overflow,
                };
                let outcome = match end {
                    End::Success => {
                        h.permit.success();
                        Outcome::Success
                    }
                    End::Dropped => {
                        h.permit.dropped();
                        Outcome::Dropped
                    }
                    End::Ignore => {
                        h.permit.ignore();
                        Outcome::Ignored
                    }
                    End::Drop => {
                        drop(h.permit);
                        Outcome::Ignored
                    }
                };
                if outcome != Outcome::Ignored {
                    state.algorithm.on_sample(
                        Sample {
                            rtt_ns: now - h.granted_at,
                            in_flight: h.granted_in_flight,
                            outcome,
                        },
                        now,
                    );
                }
                state.in_flight -= 1;
            }
            Op::Advance(ns) => clock.advance(Duration::from_nanos(ns)),
            Op::Sweep => {
                let evicted = keyed.sweep();
                let mut expected = 0;
                for (key, slot) in reference.keys.iter_mut().enumerate() {
                    if slot.as_ref().is_some_and(|s| s.idle(now)) {
                        *slot = None;
                        expected += 1;
                        assert_eq!(keyed.limit_of(&(key as u32)), None);
                    }
                }
                assert_eq!(evicted, expected, "a sweep takes every idle key");
            }
        }
        // Keys the implementation evicted on its own (an insert's sweep, a
        // search for room) must have been idle.
        for key in 0..KEYS {
            let k = key as usize;
            if reference.keys[k].is_some() && keyed.limit_of(&key).is_none() {
                assert!(before[k], "key {key} vanished the moment it was made");
                let state = reference.keys[k].take().unwrap();
                assert!(state.idle(now), "key {key} evicted while in use");
            }
        }
        reference.check_one_gate(&held);
        for key in 0..KEYS {
            let k = key as usize;
            let want = reference.keys[k].as_ref();
            assert_eq!(
                keyed.limit_of(&key),
                want.map(|s| s.algorithm.limit()),
                "key {key}'s limit after {op:?}"
            );
            assert_eq!(
                keyed.in_flight_of(&key),
                want.map_or(0, |s| s.in_flight),
                "key {key}'s in flight after {op:?}"
            );
        }
        assert_eq!(
            keyed.overflow().limit(),
            reference.overflow.algorithm.limit()
        );
        assert_eq!(keyed.overflow().in_flight(), reference.overflow.in_flight);
        assert_eq!(keyed.len(), reference.resident());
        assert!(keyed.len() <= MAX_KEYS);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn agrees_with_the_reference(ops in prop::collection::vec(op(), 1..120)) {
        run(&ops);
    }
}

// ---- Stress ----

/// Threads on a few hot keys, some waiting asynchronously, while a thread
/// sweeps without pause and the cap forces the overflow: every holder counts
/// itself per key, independently of the gates, and the count never exceeds
/// the key's fixed limit.
#[test]
fn stress_per_key_in_flight_never_exceeds_the_limit() {
    const LIMIT: u32 = 2;
    const THREADS: u32 = 4;
    let keyed = Arc::new(
        KeyedAdaptiveLimit::<u32, Aimd>::new(aimd(LIMIT, LIMIT, LIMIT))
            .unwrap()
            .with_max_keys(2)
            .with_idle(Duration::ZERO),
    );
    let counts: Arc<Vec<AtomicU32>> = Arc::new((0..4).map(|_| AtomicU32::new(0)).collect());
    let done = Arc::new(AtomicBool::new(false));
    let admitted = Arc::new(AtomicU64::new(0));
    let sweeper = {
        let (keyed, done) = (keyed.clone(), done.clone());
        thread::spawn(move || {
            let mut swept = 0;
            while !done.load(Ordering::Relaxed) {
                swept += keyed.sweep();
            }
            swept
        })
    };
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let (keyed, counts, admitted) = (keyed.clone(), counts.clone(), admitted.clone());
            thread::spawn(move || {
                let mut seed = 0x9E37_79B9_7F4A_7C15u64 ^ u64::from(t);
                for i in 0..20_000u32 {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    let key = (seed % 4) as u32;
                    let permit = if t == 0 && i % 4 == 0 {
                        Some(block_on(keyed.acquire_async(&key)))
                    } else {
                        keyed.try_acquire(&key)
                    };
                    let Some(permit) = permit else { continue };
                    let count = &counts[key as usize];
                    let now = count.fetch_add(1, Ordering::SeqCst) + 1;
                    assert!(now <= LIMIT, "{now} in flight for key {key}, limit {LIMIT}");
                    admitted.fetch_add(1, Ordering::Relaxed);
                    for _ in 0..(seed % 64) {
                        std::hint::spin_loop();
                    }
                    if seed % 7 == 0 {
                        thread::yield_now();
                    }
                    count.fetch_sub(1, Ordering::SeqCst);
                    match seed % 3 {
                        0 => permit.success(),
                        1 => permit.dropped(),
                        _ => permit.ignore(),
                    }
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().unwrap();
    }
    done.store(true, Ordering::Relaxed);
    let swept = sweeper.join().unwrap();
    for key in 0..4 {
        assert_eq!(keyed.in_flight_of(&key), 0);
    }
    assert_eq!(keyed.overflow().in_flight(), 0);
    assert!(keyed.len() <= 2);
    // The races the test is for did happen.
    assert!(
        keyed.evicted() > 0 && keyed.overflowed() > 0,
        "evicted {} ({swept} by the sweeper), overflowed {}",
        keyed.evicted(),
        keyed.overflowed()
    );
    eprintln!(
        "stress: {} admitted, {} evicted ({swept} by the sweeper), {} overflowed",
        admitted.load(Ordering::Relaxed),
        keyed.evicted(),
        keyed.overflowed()
    );
    assert!(admitted.load(Ordering::Relaxed) > 1000);
}
