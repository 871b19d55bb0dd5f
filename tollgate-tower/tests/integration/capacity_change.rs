//! Following a change of capacity, end to end: an axum service whose
//! capacity halves mid-run and then recovers, on a loopback port, driven
//! past its capacity by 64 concurrent client loops (reqwest) behind a
//! concurrency layer with tollgate's recommended adaptive limit as it
//! comes, `AdaptiveLimit::new(RoundTrip::default())`.
//!
//! Like `overload.rs`, a test that the layer protects the service, not a
//! performance figure: the limit must come down when the capacity halves
//! and go back up when it recovers, and the admitted requests' tail must
//! stay near the unloaded latency in each phase once the limit has had time
//! to follow. The bounds are medians and multiples of the unloaded latency
//! measured in the same run, with wide margins, so that a loaded two-core
//! machine passes it too. It prints what it measured.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tollgate::{AdaptiveLimit, RoundTrip};
use tollgate_tower::ConcurrencyLayer;

use crate::support;
use support::{drive, recent_limits, serve, slow_service, unloaded_latencies};

/// The handler's latency alone, below the knee.
const BASE: Duration = Duration::from_millis(10);
/// The knee (in flight beyond which the handler slows down) in each phase,
/// one after the other: the capacity halves, then recovers.
const KNEES: [usize; 3] = [8, 4, 8];
/// Concurrent client loops: 8 × the larger knee.
const CLIENTS: usize = 64;
/// How long each phase runs.
const PHASE: Duration = Duration::from_millis(3_500);
/// The last part of each phase, which the assertions look at: the limit
/// has had the first 1.5 s of the phase (over a hundred round trips) to
/// follow the change.
const SETTLED: Duration = Duration::from_secs(2);
/// How often the limit is sampled.
const SAMPLE_EVERY: Duration = Duration::from_millis(50);
/// What a client waits after a `503` before it tries again.
const BACKOFF: Duration = Duration::from_millis(20);

/// The `q` quantile of `values` (nearest rank), which must not be empty.
fn quantile<T: Copy + Ord>(values: &mut [T], q: f64) -> T {
    assert!(!values.is_empty(), "nothing to take a quantile of");
    values.sort_unstable();
    let rank = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len());
    values[rank - 1]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// What one phase's settled part saw.
#[derive(Debug)]
struct Phase {
    knee: usize,
    /// The median of the limit's samples.
    limit: u32,
    /// The least and most of them.
    limits: (u32, u32),
    /// The median of the algorithm's no-load baseline.
    baseline: Duration,
    admitted: usize,
    shed: usize,
    p50: Duration,
    p99: Duration,
}

