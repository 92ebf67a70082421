//! Medians, spreads and each topology's ratio to `host` (per round, then the median of the
//! ratios, so a slow moment of the machine that hits one round hits all paths alike).

use serde::Serialize;

use crate::model::Sample;
use crate::spec::{Placement, Workload};

/// The median of `v` (mean of the middle two for an even count); `None` when empty.
pub fn median(v: &[f64]) -> Option<f64> {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if s.is_empty() {
        return None;
    }
    s.sort_by(|a, b| a.total_cmp(b));
    let n = s.len();
    Some(if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    })
}

/// The spread of a row: (max − min) / 2 around the median, in percent of the median. The
/// table (`±x%`), the JSON summary and the CSV all use this one figure.
pub fn spread_pct(median: Option<f64>, min: Option<f64>, max: Option<f64>) -> Option<f64> {
    match (median, min, max) {
        (Some(m), Some(lo), Some(hi)) if m > 0.0 => Some((hi - lo) / 2.0 / m * 100.0),
        _ => None,
    }
}

/// One row of the summary: a topology × workload × placement over all rounds.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub topology: String,
    pub workload: Workload,
    pub placement: Placement,
    pub unit: String,
    pub rounds: usize,
    pub failed_rounds: usize,
    pub median: Option<f64>,
    pub min: Option<f64>,
    pub max: Option<f64>,
    /// Median over rounds of (this topology's figure / the baseline's figure in the same
    /// round); the baseline is `host`, or the first topology when `host` did not run
    /// ([`baseline`]).
    pub ratio_to_host: Option<f64>,
    /// The spread the table prints as `±x%`: half the min–max range around the median, in
    /// percent of the median ([`spread_pct`]).
    pub spread_pct: Option<f64>,
    /// Median CPU cost in the workload's CPU unit.
    pub cpu_per_unit: Option<f64>,
    pub cpu_unit: String,
    /// udp-stream: median loss fraction.
    pub loss: Option<f64>,
    /// ping: median p99 latency (µs).
    pub p99_us: Option<f64>,
    /// `--bpf-stats`: median nanoseconds and runs of nsfast's BPF programs per unit of work
    /// (per transaction, or per GB for streams).
    pub bpf_ns_per_unit: Option<f64>,
    pub bpf_runs_per_unit: Option<f64>,
    /// The first error seen, if any round failed.
    pub error: Option<String>,
}

/// The topology ratios are taken against: `host` when it ran, else the first one that ran
/// (e.g. `vsock` in a `vsock,vsock-relay,vsock-socat` run).
pub fn baseline(topologies: &[String]) -> &str {
    if topologies.iter().any(|t| t == "host") {
        "host"
    } else {
        topologies.first().map(String::as_str).unwrap_or("host")
    }
}

/// Summarises samples into rows, ordered by placement, workload, then topology run order.
pub fn summarize(samples: &[Sample], topologies: &[String]) -> Vec<Row> {
    let base = baseline(topologies);
    let mut keys: Vec<(Placement, Workload)> =
        samples.iter().map(|s| (s.placement, s.workload)).collect();
    keys.sort();
    keys.dedup();
    let mut rows = Vec::new();
    for (p, w) in keys {
        for t in topologies {
            let mine: Vec<&Sample> = samples
                .iter()
                .filter(|s| s.placement == p && s.workload == w && &s.topology == t)
                .collect();
            if mine.is_empty() {
                continue;
            }
            let vals: Vec<f64> = mine.iter().filter_map(|s| s.value).collect();
            let ratios: Vec<f64> = mine
                .iter()
                .filter_map(|s| {
                    let host = samples.iter().find(|h| {
                        h.placement == p
                            && h.workload == w
                            && h.topology == base
                            && h.round == s.round
                    })?;
                    match (s.value, host.value) {
                        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
                        _ => None,
                    }
                })
                .collect();
            let m = median(&vals);
            let min = vals.iter().copied().reduce(f64::min);
            let max = vals.iter().copied().reduce(f64::max);
            let spread = spread_pct(m, min, max);
            // Only rounds with a figure count (an idle fast path's CPU and latency are the
            // ordinary path's).
            let counted = || mine.iter().filter(|s| s.value.is_some());
            let cpu: Vec<f64> = counted()
                .filter_map(|s| s.cpu.map(|c| c.per_unit))
                .collect();
            let loss: Vec<f64> = counted().filter_map(|s| s.loss).collect();
            let bpf_ns: Vec<f64> = counted()
                .filter_map(|s| s.bpf.as_ref().map(|b| b.ns_per_unit))
                .collect();
            let bpf_runs: Vec<f64> = counted()
                .filter_map(|s| s.bpf.as_ref().map(|b| b.runs_per_unit))
                .collect();
            let p99: Vec<f64> = counted()
                .filter_map(|s| s.client.as_ref()?.latency_us.map(|l| l.p99))
                .collect();
            rows.push(Row {
                topology: t.clone(),
                workload: w,
                placement: p,
                unit: w.unit().into(),
                rounds: vals.len(),
                failed_rounds: mine.len() - vals.len(),
                median: m,
                min,
                max,
                ratio_to_host: median(&ratios),
                spread_pct: spread,
                cpu_per_unit: median(&cpu),
                cpu_unit: w.cpu_unit().into(),
                loss: median(&loss),
                p99_us: median(&p99),
                bpf_ns_per_unit: median(&bpf_ns),
                bpf_runs_per_unit: median(&bpf_runs),
                error: mine.iter().find_map(|s| s.error.clone()),
            });
        }
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(&[f64::NAN, 1.0]), Some(1.0));
    }

    #[test]
    fn spread_is_half_the_range_in_percent_of_the_median() {
        assert_eq!(spread_pct(Some(100.0), Some(90.0), Some(110.0)), Some(10.0));
        assert_eq!(spread_pct(Some(0.0), Some(0.0), Some(1.0)), None);
        assert_eq!(spread_pct(None, Some(1.0), Some(2.0)), None);
    }

    #[test]
    fn baseline_is_host_else_the_first_topology() {
        let t = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(baseline(&t(&["veth", "host"])), "host");
        assert_eq!(
            baseline(&t(&["vsock", "vsock-relay", "vsock-socat"])),
            "vsock"
        );
        assert_eq!(baseline(&[]), "host");
    }
}
