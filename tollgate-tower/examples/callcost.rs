//! Instructions per request through the layer, without the network, for
//! `valgrind --tool=callgrind` (instruction counts do not move with the
//! machine's load, unlike time): `--requests N` requests, each with its peer
//! address, through the load test's axum service (`GET /` → `"ok"`) with no
//! layer, tollgate-tower or `tower_governor`, the response future polled once
//! (it is ready: the handler and every policy here answer at once), the layer
//! in front of the whole router (`--placement outer`, the default) or added
//! with axum's `Router::layer` (`--placement router`). The same
//! limits as the load test (`allow`: never reached; `deny`: one permit per
//! key per hour). Only the counted requests are collected; divide the total
//! by `N`:
//!
//! ```text
//! cargo build --release -p tollgate-tower --example callcost
//! valgrind --tool=callgrind --collect-atstart=no --toggle-collect='callcost::measured*' \
//!   target/release/examples/callcost --layer tollgate --limits allow --placement outer --requests 10000
//! ```

use axum::body::Body;
use http::{Request, Response};
use tower::{Layer, Service};

mod load_service;
use load_service::{governor_layer, once, router, tollgate_layer};

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
        (layer, placement) => panic!(
            "--layer none|tollgate|governor and --placement outer|router, not {layer} and {placement}"
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

fn drive<S>(mut service: S, requests: u64) -> (u64, u64)
where
    S: Service<Request<Body>, Response = Response<Body>>,
    S::Error: std::fmt::Debug,
{
    for i in 0..8 {
        once(&mut service, i);
    }
    let ok = measured(&mut service, requests);
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
