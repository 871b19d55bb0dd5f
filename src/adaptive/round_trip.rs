//! tollgate's own adaptive algorithm: one decision per observed round trip,
//! on three atomic words.
//!
//! | word | bits | meaning |
//! |---|---|---|
//! | round, bits 0..48 | 48 | when the open round opened, µs on the limiter's clock (8.9 years) |
//! | round, bits 48..60 | 12 | successes averaged (saturating at 4 095: a full round keeps its mean) |
//! | round, bits 60..108 | 48 | the sum of their round trips, ns (each counted at most 2^36 − 1, 68 s) |
//! | round, bits 108..124 | 16 | the most requests in flight a success of the round was admitted with (saturating) |
//! | filters, bits 0..40 | 40 | the baseline: the no-load round trip, ns (0: none yet; 18 minutes at most) |
//! | filters, bits 40..80 | 40 | the smoothed round trip over rounds, ns |
//! | filters, bits 80..112 | 32 | its mean deviation, ns (saturating at 4.3 s) |
//! | filters, bits 112..120 | 8 | successes smoothed, saturating at 255 |
//! | control, bits 0..21 | 21 | the limit, in `min..=max` |
//! | control, bits 21..42 | 21 | the ceiling: the fewest in flight a fresh drop was admitted with (0: none) |
//! | control, bits 42..45 | 3 | the hold exponent: trying the ceiling again waits `2 << exponent` rounds |
//! | control, bits 45..53 | 8 | rounds held below the ceiling so far; while probing, probe samples taken |
//! | control, bits 53..58 | 5 | consecutive rounds that grew the limit (saturating at 31) |
//! | control, bits 58..74 | 16 | while probing, the longest (first probe) or shortest of its round trips, in 1/64 of the baseline |
//! | control, bit 74 | 1 | probing: the limit reads as the minimum |
//! | control, bits 75..123 | 48 | when the limit last backed off on a drop, µs |
//! | control, bits 123..127 | 4 | consecutive rounds that shrank the limit on latency |
//! | control, bit 127 | 1 | growth pending: the last round allowed growth but no success had yet filled the limit |
//!
//! A success first lands in the round word. A success that was admitted
//! after the open round opened has seen one whole round trip of it: it
//! closes the round (the same compare-and-swap that reads the aggregate
//! opens the next round, so each sample lands in exactly one round and each
//! round closes once) and the closer decides on the control word. A drop
//! decides on the control word at once; the control word's back-off time
//! makes that once per round trip, inside its own compare-and-swap. The
//! filters are folded by the closers (one compare-and-swap loop each); the
//! baseline only moves down, except when a probe raises it. A stale read of
//! the filters costs one round's decision its precision, never the limit's
//! bounds.

use super::{LimitAlgorithm, LimitHistory, Outcome, PPM, Sample, apply, backoff_ppm, check_limits};
use crate::cell::{AtomicCell, StateCell};
use crate::error::ConfigError;

/// The largest baseline, ns (18 minutes).
const RTT_MAX: u64 = (1 << 40) - 1;
/// SRTT moves 1/SRTT_GAIN of the way to each round's mean.
const SRTT_GAIN: u64 = 16;
/// Successes the smoothed round trip averages plainly before it is an
/// exponential average over rounds.
const WARM_SAMPLES: u32 = 255;
/// A round trip counts at most this long in a round's average, ns (68 s).
const SAMPLE_MAX: u64 = (1 << 36) - 1;
/// Times in the round and control words are µs, in 48 bits (8.9 years).
const US_MASK: u64 = (1 << 48) - 1;
const COUNT_MAX: u64 = (1 << 12) - 1;
const SUM_MASK: u64 = (1 << 48) - 1;
const IN_FLIGHT_MAX: u32 = u16::MAX as u32;
const LIMIT_MASK: u128 = (1 << 21) - 1;
/// Consecutive growing rounds after which growth speeds up.
const STEADY_ROUNDS: u32 = 8;
/// Consecutive shrinking rounds after which a probe runs.
const SHRINKING_PROBE: u32 = 8;
/// The largest deviation kept, ns (4.3 s).
const DEV_MAX: u64 = u32::MAX as u64;
/// Round trips a probe measures at the minimum.
const PROBE_SAMPLES: u32 = 4;
/// The largest hold exponent: a hold of 2 << 7 = 256 rounds.
const HOLD_EXP_MAX: u32 = 7;

