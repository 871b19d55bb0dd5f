//! Adaptive concurrency limits: algorithms that move a limit on in-flight
//! requests from what finished requests report — their latency, and whether
//! the service dropped them.
//!
//! A request's permit records its outcome as a [`Sample`] when it is
//! released: [`Outcome::Success`] with the measured round trip,
//! [`Outcome::Dropped`] (a timeout, a refusal, an overload answer) or
//! [`Outcome::Ignored`] (a result that says nothing about the service's
//! capacity: the caller went away, a client error). The permit's owner feeds
//! it to a [`LimitAlgorithm`], which may move the limit:
//!
//! | algorithm | moves the limit on | anchor |
//! |---|---|---|
//! | [`RoundTrip`] (recommended) | once per observed round trip: the queue the round's latency implies over the unloaded latency; a drop: × 0.7 at once, once per round trip | tollgate's own (TCP Vegas per round trip, with BBR's and CUBIC's lessons) |
//! | [`Aimd`] | drops (and round trips over a timeout): × a backoff ratio; otherwise + 1 | Netflix concurrency-limits `AIMDLimit` |
//! | [`Vegas`] | the queue it infers from round trip over no-load round trip: up while it is below α, down above β | Netflix `VegasLimit` (TCP Vegas) |
//! | [`Gradient2`] | the gradient of a long-term average round trip over the current one, with a fixed queue allowance | Netflix `Gradient2Limit` |
//! | [`Windowed`] | any of them, fed one aggregated sample per time window | Netflix `WindowedLimit` |
//!
//! Latency is measured on a tollgate [`Clock`](crate::Clock): on a
//! [`ManualClock`](crate::ManualClock), a simulator runs a limiter through
//! minutes of traffic in milliseconds, deterministically (the crate's
//! `tests/integration/adaptive_sim.rs` does; `docs/adaptive.md` has its results).
//!
//! # Concurrency
//!
//! The algorithms are shared by every thread that releases a permit, so each
//! takes `&self` and keeps its state in one atomic word (`u64` for AIMD,
//! `u128` for Vegas' and Gradient2's estimate, round trips and counters),
//! changed by the crate's one compare-and-swap loop (`cell::AtomicCell`). No
//! mutex is taken on the release path. A sample whose compare-and-swap loses
//! a race is decided again on the winner's state: it is **folded in**, never
//! dropped, and the result is the state some serial order of the samples
//! would have produced. [`Windowed`]'s aggregation and its window close are
//! one word too, so a sample that races a close lands in the closing window
//! or in the next one, never in neither.
//!
//! # Integer arithmetic
//!
//! Every decision is integer arithmetic. Configuration takes `f64`s for
//! readability and turns them into fixed point once, at construction:
//!
//! - ratios and factors (AIMD's backoff ratio, Gradient2's smoothing and
//!   tolerance, Vegas' smoothing) in millionths (`PPM`): `0.9` is exactly
//!   `900_000`, so `floor(limit · 0.9)` is exact;
//! - fractional limits (Vegas' and Gradient2's estimate) in 1/65 536 of a
//!   permit (Q.16, `LIMIT_FRAC_BITS`);
//! - Gradient2's long-term round trip in 1/65 536 of a nanosecond (Q.16).
//!
//! The integer limit an algorithm reports is the estimate's floor, as
//! Netflix's `(int) estimatedLimit`.

