//! Id text in every form (decimal, hex, base32, base62, UUID, ObjectId) and
//! "decode any" (`kind::recognise` after `Format::detect`): never a panic;
//! whatever parses formats back to text that parses to the same value, and
//! every id formats to text `detect` reads back in its own form (except
//! digits alone without a leading zero, which `detect` reads as decimal).
#![no_main]

use libfuzzer_sys::fuzz_target;
use shardflake::{Format, Id, ObjectId, Recognised, kind};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for format in Format::ALL {
        if let Ok(id) = Id::parse_as(text, format) {
            let written = id.format_as(format);
            assert_eq!(
                Id::parse_as(&written, format),
                Ok(id),
                "{format:?} {text:?}"
            );
            // Digits alone are read as decimal unless padded (documented).
            let digits = written.bytes().all(|b| b.is_ascii_digit());
            if !digits || written.starts_with('0') && written.len() > 1 {
                assert_eq!(Format::detect(&written), format, "{written:?}");
            }
        }
        match kind::recognise(text, format) {
            Ok(Recognised::Id(id)) => assert_eq!(format.parse(&id.format_as(format)), Ok(id)),
            Ok(Recognised::Uuid(info)) => {
                let again = kind::recognise(&info.uuid.to_string(), format);
                assert!(
                    matches!(again, Ok(Recognised::Uuid(ref i)) if *i == info),
                    "{text:?}"
                );
            }
            Ok(Recognised::ObjectId(oid)) => {
                assert_eq!(oid.to_string().parse::<ObjectId>(), Ok(oid), "{text:?}");
                let again = kind::recognise(&oid.to_string(), format);
                assert_eq!(again, Ok(Recognised::ObjectId(oid)));
            }
            Err(_) => {}
        }
    }
    // "Decode any": the form guessed from the shape, then the kind.
    let detected = Format::detect(text);
    let _ = kind::recognise(text, detected);
    if let Ok(oid) = text.parse::<ObjectId>() {
        assert_eq!(oid.to_string().parse::<ObjectId>(), Ok(oid));
    }
    // The strict decimal of `FromStr`/`Display`: what `Display` writes is
    // the text without its leading zeros.
    if let Ok(id) = text.parse::<Id>() {
        let canonical = text.trim_start_matches('0');
        assert_eq!(
            id.to_string(),
            if canonical.is_empty() { "0" } else { canonical }
        );
        assert_eq!(id.to_string().parse::<Id>(), Ok(id));
    }
});
