//! The HTTP/JSON API (axum).
//!
//! | route | answer |
//! |---|---|
//! | `GET /v1/id[?numbers=true][&format=hex][&kind=uuidv7]` | `{"id":"…"}` |
//! | `GET /v1/ids?count=N[&numbers=true]`, `POST /v1/ids {"count":N}` | `{"count":N,"ids":[…]}`, one contiguous reservation |
//! | `GET /v1/shard-id?key=K` | `{"id":"…","shard":S,"key":K}` (layouts with a `shard` field) |
//! | `GET /v1/decode/{id}[?format=hex]` | the id's parts |
//! | `GET /v1/info` | layout and node identity |
//! | `GET /v1/tickets/{sequence}[?count=N][&numbers=true]` | `{"sequence":S,"count":N,"ids":[…]}`, ticket server ids (`--tickets`) |
//! | `GET /healthz`, `/readyz`, `/metrics`, `/openapi.json` | health, readiness (node id held), Prometheus, OpenAPI 3 |
//!
//! With an API token configured ([`crate::ApiToken`]), the `/v1/` routes answer
//! 401 `unauthorized` without `Authorization: Bearer <token>`; health,
//! readiness, metrics and the OpenAPI document stay open.
//!
//! Ids are JSON strings (JavaScript loses integers above 2^53) unless
//! `numbers=true`. Errors are `{"error":{"code","message"}}`. Query strings
//! are parsed by hand so every bad input gets that shape, and the hot path
//! formats its answer into a small buffer without serde.

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
use shardflake::{Batch, Format, Id};

use crate::auth::{ApiToken, Unauthorized};
use crate::error::{ApiError, ErrorKind, IssueError};
use crate::issuer::Issuer;
use crate::metrics;

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
    let doc: Arc<str> = openapi_json(&issuer.config, token.is_some(), sequences.as_deref()).into();
    let openapi = move || {
        let doc = doc.clone();
        async move { json_response(StatusCode::OK, doc.to_string()) }
    };
    let api = Router::new()
        .route("/v1/id", get(next_id))
        .route("/v1/ids", get(next_ids_get).post(next_ids_post))
        .route("/v1/shard-id", get(shard_id))
        .route("/v1/decode/{id}", get(decode))
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
/// picks the status.
impl From<IssueError> for ApiError {
    fn from(e: IssueError) -> Self {
        let status = match e.kind() {
            ErrorKind::BadInput => 400,
            ErrorKind::NotFound => 404,
            ErrorKind::Unavailable => 503,
            ErrorKind::Broken => 500,
        };
        ApiError::new(status, e.code(), e.to_string())
    }
}

