//! The service: the configuration and the limits' state behind one pointer
//! that a reload swaps, answered over gRPC and as JSON.

use std::sync::Arc;
use std::time::Instant;

use arc_swap::ArcSwap;
use tonic::{Request, Response, Status};

use crate::config::{Config, Failure, InvalidRule};
use crate::decide::{BadRequest, Bounds, Decided, Mode, Plan, ResponseHeaders, Seen, answer, plan};
use crate::leased::Leases;
use crate::memory::{Definition, Stores};
use crate::metrics;
use crate::proto::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use crate::proto::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use crate::redis::{Redis, RedisLimits, RedisSettings};

/// Settings of a [`Server`] beyond its configuration files.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct Options {
    /// Bounds on one request's descriptors and matched limits.
    pub bounds: Bounds,
    /// Keys each limit keeps before new keys share one overflow state (which
    /// admits no more than one key's limit: never an over-admission).
    pub max_keys_per_limit: usize,
    /// How many calls [`serve`](crate::serve) lets in at once before it
    /// sheds the next with `UNAVAILABLE` (HTTP `503`) instead of queueing
    /// it.
    pub in_flight: InFlight,
    /// Headers the answers ask the proxy to add to the client's response.
    pub response_headers: ResponseHeaders,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            bounds: Bounds::default(),
            max_keys_per_limit: 1 << 20,
            in_flight: InFlight::default(),
            response_headers: ResponseHeaders::default(),
        }
    }
}

/// The server's own bound on calls in flight: past it, a call is shed at
/// once with gRPC `UNAVAILABLE` (which clients and Envoy retry or fail
/// over), so an overloaded server answers fast instead of queueing every
/// call past its deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum InFlight {
    /// No bound.
    Unlimited,
    /// At most this many (a [`tollgate::ConcurrencyLimit`]). The default
    /// is 1,024: far above what a healthy server holds (a decision takes
    /// microseconds), so it sheds only a pile-up.
    Fixed(u32),
    /// A bound that follows the calls' round-trip times
    /// ([`tollgate::RoundTrip`]'s defaults): it grows while latency holds
    /// and shrinks when it rises. A decision's round trip is mostly the
    /// network's and the client's, so on a busy loopback it sheds calls a
    /// fixed bound would have answered (docs/benchmarks.md measures it):
    /// for servers whose latency is their own.
    Adaptive,
}

impl Default for InFlight {
    fn default() -> Self {
        InFlight::Fixed(1024)
    }
}

impl std::str::FromStr for InFlight {
    type Err = String;

    fn from_str(s: &str) -> Result<InFlight, String> {
        match s {
            "unlimited" => Ok(InFlight::Unlimited),
            "adaptive" => Ok(InFlight::Adaptive),
            n => match n.parse::<u32>() {
                Ok(n) if n > 0 => Ok(InFlight::Fixed(n)),
                _ => Err(format!(
                    "{s:?}: `unlimited`, `adaptive`, or a number of calls above 0"
                )),
            },
        }
    }
}

/// A configuration and its limits' state.
struct Loaded {
    config: Config,
    /// The memory backend's state: every decision's without Redis, and the
    /// fallback's with [`Failure::Local`].
    stores: Stores,
    /// The Redis backend's limiters, when the server has one.
    redis: Option<RedisLimits>,
    /// The leased backend's leases, when the server leases.
    leases: Option<Leases>,
}

