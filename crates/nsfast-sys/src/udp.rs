//! Batched IPv4 UDP I/O for relays: `recvmmsg` with UDP GRO and `IP_ORIGDSTADDR`,
//! `sendmmsg` with UDP GSO (coalescing equal-sized datagrams into one super-datagram without
//! copying, via one iovec per datagram), transparent-socket options, socket buffer sizing,
//! and file-descriptor passing over Unix sockets (SCM_RIGHTS).
//!
//! Modelled on quinn-udp: offloads are probed at socket setup (`ENOPROTOOPT`/`EINVAL` mean
//! "unsupported", not an error), the kernel-version checks are cached, GSO is dropped at run
//! time when a send fails with `EIO`/`EINVAL`, and `EINTR` is retried in one place.

use std::io;
use std::mem::{size_of, zeroed};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};

use crate::cmsg::{self, Encoder};
use crate::kernel::KernelVersion;
use crate::syscall::cvt;

/// Most segments the kernel accepts in one GSO send (UDP_MAX_SEGMENTS).
pub const MAX_GSO_SEGMENTS: usize = 64;
/// Largest UDP payload of one (super-)datagram over IPv4.
pub const MAX_PAYLOAD: usize = 65507;
/// Receive slot size: a GRO super-datagram fits.
pub const SLOT: usize = 65536;

const UDP_SEGMENT: libc::c_int = 103;
const UDP_GRO: libc::c_int = 104;

fn setsockopt_int(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
    v: libc::c_int,
) -> io::Result<()> {
    // SAFETY: `v` lives for the call and its size is passed; the kernel copies it.
    cvt(unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&v as *const libc::c_int).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    })
    .map(drop)
}

fn unsupported(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOPROTOOPT) | Some(libc::EINVAL) | Some(libc::EOPNOTSUPP)
    )
}

/// Whether this kernel can do UDP GSO (≥ 4.18) — checked once, then per socket.
pub fn kernel_has_gso() -> bool {
    KernelVersion::current().at_least(4, 18)
}

/// Whether this kernel can do UDP GRO (≥ 5.0).
pub fn kernel_has_gro() -> bool {
    KernelVersion::current().at_least(5, 0)
}

/// Probes GSO on `fd` by a trial `UDP_SEGMENT` setsockopt (reset to 0 afterwards).
pub fn probe_gso(fd: BorrowedFd<'_>) -> bool {
    if !kernel_has_gso() {
        return false;
    }
    let fd = fd.as_raw_fd();
    match setsockopt_int(fd, libc::SOL_UDP, UDP_SEGMENT, 1200) {
        Ok(()) => {
            let _ = setsockopt_int(fd, libc::SOL_UDP, UDP_SEGMENT, 0);
            true
        }
        Err(_) => false,
    }
}

/// Turns UDP GRO on for `fd`. `Ok(false)` when the kernel lacks it.
pub fn enable_gro(fd: BorrowedFd<'_>) -> io::Result<bool> {
    if !kernel_has_gro() {
        return Ok(false);
    }
    match setsockopt_int(fd.as_raw_fd(), libc::SOL_UDP, UDP_GRO, 1) {
        Ok(()) => Ok(true),
        Err(e) if unsupported(&e) => Ok(false),
        Err(e) => Err(e),
    }
}

/// `IP_TRANSPARENT`: bind to and send from non-local addresses (CAP_NET_ADMIN).
pub fn set_transparent(fd: BorrowedFd<'_>) -> io::Result<()> {
    setsockopt_int(fd.as_raw_fd(), libc::SOL_IP, libc::IP_TRANSPARENT, 1)
}

/// `SO_RCVMARK` (Linux ≥ 5.19; not in every libc build yet).
const SO_RCVMARK: libc::c_int = 75;

/// `SO_RCVMARK`: deliver each datagram's packet mark (`skb->mark`) as a control message
/// (`SOL_SOCKET`/`SO_MARK`). Fails with ENOPROTOOPT on kernels before 5.19.
pub fn set_recv_mark(fd: BorrowedFd<'_>) -> io::Result<()> {
    setsockopt_int(fd.as_raw_fd(), libc::SOL_SOCKET, SO_RCVMARK, 1)
}

