//! `tollgate_server::config`: envoyproxy/ratelimit's files load and match as
//! envoyproxy/ratelimit documents and implements them, tollgate's extensions
//! load and are checked, every refusal names its file and line, and matching
//! agrees with a plain reading of envoyproxy's `GetLimit`.
//!
//! The fixtures under `tests/configs/readme` are the examples of
//! envoyproxy/ratelimit's README, and those under `tests/configs/envoy` the
//! configuration files of its `test/config` directory (both Apache-2.0),
//! copied unchanged.

use std::collections::{HashMap, HashSet};
use std::error::Error;
use std::fs;
use std::hash::{BuildHasher, RandomState};
use std::path::{Path, PathBuf};
use std::time::Duration;

use proptest::prelude::*;
use tollgate::Rate;
use tollgate_server::config::{
    Algorithm, Config, ConfigFileError, Domain, Match, MetadataValue, Rule, Unit, apply_replaces,
    override_key, override_stat_name,
};

/// A request descriptor's entries.
type Entries<'a> = &'a [(&'a str, &'a str)];

fn configs() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/configs")
}

fn read(relative: &str) -> (PathBuf, String) {
    let path = configs().join(relative);
    let text = fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    (path, text)
}

/// Loads fixtures, in order, into one configuration.
fn load(files: &[&str]) -> Config {
    Config::from_files(files.iter().map(|f| read(f))).unwrap_or_else(|e| panic!("{e}"))
}

fn load_one(file: &str) -> Config {
    load(&[file])
}

/// Loads fixtures that must be refused; the error names the last file.
fn refuse(files: &[&str]) -> ConfigFileError {
    let err = Config::from_files(files.iter().map(|f| read(f)))
        .expect_err("the configuration should be refused");
    let last = configs().join(files.last().unwrap());
    assert_eq!(err.file, last, "{err}");
    err
}

/// Asserts the error's position and that its reason contains `reason`.
fn assert_refused(err: &ConfigFileError, line: usize, column: usize, reason: &str) {
    assert_eq!(
        (err.line, err.column),
        (Some(line), Some(column)),
        "position of: {err}"
    );
    assert!(err.reason.contains(reason), "{err}\nshould say: {reason}");
    let shown = err.to_string();
    let prefix = format!("{}:{line}:{column}: ", err.file.display());
    assert!(shown.starts_with(&prefix), "{shown}");
}

fn domain<'c>(config: &'c Config, name: &str) -> &'c Domain {
    config
        .domain(name)
        .unwrap_or_else(|| panic!("no domain {name}"))
}

/// The one rule a descriptor matches.
fn rule<'d>(domain: &'d Domain, entries: &[(&str, &str)]) -> &'d Rule {
    let matched = domain
        .matching(entries)
        .unwrap_or_else(|| panic!("{entries:?} should match"));
    assert_eq!(matched.rules.len(), 1);
    &matched.rules[0]
}

/// `(requests_per_unit, unit)` of the one rule a descriptor matches, if any.
fn limit(domain: &Domain, entries: &[(&str, &str)]) -> Option<(u32, Unit)> {
    let matched = domain.matching(entries)?;
    assert_eq!(matched.rules.len(), 1);
    let rule = &matched.rules[0];
    Some((rule.requests_per_unit, rule.unit.expect("a limited rule")))
}

fn matched<'d>(domain: &'d Domain, entries: &[(&str, &str)]) -> Match<'d> {
    domain
        .matching(entries)
        .unwrap_or_else(|| panic!("{entries:?} should match"))
}

fn stat(domain: &Domain, entries: &[(&str, &str)]) -> String {
    matched(domain, entries).stat_name
}

fn key(domain: &Domain, entries: &[(&str, &str)]) -> String {
    matched(domain, entries).key
}

// ---------------------------------------------------------------------------
// envoyproxy/ratelimit's README, example by example.

#[test]
fn readme_example_1_two_values_of_one_key() {
    let config = load_one("readme/example1.yaml");
    let mongo = domain(&config, "mongo_cps");
    assert_eq!(
        limit(mongo, &[("database", "users")]),
        Some((500, Unit::Second))
    );
    assert_eq!(
        limit(mongo, &[("database", "default")]),
        Some((500, Unit::Second))
    );
    assert_eq!(limit(mongo, &[("database", "orders")]), None);
    assert_eq!(limit(mongo, &[("table", "users")]), None);
    // Two rules, two limits.
    assert_ne!(
        key(mongo, &[("database", "users")]),
        key(mongo, &[("database", "default")])
    );
    assert_eq!(
        stat(mongo, &[("database", "users")]),
        "mongo_cps.database_users"
    );
}

#[test]
fn readme_example_2_nested_descriptors_and_several_per_request() {
    let config = load_one("readme/example2.yaml");
    let messaging = domain(&config, "messaging");
    let marketing_1 = [("message_type", "marketing"), ("to_number", "2061111111")];
    let marketing_2 = [("message_type", "marketing"), ("to_number", "2062222222")];
    assert_eq!(limit(messaging, &marketing_1), Some((5, Unit::Day)));
    assert_eq!(limit(messaging, &marketing_2), Some((5, Unit::Day)));
    // Each number gets its own 5 a day.
    assert_ne!(key(messaging, &marketing_1), key(messaging, &marketing_2));
    assert_eq!(
        stat(messaging, &marketing_1),
        "messaging.message_type_marketing.to_number"
    );
    // The placeholder has no limit of its own; other message types have none.
    assert_eq!(limit(messaging, &[("message_type", "marketing")]), None);
    assert_eq!(
        limit(
            messaging,
            &[("message_type", "alert"), ("to_number", "2061111111")]
        ),
        None
    );
    // 100 a day to any number, each its own.
    assert_eq!(
        limit(messaging, &[("to_number", "2061111111")]),
        Some((100, Unit::Day))
    );
    assert_ne!(
        key(messaging, &[("to_number", "2061111111")]),
        key(messaging, &[("to_number", "2062222222")])
    );
    // One request with both descriptors is limited by both rules.
    let request = [&marketing_1[..], &[("to_number", "2061111111")]];
    let mut matches: Vec<_> = request.iter().map(|d| messaging.matching(d)).collect();
    apply_replaces(&mut matches);
    let limits: Vec<u32> = matches
        .iter()
        .flatten()
        .flat_map(|m| m.in_force())
        .map(|r| r.requests_per_unit)
        .collect();
    assert_eq!(limits, [5, 100]);
}

#[test]
fn readme_example_3_most_specific_match_wins() {
    let config = load_one("readme/example3.yaml");
    let edge = domain(&config, "edge_proxy_per_ip");
    let any = rule(edge, &[("remote_address", "50.0.0.1")]);
    assert_eq!((any.requests_per_unit, any.unit), (10, Some(Unit::Second)));
    assert_eq!(any.rate(), Some(Rate::per_second(10)));
    assert!(!any.blocks_all());
    // The blocked address: a zero rate, which blocks every request.
    let blocked = rule(edge, &[("remote_address", "50.0.0.5")]);
    assert_eq!(blocked.requests_per_unit, 0);
    assert!(blocked.blocks_all());
    // Stat names as envoyproxy's counters are named: the address's dots
    // sanitized.
    assert_eq!(
        stat(edge, &[("remote_address", "50.0.0.1")]),
        "edge_proxy_per_ip.remote_address"
    );
    assert_eq!(
        stat(edge, &[("remote_address", "50.0.0.5")]),
        "edge_proxy_per_ip.remote_address_50_0_0_5"
    );
}

