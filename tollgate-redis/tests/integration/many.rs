//! Many decisions, one call: several limits of one request decided
//! all-or-nothing by one script ([`Client::try_acquire_all`]), and the
//! requests that queue on a client while its call is in flight sent together
//! as one batch.
//!
//! All-or-nothing requests are replayed against the in-process twins
//! decision for decision; batches are made certain by stopping the server
//! (SIGSTOP) with the first call in flight, so that every later request
//! queues behind it, and their answers must be those of one request after
//! another.

use crate::support;

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Waker};
use std::time::Duration;

use proptest::prelude::*;
use tollgate::{
    Denied, LockingApproxSlidingWindow, LockingFixedWindow, LockingSlidingLog, LockingTokenBucket,
    ManualClock, Rate, RateLimiter,
};
use tollgate_redis::{
    Admission, Admitted, ApproxSlidingWindow, Ask, Client, Error, FixedWindow, Limiter, Options,
    Refused, SlidingLog, TokenBucket,
};

use support::replay::{fresh_key, runner, to_micros};
use support::{RedisCluster, RedisServer, cluster_client, runtime, server_and_client};

/// A limiter of each kind at one rate, its in-process twin built fresh for
/// each decision of the reference.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Bucket(u32),
    Window,
    Approx,
    Log,
}

impl Kind {
    fn remote(self, rate: Rate, name: &str) -> Box<dyn Limiter> {
        match self {
            Kind::Bucket(capacity) => Box::new(TokenBucket::new(name, capacity, rate).unwrap()),
            Kind::Window => Box::new(FixedWindow::new(name, rate).unwrap()),
            Kind::Approx => Box::new(ApproxSlidingWindow::new(name, rate).unwrap()),
            Kind::Log => Box::new(SlidingLog::new(name, rate).unwrap()),
        }
    }

    fn local(self, rate: Rate, clock: &ManualClock) -> Box<dyn RateLimiter> {
        match self {
            Kind::Bucket(capacity) => {
                Box::new(LockingTokenBucket::with_clock(capacity, rate, clock.clone()).unwrap())
            }
            Kind::Window => Box::new(LockingFixedWindow::with_clock(rate, clock.clone()).unwrap()),
            Kind::Approx => {
                Box::new(LockingApproxSlidingWindow::with_clock(rate, clock.clone()).unwrap())
            }
            Kind::Log => Box::new(
                LockingSlidingLog::with_clock(rate, clock.clone())
                    .unwrap()
                    .with_stripes(1),
            ),
        }
    }
}

/// The reference for one member: its twin, fresh, replays every admission
/// the member was charged (time in µs, permits), then decides `n` at `now`
/// without keeping it. Returns the verdict (retry-after rounded up to a
/// microsecond, as the scripts give it) and the permits left after it.
fn probe(
    kind: Kind,
    rate: Rate,
    charged: &[(u64, u32)],
    now: u64,
    n: u32,
) -> (Result<(), Denied>, u32) {
    let clock = ManualClock::new();
    let twin = kind.local(rate, &clock);
    for &(at, permits) in charged {
        clock.set(at * 1000);
        twin.try_acquire_n(permits)
            .expect("a charged admission replays");
    }
    clock.set(now * 1000);
    let verdict = to_micros(twin.try_acquire_n(n));
    (verdict, twin.snapshot().available)
}

fn kinds() -> impl Strategy<Value = Kind> {
    prop_oneof![
        (1u32..=6).prop_map(Kind::Bucket),
        Just(Kind::Window),
        Just(Kind::Approx),
        Just(Kind::Log),
    ]
}

/// One member's reference answer: its twin's verdict (the core's request
/// check first) and the permits left after it.
type Probe = (Result<(), Denied>, u32);

