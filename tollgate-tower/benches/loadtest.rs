//! Loopback load test: requests/s, latency and server CPU per request of one
//! axum service (`GET /` → `"ok"`) with no limiter, behind tollgate-tower,
//! and behind `tower_governor`, in **paired, interleaved rounds**.
//!
//! ```text
//! cargo bench -p tollgate-tower --bench loadtest -- --rounds 30 --seconds 1
//! ```
//!
//! Each variant is a server process of its own (this program with
//! `--serve`, a single-threaded tokio runtime), started afresh every round
//! (a process keeps where the kernel put its code and data for its life,
//! which moved one variant's requests/s by a point or two for a whole run),
//! pinned with `taskset` to one
//! core (`--server-cpu`, default 0); the load generator is this process,
//! pinned to another (`--client-cpu`, default 1), so the two do not take
//! turns on one core and the server is the bottleneck (the table shows its
//! CPU use). The load is `--connections` keep-alive HTTP/1.1 connections
//! from four client addresses (127.0.0.1–4, so per-IP limiters see four
//! keys), each sending its next request as soon as the last answer is read,
//! by a minimal client (a fixed request, the answer read to its
//! `content-length`) that costs less than the server it drives.
//!
//! `--variants a,b,...` chooses what runs (default
//! `none,tollgate-tower,tower_governor`; the first is the baseline of every
//! ratio). `--breakdown` runs tollgate-tower beside the parts of its cost, on
//! the allow limits: `tollgate-no-policy` (the key and the plumbing: `PeerIp`,
//! no policy, no fields), `tollgate-unreported` (plus the keyed decision,
//! reported without state, so no fields) and `tollgate-constant` (the key,
//! the plumbing and both fields, from a constant state: no limiter). See
//! `load_service::breakdown_layer`.
//!
//! A round runs every variant once for `--seconds` after a short warm-up,
//! in one of the rotations of the variants' order or of its reverse (cycled:
//! for three variants, all six orders), and yields the ratio of
//! each layer's requests/s to the bare service's **in the same round**: load
//! from elsewhere on the machine drifts slowly against a round of a few
//! seconds, so it mostly cancels in the ratio, where it did not between the
//! medians of separate runs. The table gives the median ratio over the
//! rounds with its interquartile range and extremes, and the server's CPU
//! time per request (from `/proc/<pid>/schedstat`, which does not count
//! time the server waited for a core).
//!
//! Two limit settings (`--limits allow|deny|both`, default both): **allow**
//! (10 M/s, burst 10^6 per key: every request admitted — the cost of deciding
//! and writing the quota fields) and **deny** (one permit per key per hour:
//! nearly every request answered 429 by the layer). Both layers write quota
//! headers (`tower_governor` with `use_headers()`).
//!
//! `--placement outer|router` (default `outer`): both layers in front of the
//! whole router, or inside it with axum's `Router::layer`; every variant of
//! a run uses the same one (the bare service is the router either way).
//! `--serve` takes it too (`scripts/tower-instructions` passes it through);
//! `--drive`, the client, is the same for every placement.

use std::io::{BufRead, BufReader, Write as _};
use std::net::{IpAddr, SocketAddr};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use std::convert::Infallible;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket};
use tower::{Layer, Service};

mod load_service;
use load_service::{breakdown_layer, governor_layer, router, tollgate_layer};

/// The variants of a run when `--variants` is not given: the bare service
/// (the baseline every ratio is taken against: the first variant listed),
/// and the two layers.
const DEFAULT_VARIANTS: &str = "none,tollgate-tower,tower_governor";

/// `--breakdown`: tollgate-tower and the parts of its cost
/// (`load_service::breakdown_layer`), on the allow limits.
const BREAKDOWN_VARIANTS: &str =
    "none,tollgate-tower,tollgate-no-policy,tollgate-unreported,tollgate-constant";

/// Orders of `n` variants for successive rounds: the `n` rotations of
/// `0..n` and of its reverse. Cycling through them puts each variant in each
/// position equally often (for three variants they are all six orders), so
/// a trend within a round (a build starting elsewhere) favours none of them.
fn orders(n: usize) -> Vec<Vec<usize>> {
    let forward: Vec<usize> = (0..n).collect();
    let backward: Vec<usize> = (0..n).rev().collect();
    [forward, backward]
        .iter()
        .flat_map(|base| (0..n).map(move |shift| (0..n).map(|i| base[(i + shift) % n]).collect()))
        .collect()
}