#[test]
fn readme_example_4_request_length_must_match_the_tree() {
    let flat = load_one("readme/example4_flat.yaml");
    let flat = domain(&flat, "example4");
    let long = [("key", "value"), ("subkey", "subvalue")];
    assert_eq!(limit(flat, &long), None);
    assert_eq!(limit(flat, &[("key", "value")]), Some((300, Unit::Second)));

    let nested = load_one("readme/example4_nested.yaml");
    let nested = domain(&nested, "example4");
    assert_eq!(limit(nested, &long), Some((300, Unit::Second)));
    assert_eq!(limit(nested, &[("key", "value")]), None);
    assert_eq!(
        limit(
            nested,
            &[("key", "value"), ("subkey", "subvalue"), ("extra", "x")]
        ),
        None
    );
}

#[test]
fn readme_example_5_unlimited() {
    let config = load_one("readme/example5.yaml");
    let internal = domain(&config, "internal");
    let ldap = rule(internal, &[("ldap", "anything")]);
    assert!(ldap.unlimited);
    assert_eq!(ldap.unit, None);
    assert_eq!(ldap.rate(), None);
    assert!(!ldap.blocks_all());
    assert_eq!(stat(internal, &[("ldap", "anything")]), "internal.ldap");
    assert_eq!(
        limit(internal, &[("azure", "x")]),
        Some((100, Unit::Minute))
    );
    assert_eq!(internal.matching(&[("aws", "x")]).map(|m| m.key), None);
}

#[test]
fn readme_example_6_shadow_mode() {
    let config = load_one("readme/example6.yaml");
    let example6 = domain(&config, "example6");
    let user_a = rule(example6, &[("service", "auth-service"), ("user", "user-a")]);
    assert!(user_a.shadow_mode);
    assert_eq!(user_a.rate(), Some(Rate::per_second(10)));
    let user_b = rule(example6, &[("service", "auth-service"), ("user", "user-b")]);
    assert!(!user_b.shadow_mode);
    assert_eq!(user_b.rate(), Some(Rate::per_second(20)));
    assert_eq!(
        stat(example6, &[("service", "auth-service"), ("user", "user-a")]),
        "example6.service.user_user-a"
    );
}

#[test]
fn readme_example_7_replaces() {
    let config = load_one("readme/example7.yaml");
    let example7 = domain(&config, "example7");
    let first = [("key_1", "value_1"), ("user", "bkthomps")];
    let second = [("key_2", "value_2"), ("user", "bkthomps")];
    let in_force = |request: &[&[(&str, &str)]]| -> Vec<Vec<u32>> {
        let mut matches: Vec<_> = request.iter().map(|d| example7.matching(d)).collect();
        apply_replaces(&mut matches);
        matches
            .iter()
            .map(|m| {
                m.iter()
                    .flat_map(Match::in_force)
                    .map(|r| r.requests_per_unit)
                    .collect()
            })
            .collect()
    };
    assert_eq!(in_force(&[&first]), [vec![5]]);
    assert_eq!(in_force(&[&second]), [vec![10]]);
    // Both in one request: the named limit is replaced, the replacing one
    // applies.
    assert_eq!(in_force(&[&first, &second]), [vec![], vec![10]]);
    assert_eq!(in_force(&[&second, &first]), [vec![10], vec![]]);

    let mut matches = vec![example7.matching(&first), example7.matching(&second)];
    apply_replaces(&mut matches);
    let replaced = matches[0].as_ref().unwrap();
    assert!(replaced.is_replaced(0));
    assert_eq!(replaced.rules[0].name.as_deref(), Some("specific_limit"));
    assert!(!matches[1].as_ref().unwrap().is_replaced(0));
    assert_eq!(
        matches[1].as_ref().unwrap().rules[0].replaces,
        ["specific_limit"]
    );
}

#[test]
fn readme_example_8_detailed_metric() {
    let config = load_one("readme/example8.yaml");
    let example8 = domain(&config, "example8");
    assert_eq!(
        limit(example8, &[("key1", "unspecified_value")]),
        Some((10, Unit::Minute))
    );
    assert_eq!(
        limit(example8, &[("key1", "unspecified_value2")]),
        Some((10, Unit::Minute))
    );
    assert_eq!(
        limit(example8, &[("key1", "value1")]),
        Some((20, Unit::Minute))
    );
    assert_eq!(
        stat(example8, &[("key1", "unspecified_value")]),
        "example8.key1_unspecified_value"
    );
    assert_eq!(
        stat(example8, &[("key1", "unspecified_value2")]),
        "example8.key1_unspecified_value2"
    );
    assert_eq!(
        stat(example8, &[("key1", "value1")]),
        "example8.key1_value1"
    );
    assert!(rule(example8, &[("key1", "x")]).detailed_metric);
}

#[test]
fn readme_example_9_wildcards() {
    let trailing = load_one("readme/example9_trailing.yaml");
    let trailing = domain(&trailing, "example9");
    for value in ["value1", "value2", "valueXYZ", "value"] {
        assert_eq!(
            limit(trailing, &[("key1", value)]),
            Some((20, Unit::Minute)),
            "{value}"
        );
    }
    assert_eq!(limit(trailing, &[("key1", "xvalue")]), None);
    assert_eq!(
        stat(trailing, &[("key1", "value1")]),
        "example9.key1_value*"
    );
    // Without share_threshold, each value has its own limit.
    assert_ne!(
        key(trailing, &[("key1", "value1")]),
        key(trailing, &[("key1", "value2")])
    );

    let middle = load_one("readme/example9_middle.yaml");
    let middle = domain(&middle, "example9");
    for value in ["/api/123/action", "/api/user-id/action"] {
        assert_eq!(
            limit(middle, &[("path", value)]),
            Some((20, Unit::Minute)),
            "{value}"
        );
    }
    assert_eq!(limit(middle, &[("path", "/api/123/other")]), None);
    assert_eq!(
        stat(middle, &[("path", "/api/123/action")]),
        "example9.path_/api/*/action"
    );

    let multiple = load_one("readme/example9_multiple.yaml");
    let multiple = domain(&multiple, "example9");
    for value in ["/api/v1/resource/123/action", "/api/v2/resource/456/action"] {
        assert_eq!(
            limit(multiple, &[("route", value)]),
            Some((20, Unit::Minute)),
            "{value}"
        );
    }
    assert_eq!(limit(multiple, &[("route", "/api/v1/resource/123")]), None);
    assert_eq!(
        limit(multiple, &[("route", "/api/v1/other/123/action")]),
        None
    );
}

