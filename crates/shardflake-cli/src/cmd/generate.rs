//! `shardflake gen`: ids of a layout, UUIDs or ObjectIds, one per line.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::bail;
use shardflake::node::NodeIdSource;
use shardflake::{Clock, Format, Generator, Kind, Layout, ObjectIdGenerator, SystemClock, uuid};
use shardflake_host::HostInfo;

use super::backfill::{self, Times};
use super::{LayoutArg, with_stdout};

/// Ids are made in runs of this many: one reservation each.
const RUN: u64 = 1 << 16;

#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:
  shardflake gen --node 5 -n 3
  shardflake gen --layout twitter --datacenter 1 --worker 3
  shardflake gen --layout instagram --key 31341 --shards 2000
  shardflake gen --node-from host-ordinal        # ids-7 -> node 7
  shardflake gen --kind uuidv5 --namespace dns --name example.com
  shardflake gen --node 1023 --at 2019-03-01T12:00:00Z     # a row from the past
  shardflake gen --node 1023 --times times.txt             # one id per line of times

Backfill (--at, --times): ids at the rows' own times, for importing
historical rows. Give a node id no live node uses (reserved for backfills);
it is required. Each tick's counter is kept in --backfill-state, so runs on
one state file never repeat an id; two at once are refused. Times in the
present tick or later, and a tick whose sequence is used up, are refused and
nothing is issued.")]
pub struct Args {
    #[command(flatten)]
    layout: LayoutArg,
    /// How many ids.
    #[arg(short = 'n', long, default_value_t = 1,
          value_parser = clap::value_parser!(u64).range(1..))]
    count: u64,
    /// A row's time (RFC 3339, Unix ms, -7d, now-1h): ids at that time, on a
    /// node id reserved for backfills, from the backfill state.
    #[arg(long, allow_hyphen_values = true, conflicts_with = "times")]
    at: Option<String>,
    /// A file of rows' times, one per line (`-`: stdin): one id per line, in
    /// the file's order, from the backfill state.
    #[arg(long, value_name = "FILE", conflicts_with = "count")]
    times: Option<PathBuf>,
    /// Where --at and --times keep each tick's counter between runs.
    #[arg(long, value_name = "FILE", default_value = "shardflake-backfill.state")]
    backfill_state: PathBuf,
    /// Text form of layout ids.
    #[arg(short, long, default_value = "dec")]
    format: Format,
    /// What to make: layout (64-bit ids), uuidv1, uuidv3, uuidv4, uuidv5,
    /// uuidv6, uuidv7, uuid-nil or objectid.
    #[arg(short, long, default_value = "layout")]
    kind: Kind,
    /// `node` field (snowflake, js-safe layouts).
    #[arg(long)]
    node: Option<u64>,
    /// `datacenter` field (twitter layout).
    #[arg(long)]
    datacenter: Option<u64>,
    /// `worker` field (twitter, discord layouts).
    #[arg(long)]
    worker: Option<u64>,
    /// `process` field (discord layout).
    #[arg(long)]
    process: Option<u64>,
    /// `machine` field (sonyflake layout).
    #[arg(long)]
    machine: Option<u64>,
    /// `shard` field (instagram, mysql-procedure layouts).
    #[arg(long, conflicts_with = "key")]
    shard: Option<u64>,
    /// Any field by name, for custom layouts: `--field region=3`.
    #[arg(long, value_name = "NAME=VALUE", value_parser = parse_field)]
    field: Vec<(String, u64)>,
    /// A sharding key: the shard field is KEY mod --shards (Instagram's rule).
    #[arg(long, requires = "shards")]
    key: Option<u64>,
    /// Logical shard count for --key.
    #[arg(long, requires = "key")]
    shards: Option<u64>,
    /// Take the layout's node field from the host, as serve --node-id-from:
    /// hostname (its ordinal, ids-7 -> 7; or host-ordinal), mac (a hash, the
    /// seed's Java way; or mac-hash) or ip (low bits, Sonyflake's way).
    #[arg(long, value_parser = parse_source)]
    node_from: Option<NodeIdSource>,
    /// UUID name-space for uuidv3/uuidv5: dns, url, oid, x500 or a UUID.
    #[arg(long)]
    namespace: Option<String>,
    /// Name hashed by uuidv3/uuidv5.
    #[arg(long)]
    name: Option<String>,
}

fn parse_field(text: &str) -> Result<(String, u64), String> {
    let (name, value) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?} is not NAME=VALUE"))?;
    let value = value
        .parse()
        .map_err(|_| format!("{value:?} is not a non-negative integer"))?;
    Ok((name.to_string(), value))
}

/// The names `serve --node-id-from` takes too (one parser for both).
fn parse_source(text: &str) -> Result<NodeIdSource, String> {
    NodeIdSource::host(text).ok_or_else(|| {
        format!(
            "unknown node source {text:?}; use {}",
            NodeIdSource::HOST_NAMES
        )
    })
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if (args.at.is_some() || args.times.is_some()) && args.kind != Kind::Layout {
        bail!(
            "--at and --times make layout ids; drop --kind {}",
            args.kind
        );
    }
    match args.kind {
        Kind::Layout => layout_ids(&args),
        Kind::ObjectId => {
            let generator = ObjectIdGenerator::new();
            with_stdout(|out| {
                for _ in 0..args.count {
                    writeln!(out, "{}", generator.next_id()?)?;
                }
                Ok(())
            })
        }
        kind => {
            let name = match (&args.namespace, &args.name) {
                (Some(ns), Some(name)) => Some((uuid::namespace(ns)?, name.as_bytes())),
                (None, None) => None,
                _ => bail!("--namespace and --name go together"),
            };
            if name.is_some() && !kind.is_name_based() {
                bail!("{kind} takes no name; --namespace and --name are for uuidv3 and uuidv5");
            }
            with_stdout(|out| {
                for _ in 0..args.count {
                    writeln!(out, "{}", uuid::generate(kind, name)?)?;
                }
                Ok(())
            })
        }
    }
}

