//! The bench's data model: what a run measures and reports (samples, CPU cost, skips, the
//! machine, cross-checks, the whole outcome). A leaf: it imports the vocabulary below it
//! (spec, load, evidence) and nothing from the modules that produce or print it (runner,
//! crosscheck, stats, report), so those import it and not each other.

use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::evidence::Evidence;
use crate::load::{ClientResult, ServerCounts};
use crate::spec::{Config, Placement, Workload};

/// CPU time one measurement consumed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct CpuCost {
    /// cgroup `usage_usec` delta of the client side.
    pub client_usec: u64,
    /// cgroup `usage_usec` delta of the server side.
    pub server_usec: u64,
    /// softirq time on the pinned CPUs (from /proc/stat, USER_HZ resolution). Without
    /// CONFIG_IRQ_TIME_ACCOUNTING most of it is already inside the cgroup figures.
    pub softirq_usec: u64,
    /// CPU time of ksoftirqd on the pinned CPUs: softirq work charged to no cgroup of ours.
    pub ksoftirqd_usec: u64,
    /// What `per_unit` counts: client + server + ksoftirqd (+ softirq when the kernel
    /// accounts IRQ time apart from tasks), normalised: µs per transaction or seconds per GB.
    pub per_unit: f64,
}

/// One measurement of one topology × workload × placement in one round.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Sample {
    pub round: u32,
    pub topology: String,
    pub workload: Workload,
    pub placement: Placement,
    /// `None`: unpinned.
    pub client_cpu: Option<usize>,
    pub server_cpu: Option<usize>,
    /// The headline figure in the workload's unit (NaN-free: absent on error).
    pub value: Option<f64>,
    pub unit: String,
    pub client: Option<ClientResult>,
    pub server: Option<ServerCounts>,
    /// udp-stream: fraction of datagrams sent that the server did not receive.
    pub loss: Option<f64>,
    pub cpu: Option<CpuCost>,
    /// What the topology's fast path counted during the sample (`None`: the topology claims
    /// no fast path, or not for this workload). A fast path that counted nothing makes the
    /// sample failed ("fast path idle"), its value absent.
    #[serde(default)]
    pub fast_path: Option<Evidence>,
    /// nsfast's BPF programs during the sample, per unit of work (`--bpf-stats`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bpf: Option<crate::bpfstats::BpfCost>,
    pub error: Option<String>,
}

/// A topology that did not run, and why.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Skipped {
    pub topology: String,
    pub reason: String,
}

/// Everything a run produced.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    pub machine: Machine,
    pub config: Config,
    /// Topologies that ran, in order.
    pub topologies: Vec<String>,
    pub skipped: Vec<Skipped>,
    pub notes: Vec<String>,
    pub samples: Vec<Sample>,
    pub cross_check: Vec<CrossCheck>,
}

/// The machine and kernel a run was made on.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Machine {
    /// UTC time the run finished, `YYYY-MM-DDTHH:MM:SSZ`.
    pub date: String,
    pub kernel: String,
    pub cpu_model: String,
    pub cpus: usize,
    pub mem_total_kib: u64,
    pub hostname: String,
    pub nsfast_version: String,
}

impl Machine {
    pub fn current() -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        Self {
            date: utc_now(),
            kernel: nsfast_sys::kernel::release(),
            cpu_model: cpuinfo
                .lines()
                .find_map(|l| l.strip_prefix("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
                .unwrap_or_default(),
            cpus: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            mem_total_kib: meminfo
                .lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
                .unwrap_or(0),
            hostname: nix::unistd::gethostname()
                .ok()
                .and_then(|h| h.into_string().ok())
                .unwrap_or_default(),
            nsfast_version: env!("CARGO_PKG_VERSION").into(),
        }
    }
}

/// The current time in UTC as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn utc_now() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    format_utc(secs)
}

/// Formats seconds since the epoch as `YYYY-MM-DDTHH:MM:SSZ` (civil-from-days).
pub fn format_utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// One comparison.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CrossCheck {
    pub topology: String,
    pub placement: Placement,
    pub tool: String,
    /// What is compared, e.g. "TCP ping-pong p50 RTT, 14 B".
    pub metric: String,
    pub unit: String,
    /// Median of the tool's runs.
    pub tool_value: Option<f64>,
    /// Median of our runs.
    pub ours: Option<f64>,
    /// Every run of the tool, alternating with ours (tool, ours, tool, ours, ...).
    pub tool_runs: Vec<f64>,
    pub our_runs: Vec<f64>,
    /// (ours - tool) / tool, in percent.
    pub diff_pct: Option<f64>,
    pub agree: Option<bool>,
    pub note: Option<String>,
}
