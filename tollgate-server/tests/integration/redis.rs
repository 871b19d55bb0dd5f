//! The Redis backend against real `redis-server` processes and a real
//! three-master Redis Cluster the tests start on loopback: replicas sharing
//! limits exactly, one script call per request, all or nothing across
//! replicas, and every failure mode when Redis is killed or paused.

use crate::support;

// tollgate-redis's test servers (its cluster finds the server as
// `super::server`).
#[allow(dead_code)]
use crate::cluster;
#[allow(dead_code)]
use crate::server;

use std::time::{Duration, Instant};

use cluster::RedisCluster;
use server::RedisServer;
use support::{Running, code, config, descriptor, request};
use tollgate_server::proto::envoy::service::ratelimit::v3::RateLimitRequest;
use tollgate_server::proto::envoy::service::ratelimit::v3::rate_limit_response::Code;
use tollgate_server::{Failure, Options, RedisSettings, Server};

const API: &str = "
domain: api
descriptors:
  - key: user
    rate_limit:
      unit: hour
      requests_per_unit: 10
  - key: route
    value: upload
    rate_limit:
      unit: hour
      requests_per_unit: 1000
      algorithm: token_bucket
      burst: 1000
  - key: login
    rate_limit:
      unit: hour
      requests_per_unit: 3
      algorithm: sliding_log
  - key: probe
    shadow_mode: true
    rate_limit:
      unit: hour
      requests_per_unit: 1
";

const TIMEOUT: Duration = Duration::from_millis(50);

/// A replica on the Redis at `urls` (a Cluster's nodes when several).
async fn replica(urls: &[String], failure: Failure) -> Server {
    let mut settings = RedisSettings::default();
    settings.failure = failure;
    let server = Server::with_redis(config(&[API]), Options::default(), settings).unwrap();
    let options = tollgate_redis::Options::new().timeout(TIMEOUT);
    let client = if urls.len() > 1 {
        let nodes: Vec<&str> = urls.iter().map(String::as_str).collect();
        tollgate_redis::Client::connect_cluster_with(&nodes, options)
            .await
            .unwrap()
    } else {
        tollgate_redis::Client::connect_with(&urls[0], options)
            .await
            .unwrap()
    };
    server.connect_redis(client);
    server
}

fn both(user: &str) -> RateLimitRequest {
    request(
        "api",
        vec![
            descriptor(&[("route", "upload")]),
            descriptor(&[("user", user)]),
        ],
    )
}

/// `n` replicas failing closed on the Redis at `urls`, each with the script
/// loaded on its connection by a first request.
async fn warm_replicas(urls: &[String], n: usize) -> Vec<Server> {
    let mut replicas = Vec::new();
    for _ in 0..n {
        let replica = replica(urls, Failure::Closed).await;
        code(&replica, &both("warm-up")).await;
        replicas.push(replica);
    }
    replicas
}

