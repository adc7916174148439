//! `plan` inputs: any need gives a layout that meets it or a typed error,
//! never a panic. A layout it suggests keeps the sign bit clear and has
//! room for the nodes, the rate per node and the years asked for.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shardflake::plan::{Need, suggest};

const MS_PER_YEAR: f64 = 365.25 * 24.0 * 3600.0 * 1000.0;

fuzz_target!(|data: [u64; 4]| {
    let need = Need {
        nodes: data[0],
        rate_per_node: f64::from_bits(data[1]),
        years: f64::from_bits(data[2]),
        epoch_ms: data[3],
    };
    let Ok(layout) = suggest(&need) else {
        return;
    };
    let capacity = layout.capacity();
    assert!(!layout.uses_sign_bit(), "{need:?} -> {layout}");
    assert!(
        capacity.nodes >= u128::from(need.nodes),
        "{need:?} -> {layout}"
    );
    if need.rate_per_node.is_finite() {
        assert!(
            capacity.ids_per_second >= need.rate_per_node,
            "{need:?} -> {layout}"
        );
    }
    if need.years.is_finite() {
        let lasts_ms = capacity.end_of_life_ms - u128::from(need.epoch_ms);
        assert!(
            lasts_ms as f64 >= need.years * MS_PER_YEAR,
            "{need:?} -> {layout}"
        );
    }
    let _ = layout.to_string();
});
