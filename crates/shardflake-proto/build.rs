//! Compiles `proto/shardflake.proto` with protox (a protobuf compiler in
//! Rust), so the build needs no `protoc` binary: the messages, the client,
//! the server (its module under `#[cfg(feature = "server")]`), and the
//! descriptor set for gRPC server reflection.

use std::path::PathBuf;

use prost::Message;

fn main() {
    println!("cargo:rerun-if-changed=proto");
    let fds =
        protox::compile(["shardflake.proto"], ["proto"]).expect("compile proto/shardflake.proto");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
    std::fs::write(out.join("shardflake_descriptor.bin"), fds.encode_to_vec())
        .expect("write descriptor set");
    tonic_prost_build::configure()
        .build_transport(false)
        .server_mod_attribute("shardflake.v1.IdService", r#"#[cfg(feature = "server")]"#)
        .compile_fds(fds)
        .expect("generate gRPC code");
}
