//! `/proc/stat` per-CPU times (user, system, softirq, ...) and `/proc/<pid>/stat` CPU time.

use std::fs;
use std::io;

/// Clock ticks per second for `/proc/stat` (USER_HZ).
pub fn user_hz() -> u64 {
    // SAFETY: sysconf only reads a configuration value.
    let v = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if v > 0 {
        v as u64
    } else {
        100
    }
}

/// One `cpuN` line of `/proc/stat`, in clock ticks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct CpuTimes {
    pub user: u64,
    pub nice: u64,
    pub system: u64,
    pub idle: u64,
    pub iowait: u64,
    pub irq: u64,
    pub softirq: u64,
    pub steal: u64,
}

impl CpuTimes {
    /// Field-wise difference `self - earlier` (saturating).
    pub fn since(&self, earlier: &CpuTimes) -> CpuTimes {
        CpuTimes {
            user: self.user.saturating_sub(earlier.user),
            nice: self.nice.saturating_sub(earlier.nice),
            system: self.system.saturating_sub(earlier.system),
            idle: self.idle.saturating_sub(earlier.idle),
            iowait: self.iowait.saturating_sub(earlier.iowait),
            irq: self.irq.saturating_sub(earlier.irq),
            softirq: self.softirq.saturating_sub(earlier.softirq),
            steal: self.steal.saturating_sub(earlier.steal),
        }
    }
}

/// Per-CPU times, indexed by CPU number (missing CPUs are `None`).
pub fn per_cpu_times() -> io::Result<Vec<Option<CpuTimes>>> {
    Ok(parse_per_cpu(&fs::read_to_string("/proc/stat")?))
}

/// Parses the `cpuN` lines of `/proc/stat` text (exposed for tests).
pub fn parse_per_cpu(text: &str) -> Vec<Option<CpuTimes>> {
    let mut out: Vec<Option<CpuTimes>> = Vec::new();
    for line in text.lines() {
        let mut it = line.split_whitespace();
        let Some(name) = it.next() else { continue };
        let Some(n) = name
            .strip_prefix("cpu")
            .and_then(|n| n.parse::<usize>().ok())
        else {
            continue;
        };
        let v: Vec<u64> = it.map(|x| x.parse().unwrap_or(0)).collect();
        let g = |i: usize| v.get(i).copied().unwrap_or(0);
        if out.len() <= n {
            out.resize(n + 1, None);
        }
        out[n] = Some(CpuTimes {
            user: g(0),
            nice: g(1),
            system: g(2),
            idle: g(3),
            iowait: g(4),
            irq: g(5),
            softirq: g(6),
            steal: g(7),
        });
    }
    out
}

/// User + system CPU time of process `pid` in microseconds, from `/proc/<pid>/stat`.
pub fn process_cpu_usec(pid: u32) -> io::Result<u64> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat"))?;
    parse_pid_stat_ticks(&text)
        .map(|t| t * 1_000_000 / user_hz())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "malformed /proc/PID/stat"))
}

/// utime + stime (ticks) from `/proc/<pid>/stat` text (exposed for tests).
pub fn parse_pid_stat_ticks(text: &str) -> Option<u64> {
    // The command name may contain spaces and parentheses: split after the last ')'.
    let rest = &text[text.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After ')': state(0) ppid(1) ... utime is field 14 overall → index 11 here, stime 12.
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// The PID of `ksoftirqd/<cpu>`, the thread that runs softirq work the interrupted task did
/// not finish (found by scanning `/proc/*/comm`).
pub fn ksoftirqd_pid(cpu: usize) -> Option<u32> {
    let want = format!("ksoftirqd/{cpu}");
    fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let comm = fs::read_to_string(e.path().join("comm")).ok()?;
        (comm.trim() == want).then_some(pid)
    })
}

/// Whether softirq time is accounted apart from tasks (CONFIG_IRQ_TIME_ACCOUNTING=y), from
/// `/proc/config.gz` or `/boot/config-$(uname -r)`; `None` when neither can be read.
pub fn irq_time_accounting() -> Option<bool> {
    let text = crate::kernel::config_text()?;
    Some(
        text.lines()
            .any(|l| l.trim() == "CONFIG_IRQ_TIME_ACCOUNTING=y"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_stat() {
        let t = "cpu  16785 0 6015 91417 334 0 101 10 0 0\n\
cpu0 7742 0 2580 46936 36 0 25 4 0 0\n\
cpu1 9042 0 3435 44480 298 0 75 6 0 0\nintr 1 2 3\nsoftirq 5 6 7\n";
        let v = parse_per_cpu(t);
        assert_eq!(v.len(), 2);
        assert_eq!(v[1].unwrap().softirq, 75);
        assert_eq!(v[0].unwrap().user, 7742);
        let d = v[1].unwrap().since(&v[0].unwrap());
        assert_eq!(d.softirq, 50);
        assert!(!per_cpu_times().unwrap().is_empty());
    }

    #[test]
    fn parses_pid_stat() {
        let t = "1234 (a b) c) S 1 1234 1234 0 -1 4194560 100 0 0 0 7 3 0 0 20 0 1 0 5 0 0";
        assert_eq!(parse_pid_stat_ticks(t), Some(10));
        assert!(process_cpu_usec(std::process::id()).is_ok());
    }
}