#[test]
fn readme_example_10_value_to_metric() {
    let config = load_one("readme/example10.yaml");
    let example10 = domain(&config, "example10");
    assert_eq!(
        stat(
            example10,
            &[
                ("route", "api"),
                ("http_method", "GET"),
                ("subject_id", "123")
            ]
        ),
        "example10.route_api.http_method_GET.subject_id"
    );
    assert_eq!(
        stat(
            example10,
            &[
                ("route", "web"),
                ("http_method", "POST"),
                ("subject_id", "456")
            ]
        ),
        "example10.route_web.http_method_POST.subject_id"
    );

    let config = load_one("readme/example10_wildcard.yaml");
    let wildcard = domain(&config, "example10_wildcard");
    let request = [
        ("user", "alice"),
        ("action", "readfile"),
        ("resource", "documents"),
    ];
    assert_eq!(limit(wildcard, &request), Some((100, Unit::Minute)));
    assert_eq!(
        stat(wildcard, &request),
        "example10_wildcard.user_alice.action_readfile.resource"
    );
}

#[test]
fn readme_example_11_share_threshold() {
    let config = load_one("readme/example11.yaml");
    let example11 = domain(&config, "example11");

    // The README's story, on a fixed window of 10 per key: 5 for a.pdf and 5
    // for b.csv use up the shared threshold, so c.txt is over the limit.
    let mut counts: HashMap<String, u32> = HashMap::new();
    let mut request = |value: &str| -> bool {
        let matched = matched(example11, &[("files", value)]);
        let count = counts.entry(matched.key).or_default();
        *count += 1;
        *count <= matched.rules[0].requests_per_unit
    };
    for _ in 0..5 {
        assert!(request("files/a.pdf"));
        assert!(request("files/b.csv"));
    }
    assert!(!request("files/c.txt"));

    // Without share_threshold, each value has its own 10.
    let mut counts: HashMap<String, u32> = HashMap::new();
    let mut request = |value: &str| -> bool {
        let matched = matched(example11, &[("files_no_share", value)]);
        let count = counts.entry(matched.key).or_default();
        *count += 1;
        *count <= matched.rules[0].requests_per_unit
    };
    for _ in 0..10 {
        assert!(request("files_no_share/a.pdf"));
    }
    assert!(!request("files_no_share/a.pdf"));
    assert!(request("files_no_share/b.csv"));

    assert_eq!(
        stat(example11, &[("files", "files/a.pdf")]),
        "example11.files_files/*"
    );

    // The README says this gives `example11_metrics.route_api.method_GET`;
    // envoyproxy's code and its tests (TestShareThreshold) give the wildcard
    // as written and no value for `method`, which has neither a value nor
    // `value_to_metric`. tollgate follows the code.
    let config = load_one("readme/example11_metrics.yaml");
    let metrics = domain(&config, "example11_metrics");
    let request = [("route", "api/v1"), ("method", "GET")];
    assert_eq!(limit(metrics, &request), Some((60, Unit::Minute)));
    assert_eq!(
        stat(metrics, &request),
        "example11_metrics.route_api/*.method"
    );
    assert_eq!(
        key(metrics, &request),
        key(metrics, &[("route", "api/v2"), ("method", "GET")])
    );
    assert_ne!(
        key(metrics, &request),
        key(metrics, &[("route", "api/v1"), ("method", "POST")])
    );
}

// ---------------------------------------------------------------------------
// envoyproxy/ratelimit's own test configurations (test/config), as its
// config_test.go reads them.

#[test]
fn envoy_basic_config() {
    let config = load_one("envoy/basic_config.yaml");
    assert!(config.domain("foo_domain").is_none());
    let test = domain(&config, "test-domain");
    assert!(test.matching(&[]).is_none());
    assert!(test.matching(&[("key1", "something")]).is_none());
    assert!(test.matching(&[("key1", "value1")]).is_none());
    assert!(
        test.matching(&[("key2", "value2"), ("subkey", "subvalue")])
            .is_none()
    );
    assert!(
        test.matching(&[("key5", "value5"), ("subkey5", "subvalue")])
            .is_none()
    );

    let cases: &[(Entries, u32, Unit, &str)] = &[
        (
            &[("key1", "value1"), ("subkey1", "something")],
            5,
            Unit::Second,
            "test-domain.key1_value1.subkey1",
        ),
        (
            &[("key1", "value1"), ("subkey1", "subvalue1")],
            10,
            Unit::Second,
            "test-domain.key1_value1.subkey1_subvalue1",
        ),
        (
            &[("key2", "something")],
            20,
            Unit::Minute,
            "test-domain.key2",
        ),
        (
            &[("key2", "value2")],
            30,
            Unit::Minute,
            "test-domain.key2_value2",
        ),
        (&[("key3", "foo")], 1, Unit::Hour, "test-domain.key3"),
        (&[("key4", "foo")], 1, Unit::Day, "test-domain.key4"),
        (
            &[("key7", "unspecified_value")],
            70,
            Unit::Minute,
            "test-domain.key7_unspecified_value",
        ),
        (
            &[("key7", "another_value")],
            70,
            Unit::Minute,
            "test-domain.key7_another_value",
        ),
    ];
    for &(entries, requests, unit, stat_name) in cases {
        assert_eq!(limit(test, entries), Some((requests, unit)), "{entries:?}");
        assert_eq!(stat(test, entries), stat_name, "{entries:?}");
    }
    // Whitelisted: a value with no limit of its own.
    assert!(test.matching(&[("key2", "value3")]).is_none());
    assert_eq!(rule(test, &[("key3", "foo")]).name, None);
    assert_eq!(
        rule(test, &[("key4", "foo")]).name.as_deref(),
        Some("key4_rate_limit")
    );
    let key6 = rule(test, &[("key6", "foo")]);
    assert!(key6.unlimited);
    assert_eq!(stat(test, &[("key6", "foo")]), "test-domain.key6");
    assert_eq!(
        limit(test, &[("key5", "value5"), ("subkey5", "subvalue5")]),
        Some((25, Unit::Day))
    );
    assert_eq!(limit(test, &[("key5", "value5")]), Some((15, Unit::Day)));
    // Every rule, parents first, in file order.
    let limits: Vec<u32> = test.rules().map(|r| r.requests_per_unit).collect();
    assert_eq!(limits, [5, 10, 20, 30, 1, 1, 15, 25, 0, 70]);
}

#[test]
fn envoy_shadow_mode_config() {
    let config = load_one("envoy/shadowmode_config.yaml");
    let test = domain(&config, "test-domain");
    let cases: &[(Entries, u32, bool)] = &[
        (&[("key1", "value1"), ("subkey1", "something")], 5, false),
        (&[("key1", "value1"), ("subkey1", "subvalue1")], 10, true),
        (&[("key2", "something")], 20, true),
        (&[("key2", "value2")], 30, false),
    ];
    for &(entries, requests, shadow) in cases {
        let rule = rule(test, entries);
        assert_eq!(
            (rule.requests_per_unit, rule.shadow_mode),
            (requests, shadow)
        );
    }
}

