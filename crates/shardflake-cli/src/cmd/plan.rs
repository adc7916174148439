//! `shardflake plan`: what a layout allows, or a layout for a deployment.

use std::io::Write;

use anyhow::{Context, bail};
use serde_json::json;
use shardflake::plan::{Need, suggest};
use shardflake::timestamp::{parse_unix_ms, rfc3339_ms};
use shardflake::{Layout, preset};
use shardflake_service::layout_change::LayoutChange;

use super::{LayoutArg, with_stdout};

#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:
  shardflake plan --layout instagram
  shardflake plan --nodes 1000 --rate 50000 --years 50
  shardflake plan --all --json
  shardflake plan --from snowflake --to 'time 41 | node 10 | sequence 12 (epoch 1288834959657 ms)'
  shardflake plan --check shardflake.toml

--check reads the `layout` of a deployment's file (the service's config, a
pg topology) and fails (exit 1) when it has less than --lifetime-warning
left before its end or its first negative id as a signed bigint.")]
pub struct Args {
    #[command(flatten)]
    layout: LayoutArg,
    /// Every preset.
    #[arg(long, conflicts_with_all = ["nodes", "rate", "years"])]
    all: bool,
    /// Suggest a layout: nodes generating at once.
    #[arg(long, requires_all = ["rate", "years"])]
    nodes: Option<u64>,
    /// Suggest a layout: peak ids per second on one node.
    #[arg(long, requires_all = ["nodes", "years"])]
    rate: Option<f64>,
    /// Suggest a layout: years it must last.
    #[arg(long, requires_all = ["nodes", "rate"])]
    years: Option<f64>,
    /// Epoch of a suggested layout, RFC 3339 (default: now).
    #[arg(long)]
    epoch: Option<String>,
    /// JSON instead of text.
    #[arg(long)]
    json: bool,
    /// A layout change: the layout of the fleet being replaced (with --to).
    #[arg(long, requires = "to", conflicts_with_all = ["all", "nodes", "json"])]
    from: Option<String>,
    /// A layout change: the new fleet's layout; refused (exit 1) unless its
    /// ids from --at on are above every id --from made until then.
    #[arg(long, requires = "from")]
    to: Option<String>,
    /// A deployment's file (service config or pg topology): fail when its
    /// layout has less than --lifetime-warning left.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["all", "nodes", "from", "json"])]
    check: Option<std::path::PathBuf>,
    /// With --check: how much life left is too little [default: 365d, or
    /// SHARDFLAKE_LIFETIME_WARNING].
    #[arg(long, requires = "check", value_parser = humantime::parse_duration)]
    lifetime_warning: Option<std::time::Duration>,
    /// A layout change: when the old fleet stops and the new one starts,
    /// RFC 3339 (default: now).
    #[arg(long, requires = "from")]
    at: Option<String>,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if let Some(file) = &args.check {
        let threshold = match args.lifetime_warning {
            Some(t) => t,
            None => super::lifetime_warning()?,
        };
        return check(file, threshold);
    }
    if let (Some(from), Some(to)) = (&args.from, &args.to) {
        return layout_change(from, to, args.at.as_deref());
    }
    let layouts = if args.all {
        preset::all()
    } else if let (Some(nodes), Some(rate), Some(years)) = (args.nodes, args.rate, args.years) {
        if !(rate > 0.0 && rate.is_finite() && years > 0.0 && years.is_finite()) {
            bail!("--rate and --years must be positive numbers");
        }
        let epoch_ms = match &args.epoch {
            Some(text) => parse_unix_ms(text)
                .with_context(|| format!("--epoch {text:?} is not an RFC 3339 time"))?,
            None => shardflake::Clock::now_ms(&shardflake::SystemClock),
        };
        let need = Need {
            nodes,
            rate_per_node: rate,
            years,
            epoch_ms,
        };
        vec![suggest(&need).context("no 63-bit layout meets that need")?]
    } else {
        vec![args.layout.resolve()?]
    };
    with_stdout(|out| {
        for layout in &layouts {
            if args.json {
                writeln!(out, "{}", to_json(layout))?;
            } else {
                write_text(out, layout)?;
            }
        }
        Ok(())
    })
}

fn date(ms: Option<u128>) -> String {
    match ms {
        None => "never".into(),
        Some(ms) => rfc3339_ms(u64::try_from(ms).unwrap_or(u64::MAX)),
    }
}

