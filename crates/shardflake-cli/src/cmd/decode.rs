//! `shardflake decode`: what an id says, as a table or one JSON object per id.

use std::io::Write;

use anyhow::{Context, bail};
use serde_json::{Map, Value, json};
use shardflake::kind::{Recognised, recognise};
use shardflake::timestamp::rfc3339_ms;
use shardflake::{Format, Layout, Parts};

use super::{LayoutArg, with_stdout};

#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:
  shardflake decode 454947766275222906
  shardflake decode --layout instagram --json 11637205501278089
  shardflake decode 0XbfGYCuLKE 06504c9540312d7a 0CM2CJN032BBT
  shardflake decode --format hex 8000000000000000
  shardflake decode 0190f3a2-8b5c-7d3e-9f00-000000000000

Every form `shardflake gen --format` and `--kind` writes is read back. Without
--format each id's form is told by its shape: hex has 16 digits (or 0x),
base32 13 characters, base62 11, an ObjectId 24 hex digits, a UUID 36 (or 32).
Digits alone are decimal unless they start with 0 at one of those widths;
force the form with --format for other digit-only text.")]
pub struct Args {
    /// Ids to decode; UUIDs and ObjectIds are recognised by their shape.
    #[arg(required = true)]
    ids: Vec<String>,
    #[command(flatten)]
    layout: LayoutArg,
    /// Text form of 64-bit ids: dec, hex, base32 or base62 [default: told
    /// by each id's shape].
    #[arg(short, long)]
    format: Option<Format>,
    /// One JSON object per line instead of a table.
    #[arg(long)]
    json: bool,
}

/// One decoded id, whatever its kind.
enum Decoded {
    Id(Parts),
    Other {
        text: String,
        kind: String,
        unix_ms: Option<u64>,
        details: String,
    },
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let layout = args.layout.resolve()?;
    let mut decoded = Vec::with_capacity(args.ids.len());
    let mut failed = 0;
    for text in &args.ids {
        match decode(text, args.format, &layout) {
            Ok(d) => decoded.push(d),
            Err(e) => {
                eprintln!("error: {e:#}");
                failed += 1;
            }
        }
    }
    with_stdout(|out| {
        if args.json {
            for d in &decoded {
                writeln!(out, "{}", to_json(d, &layout))?;
            }
        } else if !decoded.is_empty() {
            write_table(out, &layout, &decoded)?;
        }
        Ok(())
    })?;
    if failed > 0 {
        bail!("{failed} of {} ids could not be decoded", args.ids.len());
    }
    Ok(())
}

fn decode(text: &str, format: Option<Format>, layout: &Layout) -> anyhow::Result<Decoded> {
    let recognised = match format {
        Some(format) => recognise(text, format)?,
        None => recognise(text, Format::detect(text)).with_context(|| {
            format!(
                "{text:?} is not an id in any form shardflake writes \
                 (dec, hex, base32, base62, UUID, ObjectId)"
            )
        })?,
    };
    Ok(match recognised {
        Recognised::Id(id) => Decoded::Id(id.decode(layout)?),
        Recognised::Uuid(info) => Decoded::Other {
            text: info.uuid.to_string(),
            kind: format!("uuidv{}", info.version),
            unix_ms: info.unix_ms,
            details: String::new(),
        },
        Recognised::ObjectId(oid) => Decoded::Other {
            text: oid.to_string(),
            kind: "objectid".into(),
            unix_ms: Some(u64::from(oid.seconds()) * 1000),
            details: format!("counter={}", oid.counter()),
        },
    })
}

fn to_json(d: &Decoded, layout: &Layout) -> Value {
    match d {
        Decoded::Id(p) => {
            let fields: Map<String, Value> = p
                .fields
                .iter()
                .map(|(n, v)| (n.clone(), json!(v)))
                .collect();
            let mut object = json!({
                "id": p.id.to_string(),
                "layout": p.layout,
                "timestamp": p.timestamp(),
                "unix_ms": p.unix_ms,
                "fields": fields,
                "sequence": p.sequence,
            });
            // A sign-bit layout says, wherever it is shown, when its ids turn negative.
            if let Some(ms) = layout.negative_from_ms() {
                object["negative_from"] = json!(rfc3339_ms(ms));
            }
            object
        }
        Decoded::Other {
            text,
            kind,
            unix_ms,
            ..
        } => json!({
            "id": text,
            "kind": kind,
            "timestamp": unix_ms.map(rfc3339_ms),
            "unix_ms": unix_ms,
        }),
    }
}

fn write_table(out: &mut dyn Write, layout: &Layout, decoded: &[Decoded]) -> anyhow::Result<()> {
    let mut header = vec!["ID".to_string(), "TIMESTAMP (UTC)".into(), "UNIX_MS".into()];
    header.extend(layout.node_fields().map(|f| f.name().to_uppercase()));
    header.push("SEQUENCE".into());
    let width = header.len();
    let mut rows = vec![header];
    for d in decoded {
        rows.push(match d {
            Decoded::Id(p) => {
                let mut row = vec![p.id.to_string(), p.timestamp(), p.unix_ms.to_string()];
                row.extend(p.fields.iter().map(|(_, v)| v.to_string()));
                row.push(p.sequence.to_string());
                row
            }
            Decoded::Other {
                text,
                kind,
                unix_ms,
                details,
            } => {
                let mut row = vec![
                    text.clone(),
                    unix_ms.map_or("-".into(), rfc3339_ms),
                    unix_ms.map_or("-".into(), |ms| ms.to_string()),
                    format!("{kind} {details}").trim().to_string(),
                ];
                row.resize(width, String::new());
                row
            }
        });
    }
    let widths: Vec<usize> = (0..width)
        .map(|c| rows.iter().map(|r| r[c].len()).max().unwrap_or(0))
        .collect();
    for row in &rows {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        writeln!(out, "{}", line.join("  ").trim_end())?;
    }
    writeln!(out, "layout {layout}")?;
    if decoded
        .iter()
        .any(|d| matches!(d, Decoded::Id(p) if (p.id.get() as i64) < 0))
    {
        writeln!(out, "note: some ids above are negative as a signed bigint")?;
    }
    Ok(())
}
