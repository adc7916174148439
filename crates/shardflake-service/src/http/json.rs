//! The JSON answers. The hot paths (ids, batches, tickets) are written into
//! a small buffer by hand, without serde; the rest use `serde_json`.

use axum::body::Body;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use serde_json::json;
use shardflake::{Batch, Format, Id};

/// A response with a JSON body.
pub(super) fn json_response(status: StatusCode, body: impl Into<Body>) -> Response {
    let mut r = Response::new(body.into());
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
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

/// Appends an id: a JSON string unless `numbers`, in `format` if given.
pub(super) fn push_id(buf: &mut Vec<u8>, id: Id, numbers: bool, format: Option<Format>) {
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

/// `{"id":…}`.
pub(super) fn id(id: Id, numbers: bool, format: Option<Format>) -> Vec<u8> {
    let mut buf = Vec::with_capacity(32);
    buf.extend_from_slice(b"{\"id\":");
    push_id(&mut buf, id, numbers, format);
    buf.push(b'}');
    buf
}

/// `{"count":N,"ids":[…]}`.
pub(super) fn batch(batch: &Batch, numbers: bool, format: Option<Format>) -> Vec<u8> {
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

/// `{"id":…,"shard":S,"key":K}`.
pub(super) fn shard_id(id: Id, shard: u64, key: u64, numbers: bool) -> Vec<u8> {
    let mut buf = Vec::with_capacity(64);
    buf.extend_from_slice(b"{\"id\":");
    push_id(&mut buf, id, numbers, None);
    buf.extend_from_slice(b",\"shard\":");
    push_u64(&mut buf, shard);
    buf.extend_from_slice(b",\"key\":");
    push_u64(&mut buf, key);
    buf.push(b'}');
    buf
}

/// `{"sequence":S,"count":N,"ids":[…]}`: ticket ids, strings unless
/// `numbers`.
pub(super) fn tickets(sequence: &str, ids: &[u64], numbers: bool) -> Vec<u8> {
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
    buf
}

/// An id's parts.
pub(super) fn parts(id: Id, parts: shardflake::Parts) -> serde_json::Value {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal_formatting() {
        for v in [0, 7, 10, 454_947_766_275_222_906, u64::MAX] {
            let mut b = Vec::new();
            push_u64(&mut b, v);
            assert_eq!(String::from_utf8(b).unwrap(), v.to_string());
        }
    }
}