/// `IP_RECVORIGDSTADDR`: deliver each datagram's original destination as a control message.
pub fn set_recv_orig_dst(fd: BorrowedFd<'_>) -> io::Result<()> {
    setsockopt_int(fd.as_raw_fd(), libc::SOL_IP, libc::IP_RECVORIGDSTADDR, 1)
}

/// `SO_REUSEADDR`.
pub fn set_reuseaddr(fd: BorrowedFd<'_>) -> io::Result<()> {
    setsockopt_int(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_REUSEADDR, 1)
}

/// `SO_RCVTIMEO`, so blocking receives wake up to check for shutdown.
pub fn set_recv_timeout(fd: BorrowedFd<'_>, t: std::time::Duration) -> io::Result<()> {
    let tv = libc::timeval {
        tv_sec: t.as_secs() as libc::time_t,
        tv_usec: t.subsec_micros() as libc::suseconds_t,
    };
    // SAFETY: `tv` lives for the call and its size is passed; the kernel copies it.
    cvt(unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            size_of::<libc::timeval>() as libc::socklen_t,
        )
    })
    .map(drop)
}

/// Asks for `want` bytes of receive and send buffer; returns what the kernel granted
/// (as `getsockopt` reports it: the kernel doubles the request, capped by
/// `net.core.[rw]mem_max`), halved back to be comparable with `want`.
pub fn set_buffers(fd: BorrowedFd<'_>, want: usize) -> io::Result<(usize, usize)> {
    let s = socket2::SockRef::from(&fd);
    s.set_recv_buffer_size(want)?;
    s.set_send_buffer_size(want)?;
    Ok((s.recv_buffer_size()? / 2, s.send_buffer_size()? / 2))
}

fn sockaddr_v4(a: &libc::sockaddr_in) -> SocketAddrV4 {
    SocketAddrV4::new(
        Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)),
        u16::from_be(a.sin_port),
    )
}

fn to_sockaddr(a: SocketAddrV4) -> libc::sockaddr_in {
    // SAFETY: sockaddr_in is plain data; all-zero is a valid value.
    let mut s: libc::sockaddr_in = unsafe { zeroed() };
    s.sin_family = libc::AF_INET as libc::sa_family_t;
    s.sin_port = a.port().to_be();
    s.sin_addr.s_addr = u32::from(*a.ip()).to_be();
    s
}

/// What one received message carried besides its bytes.
#[derive(Debug, Clone, Copy, Default)]
pub struct RecvMeta {
    /// Bytes received (a GRO super-datagram may hold several datagrams).
    pub len: usize,
    /// Size of each datagram in it (the last may be shorter); `len` without GRO.
    pub stride: usize,
    /// The sender.
    pub src: Option<SocketAddrV4>,
    /// The original destination (with `IP_RECVORIGDSTADDR`).
    pub orig_dst: Option<SocketAddrV4>,
    /// The packet mark (with [`set_recv_mark`]).
    pub mark: Option<u32>,
}

/// Receive control buffer per datagram: UDP_GRO and IP_ORIGDSTADDR fit.
const CTRL: usize = 128;
/// Send control buffer per message: one UDP_SEGMENT.
const GSO_CTRL: usize = cmsg::space(size_of::<u16>());

/// What the control messages of one received datagram say.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CmsgInfo {
    /// `UDP_GRO`: the size of each datagram in a coalesced super-datagram.
    pub gro_stride: Option<usize>,
    /// `IP_ORIGDSTADDR`: the datagram's original destination.
    pub orig_dst: Option<SocketAddrV4>,
    /// `SO_MARK` (with `SO_RCVMARK`): the datagram's packet mark.
    pub mark: Option<u32>,
}

