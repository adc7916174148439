//! The gRPC API (tonic): the same operations as HTTP, from
//! `shardflake-proto` (`proto/shardflake.proto`, compiled by protox, no `protoc`),
//! plus server reflection (v1 and v1alpha) so `grpcurl` needs no proto file.
//! With an API token configured ([`crate::ApiToken`]), the id service requires
//! `authorization: Bearer <token>` metadata (else `Unauthenticated`);
//! reflection stays open.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use crate::auth::{ApiToken, Unauthorized};
use crate::error::{ErrorKind, IssueError};
use crate::issuer::Issuer;

/// Generated messages, server and client (the `shardflake-proto` crate).
pub use shardflake_proto as pb;

/// The encoded descriptor set, for reflection.
pub use shardflake_proto::DESCRIPTOR_SET;

use pb::id_service_server::{IdService, IdServiceServer};

/// The service implementation.
#[derive(Debug, Clone)]
pub struct Service {
    issuer: Arc<Issuer>,
}

/// The gRPC routes: the id service and reflection, open to every caller.
pub fn routes(
    issuer: Arc<Issuer>,
) -> Result<tonic::service::Routes, tonic_reflection::server::Error> {
    routes_with_token(issuer, None)
}

/// The gRPC routes; with a `token`, the id service requires it.
pub fn routes_with_token(
    issuer: Arc<Issuer>,
    token: Option<ApiToken>,
) -> Result<tonic::service::Routes, tonic_reflection::server::Error> {
    // Room for the largest batch: 9 bytes a fixed64 plus framing.
    let max_msg = (issuer.config.max_batch as usize).saturating_mul(9) + 1024;
    let svc = IdServiceServer::new(Service { issuer })
        .max_encoding_message_size(max_msg.max(4 << 20))
        .max_decoding_message_size(64 << 10);
    let svc = tonic::service::interceptor::InterceptedService::new(svc, move |req: Request<()>| {
        if let Some(token) = &token {
            let given = req.metadata().get("authorization");
            token.check(given.map(|v| v.as_bytes()))?;
        }
        Ok(req)
    });
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

/// The one mapping of the domain's errors to gRPC: the kind picks the
/// status code, and the code string travels in `x-error-code`.
impl From<IssueError> for Status {
    fn from(e: IssueError) -> Self {
        let code = match e.kind() {
            ErrorKind::BadInput => tonic::Code::InvalidArgument,
            ErrorKind::NotFound => tonic::Code::NotFound,
            ErrorKind::Unavailable => tonic::Code::Unavailable,
            ErrorKind::Broken => tonic::Code::Internal,
        };
        let mut status = Status::new(code, e.to_string());
        if let Ok(v) = e.code().parse() {
            status.metadata_mut().insert("x-error-code", v);
        }
        status
    }
}

/// Refused calls without the bearer token: `Unauthenticated`, with the
/// code `unauthorized` in `x-error-code` as HTTP has it.
impl From<Unauthorized> for Status {
    fn from(e: Unauthorized) -> Self {
        let mut status = Status::unauthenticated(e.to_string());
        status.metadata_mut().insert(
            "x-error-code",
            tonic::metadata::MetadataValue::from_static(e.code()),
        );
        status
    }
}

#[tonic::async_trait]
impl IdService for Service {
    async fn next_tickets(
        &self,
        req: Request<pb::NextTicketsRequest>,
    ) -> Result<Response<pb::NextTicketsReply>, Status> {
        let req = req.into_inner();
        let ids = self.issuer.next_tickets(&req.sequence, req.count).await?;
        Ok(Response::new(pb::NextTicketsReply { ids }))
    }

    async fn next_id(
        &self,
        _: Request<pb::NextIdRequest>,
    ) -> Result<Response<pb::NextIdReply>, Status> {
        let id = self.issuer.next_id().await?;
        Ok(Response::new(pb::NextIdReply { id: id.get() }))
    }

    async fn next_ids(
        &self,
        req: Request<pb::NextIdsRequest>,
    ) -> Result<Response<pb::NextIdsReply>, Status> {
        let count = req.into_inner().count;
        let issued = self.issuer.next_ids(count).await?;
        let collect = move || issued.batch.iter().map(|id| id.get()).collect::<Vec<u64>>();
        let ids = crate::issuer::encode_batch(count, collect)
            .await
            .map_err(|e| Status::internal(e.to_string()))?;
        Ok(Response::new(pb::NextIdsReply { ids }))
    }

    async fn shard_id(
        &self,
        req: Request<pb::ShardIdRequest>,
    ) -> Result<Response<pb::NextIdReply>, Status> {
        let got = self.issuer.shard_id(req.into_inner().key).await?;
        Ok(Response::new(pb::NextIdReply { id: got.id.get() }))
    }

    async fn next_kind(
        &self,
        req: Request<pb::NextKindRequest>,
    ) -> Result<Response<pb::NextKindReply>, Status> {
        let kind = req.into_inner().kind;
        let (name, value) = self.issuer.other_kind(&kind).await?;
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
            f => Some(f.parse().map_err(|_| IssueError::unknown_format(f))?),
        };
        let (id, parts) = self.issuer.decode(&req.id, format)?;
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
        let info = self.issuer.info();
        Ok(Response::new(pb::InfoReply {
            layout: info.layout,
            layout_spec: info.layout_spec,
            node_field: info.node_field,
            node_id: info.node_id,
            node_source: info.node_source.to_string(),
            lease_state: info.lease_state.to_string(),
            max_batch: info.max_batch,
            shard_field: info.shard_field.unwrap_or_default(),
            shards: info.shards.unwrap_or(0),
            lifetime_left_s: info.lifetime_left_s,
        }))
    }

    async fn range(
        &self,
        req: Request<pb::RangeRequest>,
    ) -> Result<Response<pb::RangeReply>, Status> {
        let req = req.into_inner();
        let to = (!req.to.is_empty()).then_some(req.to.as_str());
        let (from_ms, to_ms, range) = self.issuer.range(Some(&req.from), to)?;
        Ok(Response::new(pb::RangeReply {
            layout: self.issuer.layout().name().to_string(),
            from_unix_ms: from_ms,
            to_unix_ms: to_ms,
            first: range.first.get(),
            last: range.last.get(),
            signed: range
                .signed_ranges()
                .into_iter()
                .map(|r| pb::SignedRange {
                    first: *r.start(),
                    last: *r.end(),
                })
                .collect(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use http_body_util::{BodyExt, Full};
    use prost::Message;
    use tower::ServiceExt;

    use super::*;
    use crate::config::Config;

    /// The routes over an issuer holding node id 3, with `token` required.
    fn routes_for(token: Option<&str>) -> tonic::service::Routes {
        let issuer = Arc::new(Issuer::new(Config::from_toml("").unwrap()));
        let active = issuer.make_active(3, 0, None, u64::MAX).unwrap();
        issuer.publish(Some(Arc::new(active)));
        issuer.set_state(crate::issuer::LeaseState::Static);
        routes_with_token(issuer, token.and_then(ApiToken::new)).unwrap()
    }

    /// One unary NextId call, in process: its grpc-status, x-error-code and
    /// the id answered (0 on errors).
    async fn next_id(routes: &tonic::service::Routes, auth: Option<&str>) -> (String, String, u64) {
        // An empty NextIdRequest: uncompressed, length 0.
        let frame = Bytes::from_static(&[0, 0, 0, 0, 0]);
        let mut req = axum::http::Request::post("/shardflake.v1.IdService/NextId")
            .header("content-type", "application/grpc")
            .header("te", "trailers");
        if let Some(auth) = auth {
            req = req.header("authorization", auth);
        }
        let resp = routes
            .clone()
            .oneshot(req.body(Full::new(frame)).unwrap())
            .await
            .unwrap();
        let header = |h: &axum::http::HeaderMap, name: &str| {
            h.get(name)
                .map(|v| v.to_str().unwrap().to_string())
                .unwrap_or_default()
        };
        let headers = resp.headers().clone();
        let body = resp.into_body().collect().await.unwrap();
        let trailers = body.trailers().cloned().unwrap_or_default();
        let status = match header(&headers, "grpc-status") {
            s if s.is_empty() => header(&trailers, "grpc-status"),
            s => s,
        };
        let data = body.to_bytes();
        let id = match data.get(5..) {
            Some(msg) => pb::NextIdReply::decode(msg).unwrap().id,
            None => 0,
        };
        (status, header(&headers, "x-error-code"), id)
    }

    #[tokio::test]
    async fn the_bearer_token_guards_the_id_service() {
        let routes = routes_for(Some("s3cret"));
        let unauthenticated = (tonic::Code::Unauthenticated as i32).to_string();
        for auth in [None, Some("Bearer nope"), Some("s3cret")] {
            let (status, code, _) = next_id(&routes, auth).await;
            assert_eq!(
                (status.as_str(), code.as_str()),
                (unauthenticated.as_str(), "unauthorized"),
                "{auth:?}"
            );
        }
        let (status, _, id) = next_id(&routes, Some("Bearer s3cret")).await;
        assert_eq!(status, "0");
        let layout = shardflake::preset::by_name("snowflake").unwrap();
        let node = crate::issuer::node_of(&layout, "node", shardflake::Id::from(id));
        assert_eq!(node, Some(3));
        let (status, _, id) = next_id(&routes_for(None), None).await;
        assert_eq!((status.as_str(), id != 0), ("0", true));
    }

    #[tokio::test]
    async fn range_answers_the_ids_of_a_span_and_its_errors_carry_their_codes() {
        let issuer = Arc::new(Issuer::new(Config::from_toml("").unwrap()));
        let svc = Service { issuer };
        let req = |from: &str, to: &str| {
            Request::new(pb::RangeRequest {
                from: from.into(),
                to: to.into(),
            })
        };
        let reply = svc
            .range(req("2024-06-01T00:00:00Z", "2024-07-01T00:00:00Z"))
            .await
            .unwrap()
            .into_inner();
        let layout = shardflake::preset::by_name("snowflake").unwrap();
        let want = layout
            .id_range(reply.from_unix_ms..reply.to_unix_ms)
            .unwrap();
        assert_eq!(
            (reply.first, reply.last),
            (want.first.get(), want.last.get())
        );
        assert_eq!(reply.from_unix_ms, 1_717_200_000_000);
        assert_eq!(reply.signed.len(), 1, "{reply:?}");
        assert_eq!(reply.signed[0].first, want.first.as_i64());
        for (from, to, code) in [
            ("2000-01-01T00:00:00Z", "", "time_out_of_range"),
            ("now", "-1d", "invalid_span"),
            ("soon", "", "invalid_parameter"),
        ] {
            let status = svc.range(req(from, to)).await.unwrap_err();
            assert_eq!(status.code(), tonic::Code::InvalidArgument, "{from}");
            assert_eq!(
                status.metadata().get("x-error-code").unwrap(),
                code,
                "{from}"
            );
        }
    }
}
