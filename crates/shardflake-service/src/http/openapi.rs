//! The OpenAPI document: the shipped `openapi.json`, with what this
//! server's configuration decides filled in, and the error codes from
//! [`Code::ALL`].

use serde_json::json;

use crate::config::Config;
use crate::error::Code;

/// The OpenAPI document of this server: the shipped one, with what this
/// configuration decides filled in (the largest batch; the shard-id route
/// only where the layout has a shard field; the tickets route only with
/// `--tickets`), so a client generated from it or a fuzzer reading it
/// knows exactly what is accepted.
pub fn openapi_document(config: &Config) -> String {
    openapi_json(config, config.api_token_file.is_some(), None)
}

/// The OpenAPI document; `token_required` adds the bearer scheme to the
/// `/v1/` operations; `sequences`, the configured ticket sequences with
/// their largest count, each get a path of their own (the largest count
/// depends on the sequence's mode, which a shared `{sequence}` parameter
/// could not say).
pub(super) fn openapi_json(
    config: &Config,
    token_required: bool,
    sequences: Option<&[(String, usize)]>,
) -> String {
    let mut doc: serde_json::Value =
        serde_json::from_str(include_str!("../openapi.json")).unwrap_or_default();
    // The error codes, from the one list of them.
    if let Some(code) =
        doc.pointer_mut("/components/schemas/Error/properties/error/properties/code")
    {
        code["enum"] = Code::ALL.iter().map(|c| c.as_str()).collect();
    }
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
