//! SQL identifier validation: whatever is accepted never needs quoting.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shardflake_db::mysql::Names;
use shardflake_db::topology::{is_ident, is_server_name};

fn plain(s: &str) -> bool {
    s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        && !s.starts_with(|c: char| c.is_ascii_digit())
}

fuzz_target!(|data: (&str, &str, &str)| {
    let (a, b, c) = data;
    if is_ident(a) {
        assert!(plain(a) && !a.contains('-') && !a.is_empty(), "{a:?}");
    }
    if is_server_name(a) {
        assert!(plain(a) && !a.is_empty(), "{a:?}");
    }
    if let Ok(names) = Names::new(a, b, c) {
        for name in [names.sequence(), names.event(), names.trigger(), names.locked_procedure()] {
            assert!(plain(&name) && !name.contains('-') && name.len() <= 64, "{name:?}");
        }
    }
});
