//! The HTTP/1.1 transport: a small keep-alive connection pool per endpoint
//! (hyper's connection API), `GET /v1/id?numbers=true` and
//! `GET /v1/ids?count=N&numbers=true`, and a fast parser for their answers
//! (falling back to serde_json for anything it does not expect).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper::client::conn::http1::SendRequest;
use hyper::http::uri::Authority;
use hyper_util::rt::TokioIo;
use shardflake::Id;

use crate::client::Request;
use crate::error::{AttemptError, ClientError, FailureKind};

/// Pooled connections idle longer than this are dropped: the service closes
/// keep-alive connections idle for 10 s, and a request racing that close
/// would fail.
const IDLE_MAX: Duration = Duration::from_secs(5);

/// Idle connections kept per endpoint.
const POOL_MAX: usize = 64;

/// `http://host:port[/]` or `host:port` → the authority (`host:port`; port
/// 80 when absent).
pub(crate) fn parse_endpoint(endpoint: &str) -> Result<String, ClientError> {
    let invalid = |reason: &str| ClientError::InvalidEndpoint {
        endpoint: endpoint.to_string(),
        reason: reason.to_string(),
    };
    let rest = if let Some(r) = endpoint.strip_prefix("http://") {
        r
    } else if endpoint.starts_with("https://") {
        return Err(invalid("https is not supported (no TLS in this client)"));
    } else if endpoint.contains("://") {
        return Err(invalid("the scheme must be http://"));
    } else {
        endpoint
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.is_empty() {
        return Err(invalid("no host"));
    }
    if rest.contains(['/', '?', '#', '@']) {
        return Err(invalid("expected http://host:port with no path"));
    }
    let authority: Authority = rest.parse().map_err(|e| invalid(&format!("{e}")))?;
    if authority.host().is_empty() {
        return Err(invalid("no host"));
    }
    match authority.port_u16() {
        Some(_) => Ok(authority.as_str().to_string()),
        // `host()` keeps IPv6 brackets, so anything after it is a port.
        None if authority.as_str().len() == authority.host().len() => {
            Ok(format!("{}:80", authority.as_str()))
        }
        None => Err(invalid("the port must be a number from 0 to 65535")),
    }
}

type Conn = SendRequest<Empty<Bytes>>;

/// One endpoint's connections.
#[derive(Debug)]
pub(crate) struct Node {
    name: String,
    authority: String,
    idle: Mutex<Vec<(Conn, Instant)>>,
}

impl Node {
    pub(crate) fn new(endpoint: &str) -> Result<Node, ClientError> {
        Ok(Node {
            name: endpoint.to_string(),
            authority: parse_endpoint(endpoint)?,
            idle: Mutex::new(Vec::new()),
        })
    }

    pub(crate) async fn fetch(&self, req: Request) -> Result<Vec<Id>, AttemptError> {
        let path = match req {
            Request::One => "/v1/id?numbers=true".to_string(),
            Request::Many(n) => format!("/v1/ids?count={n}&numbers=true"),
        };
        let (status, body) = self.get(&path).await?;
        if status == 200 {
            let parsed = match req {
                Request::One => parse_one(&body).map(|id| vec![id]),
                Request::Many(n) => parse_ids(&body, n),
            };
            return parsed.map_err(|detail| {
                AttemptError::Fatal(ClientError::Malformed {
                    endpoint: self.name.clone(),
                    detail,
                })
            });
        }
        let (code, message) = error_body(&body);
        if status >= 500 || status == 408 || status == 429 {
            Err(AttemptError::Retry(
                FailureKind::Unavailable { code: code.clone() },
                format!("HTTP {status} {code}: {message}"),
            ))
        } else {
            Err(AttemptError::Fatal(ClientError::Rejected {
                endpoint: self.name.clone(),
                status: format!("HTTP {status}"),
                code,
                message,
            }))
        }
    }

    fn take_idle(&self) -> Option<Conn> {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        while let Some((conn, since)) = idle.pop() {
            if !conn.is_closed() && since.elapsed() < IDLE_MAX {
                return Some(conn);
            }
        }
        None
    }

    fn put_idle(&self, conn: Conn) {
        if conn.is_closed() {
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() < POOL_MAX {
            idle.push((conn, Instant::now()));
        }
    }

    async fn connect(&self) -> Result<Conn, AttemptError> {
        let retry = |what: &str, e: &dyn std::fmt::Display| {
            AttemptError::Retry(FailureKind::Connection, format!("{what}: {e}"))
        };
        let stream = tokio::net::TcpStream::connect(&self.authority)
            .await
            .map_err(|e| retry("connect", &e))?;
        let _ = stream.set_nodelay(true);
        let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| retry("handshake", &e))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(send)
    }

    /// GET on a pooled connection (a fresh one if the pooled one turns out
    /// closed by the server: a keep-alive race, not an outage).
    async fn get(&self, path: &str) -> Result<(u16, Bytes), AttemptError> {
        if let Some(conn) = self.take_idle()
            && let Ok(answer) = self.send(conn, path).await
        {
            return Ok(answer);
        }
        let conn = self.connect().await?;
        self.send(conn, path).await
    }

    async fn send(&self, mut conn: Conn, path: &str) -> Result<(u16, Bytes), AttemptError> {
        let retry = |e: hyper::Error| AttemptError::Retry(FailureKind::Connection, e.to_string());
        conn.ready().await.map_err(retry)?;
        let req = hyper::Request::get(path)
            .header(hyper::header::HOST, &self.authority)
            .body(Empty::new())
            .map_err(|e| {
                AttemptError::Fatal(ClientError::InvalidEndpoint {
                    endpoint: self.name.clone(),
                    reason: e.to_string(),
                })
            })?;
        let resp = conn.send_request(req).await.map_err(retry)?;
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await.map_err(retry)?.to_bytes();
        self.put_idle(conn);
        Ok((status, body))
    }
}

/// `{"error":{"code","message"}}` → (code, message); the raw text (cut to
/// 200 bytes) as the message when the body is not that.
fn error_body(body: &[u8]) -> (String, String) {
    let v: Option<serde_json::Value> = serde_json::from_slice(body).ok();
    let field = |k: &str| {
        v.as_ref()
            .and_then(|v| v["error"][k].as_str())
            .map(str::to_string)
    };
    match (field("code"), field("message")) {
        (Some(code), message) => (code, message.unwrap_or_default()),
        _ => {
            let text = String::from_utf8_lossy(body);
            let cut: String = text.chars().take(200).collect();
            (String::new(), cut)
        }
    }
}

/// A decimal u64 at `body[*i..]`, advancing `i`.
#[inline]
fn digits(body: &[u8], i: &mut usize) -> Option<u64> {
    let start = *i;
    let mut v: u64 = 0;
    while let Some(&b) = body.get(*i) {
        if !b.is_ascii_digit() {
            break;
        }
        v = v.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
        *i += 1;
    }
    (*i > start).then_some(v)
}

/// `{"id":N}`.
pub(crate) fn parse_one(body: &[u8]) -> Result<Id, String> {
    let fast = body
        .strip_prefix(b"{\"id\":")
        .and_then(|rest| rest.strip_suffix(b"}"))
        .and_then(|num| {
            let mut i = 0;
            let v = digits(num, &mut i)?;
            (i == num.len()).then_some(Id(v))
        });
    match fast {
        Some(id) => Ok(id),
        None => {
            let v: serde_json::Value = serde_json::from_slice(body).map_err(|e| e.to_string())?;
            id_value(&v["id"]).ok_or_else(|| format!("no id in {}", shorten(body)))
        }
    }
}

/// `{"count":N,"ids":[a,b,…]}` with `count` ids.
pub(crate) fn parse_ids(body: &[u8], count: u64) -> Result<Vec<Id>, String> {
    if let Some(ids) = parse_ids_fast(body, count) {
        return Ok(ids);
    }
    let v: serde_json::Value = serde_json::from_slice(body).map_err(|e| e.to_string())?;
    let list = v["ids"]
        .as_array()
        .ok_or_else(|| format!("no ids in {}", shorten(body)))?;
    list.iter()
        .map(|x| id_value(x).ok_or_else(|| format!("not an id: {x}")))
        .collect()
}

fn parse_ids_fast(body: &[u8], count: u64) -> Option<Vec<Id>> {
    let head = b"{\"count\":";
    let rest = body.strip_prefix(head)?;
    let mut i = 0;
    let n = digits(rest, &mut i)?;
    if n != count {
        return None;
    }
    let rest = rest[i..].strip_prefix(b",\"ids\":[")?;
    let mut ids = Vec::with_capacity(usize::try_from(count).ok()?);
    let mut i = 0;
    if rest.first() != Some(&b']') {
        loop {
            ids.push(Id(digits(rest, &mut i)?));
            match rest.get(i) {
                Some(b',') => i += 1,
                Some(b']') => break,
                _ => return None,
            }
        }
    }
    (&rest[i..] == b"]}").then_some(ids)
}

fn id_value(v: &serde_json::Value) -> Option<Id> {
    match v {
        serde_json::Value::Number(n) => n.as_u64().map(Id),
        serde_json::Value::String(s) => s.parse().ok().map(Id),
        _ => None,
    }
}

fn shorten(body: &[u8]) -> String {
    String::from_utf8_lossy(body).chars().take(200).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints() {
        assert_eq!(
            parse_endpoint("http://127.0.0.1:8080").unwrap(),
            "127.0.0.1:8080"
        );
        assert_eq!(parse_endpoint("127.0.0.1:8080/").unwrap(), "127.0.0.1:8080");
        assert_eq!(parse_endpoint("http://ids.local").unwrap(), "ids.local:80");
        assert_eq!(parse_endpoint("http://[::1]:9").unwrap(), "[::1]:9");
        for bad in [
            "",
            "http://",
            "https://a:1",
            "grpc://a:1",
            "a:1/v1",
            "a:x",
            "u@a:1",
        ] {
            assert!(parse_endpoint(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn answers() {
        assert_eq!(parse_one(b"{\"id\":42}"), Ok(Id(42)));
        assert_eq!(parse_one(b"{ \"id\" : \"43\" }"), Ok(Id(43)));
        assert!(parse_one(b"{\"id\":99999999999999999999}").is_err());
        assert!(parse_one(b"{\"x\":1}").is_err());
        assert_eq!(
            parse_ids(b"{\"count\":3,\"ids\":[1,2,18446744073709551615]}", 3),
            Ok(vec![Id(1), Id(2), Id(u64::MAX)])
        );
        // Other shapes go through serde_json.
        assert_eq!(
            parse_ids(b"{\"ids\": [\"7\", 8], \"count\": 2}", 2),
            Ok(vec![Id(7), Id(8)])
        );
        assert!(parse_ids(b"{\"count\":2,\"ids\":[1,-2]}", 2).is_err());
        assert!(parse_ids(b"{\"count\":2,\"ids\":[1,2", 2).is_err());
        assert_eq!(
            error_body(b"{\"error\":{\"code\":\"busy\",\"message\":\"m\"}}"),
            ("busy".to_string(), "m".to_string())
        );
        assert_eq!(error_body(b"oops").0, "");
    }
}
