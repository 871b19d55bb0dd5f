//! What the HTTP tests share: a real axum server on a loopback port and
//! clients bound to other loopback addresses (all of 127/8 is loopback on
//! Linux), so that each client is its own peer address.

#![allow(dead_code)]

use std::net::{IpAddr, SocketAddr};

use axum::Router;
use tokio::net::TcpListener;

/// Serves `app` on a free loopback port with peer addresses; returns the address.
pub async fn serve(app: Router) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    addr
}

/// A client whose requests come from `ip`.
pub fn client_from(ip: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .local_address(ip.parse::<IpAddr>().unwrap())
        .build()
        .unwrap()
}
