//! Reloads from a configuration directory: a changed file (in a
//! subdirectory too) is loaded, a malformed one is refused with its file and
//! line while the server keeps deciding with what it had, and a reload
//! keeps the state of the limits it did not change.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use support::{code, descriptor, request};
use tokio::sync::{Notify, mpsc};
use tollgate_server::config::Config;
use tollgate_server::proto::envoy::service::ratelimit::v3::RateLimitResponse;
use tollgate_server::proto::envoy::service::ratelimit::v3::rate_limit_response::Code;
use tollgate_server::{Options, Server, watch_config};

fn domain(limit: u32) -> String {
    format!(
        "domain: api\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: hour\n      requests_per_unit: {limit}\n"
    )
}

/// Waits for the next reload's report.
async fn next(
    reports: &mut mpsc::UnboundedReceiver<Result<(), String>>,
    what: &str,
) -> Result<(), String> {
    tokio::time::timeout(Duration::from_secs(20), reports.recv())
        .await
        .unwrap_or_else(|_| panic!("no reload within 20 s: {what}"))
        .expect("the watcher runs")
}

/// The requests per unit of the limit that decided `answer`'s first
/// descriptor: which configuration the server answered with.
fn requests_per_unit(answer: &RateLimitResponse) -> u32 {
    answer.statuses[0]
        .current_limit
        .as_ref()
        .unwrap()
        .requests_per_unit
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_file_reloads_and_a_malformed_one_is_refused() {
    let dir = std::env::temp_dir().join(format!("tollgate-reload-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("team")).unwrap();
    let file = dir.join("team").join("api.yaml");
    std::fs::write(&file, domain(3)).unwrap();
    let server = Server::new(Config::load_dir(&dir).unwrap(), Options::default()).unwrap();
    let (tx, mut reports) = mpsc::unbounded_channel();
    let signal = Arc::new(Notify::new());
    let watcher = tokio::spawn(watch_config(
        server.clone(),
        dir.clone(),
        Duration::from_millis(20),
        signal.clone(),
        move |result| {
            let _ = tx.send(result);
        },
    ));
    // The watcher has taken its first look once it answers a signal.
    signal.notify_one();
    assert_eq!(next(&mut reports, "the first signal").await, Ok(()));
    let alice = request("api", vec![descriptor(&[("user", "alice")])]);
    for _ in 0..3 {
        assert_eq!(code(&server, &alice).await, Code::Ok);
    }
    assert_eq!(code(&server, &alice).await, Code::OverLimit);

    // A file in a subdirectory rewritten: 3 of 3 used becomes 6 of 6
    // (carried over proportionally), so still refused; a fresh key has 6.
    std::fs::write(&file, domain(6)).unwrap();
    assert_eq!(next(&mut reports, "step 1").await, Ok(()));
    let answer = server.should_rate_limit(&alice).await.unwrap();
    assert_eq!(answer.overall_code(), Code::OverLimit);
    assert_eq!(requests_per_unit(&answer), 6);

    // A malformed file: refused with its file and line, the old
    // configuration kept.
    std::fs::write(&file, "domain: api\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 1\n").unwrap();
    let error = next(&mut reports, "step 2").await.unwrap_err();
    assert!(error.contains("api.yaml:5"), "{error}");
    let bob = request("api", vec![descriptor(&[("user", "bob")])]);
    let answer = server.should_rate_limit(&bob).await.unwrap();
    assert_eq!(requests_per_unit(&answer), 6);

    // A signal reloads without a change: the same text keeps every state.
    std::fs::write(&file, domain(6)).unwrap();
    assert_eq!(next(&mut reports, "step 3").await, Ok(()));
    signal.notify_one();
    assert_eq!(next(&mut reports, "step 4").await, Ok(()));
    assert_eq!(
        server.should_rate_limit(&bob).await.unwrap().statuses[0].limit_remaining,
        4
    );
    watcher.abort();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A file changed after the server loaded the directory but before the
/// watcher first looked at it is loaded when the watcher starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_before_the_watcher_starts_is_not_missed() {
    let dir = std::env::temp_dir().join(format!("tollgate-reload-early-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("api.yaml");
    std::fs::write(&file, domain(1)).unwrap();
    let server = Server::new(Config::load_dir(&dir).unwrap(), Options::default()).unwrap();
    std::fs::write(&file, domain(4)).unwrap();
    let (tx, mut reports) = mpsc::unbounded_channel();
    let _watcher = tokio::spawn(watch_config(
        server.clone(),
        dir.clone(),
        Duration::from_secs(3600),
        Arc::new(Notify::new()),
        move |result| {
            let _ = tx.send(result);
        },
    ));
    assert_eq!(next(&mut reports, "the start").await, Ok(()));
    let bob = request("api", vec![descriptor(&[("user", "bob")])]);
    let mut admitted = 0;
    for _ in 0..6 {
        if server.should_rate_limit(&bob).await.unwrap().overall_code() == Code::Ok {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 4);
    let _ = std::fs::remove_dir_all(&dir);
}