/// Where the layer sits (`--placement`): `outer`, in front of the whole
/// router (`layer.layer(router)`: tollgate-tower matches its own routes, so
/// this is its natural place), or `router`, axum's `Router::layer` (which
/// wraps every route, and costs a boxed clone of the route and a second
/// route future per request). Every variant of a run uses the same one; the
/// bare service is the router itself either way.
const PLACEMENTS: [&str; 2] = ["outer", "router"];

/// The placement of a run when `--placement` is not given.
const DEFAULT_PLACEMENT: &str = "outer";

/// Serves `app` on `listener`, with the peer's address in each request's
/// extensions (axum's `ConnectInfo`, which both layers' key extractors read;
/// the make-service adds it before `app` sees the request, wherever the
/// layer sits).
async fn run<S>(listener: TcpListener, app: S)
where
    S: Service<axum::extract::Request, Response = axum::response::Response, Error = Infallible>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send,
{
    let service = axum::ServiceExt::into_make_service_with_connect_info::<SocketAddr>(app);
    axum::serve(listener, service).await.unwrap();
}

/// Serves `variant` under `limits` with the layer at `placement`.
async fn serve_app(listener: TcpListener, variant: &str, limits: &str, placement: &str) {
    let router = router();
    match (variant, placement) {
        // As `Router::into_make_service_with_connect_info` does, whichever
        // the placement: the routes are built once, not per request.
        ("none", _) => run(listener, router.with_state::<()>(())).await,
        ("tollgate-tower", "outer") => {
            run(
                listener,
                tollgate_layer(limits).layer(router.with_state::<()>(())),
            )
            .await
        }
        ("tollgate-tower", "router") => {
            run(
                listener,
                router.layer(tollgate_layer(limits)).with_state::<()>(()),
            )
            .await
        }
        ("tower_governor", "outer") => {
            run(
                listener,
                governor_layer(limits).layer(router.with_state::<()>(())),
            )
            .await
        }
        ("tower_governor", "router") => {
            run(
                listener,
                router.layer(governor_layer(limits)).with_state::<()>(()),
            )
            .await
        }
        (part, "outer") if part.starts_with("tollgate-") => {
            let part = &part["tollgate-".len()..];
            run(
                listener,
                breakdown_layer(part, limits).layer(router.with_state::<()>(())),
            )
            .await
        }
        (part, "router") if part.starts_with("tollgate-") => {
            let part = &part["tollgate-".len()..];
            run(
                listener,
                router
                    .layer(breakdown_layer(part, limits))
                    .with_state::<()>(()),
            )
            .await
        }
        (variant, placement) => panic!("variant {variant}, placement {placement}: unknown"),
    }
}

/// The server side: serves `variant` on a free loopback port, prints the
/// port, and exits when its standard input closes (the driver ended, however
/// it ended), so no server outlives a run.
fn serve(variant: &str, limits: &str, placement: &str) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        println!("{}", listener.local_addr().unwrap().port());
        std::io::stdout().flush().unwrap();
        std::thread::spawn(|| {
            let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut Vec::new());
            std::process::exit(0);
        });
        serve_app(listener, variant, limits, placement).await;
    });
}

struct Server {
    child: Child,
    addr: SocketAddr,
    // Held open: the server exits when it closes.
    _stdout: BufReader<ChildStdout>,
}