/// Refused calls without the bearer token: 401 with the documented body,
/// and the scheme to use (RFC 6750, section 3).
impl From<Unauthorized> for ApiError {
    fn from(e: Unauthorized) -> Self {
        ApiError::new(401, e.code(), e.to_string())
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

fn json_response(status: StatusCode, body: impl Into<Body>) -> Response {
    let mut r = Response::new(body.into());
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// The query parameters a route accepts, each at most once. Anything else
/// (an unknown or repeated key) is a 400, never silently ignored. Values
/// stay text here so each gets its own error code below.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Query {
    count: Option<String>,
    numbers: Option<String>,
    format: Option<String>,
    kind: Option<String>,
    key: Option<String>,
}

impl Query {
    /// Parses `raw`, refusing the keys `allowed` does not list.
    fn parse(raw: Option<&str>, allowed: &[&str]) -> Result<Query, ApiError> {
        let Some(raw) = raw else {
            return Ok(Query::default());
        };
        let q: Query = serde_urlencoded::from_str(raw)
            .map_err(|e| ApiError::bad_request("invalid_parameter", e.to_string()))?;
        let given = [
            ("count", q.count.is_some()),
            ("numbers", q.numbers.is_some()),
            ("format", q.format.is_some()),
            ("kind", q.kind.is_some()),
            ("key", q.key.is_some()),
        ];
        if let Some((name, _)) = given
            .iter()
            .find(|(name, present)| *present && !allowed.contains(name))
        {
            return Err(ApiError::bad_request(
                "invalid_parameter",
                format!("unknown parameter `{name}` on this route; expected one of {allowed:?}"),
            ));
        }
        Ok(q)
    }
    /// `numbers`: `true`/`1` or `false`/`0`. An empty value is refused, not
    /// read as true: the document declares a boolean, and `numbers=` is
    /// none.
    fn numbers(&self) -> Result<bool, ApiError> {
        match self.numbers.as_deref() {
            None | Some("false" | "0") => Ok(false),
            Some("true" | "1") => Ok(true),
            Some(other) => Err(ApiError::bad_request(
                "invalid_parameter",
                format!("numbers must be true or false, got {other:?}"),
            )),
        }
    }
    fn format(&self) -> Result<Option<Format>, ApiError> {
        parse_format(self.format.as_deref())
    }
    /// `numbers` and `format`, which cannot both be asked for.
    fn output(&self) -> Result<(bool, Option<Format>), ApiError> {
        output(self.numbers()?, self.format()?)
    }
}

/// `format`: dec (the default) or another text form.
fn parse_format(text: Option<&str>) -> Result<Option<Format>, ApiError> {
    match text {
        None | Some("dec") => Ok(None),
        Some(f) => f.parse().map(Some).map_err(|_| {
            ApiError::bad_request(
                "invalid_parameter",
                format!("format must be dec, hex, base32 or base62, got {f:?}"),
            )
        }),
    }
}

/// JSON numbers are decimal: a text form cannot be asked for with them.
fn output(numbers: bool, format: Option<Format>) -> Result<(bool, Option<Format>), ApiError> {
    if numbers && format.is_some() {
        return Err(ApiError::bad_request(
            "invalid_parameter",
            "numbers=true writes ids as JSON numbers, format as strings: ask for one",
        ));
    }
    Ok((numbers, format))
}

/// A whole number written in ASCII digits only (no sign, space or point).
fn parse_digits(text: &str) -> Option<u64> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// Appends `v` in decimal.
pub fn push_u64(buf: &mut Vec<u8>, mut v: u64) {
    let mut tmp = [0u8; 20];
    let mut i = tmp.len();
    loop {
        i -= 1;
        tmp[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    buf.extend_from_slice(&tmp[i..]);
}

fn push_id(buf: &mut Vec<u8>, id: Id, numbers: bool, format: Option<Format>) {
    match format {
        Some(f) => {
            buf.push(b'"');
            buf.extend_from_slice(f.format(id).as_bytes());
            buf.push(b'"');
        }
        None if numbers => push_u64(buf, id.get()),
        None => {
            buf.push(b'"');
            push_u64(buf, id.get());
            buf.push(b'"');
        }
    }
}

async fn next_id(State(issuer): Shared, RawQuery(raw): RawQuery) -> Result<Response, ApiError> {
    let (numbers, format) = if raw.is_none() {
        (false, None)
    } else {
        let q = Query::parse(raw.as_deref(), &["numbers", "format", "kind"])?;
        if let Some(kind) = q.kind.as_deref().filter(|k| *k != "layout") {
            // Their defaults (numbers=false, format=dec) change nothing and
            // are accepted; anything else would be ignored, so it is refused.
            if q.numbers()? || q.format()?.is_some() {
                return Err(ApiError::bad_request(
                    "invalid_parameter",
                    "numbers=true and format apply to layout ids only",
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
    let mut buf = Vec::with_capacity(32);
    buf.extend_from_slice(b"{\"id\":");
    push_id(&mut buf, id, numbers, format);
    buf.push(b'}');
    Ok(json_response(StatusCode::OK, buf))
}

fn parse_count(text: &str, max: u64) -> Result<u64, IssueError> {
    match parse_digits(text) {
        Some(n) if (1..=max).contains(&n) => Ok(n),
        _ => Err(IssueError::InvalidCount {
            text: text.to_string(),
            max,
        }),
    }
}

async fn next_ids_get(
    State(issuer): Shared,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let q = Query::parse(raw.as_deref(), &["count", "numbers", "format"])?;
    let max = issuer.config.max_batch;
    let count = parse_count(q.count.as_deref().unwrap_or(""), max)?;
    let (numbers, format) = q.output()?;
    batch_response(issuer, count, numbers, format).await
}

async fn next_ids_post(State(issuer): Shared, body: Body) -> Result<Response, ApiError> {
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
                    ApiError::new(
                        413,
                        "body_too_large",
                        format!("request body over {max_body} bytes"),
                    )
                } else {
                    ApiError::bad_request("invalid_body", e.to_string())
                },
            );
        }
        Err(_) => {
            return Err(ApiError::new(
                408,
                "body_timeout",
                format!("request body not received within {BODY_READ_TIMEOUT:?}"),
            ));
        }
    };
    // The body's fields one by one: an unknown field, or `null` or another
    // type where a value is expected, is refused rather than read as absent.
    let request: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request("invalid_body", format!("body: {e}")))?;
    if let Some(unknown) = request
        .keys()
        .find(|k| !["count", "numbers", "format"].contains(&k.as_str()))
    {
        return Err(ApiError::bad_request(
            "invalid_body",
            format!("body: unknown field `{unknown}`, expected count, numbers or format"),
        ));
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
            return Err(ApiError::bad_request(
                "invalid_body",
                format!("numbers must be true or false, got {other}"),
            ));
        }
    };
    let format = match request.get("format") {
        None => None,
        Some(serde_json::Value::String(f)) => parse_format(Some(f))?,
        Some(other) => {
            return Err(ApiError::bad_request(
                "invalid_body",
                format!("format must be a string, got {other}"),
            ));
        }
    };
    let (numbers, format) = output(numbers, format)?;
    batch_response(issuer, count, numbers, format).await
}

fn format_batch(batch: &Batch, numbers: bool, format: Option<Format>) -> Vec<u8> {
    let per = if numbers { 20 } else { 22 };
    let mut buf = Vec::with_capacity(32 + batch.len() as usize * per);
    buf.extend_from_slice(b"{\"count\":");
    push_u64(&mut buf, batch.len());
    buf.extend_from_slice(b",\"ids\":[");
    for (i, id) in batch.iter().enumerate() {
        if i > 0 {
            buf.push(b',');
        }
        push_id(&mut buf, id, numbers, format);
    }
    buf.extend_from_slice(b"]}");
    buf
}

async fn batch_response(
    issuer: Arc<Issuer>,
    count: u64,
    numbers: bool,
    format: Option<Format>,
) -> Result<Response, ApiError> {
    let issued = issuer.next_ids(count).await?;
    let body =
        crate::issuer::encode_batch(count, move || format_batch(&issued.batch, numbers, format))
            .await
            .map_err(|e| ApiError::new(500, "internal", e.to_string()))?;
    Ok(json_response(StatusCode::OK, body))
}

async fn shard_id(State(issuer): Shared, RawQuery(raw): RawQuery) -> Result<Response, ApiError> {
    let q = Query::parse(raw.as_deref(), &["key", "numbers"])?;
    let text = q.key.as_deref().unwrap_or("");
    let key = parse_digits(text).ok_or_else(|| IssueError::InvalidKey(text.to_string()))?;
    let numbers = q.numbers()?;
    let got = issuer.shard_id(key).await?;
    let mut buf = Vec::with_capacity(64);
    buf.extend_from_slice(b"{\"id\":");
    push_id(&mut buf, got.id, numbers, None);
    buf.extend_from_slice(b",\"shard\":");
    push_u64(&mut buf, got.shard);
    buf.extend_from_slice(b",\"key\":");
    push_u64(&mut buf, got.key);
    buf.push(b'}');
    Ok(json_response(StatusCode::OK, buf))
}

/// An id's parts as JSON.
fn parts_json(id: Id, parts: shardflake::Parts) -> serde_json::Value {
    let fields: serde_json::Map<String, serde_json::Value> = parts
        .fields
        .iter()
        .map(|(n, v)| (n.clone(), json!(v)))
        .collect();
    json!({
        "id": id.get().to_string(),
        "timestamp": parts.timestamp(),
        "layout": parts.layout,
        "tick": parts.tick,
        "unix_ms": parts.unix_ms,
        "fields": fields,
        "sequence": parts.sequence,
    })
}

async fn decode(
    State(issuer): Shared,
    path: Result<Path<String>, axum::extract::rejection::PathRejection>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let Path(text) = path.map_err(|e| IssueError::MalformedId(e.body_text()))?;
    let q = Query::parse(raw.as_deref(), &["format"])?;
    let (id, parts) = issuer.decode(&text, q.format()?)?;
    let v = parts_json(id, parts);
    Ok(json_response(StatusCode::OK, v.to_string()))
}

/// Ids of a ticket sequence (`--tickets`): plain integers from the ticket
/// servers, strings unless `numbers=true`; `count` defaults to 1.
async fn tickets(
    State(issuer): Shared,
    Path(sequence): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let q = Query::parse(raw.as_deref(), &["count", "numbers"])?;
    let count = match q.count.as_deref() {
        None => 1,
        Some(text) => parse_count(text, shardflake_tickets::MAX_COUNT as u64)?,
    };
    let numbers = q.numbers()?;
    let ids = issuer.next_tickets(&sequence, count).await?;
    let mut buf = Vec::with_capacity(48 + ids.len() * 22);
    buf.extend_from_slice(b"{\"sequence\":");
    // Only a configured name gets here, and those are [a-z_][a-z0-9_]*
    // (the configuration checks): nothing to escape.
    buf.push(b'"');
    buf.extend_from_slice(sequence.as_bytes());
    buf.extend_from_slice(b"\",\"count\":");
    push_u64(&mut buf, ids.len() as u64);
    buf.extend_from_slice(b",\"ids\":[");
    for (i, &id) in ids.iter().enumerate() {
        if i > 0 {
            buf.push(b',');
        }
        if numbers {
            push_u64(&mut buf, id);
        } else {
            buf.push(b'"');
            push_u64(&mut buf, id);
            buf.push(b'"');
        }
    }
    buf.extend_from_slice(b"]}");
    Ok(json_response(StatusCode::OK, buf))
}

async fn info(State(issuer): Shared) -> Response {
    let body = serde_json::to_string(&issuer.info()).unwrap_or_else(|_| "{}".into());
    json_response(StatusCode::OK, body)
}

async fn healthz() -> Response {
    json_response(StatusCode::OK, "{\"status\":\"ok\"}")
}

async fn readyz(State(issuer): Shared) -> Result<Response, ApiError> {
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

/// The OpenAPI document of this server: the shipped one, with what this
/// configuration decides filled in (the largest batch; the shard-id route
/// only where the layout has a shard field; the tickets route only with
/// `--tickets`), so a client generated from it or a fuzzer reading it
/// knows exactly what is accepted.
pub fn openapi_document(config: &crate::config::Config) -> String {
    openapi_json(config, config.api_token_file.is_some(), None)
}

/// The OpenAPI document; `token_required` adds the bearer scheme to the
/// `/v1/` operations; `sequences`, the configured ticket sequences with
/// their largest count, each get a path of their own (the largest count
/// depends on the sequence's mode, which a shared `{sequence}` parameter
/// could not say).
fn openapi_json(
    config: &crate::config::Config,
    token_required: bool,
    sequences: Option<&[(String, usize)]>,
) -> String {
    let mut doc: serde_json::Value =
        serde_json::from_str(include_str!("openapi.json")).unwrap_or_default();
    let max = config.max_batch;
    if let Some(p) = doc
        .pointer_mut("/paths/~1v1~1ids/get/parameters")
        .and_then(|p| p.as_array_mut())
    {
        for param in p.iter_mut().filter(|p| p["name"] == "count") {
            param["schema"]["maximum"] = json!(max);
        }
    }
    if let Some(count) = doc.pointer_mut(
        "/paths/~1v1~1ids/post/requestBody/content/application~1json/schema/properties/count",
    ) {
        count["maximum"] = json!(max);
    }
    if token_required && let Some(paths) = doc.get_mut("paths").and_then(|p| p.as_object_mut()) {
        // Every operation under /v1/ needs the token; the rest stay open.
        let api = paths
            .iter_mut()
            .filter(|(path, _)| path.starts_with("/v1/"));
        for (_, item) in api {
            // Path items here hold operations only (get, post).
            for op in item
                .as_object_mut()
                .into_iter()
                .flat_map(|o| o.values_mut())
            {
                op["security"] = json!([{ "bearer": [] }]);
                op["responses"]["401"] = json!({ "$ref": "#/components/responses/Error" });
            }
        }
    }
    if config.shard_field.is_none()
        && let Some(paths) = doc.get_mut("paths").and_then(|p| p.as_object_mut())
    {
        paths.remove("/v1/shard-id");
    } else if let Some(p) = doc
        .pointer_mut("/paths/~1v1~1shard-id/get/parameters")
        .and_then(|p| p.as_array_mut())
    {
        for param in p.iter_mut().filter(|p| p["name"] == "key") {
            param["schema"]["maximum"] = json!(u64::MAX);
        }
    }
    if let Some(paths) = doc.get_mut("paths").and_then(|p| p.as_object_mut()) {
        let template = "/v1/tickets/{sequence}";
        if config.tickets.is_none() {
            paths.remove(template);
        } else if let (Some(sequences), Some(item)) = (sequences, paths.remove(template)) {
            for (name, max) in sequences {
                paths.insert(
                    format!("/v1/tickets/{name}"),
                    ticket_path(&item, name, *max),
                );
            }
        }
    }
    doc.to_string()
}

/// The tickets path item for one sequence: the `{sequence}` parameter
/// gone, `count` up to `max`.
fn ticket_path(template: &serde_json::Value, name: &str, max: usize) -> serde_json::Value {
    let mut item = template.clone();
    if let Some(params) = item
        .pointer_mut("/get/parameters")
        .and_then(|p| p.as_array_mut())
    {
        params.retain(|p| p["name"] != "sequence");
        for count in params.iter_mut().filter(|p| p["name"] == "count") {
            count["schema"]["maximum"] = json!(max);
            count["description"] = json!(format!("1 (the default) to {max}"));
        }
    }
    item["get"]["summary"] = json!(format!("Ids of the ticket sequence {name}"));
    item
}

async fn not_found() -> ApiError {
    ApiError::new(404, "not_found", "no such route; see /openapi.json")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        405,
        "method_not_allowed",
        "method not allowed on this route",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn decimal_formatting() {
        for v in [0, 7, 10, 454_947_766_275_222_906, u64::MAX] {
            let mut b = Vec::new();
            push_u64(&mut b, v);
            assert_eq!(String::from_utf8(b).unwrap(), v.to_string());
        }
    }

    #[test]
    fn query_parsing() {
        let ids = &["count", "numbers", "format"];
        let q = Query::parse(Some("count=5&numbers=true"), ids).unwrap();
        assert_eq!(q.count.as_deref(), Some("5"));
        assert!(q.numbers().unwrap());
        let key = Query::parse(Some("key=a%20b+c"), &["key"]).unwrap();
        assert_eq!(key.key.as_deref(), Some("a b c"));
        assert_eq!(parse_count("5", 10).unwrap(), 5);
        for bad in [
            "0",
            "-1",
            "x",
            "11",
            "",
            "1.5",
            "+5",
            " 5",
            "5 ",
            "99999999999999999999999",
        ] {
            assert_eq!(
                parse_count(bad, 10).unwrap_err().code(),
                "invalid_count",
                "{bad:?}"
            );
        }
    }

    #[test]
    fn query_refuses_what_it_would_ignore() {
        let ids = &["count", "numbers", "format"];
        let refused = |raw: &str, allowed: &[&str]| {
            let e = Query::parse(Some(raw), allowed)
                .and_then(|q| q.output())
                .unwrap_err();
            (e.status, e.code)
        };
        for raw in [
            "count=5&count=999999",
            "count=5&bogus=1",
            "count=5&key=3",
            "count=5&numbers=bogus",
            "count=5&numbers=true&format=hex",
            "count=5&format=octal",
        ] {
            assert_eq!(refused(raw, ids), (400, "invalid_parameter"), "{raw}");
        }
        assert_eq!(
            refused("format=hex&format=dec", &["format"]),
            (400, "invalid_parameter")
        );
    }

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
        let open = doc(app(None)).await;
        assert!(open["paths"]["/v1/id"]["get"]["security"].is_null());
    }
}
