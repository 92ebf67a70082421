//! Boots one guest under qemu-system-x86_64, streams its serial console into a
//! [`crate::report::GuestRun`] and a log file, and enforces time limits.

use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::report::GuestRun;

/// How to run the guest's CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Accel {
    Kvm,
    Tcg,
}

impl std::fmt::Display for Accel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Accel::Kvm => "kvm",
            Accel::Tcg => "tcg",
        })
    }
}

/// `--accel` choices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AccelChoice {
    /// KVM when /dev/kvm can boot stock kernels, else TCG; a KVM guest that does not reach
    /// /init is retried under TCG.
    Auto,
    Kvm,
    Tcg,
}

/// Picks the accelerator and says why.
pub fn detect_accel(choice: AccelChoice) -> (Accel, String) {
    match choice {
        AccelChoice::Kvm => (Accel::Kvm, "--accel kvm".into()),
        AccelChoice::Tcg => (Accel::Tcg, "--accel tcg".into()),
        AccelChoice::Auto => {
            if Path::new("/sys/module/kvm_pvm").exists() {
                (
                    Accel::Tcg,
                    "/dev/kvm is a PVM host (kvm_pvm loaded), which cannot boot stock kernels: using TCG".into(),
                )
            } else if fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open("/dev/kvm")
                .is_ok()
            {
                (Accel::Kvm, "/dev/kvm is usable".into())
            } else {
                (Accel::Tcg, "no usable /dev/kvm: using TCG".into())
            }
        }
    }
}

/// One guest boot.
#[derive(Debug, Clone)]
pub struct BootSpec {
    pub label: String,
    pub kernel: PathBuf,
    pub initrd: PathBuf,
    pub accel: Accel,
    pub cpus: u32,
    pub mem_mb: u32,
    pub extra_args: Vec<String>,
    /// Whole-VM limit.
    pub timeout: Duration,
    /// Limit for reaching `NSFAST-INIT`.
    pub init_timeout: Duration,
    pub log: PathBuf,
    /// Echo console lines (outside the dmesg dump) to stdout, prefixed with the label.
    pub echo: bool,
    /// Echo kernel boot lines before /init too.
    pub verbose: bool,
    /// Run the tests from this one on (`nsfast.from=NAME` on the kernel command line; a
    /// guest booted again after an emulator fault), instead of all.
    pub from_test: Option<String>,
}

/// How a boot ended.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub enum Ending {
    /// QEMU exited by itself with this status text.
    Exited { success: bool, status: String },
    /// The whole-VM limit passed; QEMU was killed.
    TimedOut,
    /// /init was not reached in time; QEMU was killed.
    NoInit,
}

/// The kernel command line for every guest.
pub const CMDLINE: &str =
    "console=ttyS0,115200 panic=-1 loglevel=5 rdinit=/init mitigations=off nokaslr";

pub fn command(spec: &BootSpec) -> Command {
    let mut c = Command::new("qemu-system-x86_64");
    c.args([
        "-nodefaults",
        "-no-user-config",
        "-display",
        "none",
        "-no-reboot",
    ])
    .args(["-serial", "stdio"])
    .args(["-m", &spec.mem_mb.to_string()])
    .args(["-smp", &spec.cpus.to_string()]);
    match spec.accel {
        Accel::Kvm => c.args(["-accel", "kvm", "-cpu", "host"]),
        Accel::Tcg => c.args(["-accel", "tcg,thread=multi", "-cpu", "max"]),
    };
    c.arg("-kernel")
        .arg(&spec.kernel)
        .arg("-initrd")
        .arg(&spec.initrd)
        .arg("-append")
        .arg(match &spec.from_test {
            Some(t) => format!("{CMDLINE} nsfast.from={t}"),
            None => CMDLINE.to_string(),
        })
        .args(&spec.extra_args);
    c
}

/// Memory of a peer guest (`{peer-qemu}`), in MiB; its memfd backend has the same size.
pub const PEER_MEM_MB: u32 = 512;

