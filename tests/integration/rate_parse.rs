//! `Rate`'s string form: the examples of the grammar, the errors, no panic on
//! any string, and `Display` → `FromStr` round trips; `serde` with the feature.

use std::time::Duration;

use proptest::prelude::*;
use tollgate::{ConfigError, ParseRateErrorKind, Rate, TokenBucket};

fn parse(s: &str) -> Result<Rate, ParseRateErrorKind> {
    s.parse::<Rate>().map_err(|e| e.kind())
}

#[test]
fn the_grammar_examples_parse() {
    let ms = Duration::from_millis;
    for (input, rate) in [
        ("100/s", Rate::per_second(100)),
        ("30/min", Rate::per_minute(30)),
        ("30/m", Rate::per_minute(30)),
        ("1000/h", Rate::per_hour(1000)),
        ("5/10ms", Rate::new(5, ms(10))),
        ("5 per second", Rate::per_second(5)),
        ("5 PER 10 Seconds", Rate::new(5, Duration::from_secs(10))),
        ("100/1s", Rate::per_second(100)),
        ("2/500us", Rate::new(2, Duration::from_micros(500))),
        ("2/500µs", Rate::new(2, Duration::from_micros(500))),
        ("2/500μs", Rate::new(2, Duration::from_micros(500))),
        ("7/3ns", Rate::new(7, Duration::from_nanos(3))),
        (" 30 / 1 min ", Rate::per_minute(30)),
        ("\t1\n/\nsec", Rate::per_second(1)),
        ("10/2days", Rate::new(10, Duration::from_secs(2 * 86_400))),
        (
            "4294967295/d",
            Rate::new(u32::MAX, Duration::from_secs(86_400)),
        ),
        ("007/0010s", Rate::new(7, Duration::from_secs(10))),
        // Syntax only: zero rates and periods parse, and the limiter rejects them.
        ("0/s", Rate::per_second(0)),
        ("5/0s", Rate::new(5, Duration::ZERO)),
    ] {
        assert_eq!(parse(input), Ok(rate), "{input:?}");
    }
}

#[test]
fn zero_rates_parse_but_limiters_reject_them() {
    let zero: Rate = "0/s".parse().unwrap();
    assert_eq!(
        TokenBucket::new(1, zero).unwrap_err(),
        ConfigError::ZeroRate
    );
    let instant: Rate = "5/0ms".parse().unwrap();
    assert_eq!(
        TokenBucket::new(1, instant).unwrap_err(),
        ConfigError::ZeroPeriod
    );
}

#[test]
fn bad_strings_say_what_is_wrong() {
    use ParseRateErrorKind::*;
    for (input, kind) in [
        ("", Empty),
        (" \t ", Empty),
        ("100", MissingSeparator),
        ("100 a second", MissingSeparator),
        ("5persecond", MissingSeparator),
        ("/s", InvalidPermits),
        ("per s", InvalidPermits),
        ("+5/s", InvalidPermits),
        ("-5/s", InvalidPermits),
        ("1.5/s", InvalidPermits),
        ("1 000/s", InvalidPermits),
        ("4294967296/s", PermitsOverflow),
        (
            "999999999999999999999999999999999999999999/s",
            PermitsOverflow,
        ),
        ("5/", MissingUnit),
        ("5/10", MissingUnit),
        ("5 per ", MissingUnit),
        ("5/10 fortnights", UnknownUnit),
        ("3/1.5s", UnknownUnit),
        ("3/-1s", UnknownUnit),
        ("5/10/s", UnknownUnit),
        ("5/s s", UnknownUnit),
        ("1/18446744073709551616s", PeriodOverflow),
        (
            "1/999999999999999999999999999999999999999999ns",
            PeriodOverflow,
        ),
    ] {
        assert_eq!(parse(input), Err(kind), "{input:?}");
    }
    // The longest period that parses: Duration::MAX, written in nanoseconds.
    let max = format!("1/{}ns", Duration::MAX.as_nanos());
    assert_eq!(parse(&max), Ok(Rate::new(1, Duration::MAX)));
}

#[test]
fn messages_quote_the_input_and_the_part_at_fault() {
    let msg = |s: &str| s.parse::<Rate>().unwrap_err().to_string();
    assert_eq!(msg(""), "invalid rate \"\": the string is empty");
    assert_eq!(
        msg("lots/s"),
        "invalid rate \"lots/s\": the permits \"lots\" are not an unsigned decimal integer"
    );
    assert_eq!(
        msg("5000000000/s"),
        "invalid rate \"5000000000/s\": the permits 5000000000 are more than 4294967295"
    );
    assert_eq!(
        msg("5 / 10"),
        "invalid rate \"5 / 10\": the period \"10\" has no unit (ns, us, ms, s, min, h or d)"
    );
    assert!(msg("3/1.5s").starts_with("invalid rate \"3/1.5s\": \".5s\" is not a unit"));
    assert_eq!(
        msg("1/99999999999999999999999d"),
        "invalid rate \"1/99999999999999999999999d\": the period \"99999999999999999999999d\" \
         is longer than a Duration can hold"
    );
}

