//! Layout spec strings (and preset names): never a panic; a layout that
//! parses builds ids that decode to the fields they were built from.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shardflake::preset;

fuzz_target!(|data: &[u8]| {
    // The spec, then (after a NUL) bytes that choose field values.
    let (spec, values) = match data.iter().position(|b| *b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[][..]),
    };
    let Ok(spec) = std::str::from_utf8(spec) else {
        return;
    };
    let Ok(layout) = preset::resolve(spec) else {
        return;
    };
    let _ = layout.to_string();
    let mut words = values
        .chunks(8)
        .map(|c| c.iter().fold(0u64, |acc, b| acc << 8 | u64::from(*b)));
    let mut next = || words.next().unwrap_or(0);
    let tick = next() & layout.time().max();
    let sequence = next() & layout.sequence().max();
    let names: Vec<String> = layout.node_fields().map(|f| f.name().to_string()).collect();
    let picked: Vec<(&str, u64)> = layout
        .node_fields()
        .map(|f| (f.name(), next() & f.max()))
        .collect();
    let nodes = layout
        .nodes(&picked)
        .expect("values masked to their fields");
    let id = layout
        .compose_tick(tick, &nodes, sequence)
        .expect("values masked to their fields");
    let parts = id.decode(&layout).expect("an id the layout built");
    assert_eq!(parts.tick, tick);
    assert_eq!(parts.sequence, sequence);
    for (name, value) in &picked {
        assert_eq!(parts.field(name), Some(*value), "field {name} of {names:?}");
    }
    // Out-of-range values are errors, not panics.
    let _ = layout.compose_tick(next(), &nodes, next());
    let _ = layout.compose(next(), &nodes, 0);
    let _ = layout.nodes(&[("node", next()), ("nope", 1)]);
});
