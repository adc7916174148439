//! Conversions of `Id` and `ObjectId`: text (`FromStr`, every `Format`),
//! integers (`u64`, `i64` checked and wrapping) and bytes, at their edges.

use proptest::prelude::*;
use shardflake::{ConvertError, Format, Id, ObjectId, ParseError};

const SIGN_BIT: u64 = 1 << 63;

/// Ids at the edges: zero, one, around i64::MAX and the sign bit, u64::MAX.
const EDGES: [u64; 8] = [
    0,
    1,
    i64::MAX as u64 - 1,
    i64::MAX as u64,
    SIGN_BIT,
    SIGN_BIT + 1,
    u64::MAX - 1,
    u64::MAX,
];

// ---- FromStr / Display --------------------------------------------------

#[test]
fn from_str_reads_what_display_writes_at_the_edges() {
    for v in EDGES {
        let id = Id(v);
        assert_eq!(id.to_string(), v.to_string());
        assert_eq!(id.to_string().parse::<Id>(), Ok(id), "{v}");
    }
    assert_eq!("0".parse::<Id>(), Ok(Id(0)));
    assert_eq!("18446744073709551615".parse::<Id>(), Ok(Id(u64::MAX)));
    assert_eq!("9223372036854775807".parse::<Id>(), Ok(Id(i64::MAX as u64)));
    assert_eq!("9223372036854775808".parse::<Id>(), Ok(Id(SIGN_BIT)));
    // Leading zeros are still the number.
    assert_eq!("007".parse::<Id>(), Ok(Id(7)));
}

#[test]
fn from_str_rejects_empty() {
    assert_eq!("".parse::<Id>(), Err(ParseError::Empty));
}

fn invalid_char(text: &str) -> char {
    match text.parse::<Id>() {
        Err(ParseError::InvalidChar { format, input, ch }) => {
            assert_eq!(format, "dec");
            assert_eq!(input, text);
            ch
        }
        other => panic!("{text:?}: expected InvalidChar, got {other:?}"),
    }
}

#[test]
fn from_str_rejects_spaces() {
    assert_eq!(invalid_char(" 1"), ' ');
    assert_eq!(invalid_char("1 "), ' ');
    assert_eq!(invalid_char("1 2"), ' ');
    assert_eq!(invalid_char(" "), ' ');
    assert_eq!(invalid_char("\t1"), '\t');
    assert_eq!(invalid_char("1\n"), '\n');
}

#[test]
fn from_str_rejects_signs() {
    assert_eq!(invalid_char("-1"), '-');
    assert_eq!(invalid_char("+1"), '+');
    assert_eq!(invalid_char("-"), '-');
    assert_eq!(invalid_char("+"), '+');
    assert_eq!(invalid_char("-0"), '-');
    assert_eq!(invalid_char("-9223372036854775808"), '-');
}

#[test]
fn from_str_rejects_overflow() {
    for text in [
        "18446744073709551616",
        "99999999999999999999",
        "100000000000000000000",
        "000018446744073709551616",
    ] {
        assert_eq!(
            text.parse::<Id>(),
            Err(ParseError::Overflow {
                format: "dec",
                input: text.into()
            }),
            "{text}"
        );
    }
}

#[test]
fn from_str_rejects_non_digits() {
    assert_eq!(invalid_char("12a"), 'a');
    assert_eq!(invalid_char("0x10"), 'x');
    assert_eq!(invalid_char("1_000"), '_');
    assert_eq!(invalid_char("1.0"), '.');
    assert_eq!(invalid_char("1e3"), 'e');
    assert_eq!(invalid_char("0XbfGYCuLKE"), 'X');
}

#[test]
fn from_str_rejects_non_ascii() {
    // Non-ASCII digits and letters: Arabic-Indic, full-width, superscript.
    assert_eq!(invalid_char("١٢٣"), '١');
    assert_eq!(invalid_char("１２３"), '１');
    assert_eq!(invalid_char("12³"), '³');
    assert_eq!(invalid_char("1é"), 'é');
    assert_eq!(invalid_char("\u{feff}1"), '\u{feff}');
}

// ---- Every Format ---------------------------------------------------------

#[test]
fn every_format_round_trips_the_edges() {
    for v in EDGES {
        let id = Id(v);
        for f in Format::ALL {
            let text = id.format_as(f);
            assert_eq!(text, f.format(id));
            assert_eq!(Id::parse_as(&text, f), Ok(id), "{f} {text}");
            assert_detected(&text, f);
        }
    }
}

