//! The gRPC service over loopback, called by tonic's client: decisions, the
//! all-or-nothing rule, shadow mode, bad requests, reloads; and the JSON
//! endpoint over HTTP.

use crate::support;

use support::{Running, ask, config, descriptor, request};
use tollgate_server::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use tollgate_server::proto::envoy::service::ratelimit::v3::RateLimitResponse;
use tollgate_server::proto::envoy::service::ratelimit::v3::rate_limit_response::Code;
use tollgate_server::proto::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use tollgate_server::proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tollgate_server::{Options, ResponseHeaders};
use tonic::transport::Channel;

const API: &str = "
domain: api
descriptors:
  - key: user
    rate_limit:
      unit: minute
      requests_per_unit: 3
  - key: route
    value: upload
    rate_limit:
      name: uploads
      unit: hour
      requests_per_unit: 100
  - key: probe
    shadow_mode: true
    rate_limit:
      unit: hour
      requests_per_unit: 1
  - key: free
    rate_limit:
      unlimited: true
";

/// A server of `API` with `options`, and a client of it.
async fn serve_api(options: Options) -> (Running, RateLimitServiceClient<Channel>) {
    let running = Running::start(config(&[API]), options).await;
    let client = running.client().await;
    (running, client)
}

/// The default options, but answers that carry `headers`.
fn answering_with(headers: ResponseHeaders) -> Options {
    let mut options = Options::default();
    options.response_headers = headers;
    options
}

