//! Three OS processes share one global limit through leases; then Redis is
//! killed (SIGKILL) and restarted, and each process goes to its local share
//! and back.
//!
//! ```sh
//! cargo test -p tollgate-redis --release --test leased_processes
//! ```
//!
//! A test with its own `main` (`harness = false`), run by `cargo test` with
//! the others. Needs `redis-server` on `PATH` (`scripts/install-redis`
//! installs it). The test starts its own on a free loopback port, with an append-only file
//! fsynced on every write (`appendfsync always`), so the restarted server
//! remembers every lease it acknowledged and one global invariant spans both
//! of its lives. It then starts three copies of itself (`worker` argument);
//! each makes decisions on one thread, as fast as it can, from a
//! [`LeasedLimiter`] on the global token bucket (burst 2,000, 20,000/s), with
//! [`Policy::Local`] holding a third of it (burst 666, 6,666/s) for when
//! Redis is unreachable. The phases:
//!
//! 1. **Redis up** for 1 s: leases.
//! 2. **Redis killed** (SIGKILL): each process spends what its pool holds,
//!    its breaker opens and it decides by its local share; the phase lasts
//!    until every process has reported `Degraded`, plus 0.5 s.
//! 3. **Redis restarted** on the same port: each process probes, leases
//!    again and reports `Leased`; the phase lasts until every one has, plus
//!    1 s; then the processes stop and hand unused permits back.
//!
//! Each process reports its counts per phase and every lease (server time,
//! permits granted, permits returned). The parent prints admitted/denied per
//! process per phase and checks what does not depend on the scheduler, exiting
//! non-zero if any check fails: every phase happened (the mode changes were
//! reported), no lease is dated while Redis was down, each process spent at
//! most its net debits, the merged debits of all processes keep the GCRA
//! invariant (at most `burst + (b − a)/interval` in every `[a, b]`), and each
//! process's local admissions stayed within its share.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tollgate::{Clock, MonotonicClock, Rate};
use tollgate_redis::{Client, LeaseOptions, LeasedLimiter, Mode, Options, Policy, TokenBucket};

type Result<T, E = Box<dyn std::error::Error>> = std::result::Result<T, E>;

const PROCESSES: usize = 3;
const KEY: &str = "example:leased";
/// The global budget: bursts of 2,000, 20,000 per second (50 µs a permit).
const BURST: u32 = 2_000;
const RATE: u32 = 20_000;
const INTERVAL_US: u64 = 1_000_000 / RATE as u64;
/// Each process's share while Redis is unreachable: a third.
const LOCAL_BURST: u32 = BURST / 3;
const LOCAL_RATE: u32 = RATE / 3;
const PHASES: [&str; 3] = [
    "Redis up",
    "Redis killed (SIGKILL): local share",
    "Redis restarted: leases again",
];

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    match args.next().as_deref() {
        Some("worker") => worker(&args.next().ok_or("worker needs the Redis URL")?),
        _ => parent(),
    }
}

fn global() -> TokenBucket {
    TokenBucket::new("bucket", BURST, Rate::per_second(RATE)).expect("a valid bucket")
}

// ---------------------------------------------------------------------------
// The worker: one leased limiter, one deciding thread, phases from stdin.

/// One phase's counts in one process.
#[derive(Default, Clone, Copy)]
struct Counts {
    decisions: u64,
    admitted: u64,
    /// Of the admitted, spent from leases (the rest: the local share).
    leased: u64,
    denied: u64,
    /// `Error::Unavailable` or another error (none with `Policy::Local`).
    failed: u64,
    nanos: u64,
}

