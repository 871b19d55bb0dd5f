//! `tollgate-server`: Envoy's rate limit service on tollgate's limits.
//!
//! Every flag has an environment variable of the same meaning
//! (`--config-dir` / `TOLLGATE_CONFIG_DIR`, …); `--help` lists them.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use tokio::net::TcpListener;
use tollgate_server::config::Config;
use tollgate_server::{
    Bounds, Failure, InFlight, Leasing, Options, RedisSettings, ResponseHeaders, Server, serve,
    watch_config,
};

#[derive(Parser, Debug)]
#[command(
    version,
    about = "Envoy's rate limit service on tollgate's exact limits"
)]
struct Args {
    /// Directory of envoyproxy/ratelimit configuration files (YAML, one
    /// domain each), reloaded when a file changes or on SIGHUP.
    #[arg(long, env = "TOLLGATE_CONFIG_DIR")]
    config_dir: PathBuf,
    /// Address of the gRPC service.
    #[arg(long, env = "TOLLGATE_GRPC_ADDR", default_value = "0.0.0.0:8081")]
    grpc_addr: SocketAddr,
    /// Address of the HTTP endpoints (`POST /json`, `GET /healthcheck`).
    #[arg(long, env = "TOLLGATE_HTTP_ADDR", default_value = "0.0.0.0:8080")]
    http_addr: SocketAddr,
    /// Keys each limit keeps; beyond them new keys share one overflow state
    /// (never an admission more).
    #[arg(long, env = "TOLLGATE_MAX_KEYS_PER_LIMIT", default_value_t = 1 << 20)]
    max_keys_per_limit: usize,
    /// Descriptors one request may carry.
    #[arg(long, env = "TOLLGATE_MAX_DESCRIPTORS", default_value_t = Bounds::default().max_descriptors)]
    max_descriptors: usize,
    /// Limits one request's descriptors may match.
    #[arg(long, env = "TOLLGATE_MAX_LIMITS", default_value_t = Bounds::default().max_limits)]
    max_limits: usize,
    /// Calls let in at once before the next is shed with `UNAVAILABLE`: a
    /// number, `unlimited`, or `adaptive` (a bound that follows round-trip
    /// times).
    #[arg(long, env = "TOLLGATE_IN_FLIGHT", default_value = "1024")]
    in_flight: InFlight,
    /// Headers the answers ask the proxy to add: `off`, or `ratelimit`
    /// (envoyproxy/ratelimit's `RateLimit-Limit`, `-Remaining`, `-Reset`).
    #[arg(long, env = "TOLLGATE_RESPONSE_HEADERS", default_value = "off")]
    response_headers: ResponseHeaders,
    /// How often the configuration directory is looked at, in milliseconds.
    #[arg(long, env = "TOLLGATE_RELOAD_CHECK_MS", default_value_t = 1000)]
    reload_check_ms: u64,
    /// Where the limits' state lives: `memory` (this process), `redis`
    /// (shared by every replica on the same Redis and prefix), or `leased`
    /// (`redis`, with fast token-bucket limits leased in batches and spent
    /// here).
    #[arg(long, env = "TOLLGATE_BACKEND", default_value = "memory", value_parser = ["memory", "redis", "leased"])]
    backend: String,
    /// The `leased` backend leases `token_bucket` rules of at least this
    /// many requests per second; the others are decided in Redis.
    #[arg(long, env = "TOLLGATE_LEASE_MIN_RATE", default_value_t = Leasing::default().min_rate_per_second)]
    lease_min_rate: f64,
    /// Keys the `leased` backend holds leases of at once; further keys are
    /// decided in Redis until an idle one leaves.
    #[arg(long, env = "TOLLGATE_LEASE_MAX_KEYS", default_value_t = Leasing::default().max_keys)]
    lease_max_keys: usize,
    /// How long leased permits may wait in this process, in milliseconds,
    /// before they go back to Redis.
    #[arg(long, env = "TOLLGATE_LEASE_LIFETIME_MS", default_value_t = 1000)]
    lease_lifetime_ms: u64,
    /// The largest lease, in permits.
    #[arg(long, env = "TOLLGATE_LEASE_MAX", default_value_t = Leasing::default().max_lease)]
    lease_max: u32,
    /// Redis URL (`redis://host:port/db`) of the `redis` backend; several,
    /// comma-separated, for a Redis Cluster's nodes with `--redis-cluster`.
    #[arg(
        long,
        env = "TOLLGATE_REDIS_URL",
        default_value = "redis://127.0.0.1:6379/"
    )]
    redis_url: String,
    /// The Redis URLs are a Redis Cluster's nodes.
    #[arg(long, env = "TOLLGATE_REDIS_CLUSTER")]
    redis_cluster: bool,
    /// Prefix of every Redis key the server writes.
    #[arg(long, env = "TOLLGATE_REDIS_PREFIX", default_value = "tollgate-server")]
    redis_prefix: String,
    /// The longest a decision waits for Redis, in milliseconds, before the
    /// failure mode answers (Envoy's own default timeout for the service is
    /// 20 ms).
    #[arg(long, env = "TOLLGATE_REDIS_TIMEOUT_MS", default_value_t = 15)]
    redis_timeout_ms: u64,
    /// What a request gets when Redis does not answer in time: `open`
    /// (admitted), `closed` (refused) or `local` (decided by this replica's
    /// own limits).
    #[arg(long, env = "TOLLGATE_REDIS_FAILURE", default_value = "local")]
    redis_failure: Failure,
    /// Logs as JSON lines instead of text.
    #[arg(long, env = "TOLLGATE_LOG_JSON")]
    log_json: bool,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    if args.log_json {
        tracing_subscriber::fmt()
            .json()
            .with_env_filter(filter)
            .init();
    } else {
        tracing_subscriber::fmt().with_env_filter(filter).init();
    }
    match run(args).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(%error, "tollgate-server stopped");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    // Histograms with buckets (Prometheus's `histogram_quantile` needs
    // them): from 50 µs, a memory decision, to 1 s, far past any timeout.
    let metrics = metrics_exporter_prometheus::PrometheusBuilder::new()
        .set_buckets(&[
            0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1,
            0.25, 1.0,
        ])?
        .install_recorder()?;
    // The recorder drains its histograms' samples only when told to.
    let upkeep = metrics.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            upkeep.run_upkeep();
        }
    });
    let config = Config::load_dir(&args.config_dir)?;
    let mut options = Options::default();
    options.max_keys_per_limit = args.max_keys_per_limit;
    options.bounds.max_descriptors = args.max_descriptors;
    options.bounds.max_limits = args.max_limits;
    options.in_flight = args.in_flight;
    options.response_headers = args.response_headers;
    let server = if args.backend == "redis" || args.backend == "leased" {
        let mut settings = RedisSettings::default();
        settings.prefix = args.redis_prefix.clone();
        settings.failure = args.redis_failure;
        if args.backend == "leased" {
            let mut leasing = Leasing::default();
            leasing.min_rate_per_second = args.lease_min_rate;
            leasing.max_keys = args.lease_max_keys;
            leasing.lifetime = Duration::from_millis(args.lease_lifetime_ms.max(1));
            leasing.max_lease = args.lease_max.max(1);
            settings.lease = Some(leasing);
        }
        let server = Server::with_redis(config, options, settings)?;
        tokio::spawn(connect_redis(server.clone(), args_redis(&args)));
        server
    } else {
        Server::new(config, options)?
    };
    let grpc = TcpListener::bind(args.grpc_addr).await?;
    let http = TcpListener::bind(args.http_addr).await?;
    tracing::info!(
        grpc = %grpc.local_addr()?,
        http = %http.local_addr()?,
        config_dir = %args.config_dir.display(),
        "tollgate-server listening"
    );
    let mut hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
    let reload = std::sync::Arc::new(tokio::sync::Notify::new());
    let on_hangup = reload.clone();
    tokio::spawn(async move {
        while hangup.recv().await.is_some() {
            on_hangup.notify_one();
        }
    });
    tokio::spawn(watch_config(
        server.clone(),
        args.config_dir.clone(),
        Duration::from_millis(args.reload_check_ms.max(10)),
        reload,
        |result| match result {
            Ok(()) => tracing::info!("configuration reloaded"),
            Err(error) => {
                tracing::error!(%error, "configuration not reloaded; keeping the one in use")
            }
        },
    ));
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let shutdown = async move {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = terminate.recv() => {}
        }
        tracing::info!("shutting down: finishing the calls in flight");
    };
    serve(server, grpc, http, Some(metrics), shutdown).await
}