/// Reads the control buffer of one received datagram as `recvmsg` filled it (`msg_control`,
/// `msg_controllen` bytes), through the bounds-checked [`cmsg::Iter`].
#[doc(hidden)]
pub fn parse_cmsgs(ctrl: &[u8]) -> CmsgInfo {
    let mut info = CmsgInfo::default();
    for c in cmsg::Iter::new(ctrl) {
        match (c.level, c.ty) {
            (libc::SOL_UDP, UDP_GRO) => {
                if let Some(s) = c.decode::<libc::c_int>().filter(|&s| s > 0) {
                    info.gro_stride = Some(s as usize);
                }
            }
            (libc::SOL_SOCKET, libc::SO_MARK) => {
                if let Some(m) = c.decode::<u32>() {
                    info.mark = Some(m);
                }
            }
            (libc::SOL_IP, libc::IP_ORIGDSTADDR) => {
                if let Some(a) = c
                    .decode::<libc::sockaddr_in>()
                    .filter(|a| a.sin_family == libc::AF_INET as libc::sa_family_t)
                {
                    info.orig_dst = Some(sockaddr_v4(&a));
                }
            }
            _ => {}
        }
    }
    info
}

/// A reusable `recvmmsg` batch: `n` slots of [`SLOT`] bytes.
pub struct RecvBatch {
    bufs: Vec<u8>,
    names: Vec<libc::sockaddr_in>,
    ctrl: Vec<cmsg::Buf<CTRL>>,
    iovs: Vec<libc::iovec>,
    hdrs: Vec<libc::mmsghdr>,
    meta: Vec<RecvMeta>,
}

// SAFETY: the raw pointers inside `iovs`/`hdrs` point only into this struct's own heap
// buffers and are rebuilt before every use; nothing is shared between threads.
unsafe impl Send for RecvBatch {}

impl RecvBatch {
    pub fn new(n: usize) -> Self {
        let n = n.max(1);
        Self {
            bufs: vec![0; n * SLOT],
            // SAFETY: sockaddr_in is plain data; all-zero is valid.
            names: vec![unsafe { zeroed() }; n],
            ctrl: vec![cmsg::Buf::new(); n],
            // SAFETY: iovec is plain data; all-zero (null, 0) is valid.
            iovs: vec![unsafe { zeroed() }; n],
            // SAFETY: mmsghdr is plain data; all-zero is valid.
            hdrs: vec![unsafe { zeroed() }; n],
            meta: vec![RecvMeta::default(); n],
        }
    }

    /// Blocks until at least one datagram arrives (or the socket's receive timeout
    /// expires: `WouldBlock`), then takes as many as are queued. Returns the count.
    pub fn recv(&mut self, fd: BorrowedFd<'_>) -> io::Result<usize> {
        let n = self.hdrs.len();
        for i in 0..n {
            self.iovs[i] = libc::iovec {
                // SAFETY: slot i lies within `bufs` (n * SLOT bytes).
                iov_base: unsafe { self.bufs.as_mut_ptr().add(i * SLOT) }.cast(),
                iov_len: SLOT,
            };
            let h = &mut self.hdrs[i].msg_hdr;
            h.msg_name = (&mut self.names[i] as *mut libc::sockaddr_in).cast();
            h.msg_namelen = size_of::<libc::sockaddr_in>() as libc::socklen_t;
            h.msg_iov = &mut self.iovs[i];
            h.msg_iovlen = 1;
            h.msg_control = self.ctrl[i].0.as_mut_ptr().cast();
            h.msg_controllen = CTRL as _;
            h.msg_flags = 0;
            self.hdrs[i].msg_len = 0;
        }
        let got = loop {
            // SAFETY: every header points at live buffers owned by `self` with the
            // lengths given; the kernel writes at most those lengths.
            let r = unsafe {
                libc::recvmmsg(
                    fd.as_raw_fd(),
                    self.hdrs.as_mut_ptr(),
                    n as libc::c_uint,
                    libc::MSG_WAITFORONE,
                    std::ptr::null_mut(),
                )
            };
            if r >= 0 {
                break r as usize;
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        };
        for i in 0..got {
            let len = self.hdrs[i].msg_len as usize;
            let mut m = RecvMeta {
                len,
                stride: len,
                src: None,
                orig_dst: None,
                mark: None,
            };
            if self.hdrs[i].msg_hdr.msg_namelen as usize >= size_of::<libc::sockaddr_in>()
                && self.names[i].sin_family == libc::AF_INET as libc::sa_family_t
            {
                m.src = Some(sockaddr_v4(&self.names[i]));
            }
            #[allow(clippy::unnecessary_cast)] // size_t on glibc, socklen_t on musl
            let clen = (self.hdrs[i].msg_hdr.msg_controllen as usize).min(CTRL);
            let info = parse_cmsgs(&self.ctrl[i].0[..clen]);
            if let Some(s) = info.gro_stride {
                m.stride = s;
            }
            m.orig_dst = info.orig_dst;
            m.mark = info.mark;
            self.meta[i] = m;
        }
        Ok(got)
    }

    /// Message `i` of the last `recv`.
    pub fn get(&self, i: usize) -> (&[u8], &RecvMeta) {
        let m = &self.meta[i];
        (&self.bufs[i * SLOT..i * SLOT + m.len], m)
    }
}

/// One message to send: iovec range, GSO segment size (0 = none) and destination.
#[derive(Debug, Clone, Copy)]
struct Pending {
    iov_start: usize,
    iov_end: usize,
    seg: usize,
    total: usize,
    segments: usize,
    open: bool,
    dst: Option<SocketAddrV4>,
}

/// A reusable `sendmmsg` batch that coalesces datagrams into GSO sends.
///
/// Push datagrams (or GRO super-datagrams) borrowed from a [`RecvBatch`], then `flush`.
/// Without GSO every datagram goes out on its own (still batched by `sendmmsg`).
pub struct SendBatch {
    gso: AtomicBool,
    iovs: Vec<libc::iovec>,
    msgs: Vec<Pending>,
    names: Vec<libc::sockaddr_in>,
    ctrl: Vec<cmsg::Buf<GSO_CTRL>>,
    hdrs: Vec<libc::mmsghdr>,
}

// SAFETY: the raw pointers in `iovs` borrow buffers only between `push` and `flush` on the
// same thread (callers hold the borrow); `hdrs` is rebuilt in every `flush`.
unsafe impl Send for SendBatch {}

/// Statistics of one flush.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sent {
    pub datagrams: usize,
    pub dropped: usize,
}

