//! The one-word limiters (token bucket, fixed window, leaky bucket meter) as
//! keyed kinds: their configurations, and their per-key word (an unpadded
//! `AtomicU64`, or a `u64` under a mutex for the twins) driven by the shared
//! word driver (`word`).
//!
//! The decisions are the limiters' own decision functions
//! ([`Machine::decide`](crate::machine::Machine::decide)), so a keyed token bucket decides exactly as a
//! [`TokenBucket`] built at the keyed limiter's construction would, on the
//! same decision times (a [`Keyed`](crate::keyed::Keyed) decides a reading below its
//! time floor at the floor; see [`FLOOR_STEP`](crate::keyed::FLOOR_STEP)).
//!
//! [`TokenBucket`]: crate::TokenBucket

use std::fmt;
use std::time::Duration;

use super::word::{
    AtomicWord, LockedWord, WordConfig, WordOf, acquire, admitted, peek, refund, resolved, settle,
    word_kind,
};
use super::{Refusal, View};
use crate::clock::Clock;
use crate::error::ConfigError;
use crate::fixed_window::counter::WindowCounter;
use crate::fixed_window::{FixedWindow, LockingFixedWindow};
use crate::leaky_bucket::meter::Meter;
use crate::leaky_bucket::{LeakyBucket, LockingLeakyBucket};
use crate::limiter::Snapshot;
use crate::machine::Machine;
use crate::rate::Rate;
use crate::token_bucket::gcra::Gcra;
use crate::token_bucket::{LockingTokenBucket, TokenBucket};

/// The configuration of a keyed or tunable [`TokenBucket`]: a capacity and a
/// refill rate, validated once (with the errors of [`TokenBucket::new`]).
///
/// ```
/// use tollgate::keyed::BucketConfig;
/// use tollgate::{ConfigError, Rate};
///
/// let cfg = BucketConfig::new(10, Rate::per_second(5)).unwrap();
/// assert_eq!((cfg.capacity(), cfg.rate()), (10, Rate::per_second(5)));
/// assert_eq!(BucketConfig::new(0, Rate::per_second(5)).unwrap_err(), ConfigError::ZeroCapacity);
/// ```
pub type BucketConfig = CapacityRate<Gcra>;

/// The configuration of a keyed or tunable [`LeakyBucket`] meter: a capacity
/// and a drain rate, validated once (with the errors of
/// [`LeakyBucket::new`]).
///
/// ```
/// use tollgate::keyed::{Keyed, MeterConfig};
/// use tollgate::{ConfigError, LeakyBucket, Rate};
///
/// let cfg = MeterConfig::new(10, Rate::per_second(5)).unwrap();
/// assert_eq!((cfg.capacity(), cfg.rate()), (10, Rate::per_second(5)));
/// assert_eq!(MeterConfig::new(0, Rate::per_second(5)).unwrap_err(), ConfigError::ZeroCapacity);
/// assert_eq!(MeterConfig::new(1, Rate::per_second(0)).unwrap_err(), ConfigError::ZeroRate);
/// let per_user = Keyed::<String, LeakyBucket>::new(cfg);
/// assert!(per_user.try_acquire_n("alice", 10).is_ok());
/// assert!(per_user.try_acquire("alice").is_err());
/// ```
pub type MeterConfig = CapacityRate<Meter>;

/// A capacity and a rate, validated once into the machine `M` every key
/// decides with: the one type behind [`BucketConfig`] (a token bucket's
/// burst and refill rate) and [`MeterConfig`] (a leaky bucket's size and
/// drain rate). Name it through those two.
#[derive(Clone, Copy)]
pub struct CapacityRate<M: Rated> {
    capacity: u32,
    rate: Rate,
    machine: M,
}

/// A machine built from a capacity and a rate: the parameter of
/// [`CapacityRate`]. Sealed: the token bucket's and the meter's.
#[allow(unreachable_pub)] // sealed: public only as `CapacityRate`'s parameter
pub trait Rated: Copy + Send + Sync + 'static {
    /// The configuration's name in `Debug` output.
    const CONFIG: &'static str;
    /// Validates `capacity` and `rate` into the machine.
    fn build(capacity: u32, rate: Rate) -> Result<Self, ConfigError>;
}