/// The capacity halves mid-run and recovers: the recommended adaptive
/// limit, untuned, follows it down and back up, and the requests it admits
/// keep a tail near the unloaded latency throughout.
///
/// At `n` in flight past the knee `k` a request takes `(n / k)²` × the
/// base, a queue of `n − k² / n` requests over the no-load round trip
/// (which stays the base: below the knee nothing changes). `RoundTrip`
/// grows while that queue is under α = 2 and shrinks past β = 4: it settles
/// at 9–10 with the knee at 8 and at 5–6 with it at 4, whose latencies are
/// 1.3–1.6 × and 1.6–2.3 × the base (a p99 of 1.6–2.4 × the unloaded
/// latency on a quiet machine). In some runs it settled higher, 12–14 and
/// 7–8 (up to twice the knee), with a no-load baseline of 15.7–17.9 ms
/// instead of 11.1–11.2 — the first, upper estimate the algorithm starts
/// from, left in place by noisy first rounds — most often with both cores
/// of a two-core machine busy elsewhere, where the p99 reached 4.5 ×
/// unloaded. The assertions: in each phase's last 2 s the limit's median
/// must be at least 2 lower after the halving than before it and at least
/// 2 higher after the recovery than during it (it was 4–6 in every run),
/// and the admitted requests' p99 within 5 × the unloaded latency, as in
/// `overload.rs` (a wide margin over the 1.6–2.4 × of a well-estimated
/// baseline, a thin one over the 4.5 × of a baseline left high on a busy
/// machine); unprotected, the halved service would take (64 / 4)² = 256 ×.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adaptive_layer_follows_a_halving_and_recovery_of_capacity() {
    let test_start = Instant::now();
    let knee = Arc::new(AtomicUsize::new(KNEES[0]));

    // Unloaded: one request at a time (below either knee).
    let addr = serve(slow_service(BASE, Arc::clone(&knee))).await;
    let unloaded = quantile(&mut unloaded_latencies(addr).await, 0.5);
    assert!(unloaded >= BASE);

    // Loaded, behind the layer, on a fresh server.
    let limit = Arc::new(AdaptiveLimit::new(RoundTrip::default()).unwrap());
    let layer = ConcurrencyLayer::new(Arc::clone(&limit));
    let addr = serve(slow_service(BASE, Arc::clone(&knee)).layer(layer)).await;
    let end = PHASE * KNEES.len() as u32;
    let start = Instant::now();

    // The limit, every `SAMPLE_EVERY`.
    let done = Arc::new(AtomicBool::new(false));
    let sampler = tokio::spawn({
        let (limit, done) = (Arc::clone(&limit), Arc::clone(&done));
        async move {
            let mut samples = Vec::new();
            let mut every = tokio::time::interval(SAMPLE_EVERY);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            while !done.load(Ordering::SeqCst) {
                every.tick().await;
                let algorithm = limit.algorithm();
                samples.push((start.elapsed(), limit.limit(), algorithm.baseline_ns()));
            }
            samples
        }
    });
    // The capacity changes at each phase's start.
    let changer = tokio::spawn({
        let knee = Arc::clone(&knee);
        async move {
            for (i, &k) in KNEES.iter().enumerate().skip(1) {
                tokio::time::sleep_until((start + PHASE * i as u32).into()).await;
                knee.store(k, Ordering::SeqCst);
            }
        }
    });
    let answers = drive(&format!("http://{addr}/"), CLIENTS, BACKOFF, start, end).await;
    changer.await.unwrap();
    done.store(true, Ordering::SeqCst);
    let samples = sampler.await.unwrap();

    // Each phase's settled part: the limit's samples in it, and the
    // requests sent and answered in it (a request's latency is fixed by the
    // knee when it starts, so none straddles a change).
    let phases: Vec<Phase> = KNEES
        .iter()
        .enumerate()
        .map(|(i, &knee)| {
            let phase_end = PHASE * (i as u32 + 1);
            let from = phase_end - SETTLED;
            let within = |t: Duration| from <= t && t < phase_end;
            let mut limits: Vec<u32> = samples
                .iter()
                .filter(|&&(t, _, _)| within(t))
                .map(|&(_, l, _)| l)
                .collect();
            let mut baselines: Vec<u64> = samples
                .iter()
                .filter(|&&(t, _, _)| within(t))
                .map(|&(_, _, b)| b)
                .collect();
            let settled = answers
                .iter()
                .filter(|a| within(a.sent) && within(a.answered));
            let mut ok: Vec<Duration> = settled
                .clone()
                .filter(|a| a.admitted)
                .map(|a| a.answered - a.sent)
                .collect();
            let shed = settled.filter(|a| !a.admitted).count();
            Phase {
                knee,
                limit: quantile(&mut limits, 0.5),
                limits: (limits[0], limits[limits.len() - 1]),
                baseline: Duration::from_nanos(quantile(&mut baselines, 0.5)),
                admitted: ok.len(),
                shed,
                p50: quantile(&mut ok, 0.5),
                p99: quantile(&mut ok, 0.99),
            }
        })
        .collect();

    let recent = recent_limits(limit.history());
    println!("unloaded p50 {:.1} ms", ms(unloaded));
    for (i, phase) in phases.iter().enumerate() {
        println!(
            "phase {i} (knee {}), last {:.1} s: limit median {} (range {}–{}), baseline {:.1} ms \
             | {} admitted, p50 {:.1} ms, p99 {:.1} ms ({:.2} × unloaded), {:.0} % shed",
            phase.knee,
            SETTLED.as_secs_f64(),
            phase.limit,
            phase.limits.0,
            phase.limits.1,
            ms(phase.baseline),
            phase.admitted,
            ms(phase.p50),
            ms(phase.p99),
            phase.p99.as_secs_f64() / unloaded.as_secs_f64(),
            100.0 * phase.shed as f64 / (phase.shed + phase.admitted) as f64,
        );
    }
    println!(
        "limit at the end {} (last changes {recent:?}) | {} limit samples | {:.1} s in all",
        limit.limit(),
        samples.len(),
        test_start.elapsed().as_secs_f64(),
    );

    let [full, halved, recovered] = &phases[..] else {
        unreachable!("three phases");
    };
    // After the halving the limit came down...
    assert!(
        halved.limit + 2 <= full.limit,
        "limit median {} at knee 8, {} at knee 4",
        full.limit,
        halved.limit
    );
    // ...and after the recovery it went back up.
    assert!(
        recovered.limit >= halved.limit + 2,
        "limit median {} at knee 4, {} at knee 8 again",
        halved.limit,
        recovered.limit
    );
    for (i, phase) in phases.iter().enumerate() {
        // The service kept serving, the excess was shed...
        assert!(phase.admitted >= 50, "phase {i}: {phase:?}");
        assert!(phase.shed > 0, "phase {i}: {phase:?}");
        // ...and the admitted requests' tail stayed near unloaded.
        assert!(
            phase.p99 <= unloaded * 5,
            "phase {i}: p99 {:?} vs unloaded {unloaded:?}",
            phase.p99
        );
    }
}