/// Checks a request's answer against its members' reference answers: a
/// member that can never grant the permits is the refusal; otherwise the
/// longest retry-after, and its member; otherwise an admission, with each
/// member's permits left and a time no earlier than `now`. Returns whether
/// the request was admitted (then the caller charges every member).
fn check_answer(
    got: &Result<Admitted, Refused>,
    probes: &[Probe],
    now: u64,
    at: &str,
) -> Result<bool, TestCaseError> {
    let never = probes.iter().position(|(verdict, _)| {
        matches!(
            verdict,
            Err(Denied::ExceedsCapacity { .. } | Denied::ZeroPermits)
        )
    });
    let longest = probes
        .iter()
        .enumerate()
        .filter_map(|(i, (verdict, _))| match verdict {
            Err(Denied::RetryAfter(wait)) => Some((i, *wait)),
            _ => None,
        })
        .fold(
            None,
            |best: Option<(usize, Duration)>, (i, wait)| match best {
                Some((_, kept)) if kept >= wait => best,
                _ => Some((i, wait)),
            },
        );
    match (got, never, longest) {
        (
            Err(Refused {
                member,
                error: Error::Denied(denied),
                ..
            }),
            Some(i),
            _,
        ) => {
            prop_assert_eq!(*member, Some(i), "{}", at);
            prop_assert_eq!(Err(*denied), probes[i].0, "{}", at);
            Ok(false)
        }
        (
            Err(Refused {
                member,
                error: Error::Denied(denied),
                ..
            }),
            None,
            Some((i, wait)),
        ) => {
            prop_assert_eq!(*member, Some(i), "{}: {:?}", at, probes);
            prop_assert_eq!(*denied, Denied::RetryAfter(wait), "{}", at);
            Ok(false)
        }
        (Ok(admitted), None, None) => {
            prop_assert_eq!(admitted.admissions().len(), probes.len(), "{}", at);
            for (i, (admission, (_, left))) in admitted.admissions().iter().zip(probes).enumerate()
            {
                prop_assert_eq!(admission.remaining, *left, "{} member {}", at, i);
                prop_assert!(admission.time_us >= now, "{} member {}", at, i);
            }
            Ok(true)
        }
        _ => {
            prop_assert!(false, "{at}: redis {got:?}, twins {probes:?}");
            unreachable!()
        }
    }
}

/// Every decision of a request of 1 to 4 limits (any kinds, rates, some on
/// one caller key and some on another) agrees with the twins: admitted when
/// every twin admits, then with each one's permits left; otherwise the
/// longest retry-after of the twins that deny, and nothing charged anywhere
/// — which the following decisions check, since the twins replay only what
/// was charged.
#[test]
fn all_or_nothing_agrees_with_the_twins() {
    let server = RedisServer::start();
    let runtime = runtime();
    let client = runtime.block_on(Client::connect(&server.url())).unwrap();
    // Whole microseconds per permit: the scripts' resolution, so the twins'
    // nanoseconds meet them exactly.
    let member = (kinds(), 1u32..=5, 1u64..=8_000, 0usize..2);
    let strategy = (
        prop::collection::vec(member, 1..=4),
        prop::collection::vec((0u64..=60_000, 1u32..=3), 1..40),
        0u64..1 << 40,
    );
    runner()
        .run(&strategy, |(members, ops, start)| {
            let callers = [fresh_key("all-a"), fresh_key("all-b")];
            let limits: Vec<(Kind, Rate, Box<dyn Limiter>, &str)> = members
                .iter()
                .enumerate()
                .map(|(i, &(kind, permits, per_permit_us, caller))| {
                    let period = Duration::from_micros(u64::from(permits) * per_permit_us);
                    let rate = Rate::new(permits, period);
                    (
                        kind,
                        rate,
                        kind.remote(rate, &format!("m{i}")),
                        callers[caller].as_str(),
                    )
                })
                .collect();
            let mut charged: Vec<Vec<(u64, u32)>> = vec![Vec::new(); limits.len()];
            let mut now = start;
            for (step, (advance, n)) in ops.iter().enumerate() {
                now += advance;
                let asks: Vec<Ask<'_>> = limits
                    .iter()
                    .map(|(_, _, limiter, caller)| Ask::new(&**limiter, caller).n(*n))
                    .collect();
                let got = runtime.block_on(client.try_acquire_all_at(&asks, now));
                let probes: Vec<_> = limits
                    .iter()
                    .zip(&charged)
                    .map(|((kind, rate, limiter, _), charged)| {
                        let (verdict, left) = probe(*kind, *rate, charged, now, *n);
                        // A request above a limit's capacity is refused before
                        // any call, as the core's check does.
                        let verdict = match tollgate::check_request(*n, limiter.capacity()) {
                            Err(never) => Err(never),
                            Ok(()) => verdict,
                        };
                        (verdict, left)
                    })
                    .collect();
                if check_answer(&got, &probes, now, &format!("step {step}"))? {
                    for charged in &mut charged {
                        charged.push((now, *n));
                    }
                }
            }
            Ok(())
        })
        .unwrap();
}

