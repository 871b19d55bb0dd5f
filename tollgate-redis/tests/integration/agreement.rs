//! Each Lua script, decision for decision, against tollgate's in-process
//! algorithm: the same random op sequences at the same times (the scripts' test
//! entry point takes the time as an argument; the in-process twin reads a
//! `ManualClock` set to the same instant), including steps back in time.
//!
//! Every decision must agree: admitted or not, the exact retry-after (the
//! in-process one rounded up to Redis's microsecond), and the permits left
//! after an admission.

use crate::support;

use std::time::Duration;

use proptest::prelude::*;
use tollgate::{
    LockingApproxSlidingWindow, LockingFixedWindow, LockingSlidingLog, LockingTokenBucket,
    ManualClock, Rate, RateLimiter,
};
use tollgate_redis::{
    ApproxSlidingWindow, Error, FixedWindow, Limiter, SlidingLog, TokenBucket, blocking,
};

use support::RedisServer;
use support::replay::{fresh_key, runner, to_micros};

/// One step of a timeline: move the clock by `step` µs (back if negative), then
/// ask for `n` permits.
#[derive(Debug, Clone, Copy)]
struct Op {
    step: i64,
    n: u32,
}

/// A rate whose period is a whole number of µs per permit, so the in-process
/// nanosecond arithmetic and the scripts' microsecond arithmetic meet exactly.
fn rates() -> impl Strategy<Value = (u32, u64)> {
    (1u32..=12, prop_oneof![1u64..=50, 1_000u64..=200_000])
        .prop_map(|(permits, per_permit_us)| (permits, u64::from(permits) * per_permit_us))
}

fn ops(period_us: u64, max_n: u32) -> impl Strategy<Value = Vec<Op>> {
    let per = period_us as i64;
    let step = prop_oneof![
        3 => Just(0i64),
        6 => 0..=per / 4 + 1,
        3 => 0..=per * 2,
        1 => -(per / 2 + 1)..=0,
    ];
    prop::collection::vec(
        (step, 0..=max_n + 1).prop_map(|(step, n)| Op { step, n }),
        1..120,
    )
}

/// Replays `ops` from `start` (µs) through Redis and through `local`.
fn replay<L: Limiter, R: RateLimiter>(
    client: &blocking::Client,
    remote: &L,
    local: &R,
    clock: &ManualClock,
    start: u64,
    ops: &[Op],
) -> Result<(), TestCaseError> {
    let key = fresh_key("agree");
    let mut now = start;
    for (i, op) in ops.iter().enumerate() {
        now = now.saturating_add_signed(op.step);
        clock.set(now * 1000);
        let expected = to_micros(local.try_acquire_n(op.n));
        let got = client.try_acquire_n_at(remote, &key, op.n, now);
        match (&expected, &got) {
            (Ok(()), Ok(admission)) => {
                prop_assert_eq!(
                    admission.remaining,
                    local.snapshot().available,
                    "remaining after op {} {:?} at {}",
                    i,
                    op,
                    now
                );
            }
            (Err(want), Err(Error::Denied(denied))) => {
                prop_assert_eq!(want, denied, "op {} {:?} at {}", i, op, now)
            }
            _ => prop_assert!(
                false,
                "op {i} {op:?} at {now}: in-process {expected:?}, redis {got:?}"
            ),
        }
    }
    Ok(())
}

/// Replays random timelines, each through a fresh pair that `pair` builds
/// (the Redis limiter, then its twin on the clock) for the case's rate and
/// largest request. `rates` gives (permits, period in µs, largest request).
fn agrees<L: Limiter, R: RateLimiter>(
    rates: impl Strategy<Value = (u32, u64, u32)>,
    pair: impl Fn(Rate, u32, &ManualClock) -> (L, R),
) {
    let server = RedisServer::start();
    let client = blocking::Client::connect(&server.url()).unwrap();
    let strategy = rates.prop_flat_map(|(permits, period, most)| {
        (
            Just((permits, period, most)),
            ops(period, most),
            0u64..1 << 40,
        )
    });
    runner()
        .run(&strategy, |((permits, period, most), ops, start)| {
            let rate = Rate::new(permits, Duration::from_micros(period));
            let clock = ManualClock::new();
            let (remote, local) = pair(rate, most, &clock);
            replay(&client, &remote, &local, &clock, start, &ops)
        })
        .unwrap();
}

/// The window kinds' rates: a request of up to all the window's permits.
fn window_rates() -> impl Strategy<Value = (u32, u64, u32)> {
    rates().prop_map(|(permits, period)| (permits, period, permits))
}

#[test]
fn token_bucket_agrees_with_gcra() {
    let rates =
        (rates(), 1u32..=12).prop_map(|((permits, period), capacity)| (permits, period, capacity));
    agrees(rates, |rate, capacity, clock| {
        (
            TokenBucket::new("bucket", capacity, rate).unwrap(),
            LockingTokenBucket::with_clock(capacity, rate, clock.clone()).unwrap(),
        )
    });
}

#[test]
fn fixed_window_agrees() {
    agrees(window_rates(), |rate, _, clock| {
        (
            FixedWindow::new("window", rate).unwrap(),
            LockingFixedWindow::with_clock(rate, clock.clone()).unwrap(),
        )
    });
}

#[test]
fn sliding_window_agrees_with_the_approximate_window() {
    // Any period here: the weighted retry-after is where rounding to whole
    // microseconds shows, and it must round up exactly.
    let rates = (1u32..=12, 1u64..=300_000)
        .prop_map(|(permits, period)| (permits, period.max(u64::from(permits)), permits));
    agrees(rates, |rate, _, clock| {
        (
            ApproxSlidingWindow::new("approx", rate).unwrap(),
            LockingApproxSlidingWindow::with_clock(rate, clock.clone()).unwrap(),
        )
    });
}

#[test]
fn sliding_log_agrees_with_the_exact_log() {
    agrees(window_rates(), |rate, _, clock| {
        (
            SlidingLog::new("log", rate).unwrap(),
            // One ring: the in-process log is then tight, as one script is.
            LockingSlidingLog::with_clock(rate, clock.clone())
                .unwrap()
                .with_stripes(1),
        )
    });
}
