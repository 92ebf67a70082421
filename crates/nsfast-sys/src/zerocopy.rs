//! `MSG_ZEROCOPY` sends and their completions (Documentation/networking/msg_zerocopy.rst):
//! `SO_ZEROCOPY` on the socket, `send(MSG_ZEROCOPY)`, and the completion notifications the
//! kernel queues on the socket's error queue (`recvmsg(MSG_ERRQUEUE)`, one
//! `sock_extended_err` with origin `SO_EE_ORIGIN_ZEROCOPY` per notification, covering the
//! send calls `ee_info..=ee_data`). AF_VSOCK has it since Linux 6.7 (level `SOL_VSOCK`,
//! type `VSOCK_RECVERR`); TCP and UDP since 4.14/5.0 (IP_RECVERR / IPV6_RECVERR).
//!
//! The buffer of a zero-copy send must not change until its completion arrives: the kernel
//! holds references on its pages, so freeing it is memory-safe for this process, but new
//! contents written into it before the completion may still go out. Keeping buffers until their
//! completion is the caller's job (nsfast-vsock's `zerocopy` module).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// `SO_EE_ORIGIN_ZEROCOPY` (linux/errqueue.h).
pub const SO_EE_ORIGIN_ZEROCOPY: u8 = 5;
/// `SO_EE_CODE_ZEROCOPY_COPIED`: the kernel copied the data after all (the send was not
/// zero-copy; the buffer is free as for any completion).
pub const SO_EE_CODE_ZEROCOPY_COPIED: u8 = 1;

/// One completion notification: the zero-copy send calls `lo..=hi` (the socket's 32-bit
/// counter, which wraps) are done with their buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    pub lo: u32,
    pub hi: u32,
    /// The kernel copied these sends' data instead (`SO_EE_CODE_ZEROCOPY_COPIED`).
    pub copied: bool,
}

/// Sets `SO_ZEROCOPY` on a socket. Kernels or socket families without it answer
/// `EOPNOTSUPP` (AF_VSOCK before 6.7) or `ENOPROTOOPT` (before 4.14).
pub fn enable(fd: BorrowedFd<'_>) -> io::Result<()> {
    let one: libc::c_int = 1;
    // SAFETY: the option value is a c_int that lives across the call; its size is passed.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ZEROCOPY,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `send(fd, buf, MSG_ZEROCOPY | MSG_DONTWAIT | MSG_NOSIGNAL)`: never blocks (EAGAIN when the
/// socket has no room; wait with poll(POLLOUT)). A call that returns n > 0 bytes takes the next
/// number of the socket's zero-copy counter; its completion comes later on the error queue
/// ([`read_completions`]). `buf` must stay unchanged until then (see the module doc).
pub fn send(fd: BorrowedFd<'_>, buf: &[u8]) -> io::Result<usize> {
    // SAFETY: buf is a valid slice for the call's duration and its length is passed; the
    // kernel takes its own page references for what it keeps (no pointer outlives the call
    // from this process's point of view).
    let n = unsafe {
        libc::send(
            fd.as_raw_fd(),
            buf.as_ptr().cast(),
            buf.len(),
            libc::MSG_ZEROCOPY | libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// Reads every queued error-queue message without blocking, appending the zero-copy
/// completions to `out`. Returns how many messages were read; other errors on the queue
/// (a `sock_extended_err` with a non-zero `ee_errno`) come back as that error.
pub fn read_completions(fd: BorrowedFd<'_>, out: &mut Vec<Completion>) -> io::Result<usize> {
    let mut read = 0;
    loop {
        // Room for several control messages.
        let mut cbuf = crate::cmsg::Buf::<512>::new();
        let mut data = [0u8; 1];
        let mut iov = libc::iovec {
            iov_base: data.as_mut_ptr().cast(),
            iov_len: data.len(),
        };
        // SAFETY: msghdr is a plain C struct; all-zero is a valid (empty) value.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.0.as_mut_ptr().cast();
        msg.msg_controllen = cbuf.0.len() as _;
        // SAFETY: msg points at iov, data and cbuf, all alive and of the lengths given, for
        // the duration of the call.
        let r = unsafe {
            libc::recvmsg(
                fd.as_raw_fd(),
                &mut msg,
                libc::MSG_ERRQUEUE | libc::MSG_DONTWAIT,
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::WouldBlock {
                return Ok(read);
            }
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        read += 1;
        #[allow(clippy::unnecessary_cast)] // size_t on glibc, socklen_t on musl
        let clen = (msg.msg_controllen as usize).min(cbuf.0.len());
        for c in crate::cmsg::Iter::new(&cbuf.0[..clen]) {
            let Some(ee) = c.decode::<libc::sock_extended_err>() else {
                continue;
            };
            if ee.ee_origin == SO_EE_ORIGIN_ZEROCOPY {
                if ee.ee_errno != 0 {
                    return Err(io::Error::from_raw_os_error(ee.ee_errno as i32));
                }
                out.push(Completion {
                    lo: ee.ee_info,
                    hi: ee.ee_data,
                    copied: ee.ee_code & SO_EE_CODE_ZEROCOPY_COPIED != 0,
                });
            } else if ee.ee_errno != 0 {
                return Err(io::Error::from_raw_os_error(ee.ee_errno as i32));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsFd;

    // The same calls on loopback TCP (this host must not open AF_VSOCK): zero-copy sends over
    // loopback are always copied (the receiver is local), so every completion says COPIED,
    // and the completions together cover exactly the send calls made, in order.
    #[test]
    fn tcp_loopback_completions_cover_every_send_and_say_copied() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut tx = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut rx, _) = l.accept().unwrap();
        enable(tx.as_fd()).unwrap();
        let buf = vec![7u8; 4096];
        let mut sends = 0u32;
        for _ in 0..8 {
            let n = send(tx.as_fd(), &buf).unwrap();
            assert!(n > 0);
            sends += 1;
        }
        tx.flush().unwrap();
        let mut got = vec![0u8; 8 * 4096];
        rx.read_exact(&mut got).unwrap();
        let mut done = Vec::new();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let covered = |d: &Vec<Completion>| d.iter().map(|c| c.hi - c.lo + 1).sum::<u32>();
        while covered(&done) < sends {
            assert!(
                std::time::Instant::now() < deadline,
                "completions: {done:?}"
            );
            let mut p = [nix::poll::PollFd::new(
                tx.as_fd(),
                nix::poll::PollFlags::empty(),
            )];
            let _ = nix::poll::poll(&mut p, nix::poll::PollTimeout::from(100u16));
            read_completions(tx.as_fd(), &mut done).unwrap();
        }
        assert_eq!(done.first().unwrap().lo, 0);
        assert_eq!(done.last().unwrap().hi, sends - 1);
        assert!(done.iter().all(|c| c.copied), "{done:?}");
    }
}
