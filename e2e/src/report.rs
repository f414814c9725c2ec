//! The benchmark suite's output: sample statistics, tables printed to
//! stdout, the machine-readable `results.json`, the generated
//! `BENCHMARKS.md`, and SVG plots drawn without a plotting library (the
//! figures are few and simple; a dependency would cost more than these
//! lines).

use std::fmt::Write as _;
use std::path::Path;

use serde_json::{json, Value};

/// Median, extremes and tail of one series of samples.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stats {
    pub n: usize,
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub p99: f64,
}

impl Stats {
    pub fn of(samples: &[f64]) -> Stats {
        let mut v = samples.to_vec();
        v.sort_by(|a, b| a.total_cmp(b));
        Stats {
            n: v.len(),
            median: percentile(&v, 0.5),
            min: v.first().copied().unwrap_or(0.0),
            max: v.last().copied().unwrap_or(0.0),
            p99: percentile(&v, 0.99),
        }
    }

    /// "median [min..max]", the form every table uses.
    pub fn cell(&self) -> String {
        format!("{:.2} [{:.2}..{:.2}]", self.median, self.min, self.max)
    }

    pub fn json(&self) -> Value {
        json!({"n": self.n, "median": self.median, "min": self.min, "max": self.max, "p99": self.p99})
    }
}

/// Nearest-rank percentile of an ascending series.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// One printed table; `raw` carries the same figures unformatted.
pub struct Table {
    pub id: &'static str,
    pub title: String,
    pub columns: Vec<String>,
    pub rows: Vec<Vec<String>>,
    pub raw: Vec<Value>,
}

impl Table {
    pub fn new(id: &'static str, title: impl Into<String>, columns: &[&str]) -> Table {
        Table {
            id,
            title: title.into(),
            columns: columns.iter().map(|c| c.to_string()).collect(),
            rows: Vec::new(),
            raw: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>, raw: Value) {
        self.rows.push(cells);
        self.raw.push(raw);
    }

    fn widths(&self) -> Vec<usize> {
        let mut w: Vec<usize> = self.columns.iter().map(|c| c.chars().count()).collect();
        for row in &self.rows {
            for (i, cell) in row.iter().enumerate() {
                if let Some(slot) = w.get_mut(i) {
                    *slot = (*slot).max(cell.chars().count());
                }
            }
        }
        w
    }

    pub fn text(&self) -> String {
        let w = self.widths();
        let line = |cells: &[String]| {
            cells
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    let width = w.get(i).copied().unwrap_or(0);
                    if i == 0 {
                        format!("{c:<width$}")
                    } else {
                        format!("{c:>width$}")
                    }
                })
                .collect::<Vec<_>>()
                .join("  ")
        };
        let mut out = format!("\n{}\n{}\n", self.title, line(&self.columns));
        for row in &self.rows {
            out.push_str(&line(row));
            out.push('\n');
        }
        out
    }

    pub fn markdown(&self) -> String {
        let mut out = format!("**{}**\n\n| {} |\n|", self.title, self.columns.join(" | "));
        for i in 0..self.columns.len() {
            out.push_str(if i == 0 { "---|" } else { "---:|" });
        }
        out.push('\n');
        for row in &self.rows {
            let _ = writeln!(out, "| {} |", row.join(" | "));
        }
        out
    }
}

/// A target from the issue and whether this run met it. `cause` says why
/// when it was missed; it is only shown then.
pub struct TargetOutcome {
    pub target: String,
    pub measured: String,
    pub met: bool,
    pub cause: String,
}

#[derive(Default)]
pub struct Report {
    pub tables: Vec<Table>,
    pub verdicts: Vec<TargetOutcome>,
    /// (file name, caption)
    pub plots: Vec<(String, String)>,
    pub notes: Vec<String>,
}

impl Report {
    pub fn add(&mut self, table: Table) {
        print!("{}", table.text());
        self.tables.push(table);
    }

    pub fn verdict(&mut self, target: &str, measured: String, met: bool, cause: &str) {
        println!(
            "target {target}: {measured} -> {}",
            if met { "met" } else { "NOT met" }
        );
        self.verdicts.push(TargetOutcome {
            target: target.to_string(),
            measured,
            met,
            cause: cause.to_string(),
        });
    }

