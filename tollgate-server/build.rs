//! Compiles Envoy's rate limit service (proto/third_party/, vendored from
//! Envoy's API) into Rust: parsed by protox (pure Rust: no `protoc` needed
//! to build), written by tonic-prost-build.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = ["envoy/service/ratelimit/v3/rls.proto"];
    let descriptors = protox::compile(files, ["proto/third_party"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    println!("cargo:rerun-if-changed=proto");
    Ok(())
}