/// tollgate's recommended adaptive algorithm: one decision per observed
/// round trip, from the queue the round's latency implies against the
/// service's unloaded latency, and a multiplicative back-off, once per round
/// trip, on a drop.
///
/// **Rounds.** A round opens when the previous one closes and closes when a
/// request admitted after it opened answers: one round trip of the service,
/// however long (a millisecond or a minute) and however few requests the
/// limit lets through (one is enough). No window to fill, no minimum sample
/// count: a limit of 1 on a slow service decides as often as a limit of 500
/// on a fast one. A round averages the round trips of its successes admitted
/// with the most requests in flight (within an eighth: one admitted into a
/// lull did not wait behind the queue), each counted at most twice the
/// smoothed round trip (a rare straggler is not a queue).
///
/// **Latency.** The rounds' means are smoothed (`srtt`, with their mean
/// deviation `dev`: TCP's SRTT and RTTVAR, over rounds). The **baseline**,
/// the service's unloaded round trip, is first measured at the minimum
/// limit, then follows the smoothed round trip down. By Little's law a round
/// implies `queue = used · (rtt − baseline − tolerance) / rtt` requests
/// waiting, with `rtt` the round's mean, `used` the most in flight its
/// successes were admitted with (at most the limit), and a tolerance of
/// `dev` to shrink and `dev / 2` to grow, so that noise moves the limit
/// neither down nor into a queue:
///
/// - `queue > β`: the limit comes down by half the excess over
///   `(α + β) / 2`, at least 1: a service whose capacity halves is followed
///   within a few round trips;
/// - `queue < α`, in a **limit-bound** round (a success was admitted with
///   the whole limit in flight): the limit grows by 1, and after 8 growing
///   rounds in a row by 2, 4, 8, … (at most half the limit) a round, so a
///   cold start reaches a large service in seconds. If no success filled
///   the limit yet, the first that does grows it. A client that never fills
///   its limit (app-limited) never grows it;
/// - otherwise the limit holds.
///
/// `α = max(alpha, limit / 50)` and `β = max(beta, limit / 20)`, with
/// `alpha` 2 and `beta` 4 by default (Linux `tcp_vegas`'s): a queue of a
/// few requests at small limits, 2–5 % of the round trip at large ones.
///
/// **Drops.** A drop (a timeout, a refusal, an overload answer) of a
/// request admitted after the last back-off multiplies the limit by
/// `backoff_ratio` (0.7) at once; drops of requests admitted before it are
/// that same congestion and pass. A drop also records a **ceiling**, the
/// in-flight count the dropped request was admitted with: growth stops one
/// below it and waits there `2 << k` rounds before trying it again, `k`
/// counting the failed tries (at most 256 rounds), and a failed try goes
/// back to just below the ceiling rather than by the ratio. A round at the
/// ceiling without a drop, with a success admitted at it, clears it. A
/// service that refuses, or never answers, above a fixed concurrency is so
/// tried ever more rarely, not every round trip.
///
/// **Probes.** A limit built with an initial limit above its minimum first
/// reads as the minimum for 4 round trips, which measure the baseline
/// unloaded (the longest of them is taken, an upper estimate that the
/// smoothed round trip brings down; a limit that starts at its minimum
/// takes half again its first round's mean). When the limit has shrunk 8
/// rounds in a row, the service may have become slower for good, which a
/// queue estimate cannot tell from a queue: the limit reads as the minimum
/// for 4 round trips again, and the shortest of them raises a baseline
/// below it (never above the smoothed round trip). Round trips that are not
/// the service's (an answer from a local cache) should end with
/// [`ignore`](crate::AdaptivePermit::ignore): a baseline far below the
/// service's would read every round as a queue.
///
/// Defaults: initial limit the minimum, min 1, max 1000, backoff ratio 0.7 (in
/// `[0.5, 1)`), α 2, β 4. The behaviours it is held to (a cold start on
/// links from 1 ms to 1 s, jitter, a latency knee, latency proportional to
/// load, errors and silence above a concurrency, an attempt-rate cap, open
/// loops) and the six long scenarios of the crate's simulator are tabulated
/// in `docs/adaptive.md`, beside the other algorithms'.
///
/// State: three atomic words (the open round, the latency filters, the
/// control word), each changed only by the crate's one compare-and-swap
/// loop; no lock on the release path.
///
/// ```
/// use tollgate::{LimitAlgorithm, RoundTrip, Sample};
///
/// let ms = 1_000_000;
/// let rt = RoundTrip::default();
/// assert_eq!(rt.limit(), 1);
/// // A request admitted at 0 with the whole limit in flight answers at
/// // 100 ms: the first round closes, shows no queue, and the limit grows.
/// assert_eq!(rt.on_sample(Sample::success(100 * ms, 1), 100 * ms), Some(2));
/// // A drop of one admitted at 110 ms backs off at once: floor(2 · 0.7) = 1,
/// // and 2 in flight is now a ceiling.
/// assert_eq!(rt.on_sample(Sample::dropped(50 * ms, 2), 160 * ms), Some(1));
/// assert_eq!(rt.ceiling(), Some(2));
/// // A drop of one admitted before that back-off is the same congestion.
/// assert_eq!(rt.on_sample(Sample::dropped(100 * ms, 2), 170 * ms), None);
/// // Below the ceiling, growth waits two rounds before trying it again.
/// assert_eq!(rt.on_sample(Sample::success(100 * ms, 1), 300 * ms), None);
/// assert_eq!(rt.on_sample(Sample::success(100 * ms, 1), 410 * ms), Some(2));
/// ```
#[derive(Debug)]
pub struct RoundTrip {
    round: AtomicCell<u128>,
    control: AtomicCell<u128>,
    filters: AtomicCell<u128>,
    min: u32,
    max: u32,
    backoff_ppm: u64,
    alpha: u32,
    beta: u32,
    history: LimitHistory,
}

/// Configures a [`RoundTrip`]; every setting starts at the recommended
/// default.
#[derive(Debug, Clone)]
pub struct RoundTripBuilder {
    initial: Option<u32>,
    min: u32,
    max: u32,
    backoff_ratio: f64,
    alpha: u32,
    beta: u32,
}

impl Default for RoundTripBuilder {
    fn default() -> Self {
        RoundTripBuilder {
            initial: None,
            min: 1,
            max: 1000,
            backoff_ratio: 0.7,
            alpha: 2,
            beta: 4,
        }
    }
}

impl RoundTripBuilder {
    setters! {
        /// The limit to start from (default: the minimum). Above the minimum,
        /// the first four round trips still run at the minimum, to measure the
        /// service unloaded.
        initial_limit(limit: u32) -> initial = Some(limit);

        /// The lowest the limit goes, and the limit a probe drains to (default 1).
        min_limit(limit: u32) -> min;

        /// The highest the limit goes (default 1000).
        max_limit(limit: u32) -> max;

        /// What a drop multiplies the limit by, in `[0.5, 1)` (default 0.7).
        backoff_ratio(ratio: f64) -> backoff_ratio;

        /// The queue, in requests, below which a limit-bound round grows the
        /// limit (default 2; at least `limit / 50`).
        alpha(alpha: u32) -> alpha;

        /// The queue, in requests, above which a round shrinks the limit
        /// (default 4; at least `limit / 20`).
        beta(beta: u32) -> beta;
    }