/// Digits alone, with no leading zero, read as decimal whatever wrote them
/// (`8000000000000000` is hex for 2^63 and a decimal id too); any other
/// text of a form is detected as that form.
fn assert_detected(text: &str, f: Format) {
    let digits_only = text.bytes().all(|b| b.is_ascii_digit());
    let ambiguous = digits_only && !text.starts_with('0');
    if ambiguous {
        assert_eq!(Format::detect(text), Format::Dec, "{f} {text}");
    } else {
        assert_eq!(Format::detect(text), f, "{f} {text}");
        assert_eq!(
            Id::parse_as(text, Format::detect(text)),
            Id::parse_as(text, f)
        );
    }
}

#[test]
fn detect_reads_digits_alone_as_decimal() {
    assert_eq!(Id(SIGN_BIT).format_as(Format::Hex), "8000000000000000");
    assert_eq!(Format::detect("8000000000000000"), Format::Dec);
    assert_eq!(
        Id::parse_as("8000000000000000", Format::Hex),
        Ok(Id(SIGN_BIT))
    );
    // A js-safe id (below 2^53) has 16 decimal digits; its hex is padded.
    let js = Id((1 << 53) - 1);
    assert_eq!(js.to_string().len(), 16);
    assert_eq!(Format::detect(&js.to_string()), Format::Dec);
    assert_eq!(Format::detect(&js.format_as(Format::Hex)), Format::Hex);
}

#[test]
fn fixed_width_forms_keep_their_width_and_order() {
    for (f, width) in [
        (Format::Hex, 16),
        (Format::Base32, 13),
        (Format::Base62, 11),
    ] {
        let texts: Vec<String> = EDGES.iter().map(|v| Id(*v).format_as(f)).collect();
        assert!(texts.iter().all(|t| t.len() == width), "{f}: {texts:?}");
        assert!(texts.windows(2).all(|w| w[0] < w[1]), "{f}: {texts:?}");
    }
}

#[test]
fn every_format_rejects_malformed_text_with_a_typed_error() {
    for f in Format::ALL {
        for text in ["", " ", "\t\n"] {
            assert_eq!(
                Id::parse_as(text, f),
                Err(ParseError::Empty),
                "{f} {text:?}"
            );
        }
        for text in ["1 2", "é", "!", "１", "1.0"] {
            assert!(
                matches!(Id::parse_as(text, f), Err(ParseError::InvalidChar { .. })),
                "{f} {text:?}: {:?}",
                Id::parse_as(text, f)
            );
        }
    }
    let overflows = [
        (Format::Dec, "18446744073709551616"),
        (Format::Dec, "-9223372036854775809"),
        (Format::Hex, "10000000000000000"),
        (Format::Base32, "G000000000000"),
        (Format::Base62, "LygHa16AHYG"),
        (Format::Base62, "000000000000LygHa16AHYG"),
    ];
    for (f, text) in overflows {
        assert!(
            matches!(Id::parse_as(text, f), Err(ParseError::Overflow { .. })),
            "{f} {text}"
        );
    }
    // A sign is decimal's alone.
    for f in [Format::Hex, Format::Base62] {
        assert!(matches!(
            Id::parse_as("-1", f),
            Err(ParseError::InvalidChar { ch: '-', .. })
        ));
    }
    assert!(matches!(
        Id::parse_as("+1", Format::Dec),
        Err(ParseError::InvalidChar { ch: '+', .. })
    ));
}

#[test]
fn decimal_reads_a_negative_bigint_as_the_sign_bit_id() {
    assert_eq!(Id::parse_as("-1", Format::Dec), Ok(Id(u64::MAX)));
    assert_eq!(
        Id::parse_as("-9223372036854775808", Format::Dec),
        Ok(Id(SIGN_BIT))
    );
    assert_eq!(Id::parse_as(" 42 ", Format::Dec), Ok(Id(42)));
}