impl SendBatch {
    pub fn new(gso: bool) -> Self {
        Self {
            gso: AtomicBool::new(gso),
            iovs: Vec::new(),
            msgs: Vec::new(),
            names: Vec::new(),
            ctrl: Vec::new(),
            hdrs: Vec::new(),
        }
    }

    /// Whether GSO is (still) in use.
    pub fn gso(&self) -> bool {
        self.gso.load(Ordering::Relaxed)
    }

    fn push_iov(&mut self, data: &[u8]) {
        self.iovs.push(libc::iovec {
            iov_base: data.as_ptr() as *mut libc::c_void,
            iov_len: data.len(),
        });
    }

    /// Queues `data`, which holds datagrams of `stride` bytes (the last may be shorter),
    /// for `dst` (None on a connected socket). The bytes must stay alive and unchanged
    /// until `flush` returns.
    pub fn push(&mut self, data: &[u8], stride: usize, dst: Option<SocketAddrV4>) {
        if data.is_empty() {
            // A zero-length datagram is still a datagram.
            let i = self.iovs.len();
            self.push_iov(data);
            self.msgs.push(Pending {
                iov_start: i,
                iov_end: i + 1,
                seg: 0,
                total: 0,
                segments: 1,
                open: false,
                dst,
            });
            return;
        }
        let stride = stride.clamp(1, data.len());
        if !self.gso() {
            for chunk in data.chunks(stride) {
                let i = self.iovs.len();
                self.push_iov(chunk);
                self.msgs.push(Pending {
                    iov_start: i,
                    iov_end: i + 1,
                    seg: 0,
                    total: chunk.len(),
                    segments: 1,
                    open: false,
                    dst,
                });
            }
            return;
        }
        let segments = data.len().div_ceil(stride);
        if segments == 1 {
            // A single datagram: append to the open message when sizes allow.
            if let Some(last) = self.msgs.last_mut() {
                if last.open
                    && last.dst == dst
                    && last.iov_end == self.iovs.len()
                    && data.len() <= last.seg
                    && last.segments < MAX_GSO_SEGMENTS
                    && last.total + data.len() <= MAX_PAYLOAD
                {
                    last.iov_end += 1;
                    last.total += data.len();
                    last.segments += 1;
                    last.open = data.len() == last.seg;
                    self.push_iov(data);
                    return;
                }
            }
            let i = self.iovs.len();
            self.push_iov(data);
            self.msgs.push(Pending {
                iov_start: i,
                iov_end: i + 1,
                seg: data.len(),
                total: data.len(),
                segments: 1,
                open: true,
                dst,
            });
            return;
        }
        // A GRO super-datagram: send as it came, one GSO message.
        let i = self.iovs.len();
        self.push_iov(data);
        self.msgs.push(Pending {
            iov_start: i,
            iov_end: i + 1,
            seg: stride,
            total: data.len(),
            segments,
            open: false,
            dst,
        });
    }

