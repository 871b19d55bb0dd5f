//! The gradient of a long-term round trip over the current one: Netflix
//! concurrency-limits' `Gradient2Limit`, on one 128-bit atomic word.
//!
//! | word | bits | meaning |
//! |---|---|---|
//! | state, bits 0..40 | 40 | the estimated limit, Q24.16 (1/65 536 of a permit) |
//! | state, bits 40..44 | 4 | samples averaged so far in the long round trip's warm-up (0..=10) |
//! | state, bits 44..128 | 84 | the long-term round trip, Q.16 ns (1/65 536 of a ns) |

use super::{
    LimitAlgorithm, LimitHistory, Outcome, PPM, Sample, app_limited, apply, backoff_ppm,
    check_limits, clamp_estimate, div_round, estimate_of, floor_limit, ppm, smooth, smoothing_ppm,
};
use crate::cell::{AtomicCell, StateCell};
use crate::error::ConfigError;

/// `ExpAvgMeasurement`'s warm-up in `Gradient2Limit`: the first 10 samples
/// are averaged plainly.
const WARMUP: u32 = 10;
const LONG_MAX: u128 = (1 << 84) - 1;

/// The gradient of a long-term average round trip over the current one
/// (Netflix concurrency-limits' `Gradient2Limit`).
///
/// Each sample's round trip is the short-term round trip; the long-term one
/// is its exponential moving average over `long_window` samples (`factor
/// 2 / (long_window + 1)`, after a plain average of the first 10). Then:
///
/// - if the long round trip is more than twice the short one (latency fell
///   back after a long overload), the long one is cut to 95 %;
/// - admitted with fewer than half the limit in flight: no change (the
///   service was not pressed);
/// - otherwise `gradient = clamp(tolerance · long / short, 0.5, 1)`,
///   `new = limit · gradient + queue_size`, `limit ← (1 − smoothing) · limit
///   + smoothing · new`, held in `min..=max`.
///
/// While the current round trip stays within `tolerance` times the long
/// one, the gradient is 1 and the limit grows by `smoothing · queue_size`
/// per sample; beyond it, the limit shrinks.
///
/// **Drops are ignored by default.** `Gradient2Limit` judges by latency
/// alone (its `didDrop` is ignored), and with its defaults so does this
/// one: on a service that times out or refuses without slowing down first,
/// it holds its limit while every attempt fails. Give it
/// [`Gradient2Builder::drop_backoff`] (a multiplicative decrease on drops,
/// as `GradientLimit`, its predecessor, had with `backoffRatio` 0.9), or use
/// [`RoundTrip`](crate::RoundTrip), which backs off on drops once per round
/// trip.
///
/// Defaults, `Gradient2Limit.Builder`'s: initial limit 20, **min 20**, max 200
/// (`maxConcurrency`), smoothing 0.2, queue size 4 (a constant since
/// concurrency-limits 0.3; the older `GradientLimit` used
/// `max(4, sqrt(limit))`), long window 600 samples, RTT tolerance 1.5. Netflix
/// runs it behind a `WindowedLimit` (one averaged sample a second): see
/// [`Windowed`](crate::Windowed).
///
/// State: one 128-bit word; a sample whose compare-and-swap loses a race is
/// decided again on the winner's state (folded in, never dropped).
///
/// ```
/// use tollgate::{Gradient2, LimitAlgorithm, Sample};
///
/// let gradient = Gradient2::builder().smoothing(0.25).build()?;
/// // Steady 10 ms round trips with the limit pressed: it grows by
/// // smoothing · queue size = 0.25 · 4 a sample...
/// for i in 0..10 {
///     gradient.on_sample(Sample::success(10_000_000, 20), i);
/// }
/// assert_eq!(gradient.limit(), 30);
/// // ...until the round trip exceeds 1.5 × the long-term one: 40 ms gives
/// // the floor gradient 0.5, so 0.75 · 30 + 0.25 · (0.5 · 30 + 4).
/// gradient.on_sample(Sample::success(40_000_000, 30), 10);
/// assert_eq!(gradient.limit(), 27);
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
#[derive(Debug)]
pub struct Gradient2 {
    state: AtomicCell<u128>,
    min: u32,
    max: u32,
    smoothing_ppm: u64,
    tolerance_ppm: u64,
    queue_size: u32,
    long_window: u32,
    drop_backoff_ppm: Option<u64>,
    history: LimitHistory,
}

