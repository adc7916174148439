//! Topology TOML: any text parses (and then passes its own validation,
//! which `parse` runs) or gives a typed error, never a panic. A topology
//! that parses has plain schema names, gives every shard one server, and
//! writes TOML that parses back to the same topology.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shardflake_db::pg::Topology;
use shardflake_db::pg::topology::is_ident;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(topology) = Topology::parse(text) else {
        return;
    };
    let shards = topology.shards();
    for shard in [0, shards / 2, shards - 1] {
        let schema = topology.schema(shard);
        assert!(is_ident(&schema), "schema name {schema:?}");
        assert!(
            topology.server_of(shard).is_ok(),
            "shard {shard} has no server"
        );
    }
    assert!(topology.server_of(shards).is_err());
    let again = Topology::parse(&topology.to_toml()).expect("its own TOML parses");
    assert_eq!(again.to_toml(), topology.to_toml());
    let _ = topology.layout().to_string();
});
