//! Exports besides the table and the JSON document: CSV (`--csv`), HdrHistogram percentile
//! distributions (`--hgrm-dir`), and where the files of a run go ([`Targets`]).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use hdrhistogram::Histogram;

use crate::model::{Outcome, Sample};
use crate::spec::{Placement, Workload};
use crate::stats::{baseline, Row};

/// The CSV header: one line per sample (`kind` = `sample`, one round) and one per summary
/// figure (`kind` = `median`, over the rounds, with the table's spread).
pub const CSV_HEADER: &str =
    "kind,round,topology,workload,placement,value,unit,spread_pct,ratio,error";

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

fn opt(v: Option<f64>) -> String {
    v.map(|x| x.to_string()).unwrap_or_default()
}

/// The CSV export: every sample (its ratio is to the baseline's figure in the same round),
/// then every row of `rows`, the outcome's summary (median, spread as in the table, median of
/// the ratios).
pub fn csv(outcome: &Outcome, rows: &[Row]) -> String {
    let base = baseline(&outcome.topologies);
    let mut out = String::new();
    let _ = writeln!(out, "{CSV_HEADER}");
    let ratio = |s: &Sample| {
        let b = outcome.samples.iter().find(|h| {
            h.topology == base
                && h.workload == s.workload
                && h.placement == s.placement
                && h.round == s.round
        })?;
        match (s.value, b.value) {
            (Some(a), Some(b)) if b > 0.0 => Some(a / b),
            _ => None,
        }
    };
    for s in &outcome.samples {
        let _ = writeln!(
            out,
            "sample,{},{},{},{},{},{},,{},{}",
            s.round,
            csv_field(&s.topology),
            s.workload.name(),
            s.placement.name(),
            opt(s.value),
            csv_field(&s.unit),
            opt(ratio(s)),
            csv_field(s.error.as_deref().unwrap_or_default()),
        );
    }
    for s in &outcome.samples {
        let Some(b) = &s.bpf else { continue };
        let per = s.workload.work_unit();
        for (kind, v, unit) in [
            ("bpf_ns", b.ns_per_unit, "ns"),
            ("bpf_runs", b.runs_per_unit, "runs"),
        ] {
            let _ = writeln!(
                out,
                "{kind},{},{},{},{},{v},{unit}/{per},,,",
                s.round,
                csv_field(&s.topology),
                s.workload.name(),
                s.placement.name(),
            );
        }
    }
    for r in rows {
        let _ = writeln!(
            out,
            "median,,{},{},{},{},{},{},{},{}",
            csv_field(&r.topology),
            r.workload.name(),
            r.placement.name(),
            opt(r.median),
            csv_field(&r.unit),
            opt(r.spread_pct),
            opt(r.ratio_to_host),
            csv_field(r.error.as_deref().unwrap_or_default()),
        );
    }
    out
}

/// The bounds every latency histogram of the load generator has (nanoseconds).
fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("static histogram bounds are valid")
}

/// One latency distribution per topology × workload × placement: the histograms of its
/// rounds that have a figure, merged. File name `TOPOLOGY-WORKLOAD-PLACEMENT.hgrm`, text in
/// HdrHistogram's percentile distribution format, values in microseconds.
pub fn hgrm(outcome: &Outcome) -> Vec<(String, String)> {
    let mut keys: Vec<(Placement, Workload, &str)> = Vec::new();
    for s in &outcome.samples {
        let k = (s.placement, s.workload, s.topology.as_str());
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    let mut out = Vec::new();
    for (p, w, t) in keys {
        let mut h = new_histogram();
        for s in outcome
            .samples
            .iter()
            .filter(|s| s.placement == p && s.workload == w && s.topology == t && s.value.is_some())
        {
            for [v, n] in s.client.iter().flat_map(|c| &c.latency_ns_recorded) {
                // Values come from a histogram with the same bounds; clamp stray ones.
                h.saturating_record_n(*v, *n);
            }
        }
        if !h.is_empty() {
            out.push((
                format!("{t}-{}-{}.hgrm", w.name(), p.name()),
                percentile_distribution(&h, 1000.0),
            ));
        }
    }
    out
}

/// Drops the recorded latency histograms from the samples (after [`hgrm`]): the JSON document
/// keeps their percentiles, not every bucket.
pub fn drop_histograms(outcome: &mut Outcome) {
    for c in outcome.samples.iter_mut().filter_map(|s| s.client.as_mut()) {
        c.latency_ns_recorded = Vec::new();
    }
}

/// HdrHistogram's standard percentile distribution text (`outputPercentileDistribution` with
/// 5 ticks per half distance), values divided by `scale` (1000: nanoseconds → µs).
pub fn percentile_distribution(h: &Histogram<u64>, scale: f64) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        "{:>12} {:>14} {:>10} {:>14}\n\n",
        "Value", "Percentile", "TotalCount", "1/(1-Percentile)"
    );
    let mut total = 0u64;
    for v in h.iter_quantiles(5) {
        total += v.count_since_last_iteration();
        let value = v.value_iterated_to() as f64 / scale;
        let q = v.quantile_iterated_to();
        if q < 1.0 {
            let _ = writeln!(
                out,
                "{value:12.3} {q:2.12} {total:10} {:14.2}",
                1.0 / (1.0 - q)
            );
        } else {
            let _ = writeln!(out, "{value:12.3} {q:2.12} {total:10}");
        }
    }
    // SubBuckets: 2^ceil(log2(2 × 10^sigfig)), as HdrHistogram sizes them.
    let sub_buckets = (2 * 10u64.pow(u32::from(h.sigfig()))).next_power_of_two();
    let _ = writeln!(
        out,
        "#[Mean    = {:12.3}, StdDeviation   = {:12.3}]",
        h.mean() / scale,
        h.stdev() / scale
    );
    let _ = writeln!(
        out,
        "#[Max     = {:12.3}, Total count    = {:12}]",
        h.max() as f64 / scale,
        h.len()
    );
    let _ = writeln!(
        out,
        "#[Buckets = {:12}, SubBuckets     = {:12}]",
        h.buckets(),
        sub_buckets
    );
    out
}

