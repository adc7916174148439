//! Ids in an axum handler: one `Generator` shared by every request.
//!
//! ```text
//! cargo run -p shardflake-examples --example axum_handler
//! curl -s localhost:3000/posts -d 'hello'   # {"id":"…","body":"hello"}
//! ```
//!
//! The generator is lock-free: share it with `Arc`, no mutex. Its waits
//! (a full millisecond, a clock step under a waiting policy) are short and
//! bounded; an async server that must never block a worker thread uses
//! `Generator::try_next_ids` and a timer, as `shardflake serve` does.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use shardflake::{Generator, Id, preset};

#[derive(serde::Serialize)]
struct Post {
    /// Serialised as a string: JavaScript loses integers above 2^53.
    id: Id,
    body: String,
}

async fn create_post(
    State(ids): State<Arc<Generator>>,
    body: String,
) -> Result<Json<Post>, (StatusCode, String)> {
    let id = ids
        .next_id()
        .map_err(|e| (StatusCode::SERVICE_UNAVAILABLE, e.to_string()))?;
    Ok(Json(Post { id, body }))
}

fn app(ids: Arc<Generator>) -> Router {
    Router::new()
        .route("/posts", post(create_post))
        .with_state(ids)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Node 1 of a `snowflake` layout; in production the node id comes from
    // configuration, a StatefulSet ordinal or `shardflake serve --etcd`.
    let ids = Arc::new(
        Generator::builder(preset::by_name("snowflake")?)
            .node("node", 1)
            .build()?,
    );
    let addr = std::env::var("ADDR").unwrap_or_else(|_| "127.0.0.1:3000".into());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app(ids)).await?;
    Ok(())
}
