//! The async client: one connection (a single node's `ConnectionManager`, or
//! the cluster client's connection) and the timeouts every decision runs under.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::Slot;
use redis::{ErrorKind, ServerErrorKind, Value};
use tokio::sync::oneshot;

use crate::batch::{self, Batcher, Caller, Decision, Job, Limits};
use crate::error::Error;
use crate::limiter::Limiter;
use crate::metrics;
use crate::micros::MAX_SPAN;
use crate::script::{self, Admission, DECIDE, Library, LuaScript, outcome};

/// How long a decision may take, and how long connecting may take.
///
/// redis-rs waits 500 ms for a reply and 1 s for a connection by default: far
/// too long on a request path, where a limiter that cannot answer should let
/// the caller's policy decide quickly. These defaults are 100 ms and 250 ms.
///
/// ```
/// use std::time::Duration;
/// use tollgate_redis::Options;
///
/// let options = Options::new()
///     .timeout(Duration::from_millis(20))
///     .connect_timeout(Duration::from_millis(100));
/// assert_eq!(options.get_timeout(), Duration::from_millis(20));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    timeout: Duration,
    connect_timeout: Duration,
    max_batch: usize,
    max_calls_in_flight: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            timeout: Duration::from_millis(100),
            connect_timeout: Duration::from_millis(250),
            max_batch: 128,
            max_calls_in_flight: 2,
        }
    }
}

impl Options {
    /// The defaults: 100 ms per decision, 250 ms to connect.
    ///
    /// ```
    /// assert_eq!(tollgate_redis::Options::new(), tollgate_redis::Options::default());
    /// ```
    pub fn new() -> Self {
        Self::default()
    }

    /// The longest a decision may take, reloading a flushed script included;
    /// past it the caller gets [`Error::Timeout`].
    ///
    /// ```
    /// let options = tollgate_redis::Options::new().timeout(std::time::Duration::from_millis(5));
    /// # let _ = options;
    /// ```
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The longest one connection attempt may take.
    ///
    /// ```
    /// let options = tollgate_redis::Options::new().connect_timeout(std::time::Duration::from_secs(1));
    /// # let _ = options;
    /// ```
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The most decisions one call to the server carries (default 128).
    ///
    /// A client sends a lone request at once; requests that arrive while
    /// its calls are in flight queue, and the next call carries all of them
    /// (up to this many decisions; an all-or-nothing request larger than it
    /// goes alone), decided by the server in the order they queued, each as
    /// it would be decided alone in that order. `1` turns batching off:
    /// every request is its own call, with no limit on the calls in flight.
    ///
    /// ```
    /// let unbatched = tollgate_redis::Options::new().max_batch(1);
    /// # let _ = unbatched;
    /// ```
    pub fn max_batch(mut self, decisions: usize) -> Self {
        self.max_batch = decisions.max(1);
        self
    }

    /// How many calls a batching client keeps in flight at once (default
    /// 2): more lets requests wait less for a free call, fewer lets more of
    /// them share one.
    ///
    /// ```
    /// let options = tollgate_redis::Options::new().max_calls_in_flight(4);
    /// # let _ = options;
    /// ```
    pub fn max_calls_in_flight(mut self, calls: usize) -> Self {
        self.max_calls_in_flight = calls.max(1);
        self
    }

    /// The decision timeout.
    ///
    /// ```
    /// assert_eq!(tollgate_redis::Options::new().get_timeout().as_millis(), 100);
    /// ```
    pub fn get_timeout(&self) -> Duration {
        self.timeout
    }
}

