//! The two-word limiters as keyed kinds: the leaky bucket used as a queue
//! ([`Shaper`]) and the warm-up token bucket ([`WarmUp`]), with their locking
//! twins. Each key's state is the direct limiter's own 128-bit word, unpadded
//! (16 bytes: an `AtomicU128`, or a `u128` under a mutex for the twins), with
//! the keyed layer's tag in bit 63 — the low word, which holds a start time
//! (shaper) or the idle time the bank lacks (warm-up), both far below `2^63`.
//! The machines, with their freshness, carry-over and refund, are the direct
//! limiters' own; the tag handling and the cells are the shared word driver's (see
//! `word.rs`); this file gives each its configuration.
//!
//! Per key, these kinds decide as the direct limiters' [`RateLimiter`] calls
//! do: a request is admitted only if it can start at once (the shaper and
//! warm-up as meters). Per-key reservations (`reserve`/`acquire`, a start in
//! the future) are not offered by [`Keyed`](crate::keyed::Keyed) yet.
//!
//! [`RateLimiter`]: crate::RateLimiter

use std::fmt;
use std::time::Duration;

use super::word::{
    AtomicWideWord, LockedWideWord, WordConfig, WordOf, acquire, admitted, peek, refund, resolved,
    settle, word_kind,
};
use super::{Refusal, View};
use crate::clock::Clock;
use crate::error::ConfigError;
use crate::leaky_bucket::shaper::Queue;
use crate::leaky_bucket::{LockingShaper, Shaper};
use crate::limiter::Snapshot;
use crate::rate::Rate;
use crate::warm_up::curve::Curve;
use crate::warm_up::{DEFAULT_COLD_FACTOR, LockingWarmUp, WarmUp};

/// The configuration of a keyed or tunable [`Shaper`]: a rate, a burst and a
/// queue bound, validated once.
///
/// Per key the shaper admits what can start at once (as
/// [`Shaper::try_acquire_n`](crate::RateLimiter::try_acquire_n) does): starts
/// one interval apart after `burst`; `max_wait` sets the largest request.
///
/// ```
/// use std::time::Duration;
/// use tollgate::keyed::{Keyed, ShaperConfig};
/// use tollgate::{Denied, ManualClock, Rate, Shaper};
///
/// let cfg = ShaperConfig::new(Rate::per_second(10), 1, Duration::ZERO).unwrap();
/// let per_user = Keyed::<String, Shaper<ManualClock>>::with_clock(cfg, ManualClock::new());
/// assert!(per_user.try_acquire("alice").is_ok());
/// assert!(per_user.try_acquire("alice").is_ok()); // the burst of one
/// assert_eq!(per_user.try_acquire("alice"), Err(Denied::RetryAfter(Duration::from_millis(100))));
/// assert!(per_user.try_acquire("bob").is_ok());
/// ```
#[derive(Clone, Copy)]
pub struct ShaperConfig {
    rate: Rate,
    burst: u32,
    max_wait: Duration,
    queue: Queue,
}

impl ShaperConfig {
    /// Starts at `rate` after `burst` extra ones, a queue of at most
    /// `max_wait`, with the errors of [`Shaper::new`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::keyed::ShaperConfig;
    /// use tollgate::{ConfigError, Rate};
    /// assert!(ShaperConfig::new(Rate::per_second(5), 2, Duration::from_secs(1)).is_ok());
    /// assert_eq!(ShaperConfig::new(Rate::per_second(0), 0, Duration::ZERO).unwrap_err(), ConfigError::ZeroRate);
    /// ```
    pub fn new(rate: Rate, burst: u32, max_wait: Duration) -> Result<Self, ConfigError> {
        Ok(ShaperConfig {
            rate,
            burst,
            max_wait,
            queue: Queue::new(rate, burst, max_wait)?,
        })
    }

    /// The rate of starts.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use tollgate::{keyed::ShaperConfig, Rate};
    /// let cfg = ShaperConfig::new(Rate::per_second(5), 2, Duration::ZERO).unwrap();
    /// assert_eq!((cfg.rate(), cfg.burst(), cfg.max_wait()), (Rate::per_second(5), 2, Duration::ZERO));
    /// ```
    pub fn rate(&self) -> Rate {
        self.rate
    }

    /// Starts allowed at once on an idle queue, beyond the first.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use tollgate::{keyed::ShaperConfig, Rate};
    /// assert_eq!(ShaperConfig::new(Rate::per_second(5), 2, Duration::ZERO).unwrap().burst(), 2);
    /// ```
    pub fn burst(&self) -> u32 {
        self.burst
    }

