//! Decoding ids found in log lines: each number that decodes as an id of
//! the layout, and each UUID or ObjectId, is shown with its time and fields.
//!
//! ```text
//! cargo run -p shardflake-examples --example decode_log -- snowflake < app.log
//! echo 'GET /posts/2124581121277558784 took 3 ms' | cargo run -p shardflake-examples --example decode_log
//! ```

use std::io::BufRead;

use shardflake::kind::{Recognised, recognise};
use shardflake::{Format, Layout, preset};

/// The ids in one line: runs of digits long enough to be an id of `layout`
/// (shorter numbers, such as durations, are left alone), UUIDs and ObjectIds.
fn ids_in(line: &str, layout: &Layout) -> Vec<String> {
    let mut out = Vec::new();
    let token = |c: char| c.is_ascii_alphanumeric() || c == '-';
    for word in line.split(|c: char| !token(c)).filter(|w| !w.is_empty()) {
        let described = match recognise(word, Format::Dec) {
            // Ids of this layout have at least 16 digits from a year after its epoch.
            Ok(Recognised::Id(id)) if word.len() >= 16 => match id.decode(layout) {
                Ok(parts) => {
                    let fields: Vec<String> = parts
                        .fields
                        .iter()
                        .map(|(name, value)| format!("{name}={value}"))
                        .collect();
                    format!(
                        "{word}: {} {} seq={}",
                        parts.timestamp(),
                        fields.join(" "),
                        parts.sequence
                    )
                }
                Err(_) => continue,
            },
            Ok(Recognised::Uuid(info)) => format!("{word}: {info:?}"),
            Ok(Recognised::ObjectId(oid)) => format!("{word}: objectid at {}", oid.timestamp()),
            _ => continue,
        };
        out.push(described);
    }
    out
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let name = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "snowflake".into());
    let layout = preset::resolve(&name)?;
    for line in std::io::stdin().lock().lines() {
        for described in ids_in(&line?, &layout) {
            println!("{described}");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_ids_and_skips_other_numbers() {
        let layout = preset::by_name("snowflake").unwrap();
        let found = ids_in(
            "GET /posts/2124581121277558784 took 3 ms, user 31341",
            &layout,
        );
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].starts_with("2124581121277558784: 20"), "{found:?}");
        let found = ids_in("req 6553f1000102030405fffffe ok", &layout);
        assert!(found[0].contains("objectid at 2023-11-14"), "{found:?}");
    }
}
