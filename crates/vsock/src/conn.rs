//! Opening addresses as plain file descriptors: listeners, connected sockets, stdio.

use std::io;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use socket2::SockRef;

use crate::addr::{Address, IpFamily};
use crate::hybrid::{self, HybridError};
use crate::unixsock::{BindError, BoundSocket};

/// Errors opening an address; each names the address.
#[derive(Debug, thiserror::Error)]
pub enum ConnError {
    #[error("{addr}: {op}")]
    Io {
        addr: String,
        op: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("{addr}")]
    Hybrid {
        addr: String,
        #[source]
        source: HybridError,
    },
    #[error("{addr}")]
    Bind {
        addr: String,
        #[source]
        source: BindError,
    },
}

fn io_err<'a>(addr: &'a Address, op: &'static str) -> impl FnOnce(io::Error) -> ConnError + 'a {
    move |source| ConnError::Io {
        addr: addr.to_string(),
        op,
        source,
    }
}

/// One connected end of a relay: a socket, or stdin+stdout.
#[derive(Debug)]
pub struct Conn {
    /// The socket, or a duplicate of stdin.
    read: OwnedFd,
    out: Output,
    write_closed: AtomicBool,
    pub label: String,
    /// Who connected, for `--max-per-source` (set by [`Listener::accept`]): the peer's IP for
    /// TCP, its CID for vsock, its uid (SO_PEERCRED) for UNIX.
    pub source: Option<String>,
}

/// Where a [`Conn`]'s data is written.
#[derive(Debug)]
enum Output {
    /// The socket in `read` (one descriptor both ways).
    Socket,
    /// The process's stdout (fd 1), borrowed from std's handle: it stays open for the
    /// process's lifetime ([`Conn::shutdown_write`] points it at /dev/null instead of closing
    /// it, so the number is never reused under a borrow).
    Stdout(io::Stdout),
}

impl Conn {
    pub fn from_socket(fd: OwnedFd, label: String) -> Self {
        Self {
            read: fd,
            out: Output::Socket,
            write_closed: AtomicBool::new(false),
            label,
            source: None,
        }
    }

    /// Standard input and output. The relay ends stdout when the other side's data ends.
    pub fn stdio() -> io::Result<Self> {
        // F_DUPFD_CLOEXEC: a descriptor of our own, 3 or above, closed on exec.
        let read = io::stdin().as_fd().try_clone_to_owned()?;
        Ok(Self {
            read,
            out: Output::Stdout(io::stdout()),
            write_closed: AtomicBool::new(false),
            label: "stdio".into(),
            source: None,
        })
    }

    pub fn is_socket(&self) -> bool {
        matches!(self.out, Output::Socket)
    }

    /// Whether this is an AF_VSOCK socket.
    pub fn is_vsock(&self) -> bool {
        self.is_socket()
            && SockRef::from(&self.read)
                .local_addr()
                .is_ok_and(|a| a.family() == libc::AF_VSOCK as libc::sa_family_t)
    }

    /// The descriptor data is read from, borrowed from this Conn.
    pub fn reader(&self) -> BorrowedFd<'_> {
        self.read.as_fd()
    }

    /// The descriptor data is written to, borrowed from this Conn. Writes after
    /// [`Conn::shutdown_write`] fail (EPIPE on a socket) or, for stdio, go to /dev/null.
    pub fn writer(&self) -> BorrowedFd<'_> {
        match &self.out {
            Output::Socket => self.read.as_fd(),
            Output::Stdout(s) => s.as_fd(),
        }
    }

    /// Signals end of data to the peer: shutdown(SHUT_WR) for a socket; for stdio, stdout's
    /// pipe or file is let go (fd 1 is pointed at /dev/null), so its reader sees the end.
    pub fn shutdown_write(&self) -> io::Result<()> {
        if self.write_closed.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        match &self.out {
            Output::Socket => match SockRef::from(&self.read).shutdown(Shutdown::Write) {
                Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => Ok(()),
                r => r,
            },
            Output::Stdout(_) => {
                let null = std::fs::OpenOptions::new().write(true).open("/dev/null")?;
                nix::unistd::dup2_stdout(&null).map_err(io::Error::from)
            }
        }
    }

    /// Tears both directions down (after an error), so a blocked reader on the other side ends.
    pub fn abort(&self) {
        if self.is_socket() {
            // Errors are irrelevant here: the connection is being given up.
            let _ = SockRef::from(&self.read).shutdown(Shutdown::Both);
        }
    }
}

/// A listening address. A UNIX listener's file is removed when it is dropped (or with
/// [`Listener::remove_socket`]), if it is still the one bound here.
#[derive(Debug)]
pub enum Listener {
    Tcp(TcpListener),
    Unix(BoundSocket),
    Vsock(OwnedFd, Address),
}

