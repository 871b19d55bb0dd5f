//! Configurations in the scripts' unit: whole microseconds, below 2^51.

use std::time::Duration;

use tollgate::{ConfigError, Rate};

/// The longest time span a script handles: 2^51 µs, about 71 years. Server
/// time is below 2^51 µs until 2041, so sums of two spans and a time stay
/// below 2^53, where Lua's doubles are exact.
pub(crate) const MAX_SPAN: u64 = 1 << 51;

/// `(permits, period in µs)`, checked by the core's rules at Redis `TIME`'s
/// resolution: both non-zero, the period rounded up to a whole microsecond
/// (never a faster rate than asked) and at most [`MAX_SPAN`], at most one
/// permit per µs.
pub(crate) fn validate(rate: Rate) -> Result<(u32, u64), ConfigError> {
    rate.validate_in(Duration::from_micros(1), MAX_SPAN)
}

/// A span in whole microseconds, rounded up, at most [`MAX_SPAN`]; else
/// [`ConfigError::Overflow`] naming `what`.
pub(crate) fn span(d: Duration, what: &'static str) -> Result<u64, ConfigError> {
    u64::try_from(d.as_nanos().div_ceil(1000))
        .ok()
        .filter(|&us| us <= MAX_SPAN)
        .ok_or(ConfigError::Overflow { what })
}

/// `a × b` if it is at most [`MAX_SPAN`]; else [`ConfigError::Overflow`]
/// naming `what`.
pub(crate) fn product(a: u64, b: u64, what: &'static str) -> Result<u64, ConfigError> {
    a.checked_mul(b)
        .filter(|&product| product <= MAX_SPAN)
        .ok_or(ConfigError::Overflow { what })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_round_up_to_whole_microseconds() {
        assert_eq!(
            validate(Rate::new(1, Duration::from_nanos(1_001))),
            Ok((1, 2))
        );
        assert_eq!(validate(Rate::per_minute(30)), Ok((30, 60_000_000)));
    }

    #[test]
    fn bad_rates_are_errors() {
        assert_eq!(validate(Rate::per_second(0)), Err(ConfigError::ZeroRate));
        assert_eq!(
            validate(Rate::new(1, Duration::ZERO)),
            Err(ConfigError::ZeroPeriod)
        );
        assert!(matches!(
            validate(Rate::new(2, Duration::from_micros(1))),
            Err(ConfigError::TooFine { .. })
        ));
        let period = Err(ConfigError::Overflow { what: "the period" });
        assert_eq!(validate(Rate::new(1, Duration::MAX)), period);
        assert_eq!(
            validate(Rate::new(1, Duration::from_micros(MAX_SPAN + 1))),
            period
        );
        assert_eq!(
            validate(Rate::new(1, Duration::from_micros(MAX_SPAN))),
            Ok((1, MAX_SPAN))
        );
    }

    #[test]
    fn spans_and_products_stay_below_max_span() {
        assert_eq!(span(Duration::from_nanos(1_001), "x"), Ok(2));
        assert_eq!(
            span(Duration::MAX, "x"),
            Err(ConfigError::Overflow { what: "x" })
        );
        assert_eq!(product(1 << 25, 1 << 26, "y"), Ok(MAX_SPAN));
        assert_eq!(
            product(1 << 26, 1 << 26, "y"),
            Err(ConfigError::Overflow { what: "y" })
        );
        assert_eq!(
            product(u64::MAX, 2, "y"),
            Err(ConfigError::Overflow { what: "y" })
        );
    }
}
