//! The blocking API: the async [`Client`](crate::Client) driven by a private
//! one-thread tokio runtime, for code that is not async.

use std::future::Future;
use std::sync::Arc;

use tokio::runtime::Runtime;

use crate::client::Options;
use crate::error::Error;
use crate::limiter::Limiter;
use crate::script::Admission;

/// A blocking client: the same decisions, scripts and timeouts as the async
/// [`Client`](crate::Client), for threads that are not inside an async
/// runtime.
///
/// It owns a one-thread tokio runtime that keeps the connection alive (and
/// reconnects it) in the background; clones share the runtime and the
/// connection. Called from inside an async runtime it returns
/// [`Error::BlockingInAsync`] instead of stalling it.
///
/// ```no_run
/// use tollgate::Rate;
/// use tollgate_redis::{TokenBucket, blocking};
///
/// let client = blocking::Client::connect("redis://127.0.0.1:6379/").unwrap();
/// let bucket = TokenBucket::new("api", 10, Rate::per_second(10)).unwrap();
/// if client.try_acquire(&bucket, "user:42").is_ok() {
///     // serve the request
/// }
/// ```
#[derive(Clone, Debug)]
pub struct Client {
    runtime: Arc<Runtime>,
    inner: crate::Client,
}

impl Client {
    /// Connects to one server with the default [`Options`].
    ///
    /// ```no_run
    /// let client = tollgate_redis::blocking::Client::connect("redis://127.0.0.1:6379/").unwrap();
    /// # let _ = client;
    /// ```
    pub fn connect(url: &str) -> Result<Client, Error> {
        Self::connect_with(url, Options::default())
    }

    /// As [`Client::connect`], with your timeouts.
    ///
    /// ```no_run
    /// use tollgate_redis::{Options, blocking};
    /// let client = blocking::Client::connect_with("redis://127.0.0.1:6379/", Options::new()).unwrap();
    /// # let _ = client;
    /// ```
    pub fn connect_with(url: &str, options: Options) -> Result<Client, Error> {
        Self::start(|| crate::Client::connect_with(url, options))
    }

    /// Connects to a Redis Cluster through any of its nodes.
    ///
    /// ```no_run
    /// use tollgate_redis::{Options, blocking};
    /// let client = blocking::Client::connect_cluster_with(&["redis://10.0.0.1:7000/"], Options::new()).unwrap();
    /// # let _ = client;
    /// ```
    pub fn connect_cluster_with(nodes: &[&str], options: Options) -> Result<Client, Error> {
        Self::start(|| crate::Client::connect_cluster_with(nodes, options))
    }

    fn start<F: Future<Output = Result<crate::Client, Error>>>(
        connect: impl FnOnce() -> F,
    ) -> Result<Client, Error> {
        refuse_inside_runtime()?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("tollgate-redis")
            .enable_all()
            .build()
            .map_err(|err| Error::Redis(err.into()))?;
        let inner = runtime.block_on(connect())?;
        Ok(Client {
            runtime: Arc::new(runtime),
            inner,
        })
    }

    /// The async client underneath, for code that has both kinds of callers.
    ///
    /// ```no_run
    /// # let client = tollgate_redis::blocking::Client::connect("redis://127.0.0.1/").unwrap();
    /// let async_client: tollgate_redis::Client = client.as_async().clone();
    /// # let _ = async_client;
    /// ```
    pub fn as_async(&self) -> &crate::Client {
        &self.inner
    }

    /// As [`crate::Client::try_acquire`], blocking.
    ///
    /// ```no_run
    /// # let client = tollgate_redis::blocking::Client::connect("redis://127.0.0.1/").unwrap();
    /// let rate = tollgate::Rate::per_minute(100);
    /// let window = tollgate_redis::FixedWindow::new("per-ip", rate).unwrap();
    /// let admitted = client.try_acquire(&window, "203.0.113.9").is_ok();
    /// # let _ = admitted;
    /// ```
    pub fn try_acquire<L: Limiter + ?Sized>(
        &self,
        limiter: &L,
        key: &str,
    ) -> Result<Admission, Error> {
        self.try_acquire_n(limiter, key, 1)
    }

    /// As [`crate::Client::try_acquire_n`], blocking.
    ///
    /// ```no_run
    /// # let client = tollgate_redis::blocking::Client::connect("redis://127.0.0.1/").unwrap();
    /// let rate = tollgate::Rate::per_minute(30);
    /// let log = tollgate_redis::SlidingLog::new("per-user", rate).unwrap();
    /// let admission = client.try_acquire_n(&log, "user:42", 2);
    /// # let _ = admission;
    /// ```
    pub fn try_acquire_n<L: Limiter + ?Sized>(
        &self,
        limiter: &L,
        key: &str,
        n: u32,
    ) -> Result<Admission, Error> {
        refuse_inside_runtime()?;
        self.runtime
            .block_on(self.inner.try_acquire_n(limiter, key, n))
    }

    /// As [`crate::Client::try_acquire_n_at`], blocking. Only under the
    /// `test-time` feature.
    #[cfg(feature = "test-time")]
    pub fn try_acquire_n_at<L: Limiter + ?Sized>(
        &self,
        limiter: &L,
        key: &str,
        n: u32,
        now_us: u64,
    ) -> Result<Admission, Error> {
        refuse_inside_runtime()?;
        self.runtime
            .block_on(self.inner.try_acquire_n_at(limiter, key, n, now_us))
    }
}

/// Blocking on a runtime's own thread would stall it (tokio panics instead):
/// say so as an error.
fn refuse_inside_runtime() -> Result<(), Error> {
    if tokio::runtime::Handle::try_current().is_ok() {
        return Err(Error::BlockingInAsync);
    }
    Ok(())
}