/// The tightest report is the member with the fewest permits left, as the
/// core's `AllOf` picks it; one call decides the whole request.
#[tokio::test]
async fn one_call_decides_a_request_and_reports_its_tightest_limit() {
    let (server, client) = server_and_client().await;
    let burst = TokenBucket::new("bucket", 10, Rate::per_hour(10)).unwrap();
    let daily = FixedWindow::new("daily", Rate::per_hour(3)).unwrap();
    let asks = [Ask::new(&burst, "tenant:7"), Ask::new(&daily, "tenant:7")];
    client.try_acquire_all(&asks).await.unwrap(); // loads the script
    let _: () = server.cmd(&["CONFIG", "RESETSTAT"]);
    let admitted = client.try_acquire_all(&asks).await.unwrap();
    assert_eq!(server.script_calls(), 1);
    let remaining: Vec<u32> = admitted.admissions().iter().map(|a| a.remaining).collect();
    assert_eq!(remaining, [8, 1]);
    assert_eq!(admitted.tightest().map(|(member, _)| member), Some(1));
    client.try_acquire_all(&asks).await.unwrap();
    // The window is spent: refused, and the bucket keeps its 7.
    let refused = client.try_acquire_all(&asks).await.unwrap_err();
    assert_eq!(refused.member, Some(1));
    assert!(matches!(
        refused.error,
        Error::Denied(Denied::RetryAfter(_))
    ));
    // Each limit's state as the script found it, uncharged: the bucket's 7
    // (it would have admitted), the window's 0.
    let found: Vec<(u32, u32)> = refused
        .found
        .iter()
        .map(|s| (s.available, s.capacity))
        .collect();
    assert_eq!(found, [(7, 10), (0, 3)]);
    assert_eq!(refused.report, Some(refused.found[1]));
    assert_eq!(
        client
            .try_acquire(&burst, "tenant:7")
            .await
            .unwrap()
            .remaining,
        6
    );
    assert!(
        client
            .try_acquire_all(&[])
            .await
            .unwrap()
            .tightest()
            .is_none()
    );
}

/// Bad requests never reach the server and name the limit.
#[tokio::test]
async fn bad_requests_are_refused_before_any_call() {
    let (server, client) = server_and_client().await;
    let bucket = TokenBucket::new("api", 2, Rate::per_second(1)).unwrap();
    let other = TokenBucket::new("api", 5, Rate::per_second(1)).unwrap();
    let refused = client
        .try_acquire_all(&[Ask::new(&other, "k"), Ask::new(&bucket, "k").n(3)])
        .await
        .unwrap_err();
    assert_eq!(refused.member, Some(1));
    assert!(matches!(
        refused.error,
        Error::Denied(Denied::ExceedsCapacity {
            requested: 3,
            capacity: 2
        })
    ));
    let zero = client
        .try_acquire_all(&[Ask::new(&bucket, "k").n(0)])
        .await
        .unwrap_err();
    assert!(matches!(zero.error, Error::Denied(Denied::ZeroPermits)));
    // Same prefix, same name, same kind, same caller: one Redis key asked
    // twice.
    let twice = client
        .try_acquire_all(&[Ask::new(&bucket, "k"), Ask::new(&other, "k")])
        .await
        .unwrap_err();
    assert_eq!(twice.member, Some(1));
    assert!(matches!(&twice.error, Error::InvalidCall(why) if why.contains("tollgate:api:{k}:tb")));
    assert!(!twice.error.may_have_run());
    assert_eq!(server.script_calls(), 0);
    let _: () = server.cmd(&["GET", "nothing"]);
    let keys: Vec<String> = server.cmd(&["KEYS", "*"]);
    assert!(keys.is_empty(), "{keys:?}");
}

