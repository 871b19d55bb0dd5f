//! `Counted` with the `tracing` feature: one event per decision, at the
//! documented levels.
//!
//! tracing caches each callsite's interest process-wide. When another
//! thread of the process, with no subscriber, is registering a decision's
//! callsite while this test installs its scoped subscriber, the callsite can
//! be cached as "never" after the subscriber's rebuild of the cache, and the
//! event goes missing: tracing's behaviour, not `Counted`'s, and it made
//! this test fail when it shared a process with the other tests (the
//! integration binary runs its tests side by side). So the test runs its
//! checks in a process of its own: the test re-executes this binary with
//! only itself selected, and the child, alone in its process, checks.
#![cfg(feature = "tracing")]

use std::process::Command;
use std::sync::{Arc, Mutex};
use tollgate::{Counted, ManualClock, Rate, RateLimiter, SlidingLog};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

/// Records the level and message of every event.
#[derive(Default, Clone)]
struct Recorder(Arc<Mutex<Vec<(Level, String)>>>);

struct Message<'a>(&'a mut String);

impl tracing::field::Visit for Message<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.push_str(&format!("{}={:?} ", field.name(), value));
    }
}

impl Subscriber for Recorder {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut text = String::new();
        event.record(&mut Message(&mut text));
        self.0
            .lock()
            .unwrap()
            .push((*event.metadata().level(), text));
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

/// Set in the child's environment: the checks run there.
const CHILD: &str = "TOLLGATE_COUNTED_TRACING_CHILD";

#[test]
fn one_event_per_decision_denials_at_info() {
    if std::env::var_os(CHILD).is_some() {
        return checks();
    }
    // The test's name inside the binary: this module's path without the
    // binary's own name.
    let module = module_path!().split_once("::").map_or("", |(_, rest)| rest);
    let name = format!("{module}::one_event_per_decision_denials_at_info");
    let child = Command::new(std::env::current_exe().expect("the test binary's path"))
        .args(["--exact", &name, "--test-threads", "1", "--nocapture"])
        .env(CHILD, "1")
        .output()
        .expect("the test binary runs again");
    let stdout = String::from_utf8_lossy(&child.stdout);
    let stderr = String::from_utf8_lossy(&child.stderr);
    assert!(
        child.status.success(),
        "the child failed:\n{stdout}\n{stderr}"
    );
    // A name that matched nothing would pass with no test run.
    assert!(
        stdout.contains("test result: ok. 1 passed"),
        "the child ran no test:\n{stdout}"
    );
}

/// The checks, alone in their process: no other thread registers the
/// decision's callsites.
fn checks() {
    let recorder = Recorder::default();
    let counted = Counted::new(
        "login",
        SlidingLog::with_clock(Rate::per_hour(1), ManualClock::new()).unwrap(),
    );
    tracing::subscriber::with_default(recorder.clone(), || {
        counted.try_acquire().unwrap();
        assert!(counted.try_acquire().is_err());
    });
    let events = recorder.0.lock().unwrap().clone();
    assert_eq!(events.len(), 2, "{events:?}");
    assert_eq!(events[0].0, Level::DEBUG);
    assert!(events[0].1.contains("admitted") && events[0].1.contains("limiter=\"login\""));
    assert_eq!(events[1].0, Level::INFO);
    assert!(
        events[1].1.contains("denied") && events[1].1.contains("retry_after=Some("),
        "{events:?}"
    );
}
