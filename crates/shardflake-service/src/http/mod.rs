//! The HTTP/JSON API (axum).
//!
//! | route | answer |
//! |---|---|
//! | `GET /v1/id[?numbers=true][&format=hex][&kind=uuidv7]` | `{"id":"…"}` |
//! | `GET /v1/ids?count=N[&numbers=true]`, `POST /v1/ids {"count":N}` | `{"count":N,"ids":[…]}`, one contiguous reservation |
//! | `GET /v1/shard-id?key=K` | `{"id":"…","shard":S,"key":K}` (layouts with a `shard` field) |
//! | `GET /v1/decode/{id}[?format=hex]` | the id's parts |
//! | `GET /v1/range?from=T[&to=T]` | `{"first":"…","last":"…","signed":[[…]]}`, the ids of a span of time |
//! | `GET /v1/info` | layout and node identity, and the layout's time left |
//! | `GET /v1/tickets/{sequence}[?count=N][&numbers=true]` | `{"sequence":S,"count":N,"ids":[…]}`, ticket server ids (`--tickets`) |
//! | `GET /healthz`, `/readyz`, `/metrics`, `/openapi.json` | health, readiness (node id held), Prometheus, OpenAPI 3 |
//!
//! With an API token configured ([`crate::ApiToken`]), the `/v1/` routes answer
//! 401 `unauthorized` without `Authorization: Bearer <token>`; health,
//! readiness, metrics and the OpenAPI document stay open.
//!
//! Ids are JSON strings (JavaScript loses integers above 2^53) unless
//! `numbers=true`. Errors are `{"error":{"code","message"}}`: every one is
//! an [`IssueError`], mapped to its status once, here.
//!
//! The parts: this module (the router, the bearer-token guard, the
//! handlers, the error mapping), `query` (the query string, parsed by hand
//! so every bad input gets that shape), `json` (the answers; the hot path
//! writes into a small buffer without serde), `openapi` (the document,
//! filled in for this configuration).

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::extract::{DefaultBodyLimit, Path, RawQuery, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::json;
use shardflake::Format;

use crate::auth::{ApiToken, Unauthorized};
use crate::error::{ApiError, ErrorKind, IssueError};
use crate::issuer::Issuer;
use crate::metrics;

mod json;
mod openapi;
mod query;

pub use json::push_u64;
pub use openapi::openapi_document;

use json::json_response;
use query::{Query, output, parse_count, parse_digits, parse_format};

type Shared = State<Arc<Issuer>>;

/// How long a client may take to send a request body (slowloris; the
/// headers have their own timeout in the server).
const BODY_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// The router, open to every caller.
pub fn router(issuer: Arc<Issuer>) -> Router {
    router_with_token(issuer, None)
}

/// The router; with a `token`, the `/v1/` routes require it.
pub fn router_with_token(issuer: Arc<Issuer>, token: Option<ApiToken>) -> Router {
    let max_body = issuer.config.max_body;
    let sequences = issuer.tickets().map(|t| {
        let seqs = t.config().sequences.iter();
        seqs.map(|q| (q.name.clone(), q.mode.max_count()))
            .collect::<Vec<_>>()
    });
    let doc: Arc<str> =
        openapi::openapi_json(&issuer.config, token.is_some(), sequences.as_deref()).into();
    let openapi = move || {
        let doc = doc.clone();
        async move { json_response(StatusCode::OK, doc.to_string()) }
    };
    let api = Router::new()
        .route("/v1/id", get(next_id))
        .route("/v1/ids", get(next_ids_get).post(next_ids_post))
        .route("/v1/shard-id", get(shard_id))
        .route("/v1/decode/{id}", get(decode))
        .route("/v1/range", get(range))
        .route("/v1/info", get(info))
        .route("/v1/tickets/{sequence}", get(tickets));
    let api = match token {
        Some(token) => api.route_layer(axum::middleware::from_fn_with_state(token, require_token)),
        None => api,
    };
    api.route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text))
        .route("/openapi.json", get(openapi))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(max_body))
        .with_state(issuer)
}

