//! One YAML file to a checked descriptor tree.
//!
//! Every check runs inside the visitor of the node it is about: serde_yaml_ng
//! stamps an error raised there with that node's line and column (the key
//! for an unknown field, the scalar for a bad unit or count, the mapping for a
//! duplicate descriptor or a contradiction between fields), so no check has to
//! find its line again after parsing.

use std::cell::Cell;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::path::PathBuf;

use serde::de::{
    self, DeserializeSeed, Deserializer, Error as _, MapAccess, SeqAccess, Unexpected, Visitor,
};
use tollgate::{
    ConfigError, FixedWindow, LogConfig, ManualClock, Rate, SlidingWindow, TokenBucket,
};

use super::{Algorithm, Failure, MAX_RULES_PER_DESCRIPTOR, MetadataValue, Unit};

/// What the checks of one file need from the files before it.
pub(super) struct Ctx<'a> {
    /// Domains already loaded, and the file each came from.
    pub(super) taken: &'a HashMap<String, PathBuf>,
    /// The core's error behind a refused rate, kept for `Error::source`
    /// (serde's errors carry only text).
    pub(super) limit_error: Cell<Option<ConfigError>>,
}

pub(super) struct RawFile {
    pub(super) domain: String,
    pub(super) failure: Option<Failure>,
    pub(super) descriptors: Vec<RawDescriptor>,
}

pub(super) struct RawDescriptor {
    pub(super) key: String,
    /// `None` for no value (an empty value is no value, as in envoyproxy).
    pub(super) value: Option<String>,
    pub(super) rules: Vec<RawRule>,
    pub(super) descriptors: Vec<RawDescriptor>,
    pub(super) shadow_mode: bool,
    pub(super) quota_mode: bool,
    pub(super) detailed_metric: bool,
    pub(super) value_to_metric: bool,
    pub(super) share_threshold: bool,
    pub(super) metadata: Option<BTreeMap<String, MetadataValue>>,
}

pub(super) struct RawRule {
    pub(super) name: Option<String>,
    pub(super) replaces: Vec<String>,
    pub(super) unit: Option<Unit>,
    pub(super) requests_per_unit: u32,
    pub(super) unlimited: bool,
    pub(super) algorithm: Algorithm,
}

/// Parses one file: `Ok(None)` for a file with no YAML document at all.
pub(super) fn parse_file(
    text: &str,
    ctx: &Ctx<'_>,
) -> Result<Option<RawFile>, serde_yaml_ng::Error> {
    let mut documents = serde_yaml_ng::Deserializer::from_str(text);
    let Some(first) = documents.next() else {
        return Ok(None);
    };
    let file = FileSeed { ctx }.deserialize(first)?;
    // envoyproxy reads only a file's first document; one domain per file, so
    // a second document is refused rather than silently dropped. An empty
    // one (a trailing `---`) is harmless.
    for later in documents {
        LaterDocument.deserialize(later)?;
    }
    Ok(Some(file))
}

const FILE_FIELDS: &[&str] = &["domain", "descriptors", "failure_mode"];
const DESCRIPTOR_FIELDS: &[&str] = &[
    "key",
    "value",
    "rate_limit",
    "rate_limits",
    "descriptors",
    "shadow_mode",
    "quota_mode",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "metadata",
];
const RATE_LIMIT_FIELDS: &[&str] = &[
    "unit",
    "requests_per_unit",
    "unlimited",
    "name",
    "replaces",
    "algorithm",
    "burst",
];
const REPLACES_FIELDS: &[&str] = &["name"];
const ALGORITHMS: &[&str] = &[
    "fixed_window",
    "sliding_log",
    "sliding_window",
    "token_bucket",
];