/// Envoy's rate limit service on tollgate's limits, in this process.
///
/// ```
/// use tollgate_server::config::Config;
/// use tollgate_server::proto::envoy::extensions::common::ratelimit::v3::{
///     RateLimitDescriptor, rate_limit_descriptor::Entry,
/// };
/// use tollgate_server::proto::envoy::service::ratelimit::v3::{
///     RateLimitRequest, rate_limit_response::Code,
/// };
/// use tollgate_server::{Options, Server};
///
/// let yaml = "
/// domain: api
/// descriptors:
///   - key: user
///     rate_limit: { unit: minute, requests_per_unit: 2 }
/// ";
/// let config = Config::from_files([("api.yaml", yaml)]).unwrap();
/// let server = Server::new(config, Options::default()).unwrap();
/// let request = RateLimitRequest {
///     domain: "api".into(),
///     descriptors: vec![RateLimitDescriptor {
///         entries: vec![Entry { key: "user".into(), value: "alice".into() }],
///         ..Default::default()
///     }],
///     hits_addend: 0,
/// };
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let mut codes = Vec::new();
/// for _ in 0..3 {
///     codes.push(server.should_rate_limit(&request).await.unwrap().overall_code());
/// }
/// assert_eq!(codes, [Code::Ok, Code::Ok, Code::OverLimit]);
/// # });
/// ```
#[derive(Clone)]
pub struct Server {
    inner: Arc<Inner>,
}

struct Inner {
    loaded: ArcSwap<Loaded>,
    options: Options,
    redis: Option<Redis>,
    /// Reloads run one at a time: each builds on the state the last left.
    reloading: parking_lot::Mutex<()>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("options", &self.inner.options)
            .finish_non_exhaustive()
    }
}

fn stores(
    config: &Config,
    previous: Option<&Stores>,
    options: &Options,
) -> Result<Stores, InvalidRule> {
    let rules = config.domains().flat_map(|d| d.rules()).filter_map(|rule| {
        // Unlimited rules and rules of 0 requests keep no state.
        let rate = rule.rate().filter(|_| !rule.blocks_all())?;
        Some((
            &rule.id,
            Definition {
                algorithm: rule.algorithm,
                rate,
            },
        ))
    });
    Stores::build(rules, previous, options.max_keys_per_limit).map_err(|(id, error)| InvalidRule {
        rule: id.to_string(),
        error,
    })
}

/// The Redis backend's limiters and the leased backend's leases of
/// `config`, as `redis`'s settings ask.
fn redis_limits(
    config: &Config,
    redis: Option<&Redis>,
    previous: Option<&Leases>,
) -> Result<(Option<RedisLimits>, Option<Leases>), InvalidRule> {
    let Some(redis) = redis else {
        return Ok((None, None));
    };
    let prefix = &redis.settings.prefix;
    let limits = RedisLimits::build(config, prefix)?;
    let leases = match redis.settings.lease {
        Some(leasing) => Some(Leases::build(config, prefix, leasing, previous)?),
        None => None,
    };
    Ok((Some(limits), leases))
}

impl Server {
    /// A server deciding on `config`'s rules in this process (the memory
    /// backend), every limit full.
    ///
    /// Errors: [`InvalidRule`] for a rule the limiters refuse.
    pub fn new(config: Config, options: Options) -> Result<Server, InvalidRule> {
        Server::build(config, options, None)
    }

    /// A server deciding on `config`'s rules in Redis (the Redis backend):
    /// every replica with the same Redis and prefix shares the limits. Until
    /// [`connect_redis`](Server::connect_redis) gives it a client, and
    /// whenever Redis does not answer within the client's timeout, a
    /// request is answered as `redis.failure` says.
    ///
    /// ```
    /// use tollgate_server::config::Config;
    /// use tollgate_server::{Failure, Options, RedisSettings, Server};
    ///
    /// let config = Config::from_files([("a.yaml", "domain: a\ndescriptors: []\n")]).unwrap();
    /// let mut redis = RedisSettings::default();
    /// redis.failure = Failure::Closed;
    /// let server = Server::with_redis(config, Options::default(), redis).unwrap();
    /// assert!(!server.redis_connected());
    /// ```
    ///
    /// Errors: [`InvalidRule`] for a rule the limiters refuse.
    pub fn with_redis(
        config: Config,
        options: Options,
        redis: RedisSettings,
    ) -> Result<Server, InvalidRule> {
        Server::build(config, options, Some(Redis::new(redis)))
    }

