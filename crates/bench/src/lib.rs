//! `nsfast bench`: every path side by side, in one run, as tables, JSON and charts.
//!
//! Module map:
//! - [`spec`]       — workloads, placements, sizes and the run configuration; argument parsing.
//! - [`load`]       — the built-in load generator: rr, crr, stream, udp-stream, ping (client + server).
//! - [`worker`]     — the worker process (`nsfast bench-worker SPEC`): one side of one workload.
//! - [`built`]      — what a topology build needs and makes (the leaf its adapters share).
//! - [`topology`]   — host / veth / routed / sockmap (+ the registration point for later paths).
//! - [`proc`]       — start workers in a namespace + cgroup, pinned; kill-on-drop guards; signals.
//! - [`model`]      — the data a run produces: samples, CPU cost, skips, machine, cross-checks, outcome.
//! - [`runner`]     — warm-up, interleaved rounds, samples.
//! - `cputime`      — CPU accounting around one measurement (cgroups, softirq, ksoftirqd).
//! - [`stats`]      — medians, ratios to `host`, spread.
//! - [`report`]     — terminal table, JSON document, machine description.
//! - [`svg`]        — one bar chart per workload and placement, with min–max whiskers.
//! - [`export`]     — CSV, HdrHistogram `.hgrm` latency distributions, where a run's files go.
//! - [`evidence`]   — the fast path's own counters around every sample ("fast path idle").
//! - [`crosscheck`] — run sockperf and iperf3 on the same topology and compare.
//! - [`sockmap_hook`] — where the `sockmap` topology attaches the shortcut (`nsfast_lab::shortcut`).
//! - [`rootless_hook`] — the `slirp4netns`, `pasta` and `vpnrelay` topologies
//!   (`nsfast_lab::rootless`).

#![forbid(unsafe_code)]

pub mod bpfstats;
pub mod built;
pub(crate) mod cputime;
pub mod crosscheck;
pub mod evidence;
pub mod export;
pub mod floor;
pub mod load;
pub mod model;
pub mod proc;
pub mod report;
pub mod rootless_hook;
pub mod runner;
pub mod sockmap_hook;
pub mod spec;
pub mod stats;
pub mod svg;
pub mod topology;
pub mod vsock_hook;
pub mod worker;

/// Errors of a benchmark run; each names the value, process or topology involved.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A command-line value is not valid.
    #[error("invalid value {value:?} for {flag}: expected {valid}")]
    BadArg {
        flag: &'static str,
        value: String,
        valid: String,
    },
    /// `--placement cross-cpu` on a machine (or affinity mask) with one CPU.
    #[error("placement cross-cpu needs two CPUs, but this process may only run on CPU {0}")]
    CrossCpuNeedsTwo(usize),
    /// The affinity mask is empty.
    #[error("this process may run on no CPU at all (sched_getaffinity returned an empty set)")]
    NoCpus,
    /// The benchmark needs root (namespaces, cgroups).
    #[error(
        "nsfast bench needs root (it creates network namespaces and cgroups); run it with sudo"
    )]
    NotRoot,
    /// Every selected topology was skipped, or `host` was.
    #[error("{0}")]
    NothingToRun(String),
    #[error("start {what}: {source}")]
    Spawn {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{what} did not finish within {secs:.1} s; it was killed")]
    Timeout { what: String, secs: f64 },
    #[error("{what} failed: {detail}")]
    Worker { what: String, detail: String },
    #[error("interrupted by {0}; everything the run created was removed")]
    Interrupted(String),
    #[error(transparent)]
    Topology(#[from] topology::TopologyError),
    #[error(transparent)]
    Cgroup(#[from] nsfast_sys::cgroup::CgroupError),
    #[error("write {path}: {source}")]
    Write {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
}
