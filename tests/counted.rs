//! `Counted`: exact counts under contention, refunds counted when an `AllOf`
//! hands permits back, and (with the `tracing` feature) one event per
//! decision at the documented levels.

use std::sync::atomic::{AtomicU64, Ordering};

use tollgate::{
    AllOf, Counted, Denied, FixedWindow, ManualClock, Rate, RateLimiter, SlidingLog, TokenBucket,
};

/// Four threads decide through one `Counted` bucket with time frozen: the
/// counters equal what the threads saw, permit for permit, and the admitted
/// count is the bucket's capacity.
#[test]
fn counts_are_exact_under_contention() {
    let clock = ManualClock::new();
    let counted = Counted::new(
        "shared",
        TokenBucket::with_clock(1_000, Rate::per_hour(1_000), clock).unwrap(),
    );
    let (admitted, denied) = (AtomicU64::new(0), AtomicU64::new(0));
    std::thread::scope(|s| {
        for thread in 0..4u32 {
            let (counted, admitted, denied) = (&counted, &admitted, &denied);
            s.spawn(move || {
                for i in 0..500u32 {
                    let n = 1 + (thread + i) % 3;
                    match counted.try_acquire_n(n) {
                        Ok(()) => admitted.fetch_add(u64::from(n), Ordering::Relaxed),
                        Err(_) => denied.fetch_add(u64::from(n), Ordering::Relaxed),
                    };
                }
            });
        }
    });
    let counts = counted.counts();
    assert_eq!(counts.admitted, admitted.load(Ordering::Relaxed));
    assert_eq!(counts.denied, denied.load(Ordering::Relaxed));
    assert_eq!(
        counts.admitted,
        1_000 - u64::from(counted.snapshot().available)
    );
}

#[test]
fn every_decision_path_is_counted() {
    let clock = ManualClock::new();
    let window = Counted::new(
        "window",
        FixedWindow::with_clock(Rate::per_hour(10), clock.clone()).unwrap(),
    );
    let log = Counted::new(
        "log",
        SlidingLog::with_clock(Rate::per_hour(1), clock.clone()).unwrap(),
    );
    window.try_acquire_with_snapshot().unwrap();
    assert_eq!(
        window.try_acquire_n(11),
        Err(Denied::ExceedsCapacity {
            requested: 11,
            capacity: 10
        })
    );
    let both = AllOf::new((&window, &log));
    both.try_acquire().unwrap();
    // Denied by the log: the window is refunded, exactly (a count is a sum).
    assert!(both.try_acquire_n(2).is_err());
    let w = window.counts();
    assert_eq!((w.admitted, w.denied, w.refunded), (1 + 1 + 2, 11, 2));
    assert_eq!(window.snapshot().available, 8);
    let l = log.counts();
    assert_eq!((l.admitted, l.denied, l.refunded), (1, 2, 0));
}

#[cfg(feature = "tracing")]
mod with_tracing {
    use super::*;
    use std::sync::{Arc, Mutex};
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
}
