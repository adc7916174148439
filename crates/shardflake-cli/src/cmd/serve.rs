//! `shardflake serve`: the id service; all of it lives in `shardflake-service`.

/// Serve ids over HTTP and gRPC. With no flags: HTTP on 127.0.0.1:8080,
/// gRPC on 127.0.0.1:50051, layout snowflake, node id 0, high-water in
/// ./shardflake.state. With --etcd: node ids leased from etcd and fenced.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    serve: shardflake_service::ServeArgs,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    shardflake_service::run_blocking(&args.serve)
}
