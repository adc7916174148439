//! Id text in every format, and "decode any": never a panic; whatever
//! parses formats back to text that parses to the same id.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shardflake::{Format, Id, kind};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for format in Format::ALL {
        if let Ok(id) = Id::parse_as(text, format) {
            let again = Id::parse_as(&id.format_as(format), format);
            assert_eq!(again.ok(), Some(id), "{format:?} {text:?}");
        }
        let _ = kind::recognise(text, format);
    }
    let detected = Format::detect(text);
    let _ = kind::recognise(text, detected);
    if let Ok(id) = text.parse::<Id>() {
        assert_eq!(id.to_string().parse::<Id>().ok(), Some(id));
    }
});
