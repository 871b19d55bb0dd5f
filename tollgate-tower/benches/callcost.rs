//! Instructions per request through the layer, without the network, for
//! `valgrind --tool=callgrind` (instruction counts do not move with the
//! machine's load, unlike time): `--requests N` requests, each with its peer
//! address, through the load test's axum service (`GET /` → `"ok"`) with no
//! layer (`--layer none`), tollgate-tower (`tollgate`), `tower_governor`
//! (`governor`) or a part of tollgate-tower's cost (`no-policy`,
//! `unreported`, `constant`: `load_service::breakdown_layer`), the response future polled once
//! (it is ready: the handler and every policy here answer at once), the layer
//! in front of the whole router (`--placement outer`, the default) or added
//! with axum's `Router::layer` (`--placement router`). The same
//! limits as the load test (`allow`: never reached; `deny`: one permit per
//! key per hour). Only the counted requests are collected; divide the total
//! by `N`. (A plain `cargo bench` runs it once with the defaults: 10,000
//! requests through tollgate-tower, uncounted.)
//!
//! ```text
//! exe=$(cargo bench --no-run -p tollgate-tower --bench callcost 2>&1 | grep -o 'target/release/deps/callcost-[0-9a-f]*')
//! valgrind --tool=callgrind --collect-atstart=no --toggle-collect='callcost::measured*' \
//!   $exe --layer tollgate --limits allow --placement outer --requests 10000
//! ```
//!
//! `--pollute` empties the caches before each request, as the kernel's TCP
//! stack does in the load test, and counts each request alone
//! (`measured_one`): `scripts/tower-footprint` runs it under callgrind's
//! cache simulation for the lines of code and data a request touches.

use axum::body::Body;
use http::{Request, Response};
use tower::{Layer, Service};

mod load_service;
use load_service::{breakdown_layer, governor_layer, once, router, tollgate_layer};

/// The load test's service with the layer where the load test puts it
/// (`--placement outer`: in front of the whole router; `router`: axum's
/// `Router::layer`), counted over `requests` requests. The routes are
/// built once first (`with_state`), as `into_make_service` does.
fn run(layer: &str, limits: &str, placement: &str, requests: u64) -> (u64, u64) {
    let router = router();
    match (layer, placement) {
        ("none", _) => drive(router.with_state::<()>(()), requests),
        ("tollgate", "outer") => drive(
            tollgate_layer(limits).layer(router.with_state::<()>(())),
            requests,
        ),
        ("tollgate", "router") => drive(
            router.layer(tollgate_layer(limits)).with_state::<()>(()),
            requests,
        ),
        ("governor", "outer") => drive(
            governor_layer(limits).layer(router.with_state::<()>(())),
            requests,
        ),
        ("governor", "router") => drive(
            router.layer(governor_layer(limits)).with_state::<()>(()),
            requests,
        ),
        (part, "outer") => drive(
            breakdown_layer(part, limits).layer(router.with_state::<()>(())),
            requests,
        ),
        (part, "router") => drive(
            router
                .layer(breakdown_layer(part, limits))
                .with_state::<()>(()),
            requests,
        ),
        (layer, placement) => panic!(
            "--layer none|tollgate|governor|no-policy|unreported|constant and --placement outer|router, not {layer} and {placement}"
        ),
    }
}

/// The requests counted: callgrind's `--toggle-collect` names this function,
/// so the warm-up before it (the clock's calibration, the keys' first
/// insertion, the deny case's first permits) is left out.
#[inline(never)]
fn measured<S>(service: &mut S, requests: u64) -> u64
where
    S: Service<Request<Body>, Response = Response<Body>>,
    S::Error: std::fmt::Debug,
{
    (0..requests)
        .map(|i| u64::from(once(service, i) == 200))
        .sum()
}

/// With `--pollute`: each request alone is counted (`measured_one`), after
/// [`pollute`] has evicted what the last one left in the caches.
#[inline(never)]
fn measured_polluted<S>(service: &mut S, requests: u64) -> u64
where
    S: Service<Request<Body>, Response = Response<Body>>,
    S::Error: std::fmt::Debug,
{
    let mut data = vec![0u8; POLLUTION_BYTES];
    (0..requests)
        .map(|i| {
            pollute(&mut data, i);
            measured_one(service, i)
        })
        .sum()
}

#[inline(never)]
fn measured_one<S>(service: &mut S, i: u64) -> u64
where
    S: Service<Request<Body>, Response = Response<Body>>,
    S::Error: std::fmt::Debug,
{
    u64::from(once(service, i) == 200)
}

/// Twice the largest cache `scripts/tower-footprint` simulates (a 512 KiB L2).
const POLLUTION_BYTES: usize = 1 << 20;

/// What the kernel does to a server's caches between two of its requests
/// (its TCP stack is three quarters of a request's time in the load test),
/// as a cache simulator can see it: a write to every line of
/// [`POLLUTION_BYTES`] of data, and a run through 48 KiB of code (more than
/// any first-level instruction cache), so the next request finds neither
/// its code nor its data where the last one left them.
#[inline(never)]
fn pollute(data: &mut [u8], i: u64) {
    for line in data.chunks_mut(64) {
        line[0] = line[0].wrapping_add(i as u8);
    }
    #[cfg(target_arch = "x86_64")]
    // SAFETY: no-operations only.
    unsafe {
        std::arch::asm!(
            ".rept 12288",
            "nop",
            "nop",
            "nop",
            "nop",
            ".endr",
            options(nomem, nostack)
        );
    }
}

fn drive<S>(mut service: S, requests: u64) -> (u64, u64)
where
    S: Service<Request<Body>, Response = Response<Body>>,
    S::Error: std::fmt::Debug,
{
    for i in 0..8 {
        once(&mut service, i);
    }
    let ok = if std::env::args().any(|a| a == "--pollute") {
        measured_polluted(&mut service, requests)
    } else {
        measured(&mut service, requests)
    };
    (ok, requests - ok)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |name: &str, default: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .map_or(default.to_owned(), Clone::clone)
    };
    let requests: u64 = arg("--requests", "10000").parse().expect("a count");
    let (ok, denied) = run(
        &arg("--layer", "tollgate"),
        &arg("--limits", "allow"),
        &arg("--placement", "outer"),
        requests,
    );
    println!("{ok} admitted, {denied} refused");
}
