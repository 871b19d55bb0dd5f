//! A rate limit service any proxy or language can call, deciding with
//! tollgate's exact limits.
//!
//! * **Protocol**: Envoy's rate limit service
//!   (`envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`) over
//!   gRPC, and the same request as JSON on `POST /json`.
//! * **Configuration**: envoyproxy/ratelimit's YAML files, unchanged — a
//!   directory of files, one domain each ([`config`]).
//! * **Decisions**: all or nothing — a request refused by any of its
//!   descriptors' limits is charged by none.

pub mod config;
mod decide;
mod http;
mod leased;
mod memory;
mod metrics;
mod redis;
mod serve;
mod server;

pub use config::{Failure, InvalidRule};
pub use decide::{BadRequest, Bounds, ResponseHeaders};
pub use leased::Leasing;
pub use redis::RedisSettings;
pub use serve::{serve, watch_config};
pub use server::{InFlight, Options, Server};

/// The messages and the service of Envoy's rate limit protocol, generated
/// from the `.proto` files vendored under `proto/third_party/` (field names
/// and numbers as Envoy's API reference publishes them).
pub mod proto {
    #[allow(missing_docs, clippy::all, clippy::pedantic)]
    pub mod envoy {
        pub mod config {
            pub mod core {
                pub mod v3 {
                    tonic::include_proto!("envoy.config.core.v3");
                }
            }
        }
        pub mod extensions {
            pub mod common {
                pub mod ratelimit {
                    pub mod v3 {
                        tonic::include_proto!("envoy.extensions.common.ratelimit.v3");
                    }
                }
            }
        }
        pub mod r#type {
            pub mod v3 {
                tonic::include_proto!("envoy.r#type.v3");
            }
        }
        pub mod service {
            pub mod ratelimit {
                pub mod v3 {
                    tonic::include_proto!("envoy.service.ratelimit.v3");
                }
            }
        }
    }
}

// The README's examples, compiled as doctests (its code blocks in other
// languages are fenced with theirs, so rustdoc leaves them alone).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

// The guide's page on this crate (docs/guide/token-server.md), compiled and
// run as doctests in the repository; the packaged crate holds no docs/.
#[cfg(doctest)]
#[doc = include_str!("../../docs/guide/token-server.md")]
struct GuideTokenServer;