    /// The algorithm, or why the configuration cannot be honoured:
    /// [`ConfigError::InvalidLimits`] unless `1 <= min <= initial <= max <=`
    /// [`MAX_ADAPTIVE_LIMIT`](crate::MAX_ADAPTIVE_LIMIT),
    /// [`ConfigError::InvalidParameter`] for a ratio out of `[0.5, 1)`, an α
    /// of 0 or above β, or a β above
    /// [`MAX_ADAPTIVE_LIMIT`](crate::MAX_ADAPTIVE_LIMIT).
    ///
    /// ```
    /// use tollgate::{ConfigError, RoundTrip};
    ///
    /// assert_eq!(
    ///     RoundTrip::builder().alpha(5).beta(4).build().unwrap_err(),
    ///     ConfigError::InvalidParameter { name: "alpha", range: "1..=beta" }
    /// );
    /// assert!(RoundTrip::builder().initial_limit(1).max_limit(50).build().is_ok());
    /// ```
    pub fn build(self) -> Result<RoundTrip, ConfigError> {
        let initial = self.initial.unwrap_or(self.min);
        check_limits(self.min, initial, self.max)?;
        let backoff_ppm = backoff_ppm(self.backoff_ratio, "backoff ratio")?;
        if self.alpha == 0 || self.alpha > self.beta {
            return Err(ConfigError::InvalidParameter {
                name: "alpha",
                range: "1..=beta",
            });
        }
        if self.beta > super::MAX_ADAPTIVE_LIMIT {
            return Err(ConfigError::InvalidParameter {
                name: "beta",
                range: "alpha..=MAX_ADAPTIVE_LIMIT",
            });
        }
        // The first rounds are a probe: the no-load round trip is measured
        // with the minimum in flight before the limit opens up to
        // `initial`, so a queue the initial limit builds is never taken
        // for the service's own latency.
        let control = Control {
            limit: initial,
            // A limit that starts at its minimum measures the service at
            // it anyway: no probe.
            probing: initial > self.min,
            ..Control::default()
        };
        Ok(RoundTrip {
            round: AtomicCell::new(Round::opened(0).pack()),
            control: AtomicCell::new(control.pack()),
            filters: AtomicCell::new(0),
            min: self.min,
            max: self.max,
            backoff_ppm,
            alpha: self.alpha,
            beta: self.beta,
            history: LimitHistory::new(),
        })
    }
}

impl Default for RoundTrip {
    /// The recommended configuration (see [`RoundTrip`]'s defaults).
    fn default() -> Self {
        RoundTripBuilder::default()
            .build()
            .expect("the defaults are valid")
    }
}

/// A [`RoundTrip`]'s open round (see [`RoundTrip::open_round`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RoundStats {
    /// Successes averaged so far (those admitted with the most in flight,
    /// within an eighth).
    pub samples: u32,
    /// Their mean round trip, ns (0 if none).
    pub mean_rtt_ns: u64,
    /// The most requests in flight a success of the round was admitted
    /// with.
    pub max_in_flight: u32,
}

/// The open round, unpacked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Round {
    opened_us: u64,
    count: u64,
    sum: u64,
    max_in_flight: u32,
}

impl Round {
    fn opened(at_us: u64) -> Self {
        Round {
            opened_us: at_us & US_MASK,
            count: 0,
            sum: 0,
            max_in_flight: 0,
        }
    }

    fn pack(self) -> u128 {
        u128::from(self.opened_us)
            | u128::from(self.count) << 48
            | u128::from(self.sum) << 60
            | u128::from(self.max_in_flight) << 108
    }

    fn unpack(word: u128) -> Self {
        Round {
            opened_us: (word as u64) & US_MASK,
            count: ((word >> 48) as u64) & COUNT_MAX,
            sum: ((word >> 60) as u64) & SUM_MASK,
            max_in_flight: ((word >> 108) as u32) & IN_FLIGHT_MAX,
        }
    }

    /// With a success of `rtt` admitted with `in_flight` added: the round
    /// averages the successes admitted with the most in flight (within an
    /// eighth), the latency at the round's operating point. A request
    /// admitted into a momentary lull (after a back-off, a probe, a gap in
    /// arrivals) did not wait behind the queue the others did: its round
    /// trip would hide that queue.
    fn with(self, rtt: u64, in_flight: u32) -> Self {
        let rtt = rtt.min(SAMPLE_MAX);
        let in_flight = in_flight.min(IN_FLIGHT_MAX);
        let peak = self.max_in_flight.max(in_flight);
        let floor = peak - peak / 8;
        let (count, sum) = if self.max_in_flight < floor {
            // The operating point moved up past what the round kept (or the
            // round is empty): start the average again.
            (1, rtt)
        } else if in_flight >= floor && self.count < COUNT_MAX {
            // A full round keeps its mean: count and sum stop together.
            (self.count + 1, self.sum + rtt)
        } else {
            (self.count, self.sum)
        };
        Round {
            opened_us: self.opened_us,
            count,
            sum,
            max_in_flight: peak,
        }
    }

    fn mean(self) -> u64 {
        self.sum / self.count.max(1)
    }
}

/// The latency filters, unpacked: the no-load round trip, the smoothed
/// round trip and its mean deviation (TCP's SRTT and RTTVAR, over rounds),
/// and how many rounds they have smoothed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Filters {
    baseline: u64,
    srtt: u64,
    dev: u64,
    rounds: u32,
}

impl Filters {
    fn pack(self) -> u128 {
        u128::from(self.baseline.min(RTT_MAX))
            | u128::from(self.srtt.min(RTT_MAX)) << 40
            | u128::from(self.dev.min(DEV_MAX)) << 80
            | u128::from(self.rounds.min(WARM_SAMPLES)) << 112
    }

    fn unpack(word: u128) -> Self {
        Filters {
            baseline: (word as u64) & RTT_MAX,
            srtt: ((word >> 40) as u64) & RTT_MAX,
            dev: ((word >> 80) as u64) & DEV_MAX,
            rounds: ((word >> 112) & 0xff) as u32,
        }
    }

