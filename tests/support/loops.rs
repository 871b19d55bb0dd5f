//! Clients in a loop against a simulated service, in virtual time: the
//! behaviours an adaptive limit is held to (`tests/integration/adaptive_sim.rs`).
//!
//! Each attempt holds its own permit of tollgate's [`AdaptiveLimit`] (on a
//! `ManualClock` set to each event's time) and is timed alone. A request
//! waits for a permit in one FIFO queue (the backlog). An attempt that the
//! service answers ends with `success()`; one it refuses with a retriable
//! error, or that gets no answer within the client's timeout (1 s), ends
//! with `dropped()` and its request is retried after a backoff spent
//! *outside* the permit (jittered, doubling from 50 ms up to 1.6 s), back in
//! the backlog. Closed loop: each client sends its next request as soon as
//! the last one succeeded. Open loop: requests arrive as a Poisson stream,
//! whatever the limit.
//!
//! "In flight" is the permits held: an attempt's service decides with the
//! count it was granted with (itself included), as the limiter sees it.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use tollgate::{AdaptivePermit, LimitAlgorithm, ManualClock};

use super::sim::{MS, Rng, SECOND, start};

/// The client's usual timeout per attempt.
pub const TIMEOUT: u64 = SECOND;

/// How the service answers an attempt granted with `n` in flight.
#[derive(Debug, Clone, Copy)]
pub enum Service {
    /// The base latency, whatever the load.
    Flat,
    /// base × (1 + jitter · Exp(1)), independent of load.
    Jitter(f64),
    /// base × factor^(n − knee) above the knee, the base below it.
    Knee { knee: u32, factor: f64 },
    /// base × n: the service does one thing at a time (fixed throughput).
    Proportional,
    /// Above `n` in flight, a retriable error after `after` ns.
    ErrorsAbove { n: u32, after: u64 },
    /// Above `n` in flight, no answer at all: the client's timeout ends it.
    SilentAbove { n: u32 },
    /// Attempts beyond a token bucket of `per_second` (burst `burst`) get a
    /// retriable error after `after` ns; the others the base latency.
    RateCap {
        per_second: f64,
        burst: f64,
        after: u64,
    },
}

/// Who sends requests.
#[derive(Debug, Clone, Copy)]
pub enum Load {
    /// `clients`, each sending its next request when the last succeeded.
    Closed(u32),
    /// Poisson arrivals, per second.
    Open(f64),
    /// Arrivals at a steady pace, per second.
    Paced(f64),
}

/// One run: a service, its base latency, the load and how long.
#[derive(Debug, Clone, Copy)]
pub struct Setup {
    pub service: Service,
    pub base: u64,
    pub load: Load,
    pub duration: u64,
    pub seed: u64,
    /// The client's timeout per attempt.
    pub timeout: u64,
}

/// What a run measured.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Time-weighted mean of the permits held, from `from` to the end.
    pub mean_in_flight: f64,
    /// The most permits held at once, over the whole run.
    pub max_in_flight: u32,
    /// The first time (ns) 10 permits were held at once.
    pub ten_in_flight_at: Option<u64>,
    /// Successes per second from `from` to the end.
    pub throughput: f64,
    pub attempts: u64,
    pub successes: u64,
    /// Attempts refused with a retriable error.
    pub errors: u64,
    /// Attempts that got no answer within the timeout.
    pub timeouts: u64,
    /// The most attempts started in any one-second window (whole seconds
    /// of the run).
    pub peak_attempt_rate: u64,
    /// The longest the backlog of requests waiting for a permit got.
    pub max_backlog: usize,
    /// Requests still waiting at the end.
    pub final_backlog: usize,
    /// Mean round trip of successes, ns.
    pub mean_rtt: f64,
    /// The limit every 100 ms: `(time, limit, in flight)`.
    pub limits: Vec<(u64, u32, u32)>,
    /// The limit when the run ended.
    pub final_limit: u32,
    /// Whether the limit ever exceeded twice the most in flight seen
    /// before (plus one): an app-limited client inflating its limit.
    pub inflated: bool,
}

