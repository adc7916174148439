//! A small etcd v3 client over etcd's JSON gRPC gateway (`/v3/...`), which
//! etcd 3.4 serves on its client port. Keys and values travel base64, 64-bit
//! numbers as strings. Each call tries the endpoints in turn, starting with
//! the last one that answered, each within the request timeout.
//!
//! Only what node-id leasing needs: range, transactions, lease grant,
//! keep-alive and revoke.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};

/// What went wrong talking to etcd.
#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    /// No endpoint answered.
    #[error("etcd unreachable at {endpoints}: {last}")]
    Unreachable {
        /// The endpoints tried.
        endpoints: String,
        /// The last failure.
        last: String,
        /// Every endpoint refused the connection (nothing listening), as
        /// opposed to a slow answer.
        refused: bool,
    },
    /// etcd answered with an error.
    #[error("etcd error: {0}")]
    Server(String),
    /// An answer that does not read as expected.
    #[error("unexpected etcd answer: {0}")]
    Protocol(String),
}

/// A key-value pair from a range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kv {
    /// The key.
    pub key: Vec<u8>,
    /// The value.
    pub value: Vec<u8>,
    /// The lease the key is attached to (0: none).
    pub lease: i64,
}

/// One comparison of a transaction.
#[derive(Debug, Clone)]
pub enum Compare {
    /// The key does not exist (create revision 0).
    Absent(Vec<u8>),
    /// The key is attached to this lease.
    LeaseIs(Vec<u8>, i64),
    /// The key exists and holds exactly this value.
    ValueIs(Vec<u8>, Vec<u8>),
}

/// One operation of a transaction.
#[derive(Debug, Clone)]
pub enum Op {
    /// Put `key` = `value`, attached to a lease when non-zero.
    Put(Vec<u8>, Vec<u8>, i64),
    /// Read one key.
    Get(Vec<u8>),
    /// Read every key under a prefix.
    Prefix(Vec<u8>),
}

type Conn = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

/// A client for a list of endpoints, keeping one connection to each.
#[derive(Debug)]
pub struct Client {
    endpoints: Vec<(String, String)>,
    conns: Vec<tokio::sync::Mutex<Option<Conn>>>,
    timeout: Duration,
    preferred: AtomicUsize,
}

impl Client {
    /// A client for `http://host:port` endpoints.
    pub fn new(endpoints: &[String], timeout: Duration) -> Self {
        let endpoints: Vec<(String, String)> = endpoints
            .iter()
            .map(|e| {
                let hostport = e
                    .trim_start_matches("http://")
                    .trim_end_matches('/')
                    .to_string();
                (e.clone(), hostport)
            })
            .collect();
        let conns = (0..endpoints.len())
            .map(|_| tokio::sync::Mutex::new(None))
            .collect();
        Client {
            endpoints,
            conns,
            timeout,
            preferred: AtomicUsize::new(0),
        }
    }