    /// After a round of `count` successes of mean `mean`: SRTT is the
    /// plain mean of the first `WARM_SAMPLES` successes, then moves an
    /// eighth of the way each round (the first rounds of a small limit hold
    /// a sample or two, and one or two round trips of a noisy service are
    /// no estimate); the deviation moves a quarter; from then on the
    /// baseline follows SRTT down.
    fn after(self, mean: u64, count: u64) -> Self {
        let mean = mean.min(RTT_MAX);
        let count = count.clamp(1, u64::from(WARM_SAMPLES));
        if self.srtt == 0 {
            return Filters {
                // No probe measured one (the limit started at its minimum):
                // the first round's, half again, as an upper estimate that
                // the smoothed round trip brings down once it is warm.
                baseline: if self.baseline == 0 {
                    mean.saturating_add(mean / 2).min(RTT_MAX)
                } else {
                    self.baseline
                },
                srtt: mean,
                dev: 0,
                rounds: count as u32,
            };
        }
        let seen = u64::from(self.rounds);
        let srtt = if seen < u64::from(WARM_SAMPLES) {
            // Weighted by successes: (srtt · seen + mean · count) / total.
            ((u128::from(self.srtt) * u128::from(seen) + u128::from(mean) * u128::from(count))
                / u128::from(seen + count)) as u64
        } else if mean >= self.srtt {
            self.srtt + (mean - self.srtt) / SRTT_GAIN
        } else {
            self.srtt - (self.srtt - mean) / SRTT_GAIN
        };
        let dev = self.dev - self.dev / 4 + mean.abs_diff(self.srtt) / 4;
        // Warm once the plain mean is a good estimate: after 16 successes
        // on a steady service (rounds within 2 % of each other), after
        // `WARM_SAMPLES` on a noisy one.
        let total = seen + count;
        let warm =
            total >= u64::from(WARM_SAMPLES) || (total >= 16 && dev.saturating_mul(50) < srtt);
        Filters {
            baseline: if warm {
                self.baseline.min(srtt)
            } else {
                self.baseline
            },
            srtt,
            dev,
            rounds: if warm { WARM_SAMPLES } else { total as u32 },
        }
    }
}

/// The control word, unpacked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Control {
    limit: u32,
    ceiling: u32,
    hold_exp: u32,
    held: u32,
    growing: u32,
    probe_stat: u32,
    probing: bool,
    backed_off_us: u64,
    shrinking: u32,
    pending: bool,
}

impl Control {
    fn pack(self) -> u128 {
        u128::from(self.limit)
            | u128::from(self.ceiling) << 21
            | u128::from(self.hold_exp) << 42
            | u128::from(self.held) << 45
            | u128::from(self.growing) << 53
            | u128::from(self.probe_stat) << 58
            | u128::from(self.probing) << 74
            | u128::from(self.backed_off_us & US_MASK) << 75
            | u128::from(self.shrinking) << 123
            | u128::from(self.pending) << 127
    }

    fn unpack(word: u128) -> Self {
        Control {
            limit: (word & LIMIT_MASK) as u32,
            ceiling: ((word >> 21) & LIMIT_MASK) as u32,
            hold_exp: ((word >> 42) & 0x7) as u32,
            held: ((word >> 45) & 0xff) as u32,
            growing: ((word >> 53) & 0x1f) as u32,
            probe_stat: ((word >> 58) & 0xffff) as u32,
            probing: (word >> 74) & 1 == 1,
            backed_off_us: ((word >> 75) as u64) & US_MASK,
            shrinking: ((word >> 123) & 0xf) as u32,
            pending: (word >> 127) == 1,
        }
    }
}

impl RoundTrip {
    /// A builder starting from the recommended defaults.
    pub fn builder() -> RoundTripBuilder {
        RoundTripBuilder::default()
    }

    /// The lowest and highest limit.
    pub fn bounds(&self) -> (u32, u32) {
        (self.min, self.max)
    }

    /// The no-load round trip the queue is measured against, in ns (0
    /// before the first success).
    pub fn baseline_ns(&self) -> u64 {
        Filters::unpack(self.filters.load()).baseline
    }

    /// The smoothed round trip of the latest rounds, in ns (0 before the
    /// first round closed).
    pub fn smoothed_ns(&self) -> u64 {
        Filters::unpack(self.filters.load()).srtt
    }

    /// The limit the algorithm returns to after a probe, which
    /// [`limit`](LimitAlgorithm::limit) reads as the minimum while one runs.
    pub fn estimate(&self) -> u32 {
        Control::unpack(self.control.load()).limit
    }

    /// The open round, as a dashboard would show it: the successes it
    /// averages so far, their mean round trip, and the most in flight any
    /// of them was admitted with.
    ///
    /// ```
    /// use tollgate::{LimitAlgorithm, RoundStats, RoundTrip, Sample};
    ///
    /// let ms = 1_000_000;
    /// let rt = RoundTrip::default();
    /// rt.on_sample(Sample::success(100 * ms, 1), 100 * ms); // closes the first round
    /// rt.on_sample(Sample::success(80 * ms, 1), 150 * ms); // admitted at 70 ms: joins the next
    /// assert_eq!(
    ///     rt.open_round(),
    ///     RoundStats { samples: 1, mean_rtt_ns: 80 * ms, max_in_flight: 1 }
    /// );
    /// ```
    pub fn open_round(&self) -> RoundStats {
        let round = Round::unpack(self.round.load());
        RoundStats {
            samples: round.count as u32,
            mean_rtt_ns: if round.count == 0 { 0 } else { round.mean() },
            max_in_flight: round.max_in_flight,
        }
    }

    /// The ceiling a drop left, if growth is being held below it.
    pub fn ceiling(&self) -> Option<u32> {
        match Control::unpack(self.control.load()).ceiling {
            0 => None,
            c => Some(c),
        }
    }

    /// Whether a no-load probe is running (the limit reads as the minimum).
    pub fn probing(&self) -> bool {
        Control::unpack(self.control.load()).probing
    }

    fn limit_of(&self, control: Control) -> u32 {
        if control.probing {
            self.min
        } else {
            control.limit
        }
    }

    /// The queue estimate's thresholds at `limit`.
    fn thresholds(&self, limit: u32) -> (u64, u64) {
        (
            u64::from(self.alpha.max(limit / 50)),
            u64::from(self.beta.max(limit / 20)),
        )
    }

