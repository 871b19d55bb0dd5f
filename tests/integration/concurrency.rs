//! The concurrency limit and its locking twin: against a reference model over
//! random operation sequences, under stress with recorded admissions, and
//! waiting (blocking and async), with every interleaving a test needs caused
//! by the test itself (futures polled by hand, a thread released only after
//! the test has seen it queued).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::thread;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use tollgate::{ConcurrencyLimit, ConfigError, LockingConcurrencyLimit, Permit, PermitSource};

const MAX: u32 = ConcurrencyLimit::MAX_LIMIT;

#[test]
fn bad_limits_are_refused_with_a_clear_error() {
    for bad in [0, MAX + 1, u32::MAX] {
        let want = ConfigError::InvalidConcurrencyLimit {
            limit: bad,
            max: MAX,
        };
        assert_eq!(ConcurrencyLimit::new(bad).unwrap_err(), want);
        assert_eq!(LockingConcurrencyLimit::new(bad).unwrap_err(), want);
        let limit = ConcurrencyLimit::new(3).unwrap();
        assert_eq!(limit.set_limit(bad), Err(want));
        assert_eq!(limit.limit(), 3, "a refused limit changes nothing");
    }
    assert_eq!(MAX, (1 << 31) - 1);
    let widest = ConcurrencyLimit::new(MAX).unwrap();
    assert_eq!(widest.try_acquire().unwrap().granted_limit(), MAX);
}

/// One step of a random sequence.
#[derive(Debug, Clone)]
enum Op {
    Acquire,
    /// Drops the held permit at this index (modulo how many are held).
    Release(usize),
    /// Any value, valid or not: 0 and values above the maximum must be
    /// refused and change nothing.
    SetLimit(u32),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => Just(Op::Acquire),
        3 => any::<usize>().prop_map(Op::Release),
        2 => (0u32..=6).prop_map(Op::SetLimit),
        1 => Just(Op::SetLimit(MAX + 1)),
    ]
}

/// The sequential specification: a count and a limit.
#[derive(Debug)]
struct Reference {
    in_flight: u32,
    limit: u32,
}

impl Reference {
    /// Admits iff a permit is free; the report is the count and limit after.
    fn acquire(&mut self) -> Option<(u32, u32)> {
        (self.in_flight < self.limit).then(|| {
            self.in_flight += 1;
            (self.in_flight, self.limit)
        })
    }

    fn set_limit(&mut self, limit: u32) -> bool {
        let valid = (1..=MAX).contains(&limit);
        if valid {
            self.limit = limit;
        }
        valid
    }
}

/// A permit's report, if granted.
fn report<L: PermitSource>(permit: &Option<Permit<'_, L>>) -> Option<(u32, u32)> {
    permit
        .as_ref()
        .map(|p| (p.granted_in_flight(), p.granted_limit()))
}

proptest! {
    /// The atomic limit, its twin and the reference agree decision for
    /// decision, report for report, on every sequence of acquires, releases
    /// of held permits and limit changes (the reference admits only below
    /// the limit, so after a shrink nothing is admitted until releases bring
    /// the count under it).
    #[test]
    fn atomic_twin_and_reference_agree(initial in 1u32..=4, ops in prop::collection::vec(op(), 1..80)) {
        let atomic = ConcurrencyLimit::new(initial).unwrap();
        let twin = LockingConcurrencyLimit::new(initial).unwrap();
        let mut reference = Reference { in_flight: 0, limit: initial };
        let (mut held_atomic, mut held_twin) = (Vec::new(), Vec::new());
        for op in ops {
            match op {
                Op::Acquire => {
                    let want = reference.acquire();
                    let a = atomic.try_acquire();
                    let t = twin.try_acquire();
                    prop_assert_eq!(report(&a), want);
                    prop_assert_eq!(report(&t), want);
                    if let (Some(a), Some(t)) = (a, t) {
                        held_atomic.push(a);
                        held_twin.push(t);
                        prop_assert!(reference.in_flight <= reference.limit);
                    }
                }
                Op::Release(i) => {
                    if !held_atomic.is_empty() {
                        let i = i % held_atomic.len();
                        drop(held_atomic.swap_remove(i));
                        drop(held_twin.swap_remove(i));
                        reference.in_flight -= 1;
                    }
                }
                Op::SetLimit(limit) => {
                    let valid = reference.set_limit(limit);
                    prop_assert_eq!(atomic.set_limit(limit).is_ok(), valid);
                    prop_assert_eq!(twin.set_limit(limit).is_ok(), valid);
                }
            }
            prop_assert_eq!((atomic.in_flight(), atomic.limit()), (reference.in_flight, reference.limit));
            prop_assert_eq!((twin.in_flight(), twin.limit()), (reference.in_flight, reference.limit));
        }
        drop(held_atomic);
        drop(held_twin);
        prop_assert_eq!((atomic.in_flight(), twin.in_flight()), (0, 0));
    }
}