/// A seed and its visitor, the two serde traits every node of the file is
/// read through, from the one `Deserializer` method that reads the node
/// (`read`), what the node should be (`expecting`) and the visitor's other
/// methods.
///
/// Most fields may be null (or `~`, or nothing after the key): for those,
/// `null` instead of `read` is what null gives, and the node is read through
/// `deserialize_option`; a present value goes to `some`, a `Deserializer`
/// method given the visitor itself (or, without `some`, to a `visit_some`
/// among the methods).
macro_rules! seed {
    ($seed:ty => $value:ty {
        read: $read:ident,
        expecting: $expecting:expr,
        $($methods:tt)*
    }) => {
        impl<'de> DeserializeSeed<'de> for $seed {
            type Value = $value;

            fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<$value, D::Error> {
                d.$read(self)
            }
        }

        impl<'de> Visitor<'de> for $seed {
            type Value = $value;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str($expecting)
            }

            $($methods)*
        }
    };
    ($seed:ty => $value:ty {
        expecting: $expecting:expr,
        null: $null:expr,
        some: $some:ident,
        $($methods:tt)*
    }) => {
        seed! {
            $seed => $value {
                expecting: $expecting,
                null: $null,

                fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<$value, D::Error> {
                    d.$some(self)
                }

                $($methods)*
            }
        }
    };
    ($seed:ty => $value:ty {
        expecting: $expecting:expr,
        null: $null:expr,
        $($methods:tt)*
    }) => {
        seed! {
            $seed => $value {
                read: deserialize_option,
                expecting: $expecting,

                fn visit_none<E: de::Error>(self) -> Result<$value, E> {
                    $null
                }

                fn visit_unit<E: de::Error>(self) -> Result<$value, E> {
                    $null
                }

                $($methods)*
            }
        }
    };
}

/// A map key, checked against the fields of its mapping while it is read
/// (so that an unknown or repeated field is reported at the key itself).
struct Field<'s> {
    names: &'static [&'static str],
    seen: &'s mut u32,
}

seed! {
    Field<'_> => usize {
        read: deserialize_str,
        expecting: "a field name",

        fn visit_str<E: de::Error>(self, name: &str) -> Result<usize, E> {
            let Some(index) = self.names.iter().position(|&known| known == name) else {
                return Err(E::unknown_field(name, self.names));
            };
            if *self.seen & (1 << index) != 0 {
                return Err(E::custom(format_args!("duplicate field `{name}`")));
            }
            *self.seen |= 1 << index;
            Ok(index)
        }
    }
}

/// A string field: any scalar, as written (`value: 123` is the string
/// `"123"`, as yaml.v2 reads it into envoyproxy's string fields); null or
/// absent is `None`.
struct Text;

seed! {
    Text => Option<String> {
        expecting: "a string",
        null: Ok(None),

        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Option<String>, D::Error> {
            d.deserialize_str(Scalar).map(Some)
        }
    }
}

struct Scalar;

impl Visitor<'_> for Scalar {
    type Value = String;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<String, E> {
        Ok(v.to_owned())
    }
}

/// A boolean field, with YAML 1.1's spellings (`yes`, `on`, `y`...) that
/// envoyproxy's yaml.v2 accepts; null is false.
struct Flag;

seed! {
    Flag => bool {
        expecting: "a boolean (true or false)",
        null: Ok(false),
        some: deserialize_str,

        fn visit_bool<E: de::Error>(self, v: bool) -> Result<bool, E> {
            Ok(v)
        }

        fn visit_str<E: de::Error>(self, v: &str) -> Result<bool, E> {
            match v {
                "true" | "True" | "TRUE" | "yes" | "Yes" | "YES" | "y" | "Y" | "on" | "On" | "ON" => {
                    Ok(true)
                }
                "false" | "False" | "FALSE" | "no" | "No" | "NO" | "n" | "N" | "off" | "Off"
                | "OFF" => Ok(false),
                _ => Err(E::invalid_value(Unexpected::Str(v), &self)),
            }
        }
    }
}

/// A `u32` field, written as yaml.v2 reads integers (YAML 1.1): `_`
/// between digits, `0x` hexadecimal, `0b` binary, `0o` or a leading `0`
/// octal. Null is absent.
struct Count;