    /// The control word after a fresh drop admitted with `in_flight`, or
    /// `None` if the drop is of a request admitted before the last back-off.
    fn back_off(
        &self,
        c: Control,
        started_us: u64,
        now_us: u64,
        in_flight: u32,
    ) -> Option<Control> {
        if started_us < c.backed_off_us {
            return None;
        }
        let mut next = c;
        let in_flight = in_flight.clamp(1, LIMIT_MASK as u32);
        next.limit = if c.ceiling != 0 && in_flight >= c.ceiling && c.limit >= c.ceiling {
            // A try of the ceiling failed: back to below it, where the
            // limit just held for rounds without a drop.
            c.ceiling - 1
        } else {
            // floor(limit · ratio), exact in millionths: limit < 2^21.
            (u64::from(c.limit) * self.backoff_ppm / PPM) as u32
        }
        .clamp(self.min, self.max);
        next.backed_off_us = now_us.max(c.backed_off_us);
        next.growing = 0;
        next.held = 0;
        next.pending = false;
        if c.ceiling != 0 && in_flight >= c.ceiling {
            // The ceiling was tried again and failed: hold longer next time.
            next.hold_exp = (c.hold_exp + 1).min(HOLD_EXP_MAX);
        } else {
            next.ceiling = in_flight;
            next.hold_exp = 0;
        }
        Some(next)
    }

    /// The control word after a probe's round: only a request admitted
    /// under the probe's limit measured the service with (at most) the
    /// minimum in flight; one admitted before the limit came down is not a
    /// measurement.
    fn close_probe(&self, c: Control, f: Filters, rtt: u64, in_flight: u32) -> Control {
        let mut next = c;
        if in_flight <= self.min {
            // The probe's round trips are kept in 1/64 of the baseline
            // (at most 1 024 times it): the first probe keeps the
            // longest, an upper estimate the smoothed round trips bring
            // down once they are many; a later one the shortest, a
            // lower estimate that may only raise the baseline.
            let ratio =
                (u128::from(rtt) * 64 / u128::from(f.baseline.max(1))).clamp(1, 0xffff) as u32;
            next.probe_stat = if c.probe_stat == 0 {
                ratio
            } else if f.srtt == 0 {
                c.probe_stat.max(ratio)
            } else {
                c.probe_stat.min(ratio)
            };
            next.held = c.held + 1;
            if next.held >= PROBE_SAMPLES {
                next.probing = false;
                next.held = 0;
            }
        }
        next
    }

    /// The control word after round `r`, closed by a success of `rtt`
    /// admitted with `in_flight`, with `f` the latency filters after it.
    fn close(&self, c: Control, r: Round, f: Filters, rtt: u64, in_flight: u32) -> Control {
        if c.probing {
            return self.close_probe(c, f, rtt, in_flight);
        }
        let mut next = c;
        if c.ceiling != 0
            && c.limit >= c.ceiling
            && r.max_in_flight >= c.ceiling
            && c.backed_off_us < r.opened_us
        {
            // A whole round at the ceiling without a drop, and a success
            // admitted with the ceiling in flight: the ceiling was not the
            // service's (or is no longer). Either alone is not enough: a
            // round closes on requests admitted below the ceiling while the
            // ones at it hang, and a request counts in flight beside
            // refusals still on their way back.
            next.ceiling = 0;
            next.hold_exp = 0;
            next.held = 0;
        }
        next.pending = false;
        let limit = c.limit;
        let used = r.max_in_flight.min(limit);
        let rtt = r.mean().max(1);
        let (alpha, beta) = self.thresholds(limit);
        let (shrink_num, grow_num, rtt_den) = queue_terms(used, rtt, f);
        if shrink_num > u128::from(beta) * rtt_den {
            let queue = (shrink_num / rtt_den) as u64;
            let step = ((queue - (alpha + beta) / 2) / 2).max(1);
            next.limit = (u64::from(limit).saturating_sub(step) as u32).max(self.min);
            next.growing = 0;
            next.shrinking = (c.shrinking + 1).min(15);
        } else if grow_num < u128::from(alpha) * rtt_den
            // Trying the ceiling: no further until a success clears it.
            && (c.ceiling == 0 || limit < c.ceiling)
        {
            // Grow if the round was limit-bound: a success admitted with the
            // whole limit in flight. If none was yet, the growth waits for
            // the first that is (`pending`): requests admitted together on
            // the release that raised the limit are granted counts up to
            // it, and the first of them to answer, which closes the round,
            // is often not the one granted the limit. A client that never
            // fills its limit (app-limited) never grows it.
            if r.max_in_flight >= limit.min(IN_FLIGHT_MAX) {
                if f.rounds < WARM_SAMPLES {
                    // No speeding up on a baseline not yet trusted.
                    next.growing = 0;
                }
                next = self.grow(next);
            } else {
                next.pending = true;
            }
        } else if grow_num >= u128::from(alpha) * rtt_den {
            // A queue between α and β: the limit holds, and growth starts
            // slowly again.
            next.growing = 0;
            next.pending = false;
        }
        if next.limit >= limit {
            next.shrinking = 0;
        }
        // The queue keeps growing however far the limit comes down: the
        // service may have become slower for good, and only a probe tells
        // that from a queue.
        if next.shrinking >= SHRINKING_PROBE {
            next.probing = true;
            next.shrinking = 0;
            next.held = 0;
            next.probe_stat = 0;
        }
        next
    }
    /// The control word grown by one step: 1, or after `STEADY_ROUNDS`
    /// growing rounds in a row 2, 4, 8, … (at most half the limit); up to
    /// just below a ceiling at once, then held there `2 << hold_exp`
    /// rounds before the ceiling is tried.
    fn grow(&self, c: Control) -> Control {
        let mut next = c;
        next.pending = false;
        let limit = c.limit;
        let step = if c.growing < STEADY_ROUNDS {
            1
        } else {
            (1u32 << ((c.growing - STEADY_ROUNDS) / 2 + 1)).min((limit / 2).max(1))
        };
        next.growing = (c.growing + 1).min(31);
        let wanted = limit.saturating_add(step).min(self.max);
        if c.ceiling != 0 && wanted >= c.ceiling {
            if limit + 1 < c.ceiling {
                // Up to just below the ceiling, at once.
                next.limit = c.ceiling - 1;
                next.held = 0;
            } else {
                // At the ceiling's edge: wait, then try it.
                next.held = c.held + 1;
                if next.held >= 2 << c.hold_exp {
                    next.limit = limit.saturating_add(1).min(self.max);
                    next.held = 0;
                }
            }
        } else {
            next.limit = wanted;
        }
        next
    }
}