fn to_json(layout: &Layout) -> serde_json::Value {
    let c = layout.capacity();
    let fields: Vec<_> = layout
        .fields()
        .iter()
        .map(|f| json!({ "name": f.name(), "bits": f.bits(), "shift": f.shift() }))
        .collect();
    json!({
        "layout": layout.name(),
        "spec": layout.to_string(),
        "fields": fields,
        "epoch_ms": layout.epoch_ms(),
        "tick_ms": layout.tick_ms(),
        "ids_per_tick": c.ids_per_tick,
        "ids_per_second": c.ids_per_second,
        "nodes": c.nodes.to_string(),
        "end_of_life": date(Some(c.end_of_life_ms)),
        "negative_from": c.negative_from_ms.map(rfc3339_ms),
        "js_unsafe_from": c.js_unsafe_from_ms.map(rfc3339_ms),
    })
}

fn write_text(out: &mut dyn Write, layout: &Layout) -> anyhow::Result<()> {
    let c = layout.capacity();
    writeln!(out, "{layout}")?;
    writeln!(out, "  ids per tick per node    {}", c.ids_per_tick)?;
    writeln!(out, "  ids per second per node  {}", c.ids_per_second)?;
    writeln!(out, "  nodes                    {}", c.nodes)?;
    writeln!(
        out,
        "  epoch                    {}",
        rfc3339_ms(layout.epoch_ms())
    )?;
    writeln!(
        out,
        "  end of life              {}",
        date(Some(c.end_of_life_ms))
    )?;
    writeln!(
        out,
        "  negative as bigint from  {}",
        date(c.negative_from_ms.map(u128::from))
    )?;
    match c.js_unsafe_from_ms {
        None => writeln!(out, "  below 2^53 (JavaScript)  always")?,
        Some(ms) => writeln!(out, "  below 2^53 (JavaScript)  until {}", rfc3339_ms(ms))?,
    }
    Ok(())
}

/// `--from OLD --to NEW`: whether NEW's ids from then on are above every id
/// OLD made until then (what `serve --previous-prefix` checks at the new
/// fleet's first start, with the old fleet's high-water records).
fn layout_change(from: &str, to: &str, at: Option<&str>) -> anyhow::Result<()> {
    let old = preset::resolve(from).with_context(|| format!("--from {from:?}"))?;
    let new = preset::resolve(to).with_context(|| format!("--to {to:?}"))?;
    let at_ms = match at {
        Some(text) => {
            parse_unix_ms(text).with_context(|| format!("--at {text:?} is not an RFC 3339 time"))?
        }
        None => shardflake::Clock::now_ms(&shardflake::SystemClock),
    };
    let change = LayoutChange::new(&old, at_ms, &new, at_ms);
    let at = rfc3339_ms(at_ms);
    with_stdout(|out| {
        writeln!(out, "from {old}")?;
        writeln!(out, "to   {new}")?;
        writeln!(out, "  at                {at}")?;
        writeln!(out, "  largest old id    {}", change.old_max_id)?;
        writeln!(out, "  smallest new id   {}", change.new_min_id)?;
        Ok(())
    })?;
    if change.is_safe() {
        println!("  ok: every new id is above every old one");
        return Ok(());
    }
    if old == new {
        println!(
            "  the same layout (a fleet moved to another prefix): ok, every node waits past the old fleet's highest high-water"
        );
        return Ok(());
    }
    let until = match change.unsafe_until_ms {
        Some(ms) => format!("until {}", rfc3339_ms(ms)),
        None => "for ever".to_string(),
    };
    let advice = match change.latest_epoch_ms {
        Some(epoch) => format!(
            "an epoch at or before {epoch} ms ({}) with these fields and tick would do",
            rfc3339_ms(epoch)
        ),
        None => "no epoch with these fields and tick would do: widen the time field".to_string(),
    };
    bail!("refused: the new layout makes ids at or below the old one's {until}; {advice}")
}

/// `--check FILE`: the life left of the layout a deployment's file names.
fn check(file: &std::path::Path, threshold: std::time::Duration) -> anyhow::Result<()> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let doc: toml::Table = text
        .parse()
        .with_context(|| format!("{} is not TOML", file.display()))?;
    let spec = match doc.get("layout") {
        None => "snowflake",
        Some(toml::Value::String(spec)) => spec.as_str(),
        Some(other) => bail!("{}: layout = {other} is not a string", file.display()),
    };
    let layout = preset::resolve(spec).with_context(|| format!("{}: layout", file.display()))?;
    let now = shardflake::Clock::now_ms(&shardflake::SystemClock);
    let left_days = layout.lifetime_left_ms(now) / 86_400_000;
    let ends = date(Some(layout.lifetime_end_ms()));
    println!("{layout}");
    println!("  ids fit a signed bigint until  {ends} ({left_days} days)");
    if layout.lifetime_left_ms(now) < threshold.as_millis() {
        bail!(
            "{}: layout {} has {left_days} days left (under {} days): plan a layout change now (shardflake plan --from OLD --to NEW)",
            file.display(),
            layout.name(),
            threshold.as_secs() / 86_400
        );
    }
    println!("  ok: more than {} days left", threshold.as_secs() / 86_400);
    Ok(())
}