    pub fn verdict_table(&self) -> Table {
        let mut t = Table::new("targets", "Targets", &["target", "this run", "verdict"]);
        for v in &self.verdicts {
            let verdict = if v.met {
                "met".to_string()
            } else {
                format!("not met: {}", v.cause)
            };
            t.row(
                vec![v.target.clone(), v.measured.clone(), verdict],
                json!({"target": v.target, "measured": v.measured, "met": v.met, "cause": v.cause}),
            );
        }
        t
    }

    pub fn json(&self, machine: &Value, command: &str) -> Value {
        json!({
            "command": command,
            "machine": machine,
            "tables": self.tables.iter().map(|t| json!({
                "id": t.id, "title": t.title, "columns": t.columns, "rows": t.raw,
            })).collect::<Vec<_>>(),
            "targets": self.verdict_table().raw,
            "plots": self.plots.iter().map(|(f, c)| json!({"file": f, "caption": c})).collect::<Vec<_>>(),
        })
    }

    /// `BENCHMARKS.md`, whole: it is regenerated by every full run.
    /// `plot_dir` is relative to the markdown file.
    pub fn markdown(&self, machine: &Value, command: &str, plot_dir: &str) -> String {
        let mut md = String::from(
            "# Benchmarks\n\n\
             Generated by the benchmark suite; do not edit by hand. Every figure is\n\
             measured in the same run as its anchor (the reference plugins, or `ip`\n\
             commands doing the same netlink work), interleaved, on the e2e topology:\n\
             a node netns whose uplink is a veth into a fabric bridge, and pod netns.\n\
             Times are wall-clock milliseconds, `median [min..max]` over the runs.\n\n",
        );
        let _ = writeln!(md, "## How to reproduce\n\n```sh\n{command}\n```\n");
        md.push_str(
            "It needs root (namespaces). `--quick` is a short smoke run that leaves\n\
             this file alone. The machine-readable results are in\n\
             `docs/bench/results.json`.\n\n## Machine\n\n",
        );
        if let Some(m) = machine.as_object() {
            for (k, v) in m {
                let v = v.as_str().map(str::to_string).unwrap_or(v.to_string());
                let _ = writeln!(md, "- {k}: {v}");
            }
        }
        md.push_str("\n## Targets\n\n");
        let targets = self.verdict_table().markdown();
        md.push_str(targets.trim_start_matches("**Targets**\n\n"));
        md.push_str("\n## Results\n\n");
        for t in &self.tables {
            md.push_str(&t.markdown());
            md.push('\n');
        }
        if !self.plots.is_empty() {
            md.push_str("## Plots\n\n");
            for (file, caption) in &self.plots {
                let _ = writeln!(md, "![{caption}]({plot_dir}/{file})\n\n{caption}\n");
            }
        }
        if !self.notes.is_empty() {
            md.push_str("## Notes\n\n");
            for n in &self.notes {
                let _ = writeln!(md, "- {n}");
            }
        }
        md
    }

    pub fn write(&self, out_dir: &Path, name: &str, text: &str) {
        let path = out_dir.join(name);
        if let Err(e) = std::fs::write(&path, text) {
            panic!("cannot write {}: {e}", path.display());
        }
    }
}

/// The part of `BENCHMARKS.md` that `bench-cluster` (`scripts/bench.sh
/// --cluster`) writes and the file-store suite keeps as it is: each
/// generator owns its own sections, and neither run erases the other's.
pub const CLUSTER_BEGIN: &str = "<!-- cluster sections: written by scripts/bench.sh --cluster -->";
pub const CLUSTER_END: &str = "<!-- end of cluster sections -->";

/// The cluster sections of `doc`, markers included, if it has them.
pub fn cluster_region(doc: &str) -> Option<&str> {
    let start = doc.find(CLUSTER_BEGIN)?;
    let end = doc[start..].find(CLUSTER_END)? + start + CLUSTER_END.len();
    Some(&doc[start..end])
}

/// `doc` with its cluster sections replaced by `region` (markers
/// included), or with `region` put before its plots when it has none yet.
pub fn splice_cluster_region(doc: &str, region: &str) -> String {
    if let Some(old) = cluster_region(doc) {
        return doc.replacen(old, region, 1);
    }
    match doc.find("\n## Plots\n") {
        Some(at) => format!("{}\n{region}\n{}", &doc[..at], &doc[at..]),
        None => format!("{}\n{region}\n", doc.trim_end()),
    }
}

/// One named series of (x, y) points for a plot.
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