/// The queue a round measured, as `(shrink, grow, den)`: the queue is
/// `shrink / den` against the shrinking threshold and `grow / den` against
/// the growing one — `used · (rtt − baseline − tolerance) / rtt`, the
/// requests waiting, by Little's law, beyond what the round trip's own
/// noise explains. The tolerance is the deviation to shrink, half of it to
/// grow: noise must not push the limit down, nor let it climb into a queue.
/// Compared in integers: used < 2^16, rtt < 2^36.
fn queue_terms(used: u32, rtt: u64, f: Filters) -> (u128, u128, u128) {
    // While the filters warm up, the stored baseline is an upper
    // estimate that only a warm smoothed round trip may bring down (a
    // few noisy round trips must not leave it low for good); the
    // decisions meanwhile use the lower of it and the smoothed round trip
    // so far, so that a limit growing into a queue before the filters
    // are warm sees it.
    let baseline = if f.rounds < WARM_SAMPLES && f.srtt != 0 {
        f.baseline.min(f.srtt)
    } else {
        f.baseline
    };
    let queue_num = |tolerance: u64| {
        u128::from(used) * u128::from(rtt.saturating_sub(baseline).saturating_sub(tolerance))
    };
    // The deviation measures noise, but also a change of level that the
    // smoothed round trip has not caught up with yet (a queue that just
    // formed): past an eighth of the smoothed round trip it is not
    // noise to tolerate.
    let tolerance = f.dev.min(f.srtt / 8);
    let (shrink_num, grow_num) = (queue_num(tolerance), queue_num(tolerance / 2));
    (shrink_num, grow_num, u128::from(rtt))
}

impl RoundTrip {
    /// A drop: back off (once per round), and open a new round if it did.
    fn on_drop(&self, sample: Sample, now_ns: u64) -> Option<u32> {
        let started_ns = now_ns.saturating_sub(sample.rtt_ns);
        let mut backed_off = false;
        let changed = self.apply_control(now_ns, |c| {
            let next = self.back_off(
                c,
                (started_ns / 1_000) & US_MASK,
                (now_ns / 1_000) & US_MASK,
                sample.in_flight,
            );
            // The decision the loop stores is the last one made.
            backed_off = next.is_some();
            next
        });
        if backed_off {
            // The back-off opens a new round: what was admitted
            // before it measures the congestion it answered.
            let now_us = (now_ns / 1_000) & US_MASK;
            let _ = self.round.update(|w| {
                if Round::unpack(w).opened_us < now_us {
                    Ok(Round::opened(now_us).pack())
                } else {
                    Err(())
                }
            });
        }
        changed
    }

    /// A success: into the open round, or closing it — then the round's
    /// decision on the limit.
    fn on_success(&self, sample: Sample, now_ns: u64) -> Option<u32> {
        let Some(round) = self.add_to_round(sample, now_ns) else {
            return self.grow_if_waiting(sample, now_ns);
        };
        let probing = Control::unpack(self.control.load()).probing;
        let filters = self.feed_filters(round, probing, sample.rtt_ns);
        let rtt = sample.rtt_ns.max(1);
        let mut probed = None;
        let changed = self.apply_control(now_ns, |c| {
            let next = self.close(c, round, filters, rtt, sample.in_flight);
            // The decision the loop stores is the last one made.
            probed = (c.probing && !next.probing).then_some(next.probe_stat);
            (next != c).then_some(next)
        });
        if let Some(stat) = probed {
            self.baseline_after_probe(filters, stat);
        }
        changed
    }

    /// Adds a success to the open round, or closes it if the sample started
    /// after it opened: one compare-and-swap, so the sample is in exactly
    /// one round and the round closes once. The closed round, if this
    /// sample closed one.
    fn add_to_round(&self, sample: Sample, now_ns: u64) -> Option<Round> {
        let started_us = (now_ns.saturating_sub(sample.rtt_ns) / 1_000) & US_MASK;
        let now_us = (now_ns / 1_000) & US_MASK;
        // A round trip counts at most twice the smoothed one: a rare
        // straggler (a GC pause, a cold cache) would otherwise read
        // as a queue of the whole round.
        let srtt = Filters::unpack(self.filters.load()).srtt;
        let counted = if srtt == 0 {
            sample.rtt_ns
        } else {
            sample.rtt_ns.min(srtt.saturating_mul(2))
        };
        let mut closed = None;
        let _ = self.round.update(|w| {
            let round = Round::unpack(w).with(counted, sample.in_flight);
            if started_us >= round.opened_us {
                closed = Some(round);
                Ok::<_, ()>(Round::opened(now_us.max(round.opened_us)).pack())
            } else {
                closed = None;
                Ok(round.pack())
            }
        });
        closed
    }

    /// A success that filled the limit after the round that allowed growth
    /// closed without one: the growth it was waiting for.
    fn grow_if_waiting(&self, sample: Sample, now_ns: u64) -> Option<u32> {
        let waiting = |c: Control| c.pending && !c.probing && sample.in_flight >= c.limit;
        if !waiting(Control::unpack(self.control.load())) {
            return None;
        }
        self.apply_control(now_ns, |c| waiting(c).then(|| self.grow(c)))
    }

    /// [`apply`] on the control word: `step` decides on it unpacked.
    fn apply_control(
        &self,
        now_ns: u64,
        mut step: impl FnMut(Control) -> Option<Control>,
    ) -> Option<u32> {
        apply(
            &self.control,
            &self.history,
            now_ns,
            |w| self.limit_of(Control::unpack(w)),
            |w| step(Control::unpack(w)).map(Control::pack),
        )
    }

    /// The filters after a closed round. A probe's round trips are not the
    /// operating point's: they go to the control word's probe, not to the
    /// filters; the probe's very first one, before there is a baseline,
    /// becomes it for the rest of the probe.
    fn feed_filters(&self, round: Round, probing: bool, rtt_ns: u64) -> Filters {
        if probing {
            let first = rtt_ns.clamp(1, RTT_MAX);
            self.filters
                .update(|w| {
                    let f = Filters::unpack(w);
                    if f.baseline == 0 {
                        Ok(Filters {
                            baseline: first,
                            ..f
                        }
                        .pack())
                    } else {
                        Err(f)
                    }
                })
                .map_or_else(|f| f, Filters::unpack)
        } else {
            let mean = round.mean().max(1);
            self.filters
                .update(|w| Ok::<_, ()>(Filters::unpack(w).after(mean, round.count).pack()))
                .map_or_else(|()| Filters::default(), Filters::unpack)
        }
    }

