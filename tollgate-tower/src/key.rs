//! Who a request counts against: the key every keyed policy is asked about.
//!
//! A [`KeyExtractor`] reads the request's head (method, URI, headers and
//! extensions — never the body) and returns the key, or a [`KeyError`] that
//! the layer turns into a response of its own (see
//! [`ThrottleBuilder::on_key_error`](crate::ThrottleBuilder::on_key_error)):
//! a request whose key cannot be found is neither let through unlimited nor
//! allowed to panic the service.

use std::fmt;
use std::net::{IpAddr, SocketAddr};

use http::request::Parts;
use http::{HeaderName, StatusCode};

/// Finds the key of a request.
///
/// ```
/// use http::Request;
/// use tollgate_tower::{HeaderKey, KeyExtractor};
///
/// let (parts, ()) = Request::get("/").header("x-api-key", "k-42").body(()).unwrap().into_parts();
/// assert_eq!(HeaderKey::new("x-api-key").extract(&parts).unwrap(), "k-42");
/// ```
pub trait KeyExtractor: Send + Sync + 'static {
    /// The key: an address, a header's value, `()` for one global key, ...
    type Key: Clone + Send + Sync + 'static;

    /// The key of the request whose head is `parts`.
    ///
    /// Errors: a [`KeyError`] when the request carries no usable key.
    fn extract(&self, parts: &Parts) -> Result<Self::Key, KeyError>;
}

/// Why a request's key could not be found, with the status the default
/// response gives it.
///
/// ```
/// use http::StatusCode;
/// use tollgate_tower::KeyError;
///
/// let err = KeyError::new(StatusCode::UNAUTHORIZED, "no API key");
/// assert_eq!(err.status(), StatusCode::UNAUTHORIZED);
/// assert_eq!(err.to_string(), "no API key");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyError {
    status: StatusCode,
    reason: String,
}

impl KeyError {
    /// A key error answered with `status`, saying `reason`.
    ///
    /// ```
    /// use http::StatusCode;
    /// use tollgate_tower::KeyError;
    /// assert_eq!(KeyError::new(StatusCode::BAD_REQUEST, "bad").status(), StatusCode::BAD_REQUEST);
    /// ```
    pub fn new(status: StatusCode, reason: impl Into<String>) -> Self {
        KeyError {
            status,
            reason: reason.into(),
        }
    }

    /// The status of the default response.
    ///
    /// ```
    /// use http::StatusCode;
    /// use tollgate_tower::KeyError;
    /// assert_eq!(KeyError::new(StatusCode::BAD_REQUEST, "x").status().as_u16(), 400);
    /// ```
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// What was missing or wrong.
    ///
    /// ```
    /// use http::StatusCode;
    /// use tollgate_tower::KeyError;
    /// assert_eq!(KeyError::new(StatusCode::BAD_REQUEST, "x").reason(), "x");
    /// ```
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason)
    }
}

impl std::error::Error for KeyError {}

/// The peer's address as the server saw the connection: axum's
/// `ConnectInfo<SocketAddr>` (served with
/// `into_make_service_with_connect_info::<SocketAddr>()`), or a plain
/// [`SocketAddr`] a hyper service inserted into the request's extensions.
/// IPv4-mapped IPv6 addresses (`::ffff:192.0.2.7`, from dual-stack sockets)
/// are returned as the IPv4 address, so one client has one key.
///
/// Errors: `500` when neither is there — a server wiring mistake, not the
/// client's.
pub(crate) fn peer_addr(parts: &Parts) -> Result<IpAddr, KeyError> {
    #[cfg(feature = "axum")]
    if let Some(info) = parts
        .extensions
        .get::<axum::extract::ConnectInfo<SocketAddr>>()
    {
        return Ok(info.0.ip().to_canonical());
    }
    match parts.extensions.get::<SocketAddr>() {
        Some(addr) => Ok(addr.ip().to_canonical()),
        None => Err(KeyError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "no peer address on the request: serve axum with \
             into_make_service_with_connect_info::<SocketAddr>(), or insert the \
             connection's SocketAddr into the request's extensions",
        )),
    }
}

/// The key is the peer's IP address (see [`ForwardedIp`](crate::ForwardedIp)
/// behind a proxy). Reads axum's `ConnectInfo<SocketAddr>` (feature `axum`,
/// on by default) or a [`SocketAddr`] in the request's extensions (what a
/// hyper service inserts); answers `500` when neither is present.
///
/// ```
/// use std::net::SocketAddr;
/// use http::Request;
/// use tollgate_tower::{KeyExtractor, PeerIp};
///
/// let mut request = Request::get("/").body(()).unwrap();
/// request.extensions_mut().insert("192.0.2.7:5000".parse::<SocketAddr>().unwrap());
/// let (parts, ()) = request.into_parts();
/// assert_eq!(PeerIp.extract(&parts).unwrap().to_string(), "192.0.2.7");
///
/// let (bare, ()) = Request::get("/").body(()).unwrap().into_parts();
/// assert_eq!(PeerIp.extract(&bare).unwrap_err().status().as_u16(), 500);
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct PeerIp;

