//! Reads a guest's serial console: the markers /init prints (see `tests/vm/init.sh`), the
//! guest's dmesg, and kernel lines that mean trouble (WARN, BUG, Oops, panic).

use std::collections::BTreeMap;
use std::time::Duration;

/// Result of one test as the guest reported it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct TestResult {
    pub pass: bool,
    /// The rest of the marker line (`rc=1`, ...).
    pub detail: String,
    /// Wall time on the host between the start and end markers.
    pub secs: f64,
    /// The console lines between the start and end markers (the test's output, with any
    /// kernel messages that landed in between), judged by [`crate::checks::judge`].
    #[serde(skip)]
    pub output: Vec<String>,
}

/// Everything learnt from one guest's console.
#[derive(Debug, Default, serde::Serialize)]
pub struct GuestRun {
    /// Host time from QEMU start to the `NSFAST-INIT` line.
    pub init_after: Option<f64>,
    pub release: Option<String>,
    /// (module, loaded, detail).
    pub modules: Vec<(String, bool, String)>,
    pub results: BTreeMap<String, TestResult>,
    /// The test running now (started, not ended).
    pub current: Option<(String, f64)>,
    /// Its output so far.
    #[serde(skip)]
    current_output: Vec<String>,
    pub done: bool,
    #[serde(skip)]
    pub dmesg: Vec<String>,
    #[serde(skip)]
    in_dmesg: bool,
    /// Kernel WARN/BUG/Oops/panic lines (first line of each report).
    pub kernel_problems: Vec<String>,
    pub last_line: String,
}

/// Kernel console text that fails a run.
pub const BAD_KERNEL_PATTERNS: &[&str] = &[
    "------------[ cut here ]------------",
    "WARNING: CPU:",
    "BUG:",
    "kernel BUG at",
    "Oops:",
    "Kernel panic",
    "general protection fault",
    "UBSAN:",
    "KASAN:",
    "Call Trace:",
];

/// `[    1.234567] text` → `text`, for kernel lines (Debian kernels log with timestamps).
pub fn kernel_text(line: &str) -> Option<&str> {
    // The first timestamp in the line: a kernel message can land mid-line, after a test's
    // output that had no newline yet.
    line.match_indices('[').find_map(|(i, _)| {
        let (ts, text) = line[i + 1..].split_once(']')?;
        let (a, b) = ts.trim().split_once('.')?;
        let digits = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_digit());
        (digits(a) && digits(b)).then(|| text.trim_start())
    })
}

fn find_marker<'a>(line: &'a str, marker: &str) -> Option<&'a str> {
    line.find(marker).map(|i| line[i + marker.len()..].trim())
}

impl GuestRun {
    /// Feeds one console line seen `at` after QEMU started.
    pub fn feed(&mut self, line: &str, at: Duration) {
        let t = at.as_secs_f64();
        let line = line.trim_end();
        if !line.is_empty() {
            self.last_line = line.to_string();
        }
        if self.in_dmesg {
            if line.contains("NSFAST-DMESG-END") {
                self.in_dmesg = false;
            } else {
                self.check_kernel_line(line);
                self.dmesg.push(line.to_string());
            }
            return;
        }
        if let Some(rest) = find_marker(line, "NSFAST-INIT ") {
            self.init_after = Some(t);
            self.release = rest
                .split_whitespace()
                .find_map(|w| w.strip_prefix("release="))
                .map(str::to_string);
        } else if let Some(rest) = find_marker(line, "NSFAST-MODULE ") {
            let mut it = rest.splitn(3, ' ');
            let name = it.next().unwrap_or("").to_string();
            let ok = it.next() == Some("ok");
            self.modules
                .push((name, ok, it.next().unwrap_or("").to_string()));
        } else if let Some(rest) = find_marker(line, "NSFAST-TEST-START ") {
            self.current = Some((rest.to_string(), t));
            self.current_output.clear();
        } else if let Some(rest) = find_marker(line, "NSFAST-TEST ") {
            // What came before the marker on its line is the test's last output.
            let before = &line[..line.find("NSFAST-TEST ").unwrap_or(0)];
            if !before.trim().is_empty() {
                self.current_output.push(before.to_string());
            }
            let mut it = rest.splitn(3, ' ');
            let name = it.next().unwrap_or("").to_string();
            let verdict = it.next().unwrap_or("");
            let detail = it.next().unwrap_or("").to_string();
            let started = match &self.current {
                Some((n, s)) if *n == name => *s,
                _ => t,
            };
            self.current = None;
            self.results.insert(
                name,
                TestResult {
                    pass: verdict == "PASS",
                    detail,
                    secs: t - started,
                    output: std::mem::take(&mut self.current_output),
                },
            );
        } else if line.contains("NSFAST-DMESG-BEGIN") {
            self.in_dmesg = true;
        } else if line.contains("NSFAST-DONE") {
            self.done = true;
        } else {
            if self.current.is_some() {
                self.current_output.push(line.to_string());
            }
            self.check_kernel_line(line);
        }
    }

