//! Limiters' names against real Redis servers: limiters with different names
//! never share state, whatever keys their callers give (the same key, or one
//! that imitates another limiter's Redis key); a bad name is refused before
//! anything is sent; and on a Cluster one caller's keys still share a slot
//! under every name. Rates are per hour, so nothing refills while a test
//! runs.

use crate::support;

use tollgate::{ConfigError, Denied, Rate};
use tollgate_redis::{
    ApproxSlidingWindow, Ask, Error, FixedWindow, Limiter, MAX_NAME_LEN, Options, SlidingLog,
    TokenBucket,
};

use support::{RedisCluster, RedisServer, cluster_client, server_and_client};

/// A limiter of each kind named `name`, each allowing `permits` per hour.
fn of_each_kind(name: &str, permits: u32) -> Vec<Box<dyn Limiter>> {
    let hourly = Rate::per_hour(permits);
    vec![
        Box::new(TokenBucket::new(name, permits, hourly).unwrap()),
        Box::new(FixedWindow::new(name, hourly).unwrap()),
        Box::new(ApproxSlidingWindow::new(name, hourly).unwrap()),
        Box::new(SlidingLog::new(name, hourly).unwrap()),
    ]
}

/// Caller keys that equal another limiter's name or imitate pieces of its
/// Redis key, `tollgate:global:{global}:<kind>`.
const IMITATIONS: [&str; 10] = [
    "global",
    "global}:tb",
    "global}:fw",
    "x:{global",
    "}:tb",
    "{global}",
    "global:{global",
    ":global:{global}:tb",
    "tollgate:global:{global}:tb",
    "tollgate:{global}:tb",
];

/// Every decision script call the server has run.
fn script_calls(server: &RedisServer) -> u64 {
    server.script_calls()
}

/// Two limiters of one kind under the default prefix, asked about the same
/// caller key, each admit their own limit: a per-user limit for logins and
/// another for searches, keyed by the same user id, no longer share one
/// Redis key (nor one configuration).
#[tokio::test]
async fn limiters_with_different_names_keep_separate_state() {
    let (server, client) = server_and_client().await;
    let login = of_each_kind("login", 3);
    let search = of_each_kind("search", 5);
    for (login, search) in login.iter().zip(&search) {
        assert_ne!(login.redis_key("user:42"), search.redis_key("user:42"));
        assert_eq!((login.name(), search.name()), ("login", "search"));
        // Interleaved: each takes its own permits only.
        for taken in 1..=3 {
            let a = client.try_acquire(&**login, "user:42").await.unwrap();
            let b = client.try_acquire(&**search, "user:42").await.unwrap();
            assert_eq!((a.remaining, b.remaining), (3 - taken, 5 - taken));
        }
        assert!(matches!(
            client.try_acquire(&**login, "user:42").await,
            Err(Error::Denied(Denied::RetryAfter(_)))
        ));
        // The search limit still has its own 2 left, then refuses too.
        let rest = client.try_acquire_n(&**search, "user:42", 2).await.unwrap();
        assert_eq!(rest.remaining, 0);
        assert!(matches!(
            client.try_acquire(&**search, "user:42").await,
            Err(Error::Denied(Denied::RetryAfter(_)))
        ));
    }
    // One key per limiter, each under its own name.
    let mut keys: Vec<String> = server.cmd(&["KEYS", "*"]);
    keys.sort();
    assert_eq!(
        keys,
        [
            "tollgate:login:{user:42}:fw",
            "tollgate:login:{user:42}:sl",
            "tollgate:login:{user:42}:sw",
            "tollgate:login:{user:42}:tb",
            "tollgate:search:{user:42}:fw",
            "tollgate:search:{user:42}:sl",
            "tollgate:search:{user:42}:sw",
            "tollgate:search:{user:42}:tb",
        ]
    );
    // Both in one all-or-nothing call: two keys, not one asked twice.
    let other = client
        .try_acquire_all(&[
            Ask::new(&*login[0], "user:7"),
            Ask::new(&*search[0], "user:7"),
        ])
        .await
        .unwrap();
    let remaining: Vec<u32> = other.admissions().iter().map(|a| a.remaining).collect();
    assert_eq!(remaining, [2, 4]);
}

/// A per-key limiter asked with a caller key that equals a global limiter's
/// name, its caller key, or a string that imitates its Redis key never
/// touches the global limiter's state: a user named "global" cannot spend
/// the global limit.
#[tokio::test]
async fn a_caller_key_never_reaches_another_limiters_state() {
    let (server, client) = server_and_client().await;
    let global = of_each_kind("global", 3);
    let per_user = of_each_kind("per-user", 1_000);
    for (global, per_user) in global.iter().zip(&per_user) {
        // The global limit has taken one permit: its state exists.
        client.try_acquire(&**global, "global").await.unwrap();
        let key = global.redis_key("global");
        let before: Vec<u8> = server.cmd(&["DUMP", &key]);
        for imitation in IMITATIONS {
            assert_ne!(per_user.redis_key(imitation), key, "{imitation:?}");
            client
                .try_acquire_n(&**per_user, imitation, 10)
                .await
                .unwrap();
        }
        let after: Vec<u8> = server.cmd(&["DUMP", &key]);
        assert_eq!(after, before, "{key} changed");
        // The global limit still holds exactly its last 2.
        let rest = client.try_acquire_n(&**global, "global", 2).await.unwrap();
        assert_eq!(rest.remaining, 0);
        assert!(matches!(
            client.try_acquire(&**global, "global").await,
            Err(Error::Denied(Denied::RetryAfter(_)))
        ));
        // And a per-user key is as fresh as any other.
        let fresh = client.try_acquire(&**per_user, "global").await.unwrap();
        assert_eq!(fresh.remaining, 1_000 - 11);
    }
    // Every per-user key lives under its own name, before the tag.
    let keys: Vec<String> = server.cmd(&["KEYS", "tollgate:per-user:{*"]);
    assert_eq!(keys.len(), 4 * IMITATIONS.len());
    let keys: Vec<String> = server.cmd(&["KEYS", "tollgate:global:*"]);
    assert_eq!(keys.len(), 4, "{keys:?}");
}

