#![cfg(loom)]
//! loom models of `Counted`: every thread adds to a cell only it writes,
//! with a load and a store (no atomic add), and a read sums the cells. The
//! invariant: once the deciding threads are joined, the counts equal the
//! decisions the threads saw, permit for permit — no count lost to two
//! writers of one cell. The known-bad variant (every thread on one cell,
//! still with a load and a store) must fail the same model.

use loom::sync::Arc;
use loom::thread;
use tollgate::fault::{Fault, inject};
use tollgate::{Counted, ManualClock, Rate, RateLimiter, TokenBucket};
use tollgate_loom_tests::explore;

/// Three threads (the model's own and two spawned) each ask for `n`
/// permits of a bucket of 3 twice; the counts must match what they saw.
fn counts_match_decisions() {
    let clock = ManualClock::new();
    let bucket = TokenBucket::with_clock(3, Rate::per_hour(3), clock).expect("a valid bucket");
    let counted = Arc::new(Counted::new("model", bucket));
    let decide = |counted: &Counted<TokenBucket<ManualClock>>, n: u32| -> (u64, u64) {
        let mut seen = (0, 0);
        for _ in 0..2 {
            match counted.try_acquire_n(n) {
                Ok(()) => seen.0 += u64::from(n),
                Err(_) => seen.1 += u64::from(n),
            }
        }
        seen
    };
    let spawned: Vec<_> = [1, 2]
        .into_iter()
        .map(|n| {
            let counted = Arc::clone(&counted);
            thread::spawn(move || decide(&counted, n))
        })
        .collect();
    let mut seen = decide(&counted, 1);
    for handle in spawned {
        let (admitted, denied) = handle.join().expect("a deciding thread");
        seen.0 += admitted;
        seen.1 += denied;
    }
    let counts = counted.counts();
    assert_eq!(
        (counts.admitted, counts.denied),
        seen,
        "the counts lost or invented a decision"
    );
    assert_eq!(
        counts.admitted, 3,
        "the bucket of 3 admits exactly 3 permits"
    );
}

#[test]
fn counts_are_exact_across_threads() {
    explore("counted: counts equal decisions", 3, counts_match_decisions);
}

#[test]
#[should_panic(expected = "the counts lost or invented a decision")]
fn known_bad_shared_count_cell_is_caught() {
    inject(Fault::SharedCountCell, true);
    explore("counted: known-bad shared cell", 3, counts_match_decisions);
}
