//! A client of another implementation over loopback: Python's grpcio, with
//! the messages compiled from this crate's `.proto` files by grpcio-tools
//! (protoc's parser, not protox) and read and written by protobuf's own JSON
//! mapping — so neither the wire format nor the `/json` endpoint's mapping is
//! only checked against itself. Needs `python3` with `grpcio` and
//! `grpcio-tools` (`scripts/install-grpcio`); without them the test fails
//! and says so.

use crate::support;

use std::io::Write;
use std::process::{Command, Stdio};

use serde_json::{Value, json};
use support::{Running, config};
use tollgate_server::Options;

const API: &str = "
domain: api
descriptors:
  - key: user
    rate_limit:
      unit: minute
      requests_per_unit: 2
  - key: route
    value: upload
    rate_limit:
      name: uploads
      unit: hour
      requests_per_unit: 100
";

/// Runs the Python client on `requests` (one JSON request each) against
/// `target`, returning its answer lines.
fn python(target: &str, requests: &[Value]) -> Vec<Value> {
    let dir = env!("CARGO_MANIFEST_DIR");
    let mut child = Command::new("python3")
        .arg(format!("{dir}/tests/python/client.py"))
        .arg(format!("{dir}/proto/third_party"))
        .arg(target)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 runs");
    {
        let mut stdin = child.stdin.take().unwrap();
        for r in requests {
            writeln!(stdin, "{r}").unwrap();
        }
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the Python client failed (is grpcio installed? scripts/install-grpcio):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// An answer without its waits, which depend on when it was decided.
fn timeless(mut answer: Value) -> Value {
    if let Some(statuses) = answer["statuses"].as_array_mut() {
        for s in statuses {
            s.as_object_mut().unwrap().remove("durationUntilReset");
        }
    }
    answer
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpcio_client_gets_the_answers_the_json_endpoint_gives() {
    let running = Running::start(config(&[API]), Options::default()).await;
    let target = running.grpc.to_string();
    let request = |user: &str| {
        json!({"domain": "api", "descriptors": [
            {"entries": [{"key": "route", "value": "upload"}]},
            {"entries": [{"key": "user", "value": user}]},
        ]})
    };
    let bad = [
        json!({"domain": "", "descriptors": [{"entries": [{"key": "user", "value": "x"}]}]}),
        json!({"domain": "api"}),
    ];
    let mut sent: Vec<Value> = (0..3).map(|_| request("alice")).collect();
    sent.extend(bad.iter().cloned());
    let grpcio = tokio::task::spawn_blocking(move || python(&target, &sent))
        .await
        .unwrap();
    assert_eq!(grpcio.len(), 5, "{grpcio:?}");
    // Two admitted, the third refused by the user limit; uploads charged
    // twice only.
    let expected = |code: &str, upload_left: u64, user_code: &str, user_left: u64| {
        let mut user =
            json!({"code": user_code, "currentLimit": {"requestsPerUnit": 2, "unit": "MINUTE"}});
        if user_left > 0 {
            user["limitRemaining"] = json!(user_left);
        }
        json!({"overallCode": code, "statuses": [
            {"code": "OK", "currentLimit": {"name": "uploads", "requestsPerUnit": 100, "unit": "HOUR"}, "limitRemaining": upload_left},
            user,
        ]})
    };
    assert_eq!(timeless(grpcio[0].clone()), expected("OK", 99, "OK", 1));
    assert_eq!(timeless(grpcio[1].clone()), expected("OK", 98, "OK", 0));
    assert_eq!(
        timeless(grpcio[2].clone()),
        expected("OVER_LIMIT", 98, "OVER_LIMIT", 0)
    );
    for answer in &grpcio[..3] {
        for status in answer["statuses"].as_array().unwrap() {
            let wait = status["durationUntilReset"].as_str().unwrap();
            assert!(wait.ends_with('s'), "{wait}");
        }
    }
    assert_eq!(grpcio[3]["grpc_error"], "INVALID_ARGUMENT");
    assert_eq!(grpcio[4]["grpc_error"], "INVALID_ARGUMENT");

    // The JSON endpoint, fed the same request for another user, answers
    // what protobuf's own JSON mapping wrote for the gRPC answers.
    let http = reqwest::Client::new();
    let url = format!("http://{}/json", running.http);
    for (i, grpc_answer) in grpcio[..3].iter().enumerate() {
        let response = http
            .post(&url)
            .body(request("bob").to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), if i < 2 { 200 } else { 429 });
        let mut ours: Value = response.json().await.unwrap();
        // Bob's requests charge uploads too: compare everything but that.
        let mut theirs = timeless(grpc_answer.clone());
        ours = timeless(ours);
        ours["statuses"][0]["limitRemaining"] = Value::Null;
        theirs["statuses"][0]["limitRemaining"] = Value::Null;
        assert_eq!(ours, theirs, "request {i}");
    }
    running.stop().await;
}