    /// The queue bound.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use tollgate::{keyed::ShaperConfig, Rate};
    /// let cfg = ShaperConfig::new(Rate::per_second(5), 0, Duration::from_secs(1)).unwrap();
    /// assert_eq!(cfg.max_wait(), Duration::from_secs(1));
    /// ```
    pub fn max_wait(&self) -> Duration {
        self.max_wait
    }
}

impl PartialEq for ShaperConfig {
    fn eq(&self, other: &Self) -> bool {
        (self.rate, self.burst, self.max_wait) == (other.rate, other.burst, other.max_wait)
    }
}

impl Eq for ShaperConfig {}

impl fmt::Debug for ShaperConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShaperConfig")
            .field("rate", &self.rate)
            .field("burst", &self.burst)
            .field("max_wait", &self.max_wait)
            .finish()
    }
}

/// The configuration of a keyed or tunable [`WarmUp`]: a stable rate, a
/// warm-up period and a cold factor, validated once.
///
/// ```
/// use std::time::Duration;
/// use tollgate::keyed::{Keyed, WarmUpConfig};
/// use tollgate::{ManualClock, Rate, WarmUp};
///
/// let cfg = WarmUpConfig::new(Rate::per_second(10), Duration::from_secs(2)).unwrap();
/// let per_user = Keyed::<String, WarmUp<ManualClock>>::with_clock(cfg, ManualClock::new());
/// assert!(per_user.try_acquire("alice").is_ok()); // every key starts cold
/// assert!(per_user.try_acquire("alice").is_err());
/// ```
#[derive(Clone, Copy)]
pub struct WarmUpConfig {
    rate: Rate,
    warm_up: Duration,
    cold_factor: u32,
    curve: Curve,
}

impl WarmUpConfig {
    /// With the default cold factor and the errors of [`WarmUp::new`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::keyed::WarmUpConfig;
    /// use tollgate::Rate;
    /// assert!(WarmUpConfig::new(Rate::per_second(5), Duration::from_secs(4)).is_ok());
    /// ```
    pub fn new(rate: Rate, warm_up: Duration) -> Result<Self, ConfigError> {
        Self::with_cold_factor(rate, warm_up, DEFAULT_COLD_FACTOR)
    }

    /// With a cold factor, and the errors of [`WarmUp::with_cold_factor`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::keyed::WarmUpConfig;
    /// use tollgate::{ConfigError, Rate};
    /// let err = WarmUpConfig::with_cold_factor(Rate::per_second(5), Duration::from_secs(4), 0);
    /// assert_eq!(err.unwrap_err(), ConfigError::InvalidColdFactor { cold_factor: 0 });
    /// ```
    pub fn with_cold_factor(
        rate: Rate,
        warm_up: Duration,
        cold_factor: u32,
    ) -> Result<Self, ConfigError> {
        Ok(WarmUpConfig {
            rate,
            warm_up,
            cold_factor,
            curve: Curve::new(rate, warm_up, cold_factor)?,
        })
    }

    /// The stable rate.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use tollgate::{keyed::WarmUpConfig, Rate};
    /// let cfg = WarmUpConfig::new(Rate::per_second(5), Duration::from_secs(4)).unwrap();
    /// assert_eq!((cfg.rate(), cfg.warm_up(), cfg.cold_factor()), (Rate::per_second(5), Duration::from_secs(4), 3));
    /// ```
    pub fn rate(&self) -> Rate {
        self.rate
    }

    /// The warm-up period.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use tollgate::{keyed::WarmUpConfig, Rate};
    /// assert_eq!(WarmUpConfig::new(Rate::per_second(5), Duration::from_secs(4)).unwrap().warm_up(), Duration::from_secs(4));
    /// ```
    pub fn warm_up(&self) -> Duration {
        self.warm_up
    }

    /// How much slower a cold key is than a warm one.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use tollgate::{keyed::WarmUpConfig, Rate};
    /// assert_eq!(WarmUpConfig::with_cold_factor(Rate::per_second(5), Duration::from_secs(4), 7).unwrap().cold_factor(), 7);
    /// ```
    pub fn cold_factor(&self) -> u32 {
        self.cold_factor
    }
}

impl PartialEq for WarmUpConfig {
    fn eq(&self, other: &Self) -> bool {
        (self.rate, self.warm_up, self.cold_factor)
            == (other.rate, other.warm_up, other.cold_factor)
    }
}

