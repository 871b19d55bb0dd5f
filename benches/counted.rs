//! What counting costs (`Counted`) beside the bare limiter, and what an
//! `AllOf` of two buckets costs beside asking both in turn: at 1 and 2
//! threads, allow-heavy and deny-heavy (the workloads of `benches/limiters.rs`,
//! same harness), and for `AllOf` at the limit too, where the second bucket
//! denies what the first admitted and refunds run under contention.
//!
//! Groups are `counted/<limiter>/<workload>/<threads>t` with functions `bare`
//! and `counted`, and `all_of/token_buckets/<workload>/<threads>t` with
//! `two-calls`, `all_of` (reported) and `all_of-plain`. Each iteration is one check on each thread.
//!
//! With the `metrics` feature, the token bucket's allow-heavy groups and
//! its at-the-limit groups (`counted/token_bucket/limit/<threads>t`, which
//! run with or without the feature) add `published`: the counted bucket
//! while a thread of its own publishes its counts to a recorder (metrics-util's
//! debugging recorder, installed for the bench) every millisecond, a
//! thousand times more often than a Prometheus scrape.
//!
//! ```sh
//! cargo bench --bench counted
//! cargo bench --features metrics --bench counted -- 'counted/token_bucket/(allow|limit)'
//! ```

use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use tollgate::{AllOf, Counted, FixedWindow, Rate, RateLimiter, TokenBucket};

mod common;
use common::{Check, Workload};

struct Bare<L>(L);

impl<L: RateLimiter + Send + Sync + 'static> Check for Bare<L> {
    #[inline]
    fn check(&self) -> bool {
        self.0.try_acquire().is_ok()
    }
}

/// Two buckets asked in turn, without refunds: the baseline `AllOf` adds to.
struct TwoCalls(TokenBucket, TokenBucket);

impl Check for TwoCalls {
    #[inline]
    fn check(&self) -> bool {
        self.0.try_acquire().is_ok() && self.1.try_acquire().is_ok()
    }
}

struct BothOf(AllOf<(TokenBucket, TokenBucket)>);

impl Check for BothOf {
    #[inline]
    fn check(&self) -> bool {
        std::hint::black_box(self.0.try_acquire_reporting()).is_ok()
    }
}

/// The same decision through the plain `try_acquire`: no reports.
struct BothOfPlain(AllOf<(TokenBucket, TokenBucket)>);

impl Check for BothOfPlain {
    #[inline]
    fn check(&self) -> bool {
        self.0.try_acquire().is_ok()
    }
}

/// A counted limiter published every millisecond by a thread of its own,
/// from construction until dropped (after the timed run).
#[cfg(feature = "metrics")]
struct Published<L: RateLimiter + Send + Sync + 'static> {
    counted: std::sync::Arc<Counted<L>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    publisher: Option<std::thread::JoinHandle<()>>,
}

#[cfg(feature = "metrics")]
impl<L: RateLimiter + Send + Sync + 'static> Published<L> {
    fn new(limiter: L) -> Self {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::{Arc, Once};
        static RECORDER: Once = Once::new();
        RECORDER.call_once(|| {
            metrics_util::debugging::DebuggingRecorder::new()
                .install()
                .expect("the bench's recorder")
        });
        let counted = Arc::new(Counted::new("bench", limiter));
        let stop = Arc::new(AtomicBool::new(false));
        let published = tollgate::Published::new().with(&counted);
        let publisher = {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    published.publish();
                    std::thread::sleep(Duration::from_millis(1));
                }
                // The last counts, with every check returned.
                published.publish();
            })
        };
        Published {
            counted,
            stop,
            publisher: Some(publisher),
        }
    }
}

#[cfg(feature = "metrics")]
impl<L: RateLimiter + Send + Sync + 'static> Drop for Published<L> {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(publisher) = self.publisher.take() {
            publisher.join().expect("the publisher");
        }
    }
}

#[cfg(feature = "metrics")]
impl<L: RateLimiter + Send + Sync + 'static> Check for Published<L> {
    #[inline]
    fn check(&self) -> bool {
        self.counted.try_acquire().is_ok()
    }
}

fn bench<L: Check>(
    c: &mut Criterion,
    name: &str,
    workload: Workload,
    threads: usize,
    function: &str,
    make: impl Fn() -> L,
) {
    common::bench_threads(c, name, function, threads, |iters| {
        let run = common::run_checks(make(), threads, iters, false);
        workload.assert_admitted(run.count, iters * threads as u64);
        run.wall
    });
}