impl Rated for Gcra {
    const CONFIG: &'static str = "BucketConfig";
    fn build(capacity: u32, rate: Rate) -> Result<Self, ConfigError> {
        Gcra::new(capacity, rate)
    }
}

impl Rated for Meter {
    const CONFIG: &'static str = "MeterConfig";
    fn build(capacity: u32, rate: Rate) -> Result<Self, ConfigError> {
        Meter::new(capacity, rate)
    }
}

impl<M: Rated> CapacityRate<M> {
    /// `capacity` permits at `rate`, validated as the direct limiter's
    /// constructor does.
    ///
    /// ```
    /// use tollgate::keyed::{BucketConfig, MeterConfig};
    /// use tollgate::Rate;
    /// assert!(BucketConfig::new(100, Rate::per_minute(100)).is_ok());
    /// assert!(MeterConfig::new(30, Rate::per_minute(30)).is_ok());
    /// ```
    pub fn new(capacity: u32, rate: Rate) -> Result<Self, ConfigError> {
        Ok(CapacityRate {
            capacity,
            rate,
            machine: M::build(capacity, rate)?,
        })
    }

    /// The capacity: a token bucket's burst, the most a leaky bucket holds.
    ///
    /// ```
    /// # use tollgate::{keyed::BucketConfig, Rate};
    /// assert_eq!(BucketConfig::new(3, Rate::per_second(1)).unwrap().capacity(), 3);
    /// ```
    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// The rate: a token bucket's refill, a leaky bucket's drain.
    ///
    /// ```
    /// # use tollgate::{keyed::MeterConfig, Rate};
    /// assert_eq!(MeterConfig::new(3, Rate::per_second(1)).unwrap().rate(), Rate::per_second(1));
    /// ```
    pub fn rate(&self) -> Rate {
        self.rate
    }
}

impl<M: Rated> PartialEq for CapacityRate<M> {
    fn eq(&self, other: &Self) -> bool {
        // The machine is a function of these two.
        (self.capacity, self.rate) == (other.capacity, other.rate)
    }
}

impl<M: Rated> Eq for CapacityRate<M> {}

impl<M: Rated> fmt::Debug for CapacityRate<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct(M::CONFIG)
            .field("capacity", &self.capacity)
            .field("rate", &self.rate)
            .finish()
    }
}

/// The configuration of a keyed or tunable [`FixedWindow`]: a limit per window,
/// validated once.
///
/// ```
/// use std::time::Duration;
/// use tollgate::keyed::WindowConfig;
/// use tollgate::Rate;
///
/// let cfg = WindowConfig::new(Rate::per_minute(100)).unwrap();
/// assert_eq!((cfg.limit(), cfg.window()), (100, Duration::from_secs(60)));
/// ```
#[derive(Clone, Copy)]
pub struct WindowConfig {
    rate: Rate,
    counter: WindowCounter,
}

impl WindowConfig {
    /// `rate.permits()` per aligned window of `rate.period()`, with the errors
    /// of [`FixedWindow::new`].
    ///
    /// ```
    /// use tollgate::keyed::WindowConfig;
    /// use tollgate::{ConfigError, Rate};
    /// assert_eq!(WindowConfig::new(Rate::per_second(0)).unwrap_err(), ConfigError::ZeroRate);
    /// ```
    pub fn new(rate: Rate) -> Result<Self, ConfigError> {
        Ok(WindowConfig {
            rate,
            counter: WindowCounter::new(rate)?,
        })
    }

    /// Permits per window.
    ///
    /// ```
    /// # use tollgate::{keyed::WindowConfig, Rate};
    /// assert_eq!(WindowConfig::new(Rate::per_hour(7)).unwrap().limit(), 7);
    /// ```
    pub fn limit(&self) -> u32 {
        self.rate.permits()
    }

