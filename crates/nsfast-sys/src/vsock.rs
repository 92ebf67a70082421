//! Minimal `AF_VSOCK` stream sockets over raw syscalls: listen, accept, connect, read, write.
//!
//! Only what nsfast's own code and VM tests need. Nothing in this crate opens a vsock socket
//! by itself; callers decide where that is allowed (inside test guests, never on a host whose
//! vsock device belongs to someone else).

use crate::syscall::cvt;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// `VMADDR_CID_LOCAL`: the local (loopback) context id.
pub const VMADDR_CID_LOCAL: u32 = 1;
/// `VMADDR_CID_HOST`: the host, seen from a guest.
pub const VMADDR_CID_HOST: u32 = 2;
/// `VMADDR_CID_ANY`: bind on any context id.
pub const VMADDR_CID_ANY: u32 = u32::MAX;

/// A vsock address: context id and port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VsockAddr {
    pub cid: u32,
    pub port: u32,
}

impl std::fmt::Display for VsockAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "vsock {}:{}", self.cid, self.port)
    }
}

/// `VMADDR_FLAG_TO_HOST` (svm_flags): route to the host even for a CID that is not the host's,
/// so a guest reaches a sibling VM through a host-side bridge (Linux 5.10+).
pub const VMADDR_FLAG_TO_HOST: u8 = 0x01;
/// `SO_VM_SOCKETS_BUFFER_SIZE` / `_MIN_SIZE` / `_MAX_SIZE` at level AF_VSOCK (u64 values).
pub const SO_VM_SOCKETS_BUFFER_SIZE: libc::c_int = 0;
pub const SO_VM_SOCKETS_BUFFER_MIN_SIZE: libc::c_int = 1;
pub const SO_VM_SOCKETS_BUFFER_MAX_SIZE: libc::c_int = 2;

fn sockaddr(addr: VsockAddr) -> libc::sockaddr_vm {
    sockaddr_flags(addr, 0)
}

fn sockaddr_flags(addr: VsockAddr, flags: u8) -> libc::sockaddr_vm {
    // SAFETY: sockaddr_vm is a plain C struct for which all-zero bytes are a valid value.
    let mut sa: libc::sockaddr_vm = unsafe { std::mem::zeroed() };
    sa.svm_family = libc::AF_VSOCK as libc::sa_family_t;
    sa.svm_cid = addr.cid;
    sa.svm_port = addr.port;
    // svm_flags is the first byte of svm_zero in the libc definition.
    sa.svm_zero[0] = flags;
    sa
}

/// Sets SO_VM_SOCKETS_BUFFER_SIZE, raising the maximum first (or the size is clamped to it).
pub fn set_buffer_size(fd: BorrowedFd<'_>, size: u64) -> io::Result<()> {
    for opt in [SO_VM_SOCKETS_BUFFER_MAX_SIZE, SO_VM_SOCKETS_BUFFER_SIZE] {
        // SAFETY: the option value is a u64 that lives across the call and its size is passed.
        cvt(unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::AF_VSOCK,
                opt,
                (&size as *const u64).cast(),
                std::mem::size_of::<u64>() as libc::socklen_t,
            )
        })?;
    }
    Ok(())
}

