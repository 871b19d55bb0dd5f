//! The limiters against one real `redis-server` on the server's own clock:
//! outcomes, one round trip per decision, TTLs, and bad keys and bad servers.
//! Rates are per hour, so nothing refills while a test runs: every assertion
//! holds whatever the timing.

use crate::support;

use std::time::Duration;

use tollgate::{Denied, Rate};
use tollgate_redis::{
    ApproxSlidingWindow, Client, Error, FixedWindow, Limiter, Options, SlidingLog, TokenBucket,
    blocking,
};

use support::{RedisServer, server_and_client};

fn hourly(permits: u32) -> Rate {
    Rate::per_hour(permits)
}

/// One limiter of each kind, each allowing 3 per hour.
fn limiters() -> Vec<Box<dyn Limiter>> {
    vec![
        Box::new(TokenBucket::new("bucket", 3, hourly(3)).unwrap()),
        Box::new(FixedWindow::new("window", hourly(3)).unwrap()),
        Box::new(ApproxSlidingWindow::new("approx", hourly(3)).unwrap()),
        Box::new(SlidingLog::new("log", hourly(3)).unwrap()),
    ]
}

async fn connect(server: &RedisServer) -> Client {
    Client::connect(&server.url()).await.unwrap()
}

#[tokio::test]
async fn every_limiter_admits_its_limit_then_denies_with_a_retry_after() {
    let (_server, client) = server_and_client().await;
    for limiter in limiters() {
        let first = client.try_acquire_n(&*limiter, "user:1", 2).await.unwrap();
        assert_eq!(first.remaining, 1);
        let second = client.try_acquire(&*limiter, "user:1").await.unwrap();
        assert_eq!(second.remaining, 0);
        assert!(second.time_us >= first.time_us);
        let wait = client
            .try_acquire(&*limiter, "user:1")
            .await
            .unwrap_err()
            .retry_after()
            .expect("a retry-after");
        assert!(wait > Duration::ZERO && wait <= Duration::from_secs(2 * 3600));
        // Another key has its own limit.
        assert!(client.try_acquire_n(&*limiter, "user:2", 3).await.is_ok());
    }
}

#[tokio::test]
async fn bad_requests_are_denied_without_a_round_trip() {
    let (server, client) = server_and_client().await;
    for limiter in limiters() {
        let before = server.script_calls();
        assert!(matches!(
            client.try_acquire_n(&*limiter, "k", 0).await,
            Err(Error::Denied(Denied::ZeroPermits))
        ));
        assert!(matches!(
            client.try_acquire_n(&*limiter, "k", 4).await,
            Err(Error::Denied(Denied::ExceedsCapacity {
                requested: 4,
                capacity: 3
            }))
        ));
        assert!(matches!(
            client.try_acquire_n(&*limiter, "k", u32::MAX).await,
            Err(Error::Denied(Denied::ExceedsCapacity { .. }))
        ));
        assert_eq!(server.script_calls(), before);
    }
}

#[tokio::test]
async fn the_token_bucket_retry_after_is_exact() {
    let (server, client) = server_and_client().await;
    // One permit per 1200 s (3 an hour): after taking all 3, the next one is
    // due exactly 1200 s after the first admission's time.
    let bucket = TokenBucket::new("bucket", 3, hourly(3)).unwrap();
    let first = client.try_acquire_n(&bucket, "k", 3).await.unwrap();
    let denied = client.try_acquire(&bucket, "k").await.unwrap_err();
    let wait = denied.retry_after().unwrap();
    let pttl: i64 = server.cmd(&["PTTL", &bucket.redis_key("k")]);
    // The script's wait is measured from its own (later) time, so at most the
    // full interval; the key lives until the bucket is full again.
    assert!(wait <= Duration::from_secs(1200));
    assert!(wait >= Duration::from_secs(1199), "{wait:?}");
    // Expiry is at a whole millisecond at or after the TAT.
    assert!(pttl > 3_599_000 - 1_000 && pttl <= 3_600_001, "{pttl}");
    let _ = first;
}

#[tokio::test]
async fn one_decision_is_one_script_call_and_nothing_else() {
    let (server, client) = server_and_client().await;
    let limiters = limiters();
    // Load every script once, then count from zero.
    for limiter in &limiters {
        client.try_acquire(&**limiter, "warm").await.unwrap();
    }
    let _: () = server.cmd(&["CONFIG", "RESETSTAT"]);
    let per_limiter = 50u64;
    for limiter in &limiters {
        for i in 0..per_limiter {
            let _ = client
                .try_acquire(&**limiter, &format!("key{}", i % 5))
                .await;
        }
    }
    let decisions = per_limiter * limiters.len() as u64;
    assert_eq!(server.script_calls(), decisions);
    // Server time comes from TIME inside every script, once per decision.
    assert_eq!(server.calls("time"), decisions);
    // Commands the scripts run count here too (a counter's GET and SET), so
    // only those no script runs are checked.
    for other in [
        "eval",
        "script|load",
        "script",
        "incr",
        "multi",
        "exec",
        "watch",
    ] {
        assert_eq!(server.calls(other), 0, "{other}");
    }
}

