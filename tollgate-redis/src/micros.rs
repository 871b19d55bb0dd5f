//! Configurations in the scripts' unit: whole microseconds, below 2^51.

use std::time::Duration;

use tollgate::Rate;

use crate::error::ConfigError;

/// The longest time span a script handles: 2^51 µs, about 71 years. Server
/// time is below 2^51 µs until 2041, so sums of two spans and a time stay
/// below 2^53, where Lua's doubles are exact.
pub(crate) const MAX_SPAN: u64 = 1 << 51;

/// `(permits, period in µs)`, both non-zero, the period rounded up to a whole
/// microsecond (never a faster rate than asked), at most one permit per µs.
pub(crate) fn validate(rate: Rate) -> Result<(u32, u64), ConfigError> {
    let (permits, period) = (rate.permits(), rate.period());
    if permits == 0 {
        return Err(ConfigError::ZeroRate);
    }
    if period.is_zero() {
        return Err(ConfigError::ZeroPeriod);
    }
    let period_us = ceil_micros(period)
        .filter(|&us| us <= MAX_SPAN)
        .ok_or(ConfigError::TooLarge { what: "the period" })?;
    if period_us < u64::from(permits) {
        return Err(ConfigError::TooFine { permits, period });
    }
    Ok((permits, period_us))
}

/// A duration in whole microseconds, rounded up; `None` past `u64`.
pub(crate) fn ceil_micros(d: Duration) -> Option<u64> {
    u64::try_from(d.as_nanos().div_ceil(1000)).ok()
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
        assert!(matches!(
            validate(Rate::new(1, Duration::MAX)),
            Err(ConfigError::TooLarge { .. })
        ));
        assert!(matches!(
            validate(Rate::new(1, Duration::from_micros(MAX_SPAN + 1))),
            Err(ConfigError::TooLarge { .. })
        ));
    }
}
