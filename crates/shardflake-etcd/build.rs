//! Compiles etcd's v3 API (`proto/etcd/…`, vendored, see `proto/etcd/README.md`) with
//! protox (a protobuf compiler in Rust, so the build needs no `protoc`
//! binary), client side only.

fn main() {
    println!("cargo:rerun-if-changed=proto");
    let etcd = protox::compile(["etcd/etcdserver/etcdserverpb/rpc.proto"], ["proto"])
        .expect("compile proto/etcd/etcdserver/etcdserverpb/rpc.proto");
    tonic_prost_build::configure()
        .build_server(false)
        .build_transport(false)
        .compile_fds(etcd)
        .expect("generate the etcd client");
}
