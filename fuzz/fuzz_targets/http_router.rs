//! The HTTP API through the real router, in process (tower `oneshot`, no
//! socket): query strings, paths and bodies on every route, for a layout
//! without and one with a shard field. The router never answers 5xx, every
//! answer is JSON (text for `/metrics`), and every error body is exactly
//! `{"error":{"code","message"}}` with string members.
//!
//! Input: one byte choosing the method, one choosing the route, then the
//! rest of the target (appended to the route) and, after a NUL byte, the
//! body.
#![no_main]

use std::sync::{Arc, OnceLock};

use axum::Router;
use axum::body::Body;
use http_body_util::BodyExt;
use libfuzzer_sys::fuzz_target;
use shardflake_service::Config;
use shardflake_service::issuer::{Issuer, LeaseState};
use tower::ServiceExt;

const METHODS: [&str; 4] = ["GET", "POST", "PUT", "HEAD"];
const ROUTES: [&str; 10] = [
    "/v1/id?",
    "/v1/ids?",
    "/v1/shard-id?",
    "/v1/decode/",
    "/v1/info",
    "/healthz",
    "/readyz",
    "/metrics",
    "/openapi.json",
    "/",
];

/// A router over an issuer holding a static node id, published the way
/// the keeper's static path does it.
fn router(toml: &str) -> Router {
    let config = Config::from_toml(toml).expect("the fuzz configuration is valid");
    let issuer = Arc::new(Issuer::new(config));
    let active = issuer
        .make_active(3, 0, None, u64::MAX)
        .expect("node 3 fits");
    issuer.publish(Some(Arc::new(active)));
    issuer.set_state(LeaseState::Static);
    shardflake_service::http::router(issuer)
}

struct Fixture {
    runtime: tokio::runtime::Runtime,
    routers: [Router; 2],
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| Fixture {
        runtime: tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime"),
        routers: [
            // Small batches: the fuzzer asks for many.
            router("max_batch = 64\nnode_id = 3"),
            router(
                "layout = \"orders: time 41 | node 6 | shard 6 | sequence 10 (epoch 1735689600000 ms)\"\n\
                 node_id = 3\nshards = 40\nmax_batch = 64",
            ),
        ],
    })
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let method = METHODS[usize::from(data[0] & 3)];
    let which = usize::from(data[0] >> 7);
    let route = ROUTES[usize::from(data[1]) % ROUTES.len()];
    let rest = &data[2..];
    let (target, body) = match rest.iter().position(|b| *b == 0) {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, &[][..]),
    };
    let Ok(target) = std::str::from_utf8(target) else {
        return;
    };
    // Only what hyper would hand the router: a target that parses.
    let Ok(uri) = format!("{route}{target}").parse::<axum::http::Uri>() else {
        return;
    };
    let Ok(request) = axum::http::Request::builder()
        .method(method)
        .uri(uri.clone())
        .header("content-type", "application/json")
        .body(Body::from(body.to_vec()))
    else {
        return;
    };
    let f = fixture();
    let (status, content_type, bytes) = f.runtime.block_on(async {
        let response = f.routers[which]
            .clone()
            .oneshot(request)
            .await
            .expect("the router is infallible");
        let status = response.status().as_u16();
        let content_type = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        let bytes = response
            .into_body()
            .collect()
            .await
            .expect("a body")
            .to_bytes();
        (status, content_type, bytes)
    });
    assert!(status < 500, "{method} {uri}: {status} {bytes:?}");
    if method == "HEAD" {
        return;
    }
    if content_type.starts_with("text/plain") {
        assert_eq!(uri.path(), "/metrics", "{method} {uri}");
        return;
    }
    assert_eq!(content_type, "application/json", "{method} {uri}: {status}");
    let value: serde_json::Value = serde_json::from_slice(&bytes)
        .unwrap_or_else(|e| panic!("{method} {uri}: {status} not JSON ({e}): {bytes:?}"));
    if status >= 400 {
        let object = value.as_object().filter(|o| o.len() == 1);
        let error = object
            .and_then(|o| o.get("error"))
            .and_then(|e| e.as_object())
            .filter(|e| e.len() == 2);
        let shaped = error.is_some_and(|e| e["code"].is_string() && e["message"].is_string());
        assert!(shaped, "{method} {uri}: {status} {value}");
    }
});
