//! The leased backend against a real `redis-server` the tests start: fast
//! token-bucket limits spent from leases (far fewer script calls than
//! requests), never more than the bucket across replicas, all or nothing
//! with the limits decided in Redis, the failure mode on a cold key while
//! Redis is paused, leases kept across a reload and given back when idle.

use crate::support;

#[allow(dead_code)]
use crate::server;

use std::time::{Duration, Instant};

use server::RedisServer;
use support::{code, config, descriptor, request};
use tollgate_server::proto::envoy::service::ratelimit::v3::RateLimitRequest;
use tollgate_server::proto::envoy::service::ratelimit::v3::rate_limit_response::Code;
use tollgate_server::{Failure, Leasing, Options, RedisSettings, Server};

/// `tenant`: 1,000 a second in bursts of 200, leased. `slow`: a token bucket
/// of 12 an hour, leased only where the test leases every rate. `user`: a
/// fixed window of 10 an hour, always decided in Redis.
const API: &str = "
domain: api
descriptors:
  - key: tenant
    rate_limit:
      unit: second
      requests_per_unit: 1000
      algorithm: token_bucket
      burst: 200
  - key: slow
    rate_limit:
      unit: hour
      requests_per_unit: 12
      algorithm: token_bucket
      burst: 12
  - key: user
    rate_limit:
      unit: hour
      requests_per_unit: 10
";

const TIMEOUT: Duration = Duration::from_millis(100);

async fn replica(redis: &RedisServer, failure: Failure, leasing: Option<Leasing>) -> Server {
    let mut settings = RedisSettings::default();
    settings.failure = failure;
    settings.lease = leasing;
    let server = Server::with_redis(config(&[API]), Options::default(), settings).unwrap();
    let options = tollgate_redis::Options::new().timeout(TIMEOUT);
    let client = tollgate_redis::Client::connect_with(&redis.url(), options)
        .await
        .unwrap();
    server.connect_redis(client);
    server
}

/// Leases every token bucket, however slow.
fn every_rate() -> Leasing {
    let mut leasing = Leasing::default();
    leasing.min_rate_per_second = 0.0;
    leasing
}

fn one(key: &str, value: &str) -> RateLimitRequest {
    request("api", vec![descriptor(&[(key, value)])])
}

/// Two leased replicas, 8 tasks each, for about a second on one tenant:
/// admitted at most the burst plus the rate times the time elapsed (the
/// bucket's promise, by lease time; leases start after the first request),
/// with far fewer script calls than requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leased_replicas_never_over_admit_and_call_redis_per_lease_not_per_request() {
    let redis = RedisServer::start();
    let replicas = [
        replica(&redis, Failure::Closed, Some(Leasing::default())).await,
        replica(&redis, Failure::Closed, Some(Leasing::default())).await,
    ];
    let _: () = redis.cmd(&["CONFIG", "RESETSTAT"]);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for t in 0..16 {
        let server = replicas[t % 2].clone();
        tasks.push(tokio::spawn(async move {
            let tenant = one("tenant", "acme");
            let (mut admitted, mut asked) = (0u64, 0u64);
            while started.elapsed() < Duration::from_secs(1) {
                // A served request ends its task; this loop yields as
                // often, so that the lease tasks get to run.
                tokio::task::yield_now().await;
                asked += 1;
                if code(&server, &tenant).await == Code::Ok {
                    admitted += 1;
                }
            }
            (admitted, asked)
        }));
    }
    let (mut admitted, mut asked) = (0, 0);
    for task in tasks {
        let (a, n) = task.await.unwrap();
        admitted += a;
        asked += n;
    }
    let elapsed = started.elapsed();
    let bound = 200 + (elapsed.as_secs_f64() * 1000.0).ceil() as u64;
    assert!(
        admitted <= bound,
        "{admitted} admitted of {asked} in {elapsed:?}: above {bound}"
    );
    // Liveness: the burst alone is 200, and leases keep coming at 1,000/s.
    assert!(admitted >= 100, "{admitted} admitted of {asked}");
    let calls = redis.script_calls();
    assert!(
        calls * 4 < asked,
        "{calls} script calls for {asked} requests: leases should cover many"
    );
    assert!(replicas.iter().all(|r| r.leased_keys() == 1));
}

