//! Process file descriptors (`pidfd_open(2)`, Linux 5.3): a handle on one process that a
//! reused PID cannot redirect. nix 0.32 has no wrapper for it.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};

/// Opens a pidfd for process `pid` (close-on-exec, as every pidfd is).
pub fn open(pid: u32) -> io::Result<OwnedFd> {
    // Above pid_t's range: EINVAL, as the kernel answers for a negative PID.
    let pid = libc::pid_t::try_from(pid).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: pidfd_open takes a PID and flags and returns a new descriptor or -1; no memory
    // is passed.
    let r = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = i32::try_from(r).map_err(|_| io::Error::other("pidfd_open returned no descriptor"))?;
    // SAFETY: the kernel just returned this descriptor to us; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    #[test]
    fn opens_own_process_and_refuses_a_bad_pid() {
        assert!(super::open(std::process::id()).is_ok());
        assert!(super::open(u32::MAX).is_err());
    }
}