#[test]
fn envoy_wildcard_config() {
    let config = load_one("envoy/wildcard.yaml");
    let test = domain(&config, "test-domain");
    // A descriptor with no value, as a baseline: one stat for all values.
    assert_eq!(stat(test, &[("noVal", "foo1")]), "test-domain.noVal");
    assert_eq!(stat(test, &[("noVal", "foo2")]), "test-domain.noVal");

    assert_eq!(stat(test, &[("wild", "foo1")]), "test-domain.wild_foo*");
    assert_eq!(stat(test, &[("wild", "foo2")]), "test-domain.wild_foo*");
    assert_eq!(
        stat(test, &[("nestedWild", "val1"), ("wild", "goo2")]),
        "test-domain.nestedWild_val1.wild_goo*"
    );
    assert!(test.matching(&[("wild", "bar")]).is_none());
    // A value without `*` matches only itself.
    assert!(test.matching(&[("noWild", "foo1")]).is_none());

    for value in ["barab", "bar123b", "barb"] {
        assert_eq!(
            stat(test, &[("midWild", value)]),
            "test-domain.midWild_bar*b"
        );
    }
    for value in ["bara", "xbarb"] {
        assert!(test.matching(&[("midWild", value)]).is_none(), "{value}");
    }
    for value in ["foo123bar456baz", "foobarbaz"] {
        assert_eq!(
            stat(test, &[("multiWild", value)]),
            "test-domain.multiWild_foo*bar*baz"
        );
    }
    for value in ["foo123baz", "bar456baz"] {
        assert!(test.matching(&[("multiWild", value)]).is_none(), "{value}");
    }
}

#[test]
fn envoy_share_threshold_config() {
    let config = load_one("envoy/share_threshold.yaml");
    let test = domain(&config, "test-domain");
    let shared = |requests: &[&[(&str, &str)]], limit: u32, stat_name: &str| {
        let first = matched(test, requests[0]);
        for &request in requests {
            let m = matched(test, request);
            assert_eq!(m.rules[0].requests_per_unit, limit, "{request:?}");
            assert_eq!(m.stat_name, stat_name, "{request:?}");
            assert_eq!(m.key, first.key, "{request:?} should share a key");
        }
    };
    shared(
        &[
            &[("files", "files/a.pdf")],
            &[("files", "files/b.csv")],
            &[("files", "files/c.txt")],
        ],
        100,
        "test-domain.files_files/*",
    );
    shared(
        &[
            &[("nested", "parent"), ("files", "nested/file1.txt")],
            &[("nested", "parent"), ("files", "nested/file2.txt")],
        ],
        200,
        "test-domain.nested_parent.files_nested/*",
    );
    shared(
        &[
            &[("files", "top/file1.txt"), ("files", "nested/file1.txt")],
            &[("files", "top/x"), ("files", "nested/y")],
        ],
        300,
        "test-domain.files_top/*.files_nested/*",
    );
    // share_threshold wins over value_to_metric, and over detailed_metric.
    shared(
        &[&[("route", "api/v1"), ("method", "GET")]],
        60,
        "test-domain.route_api/*.method",
    );
    shared(
        &[&[("service", "svc/user"), ("endpoint", "get")]],
        80,
        "test-domain.service_svc/*.endpoint_get",
    );
    assert!(rule(test, &[("service", "svc/user"), ("endpoint", "get")]).detailed_metric);
    // A wildcard without share_threshold under one with it.
    let mixed = [("path", "path/foo"), ("file", "file/doc1"), ("type", "pdf")];
    assert_eq!(
        stat(test, &mixed),
        "test-domain.path_path/*.file_file/*.type"
    );
    assert_eq!(
        key(test, &mixed),
        key(
            test,
            &[("path", "path/bar"), ("file", "file/doc1"), ("type", "pdf")]
        )
    );
    assert_ne!(
        key(test, &mixed),
        key(
            test,
            &[("path", "path/foo"), ("file", "file/doc2"), ("type", "pdf")]
        )
    );
    shared(
        &[
            &[
                ("user", "user/alice"),
                ("resource", "res/file1"),
                ("action", "read"),
            ],
            &[
                ("user", "user/bob"),
                ("resource", "res/file2"),
                ("action", "read"),
            ],
        ],
        150,
        "test-domain.user_user/*.resource_res/*.action",
    );
    // An exact value goes before a wildcard, and keeps its own limit.
    assert_eq!(limit(test, &[("file", "test1")]), Some((50, Unit::Minute)));
    assert_eq!(stat(test, &[("file", "test1")]), "test-domain.file_test1");
    shared(
        &[
            &[("file", "test2")],
            &[("file", "test23")],
            &[("file", "test123")],
        ],
        100,
        "test-domain.file_test*",
    );
    assert_ne!(
        key(test, &[("file", "test1")]),
        key(test, &[("file", "test2")])
    );
    shared(
        &[
            &[("midpath", "/api/v1")],
            &[("midpath", "/api-beta-v1")],
            &[("midpath", "/apiXYZv1")],
        ],
        100,
        "test-domain.midpath_/api*v1",
    );
    assert!(test.matching(&[("midpath", "/api/v2")]).is_none());
    shared(
        &[
            &[("multiroute", "svcAepBrpc")],
            &[("multiroute", "svcXXXepYYYrpc")],
            &[("multiroute", "svceprpc")],
        ],
        50,
        "test-domain.multiroute_svc*ep*rpc",
    );
    assert!(test.matching(&[("multiroute", "svcABCrpc")]).is_none());
    shared(
        &[&[("midroute", "/api/v2")], &[("midroute", "/api-beta-v2")]],
        80,
        "test-domain.midroute_/api*v2",
    );
    shared(
        &[
            &[("tenant", "t1prod"), ("resource", "resAv2")],
            &[("tenant", "t99prod"), ("resource", "resBBBv2")],
        ],
        60,
        "test-domain.tenant_t*prod.resource_res*v2",
    );
}

#[test]
fn envoy_metadata_config() {
    let config = load_one("envoy/metadata.yaml");
    let test = domain(&config, "test-domain");
    let first = matched(test, &[("key1", "value1"), ("subkey1", "something")]);
    assert_eq!(first.rules[0].requests_per_unit, 5);
    assert_eq!(
        first.metadata.unwrap()["name"],
        MetadataValue::String("service_1".into())
    );
    let second = matched(test, &[("key2", "something")]);
    let MetadataValue::Struct(service) = &second.metadata.unwrap()["service_with_quota"] else {
        panic!("a mapping")
    };
    assert_eq!(service["name"], MetadataValue::String("service_2".into()));
    assert!(
        matched(test, &[("key1", "value1"), ("subkey1", "subvalue1")])
            .metadata
            .is_none()
    );
}