    /// The probe is over: the longest of the first probe's round trips is
    /// the first baseline; the shortest of a later one raises a lower
    /// baseline (never above the smoothed round trip, which a queue only
    /// lengthens).
    fn baseline_after_probe(&self, filters: Filters, stat: u32) {
        let measured = (u128::from(filters.baseline) * u128::from(stat) / 64) as u64;
        let _ = self.filters.update(|w| {
            let f = Filters::unpack(w);
            let baseline = if f.srtt == 0 {
                measured
            } else if measured.min(f.srtt) > f.baseline {
                measured.min(f.srtt)
            } else {
                return Err(());
            };
            Ok(Filters {
                baseline: baseline.clamp(1, RTT_MAX),
                ..f
            }
            .pack())
        });
    }
}

impl LimitAlgorithm for RoundTrip {
    fn on_sample(&self, sample: Sample, now_ns: u64) -> Option<u32> {
        match sample.outcome {
            Outcome::Ignored => None,
            Outcome::Dropped => self.on_drop(sample, now_ns),
            Outcome::Success => self.on_success(sample, now_ns),
        }
    }

    fn limit(&self) -> u32 {
        self.limit_of(Control::unpack(self.control.load()))
    }

    fn history(&self) -> Option<&LimitHistory> {
        Some(&self.history)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    /// Feeds `samples` of `(rtt, in_flight, outcome, now)`; returns the last
    /// limit.
    fn feed(rt: &RoundTrip, samples: &[(u64, u32, Outcome, u64)]) -> u32 {
        for &(rtt_ns, in_flight, outcome, now) in samples {
            rt.on_sample(
                Sample {
                    rtt_ns,
                    in_flight,
                    outcome,
                },
                now,
            );
        }
        rt.limit()
    }

    /// Closes one round per call: a request admitted just after the last
    /// close, answering `rtt` later with `in_flight`.
    struct Rounds<'a> {
        rt: &'a RoundTrip,
        now: u64,
    }

    impl Rounds<'_> {
        fn close(&mut self, rtt: u64, in_flight: u32) -> Option<u32> {
            self.now += rtt + 1_000;
            self.rt.on_sample(Sample::success(rtt, in_flight), self.now)
        }

