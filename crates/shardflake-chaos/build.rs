//! Generates the gRPC client from the service's `proto/shardflake.proto`
//! with protox (a protobuf compiler in Rust), so the build needs no `protoc`.
//! Only the proto file is shared with the service, not its code.

fn main() {
    let proto_dir = "../shardflake-service/proto";
    println!("cargo:rerun-if-changed={proto_dir}");
    let fds = protox::compile(["shardflake.proto"], [proto_dir])
        .expect("compile ../shardflake-service/proto/shardflake.proto");
    tonic_prost_build::configure()
        .build_server(false)
        .build_transport(false)
        .compile_fds(fds)
        .expect("generate gRPC client code");
}