#[test]
fn display_is_canonical() {
    for (rate, text) in [
        (Rate::per_second(100), "100/s"),
        (Rate::per_minute(30), "30/min"),
        (Rate::per_hour(1000), "1000/h"),
        (Rate::new(1, Duration::from_secs(86_400)), "1/d"),
        (Rate::new(1, Duration::from_secs(2 * 86_400)), "1/2d"),
        (Rate::new(7, Duration::from_secs(90)), "7/90s"),
        (Rate::new(5, Duration::from_millis(10)), "5/10ms"),
        (Rate::new(3, Duration::from_millis(1500)), "3/1500ms"),
        (Rate::new(2, Duration::from_micros(500)), "2/500us"),
        (Rate::new(2, Duration::from_nanos(1)), "2/ns"),
        (Rate::new(0, Duration::ZERO), "0/0s"),
    ] {
        assert_eq!(rate.to_string(), text);
    }
}

/// Durations over the whole range, and a share of round ones so that every
/// unit of the canonical form is exercised.
fn durations() -> impl Strategy<Value = Duration> {
    prop_oneof![
        (any::<u64>(), 0u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n)),
        (
            0u64..1_000_000,
            prop::sample::select(vec![1u64, 1_000, 1_000_000])
        )
            .prop_map(|(count, unit)| Duration::from_nanos(count * unit)),
        (
            0u64..1_000_000,
            prop::sample::select(vec![1u64, 60, 3_600, 86_400])
        )
            .prop_map(|(count, unit)| Duration::from_secs(count * unit)),
    ]
}

/// Strings near the grammar: digits, separators, units and noise.
fn near_rates() -> impl Strategy<Value = String> {
    let piece = prop::sample::select(vec![
        "0",
        "1",
        "7",
        "10",
        "4294967295",
        "4294967296",
        "99999999999999999999999999999999999999999",
        "/",
        " per ",
        "per",
        " ",
        "\t",
        "s",
        "ms",
        "µs",
        "μs",
        "us",
        "ns",
        "min",
        "m",
        "h",
        "d",
        "day",
        "seconds",
        ".",
        "-",
        "+",
        "é",
        "\u{0}",
        "\u{1F600}",
    ]);
    prop::collection::vec(piece, 0..8).prop_map(|pieces| pieces.concat())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    /// No string panics the parser; an error always has a message.
    #[test]
    fn any_string_parses_or_errs_without_panicking(s in any::<String>()) {
        if let Err(e) = s.parse::<Rate>() {
            prop_assert!(!e.to_string().is_empty());
        }
    }

    #[test]
    fn near_rates_parse_or_err_without_panicking(s in near_rates()) {
        match s.parse::<Rate>() {
            // Whatever parses prints canonically and parses back to itself.
            Ok(rate) => prop_assert_eq!(rate.to_string().parse::<Rate>(), Ok(rate)),
            Err(e) => prop_assert!(e.to_string().starts_with("invalid rate ")),
        }
    }

    /// `Display` then `FromStr` gives back an equal rate, for every rate.
    #[test]
    fn display_round_trips(permits in any::<u32>(), period in durations()) {
        let rate = Rate::new(permits, period);
        let text = rate.to_string();
        prop_assert_eq!(text.parse::<Rate>(), Ok(rate), "{}", text);
    }
}

#[cfg(feature = "serde")]
mod serde_form {
    use super::*;

    #[test]
    fn rates_serialize_as_their_canonical_string() {
        assert_eq!(
            serde_json::to_string(&Rate::per_second(100)).unwrap(),
            "\"100/s\""
        );
        let rates = vec![
            Rate::per_minute(30),
            Rate::new(5, Duration::from_millis(10)),
        ];
        assert_eq!(
            serde_json::to_string(&rates).unwrap(),
            r#"["30/min","5/10ms"]"#
        );
    }

    #[test]
    fn rates_deserialize_from_any_accepted_string() {
        let rates: Vec<Rate> =
            serde_json::from_str(r#"["100/s", "30/m", "5 per 10 ms", "1000 / 1 hour"]"#).unwrap();
        assert_eq!(
            rates,
            [
                Rate::per_second(100),
                Rate::per_minute(30),
                Rate::new(5, Duration::from_millis(10)),
                Rate::per_hour(1000),
            ]
        );
    }

    #[test]
    fn bad_strings_and_other_types_are_errors() {
        let err = serde_json::from_str::<Rate>(r#""100 a second""#).unwrap_err();
        assert!(
            err.to_string()
                .starts_with(r#"invalid rate "100 a second": no '/'"#),
            "{err}"
        );
        let err = serde_json::from_str::<Rate>("100").unwrap_err();
        assert!(
            err.to_string()
                .contains(r#"expected a rate string such as "100/s""#),
            "{err}"
        );
    }

    proptest! {
        #[test]
        fn json_round_trips(permits in any::<u32>(), period in durations()) {
            let rate = Rate::new(permits, period);
            let json = serde_json::to_string(&rate).unwrap();
            prop_assert_eq!(serde_json::from_str::<Rate>(&json).unwrap(), rate);
        }
    }
}