    fn build(
        config: Config,
        options: Options,
        redis: Option<Redis>,
    ) -> Result<Server, InvalidRule> {
        let stores = stores(&config, None, &options)?;
        let (limits, leases) = redis_limits(&config, redis.as_ref(), None)?;
        Ok(Server {
            inner: Arc::new(Inner {
                loaded: ArcSwap::from_pointee(Loaded {
                    config,
                    stores,
                    redis: limits,
                    leases,
                }),
                options,
                redis,
                reloading: parking_lot::Mutex::new(()),
            }),
        })
    }

    /// Gives a server made by [`with_redis`](Server::with_redis) its Redis
    /// client (replacing any it had); a server without the Redis backend
    /// ignores it.
    pub fn connect_redis(&self, client: tollgate_redis::Client) {
        if let Some(redis) = &self.inner.redis {
            redis.client.store(Some(Arc::new(client)));
        }
    }

    /// Whether the Redis backend has a client.
    pub fn redis_connected(&self) -> bool {
        self.inner
            .redis
            .as_ref()
            .is_some_and(|r| r.client.load().is_some())
    }

    /// Decides with `config` from now on. A rule of the same identity
    /// (domain, place in the descriptor tree, position) and definition keeps
    /// its state; one whose rate changed under the same algorithm carries
    /// its state over proportionally (a limit half used stays half used);
    /// one whose algorithm changed, or a new one, starts full. Requests in
    /// flight finish on the configuration they started with. On the Redis
    /// backend the state stays in Redis under the same keys: a changed rate
    /// applies to the state as it is (a window's count, a bucket's time).
    ///
    /// Errors: [`InvalidRule`]; the server keeps deciding with what it had.
    pub fn reload(&self, config: Config) -> Result<(), InvalidRule> {
        let _one = self.inner.reloading.lock();
        let previous = self.inner.loaded.load();
        let built =
            stores(&config, Some(&previous.stores), &self.inner.options).and_then(|stores| {
                let redis =
                    redis_limits(&config, self.inner.redis.as_ref(), previous.leases.as_ref())?;
                Ok((stores, redis))
            });
        metrics::reload(built.is_ok());
        let (stores, (redis, leases)) = built?;
        self.inner.loaded.store(Arc::new(Loaded {
            config,
            stores,
            redis,
            leases,
        }));
        Ok(())
    }

    /// Decides one request: Envoy's `ShouldRateLimit`.
    ///
    /// Errors: [`BadRequest`] for a request the protocol cannot answer (no
    /// domain, no descriptor, beyond the server's bounds).
    pub async fn should_rate_limit(
        &self,
        request: &RateLimitRequest,
    ) -> Result<RateLimitResponse, BadRequest> {
        self.decide(request).await.map(|(response, _)| response)
    }

    pub(crate) async fn decide(
        &self,
        request: &RateLimitRequest,
    ) -> Result<(RateLimitResponse, Decided), BadRequest> {
        // Held across the Redis call: a reload meanwhile swaps in another.
        let loaded = self.inner.loaded.load_full();
        // A label value the configuration bounds: clients choose domains.
        let domain = match loaded.config.domain(&request.domain) {
            Some(d) => d.name(),
            None => "unknown",
        };
        let mut plan = match plan(&loaded.config, self.inner.options.bounds, request) {
            Ok(plan) => plan,
            Err(bad) => {
                metrics::invalid(domain);
                return Err(bad);
            }
        };
        let started = Instant::now();
        let decided = self.decide_plan(&loaded, domain, &mut plan).await;
        let (seen, admitted) = match decided {
            Ok(decided) => decided,
            Err(bad) => {
                metrics::invalid(domain);
                return Err(bad);
            }
        };
        metrics::backend_duration(
            match (&loaded.redis, &loaded.leases) {
                (_, Some(_)) => "leased",
                (Some(_), None) => "redis",
                (None, None) => "memory",
            },
            started.elapsed(),
        );
        metrics::decided(domain, &plan, &seen, admitted);
        Ok(answer(
            plan,
            seen,
            admitted,
            self.inner.options.response_headers,
        ))
    }

