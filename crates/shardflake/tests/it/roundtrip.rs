//! Property tests over random valid layouts: compose/decode, every text
//! form, order, and the layout spec all round-trip.

use proptest::prelude::*;
use shardflake::{FieldKind, Format, Id, IdError, Layout, preset};

/// A random valid layout with up to three node fields in random places
/// (time always above the sequence, so ids sort by time).
fn layouts() -> impl Strategy<Value = Layout> {
    (
        1u32..=45,
        1u32..=22,
        prop::collection::vec(1u32..=12, 0..=3),
        any::<prop::sample::Index>(),
        prop::collection::vec(any::<prop::sample::Index>(), 3),
        0u64..1_700_000_000_000,
        prop::sample::select(vec![1u64, 2, 10, 1000]),
        any::<prop::sample::Index>(),
    )
        .prop_filter("fits in 64 bits", |(t, s, nodes, ..)| {
            t + s + nodes.iter().sum::<u32>() <= 64
        })
        .prop_map(|(t, s, nodes, seq_at, node_at, epoch, tick, start)| {
            // Time first, then the sequence somewhere below it, then each node field anywhere.
            let mut order: Vec<(String, FieldKind, u32)> =
                vec![("time".into(), FieldKind::Time, t)];
            order.insert(
                seq_at.index(1) + 1,
                ("sequence".into(), FieldKind::Sequence, s),
            );
            for (i, bits) in nodes.iter().enumerate() {
                let at = node_at[i].index(order.len() + 1);
                order.insert(at, (format!("n{i}"), FieldKind::Node, *bits));
            }
            let builder = order.into_iter().fold(
                Layout::builder("random")
                    .epoch_ms(epoch)
                    .tick_ms(tick)
                    .random_start(start.index(s as usize + 1) as u32),
                |b, (name, kind, bits)| b.field(name, kind, bits),
            );
            builder.build().unwrap()
        })
}

/// A layout with random in-range parts.
fn layouts_with_parts() -> impl Strategy<Value = (Layout, u64, Vec<u64>, u64)> {
    layouts().prop_flat_map(|l| {
        let node_max: Vec<u64> = l.node_fields().map(|f| f.max()).collect();
        (
            Just(l.clone()),
            0..=l.max_tick(),
            node_max.into_iter().map(|m| 0..=m).collect::<Vec<_>>(),
            0..=l.sequence().max(),
        )
    })
}

fn node_values(layout: &Layout, values: &[u64]) -> Vec<(String, u64)> {
    layout
        .node_fields()
        .map(|f| f.name().to_string())
        .zip(values.iter().copied())
        .collect()
}

proptest! {
    #[test]
    fn compose_then_decode_gives_the_parts_back((layout, tick, nodes, seq) in layouts_with_parts()) {
        let named = node_values(&layout, &nodes);
        let refs: Vec<(&str, u64)> = named.iter().map(|(n, v)| (n.as_str(), *v)).collect();
        let bits = layout.nodes(&refs).unwrap();
        let id = layout.compose_tick(tick, &bits, seq).unwrap();
        prop_assert!(id.get() <= layout.max_id());
        let parts = id.decode(&layout).unwrap();
        prop_assert_eq!(parts.tick, tick);
        prop_assert_eq!(parts.unix_ms, layout.epoch_ms() + tick * layout.tick_ms());
        prop_assert_eq!(parts.sequence, seq);
        prop_assert_eq!(parts.fields, named);
    }

    #[test]
    fn ids_sort_by_time_then_sequence((layout, tick, nodes, seq) in layouts_with_parts(), other_tick in any::<u64>(), other_seq in any::<u64>()) {
        let named = node_values(&layout, &nodes);
        let refs: Vec<(&str, u64)> = named.iter().map(|(n, v)| (n.as_str(), *v)).collect();
        let bits = layout.nodes(&refs).unwrap();
        let t2 = other_tick % (layout.max_tick() + 1);
        let s2 = other_seq % (layout.sequence().max() + 1);
        let a = layout.compose_tick(tick, &bits, seq).unwrap();
        let b = layout.compose_tick(t2, &bits, s2).unwrap();
        prop_assert_eq!(a.cmp(&b), (tick, seq).cmp(&(t2, s2)));
    }

    #[test]
    fn out_of_range_parts_are_refused(layout in layouts(), extra in 1u64..1000) {
        let names: Vec<String> = layout.node_fields().map(|f| f.name().to_string()).collect();
        let zeros: Vec<(&str, u64)> = names.iter().map(|n| (n.as_str(), 0)).collect();
        let bits = layout.nodes(&zeros).unwrap();
        let max_seq = layout.sequence().max();
        prop_assert!(layout.compose_tick(0, &bits, max_seq.saturating_add(extra)).is_err() || max_seq == u64::MAX);
        if let Some(tick) = layout.max_tick().checked_add(extra) {
            prop_assert!(layout.compose_tick(tick, &bits, 0).is_err());
        }
        if layout.total_bits() < 64 {
            let above = Id(1u64 << layout.total_bits());
            prop_assert!(matches!(above.decode(&layout), Err(IdError::TooLarge { .. })), "{:?}", above.decode(&layout));
        }
    }

    #[test]
    fn every_text_form_round_trips_and_keeps_order(a in any::<u64>(), b in any::<u64>()) {
        for format in Format::ALL {
            let (ta, tb) = (format.format(Id(a)), format.format(Id(b)));
            prop_assert_eq!(format.parse(&ta), Ok(Id(a)));
            if format.preserves_order() {
                prop_assert_eq!(ta.cmp(&tb), a.cmp(&b), "{}", format);
            }
        }
    }

    #[test]
    fn layout_specs_round_trip(layout in layouts()) {
        prop_assert_eq!(preset::resolve(&layout.to_string()).unwrap(), layout);
    }
}

proptest! {
    /// Text from users never panics a parser: it is an id or a typed error.
    #[test]
    fn parsers_never_panic(text in "\\PC{0,40}", spec in "[a-z0-9 |():,-]{0,60}") {
        for format in Format::ALL {
            let _ = format.parse(&text);
            let _ = shardflake::kind::recognise(&text, format);
        }
        let _ = text.parse::<shardflake::ObjectId>();
        let _ = text.parse::<shardflake::Kind>();
        let _ = shardflake::uuid::namespace(&text);
        let _ = shardflake::timestamp::parse_unix_ms(&text);
        let _ = preset::resolve(&text);
        let _ = preset::resolve(&spec);
    }

    /// Any u64 decodes against every preset without panicking.
    #[test]
    fn decoding_any_number_never_panics(raw in any::<u64>()) {
        for layout in preset::all() {
            match Id(raw).decode(&layout) {
                Ok(parts) => prop_assert_eq!(parts.id, Id(raw)),
                Err(e) => prop_assert!(matches!(e, IdError::TooLarge { .. }), "{e}"),
            }
        }
    }
}
