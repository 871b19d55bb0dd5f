//! The leased limiter's scripts, `lease.lua` and `lease_return.lua`, decision
//! for decision against a reference: the same random timelines of leases and
//! returns at the same times (the scripts' test entry points take the time as
//! an argument), steps back in time included.
//!
//! The reference is the two scripts' rules written out in Rust on one
//! theoretical arrival time ([`Budget`]); its lease decisions are checked in
//! turn against tollgate's GCRA (a `LockingTokenBucket` on a `ManualClock` at
//! the same instants): the permits it grants are the bucket's available
//! permits (the tail rule aside), a refusal's wait is the bucket's
//! retry-after for one permit, and the TAT it reports is the bucket's. Every
//! reply must agree: granted or exhausted, the permits, the TAT, the exact
//! wait, and what a return gives back.
//!
//! Damaged and foreign state is `failures.rs`'s: the lease scripts refuse it
//! as the limiters' scripts do.

use crate::support;

use std::time::Duration;

use proptest::prelude::*;
use tokio::runtime::Runtime;
use tollgate::{Denied, LockingTokenBucket, ManualClock, Rate, RateLimiter};
use tollgate_redis::leased::{LeaseReply, ReturnReply};
use tollgate_redis::{Client, Limiter, TokenBucket};

use support::replay::{fresh_key, micros_up, runner};
use support::{RedisServer, runtime};

/// The two scripts' rules on the budget's state: its TAT (`None`: no key).
#[derive(Debug, Clone, Copy)]
struct Budget {
    interval: u64,
    tolerance: u64,
    tat: Option<u64>,
}

impl Budget {
    fn new(capacity: u32, interval: u64) -> Budget {
        Budget {
            interval,
            tolerance: u64::from(capacity) * interval,
            tat: None,
        }
    }

    /// The permits left at `now`: whole intervals between the later of the
    /// TAT and `now`, and `now + tolerance`.
    fn left(&self, now: u64) -> u64 {
        let base = self.tat.unwrap_or(0).max(now);
        (now + self.tolerance).saturating_sub(base) / self.interval
    }

    /// `lease.lua`: up to `want`, at most `ceil(left / share)` while fewer
    /// than `low_water` are left; none left is a wait for the next.
    fn lease(&mut self, now: u64, want: u64, low_water: u64, share: u64) -> LeaseReply {
        let base = self.tat.unwrap_or(0).max(now);
        let left = self.left(now);
        if left == 0 {
            return LeaseReply::Exhausted {
                wait_us: base + self.interval - (now + self.tolerance),
            };
        }
        let mut granted = want.min(left);
        if left < low_water {
            granted = granted.min(left.div_ceil(share));
        }
        let tat = base + granted * self.interval;
        self.tat = Some(tat);
        LeaseReply::Granted {
            time_us: now,
            granted,
            tat,
        }
    }

    /// `lease_return.lua`: `unused` back while the lease that left the TAT at
    /// `lease_tat` is the last debit; a TAT then at or before `now` is a full
    /// bucket, the same as no key.
    fn give_back(&mut self, now: u64, unused: u64, lease_tat: u64) -> ReturnReply {
        match self.tat {
            Some(tat) if tat == lease_tat => {
                let next = tat - unused * self.interval;
                self.tat = (next > now).then_some(next);
                ReturnReply {
                    time_us: now,
                    returned: unused,
                    tat: next,
                }
            }
            other => ReturnReply {
                time_us: now,
                returned: 0,
                tat: other.unwrap_or(0),
            },
        }
    }
}

/// One step of a timeline: move the clock by `step` µs (back if negative),
/// then lease or give back.
#[derive(Debug, Clone, Copy)]
enum Op {
    Lease {
        step: i64,
        want: u64,
        low_water: u64,
        share: u64,
    },
    /// Gives back `unused_per_mille` ‰ of a lease's permits: the last lease
    /// (`age` 0), an older one, or (past the leases) a TAT no lease left.
    Return {
        step: i64,
        age: usize,
        unused_per_mille: u64,
    },
}