seed! {
    Count => Option<u32> {
        expecting: "a whole number from 0 to 4294967295",
        null: Ok(None),
        some: deserialize_str,

        fn visit_str<E: de::Error>(self, v: &str) -> Result<Option<u32>, E> {
            match parse_yaml11_int(v) {
                Some(n) => u32::try_from(n).map(Some).map_err(|_| {
                    E::custom(format_args!(
                        "invalid value: `{v}` is out of range, expected {}",
                        Expecting(&self)
                    ))
                }),
                None => Err(E::invalid_value(Unexpected::Str(v), &self)),
            }
        }
    }
}

/// A visitor's `expecting`, for a message of one's own.
struct Expecting<'v, V>(&'v V);

impl<'de, V: Visitor<'de>> fmt::Display for Expecting<'_, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.expecting(f)
    }
}

/// An integer as yaml.v2 resolves a plain scalar: underscores dropped, then
/// Go's `strconv.ParseInt(s, 0, 64)` syntax. `None` if it is no integer.
fn parse_yaml11_int(text: &str) -> Option<i128> {
    let digits: String = text.chars().filter(|&c| c != '_').collect();
    let (negative, unsigned) = match digits.as_bytes().first()? {
        b'-' => (true, &digits[1..]),
        b'+' => (false, &digits[1..]),
        _ => (false, &digits[..]),
    };
    let lower = unsigned.to_ascii_lowercase();
    let (radix, body) = if let Some(hex) = lower.strip_prefix("0x") {
        (16, hex)
    } else if let Some(binary) = lower.strip_prefix("0b") {
        (2, binary)
    } else if let Some(octal) = lower.strip_prefix("0o") {
        (8, octal)
    } else if lower.len() > 1 && lower.starts_with('0') {
        (8, &lower[1..])
    } else {
        (10, &lower[..])
    };
    if body.is_empty() || !body.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    // Past u64 it overflows any count anyway; saturate rather than fail.
    let magnitude = u64::from_str_radix(body, radix).map_or(i128::from(u64::MAX) + 1, i128::from);
    Some(if negative { -magnitude } else { magnitude })
}

/// `unit`: case-insensitive, as envoyproxy upper-cases it before looking it
/// up in the protocol's enum. Empty is absent.
struct UnitField;

seed! {
    UnitField => Option<Unit> {
        expecting: "a unit: second, minute, hour, day, week, month or year",
        null: Ok(None),
        some: deserialize_str,

        fn visit_str<E: de::Error>(self, v: &str) -> Result<Option<Unit>, E> {
            if v.is_empty() {
                return Ok(None);
            }
            Unit::from_name(v).map(Some).ok_or_else(|| {
                E::custom(format_args!(
                    "invalid rate limit unit '{v}', expected one of second, minute, hour, day, \
                     week, month, year"
                ))
            })
        }
    }
}

#[derive(Clone, Copy, PartialEq)]
enum AlgorithmName {
    FixedWindow,
    SlidingLog,
    SlidingWindow,
    TokenBucket,
}

struct AlgorithmField;

seed! {
    AlgorithmField => Option<AlgorithmName> {
        expecting: "an algorithm: fixed_window, sliding_log, sliding_window or token_bucket",
        null: Ok(None),
        some: deserialize_str,

        fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
            let name = match v {
                "fixed_window" => AlgorithmName::FixedWindow,
                "sliding_log" => AlgorithmName::SlidingLog,
                "sliding_window" => AlgorithmName::SlidingWindow,
                "token_bucket" => AlgorithmName::TokenBucket,
                _ => return Err(E::unknown_variant(v, ALGORITHMS)),
            };
            Ok(Some(name))
        }
    }
}

/// The document: `domain` and `descriptors`.
struct FileSeed<'c> {
    ctx: &'c Ctx<'c>,
}