#[test]
fn envoy_refusals_name_file_line_and_reason() {
    assert_refused(
        &refuse(&["envoy/bad_limit_unit.yaml"]),
        6,
        13,
        "invalid rate limit unit 'foo'",
    );
    let bad_yaml = refuse(&["envoy/bad_yaml.yaml"]);
    assert!(bad_yaml.line.is_some(), "{bad_yaml}");
    assert!(
        bad_yaml.reason.contains("found unexpected end of stream"),
        "{bad_yaml}"
    );
    assert_refused(
        &refuse(&["envoy/basic_config.yaml", "envoy/duplicate_domain.yaml"]),
        1,
        9,
        "duplicate domain 'test-domain' in config file",
    );
    // envoyproxy merges these only with MERGE_DOMAIN_CONFIG, which tollgate
    // does not have.
    assert_refused(
        &refuse(&[
            "envoy/merge_domain_key1.yaml",
            "envoy/merge_domain_key2.yaml",
        ]),
        2,
        9,
        "duplicate domain 'test-domain'",
    );
    assert_refused(
        &refuse(&["envoy/duplicate_key.yaml"]),
        6,
        5,
        "duplicate descriptor: key 'key1' with value 'value1'",
    );
    assert_refused(
        &refuse(&["envoy/empty_domain.yaml"]),
        1,
        1,
        "config file cannot have empty domain",
    );
    assert_refused(
        &refuse(&["envoy/empty_key.yaml"]),
        3,
        5,
        "descriptor has empty key",
    );
    assert_refused(
        &refuse(&["envoy/misspelled_key.yaml"]),
        5,
        5,
        "unknown field `ratelimit`",
    );
    assert_refused(
        &refuse(&["envoy/misspelled_key2.yaml"]),
        7,
        7,
        "unknown field `requestsperunit`",
    );
    assert_refused(
        &refuse(&["envoy/non_map_list.yaml"]),
        3,
        5,
        "invalid type: string \"a\"",
    );
    assert_refused(
        &refuse(&["envoy/non_string_key.yaml"]),
        1,
        1,
        "unknown field `0.25`",
    );
    assert_refused(
        &refuse(&["envoy/replaces_empty.yaml"]),
        10,
        15,
        "should not have an empty replaces entry",
    );
    assert_refused(
        &refuse(&["envoy/replaces_self.yaml"]),
        8,
        11,
        "replaces should not contain name of same descriptor",
    );
    assert_refused(
        &refuse(&["envoy/unlimited_with_unit.yaml"]),
        5,
        7,
        "should not specify rate limit unit when unlimited",
    );
}

// ---------------------------------------------------------------------------
// tollgate's extensions.

#[test]
fn algorithms_and_several_rules() {
    let config = load_one("tollgate/algorithms.yaml");
    let extensions = domain(&config, "extensions");
    let algorithm = |key: &str| rule(extensions, &[(key, "x")]).algorithm;
    assert_eq!(algorithm("default"), Algorithm::FixedWindow);
    assert_eq!(algorithm("log"), Algorithm::SlidingLog);
    assert_eq!(algorithm("window"), Algorithm::SlidingWindow);
    assert_eq!(algorithm("bucket"), Algorithm::TokenBucket { burst: 5 });
    assert_eq!(algorithm("burst"), Algorithm::TokenBucket { burst: 50 });
    assert_eq!(
        rule(extensions, &[("log", "x")]).rate(),
        Some(Rate::per_hour(100))
    );

    let user = matched(extensions, &[("user", "alice")]);
    assert_eq!(user.rules.len(), 2);
    let [per_second, per_day] = user.rules else {
        panic!("two rules")
    };
    assert_eq!(per_second.name.as_deref(), Some("per_second"));
    assert_eq!(per_second.algorithm, Algorithm::TokenBucket { burst: 20 });
    assert_eq!(per_second.rate(), Some(Rate::per_second(10)));
    assert_eq!(per_day.algorithm, Algorithm::SlidingLog);
    assert_eq!(
        per_day.rate(),
        Some(Rate::new(10_000, Duration::from_secs(86_400)))
    );
    // The descriptor's flags are each rule's; the ids tell the rules apart.
    assert!(per_second.shadow_mode && per_day.shadow_mode);
    assert_eq!((per_second.id.index, per_day.id.index), (0, 1));
    assert_eq!(per_second.id.path, per_day.id.path);
    assert_eq!(per_day.id.to_string(), "extensions/user#1");
    assert_eq!(user.in_force().count(), 2);

    // Units in any case; a week, a 30-day month, a 365-day year.
    let rate = |key: &str| rule(extensions, &[(key, "x")]).rate().unwrap();
    assert_eq!(
        rate("weekly"),
        Rate::new(7, Duration::from_secs(7 * 86_400))
    );
    assert_eq!(
        rate("monthly"),
        Rate::new(30, Duration::from_secs(30 * 86_400))
    );
    assert_eq!(
        rate("yearly"),
        Rate::new(365, Duration::from_secs(365 * 86_400))
    );
}

#[test]
fn one_replaced_rule_of_several() {
    let text = "
domain: d
descriptors:
  - key: user
    rate_limits:
      - {name: burst, unit: second, requests_per_unit: 10}
      - {name: daily, unit: day, requests_per_unit: 1000}
  - key: batch
    rate_limit:
      replaces: [{name: daily}]
      unit: day
      requests_per_unit: 100000
";
    let config = Config::from_files([("d.yaml", text)]).unwrap();
    let d = domain(&config, "d");
    let mut matches = vec![d.matching(&[("user", "u")]), d.matching(&[("batch", "b")])];
    apply_replaces(&mut matches);
    let user = matches[0].as_ref().unwrap();
    let names: Vec<_> = user.in_force().map(|r| r.name.as_deref()).collect();
    assert_eq!(names, [Some("burst")]);
    assert!(!user.is_replaced(0) && user.is_replaced(1) && !user.is_replaced(2));
}

#[test]
fn unlimited_rules_are_never_replaced_but_still_replace() {
    let text = "
domain: d
descriptors:
  - key: a
    rate_limit: {name: a, unlimited: true, replaces: [{name: b}]}
  - key: b
    rate_limit: {name: b, unit: second, requests_per_unit: 1, replaces: [{name: a}]}
";
    let config = Config::from_files([("d.yaml", text)]).unwrap();
    let d = domain(&config, "d");
    let mut matches = vec![d.matching(&[("a", "x")]), d.matching(&[("b", "x")])];
    apply_replaces(&mut matches);
    assert_eq!(matches[0].as_ref().unwrap().in_force().count(), 1);
    assert_eq!(matches[1].as_ref().unwrap().in_force().count(), 0);
    // A descriptor that matched nothing takes no part.
    let mut matches = vec![None, d.matching(&[("b", "x")])];
    apply_replaces(&mut matches);
    assert_eq!(matches[1].as_ref().unwrap().in_force().count(), 1);
}