impl Eq for WarmUpConfig {}

impl fmt::Debug for WarmUpConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WarmUpConfig")
            .field("rate", &self.rate)
            .field("warm_up", &self.warm_up)
            .field("cold_factor", &self.cold_factor)
            .finish()
    }
}

impl WordConfig for ShaperConfig {
    type Machine = Queue;
    fn machine(&self) -> &Queue {
        &self.queue
    }
}

impl WordConfig for WarmUpConfig {
    type Machine = Curve;
    fn machine(&self) -> &Curve {
        &self.curve
    }
}

word_kind!(Shaper, ShaperConfig, AtomicWideWord, u128);
word_kind!(LockingShaper, ShaperConfig, LockedWideWord, u128);
word_kind!(WarmUp, WarmUpConfig, AtomicWideWord, u128);
word_kind!(LockingWarmUp, WarmUpConfig, LockedWideWord, u128);

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::kind::TAG;
    use crate::machine::{Carry, Machine, pack};
    use crate::timeline::{END, MAX_TIME};

    /// The tag (bit 63 of the low word) is free only if no two-word state
    /// reaches it: at the end of time, with the longest waits and warm-up
    /// periods, after admissions and after carry-overs.
    #[test]
    fn two_word_states_stay_below_the_tag_at_the_end_of_time() {
        let tag = u128::from(TAG);
        let queue = Queue::new(
            Rate::new(1, Duration::from_nanos(1)),
            u32::MAX / 2,
            Duration::ZERO,
        )
        .unwrap();
        let mut state = <Queue as Machine>::INITIAL;
        for now in [END - 5, END - 1, END] {
            state = Machine::decide(&queue, state, now, 1).unwrap_or(state);
            assert_eq!(state & tag, 0);
        }
        let slow = Queue::new(
            Rate::new(1, Duration::from_nanos(MAX_TIME / 4)),
            1,
            Duration::ZERO,
        )
        .unwrap();
        let carried = <Queue as Machine>::carry(&queue, &slow, state, END, Carry::Additive);
        assert_eq!(carried & tag, 0);

        let longest = Duration::from_nanos(1 << 52);
        let curve = Curve::new(Rate::new(1, Duration::from_nanos(1)), longest, 1000).unwrap();
        let mut state = <Curve as Machine>::INITIAL;
        for now in [END - (1 << 40), END] {
            state = Machine::decide(&curve, state, now, 1 << 20).unwrap_or(state);
            assert_eq!(state & tag, 0);
        }
        let other = Curve::new(Rate::per_second(1), longest, 3).unwrap();
        for carry in [Carry::Proportional, Carry::Additive] {
            assert_eq!(
                <Curve as Machine>::carry(&curve, &other, state, END, carry) & tag,
                0
            );
        }
    }

    /// A key's two-word state costs 16 bytes, unpadded (the direct limiters
    /// pad theirs to a cache line).
    #[test]
    fn a_two_word_state_is_sixteen_bytes() {
        assert_eq!(std::mem::size_of::<AtomicWideWord>(), 16);
        assert_eq!(std::mem::size_of::<(u64, AtomicWideWord)>(), 32);
    }

    /// Carrying a fresh state gives the initial word, whatever the strategy.
    #[test]
    fn carrying_a_fresh_two_word_state_gives_the_initial_word() {
        let a = Queue::new(Rate::per_second(10), 3, Duration::from_secs(1)).unwrap();
        let b = Queue::new(Rate::per_minute(7), 0, Duration::ZERO).unwrap();
        let c = Curve::new(Rate::per_second(10), Duration::from_secs(2), 3).unwrap();
        let d = Curve::new(Rate::per_minute(7), Duration::from_secs(9), 5).unwrap();
        for carry in [Carry::Proportional, Carry::Additive, Carry::Reset] {
            for now in [0, 1, 10_000_000_000] {
                assert_eq!(<Queue as Machine>::carry(&a, &b, 0, now, carry), 0);
                assert_eq!(<Curve as Machine>::carry(&c, &d, 0, now, carry), 0);
                // An ended schedule; a key idle long enough to be cold.
                assert_eq!(
                    <Queue as Machine>::carry(&a, &b, pack(now, now), now, carry),
                    0
                );
                let idle = pack(now / 2, now / 2);
                assert!(Machine::is_fresh(&c, idle, now));
                assert_eq!(<Curve as Machine>::carry(&c, &d, idle, now, carry), 0);
            }
        }
    }
}
