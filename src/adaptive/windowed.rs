//! One aggregated sample per time window: Netflix concurrency-limits'
//! `WindowedLimit` (with its `AverageSampleWindow`), lock-free.
//!
//! | word | bits | meaning |
//! |---|---|---|
//! | window, bits 0..20 | 20 | successes in the open window (saturating at 2^20 − 1: later ones count only towards the next two fields) |
//! | window, bits 20..41 | 21 | the most requests in flight any of them saw (saturating) |
//! | window, bits 41..42 | 1 | whether any was dropped |
//! | window, bits 42..128 | 86 | the sum of the successes' round trips, ns |
//! | close, 64 bits | 64 | when the open window closes, ns on the limiter's clock |
//!
//! A sample is added to the window word first. The sample that finds the
//! close time passed claims the close by moving the close word on (one
//! compare-and-swap: one claimant per close time), then swaps the window
//! word for an empty one and hands the aggregate to the inner algorithm.
//! Adding and swapping are read-modify-writes of one word, so every sample
//! lands in exactly one window: the one that closes, or the next.

use std::time::Duration;

use super::{LimitAlgorithm, LimitHistory, Outcome, Sample};
use crate::cell::{AtomicCell, StateCell};
use crate::error::ConfigError;

const COUNT_MAX: u128 = (1 << 20) - 1;
const IN_FLIGHT_MAX: u128 = (1 << 21) - 1;
const DROP_BIT: u128 = 1 << 41;
const SUM_SHIFT: u32 = 42;

/// Feeds an algorithm one aggregated sample per time window (Netflix
/// concurrency-limits' `WindowedLimit`).
///
/// Successes with a round trip under `min_rtt` are passed over (too fast to
/// say anything of the service: a cache hit, a local rejection). The others
/// are aggregated: the successes' mean round trip, the most requests in
/// flight, and whether any was dropped. A drop's round trip is not averaged
/// in: it is the time the service took to refuse, not a latency (Netflix's
/// `AverageSampleWindow` averages it, and a link that refuses fast then
/// looks faster the more it refuses). The first sample completing after the
/// window's end closes it; if it held at least `min_samples` successes or a
/// drop, the inner algorithm gets one sample — the mean round trip, the peak
/// in flight, [`Outcome::Dropped`] if any was — and the next window ends
/// `window` after the closing sample.
///
/// Defaults, `WindowedLimit.Builder`'s: window 1 s (its `minWindowTime` and
/// `maxWindowTime`, both 1 s; Netflix takes twice the window's least round
/// trip clamped between the two, which with equal bounds is the bound, so
/// here the window is one length), `min_samples` 10 (`windowSize`),
/// `min_rtt` 100 µs (`minRttThreshold`).
///
/// **A small limit can freeze.** A window closed with fewer than
/// `min_samples` successes and no drop is discarded, and at a limit `L` on a
/// service of round trip `r` a window of length `w` holds about `L · w / r`
/// successes: below `min_samples · r / w` in flight (10 for 1 s windows on a
/// 1 s service; 2 on a 200 ms one) no window counts, and a limit that got
/// there never grows again; a window with a drop always counts, so it can
/// still shrink. [`RoundTrip`](crate::RoundTrip) decides once per round
/// trip, whatever a round holds, and is the one to start with.
///
/// Lock-free: the window's aggregate is one 128-bit word and its close time
/// another. A sample racing a close is folded into the closing window or into
/// the next one, never lost; only one sample closes each window. Two closes
/// racing (a second window ending before the first close reached the inner
/// algorithm) reach it in either order, each folded in.
///
/// ```
/// use tollgate::{Gradient2, LimitAlgorithm, Sample, Windowed};
///
/// let windowed = Windowed::builder().build(Gradient2::builder().build()?)?;
/// let second = 1_000_000_000;
/// // The first sample closes the (empty) first window and starts a 1 s one.
/// windowed.on_sample(Sample::success(5_000_000, 20), 1);
/// for i in 0..20 {
///     windowed.on_sample(Sample::success(5_000_000, 20), 2 + i);
/// }
/// assert_eq!(windowed.open_window().samples, 20);
/// assert_eq!(windowed.limit(), 20); // nothing reached Gradient2 yet
/// // The window closes: Gradient2 sees one 5 ms sample and grows the limit.
/// windowed.on_sample(Sample::success(5_000_000, 20), second + 2);
/// assert_eq!(windowed.open_window().samples, 0);
/// assert_eq!(windowed.inner().long_rtt_ns(), 5_000_000);
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
#[derive(Debug)]
pub struct Windowed<A> {
    inner: A,
    window: AtomicCell<u128>,
    close_at: AtomicCell<u64>,
    window_ns: u64,
    min_samples: u32,
    min_rtt_ns: u64,
}

