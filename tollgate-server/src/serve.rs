//! Running the service: listeners, reloads of the configuration directory,
//! and a graceful shutdown.

use std::future::Future;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::time::Duration;

use std::sync::Arc;

use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_stream::wrappers::TcpListenerStream;
use tollgate::{AdaptiveLimit, ConcurrencyLimit, RoundTrip};
use tollgate_tower::{ConcurrencyLayer, DrainLayer, InFlightLimit};

use crate::config::Config;
use crate::server::{InFlight, Server};

/// Serves `server` over gRPC on `grpc` and HTTP on `http` until `shutdown`
/// completes; then stops accepting and lets the calls in flight finish.
/// With `metrics` (the handle of a Prometheus recorder installed for the
/// process), `GET /metrics` renders it.
///
/// Errors: the transport's, if a listener fails.
pub async fn serve(
    server: Server,
    grpc: TcpListener,
    http: TcpListener,
    metrics: Option<PrometheusHandle>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let (stop, stopped) = watch::channel(false);
    let wait = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let grpc = TcpListenerStream::new(grpc);
    let grpc_task = match server.options().in_flight {
        InFlight::Unlimited => tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(server.grpc())
                .serve_with_incoming_shutdown(grpc, wait(stopped.clone())),
        ),
        InFlight::Fixed(n) => bounded(
            &server,
            Arc::new(ConcurrencyLimit::new(n)?),
            grpc,
            wait(stopped.clone()),
        ),
        InFlight::Adaptive => bounded(
            &server,
            Arc::new(AdaptiveLimit::new(RoundTrip::default())?),
            grpc,
            wait(stopped.clone()),
        ),
    };
    let http_task = tokio::spawn(
        axum::serve(http, crate::http::router(server.clone(), metrics))
            .with_graceful_shutdown(wait(stopped))
            .into_future(),
    );
    shutdown.await;
    let _ = stop.send(true);
    grpc_task.await??;
    http_task.await??;
    Ok(())
}

/// The gRPC service behind `limit`: past it, a call is shed with
/// `UNAVAILABLE` (tollgate-tower's concurrency layer). A shed call's body,
/// which the layer drops unread, is read to its end in the background
/// ([`DrainLayer`]): h2 would otherwise keep the small DATA frames that
/// arrive after the drop charged to the connection's flood budget, and
/// close the connection once enough calls were shed.
fn bounded<L: InFlightLimit>(
    server: &Server,
    limit: Arc<L>,
    grpc: TcpListenerStream,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> tokio::task::JoinHandle<Result<(), tonic::transport::Error>> {
    let drain = DrainLayer::new();
    tokio::spawn(
        tonic::transport::Server::builder()
            .layer(tower::util::MapRequestLayer::new(
                move |call: http::Request<tonic::body::Body>| {
                    call.map(|body| tonic::body::Body::new(drain.wrap(body)))
                },
            ))
            .layer(ConcurrencyLayer::new(limit))
            .add_service(server.grpc())
            .serve_with_incoming_shutdown(grpc, shutdown),
    )
}

/// What a configuration directory held when last read: each file's path
/// and a hash of its content, subdirectories included (as
/// [`Config::load_dir`] reads them: names starting with `.` skipped, links
/// followed, so a Kubernetes ConfigMap's swapped `..data` link shows as a
/// change of the files that point through it). Contents, not modification
/// times: a file rewritten with as many bytes within the file system's
/// timestamp granularity (a few ms) keeps its time.
#[derive(Debug, PartialEq, Eq)]
struct Seen(Vec<(PathBuf, u64)>);

fn seen(dir: &Path) -> std::io::Result<Seen> {
    fn walk(dir: &Path, files: &mut Vec<(PathBuf, u64)>, depth: u32) -> std::io::Result<()> {
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            if entry.file_name().to_string_lossy().starts_with('.') {
                continue;
            }
            let path = entry.path();
            // Follows links, as loading does.
            let Ok(meta) = std::fs::metadata(&path) else {
                continue;
            };
            if meta.is_dir() {
                // A link loop must not recurse forever.
                if depth < 16 {
                    walk(&path, files, depth + 1)?;
                }
            } else if let Ok(content) = std::fs::read(&path) {
                let mut hasher = std::hash::DefaultHasher::new();
                content.hash(&mut hasher);
                files.push((path, hasher.finish()));
            }
        }
        Ok(())
    }
    let mut files = Vec::new();
    walk(dir, &mut files, 0)?;
    files.sort();
    Ok(Seen(files))
}

/// Loads `dir` into `server` whenever a file in it changes (looked at every
/// `every`) or `reload` is notified (e.g. on `SIGHUP`). A directory that does not load is reported
/// through `report` and the server keeps deciding with what it had.
///
/// It starts by loading `dir` once: if the files differ from those the
/// server was made with (changed between that load and this watcher's
/// first look), that is a reload too, so no change is missed.
pub async fn watch_config(
    server: Server,
    dir: PathBuf,
    every: Duration,
    reload: std::sync::Arc<tokio::sync::Notify>,
    report: impl Fn(Result<(), String>) + Send,
) {
    let mut last = seen(&dir).ok();
    // Files changed since the server's load show only here: the first look
    // above already counts them as seen.
    match Config::load_dir(&dir) {
        Ok(config) if !server.loaded_from(&config) => {
            report(server.reload(config).map_err(|e| e.to_string()));
        }
        Ok(_) => {}
        Err(e) => {
            crate::metrics::reload(false);
            report(Err(e.to_string()));
        }
    }
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {
                let now = seen(&dir).ok();
                if now == last {
                    continue;
                }
                last = now;
            }
            _ = reload.notified() => {}
        }
        let result = match Config::load_dir(&dir) {
            Ok(config) => server.reload(config).map_err(|e| e.to_string()),
            Err(e) => {
                crate::metrics::reload(false);
                Err(e.to_string())
            }
        };
        report(result);
    }
}
