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

/// Issues `bpf(cmd, attr, size_of::<T>())`: the one place nsfast calls the raw system call.
/// Returns its non-negative result (an fd for commands that create one) or the OS error.
///
/// # Safety
/// `T` must be the `union bpf_attr` prefix the kernel expects for `cmd`, and every pointer
/// stored in `attr` must be valid for the reads and writes that command does until it returns.
unsafe fn sys_bpf<T>(cmd: libc::c_long, attr: &mut T) -> io::Result<i64> {
    // SAFETY: the caller guarantees `attr` matches `cmd`; the size passed is exactly T's, so
    // the kernel neither reads nor writes past it.
    let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr as *mut T, std::mem::size_of::<T>()) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
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
    unsafe { sys_bpf(BPF_PROG_QUERY, &mut attr) }?;
    ids.truncate(attr.prog_cnt as usize);
    Ok(ids)
}

/// `BPF_CGROUP_SETSOCKOPT` from `enum bpf_attach_type`.
pub const BPF_CGROUP_SETSOCKOPT: u32 = 22;

/// Attaches the cgroup program `prog` to the cgroup open at `cgroup` at `attach_type` with a
/// BPF link (`BPF_LINK_CREATE`; the cgroup's fd goes where a device's ifindex would). Returns
/// the link; closing it (unless pinned with [`netkit::obj_pin`]) detaches the program.
pub fn cgroup_link(
    prog: BorrowedFd<'_>,
    cgroup: BorrowedFd<'_>,
    attach_type: u32,
) -> io::Result<std::os::fd::OwnedFd> {
    netkit::link_create(prog, cgroup.as_raw_fd() as u32, attach_type)
}

/// Netkit program attachment through a raw `BPF_LINK_CREATE` (aya 0.14 has no netkit attach).
/// Everything unsafe about it lives in this module.
pub mod netkit {
    use std::ffi::CString;
    use std::io;
    use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
    use std::path::Path;

    const BPF_OBJ_PIN: libc::c_long = 6;
    const BPF_LINK_CREATE: libc::c_long = 28;
    /// `BPF_NETKIT_PRIMARY` from `enum bpf_attach_type`: traffic leaving the primary (host)
    /// side, i.e. going to the pod.
    pub const BPF_NETKIT_PRIMARY: u32 = 54;
    /// `BPF_NETKIT_PEER`: traffic the pod sends; runs in the host namespace, out of the pod's
    /// reach.
    pub const BPF_NETKIT_PEER: u32 = 55;

    /// The `link_create` member of `union bpf_attr`, with its `netkit` sub-struct.
    #[repr(C)]
    #[derive(Default, Debug)]
    pub(crate) struct LinkCreateAttr {
        pub prog_fd: u32,
        pub target_ifindex: u32,
        pub attach_type: u32,
        pub flags: u32,
        pub relative_fd: u32,
        pub _pad: u32,
        pub expected_revision: u64,
    }

    /// The `BPF_OBJ_*` member of `union bpf_attr`.
    #[repr(C)]
    #[derive(Default, Debug)]
    pub(crate) struct ObjPinAttr {
        pub pathname: u64,
        pub bpf_fd: u32,
        pub file_flags: u32,
        pub path_fd: i32,
        pub _pad: u32,
    }

    /// Attaches the sched_cls program `prog` to the netkit device whose *primary* ifindex is
    /// `primary_ifindex` (the peer's ifindex gives `EACCES`), at `attach_type`
    /// ([`BPF_NETKIT_PRIMARY`] or [`BPF_NETKIT_PEER`]), appended after existing programs.
    /// Returns the link; closing it (unless pinned) detaches the program. The caller must be in
    /// the namespace of the primary device.
    pub fn link_create(
        prog: BorrowedFd<'_>,
        primary_ifindex: u32,
        attach_type: u32,
    ) -> io::Result<OwnedFd> {
        let mut attr = LinkCreateAttr {
            prog_fd: prog.as_raw_fd() as u32,
            target_ifindex: primary_ifindex,
            attach_type,
            ..Default::default()
        };
        // SAFETY: `attr` is a correctly laid out prefix of `union bpf_attr` for
        // BPF_LINK_CREATE (checked by the layout test below); the kernel only reads `size`
        // bytes of it and treats the rest as zero. It holds no pointers.
        let r = unsafe { super::sys_bpf(BPF_LINK_CREATE, &mut attr) }?;
        // SAFETY: on success BPF_LINK_CREATE returns a new file descriptor that nothing else
        // owns.
        Ok(unsafe { OwnedFd::from_raw_fd(r as i32) })
    }

    /// Pins a BPF object (link, map, program) fd at `path` on a bpffs mount.
    pub fn obj_pin(fd: BorrowedFd<'_>, path: &Path) -> io::Result<()> {
        let c = CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains NUL"))?;
        let mut attr = ObjPinAttr {
            pathname: c.as_ptr() as u64,
            bpf_fd: fd.as_raw_fd() as u32,
            ..Default::default()
        };
        // SAFETY: `attr` is the BPF_OBJ_PIN layout of `union bpf_attr`; `pathname` points to
        // the NUL-terminated `c`, alive until the call returns; the kernel reads only `size`
        // bytes of `attr`.
        unsafe { super::sys_bpf(BPF_OBJ_PIN, &mut attr) }?;
        Ok(())
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        use std::mem::{offset_of, size_of};

        /// Offsets from `union bpf_attr` in linux/bpf.h (6.7+).
        #[test]
        fn attr_layouts_match_the_uapi() {
            assert_eq!(offset_of!(LinkCreateAttr, prog_fd), 0);
            assert_eq!(offset_of!(LinkCreateAttr, target_ifindex), 4);
            assert_eq!(offset_of!(LinkCreateAttr, attach_type), 8);
            assert_eq!(offset_of!(LinkCreateAttr, flags), 12);
            assert_eq!(offset_of!(LinkCreateAttr, relative_fd), 16);
            assert_eq!(offset_of!(LinkCreateAttr, expected_revision), 24);
            assert_eq!(size_of::<LinkCreateAttr>(), 32);
            assert_eq!(offset_of!(ObjPinAttr, bpf_fd), 8);
            assert_eq!(offset_of!(ObjPinAttr, path_fd), 16);
        }
    }
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
    let mut attr = ProgLoadAttr {
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
    let error = match unsafe { sys_bpf(BPF_PROG_LOAD, &mut attr) } {
        Ok(fd) => {
            // SAFETY: fd is a program fd the kernel just returned to us and nothing else owns.
            drop(unsafe {
                <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd as i32)
            });
            return Ok(());
        }
        Err(e) => e,
    };
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
    unsafe { sys_bpf(BPF_PROG_QUERY, &mut attr) }?;
    Ok(attr.prog_cnt)
}
