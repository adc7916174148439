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

/// Found by schemathesis: `numbers=` (empty) was read as true; the document
/// declares a boolean, and an empty value is none.
#[tokio::test]
async fn an_empty_numbers_is_refused() -> anyhow::Result<()> {
    let c = App::new("node_id = 7\nlayout = \"orders: time 41 | node 6 | shard 6 | sequence 10 (epoch 1735689600000 ms)\"\nshards = 4").await?;
    for path in [
        "/v1/id?numbers=",
        "/v1/ids?count=2&numbers=",
        "/v1/shard-id?key=3&numbers=",
        "/v1/id?numbers=&kind=uuidv4",
    ] {
        let (st, body) = c.get(path).await?;
        assert_eq!(
            (st, error_code(&body).as_str()),
            (400, "invalid_parameter"),
            "{path}: {body}"
        );
    }
    Ok(())
}

/// Whether `values` (query parameter name → value) satisfy the exploded
/// object parameter `schema` of the document: its properties' enums and
/// booleans, `additionalProperties: false`, and `not` over `anyOf` of
/// `required` + `properties.enum` (all the document uses).
fn satisfies(schema: &serde_json::Value, values: &[(&str, &str)]) -> bool {
    let value_of = |v: &str| match v {
        "true" => serde_json::json!(true),
        "false" => serde_json::json!(false),
        s => serde_json::json!(s),
    };
    let matches = |s: &serde_json::Value| -> bool {
        let required = s["required"].as_array().into_iter().flatten();
        let present = required
            .filter_map(|r| r.as_str())
            .all(|r| values.iter().any(|(n, _)| *n == r));
        let props = s["properties"].as_object().into_iter().flatten();
        let allowed = props.into_iter().all(|(name, p)| {
            values
                .iter()
                .filter(|(n, _)| n == name)
                .all(|(_, v)| match p["enum"].as_array() {
                    Some(e) => e.contains(&value_of(v)),
                    None => p["type"] != "boolean" || matches!(*v, "true" | "false"),
                })
        });
        present && allowed
    };
    if !matches(schema)
        || values
            .iter()
            .any(|(n, _)| schema["properties"][n].is_null())
    {
        return false;
    }
    let not = &schema["not"];
    let excluded = match not["anyOf"].as_array() {
        Some(any) => any.iter().any(matches),
        None => !not.is_null() && matches(not),
    };
    !excluded
}

/// Found by schemathesis: combinations of numbers, format and kind that
/// the document called valid were refused. The document now states them
/// (one exploded object parameter with `not`), and the server accepts the
/// harmless defaults with another kind; here every combination is checked
/// both ways: accepted exactly when the document says it is valid.
#[tokio::test]
async fn output_options_are_accepted_exactly_as_documented() -> anyhow::Result<()> {
    let c = App::new("node_id = 8").await?;
    let (_, doc) = c.get("/openapi.json").await?;
    let doc: serde_json::Value = serde_json::from_str(&doc)?;
    let schema_of = |path: &str| -> serde_json::Value {
        let params = doc["paths"][path]["get"]["parameters"].as_array().unwrap();
        let p = params.iter().find(|p| p["name"] == "output").unwrap();
        assert_eq!(
            (&p["style"], &p["explode"]),
            (&serde_json::json!("form"), &serde_json::json!(true))
        );
        p["schema"].clone()
    };
    let body_schema = doc["paths"]["/v1/ids"]["post"]["requestBody"]["content"]["application/json"]
        ["schema"]
        .clone();
    let numbers = [None, Some("true"), Some("false")];
    let formats = [None, Some("dec"), Some("hex"), Some("base62")];
    let kinds = [None, Some("layout"), Some("uuidv4"), Some("objectid")];
    let mut checked = 0;
    for n in numbers {
        for f in formats {
            let mut values: Vec<(&str, &str)> = Vec::new();
            values.extend(n.map(|v| ("numbers", v)));
            values.extend(f.map(|v| ("format", v)));
            for k in kinds {
                let mut values = values.clone();
                values.extend(k.map(|v| ("kind", v)));
                let query: Vec<String> = values.iter().map(|(a, b)| format!("{a}={b}")).collect();
                let path = format!("/v1/id?{}", query.join("&"));
                let (st, body) = c.get(&path).await?;
                let valid = satisfies(&schema_of("/v1/id"), &values);
                assert_eq!(st == 200, valid, "{path}: {st} {body}");
                if !valid {
                    assert_eq!(error_code(&body), "invalid_parameter", "{path}");
                }
                checked += 1;
            }
            let query: Vec<String> = values.iter().map(|(a, b)| format!("&{a}={b}")).collect();
            let path = format!("/v1/ids?count=2{}", query.concat());
            let (st, body) = c.get(&path).await?;
            assert_eq!(
                st == 200,
                satisfies(&schema_of("/v1/ids"), &values),
                "{path}: {st} {body}"
            );
            let mut fields = vec!["\"count\":2".to_string()];
            fields.extend(n.map(|v| format!("\"numbers\":{v}")));
            fields.extend(f.map(|v| format!("\"format\":\"{v}\"")));
            let post = format!("{{{}}}", fields.join(","));
            let (st, body) = c.post("/v1/ids", &post).await?;
            let mut with_count = values.clone();
            with_count.push(("count", "2"));
            let valid = satisfies(&body_schema, &with_count);
            assert_eq!(st == 200, valid, "{post}: {st} {body}");
            checked += 2;
        }
    }
    assert_eq!(checked, 3 * 4 * (4 + 2));
    Ok(())
}

/// A layout's random start comes through the service's `layout` setting
/// (`serve --layout`) like the rest of its spec: `/v1/info` names it, and
/// the service's ticks start at random points rather than at 0.
#[tokio::test]
async fn a_layout_with_a_random_start_starts_ticks_at_random_points() -> anyhow::Result<()> {
    let spec = "time 41 | node 10 | sequence 12 (epoch 1288834974657 ms, random start 12 bits)";
    let c = App::new(&format!("node_id = 5\nlayout = {spec:?}")).await?;
    let (st, body) = c.get("/v1/info").await?;
    assert_eq!(st, 200, "{body}");
    assert!(body.contains("random start 12 bits"), "{body}");
    // Nothing else asks this issuer, so the first id seen in a tick is the
    // tick's first: its sequence is the tick's start.
    let mut starts = std::collections::BTreeMap::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while starts.len() < 8 {
        assert!(std::time::Instant::now() < deadline, "{starts:?}");
        let (_, body) = c.get("/v1/id").await?;
        let id = id_of(&body)?;
        starts.entry(id >> 22).or_insert(id & 0xfff);
    }
    // All eight at 0 would happen once in 4096^8 with the start drawn.
    assert!(starts.values().any(|&s| s != 0), "{starts:?}");
    Ok(())
}
