//! Every configuration error, with its message, for every constructor.

use std::time::Duration;

use tollgate::MAX_SUB_WINDOWS;
use tollgate::{
    ConfigError, FixedWindow, LockingFixedWindow, LockingShaper, LockingTokenBucket, LockingWarmUp,
    ManualClock, Rate, Shaper, SlidingWindow, TokenBucket, WarmUp,
};
use tollgate::{DEFAULT_COLD_FACTOR, MAX_COLD_FACTOR};

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
        "1001 permits per 1µs is more than one permit per tick of the limiter's clock \
         (1 ns in process, 1 µs in Redis)"
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
        "the period overflows the limiter's time range (2^62 ns, about 146 years, in \
         process; 2^51 µs, about 71 years, in Redis)"
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

#[test]
fn invalid_sub_windows() {
    let build = |rate: Rate, subs: u32| {
        let builder = SlidingWindow::builder(rate)
            .sub_windows(subs)
            .clock(ManualClock::new());
        [
            builder.clone().build().map(drop),
            builder.build_locking().map(drop),
        ]
    };
    // Zero sub-windows would each last no time.
    let zero = ConfigError::InvalidSubWindows {
        sub_windows: 0,
        max: MAX_SUB_WINDOWS,
    };
    assert_eq!(build(Rate::per_second(5), 0), [Err(zero); 2]);
    assert_eq!(
        zero.to_string(),
        "0 sub-windows is outside 1..=4096: a sliding window has at most 4096 \
         sub-windows, none shorter than 1 ns per permit"
    );
    // More than the cap.
    let many = ConfigError::InvalidSubWindows {
        sub_windows: u32::MAX,
        max: MAX_SUB_WINDOWS,
    };
    assert_eq!(build(Rate::per_hour(1), u32::MAX), [Err(many); 2]);
    assert_eq!(
        many.to_string(),
        "4294967295 sub-windows is outside 1..=4096: a sliding window has at most 4096 \
         sub-windows, none shorter than 1 ns per permit"
    );
    // Sub-windows of 100 ns cannot hold 500 permits: at most 2 (of 500 ns).
    let rate = Rate::new(500, Duration::from_micros(1));
    let short = ConfigError::InvalidSubWindows {
        sub_windows: 10,
        max: 2,
    };
    assert_eq!(build(rate, 10), [Err(short); 2]);
    assert_eq!(
        short.to_string(),
        "10 sub-windows is outside 1..=2: a sliding window has at most 4096 \
         sub-windows, none shorter than 1 ns per permit"
    );
    assert_eq!(build(rate, 2), [Ok(()); 2]);
    assert_eq!(build(Rate::per_hour(1), MAX_SUB_WINDOWS), [Ok(()); 2]);
}

#[test]
fn invalid_cold_factor() {
    let build = |cold_factor: u32| {
        let (rate, warm_up) = (Rate::per_second(5), Duration::from_secs(4));
        [
            WarmUp::with_cold_factor(rate, warm_up, cold_factor, ManualClock::new()).map(drop),
            LockingWarmUp::with_cold_factor(rate, warm_up, cold_factor, ManualClock::new())
                .map(drop),
        ]
    };
    for bad in [0, MAX_COLD_FACTOR + 1, u32::MAX] {
        let err = ConfigError::InvalidColdFactor { cold_factor: bad };
        assert_eq!(build(bad), [Err(err); 2]);
        assert_eq!(
            err.to_string(),
            format!("cold factor {bad} is outside 1..=1000")
        );
    }
    for good in [1, DEFAULT_COLD_FACTOR, MAX_COLD_FACTOR] {
        assert_eq!(build(good), [Ok(()); 2]);
    }
}

/// Both limiters `build` makes accept `longest` and reject anything longer,
/// up to `Duration::MAX`, with `too_long` of it; the error for the first
/// duration past `longest` reads `message`.
fn assert_longest_is(
    build: impl Fn(Duration) -> [Result<(), ConfigError>; 2],
    longest: Duration,
    too_long: fn(Duration) -> ConfigError,
    message: &str,
) {
    assert_eq!(build(longest), [Ok(()); 2]);
    let over = longest + Duration::from_nanos(1);
    assert_eq!(build(over), [Err(too_long(over)); 2]);
    assert_eq!(too_long(over).to_string(), message);
    assert_eq!(build(Duration::MAX), [Err(too_long(Duration::MAX)); 2]);
}

#[test]
fn warm_up_too_long() {
    let build = |warm_up: Duration| {
        let rate = Rate::per_second(5);
        [
            WarmUp::with_clock(rate, warm_up, ManualClock::new()).map(drop),
            LockingWarmUp::with_clock(rate, warm_up, ManualClock::new()).map(drop),
        ]
    };
    assert_longest_is(
        build,
        Duration::from_nanos(1 << 52),
        |warm_up| ConfigError::WarmUpTooLong { warm_up },
        "a warm-up period of 4503599.627370497s is longer than 2^52 ns (about 52 days)",
    );
}

#[test]
fn max_wait_too_long() {
    let build = |max_wait: Duration| {
        let rate = Rate::per_hour(1);
        [
            Shaper::with_clock(rate, 0, max_wait, ManualClock::new()).map(drop),
            LockingShaper::with_clock(rate, 0, max_wait, ManualClock::new()).map(drop),
        ]
    };
    assert_longest_is(
        build,
        Duration::from_nanos(1 << 61),
        |max_wait| ConfigError::MaxWaitTooLong { max_wait },
        "a maximum wait of 2305843009.213693953s is longer than 2^61 ns (about 73 years)",
    );
}
