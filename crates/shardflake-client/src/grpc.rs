//! The gRPC transport: the client generated from `proto/shardflake.proto`
//! (the `shardflake-proto` crate), one lazily connected tonic
//! channel per endpoint.

use std::sync::OnceLock;
use std::time::Duration;

use shardflake::Id;
use tonic::transport::{Channel, Endpoint};

use crate::client::Request;
use crate::error::{AttemptError, ClientError, FailureKind};

/// The generated protobuf types and client (`shardflake.v1`, the
/// `shardflake-proto` crate).
pub use shardflake_proto as pb;

use pb::id_service_client::IdServiceClient;

/// Decoded answers may be large: 1,000,000 ids are 8 MB.
const MAX_MESSAGE: usize = 256 << 20;

/// One endpoint's channel.
#[derive(Debug)]
pub(crate) struct Node {
    name: String,
    endpoint: Endpoint,
    /// Made on first use: building a channel spawns its worker, which needs
    /// a runtime.
    channel: OnceLock<Channel>,
}

impl Node {
    pub(crate) fn new(endpoint: &str, timeout: Duration) -> Result<Node, ClientError> {
        let authority = crate::http::parse_endpoint(endpoint)?;
        let ep = Endpoint::from_shared(format!("http://{authority}"))
            .map_err(|e| ClientError::InvalidEndpoint {
                endpoint: endpoint.to_string(),
                reason: e.to_string(),
            })?
            .connect_timeout(timeout)
            .tcp_nodelay(true);
        Ok(Node {
            name: endpoint.to_string(),
            endpoint: ep,
            channel: OnceLock::new(),
        })
    }

    fn client(&self) -> IdServiceClient<Channel> {
        let channel = self
            .channel
            .get_or_init(|| self.endpoint.connect_lazy())
            .clone();
        IdServiceClient::new(channel).max_decoding_message_size(MAX_MESSAGE)
    }

    pub(crate) async fn fetch(&self, req: Request) -> Result<Vec<Id>, AttemptError> {
        let mut client = self.client();
        let answer = match req {
            Request::One => client
                .next_id(pb::NextIdRequest {})
                .await
                .map(|r| vec![Id(r.into_inner().id)]),
            Request::Many(count) => client
                .next_ids(pb::NextIdsRequest { count })
                .await
                .map(|r| r.into_inner().ids.into_iter().map(Id).collect()),
        };
        answer.map_err(|s| self.status(s))
    }

    fn status(&self, s: tonic::Status) -> AttemptError {
        use tonic::Code;
        let code = s
            .metadata()
            .get("x-error-code")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        match s.code() {
            // Transport failures surface as Unavailable or Unknown; a node
            // that cannot issue answers Unavailable; a dying connection may
            // give Cancelled, Internal or Aborted.
            Code::Unavailable
            | Code::Unknown
            | Code::Internal
            | Code::Aborted
            | Code::Cancelled
            | Code::DeadlineExceeded => {
                let kind = match &code {
                    Some(c) => FailureKind::Unavailable { code: c.clone() },
                    None if s.code() == Code::DeadlineExceeded => FailureKind::Timeout,
                    None => FailureKind::Connection,
                };
                AttemptError::Retry(kind, format!("gRPC {:?}: {}", s.code(), s.message()))
            }
            other => AttemptError::Fatal(ClientError::Rejected {
                endpoint: self.name.clone(),
                status: format!("gRPC {other:?}"),
                code: code.unwrap_or_default(),
                message: s.message().to_string(),
            }),
        }
    }
}
