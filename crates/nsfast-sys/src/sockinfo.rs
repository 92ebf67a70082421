//! Socket facts the vsock relay's kernel path reads (crates/vsock/src/kernel.rs): the socket
//! cookie, the family, receive memory in use, bytes queued, TCP's bytes written, and the
//! SO_RCVLOWAT "kick". Raw getsockopt/ioctl calls that nix does not wrap.

use crate::syscall::cvt;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// getsockopt into `buf`; returns the length the kernel wrote.
fn getsockopt_raw(fd: BorrowedFd<'_>, level: i32, name: i32, buf: &mut [u8]) -> io::Result<usize> {
    let mut len = buf.len() as libc::socklen_t;
    // SAFETY: buf is valid for writes of `len` bytes and len points to its size; the kernel
    // writes at most len bytes and updates len.
    cvt(unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            level,
            name,
            buf.as_mut_ptr().cast(),
            &mut len,
        )
    })?;
    Ok(len as usize)
}

fn getsockopt_u64(fd: BorrowedFd<'_>, level: i32, name: i32) -> io::Result<u64> {
    let mut b = [0u8; 8];
    let n = getsockopt_raw(fd, level, name, &mut b)?;
    Ok(match n {
        4 => u32::from_ne_bytes(b[..4].try_into().unwrap_or_default()) as u64,
        _ => u64::from_ne_bytes(b),
    })
}

/// SO_COOKIE: the socket's cookie (never reused while the system runs).
pub fn cookie(fd: BorrowedFd<'_>) -> io::Result<u64> {
    getsockopt_u64(fd, libc::SOL_SOCKET, libc::SO_COOKIE)
}

/// SO_DOMAIN: the socket's address family (AF_INET, AF_INET6, AF_VSOCK, AF_UNIX, ...).
pub fn domain(fd: BorrowedFd<'_>) -> io::Result<i32> {
    getsockopt_u64(fd, libc::SOL_SOCKET, libc::SO_DOMAIN).map(|v| v as i32)
}

/// SO_MEMINFO's SK_MEMINFO_RMEM_ALLOC: receive memory charged to the socket. An skb a
/// TCP socket's psock redirected elsewhere stays charged to it until it was sent and freed.
pub fn rmem_alloc(fd: BorrowedFd<'_>) -> io::Result<u32> {
    meminfo(fd, 0, "SO_MEMINFO returned nothing")
}

/// SO_MEMINFO's SK_MEMINFO_DROPS: skbs the kernel dropped on the socket (sk_drops), among
/// them the ones a sockmap psock dropped (sock_drop).
pub fn drops(fd: BorrowedFd<'_>) -> io::Result<u32> {
    meminfo(fd, 8, "SO_MEMINFO has no drop count (Linux < 4.7)")
}

/// Field `i` of SO_MEMINFO's u32 array; `missing` when the kernel returns fewer.
fn meminfo(fd: BorrowedFd<'_>, i: usize, missing: &str) -> io::Result<u32> {
    let mut b = [0u8; 4 * 9];
    let n = getsockopt_raw(fd, libc::SOL_SOCKET, libc::SO_MEMINFO, &mut b)?;
    if n < 4 * (i + 1) {
        return Err(io::Error::other(missing.to_string()));
    }
    Ok(u32::from_ne_bytes([
        b[4 * i],
        b[4 * i + 1],
        b[4 * i + 2],
        b[4 * i + 3],
    ]))
}

fn ioctl_int(fd: BorrowedFd<'_>, req: libc::Ioctl) -> io::Result<i32> {
    let mut v: libc::c_int = 0;
    // SAFETY: SIOCINQ/SIOCOUTQ write one int to the pointer, which points to a live c_int.
    cvt(unsafe { libc::ioctl(fd.as_raw_fd(), req, &mut v) })?;
    Ok(v)
}

/// SIOCINQ: bytes queued for reading (TCP: not yet read by anyone, a psock included).
pub fn inq(fd: BorrowedFd<'_>) -> io::Result<i32> {
    ioctl_int(fd, libc::FIONREAD)
}

/// SIOCOUTQ: bytes in the send queue not yet acknowledged (TCP).
pub fn outq(fd: BorrowedFd<'_>) -> io::Result<i32> {
    ioctl_int(fd, libc::TIOCOUTQ)
}

/// Bytes ever written into a TCP socket's send queue, up to a constant: tcpi_bytes_acked
/// (read first) + SIOCOUTQ. Reading them in that order can only under-count (acks arriving
/// in between move bytes from the second into the first), never over-count.
pub fn tcp_written(fd: BorrowedFd<'_>) -> io::Result<u64> {
    let mut b = [0u8; 256];
    let n = getsockopt_raw(fd, libc::IPPROTO_TCP, libc::TCP_INFO, &mut b)?;
    // struct tcp_info: tcpi_bytes_acked is the u64 at offset 120 (Linux 4.1+).
    if n < 128 {
        return Err(io::Error::other(
            "TCP_INFO has no tcpi_bytes_acked (Linux < 4.1)",
        ));
    }
    let acked = u64::from_ne_bytes(b[120..128].try_into().unwrap_or_default());
    Ok(acked + outq(fd)?.max(0) as u64)
}

/// Sets SO_RCVLOWAT. On TCP this also runs the socket's data_ready callback when data is
/// queued (tcp_set_rcvlowat), which makes a freshly attached psock read what arrived before.
pub fn set_rcvlowat(fd: BorrowedFd<'_>, v: i32) -> io::Result<()> {
    // SAFETY: the option value is a live c_int of the size passed.
    cvt(unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVLOWAT,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::fd::AsFd;

    #[test]
    fn tcp_facts() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut s, _) = l.accept().unwrap();
        assert_eq!(domain(c.as_fd()).unwrap(), libc::AF_INET);
        assert_ne!(cookie(c.as_fd()).unwrap(), cookie(s.as_fd()).unwrap());
        let w0 = tcp_written(c.as_fd()).unwrap();
        c.write_all(&[7u8; 10000]).unwrap();
        let mut buf = vec![0u8; 10000];
        s.read_exact(&mut buf).unwrap();
        assert_eq!(tcp_written(c.as_fd()).unwrap() - w0, 10000);
        assert_eq!(inq(s.as_fd()).unwrap(), 0);
        assert_eq!(rmem_alloc(s.as_fd()).unwrap(), 0);
        assert_eq!(drops(s.as_fd()).unwrap(), 0);
        set_rcvlowat(s.as_fd(), 1).unwrap();
    }

    #[test]
    fn drops_counts_datagrams_the_kernel_dropped() {
        let r = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        socket2::SockRef::from(&r).set_recv_buffer_size(1).unwrap();
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        for _ in 0..64 {
            s.send_to(&[0u8; 1000], r.local_addr().unwrap()).unwrap();
        }
        assert!(drops(r.as_fd()).unwrap() > 0);
    }
}
