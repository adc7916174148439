//! `/v1/range` (ids by time) and the layout's lifetime on `/v1/info`,
//! `/metrics` and the start warning, through the router.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use shardflake_testkit::{error_code, id_of};

use crate::App;

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

const DAY_MS: u64 = 86_400_000;

/// A layout whose 35 bits of 1 ms ticks (about 398 days) end `days` from now.
fn spec_ending_in(days: u64) -> String {
    let epoch = now_ms() + days * DAY_MS - (1u64 << 35);
    format!("time 35 | node 10 | sequence 12 (epoch {epoch} ms)")
}

#[tokio::test]
async fn range_brackets_ids_just_made_and_refuses_spans_without_ids() -> anyhow::Result<()> {
    let c = App::new("node_id = 4").await?;
    let (_, body) = c.get("/v1/id").await?;
    let id = id_of(&body)?;
    // `to` is excluded: an id of this very millisecond is in `now+1s`'s span.
    let (st, body) = c.get("/v1/range?from=-1m&to=now%2B1s").await?;
    assert_eq!(st, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body)?;
    let bound = |k: &str| v[k].as_str().unwrap().parse::<u64>().unwrap();
    assert!(bound("first") <= id && id <= bound("last"), "{id}: {body}");
    assert_eq!(v["signed"].as_array().unwrap().len(), 1, "{body}");
    // The next minute's range is above every id made now.
    let (_, body) = c.get("/v1/range?from=%2B1m&to=%2B2m").await?;
    let v: serde_json::Value = serde_json::from_str(&body)?;
    assert!(v["first"].as_str().unwrap().parse::<u64>()? > id, "{body}");

    for (path, code) in [
        ("/v1/range", "invalid_parameter"),
        ("/v1/range?from=yesterday", "invalid_parameter"),
        ("/v1/range?from=-1m&until=now", "invalid_parameter"),
        ("/v1/range?from=2000-01-01T00:00:00Z", "time_out_of_range"),
        (
            "/v1/range?from=now&to=2200-01-01T00:00:00Z",
            "time_out_of_range",
        ),
        ("/v1/range?from=now&to=-1h", "invalid_span"),
    ] {
        let (st, body) = c.get(path).await?;
        assert_eq!(
            (st, error_code(&body).as_str()),
            (400, code),
            "{path}: {body}"
        );
    }
    let (_, doc) = c.get("/openapi.json").await?;
    let doc: serde_json::Value = serde_json::from_str(&doc)?;
    assert!(doc["paths"]["/v1/range"]["get"].is_object());
    let codes =
        &doc["components"]["schemas"]["Error"]["properties"]["error"]["properties"]["code"]["enum"];
    for code in ["time_out_of_range", "invalid_span"] {
        assert!(
            codes.as_array().unwrap().iter().any(|c| c == code),
            "{code}"
        );
    }
    Ok(())
}

/// A layout whose end is 6 months away: the lifetime shows on `/v1/info`
/// and `/metrics`, and the start warning fires under a year, not under 90
/// days.
#[tokio::test]
async fn a_layout_ending_in_six_months_is_seen_coming() -> anyhow::Result<()> {
    let spec = spec_ending_in(182);
    let c = App::new(&format!("node_id = 1\nlayout = {spec:?}")).await?;
    let (_, body) = c.get("/v1/info").await?;
    let v: serde_json::Value = serde_json::from_str(&body)?;
    let left_days = v["lifetime_left_s"].as_u64().unwrap() / 86_400;
    assert!((181..=182).contains(&left_days), "{body}");
    assert!(
        v["lifetime_ends"].as_str().unwrap().ends_with('Z'),
        "{body}"
    );
    let (_, metrics) = c.get("/metrics").await?;
    let gauge: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("shardflake_layout_lifetime_seconds "))
        .unwrap()
        .parse()?;
    assert!((gauge / 86_400.0 - 182.0).abs() < 1.0, "{gauge}");

    let layout = shardflake::preset::resolve(&spec)?;
    let year = shardflake_service::LIFETIME_WARNING;
    assert!(shardflake_service::warn_of_lifetime(
        &layout,
        year,
        now_ms()
    ));
    let quarter = Duration::from_secs(90 * 86_400);
    assert!(!shardflake_service::warn_of_lifetime(
        &layout,
        quarter,
        now_ms()
    ));
    // The presets have decades left.
    let snowflake = shardflake::preset::by_name("snowflake")?;
    assert!(!shardflake_service::warn_of_lifetime(
        &snowflake,
        year,
        now_ms()
    ));
    Ok(())
}
