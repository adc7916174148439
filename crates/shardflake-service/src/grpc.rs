//! The gRPC API (tonic): the same operations as HTTP, from
//! `proto/shardflake.proto` compiled by protox at build time (no `protoc`),
//! plus server reflection (v1 and v1alpha) so `grpcurl` needs no proto file.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use crate::error::ApiError;
use crate::issuer::Issuer;

/// Generated messages, server and client.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod pb {
    tonic::include_proto!("shardflake.v1");
}

/// The encoded descriptor set, for reflection.
pub const DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("shardflake_descriptor");

use pb::id_service_server::{IdService, IdServiceServer};

/// The service implementation.
#[derive(Debug, Clone)]
pub struct Service {
    issuer: Arc<Issuer>,
}

/// The gRPC routes: the id service and reflection.
pub fn routes(issuer: Arc<Issuer>) -> anyhow::Result<tonic::service::Routes> {
    // Room for the largest batch: 9 bytes a fixed64 plus framing.
    let max_msg = (issuer.config.max_batch as usize).saturating_mul(9) + 1024;
    let svc = IdServiceServer::new(Service { issuer })
        .max_encoding_message_size(max_msg.max(4 << 20))
        .max_decoding_message_size(64 << 10);
    let v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(DESCRIPTOR_SET)
        .build_v1()?;
    let v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(DESCRIPTOR_SET)
        .build_v1alpha()?;
    Ok(tonic::service::Routes::new(svc)
        .add_service(v1)
        .add_service(v1alpha))
}

fn status(e: ApiError) -> Status {
    e.into()
}

#[tonic::async_trait]
impl IdService for Service {
    async fn next_id(
        &self,
        _: Request<pb::NextIdRequest>,
    ) -> Result<Response<pb::NextIdReply>, Status> {
        let (batch, _) = self.issuer.issue(0, 1).await.map_err(status)?;
        Ok(Response::new(pb::NextIdReply {
            id: batch.first().get(),
        }))
    }

    async fn next_ids(
        &self,
        req: Request<pb::NextIdsRequest>,
    ) -> Result<Response<pb::NextIdsReply>, Status> {
        let count = req.into_inner().count;
        let max = self.issuer.config.max_batch;
        if count == 0 || count > max {
            return Err(status(ApiError::invalid_count(&count.to_string(), max)));
        }
        let _permit = self
            .issuer
            .large_batch_permit(count, crate::issuer::LARGE_BATCH_WAIT)
            .await
            .map_err(status)?;
        let (batch, _) = self.issuer.issue(0, count).await.map_err(status)?;
        let collect = move || batch.iter().map(|id| id.get()).collect::<Vec<u64>>();
        let ids = if count > crate::http::BLOCKING_BATCH {
            tokio::task::spawn_blocking(collect)
                .await
                .map_err(|e| Status::internal(e.to_string()))?
        } else {
            collect()
        };
        Ok(Response::new(pb::NextIdsReply { ids }))
    }

    async fn shard_id(
        &self,
        req: Request<pb::ShardIdRequest>,
    ) -> Result<Response<pb::NextIdReply>, Status> {
        let c = &self.issuer.config;
        if c.shard_field.is_none() {
            return Err(status(ApiError::bad_request(
                "no_shard_field",
                format!("layout {} has no shard field", c.layout.name()),
            )));
        }
        let shard = req.into_inner().key % c.shards;
        let (batch, _) = self.issuer.issue(shard, 1).await.map_err(status)?;
        Ok(Response::new(pb::NextIdReply {
            id: batch.first().get(),
        }))
    }

    async fn next_kind(
        &self,
        req: Request<pb::NextKindRequest>,
    ) -> Result<Response<pb::NextKindReply>, Status> {
        let kind = req.into_inner().kind;
        let (name, value) = self.issuer.other_kind(&kind).await.map_err(status)?;
        Ok(Response::new(pb::NextKindReply {
            kind: name.to_string(),
            value,
        }))
    }

    async fn decode(
        &self,
        req: Request<pb::DecodeRequest>,
    ) -> Result<Response<pb::DecodeReply>, Status> {
        let req = req.into_inner();
        let format = match req.format.as_str() {
            "" | "dec" => None,
            f => Some(f.parse().map_err(|_| {
                status(ApiError::bad_request(
                    "invalid_parameter",
                    format!("format must be dec, hex, base32 or base62, got {f:?}"),
                ))
            })?),
        };
        let id = format
            .unwrap_or(shardflake::Format::Dec)
            .parse(req.id.trim())
            .map_err(|e| {
                status(ApiError::bad_request(
                    "malformed_id",
                    format!("{:?}: {e}", req.id),
                ))
            })?;
        let parts = id
            .decode(self.issuer.layout())
            .map_err(|e| status(ApiError::bad_request("malformed_id", e.to_string())))?;
        Ok(Response::new(pb::DecodeReply {
            id: id.get(),
            timestamp: parts.timestamp(),
            layout: parts.layout,
            tick: parts.tick,
            unix_ms: parts.unix_ms,
            fields: parts
                .fields
                .into_iter()
                .map(|(name, value)| pb::Field { name, value })
                .collect(),
            sequence: parts.sequence,
        }))
    }

    async fn info(&self, _: Request<pb::InfoRequest>) -> Result<Response<pb::InfoReply>, Status> {
        let c = &self.issuer.config;
        Ok(Response::new(pb::InfoReply {
            layout: c.layout.name().to_string(),
            layout_spec: c.layout.to_string(),
            node_field: c.node_field.clone(),
            node_id: self.issuer.active().map(|a| a.node_id),
            node_source: match c.node {
                crate::config::NodeSource::Static(_) => "static".into(),
                crate::config::NodeSource::Etcd(_) => "etcd".into(),
            },
            lease_state: self.issuer.lease_state().name().to_string(),
            max_batch: c.max_batch,
            shard_field: c.shard_field.clone().unwrap_or_default(),
            shards: c.shard_field.as_ref().map_or(0, |_| c.shards),
        }))
    }
}
