//! Results of a comparison, and their text forms: a terminal table,
//! Markdown, JSON (through serde).

use std::fmt::Write as _;

use serde::Serialize;

use crate::scheme::{MadeBy, Scheme, ServerKind};

/// A whole run.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Rows asked for per scheme.
    pub rows: u64,
    /// Connections.
    pub clients: usize,
    /// Rows per `INSERT`.
    pub batch: usize,
    /// Longest insert phase per scheme, in seconds.
    pub seconds: u64,
    /// One per server compared.
    pub servers: Vec<ServerReport>,
    /// Stopped by the user before every scheme ran.
    pub interrupted: bool,
}

/// One server's results.
#[derive(Debug, Clone, Serialize)]
pub struct ServerReport {
    /// Which server.
    pub kind: ServerKind,
    /// Its `version()`.
    pub version: String,
    /// The sandbox schema or database.
    pub sandbox: String,
    /// The sandbox was dropped at the end.
    pub dropped: bool,
    /// One per scheme, the baseline first.
    pub results: Vec<SchemeResult>,
}

/// One scheme on one server.
#[derive(Debug, Clone, Serialize)]
pub struct SchemeResult {
    /// Which scheme.
    pub scheme: Scheme,
    /// Its label on this server.
    pub label: String,
    /// Key size in bytes.
    pub bytes: u32,
    /// Who makes the id.
    pub made_by: MadeBy,
    /// What it needs to stay unique across servers.
    pub coordination: String,
    /// Why it did not run (a server without the feature, a setting this
    /// tool does not change), or the error that stopped it.
    pub skipped: Option<String>,
    /// The error that stopped it, if it failed.
    pub error: Option<String>,
    /// Rows sent in the insert phase.
    pub rows: u64,
    /// Rows stored in the insert phase.
    pub inserted: u64,
    /// Length of the insert phase.
    pub seconds: f64,
    /// Rows stored per second.
    pub rows_per_s: f64,
    /// `rows_per_s` over the baseline's in the same run.
    pub vs_baseline: Option<f64>,
    /// Table (heap, or clustered index and secondary indexes) bytes after
    /// the inserts.
    pub table_bytes: u64,
    /// Primary key bytes after the inserts (InnoDB: the clustered index,
    /// which holds the rows).
    pub index_bytes: u64,
    /// Rows deleted and as many inserted again in the churn phase.
    pub churned: u64,
    /// Table bytes after the churn.
    pub table_bytes_after_churn: u64,
    /// Primary key bytes after the churn.
    pub index_bytes_after_churn: u64,
    /// Ids per second of the generator alone, where the database does not
    /// make the id.
    pub generator_ids_per_s: Option<f64>,
    /// Ids checked for order (each against the one before from the same
    /// connection).
    pub ordered: u64,
    /// Ids not above the one before from the same connection.
    pub inversions: u64,
    /// Rows sent whose id was already stored (skipped by the server).
    pub duplicates: u64,
    /// Duplicates are this scheme's known trap (the seed's procedure).
    pub duplicates_expected: bool,
}

impl SchemeResult {
    /// A result with nothing measured yet.
    pub fn new(scheme: Scheme, kind: ServerKind) -> Self {
        SchemeResult {
            scheme,
            label: scheme.label(kind).to_string(),
            bytes: scheme.bytes(),
            made_by: scheme.made_by(),
            coordination: scheme.coordination().to_string(),
            skipped: None,
            error: None,
            rows: 0,
            inserted: 0,
            seconds: 0.0,
            rows_per_s: 0.0,
            vs_baseline: None,
            table_bytes: 0,
            index_bytes: 0,
            churned: 0,
            table_bytes_after_churn: 0,
            index_bytes_after_churn: 0,
            generator_ids_per_s: None,
            ordered: 0,
            inversions: 0,
            duplicates: 0,
            duplicates_expected: scheme.duplicates_expected(),
        }
    }

    /// It ran to the end.
    pub fn ran(&self) -> bool {
        self.skipped.is_none() && self.error.is_none()
    }

    /// Whether ids came in increasing order (`None` where none were seen).
    pub fn time_sorted(&self) -> Option<bool> {
        (self.ordered > 0).then_some(self.inversions == 0)
    }

    /// Primary-key bytes per stored row.
    pub fn index_bytes_per_row(&self) -> Option<f64> {
        (self.inserted > 0).then(|| self.index_bytes as f64 / self.inserted as f64)
    }

    /// Primary-key bytes per row after the churn (as many rows inserted
    /// as were deleted, so about as many rows as before).
    pub fn index_bytes_per_row_after_churn(&self) -> Option<f64> {
        (self.inserted > 0 && self.index_bytes_after_churn > 0)
            .then(|| self.index_bytes_after_churn as f64 / self.inserted as f64)
    }
}

impl Report {
    /// Every scheme ran, and none repeated an id except where expected.
    pub fn clean(&self) -> bool {
        !self.interrupted
            && self.servers.iter().all(|s| {
                s.dropped
                    && s.results
                        .iter()
                        .all(|r| r.error.is_none() && (r.duplicates == 0 || r.duplicates_expected))
            })
    }