    /// The window's length.
    ///
    /// ```
    /// # use tollgate::{keyed::WindowConfig, Rate};
    /// assert_eq!(WindowConfig::new(Rate::per_hour(7)).unwrap().window().as_secs(), 3600);
    /// ```
    pub fn window(&self) -> Duration {
        self.rate.period()
    }
}

impl PartialEq for WindowConfig {
    fn eq(&self, other: &Self) -> bool {
        self.rate == other.rate
    }
}

impl Eq for WindowConfig {}

impl fmt::Debug for WindowConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WindowConfig")
            .field("limit", &self.limit())
            .field("window", &self.window())
            .finish()
    }
}

/// Bits of the fixed window's count field for `limit`: the layout documented
/// in `fixed_window`'s state table, on which its refund rule relies (checked
/// by a test below).
#[cfg(all(test, not(loom)))]
fn count_bits(limit: u32) -> u32 {
    u32::BITS - limit.leading_zeros()
}

impl<M: Rated + Machine> WordConfig for CapacityRate<M> {
    type Machine = M;
    fn machine(&self) -> &M {
        &self.machine
    }
}

impl WordConfig for WindowConfig {
    type Machine = WindowCounter;
    fn machine(&self) -> &WindowCounter {
        &self.counter
    }
}

word_kind!(TokenBucket, BucketConfig, AtomicWord, u64);
word_kind!(LockingTokenBucket, BucketConfig, LockedWord, u64);
word_kind!(FixedWindow, WindowConfig, AtomicWord, u64);
word_kind!(LockingFixedWindow, WindowConfig, LockedWord, u64);
word_kind!(LeakyBucket, MeterConfig, AtomicWord, u64);
word_kind!(LockingLeakyBucket, MeterConfig, LockedWord, u64);

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::cell::StateCell;
    use crate::kind::TAG;
    use crate::kind::sealed::Kind;
    use crate::machine::Carry;

    /// A view of `config` alone: no change in progress, never stale.
    fn settled<G>(config: &G) -> View<'_, G> {
        View {
            current: config,
            previous: config,
            carry: Carry::Reset,
            tag: 0,
            still_current: &|| true,
        }
    }

    /// `count_bits` and the refund rely on the documented packing of the fixed
    /// window's word; this fails if that layout ever changes.
    #[test]
    fn window_word_layout_is_as_documented() {
        for limit in [1u32, 2, 3, 7, 8, 100, 1000, u32::MAX / 4] {
            let window = u64::from(limit) * 10;
            let counter =
                WindowCounter::new(Rate::new(limit, Duration::from_nanos(window))).unwrap();
            for now in [0, window - 1, window, 5 * window + 3] {
                for n in [1, limit / 2 + 1, limit] {
                    let word = counter.decide(WindowCounter::INITIAL, now, n).unwrap();
                    assert_eq!(word, ((now / window) << count_bits(limit)) | u64::from(n));
                }
            }
        }
    }

    #[test]
    fn gcra_word_is_the_theoretical_arrival_time() {
        let gcra = Gcra::new(10, Rate::per_second(10)).unwrap();
        assert_eq!(
            gcra.decide(Gcra::INITIAL, 1_000, 3).unwrap(),
            1_000 + 300_000_000
        );
    }

    /// The tag (bit 63) is free only if no state ever reaches it: checked at
    /// the end of time (`END`) for the configurations closest to the edge —
    /// the densest windows with a power-of-two limit, and a bucket whose
    /// capacity takes the whole time range to refill.
    #[test]
    fn states_stay_below_the_tag_at_the_end_of_time() {
        use crate::timeline::{END, MAX_TIME};
        for bits in 0..32 {
            let limit = 1u32 << bits;
            let counter =
                WindowCounter::new(Rate::new(limit, Duration::from_nanos(u64::from(limit))))
                    .unwrap();
            let word = counter.decide(WindowCounter::INITIAL, END, limit).unwrap();
            assert_eq!(word & TAG, 0, "limit {limit}");
        }
        let gcra = Gcra::new(1, Rate::new(1, Duration::from_nanos(MAX_TIME))).unwrap();
        let tat = gcra.decide(Gcra::INITIAL, END, 1).unwrap();
        assert_eq!(tat & TAG, 0);
        let meter = Meter::new(1, Rate::new(1, Duration::from_nanos(MAX_TIME))).unwrap();
        let empty_at = meter.decide(Meter::INITIAL, END, 1).unwrap();
        assert_eq!(empty_at & TAG, 0);
    }

    /// A refund at a stale reading, step by step at the kind level (the interleaving
    /// falls inside one combined `acquire`, so it is spelled out here on the
    /// parts; `loom-tests/tests/combined.rs` finds it through the public API).
    #[test]
    fn a_refund_at_a_stale_reading_gives_away_no_later_permit() {
        use crate::clock::ManualClock;
        type A = TokenBucket<ManualClock>;
        type B = LockingTokenBucket<ManualClock>;
        let per_100ns = |capacity| {
            BucketConfig::new(capacity, Rate::new(1, Duration::from_nanos(100))).unwrap()
        };
        let config = (per_100ns(1), per_100ns(3));
        let view = settled(&config);
        let (va, vb) = (view.map(|c| &c.0), view.map(|c| &c.1));
        let state = <(A, B)>::fresh(0);
        // The second part has no room at 1127.
        B::acquire(&vb, &state.1, 1127, 3).unwrap();
        // X reads 1127: admitted by the first part, denied by the second...
        let receipt = A::acquire(&va, &state.0, 1127, 1).unwrap();
        assert!(B::acquire(&vb, &state.1, 1127, 1).is_err());
        // ...while Y, at 3534, finds the first part full again and is admitted.
        assert!(<(A, B)>::acquire(&view, &state, 3534, 1).is_ok());
        // X's refund must not give Y's permit away.
        A::refund(&va, &state.0, receipt, 1);
        assert!(
            <(A, B)>::acquire(&view, &state, 3534, 1).is_err(),
            "2 permits at t = 3534 from a bucket of 1"
        );
    }

    /// Without a race the refund is exact: the word is the one it wrote.
    #[test]
    fn an_unraced_refund_restores_the_word_it_replaced() {
        use crate::clock::ManualClock;
        type A = TokenBucket<ManualClock>;
        let config = BucketConfig::new(2, Rate::new(1, Duration::from_nanos(100))).unwrap();
        let view = settled(&config);
        let state = A::fresh(0);
        A::acquire(&view, &state, 50, 1).unwrap();
        let word = state.load();
        let receipt = A::acquire(&view, &state, 70, 1).unwrap();
        A::refund(&view, &state, receipt, 1);
        assert_eq!(state.load(), word);
    }

    #[test]
    fn carrying_a_fresh_state_gives_a_fresh_state() {
        let a = Gcra::new(10, Rate::per_second(10)).unwrap();
        let b = Gcra::new(3, Rate::per_minute(7)).unwrap();
        let wa = WindowCounter::new(Rate::per_second(10)).unwrap();
        let wb = WindowCounter::new(Rate::per_minute(3)).unwrap();
        for carry in [Carry::Proportional, Carry::Additive, Carry::Reset] {
            for now in [0, 1, 10_000_000_000] {
                assert_eq!(
                    Gcra::carry(&a, &b, Gcra::INITIAL, now, carry),
                    Gcra::INITIAL
                );
                assert_eq!(Gcra::carry(&a, &b, now, now, carry), Gcra::INITIAL);
                let (ma, mb) = (
                    Meter::new(10, Rate::per_second(10)).unwrap(),
                    Meter::new(3, Rate::per_minute(7)).unwrap(),
                );
                assert_eq!(Meter::carry(&ma, &mb, Meter::INITIAL, now, carry), 0);
                assert_eq!(Meter::carry(&ma, &mb, now, now, carry), 0);
                let w = WindowCounter::carry(&wa, &wb, WindowCounter::INITIAL, now, carry);
                assert_eq!(wb.snapshot(w, now).available, 3);
            }
        }
    }
}