/// A bucket that never denies (allow) or is empty for the hour (deny).
fn bucket(workload: Workload) -> TokenBucket {
    match workload {
        Workload::Allow => {
            TokenBucket::new(u32::MAX, Rate::new(1, Duration::from_nanos(1))).unwrap()
        }
        Workload::Deny => {
            let b = TokenBucket::new(1, Rate::per_hour(1)).unwrap();
            assert!(b.try_acquire().is_ok());
            b
        }
        Workload::Limit => unreachable!("this bench runs the allow and deny workloads only"),
    }
}

fn window(workload: Workload) -> FixedWindow {
    match workload {
        Workload::Allow => FixedWindow::new(Rate::new(u32::MAX, Duration::from_secs(5))).unwrap(),
        Workload::Deny => {
            let w = FixedWindow::new(Rate::per_hour(1)).unwrap();
            assert!(w.try_acquire().is_ok());
            w
        }
        Workload::Limit => unreachable!("this bench runs the allow and deny workloads only"),
    }
}

fn counted(c: &mut Criterion) {
    for workload in [Workload::Allow, Workload::Deny] {
        for threads in [1, 2] {
            let w = workload.name();
            let name = format!("counted/token_bucket/{w}/{threads}t");
            bench(c, &name, workload, threads, "bare", || {
                Bare(bucket(workload))
            });
            bench(c, &name, workload, threads, "counted", || {
                Bare(Counted::new("bench", bucket(workload)))
            });
            #[cfg(feature = "metrics")]
            if workload == Workload::Allow {
                bench(c, &name, workload, threads, "published", || {
                    Published::new(bucket(workload))
                });
            }
            let name = format!("counted/fixed_window/{w}/{threads}t");
            bench(c, &name, workload, threads, "bare", || {
                Bare(window(workload))
            });
            bench(c, &name, workload, threads, "counted", || {
                Bare(Counted::new("bench", window(workload)))
            });
            let name = format!("all_of/token_buckets/{w}/{threads}t");
            bench(c, &name, workload, threads, "two-calls", || {
                TwoCalls(bucket(workload), bucket(workload))
            });
            bench(c, &name, workload, threads, "all_of", || {
                BothOf(AllOf::new((bucket(workload), bucket(workload))))
            });
            bench(c, &name, workload, threads, "all_of-plain", || {
                BothOfPlain(AllOf::new((bucket(workload), bucket(workload))))
            });
        }
    }
}

/// A token bucket at the at-the-limit rate of `threads` threads
/// (`common::limit_rate`: offered load about twice the rate).
fn bucket_at_the_limit(threads: usize) -> TokenBucket {
    let (capacity, rate) = common::limit_rate(threads);
    TokenBucket::new(capacity, rate).unwrap()
}

/// A token bucket at the limit, bare, counted, and (with the `metrics`
/// feature) counted and published every millisecond.
fn counted_at_the_limit(c: &mut Criterion) {
    let workload = Workload::Limit;
    for threads in [1, 2] {
        let name = format!("counted/token_bucket/{}/{threads}t", workload.name());
        let bucket = || bucket_at_the_limit(threads);
        bench(c, &name, workload, threads, "bare", || Bare(bucket()));
        bench(c, &name, workload, threads, "counted", || {
            Bare(Counted::new("bench", bucket()))
        });
        #[cfg(feature = "metrics")]
        bench(c, &name, workload, threads, "published", || {
            Published::new(bucket())
        });
    }
}

/// `AllOf` at the limit: two token buckets, each at the at-the-limit rate
/// (`common::limit_rate`), so the second often denies what the first
/// admitted and the first is refunded — the refund path under contention.
fn all_of_at_the_limit(c: &mut Criterion) {
    let workload = Workload::Limit;
    for threads in [1, 2] {
        let name = format!("all_of/token_buckets/{}/{threads}t", workload.name());
        let bucket = || bucket_at_the_limit(threads);
        bench(c, &name, workload, threads, "two-calls", || {
            TwoCalls(bucket(), bucket())
        });
        bench(c, &name, workload, threads, "all_of", || {
            BothOf(AllOf::new((bucket(), bucket())))
        });
        bench(c, &name, workload, threads, "all_of-plain", || {
            BothOfPlain(AllOf::new((bucket(), bucket())))
        });
    }
}

criterion_group! {
    name = benches;
    config = common::config();
    targets = counted, counted_at_the_limit, all_of_at_the_limit
}
criterion_main!(benches);