/// The builders' setters, each setting one field to its argument (or to
/// the value given after `=`, such as `Some` of it where no value means the
/// algorithm's own default) and handing the builder back.
macro_rules! setters {
    ($($(#[$attr:meta])* $name:ident($arg:ident: $ty:ty) -> $field:ident $(= $value:expr)?;)*) => {
        $(
            $(#[$attr])*
            pub fn $name(mut self, $arg: $ty) -> Self {
                self.$field = setters!(@value $arg $($value)?);
                self
            }
        )*
    };
    (@value $arg:ident) => {
        $arg
    };
    (@value $arg:ident $value:expr) => {
        $value
    };
}

/// `LimitAlgorithm` for an algorithm whose whole state is one word of
/// `self.state`, packed from `$state` (which tells its limit): an ignored
/// sample changes nothing; any other goes through [`apply`] to
/// `self.decide`, and a changed limit into `self.history`.
macro_rules! packed_algorithm {
    ($algorithm:ty, $state:ident) => {
        impl LimitAlgorithm for $algorithm {
            fn on_sample(&self, sample: Sample, now_ns: u64) -> Option<u32> {
                if sample.outcome == Outcome::Ignored {
                    return None;
                }
                apply(
                    &self.state,
                    &self.history,
                    now_ns,
                    |word| $state::unpack(word).limit(),
                    |word| self.decide($state::unpack(word), &sample).map($state::pack),
                )
            }

            fn limit(&self) -> u32 {
                $state::unpack(self.state.load()).limit()
            }

            fn history(&self) -> Option<&LimitHistory> {
                Some(&self.history)
            }
        }
    };
}

mod aimd;
mod gradient2;
mod history;
mod limiter;
mod round_trip;
mod vegas;
mod windowed;

pub use aimd::{Aimd, AimdBuilder};
pub use gradient2::{Gradient2, Gradient2Builder};
pub use history::{HISTORY_LEN, LimitChange, LimitHistory};
pub use limiter::{AdaptiveLimit, AdaptivePermit, OwnedAdaptivePermit};
pub use round_trip::{RoundStats, RoundTrip, RoundTripBuilder};
pub use vegas::{Vegas, VegasBuilder};
pub use windowed::{WindowStats, Windowed, WindowedBuilder};

use crate::cell::{StateCell, Word};
use crate::error::ConfigError;

/// The one way an algorithm's state changes: `step` maps the state word to
/// the next (`None`: nothing worth writing), inside the cell's one
/// compare-and-swap loop, so a sample that loses a race is recomputed on the
/// winner's word and counted once; `limit_of` reads a word's limit. A
/// changed limit is recorded in `history` and returned.
fn apply<W: Word>(
    cell: &impl StateCell<Word = W>,
    history: &LimitHistory,
    now_ns: u64,
    limit_of: impl Fn(W) -> u32,
    mut step: impl FnMut(W) -> Option<W>,
) -> Option<u32> {
    let mut before = 0;
    let stored = cell
        .update(|word| {
            // The decision stored last is the one whose `before` is kept.
            before = limit_of(word);
            step(word).ok_or(())
        })
        .ok()?;
    let after = limit_of(stored);
    if after == before {
        return None;
    }
    history.record(after, now_ns);
    Some(after)
}

/// The largest limit an adaptive algorithm accepts: 2^20 (1 048 576)
/// requests in flight. The bound keeps every packed word's fields and every
/// intermediate product inside their integers.
///
/// ```
/// use tollgate::{Aimd, ConfigError, MAX_ADAPTIVE_LIMIT};
///
/// assert!(Aimd::builder().max_limit(MAX_ADAPTIVE_LIMIT).build().is_ok());
/// let err = Aimd::builder().max_limit(MAX_ADAPTIVE_LIMIT + 1).build().unwrap_err();
/// assert!(matches!(err, ConfigError::InvalidLimits { .. }));
/// ```
pub const MAX_ADAPTIVE_LIMIT: u32 = 1 << 20;

/// The scale of ratios and factors in the decisions: millionths. A ratio
/// configured as `0.9` is decided on as `900_000 / PPM`, exactly.
const PPM: u64 = 1_000_000;

/// Fractional bits of a fractional limit estimate (Vegas', Gradient2's): the
/// estimate is kept in units of 1/2^16 of a permit.
const LIMIT_FRAC_BITS: u32 = 16;

/// One permit, as an estimate.
const ONE: u64 = 1 << LIMIT_FRAC_BITS;

/// A whole limit as an estimate.
fn estimate_of(limit: u32) -> u64 {
    u64::from(limit) * ONE
}

/// The limit an estimate reports: its floor, as Netflix's `(int)
/// estimatedLimit`.
fn floor_limit(estimate: u64) -> u32 {
    (estimate >> LIMIT_FRAC_BITS) as u32
}

/// `estimate` held in `min..=max` permits.
fn clamp_estimate(estimate: u64, min: u32, max: u32) -> u64 {
    estimate.clamp(estimate_of(min), estimate_of(max))
}

/// Whether a request admitted with `in_flight` found fewer than half the
/// estimate in flight: the service was not pressed, so its round trip says
/// nothing about a higher limit (Netflix's "don't grow the limit if we are
/// app-limited").
fn app_limited(in_flight: u32, estimate: u64) -> bool {
    u64::from(in_flight) << (LIMIT_FRAC_BITS + 1) < estimate
}

/// `(1 − smoothing) · estimate + smoothing · target`, the smoothing in
/// millionths. Rounded to nearest: a truncation would pull the estimate
/// down by up to 2^-16 a change, a drift of whole permits over a day of
/// samples.
fn smooth(estimate: u64, target: u128, smoothing_ppm: u64) -> u128 {
    div_round(
        u128::from(estimate) * u128::from(PPM - smoothing_ppm) + target * u128::from(smoothing_ppm),
        u128::from(PPM),
    )
}

/// `num / den`, rounded to nearest (halves up).
fn div_round(num: u128, den: u128) -> u128 {
    (num + den / 2) / den
}

/// What became of a request, as its permit reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Outcome {
    /// The service answered; the round trip measures its latency.
    Success,
    /// The service dropped or refused the request, or it timed out: a sign of
    /// overload. Every algorithm here lowers its limit on it except
    /// [`Gradient2`], which, as Netflix's, ignores drops and judges by
    /// latency alone unless given [`Gradient2Builder::drop_backoff`].
    Dropped,
    /// Nothing to learn: the caller cancelled, or the request failed for a
    /// reason of its own. No algorithm changes on it.
    Ignored,
}

impl Outcome {
    /// The outcome's label in `tollgate_adaptive_samples_total`.
    #[cfg(feature = "metrics")]
    pub(crate) fn label(self) -> &'static str {
        match self {
            Outcome::Success => "success",
            Outcome::Dropped => "dropped",
            Outcome::Ignored => "ignored",
        }
    }
}

/// One finished request: how long it took, how many requests were in flight
/// when it was admitted (itself included), and how it ended.
///
/// ```
/// use tollgate::{Outcome, Sample};
///
/// let sample = Sample::success(2_000_000, 8); // 2 ms, 8 in flight
/// assert_eq!(sample, Sample { rtt_ns: 2_000_000, in_flight: 8, outcome: Outcome::Success });
/// assert_eq!(Sample::dropped(10, 3).outcome, Outcome::Dropped);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Sample {
    /// The round trip in nanoseconds, measured on the limiter's clock.
    pub rtt_ns: u64,
    /// Requests in flight when this one was admitted, itself included.
    pub in_flight: u32,
    /// How the request ended.
    pub outcome: Outcome,
}

