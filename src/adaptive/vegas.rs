//! TCP Vegas' queue estimate as a concurrency limit: Netflix
//! concurrency-limits' `VegasLimit`, on one 128-bit atomic word.
//!
//! | word | bits | meaning |
//! |---|---|---|
//! | state, bits 0..40 | 40 | the estimated limit, Q24.16 (1/65 536 of a permit) |
//! | state, bits 40..88 | 48 | the no-load round trip, ns (0: none yet; samples saturate at 2^48 − 1, 78 hours) |
//! | state, bits 88..120 | 32 | samples since the last probe |
//! | state, bits 120..128 | 8 | the probe jitter `j`: the next probe comes after `(256 + j) / 512 · probe_multiplier · limit` samples |

use super::{
    LIMIT_FRAC_BITS, LimitAlgorithm, LimitHistory, ONE, Outcome, Sample, app_limited, apply,
    check_limits, clamp_estimate, estimate_of, floor_limit, log10_at_least_1, smooth,
    smoothing_ppm,
};
use crate::cell::{AtomicCell, StateCell};
use crate::error::ConfigError;

const RTT_MAX: u64 = (1 << 48) - 1;
/// `VegasLimit`'s default `alphaFunc`: `3 · log10(limit)`.
const ALPHA_PER_LOG: u64 = 3;
/// `VegasLimit`'s default `betaFunc`: `6 · log10(limit)`.
const BETA_PER_LOG: u64 = 6;

/// TCP Vegas' queue estimate as a concurrency limit (Netflix
/// concurrency-limits' `VegasLimit`).
///
/// Vegas keeps the round trip of an unloaded service (`rtt_noload`, the
/// least seen) and infers from each sample how many requests are queued:
/// `queue = ceil(limit · (1 − rtt_noload / rtt))`. With `L = floor(limit)`
/// and `log = max(1, floor(log10 L))`, a sample
///
/// - first counts towards a probe: every `jitter · probe_multiplier · limit`
///   samples (jitter in `[0.5, 1)`) it takes its own round trip as the new
///   no-load round trip and stops there, so that a service that got slower
///   for good is eventually believed;
/// - then, if its round trip is the lowest yet, records it and stops;
/// - a drop: `limit − log`;
/// - admitted with fewer than half the limit in flight: no change;
/// - `queue ≤ log` (threshold): `limit + β` (no queue: grow fast);
/// - `queue < α`: `limit + log`;
/// - `queue > β`: `limit − log`;
/// - otherwise (between α and β) no change;
///
/// and the new value is held in `min..=max`, then smoothed:
/// `limit ← (1 − smoothing) · limit + smoothing · new`.
///
/// Defaults, `VegasLimit.Builder`'s: initial limit 20, max 1000
/// (`maxConcurrency`), α = 3 · log, β = 6 · log, smoothing 1.0, probe
/// multiplier 30. `VegasLimit` has no minimum beyond 1; the minimum here
/// defaults to 1. The probe's jitter is `ThreadLocalRandom` in Java; here
/// it is a hash of the probing sample's round trip, so a run is
/// reproducible.
///
/// State: one 128-bit word; a sample whose compare-and-swap loses a race is
/// decided again on the winner's state (folded in, never dropped).
///
/// ```
/// use tollgate::{LimitAlgorithm, Sample, Vegas};
///
/// let vegas = Vegas::builder().build()?;
/// vegas.on_sample(Sample::success(10_000_000, 20), 0); // the no-load round trip: 10 ms
/// // 10 ms again with 20 in flight: no queue, so the limit grows by β = 6.
/// assert_eq!(vegas.on_sample(Sample::success(10_000_000, 20), 1), Some(26));
/// // 20 ms with 26 in flight: a queue of 13 > β, so it shrinks by log10 = 1.
/// assert_eq!(vegas.on_sample(Sample::success(20_000_000, 26), 2), Some(25));
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
#[derive(Debug)]
pub struct Vegas {
    state: AtomicCell<u128>,
    min: u32,
    max: u32,
    alpha: Option<u32>,
    beta: Option<u32>,
    smoothing_ppm: u64,
    probe_multiplier: u32,
    history: LimitHistory,
}