impl Server {
    fn start(variant: &str, limits: &str, placement: &str, cpu: Option<usize>) -> Server {
        let exe = std::env::current_exe().unwrap();
        let mut command = match cpu {
            Some(cpu) => {
                let mut c = Command::new("taskset");
                c.arg("-c").arg(cpu.to_string()).arg(exe);
                c
            }
            None => Command::new(exe),
        };
        let mut child = command
            .args([
                "--serve",
                variant,
                "--limits",
                limits,
                "--placement",
                placement,
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the server (is taskset installed? else --no-pin)");
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let port: u16 = line.trim().parse().expect("the server's port");
        Server {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            _stdout: stdout,
        }
    }

    fn cpu_ns(&self) -> u64 {
        cpu_ns(&format!("/proc/{}/schedstat", self.child.id()))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Nanoseconds a thread has run on a CPU (its `schedstat`): a
/// single-threaded runtime's work is all on its main thread.
fn cpu_ns(schedstat: &str) -> u64 {
    std::fs::read_to_string(schedstat)
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

struct Phase {
    ok: u64,
    denied: u64,
    latencies_us: Vec<u32>,
    seconds: f64,
    cpu_ns: u64,
    client_cpu_ns: u64,
}

impl Phase {
    fn rps(&self) -> f64 {
        (self.ok + self.denied) as f64 / self.seconds
    }

    fn cpu_us_per_request(&self) -> f64 {
        self.cpu_ns as f64 / 1e3 / (self.ok + self.denied) as f64
    }
}

/// A figure of one phase.
type Measure = fn(&Phase) -> f64;

/// Reads one HTTP/1.1 response from `stream` into `buf`; its status.
async fn read_response(stream: &mut tokio::net::TcpStream, buf: &mut Vec<u8>) -> u16 {
    buf.clear();
    let mut chunk = [0u8; 4096];
    let total = loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = std::str::from_utf8(&buf[..end]).expect("an ASCII head");
            let length = head
                .split("\r\n")
                .find_map(|line| {
                    let (name, value) = line.split_once(':')?;
                    name.eq_ignore_ascii_case("content-length")
                        .then(|| value.trim().parse::<usize>().ok())?
                })
                .expect("a content-length");
            break end + 4 + length;
        }
        let n = stream.read(&mut chunk).await.unwrap();
        assert!(n > 0, "the server closed the connection");
        buf.extend_from_slice(&chunk[..n]);
    };
    while buf.len() < total {
        let n = stream.read(&mut chunk).await.unwrap();
        assert!(n > 0, "the server closed the connection");
        buf.extend_from_slice(&chunk[..n]);
    }
    std::str::from_utf8(&buf[9..12]).unwrap().parse().unwrap()
}

/// One client connection from `local`: requests one after another until
/// `end` or `limit` requests; the 200s, the 429s and the latencies of those
/// sent after `start`.
async fn connection(
    addr: SocketAddr,
    local: IpAddr,
    start: Instant,
    end: Instant,
    limit: u64,
) -> (u64, u64, Vec<u32>) {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::new(local, 0)).unwrap();
    let mut stream = socket.connect(addr).await.unwrap();
    stream.set_nodelay(true).unwrap();
    let request = b"GET / HTTP/1.1\r\nhost: bench\r\n\r\n";
    let mut buf = Vec::with_capacity(4096);
    let (mut ok, mut denied, mut latencies) = (0u64, 0u64, Vec::new());
    for _ in 0..limit {
        let sent = Instant::now();
        if sent >= end {
            break;
        }
        stream.write_all(request).await.unwrap();
        let status = read_response(&mut stream, &mut buf).await;
        if sent >= start {
            latencies.push(sent.elapsed().as_micros().min(u128::from(u32::MAX)) as u32);
            match status {
                200 => ok += 1,
                429 => denied += 1,
                other => panic!("unexpected status {other}"),
            }
        }
    }
    (ok, denied, latencies)
}

/// `--drive PORT --requests N`: exactly `N` requests to a server started
/// with `--serve` (for counting the server's instructions per request under
/// callgrind: see docs/tower.md).
fn drive(port: u16, requests: u64, connections: u64) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let now = Instant::now();
    let end = now + Duration::from_secs(3600);
    let (mut ok, mut denied) = (0, 0);
    runtime.block_on(async {
        let clients: Vec<_> = (0..connections)
            .map(|c| {
                let local = IpAddr::from([127, 0, 0, 1 + (c % 4) as u8]);
                let share = requests / connections + u64::from(c < requests % connections);
                tokio::spawn(connection(addr, local, now, end, share))
            })
            .collect();
        for client in clients {
            let (o, d, _) = client.await.unwrap();
            ok += o;
            denied += d;
        }
    });
    println!("{ok} 200, {denied} 429");
}

async fn phase(server: &Server, connections: usize, seconds: f64) -> Phase {
    let warm_up = Duration::from_millis(300);
    let start = Instant::now() + warm_up;
    let end = start + Duration::from_secs_f64(seconds);
    let addr = server.addr;
    let mut clients = Vec::new();
    for c in 0..connections {
        let local = IpAddr::from([127, 0, 0, 1 + (c % 4) as u8]);
        clients.push(tokio::spawn(connection(addr, local, start, end, u64::MAX)));
    }
    tokio::time::sleep_until(start.into()).await;
    let cpu_start = server.cpu_ns();
    let client_start = cpu_ns("/proc/thread-self/schedstat");
    tokio::time::sleep_until(end.into()).await;
    let cpu_end = server.cpu_ns();
    let client_end = cpu_ns("/proc/thread-self/schedstat");
    let mut total = Phase {
        ok: 0,
        denied: 0,
        latencies_us: Vec::new(),
        seconds,
        cpu_ns: cpu_end.saturating_sub(cpu_start),
        client_cpu_ns: client_end.saturating_sub(client_start),
    };
    for client in clients {
        let (ok, denied, latencies) = client.await.unwrap();
        total.ok += ok;
        total.denied += denied;
        total.latencies_us.extend(latencies);
    }
    total.latencies_us.sort_unstable();
    total
}

/// The `p`-quantile of `sorted` (nearest rank).
fn quantile<T: Copy>(sorted: &[T], p: f64) -> T {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn sorted(mut values: Vec<f64>) -> Vec<f64> {
    values.sort_by(f64::total_cmp);
    values
}

fn pin_self(cpu: usize) {
    let status = Command::new("taskset")
        .args([
            "-a",
            "-p",
            "-c",
            &cpu.to_string(),
            &std::process::id().to_string(),
        ])
        .stdout(Stdio::null())
        .status()
        .expect("taskset (or run with --no-pin)");
    assert!(status.success(), "taskset failed");
}

fn first_line(path: &str, prefix: &str) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(prefix))
        .map_or_else(String::new, |l| {
            l.split_once(':').map_or(l, |(_, v)| v).trim().to_owned()
        })
}

