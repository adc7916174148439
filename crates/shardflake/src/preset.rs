//! The layouts of the systems shardflake speaks, by name: Twitter's
//! "Announcing Snowflake" (2010), Discord's and Sonyflake's variants, the
//! PL/pgSQL ids of "Sharding & IDs at Instagram" (2012), and the MySQL
//! procedure variant of the same idea.
//!
//! | name | fields, most significant first | epoch | tick |
//! |---|---|---|---|
//! | `snowflake` | time 41, node 10, sequence 12 | 1288834974657 (Twitter) | 1 ms |
//! | `twitter` | time 41, datacenter 5, worker 5, sequence 12 | 1288834974657 | 1 ms |
//! | `discord` | time 42, worker 5, process 5, sequence 12 | 1420070400000 | 1 ms |
//! | `instagram` | time 41, shard 13, sequence 10 (all 64 bits) | 1314220021721 | 1 ms |
//! | `sonyflake` | time 39, sequence 8, machine 16 | 2014-09-01T00:00:00Z | 10 ms |
//! | `mysql-procedure` | time 43, shard 10, sequence 10 | 2023-01-01T00:00:00Z | 1 ms |
//! | `js-safe` | time 41, node 2, sequence 10 (53 bits) | 2025-01-01T00:00:00Z | 1 ms |
//!
//! `js-safe` is ours: every id stays below 2^53, so JavaScript's `Number`
//! holds it exactly, until 2094 (2^41 ms, 69.7 years), with 1,024 ids per ms
//! on each of 4 nodes. 53 bits leave no room for more: 50 years need 41 bits
//! of milliseconds and 1,000 ids per ms need 10 bits of sequence.

use crate::error::LayoutError;
use crate::layout::Layout;

/// Twitter's epoch, 2010-11-04T01:42:54.657Z.
pub const TWITTER_EPOCH_MS: u64 = 1_288_834_974_657;
/// Discord's epoch, 2015-01-01T00:00:00Z.
pub const DISCORD_EPOCH_MS: u64 = 1_420_070_400_000;
/// Instagram's epoch, 2011-08-24T21:07:01.721Z.
pub const INSTAGRAM_EPOCH_MS: u64 = 1_314_220_021_721;
/// Sonyflake's epoch, 2014-09-01T00:00:00Z.
pub const SONYFLAKE_EPOCH_MS: u64 = 1_409_529_600_000;
/// The MySQL procedure's epoch, 2023-01-01T00:00:00Z.
pub const MYSQL_PROCEDURE_EPOCH_MS: u64 = 1_672_531_200_000;
/// The `js-safe` epoch, 2025-01-01T00:00:00Z.
pub const JS_SAFE_EPOCH_MS: u64 = 1_735_689_600_000;

/// Names of every preset.
pub const NAMES: [&str; 7] = [
    "snowflake",
    "twitter",
    "discord",
    "instagram",
    "sonyflake",
    "mysql-procedure",
    "js-safe",
];

/// A preset layout by name.
///
/// ```
/// let layout = shardflake::preset::by_name("instagram")?;
/// assert_eq!(layout.field("shard").unwrap().bits(), 13);
/// # Ok::<(), shardflake::LayoutError>(())
/// ```
pub fn by_name(name: &str) -> Result<Layout, LayoutError> {
    let b = Layout::builder(name);
    let b = match name {
        "snowflake" => b
            .epoch_ms(TWITTER_EPOCH_MS)
            .time(41)
            .node("node", 10)
            .sequence(12),
        "twitter" => b
            .epoch_ms(TWITTER_EPOCH_MS)
            .time(41)
            .node("datacenter", 5)
            .node("worker", 5)
            .sequence(12),
        "discord" => b
            .epoch_ms(DISCORD_EPOCH_MS)
            .time(42)
            .node("worker", 5)
            .node("process", 5)
            .sequence(12),
        "instagram" => b
            .epoch_ms(INSTAGRAM_EPOCH_MS)
            .time(41)
            .node("shard", 13)
            .sequence(10),
        "sonyflake" => b
            .epoch_ms(SONYFLAKE_EPOCH_MS)
            .tick_ms(10)
            .time(39)
            .sequence(8)
            .node("machine", 16),
        "mysql-procedure" => b
            .epoch_ms(MYSQL_PROCEDURE_EPOCH_MS)
            .time(43)
            .node("shard", 10)
            .sequence(10),
        "js-safe" => b
            .epoch_ms(JS_SAFE_EPOCH_MS)
            .time(41)
            .node("node", 2)
            .sequence(10),
        _ => return Err(LayoutError::UnknownPreset(name.to_string())),
    };
    // Preset epochs are all in the past; only a clock before 2025 would refuse js-safe.
    b.build_at(u64::MAX)
}

/// Every preset.
pub fn all() -> Vec<Layout> {
    NAMES.iter().filter_map(|n| by_name(n).ok()).collect()
}

