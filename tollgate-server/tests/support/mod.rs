//! A server started by the test on loopback ports, and clients for it.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::PathBuf;

use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tollgate_server::config::Config;
use tollgate_server::proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use tollgate_server::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use tollgate_server::proto::envoy::service::ratelimit::v3::rate_limit_response::Code;
use tollgate_server::proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tollgate_server::proto::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tollgate_server::{Options, Server};

/// A configuration from YAML texts, one file each.
pub fn config(files: &[&str]) -> Config {
    Config::from_files(
        files
            .iter()
            .enumerate()
            .map(|(i, text)| (PathBuf::from(format!("file{i}.yaml")), (*text).to_owned())),
    )
    .unwrap()
}

/// A server serving on loopback until dropped.
pub struct Running {
    pub server: Server,
    pub grpc: SocketAddr,
    pub http: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Running {
    pub async fn start(config: Config, options: Options) -> Running {
        Running::serve(Server::new(config, options).unwrap()).await
    }

    /// Serves `server` on loopback ports.
    pub async fn serve(server: Server) -> Running {
        let grpc = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let http = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (grpc_addr, http_addr) = (grpc.local_addr().unwrap(), http.local_addr().unwrap());
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(tollgate_server::serve(
            server.clone(),
            grpc,
            http,
            None,
            async move {
                let _ = stopped.await;
            },
        ));
        Running {
            server,
            grpc: grpc_addr,
            http: http_addr,
            stop: Some(stop),
            task: Some(tokio::spawn(async move {
                task.await.unwrap().unwrap();
            })),
        }
    }

    pub async fn client(&self) -> RateLimitServiceClient<tonic::transport::Channel> {
        RateLimitServiceClient::connect(format!("http://{}", self.grpc))
            .await
            .unwrap()
    }

    /// Stops accepting and waits for the calls in flight.
    pub async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        self.task.take().unwrap().await.unwrap();
    }
}

/// A descriptor of `(key, value)` entries.
pub fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: (*k).into(),
                value: (*v).into(),
            })
            .collect(),
        ..Default::default()
    }
}

/// A request of `domain` with these descriptors.
pub fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors,
        hits_addend: 0,
    }
}

/// The overall code `server` answers `request` with.
pub async fn code(server: &Server, request: &RateLimitRequest) -> Code {
    server
        .should_rate_limit(request)
        .await
        .unwrap()
        .overall_code()
}

/// What the service `client` calls answers `request` with.
pub async fn ask(
    client: &mut RateLimitServiceClient<tonic::transport::Channel>,
    request: RateLimitRequest,
) -> RateLimitResponse {
    client
        .should_rate_limit(request)
        .await
        .unwrap()
        .into_inner()
}
