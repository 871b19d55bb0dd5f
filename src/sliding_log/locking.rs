//! The sliding log's locking twin: the same ring, words and decision under a mutex.

use std::time::Duration;

use crossbeam_utils::CachePadded;
use parking_lot::Mutex;

use super::log::{
    EMPTY, Entries, Entry, Geometry, Inheritance, Verdict, entry_word, lap_bit, retry_after,
};
use crate::clock::{Clock, MonotonicClock};
use crate::error::{ConfigError, Denied};
use crate::limiter::{RateLimiter, Snapshot, check_request};
use crate::rate::Rate;
use crate::timeline::Timeline;

/// The ring as plain words: the head and one entry word per slot.
#[derive(Debug)]
struct Ring {
    geometry: Geometry,
    head: u64,
    slots: Box<[u64]>,
    /// As the lock-free ring's: permits dropped by reconfigurations.
    dropped: (u64, u64),
}

impl Entries for Ring {
    #[inline]
    fn read(&self, index: usize, lap: u64) -> Entry {
        let word = self.slots[index];
        if word & 1 == lap_bit(lap) {
            Entry::Stamp(word >> 1)
        } else {
            // Unreachable: under the lock every claimed entry is stamped before the
            // lock is released. Pending is the answer that can only deny.
            Entry::Pending
        }
    }
}

impl Ring {
    fn new(geometry: Geometry, inheritance: Inheritance) -> Self {
        let stamps = &inheritance.stamps;
        Ring {
            geometry,
            // `stamps.len() <= capacity`: lap 0, or the start of lap 1.
            head: geometry.advance(0, stamps.len() as u32).unwrap_or(0),
            slots: (0..geometry.capacity() as usize)
                .map(|i| stamps.get(i).map_or(EMPTY, |&s| entry_word(s, 0)))
                .collect(),
            dropped: (inheritance.floor, inheritance.dropped),
        }
    }

    fn stamp(&mut self, next: u64, n: u32, stamp: u64) {
        for (lap, index) in self.geometry.tickets(self.head, n) {
            self.slots[index] = entry_word(stamp, lap);
        }
        self.head = next;
    }
}

/// The [`SlidingLog`](crate::SlidingLog)'s twin: the same ring of entry words and
/// the same decision function under a `parking_lot` mutex.
///
/// Given the same clock readings it makes the same decisions, with the same
/// retry-after and the same snapshots, and a reconfiguration inherits the same
/// entries. It is the baseline in the benchmarks, the second opinion in the
/// property tests, and a fallback for anyone who prefers a lock.
///
/// ```
/// use tollgate::{LockingSlidingLog, Rate, RateLimiter};
///
/// let log = LockingSlidingLog::new(Rate::per_minute(2)).unwrap();
/// assert!(log.try_acquire_n(2).is_ok());
/// assert!(log.try_acquire().is_err());
/// ```
#[derive(Debug)]
pub struct LockingSlidingLog<C = MonotonicClock> {
    ring: CachePadded<Mutex<Ring>>,
    timeline: Timeline<C>,
}

impl LockingSlidingLog {
    /// As [`SlidingLog::new`](crate::SlidingLog::new), with the same errors.
    ///
    /// ```
    /// use tollgate::{LockingSlidingLog, Rate};
    /// let log = LockingSlidingLog::new(Rate::per_second(100)).unwrap();
    /// # let _ = log;
    /// ```
    pub fn new(rate: Rate) -> Result<Self, ConfigError> {
        Self::with_clock(rate, MonotonicClock::new())
    }
}

impl<C: Clock> LockingSlidingLog<C> {
    /// As [`SlidingLog::with_clock`](crate::SlidingLog::with_clock).
    ///
    /// ```
    /// use tollgate::{LockingSlidingLog, ManualClock, Rate};
    /// let log = LockingSlidingLog::with_clock(Rate::per_second(10), ManualClock::new()).unwrap();
    /// # let _ = log;
    /// ```
    pub fn with_clock(rate: Rate, clock: C) -> Result<Self, ConfigError> {
        Ok(LockingSlidingLog {
            ring: CachePadded::new(Mutex::new(Ring::new(
                Geometry::new(rate)?,
                Inheritance {
                    stamps: Vec::new(),
                    floor: 0,
                    dropped: 0,
                },
            ))),
            timeline: Timeline::new(clock),
        })
    }