#[test]
fn extension_refusals() {
    let cases: &[(&str, usize, usize, &str)] = &[
        (
            "tollgate/misspelled_field.yaml",
            7,
            7,
            "unknown field `requests_per_uint`, expected one of `unit`, `requests_per_unit`",
        ),
        (
            "tollgate/misplaced_field.yaml",
            5,
            5,
            "unknown field `unit`",
        ),
        (
            "tollgate/burst_without_token_bucket.yaml",
            5,
            7,
            "`burst` is only for `algorithm: token_bucket`",
        ),
        (
            "tollgate/rate_limit_and_rate_limits.yaml",
            3,
            5,
            "either `rate_limit` or `rate_limits`, not both",
        ),
        (
            "tollgate/requests_overflow.yaml",
            6,
            26,
            "invalid value: `5000000000` is out of range, expected a whole number from 0 to \
             4294967295",
        ),
        (
            "tollgate/unknown_algorithm.yaml",
            7,
            18,
            "unknown variant `leaky_bucket`, expected one of `fixed_window`",
        ),
        (
            "tollgate/unlimited_with_algorithm.yaml",
            5,
            7,
            "an unlimited rate limit has no `algorithm` or `burst`",
        ),
        (
            "tollgate/share_without_wildcard.yaml",
            3,
            5,
            "share_threshold can only be used with wildcard values",
        ),
        (
            "tollgate/second_document.yaml",
            8,
            1,
            "a second YAML document",
        ),
        (
            "tollgate/duplicate_field.yaml",
            4,
            5,
            "duplicate field `key`",
        ),
        (
            "tollgate/missing_unit.yaml",
            5,
            7,
            "invalid rate limit unit ''",
        ),
        (
            "tollgate/bad_failure_mode.yaml",
            2,
            15,
            "unknown failure mode \"sometimes\": open, closed or local",
        ),
    ];
    for &(file, line, column, reason) in cases {
        assert_refused(&refuse(&[file]), line, column, reason);
    }

    let empty = refuse(&["tollgate/empty.yaml"]);
    assert_eq!((empty.line, empty.column), (None, None));
    assert!(empty.reason.contains("cannot have empty domain"), "{empty}");
    assert!(
        empty
            .to_string()
            .starts_with(&format!("{}: ", empty.file.display()))
    );

    let nothing = Config::from_files([("nothing.yaml", "")]).unwrap_err();
    assert_eq!(
        nothing.to_string(),
        "nothing.yaml: config file cannot have empty domain (the file is empty)"
    );

    // A trailing `---` is no second document.
    load_one("tollgate/trailing_separator.yaml");
}

#[test]
fn rates_the_core_refuses_are_refused_with_its_error() {
    let cases = [
        (
            "tollgate/zero_burst.yaml",
            tollgate::ConfigError::ZeroCapacity,
        ),
        (
            "tollgate/too_fine.yaml",
            tollgate::ConfigError::TooFine {
                permits: 2_000_000_000,
                period: Duration::from_secs(1),
            },
        ),
    ];
    for (file, expected) in cases {
        let err = refuse(&[file]);
        assert_eq!((err.line, err.column), (Some(5), Some(7)), "{err}");
        let source = err.source().expect("the core's error");
        assert_eq!(
            source.downcast_ref::<tollgate::ConfigError>(),
            Some(&expected),
            "{err}"
        );
        assert!(err.reason.contains(&expected.to_string()), "{err}");
    }
    let overflow = refuse(&["tollgate/burst_overflow.yaml"]);
    assert!(matches!(
        overflow
            .source()
            .and_then(|s| s.downcast_ref::<tollgate::ConfigError>()),
        Some(tollgate::ConfigError::Overflow { .. })
    ));
}

#[test]
fn at_most_64_rules_on_a_descriptor() {
    let config = |rules: usize| {
        let mut text = String::from("domain: d\ndescriptors:\n  - key: k\n    rate_limits:\n");
        for n in 0..rules {
            text.push_str(&format!(
                "      - {{unit: second, requests_per_unit: {}}}\n",
                n + 1
            ));
        }
        Config::from_files([("d.yaml", text)])
    };
    let ok = config(64).unwrap();
    assert_eq!(
        matched(domain(&ok, "d"), &[("k", "v")]).in_force().count(),
        64
    );
    let err = config(65).unwrap_err();
    assert!(err.reason.contains("more than 64 rate limits"), "{err}");
    assert_eq!(err.line, Some(69));
}

#[test]
fn scalars_read_as_envoyproxy_reads_them() {
    let config = load_one("tollgate/yaml_forms.yaml");
    let forms = domain(&config, "forms");
    assert_eq!(limit(forms, &[("port", "8080")]), Some((3, Unit::Second)));
    assert_eq!(limit(forms, &[("port", "80")]), None);
    let flag = rule(forms, &[("flag", "true")]);
    assert!(flag.shadow_mode);
    assert_eq!(flag.rate(), Some(Rate::per_second(3)));
    // `value: ~` is no value: any value matches.
    assert_eq!(limit(forms, &[("nothing", "x")]), Some((4, Unit::Minute)));
    assert_eq!(stat(forms, &[("nothing", "x")]), "forms.nothing_x");
    // YAML 1.1 integers, as yaml.v2 reads them.
    for (key, requests) in [
        ("underscores", 1000),
        ("hex", 16),
        ("octal", 8),
        ("plus", 5),
    ] {
        assert_eq!(
            rule(forms, &[(key, "x")]).requests_per_unit,
            requests,
            "{key}"
        );
    }
    // `rate_limit:` and `descriptors:` left empty: no limit.
    assert!(forms.matching(&[("placeholder", "x")]).is_none());
}

// ---------------------------------------------------------------------------
// Loading a directory.

#[test]
fn load_dir_reads_yaml_files_and_skips_the_rest() {
    let config = Config::load_dir(configs().join("dir")).unwrap_or_else(|e| panic!("{e}"));
    let names: Vec<_> = config.domains().map(Domain::name).collect();
    // `.hidden/a.yaml` would repeat `dir_a`; `notes.txt` is no YAML.
    assert_eq!(names, ["dir_a", "dir_b"]);
    assert_eq!(
        limit(domain(&config, "dir_a"), &[("k", "v")]),
        Some((1, Unit::Second))
    );

    let missing = configs().join("no-such-directory");
    let err = Config::load_dir(&missing).unwrap_err();
    assert_eq!(err.file, missing);
    assert_eq!(err.line, None);
    assert!(
        err.source()
            .unwrap()
            .downcast_ref::<std::io::Error>()
            .is_some()
    );
}

