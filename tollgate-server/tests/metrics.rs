//! The server's metrics read back from a recorder: requests by code,
//! hits by limit and outcome (within, near, over, shadow), invalid requests,
//! unknown domains under one label value, reloads.

mod support;

#[allow(dead_code)]
#[path = "../../tollgate-redis/tests/support/recorded.rs"]
mod recorded;
#[allow(dead_code)]
#[path = "../../tollgate-redis/tests/support/server.rs"]
mod server;

use metrics_util::debugging::DebuggingRecorder;
use recorded::{counter, gauge, histogram, read};
use support::{config, descriptor, request};
use tollgate_server::{Failure, Leasing, Options, RedisSettings, Server};

const API: &str = "
domain: api
descriptors:
  - key: user
    rate_limit:
      unit: hour
      requests_per_unit: 5
  - key: probe
    shadow_mode: true
    rate_limit:
      unit: hour
      requests_per_unit: 1
  - key: tenant
    rate_limit:
      unit: second
      requests_per_unit: 1000
      algorithm: token_bucket
      burst: 1000
";

#[tokio::test]
async fn every_decision_is_counted_by_domain_limit_and_outcome() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::set_global_recorder(recorder).unwrap();

    let server = Server::new(config(&[API]), Options::default()).unwrap();
    let alice = request("api", vec![descriptor(&[("user", "alice")])]);
    for _ in 0..7 {
        server.should_rate_limit(&alice).await.unwrap();
    }
    let probe = request("api", vec![descriptor(&[("probe", "p")])]);
    for _ in 0..3 {
        server.should_rate_limit(&probe).await.unwrap();
    }
    let nowhere = request("no-such-domain-7f3a", vec![descriptor(&[("user", "x")])]);
    server.should_rate_limit(&nowhere).await.unwrap();
    assert!(
        server
            .should_rate_limit(&request("api", vec![]))
            .await
            .is_err()
    );
    server.reload(config(&[API])).unwrap();

    // The leased backend: two tenants' leases held, each request timed.
    let redis = server::RedisServer::start();
    let mut settings = RedisSettings::default();
    settings.failure = Failure::Closed;
    settings.lease = Some(Leasing::default());
    let leased = Server::with_redis(config(&[API]), Options::default(), settings).unwrap();
    leased.connect_redis(tollgate_redis::Client::connect(&redis.url()).await.unwrap());
    for tenant in ["a", "b", "a"] {
        let request = request("api", vec![descriptor(&[("tenant", tenant)])]);
        let answer = leased.should_rate_limit(&request).await.unwrap();
        assert_eq!(
            answer.overall_code(),
            tollgate_server::proto::envoy::service::ratelimit::v3::rate_limit_response::Code::Ok
        );
    }

    let m = read(&snapshotter);
    assert_eq!(gauge(&m, "tollgate_server_leased_keys", &[]), 2.0);
    assert_eq!(
        histogram(
            &m,
            "tollgate_server_backend_duration_seconds",
            &[("backend", "leased")]
        )
        .len(),
        3
    );
    let requests = |domain, code| {
        counter(
            &m,
            "tollgate_server_requests_total",
            &[("domain", domain), ("code", code)],
        )
    };
    // alice's 5, the probe's 3, the leased backend's 3.
    assert_eq!(requests("api", "ok"), 5 + 3 + 3);
    assert_eq!(requests("api", "over_limit"), 2);
    assert_eq!(requests("api", "invalid"), 1);
    // A domain no file names is counted under one value, whatever it is.
    assert_eq!(requests("unknown", "ok"), 1);
    let user = [("domain", "api"), ("descriptor", "api.user")];
    let hits = |labels: &[(&str, &str)], outcome| {
        let mut labels = labels.to_vec();
        labels.push(("outcome", outcome));
        counter(&m, "tollgate_server_limit_hits_total", &labels)
    };
    assert_eq!(counter(&m, "tollgate_server_hits_total", &user), 7);
    assert_eq!(hits(&user, "within_limit"), 5);
    // Admissions with more than 80 % of 5 in use: the 5th only.
    assert_eq!(hits(&user, "near_limit"), 1);
    assert_eq!(hits(&user, "over_limit"), 2);
    let probe = [("domain", "api"), ("descriptor", "api.probe")];
    assert_eq!(counter(&m, "tollgate_server_hits_total", &probe), 3);
    assert_eq!(hits(&probe, "shadow_mode"), 2);
    assert_eq!(hits(&probe, "over_limit"), 0);
    assert_eq!(
        histogram(
            &m,
            "tollgate_server_backend_duration_seconds",
            &[("backend", "memory")]
        )
        .len(),
        5 + 2 + 3 + 1
    );
    assert_eq!(
        counter(&m, "tollgate_server_reloads_total", &[("outcome", "ok")]),
        1
    );
}
