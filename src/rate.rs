//! A rate: so many permits per period, and its string form (`"100/s"`).

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::error::ConfigError;
use crate::timeline::MAX_TIME;

/// So many permits per period: `Rate::per_second(100)`, `Rate::per_minute(30)`,
/// `Rate::new(5, Duration::from_millis(10))`, or from a string: `"100/s"`,
/// `"30/min"`, `"5/10ms"`, `"5 per second"` ([`FromStr`], grammar below).
///
/// Building a `Rate` never fails; the limiter that receives it validates it and
/// reports a [`ConfigError`] for a zero rate, a zero period, more than one permit
/// per nanosecond, or a period too long for the 62-bit time arithmetic.
///
/// # String form
///
/// ```text
/// rate   = permits sep period
/// sep    = "/" | "per"            ("per" between whitespace)
/// period = [count] unit           (count defaults to 1)
/// unit   = ns | nanosecond[s]
///        | us | µs | microsecond[s]
///        | ms | millisecond[s]
///        | s | sec[s] | second[s]
///        | m | min[s] | minute[s]
///        | h | hr[s] | hour[s]
///        | d | day[s]
/// ```
///
/// `permits` and `count` are unsigned decimal integers (ASCII digits only; no
/// sign, no fraction: write `"3/1500ms"`, not `"3/1.5s"`). Whitespace is allowed
/// around each part (`" 30 / 1 min "`), units are case-insensitive. Parsing
/// checks only the syntax and that the numbers fit: `permits` in a `u32`, the
/// period in a [`Duration`]. Like [`Rate::new`], it accepts a zero rate or a
/// zero period (`"0/s"`, `"5/0s"`); the limiter rejects them at construction
/// with a [`ConfigError`], as it does for rates built in code. Bad strings are a
/// [`ParseRateError`], never a panic.
///
/// [`Display`](fmt::Display) writes the canonical form, which parses back to an
/// equal `Rate`: the permits, `/`, and the period in the largest of `d`, `h`,
/// `min`, `s`, `ms`, `us`, `ns` that divides it exactly, its count left out when
/// it is 1.
///
/// ```
/// use std::time::Duration;
/// use tollgate::Rate;
///
/// let rate: Rate = "30/min".parse()?;
/// assert_eq!(rate, Rate::per_minute(30));
/// assert_eq!("5 per 10 ms".parse::<Rate>()?, Rate::new(5, Duration::from_millis(10)));
/// assert_eq!(Rate::new(7, Duration::from_secs(90)).to_string(), "7/90s");
/// assert_eq!(Rate::per_hour(1000).to_string(), "1000/h");
/// # Ok::<(), tollgate::ParseRateError>(())
/// ```
///
/// ```
/// use std::time::Duration;
/// use tollgate::Rate;
///
/// let rate = Rate::new(5, Duration::from_millis(10));
/// assert_eq!(rate.permits(), 5);
/// assert_eq!(rate.period(), Duration::from_millis(10));
/// assert_eq!(Rate::per_minute(30), Rate::new(30, Duration::from_secs(60)));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rate {
    permits: u32,
    period: Duration,
}

impl Rate {
    /// `permits` per `period`.
    ///
    /// ```
    /// use std::time::Duration;
    /// let rate = tollgate::Rate::new(100, Duration::from_secs(1));
    /// assert_eq!(rate, tollgate::Rate::per_second(100));
    /// ```
    pub const fn new(permits: u32, period: Duration) -> Rate {
        Rate { permits, period }
    }

    /// `permits` per second.
    ///
    /// ```
    /// assert_eq!(tollgate::Rate::per_second(7).permits(), 7);
    /// ```
    pub const fn per_second(permits: u32) -> Rate {
        Rate::new(permits, Duration::from_secs(1))
    }

    /// `permits` per minute.
    ///
    /// ```
    /// assert_eq!(tollgate::Rate::per_minute(30).period().as_secs(), 60);
    /// ```
    pub const fn per_minute(permits: u32) -> Rate {
        Rate::new(permits, Duration::from_secs(60))
    }

