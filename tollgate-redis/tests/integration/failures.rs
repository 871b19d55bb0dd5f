//! Failures against real `redis-server` processes: what each error says about
//! whether the script ran, and damaged state in tagged keys of every kind.
//!
//! Rates are per hour, so nothing refills while a test runs; every timing
//! assertion is one the server guarantees (a paused server cannot reply), never
//! one the scheduler happened to allow.

use crate::support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use tollgate::Rate;
use tollgate_redis::{
    ApproxSlidingWindow, Client, Error, FixedWindow, Limiter, Options, SlidingLog, TokenBucket,
};

use support::RedisServer;

fn hourly(permits: u32) -> Rate {
    Rate::per_hour(permits)
}

/// One limiter of each kind, each allowing `permits` per hour.
fn limiters(permits: u32) -> Vec<Arc<dyn Limiter>> {
    vec![
        Arc::new(TokenBucket::new("bucket", permits, hourly(permits)).unwrap()),
        Arc::new(FixedWindow::new("window", hourly(permits)).unwrap()),
        Arc::new(ApproxSlidingWindow::new("approx", hourly(permits)).unwrap()),
        Arc::new(SlidingLog::new("log", hourly(permits)).unwrap()),
    ]
}

async fn connect(server: &RedisServer, timeout: Duration) -> Client {
    Client::connect_with(&server.url(), Options::new().timeout(timeout))
        .await
        .unwrap()
}

/// A server, and a client that gives it 2 s a decision.
async fn started() -> (RedisServer, Client) {
    let server = RedisServer::start();
    let client = connect(&server, Duration::from_secs(2)).await;
    (server, client)
}

/// The server's clock, in µs since the Unix epoch.
fn server_now_us(server: &RedisServer) -> u64 {
    let time: Vec<String> = server.cmd(&["TIME"]);
    time[0].parse::<u64>().unwrap() * 1_000_000 + time[1].parse::<u64>().unwrap()
}