/// The one mapping of the domain's errors to HTTP: the code stays, the kind
/// picks the status (the request's own failures have theirs).
impl From<IssueError> for ApiError {
    fn from(e: IssueError) -> Self {
        let status = match (&e, e.kind()) {
            (IssueError::BodyTooLarge { .. }, _) => StatusCode::PAYLOAD_TOO_LARGE,
            (IssueError::BodyTimeout(_), _) => StatusCode::REQUEST_TIMEOUT,
            (IssueError::MethodNotAllowed, _) => StatusCode::METHOD_NOT_ALLOWED,
            (_, ErrorKind::BadInput) => StatusCode::BAD_REQUEST,
            (_, ErrorKind::NotFound) => StatusCode::NOT_FOUND,
            (_, ErrorKind::Unavailable) => StatusCode::SERVICE_UNAVAILABLE,
            (_, ErrorKind::Broken) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError::new(status.as_u16(), e.code(), e.to_string())
    }
}

/// Refused calls without the bearer token: 401 with the documented body,
/// and the scheme to use (RFC 6750, section 3).
impl From<Unauthorized> for ApiError {
    fn from(e: Unauthorized) -> Self {
        ApiError::new(StatusCode::UNAUTHORIZED.as_u16(), e.code(), e.to_string())
    }
}

impl IntoResponse for Unauthorized {
    fn into_response(self) -> Response {
        let mut r = ApiError::from(self).into_response();
        r.headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        r
    }
}

async fn require_token(
    State(token): State<ApiToken>,
    request: Request,
    next: Next,
) -> Result<Response, Unauthorized> {
    let given = request.headers().get(header::AUTHORIZATION);
    token.check(given.map(|v| v.as_bytes()))?;
    Ok(next.run(request).await)
}

impl IntoResponse for IssueError {
    fn into_response(self) -> Response {
        ApiError::from(self).into_response()
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        json_response(
            StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            self.to_json(),
        )
    }
}

async fn next_id(State(issuer): Shared, RawQuery(raw): RawQuery) -> Result<Response, IssueError> {
    let (numbers, format) = if raw.is_none() {
        (false, None)
    } else {
        let q = Query::parse(raw.as_deref(), &["numbers", "format", "kind"])?;
        if let Some(kind) = q.kind.as_deref().filter(|k| *k != "layout") {
            // Their defaults (numbers=false, format=dec) change nothing and
            // are accepted; anything else would be ignored, so it is refused.
            if q.numbers()? || q.format()?.is_some() {
                return Err(IssueError::InvalidParameter(
                    "numbers=true and format apply to layout ids only".into(),
                ));
            }
            let (name, value) = issuer.other_kind(kind).await?;
            return Ok(json_response(
                StatusCode::OK,
                json!({ "id": value, "kind": name }).to_string(),
            ));
        }
        q.output()?
    };
    let id = issuer.next_id().await?;
    Ok(json_response(StatusCode::OK, json::id(id, numbers, format)))
}

async fn next_ids_get(
    State(issuer): Shared,
    RawQuery(raw): RawQuery,
) -> Result<Response, IssueError> {
    let q = Query::parse(raw.as_deref(), &["count", "numbers", "format"])?;
    let max = issuer.config.max_batch;
    let count = parse_count(q.count.as_deref().unwrap_or(""), max)?;
    let (numbers, format) = q.output()?;
    batch_response(issuer, count, numbers, format).await
}

async fn next_ids_post(State(issuer): Shared, body: Body) -> Result<Response, IssueError> {
    let max_body = issuer.config.max_body;
    let read = tokio::time::timeout(BODY_READ_TIMEOUT, axum::body::to_bytes(body, max_body));
    let body: Bytes = match read.await {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(e)) => {
            let e = e.into_inner();
            return Err(
                if e.downcast_ref::<http_body_util::LengthLimitError>()
                    .is_some()
                {
                    IssueError::BodyTooLarge { max: max_body }
                } else {
                    IssueError::InvalidBody(e.to_string())
                },
            );
        }
        Err(_) => return Err(IssueError::BodyTimeout(BODY_READ_TIMEOUT)),
    };
    // The body's fields one by one: an unknown field, or `null` or another
    // type where a value is expected, is refused rather than read as absent.
    let request: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&body).map_err(|e| IssueError::InvalidBody(format!("body: {e}")))?;
    if let Some(unknown) = request
        .keys()
        .find(|k| !["count", "numbers", "format"].contains(&k.as_str()))
    {
        return Err(IssueError::InvalidBody(format!(
            "body: unknown field `{unknown}`, expected count, numbers or format"
        )));
    }
    let max = issuer.config.max_batch;
    // A JSON number only: a string or a fraction is refused, not read as one.
    let count = match request.get("count") {
        Some(serde_json::Value::Number(n)) => parse_count(&n.to_string(), max)?,
        Some(other) => parse_count(&other.to_string(), max)?,
        None => parse_count("", max)?,
    };
    let numbers = match request.get("numbers") {
        None => false,
        Some(serde_json::Value::Bool(b)) => *b,
        Some(other) => {
            return Err(IssueError::InvalidBody(format!(
                "numbers must be true or false, got {other}"
            )));
        }
    };
    let format = match request.get("format") {
        None => None,
        Some(serde_json::Value::String(f)) => parse_format(Some(f))?,
        Some(other) => {
            return Err(IssueError::InvalidBody(format!(
                "format must be a string, got {other}"
            )));
        }
    };
    let (numbers, format) = output(numbers, format)?;
    batch_response(issuer, count, numbers, format).await
}