fn loadavg() -> String {
    let s = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    s.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let number =
        |name: &str, default: f64| flag(name).map_or(default, |v| v.parse().expect("a number"));
    let placement = flag("--placement").unwrap_or_else(|| DEFAULT_PLACEMENT.into());
    assert!(
        PLACEMENTS.contains(&placement.as_str()),
        "--placement outer|router, not {placement}"
    );
    if let Some(variant) = flag("--serve") {
        serve(
            &variant,
            &flag("--limits").unwrap_or_else(|| "allow".into()),
            &placement,
        );
        return;
    }
    if let Some(port) = flag("--drive") {
        let requests = number("--requests", 10_000.0) as u64;
        let connections = number("--connections", 16.0) as u64;
        drive(port.parse().expect("a port"), requests, connections);
        return;
    }
    let seconds = number("--seconds", 1.0);
    let rounds = number("--rounds", 30.0) as usize;
    let connections = number("--connections", 16.0) as usize;
    let pin = !args.iter().any(|a| a == "--no-pin");
    let server_cpu = number("--server-cpu", 0.0) as usize;
    let client_cpu = number("--client-cpu", 1.0) as usize;
    let breakdown = args.iter().any(|a| a == "--breakdown");
    let variants_arg = flag("--variants").unwrap_or_else(|| {
        (if breakdown {
            BREAKDOWN_VARIANTS
        } else {
            DEFAULT_VARIANTS
        })
        .to_owned()
    });
    let variants: Vec<&str> = variants_arg.split(',').collect();
    assert!(
        variants.len() >= 2,
        "--variants: a baseline and at least one more"
    );
    let orders = orders(variants.len());
    let limits: Vec<String> = match flag("--limits").as_deref() {
        // The breakdown's parts are the allow path's.
        None if breakdown => vec!["allow".into()],
        None | Some("both") => vec!["allow".into(), "deny".into()],
        Some(one) => vec![one.into()],
    };
    if pin {
        pin_self(client_cpu);
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // Counted from /proc/cpuinfo: after pinning, this process sees one.
    let cpus = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with("processor"))
        .count();
    println!(
        "loopback; {} ({} CPUs); load average {} at start",
        first_line("/proc/cpuinfo", "model name"),
        cpus,
        loadavg()
    );
    println!(
        "{connections} keep-alive connections from 4 addresses; {rounds} rounds of {seconds} s per \
         variant, fresh server processes every round; variants {}; layers placed {placement}; {}\n",
        variants.join(", "),
        if pin {
            format!("server pinned to CPU {server_cpu}, load generator to CPU {client_cpu}")
        } else {
            "not pinned".to_owned()
        }
    );
    for limits in &limits {
        let mut phases: Vec<Vec<Phase>> = variants.iter().map(|_| Vec::new()).collect();
        for round in 0..rounds {
            // Fresh server processes every round: where the kernel put a
            // process's code and data stays put for its life and moved one
            // variant's requests/s by a point or two for a whole run; new
            // processes draw it anew each round, and the median evens it out.
            let servers: Vec<Server> = variants
                .iter()
                .map(|v| Server::start(v, limits, &placement, pin.then_some(server_cpu)))
                .collect();
            for &v in &orders[round % orders.len()] {
                let p = runtime.block_on(phase(&servers[v], connections, seconds));
                phases[v].push(p);
            }
        }
        println!("**{limits}**, per variant (median over rounds):\n");
        println!(
            "| layer | requests/s | p50 µs | p99 µs | server CPU µs/request | server CPU use | load generator CPU use | 200 | 429 |"
        );
        println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
        for (v, runs) in phases.iter().enumerate() {
            let med =
                |f: &dyn Fn(&Phase) -> f64| quantile(&sorted(runs.iter().map(f).collect()), 0.5);
            println!(
                "| {} | {:.0} | {:.0} | {:.0} | {:.2} | {:.0}% | {:.0}% | {:.0} | {:.0} |",
                variants[v],
                med(&|p| p.rps()),
                med(&|p| f64::from(quantile(&p.latencies_us, 0.5))),
                med(&|p| f64::from(quantile(&p.latencies_us, 0.99))),
                med(&|p| p.cpu_us_per_request()),
                med(&|p| p.cpu_ns as f64 / 1e9 / p.seconds * 100.0),
                med(&|p| p.client_cpu_ns as f64 / 1e9 / p.seconds * 100.0),
                med(&|p| p.ok as f64),
                med(&|p| p.denied as f64),
            );
        }
        println!(
            "\n**{limits}**, paired ratios within a round ({rounds} rounds): requests/s, and \
             the server's CPU time per request (above 0: the layer costs more):\n"
        );
        println!("| measure | ratio | median | IQR | min–max |");
        println!("|---|---|---:|---:|---:|");
        let measures: [(&str, Measure); 2] = [
            ("requests/s", Phase::rps),
            ("server CPU/request", Phase::cpu_us_per_request),
        ];
        for (measure, f) in measures {
            let position = |name: &str| variants.iter().position(|v| *v == name);
            let mut pairs: Vec<(usize, usize)> = (1..variants.len()).map(|v| (v, 0)).collect();
            if let (Some(a), Some(b)) = (position("tollgate-tower"), position("tower_governor")) {
                if b != 0 {
                    pairs.push((a, b));
                }
            }
            for &(a, b) in &pairs {
                let ratios = sorted(
                    (0..rounds)
                        .map(|r| f(&phases[a][r]) / f(&phases[b][r]))
                        .collect(),
                );
                let pct = |x: f64| format!("{:+.1}%", (x - 1.0) * 100.0);
                println!(
                    "| {measure} | {} / {} | {} | {} to {} | {} to {} |",
                    variants[a],
                    variants[b],
                    pct(quantile(&ratios, 0.5)),
                    pct(quantile(&ratios, 0.25)),
                    pct(quantile(&ratios, 0.75)),
                    pct(ratios[0]),
                    pct(ratios[ratios.len() - 1]),
                );
            }
        }
        println!();
    }
    println!("load average {} at the end", loadavg());
}