#[test]
fn detect_prefers_decimal_for_digits_without_a_leading_zero() {
    assert_eq!(Format::detect("12345678901"), Format::Dec);
    assert_eq!(Format::detect("1234567890123"), Format::Dec);
    assert_eq!(Format::detect("1234567890123456"), Format::Dec);
    assert_eq!(Format::detect("0"), Format::Dec);
    assert_eq!(Format::detect("-42"), Format::Dec);
    // Padded digits at a fixed width: that form.
    assert_eq!(Format::detect("01234567890"), Format::Base62);
    assert_eq!(Format::detect("0123456789012"), Format::Base32);
    assert_eq!(Format::detect("0123456789012345"), Format::Hex);
    assert_eq!(Format::detect("0x1"), Format::Hex);
    // Fixed-width text that happens to start with 0x is still its form.
    assert_eq!(Format::detect("0X00000000000"), Format::Base32);
    assert_eq!(Format::detect("0xbfGYCuLKE"), Format::Base62);
    assert_eq!(
        Id::parse_as("0X00000000000", Format::Base32),
        Ok(Id(1_044_835_113_549_955_072))
    );
    // Nothing fits: decimal, whose error names the bad character.
    assert_eq!(Format::detect("what"), Format::Dec);
    assert_eq!(Format::detect(""), Format::Dec);
}

// ---- Integers -------------------------------------------------------------

#[test]
fn u64_converts_both_ways_losslessly() {
    for v in EDGES {
        assert_eq!(Id::from(v), Id(v));
        assert_eq!(u64::from(Id(v)), v);
        assert_eq!(u128::from(Id(v)), u128::from(v));
        assert_eq!(i128::from(Id(v)), i128::from(v));
    }
}

#[test]
fn try_from_i64_keeps_the_number_and_refuses_negatives() {
    assert_eq!(Id::try_from(0i64), Ok(Id(0)));
    assert_eq!(Id::try_from(i64::MAX), Ok(Id(i64::MAX as u64)));
    for v in [-1i64, i64::MIN, -679_477_248] {
        assert_eq!(Id::try_from(v), Err(ConvertError::Negative(v)));
    }
}

#[test]
fn try_from_id_for_i64_refuses_the_sign_bit() {
    assert_eq!(i64::try_from(Id(0)), Ok(0));
    assert_eq!(i64::try_from(Id(i64::MAX as u64)), Ok(i64::MAX));
    for v in [SIGN_BIT, SIGN_BIT + 1, u64::MAX] {
        assert_eq!(i64::try_from(Id(v)), Err(ConvertError::AboveI64Max(v)));
    }
}

#[test]
fn wrapping_i64_is_bit_for_bit() {
    let cases: [(u64, i64); 6] = [
        (0, 0),
        (1, 1),
        (i64::MAX as u64, i64::MAX),
        (SIGN_BIT, i64::MIN),
        (SIGN_BIT + 1, i64::MIN + 1),
        (u64::MAX, -1),
    ];
    for (u, i) in cases {
        assert_eq!(Id(u).to_i64_wrapping(), i);
        assert_eq!(Id(u).as_i64(), i);
        assert_eq!(Id::from_i64_wrapping(i), Id(u));
    }
}

#[test]
fn conversion_errors_explain_themselves() {
    let neg = ConvertError::Negative(-1).to_string();
    assert!(neg.contains("from_i64_wrapping"), "{neg}");
    let big = ConvertError::AboveI64Max(u64::MAX).to_string();
    assert!(big.contains("to_i64_wrapping"), "{big}");
}

#[test]
fn hex_formatting_traits_follow_u64() {
    let id = Id(0x0650_4c95_4031_2d7a);
    assert_eq!(format!("{id:x}"), "6504c9540312d7a");
    assert_eq!(format!("{id:016x}"), Format::Hex.format(id));
    assert_eq!(format!("{id:X}"), "6504C9540312D7A");
    assert_eq!(format!("{:#x}", Id(u64::MAX)), "0xffffffffffffffff");
}

// ---- ObjectId -------------------------------------------------------------

const OID: &str = "6553f1000102030405fffffe";
const OID_BYTES: [u8; 12] = [0x65, 0x53, 0xf1, 0, 1, 2, 3, 4, 5, 0xff, 0xff, 0xfe];

#[test]
fn objectid_text_round_trips_any_case() {
    let oid: ObjectId = OID.parse().unwrap();
    assert_eq!(oid.bytes(), OID_BYTES);
    assert_eq!(oid.to_string(), OID);
    assert_eq!(OID.to_uppercase().parse::<ObjectId>(), Ok(oid));
    assert_eq!(format!(" {OID}\n").parse::<ObjectId>(), Ok(oid));
    for bytes in [[0u8; 12], [0xff; 12]] {
        let oid = ObjectId::from(bytes);
        assert_eq!(oid.to_string().parse::<ObjectId>(), Ok(oid));
    }
}

