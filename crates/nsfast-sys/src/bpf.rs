//! Raw `bpf(2)` calls that aya 0.14 does not expose publicly.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

const BPF_PROG_QUERY: libc::c_long = 16;
/// `BPF_CGROUP_SOCK_OPS` from `enum bpf_attach_type`.
pub const BPF_CGROUP_SOCK_OPS: u32 = 3;

#[repr(C)]
#[derive(Default)]
struct ProgQueryAttr {
    target_fd: u32,
    attach_type: u32,
    query_flags: u32,
    attach_flags: u32,
    prog_ids: u64,
    prog_cnt: u32,
    _pad: u32,
    prog_attach_flags: u64,
    link_ids: u64,
    link_attach_flags: u64,
    revision: u64,
}

/// The ids of the programs attached to `target` (a cgroup directory fd) for `attach_type`.
pub fn prog_query(target: BorrowedFd<'_>, attach_type: u32) -> io::Result<Vec<u32>> {
    let mut ids = vec![0u32; 64];
    let mut attr = ProgQueryAttr {
        target_fd: target.as_raw_fd() as u32,
        attach_type,
        prog_ids: ids.as_mut_ptr() as u64,
        prog_cnt: ids.len() as u32,
        ..Default::default()
    };
    // SAFETY: attr is a correctly laid out `union bpf_attr` prefix for BPF_PROG_QUERY whose
    // prog_ids pointer refers to `ids`, a live buffer of prog_cnt u32s; the size passed is
    // the struct's size, so the kernel neither reads nor writes past it.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_PROG_QUERY,
            &mut attr as *mut ProgQueryAttr,
            std::mem::size_of::<ProgQueryAttr>(),
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    ids.truncate(attr.prog_cnt as usize);
    Ok(ids)
}

const BPF_PROG_LOAD: libc::c_long = 5;

/// `BPF_PROG_TYPE_SCHED_CLS` from `enum bpf_prog_type`.
pub const BPF_PROG_TYPE_SCHED_CLS: u32 = 3;
/// `BPF_PROG_TYPE_SOCK_OPS`.
pub const BPF_PROG_TYPE_SOCK_OPS: u32 = 13;
/// `BPF_PROG_TYPE_SK_MSG`.
pub const BPF_PROG_TYPE_SK_MSG: u32 = 16;
/// `BPF_TCX_INGRESS` from `enum bpf_attach_type` (Linux 6.6+).
pub const BPF_TCX_INGRESS: u32 = 46;

/// One eBPF instruction (`struct bpf_insn`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Insn {
    pub code: u8,
    /// dst register in the low nibble, src register in the high nibble.
    pub regs: u8,
    pub off: i16,
    pub imm: i32,
}

impl Insn {
    /// `dst = imm` (BPF_ALU64 | BPF_MOV | BPF_K).
    pub const fn mov64_imm(dst: u8, imm: i32) -> Self {
        Self {
            code: 0xb7,
            regs: dst & 0x0f,
            off: 0,
            imm,
        }
    }
    /// `call helper` (BPF_JMP | BPF_CALL).
    pub const fn call(helper: i32) -> Self {
        Self {
            code: 0x85,
            regs: 0,
            off: 0,
            imm: helper,
        }
    }
    /// `exit` (BPF_JMP | BPF_EXIT).
    pub const fn exit() -> Self {
        Self {
            code: 0x95,
            regs: 0,
            off: 0,
            imm: 0,
        }
    }
}

/// Prefix of `union bpf_attr` for BPF_PROG_LOAD, up to `expected_attach_type`; the kernel
/// treats the fields after it as zero.
#[repr(C)]
#[derive(Default)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
}

/// Why the kernel refused a trial program load.
#[derive(Debug)]
pub struct LoadRefused {
    /// The `bpf(2)` error.
    pub error: io::Error,
    /// The verifier's last meaningful log line, if it wrote one.
    pub verifier: Option<String>,
}

impl std::fmt::Display for LoadRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.verifier {
            Some(v) => write!(f, "{} (verifier: {v})", self.error),
            None => write!(f, "{}", self.error),
        }
    }
}

/// Loads `insns` as a GPL program of `prog_type` to see whether the verifier accepts it, then
/// closes it at once. Nothing is attached.
pub fn trial_load(prog_type: u32, insns: &[Insn]) -> Result<(), LoadRefused> {
    let license = c"GPL";
    let mut log = vec![0u8; 64 * 1024];
    let attr = ProgLoadAttr {
        prog_type,
        insn_cnt: insns.len() as u32,
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        log_level: 1,
        log_size: log.len() as u32,
        log_buf: log.as_mut_ptr() as u64,
        ..Default::default()
    };
    // SAFETY: attr is a correctly laid out prefix of `union bpf_attr` for BPF_PROG_LOAD; its
    // pointers refer to `insns` (insn_cnt instructions), a NUL-terminated license and `log`
    // (log_size bytes), all alive for the duration of the call.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_PROG_LOAD,
            &attr as *const ProgLoadAttr,
            std::mem::size_of::<ProgLoadAttr>(),
        )
    };
    if fd >= 0 {
        // SAFETY: fd is a program fd the kernel just returned to us and nothing else owns.
        drop(unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd as i32) });
        return Ok(());
    }
    let error = io::Error::last_os_error();
    let text =
        String::from_utf8_lossy(&log[..log.iter().position(|&b| b == 0).unwrap_or(0)]).into_owned();
    let verifier = text
        .lines()
        .map(str::trim)
        .rfind(|l| {
            !l.is_empty() && !l.starts_with("processed ") && !l.starts_with("verification time")
        })
        .map(str::to_string);
    Err(LoadRefused { error, verifier })
}

/// Counts the programs attached to interface `ifindex` for `attach_type` (e.g.
/// [`BPF_TCX_INGRESS`]); `EINVAL` means the kernel does not know that attach type.
pub fn prog_query_ifindex(ifindex: u32, attach_type: u32) -> io::Result<u32> {
    let mut attr = ProgQueryAttr {
        target_fd: ifindex,
        attach_type,
        ..Default::default()
    };
    // SAFETY: attr is a correctly laid out `union bpf_attr` prefix for BPF_PROG_QUERY with a
    // null prog_ids buffer (prog_cnt 0), so the kernel only writes counts into attr itself.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_PROG_QUERY,
            &mut attr as *mut ProgQueryAttr,
            std::mem::size_of::<ProgQueryAttr>(),
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(attr.prog_cnt)
}