#[tokio::test]
async fn every_written_key_gets_a_ttl_no_longer_than_its_state_matters() {
    let (server, client) = server_and_client().await;
    let hour_ms = 3_600_000i64;
    let history = Duration::from_secs(7200);
    let cases: Vec<(Box<dyn Limiter>, i64)> = vec![
        // Full again one hour after the 3 permits' hour of refill.
        (
            Box::new(TokenBucket::new("bucket", 3, hourly(3)).unwrap()),
            hour_ms,
        ),
        // The current window's end: at most an hour away.
        (
            Box::new(FixedWindow::new("window", hourly(3)).unwrap()),
            hour_ms,
        ),
        // The window after the current one ends: at most two hours away.
        (
            Box::new(ApproxSlidingWindow::new("approx", hourly(3)).unwrap()),
            2 * hour_ms,
        ),
        // The history after the newest stamp.
        (
            Box::new(
                SlidingLog::new("log", hourly(3))
                    .unwrap()
                    .with_history(history)
                    .unwrap(),
            ),
            2 * hour_ms,
        ),
    ];
    for (limiter, most) in cases {
        client.try_acquire_n(&*limiter, "ttl", 3).await.unwrap();
        let key = limiter.redis_key("ttl");
        let pttl: i64 = server.cmd(&["PTTL", &key]);
        // Plus one: keys expire at the next whole millisecond.
        assert!(
            pttl > 0 && pttl <= most + 1,
            "{key}: PTTL {pttl} of at most {most}"
        );
        // A denial writes nothing.
        let before: Vec<String> = dump(&server, &key);
        assert!(client.try_acquire(&*limiter, "ttl").await.is_err());
        assert_eq!(dump(&server, &key), before);
    }
    let keys: Vec<String> = server.cmd(&["KEYS", "*"]);
    for key in keys {
        let pttl: i64 = server.cmd(&["PTTL", &key]);
        assert!(pttl > 0, "{key} has no TTL");
    }
}

/// A key's content, whatever its type.
fn dump(server: &RedisServer, key: &str) -> Vec<String> {
    let kind: String = server.cmd(&["TYPE", key]);
    match kind.as_str() {
        "hash" => server.cmd(&["HGETALL", key]),
        "string" => vec![server.cmd(&["GET", key])],
        "zset" => server.cmd(&["ZRANGE", key, "0", "-1", "WITHSCORES"]),
        other => vec![other.to_owned()],
    }
}

#[tokio::test]
async fn a_flushed_library_is_loaded_again_transparently() {
    let (server, client) = server_and_client().await;
    for limiter in limiters() {
        client.try_acquire(&*limiter, "flush").await.unwrap();
        let loads = server.calls("function|load");
        let _: () = server.cmd(&["FUNCTION", "FLUSH"]);
        let admitted = client.try_acquire(&*limiter, "flush").await.unwrap();
        assert_eq!(admitted.remaining, 1, "the state outlived the library");
        assert_eq!(server.calls("function|load"), loads + 1);
    }
    // Once loaded, a decision is one FCALL: no load, no EVALSHA.
    let loads = server.calls("function|load");
    for limiter in limiters() {
        client.try_acquire(&*limiter, "again").await.unwrap();
    }
    assert_eq!(server.calls("function|load"), loads);
    assert_eq!(server.calls("evalsha") + server.calls("eval"), 0);
}

#[tokio::test]
async fn a_user_who_may_not_load_functions_decides_by_evalsha() {
    let server = RedisServer::start();
    let _: () = server.cmd(&[
        "ACL",
        "SETUSER",
        "limited",
        "on",
        ">secret",
        "~*",
        "&*",
        "+@all",
        "-function",
    ]);
    let url = server.url().replace("redis://", "redis://limited:secret@");
    let client = Client::connect(&url).await.unwrap();
    for limiter in limiters() {
        assert_eq!(
            client
                .try_acquire_n(&*limiter, "k", 3)
                .await
                .unwrap()
                .remaining,
            0
        );
        let refused = client.try_acquire(&*limiter, "k").await.unwrap_err();
        assert!(refused.retry_after().is_some(), "{refused}");
    }
    let loaded: Vec<redis::Value> = server.cmd(&["FUNCTION", "LIST"]);
    assert!(loaded.is_empty(), "the user could not load the library");
    assert!(server.calls("evalsha") >= 8);
}

