//! Additive increase, multiplicative decrease: Netflix concurrency-limits'
//! `AIMDLimit`, on one atomic word.
//!
//! | word | bits | meaning |
//! |---|---|---|
//! | state, bits 0..32 | 32 | the limit, in `min..=max` |
//! | state, bits 32..64 | 32 | zero |

use std::time::Duration;

use super::{LimitAlgorithm, LimitHistory, Outcome, PPM, Sample, apply, backoff_ppm, check_limits};
use crate::cell::{AtomicCell, StateCell};
use crate::error::ConfigError;

/// Additive increase, multiplicative decrease (Netflix concurrency-limits'
/// `AIMDLimit`).
///
/// On every sample:
///
/// - a drop, or a round trip longer than the timeout: `limit ← floor(limit ·
///   backoff_ratio)`;
/// - otherwise, when the request was admitted with at least half the limit
///   in flight (`2 · in_flight ≥ limit`): `limit ← limit + 1`; below that the
///   service was not pressed, and the sample says nothing;
///
/// then the limit is held in `min..=max`. An [`Outcome::Ignored`] sample
/// changes nothing.
///
/// Defaults, `AIMDLimit.Builder`'s: initial limit 20, **min 20**, max 200,
/// backoff ratio 0.9 (allowed in `[0.5, 1)`), timeout 5 s.
///
/// The limit is one atomic word; a sample whose compare-and-swap loses a race
/// is decided again on the new limit (folded in, never dropped), so every
/// sample counts once, as under `AIMDLimit`'s `synchronized`.
///
/// ```
/// use std::time::Duration;
/// use tollgate::{Aimd, LimitAlgorithm, Sample};
///
/// let aimd = Aimd::builder().initial_limit(100).max_limit(400).timeout(Duration::from_secs(1)).build()?;
/// assert_eq!(aimd.on_sample(Sample::success(1_000_000, 60), 0), Some(101));
/// assert_eq!(aimd.on_sample(Sample::success(1_000_000, 10), 0), None); // not pressed
/// assert_eq!(aimd.on_sample(Sample::success(2_000_000_000, 60), 0), Some(90)); // over the timeout
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
#[derive(Debug)]
pub struct Aimd {
    state: AtomicCell<u64>,
    min: u32,
    max: u32,
    backoff_ppm: u64,
    timeout_ns: u64,
    history: LimitHistory,
}

/// Configures an [`Aimd`]; every setting starts at `AIMDLimit`'s default.
#[derive(Debug, Clone)]
pub struct AimdBuilder {
    initial: u32,
    min: u32,
    max: u32,
    backoff_ratio: f64,
    timeout: Duration,
}

impl Default for AimdBuilder {
    fn default() -> Self {
        AimdBuilder {
            initial: 20,
            min: 20,
            max: 200,
            backoff_ratio: 0.9,
            timeout: Duration::from_secs(5),
        }
    }
}

impl AimdBuilder {
    setters! {
        /// The limit to start from (default 20). It must be at least the
        /// minimum, which is also 20 by default: to start lower, lower
        /// [`min_limit`](Self::min_limit) too, or `build` refuses the pair
        /// ([`ConfigError::InvalidLimits`]).
        initial_limit(limit: u32) -> initial;

        /// The lowest the limit goes (default 20, the anchor's: a limit that
        /// never sheds below 20 in flight, which may be more than a slow
        /// backend's whole capacity; set it to what the backend can take at
        /// its worst).
        min_limit(limit: u32) -> min;

        /// The highest the limit goes (default 200).
        max_limit(limit: u32) -> max;

        /// What a drop multiplies the limit by, in `[0.5, 1)` (default 0.9).
        backoff_ratio(ratio: f64) -> backoff_ratio;

        /// A round trip longer than this counts as a drop (default 5 s; longer
        /// than zero).
        timeout(timeout: Duration) -> timeout;
    }