#[test]
fn load_dir_names_the_refused_file() {
    let dir = std::env::temp_dir().join(format!("tollgate-config-test-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(dir.join("nested")).unwrap();
    fs::write(dir.join("a.yaml"), "domain: same\n").unwrap();
    fs::write(dir.join("nested/b.YML"), "# b\ndomain: same\n").unwrap();
    let err = Config::load_dir(&dir).unwrap_err();
    fs::remove_dir_all(&dir).unwrap();
    assert_eq!(err.file, dir.join("nested/b.YML"));
    assert_eq!((err.line, err.column), (Some(2), Some(9)));
    assert!(err.reason.contains("already in"), "{err}");
}

// ---------------------------------------------------------------------------
// Keys, identities, stat names.

#[test]
fn keys_do_not_collide_where_envoyproxy_keys_do() {
    let text = "
domain: d
descriptors:
  - key: a_b
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: a
    rate_limit: {unit: second, requests_per_unit: 2}
    descriptors:
      - key: b
        rate_limit: {unit: second, requests_per_unit: 3}
";
    // envoyproxy would refuse `d_a` + `b` against `d` + `a_b`... in its
    // keys, `d_a_b_c_` for both. Here every pair gives two keys.
    let other = "domain: d_a\ndescriptors:\n  - key: b\n    rate_limit: {unit: second, requests_per_unit: 4}\n";
    let config = Config::from_files([("d.yaml", text), ("d_a.yaml", other)]).unwrap();
    let d = domain(&config, "d");
    let d_a = domain(&config, "d_a");
    let pairs = [
        (key(d, &[("a_b", "c")]), key(d, &[("a", "b_c")])),
        (key(d, &[("a_b", "c")]), key(d_a, &[("b", "c")])),
        (
            key(d, &[("a", "b"), ("b", "c")]),
            key(d, &[("a", "b_b"), ("b", "c")]),
        ),
        (key(d, &[("a", ""), ("b", "c")]), key(d, &[("a", "b")])),
    ];
    for (one, other) in &pairs {
        assert_ne!(one, other);
    }
    // The same, written envoyproxy's way, collides.
    let envoy = |domain: &str, entries: &[(&str, &str)]| {
        let mut key = format!("{domain}_");
        for (k, v) in entries {
            key.push_str(&format!("{k}_{v}_"));
        }
        key
    };
    assert_eq!(envoy("d", &[("a_b", "c")]), envoy("d", &[("a", "b_c")]));
    assert_eq!(envoy("d", &[("a_b", "c")]), envoy("d_a", &[("b", "c")]));
    // A key with no value and a key with a value are different descriptors,
    // not the duplicate envoyproxy's joined names make them.
    let both = "domain: e\ndescriptors:\n  - key: a_b\n  - key: a\n    value: b\n";
    Config::from_files([("e.yaml", both)]).unwrap();
}

#[test]
fn override_helpers() {
    assert_eq!(override_key("d", &[("k", "v")]), "1:d;1:k=1:v");
    assert_eq!(override_key("d", &[]), "1:d");
    assert_eq!(override_stat_name("d", &[("k", "v"), ("e", "")]), "d.k_v.e");
    assert_eq!(override_stat_name("d", &[]), "d.");
    let config = load_one("readme/example2.yaml");
    let messaging = domain(&config, "messaging");
    let entries = [("message_type", "marketing"), ("to_number", "2061111111")];
    assert_eq!(
        key(messaging, &entries),
        override_key("messaging", &entries)
    );
}

#[test]
fn stat_names_are_sanitized_like_envoyproxy() {
    let cases = [
        ("1234.5.6.7", "d.k_1234_5_6_7"),
        ("1.2.3.4567.8", "d.k_1_2_3_4567.8"),
        ("1.2.3", "d.k_1.2.3"),
        ("x.1.2.3.4.5.6.7.8", "d.k_x.1_2_3_4.5_6_7_8"),
        ("a:b|c", "d.k_a_b_c"),
        ("::1", "d.k___1"),
    ];
    for (value, expected) in cases {
        assert_eq!(
            override_stat_name("d", &[("k", value)]),
            expected,
            "{value}"
        );
    }
    // A dot between two entries can be one of an address's.
    assert_eq!(
        override_stat_name("d", &[("10", ""), ("20", ""), ("30", ""), ("40", "")]),
        "d.10_20_30_40"
    );
}

#[test]
fn rules_are_equal_across_loads_and_ids_survive_changes() {
    let text = fs::read_to_string(configs().join("envoy/basic_config.yaml")).unwrap();
    let load = |text: &str| Config::from_files([("basic.yaml", text)]).unwrap();
    let (one, two) = (load(&text), load(&text));
    let rules = |config: &Config| -> Vec<Rule> {
        config.domains().flat_map(|d| d.rules()).cloned().collect()
    };
    assert_eq!(rules(&one), rules(&two));
    let hasher = RandomState::new();
    for (a, b) in rules(&one).iter().zip(rules(&two).iter()) {
        assert_eq!(hasher.hash_one(a), hasher.hash_one(b));
    }
    let ids: HashSet<_> = rules(&one).into_iter().map(|r| r.id).collect();
    assert_eq!(ids.len(), rules(&one).len(), "ids are unique");

    // A changed limit keeps its id; a moved descriptor keeps its id.
    let changed = load(&text.replace("requests_per_unit: 70", "requests_per_unit: 71"));
    let before: HashMap<_, _> = rules(&one).into_iter().map(|r| (r.id.clone(), r)).collect();
    let mut differing = Vec::new();
    for rule in rules(&changed) {
        if before[&rule.id] != rule {
            differing.push(rule.id.to_string());
        }
    }
    assert_eq!(differing, ["test-domain/key7#0"]);
    let moved = "
domain: test-domain
descriptors:
  - key: key3
    rate_limit: {unit: hour, requests_per_unit: 1}
";
    let moved = load(moved);
    let key3 = rules(&moved).pop().unwrap();
    assert_eq!(before[&key3.id], key3);
}

#[test]
fn rule_ids_display_apart() {
    let text = r#"
domain: d
descriptors:
  - key: a/b
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: a
    descriptors:
      - key: b
        rate_limit: {unit: second, requests_per_unit: 2}
  - key: "k=v"
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: k
    value: v
    rate_limit: {unit: second, requests_per_unit: 4}
  - key: "x#0"
    rate_limit: {unit: second, requests_per_unit: 5}
"#;
    let config = Config::from_files([("d.yaml", text)]).unwrap();
    let shown: Vec<String> = domain(&config, "d")
        .rules()
        .map(|r| r.id.to_string())
        .collect();
    assert_eq!(
        shown,
        [r"d/a\/b#0", "d/a/b#0", r"d/k\=v#0", "d/k=v#0", r"d/x\#0#0"]
    );
}

#[test]
fn shared_across_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Config>();
    send_sync::<ConfigFileError>();
    send_sync::<Match<'static>>();
}

#[test]
fn unmatched_requests() {
    let config = load_one("readme/example2.yaml");
    let messaging = domain(&config, "messaging");
    assert!(messaging.matching(&[]).is_none());
    assert!(
        messaging
            .matching(&[("to_number", "1"), ("x", "y")])
            .is_none()
    );
    assert!(config.domain("unknown").is_none());
}

// ---------------------------------------------------------------------------
// Matching against a plain reading of envoyproxy's GetLimit.

/// A descriptor as the property test writes it.
#[derive(Clone, Debug)]
struct Spec {
    key: &'static str,
    value: Option<&'static str>,
    /// requests_per_unit: unique per limited descriptor, so that a match
    /// says which descriptor it came from.
    limit: Option<u32>,
    share: bool,
    value_to_metric: bool,
    detailed: bool,
    children: Vec<Spec>,
}

const KEYS: [&str; 3] = ["a", "b", "a_b"];
const VALUES: [&str; 8] = ["x", "y", "xy", "x*", "*", "*y", "x*y", "x**"];
const REQUEST_VALUES: [&str; 10] = ["x", "y", "xy", "xxy", "", "x*", "yx", "*", "xyy", "b_x"];

fn specs(depth: u32) -> BoxedStrategy<Vec<Spec>> {
    let children = if depth == 0 {
        Just(Vec::new()).boxed()
    } else {
        specs(depth - 1)
    };
    let spec = (
        prop::sample::select(&KEYS[..]),
        prop::option::weighted(0.7, prop::sample::select(&VALUES[..])),
        any::<bool>(),
        any::<[bool; 3]>(),
        children,
    )
        .prop_map(
            |(key, value, limited, [share, value_to_metric, detailed], children)| Spec {
                key,
                value,
                limit: limited.then_some(0),
                share: share && value.is_some_and(|v| v.contains('*')),
                value_to_metric,
                detailed,
                children,
            },
        );
    prop::collection::vec(spec, 0..5)
        .prop_map(|mut specs| {
            let mut seen = HashSet::new();
            specs.retain(|s| seen.insert((s.key, s.value)));
            specs
        })
        .boxed()
}

fn number(specs: &mut [Spec], next: &mut u32) {
    for spec in specs {
        if spec.limit.is_some() {
            *next += 1;
            spec.limit = Some(*next);
        }
        number(&mut spec.children, next);
    }
}

fn write_yaml(specs: &[Spec], indent: usize, out: &mut String) {
    let pad = " ".repeat(indent);
    for spec in specs {
        out.push_str(&format!("{pad}- key: '{}'\n", spec.key));
        if let Some(value) = spec.value {
            out.push_str(&format!("{pad}  value: '{value}'\n"));
        }
        if let Some(limit) = spec.limit {
            out.push_str(&format!(
                "{pad}  rate_limit: {{unit: second, requests_per_unit: {limit}}}\n"
            ));
        }
        for (flag, name) in [
            (spec.share, "share_threshold"),
            (spec.value_to_metric, "value_to_metric"),
            (spec.detailed, "detailed_metric"),
        ] {
            if flag {
                out.push_str(&format!("{pad}  {name}: true\n"));
            }
        }
        if !spec.children.is_empty() {
            out.push_str(&format!("{pad}  descriptors:\n"));
            write_yaml(&spec.children, indent + 4, out);
        }
    }
}

/// `*` matches any run of characters: the textbook recursion, independent
/// of the library's piecewise search.
fn glob(pattern: &[u8], value: &[u8]) -> bool {
    match pattern.split_first() {
        None => value.is_empty(),
        Some((b'*', rest)) => (0..=value.len()).any(|skip| glob(rest, &value[skip..])),
        Some((&c, rest)) => value.first() == Some(&c) && glob(rest, &value[1..]),
    }
}

#[derive(Clone, Copy, PartialEq)]
enum How {
    Value,
    Wildcard,
    Key,
}

/// envoyproxy's GetLimit, read plainly (keys and values compared apart):
/// the matched descriptor's limit, its stat name, and the key's values.
fn reference(
    domain: &str,
    top: &[Spec],
    entries: &[(&str, &str)],
) -> Option<(u32, String, Vec<String>)> {
    let mut level = top;
    let mut walked: Vec<(&Spec, How)> = Vec::new();
    let mut found = None;
    for (at, &(key, value)) in entries.iter().enumerate() {
        let with_key = || level.iter().filter(move |s| s.key == key);
        let step = with_key()
            .find(|s| s.value == Some(value))
            .map(|s| (s, How::Value))
            .or_else(|| {
                with_key()
                    .find(|s| {
                        s.value.is_some_and(|p| {
                            p.contains('*') && glob(p.as_bytes(), value.as_bytes())
                        })
                    })
                    .map(|s| (s, How::Wildcard))
            })
            .or_else(|| {
                with_key()
                    .find(|s| s.value.is_none())
                    .map(|s| (s, How::Key))
            });
        let (spec, how) = step?;
        walked.push((spec, how));
        if at == entries.len() - 1 {
            found = spec.limit;
        }
        if spec.children.is_empty() {
            break;
        }
        level = &spec.children;
    }
    let limit = found?;
    let leaf = walked.last().unwrap().0;
    let shared: Vec<Option<&str>> = walked
        .iter()
        .map(|&(spec, how)| (how == How::Wildcard && spec.share).then(|| spec.value.unwrap()))
        .collect();
    let any_shared = shared.iter().any(Option::is_some);
    // The three names GetLimit builds, each as its own loop.
    let mut stat = domain.to_owned();
    if leaf.detailed && any_shared {
        for (&(key, value), shared) in entries.iter().zip(&shared) {
            stat.push_str(&format!(".{key}"));
            match shared {
                Some(pattern) => stat.push_str(&format!("_{pattern}")),
                None if !value.is_empty() => stat.push_str(&format!("_{value}")),
                None => {}
            }
        }
    } else if leaf.detailed {
        for &(key, value) in entries {
            stat.push_str(&format!(".{key}_{value}"));
        }
    } else {
        for ((&(key, value), &(spec, how)), shared) in entries.iter().zip(&walked).zip(&shared) {
            let shown = match how {
                How::Wildcard if shared.is_some() => shared.unwrap(),
                How::Wildcard if spec.value_to_metric => value,
                How::Wildcard => spec.value.unwrap(),
                How::Value => value,
                How::Key if spec.value_to_metric => value,
                How::Key => "",
            };
            stat.push_str(&format!(".{key}"));
            if !shown.is_empty() {
                stat.push_str(&format!("_{shown}"));
            }
        }
    }
    let key_values = entries
        .iter()
        .zip(&shared)
        .map(|(&(_, value), shared)| shared.unwrap_or(value).to_owned())
        .collect();
    Some((limit, stat, key_values))
}

fn requests() -> impl Strategy<Value = Vec<(&'static str, &'static str)>> {
    prop::collection::vec(
        (
            prop::sample::select(&KEYS[..]),
            prop::sample::select(&REQUEST_VALUES[..]),
        ),
        0..4,
    )
}

proptest! {
    #[test]
    fn matching_agrees_with_a_plain_walk(
        mut top in specs(2),
        requests in prop::collection::vec(requests(), 1..24),
    ) {
        number(&mut top, &mut 0);
        let mut text = String::from("domain: p\ndescriptors:\n");
        write_yaml(&top, 2, &mut text);
        let config = Config::from_files([("p.yaml", &text)])
            .unwrap_or_else(|e| panic!("{e}\n{text}"));
        let domain = config.domain("p").unwrap();
        for entries in &requests {
            let ours = domain.matching(entries);
            let expected = reference("p", &top, entries);
            match (ours, expected) {
                (None, None) => {}
                (Some(m), Some((limit, stat, values))) => {
                    prop_assert_eq!(m.rules[0].requests_per_unit, limit, "{:?}\n{}", entries, text);
                    prop_assert_eq!(&m.stat_name, &stat, "{:?}\n{}", entries, text);
                    let substituted: Vec<(&str, &str)> = entries
                        .iter()
                        .zip(&values)
                        .map(|(&(key, _), value)| (key, value.as_str()))
                        .collect();
                    prop_assert_eq!(&m.key, &override_key("p", &substituted), "{:?}\n{}", entries, text);
                }
                (ours, expected) => prop_assert!(
                    false,
                    "{:?}: ours {:?}, reference {:?}\n{}",
                    entries,
                    ours.map(|m| m.rules[0].requests_per_unit),
                    expected.map(|e| e.0),
                    text
                ),
            }
        }
    }

    #[test]
    fn keys_are_injective(
        one in prop::collection::vec(("[a_:;=1]{0,3}", "[a_:;=1]{0,3}"), 0..4),
        other in prop::collection::vec(("[a_:;=1]{0,3}", "[a_:;=1]{0,3}"), 0..4),
        domains in ("[d_:;1]{1,3}", "[d_:;1]{1,3}"),
    ) {
        fn refs(entries: &[(String, String)]) -> Vec<(&str, &str)> {
            entries.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
        }
        let key_one = override_key(&domains.0, &refs(&one));
        let key_other = override_key(&domains.1, &refs(&other));
        prop_assert_eq!(key_one == key_other, domains.0 == domains.1 && one == other);
    }
}