/// The connection a client decides on.
#[derive(Clone)]
enum Connection {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

/// An async client: decides for any [`Limiter`] with one `FCALL` of the
/// decision function (loading the crate's library where the server lacks
/// it; `EVALSHA` where the server has no Functions), under a bounded timeout; the
/// limits of one request at once with [`Client::try_acquire_all`].
///
/// Cheap to clone: clones share one multiplexed connection and one batching
/// task. A lone request is sent at once; the requests that queue while the
/// client's calls are in flight go together in the next call, each decided
/// as it would be alone in the order they queued ([`Options::max_batch`]). A single node's
/// connection reconnects in the background after a failure; the decision that
/// met the failure gets the error, which says whether the script may have run
/// ([`Error::may_have_run`]): [`Error::Timeout`] for every expired deadline,
/// [`Error::Interrupted`] for a connection lost after the request may have
/// been sent, [`Error::Redis`] when it provably took nothing (a refused
/// connection, `LOADING`, ...).
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use tollgate::{Denied, Rate};
/// use tollgate_redis::{Client, Error, TokenBucket};
///
/// let client = Client::connect("redis://127.0.0.1:6379/").await?;
/// let bucket = TokenBucket::new("api", 20, Rate::per_second(100))?;
/// match client.try_acquire(&bucket, "user:42").await {
///     Ok(_) => println!("serve the request"),
///     Err(Error::Denied(Denied::RetryAfter(wait))) => println!("429, Retry-After: {wait:?}"),
///     Err(Error::Denied(never)) => println!("400: {never}"),
///     Err(unavailable) => println!("Redis unavailable ({unavailable}): apply your policy"),
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Client {
    connection: Connection,
    options: Options,
    /// The queue of the batching task; `None` when every request is its
    /// own call (batching off, or the batching task's own client).
    batcher: Option<Batcher>,
    /// Set, for the life of the client and its clones, once the server
    /// answered that it has no `FCALL` (Redis before 7): from then on every
    /// call is an `EVALSHA`.
    scripts_only: Arc<AtomicBool>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.connection {
            Connection::Single(_) => "single node",
            Connection::Cluster(_) => "cluster",
        };
        f.debug_struct("Client")
            .field("connection", &kind)
            .field("options", &self.options)
            .finish()
    }
}