impl Sample {
    /// A request the service answered after `rtt_ns`.
    pub fn success(rtt_ns: u64, in_flight: u32) -> Self {
        Sample {
            rtt_ns,
            in_flight,
            outcome: Outcome::Success,
        }
    }

    /// A request the service dropped, refused or timed out, after `rtt_ns`.
    pub fn dropped(rtt_ns: u64, in_flight: u32) -> Self {
        Sample {
            rtt_ns,
            in_flight,
            outcome: Outcome::Dropped,
        }
    }

    /// A request whose ending says nothing of the service.
    pub fn ignored(rtt_ns: u64, in_flight: u32) -> Self {
        Sample {
            rtt_ns,
            in_flight,
            outcome: Outcome::Ignored,
        }
    }
}

/// An algorithm that moves a concurrency limit from finished requests.
///
/// | algorithm | moves the limit on | anchor |
/// |---|---|---|
/// | [`RoundTrip`] (recommended) | once per observed round trip: the queue its latency implies; drops once per round trip | tollgate's own |
/// | [`Aimd`] | drops (and round trips over a timeout): × a backoff ratio; otherwise + 1 | Netflix concurrency-limits `AIMDLimit` |
/// | [`Vegas`] | the queue it infers from round trip over no-load round trip | Netflix `VegasLimit` |
/// | [`Gradient2`] | the gradient of a long-term average round trip over the current one | Netflix `Gradient2Limit` |
/// | [`Windowed`] | any of them, fed one aggregated sample per time window | Netflix `WindowedLimit` |
///
/// Not sealed: implement it to plug an algorithm of your own wherever
/// tollgate takes one (a [`Windowed`] wrapper, a concurrency limiter). An
/// implementation is shared by every thread releasing permits, so it takes
/// `&self`.
///
/// tollgate's algorithms keep their state in one atomic word each and never
/// block: a sample whose compare-and-swap loses a race is decided again on
/// the winner's state — folded in, never dropped — so the state is always
/// that of some serial order of the samples. They decide in integers:
/// ratios in millionths (0.9 is exactly 900 000 / 10^6), fractional limits
/// in 1/65 536 of a permit; the limit reported is the estimate's floor.
/// Latency is measured on a tollgate [`Clock`](crate::Clock), so on a
/// [`ManualClock`](crate::ManualClock) a simulation runs minutes of traffic
/// in milliseconds, deterministically.
///
/// ```
/// use std::time::Duration;
/// use tollgate::{Aimd, Clock, LimitAlgorithm, ManualClock, Sample};
///
/// let clock = ManualClock::new();
/// let aimd = Aimd::builder().min_limit(1).initial_limit(10).build()?;
///
/// // A request admitted with 10 in flight answers after 20 ms...
/// let start = clock.now();
/// clock.advance(Duration::from_millis(20));
/// let rtt = clock.now() - start;
/// // ...so the limit grows by one...
/// assert_eq!(aimd.on_sample(Sample::success(rtt, 10), clock.now()), Some(11));
/// // ...and a drop backs it off by the ratio 0.9.
/// assert_eq!(aimd.on_sample(Sample::dropped(rtt, 11), clock.now()), Some(9));
/// assert_eq!(aimd.limit(), 9);
/// assert_eq!(aimd.history().unwrap().changes(), 2);
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
pub trait LimitAlgorithm: Send + Sync {
    /// Feeds one finished request, completed at `now_ns` on the limiter's
    /// clock; returns the new limit if the sample changed it.
    ///
    /// Two threads racing may receive their new limits in one order and act
    /// on them in the other; a caller that mirrors the limit elsewhere
    /// should copy [`limit`](Self::limit) when told of a change, not the
    /// returned value.
    fn on_sample(&self, sample: Sample, now_ns: u64) -> Option<u32>;

