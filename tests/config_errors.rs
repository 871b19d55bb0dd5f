//! Every configuration error, with its message, for every constructor.

use std::time::Duration;

use tollgate::{
    ConfigError, FixedWindow, LockingFixedWindow, LockingTokenBucket, ManualClock, Rate,
    TokenBucket,
};

/// Builds every limiter kind from `(capacity, rate)`; the windows ignore capacity.
fn errors(capacity: u32, rate: Rate) -> [Result<(), ConfigError>; 4] {
    let clock = ManualClock::new();
    [
        TokenBucket::with_clock(capacity, rate, clock.clone()).map(drop),
        LockingTokenBucket::with_clock(capacity, rate, clock.clone()).map(drop),
        FixedWindow::with_clock(rate, clock.clone()).map(drop),
        LockingFixedWindow::with_clock(rate, clock).map(drop),
    ]
}

#[test]
fn zero_rate() {
    let err = ConfigError::ZeroRate;
    assert_eq!(errors(1, Rate::per_second(0)), [Err(err); 4]);
    assert_eq!(
        err.to_string(),
        "rate must admit at least 1 permit per period"
    );
}

#[test]
fn zero_period() {
    let err = ConfigError::ZeroPeriod;
    assert_eq!(errors(1, Rate::new(5, Duration::ZERO)), [Err(err); 4]);
    assert_eq!(err.to_string(), "rate period must be longer than zero");
}

#[test]
fn zero_capacity() {
    let [atomic, twin, window, window_twin] = errors(0, Rate::per_second(5));
    assert_eq!(atomic, Err(ConfigError::ZeroCapacity));
    assert_eq!(twin, Err(ConfigError::ZeroCapacity));
    assert_eq!((window, window_twin), (Ok(()), Ok(())));
    assert_eq!(
        ConfigError::ZeroCapacity.to_string(),
        "capacity must be at least 1 permit"
    );
}

#[test]
fn more_than_one_permit_per_nanosecond() {
    let rate = Rate::new(1_001, Duration::from_micros(1));
    let err = ConfigError::TooFine {
        permits: 1_001,
        period: Duration::from_micros(1),
    };
    assert_eq!(errors(1, rate), [Err(err); 4]);
    assert_eq!(
        err.to_string(),
        "1001 permits per 1µs is more than one permit per nanosecond"
    );
    // Exactly one per nanosecond is fine.
    assert_eq!(
        errors(1, Rate::new(1_000, Duration::from_micros(1))),
        [Ok(()); 4]
    );
}

#[test]
fn arithmetic_overflow() {
    let err = ConfigError::Overflow { what: "the period" };
    assert_eq!(errors(1, Rate::new(1, Duration::MAX)), [Err(err); 4]);
    assert_eq!(
        err.to_string(),
        "the period overflows the limiter's time range (2^62 ns, about 146 years)"
    );
    // 4 billion permits at one per hour take 490,000 years to refill.
    let [atomic, twin, window, window_twin] = errors(u32::MAX, Rate::per_hour(1));
    let refill = Err(ConfigError::Overflow {
        what: "capacity × time per permit",
    });
    assert_eq!((atomic, twin), (refill, refill));
    assert_eq!((window, window_twin), (Ok(()), Ok(())));
    // The largest period that fits, and one past it.
    let max = Duration::from_nanos(1 << 62);
    assert_eq!(errors(1, Rate::new(1, max)), [Ok(()); 4]);
    assert_eq!(
        errors(1, Rate::new(1, max + Duration::from_nanos(1))),
        [Err(err); 4]
    );
}