impl Client {
    /// Connects to one Redis (or Valkey) server, `redis://host:port/db`, with
    /// the default [`Options`].
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), tollgate_redis::Error> {
    /// let client = tollgate_redis::Client::connect("redis://127.0.0.1:6379/").await?;
    /// # let _ = client; Ok(()) }
    /// ```
    pub async fn connect(url: &str) -> Result<Client, Error> {
        Self::connect_with(url, Options::default()).await
    }

    /// As [`Client::connect`], with your timeouts.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), tollgate_redis::Error> {
    /// use std::time::Duration;
    /// use tollgate_redis::{Client, Options};
    /// let options = Options::new().timeout(Duration::from_millis(20));
    /// let client = Client::connect_with("redis://127.0.0.1:6379/", options).await?;
    /// # let _ = client; Ok(()) }
    /// ```
    pub async fn connect_with(url: &str, options: Options) -> Result<Client, Error> {
        let client = redis::Client::open(url)?;
        let config = redis::aio::ConnectionManagerConfig::new()
            // The decision's own deadline bounds every call: a second one in
            // redis-rs, equal or shorter, would win the race and report an
            // expired deadline as an I/O error.
            .set_response_timeout(None)
            .set_connection_timeout(Some(options.connect_timeout))
            // Reconnection runs in the background; a decision never waits on it
            // for longer than its own timeout.
            .set_number_of_retries(2)
            .set_max_delay(Duration::from_millis(500));
        let manager = tokio::time::timeout(
            options.connect_timeout,
            ConnectionManager::new_with_config(client, config),
        )
        .await
        .map_err(|_| Error::Timeout(options.connect_timeout))??;
        Ok(Self::from_connection_manager(manager, options))
    }

    /// A client on a connection you made, with your [`Options`]: share one
    /// `ConnectionManager` between tollgate and your own commands. Its
    /// response timeout should be off or longer than the options' timeout,
    /// which bounds every decision (otherwise redis-rs's deadline expires
    /// first and reports an I/O error instead of [`Error::Timeout`]).
    ///
    /// Must be called inside a tokio runtime: the client's batching task
    /// runs on it.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use tollgate_redis::{Client, Options, redis};
    /// let redis = redis::Client::open("redis://127.0.0.1:6379/")?;
    /// let config = redis::aio::ConnectionManagerConfig::new().set_response_timeout(None);
    /// let manager = redis::aio::ConnectionManager::new_with_config(redis, config).await?;
    /// let client = Client::from_connection_manager(manager, Options::new());
    /// # let _ = client; Ok(()) }
    /// ```
    pub fn from_connection_manager(manager: ConnectionManager, options: Options) -> Client {
        Client {
            connection: Connection::Single(manager),
            options,
            batcher: None,
            scripts_only: Arc::default(),
        }
        .batched()
    }

    /// A client on a Cluster connection you made, with your [`Options`]
    /// (see [`Client::from_connection_manager`]).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use tollgate_redis::{Client, Options, redis};
    /// let cluster = redis::cluster::ClusterClient::new(vec!["redis://10.0.0.1:7000/"])?;
    /// let connection = cluster.get_async_connection().await?;
    /// let client = Client::from_cluster_connection(connection, Options::new());
    /// # let _ = client; Ok(()) }
    /// ```
    pub fn from_cluster_connection(connection: ClusterConnection, options: Options) -> Client {
        Client {
            connection: Connection::Cluster(connection),
            options,
            batcher: None,
            scripts_only: Arc::default(),
        }
        .batched()
    }

    /// This client with its batching task started, unless batching is off.
    fn batched(mut self) -> Client {
        if self.options.max_batch > 1 {
            let limits = Limits {
                max_batch: self.options.max_batch,
                max_calls_in_flight: self.options.max_calls_in_flight,
            };
            self.batcher = Some(batch::start(self.clone(), limits));
        }
        self
    }

    /// Connects to a Redis Cluster through any of its nodes, with the default
    /// [`Options`]. Each decision goes to the node that owns its key's slot.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), tollgate_redis::Error> {
    /// let nodes = ["redis://10.0.0.1:7000/", "redis://10.0.0.2:7000/"];
    /// let client = tollgate_redis::Client::connect_cluster(&nodes).await?;
    /// # let _ = client; Ok(()) }
    /// ```
    pub async fn connect_cluster(nodes: &[&str]) -> Result<Client, Error> {
        Self::connect_cluster_with(nodes, Options::default()).await
    }

    /// As [`Client::connect_cluster`], with your timeouts.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), tollgate_redis::Error> {
    /// use tollgate_redis::{Client, Options};
    /// let client = Client::connect_cluster_with(&["redis://10.0.0.1:7000/"], Options::new()).await?;
    /// # let _ = client; Ok(()) }
    /// ```
    pub async fn connect_cluster_with(nodes: &[&str], options: Options) -> Result<Client, Error> {
        let client = redis::cluster::ClusterClientBuilder::new(nodes.to_vec())
            .connection_timeout(options.connect_timeout)
            // Above the decision's deadline, which must expire first (see
            // `connect_with`); the cluster client needs one of its own for
            // the topology requests it makes by itself.
            .response_timeout(library_deadline(options.timeout))
            .retries(2)
            .build()?;
        let connection = tokio::time::timeout(
            options.connect_timeout.saturating_mul(4),
            client.get_async_connection(),
        )
        .await
        .map_err(|_| Error::Timeout(options.connect_timeout))??;
        Ok(Self::from_cluster_connection(connection, options))
    }

    /// The options this client runs under.
    ///
    /// ```no_run
    /// # async fn demo(client: tollgate_redis::Client) {
    /// println!("{:?}", client.options().get_timeout());
    /// # }
    /// ```
    pub fn options(&self) -> &Options {
        &self.options
    }

    /// Asks `limiter` for one permit for the caller's `key`.
    ///
    /// ```no_run
    /// # async fn demo(client: tollgate_redis::Client) -> Result<(), tollgate_redis::Error> {
    /// use tollgate::Rate;
    /// let window = tollgate_redis::FixedWindow::new("per-ip", Rate::per_minute(100)).unwrap();
    /// client.try_acquire(&window, "203.0.113.9").await?;
    /// # Ok(()) }
    /// ```
    pub async fn try_acquire<L: Limiter + ?Sized>(
        &self,
        limiter: &L,
        key: &str,
    ) -> Result<Admission, Error> {
        self.try_acquire_n(limiter, key, 1).await
    }

    /// Asks `limiter` for `n` permits at once for `key`: all of them, or none.
    ///
    /// One round trip (`FCALL`; two more, once, after the server lost the
    /// library). Errors: [`Error::Denied`] with the limiter's decision —
    /// `ZeroPermits` and `ExceedsCapacity` without a round trip — or why no
    /// decision could be had.
    ///
    /// ```no_run
    /// # async fn demo(client: tollgate_redis::Client) -> Result<(), tollgate_redis::Error> {
    /// use tollgate::Rate;
    /// let log = tollgate_redis::SlidingLog::new("per-user", Rate::per_minute(30)).unwrap();
    /// let admission = client.try_acquire_n(&log, "user:42", 3).await?;
    /// println!("{} left this minute", admission.remaining);
    /// # Ok(()) }
    /// ```
    pub async fn try_acquire_n<L: Limiter + ?Sized>(
        &self,
        limiter: &L,
        key: &str,
        n: u32,
    ) -> Result<Admission, Error> {
        self.decide(limiter, key, n, None).await
    }

    /// As [`Client::try_acquire_n`] at a time the caller gives, in µs since
    /// the Unix epoch, instead of the server's `TIME`: for tests that replay a
    /// timeline. Only under the `test-time` feature.
    #[cfg(feature = "test-time")]
    pub async fn try_acquire_n_at<L: Limiter + ?Sized>(
        &self,
        limiter: &L,
        key: &str,
        n: u32,
        now_us: u64,
    ) -> Result<Admission, Error> {
        self.decide(limiter, key, n, Some(now_us)).await
    }

    /// Decides `n` permits for `key`: the core's request check, then the
    /// decision script (a call of its own, or a place in a batch).
    async fn decide<L: Limiter + ?Sized>(
        &self,
        limiter: &L,
        key: &str,
        n: u32,
        now_us: Option<u64>,
    ) -> Result<Admission, Error> {
        let result = async {
            tollgate::check_request(n, limiter.capacity())?;
            let redis_key = limiter.redis_key(key);
            let arguments = limiter.plan().arguments(n, true);
            let mut replies = self
                .submit(vec![(redis_key.clone(), arguments)], now_us)
                .await?;
            outcome(replies.pop().unwrap_or(Value::Nil), &redis_key)
        }
        .await;
        metrics::request(false, &result.as_ref());
        result
    }

    /// Decides one all-or-nothing group (its last decision ends it): through
    /// the batching task, or as a call of its own. One reply per decision.
    pub(crate) async fn submit(
        &self,
        decisions: Vec<Decision>,
        now_us: Option<u64>,
    ) -> Result<Vec<Value>, Error> {
        let slot = self.slot_of(&decisions)?;
        let alone = match &self.batcher {
            None => None,
            // A free call slot: go alone, now, holding it.
            Some(batcher) => Arc::clone(&batcher.slots).try_acquire_owned().ok(),
        };
        let Some(batcher) = self.batcher.as_ref().filter(|_| alone.is_none()) else {
            metrics::batch(1, decisions.len());
            let replies = self.decide_call(decisions.iter(), now_us).await;
            drop(alone);
            return replies.and_then(|replies| {
                if replies.len() == decisions.len() {
                    Ok(replies)
                } else {
                    Err(Error::UnexpectedReply(format!(
                        "{} replies to {} decisions",
                        replies.len(),
                        decisions.len()
                    )))
                }
            });
        };
        let (reply, answer) = oneshot::channel();
        let job = Job {
            decisions,
            now_us,
            slot,
            reply,
        };
        if batcher.queue.send(job).is_err() {
            // The task ends only with its runtime: nothing was sent.
            return Err(Error::Redis(redis::RedisError::from((
                ErrorKind::Client,
                "the client's batching task has stopped (its tokio runtime shut down)",
            ))));
        }
        match tokio::time::timeout(self.options.timeout, answer).await {
            Ok(Ok(result)) => result,
            // Dropped unanswered: the task stopped, perhaps mid-call.
            Ok(Err(_)) => Err(Error::Interrupted(redis::RedisError::from((
                ErrorKind::Client,
                "the client's batching task stopped before answering",
            )))),
            Err(_) => Err(Error::Timeout(self.options.timeout)),
        }
    }

    /// The Cluster slot every key of `decisions` lies in (`None` on a single
    /// node), or the error of a call that would span slots.
    fn slot_of(&self, decisions: &[Decision]) -> Result<Option<Slot>, Error> {
        if !matches!(self.connection, Connection::Cluster(_)) {
            return Ok(None);
        }
        let Some((first, _)) = decisions.first() else {
            return Ok(None);
        };
        let slot = Slot::for_key(first);
        for (key, _) in decisions {
            if Slot::for_key(key) != slot {
                return Err(Error::InvalidCall(format!(
                    "keys {first:?} and {key:?} lie in different Cluster slots; one call \
                     decides keys of one slot only (the same hash tag)"
                )));
            }
        }
        Ok(Some(slot))
    }

    /// One call of the decision script for `decisions` (their groups as
    /// their last arguments say) under the timeout: the replies, one per
    /// decision.
    async fn decide_call<'a>(
        &self,
        decisions: impl Iterator<Item = &'a Decision>,
        now_us: Option<u64>,
    ) -> Result<Vec<Value>, Error> {
        let mut keys = Vec::new();
        let mut args = Vec::new();
        for (key, arguments) in decisions {
            keys.push(key.as_str());
            args.extend_from_slice(arguments);
        }
        // Four items a decision, one flat array (fewer Lua tables to build).
        match self.invoke(&DECIDE, &keys, args, now_us).await? {
            Value::Array(items) if items.len() % 4 == 0 => {
                let mut items = items.into_iter();
                let mut replies = Vec::with_capacity(items.len() / 4);
                while let (Some(a), Some(b), Some(c), Some(d)) =
                    (items.next(), items.next(), items.next(), items.next())
                {
                    replies.push(Value::Array(vec![a, b, c, d]));
                }
                Ok(replies)
            }
            other => Err(Error::UnexpectedReply(format!("{other:?}"))),
        }
    }

    /// Runs `script` on one key with integer arguments under the timeout, at
    /// the server's time or (`now_us`, test builds) a replayed one.
    pub(crate) async fn eval(
        &self,
        script: &LuaScript,
        key: &str,
        args: &[u64],
        now_us: Option<u64>,
    ) -> Result<Value, Error> {
        self.invoke(script, &[key], args.to_vec(), now_us).await
    }

    /// Every script's one way to Redis: calls `script` on `keys` with `args`
    /// (and the replayed time, in test builds, as the last argument) under
    /// the timeout.
    async fn invoke(
        &self,
        script: &LuaScript,
        keys: &[&str],
        mut args: Vec<u64>,
        now_us: Option<u64>,
    ) -> Result<Value, Error> {
        if let Some(now) = now_us {
            assert!(now < MAX_SPAN, "test times stay below 2^51 µs");
            args.push(now);
        }
        let library = script::library(now_us);
        let started = std::time::Instant::now();
        let reply = self.deadline(self.run(library, script, keys, &args)).await;
        metrics::call(script.name, &reply, started.elapsed());
        reply
    }

    /// One script call: `FCALL` of the library's function, loading the
    /// library first when the server does not have it (the first call, or
    /// after a restart without persistence or a `FUNCTION FLUSH`), or
    /// `EVALSHA` (reloading the script on `NOSCRIPT`) on a server without
    /// Functions.
    async fn run(
        &self,
        library: &Library,
        script: &LuaScript,
        keys: &[&str],
        args: &[u64],
    ) -> Result<Value, CallError> {
        // Relaxed: the flag only picks the command's form, and either form
        // decides the same; a call that misses a store just asks FCALL once
        // more and gets the same answer.
        if !self.scripts_only.load(Ordering::Relaxed) {
            let mut fcall = redis::cmd("FCALL");
            fcall
                .arg(library.function(script))
                .arg(keys.len())
                .arg(keys)
                .arg(args);
            match self.query(&fcall).await {
                Err(err) if function_missing(&err) => {
                    // Nothing ran: load (every master of a Cluster), then
                    // call again. A load that fails took nothing either; one
                    // the user may not make (an ACL without `FUNCTION LOAD`)
                    // leaves scripts, which need no load of their own.
                    let mut load = redis::cmd("FUNCTION");
                    load.arg("LOAD").arg("REPLACE").arg(&library.text);
                    match self.query(&load).await {
                        Ok(_) => return self.query(&fcall).await.map_err(CallError::Sent),
                        Err(err) if err.code() == Some("NOPERM") => {
                            self.scripts_only.store(true, Ordering::Relaxed);
                        }
                        Err(err) => return Err(CallError::Refused(err)),
                    }
                }
                Err(err) if functions_unknown(&err) => {
                    // Redis before 7: scripts from now on.
                    self.scripts_only.store(true, Ordering::Relaxed);
                }
                result => return result.map_err(CallError::Sent),
            }
        }
        let mut invocation = library.script(script).prepare_invoke();
        for key in keys {
            invocation.key(*key);
        }
        for arg in args {
            invocation.arg(*arg);
        }
        let reply = match &self.connection {
            Connection::Single(manager) => {
                invocation.invoke_async::<Value>(&mut manager.clone()).await
            }
            Connection::Cluster(cluster) => {
                invocation.invoke_async::<Value>(&mut cluster.clone()).await
            }
        };
        reply.map_err(CallError::Sent)
    }

    /// Sends one command on the client's connection.
    async fn query(&self, command: &redis::Cmd) -> redis::RedisResult<Value> {
        match &self.connection {
            Connection::Single(manager) => command.query_async(&mut manager.clone()).await,
            Connection::Cluster(cluster) => command.query_async(&mut cluster.clone()).await,
        }
    }

    /// Runs one call under the decision timeout and says, on failure, whether
    /// the script may have run.
    async fn deadline(
        &self,
        call: impl Future<Output = Result<Value, CallError>>,
    ) -> Result<Value, Error> {
        let timeout = self.options.timeout;
        match tokio::time::timeout(timeout, call).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(CallError::Refused(err))) if !err.is_timeout() => Err(Error::Redis(err)),
            Ok(Err(CallError::Refused(err) | CallError::Sent(err))) => Err(classify(
                err,
                timeout,
                matches!(self.connection, Connection::Cluster(_)),
            )),
            Err(_) => Err(Error::Timeout(timeout)),
        }
    }
}