/// Options that apply when opening sockets.
#[derive(Debug, Clone, Copy, Default)]
pub struct SockOpts {
    /// SO_VM_SOCKETS_BUFFER_SIZE for vsock sockets.
    pub vsock_buffer: Option<u64>,
    /// Limit for opening a connecting address: the TCP or UNIX connect and the hybrid
    /// `CONNECT`/`OK` handshake together (None: no limit). AF_VSOCK connects keep the kernel's
    /// vsock connect timeout (2 s by default).
    pub connect_timeout: Option<Duration>,
}

impl Listener {
    pub fn open(addr: &Address, opts: SockOpts) -> Result<Self, ConnError> {
        match addr {
            Address::TcpListen {
                port, bind, family, ..
            } => {
                let ip = bind.unwrap_or(match family {
                    Some(IpFamily::V4) => std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
                    _ => std::net::IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
                });
                // std's TcpListener sets SO_REUSEADDR (socat's `reuseaddr`).
                let l = TcpListener::bind((ip, *port))
                    .or_else(|e| {
                        if bind.is_none() && family.is_none() {
                            TcpListener::bind((std::net::Ipv4Addr::UNSPECIFIED, *port))
                        } else {
                            Err(e)
                        }
                    })
                    .map_err(io_err(addr, "bind"))?;
                Ok(Listener::Tcp(l))
            }
            Address::UnixListen { path } | Address::HybridListen { path } => {
                let b = BoundSocket::bind(path).map_err(|source| ConnError::Bind {
                    addr: addr.to_string(),
                    source,
                })?;
                Ok(Listener::Unix(b))
            }
            Address::VsockListen { port, cid } => {
                let fd = vsock::listen(cid.unwrap_or(u32::MAX), *port, opts.vsock_buffer)
                    .map_err(io_err(addr, "listen"))?;
                Ok(Listener::Vsock(fd, addr.clone()))
            }
            _ => Err(io_err(addr, "listen")(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a listening address",
            ))),
        }
    }

    /// Accepts one connection; its label names the peer (TCP address, vsock CID:port, or the
    /// UNIX path with the peer's pid and uid) and `source` is set.
    pub fn accept(&self) -> io::Result<Conn> {
        let (c, source) = match self {
            Listener::Tcp(l) => {
                let (s, peer) = l.accept()?;
                let _ = s.set_nodelay(true);
                (
                    Conn::from_socket(s.into(), format!("tcp {peer}")),
                    format!("ip {}", peer.ip().to_canonical()),
                )
            }
            Listener::Unix(b) => {
                let (s, _) = b.listener.accept()?;
                let cred =
                    nix::sys::socket::getsockopt(&s, nix::sys::socket::sockopt::PeerCredentials);
                let (label, source) = match cred {
                    Ok(c) => (
                        format!(
                            "unix {} (pid {}, uid {})",
                            b.path.display(),
                            c.pid(),
                            c.uid()
                        ),
                        format!("uid {}", c.uid()),
                    ),
                    Err(_) => (format!("unix {}", b.path.display()), "uid ?".to_string()),
                };
                (Conn::from_socket(s.into(), label), source)
            }
            Listener::Vsock(fd, _) => {
                let (s, cid, port) = vsock::accept(fd)?;
                (
                    Conn::from_socket(s, format!("vsock {cid}:{port}")),
                    format!("cid {cid}"),
                )
            }
        };
        Ok(Conn {
            source: Some(source),
            ..c
        })
    }
}

impl Listener {
    /// Removes the listening socket file, if any and if still ours (on SIGINT/SIGTERM, when the
    /// process exits without dropping the listener).
    pub fn remove_socket(&self) {
        if let Listener::Unix(b) = self {
            b.remove();
        }
    }
}

fn timed_out(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, what)
}

/// Connects to TCP `host:port`, trying each address it resolves to, all within `timeout`.
fn tcp_connect(
    host: &str,
    port: u16,
    family: Option<IpFamily>,
    timeout: Option<Duration>,
) -> io::Result<TcpStream> {
    let addrs: Vec<std::net::SocketAddr> = std::net::ToSocketAddrs::to_socket_addrs(&(host, port))?
        .filter(|sa| family.is_none_or(|f| f.has(sa.ip())))
        .collect();
    if addrs.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            match family {
                Some(IpFamily::V4) => format!("{host} has no IPv4 address"),
                Some(IpFamily::V6) => format!("{host} has no IPv6 address"),
                None => format!("{host} resolves to no address"),
            },
        ));
    }
    let Some(t) = timeout else {
        return TcpStream::connect(&addrs[..]);
    };
    let deadline = Instant::now() + t;
    let mut last = None;
    for sa in addrs {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        match TcpStream::connect_timeout(&sa, left) {
            Ok(s) => return Ok(s),
            Err(e) => last = Some(e),
        }
    }
    Err(match last {
        Some(e) if e.kind() != io::ErrorKind::TimedOut => e,
        _ => timed_out(format!(
            "no connection within {}",
            nsfast_sys::args::duration::format(t)
        )),
    })
}

