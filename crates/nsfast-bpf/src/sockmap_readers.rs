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
//! both); where it cannot load the shortcut runs without it and says so once.

use aya::programs::links::FdLink;
use aya::programs::{BtfTracePoint, CgroupSockopt, FEntry, FExit, Lsm};
use aya::{Btf, Ebpf};
use tracing::{info, warn};

use crate::sockmap_abi as abi;

/// Neither hook that counts what receivers read could be attached (the detail says why for
/// each): without one no sender may redirect, since splice readers would miss bytes.
#[derive(Debug)]
pub struct NoReadHook(pub String);

impl std::fmt::Display for NoReadHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "cannot count what receivers read on this kernel ({}): the shortcut needs the \
             tracepoint sock_recv_length (Linux >= 6.5) or BPF trampolines (fexit) with the \
             kernel's BTF",
            self.0
        )
    }
}

impl std::error::Error for NoReadHook {}

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
        .map_err(|e| format!("load: {e}"))?;
    let id = p.attach().map_err(|e| format!("attach: {e}"))?;
    Ok(p.take_link(id).map_err(|e| format!("{e}"))?.into())
}

fn attach_fentry(ebpf: &mut Ebpf, btf: &Btf, prog: &str, target: &str) -> Result<FdLink, String> {
    let p: &mut FEntry = ebpf
        .program_mut(prog)
        .ok_or("program missing")?
        .try_into()
        .map_err(|e| format!("{e}"))?;
    p.load(target, btf)
        .map_err(|e| format!("load fentry on {target}: {e}"))?;
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
        .map_err(|e| format!("load fexit on {target}: {e}"))?;
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
        .map_err(|e| format!("load lsm {hook}: {e}"))?;
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
pub fn attach(ebpf: &mut Ebpf) -> Result<ReaderHooks, NoReadHook> {
    let btf = Btf::from_sys_fs()
        .map_err(|e| NoReadHook(format!("reading /sys/kernel/btf/vmlinux: {e}")))?;
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
                return Err(NoReadHook(format!(
                    "tracepoint sock_recv_length: {tp_err}; fexit sock_recvmsg: {fexit_err}"
                )))
            }
        },
    };
    let splice_guard = match attach_guard(ebpf, &btf) {
        Ok(l) => {
            links.extend(l);
            true
        }
        Err(e) => {
            warn!(
                "splice guard not attached ({e}): a receiver that reads with recvmsg and then \
                 switches to splice(2)/sendfile(2) may miss bytes queued by the shortcut; it \
                 needs BPF trampolines and `bpf` in the active LSMs (boot with lsm=...,bpf). \
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