/// Where a run's files go.
#[derive(Debug, Clone, Default)]
pub struct Targets {
    /// The JSON document's file (`None`: not written, or written to stdout).
    pub json_file: Option<PathBuf>,
    /// Directory of the SVG charts (`None`: next to `json_file`, none without one).
    pub svg_dir: Option<PathBuf>,
    pub no_charts: bool,
    pub csv: Option<PathBuf>,
    pub hgrm_dir: Option<PathBuf>,
}

impl Targets {
    /// The charts' "JSON path" for [`crate::svg::charts`], which names each chart
    /// `STEM-WORKLOAD-PLACEMENT.svg` beside it; `None`: no charts.
    pub fn chart_base(&self) -> Option<PathBuf> {
        if self.no_charts {
            return None;
        }
        let stem = self
            .json_file
            .as_deref()
            .and_then(Path::file_name)
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("bench.json"));
        match (&self.svg_dir, &self.json_file) {
            (Some(d), _) => Some(d.join(stem)),
            (None, Some(j)) => Some(j.clone()),
            (None, None) => None,
        }
    }

    /// Every file but the JSON document: (path, text); `rows` is the outcome's summary.
    pub fn files(&self, outcome: &Outcome, rows: &[Row]) -> Vec<(PathBuf, String)> {
        let mut files = Vec::new();
        if let Some(base) = self.chart_base() {
            files.extend(crate::svg::charts(&base, rows, &outcome.machine));
        }
        if let Some(p) = &self.csv {
            files.push((p.clone(), csv(outcome, rows)));
        }
        if let Some(d) = &self.hgrm_dir {
            files.extend(hgrm(outcome).into_iter().map(|(n, t)| (d.join(n), t)));
        }
        files
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_distribution_is_hdrhistograms_format() {
        let mut h = new_histogram();
        for v in [25_000u64, 50_000, 75_000] {
            h.record(v).unwrap();
        }
        let text = percentile_distribution(&h, 1000.0);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "       Value     Percentile TotalCount 1/(1-Percentile)"
        );
        assert_eq!(lines[1], "");
        assert_eq!(
            lines[2],
            "      25.007 0.000000000000          1           1.00"
        );
        // The last value line is the 100th percentile, without the 1/(1-p) column.
        let last = lines[lines.len() - 4];
        assert_eq!(last, "      75.007 1.000000000000          3");
        assert_eq!(
            lines[lines.len() - 3],
            "#[Mean    =       49.992, StdDeviation   =       20.403]"
        );
        assert_eq!(
            lines[lines.len() - 2],
            "#[Max     =       75.007, Total count    =            3]"
        );
        assert!(lines[lines.len() - 1].ends_with("SubBuckets     =         2048]"));
    }

    #[test]
    fn csv_quotes_what_needs_quoting() {
        assert_eq!(csv_field("host"), "host");
        assert_eq!(csv_field("a,b \"c\""), "\"a,b \"\"c\"\"\"");
    }

    #[test]
    fn charts_go_next_to_the_json_file_unless_told() {
        let mut t = Targets {
            json_file: Some("out/b.json".into()),
            ..Targets::default()
        };
        assert_eq!(t.chart_base(), Some(PathBuf::from("out/b.json")));
        t.svg_dir = Some("/tmp/svg".into());
        assert_eq!(t.chart_base(), Some(PathBuf::from("/tmp/svg/b.json")));
        t.json_file = None;
        assert_eq!(t.chart_base(), Some(PathBuf::from("/tmp/svg/bench.json")));
        t.no_charts = true;
        assert_eq!(t.chart_base(), None);
        assert_eq!(Targets::default().chart_base(), None);
    }
}