    /// The test during which the kernel died of a stale `int3` (`Oops: int3`, then the panic
    /// it causes, and no other kernel trouble): the emulator's code-patching race, not the
    /// test's doing. None for any other ending.
    pub fn emulator_fault_at(&self) -> Option<String> {
        let int3 = |k: &String| k.starts_with("Oops: int3");
        let consequence = |k: &String| {
            k == "Call Trace:" || k.starts_with("Kernel panic - not syncing: Fatal exception")
        };
        let only_int3 = self.kernel_problems.iter().any(int3)
            && self
                .kernel_problems
                .iter()
                .all(|k| int3(k) || consequence(k));
        match &self.current {
            Some((name, _)) if !self.done && only_int3 => Some(name.clone()),
            _ => None,
        }
    }

    /// This run's results before the test it died in, followed by `next`, a boot that ran
    /// the tests from that one on: `next`'s ending, kernel lines and dmesg.
    pub fn resumed_by(self, mut next: GuestRun) -> GuestRun {
        let mut results = self.results;
        results.append(&mut next.results);
        next.results = results;
        next
    }

    fn check_kernel_line(&mut self, line: &str) {
        let Some(text) = kernel_text(line) else {
            return;
        };
        if BAD_KERNEL_PATTERNS.iter().any(|p| text.contains(p))
            && !self.kernel_problems.iter().any(|k| k == text)
        {
            self.kernel_problems.push(text.to_string());
        }
    }