/// A damaged or foreign key anywhere in a request refuses it with that
/// limit's error, and nothing of the request is charged.
#[tokio::test]
async fn a_damaged_key_refuses_the_request_and_charges_nothing() {
    let (server, client) = server_and_client().await;
    let bucket = TokenBucket::new("bucket", 5, Rate::per_hour(5)).unwrap();
    let window = FixedWindow::new("w", Rate::per_hour(5)).unwrap();
    let log = SlidingLog::new("l", Rate::per_hour(5)).unwrap();
    let _: () = server.cmd(&["RPUSH", &window.redis_key("u"), "a list"]);
    let _: () = server.cmd(&["HSET", &log.redis_key("v"), "v", "tb1"]);
    let asks = [Ask::new(&bucket, "u"), Ask::new(&window, "u")];
    let wrong = client.try_acquire_all(&asks).await.unwrap_err();
    assert_eq!(wrong.member, Some(1));
    assert!(matches!(wrong.error, Error::WrongType { .. }), "{wrong:?}");
    let asks = [Ask::new(&log, "v"), Ask::new(&bucket, "v")];
    let wrong = client.try_acquire_all(&asks).await.unwrap_err();
    assert_eq!(wrong.member, Some(0));
    assert!(matches!(wrong.error, Error::WrongType { .. }), "{wrong:?}");
    let _: () = server.cmd(&["DEL", &log.redis_key("v")]);
    let _: () = server.cmd(&[
        "HSET",
        &window.redis_key("x"),
        "v",
        "fw1",
        "w",
        "nan",
        "c",
        "0",
    ]);
    let _: () = server.cmd(&["PEXPIRE", &window.redis_key("x"), "60000"]);
    let damaged = client
        .try_acquire_all(&[Ask::new(&bucket, "x"), Ask::new(&window, "x")])
        .await
        .unwrap_err();
    assert!(
        matches!(&damaged.error, Error::UnknownState { detail, .. } if detail.contains("field w"))
    );
    // The same in the string format, and a string that is not the format's.
    for (caller, value, names) in [
        ("y", "fw2:nan:0", "field w"),
        ("z", "a string", "expected format fw2"),
    ] {
        let key = window.redis_key(caller);
        let _: () = server.cmd(&["SET", &key, value, "PX", "60000"]);
        let damaged = client
            .try_acquire_all(&[Ask::new(&bucket, caller), Ask::new(&window, caller)])
            .await
            .unwrap_err();
        assert_eq!(damaged.member, Some(1));
        assert!(
            matches!(&damaged.error, Error::UnknownState { detail, .. } if detail.contains(names)),
            "{damaged:?}"
        );
        let left: String = server.cmd(&["GET", &key]);
        assert_eq!(left, value);
        let untouched: Option<String> = server.cmd(&["GET", &bucket.redis_key(caller)]);
        assert_eq!(untouched, None);
    }
    // The bucket's keys were never written.
    for caller in ["u", "v", "x"] {
        let exists: i64 = server.cmd(&["EXISTS", &bucket.redis_key(caller)]);
        assert_eq!(exists, 0, "{caller}");
    }
}

/// A client that makes one call at a time, so that requests made while a
/// call is in flight queue for the next one; calls time out after `secs`.
async fn one_call_at_a_time(server: &RedisServer, secs: u64) -> Client {
    let options = Options::new()
        .timeout(Duration::from_secs(secs))
        .max_calls_in_flight(1);
    Client::connect_with(&server.url(), options).await.unwrap()
}

/// Polls a future once, so that a request queues on its client.
fn poll_once<F: Future + ?Sized>(future: Pin<&mut F>) -> bool {
    future
        .poll(&mut Context::from_waker(Waker::noop()))
        .is_ready()
}

/// Polls a future once: its output if it is ready at once.
fn poll_now<F: Future + ?Sized>(future: Pin<&mut F>) -> Option<F::Output> {
    match future.poll(&mut Context::from_waker(Waker::noop())) {
        std::task::Poll::Ready(output) => Some(output),
        std::task::Poll::Pending => None,
    }
}

type Single<'a> = Pin<Box<dyn Future<Output = Result<Admission, Error>> + Send + 'a>>;

/// A request of one limit, as a batch test's pending answer.
fn single<'a>(client: &'a Client, limiter: &'a dyn Limiter, key: &'a str) -> Pending<'a> {
    Box::pin(async move {
        client
            .try_acquire(limiter, key)
            .await
            .map(|a| vec![a])
            .map_err(|e| Refused::new(Some(0), e))
    })
}

type Pending<'a> = Pin<Box<dyn Future<Output = Result<Vec<Admission>, Refused>> + Send + 'a>>;