/// Configures a [`Gradient2`]; every setting starts at `Gradient2Limit`'s
/// default.
#[derive(Debug, Clone)]
pub struct Gradient2Builder {
    initial: u32,
    min: u32,
    max: u32,
    smoothing: f64,
    tolerance: f64,
    queue_size: u32,
    long_window: u32,
    drop_backoff: Option<f64>,
}

impl Default for Gradient2Builder {
    fn default() -> Self {
        Gradient2Builder {
            initial: 20,
            min: 20,
            max: 200,
            smoothing: 0.2,
            tolerance: 1.5,
            queue_size: 4,
            long_window: 600,
            drop_backoff: None,
        }
    }
}

impl Gradient2Builder {
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

        /// The highest the limit goes (`maxConcurrency`, default 200).
        max_limit(limit: u32) -> max;

        /// How far each change goes, in `(0, 1]` (default 0.2).
        smoothing(smoothing: f64) -> smoothing;

        /// How much slower than the long-term round trip the current one may be
        /// before the limit shrinks (`rttTolerance`, in `[1, 1000]`, default 1.5).
        rtt_tolerance(tolerance: f64) -> tolerance;

        /// The queue allowed on top of `limit · gradient` (default 4; at most
        /// [`MAX_ADAPTIVE_LIMIT`](crate::MAX_ADAPTIVE_LIMIT)).
        queue_size(queue_size: u32) -> queue_size;

        /// Samples in the long-term round trip's average (default 600; in
        /// `1..=1_000_000`).
        long_window(samples: u32) -> long_window;

        /// Multiply the limit by `ratio` (in `[0.5, 1)`) on a drop, instead of
        /// ignoring drops as `Gradient2Limit` does (default: ignored).
        drop_backoff(ratio: f64) -> drop_backoff = Some(ratio);
    }

    /// The algorithm, or why the configuration cannot be honoured:
    /// [`ConfigError::InvalidLimits`] unless `1 <= min <= initial <= max <=`
    /// [`MAX_ADAPTIVE_LIMIT`](crate::MAX_ADAPTIVE_LIMIT),
    /// [`ConfigError::InvalidParameter`] for a parameter out of its range.
    ///
    /// ```
    /// use tollgate::{ConfigError, Gradient2};
    ///
    /// assert_eq!(
    ///     Gradient2::builder().rtt_tolerance(0.9).build().unwrap_err(),
    ///     ConfigError::InvalidParameter { name: "RTT tolerance", range: "[1, 1000]" }
    /// );
    /// ```
    pub fn build(self) -> Result<Gradient2, ConfigError> {
        check_limits(self.min, self.initial, self.max)?;
        let smoothing_ppm = smoothing_ppm(self.smoothing)?;
        let tolerance_ppm = ppm(
            self.tolerance,
            1.0,
            1000.0,
            false,
            "RTT tolerance",
            "[1, 1000]",
        )?;
        if self.queue_size > super::MAX_ADAPTIVE_LIMIT {
            return Err(ConfigError::InvalidParameter {
                name: "queue size",
                range: "0..=1048576",
            });
        }
        if !(1..=1_000_000).contains(&self.long_window) {
            return Err(ConfigError::InvalidParameter {
                name: "long window",
                range: "1..=1000000",
            });
        }
        let drop_backoff_ppm = self
            .drop_backoff
            .map(|r| backoff_ppm(r, "drop backoff"))
            .transpose()?;
        let initial = G2State {
            estimate: estimate_of(self.initial),
            warmup: 0,
            long: 0,
        };
        Ok(Gradient2 {
            state: AtomicCell::new(initial.pack()),
            min: self.min,
            max: self.max,
            smoothing_ppm,
            tolerance_ppm,
            queue_size: self.queue_size,
            long_window: self.long_window,
            drop_backoff_ppm,
            history: LimitHistory::new(),
        })
    }
}