    /// An aligned table for a terminal.
    pub fn table(&self) -> String {
        let mut out = String::new();
        for s in &self.servers {
            let _ = writeln!(out, "{}", heading(s));
            let rows: Vec<Vec<String>> =
                std::iter::once(HEADER.iter().map(|h| h.to_string()).collect())
                    .chain(s.results.iter().map(cells))
                    .collect();
            let widths: Vec<usize> = (0..HEADER.len())
                .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
                .collect();
            for (n, r) in rows.iter().enumerate() {
                let line: Vec<String> = r
                    .iter()
                    .zip(&widths)
                    .enumerate()
                    .map(|(i, (c, w))| {
                        if i == 0 || i == HEADER.len() - 1 {
                            format!("{c:<w$}")
                        } else {
                            format!("{c:>w$}")
                        }
                    })
                    .collect();
                let _ = writeln!(out, "{}", line.join("  ").trim_end());
                if n == 0 {
                    let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
                    let _ = writeln!(out, "{}", rule.join("  "));
                }
            }
            for r in &s.results {
                if let Some(why) = r.skipped.as_ref().or(r.error.as_ref()) {
                    let _ = writeln!(out, "  {}: {why}", r.label);
                }
            }
            let _ = writeln!(out);
        }
        out.push_str(&self.footnote());
        out
    }

    /// A Markdown table per server.
    pub fn markdown(&self) -> String {
        let mut out = String::new();
        for s in &self.servers {
            let _ = writeln!(out, "**{}**\n", heading(s));
            let _ = writeln!(out, "| {} |", HEADER.join(" | "));
            let align: Vec<&str> = (0..HEADER.len())
                .map(|i| {
                    if i == 0 || i == HEADER.len() - 1 {
                        "---"
                    } else {
                        "---:"
                    }
                })
                .collect();
            let _ = writeln!(out, "|{}|", align.join("|"));
            for r in &s.results {
                let _ = writeln!(out, "| {} |", cells(r).join(" | "));
            }
            let notes: Vec<String> = s
                .results
                .iter()
                .filter_map(|r| {
                    r.skipped
                        .as_ref()
                        .or(r.error.as_ref())
                        .map(|w| format!("- {}: {w}", r.label))
                })
                .collect();
            if !notes.is_empty() {
                let _ = writeln!(out, "\n{}", notes.join("\n"));
            }
            let _ = writeln!(out);
        }
        out.push_str(&self.footnote());
        out
    }

    fn footnote(&self) -> String {
        format!(
            "{} rows per scheme (fewer where {} s ran out; rows: stored), {} connections, {} rows per INSERT{}.\n\
             x base: rows/s over the server's own counter in this run. churn: ~10% of rows deleted, \
             vacuumed, as many inserted again. in order: each connection's ids increasing.\n",
            self.rows,
            self.seconds,
            self.clients,
            self.batch,
            if self.interrupted {
                "; INTERRUPTED"
            } else {
                ""
            },
        )
    }
}

const HEADER: [&str; 13] = [
    "scheme",
    "bytes",
    "rows",
    "rows/s",
    "x base",
    "table MB",
    "PK MB",
    "PK B/row",
    "PK B/row churn",
    "gen ids/s",
    "in order",
    "dups",
    "coordination",
];

fn heading(s: &ServerReport) -> String {
    format!(
        "{} {} (sandbox {}{})",
        s.kind.name(),
        s.version,
        s.sandbox,
        if s.dropped {
            ", dropped"
        } else {
            ", NOT dropped"
        }
    )
}

fn cells(r: &SchemeResult) -> Vec<String> {
    let dash = || "-".to_string();
    if !r.ran() {
        let mut c = vec![r.label.clone(), r.bytes.to_string(), dash()];
        c.push(if r.error.is_some() {
            "failed".into()
        } else {
            "skipped".into()
        });
        c.extend((4..HEADER.len() - 1).map(|_| dash()));
        c.push(r.coordination.clone());
        return c;
    }
    vec![
        r.label.clone(),
        r.bytes.to_string(),
        r.inserted.to_string(),
        format!("{:.0}", r.rows_per_s),
        r.vs_baseline.map_or_else(dash, |x| format!("{x:.2}")),
        mb(r.table_bytes),
        mb(r.index_bytes),
        r.index_bytes_per_row()
            .map_or_else(dash, |b| format!("{b:.1}")),
        r.index_bytes_per_row_after_churn()
            .map_or_else(dash, |b| format!("{b:.1}")),
        r.generator_ids_per_s.map_or_else(dash, si),
        match r.time_sorted() {
            Some(true) => "yes".into(),
            Some(false) => format!("no ({})", r.inversions),
            None => dash(),
        },
        if r.duplicates_expected && r.duplicates > 0 {
            format!("{} (trap)", r.duplicates)
        } else {
            r.duplicates.to_string()
        },
        r.coordination.clone(),
    ]
}

fn mb(b: u64) -> String {
    format!("{:.2}", b as f64 / 1_048_576.0)
}

fn si(x: f64) -> String {
    if x >= 1e6 {
        format!("{:.1}M", x / 1e6)
    } else if x >= 1e3 {
        format!("{:.0}k", x / 1e3)
    } else {
        format!("{x:.0}")
    }
}

/// Sets each result's ratio to the baseline's rows per second.
pub(crate) fn against_baseline(results: &mut [SchemeResult]) {
    let base = results
        .iter()
        .find(|r| r.scheme.is_baseline() && r.ran() && r.rows_per_s > 0.0)
        .map(|r| r.rows_per_s);
    if let Some(base) = base {
        for r in results.iter_mut().filter(|r| r.ran()) {
            r.vs_baseline = Some(r.rows_per_s / base);
        }
    }
}