/// With its one call stopped in flight, a client queues every later
/// request; they go as one call, decided one after another in the order
/// they queued: the bucket's permits go to exactly as many requests as it
/// holds, each told a different count left, and an all-or-nothing request
/// in the batch that a spent limit refuses charges nothing. A call reads and
/// writes a key once, however many of its decisions are on it.
#[tokio::test]
async fn requests_that_queue_during_a_call_go_as_one_call() {
    let server = RedisServer::start();
    let client = one_call_at_a_time(&server, 20).await;
    let bucket = TokenBucket::new("bucket", 10, Rate::per_hour(10)).unwrap();
    let spent = FixedWindow::new("spent", Rate::per_hour(1)).unwrap();
    let other = TokenBucket::new("other", 4, Rate::per_hour(4)).unwrap();
    client.try_acquire(&spent, "u").await.unwrap();
    let _: () = server.cmd(&["CONFIG", "RESETSTAT"]);

    server.pause();
    let mut pending: Vec<Pending<'_>> = Vec::new();
    for i in 0..30 {
        if i == 1 {
            // The first request leaves alone and stops in flight.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if i % 10 == 5 {
            // Refused by the spent window: the other bucket stays whole.
            pending.push(Box::pin(async {
                let asks = [Ask::new(&other, "u"), Ask::new(&spent, "u")];
                client
                    .try_acquire_all(&asks)
                    .await
                    .map(|a| a.admissions().to_vec())
            }));
        } else {
            pending.push(Box::pin(async {
                client
                    .try_acquire(&bucket, "u")
                    .await
                    .map(|a| vec![a])
                    .map_err(|err| Refused::new(Some(0), err))
            }));
        }
        assert!(!poll_once(pending.last_mut().unwrap().as_mut()));
    }
    server.resume();
    let mut answers = Vec::new();
    for future in pending {
        answers.push(future.await);
    }
    // The first request left alone; every other one queued behind it. Each
    // call reads and writes the bucket's key once, however often it decides
    // on it.
    // A lone call reads with GET, a call of several with one MGET; one SET
    // writes the state with its expiry.
    assert_eq!(server.script_calls(), 2);
    assert_eq!(server.calls("get") + server.calls("mget"), 2);
    assert_eq!(server.calls("set"), 2);
    // (EXISTS tells a key gone since the last call from another type.)
    assert!(server.calls("exists") <= 1);
    for unused in ["hmget", "hset", "pexpireat", "pttl"] {
        assert_eq!(server.calls(unused), 0, "{unused}");
    }
    let mut left: Vec<u32> = Vec::new();
    let mut denied = 0;
    for (i, answer) in answers.iter().enumerate() {
        match answer {
            Ok(admissions) => left.extend(admissions.iter().map(|a| a.remaining)),
            Err(Refused {
                error: Error::Denied(Denied::RetryAfter(_)),
                ..
            }) => denied += 1,
            other => panic!("request {i}: {other:?}"),
        }
    }
    left.sort_unstable();
    assert_eq!(left, (0..10).collect::<Vec<_>>());
    assert_eq!(denied, 20);
    assert_eq!(client.try_acquire(&other, "u").await.unwrap().remaining, 3);
}

/// A server killed with a batch in flight and more queued: every request
/// gets an error (never an admission or a hang), and one that may have
/// reached the server says so.
#[tokio::test]
async fn a_server_killed_mid_batch_fails_every_request_in_it() {
    let mut server = RedisServer::start();
    let client = one_call_at_a_time(&server, 5).await;
    let bucket = TokenBucket::new("bucket", 100, Rate::per_hour(100)).unwrap();
    client.try_acquire(&bucket, "warm").await.unwrap();
    let keys: Vec<String> = (0..20).map(|i| format!("k{}", i % 3)).collect();
    let client = &client;
    server.pause();
    let mut pending: Vec<Single<'_>> = Vec::new();
    for key in &keys {
        let bucket = &bucket;
        pending.push(Box::pin(
            async move { client.try_acquire(bucket, key).await },
        ));
        assert!(!poll_once(pending.last_mut().unwrap().as_mut()));
    }
    // Let the batching task send what it can to the stopped server.
    tokio::time::sleep(Duration::from_millis(50)).await;
    server.kill();
    for (i, future) in pending.into_iter().enumerate() {
        match future.await {
            Ok(admission) => panic!("request {i} admitted by a killed server: {admission:?}"),
            Err(err @ (Error::Timeout(_) | Error::Interrupted(_))) => assert!(err.may_have_run()),
            Err(err @ Error::Redis(_)) => assert!(!err.may_have_run()),
            Err(other) => panic!("request {i}: {other:?}"),
        }
    }
}