fn codes(response: &RateLimitResponse) -> Vec<Code> {
    response.statuses.iter().map(|s| s.code()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tonic_client_is_admitted_then_refused_with_the_limit_and_the_wait() {
    let (running, mut client) = serve_api(Options::default()).await;
    let alice = request("api", vec![descriptor(&[("user", "alice")])]);
    for remaining in [2, 1, 0] {
        let answer = ask(&mut client, alice.clone()).await;
        assert_eq!(answer.overall_code(), Code::Ok);
        let status = &answer.statuses[0];
        assert_eq!(status.code(), Code::Ok);
        let limit = status.current_limit.as_ref().unwrap();
        assert_eq!((limit.requests_per_unit, limit.unit()), (3, Unit::Minute));
        assert_eq!(status.limit_remaining, remaining);
    }
    let refused = ask(&mut client, alice.clone()).await;
    assert_eq!(refused.overall_code(), Code::OverLimit);
    assert_eq!(codes(&refused), [Code::OverLimit]);
    let wait = refused.statuses[0].duration_until_reset.unwrap();
    assert!(
        wait.seconds <= 60 && (wait.seconds, wait.nanos) > (0, 0),
        "{wait:?}"
    );
    // Another value of the key is another limit.
    let bob = request("api", vec![descriptor(&[("user", "bob")])]);
    let answer = ask(&mut client, bob).await;
    assert_eq!(answer.overall_code(), Code::Ok);
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_refused_by_one_descriptor_is_charged_by_none() {
    let (running, mut client) = serve_api(Options::default()).await;
    let both = request(
        "api",
        vec![
            descriptor(&[("route", "upload")]),
            descriptor(&[("user", "carol")]),
        ],
    );
    for _ in 0..3 {
        let answer = ask(&mut client, both.clone()).await;
        assert_eq!(answer.overall_code(), Code::Ok);
    }
    for _ in 0..5 {
        let answer = ask(&mut client, both.clone()).await;
        assert_eq!(answer.overall_code(), Code::OverLimit);
        assert_eq!(codes(&answer), [Code::Ok, Code::OverLimit]);
        // The upload limit was not charged by the refused requests: 3 used.
        assert_eq!(answer.statuses[0].limit_remaining, 97);
        assert_eq!(
            answer.statuses[0].current_limit.as_ref().unwrap().name,
            "uploads"
        );
    }
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_mode_and_unlimited_answer_ok() {
    let (running, mut client) = serve_api(Options::default()).await;
    let probe = request("api", vec![descriptor(&[("probe", "x")])]);
    for _ in 0..3 {
        let answer = ask(&mut client, probe.clone()).await;
        assert_eq!(answer.overall_code(), Code::Ok);
    }
    let free = request("api", vec![descriptor(&[("free", "x")])]);
    for _ in 0..10 {
        let answer = ask(&mut client, free.clone()).await;
        assert_eq!(answer.overall_code(), Code::Ok);
        assert_eq!(answer.statuses[0].current_limit, None);
        assert_eq!(answer.statuses[0].limit_remaining, u32::MAX);
    }
    // Unknown domain, unmatched descriptor: no limit, OK.
    for req in [
        request("nope", vec![descriptor(&[("user", "a")])]),
        request("api", vec![descriptor(&[("unknown", "a")])]),
    ] {
        let answer = ask(&mut client, req).await;
        assert_eq!(answer.overall_code(), Code::Ok);
        assert_eq!(answer.statuses[0].current_limit, None);
    }
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_the_protocols_answer_or_an_error_never_a_panic() {
    let (running, mut client) = serve_api(Options::default()).await;
    let invalid = |r: Result<tonic::Response<RateLimitResponse>, tonic::Status>| {
        let status = r.unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        status.message().to_owned()
    };
    let empty_domain = request("", vec![descriptor(&[("user", "a")])]);
    assert!(invalid(client.should_rate_limit(empty_domain).await).contains("domain"));
    let none = request("api", vec![]);
    assert!(invalid(client.should_rate_limit(none).await).contains("descriptor"));
    let empty_key = request("api", vec![descriptor(&[("", "a")])]);
    invalid(client.should_rate_limit(empty_key).await);
    let many = request("api", vec![descriptor(&[("unknown", "a")]); 10_000]);
    assert!(invalid(client.should_rate_limit(many).await).contains("10000 descriptors"));
    let matching = request(
        "api",
        (0..500)
            .map(|i| descriptor(&[("user", &format!("u{i}"))]))
            .collect(),
    );
    assert!(invalid(client.should_rate_limit(matching).await).contains("500 limits"));
    let mut zero = descriptor(&[("user", "a")]);
    zero.limit = Some(RateLimitOverride {
        requests_per_unit: 0,
        unit: Unit::Second as i32,
    });
    invalid(client.should_rate_limit(request("api", vec![zero])).await);

    // Huge hits: the protocol's answer, nothing charged.
    let mut huge = descriptor(&[("user", "dave")]);
    huge.hits_addend = Some(u64::MAX);
    let answer = ask(&mut client, request("api", vec![huge])).await;
    assert_eq!(answer.overall_code(), Code::OverLimit);
    let mut above = request("api", vec![descriptor(&[("user", "dave")])]);
    above.hits_addend = 4;
    let answer = ask(&mut client, above).await;
    assert_eq!(answer.overall_code(), Code::OverLimit);
    let mut exact = request("api", vec![descriptor(&[("user", "dave")])]);
    exact.hits_addend = 3;
    let answer = ask(&mut client, exact).await;
    assert_eq!(answer.overall_code(), Code::Ok);
    assert_eq!(answer.statuses[0].limit_remaining, 0);
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_may_bring_its_own_limit() {
    let (running, mut client) = serve_api(Options::default()).await;
    let mut own = descriptor(&[("tenant", "t1")]);
    own.limit = Some(RateLimitOverride {
        requests_per_unit: 2,
        unit: Unit::Hour as i32,
    });
    let req = request("api", vec![own]);
    let answers: Vec<Code> = {
        let mut v = Vec::new();
        for _ in 0..3 {
            v.push(ask(&mut client, req.clone()).await.overall_code());
        }
        v
    };
    assert_eq!(answers, [Code::Ok, Code::Ok, Code::OverLimit]);
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_keeps_the_state_of_what_did_not_change() {
    let (running, mut client) = serve_api(Options::default()).await;
    let erin = request("api", vec![descriptor(&[("user", "erin")])]);
    let upload = request("api", vec![descriptor(&[("route", "upload")])]);
    for _ in 0..3 {
        client.should_rate_limit(erin.clone()).await.unwrap();
        client.should_rate_limit(upload.clone()).await.unwrap();
    }
    // The same text again: nothing resets.
    running.server.reload(config(&[API])).unwrap();
    let answer = ask(&mut client, erin.clone()).await;
    assert_eq!(answer.overall_code(), Code::OverLimit);
    // The upload limit doubled: 3 of 100 used becomes 6 of 200 (carried
    // over proportionally), not a fresh 200.
    running
        .server
        .reload(config(&[
            &API.replace("requests_per_unit: 100", "requests_per_unit: 200")
        ]))
        .unwrap();
    let answer = ask(&mut client, upload.clone()).await;
    assert_eq!(answer.overall_code(), Code::Ok);
    let status = &answer.statuses[0];
    assert_eq!(
        status.current_limit.as_ref().unwrap().requests_per_unit,
        200
    );
    assert_eq!(status.limit_remaining, 193);
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_json_endpoint_answers_curl() {
    let running = Running::start(config(&[API]), Options::default()).await;
    let http = reqwest::Client::new();
    let url = format!("http://{}/json", running.http);
    let body = r#"{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"frank"}]}]}"#;
    for remaining in [2, 1, 0] {
        let response = http.post(&url).body(body).send().await.unwrap();
        assert_eq!(response.status(), 200);
        let json: serde_json::Value = response.json().await.unwrap();
        assert_eq!(json["overallCode"], "OK");
        assert_eq!(json["statuses"][0]["currentLimit"]["unit"], "MINUTE");
        assert_eq!(json["statuses"][0]["currentLimit"]["requestsPerUnit"], 3);
        if remaining > 0 {
            assert_eq!(json["statuses"][0]["limitRemaining"], remaining);
        } else {
            assert!(
                json["statuses"][0].get("limitRemaining").is_none(),
                "{json}"
            );
        }
    }
    let response = http.post(&url).body(body).send().await.unwrap();
    assert_eq!(response.status(), 429);
    let json: serde_json::Value = response.json().await.unwrap();
    assert_eq!(json["overallCode"], "OVER_LIMIT");
    let wait = json["statuses"][0]["durationUntilReset"].as_str().unwrap();
    assert!(wait.ends_with('s'), "{wait}");
    for bad in [
        "{",
        r#"{"domain":"api"}"#,
        r#"{"domain":"api","descriptors":[{"entries":[{"key":"user"}]}],"extra":1}"#,
    ] {
        let response = http.post(&url).body(bad).send().await.unwrap();
        assert_eq!(response.status(), 400, "{bad}");
    }
    let health = http
        .get(format!("http://{}/healthcheck", running.http))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_answers_carry_ratelimit_headers_when_asked() {
    let (running, mut client) = serve_api(answering_with(ResponseHeaders::RateLimit)).await;
    let headers = |answer: &RateLimitResponse| -> Vec<(String, String)> {
        answer
            .response_headers_to_add
            .iter()
            .map(|h| (h.key.clone(), h.value.clone()))
            .collect()
    };
    let both = request(
        "api",
        vec![
            descriptor(&[("route", "upload")]),
            descriptor(&[("user", "grace")]),
        ],
    );
    // The user limit (3 a minute) is the closer: its figures.
    let answer = ask(&mut client, both.clone()).await;
    let got = headers(&answer);
    assert_eq!(got[0], ("RateLimit-Limit".to_owned(), "3".to_owned()));
    assert_eq!(got[1], ("RateLimit-Remaining".to_owned(), "2".to_owned()));
    assert_eq!(got[2].0, "RateLimit-Reset");
    let reset: u64 = got[2].1.parse().unwrap();
    assert!((1..=60).contains(&reset), "{reset}");
    for _ in 0..2 {
        client.should_rate_limit(both.clone()).await.unwrap();
    }
    // Refused: the limit over, 0 left, and when the request fits.
    let refused = ask(&mut client, both).await;
    assert_eq!(refused.overall_code(), Code::OverLimit);
    let got = headers(&refused);
    assert_eq!(got[1], ("RateLimit-Remaining".to_owned(), "0".to_owned()));
    let reset: u64 = got[2].1.parse().unwrap();
    assert!((1..=60).contains(&reset), "{reset}");
    // Off by default.
    let (plain, mut plain_client) = serve_api(Options::default()).await;
    let plain_request = request("api", vec![descriptor(&[("user", "x")])]);
    let answer = ask(&mut plain_client, plain_request).await;
    assert!(answer.response_headers_to_add.is_empty());
    plain.stop().await;
    running.stop().await;
}

/// `--response-headers ietf`: the IETF `RateLimit-Policy` and `RateLimit`
/// fields, a member per descriptor, written by tollgate-tower's formatter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_answers_carry_the_ietf_fields_when_asked() {
    let (running, mut client) = serve_api(answering_with(ResponseHeaders::Ietf)).await;
    let both = request(
        "api",
        vec![
            descriptor(&[("route", "upload")]),
            descriptor(&[("user", "heidi")]),
        ],
    );
    // Each member's `t`, checked against its window, and the rest as text.
    let fields = |answer: &RateLimitResponse| -> (String, Vec<String>) {
        let got: Vec<(&str, &str)> = answer
            .response_headers_to_add
            .iter()
            .map(|h| (h.key.as_str(), h.value.as_str()))
            .collect();
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!(got[0].0, "RateLimit-Policy");
        assert_eq!(got[1].0, "RateLimit");
        let states = got[1]
            .1
            .split(", ")
            .zip([3600, 60])
            .map(|(member, window)| {
                let (rest, t) = member.rsplit_once(";t=").unwrap();
                let t: u64 = t.parse().unwrap();
                assert!((1..=window).contains(&t), "{member}");
                rest.to_owned()
            })
            .collect();
        (got[0].1.to_owned(), states)
    };
    let answer = ask(&mut client, both.clone()).await;
    let (policy, states) = fields(&answer);
    assert_eq!(
        policy,
        r#""api.route_upload";q=100;w=3600, "api.user";q=3;w=60"#
    );
    assert_eq!(states, [r#""api.route_upload";r=99"#, r#""api.user";r=2"#]);
    for _ in 0..2 {
        client.should_rate_limit(both.clone()).await.unwrap();
    }
    // Refused by the user limit: 0 left; the route, charged nothing, 97.
    let refused = ask(&mut client, both).await;
    assert_eq!(refused.overall_code(), Code::OverLimit);
    let (_, states) = fields(&refused);
    assert_eq!(states, [r#""api.route_upload";r=97"#, r#""api.user";r=0"#]);
    running.stop().await;
}
