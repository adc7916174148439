//! The HTTP/JSON API through the router alone (no socket, no process), on
//! an issuer with a static node id: answers, errors and their codes, and
//! inputs that would be ignored or reinterpreted.

use shardflake_testkit::{error_code, id_of, snowflake_node};

use crate::App;

/// A number field of a JSON body.
fn id_field(body: &str, field: &str) -> Option<u64> {
    serde_json::from_str::<serde_json::Value>(body).ok()?[field].as_u64()
}

#[tokio::test]
async fn http_api_and_errors() -> anyhow::Result<()> {
    let c = App::new("node_id = 5\nmax_batch = 5000").await?;
    let (st, body) = c.get("/readyz").await?;
    assert_eq!((st, id_field(&body, "node_id")), (200, Some(5)), "{body}");

    let (st, body) = c.get("/v1/id").await?;
    assert_eq!(st, 200, "{body}");
    assert!(
        body.starts_with("{\"id\":\""),
        "ids are JSON strings: {body}"
    );
    let a = id_of(&body)?;
    assert_eq!(snowflake_node(a), 5);
    let (_, body) = c.get("/v1/id?numbers=true").await?;
    assert!(
        body.starts_with("{\"id\":1") || body.starts_with("{\"id\":2"),
        "{body}"
    );
    let b = id_of(&body)?;
    assert!(b > a);

    // A batch is one contiguous, ascending reservation.
    let (st, body) = c.get("/v1/ids?count=5000").await?;
    assert_eq!(st, 200);
    let v: serde_json::Value = serde_json::from_str(&body)?;
    let ids: Vec<u64> = v["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_str().unwrap().parse().unwrap())
        .collect();
    assert_eq!(ids.len(), 5000);
    assert!(ids[0] > b && ids.windows(2).all(|w| w[0] < w[1]));
    let (st, body) = c.post("/v1/ids", r#"{"count":3,"numbers":true}"#).await?;
    assert_eq!(st, 200, "{body}");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&body)?["count"],
        3
    );

    for bad in ["0", "-1", "abc", "5001", "1e3", ""] {
        let (st, body) = c.get(&format!("/v1/ids?count={bad}")).await?;
        assert_eq!(
            (st, error_code(&body).as_str()),
            (400, "invalid_count"),
            "count={bad}: {body}"
        );
    }
    let (st, body) = c.get("/v1/ids").await?;
    assert_eq!((st, error_code(&body).as_str()), (400, "invalid_count"));
    for bad in [
        r#"{"count":0}"#,
        r#"{"count":-3}"#,
        r#"{"count":"x"}"#,
        r#"{"count":1.5}"#,
        r#"{}"#,
    ] {
        let (st, body) = c.post("/v1/ids", bad).await?;
        assert_eq!(
            (st, error_code(&body).as_str()),
            (400, "invalid_count"),
            "{bad}: {body}"
        );
    }
    let (st, body) = c.post("/v1/ids", "not json").await?;
    assert_eq!((st, error_code(&body).as_str()), (400, "invalid_body"));
    let (st, body) = c.post("/v1/ids", &"x".repeat(10_000)).await?;
    assert_eq!((st, error_code(&body).as_str()), (413, "body_too_large"));

    let (st, body) = c.get(&format!("/v1/decode/{a}")).await?;
    assert_eq!(st, 200);
    let v: serde_json::Value = serde_json::from_str(&body)?;
    assert_eq!(v["fields"]["node"], 5);
    assert_eq!(v["layout"], "snowflake");
    let (st, body) = c.get(&format!("/v1/decode/{a:016x}?format=hex")).await?;
    assert_eq!(
        (
            st,
            serde_json::from_str::<serde_json::Value>(&body)?["id"].clone()
        ),
        (200, serde_json::json!(a.to_string()))
    );
    for bad in ["12x", "99999999999999999999", "%FF%FE", "-5"] {
        let (st, body) = c.get(&format!("/v1/decode/{bad}")).await?;
        assert_eq!(
            (st, error_code(&body).as_str()),
            (400, "malformed_id"),
            "{bad}: {body}"
        );
    }

    for kind in ["uuidv4", "uuidv7", "objectid"] {
        let (st, body) = c.get(&format!("/v1/id?kind={kind}")).await?;
        assert_eq!(st, 200, "{body}");
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&body)?["kind"],
            kind
        );
    }
    let (st, body) = c.get("/v1/id?kind=nope").await?;
    assert_eq!((st, error_code(&body).as_str()), (400, "unknown_kind"));
    let (st, body) = c.get("/v1/shard-id?key=31341").await?;
    assert_eq!((st, error_code(&body).as_str()), (400, "no_shard_field"));
    let (st, body) = c.get("/nowhere").await?;
    assert_eq!((st, error_code(&body).as_str()), (404, "not_found"));
    let (st, body) = c.request("DELETE", "/v1/id", "").await?;
    assert_eq!(
        (st, error_code(&body).as_str()),
        (405, "method_not_allowed")
    );

    let (st, body) = c.get("/v1/info").await?;
    assert_eq!(st, 200);
    let v: serde_json::Value = serde_json::from_str(&body)?;
    assert_eq!(
        (v["node_id"].as_u64(), v["lease_state"].as_str()),
        (Some(5), Some("static"))
    );
    let (st, body) = c.get("/openapi.json").await?;
    assert_eq!(st, 200);
    assert!(serde_json::from_str::<serde_json::Value>(&body)?["paths"]["/v1/ids"].is_object());
    let (st, body) = c.get("/healthz").await?;
    assert_eq!(st, 200, "{body}");
    let (_, metrics) = c.get("/metrics").await?;
    assert!(
        metrics.contains("shardflake_ids_issued_total 5005"),
        "{metrics}"
    );
    assert!(metrics.contains("shardflake_batches_total 2"), "{metrics}");
    assert!(metrics.contains("shardflake_lease_held 1"));
    Ok(())
}