    pub fn is_empty(&self) -> bool {
        self.msgs.is_empty()
    }

    /// Rewrites the queued messages from `from` on as single datagrams (GSO dropped).
    fn split_from(&mut self, from: usize) {
        let rest: Vec<Pending> = self.msgs.drain(from..).collect();
        let iovs = self.iovs.clone();
        for m in rest {
            for iov in &iovs[m.iov_start..m.iov_end] {
                let step = if m.seg == 0 {
                    iov.iov_len.max(1)
                } else {
                    m.seg
                };
                let mut off = 0;
                loop {
                    let len = step.min(iov.iov_len - off);
                    let i = self.iovs.len();
                    self.iovs.push(libc::iovec {
                        // SAFETY: off + len <= iov_len: stays within the caller's buffer.
                        iov_base: unsafe { iov.iov_base.cast::<u8>().add(off) }.cast(),
                        iov_len: len,
                    });
                    self.msgs.push(Pending {
                        iov_start: i,
                        iov_end: i + 1,
                        seg: 0,
                        total: len,
                        segments: 1,
                        open: false,
                        dst: m.dst,
                    });
                    off += len;
                    if off >= iov.iov_len {
                        break;
                    }
                }
            }
        }
    }

    /// Sends everything queued on `fd` (blocking). Datagrams the kernel refuses
    /// (ICMP errors such as ECONNREFUSED, ENOBUFS, EPERM) are counted as dropped, like a
    /// network would drop them. If a GSO send fails with EIO/EINVAL, GSO is turned off for
    /// this batch for good and the rest goes out as single datagrams.
    pub fn flush(&mut self, fd: BorrowedFd<'_>) -> io::Result<Sent> {
        let mut sent = Sent::default();
        let mut start = 0;
        while start < self.msgs.len() {
            let n = self.msgs.len() - start;
            // SAFETY: sockaddr_in / mmsghdr are plain data; all-zero is valid.
            self.names.resize(n, unsafe { zeroed() });
            self.ctrl.resize(n, cmsg::Buf::new());
            // SAFETY: as above.
            self.hdrs.resize(n, unsafe { zeroed() });
            for k in 0..n {
                let m = self.msgs[start + k];
                // SAFETY: mmsghdr is plain data; all-zero is valid.
                let mut h: libc::mmsghdr = unsafe { zeroed() };
                h.msg_hdr.msg_iov = self.iovs[m.iov_start..].as_mut_ptr();
                h.msg_hdr.msg_iovlen = m.iov_end - m.iov_start;
                if let Some(d) = m.dst {
                    self.names[k] = to_sockaddr(d);
                    h.msg_hdr.msg_name = (&mut self.names[k] as *mut libc::sockaddr_in).cast();
                    h.msg_hdr.msg_namelen = size_of::<libc::sockaddr_in>() as libc::socklen_t;
                }
                if m.seg != 0 && m.segments > 1 {
                    let buf = &mut self.ctrl[k].0;
                    let mut enc = Encoder::new(buf);
                    enc.push(libc::SOL_UDP, UDP_SEGMENT, &(m.seg as u16))
                        .expect("GSO_CTRL holds one UDP_SEGMENT message");
                    h.msg_hdr.msg_controllen = enc.len() as _;
                    h.msg_hdr.msg_control = buf.as_mut_ptr().cast();
                }
                self.hdrs[k] = h;
            }
            // SAFETY: headers point at live iovecs/names/control buffers owned by `self`,
            // whose iovecs point at the caller's buffers (alive until we return).
            let r = unsafe {
                libc::sendmmsg(fd.as_raw_fd(), self.hdrs.as_mut_ptr(), n as libc::c_uint, 0)
            };
            if r > 0 {
                for k in 0..r as usize {
                    sent.datagrams += self.msgs[start + k].segments;
                }
                start += r as usize;
                continue;
            }
            let e = io::Error::last_os_error();
            let first = self.msgs[start];
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EIO) | Some(libc::EINVAL) if first.seg != 0 && first.segments > 1 => {
                    if self.gso.swap(false, Ordering::Relaxed) {
                        tracing::warn!(
                            "UDP GSO send failed ({e}); sending single datagrams from now on"
                        );
                    }
                    self.split_from(start);
                }
                Some(libc::ECONNREFUSED)
                | Some(libc::ENOBUFS)
                | Some(libc::EPERM)
                | Some(libc::EHOSTUNREACH)
                | Some(libc::ENETUNREACH)
                | Some(libc::EMSGSIZE) => {
                    sent.dropped += first.segments;
                    start += 1;
                }
                _ => {
                    self.clear();
                    return Err(e);
                }
            }
        }
        self.clear();
        Ok(sent)
    }

    /// Forgets everything queued.
    pub fn clear(&mut self) {
        self.iovs.clear();
        self.msgs.clear();
    }
}