/// The unpacked word (see the module's table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct G2State {
    estimate: u64,
    warmup: u32,
    long: u128,
}

impl G2State {
    fn pack(self) -> u128 {
        u128::from(self.estimate) | u128::from(self.warmup) << 40 | self.long << 44
    }

    fn unpack(word: u128) -> Self {
        G2State {
            estimate: (word as u64) & ((1 << 40) - 1),
            warmup: ((word >> 40) as u32) & 0xf,
            long: word >> 44,
        }
    }

    fn limit(self) -> u32 {
        floor_limit(self.estimate)
    }
}

impl Gradient2 {
    /// A builder starting from `Gradient2Limit`'s defaults.
    pub fn builder() -> Gradient2Builder {
        Gradient2Builder::default()
    }

    /// The lowest and highest limit.
    pub fn bounds(&self) -> (u32, u32) {
        (self.min, self.max)
    }

    /// The long-term round trip, in ns (0 before the first sample).
    pub fn long_rtt_ns(&self) -> u64 {
        (G2State::unpack(self.state.load()).long >> 16) as u64
    }

    /// The state after `sample`: the pure decision (`Gradient2Limit._update`).
    fn decide(&self, s: G2State, sample: &Sample) -> Option<G2State> {
        // A drop measures nothing: its round trip is the time the service
        // took to refuse, not a latency, so it never enters the long round
        // trip (Java lets it, and fast refusals drag the long round trip down
        // until the limit cannot grow back). It backs off if asked to.
        if sample.outcome == Outcome::Dropped {
            let ratio = self.drop_backoff_ppm?;
            let cut = u128::from(s.estimate) * u128::from(ratio) / u128::from(PPM);
            return Some(G2State {
                estimate: clamp_estimate(cut as u64, self.min, self.max),
                ..s
            });
        }
        let short = sample.rtt_ns.max(1);
        let short_q = u128::from(short) << 16;
        let mut next = s;
        // ExpAvgMeasurement.add: a plain mean over the warm-up, then
        // value · (1 − f) + sample · f with f = 2 / (n + 1), i.e.
        // (value · (n − 1) + 2 · sample) / (n + 1); rounded to nearest.
        if s.warmup < WARMUP {
            let count = u128::from(s.warmup);
            next.warmup = s.warmup + 1;
            next.long = div_round(s.long * count + short_q, count + 1);
        } else {
            let n = u128::from(self.long_window);
            next.long = div_round(s.long * (n - 1) + 2 * short_q, n + 1);
        }
        next.long = next.long.min(LONG_MAX);
        // longRtt / shortRtt > 2: the long one falls to 95 % at once.
        if next.long > 2 * short_q {
            next.long = next.long * 95 / 100;
        }
        // Don't grow the limit if we are app-limited.
        if app_limited(sample.in_flight, s.estimate) {
            return Some(next);
        }
        // gradient = clamp(tolerance · long / short, 0.5, 1), Q.16: long is
        // Q.16 ns and tolerance millionths, so the quotient by short · 10^6
        // is Q.16 already. long < 2^84, tolerance <= 10^9 < 2^30.
        let gradient = (next.long * u128::from(self.tolerance_ppm)
            / (u128::from(short) * u128::from(PPM)))
        .clamp(1 << 15, 1 << 16);
        // Rounded to nearest, as the smoothing is (see `smooth`).
        let target = div_round(u128::from(s.estimate) * gradient, 1 << 16)
            + u128::from(estimate_of(self.queue_size));
        let smoothed = smooth(s.estimate, target, self.smoothing_ppm);
        next.estimate = clamp_estimate(
            smoothed.min(u128::from(u64::MAX)) as u64,
            self.min,
            self.max,
        );
        Some(next)
    }
}

packed_algorithm!(Gradient2, G2State);

#[cfg(all(test, not(loom)))]
mod tests {
    use super::super::ONE;
    use super::*;

    /// `Gradient2Limit._update` with `ExpAvgMeasurement`, in floating
    /// point, as Netflix writes them.
    struct Reference {
        estimated: f64,
        long: f64,
        count: u32,
        window: u32,
        smoothing: f64,
        tolerance: f64,
        min: f64,
        max: f64,
    }