        /// As `close`, with the limit filled.
        fn close_full(&mut self, rtt: u64) -> Option<u32> {
            let limit = self.rt.limit();
            self.close(rtt, limit)
        }
    }

    /// Each word's fields survive a pack and an unpack at every value their
    /// widths hold, the widest included: any 128 bits unpack to fields in
    /// range, and packing them gives back exactly the bits the fields use
    /// (no two fields overlap).
    #[test]
    fn the_words_pack_and_unpack() {
        fn check<W: Copy + PartialEq + std::fmt::Debug>(
            word: u128,
            pack: fn(W) -> u128,
            unpack: fn(u128) -> W,
        ) {
            let fields = unpack(word);
            assert_eq!(unpack(pack(fields)), fields);
            assert_eq!(pack(fields), word & pack(unpack(u128::MAX)), "{word:#x}");
        }
        let mut x = 0x9e37_79b9_7f4a_7c15_u128;
        let random = (0..10_000).map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        });
        for word in [0, u128::MAX].into_iter().chain(random) {
            check(word, Round::pack, Round::unpack);
            check(word, Filters::pack, Filters::unpack);
            check(word, Control::pack, Control::unpack);
        }
    }

    #[test]
    fn a_drop_backs_off_once_per_round_trip() {
        let rt = RoundTrip::builder()
            .initial_limit(10)
            .min_limit(10)
            .max_limit(100)
            .build()
            .unwrap();
        let mut rounds = Rounds { rt: &rt, now: 0 };
        for _ in 0..5 {
            rounds.close_full(100 * MS);
        }
        assert_eq!(rt.limit(), 15);
        // Admitted at 100 ms and 150 ms after the last close, dropped 200 ms
        // and 210 ms after it: the first backs off, the second was admitted
        // before that.
        let t = rounds.now;
        assert_eq!(
            rt.on_sample(Sample::dropped(100 * MS, 15), t + 200 * MS),
            Some(10)
        );
        assert_eq!(
            rt.on_sample(Sample::dropped(60 * MS, 15), t + 210 * MS),
            None
        );
        // Floor(15 · 0.7) = 10 is the minimum; one admitted after the
        // back-off backs off again, and stays there.
        assert_eq!(
            rt.on_sample(Sample::dropped(5 * MS, 10), t + 215 * MS),
            None
        );
        assert_eq!(rt.ceiling(), Some(10));
        // Ignored outcomes change nothing.
        assert_eq!(rt.on_sample(Sample::ignored(1, 1), t + 300 * MS), None);
        assert_eq!(rt.estimate(), 10);
    }

    #[test]
    fn a_round_closes_once_and_growth_needs_the_limit_filled() {
        let rt = RoundTrip::default();
        // The first round: closed by its first answer.
        assert_eq!(
            rt.on_sample(Sample::success(100 * MS, 1), 100 * MS),
            Some(2)
        );
        // Admitted before that close (at 50 ms): joins the open round.
        assert_eq!(rt.on_sample(Sample::success(60 * MS, 1), 110 * MS), None);
        // Admitted after it with 1 in flight of 2: closes the round, which
        // allowed growth but did not fill the limit.
        assert_eq!(rt.on_sample(Sample::success(100 * MS, 1), 220 * MS), None);
        assert_eq!(rt.limit(), 2);
        // The first success that filled it grows it.
        assert_eq!(
            rt.on_sample(Sample::success(100 * MS, 2), 221 * MS),
            Some(3)
        );
        // An app-limited client (never more than 2 in flight) stays at 3.
        let mut now = 221 * MS;
        for _ in 0..50 {
            now += 101 * MS;
            rt.on_sample(Sample::success(100 * MS, 2), now);
        }
        assert_eq!(rt.limit(), 3);
    }

    #[test]
    fn growth_speeds_up_after_eight_rounds_and_a_queue_brings_it_down() {
        let rt = RoundTrip::default();
        let mut rounds = Rounds { rt: &rt, now: 0 };
        let mut limits = Vec::new();
        for _ in 0..28 {
            rounds.close_full(100 * MS);
            limits.push(rt.limit());
        }
        // +1 a round while the filters warm up (16 steady successes here),
        // then, 8 growing rounds later, 2, 2, 4, 4, 8, 8, … a round.
        let expected: Vec<u32> = (2..=23).chain([25, 27, 31, 35, 43, 51]).collect();
        assert_eq!(limits, expected);
        // The first baseline, half again the first round trip, came down to
        // the service's once the filters were warm.
        assert_eq!(rt.baseline_ns(), 100 * MS);
        // 51 in flight at 150 ms over a 100 ms service is 17 waiting, above
        // β = 4: the limit comes down.
        let before = rt.limit();
        rounds.close(150 * MS, before);
        assert!(rt.limit() < before, "{} after {before}", rt.limit());
    }

    #[test]
    fn the_ceiling_is_held_ever_longer() {
        let rt = RoundTrip::builder()
            .initial_limit(4)
            .min_limit(1)
            .build()
            .unwrap();
        let mut rounds = Rounds { rt: &rt, now: 0 };
        // The initial probe: four round trips at the minimum.
        assert!(rt.probing());
        for _ in 0..4 {
            rounds.close(100 * MS, 1);
        }
        assert!(!rt.probing());
        assert_eq!(rt.baseline_ns(), 100 * MS);
        assert_eq!(rt.limit(), 4);
        rounds.close(100 * MS, 4);
        assert_eq!(rt.limit(), 5);
        // 5 in flight is refused: back off, and 5 is the ceiling.
        rounds.now += 1_000;
        rt.on_sample(Sample::dropped(MS, 5), rounds.now);
        assert_eq!((rt.limit(), rt.ceiling()), (3, Some(5)));
        // Up to just below it at once, then held there 2 rounds, then 4,
        // then 8 before each try.
        rounds.close(100 * MS, 3);
        assert_eq!(rt.limit(), 4);
        for hold in [2, 4, 8] {
            let mut closes = 0;
            while rt.limit() == 4 {
                rounds.close(100 * MS, 4);
                closes += 1;
            }
            assert_eq!((closes, rt.limit()), (hold, 5));
            // The try fails: back to just below the ceiling.
            rounds.now += 1_000;
            rt.on_sample(Sample::dropped(MS, 5), rounds.now);
            assert_eq!(rt.limit(), 4);
        }
        // A round at the ceiling with a success at it clears the ceiling.
        for _ in 0..16 {
            rounds.close(100 * MS, 4);
        }
        assert_eq!(rt.limit(), 5);
        rounds.close(100 * MS, 5);
        assert_eq!(rt.ceiling(), None);
    }

    #[test]
    fn a_slower_service_is_believed_after_a_probe() {
        let rt = RoundTrip::builder()
            .initial_limit(10)
            .min_limit(1)
            .build()
            .unwrap();
        let mut rounds = Rounds { rt: &rt, now: 0 };
        for _ in 0..4 {
            rounds.close(100 * MS, 1);
        }
        assert_eq!(rt.baseline_ns(), 100 * MS);
        for _ in 0..40 {
            rounds.close_full(100 * MS);
        }
        // The service now takes 300 ms unloaded, and 300 ms × (1 + n/10)
        // loaded: the limit shrinks round after round, then probes.
        let mut probed = false;
        for _ in 0..200 {
            let n = rt.limit();
            probed |= rt.probing();
            rounds.close(300 * MS + 30 * MS * u64::from(n), n);
        }
        assert!(probed, "never probed");
        assert!(
            rt.baseline_ns() >= 300 * MS,
            "baseline {} after the service slowed",
            rt.baseline_ns()
        );
        assert!(
            rt.limit() >= 5,
            "limit {} on the slower service",
            rt.limit()
        );
    }

    #[test]
    fn any_input_keeps_the_limit_in_bounds() {
        let rt = RoundTrip::builder()
            .initial_limit(3)
            .min_limit(2)
            .max_limit(40)
            .build()
            .unwrap();
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut now = 0u64;
        for _ in 0..20_000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            now = now.saturating_add(seed % (50 * MS));
            let rtt = match seed % 5 {
                0 => 0,
                1 => u64::MAX,
                _ => seed % (400 * MS),
            };
            let in_flight = match (seed >> 8) % 4 {
                0 => 0,
                1 => u32::MAX,
                _ => (seed >> 16) as u32 % 60,
            };
            let outcome = match (seed >> 24) % 9 {
                0 => Outcome::Dropped,
                1 => Outcome::Ignored,
                _ => Outcome::Success,
            };
            // A clock that steps back sometimes.
            let at = if seed % 31 == 0 { now / 2 } else { now };
            feed(&rt, &[(rtt, in_flight, outcome, at)]);
            assert!((2..=40).contains(&rt.limit()), "limit {}", rt.limit());
            assert!((2..=40).contains(&rt.estimate()));
        }
    }

    #[test]
    fn bad_configurations_are_refused() {
        assert!(matches!(
            RoundTrip::builder().min_limit(0).build(),
            Err(ConfigError::InvalidLimits { .. })
        ));
        assert!(matches!(
            RoundTrip::builder().initial_limit(5).max_limit(4).build(),
            Err(ConfigError::InvalidLimits { .. })
        ));
        assert_eq!(
            RoundTrip::builder().backoff_ratio(0.3).build().unwrap_err(),
            ConfigError::InvalidParameter {
                name: "backoff ratio",
                range: "[0.5, 1)"
            }
        );
        assert!(RoundTrip::builder().alpha(0).build().is_err());
        assert!(RoundTrip::builder().alpha(5).beta(4).build().is_err());
        assert!(RoundTrip::builder().beta(u32::MAX).build().is_err());
        assert!(
            RoundTrip::builder()
                .backoff_ratio(f64::NAN)
                .build()
                .is_err()
        );
    }
}
