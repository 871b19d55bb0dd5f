//! `Counted` with the `tracing` feature: one event per decision, at the
//! documented levels.
//!
//! Its own test binary, with one test, so no other thread of the process
//! touches the same callsites while it runs: tracing caches each callsite's
//! interest process-wide, and another test's thread registering a callsite
//! without a subscriber, while this one has its scoped subscriber, made an
//! event go missing (40 runs in 300 of the binary when it shared
//! `tests/integration/counted.rs`; 0 in 300 since).
#![cfg(feature = "tracing")]

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

#[test]
fn one_event_per_decision_denials_at_info() {
    let recorder = Recorder::default();
    let counted = Counted::new(
        "login",
        SlidingLog::with_clock(Rate::per_hour(1), ManualClock::new()).unwrap(),
    );
    tracing::subscriber::with_default(recorder.clone(), || {
        // tracing caches each callsite's interest process-wide. Other tests of
        // this binary, on other threads and with no subscriber, may register
        // the decision's callsites first as "never"; re-evaluating them with
        // this subscriber live makes the events reach it whatever ran first.
        tracing::callsite::rebuild_interest_cache();
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