    /// Whether the line belongs to the dmesg dump (not echoed live).
    pub fn in_dmesg(&self) -> bool {
        self.in_dmesg
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed_all(text: &str) -> GuestRun {
        let mut g = GuestRun::default();
        for (i, l) in text.lines().enumerate() {
            g.feed(l, Duration::from_secs(i as u64));
        }
        g
    }

    #[test]
    fn parses_a_clean_run() {
        let g = feed_all(
            "[    0.000000] Linux version 7.2.13\n\
             NSFAST-INIT release=7.2.13+deb14-cloud-amd64 nproc=2\n\
             NSFAST-MODULE veth ok\n\
             NSFAST-MODULE netkit FAIL modprobe: module netkit not found\n\
             NSFAST-TEST-START probe\n\
             some output\n\
             NSFAST-TEST probe PASS rc=0\n\
             NSFAST-TEST-START bad\n\
             NSFAST-TEST bad FAIL rc=1\n\
             NSFAST-DMESG-BEGIN\n\
             [    0.100000] hello\n\
             NSFAST-DMESG-END\n\
             NSFAST-DONE\n",
        );
        assert_eq!(g.init_after, Some(1.0));
        assert_eq!(g.release.as_deref(), Some("7.2.13+deb14-cloud-amd64"));
        assert_eq!(g.modules.len(), 2);
        assert!(g.modules[0].1 && !g.modules[1].1);
        assert!(g.results["probe"].pass);
        assert_eq!(g.results["probe"].secs, 2.0);
        assert_eq!(g.results["probe"].output, ["some output"]);
        assert!(g.results["bad"].output.is_empty());
        assert!(!g.results["bad"].pass);
        assert_eq!(g.results["bad"].detail, "rc=1");
        assert_eq!(g.dmesg, ["[    0.100000] hello"]);
        assert!(g.done);
        assert!(g.kernel_problems.is_empty());
    }

    #[test]
    fn finds_kernel_trouble_but_not_in_test_output() {
        let g = feed_all(
            "NSFAST-INIT release=x nproc=2\n\
             a test printing BUG: something\n\
             [   12.5] WARNING: CPU: 1 PID: 7 at net/core/dev.c:1 foo+0x1/0x2\n\
             [   13.000001] Kernel panic - not syncing: sysrq triggered crash\n\
             NSFAST-DMESG-BEGIN\n\
             [   12.5] WARNING: CPU: 1 PID: 7 at net/core/dev.c:1 foo+0x1/0x2\n\
             [   14.0] Oops: general protection fault\n\
             NSFAST-DMESG-END\n",
        );
        assert_eq!(
            g.kernel_problems,
            [
                "WARNING: CPU: 1 PID: 7 at net/core/dev.c:1 foo+0x1/0x2",
                "Kernel panic - not syncing: sysrq triggered crash",
                "Oops: general protection fault"
            ]
        );
        assert!(!g.done);
    }

    /// The console of a 6.12 TCG guest that died in pod-dual-netkit (lines as they came).
    const INT3_DEATH: &str = "NSFAST-INIT release=6.12 nproc=2\n\
         NSFAST-TEST-START pod-state\n\
         NSFAST-TEST pod-state PASS rc=0\n\
         NSFAST-TEST-START pod-dual-netkit\n\
         test dual_stack_pods_talk_ipv6 ... [  269.756784] Oops: int3: 0000 [#1] PREEMPT SMP NOPTI\n\
         [  269.757420] RIP: 0010:flow_hash_from_keys+0x21/0xa0\n\
         [  269.758788] Call Trace:\n\
         [  269.759266]  <TASK>\n\
         [  269.761276] Kernel panic - not syncing: Fatal exception in interrupt\n\
         [  269.761858] Kernel Offset: disabled\n";

    #[test]
    fn a_stale_int3_mid_test_is_an_emulator_fault_to_boot_again_from() {
        let g = feed_all(INT3_DEATH);
        assert_eq!(g.emulator_fault_at().as_deref(), Some("pod-dual-netkit"));
        // The second boot runs pod-dual-netkit and what follows; the first boot's results
        // stay, its kernel lines go with it.
        let again = feed_all(
            "NSFAST-INIT release=6.12 nproc=2\n\
             NSFAST-TEST-START pod-dual-netkit\n\
             NSFAST-TEST pod-dual-netkit PASS rc=0\n\
             NSFAST-TEST-START pod-spoof\n\
             NSFAST-TEST pod-spoof FAIL rc=1\n\
             NSFAST-DONE\n",
        );
        let r = g.resumed_by(again);
        let verdicts: Vec<(&str, bool)> = r
            .results
            .iter()
            .map(|(n, t)| (n.as_str(), t.pass))
            .collect();
        assert_eq!(
            verdicts,
            [
                ("pod-dual-netkit", true),
                ("pod-spoof", false),
                ("pod-state", true)
            ]
        );
        assert!(r.done && r.kernel_problems.is_empty());
    }

    #[test]
    fn other_kernel_deaths_are_no_emulator_fault() {
        // Another oops beside the int3, a different oops, or a guest that finished.
        for text in [
            INT3_DEATH.replace("RIP:", "BUG: unable to handle page fault RIP:"),
            INT3_DEATH.replace("Oops: int3", "Oops: general protection fault"),
            format!("{INT3_DEATH}NSFAST-DONE\n"),
            INT3_DEATH.replace("NSFAST-TEST-START pod-dual-netkit\n", ""),
        ] {
            assert_eq!(feed_all(&text).emulator_fault_at(), None, "{text}");
        }
    }

    #[test]
    fn markers_found_mid_line() {
        // A kernel message can land in the middle of a console line.
        let g = feed_all(
            "NSFAST-TEST-START t\n\
             test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out\n\
             [ 1.0] random: crng initNSFAST-TEST t PASS rc=0\n",
        );
        assert!(g.results["t"].pass);
        assert_eq!(
            g.results["t"].output.len(),
            2,
            "{:?}",
            g.results["t"].output
        );
        assert_eq!(
            crate::checks::Count::from_output(&g.results["t"].output).ran(),
            1
        );
        assert_eq!(kernel_text("[    1.234567] hi"), Some("hi"));
        assert_eq!(kernel_text("[x] hi"), None);
        assert_eq!(kernel_text("plain"), None);
    }
}
