//! One SVG bar chart per workload and placement: a bar per topology at its median, a min–max
//! whisker over it, the ratio to host under each bar. Written by hand: small and dependency-free.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::report::{fmt_value, Machine};
use crate::spec::{Placement, Workload};
use crate::stats::Row;

/// Escapes text for XML.
pub(crate) fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A "nice" axis maximum at or above `v`: 1, 2, 2.5 or 5 × 10^k.
fn nice_max(v: f64) -> f64 {
    if v <= 0.0 || !v.is_finite() {
        return 1.0;
    }
    let exp = v.log10().floor();
    let base = 10f64.powf(exp);
    for m in [1.0, 2.0, 2.5, 5.0, 10.0] {
        if m * base >= v {
            return m * base;
        }
    }
    10.0 * base
}

/// The chart's geometry: size, margins and the value axis.
struct Frame {
    w: f64,
    h: f64,
    left: f64,
    right: f64,
    top: f64,
    plot_w: f64,
    plot_h: f64,
    ymax: f64,
}

impl Frame {
    fn new(rows: &[&Row]) -> Self {
        let (w, h) = (720.0, 420.0);
        let (left, right, top, bottom) = (80.0, 20.0, 60.0, 70.0);
        let top_val = rows
            .iter()
            .filter_map(|r| r.max.or(r.median))
            .fold(0.0f64, f64::max);
        Self {
            w,
            h,
            left,
            right,
            top,
            plot_w: w - left - right,
            plot_h: h - top - bottom,
            ymax: nice_max(top_val * 1.05),
        }
    }

    /// The y coordinate of value `v`.
    fn y(&self, v: f64) -> f64 {
        self.top + self.plot_h - (v / self.ymax).clamp(0.0, 1.0) * self.plot_h
    }
}