impl Report {
    /// Errors and timeouts over attempts.
    pub fn failed_share(&self) -> f64 {
        (self.errors + self.timeouts) as f64 / self.attempts.max(1) as f64
    }

    /// The limit read at `at` ns (the last reading at or before it).
    pub fn limit_at(&self, at: u64) -> u32 {
        self.limits
            .iter()
            .take_while(|&&(t, _, _)| t <= at)
            .last()
            .map_or(0, |&(_, l, _)| l)
    }
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Event {
    Tick,
    /// An open-loop request arrives.
    Arrival,
    /// A request (new or retried) joins the backlog.
    Ready(usize),
    /// The service answers attempt `id` (success or error).
    Answer(usize),
    /// The client's timeout for attempt `id`.
    Timeout(usize),
}

struct Attempt<'a> {
    request: usize,
    start: u64,
    /// `Some(true)`: a success is coming; `Some(false)`: an error; `None`:
    /// no answer.
    answer: Option<bool>,
    permit: Option<AdaptivePermit<'a, &'a dyn LimitAlgorithm, ManualClock>>,
}

/// Runs `algorithm` through `setup`, measuring from `from` ns.
pub fn run(setup: &Setup, algorithm: &dyn LimitAlgorithm, from: u64) -> Report {
    let (clock, limit, mut rng) = start(algorithm, setup.seed);
    let mut events: BinaryHeap<Reverse<(u64, Event)>> = BinaryHeap::new();
    let mut attempts: Vec<Attempt> = Vec::new();
    // Per request: how many times it was tried.
    let mut tries: Vec<u32> = Vec::new();
    let mut backlog: VecDeque<usize> = VecDeque::new();
    let mut out = Report::default();
    let mut tokens = match setup.service {
        Service::RateCap { burst, .. } => burst,
        _ => 0.0,
    };
    let mut tokens_at = 0u64;
    let mut per_second: Vec<u64> = vec![0; (setup.duration / SECOND + 1) as usize];
    let (mut area, mut last_change, mut held) = (0.0f64, 0u64, 0u32);
    let mut successes_after = 0u64;
    let mut rtt_sum = 0.0f64;
    let mut most_seen = 1u32;

    match setup.load {
        Load::Closed(clients) => {
            for _ in 0..clients {
                tries.push(0);
                events.push(Reverse((0, Event::Ready(tries.len() - 1))));
            }
        }
        Load::Open(rate) => {
            events.push(Reverse((
                rng.exp(SECOND as f64 / rate) as u64,
                Event::Arrival,
            )));
        }
        Load::Paced(rate) => {
            events.push(Reverse(((SECOND as f64 / rate) as u64, Event::Arrival)));
        }
    }
    events.push(Reverse((0, Event::Tick)));

    while let Some(Reverse((now, event))) = events.pop() {
        if now >= setup.duration {
            break;
        }
        clock.set(now);
        // The permits held changed only at events: integrate up to now.
        if now > from {
            area += f64::from(held) * (now - last_change.max(from)) as f64;
        }
        last_change = now;
        match event {
            Event::Tick => {
                if std::env::var_os("LOOP_TRACE").is_some() {
                    eprintln!(
                        "{:.1} s limit {} in flight {} backlog {}",
                        now as f64 / 1e9,
                        limit.limit(),
                        limit.in_flight(),
                        backlog.len()
                    );
                }
                out.limits.push((now, limit.limit(), limit.in_flight()));
                events.push(Reverse((now + 100 * MS, Event::Tick)));
            }
            Event::Arrival => {
                match setup.load {
                    Load::Open(rate) => events.push(Reverse((
                        now + rng.exp(SECOND as f64 / rate) as u64 + 1,
                        Event::Arrival,
                    ))),
                    Load::Paced(rate) => events.push(Reverse((
                        now + (SECOND as f64 / rate) as u64,
                        Event::Arrival,
                    ))),
                    Load::Closed(_) => {}
                }
                tries.push(0);
                backlog.push_back(tries.len() - 1);
            }
            Event::Ready(request) => backlog.push_back(request),
            Event::Answer(id) => {
                let attempt = &mut attempts[id];
                if let Some(permit) = attempt.permit.take() {
                    if attempt.answer == Some(true) {
                        permit.success();
                        out.successes += 1;
                        rtt_sum += (now - attempt.start) as f64;
                        if now >= from {
                            successes_after += 1;
                        }
                        if let Load::Closed(_) = setup.load {
                            let request = attempt.request;
                            tries[request] = 0;
                            events.push(Reverse((now, Event::Ready(request))));
                        }
                    } else {
                        permit.dropped();
                        out.errors += 1;
                        retry(&mut rng, &mut events, &mut tries, attempt.request, now);
                    }
                }
            }
            Event::Timeout(id) => {
                let attempt = &mut attempts[id];
                if let Some(permit) = attempt.permit.take() {
                    permit.dropped();
                    out.timeouts += 1;
                    retry(&mut rng, &mut events, &mut tries, attempt.request, now);
                }
            }
        }
        // Whatever freed a permit or moved the limit: start what can start.
        while let Some(&request) = backlog.front() {
            let Some(permit) = limit.try_acquire() else {
                break;
            };
            backlog.pop_front();
            let n = permit.granted_in_flight();
            out.attempts += 1;
            per_second[(now / SECOND) as usize] += 1;
            tries[request] += 1;
            let base = setup.base as f64;
            let (answer, after) = match setup.service {
                Service::Flat => (Some(true), base),
                Service::Jitter(j) => (Some(true), base * (1.0 + j * rng.exp(1.0))),
                Service::Knee { knee, factor } => (
                    Some(true),
                    base * factor.powi(n.saturating_sub(knee) as i32),
                ),
                Service::Proportional => (Some(true), base * f64::from(n)),
                Service::ErrorsAbove { n: above, after } => {
                    if n > above {
                        (Some(false), after as f64)
                    } else {
                        (Some(true), base)
                    }
                }
                Service::SilentAbove { n: above } => {
                    if n > above {
                        (None, 0.0)
                    } else {
                        (Some(true), base)
                    }
                }
                Service::RateCap {
                    per_second,
                    burst,
                    after,
                } => {
                    tokens =
                        (tokens + (now - tokens_at) as f64 * per_second / SECOND as f64).min(burst);
                    tokens_at = now;
                    if tokens >= 1.0 {
                        tokens -= 1.0;
                        (Some(true), base)
                    } else {
                        (Some(false), after as f64)
                    }
                }
            };
            let id = attempts.len();
            attempts.push(Attempt {
                request,
                start: now,
                answer,
                permit: Some(permit),
            });
            let after = after as u64;
            if answer.is_some() && after < setup.timeout {
                events.push(Reverse((now + after.max(1), Event::Answer(id))));
            } else {
                events.push(Reverse((now + setup.timeout, Event::Timeout(id))));
            }
        }
        held = limit.in_flight();
        out.max_in_flight = out.max_in_flight.max(held);
        if held >= 10 && out.ten_in_flight_at.is_none() {
            out.ten_in_flight_at = Some(now);
        }
        if limit.limit() > 2 * most_seen + 1 {
            out.inflated = true;
        }
        most_seen = most_seen.max(held);
        out.max_backlog = out.max_backlog.max(backlog.len());
    }
    area += f64::from(held) * setup.duration.saturating_sub(last_change.max(from)) as f64;
    let span = setup.duration.saturating_sub(from).max(1) as f64;
    out.mean_in_flight = area / span;
    out.throughput = successes_after as f64 / (span / SECOND as f64);
    out.final_backlog = backlog.len();
    out.final_limit = limit.limit();
    out.peak_attempt_rate = per_second.iter().copied().max().unwrap_or(0);
    out.mean_rtt = rtt_sum / out.successes.max(1) as f64;
    out
}

/// Schedules `request` again after a jittered, doubling backoff.
fn retry(
    rng: &mut Rng,
    events: &mut BinaryHeap<Reverse<(u64, Event)>>,
    tries: &mut [u32],
    request: usize,
    now: u64,
) {
    let doubling = (50 * MS) << tries[request].clamp(1, 6).saturating_sub(1);
    let wait = (doubling as f64 * (0.5 + rng.unit())) as u64;
    events.push(Reverse((now + wait, Event::Ready(request))));
}
