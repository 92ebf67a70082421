//! The programs of [`crate::SOCKMAP`] that watch how receivers read (`bpf/sockmap.bpf.c`,
//! "Readers"), attached the same way by `nsfast sockmap` and the pod shortcut.
//!
//! A sender redirects into a receiver only once the receiver has returned from a
//! recvmsg-family read and read everything sent so far, because splice(2) and sendfile(2) never
//! see the shortcut's queue. That needs the read accounting ([`RecvHook`]): the
//! `sock_recv_length` tracepoint (Linux 6.5+), else an fexit on `sock_recvmsg`. Without either
//! the shortcut cannot be attached safely, and attaching fails.
//!
//! The splice guard (fentry/fexit on `do_splice` and the sendfile64 syscall, fentry on
//! `tcp_splice_read`, the bpf LSM's `file_permission`) covers a reader that switches from
//! recvmsg to splice: it refuses (EINVAL) a splice from a socket whose shortcut queue holds
//! bytes. It needs BPF trampolines and `bpf` among the active LSMs (Debian's kernels have
//! both). Without it such a reader (HAProxy with `option splice-*`) would miss the queued
//! bytes, and no hook that loads without trampolines or the bpf LSM can stop that: a syscall
//! tracepoint sees the splice but cannot refuse it or move the queued bytes, and taking the
//! socket out of the SOCKHASH frees them. So where the guard cannot load, attaching fails
//! ([`AttachError::NoSpliceGuard`]) unless the caller accepts the risk
//! ([`SpliceGuard::Optional`]: `--allow-splice-hole`).
//!
//! `NSFAST_SPLICE_GUARD=off` in the environment leaves the guard out as if the kernel had
//! refused it, so that both paths can be tested on a kernel where it loads.

use aya::programs::links::FdLink;
use aya::programs::{BtfTracePoint, CgroupSockopt, FEntry, FExit, Lsm};
use aya::{Btf, Ebpf};
use tracing::{info, warn};

use crate::sockmap_abi as abi;

/// Why the reader programs could not be attached (the detail says what the kernel said).
#[derive(Debug)]
pub enum AttachError {
    /// Neither hook that counts what receivers read: without one no sender may redirect,
    /// since splice readers would miss bytes.
    NoReadHook(String),
    /// The splice guard, which a caller that did not accept the risk needs.
    NoSpliceGuard(String),
}

/// The option that accepts running without the splice guard, as the refusal names it.
pub const ALLOW_SPLICE_HOLE_FLAG: &str = "--allow-splice-hole";
/// The environment variable that leaves the guard out (`off`), for tests.
pub const GUARD_ENV: &str = "NSFAST_SPLICE_GUARD";

impl std::fmt::Display for AttachError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AttachError::NoReadHook(d) => write!(
                f,
                "cannot count what receivers read on this kernel ({d}): the shortcut needs the \
                 tracepoint sock_recv_length (Linux >= 6.5) or BPF trampolines (fexit) with the \
                 kernel's BTF"
            ),
            AttachError::NoSpliceGuard(d) => write!(
                f,
                "the splice guard cannot attach on this kernel ({d}): a receiver that reads with \
                 recv(2) and then switches to splice(2) or sendfile(2), as HAProxy with option \
                 splice-* does, would miss bytes the shortcut queued for it. The guard needs \
                 BPF trampolines (fentry) and `bpf` among the active LSMs (boot with \
                 lsm=...,bpf); {ALLOW_SPLICE_HOLE_FLAG} starts the shortcut without it, for \
                 cgroups whose programs never switch a socket from recv to splice"
            ),
        }
    }
}

impl std::error::Error for AttachError {}

/// Whether the caller needs the splice guard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SpliceGuard {
    /// Attaching fails where the guard cannot load.
    #[default]
    Required,
    /// The shortcut runs without the guard where it cannot load, and warns
    /// (`--allow-splice-hole`).
    Optional,
}

impl SpliceGuard {
    /// [`SpliceGuard::Optional`] when `allow_hole`, else [`SpliceGuard::Required`].
    pub fn allowing_hole(allow_hole: bool) -> Self {
        if allow_hole {
            SpliceGuard::Optional
        } else {
            SpliceGuard::Required
        }
    }
}

/// Whether `NSFAST_SPLICE_GUARD=off` leaves the guard out.
fn guard_turned_off() -> bool {
    std::env::var(GUARD_ENV).is_ok_and(|v| v == "off")
}