seed! {
    FileSeed<'_> => RawFile {
        expecting: "a rate limit configuration: a mapping with `domain` and `descriptors`",
        null: Err(E::custom(
            "config file cannot have empty domain (the file is empty)"
        )),
        some: deserialize_map,

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawFile, A::Error> {
            let mut seen = 0;
            let mut domain = None;
            let mut failure = None;
            let mut descriptors = Vec::new();
            while let Some(field) = map.next_key_seed(Field {
                names: FILE_FIELDS,
                seen: &mut seen,
            })? {
                match field {
                    0 => domain = Some(map.next_value_seed(DomainField { ctx: self.ctx })?),
                    1 => descriptors = map.next_value_seed(Descriptors { ctx: self.ctx })?,
                    _ => failure = Some(map.next_value_seed(FailureField)?),
                }
            }
            let domain =
                domain.ok_or_else(|| A::Error::custom("config file cannot have empty domain"))?;
            Ok(RawFile {
                domain,
                failure,
                descriptors,
            })
        }
    }
}

/// A domain's `failure_mode`: refused at its own line.
struct FailureField;

seed! {
    FailureField => Failure {
        read: deserialize_str,
        expecting: "a failure mode: open, closed or local",

        fn visit_str<E: de::Error>(self, v: &str) -> Result<Failure, E> {
            v.parse().map_err(E::custom)
        }
    }
}

struct DomainField<'c> {
    ctx: &'c Ctx<'c>,
}

seed! {
    DomainField<'_> => String {
        expecting: "a domain name",
        null: Err(E::custom("config file cannot have empty domain")),
        some: deserialize_str,

        fn visit_str<E: de::Error>(self, v: &str) -> Result<String, E> {
            if v.is_empty() {
                return self.visit_none();
            }
            if let Some(first) = self.ctx.taken.get(v) {
                return Err(E::custom(format_args!(
                    "duplicate domain '{v}' in config file (already in {})",
                    first.display()
                )));
            }
            Ok(v.to_owned())
        }
    }
}

/// A list of descriptors (null is empty); keys and values unique in it.
struct Descriptors<'c> {
    ctx: &'c Ctx<'c>,
}

seed! {
    Descriptors<'_> => Vec<RawDescriptor> {
        expecting: "a list of descriptors",
        null: Ok(Vec::new()),
        some: deserialize_seq,

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut siblings = HashSet::new();
            let mut out = Vec::new();
            while let Some(descriptor) = seq.next_element_seed(DescriptorSeed {
                ctx: self.ctx,
                siblings: &mut siblings,
            })? {
                out.push(descriptor);
            }
            Ok(out)
        }
    }
}

struct DescriptorSeed<'c, 's> {
    ctx: &'c Ctx<'c>,
    /// The (key, value) pairs before this one in its list.
    siblings: &'s mut HashSet<(String, Option<String>)>,
}