    /// `permits` per hour.
    ///
    /// ```
    /// assert_eq!(tollgate::Rate::per_hour(1000).period().as_secs(), 3600);
    /// ```
    pub const fn per_hour(permits: u32) -> Rate {
        Rate::new(permits, Duration::from_secs(3600))
    }

    /// Permits per period.
    ///
    /// ```
    /// assert_eq!(tollgate::Rate::per_hour(1000).permits(), 1000);
    /// ```
    pub const fn permits(&self) -> u32 {
        self.permits
    }

    /// The period.
    ///
    /// ```
    /// assert_eq!(tollgate::Rate::per_second(1).period(), std::time::Duration::from_secs(1));
    /// ```
    pub const fn period(&self) -> Duration {
        self.period
    }

    /// Checks the rate and returns `(permits, period in ns)`, both non-zero, with at
    /// most one permit per nanosecond and the period inside the time range.
    pub(crate) fn validate(&self) -> Result<(u32, u64), ConfigError> {
        self.validate_in(Duration::from_nanos(1), MAX_TIME)
    }

    /// Checks the rate for a clock that counts whole `tick`s and keeps spans of
    /// at most `max_ticks`, as every limiter does at construction, and returns
    /// `(permits, period in ticks)`: both non-zero, the period rounded up to a
    /// whole tick (so never a faster rate than asked), at most one permit per
    /// tick. For limiters that keep time in a coarser unit than the
    /// in-process nanosecond: tollgate-redis checks rates in microseconds,
    /// the resolution of Redis `TIME`. A zero `tick` counts as one nanosecond.
    ///
    /// Errors, in this order: [`ConfigError::ZeroRate`],
    /// [`ConfigError::ZeroPeriod`], [`ConfigError::Overflow`] (a period of
    /// more than `max_ticks` ticks), [`ConfigError::TooFine`] (fewer ticks
    /// than permits).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{ConfigError, Rate};
    ///
    /// let micros = Duration::from_micros(1);
    /// assert_eq!(Rate::per_minute(30).validate_in(micros, 1 << 51), Ok((30, 60_000_000)));
    /// // 1001 ns rounds up to 2 µs.
    /// assert_eq!(Rate::new(1, Duration::from_nanos(1_001)).validate_in(micros, 1 << 51), Ok((1, 2)));
    /// assert!(matches!(
    ///     Rate::new(2, micros).validate_in(micros, 1 << 51),
    ///     Err(ConfigError::TooFine { permits: 2, .. })
    /// ));
    /// assert_eq!(
    ///     Rate::new(1, Duration::MAX).validate_in(micros, 1 << 51),
    ///     Err(ConfigError::Overflow { what: "the period" })
    /// );
    /// ```
    pub fn validate_in(&self, tick: Duration, max_ticks: u64) -> Result<(u32, u64), ConfigError> {
        if self.permits == 0 {
            return Err(ConfigError::ZeroRate);
        }
        if self.period.is_zero() {
            return Err(ConfigError::ZeroPeriod);
        }
        let tick_ns = tick.as_nanos().max(1);
        let period = u64::try_from(self.period.as_nanos().div_ceil(tick_ns))
            .ok()
            .filter(|&ticks| ticks <= max_ticks)
            .ok_or(ConfigError::Overflow { what: "the period" })?;
        if period < u64::from(self.permits) {
            return Err(ConfigError::TooFine {
                permits: self.permits,
                period: self.period,
            });
        }
        Ok((self.permits, period))
    }
}

/// Nanoseconds in each unit the canonical form uses, largest first.
const CANONICAL_UNITS: [(&str, u128); 7] = [
    ("d", 86_400 * NANOS_PER_SEC),
    ("h", 3_600 * NANOS_PER_SEC),
    ("min", 60 * NANOS_PER_SEC),
    ("s", NANOS_PER_SEC),
    ("ms", 1_000_000),
    ("us", 1_000),
    ("ns", 1),
];

const NANOS_PER_SEC: u128 = 1_000_000_000;