fn ops(capacity: u32, interval: u64) -> impl Strategy<Value = Vec<Op>> {
    let tolerance = (u64::from(capacity) * interval) as i64;
    let per = interval as i64;
    let step = prop_oneof![
        3 => Just(0i64),
        6 => 0..=per * 2,
        3 => 0..=tolerance * 2,
        1 => -(tolerance / 2 + 1)..=0,
    ];
    let cap = u64::from(capacity);
    let lease = (step.clone(), 1..=2 * cap + 1, 0..=cap + 1, 1..=cap + 1).prop_map(
        |(step, want, low_water, share)| Op::Lease {
            step,
            want,
            low_water,
            share,
        },
    );
    let give_back = (
        step,
        prop_oneof![4 => Just(0usize), 1 => 1usize..4],
        0u64..=1000,
    )
        .prop_map(|(step, age, unused_per_mille)| Op::Return {
            step,
            age,
            unused_per_mille,
        });
    prop::collection::vec(prop_oneof![3 => lease, 1 => give_back], 1..80)
}

/// A server, a runtime and a client on it.
struct Setup {
    server: RedisServer,
    runtime: Runtime,
    client: Client,
}

fn setup() -> Setup {
    let server = RedisServer::start();
    let runtime = runtime();
    let client = runtime.block_on(Client::connect(&server.url())).unwrap();
    Setup {
        server,
        runtime,
        client,
    }
}

impl Setup {
    fn lease(
        &self,
        bucket: &TokenBucket,
        key: &str,
        want: u64,
        tail: (u64, u64),
        now: u64,
    ) -> LeaseReply {
        self.runtime
            .block_on(self.client.lease_at(bucket, key, want, tail, now))
            .unwrap()
    }

    fn give_back(
        &self,
        bucket: &TokenBucket,
        key: &str,
        unused: u64,
        tat: u64,
        now: u64,
    ) -> ReturnReply {
        self.runtime
            .block_on(self.client.return_lease_at(bucket, key, unused, tat, now))
            .unwrap()
    }
}

/// tollgate's GCRA at the same instants, kept at the reference's state.
struct Core {
    capacity: u32,
    rate: Rate,
    clock: ManualClock,
    bucket: LockingTokenBucket<ManualClock>,
}

impl Core {
    fn new(capacity: u32, interval: u64) -> Core {
        let rate = Rate::new(1, Duration::from_micros(interval));
        let clock = ManualClock::new();
        let bucket = LockingTokenBucket::with_clock(capacity, rate, clock.clone()).unwrap();
        Core {
            capacity,
            rate,
            clock,
            bucket,
        }
    }

    fn at(&self, now_us: u64) {
        self.clock.set(now_us * 1000);
    }

    /// A bucket whose TAT is `tat` (µs; `None` or past: full): a fresh one
    /// that admits a whole capacity one tolerance before it.
    fn reset(&mut self, tat: Option<u64>, now: u64, tolerance: u64) {
        // Built at the clock's zero, as the first: the bucket's origin.
        self.at(0);
        self.bucket =
            LockingTokenBucket::with_clock(self.capacity, self.rate, self.clock.clone()).unwrap();
        if let Some(tat) = tat.filter(|&tat| tat > now) {
            self.at(tat - tolerance);
            self.bucket.try_acquire_n(self.capacity).unwrap();
        }
        self.at(now);
    }
}

/// What tollgate's GCRA says of a lease at the clock's instant: the grant
/// (by the tail rule on its available permits) and its TAT, or the wait.
fn core_lease(core: &Core, now: u64, want: u64, low_water: u64, share: u64) -> LeaseReply {
    let available = u64::from(core.bucket.snapshot().available);
    if available == 0 {
        let wait = match core.bucket.try_acquire() {
            Err(Denied::RetryAfter(wait)) => wait,
            other => panic!("an empty bucket answered {other:?}"),
        };
        return LeaseReply::Exhausted {
            wait_us: micros_up(wait),
        };
    }
    let mut granted = want.min(available);
    if available < low_water {
        granted = granted.min(available.div_ceil(share));
    }
    let after = core
        .bucket
        .try_acquire_n_with_snapshot(u32::try_from(granted).unwrap())
        .unwrap();
    LeaseReply::Granted {
        time_us: now,
        granted,
        tat: now + u64::try_from(after.until_full.as_micros()).unwrap(),
    }
}