async fn batch_response(
    issuer: Arc<Issuer>,
    count: u64,
    numbers: bool,
    format: Option<Format>,
) -> Result<Response, IssueError> {
    let issued = issuer.next_ids(count).await?;
    let body =
        crate::issuer::encode_batch(count, move || json::batch(&issued.batch, numbers, format))
            .await
            .map_err(|e| IssueError::Internal(e.to_string()))?;
    Ok(json_response(StatusCode::OK, body))
}

async fn shard_id(State(issuer): Shared, RawQuery(raw): RawQuery) -> Result<Response, IssueError> {
    let q = Query::parse(raw.as_deref(), &["key", "numbers"])?;
    let text = q.key.as_deref().unwrap_or("");
    let key = parse_digits(text).ok_or_else(|| IssueError::InvalidKey(text.to_string()))?;
    let numbers = q.numbers()?;
    let got = issuer.shard_id(key).await?;
    let body = json::shard_id(got.id, got.shard, got.key, numbers);
    Ok(json_response(StatusCode::OK, body))
}

async fn decode(
    State(issuer): Shared,
    path: Result<Path<String>, axum::extract::rejection::PathRejection>,
    RawQuery(raw): RawQuery,
) -> Result<Response, IssueError> {
    let Path(text) = path.map_err(|e| IssueError::MalformedId(e.body_text()))?;
    let q = Query::parse(raw.as_deref(), &["format"])?;
    let (id, parts) = issuer.decode(&text, q.format()?)?;
    let v = json::parts(id, parts);
    Ok(json_response(StatusCode::OK, v.to_string()))
}

/// Ids of a ticket sequence (`--tickets`): plain integers from the ticket
/// servers, strings unless `numbers=true`; `count` defaults to 1.
/// The ids of a span of time: `from` (required) and `to` (default `now`),
/// read by [`Issuer::range`].
async fn range(State(issuer): Shared, RawQuery(raw): RawQuery) -> Result<Response, IssueError> {
    let q = Query::parse(raw.as_deref(), &["from", "to"])?;
    let (from, to, range) = issuer.range(q.from.as_deref(), q.to.as_deref())?;
    let signed: Vec<_> = range
        .signed_ranges()
        .iter()
        .map(|r| json!([r.start().to_string(), r.end().to_string()]))
        .collect();
    let body = json!({
        "layout": issuer.layout().name(),
        "from": shardflake::timestamp::rfc3339_ms(from),
        "to": shardflake::timestamp::rfc3339_ms(to),
        "first": range.first.to_string(),
        "last": range.last.to_string(),
        "signed": signed,
    });
    Ok(json_response(StatusCode::OK, body.to_string()))
}

async fn tickets(
    State(issuer): Shared,
    Path(sequence): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Response, IssueError> {
    let q = Query::parse(raw.as_deref(), &["count", "numbers"])?;
    let count = match q.count.as_deref() {
        None => 1,
        Some(text) => parse_count(text, shardflake_tickets::MAX_COUNT as u64)?,
    };
    let numbers = q.numbers()?;
    let ids = issuer.next_tickets(&sequence, count).await?;
    let body = json::tickets(&sequence, &ids, numbers);
    Ok(json_response(StatusCode::OK, body))
}

async fn info(State(issuer): Shared) -> Response {
    let body = serde_json::to_string(&issuer.info()).unwrap_or_else(|_| "{}".into());
    json_response(StatusCode::OK, body)
}

async fn healthz() -> Response {
    json_response(StatusCode::OK, "{\"status\":\"ok\"}")
}

async fn readyz(State(issuer): Shared) -> Result<Response, IssueError> {
    let node_id = issuer.readiness()?;
    let state = issuer.lease_state().name();
    Ok(json_response(
        StatusCode::OK,
        json!({ "ready": true, "node_id": node_id, "lease_state": state }).to_string(),
    ))
}

async fn metrics_text(State(issuer): Shared) -> Response {
    let mut r = Response::new(Body::from(metrics::render(&issuer)));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4"),
    );
    r
}

