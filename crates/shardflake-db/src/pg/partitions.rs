//! Range partitions of an id-keyed table by day, week or month (UTC): each
//! partition holds the ids of one period, bounds from
//! [`shardflake::Layout::min_id_at`], so rows route by their id alone and an
//! old period is dropped with its partition.
//!
//! Consecutive partitions share their bound (`FROM (a) TO (b)` is
//! half-open), so no id falls between two or into both. A tick that
//! straddles midnight goes whole to the later partition. The last period
//! of a layout's life ends at `MAXVALUE`.
//!
//! pg_partman is not used: its integer partitioning cuts fixed id
//! intervals from a start value, which matches neither UTC midnights (the
//! layout's epoch is not one) nor months (of different lengths), and it
//! needs an extension and a background worker on every server.

use std::fmt::Write as _;

use shardflake::Layout;

use super::{Topology, connect, ctx};
use crate::Error;

const DAY_MS: u64 = 86_400_000;

/// How long one partition's period is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Period {
    /// A UTC day.
    Day,
    /// An ISO week, Monday to Monday, UTC.
    Week,
    /// A calendar month, UTC.
    Month,
}

/// One partition: a period and its ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partition {
    /// Name suffix: `p20261127` (day, week: its first day) or `p202611`.
    pub suffix: String,
    /// The period's first Unix ms.
    pub from_ms: u64,
    /// The next period's first Unix ms.
    pub to_ms: u64,
    /// The first id of the period, as a signed `bigint`.
    pub from_id: i64,
    /// The next period's first id; `None` (`MAXVALUE`) for the layout's
    /// last period.
    pub to_id: Option<i64>,
}

/// Days since 1970-01-01 of a civil date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: u64, d: u64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy as i64;
    era * 146_097 + doe - 719_468
}