/// The units the parser knows, in nanoseconds, by their lower-case spellings.
fn unit_nanos(unit: &str) -> Option<u128> {
    let unit = unit.to_lowercase();
    let nanos = match unit.as_str() {
        "ns" | "nanosecond" | "nanoseconds" => 1,
        "us" | "µs" | "μs" | "microsecond" | "microseconds" => 1_000,
        "ms" | "millisecond" | "milliseconds" => 1_000_000,
        "s" | "sec" | "secs" | "second" | "seconds" => NANOS_PER_SEC,
        "m" | "min" | "mins" | "minute" | "minutes" => 60 * NANOS_PER_SEC,
        "h" | "hr" | "hrs" | "hour" | "hours" => 3_600 * NANOS_PER_SEC,
        "d" | "day" | "days" => 86_400 * NANOS_PER_SEC,
        _ => return None,
    };
    Some(nanos)
}

/// Writes the canonical form: `"100/s"`, `"30/min"`, `"5/10ms"`, `"7/90s"`. It
/// parses back to an equal `Rate` (see [`Rate`]'s string form).
///
/// ```
/// use std::time::Duration;
/// use tollgate::Rate;
///
/// assert_eq!(Rate::per_second(100).to_string(), "100/s");
/// assert_eq!(Rate::new(2, Duration::from_micros(500)).to_string(), "2/500us");
/// let odd = Rate::new(3, Duration::new(1, 1));
/// assert_eq!(odd.to_string(), "3/1000000001ns");
/// assert_eq!(odd.to_string().parse::<Rate>(), Ok(odd));
/// ```
impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let nanos = self.period.as_nanos();
        if nanos == 0 {
            return write!(f, "{}/0s", self.permits);
        }
        // "ns" divides every period, so the search always ends.
        let (unit, size) = CANONICAL_UNITS
            .into_iter()
            .find(|&(_, size)| nanos % size == 0)
            .unwrap_or(("ns", 1));
        match nanos / size {
            1 => write!(f, "{}/{unit}", self.permits),
            count => write!(f, "{}/{count}{unit}", self.permits),
        }
    }
}

/// Parses `"100/s"`, `"30/min"`, `"5/10ms"`, `"5 per second"` — the grammar is
/// on [`Rate`].
///
/// ```
/// use std::time::Duration;
/// use tollgate::{ParseRateErrorKind, Rate};
///
/// assert_eq!("100/s".parse(), Ok(Rate::per_second(100)));
/// assert_eq!("1000 / 1 hour".parse(), Ok(Rate::per_hour(1000)));
/// assert_eq!("2/500µs".parse(), Ok(Rate::new(2, Duration::from_micros(500))));
///
/// let err = "100 per fortnight".parse::<Rate>().unwrap_err();
/// assert_eq!(err.kind(), ParseRateErrorKind::UnknownUnit);
/// ```
impl FromStr for Rate {
    type Err = ParseRateError;

    fn from_str(input: &str) -> Result<Rate, ParseRateError> {
        let fail = |kind, part: &str| ParseRateError {
            kind,
            input: input.to_owned(),
            part: part.to_owned(),
        };
        if input.trim().is_empty() {
            return Err(fail(ParseRateErrorKind::Empty, ""));
        }
        let (permits, period) =
            split_rate(input).ok_or_else(|| fail(ParseRateErrorKind::MissingSeparator, ""))?;
        let permits = permits.trim();
        let permits = match parse_digits(permits) {
            Some(Ok(value)) => u32::try_from(value)
                .map_err(|_| fail(ParseRateErrorKind::PermitsOverflow, permits))?,
            Some(Err(Overflow)) => return Err(fail(ParseRateErrorKind::PermitsOverflow, permits)),
            None => return Err(fail(ParseRateErrorKind::InvalidPermits, permits)),
        };
        let period_part = period.trim();
        let digits_end = period_part
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(period_part.len());
        let (count, unit) = period_part.split_at(digits_end);
        let unit = unit.trim();
        if unit.is_empty() {
            return Err(fail(ParseRateErrorKind::MissingUnit, period_part));
        }
        let size = unit_nanos(unit).ok_or_else(|| fail(ParseRateErrorKind::UnknownUnit, unit))?;
        let count = match parse_digits(count) {
            Some(Ok(count)) => count,
            None => 1, // no count: one unit
            Some(Err(Overflow)) => {
                return Err(fail(ParseRateErrorKind::PeriodOverflow, period_part));
            }
        };
        let period = count
            .checked_mul(size)
            .and_then(|nanos| {
                let secs = u64::try_from(nanos / NANOS_PER_SEC).ok()?;
                // The remainder is below 10^9, so it fits a u32.
                Some(Duration::new(secs, (nanos % NANOS_PER_SEC) as u32))
            })
            .ok_or_else(|| fail(ParseRateErrorKind::PeriodOverflow, period_part))?;
        Ok(Rate::new(permits, period))
    }
}

