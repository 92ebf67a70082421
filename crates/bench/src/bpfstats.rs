//! What nsfast's BPF programs cost per transaction (or per GB), from the kernel's own
//! statistics: `BPF_ENABLE_STATS` (what `sysctl kernel.bpf_stats_enabled=1` turns on) makes the
//! kernel count each program's runs and run time; a snapshot of every loaded program before
//! and after a measurement gives what ran during it.
//!
//! The statistics cost each program run two clock reads, so they are on only with
//! `nsfast bench --bpf-stats`, and the figures of such a run carry that cost. A program that
//! runs for every socket of the host (the sockmap shortcut's read tracepoint) is counted in
//! every topology's measurement while it is loaded: what a bystander pays.

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;

use serde::{Deserialize, Serialize};

/// Keeps the statistics on while held (the kernel turns them off when the last holder closes).
#[derive(Debug)]
pub struct StatsOn(#[allow(dead_code)] OwnedFd);

/// Turns the kernel's BPF run-time statistics on until the result is dropped.
pub fn enable() -> Result<StatsOn, String> {
    aya::sys::enable_stats(aya::sys::Stats::RunTime)
        .map(StatsOn)
        .map_err(|e| format!("BPF_ENABLE_STATS: {e}"))
}

/// Whether a program is nsfast's (`nsf_*`: sockmap and pod programs, `nsr_*`: relay).
fn ours(name: &str) -> bool {
    name.starts_with("nsf_") || name.starts_with("nsr_")
}

/// Run time and count of each of nsfast's loaded programs, by program id.
#[derive(Debug, Clone, Default)]
pub struct Snapshot(BTreeMap<u32, (String, u64, u64)>);

/// The programs loaded now.
pub fn snapshot() -> Snapshot {
    let mut m = BTreeMap::new();
    for p in aya::programs::loaded_programs().flatten() {
        let Some(name) = p.name_as_str() else {
            continue;
        };
        if ours(name) {
            let ns = u64::try_from(p.run_time().as_nanos()).unwrap_or(u64::MAX);
            m.insert(p.id(), (name.to_string(), ns, p.run_count()));
        }
    }
    Snapshot(m)
}

/// One program's share of a measurement, per unit of work.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProgramCost {
    pub name: String,
    /// Nanoseconds of run time per transaction (per GB for streams).
    pub ns_per_unit: f64,
    /// Runs per transaction (per GB for streams).
    pub runs_per_unit: f64,
}

/// nsfast's programs during one measurement, per unit of work.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BpfCost {
    pub ns_per_unit: f64,
    pub runs_per_unit: f64,
    /// By program name (instances of one program summed), most expensive first.
    pub programs: Vec<ProgramCost>,
}

/// What ran between `before` and `after`, divided by `units` (transactions, or GB); `None`
/// without units. Programs loaded in between count from zero; ones gone are left out.
pub fn cost(before: &Snapshot, after: &Snapshot, units: f64) -> Option<BpfCost> {
    if units <= 0.0 {
        return None;
    }
    let mut by_name: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
    for (id, (name, ns, cnt)) in &after.0 {
        let (ns0, cnt0) = before.0.get(id).map(|b| (b.1, b.2)).unwrap_or((0, 0));
        let runs = cnt.saturating_sub(cnt0);
        if runs == 0 {
            continue;
        }
        let e = by_name.entry(name).or_default();
        e.0 += ns.saturating_sub(ns0);
        e.1 += runs;
    }
    let mut programs: Vec<ProgramCost> = by_name
        .into_iter()
        .map(|(name, (ns, runs))| ProgramCost {
            name: name.to_string(),
            ns_per_unit: ns as f64 / units,
            runs_per_unit: runs as f64 / units,
        })
        .collect();
    programs.sort_by(|a, b| b.ns_per_unit.total_cmp(&a.ns_per_unit));
    Some(BpfCost {
        ns_per_unit: programs.iter().map(|p| p.ns_per_unit).sum(),
        runs_per_unit: programs.iter().map(|p| p.runs_per_unit).sum(),
        programs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(v: &[(u32, &str, u64, u64)]) -> Snapshot {
        Snapshot(
            v.iter()
                .map(|(id, n, ns, c)| (*id, (n.to_string(), *ns, *c)))
                .collect(),
        )
    }

    #[test]
    fn cost_sums_instances_by_name_and_skips_idle_and_gone_programs() {
        let before = snap(&[
            (1, "nsf_sk_msg", 1000, 10),
            (2, "nsf_sk_msg", 0, 0),
            (3, "nsf_sockops", 500, 5),
            (4, "nsf_gone", 9, 9),
        ]);
        let after = snap(&[
            (1, "nsf_sk_msg", 3000, 30),
            (2, "nsf_sk_msg", 1000, 10),
            (3, "nsf_sockops", 500, 5),
            (5, "nsf_rx_read_tp", 400, 20),
        ]);
        let c = cost(&before, &after, 10.0).unwrap();
        assert_eq!(
            c.programs,
            vec![
                ProgramCost {
                    name: "nsf_sk_msg".into(),
                    ns_per_unit: 300.0,
                    runs_per_unit: 3.0
                },
                ProgramCost {
                    name: "nsf_rx_read_tp".into(),
                    ns_per_unit: 40.0,
                    runs_per_unit: 2.0
                },
            ]
        );
        assert_eq!((c.ns_per_unit, c.runs_per_unit), (340.0, 5.0));
        assert_eq!(cost(&before, &after, 0.0), None);
    }
}