    /// The current limit.
    fn limit(&self) -> u32;

    /// The limit's recent changes, for dashboards, if the algorithm keeps
    /// them (every tollgate algorithm does).
    fn history(&self) -> Option<&LimitHistory> {
        None
    }
}

/// A reference, a box or an `Arc` of an algorithm is one, sharing it.
macro_rules! forward_limit_algorithm {
    ($($(#[$attr:meta])* $pointer:ty;)*) => {
        $(
            $(#[$attr])*
            impl<A: LimitAlgorithm + ?Sized> LimitAlgorithm for $pointer {
                fn on_sample(&self, sample: Sample, now_ns: u64) -> Option<u32> {
                    (**self).on_sample(sample, now_ns)
                }

                fn limit(&self) -> u32 {
                    (**self).limit()
                }

                fn history(&self) -> Option<&LimitHistory> {
                    (**self).history()
                }
            }
        )*
    };
}

forward_limit_algorithm! {
    &A;
    /// A boxed algorithm is one: choose it at runtime, from configuration.
    ///
    /// ```
    /// use tollgate::{AdaptiveLimit, Aimd, LimitAlgorithm, RoundTrip};
    ///
    /// let from_config = "round-trip";
    /// let algorithm: Box<dyn LimitAlgorithm> = match from_config {
    ///     "aimd" => Box::new(Aimd::builder().min_limit(1).build()?),
    ///     _ => Box::new(RoundTrip::default()),
    /// };
    /// let limit = AdaptiveLimit::new(algorithm)?;
    /// assert_eq!(limit.limit(), 1);
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    Box<A>;
    std::sync::Arc<A>;
}

/// Checks `1 <= min <= initial <= max <= MAX_ADAPTIVE_LIMIT`.
fn check_limits(min: u32, initial: u32, max: u32) -> Result<(), ConfigError> {
    if 1 <= min && min <= initial && initial <= max && max <= MAX_ADAPTIVE_LIMIT {
        Ok(())
    } else {
        Err(ConfigError::InvalidLimits { min, initial, max })
    }
}

/// `value` in millionths, if it is finite and within `lo..=hi` (`lo..hi`
/// when `open_hi`).
fn ppm(
    value: f64,
    lo: f64,
    hi: f64,
    open_hi: bool,
    name: &'static str,
    range: &'static str,
) -> Result<u64, ConfigError> {
    let inside = value.is_finite() && value >= lo && (value < hi || (!open_hi && value == hi));
    if inside {
        // In range, so the product is a small non-negative integer after
        // rounding: the cast is exact.
        Ok((value * PPM as f64).round() as u64)
    } else {
        Err(ConfigError::InvalidParameter { name, range })
    }
}

/// A smoothing factor (how far each change of an estimate goes), in
/// millionths: it must be in `(0, 1]`, and not so small that it rounds to
/// nothing.
fn smoothing_ppm(smoothing: f64) -> Result<u64, ConfigError> {
    match ppm(smoothing, 0.0, 1.0, false, "smoothing", "(0, 1]")? {
        0 => Err(ConfigError::InvalidParameter {
            name: "smoothing",
            range: "(0, 1]",
        }),
        millionths => Ok(millionths),
    }
}

/// A ratio a drop multiplies the limit by (the parameter `name`), in
/// millionths: it must be in `[0.5, 1)`, so that a drop always shrinks the
/// limit and never by more than half.
fn backoff_ppm(ratio: f64, name: &'static str) -> Result<u64, ConfigError> {
    ppm(ratio, 0.5, 1.0, true, name, "[0.5, 1)")
}

/// `floor(log10(x))`, at least 1: Netflix's `Log10RootIntFunction` (which
/// is `max(1, (int) Math.log10(x))`, 1 for 0 too).
fn log10_at_least_1(x: u32) -> u32 {
    x.checked_ilog10().unwrap_or(0).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log10_matches_netflix_table() {
        for x in [0u32, 1, 9, 10, 99, 100, 999, 1000, 12345] {
            let reference = if x == 0 {
                1
            } else {
                ((x as f64).log10() as u32).max(1)
            };
            assert_eq!(log10_at_least_1(x), reference, "log10({x})");
        }
    }

    #[test]
    fn the_error_names_the_ceiling() {
        let err = check_limits(1, 1, MAX_ADAPTIVE_LIMIT + 1).unwrap_err();
        assert!(
            err.to_string()
                .ends_with(&format!("<= {MAX_ADAPTIVE_LIMIT}"))
        );
    }

    #[test]
    fn limits_are_checked() {
        assert!(check_limits(1, 1, 1).is_ok());
        assert!(check_limits(0, 1, 1).is_err());
        assert!(check_limits(2, 1, 3).is_err());
        assert!(check_limits(1, 4, 3).is_err());
        assert!(check_limits(1, 1, MAX_ADAPTIVE_LIMIT + 1).is_err());
    }

    #[test]
    fn ratios_become_exact_millionths() {
        assert_eq!(ppm(0.9, 0.5, 1.0, true, "r", "r"), Ok(900_000));
        assert_eq!(ppm(0.2, 0.0, 1.0, false, "r", "r"), Ok(200_000));
        assert_eq!(ppm(1.5, 1.0, 1000.0, false, "r", "r"), Ok(1_500_000));
        assert!(ppm(1.0, 0.5, 1.0, true, "r", "r").is_err());
        assert!(ppm(f64::NAN, 0.5, 1.0, true, "r", "r").is_err());
    }
}
