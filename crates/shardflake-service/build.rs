//! Compiles the protobuf definitions with protox (a protobuf compiler in
//! Rust), so the build needs no `protoc` binary:
//!
//! - `proto/shardflake.proto`: our gRPC service (server and client), and its
//!   descriptor set for gRPC server reflection;
//! - `proto/etcd/…`: etcd's v3 API (vendored, see `proto/etcd/README.md`),
//!   client side only, for the lease keeper's etcd client.

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
        .compile_fds(fds)
        .expect("generate gRPC code");

    let etcd = protox::compile(["etcd/etcdserver/etcdserverpb/rpc.proto"], ["proto"])
        .expect("compile proto/etcd/etcdserver/etcdserverpb/rpc.proto");
    tonic_prost_build::configure()
        .build_server(false)
        .build_transport(false)
        .compile_fds(etcd)
        .expect("generate the etcd client");
}
