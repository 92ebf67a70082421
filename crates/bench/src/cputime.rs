//! CPU accounting around one measurement: the two cgroups' `usage_usec`, the pinned CPUs'
//! softirq time (/proc/stat) and their ksoftirqd threads' CPU time.

use nsfast_sys::cgroup::Cgroup;

use crate::model::CpuCost;

/// Whether the kernel accounts softirq time apart from tasks (cached; assumed not when the
/// kernel config cannot be read, the common tick-based default).
pub fn irq_time_accounting() -> bool {
    static V: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *V.get_or_init(|| nsfast_sys::procstat::irq_time_accounting().unwrap_or(false))
}

fn ksoftirqd_pids() -> &'static Vec<Option<u32>> {
    static V: std::sync::OnceLock<Vec<Option<u32>>> = std::sync::OnceLock::new();
    V.get_or_init(|| {
        let n = nsfast_sys::procstat::per_cpu_times()
            .map(|v| v.len())
            .unwrap_or(0);
        (0..n).map(nsfast_sys::procstat::ksoftirqd_pid).collect()
    })
}

pub(crate) struct CpuSnapshot {
    client: u64,
    server: u64,
    stat: Vec<Option<nsfast_sys::procstat::CpuTimes>>,
    ksoftirqd: Vec<u64>,
}

impl CpuSnapshot {
    pub(crate) fn take(client: &Cgroup, server: &Cgroup) -> Self {
        Self {
            client: client.cpu_usage_usec().unwrap_or(0),
            server: server.cpu_usage_usec().unwrap_or(0),
            stat: nsfast_sys::procstat::per_cpu_times().unwrap_or_default(),
            ksoftirqd: ksoftirqd_pids()
                .iter()
                .map(|p| {
                    p.and_then(|p| nsfast_sys::procstat::process_cpu_usec(p).ok())
                        .unwrap_or(0)
                })
                .collect(),
        }
    }

    pub(crate) fn since(&self, before: &CpuSnapshot, cpus: &[usize]) -> CpuCost {
        let hz = nsfast_sys::procstat::user_hz();
        let mut soft_ticks = 0;
        let mut ksoft = 0;
        for &c in cpus {
            if let (Some(a), Some(b)) = (self.ksoftirqd.get(c), before.ksoftirqd.get(c)) {
                ksoft += a.saturating_sub(*b);
            }
            if let (Some(Some(a)), Some(Some(b))) = (self.stat.get(c), before.stat.get(c)) {
                soft_ticks += a.since(b).softirq;
            }
        }
        CpuCost {
            client_usec: self.client.saturating_sub(before.client),
            server_usec: self.server.saturating_sub(before.server),
            softirq_usec: soft_ticks * 1_000_000 / hz,
            ksoftirqd_usec: ksoft,
            per_unit: 0.0,
        }
    }
}