/// Threads acquire (blocking, with and without a timeout, and without
/// waiting), hold briefly and release, while another thread moves the limit
/// between 2 and 4. Each admission's own report and an independent count of
/// holders stay within the limits; afterwards nothing is in flight.
#[test]
fn stress_recorded_admissions_stay_within_the_limit() {
    const THREADS: usize = 4;
    const ROUNDS: u32 = 2_000;
    let limit = Arc::new(ConcurrencyLimit::new(2).unwrap());
    let holders = Arc::new(AtomicU32::new(0));
    let most_reported = Arc::new(AtomicU32::new(0));
    let admitted = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let resizer = {
        let (limit, stop) = (limit.clone(), stop.clone());
        thread::spawn(move || {
            let mut grow = true;
            while !stop.load(Ordering::Relaxed) {
                limit.set_limit(if grow { 4 } else { 2 }).unwrap();
                grow = !grow;
                thread::yield_now();
            }
        })
    };
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let (limit, holders) = (limit.clone(), holders.clone());
            let (most, admitted) = (most_reported.clone(), admitted.clone());
            thread::spawn(move || {
                for round in 0..ROUNDS {
                    let permit = match (t + round as usize) % 3 {
                        0 => Some(limit.acquire()),
                        1 => limit.acquire_timeout(Duration::from_millis(50)),
                        _ => limit.try_acquire(),
                    };
                    let Some(permit) = permit else { continue };
                    assert!(permit.granted_in_flight() <= permit.granted_limit());
                    most.fetch_max(permit.granted_in_flight(), Ordering::Relaxed);
                    // Counted in after the admission, out before the release:
                    // never more than the permits the word has granted.
                    let now = holders.fetch_add(1, Ordering::SeqCst) + 1;
                    assert!(now <= 4, "{now} holders against limits of at most 4");
                    thread::yield_now();
                    holders.fetch_sub(1, Ordering::SeqCst);
                    admitted.fetch_add(1, Ordering::Relaxed);
                    drop(permit);
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    resizer.join().unwrap();
    assert!(most_reported.load(Ordering::Relaxed) <= 4);
    assert!(admitted.load(Ordering::Relaxed) > 0);
    assert_eq!(limit.in_flight(), 0);
    let fresh: Vec<_> = (0..limit.limit()).map(|_| limit.try_acquire()).collect();
    assert!(fresh.iter().all(Option::is_some));
}

/// With a fixed limit, every admission's report is within it.
#[test]
fn stress_a_fixed_limit_is_never_passed() {
    let limit = Arc::new(LockingConcurrencyLimit::new(3).unwrap());
    let atomic = Arc::new(ConcurrencyLimit::new(3).unwrap());
    let holders = Arc::new(AtomicU32::new(0));
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let (limit, atomic, holders) = (limit.clone(), atomic.clone(), holders.clone());
            thread::spawn(move || {
                for _ in 0..5_000 {
                    let (a, b) = (atomic.acquire(), limit.acquire());
                    assert!(a.granted_in_flight() <= 3 && b.granted_in_flight() <= 3);
                    let now = holders.fetch_add(1, Ordering::SeqCst) + 1;
                    assert!(now <= 3);
                    holders.fetch_sub(1, Ordering::SeqCst);
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().unwrap();
    }
    assert_eq!((atomic.in_flight(), limit.in_flight()), (0, 0));
}

/// A waker that records that it was woken.
#[derive(Default)]
struct Flag(AtomicBool);

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.0.store(true, Ordering::SeqCst);
    }
}

impl Flag {
    fn waker() -> (Arc<Flag>, Waker) {
        let flag = Arc::new(Flag::default());
        (flag.clone(), Waker::from(flag))
    }

    fn take(&self) -> bool {
        self.0.swap(false, Ordering::SeqCst)
    }
}

fn poll<F: Future>(future: Pin<&mut F>, waker: &Waker) -> Poll<F::Output> {
    future.poll(&mut Context::from_waker(waker))
}

/// A future polled by hand with a waker of its own.
struct Waiter<F> {
    future: Pin<Box<F>>,
    flag: Arc<Flag>,
    waker: Waker,
}

impl<F: Future> Waiter<F> {
    /// `future`, polled once and found asleep.
    fn asleep(future: F) -> Self {
        let (flag, waker) = Flag::waker();
        let mut waiter = Waiter {
            future: Box::pin(future),
            flag,
            waker,
        };
        assert!(waiter.poll().is_pending());
        waiter
    }

    fn poll(&mut self) -> Poll<F::Output> {
        poll(self.future.as_mut(), &self.waker)
    }

    /// Whether its waker was woken since last asked.
    fn woken(&self) -> bool {
        self.flag.take()
    }
}

/// Waits until `done` holds: the test's way to cause an interleaving it
/// needs (a thread asleep in the queue) rather than hope for it.
fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(Instant::now() < deadline, "never: {what}");
        thread::sleep(Duration::from_millis(1));
    }
}

macro_rules! waiting_tests {
    ($module:ident, $limit:ty) => {
        mod $module {
            use super::*;

            type Limit = $limit;

            /// Two futures put to sleep in order behind the limit's one
            /// permit; then that permit released, which wakes the first.
            fn two_asleep_then_released(
                limit: &Limit,
            ) -> [Waiter<impl Future<Output = Permit<'_, Limit>> + '_>; 2] {
                let held = limit.try_acquire().unwrap();
                let waiters = [(), ()].map(|()| Waiter::asleep(limit.acquire_async()));
                drop(held);
                assert!(waiters[0].woken(), "the release woke the first waiter");
                waiters
            }

            /// A thread asleep in the queue behind the limit's one permit,
            /// which the caller holds; woken, the thread runs `then`.
            fn thread_asleep_behind_held<T: Send + 'static>(
                then: impl FnOnce(&Limit) -> T + Send + 'static,
            ) -> (Arc<Limit>, impl Sized, thread::JoinHandle<T>) {
                let limit = Arc::new(Limit::new(1).unwrap());
                let held = limit.try_acquire_owned().unwrap();
                let waiter = {
                    let limit = limit.clone();
                    thread::spawn(move || then(&limit))
                };
                eventually("the thread sleeps", || limit.has_waiters());
                (limit, held, waiter)
            }

            /// Futures polled by hand: a release wakes the first queued,
            /// which then takes the permit; the second stays asleep.
            #[test]
            fn a_release_wakes_the_first_queued_future() {
                let limit = Limit::new(1).unwrap();
                let [mut first, mut second] = two_asleep_then_released(&limit);
                assert!(!second.woken(), "and only it");
                let Poll::Ready(permit) = first.poll() else {
                    panic!("the woken waiter takes the freed permit");
                };
                assert_eq!(permit.granted_in_flight(), 1);
                assert!(second.poll().is_pending());
                drop(permit);
                assert!(second.woken());
                assert!(second.poll().is_ready());
            }

            /// Growing the limit wakes as many sleepers as it opens room for.
            #[test]
            fn growth_wakes_waiters_for_the_room_it_opens() {
                let limit = Limit::new(1).unwrap();
                let _held = limit.try_acquire().unwrap();
                let mut waiters: Vec<_> = (0..3)
                    .map(|_| Waiter::asleep(limit.acquire_async()))
                    .collect();
                limit.set_limit(3).unwrap();
                let woken: Vec<bool> = waiters.iter().map(Waiter::woken).collect();
                assert_eq!(woken, [true, true, false]);
                let mut permits = Vec::new();
                for waiter in waiters.iter_mut().take(2) {
                    match waiter.poll() {
                        Poll::Ready(permit) => permits.push(permit),
                        Poll::Pending => panic!("a woken waiter finds room"),
                    }
                }
                assert_eq!(limit.in_flight(), 3);
                assert!(waiters[2].poll().is_pending());
            }

            /// A woken future dropped before it is polled again passes the
            /// wake-up on; a sleeping one dropped leaves the queue. Neither
            /// holds a permit.
            #[test]
            fn a_dropped_future_strands_nothing_and_passes_its_wake_up_on() {
                let limit = Limit::new(1).unwrap();
                let [first, mut second] = two_asleep_then_released(&limit);
                drop(first); // woken, never polled again
                assert!(second.woken(), "the wake-up was passed on");
                assert_eq!(limit.in_flight(), 0, "the dropped future held nothing");
                let permit = match second.poll() {
                    Poll::Ready(permit) => permit,
                    Poll::Pending => panic!("the passed-on wake-up finds the permit"),
                };
                // A sleeper dropped: nothing held, nobody left to wake.
                let third = Waiter::asleep(limit.acquire_async());
                assert!(limit.has_waiters());
                drop(third);
                assert!(!limit.has_waiters(), "the sleeper left the queue");
                drop(permit);
                assert_eq!(limit.in_flight(), 0);
                assert!(limit.try_acquire().is_some());
            }

            /// A leaked future holds no permit.
            #[test]
            fn a_leaked_future_holds_no_permit() {
                let limit = Limit::new(1).unwrap();
                let held = limit.try_acquire().unwrap();
                let (_, waker) = Flag::waker();
                let mut leaked = Box::pin(limit.acquire_async());
                assert!(poll(leaked.as_mut(), &waker).is_pending());
                std::mem::forget(leaked);
                drop(held);
                assert_eq!(limit.in_flight(), 0);
                assert!(limit.try_acquire().is_some(), "nothing stranded");
            }

            /// A try_acquire may take the permit a woken waiter was about
            /// to take; the waiter then sleeps again at the head.
            #[test]
            fn a_woken_waiter_that_loses_the_permit_sleeps_again_first() {
                let limit = Limit::new(1).unwrap();
                let [mut first, second] = two_asleep_then_released(&limit);
                let barger = limit.try_acquire().expect("the freed permit");
                assert!(first.poll().is_pending());
                drop(barger);
                assert!(first.woken(), "first again, not the second");
                assert!(!second.woken());
                assert!(first.poll().is_ready());
            }

            /// A blocked thread is woken by a release, made only once the
            /// thread sleeps in the queue.
            #[test]
            fn a_release_wakes_a_blocked_thread() {
                let (limit, held, waiter) =
                    thread_asleep_behind_held(|limit| limit.acquire().granted_in_flight());
                drop(held);
                assert_eq!(waiter.join().unwrap(), 1);
                assert_eq!(limit.in_flight(), 0);
            }

            /// A blocked thread is woken by growth, while the permit it
            /// waited behind is still held.
            #[test]
            fn growth_wakes_a_blocked_thread() {
                let (limit, held, waiter) = thread_asleep_behind_held(|limit| {
                    let permit = limit.acquire();
                    (permit.granted_in_flight(), permit.granted_limit())
                });
                limit.set_limit(2).unwrap();
                assert_eq!(waiter.join().unwrap(), (2, 2));
                drop(held);
                assert_eq!(limit.in_flight(), 0);
            }

            /// A blocking timeout gives up no sooner than asked, holding
            /// nothing and leaving the queue: a release afterwards frees the
            /// permit for anyone.
            #[test]
            fn a_blocking_timeout_returns_none_and_leaves_nothing() {
                let limit = Limit::new(1).unwrap();
                let held = limit.try_acquire().unwrap();
                let start = Instant::now();
                assert!(limit.acquire_timeout(Duration::from_millis(30)).is_none());
                assert!(start.elapsed() >= Duration::from_millis(30));
                assert!(limit.acquire_timeout(Duration::ZERO).is_none());
                drop(held);
                assert_eq!(limit.in_flight(), 0);
                assert!(limit.acquire_timeout(Duration::ZERO).is_some());
            }

            /// Shrinking revokes nothing and admits nobody until the count
            /// is under the new limit; then the new limit holds.
            #[test]
            fn shrinking_waits_for_releases() {
                let limit = Limit::new(3).unwrap();
                let held: Vec<_> = (0..3).map(|_| limit.try_acquire().unwrap()).collect();
                limit.set_limit(1).unwrap();
                assert_eq!(limit.in_flight(), 3);
                let mut held = held.into_iter();
                drop(held.next());
                drop(held.next());
                assert!(limit.try_acquire().is_none(), "one held fills a limit of 1");
                drop(held.next());
                let only = limit.try_acquire().unwrap();
                assert_eq!((only.granted_in_flight(), only.granted_limit()), (1, 1));
                assert!(limit.try_acquire().is_none());
            }

            #[cfg(feature = "tokio")]
            #[tokio::test]
            async fn an_async_timeout_returns_none_and_strands_nothing() {
                let limit = Limit::new(1).unwrap();
                let held = limit.acquire_async().await;
                let start = Instant::now();
                assert!(
                    limit
                        .acquire_timeout_async(Duration::from_millis(20))
                        .await
                        .is_none()
                );
                assert!(start.elapsed() >= Duration::from_millis(20));
                drop(held);
                assert_eq!(limit.in_flight(), 0);
                let permit = limit.acquire_timeout_async(Duration::from_secs(5)).await;
                assert_eq!(permit.map(|p| p.granted_in_flight()), Some(1));
            }

            /// Many tasks on a multi-threaded runtime, some cancelled by
            /// timeouts: all that finish were within the limit, and nothing
            /// is left in flight.
            #[cfg(feature = "tokio")]
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn tasks_with_timeouts_strand_nothing() {
                let limit = Arc::new(Limit::new(2).unwrap());
                let holders = Arc::new(AtomicU32::new(0));
                let tasks: Vec<_> = (0..50u64)
                    .map(|i| {
                        let (limit, holders) = (limit.clone(), holders.clone());
                        tokio::spawn(async move {
                            let wait = Duration::from_micros(50 * (i % 7));
                            if let Some(permit) = limit.acquire_timeout_async(wait).await {
                                assert!(holders.fetch_add(1, Ordering::SeqCst) < 2);
                                tokio::task::yield_now().await;
                                holders.fetch_sub(1, Ordering::SeqCst);
                                drop(permit);
                            }
                            let permit = Arc::clone(&limit).acquire_owned_async().await;
                            assert!(permit.granted_in_flight() <= 2);
                        })
                    })
                    .collect();
                for task in tasks {
                    task.await.unwrap();
                }
                assert_eq!(limit.in_flight(), 0);
            }
        }
    };
}

waiting_tests!(atomic, ConcurrencyLimit);
waiting_tests!(twin, LockingConcurrencyLimit);