seed! {
    DescriptorSeed<'_, '_> => RawDescriptor {
        read: deserialize_map,
        expecting: "a descriptor: a mapping with `key` and optionally `value`, `rate_limit`, `descriptors`",

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawDescriptor, A::Error> {
            let mut seen = 0;
            let mut key = None;
            let mut value = None;
            let mut rate_limit = None;
            let mut rate_limits = None;
            let mut descriptors = Vec::new();
            let mut flags = [false; 5];
            let mut metadata = None;
            while let Some(field) = map.next_key_seed(Field {
                names: DESCRIPTOR_FIELDS,
                seen: &mut seen,
            })? {
                match field {
                    0 => key = map.next_value_seed(Text)?,
                    1 => value = map.next_value_seed(Text)?,
                    2 => rate_limit = map.next_value_seed(OptionalRateLimit { ctx: self.ctx })?,
                    3 => rate_limits = Some(map.next_value_seed(RateLimits { ctx: self.ctx })?),
                    4 => descriptors = map.next_value_seed(Descriptors { ctx: self.ctx })?,
                    5..=9 => flags[field - 5] = map.next_value_seed(Flag)?,
                    _ => metadata = map.next_value_seed(MetadataField)?,
                }
            }
            let [
                shadow_mode,
                quota_mode,
                detailed_metric,
                value_to_metric,
                share_threshold,
            ] = flags;
            let key = key
                .filter(|key| !key.is_empty())
                .ok_or_else(|| A::Error::custom("descriptor has empty key"))?;
            let value = value.filter(|value| !value.is_empty());
            if share_threshold && !value.as_deref().is_some_and(|v| v.contains('*')) {
                return Err(A::Error::custom(format_args!(
                    "share_threshold can only be used with wildcard values (containing '*'), but \
                     found key '{key}' with value '{}'",
                    value.as_deref().unwrap_or("")
                )));
            }
            let rules = match (rate_limit, rate_limits) {
                (Some(_), Some(_)) => {
                    return Err(A::Error::custom(
                        "a descriptor has either `rate_limit` or `rate_limits`, not both",
                    ));
                }
                (Some(rule), None) => vec![rule],
                (None, Some(rules)) => rules,
                (None, None) => Vec::new(),
            };
            let pair = (key, value);
            if self.siblings.contains(&pair) {
                let (key, value) = pair;
                let value = match value {
                    Some(value) => format!("with value '{value}'"),
                    None => "without a value".to_owned(),
                };
                return Err(A::Error::custom(format_args!(
                    "duplicate descriptor: key '{key}' {value} appears twice in this list"
                )));
            }
            self.siblings.insert(pair.clone());
            let (key, value) = pair;
            Ok(RawDescriptor {
                key,
                value,
                rules,
                descriptors,
                shadow_mode,
                quota_mode,
                detailed_metric,
                value_to_metric,
                share_threshold,
                metadata,
            })
        }
    }
}

/// `rate_limits:` tollgate's list of several rules on one descriptor.
struct RateLimits<'c> {
    ctx: &'c Ctx<'c>,
}

seed! {
    RateLimits<'_> => Vec<RawRule> {
        expecting: "a list of rate limits",
        null: Ok(Vec::new()),
        some: deserialize_seq,

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut rules = Vec::new();
            while let Some(rule) = seq.next_element_seed(RateLimitSeed {
                ctx: self.ctx,
                one_too_many: rules.len() == MAX_RULES_PER_DESCRIPTOR,
            })? {
                rules.push(rule);
            }
            Ok(rules)
        }
    }
}

/// `rate_limit:`, where null means no rate limit.
struct OptionalRateLimit<'c> {
    ctx: &'c Ctx<'c>,
}

seed! {
    OptionalRateLimit<'_> => Option<RawRule> {
        expecting: "a rate limit",
        null: Ok(None),

        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            RateLimitSeed {
                ctx: self.ctx,
                one_too_many: false,
            }
            .deserialize(d)
            .map(Some)
        }
    }
}

struct RateLimitSeed<'c> {
    ctx: &'c Ctx<'c>,
    /// Refuse this entry of `rate_limits` (at its own line): its descriptor
    /// has all the rules it may.
    one_too_many: bool,
}

