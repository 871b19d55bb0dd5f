//! A discrete-event simulator of a service behind an adaptive concurrency
//! limit, in virtual time: no threads, no sleeping, a seeded xorshift, so a
//! run is the same on every machine and ten minutes of traffic take well
//! under a second.
//!
//! Clients offer Poisson arrivals at a fixed rate, more than the service can
//! take. tollgate's [`AdaptiveLimit`] admits a request while fewer than its
//! limit are in flight and the simulator sheds the rest; an admitted request
//! goes to the [`Link`], and when it finishes, its permit ends with the
//! outcome, timed on the limit's `ManualClock` set to the event's time: the
//! limiter the user runs, in virtual time.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use tollgate::{AdaptiveLimit, AdaptivePermit, Clock, LimitAlgorithm, ManualClock, Outcome};

pub const MS: u64 = 1_000_000;
pub const SECOND: u64 = 1_000_000_000;

/// xorshift64*: small, fast, seeded; enough for arrivals and jitter.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.max(1))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Exponentially distributed with this mean.
    pub fn exp(&mut self, mean: f64) -> f64 {
        -mean * (1.0 - self.unit()).ln()
    }
}

/// How the service behaves; `capacity` is the scenario's knee parameter
/// (servers, or requests in flight, or requests a second) and changes
/// between phases.
#[derive(Debug, Clone, Copy)]
pub enum Link {
    /// A FIFO queue in front of `capacity` servers, each taking the base
    /// latency per request: latency grows with the queue past the knee.
    Queue,
    /// As `Queue`, with service times uniform in [0.5, 1.5] × base and one
    /// in fifty five times longer.
    Jittery,
    /// Up to `capacity` in service, each taking the base latency; beyond,
    /// requests are refused at once (a drop after `REFUSAL`).
    Refusing,
    /// No queue; a request admitted with `n` in service takes base ×
    /// max(1, n / capacity)²: it slows down past `capacity` in flight.
    SlowsAt,
    /// No queue; a request takes base × max(1, r / capacity)^4, where `r`
    /// is the admitted request rate (per second, averaged over 100 ms).
    SlowsWithRate,
}

/// How long a refusal takes to come back.
pub const REFUSAL: u64 = MS;

/// A scenario: the link, its base latency, the offered load and the
/// capacity in each phase.
#[derive(Debug, Clone)]
pub struct Scenario {
    pub name: &'static str,
    pub link: Link,
    pub base_latency: u64,
    /// Offered arrivals per second.
    pub offered: f64,
    /// `(start_ns, capacity)`, the first at 0.
    pub phases: Vec<(u64, f64)>,
    /// The scenario's knee in requests in flight, per phase.
    pub knees: Vec<f64>,
    pub end: u64,
    pub seed: u64,
}

/// What a run recorded.
pub struct Run {
    /// The limit every 100 ms: `(time, limit)`.
    pub limits: Vec<(u64, u32)>,
    /// Round trips of the admitted requests that succeeded, with their
    /// completion times.
    pub latencies: Vec<(u64, u64)>,
    pub offered: u64,
    pub shed: u64,
    pub dropped: u64,
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// Rank first at equal times so a phase starts before that instant's
    /// requests.
    Phase(usize),
    Tick,
    Arrival,
    /// A request leaves the service (index into the request slab).
    Done(usize),
    /// A refused request's answer reaches the client.
    Refused(usize),
}

struct Request<'a> {
    start: u64,
    permit: Option<AdaptivePermit<'a, &'a dyn LimitAlgorithm, ManualClock>>,
}

struct Service {
    link: Link,
    base: f64,
    capacity: f64,
    busy: u32,
    queue: VecDeque<usize>,
    /// Admitted requests per ns, an exponential average over 100 ms.
    rate: f64,
    rate_at: u64,
}

const RATE_TAU: f64 = 100.0 * MS as f64;

impl Service {
    fn service_time(&self, rng: &mut Rng) -> u64 {
        match self.link {
            Link::Jittery => {
                let spike = if rng.unit() < 0.02 { 5.0 } else { 1.0 };
                (self.base * (0.5 + rng.unit()) * spike) as u64
            }
            _ => self.base as u64,
        }
    }
}

/// An adaptive limit as the simulators run it: on a manual clock.
pub type SimLimit<'a> = AdaptiveLimit<&'a dyn LimitAlgorithm, ManualClock>;

/// Where both simulators start: a manual clock at zero, `algorithm`'s limit
/// timed on it, and the random numbers of `seed`.
pub fn start(algorithm: &dyn LimitAlgorithm, seed: u64) -> (ManualClock, SimLimit<'_>, Rng) {
    let clock = ManualClock::new();
    let limit = AdaptiveLimit::with_clock(algorithm, clock.clone()).expect("a valid limit");
    (clock, limit, Rng::new(seed))
}