/// Configures a [`Windowed`]; every setting starts at `WindowedLimit`'s
/// default.
#[derive(Debug, Clone)]
pub struct WindowedBuilder {
    window: Duration,
    min_samples: u32,
    min_rtt: Duration,
}

impl Default for WindowedBuilder {
    fn default() -> Self {
        WindowedBuilder {
            window: Duration::from_secs(1),
            min_samples: 10,
            min_rtt: Duration::from_micros(100),
        }
    }
}

/// The open window, as a dashboard would show it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WindowStats {
    /// Samples aggregated so far.
    pub samples: u32,
    /// Their mean round trip, ns (0 if none).
    pub mean_rtt_ns: u64,
    /// The most requests in flight any of them saw.
    pub max_in_flight: u32,
    /// Whether any of them was dropped.
    pub dropped: bool,
}

impl WindowedBuilder {
    setters! {
        /// How long a window lasts (default 1 s; between 1 µs and 2^62 ns).
        window(window: Duration) -> window;

        /// The fewest samples a window must hold to reach the inner algorithm
        /// (default 10; at least 1).
        min_samples(samples: u32) -> min_samples;

        /// Samples faster than this are passed over (default 100 µs).
        min_rtt(min_rtt: Duration) -> min_rtt;
    }

    /// The wrapper around `inner`, or why the configuration cannot be
    /// honoured ([`ConfigError::InvalidParameter`]).
    ///
    /// ```
    /// use tollgate::{Aimd, ConfigError, Windowed};
    ///
    /// let err = Windowed::builder().min_samples(0).build(Aimd::builder().build()?).unwrap_err();
    /// assert_eq!(err, ConfigError::InvalidParameter { name: "min samples", range: "at least 1" });
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn build<A: LimitAlgorithm>(self, inner: A) -> Result<Windowed<A>, ConfigError> {
        let window_ns = u64::try_from(self.window.as_nanos()).unwrap_or(u64::MAX);
        if !(1_000..=1 << 62).contains(&window_ns) {
            return Err(ConfigError::InvalidParameter {
                name: "window",
                range: "1 µs..=2^62 ns",
            });
        }
        if self.min_samples == 0 {
            return Err(ConfigError::InvalidParameter {
                name: "min samples",
                range: "at least 1",
            });
        }
        Ok(Windowed {
            inner,
            window: AtomicCell::new(0),
            close_at: AtomicCell::new(0),
            window_ns,
            min_samples: self.min_samples,
            min_rtt_ns: u64::try_from(self.min_rtt.as_nanos()).unwrap_or(u64::MAX),
        })
    }
}

impl Windowed<()> {
    /// A builder starting from `WindowedLimit`'s defaults.
    pub fn builder() -> WindowedBuilder {
        WindowedBuilder::default()
    }
}

impl<A> Windowed<A> {
    /// The algorithm the windows feed.
    pub fn inner(&self) -> &A {
        &self.inner
    }

    /// The window being aggregated.
    pub fn open_window(&self) -> WindowStats {
        stats(self.window.load())
    }
}

/// The window word with `sample` added.
fn add(word: u128, sample: &Sample) -> u128 {
    let count = word & COUNT_MAX;
    let in_flight = (word >> 20) & IN_FLIGHT_MAX;
    let mut next = word & !(IN_FLIGHT_MAX << 20);
    next |= in_flight.max(u128::from(sample.in_flight).min(IN_FLIGHT_MAX)) << 20;
    if sample.outcome == Outcome::Dropped {
        // A drop is flagged, not averaged (see `Windowed`).
        return next | DROP_BIT;
    }
    // A full window keeps its mean: count and sum stop together. 2^20
    // round trips of < 2^64 ns sum to < 2^84, inside the 86 bits.
    if count < COUNT_MAX {
        next += 1;
        next += u128::from(sample.rtt_ns) << SUM_SHIFT;
    }
    next
}

fn stats(word: u128) -> WindowStats {
    let samples = (word & COUNT_MAX) as u32;
    let sum = word >> SUM_SHIFT;
    WindowStats {
        samples,
        mean_rtt_ns: if samples == 0 {
            0
        } else {
            (sum / u128::from(samples)) as u64
        },
        max_in_flight: ((word >> 20) & IN_FLIGHT_MAX) as u32,
        dropped: word & DROP_BIT != 0,
    }
}