const PALETTE: [&str; 5] = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"];
const W: f64 = 860.0;
const H: f64 = 420.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 330.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 60.0;

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A line plot; `log_x` draws the x axis in decades (claims span 10 to
/// 60,000). The y axis starts at 0 so ratios read true.
pub fn line_plot(
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
    log_x: bool,
) -> String {
    let tx = |x: f64| if log_x { x.max(1.0).log10() } else { x };
    let all: Vec<(f64, f64)> = series.iter().flat_map(|s| s.points.clone()).collect();
    let (mut x0, mut x1) = all.iter().fold((f64::MAX, f64::MIN), |(a, b), p| {
        (a.min(tx(p.0)), b.max(tx(p.0)))
    });
    if all.is_empty() || x0 >= x1 {
        x0 = 0.0;
        x1 = x1.max(1.0);
    }
    if log_x {
        x0 = x0.floor();
        x1 = x1.ceil();
    }
    let y1 = nice_ceiling(all.iter().map(|p| p.1).fold(0.0, f64::max));
    let px = |x: f64| LEFT + (tx(x) - x0) / (x1 - x0) * (W - LEFT - RIGHT);
    let py = |y: f64| H - BOTTOM - y / y1 * (H - TOP - BOTTOM);
    let mut svg = frame(title, x_label, y_label);
    for i in 0..=5 {
        let y = y1 * f64::from(i) / 5.0;
        let _ = write!(
            svg,
            r##"<line x1="{LEFT}" y1="{0:.1}" x2="{1}" y2="{0:.1}" stroke="#ddd"/><text x="{2}" y="{3:.1}" text-anchor="end">{y:.1}</text>"##,
            py(y),
            W - RIGHT,
            LEFT - 6.0,
            py(y) + 4.0
        );
    }
    let ticks: Vec<f64> = if log_x {
        (x0 as i32..=x1 as i32).map(|d| 10f64.powi(d)).collect()
    } else {
        (0..=5)
            .map(|i| x0 + (x1 - x0) * f64::from(i) / 5.0)
            .collect()
    };
    for x in ticks {
        let _ = write!(
            svg,
            r##"<text x="{:.1}" y="{}" text-anchor="middle">{}</text>"##,
            px(x),
            H - BOTTOM + 18.0,
            thousands(x)
        );
    }
    for (i, s) in series.iter().enumerate() {
        let colour = PALETTE[i % PALETTE.len()];
        let path: Vec<String> = s
            .points
            .iter()
            .map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y)))
            .collect();
        let _ = write!(
            svg,
            r##"<polyline fill="none" stroke="{colour}" stroke-width="2" points="{}"/>"##,
            path.join(" ")
        );
        // Markers only where they can be told apart.
        for &(x, y) in s.points.iter().filter(|_| s.points.len() <= 40) {
            let _ = write!(
                svg,
                r##"<circle cx="{:.1}" cy="{:.1}" r="3.5" fill="{colour}"/>"##,
                px(x),
                py(y)
            );
        }
        legend(&mut svg, i, colour, &s.name);
    }
    svg.push_str("</svg>\n");
    svg
}

/// Each series' samples sorted ascending against their rank in percent:
/// the distribution (a CDF lying on its side) of one latency per ADD.
pub fn distribution_plot(title: &str, y_label: &str, series: &[(String, Vec<f64>)]) -> String {
    let lines: Vec<Series> = series
        .iter()
        .map(|(name, samples)| {
            let mut v = samples.clone();
            v.sort_by(|a, b| a.total_cmp(b));
            let n = v.len().max(2) - 1;
            Series {
                name: name.clone(),
                points: v
                    .iter()
                    .enumerate()
                    .map(|(i, &y)| (100.0 * i as f64 / n as f64, y))
                    .collect(),
            }
        })
        .collect();
    line_plot(title, "percentile of ADDs", y_label, &lines, false)
}

fn frame(title: &str, x_label: &str, y_label: &str) -> String {
    let (title, x_label, y_label) = (escape(title), escape(x_label), escape(y_label));
    let (cx, axis_y, axis_x_end) = (W / 2.0, H - BOTTOM, W - RIGHT);
    let (label_x, label_y, y_mid) = ((LEFT + W - RIGHT) / 2.0, H - 18.0, (TOP + H - BOTTOM) / 2.0);
    format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12"><rect width="100%" height="100%" fill="white"/><text x="{cx:.1}" y="22" text-anchor="middle" font-size="15">{title}</text><line x1="{LEFT}" y1="{axis_y}" x2="{axis_x_end}" y2="{axis_y}" stroke="#333"/><line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{axis_y}" stroke="#333"/><text x="{label_x:.1}" y="{label_y}" text-anchor="middle">{x_label}</text><text transform="translate(18 {y_mid:.1}) rotate(-90)" text-anchor="middle">{y_label}</text>"##
    )
}