/// Configures a [`Vegas`]; every setting starts at `VegasLimit`'s default.
#[derive(Debug, Clone)]
pub struct VegasBuilder {
    initial: u32,
    min: u32,
    max: u32,
    alpha: Option<u32>,
    beta: Option<u32>,
    smoothing: f64,
    probe_multiplier: u32,
}

impl Default for VegasBuilder {
    fn default() -> Self {
        VegasBuilder {
            initial: 20,
            min: 1,
            max: 1000,
            alpha: None,
            beta: None,
            smoothing: 1.0,
            probe_multiplier: 30,
        }
    }
}

impl VegasBuilder {
    setters! {
        /// The limit to start from (default 20).
        initial_limit(limit: u32) -> initial;

        /// The lowest the limit goes (default 1).
        min_limit(limit: u32) -> min;

        /// The highest the limit goes (`maxConcurrency`, default 1000).
        max_limit(limit: u32) -> max;

        /// A fixed α, the queue below which the limit grows (default `3 · log`).
        alpha(alpha: u32) -> alpha = Some(alpha);

        /// A fixed β, the queue above which the limit shrinks (default `6 · log`).
        beta(beta: u32) -> beta = Some(beta);

        /// How far each change goes, in `(0, 1]` (default 1.0: all the way).
        smoothing(smoothing: f64) -> smoothing;

        /// Probe for a new no-load round trip every `jitter · multiplier · limit`
        /// samples (default 30; at least 1).
        probe_multiplier(multiplier: u32) -> probe_multiplier;
    }

    /// The algorithm, or why the configuration cannot be honoured:
    /// [`ConfigError::InvalidLimits`] unless `1 <= min <= initial <= max <=`
    /// [`MAX_ADAPTIVE_LIMIT`](crate::MAX_ADAPTIVE_LIMIT),
    /// [`ConfigError::InvalidParameter`] for a smoothing outside `(0, 1]`, a
    /// probe multiplier outside `1..=1000`, or α above β.
    ///
    /// ```
    /// use tollgate::{ConfigError, Vegas};
    ///
    /// assert_eq!(
    ///     Vegas::builder().smoothing(0.0).build().unwrap_err(),
    ///     ConfigError::InvalidParameter { name: "smoothing", range: "(0, 1]" }
    /// );
    /// ```
    pub fn build(self) -> Result<Vegas, ConfigError> {
        check_limits(self.min, self.initial, self.max)?;
        let smoothing_ppm = smoothing_ppm(self.smoothing)?;
        if !(1..=1000).contains(&self.probe_multiplier) {
            return Err(ConfigError::InvalidParameter {
                name: "probe multiplier",
                range: "1..=1000",
            });
        }
        if let (Some(alpha), Some(beta)) = (self.alpha, self.beta) {
            if alpha > beta {
                return Err(ConfigError::InvalidParameter {
                    name: "alpha",
                    range: "at most beta",
                });
            }
        }
        let initial = VegasState {
            estimate: estimate_of(self.initial),
            rtt_noload: 0,
            probes: 0,
            jitter: 128,
        };
        Ok(Vegas {
            state: AtomicCell::new(initial.pack()),
            min: self.min,
            max: self.max,
            alpha: self.alpha,
            beta: self.beta,
            smoothing_ppm,
            probe_multiplier: self.probe_multiplier,
            history: LimitHistory::new(),
        })
    }
}

/// The unpacked word (see the module's table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct VegasState {
    estimate: u64,
    rtt_noload: u64,
    probes: u32,
    jitter: u8,
}

impl VegasState {
    fn pack(self) -> u128 {
        u128::from(self.estimate)
            | u128::from(self.rtt_noload) << 40
            | u128::from(self.probes) << 88
            | u128::from(self.jitter) << 120
    }

    fn unpack(word: u128) -> Self {
        VegasState {
            estimate: (word as u64) & ((1 << 40) - 1),
            rtt_noload: ((word >> 40) as u64) & RTT_MAX,
            probes: (word >> 88) as u32,
            jitter: (word >> 120) as u8,
        }
    }

    fn limit(self) -> u32 {
        floor_limit(self.estimate)
    }
}

impl Vegas {
    /// A builder starting from `VegasLimit`'s defaults.
    pub fn builder() -> VegasBuilder {
        VegasBuilder::default()
    }