    /// POSTs `body` to `path` on the first endpoint that answers.
    pub async fn call(&self, path: &str, body: &Value) -> Result<Value, EtcdError> {
        let body = Bytes::from(body.to_string());
        let n = self.endpoints.len();
        let start = self.preferred.load(Ordering::Relaxed);
        let mut last = String::from("no endpoints");
        let mut refused = true;
        for i in 0..n {
            let idx = (start + i) % n;
            let (_, hostport) = &self.endpoints[idx];
            let mut conn = self.conns[idx].lock().await;
            let t0 = std::time::Instant::now();
            let answer =
                tokio::time::timeout(self.timeout, post(&mut conn, hostport, path, body.clone()))
                    .await;
            if !matches!(answer, Ok(Ok(_))) {
                // A timed-out or failed connection may be mid-answer: start afresh.
                *conn = None;
            }
            drop(conn);
            if t0.elapsed() > self.timeout / 2 {
                tracing::warn!(path, endpoint = %hostport, took = ?t0.elapsed(), "slow etcd call");
            }
            match answer {
                Ok(Ok((status, value))) => {
                    if status == 200 {
                        self.preferred.store(idx, Ordering::Relaxed);
                        return Ok(value);
                    }
                    let msg = value
                        .get("message")
                        .or_else(|| value.get("error"))
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_string();
                    let code = value.get("code").and_then(Value::as_i64).unwrap_or(0);
                    // 14 UNAVAILABLE, 4 DEADLINE_EXCEEDED: no leader here; try another member.
                    if status >= 500 && (code == 14 || code == 4 || code == 0) {
                        refused = false;
                        last = format!("{hostport}: {status} {msg}");
                        continue;
                    }
                    return Err(EtcdError::Server(format!("{status} {msg}")));
                }
                Ok(Err(e)) => {
                    refused &= e.starts_with("connect: ");
                    last = format!("{hostport}: {e}");
                }
                Err(_) => {
                    refused = false;
                    last = format!("{hostport}: no answer within {:?}", self.timeout);
                }
            }
        }
        Err(EtcdError::Unreachable {
            endpoints: self
                .endpoints
                .iter()
                .map(|(e, _)| e.as_str())
                .collect::<Vec<_>>()
                .join(","),
            last,
            refused,
        })
    }

    /// Keys from `prefix` to its end.
    pub async fn range_prefix(&self, prefix: &[u8]) -> Result<Vec<Kv>, EtcdError> {
        let v = self
            .call(
                "/v3/kv/range",
                &json!({ "key": B64.encode(prefix), "range_end": B64.encode(prefix_end(prefix)) }),
            )
            .await?;
        kvs(&v)
    }

    /// Runs a transaction; `Ok((succeeded, kvs read by Get ops))`.
    pub async fn txn(
        &self,
        compare: &[Compare],
        success: &[Op],
        failure: &[Op],
    ) -> Result<(bool, Vec<Kv>), EtcdError> {
        let compare: Vec<Value> = compare
            .iter()
            .map(|c| match c {
                Compare::Absent(k) => json!({
                    "target": "CREATE", "result": "EQUAL", "key": B64.encode(k), "create_revision": "0"
                }),
                Compare::LeaseIs(k, l) => json!({
                    "target": "LEASE", "result": "EQUAL", "key": B64.encode(k), "lease": l.to_string()
                }),
                Compare::ValueIs(k, v) => json!({
                    "target": "VALUE", "result": "EQUAL", "key": B64.encode(k), "value": B64.encode(v)
                }),
            })
            .collect();
        let ops = |ops: &[Op]| -> Vec<Value> {
            ops.iter()
                .map(|o| match o {
                    Op::Put(k, v, l) => json!({ "request_put": {
                        "key": B64.encode(k), "value": B64.encode(v), "lease": l.to_string()
                    }}),
                    Op::Get(k) => json!({ "request_range": { "key": B64.encode(k) } }),
                    Op::Prefix(k) => json!({ "request_range": {
                        "key": B64.encode(k), "range_end": B64.encode(prefix_end(k))
                    }}),
                })
                .collect()
        };
        let v = self
            .call(
                "/v3/kv/txn",
                &json!({ "compare": compare, "success": ops(success), "failure": ops(failure) }),
            )
            .await?;
        let succeeded = v.get("succeeded").and_then(Value::as_bool).unwrap_or(false);
        let mut out = Vec::new();
        for r in v
            .get("responses")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if let Some(range) = r.get("response_range") {
                out.extend(kvs(range)?);
            }
        }
        Ok((succeeded, out))
    }

    /// Grants a lease; returns its id and TTL in seconds.
    pub async fn grant(&self, ttl_s: u64) -> Result<(i64, u64), EtcdError> {
        let v = self
            .call("/v3/lease/grant", &json!({ "TTL": ttl_s.to_string() }))
            .await?;
        if let Some(e) = v
            .get("error")
            .and_then(Value::as_str)
            .filter(|e| !e.is_empty())
        {
            return Err(EtcdError::Server(e.to_string()));
        }
        Ok((num(&v, "ID")?, num::<u64>(&v, "TTL")?))
    }

    /// Renews a lease; returns the TTL granted, 0 when the lease is gone.
    pub async fn keep_alive(&self, lease: i64) -> Result<u64, EtcdError> {
        let v = self
            .call("/v3/lease/keepalive", &json!({ "ID": lease.to_string() }))
            .await?;
        let result = v.get("result").unwrap_or(&v);
        Ok(opt_num(result, "TTL")?.unwrap_or(0))
    }

    /// Revokes a lease, deleting its keys.
    pub async fn revoke(&self, lease: i64) -> Result<(), EtcdError> {
        self.call("/v3/lease/revoke", &json!({ "ID": lease.to_string() }))
            .await
            .map(drop)
    }
}

