//! The results as SVG bar charts: per server, the insert rate against the
//! server's own counter, and the primary key's bytes per row after the
//! inserts and after the churn.

use std::path::Path;

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::error::CompareError;
use crate::report::{Report, SchemeResult, ServerReport};

const PANEL_W: u32 = 560;
const ROW_H: u32 = 24;
const LABEL_W: i32 = 250;
const TOP: i32 = 40;

/// One metric drawn as bars.
struct Metric {
    title: &'static str,
    value: fn(&SchemeResult) -> Option<f64>,
    format: fn(f64) -> String,
}

const METRICS: [Metric; 3] = [
    Metric {
        title: "insert rate, x the server's own counter",
        value: |r| r.vs_baseline,
        format: |v| format!("{v:.2}x"),
    },
    Metric {
        title: "primary key, bytes per row",
        value: |r| r.index_bytes_per_row(),
        format: |v| format!("{v:.1} B"),
    },
    Metric {
        title: "primary key after ~10% churn, bytes per row",
        value: |r| r.index_bytes_per_row_after_churn(),
        format: |v| format!("{v:.1} B"),
    },
];

/// Writes the report's charts to `path` as one SVG file.
pub fn write_svg(report: &Report, path: &Path) -> Result<(), CompareError> {
    let err = |e: &dyn std::fmt::Display| CompareError::Chart {
        path: path.display().to_string(),
        message: e.to_string(),
    };
    let servers: Vec<&ServerReport> = report
        .servers
        .iter()
        .filter(|s| !s.results.is_empty())
        .collect();
    if servers.is_empty() {
        return Err(err(&"nothing was measured"));
    }
    let heights: Vec<u32> = servers
        .iter()
        .map(|s| TOP as u32 + 20 + ROW_H * s.results.len() as u32)
        .collect();
    let width = PANEL_W * METRICS.len() as u32;
    let root = SVGBackend::new(path, (width, heights.iter().sum())).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut top = 0i32;
    for (server, h) in servers.iter().zip(&heights) {
        let band = root.margin(top, 0, 0, 0);
        for (i, metric) in METRICS.iter().enumerate() {
            let area = band.margin(0, 0, PANEL_W as i32 * i as i32, 0);
            let area = area.shrink((0, 0), (PANEL_W, *h));
            panel(&area, server, metric).map_err(|e| err(&e))?;
        }
        top += *h as i32;
    }
    root.present().map_err(|e| err(&e))
}

fn panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    server: &ServerReport,
    metric: &Metric,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let title = TextStyle::from(("sans-serif", 14).into_font());
    let text = TextStyle::from(("sans-serif", 12).into_font());
    area.draw(&Text::new(
        format!(
            "{} {}: {}",
            server.kind.name(),
            short(&server.version),
            metric.title
        ),
        (8, 14),
        title,
    ))?;
    let values: Vec<Option<f64>> = server
        .results
        .iter()
        .map(|r| r.ran().then(|| (metric.value)(r)).flatten())
        .collect();
    let max = values.iter().flatten().cloned().fold(0.0f64, f64::max);
    let bar_w = PANEL_W as i32 - LABEL_W - 90;
    for (i, (r, v)) in server.results.iter().zip(&values).enumerate() {
        let y = TOP + i as i32 * ROW_H as i32;
        let right = text.pos(Pos::new(HPos::Right, VPos::Center));
        area.draw(&Text::new(r.label.clone(), (LABEL_W - 6, y + 9), right))?;
        let left = text.pos(Pos::new(HPos::Left, VPos::Center));
        match v {
            Some(v) if max > 0.0 => {
                let len = ((v / max) * bar_w as f64).round().max(1.0) as i32;
                let color = if r.scheme.is_baseline() {
                    RGBColor(120, 120, 120)
                } else {
                    RGBColor(52, 101, 164)
                };
                area.draw(&Rectangle::new(
                    [(LABEL_W, y + 2), (LABEL_W + len, y + 17)],
                    color.filled(),
                ))?;
                area.draw(&Text::new(
                    (metric.format)(*v),
                    (LABEL_W + len + 4, y + 9),
                    left,
                ))?;
            }
            _ => {
                let why = if r.ran() { "-" } else { "skipped" };
                area.draw(&Text::new(why.to_string(), (LABEL_W + 4, y + 9), left))?;
            }
        }
    }
    Ok(())
}

/// `15.14 (Debian 15.14-0+deb12u1)` → `15.14`.
fn short(version: &str) -> &str {
    version.split([' ', '-']).next().unwrap_or(version)
}