/// Runs `algorithm` through `scenario`.
pub fn run(scenario: &Scenario, algorithm: &dyn LimitAlgorithm) -> Run {
    let (clock, limit, mut rng) = start(algorithm, scenario.seed);
    let mut events: BinaryHeap<Reverse<(u64, Event)>> = BinaryHeap::new();
    let mut requests: Vec<Request> = Vec::new();
    let mut free: Vec<usize> = Vec::new();
    let mut service = Service {
        link: scenario.link,
        base: scenario.base_latency as f64,
        capacity: scenario.phases[0].1,
        busy: 0,
        queue: VecDeque::new(),
        rate: 0.0,
        rate_at: 0,
    };
    let mut out = Run {
        limits: Vec::new(),
        latencies: Vec::new(),
        offered: 0,
        shed: 0,
        dropped: 0,
    };
    let mean_gap = SECOND as f64 / scenario.offered;
    for (i, &(start, _)) in scenario.phases.iter().enumerate() {
        events.push(Reverse((start, Event::Phase(i))));
    }
    events.push(Reverse((0, Event::Tick)));
    events.push(Reverse((rng.exp(mean_gap) as u64, Event::Arrival)));

    while let Some(Reverse((now, event))) = events.pop() {
        if now >= scenario.end {
            break;
        }
        clock.set(now);
        match event {
            Event::Phase(i) => service.capacity = scenario.phases[i].1,
            Event::Tick => {
                // The gate's limit: the algorithm's, as the last release
                // applied it.
                out.limits.push((now, limit.limit()));
                events.push(Reverse((now + 100 * MS, Event::Tick)));
            }
            Event::Arrival => {
                events.push(Reverse((
                    now + rng.exp(mean_gap) as u64 + 1,
                    Event::Arrival,
                )));
                out.offered += 1;
                let Some(permit) = limit.try_acquire() else {
                    out.shed += 1;
                    continue;
                };
                let request = Request {
                    start: clock.now(),
                    permit: Some(permit),
                };
                let id = match free.pop() {
                    Some(id) => {
                        requests[id] = request;
                        id
                    }
                    None => {
                        requests.push(request);
                        requests.len() - 1
                    }
                };
                // The link's answer.
                let decay = (-((now - service.rate_at) as f64) / RATE_TAU).exp();
                service.rate = service.rate * decay + 1.0 / RATE_TAU;
                service.rate_at = now;
                match service.link {
                    Link::Queue | Link::Jittery => {
                        if f64::from(service.busy) < service.capacity {
                            service.busy += 1;
                            let t = service.service_time(&mut rng);
                            events.push(Reverse((now + t, Event::Done(id))));
                        } else {
                            service.queue.push_back(id);
                        }
                    }
                    Link::Refusing => {
                        if f64::from(service.busy) < service.capacity {
                            service.busy += 1;
                            events.push(Reverse((now + service.base as u64, Event::Done(id))));
                        } else {
                            events.push(Reverse((now + REFUSAL, Event::Refused(id))));
                        }
                    }
                    Link::SlowsAt => {
                        service.busy += 1;
                        let over = (f64::from(service.busy) / service.capacity).max(1.0);
                        let t = (service.base * over * over) as u64;
                        events.push(Reverse((now + t, Event::Done(id))));
                    }
                    Link::SlowsWithRate => {
                        service.busy += 1;
                        let per_second = service.rate * SECOND as f64;
                        let over = (per_second / service.capacity).max(1.0);
                        let t = (service.base * over.powi(4)) as u64;
                        events.push(Reverse((now + t, Event::Done(id))));
                    }
                }
            }
            Event::Done(id) => {
                service.busy -= 1;
                if matches!(service.link, Link::Queue | Link::Jittery) {
                    while f64::from(service.busy) < service.capacity {
                        let Some(next) = service.queue.pop_front() else {
                            break;
                        };
                        service.busy += 1;
                        let t = service.service_time(&mut rng);
                        events.push(Reverse((now + t, Event::Done(next))));
                    }
                }
                finish(&clock, &mut requests[id], Outcome::Success, &mut out);
                free.push(id);
            }
            Event::Refused(id) => {
                out.dropped += 1;
                finish(&clock, &mut requests[id], Outcome::Dropped, &mut out);
                free.push(id);
            }
        }
    }
    out
}

