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