/// Renders the chart for `rows` (all of one workload and placement).
pub fn chart(workload: Workload, placement: Placement, rows: &[&Row], machine: &Machine) -> String {
    // Ratios are to `host`, or to the first topology when host did not run (stats::baseline).
    let base = if rows.iter().any(|r| r.topology == "host") {
        "host"
    } else {
        rows.first().map(|r| r.topology.as_str()).unwrap_or("host")
    };
    let f = Frame::new(rows);
    let mut s = String::new();
    header(&mut s, &f, workload, placement, machine);
    axis(&mut s, &f, workload);
    let n = rows.len().max(1) as f64;
    let slot = f.plot_w / n;
    let bar_w = (slot * 0.6).min(90.0);
    let _ = writeln!(s, r##"<g class="bars">"##);
    for (i, r) in rows.iter().enumerate() {
        let cx = f.left + slot * (i as f64 + 0.5);
        bar(&mut s, &f, r, cx, bar_w, base, workload);
    }
    let _ = writeln!(s, "</g>");
    let _ = writeln!(
        s,
        r##"<line x1="{}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="black"/>"##,
        f.left,
        f.top + f.plot_h,
        f.w - f.right,
        f.top + f.plot_h
    );
    let _ = writeln!(s, "</svg>");
    s
}

/// The `<svg>` element, the background, the title and the subtitle.
fn header(s: &mut String, f: &Frame, workload: Workload, placement: Placement, machine: &Machine) {
    let (w, h) = (f.w, f.h);
    let _ = writeln!(
        s,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"##
    );
    let _ = writeln!(s, r##"<rect width="{w}" height="{h}" fill="white"/>"##);
    let better = if workload.higher_is_better() {
        "higher is better"
    } else {
        "lower is better"
    };
    let _ = writeln!(
        s,
        r##"<text x="{}" y="24" text-anchor="middle" font-size="16" font-weight="bold">nsfast bench: {} ({}, {better}), {}</text>"##,
        w / 2.0,
        esc(workload.name()),
        esc(workload.unit()),
        esc(placement.name())
    );
    let _ = writeln!(
        s,
        r##"<text x="{}" y="42" text-anchor="middle" fill="#555">kernel {} · {} · median of rounds, whiskers min–max</text>"##,
        w / 2.0,
        esc(&machine.kernel),
        esc(&machine.date)
    );
}

/// The value axis: grid lines, their labels, the unit.
fn axis(s: &mut String, f: &Frame, workload: Workload) {
    let left = f.left;
    for i in 0..=5 {
        let v = f.ymax * f64::from(i) / 5.0;
        let yy = f.y(v);
        let _ = writeln!(
            s,
            r##"<line x1="{left}" y1="{yy:.1}" x2="{:.1}" y2="{yy:.1}" stroke="#ddd"/>"##,
            f.w - f.right
        );
        let _ = writeln!(
            s,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            left - 6.0,
            yy + 4.0,
            esc(&fmt_value(v))
        );
    }
    let _ = writeln!(
        s,
        r##"<text x="16" y="{:.1}" transform="rotate(-90 16 {:.1})" text-anchor="middle">{}</text>"##,
        f.top + f.plot_h / 2.0,
        f.top + f.plot_h / 2.0,
        esc(workload.unit())
    );
}

/// One topology's bar at `cx`: the bar, its whisker, its value, its name and its ratio.
fn bar(s: &mut String, f: &Frame, r: &Row, cx: f64, bar_w: f64, base: &str, workload: Workload) {
    let (top, plot_h) = (f.top, f.plot_h);
    let y = |v: f64| f.y(v);
    let med = r.median.unwrap_or(0.0);
    let color = if r.topology == "host" {
        "#888888"
    } else {
        "#3b75af"
    };
    let _ = writeln!(
        s,
        r##"<rect class="bar" data-topology="{}" x="{:.1}" y="{:.1}" width="{bar_w:.1}" height="{:.1}" fill="{color}"><title>{}: {} {}</title></rect>"##,
        esc(&r.topology),
        cx - bar_w / 2.0,
        y(med),
        (top + plot_h - y(med)).max(0.0),
        esc(&r.topology),
        esc(&fmt_value(med)),
        esc(workload.unit())
    );
    if let (Some(lo), Some(hi)) = (r.min, r.max) {
        let (ylo, yhi) = (y(lo), y(hi));
        let _ = writeln!(
            s,
            r##"<path class="whisker" d="M{cx:.1} {ylo:.1} V{yhi:.1} M{:.1} {ylo:.1} H{:.1} M{:.1} {yhi:.1} H{:.1}" stroke="black" fill="none"/>"##,
            cx - 8.0,
            cx + 8.0,
            cx - 8.0,
            cx + 8.0
        );
    }
    let _ = writeln!(
        s,
        r##"<text x="{cx:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
        y(r.max.unwrap_or(med)) - 6.0,
        esc(&fmt_value(med))
    );
    let _ = writeln!(
        s,
        r##"<text x="{cx:.1}" y="{:.1}" text-anchor="middle" font-weight="bold">{}</text>"##,
        top + plot_h + 18.0,
        esc(&r.topology)
    );
    let ratio = r
        .ratio_to_host
        .map(|x| format!("{x:.2} × {base}"))
        .unwrap_or_default();
    let _ = writeln!(
        s,
        r##"<text x="{cx:.1}" y="{:.1}" text-anchor="middle" fill="#555">{}</text>"##,
        top + plot_h + 34.0,
        esc(&ratio)
    );
}

/// Where the chart for `workload`/`placement` goes: next to the JSON file,
/// `<stem>-<workload>-<placement>.svg`.
pub(crate) fn chart_path(json: &Path, workload: Workload, placement: Placement) -> PathBuf {
    let stem = json
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "bench".into());
    json.with_file_name(format!(
        "{stem}-{}-{}.svg",
        workload.name(),
        placement.name()
    ))
}

/// Every chart of a summary: (path, svg text).
pub fn charts(json: &Path, rows: &[Row], machine: &Machine) -> Vec<(PathBuf, String)> {
    let mut keys: Vec<(Workload, Placement)> =
        rows.iter().map(|r| (r.workload, r.placement)).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .map(|(w, p)| {
            let mine: Vec<&Row> = rows
                .iter()
                .filter(|r| r.workload == w && r.placement == p)
                .collect();
            (chart_path(json, w, p), chart(w, p, &mine, machine))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nice_axis_and_paths() {
        assert_eq!(nice_max(0.0), 1.0);
        assert_eq!(nice_max(7.3), 10.0);
        assert_eq!(nice_max(42_000.0), 50_000.0);
        assert_eq!(nice_max(1.9), 2.0);
        assert_eq!(
            chart_path(
                Path::new("out/b.json"),
                Workload::UdpStream,
                Placement::SameCpu
            ),
            PathBuf::from("out/b-udp-stream-same-cpu.svg")
        );
        assert_eq!(esc("a<b & \"c\""), "a&lt;b &amp; &quot;c&quot;");
    }
}