    /// The lowest and highest limit.
    pub fn bounds(&self) -> (u32, u32) {
        (self.min, self.max)
    }

    /// The least round trip seen since the last probe, in ns (0 before the
    /// first sample).
    pub fn rtt_noload_ns(&self) -> u64 {
        VegasState::unpack(self.state.load()).rtt_noload
    }

    /// The state after `sample`, or `None` if the sample changes nothing:
    /// the pure decision (`VegasLimit._update`).
    fn decide(&self, s: VegasState, sample: &Sample) -> Option<VegasState> {
        let mut next = s;
        // A drop backs off and measures nothing: its round trip is the time
        // the service took to refuse, not a latency (a window of drops alone
        // reports none), so it neither probes nor lowers the no-load round
        // trip (Java lets it, and a link that refuses fast then holds the
        // limit far below its knee). A probe due now waits for a success.
        if sample.outcome == Outcome::Dropped {
            next.probes = s.probes.saturating_add(1);
            next.estimate = self.estimate(s.estimate, 1, 1, sample);
            return Some(next);
        }
        // Java throws on a round trip of 0; a success that carries no time
        // says nothing, so it is passed over.
        if sample.rtt_ns == 0 {
            return None;
        }
        let rtt = sample.rtt_ns.min(RTT_MAX);
        next.probes = s.probes.saturating_add(1);
        // shouldProbe: jitter · multiplier · estimate <= probes, with jitter
        // = (256 + j) / 512 and the estimate in Q.16: both sides times 2^25.
        let threshold = u128::from(256 + u32::from(s.jitter))
            * u128::from(self.probe_multiplier)
            * u128::from(s.estimate);
        if threshold <= u128::from(next.probes) << (9 + LIMIT_FRAC_BITS) {
            next.jitter = jitter_from(rtt, s.probes);
            next.probes = 0;
            next.rtt_noload = rtt;
            return Some(next);
        }
        if s.rtt_noload == 0 || rtt < s.rtt_noload {
            next.rtt_noload = rtt;
            return Some(next);
        }
        next.estimate = self.estimate(s.estimate, rtt, s.rtt_noload, sample);
        Some(next)
    }

    /// `updateEstimatedLimit`: the new estimate, Q.16.
    fn estimate(&self, estimate: u64, rtt: u64, rtt_noload: u64, sample: &Sample) -> u64 {
        let limit = floor_limit(estimate);
        let log = u64::from(log10_at_least_1(limit));
        let new = if sample.outcome == Outcome::Dropped {
            estimate.saturating_sub(log * ONE)
        } else if app_limited(sample.in_flight, estimate) {
            // Prevent upward drift if not close to the limit.
            return estimate;
        } else {
            // queue = ceil(estimate · (1 − noload / rtt)) = ceil(estimate ·
            // (rtt − noload) / rtt), exact in integers: estimate < 2^40,
            // rtt < 2^48.
            let num = u128::from(estimate) * u128::from(rtt - rtt_noload);
            let den = u128::from(rtt) << LIMIT_FRAC_BITS;
            let queue = num.div_ceil(den) as u64;
            let alpha = self.alpha.map_or(ALPHA_PER_LOG * log, u64::from);
            let beta = self.beta.map_or(BETA_PER_LOG * log, u64::from);
            if queue <= log {
                estimate + beta * ONE
            } else if queue < alpha {
                estimate + log * ONE
            } else if queue > beta {
                estimate.saturating_sub(log * ONE)
            } else {
                return estimate;
            }
        };
        let new = clamp_estimate(new, self.min, self.max);
        // Both below 2^41: the smoothed value is too.
        smooth(estimate, u128::from(new), self.smoothing_ppm) as u64
    }
}

/// The next probe's jitter: eight bits of a SplitMix64 hash of the probing
/// sample's round trip and the probe count, so that a simulation is
/// reproducible and probes of a loaded service still spread out.
fn jitter_from(rtt: u64, probes: u32) -> u8 {
    let mut z = rtt ^ u64::from(probes).rotate_left(32) ^ 0x9e37_79b9_7f4a_7c15;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)) as u8
}