fn legend(svg: &mut String, i: usize, colour: &str, name: &str) {
    let y = TOP + 10.0 + 20.0 * i as f64;
    let x = W - RIGHT + 15.0;
    let _ = write!(
        svg,
        r##"<rect x="{x}" y="{:.1}" width="14" height="4" fill="{colour}"/><text x="{:.1}" y="{:.1}">{}</text>"##,
        y - 4.0,
        x + 20.0,
        y + 2.0,
        escape(name)
    );
}

fn nice_ceiling(v: f64) -> f64 {
    if v <= 0.0 {
        return 1.0;
    }
    let mag = 10f64.powf(v.log10().floor());
    [1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|&c| c >= v)
        .unwrap_or(10.0 * mag)
}

fn thousands(x: f64) -> String {
    if x >= 1000.0 && (x / 1000.0).fract() == 0.0 {
        format!("{}k", x / 1000.0)
    } else if x.fract() == 0.0 {
        format!("{x:.0}")
    } else {
        format!("{x:.1}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_of_a_series() {
        let s = Stats::of(&[5.0, 1.0, 3.0, 2.0, 4.0]);
        assert_eq!((s.n, s.median, s.min, s.max), (5, 3.0, 1.0, 5.0));
        assert_eq!(s.cell(), "3.00 [1.00..5.00]");
        assert_eq!(Stats::of(&[]).median, 0.0);
    }

    #[test]
    fn percentiles_by_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.5), 51.0);
        assert_eq!(percentile(&v, 0.99), 99.0);
        assert_eq!(percentile(&v, 1.0), 100.0);
    }

    #[test]
    fn tables_align_and_render_as_markdown() {
        let mut t = Table::new("x", "title", &["case", "ms"]);
        t.row(vec!["a long case".into(), "1.00".into()], json!({}));
        assert!(t.text().contains("a long case  1.00"));
        assert!(t
            .markdown()
            .contains("| case | ms |\n|---|---:|\n| a long case | 1.00 |"));
    }

    #[test]
    fn the_cluster_sections_survive_either_generator() {
        let region = format!("{CLUSTER_BEGIN}\n## Pod start\n\nnew\n{CLUSTER_END}");
        let fresh = "# Benchmarks\n\n## Results\n\nx\n\n## Plots\n\np\n";
        let with = splice_cluster_region(fresh, &region);
        assert!(with.find(&region) < with.find("## Plots"), "{with}");
        assert_eq!(cluster_region(&with), Some(region.as_str()));
        // A second splice replaces, never duplicates.
        let newer = region.replace("new", "newer");
        let again = splice_cluster_region(&with, &newer);
        assert_eq!(again.matches(CLUSTER_BEGIN).count(), 1);
        assert!(again.contains("newer") && !again.contains("\nnew\n"));
        assert!(splice_cluster_region("# B\n", &region).ends_with(&format!("{region}\n")));
        assert_eq!(cluster_region("no markers"), None);
    }

    #[test]
    fn plots_are_well_formed_svg() {
        let svg = line_plot(
            "t <1>",
            "claims",
            "ms",
            &[Series {
                name: "ours".into(),
                points: vec![(10.0, 5.0), (60_000.0, 6.0)],
            }],
            true,
        );
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert!(svg.contains("t &lt;1&gt;") && svg.contains(">10k<"));
        let d = distribution_plot("d", "ms", &[("x".into(), vec![3.0, 1.0, 2.0])]);
        assert_eq!(d.matches("<circle").count(), 3);
        let many: Vec<f64> = (0..100).map(f64::from).collect();
        let d = distribution_plot("d", "ms", &[("x".into(), many)]);
        assert_eq!(d.matches("<circle").count(), 0);
        assert_eq!(nice_ceiling(7.3), 8.0);
        assert_eq!(nice_ceiling(23.0), 25.0);
        assert_eq!(nice_ceiling(1130.0), 1200.0);
    }
}