#[tokio::test]
async fn a_server_without_functions_decides_the_same_by_evalsha() {
    // A server that answers FCALL as an unknown command, as Redis 6.2 does.
    let old = RedisServer::start_with(&["--rename-command", "FCALL", ""]);
    let new = RedisServer::start();
    let (old_client, new_client) = (connect(&old).await, connect(&new).await);
    for limiter in limiters() {
        for n in [2, 1, 1] {
            let on_old = old_client.try_acquire_n(&*limiter, "k", n).await;
            let on_new = new_client.try_acquire_n(&*limiter, "k", n).await;
            match (&on_old, &on_new) {
                (Ok(a), Ok(b)) => assert_eq!(a.remaining, b.remaining),
                (Err(a), Err(b)) => assert_eq!(a.is_denied(), b.is_denied(), "{a} / {b}"),
                _ => panic!("{on_old:?} / {on_new:?}"),
            }
        }
        let _: () = old.cmd(&["SCRIPT", "FLUSH"]);
        let refused = old_client.try_acquire(&*limiter, "k").await.unwrap_err();
        assert!(refused.retry_after().is_some(), "{refused}");
    }
    assert_eq!(old.calls("function|load"), 0);
    assert!(old.calls("evalsha") >= 16);
    // The server with Functions ran every script call as an FCALL.
    assert_eq!(new.calls("evalsha") + new.calls("eval"), 0);
}

#[tokio::test]
async fn a_key_of_the_wrong_type_is_a_clear_error_and_stays_untouched() {
    let (server, client) = server_and_client().await;
    for limiter in limiters() {
        let key = limiter.redis_key("taken");
        let _: () = server.cmd(&["RPUSH", &key, "someone else's list"]);
        match client.try_acquire(&*limiter, "taken").await {
            Err(Error::WrongType { key: k, detail }) => {
                assert_eq!(k, key);
                assert!(detail.contains("WRONGTYPE"), "{detail}");
            }
            other => panic!("{key}: expected WrongType, got {other:?}"),
        }
        let list: Vec<String> = server.cmd(&["LRANGE", &key, "0", "-1"]);
        assert_eq!(list, ["someone else's list"]);
    }
}

#[tokio::test]
async fn state_from_another_format_is_never_reinterpreted() {
    let (server, client) = server_and_client().await;
    for limiter in limiters() {
        let key = limiter.redis_key("old");
        // What an older script version (or another program) might have left.
        if key.ends_with(":sl") {
            let _: () = server.cmd(&["ZADD", &key, "1", "a-permit"]);
        } else {
            let _: () = server.cmd(&["HSET", &key, "tat", "12345"]);
        }
        match client.try_acquire(&*limiter, "old").await {
            Err(Error::UnknownState { key: k, .. }) => assert_eq!(k, key),
            other => panic!("{key}: expected UnknownState, got {other:?}"),
        }
        // A bare number, as another program's counter holds it: not the
        // counters' string format (tag first), and the wrong type for a log.
        let _: () = server.cmd(&["DEL", &key]);
        let _: () = server.cmd(&["SET", &key, "7"]);
        let outcome = client.try_acquire(&*limiter, "old").await;
        if key.ends_with(":sl") {
            assert!(
                matches!(outcome, Err(Error::WrongType { .. })),
                "{outcome:?}"
            );
        } else {
            match outcome {
                Err(Error::UnknownState { detail, .. }) => {
                    assert!(detail.contains("expected format"), "{detail}")
                }
                other => panic!("{key}: expected UnknownState, got {other:?}"),
            }
        }
        let left: String = server.cmd(&["GET", &key]);
        assert_eq!(left, "7");
    }
    // A tagged hash whose fields were damaged.
    let bucket = TokenBucket::new("bucket", 3, hourly(3)).unwrap();
    let key = bucket.redis_key("damaged");
    let _: () = server.cmd(&["HSET", &key, "v", "tb1", "tat", "soon"]);
    assert!(matches!(
        client.try_acquire(&bucket, "damaged").await,
        Err(Error::UnknownState { .. })
    ));
}

