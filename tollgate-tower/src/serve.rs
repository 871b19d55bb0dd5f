//! Serving an axum router behind the layer (feature `axum`), without
//! depending on `tower` or writing out the make-service by hand.

use std::net::SocketAddr;

use axum::Router;
use axum::extract::Request;
use axum::extract::connect_info::IntoMakeServiceWithConnectInfo;
use tower_layer::Layer;

use crate::key::KeyExtractor;
use crate::layer::{Throttle, ThrottleLayer};

impl<E: KeyExtractor> ThrottleLayer<E> {
    /// `router` behind this layer — in front of the whole router, the
    /// recommended placement — as a make-service that gives every request
    /// its peer address ([`PeerIp`](crate::PeerIp) reads it): what
    /// `axum::serve` takes. The router's routes are built once
    /// (`with_state`), as `Router::into_make_service` would.
    ///
    /// ```no_run
    /// # async fn serve() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::net::IpAddr;
    /// use axum::{Router, routing::get};
    /// use tollgate::keyed::{BucketConfig, Keyed};
    /// use tollgate::{Rate, TokenBucket};
    /// use tollgate_tower::{PeerIp, PerKey, ThrottleLayer};
    ///
    /// let per_ip = Keyed::<IpAddr, TokenBucket>::new(BucketConfig::new(20, Rate::per_second(10))?);
    /// let layer = ThrottleLayer::builder(PeerIp).policy(PerKey::new("per-ip", per_ip)?).build();
    /// let router = Router::new().route("/", get(|| async { "hello" }));
    /// let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    /// axum::serve(listener, layer.serve(router)).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn serve(
        &self,
        router: Router,
    ) -> IntoMakeServiceWithConnectInfo<Throttle<Router, E>, SocketAddr> {
        axum::ServiceExt::<Request>::into_make_service_with_connect_info::<SocketAddr>(
            self.layer(router.with_state::<()>(())),
        )
    }
}
