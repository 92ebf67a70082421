//! Output: the machine description, the terminal table and the JSON document.

use std::fmt::Write as _;

use serde::Serialize;

use crate::cputime::irq_time_accounting;
use crate::crosscheck::AGREEMENT;
pub use crate::model::{format_utc, utc_now, Machine};
use crate::model::{CrossCheck, Outcome};
use crate::stats::Row;

/// The JSON document `--json` writes.
#[derive(Debug, Serialize)]
pub struct Document<'a> {
    /// `nsfast_sys::out::SCHEMA_VERSION` (docs/json.md).
    pub schema_version: u32,
    pub tool: &'static str,
    #[serde(flatten)]
    pub outcome: &'a Outcome,
    /// `stats::summarize` of the outcome, computed once per run and shared with the table,
    /// the charts and the CSV.
    pub summary: &'a [Row],
}

impl<'a> Document<'a> {
    pub fn new(outcome: &'a Outcome, summary: &'a [Row]) -> Self {
        Self {
            schema_version: nsfast_sys::out::SCHEMA_VERSION,
            tool: "nsfast bench",
            outcome,
            summary,
        }
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("document serializes")
    }
}

/// Formats a figure with a sensible number of digits and thousands separators.
pub fn fmt_value(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else if v >= 1000.0 {
        let n = v.round() as u64;
        let s = n.to_string();
        let mut out = String::new();
        for (i, c) in s.chars().enumerate() {
            if i > 0 && (s.len() - i).is_multiple_of(3) {
                out.push(',');
            }
            out.push(c);
        }
        out
    } else if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// The terminal table: one row per topology × workload, grouped by placement; `rows` is the
/// outcome's summary (`stats::summarize`).
pub fn table(outcome: &Outcome, rows: &[Row]) -> String {
    let base = crate::stats::baseline(&outcome.topologies);
    let c = &outcome.config;
    let mut out = String::new();
    let m = &outcome.machine;
    let _ = writeln!(
        out,
        "nsfast bench — {} — kernel {} — {} CPUs — {} rounds × {:.1} s (medians; ratio = median over rounds of topology/{base})",
        m.date,
        m.kernel,
        m.cpus,
        c.rounds,
        c.duration.as_secs_f64()
    );
    let mut placements: Vec<_> = rows.iter().map(|r| r.placement).collect();
    placements.dedup();
    for p in placements {
        let cpus = outcome
            .samples
            .iter()
            .find(|s| s.placement == p)
            .map(|s| match (s.client_cpu, s.server_cpu) {
                (Some(c), Some(v)) => format!("client CPU {c}, server CPU {v}"),
                _ => "client and server unpinned".to_string(),
            })
            .unwrap_or_default();
        let _ = writeln!(out, "\nplacement {p} ({cpus})");
        // The topology column fits the longest name (cni-ptp-remote).
        let tw = rows
            .iter()
            .map(|r| r.topology.len())
            .max()
            .unwrap_or(0)
            .max(11);
        let _ = writeln!(
            out,
            "{:<11} {:<tw$} {:>12} {:<7} {:>7} {:>8}  {:<22} {:>10}  notes",
            "workload",
            "topology",
            "median",
            "unit",
            format!("× {base}"),
            "spread",
            "min – max",
            "CPU cost",
        );
        let mut last_w = None;
        for r in rows.iter().filter(|r| r.placement == p) {
            let w = if last_w == Some(r.workload) {
                String::new()
            } else {
                r.workload.name().to_string()
            };
            last_w = Some(r.workload);
            write_row(&mut out, r, &w, tw);
        }
    }
    let _ = writeln!(
        out,
        "\nping is latency (lower is better, × {base} > 1 is slower); the others are rates. \
CPU cost = client + server cgroup CPU time + ksoftirqd time on the pinned CPUs{}, per transaction (µs/tx) or per GB (s/GB).",
        if irq_time_accounting() { " + softirq time (IRQ time accounted apart)" } else { " (softirq run in task context is inside the cgroup time: no CONFIG_IRQ_TIME_ACCOUNTING)" }
    );
    if !outcome.cross_check.is_empty() {
        out.push_str(&cross_check_table(&outcome.cross_check));
    }
    for s in &outcome.skipped {
        let _ = writeln!(out, "skipped {}: {}", s.topology, s.reason);
    }
    out
}

/// One row of the terminal table; `w` is the workload column (empty under the first row of a
/// workload), `tw` the topology column's width.
fn write_row(out: &mut String, r: &Row, w: &str, tw: usize) {
    let f = |v: Option<f64>| v.map(fmt_value).unwrap_or_else(|| "–".into());
    let ratio = r
        .ratio_to_host
        .map(|x| format!("{x:.2}"))
        .unwrap_or_else(|| "–".into());
    let spread = r
        .spread_pct
        .map(|x| format!("±{x:.1}%"))
        .unwrap_or_else(|| "–".into());
    let cpu = r
        .cpu_per_unit
        .map(|x| format!("{} {}", fmt_value(x), short_cpu_unit(&r.cpu_unit)))
        .unwrap_or_else(|| "–".into());
    let mut notes = Vec::new();
    if let Some(l) = r.loss {
        notes.push(format!("loss {:.1}%", l * 100.0));
    }
    if let Some(p99) = r.p99_us {
        if r.workload == crate::spec::Workload::Ping {
            notes.push(format!("p99 {} µs", fmt_value(p99)));
        }
    }
    if let (Some(ns), Some(runs)) = (r.bpf_ns_per_unit, r.bpf_runs_per_unit) {
        let per = r.workload.work_unit();
        notes.push(format!(
            "bpf {} ns/{per} ({} runs)",
            fmt_value(ns),
            fmt_value(runs)
        ));
    }
    if r.failed_rounds > 0 {
        notes.push(format!(
            "{} round(s) failed: {}",
            r.failed_rounds,
            r.error.clone().unwrap_or_default()
        ));
    }
    let _ = writeln!(
        out,
        "{:<11} {:<tw$} {:>12} {:<7} {:>7} {:>8}  {:<22} {:>10}  {}",
        w,
        r.topology,
        f(r.median),
        r.unit,
        ratio,
        spread,
        format!("{} – {}", f(r.min), f(r.max)),
        cpu,
        notes.join("; ")
    );
}

/// The cross-check table: tool figure, ours, difference.
pub fn cross_check_table(cc: &[CrossCheck]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\ncross-check (ours must be within {:.0}% on host and veth)",
        AGREEMENT * 100.0
    );
    let _ = writeln!(
        out,
        "{:<12} {:<9} {:<9} {:<48} {:>8} {:>8} {:>8}  {:<5}  runs (tool | ours)",
        "topology", "placement", "tool", "metric", "tool", "ours", "diff", "agree"
    );
    for c in cc {
        let f = |v: Option<f64>| v.map(fmt_value).unwrap_or_else(|| "–".into());
        let diff = c
            .diff_pct
            .map(|d| format!("{d:+.1}%"))
            .unwrap_or_else(|| "–".into());
        let agree = match (c.agree, &c.note) {
            (Some(true), _) => "yes".to_string(),
            (Some(false), _) => "NO".to_string(),
            (None, Some(n)) => n.clone(),
            (None, None) => "–".to_string(),
        };
        let runs = |v: &[f64]| {
            v.iter()
                .map(|x| fmt_value(*x))
                .collect::<Vec<_>>()
                .join(" ")
        };
        let _ = writeln!(
            out,
            "{:<12} {:<9} {:<9} {:<48} {:>8} {:>8} {:>8}  {:<5}  {} | {}",
            c.topology,
            c.placement.name(),
            c.tool,
            format!("{} ({})", c.metric, c.unit),
            f(c.tool_value),
            f(c.ours),
            diff,
            agree,
            runs(&c.tool_runs),
            runs(&c.our_runs)
        );
    }
    out
}

fn short_cpu_unit(u: &str) -> &str {
    u.strip_prefix("CPU ").unwrap_or(u)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_dates_and_values() {
        assert_eq!(format_utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(format_utc(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(format_utc(1_798_588_800), "2026-12-30T00:00:00Z");
        assert_eq!(fmt_value(61234.4), "61,234");
        assert_eq!(fmt_value(1234567.0), "1,234,567");
        assert_eq!(fmt_value(12.345), "12.3");
        assert_eq!(fmt_value(2.345), "2.35");
    }
}