/// Sends `fd` and a small message over a Unix socket (SCM_RIGHTS).
pub fn send_fd(sock: BorrowedFd<'_>, msg: &[u8], fd: BorrowedFd<'_>) -> io::Result<()> {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
    let fds = [fd.as_raw_fd()];
    let iov = [io::IoSlice::new(msg)];
    let cmsg = [ControlMessage::ScmRights(&fds)];
    loop {
        match sendmsg::<()>(sock.as_raw_fd(), &iov, &cmsg, MsgFlags::empty(), None) {
            Ok(_) => return Ok(()),
            Err(nix::Error::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Receives a message and at most one file descriptor sent with [`send_fd`].
/// Returns the bytes read (0 = peer closed) and the descriptor if one came.
pub fn recv_fd(sock: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<(usize, Option<OwnedFd>)> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    let mut space = nix::cmsg_space!([RawFd; 1]);
    loop {
        let mut iov = [io::IoSliceMut::new(buf)];
        match recvmsg::<()>(
            sock.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Ok(r) => {
                let mut got = None;
                for c in r.cmsgs()? {
                    if let ControlMessageOwned::ScmRights(fds) = c {
                        for f in fds {
                            // SAFETY: the kernel just installed `f` in our table for us;
                            // nobody else owns it.
                            let owned = unsafe { OwnedFd::from_raw_fd(f) };
                            if got.is_none() {
                                got = Some(owned);
                            }
                        }
                    }
                }
                return Ok((r.bytes, got));
            }
            Err(nix::Error::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::UdpSocket;
    use std::os::fd::AsFd;

    fn pair() -> (UdpSocket, UdpSocket) {
        let a = UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = UdpSocket::bind("127.0.0.1:0").unwrap();
        a.connect(b.local_addr().unwrap()).unwrap();
        b.connect(a.local_addr().unwrap()).unwrap();
        (a, b)
    }

    fn roundtrip(gso: bool, gro: bool) {
        let (a, b) = pair();
        set_buffers(b.as_fd(), 4 << 20).unwrap();
        if gro {
            enable_gro(b.as_fd()).unwrap();
        }
        let use_gso = gso && probe_gso(a.as_fd());
        let mut tx = SendBatch::new(use_gso);
        let payloads: Vec<Vec<u8>> = (0..100u32)
            .map(|i| {
                let len = if i == 99 { 100 } else { 1420 };
                (0..len).map(|j| (i as usize + j) as u8).collect()
            })
            .collect();
        for p in &payloads {
            tx.push(p, p.len(), None);
        }
        let s = tx.flush(a.as_fd()).unwrap();
        assert_eq!(s.datagrams, 100);
        set_recv_timeout(b.as_fd(), std::time::Duration::from_secs(2)).unwrap();
        let mut rx = RecvBatch::new(8);
        let mut got: Vec<Vec<u8>> = Vec::new();
        while got.len() < 100 {
            let n = rx.recv(b.as_fd()).unwrap();
            for i in 0..n {
                let (d, m) = rx.get(i);
                for c in d.chunks(m.stride.max(1)) {
                    got.push(c.to_vec());
                }
                assert_eq!(
                    m.src,
                    Some(match a.local_addr().unwrap() {
                        std::net::SocketAddr::V4(v) => v,
                        _ => unreachable!(),
                    })
                );
            }
        }
        assert_eq!(got, payloads);
    }

    #[test]
    fn batches_round_trip_with_and_without_offloads() {
        roundtrip(false, false);
        roundtrip(true, false);
        roundtrip(true, true);
        roundtrip(false, true);
    }

    #[test]
    fn coalesces_and_splits_when_gso_is_dropped() {
        let a = vec![1u8; 1000];
        let b = vec![2u8; 1000];
        let c = vec![3u8; 500];
        let d = vec![4u8; 1000];
        let mut tx = SendBatch::new(true);
        tx.push(&a, 1000, None);
        tx.push(&b, 1000, None);
        tx.push(&c, 500, None); // shorter: closes the GSO message
        tx.push(&d, 1000, None); // starts a new one
        assert_eq!(tx.msgs.len(), 2);
        assert_eq!((tx.msgs[0].segments, tx.msgs[0].total), (3, 2500));
        let super_dgram = vec![5u8; 2500];
        tx.push(&super_dgram, 1000, None); // a GRO super-datagram stays one message
        assert_eq!(tx.msgs.len(), 3);
        // Dropping GSO (EIO/EINVAL) resends everything as single datagrams.
        tx.gso.store(false, Ordering::Relaxed);
        tx.split_from(0);
        let sizes: Vec<usize> = tx.msgs.iter().map(|m| m.total).collect();
        assert_eq!(sizes, vec![1000, 1000, 500, 1000, 1000, 1000, 500]);
        assert!(tx.msgs.iter().all(|m| m.segments == 1 && m.seg == 0));
    }

    #[test]
    fn passes_descriptors() {
        let (x, y) = std::os::unix::net::UnixStream::pair().unwrap();
        let u = UdpSocket::bind("127.0.0.1:0").unwrap();
        send_fd(x.as_fd(), b"hello", u.as_fd()).unwrap();
        let mut buf = [0u8; 16];
        let (n, fd) = recv_fd(y.as_fd(), &mut buf).unwrap();
        assert_eq!(&buf[..n], b"hello");
        let u2 = UdpSocket::from(fd.unwrap());
        assert_eq!(u2.local_addr().unwrap(), u.local_addr().unwrap());
    }

    fn cmsg(level: i32, ty: i32, data: &[u8]) -> Vec<u8> {
        let hdr = size_of::<libc::cmsghdr>();
        let mut b = vec![0u8; hdr];
        // SAFETY: `b` holds a whole cmsghdr; an unaligned write of plain data.
        unsafe {
            let mut c: libc::cmsghdr = zeroed();
            c.cmsg_len = (hdr + data.len()) as _;
            c.cmsg_level = level;
            c.cmsg_type = ty;
            std::ptr::write_unaligned(b.as_mut_ptr().cast(), c);
        }
        b.extend_from_slice(data);
        while !b.len().is_multiple_of(size_of::<usize>()) {
            b.push(0);
        }
        b
    }

    fn sin(a: Ipv4Addr, port: u16) -> Vec<u8> {
        let mut b = (libc::AF_INET as u16).to_ne_bytes().to_vec();
        b.extend_from_slice(&port.to_be_bytes());
        b.extend_from_slice(&a.octets());
        b.extend_from_slice(&[0; 8]);
        b
    }

    #[test]
    fn cmsgs_give_gro_stride_and_orig_dst() {
        let mut buf = cmsg(libc::SOL_UDP, UDP_GRO, &1420i32.to_ne_bytes());
        buf.extend(cmsg(
            libc::SOL_IP,
            libc::IP_ORIGDSTADDR,
            &sin(Ipv4Addr::new(10, 201, 0, 2), 51820),
        ));
        let info = parse_cmsgs(&buf);
        assert_eq!(info.gro_stride, Some(1420));
        assert_eq!(
            info.orig_dst,
            Some(SocketAddrV4::new(Ipv4Addr::new(10, 201, 0, 2), 51820))
        );
        assert_eq!(parse_cmsgs(&[]), CmsgInfo::default());
    }

    #[test]
    fn cmsgs_give_the_packet_mark() {
        let mut buf = cmsg(
            libc::SOL_IP,
            libc::IP_ORIGDSTADDR,
            &sin(Ipv4Addr::new(10, 201, 0, 2), 51820),
        );
        buf.extend(cmsg(libc::SOL_SOCKET, libc::SO_MARK, &7u32.to_ne_bytes()));
        let info = parse_cmsgs(&buf);
        assert_eq!(info.mark, Some(7));
        assert!(info.orig_dst.is_some());
        // A mark payload shorter than a u32 is no mark.
        let short = cmsg(libc::SOL_SOCKET, libc::SO_MARK, &[7, 0]);
        assert_eq!(parse_cmsgs(&short).mark, None);
    }

    /// A datagram on loopback carries the mark its sender set (SO_MARK needs CAP_NET_ADMIN,
    /// so this runs only as root); without SO_RCVMARK there is no mark message.
    #[test]
    fn recv_batch_reports_the_packet_mark() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: SO_MARK needs CAP_NET_ADMIN");
            return;
        }
        let rx = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        rx.set_read_timeout(Some(std::time::Duration::from_secs(2)))
            .unwrap();
        let tx = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        nix::sys::socket::setsockopt(&tx, nix::sys::socket::sockopt::Mark, &0x2a).unwrap();
        let mut batch = RecvBatch::new(2);
        tx.send_to(b"unmarked view", rx.local_addr().unwrap())
            .unwrap();
        assert_eq!(batch.recv(rx.as_fd()).unwrap(), 1);
        assert_eq!(batch.get(0).1.mark, None);
        set_recv_mark(rx.as_fd()).unwrap();
        tx.send_to(b"marked", rx.local_addr().unwrap()).unwrap();
        assert_eq!(batch.recv(rx.as_fd()).unwrap(), 1);
        assert_eq!(batch.get(0).1.mark, Some(0x2a));
    }

    /// Found by fuzz/fuzz_targets/udp_cmsg.rs (fuzz/corpus/udp_cmsg/regress-len-past-end):
    /// a first header whose cmsg_len runs past the buffer made the walker read a sockaddr_in
    /// beyond it (AddressSanitizer: heap-buffer-overflow); one whose cmsg_len is below the
    /// header size underflowed ("attempt to subtract with overflow").
    #[test]
    fn cmsg_walker_stays_inside_the_buffer() {
        // The buffer the walker is given is the first 17 bytes; what follows is a valid
        // address that must not be read.
        let mut outer = cmsg(
            libc::SOL_IP,
            libc::IP_ORIGDSTADDR,
            &sin(Ipv4Addr::new(1, 2, 3, 4), 99),
        );
        let hdr = size_of::<libc::cmsghdr>();
        outer[hdr..hdr + 2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
        assert_eq!(
            parse_cmsgs(&outer).orig_dst.map(|a| *a.ip()),
            Some(Ipv4Addr::new(1, 2, 3, 4))
        );
        assert_eq!(parse_cmsgs(&outer[..hdr + 1]), CmsgInfo::default());
        // cmsg_len smaller than the header itself.
        let mut short = cmsg(libc::SOL_UDP, UDP_GRO, &1420i32.to_ne_bytes());
        short[..size_of::<usize>()].copy_from_slice(&4usize.to_ne_bytes());
        assert_eq!(parse_cmsgs(&short), CmsgInfo::default());
        // A truncated second message is ignored; the first still counts.
        let mut two = cmsg(libc::SOL_UDP, UDP_GRO, &1000i32.to_ne_bytes());
        let first = two.len();
        two.extend(cmsg(
            libc::SOL_IP,
            libc::IP_ORIGDSTADDR,
            &sin(Ipv4Addr::new(1, 2, 3, 4), 99),
        ));
        let info = parse_cmsgs(&two[..first + hdr + 4]);
        assert_eq!((info.gro_stride, info.orig_dst), (Some(1000), None));
    }
}