/// On a Cluster, one call's keys must share a slot: a request whose limits
/// are on callers of different slots is refused before any call; on one
/// caller (one hash tag) it is decided on the node that owns it.
#[tokio::test]
async fn a_cluster_request_must_keep_to_one_slot() {
    let cluster = RedisCluster::start();
    let client = cluster_client(&cluster, Options::default()).await;
    let bucket = TokenBucket::new("bucket", 3, Rate::per_hour(3)).unwrap();
    let log = SlidingLog::new("log", Rate::per_hour(2)).unwrap();
    for i in 0..8 {
        let caller = format!("user:{i}");
        let asks = [Ask::new(&bucket, &caller), Ask::new(&log, &caller)];
        let admitted = client.try_acquire_all(&asks).await.unwrap();
        assert_eq!(admitted.tightest().map(|(m, _)| m), Some(1));
        client.try_acquire_all(&asks).await.unwrap();
        let refused = client.try_acquire_all(&asks).await.unwrap_err();
        assert_eq!(refused.member, Some(1));
        let owner = cluster.owner(&bucket.redis_key(&caller));
        let state: Option<String> = owner.cmd(&["GET", &bucket.redis_key(&caller)]);
        assert!(state.unwrap().starts_with("tb2:"));
    }
    let slot = |key: &str| -> i64 { cluster.nodes[0].cmd(&["CLUSTER", "KEYSLOT", key]) };
    let (a, b) = (0..)
        .map(|i| (format!("a{i}"), format!("b{i}")))
        .find(|(a, b)| slot(a) != slot(b))
        .unwrap();
    let refused = client
        .try_acquire_all(&[Ask::new(&bucket, &a), Ask::new(&log, &b)])
        .await
        .unwrap_err();
    assert!(matches!(&refused.error, Error::InvalidCall(why) if why.contains("slots")));
    // Batched single decisions on many slots are split by slot, each right.
    let many: Vec<_> = (0..24).map(|i| format!("many:{i}")).collect();
    let answers = futures_join(&client, &bucket, &many).await;
    assert!(answers.iter().all(|a| a.remaining == 2), "{answers:?}");
}

async fn futures_join(client: &Client, bucket: &TokenBucket, keys: &[String]) -> Vec<Admission> {
    let mut tasks = tokio::task::JoinSet::new();
    for key in keys {
        let (client, bucket, key) = (client.clone(), bucket.clone(), key.clone());
        tasks.spawn(async move { client.try_acquire(&bucket, &key).await.unwrap() });
    }
    tasks.join_all().await
}

/// Under load every request of a batch gets its own answer: requests of
/// different sizes on keys of their own, from several tasks at once, each
/// told exactly what is left after its own permits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_of_a_batch_gets_its_own_answer() {
    let server = RedisServer::start();
    let client = Client::connect_with(
        &server.url(),
        Options::new().timeout(Duration::from_secs(10)),
    )
    .await
    .unwrap();
    let window = FixedWindow::new("window", Rate::per_hour(1000)).unwrap();
    let mut tasks = tokio::task::JoinSet::new();
    for task in 0..16u32 {
        let (client, window) = (client.clone(), window.clone());
        tasks.spawn(async move {
            for i in 0..300u32 {
                let n = (task * 7 + i * 13) % 50 + 1;
                let key = format!("own:{task}:{i}");
                let admission = client.try_acquire_n(&window, &key, n).await.unwrap();
                assert_eq!(admission.remaining, 1000 - n, "task {task} request {i}");
            }
        });
    }
    tasks.join_all().await;
    assert!(server.script_calls() < 16 * 300, "no batch formed");
}

/// A key written early in a call keeps its state for every later decision
/// of the call, however long the call takes: a bucket refilling one permit
/// per µs and a log of one permit per millisecond, asked after a request
/// that keeps the script busy for milliseconds (the server's clock passes
/// their expiries meanwhile, and an expiry set in the past deletes a key at
/// once), each admit exactly one request of the batch, all of whose
/// decisions are made at one time.
#[tokio::test]
async fn a_long_call_never_forgets_what_it_wrote() {
    let server = RedisServer::start();
    let client = one_call_at_a_time(&server, 20).await;
    let bucket = TokenBucket::new("bucket", 1, Rate::per_second(1_000_000)).unwrap();
    let fine_log = SlidingLog::new("log", Rate::new(1, Duration::from_millis(1))).unwrap();
    let log = SlidingLog::new("log", Rate::per_hour(20_000)).unwrap();
    client.try_acquire(&bucket, "warm").await.unwrap();
    let _: () = server.cmd(&["CONFIG", "RESETSTAT"]);
    let client = &client;
    server.pause();
    let mut pending: Vec<Single<'_>> = Vec::new();
    for i in 0..12 {
        if i == 1 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let (bucket, log, fine_log) = (&bucket, &log, &fine_log);
        pending.push(if i == 1 {
            Box::pin(async move { client.try_acquire_n(log, "slow", 20_000).await })
        } else if i % 2 == 0 && i > 0 {
            Box::pin(async move { client.try_acquire(fine_log, "fine").await })
        } else {
            Box::pin(async move { client.try_acquire(bucket, "fine").await })
        });
        assert!(!poll_once(pending.last_mut().unwrap().as_mut()));
    }
    server.resume();
    let (mut buckets, mut logs) = (0, 0);
    for (i, future) in pending.into_iter().enumerate() {
        match (i, future.await) {
            (1, answer) => assert!(answer.is_ok(), "{answer:?}"),
            (i, Ok(_)) if i % 2 == 0 && i > 0 => logs += 1,
            (_, Ok(_)) => buckets += 1,
            (_, Err(Error::Denied(Denied::RetryAfter(_)))) => {}
            (i, Err(other)) => panic!("request {i}: {other}"),
        }
    }
    // The bucket: the first request's own call, and one in the batch; the
    // log: one in the batch.
    assert_eq!((buckets, logs), (2, 1));
    assert_eq!(server.script_calls(), 2);
}