// ---------------------------------------------------------------------------
// Errors that say whether the script ran
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_call_that_expires_under_client_pause_is_a_timeout_that_may_have_run() {
    let server = RedisServer::start();
    let timeout = Duration::from_millis(50);
    let client = connect(&server, timeout).await;
    let limiters = limiters(100_000);
    let big = Arc::new(SlidingLog::new("log", hourly(200_000)).unwrap());
    // Load every script first: the pause is about decisions, not loading.
    for limiter in &limiters {
        client.try_acquire(&**limiter, "warm").await.unwrap();
    }
    client.try_acquire(&*big, "warm").await.unwrap();

    let pause = Duration::from_secs(3);
    // The pause starts when the server runs the command, after `before`, so
    // it lasts at least until `before + pause`: a call that completes before
    // then cannot have had a reply.
    let before = Instant::now();
    let _: () = server.cmd(&["CLIENT", "PAUSE", &pause.as_millis().to_string(), "ALL"]);

    let big_outcome = {
        let client = client.clone();
        let big = Arc::clone(&big);
        tokio::spawn(async move {
            let outcome = client.try_acquire_n(&*big, "big", 200_000).await;
            (before.elapsed(), outcome)
        })
    };
    let mut tasks = Vec::new();
    for (i, limiter) in limiters.iter().enumerate() {
        for task in 0..4 {
            let client = client.clone();
            let limiter = Arc::clone(limiter);
            tasks.push(tokio::spawn(async move {
                let mut results = Vec::new();
                let mut call = 0;
                while before.elapsed() < pause - Duration::from_millis(300) {
                    let key = format!("paused-{i}-{task}-{call}");
                    let outcome = client.try_acquire(&*limiter, &key).await;
                    results.push((before.elapsed(), outcome));
                    call += 1;
                }
                results
            }));
        }
    }
    let mut results = support::joined(tasks).await;
    results.push(big_outcome.await.unwrap());

    let mut during_pause = 0;
    let mut timeouts = 0;
    for (completed, outcome) in &results {
        if *completed < pause {
            during_pause += 1;
            assert!(
                matches!(outcome, Err(Error::Timeout(t)) if *t == timeout),
                "completed {completed:?} into a {pause:?} pause: {outcome:?}"
            );
        }
        if let Err(err) = outcome {
            assert!(
                matches!(err, Error::Timeout(_)),
                "every expired call is a Timeout: {err:?}"
            );
            assert!(err.may_have_run(), "{err:?}");
            timeouts += 1;
        }
    }
    eprintln!(
        "client pause: {} calls, {during_pause} completed during the pause, \
         {timeouts} timed out, all Error::Timeout",
        results.len()
    );
    assert!(
        during_pause > 0,
        "no call completed during a {pause:?} pause"
    );

    // The timed-out 200,000-permit request was queued on the connection: once
    // the pause ends the server runs it whole, or (if it never left the
    // client) not at all, never in part. Either way the caller was told that
    // it may have run.
    let (_, big_result) = results.last().unwrap();
    assert!(big_result.as_ref().unwrap_err().may_have_run());
    let key = big.redis_key("big");
    let deadline = Instant::now() + Duration::from_secs(20);
    let entries = loop {
        let entries: i64 = server.cmd(&["ZCARD", &key]);
        if entries > 0 || Instant::now() > deadline {
            break entries;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        entries == 0 || entries == 200_001,
        "{entries} entries: a script runs whole or not at all"
    );
    eprintln!(
        "the timed-out 200,000-permit sliding-log request {}",
        if entries > 0 {
            "ran after the pause and admitted all 200,000"
        } else {
            "never reached the server"
        }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_killed_mid_call_reports_that_the_script_may_have_run() {
    let mut server = RedisServer::start();
    // A long deadline: the failure must come from the connection, not the
    // timer.
    let client = connect(&server, Duration::from_secs(20)).await;
    let bucket = Arc::new(TokenBucket::new("bucket", 3, hourly(3)).unwrap());
    client.try_acquire(&*bucket, "killed").await.unwrap();
    // Scripts count as writes: the call reaches the server and is held there,
    // while the admin connection can still look.
    let _: () = server.cmd(&["CLIENT", "PAUSE", "20000", "WRITE"]);
    let call = {
        let client = client.clone();
        let bucket = Arc::clone(&bucket);
        tokio::spawn(async move { client.try_acquire(&*bucket, "killed").await })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let clients: String = server.cmd(&["CLIENT", "LIST"]);
        if clients
            .lines()
            .any(|line| line.contains("cmd=fcall") && line.contains("flags=b"))
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the call never reached the server"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let started = Instant::now();
    server.kill();
    let outcome = call.await.unwrap();
    let err = outcome.unwrap_err();
    assert!(
        matches!(err, Error::Interrupted(_)),
        "a connection lost mid-call: {err:?}"
    );
    assert!(err.may_have_run(), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(10));
    eprintln!("killed mid-call: {err}");
}

#[tokio::test]
async fn a_refused_connection_reports_that_the_script_did_not_run() {
    // No server at all: connecting is refused (after the connection
    // manager's own retries, within this generous connect timeout).
    let port = support::server::free_port(false);
    let options = Options::new().connect_timeout(Duration::from_secs(10));
    match Client::connect_with(&format!("redis://127.0.0.1:{port}/"), options).await {
        Err(err @ Error::Redis(_)) => assert!(!err.may_have_run(), "{err:?}"),
        other => panic!("expected a refused connection, got {other:?}"),
    }

    // A server that went away: once the connection is known lost, decisions
    // meet a refused reconnection, and say the script did not run.
    let mut server = RedisServer::start();
    let client = connect(&server, Duration::from_secs(2)).await;
    let bucket = TokenBucket::new("bucket", 3, hourly(3)).unwrap();
    client.try_acquire(&bucket, "gone").await.unwrap();
    server.kill();
    let deadline = Instant::now() + Duration::from_secs(15);
    let refused = loop {
        let outcome = client.try_acquire(&bucket, "gone").await;
        match &outcome {
            Err(Error::Redis(err)) if err.is_connection_refusal() => break outcome.unwrap_err(),
            // The call that met the dead connection, or a reconnection still
            // under way: the request may have been sent.
            Err(err @ (Error::Interrupted(_) | Error::Timeout(_))) => {
                assert!(err.may_have_run())
            }
            other => panic!("a vanished server: {other:?}"),
        }
        assert!(Instant::now() < deadline, "never saw a refused connection");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(!refused.may_have_run(), "{refused:?}");
}

// ---------------------------------------------------------------------------
// Damaged tagged state
// ---------------------------------------------------------------------------

/// A key's content, whatever its type.
fn dump(server: &RedisServer, key: &str) -> Vec<String> {
    let kind: String = server.cmd(&["TYPE", key]);
    match kind.as_str() {
        "hash" => {
            let mut fields: Vec<String> = server.cmd(&["HGETALL", key]);
            fields.sort();
            fields
        }
        "zset" => server.cmd(&["ZRANGE", key, "0", "-1", "WITHSCORES"]),
        "string" => vec![server.cmd(&["GET", key])],
        other => vec![other.to_owned()],
    }
}

/// Asks `limiter` for one permit `2 × limit` times: every answer must be
/// `UnknownState` naming the key and containing `names`, nothing admitted,
/// and the key untouched.
async fn assert_damaged(
    server: &RedisServer,
    client: &Client,
    limiter: &dyn Limiter,
    key: &str,
    names: &str,
    limit: u32,
) {
    let redis_key = limiter.redis_key(key);
    let before = dump(server, &redis_key);
    let mut admitted = 0;
    for _ in 0..2 * limit {
        match client.try_acquire(limiter, key).await {
            Ok(_) => admitted += 1,
            Err(Error::UnknownState { key: k, detail }) => {
                assert_eq!(k, redis_key);
                assert!(
                    detail.contains(names),
                    "{redis_key} {before:?}: {detail:?} does not name {names:?}"
                );
            }
            Err(other) => panic!("{redis_key} {before:?}: expected UnknownState, got {other:?}"),
        }
    }
    assert_eq!(admitted, 0, "{redis_key} {before:?} admitted {admitted}");
    assert_eq!(dump(server, &redis_key), before, "{redis_key} was modified");
}

/// How a counter's state is stored: one string `<tag>:<field>:…` (what the
/// scripts write), or the hash `{v: <tag>, <field>: …}` of earlier versions,
/// which they still read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    String,
    Hash,
}

const FORMATS: [Format; 2] = [Format::String, Format::Hash];

/// Writes a counter's tagged state, `fields` after the tag `("v", tag)`, in
/// `format`, expiring in an hour (as the scripts' keys do, so that only the
/// fields are wrong). The string format's tag is the hash's with its version
/// one higher (`tb1` → `tb2`); a field left out is left out of the string.
fn write_state(format: Format, server: &RedisServer, key: &str, fields: &[(&str, String)]) {
    let _: () = server.cmd(&["DEL", key]);
    match format {
        Format::Hash => {
            let mut args: Vec<&str> = vec!["HSET", key];
            for (name, value) in fields {
                args.push(name);
                args.push(value);
            }
            let _: () = server.cmd(&args);
        }
        Format::String => {
            let mut parts = Vec::new();
            for (name, value) in fields {
                if *name == "v" {
                    parts.push(match value.as_str() {
                        "tb1" => "tb2".to_owned(),
                        "fw1" => "fw2".to_owned(),
                        "sw1" => "sw2".to_owned(),
                        other => other.to_owned(),
                    });
                } else {
                    parts.push(value.clone());
                }
            }
            let _: () = server.cmd(&["SET", key, &parts.join(":")]);
        }
    }
    let _: () = server.cmd(&["PEXPIRE", key, "3600000"]);
}

/// What a state in `format` without `field` is refused with: a string's
/// fields are positional, so one left out is the last one missing.
fn missing_named(format: Format, field: &str) -> String {
    match format {
        Format::String => "is missing".to_owned(),
        Format::Hash => format!("field {field} is missing"),
    }
}

/// The values no field of a limiter's hash may hold.
fn bad_values() -> Vec<&'static str> {
    vec![
        "-100",
        "-1",
        "0.5",
        "1.0",
        "nan",
        "-nan",
        "inf",
        "-inf",
        "1e3",
        "0x10",
        "+5",
        " 5",
        "",
        "soon",
        "99999999999999999999",
        "1152921504606846976",
    ]
}

#[tokio::test]
async fn a_damaged_token_bucket_is_unknown_state_naming_tat_and_admits_nothing() {
    let (server, client) = started().await;
    let bucket = TokenBucket::new("bucket", 3, hourly(3)).unwrap();
    let key = bucket.redis_key("tb");
    let now = server_now_us(&server);
    for format in FORMATS {
        let write = |fields: &[(&str, String)]| write_state(format, &server, &key, fields);
        for bad in bad_values() {
            write(&[("v", "tb1".into()), ("tat", bad.into())]);
            assert_damaged(&server, &client, &bucket, "tb", "field tat", 3).await;
        }
        // A time far beyond anything the bucket writes (its TAT is at most one
        // capacity ahead, and the key expires then): it would refuse for years.
        let years = now + 10 * 365 * 86_400_000_000;
        write(&[("v", "tb1".into()), ("tat", years.to_string())]);
        assert_damaged(&server, &client, &bucket, "tb", "field tat", 3).await;
        // A required field missing.
        write(&[("v", "tb1".into())]);
        assert_damaged(&server, &client, &bucket, "tb", "field tat is missing", 3).await;
        // A key without the expiry every written key has. The string format
        // reads the expiry only for a TAT beyond what this bucket writes (one
        // capacity ahead of now, 3 hours), where it must bound the TAT.
        let ahead = match format {
            Format::Hash => now,
            Format::String => now + 4 * 3_600_000_000,
        };
        write(&[("v", "tb1".into()), ("tat", ahead.to_string())]);
        let _: () = server.cmd(&["PERSIST", &key]);
        assert_damaged(&server, &client, &bucket, "tb", "no expiry", 3).await;
    }
    // Another program's tag, and extra fields, in the string format.
    for value in ["xx9:5", "tb1:5", "TB2:5", "tb2", "tb2:5:6", "5"] {
        let _: () = server.cmd(&["SET", &key, value, "PX", "3600000"]);
        let names = if value.starts_with("tb2:5:") {
            "fields"
        } else if value == "tb2" {
            "field tat is missing"
        } else {
            "expected format tb2"
        };
        assert_damaged(&server, &client, &bucket, "tb", names, 3).await;
    }
}

/// The string format reads a key's expiry only when its state lies beyond
/// what the limiter writes: a TAT within one capacity of now is taken as it
/// is, without an expiry, and the admission writes the expiry back.
#[tokio::test]
async fn a_token_bucket_state_within_its_capacity_is_trusted_and_gets_its_expiry_back() {
    let (server, client) = started().await;
    let bucket = TokenBucket::new("bucket", 3, hourly(3)).unwrap();
    let key = bucket.redis_key("persisted");
    // Two permits spent, one left: the TAT two intervals (40 minutes) ahead.
    let tat = server_now_us(&server) + 2 * 1_200_000_000;
    let _: () = server.cmd(&["SET", &key, &format!("tb2:{tat}")]);
    let admitted = client.try_acquire(&bucket, "persisted").await.unwrap();
    assert_eq!(admitted.remaining, 0);
    assert!(client.try_acquire(&bucket, "persisted").await.is_err());
    let pttl: i64 = server.cmd(&["PTTL", &key]);
    assert!(pttl > 3_500_000 && pttl <= 3_600_000, "{pttl}");
}

#[tokio::test]
async fn a_damaged_fixed_window_is_unknown_state_naming_the_field_and_admits_nothing() {
    let window = FixedWindow::new("window", hourly(3)).unwrap();
    assert_damaged_counters(&window, "fw", "fw1", &["w", "c"], "c").await;
}

#[tokio::test]
async fn a_damaged_sliding_window_is_unknown_state_naming_the_field_and_admits_nothing() {
    let window = ApproxSlidingWindow::new("approx", hourly(3)).unwrap();
    assert_damaged_counters(&window, "sw", "sw1", &["k", "c", "p"], "p").await;
}

/// The damaged states of a window counter of 3 an hour, asked about `key`:
/// its state, tagged `tag`, is a window index (the first of `fields`) and
/// counts (the others). In each format: every field holding each bad value,
/// the count `overflow` above any u32 limit, a window that ends long after
/// the key expires, and every field missing.
async fn assert_damaged_counters(
    window: &dyn Limiter,
    key: &str,
    tag: &str,
    fields: &[&str],
    overflow: &str,
) {
    let (server, client) = started().await;
    let redis_key = window.redis_key(key);
    let hour_us = 3_600_000_000u64;
    let current = (server_now_us(&server) / hour_us).to_string();
    // The current window with no counts, but `value` in `field`.
    let state = |field: &str, value: &str| -> Vec<(&str, String)> {
        let mut state = vec![("v", tag.to_owned())];
        for (i, &name) in fields.iter().enumerate() {
            let good = if i == 0 { current.as_str() } else { "0" };
            state.push((name, if name == field { value } else { good }.to_owned()));
        }
        state
    };
    let index = fields[0];
    let named = |field: &str| format!("field {field}");
    for format in FORMATS {
        let write = |state: &[(&str, String)]| write_state(format, &server, &redis_key, state);
        // A count of -100 in the current window once admitted 5 of 5 at 3.
        for bad in bad_values() {
            for &field in fields {
                write(&state(field, bad));
                assert_damaged(&server, &client, window, key, &named(field), 3).await;
            }
        }
        // Above any u32 limit.
        write(&state(overflow, "4294967296"));
        assert_damaged(&server, &client, window, key, &named(overflow), 3).await;
        // A window that ends long after the key expires would never close.
        let future = (server_now_us(&server) / hour_us + 1000).to_string();
        write(&state(index, &future));
        assert_damaged(&server, &client, window, key, &named(index), 3).await;
        for &missing in fields {
            let mut fields = state(index, &current);
            fields.retain(|(name, _)| *name != missing);
            write(&fields);
            let names = missing_named(format, missing);
            assert_damaged(&server, &client, window, key, &names, 3).await;
        }
    }
}

#[tokio::test]
async fn a_damaged_sliding_log_is_unknown_state_naming_the_member_and_admits_nothing() {
    let (server, client) = started().await;
    let log = SlidingLog::new("log", hourly(3)).unwrap();
    let key = log.redis_key("sl");
    let marker = "~tollgate-sl1";
    let now = server_now_us(&server);
    let recent = (now - 1_000_000).to_string();
    let write = |members: &[(&str, &str)]| {
        let _: () = server.cmd(&["DEL", &key]);
        for (score, member) in members {
            let _: () = server.cmd(&["ZADD", &key, score, member]);
        }
        let _: () = server.cmd(&["PEXPIRE", &key, "3600000"]);
    };
    let ticket = "0000000000000001";
    let far = (now + 10 * 365 * 86_400_000_000).to_string();
    let cases: Vec<(Vec<(&str, &str)>, &str)> = vec![
        // The newest entry's stamp: infinite, negative, fractional, huge, or
        // long after the key expires.
        (vec![("-inf", marker), ("+inf", ticket)], "score of member"),
        (vec![("-inf", marker), ("-100", ticket)], "score of member"),
        (
            vec![("-inf", marker), ("1000.5", ticket)],
            "score of member",
        ),
        (vec![("-inf", marker), ("1e300", ticket)], "score of member"),
        (vec![("-inf", marker), (&far, ticket)], "score of member"),
        // The newest entry is not a ticket number.
        (
            vec![("-inf", marker), (&recent, "abc")],
            "not a 16-digit ticket",
        ),
        (
            vec![("-inf", marker), (&recent, "1")],
            "not a 16-digit ticket",
        ),
        (
            vec![("-inf", marker), (&recent, "-000000000000001")],
            "not a 16-digit ticket",
        ),
        // An older entry holding the next ticket: adding would move it.
        (
            vec![
                ("-inf", marker),
                ("1000", "0000000000000002"),
                (&recent, ticket),
            ],
            "tickets must grow with stamps",
        ),
        // The marker: missing, misplaced, or outranked.
        (vec![(&recent, ticket)], "without the ~tollgate-sl1 marker"),
        (vec![("0", marker), (&recent, ticket)], "marker has score"),
        (
            vec![("-inf", marker), ("-inf", "0000000000000000")],
            "ranks before the ~tollgate-sl1 marker",
        ),
    ];
    for (members, names) in cases {
        write(&members);
        assert_damaged(&server, &client, &log, "sl", names, 3).await;
    }
    // A denial reads the stamp of the entry that leaves the window first:
    // here a fractional one, while the newest entry is sound.
    let fractional = format!("{}.5", now - 3_000_000);
    write(&[
        ("-inf", marker),
        (&fractional, "0000000000000001"),
        (&(now - 2_000_000).to_string(), "0000000000000002"),
        (&recent, "0000000000000003"),
    ]);
    assert_damaged(&server, &client, &log, "sl", "score of member", 3).await;
    // A key without an expiry.
    write(&[("-inf", marker), (&recent, ticket)]);
    let _: () = server.cmd(&["PERSIST", &key]);
    assert_damaged(&server, &client, &log, "sl", "no expiry", 3).await;
}

#[tokio::test]
async fn a_key_of_another_type_is_wrong_type_for_every_kind() {
    let (server, client) = started().await;
    for limiter in limiters(3) {
        let key = limiter.redis_key("typed");
        for kind in ["string", "list", "set", "other"] {
            let _: () = server.cmd(&["DEL", &key]);
            match kind {
                // A string is a counter's own type: one not in its format is
                // unknown state (the damaged-state tests above).
                "string" if !key.ends_with(":sl") => continue,
                "string" => server.cmd::<()>(&["SET", &key, "7"]),
                "list" => server.cmd::<()>(&["RPUSH", &key, "7"]),
                "set" => server.cmd::<()>(&["SADD", &key, "7"]),
                // The other kind's type: a hash for the log, a sorted set for
                // the counters.
                _ if key.ends_with(":sl") => server.cmd::<()>(&["HSET", &key, "v", "tb1"]),
                _ => server.cmd::<()>(&["ZADD", &key, "1", "0000000000000001"]),
            }
            let mut admitted = 0;
            for _ in 0..6 {
                match client.try_acquire(&*limiter, "typed").await {
                    Ok(_) => admitted += 1,
                    Err(Error::WrongType { key: k, .. }) => assert_eq!(k, key),
                    Err(other) => panic!("{key} as a {kind}: {other:?}"),
                }
            }
            assert_eq!(admitted, 0);
        }
    }
}

#[tokio::test]
async fn validation_leaves_keys_the_scripts_wrote_alone() {
    // Every kind, from a fresh key to its limit and a denial, twice over with
    // a fresh client: the checks never refuse what the scripts wrote.
    let server = RedisServer::start();
    for _ in 0..2 {
        let client = connect(&server, Duration::from_secs(2)).await;
        for limiter in limiters(5) {
            for n in [2, 1, 2] {
                let outcome = client.try_acquire_n(&*limiter, "valid", n).await;
                assert!(
                    outcome.is_ok() || outcome.as_ref().unwrap_err().retry_after().is_some(),
                    "{}: {outcome:?}",
                    limiter.redis_key("valid")
                );
            }
        }
    }
}

/// The leased limiter's scripts read the token bucket's state through the
/// same checks: run them on damaged and foreign keys (at the server's time,
/// through the scripts' test entry points). Every answer names the key and
/// the field, and the key is left untouched.
#[tokio::test]
async fn the_lease_scripts_refuse_damaged_token_bucket_state() {
    let (server, client) = started().await;
    let bucket = TokenBucket::new("bucket", 10, hourly(3_600)).unwrap();
    let key = bucket.redis_key("global");
    let refuse = |names: &'static str| {
        let (server, client, bucket, key) = (&server, &client, &bucket, key.clone());
        async move {
            let before = dump(server, &key);
            let now = server_now_us(server);
            let granted = client.lease_at(bucket, "global", 10, (5, 2), now).await;
            let returned = client.return_lease_at(bucket, "global", 1, 0, now).await;
            for answer in [granted.map(drop), returned.map(drop)] {
                match answer {
                    Err(Error::UnknownState { key: k, detail })
                    | Err(Error::WrongType { key: k, detail }) => {
                        assert_eq!(k, key);
                        assert!(detail.contains(names), "{before:?}: {detail}");
                    }
                    other => panic!("{before:?}: expected a refusal, got {other:?}"),
                }
            }
            assert_eq!(dump(server, &key), before);
        }
    };
    for format in FORMATS {
        let write = |fields: &[(&str, String)]| write_state(format, &server, &key, fields);
        for bad in bad_values() {
            write(&[("v", "tb1".into()), ("tat", bad.into())]);
            refuse("field tat").await;
        }
        // A TAT after the key's own expiry, a missing TAT, no expiry at all
        // (the string format reads the expiry for a TAT beyond what the
        // bucket writes: one capacity, 10 s, ahead of now).
        let years = server_now_us(&server) + 10 * 365 * 86_400_000_000;
        write(&[("v", "tb1".into()), ("tat", years.to_string())]);
        refuse("after the key expires").await;
        write(&[("v", "tb1".into())]);
        refuse("field tat is missing").await;
        let ahead = server_now_us(&server) + 60_000_000;
        write(&[("v", "tb1".into()), ("tat", ahead.to_string())]);
        let _: () = server.cmd(&["PERSIST", &key]);
        refuse("no expiry").await;
        // Another program's tag.
        write(&[("v", "xx9".into()), ("tat", ahead.to_string())]);
        refuse(match format {
            Format::String => "expected format tb2",
            Format::Hash => "expected format tb1",
        })
        .await;
    }
    // Another Redis type.
    let _: () = server.cmd(&["DEL", &key]);
    let _: () = server.cmd(&["RPUSH", &key, "plain"]);
    refuse("WRONGTYPE").await;
}

/// A state's fields, after its tag.
type Fields<'a> = Vec<(&'a str, String)>;

/// A counter's state in the hash of earlier versions is read as it stands
/// (the same permits left) and written back in the string format at its
/// next admission, with its expiry.
#[tokio::test]
async fn a_state_in_the_earlier_hash_format_is_read_and_written_anew() {
    let (server, client) = started().await;
    let now = server_now_us(&server);
    let hour_us = 3_600_000_000u64;
    let current = (now / hour_us).to_string();
    let bucket = TokenBucket::new("bucket", 3, hourly(3)).unwrap();
    let window = FixedWindow::new("window", hourly(3)).unwrap();
    let approx = ApproxSlidingWindow::new("approx", hourly(3)).unwrap();
    // Each with 2 of its 3 permits spent, as the earlier scripts wrote them.
    let tat = (now + 2 * 1_200_000_000).to_string();
    let states: [(&dyn Limiter, Fields, &str); 3] = [
        (&bucket, vec![("v", "tb1".into()), ("tat", tat)], "tb2:"),
        (
            &window,
            vec![
                ("v", "fw1".into()),
                ("w", current.clone()),
                ("c", "2".into()),
            ],
            "fw2:",
        ),
        (
            &approx,
            vec![
                ("v", "sw1".into()),
                ("k", current.clone()),
                ("c", "2".into()),
                ("p", "0".into()),
            ],
            "sw2:",
        ),
    ];
    for (limiter, fields, tag) in states {
        let key = limiter.redis_key("old");
        write_state(Format::Hash, &server, &key, &fields);
        let admitted = client.try_acquire(limiter, "old").await.unwrap();
        assert_eq!(admitted.remaining, 0, "{key}");
        let kind: String = server.cmd(&["TYPE", &key]);
        assert_eq!(kind, "string", "{key}");
        let state: String = server.cmd(&["GET", &key]);
        assert!(state.starts_with(tag), "{key}: {state}");
        let pttl: i64 = server.cmd(&["PTTL", &key]);
        assert!(pttl > 0, "{key}: {pttl}");
        assert!(
            client
                .try_acquire(limiter, "old")
                .await
                .unwrap_err()
                .is_denied(),
            "{key}"
        );
    }
}