/// Connects to the UNIX socket `path` within `timeout`: a listener whose backlog is full makes
/// connect(2) wait, bounded by SO_SNDTIMEO (which unix_stream_connect honours).
pub fn unix_connect(path: &Path, timeout: Option<Duration>) -> io::Result<UnixStream> {
    let Some(t) = timeout else {
        return UnixStream::connect(path);
    };
    let s = socket2::Socket::new(socket2::Domain::UNIX, socket2::Type::STREAM, None)?;
    s.set_write_timeout(Some(t))?;
    match s.connect(&socket2::SockAddr::unix(path)?) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
            return Err(timed_out(format!(
                "no connection within {} (the listener's backlog is full)",
                nsfast_sys::args::duration::format(t)
            )))
        }
        Err(e) => return Err(e),
    }
    s.set_write_timeout(None)?;
    Ok(UnixStream::from(OwnedFd::from(s)))
}

/// A stream whose every read and write is bounded by what is left until one deadline (with
/// none, plain blocking I/O): SO_RCVTIMEO / SO_SNDTIMEO are set to the time left before each
/// call, so a peer that trickles its reply one byte at a time cannot stretch the limit.
struct Deadline<'a> {
    s: &'a UnixStream,
    deadline: Option<Instant>,
}

impl Deadline<'_> {
    /// The time left, or a TimedOut error once the deadline has passed.
    fn left(&self) -> io::Result<Option<Duration>> {
        let Some(d) = self.deadline else {
            return Ok(None);
        };
        let left = d.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "deadline passed"));
        }
        Ok(Some(left))
    }
}

impl io::Read for Deadline<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if let Some(left) = self.left()? {
            self.s.set_read_timeout(Some(left))?;
        }
        (&mut &*self.s).read(buf)
    }
}

impl io::Write for Deadline<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if let Some(left) = self.left()? {
            self.s.set_write_timeout(Some(left))?;
        }
        (&mut &*self.s).write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Connects to a hybrid vsock VMM socket at `path` and performs `CONNECT port`. `timeout` is
/// one total deadline over the connect, the request's write and every read of the reply (the
/// time left is recomputed before each call). Returns the stream, ready for data.
pub(crate) fn hybrid_connect(
    path: &Path,
    port: u32,
    timeout: Option<Duration>,
) -> Result<UnixStream, HybridError> {
    let deadline = timeout.map(|t| Instant::now() + t);
    let s = unix_connect(path, timeout).map_err(HybridError::Connect)?;
    let r = hybrid::connect_handshake(&mut Deadline { s: &s, deadline }, port);
    match r {
        Ok(_) => {}
        Err(HybridError::Io(e))
            if timeout.is_some()
                && matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
        {
            return Err(HybridError::Timeout {
                port,
                timeout: timeout.unwrap_or_default(),
            })
        }
        Err(e) => return Err(e),
    }
    if timeout.is_some() {
        s.set_read_timeout(None)?;
        s.set_write_timeout(None)?;
    }
    Ok(s)
}

/// Opens a connecting address (or stdio), within `opts.connect_timeout`.
pub fn connect(addr: &Address, opts: SockOpts) -> Result<Conn, ConnError> {
    match addr {
        Address::Tcp { host, port, family } => {
            let s = tcp_connect(host, *port, *family, opts.connect_timeout)
                .map_err(io_err(addr, "connect"))?;
            let _ = s.set_nodelay(true);
            Ok(Conn::from_socket(s.into(), addr.to_string()))
        }
        Address::Unix { path } => {
            let s = unix_connect(path, opts.connect_timeout).map_err(io_err(addr, "connect"))?;
            Ok(Conn::from_socket(s.into(), addr.to_string()))
        }
        Address::Hybrid { path, port } => {
            let s = hybrid_connect(path, *port, opts.connect_timeout).map_err(|source| {
                ConnError::Hybrid {
                    addr: addr.to_string(),
                    source,
                }
            })?;
            Ok(Conn::from_socket(s.into(), addr.to_string()))
        }
        Address::VsockConnect { cid, port, to_host } => {
            let fd = vsock::connect(*cid, *port, *to_host, opts.vsock_buffer)
                .map_err(io_err(addr, "connect"))?;
            Ok(Conn::from_socket(fd, addr.to_string()))
        }
        Address::Stdio => Conn::stdio().map_err(io_err(addr, "open")),
        _ => Err(io_err(addr, "connect")(io::Error::new(
            io::ErrorKind::InvalidInput,
            "a listening address cannot connect",
        ))),
    }
}