/// Replays `ops` from `start` (µs) through the scripts, the reference and
/// tollgate's GCRA.
fn replay(
    setup: &Setup,
    capacity: u32,
    interval: u64,
    start: u64,
    ops: &[Op],
) -> Result<(), TestCaseError> {
    let bucket = TokenBucket::new(
        "bucket",
        capacity,
        Rate::new(1, Duration::from_micros(interval)),
    )
    .unwrap();
    let key = fresh_key("lease");
    let mut budget = Budget::new(capacity, interval);
    let mut core = Core::new(capacity, interval);
    // Every lease granted: (granted, tat).
    let mut leases: Vec<(u64, u64)> = Vec::new();
    let mut now = start;
    for (i, op) in ops.iter().enumerate() {
        match *op {
            Op::Lease {
                step,
                want,
                low_water,
                share,
            } => {
                now = now.saturating_add_signed(step);
                core.at(now);
                let expected = budget.lease(now, want, low_water, share);
                let got = setup.lease(&bucket, &key, want, (low_water, share), now);
                prop_assert_eq!(got, expected, "op {} {:?} at {}", i, op, now);
                let core_says = core_lease(&core, now, want, low_water, share);
                prop_assert_eq!(core_says, expected, "core, op {} {:?} at {}", i, op, now);
                if let LeaseReply::Granted { granted, tat, .. } = expected {
                    leases.push((granted, tat));
                }
            }
            Op::Return {
                step,
                age,
                unused_per_mille,
            } => {
                now = now.saturating_add_signed(step);
                core.at(now);
                let (granted, lease_tat) = leases
                    .iter()
                    .rev()
                    .nth(age)
                    .copied()
                    .unwrap_or((1, start + 7));
                let unused = granted * unused_per_mille / 1000;
                let before = budget.tat;
                let expected = budget.give_back(now, unused, lease_tat);
                let got = setup.give_back(&bucket, &key, unused, lease_tat, now);
                prop_assert_eq!(got, expected, "op {} {:?} at {}", i, op, now);
                // The bucket follows the return: permits back, or a TAT
                // already past deleted (as its expiry would), which a clock
                // that steps back afterwards finds full.
                if budget.tat != before {
                    core.reset(budget.tat, now, budget.tolerance);
                }
            }
        }
        prop_assert_eq!(
            budget.left(now),
            u64::from(core.bucket.snapshot().available),
            "permits left after op {} {:?} at {}",
            i,
            op,
            now
        );
    }
    Ok(())
}

#[test]
fn lease_scripts_agree_with_the_reference_and_gcra() {
    let setup = setup();
    let strategy = (1u32..=12, prop_oneof![1u64..=50, 1_000u64..=200_000]).prop_flat_map(
        |(capacity, interval)| {
            (
                Just((capacity, interval)),
                ops(capacity, interval),
                1u64 << 30..1 << 40,
            )
        },
    );
    runner()
        .run(&strategy, |((capacity, interval), ops, start)| {
            replay(&setup, capacity, interval, start, &ops)
        })
        .unwrap();
}

/// The bucket the edge cases share: 4 permits, one per 1,000 µs.
fn small() -> (TokenBucket, Budget) {
    let bucket = TokenBucket::new("bucket", 4, Rate::per_second(1_000)).unwrap();
    (bucket, Budget::new(4, 1_000))
}

const T0: u64 = 1 << 40;

#[test]
fn an_exhausted_budget_waits_exactly_for_its_next_permit() {
    let setup = setup();
    let (bucket, _) = small();
    let tail = (0, 1);
    let full = setup.lease(&bucket, "exhausted", 10, tail, T0);
    assert_eq!(
        full,
        LeaseReply::Granted {
            time_us: T0,
            granted: 4,
            tat: T0 + 4_000
        }
    );
    // Empty: the next permit is due one interval later, to the microsecond.
    assert_eq!(
        setup.lease(&bucket, "exhausted", 1, tail, T0),
        LeaseReply::Exhausted { wait_us: 1_000 }
    );
    assert_eq!(
        setup.lease(&bucket, "exhausted", 1, tail, T0 + 999),
        LeaseReply::Exhausted { wait_us: 1 }
    );
    assert_eq!(
        setup.lease(&bucket, "exhausted", 10, tail, T0 + 1_000),
        LeaseReply::Granted {
            time_us: T0 + 1_000,
            granted: 1,
            tat: T0 + 5_000
        }
    );
    // A clock that stepped back finds it emptier, never fuller.
    assert_eq!(
        setup.lease(&bucket, "exhausted", 1, tail, T0 - 500),
        LeaseReply::Exhausted { wait_us: 2_500 }
    );
}