/// A client on a connection the application made (and keeps using for its
/// own commands), through the re-exported `redis`.
#[tokio::test]
async fn a_client_on_your_own_connection() {
    use tollgate_redis::redis;
    let server = RedisServer::start();
    let redis = redis::Client::open(server.url()).unwrap();
    let config = redis::aio::ConnectionManagerConfig::new().set_response_timeout(None);
    let mut manager = redis::aio::ConnectionManager::new_with_config(redis, config)
        .await
        .unwrap();
    let client = Client::from_connection_manager(manager.clone(), Options::new());
    let bucket = TokenBucket::new("bucket", 2, Rate::per_hour(2)).unwrap();
    assert_eq!(
        client.try_acquire(&bucket, "mine").await.unwrap().remaining,
        1
    );
    let _: () = redis::cmd("SET")
        .arg("app:key")
        .arg("v")
        .query_async(&mut manager)
        .await
        .unwrap();
    assert_eq!(
        client.try_acquire(&bucket, "mine").await.unwrap().remaining,
        0
    );
    assert!(
        client
            .try_acquire(&bucket, "mine")
            .await
            .unwrap_err()
            .is_denied()
    );
}

/// One request of a batch: which limits (indices into the case's limiters,
/// distinct), for which caller, how many permits.
#[derive(Debug, Clone)]
struct Request {
    members: Vec<usize>,
    caller: usize,
    n: u32,
}

fn requests(limiters: usize) -> impl Strategy<Value = Vec<Request>> {
    let request = (
        prop::sample::subsequence((0..limiters).collect::<Vec<_>>(), 1..=limiters.min(3)),
        0usize..2,
        1u32..=3,
    )
        .prop_map(|(members, caller, n)| Request { members, caller, n });
    prop::collection::vec(request, 1..24)
}

