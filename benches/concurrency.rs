//! Permit acquire + release of tollgate's concurrency limit against its
//! locking twin, `tokio::sync::Semaphore` and tower's `ConcurrencyLimit`
//! service, in one run, at 1, 2 and 4 threads.
//!
//! One operation is: try to take a permit without waiting; if granted, hold it
//! across a `black_box` and drop it. Two workloads:
//!
//! - **free**: a limit of 1,024, far above the threads, so every try is
//!   granted (asserted) and every operation writes the shared word twice
//!   (admission and release);
//! - **binding**: a limit of 1 shared by 2 or 4 threads, so tries fail often
//!   (a failed try reads the word and writes nothing); the share granted is
//!   printed. Not run at 1 thread, where a limit of 1 never binds.
//!
//! Functions: `tollgate-atomic` (`ConcurrencyLimit::try_acquire`),
//! `tollgate-adaptive` (`AdaptiveLimit` over AIMD, each permit ended with
//! `success()`: two clock readings and a sample to the algorithm on top of
//! the gate; its limit cannot move here — min = max — so the row is the cost
//! of adapting at a steady limit, not of moving it),
//! `tollgate-adaptive-moving` (`AdaptiveLimit` over an algorithm whose limit
//! moves on every sample, between the workload's limit and one more: every
//! release sets the gate's limit and re-reads the algorithm; under the
//! binding workload the limit is 1 or 2),
//! `tollgate-roundtrip` (`AdaptiveLimit` over `RoundTrip` held at the
//! workload's limit: a success lands in or closes a round, and a close folds
//! the filters and decides, on every release),
//! `tollgate-twin` (`LockingConcurrencyLimit::try_acquire`),
//! `tokio-semaphore` (`Semaphore::try_acquire`, whose release always takes
//! the semaphore's waiter lock), and `tower` (a trivial service, one clone
//! per thread, behind `tower::limit::ConcurrencyLimit`: `poll_ready` with a
//! no-op waker, then `call` and the response future polled to completion,
//! which drops the permit — tower's whole per-request path, so its row pays
//! the service machinery and an `OwnedSemaphorePermit` (an `Arc` clone) on
//! top of the semaphore. A `poll_ready` that finds no permit leaves an
//! acquire queued in the clone's `PollSemaphore`, which later completes it:
//! under the binding workload tower waits in line where the others fail, so
//! its share granted is not comparable, only its cost per operation).
//!
//! Groups are `concurrency/<workload>/<threads>t`. One criterion iteration is
//! one operation on each of the `threads` threads, timed from the first
//! thread's start to the last thread's end, so elements/s is total operations
//! per second. The machine these benches are run on has 2 cores: 4 threads
//! oversubscribe it.

use std::convert::Infallible;
use std::future::{Future, Ready, ready};
use std::hint::black_box;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use criterion::{Criterion, criterion_group, criterion_main};
use std::sync::atomic::{AtomicU32, Ordering};
use tokio::sync::Semaphore;
use tollgate::{
    AdaptiveLimit, Aimd, ConcurrencyLimit, LimitAlgorithm, LockingConcurrencyLimit, RoundTrip,
    Sample,
};
use tower::Service;

mod common;
use common::THREADS;

/// The operation: try to take a permit, hold it, give it back; `true` if
/// granted.
trait Gate: Send + Sync + 'static {
    /// Per-thread state (tower's service clone).
    type Local: Send + 'static;
    fn local(&self) -> Self::Local;
    fn op(&self, local: &mut Self::Local) -> bool;
}

impl Gate for ConcurrencyLimit {
    type Local = ();
    fn local(&self) {}
    #[inline]
    fn op(&self, _: &mut ()) -> bool {
        self.try_acquire().map(|p| drop(black_box(p))).is_some()
    }
}

impl Gate for AdaptiveLimit<Aimd> {
    type Local = ();
    fn local(&self) {}
    #[inline]
    fn op(&self, _: &mut ()) -> bool {
        self.try_acquire().map(|p| black_box(p).success()).is_some()
    }
}

impl Gate for AdaptiveLimit<RoundTrip> {
    type Local = ();
    fn local(&self) {}
    #[inline]
    fn op(&self, _: &mut ()) -> bool {
        self.try_acquire().map(|p| black_box(p).success()).is_some()
    }
}

/// An algorithm whose limit moves on every sample, between `low` and
/// `low + 1`: the gate's moving path (the new limit set on the gate, the
/// algorithm re-read) on every release, with no algorithm cost to speak of.
struct Toggle {
    low: u32,
    up: AtomicU32,
}

impl LimitAlgorithm for Toggle {
    fn on_sample(&self, _: Sample, _: u64) -> Option<u32> {
        // Relaxed: a bench's stand-in; the gate re-reads `limit()`.
        Some(self.low + (self.up.fetch_xor(1, Ordering::Relaxed) ^ 1))
    }

    fn limit(&self) -> u32 {
        self.low + self.up.load(Ordering::Relaxed)
    }
}