seed! {
    RateLimitSeed<'_> => RawRule {
        read: deserialize_map,
        expecting: "a rate limit: a mapping with `unit` and `requests_per_unit`, or \
                    `unlimited: true`",

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawRule, A::Error> {
            if self.one_too_many {
                return Err(A::Error::custom(format_args!(
                    "more than {MAX_RULES_PER_DESCRIPTOR} rate limits on one descriptor"
                )));
            }
            let mut seen = 0;
            let mut unit = None;
            let mut requests_per_unit = 0;
            let mut unlimited = false;
            let mut name = None;
            let mut replaces = Vec::new();
            let mut algorithm = None;
            let mut burst = None;
            while let Some(field) = map.next_key_seed(Field {
                names: RATE_LIMIT_FIELDS,
                seen: &mut seen,
            })? {
                match field {
                    0 => unit = map.next_value_seed(UnitField)?,
                    1 => requests_per_unit = map.next_value_seed(Count)?.unwrap_or(0),
                    2 => unlimited = map.next_value_seed(Flag)?,
                    3 => name = map.next_value_seed(Text)?.filter(|name| !name.is_empty()),
                    4 => replaces = map.next_value_seed(Replaces)?,
                    5 => algorithm = map.next_value_seed(AlgorithmField)?,
                    _ => burst = map.next_value_seed(Count)?,
                }
            }
            if unlimited {
                if unit.is_some() {
                    return Err(A::Error::custom(
                        "should not specify rate limit unit when unlimited",
                    ));
                }
                if algorithm.is_some() || burst.is_some() {
                    return Err(A::Error::custom(
                        "an unlimited rate limit has no `algorithm` or `burst`",
                    ));
                }
            } else if unit.is_none() {
                return Err(A::Error::custom(
                    "invalid rate limit unit '': give `unit` (second, minute, hour, day, week, \
                     month or year) or `unlimited: true`",
                ));
            }
            if name.as_ref().is_some_and(|name| replaces.contains(name)) {
                return Err(A::Error::custom(
                    "replaces should not contain name of same descriptor",
                ));
            }
            let algorithm = match (algorithm.unwrap_or(AlgorithmName::FixedWindow), burst) {
                (AlgorithmName::TokenBucket, burst) => Algorithm::TokenBucket {
                    burst: burst.unwrap_or(requests_per_unit),
                },
                (_, Some(_)) => {
                    return Err(A::Error::custom(
                        "`burst` is only for `algorithm: token_bucket`",
                    ));
                }
                (AlgorithmName::FixedWindow, None) => Algorithm::FixedWindow,
                (AlgorithmName::SlidingLog, None) => Algorithm::SlidingLog,
                (AlgorithmName::SlidingWindow, None) => Algorithm::SlidingWindow,
            };
            // A zero rate is envoyproxy's way to block everything (its README's
            // "black list IP"): it loads, and there is no limiter to check.
            if let Some(unit) = unit.filter(|_| !unlimited && requests_per_unit > 0) {
                let rate = Rate::new(requests_per_unit, unit.duration());
                if let Err(error) = check_limiter(algorithm, rate) {
                    self.ctx.limit_error.set(Some(error));
                    return Err(A::Error::custom(format_args!(
                        "{requests_per_unit} per {unit} with {algorithm}: {error}"
                    )));
                }
            }
            Ok(RawRule {
                name,
                replaces,
                unit,
                requests_per_unit,
                unlimited,
                algorithm,
            })
        }
    }
}

/// Builds the core's limiter for the rule once, for its checks alone (zero
/// rate, too fine, overflowing burst...), so the configuration refuses what
/// the limiters would. The sliding log's checks are its `LogConfig`'s, which
/// does not allocate the log.
fn check_limiter(algorithm: Algorithm, rate: Rate) -> Result<(), ConfigError> {
    match algorithm {
        Algorithm::FixedWindow => FixedWindow::with_clock(rate, ManualClock::new()).map(drop),
        Algorithm::SlidingLog => LogConfig::new(rate).map(drop),
        Algorithm::SlidingWindow => SlidingWindow::with_clock(rate, ManualClock::new()).map(drop),
        Algorithm::TokenBucket { burst } => {
            TokenBucket::with_clock(burst, rate, ManualClock::new()).map(drop)
        }
    }
}

/// `replaces: [{name: ...}, ...]` (null is empty).
struct Replaces;

seed! {
    Replaces => Vec<String> {
        expecting: "a list of `- name: ...` entries",
        null: Ok(Vec::new()),
        some: deserialize_seq,

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<String>, A::Error> {
            let mut names = Vec::new();
            while let Some(name) = seq.next_element_seed(ReplacesEntry)? {
                names.push(name);
            }
            Ok(names)
        }
    }
}

struct ReplacesEntry;

seed! {
    ReplacesEntry => String {
        read: deserialize_map,
        expecting: "a replaces entry: `name: ...`",

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<String, A::Error> {
            let mut seen = 0;
            let mut name = None;
            while map
                .next_key_seed(Field {
                    names: REPLACES_FIELDS,
                    seen: &mut seen,
                })?
                .is_some()
            {
                name = map.next_value_seed(Text)?;
            }
            name.filter(|name| !name.is_empty())
                .ok_or_else(|| A::Error::custom("should not have an empty replaces entry"))
        }
    }
}