/// Random batches — single requests and all-or-nothing ones, on shared and
/// separate keys, several rounds at advancing times — agree with the twins
/// decision for decision when the twins decide the requests one after
/// another in the order they queued: a batch decides each request as it
/// would be decided alone in that order. Every round's requests queue
/// behind its first (which takes the one call slot), so each round is two
/// calls, whatever the scheduler does.
#[test]
fn batches_agree_with_the_twins_in_queue_order() {
    let server = RedisServer::start();
    let runtime = runtime();
    let client = runtime.block_on(one_call_at_a_time(&server, 10));
    // Loads the library (its replayed-time form), so that no round's call
    // finds it missing.
    let warm = TokenBucket::new("bucket", 1, Rate::per_hour(1)).unwrap();
    runtime
        .block_on(client.try_acquire_n_at(&warm, "warm", 1, 1 << 40))
        .unwrap();
    let member = (kinds(), 1u32..=5, 1u64..=8_000);
    let strategy = prop::collection::vec(member, 1..=3).prop_flat_map(|members| {
        let count = members.len();
        (
            Just(members),
            prop::collection::vec((0u64..=40_000, requests(count)), 1..5),
            0u64..1 << 40,
        )
    });
    runner()
        .run(&strategy, |(members, rounds, start)| {
            let callers = [fresh_key("batch-a"), fresh_key("batch-b")];
            let limits: Vec<(Kind, Rate, Box<dyn Limiter>)> = members
                .iter()
                .enumerate()
                .map(|(i, &(kind, permits, per_permit_us))| {
                    let period = Duration::from_micros(u64::from(permits) * per_permit_us);
                    let rate = Rate::new(permits, period);
                    (kind, rate, kind.remote(rate, &format!("b{i}")))
                })
                .collect();
            // What each (limit, caller) was charged: the twins' history.
            let mut charged: Vec<Vec<Vec<(u64, u32)>>> = vec![vec![Vec::new(); 2]; limits.len()];
            let mut now = start;
            for (round, (advance, batch)) in rounds.iter().enumerate() {
                now += advance;
                let asks: Vec<Vec<Ask<'_>>> = batch
                    .iter()
                    .map(|request| {
                        request
                            .members
                            .iter()
                            .map(|&m| {
                                Ask::new(&*limits[m].2, &callers[request.caller]).n(request.n)
                            })
                            .collect()
                    })
                    .collect();
                let _: () = server.cmd(&["CONFIG", "RESETSTAT"]);
                let answers = runtime.block_on(async {
                    let mut pending: Vec<_> = asks
                        .iter()
                        .map(|asks| Box::pin(client.try_acquire_all_at(asks, now)))
                        .collect();
                    // A request that can never pass answers at once.
                    let early: Vec<_> = pending.iter_mut().map(|f| poll_now(f.as_mut())).collect();
                    let mut answers = Vec::new();
                    for (future, early) in pending.into_iter().zip(early) {
                        answers.push(match early {
                            Some(answer) => answer,
                            None => future.await,
                        });
                    }
                    answers
                });
                prop_assert!(server.script_calls() <= 2, "round {}", round);
                for (i, (request, got)) in batch.iter().zip(&answers).enumerate() {
                    let probes: Vec<_> = request
                        .members
                        .iter()
                        .map(|&m| {
                            let (kind, rate, limiter) = &limits[m];
                            let (verdict, left) =
                                probe(*kind, *rate, &charged[m][request.caller], now, request.n);
                            match tollgate::check_request(request.n, limiter.capacity()) {
                                Err(never) => (Err(never), left),
                                Ok(()) => (verdict, left),
                            }
                        })
                        .collect();
                    if check_answer(got, &probes, now, &format!("round {round} request {i}"))? {
                        for &m in &request.members {
                            charged[m][request.caller].push((now, request.n));
                        }
                    }
                }
            }
            Ok(())
        })
        .unwrap();
}

/// A damaged key in a batch answers its own request with its error and
/// touches nothing else: the requests before and after it in the same call
/// are decided as alone, and an all-or-nothing request holding it charges
/// none of its other limits.
#[tokio::test]
async fn a_damaged_key_in_a_batch_fails_only_its_own_request() {
    let server = RedisServer::start();
    let client = one_call_at_a_time(&server, 10).await;
    let bucket = TokenBucket::new("bucket", 3, Rate::per_hour(3)).unwrap();
    let window = FixedWindow::new("w", Rate::per_hour(3)).unwrap();
    let _: () = server.cmd(&["HSET", &bucket.redis_key("bad"), "v", "tb1", "tat", "-5"]);
    let _: () = server.cmd(&["PEXPIRE", &bucket.redis_key("bad"), "60000"]);
    client.try_acquire(&window, "warm").await.unwrap();
    let _: () = server.cmd(&["CONFIG", "RESETSTAT"]);
    let (bucket, window, client) = (&bucket, &window, &client);
    let mut pending: Vec<Pending<'_>> = vec![
        single(client, bucket, "a"),
        single(client, bucket, "bad"),
        single(client, bucket, "a"),
        Box::pin(async move {
            let asks = [Ask::new(window, "bad"), Ask::new(bucket, "bad")];
            client
                .try_acquire_all(&asks)
                .await
                .map(|a| a.admissions().to_vec())
        }),
        single(client, bucket, "a"),
    ];
    for future in &mut pending {
        assert!(!poll_once(future.as_mut()));
    }
    let mut answers = Vec::new();
    for future in pending {
        answers.push(future.await);
    }
    assert_eq!(server.script_calls(), 2);
    let left: Vec<u32> = [0, 2, 4]
        .iter()
        .map(|&i| answers[i].as_ref().unwrap()[0].remaining)
        .collect();
    assert_eq!(left, [2, 1, 0]);
    for i in [1, 3] {
        let refused = answers[i].as_ref().unwrap_err();
        assert!(
            matches!(&refused.error, Error::UnknownState { detail, .. } if detail.contains("field tat")),
            "{refused:?}"
        );
    }
    assert_eq!(answers[3].as_ref().unwrap_err().member, Some(1));
    // The window's key for "bad" was never written.
    let exists: i64 = server.cmd(&["EXISTS", &window.redis_key("bad")]);
    assert_eq!(exists, 0);
}