impl Gate for AdaptiveLimit<Toggle> {
    type Local = ();
    fn local(&self) {}
    #[inline]
    fn op(&self, _: &mut ()) -> bool {
        self.try_acquire().map(|p| black_box(p).success()).is_some()
    }
}

impl Gate for LockingConcurrencyLimit {
    type Local = ();
    fn local(&self) {}
    #[inline]
    fn op(&self, _: &mut ()) -> bool {
        self.try_acquire().map(|p| drop(black_box(p))).is_some()
    }
}

impl Gate for Semaphore {
    type Local = ();
    fn local(&self) {}
    #[inline]
    fn op(&self, _: &mut ()) -> bool {
        self.try_acquire().map(|p| drop(black_box(p))).is_ok()
    }
}

/// The trivial service: answers at once.
#[derive(Clone, Copy)]
struct Nothing;

impl Service<()> for Nothing {
    type Response = ();
    type Error = Infallible;
    type Future = Ready<Result<(), Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, (): ()) -> Self::Future {
        ready(Ok(()))
    }
}

/// tower's limit around [`Nothing`]; each thread drives its own clone (the
/// clones share one semaphore).
struct Tower(tower::limit::ConcurrencyLimit<Nothing>);

impl Gate for Tower {
    type Local = tower::limit::ConcurrencyLimit<Nothing>;
    fn local(&self) -> Self::Local {
        self.0.clone()
    }
    #[inline]
    fn op(&self, service: &mut Self::Local) -> bool {
        let mut cx = Context::from_waker(Waker::noop());
        match service.poll_ready(&mut cx) {
            Poll::Ready(Ok(())) => {
                let response = pin!(service.call(()));
                matches!(response.poll(&mut cx), Poll::Ready(Ok(())))
            }
            _ => false,
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Workload {
    Free,
    Binding,
}

impl Workload {
    fn name(self) -> &'static str {
        match self {
            Workload::Free => "free",
            Workload::Binding => "binding",
        }
    }

    fn limit(self) -> u32 {
        match self {
            Workload::Free => 1024,
            Workload::Binding => 1,
        }
    }
}

fn bench<G: Gate>(
    c: &mut Criterion,
    workload: Workload,
    threads: usize,
    function: &str,
    make: impl Fn(u32) -> G,
) {
    let group = format!("concurrency/{}/{threads}t", workload.name());
    let (mut granted, mut ops) = (0u64, 0u64);
    common::bench_threads(c, &group, function, threads, |iters| {
        let gate = Arc::new(make(workload.limit()));
        let run = common::run_threads(threads, false, |_| {
            let gate = Arc::clone(&gate);
            let mut local = gate.local();
            move || (0..iters).map(|_| u64::from(gate.op(&mut local))).sum()
        });
        if workload == Workload::Free {
            assert_eq!(run.count, iters * threads as u64, "every try is granted");
        }
        granted += run.count;
        ops += iters * threads as u64;
        run.wall
    });
    if workload == Workload::Binding && ops > 0 {
        eprintln!(
            "{group}/{function}: {:.1}% of {ops} tries granted",
            100.0 * granted as f64 / ops as f64
        );
    }
}

fn concurrency(c: &mut Criterion) {
    for workload in [Workload::Free, Workload::Binding] {
        for threads in THREADS {
            if workload == Workload::Binding && threads == 1 {
                continue;
            }
            bench(c, workload, threads, "tollgate-atomic", |limit| {
                ConcurrencyLimit::new(limit).unwrap()
            });
            bench(c, workload, threads, "tollgate-adaptive", |limit| {
                let aimd = Aimd::builder()
                    .min_limit(limit)
                    .initial_limit(limit)
                    .max_limit(limit)
                    .build()
                    .unwrap();
                AdaptiveLimit::new(aimd).unwrap()
            });
            bench(c, workload, threads, "tollgate-adaptive-moving", |limit| {
                let toggle = Toggle {
                    low: limit,
                    up: AtomicU32::new(0),
                };
                AdaptiveLimit::new(toggle).unwrap()
            });
            bench(c, workload, threads, "tollgate-roundtrip", |limit| {
                let round_trip = RoundTrip::builder()
                    .min_limit(limit)
                    .initial_limit(limit)
                    .max_limit(limit)
                    .build()
                    .unwrap();
                AdaptiveLimit::new(round_trip).unwrap()
            });
            bench(c, workload, threads, "tollgate-twin", |limit| {
                LockingConcurrencyLimit::new(limit).unwrap()
            });
            bench(c, workload, threads, "tokio-semaphore", |limit| {
                Semaphore::new(limit as usize)
            });
            bench(c, workload, threads, "tower", |limit| {
                Tower(tower::limit::ConcurrencyLimit::new(Nothing, limit as usize))
            });
        }
    }
}

criterion_group! {
    name = benches;
    config = common::config();
    targets = concurrency
}
criterion_main!(benches);