/// `metadata:` a mapping of anything (null or empty is none).
struct MetadataField;

seed! {
    MetadataField => Option<BTreeMap<String, MetadataValue>> {
        expecting: "a mapping",
        null: Ok(None),
        some: deserialize_map,

        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
            let fields = AnyValue.visit_map(map)?;
            let MetadataValue::Struct(fields) = fields else {
                unreachable!("a mapping reads as a struct")
            };
            Ok((!fields.is_empty()).then_some(fields))
        }
    }
}

/// Any YAML node, as a protobuf `Value` would hold it.
struct AnyValue;

seed! {
    AnyValue => MetadataValue {
        read: deserialize_any,
        expecting: "a metadata value",

        fn visit_unit<E: de::Error>(self) -> Result<MetadataValue, E> {
            Ok(MetadataValue::Null)
        }

        fn visit_none<E: de::Error>(self) -> Result<MetadataValue, E> {
            Ok(MetadataValue::Null)
        }

        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<MetadataValue, D::Error> {
            d.deserialize_any(self)
        }

        fn visit_bool<E: de::Error>(self, v: bool) -> Result<MetadataValue, E> {
            Ok(MetadataValue::Bool(v))
        }

        // Protobuf's `Value` holds every number as a double, as envoyproxy's
        // conversion does.
        #[allow(clippy::cast_precision_loss)]
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<MetadataValue, E> {
            Ok(MetadataValue::Number(v as f64))
        }

        #[allow(clippy::cast_precision_loss)]
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<MetadataValue, E> {
            Ok(MetadataValue::Number(v as f64))
        }

        fn visit_f64<E: de::Error>(self, v: f64) -> Result<MetadataValue, E> {
            Ok(MetadataValue::Number(v))
        }

        fn visit_str<E: de::Error>(self, v: &str) -> Result<MetadataValue, E> {
            Ok(MetadataValue::String(v.to_owned()))
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<MetadataValue, A::Error> {
            let mut items = Vec::new();
            while let Some(item) = seq.next_element_seed(AnyValue)? {
                items.push(item);
            }
            Ok(MetadataValue::List(items))
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<MetadataValue, A::Error> {
            let mut fields = BTreeMap::new();
            while let Some(key) = map.next_key_seed(AnyKey)? {
                let value = map.next_value_seed(AnyValue)?;
                fields.insert(key, value);
            }
            Ok(MetadataValue::Struct(fields))
        }
    }
}

/// A metadata key: any scalar, written out as text (envoyproxy formats
/// non-string keys with Go's `%v`).
struct AnyKey;

impl<'de> DeserializeSeed<'de> for AnyKey {
    type Value = String;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<String, D::Error> {
        d.deserialize_str(Scalar)
    }
}

/// A later document of a file, refused unless empty.
struct LaterDocument;

seed! {
    LaterDocument => () {
        expecting: "nothing after the first document",
        null: Ok(()),

        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
            // Through `deserialize_any`, so that the error carries the
            // document's position.
            d.deserialize_any(RejectLater)
        }
    }
}

struct RejectLater;

impl RejectLater {
    fn refuse<E: de::Error>(self) -> Result<(), E> {
        Err(E::custom(
            "a second YAML document in one file: envoyproxy/ratelimit reads only the first, \
             so put each domain in a file of its own",
        ))
    }
}

impl<'de> Visitor<'de> for RejectLater {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("nothing after the first document")
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        self.refuse()
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        self.refuse()
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        self.refuse()
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        self.refuse()
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        self.refuse()
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<(), A::Error> {
        self.refuse()
    }

    fn visit_map<A: MapAccess<'de>>(self, _: A) -> Result<(), A::Error> {
        self.refuse()
    }
}