fn stream_socket() -> io::Result<OwnedFd> {
    // SAFETY: socket(2) takes no pointers; a non-negative result is a new fd we own.
    let fd = unsafe { libc::socket(libc::AF_VSOCK, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd was just returned by socket(2) and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

type NameFn =
    unsafe extern "C" fn(libc::c_int, *mut libc::sockaddr, *mut libc::socklen_t) -> libc::c_int;

/// getsockname / getpeername on a vsock socket.
fn sock_name(fd: BorrowedFd<'_>, f: NameFn) -> io::Result<VsockAddr> {
    let mut sa = sockaddr(VsockAddr { cid: 0, port: 0 });
    let mut len = std::mem::size_of::<libc::sockaddr_vm>() as libc::socklen_t;
    // SAFETY: fd is a live socket; sa and len are valid for writes of a sockaddr_vm and its
    // length, which is what getsockname/getpeername write at most.
    cvt(unsafe {
        f(
            fd.as_raw_fd(),
            &mut sa as *mut libc::sockaddr_vm as *mut libc::sockaddr,
            &mut len,
        )
    })?;
    if i32::from(sa.svm_family) != libc::AF_VSOCK {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not an AF_VSOCK socket",
        ));
    }
    Ok(VsockAddr {
        cid: sa.svm_cid,
        port: sa.svm_port,
    })
}

/// A listening vsock stream socket.
#[derive(Debug)]
pub struct VsockListener {
    fd: OwnedFd,
}

impl VsockListener {
    /// Binds to `addr` and listens.
    pub fn bind(addr: VsockAddr) -> io::Result<Self> {
        Self::bind_with(addr, None)
    }

    /// Binds to `addr` and listens; accepted sockets inherit the vsock buffer size.
    pub fn bind_with(addr: VsockAddr, buffer: Option<u64>) -> io::Result<Self> {
        let fd = stream_socket()?;
        if let Some(b) = buffer {
            set_buffer_size(fd.as_fd(), b)?;
        }
        let sa = sockaddr(addr);
        // SAFETY: fd is a live socket; sa is a valid sockaddr_vm and its exact size is passed.
        cvt(unsafe {
            libc::bind(
                fd.as_raw_fd(),
                &sa as *const libc::sockaddr_vm as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_vm>() as libc::socklen_t,
            )
        })
        .map_err(|e| io::Error::new(e.kind(), format!("bind {addr}: {e}")))?;
        // SAFETY: fd is a live, bound socket.
        cvt(unsafe { libc::listen(fd.as_raw_fd(), 128) })
            .map_err(|e| io::Error::new(e.kind(), format!("listen {addr}: {e}")))?;
        Ok(Self { fd })
    }

    /// Wraps a listening vsock socket.
    pub fn from_fd(fd: OwnedFd) -> Self {
        Self { fd }
    }

    /// Accepts one connection, retrying on EINTR.
    pub fn accept(&self) -> io::Result<(VsockStream, VsockAddr)> {
        loop {
            let mut sa = sockaddr(VsockAddr { cid: 0, port: 0 });
            let mut len = std::mem::size_of::<libc::sockaddr_vm>() as libc::socklen_t;
            // SAFETY: fd is a listening socket; sa and len are valid for writes of a
            // sockaddr_vm and its length.
            let r = unsafe {
                libc::accept4(
                    self.fd.as_raw_fd(),
                    &mut sa as *mut libc::sockaddr_vm as *mut libc::sockaddr,
                    &mut len,
                    libc::SOCK_CLOEXEC,
                )
            };
            match cvt(r) {
                Ok(fd) => {
                    // SAFETY: fd is a new connected socket returned by accept4 that we own.
                    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
                    let stream = VsockStream { fd };
                    return Ok((
                        stream,
                        VsockAddr {
                            cid: sa.svm_cid,
                            port: sa.svm_port,
                        },
                    ));
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }
}

impl AsFd for VsockListener {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// A connected vsock stream socket.
#[derive(Debug)]
pub struct VsockStream {
    fd: OwnedFd,
}

impl VsockStream {
    /// Connects to `addr`.
    pub fn connect(addr: VsockAddr) -> io::Result<Self> {
        Self::connect_with(addr, false, None)
    }

    /// Connects to `addr`, with VMADDR_FLAG_TO_HOST when `to_host`, and a vsock buffer size.
    pub fn connect_with(addr: VsockAddr, to_host: bool, buffer: Option<u64>) -> io::Result<Self> {
        let fd = stream_socket()?;
        if let Some(b) = buffer {
            set_buffer_size(fd.as_fd(), b)?;
        }
        let sa = sockaddr_flags(addr, if to_host { VMADDR_FLAG_TO_HOST } else { 0 });
        loop {
            // SAFETY: fd is a live socket; sa is a valid sockaddr_vm and its size is passed.
            let r = unsafe {
                libc::connect(
                    fd.as_raw_fd(),
                    &sa as *const libc::sockaddr_vm as *const libc::sockaddr,
                    std::mem::size_of::<libc::sockaddr_vm>() as libc::socklen_t,
                )
            };
            match cvt(r) {
                Ok(_) => return Ok(Self { fd }),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(io::Error::new(e.kind(), format!("connect {addr}: {e}"))),
            }
        }
    }

    /// The local address (getsockname). On a host, a connection accepted by a listener bound
    /// to `VMADDR_CID_ANY` carries the CID the guest dialled: `VMADDR_CID_HOST`, or a sibling's
    /// CID when the guest set `VMADDR_FLAG_TO_HOST`.
    pub fn local_addr(&self) -> io::Result<VsockAddr> {
        sock_name(self.fd.as_fd(), libc::getsockname)
    }

    /// The peer's address (getpeername).
    pub fn peer_addr(&self) -> io::Result<VsockAddr> {
        sock_name(self.fd.as_fd(), libc::getpeername)
    }

    /// Shuts down the write half (the peer reads end of stream).
    pub fn shutdown_write(&self) -> io::Result<()> {
        // SAFETY: fd is a live connected socket.
        cvt(unsafe { libc::shutdown(self.fd.as_raw_fd(), libc::SHUT_WR) }).map(|_| ())
    }
}

impl From<VsockStream> for OwnedFd {
    fn from(s: VsockStream) -> OwnedFd {
        s.fd
    }
}

impl From<VsockListener> for OwnedFd {
    fn from(l: VsockListener) -> OwnedFd {
        l.fd
    }
}

impl AsFd for VsockStream {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl Read for &VsockStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            // SAFETY: fd is a live socket; buf is valid for writes of buf.len() bytes.
            let r = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if r >= 0 {
                return Ok(r as usize);
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}

impl Write for &VsockStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        loop {
            // SAFETY: fd is a live socket; buf is valid for reads of buf.len() bytes.
            let r = unsafe { libc::write(self.fd.as_raw_fd(), buf.as_ptr().cast(), buf.len()) };
            if r >= 0 {
                return Ok(r as usize);
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Read for VsockStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        (&*self).read(buf)
    }
}

impl Write for VsockStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        (&*self).write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