    /// The backend's decision of `plan`: Redis's when the server has it and
    /// it answers, else as the failure mode says; the memory backend's
    /// otherwise.
    async fn decide_plan(
        &self,
        loaded: &Loaded,
        domain: &str,
        plan: &mut Plan<'_>,
    ) -> Result<(Vec<Seen>, bool), BadRequest> {
        let (Some(redis), Some(limits)) = (&self.inner.redis, &loaded.redis) else {
            return loaded.stores.decide(plan);
        };
        let client = redis.client.load_full();
        let decided = match &client {
            Some(client) => match &loaded.leases {
                Some(leases) => crate::leased::decide(leases, limits, client, domain, plan).await,
                None => {
                    let seen = vec![Seen::NotAsked; plan.checks.len()];
                    crate::redis::decide(limits, client, domain, plan, seen).await
                }
            },
            None => Err(crate::redis::Unanswered::NotConnected),
        };
        let why = match decided {
            Ok(decided) => return Ok(decided),
            Err(why) => why,
        };
        let failure = loaded
            .config
            .domain(domain)
            .and_then(|d| d.failure())
            .unwrap_or(redis.settings.failure);
        tracing::warn!(%domain, error = %why, ?failure, "Redis did not decide; answered by the failure mode");
        Ok(match failure {
            Failure::Open => {
                metrics::backend_failure(domain, "open");
                (vec![Seen::NotAsked; plan.checks.len()], true)
            }
            Failure::Closed => {
                metrics::backend_failure(domain, "closed");
                let seen: Vec<Seen> = plan
                    .checks
                    .iter()
                    .map(|c| match c.mode {
                        Mode::Enforced => Seen::Unanswered,
                        _ => Seen::NotAsked,
                    })
                    .collect();
                // Refused when a limit of it could not be decided; a
                // request of no limit needs no Redis.
                let admitted = !seen.iter().any(|s| matches!(s, Seen::Unanswered));
                (seen, admitted)
            }
            Failure::Local => {
                metrics::backend_failure(domain, "local");
                loaded.stores.decide(plan)?
            }
        })
    }

    /// Whether the server decides with a configuration loaded from the same
    /// files and texts as `config`.
    pub(crate) fn loaded_from(&self, config: &Config) -> bool {
        self.inner.loaded.load().config.same_sources(config)
    }

    /// The options the server was made with.
    pub fn options(&self) -> &Options {
        &self.inner.options
    }

    /// Keys held by every limit of the memory backend now (on the Redis
    /// backends: the keys the failure mode `local` decided).
    pub fn keys(&self) -> usize {
        self.inner.loaded.load().stores.keys()
    }

    /// Keys whose limits this process holds leases of now (the leased
    /// backend; 0 on the others).
    pub fn leased_keys(&self) -> usize {
        self.inner
            .loaded
            .load()
            .leases
            .as_ref()
            .map_or(0, Leases::keys)
    }

    /// The gRPC service, for a tonic server's `add_service`.
    pub fn grpc(&self) -> RateLimitServiceServer<Server> {
        RateLimitServiceServer::new(self.clone())
    }
}

#[tonic::async_trait]
impl RateLimitService for Server {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let request = request.get_ref();
        match self.decide(request).await {
            Ok((response, outcome)) => {
                tracing::debug!(
                    domain = %request.domain,
                    descriptors = request.descriptors.len(),
                    admitted = outcome.admitted,
                    shadow_refusals = outcome.shadow_refusals,
                    "decided"
                );
                Ok(Response::new(response))
            }
            Err(bad) => {
                tracing::debug!(domain = %request.domain, error = %bad, "bad request");
                Err(Status::invalid_argument(bad.to_string()))
            }
        }
    }
}