/// A failed call's error, and whether the script call itself was sent.
enum CallError {
    /// Failed before the script was called (loading the library).
    Refused(redis::RedisError),
    /// The script call's own error.
    Sent(redis::RedisError),
}

/// `FCALL`'s answer when the server does not have the function: nothing ran.
fn function_missing(err: &redis::RedisError) -> bool {
    err.code() == Some("ERR")
        && err
            .detail()
            .is_some_and(|detail| detail.starts_with("Function not found"))
}

/// The answer of a server without Functions (Redis before 7) to `FCALL`.
fn functions_unknown(err: &redis::RedisError) -> bool {
    err.code() == Some("ERR")
        && err
            .detail()
            .is_some_and(|detail| detail.starts_with("unknown command"))
}

impl Caller for Client {
    fn call<'a>(
        &'a self,
        decisions: &'a [&'a Decision],
        now_us: Option<u64>,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<Vec<Value>, Error>> + Send + 'a>> {
        Box::pin(self.decide_call(decisions.iter().copied(), now_us))
    }
}

/// redis-rs's own response deadline: comfortably after the decision's.
fn library_deadline(timeout: Duration) -> Duration {
    timeout
        .saturating_mul(2)
        .max(timeout.saturating_add(Duration::from_secs(1)))
}

/// A failed call's error: [`Error::Timeout`] for every expired deadline,
/// [`Error::Redis`] only when the error proves that no permit was taken,
/// [`Error::Interrupted`] otherwise. A cluster client resends a request after
/// some failures (a dropped connection, `TRYAGAIN`, ...), so its final error
/// need not be its first attempt's: only a configuration error proves
/// anything there.
fn classify(err: redis::RedisError, timeout: Duration, resends: bool) -> Error {
    if err.is_timeout() {
        return Error::Timeout(timeout);
    }
    let refused = if resends {
        err.kind() == ErrorKind::InvalidClientConfig
    } else {
        refused_before_writing(&err)
    };
    if refused {
        Error::Redis(err)
    } else {
        Error::Interrupted(err)
    }
}

/// Errors that leave no doubt that the script took nothing: the request never
/// left (a refused connection, a client-side error), or the server refused
/// it before the script could write. An `OOM` or `READONLY` reply comes at a
/// script's first write at the latest, and every script here checks
/// everything before its first write and then only writes.
fn refused_before_writing(err: &redis::RedisError) -> bool {
    if err.is_connection_refusal() {
        return true;
    }
    match err.kind() {
        ErrorKind::InvalidClientConfig | ErrorKind::Client | ErrorKind::AuthenticationFailed => {
            true
        }
        ErrorKind::Server(
            ServerErrorKind::BusyLoading
            | ServerErrorKind::NoScript
            | ServerErrorKind::ReadOnly
            | ServerErrorKind::MasterDown,
        ) => true,
        _ => matches!(err.code(), Some("BUSY" | "OOM" | "NOAUTH")),
    }
}