    /// As [`SlidingLog::count_denied`](crate::SlidingLog::count_denied).
    ///
    /// ```
    /// use tollgate::{LockingSlidingLog, ManualClock, Rate, RateLimiter};
    /// let log = LockingSlidingLog::with_clock(Rate::per_second(1), ManualClock::new())
    ///     .unwrap()
    ///     .count_denied(true);
    /// assert!(log.try_acquire().is_ok());
    /// assert!(log.try_acquire().is_err());
    /// ```
    pub fn count_denied(self, on: bool) -> Self {
        self.replace_ring(|old| old.with_count_denied(on));
        self
    }

    /// As [`SlidingLog::reconfigure`](crate::SlidingLog::reconfigure): the same
    /// inherited entries, the same guarantee, the same errors.
    ///
    /// ```
    /// use tollgate::{LockingSlidingLog, Rate, RateLimiter};
    /// let log = LockingSlidingLog::new(Rate::per_minute(1)).unwrap();
    /// log.try_acquire().unwrap();
    /// log.reconfigure(Rate::per_minute(2)).unwrap();
    /// assert!(log.try_acquire().is_ok());
    /// assert!(log.try_acquire().is_err());
    /// ```
    pub fn reconfigure(&self, rate: Rate) -> Result<(), ConfigError> {
        let geometry = Geometry::new(rate)?;
        self.replace_ring(|old| geometry.with_count_denied(old.count_denied()));
        Ok(())
    }

    /// Replaces the ring with one under the geometry `make` derives from the
    /// old one, inheriting as the lock-free log does.
    fn replace_ring(&self, make: impl Fn(&Geometry) -> Geometry) {
        let mut ring = self.ring.lock();
        let geometry = make(&ring.geometry);
        let inheritance =
            ring.geometry
                .inherit(&*ring, ring.head, ring.dropped, geometry.capacity());
        *ring = Ring::new(geometry, inheritance);
    }

    /// The permits allowed per window.
    ///
    /// ```
    /// use tollgate::{LockingSlidingLog, Rate};
    /// assert_eq!(LockingSlidingLog::new(Rate::per_second(100)).unwrap().limit(), 100);
    /// ```
    pub fn limit(&self) -> u32 {
        self.ring.lock().geometry.capacity()
    }

    /// The window's length.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{LockingSlidingLog, Rate};
    /// let log = LockingSlidingLog::new(Rate::per_second(100)).unwrap();
    /// assert_eq!(log.window(), Duration::from_secs(1));
    /// ```
    pub fn window(&self) -> Duration {
        Duration::from_nanos(self.ring.lock().geometry.window())
    }

    /// The clock this limiter reads.
    ///
    /// ```
    /// use tollgate::{Clock, LockingSlidingLog, ManualClock, Rate};
    /// let clock = ManualClock::new();
    /// let log = LockingSlidingLog::with_clock(Rate::per_second(10), clock.clone()).unwrap();
    /// clock.set(7);
    /// assert_eq!(log.clock().now(), 7);
    /// ```
    pub fn clock(&self) -> &C {
        self.timeline.clock()
    }
}

impl<C: Clock> RateLimiter for LockingSlidingLog<C> {
    fn try_acquire_n(&self, n: u32) -> Result<(), Denied> {
        let mut ring = self.ring.lock();
        check_request(n, ring.geometry.capacity())?;
        // Read under the lock, like the lock-free log reads it after finding its
        // ring: one reading per request, checked against the state it decides on.
        let now = self.timeline.now();
        let head = ring.head;
        match ring.geometry.decide(&*ring, head, now, n) {
            Verdict::Admit { next, stamp } => {
                ring.stamp(next, n, stamp);
                Ok(())
            }
            Verdict::Deny { retry_ns, record } => {
                if let Some((next, stamp)) = record {
                    ring.stamp(next, n, stamp);
                }
                Err(retry_after(retry_ns))
            }
            // Entries under the lock never move.
            Verdict::Moved => Err(retry_after(ring.geometry.window())),
        }
    }

    fn snapshot(&self) -> Snapshot {
        let ring = self.ring.lock();
        let now = self.timeline.now();
        ring.geometry.snapshot(&*ring, ring.head, now)
    }
}
