//! An async client for the shardflake id service (`shardflake serve`), over
//! HTTP or gRPC, with failover across nodes and an optional prefetch buffer.
//!
//! ```no_run
//! use shardflake_client::{Client, Transport};
//!
//! # async fn demo() -> Result<(), shardflake_client::ClientError> {
//! let client = Client::builder()
//!     .endpoints(["http://10.0.0.1:8080", "http://10.0.0.2:8080", "http://10.0.0.3:8080"])
//!     .transport(Transport::Http) // or Transport::Grpc with the nodes' gRPC ports
//!     .build()?;
//! let id = client.next_id().await?;           // one request, failover included
//! let ids = client.next_ids(1000).await?;     // one node's contiguous reservation
//!
//! // Batches fetched ahead, ids handed out locally:
//! let buffer = client.prefetching(100_000).fetchers(3).start()?;
//! let id = buffer.next_id().await?;
//! # let _ = (id, ids);
//! # Ok(()) }
//! ```
//!
//! **Failover.** A call starts at the next endpoint in turn; on a
//! connection error, a timeout or a "retry elsewhere" answer (HTTP 503
//! `no_lease`, `busy`, `clock_moved_backwards`, … or any 5xx; gRPC
//! Unavailable) it tries the next one, each endpoint at most once per call
//! and all within the call timeout, so a dead node costs the caller one
//! refused connection, not an error. A node that failed is tried last for
//! a short backoff, then in turn again. A refusal (4xx, such as
//! `invalid_count` for a count above `--max-batch`) is returned at once as
//! [`ClientError::Rejected`] with the service's code. Retrying never
//! duplicates an id: a node skips, never reissues, ids reserved for a
//! request whose answer was lost.
//!
//! **Prefetching** ([`Prefetch`]) makes ids cost a buffer access instead of
//! a round trip, at a price: an id's time is its *fetch* time, so ids used
//! later carry an older time, and ids from two clients are only roughly
//! ordered. One fetcher keeps one buffer's ids increasing; several fetchers
//! (one per node, to get more than one node's cap) interleave batches. See
//! the [`prefetch`] module docs.
//!
//! | module | holds |
//! |---|---|
//! | [`client`] | [`Client`], [`ClientBuilder`], [`Transport`]; the failover loop; answer checks (count, ascending). |
//! | `http` | HTTP/1.1 keep-alive pool on hyper's connection API; fast parser for `{"count","ids":[…]}`. |
//! | `grpc` | the tonic client generated at build time from `proto/shardflake.proto` (the `shardflake-proto` crate). |
//! | [`prefetch`] | [`Prefetch`], [`PrefetchBuilder`]: background fetchers, double-buffered batches. |
//! | [`error`] | [`ClientError`], [`EndpointFailure`], [`FailureKind`]. |
//!
//! The crate does not depend on the server (`shardflake-service`): only on
//! the core crate, for [`Id`].

#![warn(missing_docs)]

pub mod client;
pub mod error;
mod grpc;
mod http;
pub mod prefetch;

pub use client::{Client, ClientBuilder, Transport};
pub use error::{ClientError, EndpointFailure, FailureKind};
/// The generated protobuf types and gRPC client of `shardflake.v1`, for
/// callers that speak the API directly (the chaos checker does).
pub use grpc::pb;
pub use prefetch::{Prefetch, PrefetchBuilder};
pub use shardflake::Id;

// The client guide's program compiles as a doc test.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/guide/client.md")]
struct GuideClient;