/// The civil date of a day since 1970-01-01.
fn civil_from_days(z: i64) -> (i64, u64, u64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u64;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u64;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

impl Period {
    /// The period holding `unix_ms`: its first ms, the next one's, and its
    /// name suffix.
    fn around(self, unix_ms: u64) -> (u64, u64, String) {
        let day = (unix_ms / DAY_MS) as i64;
        let (start, end) = match self {
            Period::Day => (day, day + 1),
            // 1970-01-01 was a Thursday: Monday is 3 days before.
            Period::Week => {
                let monday = day - (day + 3).rem_euclid(7);
                (monday, monday + 7)
            }
            Period::Month => {
                let (y, m, _) = civil_from_days(day);
                let (ny, nm) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
                (days_from_civil(y, m, 1), days_from_civil(ny, nm, 1))
            }
        };
        let (y, m, d) = civil_from_days(start);
        let suffix = match self {
            Period::Month => format!("p{y:04}{m:02}"),
            _ => format!("p{y:04}{m:02}{d:02}"),
        };
        (start as u64 * DAY_MS, end as u64 * DAY_MS, suffix)
    }
}

/// `count` partitions of `layout`'s ids, from the period holding
/// `from_ms` on. Refused: a period before the layout's epoch, past its end
/// of life, or one whose ids cross into negative `bigint`s (a signed range
/// cannot hold both sides).
pub fn partitions(
    layout: &Layout,
    period: Period,
    from_ms: u64,
    count: u32,
) -> Result<Vec<Partition>, Error> {
    let refused = |problem: String| Error::Refused {
        what: "make partitions".into(),
        problems: vec![problem],
    };
    let end_of_life = layout.end_of_life_ms();
    let mut out = Vec::new();
    let mut at = from_ms;
    for _ in 0..count {
        let (from, to, suffix) = period.around(at);
        if from < layout.epoch_ms() {
            return Err(refused(format!(
                "{suffix} starts before layout {}'s epoch: start from a later --from",
                layout.name()
            )));
        }
        let first = layout
            .min_id_at(from)
            .map_err(|e| refused(format!("{suffix}: {e}")))?;
        let next = if u128::from(to) >= end_of_life {
            None
        } else {
            Some(
                layout
                    .min_id_at(to)
                    .map_err(|e| refused(format!("{suffix}: {e}")))?
                    .as_i64(),
            )
        };
        if let Some(next) = next
            && next < first.as_i64()
        {
            return Err(refused(format!(
                "{suffix}'s ids cross into negative bigints (layout {}): partition by a period that ends before {}",
                layout.name(),
                layout
                    .negative_from_ms()
                    .map(shardflake::timestamp::rfc3339_ms)
                    .unwrap_or_default()
            )));
        }
        out.push(Partition {
            suffix,
            from_ms: from,
            to_ms: to,
            from_id: first.as_i64(),
            to_id: next,
        });
        if next.is_none() {
            break;
        }
        at = to;
    }
    Ok(out)
}

/// `CREATE TABLE IF NOT EXISTS` of each partition of `schema.table`.
pub fn partitions_sql(schema: &str, table: &str, parts: &[Partition]) -> String {
    let mut out = String::new();
    for p in parts {
        let to = p.to_id.map_or("MAXVALUE".to_string(), |id| id.to_string());
        let _ = writeln!(
            out,
            "CREATE TABLE IF NOT EXISTS {schema}.{table}_{} PARTITION OF {schema}.{table} FOR VALUES FROM ({}) TO ({to}); -- {} .. {}",
            p.suffix,
            p.from_id,
            shardflake::timestamp::rfc3339_ms(p.from_ms),
            shardflake::timestamp::rfc3339_ms(p.to_ms),
        );
    }
    out
}

/// Creates the partitions missing on every shard of `topo` that holds
/// `table`, which must be partitioned by range; returns `(server,
/// partitions created)`. Idempotent: partitions that exist are kept.
pub async fn apply_partitions(
    topo: &Topology,
    table: &str,
    parts: &[Partition],
) -> Result<Vec<(String, usize)>, Error> {
    if !topo.tables().iter().any(|t| t.name == table) {
        return Err(Error::Refused {
            what: "make partitions".into(),
            problems: vec![format!(
                "table {table:?} is not in the topology file: add it under [[tables]]"
            )],
        });
    }
    let mut out = Vec::new();
    for server in topo.servers() {
        let name = server.name.as_str();
        let client = connect(server).await?;
        let mut created = 0;
        for &shard in &server.shards {
            let schema = topo.schema(shard);
            let qualified = format!("{schema}.{table}");
            let kind: Option<i8> = client
                .query_opt(
                    "SELECT relkind::\"char\" AS k FROM pg_class WHERE oid = to_regclass($1)",
                    &[&qualified],
                )
                .await
                .map_err(ctx(name, "looking up the table"))?
                .map(|r| r.get(0));
            if kind != Some(b'p' as i8) {
                return Err(Error::Refused {
                    what: "make partitions".into(),
                    problems: vec![format!(
                        "{name}: {qualified} is not a partitioned table: create it with PARTITION BY RANGE (id) in its template, then run pg apply"
                    )],
                });
            }
            for p in parts {
                let exists: bool = client
                    .query_one(
                        "SELECT to_regclass($1) IS NOT NULL",
                        &[&format!("{qualified}_{}", p.suffix)],
                    )
                    .await
                    .map_err(ctx(name, "looking up a partition"))?
                    .get(0);
                if !exists {
                    client
                        .batch_execute(&partitions_sql(&schema, table, std::slice::from_ref(p)))
                        .await
                        .map_err(ctx(name, "creating a partition"))?;
                    created += 1;
                }
            }
        }
        out.push((name.to_string(), created));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use shardflake::preset;

    #[test]
    fn calendar_periods() {
        // 2024-02-29T12:00:00Z, a Thursday in a leap year.
        let t = 1_709_208_000_000;
        let (from, to, s) = Period::Day.around(t);
        assert_eq!((s.as_str(), to - from), ("p20240229", DAY_MS));
        let (from, to, s) = Period::Week.around(t);
        assert_eq!((s.as_str(), to - from), ("p20240226", 7 * DAY_MS));
        let (from, to, s) = Period::Month.around(t);
        assert_eq!((s.as_str(), (to - from) / DAY_MS), ("p202402", 29));
        let (_, _, s) = Period::Month.around(to);
        assert_eq!(s, "p202403");
        for day in [-719_468i64, -1, 0, 59, 19_782, 2_932_896] {
            let (y, m, d) = civil_from_days(day);
            assert_eq!(days_from_civil(y, m, d), day);
        }
    }

    #[test]
    fn partitions_share_bounds_and_refuse_the_sign() {
        let layout = preset::by_name("instagram").unwrap();
        let parts = partitions(&layout, Period::Month, 1_709_208_000_000, 3).unwrap();
        assert_eq!(parts.len(), 3);
        for w in parts.windows(2) {
            assert_eq!(w[0].to_id, Some(w[1].from_id));
            assert_eq!(w[0].to_ms, w[1].from_ms);
        }
        let sql = partitions_sql("shard0", "posts", &parts[..1]);
        assert!(sql.starts_with("CREATE TABLE IF NOT EXISTS shard0.posts_p202402 PARTITION OF shard0.posts FOR VALUES FROM ("), "{sql}");
        // June 2046 holds Instagram's first negative id.
        let june_2046 = 2_411_424_000_000;
        let err = partitions(&layout, Period::Month, june_2046, 1).unwrap_err();
        assert!(err.to_string().contains("cross into negative"), "{err}");
        let err = partitions(&layout, Period::Day, 0, 1).unwrap_err();
        assert!(
            err.to_string().contains("before layout instagram's epoch"),
            "{err}"
        );
    }
}