/// A leased limit and one in Redis on one request, all or nothing both
/// ways: refused in Redis, the leased permits go back to the pool; refused
/// by the lease, Redis is not asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leased_and_redis_limits_are_all_or_nothing() {
    let redis = RedisServer::start();
    let server = replica(&redis, Failure::Closed, Some(every_rate())).await;
    let both = |slow: &str, user: &str| {
        request(
            "api",
            vec![descriptor(&[("slow", slow)]), descriptor(&[("user", user)])],
        )
    };
    // The user's 10 in Redis refuse the last 5 of 15; the slow bucket (12)
    // is charged only for the 10 admitted, so 2 remain for it alone.
    let mut admitted = 0;
    for _ in 0..15 {
        if code(&server, &both("s1", "u1")).await == Code::Ok {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 10);
    let mut alone = 0;
    for _ in 0..5 {
        if code(&server, &one("slow", "s1")).await == Code::Ok {
            alone += 1;
        }
    }
    assert_eq!(
        alone, 2,
        "refused requests were charged to the leased limit"
    );

    // The other way: spend 11 of a slow bucket alone; then requests with a
    // fresh user are refused by the lease and charge the user nothing.
    for _ in 0..11 {
        assert_eq!(code(&server, &one("slow", "s2")).await, Code::Ok);
    }
    assert_eq!(code(&server, &both("s2", "u2")).await, Code::Ok);
    for _ in 0..3 {
        assert_eq!(code(&server, &both("s2", "u2")).await, Code::OverLimit);
    }
    let mut user = 0;
    for _ in 0..12 {
        if code(&server, &one("user", "u2")).await == Code::Ok {
            user += 1;
        }
    }
    assert_eq!(user, 9, "requests the lease refused were charged in Redis");
    assert_eq!(server.leased_keys(), 2);
}

/// A leased replica and a Redis replica share one bucket's state: never
/// more than the bucket between them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leased_replica_and_a_redis_replica_share_one_bucket() {
    let redis = RedisServer::start();
    let leased = replica(&redis, Failure::Closed, Some(every_rate())).await;
    let direct = replica(&redis, Failure::Closed, None).await;
    let slow = one("slow", "shared");
    let mut admitted = 0;
    for i in 0..40 {
        let server = if i % 2 == 0 { &leased } else { &direct };
        if code(server, &slow).await == Code::Ok {
            admitted += 1;
        }
    }
    assert!((1..=12).contains(&admitted), "{admitted} admitted of 12");
}

/// Redis paused: a key that holds no lease yet is answered by the failure
/// mode within the client's timeout (a lease call is all it waits for);
/// back, it leases again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_key_during_a_pause_gets_the_failure_mode_in_time() {
    let redis = RedisServer::start();
    let closed = replica(&redis, Failure::Closed, Some(Leasing::default())).await;
    let open = replica(&redis, Failure::Open, Some(Leasing::default())).await;
    let local = replica(&redis, Failure::Local, Some(Leasing::default())).await;
    redis.pause();
    for (server, expected, tenant) in [
        (&closed, Code::OverLimit, "cold-1"),
        (&open, Code::Ok, "cold-2"),
        (&local, Code::Ok, "cold-3"),
    ] {
        let started = Instant::now();
        let got = code(server, &one("tenant", tenant)).await;
        let took = started.elapsed();
        assert_eq!(got, expected, "{tenant}");
        assert!(took < TIMEOUT * 10, "{tenant}: answered after {took:?}");
    }
    redis.resume();
    let deadline = Instant::now() + Duration::from_secs(20);
    while code(&closed, &one("tenant", "cold-1")).await != Code::Ok {
        assert!(Instant::now() < deadline, "never leased after the pause");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A reload that keeps a leased rule keeps its leases; one that changes
/// the rule drops them; a key idle past `Leasing::idle` gives its lease
/// back and leaves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_survive_a_reload_of_their_rule_and_leave_when_idle() {
    let redis = RedisServer::start();
    let mut leasing = every_rate();
    leasing.idle = Duration::from_millis(300);
    let server = replica(&redis, Failure::Closed, Some(leasing)).await;
    for _ in 0..4 {
        assert_eq!(code(&server, &one("slow", "r1")).await, Code::Ok);
    }
    assert_eq!(server.leased_keys(), 1);
    server.reload(config(&[API])).unwrap();
    assert_eq!(server.leased_keys(), 1, "an unchanged rule keeps its lease");
    // The lease still holds r1's other 8 permits: exactly 8 more.
    let mut more = 0;
    for _ in 0..10 {
        if code(&server, &one("slow", "r1")).await == Code::Ok {
            more += 1;
        }
    }
    assert_eq!(more, 8);
    let changed = API.replace("requests_per_unit: 12", "requests_per_unit: 13");
    server.reload(config(&[&changed])).unwrap();
    assert_eq!(server.leased_keys(), 0, "a changed rule drops its leases");
    assert_eq!(code(&server, &one("slow", "r2")).await, Code::Ok);
    assert_eq!(server.leased_keys(), 1);
    tokio::time::sleep(Duration::from_millis(700)).await;
    // The next request sweeps: r2 idle, gone; r3 new.
    assert_eq!(code(&server, &one("slow", "r3")).await, Code::Ok);
    assert_eq!(server.leased_keys(), 1);
}