packed_algorithm!(Vegas, VegasState);

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// `VegasLimit`, in floating point, as Netflix writes it, with this
    /// crate's deterministic jitter in place of `ThreadLocalRandom`.
    struct Reference {
        estimated: f64,
        rtt_noload: u64,
        probe_count: u32,
        jitter: u8,
        smoothing: f64,
        max: f64,
    }

    impl Reference {
        fn log10(x: i64) -> i64 {
            if x < 1 {
                1
            } else {
                ((x as f64).log10() as i64).max(1)
            }
        }

        fn update(&mut self, rtt: u64, inflight: u32, did_drop: bool) {
            self.probe_count += 1;
            // tollgate's rule, not Java's: a drop only backs off.
            if did_drop {
                let est = self.estimated;
                let l = Self::log10(est as i64) as f64;
                let new = (est - l).min(self.max).max(1.0);
                self.estimated = (1.0 - self.smoothing) * est + self.smoothing * new;
                return;
            }
            let jitter = (256.0 + f64::from(self.jitter)) / 512.0;
            if jitter * 30.0 * self.estimated <= f64::from(self.probe_count) {
                self.jitter = jitter_from(rtt, self.probe_count - 1);
                self.probe_count = 0;
                self.rtt_noload = rtt;
                return;
            }
            if self.rtt_noload == 0 || rtt < self.rtt_noload {
                self.rtt_noload = rtt;
                return;
            }
            let est = self.estimated;
            let queue = (est * (1.0 - self.rtt_noload as f64 / rtt as f64)).ceil() as i64;
            let l = Self::log10(est as i64) as f64;
            let new = if did_drop {
                est - l
            } else if f64::from(inflight) * 2.0 < est {
                return;
            } else {
                let (alpha, beta) = (3.0 * l, 6.0 * l);
                if queue as f64 <= l {
                    est + beta
                } else if (queue as f64) < alpha {
                    est + l
                } else if queue as f64 > beta {
                    est - l
                } else {
                    return;
                }
            };
            let new = new.min(self.max).max(1.0);
            self.estimated = (1.0 - self.smoothing) * est + self.smoothing * new;
        }
    }

    #[test]
    fn matches_the_floating_point_reference() {
        for smoothing in [1.0, 0.5, 0.2] {
            let vegas = Vegas::builder()
                .smoothing(smoothing)
                .max_limit(500)
                .build()
                .unwrap();
            let mut reference = Reference {
                estimated: 20.0,
                rtt_noload: 0,
                probe_count: 0,
                jitter: 128,
                smoothing,
                max: 500.0,
            };
            let mut seed = 0x2545_f491_4f6c_dd1du64;
            for i in 0..5_000u64 {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let limit = vegas.limit();
                // In flight around the limit; round trips 10 ms plus a queue.
                let in_flight = (limit / 3 + (seed % u64::from(limit + 1)) as u32).max(1);
                let rtt = 10_000_000 + (seed >> 16) % 8_000_000 * u64::from(in_flight) / 20;
                let dropped = seed % 97 == 0;
                // Each step starts the reference from this crate's state, so
                // the comparison is of one step's arithmetic, not of rounding
                // accumulated over thousands.
                let before = VegasState::unpack(vegas.state.load());
                reference.estimated = before.estimate as f64 / ONE as f64;
                reference.update(rtt, in_flight, dropped);
                let sample = Sample {
                    rtt_ns: rtt,
                    in_flight,
                    outcome: if dropped {
                        Outcome::Dropped
                    } else {
                        Outcome::Success
                    },
                };
                vegas.on_sample(sample, i);
                let state = VegasState::unpack(vegas.state.load());
                assert_eq!(state.rtt_noload, reference.rtt_noload, "sample {i}");
                assert_eq!(state.probes, reference.probe_count, "sample {i}");
                let estimate = state.estimate as f64 / ONE as f64;
                assert!(
                    (estimate - reference.estimated).abs() < 1e-4,
                    "sample {i}, smoothing {smoothing}: {estimate} vs {}",
                    reference.estimated
                );
            }
        }
    }

    #[test]
    fn packs_and_unpacks() {
        let s = VegasState {
            estimate: (1 << 40) - 1,
            rtt_noload: RTT_MAX,
            probes: u32::MAX,
            jitter: 255,
        };
        assert_eq!(VegasState::unpack(s.pack()), s);
    }
}