/// A number with more digits than a `u128` holds.
struct Overflow;

/// `None` unless `s` is one or more ASCII digits; then its value, or `Overflow`.
fn parse_digits(s: &str) -> Option<Result<u128, Overflow>> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(s.bytes().try_fold(0u128, |acc, b| {
        acc.checked_mul(10)
            .and_then(|acc| acc.checked_add(u128::from(b - b'0')))
            .ok_or(Overflow)
    }))
}

/// Splits at the first `/`, or else at a whitespace-delimited `per`.
fn split_rate(input: &str) -> Option<(&str, &str)> {
    if let Some(slash) = input.find('/') {
        return Some((&input[..slash], &input[slash + 1..]));
    }
    input.split_whitespace().find_map(|word| {
        // `word` is a subslice of `input`: its offset is the pointer difference.
        let at = word.as_ptr() as usize - input.as_ptr() as usize;
        word.eq_ignore_ascii_case("per")
            .then(|| (&input[..at], &input[at + word.len()..]))
    })
}

/// A string that is not a rate: [`Rate`]'s [`FromStr`] says what is wrong with it.
///
/// Its message quotes the input and the part at fault; [`kind`](Self::kind)
/// tells the cases apart in code.
///
/// ```
/// use tollgate::{ParseRateErrorKind, Rate};
///
/// let err = "100".parse::<Rate>().unwrap_err();
/// assert_eq!(err.kind(), ParseRateErrorKind::MissingSeparator);
/// assert_eq!(
///     err.to_string(),
///     "invalid rate \"100\": no '/' or \"per\" between the permits and the period \
///      (expected e.g. \"100/s\", \"30/min\", \"5/10ms\", \"5 per second\")"
/// );
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseRateError {
    kind: ParseRateErrorKind,
    input: String,
    part: String,
}

impl ParseRateError {
    /// What is wrong with the string.
    ///
    /// ```
    /// use tollgate::{ParseRateErrorKind, Rate};
    ///
    /// let err = "5000000000/s".parse::<Rate>().unwrap_err();
    /// assert_eq!(err.kind(), ParseRateErrorKind::PermitsOverflow);
    /// ```
    pub fn kind(&self) -> ParseRateErrorKind {
        self.kind
    }
}

/// What is wrong with a rate string: the cases of a [`ParseRateError`].
///
/// ```
/// use tollgate::{ParseRateErrorKind, Rate};
///
/// let kind = |s: &str| s.parse::<Rate>().unwrap_err().kind();
/// assert_eq!(kind("  "), ParseRateErrorKind::Empty);
/// assert_eq!(kind("100 a second"), ParseRateErrorKind::MissingSeparator);
/// assert_eq!(kind("lots/s"), ParseRateErrorKind::InvalidPermits);
/// assert_eq!(kind("-1/s"), ParseRateErrorKind::InvalidPermits);
/// assert_eq!(kind("4294967296/s"), ParseRateErrorKind::PermitsOverflow);
/// assert_eq!(kind("100/10"), ParseRateErrorKind::MissingUnit);
/// assert_eq!(kind("3/1.5s"), ParseRateErrorKind::UnknownUnit);
/// assert_eq!(kind("1/99999999999999999999999d"), ParseRateErrorKind::PeriodOverflow);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ParseRateErrorKind {
    /// The string is empty or only whitespace.
    Empty,
    /// Neither `/` nor a whitespace-delimited `per` separates the permits from
    /// the period.
    MissingSeparator,
    /// The permits are not an unsigned decimal integer.
    InvalidPermits,
    /// The permits are more than `u32::MAX`.
    PermitsOverflow,
    /// The period has no unit (`"100/10"`).
    MissingUnit,
    /// The period's unit is not one of the known units, or the period is not
    /// an integer count followed by a unit (`"3/1.5s"`).
    UnknownUnit,
    /// The period is longer than a [`Duration`] can hold.
    PeriodOverflow,
}