#[tokio::test]
async fn a_frozen_server_is_a_bounded_timeout_then_recovers() {
    let server = RedisServer::start();
    let options = Options::new().timeout(Duration::from_millis(100));
    let client = Client::connect_with(&server.url(), options).await.unwrap();
    let bucket = TokenBucket::new("bucket", 3, hourly(3)).unwrap();
    client.try_acquire(&bucket, "frozen").await.unwrap();
    server.pause();
    let started = std::time::Instant::now();
    let outcome = client.try_acquire(&bucket, "frozen").await;
    // The caller's own clock bounds the wait: the timeout, not redis-rs's
    // defaults (generous slack for a loaded machine).
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(matches!(outcome, Err(Error::Timeout(_))), "{outcome:?}");
    server.resume();
    let mut recovered = None;
    for _ in 0..100 {
        match client.try_acquire(&bucket, "frozen").await {
            Err(Error::Timeout(_)) | Err(Error::Redis(_)) | Err(Error::Interrupted(_)) => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            other => {
                recovered = Some(other);
                break;
            }
        }
    }
    // The timed-out call may or may not have run: 1 or 2 permits are left.
    let admission = recovered.expect("recovered").unwrap();
    assert!(admission.remaining <= 1);
}

#[tokio::test]
async fn a_restarted_server_keeps_its_limits_when_persistent_and_scripts_reload() {
    let mut server = RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    let client = connect(&server).await;
    let limiters = limiters();
    for limiter in &limiters {
        client
            .try_acquire_n(&**limiter, "restart", 3)
            .await
            .unwrap();
    }
    server.kill();
    for limiter in &limiters {
        let outcome = client.try_acquire(&**limiter, "restart").await;
        assert!(
            matches!(
                outcome,
                Err(Error::Redis(_)) | Err(Error::Interrupted(_)) | Err(Error::Timeout(_))
            ),
            "a vanished server is an error, never an admission: {outcome:?}"
        );
    }
    server.restart();
    for limiter in &limiters {
        // The connection comes back in the background; the library is in the
        // AOF with the keys (and would be loaded again if it were not).
        let mut outcome = client.try_acquire(&**limiter, "restart").await;
        for _ in 0..100 {
            if !matches!(
                outcome,
                Err(Error::Redis(_)) | Err(Error::Interrupted(_)) | Err(Error::Timeout(_))
            ) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            outcome = client.try_acquire(&**limiter, "restart").await;
        }
        assert!(
            matches!(outcome, Err(Error::Denied(Denied::RetryAfter(_)))),
            "{}: the AOF kept the limit: {outcome:?}",
            limiter.redis_key("restart")
        );
    }
}

#[test]
fn the_blocking_client_decides_the_same_and_refuses_to_block_a_runtime() {
    let server = RedisServer::start();
    let client = blocking::Client::connect(&server.url()).unwrap();
    for limiter in limiters() {
        assert_eq!(
            client.try_acquire_n(&*limiter, "b", 3).unwrap().remaining,
            0
        );
        assert!(
            client
                .try_acquire(&*limiter, "b")
                .unwrap_err()
                .retry_after()
                .is_some()
        );
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let bucket = TokenBucket::new("bucket", 3, hourly(3)).unwrap();
    let inside = runtime.block_on(async { client.try_acquire(&bucket, "c") });
    assert!(matches!(inside, Err(Error::BlockingInAsync)));
    drop(runtime);
    drop(client);
}

#[tokio::test]
async fn a_sliding_log_keeps_its_entries_across_rule_changes() {
    let (server, client) = server_and_client().await;
    let history = Duration::from_secs(4 * 3600);
    let rule = |permits: u32, hours: u64| {
        SlidingLog::new("log", Rate::new(permits, Duration::from_secs(3600 * hours)))
            .unwrap()
            .with_history(history)
            .unwrap()
    };
    // What `partner` has left once `log` admits `n` more.
    let remaining_after = async |log: &SlidingLog, n| {
        let admission = client.try_acquire_n(log, "partner", n).await.unwrap();
        admission.remaining
    };
    remaining_after(&rule(5, 1), 5).await;
    // Raised limit: the 5 already logged still count.
    let raised = rule(8, 1);
    assert_eq!(remaining_after(&raised, 3).await, 0);
    assert!(client.try_acquire(&raised, "partner").await.is_err());
    // Lowered limit: 8 logged, 4 allowed: denied until 5 of them leave.
    assert!(client.try_acquire(&rule(4, 1), "partner").await.is_err());
    // A longer window within the history sees all 8 too.
    let longer = rule(10, 3);
    assert_eq!(remaining_after(&longer, 2).await, 0);
    let entries: i64 = server.cmd(&["ZCARD", &longer.redis_key("partner")]);
    assert_eq!(entries, 10 + 1, "ten permits and the format marker");
}

#[tokio::test]
async fn a_client_of_a_missing_server_fails_to_connect_within_its_timeout() {
    let port = support::server::free_port(false);
    let options = Options::new().connect_timeout(Duration::from_millis(200));
    let started = std::time::Instant::now();
    let outcome = Client::connect_with(&format!("redis://127.0.0.1:{port}/"), options).await;
    assert!(outcome.is_err());
    assert!(started.elapsed() < Duration::from_secs(5));
}