/// A preset name, or a layout spec in the form [`Layout`]'s `Display`
/// prints: `[name:] time 41 | node 10 | sequence 12 [(epoch 1288834974657 ms, tick 1 ms)]`.
/// Fields named `time` and `sequence` are the time and sequence; any other
/// name is a node or shard field. Epoch defaults to 0 and tick to 1 ms.
///
/// ```
/// use shardflake::preset::resolve;
/// let custom = resolve("orders: time 40 | region 3 | shard 7 | sequence 13 (epoch 1735689600000 ms)")?;
/// assert_eq!(custom.field("shard").unwrap().bits(), 7);
/// assert_eq!(resolve(&custom.to_string())?, custom);
/// assert_eq!(resolve("instagram")?, shardflake::preset::by_name("instagram")?);
/// # Ok::<(), shardflake::LayoutError>(())
/// ```
pub fn resolve(spec: &str) -> Result<Layout, LayoutError> {
    let spec = spec.trim();
    if !spec.contains(|c: char| c.is_ascii_whitespace() || c == '|') {
        return by_name(spec);
    }
    let bad = |reason: &str| LayoutError::Spec {
        spec: spec.to_string(),
        reason: reason.to_string(),
    };
    let (body, options) = match spec.split_once('(') {
        Some((body, rest)) => {
            let options = rest.strip_suffix(')').ok_or_else(|| bad("missing ')'"))?;
            (body, Some(options))
        }
        None => (spec, None),
    };
    let (name, fields) = match body.split_once(':') {
        Some((name, fields)) => (name.trim(), fields),
        None => ("custom", body),
    };
    let mut builder = Layout::builder(name);
    for field in fields.split('|') {
        let mut words = field.split_whitespace();
        let (Some(field_name), Some(bits), None) = (words.next(), words.next(), words.next())
        else {
            return Err(bad(&format!(
                "field {:?} is not \"NAME BITS\"",
                field.trim()
            )));
        };
        let bits: u32 = bits
            .parse()
            .map_err(|_| bad(&format!("{bits:?} is not a bit width")))?;
        builder = match field_name {
            crate::layout::TIME => builder.time(bits),
            crate::layout::SEQUENCE => builder.sequence(bits),
            node => builder.node(node, bits),
        };
    }
    for option in options.into_iter().flat_map(|o| o.split(',')) {
        let words: Vec<&str> = option.split_whitespace().collect();
        match words.as_slice() {
            ["epoch", ms, "ms"] | ["epoch", ms] => {
                builder = builder.epoch_ms(ms.parse().map_err(|_| bad("epoch is not a number"))?);
            }
            ["tick", ms, "ms"] | ["tick", ms] => {
                builder = builder.tick_ms(ms.parse().map_err(|_| bad("tick is not a number"))?);
            }
            ["random", "start", bits, "bits"] | ["random", "start", bits] => {
                builder = builder.random_start(
                    bits.parse()
                        .map_err(|_| bad("random start is not a bit width"))?,
                );
            }
            // What Display adds for information; derived, so ignored.
            ["negative", ..] => {}
            _ => return Err(bad(&format!("unknown option {:?}", option.trim()))),
        }
    }
    builder.build()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timestamp::rfc3339_ms;

    #[test]
    fn every_preset_reads_back_from_its_display() {
        for l in all() {
            assert_eq!(resolve(&l.to_string()).unwrap(), l, "{l}");
        }
    }

    #[test]
    fn bad_specs_say_why() {
        for spec in [
            "time 41 | node",
            "time x | sequence 3",
            "time 41 | sequence 12 (epoch 5 ms",
            "time 41 | sequence 12 (colour red)",
        ] {
            assert!(
                matches!(resolve(spec), Err(LayoutError::Spec { .. })),
                "{spec}"
            );
        }
        assert!(matches!(
            resolve("time 60 | node 10 | sequence 12"),
            Err(LayoutError::TooWide { .. })
        ));
        assert!(matches!(
            resolve("time 41 | node 10"),
            Err(LayoutError::Missing(_))
        ));
    }

    #[test]
    fn every_preset_builds() {
        assert_eq!(all().len(), NAMES.len());
        assert!(matches!(
            by_name("nope"),
            Err(LayoutError::UnknownPreset(_))
        ));
    }

    #[test]
    fn full_width_layouts_turn_negative_on_the_documented_day() {
        for l in all() {
            match l.name() {
                "instagram" => {
                    let ms = l.negative_from_ms().unwrap();
                    assert!(
                        rfc3339_ms(ms).starts_with("2046-06-27"),
                        "{}",
                        rfc3339_ms(ms)
                    );
                }
                // Discord's 42-bit time also fills all 64 bits.
                "discord" => {
                    let ms = l.negative_from_ms().unwrap();
                    assert!(
                        rfc3339_ms(ms).starts_with("2084-09-06"),
                        "{}",
                        rfc3339_ms(ms)
                    );
                }
                _ => assert_eq!(l.negative_from_ms(), None, "{}", l.name()),
            }
        }
    }

    #[test]
    fn js_safe_meets_its_promise() {
        let l = by_name("js-safe").unwrap();
        assert_eq!(l.js_unsafe_from_ms(), None);
        assert!(l.max_id() < 1 << 53);
        let fifty_years_ms = 50 * 36_525 * 24 * 3_600 * 10;
        assert!(l.end_of_life_ms() >= u128::from(l.epoch_ms() + fifty_years_ms));
        assert!(l.ids_per_tick() >= 1_000 && l.tick_ms() == 1);
    }

    #[test]
    fn sonyflake_puts_machine_last() {
        let l = by_name("sonyflake").unwrap();
        assert_eq!(l.fields().last().unwrap().name(), "machine");
        assert_eq!(l.tick_ms(), 10);
    }
}
