#![cfg(all(loom, target_os = "linux"))]
//! The models' harness itself: loom's threads run on stacks the harness
//! keeps from one execution to the next (`src/stacks.rs`), so that the
//! kernel does not map and unmap a few hundred thousand of them per model.

use loom::sync::Arc;
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::thread;
use tollgate_loom_tests::{explore, reused_stacks};

/// Every execution of a two-thread model needs two stacks (the model's
/// thread and the spawned one); after the first execution, all of them come
/// from the pool.
#[test]
fn stacks_are_reused_across_executions() {
    let before = reused_stacks();
    let explored = explore("harness: two threads add", 2, || {
        let count = Arc::new(AtomicUsize::new(0));
        let other = Arc::clone(&count);
        let spawned = thread::spawn(move || other.fetch_add(1, Ordering::Relaxed));
        count.fetch_add(1, Ordering::Relaxed);
        spawned.join().expect("the spawned thread does not panic");
        assert_eq!(count.load(Ordering::Relaxed), 2);
    });
    assert!(explored > 1, "the model raced");
    let reused = reused_stacks() - before;
    assert!(
        reused >= 2 * (explored - 1),
        "{reused} stacks reused over {explored} executions"
    );
}
