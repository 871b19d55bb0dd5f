//! Waiting for a permit instead of being refused: a token bucket books
//! permits in order (`Reserve`), a sliding log asks again after its
//! retry-after (`RetryAcquire`). Both can wait blocking or async, with or
//! without a bound.
//!
//! ```sh
//! cargo run --release --features tokio --example waiting
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use tollgate::{Denied, Rate, Reserve, RetryAcquire, SlidingLog, TokenBucket};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // ---- A token bucket: calls to an API allowing 5 at once, then 20 a second.
    let api = Arc::new(TokenBucket::new(5, Rate::per_second(20))?);

    // Ten tasks each wait their turn, on tokio's timer: five start at once,
    // the others one every 50 ms, in the order they booked.
    let start = Instant::now();
    let tasks: Vec<_> = (0..10)
        .map(|i| {
            let api = Arc::clone(&api);
            tokio::spawn(async move {
                api.acquire_async(1)
                    .await
                    .expect("1 permit fits the bucket");
                println!(
                    "task {i} calls the API at {:>3} ms",
                    start.elapsed().as_millis()
                );
            })
        })
        .collect();
    for task in tasks {
        task.await?;
    }
    // Ten permits from a bucket of five refilling at 20/s: at least 250 ms.
    assert!(start.elapsed() >= Duration::from_millis(240));

    // A bounded wait: the bucket is empty, the next permit is up to 50 ms
    // away. Waiting at most 10 ms is refused at once, takes nothing and says
    // how long the wait would be; 100 ms is enough.
    match api.acquire_timeout(1, Duration::from_millis(10)) {
        Err(Denied::RetryAfter(wait)) => println!("not within 10 ms: retry after {wait:?}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    api.acquire_timeout(1, Duration::from_millis(100))?;
    println!("within 100 ms: admitted");

    // ---- A sliding log: exactly 3 in any 200 ms (say, a partner's quota).
    // It cannot book ahead; `RetryAcquire` sleeps out the retry-after and
    // asks again. Waiters are not served in order, and a waiter holds
    // nothing until it is admitted.
    let quota = SlidingLog::new(Rate::new(3, Duration::from_millis(200)))?;
    let start = Instant::now();
    for i in 0..6 {
        quota.acquire_async(1).await?; // or `quota.acquire(1)` on a thread
        println!("request {i} at {:>3} ms", start.elapsed().as_millis());
    }
    // The last three waited for the first three to leave the window.
    assert!(start.elapsed() >= Duration::from_millis(195));

    // A bounded wait on the log: the last three fill the window for about
    // 200 ms more, so 1 ms is not enough; nothing is taken.
    let refused = quota.acquire_timeout(1, Duration::from_millis(1));
    assert!(matches!(refused, Err(Denied::RetryAfter(_))));
    println!("log: not within 1 ms ({refused:?})");

    // Asking for more than the limiter can ever hold is refused, not waited on.
    assert!(matches!(
        api.acquire(6),
        Err(Denied::ExceedsCapacity { .. })
    ));
    Ok(())
}
