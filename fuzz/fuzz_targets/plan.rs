//! `plan` inputs: any need gives a layout that meets it or a typed error.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shardflake::plan::{Need, suggest};

fuzz_target!(|data: [u64; 4]| {
    let need = Need {
        nodes: data[0],
        rate_per_node: f64::from_bits(data[1]),
        years: f64::from_bits(data[2]),
        epoch_ms: data[3],
    };
    if let Ok(layout) = suggest(&need) {
        let capacity = layout.capacity();
        assert!(capacity.nodes >= u128::from(need.nodes), "{need:?} -> {layout}");
    }
});