/// Decides until stdin closes; every line on stdin starts the next phase.
/// Prints mode changes as they happen (`mode Leased|Degraded`), then
/// `phase`, `lease` and `stats` lines.
fn worker(url: &str) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let options = Options::new()
        .timeout(Duration::from_millis(100))
        .connect_timeout(Duration::from_millis(100));
    let client = runtime.block_on(Client::connect_with(url, options))?;
    // The local share's own clock (the default one), so its bound is
    // checked on the timeline it decides on.
    let clock = MonotonicClock::new();
    let started = clock.now();
    let local = tollgate::TokenBucket::new(LOCAL_BURST, Rate::per_second(LOCAL_RATE))?;
    let lease_options = LeaseOptions::new()
        .max_lease(500)
        .lifetime(Duration::from_secs(1))
        .breaker(2, Duration::from_millis(100))
        .policy(Policy::Local(Box::new(local)))
        .record_leases(true)
        .on_mode(|mode| println!("mode {mode:?}"));
    let mut limiter = {
        let _inside = runtime.enter();
        LeasedLimiter::start(client, global(), KEY, lease_options)
    };

    let phase = Arc::new(AtomicUsize::new(0));
    {
        let phase = phase.clone();
        std::thread::spawn(move || {
            for line in std::io::stdin().lock().lines() {
                if line.is_err() {
                    break;
                }
                // Relaxed: a flag the deciding thread polls; nothing else
                // is published through it.
                phase.fetch_add(1, Ordering::Relaxed);
            }
            phase.store(usize::MAX, Ordering::Relaxed);
        });
    }

    let mut phases = Vec::new();
    let mut current = Counts::default();
    let mut since = Instant::now();
    let mut spent_before = 0;
    loop {
        let now_in = phase.load(Ordering::Relaxed).min(PHASES.len());
        while phases.len() < now_in {
            let spent = limiter.stats().spent;
            current.leased = spent - spent_before;
            current.nanos = since.elapsed().as_nanos() as u64;
            phases.push(current);
            (current, since, spent_before) = (Counts::default(), Instant::now(), spent);
        }
        if phases.len() == PHASES.len() {
            break;
        }
        current.decisions += 1;
        match limiter.try_acquire() {
            Ok(()) => current.admitted += 1,
            Err(e) if e.is_denied() => current.denied += 1,
            Err(_) => current.failed += 1,
        }
    }
    let lived = clock.now().saturating_sub(started);
    let stats = runtime.block_on(limiter.shutdown());
    let mut out = std::io::stdout().lock();
    for c in &phases {
        writeln!(
            out,
            "phase {} {} {} {} {} {}",
            c.decisions, c.admitted, c.leased, c.denied, c.failed, c.nanos
        )?;
    }
    for l in limiter.leases() {
        writeln!(out, "lease {} {} {}", l.time_us, l.granted, l.returned)?;
    }
    writeln!(
        out,
        "stats {} {} {} {}",
        stats.redis_calls, stats.forfeited, stats.spent, lived
    )?;
    out.flush()?;
    Ok(())
}

// ---------------------------------------------------------------------------
// The parent: a redis-server, three workers, the phases, the checks.