/// What the Redis connection needs from the flags.
struct RedisArgs {
    urls: Vec<String>,
    cluster: bool,
    timeout: Duration,
}

fn args_redis(args: &Args) -> RedisArgs {
    RedisArgs {
        urls: args
            .redis_url
            .split(',')
            .map(|u| u.trim().to_owned())
            .collect(),
        cluster: args.redis_cluster,
        timeout: Duration::from_millis(args.redis_timeout_ms.max(1)),
    }
}

/// Connects to Redis, retrying until it answers: meanwhile, and whenever
/// Redis is away later, requests are answered by the failure mode.
async fn connect_redis(server: Server, redis: RedisArgs) {
    let options = tollgate_redis::Options::new().timeout(redis.timeout);
    let mut wait = Duration::from_millis(100);
    loop {
        let urls: Vec<&str> = redis.urls.iter().map(String::as_str).collect();
        let client = if redis.cluster {
            tollgate_redis::Client::connect_cluster_with(&urls, options).await
        } else {
            tollgate_redis::Client::connect_with(urls[0], options).await
        };
        match client {
            Ok(client) => {
                server.connect_redis(client);
                tracing::info!(urls = ?redis.urls, "connected to Redis");
                return;
            }
            Err(error) => {
                tracing::warn!(%error, urls = ?redis.urls, "Redis not reachable; retrying");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(5));
            }
        }
    }
}