async fn post(
    slot: &mut Option<Conn>,
    hostport: &str,
    path: &str,
    body: Bytes,
) -> Result<(u16, Value), String> {
    if slot.as_ref().is_none_or(|c| c.is_closed()) {
        let stream = tokio::net::TcpStream::connect(hostport)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let _ = stream.set_nodelay(true);
        let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        *slot = Some(send);
    }
    let send = slot.as_mut().ok_or("no connection")?;
    send.ready().await.map_err(|e| e.to_string())?;
    let req = Request::post(path)
        .header("host", hostport)
        .header("content-type", "application/json")
        .body(Full::new(body))
        .map_err(|e| e.to_string())?;
    let resp = send.send_request(req).await.map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    let bytes = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    // The keep-alive endpoint streams: the first JSON object is the answer.
    let first = serde_json::Deserializer::from_slice(&bytes)
        .into_iter::<Value>()
        .next()
        .transpose()
        .map_err(|e| format!("bad JSON from etcd: {e}"))?
        .unwrap_or(Value::Null);
    Ok((status, first))
}

fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

fn kvs(v: &Value) -> Result<Vec<Kv>, EtcdError> {
    let mut out = Vec::new();
    for kv in v.get("kvs").and_then(Value::as_array).into_iter().flatten() {
        let b = |name: &str| -> Result<Vec<u8>, EtcdError> {
            match kv.get(name).and_then(Value::as_str) {
                None => Ok(Vec::new()),
                Some(s) => B64
                    .decode(s)
                    .map_err(|e| EtcdError::Protocol(format!("{name}: {e}"))),
            }
        };
        out.push(Kv {
            key: b("key")?,
            value: b("value")?,
            lease: opt_num(kv, "lease")?.unwrap_or(0),
        });
    }
    Ok(out)
}

fn opt_num<T: std::str::FromStr>(v: &Value, name: &str) -> Result<Option<T>, EtcdError> {
    match v.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => s
            .parse()
            .map(Some)
            .map_err(|_| EtcdError::Protocol(format!("{name} = {s:?}"))),
        Some(Value::Number(n)) => n
            .to_string()
            .parse()
            .map(Some)
            .map_err(|_| EtcdError::Protocol(format!("{name} = {n}"))),
        Some(other) => Err(EtcdError::Protocol(format!("{name} = {other}"))),
    }
}

fn num<T: std::str::FromStr>(v: &Value, name: &str) -> Result<T, EtcdError> {
    opt_num(v, name)?.ok_or_else(|| EtcdError::Protocol(format!("no {name} in {v}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_increments_the_last_byte() {
        assert_eq!(prefix_end(b"/a/"), b"/a0".to_vec());
        assert_eq!(prefix_end(&[b'a', 0xff]), b"b".to_vec());
        assert_eq!(prefix_end(&[0xff]), vec![0]);
    }

    #[test]
    fn numbers_come_as_strings_or_numbers() {
        let v = json!({ "ID": "7587", "TTL": 5 });
        assert_eq!(num::<i64>(&v, "ID").unwrap(), 7587);
        assert_eq!(num::<u64>(&v, "TTL").unwrap(), 5);
        assert!(num::<u64>(&v, "X").is_err());
    }
}
