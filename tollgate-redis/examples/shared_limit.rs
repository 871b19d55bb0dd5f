//! One global limit held by several processes through Redis.
//!
//! Start a server first (any Redis or Valkey will do):
//!
//! ```sh
//! redis-server --port 6379 --save '' &
//! cargo run --release -p tollgate-redis --example shared_limit
//! ```
//!
//! (`REDIS_URL` picks another server.) The example starts four copies of
//! itself; each asks an exact sliding log of 200 per second for permits as fast
//! as it can for three seconds, on one shared key. Each prints what it got; the
//! parent adds them up and checks, from the server times the script returned,
//! that no second-long window anywhere held more than 200.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tollgate::Rate;
use tollgate_redis::{Client, Error, Limiter, SlidingLog};

const WORKERS: usize = 4;
const LIMIT: u32 = 200;
const RUN: Duration = Duration::from_secs(3);

fn limiter() -> SlidingLog {
    SlidingLog::new("shared-example", Rate::per_second(LIMIT)).expect("a valid limiter")
}

fn url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".to_owned())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    match std::env::args().nth(1).as_deref() {
        Some("worker") => worker(),
        _ => parent(),
    }
}

/// Asks for one permit after another until the run ends; prints each admitted
/// permit's server time, then a summary line.
fn worker() -> Result<(), Box<dyn std::error::Error>> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let client = Client::connect(&url()).await?;
        let log = limiter();
        let (mut admitted, mut denied) = (0u64, 0u64);
        let started = Instant::now();
        while started.elapsed() < RUN {
            match client.try_acquire(&log, "example:shared").await {
                Ok(admission) => {
                    admitted += 1;
                    println!("{}", admission.time_us);
                }
                Err(Error::Denied(_)) => denied += 1,
                Err(other) => return Err(other.into()),
            }
        }
        println!("done {admitted} {denied}");
        Ok(())
    })
}

fn parent() -> Result<(), Box<dyn std::error::Error>> {
    let url = url();
    // Start from an empty log, so earlier runs do not count.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let key = limiter().redis_key("example:shared");
    runtime
        .block_on(async {
            let client = redis::Client::open(url.as_str())?;
            let mut connection = client.get_multiplexed_async_connection().await?;
            redis::cmd("DEL")
                .arg(&key)
                .query_async::<()>(&mut connection)
                .await
        })
        .map_err(|err| {
            format!("cannot reach {url} ({err}); start one: redis-server --port 6379 --save ''")
        })?;

    println!(
        "{WORKERS} processes share one sliding log of {LIMIT} per second at {url}, for {RUN:?}"
    );
    let exe = std::env::current_exe()?;
    let workers: Vec<_> = (0..WORKERS)
        .map(|_| {
            Command::new(&exe)
                .arg("worker")
                .stdout(Stdio::piped())
                .spawn()
        })
        .collect::<Result<_, _>>()?;
    let mut stamps = Vec::new();
    let mut total = (0u64, 0u64);
    for (i, worker) in workers.into_iter().enumerate() {
        let output = worker.wait_with_output()?;
        if !output.status.success() {
            return Err(format!("worker {i} failed").into());
        }
        for line in BufReader::new(&output.stdout[..]).lines() {
            let line = line?;
            if let Some(summary) = line.strip_prefix("done ") {
                let mut parts = summary.split(' ').map(|p| p.parse::<u64>().unwrap_or(0));
                let (admitted, denied) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
                println!("process {i}: {admitted:>6} admitted {denied:>8} denied");
                total.0 += admitted;
                total.1 += denied;
            } else {
                stamps.push(line.parse::<u64>()?);
            }
        }
    }
    stamps.sort_unstable();
    // The most stamps in any window [t, t + 1 s).
    let (mut start, mut busiest) = (0, 0);
    for end in 0..stamps.len() {
        while stamps[start] + 1_000_000 <= stamps[end] {
            start += 1;
        }
        busiest = busiest.max(end + 1 - start);
    }
    println!(
        "all:       {:>6} admitted {:>8} denied; busiest second held {busiest} (limit {LIMIT})",
        total.0, total.1
    );
    if busiest > LIMIT as usize {
        return Err("the global limit was exceeded".into());
    }
    Ok(())
}
