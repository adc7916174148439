//! The shardflake gRPC API, `proto/shardflake.proto` (package
//! `shardflake.v1`), compiled at build time by protox (no `protoc`): one
//! copy for the service (`shardflake-service`, with the `server` feature)
//! and its clients (`shardflake-client`, the test helpers).
//!
//! - the messages and `id_service_client` (always);
//! - `id_service_server` (feature `server`);
//! - [`DESCRIPTOR_SET`]: the encoded descriptor set, for server reflection.

#![allow(missing_docs, clippy::all, clippy::pedantic)]

tonic::include_proto!("shardflake.v1");

/// The encoded descriptor set of `shardflake.proto`, for gRPC reflection.
pub const DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("shardflake_descriptor");
