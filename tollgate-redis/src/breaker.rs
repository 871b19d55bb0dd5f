//! The circuit breaker in front of Redis: after `threshold` failed calls in a
//! row it opens and no call is made for `cooldown`; then one probe is let
//! through, and its success closes it again. Only the leased limiter's
//! background task calls it, so it needs no synchronisation.

use std::time::{Duration, Instant};

/// Whether a call may go to Redis now.
#[derive(Debug)]
pub(crate) struct Breaker {
    threshold: u32,
    cooldown: Duration,
    failures: u32,
    open_until: Option<Instant>,
}

impl Breaker {
    pub(crate) fn new(threshold: u32, cooldown: Duration) -> Breaker {
        Breaker {
            threshold: threshold.max(1),
            cooldown,
            failures: 0,
            open_until: None,
        }
    }

    /// True when closed, or open with its cooldown over (a probe).
    pub(crate) fn allows(&self, now: Instant) -> bool {
        self.open_until.is_none_or(|until| now >= until)
    }

    /// True while calls fail: open, or probing after being open.
    pub(crate) fn is_open(&self) -> bool {
        self.open_until.is_some()
    }

    pub(crate) fn success(&mut self) {
        self.failures = 0;
        self.open_until = None;
    }

    pub(crate) fn failure(&mut self, now: Instant) {
        self.failures = self.failures.saturating_add(1);
        if self.failures >= self.threshold {
            self.open_until = Some(now + self.cooldown);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_threshold_and_probes_after_cooldown() {
        let t0 = Instant::now();
        let mut breaker = Breaker::new(2, Duration::from_millis(100));
        breaker.failure(t0);
        assert!(breaker.allows(t0) && !breaker.is_open());
        breaker.failure(t0);
        assert!(!breaker.allows(t0) && breaker.is_open());
        assert!(breaker.allows(t0 + Duration::from_millis(100)));
        breaker.failure(t0 + Duration::from_millis(100));
        assert!(!breaker.allows(t0 + Duration::from_millis(150)));
        breaker.success();
        assert!(breaker.allows(t0) && !breaker.is_open());
    }
}