/// `{peer-qemu}`: a shell command line that boots a second guest (a `@peer`) from the same
/// kernel and initramfs: one vCPU, [`PEER_MEM_MB`] of shared memfd memory (so vhost-user
/// devices work), the serial console on stdout (the helper's log), and `nsfast.role=peer` on
/// the kernel command line so its /init runs /etc/nsfast/peer instead of the tests. The helper
/// line adds the devices.
pub fn peer_command_line(kernel: &Path, initrd: &Path, accel: Accel) -> String {
    let q = |p: &Path| format!("'{}'", p.display().to_string().replace('\'', "'\\''"));
    let accel = match accel {
        Accel::Kvm => "-accel kvm -cpu host",
        Accel::Tcg => "-accel tcg,thread=multi -cpu max",
    };
    format!(
        "qemu-system-x86_64 -nodefaults -no-user-config -display none -no-reboot -serial stdio \
         -m {PEER_MEM_MB} -smp 1 {accel} \
         -object memory-backend-memfd,id=peermem,size={PEER_MEM_MB}M,share=on \
         -machine memory-backend=peermem -kernel {} -initrd {} -append '{CMDLINE} nsfast.role=peer'",
        q(kernel),
        q(initrd)
    )
}

fn kill(child: &mut Child) {
    // Child::kill signals exactly this child's PID.
    let _ = child.kill();
    let _ = child.wait();
}

/// Boots `spec`, feeding every console line to `run`. Returns how the boot ended.
pub fn boot(spec: &BootSpec, run: &mut GuestRun) -> Result<Ending> {
    let mut cmd = command(spec);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    nsfast_sys::child::die_with_parent(&mut cmd, nix::sys::signal::Signal::SIGKILL);
    tracing::debug!("{:?}", cmd);
    let start = Instant::now();
    let mut child = cmd
        .spawn()
        .context("starting qemu-system-x86_64 (install qemu-system-x86)")?;
    let mut log =
        fs::File::create(&spec.log).with_context(|| format!("creating {}", spec.log.display()))?;
    writeln!(log, "# {:?}", cmd)?;

    let (tx, rx) = mpsc::channel::<String>();
    let stdout = child.stdout.take().expect("piped stdout");
    std::thread::spawn(move || {
        let mut r = BufReader::new(stdout);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            match r.read_until(b'\n', &mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    let s = String::from_utf8_lossy(&buf)
                        .replace('\r', "")
                        .trim_end_matches('\n')
                        .to_string();
                    if tx.send(s).is_err() {
                        break;
                    }
                }
            }
        }
    });
    let mut stderr = child.stderr.take().expect("piped stderr");
    let err_thread = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });

    let deadline = start + spec.timeout;
    let init_deadline = start + spec.init_timeout;
    let ending = loop {
        let now = Instant::now();
        let limit = if run.init_after.is_none() {
            init_deadline.min(deadline)
        } else {
            deadline
        };
        if now >= limit {
            kill(&mut child);
            break if run.init_after.is_none() {
                Ending::NoInit
            } else {
                Ending::TimedOut
            };
        }
        match rx.recv_timeout(limit - now) {
            Ok(line) => {
                writeln!(log, "{line}")?;
                let was_init = run.init_after.is_some();
                let in_dmesg = run.in_dmesg();
                run.feed(&line, start.elapsed());
                let kernel_trouble = run
                    .kernel_problems
                    .last()
                    .is_some_and(|p| line.contains(p.as_str()));
                if spec.echo
                    && !in_dmesg
                    && !run.in_dmesg()
                    && (was_init || spec.verbose || kernel_trouble || run.init_after.is_some())
                {
                    println!("[{}] {line}", spec.label);
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => continue,
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                let status = child.wait()?;
                break Ending::Exited {
                    success: status.success(),
                    status: status.to_string(),
                };
            }
        }
    };
    let err = err_thread.join().unwrap_or_default();
    if !err.trim().is_empty() {
        writeln!(log, "# qemu stderr:\n{err}")?;
        for l in err.lines().filter(|l| !l.trim().is_empty()) {
            println!("[{}] qemu: {l}", spec.label);
        }
    }
    Ok(ending)
}