#[tokio::test]
async fn inputs_that_would_be_ignored_or_reinterpreted_are_refused() -> anyhow::Result<()> {
    let c = App::new("node_id = 6").await?;
    for (path, code) in [
        // The first `count` used to win silently.
        ("/v1/ids?count=5&count=999999", "invalid_parameter"),
        ("/v1/ids?count=5&numbers=bogus", "invalid_parameter"),
        ("/v1/ids?count=5&bogus=1", "invalid_parameter"),
        ("/v1/ids?count=%2B5", "invalid_count"),
        ("/v1/ids?count=%205", "invalid_count"),
        (
            "/v1/ids?count=5&numbers=true&format=hex",
            "invalid_parameter",
        ),
        ("/v1/id?numbers=true&format=hex", "invalid_parameter"),
        ("/v1/id?numbers=maybe", "invalid_parameter"),
        ("/v1/id?count=5", "invalid_parameter"),
        ("/v1/id?kind=uuidv4&format=hex", "invalid_parameter"),
        ("/v1/decode/5?format=hex&format=dec", "invalid_parameter"),
        ("/v1/shard-id?key=1&key=2", "invalid_parameter"),
    ] {
        let (st, body) = c.get(path).await?;
        assert_eq!(
            (st, error_code(&body).as_str()),
            (400, code),
            "{path}: {body}"
        );
    }
    for (body, code) in [
        (r#"{"count":5,"extra":1}"#, "invalid_body"),
        (r#"{"count":5,"numbers":"yes"}"#, "invalid_body"),
        (
            r#"{"count":5,"numbers":true,"format":"hex"}"#,
            "invalid_parameter",
        ),
        (r#"{"count":5,"format":"octal"}"#, "invalid_parameter"),
        (r#"{"count":" 5"}"#, "invalid_count"),
    ] {
        let (st, answer) = c.post("/v1/ids", body).await?;
        assert_eq!(
            (st, error_code(&answer).as_str()),
            (400, code),
            "{body}: {answer}"
        );
    }
    // `format` in the body is honoured, as in the query.
    let (st, body) = c.post("/v1/ids", r#"{"count":2,"format":"hex"}"#).await?;
    assert_eq!(st, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body)?;
    for id in v["ids"].as_array().unwrap() {
        let hex = id.as_str().unwrap();
        assert!(
            hex.len() == 16 && u64::from_str_radix(hex, 16).is_ok(),
            "{hex}"
        );
    }
    Ok(())
}