/// A name that is empty, too long or holds a brace is refused by every
/// constructor with `InvalidName`, and nothing reaches the server; the
/// longest name (in bytes, not characters) is accepted.
#[tokio::test]
async fn a_bad_name_is_refused_and_nothing_is_sent() {
    let (server, client) = server_and_client().await;
    let rate = Rate::per_hour(3);
    let too_long = "n".repeat(MAX_NAME_LEN + 1);
    // 65 two-byte characters: 130 bytes.
    let too_long_utf8 = "é".repeat(65);
    for bad in [
        "",
        "{",
        "}",
        "a{b",
        "a}b",
        "{global}",
        too_long.as_str(),
        too_long_utf8.as_str(),
    ] {
        assert_eq!(
            TokenBucket::new(bad, 3, rate),
            Err(ConfigError::InvalidName),
            "{bad:?}"
        );
        assert_eq!(FixedWindow::new(bad, rate), Err(ConfigError::InvalidName));
        assert_eq!(
            ApproxSlidingWindow::new(bad, rate),
            Err(ConfigError::InvalidName)
        );
        assert_eq!(SlidingLog::new(bad, rate), Err(ConfigError::InvalidName));
    }
    // The name is checked first: a bad name with a bad rate names the name.
    assert_eq!(
        TokenBucket::new("", 0, Rate::per_hour(0)),
        Err(ConfigError::InvalidName)
    );
    // A bad prefix is still its own error.
    assert_eq!(
        TokenBucket::new("ok", 3, rate)
            .unwrap()
            .with_prefix("a{b")
            .map(|_| ()),
        Err(ConfigError::InvalidPrefix)
    );
    assert_eq!(script_calls(&server), 0);
    let keys: Vec<String> = server.cmd(&["KEYS", "*"]);
    assert!(keys.is_empty(), "{keys:?}");

    // The longest names work end to end.
    let longest = "n".repeat(MAX_NAME_LEN);
    let longest_utf8 = "é".repeat(MAX_NAME_LEN / 2);
    for name in [longest.as_str(), longest_utf8.as_str(), "a:b", "a b"] {
        for limiter in of_each_kind(name, 3) {
            assert_eq!(limiter.name(), name);
            let key = limiter.redis_key("k");
            assert!(key.starts_with(&format!("tollgate:{name}:{{k}}:")), "{key}");
            assert!(client.try_acquire(&*limiter, "k").await.is_ok());
            let exists: i64 = server.cmd(&["EXISTS", &key]);
            assert_eq!(exists, 1, "{key}");
        }
    }
}

/// On a Cluster the caller's key is still the hash tag: its keys under any
/// name and kind lie in its own slot, so one all-or-nothing call can decide
/// limits of several names for one caller.
#[tokio::test]
async fn one_callers_keys_share_a_slot_under_every_name() {
    let cluster = RedisCluster::start();
    let client = cluster_client(&cluster, Options::default()).await;
    let longest = "n".repeat(MAX_NAME_LEN);
    let names = ["login", "search", "global", "a:b", longest.as_str()];
    let limiters: Vec<Box<dyn Limiter>> = names
        .iter()
        .flat_map(|name| of_each_kind(name, 3))
        .collect();
    let slot = |key: &str| -> i64 { cluster.nodes[0].cmd(&["CLUSTER", "KEYSLOT", key]) };
    let callers: Vec<String> = (0..12).map(|i| format!("user:{i}")).collect();
    let mut slots = std::collections::BTreeSet::new();
    for caller in &callers {
        let tag = slot(caller);
        slots.insert(tag);
        for limiter in &limiters {
            assert_eq!(slot(&limiter.redis_key(caller)), tag, "{}", limiter.name());
        }
        // One call for every limit of every name: no CROSSSLOT.
        let asks: Vec<Ask<'_>> = limiters.iter().map(|l| Ask::new(&**l, caller)).collect();
        let admitted = client.try_acquire_all(&asks).await.unwrap();
        assert!(admitted.admissions().iter().all(|a| a.remaining == 2));
        // Each name kept its own state, on the node that owns the slot.
        let owner = cluster.owner(&limiters[0].redis_key(caller));
        for limiter in &limiters {
            let exists: i64 = owner.cmd(&["EXISTS", &limiter.redis_key(caller)]);
            assert_eq!(exists, 1);
        }
    }
    assert!(slots.len() > 1, "the callers should spread over slots");
}