/// Node and shard values by field name, from every flag that sets one.
/// A node field nobody set is 0, as `shardflake serve` defaults to node 0.
fn node_values(args: &Args, layout: &Layout) -> anyhow::Result<Vec<(String, u64)>> {
    let named = [
        ("node", args.node),
        ("datacenter", args.datacenter),
        ("worker", args.worker),
        ("process", args.process),
        ("machine", args.machine),
        ("shard", args.shard),
    ];
    let mut values: Vec<(String, u64)> = named
        .into_iter()
        .filter_map(|(name, v)| Some((name.to_string(), v?)))
        .chain(args.field.iter().cloned())
        .collect();
    if let (Some(key), Some(shards)) = (args.key, args.shards) {
        values.push(("shard".into(), layout.shard_for_key("shard", key, shards)?));
    }
    if let Some(source) = &args.node_from {
        let mut fields = layout.node_fields();
        let (Some(field), None) = (fields.next(), fields.next()) else {
            bail!(
                "--node-from needs a layout with exactly one node field; {} has {}",
                layout.name(),
                layout.node_fields().count()
            );
        };
        let value = HostInfo::read().node_id(layout, field.name(), source)?;
        values.push((field.name().to_string(), value));
    }
    for (i, (name, _)) in values.iter().enumerate() {
        if values[..i].iter().any(|(n, _)| n == name) {
            bail!("field {name:?} is given twice");
        }
    }
    for field in layout.node_fields() {
        if !values.iter().any(|(n, _)| n == field.name()) {
            values.push((field.name().to_string(), 0));
        }
    }
    Ok(values)
}

fn layout_ids(args: &Args) -> anyhow::Result<()> {
    let layout = args.layout.resolve()?;
    if args.namespace.is_some() || args.name.is_some() {
        bail!("--namespace and --name are for uuidv3 and uuidv5");
    }
    let values = node_values(args, &layout)?;
    if args.at.is_some() || args.times.is_some() {
        return backfill_ids(args, &layout, &values);
    }
    let mut builder = Generator::builder(layout.clone()).clock(SystemClock);
    for (name, value) in &values {
        builder = builder.node(name, *value);
    }
    let generator = builder.build()?;
    with_stdout(|out| {
        let mut left = args.count;
        while left > 0 {
            let run = left.min(RUN);
            let batch = generator.next_ids(run)?;
            for id in batch {
                match args.format {
                    Format::Dec => writeln!(out, "{id}")?,
                    format => writeln!(out, "{}", format.format(id))?,
                }
            }
            left -= run;
        }
        Ok(())
    })?;
    outlive_last_tick(&generator)
}

/// `--at`/`--times`: the node values must be given, not defaulted: node 0
/// is a live node's (`serve`'s default).
fn backfill_ids(args: &Args, layout: &Layout, values: &[(String, u64)]) -> anyhow::Result<()> {
    let given = given_fields(args);
    if let Some(field) = layout
        .node_fields()
        .find(|f| !given.iter().any(|g| g == f.name()))
    {
        bail!(
            "--at and --times need the backfill's node id given: add --{0} N (or --field {0}=N) with a value reserved for backfills, which no live node uses",
            field.name()
        );
    }
    let pairs: Vec<(&str, u64)> = values.iter().map(|(n, v)| (n.as_str(), *v)).collect();
    let nodes = layout.nodes(&pairs)?;
    let times = match (&args.at, &args.times) {
        (Some(at), _) => Times::At(at, args.count),
        (None, Some(file)) => Times::File(file),
        (None, None) => unreachable!("called for --at or --times"),
    };
    backfill::run(layout, nodes, &args.backfill_state, times, args.format)
}

/// The node fields a flag names (not those defaulted to 0).
fn given_fields(args: &Args) -> Vec<String> {
    let named = [
        ("node", args.node),
        ("datacenter", args.datacenter),
        ("worker", args.worker),
        ("process", args.process),
        ("machine", args.machine),
        ("shard", args.shard.or(args.key)),
    ];
    let mut given: Vec<String> = named
        .into_iter()
        .filter(|(_, v)| v.is_some())
        .map(|(n, _)| n.to_string())
        .chain(args.field.iter().map(|(n, _)| n.clone()))
        .collect();
    if args.node_from.is_some() {
        given.extend(
            args.layout
                .resolve()
                .ok()
                .and_then(|l| l.node_fields().next().map(|f| f.name().to_string())),
        );
    }
    given
}

/// Returns once the clock has passed the last tick used, so that the next
/// process started with the same node values cannot reuse it.
fn outlive_last_tick(generator: &Generator<SystemClock>) -> anyhow::Result<()> {
    let high_water = generator.high_water_ms();
    let deadline = Instant::now() + generator.lead() + Duration::from_secs(1);
    while SystemClock.now_ms() <= high_water {
        if Instant::now() > deadline {
            bail!("the clock did not pass the last tick used ({high_water} ms); did it step back?");
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    Ok(())
}