impl<A: LimitAlgorithm> LimitAlgorithm for Windowed<A> {
    fn on_sample(&self, sample: Sample, now_ns: u64) -> Option<u32> {
        let too_fast = sample.outcome == Outcome::Success && sample.rtt_ns < self.min_rtt_ns;
        if sample.outcome == Outcome::Ignored || too_fast {
            return None;
        }
        let _ = self.window.update(|word| Ok::<_, ()>(add(word, &sample)));
        // Most samples stop here: the window is still open.
        if now_ns <= self.close_at.load() {
            return None;
        }
        // Claim this close: only the sample that moves the close time on
        // closes the window; one that finds it moved already has nothing to
        // do (its sample is in the next window).
        let next_close = now_ns.saturating_add(self.window_ns);
        self.close_at
            .update(|close| {
                if now_ns > close {
                    Ok(next_close)
                } else {
                    Err(())
                }
            })
            .ok()?;
        let mut closed = 0;
        let _ = self.window.update(|word| {
            closed = word;
            Ok::<_, ()>(0)
        });
        let closed = stats(closed);
        if closed.samples < self.min_samples && !closed.dropped {
            return None;
        }
        let outcome = if closed.dropped {
            Outcome::Dropped
        } else {
            Outcome::Success
        };
        self.inner.on_sample(
            Sample {
                rtt_ns: closed.mean_rtt_ns,
                in_flight: closed.max_in_flight,
                outcome,
            },
            now_ns,
        )
    }

    fn limit(&self) -> u32 {
        self.inner.limit()
    }

    fn history(&self) -> Option<&LimitHistory> {
        self.inner.history()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::adaptive::Aimd;
    use std::sync::Mutex;

    /// Records what reaches it.
    #[derive(Default)]
    struct Recorder(Mutex<Vec<Sample>>);

    impl LimitAlgorithm for Recorder {
        fn on_sample(&self, sample: Sample, _now_ns: u64) -> Option<u32> {
            self.0.lock().unwrap().push(sample);
            None
        }

        fn limit(&self) -> u32 {
            1
        }
    }

    #[test]
    fn aggregates_like_the_average_sample_window() {
        let w = Windowed::builder()
            .min_samples(3)
            .build(Recorder::default())
            .unwrap();
        // Opens the first window (closes the empty one at 0).
        w.on_sample(Sample::success(1_000_000, 1), 10);
        assert!(w.inner().0.lock().unwrap().is_empty());
        w.on_sample(Sample::success(2_000_000, 7), 20);
        w.on_sample(Sample::success(3_000_000, 4), 25);
        // A drop is flagged and counts towards the peak in flight, but its
        // round trip (the refusal's) is not averaged in.
        w.on_sample(Sample::dropped(50, 8), 30);
        w.on_sample(Sample::success(50, 99), 40); // under min_rtt: passed over
        w.on_sample(Sample::ignored(5_000_000, 99), 50);
        assert_eq!(
            w.open_window(),
            WindowStats {
                samples: 2,
                mean_rtt_ns: 2_500_000,
                max_in_flight: 8,
                dropped: true
            }
        );
        // The closing sample belongs to the closing window.
        w.on_sample(Sample::success(4_000_000, 2), 1_000_000_011);
        assert_eq!(
            *w.inner().0.lock().unwrap(),
            [Sample::dropped(3_000_000, 8)]
        );
        assert_eq!(w.open_window().samples, 0);
        // Too few samples: the window closes without reaching the inner one.
        w.on_sample(Sample::success(4_000_000, 2), 2_000_000_012);
        assert_eq!(w.inner().0.lock().unwrap().len(), 1);
        // But a drop always does, with its window's mean of successes.
        w.on_sample(Sample::dropped(1_000, 3), 2_500_000_000);
        w.on_sample(Sample::success(4_000_000, 1), 3_000_000_013);
        assert_eq!(
            w.inner().0.lock().unwrap().last(),
            Some(&Sample::dropped(4_000_000, 3))
        );
    }

    #[test]
    fn a_full_window_keeps_its_mean() {
        let mut word = COUNT_MAX | (COUNT_MAX * 7) << SUM_SHIFT;
        word = add(word, &Sample::dropped(1_000, 9));
        word = add(word, &Sample::success(1_000, 2));
        let s = stats(word);
        assert_eq!((s.samples, s.mean_rtt_ns), (COUNT_MAX as u32, 7));
        assert!(s.dropped);
        assert_eq!(s.max_in_flight, 9);
    }

    #[test]
    fn delegates_limit_and_history() {
        let w = Windowed::builder()
            .build(Aimd::builder().build().unwrap())
            .unwrap();
        assert_eq!(w.limit(), 20);
        assert_eq!(w.history().unwrap().changes(), 0);
    }
}