/// AF_VSOCK sockets as plain descriptors, over `nsfast_sys::vsock` (which adds what the
/// `vsock` crates lack: VMADDR_FLAG_TO_HOST and SO_VM_SOCKETS_BUFFER_SIZE). Only ever called
/// for vsock addresses, which nsfast's tests use inside QEMU guests only.
pub mod vsock {
    use std::io;
    use std::os::fd::{AsFd, OwnedFd};

    use nsfast_sys::vsock::{VsockAddr, VsockListener, VsockStream};

    pub fn connect(cid: u32, port: u32, to_host: bool, buffer: Option<u64>) -> io::Result<OwnedFd> {
        VsockStream::connect_with(VsockAddr { cid, port }, to_host, buffer).map(OwnedFd::from)
    }

    pub fn listen(cid: u32, port: u32, buffer: Option<u64>) -> io::Result<OwnedFd> {
        VsockListener::bind_with(VsockAddr { cid, port }, buffer).map(OwnedFd::from)
    }

    /// Accepts on a listening vsock socket: (socket, peer CID, peer port).
    pub fn accept(l: &OwnedFd) -> io::Result<(OwnedFd, u32, u32)> {
        let l = VsockListener::from_fd(l.as_fd().try_clone_to_owned()?);
        let (s, peer) = l.accept()?;
        Ok((s.into(), peer.cid, peer.port))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::unix::net::UnixListener;

    /// A fake hybrid VMM on a UNIX socket in a fresh temp directory: it reads `CONNECT 52`
    /// and answers `reply` one byte every `gap`.
    fn trickling_vmm(name: &str, reply: &'static [u8], gap: Duration) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("nsft-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let path = d.join("vmm.vsock");
        let l = UnixListener::bind(&path).unwrap();
        std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut line = Vec::new();
            let mut b = [0u8; 1];
            while s.read(&mut b).unwrap() == 1 && b[0] != b'\n' {
                line.push(b[0]);
            }
            assert_eq!(line, b"CONNECT 52");
            for c in reply {
                std::thread::sleep(gap);
                if s.write_all(&[*c]).is_err() {
                    return;
                }
            }
            // Held open until the client is gone.
            let _ = s.read(&mut b);
        });
        path
    }

    // The limit is one deadline over the whole handshake: a VMM answering one byte every
    // 300 ms (each read well within the limit) must not stretch a 1 s limit to the 4 s its
    // 14-byte reply takes.
    #[test]
    fn a_trickled_hybrid_reply_fails_at_the_total_deadline() {
        let path = trickling_vmm("trickle", b"OK 1073741824\n", Duration::from_millis(300));
        let t0 = Instant::now();
        let r = hybrid_connect(&path, 52, Some(Duration::from_secs(1)));
        let took = t0.elapsed();
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
        match r {
            Err(HybridError::Timeout { port: 52, timeout }) => {
                assert_eq!(timeout, Duration::from_secs(1))
            }
            other => panic!("expected a timeout, got {other:?} after {took:?}"),
        }
        assert!(
            took < Duration::from_millis(1500),
            "failed only after {took:?}"
        );
        assert!(
            took >= Duration::from_millis(950),
            "failed early, after {took:?}"
        );
    }

    // Within the limit the same trickle is a good handshake, and the error names the address
    // and the limit when it is not.
    #[test]
    fn a_slow_reply_within_the_deadline_succeeds_and_the_error_names_address_and_limit() {
        let path = trickling_vmm("slow-ok", b"OK 52\n", Duration::from_millis(50));
        let s = hybrid_connect(&path, 52, Some(Duration::from_secs(5))).unwrap();
        assert_eq!(
            s.read_timeout().unwrap(),
            None,
            "no timeout left on the stream"
        );
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
        let path = trickling_vmm("late", b"OK 52\n", Duration::from_millis(400));
        let addr = Address::Hybrid {
            path: path.clone(),
            port: 52,
        };
        let opts = SockOpts {
            connect_timeout: Some(Duration::from_millis(500)),
            ..SockOpts::default()
        };
        let e = connect(&addr, opts).unwrap_err();
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
        let msg = nsfast_sys::report::error_chain(&e);
        assert!(
            msg.contains(&format!("hybrid:{}:52", path.display())),
            "{msg}"
        );
        assert!(msg.contains("no reply to CONNECT 52 within 500ms"), "{msg}");
    }
}
