//! Topology TOML: a topology that parses passes its own validation (parse
//! validates) and its derived SQL names are plain identifiers; anything
//! else is a typed error.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shardflake_db::Topology;
use shardflake_db::topology::is_ident;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(topology) = Topology::parse(text) else {
        return;
    };
    for shard in 0..topology.shards().min(4) {
        let schema = topology.schema(shard);
        assert!(is_ident(&schema), "schema name {schema:?}");
    }
    let _ = topology.layout().to_string();
});