#[test]
fn the_tail_is_shared_out_below_the_low_water_mark() {
    let setup = setup();
    let (bucket, mut budget) = small();
    // 4 left, below a low-water mark of 10: at most ceil(4 / 3) = 2 a lease.
    let tail = (10, 3);
    for (now, granted) in [(T0, 2), (T0, 1), (T0, 1)] {
        let expected = budget.lease(now, 100, tail.0, tail.1);
        assert!(matches!(expected, LeaseReply::Granted { granted: g, .. } if g == granted));
        assert_eq!(setup.lease(&bucket, "tail", 100, tail, now), expected);
    }
    assert_eq!(
        setup.lease(&bucket, "tail", 100, tail, T0),
        LeaseReply::Exhausted { wait_us: 1_000 }
    );
}

#[test]
fn a_return_is_exact_while_its_lease_is_the_last_debit_and_forfeited_after_another() {
    let setup = setup();
    let (bucket, _) = small();
    let tail = (0, 1);
    let LeaseReply::Granted { tat, .. } = setup.lease(&bucket, "ret", 3, tail, T0) else {
        panic!("a full bucket refused");
    };
    // Two of three back: the state a lease of one would have left.
    assert_eq!(
        setup.give_back(&bucket, "ret", 2, tat, T0 + 100),
        ReturnReply {
            time_us: T0 + 100,
            returned: 2,
            tat: T0 + 1_000
        }
    );
    // The same lease again: the TAT moved, so nothing more comes back.
    assert_eq!(
        setup.give_back(&bucket, "ret", 1, tat, T0 + 100),
        ReturnReply {
            time_us: T0 + 100,
            returned: 0,
            tat: T0 + 1_000
        }
    );
    // After another debit the first lease's permits are forfeited.
    let LeaseReply::Granted { tat: second, .. } = setup.lease(&bucket, "ret", 1, tail, T0 + 200)
    else {
        panic!("refused with room");
    };
    assert_eq!(
        setup.give_back(&bucket, "ret", 1, T0 + 1_000, T0 + 300),
        ReturnReply {
            time_us: T0 + 300,
            returned: 0,
            tat: second
        }
    );
}

#[test]
fn a_return_after_the_lease_expired_leaves_a_full_bucket() {
    let setup = setup();
    let (bucket, mut budget) = small();
    let key = bucket.redis_key("expired");
    let LeaseReply::Granted { tat, .. } = setup.lease(&bucket, "expired", 4, (0, 1), T0) else {
        panic!("a full bucket refused");
    };
    budget.lease(T0, 4, 0, 1);
    // Long after the TAT: the lowered TAT is in the past, a full bucket, and
    // the key goes (replayed time keeps keys for an hour of real time, so
    // the script, not the expiry, removes it).
    let late = tat + 10_000;
    let expected = budget.give_back(late, 4, tat);
    assert_eq!(expected.tat, T0);
    assert_eq!(setup.give_back(&bucket, "expired", 4, tat, late), expected);
    let exists: i64 = setup.server.cmd(&["EXISTS", &key]);
    assert_eq!(exists, 0);
    // A key that has expired (or never was) gives nothing back and stays
    // absent.
    assert_eq!(
        setup.give_back(&bucket, "expired", 4, tat, late),
        ReturnReply {
            time_us: late,
            returned: 0,
            tat: 0
        }
    );
    let exists: i64 = setup.server.cmd(&["EXISTS", &key]);
    assert_eq!(exists, 0);
    // Full again: a whole capacity.
    assert!(matches!(
        setup.lease(&bucket, "expired", 10, (0, 1), late),
        LeaseReply::Granted { granted: 4, .. }
    ));
}