/// Whether the splice guard can attach on this kernel: loads the sockmap object, attaches the
/// guard's programs and detaches them again (they act only on sockets of that object's maps,
/// of which there are none). `Err` says why not.
pub fn probe_splice_guard() -> Result<(), String> {
    if guard_turned_off() {
        return Err(format!("turned off by {GUARD_ENV}=off"));
    }
    let btf = Btf::from_sys_fs().map_err(|e| format!("reading /sys/kernel/btf/vmlinux: {e}"))?;
    let mut ebpf = aya::EbpfLoader::new()
        .load(crate::SOCKMAP)
        .map_err(|e| format!("load the sockmap object: {e}"))?;
    attach_guard(&mut ebpf, &btf).map(drop)
}

/// The hook that counts what receivers read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecvHook {
    /// tp_btf/sock_recv_length
    Tracepoint,
    /// fexit/sock_recvmsg
    Fexit,
}

impl RecvHook {
    pub fn as_str(self) -> &'static str {
        match self {
            RecvHook::Tracepoint => "tracepoint sock_recv_length",
            RecvHook::Fexit => "fexit sock_recvmsg",
        }
    }
}

/// The attached reader programs: their links (dropping them detaches, unless pinned).
#[derive(Debug)]
pub struct ReaderHooks {
    pub recv_hook: RecvHook,
    /// Whether the splice guard is attached.
    pub splice_guard: bool,
    /// (program name, link), in attach order.
    pub links: Vec<(&'static str, FdLink)>,
}

/// The sendfile64 syscall's entry point on this architecture.
pub const SENDFILE_SYMBOL: &str = if cfg!(target_arch = "aarch64") {
    "__arm64_sys_sendfile64"
} else if cfg!(target_arch = "s390x") {
    "__s390x_sys_sendfile64"
} else {
    "__x64_sys_sendfile64"
};

fn attach_tp(ebpf: &mut Ebpf, btf: &Btf) -> Result<FdLink, String> {
    let p: &mut BtfTracePoint = ebpf
        .program_mut(abi::PROG_RX_READ_TP)
        .ok_or("program missing")?
        .try_into()
        .map_err(|e| format!("{e}"))?;
    p.load("sock_recv_length", btf)
        .map_err(|e| format!("load: {}", load_err(e)))?;
    let id = p.attach().map_err(|e| format!("attach: {e}"))?;
    Ok(p.take_link(id).map_err(|e| format!("{e}"))?.into())
}

/// `e` as text, without the empty verifier log aya appends to a refused load.
fn load_err(e: impl std::fmt::Display) -> String {
    let t = e.to_string();
    let trimmed = t.trim_end();
    trimmed
        .strip_suffix("Verifier output:")
        .map(|s| s.trim_end().trim_end_matches('.').to_string())
        .unwrap_or(t)
}

fn attach_fentry(ebpf: &mut Ebpf, btf: &Btf, prog: &str, target: &str) -> Result<FdLink, String> {
    let p: &mut FEntry = ebpf
        .program_mut(prog)
        .ok_or("program missing")?
        .try_into()
        .map_err(|e| format!("{e}"))?;
    p.load(target, btf)
        .map_err(|e| format!("load fentry on {target}: {}", load_err(e)))?;
    let id = p
        .attach()
        .map_err(|e| format!("attach fentry on {target}: {e}"))?;
    Ok(p.take_link(id).map_err(|e| format!("{e}"))?.into())
}

fn attach_fexit(ebpf: &mut Ebpf, btf: &Btf, prog: &str, target: &str) -> Result<FdLink, String> {
    let p: &mut FExit = ebpf
        .program_mut(prog)
        .ok_or("program missing")?
        .try_into()
        .map_err(|e| format!("{e}"))?;
    p.load(target, btf)
        .map_err(|e| format!("load fexit on {target}: {}", load_err(e)))?;
    let id = p
        .attach()
        .map_err(|e| format!("attach fexit on {target}: {e}"))?;
    Ok(p.take_link(id).map_err(|e| format!("{e}"))?.into())
}

fn attach_lsm(ebpf: &mut Ebpf, btf: &Btf, prog: &str, hook: &str) -> Result<FdLink, String> {
    let p: &mut Lsm = ebpf
        .program_mut(prog)
        .ok_or("program missing")?
        .try_into()
        .map_err(|e| format!("{e}"))?;
    p.load(hook, btf)
        .map_err(|e| format!("load lsm {hook}: {}", load_err(e)))?;
    let id = p.attach().map_err(|e| format!("attach lsm {hook}: {e}"))?;
    Ok(p.take_link(id).map_err(|e| format!("{e}"))?.into())
}

/// The splice guard's programs, all or none.
fn attach_guard(ebpf: &mut Ebpf, btf: &Btf) -> Result<Vec<(&'static str, FdLink)>, String> {
    Ok(vec![
        (
            abi::PROG_SPLICE_ENTER,
            attach_fentry(ebpf, btf, abi::PROG_SPLICE_ENTER, "do_splice")?,
        ),
        (
            abi::PROG_SPLICE_EXIT,
            attach_fexit(ebpf, btf, abi::PROG_SPLICE_EXIT, "do_splice")?,
        ),
        (
            abi::PROG_SENDFILE_ENTER,
            attach_fentry(ebpf, btf, abi::PROG_SENDFILE_ENTER, SENDFILE_SYMBOL)?,
        ),
        (
            abi::PROG_SENDFILE_EXIT,
            attach_fexit(ebpf, btf, abi::PROG_SENDFILE_EXIT, SENDFILE_SYMBOL)?,
        ),
        (
            abi::PROG_SPLICE_SEEN,
            attach_fentry(ebpf, btf, abi::PROG_SPLICE_SEEN, "tcp_splice_read")?,
        ),
        (
            abi::PROG_SPLICE_GUARD,
            attach_lsm(ebpf, btf, abi::PROG_SPLICE_GUARD, "file_permission")?,
        ),
    ])
}

/// Loads the socket-option hook (`cgroup/setsockopt`: options the shortcut cannot honour keep
/// their socket on TCP) and returns its program fd, for the caller to attach to its cgroup
/// with a BPF link (`nsfast_sys::bpf::cgroup_link`; aya's cgroup-sockopt link cannot be
/// pinned). Attach it before sockops, so an option set on a connecting socket is seen.
pub fn load_sockopt(ebpf: &mut Ebpf) -> Result<aya::programs::ProgramFd, String> {
    let p: &mut CgroupSockopt = ebpf
        .program_mut(abi::PROG_SETSOCKOPT)
        .ok_or("program nsf_setsockopt missing")?
        .try_into()
        .map_err(|e| format!("{e}"))?;
    p.load().map_err(|e| format!("load nsf_setsockopt: {e}"))?;
    p.fd()
        .and_then(|f| f.try_clone().map_err(Into::into))
        .map_err(|e| format!("nsf_setsockopt fd: {e}"))
}

/// Loads and attaches the reader programs of `ebpf` (the sockmap object, before its sk_msg and
/// sockops programs are attached, so every socket's reads are counted from its start).
pub fn attach(ebpf: &mut Ebpf, guard: SpliceGuard) -> Result<ReaderHooks, AttachError> {
    let btf = Btf::from_sys_fs()
        .map_err(|e| AttachError::NoReadHook(format!("reading /sys/kernel/btf/vmlinux: {e}")))?;
    let mut links = Vec::new();
    let recv_hook = match attach_tp(ebpf, &btf) {
        Ok(l) => {
            links.push((abi::PROG_RX_READ_TP, l));
            RecvHook::Tracepoint
        }
        Err(tp_err) => match attach_fexit(ebpf, &btf, abi::PROG_RX_READ_FEXIT, "sock_recvmsg") {
            Ok(l) => {
                links.push((abi::PROG_RX_READ_FEXIT, l));
                RecvHook::Fexit
            }
            Err(fexit_err) => {
                return Err(AttachError::NoReadHook(format!(
                    "tracepoint sock_recv_length: {tp_err}; fexit sock_recvmsg: {fexit_err}"
                )))
            }
        },
    };
    let attached = if guard_turned_off() {
        Err(format!("turned off by {GUARD_ENV}=off"))
    } else {
        attach_guard(ebpf, &btf)
    };
    let splice_guard = match attached {
        Ok(l) => {
            links.extend(l);
            true
        }
        Err(e) if guard == SpliceGuard::Required => return Err(AttachError::NoSpliceGuard(e)),
        Err(e) => {
            warn!(
                "splice guard not attached ({e}), running without it as \
                 {ALLOW_SPLICE_HOLE_FLAG} asks: a receiver that reads with recvmsg and then \
                 switches to splice(2)/sendfile(2) may miss bytes queued by the shortcut. \
                 Receivers that only splice keep TCP either way"
            );
            false
        }
    };
    info!(
        "receiver reads counted by {}; splice guard {}",
        recv_hook.as_str(),
        if splice_guard { "on" } else { "off" }
    );
    Ok(ReaderHooks {
        recv_hook,
        splice_guard,
        links,
    })
}