#[test]
fn objectid_rejects_malformed_text_with_a_typed_error() {
    assert_eq!("".parse::<ObjectId>(), Err(ParseError::Empty));
    assert_eq!("   ".parse::<ObjectId>(), Err(ParseError::Empty));
    for (text, found) in [("6553f1", 6), ("6553f1000102030405fffffe00", 26)] {
        assert!(matches!(
            text.parse::<ObjectId>(),
            Err(ParseError::WrongLength { expected: 24, found: f, .. }) if f == found
        ));
    }
    for (text, bad) in [
        ("6553f1000102030405fffffg", 'g'),
        ("+553f1000102030405fffffe", '+'),
        ("-553f1000102030405fffffe", '-'),
        ("6553f1000102 030405fffffe", ' '),
        ("6553f1000102030405ffffé", 'é'),
        ("６553f1000102030405fffffe", '６'),
    ] {
        assert!(
            matches!(
                text.parse::<ObjectId>(),
                Err(ParseError::InvalidChar { ch, .. }) if ch == bad
            ),
            "{text}: {:?}",
            text.parse::<ObjectId>()
        );
    }
}

#[test]
fn objectid_bytes_convert_both_ways() {
    let oid = ObjectId::from(OID_BYTES);
    assert_eq!(ObjectId::try_from(&OID_BYTES[..]), Ok(oid));
    assert_eq!(oid.as_ref(), &OID_BYTES[..]);
    assert_eq!(<[u8; 12]>::from(oid), OID_BYTES);
    assert_eq!(ObjectId::from_bytes(OID_BYTES), oid);
    for len in [0usize, 11, 13, 16] {
        let bytes = vec![0u8; len];
        assert_eq!(
            ObjectId::try_from(bytes.as_slice()),
            Err(ConvertError::WrongLength {
                kind: "objectid",
                expected: 12,
                found: len
            })
        );
    }
}

// ---- Properties -----------------------------------------------------------

fn any_format() -> impl Strategy<Value = Format> {
    prop::sample::select(Format::ALL.to_vec())
}

proptest! {
    #[test]
    fn any_id_round_trips_in_every_format(v in any::<u64>(), f in any_format()) {
        let id = Id(v);
        let text = id.format_as(f);
        prop_assert_eq!(Id::parse_as(&text, f), Ok(id));
        assert_detected(&text, f);
    }

    #[test]
    fn from_str_inverts_display(v in any::<u64>()) {
        prop_assert_eq!(Id(v).to_string().parse::<Id>(), Ok(Id(v)));
    }

    #[test]
    fn i64_conversions_agree(v in any::<u64>()) {
        let id = Id(v);
        prop_assert_eq!(Id::from_i64_wrapping(id.to_i64_wrapping()), id);
        match i64::try_from(id) {
            Ok(i) => {
                prop_assert!(v < SIGN_BIT);
                prop_assert_eq!(i, id.to_i64_wrapping());
                prop_assert_eq!(Id::try_from(i), Ok(id));
            }
            Err(e) => {
                prop_assert!(v >= SIGN_BIT);
                prop_assert_eq!(e, ConvertError::AboveI64Max(v));
                prop_assert!(id.to_i64_wrapping() < 0);
            }
        }
    }

    #[test]
    fn parsing_arbitrary_text_never_panics(text in ".{0,30}", f in any_format()) {
        let _ = text.parse::<Id>();
        let _ = Id::parse_as(&text, f);
        let _ = Id::parse_as(&text, Format::detect(&text));
        let _ = text.parse::<ObjectId>();
    }

    #[test]
    fn from_str_agrees_with_u64_on_digit_strings(text in "[0-9]{1,22}") {
        prop_assert_eq!(text.parse::<Id>().ok(), text.parse::<u64>().ok().map(Id));
    }

    #[test]
    fn objectid_round_trips(bytes in any::<[u8; 12]>()) {
        let oid = ObjectId::from(bytes);
        prop_assert_eq!(oid.to_string().parse::<ObjectId>(), Ok(oid));
        prop_assert_eq!(ObjectId::try_from(oid.as_ref()), Ok(oid));
    }
}