    /// The algorithm, or why the configuration cannot be honoured:
    /// [`ConfigError::InvalidLimits`] unless `1 <= min <= initial <= max <=`
    /// [`MAX_ADAPTIVE_LIMIT`](crate::MAX_ADAPTIVE_LIMIT),
    /// [`ConfigError::InvalidParameter`] for a ratio or timeout out of range.
    ///
    /// ```
    /// use tollgate::{Aimd, ConfigError};
    ///
    /// assert_eq!(
    ///     Aimd::builder().backoff_ratio(1.0).build().unwrap_err(),
    ///     ConfigError::InvalidParameter { name: "backoff ratio", range: "[0.5, 1)" }
    /// );
    /// assert_eq!(
    ///     Aimd::builder().initial_limit(10).build().unwrap_err(), // below the default min, 20
    ///     ConfigError::InvalidLimits { min: 20, initial: 10, max: 200 }
    /// );
    /// ```
    pub fn build(self) -> Result<Aimd, ConfigError> {
        check_limits(self.min, self.initial, self.max)?;
        let backoff_ppm = backoff_ppm(self.backoff_ratio, "backoff ratio")?;
        let timeout_ns = u64::try_from(self.timeout.as_nanos()).unwrap_or(u64::MAX);
        if timeout_ns == 0 {
            return Err(ConfigError::InvalidParameter {
                name: "timeout",
                range: "longer than zero",
            });
        }
        Ok(Aimd {
            state: AtomicCell::new(u64::from(self.initial)),
            min: self.min,
            max: self.max,
            backoff_ppm,
            timeout_ns,
            history: LimitHistory::new(),
        })
    }
}

impl Aimd {
    /// A builder starting from `AIMDLimit`'s defaults.
    pub fn builder() -> AimdBuilder {
        AimdBuilder::default()
    }

    /// The lowest and highest limit.
    pub fn bounds(&self) -> (u32, u32) {
        (self.min, self.max)
    }

    /// The limit after `sample` from `limit`: the pure decision, `None` when
    /// it is unchanged (nothing is written: no store, no contention).
    fn decide(&self, AimdState(limit): AimdState, sample: &Sample) -> Option<AimdState> {
        let next = if sample.outcome == Outcome::Dropped || sample.rtt_ns > self.timeout_ns {
            // floor(limit · ratio), exact in millionths; limit < 2^21 and the
            // ratio < 10^6, so the product fits easily.
            (u64::from(limit) * self.backoff_ppm / PPM) as u32
        } else if u64::from(sample.in_flight) * 2 >= u64::from(limit) {
            limit.saturating_add(1)
        } else {
            limit
        };
        let next = next.clamp(self.min, self.max);
        (next != limit).then_some(AimdState(next))
    }
}

/// AIMD's whole state is its limit, the low 32 bits of its word.
#[derive(Clone, Copy)]
struct AimdState(u32);

impl AimdState {
    fn pack(self) -> u64 {
        u64::from(self.0)
    }

    fn unpack(word: u64) -> Self {
        AimdState(word as u32)
    }

    fn limit(self) -> u32 {
        self.0
    }
}

packed_algorithm!(Aimd, AimdState);

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// `AIMDLimit._update`, in floating point, as Netflix writes it.
    fn reference(limit: i64, ratio: f64, min: i64, max: i64, sample: &Sample, timeout: u64) -> i64 {
        let mut current = limit;
        if sample.outcome == Outcome::Dropped || sample.rtt_ns > timeout {
            current = (current as f64 * ratio) as i64;
        } else if i64::from(sample.in_flight) * 2 >= current {
            current += 1;
        }
        current.clamp(min, max)
    }

    #[test]
    fn matches_the_floating_point_reference() {
        for ratio in [0.5, 0.7, 0.9, 0.95, 0.999] {
            let aimd = Aimd::builder()
                .min_limit(1)
                .initial_limit(50)
                .max_limit(300)
                .backoff_ratio(ratio)
                .build()
                .unwrap();
            let mut expected = 50i64;
            let mut seed = 0x9e37_79b9_7f4a_7c15u64;
            for i in 0..2_000u64 {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let in_flight = (seed % 400) as u32;
                let rtt = (seed >> 20) % 6_000_000_000;
                let sample = if seed % 7 == 0 {
                    Sample::dropped(rtt, in_flight)
                } else {
                    Sample::success(rtt, in_flight)
                };
                expected = reference(expected, ratio, 1, 300, &sample, 5_000_000_000);
                aimd.on_sample(sample, i);
                assert_eq!(
                    i64::from(aimd.limit()),
                    expected,
                    "ratio {ratio}, sample {i}"
                );
            }
        }
    }

    #[test]
    fn ignored_samples_change_nothing() {
        let aimd = Aimd::builder().build().unwrap();
        assert_eq!(aimd.on_sample(Sample::ignored(1, 1_000), 0), None);
        assert_eq!(aimd.limit(), 20);
        assert_eq!(aimd.history().unwrap().changes(), 0);
    }

    #[test]
    fn stays_within_bounds() {
        let aimd = Aimd::builder().build().unwrap();
        for _ in 0..100 {
            aimd.on_sample(Sample::dropped(1, 1), 0);
        }
        assert_eq!(aimd.limit(), 20);
        for _ in 0..1_000 {
            aimd.on_sample(Sample::success(1, 1_000), 0);
        }
        assert_eq!(aimd.limit(), 200);
    }
}