    impl Reference {
        fn update(&mut self, rtt: u64, inflight: u32) {
            let short = rtt as f64;
            if self.count < 10 {
                // sum / count, as a running mean (the reference is re-seeded
                // with this crate's mean every step).
                self.long = (self.long * f64::from(self.count) + short) / f64::from(self.count + 1);
                self.count += 1;
            } else {
                let f = 2.0 / (f64::from(self.window) + 1.0);
                self.long = self.long * (1.0 - f) + short * f;
            }
            if self.long / short > 2.0 {
                self.long *= 0.95;
            }
            if f64::from(inflight) < self.estimated / 2.0 {
                return;
            }
            let gradient = (self.tolerance * self.long / short).clamp(0.5, 1.0);
            let new = self.estimated * gradient + 4.0;
            let new = self.estimated * (1.0 - self.smoothing) + new * self.smoothing;
            self.estimated = new.clamp(self.min, self.max);
        }
    }

    #[test]
    fn matches_the_floating_point_reference() {
        for (smoothing, tolerance, window) in [(0.2, 1.5, 600), (0.5, 1.0, 20), (1.0, 2.0, 100)] {
            let g = Gradient2::builder()
                .min_limit(5)
                .initial_limit(20)
                .max_limit(400)
                .smoothing(smoothing)
                .rtt_tolerance(tolerance)
                .long_window(window)
                .build()
                .unwrap();
            let mut r = Reference {
                estimated: 20.0,
                long: 0.0,
                count: 0,
                window,
                smoothing,
                tolerance,
                min: 5.0,
                max: 400.0,
            };
            let mut seed = 0x853c_49e6_748f_ea9bu64;
            for i in 0..3_000u64 {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let limit = g.limit();
                let in_flight = (limit / 3 + (seed % u64::from(limit + 1)) as u32).max(1);
                // Phases of fast and slow round trips, so every branch runs.
                let base = if (i / 500) % 2 == 0 {
                    10_000_000
                } else {
                    45_000_000
                };
                let rtt = base + (seed >> 16) % 20_000_000;
                // Each step starts the reference from this crate's state, so
                // the comparison is of one step's arithmetic, not of rounding
                // accumulated over thousands (which can tip a later `in_flight
                // < limit / 2` either way).
                let before = G2State::unpack(g.state.load());
                r.estimated = before.estimate as f64 / ONE as f64;
                r.long = before.long as f64 / 65_536.0;
                r.update(rtt, in_flight);
                g.on_sample(Sample::success(rtt, in_flight), i);
                let s = G2State::unpack(g.state.load());
                let estimate = s.estimate as f64 / ONE as f64;
                let long = s.long as f64 / 65_536.0;
                assert!(
                    // The gradient is truncated to 2^-16: its product with
                    // the estimate is good to the estimate · 2^-16, and one
                    // more for the rounding of long and target.
                    (estimate - r.estimated).abs() < 1e-4 + r.estimated / 32_768.0,
                    "sample {i}: estimate {estimate} vs {}",
                    r.estimated
                );
                assert!(
                    (long - r.long).abs() < 1e-4,
                    "sample {i}: long {long} vs {}",
                    r.long
                );
            }
        }
    }

    #[test]
    fn drops_are_ignored_unless_asked() {
        let plain = Gradient2::builder().initial_limit(100).build().unwrap();
        plain.on_sample(Sample::dropped(10_000_000, 100), 0);
        assert!(plain.limit() >= 100);
        let backing = Gradient2::builder()
            .initial_limit(100)
            .drop_backoff(0.9)
            .build()
            .unwrap();
        assert_eq!(
            backing.on_sample(Sample::dropped(10_000_000, 100), 0),
            Some(90)
        );
    }

    #[test]
    fn packs_and_unpacks() {
        let s = G2State {
            estimate: (1 << 40) - 1,
            warmup: 10,
            long: LONG_MAX,
        };
        assert_eq!(G2State::unpack(s.pack()), s);
    }
}