async fn not_found() -> IssueError {
    IssueError::NoRoute
}

async fn method_not_allowed() -> IssueError {
    IssueError::MethodNotAllowed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    /// A router over an issuer holding node id 3, with `token` required.
    fn app(token: Option<&str>) -> Router {
        let issuer = Arc::new(Issuer::new(Config::from_toml("").unwrap()));
        let active = issuer.make_active(3, 0, None, u64::MAX).unwrap();
        issuer.publish(Some(Arc::new(active)));
        issuer.set_state(crate::issuer::LeaseState::Static);
        router_with_token(issuer, token.and_then(ApiToken::new))
    }

    /// One request through the router, in process: status, code of an
    /// error body (or the body), and the `WWW-Authenticate` header.
    async fn call(app: &Router, path: &str, auth: Option<&str>) -> (u16, String, String) {
        use tower::ServiceExt;
        let mut req = axum::http::Request::get(path);
        if let Some(auth) = auth {
            req = req.header(header::AUTHORIZATION, auth);
        }
        let resp = app
            .clone()
            .oneshot(req.body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = resp.status().as_u16();
        let challenge = resp
            .headers()
            .get(header::WWW_AUTHENTICATE)
            .map_or(String::new(), |v| v.to_str().unwrap().to_string());
        let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .unwrap();
        let body = String::from_utf8(body.to_vec()).unwrap();
        let code = serde_json::from_str::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v["error"]["code"].as_str().map(str::to_string))
            .unwrap_or(body);
        (status, code, challenge)
    }

    #[tokio::test]
    async fn the_bearer_token_guards_the_api_not_health() {
        let app = app(Some("s3cret"));
        for path in ["/v1/id", "/v1/ids?count=2", "/v1/decode/1", "/v1/info"] {
            for auth in [
                None,
                Some("Bearer nope"),
                Some("Basic s3cret"),
                Some("s3cret"),
            ] {
                let (status, code, challenge) = call(&app, path, auth).await;
                assert_eq!(
                    (status, code.as_str(), challenge.as_str()),
                    (401, "unauthorized", "Bearer"),
                    "{path} {auth:?}"
                );
            }
            let (status, body, _) = call(&app, path, Some("Bearer s3cret")).await;
            assert_eq!(status, 200, "{path}: {body}");
        }
        let post = axum::http::Request::post("/v1/ids")
            .body(Body::from(r#"{"count":2}"#))
            .unwrap();
        let resp = tower::ServiceExt::oneshot(app.clone(), post).await.unwrap();
        assert_eq!(resp.status(), 401);
        // Probes, scrapers and the document need no secret.
        for path in ["/healthz", "/readyz", "/metrics", "/openapi.json"] {
            let (status, body, _) = call(&app, path, None).await;
            assert_eq!(status, 200, "{path}: {body}");
        }
        // And without a token configured, nothing asks for one.
        let (status, body, _) = call(&self::app(None), "/v1/id", None).await;
        assert_eq!(status, 200, "{body}");
    }

    #[tokio::test]
    async fn openapi_lists_the_bearer_scheme_where_it_applies() {
        let doc = |app: Router| async move {
            let (_, body, _) = call(&app, "/openapi.json", None).await;
            serde_json::from_str::<serde_json::Value>(&body).unwrap()
        };
        let secured = doc(app(Some("s3cret"))).await;
        assert_eq!(
            secured["components"]["securitySchemes"]["bearer"]["scheme"],
            "bearer"
        );
        assert_eq!(
            secured["paths"]["/v1/id"]["get"]["security"][0]["bearer"],
            json!([])
        );
        assert_eq!(
            secured["paths"]["/v1/ids"]["post"]["security"][0]["bearer"],
            json!([])
        );
        assert!(secured["paths"]["/healthz"]["get"]["security"].is_null());
        let codes = &secured["components"]["schemas"]["Error"]["properties"]["error"]["properties"]
            ["code"]["enum"];
        let listed: Vec<&str> = crate::error::Code::ALL.iter().map(|c| c.as_str()).collect();
        assert_eq!(codes, &json!(listed));
        let open = doc(app(None)).await;
        assert!(open["paths"]["/v1/id"]["get"]["security"].is_null());
    }
}