/// The permit's end: the round trip recorded for the report, the outcome to
/// the limiter (which times it on the same clock and feeds its algorithm).
fn finish(clock: &ManualClock, request: &mut Request<'_>, outcome: Outcome, out: &mut Run) {
    let rtt = clock.now() - request.start;
    if outcome == Outcome::Success {
        out.latencies.push((clock.now(), rtt));
    }
    let permit = request
        .permit
        .take()
        .expect("a request in flight holds its permit");
    permit.record(outcome);
}

/// The figures a scenario is judged by.
#[derive(Debug, Clone, Copy)]
pub struct Report {
    /// Fraction of 100 ms readings within ±25 % of the knee in the first
    /// phase, from the settling time to its end.
    pub in_band: f64,
    /// Least and most limit read over that span.
    pub range: (u32, u32),
    /// After the capacity halves: seconds until the limit enters the new
    /// band and stays there for 10 s (`None`: never within the phase).
    pub back_after_halving: Option<f64>,
    /// Fraction in band over the halved phase, from `rebound` after the
    /// halving to the recovery.
    pub in_band_halved: f64,
    /// Least and most limit read over that span.
    pub range_halved: (u32, u32),
    /// After the capacity recovers: as `back_after_halving`.
    pub back_after_recovery: Option<f64>,
    /// Fraction in band from `rebound` after the recovery to the end.
    pub in_band_recovered: f64,
    /// p99 round trip of admitted, answered requests after the settling
    /// time, over the base latency.
    pub p99_multiple: f64,
    /// Fraction of offered requests shed at the gate.
    pub shed: f64,
    /// Fraction of offered requests the service itself refused (the
    /// refusing link's fast refusals).
    pub refused: f64,
}

impl Scenario {
    fn band(&self, phase: usize) -> (f64, f64) {
        (self.knees[phase] * 0.75, self.knees[phase] * 1.25)
    }

    fn phase_span(&self, phase: usize) -> (u64, u64) {
        let start = self.phases[phase].0;
        let end = self.phases.get(phase + 1).map_or(self.end, |p| p.0);
        (start, end)
    }

    /// Judges `run` with the algorithm's stated settling time (from the
    /// start) and rebound time (from a capacity change).
    pub fn report(&self, run: &Run, settle: u64, rebound: u64) -> Report {
        let in_band_over = |phase: usize, from: u64| {
            let (lo, hi) = self.band(phase);
            let (_, end) = self.phase_span(phase);
            let span: Vec<u32> = run
                .limits
                .iter()
                .filter(|&&(t, _)| t >= from && t < end)
                .map(|&(_, l)| l)
                .collect();
            let inside = span
                .iter()
                .filter(|&&l| f64::from(l) >= lo && f64::from(l) <= hi)
                .count();
            let range = (
                span.iter().copied().min().unwrap_or(0),
                span.iter().copied().max().unwrap_or(0),
            );
            (inside as f64 / span.len().max(1) as f64, range)
        };
        let back = |phase: usize| -> Option<f64> {
            let (lo, hi) = self.band(phase);
            let (start, end) = self.phase_span(phase);
            let mut entered: Option<u64> = None;
            for &(t, l) in run.limits.iter().filter(|&&(t, _)| t >= start && t < end) {
                if f64::from(l) < lo || f64::from(l) > hi {
                    entered = None;
                } else if let Some(e) = entered {
                    if t - e >= 10 * SECOND {
                        return Some((e - start) as f64 / 1e9);
                    }
                } else {
                    entered = Some(t);
                }
            }
            None
        };
        let (in_band, range) = in_band_over(0, settle);
        let (
            back_after_halving,
            (in_band_halved, range_halved),
            back_after_recovery,
            in_band_recovered,
        ) = if self.phases.len() >= 3 {
            (
                back(1),
                in_band_over(1, self.phases[1].0 + rebound),
                back(2),
                in_band_over(2, self.phases[2].0 + rebound).0,
            )
        } else {
            (None, (f64::NAN, (0, 0)), None, f64::NAN)
        };
        let mut answered: Vec<u64> = run
            .latencies
            .iter()
            .filter(|&&(t, _)| t >= settle)
            .map(|&(_, rtt)| rtt)
            .collect();
        let p99 = if answered.is_empty() {
            0
        } else {
            let k = answered.len() * 99 / 100;
            *answered.select_nth_unstable(k).1
        };
        Report {
            in_band,
            range,
            back_after_halving,
            in_band_halved,
            range_halved,
            back_after_recovery,
            in_band_recovered,
            p99_multiple: p99 as f64 / self.base_latency as f64,
            shed: run.shed as f64 / run.offered.max(1) as f64,
            refused: run.dropped as f64 / run.offered.max(1) as f64,
        }
    }
}