/// How many of `requests` requests for `user`, sent to `replicas` in turn,
/// are admitted.
async fn admitted(replicas: &[Server], user: &str, requests: usize) -> usize {
    let mut admitted = 0;
    for i in 0..requests {
        if code(&replicas[i % replicas.len()], &both(user)).await == Code::Ok {
            admitted += 1;
        }
    }
    admitted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_the_limits_exactly_with_one_call_per_request() {
    let redis = RedisServer::start();
    let replicas = warm_replicas(&[redis.url()], 3).await;
    let _: () = redis.cmd(&["CONFIG", "RESETSTAT"]);
    // 30 requests for one user sprayed over three replicas: exactly 10
    // admitted, and the upload bucket charged for those 10 only.
    assert_eq!(admitted(&replicas, "alice", 30).await, 10);
    assert_eq!(redis.script_calls(), 30, "one script call per request");
    let answer = replicas[0].should_rate_limit(&both("bob")).await.unwrap();
    assert_eq!(answer.overall_code(), Code::Ok);
    // 1000 − three warm-ups − alice's 10 − bob's.
    assert_eq!(answer.statuses[0].limit_remaining, 1000 - 3 - 10 - 1);
    assert_eq!(answer.statuses[1].limit_remaining, 9);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_replicas_never_over_admit() {
    let redis = RedisServer::start();
    let urls = [redis.url()];
    let replicas = [
        replica(&urls, Failure::Closed).await,
        replica(&urls, Failure::Closed).await,
    ];
    let login = request("api", vec![descriptor(&[("login", "carol")])]);
    let mut tasks = Vec::new();
    for t in 0..16 {
        let server = replicas[t % 2].clone();
        let login = login.clone();
        tasks.push(tokio::spawn(async move {
            let mut admitted = 0;
            for _ in 0..10 {
                if code(&server, &login).await == Code::Ok {
                    admitted += 1;
                }
            }
            admitted
        }));
    }
    let mut admitted = 0;
    for t in tasks {
        admitted += t.await.unwrap();
    }
    assert_eq!(
        admitted, 3,
        "an exact sliding log of 3 per hour across replicas"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_mode_counts_but_refuses_nothing_in_redis() {
    let redis = RedisServer::start();
    let server = replica(&[redis.url()], Failure::Closed).await;
    let probe = request("api", vec![descriptor(&[("probe", "x")])]);
    for _ in 0..3 {
        let answer = server.should_rate_limit(&probe).await.unwrap();
        assert_eq!(answer.overall_code(), Code::Ok);
    }
}

/// What each failure mode answers while Redis is down and while it is
/// paused: never later than a bound well above the client's timeout (a
/// hang would fail it), and as the mode says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_failure_mode_answers_in_time_when_redis_is_killed_or_paused() {
    let mut redis = RedisServer::start();
    let urls = [redis.url()];
    let open = replica(&urls, Failure::Open).await;
    let closed = replica(&urls, Failure::Closed).await;
    let local = replica(&urls, Failure::Local).await;
    let dave = both("dave");
    // Spend dave's 10 in Redis: every mode refuses the 11th while Redis is up.
    for _ in 0..10 {
        assert_eq!(code(&open, &dave).await, Code::Ok);
    }
    for server in [&open, &closed, &local] {
        assert_eq!(code(server, &dave).await, Code::OverLimit);
    }
    for outage in ["paused", "killed"] {
        match outage {
            "paused" => redis.pause(),
            _ => {
                redis.resume();
                redis.kill();
            }
        }
        let bound = TIMEOUT * 20;
        for (server, expected) in [
            (&open, Code::Ok),
            (&closed, Code::OverLimit),
            (&local, Code::Ok),
        ] {
            let started = Instant::now();
            let got = code(server, &dave).await;
            let took = started.elapsed();
            assert_eq!(got, expected, "{outage}");
            assert!(took < bound, "{outage}: answered after {took:?}");
        }
        // Local: this replica's own limit of 10, no more.
        let user = format!("local-{outage}");
        let local_admitted = admitted(std::slice::from_ref(&local), &user, 15).await;
        assert_eq!(local_admitted, 10, "{outage}");
    }
    // Redis back: the shared state decides again (dave's 10 were lost with
    // the killed process, which kept no file).
    redis.restart();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if code(&closed, &both("erin")).await == Code::Ok {
            break;
        }
        assert!(Instant::now() < deadline, "the replica never reconnected");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_not_yet_connected_answers_by_its_failure_mode() {
    let mut settings = RedisSettings::default();
    settings.failure = Failure::Closed;
    let server = Server::with_redis(config(&[API]), Options::default(), settings).unwrap();
    assert_eq!(code(&server, &both("frank")).await, Code::OverLimit);
    // A descriptor with no limit is not refused by the failure mode.
    let free = request("api", vec![descriptor(&[("unknown", "x")])]);
    assert_eq!(code(&server, &free).await, Code::Ok);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_decides_a_request_in_one_call_on_one_node() {
    let cluster = RedisCluster::start();
    let replicas = warm_replicas(&cluster.urls(), 2).await;
    for node in &cluster.nodes {
        let _: () = node.cmd(&["CONFIG", "RESETSTAT"]);
    }
    assert_eq!(admitted(&replicas, "grace", 20).await, 10);
    let calls: Vec<u64> = cluster.nodes.iter().map(|n| n.script_calls()).collect();
    assert_eq!(calls.iter().sum::<u64>(), 20, "{calls:?}");
    assert_eq!(
        calls.iter().filter(|&&c| c > 0).count(),
        1,
        "every key of the domain on one node: {calls:?}"
    );
}

const SHOP: &str = "
domain: shop
descriptors:
  - key: user
    rate_limits:
      - {unit: hour, requests_per_unit: 3}
      - {unit: hour, requests_per_unit: 5}
";

/// Two rules of one descriptor and a request's own limit, all fixed windows
/// on one state key, each keep a Redis key of their own (`rule-0`, `rule-1`,
/// `override-2-per-hour`), and all of them lie in the domain's slot: one
/// call on one node decides them together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_limit_of_a_state_key_has_its_own_key_in_the_domains_slot() {
    use tollgate_server::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
    use tollgate_server::proto::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;

    let cluster = RedisCluster::start();
    let urls = cluster.urls();
    let nodes: Vec<&str> = urls.iter().map(String::as_str).collect();
    let server = Server::with_redis(
        config(&[SHOP]),
        Options::default(),
        RedisSettings::default(),
    )
    .unwrap();
    let client = tollgate_redis::Client::connect_cluster_with(
        &nodes,
        tollgate_redis::Options::new().timeout(Duration::from_secs(2)),
    )
    .await
    .unwrap();
    server.connect_redis(client);
    let mut own = descriptor(&[("user", "alice")]);
    own.limit = Some(RateLimitOverride {
        requests_per_unit: 2,
        unit: Unit::Hour as i32,
    });
    let both = request("shop", vec![descriptor(&[("user", "alice")]), own]);
    // The request's own limit, 2 an hour, binds; the refusal charges nothing.
    let mut codes = Vec::new();
    for _ in 0..3 {
        codes.push(code(&server, &both).await);
    }
    assert_eq!(codes, [Code::Ok, Code::Ok, Code::OverLimit]);
    let mut keys: Vec<(u16, String)> = Vec::new();
    for node in &cluster.nodes {
        let found: Vec<String> = node.cmd(&["KEYS", "tollgate-server:*"]);
        keys.extend(found.into_iter().map(|k| (node.port(), k)));
    }
    keys.sort_by(|a, b| a.1.cmp(&b.1));
    let names: Vec<&str> = keys
        .iter()
        .map(|(_, k)| k.split(':').nth(1).unwrap())
        .collect();
    assert_eq!(
        names,
        ["override-2-per-hour", "rule-0", "rule-1"],
        "{keys:?}"
    );
    assert!(
        keys.iter().all(|(port, _)| *port == keys[0].0),
        "one node: {keys:?}"
    );
    let slot = |key: &str| -> i64 { cluster.nodes[0].cmd(&["CLUSTER", "KEYSLOT", key]) };
    for (port, key) in &keys {
        assert!(key.contains(":{shop}:"), "{key}");
        assert_eq!(slot(key), slot("shop"), "{key}");
        let node = cluster.nodes.iter().find(|n| n.port() == *port).unwrap();
        // A fixed window's state: `fw2:<window>:<count>`.
        let state: String = node.cmd(&["GET", key]);
        assert!(
            state.starts_with("fw2:") && state.ends_with(":2"),
            "{key}: {state}"
        );
    }
    // The rules go on by their own counts: rule 0 has 1 left, rule 1 has 3.
    let plain = request("shop", vec![descriptor(&[("user", "alice")])]);
    let answer = server.should_rate_limit(&plain).await.unwrap();
    assert_eq!(answer.overall_code(), Code::Ok);
    assert_eq!(answer.statuses[0].limit_remaining, 0);
    assert_eq!(code(&server, &plain).await, Code::OverLimit);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_client_is_decided_in_redis() {
    let redis = RedisServer::start();
    let running = Running::serve(replica(&[redis.url()], Failure::Closed).await).await;
    let mut client = running.client().await;
    let mut codes = Vec::new();
    for _ in 0..4 {
        let login = request("api", vec![descriptor(&[("login", "heidi")])]);
        codes.push(
            client
                .should_rate_limit(login)
                .await
                .unwrap()
                .into_inner()
                .overall_code(),
        );
    }
    assert_eq!(codes, [Code::Ok, Code::Ok, Code::Ok, Code::OverLimit]);
    running.stop().await;
}

/// A server bound to one call in flight, on a Redis whose calls wait up to
/// `timeout` (failure mode closed), served on loopback.
async fn one_slot(timeout: Duration) -> (RedisServer, Running) {
    let redis = RedisServer::start();
    let mut settings = RedisSettings::default();
    settings.failure = Failure::Closed;
    let mut options = Options::default();
    options.in_flight = tollgate_server::InFlight::Fixed(1);
    let server = Server::with_redis(config(&[API]), options, settings).unwrap();
    let slow = tollgate_redis::Options::new().timeout(timeout);
    server.connect_redis(
        tollgate_redis::Client::connect_with(&redis.url(), slow)
            .await
            .unwrap(),
    );
    (redis, Running::serve(server).await)
}

/// The server's own bound on calls in flight, with a call stuck on a paused
/// Redis: the next calls are shed at once with `UNAVAILABLE`, and the stuck
/// one is answered by the failure mode when its timeout ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_stuck_on_paused_redis_holds_the_bound_and_the_next_are_shed() {
    let (redis, running) = one_slot(Duration::from_secs(2)).await;
    let mut client = running.client().await;
    // Loads the script while Redis answers.
    client.should_rate_limit(both("warm-up")).await.unwrap();
    redis.pause();
    // Two calls at once: whichever takes the one slot is stuck on Redis for
    // the client's timeout and then refused by the failure mode; every call
    // that meets it there is shed.
    let mut stuck_client = client.clone();
    let ivan = tokio::spawn(async move { stuck_client.should_rate_limit(both("ivan")).await });
    let (mut shed, mut stuck) = (0, 0);
    let mut count = |answer: Result<tonic::Response<_>, tonic::Status>| match answer {
        Err(status) => {
            assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
            shed += 1;
        }
        // Let in while Redis is paused: stuck until the timeout.
        Ok(answer) => {
            let answer: tollgate_server::proto::envoy::service::ratelimit::v3::RateLimitResponse =
                answer.into_inner();
            assert_eq!(answer.overall_code(), Code::OverLimit, "closed: refused");
            stuck += 1;
        }
    };
    loop {
        count(client.should_rate_limit(both("judy")).await);
        if ivan.is_finished() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    count(ivan.await.unwrap());
    assert!(stuck >= 1, "no call was let in");
    assert!(shed > 0, "no call was shed while one was stuck");
    redis.resume();
    running.stop().await;
}

/// A domain's `failure_mode` overrides the server's for that domain only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_domain_answers_by_its_own_failure_mode() {
    let redis = RedisServer::start();
    let domain = |name: &str, mode: &str| {
        format!(
            "domain: {name}\n{mode}descriptors:\n  - key: user\n    rate_limit: {{unit: hour, requests_per_unit: 10}}\n"
        )
    };
    let (open, closed, local, default) = (
        domain("open", "failure_mode: open\n"),
        domain("closed", "failure_mode: fail_closed\n"),
        domain("local", "failure_mode: local\n"),
        domain("default", ""),
    );
    let mut settings = RedisSettings::default();
    settings.failure = Failure::Closed;
    let server = Server::with_redis(
        config(&[&open, &closed, &local, &default]),
        Options::default(),
        settings,
    )
    .unwrap();
    server.connect_redis(
        tollgate_redis::Client::connect_with(
            &redis.url(),
            tollgate_redis::Options::new().timeout(TIMEOUT),
        )
        .await
        .unwrap(),
    );
    let ask = |domain: &str| request(domain, vec![descriptor(&[("user", "kim")])]);
    for name in ["open", "closed", "local", "default"] {
        assert_eq!(code(&server, &ask(name)).await, Code::Ok, "{name}");
    }
    redis.pause();
    for (name, expected) in [
        ("open", Code::Ok),
        ("closed", Code::OverLimit),
        ("local", Code::Ok),
        ("default", Code::OverLimit),
    ] {
        assert_eq!(code(&server, &ask(name)).await, expected, "{name}");
    }
    // Local: this replica's own 10, no more.
    let mut admitted = 0;
    for _ in 0..15 {
        if code(&server, &ask("local")).await == Code::Ok {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 9, "one local admission before, 9 more");
    redis.resume();
}

/// Thousands of calls shed on one HTTP/2 connection while a call holds the
/// only slot: every one is answered `UNAVAILABLE`, none fails in transport.
/// (The shed calls' bodies, dropped unread, are read in the background:
/// h2 would otherwise keep their late DATA frames charged to the
/// connection's flood budget and close the connection with `GOAWAY`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shedding_thousands_of_calls_keeps_the_connection() {
    let (redis, running) = one_slot(Duration::from_secs(30)).await;
    let client = running.client().await;
    client
        .clone()
        .should_rate_limit(both("warm-up"))
        .await
        .unwrap();
    redis.pause();
    // Calls until one is shed: then the slot is held by a call stuck on the
    // paused Redis. No call that may hold it is ever abandoned (an abandoned
    // call would give the slot back): each runs in a task of its own, kept.
    let mut held = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut probe = client.clone();
        let mut call = tokio::spawn(async move { probe.should_rate_limit(both("holder")).await });
        match tokio::time::timeout(Duration::from_millis(200), &mut call).await {
            Ok(Ok(Err(status))) if status.code() == tonic::Code::Unavailable => break,
            // Stuck: it holds the slot now, and keeps it.
            Err(_) => held.push(call),
            Ok(other) => panic!("a call answered while Redis is paused: {other:?}"),
        }
        assert!(Instant::now() < deadline, "the slot was never held");
    }
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let mut client = client.clone();
        tasks.push(tokio::spawn(async move {
            let mut failed = Vec::new();
            for _ in 0..100 {
                let call = client.should_rate_limit(both("shed"));
                match tokio::time::timeout(Duration::from_secs(5), call).await {
                    Ok(Err(status)) if status.code() == tonic::Code::Unavailable => {}
                    other => {
                        failed.push(format!("{other:?}"));
                        break;
                    }
                }
            }
            failed
        }));
    }
    let mut failed = Vec::new();
    for task in tasks {
        failed.extend(task.await.unwrap());
    }
    assert!(
        failed.is_empty(),
        "{} failed: {:?}",
        failed.len(),
        &failed[..failed.len().min(3)]
    );
    redis.resume();
    for call in held {
        let _ = call.await;
    }
    running.stop().await;
}
