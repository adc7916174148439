//! SQL identifier validation: a name that is accepted, and every name
//! derived from it, is a plain identifier that never needs quoting (ASCII
//! letters, digits and `_`, not starting with a digit) and fits MySQL's
//! 64-character limit; server names may hold `-` as well.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shardflake_db::mysql::Names;
use shardflake_db::pg::topology::{is_ident, is_server_name};

/// ASCII letters, digits, `_` (and `-` where `dash`), not starting with a digit.
fn plain(s: &str, dash: bool) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || (dash && b == b'-'))
        && !s.starts_with(|c: char| c.is_ascii_digit())
}

fuzz_target!(|data: (&str, &str, &str)| {
    let (a, b, c) = data;
    if is_ident(a) {
        assert!(plain(a, false) && a.len() <= 40, "{a:?}");
        assert_eq!(a, a.to_ascii_lowercase(), "{a:?}");
    }
    if is_server_name(a) {
        assert!(plain(a, true) && a.len() <= 63, "{a:?}");
    }
    if let Ok(names) = Names::new(a, b, c) {
        for name in [
            names.table.clone(),
            names.key.clone(),
            names.procedure.clone(),
            names.sequence(),
            names.event(),
            names.trigger(),
            names.refused_function(),
            names.locked_procedure(),
            names.seed_procedure(),
            names.locked_row(),
            names.seed_row(),
        ] {
            assert!(plain(&name, false) && name.len() <= 64, "{name:?}");
        }
    }
});