/// A `redis-server` on a loopback port, killed on drop.
struct Server {
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

impl Server {
    fn start() -> Result<Server> {
        let dir = std::env::temp_dir().join(format!("tollgate-leased-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        for _ in 0..5 {
            // A port that was free a moment ago; another process may take it
            // before redis-server binds it, hence the retries.
            let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
            let mut server = Server {
                port,
                dir: dir.clone(),
                child: None,
            };
            if server.launch()? {
                return Ok(server);
            }
        }
        Err("could not start redis-server on a free port".into())
    }

    /// Starts redis-server on this port and waits (up to 10 s) for `PING`.
    fn launch(&mut self) -> Result<bool> {
        let mut child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args([
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
            ])
            .arg("--dir")
            .arg(&self.dir)
            .args(["--logfile", "redis.log"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot run redis-server ({e}): scripts/install-redis"))?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if child.try_wait()?.is_some() {
                return Ok(false);
            }
            if self.ping() {
                self.child = Some(child);
                return Ok(true);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
        Ok(false)
    }

    fn ping(&self) -> bool {
        TcpStream::connect(("127.0.0.1", self.port)).is_ok()
            && redis::Client::open(self.url())
                .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(200)))
                .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
                .is_ok()
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// SIGKILL, as a crash.
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The same port and directory: the append-only file is replayed.
    fn restart(&mut self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.launch()? {
            if Instant::now() > deadline {
                return Err("redis-server did not restart".into());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Wall-clock µs since the Unix epoch: the clock Redis's `TIME` reads on
/// this machine, so phase boundaries and lease times compare.
fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// What the parent knows of one worker.
#[derive(Default)]
struct Worker {
    mode: Option<Mode>,
    /// When it reported `Degraded` after the kill / `Leased` after the
    /// restart (time since that event).
    degraded_after: Option<Duration>,
    leased_after: Option<Duration>,
    /// `Degraded` reports before the kill (timeouts under load).
    early_degraded: u32,
    phases: Vec<Counts>,
    /// (server time µs, net permits debited)
    leases: Vec<(u64, u64)>,
    granted: u64,
    returned: u64,
    stats: Option<[u64; 4]>,
    exited: bool,
}

struct Run {
    workers: Vec<Worker>,
    lines: Receiver<(usize, Option<String>)>,
    /// Which phase is on (index in PHASES) and when it began.
    phase: usize,
    phase_began: Instant,
}

impl Run {
    /// Reads worker lines until `deadline` or until `until` holds.
    fn pump(&mut self, deadline: Instant, until: impl Fn(&Run) -> bool) -> Result<bool> {
        while !until(self) {
            let wait = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(wait) {
                Ok((i, line)) => self.line(i, line)?,
                Err(RecvTimeoutError::Timeout) => return Ok(false),
                Err(RecvTimeoutError::Disconnected) => return Ok(until(self)),
            }
        }
        Ok(true)
    }

    fn line(&mut self, i: usize, line: Option<String>) -> Result<()> {
        let since = self.phase_began.elapsed();
        let (phase, w) = (self.phase, &mut self.workers[i]);
        let Some(line) = line else {
            w.exited = true;
            return Ok(());
        };
        let mut fields = line.split(' ');
        let kind = fields.next().unwrap_or("");
        let numbers: Vec<u64> = fields.filter_map(|f| f.parse().ok()).collect();
        match (kind, numbers.as_slice(), line.as_str()) {
            (_, _, "mode Degraded") => {
                w.mode = Some(Mode::Degraded);
                if phase == 0 {
                    w.early_degraded += 1;
                } else if phase == 1 && w.degraded_after.is_none() {
                    w.degraded_after = Some(since);
                }
            }
            (_, _, "mode Leased") => {
                w.mode = Some(Mode::Leased);
                if phase == 2 && w.leased_after.is_none() {
                    w.leased_after = Some(since);
                }
            }
            ("phase", &[decisions, admitted, leased, denied, failed, nanos], _) => {
                w.phases.push(Counts {
                    decisions,
                    admitted,
                    leased,
                    denied,
                    failed,
                    nanos,
                })
            }
            ("lease", &[time, granted, returned], _) => {
                w.leases.push((time, granted - returned));
                w.granted += granted;
                w.returned += returned;
            }
            ("stats", &[calls, forfeited, spent, lived], _) => {
                w.stats = Some([calls, forfeited, spent, lived])
            }
            _ => return Err(format!("process {i}: unexpected line {line:?}").into()),
        }
        Ok(())
    }

    fn next_phase(&mut self, stdins: &mut [ChildStdin]) -> Result<()> {
        self.phase += 1;
        self.phase_began = Instant::now();
        for stdin in stdins {
            writeln!(stdin, "next")?;
            stdin.flush()?;
        }
        Ok(())
    }
}

/// GCRA over `(time, permits)` records sorted by time: in any `[a, b]`, at
/// most `burst + (b − a)/interval`. Returns the number of records that end
/// an interval holding more.
fn gcra_violations(records: &[(u64, u64)], burst: u64, interval: u64) -> usize {
    let mut violations = 0;
    let mut before = 0u64;
    let mut lowest: Option<i128> = None;
    for &(time, n) in records {
        let b = i128::from(before) * i128::from(interval) - i128::from(time);
        let low = lowest.map_or(b, |l: i128| l.min(b));
        lowest = Some(low);
        before += n;
        let a = i128::from(before) * i128::from(interval) - i128::from(time);
        if a - low > i128::from(burst) * i128::from(interval) {
            violations += 1;
        }
    }
    violations
}

/// 1234567 → "1,234,567".
fn sep(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn parent() -> Result<()> {
    let mut server = Server::start()?;
    println!(
        "{PROCESSES} processes share one global token bucket (burst {}, {}/s) through leases,\n\
         on redis-server 127.0.0.1:{} (append-only file, fsync on every write);\n\
         while Redis is unreachable each decides by its local share (burst {LOCAL_BURST}, {}/s)",
        sep(BURST.into()),
        sep(RATE.into()),
        server.port,
        sep(LOCAL_RATE.into()),
    );
    let exe = std::env::current_exe()?;
    let (tx, lines) = channel();
    let mut children = Vec::new();
    let mut stdins = Vec::new();
    let mut bounds = [(now_us(), 0u64); 3];
    for i in 0..PROCESSES {
        let mut child = Command::new(&exe)
            .args(["worker", &server.url()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        stdins.push(child.stdin.take().ok_or("no stdin")?);
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send((i, Some(line))).is_err() {
                    return;
                }
            }
            let _ = tx.send((i, None));
        });
        children.push(child);
    }
    drop(tx);
    let mut run = Run {
        workers: (0..PROCESSES).map(|_| Worker::default()).collect(),
        lines,
        phase: 0,
        phase_began: Instant::now(),
    };
    let all = |f: fn(&Worker) -> bool| move |run: &Run| run.workers.iter().all(f);
    let never = |_: &Run| false;

    // Phase 1: Redis up.
    run.pump(Instant::now() + Duration::from_secs(1), never)?;

    // Phase 2: SIGKILL; wait for every process to report Degraded.
    server.kill();
    // After the kill returned: every lease is dated before this.
    bounds[0].1 = now_us();
    bounds[1].0 = bounds[0].1;
    run.next_phase(&mut stdins)?;
    for w in &mut run.workers {
        if w.mode == Some(Mode::Degraded) {
            w.degraded_after = Some(Duration::ZERO);
        }
    }
    let degraded = all(|w| w.degraded_after.is_some());
    if !run.pump(Instant::now() + Duration::from_secs(10), degraded)? {
        return Err("a process did not degrade within 10 s of the kill".into());
    }
    run.pump(Instant::now() + Duration::from_millis(500), never)?;

    // Phase 3: restart on the same port; wait for every process to lease.
    // Before the restart began: every later lease is dated after this.
    bounds[1].1 = now_us();
    bounds[2].0 = bounds[1].1;
    server.restart()?;
    run.next_phase(&mut stdins)?;
    let leased = all(|w| w.leased_after.is_some());
    if !run.pump(Instant::now() + Duration::from_secs(10), leased)? {
        return Err("a process did not lease again within 10 s of the restart".into());
    }
    run.pump(Instant::now() + Duration::from_secs(1), never)?;

    // Stop: closing stdin ends the last phase; the workers hand back what
    // they hold and report.
    drop(stdins);
    let exited = all(|w| w.exited);
    if !run.pump(Instant::now() + Duration::from_secs(20), exited)? {
        return Err("a process did not finish within 20 s".into());
    }
    for (i, mut child) in children.into_iter().enumerate() {
        if !child.wait()?.success() {
            return Err(format!("process {i} failed").into());
        }
    }
    bounds[2].1 = now_us();
    drop(server);

    report(&run.workers, &bounds)
}

/// Prints the phases and checks the invariants.
fn report(workers: &[Worker], bounds: &[(u64, u64); 3]) -> Result<()> {
    let mut failures: Vec<String> = Vec::new();
    for (i, w) in workers.iter().enumerate() {
        if w.phases.len() != PHASES.len() || w.stats.is_none() {
            return Err(format!("process {i} reported {} phases", w.phases.len()).into());
        }
    }
    let mut debits: Vec<(u64, u64)> = workers.iter().flat_map(|w| w.leases.clone()).collect();
    debits.sort_unstable();

    for (p, name) in PHASES.iter().enumerate() {
        let (from, to) = bounds[p];
        println!(
            "\nphase {}: {name} ({:.2} s)",
            p + 1,
            (to - from) as f64 / 1e6
        );
        println!("  process   admitted (leases   local)       denied   decisions/s  note");
        let mut total = Counts::default();
        for (i, w) in workers.iter().enumerate() {
            let c = w.phases[p];
            let note = match p {
                0 if w.early_degraded > 0 => {
                    format!("degraded {}× under load (timeouts)", w.early_degraded)
                }
                1 => format!(
                    "Degraded {} ms after the kill",
                    w.degraded_after.unwrap_or_default().as_millis()
                ),
                2 => format!(
                    "Leased {} ms after the restart",
                    w.leased_after.unwrap_or_default().as_millis()
                ),
                _ => String::new(),
            };
            println!(
                "  {i:<8}{:>10} ({:>7} {:>7}) {:>12} {:>12}  {note}",
                sep(c.admitted),
                sep(c.leased),
                sep(c.admitted - c.leased),
                sep(c.denied),
                sep((c.decisions as f64 * 1e9 / c.nanos.max(1) as f64) as u64),
            );
            if c.failed > 0 {
                failures.push(format!("process {i}: {} failed decisions", c.failed));
            }
            total.admitted += c.admitted;
            total.leased += c.leased;
            total.denied += c.denied;
            total.decisions += c.decisions;
        }
        let leases_in_phase: Vec<u64> = debits
            .iter()
            .filter(|&&(t, _)| {
                // Redis was down strictly between the kill and the restart.
                if p == 1 {
                    from < t && t < to
                } else {
                    from <= t && t <= to
                }
            })
            .map(|&(_, n)| n)
            .collect();
        let in_phase: u64 = leases_in_phase.iter().sum();
        let limit = u64::from(BURST) + (to - from) / INTERVAL_US;
        println!(
            "  all     {:>10} ({:>7} {:>7}) {:>12}",
            sep(total.admitted),
            sep(total.leased),
            sep(total.admitted - total.leased),
            sep(total.denied),
        );
        if p == 1 {
            println!(
                "  Redis down: {} permits leased (none can be); local admissions are the \
                 processes' shares, not charged to Redis",
                sep(in_phase)
            );
            if in_phase > 0 {
                failures.push(format!("{in_phase} permits leased while Redis was down"));
            }
        } else {
            println!(
                "  leased by Redis in the phase (net, by server time): {} in {} leases <= limit {} \
                 (= {} + {}/s x {:.2} s)",
                sep(in_phase),
                sep(leases_in_phase.len() as u64),
                sep(limit),
                sep(BURST.into()),
                sep(RATE.into()),
                (to - from) as f64 / 1e6,
            );
            if in_phase > limit {
                failures.push(format!("phase {}: {in_phase} leased > {limit}", p + 1));
            }
        }
    }

    // The global invariant, over both lives of the server.
    let violations = gcra_violations(&debits, BURST.into(), INTERVAL_US);
    let (mut spent, mut net, mut calls, mut forfeited, mut decisions, mut local) =
        (0, 0, 0, 0, 0, 0);
    for (i, w) in workers.iter().enumerate() {
        let [w_calls, w_forfeited, w_spent, lived] = w.stats.unwrap_or_default();
        let w_net = w.granted - w.returned;
        if w_spent > w_net {
            failures.push(format!("process {i} spent {w_spent} of {w_net} net debits"));
        }
        let w_local: u64 = w.phases.iter().map(|c| c.admitted - c.leased).sum();
        let share =
            u64::from(LOCAL_BURST) + (lived * u64::from(LOCAL_RATE)).div_ceil(1_000_000_000) + 1;
        if w_local > share {
            failures.push(format!(
                "process {i}: {w_local} local admissions > share {share}"
            ));
        }
        spent += w_spent;
        net += w_net;
        calls += w_calls;
        forfeited += w_forfeited;
        local += w_local;
        decisions += w.phases.iter().map(|c| c.decisions).sum::<u64>();
    }
    println!(
        "\nglobal (Redis reachable): {} leases, {} permits debited net, {} admitted from \
         leases; GCRA over every debit: {violations} violations",
        sep(debits.len() as u64),
        sep(net),
        sep(spent),
    );
    println!(
        "under-admission: {} debited never spent ({} forfeited at expiry or shutdown); \
         local admissions {} (each process within its share)",
        sep(net - spent),
        sep(forfeited),
        sep(local),
    );
    println!(
        "{} Redis calls for {} decisions ({:.3} per 1,000)",
        sep(calls),
        sep(decisions),
        calls as f64 * 1000.0 / decisions.max(1) as f64
    );
    if violations > 0 {
        failures.push(format!("{violations} GCRA violations"));
    }
    if failures.is_empty() {
        println!("ok: every phase happened and the global limit held");
        Ok(())
    } else {
        Err(format!("invariant broken: {}", failures.join("; ")).into())
    }
}
