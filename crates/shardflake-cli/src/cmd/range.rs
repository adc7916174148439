//! `shardflake range`: the smallest and largest id of a span of time, for
//! `WHERE id BETWEEN first AND last` on the id's index.

use anyhow::Context;
use serde_json::json;
use shardflake::timestamp::{parse_time, rfc3339_ms};
use shardflake::{Clock, SystemClock};

use super::{LayoutArg, with_stdout};

#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:
  shardflake range --from -7d
  shardflake range --layout instagram --from 2024-01-01T00:00:00Z --to 2024-02-01T00:00:00Z
  shardflake range --from 'now-1h' --to now --json

Times: RFC 3339, Unix milliseconds, `now`, or a duration before or after
now (-7d, +1h, now-30m). The span is half-open (from <= t < to) and covers
whole ticks: ids made in from's tick before from are in it too. A layout
that uses the sign bit (instagram) has ids negative as a signed bigint from
its 'negative as bigint from' date (`shardflake plan`); a span across it is
two ranges of signed ids, both printed.")]
pub struct Args {
    /// Start of the span (included).
    #[arg(long, allow_hyphen_values = true)]
    from: String,
    /// End of the span (excluded).
    #[arg(long, default_value = "now", allow_hyphen_values = true)]
    to: String,
    #[command(flatten)]
    layout: LayoutArg,
    /// One JSON object instead of text.
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let layout = args.layout.resolve()?;
    let now = SystemClock.now_ms_precise();
    let time = |flag: &str, text: &str| {
        parse_time(text, now).with_context(|| {
            format!("{flag} {text:?} is not a time: use RFC 3339, Unix ms, now, or -7d / +1h")
        })
    };
    let from = time("--from", &args.from)?;
    let to = time("--to", &args.to)?;
    let range = layout.id_range(from..to)?;
    let signed = range.signed_ranges();
    let sql = signed
        .iter()
        .map(|r| format!("id BETWEEN {} AND {}", r.start(), r.end()))
        .collect::<Vec<_>>()
        .join(" OR ");
    with_stdout(|out| {
        if args.json {
            let signed: Vec<_> = signed
                .iter()
                .map(|r| json!([r.start().to_string(), r.end().to_string()]))
                .collect();
            let value = json!({
                "layout": layout.to_string(),
                "from": rfc3339_ms(from),
                "to": rfc3339_ms(to),
                "first": range.first.to_string(),
                "last": range.last.to_string(),
                "signed": signed,
            });
            writeln!(out, "{value}")?;
        } else {
            writeln!(out, "layout  {layout}")?;
            writeln!(out, "from    {}", rfc3339_ms(from))?;
            writeln!(out, "to      {}", rfc3339_ms(to))?;
            writeln!(out, "first   {}", range.first)?;
            writeln!(out, "last    {}", range.last)?;
            writeln!(out, "sql     {sql}")?;
        }
        Ok(())
    })
}