impl fmt::Display for ParseRateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ParseRateError { input, part, .. } = self;
        write!(f, "invalid rate {input:?}: ")?;
        match self.kind {
            ParseRateErrorKind::Empty => f.write_str("the string is empty"),
            ParseRateErrorKind::MissingSeparator => f.write_str(
                "no '/' or \"per\" between the permits and the period (expected e.g. \
                 \"100/s\", \"30/min\", \"5/10ms\", \"5 per second\")",
            ),
            ParseRateErrorKind::InvalidPermits => {
                write!(
                    f,
                    "the permits {part:?} are not an unsigned decimal integer"
                )
            }
            ParseRateErrorKind::PermitsOverflow => {
                write!(f, "the permits {part} are more than {}", u32::MAX)
            }
            ParseRateErrorKind::MissingUnit => write!(
                f,
                "the period {part:?} has no unit (ns, us, ms, s, min, h or d)"
            ),
            ParseRateErrorKind::UnknownUnit => write!(
                f,
                "{part:?} is not a unit (ns, us, µs, ms, s, sec, m, min, h, hour, d, day, \
                 or a plural; counts are integers: \"1500ms\", not \"1.5s\")"
            ),
            ParseRateErrorKind::PeriodOverflow => {
                write!(f, "the period {part:?} is longer than a Duration can hold")
            }
        }
    }
}

impl std::error::Error for ParseRateError {}

/// With the `serde` feature, a `Rate` serializes as its canonical string
/// (`"100/s"`, see [`Display`](fmt::Display)) and deserializes from any string
/// its [`FromStr`] accepts; a bad string is a deserialization error carrying
/// the [`ParseRateError`] message.
///
/// ```
/// use tollgate::Rate;
///
/// assert_eq!(serde_json::to_string(&Rate::per_minute(30)).unwrap(), r#""30/min""#);
/// let rate: Rate = serde_json::from_str(r#""5 per second""#).unwrap();
/// assert_eq!(rate, Rate::per_second(5));
/// assert!(serde_json::from_str::<Rate>(r#""5 a second""#).is_err());
/// ```
#[cfg(feature = "serde")]
impl serde::Serialize for Rate {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// Deserializes a [`Rate`] from its string form; see [`Rate`]'s `Serialize`.
///
/// ```
/// use tollgate::Rate;
///
/// let rates: Vec<Rate> = serde_json::from_str(r#"["100/s", "30/min", "5/10ms"]"#).unwrap();
/// assert_eq!(rates[1], Rate::per_minute(30));
/// let err = serde_json::from_str::<Rate>(r#""100/10""#).unwrap_err();
/// assert!(err.to_string().starts_with(r#"invalid rate "100/10": the period "10" has no unit"#));
/// ```
#[cfg(feature = "serde")]
impl<'de> serde::Deserialize<'de> for Rate {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Rate, D::Error> {
        struct RateVisitor;

        impl serde::de::Visitor<'_> for RateVisitor {
            type Value = Rate;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a rate string such as \"100/s\", \"30/min\" or \"5/10ms\"")
            }

            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Rate, E> {
                s.parse().map_err(E::custom)
            }
        }

        deserializer.deserialize_str(RateVisitor)
    }
}