impl KeyExtractor for PeerIp {
    type Key = IpAddr;

    fn extract(&self, parts: &Parts) -> Result<IpAddr, KeyError> {
        peer_addr(parts)
    }
}

/// The key is a header's value (an API key, a tenant id). A request without
/// the header, or with it more than once, or with a value that is not
/// visible ASCII, gets `400` (change it with
/// [`HeaderKey::missing_status`]).
///
/// ```
/// use http::{Request, StatusCode};
/// use tollgate_tower::{HeaderKey, KeyExtractor};
///
/// let by_key = HeaderKey::new("x-api-key").missing_status(StatusCode::UNAUTHORIZED);
/// let (parts, ()) = Request::get("/").body(()).unwrap().into_parts();
/// assert_eq!(by_key.extract(&parts).unwrap_err().status(), StatusCode::UNAUTHORIZED);
/// ```
#[derive(Debug, Clone)]
pub struct HeaderKey {
    name: HeaderName,
    missing: StatusCode,
}

impl HeaderKey {
    /// Keys requests by header `name`.
    ///
    /// # Panics
    ///
    /// When `name` is not a valid header name: it is a constant of the
    /// program, so a typo fails at startup (use [`HeaderKey::from_name`] with
    /// a name from configuration).
    ///
    /// ```
    /// use tollgate_tower::HeaderKey;
    /// let _ = HeaderKey::new("x-tenant");
    /// ```
    pub fn new(name: &'static str) -> Self {
        Self::from_name(HeaderName::from_static(name))
    }

    /// Keys requests by header `name`, already parsed.
    ///
    /// ```
    /// use http::header::AUTHORIZATION;
    /// use tollgate_tower::HeaderKey;
    /// let _ = HeaderKey::from_name(AUTHORIZATION);
    /// ```
    pub fn from_name(name: HeaderName) -> Self {
        HeaderKey {
            name,
            missing: StatusCode::BAD_REQUEST,
        }
    }

    /// The status for a request without a usable header (default `400`).
    ///
    /// ```
    /// use http::StatusCode;
    /// use tollgate_tower::HeaderKey;
    /// let _ = HeaderKey::new("x-api-key").missing_status(StatusCode::UNAUTHORIZED);
    /// ```
    pub fn missing_status(mut self, status: StatusCode) -> Self {
        self.missing = status;
        self
    }
}

impl KeyExtractor for HeaderKey {
    type Key = String;

    fn extract(&self, parts: &Parts) -> Result<String, KeyError> {
        let mut values = parts.headers.get_all(&self.name).iter();
        match (values.next(), values.next()) {
            (Some(value), None) => value.to_str().map(str::to_owned).map_err(|_| {
                KeyError::new(
                    self.missing,
                    format!("header {} is not visible ASCII", self.name),
                )
            }),
            (None, _) => Err(KeyError::new(
                self.missing,
                format!("missing header {}", self.name),
            )),
            (Some(_), Some(_)) => Err(KeyError::new(
                self.missing,
                format!("header {} given more than once", self.name),
            )),
        }
    }
}

/// One key for every request: a limit on the whole service (or route).
///
/// ```
/// use http::Request;
/// use tollgate_tower::{Global, KeyExtractor};
/// let (parts, ()) = Request::get("/").body(()).unwrap().into_parts();
/// assert_eq!(Global.extract(&parts), Ok(()));
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct Global;

impl KeyExtractor for Global {
    type Key = ();

    fn extract(&self, _: &Parts) -> Result<(), KeyError> {
        Ok(())
    }
}

/// A key from a closure over the request's head.
///
/// ```
/// use http::{Request, StatusCode};
/// use tollgate_tower::{KeyError, KeyExtractor, KeyFn};
///
/// let by_tenant = KeyFn::new(|parts: &http::request::Parts| {
///     parts.uri.path().split('/').nth(2).map(str::to_owned)
///         .ok_or_else(|| KeyError::new(StatusCode::NOT_FOUND, "no tenant in the path"))
/// });
/// let (parts, ()) = Request::get("/t/acme/orders").body(()).unwrap().into_parts();
/// assert_eq!(by_tenant.extract(&parts).unwrap(), "acme");
/// ```
#[derive(Clone)]
pub struct KeyFn<F>(F);

impl<F> KeyFn<F> {
    /// Keys requests by `f`.
    ///
    /// ```
    /// use tollgate_tower::{KeyError, KeyFn};
    /// let _ = KeyFn::new(|parts: &http::request::Parts| Ok::<_, KeyError>(parts.method.clone()));
    /// ```
    pub fn new<K>(f: F) -> Self
    where
        F: Fn(&Parts) -> Result<K, KeyError>,
    {
        KeyFn(f)
    }
}

impl<F> fmt::Debug for KeyFn<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("KeyFn(..)")
    }
}

impl<F, K> KeyExtractor for KeyFn<F>
where
    F: Fn(&Parts) -> Result<K, KeyError> + Send + Sync + 'static,
    K: Clone + Send + Sync + 'static,
{
    type Key = K;

    fn extract(&self, parts: &Parts) -> Result<K, KeyError> {
        (self.0)(parts)
    }
}
